//! `uperf`: an iperf3-compatible throughput tool over a ustack instance.
#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Parser;
use ustack::node::{App, Control, Node};
use ustack::phy::device::Device;
use ustack::{Instant, Stack};
use ustack_apps::iperf_client::{ClientConfig, IperfClient};
use ustack_apps::iperf_server::IperfServer;
use ustack_apps::net::{NetArgs, NodeRunner, with_node};
use ustack_runtime as runtime;
use ustack_runtime::clock::Clock;

#[derive(Parser, Debug)]
#[command(
    name = "uperf",
    version,
    about = "iperf3-compatible throughput tests over ustack",
    group(clap::ArgGroup::new("mode").required(true).args(["server", "client"]))
)]
struct Cli {
    #[command(flatten)]
    net: NetArgs,
    /// Run as a server (a stock `iperf3 -c` or `uperf -c` is the client).
    #[arg(short = 's', long = "server")]
    server: bool,
    /// Run as a client of the server at HOST (a stock `iperf3 -s` or `uperf -s`).
    #[arg(short = 'c', long = "client", value_name = "HOST")]
    client: Option<IpAddr>,
    /// Server port (5201; 7, the echo service, with --rr).
    #[arg(short = 'p', long = "port", value_parser = clap::value_parser!(u16).range(1..))]
    port: Option<u16>,
    /// Server: serve one test, then exit.
    #[arg(short = '1', long = "one-off", conflicts_with = "client")]
    one_off: bool,
    /// Client: seconds to transmit for.
    #[arg(short = 't', long = "time", default_value_t = 10.0, value_parser = seconds, conflicts_with = "server")]
    time: f64,
    /// Client: number of parallel streams.
    #[arg(short = 'P', long = "parallel", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=128), conflicts_with = "server")]
    parallel: u16,
    /// Client: reverse mode, the server sends.
    #[arg(short = 'R', long = "reverse", conflicts_with = "server")]
    reverse: bool,
    /// Client: length of a write, with an optional K or M suffix (iperf3's 128K
    /// by default; with --rr the request size, 64 by default).
    #[arg(short = 'l', long = "length", value_parser = length, conflicts_with = "server")]
    len: Option<usize>,
    /// Client: TCP request/response against an echo service (port 7 of
    /// `ustack run`): send -l bytes, wait for the echo, repeat for -t seconds;
    /// prints p50/p99/max latency and transactions/s.
    #[arg(long, conflicts_with_all = ["server", "rdma", "reverse", "parallel"], requires = "client")]
    rr: bool,
    /// Client: seconds between interval reports (0 turns them off).
    #[arg(short = 'i', long = "interval", default_value_t = 1.0, value_parser = seconds_or_zero)]
    interval: f64,
    /// Output in JSON, as iperf3 -J (a server prints one object per test).
    #[arg(short = 'J', long = "json")]
    json: bool,
    /// Client: give up connecting after this many milliseconds.
    #[arg(
        long = "connect-timeout",
        value_name = "MS",
        default_value_t = 5000,
        conflicts_with = "server"
    )]
    connect_timeout: u64,
    /// RDMA over RoCEv2 spoken by the stack: `ud` (the default when bare) sweeps
    /// UD message sizes like ib_send_bw (client) or is the UD sink (server);
    /// `rc` runs perftest's RC tests (ib_send/write/read_bw/lat -c RC) against
    /// stock perftest or another uperf, both roles (see --op, --latency, --size, -a).
    #[arg(long, value_name = "ud|rc", num_args = 0..=1, default_missing_value = "ud", value_enum)]
    rdma: Option<RdmaKind>,
    /// With --rdma rc: the verb, as ib_send_*, ib_write_* or ib_read_*.
    #[arg(long, value_name = "send|write|read", value_parser = clap::value_parser!(RcOpArg))]
    op: Option<RcOpArg>,
    /// With --rdma rc: message size in bytes (perftest's -s; K or M suffix;
    /// 65536 for bw and 2 for lat by default; both sides must agree).
    #[arg(long = "size", value_name = "BYTES", value_parser = rc_size, conflicts_with_all = ["len", "all"])]
    size: Option<usize>,
    /// With --rdma (UD): the sink's QP number (client), or the QPN to serve on (server).
    #[arg(long, value_name = "N", default_value = ustack_apps::rdma::DEFAULT_QPN_STR, value_parser = ustack_apps::rdma::parse_qpn, requires = "rdma")]
    qpn: u32,
    /// With --rdma: the Q_Key (perftest's default).
    #[arg(long, value_name = "K", default_value = ustack_apps::rdma::DEFAULT_QKEY_STR, value_parser = ustack_apps::rdma::parse_u32, requires = "rdma")]
    qkey: u32,
    /// With --rdma: messages per size.
    #[arg(short = 'n', long = "iters", value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..), requires = "rdma")]
    iters: u64,
    /// With --rdma: speak perftest's exchange (TCP port 18515 by default):
    /// the client runs against a stock `ib_send_bw -c UD` server, the server
    /// serves stock `ib_send_bw -c UD` clients (both sides need the same -n and -a).
    #[arg(long, requires = "rdma")]
    perftest: bool,
    /// With --perftest or --rdma rc: the latency test (`ib_send_lat -c UD`,
    /// `ib_*_lat -c RC`) instead of the bandwidth test.
    #[arg(long)]
    latency: bool,
    /// With --perftest or --rdma rc: every message size from 2 bytes to the MTU
    /// (UD) or to 8 MiB (RC), perftest's -a.
    #[arg(short = 'a', long = "all", conflicts_with = "len")]
    all: bool,
    /// With --perftest: seconds to wait for a UD message before giving up (the
    /// latency test's reply; the bandwidth server's next message, after which
    /// it reports what arrived); with --rdma rc: seconds a data phase may go
    /// without progress.
    #[arg(short = 'W', long = "timeout", value_name = "S", default_value_t = 5.0, value_parser = seconds)]
    timeout: f64,
    /// With --perftest or --rdma rc: our GID is our IPv6 address (perftest's
    /// --ipv6; the stock side gives its IPv6 GID's index with -x). A server
    /// answers in the family of the client's GID without it.
    #[arg(long = "ipv6")]
    ipv6_gid: bool,
}

/// `--rdma`'s transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum RdmaKind {
    /// Unreliable Datagram.
    Ud,
    /// Reliable Connected (perftest's tests).
    Rc,
}

/// `--op`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum RcOpArg {
    /// SEND / RECV (ib_send_bw, ib_send_lat).
    Send,
    /// RDMA WRITE (ib_write_bw, ib_write_lat).
    Write,
    /// RDMA READ (ib_read_bw, ib_read_lat).
    Read,
}

/// An RC message size: bytes, or K/M (1024-based), 1 byte to 1 GiB.
fn rc_size(s: &str) -> Result<usize, String> {
    let (num, mult) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 1024),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    let max = ustack_apps::perftest_rc::MAX_SIZE;
    match num.parse::<usize>() {
        Ok(n) if n >= 1 && n.saturating_mul(mult) <= max => Ok(n * mult),
        _ => Err(format!("'{s}' is not a size from 1 byte to 1G")),
    }
}

/// Flag combinations clap cannot express, checked after parsing: one line
/// saying what is wrong.
fn check_flags(cli: &Cli, given: &dyn Fn(&str) -> bool) -> Result<(), String> {
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
fn parse_args<I, T>(args: I) -> Result<Cli, clap::Error>
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

fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 86_400.0 => Ok(v),
        _ => Err(format!(
            "'{s}' is not a test length: give more than 0 and at most 86400 seconds"
        )),
    }
}

fn seconds_or_zero(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(0.0) => Ok(0.0),
        Ok(v) if (0.1..=60.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "'{s}' is not 0 or an interval from 0.1 to 60 seconds"
        )),
    }
}

/// iperf3's length syntax: bytes, or K/M (1024-based).
fn length(s: &str) -> Result<usize, String> {
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

/// Prints the server's lines as they come.
struct ServerFront(IperfServer);

impl App for ServerFront {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let c = self.0.poll(now, stack);
        for line in self.0.output.drain(..) {
            ustack_apps::outln!("{line}");
        }
        c
    }
}

/// Prints the client's lines as they come (text mode).
struct ClientFront {
    client: IperfClient,
    json: bool,
}

impl App for ClientFront {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let c = self.client.poll(now, stack);
        for line in self.client.output.drain(..) {
            if !self.json {
                ustack_apps::outln!("{line}");
            }
        }
        c
    }
    fn poll_at(&self) -> Option<Instant> {
        self.client.poll_at()
    }
}

struct Run<'a>(&'a Cli);

impl NodeRunner for Run<'_> {
    type Output = ExitCode;
    type Error = anyhow::Error;
    fn run<D>(self, mut node: Node<D>) -> Result<ExitCode>
    where
        D: Device + Send + 'static,
        D::Buf: Send,
    {
        let cli = self.0;
        let stop = ustack_apps::stop_flag()?;
        let lcfg = cli.net.loop_config();
        let tele = ustack_apps::telemetry::Telemetry::start(&cli.net, "uperf")?;
        let Some(host) = cli.client else {
            let mut server = IperfServer::new(cli.port.unwrap_or(5201), cli.one_off);
            server.json = cli.json;
            let mut front = ServerFront(server);
            runtime::run(
                &mut node,
                &mut front,
                &lcfg,
                &Clock::new(),
                || stop.load(Ordering::Relaxed),
                |s| tele.publish(s),
            )?;
            if let Some(e) = front.0.error.take() {
                bail!("{e}");
            }
            return Ok(ExitCode::SUCCESS);
        };
        if cli.rr {
            return run_rr(cli, host, node, &lcfg, &tele, &stop);
        }
        let cfg = ClientConfig {
            server: SocketAddr::new(host, cli.port.unwrap_or(5201)),
            time: cli.time,
            parallel: usize::from(cli.parallel),
            reverse: cli.reverse,
            len: cli.len.unwrap_or(128 << 10),
            interval: cli.interval,
            connect_timeout: Duration::from_millis(cli.connect_timeout.max(1)),
        };
        let wall = std::time::SystemTime::now();
        // The client sees Ctrl-C itself, to tell the server before it stops.
        let mut front = ClientFront {
            client: IperfClient::new(cfg, Arc::clone(&stop)),
            json: cli.json,
        };
        let run = runtime::run(
            &mut node,
            &mut front,
            &lcfg,
            &Clock::new(),
            || false,
            |s| tele.publish(s),
        );
        let client = &front.client;
        if cli.json {
            let mut v = client.json(wall);
            if let Err(e) = &run {
                v["error"] = serde_json::json!(e.to_string());
            }
            ustack_apps::outln!(
                "{}",
                serde_json::to_string_pretty(&v).unwrap_or_else(|_| v.to_string())
            );
        }
        run?;
        match &client.error {
            Some(e) => {
                if !cli.json {
                    eprintln!("uperf: error - {e}");
                }
                Ok(ExitCode::from(1))
            }
            None if client.succeeded() => Ok(ExitCode::SUCCESS),
            None => {
                if !cli.json {
                    eprintln!("uperf: error - the test did not finish");
                }
                Ok(ExitCode::from(1))
            }
        }
    }
}

/// `uperf -c HOST --rr`: request/response against an echo service.
fn run_rr<D: Device>(
    cli: &Cli,
    host: IpAddr,
    mut node: Node<D>,
    lcfg: &runtime::LoopConfig,
    tele: &ustack_apps::telemetry::Telemetry,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<ExitCode> {
    use ustack_apps::rr::{RrClient, RrConfig};
    let mut client = RrClient::new(RrConfig {
        server: SocketAddr::new(host, cli.port.unwrap_or(7)),
        size: cli.len.unwrap_or(64),
        time: Duration::from_secs_f64(cli.time),
        connect_timeout: Duration::from_millis(cli.connect_timeout.max(1)),
    });
    runtime::run(
        &mut node,
        &mut client,
        lcfg,
        &Clock::new(),
        || stop.load(Ordering::Relaxed),
        |s| tele.publish(s),
    )?;
    if cli.json {
        ustack_apps::outln!("{}", client.json());
    } else if client.transactions > 0 {
        ustack_apps::outln!("{}", client.summary());
    }
    match &client.error {
        Some(e) => {
            if !cli.json {
                eprintln!("uperf: error - {e}");
            }
            Ok(ExitCode::from(1))
        }
        None if client.succeeded() && client.mismatched == 0 => Ok(ExitCode::SUCCESS),
        None => {
            if !cli.json {
                eprintln!("uperf: error - the test did not finish");
            }
            Ok(ExitCode::from(1))
        }
    }
}

/// The IPv4 address of an RDMA peer (a v4-mapped IPv6 one too); the
/// unspecified address for an IPv6 one (refused before it is used).
fn rdma_host(h: IpAddr) -> Ipv4Addr {
    match h {
        IpAddr::V4(a) => a,
        IpAddr::V6(a) => a.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED),
    }
}

/// `uperf --rdma --perftest`: the settings from the flags.
fn perftest_user(cli: &Cli) -> ustack_apps::perftest::PerftestUser {
    use ustack_apps::perftest::{PerftestConfig, PerftestRole, PerftestUser, Test, server_addr};
    let mut cfg = PerftestConfig::new(if cli.latency {
        Test::SendLat
    } else {
        Test::SendBw
    });
    cfg.iters = cli.iters;
    cfg.size = cli.len;
    cfg.all_sizes = cli.all;
    cfg.qkey = cli.qkey;
    cfg.timeout = Duration::from_secs_f64(cli.timeout);
    cfg.connect_timeout = Duration::from_millis(cli.connect_timeout.max(1));
    cfg.ipv6 = cli.ipv6_gid;
    let role = match cli.client {
        Some(host) => PerftestRole::Client(server_addr(rdma_host(host), cli.port)),
        None => PerftestRole::Server {
            port: cli.port.unwrap_or(ustack_apps::perftest::PERFTEST_PORT),
            one_off: cli.one_off,
        },
    };
    PerftestUser {
        cfg,
        role,
        lcfg: cli.net.loop_config(),
    }
}

/// `uperf --rdma rc`: the settings from the flags.
fn rc_user(cli: &Cli) -> ustack_apps::perftest_rc::RcUser {
    use ustack_apps::perftest_rc::{Op, RcConfig, RcRole, RcUser};
    let op = match cli.op.unwrap_or(RcOpArg::Send) {
        RcOpArg::Send => Op::Send,
        RcOpArg::Write => Op::Write,
        RcOpArg::Read => Op::Read,
    };
    let mut cfg = RcConfig::new(op, cli.latency);
    cfg.iters = cli.iters;
    cfg.size = cli.size.or(cli.len);
    cfg.all_sizes = cli.all;
    cfg.timeout = Duration::from_secs_f64(cli.timeout);
    cfg.connect_timeout = Duration::from_millis(cli.connect_timeout.max(1));
    cfg.ipv6 = cli.ipv6_gid;
    let role = match cli.client {
        Some(host) => RcRole::Client(ustack_apps::perftest::server_addr(
            rdma_host(host),
            cli.port,
        )),
        None => RcRole::Server {
            port: cli.port.unwrap_or(ustack_apps::perftest::PERFTEST_PORT),
            one_off: cli.one_off,
        },
    };
    RcUser {
        cfg,
        role,
        lcfg: cli.net.loop_config(),
    }
}

fn main() -> ExitCode {
    ustack_apps::print_notices();
    let cli = match parse_args(std::env::args_os()) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    // RC and perftest exchange their keys over IPv4 TCP here (the GIDs in
    // them may be IPv6: --ipv6); UD takes either family.
    if (cli.rdma == Some(RdmaKind::Rc) || cli.perftest)
        && cli.client.is_some_and(|h| rdma_host(h).is_unspecified())
    {
        eprintln!(
            "uperf: --rdma rc and --perftest need an IPv4 HOST (their exchange runs over IPv4 here; --ipv6 makes the GIDs IPv6; --rdma ud takes an IPv6 HOST)"
        );
        return ExitCode::from(2);
    }
    if cli.rdma == Some(RdmaKind::Rc) {
        return ustack_apps::exit("uperf", with_node(&cli.net, rc_user(&cli)));
    }
    if cli.perftest {
        return ustack_apps::exit("uperf", with_node(&cli.net, perftest_user(&cli)));
    }
    if cli.rdma.is_some() {
        use ustack_apps::rdma::{BwOpts, BwUser, SinkUser};
        let r = match cli.client {
            Some(dst) => with_node(
                &cli.net,
                BwUser(BwOpts {
                    dst: match dst {
                        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(dst, IpAddr::V4),
                        v4 => v4,
                    },
                    qpn: cli.qpn,
                    qkey: cli.qkey,
                    iterations: cli.iters,
                    size: None,
                    lcfg: cli.net.loop_config(),
                }),
            ),
            None => with_node(
                &cli.net,
                SinkUser {
                    qpn: cli.qpn,
                    qkey: cli.qkey,
                    lcfg: cli.net.loop_config(),
                },
            ),
        };
        return ustack_apps::exit("uperf", r);
    }
    ustack_apps::exit("uperf", with_node(&cli.net, Run(&cli)))
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn lengths_like_iperf3() {
        assert_eq!(length("128K"), Ok(131_072));
        assert_eq!(length("1M"), Ok(1 << 20));
        assert_eq!(length("1400"), Ok(1400));
        assert!(length("0").is_err());
        assert!(length("2M").is_err());
        assert!(length("abc").is_err());
    }

    #[test]
    fn rr_flags() {
        let c = Cli::try_parse_from(["uperf", "--sim", "-c", "10.0.0.1", "--rr"]).unwrap();
        assert!(c.rr);
        assert_eq!((c.port, c.len), (None, None), "defaults: port 7, 64 bytes");
        assert!(Cli::try_parse_from(["uperf", "--sim", "-s", "--rr"]).is_err());
        assert!(Cli::try_parse_from(["uperf", "--sim", "-c", "10.0.0.1", "--rr", "-R"]).is_err());
        assert!(
            Cli::try_parse_from(["uperf", "--sim", "-c", "10.0.0.1", "--rr", "--rdma"]).is_err()
        );
    }

    #[test]
    fn perftest_flags() {
        let c = Cli::try_parse_from([
            "uperf",
            "--sim",
            "-c",
            "10.0.0.1",
            "--rdma",
            "--perftest",
            "--latency",
            "-n",
            "200",
            "-l",
            "64",
        ])
        .unwrap();
        assert!(c.perftest && c.latency && !c.all);
        assert_eq!((c.iters, c.len, c.port), (200, Some(64), None));
        let c = Cli::try_parse_from(["uperf", "--sim", "-s", "--rdma", "--perftest", "-1", "-a"])
            .unwrap();
        assert!(c.perftest && c.all && c.one_off && !c.latency);
        assert_eq!(c.timeout, 5.0);
        // --perftest needs --rdma; --latency, -a and -W need --perftest.
        assert!(parse_args(["uperf", "--sim", "-s", "--perftest"]).is_err());
        assert!(parse_args(["uperf", "--sim", "-s", "--rdma", "--latency"]).is_err());
        assert!(parse_args(["uperf", "--sim", "-s", "--rdma", "-a"]).is_err());
        assert!(parse_args(["uperf", "--sim", "-s", "--rdma", "-W", "1"]).is_err());
        // -a sweeps sizes: no -l with it.
        assert!(
            Cli::try_parse_from([
                "uperf",
                "--sim",
                "-c",
                "10.0.0.1",
                "--rdma",
                "--perftest",
                "-a",
                "-l",
                "64"
            ])
            .is_err()
        );
    }

    #[test]
    fn rdma_takes_an_optional_transport() {
        // Bare --rdma stays UD, before another flag or at the end.
        let c = parse_args([
            "uperf", "--sim", "-c", "10.0.0.1", "--rdma", "--iters", "200",
        ])
        .unwrap();
        assert_eq!((c.rdma, c.iters), (Some(RdmaKind::Ud), 200));
        let c = parse_args(["uperf", "--sim", "-s", "--rdma"]).unwrap();
        assert_eq!(c.rdma, Some(RdmaKind::Ud));
        let c = parse_args(["uperf", "--sim", "-s", "--rdma", "ud", "--qpn", "0x20"]).unwrap();
        assert_eq!((c.rdma, c.qpn), (Some(RdmaKind::Ud), 0x20));
        assert!(parse_args(["uperf", "--sim", "-s", "--rdma", "xrc"]).is_err());
        let c = parse_args(["uperf", "--sim", "-c", "10.0.0.1"]).unwrap();
        assert_eq!(c.rdma, None);
    }

    #[test]
    fn rc_flags() {
        let c = parse_args([
            "uperf",
            "--sim",
            "-c",
            "10.0.0.1",
            "--rdma",
            "rc",
            "--op",
            "write",
            "--latency",
            "--size",
            "64K",
            "-n",
            "200",
        ])
        .unwrap();
        assert_eq!(c.rdma, Some(RdmaKind::Rc));
        assert_eq!(
            (c.op, c.size, c.iters),
            (Some(RcOpArg::Write), Some(65536), 200)
        );
        assert!(c.latency);
        let u = rc_user(&c);
        assert_eq!(u.cfg.name(), "write_lat");
        assert_eq!(u.cfg.size, Some(65536));
        assert!(matches!(u.role, ustack_apps::perftest_rc::RcRole::Client(a) if a.port() == 18515));
        let c = parse_args([
            "uperf", "--sim", "-s", "--rdma", "rc", "--op", "read", "-1", "-a",
        ])
        .unwrap();
        assert!(c.all && c.one_off);
        let u = rc_user(&c);
        assert_eq!(u.cfg.name(), "read_bw");
        assert!(u.cfg.all_sizes);
        // --op defaults to send.
        let c = parse_args(["uperf", "--sim", "-s", "--rdma", "rc"]).unwrap();
        assert_eq!(rc_user(&c).cfg.name(), "send_bw");
        // 8 MiB and more are RC sizes.
        assert_eq!(rc_size("8M"), Ok(8 << 20));
        assert!(rc_size("0").is_err() && rc_size("2048M").is_err() && rc_size("x").is_err());
        // RC flags need --rdma rc; UD flags do not go with it.
        assert!(parse_args(["uperf", "--sim", "-s", "--op", "write"]).is_err());
        assert!(parse_args(["uperf", "--sim", "-s", "--rdma", "--op", "write"]).is_err());
        assert!(parse_args(["uperf", "--sim", "-s", "--rdma", "ud", "--size", "64"]).is_err());
        assert!(parse_args(["uperf", "--sim", "-s", "--rdma", "rc", "--qpn", "0x20"]).is_err());
        assert!(parse_args(["uperf", "--sim", "-s", "--rdma", "rc", "--qkey", "1"]).is_err());
        assert!(parse_args(["uperf", "--sim", "-s", "--rdma", "rc", "--op", "atomic"]).is_err());
        assert!(
            parse_args([
                "uperf", "--sim", "-c", "1.2.3.4", "--rdma", "rc", "-a", "--size", "64"
            ])
            .is_err()
        );
        // The message is one line naming the flag.
        let e = parse_args(["uperf", "--sim", "-s", "--op", "read"])
            .unwrap_err()
            .to_string();
        assert!(
            e.lines().next().unwrap().contains("--op needs --rdma rc"),
            "{e}"
        );
        // --rr still refuses --rdma of either kind.
        assert!(parse_args(["uperf", "--sim", "-c", "1.2.3.4", "--rr", "--rdma", "rc"]).is_err());
    }

    #[test]
    fn flags_are_checked() {
        assert!(Cli::try_parse_from(["uperf", "--sim"]).is_err());
        assert!(Cli::try_parse_from(["uperf", "--sim", "-s", "-c", "10.0.0.1"]).is_err());
        assert!(Cli::try_parse_from(["uperf", "--sim", "-s", "-R"]).is_err());
        assert!(Cli::try_parse_from(["uperf", "--sim", "-c", "10.0.0.1", "-P", "0"]).is_err());
        assert!(Cli::try_parse_from(["uperf", "--sim", "-c", "host.example"]).is_err());
        let c = Cli::try_parse_from([
            "uperf", "--sim", "-c", "10.0.0.1", "-t", "2", "-P", "4", "-R", "-J",
        ])
        .unwrap();
        assert_eq!(
            (c.time, c.parallel, c.reverse, c.json),
            (2.0, 4, true, true)
        );
    }
}
