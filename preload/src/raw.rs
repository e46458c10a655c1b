//! `syscall(3)`: programs that make their system calls through the C
//! library's `syscall` rather than its wrappers (libuv closes every
//! descriptor with `syscall(SYS_close, fd)`: Node, BIND's `dig`).
//!
//! The calls on descriptors the layer owns go where the wrappers go
//! (`close`, the socket calls, `fstat`, `ioctl`, `fcntl`, `dup`...), so a
//! ustack socket closed this way leaves the table and the stack, and its
//! number, which the kernel hands out again, is never taken for the
//! socket. Calls that make a new descriptor retire a stale entry under
//! the number they return. Everything else goes straight on to the C
//! library's `syscall` (the layer's own locks reach it through `futex`:
//! that way takes no lock and looks nothing up).
//!
//! `syscall(SYS_socket, ...)` makes a kernel socket, as under Onload: it
//! is the one way a program under an interposing stack asks for the
//! kernel's (packetdrill's wire mode keeps its control connection on the
//! kernel so; a socket made by `socket()` is ustack's).

use std::ffi::{c_char, c_int, c_long, c_uint, c_ulong, c_void};

use libc::{iovec, msghdr, off_t, size_t, sockaddr, socklen_t};

use crate::exports::{descriptors, io, msg, readiness, socket};
use crate::fd;
use crate::real::sys;
use crate::sock;

/// `syscall(3)`: variadic in C; the C library's reads six argument words,
/// and so does this one (on x86-64 and aarch64 a variadic caller passes
/// them where a fixed-argument callee reads them).
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syscall(
    n: c_long,
    a1: c_long,
    a2: c_long,
    a3: c_long,
    a4: c_long,
    a5: c_long,
    a6: c_long,
) -> c_long {
    let a = [a1, a2, a3, a4, a5, a6];
    // SAFETY: the caller's system call, handled as its wrapper would be.
    if let Some(r) = unsafe { ours(n, a) } {
        return r;
    }
    // SAFETY: passing the call on.
    let r = unsafe { sys(n, a) };
    if r >= 0 {
        // SAFETY: the kernel's answer to the caller's call.
        unsafe { made(n, a, r) };
    }
    r
}

/// A descriptor argument.
fn fd_arg(v: c_long) -> c_int {
    v as c_int
}

/// Whether `v` names a ustack socket (no system call: the wrappers this
/// leads to check what they need to).
fn is_ours(v: c_long) -> bool {
    !fd::is_empty() && fd::get(fd_arg(v)).is_some()
}

/// The system calls on a descriptor (the first argument) that the layer
/// takes over when it is a ustack socket.
fn on_descriptor(n: c_long) -> bool {
    matches!(
        n,
        libc::SYS_read
            | libc::SYS_write
            | libc::SYS_readv
            | libc::SYS_writev
            | libc::SYS_recvfrom
            | libc::SYS_sendto
            | libc::SYS_recvmsg
            | libc::SYS_sendmsg
            | libc::SYS_recvmmsg
            | libc::SYS_sendmmsg
            | libc::SYS_sendfile
            | libc::SYS_bind
            | libc::SYS_listen
            | libc::SYS_accept
            | libc::SYS_accept4
            | libc::SYS_connect
            | libc::SYS_shutdown
            | libc::SYS_getsockname
            | libc::SYS_getpeername
            | libc::SYS_getsockopt
            | libc::SYS_setsockopt
            | libc::SYS_fcntl
            | libc::SYS_ioctl
            | libc::SYS_dup
            | libc::SYS_fstat
            | libc::SYS_newfstatat
            | libc::SYS_statx
    )
}

/// `syscall(SYS_clone, flags, NULL)`, a fork made without the C library
/// (vsftpd isolates its sessions so): the child of such a raw clone
/// keeps the C library's list of the parent's threads, the stack's among
/// them, which it does not have (its `setuid` then fails), and no fork
/// handler gives it its channel to the stack. With only a signal in the
/// flags it is made a `fork` (every fork handler runs); with new
/// namespaces asked for it is refused with EPERM, as for an unprivileged
/// process, and said once: programs that ask so fall back to `fork`.
fn raw_fork(flags: c_long) -> c_long {
    if flags & !c_long::from(libc::CSIGNAL) != 0 {
        crate::report::notice("raw-clone", || {
            format!(
                "a raw clone system call with flags {flags:#x} is refused (EPERM): the stack's threads cannot be carried into its child (vsftpd then falls back to fork)"
            )
        });
        crate::real::set_errno(libc::EPERM);
        return -1;
    }
    // SAFETY: the C library's fork: its own and the layer's fork handlers
    // run, as a raw clone's would not.
    c_long::from(unsafe { libc::fork() })
}

/// The calls the layer takes over: on a ustack socket (or, for `close` and
/// `close_range`, always), the interposed wrapper's result.
///
/// # Safety
/// The caller's arguments for system call `n`.
unsafe fn ours(n: c_long, a: [c_long; 6]) -> Option<c_long> {
    let [a1, a2, a3, a4, a5, a6] = a;
    let r =
        // SAFETY: every arm calls the wrapper of system call `n` with the
        // caller's arguments, typed as the kernel reads them.
        unsafe {
        match n {
            libc::SYS_close => c_long::from(descriptors::close(fd_arg(a1))),
            libc::SYS_close_range => {
                c_long::from(descriptors::close_range(a1 as c_uint, a2 as c_uint, a3 as c_int))
            }
            libc::SYS_epoll_ctl if is_ours(a3) => c_long::from(readiness::epoll_ctl(
                fd_arg(a1),
                a2 as c_int,
                fd_arg(a3),
                a4 as *mut libc::epoll_event,
            )),
            libc::SYS_dup2 | libc::SYS_dup3 if is_ours(a1) || is_ours(a2) => {
                c_long::from(if n == libc::SYS_dup2 {
                    descriptors::dup2(fd_arg(a1), fd_arg(a2))
                } else {
                    descriptors::dup3(fd_arg(a1), fd_arg(a2), a3 as c_int)
                })
            }
            // A fork-like raw clone (no new stack, not a thread) of a
            // process on a shared stack.
            libc::SYS_clone
                if a2 == 0
                    && a1 & c_long::from(libc::CLONE_VM | libc::CLONE_THREAD) == 0
                    && (crate::state::state().is_some() || crate::share::is_client()) =>
            {
                raw_fork(a1)
            }
            // Only these look in the table: anything else (`futex` above
            // all, which the table's own lock calls when contended) must
            // not, or a waiter would wait for the lock inside its wait.
            _ if !on_descriptor(n) || !is_ours(a1) => return None,
            libc::SYS_read => io::read(fd_arg(a1), a2 as *mut c_void, a3 as size_t) as c_long,
            libc::SYS_write => io::write(fd_arg(a1), a2 as *const c_void, a3 as size_t) as c_long,
            libc::SYS_readv => io::readv(fd_arg(a1), a2 as *const iovec, a3 as c_int) as c_long,
            libc::SYS_writev => io::writev(fd_arg(a1), a2 as *const iovec, a3 as c_int) as c_long,
            libc::SYS_recvfrom => io::recvfrom(
                fd_arg(a1),
                a2 as *mut c_void,
                a3 as size_t,
                a4 as c_int,
                a5 as *mut sockaddr,
                a6 as *mut socklen_t,
            ) as c_long,
            libc::SYS_sendto => io::sendto(
                fd_arg(a1),
                a2 as *const c_void,
                a3 as size_t,
                a4 as c_int,
                a5 as *const sockaddr,
                a6 as socklen_t,
            ) as c_long,
            libc::SYS_recvmsg => msg::recvmsg(fd_arg(a1), a2 as *mut msghdr, a3 as c_int) as c_long,
            libc::SYS_sendmsg => msg::sendmsg(fd_arg(a1), a2 as *const msghdr, a3 as c_int) as c_long,
            libc::SYS_sendmmsg => c_long::from(msg::sendmmsg(
                fd_arg(a1),
                a2 as *mut libc::mmsghdr,
                a3 as c_uint,
                a4 as c_int,
            )),
            libc::SYS_recvmmsg => c_long::from(msg::recvmmsg(
                fd_arg(a1),
                a2 as *mut libc::mmsghdr,
                a3 as c_uint,
                a4 as c_int,
                a5 as *mut libc::timespec,
            )),
            libc::SYS_sendfile => {
                io::sendfile(fd_arg(a1), fd_arg(a2), a3 as *mut off_t, a4 as size_t) as c_long
            }
            libc::SYS_bind => {
                c_long::from(socket::bind(fd_arg(a1), a2 as *const sockaddr, a3 as socklen_t))
            }
            libc::SYS_listen => c_long::from(socket::listen(fd_arg(a1), a2 as c_int)),
            libc::SYS_accept => c_long::from(socket::accept4(
                fd_arg(a1),
                a2 as *mut sockaddr,
                a3 as *mut socklen_t,
                0,
            )),
            libc::SYS_accept4 => c_long::from(socket::accept4(
                fd_arg(a1),
                a2 as *mut sockaddr,
                a3 as *mut socklen_t,
                a4 as c_int,
            )),
            libc::SYS_connect => c_long::from(socket::connect(
                fd_arg(a1),
                a2 as *const sockaddr,
                a3 as socklen_t,
            )),
            libc::SYS_shutdown => c_long::from(socket::shutdown(fd_arg(a1), a2 as c_int)),
            libc::SYS_getsockname => c_long::from(socket::getsockname(
                fd_arg(a1),
                a2 as *mut sockaddr,
                a3 as *mut socklen_t,
            )),
            libc::SYS_getpeername => c_long::from(socket::getpeername(
                fd_arg(a1),
                a2 as *mut sockaddr,
                a3 as *mut socklen_t,
            )),
            libc::SYS_getsockopt => c_long::from(socket::getsockopt(
                fd_arg(a1),
                a2 as c_int,
                a3 as c_int,
                a4 as *mut c_void,
                a5 as *mut socklen_t,
            )),
            libc::SYS_setsockopt => c_long::from(socket::setsockopt(
                fd_arg(a1),
                a2 as c_int,
                a3 as c_int,
                a4 as *const c_void,
                a5 as socklen_t,
            )),
            libc::SYS_fcntl => c_long::from(descriptors::fcntl(fd_arg(a1), a2 as c_int, a3 as c_ulong)),
            libc::SYS_ioctl => c_long::from(descriptors::ioctl(fd_arg(a1), a2 as c_ulong, a3 as *mut c_void)),
            libc::SYS_dup => c_long::from(descriptors::dup(fd_arg(a1))),
            libc::SYS_fstat => {
                c_long::from(crate::inspect::fstat(fd_arg(a1), a2 as *mut libc::stat))
            }
            libc::SYS_newfstatat => c_long::from(crate::inspect::fstatat(
                fd_arg(a1),
                a2 as *const c_char,
                a3 as *mut libc::stat,
                a4 as c_int,
            )),
            libc::SYS_statx => c_long::from(crate::inspect::statx(
                fd_arg(a1),
                a2 as *const c_char,
                a3 as c_int,
                a4 as c_uint,
                a5 as *mut libc::statx,
            )),
            _ => return None,
        }
    };
    Some(r)
}

/// After a call the kernel answered: the new descriptors it made (a
/// stale entry under their numbers is retired), and epoll sets made by
/// raw call joined to the layer's.
///
/// # Safety
/// `a` the arguments system call `n` was made with, `r` its result.
unsafe fn made(n: c_long, a: [c_long; 6], r: c_long) {
    let pair = |p: c_long| {
        let fds = p as *const c_int;
        if !fds.is_null() {
            // SAFETY: the kernel filled two ints there.
            unsafe {
                sock::fresh(*fds);
                sock::fresh(*fds.add(1));
            }
        }
    };
    match n {
        libc::SYS_open
        | libc::SYS_openat
        | libc::SYS_openat2
        | libc::SYS_creat
        | libc::SYS_dup
        | libc::SYS_dup2
        | libc::SYS_dup3
        | libc::SYS_accept
        | libc::SYS_accept4
        | libc::SYS_socket
        | libc::SYS_eventfd
        | libc::SYS_eventfd2
        | libc::SYS_memfd_create
        | libc::SYS_timerfd_create
        | libc::SYS_signalfd
        | libc::SYS_signalfd4
        | libc::SYS_inotify_init
        | libc::SYS_inotify_init1
        | libc::SYS_pidfd_open
        | libc::SYS_pidfd_getfd
        | libc::SYS_userfaultfd
        | libc::SYS_perf_event_open
        | libc::SYS_fanotify_init
        | libc::SYS_open_by_handle_at
        | libc::SYS_io_uring_setup => sock::fresh(r as c_int),
        libc::SYS_fcntl if matches!(a[1] as c_int, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) => {
            sock::fresh(r as c_int)
        }
        libc::SYS_epoll_create | libc::SYS_epoll_create1 => {
            sock::fresh(r as c_int);
            if crate::lifecycle::planned() {
                crate::poll::created(r as c_int);
            }
        }
        libc::SYS_pipe | libc::SYS_pipe2 => pair(a[0]),
        libc::SYS_socketpair => pair(a[3]),
        _ => {}
    }
}
