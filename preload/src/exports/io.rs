//! Reads and writes: `read`/`write`, `readv`/`writev`, `recv`/`send`,
//! `recvfrom`/`sendto`, their fortified `_chk` forms, and `sendfile`.

use std::ffi::{c_int, c_long, c_void};
use std::net::SocketAddr;
use std::sync::Arc;

use libc::{iovec, off_t, size_t, sockaddr, socklen_t, ssize_t};

use crate::exports::args::{guard, iovecs, ours, read_addr, write_addr};
use crate::fd::{self, Sock};
use crate::real::{real, set_errno};
use crate::sock::{self, RecvFlags};

/// A receive into `bufs` on a ustack socket, with the source written out.
///
/// # Safety
/// `from`/`fromlen` null or valid.
pub(super) unsafe fn do_recv(
    s: Arc<Sock>,
    bufs: &mut [&mut [u8]],
    flags: c_int,
    from: *mut sockaddr,
    fromlen: *mut socklen_t,
) -> ssize_t {
    let f = RecvFlags {
        dontwait: flags & libc::MSG_DONTWAIT != 0,
        waitall: flags & libc::MSG_WAITALL != 0,
        peek: flags & libc::MSG_PEEK != 0,
        trunc: flags & libc::MSG_TRUNC != 0,
    };
    match sock::recv(&s, bufs, f) {
        Ok(r) => {
            if let Some(a) = r.from {
                // SAFETY: the caller's buffer.
                unsafe { write_addr(a, s.v6, from, fromlen) };
            }
            (if f.trunc { r.full.max(r.len) } else { r.len }) as ssize_t
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// A send on a ustack socket; EPIPE raises SIGPIPE unless MSG_NOSIGNAL.
pub(super) fn do_send(
    s: Arc<Sock>,
    bufs: &[&[u8]],
    to: Option<SocketAddr>,
    flags: c_int,
) -> ssize_t {
    let eor = flags & libc::MSG_EOR != 0;
    let more = flags & libc::MSG_MORE != 0;
    match sock::send(&s, bufs, to, flags & libc::MSG_DONTWAIT != 0, eor, more) {
        Ok(n) => {
            if flags & libc::MSG_ZEROCOPY != 0 {
                sock::zerocopy_sent(&s, n);
            }
            sock::timestamping_sent(&s, n);
            n as ssize_t
        }
        Err(e) => {
            if e == libc::EPIPE && flags & libc::MSG_NOSIGNAL == 0 {
                // SAFETY: raising a signal on this thread, as the kernel would.
                unsafe { libc::raise(libc::SIGPIPE) };
            }
            set_errno(e);
            -1
        }
    }
}

/// `read(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    match ours(fd) {
        // SAFETY: passing the call on.
        None => unsafe { (real().read)(fd, buf, count) },
        Some(Err(e)) => {
            set_errno(e);
            -1
        }
        Some(Ok(s)) => guard(-1, || {
            if buf.is_null() && count > 0 {
                set_errno(libc::EFAULT);
                return -1;
            }
            // SAFETY: the caller's buffer of `count` bytes.
            let b = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), count) };
            // SAFETY: no address out.
            unsafe { do_recv(s, &mut [b], 0, std::ptr::null_mut(), std::ptr::null_mut()) }
        }),
    }
}

/// `__read_chk` (fortified `read`).
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    count: size_t,
    buflen: size_t,
) -> ssize_t {
    if count > buflen {
        fortify_fail();
    }
    // SAFETY: checked as the C library would.
    unsafe { read(fd, buf, count) }
}

pub(super) fn fortify_fail() -> ! {
    let msg = b"*** buffer overflow detected ***: terminated\n";
    // SAFETY: a raw write to stderr, then abort, as glibc's __chk_fail.
    unsafe {
        crate::real::sys(
            libc::SYS_write,
            [2, msg.as_ptr() as c_long, msg.len() as c_long, 0, 0, 0],
        );
        libc::abort();
    }
}

/// `write(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    match ours(fd) {
        // SAFETY: passing the call on.
        None => unsafe { (real().write)(fd, buf, count) },
        Some(Err(e)) => {
            set_errno(e);
            -1
        }
        Some(Ok(s)) => guard(-1, || {
            if buf.is_null() && count > 0 {
                set_errno(libc::EFAULT);
                return -1;
            }
            // SAFETY: the caller's buffer of `count` bytes.
            let b = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), count) };
            do_send(s, &[b], None, 0)
        }),
    }
}

/// `readv(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    match ours(fd) {
        // SAFETY: passing the call on.
        None => unsafe { (real().readv)(fd, iov, n) },
        Some(Err(e)) => {
            set_errno(e);
            -1
        }
        Some(Ok(s)) => guard(-1, || {
            // SAFETY: the caller's iovecs.
            match unsafe { iovecs(iov, n) } {
                // SAFETY: no address out.
                Ok(mut v) => unsafe {
                    do_recv(s, &mut v, 0, std::ptr::null_mut(), std::ptr::null_mut())
                },
                Err(e) => {
                    set_errno(e);
                    -1
                }
            }
        }),
    }
}

/// `writev(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    match ours(fd) {
        // SAFETY: passing the call on.
        None => unsafe { (real().writev)(fd, iov, n) },
        Some(Err(e)) => {
            set_errno(e);
            -1
        }
        Some(Ok(s)) => guard(-1, || {
            // SAFETY: the caller's iovecs.
            match unsafe { iovecs(iov, n) } {
                Ok(v) => {
                    let bufs: Vec<&[u8]> = v.into_iter().map(|b| &*b).collect();
                    do_send(s, &bufs, None, 0)
                }
                Err(e) => {
                    set_errno(e);
                    -1
                }
            }
        }),
    }
}

/// `recvfrom(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    from: *mut sockaddr,
    fromlen: *mut socklen_t,
) -> ssize_t {
    match ours(fd) {
        // SAFETY: passing the call on.
        None => unsafe { (real().recvfrom)(fd, buf, len, flags, from, fromlen) },
        Some(Err(e)) => {
            set_errno(e);
            -1
        }
        Some(Ok(s)) => guard(-1, || {
            if buf.is_null() && len > 0 {
                set_errno(libc::EFAULT);
                return -1;
            }
            // SAFETY: the caller's buffer of `len` bytes.
            let b = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
            // SAFETY: the caller's address buffer.
            unsafe { do_recv(s, &mut [b], flags, from, fromlen) }
        }),
    }
}

/// `recv(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t {
    // SAFETY: recvfrom without an address.
    unsafe {
        recvfrom(
            fd,
            buf,
            len,
            flags,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
}

/// `__recv_chk` (fortified `recv`).
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    if len > buflen {
        fortify_fail();
    }
    // SAFETY: checked.
    unsafe { recv(fd, buf, len, flags) }
}

/// `__recvfrom_chk` (fortified `recvfrom`).
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    buflen: size_t,
    flags: c_int,
    from: *mut sockaddr,
    fromlen: *mut socklen_t,
) -> ssize_t {
    if len > buflen {
        fortify_fail();
    }
    // SAFETY: checked.
    unsafe { recvfrom(fd, buf, len, flags, from, fromlen) }
}

/// `MSG_FASTOPEN` with an address on a stream socket (`sendto`,
/// `sendmsg`): connect by Fast Open, then the caller sends as usual: with
/// a cookie kept for the server the connect returns at once and the data
/// leaves in the SYN; without, the SYN asks for one and a non-blocking
/// socket gets EINPROGRESS (Linux's tcp_sendmsg_fastopen), a blocking one
/// sends after the handshake. An `AF_UNSPEC` address, or the sysctl's
/// client bit off, is refused with EOPNOTSUPP, as Linux does (an address
/// shorter than its family field: EINVAL).
///
/// # Safety
/// `to` is the caller's address of `tolen` bytes.
pub(crate) unsafe fn fast_open_to(
    s: &Arc<Sock>,
    to: *const sockaddr,
    tolen: socklen_t,
) -> Result<(), c_int> {
    if (tolen as usize) < std::mem::size_of::<libc::sa_family_t>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's address, at least its family long.
    if c_int::from(unsafe { (*to).sa_family }) == libc::AF_UNSPEC
        || crate::sysctl::fast_open_flags() & crate::sysctl::FASTOPEN_CLIENT == 0
    {
        return Err(libc::EOPNOTSUPP);
    }
    // SAFETY: the caller's address.
    let a = unsafe { read_addr(to, tolen, s.v6) }?;
    if matches!(*s.kind.lock(), fd::Kind::Fresh { .. }) {
        sock::connect_as(s, a, true)?;
    }
    Ok(())
}

/// `sendto(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    to: *const sockaddr,
    tolen: socklen_t,
) -> ssize_t {
    match ours(fd) {
        // SAFETY: passing the call on.
        None => unsafe { (real().sendto)(fd, buf, len, flags, to, tolen) },
        Some(Err(e)) => {
            set_errno(e);
            -1
        }
        Some(Ok(s)) => guard(-1, || {
            if buf.is_null() && len > 0 {
                set_errno(libc::EFAULT);
                return -1;
            }
            if s.stream && flags & libc::MSG_FASTOPEN != 0 && !to.is_null() {
                // SAFETY: the caller's address of `tolen` bytes.
                if let Err(e) = unsafe { fast_open_to(&s, to, tolen) } {
                    set_errno(e);
                    return -1;
                }
            }
            let dst = if to.is_null() || s.stream {
                None
            } else {
                // SAFETY: the caller's address.
                match unsafe { read_addr(to, tolen, s.v6) } {
                    Ok(a) => Some(a),
                    Err(e) => {
                        set_errno(e);
                        return -1;
                    }
                }
            };
            // SAFETY: the caller's buffer.
            let b = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) };
            do_send(s, &[b], dst, flags)
        }),
    }
}

/// `send(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t {
    // SAFETY: sendto without an address.
    unsafe { sendto(fd, buf, len, flags, std::ptr::null(), 0) }
}

/// `sendfile(2)` to a ustack socket: read from the file, send what fits.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendfile(
    out: c_int,
    input: c_int,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    match ours(out) {
        // SAFETY: passing the call on.
        None => unsafe { (real().sendfile)(out, input, offset, count) },
        Some(Err(e)) => {
            set_errno(e);
            -1
        }
        Some(Ok(s)) => guard(-1, || {
            // SAFETY: the caller's offset and file.
            unsafe { sendfile_ustack(&s, input, offset, count) }
        }),
    }
}

/// `sendfile64` (the same on 64-bit).
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendfile64(
    out: c_int,
    input: c_int,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    // SAFETY: the same call.
    unsafe { sendfile(out, input, offset, count) }
}

/// Copy up to `count` bytes of `input` into the socket, chunk by chunk,
/// never reading more than the socket took (the file position, or
/// `*offset`, moves by what was sent).
///
/// # Safety
/// `offset` null or valid; `input` a descriptor.
unsafe fn sendfile_ustack(
    s: &Arc<Sock>,
    input: c_int,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    const CHUNK: usize = 64 << 10;
    let mut buf = vec![0u8; CHUNK.min(count.max(1))];
    let mut done: usize = 0;
    while done < count {
        let want = (count - done).min(buf.len());
        let n = if offset.is_null() {
            // SAFETY: the C library's read into our buffer.
            unsafe { (real().read)(input, buf.as_mut_ptr().cast(), want) }
        } else {
            // SAFETY: pread at the caller's offset.
            unsafe { libc::pread(input, buf.as_mut_ptr().cast(), want, *offset) }
        };
        if n < 0 {
            return if done > 0 { done as ssize_t } else { -1 };
        }
        if n == 0 {
            break;
        }
        let n = n as usize;
        let sent = match sock::send(s, &[&buf[..n]], None, false, false, false) {
            Ok(k) => k,
            Err(e) => {
                if offset.is_null() {
                    // SAFETY: put the unsent bytes back in the file position.
                    unsafe { libc::lseek(input, -(n as off_t), libc::SEEK_CUR) };
                }
                if done > 0 {
                    return done as ssize_t;
                }
                set_errno(e);
                return -1;
            }
        };
        if sent < n && offset.is_null() {
            // SAFETY: as above, for the part not sent.
            unsafe { libc::lseek(input, -((n - sent) as off_t), libc::SEEK_CUR) };
        }
        if !offset.is_null() {
            // SAFETY: the caller's offset.
            unsafe { *offset += sent as off_t };
        }
        done += sent;
        if sent < n {
            break;
        }
    }
    done as ssize_t
}
