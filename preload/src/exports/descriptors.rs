//! Calls on descriptors: `close`, `close_range`, `closefrom`, the `dup`
//! family, `fcntl` and `ioctl`.

use std::ffi::{c_char, c_int, c_long, c_uint, c_ulong, c_void};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::exports::args::{guard, ours_checked};
use crate::fd::{self, Sock};
use crate::own;
use crate::poll;
use crate::real::Res;
use crate::real::{real, set_errno};
use crate::sock;
use crate::state::forked;

/// `close(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if own::guarded(fd) {
        // The stack's own descriptor: not the program's to close.
        set_errno(libc::EBADF);
        return -1;
    }
    if sock::get_checked(fd).is_some() {
        if forked() {
            // The parent's socket: only this process's descriptor goes.
            if let Some(s) = fd::remove(fd) {
                s.close_fd(fd);
            }
            return 0;
        }
        return guard(-1, || {
            poll::forget_socket(fd);
            sock::close(fd);
            0
        });
    }
    poll::closed(fd);
    // SAFETY: passing the call on.
    unsafe { (real().close)(fd) }
}

/// `close_range(2)`: the stack's own descriptors in the range stay open,
/// and ustack sockets in it close as `close` closes them (with
/// `CLOSE_RANGE_CLOEXEC` they are only marked, in the kernel).
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let raw = |a: c_uint, b: c_uint, f: c_int| {
        // SAFETY: the close_range system call on numbers the layer does
        // not keep.
        unsafe {
            crate::real::sys(
                libc::SYS_close_range,
                [c_long::from(a), c_long::from(b), c_long::from(f), 0, 0, 0],
            ) as c_int
        }
    };
    if first > last {
        set_errno(libc::EINVAL);
        return -1;
    }
    // A process without the stack (a forked child) may close the stack's
    // descriptors; its ustack sockets still leave the table.
    let own = own::guarded_all();
    if own.is_empty() && fd::is_empty() {
        return raw(first, last, flags);
    }
    let mut skip: Vec<c_uint> = own
        .iter()
        .filter_map(|&f| c_uint::try_from(f).ok())
        .collect();
    let cloexec = flags & (libc::CLOSE_RANGE_CLOEXEC as c_int) != 0;
    if !cloexec {
        for (f, _) in fd::all() {
            if let Ok(u) = c_uint::try_from(f) {
                if (first..=last).contains(&u) {
                    skip.push(u);
                    // SAFETY: our own close of a ustack socket's descriptor.
                    unsafe { close(f) };
                }
            }
        }
    }
    skip.sort_unstable();
    let mut flags = flags;
    for (a, b) in own::gaps(first, last, &skip) {
        if raw(a, b, flags) == -1 {
            return -1;
        }
        // The descriptor table is unshared once.
        flags &= !(libc::CLOSE_RANGE_UNSHARE as c_int);
    }
    0
}

/// `closefrom(3)`: every descriptor from `low` up, but the stack's own.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn closefrom(low: c_int) {
    let Ok(low) = c_uint::try_from(low) else {
        return;
    };
    // SAFETY: our close_range over the same numbers.
    unsafe { close_range(low, c_uint::MAX, 0) };
}

/// A new descriptor `new` for the ustack socket of `old` (made by the kernel
/// as a copy of its eventfd): record it.
fn adopt_dup(old: &Arc<Sock>, new: c_int) -> c_int {
    if new >= 0 {
        old.add_fd(new);
        sock::insert(new, old.clone());
    }
    new
}

/// `dup(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: the kernel's dup of the descriptor (our eventfd or theirs).
    let new = unsafe { (real().dup)(fd) };
    match ours_checked(fd) {
        Some(Ok(s)) => adopt_dup(&s, new),
        _ => {
            sock::fresh(new);
            new
        }
    }
}

/// `dup3(2)` (and `dup2`): a ustack descriptor at `new` closes first.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if old == new {
        set_errno(libc::EINVAL);
        return -1;
    }
    if own::guarded(new) {
        // The stack's own descriptor cannot be replaced.
        set_errno(libc::EBUSY);
        return -1;
    }
    if fd::get(new).is_some() {
        // SAFETY: our close of the descriptor being replaced.
        unsafe { close(new) };
    }
    // SAFETY: the kernel's dup3.
    let r = unsafe { (real().dup3)(old, new, flags) };
    match ours_checked(old) {
        Some(Ok(s)) => {
            let r = adopt_dup(&s, r);
            if r >= 0 {
                crate::stdio::standard_became_socket(r);
            }
            r
        }
        _ => {
            sock::fresh(r);
            r
        }
    }
}

/// `dup2(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if old == new {
        // SAFETY: dup2 to itself only checks the descriptor.
        return unsafe { (real().dup2)(old, new) };
    }
    // SAFETY: as dup3 without flags.
    unsafe { dup3(old, new, 0) }
}

/// `fdopen(3)`: a stream on a ustack socket reads and writes it
/// through the layer (`stdio`); other descriptors' go to the C library.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut libc::FILE {
    match ours_checked(fd) {
        // SAFETY: the caller's mode string.
        Some(Ok(_)) if !mode.is_null() => unsafe { crate::stdio::open(fd, mode) },
        // SAFETY: passing the call on.
        _ => unsafe { (real().fdopen)(fd, mode) },
    }
}

/// `fcntl(2)` (the third argument as a word: every command we see takes
/// an int or a pointer).
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    let Some(Ok(s)) = ours_checked(fd) else {
        // SAFETY: passing the call on.
        let r = unsafe { (real().fcntl)(fd, cmd, arg) };
        if matches!(cmd, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) {
            sock::fresh(r);
        }
        return r;
    };
    match cmd {
        libc::F_GETFL => {
            libc::O_RDWR
                | if s.nonblocking.load(Ordering::Relaxed) {
                    libc::O_NONBLOCK
                } else {
                    0
                }
        }
        libc::F_SETFL => {
            s.nonblocking
                .store(arg as c_int & libc::O_NONBLOCK != 0, Ordering::Relaxed);
            0
        }
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            // SAFETY: the kernel's dup of our eventfd.
            let new = unsafe { (real().fcntl)(fd, cmd, arg) };
            adopt_dup(&s, new)
        }
        // FD_CLOEXEC and the rest are the descriptor's own, in the kernel.
        // SAFETY: passing the call on for our eventfd.
        _ => unsafe { (real().fcntl)(fd, cmd, arg) },
    }
}

/// `fcntl64` (glibc 2.28+ builds call it for `fcntl`).
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: the same call.
    unsafe { fcntl(fd, cmd, arg) }
}

/// `ioctl(2)`: FIONBIO, FIONREAD/SIOCINQ, SIOCOUTQ, FIOCLEX/FIONCLEX on
/// ustack sockets; interface queries (SIOCGIF*) go to a kernel socket;
/// terminal requests fail with ENOTTY as on any socket; other socket
/// requests fail with ENOTTY, reported once by name.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    let Some(Ok(s)) = ours_checked(fd) else {
        // SAFETY: passing the call on.
        return unsafe { (real().ioctl)(fd, req, arg) };
    };
    // An int result out through the caller's pointer.
    let out = |r: Res<usize>| -> c_int {
        match r {
            Ok(_) if arg.is_null() => {
                set_errno(libc::EFAULT);
                -1
            }
            Ok(n) => {
                // SAFETY: FIONREAD, SIOCOUTQ take an int*.
                unsafe { *arg.cast::<c_int>() = c_int::try_from(n).unwrap_or(c_int::MAX) };
                0
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    };
    guard(-1, || match req {
        libc::FIONBIO => {
            if arg.is_null() {
                set_errno(libc::EFAULT);
                return -1;
            }
            // SAFETY: FIONBIO takes an int*.
            let on = unsafe { *arg.cast::<c_int>() } != 0;
            s.nonblocking.store(on, Ordering::Relaxed);
            0
        }
        libc::FIONREAD => out(sock::readable_bytes(&s)),
        libc::TIOCOUTQ => out(crate::inspect::send_queued(&s)),
        // The descriptor's close-on-exec flag is the kernel's.
        // SAFETY: passing the call on for our eventfd.
        libc::FIOCLEX | libc::FIONCLEX => unsafe { (real().ioctl)(fd, req, arg) },
        r if crate::inspect::socket_ioctl_name(r).is_some() => {
            let name = crate::inspect::socket_ioctl_name(r).unwrap_or("?");
            crate::report::unsupported(&format!(
                "ioctl {name} ({r:#x}) on a ustack socket (ENOTTY)"
            ));
            set_errno(libc::ENOTTY);
            -1
        }
        r if (0x8900..0x8a00).contains(&r) => {
            // An interface query through any socket: ask the kernel's.
            // SAFETY: a throwaway kernel socket for the caller's request.
            unsafe {
                let k = (real().socket)(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
                if k < 0 {
                    return -1;
                }
                let r = (real().ioctl)(k, req, arg);
                let e = crate::real::errno();
                (real().close)(k);
                set_errno(e);
                r
            }
        }
        // Terminal requests (TCGETS, TIOCGWINSZ...): a socket is no
        // terminal, Linux says ENOTTY too.
        r if (0x5400..0x5500).contains(&r) => {
            set_errno(libc::ENOTTY);
            -1
        }
        r => {
            crate::report::unsupported(&format!("ioctl {r:#x} on a ustack socket (ENOTTY)"));
            set_errno(libc::ENOTTY);
            -1
        }
    })
}
