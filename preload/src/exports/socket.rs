//! The socket calls: `socket`, `bind`, `listen`, `accept`, `connect`,
//! `shutdown`, the two address queries and the socket options.

use std::ffi::{c_int, c_void};

use libc::{sockaddr, socklen_t};

use crate::exports::args::{guard, ours_checked, read_addr, ret, write_addr};
use crate::real::{real, set_errno};
use crate::sock::{self};

/// `socket(2)`: AF_INET and AF_INET6 stream and datagram sockets go to
/// ustack.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    if domain == libc::AF_INET || domain == libc::AF_INET6 {
        let base = ty & 0xf;
        let stream = base == libc::SOCK_STREAM && (protocol == 0 || protocol == libc::IPPROTO_TCP);
        let dgram = base == libc::SOCK_DGRAM && (protocol == 0 || protocol == libc::IPPROTO_UDP);
        // The first such socket of the program starts the stack.
        if (stream || dgram) && crate::lifecycle::start_for_socket() {
            let nb = ty & libc::SOCK_NONBLOCK != 0;
            let cx = ty & libc::SOCK_CLOEXEC != 0;
            let v6 = domain == libc::AF_INET6;
            return guard(-1, || {
                ret(sock::socket(stream, v6, nb, cx).map(i64::from)) as c_int
            });
        }
    }
    // SAFETY: the C library's socket with the caller's arguments.
    let fd = unsafe { (real().socket)(domain, ty, protocol) };
    sock::fresh(fd);
    fd
}

/// `bind(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    match ours_checked(fd) {
        None => {
            // SAFETY: passing the call on.
            unsafe { (real().bind)(fd, addr, len) }
        }
        Some(s) => guard(-1, || {
            let r = s.and_then(|s| {
                // SAFETY: the caller's address.
                unsafe { read_addr(addr, len, s.v6) }.and_then(|a| sock::bind(&s, a))
            });
            ret(r.map(|()| 0i64)) as c_int
        }),
    }
}

/// `listen(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    match ours_checked(fd) {
        // SAFETY: passing the call on.
        None => unsafe { (real().listen)(fd, backlog) },
        Some(s) => guard(-1, || {
            ret(s.and_then(|s| sock::listen(&s, backlog)).map(|()| 0i64)) as c_int
        }),
    }
}

/// `accept4(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    match ours_checked(fd) {
        None => {
            // SAFETY: passing the call on.
            let new = unsafe { (real().accept4)(fd, addr, len, flags) };
            sock::fresh(new);
            new
        }
        Some(s) => guard(-1, || {
            let r = s.and_then(|s| {
                sock::accept(
                    &s,
                    flags & libc::SOCK_NONBLOCK != 0,
                    flags & libc::SOCK_CLOEXEC != 0,
                )
                .map(|(nfd, peer)| (nfd, peer, s.v6))
            });
            match r {
                Ok((nfd, peer, v6)) => {
                    // SAFETY: the caller's address buffer.
                    unsafe { write_addr(peer, v6, addr, len) };
                    nfd
                }
                Err(e) => {
                    set_errno(e);
                    -1
                }
            }
        }),
    }
}

/// `accept(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the same call with no flags.
    unsafe { accept4(fd, addr, len, 0) }
}

/// `connect(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    match ours_checked(fd) {
        // SAFETY: passing the call on.
        None => unsafe { (real().connect)(fd, addr, len) },
        Some(s) => guard(-1, || {
            let r = s.and_then(|s| {
                // SAFETY: the caller's address.
                let a = unsafe { read_addr(addr, len, s.v6) }?;
                sock::connect(&s, a)
            });
            ret(r.map(|()| 0i64)) as c_int
        }),
    }
}

/// `shutdown(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    match ours_checked(fd) {
        // SAFETY: passing the call on.
        None => unsafe { (real().shutdown)(fd, how) },
        Some(s) => guard(-1, || {
            ret(s.and_then(|s| sock::shutdown(&s, how)).map(|()| 0i64)) as c_int
        }),
    }
}

/// `getsockname(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    match ours_checked(fd) {
        // SAFETY: passing the call on.
        None => unsafe { (real().getsockname)(fd, addr, len) },
        Some(s) => guard(-1, || {
            match s.and_then(|s| Ok((sock::local_addr(&s)?, s.v6))) {
                Ok((a, v6)) => {
                    // SAFETY: the caller's buffer.
                    unsafe { write_addr(a, v6, addr, len) };
                    0
                }
                Err(e) => {
                    set_errno(e);
                    -1
                }
            }
        }),
    }
}

/// `getpeername(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    match ours_checked(fd) {
        // SAFETY: passing the call on.
        None => unsafe { (real().getpeername)(fd, addr, len) },
        Some(s) => guard(-1, || {
            match s.and_then(|s| Ok((sock::peer_addr(&s)?, s.v6))) {
                Ok((a, v6)) => {
                    // SAFETY: the caller's buffer.
                    unsafe { write_addr(a, v6, addr, len) };
                    0
                }
                Err(e) => {
                    set_errno(e);
                    -1
                }
            }
        }),
    }
}

/// `setsockopt(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    match ours_checked(fd) {
        // SAFETY: passing the call on.
        None => unsafe { (real().setsockopt)(fd, level, name, val, len) },
        Some(s) => guard(-1, || {
            let v: &[u8] = if val.is_null() {
                &[]
            } else {
                // SAFETY: the caller's option value of `len` bytes.
                unsafe { std::slice::from_raw_parts(val.cast::<u8>(), len as usize) }
            };
            let r = s.and_then(|s| crate::opts::set(&s, level, name, v));
            ret(r.map(|()| 0i64)) as c_int
        }),
    }
}

/// `getsockopt(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    match ours_checked(fd) {
        // SAFETY: passing the call on.
        None => unsafe { (real().getsockopt)(fd, level, name, val, len) },
        Some(s) => guard(-1, || {
            let r = s
                .and_then(|s| crate::opts::get(&s, level, name))
                .and_then(|v| {
                    if val.is_null() || len.is_null() {
                        return Err(libc::EFAULT);
                    }
                    // SAFETY: the caller's buffer of `*len` bytes: copy what fits.
                    unsafe {
                        let n = (*len as usize).min(v.len());
                        std::ptr::copy_nonoverlapping(v.as_ptr(), val.cast::<u8>(), n);
                        *len = n as socklen_t;
                    }
                    Ok(())
                });
            ret(r.map(|()| 0i64)) as c_int
        }),
    }
}
