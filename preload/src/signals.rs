//! Signals held off while a process sharing another process's stack is
//! inside a socket call.
//!
//! A socket call in such a process takes the layer's locks, allocates, and
//! talks to the owner over its channel: a signal handler that makes a
//! socket call of its own in the middle of that (a SIGALRM timeout that
//! closes the connection, a status look) would wait for a lock its own
//! thread holds. So every signal is blocked from the start of the call to
//! its end, except in the kernel waits of a blocking call (the call's
//! `ppoll`/`epoll_pwait` take the program's mask): a handler runs there,
//! holding nothing of the layer's, or right after the call, as the
//! kernel's socket calls behave. The process that runs the stack itself
//! keeps its calls as they are (no system call more on its data path).

use std::cell::Cell;

thread_local! {
    /// The program's signal mask while this thread is inside a held call.
    static SAVED: Cell<Option<libc::sigset_t>> = const { Cell::new(None) };
}

/// Signals held for the life of this value (nested holds are free).
#[derive(Debug)]
pub struct Held {
    outer: bool,
}

impl Held {
    /// Hold signals off when this process shares another's stack.
    pub fn new() -> Self {
        if !crate::share::is_client() {
            return Held { outer: false };
        }
        Self::for_wait()
    }

    /// Hold signals off before the last look of a blocking wait, in any
    /// process: a signal that comes while the layer looks or drives the
    /// stack stays pending, and the kernel wait that follows takes the
    /// program's mask ([`wait_mask`]) and is interrupted by it. Without,
    /// a handler that ran between the look and the wait (CPython's sets a
    /// flag and returns) would leave the wait asleep and the program
    /// deaf to its SIGTERM.
    pub fn for_wait() -> Self {
        if SAVED.with(Cell::get).is_some() {
            return Held { outer: false };
        }
        // SAFETY: sigset_t is plain data; sigfillset and pthread_sigmask
        // fill the two sets.
        let old = unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            old
        };
        SAVED.with(|s| s.set(Some(old)));
        Held { outer: true }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.outer {
            return;
        }
        if let Some(old) = SAVED.with(|s| s.take()) {
            let saved = crate::real::errno();
            // SAFETY: restoring the mask `new` found.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
            crate::real::set_errno(saved);
        }
    }
}

/// The mask a kernel wait inside a held call takes (the program's), or
/// None outside one.
pub fn wait_mask() -> Option<libc::sigset_t> {
    SAVED.with(Cell::get)
}
