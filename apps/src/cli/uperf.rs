//! The command line of `uperf`: its clap definition and the checks clap
//! cannot express, shared by the binary and the man page and completion
//! generator (`packaging/docgen`).

use std::net::IpAddr;

use clap::Parser;
use ustack_runtime::config_file::ConfigArg;

use crate::net::NetArgs;

#[derive(Parser, Debug)]
#[command(
    name = "uperf",
    version,
    about = "iperf3-compatible throughput tests over ustack",
    group(clap::ArgGroup::new("mode").required(true).args(["server", "client"]))
)]
pub struct Cli {
    #[command(flatten)]
    pub net: NetArgs,
    #[command(flatten)]
    pub config: ConfigArg,
    /// Run as a server (a stock `iperf3 -c` or `uperf -c` is the client).
    #[arg(short = 's', long = "server")]
    pub server: bool,
    /// Run as a client of the server at HOST (a stock `iperf3 -s` or `uperf -s`).
    #[arg(short = 'c', long = "client", value_name = "HOST")]
    pub client: Option<IpAddr>,
    /// Server port (5201; 7, the echo service, with --rr).
    #[arg(short = 'p', long = "port", value_parser = clap::value_parser!(u16).range(1..))]
    pub port: Option<u16>,
    /// Server: serve one test, then exit.
    #[arg(short = '1', long = "one-off", conflicts_with = "client")]
    pub one_off: bool,
    /// Client: seconds to transmit for.
    #[arg(short = 't', long = "time", default_value_t = 10.0, value_parser = seconds, conflicts_with = "server")]
    pub time: f64,
    /// Client: number of parallel streams.
    #[arg(short = 'P', long = "parallel", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=128), conflicts_with = "server")]
    pub parallel: u16,
    /// Client: reverse mode, the server sends.
    #[arg(short = 'R', long = "reverse", conflicts_with = "server")]
    pub reverse: bool,
    /// Client: length of a write, with an optional K or M suffix (iperf3's 128K
    /// by default; with --rr the request size, 64 by default).
    #[arg(short = 'l', long = "length", value_parser = length, conflicts_with = "server")]
    pub len: Option<usize>,
    /// Client: TCP request/response against an echo service (port 7 of
    /// `ustack run`): send -l bytes, wait for the echo, repeat for -t seconds;
    /// prints p50/p99/max latency and transactions/s.
    #[arg(long, conflicts_with_all = ["server", "rdma", "reverse", "parallel"], requires = "client")]
    pub rr: bool,
    /// Client: seconds between interval reports (0 turns them off).
    #[arg(short = 'i', long = "interval", default_value_t = 1.0, value_parser = seconds_or_zero)]
    pub interval: f64,
    /// Output in JSON, as iperf3 -J (a server prints one object per test).
    #[arg(short = 'J', long = "json")]
    pub json: bool,
    /// Client: give up connecting after this many milliseconds.
    #[arg(
        long = "connect-timeout",
        value_name = "MS",
        default_value_t = 5000,
        conflicts_with = "server"
    )]
    pub connect_timeout: u64,
    /// RDMA over RoCEv2 spoken by the stack: `ud` (the default when bare) sweeps
    /// UD message sizes like ib_send_bw (client) or is the UD sink (server);
    /// `rc` runs perftest's RC tests (ib_send/write/read_bw/lat -c RC) against
    /// stock perftest or another uperf, both roles (see --op, --latency, --size, -a).
    #[arg(long, value_name = "ud|rc", num_args = 0..=1, default_missing_value = "ud", value_enum)]
    pub rdma: Option<RdmaKind>,
    /// With --rdma rc: the verb, as ib_send_*, ib_write_* or ib_read_*.
    #[arg(long, value_name = "send|write|read", value_parser = clap::value_parser!(RcOpArg))]
    pub op: Option<RcOpArg>,
    /// With --rdma rc: message size in bytes (perftest's -s; K or M suffix;
    /// 65536 for bw and 2 for lat by default; both sides must agree).
    #[arg(long = "size", value_name = "BYTES", value_parser = rc_size, conflicts_with_all = ["len", "all"])]
    pub size: Option<usize>,
    /// With --rdma (UD): the sink's QP number (client), or the QPN to serve on (server).
    #[arg(long, value_name = "N", default_value = crate::rdma::DEFAULT_QPN_STR, value_parser = crate::rdma::parse_qpn, requires = "rdma")]
    pub qpn: u32,
    /// With --rdma: the Q_Key (perftest's default).
    #[arg(long, value_name = "K", default_value = crate::rdma::DEFAULT_QKEY_STR, value_parser = crate::rdma::parse_u32, requires = "rdma")]
    pub qkey: u32,
    /// With --rdma: messages per size.
    #[arg(short = 'n', long = "iters", value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..), requires = "rdma")]
    pub iters: u64,
    /// With --rdma: speak perftest's exchange (TCP port 18515 by default):
    /// the client runs against a stock `ib_send_bw -c UD` server, the server
    /// serves stock `ib_send_bw -c UD` clients (both sides need the same -n and -a).
    #[arg(long, requires = "rdma")]
    pub perftest: bool,
    /// With --perftest or --rdma rc: the latency test (`ib_send_lat -c UD`,
    /// `ib_*_lat -c RC`) instead of the bandwidth test.
    #[arg(long)]
    pub latency: bool,
    /// With --perftest or --rdma rc: every message size from 2 bytes to the MTU
    /// (UD) or to 8 MiB (RC), perftest's -a.
    #[arg(short = 'a', long = "all", conflicts_with = "len")]
    pub all: bool,
    /// With --perftest: seconds to wait for a UD message before giving up (the
    /// latency test's reply; the bandwidth server's next message, after which
    /// it reports what arrived); with --rdma rc: seconds a data phase may go
    /// without progress.
    #[arg(short = 'W', long = "timeout", value_name = "S", default_value_t = 5.0, value_parser = seconds)]
    pub timeout: f64,
    /// With --perftest or --rdma rc: our GID is our IPv6 address (perftest's
    /// --ipv6; the stock side gives its IPv6 GID's index with -x). A server
    /// answers in the family of the client's GID without it.
    #[arg(long = "ipv6")]
    pub ipv6_gid: bool,
    /// With --rdma: the traffic class of our packets (perftest's --tclass):
    /// the GRH traffic class, on the wire the IPv4 TOS byte (DSCP << 2 |
    /// ECN) or the IPv6 traffic class.
    #[arg(long, value_name = "TC", default_value_t = 0, requires = "rdma")]
    pub tclass: u8,
}

/// `--rdma`'s transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RdmaKind {
    /// Unreliable Datagram.
    Ud,
    /// Reliable Connected (perftest's tests).
    Rc,
}

/// `--op`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RcOpArg {
    /// SEND / RECV (ib_send_bw, ib_send_lat).
    Send,
    /// RDMA WRITE (ib_write_bw, ib_write_lat).
    Write,
    /// RDMA READ (ib_read_bw, ib_read_lat).
    Read,
}

/// An RC message size: bytes, or K/M (1024-based), 1 byte to 1 GiB.
pub fn rc_size(s: &str) -> Result<usize, String> {
    let (num, mult) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 1024),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    let max = crate::perftest_rc::MAX_SIZE;
    match num.parse::<usize>() {
        Ok(n) if n >= 1 && n.saturating_mul(mult) <= max => Ok(n * mult),
        _ => Err(format!("'{s}' is not a size from 1 byte to 1G")),
    }
}

/// Flag combinations clap cannot express, checked after parsing: one line
/// saying what is wrong.
pub fn check_flags(cli: &Cli, given: &dyn Fn(&str) -> bool) -> Result<(), String> {
    let rc = cli.rdma == Some(RdmaKind::Rc);
    let perftest_like = cli.perftest || rc;
    if rc {
        for (id, flag) in [("qpn", "--qpn"), ("qkey", "--qkey")] {
            if given(id) {
                return Err(format!("{flag} is for --rdma ud, not --rdma rc"));
            }
        }
    } else {
        if cli.op.is_some() {
            return Err("--op needs --rdma rc".to_string());
        }
        if cli.size.is_some() {
            return Err("--size needs --rdma rc".to_string());
        }
    }
    if !perftest_like {
        for (on, flag) in [
            (cli.latency, "--latency"),
            (cli.all, "-a"),
            (cli.ipv6_gid, "--ipv6"),
            (given("timeout"), "-W"),
        ] {
            if on {
                return Err(format!("{flag} needs --perftest or --rdma rc"));
            }
        }
    }
    Ok(())
}

/// Parse and check the command line.
pub fn parse_args<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::{CommandFactory, FromArgMatches};
    let m = Cli::command().try_get_matches_from(args)?;
    let cli = Cli::from_arg_matches(&m)?;
    let given = |id: &str| m.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    check_flags(&cli, &given)
        .map_err(|e| Cli::command().error(clap::error::ErrorKind::ArgumentConflict, e))?;
    Ok(cli)
}

/// A test length: more than 0 and at most a day, in seconds.
pub fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 86_400.0 => Ok(v),
        _ => Err(format!(
            "'{s}' is not a test length: give more than 0 and at most 86400 seconds"
        )),
    }
}

/// 0, or a report interval from 0.1 to 60 seconds.
pub fn seconds_or_zero(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(0.0) => Ok(0.0),
        Ok(v) if (0.1..=60.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "'{s}' is not 0 or an interval from 0.1 to 60 seconds"
        )),
    }
}

/// iperf3's length syntax: bytes, or K/M (1024-based).
pub fn length(s: &str) -> Result<usize, String> {
    let (num, mult) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 1024),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    match num.parse::<usize>() {
        Ok(n) if n >= 1 && n * mult <= 1 << 20 => Ok(n * mult),
        _ => Err(format!("'{s}' is not a length from 1 byte to 1M")),
    }
}
