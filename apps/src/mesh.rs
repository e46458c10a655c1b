//! Mesh mode of `uping`: ping many targets from one stack at a fixed
//! aggregate rate, PingWeave-style, and report per-target loss and RTT
//! percentiles.
//!
//! One ping socket carries every target, with one run of sequence numbers;
//! per target, a bitmap of the 65,536 sequence numbers tells answered from
//! outstanding, so duplicates and late replies are counted right at any rate.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{Value, json};
use ustack::icmp::{PingEvent, PingHandle};
use ustack::node::{App, Control};
use ustack::{Instant, Stack};

/// One line of a ping list: an address and an optional label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub addr: Ipv4Addr,
    pub label: Option<String>,
}

/// Parse a ping list: one target per line (`A.B.C.D [label]`), `#` starts
/// a comment, blank lines are skipped. Errors name the line.
pub fn parse_pinglist(text: &str) -> Result<Vec<Target>, String> {
    let mut targets: Vec<Target> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let addr_s = words.next().unwrap_or("");
        let addr: Ipv4Addr = addr_s
            .parse()
            .map_err(|_| format!("line {}: '{addr_s}' is not an IPv4 address", n + 1))?;
        let label: Vec<&str> = words.collect();
        if targets.iter().any(|t| t.addr == addr) {
            return Err(format!("line {}: {addr} is listed twice", n + 1));
        }
        targets.push(Target {
            addr,
            label: (!label.is_empty()).then(|| label.join(" ")),
        });
    }
    if targets.is_empty() {
        return Err("the ping list has no targets".into());
    }
    Ok(targets)
}

/// Mesh settings.
#[derive(Debug, Clone)]
pub struct MeshConfig {
    pub targets: Vec<Target>,
    /// Pings per second, all targets together.
    pub rate: f64,
    /// How long to send.
    pub duration: Duration,
    /// How long to wait for the last replies after sending ends.
    pub wait: Duration,
    /// Echo data bytes (at least 8, to carry the send timestamp).
    pub size: usize,
    pub ident: u16,
}

/// Per-target counters and RTT histogram (nanoseconds).
#[derive(Debug)]
pub struct TargetStats {
    pub target: Target,
    pub sent: u64,
    pub received: u64,
    pub duplicates: u64,
    pub unreachable: u64,
    /// Bit set = sent and not yet answered.
    outstanding: Box<[u64; 1024]>,
    pub rtt: Histogram<u64>,
}

impl TargetStats {
    fn new(target: Target) -> Self {
        TargetStats {
            target,
            sent: 0,
            received: 0,
            duplicates: 0,
            unreachable: 0,
            outstanding: Box::new([0; 1024]),
            // 1 ns to 1 min at three significant digits; bounded, fixed memory.
            rtt: Histogram::new_with_bounds(1, 60_000_000_000, 3)
                .expect("constant histogram bounds are valid"),
        }
    }

    fn bit(seq: u16) -> (usize, u64) {
        (usize::from(seq) / 64, 1 << (seq % 64))
    }

    pub fn loss_percent(&self) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            (self.sent.saturating_sub(self.received)) as f64 * 100.0 / self.sent as f64
        }
    }
}

/// One target's line of the mesh table.
#[derive(Debug)]
pub struct Row<'a> {
    pub target: &'a Target,
    pub sent: u64,
    pub received: u64,
    /// min, p50, p99, max in milliseconds, when anything came back.
    pub rtt_ms: Option<[f64; 4]>,
}

/// The mesh summary table (text), for ICMP and UD mesh modes alike.
pub fn report_table(what: &str, rows: &[Row<'_>], elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let sent: u64 = rows.iter().map(|r| r.sent).sum();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "--- {what} statistics: {} targets, {sent} requests in {secs:.2} s ({:.0}/s) ---",
        rows.len(),
        if secs > 0.0 { sent as f64 / secs } else { 0.0 }
    );
    let _ = writeln!(
        out,
        "{:<15} {:<12} {:>8} {:>8} {:>7} {:>9} {:>9} {:>9} {:>9}",
        "target", "label", "sent", "recv", "loss", "min ms", "p50 ms", "p99 ms", "max ms"
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
            "{:<15} {:<12} {:>8} {:>8} {:>6.2}% {:>9} {:>9} {:>9} {:>9}",
            r.target.addr.to_string(),
            r.target.label.as_deref().unwrap_or("-"),
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

/// The mesh pinger, run in the poll loop.
#[derive(Debug)]
pub struct MeshPinger {
    cfg: MeshConfig,
    sock: Option<PingHandle>,
    pub stats: Vec<TargetStats>,
    /// Target index by address: a reply finds its target without a scan.
    by_addr: HashMap<Ipv4Addr, usize>,
    started: Option<Instant>,
    next_send: Instant,
    next_target: usize,
    /// Sequence numbers run across all targets, so an ICMP error (which
    /// names only the sequence) finds its target.
    next_seq: u16,
    sent_total: u64,
    send_end: Option<Instant>,
    finished_at: Option<Instant>,
    warm: WarmUp,
    pub error: Option<String>,
}

/// Before the measured run, one uncounted request to each target until it
/// answers or [`WARM_UP`] passes, so ARP resolution (and its loss) does not
/// count as ping loss.
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

/// Most requests sent in one poll when the loop fell behind the schedule.
const CATCH_UP: u32 = 256;

impl MeshPinger {
    pub fn new(cfg: MeshConfig) -> Self {
        let stats = cfg.targets.iter().cloned().map(TargetStats::new).collect();
        let by_addr = cfg
            .targets
            .iter()
            .enumerate()
            .map(|(i, t)| (t.addr, i))
            .collect();
        MeshPinger {
            cfg,
            sock: None,
            stats,
            by_addr,
            started: None,
            next_send: Instant::ZERO,
            next_target: 0,
            next_seq: 1,
            sent_total: 0,
            send_end: None,
            finished_at: None,
            warm: WarmUp::default(),
            error: None,
        }
    }

    fn gap(&self) -> Duration {
        Duration::from_secs_f64(1.0 / self.cfg.rate.max(0.001))
    }

    /// Seconds from the first request to the end of sending.
    pub fn elapsed(&self) -> Duration {
        match (self.started, self.finished_at) {
            (Some(s), Some(f)) => f.saturating_duration_since(s),
            _ => Duration::ZERO,
        }
    }

    pub fn done(&self) -> bool {
        self.finished_at.is_some()
    }

    fn receive(&mut self, stack: &mut Stack, sock: PingHandle) {
        while let Ok(Some(ev)) = stack.ping_recv(sock) {
            match ev {
                PingEvent::Reply(r) => {
                    let Some(t) = self.by_addr.get(&r.from).map(|&i| &mut self.stats[i]) else {
                        continue;
                    };
                    let (w, b) = TargetStats::bit(r.seq);
                    if t.outstanding[w] & b == 0 {
                        t.duplicates += 1;
                        continue;
                    }
                    t.outstanding[w] &= !b;
                    t.received += 1;
                    if let Some(rtt) = r.rtt() {
                        let ns = (rtt.as_nanos() as u64).clamp(1, 60_000_000_000);
                        let _ = t.rtt.record(ns);
                    }
                }
                PingEvent::Unreachable { from: _, seq, .. } => {
                    // Sequence numbers are unique across targets (within a
                    // wrap), so the outstanding one names the target.
                    let (w, b) = TargetStats::bit(seq);
                    if let Some(t) = self.stats.iter_mut().find(|t| t.outstanding[w] & b != 0) {
                        t.unreachable += 1;
                    }
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
        let sock = match w.sock {
            Some(s) => s,
            None => match stack.ping_open(self.cfg.ident ^ 0x8000) {
                Ok(s) => {
                    w.until = Some(now + WARM_UP);
                    w.answered = vec![false; self.stats.len()];
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
                && let Some(&i) = self.by_addr.get(&r.from)
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
            for (i, t) in self.stats.iter().enumerate() {
                if !w.answered[i] {
                    let _ = stack.ping_send(sock, t.target.addr, 0, self.cfg.size);
                }
            }
            w.next_round = Some(now + WARM_UP_RETRY);
        }
        false
    }

    /// The summary table, one line per target.
    pub fn report(&self) -> String {
        let rows: Vec<Row<'_>> = self
            .stats
            .iter()
            .map(|t| Row {
                target: &t.target,
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

    /// The summary as JSON.
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
                json!({
                    "host": t.target.addr.to_string(),
                    "label": t.target.label,
                    "sent": t.sent,
                    "received": t.received,
                    "duplicates": t.duplicates,
                    "unreachable": t.unreachable,
                    "loss_percent": t.loss_percent(),
                    "rtt_ms": rtt,
                })
            })
            .collect();
        json!({
            "targets": targets,
            "sent": self.sent_total,
            "received": self.stats.iter().map(|t| t.received).sum::<u64>(),
            "seconds": secs,
            "rate_target": self.cfg.rate,
            "rate_achieved": if secs > 0.0 { self.sent_total as f64 / secs } else { 0.0 },
            "error": self.error,
        })
    }

    /// Exit status as ping's: 0 when every target answered, 1 when some did not.
    pub fn all_answered(&self) -> bool {
        self.stats.iter().all(|t| t.received > 0)
    }
}

impl App for MeshPinger {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        if self.finished_at.is_some() {
            return Control::Exit;
        }
        if !self.warm_up(now, stack) {
            return Control::Continue;
        }
        let sock = match self.sock {
            Some(s) => s,
            None => match stack.ping_open(self.cfg.ident) {
                Ok(s) => {
                    self.started = Some(now);
                    self.next_send = now;
                    self.send_end = Some(now + self.cfg.duration);
                    *self.sock.insert(s)
                }
                Err(e) => {
                    self.error = Some(format!("cannot open a ping socket: {e}"));
                    self.finished_at = Some(now);
                    return Control::Exit;
                }
            },
        };
        self.receive(stack, sock);
        let send_end = self.send_end.unwrap_or(now);
        let mut burst = 0;
        while now >= self.next_send && self.next_send < send_end && burst < CATCH_UP {
            let i = self.next_target;
            self.next_target = (i + 1) % self.stats.len();
            let t = &mut self.stats[i];
            let seq = self.next_seq;
            match stack.ping_send(sock, t.target.addr, seq, self.cfg.size) {
                Ok(()) => {
                    self.next_seq = seq.wrapping_add(1);
                    let (w, b) = TargetStats::bit(seq);
                    t.outstanding[w] |= b;
                    t.sent += 1;
                    self.sent_total += 1;
                }
                Err(e) => {
                    // A full queue (link down, ARP pending): skip this slot.
                    tracing::debug!("mesh ping to {}: {e}", t.target.addr);
                }
            }
            self.next_send += self.gap();
            burst += 1;
        }
        if burst == CATCH_UP && now > self.next_send + self.gap() * CATCH_UP {
            // Far behind (a stalled loop): do not send a storm to catch up.
            self.next_send = now;
        }
        let all_in = self
            .stats
            .iter()
            .all(|t| t.received + t.unreachable >= t.sent);
        if now >= send_end && (all_in || now >= send_end + self.cfg.wait) {
            self.finished_at = Some(send_end.min(now));
            let _ = stack.ping_close(sock);
            return Control::Exit;
        }
        Control::Continue
    }

    fn poll_at(&self) -> Option<Instant> {
        if !self.warm.done {
            return self.warm.next_round;
        }
        match (self.send_end, self.finished_at) {
            (_, Some(_)) => None,
            (Some(end), None) if self.next_send < end => Some(self.next_send),
            (Some(end), None) => Some(end + self.cfg.wait),
            (None, None) => None,
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn pinglist_parsing() {
        let t = parse_pinglist("# mesh\n10.0.0.2 rack-a tor1\n\n10.0.0.3   # no label\n").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].label.as_deref(), Some("rack-a tor1"));
        assert_eq!(t[1].label, None);
        assert_eq!(
            parse_pinglist("10.0.0.2\nexample.com\n").unwrap_err(),
            "line 2: 'example.com' is not an IPv4 address"
        );
        assert!(parse_pinglist("# nothing\n\n").is_err());
        assert!(
            parse_pinglist("10.0.0.2\n10.0.0.2 again\n")
                .unwrap_err()
                .contains("twice")
        );
    }

    #[test]
    fn outstanding_bitmap_wraps() {
        let mut t = TargetStats::new(Target {
            addr: Ipv4Addr::LOCALHOST,
            label: None,
        });
        for seq in [0u16, 63, 64, 65_535] {
            let (w, b) = TargetStats::bit(seq);
            assert_eq!(t.outstanding[w] & b, 0);
            t.outstanding[w] |= b;
        }
        assert_eq!(t.outstanding.iter().map(|w| w.count_ones()).sum::<u32>(), 4);
    }
}
