//! The simulated link: stacks in one process joined by a wire with seeded
//! loss, reordering, duplication, corruption, delay, jitter and a rate limit.
//!
//! [`SimLink`] behaves like a small switch: unicast frames go to the port
//! owning the destination MAC (flooded when unknown), broadcasts to every
//! other port. Frames move between ports without copying (a buffer taken from
//! the sender's pool returns there when the receiver drops it); duplicates
//! are copies. The harness that steps stacks on it against a virtual clock
//! is `crate::sim` (above the stack, as it drives whole nodes).

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Serialize;
use smoltcp::wire::EthernetAddress;

use crate::phy::device::{Device, DeviceCaps, Offloads, PortStats, RxChecksum};
use crate::phy::pool::{PacketBuf, Pool, PoolStats, SlabBuf, SlabPool};
use crate::time::Instant;

/// Impairments of a sim link. Probabilities are in 0.0..=1.0.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkConfig {
    /// Chance a frame is dropped on the wire (per recipient).
    pub loss: f64,
    /// Chance a frame is delivered twice (the copy gets its own delay).
    pub duplicate: f64,
    /// Chance a frame gets one random bit flipped.
    pub corrupt: f64,
    /// Chance a frame is held back by `reorder_delay` (so later frames pass it).
    pub reorder: f64,
    /// How long a reordered frame is held back.
    pub reorder_delay: Duration,
    /// One-way propagation delay.
    pub delay: Duration,
    /// Uniform extra delay in `0..jitter` (reorders frames too).
    pub jitter: Duration,
    /// Bits per second per sending port; 0 means unlimited.
    pub rate_bps: u64,
    /// Frames a port's inbox holds; beyond it frames are dropped (tail drop).
    pub queue_frames: usize,
    /// With `rate_bps` set: an ECN-capable IP packet (ECT(0) or ECT(1))
    /// that finds this many frames or more waiting ahead of it at the
    /// sending port is marked Congestion Experienced (RFC 3168 5: an
    /// AQM's marking threshold, as a switch's on its egress queue); 0
    /// marks nothing. Frames that are not ECN-capable wait or are
    /// tail-dropped as ever.
    pub ecn_mark: usize,
    /// IP MTU of the link.
    pub mtu: usize,
    /// Seed of the impairments' random generator: the same seed and
    /// inputs give the same losses, flips and delays.
    pub seed: u64,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            loss: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::from_micros(200),
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            rate_bps: 0,
            queue_frames: 4096,
            ecn_mark: 0,
            mtu: 1500,
            seed: 1,
        }
    }
}

/// What the wire did to frames.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LinkStats {
    /// Frames put on the wire (on an [`Impaired`](crate::phy::impair::Impaired)
    /// device: frames through it in either direction).
    pub sent: u64,
    /// Frames handed to a receiver.
    pub delivered: u64,
    /// Frames dropped by the `loss` impairment.
    pub lost: u64,
    /// Extra copies made by the `duplicate` impairment.
    pub duplicated: u64,
    /// Frames with one bit flipped by the `corrupt` impairment.
    pub corrupted: u64,
    /// Frames held back by the `reorder` impairment.
    pub reordered: u64,
    /// Frames dropped because the receiving port's inbox held
    /// `queue_frames` already (sim link only).
    pub queue_drops: u64,
    /// ECN-capable packets marked Congestion Experienced past the
    /// `ecn_mark` threshold (sim link only).
    pub ce_marked: u64,
}

#[derive(Debug)]
struct InFlight {
    at: Instant,
    seq: u64,
    buf: SlabBuf,
}

impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for InFlight {
    // Reversed: the heap's top is the earliest delivery.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Debug)]
struct PortSlot {
    mac: EthernetAddress,
    /// This port's queue among its host's `queues` (slots of one host are
    /// consecutive; frames reach a queue by software RSS).
    queue: usize,
    queues: usize,
    inbox: BinaryHeap<InFlight>,
    busy_until: Instant,
    pool: SlabPool,
}

#[derive(Debug)]
struct Wire {
    cfg: LinkConfig,
    rng: fastrand::Rng,
    ports: Vec<PortSlot>,
    seq: u64,
    stats: LinkStats,
}

impl Wire {
    fn transmit(&mut self, from: usize, now: Instant, buf: SlabBuf) {
        self.stats.sent += 1;
        let len = buf.len();
        // Serialization on the sender's port.
        let mut depart = now;
        let mut congested = false;
        let bits_ns = (len as u64).saturating_mul(8_000_000_000);
        if let Some(tx_ns) = bits_ns.checked_div(self.cfg.rate_bps) {
            let tx_time = Duration::from_nanos(tx_ns);
            let slot = &mut self.ports[from];
            let waiting = slot.busy_until.saturating_duration_since(now);
            // Frames (of this one's size) ahead of it at the port.
            let ahead = waiting.as_nanos() / u128::from(tx_ns.max(1));
            congested = self.cfg.ecn_mark > 0 && ahead >= self.cfg.ecn_mark as u128;
            depart = slot.busy_until.max(now) + tx_time;
            slot.busy_until = depart;
        }
        let dst = EthernetAddress::from_bytes(buf.as_ref().get(..6).unwrap_or(&[0xff; 6]));
        let owner = self.ports.iter().position(|p| p.mac == dst);
        // The first slot of the sender's host.
        let from_host = from - self.ports[from].queue;
        let recipients: Vec<usize> = match owner {
            Some(i) if dst.is_unicast() && i != from_host => {
                vec![i + crate::shard::rss::frame_queue(buf.as_ref(), self.ports[i].queues)]
            }
            Some(_) if dst.is_unicast() => Vec::new(),
            // Broadcast reaches queue 0 of every other host, as on a NIC.
            _ => (0..self.ports.len())
                .filter(|&i| self.ports[i].queue == 0 && i != from_host)
                .collect(),
        };
        let pool = self.ports[from].pool.clone();
        let mut original = Some(buf);
        for (n, &to) in recipients.iter().enumerate() {
            let frame = if n + 1 == recipients.len() {
                original.take()
            } else {
                original.as_ref().and_then(|b| b.try_clone_from(&pool))
            };
            if let Some(mut frame) = frame {
                if congested && mark_ce(frame.as_mut()) {
                    self.stats.ce_marked += 1;
                }
                self.impair_and_queue(to, depart, frame, &pool);
            }
        }
    }

    fn impair_and_queue(
        &mut self,
        to: usize,
        depart: Instant,
        mut frame: SlabBuf,
        pool: &SlabPool,
    ) {
        if lose(&mut self.rng, &self.cfg) {
            self.stats.lost += 1;
            return;
        }
        if corrupt(&mut self.rng, &self.cfg, frame.as_mut()) {
            self.stats.corrupted += 1;
        }
        let copy = if self.cfg.duplicate > 0.0 && self.rng.f64() < self.cfg.duplicate {
            self.stats.duplicated += 1;
            frame.try_clone_from(pool)
        } else {
            None
        };
        for f in std::iter::once(frame).chain(copy) {
            let (extra, reordered) = delay(&mut self.rng, &self.cfg);
            let at = depart + extra;
            if reordered {
                self.stats.reordered += 1;
            }
            let slot = &mut self.ports[to];
            if slot.inbox.len() >= self.cfg.queue_frames {
                self.stats.queue_drops += 1;
                continue;
            }
            self.seq += 1;
            slot.inbox.push(InFlight {
                at,
                seq: self.seq,
                buf: f,
            });
        }
    }
}

/// Mark an Ethernet frame's ECN-capable IP packet Congestion Experienced
/// (its IPv4 header checksum redone); false, untouched, for a frame that
/// is not IP or not ECN-capable (or already marked).
pub(crate) fn mark_ce(frame: &mut [u8]) -> bool {
    use smoltcp::wire::{Ipv4Packet, Ipv6Packet};
    const CE: u8 = 3;
    let Some((ethertype, ip)) = frame
        .split_at_mut_checked(14)
        .map(|(h, ip)| ([h[12], h[13]], ip))
    else {
        return false;
    };
    match ethertype {
        [0x08, 0x00] => {
            let Ok(mut p) = Ipv4Packet::new_checked(ip) else {
                return false;
            };
            if !matches!(p.ecn(), 1 | 2) {
                return false;
            }
            p.set_ecn(CE);
            p.fill_checksum();
            true
        }
        [0x86, 0xdd] => {
            let Ok(mut p) = Ipv6Packet::new_checked(ip) else {
                return false;
            };
            let tc = p.traffic_class();
            if !matches!(tc & 3, 1 | 2) {
                return false;
            }
            p.set_traffic_class(tc | CE);
            true
        }
        _ => false,
    }
}

/// Whether this frame is lost.
pub(crate) fn lose(rng: &mut fastrand::Rng, cfg: &LinkConfig) -> bool {
    cfg.loss > 0.0 && rng.f64() < cfg.loss
}

/// Maybe flip one random bit; returns whether it did.
pub(crate) fn corrupt(rng: &mut fastrand::Rng, cfg: &LinkConfig, frame: &mut [u8]) -> bool {
    if cfg.corrupt > 0.0 && rng.f64() < cfg.corrupt && !frame.is_empty() {
        let byte = rng.usize(..frame.len());
        let bit = rng.u8(..8);
        frame[byte] ^= 1 << bit;
        return true;
    }
    false
}

/// Delay for one frame: propagation, jitter, and reordering (held back by
/// `reorder_delay`); the flag says whether it was held back.
pub(crate) fn delay(rng: &mut fastrand::Rng, cfg: &LinkConfig) -> (Duration, bool) {
    let mut d = cfg.delay;
    if !cfg.jitter.is_zero() {
        d += Duration::from_nanos(
            rng.u64(..u64::try_from(cfg.jitter.as_nanos()).unwrap_or(u64::MAX)),
        );
    }
    let reordered = cfg.reorder > 0.0 && rng.f64() < cfg.reorder;
    if reordered {
        d += cfg.reorder_delay;
    }
    (d, reordered)
}

/// A shared simulated wire. Cloning gives another handle to the same wire.
#[derive(Debug, Clone)]
pub struct SimLink {
    wire: Arc<Mutex<Wire>>,
}

/// Buffers per sim port pool.
pub const SIM_POOL_BUFS: usize = 8192;
/// Size of each sim pool buffer (an MTU 1500 frame fits; jumbo links need more).
pub const SIM_BUF_SIZE: usize = 2048;

impl SimLink {
    /// A wire with no ports yet and the impairments of `cfg`.
    pub fn new(cfg: LinkConfig) -> Self {
        SimLink {
            wire: Arc::new(Mutex::new(Wire {
                rng: fastrand::Rng::with_seed(cfg.seed),
                cfg,
                ports: Vec::new(),
                seq: 0,
                stats: LinkStats::default(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Wire> {
        // A panic elsewhere cannot leave the wire half-updated in a way that
        // matters to a simulation; keep going with its state.
        self.wire.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Attach a port with MAC `mac` and a pool of `pool_bufs` buffers.
    pub fn attach(&self, mac: EthernetAddress, pool_bufs: usize) -> SimPort {
        self.attach_queue(mac, 0, 1, pool_bufs, 0)
    }

    /// Attach a host with `queues` receive/transmit queue pairs, each a port
    /// with its own pool; frames for `mac` reach a queue by symmetric RSS
    /// ([`crate::shard::rss::frame_queue`]), broadcasts reach queue 0.
    pub fn attach_queues(
        &self,
        mac: EthernetAddress,
        queues: usize,
        pool_bufs: usize,
    ) -> Vec<SimPort> {
        let queues = queues.max(1);
        (0..queues)
            .map(|q| self.attach_queue(mac, q, queues, pool_bufs, 0))
            .collect()
    }

    /// Attach a port that plays a NIC with `offloads`: it finishes the
    /// TCP checksums of frames marked for it and cuts TSO segments into
    /// frames of the MTU (with the software of [`crate::phy::offload`]), and
    /// marks received frames whose checksum it verified. Its pool's
    /// buffers hold a whole TSO segment when `offloads.tso_max` is set.
    pub fn attach_offloaded(
        &self,
        mac: EthernetAddress,
        pool_bufs: usize,
        offloads: Offloads,
    ) -> SimPort {
        let mut port = self.attach_queue(mac, 0, 1, pool_bufs, offloads.tso_max + 14);
        port.offloads = offloads;
        port
    }

    fn attach_queue(
        &self,
        mac: EthernetAddress,
        queue: usize,
        queues: usize,
        pool_bufs: usize,
        min_buf: usize,
    ) -> SimPort {
        let mut w = self.lock();
        let buf_size = (w.cfg.mtu + 14).max(SIM_BUF_SIZE).max(min_buf);
        let name = match queues {
            1 => format!("sim-{mac}"),
            _ => format!("sim-{mac}-q{queue}"),
        };
        let pool = SlabPool::new(name, pool_bufs, buf_size);
        w.ports.push(PortSlot {
            mac,
            queue,
            queues,
            inbox: BinaryHeap::new(),
            busy_until: Instant::ZERO,
            pool: pool.clone(),
        });
        SimPort {
            link: self.clone(),
            id: w.ports.len() - 1,
            pool,
            stats: PortStats::default(),
            mtu: w.cfg.mtu,
            rx_own_pool: false,
            rx_timestamps: false,
            offloads: Offloads::default(),
        }
    }

    /// Attach a port that receives into its own pool, as a NIC does: each
    /// delivered frame is copied into a buffer of this port's pool of
    /// `pool_bufs`, and a frame that finds the pool empty is dropped and
    /// counted in `rx_nombuf` (see [`SimPort::set_rx_own_pool`]).
    pub fn attach_with_rx_pool(&self, mac: EthernetAddress, pool_bufs: usize) -> SimPort {
        let mut port = self.attach(mac, pool_bufs);
        port.set_rx_own_pool(true);
        port
    }

    /// What the wire has done to frames so far.
    pub fn stats(&self) -> LinkStats {
        self.lock().stats.clone()
    }

    /// The impairments in force now.
    pub fn config(&self) -> LinkConfig {
        self.lock().cfg.clone()
    }

    /// Change impairments mid-run (a blackhole, a burst of loss).
    pub fn set_config(&self, cfg: LinkConfig) {
        self.lock().cfg = cfg;
    }

    /// Frames on the wire now.
    pub fn in_flight(&self) -> usize {
        self.lock().ports.iter().map(|p| p.inbox.len()).sum()
    }
}

/// One end of a [`SimLink`].
#[derive(Debug)]
pub struct SimPort {
    link: SimLink,
    id: usize,
    pool: SlabPool,
    stats: PortStats,
    mtu: usize,
    /// Copy received frames into this port's pool (drop on an empty pool)
    /// instead of taking the sender's buffer.
    rx_own_pool: bool,
    /// The NIC offloads this port plays ([`SimLink::attach_offloaded`]).
    offloads: Offloads,
    /// Stamp received frames with their delivery time.
    rx_timestamps: bool,
}

impl SimPort {
    /// The port's buffer pool (transmit buffers, and receive buffers with
    /// [`set_rx_own_pool`](Self::set_rx_own_pool)).
    pub fn pool(&self) -> &SlabPool {
        &self.pool
    }

    /// Receive into this port's own pool (`true`): a frame that finds the
    /// pool empty is dropped and counted in `rx_nombuf`, so a receiver that
    /// holds its buffers runs dry as a NIC would. By default (`false`) the
    /// receiver takes the sender's buffer.
    pub fn set_rx_own_pool(&mut self, on: bool) {
        self.rx_own_pool = on;
    }

    /// Stamp each received frame with when the link delivered it
    /// ([`PacketBuf::rx_timestamp`]), as libpcap's kernel stamps do: a
    /// frame read by a later poll keeps its arrival time.
    pub fn set_rx_timestamps(&mut self, on: bool) {
        self.rx_timestamps = on;
    }
}

impl Device for SimPort {
    type Buf = SlabBuf;

    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            mtu: self.mtu,
            busy_poll_only: false,
            offloads: self.offloads,
            rx_timestamps: self.rx_timestamps,
        }
    }

    fn rx_burst(&mut self, now: Instant, out: &mut Vec<SlabBuf>, max: usize) -> usize {
        let mut w = self.link.lock();
        let mut n = 0;
        while n < max {
            let inbox = &mut w.ports[self.id].inbox;
            if inbox.peek().is_none_or(|f| f.at > now) {
                break;
            }
            let Some(f) = inbox.pop() else { break };
            let buf = if self.rx_own_pool {
                // The sender's buffer goes home here; no room, no frame.
                match f.buf.try_clone_from(&self.pool) {
                    Some(b) => b,
                    None => {
                        self.stats.rx_nombuf += 1;
                        continue;
                    }
                }
            } else {
                f.buf
            };
            let mut buf = buf;
            if self.rx_timestamps {
                buf.set_rx_timestamp(f.at);
            }
            if self.offloads.rx_checksum && crate::phy::offload::l4_checksum_ok(buf.as_ref()) {
                buf.set_rx_checksum(RxChecksum::Good);
            }
            self.stats.rx_packets += 1;
            self.stats.rx_bytes += buf.len() as u64;
            out.push(buf);
            n += 1;
        }
        w.stats.delivered += n as u64;
        n
    }

    fn tx_burst(&mut self, now: Instant, pkts: &mut Vec<SlabBuf>) -> usize {
        let n = pkts.len();
        let mut w = self.link.lock();
        for mut buf in pkts.drain(..) {
            if let Some(o) = buf.tx_offload() {
                // The NIC's work: cut a TSO segment, or finish the checksum.
                buf.clear_tx_offload();
                if o.tso_segsz > 0 && buf.len() > self.mtu + 14 {
                    let (pool, stats, id) = (&self.pool, &mut self.stats, self.id);
                    let cut = crate::phy::offload::split_tcp(
                        buf.as_ref(),
                        usize::from(o.tso_segsz),
                        |f| {
                            let Some(mut b) = pool.alloc() else {
                                stats.tx_errors += 1;
                                return;
                            };
                            if b.set_len(f.len()) {
                                b.as_mut().copy_from_slice(f);
                                stats.tx_packets += 1;
                                stats.tx_bytes += f.len() as u64;
                                w.transmit(id, now, b);
                            }
                        },
                    );
                    if cut.is_some() {
                        continue;
                    }
                }
                crate::phy::offload::complete_checksum(buf.as_mut());
            }
            self.stats.tx_packets += 1;
            self.stats.tx_bytes += buf.len() as u64;
            w.transmit(self.id, now, buf);
        }
        n
    }

    fn alloc_tx(&mut self) -> Option<SlabBuf> {
        self.pool.alloc()
    }

    fn port_stats(&self) -> PortStats {
        self.stats.clone()
    }

    fn pool_stats(&self, out: &mut Vec<PoolStats>) {
        out.push(self.pool.stats());
    }

    fn poll_at(&self) -> Option<Instant> {
        self.link.lock().ports[self.id].inbox.peek().map(|f| f.at)
    }
}

/// The locally administered MAC of sim host `n`.
pub fn host_mac(n: u8) -> EthernetAddress {
    EthernetAddress([0x02, 0x00, 0x00, 0x00, 0x00, n])
}

#[cfg(test)]
mod test {
    use super::*;
    use smoltcp::wire::{Ipv4Packet, Ipv6Packet};

    /// An Ethernet frame of `ethertype` around a 40-byte IP header whose
    /// ECN codepoint is `ecn`.
    fn frame(v6: bool, ecn: u8) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 40];
        f[12..14].copy_from_slice(if v6 { &[0x86, 0xdd] } else { &[0x08, 0x00] });
        let ip = &mut f[14..];
        if v6 {
            let mut p = Ipv6Packet::new_unchecked(ip);
            p.set_version(6);
            p.set_payload_len(0);
            p.set_traffic_class(0xb8 | ecn);
        } else {
            let mut p = Ipv4Packet::new_unchecked(ip);
            p.set_version(4);
            p.set_header_len(20);
            p.set_total_len(40);
            p.set_dscp(0x2e);
            p.set_ecn(ecn);
            p.fill_checksum();
        }
        f
    }

    #[test]
    fn ecn_capable_packets_are_marked_and_others_left_alone() {
        for v6 in [false, true] {
            for (ecn, marked) in [(0, false), (1, true), (2, true), (3, false)] {
                let mut f = frame(v6, ecn);
                assert_eq!(mark_ce(&mut f), marked, "v6 {v6} ecn {ecn}");
                let ip = &f[14..];
                let (now, dscp) = if v6 {
                    let p = Ipv6Packet::new_checked(ip).unwrap();
                    (p.traffic_class() & 3, p.traffic_class() >> 2)
                } else {
                    let p = Ipv4Packet::new_checked(ip).unwrap();
                    assert!(p.verify_checksum());
                    (p.ecn(), p.dscp())
                };
                assert_eq!(now, if marked { 3 } else { ecn });
                assert_eq!(dscp, 0x2e, "DSCP untouched");
            }
        }
        assert!(!mark_ce(&mut [0u8; 10]), "a runt frame");
    }
}
