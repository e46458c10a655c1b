//! ustack's [`Device`] over one DPDK port queue pair and its mbuf pool.

use std::mem::ManuallyDrop;

use ustack::Instant;
use ustack::phy::device::{Device, DeviceCaps, PortStats};
use ustack::phy::pool::{PacketBuf, Pool, PoolStats};

use crate::port::{Port, PortConfig, PortQueue};
use crate::{DpdkError, Eal, Mbuf, MbufPool};

/// Mbufs of 64 KiB per queue for TSO segments (about 16 MiB): the port
/// frees each once it has cut and sent it, and a dry pool only defers a
/// segment (the engine sends it again).
const TSO_MBUFS: u32 = 255;

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
    /// Use the port's TCP checksum offloads and TSO where it has them.
    pub offloads: bool,
    /// Use TSO also on net_tap, which segments in software in the loop's
    /// thread (see [`PortConfig::software_tso`]).
    pub software_tso: bool,
}

impl DpdkPortConfig {
    pub fn new(port: u16) -> Self {
        DpdkPortConfig {
            port,
            mbufs: 8191,
            mtu: 1500,
            promiscuous: true,
            link_wait: std::time::Duration::from_secs(2),
            offloads: true,
            software_tso: false,
        }
    }
}

/// One queue pair of a DPDK port as a ustack device, with its own mbuf
/// pool (receive and transmit). A port opened with one queue is one
/// `DpdkPort`; with N queues ([`DpdkPort::open_queues`]) each shard's thread
/// owns one.
///
/// Zero copy both ways: received frames are the mbufs the driver filled,
/// and the engine writes outgoing frames into mbufs from the pool, which
/// `tx_burst` hands to the driver.
#[derive(Debug)]
pub struct DpdkPort {
    /// Taken in `drop`: the last queue closes the port while the pools are
    /// still alive.
    queue: ManuallyDrop<PortQueue>,
    pool: MbufPool,
    /// Mbufs of 64 KiB for TSO segments, where the port has TSO.
    tso_pool: Option<MbufPool>,
    /// The longest frame a TSO segment may be cut into (net_tap).
    tso_frame_max: Option<u16>,
    /// Every queue's pools, for the leak check when the port closes.
    all_pools: Vec<MbufPool>,
    mtu: usize,
    /// The offloads in use (from the port's capabilities).
    offloads: ustack::Offloads,
    /// Frames the tx ring refused.
    tx_refused: u64,
    /// Chained (multi-segment) frames received, dropped: the engine reads
    /// one contiguous frame.
    rx_chained: u64,
    /// Our own count of what crossed this queue: some drivers reset theirs
    /// (memif does when its peer reconnects), and port counters are for
    /// all queues.
    sw: PortStats,
}

impl DpdkPort {
    /// Create the pool, configure and start the port with one queue pair.
    pub fn open(eal: &Eal, cfg: &DpdkPortConfig) -> Result<Self, DpdkError> {
        let mut ports = DpdkPort::open_queues(eal, cfg, 1)?;
        ports.pop().ok_or(DpdkError::Port {
            port: cfg.port,
            what: "configure",
            reason: "no queue".into(),
        })
    }

    /// Configure and start the port with `queues` rx/tx queue pairs (symmetric
    /// RSS where the port hashes), each with a pool of `cfg.mbufs` mbufs;
    /// one device per queue, queue 0 first.
    pub fn open_queues(
        eal: &Eal,
        cfg: &DpdkPortConfig,
        queues: u16,
    ) -> Result<Vec<Self>, DpdkError> {
        let queues = queues.max(1);
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
        let pools = (0..queues)
            .map(|q| {
                let name = match q {
                    0 => format!("ustack-p{}", cfg.port),
                    _ => format!("ustack-p{}-q{q}", cfg.port),
                };
                MbufPool::new(eal, &name, cfg.mbufs, room as u16, None)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let pcfg = PortConfig {
            rx_queues: queues,
            tx_queues: queues,
            rx_desc: desc,
            tx_desc: desc,
            mtu: Some(cfg.mtu.min(usize::from(u16::MAX)) as u16),
            promiscuous: cfg.promiscuous,
            offloads: cfg.offloads,
            rx_interrupts: true,
            software_tso: cfg.software_tso,
        };
        let port = Port::open(eal, cfg.port, &pcfg, &pools)?;
        let info = port.info();
        // TSO segments are built whole in mbufs of a second, small pool per
        // queue with the largest data room an mbuf has (64 KiB).
        let tso_pools = if info.tso_on {
            (0..queues)
                .map(|q| {
                    let name = match q {
                        0 => format!("ustack-p{}-tso", cfg.port),
                        _ => format!("ustack-p{}-q{q}-tso", cfg.port),
                    };
                    MbufPool::new(eal, &name, TSO_MBUFS, u16::MAX, None).map(Some)
                })
                .collect::<Result<Vec<_>, _>>()?
        } else {
            vec![None; usize::from(queues)]
        };
        let tso_max = tso_pools.first().and_then(|p| p.as_ref()).map_or(0, |p| {
            p.data_room().saturating_sub(14).min(usize::from(u16::MAX))
        });
        let offloads = ustack::Offloads {
            tx_tcp_checksum: info.tx_tcp_checksum_on,
            rx_checksum: info.rx_tcp_checksum_on,
            tso_max,
            rx_large: false,
        };
        // net_tap refuses a TSO frame whose segments, Ethernet header
        // included, exceed the MTU (it counts the 14 bytes an MTU leaves
        // out): its segments are cut 14 bytes shorter.
        let tso_frame_max = (tso_max > 0 && info.driver == "net_tap")
            .then(|| u16::try_from(cfg.mtu).unwrap_or(u16::MAX));

        let deadline = std::time::Instant::now() + cfg.link_wait;
        while port.link().is_some_and(|l| !l.up) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        tracing::debug!(
            "DPDK port {} ({}, driver {}): {queues} queue(s), RSS {}, {} mbufs each, {desc} descriptors",
            cfg.port,
            port.info().name,
            port.info().driver,
            port.info().rss,
            cfg.mbufs
        );
        tracing::debug!("DPDK port {} offloads: {offloads:?}", cfg.port);
        let all_pools: Vec<MbufPool> = pools
            .iter()
            .cloned()
            .chain(tso_pools.iter().flatten().cloned())
            .collect();
        Ok(port
            .into_queues()
            .into_iter()
            .zip(pools.iter().cloned())
            .zip(tso_pools)
            .map(|((queue, pool), tso_pool)| DpdkPort {
                queue: ManuallyDrop::new(queue),
                pool,
                tso_pool,
                tso_frame_max,
                all_pools: all_pools.clone(),
                mtu: cfg.mtu,
                offloads,
                tx_refused: 0,
                rx_chained: 0,
                sw: PortStats::default(),
            })
            .collect())
    }

    pub fn port(&self) -> &Port {
        self.queue.port()
    }

    /// This device's queue on the port.
    pub fn queue(&self) -> u16 {
        self.queue.queue()
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
            offloads: self.offloads,
            rx_timestamps: false,
        }
    }

    fn rx_burst(&mut self, _: Instant, out: &mut Vec<Mbuf>, max: usize) -> usize {
        let start = out.len();
        let n = self.queue.rx_burst(out, max);
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
        if let Some(max) = self.tso_frame_max {
            for m in pkts.iter_mut() {
                m.clamp_tso_frame(max);
            }
        }
        let bytes: u64 = pkts.iter().map(|m| m.len() as u64).sum();
        let n = self.queue.tx_burst(pkts);
        let refused: u64 = pkts.iter().map(|m| m.len() as u64).sum();
        self.sw.tx_packets += n as u64;
        self.sw.tx_bytes += bytes - refused;
        self.tx_refused += pkts.len() as u64;
        n
    }

    fn alloc_tx(&mut self) -> Option<Mbuf> {
        self.pool.alloc()
    }

    fn alloc_tx_len(&mut self, len: usize) -> Option<Mbuf> {
        match &self.tso_pool {
            Some(tso) if len > self.pool.data_room() => tso.alloc(),
            _ => self.pool.alloc(),
        }
    }

    fn wait_rx(&mut self, timeout: std::time::Duration) -> bool {
        self.queue.wait_rx(timeout)
    }

    fn port_stats(&self) -> PortStats {
        let mut stats = PortStats {
            rx_missed: self.rx_chained,
            tx_errors: self.tx_refused,
            ..self.sw.clone()
        };
        let q = &self.queue;
        let s = q.port().stats();
        if q.port().info().rx_queues <= 1 {
            // The driver's counters, unless it reset them below ours.
            stats.rx_packets = s.ipackets.max(stats.rx_packets);
            stats.rx_bytes = s.ibytes.max(stats.rx_bytes);
            stats.tx_packets = s.opackets.max(stats.tx_packets);
            stats.tx_bytes = s.obytes.max(stats.tx_bytes);
        }
        // Port-wide drops are reported once, by queue 0.
        if q.queue() == 0 {
            stats.rx_missed += s.imissed + s.ierrors;
            stats.rx_nombuf = s.rx_nombuf;
            stats.tx_errors += s.oerrors;
        }
        stats
    }

    fn pool_stats(&self, out: &mut Vec<PoolStats>) {
        let mut s = self.pool.stats();
        // The driver's receive allocations that failed (port-wide: queue 0).
        if self.queue.queue() == 0 {
            s.alloc_failures += self.queue.port().stats().rx_nombuf;
        }
        out.push(s);
        if let Some(tso) = &self.tso_pool {
            out.push(tso.stats());
        }
    }
}

impl Drop for DpdkPort {
    fn drop(&mut self) {
        // The last queue's handle closes the port (its queues give back
        // the mbufs they held); whatever is still taken then is a leak.
        // SAFETY: `queue` is taken exactly once, here, and never used after.
        let queue = unsafe { ManuallyDrop::take(&mut self.queue) };
        let Some(port) = queue.into_port() else {
            return;
        };
        drop(port);
        for pool in &self.all_pools {
            let leaked = pool.in_use();
            if leaked != 0 {
                tracing::error!(
                    "mbuf pool {}: {leaked} mbufs not returned after the port closed (leak)",
                    pool.stats().name
                );
            }
        }
    }
}
