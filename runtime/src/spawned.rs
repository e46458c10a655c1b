//! A stack spawned on a poll-loop thread of its own and shared with the
//! threads and tasks that use its sockets: [`Net`], the handle the async
//! and blocking fronts hold, and [`Runtime`], which owns the loop's thread
//! (stop, pause and resume around `fork`).
//!
//! The stack sits behind one lock. The loop takes it for an iteration and
//! hands it over fairly between iterations; a socket call takes it for the
//! call. A call that would block registers its task's waker under the lock,
//! and the loop wakes it when the readiness event arrives ([`ustack::events`]),
//! so no wake-up is lost between the check and the wait. Calls that give
//! the loop work (data to send, a connection to open) wake it: idle on a
//! device with a descriptor (pcap), the loop polls that descriptor and an
//! eventfd the calls write ([`Wake`]), holding no lock; on one without
//! (sim, DPDK), it sleeps in its back-off and the calls unpark it.
//!
//! The loop is the one [`EventLoop`] (see [`crate::poll`]); `Spawned` is
//! its front here, `Core` what any thread needs to run an iteration.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Waker};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec};
use ustack::events::{Readiness, SocketRef};
use ustack::node::{App, Node, Port};
use ustack::phy::device::Device;
use ustack::{Error as StackError, Stack};

use crate::clock::Clock;
use crate::poll::{
    Driven, EventLoop, LoopConfig, Outcome, Schedule, StackGuard, StackLock, StatsSink, Turn,
    iterate,
};
use crate::telemetry::Publisher;

/// What a waiting task waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Interest {
    /// Data, a connection to accept, a datagram, the end of stream.
    Read,
    /// Room to write, the handshake's end.
    Write,
}

#[derive(Debug, Default)]
struct Waiters {
    read: Option<Waker>,
    write: Option<Waker>,
}

/// Called on every readiness event of the socket it watches, on the loop's
/// thread and outside the stack's lock (it must not block).
pub type Watcher = Arc<dyn Fn(Readiness) + Send + Sync>;

/// The stack and the tasks waiting on its sockets.
pub(crate) struct Inner {
    pub stack: Stack,
    /// The loop's clock (one origin per process): `now` for the socket
    /// calls a front makes between loop iterations (connect, close).
    clock: Clock,
    waiters: HashMap<SocketRef, Waiters>,
    watchers: HashMap<SocketRef, Watcher>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("stack", &self.stack)
            .field("waiters", &self.waiters)
            .field("watchers", &self.watchers.len())
            .finish()
    }
}

impl Inner {
    /// Engine time now, for a socket call that takes it.
    pub fn now(&self) -> ustack::time::Instant {
        self.clock.now()
    }

    /// Wake `cx`'s task when `socket` is ready for `interest`.
    pub fn wait(&mut self, socket: SocketRef, interest: Interest, cx: &Context<'_>) {
        let w = self.waiters.entry(socket).or_default();
        let slot = match interest {
            Interest::Read => &mut w.read,
            Interest::Write => &mut w.write,
        };
        match slot {
            Some(old) if old.will_wake(cx.waker()) => {}
            _ => *slot = Some(cx.waker().clone()),
        }
    }

    /// Forget the waiters and the watcher of a socket being closed.
    pub fn forget(&mut self, socket: SocketRef) {
        self.waiters.remove(&socket);
        self.watchers.remove(&socket);
    }
}

/// The state the loop thread and the socket handles share.
#[derive(Debug)]
pub(crate) struct Shared {
    inner: Mutex<Inner>,
    stop: AtomicBool,
    /// The loop has ended (stopped, or its device failed).
    gone: AtomicBool,
    failure: Mutex<Option<String>>,
    loop_thread: Mutex<Option<Thread>>,
    /// Asked to stop between iterations without ending (see [`Runtime::pause`]).
    pause: AtomicBool,
    /// The loop's port and app, for whichever thread runs an iteration
    /// ([`Net::drive`]). Only ever taken with `try_lock` by callers, so no
    /// thread is parked on it when a `fork` copies it.
    driver: Arc<Mutex<dyn Drive>>,
    /// Callers inside [`Net::drive`]; a pause waits for none to be left.
    drivers: AtomicUsize,
    /// When a caller last ran a turn ([`Net::drive`]), in microseconds of
    /// [`since_start`].
    driven_at: AtomicU64,
    /// How the fronts wake a loop asleep on its device.
    pub(crate) wake: Wake,
    /// A duplicate of the device's descriptor for callers that wait on
    /// it ([`Net::device_waiter`]); `None` on a device without one.
    device_fd: Option<OwnedFd>,
    /// The thread that waits on the device and runs the iterations
    /// ([`DeviceWaiter`]; a [`thread_tag`], 0: none): the loop's thread
    /// stays out of its way.
    waiter: AtomicU64,
    /// Socket calls that give the stack work never wake the loop's
    /// thread ([`Net::set_callers_drive`]).
    callers_drive: AtomicBool,
}

/// The wake-up of a loop that sleeps on its device's descriptor: an
/// eventfd it polls beside the device's, written by a front that gives
/// it work only while it sleeps there (a write is a system call; a
/// socket call on a busy loop costs two atomics).
///
/// No wake-up is lost: a sleeper counts itself in (`sleepers`) before it
/// looks at `pending` for the last time, a front says it has work
/// (`pending`) before it looks at `sleepers` (both sequentially
/// consistent), so either the sleeper sees the work or the front sees the
/// sleeper and writes. Two may sleep at once (the loop's thread, still in
/// its poll, and a caller that took the device meanwhile): a count, not a
/// flag, so one waking does not hide the other.
#[derive(Debug, Default)]
pub(crate) struct Wake {
    /// The eventfd; `None` on a device without a descriptor (the loop
    /// sleeps in its back-off and is unparked).
    fd: Option<OwnedFd>,
    /// Threads in (or about to enter) a poll on the eventfd.
    sleepers: AtomicU32,
    /// The eventfd was written and no sleeper has emptied it yet: one
    /// write wakes every sleeper.
    signalled: AtomicBool,
    /// A front gave the loop work since the loop's last iteration began.
    pending: AtomicBool,
    /// Waits a front's work ended (the eventfd) or cut short (work given
    /// as the loop was about to sleep): tests look.
    pub(crate) woken: AtomicU64,
}

impl Wake {
    /// A wake-up for a loop on a device with a descriptor.
    fn eventfd() -> Self {
        let fd = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK);
        if let Err(e) = &fd {
            tracing::debug!("no eventfd for the loop's wake-up ({e}): it backs off instead");
        }
        Wake {
            fd: fd.ok(),
            ..Wake::default()
        }
    }

    /// A front gave the loop work: write the eventfd if the loop sleeps
    /// on it. Whether it did.
    fn notify(&self) -> bool {
        self.pending.store(true, Ordering::SeqCst);
        let Some(fd) = &self.fd else {
            return false;
        };
        if !self.asleep() {
            return false;
        }
        if !self.signalled.swap(true, Ordering::SeqCst) {
            let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
        }
        true
    }

    /// Whether a thread sleeps (or is about to) on the eventfd.
    pub(crate) fn asleep(&self) -> bool {
        self.sleepers.load(Ordering::SeqCst) > 0
    }

    /// About to sleep on the eventfd: `false` if work came meanwhile (do
    /// not sleep; not counted in).
    fn enter_sleep(&self) -> bool {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        if self.pending.swap(false, Ordering::SeqCst) {
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Back from a sleep [`enter_sleep`](Self::enter_sleep) allowed.
    fn leave_sleep(&self) {
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// A sleeper saw the eventfd readable and takes the wake-up: empty it
    /// (a later front writes again).
    fn take_wakeup(&self) {
        self.woken.fetch_add(1, Ordering::Relaxed);
        self.signalled.store(false, Ordering::SeqCst);
        if let Some(fd) = &self.fd {
            let _ = rustix::io::read(fd, &mut [0u8; 8]);
        }
    }

    /// The loop is about to run an iteration: the work given so far is
    /// seen by it.
    fn begin_turn(&self) {
        self.pending.store(false, Ordering::SeqCst);
    }

    /// Sleep until the device's descriptor `rx` is readable, a front
    /// writes the eventfd, or `timeout` passes; no lock is held. Whether
    /// the loop should run again now (`false` on an error state of the
    /// device's descriptor, as [`Device::wait_rx`]: the loop backs off).
    fn wait(&self, rx: BorrowedFd<'_>, timeout: Duration, waiter: &AtomicU64) -> bool {
        let Some(fd) = &self.fd else {
            return false;
        };
        if !self.enter_sleep() {
            self.woken.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let mut fds = [
            PollFd::new(&rx, PollFlags::IN),
            PollFd::new(fd, PollFlags::IN),
        ];
        let ts = Timespec {
            tv_sec: timeout.as_secs().try_into().unwrap_or(i64::MAX),
            tv_nsec: timeout.subsec_nanos().into(),
        };
        let r = rustix::event::poll(&mut fds, Some(&ts));
        self.leave_sleep();
        let woken = fds[1].revents().contains(PollFlags::IN);
        // A caller that took the device while this thread slept here
        // sleeps on the same eventfd: the wake-up is its to take (this
        // thread stays out of its way), so it is left unread.
        if woken && waiter.load(Ordering::SeqCst) == 0 {
            self.take_wakeup();
        }
        woken
            || r.is_ok()
                && !fds[0]
                    .revents()
                    .intersects(PollFlags::ERR | PollFlags::HUP | PollFlags::NVAL)
    }
}

/// Microseconds since the first call in this process (a cheap clock for
/// "recently").
fn since_start() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_micros() as u64
}

/// What an iteration tried on a caller's thread came to.
enum Here {
    /// It ran: its turn, and whether the device can be waited on now.
    Ran(Turn, bool),
    /// Another thread is in an iteration.
    Busy,
    /// The loop pauses or has ended.
    Closed,
}

/// A number for this thread, unique in the process and never 0 (which
/// of the threads waits on the device).
fn thread_tag() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static TAG: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    TAG.with(|t| *t)
}

/// How recently a caller must have driven the stack for the loop's thread
/// to stay out of its way.
const DRIVING: u64 = 200;

impl Shared {
    /// Whether a caller drove the stack in the last [`DRIVING`] µs.
    pub(crate) fn driving(&self) -> bool {
        let at = self.driven_at.load(Ordering::Relaxed);
        at != 0 && since_start().saturating_sub(at) < DRIVING
    }
}

/// A handle on a running stack: what the async and blocking fronts hold.
/// Cloning shares the same stack.
#[derive(Debug, Clone)]
pub struct Net {
    pub(crate) shared: Arc<Shared>,
}

impl Net {
    /// Lock the stack for a socket call; fails once the loop has ended.
    pub(crate) fn lock(&self) -> io::Result<MutexGuard<'_, Inner>> {
        let guard = self.shared.inner.lock();
        if self.shared.gone.load(Ordering::Acquire) {
            return Err(self.gone_error());
        }
        Ok(guard)
    }

    /// The error every call returns once the loop has ended.
    pub(crate) fn gone_error(&self) -> io::Error {
        let why = self.shared.failure.lock().clone();
        io::Error::new(
            io::ErrorKind::NotConnected,
            why.unwrap_or_else(|| "the stack's poll loop has stopped".into()),
        )
    }

    /// The loop has work (data queued, a connection opened): wake it if it
    /// sleeps.
    pub(crate) fn kick(&self) {
        self.wake_loop(false);
    }

    /// Wake the loop: always asleep on its device (it may sleep there up
    /// to its next timer; so is a caller waiting there, see
    /// [`DeviceWaiter`]), from its back-off unless a caller drives the
    /// stack (`always`: even then; to stop or pause it).
    fn wake_loop(&self, always: bool) {
        if !always && self.shared.callers_drive.load(Ordering::Relaxed) {
            // Run to completion. A caller drove the stack a moment ago
            // and nobody sleeps on the device: it sends this at its next
            // turn. Otherwise this thread runs the iteration instead of
            // waking a thread (a context switch on a shared CPU), unless
            // another thread is in one now.
            let asleep = self.shared.wake.asleep();
            if !asleep && self.shared.driving() || self.turn_here().is_some() {
                return;
            }
        }
        if self.shared.wake.notify() && !always {
            return;
        }
        // A caller drives the stack (run to completion): it sends what was
        // queued on its next turn; waking the loop's thread from its short
        // back-off would only take the CPU from it.
        if !always && self.shared.driving() {
            return;
        }
        if let Some(t) = self.shared.loop_thread.lock().as_ref() {
            t.unpark();
        }
    }

    /// Call `watcher` on every readiness event of `socket` from now on
    /// (replacing any watcher it had) until [`unwatch`](Self::unwatch) or
    /// until the socket is closed through a front. A layer that keeps its
    /// own readiness (an eventfd per socket, a poll set) builds on this.
    pub fn watch(&self, socket: SocketRef, watcher: Watcher) -> io::Result<()> {
        self.lock()?.watchers.insert(socket, watcher);
        Ok(())
    }

    /// Stop watching `socket`.
    pub fn unwatch(&self, socket: SocketRef) {
        self.shared.inner.lock().watchers.remove(&socket);
    }

    /// Run `f` on the stack without waking the loop (for reads: readiness
    /// levels, counters, connection info).
    pub fn peek_stack<R>(&self, f: impl FnOnce(&Stack) -> R) -> io::Result<R> {
        Ok(f(&self.lock()?.stack))
    }

    /// Run `f` on the stack (for what the fronts do not cover: statistics,
    /// connection info, any in-loop API), then wake the loop.
    pub fn with_stack<R>(&self, f: impl FnOnce(&mut Stack) -> R) -> io::Result<R> {
        let r = f(&mut self.lock()?.stack);
        self.kick();
        Ok(r)
    }

    /// Engine time now, on the loop's clock: the `now` a socket call made
    /// through [`with_stack`](Self::with_stack) takes (connect, close).
    pub fn now(&self) -> ustack::time::Instant {
        Clock::new().now()
    }

    /// Whether the loop still runs.
    pub fn is_running(&self) -> bool {
        !self.shared.gone.load(Ordering::Acquire)
    }
}

/// An engine error (a socket call or an RDMA verb) as the `std::io`
/// error a socket user expects.
pub fn io_error(e: StackError) -> io::Error {
    use ustack::error::{ConnError, RcError, UdError};
    let kind = match e {
        StackError::AddrInUse => io::ErrorKind::AddrInUse,
        StackError::NoFreePort => io::ErrorKind::AddrNotAvailable,
        StackError::InvalidHandle => io::ErrorKind::NotConnected,
        StackError::QueueFull => io::ErrorKind::WouldBlock,
        StackError::TooLarge => io::ErrorKind::InvalidInput,
        StackError::NoRoute => io::ErrorKind::HostUnreachable,
        StackError::Closed => io::ErrorKind::BrokenPipe,
        StackError::Tcp(ConnError::Refused) => io::ErrorKind::ConnectionRefused,
        StackError::Tcp(ConnError::Reset) => io::ErrorKind::ConnectionReset,
        StackError::Tcp(ConnError::TimedOut) => io::ErrorKind::TimedOut,
        StackError::Tcp(ConnError::Aborted) => io::ErrorKind::ConnectionAborted,
        StackError::Tcp(ConnError::NetUnreachable) => io::ErrorKind::NetworkUnreachable,
        StackError::Tcp(ConnError::HostUnreachable) => io::ErrorKind::HostUnreachable,
        StackError::Tcp(ConnError::ProtocolError) => io::ErrorKind::Other,
        StackError::Rc(RcError::QueueFull) | StackError::Ud(UdError::QueueFull) => {
            io::ErrorKind::WouldBlock
        }
        StackError::Rc(RcError::InvalidHandle) | StackError::Ud(UdError::InvalidQp) => {
            io::ErrorKind::NotFound
        }
        StackError::Rc(RcError::QpnInUse(_)) | StackError::Ud(UdError::QpnInUse(_)) => {
            io::ErrorKind::AddrInUse
        }
        StackError::Rc(RcError::QpError) => io::ErrorKind::ConnectionAborted,
        StackError::Ud(UdError::NoDevice) => io::ErrorKind::NotFound,
        StackError::Rc(_) | StackError::Ud(_) => io::ErrorKind::InvalidInput,
    };
    io::Error::new(kind, e)
}

/// The rest of a paused loop: calling it runs the loop on from where it
/// stopped (on the calling thread).
type Resume<A> = Box<dyn FnOnce() -> Exit<A> + Send>;

/// How a loop thread ended.
enum Exit<A> {
    /// For good: the app, or why the loop failed.
    Done(Result<A, crate::Error>),
    /// Paused: the loop's state, to go on with.
    Paused(Resume<A>),
}

/// A stack running on its own thread: socket handles come from [`net`](Self::net)
/// (or the fronts' constructors); [`stop`](Self::stop) ends the loop and
/// returns the in-loop app. Dropping it stops the loop too.
pub struct Runtime<A: Send + 'static = ()> {
    net: Net,
    thread: Option<JoinHandle<Exit<A>>>,
    /// A paused loop's state.
    paused: Option<Resume<A>>,
}

impl<A: Send + 'static> std::fmt::Debug for Runtime<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("net", &self.net)
            .field("running", &self.thread.is_some())
            .field("paused", &self.paused.is_some())
            .finish()
    }
}

impl<A: Send + 'static> Runtime<A> {
    /// The handle sockets are opened on.
    pub fn net(&self) -> &Net {
        &self.net
    }

    /// Stop the loop and wait for it; returns the in-loop app, or the
    /// error that ended the loop early.
    pub fn stop(mut self) -> Result<A, crate::Error> {
        self.halt()
    }

    fn halt(&mut self) -> Result<A, crate::Error> {
        if self.paused.is_some() {
            self.resume()?;
        }
        self.net.shared.stop.store(true, Ordering::Release);
        self.net.wake_loop(true);
        match self.thread.take() {
            Some(t) => match t.join().map_err(|_| crate::Error::Panicked)? {
                Exit::Done(r) => r,
                Exit::Paused(_) => Err(crate::Error::State("the loop paused instead")),
            },
            None => Err(crate::Error::State("the runtime was already stopped")),
        }
    }

    /// Stop the loop between two iterations without ending it: its thread
    /// exits holding no lock, and the device, the stack and the app stay
    /// as they are until [`resume`](Self::resume). Before `fork`, so that a
    /// child can go on with the stack on a thread of its own.
    pub fn pause(&mut self) -> Result<(), crate::Error> {
        let Some(t) = self.thread.take() else {
            return Ok(());
        };
        let shared = &self.net.shared;
        shared.pause.store(true, Ordering::SeqCst);
        self.net.wake_loop(true);
        let exit = t.join().map_err(|_| crate::Error::Panicked);
        // No caller is left inside `Net::drive` (see there), so nobody
        // holds the core while the process forks.
        // Nor a waiter on the device, unless this very thread is it (a
        // signal handler that forks while its thread waits).
        let me = thread_tag();
        let waits = |w: u64| w != 0 && w != me;
        while shared.drivers.load(Ordering::SeqCst) != 0
            || waits(shared.waiter.load(Ordering::SeqCst))
        {
            std::thread::yield_now();
        }
        match exit? {
            Exit::Paused(rest) => {
                self.paused = Some(rest);
                Ok(())
            }
            Exit::Done(r) => r
                .map(|_| ())
                .and(Err(crate::Error::State("the loop ended before it paused"))),
        }
    }

    /// Run a paused loop on, on a new thread (in this process: after `fork`,
    /// the parent's or the child's).
    pub fn resume(&mut self) -> Result<(), crate::Error> {
        let Some(rest) = self.paused.take() else {
            return Ok(());
        };
        self.net.shared.pause.store(false, Ordering::SeqCst);
        let thread = std::thread::Builder::new()
            .name("ustack-loop".into())
            .spawn(rest)
            .map_err(crate::Error::Thread)?;
        self.thread = Some(thread);
        Ok(())
    }

    /// Give a paused loop up without touching its device (after `fork`,
    /// in the process that handed the stack to the other): socket calls
    /// fail from now on, and the loop's state is leaked on purpose (nothing
    /// closed or freed here), since the device's state is the other
    /// process's to use.
    pub fn leak_after_fork(&mut self) {
        self.net.shared.gone.store(true, Ordering::Release);
        *self.net.shared.failure.lock() = Some("the stack belongs to another process now".into());
        if let Some(rest) = self.paused.take() {
            std::mem::forget(rest);
        }
        self.thread = None;
    }
}

impl<A: Send + 'static> Drop for Runtime<A> {
    fn drop(&mut self) {
        if self.thread.is_some() || self.paused.is_some() {
            let _ = self.halt();
        }
    }
}

/// Start the loop of `node` on a new thread with the in-loop `app`.
pub(crate) fn spawn<D, A>(
    node: Node<D>,
    app: A,
    lcfg: LoopConfig,
    publisher: Option<Publisher>,
    endpoint: Option<crate::metrics::Endpoint>,
) -> Result<Runtime<A>, crate::Error>
where
    D: Device + Send + 'static,
    D::Buf: Send,
    A: App + Send + 'static,
{
    let Node { stack, port } = node;
    let stamps = port.dev.caps().rx_timestamps;
    // A device with a descriptor is waited on outside the core's lock, on
    // a duplicate of it, with an eventfd the fronts write. Both are opened
    // here, on the caller's thread, so a layer that records the stack's
    // descriptors around `spawn` (the preload's) sees them.
    let rx = port.dev.rx_fd().and_then(|fd| fd.try_clone_to_owned().ok());
    let wake = if rx.is_some() {
        Wake::eventfd()
    } else {
        Wake::default()
    };
    let core = Arc::new(Mutex::new(Core {
        port,
        app: Some(app),
        sched: Schedule::new(Clock::new(), &lcfg, stamps),
        sinks: Sinks {
            publisher,
            metrics: lcfg.metrics.clone(),
        },
        endpoint,
        wake: Vec::new(),
        notify: Vec::new(),
    }));
    let driver: Arc<Mutex<dyn Drive>> = core.clone();
    let shared = Arc::new(Shared {
        inner: Mutex::new(Inner {
            stack,
            clock: Clock::new(),
            waiters: HashMap::new(),
            watchers: HashMap::new(),
        }),
        stop: AtomicBool::new(false),
        gone: AtomicBool::new(false),
        failure: Mutex::new(None),
        loop_thread: Mutex::new(None),
        pause: AtomicBool::new(false),
        driver,
        drivers: AtomicUsize::new(0),
        driven_at: AtomicU64::new(0),
        device_fd: rx.as_ref().and_then(|fd| fd.try_clone().ok()),
        wake,
        waiter: AtomicU64::new(0),
        callers_drive: AtomicBool::new(false),
    });
    let net = Net {
        shared: shared.clone(),
    };
    let thread = std::thread::Builder::new()
        .name("ustack-loop".into())
        .spawn(move || run_thread(shared, core, lcfg, rx))
        .map_err(crate::Error::Thread)?;
    Ok(Runtime {
        net,
        thread: Some(thread),
        paused: None,
    })
}

/// A loop thread's body: the loop, then what its end means.
fn run_thread<D, A>(
    shared: Arc<Shared>,
    core: Arc<Mutex<Core<D, A>>>,
    lcfg: LoopConfig,
    rx: Option<OwnedFd>,
) -> Exit<A>
where
    D: Device + Send + 'static,
    D::Buf: Send,
    A: App + Send + 'static,
{
    *shared.loop_thread.lock() = Some(std::thread::current());
    let r = run_shared(&shared, &core, &lcfg, rx.as_ref().map(AsFd::as_fd));
    if let Ok(Outcome::Paused) = r {
        *shared.loop_thread.lock() = None;
        // The publisher's thread pauses too, and runs on wherever the loop
        // does (after `fork`, maybe in the child); so does the metrics
        // endpoint's (its socket is inherited, its threads are not).
        {
            let mut c = core.lock();
            if let Some(p) = c.sinks.publisher.as_mut() {
                p.pause();
            }
            if let Some(e) = c.endpoint.as_mut() {
                e.pause();
            }
        }
        return Exit::Paused(Box::new(move || {
            {
                let mut c = core.lock();
                if let Some(p) = c.sinks.publisher.as_mut() {
                    if let Err(e) = p.resume() {
                        tracing::warn!("telemetry stops: {e}");
                        c.sinks.publisher = None;
                    }
                }
                if let Some(e) = c.endpoint.as_mut() {
                    if let Err(e) = e.resume() {
                        tracing::warn!("metrics stop: {e}");
                        c.endpoint = None;
                    }
                }
            }
            run_thread(shared, core, lcfg, rx)
        }));
    }
    if let Err(e) = &r {
        *shared.failure.lock() = Some(e.to_string());
    }
    // Every waiter learns that the loop is gone.
    shared.gone.store(true, Ordering::Release);
    let (waiters, watchers) = {
        let mut inner = shared.inner.lock();
        let waiters = std::mem::take(&mut inner.waiters);
        (waiters, std::mem::take(&mut inner.watchers))
    };
    for w in waiters.into_values() {
        w.read.into_iter().chain(w.write).for_each(Waker::wake);
    }
    for w in watchers.into_values() {
        w(Readiness::ERROR | Readiness::CLOSED);
    }
    // Drivers check `gone` before they take the core: it is ours alone now.
    // The publisher goes now (its thread ends, its socket file is removed),
    // not when the last handle on the stack is dropped.
    let (app, publisher, endpoint) = {
        let mut c = core.lock();
        (c.app.take(), c.sinks.publisher.take(), c.endpoint.take())
    };
    drop(publisher);
    drop(endpoint);
    Exit::Done(r.and_then(|_| app.ok_or(crate::Error::Panicked)))
}

/// How long a stopping loop keeps running to let queued output leave.
const LINGER: Duration = Duration::from_secs(1);

/// What the loop needs between iterations, whichever thread runs one: the
/// port, the in-loop app, the schedule and where snapshots go.
struct Core<D: Device, A> {
    port: Port<D>,
    /// Taken back when the loop ends.
    app: Option<A>,
    sched: Schedule<Clock>,
    sinks: Sinks,
    /// The metrics endpoint (`--metrics`), paused and resumed with the loop.
    endpoint: Option<crate::metrics::Endpoint>,
    /// Wakers and watchers of this iteration's events, called outside the
    /// stack's lock (kept to reuse their allocations).
    wake: Vec<Waker>,
    notify: Vec<(Watcher, Readiness)>,
}

/// A spawned loop's snapshots: to the telemetry publisher and the metrics
/// feed, taken only when either is there.
struct Sinks {
    publisher: Option<Publisher>,
    /// Where snapshots go for the metrics endpoint.
    metrics: Option<crate::metrics::Feed>,
}

impl StatsSink for Sinks {
    fn wanted(&self) -> bool {
        self.publisher.is_some() || self.metrics.is_some()
    }
    fn publish(&mut self, s: &ustack::node::Snapshot) {
        if let Some(p) = &self.publisher {
            p.publish(s);
        }
        if let Some(f) = &self.metrics {
            f.publish(s);
        }
    }
}

/// The stack behind the lock the fronts share, for one iteration.
struct SharedLock<'s> {
    inner: &'s Mutex<Inner>,
    wake: &'s mut Vec<Waker>,
    notify: &'s mut Vec<(Watcher, Readiness)>,
}

/// [`SharedLock`] held: who waits on this iteration's events is noted
/// under the lock and woken after it.
struct SharedGuard<'a> {
    inner: MutexGuard<'a, Inner>,
    wake: &'a mut Vec<Waker>,
    notify: &'a mut Vec<(Watcher, Readiness)>,
}

impl StackLock for SharedLock<'_> {
    type Guard<'a>
        = SharedGuard<'a>
    where
        Self: 'a;
    fn lock(&mut self) -> SharedGuard<'_> {
        SharedGuard {
            inner: self.inner.lock(),
            wake: self.wake,
            notify: self.notify,
        }
    }
}

impl StackGuard for SharedGuard<'_> {
    fn stack(&mut self) -> &mut Stack {
        &mut self.inner.stack
    }

    fn events(&mut self, events: &[ustack::events::Event]) {
        for ev in events {
            if let Some(w) = self.inner.watchers.get(&ev.socket) {
                self.notify.push((w.clone(), ev.readiness));
            }
            let Some(w) = self.inner.waiters.get_mut(&ev.socket) else {
                continue;
            };
            let r = ev.readiness;
            if r.intersects(Readiness::READABLE | Readiness::CLOSED | Readiness::ERROR) {
                self.wake.extend(w.read.take());
            }
            if r.intersects(
                Readiness::WRITABLE | Readiness::CONNECTED | Readiness::CLOSED | Readiness::ERROR,
            ) {
                self.wake.extend(w.write.take());
            }
        }
    }

    fn release(self) {
        MutexGuard::unlock_fair(self.inner);
        self.wake.drain(..).for_each(Waker::wake);
        for (w, r) in self.notify.drain(..) {
            w(r);
        }
    }
}

impl std::fmt::Debug for dyn Drive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Drive")
    }
}

/// One iteration of a loop whose port and app types are erased: what a
/// socket user's thread runs while it waits (run to completion).
trait Drive: Send {
    /// Run one iteration; with `stopping`, also say whether output is
    /// still to leave.
    fn turn(&mut self, shared: &Shared, stopping: bool) -> Turn;
    /// Whether the device can be waited on now (its descriptor says when
    /// frames come; pcap's held-back frames are work of its own).
    fn waitable(&self) -> bool;
}

impl<D, A> Drive for Core<D, A>
where
    D: Device + Send,
    D::Buf: Send,
    A: App + Send,
{
    fn turn(&mut self, shared: &Shared, stopping: bool) -> Turn {
        let Some(app) = self.app.as_mut() else {
            return Turn {
                now: self.sched.clock.now(),
                busy: false,
                wake_at: None,
                done: true,
                pending: false,
                failure: None,
                stamped: false,
                awaits_nothing: false,
            };
        };
        let mut lock = SharedLock {
            inner: &shared.inner,
            wake: &mut self.wake,
            notify: &mut self.notify,
        };
        iterate(
            &mut self.port,
            app,
            &mut lock,
            &mut self.sched,
            &mut self.sinks,
            stopping,
        )
    }

    fn waitable(&self) -> bool {
        self.port.dev.rx_fd().is_some()
    }
}

impl<D: Device, A> Core<D, A> {
    /// A last snapshot to the publisher (the loop ends).
    fn publish_last(&mut self, shared: &Shared) {
        let mut lock = SharedLock {
            inner: &shared.inner,
            wake: &mut self.wake,
            notify: &mut self.notify,
        };
        crate::poll::publish_last(&self.port, &mut lock, &self.sched, &mut self.sinks);
    }
}

impl Net {
    /// Run one iteration of the stack's loop on this thread, unless another
    /// thread (the loop's own, or another caller) is running one: a caller
    /// about to wait can drive the stack itself instead of sleeping until
    /// the loop's thread wakes it (run to completion, as XLIO does), which
    /// saves a thread wake-up on each side of a round trip. Returns whether
    /// the iteration ran and had work (frames moved, timers fired).
    ///
    /// Never blocks; does nothing once the loop has stopped or while it is
    /// paused.
    pub fn drive(&self) -> bool {
        self.turn_here().unwrap_or(false)
    }

    /// [`drive`](Self::drive) for a caller that looks once without
    /// waiting (a non-blocking receive, `epoll_wait` with timeout 0): if
    /// another thread is in an iteration (the loop's thread handling the
    /// frame the caller waits for), try again until it ends, for at most
    /// `wait`, so the look sees what that iteration brought. Spins, never
    /// blocks on the lock (a signal handler may interrupt the thread in
    /// the iteration).
    pub fn drive_settled(&self, wait: Duration) -> bool {
        let t0 = std::time::Instant::now();
        loop {
            match self.iterate_here() {
                Here::Ran(t, _) => return t.busy,
                Here::Closed => return false,
                Here::Busy if t0.elapsed() >= wait => return false,
                Here::Busy => std::thread::yield_now(),
            }
        }
    }

    /// Run to completion in every socket call: a call that gives the
    /// stack work (data to send, a window to open, a connection to open
    /// or close) does not wake the loop's thread. If a caller drove the
    /// stack in the last 200 µs and no thread sleeps on the device, that
    /// caller sends the work at its next turn; otherwise this caller runs
    /// the iteration itself, as [`drive`](Self::drive) does (which keeps
    /// the loop's thread away for the next 200 µs), unless another thread
    /// is in one. On a CPU shared by the program and the loop's thread
    /// that saves a context switch per call, at the cost of at most an
    /// iteration per 200 µs of a busy caller. Off by default; the
    /// LD_PRELOAD layer turns it on with its spin time.
    pub fn set_callers_drive(&self, on: bool) {
        self.shared.callers_drive.store(on, Ordering::Relaxed);
    }

    /// One iteration on this thread if no other thread runs one: whether
    /// it had work, or `None` when it did not run.
    fn turn_here(&self) -> Option<bool> {
        match self.iterate_here() {
            Here::Ran(t, _) => Some(t.busy),
            Here::Busy | Here::Closed => None,
        }
    }

    /// One iteration on this thread, for a caller that drives or waits on
    /// the device: its turn and whether the device can be waited on now.
    fn iterate_here(&self) -> Here {
        let s = &self.shared;
        // Counted in before looking at `pause`; `Runtime::pause` sets
        // `pause` before it waits for the count to fall to zero, so after
        // the pause no caller holds or takes the core (SeqCst both sides).
        s.drivers.fetch_add(1, Ordering::SeqCst);
        let here = if s.pause.load(Ordering::SeqCst) || s.gone.load(Ordering::Acquire) {
            Here::Closed
        } else {
            match s.driver.try_lock() {
                None => Here::Busy,
                // Checked again under the core's lock: the loop's thread
                // ends holding it.
                Some(_) if s.gone.load(Ordering::Acquire) => Here::Closed,
                Some(mut core) => {
                    s.driven_at.store(since_start().max(1), Ordering::Relaxed);
                    s.wake.begin_turn();
                    let t = core.turn(s, false);
                    Here::Ran(t, core.waitable())
                }
            }
        };
        s.drivers.fetch_sub(1, Ordering::SeqCst);
        here
    }

    /// A caller that drove the stack ([`drive`](Self::drive)) is about to
    /// wait elsewhere (in the kernel): the loop's thread, which stays out
    /// of a driving caller's way with long sleeps, takes over now.
    pub fn stop_driving(&self) {
        let s = &self.shared;
        if s.waiter.load(Ordering::SeqCst) != 0 || s.driven_at.swap(0, Ordering::Relaxed) == 0 {
            return;
        }
        if let Some(t) = s.loop_thread.lock().as_ref() {
            t.unpark();
        }
    }
}

impl Net {
    /// Become the thread that waits on the device while it blocks (run to
    /// completion when a caller sleeps): a caller about to wait in the
    /// kernel polls its own descriptors together with
    /// [`DeviceWaiter::fds`] and runs the iterations itself
    /// ([`DeviceWaiter::turn`]) when frames come or a timer is due, so a
    /// single-threaded server wakes once per burst of frames, on its own
    /// thread, instead of the loop's thread waking first and waking it
    /// (two context switches a request on a shared CPU). The loop's thread
    /// stays out of the way meanwhile and for a moment after (see
    /// [`DRIVEN_SLEEP`](crate::poll::DRIVEN_SLEEP)).
    ///
    /// `None` when the device has no descriptor, another thread already
    /// waits on it, or the loop pauses or has ended: the caller waits as
    /// before (after [`stop_driving`](Self::stop_driving)). A thread
    /// that waits already (a signal handler's call during its wait) waits
    /// again, the outer wait suspended meanwhile.
    pub fn device_waiter(&self) -> Option<DeviceWaiter<'_>> {
        let s = &self.shared;
        let fd = s.device_fd.as_ref()?;
        let wake = s.wake.fd.as_ref()?;
        if s.pause.load(Ordering::SeqCst) || s.gone.load(Ordering::Acquire) {
            return None;
        }
        let me = thread_tag();
        let nested = match s
            .waiter
            .compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => false,
            // This thread waits already, and a signal handler that runs
            // during its wait waits again: the outer wait is suspended,
            // so the inner one is the waiter until it returns.
            Err(w) if w == me => true,
            Err(_) => return None,
        };
        Some(DeviceWaiter {
            net: self,
            fds: [fd.as_fd(), wake.as_fd()],
            asleep: false,
            nested,
        })
    }
}

/// The waiting caller's hold on the device ([`Net::device_waiter`]);
/// dropping it hands the device back to the loop's thread (which looks
/// again within [`DRIVEN_SLEEP`](crate::poll::DRIVEN_SLEEP), or at once
/// when a front wakes it).
#[derive(Debug)]
pub struct DeviceWaiter<'a> {
    net: &'a Net,
    fds: [BorrowedFd<'a>; 2],
    asleep: bool,
    /// Taken inside a wait of the same thread (a signal handler's call):
    /// the outer wait keeps the role.
    nested: bool,
}

impl DeviceWaiter<'_> {
    /// What to poll (for reading) beside the caller's own descriptors:
    /// the device's, and the wake-up a front writes when it gives the
    /// stack work from another thread.
    pub fn fds(&self) -> [BorrowedFd<'_>; 2] {
        self.fds
    }

    /// Run one iteration on this thread. Returns how long the caller may
    /// sleep in its poll before the next (zero: at once: frames moved, the
    /// device holds frames of its own, or the loop's thread is in an
    /// iteration), or `None` when the caller must stop waiting here: the
    /// loop pauses or ended, or the device failed (the caller then waits
    /// as before; the loop's thread takes the device back).
    pub fn turn(&mut self) -> Option<Duration> {
        match self.net.iterate_here() {
            Here::Busy => Some(Duration::ZERO),
            Here::Closed => None,
            Here::Ran(t, _) if t.failure.is_some() || t.done => None,
            Here::Ran(t, waitable) if t.busy || !waitable => Some(Duration::ZERO),
            Here::Ran(t, _) => {
                let until = t.wake_at.unwrap_or(t.now + crate::poll::MAX_DEVICE_WAIT);
                Some(
                    until
                        .saturating_duration_since(t.now)
                        .min(crate::poll::MAX_DEVICE_WAIT),
                )
            }
        }
    }

    /// About to sleep in the poll: from now on a front that gives the
    /// stack work writes the wake-up. `false` if work came since the last
    /// [`turn`](Self::turn): do not sleep (poll with no timeout).
    pub fn sleep(&mut self) -> bool {
        if !self.net.shared.wake.enter_sleep() {
            return false;
        }
        self.asleep = true;
        true
    }

    /// Back from the poll ([`sleep`](Self::sleep) said yes): `woken`
    /// when the wake-up's descriptor was readable (it is emptied).
    pub fn woke(&mut self, woken: bool) {
        let w = &self.net.shared.wake;
        if std::mem::take(&mut self.asleep) {
            w.leave_sleep();
        }
        if woken {
            w.take_wakeup();
        }
    }
}

impl Drop for DeviceWaiter<'_> {
    fn drop(&mut self) {
        let s = &self.net.shared;
        if self.asleep {
            s.wake.leave_sleep();
        }
        if self.nested {
            return;
        }
        // The caller goes back to the program, which likely makes its
        // next socket call soon: the loop's thread is not woken for it.
        s.driven_at.store(since_start().max(1), Ordering::Relaxed);
        s.waiter.store(0, Ordering::SeqCst);
    }
}

/// The spawned front of the one [`EventLoop`]: an iteration runs under
/// the core's lock (unless a caller is running one: then this thread
/// backs off), the wakers of its events outside the stack's lock. Asked
/// to stop, it runs on while output is queued or unacknowledged, for at
/// most [`LINGER`]. Idle, on a device with a descriptor it polls a
/// duplicate of it and the fronts' eventfd ([`Wake`]) up to its next
/// timer, holding neither the core's lock nor the stack's (callers drive
/// the stack meanwhile); on one without, it sleeps in the back-off, and a
/// socket call that gives it work unparks it.
struct Spawned<'s, D: Device, A> {
    shared: &'s Shared,
    core: &'s Mutex<Core<D, A>>,
    /// The device's descriptor (a duplicate taken at spawn).
    rx: Option<BorrowedFd<'s>>,
    /// At the last iteration the device could be waited on
    /// ([`Device::rx_fd`] was there: no work of its own).
    rx_waitable: bool,
}

impl<D, A> Driven for Spawned<'_, D, A>
where
    D: Device + Send,
    D::Buf: Send,
    A: App + Send,
{
    fn turn(&mut self, stopping: bool) -> Option<Turn> {
        let pause = self.shared.pause.load(Ordering::Acquire);
        let mut c = match self.core.try_lock() {
            // A caller drove it a moment ago, or waits on the device and
            // drives it when frames come: stay out of its way.
            Some(_)
                if !stopping
                    && !pause
                    && (self.shared.driving()
                        || self.shared.waiter.load(Ordering::SeqCst) != 0) =>
            {
                return None;
            }
            Some(c) => c,
            // A caller drives the stack now: it runs the iterations.
            None if !stopping && !pause => return None,
            None => self.core.lock(),
        };
        self.shared.wake.begin_turn();
        let turn = c.turn(self.shared, stopping);
        self.rx_waitable = c.port.dev.rx_fd().is_some();
        Some(turn)
    }

    fn stop_asked(&mut self) -> bool {
        self.shared.stop.load(Ordering::Acquire)
    }

    fn pause_asked(&self) -> bool {
        self.shared.pause.load(Ordering::Acquire)
    }

    fn linger(&self) -> Option<Duration> {
        Some(LINGER)
    }

    fn publish_last(&mut self) {
        self.core.lock().publish_last(self.shared);
    }

    fn wait_rx(&mut self, timeout: Duration) -> bool {
        let Some(rx) = self.rx else {
            // No descriptor (sim, DPDK): the back-off, which fronts unpark.
            return false;
        };
        if !self.rx_waitable {
            // The device has work of its own (pcap's held-back frames).
            return true;
        }
        self.shared.wake.wait(rx, timeout, &self.shared.waiter)
    }

    fn max_device_wait(&self) -> Duration {
        // Work, stop and pause requests write the eventfd.
        Duration::MAX
    }
}

/// Run the loop of a spawned runtime on this thread.
fn run_shared<D, A>(
    shared: &Shared,
    core: &Mutex<Core<D, A>>,
    cfg: &LoopConfig,
    rx: Option<BorrowedFd<'_>>,
) -> Result<Outcome, crate::Error>
where
    D: Device + Send,
    D::Buf: Send,
    A: App + Send,
{
    let mut front = Spawned {
        shared,
        core,
        rx,
        rx_waitable: false,
    };
    Ok(EventLoop::new(cfg).run(&mut front)?)
}
