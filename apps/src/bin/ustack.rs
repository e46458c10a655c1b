//! `ustack`: the daemon and the demo.
#![forbid(unsafe_code)]

use std::net::SocketAddrV4;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use ustack::app::ping::{Pinger, PingerConfig};
use ustack::clock::Clock;
use ustack::runtime::{App, Control};
use ustack::sim::{LinkConfig, SimNet, host_config};
use ustack::udp::UdpHandle;
use ustack::{Instant, Stack};
use ustack_apps::report::{counters, ms};

#[derive(Parser, Debug)]
#[command(
    name = "ustack",
    version,
    about = "Kernel-bypass userspace TCP/IP stack"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Two stacks on the simulated link: ARP, pings and UDP echo, with live progress.
    /// Needs no root, no NIC and no system library.
    Demo(DemoArgs),
}

#[derive(clap::Args, Debug)]
struct DemoArgs {
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 10.0, value_parser = positive_secs)]
    duration: f64,
    /// Plain line output instead of the live monitor.
    #[arg(long)]
    no_tui: bool,
    /// Loss on the simulated wire, in percent (each direction).
    #[arg(long, default_value_t = 0.0, value_parser = percent)]
    loss: f64,
    /// One-way delay of the simulated wire, in milliseconds.
    #[arg(long, default_value_t = 0.0, value_parser = non_negative)]
    delay: f64,
    /// Interval between pings, in milliseconds.
    #[arg(long, default_value_t = 10.0, value_parser = positive_ms)]
    interval: f64,
    /// Seed of the wire's impairments.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn positive_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("'{s}' is not a positive number of seconds")),
    }
}

fn positive_ms(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v >= 0.01 && v.is_finite() => Ok(v),
        _ => Err(format!("'{s}' is not an interval of at least 0.01 ms")),
    }
}

fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v >= 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("'{s}' is not a non-negative number")),
    }
}

fn percent(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=100.0).contains(&v) => Ok(v),
        _ => Err(format!("'{s}' is not a percentage between 0 and 100")),
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Demo(args) => demo(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ustack: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Echoes UDP datagrams back (port 7).
struct UdpEcho {
    h: Option<UdpHandle>,
    buf: Vec<u8>,
}

impl App for UdpEcho {
    fn poll(&mut self, _: Instant, stack: &mut Stack) -> Control {
        let h = match self.h {
            Some(h) => h,
            None => match stack.udp_bind(7) {
                Ok(h) => *self.h.insert(h),
                Err(_) => return Control::Exit,
            },
        };
        while let Ok(Some((n, from))) = stack.udp_recv_from(h, &mut self.buf) {
            // A full send queue drops the echo, as a UDP server would.
            let _ = stack.udp_send_to(h, from, &self.buf[..n]);
        }
        Control::Continue
    }
}

/// Sends a numbered datagram every interval and counts the echoes.
struct UdpProbe {
    dst: SocketAddrV4,
    h: Option<UdpHandle>,
    interval: Duration,
    next: Instant,
    sent: u64,
    echoed: u64,
    buf: Vec<u8>,
}

impl App for UdpProbe {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let h = match self.h {
            Some(h) => h,
            None => match stack.udp_bind(0) {
                Ok(h) => *self.h.insert(h),
                Err(_) => return Control::Exit,
            },
        };
        if now >= self.next {
            let msg = self.sent.to_be_bytes();
            if stack.udp_send_to(h, self.dst, &msg).is_ok() {
                self.sent += 1;
            }
            self.next = now + self.interval;
        }
        while let Ok(Some((n, _))) = stack.udp_recv_from(h, &mut self.buf) {
            if n == 8 {
                self.echoed += 1;
            }
        }
        Control::Continue
    }

    fn poll_at(&self) -> Option<Instant> {
        Some(self.next)
    }
}

/// The apps of host A: a pinger and a UDP probe.
struct HostA {
    pinger: Pinger,
    probe: UdpProbe,
}

impl App for HostA {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let _ = self.pinger.poll(now, stack);
        self.probe.poll(now, stack)
    }
    fn poll_at(&self) -> Option<Instant> {
        ustack::time::earliest(self.pinger.poll_at(), self.probe.poll_at())
    }
}

fn demo(args: &DemoArgs) -> Result<ExitCode> {
    if !args.no_tui {
        // The live monitor arrives with the telemetry work; until then the
        // demo prints one progress line per second either way.
        tracing::debug!("no TUI in this build: printing progress lines");
    }
    let link = LinkConfig {
        loss: args.loss / 100.0,
        delay: Duration::from_secs_f64(args.delay / 1e3),
        seed: args.seed,
        ..LinkConfig::default()
    };
    let mut net = SimNet::new(link);
    let a = net.add(host_config(1));
    let b = net.add(host_config(2));
    let b_ip = net.nodes[b].stack.ip();
    let a_ip = net.nodes[a].stack.ip();

    let interval = Duration::from_secs_f64(args.interval / 1e3);
    let mut ping_cfg = PingerConfig::new(b_ip);
    ping_cfg.interval = interval;
    ping_cfg.timeout = Duration::from_secs(1).max(interval * 2);
    let mut host_a = HostA {
        pinger: Pinger::new(ping_cfg).quiet(),
        probe: UdpProbe {
            dst: SocketAddrV4::new(b_ip, 7),
            h: None,
            interval,
            next: Instant::ZERO,
            sent: 0,
            echoed: 0,
            buf: vec![0; 2048],
        },
    };
    let mut host_b = UdpEcho {
        h: None,
        buf: vec![0; 65_536],
    };

    println!(
        "ustack demo: {a_ip} <-> {b_ip} on the sim link (loss {}% and delay {} ms each way), {} s",
        args.loss, args.delay, args.duration
    );
    let clock = Clock::new();
    let total = Duration::from_secs_f64(args.duration);
    let mut elapsed = Duration::ZERO;
    while elapsed < total {
        let slice = Duration::from_secs(1).min(total - elapsed);
        net.run_realtime(&clock, slice, &mut [&mut host_a, &mut host_b], |_| false);
        elapsed += slice;
        let s = host_a.pinger.summary();
        println!(
            "[{:5.1}s] ping {}/{} replies ({:.1}% loss) rtt avg {} ms | udp echo {}/{}",
            elapsed.as_secs_f64(),
            s.received,
            s.transmitted,
            s.loss_percent(),
            ms(s.rtt.avg()),
            host_a.probe.echoed,
            host_a.probe.sent
        );
    }
    // Let replies in flight arrive before the summary.
    let grace = Duration::from_millis(200) + Duration::from_secs_f64(args.delay * 2.0 / 1e3);
    net.run_realtime(&clock, grace, &mut [&mut (), &mut host_b], |n| {
        n.link.in_flight() == 0
    });
    let mut host_a_tail = host_a;
    host_a_tail.poll(clock.now(), &mut net.nodes[a].stack);

    let s = host_a_tail.pinger.summary();
    println!();
    println!("--- {b_ip} ping statistics ---");
    println!(
        "{} packets transmitted, {} received, {}% packet loss",
        s.transmitted,
        s.received,
        fmt_loss(s.loss_percent())
    );
    if s.rtt.count > 0 {
        println!(
            "rtt min/avg/max/mdev = {}/{}/{}/{} ms",
            ms(s.rtt.min),
            ms(s.rtt.avg()),
            ms(s.rtt.max),
            ms(s.rtt.mdev())
        );
    }
    println!(
        "udp echo: {} sent, {} echoed",
        host_a_tail.probe.sent, host_a_tail.probe.echoed
    );
    let link = net.link.stats();
    println!(
        "sim link: {} frames sent, {} delivered, {} lost",
        link.sent, link.delivered, link.lost
    );
    println!();
    let now = clock.now();
    print!(
        "{}",
        counters(&format!("host A {a_ip}"), &net.nodes[a].snapshot(now))
    );
    print!(
        "{}",
        counters(&format!("host B {b_ip}"), &net.nodes[b].snapshot(now))
    );
    // Frames still on the wire hold buffers; everything else must be back.
    let in_flight = net.link.in_flight();
    let in_use = net.pools_in_use();
    if in_use > in_flight {
        bail!("buffer leak: {in_use} buffers in use with {in_flight} frames in flight");
    }
    if s.transmitted == 0 {
        return Err(anyhow::anyhow!("no ping was sent")).context("demo did not run");
    }
    Ok(if s.received > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn fmt_loss(p: f64) -> String {
    if p == p.trunc() {
        format!("{p:.0}")
    } else {
        format!("{p:.3}")
    }
}
