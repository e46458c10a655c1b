//! The C library's own functions, found with `dlsym(RTLD_NEXT, ..)` once:
//! every call that is not a ustack socket's goes to them, and so do the
//! layer's own system calls (an eventfd's read and write), which must not
//! come back into the layer's interposed symbols.

use std::ffi::{CStr, c_int, c_uint, c_ulong, c_void};
use std::sync::OnceLock;

use libc::{
    epoll_event, fd_set, iovec, mmsghdr, msghdr, nfds_t, off_t, pollfd, sigset_t, size_t, sockaddr,
    socklen_t, ssize_t, timespec, timeval,
};

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
    epoll_create: unsafe extern "C" fn(c_int) -> c_int;
    epoll_create1: unsafe extern "C" fn(c_int) -> c_int;
    epoll_ctl: unsafe extern "C" fn(c_int, c_int, c_int, *mut epoll_event) -> c_int;
    epoll_pwait: unsafe extern "C" fn(c_int, *mut epoll_event, c_int, c_int, *const sigset_t) -> c_int;
    eventfd: unsafe extern "C" fn(c_uint, c_int) -> c_int;
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
            libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len());
            libc::_exit(2);
        }
    }
    p
}

static REAL: OnceLock<Real> = OnceLock::new();

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
