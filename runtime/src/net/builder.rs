//! [`Builder`]: a [`NetConfig`] the way the command line reads, every
//! input checked when it is built.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use ustack::Config;
use ustack::node::App;
use ustack::shard::{ShardId, SteerRule};
use ustack::sim::{LinkConfig, SimLink};
use ustack::wire::{EthernetAddress, Ipv4Cidr};

use super::open::{RunApp, Spawn, open, publisher, start_metrics, with_node};
use super::{AppCounters, Backend, Error, NetConfig, ShardResult, run_sharded};
use crate::shared::Runtime;

/// Builds a [`NetConfig`] the way the command line reads:
///
/// ```
/// use std::net::Ipv4Addr;
/// use ustack_runtime::Builder;
///
/// let link = ustack::sim::SimLink::new(Default::default());
/// let cfg = Builder::new()
///     .sim(&link)
///     .ip(Ipv4Addr::new(10, 0, 0, 2), 24)
///     .gateway(Ipv4Addr::new(10, 0, 0, 1))
///     .build()
///     .unwrap();
/// assert_eq!(cfg.stack.ip.address(), Ipv4Addr::new(10, 0, 0, 2));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Builder {
    backend: Option<Backend>,
    ip: Option<Ipv4Cidr>,
    gateway: Option<Ipv4Addr>,
    mac: Option<EthernetAddress>,
    mtu: Option<usize>,
    core: Option<usize>,
    cores: Option<Vec<usize>>,
    backoff: bool,
    no_offloads: bool,
    software_tso: bool,
    no_gso: bool,
    telemetry: Option<PathBuf>,
    capture: Option<PathBuf>,
    impair: Option<LinkConfig>,
    seed: Option<u64>,
    tweaks: Vec<fn(&mut Config)>,
    rcvbuf_max: Option<usize>,
    app_counters: Option<AppCounters>,
    replica: Option<ustack::shard::ShardId>,
    accept_partial_checksum: bool,
    metrics_sources: Vec<crate::metrics::SharedSource>,
    metrics: Option<SocketAddr>,
    metrics_feed: Option<crate::metrics::Feed>,
}

impl Builder {
    /// An empty builder: a backend and an address must be given before
    /// [`build`](Self::build).
    pub fn new() -> Self {
        Self::default()
    }

    /// Run on this interface through libpcap.
    pub fn pcap(mut self, iface: impl Into<String>) -> Self {
        self.backend = Some(Backend::Pcap(iface.into()));
        self
    }

    /// Run on DPDK port 0 with these EAL arguments, e.g.
    /// `"--no-huge -m 256 --no-pci --vdev=net_af_packet0,iface=eth1"`.
    pub fn dpdk(mut self, eal_args: impl Into<String>) -> Self {
        self.backend = Some(Backend::Dpdk {
            eal_args: eal_args.into(),
            port: 0,
            mbufs: 8191,
        });
        self
    }

    /// With [`dpdk`](Self::dpdk): the port and the mbufs of its pool.
    pub fn dpdk_port(mut self, port: u16, mbufs: u32) -> Self {
        if let Some(Backend::Dpdk {
            port: p, mbufs: m, ..
        }) = &mut self.backend
        {
            *p = port;
            *m = mbufs;
        }
        self
    }

    /// Run on a port of this in-process simulated link.
    pub fn sim(mut self, link: &SimLink) -> Self {
        self.backend = Some(Backend::Sim(link.clone()));
        self
    }

    /// Our address and prefix length.
    pub fn ip(mut self, addr: Ipv4Addr, prefix_len: u8) -> Self {
        self.ip = Some(Ipv4Cidr::new(addr, prefix_len));
        self
    }

    /// Next hop for addresses outside the subnet.
    pub fn gateway(mut self, gw: Ipv4Addr) -> Self {
        self.gateway = Some(gw);
        self
    }

    /// Our MAC (default: 02:75:73 and the last three bytes of the address).
    pub fn mac(mut self, mac: [u8; 6]) -> Self {
        self.mac = Some(EthernetAddress(mac));
        self
    }

    /// IP MTU (default 1500).
    pub fn mtu(mut self, mtu: usize) -> Self {
        self.mtu = Some(mtu);
        self
    }

    /// Pin the poll loop to this CPU.
    pub fn core(mut self, core: usize) -> Self {
        self.core = Some(core);
        self
    }

    /// With DPDK: one poll loop per CPU, each with its own queue pair.
    pub fn cores(mut self, cores: &[usize]) -> Self {
        self.cores = Some(cores.to_vec());
        self
    }

    /// Keep the idle back-off on pinned cores instead of busy-polling.
    pub fn backoff(mut self, on: bool) -> Self {
        self.backoff = on;
        self
    }

    /// Use the port's offloads where it has them (the default; DPDK ports
    /// with TCP checksum offload), or compute everything in software.
    pub fn offloads(mut self, on: bool) -> Self {
        self.no_offloads = !on;
        self
    }

    /// DPDK: use TSO also on net_tap, whose driver segments in software in
    /// the loop's thread (off by default: dearer than the engine's own
    /// segments; other ports that offer TSO use it with the offloads).
    pub fn software_tso(mut self, on: bool) -> Self {
        self.software_tso = on;
        self
    }

    /// Cut TCP bursts into frames in software (GSO, the default: one
    /// transmit decision per up to 64 KiB on a port without TSO), or
    /// decide every frame on its own (`ustack::Config::gso_max` 0).
    pub fn gso(mut self, on: bool) -> Self {
        self.no_gso = !on;
        self
    }

    /// Publish telemetry on this Unix socket (for `utop`).
    pub fn telemetry(mut self, socket: impl Into<PathBuf>) -> Self {
        self.telemetry = Some(socket.into());
        self
    }

    /// Publish the program's own counters with the stack's, under `app` in
    /// each telemetry line (the LD_PRELOAD layer's refused calls, say).
    pub fn app_counters(mut self, read: AppCounters) -> Self {
        self.app_counters = Some(read);
        self
    }

    /// Add the program's own Prometheus metrics (a mesh's per-target
    /// probes, say) to what the metrics endpoint serves.
    pub fn metrics_source(
        mut self,
        source: std::sync::Arc<dyn crate::metrics::MetricsSource>,
    ) -> Self {
        self.metrics_sources
            .push(crate::metrics::SharedSource(source));
        self
    }

    /// Serve Prometheus metrics on `addr` (`GET /metrics`, text format
    /// 0.0.4), a TCP address of the kernel's network: the management side,
    /// not the port the stack runs on. What is served is the latest
    /// snapshot the loop published (every `stats_interval`), converted,
    /// plus every [`metrics_source`](Self::metrics_source); the endpoint
    /// never reaches into the loop. Port 0 picks a free port; the address
    /// is told on stderr (`ustack: metrics on http://ADDR/metrics`).
    pub fn metrics(mut self, addr: SocketAddr) -> Self {
        self.metrics = Some(addr);
        self
    }

    /// Use this feed between the loop and the metrics endpoint, so that
    /// configurations built more than once from the same flags (the
    /// loop's settings and the node's) share it; a fresh one otherwise.
    pub fn metrics_feed(mut self, feed: crate::metrics::Feed) -> Self {
        self.metrics_feed = Some(feed);
        self
    }

    /// Make this stack process `index` of `count` on one interface, each
    /// with its own capture (pcap) and the same address: every process sees
    /// every frame and handles the flows whose symmetric RSS hash names it,
    /// process 0 answers ARP (the others learn from it), and active opens
    /// pick local ports that hash back to their process. Pre-forked servers
    /// (nginx workers with `reuseport`) run this way, one stack per worker.
    pub fn replica(mut self, index: usize, count: usize) -> Self {
        self.replica = Some(ustack::shard::ShardId { index, count });
        self
    }

    /// pcap: take TCP/UDP frames whose checksum field holds only the
    /// pseudo-header sum (what a local sender with checksum offload hands
    /// over: veth, tap, a bridge) and finish their checksum, instead of
    /// dropping them as bad (off by default: such a frame's bytes are then
    /// not checked).
    pub fn accept_partial_checksum(mut self, on: bool) -> Self {
        self.accept_partial_checksum = on;
        self
    }

    /// Write every frame to this pcap file.
    pub fn capture(mut self, file: impl Into<PathBuf>) -> Self {
        self.capture = Some(file.into());
        self
    }

    /// Impair the port's frames both ways (a testing aid).
    pub fn impair(mut self, link: LinkConfig) -> Self {
        self.impair = Some(link);
        self
    }

    /// Largest receive buffer TCP autotuning may grow to.
    pub fn rcvbuf_max(mut self, bytes: usize) -> Self {
        self.rcvbuf_max = Some(bytes);
        self
    }

    /// Seed the ISN and SYN-cookie secret (tests that need the same
    /// sequence numbers twice). Without it the secret is random per stack.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Change any other engine setting before the stack starts.
    pub fn configure(mut self, tweak: fn(&mut Config)) -> Self {
        self.tweaks.push(tweak);
        self
    }

    /// The configuration, or why it is incomplete.
    pub fn build(self) -> Result<NetConfig, Error> {
        let backend = self.backend.ok_or(Error::Config(
            "choose a backend: pcap IFACE, dpdk \"EAL ARGS\" or sim".into(),
        ))?;
        let ip = self
            .ip
            .ok_or(Error::Config("an address is required (A.B.C.D/LEN)".into()))?;
        let o = ip.address().octets();
        let mac = self
            .mac
            .unwrap_or(EthernetAddress([0x02, 0x75, 0x73, o[1], o[2], o[3]]));
        if !mac.is_unicast() {
            return Err(Error::Config(format!("{mac} is not a unicast MAC")));
        }
        let mut stack = match self.seed {
            Some(seed) => Config::with_seed(mac, ip, seed),
            None => Config::new(mac, ip),
        };
        stack.gateway = self.gateway;
        if self.no_gso {
            stack.gso_max = 0;
        }
        if let Some(mtu) = self.mtu {
            if !(576..=9000).contains(&mtu) {
                return Err(Error::Config(format!("MTU {mtu} is not in 576..=9000")));
            }
            stack.mtu = mtu;
            stack.tcp.mss = mtu - 40;
        }
        if let Some(max) = self.rcvbuf_max {
            stack.tcp.recv_buffer_max = max;
        }
        for t in &self.tweaks {
            t(&mut stack);
        }
        if let Some(id) = self.replica {
            if id.count == 0 || id.index >= id.count {
                return Err(Error::Config(format!(
                    "replica {} of {}: the index must be below the count",
                    id.index, id.count
                )));
            }
            if self.cores.is_some() {
                return Err(Error::Config(
                    "a replica runs one core: --cores and replicas do not mix".into(),
                ));
            }
            stack.shard = id;
        }
        check_user_input(
            &backend,
            ip,
            self.gateway,
            self.core,
            self.cores.as_deref(),
            stack.mtu,
        )?;
        let dpdk = matches!(backend, Backend::Dpdk { .. });
        if self.cores.is_some() && !dpdk {
            return Err(Error::Config(
                "several cores need DPDK: each core owns one queue pair of a DPDK port".into(),
            ));
        }
        Ok(NetConfig {
            backend,
            stack,
            core: self.core,
            cores: self.cores,
            backoff: self.backoff,
            offloads: !self.no_offloads,
            software_tso: self.software_tso,
            telemetry: self.telemetry,
            capture: self.capture,
            impair: self.impair,
            app_counters: self.app_counters,
            replica: self.replica,
            accept_partial_checksum: self.accept_partial_checksum,
            metrics_sources: self.metrics_sources,
            metrics: self.metrics,
            metrics_feed: self.metrics_feed.unwrap_or_default(),
        })
    }

    /// Build, open the backend and run `app` in the poll loop on this
    /// thread until it exits or `stop` is set.
    pub fn run<A: App + ?Sized>(self, app: &mut A, stop: &AtomicBool) -> Result<(), Error> {
        let cfg = self.build()?;
        let publisher = publisher(&cfg)?;
        with_node(
            &cfg,
            RunApp {
                app,
                lcfg: cfg.loop_config(),
                stop,
                publisher: publisher.as_ref(),
                replica: cfg.replica,
            },
        )
    }
}

impl Builder {
    /// Build, open the backend and start the poll loop on its own thread;
    /// sockets are opened on the returned runtime's [`Net`](crate::Net)
    /// with the async ([`crate::aio`]) or blocking ([`crate::blocking`])
    /// front. Multi-core configurations are not supported here (use
    /// [`run_sharded`]).
    pub fn spawn(self) -> Result<Runtime<()>, Error> {
        self.spawn_with(())
    }

    /// [`spawn`](Self::spawn) with an in-loop `app` beside the fronts
    /// (returned by [`Runtime::stop`]).
    pub fn spawn_with<A: App + Send + 'static>(self, app: A) -> Result<Runtime<A>, Error> {
        let cfg = self.build()?;
        if cfg.cores.is_some() {
            return Err(Error::Config(
                "a spawned runtime runs one core: use run_sharded for several".into(),
            ));
        }
        let publisher = publisher(&cfg)?;
        let endpoint = start_metrics(&cfg)?;
        open(
            &cfg,
            Spawn {
                app,
                lcfg: cfg.loop_config(),
                publisher,
                endpoint,
                replica: cfg.replica,
            },
        )
    }
}

impl Builder {
    /// Build and run one poll loop per core of [`cores`](Self::cores) (DPDK),
    /// each with its own queue pair, stack and the app `make(shard)`,
    /// frames that `steer` names handled by the shard it says; until every
    /// app exits or `stop` is set. Telemetry, when configured, publishes the
    /// cores' totals and each core's figures. See [`run_sharded`].
    pub fn run_sharded<A, F>(
        self,
        steer: &[SteerRule],
        stop: &AtomicBool,
        make: F,
    ) -> Result<Vec<ShardResult<A>>, Error>
    where
        A: App + Send,
        F: Fn(ShardId) -> A + Sync,
    {
        let cfg = self.build()?;
        let publisher = publisher(&cfg)?;
        run_sharded(&cfg, steer, None, stop, publisher.as_ref(), make)
    }
}

/// The checks on what a user gave that can be made before anything is
/// opened or printed: a gateway on our subnet, CPUs that exist, and an IP
/// MTU the interface can carry (from sysfs, so the user reads why rather
/// than libpcap's "Message too long" on the first large frame).
fn check_user_input(
    backend: &Backend,
    ip: Ipv4Cidr,
    gateway: Option<Ipv4Addr>,
    core: Option<usize>,
    cores: Option<&[usize]>,
    mtu: usize,
) -> Result<(), Error> {
    if let Some(gw) = gateway {
        if !ip.contains_addr(&gw) || gw == ip.address() {
            return Err(Error::Config(format!(
                "gateway {gw} is not another address on our subnet {}: --gw must be reachable directly",
                ip.network()
            )));
        }
    }
    let wanted: Vec<usize> = core
        .into_iter()
        .chain(cores.unwrap_or_default().iter().copied())
        .collect();
    if !wanted.is_empty() {
        let mut have: Vec<usize> = core_affinity::get_core_ids()
            .unwrap_or_default()
            .iter()
            .map(|c| c.id)
            .collect();
        have.sort_unstable();
        if let Some(bad) = wanted.iter().find(|c| !have.contains(c)) {
            let list = have
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",");
            return Err(Error::Config(format!(
                "no CPU {bad} to run on: this process may use CPUs {list}"
            )));
        }
    }
    if let Backend::Pcap(iface) = backend {
        let path = format!("/sys/class/net/{iface}/mtu");
        if let Some(link_mtu) = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
        {
            if mtu > link_mtu {
                return Err(Error::Config(format!(
                    "--mtu {mtu} is above the MTU of {iface} ({link_mtu}): pass --mtu {link_mtu} or less, or raise the interface's (ip link set {iface} mtu {mtu})"
                )));
            }
        }
    }
    Ok(())
}
