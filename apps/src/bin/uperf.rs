//! `uperf`: an iperf3-compatible throughput tool over a ustack instance.
#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::CommandFactory;
use ustack::node::{App, Control, Node};
use ustack::phy::device::Device;
use ustack::{Instant, Stack};
use ustack_apps::iperf_client::{ClientConfig, IperfClient};
use ustack_apps::iperf_server::IperfServer;
use ustack_apps::net::{NodeRunner, with_node};
use ustack_runtime as runtime;
use ustack_runtime::clock::Clock;

use ustack_apps::cli::uperf::*;

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
    cfg.tclass = cli.tclass;
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
    cfg.tclass = cli.tclass;
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
    let cli = match parse_args(ustack_apps::command_line("uperf", &Cli::command())) {
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
    use clap::Parser;

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
