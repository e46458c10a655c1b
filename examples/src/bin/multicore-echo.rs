//! A TCP echo server on several cores (DPDK): one poll loop per CPU, each
//! pinned, each with its own queue pair of the port, its own stack and its
//! own copy of the app; nothing is shared between them. Symmetric RSS (or
//! the driver's flow hash, with pass-on between cores) keeps both
//! directions of a connection on one core. Each core runs the same in-loop
//! `EchoServer` as `echo-server` (src/echo.rs), listening on every core.
//!
//! ```text
//! sudo multicore-echo --cores 0,1 --ip 10.77.0.2/24 \
//!     --dpdk "--no-huge -m 256 --no-pci --vdev=net_af_packet0,iface=eth1,qpairs=2"
//! ```
//!
//! Runs until Ctrl-C or SIGTERM, then prints what each core echoed.

use std::process::ExitCode;

use clap::Parser;
use ustack_examples::echo::EchoServer;
use ustack_examples::{CoreList, NetArgs, exit, init_logging, stop_on_signal};

/// TCP echo server on several cores (DPDK only).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    #[command(flatten)]
    net: NetArgs,
    /// TCP port to echo on.
    #[arg(long, default_value_t = 7)]
    port: u16,
}

fn run(args: Args) -> anyhow::Result<ExitCode> {
    let stop = stop_on_signal()?;
    // `--cores LIST` (DPDK only: the configuration is refused for pcap) and
    // `--backoff` are among the NET flags.
    let Some(CoreList(cores)) = &args.net.cores else {
        anyhow::bail!("--cores LIST is required (one queue pair per core)");
    };
    println!(
        "multicore-echo: {} on {}, cores {cores:?}, echoing TCP port {}",
        args.net.address(),
        args.net.describe(),
        args.port
    );
    // One loop per core, each with the app `make(shard)` returns, until
    // `stop` is set. No steering rules: a connection is served on the core
    // its SYN reached. Telemetry (--telemetry) reports the cores' totals
    // and each core.
    let shards =
        (args.net.builder()?).run_sharded(&[], &stop, |_shard| EchoServer::new(args.port))?;
    for ((echo, _last_snapshot), core) in shards.iter().zip(cores) {
        if let Some(e) = echo.error() {
            anyhow::bail!("core {core}: {e}");
        }
        println!(
            "multicore-echo: core {core}: {} connections, {} bytes echoed",
            echo.connections, echo.bytes
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    init_logging();
    exit("multicore-echo", run(Args::parse()))
}
