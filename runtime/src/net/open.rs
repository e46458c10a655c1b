//! Opening the backend a [`NetConfig`] names and handing the node, with
//! its concrete device type, to the code that runs it; the telemetry
//! publisher and the metrics endpoint a configuration asks for.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ustack::Stack;
use ustack::node::{App, Node, Port};
use ustack::phy::device::Device;
use ustack::phy::impair::Impaired;
use ustack::sim::LinkConfig;

use super::{Backend, Error, NetConfig, run_primary};
use crate::clock::Clock;
use crate::poll::{LoopConfig, RunError};
use crate::spawned::Runtime;
use crate::telemetry::Publisher;

/// ARP probes sent for our address at start, and the time between them
/// (RFC 5227 asks for 3 probes 1-2 s apart; a stack that starts in 0.2 s
/// is kept, and a holder on a LAN answers in well under that).
const PROBES: u32 = 3;
const PROBE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(60);

/// Probe for our addresses before the stack speaks (pcap and DPDK ports,
/// where other hosts share the link: ARP for the IPv4 one, duplicate
/// address detection for the IPv6 ones): `AddressInUse` when a host
/// answers.
fn probe<D: Device>(stack: &mut Stack, dev: D) -> Result<D, Error> {
    let clock = Clock::new();
    let start = clock.now();
    let mut port = Port::new(dev, None);
    for k in 1..=PROBES {
        stack.addr().probe();
        let until = start + PROBE_INTERVAL * k;
        loop {
            let now = clock.now();
            port.step(stack, now, &mut ());
            if let Some(mac) = stack.addr_ref().conflict() {
                return Err(Error::AddressInUse {
                    ip: stack.ip().into(),
                    mac,
                });
            }
            if let Some((ip, mac)) = stack.addr_ref().conflict6() {
                return Err(Error::AddressInUse { ip: ip.into(), mac });
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
    stack.addr().end_probing();
    Ok(port.into_device())
}

/// The telemetry publisher `cfg` asks for, if any.
pub(super) fn publisher(cfg: &NetConfig) -> Result<Option<Publisher>, Error> {
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
    crate::notice::notice(&format!("metrics on http://{}/metrics", ep.local_addr()));
    Ok(Some(ep))
}

/// [`Builder::spawn_with`]'s [`NodeRunner`].
pub(super) struct Spawn<A> {
    pub(super) app: A,
    pub(super) lcfg: LoopConfig,
    pub(super) publisher: Option<Publisher>,
    pub(super) endpoint: Option<crate::metrics::Endpoint>,
    pub(super) replica: Option<ustack::shard::ShardId>,
}

impl<A: App + Send + 'static> NodeRunner for Spawn<A> {
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
        crate::spawned::spawn(node, self.app, self.lcfg, self.publisher, self.endpoint)
    }
}

/// [`Builder::run`]'s [`NodeRunner`].
pub(super) struct RunApp<'a, A: ?Sized> {
    pub(super) app: &'a mut A,
    pub(super) lcfg: LoopConfig,
    pub(super) stop: &'a AtomicBool,
    pub(super) publisher: Option<&'a Publisher>,
    pub(super) replica: Option<ustack::shard::ShardId>,
}

impl<A: App + ?Sized> NodeRunner for RunApp<'_, A> {
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
pub trait NodeRunner {
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
pub fn with_node<U: NodeRunner>(cfg: &NetConfig, user: U) -> Result<U::Output, U::Error> {
    let endpoint = start_metrics(cfg).map_err(U::Error::from)?;
    let out = open(cfg, user);
    drop(endpoint);
    out
}

/// [`with_node`] without the metrics endpoint.
pub(super) fn open<U: NodeRunner>(cfg: &NetConfig, user: U) -> Result<U::Output, U::Error> {
    if cfg.cores.is_some() {
        return run_primary(cfg, user);
    }
    match &cfg.backend {
        Backend::Pcap(iface) => open_pcap(cfg, iface, user),
        Backend::Dpdk { eal_args, .. } => open_dpdk(cfg, eal_args, user),
        Backend::Xdp { iface, queue } => open_xdp(cfg, iface, *queue, user),
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
    U: NodeRunner,
{
    let mut stack = Stack::new(cfg.stack.clone());
    let dev = if cfg.probes() {
        probe(&mut stack, dev).map_err(U::Error::from)?
    } else {
        dev
    };
    match (&cfg.capture, &cfg.impair) {
        (Some(path), imp) => capture(stack, dev, path, imp.clone(), user),
        (None, Some(imp)) => user.run(Node::new(stack, Impaired::new(dev, imp.clone()))),
        (None, None) => user.run(Node::new(stack, dev)),
    }
}

/// The device with every frame also written to the capture file `path`
/// (feature `pcap`), impaired first when `imp` says so.
fn capture<D, U>(
    stack: Stack,
    dev: D,
    path: &std::path::Path,
    imp: Option<LinkConfig>,
    user: U,
) -> Result<U::Output, U::Error>
where
    D: Device + Send + 'static,
    D::Buf: Send,
    U: NodeRunner,
{
    #[cfg(feature = "pcap")]
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
    {
        let _ = (stack, dev, path, imp, user);
        Err(Error::Unsupported(
            "capture files need the pcap feature: rebuild with `--features pcap` (needs libpcap-dev)",
        )
        .into())
    }
}

#[cfg(feature = "pcap")]
fn open_pcap<U: NodeRunner>(cfg: &NetConfig, iface: &str, user: U) -> Result<U::Output, U::Error> {
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
fn open_pcap<U: NodeRunner>(_: &NetConfig, _: &str, _: U) -> Result<U::Output, U::Error> {
    Err(Error::Unsupported(
        "this build has no pcap backend: rebuild with `--features pcap` (needs libpcap-dev)",
    )
    .into())
}

#[cfg(feature = "xdp")]
fn open_xdp<U: NodeRunner>(
    cfg: &NetConfig,
    iface: &str,
    queue: u32,
    user: U,
) -> Result<U::Output, U::Error> {
    use crate::backend::xdp::{XdpPort, XdpPortConfig};
    let s = &cfg.stack;
    let mut addrs = vec![std::net::IpAddr::V4(s.ip.address())];
    addrs.extend(s.ipv6.iter().map(|c| std::net::IpAddr::V6(c.address())));
    addrs.push(std::net::IpAddr::V6(s.link_local()));
    let port = XdpPort::open(&XdpPortConfig {
        iface: iface.to_string(),
        queue,
        mac: s.mac,
        addrs,
        mtu: s.mtu,
        accept_partial: cfg.accept_partial_checksum,
    })
    .map_err(Error::from)?;
    with_wrappers(cfg, port, user)
}

#[cfg(not(feature = "xdp"))]
fn open_xdp<U: NodeRunner>(_: &NetConfig, _: &str, _: u32, _: U) -> Result<U::Output, U::Error> {
    Err(Error::Unsupported(
        "this build has no AF_XDP backend: rebuild with `--features xdp` (needs clang and libbpf-dev)",
    )
    .into())
}

#[cfg(feature = "dpdk")]
fn open_dpdk<U: NodeRunner>(
    cfg: &NetConfig,
    eal_args: &str,
    user: U,
) -> Result<U::Output, U::Error> {
    use ustack_dpdk::{DpdkPort, Eal};
    let eal = Eal::init(eal_args).map_err(Error::from)?;
    // The port holds the EAL; it is cleaned up when the node (port) drops.
    let port = DpdkPort::open(&eal, &dpdk_port_config(cfg)).map_err(Error::from)?;
    drop(eal);
    with_wrappers(cfg, port, user)
}

#[cfg(feature = "dpdk")]
pub(super) fn dpdk_port_config(cfg: &NetConfig) -> ustack_dpdk::DpdkPortConfig {
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
fn open_dpdk<U: NodeRunner>(_: &NetConfig, _: &str, user: U) -> Result<U::Output, U::Error> {
    let _ = user;
    Err(Error::Unsupported(
        "this build has no DPDK backend: rebuild with --features dpdk (needs dpdk-dev)",
    )
    .into())
}
