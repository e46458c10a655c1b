//! `uperf`: an iperf3-compatible throughput tool over a ustack instance.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail};
use clap::Parser;
use ustack::clock::Clock;
use ustack::device::Device;
use ustack::runtime::{self, App, Control, LoopConfig, Node};
use ustack::{Instant, Stack};
use ustack_apps::iperf_server::IperfServer;
use ustack_apps::net::{NetArgs, NodeUser, with_node};

#[derive(Parser, Debug)]
#[command(
    name = "uperf",
    version,
    about = "iperf3-compatible throughput tests over ustack"
)]
struct Cli {
    #[command(flatten)]
    net: NetArgs,
    /// Run as a server (a stock `iperf3 -c` is the client).
    #[arg(short = 's', long = "server", required = true)]
    server: bool,
    /// Port to listen on.
    #[arg(short = 'p', long = "port", default_value_t = 5201)]
    port: u16,
    /// Serve one test, then exit.
    #[arg(short = '1', long = "one-off")]
    one_off: bool,
}

/// Prints the server's lines as they come.
struct Front(IperfServer);

impl App for Front {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let c = self.0.poll(now, stack);
        for line in self.0.output.drain(..) {
            println!("{line}");
        }
        c
    }
}

struct Serve<'a>(&'a Cli);

impl NodeUser for Serve<'_> {
    type Output = ExitCode;
    fn run<D: Device>(self, mut node: Node<D>) -> Result<ExitCode> {
        let cli = self.0;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        ctrlc::set_handler(move || s.store(true, Ordering::Relaxed))
            .context("installing the signal handler")?;
        let mut front = Front(IperfServer::new(cli.port, cli.one_off));
        let lcfg = LoopConfig {
            core: cli.net.core,
            ..LoopConfig::default()
        };
        runtime::run(
            &mut node,
            &mut front,
            &lcfg,
            &Clock::new(),
            || stop.load(Ordering::Relaxed),
            |_| {},
        )?;
        if let Some(e) = front.0.error.take() {
            bail!("{e}");
        }
        Ok(ExitCode::SUCCESS)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    ustack_apps::exit("uperf", with_node(&cli.net, Serve(&cli)))
}
