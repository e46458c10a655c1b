//! The C library's own functions, found with `dlsym(RTLD_NEXT, ..)` once:
//! every call that is not a ustack socket's goes to them, and so do the
//! layer's own system calls (an eventfd's read and write), which must not
//! come back into the layer's interposed symbols.

use std::ffi::{CStr, c_char, c_int, c_long, c_uint, c_ulong, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, Ordering};

use libc::{
    epoll_event, fd_set, iovec, mmsghdr, msghdr, nfds_t, off_t, pollfd, sigset_t, size_t, sockaddr,
    socklen_t, ssize_t, timespec, timeval,
};

/// A result carrying the errno of a failure.
pub type Res<T> = Result<T, c_int>;

macro_rules! real_fns {
    ($($name:ident: $ty:ty;)*) => {
        /// Pointers to the C library's definitions of the interposed calls.
        #[allow(missing_docs)]
        pub struct Real {
            $(pub $name: $ty,)*
        }

        impl std::fmt::Debug for Real {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("Real")
            }
        }

        impl Real {
            fn load() -> Real {
                Real {
                    $($name: {
                        let name = concat!(stringify!($name), "\0");
                        let p = lookup(CStr::from_bytes_with_nul(name.as_bytes()).unwrap_or(c""));
                        // SAFETY: `p` is the C library's definition of the
                        // function of this name (checked non-null by
                        // `lookup`), and `$ty` is its C signature.
                        unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
                    },)*
                }
            }
        }
    };
}

real_fns! {
    socket: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;
    bind: unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int;
    listen: unsafe extern "C" fn(c_int, c_int) -> c_int;
    accept4: unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t, c_int) -> c_int;
    connect: unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int;
    read: unsafe extern "C" fn(c_int, *mut c_void, size_t) -> ssize_t;
    write: unsafe extern "C" fn(c_int, *const c_void, size_t) -> ssize_t;
    readv: unsafe extern "C" fn(c_int, *const iovec, c_int) -> ssize_t;
    writev: unsafe extern "C" fn(c_int, *const iovec, c_int) -> ssize_t;
    recvfrom: unsafe extern "C" fn(c_int, *mut c_void, size_t, c_int, *mut sockaddr, *mut socklen_t) -> ssize_t;
    sendto: unsafe extern "C" fn(c_int, *const c_void, size_t, c_int, *const sockaddr, socklen_t) -> ssize_t;
    recvmsg: unsafe extern "C" fn(c_int, *mut msghdr, c_int) -> ssize_t;
    sendmsg: unsafe extern "C" fn(c_int, *const msghdr, c_int) -> ssize_t;
    recvmmsg: unsafe extern "C" fn(c_int, *mut mmsghdr, c_uint, c_int, *mut timespec) -> c_int;
    sendmmsg: unsafe extern "C" fn(c_int, *mut mmsghdr, c_uint, c_int) -> c_int;
    sendfile: unsafe extern "C" fn(c_int, c_int, *mut off_t, size_t) -> ssize_t;
    close: unsafe extern "C" fn(c_int) -> c_int;
    shutdown: unsafe extern "C" fn(c_int, c_int) -> c_int;
    dup: unsafe extern "C" fn(c_int) -> c_int;
    dup2: unsafe extern "C" fn(c_int, c_int) -> c_int;
    dup3: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;
    fdopen: unsafe extern "C" fn(c_int, *const c_char) -> *mut libc::FILE;
    fcntl: unsafe extern "C" fn(c_int, c_int, ...) -> c_int;
    ioctl: unsafe extern "C" fn(c_int, c_ulong, ...) -> c_int;
    getsockname: unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
    getpeername: unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
    getsockopt: unsafe extern "C" fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int;
    setsockopt: unsafe extern "C" fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int;
    poll: unsafe extern "C" fn(*mut pollfd, nfds_t, c_int) -> c_int;
    ppoll: unsafe extern "C" fn(*mut pollfd, nfds_t, *const timespec, *const sigset_t) -> c_int;
    select: unsafe extern "C" fn(c_int, *mut fd_set, *mut fd_set, *mut fd_set, *mut timeval) -> c_int;
    pselect: unsafe extern "C" fn(c_int, *mut fd_set, *mut fd_set, *mut fd_set, *const timespec, *const sigset_t) -> c_int;
    setrlimit: unsafe extern "C" fn(c_uint, *const libc::rlimit) -> c_int;
    epoll_create: unsafe extern "C" fn(c_int) -> c_int;
    epoll_create1: unsafe extern "C" fn(c_int) -> c_int;
    epoll_ctl: unsafe extern "C" fn(c_int, c_int, c_int, *mut epoll_event) -> c_int;
    epoll_pwait: unsafe extern "C" fn(c_int, *mut epoll_event, c_int, c_int, *const sigset_t) -> c_int;
    eventfd: unsafe extern "C" fn(c_uint, c_int) -> c_int;
    fstat: unsafe extern "C" fn(c_int, *mut libc::stat) -> c_int;
    fstatat: unsafe extern "C" fn(c_int, *const c_char, *mut libc::stat, c_int) -> c_int;
    statx: unsafe extern "C" fn(c_int, *const c_char, c_int, c_uint, *mut libc::statx) -> c_int;
    readlink: unsafe extern "C" fn(*const c_char, *mut c_char, size_t) -> ssize_t;
    readlinkat: unsafe extern "C" fn(c_int, *const c_char, *mut c_char, size_t) -> ssize_t;
    open: unsafe extern "C" fn(*const c_char, c_int, ...) -> c_int;
    openat: unsafe extern "C" fn(c_int, *const c_char, c_int, ...) -> c_int;
    pipe: unsafe extern "C" fn(*mut c_int) -> c_int;
    pipe2: unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
    socketpair: unsafe extern "C" fn(c_int, c_int, c_int, *mut c_int) -> c_int;
    memfd_create: unsafe extern "C" fn(*const c_char, c_uint) -> c_int;
    timerfd_create: unsafe extern "C" fn(c_int, c_int) -> c_int;
    signalfd: unsafe extern "C" fn(c_int, *const sigset_t, c_int) -> c_int;
    inotify_init1: unsafe extern "C" fn(c_int) -> c_int;
    execve: unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
    execvpe: unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
    posix_spawn: unsafe extern "C" fn(*mut libc::pid_t, *const c_char, *const libc::posix_spawn_file_actions_t, *const libc::posix_spawnattr_t, *const *mut c_char, *const *mut c_char) -> c_int;
    posix_spawnp: unsafe extern "C" fn(*mut libc::pid_t, *const c_char, *const libc::posix_spawn_file_actions_t, *const libc::posix_spawnattr_t, *const *mut c_char, *const *mut c_char) -> c_int;
}

/// The next definition of `name` after this library, or abort: a C library
/// without one of these calls cannot run the program at all.
fn lookup(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name only reads.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    if p.is_null() {
        let msg = b"ustack-preload: the C library lacks a socket call\n";
        // SAFETY: a raw write(2) of a static buffer to stderr (not the
        // interposed `write`), then leaving at once.
        unsafe {
            sys(
                libc::SYS_write,
                [2, msg.as_ptr() as c_long, msg.len() as c_long, 0, 0, 0],
            );
            libc::_exit(2);
        }
    }
    p
}

static REAL: OnceLock<Real> = OnceLock::new();

/// The C library's `syscall` (variadic: it reads six words).
type SyscallFn = unsafe extern "C" fn(c_long, ...) -> c_long;

/// The C library's `syscall`, kept apart from [`Real`]: the layer's own
/// locks (and the Rust standard library's, through `futex`) call
/// `syscall`, which the layer interposes, so its way on must not wait on
/// a lock of its own (a `OnceLock` being filled by another thread).
static SYSCALL: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// The system call `n` with six argument words, through the C library's
/// `syscall` (errno set and -1 returned on failure, as it does).
///
/// # Safety
/// The arguments must be what system call `n` expects.
pub unsafe fn sys(n: c_long, a: [c_long; 6]) -> c_long {
    let mut p = SYSCALL.load(Ordering::Acquire);
    if p.is_null() {
        // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name only reads.
        p = unsafe { libc::dlsym(libc::RTLD_NEXT, c"syscall".as_ptr()) };
        if p.is_null() {
            // SAFETY: exiting at once: without the C library's syscall
            // nothing can run.
            unsafe { libc::_exit(2) };
        }
        SYSCALL.store(p, Ordering::Release);
    }
    // SAFETY: `p` is the C library's `syscall`, of this signature.
    let f = unsafe { std::mem::transmute::<*mut c_void, SyscallFn>(p) };
    // SAFETY: the caller's system call and arguments.
    unsafe { f(n, a[0], a[1], a[2], a[3], a[4], a[5]) }
}

/// The C library's functions (looked up on first use).
pub fn real() -> &'static Real {
    REAL.get_or_init(Real::load)
}

/// Set `errno`.
pub fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// This thread's `errno`.
pub fn errno() -> c_int {
    // SAFETY: as in `set_errno`.
    unsafe { *libc::__errno_location() }
}
