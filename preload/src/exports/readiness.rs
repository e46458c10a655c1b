//! Readiness: `poll`, `ppoll`, `select`, `pselect` and the epoll calls,
//! passed to the C library unless a ustack socket is in the set.

use std::ffi::c_int;
use std::time::Duration;

use libc::{epoll_event, fd_set, nfds_t, pollfd, sigset_t, size_t, timespec, timeval};

use crate::exports::args::{guard, ours, ours_checked};
use crate::exports::io::fortify_fail;
use crate::fd::{self};
use crate::poll;
use crate::real::real;
use crate::sock;
use crate::state::forked;

fn timeout_of_ms(ms: c_int) -> Option<Duration> {
    (ms >= 0).then(|| Duration::from_millis(ms as u64))
}

/// Whether any of `fds` is a ustack socket.
///
/// # Safety
/// `fds` valid for `n`.
unsafe fn any_ours(fds: *const pollfd, n: nfds_t) -> bool {
    if fds.is_null() || fd::is_empty() {
        return false;
    }
    // SAFETY: the caller's array of `n`.
    (0..n as usize).any(|i| fd::get(unsafe { (*fds.add(i)).fd }).is_some())
}

/// `poll(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    // SAFETY: the caller's array.
    if forked() || !unsafe { any_ours(fds, n) } {
        // SAFETY: passing the call on.
        return unsafe { (real().poll)(fds, n, timeout) };
    }
    guard(-1, || {
        // SAFETY: the caller's array of `n` pollfds.
        let set = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
        poll::poll(set, timeout_of_ms(timeout), std::ptr::null())
    })
}

/// `__poll_chk` (fortified `poll`).
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    timeout: c_int,
    fdslen: size_t,
) -> c_int {
    if (n as usize).saturating_mul(std::mem::size_of::<pollfd>()) > fdslen {
        fortify_fail();
    }
    // SAFETY: checked.
    unsafe { poll(fds, n, timeout) }
}

/// `ppoll(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ppoll(
    fds: *mut pollfd,
    n: nfds_t,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: the caller's array.
    if forked() || !unsafe { any_ours(fds, n) } {
        // SAFETY: passing the call on.
        return unsafe { (real().ppoll)(fds, n, ts, mask) };
    }
    guard(-1, || {
        // SAFETY: the caller's timespec, if any.
        let timeout = (!ts.is_null())
            .then(|| unsafe { Duration::new((*ts).tv_sec as u64, (*ts).tv_nsec as u32) });
        // SAFETY: the caller's array.
        let set = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
        poll::poll(set, timeout, mask)
    })
}

/// Whether any descriptor below `nfds` in the sets is a ustack socket.
///
/// # Safety
/// Sets null or valid.
unsafe fn any_ours_in_sets(nfds: c_int, sets: [*mut fd_set; 3]) -> bool {
    if fd::is_empty() {
        return false;
    }
    (0..nfds.clamp(0, libc::FD_SETSIZE as c_int)).any(|fd| {
        // SAFETY: valid sets covering nfds.
        sets.iter()
            .any(|s| !s.is_null() && unsafe { libc::FD_ISSET(fd, *s) })
            && fd::get(fd).is_some()
    })
}

/// `select(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn select(
    nfds: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    tv: *mut timeval,
) -> c_int {
    // SAFETY: the caller's sets.
    if forked() || !unsafe { any_ours_in_sets(nfds, [r, w, e]) } {
        // SAFETY: passing the call on.
        return unsafe { (real().select)(nfds, r, w, e, tv) };
    }
    guard(-1, || {
        // SAFETY: the caller's timeval, if any.
        let timeout = (!tv.is_null()).then(|| unsafe {
            Duration::new(
                (*tv).tv_sec.max(0) as u64,
                ((*tv).tv_usec.max(0) as u32) * 1000,
            )
        });
        let start = std::time::Instant::now();
        // SAFETY: the caller's sets.
        let n = unsafe { poll::select(nfds, r, w, e, timeout, std::ptr::null()) };
        if let (Some(t), false) = (timeout, tv.is_null()) {
            // Linux writes back the time left.
            let left = t.saturating_sub(start.elapsed());
            // SAFETY: the caller's timeval.
            unsafe {
                (*tv).tv_sec = left.as_secs() as libc::time_t;
                (*tv).tv_usec = left.subsec_micros() as libc::suseconds_t;
            }
        }
        n
    })
}

/// `pselect(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pselect(
    nfds: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: the caller's sets.
    if forked() || !unsafe { any_ours_in_sets(nfds, [r, w, e]) } {
        // SAFETY: passing the call on.
        return unsafe { (real().pselect)(nfds, r, w, e, ts, mask) };
    }
    guard(-1, || {
        // SAFETY: the caller's timespec, if any.
        let timeout = (!ts.is_null())
            .then(|| unsafe { Duration::new((*ts).tv_sec as u64, (*ts).tv_nsec as u32) });
        // SAFETY: the caller's sets.
        unsafe { poll::select(nfds, r, w, e, timeout, mask) }
    })
}

/// `epoll_create(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_create(size: c_int) -> c_int {
    // SAFETY: passing the call on.
    let fd = unsafe { (real().epoll_create)(size) };
    sock::fresh(fd);
    // Tracked before the stack starts too: a program makes its epoll sets
    // first and adds sockets later (memcached's workers).
    if fd >= 0 && crate::lifecycle::planned() {
        poll::created(fd);
    }
    fd
}

/// `epoll_create1(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_create1(flags: c_int) -> c_int {
    // SAFETY: passing the call on.
    let fd = unsafe { (real().epoll_create1)(flags) };
    sock::fresh(fd);
    // Tracked before the stack starts too: a program makes its epoll sets
    // first and adds sockets later (memcached's workers).
    if fd >= 0 && crate::lifecycle::planned() {
        poll::created(fd);
    }
    fd
}

/// `epoll_ctl(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut epoll_event,
) -> c_int {
    let mine = if op == libc::EPOLL_CTL_ADD {
        ours_checked(fd)
    } else {
        ours(fd)
    };
    if let Some(Ok(s)) = mine {
        // SAFETY: the caller's event.
        if let Some(r) = guard(Some(-1), || unsafe { poll::ctl(epfd, op, fd, s, ev) }) {
            return r;
        }
    }
    // SAFETY: passing the call on.
    unsafe { (real().epoll_ctl)(epfd, op, fd, ev) }
}

/// `epoll_wait(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    // SAFETY: as epoll_pwait without a mask.
    unsafe { epoll_pwait(epfd, ev, max, timeout, std::ptr::null()) }
}

/// `epoll_pwait(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const sigset_t,
) -> c_int {
    if !forked() {
        // SAFETY: the caller's buffer of `max` events.
        if let Some(r) = guard(Some(-1), || unsafe {
            poll::wait(epfd, ev, max, timeout, mask)
        }) {
            return r;
        }
    }
    // SAFETY: passing the call on.
    unsafe { (real().epoll_pwait)(epfd, ev, max, timeout, mask) }
}
