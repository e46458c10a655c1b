//! What the ustack examples share: the `NET` flags every one of them takes
//! ([`NetArgs`], the same names as the `ustack`, `uping` and `uperf` apps),
//! a stop flag for Ctrl-C, and the one-line error exit. The in-loop echo
//! app that `echo-server` and `multicore-echo` both run is [`echo`].
//!
//! The programs themselves are in `src/bin/`; each is complete and short
//! enough to copy as the start of your own. Copy this file along with it
//! (or replace [`NetArgs`] with your own configuration: all it does is fill
//! in a [`ustack_runtime::Builder`]).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod echo;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Result, bail};
use ustack::wire::Ipv4Cidr;
use ustack_runtime::Builder;

/// `--pcap IFACE | --dpdk "EAL ARGS"`, `--ip A.B.C.D/LEN` and the optional
/// addressing flags: flatten it into an example's own clap arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct NetArgs {
    /// Run on this interface through libpcap (the stack takes its own MAC
    /// and IP on it; build with `--features pcap`).
    #[arg(long, value_name = "IFACE", conflicts_with = "dpdk")]
    pub pcap: Option<String>,
    /// Run on DPDK port 0 with these EAL arguments, e.g. "--no-huge -m 256
    /// --no-pci --vdev=net_af_packet0,iface=eth1" (build with `--features dpdk`).
    #[arg(long, value_name = "EAL ARGS", allow_hyphen_values = true)]
    pub dpdk: Option<String>,
    /// Our address and prefix length: one the kernel does not use on that link.
    #[arg(long, value_name = "A.B.C.D/LEN", value_parser = parse_cidr)]
    pub ip: Ipv4Cidr,
    /// Gateway for addresses outside the subnet.
    #[arg(long, value_name = "A.B.C.D")]
    pub gw: Option<Ipv4Addr>,
    /// Our MAC (default: 02:75:73 followed by the last three bytes of the address).
    #[arg(long, value_name = "MAC", value_parser = parse_mac)]
    pub mac: Option<[u8; 6]>,
    /// Pin the poll loop to this CPU (with DPDK it then busy-polls).
    #[arg(long, value_name = "N")]
    pub core: Option<usize>,
    /// Publish telemetry on this Unix socket (watch it with `utop`).
    #[arg(long, value_name = "PATH")]
    pub telemetry: Option<PathBuf>,
    /// Write every frame sent and received to this pcap file.
    #[arg(long, value_name = "FILE.pcap")]
    pub capture: Option<PathBuf>,
}

impl NetArgs {
    /// A runtime builder with these flags filled in; add `.cores(..)` or
    /// anything else, then `.run(app, stop)`, `.spawn()` or `.build()`.
    pub fn builder(&self) -> Result<Builder> {
        let mut b = Builder::new().ip(self.ip.address(), self.ip.prefix_len());
        b = match (&self.pcap, &self.dpdk) {
            (Some(iface), _) => b.pcap(iface),
            (_, Some(eal)) => b.dpdk(eal),
            _ => bail!("choose a backend: --pcap IFACE or --dpdk \"EAL ARGS\""),
        };
        if let Some(gw) = self.gw {
            b = b.gateway(gw);
        }
        if let Some(mac) = self.mac {
            b = b.mac(mac);
        }
        if let Some(core) = self.core {
            b = b.core(core);
        }
        if let Some(path) = &self.telemetry {
            b = b.telemetry(path);
        }
        if let Some(file) = &self.capture {
            b = b.capture(file);
        }
        Ok(b)
    }

    /// A short description of the backend for a banner line.
    pub fn describe(&self) -> String {
        match (&self.pcap, &self.dpdk) {
            (Some(iface), _) => format!("pcap {iface}"),
            (_, Some(eal)) => format!("dpdk \"{eal}\""),
            _ => "no backend".into(),
        }
    }
}

/// `A.B.C.D/LEN`.
pub fn parse_cidr(s: &str) -> Result<Ipv4Cidr, String> {
    let (ip, len) = s
        .split_once('/')
        .ok_or_else(|| format!("'{s}' is not A.B.C.D/LEN (for example 10.77.0.2/24)"))?;
    let ip: Ipv4Addr = ip
        .parse()
        .map_err(|_| format!("'{ip}' is not an IPv4 address"))?;
    let len: u8 = (len.parse().ok())
        .filter(|l| (1..=32).contains(l))
        .ok_or_else(|| format!("'{len}' is not a prefix length from 1 to 32"))?;
    Ok(Ipv4Cidr::new(ip, len))
}

/// `02:00:00:00:00:01`.
pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let bad = || format!("'{s}' is not a MAC address like 02:00:00:00:00:01");
    let bytes: Vec<u8> = (s.split(':').map(|p| u8::from_str_radix(p, 16)))
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    bytes.try_into().map_err(|_| bad())
}

/// The CPUs of `--cores`, in the order given (shard `i` runs on the `i`th).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreList(pub Vec<usize>);

/// `0,1` or `2-5`: the CPUs of `--cores`.
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
    Ok(CoreList(cores))
}

/// A flag that Ctrl-C or SIGTERM sets: hand it to `Builder::run` (the loop
/// stops at its next iteration), or check it in your own loop.
pub fn stop_on_signal() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || flag.store(true, std::sync::atomic::Ordering::Relaxed))?;
    Ok(stop)
}

/// Log through `tracing` to stderr (warnings by default; `RUST_LOG=info`
/// shows what the runtime reports, such as the DPDK port it opened).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// The process's exit: the example's own code, or one line `NAME: reason`
/// on stderr and status 2 (a bad flag, a backend that cannot open...).
pub fn exit(name: &str, result: Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{name}: {e:#}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn parses_flags() {
        let c = parse_cidr("10.77.0.2/24").unwrap();
        assert_eq!(
            (c.address(), c.prefix_len()),
            (Ipv4Addr::new(10, 77, 0, 2), 24)
        );
        assert!(parse_cidr("10.77.0.2").is_err());
        assert!(parse_cidr("10.77.0.2/33").is_err());
        assert_eq!(parse_mac("02:00:00:00:00:01").unwrap(), [2, 0, 0, 0, 0, 1]);
        assert!(parse_mac("02:00").is_err());
        assert_eq!(parse_cores("0,2-3").unwrap().0, vec![0, 2, 3]);
        assert!(parse_cores("3-1").is_err());
    }
}
