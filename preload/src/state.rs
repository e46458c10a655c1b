//! The process's running stack, as the socket calls see it: the stack
//! this process runs (if any), whether its sockets belong to another
//! process's stack after a `fork`, and run-to-completion driving. Started,
//! handed over at `fork` and stopped by `lifecycle.rs`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use ustack_runtime::{Net, Runtime};

/// Who keeps the stack when the program forks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForkMode {
    /// The parent (the default): children run on the kernel's sockets.
    Parent,
    /// The child the program forks (a master with one worker).
    Child,
    /// Every child gets a stack of its own, the `k`-th child process
    /// `k mod workers` of `workers` replicas on the interface (a master
    /// that pre-forks workers sharing `reuseport` listeners); the parent
    /// gives its stack up at its first fork.
    Each {
        /// How many workers share the interface.
        workers: usize,
    },
}

/// A running stack.
#[derive(Debug)]
pub struct State {
    /// The handle every socket call goes through.
    pub net: Net,
    /// The runtime running the stack (taken at stop).
    pub runtime: Mutex<Option<Runtime>>,
    /// `fork` hands the stack to the child (`USTACK_FORK=child`: a
    /// master process that forks the one worker serving the sockets it
    /// opened); by default the parent keeps it.
    pub fork: ForkMode,
    /// How long a waiting thread drives the stack before it sleeps.
    pub spin: Duration,
    /// How the stack was built (a worker of [`ForkMode::Each`] builds its
    /// own from it).
    pub builder: ustack_runtime::Builder,
    /// `--telemetry` and `--capture` as given (a worker's get a suffix).
    pub telemetry: Option<std::path::PathBuf>,
    /// `--capture` as given.
    pub capture: Option<std::path::PathBuf>,
}

/// The stack this process started (see [`state`] for the one in use).
pub static STATE: OnceLock<State> = OnceLock::new();

/// A worker's own stack ([`ForkMode::Each`]); the inherited [`STATE`] is
/// the master's and stays detached.
pub static WORKER: OnceLock<State> = OnceLock::new();

/// This process has no stack (any more): a forked child by default, or a
/// parent that handed it to its child. Its ustack sockets only close.
pub static DETACHED: AtomicBool = AtomicBool::new(false);

/// The stack, when this process runs one (not without `USTACK_NET`, not
/// after `fork` took it elsewhere).
pub fn state() -> Option<&'static State> {
    if let Some(w) = WORKER.get() {
        return Some(w);
    }
    if DETACHED.load(Ordering::Relaxed) {
        return None;
    }
    STATE.get()
}

/// Whether this process's ustack sockets belong to another process's stack.
pub fn forked() -> bool {
    DETACHED.load(Ordering::Relaxed) && WORKER.get().is_none() && !crate::share::is_client()
}

/// Run to completion: ask `ready` (which drives the stack once, see
/// [`drive_once`], and looks) until it says yes, for at most the spin time
/// and not past `deadline`; true when it became ready. A caller sleeps in
/// the kernel only when this gives up, and the stack's own thread polls
/// meanwhile.
pub fn spin_until(deadline: Option<Instant>, mut ready: impl FnMut() -> bool) -> bool {
    let Some(s) = state() else { return false };
    if s.spin.is_zero() {
        return false;
    }
    let start = Instant::now();
    let until = deadline.map_or(start + s.spin, |d| d.min(start + s.spin));
    loop {
        if ready() {
            return true;
        }
        if Instant::now() >= until {
            // The caller now waits in the kernel: the loop's thread takes
            // the stack back at once.
            s.net.stop_driving();
            return false;
        }
    }
}

/// In run-to-completion mode (a spin time set), run one iteration of the
/// stack on this thread: before a call that looks without waiting (a
/// non-blocking receive, `epoll_wait` with timeout 0) reports nothing, as
/// XLIO polls its ring on every such call. A program that busy-polls
/// then drives the stack itself.
pub fn drive_once() {
    if let Some(s) = state() {
        if !s.spin.is_zero() {
            s.net.drive();
        }
    }
}
