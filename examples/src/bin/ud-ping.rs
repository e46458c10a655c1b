//! RoCEv2 UD ping: the stack speaks RDMA Unreliable Datagram itself
//! (Ethernet/IPv4/UDP 4791/BTH/DETH/payload/ICRC), so any NIC, DPDK or
//! libpcap, exchanges UD SENDs with real RNICs, Linux rdma_rxe, or another
//! ustack. The engine's `UdPinger` runs in the loop (the in-loop front);
//! this program wraps it to print each pong as it arrives.
//!
//! ```text
//! sudo ud-ping --pcap eth0 --ip 192.168.1.250/24 -c 5 192.168.1.251
//! ```
//!
//! The peer is a UD responder: `ustack run` serves one on QPN 2 with Q_Key
//! 0x11111111. Exit status 0 when pongs came, 1 when none did, 2 on an error.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use clap::Parser;
use ustack::node::{App, Control};
use ustack::socket::ud::{DEFAULT_QKEY, RESPONDER_QPN, UdAddr};
use ustack::{Instant, Stack};
use ustack_examples::{NetArgs, exit, init_logging, stop_on_signal};
use ustack_kit::ud_ping::{UdPinger, UdPingerConfig};

/// RoCEv2 UD ping with the engine's pinger in the loop.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    #[command(flatten)]
    net: NetArgs,
    /// Pings to send.
    #[arg(short = 'c', long, default_value_t = 5)]
    count: u64,
    /// Seconds between pings.
    #[arg(short = 'i', long, default_value_t = 1.0)]
    interval: f64,
    /// Seconds to wait for the last pong.
    #[arg(short = 'W', long, default_value_t = 1.0)]
    timeout: f64,
    /// The responder's queue pair number.
    #[arg(long, default_value_t = RESPONDER_QPN)]
    qpn: u32,
    /// The Q_Key both ends use.
    #[arg(long, default_value_t = DEFAULT_QKEY)]
    qkey: u32,
    /// The responder's IPv4 address.
    host: std::net::Ipv4Addr,
}

/// The pinger, plus a line per pong.
struct Front {
    pinger: UdPinger,
}

impl App for Front {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        // The pinger creates its queue pair on the first turn, posts
        // receive buffers, sends on schedule and reaps completions.
        let control = self.pinger.poll(now, stack);
        for pong in self.pinger.drain_events() {
            println!(
                "{} bytes from {}: ud_seq={} time={:.3} ms{}",
                pong.bytes,
                pong.from,
                pong.seq,
                pong.rtt.as_secs_f64() * 1e3,
                if pong.duplicate { " (DUP!)" } else { "" }
            );
        }
        // Exit once every ping was answered or timed out.
        control
    }

    /// When the loop must call us even if nothing arrives: the next ping.
    fn poll_at(&self) -> Option<Instant> {
        self.pinger.next_wakeup()
    }
}

/// Seconds from a flag, checked.
fn seconds(flag: &str, s: f64) -> anyhow::Result<Duration> {
    match Duration::try_from_secs_f64(s) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => bail!("{flag} {s}: give a positive number of seconds"),
    }
}

fn run(args: Args) -> anyhow::Result<ExitCode> {
    let dst = UdAddr {
        ip: args.host.into(),
        qpn: args.qpn,
    };
    let mut cfg = UdPingerConfig::new(dst);
    cfg.qkey = args.qkey;
    cfg.count = Some(args.count);
    cfg.interval = seconds("-i", args.interval)?;
    cfg.timeout = seconds("-W", args.timeout)?;
    let mut front = Front {
        pinger: UdPinger::new(cfg),
    };
    let stop = stop_on_signal()?;
    println!(
        "UD PING {dst} qkey {:#010x} from {} on {}",
        args.qkey,
        args.net.address(),
        args.net.describe()
    );
    // Run the loop with the pinger on this thread until it is done (or Ctrl-C).
    args.net.builder()?.run(&mut front, &stop)?;
    if let Some(e) = front.pinger.error() {
        bail!("{dst}: {e}");
    }
    let s = front.pinger.summary();
    println!("--- {dst} ud ping statistics ---");
    println!(
        "{} sent, {} received, {:.0}% loss",
        s.transmitted,
        s.received,
        s.loss_percent()
    );
    if s.received > 0 {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "rtt min/avg/max = {:.3}/{:.3}/{:.3} ms",
            ms(s.rtt.min),
            ms(s.rtt.avg()),
            ms(s.rtt.max)
        );
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::from(1))
    }
}

fn main() -> ExitCode {
    init_logging();
    exit("ud-ping", run(Args::parse()))
}
