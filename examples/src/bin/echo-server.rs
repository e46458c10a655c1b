//! A TCP echo server on the in-loop front: the app runs inside the poll
//! loop, on the loop's own thread, so an echo costs no lock and no thread
//! wake-up (the lowest latency ustack offers). The app itself is
//! `ustack_examples::echo::EchoServer` (src/echo.rs): read what arrived,
//! write it back, driven by readiness events.
//!
//! ```text
//! sudo echo-server --pcap eth0 --ip 192.168.1.250/24 [--port 7]
//! nc 192.168.1.250 7            # from another host on that link
//! ```
//!
//! Runs until Ctrl-C or SIGTERM, then prints what it echoed.

use std::process::ExitCode;

use clap::Parser;
use ustack_examples::echo::EchoServer;
use ustack_examples::{NetArgs, exit, init_logging, stop_on_signal};

/// TCP echo server on the in-loop front.
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
    // Ctrl-C / SIGTERM set this flag; the loop checks it every iteration.
    let stop = stop_on_signal()?;
    let mut app = EchoServer::new(args.port);
    println!(
        "echo-server: {} on {}, echoing TCP port {}",
        args.net.address(),
        args.net.describe(),
        args.port
    );
    // Open the backend and run the loop with our app on this thread until
    // `stop` is set (or the app exits).
    args.net.builder()?.run(&mut app, &stop)?;
    if let Some(e) = app.error() {
        anyhow::bail!("{e}");
    }
    println!(
        "echo-server: {} connections, {} bytes echoed",
        app.connections, app.bytes
    );
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    init_logging();
    exit("echo-server", run(Args::parse()))
}
