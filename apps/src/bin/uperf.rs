//! `uperf`: an iperf3-compatible throughput tool over a ustack instance.
#![forbid(unsafe_code)]

use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Parser;
use ustack::device::Device;
use ustack::node::{App, Control, Node};
use ustack::{Instant, Stack};
use ustack_apps::iperf_client::{ClientConfig, IperfClient};
use ustack_apps::iperf_server::IperfServer;
use ustack_apps::net::{NetArgs, NodeUser, with_node};
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
    client: Option<Ipv4Addr>,
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
    /// RDMA UD (RoCEv2): client sweeps message sizes like ib_send_bw; server is the UD sink.
    #[arg(long)]
    rdma: bool,
    /// With --rdma: the sink's QP number (client), or the QPN to serve on (server).
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
    /// With --perftest: the latency test (`ib_send_lat -c UD`) instead of the
    /// bandwidth test.
    #[arg(long, requires = "perftest")]
    latency: bool,
    /// With --perftest: every message size from 2 bytes to the MTU (perftest's -a).
    #[arg(
        short = 'a',
        long = "all",
        requires = "perftest",
        conflicts_with = "len"
    )]
    all: bool,
    /// With --perftest: seconds to wait for a UD message before giving up (the
    /// latency test's reply; the bandwidth server's next message, after which
    /// it reports what arrived).
    #[arg(short = 'W', long = "timeout", value_name = "S", default_value_t = 5.0, value_parser = seconds, requires = "perftest")]
    timeout: f64,
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

impl NodeUser for Run<'_> {
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
            server: SocketAddrV4::new(host, cli.port.unwrap_or(5201)),
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
    host: Ipv4Addr,
    mut node: Node<D>,
    lcfg: &runtime::LoopConfig,
    tele: &ustack_apps::telemetry::Telemetry,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<ExitCode> {
    use ustack_apps::rr::{RrClient, RrConfig};
    let mut client = RrClient::new(RrConfig {
        server: SocketAddrV4::new(host, cli.port.unwrap_or(7)),
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
    let role = match cli.client {
        Some(host) => PerftestRole::Client(server_addr(host, cli.port)),
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.perftest {
        return ustack_apps::exit("uperf", with_node(&cli.net, perftest_user(&cli)));
    }
    if cli.rdma {
        use ustack_apps::rdma::{BwOpts, BwUser, SinkUser};
        let r = match cli.client {
            Some(dst) => with_node(
                &cli.net,
                BwUser(BwOpts {
                    dst,
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
        assert!(Cli::try_parse_from(["uperf", "--sim", "-s", "--perftest"]).is_err());
        assert!(Cli::try_parse_from(["uperf", "--sim", "-s", "--rdma", "--latency"]).is_err());
        assert!(Cli::try_parse_from(["uperf", "--sim", "-s", "--rdma", "-a"]).is_err());
        assert!(Cli::try_parse_from(["uperf", "--sim", "-s", "--rdma", "-W", "1"]).is_err());
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
