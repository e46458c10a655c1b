//! The `NET` flags every ustack program takes (feature `cli`): the apps,
//! the examples, and `ustack exec`'s preload library parse the same
//! [`NetArgs`] with clap and turn them into a [`Builder`].
//!
//! ```text
//! NET := --pcap IFACE | --dpdk "EAL ARGS" | --sim
//!        --ip A.B.C.D/LEN [--ip IPV6/LEN]... [--slaac] [--gw ADDR]... [--mac MAC] [--core N | --cores LIST]
//!        [--telemetry PATH] [--metrics ADDR:PORT] [--capture FILE.pcap]
//!        [--impair SPEC] [--mtu N]
//! ```
//!
//! `--metrics ADDR:PORT` serves Prometheus metrics (`GET /metrics`, text
//! format 0.0.4) over HTTP on that address of the kernel's network (the
//! management side: the stack's own port is not involved), from the
//! snapshots the loop publishes a few times a second; see
//! [`crate::metrics`]. `127.0.0.1:0` picks a free port and tells it in
//! a notice (`metrics on http://127.0.0.1:PORT/metrics`; see
//! [`crate::set_notice_sink`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use ustack::Config;
use ustack::sim::LinkConfig;
use ustack::wire::{EthernetAddress, IpCidr, Ipv4Cidr, Ipv6Cidr};

use crate::net::{Builder, ConfigError, Error, NetConfig};
use crate::poll::LoopConfig;

/// `NET := --pcap IFACE | --xdp IFACE[:QUEUE] | --dpdk "EAL ARGS" | --sim`,
/// plus addressing.
#[derive(clap::Args, Debug, Clone)]
pub struct NetArgs {
    /// Run on this interface through libpcap (the stack takes its own MAC and IP).
    #[arg(long, value_name = "IFACE", conflicts_with_all = ["dpdk", "sim", "xdp"])]
    pub pcap: Option<String>,
    /// Run on this interface through AF_XDP (queue 0 unless `:QUEUE`): an
    /// XDP program steers the stack's frames to it and leaves every other
    /// frame to the kernel, which keeps the interface and its addresses.
    // Hidden from --help in builds without the `xdp` feature, as --dpdk.
    #[arg(long, value_name = "IFACE[:QUEUE]", value_parser = parse_xdp,
          conflicts_with_all = ["dpdk", "sim"], hide = !cfg!(feature = "xdp"))]
    pub xdp: Option<(String, u32)>,
    /// Run on a DPDK port (0 unless --dpdk-port) with these EAL arguments,
    /// e.g. "--no-huge -m 256 --no-pci --vdev=net_af_packet0,iface=eth1".
    // Hidden from --help in builds without the `dpdk` feature (where it
    // fails with a line saying how to build it), as are its companions.
    #[arg(
        long,
        value_name = "EAL ARGS",
        conflicts_with = "sim",
        allow_hyphen_values = true,
        hide = !cfg!(feature = "dpdk")
    )]
    pub dpdk: Option<String>,
    /// With --dpdk: the port to run on.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "dpdk",
          hide = !cfg!(feature = "dpdk"))]
    pub dpdk_port: u16,
    /// With --dpdk: mbufs in the port's pool (receive and transmit).
    #[arg(long, value_name = "N", default_value_t = 8191, requires = "dpdk",
          value_parser = clap::value_parser!(u32).range(1..), hide = !cfg!(feature = "dpdk"))]
    pub dpdk_mbufs: u32,
    /// Run on the in-process simulated link.
    #[arg(long)]
    pub sim: bool,
    /// Our addresses and prefix lengths: one IPv4 address (required) and
    /// any number of IPv6 ones (`--ip fd77::2/64`; with one, the stack
    /// speaks IPv6 too).
    #[arg(long = "ip", value_name = "ADDR/LEN", value_parser = parse_ip, action = clap::ArgAction::Append)]
    pub ips: Vec<IpCidr>,
    /// Speak IPv6 with no IPv6 `--ip`: the link-local address made from
    /// the MAC, and the addresses and default routers that router
    /// advertisements give (SLAAC).
    #[arg(long)]
    pub slaac: bool,
    /// Gateway for addresses outside the subnet: an IPv4 one, an IPv6 one,
    /// or one of each (IPv6 routers also come from router advertisements).
    #[arg(long, value_name = "ADDR", action = clap::ArgAction::Append)]
    pub gw: Vec<IpAddr>,
    /// Our MAC (default: 02:75:73 followed by the last three bytes of the address).
    #[arg(long, value_parser = parse_mac)]
    pub mac: Option<EthernetAddress>,
    /// Pin the poll loop to this CPU.
    #[arg(long, conflicts_with = "cores")]
    pub core: Option<usize>,
    /// With --dpdk: one poll loop per CPU in LIST (`0,1` or `0-3`), each
    /// pinned, with its own queue pair of the port, its own stack, pools and
    /// connections (symmetric RSS keeps a flow on one core).
    #[arg(long, value_name = "LIST", value_parser = parse_cores, requires = "dpdk",
          hide = !cfg!(feature = "dpdk"))]
    pub cores: Option<CoreList>,
    /// Keep the idle back-off on pinned cores instead of busy-polling (for
    /// machines where the cores are shared).
    #[arg(long)]
    pub backoff: bool,
    /// With --dpdk: compute every TCP checksum in software even where the
    /// port offers checksum offload.
    #[arg(long, requires = "dpdk", hide = !cfg!(feature = "dpdk"))]
    pub no_offloads: bool,
    /// With --dpdk: use TCP segmentation offload also on net_tap, whose
    /// driver segments in software in the loop's thread (other ports that
    /// offer TSO use it by default).
    #[arg(long, requires = "dpdk", conflicts_with = "no_offloads", hide = !cfg!(feature = "dpdk"))]
    pub tso: bool,
    /// Decide every TCP frame on its own instead of cutting bursts of up
    /// to 64 KiB into frames in software (GSO) on ports without TSO.
    #[arg(long)]
    pub no_gso: bool,
    /// Publish telemetry on this Unix socket.
    #[arg(long, value_name = "PATH")]
    pub telemetry: Option<PathBuf>,
    /// Serve Prometheus metrics over HTTP on this address of the kernel's
    /// network (the management side), e.g. 0.0.0.0:9464: GET /metrics.
    #[arg(long, value_name = "ADDR:PORT", value_parser = parse_metrics_addr)]
    pub metrics: Option<std::net::SocketAddr>,
    /// The loop-to-endpoint feed every configuration built from these
    /// flags shares (the loop's settings and the node's are built apart).
    #[arg(skip)]
    pub metrics_feed: crate::metrics::Feed,
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
    /// pcap: take TCP/UDP frames whose checksum holds only the
    /// pseudo-header sum (a local sender's checksum offload: veth, tap, a
    /// bridge) and finish the checksum, instead of dropping them.
    #[arg(long)]
    pub accept_partial_checksum: bool,
    /// Speak at once, without first probing for another host holding the
    /// address (ARP probes, IPv6 duplicate address detection: about
    /// 0.2 s at start): for links where no other host can hold it.
    #[arg(long)]
    pub no_probe: bool,
}

/// `ADDR:PORT` of `--metrics` (`0.0.0.0:9464`, `127.0.0.1:0`, `[::1]:9464`).
pub fn parse_metrics_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    s.parse()
        .map_err(|_| format!("'{s}' is not ADDR:PORT (for example 0.0.0.0:9464 or 127.0.0.1:9464)"))
}

/// `IFACE` or `IFACE:QUEUE` of `--xdp`.
pub fn parse_xdp(s: &str) -> Result<(String, u32), String> {
    let (iface, queue) = match s.rsplit_once(':') {
        Some((i, q)) => (
            i,
            q.parse::<u32>()
                .map_err(|_| format!("'{q}' is not a queue number (IFACE or IFACE:QUEUE)"))?,
        ),
        None => (s, 0),
    };
    if iface.is_empty() || iface.len() > 15 || iface.contains('/') {
        return Err(format!("'{iface}' is not an interface name"));
    }
    Ok((iface.to_string(), queue))
}

/// `A.B.C.D/LEN` or an IPv6 `ADDR/LEN`.
pub fn parse_ip(s: &str) -> Result<IpCidr, String> {
    if !s.contains(':') {
        return parse_cidr(s).map(IpCidr::Ipv4);
    }
    let (ip, len) = s
        .split_once('/')
        .ok_or_else(|| format!("'{s}' is not ADDR/LEN (for example fd77::2/64)"))?;
    let ip: Ipv6Addr = ip
        .parse()
        .map_err(|_| format!("'{ip}' is not an IPv6 address"))?;
    let len: u8 = len
        .parse()
        .ok()
        .filter(|l| (1..=128).contains(l))
        .ok_or_else(|| format!("'{len}' is not a prefix length from 1 to 128"))?;
    Ok(IpCidr::Ipv6(Ipv6Cidr::new(ip, len)))
}

/// `A.B.C.D/LEN`.
pub fn parse_cidr(s: &str) -> Result<Ipv4Cidr, String> {
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

/// `0,1` or `2-5`: the CPUs of `--cores`, each once, at most 64.
pub fn parse_cores(s: &str) -> Result<CoreList, String> {
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

/// `loss=0.02,reorder=0.1,...`: the `--impair` testing aid.
pub fn parse_impair(s: &str) -> Result<LinkConfig, String> {
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

/// A unicast MAC, `02:00:00:00:00:01`.
pub fn parse_mac(s: &str) -> Result<EthernetAddress, String> {
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

/// A builder's refusal said in the flags' terms, with the fix where
/// there is one (the library's own messages name no flag).
pub fn in_flag_terms(e: Error) -> Error {
    let Error::Config(c) = &e else {
        return e;
    };
    let said = match c {
        ConfigError::NoAddress => "--ip A.B.C.D/LEN is required".into(),
        ConfigError::PrefixTooLong(_) | ConfigError::BadAddress { .. } => format!("--ip: {c}"),
        ConfigError::GatewayOffSubnet { .. } => format!("{c}: --gw must be reachable directly"),
        ConfigError::BadGateway6(_) => format!("--gw: {c}"),
        ConfigError::MacNotUnicast(_) => format!("--mac: {c}"),
        ConfigError::Mtu(_) => format!("--mtu: {c}"),
        ConfigError::MtuAboveInterface {
            mtu,
            iface,
            link_mtu,
        } => format!(
            "--mtu {mtu} is above the MTU of {iface} ({link_mtu}): pass --mtu {link_mtu} or less, or raise the interface's (ip link set {iface} mtu {mtu})"
        ),
        ConfigError::CoresWithWrappers => {
            "--capture and --impair work with one core: drop --cores, or use --core N".into()
        }
        ConfigError::ReplicaWithCores => {
            "a replica runs one core: --cores and replicas do not mix".into()
        }
        ConfigError::NoCores | ConfigError::DuplicateCore(_) => format!("--cores: {c}"),
        _ => return e,
    };
    Error::Usage(said)
}

impl NetArgs {
    /// The runtime's configuration from these flags; a setting the
    /// builder refuses is said in the flags' terms ([`in_flag_terms`]).
    pub fn net_config(&self) -> Result<NetConfig, Error> {
        self.builder()?.build().map_err(in_flag_terms)
    }

    /// A [`Builder`] with these flags filled in, for more settings before
    /// `build`, `run` or `spawn`.
    pub fn builder(&self) -> Result<Builder, Error> {
        let Some(ip) = self.ip() else {
            return Err(Error::Usage("--ip A.B.C.D/LEN is required".into()));
        };
        if self
            .ips
            .iter()
            .filter(|c| matches!(c, IpCidr::Ipv4(_)))
            .count()
            > 1
        {
            return Err(Error::Usage(
                "--ip: one IPv4 address (A.B.C.D/LEN); only IPv6 ones may be repeated".into(),
            ));
        }
        let mut b = Builder::new().ip(ip.address(), ip.prefix_len());
        for v6 in self.ipv6() {
            b = b.ipv6(v6.address(), v6.prefix_len());
        }
        if self.slaac {
            b = b.slaac();
        }
        let mut b = b
            .mtu(usize::from(self.mtu))
            .rcvbuf_max(self.rcvbuf_max as usize)
            .backoff(self.backoff)
            .offloads(!self.no_offloads)
            .software_tso(self.tso)
            .gso(!self.no_gso);
        b = match (&self.pcap, &self.xdp, &self.dpdk) {
            (Some(iface), _, _) => b.pcap(iface),
            (_, Some((iface, queue)), _) => b.xdp(iface, *queue),
            (_, _, Some(eal)) => b.dpdk(eal).dpdk_port(self.dpdk_port, self.dpdk_mbufs),
            _ if self.sim => {
                return Err(Error::Usage(
                    "--sim needs a peer on the same link: run `ustack demo`, which puts two stacks on the simulated link".into(),
                ));
            }
            _ => {
                return Err(Error::Usage(
                    "choose a backend: --pcap IFACE, --xdp IFACE, --dpdk \"EAL ARGS\" or --sim"
                        .into(),
                ));
            }
        };
        let (mut v4, mut v6) = (0, 0);
        for gw in &self.gw {
            match *gw {
                IpAddr::V4(g) => (b, v4) = (b.gateway(g), v4 + 1),
                IpAddr::V6(g) => (b, v6) = (b.gateway6(g), v6 + 1),
            }
        }
        if v4 > 1 || v6 > 1 {
            return Err(Error::Usage(
                "--gw: one IPv4 and one IPv6 gateway at most".into(),
            ));
        }
        if let Some(mac) = self.mac {
            b = b.mac(mac.0);
        }
        if let Some(core) = self.core {
            b = b.core(core);
        }
        if let Some(CoreList(cores)) = &self.cores {
            b = b.cores(cores);
        }
        if let Some(t) = &self.telemetry {
            b = b.telemetry(t);
        }
        if let Some(addr) = self.metrics {
            b = b.metrics(addr).metrics_feed(self.metrics_feed.clone());
        }
        if let Some(c) = &self.capture {
            b = b.capture(c);
        }
        if self.accept_partial_checksum {
            b = b.accept_partial_checksum(true);
        }
        if self.no_probe {
            b = b.probe(false);
        }
        if let Some(i) = &self.impair {
            b = b.impair(i.clone());
        }
        Ok(b)
    }

    /// The stack's configuration from these flags.
    pub fn config(&self) -> Result<Config, Error> {
        Ok(self.net_config()?.stack)
    }

    /// The poll loop's settings from these flags (see [`NetConfig::loop_config`]).
    pub fn loop_config(&self) -> LoopConfig {
        self.net_config()
            .map(|c| c.loop_config())
            .unwrap_or_default()
    }

    /// The IPv4 address of `--ip`.
    pub fn ip(&self) -> Option<Ipv4Cidr> {
        self.ips.iter().find_map(|c| match c {
            IpCidr::Ipv4(c) => Some(*c),
            IpCidr::Ipv6(_) => None,
        })
    }

    /// The IPv6 addresses of `--ip`.
    pub fn ipv6(&self) -> Vec<Ipv6Cidr> {
        self.ips
            .iter()
            .filter_map(|c| match c {
                IpCidr::Ipv6(c) => Some(*c),
                IpCidr::Ipv4(_) => None,
            })
            .collect()
    }

    /// `--ip` as given (`-` when missing), for banner lines.
    pub fn address(&self) -> String {
        if self.ips.is_empty() {
            return "-".into();
        }
        let mut all: Vec<String> = self.ips.iter().map(ToString::to_string).collect();
        if self.slaac {
            all.push("slaac".into());
        }
        all.join(" ")
    }

    /// A short description of the backend for log lines.
    pub fn describe(&self) -> String {
        match (&self.pcap, &self.xdp, &self.dpdk) {
            (Some(i), _, _) => format!("pcap {i}"),
            (_, Some((i, q)), _) => format!("xdp {i}:{q}"),
            (_, _, Some(a)) => format!("dpdk \"{a}\""),
            _ => "sim".into(),
        }
    }
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
        assert_eq!(
            parse_metrics_addr("127.0.0.1:9464").unwrap(),
            "127.0.0.1:9464".parse().unwrap()
        );
        assert!(parse_metrics_addr("[::1]:0").is_ok());
        assert!(parse_metrics_addr("9464").is_err());
        assert!(parse_metrics_addr("localhost:9464").is_err());
    }

    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        net: NetArgs,
    }

    #[test]
    fn gw_takes_one_of_each_family() {
        use clap::Parser;
        let net = |gws: &[&str]| {
            let mut args = vec!["x", "--pcap", "lo", "--ip", "10.0.0.2/24"];
            for g in gws {
                args.extend(["--gw", g]);
            }
            Cli::parse_from(args).net
        };
        let cfg = net(&["10.0.0.1", "fe80::1"])
            .builder()
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(cfg.stack.gateway, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(cfg.stack.gateway6, Some("fe80::1".parse().unwrap()));
        assert!(net(&["fe80::1", "fe80::2"]).builder().is_err());
        let bad = net(&["ff02::2"]).builder().unwrap().build().unwrap_err();
        assert_eq!(
            in_flag_terms(bad).to_string(),
            "--gw: ff02::2 cannot be an IPv6 gateway: a unicast address is needed"
        );
    }

    #[test]
    fn ip_takes_one_ipv4_and_any_ipv6() {
        use clap::Parser;
        let cli = Cli::parse_from([
            "x",
            "--pcap",
            "lo",
            "--ip",
            "fd77::2/64",
            "--ip",
            "10.77.0.2/24",
            "--ip",
            "fd78::2/48",
        ]);
        assert_eq!(cli.net.ip().unwrap().to_string(), "10.77.0.2/24");
        let v6: Vec<String> = cli.net.ipv6().iter().map(ToString::to_string).collect();
        assert_eq!(v6, ["fd77::2/64", "fd78::2/48"]);
        assert_eq!(
            cli.net.builder().unwrap().build().unwrap().stack.ipv6.len(),
            2
        );
        let two = Cli::parse_from([
            "x",
            "--pcap",
            "lo",
            "--ip",
            "10.0.0.1/24",
            "--ip",
            "10.0.0.2/24",
        ]);
        assert!(two.net.builder().is_err());
        let only_v6 = Cli::parse_from(["x", "--pcap", "lo", "--ip", "fd77::2/64"]);
        assert!(only_v6.net.builder().is_err());
        assert!(parse_ip("fd77::2/129").is_err());
        assert!(parse_ip("fd77::zz/64").is_err());
        assert!(parse_ip("fd77::2").is_err());
        let slaac = Cli::parse_from(["x", "--pcap", "lo", "--ip", "10.0.0.1/24", "--slaac"]);
        let cfg = slaac.net.builder().unwrap().build().unwrap();
        assert!(cfg.stack.ipv6_auto && cfg.stack.ipv6.is_empty());
        assert_eq!(slaac.net.address(), "10.0.0.1/24 slaac");
        assert!(!cli.net.builder().unwrap().build().unwrap().stack.ipv6_auto);
    }

    #[test]
    fn configurations_from_the_same_flags_share_the_metrics_feed() {
        use clap::Parser;
        let cli = Cli::parse_from([
            "x",
            "--pcap",
            "lo",
            "--ip",
            "10.77.0.2/24",
            "--metrics",
            "127.0.0.1:0",
        ]);
        let cfg = cli.net.builder().unwrap().build().unwrap();
        assert_eq!(cfg.metrics, Some("127.0.0.1:0".parse().unwrap()));
        // The loop's settings, built on their own, feed the same endpoint.
        let lcfg = cli.net.loop_config();
        let feed = lcfg.metrics.expect("a feed with --metrics");
        let snap = ustack::node::Snapshot {
            at_ns: 1,
            stack: Default::default(),
            port: Default::default(),
            pools: Vec::new(),
            connections: Vec::new(),
            connections_total: 0,
            offloads: Default::default(),
            shard: None,
            rc_qps: Vec::new(),
        };
        feed.publish(&snap);
        assert!(cfg.metrics_feed.line("x", None).is_some());
        // Without the flag, the loop feeds nothing.
        let cli = Cli::parse_from(["x", "--pcap", "lo", "--ip", "10.77.0.2/24"]);
        assert!(cli.net.loop_config().metrics.is_none());
    }
}
