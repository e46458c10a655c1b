//! The socket calls on ustack sockets, in Rust terms: each returns its
//! value or the errno Linux would give. `exports/` turns C arguments into
//! these and these into C results.

use std::ffi::c_int;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use libc::{EAGAIN, EINTR};
use ustack::Error as StackError;
use ustack::events::SocketRef;
use ustack::socket::tcp::{ConnError, Family, State as TcpState};
use ustack::socket::udp::UdpReuse;

use std::collections::HashMap;
use std::sync::Weak;

use parking_lot::Mutex;
use ustack::socket::tcp::ListenHandle;

use crate::fd::{self, Kind, Sock};
use crate::level::level;
use crate::real::{Res, real};
use crate::share::{Access, access};

/// The errno for an engine error.
pub fn errno_of(e: StackError) -> c_int {
    match e {
        StackError::AddrInUse => libc::EADDRINUSE,
        StackError::NoFreePort => libc::EADDRNOTAVAIL,
        StackError::InvalidHandle => libc::EBADF,
        StackError::QueueFull => EAGAIN,
        StackError::TooLarge => libc::EMSGSIZE,
        StackError::NoRoute => libc::ENETUNREACH,
        StackError::Closed => libc::EPIPE,
        StackError::Tcp(ConnError::Refused) => libc::ECONNREFUSED,
        StackError::Tcp(ConnError::Reset) => libc::ECONNRESET,
        StackError::Tcp(ConnError::TimedOut) => libc::ETIMEDOUT,
        StackError::Tcp(ConnError::Aborted) => libc::ECONNABORTED,
        StackError::Tcp(ConnError::NetUnreachable) => libc::ENETUNREACH,
        StackError::Tcp(ConnError::HostUnreachable) => libc::EHOSTUNREACH,
        StackError::Tcp(ConnError::ProtocolError) => libc::EPROTO,
        // No POSIX socket carries RDMA verbs.
        StackError::Ud(_) | StackError::Rc(_) => libc::EOPNOTSUPP,
    }
}

/// Whether a connection's error `e` is told to the program now: the first
/// call to meet it gets its errno; Linux reports an error once, and later
/// calls see a shut connection (end of stream, EPIPE).
fn first_report(sock: &Sock, e: &StackError) -> bool {
    if !matches!(e, StackError::Tcp(_)) {
        return true;
    }
    let mut o = sock.opts.lock();
    !std::mem::replace(&mut o.error_reported, true)
}

/// Copy `data` into the buffers `bufs`, in order.
pub fn scatter(mut data: &[u8], bufs: &mut [&mut [u8]]) {
    for b in bufs.iter_mut() {
        let n = b.len().min(data.len());
        b[..n].copy_from_slice(&data[..n]);
        data = &data[n..];
        if data.is_empty() {
            break;
        }
    }
}

/// What a blocking call waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Read,
    Write,
}

/// Block until `sock` is ready for `want` (or has an error or hang-up), a
/// signal arrives (EINTR), or `timeout_us` passes (EAGAIN; 0: forever).
/// Non-blocking sockets get EAGAIN at once.
fn wait(sock: &Sock, want: Want, nonblock: bool, timeout_us: i64) -> Res<()> {
    let deadline =
        (timeout_us > 0).then(|| Instant::now() + Duration::from_micros(timeout_us as u64));
    // Drain first, then look: an event after the look writes the eventfd
    // again and the kernel wait below returns at once. What is found
    // ready is passed on to the other processes waiting on the socket.
    let look = || {
        sock.drain();
        let l = level(sock);
        let ready = match want {
            Want::Read => l.readable || l.hup || l.err,
            Want::Write => l.writable || l.hup || l.err,
        };
        if ready {
            sock.pass_on();
        }
        ready
    };
    let mut hold = None;
    loop {
        if look() {
            return Ok(());
        }
        if nonblock {
            // Busy-polling callers drive the stack (run to completion).
            crate::state::drive_once();
            return if look() { Ok(()) } else { Err(EAGAIN) };
        }
        if crate::state::spin_until(deadline, || {
            crate::state::drive_once();
            look()
        }) {
            return Ok(());
        }
        if hold.is_none() {
            // Signals wait for the kernel wait below from here (the
            // look again under the hold): none is lost in between.
            hold = Some(crate::signals::Held::for_wait());
            if look() {
                return Ok(());
            }
        }
        let ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(EAGAIN);
                }
                c_int::try_from(left.as_millis().max(1)).unwrap_or(c_int::MAX)
            }
        };
        let Some(fd) = sock.any_fd() else {
            return Err(libc::EBADF);
        };
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        sock.sleeps.fetch_add(1, Ordering::Relaxed);
        let held = crate::signals::wait_mask();
        let mask = held.as_ref().map_or(std::ptr::null(), |m| m as *const _);
        let n = match crate::state::wait_driving(std::slice::from_mut(&mut p), deadline, mask) {
            // Waited on the device too, driving the stack.
            Some(n) => n,
            None => match held {
                // Inside a held call: the wait takes the program's mask.
                Some(mask) => {
                    let ts = (ms >= 0).then(|| libc::timespec {
                        tv_sec: libc::time_t::from(ms / 1000),
                        tv_nsec: libc::c_long::from(ms % 1000) * 1_000_000,
                    });
                    let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const _);
                    // SAFETY: one valid pollfd, a live timespec or null, the
                    // program's mask; the C library's ppoll.
                    unsafe { (real().ppoll)(&mut p, 1, tsp, &mask) }
                }
                // SAFETY: one valid pollfd; the C library's poll, not the layer's.
                None => unsafe { (real().poll)(&mut p, 1, ms) },
            },
        };
        // A handler ran: the call goes on as the kernel's would after a
        // handler installed with SA_RESTART, unless the socket has a
        // timeout (signal(7): then never restarted).
        if n < 0 && crate::real::errno() == EINTR && (deadline.is_some() || !restarting()) {
            return Err(EINTR);
        }
    }
}

/// Whether a signal that interrupted a wait had a handler installed with
/// SA_RESTART. Which signal it was is not known here: true when every
/// signal with a handler has the flag (a program sets it on all of its
/// handlers or on none, as a rule); signals left to their default or
/// ignored interrupt nothing.
fn restarting() -> bool {
    (1..=64).all(|sig| {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            return true;
        }
        // SAFETY: an all-zero sigaction is valid; sigaction with a null
        // new action only reads the current one into `old`.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
            return true;
        }
        old.sa_sigaction == libc::SIG_DFL
            || old.sa_sigaction == libc::SIG_IGN
            || old.sa_flags & libc::SA_RESTART != 0
    })
}

/// Watch the socket's stack handle: readiness events make its descriptors
/// readable in the kernel.
fn watch(acc: Access, sock: &Arc<Sock>, r: SocketRef) {
    match acc {
        Access::Local(net) => {
            let _ = net.watch(r, fd::watcher(sock));
        }
        Access::Remote(c) => {
            if let Some(fd) = sock.any_fd() {
                c.watch(r, fd);
            }
        }
    }
    // Whatever happened before the watch: let the next wait look.
    sock.notify();
}

// ----------------------------------------------------------------- create

/// `socket(AF_INET or AF_INET6 (v6), SOCK_STREAM | SOCK_DGRAM, ..)`: an
/// eventfd names it.
pub fn socket(stream: bool, v6: bool, nonblock: bool, cloexec: bool) -> Res<RawFd> {
    access()?;
    let flags = libc::EFD_NONBLOCK | if cloexec { libc::EFD_CLOEXEC } else { 0 };
    // SAFETY: eventfd with valid flags.
    let fd = unsafe { (real().eventfd)(0, flags) };
    if fd < 0 {
        return Err(crate::real::errno());
    }
    insert(fd, Sock::new(stream, v6, fd, nonblock));
    Ok(fd)
}

/// Our address: the stack's (for `INADDR_ANY` and getsockname).
fn our_ip(acc: Access) -> Ipv4Addr {
    acc.ip4()
        .ok()
        .and_then(Result::ok)
        .unwrap_or(Ipv4Addr::UNSPECIFIED)
}

/// Whether `ip` is one of the stack's addresses.
pub fn owns(ip: IpAddr) -> bool {
    access().is_ok_and(|acc| acc.owns(ip).ok().and_then(Result::ok).unwrap_or(false))
}

/// The stack's address a packet from `peer` was sent to (and ours to
/// it): the IPv4 one, or the IPv6 one of the peer's scope.
pub fn local_for(peer: IpAddr) -> IpAddr {
    let Ok(acc) = access() else {
        return peer;
    };
    match peer {
        IpAddr::V4(_) => our_ip(acc).into(),
        IpAddr::V6(p) => {
            let addrs = acc
                .ipv6_addrs()
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default();
            let pick = if p.is_unicast_link_local() {
                addrs.first()
            } else {
                addrs.get(1).or(addrs.first())
            };
            IpAddr::V6(pick.copied().unwrap_or(Ipv6Addr::UNSPECIFIED))
        }
    }
}

/// The wildcard address of the socket's family.
fn unspecified(sock: &Sock) -> IpAddr {
    if sock.v6 {
        Ipv6Addr::UNSPECIFIED.into()
    } else {
        Ipv4Addr::UNSPECIFIED.into()
    }
}

/// Which peers the socket takes: IPv4 ones for an `AF_INET` socket (or
/// an `AF_INET6` one bound to a v4-mapped address), IPv6 ones with
/// `IPV6_V6ONLY` (or bound to an IPv6 address), else both, as Linux's
/// dual-stack `AF_INET6` sockets.
fn family(sock: &Sock) -> Family {
    let o = sock.opts.lock();
    match o.bound {
        _ if !sock.v6 => Family::V4,
        Some(IpAddr::V4(_)) => Family::V4,
        Some(IpAddr::V6(_)) => Family::V6,
        None if o.v6only => Family::V6,
        None => Family::Both,
    }
}

/// Whether the socket may talk to `peer`: an `IPV6_V6ONLY` socket not to
/// an IPv4 (v4-mapped) one (ENETUNREACH), nor any socket to an IPv6 peer
/// while the stack has no IPv6 address (EADDRNOTAVAIL), as Linux says.
fn reaches(sock: &Sock, peer: &SocketAddr) -> Res<()> {
    if peer.is_ipv4() && sock.v6 && family(sock) == Family::V6 {
        return Err(libc::ENETUNREACH);
    }
    let v6_off = || access().is_ok_and(|a| !a.ipv6_on().ok().and_then(Result::ok).unwrap_or(false));
    if peer.is_ipv6() && v6_off() {
        return Err(libc::EADDRNOTAVAIL);
    }
    Ok(())
}

/// `bind`.
pub fn bind(sock: &Arc<Sock>, addr: SocketAddr) -> Res<()> {
    let acc = access()?;
    let ip = addr.ip();
    if !ip.is_unspecified() && !ip.is_loopback() && !owns(ip) {
        return Err(libc::EADDRNOTAVAIL);
    }
    if sock.v6 && ip.is_ipv4() && sock.opts.lock().v6only {
        // A v4-mapped address on an IPv6-only socket: Linux says EINVAL.
        return Err(libc::EINVAL);
    }
    let mut kind = sock.kind.lock();
    if !matches!(*kind, Kind::Fresh { port: 0 }) {
        return Err(libc::EINVAL);
    }
    sock.opts.lock().bound = (!ip.is_unspecified()).then_some(ip);
    if sock.stream {
        *kind = Kind::Fresh { port: addr.port() };
        return Ok(());
    }
    let (reuse, fam) = (udp_reuse(sock), family(sock));
    let bound = acc
        .udp_bind(addr.port(), reuse, fam)
        .and_then(|r| r.map_err(errno_of));
    let (handle, port) = bound.inspect_err(|_| sock.opts.lock().bound = None)?;
    *kind = Kind::Dgram {
        handle,
        port,
        peer: None,
    };
    drop(kind);
    watch(acc, sock, SocketRef::Udp(handle));
    Ok(())
}

/// How a UDP socket shares its port: its `SO_REUSEADDR` and `SO_REUSEPORT`.
fn udp_reuse(sock: &Sock) -> UdpReuse {
    let o = sock.opts.lock();
    UdpReuse {
        addr: o.reuse_addr,
        port: o.reuse_port,
    }
}

/// A listening port and the sockets listening on it: sockets with
/// `SO_REUSEPORT` on one port share the stack's listener (the kernel would
/// spread connections over them; in one stack they take from one queue).
#[derive(Debug)]
struct Listening {
    handle: ListenHandle,
    backlog: usize,
    reuse_port: bool,
    socks: Vec<Weak<Sock>>,
}

/// Listening ports of this process's stack, by port and family (an
/// `AF_INET` and an `IPV6_V6ONLY` socket listen on one port apart).
static LISTENING: Mutex<Option<HashMap<(u16, Family), Listening>>> = Mutex::new(None);

/// The loop's watcher for the listener `key`: every socket sharing it is
/// told.
fn listener_watcher(key: (u16, Family)) -> ustack_runtime::Watcher {
    Arc::new(move |_| {
        let _gate = fd::fork_gate();
        let socks: Vec<Arc<Sock>> = LISTENING
            .lock()
            .as_ref()
            .and_then(|m| m.get(&key))
            .map(|l| l.socks.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        for s in socks {
            s.notify();
        }
    })
}

/// Listen on `port` for `sock` in the stack, or join the listener there
/// when both sides asked for `SO_REUSEPORT`; returns the stack's handle.
fn listen_on(acc: Access, sock: &Arc<Sock>, port: u16, backlog: usize) -> Res<ListenHandle> {
    let reuse_port = sock.opts.lock().reuse_port;
    let key = (port, family(sock));
    let mut guard = LISTENING.lock();
    let map = guard.get_or_insert_with(HashMap::new);
    if let Some(l) = map.get_mut(&key) {
        if !(reuse_port && l.reuse_port) {
            return Err(libc::EADDRINUSE);
        }
        l.socks.push(Arc::downgrade(sock));
        return Ok(l.handle);
    }
    let handle = acc.tcp_listen(port, backlog, key.1)?.map_err(errno_of)?;
    map.insert(
        key,
        Listening {
            handle,
            backlog,
            reuse_port,
            socks: vec![Arc::downgrade(sock)],
        },
    );
    drop(guard);
    match acc {
        Access::Local(net) => {
            let _ = net.watch(SocketRef::Listener(handle), listener_watcher(key));
        }
        Access::Remote(_) => watch(acc, sock, SocketRef::Listener(handle)),
    }
    Ok(handle)
}

/// `sock` stops listening on `handle`: whether it was the last socket
/// there (the stack's listener then closes).
fn leave_listener(sock: &Arc<Sock>, handle: ListenHandle) -> bool {
    let key = (handle.port(), handle.family());
    let mut guard = LISTENING.lock();
    let Some(map) = guard.as_mut() else {
        return true;
    };
    let Some(l) = map.get_mut(&key).filter(|l| l.handle == handle) else {
        return true;
    };
    l.socks
        .retain(|w| w.upgrade().is_some_and(|s| !Arc::ptr_eq(&s, sock)));
    if l.socks.is_empty() {
        map.remove(&key);
        return true;
    }
    false
}

/// In a worker that started a stack of its own after `fork` (`ustack exec
/// --fork each`): open the inherited listening and bound sockets again on
/// it (same ports, same backlogs); inherited connections are the master's
/// and are closed here.
pub fn reopen_inherited() {
    let Ok(acc) = access() else { return };
    let old = LISTENING.lock().take().unwrap_or_default();
    let mut seen = std::collections::HashSet::new();
    for (_, sock) in fd::all() {
        if !seen.insert(Arc::as_ptr(&sock)) {
            continue;
        }
        let mut kind = sock.kind.lock();
        match *kind {
            Kind::Listener { port, .. } => {
                let backlog = old.get(&(port, family(&sock))).map_or(128, |l| l.backlog);
                *kind = match listen_on(acc, &sock, port, backlog) {
                    Ok(handle) => Kind::Listener { handle, port },
                    Err(_) => Kind::Closed,
                };
                drop(kind);
                sock.notify();
            }
            Kind::Dgram { port, peer, .. } => {
                match acc.udp_rebind(port, udp_reuse(&sock), family(&sock), peer) {
                    Ok(Ok(handle)) => {
                        *kind = Kind::Dgram { handle, port, peer };
                        drop(kind);
                        watch(acc, &sock, SocketRef::Udp(handle));
                    }
                    _ => *kind = Kind::Closed,
                }
            }
            Kind::Stream { .. } => *kind = Kind::Closed,
            Kind::Fresh { .. } | Kind::Closed => {}
        }
    }
}

/// `listen`.
pub fn listen(sock: &Arc<Sock>, backlog: c_int) -> Res<()> {
    let acc = access()?;
    if !sock.stream {
        return Err(libc::EOPNOTSUPP);
    }
    let mut kind = sock.kind.lock();
    let port = match *kind {
        Kind::Fresh { port } => port,
        Kind::Listener { .. } => return Ok(()),
        _ => return Err(libc::EINVAL),
    };
    let backlog = usize::try_from(backlog).unwrap_or(0).clamp(1, 4096);
    let fast_open = fast_open_queue(
        sock.opts
            .lock()
            .kept
            .get(libc::IPPROTO_TCP, libc::TCP_FASTOPEN),
        backlog,
    );
    if port != 0 {
        let handle = listen_on(acc, sock, port, backlog)?;
        *kind = Kind::Listener { handle, port };
        drop(kind);
        if fast_open > 0 {
            acc.tcp_fast_open(handle, fast_open)?.map_err(errno_of)?;
        }
        apply_max_segment(sock)?;
        sock.notify();
        return Ok(());
    }
    let fam = family(sock);
    // Port 0: the kernel would pick one.
    let handle = acc.tcp_listen_any(backlog, fam)?.map_err(errno_of)?;
    *kind = Kind::Listener {
        handle: handle.0,
        port: handle.1,
    };
    drop(kind);
    if fast_open > 0 {
        acc.tcp_fast_open(handle.0, fast_open)?.map_err(errno_of)?;
    }
    apply_max_segment(sock)?;
    watch(acc, sock, SocketRef::Listener(handle.0));
    Ok(())
}

/// The `TCP_MAXSEG` a program set (0, unset, is the path's).
/// `TCP_FASTOPEN_CONNECT` is set.
fn fast_open_connect(sock: &Sock) -> bool {
    sock.opts
        .lock()
        .kept
        .get(libc::IPPROTO_TCP, libc::TCP_FASTOPEN_CONNECT)
        .is_some_and(|v| v != 0)
}

fn max_segment(sock: &Sock) -> Option<usize> {
    let v = sock
        .opts
        .lock()
        .kept
        .get(libc::IPPROTO_TCP, libc::TCP_MAXSEG)?;
    usize::try_from(v).ok().filter(|&v| v > 0)
}

/// `TCP_MAXSEG` set: a connection's or a listener's segments shrink to
/// it now (before `connect` or `listen`, it is applied there).
pub fn apply_max_segment(sock: &Sock) -> Res<()> {
    let Some(mss) = max_segment(sock) else {
        return Ok(());
    };
    let r = match *sock.kind.lock() {
        Kind::Stream { handle, .. } => access()?.tcp_max_segment(handle, mss)?,
        Kind::Listener { handle, .. } => access()?.tcp_listener_max_segment(handle, mss)?,
        _ => return Ok(()),
    };
    r.map_err(errno_of)
}

/// TCP Fast Open's queue for a listener, by Linux's rules: none unless
/// `tcp_fastopen` has the server bit; the `TCP_FASTOPEN` value when one
/// was set; else the backlog when `tcp_fastopen` turns it on for every
/// listener.
fn fast_open_queue(set: Option<c_int>, backlog: usize) -> usize {
    let flags = crate::sysctl::fast_open_flags();
    if flags & crate::sysctl::FASTOPEN_SERVER == 0 {
        return 0;
    }
    match set {
        Some(v) => usize::try_from(v).unwrap_or(0),
        None if flags & crate::sysctl::FASTOPEN_SERVER_ALWAYS != 0 => backlog,
        None => 0,
    }
}

/// `TCP_FASTOPEN` set to `queue` on a socket: EINVAL on a connection (as
/// Linux: only a fresh socket or a listener takes it); a listener's queue
/// changes now.
pub fn set_fast_open(sock: &Sock, queue: c_int) -> Res<()> {
    match *sock.kind.lock() {
        Kind::Fresh { .. } => Ok(()),
        Kind::Listener { handle, .. } => {
            let q = fast_open_queue(Some(queue), 0);
            access()?.tcp_fast_open(handle, q)?.map_err(errno_of)
        }
        _ => Err(libc::EINVAL),
    }
}

/// `accept4`: the new connection's descriptor and peer.
pub fn accept(sock: &Arc<Sock>, nonblock_new: bool, cloexec: bool) -> Res<(RawFd, SocketAddr)> {
    let acc = access()?;
    let Kind::Listener { handle, .. } = *sock.kind.lock() else {
        return Err(libc::EINVAL);
    };
    let nonblock = sock.nonblocking.load(Ordering::Relaxed);
    let timeout = sock.opts.lock().rcvtimeo_us;
    loop {
        let got = acc.tcp_accept(handle)?.map_err(errno_of)?;
        // The stack's listener takes the socket's family only.
        if let Some((h, peer)) = got {
            let fd = socket(true, sock.v6, nonblock_new, cloexec)?;
            let new = fd::get(fd).ok_or(libc::EMFILE)?;
            *new.kind.lock() = Kind::Stream {
                handle: h,
                connecting: false,
            };
            // Accepted sockets inherit the listener's TCP_NODELAY and
            // keepalive settings, as on Linux.
            let l = *sock.opts.lock();
            {
                let mut o = new.opts.lock();
                o.nodelay = l.nodelay;
                o.keepalive = l.keepalive;
                (o.keep_idle, o.keep_intvl, o.keep_cnt) = (l.keep_idle, l.keep_intvl, l.keep_cnt);
                o.user_timeout_ms = l.user_timeout_ms;
            }
            if l.nodelay || l.keepalive || l.user_timeout_ms > 0 {
                apply_tcp_opts(&new);
            }
            // And SO_ZEROCOPY (a socket flag the kernel clones).
            new.zc.lock().on = sock.zc.lock().on;
            watch(acc, &new, SocketRef::Tcp(h));
            return Ok((fd, peer));
        }
        wait(sock, Want::Read, nonblock, timeout)?;
    }
}

/// `connect`.
pub fn connect(sock: &Arc<Sock>, remote: SocketAddr) -> Res<()> {
    connect_as(sock, remote, false)
}

/// `connect`, by TCP Fast Open when `fast_open` or `TCP_FASTOPEN_CONNECT`
/// asks (RFC 7413, as Linux): with a cookie kept for the server it
/// returns at once, connected, and the SYN leaves with the first write's
/// data; without, the SYN asks for a cookie and the handshake is as
/// usual.
pub fn connect_as(sock: &Arc<Sock>, remote: SocketAddr, fast_open: bool) -> Res<()> {
    let acc = access()?;
    reaches(sock, &remote)?;
    if !sock.stream {
        return connect_dgram(acc, sock, Some(remote));
    }
    let nonblock = sock.nonblocking.load(Ordering::Relaxed);
    let handle = {
        let mut kind = sock.kind.lock();
        match *kind {
            Kind::Fresh { port } => {
                if remote.ip().is_unspecified() || remote.port() == 0 {
                    return Err(libc::ECONNREFUSED);
                }
                let fast_open = fast_open || fast_open_connect(sock);
                // A port bound first is the connection's local port.
                let (h, deferred) = acc
                    .tcp_connect(port, remote, max_segment(sock), fast_open)?
                    .map_err(|e| match e {
                        // The 4-tuple is taken: Linux's connect says so.
                        StackError::AddrInUse => libc::EADDRNOTAVAIL,
                        e => errno_of(e),
                    })?;
                *kind = Kind::Stream {
                    handle: h,
                    connecting: !deferred,
                };
                drop(kind);
                // Options set before connect act on the connection now.
                apply_tcp_opts(sock);
                watch(acc, sock, SocketRef::Tcp(h));
                if deferred {
                    // Fast Open with a cookie: connected for the program;
                    // its first write sends the SYN.
                    return Ok(());
                }
                if nonblock {
                    return Err(libc::EINPROGRESS);
                }
                h
            }
            Kind::Stream {
                connecting: true,
                handle,
            } => {
                drop(kind);
                if nonblock {
                    // As Linux: 0 once the handshake completed (EISCONN
                    // after that), EALREADY while it is under way.
                    return match finish_connect(acc, sock, handle) {
                        Err(EAGAIN) => Err(libc::EALREADY),
                        r => r,
                    };
                }
                handle
            }
            Kind::Stream { .. } => return Err(libc::EISCONN),
            _ => return Err(libc::EINVAL),
        }
    };
    loop {
        match finish_connect(acc, sock, handle) {
            Err(EAGAIN) => {}
            r => return r,
        }
        let timeout = sock.opts.lock().sndtimeo_us;
        wait(sock, Want::Write, false, timeout)?;
    }
}

/// Where a pending connect stands: done, failed (its errno), or EAGAIN.
fn finish_connect(acc: Access, sock: &Sock, handle: ustack::socket::tcp::TcpHandle) -> Res<()> {
    let st = acc.tcp_status(handle)?.map_err(errno_of)?;
    if let Some(e) = st.error {
        return Err(errno_of(StackError::Tcp(e)));
    }
    if st.state.synchronized() {
        if let Kind::Stream { connecting, .. } = &mut *sock.kind.lock() {
            *connecting = false;
        }
        return Ok(());
    }
    if st.state == TcpState::Closed {
        return Err(libc::ECONNREFUSED);
    }
    Err(EAGAIN)
}

/// The socket's kind, a pending connect settled first: a non-blocking
/// connect the program followed with poll (not a second connect) is
/// connected once the stack says so.
fn current_kind(acc: Access, sock: &Sock) -> Kind {
    let kind = *sock.kind.lock();
    if let Kind::Stream {
        handle,
        connecting: true,
    } = kind
    {
        let _ = finish_connect(acc, sock, handle);
        return *sock.kind.lock();
    }
    kind
}

/// A UDP socket's default peer (None: dissolve the association).
fn connect_dgram(acc: Access, sock: &Arc<Sock>, peer: Option<SocketAddr>) -> Res<()> {
    ensure_dgram(acc, sock)?;
    if let Kind::Dgram {
        peer: p, handle, ..
    } = &mut *sock.kind.lock()
    {
        // Only the peer's datagrams from now on, as Linux's lookup does.
        acc.udp_connect(*handle, peer)?.map_err(errno_of)?;
        *p = peer;
    }
    Ok(())
}

/// Bind a fresh UDP socket to an ephemeral port (before its first send).
fn ensure_dgram(acc: Access, sock: &Arc<Sock>) -> Res<()> {
    if matches!(*sock.kind.lock(), Kind::Dgram { .. }) {
        return Ok(());
    }
    bind(sock, SocketAddr::new(unspecified(sock), 0)).or_else(|e| {
        // Another thread bound it meanwhile.
        if matches!(*sock.kind.lock(), Kind::Dgram { .. }) {
            Ok(())
        } else {
            let _ = acc;
            Err(e)
        }
    })
}

/// SO_ERROR: a failed connect's error, reported once.
pub fn take_error(sock: &Sock) -> c_int {
    let mut opts = sock.opts.lock();
    if opts.pending_error != 0 {
        return std::mem::take(&mut opts.pending_error);
    }
    drop(opts);
    let Kind::Stream { handle, .. } = *sock.kind.lock() else {
        return 0;
    };
    let Ok(acc) = access() else { return libc::EIO };
    match acc.tcp_status(handle) {
        Ok(Ok(st)) => match st.error.map(StackError::Tcp) {
            Some(e) if first_report(sock, &e) => errno_of(e),
            _ => 0,
        },
        _ => 0,
    }
}

// ------------------------------------------------------------- data

/// Flags of a receive.
#[derive(Debug, Clone, Copy, Default)]
pub struct RecvFlags {
    pub dontwait: bool,
    pub waitall: bool,
    pub peek: bool,
    /// Report a datagram's real length when longer than the buffer.
    pub trunc: bool,
}

/// What a receive got.
#[derive(Debug, Clone, Copy)]
pub struct Received {
    pub len: usize,
    /// The whole datagram's length (UDP), for MSG_TRUNC.
    pub full: usize,
    pub from: Option<SocketAddr>,
}

/// `recv`/`recvfrom`/`read` into the buffers `bufs` (scatter).
pub fn recv(sock: &Arc<Sock>, bufs: &mut [&mut [u8]], flags: RecvFlags) -> Res<Received> {
    let acc = access()?;
    let nonblock = flags.dontwait || sock.nonblocking.load(Ordering::Relaxed);
    let timeout = sock.opts.lock().rcvtimeo_us;
    let want: usize = bufs.iter().map(|b| b.len()).sum();
    loop {
        let kind = current_kind(acc, sock);
        match kind {
            Kind::Stream {
                handle,
                connecting: false,
            } => {
                let r = if flags.peek {
                    acc.tcp_peek_into(handle, bufs)
                } else {
                    acc.tcp_recv_into(handle, bufs)
                };
                let (got, st) = match r? {
                    Ok(v) => v,
                    // An error is reported once; then the stream has ended.
                    Err(e) if first_report(sock, &e) => return Err(errno_of(e)),
                    Err(_) => (0, None),
                };
                if flags.peek && (got > 0 || want == 0) {
                    return Ok(Received {
                        len: got,
                        full: got,
                        from: None,
                    });
                }
                if got > 0 && !(flags.waitall && got < want) {
                    return Ok(Received {
                        len: got,
                        full: got,
                        from: None,
                    });
                }
                if got > 0 {
                    // MSG_WAITALL: keep the part and wait for the rest.
                    let mut rest: Vec<&mut [u8]> = Vec::new();
                    let mut skip = got;
                    for b in bufs.iter_mut() {
                        if skip >= b.len() {
                            skip -= b.len();
                            continue;
                        }
                        rest.push(&mut b[skip..]);
                        skip = 0;
                    }
                    let more = recv(
                        sock,
                        &mut rest,
                        RecvFlags {
                            waitall: true,
                            ..flags
                        },
                    );
                    return Ok(Received {
                        len: got + more.map(|r| r.len).unwrap_or(0),
                        full: 0,
                        from: None,
                    });
                }
                if st.is_none_or(|st| st.eof || st.closed())
                    || want == 0
                    || sock.opts.lock().shut_rd
                {
                    return Ok(Received {
                        len: 0,
                        full: 0,
                        from: None,
                    });
                }
            }
            Kind::Stream {
                connecting: true, ..
            }
            | Kind::Fresh { .. }
            | Kind::Listener { .. }
                if sock.stream =>
            {
                if matches!(kind, Kind::Stream { .. }) && nonblock {
                    return Err(EAGAIN);
                }
                if !matches!(kind, Kind::Stream { .. }) {
                    return Err(libc::ENOTCONN);
                }
            }
            Kind::Dgram { handle, .. } => {
                let mut first = [0u8; 0];
                let buf: &mut [u8] = match bufs.first_mut() {
                    Some(b) => b,
                    None => &mut first,
                };
                let got = acc
                    .udp_recv_into(handle, buf, flags.peek)?
                    .map_err(errno_of)?;
                // The stack's socket takes the socket's family only.
                if let Some((full, from)) = got {
                    return Ok(Received {
                        len: full.min(buf.len()),
                        full,
                        from: Some(from),
                    });
                }
                if sock.opts.lock().shut_rd {
                    // Shut for reading, nothing queued: as Linux's UDP,
                    // EAGAIN without waiting, 0 instead of a wait.
                    if nonblock {
                        return Err(EAGAIN);
                    }
                    return Ok(Received {
                        len: 0,
                        full: 0,
                        from: None,
                    });
                }
            }
            Kind::Fresh { .. } => {
                // A UDP socket that was never bound receives nothing.
                if nonblock {
                    return Err(EAGAIN);
                }
                ensure_dgram(acc, sock)?;
                continue;
            }
            Kind::Closed => return Err(libc::EBADF),
            _ => return Err(libc::ENOTCONN),
        }
        wait(sock, Want::Read, nonblock, timeout)?;
    }
}

/// `send`/`sendto`/`write` from the buffers `bufs` (gather); returns the
/// bytes taken. A blocking stream send takes everything (or fails). With
/// `eor` (`MSG_EOR`), a stream send that took everything ends a record
/// there: later data never shares a segment with it, as on Linux. With
/// `more` (`MSG_MORE`) the stack holds a stream's partial tail, as a
/// cork until the next send without it or the next ACK.
pub fn send(
    sock: &Arc<Sock>,
    bufs: &[&[u8]],
    to: Option<SocketAddr>,
    dontwait: bool,
    eor: bool,
    more: bool,
) -> Res<usize> {
    let acc = access()?;
    let nonblock = dontwait || sock.nonblocking.load(Ordering::Relaxed);
    let timeout = sock.opts.lock().sndtimeo_us;
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    if sock.stream {
        let handle = match current_kind(acc, sock) {
            Kind::Stream {
                handle,
                connecting: false,
            } => handle,
            Kind::Stream { .. } if nonblock => return Err(EAGAIN),
            Kind::Stream { handle, .. } => {
                wait(sock, Want::Write, false, timeout)?;
                handle
            }
            Kind::Closed => return Err(libc::EBADF),
            // Linux's TCP says EPIPE (not ENOTCONN) before a connection.
            _ => return Err(libc::EPIPE),
        };
        let mut sent = 0;
        loop {
            let r = acc.tcp_send_from(handle, bufs, sent, more)?;
            match r {
                Ok(n) => sent += n,
                // An error is reported once (by a send or a receive); after
                // that the connection is shut: EPIPE, as Linux says.
                Err(e) if sent == 0 && first_report(sock, &e) => return Err(errno_of(e)),
                Err(_) if sent == 0 => return Err(libc::EPIPE),
                Err(_) => return Ok(sent),
            }
            if sent == total && eor {
                acc.tcp_end_record(handle)?.map_err(errno_of)?;
            }
            if sent == total || (nonblock && sent > 0) {
                return Ok(sent);
            }
            match wait(sock, Want::Write, nonblock, timeout) {
                Ok(()) => {}
                Err(e) if sent == 0 => return Err(e),
                Err(_) => return Ok(sent),
            }
        }
    }
    // UDP: one datagram of everything.
    ensure_dgram(acc, sock)?;
    let Kind::Dgram { handle, peer, .. } = *sock.kind.lock() else {
        return Err(libc::EBADF);
    };
    if sock.opts.lock().shut_wr {
        return Err(libc::EPIPE);
    }
    let dst = to.or(peer).ok_or(libc::EDESTADDRREQ)?;
    reaches(sock, &dst)?;
    let data: Vec<u8> = bufs.concat();
    loop {
        let r = acc.udp_send_to(handle, dst, &data)?;
        match r {
            Ok(()) => return Ok(data.len()),
            Err(StackError::QueueFull) => wait(sock, Want::Write, nonblock, timeout)?,
            Err(e) => return Err(errno_of(e)),
        }
    }
}

/// A send of `n` bytes with `MSG_ZEROCOPY` went into the stack: on a
/// socket with `SO_ZEROCOPY`, it gets its number and waits for the
/// connection's acknowledgment of its last byte (a datagram is done).
pub fn zerocopy_sent(sock: &Sock, n: usize) {
    if n == 0 || !sock.zc.lock().on {
        return;
    }
    let end = if sock.stream {
        // Hear of every ACK from now on: each may complete sends (an
        // edge-triggered epoll waits for one).
        if !sock.zc.lock().waiting() {
            hear_every_ack(sock);
        }
        // Every byte written so far: acknowledged plus still queued.
        match tcp_info(sock) {
            Some(i) => Some(i.stats.bytes_out + i.send_queued as u64),
            None => return,
        }
    } else {
        None
    };
    sock.zc.lock().sent(end);
}

/// `SO_TIMESTAMPING` with `flags`: unknown bits refused; `OPT_ID` turned
/// on keys the sends from the first byte not yet acknowledged (or, with
/// `OPT_ID_TCP`, the next byte written), and needs a connection (EINVAL
/// on a listener or an unconnected socket, as Linux); `TX_ACK` hears of
/// every acknowledgment (a stamp may be due).
pub fn set_timestamping(sock: &Sock, flags: c_int) -> Res<()> {
    use crate::tstamp::{KNOWN, OPT_ID, OPT_ID_TCP, TX_ACK};
    let flags = flags as u32;
    if flags & !KNOWN != 0 {
        return Err(libc::EINVAL);
    }
    let was = sock.ts.lock().flags;
    if sock.stream && flags & OPT_ID != 0 && was & OPT_ID == 0 {
        let Some(i) = tcp_info(sock) else {
            return Err(libc::EINVAL);
        };
        let base = if flags & OPT_ID_TCP != 0 {
            i.stats.bytes_out + i.send_queued as u64
        } else {
            i.stats.bytes_out
        };
        sock.ts.lock().base = base;
    }
    sock.ts.lock().flags = flags;
    if flags & TX_ACK != 0 {
        hear_every_ack(sock);
    }
    Ok(())
}

/// A readiness event on every acknowledgment of a TCP socket from now on
/// (zero-copy completions and ACK timestamps wait for them).
fn hear_every_ack(sock: &Sock) {
    if let (Kind::Stream { handle, .. }, Ok(acc)) = (*sock.kind.lock(), access()) {
        let _ = acc.tcp_ack_events(handle);
    }
}

/// A send of `n` bytes went into the stack: on a TCP socket with transmit
/// timestamps asked for, its last byte is stamped.
pub fn timestamping_sent(sock: &Sock, n: usize) {
    let (sent, acked) = sock.ts.lock().wants();
    if n == 0 || !(sent || acked) {
        return;
    }
    let Kind::Stream { handle, .. } = *sock.kind.lock() else {
        return;
    };
    let Some(i) = tcp_info(sock) else {
        return;
    };
    let key = sock.ts.lock().key(i.stats.bytes_out + i.send_queued as u64);
    if let Ok(acc) = access() {
        let _ = acc.tcp_stamp(handle, key, sent, acked);
    }
}

/// The stack's transmit timestamps since the last look join the socket's
/// error queue.
pub fn timestamping_refresh(sock: &Sock) {
    let (sent, acked) = sock.ts.lock().wants();
    if !(sent || acked) {
        return;
    }
    let Kind::Stream { handle, .. } = *sock.kind.lock() else {
        return;
    };
    let Some((stamps, now)) = access()
        .ok()
        .and_then(|acc| acc.tcp_take_stamps(handle).ok())
        .and_then(Result::ok)
    else {
        return;
    };
    let wall = std::time::SystemTime::now();
    let mut ts = sock.ts.lock();
    for (key, sent, at) in stamps {
        let ago = std::time::Duration::from_nanos(now.saturating_sub(at));
        ts.stamped(key, sent, ago, wall);
    }
}

/// Zero-copy sends the peer acknowledged since the last look become
/// completions (all of them once the connection is gone).
pub fn zerocopy_refresh(sock: &Sock) {
    if !sock.zc.lock().waiting() {
        return;
    }
    let (acked, ended) = match tcp_info(sock) {
        Some(i) => (
            i.stats.bytes_out,
            matches!(
                i.state,
                ustack::socket::tcp::State::Closed | ustack::socket::tcp::State::TimeWait
            ),
        ),
        None => (0, true),
    };
    sock.zc.lock().acked(acked, ended);
}

/// Bytes a `FIONREAD` reports: readable bytes, or the next datagram's length.
pub fn readable_bytes(sock: &Sock) -> Res<usize> {
    let acc = access()?;
    Ok(match *sock.kind.lock() {
        Kind::Stream { handle, .. } => acc.tcp_status(handle)?.map_or(0, |st| st.readable),
        Kind::Dgram { handle, .. } => acc.udp_pending(handle)?.map_or(0, |p| p.1.unwrap_or(0)),
        _ => 0,
    })
}

/// `shutdown(how)`: `SHUT_WR` sends FIN (TCP); `SHUT_RD` makes reads
/// return what is queued, then 0 at once, and the socket readable (as
/// Linux: data arriving later is still taken, not read). A connected UDP
/// socket is shut the same way (later sends: EPIPE).
pub fn shutdown(sock: &Sock, how: c_int) -> Res<()> {
    let acc = access()?;
    if !(libc::SHUT_RD..=libc::SHUT_RDWR).contains(&how) {
        return Err(libc::EINVAL);
    }
    let rd = how != libc::SHUT_WR;
    let wr = how != libc::SHUT_RD;
    let kind = *sock.kind.lock();
    match kind {
        Kind::Stream { handle, .. } => {
            if wr {
                acc.tcp_shutdown(handle)?.map_err(errno_of)?;
            }
        }
        Kind::Dgram { peer: Some(_), .. } => {}
        _ => return Err(libc::ENOTCONN),
    }
    {
        let mut o = sock.opts.lock();
        o.shut_rd |= rd;
        o.shut_wr |= wr;
    }
    // A reader blocked in another thread, or an epoll set, sees it now.
    sock.notify();
    Ok(())
}

// ------------------------------------------------------ descriptor numbers

/// The ustack socket `fd` names, checked: when the descriptor under that
/// number is no longer the socket's eventfd (it was closed by a path the
/// layer does not see, e.g. a raw system call, and the kernel gave the
/// number to something else), the stale entry is retired and None
/// returned. One `fstat`: for the calls off the data path (close, bind,
/// connect, accept, options, fstat, ioctl, fcntl, dup, epoll_ctl); the
/// data path uses [`fd::get`].
pub fn get_checked(fd: c_int) -> Option<Arc<Sock>> {
    let s = fd::get(fd)?;
    if s.named_by(fd) {
        return Some(s);
    }
    retire(fd);
    None
}

/// The kernel just gave number `fd` to a new descriptor (an interposed
/// call that opens one returned it): an entry under that number is stale
/// by definition, since the kernel reuses a number only after it was
/// closed. Cheap when the number is not in the table.
pub fn fresh(fd: c_int) {
    if fd < 0 || fd::is_empty() || fd::get(fd).is_none() {
        return;
    }
    retire(fd);
}

/// Forget the stale entry `fd` (its descriptor was closed behind the
/// layer's back): the number leaves the table and the epoll sets, and the
/// socket closes in the stack when it was its last number. The kernel
/// descriptor under the number is not the layer's any more and is not
/// touched.
pub fn retire(fd: c_int) {
    if let Some(s) = fd::remove(fd) {
        let_go(fd, &s);
    }
}

/// Record that `fd` names `sock` (a stale entry under the number, one
/// whose descriptor was closed behind the layer's back, is retired).
pub fn insert(fd: c_int, sock: Arc<Sock>) {
    if let Some(old) = fd::insert(fd, sock) {
        let_go(fd, &old);
    }
}

/// Number `fd` no longer names `s` (it was taken out of the table): it
/// leaves the epoll sets, and `s` closes in the stack when that was its
/// last number (unless it is another process's, after `fork`).
fn let_go(fd: c_int, s: &Arc<Sock>) {
    crate::poll::forget_socket(fd);
    if s.forget_fd(fd) && !crate::state::forked() {
        close_in_stack(s);
    }
}

/// `close(fd)` of a ustack socket's descriptor: the socket closes in the
/// stack with its last descriptor. Returns whether `fd` was a ustack socket.
pub fn close(fd: RawFd) -> bool {
    let Some(sock) = fd::remove(fd) else {
        return false;
    };
    if crate::state::forked() {
        // The socket is another process's: close our descriptor and touch
        // none of its locks (a thread of that process may have held one
        // when this copy of the memory was made).
        // SAFETY: closing the eventfd this process owns under that number.
        unsafe { (crate::real::real().close)(fd) };
        return true;
    }
    if crate::share::server::held_by_clients(&sock) && sock.keep_last_fd(fd) {
        // A process forked from this one holds it still: it stays open.
        crate::share::server::keep_for_clients(&sock, *sock.kind.lock());
        return true;
    }
    if sock.close_fd(fd) {
        close_in_stack(&sock);
    }
    true
}

/// The socket's last descriptor is gone: close it in the stack (FIN, or
/// RST with `SO_LINGER` 0; a listener leaves the port).
pub fn close_in_stack(sock: &Arc<Sock>) {
    let Ok(acc) = access() else { return };
    if matches!(acc, Access::Local(_))
        && crate::share::server::keep_for_clients(sock, *sock.kind.lock())
    {
        // A process forked from this one still holds it.
        return;
    }
    if let Some((r, linger0)) = detach(sock) {
        acc.close_ref(r, linger0);
    }
}

/// Mark the socket closed here: the stack handle to close (none for a
/// listener other sockets share with `SO_REUSEPORT`, which stays theirs)
/// and whether `SO_LINGER` 0 asks for an abort. Touches the socket's
/// locks only, never the stack's.
pub fn detach(sock: &Arc<Sock>) -> Option<(SocketRef, bool)> {
    let kind = std::mem::replace(&mut *sock.kind.lock(), Kind::Closed);
    let kind = match kind {
        Kind::Listener { handle, .. } if !leave_listener(sock, handle) => Kind::Closed,
        k => k,
    };
    let linger0 = sock.opts.lock().linger == Some(0);
    crate::share::server::socket_ref(kind).map(|r| (r, linger0))
}

/// Our end: (address, port). A wildcard-bound socket gives the wildcard
/// of its family, except an `AF_INET` listener or UDP socket, which gives
/// the stack's address (what programs that ask want to know).
pub fn local_addr(sock: &Sock) -> Res<SocketAddr> {
    let acc = access()?;
    let bound = sock.opts.lock().bound;
    let wild = || {
        bound.unwrap_or(if sock.v6 {
            unspecified(sock)
        } else {
            our_ip(acc).into()
        })
    };
    Ok(match *sock.kind.lock() {
        Kind::Fresh { port: 0 } => SocketAddr::new(unspecified(sock), 0),
        Kind::Fresh { port } | Kind::Listener { port, .. } => SocketAddr::new(wild(), port),
        Kind::Dgram { port, peer, .. } => {
            let ip = match (bound, peer) {
                (None, Some(p)) => local_for(p.ip()),
                _ => wild(),
            };
            SocketAddr::new(ip, port)
        }
        Kind::Stream { handle, .. } => {
            acc.tcp_ends(handle)?
                .ok()
                .flatten()
                .ok_or(libc::ENOTCONN)?
                .0
        }
        Kind::Closed => return Err(libc::EBADF),
    })
}

/// The peer's end.
pub fn peer_addr(sock: &Sock) -> Res<SocketAddr> {
    let acc = access()?;
    match current_kind(acc, sock) {
        Kind::Stream {
            handle,
            connecting: false,
        } => acc
            .tcp_ends(handle)?
            .ok()
            .flatten()
            .map(|e| e.1)
            .ok_or(libc::ENOTCONN),
        Kind::Dgram { peer: Some(p), .. } => Ok(p),
        _ => Err(libc::ENOTCONN),
    }
}

/// Send what the connection holds now, past cork and Nagle (setting
/// `TCP_NODELAY`).
pub fn push(sock: &Sock) {
    if let (Kind::Stream { handle, .. }, Ok(acc)) = (*sock.kind.lock(), access()) {
        let _ = acc.tcp_push(handle);
    }
}

/// Apply TCP_NODELAY / TCP_CORK to the connection (now or once it exists).
pub fn apply_tcp_opts(sock: &Sock) {
    let Ok(acc) = access() else { return };
    let Kind::Stream { handle, .. } = *sock.kind.lock() else {
        return;
    };
    let o = *sock.opts.lock();
    let user_timeout = u64::try_from(o.user_timeout_ms)
        .ok()
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis);
    let _ = acc.tcp_opts(handle, o.nodelay, o.cork, keepalive_of(&o), user_timeout);
}

/// `SO_KEEPALIVE` with the `TCP_KEEP*` timings (Linux's defaults where
/// unset: 7200 s, 75 s, 9 probes).
fn keepalive_of(o: &fd::Opts) -> Option<ustack::socket::tcp::KeepAlive> {
    let d = ustack::socket::tcp::KeepAlive::default();
    let secs = |v: c_int, or: Duration| {
        u64::try_from(v)
            .ok()
            .filter(|&s| s > 0)
            .map_or(or, Duration::from_secs)
    };
    o.keepalive.then(|| ustack::socket::tcp::KeepAlive {
        idle: secs(o.keep_idle, d.idle),
        interval: secs(o.keep_intvl, d.interval),
        count: u32::try_from(o.keep_cnt)
            .ok()
            .filter(|&c| c > 0)
            .unwrap_or(d.count),
    })
}

/// The connection's state and its times for TCP_INFO, in one call to
/// the stack (in a process sharing another's stack, asked of the owner,
/// on its clock).
pub fn tcp_info_timed(
    sock: &Sock,
) -> Option<(
    ustack::socket::tcp::ConnInfo,
    ustack::socket::tcp::ConnTimes,
)> {
    let Kind::Stream { handle, .. } = *sock.kind.lock() else {
        return None;
    };
    access()
        .ok()?
        .tcp_conn_info_timed(handle)
        .ok()?
        .ok()?
        .map(|(w, t)| (w.into(), t))
}

/// The connection's state for TCP_INFO (in a process sharing another's
/// stack, asked of the owner).
pub fn tcp_info(sock: &Sock) -> Option<ustack::socket::tcp::ConnInfo> {
    let Kind::Stream { handle, .. } = *sock.kind.lock() else {
        return None;
    };
    match access().ok()? {
        Access::Local(net) => net.peek_stack(|s| s.tcp_ref().info(handle)).ok().flatten(),
        remote => remote.tcp_conn_info(handle).ok()?.ok()?.map(Into::into),
    }
}
