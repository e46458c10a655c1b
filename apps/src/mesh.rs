//! Mesh mode of `uping`: probe many targets from one stack at a fixed
//! aggregate rate, PingWeave-style, and report per-(target, probe) loss
//! and RTTs, as a table at the end and as Prometheus metrics while it runs.
//!
//! One [`MeshPinger`] (an in-loop [`App`]) carries every probe type, each
//! a `Prober` (the trait in `probe.rs`, with the series view, the probes in
//! flight and the message format they share) in a file of its own:
//! - `icmp`: one ping socket, one run of sequence numbers for all targets
//!   (an ICMP error names only the sequence);
//! - `ud`: one RoCEv2 UD QP sending pings in [`ustack_kit::ud_ping`]'s format
//!   to each target's UD responder (`ustack run` has one on QPN 2);
//! - `udp`: one UDP socket sending timestamped datagrams to each target's
//!   UDP echo service;
//! - `tcp`: a connection per target to its echo service; the connect
//!   (SYN to established) is one probe, timed into
//!   `ustack_mesh_tcp_connect_seconds`; then small timestamped messages
//!   echoed on the open connection are the RTT probes. A refused, reset
//!   or timed-out connection (or an echo whose wait ran out) counts its
//!   probes lost, sets the last error and reconnects with back-off.
//!
//! The aggregate `--rate` is spread round-robin over every (target, probe)
//! series. A probe still unanswered when its wait (`-W`) runs out is lost.
//! Sends are coalesced to one wake-up per millisecond at most.

mod icmp;
pub mod metrics;
pub mod pinglist;
mod probe;
mod tcp;
mod ud;
mod udp;

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{Value, json};
use ustack::iface::icmp::{PingEvent, PingHandle};
use ustack::node::{App, Control, RxWait};
use ustack::socket::ud::{DEFAULT_QKEY, RESPONDER_QPN};
use ustack::{Instant, Stack};

use icmp::Icmp;
use probe::{Prober, SendCtx, Series};
use tcp::{Tcp, TcpConn};
use ud::Ud;
use udp::Udp;

pub use metrics::{Buckets, MeshMetrics, MeshSnapshot, SeriesSnapshot};
pub use pinglist::{
    ECHO_PORT, ListSource, PinglistError, Probe, Reloader, Target, parse_pinglist,
    parse_pinglist_with,
};

/// Mesh settings.
#[derive(Debug, Clone)]
pub struct MeshConfig {
    /// The ping list.
    pub targets: Vec<Target>,
    /// Probes per second, all series together.
    pub rate: f64,
    /// How long to send; zero: until stopped (a monitor).
    pub duration: Duration,
    /// How long a probe waits for its answer (then it is lost); also the
    /// wait for the last answers after sending ends.
    pub wait: Duration,
    /// ICMP echo data and UDP datagram bytes (at least 8 for ICMP, 24 for UDP).
    pub size: usize,
    /// The ICMP identifier.
    pub ident: u16,
    /// UD probes: the responders' QP number.
    pub ud_qpn: u32,
    /// UD probes: the Q_Key.
    pub ud_qkey: u32,
    /// UD probes: the traffic class of their QP (`--tclass`).
    pub ud_tclass: u8,
}

impl MeshConfig {
    /// `targets` at `rate` for `duration` with a 1 s wait, 56-byte
    /// requests and the UD responder's defaults.
    pub fn new(targets: Vec<Target>, rate: f64, duration: Duration) -> Self {
        MeshConfig {
            targets,
            rate,
            duration,
            wait: Duration::from_secs(1),
            size: 56,
            ident: 0x4d31,
            ud_qpn: RESPONDER_QPN,
            ud_qkey: DEFAULT_QKEY,
            ud_tclass: 0,
        }
    }
}

/// One (target, probe) series: counters and RTTs.
#[derive(Debug)]
pub struct TargetStats {
    /// The target (as the ping list in force has it).
    pub target: Target,
    /// The probe.
    pub probe: Probe,
    id: u64,
    /// Probes sent (a TCP connect attempt is one).
    pub sent: u64,
    /// Answers received (not duplicates).
    pub received: u64,
    /// Probes whose wait ran out unanswered, or that an error ended.
    pub lost: u64,
    /// Answers to probes already answered.
    pub duplicates: u64,
    /// ICMP destination-unreachable answers (counted in `lost` too).
    pub unreachable: u64,
    /// RTTs in nanoseconds (percentiles for the table).
    pub rtt: Histogram<u64>,
    /// RTTs in the Prometheus buckets.
    pub rtt_buckets: Buckets,
    /// TCP: connect times.
    pub connect: Buckets,
    /// Whether the last probe whose wait ended was answered.
    pub up: Option<bool>,
    /// The last error.
    pub last_error: Option<String>,
    tcp: TcpConn,
}

impl TargetStats {
    fn new(target: Target, probe: Probe, id: u64) -> Self {
        TargetStats {
            target,
            probe,
            id,
            sent: 0,
            received: 0,
            lost: 0,
            duplicates: 0,
            unreachable: 0,
            // 1 ns to 1 min at three significant digits; bounded, fixed memory.
            rtt: Histogram::new_with_bounds(1, 60_000_000_000, 3)
                .expect("constant histogram bounds are valid"),
            rtt_buckets: Buckets::default(),
            connect: Buckets::default(),
            up: None,
            last_error: None,
            tcp: TcpConn::default(),
        }
    }

    /// Lost in percent of sent (0 before the first).
    pub fn loss_percent(&self) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            (self.sent.saturating_sub(self.received)) as f64 * 100.0 / self.sent as f64
        }
    }

    fn answered(&mut self, rtt: Duration) {
        self.received += 1;
        self.up = Some(true);
        let ns = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX);
        let _ = self.rtt.record(ns.clamp(1, 60_000_000_000));
        self.rtt_buckets.observe(rtt.as_secs_f64());
    }

    /// A probe lost; `why` becomes the last error (stored only when it
    /// changed: an unreachable target loses thousands a second).
    fn lose(&mut self, why: Option<&str>) {
        self.lost += 1;
        self.up = Some(false);
        if let Some(w) = why
            && self.last_error.as_deref() != Some(w)
        {
            self.last_error = Some(w.to_owned());
        }
    }

    fn snapshot(&self) -> SeriesSnapshot {
        SeriesSnapshot {
            target: self.target.addr,
            name: self.target.label.clone().unwrap_or_default(),
            probe: self.probe,
            sent: self.sent,
            received: self.received,
            lost: self.lost,
            rtt: self.rtt_buckets.clone(),
            connect: self.connect.clone(),
            up: self.up,
            last_error: self.last_error.clone(),
        }
    }
}

/// One series' line of the mesh table.
#[derive(Debug)]
pub struct Row<'a> {
    /// The target.
    pub target: &'a Target,
    /// The probe.
    pub probe: Probe,
    /// Probes sent.
    pub sent: u64,
    /// Answers received.
    pub received: u64,
    /// min, p50, p99, max in milliseconds, when anything came back.
    pub rtt_ms: Option<[f64; 4]>,
}

/// The stack's addresses for the `source` label: its IPv4 address and its
/// IPv6 one (a global address before the link-local one).
fn sources(stack: &Stack) -> (Ipv4Addr, Option<Ipv6Addr>) {
    let v6 = match crate::pingpong::our_gid_addr(stack, true, None) {
        Ok(IpAddr::V6(a)) => Some(a),
        _ => None,
    };
    (stack.ip(), v6)
}

/// The mesh summary table (text).
pub fn report_table(what: &str, rows: &[Row<'_>], elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let sent: u64 = rows.iter().map(|r| r.sent).sum();
    let targets: HashSet<IpAddr> = rows.iter().map(|r| r.target.addr).collect();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "--- {what} statistics: {} targets, {sent} requests in {secs:.2} s ({:.0}/s) ---",
        targets.len(),
        if secs > 0.0 { sent as f64 / secs } else { 0.0 }
    );
    let _ = writeln!(
        out,
        "{:<15} {:<12} {:<5} {:>8} {:>8} {:>7} {:>9} {:>9} {:>9} {:>9}",
        "target", "label", "probe", "sent", "recv", "loss", "min ms", "p50 ms", "p99 ms", "max ms"
    );
    for r in rows {
        let loss = if r.sent == 0 {
            0.0
        } else {
            r.sent.saturating_sub(r.received) as f64 * 100.0 / r.sent as f64
        };
        let q = |i: usize| r.rtt_ms.map_or("-".to_string(), |v| format!("{:.3}", v[i]));
        let _ = writeln!(
            out,
            "{:<15} {:<12} {:<5} {:>8} {:>8} {:>6.2}% {:>9} {:>9} {:>9} {:>9}",
            r.target.addr.to_string(),
            r.target.label.as_deref().unwrap_or("-"),
            r.probe.as_str(),
            r.sent,
            r.received,
            loss,
            q(0),
            q(1),
            q(2),
            q(3),
        );
    }
    out
}

/// Before the measured run, one uncounted ICMP echo to each target until it
/// answers or [`WARM_UP`] passes, so ARP resolution (and its loss) does not
/// count as probe loss.
#[derive(Debug, Default)]
struct WarmUp {
    sock: Option<PingHandle>,
    until: Option<Instant>,
    next_round: Option<Instant>,
    answered: Vec<bool>,
    done: bool,
}

const WARM_UP: Duration = Duration::from_secs(2);
const WARM_UP_RETRY: Duration = Duration::from_millis(200);

/// Most probes sent in one poll when the loop fell behind the schedule.
const CATCH_UP: u32 = 256;
/// Sends due within this window leave together (one wake-up per window).
pub const BATCH: Duration = Duration::from_millis(1);
/// How often the loop publishes the metrics snapshot and looks for a new list.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(250);

/// The mesh prober, run in the poll loop.
#[derive(Debug)]
pub struct MeshPinger {
    cfg: MeshConfig,
    /// One entry per (target, probe), in ping-list order.
    pub stats: Vec<TargetStats>,
    /// Series position by id.
    index: HashMap<u64, usize>,
    next_id: u64,
    icmp: Icmp,
    udp: Udp,
    ud: Ud,
    tcp: Tcp,
    started: Option<Instant>,
    last_now: Instant,
    next_send: Instant,
    last_burst: Option<Instant>,
    next_slot: usize,
    /// UD, UDP and TCP message sequence numbers.
    next_key: u64,
    sent_total: u64,
    send_end: Option<Instant>,
    finished_at: Option<Instant>,
    warm: WarmUp,
    updates: Option<Receiver<Vec<Target>>>,
    reloads: u64,
    metrics: Option<Arc<MeshMetrics>>,
    next_publish: Instant,
    /// Why the mesh could not run.
    pub error: Option<String>,
}

impl MeshPinger {
    /// A mesh over `cfg.targets`; it starts on its first poll.
    pub fn new(cfg: MeshConfig) -> Self {
        let mut m = MeshPinger {
            stats: Vec::new(),
            index: HashMap::new(),
            next_id: 0,
            icmp: Icmp::default(),
            udp: Udp::default(),
            ud: Ud::default(),
            tcp: Tcp::default(),
            started: None,
            last_now: Instant::ZERO,
            next_send: Instant::ZERO,
            last_burst: None,
            next_slot: 0,
            next_key: 1,
            sent_total: 0,
            send_end: None,
            finished_at: None,
            warm: WarmUp::default(),
            updates: None,
            reloads: 0,
            metrics: None,
            next_publish: Instant::ZERO,
            error: None,
            cfg,
        };
        let targets = m.cfg.targets.clone();
        m.set_series(&targets);
        m
    }

    /// Take new ping lists from `rx` (a [`Reloader`]'s) while running.
    pub fn with_updates(mut self, rx: Receiver<Vec<Target>>) -> Self {
        self.updates = Some(rx);
        self
    }

    /// Publish into `metrics` a few times a second.
    pub fn with_metrics(mut self, metrics: Arc<MeshMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The ping list in force.
    pub fn targets(&self) -> &[Target] {
        &self.cfg.targets
    }

    /// Ping list changes applied.
    pub fn reloads(&self) -> u64 {
        self.reloads
    }

    /// The series of `addr` probed with `probe`.
    pub fn series(&self, addr: impl Into<IpAddr>, probe: Probe) -> Option<&TargetStats> {
        let addr = addr.into();
        self.stats
            .iter()
            .find(|s| s.target.addr == addr && s.probe == probe)
    }

    fn gap(&self) -> Duration {
        Duration::from_secs_f64(1.0 / self.cfg.rate.max(0.001))
    }

    /// From the first probe to the end of sending (or to now, while running).
    pub fn elapsed(&self) -> Duration {
        match self.started {
            Some(s) => self
                .finished_at
                .unwrap_or(self.last_now)
                .saturating_duration_since(s),
            None => Duration::ZERO,
        }
    }

    /// The mesh ran its duration and waited for the last answers.
    pub fn done(&self) -> bool {
        self.finished_at.is_some()
    }

    /// Make the series follow `targets`: new pairs start, gone ones stop
    /// (their series disappear), the rest keep their counters.
    fn set_series(&mut self, targets: &[Target]) -> Vec<TargetStats> {
        let mut old: HashMap<(IpAddr, Probe), TargetStats> = self
            .stats
            .drain(..)
            .map(|s| ((s.target.addr, s.probe), s))
            .collect();
        for t in targets {
            for &p in &t.probes {
                let s = match old.remove(&(t.addr, p)) {
                    Some(mut s) => {
                        s.target = t.clone();
                        s
                    }
                    None => {
                        self.next_id += 1;
                        TargetStats::new(t.clone(), p, self.next_id)
                    }
                };
                self.stats.push(s);
            }
        }
        self.index = self
            .stats
            .iter()
            .enumerate()
            .map(|(i, s)| (s.id, i))
            .collect();
        if self.next_slot >= self.stats.len() {
            self.next_slot = 0;
        }
        old.into_values().collect()
    }

    fn apply_list(&mut self, targets: Vec<Target>, stack: &mut Stack) {
        let gone = self.set_series(&targets);
        let (probers, mut series) = self.parts();
        for p in probers {
            p.list_changed(stack, &gone, &mut series);
        }
        tracing::info!(
            "ping list changed: {} targets, {} series",
            targets.len(),
            self.stats.len()
        );
        self.cfg.targets = targets;
        self.reloads += 1;
    }

    /// Every probe kind, and the series they share.
    fn parts(&mut self) -> ([&mut dyn Prober; 4], Series<'_>) {
        (
            [&mut self.icmp, &mut self.udp, &mut self.ud, &mut self.tcp],
            Series {
                stats: &mut self.stats,
                index: &self.index,
            },
        )
    }

    /// The same, to look at.
    fn probers(&self) -> [&dyn Prober; 4] {
        [&self.icmp, &self.udp, &self.ud, &self.tcp]
    }

    /// Open the sockets the series need; false (with `error` set) if one fails.
    fn open(&mut self, stack: &mut Stack) -> bool {
        let kinds: HashSet<Probe> = self.stats.iter().map(|s| s.probe).collect();
        let cfg = &self.cfg;
        let probers: [&mut dyn Prober; 4] =
            [&mut self.icmp, &mut self.udp, &mut self.ud, &mut self.tcp];
        let r = probers
            .into_iter()
            .filter(|p| kinds.contains(&p.kind()))
            .try_for_each(|p| p.open(cfg, stack));
        match r {
            Ok(()) => true,
            Err(e) => {
                self.error = Some(e);
                false
            }
        }
    }

    fn close(&mut self, now: Instant, stack: &mut Stack) {
        let (probers, mut series) = self.parts();
        for p in probers {
            p.close(now, stack, &mut series);
        }
    }

    fn receive(&mut self, now: Instant, stack: &mut Stack) {
        let (probers, mut series) = self.parts();
        for p in probers {
            p.receive(now, stack, &mut series);
        }
    }

    /// Probes whose wait ran out are lost; a TCP echo that timed out ends
    /// its connection.
    fn expire(&mut self, now: Instant, stack: &mut Stack) {
        let (probers, mut series) = self.parts();
        for p in probers {
            p.expire(now, stack, &mut series);
        }
    }

    /// One probe of series `i`.
    fn send(&mut self, i: usize, now: Instant, stack: &mut Stack) {
        let mut ctx = SendCtx {
            cfg: &self.cfg,
            deadline: now + self.cfg.wait,
            next_key: &mut self.next_key,
        };
        let mut series = Series {
            stats: &mut self.stats,
            index: &self.index,
        };
        let p: &mut dyn Prober = match series.stats[i].probe {
            Probe::Icmp => &mut self.icmp,
            Probe::Udp => &mut self.udp,
            Probe::Ud => &mut self.ud,
            Probe::Tcp => &mut self.tcp,
        };
        p.send(i, now, stack, &mut series, &mut ctx);
    }

    /// Run the warm-up; true once it is over.
    fn warm_up(&mut self, now: Instant, stack: &mut Stack) -> bool {
        let w = &mut self.warm;
        if w.done {
            return true;
        }
        let targets = &self.cfg.targets;
        let sock = match w.sock {
            Some(s) => s,
            None => match stack.ping().open(self.cfg.ident ^ 0x8000) {
                Ok(s) => {
                    w.until = Some(now + WARM_UP);
                    w.answered = vec![false; targets.len()];
                    *w.sock.insert(s)
                }
                Err(_) => {
                    w.done = true;
                    return true;
                }
            },
        };
        while let Ok(Some(ev)) = stack.ping().recv(sock) {
            if let PingEvent::Reply(r) = ev
                && let Some(i) = targets.iter().position(|t| t.addr == r.from)
            {
                w.answered[i] = true;
            }
        }
        if w.answered.iter().all(|&a| a) || w.until.is_some_and(|u| now >= u) {
            let _ = stack.ping().close(sock);
            w.done = true;
            return true;
        }
        if w.next_round.is_none_or(|t| now >= t) {
            for (i, t) in targets.iter().enumerate() {
                if !w.answered[i] {
                    let _ = stack.ping().send(sock, t.addr, 0, self.cfg.size);
                }
            }
            w.next_round = Some(now + WARM_UP_RETRY);
        }
        false
    }

    fn publish(&mut self, now: Instant, source: (Ipv4Addr, Option<Ipv6Addr>), force: bool) {
        let Some(m) = &self.metrics else { return };
        if !force && now < self.next_publish {
            return;
        }
        let (stats, targets, reloads) = (&self.stats, self.cfg.targets.len(), self.reloads);
        if m.publish(|s| {
            s.source = Some(source.0);
            s.source6 = source.1;
            s.series.clear();
            s.series.extend(stats.iter().map(TargetStats::snapshot));
            s.targets = targets;
            s.reloads = reloads;
        }) {
            self.next_publish = now + PUBLISH_EVERY;
        }
    }

    fn all_in(&self) -> bool {
        self.probers().iter().all(|p| p.settled(&self.stats))
    }

    /// The summary table, one line per series.
    pub fn report(&self) -> String {
        let rows: Vec<Row<'_>> = self
            .stats
            .iter()
            .map(|t| Row {
                target: &t.target,
                probe: t.probe,
                sent: t.sent,
                received: t.received,
                rtt_ms: (!t.rtt.is_empty()).then(|| {
                    [
                        t.rtt.min() as f64 / 1e6,
                        t.rtt.value_at_quantile(0.5) as f64 / 1e6,
                        t.rtt.value_at_quantile(0.99) as f64 / 1e6,
                        t.rtt.max() as f64 / 1e6,
                    ]
                }),
            })
            .collect();
        report_table("mesh ping", &rows, self.elapsed())
    }

    /// The summary as JSON: one entry of `targets` per series.
    pub fn json(&self) -> Value {
        let secs = self.elapsed().as_secs_f64();
        let targets: Vec<Value> = self
            .stats
            .iter()
            .map(|t| {
                let rtt = (!t.rtt.is_empty()).then(|| {
                    json!({
                        "min": t.rtt.min() as f64 / 1e6,
                        "avg": t.rtt.mean() / 1e6,
                        "p50": t.rtt.value_at_quantile(0.5) as f64 / 1e6,
                        "p90": t.rtt.value_at_quantile(0.9) as f64 / 1e6,
                        "p99": t.rtt.value_at_quantile(0.99) as f64 / 1e6,
                        "max": t.rtt.max() as f64 / 1e6,
                    })
                });
                let mut v = json!({
                    "host": t.target.addr.to_string(),
                    "label": t.target.label,
                    "probe": t.probe.as_str(),
                    "sent": t.sent,
                    "received": t.received,
                    "lost": t.lost,
                    "duplicates": t.duplicates,
                    "unreachable": t.unreachable,
                    "loss_percent": t.loss_percent(),
                    "rtt_ms": rtt,
                    "last_error": t.last_error,
                });
                if t.probe == Probe::Tcp {
                    let n = t.connect.count();
                    v["connects"] = json!(n);
                    v["connect_ms_avg"] = json!(match t.connect.value() {
                        ustack_runtime::metrics::Value::Histogram { sum, count, .. }
                            if count > 0 =>
                            Some(sum * 1e3 / count as f64),
                        _ => None,
                    });
                }
                v
            })
            .collect();
        json!({
            "targets": targets,
            "sent": self.sent_total,
            "received": self.stats.iter().map(|t| t.received).sum::<u64>(),
            "lost": self.stats.iter().map(|t| t.lost).sum::<u64>(),
            "seconds": secs,
            "rate_target": self.cfg.rate,
            "rate_achieved": if secs > 0.0 { self.sent_total as f64 / secs } else { 0.0 },
            "pinglist_reloads": self.reloads,
            "error": self.error,
        })
    }

    /// Exit status as ping's: 0 when every series got answers, 1 when some did not.
    pub fn all_answered(&self) -> bool {
        self.stats.iter().all(|t| t.received > 0)
    }
}

impl App for MeshPinger {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        self.last_now = now;
        if self.finished_at.is_some() {
            return Control::Exit;
        }
        if !self.warm_up(now, stack) {
            self.publish(now, sources(stack), false);
            return Control::Continue;
        }
        if let Some(rx) = &self.updates
            && let Some(list) = rx.try_iter().last()
        {
            self.apply_list(list, stack);
        }
        if !self.open(stack) {
            self.finished_at = Some(now);
            return Control::Exit;
        }
        if self.started.is_none() {
            self.started = Some(now);
            self.next_send = now;
            self.send_end = (!self.cfg.duration.is_zero()).then(|| now + self.cfg.duration);
        }
        self.receive(now, stack);
        self.expire(now, stack);
        let send_end = self.send_end.unwrap_or(Instant::FAR_FUTURE);
        let may_send = self.last_burst.is_none_or(|b| now >= b + BATCH);
        let mut burst = 0;
        while may_send
            && now >= self.next_send
            && self.next_send < send_end
            && burst < CATCH_UP
            && !self.stats.is_empty()
        {
            if burst == 0 {
                self.last_burst = Some(now);
            }
            let i = self.next_slot % self.stats.len();
            self.next_slot = (i + 1) % self.stats.len();
            let before = self.stats[i].sent;
            self.send(i, now, stack);
            self.sent_total += self.stats[i].sent - before;
            self.next_send += self.gap();
            burst += 1;
        }
        if burst == CATCH_UP && now > self.next_send + self.gap() * CATCH_UP {
            // Far behind (a stalled loop): do not send a storm to catch up.
            self.next_send = now;
        }
        self.publish(now, sources(stack), false);
        if let Some(end) = self.send_end
            && now >= end
            && (self.all_in() || now >= end + self.cfg.wait)
        {
            self.expire(Instant::FAR_FUTURE, stack);
            self.finished_at = Some(end.min(now));
            self.close(now, stack);
            self.publish(now, sources(stack), true);
            return Control::Exit;
        }
        Control::Continue
    }

    fn poll_at(&self) -> Option<Instant> {
        if !self.warm.done {
            return self.warm.next_round;
        }
        if self.finished_at.is_some() {
            return None;
        }
        let tick = (self.metrics.is_some() || self.updates.is_some()).then_some(self.next_publish);
        let send = match self.send_end {
            Some(end) if self.next_send >= end => Some(end + self.cfg.wait),
            _ => Some(match self.last_burst {
                Some(b) => self.next_send.max(b + BATCH),
                None => self.next_send,
            }),
        };
        let probes = self
            .probers()
            .into_iter()
            .filter_map(|p| p.next_deadline(&self.stats));
        [tick, send].into_iter().flatten().chain(probes).min()
    }

    /// ICMP and UD replies are timed by the port's receive stamp, so while
    /// only they are awaited the loop may leave them in a port that stamps
    /// frames until the next send: one wake-up per send batch instead of
    /// one per reply. UDP and TCP probes (and connects) are timed when
    /// read: while one is awaited, frames are read as they come.
    fn rx_wait(&self) -> RxWait {
        if !self.warm.done || self.finished_at.is_some() {
            return RxWait::Prompt;
        }
        let waits = self.probers().map(|p| p.rx_wait(&self.stats));
        if waits.contains(&RxWait::Prompt) {
            RxWait::Prompt
        } else if waits.contains(&RxWait::Stamped) {
            RxWait::Stamped
        } else {
            RxWait::Nothing
        }
    }
}

/// A mesh agent: the [`MeshPinger`], and (`uping --responder`) what
/// answers the other agents' probes as `ustack run` does: TCP and UDP
/// echo on port 7 (discard on 9) and the UD responder on QPN 2 with the
/// default Q_Key (the stack itself answers ICMP echo). Ends when the
/// pinger does.
pub struct MeshAgent<'a> {
    /// The probes this agent sends.
    pub pinger: &'a mut MeshPinger,
    responder: Option<(crate::services::Services, ustack_kit::ud_ping::UdResponder)>,
}

impl std::fmt::Debug for MeshAgent<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshAgent")
            .field("responder", &self.responder.is_some())
            .finish_non_exhaustive()
    }
}

impl<'a> MeshAgent<'a> {
    /// The agent around `pinger`; with `respond`, the echo services and
    /// the UD responder too.
    pub fn new(pinger: &'a mut MeshPinger, respond: bool) -> Self {
        let responder = respond.then(|| {
            (
                crate::services::Services::new(),
                ustack_kit::ud_ping::UdResponder::default(),
            )
        });
        MeshAgent { pinger, responder }
    }

    /// Why a responder could not start (its port in use), once known.
    pub fn responder_error(&self) -> Option<&str> {
        self.responder
            .as_ref()
            .and_then(|(s, _)| s.error.as_deref())
    }
}

impl App for MeshAgent<'_> {
    fn on_events(&mut self, now: Instant, events: &[ustack::events::Event], stack: &mut Stack) {
        if let Some((s, u)) = &mut self.responder {
            s.on_events(now, events, stack);
            u.on_events(now, events, stack);
        }
        self.pinger.on_events(now, events, stack);
    }

    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        // The responders first: the UD responder takes QPN 2 before the
        // pinger's own QP picks any free number.
        if let Some((s, u)) = &mut self.responder {
            s.poll(now, stack);
            u.poll(now, stack);
        }
        self.pinger.poll(now, stack)
    }

    fn poll_at(&self) -> Option<Instant> {
        let mine = self.pinger.poll_at();
        match &self.responder {
            Some((s, u)) => [mine, s.poll_at(), u.poll_at()].into_iter().flatten().min(),
            None => mine,
        }
    }

    /// Others' probes are answered as they come: an answer held in the
    /// port would add this loop's wait to their round trips.
    fn rx_wait(&self) -> RxWait {
        if self.responder.is_some() {
            RxWait::Prompt
        } else {
            self.pinger.rx_wait()
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn series_lose_and_answer() {
        let t = Target::new(Ipv4Addr::new(10, 0, 0, 2), Some("a"), Probe::Udp);
        let mut s = TargetStats::new(t, Probe::Udp, 1);
        s.sent = 3;
        s.answered(Duration::from_micros(30));
        assert_eq!(s.up, Some(true));
        s.lose(Some("timeout"));
        assert_eq!((s.received, s.lost, s.up), (1, 1, Some(false)));
        let snap = s.snapshot();
        assert_eq!(snap.rtt.count(), 1);
        assert_eq!(snap.last_error.as_deref(), Some("timeout"));
        assert_eq!(snap.name, "a");
    }

    #[test]
    fn series_follow_the_list() {
        let list = parse_pinglist("10.0.0.2 a probes=icmp,tcp\n10.0.0.3 b\n").unwrap();
        let mut m = MeshPinger::new(MeshConfig::new(list, 10.0, Duration::ZERO));
        assert_eq!(m.stats.len(), 3);
        m.stats[0].sent = 5;
        let id_b = m.stats[2].id;
        let gone = m.set_series(
            &parse_pinglist("10.0.0.4 c probes=udp\n10.0.0.2 a2 probes=icmp\n").unwrap(),
        );
        assert_eq!(gone.len(), 2, "tcp of .2 and icmp of .3 stop");
        assert_eq!(m.stats.len(), 2);
        assert_eq!(m.stats[0].target.addr, IpAddr::from([10, 0, 0, 4]));
        assert_eq!(m.stats[1].sent, 5, "a kept series keeps its counters");
        assert_eq!(m.stats[1].target.label.as_deref(), Some("a2"));
        assert!(!m.index.contains_key(&id_b));
        assert_eq!(m.index[&m.stats[1].id], 1);
    }
}
