//! A stack on a network port, from a typed configuration: which backend,
//! addressing, cores, telemetry and capture ([`NetConfig`], made by
//! [`Builder`]), opening the backend, and the multi-core launcher (one
//! stack per queue pair, steering and pass-on between them).
//!
//! Apps are generic over the device: [`with_node`] opens what the
//! configuration names and hands a concrete [`Node`] to a [`NodeUser`], so
//! nothing is boxed on the data path.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ustack::device::Device;
use ustack::impair::Impaired;
use ustack::node::{App, Node, Port, Snapshot};
use ustack::shard::{Shard, ShardId, Steer, SteerRule};
use ustack::sim::{LinkConfig, SimLink};
use ustack::wire::{EthernetAddress, Ipv4Cidr};
use ustack::{Config, Stack};

use crate::clock::Clock;
use crate::poll::{IdleMode, LoopConfig, RunError};
use crate::shared::Runtime;
pub use crate::telemetry::AppCounters;
use crate::telemetry::{Publisher, TelemetryError};

/// Why a stack could not be started or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is missing or contradicts another.
    #[error("{0}")]
    Config(String),
    /// This build lacks the backend the configuration names.
    #[error("{0}")]
    Unsupported(&'static str),
    /// The poll loop could not pin its core, or the device failed while
    /// running (an interface gone or down).
    #[error(transparent)]
    Run(#[from] RunError),
    /// The telemetry socket could not be set up.
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    /// The metrics endpoint could not listen (`--metrics`).
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    /// The pcap port or capture file could not be opened.
    #[cfg(feature = "pcap")]
    #[error(transparent)]
    Pcap(#[from] crate::backend::pcap::PcapError),
    /// The DPDK EAL or port could not be set up.
    #[cfg(feature = "dpdk")]
    #[error(transparent)]
    Dpdk(#[from] ustack_dpdk::DpdkError),
    /// The OS refused a poll-loop thread.
    #[error("cannot start a poll-loop thread: {0}")]
    Thread(std::io::Error),
    /// A poll-loop thread panicked (a bug: the engine never panics on input).
    #[error("a poll-loop thread panicked")]
    Panicked,
    /// Another host answered the probe for our address (RFC 5227).
    #[error(
        "{ip} is already in use on this link by {mac}: pick another address with --ip (or stop the other stack)"
    )]
    AddressInUse {
        /// The address asked for.
        ip: std::net::Ipv4Addr,
        /// The other host's MAC.
        mac: smoltcp::wire::EthernetAddress,
    },
}

/// ARP probes sent for our address at start, and the time between them
/// (RFC 5227 asks for 3 probes 1-2 s apart; a stack that starts in 0.2 s
/// is kept, and a holder on a LAN answers in well under that).
const PROBES: u32 = 3;
const PROBE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(60);

/// Probe for our address before the stack speaks (pcap and DPDK ports,
/// where other hosts share the link): `AddressInUse` when a host answers.
fn probe<D: Device>(stack: &mut Stack, dev: D) -> Result<D, Error> {
    let clock = Clock::new();
    let start = clock.now();
    let mut port = Port::new(dev, None);
    for k in 1..=PROBES {
        stack.probe_address();
        let until = start + PROBE_INTERVAL * k;
        loop {
            let now = clock.now();
            port.step(stack, now, &mut ());
            if let Some(mac) = stack.address_conflict() {
                return Err(Error::AddressInUse {
                    ip: stack.ip(),
                    mac,
                });
            }
            if let Some(why) = port.dev.failure() {
                return Err(RunError::Device(why).into());
            }
            if now >= until {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    stack.end_probing();
    Ok(port.into_device())
}

/// Where frames come from and go.
#[derive(Debug, Clone)]
pub enum Backend {
    /// A network interface through libpcap (feature `pcap`): the stack
    /// takes its own MAC and address on it, promiscuous.
    Pcap(String),
    /// A DPDK port (feature `dpdk`), the EAL started with `eal_args`.
    Dpdk {
        /// Arguments for `rte_eal_init`, split like a shell would.
        eal_args: String,
        /// The DPDK port id.
        port: u16,
        /// Mbufs in the port's pool.
        mbufs: u32,
    },
    /// A port on an in-process simulated link (tests, examples, the demo):
    /// stacks attached to the same [`SimLink`] reach each other.
    Sim(SimLink),
}

/// Everything needed to run a stack on a port.
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// Where frames come from and go.
    pub backend: Backend,
    /// The engine's settings: address, gateway, MAC, MTU, TCP tuning.
    pub stack: Config,
    /// Pin the poll loop to this CPU.
    pub core: Option<usize>,
    /// With DPDK: one poll loop per CPU, each with its own queue pair and stack.
    pub cores: Option<Vec<usize>>,
    /// Keep the idle back-off on pinned cores instead of busy-polling.
    pub backoff: bool,
    /// Use the port's offloads (DPDK: TCP checksums, TSO) where it has them.
    pub offloads: bool,
    /// DPDK: use TSO also on net_tap, which segments in software in the
    /// loop's thread.
    pub software_tso: bool,
    /// Publish telemetry on this Unix socket (a path, or a bare name in
    /// [`crate::telemetry::default_dir`]).
    pub telemetry: Option<PathBuf>,
    /// Write every frame sent and received to this pcap file (feature `pcap`).
    pub capture: Option<PathBuf>,
    /// Impair the port's frames both ways (a testing aid).
    pub impair: Option<LinkConfig>,
    /// Counters of the program around the stack, published in every
    /// telemetry line under `app` (see [`Builder::app_counters`]).
    pub app_counters: Option<AppCounters>,
    /// This stack is one of several processes on one replicated port (see
    /// [`Builder::replica`]).
    pub replica: Option<ustack::shard::ShardId>,
    /// pcap: finish partial checksums from a local sender instead of
    /// dropping them (see [`Builder::accept_partial_checksum`]).
    pub accept_partial_checksum: bool,
    /// Extra Prometheus metrics from the program (see
    /// [`Builder::metrics_source`]).
    pub metrics_sources: Vec<crate::metrics::SharedSource>,
    /// Serve Prometheus metrics over HTTP on this address of the kernel's
    /// network (see [`Builder::metrics`]).
    pub metrics: Option<SocketAddr>,
    /// Where the loop leaves its snapshots for the metrics endpoint
    /// ([`loop_config`](Self::loop_config) hands it to the loop when
    /// `metrics` is set).
    pub metrics_feed: crate::metrics::Feed,
}

impl NetConfig {
    /// Whether the stack probes for its address at start: on ports other
    /// hosts share (pcap, DPDK), not on the simulated link.
    pub fn probes(&self) -> bool {
        !matches!(self.backend, Backend::Sim(..))
    }

    /// The poll loop's settings: pinned to `core` if given, and
    /// busy-polling when that core is dedicated to a DPDK port (otherwise
    /// the loop backs off when idle, so shared CPUs are not starved).
    pub fn loop_config(&self) -> LoopConfig {
        let pinned = self.core.is_some() || self.cores.is_some();
        let dpdk = matches!(self.backend, Backend::Dpdk { .. });
        let idle = if dpdk && pinned && !self.backoff {
            IdleMode::BusyPoll
        } else {
            LoopConfig::default().idle
        };
        LoopConfig {
            core: self.core,
            idle,
            metrics: self.metrics.map(|_| self.metrics_feed.clone()),
            ..LoopConfig::default()
        }
    }

    /// A short description of the backend for log lines.
    pub fn describe(&self) -> String {
        match &self.backend {
            Backend::Pcap(i) => format!("pcap {i}"),
            Backend::Dpdk { eal_args, .. } => format!("dpdk \"{eal_args}\""),
            Backend::Sim(_) => "sim".into(),
        }
    }
}

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

/// The telemetry publisher `cfg` asks for, if any.
fn publisher(cfg: &NetConfig) -> Result<Option<Publisher>, Error> {
    let Some(path) = &cfg.telemetry else {
        return Ok(None);
    };
    let name = format!("{} {}", crate::metrics::stack::program_name(), cfg.stack.ip);
    let socket = crate::telemetry::socket_path(path)?;
    let mut p = Publisher::start(&name, Some(&socket))?;
    if let Some(read) = cfg.app_counters {
        p.app_counters(read);
    }
    cfg.metrics_feed.set_publisher(p.handle());
    Ok(Some(p))
}

/// Start the metrics endpoint `cfg` asks for (`--metrics`), if any: bound
/// now, so that an address in use is one clear error before the backend
/// opens. It serves what the loop leaves in `cfg.metrics_feed` (the
/// loop's settings from [`NetConfig::loop_config`] carry the feed), the
/// program's counters and every extra source. Stops when dropped.
pub fn start_metrics(cfg: &NetConfig) -> Result<Option<crate::metrics::Endpoint>, Error> {
    let Some(addr) = cfg.metrics else {
        return Ok(None);
    };
    let stack = crate::metrics::StackMetrics {
        feed: cfg.metrics_feed.clone(),
        name: crate::metrics::stack::program_name(),
        app: cfg.app_counters,
        sources: cfg.metrics_sources.clone(),
        options: crate::metrics::Options::default(),
    };
    let ep = crate::metrics::Endpoint::bind(addr, Arc::new(move || stack.families()))?;
    crate::notice(&format!("metrics on http://{}/metrics", ep.local_addr()));
    Ok(Some(ep))
}

/// [`Builder::spawn_with`]'s [`NodeUser`].
struct Spawn<A> {
    app: A,
    lcfg: LoopConfig,
    publisher: Option<Publisher>,
    endpoint: Option<crate::metrics::Endpoint>,
    replica: Option<ustack::shard::ShardId>,
}

impl<A: App + Send + 'static> NodeUser for Spawn<A> {
    type Output = Runtime<A>;
    type Error = Error;
    fn run<D>(self, mut node: Node<D>) -> Result<Runtime<A>, Error>
    where
        D: Device + Send + 'static,
        D::Buf: Send,
    {
        if let Some(id) = self.replica {
            node.port.shard = Some(ustack::shard::Shard::replicated(id));
        }
        crate::shared::spawn(node, self.app, self.lcfg, self.publisher, self.endpoint)
    }
}

/// [`Builder::run`]'s [`NodeUser`].
struct RunApp<'a, A: ?Sized> {
    app: &'a mut A,
    lcfg: LoopConfig,
    stop: &'a AtomicBool,
    publisher: Option<&'a Publisher>,
    replica: Option<ustack::shard::ShardId>,
}

impl<A: App + ?Sized> NodeUser for RunApp<'_, A> {
    type Output = ();
    type Error = Error;
    fn run<D>(self, mut node: Node<D>) -> Result<(), Error>
    where
        D: Device + Send + 'static,
        D::Buf: Send,
    {
        if let Some(id) = self.replica {
            node.port.shard = Some(ustack::shard::Shard::replicated(id));
        }
        run_app(&mut node, self.app, &self.lcfg, self.stop, self.publisher)
    }
}

/// Run `app` on `node` until it exits, `stop` is set or the loop's
/// duration ends, publishing telemetry when `publisher` is given.
pub fn run_app<D: Device, A: App + ?Sized>(
    node: &mut Node<D>,
    app: &mut A,
    lcfg: &LoopConfig,
    stop: &AtomicBool,
    publisher: Option<&Publisher>,
) -> Result<(), Error> {
    if let (Some(feed), Some(p)) = (&lcfg.metrics, publisher) {
        feed.set_publisher(p.handle());
    }
    crate::poll::run(
        node,
        app,
        lcfg,
        &Clock::new(),
        || stop.load(Ordering::Relaxed),
        |s| {
            if let Some(p) = publisher {
                p.publish(s);
            }
        },
    )?;
    Ok(())
}

/// Code that runs a node, whatever its device type.
pub trait NodeUser {
    /// What running on the node produces.
    type Output;
    /// The user's error; opening the backend fails with an [`Error`]
    /// converted into it.
    type Error: From<Error>;
    /// Run on `node`. The device can move to another thread (the runtime's
    /// spawned loop does that).
    fn run<D>(self, node: Node<D>) -> Result<Self::Output, Self::Error>
    where
        D: Device + Send + 'static,
        D::Buf: Send;
}

/// Open the backend `cfg` names and hand a node on it to `user`. With
/// several `cores` (DPDK), the user's node is the first core's and the
/// others run beside it (see [`run_primary`]). With `--metrics`, the
/// endpoint listens before the backend opens and until `user` is done
/// (the user's loop feeds it when it runs with `cfg.loop_config()`).
pub fn with_node<U: NodeUser>(cfg: &NetConfig, user: U) -> Result<U::Output, U::Error> {
    let endpoint = start_metrics(cfg).map_err(U::Error::from)?;
    let out = open(cfg, user);
    drop(endpoint);
    out
}

/// [`with_node`] without the metrics endpoint.
fn open<U: NodeUser>(cfg: &NetConfig, user: U) -> Result<U::Output, U::Error> {
    if cfg.cores.is_some() {
        return run_primary(cfg, user);
    }
    match &cfg.backend {
        Backend::Pcap(iface) => open_pcap(cfg, iface, user),
        Backend::Dpdk { eal_args, .. } => open_dpdk(cfg, eal_args, user),
        Backend::Sim(link) => {
            let port = link.attach(cfg.stack.mac, ustack::sim::SIM_POOL_BUFS);
            with_wrappers(cfg, port, user)
        }
    }
}

/// The device with the capture and impairment wrappers `cfg` asks for.
fn with_wrappers<D, U>(cfg: &NetConfig, dev: D, user: U) -> Result<U::Output, U::Error>
where
    D: Device + Send + 'static,
    D::Buf: Send,
    U: NodeUser,
{
    let mut stack = Stack::new(cfg.stack.clone());
    let dev = if cfg.probes() {
        probe(&mut stack, dev).map_err(U::Error::from)?
    } else {
        dev
    };
    match (&cfg.capture, &cfg.impair) {
        (Some(path), imp) => capture(cfg, stack, dev, path, imp.clone(), user),
        (None, Some(imp)) => user.run(Node::new(stack, Impaired::new(dev, imp.clone()))),
        (None, None) => user.run(Node::new(stack, dev)),
    }
}

#[cfg(feature = "pcap")]
fn capture<D, U>(
    _: &NetConfig,
    stack: Stack,
    dev: D,
    path: &std::path::Path,
    imp: Option<LinkConfig>,
    user: U,
) -> Result<U::Output, U::Error>
where
    D: Device + Send + 'static,
    D::Buf: Send,
    U: NodeUser,
{
    use crate::backend::pcap::Captured;
    let captured = |e| U::Error::from(Error::from(e));
    match imp {
        Some(imp) => user.run(Node::new(
            stack,
            Captured::new(Impaired::new(dev, imp), path).map_err(captured)?,
        )),
        None => user.run(Node::new(
            stack,
            Captured::new(dev, path).map_err(captured)?,
        )),
    }
}

#[cfg(not(feature = "pcap"))]
fn capture<D, U>(
    _: &NetConfig,
    _: Stack,
    _: D,
    _: &std::path::Path,
    _: Option<LinkConfig>,
    _: U,
) -> Result<U::Output, U::Error>
where
    D: Device + Send + 'static,
    D::Buf: Send,
    U: NodeUser,
{
    Err(Error::Unsupported(
        "capture files need the pcap feature: rebuild with `--features pcap` (needs libpcap-dev)",
    )
    .into())
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

#[cfg(feature = "pcap")]
fn open_pcap<U: NodeUser>(cfg: &NetConfig, iface: &str, user: U) -> Result<U::Output, U::Error> {
    use crate::backend::pcap::PcapPort;
    let port = PcapPort::open_with(
        iface,
        cfg.stack.mac,
        cfg.stack.mtu,
        cfg.accept_partial_checksum,
    )
    .map_err(Error::from)?;
    with_wrappers(cfg, port, user)
}

#[cfg(not(feature = "pcap"))]
fn open_pcap<U: NodeUser>(_: &NetConfig, _: &str, _: U) -> Result<U::Output, U::Error> {
    Err(Error::Unsupported(
        "this build has no pcap backend: rebuild with `--features pcap` (needs libpcap-dev)",
    )
    .into())
}

#[cfg(feature = "dpdk")]
fn open_dpdk<U: NodeUser>(cfg: &NetConfig, eal_args: &str, user: U) -> Result<U::Output, U::Error> {
    use ustack_dpdk::{DpdkPort, Eal};
    let eal = Eal::init(eal_args).map_err(Error::from)?;
    // The port holds the EAL; it is cleaned up when the node (port) drops.
    let port = DpdkPort::open(&eal, &dpdk_port_config(cfg)).map_err(Error::from)?;
    drop(eal);
    with_wrappers(cfg, port, user)
}

#[cfg(feature = "dpdk")]
fn dpdk_port_config(cfg: &NetConfig) -> ustack_dpdk::DpdkPortConfig {
    let (port, mbufs) = match cfg.backend {
        Backend::Dpdk { port, mbufs, .. } => (port, mbufs),
        _ => (0, 8191),
    };
    let mut pcfg = ustack_dpdk::DpdkPortConfig::new(port);
    pcfg.mbufs = mbufs;
    pcfg.mtu = cfg.stack.mtu;
    pcfg.offloads = cfg.offloads;
    pcfg.software_tso = cfg.software_tso;
    pcfg
}

#[cfg(not(feature = "dpdk"))]
fn open_dpdk<U: NodeUser>(_: &NetConfig, _: &str, user: U) -> Result<U::Output, U::Error> {
    let _ = user;
    Err(Error::Unsupported(
        "this build has no DPDK backend: rebuild with --features dpdk (needs dpdk-dev)",
    )
    .into())
}

/// One shard's app and its last snapshot, after a sharded run.
pub type ShardResult<A> = (A, Option<Snapshot>);

/// The queue pairs of the DPDK port, one per core of `cfg.cores`.
#[cfg(feature = "dpdk")]
fn open_dpdk_queues(cfg: &NetConfig, queues: usize) -> Result<Vec<ustack_dpdk::DpdkPort>, Error> {
    use ustack_dpdk::{DpdkPort, Eal};
    let Backend::Dpdk { eal_args, port, .. } = &cfg.backend else {
        return Err(Error::Config(
            "several cores need DPDK: each core owns one queue pair of a DPDK port".into(),
        ));
    };
    if cfg.capture.is_some() || cfg.impair.is_some() {
        return Err(Error::Config(
            "--capture and --impair work with one core: drop --cores, or use --core N".into(),
        ));
    }
    let eal = Eal::init(eal_args)?;
    let queues = u16::try_from(queues).unwrap_or(u16::MAX);
    let ports = DpdkPort::open_queues(&eal, &dpdk_port_config(cfg), queues)?;
    if let Some(p) = ports.first() {
        let info = p.port().info();
        tracing::info!(
            "DPDK port {} ({}): {} queue pairs, {}",
            port,
            info.driver,
            ports.len(),
            if info.rss {
                "symmetric RSS"
            } else {
                "the driver's own flow distribution"
            }
        );
    }
    Ok(ports)
}

/// Without DPDK there are no queues to shard over.
#[cfg(not(feature = "dpdk"))]
fn open_dpdk_queues(_: &NetConfig, _: usize) -> Result<Vec<ustack::sim::SimPort>, Error> {
    Err(Error::Unsupported(
        "this build has no DPDK backend: rebuild with --features dpdk (needs dpdk-dev)",
    ))
}

/// The cores of a sharded configuration.
fn cores(cfg: &NetConfig) -> Result<Vec<usize>, Error> {
    let cores = cfg.cores.clone().unwrap_or_default();
    if cores.is_empty() {
        return Err(Error::Config(
            "a list of cores is required for a sharded run".into(),
        ));
    }
    Ok(cores)
}

/// The stack of shard `id`: the host's configuration with its shard, one
/// gratuitous ARP per host.
fn shard_stack(cfg: &NetConfig, id: ShardId) -> Stack {
    let mut c = cfg.stack.clone();
    c.shard = id;
    c.announce &= id.index == 0;
    Stack::new(c)
}

/// Run one poll loop per core of `cfg.cores`, each on its own queue pair of
/// the DPDK port with its own stack (shard `i` of N, `steer` rules between
/// them) and the app `make(shard)`, until every app exits, the duration
/// passes or `stop` is set. Snapshots of all shards go to `publisher`,
/// which publishes their totals and each shard's figures.
pub fn run_sharded<A, F>(
    cfg: &NetConfig,
    steer: &[SteerRule],
    duration: Option<Duration>,
    stop: &AtomicBool,
    publisher: Option<&Publisher>,
    make: F,
) -> Result<Vec<ShardResult<A>>, Error>
where
    A: App + Send,
    F: Fn(ShardId) -> A + Sync,
{
    let cores = cores(cfg)?;
    let _endpoint = start_metrics(cfg)?;
    let metrics = cfg.metrics.map(|_| cfg.metrics_feed.clone());
    if let (Some(feed), Some(p)) = (&metrics, publisher) {
        feed.set_publisher(p.handle());
    }
    let ports = open_dpdk_queues(cfg, cores.len())?;
    let shards = ustack::shard::shards(cores.len(), steer);
    let idle = if cfg.backoff {
        LoopConfig::default().idle
    } else {
        IdleMode::BusyPoll
    };
    std::thread::scope(|scope| {
        let threads: Vec<_> = ports
            .into_iter()
            .zip(shards)
            .zip(&cores)
            .map(|((port, shard), &core)| {
                let stack = shard_stack(cfg, shard.id);
                let mut app = make(shard.id);
                let lcfg = LoopConfig {
                    core: Some(core),
                    idle,
                    duration,
                    metrics: metrics.clone(),
                    ..LoopConfig::default()
                };
                std::thread::Builder::new()
                    .name(format!("ustack-core{core}"))
                    .spawn_scoped(scope, move || {
                        let mut node = Node::sharded(stack, port, shard);
                        let mut last = None;
                        let r = crate::poll::run(
                            &mut node,
                            &mut app,
                            &lcfg,
                            &Clock::new(),
                            || stop.load(Ordering::Relaxed),
                            |s| {
                                if let Some(p) = publisher {
                                    p.publish(s);
                                }
                                last = Some(s.clone());
                            },
                        );
                        // One shard failing (or exiting) ends the others.
                        stop.store(true, Ordering::Relaxed);
                        r.map(|()| (app, last))
                    })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| match t {
                Ok(t) => t.join().map_err(|_| Error::Panicked)?.map_err(Error::from),
                Err(e) => Err(Error::Thread(e)),
            })
            .collect()
    })
}

/// An app that runs on one node (ping, iperf3) on a host with several
/// cores: the app runs on shard 0 (the first core) and the other shards
/// answer ARP and ping and hand shard 0 what is its own: ICMP and RoCE
/// (UDP 4791) by steering, TCP segments by passing on what they do not own.
pub fn run_primary<U: NodeUser>(cfg: &NetConfig, user: U) -> Result<U::Output, U::Error> {
    let cores = cores(cfg)?;
    let mut ports = open_dpdk_queues(cfg, cores.len())?;
    let steer = [
        SteerRule {
            what: Steer::Icmp,
            to: 0,
        },
        SteerRule {
            what: Steer::UdpPort(ustack::ud::wire::ROCE_PORT),
            to: 0,
        },
    ];
    let mut shards = ustack::shard::shards(cores.len(), &steer);
    let idle = cfg.loop_config().idle;
    let stop = Arc::new(AtomicBool::new(false));
    if ports.is_empty() || shards.is_empty() {
        return Err(Error::Config("the port has no queue".into()).into());
    }
    let (port0, shard0): (_, Shard) = (ports.remove(0), shards.remove(0));
    let node0 = Node::sharded(shard_stack(cfg, shard0.id), port0, shard0);
    std::thread::scope(|scope| {
        for ((port, shard), &core) in ports.into_iter().zip(shards).zip(&cores[1..]) {
            let mut node = Node::sharded(shard_stack(cfg, shard.id), port, shard);
            let (stop, lcfg) = (
                &stop,
                LoopConfig {
                    core: Some(core),
                    idle,
                    ..LoopConfig::default()
                },
            );
            let spawned = std::thread::Builder::new()
                .name(format!("ustack-core{core}"))
                .spawn_scoped(scope, move || {
                    let r = crate::poll::run(
                        &mut node,
                        &mut (),
                        &lcfg,
                        &Clock::new(),
                        || stop.load(Ordering::Relaxed),
                        |_| {},
                    );
                    if let Err(e) = r {
                        tracing::error!("core {core}: {e}");
                    }
                });
            if let Err(e) = spawned {
                stop.store(true, Ordering::Relaxed);
                return Err(Error::Thread(e).into());
            }
        }
        crate::poll::pin_to_core(cores[0]).map_err(Error::from)?;
        let out = user.run(node0);
        stop.store(true, Ordering::Relaxed);
        out
    })
}
