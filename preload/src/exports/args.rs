//! C arguments and results for the interposed functions: the descriptor
//! look-up (a ustack socket, an errno, or not ours), errno results, a
//! panic turned into EIO, IPv4 addresses and iovecs.

use std::ffi::c_int;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;

use libc::{iovec, sockaddr, sockaddr_in, socklen_t};

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

/// Read a caller's IPv4 address.
///
/// # Safety
/// `addr` is null or valid for `len` bytes.
pub(super) unsafe fn read_addr(addr: *const sockaddr, len: socklen_t) -> Res<SocketAddrV4> {
    if addr.is_null() {
        return Err(libc::EFAULT);
    }
    if (len as usize) < std::mem::size_of::<sockaddr_in>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's buffer holds a sockaddr_in (checked length).
    let a = unsafe { std::ptr::read_unaligned(addr.cast::<sockaddr_in>()) };
    if c_int::from(a.sin_family) != libc::AF_INET {
        return Err(libc::EAFNOSUPPORT);
    }
    Ok(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
        u16::from_be(a.sin_port),
    ))
}

/// Write an IPv4 address into a caller's buffer (truncated to its length,
/// which is set to the address's, as the kernel does).
///
/// # Safety
/// `addr`/`len` are null or valid, `*len` bytes at `addr`.
pub(super) unsafe fn write_addr(a: SocketAddrV4, addr: *mut sockaddr, len: *mut socklen_t) {
    if addr.is_null() || len.is_null() {
        return;
    }
    let sin = sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    let full = std::mem::size_of::<sockaddr_in>();
    // SAFETY: the caller's length and buffer.
    unsafe {
        let room = (*len as usize).min(full);
        std::ptr::copy_nonoverlapping(
            (&sin as *const sockaddr_in).cast::<u8>(),
            addr.cast::<u8>(),
            room,
        );
        *len = full as socklen_t;
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
