//! [`Impaired`]: any device with the sim link's impairments applied to the
//! frames it receives and sends (loss, corruption, delay, jitter,
//! reordering), for tests against real peers on kernels without `tc netem`.

use std::collections::BinaryHeap;

use crate::phy::device::{Device, DeviceCaps, PortStats};
use crate::phy::pool::PoolStats;
use crate::phy::sim::{LinkConfig, LinkStats, corrupt, delay, lose};
use crate::time::{Instant, earliest};

struct Held<B> {
    at: Instant,
    seq: u64,
    buf: B,
}

impl<B> PartialEq for Held<B> {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl<B> Eq for Held<B> {}
impl<B> PartialOrd for Held<B> {
    fn partial_cmp(&self, o: &Self) -> Option<core::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl<B> Ord for Held<B> {
    fn cmp(&self, o: &Self) -> core::cmp::Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// A device whose traffic, both ways, goes through seeded impairments.
pub struct Impaired<D: Device> {
    inner: D,
    cfg: LinkConfig,
    rng: fastrand::Rng,
    held_rx: BinaryHeap<Held<D::Buf>>,
    held_tx: BinaryHeap<Held<D::Buf>>,
    seq: u64,
    scratch: Vec<D::Buf>,
    /// What the impairments did (both directions).
    pub stats: LinkStats,
}

impl<D: Device> core::fmt::Debug for Impaired<D> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Impaired")
            .field("cfg", &self.cfg)
            .field("stats", &self.stats)
            .finish()
    }
}

impl<D: Device> Impaired<D> {
    /// Wrap `inner` with the impairments of `cfg`, its random choices
    /// seeded by `cfg.seed`.
    pub fn new(inner: D, cfg: LinkConfig) -> Self {
        Impaired {
            inner,
            rng: fastrand::Rng::with_seed(cfg.seed),
            cfg,
            held_rx: BinaryHeap::new(),
            held_tx: BinaryHeap::new(),
            seq: 0,
            scratch: Vec::new(),
            stats: LinkStats::default(),
        }
    }

    /// Apply impairments to one frame: `None` when it is lost or held.
    fn fate(&mut self, now: Instant, mut buf: D::Buf, tx: bool) -> Option<D::Buf> {
        self.stats.sent += 1;
        if lose(&mut self.rng, &self.cfg) {
            self.stats.lost += 1;
            return None;
        }
        if corrupt(&mut self.rng, &self.cfg, buf.as_mut()) {
            self.stats.corrupted += 1;
        }
        let (d, reordered) = delay(&mut self.rng, &self.cfg);
        if reordered {
            self.stats.reordered += 1;
        }
        if d.is_zero() {
            return Some(buf);
        }
        self.seq += 1;
        let held = Held {
            at: now + d,
            seq: self.seq,
            buf,
        };
        if tx {
            self.held_tx.push(held)
        } else {
            self.held_rx.push(held)
        }
        None
    }

    /// Send held frames that are due.
    fn release_tx(&mut self, now: Instant) {
        while self.held_tx.peek().is_some_and(|h| h.at <= now) {
            if let Some(h) = self.held_tx.pop() {
                self.scratch.push(h.buf);
            }
        }
        if !self.scratch.is_empty() {
            self.inner.tx_burst(now, &mut self.scratch);
            self.scratch.clear();
        }
    }
}

impl<D: Device> Device for Impaired<D> {
    type Buf = D::Buf;

    fn caps(&self) -> DeviceCaps {
        self.inner.caps()
    }

    fn rx_burst(&mut self, now: Instant, out: &mut Vec<D::Buf>, max: usize) -> usize {
        self.release_tx(now);
        let start = out.len();
        while out.len() - start < max && self.held_rx.peek().is_some_and(|h| h.at <= now) {
            if let Some(h) = self.held_rx.pop() {
                out.push(h.buf);
            }
        }
        let mut fresh = std::mem::take(&mut self.scratch);
        self.inner
            .rx_burst(now, &mut fresh, max.saturating_sub(out.len() - start));
        for buf in fresh.drain(..) {
            if let Some(b) = self.fate(now, buf, false) {
                out.push(b);
            }
        }
        self.scratch = fresh;
        self.stats.delivered += (out.len() - start) as u64;
        out.len() - start
    }

    fn tx_burst(&mut self, now: Instant, pkts: &mut Vec<D::Buf>) -> usize {
        let n = pkts.len();
        let mut pass = Vec::with_capacity(n);
        for buf in pkts.drain(..) {
            if let Some(b) = self.fate(now, buf, true) {
                pass.push(b);
            }
        }
        self.inner.tx_burst(now, &mut pass);
        self.release_tx(now);
        n
    }

    fn alloc_tx(&mut self) -> Option<D::Buf> {
        self.inner.alloc_tx()
    }

    fn alloc_tx_len(&mut self, len: usize) -> Option<D::Buf> {
        self.inner.alloc_tx_len(len)
    }

    fn port_stats(&self) -> PortStats {
        self.inner.port_stats()
    }

    fn pool_stats(&self, out: &mut Vec<PoolStats>) {
        self.inner.pool_stats(out);
    }

    fn poll_at(&self) -> Option<Instant> {
        let held = earliest(
            self.held_rx.peek().map(|h| h.at),
            self.held_tx.peek().map(|h| h.at),
        );
        earliest(held, self.inner.poll_at())
    }

    fn failure(&self) -> Option<String> {
        self.inner.failure()
    }

    // Frames held back are due at `poll_at`, which bounds the caller's
    // timeout, so waiting on the inner device misses none of them.
    fn wait_rx(&mut self, timeout: core::time::Duration) -> bool {
        self.inner.wait_rx(timeout)
    }

    fn rx_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.inner.rx_fd()
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::phy::pool::PacketBuf;
    use crate::phy::sim::{SimLink, host_mac};

    #[test]
    fn loss_and_reordering_both_ways_and_buffers_return() {
        let link = SimLink::new(LinkConfig::default());
        let a = link.attach(host_mac(1), 1024);
        let mut b = link.attach(host_mac(2), 1024);
        let pool = a.pool().clone();
        let cfg = LinkConfig {
            loss: 0.2,
            reorder: 0.3,
            reorder_delay: std::time::Duration::from_millis(1),
            seed: 5,
            ..LinkConfig::default()
        };
        let mut imp = Impaired::new(a, cfg);
        let mut sent = Vec::new();
        for i in 0..200u8 {
            let mut buf = imp.alloc_tx().unwrap();
            buf.set_len(20);
            buf.as_mut()[..6].copy_from_slice(&host_mac(2).0);
            buf.as_mut()[19] = i;
            sent.push(buf);
        }
        imp.tx_burst(Instant::ZERO, &mut sent);
        let mut got = Vec::new();
        let later = Instant::from_millis(5);
        imp.rx_burst(later, &mut Vec::new(), 32);
        while b.rx_burst(later, &mut got, 32) > 0 {}
        let order: Vec<u8> = got.iter().map(|f| f.as_ref()[19]).collect();
        assert!(order.len() < 200 && order.len() > 120, "{}", order.len());
        assert!(
            order.windows(2).any(|w| w[0] > w[1]),
            "some frames reordered"
        );
        assert_eq!(imp.stats.lost, 200 - order.len() as u64);
        drop(got);
        assert_eq!(pool.in_use(), 0);
    }
}
