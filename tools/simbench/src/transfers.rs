//! `simbench transfers`: short transfers under random loss, in virtual
//! time on `ustack::sim`'s impaired link: one connection carries `count`
//! transfers of `size` bytes one after another, each timed from the
//! sender's write to the receiver's read of its last byte. What loss
//! recovery buys shows in the tail of those times (a lost last segment
//! waits for a tail loss probe, or without one for the retransmission
//! timeout). With a rate and a queue the link is a bottleneck that
//! tail-drops, or with a marking threshold marks ECN-capable packets
//! instead (what ECN buys, RFC 3168).

use std::cell::Cell;
use std::net::SocketAddrV4;
use std::rc::Rc;
use std::time::Duration;

use anyhow::{Result, bail};
use serde_json::{Value, json};
use ustack::node::{App, Control};
use ustack::sim::{LinkConfig, SimNet, host_config};
use ustack::socket::tcp::{ListenHandle, State, TcpHandle};
use ustack::{Instant, Stack};

/// What a transfers run is asked to do.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// Chance each frame is lost, each direction (0.0..1.0).
    pub loss: f64,
    /// Round-trip time of the link (half each way).
    pub rtt: Duration,
    /// Bytes per transfer.
    pub size: usize,
    /// Transfers, one after another on one connection.
    pub count: usize,
    /// Tail loss probes on (RFC 8985 7).
    pub tlp: bool,
    /// RACK loss detection and PRR (RFC 8985 6, RFC 6937) on.
    pub rack: bool,
    /// The link's rate each way, bits per second (0: unlimited).
    pub rate_bps: u64,
    /// Frames the bottleneck queues before it drops.
    pub queue: usize,
    /// Queued frames past which ECN-capable packets are marked CE (0:
    /// never).
    pub ecn_mark: usize,
    /// Connections ask for ECN (RFC 3168).
    pub ecn: bool,
    /// Seed of the link's losses.
    pub seed: u64,
}

/// Bytes the receiver has read, shared by both ends' apps.
type Counter = Rc<Cell<u64>>;

struct Sender {
    to: SocketAddrV4,
    h: Option<TcpHandle>,
    spec: Spec,
    received: Counter,
    /// The transfer under way: when it started, bytes written of it.
    current: Option<(Instant, usize)>,
    times: Vec<Duration>,
    done: Rc<Cell<bool>>,
    error: Option<String>,
}

impl App for Sender {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let h = match self.h {
            Some(h) => h,
            None => match stack.tcp().connect(now, std::net::SocketAddr::V4(self.to)) {
                Ok(h) => *self.h.insert(h),
                Err(e) => {
                    self.error = Some(e.to_string());
                    self.done.set(true);
                    return Control::Continue;
                }
            },
        };
        match stack.tcp_ref().status(h) {
            Ok(st) if st.state == State::Established => {}
            Ok(st) if st.error.is_none() => return Control::Continue,
            other => {
                self.error = Some(format!("{other:?}"));
                self.done.set(true);
                return Control::Continue;
            }
        }
        let size = self.spec.size;
        let (started, written) = *self.current.get_or_insert((now, 0));
        if written < size {
            let chunk = vec![0x5a; size - written];
            let n = stack.tcp().send(h, &chunk).unwrap_or(0);
            self.current = Some((started, written + n));
        }
        let finished = (self.times.len() + 1) as u64 * size as u64;
        if self.received.get() >= finished {
            self.times.push(now - started);
            self.current = None;
            if self.times.len() == self.spec.count {
                self.done.set(true);
            }
        }
        Control::Continue
    }
}

struct Receiver {
    listener: Option<ListenHandle>,
    conn: Option<TcpHandle>,
    received: Counter,
}

impl App for Receiver {
    fn poll(&mut self, _: Instant, stack: &mut Stack) -> Control {
        let l = match self.listener {
            Some(l) => l,
            None => match stack.tcp().listen(5001, 8) {
                Ok(l) => *self.listener.insert(l),
                Err(_) => return Control::Continue,
            },
        };
        if self.conn.is_none() {
            self.conn = stack.tcp().accept(l).ok().flatten();
        }
        if let Some(h) = self.conn {
            let mut buf = [0u8; 16 << 10];
            while let Ok(n) = stack.tcp().recv(h, &mut buf) {
                if n == 0 {
                    break;
                }
                self.received.set(self.received.get() + n as u64);
            }
        }
        Control::Continue
    }
}

/// The `p`th percentile (0..=100) of sorted `v`, nearest rank.
fn percentile(v: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0 * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// One run: the transfers' completion times and the sender's counters.
pub fn run(spec: Spec) -> Result<Value> {
    if spec.count == 0 || spec.size == 0 {
        bail!("transfers: --count and --size must be at least 1");
    }
    let mut net = SimNet::new(LinkConfig {
        loss: spec.loss,
        delay: spec.rtt / 2,
        seed: spec.seed,
        rate_bps: spec.rate_bps,
        queue_frames: spec.queue,
        ecn_mark: spec.ecn_mark,
        ..LinkConfig::default()
    });
    for n in [1u8, 2] {
        let mut cfg = host_config(n);
        cfg.tcp.tail_loss_probe = spec.tlp;
        cfg.tcp.rack = spec.rack;
        if spec.ecn {
            cfg.tcp.ecn = ustack::socket::tcp::Ecn::On;
        }
        net.add(cfg);
    }
    let received = Counter::default();
    let done = Rc::new(Cell::new(false));
    let mut tx = Sender {
        to: SocketAddrV4::new(net.nodes[1].stack.ip(), 5001),
        h: None,
        spec,
        received: received.clone(),
        current: None,
        times: Vec::with_capacity(spec.count),
        done: done.clone(),
        error: None,
    };
    let mut rx = Receiver {
        listener: None,
        conn: None,
        received,
    };
    // Virtual time: an hour of it at most (a run takes seconds of it).
    let finished = net.run_until(Instant::from_secs(3600), &mut [&mut tx, &mut rx], |_| {
        done.get()
    });
    if let Some(e) = tx.error {
        bail!("transfers: the connection failed: {e}");
    }
    if !finished || tx.times.len() < spec.count {
        bail!(
            "transfers: {} of {} finished by {}",
            tx.times.len(),
            spec.count,
            net.now
        );
    }
    let stats =
        tx.h.and_then(|h| net.nodes[0].stack.tcp_ref().info(h))
            .map(|i| i.stats)
            .unwrap_or_default();
    let total: Duration = tx.times.iter().sum();
    let mut sorted = tx.times.clone();
    sorted.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Ok(json!({
        "measure": "transfers",
        "loss": spec.loss,
        "rtt_ms": ms(spec.rtt),
        "size": spec.size,
        "count": spec.count,
        "tail_loss_probe": spec.tlp,
        "rack": spec.rack,
        "rate_mbit": spec.rate_bps as f64 / 1e6,
        "queue": spec.queue,
        "ecn_mark": spec.ecn_mark,
        "ecn": spec.ecn,
        "queue_drops": net.link.stats().queue_drops,
        "ce_marked": net.link.stats().ce_marked,
        "ecn_reductions": stats.ecn_reductions,
        "p50_ms": ms(percentile(&sorted, 50.0)),
        "p99_ms": ms(percentile(&sorted, 99.0)),
        "max_ms": ms(sorted[sorted.len() - 1]),
        "mean_ms": ms(total) / spec.count as f64,
        "goodput_mbit": (spec.size * spec.count) as f64 * 8.0 / total.as_secs_f64() / 1e6,
        "retransmits": stats.retransmits,
        "timeouts": stats.timeouts,
        "tail_loss_probes": stats.tail_loss_probes,
        "fast_retransmits": stats.fast_retransmits,
        "undos": stats.undos,
    }))
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&v, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&v[..1], 99.0), Duration::from_millis(1));
    }
}
