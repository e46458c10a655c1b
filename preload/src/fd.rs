//! The descriptor table: which descriptor numbers are ustack sockets.
//!
//! A ustack socket's number is an eventfd the layer opened, so the kernel
//! never hands that number to anything else, and kernel `poll`/`epoll` can
//! wait on it: the loop's watcher writes the eventfd when the socket gets a
//! readiness event (once, until a waiter drains it), and every wait first
//! drains it, then checks the socket's levels, then blocks in the kernel.
//! `dup` gives a socket more numbers (each another descriptor of the same
//! eventfd); the socket closes with its last one.

use std::ffi::c_int;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use ustack::events::Readiness;
use ustack::socket::tcp::{ListenHandle, TcpHandle};
use ustack::socket::udp::UdpHandle;

use crate::real::{Res, real};

/// What a socket is, in the stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Kind {
    /// Created (and perhaps bound), not yet listening or connected.
    Fresh { port: u16 },
    /// Listening.
    Listener { handle: ListenHandle, port: u16 },
    /// A connection, opened (`connecting` until the handshake ends) or accepted.
    Stream { handle: TcpHandle, connecting: bool },
    /// A UDP socket, bound, with its default peer after `connect`.
    Dgram {
        handle: UdpHandle,
        port: u16,
        peer: Option<SocketAddr>,
    },
    /// Closed in the stack (shut by `close` on its last descriptor).
    Closed,
}

/// Socket options the layer keeps (applied where the stack can).
#[derive(Debug, Clone, Copy, Default)]
pub struct Opts {
    pub reuse_addr: bool,
    pub reuse_port: bool,
    pub keepalive: bool,
    pub keep_idle: c_int,
    pub keep_intvl: c_int,
    pub keep_cnt: c_int,
    pub nodelay: bool,
    pub cork: bool,
    pub sndbuf: c_int,
    pub rcvbuf: c_int,
    /// `SO_LINGER`: on, seconds.
    pub linger: Option<c_int>,
    /// `SO_RCVTIMEO`/`SO_SNDTIMEO` in microseconds (0: none).
    pub rcvtimeo_us: i64,
    pub sndtimeo_us: i64,
    /// An error `SO_ERROR` reports once (a failed non-blocking connect).
    pub pending_error: c_int,
    /// The connection's error (a reset, a timeout) was returned by a call
    /// already: later calls see a shut connection.
    pub error_reported: bool,
    /// `shutdown` done: reading (`SHUT_RD`) and writing (`SHUT_WR`).
    pub shut_rd: bool,
    pub shut_wr: bool,
    /// `IP_PKTINFO`: `recvmsg` reports the datagram's destination.
    pub pktinfo: bool,
    /// `IP_RECVORIGDSTADDR`: `recvmsg` reports the original destination.
    pub origdstaddr: bool,
    /// `TCP_USER_TIMEOUT` in milliseconds (0: the stack's retry limit).
    pub user_timeout_ms: c_int,
    /// `IPV6_V6ONLY` (an `AF_INET6` socket): IPv6 peers only.
    pub v6only: bool,
    /// `IPV6_RECVPKTINFO`: `recvmsg` reports the datagram's destination.
    pub recvpktinfo6: bool,
    /// The address `bind` gave (None: none, or the wildcard).
    pub bound: Option<IpAddr>,
    /// Options kept and reported back without an effect of their own.
    pub kept: Kept,
}

/// How many distinct kept options a socket holds: every `Rule::Kept` in `opts.rs`
/// and the few matched by name that are kept too.
pub const KEPT_MAX: usize = 80;

/// Values of kept options (`Rule::Kept` in `opts.rs`), per socket: a fixed array
/// (Copy, so the options stay one plain value).
#[derive(Debug, Clone, Copy)]
pub struct Kept {
    n: usize,
    v: [(c_int, c_int, c_int); KEPT_MAX],
}

impl Default for Kept {
    fn default() -> Self {
        Kept {
            n: 0,
            v: [(0, 0, 0); KEPT_MAX],
        }
    }
}

impl Kept {
    /// The value set for `(level, name)`, if any.
    pub fn get(&self, level: c_int, name: c_int) -> Option<c_int> {
        self.v[..self.n]
            .iter()
            .find(|(l, n, _)| *l == level && *n == name)
            .map(|e| e.2)
    }

    /// Keep `value` for `(level, name)`; ENOMEM past [`KEPT_MAX`] options.
    pub fn set(&mut self, level: c_int, name: c_int, value: c_int) -> Res<()> {
        if let Some(e) = self.v[..self.n]
            .iter_mut()
            .find(|(l, n, _)| *l == level && *n == name)
        {
            e.2 = value;
            return Ok(());
        }
        let slot = self.v.get_mut(self.n).ok_or(libc::ENOMEM)?;
        *slot = (level, name, value);
        self.n += 1;
        Ok(())
    }
}

/// The stack is shared with other processes (this one forked, or was
/// forked from its owner): an eventfd may be written and drained by any of
/// them, so a process's own record of it says nothing.
static SHARED: AtomicBool = AtomicBool::new(false);

/// From now on the eventfds are shared ([`SHARED`]).
pub fn set_shared() {
    SHARED.store(true, Ordering::Relaxed);
}

fn shared() -> bool {
    SHARED.load(Ordering::Relaxed)
}

/// One ustack socket, shared by its descriptors.
#[derive(Debug)]
pub struct Sock {
    /// `SOCK_STREAM` (TCP) or `SOCK_DGRAM` (UDP).
    pub stream: bool,
    /// `AF_INET6` (else `AF_INET`): the family of the addresses it takes
    /// and gives (IPv4 peers as v4-mapped addresses).
    pub v6: bool,
    pub kind: Mutex<Kind>,
    pub opts: Mutex<Opts>,
    pub nonblocking: AtomicBool,
    /// The descriptors that name it (the first is signalled).
    fds: Mutex<Vec<RawFd>>,
    /// The eventfd holds an unread notification.
    signaled: AtomicBool,
    /// Times the kernel-side wait found nothing and slept (for tests).
    pub sleeps: AtomicI64,
    /// The identity of the eventfd behind it (`st_dev`, `st_ino`): a
    /// number the table holds but whose descriptor no longer has it was
    /// closed behind the layer's back and given to something else.
    ident: (u64, u64),
    /// The inode number `fstat` reports for it (unique per socket, as
    /// sockfs gives each socket its own).
    pub ino: u64,
    /// `MSG_ZEROCOPY` sends and their completions (the error queue).
    pub zc: Mutex<crate::zerocopy::ZeroCopy>,
    /// `SO_TIMESTAMPING`: the flags and the stamps not yet read.
    pub ts: Mutex<crate::tstamp::Timestamping>,
}

impl Sock {
    /// A new socket (`AF_INET6` when `v6`) named by descriptor `fd` (an
    /// eventfd).
    pub fn new(stream: bool, v6: bool, fd: RawFd, nonblocking: bool) -> Arc<Sock> {
        static NEXT_INO: AtomicU64 = AtomicU64::new(1 << 40);
        Arc::new(Sock {
            ident: identity(fd).unwrap_or((u64::MAX, u64::MAX)),
            ino: NEXT_INO.fetch_add(1, Ordering::Relaxed),
            stream,
            v6,
            kind: Mutex::new(Kind::Fresh { port: 0 }),
            opts: Mutex::new(Opts::default()),
            nonblocking: AtomicBool::new(nonblocking),
            fds: Mutex::new(vec![fd]),
            signaled: AtomicBool::new(false),
            sleeps: AtomicI64::new(0),
            zc: Mutex::new(crate::zerocopy::ZeroCopy::default()),
            ts: Mutex::new(crate::tstamp::Timestamping::default()),
        })
    }

    /// Make the socket's descriptors readable in the kernel (from the loop's
    /// watcher): one eventfd write until a waiter drains it (each time
    /// once the stack is shared: the waiter may be another process).
    pub fn notify(&self) {
        if self.signaled.swap(true, Ordering::AcqRel) && !shared() {
            return;
        }
        let fds = self.fds.lock();
        if let Some(&fd) = fds.first() {
            let one: u64 = 1;
            // SAFETY: `fd` is an open eventfd (closing takes the same lock
            // before it closes a descriptor), written with 8 bytes.
            unsafe { (real().write)(fd, (&one as *const u64).cast(), 8) };
        }
    }

    /// Clear the kernel-side notification before checking levels (each
    /// time once the stack is shared: another process may have written it).
    pub fn drain(&self) {
        if !self.signaled.swap(false, Ordering::AcqRel) && !shared() {
            return;
        }
        let fds = self.fds.lock();
        if let Some(&fd) = fds.first() {
            let mut v: u64 = 0;
            // SAFETY: as in `notify`; the eventfd is non-blocking.
            unsafe { (real().read)(fd, (&mut v as *mut u64).cast(), 8) };
        }
    }

    /// A wait found the socket ready after draining its eventfd: once the
    /// stack is shared, write it again, so another process waiting on the
    /// same eventfd (a drain here took the notification from it) wakes and
    /// looks for itself, as every waiter on a ready kernel socket wakes.
    /// Not from `epoll_wait`: an edge-triggered set would wake again at
    /// once.
    pub fn pass_on(&self) {
        if !shared() {
            return;
        }
        let fds = self.fds.lock();
        if let Some(&fd) = fds.first() {
            let one: u64 = 1;
            // SAFETY: as in `notify`.
            unsafe { (real().write)(fd, (&one as *const u64).cast(), 8) };
        }
    }

    /// One of the descriptors naming this socket (to wait on in the kernel).
    pub fn any_fd(&self) -> Option<RawFd> {
        self.fds.lock().first().copied()
    }

    /// Whether the descriptor under number `fd` is still this socket's
    /// eventfd (one `fstat`): false when the number was closed behind the
    /// layer's back and the kernel gave it to something else.
    pub fn named_by(&self, fd: RawFd) -> bool {
        identity(fd) == Some(self.ident)
    }

    /// Another descriptor names the socket.
    pub fn add_fd(&self, fd: RawFd) {
        self.fds.lock().push(fd);
    }

    /// Forget descriptor `fd` without closing it (its number was closed
    /// behind the layer's back and may be another's now); returns whether
    /// it was the socket's last.
    pub fn forget_fd(&self, fd: RawFd) -> bool {
        let mut fds = self.fds.lock();
        fds.retain(|&f| f != fd);
        fds.is_empty()
    }

    /// The socket's last descriptor `fd` closes while a process forked
    /// from this one still holds the socket: move this process's copy of
    /// the eventfd to a number of the layer's own (the loop's watcher
    /// writes it, and the other processes wait on the same object), and
    /// free the program's number. False when `fd` is not the last.
    pub fn keep_last_fd(&self, fd: RawFd) -> bool {
        let mut fds = self.fds.lock();
        if fds.as_slice() != [fd] {
            return false;
        }
        // SAFETY: duplicating an open eventfd onto a free number >= 512.
        let kept = unsafe { (real().fcntl)(fd, libc::F_DUPFD_CLOEXEC, 512) };
        if kept < 0 {
            return false;
        }
        crate::own::record(kept);
        fds[0] = kept;
        // SAFETY: closing the program's number, under the lock `notify` takes.
        unsafe { (real().close)(fd) };
        true
    }

    /// Close every descriptor still naming the socket (a kept one, once
    /// no process holds the socket any more).
    pub fn close_kept(&self) {
        let mut fds = self.fds.lock();
        for fd in fds.drain(..) {
            crate::own::forget(fd);
            // SAFETY: a descriptor of the layer's own, under the lock.
            unsafe { (real().close)(fd) };
        }
    }

    /// Close descriptor `fd` in the kernel and forget it; returns whether it
    /// was the socket's last.
    pub fn close_fd(&self, fd: RawFd) -> bool {
        let mut fds = self.fds.lock();
        fds.retain(|&f| f != fd);
        // SAFETY: closing a descriptor we own, under the lock `notify` takes.
        unsafe { (real().close)(fd) };
        fds.is_empty()
    }
}

/// A watcher for the loop: notify the socket while it lives.
pub fn watcher(sock: &Arc<Sock>) -> ustack_runtime::Watcher {
    let weak: Weak<Sock> = Arc::downgrade(sock);
    Arc::new(move |_: Readiness| {
        if let Some(s) = weak.upgrade() {
            let _gate = fork_gate();
            s.notify();
        }
    })
}

/// The descriptor table's type: descriptor numbers to sockets.
type Table = Vec<Option<Arc<Sock>>>;

/// Descriptor numbers to sockets. The standard library's lock, not
/// parking_lot's: it is held across `fork` (see [`lock_for_fork`]), and
/// parking_lot's fair unlock hands a contended lock to the threads parked
/// on it, which in the child do not exist, so the child's copy would stay
/// locked for ever. The standard lock's unlock only clears the state and
/// wakes whoever waits (nobody, in the child).
static TABLE: RwLock<Table> = RwLock::new(Vec::new());

/// The table to read (a panic elsewhere while holding it does not make
/// it unusable: its updates are single assignments).
fn read() -> RwLockReadGuard<'static, Table> {
    TABLE.read().unwrap_or_else(PoisonError::into_inner)
}

/// Held by the stack's own threads (the loop's watchers, the share
/// server) while they touch a socket's locks: `fork` takes the table's
/// write lock first ([`lock_for_fork`]), so no socket lock is held by one
/// of them in the child's copy of the memory, where they do not run.
pub fn fork_gate() -> RwLockReadGuard<'static, Table> {
    read()
}

/// The table to change.
fn write() -> RwLockWriteGuard<'static, Table> {
    TABLE.write().unwrap_or_else(PoisonError::into_inner)
}

/// The ustack socket `fd` names, if any (the data path's look-up: no
/// system call; see `sock::get_checked`).
pub fn get(fd: c_int) -> Option<Arc<Sock>> {
    let i = usize::try_from(fd).ok()?;
    read().get(i).cloned().flatten()
}

/// `(st_dev, st_ino)` of descriptor `fd` (the C library's `fstat`, not the
/// layer's).
pub fn identity(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: an all-zero `struct stat` is valid; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: the C library's fstat into our buffer.
    if unsafe { (real().fstat)(fd, &mut st) } != 0 {
        return None;
    }
    Some((st.st_dev, st.st_ino))
}

/// Whether no ustack socket exists (the fast path of poll and select).
pub fn is_empty() -> bool {
    COUNT.load(Ordering::Relaxed) == 0
}

/// Descriptors in the table now.
pub fn open_count() -> usize {
    COUNT.load(Ordering::Relaxed)
}

/// Descriptors in the table.
static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Record that `fd` names `sock`; returns the other socket the number
/// named before, if any (a stale entry: its descriptor was closed behind
/// the layer's back; the caller lets it go).
pub fn insert(fd: c_int, sock: Arc<Sock>) -> Option<Arc<Sock>> {
    let i = usize::try_from(fd).ok()?;
    let old = {
        let mut t = write();
        if t.len() <= i {
            t.resize(i + 1, None);
        }
        let old = t[i].replace(sock.clone());
        if old.is_none() {
            COUNT.fetch_add(1, Ordering::Relaxed);
        }
        old
    };
    old.filter(|o| !Arc::ptr_eq(o, &sock))
}

/// Forget `fd`; returns the socket it named.
pub fn remove(fd: c_int) -> Option<Arc<Sock>> {
    let i = usize::try_from(fd).ok()?;
    let s = write().get_mut(i).and_then(Option::take);
    if s.is_some() {
        COUNT.fetch_sub(1, Ordering::Relaxed);
    }
    s
}

/// Every socket in the table (once each), e.g. to close them at exit.
pub fn all() -> Vec<(c_int, Arc<Sock>)> {
    read()
        .iter()
        .enumerate()
        .filter_map(|(i, s)| Some((i as c_int, s.clone()?)))
        .collect()
}

thread_local! {
    /// The table's write guard, held by the forking thread from
    /// `pthread_atfork`'s prepare handler to its parent and child handlers
    /// (POSIX runs all three on that thread).
    static HELD_FOR_FORK: std::cell::RefCell<Option<RwLockWriteGuard<'static, Table>>> =
        const { std::cell::RefCell::new(None) };
}

/// Before `fork`: hold the table so no thread is changing it when the
/// child's copy is made.
pub fn lock_for_fork() {
    let guard = write();
    HELD_FOR_FORK.with(|h| *h.borrow_mut() = Some(guard));
}

/// The table held still, for a fork the layer makes itself (at exit,
/// where thread-locals are gone: the caller keeps the guard).
pub fn hold() -> RwLockWriteGuard<'static, Table> {
    write()
}

/// After `fork`, in parent and child: release what `lock_for_fork` held.
pub fn unlock_after_fork() {
    HELD_FOR_FORK.with(|h| drop(h.borrow_mut().take()));
}
