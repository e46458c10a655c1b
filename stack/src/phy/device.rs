//! The device boundary: burst receive, burst transmit, buffers from a pool.
//!
//! A backend (sim, pcap, DPDK) implements [`Device`]. The engine itself only
//! sees `&[u8]` frames on receive and a [`Tx`] sink on transmit, which lets it
//! write a frame straight into a device buffer (an mbuf's data room on DPDK).

use serde::Serialize;

pub use crate::phy::offload::{RxChecksum, TxOffload};
use crate::phy::pool::{PacketBuf, PoolStats};
use crate::stats::stats;
use crate::time::Instant;

stats! {
    /// Port counters, as DPDK's `rte_eth_stats` names them.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    pub struct PortStats {
        /// Frames received (`ipackets`).
        counter rx_packets: u64,
        /// Bytes of those frames (`ibytes`).
        counter rx_bytes: u64,
        /// Frames transmitted (`opackets`).
        counter tx_packets: u64,
        /// Bytes of those frames (`obytes`).
        counter tx_bytes: u64,
        /// Frames the port dropped on receive (queue full, "imissed").
        counter rx_missed: u64,
        /// Receive drops for want of a buffer ("rx_nombuf").
        counter rx_nombuf: u64,
        /// Frames the port could not transmit.
        counter tx_errors: u64,
        /// Transmits retried after a transient refusal (a full socket buffer).
        counter tx_retries: u64,
        /// Frames larger than the MTU the kernel merged (GRO/LRO) and the port
        /// cut back into segments (pcap).
        counter rx_gro_frames: u64,
        /// TCP/UDP frames whose checksum held only the pseudo-header sum (a
        /// local sender's checksum offload), completed or left to be dropped.
        counter rx_partial_checksum: u64,
        /// Frames too large for the port that were no aggregate it could cut.
        counter rx_oversize: u64,
    }
}

/// What a backend can do, read once by the poll loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCaps {
    /// Largest IP packet (Ethernet payload) the port carries.
    pub mtu: usize,
    /// Whether the port sleeps well (sim, pcap) or must be busy-polled (DPDK).
    pub busy_poll_only: bool,
    /// The work the port does on frames for the engine (none by default).
    pub offloads: Offloads,
    /// The port stamps each received frame with when it arrived
    /// ([`PacketBuf::rx_timestamp`]): an app that measures with those
    /// stamps may let frames wait in the port ([`crate::node::RxWait::Stamped`]).
    pub rx_timestamps: bool,
}

/// Work a port does on frames so the engine does not: checksums and TCP
/// segmentation, as a NIC's offload engine (or a software port that skips
/// them, like a veth pair) does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Offloads {
    /// The port fills the IPv4 header and TCP checksums of frames marked
    /// with a [`TxOffload`]; the engine leaves the pseudo-header sum in the
    /// TCP checksum field (what DPDK's `RTE_MBUF_F_TX_TCP_CKSUM` and Linux's
    /// `CHECKSUM_PARTIAL` expect).
    pub tx_tcp_checksum: bool,
    /// The port verifies received TCP checksums and says so per frame
    /// ([`PacketBuf::rx_checksum`]); the engine skips its own check for
    /// frames marked good.
    pub rx_checksum: bool,
    /// TCP segmentation offload: the port cuts a TCP segment of up to this
    /// many bytes of IP packet into frames of the MSS the frame's
    /// [`TxOffload::tso_segsz`] names. 0 when the port cannot.
    pub tso_max: usize,
    /// The port may deliver merged TCP segments larger than the MTU (LRO,
    /// GRO), up to 64 KiB of IP packet: the engine accepts them.
    pub rx_large: bool,
}

/// What comes with one received frame besides its bytes: what the port
/// found and stamped, and how this stack treats the frame among its
/// sibling shards. An argument of [`crate::Stack::receive`], never state
/// kept between frames.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RxMeta {
    /// What the port found of the transport checksum.
    pub checksum: RxChecksum,
    /// When the port received the frame, where it stamps frames
    /// ([`PacketBuf::rx_timestamp`]); never after the `now` it comes with.
    pub at: Option<Instant>,
    /// Which shard answers for it.
    pub role: RxRole,
}

impl RxMeta {
    /// What a received buffer says of itself, received by `now`: its
    /// checksum verdict and stamp, for the shard that owns it.
    pub fn of<B: PacketBuf>(buf: &B, now: Instant) -> RxMeta {
        RxMeta {
            checksum: buf.rx_checksum(),
            at: buf.rx_timestamp().map(|t| t.min(now)),
            role: RxRole::Owner,
        }
    }
}

/// How a stack treats a frame among the shards of one host (see
/// [`crate::shard`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RxRole {
    /// Ours to answer, whatever it is.
    #[default]
    Owner,
    /// Perhaps a sibling's (a driver spreading flows by its own hash): a
    /// TCP segment matching no connection here (other than a SYN this
    /// shard listens for) is left alone, and [`Received::PassOn`] says to
    /// hand it to the next shard.
    MayPass,
    /// A copy of an ARP frame a sibling received: learn from it, never
    /// answer (the sibling does).
    Replica,
}

/// What became of a received frame that was not dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// Processed here (or dropped, and counted by reason).
    Taken,
    /// Left for the next shard ([`RxRole::MayPass`]).
    PassOn,
}

/// A network port driven in bursts.
pub trait Device {
    /// The device's packet buffer (a slab buffer, an mbuf).
    type Buf: PacketBuf;

    /// What the port can do (MTU, whether it must be busy-polled).
    fn caps(&self) -> DeviceCaps;
    /// Append up to `max` received frames to `out`; returns how many.
    fn rx_burst(&mut self, now: Instant, out: &mut Vec<Self::Buf>, max: usize) -> usize;
    /// Transmit frames from the front of `pkts`, removing those sent. Frames
    /// left in `pkts` were not sent (the queue is full); the caller decides
    /// whether to retry or drop them. Returns how many were sent.
    fn tx_burst(&mut self, now: Instant, pkts: &mut Vec<Self::Buf>) -> usize;
    /// A buffer to build a frame in, or `None` when the pool is dry.
    fn alloc_tx(&mut self) -> Option<Self::Buf>;
    /// A buffer for a frame of `len` bytes: a port that keeps a pool of
    /// large buffers for TSO segments hands one from it when `len` needs
    /// it. By default, [`alloc_tx`](Self::alloc_tx).
    fn alloc_tx_len(&mut self, len: usize) -> Option<Self::Buf> {
        let _ = len;
        self.alloc_tx()
    }
    /// The port's counters now.
    fn port_stats(&self) -> PortStats;
    /// Push the stats of every pool this device owns.
    fn pool_stats(&self, out: &mut Vec<PoolStats>);
    /// When the device will next have something to receive without outside
    /// input (the sim link's next delivery); `None` if unknown.
    fn poll_at(&self) -> Option<Instant> {
        None
    }
    /// Why the port stopped working (interface down, device gone), if it did.
    fn failure(&self) -> Option<String> {
        None
    }
    /// Block for at most `timeout` until frames may have arrived, where the
    /// device can tell (libpcap's selectable descriptor); `false`, at once,
    /// where it cannot, and the caller sleeps or polls instead. A wake-up
    /// may be spurious. The engine never calls this: an idle poll loop does.
    fn wait_rx(&mut self, timeout: core::time::Duration) -> bool {
        let _ = timeout;
        false
    }
    /// The descriptor [`wait_rx`](Self::wait_rx) waits on (readable when
    /// frames may have arrived), for a loop that waits on it together with
    /// descriptors of its own and without holding the device; `None` where
    /// there is none, and while the device has work of its own that such a
    /// wait would hold up (pcap: frames a full socket buffer kept back).
    /// The engine never calls this.
    fn rx_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
}

/// Where the engine writes outgoing frames.
pub trait Tx {
    /// Take a buffer of exactly `len` bytes, let `fill` write the frame into it,
    /// and queue it. Returns false (nothing sent) when no buffer is available.
    fn send<F: FnOnce(&mut [u8])>(&mut self, len: usize, fill: F) -> bool;

    /// [`send`](Self::send) a frame the port finishes as `offload` says
    /// (only called when the port's [`Offloads`] allow it). A sink without
    /// a port keeps the frame as written.
    fn send_offloaded<F: FnOnce(&mut [u8])>(
        &mut self,
        len: usize,
        offload: TxOffload,
        fill: F,
    ) -> bool {
        let _ = offload;
        self.send(len, fill)
    }
}

/// A [`Tx`] that collects frames in memory (unit tests, tools).
#[derive(Debug, Default)]
pub struct VecTx {
    /// Frames sent so far, oldest first (whole Ethernet frames).
    pub frames: Vec<Vec<u8>>,
    /// When set, at most this many frames are accepted (to test exhaustion).
    pub limit: Option<usize>,
    /// The byte every buffer holds before `fill` writes the frame: a value
    /// other than 0 stands for a reused pool buffer, so a test can find
    /// bytes a builder left unwritten (stale data from an earlier frame).
    pub poison: u8,
}

impl VecTx {
    /// An empty sink with no limit and zeroed buffers.
    pub fn new() -> Self {
        Self::default()
    }

    /// A sink whose buffers start filled with `poison` (see [`VecTx::poison`]).
    pub fn poisoned(poison: u8) -> Self {
        VecTx {
            poison,
            ..Self::default()
        }
    }
}

impl Tx for VecTx {
    fn send<F: FnOnce(&mut [u8])>(&mut self, len: usize, fill: F) -> bool {
        if self.limit.is_some_and(|l| self.frames.len() >= l) {
            return false;
        }
        let mut frame = vec![self.poison; len];
        fill(&mut frame);
        self.frames.push(frame);
        true
    }
}

/// A [`Tx`] over a device: frames go into device buffers and are flushed in bursts.
#[derive(Debug)]
pub struct DeviceTx<'a, D: Device> {
    dev: &'a mut D,
    queue: &'a mut Vec<D::Buf>,
    now: Instant,
    burst: usize,
    /// Frames that could not get a buffer or were refused by the port.
    pub dropped: u64,
    /// Frames the port accepted for transmission.
    pub sent: u64,
    /// Frames the port refused (a full ring), dropped: also in `dropped`.
    pub refused: u64,
}

impl<'a, D: Device> DeviceTx<'a, D> {
    /// A sink over `dev` that queues frames in `queue` and hands them to the
    /// port whenever `burst` (at least 1) are queued, on [`flush`](Self::flush)
    /// and on drop.
    pub fn new(dev: &'a mut D, queue: &'a mut Vec<D::Buf>, now: Instant, burst: usize) -> Self {
        DeviceTx {
            dev,
            queue,
            now,
            burst: burst.max(1),
            dropped: 0,
            sent: 0,
            refused: 0,
        }
    }

    /// Hand queued frames to the port; frames it refuses are dropped (counted),
    /// since a run-to-completion loop never blocks on a full ring.
    pub fn flush(&mut self) {
        if self.queue.is_empty() {
            return;
        }
        self.sent += self.dev.tx_burst(self.now, self.queue) as u64;
        self.dropped += self.queue.len() as u64;
        self.refused += self.queue.len() as u64;
        self.queue.clear();
    }
}

impl<D: Device> DeviceTx<'_, D> {
    /// Build a frame of `len` bytes in a device buffer, mark it with
    /// `offload` if given, and queue it.
    fn build<F: FnOnce(&mut [u8])>(
        &mut self,
        len: usize,
        offload: Option<TxOffload>,
        fill: F,
    ) -> bool {
        let Some(mut buf) = self.dev.alloc_tx_len(len) else {
            self.dropped += 1;
            return false;
        };
        if !buf.set_len(len) {
            self.dropped += 1;
            return false;
        }
        fill(buf.as_mut());
        if let Some(o) = offload {
            buf.set_tx_offload(o);
        }
        self.queue.push(buf);
        if self.queue.len() >= self.burst {
            self.flush();
        }
        true
    }
}

impl<D: Device> Tx for DeviceTx<'_, D> {
    fn send<F: FnOnce(&mut [u8])>(&mut self, len: usize, fill: F) -> bool {
        self.build(len, None, fill)
    }

    fn send_offloaded<F: FnOnce(&mut [u8])>(
        &mut self,
        len: usize,
        offload: TxOffload,
        fill: F,
    ) -> bool {
        self.build(len, Some(offload), fill)
    }
}

impl<D: Device> Drop for DeviceTx<'_, D> {
    fn drop(&mut self) {
        self.flush();
    }
}
