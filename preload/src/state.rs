//! The process's stack: started before `main` from `USTACK_NET`, stopped
//! at exit, given up by a forked child.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Parser;
use parking_lot::Mutex;
use ustack_runtime::cli::NetArgs;
use ustack_runtime::{Net, Runtime};

/// The environment variable `ustack exec` passes the NET flags in.
pub const ENV: &str = "USTACK_NET";
/// The process the stack belongs to (set by `ustack exec` to its own pid,
/// which the program keeps across `exec`): a wrapper script that `exec`s
/// the real program hands the stack on, but a child it forks and execs
/// runs on the kernel's sockets, so no NIC is driven by two processes.
pub const OWNER: &str = "USTACK_PID";

/// A running stack.
#[derive(Debug)]
pub struct State {
    /// The handle every socket call goes through.
    pub net: Net,
    runtime: Mutex<Option<Runtime>>,
}

static STATE: OnceLock<State> = OnceLock::new();
/// Set in a forked child: the stack (and its sockets) are the parent's.
static FORKED: AtomicBool = AtomicBool::new(false);

/// The stack, when this process runs one (not without `USTACK_NET`, not
/// in a forked child).
pub fn state() -> Option<&'static State> {
    if FORKED.load(Ordering::Relaxed) {
        return None;
    }
    STATE.get()
}

/// Whether this is a forked child of a process that ran the stack.
pub fn forked() -> bool {
    FORKED.load(Ordering::Relaxed)
}

/// Leave at once with one line on stderr (a bad `USTACK_NET`, a backend
/// that cannot open): before `main`, so the program never starts half-way.
fn fail(msg: &str) -> ! {
    eprintln!("ustack exec: {msg}");
    // SAFETY: _exit ends the process without running Rust or C destructors.
    unsafe { libc::_exit(2) }
}

/// Parse `USTACK_NET` and start the stack; without it, do nothing (every
/// call then goes to the C library unchanged).
pub fn init() {
    let Ok(spec) = std::env::var(ENV) else {
        return;
    };
    let owner = std::env::var(OWNER)
        .ok()
        .and_then(|p| p.parse::<u32>().ok());
    if owner.is_some_and(|p| p != std::process::id()) {
        // A child of the stack's process (fork + exec): the kernel's sockets.
        return;
    }
    let Some(words) = shlex::split(&spec) else {
        fail(&format!("{ENV} is not a valid argument list: {spec:?}"));
    };
    let args =
        match Wrapper::try_parse_from(std::iter::once("ustack exec".to_string()).chain(words)) {
            Ok(a) => a.net,
            Err(e) => {
                let line = e.to_string();
                fail(line.lines().next().unwrap_or("bad NET flags"));
            }
        };
    let builder = match args.builder() {
        Ok(b) => b,
        Err(e) => fail(&e.to_string()),
    };
    let runtime = match builder.spawn() {
        Ok(rt) => rt,
        Err(e) => fail(&e.to_string()),
    };
    let state = State {
        net: runtime.net().clone(),
        runtime: Mutex::new(Some(runtime)),
    };
    if STATE.set(state).is_err() {
        return;
    }
    // SAFETY: registering plain `extern "C" fn()` handlers.
    unsafe {
        libc::atexit(at_exit);
        libc::pthread_atfork(
            Some(before_fork),
            Some(after_fork_parent),
            Some(after_fork_child),
        );
    }
}

/// At exit: close what the program left open (FIN, or RST for unread
/// data, as the kernel does), then let the loop send it and stop.
extern "C" fn at_exit() {
    if FORKED.load(Ordering::Relaxed) {
        return;
    }
    let Some(s) = STATE.get() else { return };
    for (fd, _) in crate::fd::all() {
        crate::sock::close(fd);
    }
    if let Some(rt) = s.runtime.lock().take() {
        let _ = rt.stop();
    }
}

extern "C" fn before_fork() {
    crate::fd::lock_for_fork();
}

extern "C" fn after_fork_parent() {
    crate::fd::unlock_after_fork();
}

/// The child keeps running, on the kernel's sockets: the stack, its loop
/// thread and its NIC stay the parent's. Inherited ustack descriptors only
/// close (their kernel eventfd); anything else on them fails with EBADF.
extern "C" fn after_fork_child() {
    FORKED.store(true, Ordering::Relaxed);
    crate::fd::unlock_after_fork();
}

/// The NET flags as a command line of their own.
#[derive(Parser, Debug)]
#[command(name = "ustack exec")]
struct Wrapper {
    #[command(flatten)]
    net: NetArgs,
}
