//! What the ustack examples share: the `NET` flags every one of them takes
//! ([`NetArgs`], the runtime's, the same as the `ustack`, `uping` and
//! `uperf` apps), a stop flag for Ctrl-C, and the one-line error exit. The in-loop echo
//! app that `echo-server` and `multicore-echo` both run is [`echo`].
//!
//! The programs themselves are in `src/bin/`; each is complete and short
//! enough to copy as the start of your own. Copy this file along with it
//! (or replace [`NetArgs`] with your own configuration: all it does is fill
//! in a [`ustack_runtime::Builder`]).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod echo;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Result;

pub use ustack_runtime::cli::{CoreList, NetArgs};

/// A flag that Ctrl-C or SIGTERM sets: hand it to `Builder::run` (the loop
/// stops at its next iteration), or check it in your own loop.
pub fn stop_on_signal() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || flag.store(true, std::sync::atomic::Ordering::Relaxed))?;
    Ok(stop)
}

/// Log through `tracing` to stderr (warnings by default; `RUST_LOG=info`
/// shows what the runtime reports, such as the DPDK port it opened).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// The process's exit: the example's own code, or one line `NAME: reason`
/// on stderr and status 2 (a bad flag, a backend that cannot open...).
pub fn exit(name: &str, result: Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{name}: {e:#}");
            ExitCode::from(2)
        }
    }
}
