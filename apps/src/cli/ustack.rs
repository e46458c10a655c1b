//! The command line of `ustack` (the daemon, `exec`, `send`, `demo`):
//! its clap definition, shared by the binary and the man page and
//! completion generator (`packaging/docgen`).

use std::net::SocketAddrV4;

use clap::{Parser, Subcommand};
use ustack_runtime::config_file::ConfigArg;

use crate::net::NetArgs;

#[derive(Parser, Debug)]
#[command(
    name = "ustack",
    version,
    about = "Kernel-bypass userspace TCP/IP stack"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// The daemon: answers ARP and ping, serves TCP echo (7), discard (9)
    /// and iperf3 (5201, for a stock `iperf3 -c` or `uperf -c`), and the
    /// RDMA UD ping responder (RoCEv2, QPN 2, Q_Key 0x11111111, for
    /// `uping --rdma`). Stops on Ctrl-C or SIGTERM and prints its counters.
    Run(RunArgs),
    /// Send a verified byte stream to a TCP server and report goodput.
    Send(SendArgs),
    /// Two stacks on the simulated link: ARP, pings and UDP echo, with live progress.
    /// Needs no root, no NIC and no system library.
    Demo(DemoArgs),
    /// Run an unmodified program with its AF_INET sockets on ustack
    /// (LD_PRELOAD of libustack_preload.so): `ustack exec NET -- PROGRAM ARGS...`.
    Exec(ExecArgs),
}

/// How long a waiting thread drives the stack before it sleeps, unless
/// `--spin` says otherwise (see ARCHITECTURE.md, "Unmodified programs").
pub const SPIN_DEFAULT_US: u32 = 50;

#[derive(clap::Args, Debug)]
pub struct ExecArgs {
    #[command(flatten)]
    pub net: NetArgs,
    /// Who keeps the stack when the program forks: the parent (a server
    /// that forks helpers, as redis's BGSAVE), the child (a master that
    /// forks the one worker serving its sockets, as nginx with one worker),
    /// or each child a stack of its own (a master that forks `--workers`
    /// workers sharing `reuseport` listeners, as nginx with several).
    #[arg(long, value_enum, default_value = "parent")]
    pub fork: ForkOwner,
    /// With `--fork each`: how many workers the program forks. Each runs
    /// its own stack on the interface and serves the connections whose
    /// flow hash names it.
    #[arg(long, value_name = "N", required_if_eq("fork", "each"),
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub workers: Option<u32>,
    /// Run to completion: a thread that is about to wait (recv, accept,
    /// poll, epoll_wait) first drives the stack itself for up to this many
    /// microseconds (burning its CPU), and sleeps only after that; 0 leaves
    /// all polling to the stack's own thread.
    #[arg(long, value_name = "US", default_value_t = SPIN_DEFAULT_US,
          value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub spin: u32,
    /// Run the program as this user (as root): it starts with that user's
    /// ids and groups and with CAP_NET_RAW and CAP_NET_ADMIN as ambient
    /// capabilities (through util-linux `setpriv`), which are what the
    /// stack needs to open its pcap interface at the first socket; the
    /// loader still honours LD_PRELOAD, as it would not for a setuid or
    /// file-capability binary. For programs that refuse root (postgres).
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// Share one stack with the other programs started with the same
    /// name (several programs on one interface and address, each on its
    /// own ports): the first of them to open a socket runs the stack, with
    /// its NET flags; the others join it (their NET flags are checked but
    /// not used) and reach it over a channel.
    #[arg(long, value_name = "NAME", value_parser = stack_name)]
    pub stack: Option<String>,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "PROGRAM ARGS")]
    pub program: Vec<String>,
}

/// A `--stack` name: 1 to 64 letters, digits, `-`, `_` or `.`.
pub fn stack_name(s: &str) -> Result<String, String> {
    let ok = (1..=64).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(s.to_string())
    } else {
        Err("1 to 64 letters, digits, '-', '_' or '.'".into())
    }
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub net: NetArgs,
    #[command(flatten)]
    pub config: ConfigArg,
    /// Show the live monitor (utop) in this terminal while the daemon runs.
    #[arg(long)]
    pub tui: bool,
    /// Stop after this many seconds.
    #[arg(long, value_parser = positive_secs)]
    pub duration: Option<f64>,
}

#[derive(clap::Args, Debug)]
pub struct SendArgs {
    #[command(flatten)]
    pub net: NetArgs,
    /// Server to send to.
    #[arg(long, value_name = "A.B.C.D:PORT", value_parser = server_addr)]
    pub to: SocketAddrV4,
    /// Bytes to send, with an optional K, M, G or T suffix (1024-based, as
    /// iperf3's -n): 64M, 1G.
    #[arg(long, value_name = "BYTES", default_value = "64M", value_parser = byte_count)]
    pub bytes: u64,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 120.0, value_parser = positive_secs)]
    pub timeout: f64,
}

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 10.0, value_parser = positive_secs)]
    pub duration: f64,
    /// Plain line output instead of the live monitor (the monitor shows
    /// only when stdout is a terminal).
    #[arg(long)]
    pub no_tui: bool,
    /// Publish telemetry: host A on PATH, host B beside it (`PATH-b`).
    #[arg(long, value_name = "PATH")]
    pub telemetry: Option<std::path::PathBuf>,
    /// Loss on the simulated wire, in percent (each direction).
    #[arg(long, default_value_t = 0.0, value_parser = percent)]
    pub loss: f64,
    /// One-way delay of the simulated wire, in milliseconds.
    #[arg(long, default_value_t = 0.0, value_parser = non_negative)]
    pub delay: f64,
    /// Interval between pings, in milliseconds.
    #[arg(long, default_value_t = 10.0, value_parser = positive_ms)]
    pub interval: f64,
    /// Seed of the wire's impairments.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Size of the TCP bulk transfer from A to B, in MiB (0 for none).
    #[arg(long, default_value_t = 1024)]
    pub tcp_mib: u64,
}

/// `ustack exec --fork`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForkOwner {
    /// The parent keeps the stack.
    Parent,
    /// The stack moves to the child.
    Child,
    /// Each child starts a stack of its own (with `--workers`).
    Each,
}

/// A positive number of seconds.
pub fn positive_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("'{s}' is not a positive number of seconds")),
    }
}

/// `A.B.C.D:PORT` with a port a server can listen on (not 0).
pub fn server_addr(s: &str) -> Result<SocketAddrV4, String> {
    let a: SocketAddrV4 = s
        .parse()
        .map_err(|_| format!("'{s}' is not A.B.C.D:PORT (for example 10.77.0.1:9)"))?;
    if a.port() == 0 {
        return Err(format!("'{s}': port 0 is not a port a server listens on"));
    }
    Ok(a)
}

/// A byte count: digits with an optional K, M, G or T (1024-based).
pub fn byte_count(s: &str) -> Result<u64, String> {
    let bad = || format!("'{s}' is not a byte count like 1048576, 512K, 64M or 1G");
    let (num, shift) = match s.as_bytes().last().map(u8::to_ascii_uppercase) {
        Some(b'K') => (&s[..s.len() - 1], 10),
        Some(b'M') => (&s[..s.len() - 1], 20),
        Some(b'G') => (&s[..s.len() - 1], 30),
        Some(b'T') => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    let v = n.checked_mul(1u64 << shift).ok_or_else(bad)?;
    if v == 0 {
        return Err(format!("'{s}': there must be at least one byte to send"));
    }
    Ok(v)
}

/// An interval of at least 0.01 ms.
pub fn positive_ms(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v >= 0.01 && v.is_finite() => Ok(v),
        _ => Err(format!("'{s}' is not an interval of at least 0.01 ms")),
    }
}

/// A number of 0 or more.
pub fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v >= 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("'{s}' is not a non-negative number")),
    }
}

/// A percentage from 0 to 100.
pub fn percent(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=100.0).contains(&v) => Ok(v),
        _ => Err(format!("'{s}' is not a percentage between 0 and 100")),
    }
}
