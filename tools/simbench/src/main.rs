//! `simbench`: the measurements `tools/bench` runs that need no NIC.
//!
//! - `goodput`: stack-only TCP goodput between two stacks in one thread on
//!   an in-memory lossless link (ustack on its sim link, smoltcp on a frame
//!   queue of our own), with N other connections open beside the flow;
//! - `memory`: resident memory per idle established connection;
//! - `transfers`: completion times of short transfers under random loss
//!   (virtual time on the impaired sim link), tail loss probes on or off;
//! - `rr-server` / `rr-client`: a Linux-kernel TCP request/response pair
//!   (std::net), the Linux peer of the 64-byte RR row.
//!
//! Every subcommand prints one JSON object per measurement on stdout.
#![forbid(unsafe_code)]

mod rr;
mod smol;
mod transfers;
mod ustack_side;

use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "simbench",
    version,
    about = "ustack benchmark pieces (JSON lines)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Which {
    Ustack,
    Smoltcp,
}

/// The NIC offloads a goodput run's link plays.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offload {
    /// Checksums in software, MTU-sized segments.
    None,
    /// Checksums left to the port.
    Csum,
    /// Checksums and segmentation left to the port (ustack only).
    Tso,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Stack-only TCP goodput, two stacks on one in-memory link, one thread.
    Goodput {
        #[arg(long, value_enum, default_value = "ustack")]
        stack: Which,
        /// Other connections open beside the flow: half idle listeners,
        /// half established idle connections.
        #[arg(long, default_value_t = 0)]
        idle: usize,
        /// Bytes the flow moves (K, M, G suffixes, 1024-based).
        #[arg(long, default_value = "1G", value_parser = size)]
        bytes: u64,
        /// Socket buffer size of the flow (both ends, both stacks).
        #[arg(long, default_value = "256K", value_parser = size)]
        buffer: u64,
        /// Each stack's zero-copy API: the sender claims send-buffer space
        /// in place and the receiver consumes received bytes in place
        /// (ustack `tcp_send_with`/`tcp_recv_with`, smoltcp `send`/`recv`
        /// with closures) instead of copying from and to its own buffer.
        #[arg(long)]
        zero_copy: bool,
        /// NIC offloads on the link: `csum` (the port fills and checks TCP
        /// and IPv4 checksums: neither stack computes them), `tso` (csum,
        /// and ustack hands the port 64 KiB segments, delivered merged as
        /// a receiving NIC's LRO does; smoltcp has no TSO and runs csum).
        #[arg(long, value_enum, default_value = "none")]
        offload: Offload,
        /// ustack only: the flow (and the idle connections) over IPv6
        /// (`fd00::1`, `fd00::2`) instead of IPv4.
        #[arg(long)]
        ipv6: bool,
        /// ustack only: advance the stacks' clock this many nanoseconds
        /// per loop iteration instead of reading the wall clock, so a run
        /// takes the same steps natively and under valgrind (for stable
        /// instruction counts; timings still come from the wall clock).
        #[arg(long)]
        virtual_clock_ns: Option<u64>,
    },
    /// Short transfers under random loss (ustack, virtual time): their
    /// completion times' p50/p99 and the goodput they add up to.
    Transfers {
        /// Frames lost at random, percent, each direction.
        #[arg(long, default_value_t = 1.0)]
        loss: f64,
        /// Round-trip time, milliseconds.
        #[arg(long, default_value_t = 10)]
        rtt_ms: u64,
        /// Bytes per transfer (K, M suffixes).
        #[arg(long, default_value = "64K", value_parser = size)]
        size: u64,
        /// Transfers, one after another on one connection.
        #[arg(long, default_value_t = 1000)]
        count: usize,
        /// Turn tail loss probes (RFC 8985) off: the behaviour before them.
        #[arg(long)]
        no_tlp: bool,
        /// Turn RACK and PRR (RFC 8985 6, RFC 6937) off: RFC 6675's SACK
        /// count and pipe alone, the behaviour before them.
        #[arg(long)]
        no_rack: bool,
        /// The link's rate each way, Mbit/s (0: unlimited): a bottleneck.
        #[arg(long, default_value_t = 0)]
        rate_mbit: u64,
        /// Frames the link queues before it drops (tail drop).
        #[arg(long, default_value_t = 4096)]
        queue: usize,
        /// Queued frames past which the link marks ECN-capable packets
        /// Congestion Experienced instead (0: never).
        #[arg(long, default_value_t = 0)]
        ecn_mark: usize,
        /// Connections ask for ECN (RFC 3168); the other end grants it.
        #[arg(long)]
        ecn: bool,
        /// Seed of the losses.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Resident memory per idle established TCP connection (ustack).
    Memory {
        #[arg(long, default_value_t = 10_000)]
        conns: usize,
        /// Socket buffer size (send and receive, each).
        #[arg(long, default_value = "256K", value_parser = size)]
        buffer: u64,
    },
    /// Linux TCP echo server for rr-client (std::net, one thread per connection).
    RrServer {
        #[arg(long, default_value = "0.0.0.0:7")]
        listen: std::net::SocketAddr,
        /// Spin on non-blocking sockets instead of sleeping in read.
        #[arg(long)]
        busy: bool,
    },
    /// Linux TCP request/response client: send SIZE bytes, wait for the echo, repeat.
    RrClient {
        #[arg(long)]
        connect: std::net::SocketAddr,
        #[arg(long, default_value_t = 64)]
        size: usize,
        #[arg(long, default_value_t = 5.0)]
        secs: f64,
        /// Spin on a non-blocking socket instead of sleeping in read.
        #[arg(long)]
        busy: bool,
    },
}

/// Bytes with an optional K, M or G suffix (1024-based).
fn size(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1 << 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    match num.parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n * mult),
        _ => Err(format!("'{s}' is not a size (bytes, or with K/M/G)")),
    }
}

/// What a goodput run measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct Goodput {
    pub bytes: u64,
    pub wall_secs: f64,
    /// CPU time this thread ran during the flow (/proc/thread-self/schedstat).
    pub cpu_secs: f64,
    /// Frames on the link, both directions (data and ACKs).
    pub frames: u64,
    /// Frames carrying payload (sender to receiver).
    pub data_frames: u64,
    /// Bytes copied by the path: app -> send buffer, send buffer -> frame,
    /// frame -> receive buffer, receive buffer -> app.
    pub copied: u64,
    pub retransmits: u64,
    /// Loop iterations of the flow: one per turn of both stacks (ustack:
    /// a `Node::step` of each; smoltcp: a send and a receive turn).
    pub iterations: u64,
}

fn print_goodput(which: Which, idle: usize, g: &Goodput) {
    let ns = g.wall_secs * 1e9;
    let v = serde_json::json!({
        "measure": "goodput",
        "stack": match which { Which::Ustack => "ustack", Which::Smoltcp => "smoltcp" },
        "idle": idle,
        "bytes": g.bytes,
        "wall_secs": g.wall_secs,
        "gbit_per_sec": g.bytes as f64 * 8.0 / g.wall_secs / 1e9,
        "cpu_secs": g.cpu_secs,
        // Goodput per second of CPU actually given to the thread: steadier
        // than wall time when other work shares the cores.
        "gbit_per_cpu_sec": g.bytes as f64 * 8.0 / g.cpu_secs / 1e9,
        "frames": g.frames,
        "data_frames": g.data_frames,
        "ns_per_packet": ns / g.frames.max(1) as f64,
        "ns_per_data_packet": ns / g.data_frames.max(1) as f64,
        "copied_per_byte": g.copied as f64 / g.bytes.max(1) as f64,
        "retransmits": g.retransmits,
        "iterations": g.iterations,
        "frames_per_iteration": g.frames as f64 / g.iterations.max(1) as f64,
    });
    println!("{v}");
}

/// CPU time this thread has run, in seconds (/proc/thread-self/schedstat).
pub fn thread_cpu_secs() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0.0, |ns| ns as f64 / 1e9)
}

/// Resident set size of this process in bytes (/proc/self/statm).
pub fn rss_bytes() -> Result<u64> {
    let s = std::fs::read_to_string("/proc/self/statm")?;
    let pages: u64 = match s.split_whitespace().nth(1).map(str::parse) {
        Some(Ok(p)) => p,
        _ => bail!("cannot parse /proc/self/statm: {s:?}"),
    };
    Ok(pages * 4096)
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Goodput {
            stack,
            idle,
            bytes,
            buffer,
            zero_copy,
            offload,
            virtual_clock_ns,
            ipv6,
        } => {
            let buffer = usize::try_from(buffer)?;
            let step = virtual_clock_ns.map(std::time::Duration::from_nanos);
            let g = match stack {
                Which::Ustack => {
                    ustack_side::goodput(idle, bytes, buffer, zero_copy, offload, step, ipv6)?
                }
                Which::Smoltcp if step.is_some() => bail!("--virtual-clock-ns is ustack only"),
                Which::Smoltcp if ipv6 => bail!("--ipv6 is ustack only"),
                Which::Smoltcp => {
                    smol::goodput(idle, bytes, buffer, zero_copy, offload != Offload::None)?
                }
            };
            print_goodput(stack, idle, &g);
        }
        Cmd::Transfers {
            loss,
            rtt_ms,
            size,
            count,
            no_tlp,
            no_rack,
            rate_mbit,
            queue,
            ecn_mark,
            ecn,
            seed,
        } => {
            if queue == 0 {
                bail!("--queue 0: the link must hold at least one frame");
            }
            if !(0.0..100.0).contains(&loss) {
                bail!("--loss {loss}: a percentage below 100");
            }
            let v = transfers::run(transfers::Spec {
                loss: loss / 100.0,
                rtt: std::time::Duration::from_millis(rtt_ms),
                size: usize::try_from(size)?,
                count,
                tlp: !no_tlp,
                rack: !no_rack,
                rate_bps: rate_mbit.saturating_mul(1_000_000),
                queue,
                ecn_mark,
                ecn,
                seed,
            })?;
            println!("{v}");
        }
        Cmd::Memory { conns, buffer } => {
            let v = ustack_side::memory(conns, usize::try_from(buffer)?)?;
            println!("{v}");
        }
        Cmd::RrServer { listen, busy } => rr::server(listen, busy)?,
        Cmd::RrClient {
            connect,
            size,
            secs,
            busy,
        } => {
            let v = rr::client(connect, size, secs, busy)?;
            println!("{v}");
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("simbench: {e:#}");
            ExitCode::from(2)
        }
    }
}
