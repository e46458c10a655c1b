//! Mesh mode of `uping`: probe many targets from one stack at a fixed
//! aggregate rate, PingWeave-style, and report per-(target, probe) loss
//! and RTTs, as a table at the end and as Prometheus metrics while it runs.
//!
//! One [`MeshPinger`] (an in-loop [`App`]) carries every probe type:
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

pub mod metrics;
pub mod pinglist;

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{Value, json};
use ustack::icmp::{PingEvent, PingHandle};
use ustack::node::{App, Control, RxWait};
use ustack::tcp::{State, TcpHandle};
use ustack::ud::{
    Completion, DEFAULT_QKEY, GRH_LEN, QpConfig, QpHandle, RESPONDER_QPN, SendWr, UdAddr,
    UdTransport, WcOpcode, WcStatus,
};
use ustack::udp::UdpHandle;
use ustack::{Instant, Stack};

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
    tcp: TcpProbe,
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
            tcp: TcpProbe::default(),
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

/// A TCP series' connection.
#[derive(Debug, Default)]
struct TcpProbe {
    h: Option<TcpHandle>,
    established: bool,
    /// When the SYN was asked for, and when the connect probe is lost.
    connect_at: Instant,
    connect_deadline: Instant,
    /// The port connected to.
    connect_port: u16,
    /// No connect before this (back-off after a failure).
    retry_at: Instant,
    backoff: Duration,
    /// A partly received echo.
    rbuf: [u8; MSG_LEN],
    rlen: usize,
    /// Probe bytes not yet taken by the connection.
    out: Vec<u8>,
}

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// Probes waiting for answers, by key (an ICMP sequence, or a UD, UDP or
/// TCP message's sequence), each with its series and deadline.
#[derive(Debug, Default)]
struct InFlight {
    map: HashMap<u64, (u64, Instant)>,
    /// Keys in send order (deadlines ascending); answered ones stay until
    /// those before them are answered or expire.
    order: VecDeque<(u64, u64, Instant)>,
}

impl InFlight {
    /// Track `key`; the series of a probe it replaces (a wrapped ICMP sequence).
    fn insert(&mut self, key: u64, id: u64, deadline: Instant) -> Option<u64> {
        self.order.push_back((key, id, deadline));
        self.map.insert(key, (id, deadline)).map(|(old, _)| old)
    }

    /// The series `key` was sent for, removing it, if `ok` accepts it.
    fn take(&mut self, key: u64, ok: impl FnOnce(u64) -> bool) -> Option<u64> {
        match self.map.get(&key) {
            Some(&(id, _)) if ok(id) => {
                self.map.remove(&key);
                self.prune();
                Some(id)
            }
            _ => None,
        }
    }

    /// Forget answered probes at the front of the send order, so the next
    /// deadline is an unanswered probe's (answers mostly come in order:
    /// the loop does not wake for the deadlines of probes long answered).
    fn prune(&mut self) {
        while let Some(&(key, id, deadline)) = self.order.front() {
            if self.map.get(&key) == Some(&(id, deadline)) {
                break;
            }
            self.order.pop_front();
        }
    }

    /// Remove the probes whose deadline passed, calling `lost` with each one's series.
    fn expire(&mut self, now: Instant, mut lost: impl FnMut(u64)) {
        while let Some(&(key, id, deadline)) = self.order.front() {
            if deadline > now {
                break;
            }
            self.order.pop_front();
            if self.map.get(&key) == Some(&(id, deadline)) {
                self.map.remove(&key);
                lost(id);
            }
        }
        self.prune();
    }

    /// Remove every probe of series `id`; how many there were.
    fn drop_series(&mut self, id: u64) -> u64 {
        let before = self.map.len();
        self.map.retain(|_, (s, _)| *s != id);
        self.prune();
        (before - self.map.len()) as u64
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.order.front().map(|e| e.2)
    }
}

/// UDP and TCP probe messages: `"UMSH" | 4 zero | seq u64 | send time u64`
/// (big-endian, engine nanoseconds), then filler.
const MSG_LEN: usize = 24;
const MSG_MAGIC: &[u8; 4] = b"UMSH";

fn write_msg(buf: &mut [u8], seq: u64, now: Instant) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = i as u8;
    }
    buf[..4].copy_from_slice(MSG_MAGIC);
    buf[4..8].fill(0);
    buf[8..16].copy_from_slice(&seq.to_be_bytes());
    buf[16..24].copy_from_slice(&now.as_nanos().to_be_bytes());
}

fn be64(p: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&p[at..at + 8]);
    u64::from_be_bytes(b)
}

/// (seq, send time) of an echoed probe message.
fn read_msg(p: &[u8]) -> Option<(u64, u64)> {
    (p.len() >= MSG_LEN && &p[..4] == MSG_MAGIC).then(|| (be64(p, 8), be64(p, 16)))
}

/// UD pings in the format of [`ustack_kit::ud_ping`] (its module docs):
/// `"UDPG" | kind | 3 zero | seq | a | b | c`, 40 bytes at least; a ping
/// (kind 1) carries its post time in `a`, the pong (kind 2) echoes seq and
/// `a` and carries the responder's processing delay in `c`.
const UD_LEN: usize = ustack_kit::ud_ping::PING_LEN;
const UD_RECV_DEPTH: usize = 256;

fn write_ud_ping(buf: &mut [u8], seq: u64, now: Instant) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = i as u8;
    }
    buf[..4].copy_from_slice(b"UDPG");
    buf[4] = 1;
    buf[5..8].fill(0);
    buf[8..16].copy_from_slice(&seq.to_be_bytes());
    buf[16..24].copy_from_slice(&now.as_nanos().to_be_bytes());
    buf[24..40].fill(0);
}

/// (seq, ping's post time, responder's delay) of a pong.
fn read_ud_pong(p: &[u8]) -> Option<(u64, u64, u64)> {
    (p.len() >= UD_LEN && &p[..4] == b"UDPG" && p[4] == 2)
        .then(|| (be64(p, 8), be64(p, 16), be64(p, 32)))
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

/// The mesh summary table (text).
pub fn report_table(what: &str, rows: &[Row<'_>], elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let sent: u64 = rows.iter().map(|r| r.sent).sum();
    let targets: HashSet<Ipv4Addr> = rows.iter().map(|r| r.target.addr).collect();
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
    icmp: Option<PingHandle>,
    udp: Option<UdpHandle>,
    ud: Option<QpHandle>,
    inflight_icmp: InFlight,
    inflight_ud: InFlight,
    inflight_udp: InFlight,
    inflight_tcp: InFlight,
    started: Option<Instant>,
    last_now: Instant,
    next_send: Instant,
    last_burst: Option<Instant>,
    next_slot: usize,
    /// ICMP sequence numbers run across all targets.
    next_seq: u16,
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
    buf: Vec<u8>,
    cqes: Vec<Completion>,
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
            icmp: None,
            udp: None,
            ud: None,
            inflight_icmp: InFlight::default(),
            inflight_ud: InFlight::default(),
            inflight_udp: InFlight::default(),
            inflight_tcp: InFlight::default(),
            started: None,
            last_now: Instant::ZERO,
            next_send: Instant::ZERO,
            last_burst: None,
            next_slot: 0,
            next_seq: 1,
            next_key: 1,
            sent_total: 0,
            send_end: None,
            finished_at: None,
            warm: WarmUp::default(),
            updates: None,
            reloads: 0,
            metrics: None,
            next_publish: Instant::ZERO,
            buf: vec![0; 64 << 10],
            cqes: Vec::new(),
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
    pub fn series(&self, addr: Ipv4Addr, probe: Probe) -> Option<&TargetStats> {
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
        let mut old: HashMap<(Ipv4Addr, Probe), TargetStats> = self
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
        for s in gone {
            if let Some(h) = s.tcp.h {
                let _ = stack.tcp_abort(h);
            }
        }
        // A TCP target whose port changed reconnects.
        for s in &mut self.stats {
            if let Some(h) = s.tcp.h
                && s.tcp.connect_port != s.target.tcp_port
            {
                let _ = stack.tcp_abort(h);
                s.tcp = TcpProbe::default();
            }
        }
        tracing::info!(
            "ping list changed: {} targets, {} series",
            targets.len(),
            self.stats.len()
        );
        self.cfg.targets = targets;
        self.reloads += 1;
    }

    fn has(&self, p: Probe) -> bool {
        self.stats.iter().any(|s| s.probe == p)
    }

    /// Open the sockets the series need; false (with `error` set) if one fails.
    fn open(&mut self, stack: &mut Stack) -> bool {
        let r = (|| -> Result<(), String> {
            if self.icmp.is_none() && self.has(Probe::Icmp) {
                self.icmp = Some(
                    stack
                        .ping_open(self.cfg.ident)
                        .map_err(|e| format!("cannot open a ping socket: {e}"))?,
                );
            }
            if self.udp.is_none() && self.has(Probe::Udp) {
                self.udp = Some(
                    stack
                        .udp_bind(0)
                        .map_err(|e| format!("cannot open a UDP socket: {e}"))?,
                );
            }
            if self.ud.is_none() && self.has(Probe::Ud) {
                let mut qc = QpConfig::new(self.cfg.ud_qkey);
                qc.max_recv_wr = UD_RECV_DEPTH;
                qc.max_send_wr = 2 * CATCH_UP as usize;
                let qp = stack
                    .create_qp(&qc)
                    .map_err(|e| format!("cannot create a UD QP: {e}"))?;
                let size = GRH_LEN + stack.max_msg_size().max(self.cfg.size);
                for i in 0..UD_RECV_DEPTH {
                    stack
                        .post_recv(qp, i as u64, vec![0; size])
                        .map_err(|e| format!("cannot post UD receives: {e}"))?;
                }
                self.ud = Some(qp);
            }
            Ok(())
        })();
        match r {
            Ok(()) => true,
            Err(e) => {
                self.error = Some(e);
                false
            }
        }
    }

    fn close(&mut self, stack: &mut Stack) {
        if let Some(s) = self.icmp.take() {
            let _ = stack.ping_close(s);
        }
        if let Some(s) = self.udp.take() {
            let _ = stack.udp_close(s);
        }
        if let Some(q) = self.ud.take() {
            let _ = stack.destroy_qp(q);
        }
        for s in &mut self.stats {
            if let Some(h) = s.tcp.h.take() {
                let _ = stack.tcp_close(h);
            }
        }
    }

    fn by_id(&mut self, id: u64) -> Option<&mut TargetStats> {
        let i = *self.index.get(&id)?;
        self.stats.get_mut(i)
    }

    /// An answer: to the probe `id` it matched (its RTT recorded), or,
    /// matching none in flight, a duplicate or late one counted on the
    /// `probe` series of the target it came from.
    fn settle(
        &mut self,
        id: Option<u64>,
        probe: Probe,
        from: Ipv4Addr,
        rtt: impl FnOnce() -> Duration,
    ) {
        match id {
            Some(id) => {
                let rtt = rtt();
                if let Some(s) = self.by_id(id) {
                    s.answered(rtt);
                }
            }
            None => {
                if let Some(s) = self
                    .stats
                    .iter_mut()
                    .find(|s| s.probe == probe && s.target.addr == from)
                {
                    s.duplicates += 1;
                }
            }
        }
    }

    fn receive(&mut self, now: Instant, stack: &mut Stack) {
        if let Some(sock) = self.icmp {
            while let Ok(Some(ev)) = stack.ping_recv(sock) {
                match ev {
                    PingEvent::Reply(r) => {
                        let (index, stats) = (&self.index, &self.stats);
                        let ok = |id| {
                            index
                                .get(&id)
                                .is_some_and(|&i| stats[i].target.addr == r.from)
                        };
                        let id = self.inflight_icmp.take(u64::from(r.seq), ok);
                        self.settle(id, Probe::Icmp, r.from, || r.rtt().unwrap_or_default());
                    }
                    PingEvent::Unreachable { seq, code, .. } => {
                        if let Some(id) = self.inflight_icmp.take(u64::from(seq), |_| true)
                            && let Some(s) = self.by_id(id)
                        {
                            s.unreachable += 1;
                            s.lose(Some(&format!("destination unreachable (code {code})")));
                        }
                    }
                }
            }
        }
        if let Some(sock) = self.udp {
            let mut buf = std::mem::take(&mut self.buf);
            while let Ok(Some((n, from))) = stack.udp_recv_from(sock, &mut buf) {
                let Some((key, ts)) = read_msg(&buf[..n.min(buf.len())]) else {
                    continue;
                };
                let (index, stats) = (&self.index, &self.stats);
                let ok = |id| {
                    index.get(&id).is_some_and(|&i| {
                        stats[i].target.addr == *from.ip()
                            && stats[i].target.udp_port == from.port()
                    })
                };
                let id = self.inflight_udp.take(key, ok);
                self.settle(id, Probe::Udp, *from.ip(), || {
                    now.saturating_duration_since(Instant::from_nanos(ts))
                });
            }
            self.buf = buf;
        }
        if let Some(qp) = self.ud {
            let mut cqes = std::mem::take(&mut self.cqes);
            while stack.poll_cq(qp, now, 64, &mut cqes).unwrap_or(0) > 0 {
                for mut c in cqes.drain(..) {
                    self.on_ud_completion(now, &c);
                    if c.opcode == WcOpcode::Recv
                        && let Some(b) = c.buf.take()
                    {
                        let _ = stack.post_recv(qp, c.wr_id, b);
                    }
                }
            }
            self.cqes = cqes;
        }
    }

    fn on_ud_completion(&mut self, now: Instant, c: &Completion) {
        match c.opcode {
            WcOpcode::Send => {
                if c.status != WcStatus::Success
                    && let Some(id) = self.inflight_ud.take(c.wr_id, |_| true)
                    && let Some(s) = self.by_id(id)
                {
                    s.lose(Some(&format!("UD send failed: {:?}", c.status)));
                }
            }
            WcOpcode::Recv => {
                if c.status != WcStatus::Success {
                    return;
                }
                let Some((seq, posted, delay)) = read_ud_pong(c.payload()) else {
                    return;
                };
                let Some(from) = c.src else { return };
                let (index, stats) = (&self.index, &self.stats);
                let ok = |id| {
                    index
                        .get(&id)
                        .is_some_and(|&i| stats[i].target.addr == from.ip)
                };
                let id = self.inflight_ud.take(seq, ok);
                self.settle(id, Probe::Ud, from.ip, || {
                    let at = if c.ts_source == ustack::ud::TsSource::Poll {
                        c.timestamp
                    } else {
                        now
                    };
                    at.saturating_duration_since(Instant::from_nanos(posted))
                        .saturating_sub(Duration::from_nanos(delay))
                });
            }
        }
    }

    /// Probes whose wait ran out are lost; a TCP echo that timed out ends
    /// its connection.
    fn expire(&mut self, now: Instant, stack: &mut Stack) {
        let (index, stats) = (&self.index, &mut self.stats);
        let mut lose = |id: u64| {
            if let Some(&i) = index.get(&id) {
                stats[i].lose(Some("timeout"));
            }
        };
        self.inflight_icmp.expire(now, &mut lose);
        self.inflight_ud.expire(now, &mut lose);
        self.inflight_udp.expire(now, &mut lose);
        let mut stalled = Vec::new();
        self.inflight_tcp.expire(now, |id| {
            lose(id);
            stalled.push(id);
        });
        for id in stalled {
            if let Some(&i) = self.index.get(&id) {
                self.tcp_fail(i, now, stack, "echo timed out".into());
            }
        }
    }

    /// End series `i`'s connection: its connect probe (if not yet
    /// established) and its echoes in flight are lost; reconnect later.
    fn tcp_fail(&mut self, i: usize, now: Instant, stack: &mut Stack, why: String) {
        let s = &mut self.stats[i];
        if let Some(h) = s.tcp.h.take() {
            let _ = stack.tcp_abort(h);
        }
        if !s.tcp.established {
            s.lose(None);
        }
        let lost = self.inflight_tcp.drop_series(s.id);
        s.lost += lost;
        s.up = Some(false);
        tracing::debug!("mesh tcp {}:{}: {why}", s.target.addr, s.target.tcp_port);
        s.last_error = Some(why);
        let t = &mut s.tcp;
        t.established = false;
        t.backoff = (t.backoff * 2).clamp(BACKOFF_MIN, BACKOFF_MAX);
        t.retry_at = now + t.backoff;
        t.rlen = 0;
        t.out.clear();
    }

    /// Connect progress, echoes received, queued bytes written, for every
    /// TCP series.
    fn tcp_service(&mut self, now: Instant, stack: &mut Stack) {
        for i in 0..self.stats.len() {
            let s = &mut self.stats[i];
            let Some(h) = s.tcp.h else { continue };
            let status = match stack.tcp_status(h) {
                Ok(st) => st,
                Err(e) => {
                    self.tcp_fail(i, now, stack, format!("connection lost: {e}"));
                    continue;
                }
            };
            if let Some(e) = status.error {
                self.tcp_fail(i, now, stack, e.to_string());
                continue;
            }
            if !s.tcp.established {
                match status.state {
                    State::Established => {
                        s.tcp.established = true;
                        s.tcp.backoff = Duration::ZERO;
                        let t = now.saturating_duration_since(s.tcp.connect_at);
                        s.connect.observe(t.as_secs_f64());
                        s.received += 1;
                        s.up = Some(true);
                    }
                    State::SynSent | State::SynReceived if now < s.tcp.connect_deadline => continue,
                    State::SynSent | State::SynReceived => {
                        self.tcp_fail(i, now, stack, "connect timed out".into());
                        continue;
                    }
                    st => {
                        self.tcp_fail(i, now, stack, format!("connect failed ({st:?})"));
                        continue;
                    }
                }
            }
            // Write what is queued, then read whole echoes.
            while !s.tcp.out.is_empty() {
                match stack.tcp_send(h, &s.tcp.out) {
                    Ok(0) => break,
                    Ok(n) => {
                        s.tcp.out.drain(..n);
                    }
                    Err(e) => {
                        self.tcp_fail(i, now, stack, format!("send failed: {e}"));
                        break;
                    }
                }
            }
            let s = &mut self.stats[i];
            if s.tcp.h.is_none() {
                continue;
            }
            loop {
                let t = &mut s.tcp;
                match stack.tcp_recv(h, &mut t.rbuf[t.rlen..]) {
                    Ok(0) => break,
                    Ok(n) => {
                        t.rlen += n;
                        if t.rlen < MSG_LEN {
                            continue;
                        }
                        t.rlen = 0;
                        let Some((key, ts)) = read_msg(&t.rbuf) else {
                            continue;
                        };
                        let id = s.id;
                        if self.inflight_tcp.take(key, |x| x == id).is_some() {
                            let rtt = now.saturating_duration_since(Instant::from_nanos(ts));
                            s.answered(rtt);
                        }
                    }
                    Err(e) => {
                        self.tcp_fail(i, now, stack, format!("receive failed: {e}"));
                        break;
                    }
                }
            }
            if self.stats[i].tcp.h.is_some() && status.eof {
                self.tcp_fail(i, now, stack, "connection closed by the target".into());
            }
        }
    }

    /// One probe of series `i`.
    fn send(&mut self, i: usize, now: Instant, stack: &mut Stack) {
        let deadline = now + self.cfg.wait;
        let size = self.cfg.size;
        let s = &mut self.stats[i];
        let addr = s.target.addr;
        match s.probe {
            Probe::Icmp => {
                let Some(sock) = self.icmp else { return };
                let seq = self.next_seq;
                match stack.ping_send(sock, addr, seq, size) {
                    Ok(()) => {
                        self.next_seq = seq.wrapping_add(1);
                        s.sent += 1;
                        let id = s.id;
                        if let Some(old) = self.inflight_icmp.insert(u64::from(seq), id, deadline)
                            && let Some(o) = self.by_id(old)
                        {
                            // Its sequence number came round again unanswered.
                            o.lose(Some("timeout"));
                        }
                    }
                    Err(e) => tracing::debug!("mesh icmp to {addr}: {e}"),
                }
            }
            Probe::Udp => {
                let Some(sock) = self.udp else { return };
                let key = self.next_key;
                let n = size.max(MSG_LEN);
                write_msg(&mut self.buf[..n], key, now);
                let dst = SocketAddrV4::new(addr, s.target.udp_port);
                match stack.udp_send_to(sock, dst, &self.buf[..n]) {
                    Ok(()) => {
                        self.next_key += 1;
                        s.sent += 1;
                        self.inflight_udp.insert(key, s.id, deadline);
                    }
                    Err(e) => tracing::debug!("mesh udp to {dst}: {e}"),
                }
            }
            Probe::Ud => {
                let Some(qp) = self.ud else { return };
                let key = self.next_key;
                let n = size.max(UD_LEN).min(stack.max_msg_size());
                write_ud_ping(&mut self.buf[..n], key, now);
                let wr = SendWr {
                    wr_id: key,
                    dest: UdAddr {
                        ip: addr,
                        qpn: self.cfg.ud_qpn,
                    },
                    remote_qkey: self.cfg.ud_qkey,
                    imm: None,
                    solicited: false,
                    data: &self.buf[..n],
                };
                match stack.post_send(qp, &wr) {
                    Ok(()) => {
                        self.next_key += 1;
                        s.sent += 1;
                        self.inflight_ud.insert(key, s.id, deadline);
                    }
                    Err(e) => tracing::debug!("mesh ud to {addr}: {e}"),
                }
            }
            Probe::Tcp => {
                let t = &mut s.tcp;
                match t.h {
                    None if now >= t.retry_at => {
                        let dst = SocketAddrV4::new(addr, s.target.tcp_port);
                        s.sent += 1;
                        match stack.tcp_connect(dst) {
                            Ok(h) => {
                                let _ = stack.tcp_set_nodelay(h, true);
                                t.h = Some(h);
                                t.established = false;
                                t.connect_at = now;
                                t.connect_deadline = deadline;
                                t.connect_port = dst.port();
                            }
                            Err(e) => {
                                t.established = true; // the probe is counted lost once, below
                                self.tcp_fail(i, now, stack, format!("cannot connect: {e}"));
                                self.stats[i].lose(None);
                            }
                        }
                    }
                    Some(h) if t.established => {
                        let key = self.next_key;
                        self.next_key += 1;
                        let mut m = [0u8; MSG_LEN];
                        write_msg(&mut m, key, now);
                        t.out.extend_from_slice(&m);
                        s.sent += 1;
                        self.inflight_tcp.insert(key, s.id, deadline);
                        if let Ok(n) = stack.tcp_send(h, &t.out) {
                            t.out.drain(..n);
                        }
                    }
                    // Connecting, or backing off: this slot sends nothing.
                    _ => {}
                }
            }
        }
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
            None => match stack.ping_open(self.cfg.ident ^ 0x8000) {
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
        while let Ok(Some(ev)) = stack.ping_recv(sock) {
            if let PingEvent::Reply(r) = ev
                && let Some(i) = targets.iter().position(|t| t.addr == r.from)
            {
                w.answered[i] = true;
            }
        }
        if w.answered.iter().all(|&a| a) || w.until.is_some_and(|u| now >= u) {
            let _ = stack.ping_close(sock);
            w.done = true;
            return true;
        }
        if w.next_round.is_none_or(|t| now >= t) {
            for (i, t) in targets.iter().enumerate() {
                if !w.answered[i] {
                    let _ = stack.ping_send(sock, t.addr, 0, self.cfg.size);
                }
            }
            w.next_round = Some(now + WARM_UP_RETRY);
        }
        false
    }

    fn publish(&mut self, now: Instant, source: Ipv4Addr, force: bool) {
        let Some(m) = &self.metrics else { return };
        if !force && now < self.next_publish {
            return;
        }
        let (stats, targets, reloads) = (&self.stats, self.cfg.targets.len(), self.reloads);
        if m.publish(|s| {
            s.source = Some(source);
            s.series.clear();
            s.series.extend(stats.iter().map(TargetStats::snapshot));
            s.targets = targets;
            s.reloads = reloads;
        }) {
            self.next_publish = now + PUBLISH_EVERY;
        }
    }

    fn all_in(&self) -> bool {
        self.inflight_icmp.map.is_empty()
            && self.inflight_ud.map.is_empty()
            && self.inflight_udp.map.is_empty()
            && self.inflight_tcp.map.is_empty()
            && self
                .stats
                .iter()
                .all(|s| s.tcp.h.is_none() || s.tcp.established)
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
            self.publish(now, stack.ip(), false);
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
        self.tcp_service(now, stack);
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
        self.publish(now, stack.ip(), false);
        if let Some(end) = self.send_end
            && now >= end
            && (self.all_in() || now >= end + self.cfg.wait)
        {
            self.expire(Instant::FAR_FUTURE, stack);
            self.finished_at = Some(end.min(now));
            self.close(stack);
            self.publish(now, stack.ip(), true);
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
        let connect = self
            .stats
            .iter()
            .filter(|s| s.tcp.h.is_some() && !s.tcp.established)
            .map(|s| s.tcp.connect_deadline)
            .min();
        [
            tick,
            send,
            connect,
            self.inflight_icmp.next_deadline(),
            self.inflight_ud.next_deadline(),
            self.inflight_udp.next_deadline(),
            self.inflight_tcp.next_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
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
        let connecting = self
            .stats
            .iter()
            .any(|s| s.tcp.h.is_some() && !s.tcp.established);
        if connecting || !self.inflight_udp.map.is_empty() || !self.inflight_tcp.map.is_empty() {
            RxWait::Prompt
        } else if !(self.inflight_icmp.map.is_empty() && self.inflight_ud.map.is_empty()) {
            RxWait::Stamped
        } else {
            RxWait::Nothing
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    #[test]
    fn inflight_expiry_counts_only_unanswered() {
        let mut f = InFlight::default();
        assert_eq!(f.insert(1, 10, at(100)), None);
        assert_eq!(f.insert(2, 11, at(110)), None);
        assert_eq!(f.insert(3, 10, at(120)), None);
        // Answered by the wrong series: not taken.
        assert_eq!(f.take(1, |id| id == 11), None);
        assert_eq!(f.take(1, |id| id == 10), Some(10));
        assert_eq!(f.take(1, |_| true), None, "a duplicate finds nothing");
        let mut lost = Vec::new();
        f.expire(at(99), |id| lost.push(id));
        assert!(lost.is_empty());
        f.expire(at(110), |id| lost.push(id));
        assert_eq!(lost, vec![11], "1 was answered, 2 ran out, 3 still waits");
        assert_eq!(f.next_deadline(), Some(at(120)));
        // A wrapped key replaces the old probe, which the caller counts lost.
        assert_eq!(f.insert(3, 12, at(200)), Some(10));
        f.expire(at(150), |id| lost.push(id));
        assert_eq!(lost, vec![11], "the replaced entry does not expire twice");
        assert_eq!(f.insert(4, 12, at(210)), None);
        assert_eq!(f.drop_series(12), 2);
        f.expire(at(1000), |id| lost.push(id));
        assert_eq!(lost, vec![11]);
    }

    #[test]
    fn answered_probes_set_no_deadline() {
        let mut f = InFlight::default();
        for k in 1..=4 {
            f.insert(k, 10, at(100 + k));
        }
        assert_eq!(f.take(1, |_| true), Some(10));
        assert_eq!(f.next_deadline(), Some(at(102)), "1 was answered");
        // Answered out of order: 3 waits behind 2 until 2 is settled.
        assert_eq!(f.take(3, |_| true), Some(10));
        assert_eq!(f.next_deadline(), Some(at(102)));
        assert_eq!(f.take(2, |_| true), Some(10));
        assert_eq!(f.next_deadline(), Some(at(104)), "2 and 3 answered");
        assert_eq!(f.order.len(), 1);
        assert_eq!(f.take(4, |_| true), Some(10));
        assert_eq!(f.next_deadline(), None);
        assert!(f.order.is_empty());
    }

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
    fn messages_round_trip() {
        let mut b = [0u8; 64];
        write_msg(&mut b, 7, Instant::from_nanos(99));
        assert_eq!(read_msg(&b), Some((7, 99)));
        assert_eq!(read_msg(&b[..MSG_LEN - 1]), None);
        let mut u = [0u8; 40];
        write_ud_ping(&mut u, 5, Instant::from_nanos(1234));
        assert_eq!(read_ud_pong(&u), None, "a ping is not a pong");
        u[4] = 2;
        u[32..40].copy_from_slice(&17u64.to_be_bytes());
        assert_eq!(read_ud_pong(&u), Some((5, 1234, 17)));
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
        assert_eq!(m.stats[0].target.addr, Ipv4Addr::new(10, 0, 0, 4));
        assert_eq!(m.stats[1].sent, 5, "a kept series keeps its counters");
        assert_eq!(m.stats[1].target.label.as_deref(), Some("a2"));
        assert!(!m.index.contains_key(&id_b));
        assert_eq!(m.index[&m.stats[1].id], 1);
    }
}
