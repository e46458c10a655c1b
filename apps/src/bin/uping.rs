//! `uping`: ICMP echo over a ustack instance, with iputils ping's options and output.
#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{CommandFactory, Parser};
use ustack::node::{App, Control, Node};
use ustack::phy::device::Device;
use ustack::{Instant, Stack};
use ustack_apps::net::{NodeRunner, with_node};
use ustack_kit::ping::{PingSummary, Pinger, PingerConfig, PingerEvent};
use ustack_runtime as runtime;
use ustack_runtime::clock::Clock;

use ustack_apps::cli::uping::*;

fn main() -> ExitCode {
    ustack_apps::print_notices();
    let cli = Cli::parse_from(ustack_apps::command_line("uping", &Cli::command()));
    ustack_apps::exit("uping", ping(&cli))
}

/// RTT as iputils prints a reply's time: more decimals for shorter times.
fn reply_time(d: Duration) -> String {
    // Rounded to the microsecond, like the summary, so the two agree.
    let us = (d.as_nanos() + 500) / 1000;
    match us {
        100_000.. => format!("{}", us / 1000),
        10_000.. => format!("{}.{:01}", us / 1000, (us % 1000) / 100),
        1_000.. => format!("{}.{:02}", us / 1000, (us % 1000) / 10),
        _ => format!("{}.{:03}", us / 1000, us % 1000),
    }
}

/// Prints reply lines as they come and stops on Ctrl-C.
struct Front {
    pinger: Pinger,
    quiet: bool,
    json: bool,
    replies: Vec<serde_json::Value>,
    /// Requests answered (replies or ICMP errors) or reported unreachable.
    answered: std::collections::HashSet<u16>,
    /// Requests reported unreachable because ARP for the next hop failed.
    unreachable: u64,
    /// Requests up to this one have been looked at for an ARP failure.
    reported_upto: u64,
    /// The ARP failures counted so far (`arp.unresolved`).
    arp_failures: u64,
    next_arp_check: Instant,
}

/// How often the front looks for a failed ARP resolution.
const ARP_CHECK: Duration = Duration::from_millis(100);

impl Front {
    fn new(pinger: Pinger, quiet: bool, json: bool) -> Front {
        Front {
            pinger,
            quiet,
            json,
            replies: Vec::new(),
            answered: std::collections::HashSet::new(),
            unreachable: 0,
            reported_upto: 0,
            arp_failures: 0,
            next_arp_check: Instant::ZERO,
        }
    }

    /// As Linux does when ARP for the next hop fails (its queued requests
    /// are dropped): `From <our ip> icmp_seq=N Destination Host Unreachable`
    /// for each request sent before the failure and not answered, counted as
    /// an error.
    fn check_arp(&mut self, now: Instant, stack: &Stack) {
        if now < self.next_arp_check {
            return;
        }
        self.next_arp_check = now + ARP_CHECK;
        let failures = stack.stats().arp.unresolved;
        if failures == self.arp_failures {
            return;
        }
        self.arp_failures = failures;
        // Neighbor discovery failures are not reported this way (yet).
        let IpAddr::V4(dst) = self.pinger.config().dst else {
            return;
        };
        let cfg = stack.config();
        let hop = if cfg.ip.contains_addr(&dst) {
            Some(dst)
        } else {
            cfg.gateway
        };
        if hop.is_some_and(|h| {
            stack
                .addr_ref()
                .neighbours(now)
                .iter()
                .any(|(ip, _)| *ip == h)
        }) {
            return; // another address failed, or it resolved since
        }
        let sent = self.pinger.summary().transmitted;
        for n in self.reported_upto + 1..=sent {
            let seq = (n % 65_536) as u16;
            if !self.answered.insert(seq) {
                continue;
            }
            self.unreachable += 1;
            if !self.quiet && !self.json {
                ustack_apps::outln!(
                    "From {} icmp_seq={seq} Destination Host Unreachable",
                    stack.ip()
                );
            }
        }
        self.reported_upto = sent;
    }

    /// Every request of a counted run sent and answered one way or another
    /// (iputils stops when replies + errors reach the count).
    fn all_answered(&self) -> bool {
        let s = self.pinger.summary();
        self.pinger
            .config()
            .count
            .is_some_and(|c| s.transmitted >= c && s.received + s.errors + self.unreachable >= c)
    }
}

impl App for Front {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let ctl = self.pinger.poll(now, stack);
        let events: Vec<PingerEvent> = self.pinger.drain_events().collect();
        for ev in events {
            match ev {
                PingerEvent::Reply { reply, duplicate } => {
                    if !duplicate && !self.answered.insert(reply.seq) {
                        continue; // reported unreachable already
                    }
                    let time = reply.rtt();
                    if self.json {
                        self.replies.push(serde_json::json!({
                            "seq": reply.seq, "ttl": reply.ttl, "bytes": reply.bytes,
                            "time_ms": time.map(|t| t.as_secs_f64() * 1e3), "duplicate": duplicate,
                        }));
                    } else if !self.quiet {
                        let t = time
                            .map(|t| format!(" time={} ms", reply_time(t)))
                            .unwrap_or_default();
                        let dup = if duplicate { " (DUP!)" } else { "" };
                        ustack_apps::outln!(
                            "{} bytes from {}: icmp_seq={} ttl={}{t}{dup}",
                            reply.bytes,
                            reply.from,
                            reply.seq,
                            reply.ttl
                        );
                    }
                }
                PingerEvent::Unreachable { from, seq, code } => {
                    self.answered.insert(seq);
                    if !self.quiet && !self.json {
                        let what = match code {
                            0 => "Destination Net Unreachable",
                            1 => "Destination Host Unreachable",
                            2 => "Destination Protocol Unreachable",
                            3 => "Destination Port Unreachable",
                            _ => "Destination Unreachable",
                        };
                        ustack_apps::outln!("From {from} icmp_seq={seq} {what}");
                    }
                }
            }
        }
        if ctl == Control::Continue {
            self.check_arp(now, stack);
            if self.all_answered() {
                return Control::Exit;
            }
        }
        ctl
    }

    fn poll_at(&self) -> Option<Instant> {
        let p = self.pinger.poll_at();
        // While requests are out, look for an ARP failure now and then.
        let waiting = self.pinger.summary().transmitted > self.answered.len() as u64;
        ustack::time::earliest(p, waiting.then_some(self.next_arp_check))
    }

    fn rx_wait(&self) -> ustack::node::RxWait {
        self.pinger.rx_wait()
    }
}

struct Run<'a> {
    cli: &'a Cli,
    dst: IpAddr,
}

impl NodeRunner for Run<'_> {
    type Output = ExitCode;
    type Error = anyhow::Error;
    fn run<D>(self, mut node: Node<D>) -> Result<ExitCode>
    where
        D: Device + Send + 'static,
        D::Buf: Send,
    {
        let cli = self.cli;
        let mut cfg = PingerConfig::new(self.dst);
        cfg.count = cli.count;
        cfg.interval = Duration::from_secs_f64(cli.interval);
        cfg.size = cli.size();
        cfg.timeout = Duration::from_secs_f64(cli.timeout.unwrap_or(10.0));
        cfg.ident = (std::process::id() & 0xffff) as u16;
        let mut front = Front::new(Pinger::new(cfg), cli.quiet, cli.json);
        if !cli.json {
            // The size with the ICMP and IP headers, as iputils prints it.
            let headers = if self.dst.is_ipv6() { 48 } else { 28 };
            ustack_apps::outln!(
                "PING {dst} ({dst}) {}({}) bytes of data.",
                cli.size(),
                cli.size() + headers,
                dst = self.dst
            );
        }
        let stop = ustack_apps::stop_flag()?;
        let clock = Clock::new();
        let lcfg = cli.net.loop_config();
        let tele = ustack_apps::telemetry::Telemetry::start(&cli.net, "uping")?;
        runtime::run(
            &mut node,
            &mut front,
            &lcfg,
            &clock,
            || stop.load(Ordering::Relaxed),
            |s| tele.publish(s),
        )?;
        if let Some(e) = front.pinger.error() {
            bail!("{}: {e}", self.dst);
        }
        let mut s = front.pinger.summary();
        s.errors += front.unreachable;
        // iputils' `time`: from the first request to the last one sent
        // (not to the end of the wait for replies).
        let elapsed = front
            .pinger
            .started()
            .zip(front.pinger.last_sent())
            .map_or(Duration::ZERO, |(a, b)| b.saturating_duration_since(a));
        if cli.json {
            ustack_apps::outln!("{}", json_summary(self.dst, &s, elapsed, front.replies));
        } else {
            print_summary(self.dst, &s, elapsed);
        }
        Ok(if s.received > 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        })
    }
}

fn print_summary(dst: IpAddr, s: &PingSummary, elapsed: Duration) {
    ustack_apps::out!(
        "{}",
        ustack_apps::report::ping_statistics(
            &dst.to_string(),
            "ping",
            [s.transmitted, s.received, s.duplicates, s.errors],
            &s.rtt,
            elapsed
        )
    );
}

fn json_summary(
    dst: IpAddr,
    s: &PingSummary,
    elapsed: Duration,
    replies: Vec<serde_json::Value>,
) -> serde_json::Value {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    serde_json::json!({
        "host": dst.to_string(),
        "transmitted": s.transmitted,
        "received": s.received,
        "duplicates": s.duplicates,
        "errors": s.errors,
        "loss_percent": s.loss_percent(),
        "time_ms": elapsed.as_millis() as u64,
        "rtt_ms": (s.rtt.count > 0).then(|| serde_json::json!({
            "min": ms(s.rtt.min), "avg": ms(s.rtt.avg()), "max": ms(s.rtt.max), "mdev": ms(s.rtt.mdev()),
        })),
        "replies": replies,
    })
}

fn ping(cli: &Cli) -> Result<ExitCode> {
    cli.check()?;
    if let Some(list) = &cli.pinglist {
        return mesh(cli, list);
    }
    if cli.rc() {
        return rc_pingpong(cli);
    }
    let host = cli.host.as_deref().unwrap_or_default();
    let any: IpAddr = host.parse().map_err(|_| {
        anyhow::anyhow!("{host}: not an IP address (uping does no name resolution)")
    })?;
    // With --pingpong, HOST is where the GIDs are exchanged (over TCP) and
    // -6 asks for IPv6 GIDs.
    let family_checked = !cli.pingpong;
    if family_checked && ((cli.ipv4 && any.is_ipv6()) || (cli.ipv6 && any.is_ipv4())) {
        bail!(
            "{host}: not an {} address (-{})",
            if cli.ipv4 { "IPv4" } else { "IPv6" },
            if cli.ipv4 { 4 } else { 6 }
        );
    }
    if cli.rdma.is_some() && !cli.pingpong {
        let opts = ustack_apps::rdma::PingOpts {
            dst: any,
            qpn: cli.qpn,
            qkey: cli.qkey,
            count: cli.count,
            interval: Duration::from_secs_f64(cli.interval),
            size: cli.size(),
            timeout: Duration::from_secs_f64(cli.timeout.unwrap_or(10.0)),
            quiet: cli.quiet,
            json: cli.json,
            tclass: cli.tclass.unwrap_or(0),
            lcfg: cli.net.loop_config(),
        };
        if cli.verbs {
            return ustack_apps::rdma::verbs_ping(&opts);
        }
        return with_node(&cli.net, ustack_apps::rdma::PingUser(opts));
    }
    let dst = match any {
        IpAddr::V4(a) => a,
        IpAddr::V6(_) if !cli.pingpong => {
            return with_node(&cli.net, Run { cli, dst: any });
        }
        IpAddr::V6(_) => {
            bail!("{host}: --pingpong exchanges GIDs with an IPv4 HOST (-6 for IPv6 GIDs)")
        }
    };
    if cli.pingpong {
        let opts = ustack_apps::pingpong::PingpongOpts {
            dst,
            port: cli.port,
            count: cli.count.unwrap_or(1000),
            size: cli.size(),
            timeout: Duration::from_secs_f64(cli.timeout.unwrap_or(10.0).min(5.0)),
            quiet: cli.quiet,
            ipv6: cli.ipv6,
            tclass: cli.tclass.unwrap_or(0),
            lcfg: cli.net.loop_config(),
        };
        return with_node(&cli.net, ustack_apps::pingpong::PingpongUser(opts));
    }
    with_node(
        &cli.net,
        Run {
            cli,
            dst: dst.into(),
        },
    )
}

/// `--rdma=rc --pingpong`: ibv_rc_pingpong's client (HOST) or server
/// (`--listen`).
fn rc_pingpong(cli: &Cli) -> Result<ExitCode> {
    use ustack_apps::pingpong_rc::{DEFAULT_ITERS, RcPingpongOpts, RcPingpongUser, Role};
    let role = if cli.listen {
        Role::Server(cli.port)
    } else {
        let host = cli.host.as_deref().unwrap_or_default();
        let dst: Ipv4Addr = host.parse().map_err(|_| {
            anyhow::anyhow!("{host}: not an IPv4 address (uping does no name resolution)")
        })?;
        Role::Client(std::net::SocketAddrV4::new(dst, cli.port))
    };
    let mut o = RcPingpongOpts::new(role);
    o.iters = cli.count.unwrap_or(DEFAULT_ITERS);
    o.size = cli.size();
    if let Some(m) = cli.path_mtu {
        o.mtu = m;
    }
    o.timeout = Duration::from_secs_f64(cli.timeout.unwrap_or(5.0));
    o.ipv6 = cli.ipv6;
    o.tclass = cli.tclass.unwrap_or(0);
    o.lcfg = cli.net.loop_config();
    with_node(&cli.net, RcPingpongUser(o))
}

/// Mesh mode: every (target, probe) of the ping list at `--rate` for
/// `--duration` (0: until stopped), the list re-read every
/// `--pinglist-refresh`, the metrics served with `--metrics`.
fn mesh(cli: &Cli, list: &str) -> Result<ExitCode> {
    use ustack_apps::mesh::{ListSource, MeshMetrics, Probe, Reloader};
    let source = ListSource::parse(list);
    let text = source.read().map_err(|e| anyhow::anyhow!("{e}"))?;
    let default_probe = if cli.rdma.is_some() {
        Probe::Ud
    } else {
        Probe::Icmp
    };
    let targets = ustack_apps::mesh::parse_pinglist_with(&text, default_probe)
        .map_err(|e| anyhow::anyhow!("{source}: {e}"))?;
    if cli.size() < 8 {
        bail!("mesh mode needs -s 8 or more (the request carries its send time)");
    }
    if cli.verbs {
        bail!("mesh mode over --verbs is not supported; use --rdma on the stack");
    }
    let metrics = std::sync::Arc::new(MeshMetrics::new());
    let cfg = ustack_apps::mesh::MeshConfig {
        targets,
        rate: cli.rate,
        duration: Duration::from_secs_f64(cli.duration),
        wait: Duration::from_secs_f64(cli.timeout.unwrap_or(2.0)),
        size: cli.size(),
        ident: (std::process::id() & 0xffff) as u16,
        ud_qpn: cli.qpn,
        ud_qkey: cli.qkey,
        ud_tclass: cli.tclass.unwrap_or(0),
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut pinger = ustack_apps::mesh::MeshPinger::new(cfg).with_metrics(metrics.clone());
    let reloader = if cli.pinglist_refresh > 0.0 {
        let (tx, rx) = std::sync::mpsc::channel();
        pinger = pinger.with_updates(rx);
        let r = Reloader {
            source,
            default_probe,
            every: Duration::from_secs_f64(cli.pinglist_refresh),
            current: text,
            errors: metrics.pinglist_errors.clone(),
            stop: stop.clone(),
        };
        Some(r.spawn(tx).context("starting the ping list thread")?)
    } else {
        None
    };
    let net = cli.net.builder()?.metrics_source(metrics).build()?;
    let result = ustack_runtime::net::with_node(&net, MeshRun { cli, pinger });
    stop.store(true, Ordering::Relaxed);
    if let Some(t) = reloader {
        let _ = t.join();
    }
    result
}

struct MeshRun<'a> {
    cli: &'a Cli,
    pinger: ustack_apps::mesh::MeshPinger,
}

impl NodeRunner for MeshRun<'_> {
    type Output = ExitCode;
    type Error = anyhow::Error;
    fn run<D>(self, mut node: Node<D>) -> Result<ExitCode>
    where
        D: Device + Send + 'static,
        D::Buf: Send,
    {
        let cli = self.cli;
        let mut pinger = self.pinger;
        if !cli.json && !cli.quiet {
            let until = if cli.duration > 0.0 {
                format!("for {} s", cli.duration)
            } else {
                "until stopped".into()
            };
            ustack_apps::outln!(
                "MESH {} targets, {} series, {} probes/s {until}, {} bytes of data.",
                pinger.targets().len(),
                pinger.stats.len(),
                cli.rate,
                cli.size()
            );
        }
        let tele = ustack_apps::telemetry::Telemetry::start(&cli.net, "uping")?;
        let mut agent = ustack_apps::mesh::MeshAgent::new(&mut pinger, cli.responder);
        ustack_apps::run_app(&mut node, &mut agent, &cli.net.loop_config(), Some(&tele))?;
        if let Some(e) = agent.responder_error() {
            bail!("--responder: {e}");
        }
        if let Some(e) = &pinger.error {
            bail!("{e}");
        }
        if cli.json {
            ustack_apps::outln!("{}", pinger.json());
        } else {
            ustack_apps::out!("{}", pinger.report());
        }
        Ok(if pinger.all_answered() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        })
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn reply_time_like_iputils() {
        assert_eq!(reply_time(Duration::from_micros(46)), "0.046");
        assert_eq!(reply_time(Duration::from_micros(1234)), "1.23");
        assert_eq!(reply_time(Duration::from_micros(12_345)), "12.3");
        assert_eq!(reply_time(Duration::from_micros(123_456)), "123");
        assert_eq!(reply_time(Duration::from_nanos(63_500)), "0.064");
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        let net = ["uping", "--sim", "--ip", "10.0.0.2/24"];
        Cli::try_parse_from(net.iter().chain(args))
    }

    #[test]
    fn bare_rdma_is_ud_and_takes_no_value() {
        let c = parse(&["--rdma", "10.0.0.1"]).unwrap();
        assert_eq!(c.rdma, Some(RdmaMode::Ud));
        assert_eq!(c.host.as_deref(), Some("10.0.0.1"));
        // require_equals: a following word is the host, never the mode.
        let c = parse(&["--rdma", "rc"]).unwrap();
        assert_eq!(
            (c.rdma, c.host.as_deref()),
            (Some(RdmaMode::Ud), Some("rc"))
        );
        assert!(parse(&["--rdma", "rc", "10.0.0.1"]).is_err());
        let c = parse(&["--rdma", "--qpn", "5", "-c", "3", "10.0.0.1"]).unwrap();
        assert_eq!((c.rdma, c.qpn, c.count), (Some(RdmaMode::Ud), 5, Some(3)));
        assert_eq!(parse(&["10.0.0.1"]).unwrap().rdma, None);
        assert_eq!(parse(&["10.0.0.1"]).unwrap().size(), 56);
    }

    #[test]
    fn rdma_takes_ud_or_rc_with_equals() {
        let c = parse(&["--rdma=ud", "--pingpong", "10.0.0.1"]).unwrap();
        assert_eq!(c.rdma, Some(RdmaMode::Ud));
        assert_eq!(c.size(), 1024, "ibv_ud_pingpong's -s");
        c.check().unwrap();
        let c = parse(&["--rdma=rc", "--pingpong", "-c", "200", "10.0.0.1"]).unwrap();
        assert_eq!(c.rdma, Some(RdmaMode::Rc));
        assert_eq!(c.size(), 4096, "ibv_rc_pingpong's -s");
        assert_eq!(c.port, 18515);
        c.check().unwrap();
        assert!(parse(&["--rdma=xx", "10.0.0.1"]).is_err());
        // Options of --rdma still need it.
        assert!(parse(&["--qpn", "5", "10.0.0.1"]).is_err());
    }

    #[test]
    fn tclass_and_responder_go_with_rdma_or_the_mesh() {
        let c = parse(&["--rdma", "--tclass", "104", "10.0.0.1"]).unwrap();
        assert_eq!(c.tclass, Some(104));
        c.check().unwrap();
        let c = parse(&["--pinglist", "l.txt", "--tclass", "3", "--responder"]).unwrap();
        assert!(c.responder);
        c.check().unwrap();
        let e = parse(&["--tclass", "3", "10.0.0.1"]).unwrap().check();
        assert!(e.unwrap_err().to_string().contains("--rdma or --pinglist"));
        assert!(parse(&["--rdma", "--tclass", "256", "10.0.0.1"]).is_err());
        let e = parse(&["--responder", "10.0.0.1"]).unwrap().check();
        assert!(e.unwrap_err().to_string().contains("with --pinglist"));
    }

    #[test]
    fn rc_server_role_needs_no_host() {
        let c = parse(&[
            "--rdma=rc",
            "--pingpong",
            "--listen",
            "-c",
            "7",
            "-s",
            "1",
            "--pingpong-port",
            "9999",
        ])
        .unwrap();
        assert!(c.listen && c.host.is_none());
        assert_eq!((c.count, c.size(), c.port), (Some(7), 1, 9999));
        c.check().unwrap();
        // --port stays the same flag.
        assert_eq!(
            parse(&["--rdma=rc", "--pingpong", "--port", "7", "10.0.0.1"])
                .unwrap()
                .port,
            7
        );
        assert!(parse(&["--rdma=rc", "--pingpong", "--listen", "10.0.0.1"]).is_err());
        assert!(
            parse(&["--rdma=rc", "--listen"]).is_err(),
            "needs --pingpong"
        );
        assert!(
            parse(&["--rdma=rc", "--pingpong"]).is_err(),
            "needs HOST or --listen"
        );
    }

    #[test]
    fn bad_combinations_get_one_line() {
        let e = parse(&["--rdma=rc", "10.0.0.1"])
            .unwrap()
            .check()
            .unwrap_err();
        assert!(e.to_string().contains("add --pingpong"), "{e}");
        let e = parse(&["--rdma", "--pingpong", "--listen"])
            .unwrap()
            .check()
            .unwrap_err();
        assert!(e.to_string().contains("ustack run"), "{e}");
        let e = parse(&["--rdma", "--pingpong", "--path-mtu", "512", "10.0.0.1"])
            .unwrap()
            .check()
            .unwrap_err();
        assert!(e.to_string().contains("--rdma=rc"), "{e}");
        let c = parse(&["--rdma=rc", "--pingpong", "--path-mtu", "2048", "10.0.0.1"]).unwrap();
        assert_eq!(c.path_mtu, Some(2048));
        assert!(parse(&["--rdma=rc", "--pingpong", "--path-mtu", "1000", "10.0.0.1"]).is_err());
        // RC messages are not capped at an ICMP datagram.
        let c = parse(&["--rdma=rc", "--pingpong", "-s", "1000000", "10.0.0.1"]).unwrap();
        c.check().unwrap();
        let e = parse(&["-s", "1000000", "10.0.0.1"])
            .unwrap()
            .check()
            .unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
        assert!(parse(&["--rdma=rc", "--pingpong", "--verbs", "10.0.0.1"]).is_err());
    }
}
