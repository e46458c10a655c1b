//! An ethdev port: configuration, queues, bursts, link and counters.

use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::Arc;

use dpdk_sys::offload::*;
use dpdk_sys::{rte_eth_conf, rte_eth_dev_info, rte_mbuf};

use crate::{DpdkError, Eal, Mbuf, MbufPool, strerror};

/// Largest burst handed to the driver in one call.
pub const MAX_BURST: usize = 64;

/// How to set a port up.
#[derive(Debug, Clone)]
pub struct PortConfig {
    /// Receive queues (one mbuf pool each) and transmit queues.
    pub rx_queues: u16,
    pub tx_queues: u16,
    /// Descriptors per queue (adjusted to the driver's limits).
    pub rx_desc: u16,
    pub tx_desc: u16,
    /// IP MTU to set, if different from the port's current one.
    pub mtu: Option<u16>,
    /// Receive every frame (the stack filters by its own MAC).
    pub promiscuous: bool,
    /// Turn on the TCP checksum offloads (transmit and receive) where the
    /// port has them.
    pub offloads: bool,
    /// Let an idle loop sleep until frames come, where the driver's
    /// receive interrupt is a descriptor readable while frames wait
    /// (net_tap: the tap's own descriptor). See [`PortQueue::wait_rx`].
    pub rx_interrupts: bool,
    /// Turn on TCP segmentation offload also where the driver segments in
    /// software in the transmitting thread (net_tap: `rte_gso` and a
    /// checksum pass per segment, dearer than the engine's own segments,
    /// whose checksum is summed while copying). Other ports that offer
    /// TSO get it with `offloads`.
    pub software_tso: bool,
}

impl Default for PortConfig {
    fn default() -> Self {
        PortConfig {
            rx_queues: 1,
            tx_queues: 1,
            rx_desc: 1024,
            tx_desc: 1024,
            mtu: None,
            promiscuous: true,
            offloads: true,
            rx_interrupts: true,
            software_tso: false,
        }
    }
}

/// What the driver says about the port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    pub name: String,
    pub driver: String,
    pub mac: [u8; 6],
    pub mtu: u16,
    pub max_rx_queues: u16,
    pub max_tx_queues: u16,
    /// The port can compute IPv4/TCP/UDP checksums on transmit.
    pub tx_checksum: bool,
    /// The port validates IPv4/TCP/UDP checksums on receive.
    pub rx_checksum: bool,
    /// On, of the offloads the stack uses: TCP checksum on transmit.
    pub tx_tcp_checksum_on: bool,
    /// On: TCP checksum verified on receive (flags in each mbuf).
    pub rx_tcp_checksum_on: bool,
    /// On: TCP segmentation offload (with the transmit checksums).
    pub tso_on: bool,
    pub promiscuous: bool,
    /// Receive queues configured.
    pub rx_queues: u16,
    /// The port spreads flows over its rx queues with our symmetric RSS key.
    pub rss: bool,
}

/// Link state (`rte_eth_link_get_nowait`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkStatus {
    pub up: bool,
    pub speed_mbps: u32,
    pub full_duplex: bool,
}

/// The basic counters of `rte_eth_stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EthStats {
    pub ipackets: u64,
    pub opackets: u64,
    pub ibytes: u64,
    pub obytes: u64,
    /// Dropped by the hardware/driver because the rx queue was full.
    pub imissed: u64,
    pub ierrors: u64,
    pub oerrors: u64,
    /// Receive allocation failures (no mbuf).
    pub rx_nombuf: u64,
}

/// One rx/tx queue pair of a started port, owned by one thread (the
/// shard of that queue). Not `Clone`: exactly one owner per queue.
#[derive(Debug)]
pub struct PortQueue {
    port: Arc<Port>,
    queue: u16,
}

impl PortQueue {
    /// Block for at most `timeout` until frames may wait on this queue,
    /// on the driver's receive-interrupt descriptor; `false`, at once,
    /// when the port has none (the caller sleeps or polls instead).
    pub fn wait_rx(&self, timeout: std::time::Duration) -> bool {
        let Some(fd) = self
            .port
            .rx_intr_fds
            .get(usize::from(self.queue))
            .copied()
            .flatten()
        else {
            return false;
        };
        let id = self.port.id;
        // SAFETY: valid started port; the queue exists (it has an fd).
        unsafe { dpdk_sys::rte_eth_dev_rx_intr_enable(id, self.queue) };
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd; the descriptor belongs to the driver and
        // stays open while the port is (we hold it through `self.port`).
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        // SAFETY: as above.
        unsafe { dpdk_sys::rte_eth_dev_rx_intr_disable(id, self.queue) };
        rc >= 0 && pfd.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) == 0
    }

    pub fn queue(&self) -> u16 {
        self.queue
    }

    pub fn port(&self) -> &Port {
        &self.port
    }

    /// Receive up to `max` frames from this queue.
    pub fn rx_burst(&mut self, out: &mut Vec<Mbuf>, max: usize) -> usize {
        self.port.rx_burst_on(self.queue, out, max)
    }

    /// Transmit from the front of `pkts` on this queue (see [`Port::tx_burst`]).
    pub fn tx_burst(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        self.port.tx_burst_on(self.queue, pkts)
    }

    /// Give up this queue: the port itself when this was its last queue
    /// handle (dropping it stops and closes the port), else `None`.
    pub fn into_port(self) -> Option<Port> {
        Arc::into_inner(self.port)
    }
}

/// A started ethdev port; stopped and closed on drop.
#[derive(Debug)]
pub struct Port {
    id: u16,
    tx_queues: u16,
    info: PortInfo,
    /// One pool per rx queue; the driver may hold their mbufs until close.
    _rx_pools: Vec<MbufPool>,
    /// The RSS key the port was configured with (drivers read it at start).
    _rss_key: Box<[u8; 40]>,
    /// Per rx queue: the driver's receive-interrupt descriptor, readable
    /// while frames wait (net_tap only; see [`PortConfig::rx_interrupts`]).
    rx_intr_fds: Vec<Option<i32>>,
    _eal: Eal,
}

fn check(port: u16, what: &'static str, rc: i32) -> Result<(), DpdkError> {
    if rc < 0 {
        Err(DpdkError::Port {
            port,
            what,
            reason: strerror(rc),
        })
    } else {
        Ok(())
    }
}

impl Port {
    /// Configure and start port `id` with `rx_pools[q]` feeding rx queue `q`.
    pub fn open(
        eal: &Eal,
        id: u16,
        cfg: &PortConfig,
        rx_pools: &[MbufPool],
    ) -> Result<Port, DpdkError> {
        // SAFETY: the EAL is initialised (we hold `eal`).
        if unsafe { dpdk_sys::rte_eth_dev_is_valid_port(id) } == 0 {
            return Err(DpdkError::NoSuchPort {
                port: id,
                available: eal.port_count(),
            });
        }
        if rx_pools.len() != usize::from(cfg.rx_queues) || cfg.rx_queues == 0 || cfg.tx_queues == 0
        {
            return Err(DpdkError::Port {
                port: id,
                what: "configure",
                reason: format!(
                    "{} rx queues need as many pools (got {}), and at least one tx queue",
                    cfg.rx_queues,
                    rx_pools.len()
                ),
            });
        }
        let mut dev = rte_eth_dev_info::default();
        // SAFETY: `id` is a valid port; `dev` is a writable dev_info.
        check(id, "dev_info_get", unsafe {
            dpdk_sys::rte_eth_dev_info_get(id, &mut dev)
        })?;
        if cfg.rx_queues > dev.max_rx_queues || cfg.tx_queues > dev.max_tx_queues {
            return Err(DpdkError::Port {
                port: id,
                what: "configure",
                reason: format!(
                    "{}/{} rx/tx queues asked, the port has at most {}/{}",
                    cfg.rx_queues, cfg.tx_queues, dev.max_rx_queues, dev.max_tx_queues
                ),
            });
        }
        let driver = if dev.driver_name.is_null() {
            String::new()
        } else {
            // SAFETY: the driver name is a static NUL-terminated string.
            unsafe { CStr::from_ptr(dev.driver_name) }
                .to_string_lossy()
                .into_owned()
        };
        let mut conf = rte_eth_conf::default();
        // Receive interrupts where the driver's descriptor is readable
        // exactly while frames wait: net_tap's is the tap itself. (Drivers
        // that signal through an eventfd would need it drained, and memif
        // has none reachable through ethdev in this DPDK.)
        let rx_intr = cfg.rx_interrupts && driver == "net_tap";
        if rx_intr {
            conf.intr_conf.set_rxq(1);
        }
        let want = |capa: u64, bits: u64| {
            if cfg.offloads && capa & bits == bits {
                bits
            } else {
                0
            }
        };
        let tx_csum = want(
            dev.tx_offload_capa,
            RTE_ETH_TX_OFFLOAD_IPV4_CKSUM | RTE_ETH_TX_OFFLOAD_TCP_CKSUM,
        );
        let rx_csum = want(
            dev.rx_offload_capa,
            RTE_ETH_RX_OFFLOAD_IPV4_CKSUM | RTE_ETH_RX_OFFLOAD_TCP_CKSUM,
        );
        // TSO only with the checksums it implies, and on net_tap only when
        // asked (see `PortConfig::software_tso`).
        let tso = if tx_csum != 0 && (driver != "net_tap" || cfg.software_tso) {
            want(dev.tx_offload_capa, RTE_ETH_TX_OFFLOAD_TCP_TSO)
        } else {
            0
        };
        conf.rxmode.offloads = rx_csum;
        // Every transmitted mbuf comes from our pools with refcount 1.
        conf.txmode.offloads =
            tx_csum | tso | (dev.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MBUF_FAST_FREE);
        // Several rx queues: symmetric RSS where the port hashes (both
        // directions of a flow on one queue; see `ustack::rss`). Ports that
        // do not (memif pairs queues with its peer's, af_packet fans out by
        // the kernel's symmetric flow hash) keep their own distribution.
        let mut rss_key = Box::new(ustack::shard::rss::SYMMETRIC_KEY);
        let rss_hf = dev.flow_type_rss_offloads
            & (RTE_ETH_RSS_IPV4
                | RTE_ETH_RSS_FRAG_IPV4
                | RTE_ETH_RSS_NONFRAG_IPV4_TCP
                | RTE_ETH_RSS_NONFRAG_IPV4_OTHER);
        let rss = cfg.rx_queues > 1 && rss_hf != 0;
        if rss {
            conf.rxmode.mq_mode = dpdk_sys::RTE_ETH_MQ_RX_RSS;
            let rss_conf = &mut conf.rx_adv_conf.rss_conf;
            rss_conf.rss_hf = rss_hf;
            // A port with another key size keeps its own (flows may then
            // not hash back to the core that opened them).
            if matches!(dev.hash_key_size, 0 | 40) {
                rss_conf.rss_key = rss_key.as_mut_ptr();
                rss_conf.rss_key_len = 40;
            }
        }
        // SAFETY: `id` is valid, `conf` is a fully initialised configuration.
        check(id, "configure", unsafe {
            dpdk_sys::rte_eth_dev_configure(id, cfg.rx_queues, cfg.tx_queues, &conf)
        })?;
        let (mut nrx, mut ntx) = (cfg.rx_desc, cfg.tx_desc);
        // SAFETY: valid port, two writable u16s.
        check(id, "adjust descriptors", unsafe {
            dpdk_sys::rte_eth_dev_adjust_nb_rx_tx_desc(id, &mut nrx, &mut ntx)
        })?;
        // SAFETY: valid port.
        let socket = unsafe { dpdk_sys::rte_eth_dev_socket_id(id) };
        let socket = if socket < 0 {
            dpdk_sys::SOCKET_ID_ANY
        } else {
            socket
        } as u32;
        for (q, pool) in rx_pools.iter().enumerate() {
            // SAFETY: valid configured port and queue; NULL rx_conf means the
            // driver's defaults; the pool outlives the port (kept in `Port`).
            check(id, "rx queue setup", unsafe {
                dpdk_sys::rte_eth_rx_queue_setup(
                    id,
                    q as u16,
                    nrx,
                    socket,
                    std::ptr::null(),
                    pool.raw(),
                )
            })?;
        }
        let mut txconf = dev.default_txconf;
        txconf.offloads = conf.txmode.offloads;
        for q in 0..cfg.tx_queues {
            // SAFETY: valid configured port and queue; `txconf` is initialised.
            check(id, "tx queue setup", unsafe {
                dpdk_sys::rte_eth_tx_queue_setup(id, q, ntx, socket, &txconf)
            })?;
        }
        let mut mtu = 0u16;
        // SAFETY: valid port, writable u16.
        let _ = unsafe { dpdk_sys::rte_eth_dev_get_mtu(id, &mut mtu) };
        if let Some(want) = cfg.mtu.filter(|&m| m != mtu) {
            // SAFETY: valid configured port.
            let rc = unsafe { dpdk_sys::rte_eth_dev_set_mtu(id, want) };
            if rc < 0 && mtu < want {
                return Err(DpdkError::Port {
                    port: id,
                    what: "set MTU",
                    reason: format!(
                        "port MTU is {mtu}, cannot raise it to {want}: {}",
                        strerror(rc)
                    ),
                });
            }
            if rc == 0 {
                mtu = want;
            }
        }
        // SAFETY: valid, configured port with all queues set up.
        check(id, "start", unsafe { dpdk_sys::rte_eth_dev_start(id) })?;
        let rx_intr_fds = (0..cfg.rx_queues)
            .map(|q| {
                if !rx_intr {
                    return None;
                }
                // SAFETY: valid started port and queue.
                let fd = unsafe { dpdk_sys::rte_eth_dev_rx_intr_ctl_q_get_fd(id, q) };
                (fd >= 0).then_some(fd)
            })
            .collect();
        // From here on the port is started; dropping `port` stops it.
        let mut port = Port {
            id,
            tx_queues: cfg.tx_queues,
            info: PortInfo {
                name: String::new(),
                driver: String::new(),
                mac: [0; 6],
                mtu,
                max_rx_queues: dev.max_rx_queues,
                max_tx_queues: dev.max_tx_queues,
                tx_checksum: dev.tx_offload_capa
                    & (RTE_ETH_TX_OFFLOAD_IPV4_CKSUM
                        | RTE_ETH_TX_OFFLOAD_TCP_CKSUM
                        | RTE_ETH_TX_OFFLOAD_UDP_CKSUM)
                    != 0,
                rx_checksum: dev.rx_offload_capa
                    & (RTE_ETH_RX_OFFLOAD_IPV4_CKSUM
                        | RTE_ETH_RX_OFFLOAD_TCP_CKSUM
                        | RTE_ETH_RX_OFFLOAD_UDP_CKSUM)
                    != 0,
                tx_tcp_checksum_on: tx_csum != 0,
                rx_tcp_checksum_on: rx_csum != 0,
                tso_on: tso != 0,
                promiscuous: false,
                rx_queues: cfg.rx_queues,
                rss,
            },
            _rx_pools: rx_pools.to_vec(),
            _rss_key: rss_key,
            rx_intr_fds,
            _eal: eal.clone(),
        };
        port.info.driver = driver;
        let mut name = [0 as std::ffi::c_char; dpdk_sys::RTE_ETH_NAME_MAX_LEN as usize];
        // SAFETY: valid port; the buffer has RTE_ETH_NAME_MAX_LEN bytes as required.
        if unsafe { dpdk_sys::rte_eth_dev_get_name_by_port(id, name.as_mut_ptr()) } == 0 {
            // SAFETY: DPDK wrote a NUL-terminated name into `name`.
            port.info.name = unsafe { CStr::from_ptr(name.as_ptr()) }
                .to_string_lossy()
                .into_owned();
        }
        // SAFETY: valid port, a 6-byte writable buffer.
        let _ = unsafe { dpdk_sys::ustack_macaddr_get(id, port.info.mac.as_mut_ptr()) };
        if cfg.promiscuous {
            // SAFETY: valid started port.
            let rc = unsafe { dpdk_sys::rte_eth_promiscuous_enable(id) };
            if rc < 0 {
                tracing::debug!("port {id}: promiscuous mode: {}", strerror(rc));
            }
            // SAFETY: valid port.
            port.info.promiscuous = unsafe { dpdk_sys::rte_eth_promiscuous_get(id) } == 1;
        }
        Ok(port)
    }

    pub fn id(&self) -> u16 {
        self.id
    }

    pub fn info(&self) -> &PortInfo {
        &self.info
    }

    pub fn link(&self) -> Option<LinkStatus> {
        let (mut speed, mut up, mut fd) = (0u32, 0i32, 0i32);
        // SAFETY: valid port, three writable integers.
        let rc = unsafe { dpdk_sys::ustack_link_get(self.id, &mut speed, &mut up, &mut fd) };
        (rc == 0).then_some(LinkStatus {
            up: up != 0,
            speed_mbps: speed,
            full_duplex: fd != 0,
        })
    }

    /// Receive up to `max` frames from queue `queue` into `out`; returns how many.
    pub fn rx_burst(&mut self, queue: u16, out: &mut Vec<Mbuf>, max: usize) -> usize {
        self.rx_burst_on(queue, out, max)
    }

    /// Split the port into its queue pairs (rx queue `q` with tx queue
    /// `q`), each to be owned by one thread. The port closes when the last
    /// pair drops.
    pub fn into_queues(self) -> Vec<PortQueue> {
        let n = self.info.rx_queues.min(self.tx_queues);
        let port = Arc::new(self);
        (0..n)
            .map(|queue| PortQueue {
                port: port.clone(),
                queue,
            })
            .collect()
    }

    /// Callers hold exclusive use of `queue` (`&mut Port`, or the one
    /// [`PortQueue`] for it): DPDK's burst functions are not thread-safe
    /// per queue.
    fn rx_burst_on(&self, queue: u16, out: &mut Vec<Mbuf>, max: usize) -> usize {
        let Some(pool) = self._rx_pools.get(usize::from(queue)) else {
            return 0;
        };
        let mut raw = [std::ptr::null_mut::<rte_mbuf>(); MAX_BURST];
        let want = max.min(MAX_BURST) as u16;
        // SAFETY: valid started port and queue (it has a pool, so it exists);
        // `raw` has room for `want` pointers. The driver transfers ownership
        // of the `n` mbufs it writes.
        let n = unsafe { dpdk_sys::ustack_rx_burst(self.id, queue, raw.as_mut_ptr(), want) };
        out.reserve(usize::from(n));
        for &m in &raw[..usize::from(n)] {
            if let Some(m) = NonNull::new(m) {
                // SAFETY: the driver just handed this mbuf to us.
                out.push(unsafe { pool.adopt(m) });
            }
        }
        usize::from(n)
    }

    /// Transmit from the front of `pkts` on queue `queue`, removing what the
    /// driver took (it owns those now). Frames left were refused (ring full).
    pub fn tx_burst(&mut self, queue: u16, pkts: &mut Vec<Mbuf>) -> usize {
        self.tx_burst_on(queue, pkts)
    }

    /// As [`Port::rx_burst_on`]: the caller holds exclusive use of `queue`.
    fn tx_burst_on(&self, queue: u16, pkts: &mut Vec<Mbuf>) -> usize {
        let mut sent = 0;
        if queue >= self.tx_queues {
            return 0;
        }
        while !pkts.is_empty() {
            let n = pkts.len().min(MAX_BURST);
            let mut raw = [std::ptr::null_mut::<rte_mbuf>(); MAX_BURST];
            for (r, m) in raw.iter_mut().zip(&pkts[..n]) {
                *r = m.as_raw();
            }
            // SAFETY: valid started port and queue (checked above); `raw[..n]` are valid
            // single-segment mbufs we own. The driver takes ownership of the
            // first `k` it returns; the rest stay ours.
            let k = usize::from(unsafe {
                dpdk_sys::ustack_tx_burst(self.id, queue, raw.as_mut_ptr(), n as u16)
            });
            for m in pkts.drain(..k) {
                // Owned by the driver now: release without freeing.
                let _ = m.into_raw();
            }
            sent += k;
            if k < n {
                break;
            }
        }
        sent
    }

    pub fn stats(&self) -> EthStats {
        let mut s = dpdk_sys::rte_eth_stats::default();
        // SAFETY: valid port, writable stats struct.
        if unsafe { dpdk_sys::rte_eth_stats_get(self.id, &mut s) } != 0 {
            return EthStats::default();
        }
        EthStats {
            ipackets: s.ipackets,
            opackets: s.opackets,
            ibytes: s.ibytes,
            obytes: s.obytes,
            imissed: s.imissed,
            ierrors: s.ierrors,
            oerrors: s.oerrors,
            rx_nombuf: s.rx_nombuf,
        }
    }

    /// Every extended counter the driver offers, by name.
    pub fn xstats(&self) -> Vec<(String, u64)> {
        // SAFETY: valid port; a NULL array with size 0 asks for the count.
        let n = unsafe { dpdk_sys::rte_eth_xstats_get_names(self.id, std::ptr::null_mut(), 0) };
        if n <= 0 {
            return Vec::new();
        }
        let mut names = vec![dpdk_sys::rte_eth_xstat_name::default(); n as usize];
        let mut vals = vec![dpdk_sys::rte_eth_xstat::default(); n as usize];
        // SAFETY: both arrays have `n` entries, as passed.
        let got_names =
            unsafe { dpdk_sys::rte_eth_xstats_get_names(self.id, names.as_mut_ptr(), n as u32) };
        // SAFETY: as above.
        let got = unsafe { dpdk_sys::rte_eth_xstats_get(self.id, vals.as_mut_ptr(), n as u32) };
        if got_names != n || got != n {
            return Vec::new();
        }
        vals.iter()
            .filter_map(|v| {
                let name = names.get(v.id as usize)?;
                // SAFETY: DPDK NUL-terminates every xstat name in its array.
                let s = unsafe { CStr::from_ptr(name.name.as_ptr()) };
                Some((s.to_string_lossy().into_owned(), v.value))
            })
            .collect()
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        // SAFETY: the port was started by `open`; stop then close once.
        // The rx pools are still alive (fields drop after this body).
        unsafe {
            let rc = dpdk_sys::rte_eth_dev_stop(self.id);
            if rc < 0 {
                tracing::warn!("port {}: stop: {}", self.id, strerror(rc));
            }
            let rc = dpdk_sys::rte_eth_dev_close(self.id);
            if rc < 0 {
                tracing::warn!("port {}: close: {}", self.id, strerror(rc));
            }
        }
    }
}
