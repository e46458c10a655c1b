//! The owner's side: one thread answers every client's channel, and the
//! count of which sockets the clients hold.
//!
//! A socket stays in the stack while the owner or any client holds it. The
//! owner's close of a socket a client still holds keeps it (and its
//! watcher) here; the last client's release closes it then. A client whose
//! channel hangs up (it exited, or was killed) releases everything it held
//! at once.

use std::collections::{HashMap, HashSet};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, PoisonError};

use ustack::events::SocketRef;
use ustack_runtime::Net;

use super::chan;
use super::{Op, WireErr, run_op};
use crate::fd::{Kind, Sock};
use crate::real::{Res, errno, real};

/// A socket clients hold.
#[derive(Debug, Default)]
struct Held {
    /// How many clients hold it.
    clients: usize,
    /// The owner held it when a client came to hold it (at a fork).
    owner_had: bool,
    /// The owner closed its last descriptor meanwhile: its socket, kept
    /// (its watcher writes the clients' eventfd too: the same object).
    stash: Option<Arc<Sock>>,
    /// The owner's copy of the eventfd of a socket a client made (its
    /// watcher writes it).
    eventfd: Option<RawFd>,
}

/// A socket passed to another process (`SCM_RIGHTS`) and not yet claimed
/// there ([`super::rights`]): open for it meanwhile.
#[derive(Debug)]
struct Flight {
    /// Its stack handle (None: a socket not in the stack yet).
    r: Option<SocketRef>,
    /// What the receiver rebuilds it from (a postcard `Carried`).
    carried: Vec<u8>,
    /// Passes not yet claimed.
    count: usize,
}

/// The server's state.
#[derive(Debug, Default)]
struct Server {
    /// The epoll descriptor the thread waits on (-1: not started).
    epfd: RawFd,
    /// Each client's channel and the sockets it holds.
    clients: HashMap<RawFd, HashSet<SocketRef>>,
    /// Each client's process id, as it said ([`Op::hello`]).
    pids: HashMap<RawFd, u32>,
    held: HashMap<SocketRef, Held>,
    /// Sockets in flight between processes, by their eventfd's id.
    flights: HashMap<u64, Flight>,
}

static SERVER: Mutex<Option<Server>> = Mutex::new(None);

fn server() -> std::sync::MutexGuard<'static, Option<Server>> {
    SERVER.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The stack handle a socket of this kind holds.
pub fn socket_ref(kind: Kind) -> Option<SocketRef> {
    match kind {
        Kind::Stream { handle, .. } => Some(SocketRef::Tcp(handle)),
        Kind::Listener { handle, .. } => Some(SocketRef::Listener(handle)),
        Kind::Dgram { handle, .. } => Some(SocketRef::Udp(handle)),
        Kind::Fresh { .. } | Kind::Closed => None,
    }
}

/// The server's listening socket (-1: none): processes of the program
/// that find the stack taken, and programs joined to it by name, connect
/// to it.
static LISTENER: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// The abstract Unix socket address other processes join a stack at
/// (`name`: the stack's claim).
pub fn join_addr(name: &str) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_un is valid; the name is copied in below.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let full = format!("{name}-share");
    let bytes = full.as_bytes();
    let n = bytes.len().min(addr.sun_path.len() - 1);
    for (d, &b) in addr.sun_path[1..=n].iter_mut().zip(bytes) {
        *d = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + n;
    (addr, len as libc::socklen_t)
}

/// The owner's stack just started: listen for processes joining it
/// (a failure leaves them on the kernel's sockets, as before).
pub fn listen(net: &'static Net, name: &str) {
    let r = real();
    // SAFETY: the C library's socket.
    let fd = unsafe {
        (r.socket)(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return;
    }
    let (addr, len) = join_addr(name);
    // SAFETY: `addr` is a sockaddr_un valid for `len` bytes.
    let bound = unsafe { (r.bind)(fd, (&addr as *const libc::sockaddr_un).cast(), len) } == 0;
    // SAFETY: listening on our socket.
    if !bound || unsafe { (r.listen)(fd, 64) } != 0 {
        chan::close(fd);
        return;
    }
    crate::own::record(fd);
    let mut g = server();
    let srv = g.get_or_insert_with(|| Server {
        epfd: -1,
        ..Server::default()
    });
    if start(net, srv).is_err() {
        return;
    }
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: fd as u64,
    };
    // SAFETY: a valid epoll descriptor, socket and event.
    if unsafe { (r.epoll_ctl)(srv.epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) } == 0 {
        LISTENER.store(fd, std::sync::atomic::Ordering::Release);
    }
}

/// Accept the processes waiting to join: each a client holding nothing.
fn accept_joiners(listener: RawFd) {
    loop {
        // SAFETY: accepting on our listening socket.
        let fd = unsafe {
            (real().accept4)(
                listener,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if fd < 0 {
            return;
        }
        let fd = chan::high(fd);
        let mut g = server();
        let added = g
            .as_mut()
            .is_some_and(|srv| add_channel(srv, fd, HashSet::new()).is_ok());
        if !added {
            chan::close(fd);
        }
    }
}

/// Start the server's thread (once).
fn start(net: &'static Net, srv: &mut Server) -> Res<()> {
    if srv.epfd < 0 {
        // SAFETY: epoll_create1 with a valid flag.
        let ep = unsafe { (real().epoll_create1)(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(errno());
        }
        srv.epfd = ep;
        crate::own::record(ep);
        spawn(net, ep)?;
    }
    Ok(())
}

/// The server's thread, while it runs.
static THREAD: Mutex<Option<std::thread::JoinHandle<()>>> = Mutex::new(None);

/// An eventfd in the server's epoll set: written to stop its thread.
static QUIT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// Start the server's thread on epoll descriptor `ep`.
fn spawn(net: &'static Net, ep: RawFd) -> Res<()> {
    let t = std::thread::Builder::new()
        .name("ustack-share".into())
        .spawn(move || serve(net, ep))
        .map_err(|_| libc::EAGAIN)?;
    *THREAD.lock().unwrap_or_else(PoisonError::into_inner) = Some(t);
    Ok(())
}

/// The processes holding the stack's sockets: this one (the owner) and
/// each client, with the stack handles each holds (a client that has not
/// said its pid yet is left out).
fn holders() -> Vec<(u32, &'static str, Vec<SocketRef>)> {
    let mine: HashSet<SocketRef> = crate::fd::all()
        .into_iter()
        .filter_map(|(_, s)| socket_ref(*s.kind.lock()))
        .collect();
    let mut out = vec![(std::process::id(), "owner", mine.into_iter().collect())];
    if let Some(srv) = server().as_ref() {
        for (chan, holds) in &srv.clients {
            if let Some(&pid) = srv.pids.get(chan) {
                out.push((pid, "client", holds.iter().copied().collect()));
            }
        }
    }
    out
}

/// Telemetry's view of the processes sharing the stack (see
/// `ustack_runtime::set_holders_source`): none while the owner has it to
/// itself.
pub fn telemetry_holders() -> Vec<ustack_runtime::Holder> {
    if super::is_client() || !has_clients() {
        return Vec::new();
    }
    let Some(s) = crate::state::state() else {
        return Vec::new();
    };
    let all = holders();
    s.net
        .peek_stack(|st| {
            all.into_iter()
                .map(|(pid, role, refs)| ustack_runtime::Holder {
                    pid,
                    role,
                    sockets: refs.len() as u64,
                    connections: refs
                        .iter()
                        .filter_map(|r| match r {
                            SocketRef::Tcp(h) => st.tcp_ref().info(*h).map(|i| (i.local, i.remote)),
                            _ => None,
                        })
                        .collect(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a process shares this process's stack now.
pub fn has_clients() -> bool {
    server().as_ref().is_some_and(|s| !s.clients.is_empty())
}

/// Stop the server's thread between two calls (it exits holding no lock;
/// the channels and what they hold stay as they are): before the owner
/// forks its keeper, which runs it again ([`restart`]).
pub fn stop_thread() {
    let Some(t) = THREAD.lock().unwrap_or_else(PoisonError::into_inner).take() else {
        return;
    };
    let epfd = server().as_ref().map_or(-1, |s| s.epfd);
    // SAFETY: a non-blocking, close-on-exec eventfd of the layer's own.
    let q = unsafe { (real().eventfd)(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: q as u64,
    };
    // SAFETY: adding our eventfd to the server's epoll set.
    let added = q >= 0 && unsafe { (real().epoll_ctl)(epfd, libc::EPOLL_CTL_ADD, q, &mut ev) } == 0;
    if !added {
        if q >= 0 {
            chan::close(q);
        }
        // The thread cannot be told: it runs on (and is not copied into
        // a keeper, which then starts its own).
        return;
    }
    QUIT.store(q, std::sync::atomic::Ordering::Release);
    let one: u64 = 1;
    // SAFETY: an 8-byte write to our eventfd.
    unsafe { (real().write)(q, (&one as *const u64).cast(), 8) };
    let _ = t.join();
    // SAFETY: removing our eventfd from the set, then closing it.
    unsafe { (real().epoll_ctl)(epfd, libc::EPOLL_CTL_DEL, q, std::ptr::null_mut()) };
    QUIT.store(-1, std::sync::atomic::Ordering::Release);
    chan::close(q);
}

/// Run the server's thread again (in the keeper, on the channels its
/// memory and descriptors copied).
pub fn restart(net: &'static Net) -> Res<()> {
    let epfd = server().as_ref().map_or(-1, |s| s.epfd);
    if epfd < 0 {
        return Err(libc::EBADF);
    }
    spawn(net, epfd)
}

/// Signalled when a client leaves.
static LEFT: std::sync::Condvar = std::sync::Condvar::new();

/// Wait until no process shares the stack any more.
pub fn wait_for_no_clients() {
    let mut g = server();
    while g.as_ref().is_some_and(|s| !s.clients.is_empty()) {
        g = LEFT.wait(g).unwrap_or_else(PoisonError::into_inner);
    }
}

/// Register a forked child's channel (the owner's end `chan`): it holds
/// every socket the owner holds now.
pub fn add_child(net: &'static Net, chan: RawFd) -> Res<()> {
    let mine: HashSet<SocketRef> = crate::fd::all()
        .into_iter()
        .filter_map(|(_, s)| socket_ref(*s.kind.lock()))
        .collect();
    let mut g = server();
    let srv = g.get_or_insert_with(|| Server {
        epfd: -1,
        ..Server::default()
    });
    start(net, srv)?;
    for r in &mine {
        let h = srv.held.entry(*r).or_default();
        h.clients += 1;
        h.owner_had = true;
    }
    add_channel(srv, chan, mine)
}

/// Watch a new client channel.
fn add_channel(srv: &mut Server, chan: RawFd, holds: HashSet<SocketRef>) -> Res<()> {
    // A second process on the stack: every eventfd may be another's to
    // drain from now on.
    crate::fd::set_shared();
    crate::own::record(chan);
    let mut ev = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
        u64: chan as u64,
    };
    // SAFETY: a valid epoll descriptor, channel and event.
    if unsafe { (real().epoll_ctl)(srv.epfd, libc::EPOLL_CTL_ADD, chan, &mut ev) } < 0 {
        return Err(errno());
    }
    srv.clients.insert(chan, holds);
    Ok(())
}

/// Whether a client holds `sock` (the owner's; false in a client, whose
/// copy of the server's state is not its own).
pub fn held_by_clients(sock: &Sock) -> bool {
    if super::is_client() {
        return false;
    }
    let Some(r) = socket_ref(*sock.kind.lock()) else {
        return false;
    };
    server()
        .as_ref()
        .and_then(|s| s.held.get(&r))
        .is_some_and(|h| h.clients > 0)
}

/// The owner closes its last descriptor of `sock`: true when a client
/// still holds it (then it is kept here, open in the stack, until the last
/// client lets it go).
pub fn keep_for_clients(sock: &Arc<Sock>, kind: Kind) -> bool {
    if super::is_client() {
        return false;
    }
    let Some(r) = socket_ref(kind) else {
        return false;
    };
    let mut g = server();
    let Some(h) = g.as_mut().and_then(|s| s.held.get_mut(&r)) else {
        return false;
    };
    if h.clients == 0 {
        return false;
    }
    h.stash = Some(sock.clone());
    true
}

/// What to do once a socket has no holder left.
enum Closing {
    /// Close the owner's kept socket as its own close would have.
    Stashed(Arc<Sock>),
    /// Close a socket a client made, by its stack handle.
    Made(SocketRef, bool, Option<RawFd>),
}

/// A client lets go of `r`: what to close, when it was the last holder
/// and the owner no longer holds it.
fn release(srv: &mut Server, r: SocketRef, linger0: bool) -> Option<Closing> {
    let h = srv.held.get_mut(&r)?;
    h.clients = h.clients.saturating_sub(1);
    if h.clients > 0 {
        return None;
    }
    let h = srv.held.remove(&r)?;
    match (h.stash, h.owner_had) {
        (Some(s), _) => Some(Closing::Stashed(s)),
        // The owner still holds it: its own close closes it.
        (None, true) => None,
        (None, false) => Some(Closing::Made(r, linger0, h.eventfd)),
    }
}

fn close(net: &'static Net, c: Closing) {
    match c {
        Closing::Stashed(s) => {
            // The socket's locks under the fork gate, the stack's outside
            // it (the loop may wait for the gate while it holds the stack).
            let detached = {
                let _gate = crate::fd::fork_gate();
                crate::sock::detach(&s)
            };
            if let Some((r, linger0)) = detached {
                super::Access::Local(net).close_ref(r, linger0);
            }
            let _gate = crate::fd::fork_gate();
            s.close_kept();
        }
        Closing::Made(r, linger0, eventfd) => {
            super::Access::Local(net).close_ref(r, linger0);
            if let Some(fd) = eventfd {
                crate::own::forget(fd);
                chan::close(fd);
            }
        }
    }
}

/// Put socket `r` in flight under eventfd id `id` (a pass holds it, as
/// a process would).
fn lend_in(srv: &mut Server, r: Option<SocketRef>, id: u64, carried: Vec<u8>) {
    let f = srv.flights.entry(id).or_insert(Flight {
        r,
        carried: Vec::new(),
        count: 0,
    });
    f.count += 1;
    f.carried = carried;
    if let Some(r) = r {
        // No entry: only the owner holds it (a client holding a socket
        // has one).
        let owners = !srv.held.contains_key(&r);
        let h = srv.held.entry(r).or_default();
        h.owner_had |= owners;
        h.clients += 1;
    }
}

/// The owner passes socket `r` to another process under eventfd id `id`
/// ([`super::rights::lend`]): whether it is in flight.
pub fn lend(r: Option<SocketRef>, id: u64, carried: Vec<u8>) -> bool {
    let mut g = server();
    let Some(srv) = g.as_mut() else {
        return false;
    };
    lend_in(srv, r, id, carried);
    true
}

/// Claim the socket in flight under `id` for the client on `chan` (None:
/// the owner, which then calls [`adopted`]); `undo`: the pass failed,
/// the socket is no longer in flight. What it was.
pub fn claim(chan: Option<RawFd>, id: u64, undo: bool) -> Option<Vec<u8>> {
    let (carried, closing) = {
        let mut g = server();
        let srv = g.as_mut()?;
        let f = srv.flights.get_mut(&id)?;
        f.count -= 1;
        let (r, carried) = (f.r, f.carried.clone());
        if f.count == 0 {
            srv.flights.remove(&id);
        }
        let closing = match (r, chan) {
            (Some(r), _) if undo => release(srv, r, false),
            (Some(r), Some(ch)) => {
                // The pass's hold becomes the client's (one hold each: a
                // client that holds it already gives the pass's back).
                let fresh = srv.clients.entry(ch).or_default().insert(r);
                if fresh { None } else { release(srv, r, false) }
            }
            _ => None,
        };
        (carried, closing)
    };
    if let (Some(c), Some(s)) = (closing, crate::state::state()) {
        close(&s.net, c);
    }
    Some(carried)
}

/// The owner took back socket `r` (`sock` in its table now): the pass's
/// hold becomes the owner's, the socket it kept for clients (if it had
/// closed it) or its copy of a client's eventfd gives way to `sock`.
pub fn adopted(r: SocketRef, sock: &Arc<Sock>) {
    let Some(s) = crate::state::state() else {
        return;
    };
    let _ = s.net.watch(r, crate::fd::watcher(sock));
    let (stash, copy) = {
        let mut g = server();
        let Some(srv) = g.as_mut() else { return };
        let Some(h) = srv.held.get_mut(&r) else {
            return;
        };
        h.owner_had = true;
        h.clients = h.clients.saturating_sub(1);
        let taken = (h.stash.take(), h.eventfd.take());
        if h.clients == 0 {
            srv.held.remove(&r);
        }
        taken
    };
    if let Some(old) = stash {
        let _gate = crate::fd::fork_gate();
        old.close_kept();
    }
    if let Some(fd) = copy {
        crate::own::forget(fd);
        chan::close(fd);
    }
    sock.notify();
}

/// A client's channel hung up: it holds nothing any more.
fn drop_client(net: &'static Net, chan: RawFd) {
    let closing: Vec<Closing> = {
        let mut g = server();
        let Some(srv) = g.as_mut() else { return };
        let holds = srv.clients.remove(&chan).unwrap_or_default();
        srv.pids.remove(&chan);
        LEFT.notify_all();
        // SAFETY: removing a descriptor from our epoll set.
        unsafe { (real().epoll_ctl)(srv.epfd, libc::EPOLL_CTL_DEL, chan, std::ptr::null_mut()) };
        holds
            .into_iter()
            .filter_map(|r| release(srv, r, false))
            .collect()
    };
    crate::own::forget(chan);
    chan::close(chan);
    for c in closing {
        close(net, c);
    }
}

/// An eventfd writer for the loop: the owner's copy of a client's socket.
fn eventfd_watcher(fd: RawFd) -> ustack_runtime::Watcher {
    Arc::new(move |_| {
        let one: u64 = 1;
        // SAFETY: the owner's copy of the eventfd, open until the socket
        // is released (then unwatched before it closes).
        unsafe { (real().write)(fd, (&one as *const u64).cast(), 8) };
    })
}

/// Answer one call on `chan`: the answer, or None when the client is gone.
fn answer(net: &'static Net, chan: RawFd, op: Op, fd: Option<RawFd>) -> Vec<u8> {
    let ok =
        || postcard::to_stdvec(&Ok::<Result<(), WireErr>, WireErr>(Ok(()))).unwrap_or_default();
    match op {
        Op::watch { r } => {
            if let Some(fd) = fd {
                crate::own::record(fd);
                let _ = net.watch(r, eventfd_watcher(fd));
                let mut g = server();
                if let Some(srv) = g.as_mut() {
                    srv.clients.entry(chan).or_default().insert(r);
                    let h = srv.held.entry(r).or_default();
                    h.clients += 1;
                    h.eventfd = Some(fd);
                }
            }
            ok()
        }
        Op::release { r, linger0 } => {
            let c = {
                let mut g = server();
                g.as_mut().and_then(|srv| {
                    let held = srv.clients.get_mut(&chan).is_some_and(|h| h.remove(&r));
                    if held { release(srv, r, linger0) } else { None }
                })
            };
            if let Some(c) = c {
                close(net, c);
            }
            ok()
        }
        Op::fork {} => {
            if let Some(child) = fd {
                let mut g = server();
                if let Some(srv) = g.as_mut() {
                    let holds = srv.clients.get(&chan).cloned().unwrap_or_default();
                    for r in &holds {
                        srv.held.entry(*r).or_default().clients += 1;
                    }
                    if add_channel(srv, child, holds).is_err() {
                        chan::close(child);
                    }
                }
            }
            ok()
        }
        Op::lend { r, id, carried } => {
            if let Some(srv) = server().as_mut() {
                lend_in(srv, r, id, carried);
            }
            ok()
        }
        Op::claim { id, undo } => {
            let got = claim(Some(chan), id, undo);
            postcard::to_stdvec(&Ok::<Result<Option<Vec<u8>>, WireErr>, WireErr>(Ok(got)))
                .unwrap_or_default()
        }
        Op::hello { pid } => {
            if let Some(srv) = server().as_mut() {
                srv.pids.insert(chan, pid);
            }
            ok()
        }
        Op::exec { keep } => {
            let closing: Vec<Closing> = {
                let mut g = server();
                let Some(srv) = g.as_mut() else {
                    return ok();
                };
                let keep: HashSet<SocketRef> = keep.into_iter().collect();
                let holds = srv.clients.get_mut(&chan).map(std::mem::take);
                let (kept, gone): (HashSet<SocketRef>, HashSet<SocketRef>) = holds
                    .unwrap_or_default()
                    .into_iter()
                    .partition(|r| keep.contains(r));
                srv.clients.insert(chan, kept);
                gone.into_iter()
                    .filter_map(|r| release(srv, r, false))
                    .collect()
            };
            for c in closing {
                close(net, c);
            }
            ok()
        }
        op => {
            if let Some(x) = fd {
                chan::close(x);
            }
            run_op(net, op).unwrap_or_default()
        }
    }
}

/// The server thread: wait on every channel, answer each call at once.
fn serve(net: &'static Net, epfd: RawFd) {
    let mut buf = vec![0u8; chan::MAX_MSG];
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
    loop {
        // SAFETY: a valid epoll descriptor and event array.
        let n = unsafe {
            (real().epoll_pwait)(
                epfd,
                events.as_mut_ptr(),
                events.len() as i32,
                -1,
                std::ptr::null(),
            )
        };
        if n < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return;
        }
        for ev in &events[..n as usize] {
            let ch = ev.u64 as RawFd;
            if ch == QUIT.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            if ch == LISTENER.load(std::sync::atomic::Ordering::Acquire) {
                accept_joiners(ch);
                continue;
            }
            let got = chan::recv(ch, &mut buf);
            let (len, fd) = match got {
                Ok((len, fd)) if len > 0 => (len, fd),
                _ => {
                    drop_client(net, ch);
                    continue;
                }
            };
            let reply = match postcard::from_bytes::<Op>(&buf[..len]) {
                Ok(op) => answer(net, ch, op, fd),
                Err(_) => {
                    postcard::to_stdvec(&Err::<(), WireErr>(WireErr::Other)).unwrap_or_default()
                }
            };
            if chan::send(ch, &reply, None).is_err() {
                drop_client(net, ch);
            }
        }
    }
}

/// In a child just forked from the owner: the server's descriptors are
/// the owner's; close this copy of them (when no thread of the owner held
/// the server's state at the fork; else leave them, harmless).
pub fn forget_after_fork() {
    let Ok(mut g) = SERVER.try_lock() else {
        return;
    };
    if let Some(srv) = g.take() {
        for ch in srv.clients.keys() {
            chan::close(*ch);
        }
        for h in srv.held.values() {
            if let Some(fd) = h.eventfd {
                chan::close(fd);
            }
        }
        if srv.epfd >= 0 {
            chan::close(srv.epfd);
        }
        let l = LISTENER.swap(-1, std::sync::atomic::Ordering::AcqRel);
        if l >= 0 {
            chan::close(l);
        }
    }
}
