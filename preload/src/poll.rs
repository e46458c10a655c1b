//! `poll`, `ppoll`, `select`, `pselect` and epoll over sets that mix ustack
//! sockets and kernel descriptors.
//!
//! A ustack socket's readiness comes from the stack (its levels); the
//! kernel waits for everything at once: kernel descriptors as they are, and
//! each ustack socket as its eventfd, which the loop writes on the socket's
//! readiness events. A wait drains the eventfds it looks at, computes the
//! levels, and blocks in the kernel only when nothing is ready.

use std::collections::HashMap;
use std::ffi::c_int;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use libc::{
    EPOLLERR, EPOLLET, EPOLLHUP, EPOLLIN, EPOLLONESHOT, EPOLLOUT, EPOLLRDHUP, POLLERR, POLLHUP,
    POLLIN, POLLNVAL, POLLOUT, POLLRDHUP, epoll_event, pollfd, sigset_t,
};
use parking_lot::{Mutex, RwLock};

use crate::fd::{self, Sock};
use crate::level::{Level, level};
use crate::real::{real, set_errno};

/// `poll` revents for a level, within what was asked (`events`).
fn poll_revents(l: Level, events: i16) -> i16 {
    let mut r = 0;
    if l.readable {
        r |= POLLIN;
    }
    if l.writable {
        r |= POLLOUT;
    }
    if l.rdhup {
        r |= POLLRDHUP;
    }
    r &= events;
    if l.hup {
        r |= POLLHUP;
    }
    if l.err {
        r |= POLLERR;
    }
    r
}

/// The remaining time of a wait, for the kernel.
fn timespec_left(deadline: Option<Instant>) -> Option<libc::timespec> {
    let d = deadline?;
    let left = d.saturating_duration_since(Instant::now());
    Some(libc::timespec {
        tv_sec: left.as_secs() as libc::time_t,
        tv_nsec: left.subsec_nanos() as libc::c_long,
    })
}

/// `poll`/`ppoll` over `fds`: ustack entries answered from the stack.
/// `timeout` None waits forever. Returns what poll returns (-1 with errno).
pub fn poll(fds: &mut [pollfd], timeout: Option<Duration>, sigmask: *const sigset_t) -> c_int {
    let deadline = timeout.map(|t| Instant::now() + t);
    if timeout.is_some_and(|t| t.is_zero()) {
        crate::state::drive_once();
    } else {
        // Run to completion: drive the stack, look without waiting.
        let mut r = 0;
        if crate::state::spin_until(deadline, || {
            r = poll(fds, Some(Duration::ZERO), sigmask);
            r != 0
        }) {
            return r;
        }
    }
    let socks: Vec<Option<Arc<Sock>>> = fds.iter().map(|p| fd::get(p.fd)).collect();
    let mut local: Vec<pollfd> = fds.to_vec();
    // Signals wait for the kernel wait (which takes the program's mask)
    // from the looks on: none is lost between a look and the wait.
    let _hold = (!timeout.is_some_and(|t| t.is_zero())).then(crate::signals::Held::for_wait);
    loop {
        // Drain every socket, then look: a socket named twice in the set
        // (sshd polls its connection once to read and once to write) is
        // drained before either look, so an event between them is never
        // swallowed by the second drain.
        for s in socks.iter().flatten() {
            s.drain();
        }
        let mut ready = 0;
        for (i, s) in socks.iter().enumerate() {
            if let Some(s) = s {
                let r = poll_revents(level(s), fds[i].events);
                if r != 0 {
                    ready += 1;
                }
                local[i] = pollfd {
                    fd: s.any_fd().unwrap_or(-1),
                    events: POLLIN,
                    revents: 0,
                };
            }
        }
        let immediate = ready > 0;
        let ts = if immediate {
            Some(libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            })
        } else {
            timespec_left(deadline)
        };
        let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const _);
        let held = crate::signals::wait_mask();
        let sigmask = match (&held, sigmask.is_null()) {
            (Some(m), true) => m as *const libc::sigset_t,
            _ => sigmask,
        };
        let driven = if immediate {
            None
        } else if socks.iter().all(Option::is_none) {
            // Only the kernel's descriptors: the stack's thread takes the
            // stack back while this thread sleeps.
            crate::state::stop_driving();
            None
        } else {
            crate::state::wait_driving(&mut local, deadline, sigmask)
        };
        let n = match driven {
            Some(n) => n,
            // SAFETY: `local` is a valid array of pollfd of its length;
            // `tsp` is null or points at a live timespec.
            None => unsafe { (real().ppoll)(local.as_mut_ptr(), local.len() as _, tsp, sigmask) },
        };
        if n < 0 {
            return -1;
        }
        let mut total = 0;
        for (i, s) in socks.iter().enumerate() {
            fds[i].revents = match s {
                Some(s) => {
                    let r = poll_revents(level(s), fds[i].events);
                    if r != 0 {
                        s.pass_on();
                    }
                    r
                }
                None => local[i].revents,
            };
            if fds[i].revents != 0 {
                total += 1;
            }
        }
        if total > 0 || immediate || deadline.is_some_and(|d| Instant::now() >= d) {
            return total;
        }
        // Only eventfds fired and nothing is ready after all: wait again.
    }
}

/// `select`/`pselect` through [`poll`]: returns the count, rewriting the sets.
///
/// # Safety
/// The sets are null or valid `fd_set`s covering `nfds` descriptors.
pub unsafe fn select(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: Option<Duration>,
    sigmask: *const sigset_t,
) -> c_int {
    let isset = |set: *mut libc::fd_set, fd: c_int| {
        // SAFETY: the caller's set is valid for fd < nfds (FD_SETSIZE).
        !set.is_null() && unsafe { libc::FD_ISSET(fd, set) }
    };
    let mut fds = Vec::new();
    for fd in 0..nfds.clamp(0, libc::FD_SETSIZE as c_int) {
        let mut events = 0;
        if isset(readfds, fd) {
            events |= POLLIN;
        }
        if isset(writefds, fd) {
            events |= POLLOUT;
        }
        if isset(exceptfds, fd) {
            events |= libc::POLLPRI;
        }
        if events != 0 {
            fds.push(pollfd {
                fd,
                events,
                revents: 0,
            });
        }
    }
    let n = poll(&mut fds, timeout, sigmask);
    if n < 0 {
        return n;
    }
    for set in [readfds, writefds, exceptfds] {
        if !set.is_null() {
            // SAFETY: a valid set.
            unsafe { libc::FD_ZERO(set) };
        }
    }
    let mut count = 0;
    for p in &fds {
        if p.revents & POLLNVAL != 0 {
            set_errno(libc::EBADF);
            return -1;
        }
        let rd = p.revents & (POLLIN | POLLHUP | POLLERR) != 0 && p.events & POLLIN != 0;
        let wr = p.revents & (POLLOUT | POLLERR) != 0 && p.events & POLLOUT != 0;
        let ex = p.revents & libc::POLLPRI != 0;
        for (on, set) in [(rd, readfds), (wr, writefds), (ex, exceptfds)] {
            if on {
                // SAFETY: a valid set; fd < nfds.
                unsafe { libc::FD_SET(p.fd, set) };
                count += 1;
            }
        }
    }
    count
}

// ------------------------------------------------------------------ epoll

/// Marks our own registrations (an eventfd standing for a ustack socket)
/// in the kernel epoll's data.
const MARK: u64 = 1 << 63;

#[derive(Debug)]
struct Entry {
    sock: Arc<Sock>,
    events: u32,
    data: u64,
    /// EPOLLONESHOT fired: silent until EPOLL_CTL_MOD.
    disabled: bool,
}

#[derive(Debug, Default)]
struct Epoll {
    ustack: HashMap<RawFd, Entry>,
    /// Level-triggered sockets reported last time (and new ones): looked
    /// at again on the next wait.
    recheck: Vec<RawFd>,
}

static EPOLLS: RwLock<Option<HashMap<RawFd, Arc<Mutex<Epoll>>>>> = RwLock::new(None);

fn epoll_of(epfd: RawFd) -> Option<Arc<Mutex<Epoll>>> {
    EPOLLS.read().as_ref()?.get(&epfd).cloned()
}

/// A new epoll descriptor (made by the kernel) joins the table.
pub fn created(epfd: RawFd) {
    EPOLLS
        .write()
        .get_or_insert_with(HashMap::new)
        .insert(epfd, Arc::new(Mutex::new(Epoll::default())));
}

/// An epoll descriptor closed.
pub fn closed(epfd: RawFd) {
    if let Some(m) = EPOLLS.write().as_mut() {
        m.remove(&epfd);
    }
}

/// A ustack socket closed: it leaves every epoll set (the kernel removes
/// its eventfd registration itself when the eventfd closes).
pub fn forget_socket(fd: RawFd) {
    if let Some(m) = EPOLLS.read().as_ref() {
        for e in m.values() {
            let mut e = e.lock();
            e.ustack.remove(&fd);
            e.recheck.retain(|&f| f != fd);
        }
    }
}

/// `epoll_ctl` for a ustack socket `fd`: None when `epfd` is not one of
/// ours (the caller passes the call on).
///
/// # Safety
/// `ev` is null or a valid epoll_event.
pub unsafe fn ctl(
    epfd: RawFd,
    op: c_int,
    fd: RawFd,
    sock: Arc<Sock>,
    ev: *mut epoll_event,
) -> Option<c_int> {
    let ep = epoll_of(epfd)?;
    let mut ep = ep.lock();
    let fail = |e| {
        set_errno(e);
        Some(-1)
    };
    let (events, data) = if ev.is_null() {
        (0, 0)
    } else {
        // SAFETY: the caller's event.
        let e = unsafe { std::ptr::read_unaligned(ev) };
        (e.events, e.u64)
    };
    match op {
        libc::EPOLL_CTL_ADD => {
            if ep.ustack.contains_key(&fd) {
                return fail(libc::EEXIST);
            }
            if ev.is_null() {
                return fail(libc::EFAULT);
            }
            let mut k = epoll_event {
                events: (EPOLLIN | EPOLLET) as u32,
                u64: MARK | fd as u64,
            };
            // SAFETY: registering our own eventfd with a valid event.
            if unsafe { (real().epoll_ctl)(epfd, op, fd, &mut k) } < 0 {
                return Some(-1);
            }
            ep.ustack.insert(
                fd,
                Entry {
                    sock,
                    events,
                    data,
                    disabled: false,
                },
            );
            ep.recheck.push(fd);
            Some(0)
        }
        libc::EPOLL_CTL_MOD => {
            if ev.is_null() {
                return fail(libc::EFAULT);
            }
            match ep.ustack.get_mut(&fd) {
                Some(e) => {
                    e.events = events;
                    e.data = data;
                    e.disabled = false;
                    ep.recheck.push(fd);
                    Some(0)
                }
                None => fail(libc::ENOENT),
            }
        }
        libc::EPOLL_CTL_DEL => {
            if ep.ustack.remove(&fd).is_none() {
                return fail(libc::ENOENT);
            }
            ep.recheck.retain(|&f| f != fd);
            // SAFETY: removing our own registration.
            unsafe { (real().epoll_ctl)(epfd, op, fd, std::ptr::null_mut()) };
            Some(0)
        }
        _ => fail(libc::EINVAL),
    }
}

/// epoll events for a level, within what was asked.
fn epoll_revents(l: Level, events: u32) -> u32 {
    let mut r = 0u32;
    if l.readable {
        r |= EPOLLIN as u32;
    }
    if l.writable {
        r |= EPOLLOUT as u32;
    }
    if l.rdhup {
        r |= EPOLLRDHUP as u32;
    }
    r &= events;
    if l.hup {
        r |= EPOLLHUP as u32;
    }
    if l.err {
        r |= EPOLLERR as u32;
    }
    r
}

/// `epoll_wait`/`epoll_pwait` on one of our epoll descriptors: None when it
/// is not one (the caller passes the call on).
///
/// # Safety
/// `out` is valid for `max` events.
pub unsafe fn wait(
    epfd: RawFd,
    out: *mut epoll_event,
    max: c_int,
    timeout_ms: c_int,
    sigmask: *const sigset_t,
) -> Option<c_int> {
    let ep = epoll_of(epfd)?;
    if max <= 0 || out.is_null() {
        set_errno(libc::EINVAL);
        return Some(-1);
    }
    let deadline =
        (timeout_ms >= 0).then(|| Instant::now() + Duration::from_millis(timeout_ms as u64));
    if timeout_ms == 0 {
        crate::state::drive_once();
    } else if !ep.lock().ustack.is_empty() {
        // Run to completion: drive the stack, look without waiting.
        let mut r = 0;
        if crate::state::spin_until(deadline, || {
            // SAFETY: as for this call (`out` holds `max` events).
            r = unsafe { wait(epfd, out, max, 0, sigmask) }.unwrap_or(-1);
            r != 0
        }) {
            return Some(r);
        }
    }
    let max = max as usize;
    let mut kbuf: Vec<epoll_event> = vec![epoll_event { events: 0, u64: 0 }; max];
    // As in `poll`: no signal lost between the looks and the wait.
    let _hold = (timeout_ms != 0).then(crate::signals::Held::for_wait);
    loop {
        let pending = !ep.lock().recheck.is_empty();
        let ms = if pending {
            0
        } else {
            match deadline {
                None => -1,
                Some(d) => c_int::try_from(d.saturating_duration_since(Instant::now()).as_millis())
                    .unwrap_or(c_int::MAX),
            }
        };
        let held = crate::signals::wait_mask();
        let sigmask = match (&held, sigmask.is_null()) {
            (Some(m), true) => m as *const libc::sigset_t,
            _ => sigmask,
        };
        // Waiting: on the device too, driving the stack, until the epoll
        // set has events (then collected without waiting).
        let mut ms = ms;
        if ms != 0 && !ep.lock().ustack.is_empty() {
            let mut p = [libc::pollfd {
                fd: epfd,
                events: libc::POLLIN,
                revents: 0,
            }];
            match crate::state::wait_driving(&mut p, deadline, sigmask) {
                Some(n) if n < 0 => return Some(-1),
                Some(_) => ms = 0,
                None => {}
            }
        }
        // SAFETY: `kbuf` holds `max` events.
        let n = unsafe { (real().epoll_pwait)(epfd, kbuf.as_mut_ptr(), max as c_int, ms, sigmask) };
        if n < 0 {
            return Some(-1);
        }
        let mut got = Vec::with_capacity(max);
        let mut ep = ep.lock();
        let mut candidates = std::mem::take(&mut ep.recheck);
        for k in &kbuf[..n as usize] {
            let (events, data) = (k.events, k.u64);
            if data & MARK != 0 {
                candidates.push((data & !MARK) as RawFd);
            } else {
                got.push(epoll_event { events, u64: data });
            }
        }
        candidates.sort_unstable();
        candidates.dedup();
        // Drain all, then look (as in `poll`: two numbers of one socket
        // in the set must not swallow each other's events).
        for fd in &candidates {
            if let Some(e) = ep.ustack.get(fd) {
                e.sock.drain();
            }
        }
        for fd in candidates {
            let Some(e) = ep.ustack.get_mut(&fd) else {
                continue;
            };
            if e.disabled {
                continue;
            }
            if got.len() >= max {
                // No room now: look again next time.
                ep.recheck.push(fd);
                continue;
            }
            let r = epoll_revents(level(&e.sock), e.events);
            if r == 0 {
                continue;
            }
            got.push(epoll_event {
                events: r,
                u64: e.data,
            });
            if e.events & EPOLLONESHOT as u32 != 0 {
                e.disabled = true;
            } else if e.events & EPOLLET as u32 == 0 {
                ep.recheck.push(fd);
            }
        }
        drop(ep);
        if !got.is_empty() || deadline.is_some_and(|d| Instant::now() >= d) || timeout_ms == 0 {
            let k = got.len().min(max);
            for (i, e) in got.into_iter().take(k).enumerate() {
                // SAFETY: `out` holds `max` events and i < k <= max.
                unsafe { std::ptr::write_unaligned(out.add(i), e) };
            }
            return Some(k as c_int);
        }
    }
}
