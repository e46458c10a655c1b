//! C arguments and results for the interposed functions: the descriptor
//! look-up (a ustack socket, an errno, or not ours), errno results, a
//! panic turned into EIO, socket addresses of either family and iovecs.

use std::ffi::c_int;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use libc::{iovec, sockaddr, sockaddr_in, sockaddr_in6, socklen_t};

use crate::fd::{self, Sock};
use crate::real::Res;
use crate::real::set_errno;
use crate::sock;
use crate::state::forked;

/// A ustack socket's descriptor: its socket, or an errno to fail with (a
/// forked child's inherited sockets are the parent's). None: not ours.
pub(super) fn ours(fd: c_int) -> Option<Result<Arc<Sock>, c_int>> {
    owned(fd::get(fd)?)
}

/// As [`ours`], with the descriptor's identity checked (one `fstat`): for
/// the calls off the data path, where a number closed behind the layer's
/// back and reused by the kernel must not be taken for a socket.
pub(super) fn ours_checked(fd: c_int) -> Option<Result<Arc<Sock>, c_int>> {
    owned(sock::get_checked(fd)?)
}

/// A ustack socket of this process, or EBADF (said once) in a forked child
/// without the stack.
pub(super) fn owned(s: Arc<Sock>) -> Option<Result<Arc<Sock>, c_int>> {
    if forked() {
        crate::report::notice("forked", || {
            format!(
                "process {} used a socket its parent opened on ustack: the stack stays with the parent, so calls on it fail here with EBADF (only close works; ustack exec --fork child moves the stack to the child)",
                std::process::id()
            )
        });
        return Some(Err(libc::EBADF));
    }
    Some(Ok(s))
}

/// A C result from a Rust one: the value, or -1 with errno.
pub(super) fn ret<T: Into<i64>>(r: Res<T>) -> i64 {
    match r {
        Ok(v) => v.into(),
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// Run `f`, turning a panic (a bug here) into EIO rather than an abort
/// of the program.
pub(super) fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    let _held = crate::signals::Held::new();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            crate::report::unsupported(
                "a call that failed inside the layer (a bug; please report it)",
            );
            set_errno(libc::EIO);
            fallback
        }
    }
}

/// Read a caller's address for a socket of family `v6` (`AF_INET6`, else
/// `AF_INET`): an `AF_INET6` socket takes a `sockaddr_in6` (a v4-mapped
/// address, `::ffff:a.b.c.d`, is the IPv4 peer it names) or, as Linux's
/// connect and sendto, a `sockaddr_in`; an `AF_INET` socket a
/// `sockaddr_in` only.
///
/// # Safety
/// `addr` is null or valid for `len` bytes.
pub(super) unsafe fn read_addr(addr: *const sockaddr, len: socklen_t, v6: bool) -> Res<SocketAddr> {
    if addr.is_null() {
        return Err(libc::EFAULT);
    }
    if (len as usize) < std::mem::size_of::<libc::sa_family_t>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's buffer holds at least the family (checked).
    let family = c_int::from(unsafe { std::ptr::read_unaligned(addr.cast::<libc::sa_family_t>()) });
    match family {
        libc::AF_INET6 if v6 => {
            if (len as usize) < std::mem::size_of::<sockaddr_in6>() {
                return Err(libc::EINVAL);
            }
            // SAFETY: the caller's buffer holds a sockaddr_in6 (checked length).
            let a = unsafe { std::ptr::read_unaligned(addr.cast::<sockaddr_in6>()) };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            let port = u16::from_be(a.sin6_port);
            Ok(match ip.to_ipv4_mapped() {
                Some(v4) => SocketAddr::new(v4.into(), port),
                None => SocketAddr::new(ip.into(), port),
            })
        }
        libc::AF_INET => {
            if (len as usize) < std::mem::size_of::<sockaddr_in>() {
                return Err(libc::EINVAL);
            }
            // SAFETY: the caller's buffer holds a sockaddr_in (checked length).
            let a = unsafe { std::ptr::read_unaligned(addr.cast::<sockaddr_in>()) };
            Ok(SocketAddr::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)).into(),
                u16::from_be(a.sin_port),
            ))
        }
        _ => Err(libc::EAFNOSUPPORT),
    }
}

/// Copy the bytes of `value` into a caller's address buffer (truncated to
/// its length, which is set to the address's, as the kernel does).
///
/// # Safety
/// `addr`/`len` are null or valid, `*len` bytes at `addr`.
unsafe fn copy_out<T>(value: &T, addr: *mut sockaddr, len: *mut socklen_t) {
    if addr.is_null() || len.is_null() {
        return;
    }
    let full = std::mem::size_of::<T>();
    // SAFETY: the caller's length and buffer; `value` is `full` bytes.
    unsafe {
        let room = (*len as usize).min(full);
        std::ptr::copy_nonoverlapping((value as *const T).cast::<u8>(), addr.cast::<u8>(), room);
        *len = full as socklen_t;
    }
}

/// Write an address into a caller's buffer in the socket's family (`v6`:
/// a `sockaddr_in6`, IPv4 addresses v4-mapped; else a `sockaddr_in`),
/// truncated to the buffer's length, which is set to the address's.
///
/// # Safety
/// `addr`/`len` are null or valid, `*len` bytes at `addr`.
pub(super) unsafe fn write_addr(a: SocketAddr, v6: bool, addr: *mut sockaddr, len: *mut socklen_t) {
    match a {
        SocketAddr::V4(a) if !v6 => {
            let sin = sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: the caller's buffer.
            unsafe { copy_out(&sin, addr, len) }
        }
        a => {
            let ip = match a.ip() {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            let sin6 = sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: ip.octets(),
                },
                sin6_scope_id: link_scope(&ip),
            };
            // SAFETY: the caller's buffer.
            unsafe { copy_out(&sin6, addr, len) }
        }
    }
}

/// The scope of an address a program is given: the stack's interface
/// index for a link-local one (as the kernel gives), else 0.
fn link_scope(ip: &Ipv6Addr) -> u32 {
    if ip.is_unicast_link_local() {
        u32::try_from(crate::opts::stack_iface().1).unwrap_or(0)
    } else {
        0
    }
}

/// The caller's iovecs as slices (empty ones skipped).
///
/// # Safety
/// `iov` is valid for `n` iovecs, each valid for its length.
pub(super) unsafe fn iovecs<'a>(iov: *const iovec, n: c_int) -> Res<Vec<&'a mut [u8]>> {
    if !(0..=1024).contains(&n) {
        return Err(libc::EINVAL);
    }
    if n > 0 && iov.is_null() {
        return Err(libc::EFAULT);
    }
    let mut v = Vec::with_capacity(n as usize);
    for i in 0..n as usize {
        // SAFETY: the caller's array of `n` iovecs.
        let e = unsafe { &*iov.add(i) };
        if e.iov_len > 0 {
            // SAFETY: each iovec is valid for iov_len bytes.
            v.push(unsafe { std::slice::from_raw_parts_mut(e.iov_base.cast::<u8>(), e.iov_len) });
        }
    }
    Ok(v)
}
