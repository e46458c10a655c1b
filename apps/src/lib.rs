//! Pieces shared by the `ustack`, `uping` and `uperf` binaries.
#![forbid(unsafe_code)]

pub mod cli;
pub mod cpu;
pub mod iperf;
pub mod iperf_client;
pub mod iperf_server;
pub mod mesh;
pub mod net;
pub mod oob;
pub mod perftest;
/// perftest's RC tests (`uperf --rdma rc`): the RC transport of [`perftest`].
pub use perftest::rc as perftest_rc;
pub mod pingpong;
pub mod pingpong_rc;
pub mod rdma;
pub mod report;
pub mod rr;
pub mod services;
pub mod telemetry;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The stop flags handed out by [`stop_flag`]: set by Ctrl-C or SIGTERM,
/// and by a closed standard output ([`out`]).
static STOP_FLAGS: Mutex<Vec<Arc<AtomicBool>>> = Mutex::new(Vec::new());

/// A flag set by Ctrl-C or SIGTERM (one handler per process), and when
/// standard output is closed (`| head`).
pub fn stop_flag() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    ctrlc::set_handler(move || s.store(true, Ordering::Relaxed))
        .map_err(|e| anyhow::anyhow!("installing the signal handler: {e}"))?;
    if let Ok(mut flags) = STOP_FLAGS.lock() {
        flags.push(stop.clone());
    }
    Ok(stop)
}

/// Standard output that may be closed under us (`uping ... | head -1`).
///
/// Rust ignores SIGPIPE, so a write to a closed pipe fails with EPIPE, and
/// `println!` panics on it. The binaries print through [`outln!`] and
/// [`out!`] instead: the first EPIPE marks stdout closed, sets every
/// [`stop_flag`] (the program winds down as ping does when SIGPIPE kills
/// it, but through its normal exit path, so telemetry sockets and devices
/// are released), and later output is dropped. [`exit`] then returns 141,
/// the status a shell reports for a program killed by SIGPIPE (128 + 13),
/// which is what `ping | head -1` gives; nothing is printed about it.
pub mod out {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};

    static CLOSED: AtomicBool = AtomicBool::new(false);

    /// The exit status after stdout was closed: a SIGPIPE death as the shell
    /// reports it.
    pub const CLOSED_STATUS: u8 = 141;

    /// Whether a write found stdout closed.
    pub fn closed() -> bool {
        CLOSED.load(Ordering::Relaxed)
    }

    /// Write `args` to stdout (flushed); on a closed pipe, remember it and
    /// ask the program to stop.
    pub fn write(args: std::fmt::Arguments<'_>) {
        if closed() {
            return;
        }
        let mut o = std::io::stdout().lock();
        let r = o.write_fmt(args).and_then(|()| o.flush());
        if let Err(e) = r {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                CLOSED.store(true, Ordering::Relaxed);
                if let Ok(flags) = super::STOP_FLAGS.lock() {
                    for f in flags.iter() {
                        f.store(true, Ordering::Relaxed);
                    }
                }
            }
        }
    }
}

/// Why a connection attempt may have gone unanswered, when the stack knows:
/// TCP segments dropped for bad checksums (what a local sender's checksum
/// offload looks like over pcap). Empty when none were.
pub fn bad_checksum_hint(stack: &ustack::Stack) -> String {
    let bad = stack
        .stats()
        .drops
        .get(ustack::stats::DropReason::TcpBadChecksum);
    if bad == 0 {
        return String::new();
    }
    format!(
        ": {bad} TCP segment(s) (SYN-ACKs among them) arrived with bad checksums, as a local \
         sender's checksum offload leaves them: run with --accept-partial-checksum, or \
         `ethtool -K IF tx off` on the sending interface (README: \"On an interface as the \
         kernel left it\")"
    )
}

/// `println!` that does not panic when stdout is closed (see [`out`]).
#[macro_export]
macro_rules! outln {
    () => { $crate::out::write(format_args!("\n")) };
    ($($t:tt)*) => { $crate::out::write(format_args!("{}\n", format_args!($($t)*))) };
}

/// `print!` that does not panic when stdout is closed (see [`out`]).
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => { $crate::out::write(format_args!($($t)*)) };
}

/// Print the runtime's notices (offloads left on, partial checksums, an
/// address conflict, the metrics address) on stderr as `ustack: ...`
/// lines: the library says them, the binaries print them.
pub fn print_notices() {
    ustack_runtime::set_notice_sink(|msg| eprintln!("ustack: {msg}"));
}

/// The process's command line with the flags of its `--config FILE` put in
/// before its own (see [`ustack_runtime::config_file`]), for `cmd` (the
/// binary's clap definition) to parse. A file that cannot be used is said
/// in one line (`NAME: config FILE: ...`) and the process exits with
/// status 2, as for a mistake in a flag.
pub fn command_line(name: &str, cmd: &clap::Command) -> Vec<std::ffi::OsString> {
    match ustack_runtime::config_file::args_with_config_file(cmd, std::env::args_os()) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{name}: {e}");
            std::process::exit(2);
        }
    }
}

/// A binary's exit: its code, or one error line (`NAME: reason`) and status
/// 2; 141 without a word when stdout was closed under it (see [`out`]).
pub fn exit(name: &str, result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(_) if out::closed() => ExitCode::from(out::CLOSED_STATUS),
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
