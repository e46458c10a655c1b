//! The AF_XDP backend (`--xdp IFACE[:QUEUE]`): an XDP program on the
//! interface steers the stack's frames (its MAC, and ARP and neighbor
//! discovery about its addresses) to an AF_XDP socket and passes every
//! other frame to the kernel, which keeps the interface and its own
//! addresses. Frames move in bursts through shared rings: one `sendto`
//! per transmit burst at most (none where the kernel polls on its own),
//! no system call per received frame, and the socket's descriptor to sleep
//! on when idle.
//!
//! Frames are copied between the UMEM and the stack's slab buffers, one
//! copy each way as over pcap; zero-copy, where the driver has it, is the
//! kernel's side (the NIC writes into the UMEM).

use smoltcp::wire::EthernetAddress;

use ustack::phy::device::{Device, DeviceCaps, PortStats};
use ustack::phy::pool::{Pool, PoolStats, SlabBuf, SlabPool};
use ustack::time::Instant;
use ustack_xdp::{Steering, SteeringMode, UnicastMembership, Xsk, XskConfig};

pub use ustack_xdp::XdpError;

use super::offload;

/// Buffers in an AF_XDP port's pool (the stack's side of the copies).
const POOL_BUFS: usize = 4096;

/// What an AF_XDP port is opened with.
#[derive(Debug, Clone)]
pub struct XdpPortConfig {
    /// The interface.
    pub iface: String,
    /// Its queue.
    pub queue: u32,
    /// The stack's MAC: its own (then in the interface's unicast filter),
    /// or the interface's (then the kernel and the stack share it and
    /// unicast frames are told apart by address).
    pub mac: EthernetAddress,
    /// The stack's addresses (IPv4 and IPv6).
    pub addrs: Vec<std::net::IpAddr>,
    /// The stack's MTU.
    pub mtu: usize,
    /// Complete partial checksums from a local sender instead of dropping
    /// them (`--accept-partial-checksum`).
    pub accept_partial: bool,
}

/// An interface driven through AF_XDP.
pub struct XdpPort {
    // The program is detached before the socket closes (field order).
    _steering: Steering,
    xsk: Xsk,
    _member: Option<UnicastMembership>,
    iface: String,
    pool: SlabPool,
    stats: PortStats,
    mtu: usize,
    accept_partial: bool,
    told_partial: bool,
    failed: Option<String>,
    next_link_check: Instant,
}

impl core::fmt::Debug for XdpPort {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("XdpPort")
            .field("iface", &self.iface)
            .field("xsk", &self.xsk)
            .finish()
    }
}

/// How often the interface's state is looked at.
const LINK_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

impl XdpPort {
    /// Open the socket on `cfg.iface`'s queue and attach the steering
    /// program for the stack's MAC and addresses.
    pub fn open(cfg: &XdpPortConfig) -> Result<Self, XdpError> {
        let iface = cfg.iface.as_str();
        let ifindex = ustack_xdp::if_index(iface)?;
        let own_mac = ustack_xdp::if_mac(iface)? != cfg.mac.0;
        let xsk = Xsk::open(&XskConfig::new(iface, cfg.queue, cfg.mtu + 14))?;
        let member = if own_mac {
            Some(UnicastMembership::add(iface, ifindex, cfg.mac.0)?)
        } else {
            None
        };
        let mut steering = Steering::attach(iface, cfg.mac.0, own_mac, &cfg.addrs)?;
        steering.register(cfg.queue, xsk.fd())?;
        let mode = match steering.mode() {
            SteeringMode::Native => "native XDP",
            SteeringMode::Generic => "generic XDP",
        };
        let copy = if xsk.zero_copy() {
            "zero-copy"
        } else {
            "copy mode"
        };
        tracing::info!(
            "AF_XDP on {iface} queue {}: {mode}, {copy}, {} MAC",
            cfg.queue,
            if own_mac { "own" } else { "the interface's" }
        );
        Ok(XdpPort {
            _steering: steering,
            xsk,
            _member: member,
            iface: iface.to_string(),
            pool: SlabPool::new(format!("xdp-{iface}"), POOL_BUFS, (cfg.mtu + 14).max(2048)),
            stats: PortStats::default(),
            mtu: cfg.mtu,
            accept_partial: cfg.accept_partial,
            told_partial: false,
            failed: None,
            next_link_check: Instant::ZERO,
        })
    }
}

/// Whether `iface` still exists and is up, as the port's failure.
fn link_up(iface: &str) -> Result<(), String> {
    super::link_up(iface).map_err(|e| match e {
        super::LinkDown::Gone => format!("interface '{iface}' is gone"),
        super::LinkDown::Down => format!("interface '{iface}' is down"),
    })
}

impl Device for XdpPort {
    type Buf = SlabBuf;

    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            mtu: self.mtu,
            busy_poll_only: false,
            offloads: Default::default(),
            rx_timestamps: false,
        }
    }

    fn rx_burst(&mut self, now: Instant, out: &mut Vec<SlabBuf>, max: usize) -> usize {
        if now >= self.next_link_check && self.failed.is_none() {
            self.next_link_check = now + LINK_CHECK;
            if let Err(e) = link_up(&self.iface) {
                self.failed = Some(e);
            }
        }
        let (mtu, accept) = (self.mtu, self.accept_partial);
        let (pool, stats) = (&mut self.pool, &mut self.stats);
        let mut n = 0;
        let mut partial_left = false;
        self.xsk.receive(max, |frame| {
            let (pushed, left) = offload::deliver(frame, now, mtu, accept, pool, stats, out);
            n += pushed;
            partial_left |= left;
        });
        if partial_left && !std::mem::replace(&mut self.told_partial, true) {
            crate::notice::notice(&offload::partial_checksum_notice("AF_XDP", &self.iface));
        }
        n
    }

    fn tx_burst(&mut self, _: Instant, pkts: &mut Vec<SlabBuf>) -> usize {
        let sent = self.xsk.transmit(pkts);
        self.stats.tx_packets += sent.frames as u64;
        self.stats.tx_bytes += sent.bytes;
        self.stats.tx_errors += sent.oversize as u64;
        sent.frames
    }

    fn alloc_tx(&mut self) -> Option<SlabBuf> {
        self.pool.alloc()
    }

    fn port_stats(&self) -> PortStats {
        let mut s = self.stats.clone();
        let k = self.xsk.stats();
        s.rx_missed += k.rx_dropped + k.rx_ring_full;
        s.tx_errors += k.tx_invalid;
        s
    }

    fn pool_stats(&self, out: &mut Vec<PoolStats>) {
        out.push(self.pool.stats());
    }

    fn failure(&self) -> Option<String> {
        self.failed.clone()
    }

    fn wait_rx(&mut self, timeout: std::time::Duration) -> bool {
        super::wait_readable(self.xsk.fd(), timeout)
    }

    fn rx_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(self.xsk.fd())
    }
}
