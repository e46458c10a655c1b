//! [`Builder`]: a [`NetConfig`] the way the command line reads, every
//! input checked when it is built.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use ustack::Config;
use ustack::node::App;
use ustack::shard::{ShardId, SteerRule};
use ustack::sim::{LinkConfig, SimLink};
use ustack::wire::{EthernetAddress, Ipv4Cidr, Ipv6Cidr};

use super::open::{RunApp, Spawn, open, publisher, start_metrics, with_node};
use super::{AppCounters, Backend, ConfigError, Error, NetConfig, ShardResult, run_sharded};
use crate::spawned::Runtime;

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
    ip: Option<(Ipv4Addr, u8)>,
    ipv6: Vec<(Ipv6Addr, u8)>,
    slaac: bool,
    dpdk_port: Option<(u16, u32)>,
    gateway: Option<Ipv4Addr>,
    gateway6: Option<Ipv6Addr>,
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
    no_probe: bool,
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

    /// With [`dpdk`](Self::dpdk): the port and the mbufs of its pool
    /// (checked at [`build`](Self::build): DPDK's backend, some mbufs).
    pub fn dpdk_port(mut self, port: u16, mbufs: u32) -> Self {
        self.dpdk_port = Some((port, mbufs));
        self
    }

    /// Run on queue `queue` of this interface through AF_XDP.
    pub fn xdp(mut self, iface: impl Into<String>, queue: u32) -> Self {
        self.backend = Some(Backend::Xdp {
            iface: iface.into(),
            queue,
        });
        self
    }

    /// Run on a port of this in-process simulated link.
    pub fn sim(mut self, link: &SimLink) -> Self {
        self.backend = Some(Backend::Sim(link.clone()));
        self
    }

    /// Our address and prefix length.
    /// Checked at [`build`](Self::build): a prefix up to 32, an address a
    /// host can have.
    pub fn ip(mut self, addr: Ipv4Addr, prefix_len: u8) -> Self {
        self.ip = Some((addr, prefix_len));
        self
    }

    /// An IPv6 address and prefix length (may be given several times):
    /// with one, the stack speaks IPv6 too (its link-local address made
    /// from the MAC, neighbor discovery, ICMPv6 echo). Checked at
    /// [`build`](Self::build): a prefix of 1 to 128, a unicast address
    /// that is not loopback.
    pub fn ipv6(mut self, addr: Ipv6Addr, prefix_len: u8) -> Self {
        self.ipv6.push((addr, prefix_len));
        self
    }

    /// Speak IPv6 with no address given to [`ipv6`](Self::ipv6): the
    /// link-local address made from the MAC, and the addresses and
    /// default routers that router advertisements give (SLAAC, RFC 4862).
    pub fn slaac(mut self) -> Self {
        self.slaac = true;
        self
    }

    /// Next hop for addresses outside the subnet.
    pub fn gateway(mut self, gw: Ipv4Addr) -> Self {
        self.gateway = Some(gw);
        self
    }

    /// Next hop for IPv6 destinations off-link (beside the routers
    /// advertisements give). Checked at [`build`](Self::build): a
    /// unicast address.
    pub fn gateway6(mut self, gw: Ipv6Addr) -> Self {
        self.gateway6 = Some(gw);
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
    /// is told as a notice (see [`crate::set_notice_sink`]).
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

    /// Probe for another host holding the stack's addresses before it
    /// speaks (on by default on pcap, AF_XDP and DPDK ports: ARP probes
    /// and duplicate address detection, about 0.2 s); off speaks at once,
    /// for links where no other host can hold them.
    pub fn probe(mut self, on: bool) -> Self {
        self.no_probe = !on;
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

    /// The configuration, or why it is incomplete or wrong: every input
    /// is checked here (a [`ConfigError`]), never by a panic later.
    pub fn build(mut self) -> Result<NetConfig, Error> {
        let mut backend = self.backend.take().ok_or(ConfigError::NoBackend)?;
        let (addr, prefix) = self.ip.ok_or(ConfigError::NoAddress)?;
        let ip = checked_cidr(addr, prefix)?;
        let o = ip.address().octets();
        let mac = self
            .mac
            .unwrap_or(EthernetAddress([0x02, 0x75, 0x73, o[1], o[2], o[3]]));
        if !mac.is_unicast() {
            return Err(ConfigError::MacNotUnicast(mac).into());
        }
        match (&mut backend, self.dpdk_port) {
            (Backend::Pcap(iface) | Backend::Xdp { iface, .. }, _) if iface.is_empty() => {
                return Err(ConfigError::NoInterface.into());
            }
            (_, Some((_, 0))) => return Err(ConfigError::NoMbufs.into()),
            (Backend::Dpdk { port, mbufs, .. }, Some((p, m))) => (*port, *mbufs) = (p, m),
            (_, Some(_)) => return Err(ConfigError::DpdkPortWithoutDpdk.into()),
            _ => {}
        }
        let mut stack = match self.seed {
            Some(seed) => Config::with_seed(mac, ip, seed),
            None => Config::new(mac, ip),
        };
        stack.gateway = self.gateway;
        if let Some(gw) = self.gateway6 {
            if gw.is_multicast() || gw.is_unspecified() || gw.is_loopback() {
                return Err(ConfigError::BadGateway6(gw).into());
            }
            stack.gateway6 = Some(gw);
        }
        for &(addr, prefix) in &self.ipv6 {
            stack.ipv6.push(checked_ipv6(addr, prefix)?);
        }
        stack.ipv6_auto = self.slaac;
        if self.no_gso {
            stack.gso_max = 0;
        }
        if let Some(mtu) = self.mtu {
            if !(576..=9000).contains(&mtu) {
                return Err(ConfigError::Mtu(mtu).into());
            }
            stack.mtu = mtu;
            stack.tcp.mss = mtu - 40;
        }
        match self.rcvbuf_max {
            Some(0) => return Err(ConfigError::ZeroReceiveBuffer.into()),
            Some(max) => stack.tcp.recv_buffer_max = max,
            None => {}
        }
        for t in &self.tweaks {
            t(&mut stack);
        }
        if let Some(id) = self.replica {
            if id.count == 0 || id.index >= id.count {
                return Err(ConfigError::Replica {
                    index: id.index,
                    count: id.count,
                }
                .into());
            }
            if self.cores.is_some() {
                return Err(ConfigError::ReplicaWithCores.into());
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
        if let Some(cores) = &self.cores {
            if !matches!(backend, Backend::Dpdk { .. }) {
                return Err(ConfigError::CoresNeedDpdk.into());
            }
            if self.capture.is_some() || self.impair.is_some() {
                return Err(ConfigError::CoresWithWrappers.into());
            }
            if cores.is_empty() {
                return Err(ConfigError::NoCores.into());
            }
            if let Some(c) = cores
                .iter()
                .enumerate()
                .find_map(|(i, c)| cores[..i].contains(c).then_some(*c))
            {
                return Err(ConfigError::DuplicateCore(c).into());
            }
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
            no_probe: self.no_probe,
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
            return Err(ConfigError::SpawnWithCores.into());
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

/// `addr/prefix` as a CIDR, when a host may have it: a prefix up to 32
/// (smoltcp's constructor panics above), not unspecified, loopback,
/// multicast or broadcast (the limited one, or the subnet's on a prefix
/// up to /30).
/// An IPv6 address a host can have, with a prefix of 1 to 128.
fn checked_ipv6(addr: Ipv6Addr, prefix: u8) -> Result<Ipv6Cidr, ConfigError> {
    let why = if !(1..=128).contains(&prefix) {
        "the prefix length is not 1 to 128"
    } else if addr.is_unspecified() {
        "it is the unspecified address"
    } else if addr.is_loopback() {
        "it is the loopback address"
    } else if addr.is_multicast() {
        "it is a multicast address"
    } else if addr.is_unicast_link_local() {
        "it is link-local (the stack makes its own from the MAC)"
    } else {
        return Ok(Ipv6Cidr::new(addr, prefix));
    };
    Err(ConfigError::BadIpv6 { addr, prefix, why })
}

fn checked_cidr(addr: Ipv4Addr, prefix: u8) -> Result<Ipv4Cidr, ConfigError> {
    if prefix > 32 {
        return Err(ConfigError::PrefixTooLong(prefix));
    }
    let ip = Ipv4Cidr::new(addr, prefix);
    let why = if addr.is_unspecified() {
        "unspecified"
    } else if addr.is_loopback() {
        "a loopback address"
    } else if addr.is_multicast() {
        "a multicast address"
    } else if addr.is_broadcast() || (prefix <= 30 && ip.broadcast() == Some(addr)) {
        "a broadcast address"
    } else {
        return Ok(ip);
    };
    Err(ConfigError::BadAddress { addr, why })
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
) -> Result<(), ConfigError> {
    if let Some(gw) = gateway {
        let broadcast = ip.prefix_len() <= 30 && ip.broadcast() == Some(gw);
        if !ip.contains_addr(&gw) || gw == ip.address() || broadcast {
            return Err(ConfigError::GatewayOffSubnet {
                gateway: gw,
                subnet: ip,
            });
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
        if let Some(&cpu) = wanted.iter().find(|c| !have.contains(c)) {
            return Err(ConfigError::NoSuchCpu { cpu, allowed: have });
        }
    }
    if let Backend::Pcap(iface) | Backend::Xdp { iface, .. } = backend {
        let path = format!("/sys/class/net/{iface}/mtu");
        if let Some(link_mtu) = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
        {
            if mtu > link_mtu {
                return Err(ConfigError::MtuAboveInterface {
                    mtu,
                    iface: iface.clone(),
                    link_mtu,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod test {
    use super::*;

    fn sim() -> Builder {
        Builder::new().sim(&SimLink::new(Default::default()))
    }

    fn host() -> Builder {
        sim().ip(Ipv4Addr::new(10, 0, 0, 2), 24)
    }

    fn dpdk() -> Builder {
        Builder::new()
            .dpdk("--no-huge")
            .ip(Ipv4Addr::new(10, 0, 0, 2), 24)
    }

    /// What `build` refused; its message names no command-line flag.
    fn refused(b: Builder) -> ConfigError {
        match b.build() {
            Err(Error::Config(c)) => {
                assert!(!c.to_string().contains("--"), "names a flag: {c}");
                c
            }
            other => panic!("expected a ConfigError, got {other:?}"),
        }
    }

    fn bad_address(a: [u8; 4], prefix: u8) -> ConfigError {
        refused(sim().ip(Ipv4Addr::from(a), prefix))
    }

    #[test]
    fn a_complete_builder_builds() {
        let cfg = host().gateway(Ipv4Addr::new(10, 0, 0, 1)).build().unwrap();
        assert_eq!(cfg.stack.ip.prefix_len(), 24);
        // Point-to-point and host routes have no broadcast address.
        for (a, p) in [([10, 0, 0, 1], 31), ([10, 0, 0, 255], 32)] {
            sim().ip(Ipv4Addr::from(a), p).build().unwrap();
        }
    }

    #[test]
    fn ipv6_addresses_a_host_can_have() {
        let good = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 2);
        let cfg = host().ipv6(good, 64).build().unwrap();
        assert_eq!(cfg.stack.ipv6.len(), 1);
        assert_eq!(cfg.stack.ipv6[0].address(), good);
        for (addr, prefix) in [
            (good, 0),
            (good, 129),
            (Ipv6Addr::UNSPECIFIED, 64),
            (Ipv6Addr::LOCALHOST, 128),
            (Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1), 64),
            (Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 2), 64),
        ] {
            match refused(host().ipv6(addr, prefix)) {
                ConfigError::BadIpv6 {
                    addr: a, prefix: p, ..
                } => {
                    assert_eq!((a, p), (addr, prefix));
                }
                other => panic!("{addr}/{prefix}: {other:?}"),
            }
        }
    }

    #[test]
    fn missing_backend_or_address() {
        assert_eq!(
            refused(Builder::new().ip(Ipv4Addr::new(10, 0, 0, 2), 24)),
            ConfigError::NoBackend
        );
        assert_eq!(refused(sim()), ConfigError::NoAddress);
        assert_eq!(
            refused(Builder::new().pcap("").ip(Ipv4Addr::new(10, 0, 0, 2), 24)),
            ConfigError::NoInterface
        );
    }

    #[test]
    fn a_prefix_above_32_is_an_error_not_a_panic() {
        for p in [33, 64, 255] {
            assert_eq!(bad_address([10, 0, 0, 2], p), ConfigError::PrefixTooLong(p));
        }
    }

    #[test]
    fn addresses_no_host_can_have() {
        for (a, p, why) in [
            ([0, 0, 0, 0], 24, "unspecified"),
            ([127, 0, 0, 1], 8, "a loopback address"),
            ([224, 0, 0, 1], 24, "a multicast address"),
            ([255, 255, 255, 255], 24, "a broadcast address"),
            ([10, 0, 0, 255], 24, "a broadcast address"),
        ] {
            let addr = Ipv4Addr::from(a);
            assert_eq!(bad_address(a, p), ConfigError::BadAddress { addr, why });
        }
    }

    #[test]
    fn the_gateway_must_be_another_host_on_the_subnet() {
        let subnet = Ipv4Cidr::new(Ipv4Addr::new(10, 0, 0, 2), 24);
        for gw in [[192, 168, 9, 1], [10, 0, 0, 2], [10, 0, 0, 255]] {
            let gateway = Ipv4Addr::from(gw);
            assert_eq!(
                refused(host().gateway(gateway)),
                ConfigError::GatewayOffSubnet { gateway, subnet }
            );
        }
    }

    #[test]
    fn a_group_mac_is_refused() {
        let mac = [0x01, 0, 0x5e, 0, 0, 1];
        assert_eq!(
            refused(host().mac(mac)),
            ConfigError::MacNotUnicast(EthernetAddress(mac))
        );
        assert_eq!(
            refused(host().mac([0xff; 6])),
            ConfigError::MacNotUnicast(EthernetAddress([0xff; 6]))
        );
    }

    #[test]
    fn zero_and_out_of_range_sizes() {
        for mtu in [0, 575, 9001] {
            assert_eq!(refused(host().mtu(mtu)), ConfigError::Mtu(mtu));
        }
        assert_eq!(
            refused(host().rcvbuf_max(0)),
            ConfigError::ZeroReceiveBuffer
        );
        assert_eq!(refused(dpdk().dpdk_port(0, 0)), ConfigError::NoMbufs);
        assert_eq!(
            refused(host().dpdk_port(1, 4095)),
            ConfigError::DpdkPortWithoutDpdk
        );
        let cfg = dpdk().dpdk_port(1, 4095).build().unwrap();
        assert!(matches!(
            cfg.backend,
            Backend::Dpdk {
                port: 1,
                mbufs: 4095,
                ..
            }
        ));
    }

    #[test]
    fn cores_that_cannot_be_had() {
        let c = refused(host().core(1 << 20));
        assert!(matches!(c, ConfigError::NoSuchCpu { cpu, .. } if cpu == 1 << 20));
        assert_eq!(refused(host().cores(&[0])), ConfigError::CoresNeedDpdk);
        assert_eq!(refused(dpdk().cores(&[])), ConfigError::NoCores);
        assert_eq!(
            refused(dpdk().cores(&[0, 0])),
            ConfigError::DuplicateCore(0)
        );
        assert_eq!(
            refused(dpdk().cores(&[0]).capture("x.pcap")),
            ConfigError::CoresWithWrappers
        );
        match dpdk().cores(&[0]).spawn() {
            Err(Error::Config(c)) => assert_eq!(c, ConfigError::SpawnWithCores),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn replicas() {
        assert_eq!(
            refused(host().replica(2, 2)),
            ConfigError::Replica { index: 2, count: 2 }
        );
        assert_eq!(
            refused(host().replica(0, 0)),
            ConfigError::Replica { index: 0, count: 0 }
        );
        assert_eq!(
            refused(dpdk().replica(0, 2).cores(&[0])),
            ConfigError::ReplicaWithCores
        );
    }
}
