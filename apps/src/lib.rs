//! Pieces shared by the `ustack`, `uping` and `uperf` binaries.
#![forbid(unsafe_code)]

pub mod cpu;
pub mod iperf;
pub mod iperf_client;
pub mod iperf_server;
pub mod mesh;
pub mod net;
pub mod rdma;
pub mod report;
pub mod rr;
pub mod services;
pub mod telemetry;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A flag set by Ctrl-C or SIGTERM (one handler per process).
pub fn stop_flag() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    ctrlc::set_handler(move || s.store(true, Ordering::Relaxed))
        .map_err(|e| anyhow::anyhow!("installing the signal handler: {e}"))?;
    Ok(stop)
}

/// A binary's exit: its code, or one error line (`NAME: reason`) and status 2.
pub fn exit(name: &str, result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{name}: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Run `app` on `node` until it exits or Ctrl-C/SIGTERM, publishing
/// telemetry when `tele` is given.
pub fn run_app<D: ustack::Device, A: ustack::node::App + ?Sized>(
    node: &mut ustack::node::Node<D>,
    app: &mut A,
    lcfg: &ustack_runtime::LoopConfig,
    tele: Option<&telemetry::Telemetry>,
) -> anyhow::Result<()> {
    let stop = stop_flag()?;
    ustack_runtime::net::run_app(
        node,
        app,
        lcfg,
        &stop,
        tele.and_then(telemetry::Telemetry::publisher),
    )?;
    Ok(())
}
