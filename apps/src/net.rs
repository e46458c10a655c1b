//! The `NET` flags every app takes, and opening the backend they name.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use anyhow::{Result, bail};
use std::sync::atomic::{AtomicBool, Ordering};
use ustack::device::Device;
use ustack::impair::Impaired;

use ustack::runtime::{App, IdleMode, LoopConfig, Node, Snapshot};
use ustack::shard::{Shard, ShardId, Steer, SteerRule};
use ustack::sim::LinkConfig;
use ustack::wire::{EthernetAddress, Ipv4Cidr};
use ustack::{Config, Stack};

/// `NET := --pcap IFACE | --dpdk "EAL ARGS" | --sim`, plus addressing.
#[derive(clap::Args, Debug, Clone)]
pub struct NetArgs {
    /// Run on this interface through libpcap (the stack takes its own MAC and IP).
    #[arg(long, value_name = "IFACE", conflicts_with_all = ["dpdk", "sim"])]
    pub pcap: Option<String>,
    /// Run on a DPDK port (0 unless --dpdk-port) with these EAL arguments,
    /// e.g. "--no-huge -m 256 --no-pci --vdev=net_af_packet0,iface=eth1".
    #[arg(
        long,
        value_name = "EAL ARGS",
        conflicts_with = "sim",
        allow_hyphen_values = true
    )]
    pub dpdk: Option<String>,
    /// With --dpdk: the port to run on.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "dpdk")]
    pub dpdk_port: u16,
    /// With --dpdk: mbufs in the port's pool (receive and transmit).
    #[arg(long, value_name = "N", default_value_t = 8191, requires = "dpdk",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub dpdk_mbufs: u32,
    /// Run on the in-process simulated link.
    #[arg(long)]
    pub sim: bool,
    /// Our address and prefix length.
    #[arg(long, value_name = "A.B.C.D/LEN", value_parser = parse_cidr)]
    pub ip: Option<Ipv4Cidr>,
    /// Gateway for addresses outside the subnet.
    #[arg(long, value_name = "A.B.C.D")]
    pub gw: Option<Ipv4Addr>,
    /// Our MAC (default: 02:75:73 followed by the last three bytes of the address).
    #[arg(long, value_parser = parse_mac)]
    pub mac: Option<EthernetAddress>,
    /// Pin the poll loop to this CPU.
    #[arg(long, conflicts_with = "cores")]
    pub core: Option<usize>,
    /// With --dpdk: one poll loop per CPU in LIST (`0,1` or `0-3`), each
    /// pinned, with its own queue pair of the port, its own stack, pools and
    /// connections (symmetric RSS keeps a flow on one core).
    #[arg(long, value_name = "LIST", value_parser = parse_cores, requires = "dpdk")]
    pub cores: Option<CoreList>,
    /// Keep the idle back-off on pinned cores instead of busy-polling (for
    /// machines where the cores are shared).
    #[arg(long)]
    pub backoff: bool,
    /// Publish telemetry on this Unix socket.
    #[arg(long, value_name = "PATH")]
    pub telemetry: Option<PathBuf>,
    /// Write every frame sent and received to this pcap file.
    #[arg(long, value_name = "FILE.pcap")]
    pub capture: Option<PathBuf>,
    /// Testing aid: impair this port's frames both ways, as
    /// `loss=0.02,reorder=0.1,reorder_ms=1,corrupt=0.001,delay_ms=0,seed=1`
    /// (for kernels without tc netem).
    #[arg(long, value_name = "SPEC", value_parser = parse_impair)]
    pub impair: Option<LinkConfig>,
    /// IP MTU.
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u16).range(576..=9000))]
    pub mtu: u16,
    /// Largest TCP receive buffer window autotuning may grow a connection's
    /// to, in bytes (connections start at 256 KiB; 262144 turns autotuning off).
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 20,
          value_parser = clap::value_parser!(u32).range(4096..=(1 << 30)))]
    pub rcvbuf_max: u32,
}

fn parse_cidr(s: &str) -> Result<Ipv4Cidr, String> {
    let (ip, len) = s
        .split_once('/')
        .ok_or_else(|| format!("'{s}' is not A.B.C.D/LEN (for example 10.77.0.2/24)"))?;
    let ip: Ipv4Addr = ip
        .parse()
        .map_err(|_| format!("'{ip}' is not an IPv4 address"))?;
    let len: u8 = len
        .parse()
        .ok()
        .filter(|l| (1..=32).contains(l))
        .ok_or_else(|| format!("'{len}' is not a prefix length from 1 to 32"))?;
    Ok(Ipv4Cidr::new(ip, len))
}

/// The CPUs of `--cores`, in the order given (shard `i` runs on the `i`th).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreList(pub Vec<usize>);

fn parse_cores(s: &str) -> Result<CoreList, String> {
    let bad = || format!("'{s}' is not a list of CPUs like 0,1 or 2-5");
    let mut cores = Vec::new();
    for part in s.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (usize, usize) = (
            a.trim().parse().map_err(|_| bad())?,
            b.trim().parse().map_err(|_| bad())?,
        );
        if a > b || b >= 1024 {
            return Err(bad());
        }
        cores.extend(a..=b);
    }
    let mut sorted = cores.clone();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != cores.len() {
        return Err(format!("'{s}' names a CPU twice"));
    }
    if cores.len() > 64 {
        return Err(format!("'{s}': at most 64 cores"));
    }
    Ok(CoreList(cores))
}

fn parse_impair(s: &str) -> Result<LinkConfig, String> {
    let mut cfg = LinkConfig::default();
    for item in s.split(',').filter(|i| !i.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("'{item}' is not key=value"))?;
        let num: f64 = v.parse().map_err(|_| format!("'{v}' is not a number"))?;
        let prob = || {
            if (0.0..=1.0).contains(&num) {
                Ok(num)
            } else {
                Err(format!("{k}={v}: a probability from 0 to 1"))
            }
        };
        match k {
            "loss" => cfg.loss = prob()?,
            "reorder" => cfg.reorder = prob()?,
            "corrupt" => cfg.corrupt = prob()?,
            "duplicate" => return Err("duplicate is not supported by --impair".into()),
            "reorder_ms" => {
                cfg.reorder_delay = std::time::Duration::from_secs_f64(num.max(0.0) / 1e3)
            }
            "delay_ms" => cfg.delay = std::time::Duration::from_secs_f64(num.max(0.0) / 1e3),
            "seed" => cfg.seed = num as u64,
            _ => {
                return Err(format!(
                    "unknown impairment '{k}' (loss, reorder, reorder_ms, corrupt, delay_ms, seed)"
                ));
            }
        }
    }
    Ok(cfg)
}

fn parse_mac(s: &str) -> Result<EthernetAddress, String> {
    let bytes: Vec<u8> = s
        .split(':')
        .map(|p| u8::from_str_radix(p, 16))
        .collect::<Result<_, _>>()
        .map_err(|_| format!("'{s}' is not a MAC address like 02:00:00:00:00:01"))?;
    let b: [u8; 6] = bytes
        .try_into()
        .map_err(|_| format!("'{s}' is not a MAC address like 02:00:00:00:00:01"))?;
    let mac = EthernetAddress(b);
    if !mac.is_unicast() {
        return Err(format!("'{s}' is not a unicast MAC address"));
    }
    Ok(mac)
}

impl NetArgs {
    /// The stack's configuration from these flags.
    pub fn config(&self) -> Result<Config> {
        let Some(ip) = self.ip else {
            bail!("--ip A.B.C.D/LEN is required");
        };
        let o = ip.address().octets();
        let mac = self
            .mac
            .unwrap_or(EthernetAddress([0x02, 0x75, 0x73, o[1], o[2], o[3]]));
        let mut cfg = Config::new(mac, ip);
        cfg.gateway = self.gw;
        cfg.mtu = usize::from(self.mtu);
        cfg.tcp.mss = cfg.mtu - 40;
        cfg.tcp.recv_buffer_max = self.rcvbuf_max as usize;
        // A per-process secret for ISNs and SYN cookies.
        let seed = std::collections::hash_map::RandomState::new();
        use std::hash::BuildHasher;
        cfg.secret = (seed.hash_one(1u8), seed.hash_one(2u8));
        Ok(cfg)
    }

    /// The poll loop's settings from these flags: pinned to --core if given,
    /// and busy-polling when that core is dedicated to a DPDK port (without
    /// --core the loop backs off when idle, so shared CPUs are not starved).
    pub fn loop_config(&self) -> LoopConfig {
        let pinned = self.core.is_some() || self.cores.is_some();
        let idle = if self.dpdk.is_some() && pinned && !self.backoff {
            IdleMode::BusyPoll
        } else {
            LoopConfig::default().idle
        };
        LoopConfig {
            core: self.core,
            idle,
            ..LoopConfig::default()
        }
    }

    /// A short description of the backend for log lines.
    pub fn describe(&self) -> String {
        match (&self.pcap, &self.dpdk) {
            (Some(i), _) => format!("pcap {i}"),
            (_, Some(a)) => format!("dpdk \"{a}\""),
            _ => "sim".into(),
        }
    }
}

/// One shard's app and its last snapshot, after a sharded run.
pub type ShardResult<A> = (A, Option<Snapshot>);

/// Run one poll loop per core of `--cores`, each on its own queue pair of
/// the DPDK port with its own stack (shard `i` of N, `steer` rules between
/// them) and the app `make(shard)`, until every app exits, the duration
/// passes or `stop` is set. Snapshots of all shards go to `tele`, which
/// publishes their totals and each shard's figures.
pub fn run_sharded<A, F>(
    net: &NetArgs,
    steer: &[SteerRule],
    duration: Option<std::time::Duration>,
    stop: &AtomicBool,
    tele: Option<&crate::telemetry::Telemetry>,
    make: F,
) -> Result<Vec<ShardResult<A>>>
where
    A: App + Send,
    F: Fn(ShardId) -> A + Sync,
{
    let Some(CoreList(cores)) = net.cores.clone() else {
        bail!("--cores LIST is required for a sharded run");
    };
    let Some(eal_args) = &net.dpdk else {
        bail!("--cores needs --dpdk: each core owns one queue pair of a DPDK port");
    };
    let cfg = net.config()?;
    let ports = open_dpdk_queues(net, eal_args, &cfg, cores.len())?;
    let shards = ustack::shard::shards(cores.len(), steer);
    let idle = if net.backoff {
        LoopConfig::default().idle
    } else {
        IdleMode::BusyPoll
    };
    let results = std::thread::scope(|scope| {
        let threads: Vec<_> = ports
            .into_iter()
            .zip(shards)
            .zip(&cores)
            .map(|((port, shard), &core)| {
                let mut c = cfg.clone();
                c.shard = shard.id;
                c.announce &= shard.id.index == 0;
                let mut app = make(shard.id);
                let lcfg = LoopConfig {
                    core: Some(core),
                    idle,
                    duration,
                    ..LoopConfig::default()
                };
                std::thread::Builder::new()
                    .name(format!("ustack-core{core}"))
                    .spawn_scoped(scope, move || {
                        let mut node = Node::sharded(Stack::new(c), port, shard);
                        let mut last = None;
                        let r = ustack::runtime::run(
                            &mut node,
                            &mut app,
                            &lcfg,
                            &ustack::clock::Clock::new(),
                            || stop.load(Ordering::Relaxed),
                            |s| {
                                if let Some(t) = tele {
                                    t.publish(s);
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
                Ok(t) => t
                    .join()
                    .map_err(|_| anyhow::anyhow!("a poll-loop thread panicked"))?
                    .map_err(anyhow::Error::from),
                Err(e) => Err(anyhow::anyhow!("cannot start a poll-loop thread: {e}")),
            })
            .collect::<Result<Vec<_>>>()
    })?;
    Ok(results)
}

/// An app that runs on one node (ping, iperf3) on a host with `--cores`:
/// the app runs on shard 0 (the first core) and the other shards answer
/// ARP and ping and hand shard 0 what is its own: ICMP and RoCE (UDP 4791)
/// by steering, TCP segments by passing on what they do not own.
fn run_primary<U: NodeUser>(net: &NetArgs, user: U) -> Result<U::Output> {
    let Some(CoreList(cores)) = net.cores.clone() else {
        bail!("--cores LIST is required for a sharded run");
    };
    let Some(eal_args) = &net.dpdk else {
        bail!("--cores needs --dpdk: each core owns one queue pair of a DPDK port");
    };
    let cfg = net.config()?;
    let mut ports = open_dpdk_queues(net, eal_args, &cfg, cores.len())?;
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
    let idle = net.loop_config().idle;
    let stop = AtomicBool::new(false);
    let stack = |shard: &Shard| {
        let mut c = cfg.clone();
        c.shard = shard.id;
        c.announce &= shard.id.index == 0;
        Stack::new(c)
    };
    if ports.is_empty() || shards.is_empty() {
        bail!("the port has no queue");
    }
    let (port0, shard0) = (ports.remove(0), shards.remove(0));
    let node0 = Node::sharded(stack(&shard0), port0, shard0);
    std::thread::scope(|scope| {
        for ((port, shard), &core) in ports.into_iter().zip(shards).zip(&cores[1..]) {
            let mut node = Node::sharded(stack(&shard), port, shard);
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
                    let r = ustack::runtime::run(
                        &mut node,
                        &mut (),
                        &lcfg,
                        &ustack::clock::Clock::new(),
                        || stop.load(Ordering::Relaxed),
                        |_| {},
                    );
                    if let Err(e) = r {
                        tracing::error!("core {core}: {e}");
                    }
                });
            if let Err(e) = spawned {
                stop.store(true, Ordering::Relaxed);
                bail!("cannot start a poll-loop thread: {e}");
            }
        }
        ustack::runtime::pin_to_core(cores[0])?;
        let out = user.run(node0);
        stop.store(true, Ordering::Relaxed);
        out
    })
}

#[cfg(feature = "dpdk")]
fn open_dpdk_queues(
    net: &NetArgs,
    eal_args: &str,
    cfg: &Config,
    queues: usize,
) -> Result<Vec<ustack_dpdk::DpdkPort>> {
    use ustack_dpdk::{DpdkPort, DpdkPortConfig, Eal};
    if net.capture.is_some() || net.impair.is_some() {
        bail!("--capture and --impair work with one core: drop --cores, or use --core N");
    }
    let eal = Eal::init(eal_args)?;
    let mut pcfg = DpdkPortConfig::new(net.dpdk_port);
    pcfg.mbufs = net.dpdk_mbufs;
    pcfg.mtu = cfg.mtu;
    let queues = u16::try_from(queues).unwrap_or(u16::MAX);
    let ports = DpdkPort::open_queues(&eal, &pcfg, queues)?;
    if let Some(p) = ports.first() {
        let info = p.port().info();
        tracing::info!(
            "DPDK port {} ({}): {} queue pairs, {}",
            net.dpdk_port,
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
fn open_dpdk_queues(
    _: &NetArgs,
    _: &str,
    _: &Config,
    _: usize,
) -> Result<Vec<ustack::sim::SimPort>> {
    bail!("this build has no DPDK backend: rebuild with --features dpdk (needs dpdk-dev)")
}

/// Code that runs a node, whatever its device type.
pub trait NodeUser {
    type Output;
    fn run<D: Device>(self, node: Node<D>) -> Result<Self::Output>;
}

/// Open the backend the flags name and hand a node on it to `user`.
pub fn with_node<U: NodeUser>(net: &NetArgs, user: U) -> Result<U::Output> {
    let cfg = net.config()?;
    if net.cores.is_some() {
        return run_primary(net, user);
    }
    if let Some(iface) = &net.pcap {
        return open_pcap(net, iface, cfg, user);
    }
    if let Some(eal_args) = &net.dpdk {
        return open_dpdk(net, eal_args, cfg, user);
    }
    if net.sim {
        bail!(
            "--sim needs a peer on the same link: run `ustack demo`, which puts two stacks on the simulated link"
        );
    }
    bail!("choose a backend: --pcap IFACE, --dpdk \"EAL ARGS\" or --sim")
}

#[cfg(feature = "pcap")]
fn open_pcap<U: NodeUser>(net: &NetArgs, iface: &str, cfg: Config, user: U) -> Result<U::Output> {
    use ustack::backend::pcap::{Captured, PcapPort};
    let port = PcapPort::open(iface, cfg.mac, cfg.mtu)?;
    let stack = Stack::new(cfg);
    match (&net.capture, &net.impair) {
        (Some(path), Some(imp)) => user.run(Node::new(
            stack,
            Captured::new(Impaired::new(port, imp.clone()), path)?,
        )),
        (Some(path), None) => user.run(Node::new(stack, Captured::new(port, path)?)),
        (None, Some(imp)) => user.run(Node::new(stack, Impaired::new(port, imp.clone()))),
        (None, None) => user.run(Node::new(stack, port)),
    }
}

#[cfg(not(feature = "pcap"))]
fn open_pcap<U: NodeUser>(_: &NetArgs, _: &str, _: Config, _: U) -> Result<U::Output> {
    let _ = (Stack::new, Impaired::<ustack::sim::SimPort>::new);
    bail!("this build has no pcap backend: rebuild with `--features pcap` (needs libpcap-dev)")
}

#[cfg(feature = "dpdk")]
fn open_dpdk<U: NodeUser>(
    net: &NetArgs,
    eal_args: &str,
    cfg: Config,
    user: U,
) -> Result<U::Output> {
    use ustack_dpdk::{DpdkPort, DpdkPortConfig, Eal};
    let eal = Eal::init(eal_args)?;
    let mut pcfg = DpdkPortConfig::new(net.dpdk_port);
    pcfg.mbufs = net.dpdk_mbufs;
    pcfg.mtu = cfg.mtu;
    // The port holds the EAL; it is cleaned up when the node (port) drops.
    let port = DpdkPort::open(&eal, &pcfg)?;
    drop(eal);
    let stack = Stack::new(cfg);
    match (&net.capture, &net.impair) {
        #[cfg(feature = "pcap")]
        (Some(path), imp) => {
            use ustack::backend::pcap::Captured;
            match imp {
                Some(imp) => user.run(Node::new(
                    stack,
                    Captured::new(Impaired::new(port, imp.clone()), path)?,
                )),
                None => user.run(Node::new(stack, Captured::new(port, path)?)),
            }
        }
        #[cfg(not(feature = "pcap"))]
        (Some(_), _) => {
            bail!("--capture needs the pcap feature: rebuild with `--features dpdk,pcap`")
        }
        (None, Some(imp)) => user.run(Node::new(stack, Impaired::new(port, imp.clone()))),
        (None, None) => user.run(Node::new(stack, port)),
    }
}

#[cfg(not(feature = "dpdk"))]
fn open_dpdk<U: NodeUser>(_: &NetArgs, _: &str, _: Config, _: U) -> Result<U::Output> {
    bail!("this build has no DPDK backend: rebuild with --features dpdk (needs dpdk-dev)")
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn parses_addresses() {
        assert_eq!(
            parse_cidr("10.77.0.2/24").unwrap(),
            Ipv4Cidr::new(Ipv4Addr::new(10, 77, 0, 2), 24)
        );
        assert!(parse_cidr("10.77.0.2").is_err());
        assert!(parse_cidr("10.77.0.300/24").is_err());
        assert!(parse_cidr("10.77.0.2/33").is_err());
        assert_eq!(
            parse_mac("02:00:00:00:00:01").unwrap(),
            EthernetAddress([2, 0, 0, 0, 0, 1])
        );
        assert!(parse_mac("ff:ff:ff:ff:ff:ff").is_err());
        assert!(parse_mac("02:00:00").is_err());
        assert!(parse_mac("zz:00:00:00:00:01").is_err());
        let i = parse_impair("loss=0.02,reorder=0.1,reorder_ms=2,seed=9").unwrap();
        assert_eq!((i.loss, i.reorder, i.seed), (0.02, 0.1, 9));
        assert_eq!(i.reorder_delay, std::time::Duration::from_millis(2));
        assert!(parse_impair("loss=2").is_err());
        assert!(parse_impair("bogus=1").is_err());
        assert!(parse_impair("loss").is_err());
        assert_eq!(parse_cores("0,1").unwrap().0, vec![0, 1]);
        assert_eq!(parse_cores("2-4,0").unwrap().0, vec![2, 3, 4, 0]);
        assert!(parse_cores("1,1").is_err());
        assert!(parse_cores("3-1").is_err());
        assert!(parse_cores("a").is_err());
        assert!(parse_cores("").is_err());
    }
}
