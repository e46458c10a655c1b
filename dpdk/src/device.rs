//! ustack's [`Device`] over one DPDK port queue pair and its mbuf pool.

use std::mem::ManuallyDrop;

use ustack::Instant;
use ustack::device::{Device, DeviceCaps, PortStats};
use ustack::pool::{PacketBuf, Pool, PoolStats};

use crate::port::{Port, PortConfig};
use crate::{DpdkError, Eal, Mbuf, MbufPool};

/// How to open a [`DpdkPort`].
#[derive(Debug, Clone)]
pub struct DpdkPortConfig {
    pub port: u16,
    /// Mbufs in the port's pool (receive and transmit share it).
    pub mbufs: u32,
    /// IP MTU the stack uses; the data room fits an Ethernet frame of it.
    pub mtu: usize,
    /// Receive every frame (the stack takes its own MAC, as with pcap).
    pub promiscuous: bool,
    /// How long `open` waits for the link to come up (a memif client
    /// connects within about a second); the port is used either way.
    pub link_wait: std::time::Duration,
}

impl DpdkPortConfig {
    pub fn new(port: u16) -> Self {
        DpdkPortConfig {
            port,
            mbufs: 8191,
            mtu: 1500,
            promiscuous: true,
            link_wait: std::time::Duration::from_secs(2),
        }
    }
}

/// A DPDK port as a ustack device: rx queue 0 and tx queue 0, one mbuf pool.
///
/// Zero copy both ways: received frames are the mbufs the driver filled,
/// and the engine writes outgoing frames into mbufs from the pool, which
/// `tx_burst` hands to the driver.
#[derive(Debug)]
pub struct DpdkPort {
    /// Stopped and closed first in `drop`, while the pool is still alive.
    port: ManuallyDrop<Port>,
    pool: MbufPool,
    mtu: usize,
    /// Frames the tx ring refused.
    tx_refused: u64,
    /// Chained (multi-segment) frames received, dropped: the engine reads
    /// one contiguous frame.
    rx_chained: u64,
    /// Our own count of what crossed the port: some drivers reset theirs
    /// (memif does when its peer reconnects).
    sw: PortStats,
}

impl DpdkPort {
    /// Create the pool, configure and start the port.
    pub fn open(eal: &Eal, cfg: &DpdkPortConfig) -> Result<Self, DpdkError> {
        let frame = cfg.mtu + 14;
        let room =
            (frame.max(2048) + dpdk_sys::RTE_PKTMBUF_HEADROOM as usize).min(u16::MAX as usize);
        // Descriptors must leave mbufs for transmit: at most half the pool.
        let half = (cfg.mbufs / 2).max(1);
        let desc = if half >= 1024 {
            1024
        } else {
            1 << (31 - half.leading_zeros())
        }
        .max(32) as u16;
        let pool = MbufPool::new(
            eal,
            &format!("ustack-p{}", cfg.port),
            cfg.mbufs,
            room as u16,
            None,
        )?;
        let pcfg = PortConfig {
            rx_desc: desc,
            tx_desc: desc,
            mtu: Some(cfg.mtu.min(usize::from(u16::MAX)) as u16),
            promiscuous: cfg.promiscuous,
            ..PortConfig::default()
        };
        let port = Port::open(eal, cfg.port, &pcfg, std::slice::from_ref(&pool))?;
        let deadline = std::time::Instant::now() + cfg.link_wait;
        while port.link().is_some_and(|l| !l.up) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        tracing::debug!(
            "DPDK port {} ({}, driver {}): {} mbufs, {desc} descriptors",
            cfg.port,
            port.info().name,
            port.info().driver,
            cfg.mbufs
        );
        Ok(DpdkPort {
            port: ManuallyDrop::new(port),
            pool,
            mtu: cfg.mtu,
            tx_refused: 0,
            rx_chained: 0,
            sw: PortStats::default(),
        })
    }

    pub fn port(&self) -> &Port {
        &self.port
    }

    pub fn pool(&self) -> &MbufPool {
        &self.pool
    }
}

impl Device for DpdkPort {
    type Buf = Mbuf;

    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            mtu: self.mtu,
            busy_poll_only: true,
        }
    }

    fn rx_burst(&mut self, _: Instant, out: &mut Vec<Mbuf>, max: usize) -> usize {
        let start = out.len();
        let n = self.port.rx_burst(0, out, max);
        if n > 0 && out[start..].iter().any(|m| m.segments() != 1) {
            let before = out.len();
            let mut i = start;
            while i < out.len() {
                if out[i].segments() != 1 {
                    drop(out.swap_remove(i));
                } else {
                    i += 1;
                }
            }
            self.rx_chained += (before - out.len()) as u64;
        }
        self.sw.rx_packets += (out.len() - start) as u64;
        self.sw.rx_bytes += out[start..].iter().map(|m| m.len() as u64).sum::<u64>();
        out.len() - start
    }

    fn tx_burst(&mut self, _: Instant, pkts: &mut Vec<Mbuf>) -> usize {
        let bytes: u64 = pkts.iter().map(|m| m.len() as u64).sum();
        let n = self.port.tx_burst(0, pkts);
        let refused: u64 = pkts.iter().map(|m| m.len() as u64).sum();
        self.sw.tx_packets += n as u64;
        self.sw.tx_bytes += bytes - refused;
        self.tx_refused += pkts.len() as u64;
        n
    }

    fn alloc_tx(&mut self) -> Option<Mbuf> {
        self.pool.alloc()
    }

    fn port_stats(&self) -> PortStats {
        let s = self.port.stats();
        // The driver's counters, unless it reset them below ours.
        PortStats {
            rx_packets: s.ipackets.max(self.sw.rx_packets),
            rx_bytes: s.ibytes.max(self.sw.rx_bytes),
            tx_packets: s.opackets.max(self.sw.tx_packets),
            tx_bytes: s.obytes.max(self.sw.tx_bytes),
            rx_missed: s.imissed + s.ierrors + self.rx_chained,
            rx_nombuf: s.rx_nombuf,
            tx_errors: s.oerrors + self.tx_refused,
        }
    }

    fn pool_stats(&self, out: &mut Vec<PoolStats>) {
        let mut s = self.pool.stats();
        // The driver's receive allocations from this pool that failed.
        s.alloc_failures += self.port.stats().rx_nombuf;
        out.push(s);
    }
}

impl Drop for DpdkPort {
    fn drop(&mut self) {
        // SAFETY: `port` is dropped exactly once, here, and never used after.
        unsafe { ManuallyDrop::drop(&mut self.port) };
        // The closed port gave back what its queues held: whatever is still
        // taken now is a leaked mbuf.
        let leaked = self.pool.in_use();
        if leaked != 0 {
            tracing::error!(
                "mbuf pool {}: {leaked} mbufs not returned after the port closed (leak)",
                self.pool.stats().name
            );
        }
    }
}
