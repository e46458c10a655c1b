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
/// and not past `deadline`; true when it became ready. A caller sleeps
/// only when this gives up, on the device too when it can
/// ([`wait_driving`]), else in the kernel alone while the stack's own
/// thread polls.
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
            // The caller now waits: on the device too ([`wait_driving`]),
            // or in the kernel alone, the loop's thread taking the stack
            // back at once.
            return false;
        }
    }
}

/// The caller is about to sleep in the kernel on descriptors that are
/// not the stack's: the stack's thread takes the stack back at once.
pub fn stop_driving() {
    if let Some(s) = state() {
        s.net.stop_driving();
    }
}

/// Run to completion while the caller sleeps: after [`spin_until`] gave
/// up, wait as `ppoll(fds, deadline, sigmask)` would, but with the
/// stack's device and wake-up descriptors in the same poll, running the
/// stack's iterations on this thread when frames come or a timer is due
/// ([`Net::device_waiter`]), until one of `fds` has events (written back
/// in their `revents`, as `ppoll` does), the deadline passes, or a signal
/// interrupts. Returns what `ppoll` would (-1 with errno set). A
/// single-threaded server then wakes once per burst of frames on its own
/// thread, instead of the stack's thread waking first and then waking it.
///
/// `None` without a spin time, or when another thread already waits on
/// the device, or the device has no descriptor: the caller waits in the
/// kernel as before, and the stack's thread drives the stack meanwhile.
pub fn wait_driving(
    fds: &mut [libc::pollfd],
    deadline: Option<Instant>,
    sigmask: *const libc::sigset_t,
) -> Option<libc::c_int> {
    use std::os::fd::AsRawFd;
    let s = state()?;
    if s.spin.is_zero() {
        return None;
    }
    let Some(mut w) = s.net.device_waiter() else {
        s.net.stop_driving();
        return None;
    };
    let n = fds.len();
    let mut all: Vec<libc::pollfd> = Vec::with_capacity(n + 2);
    all.extend_from_slice(fds);
    for fd in w.fds() {
        all.push(libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
    }
    loop {
        let Some(mut sleep) = w.turn() else {
            drop(w);
            s.net.stop_driving();
            return None;
        };
        if let Some(d) = deadline {
            sleep = sleep.min(d.saturating_duration_since(Instant::now()));
        }
        let asleep = !sleep.is_zero() && w.sleep();
        if !asleep {
            sleep = Duration::ZERO;
        }
        let ts = libc::timespec {
            tv_sec: sleep.as_secs().try_into().unwrap_or(libc::time_t::MAX),
            tv_nsec: sleep.subsec_nanos().into(),
        };
        for p in &mut all {
            p.revents = 0;
        }
        // SAFETY: `all` is a valid array of pollfd of its length, `ts` a
        // live timespec, `sigmask` null or the caller's live mask; the C
        // library's ppoll, not the layer's.
        let r =
            unsafe { (crate::real::real().ppoll)(all.as_mut_ptr(), all.len() as _, &ts, sigmask) };
        let errno = crate::real::errno();
        if asleep {
            w.woke(all[n + 1].revents & libc::POLLIN != 0);
        }
        if r < 0 {
            drop(w);
            crate::real::set_errno(errno);
            return Some(-1);
        }
        let ready = all[..n].iter().filter(|p| p.revents != 0).count();
        if ready > 0 || deadline.is_some_and(|d| Instant::now() >= d) {
            for (f, a) in fds.iter_mut().zip(&all) {
                f.revents = a.revents;
            }
            return Some(ready as libc::c_int);
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
            // An iteration on another thread (the loop's, handling the
            // frame this caller looks for) is let finish first: 100 µs is
            // far above one iteration and below any caller's patience.
            s.net.drive_settled(Duration::from_micros(100));
        }
    }
}
