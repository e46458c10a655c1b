//! The interposed C functions. Each looks its descriptor up: a ustack
//! socket's goes to `sock`/`poll`, everything else to the C library
//! unchanged. C arguments are checked and turned into Rust values here.

use std::ffi::{c_int, c_long, c_uint, c_ulong, c_void};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use libc::{
    epoll_event, fd_set, iovec, msghdr, nfds_t, off_t, pollfd, sigset_t, size_t, sockaddr,
    sockaddr_in, socklen_t, ssize_t, timespec, timeval,
};

use crate::fd::{self, Sock};
use crate::own;
use crate::poll;
use crate::real::{real, set_errno};
use crate::sock::{self, RecvFlags, Res};
use crate::state::forked;

/// A ustack socket's descriptor: its socket, or an errno to fail with (a
/// forked child's inherited sockets are the parent's). None: not ours.
fn ours(fd: c_int) -> Option<Result<Arc<Sock>, c_int>> {
    owned(fd::get(fd)?)
}

/// As [`ours`], with the descriptor's identity checked (one `fstat`): for
/// the calls off the data path, where a number closed behind the layer's
/// back and reused by the kernel must not be taken for a socket.
fn ours_checked(fd: c_int) -> Option<Result<Arc<Sock>, c_int>> {
    owned(fd::get_checked(fd)?)
}

/// A ustack socket of this process, or EBADF (said once) in a forked child
/// without the stack.
fn owned(s: Arc<Sock>) -> Option<Result<Arc<Sock>, c_int>> {
    if forked() {
        crate::notice("forked", || {
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
fn ret<T: Into<i64>>(r: Res<T>) -> i64 {
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
fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            crate::unsupported("a call that failed inside the layer (a bug; please report it)");
            set_errno(libc::EIO);
            fallback
        }
    }
}

/// Read a caller's IPv4 address.
///
/// # Safety
/// `addr` is null or valid for `len` bytes.
unsafe fn read_addr(addr: *const sockaddr, len: socklen_t) -> Res<SocketAddrV4> {
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
unsafe fn write_addr(a: SocketAddrV4, addr: *mut sockaddr, len: *mut socklen_t) {
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
unsafe fn iovecs<'a>(iov: *const iovec, n: c_int) -> Res<Vec<&'a mut [u8]>> {
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

// ------------------------------------------------------------------ sockets

/// `socket(2)`: AF_INET stream and datagram sockets go to ustack.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    if domain == libc::AF_INET {
        let base = ty & 0xf;
        let stream = base == libc::SOCK_STREAM && (protocol == 0 || protocol == libc::IPPROTO_TCP);
        let dgram = base == libc::SOCK_DGRAM && (protocol == 0 || protocol == libc::IPPROTO_UDP);
        // The first such socket of the program starts the stack.
        if (stream || dgram) && crate::state::start_for_socket().is_some() {
            let nb = ty & libc::SOCK_NONBLOCK != 0;
            let cx = ty & libc::SOCK_CLOEXEC != 0;
            return guard(-1, || {
                ret(sock::socket(stream, nb, cx).map(i64::from)) as c_int
            });
        }
    }
    if domain == libc::AF_INET6
        && matches!(ty & 0xf, libc::SOCK_STREAM | libc::SOCK_DGRAM)
        && crate::state::planned()
    {
        crate::notice("inet6", || {
            format!(
                "process {} opened an AF_INET6 socket: it runs on the kernel's network stack (ustack carries IPv4 only so far; ask the program for IPv4, e.g. iperf3 -4 or an IPv4 bind address)",
                std::process::id()
            )
        });
    }
    // SAFETY: the C library's socket with the caller's arguments.
    let fd = unsafe { (real().socket)(domain, ty, protocol) };
    fd::fresh(fd);
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
            // SAFETY: the caller's address.
            let r = s.and_then(|s| unsafe { read_addr(addr, len) }.and_then(|a| sock::bind(&s, a)));
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
            fd::fresh(new);
            new
        }
        Some(s) => guard(-1, || {
            let r = s.and_then(|s| {
                sock::accept(
                    &s,
                    flags & libc::SOCK_NONBLOCK != 0,
                    flags & libc::SOCK_CLOEXEC != 0,
                )
            });
            match r {
                Ok((nfd, peer)) => {
                    // SAFETY: the caller's address buffer.
                    unsafe { write_addr(peer, addr, len) };
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
                let a = unsafe { read_addr(addr, len) }?;
                sock::connect(&s, a)
            });
            ret(r.map(|()| 0i64)) as c_int
        }),
    }
}

// --------------------------------------------------------------------- data

/// A receive into `bufs` on a ustack socket, with the source written out.
///
/// # Safety
/// `from`/`fromlen` null or valid.
unsafe fn do_recv(
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
                unsafe { write_addr(a, from, fromlen) };
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
fn do_send(s: Arc<Sock>, bufs: &[&[u8]], to: Option<SocketAddrV4>, flags: c_int) -> ssize_t {
    match sock::send(&s, bufs, to, flags & libc::MSG_DONTWAIT != 0) {
        Ok(n) => n as ssize_t,
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

fn fortify_fail() -> ! {
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
                // No TCP Fast Open yet: connect, then send as usual (what
                // Linux does without a cookie: a plain handshake first; a
                // non-blocking socket gets EINPROGRESS and sends later).
                // SAFETY: the caller's address.
                let r = unsafe { read_addr(to, tolen) }.and_then(|a| {
                    if matches!(*s.kind.lock(), fd::Kind::Fresh { .. }) {
                        sock::connect(&s, a)
                    } else {
                        Ok(())
                    }
                });
                if let Err(e) = r {
                    set_errno(e);
                    return -1;
                }
            }
            let dst = if to.is_null() || s.stream {
                None
            } else {
                // SAFETY: the caller's address.
                match unsafe { read_addr(to, tolen) } {
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

/// Control messages in the kernel's layout (`struct cmsghdr`, each padded
/// to the size of a long) for a buffer of `room` bytes: the bytes, and
/// whether some did not fit (MSG_CTRUNC).
pub(crate) fn cmsgs(list: &[(c_int, c_int, &[u8])], room: usize) -> (Vec<u8>, bool) {
    let hdr = std::mem::size_of::<libc::cmsghdr>();
    let align = std::mem::size_of::<usize>();
    let mut out = Vec::new();
    for &(level, ty, data) in list {
        let len = hdr + data.len();
        let space = len.div_ceil(align) * align;
        if out.len() + space > room {
            return (out, true);
        }
        out.extend_from_slice(&len.to_ne_bytes());
        out.extend_from_slice(&level.to_ne_bytes());
        out.extend_from_slice(&ty.to_ne_bytes());
        out.extend_from_slice(data);
        out.resize(out.len() + space - len, 0);
    }
    (out, false)
}

/// The control messages in a caller's buffer: (level, type, data) each.
fn parse_cmsgs(ctl: &[u8]) -> Res<Vec<(c_int, c_int, &[u8])>> {
    let hdr = std::mem::size_of::<libc::cmsghdr>();
    let align = std::mem::size_of::<usize>();
    let mut v = Vec::new();
    let mut at = 0;
    while ctl.len() >= at + hdr {
        let field = |o: usize, n: usize| &ctl[at + o..at + o + n];
        let len = usize::from_ne_bytes(field(0, 8).try_into().map_err(|_| libc::EINVAL)?);
        let level = c_int::from_ne_bytes(field(8, 4).try_into().map_err(|_| libc::EINVAL)?);
        let ty = c_int::from_ne_bytes(field(12, 4).try_into().map_err(|_| libc::EINVAL)?);
        if len < hdr || at + len > ctl.len() {
            return Err(libc::EINVAL);
        }
        v.push((level, ty, &ctl[at + hdr..at + len]));
        at += len.div_ceil(align) * align;
    }
    Ok(v)
}

/// An IPv4 address's four bytes in network order.
fn in_addr_bytes(ip: Ipv4Addr) -> [u8; 4] {
    ip.octets()
}

/// A `recvmsg` on a ustack socket: the bytes or datagram, its source, and
/// the control messages the socket asked for (`IP_PKTINFO`: the stack's
/// interface and address; `IP_RECVORIGDSTADDR`: the address and port the
/// datagram was sent to). -1 with errno on failure.
///
/// # Safety
/// `m` is the caller's msghdr: its iovecs, name and control buffers valid
/// for their lengths.
unsafe fn recvmsg_ours(s: &Arc<Sock>, m: &mut msghdr, flags: c_int) -> ssize_t {
    if flags & libc::MSG_ERRQUEUE != 0 {
        // No ICMP errors are queued (IP_RECVERR is kept, not acted on):
        // Linux says EAGAIN for an empty error queue.
        set_errno(libc::EAGAIN);
        return -1;
    }
    // SAFETY: its iovecs.
    let mut v = match unsafe { iovecs(m.msg_iov, m.msg_iovlen as c_int) } {
        Ok(v) => v,
        Err(e) => {
            set_errno(e);
            return -1;
        }
    };
    let room: usize = v.iter().map(|b| b.len()).sum();
    let f = RecvFlags {
        dontwait: flags & libc::MSG_DONTWAIT != 0,
        waitall: flags & libc::MSG_WAITALL != 0,
        peek: flags & libc::MSG_PEEK != 0,
        trunc: true,
    };
    let r = match sock::recv(s, &mut v, f) {
        Ok(r) => r,
        Err(e) => {
            set_errno(e);
            return -1;
        }
    };
    let n = r.full.max(r.len) as ssize_t;
    let got_datagram = r.from.is_some();
    match r.from {
        Some(a) if !m.msg_name.is_null() => {
            let mut alen = m.msg_namelen;
            // SAFETY: the caller's name buffer of `msg_namelen` bytes.
            unsafe { write_addr(a, m.msg_name.cast(), &mut alen) };
            m.msg_namelen = alen;
        }
        _ => m.msg_namelen = 0,
    }
    m.msg_flags = if n as usize > room {
        libc::MSG_TRUNC
    } else {
        0
    };
    let (pktinfo, origdst) = {
        let o = s.opts.lock();
        (o.pktinfo, o.origdstaddr)
    };
    let mut list: Vec<(c_int, c_int, Vec<u8>)> = Vec::new();
    if got_datagram && (pktinfo || origdst) {
        if let Ok(local) = sock::local_addr(s) {
            let ip = in_addr_bytes(*local.ip());
            if pktinfo {
                // struct in_pktinfo: ifindex, spec_dst, addr.
                let mut p = crate::opts::stack_iface().1.to_ne_bytes().to_vec();
                p.extend_from_slice(&ip);
                p.extend_from_slice(&ip);
                list.push((libc::IPPROTO_IP, libc::IP_PKTINFO, p));
            }
            if origdst {
                // struct sockaddr_in (IP_ORIGDSTADDR is 20).
                let mut a = (libc::AF_INET as u16).to_ne_bytes().to_vec();
                a.extend_from_slice(&local.port().to_be_bytes());
                a.extend_from_slice(&ip);
                a.extend_from_slice(&[0; 8]);
                list.push((libc::IPPROTO_IP, 20, a));
            }
        }
    }
    let borrowed: Vec<(c_int, c_int, &[u8])> = list
        .iter()
        .map(|(l, t, d)| (*l, *t, d.as_slice()))
        .collect();
    let room_ctl = if m.msg_control.is_null() {
        0
    } else {
        m.msg_controllen
    };
    let (ctl, truncated) = cmsgs(&borrowed, room_ctl);
    if !ctl.is_empty() {
        // SAFETY: the caller's control buffer holds `msg_controllen` bytes,
        // and `ctl` is no longer.
        unsafe {
            std::ptr::copy_nonoverlapping(ctl.as_ptr(), m.msg_control.cast::<u8>(), ctl.len())
        };
    }
    m.msg_controllen = ctl.len();
    if truncated {
        m.msg_flags |= libc::MSG_CTRUNC;
    }
    if flags & libc::MSG_TRUNC != 0 {
        n
    } else {
        (n as usize).min(room) as ssize_t
    }
}

/// A `sendmsg` on a ustack socket. An `IP_PKTINFO` control message may
/// name the source: the stack's own address (or none) is all there is.
/// -1 with errno on failure.
///
/// # Safety
/// `m` is the caller's msghdr: its iovecs, name and control buffers valid
/// for their lengths.
unsafe fn sendmsg_ours(s: &Arc<Sock>, m: &msghdr, flags: c_int) -> ssize_t {
    // SAFETY: its iovecs.
    let v = match unsafe { iovecs(m.msg_iov, m.msg_iovlen as c_int) } {
        Ok(v) => v,
        Err(e) => {
            set_errno(e);
            return -1;
        }
    };
    let dst = if m.msg_name.is_null() || s.stream {
        None
    } else {
        // SAFETY: the caller's address.
        match unsafe { read_addr(m.msg_name.cast(), m.msg_namelen) } {
            Ok(a) => Some(a),
            Err(e) => {
                set_errno(e);
                return -1;
            }
        }
    };
    if !s.stream && !m.msg_control.is_null() && m.msg_controllen > 0 {
        // SAFETY: the caller's control buffer of `msg_controllen` bytes.
        let ctl =
            unsafe { std::slice::from_raw_parts(m.msg_control.cast::<u8>(), m.msg_controllen) };
        let list = match parse_cmsgs(ctl) {
            Ok(l) => l,
            Err(e) => {
                set_errno(e);
                return -1;
            }
        };
        for (level, ty, data) in list {
            if level == libc::IPPROTO_IP && ty == libc::IP_PKTINFO && data.len() >= 12 {
                let spec = Ipv4Addr::new(data[4], data[5], data[6], data[7]);
                let ours = sock::local_addr(s).map(|a| *a.ip()).ok();
                if !spec.is_unspecified() && Some(spec) != ours {
                    // Not an address of ours: no route from it (Linux
                    // says ENETUNREACH).
                    set_errno(libc::ENETUNREACH);
                    return -1;
                }
            }
        }
    }
    let bufs: Vec<&[u8]> = v.into_iter().map(|b| &*b).collect();
    do_send(s.clone(), &bufs, dst, flags)
}

/// `recvmsg(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    match ours(fd) {
        // SAFETY: passing the call on.
        None => unsafe { (real().recvmsg)(fd, msg, flags) },
        Some(Err(e)) => {
            set_errno(e);
            -1
        }
        Some(Ok(s)) => guard(-1, || {
            if msg.is_null() {
                set_errno(libc::EFAULT);
                return -1;
            }
            // SAFETY: the caller's msghdr and its buffers.
            unsafe { recvmsg_ours(&s, &mut *msg, flags) }
        }),
    }
}

/// `sendmsg(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    match ours(fd) {
        // SAFETY: passing the call on.
        None => unsafe { (real().sendmsg)(fd, msg, flags) },
        Some(Err(e)) => {
            set_errno(e);
            -1
        }
        Some(Ok(s)) => guard(-1, || {
            if msg.is_null() {
                set_errno(libc::EFAULT);
                return -1;
            }
            // SAFETY: the caller's msghdr and its buffers.
            unsafe { sendmsg_ours(&s, &*msg, flags) }
        }),
    }
}

/// Linux's bound on a `recvmmsg`/`sendmmsg` batch (UIO_MAXIOV).
const MMSG_MAX: c_uint = 1024;

/// `recvmmsg(2)`: `recvmsg` for each message in turn, as Linux: a blocking
/// socket waits for each (the first only with MSG_WAITFORONE, after which
/// the rest are taken without waiting); `timeout` is checked after each
/// message. An error after some messages ends the batch with their count.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    msgvec: *mut libc::mmsghdr,
    vlen: c_uint,
    flags: c_int,
    timeout: *mut timespec,
) -> c_int {
    match ours(fd) {
        // SAFETY: passing the call on.
        None => unsafe { (real().recvmmsg)(fd, msgvec, vlen, flags, timeout) },
        Some(Err(e)) => {
            set_errno(e);
            -1
        }
        Some(Ok(s)) => guard(-1, || {
            if msgvec.is_null() && vlen > 0 {
                set_errno(libc::EFAULT);
                return -1;
            }
            let deadline = if timeout.is_null() {
                None
            } else {
                // SAFETY: the caller's timespec.
                let t = unsafe { *timeout };
                if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) {
                    set_errno(libc::EINVAL);
                    return -1;
                }
                Some(std::time::Instant::now() + Duration::new(t.tv_sec as u64, t.tv_nsec as u32))
            };
            let wait_for_one = flags & libc::MSG_WAITFORONE != 0;
            let mut flags = flags & !libc::MSG_WAITFORONE;
            let mut done: c_uint = 0;
            while done < vlen.min(MMSG_MAX) {
                // SAFETY: the caller's array of `vlen` mmsghdrs.
                let mm = unsafe { &mut *msgvec.add(done as usize) };
                // SAFETY: each holds a msghdr with valid buffers.
                let n = unsafe { recvmsg_ours(&s, &mut mm.msg_hdr, flags) };
                if n < 0 {
                    if done == 0 {
                        return -1;
                    }
                    break;
                }
                mm.msg_len = n as c_uint;
                done += 1;
                if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                    break;
                }
                if s.stream && n == 0 {
                    break;
                }
                if wait_for_one {
                    flags |= libc::MSG_DONTWAIT;
                }
            }
            done as c_int
        }),
    }
}

/// `sendmmsg(2)`: `sendmsg` for each message in turn; an error after some
/// messages ends the batch with their count, as Linux.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmmsg(
    fd: c_int,
    msgvec: *mut libc::mmsghdr,
    vlen: c_uint,
    flags: c_int,
) -> c_int {
    match ours(fd) {
        // SAFETY: passing the call on.
        None => unsafe { (real().sendmmsg)(fd, msgvec, vlen, flags) },
        Some(Err(e)) => {
            set_errno(e);
            -1
        }
        Some(Ok(s)) => guard(-1, || {
            if msgvec.is_null() && vlen > 0 {
                set_errno(libc::EFAULT);
                return -1;
            }
            let mut done: c_uint = 0;
            while done < vlen.min(MMSG_MAX) {
                // SAFETY: the caller's array of `vlen` mmsghdrs.
                let mm = unsafe { &mut *msgvec.add(done as usize) };
                // SAFETY: each holds a msghdr with valid buffers.
                let n = unsafe { sendmsg_ours(&s, &mm.msg_hdr, flags) };
                if n < 0 {
                    if done == 0 {
                        return -1;
                    }
                    break;
                }
                mm.msg_len = n as c_uint;
                done += 1;
            }
            done as c_int
        }),
    }
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
        let sent = match sock::send(s, &[&buf[..n]], None, false) {
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

// -------------------------------------------------------------- descriptors

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
    if fd::get_checked(fd).is_some() {
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

/// A new descriptor `new` for the ustack socket of `old` (made by the kernel
/// as a copy of its eventfd): record it.
fn adopt_dup(old: &Arc<Sock>, new: c_int) -> c_int {
    if new >= 0 {
        old.add_fd(new);
        fd::insert(new, old.clone());
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
            fd::fresh(new);
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
        Some(Ok(s)) => adopt_dup(&s, r),
        _ => {
            fd::fresh(r);
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
            fd::fresh(r);
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
            crate::unsupported(&format!(
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
            crate::unsupported(&format!("ioctl {r:#x} on a ustack socket (ENOTTY)"));
            set_errno(libc::ENOTTY);
            -1
        }
    })
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
        Some(s) => guard(-1, || match s.and_then(|s| sock::local_addr(&s)) {
            Ok(a) => {
                // SAFETY: the caller's buffer.
                unsafe { write_addr(a, addr, len) };
                0
            }
            Err(e) => {
                set_errno(e);
                -1
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
        Some(s) => guard(-1, || match s.and_then(|s| sock::peer_addr(&s)) {
            Ok(a) => {
                // SAFETY: the caller's buffer.
                unsafe { write_addr(a, addr, len) };
                0
            }
            Err(e) => {
                set_errno(e);
                -1
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

// ---------------------------------------------------------------- readiness

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
    fd::fresh(fd);
    // Tracked before the stack starts too: a program makes its epoll sets
    // first and adds sockets later (memcached's workers).
    if fd >= 0 && crate::state::planned() {
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
    fd::fresh(fd);
    // Tracked before the stack starts too: a program makes its epoll sets
    // first and adds sockets later (memcached's workers).
    if fd >= 0 && crate::state::planned() {
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

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn control_messages_round_trip_in_the_kernels_layout() {
        let pktinfo = [7u8; 12];
        let (b, cut) = cmsgs(&[(libc::IPPROTO_IP, libc::IP_PKTINFO, &pktinfo)], 64);
        assert!(!cut);
        // CMSG_SPACE(12) on x86-64: a 16-byte header, 12 bytes padded to 16.
        assert_eq!(b.len(), 32);
        assert_eq!(usize::from_ne_bytes(b[..8].try_into().unwrap()), 28);
        let back = parse_cmsgs(&b).unwrap();
        assert_eq!(
            back,
            vec![(libc::IPPROTO_IP, libc::IP_PKTINFO, &pktinfo[..])]
        );
        // No room: nothing written, MSG_CTRUNC.
        let (b, cut) = cmsgs(&[(libc::IPPROTO_IP, libc::IP_PKTINFO, &pktinfo)], 31);
        assert!(cut && b.is_empty());
        // A header claiming more than the buffer: EINVAL.
        let mut bad = cmsgs(&[(0, 0, &[1, 2, 3, 4])], 64).0;
        bad[0] = 200;
        assert_eq!(parse_cmsgs(&bad), Err(libc::EINVAL));
    }
}
