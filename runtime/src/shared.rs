//! A stack shared between its poll-loop thread and the threads and tasks
//! that use its sockets: [`Net`], the handle the async and blocking fronts
//! hold, and the loop [`Runtime`] runs.
//!
//! The stack sits behind one lock. The loop takes it for an iteration and
//! hands it over fairly between iterations; a socket call takes it for the
//! call. A call that would block registers its task's waker under the lock,
//! and the loop wakes it when the readiness event arrives ([`ustack::events`]),
//! so no wake-up is lost between the check and the wait. Calls that give
//! the loop work (data to send, a connection to open) unpark it when it
//! sleeps in its idle back-off.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Waker};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use ustack::device::Device;
use ustack::events::{Readiness, SocketRef};
use ustack::node::{App, Node, Port};
use ustack::time::earliest;
use ustack::{Error as StackError, Stack};

use crate::clock::Clock;
use crate::poll::{IdleMode, LoopConfig};
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

    /// Whether the loop still runs.
    pub fn is_running(&self) -> bool {
        !self.shared.gone.load(Ordering::Acquire)
    }
}

/// An engine error as the `std::io` error a socket user expects.
pub fn io_error(e: StackError) -> io::Error {
    use ustack::tcp::ConnError;
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
        self.net.kick();
        match self.thread.take() {
            Some(t) => match t.join().map_err(|_| crate::Error::Panicked)? {
                Exit::Done(r) => r,
                Exit::Paused(_) => Err(crate::Error::Config("the loop paused instead".into())),
            },
            None => Err(crate::Error::Config(
                "the runtime was already stopped".into(),
            )),
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
        self.net.shared.pause.store(true, Ordering::Release);
        self.net.kick();
        let exit = t.join().map_err(|_| crate::Error::Panicked);
        self.net.shared.pause.store(false, Ordering::Release);
        match exit? {
            Exit::Paused(rest) => {
                self.paused = Some(rest);
                Ok(())
            }
            Exit::Done(r) => r.map(|_| ()).and(Err(crate::Error::Config(
                "the loop ended before it paused".into(),
            ))),
        }
    }

    /// Run a paused loop on, on a new thread (in this process: after `fork`,
    /// the parent's or the child's).
    pub fn resume(&mut self) -> Result<(), crate::Error> {
        let Some(rest) = self.paused.take() else {
            return Ok(());
        };
        let thread = std::thread::Builder::new()
            .name("ustack-loop".into())
            .spawn(rest)
            .map_err(crate::Error::Thread)?;
        self.thread = Some(thread);
        Ok(())
    }

    /// Give a paused loop up without touching its device (after `fork`,
    /// in the process that handed the stack to the other): socket calls
    /// fail from now on, and nothing is closed or freed here, since the
    /// device's state is the other process's to use.
    pub fn forsake(&mut self) {
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
) -> Result<Runtime<A>, crate::Error>
where
    D: Device + Send + 'static,
    D::Buf: Send,
    A: App + Send + 'static,
{
    let Node { stack, port } = node;
    let shared = Arc::new(Shared {
        inner: Mutex::new(Inner {
            stack,
            waiters: HashMap::new(),
            watchers: HashMap::new(),
        }),
        stop: AtomicBool::new(false),
        gone: AtomicBool::new(false),
        failure: Mutex::new(None),
        loop_thread: Mutex::new(None),
        pause: AtomicBool::new(false),
    });
    let net = Net {
        shared: shared.clone(),
    };
    let thread = std::thread::Builder::new()
        .name("ustack-loop".into())
        .spawn(move || run_thread(shared, port, app, lcfg, publisher))
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
    mut port: Port<D>,
    mut app: A,
    lcfg: LoopConfig,
    mut publisher: Option<Publisher>,
) -> Exit<A>
where
    D: Device + Send + 'static,
    D::Buf: Send,
    A: App + Send + 'static,
{
    *shared.loop_thread.lock() = Some(std::thread::current());
    let r = run_shared(&shared, &mut port, &mut app, &lcfg, publisher.as_ref());
    if let Ok(Outcome::Paused) = r {
        *shared.loop_thread.lock() = None;
        // The publisher's thread pauses too, and runs on wherever the loop
        // does (after `fork`, maybe in the child).
        if let Some(p) = publisher.as_mut() {
            p.pause();
        }
        return Exit::Paused(Box::new(move || {
            if let Some(p) = publisher.as_mut() {
                if let Err(e) = p.resume() {
                    tracing::warn!("telemetry stops: {e}");
                    publisher = None;
                }
            }
            run_thread(shared, port, app, lcfg, publisher)
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
    Exit::Done(r.map(|_| app))
}

/// Why `run_shared` returned without an error.
enum Outcome {
    Stopped,
    Paused,
}

/// How long a stopping loop keeps running to let queued output leave.
const LINGER: Duration = Duration::from_secs(1);

/// The loop: one iteration under the lock, then the wakers of this
/// iteration's events outside it, then the idle back-off. Asked to stop, it
/// runs on while output is queued or unacknowledged, for at most
/// [`LINGER`].
fn run_shared<D: Device, A: App>(
    shared: &Shared,
    port: &mut Port<D>,
    app: &mut A,
    cfg: &LoopConfig,
    publisher: Option<&Publisher>,
) -> Result<Outcome, crate::Error> {
    if let Some(core) = cfg.core {
        crate::poll::pin_to_core(core)?;
    }
    let clock = Clock::new();
    let start = clock.now();
    let end = cfg.duration.map(|d| start + d);
    let mut next_stats = start + cfg.stats_interval;
    let mut backoff = Duration::from_micros(1);
    let mut wake = Vec::new();
    let mut notify: Vec<(Watcher, Readiness)> = Vec::new();
    // Once asked to stop: until when the loop still lets queued output leave.
    let mut draining: Option<ustack::Instant> = None;
    loop {
        let now = clock.now();
        let mut inner = shared.inner.lock();
        let report = port.step(&mut inner.stack, now, app);
        for ev in port.events() {
            if let Some(w) = inner.watchers.get(&ev.socket) {
                notify.push((w.clone(), ev.readiness));
            }
            let Some(w) = inner.waiters.get_mut(&ev.socket) else {
                continue;
            };
            let r = ev.readiness;
            if r.intersects(Readiness::READABLE | Readiness::CLOSED | Readiness::ERROR) {
                wake.extend(w.read.take());
            }
            if r.intersects(
                Readiness::WRITABLE | Readiness::CONNECTED | Readiness::CLOSED | Readiness::ERROR,
            ) {
                wake.extend(w.write.take());
            }
        }
        let stats_due = now >= next_stats;
        let snapshot = (stats_due && publisher.is_some()).then(|| port.snapshot(&inner.stack, now));
        if stats_due {
            next_stats = now + cfg.stats_interval;
        }
        let poll_at = port.poll_at(&inner.stack, app);
        let stopping =
            report.exit || end.is_some_and(|e| now >= e) || shared.stop.load(Ordering::Acquire);
        // Stopping: output still to leave (immediate work, or bytes not yet
        // acknowledged)? Only looked at then: it visits every connection.
        let pending = stopping
            && (report.busy()
                || poll_at.is_some_and(|t| t <= now)
                || inner.stack.tcp_connections().any(|c| c.send_queued > 0));
        MutexGuard::unlock_fair(inner);
        wake.drain(..).for_each(Waker::wake);
        for (w, r) in notify.drain(..) {
            w(r);
        }
        if let (Some(s), Some(p)) = (snapshot, publisher) {
            p.publish(&s);
        }
        if stopping {
            // Let what the app queued leave (a last write, a FIN, a
            // datagram), for at most LINGER, as a kernel socket would.
            let until = *draining.get_or_insert(now + LINGER);
            if !pending || now >= until {
                // A last snapshot, so a monitor sees the end state.
                if let Some(p) = publisher {
                    let inner = shared.inner.lock();
                    p.publish(&port.snapshot(&inner.stack, clock.now()));
                }
                return Ok(Outcome::Stopped);
            }
        }
        if shared.pause.load(Ordering::Acquire) {
            return Ok(Outcome::Paused);
        }
        if let Some(why) = port.dev.failure() {
            return Err(crate::RunError::Device(why).into());
        }
        let IdleMode::Backoff { max_sleep } = cfg.idle else {
            continue;
        };
        if report.busy() {
            backoff = Duration::from_micros(1);
            continue;
        }
        let until = [poll_at, Some(next_stats), end]
            .into_iter()
            .fold(None, earliest)
            .unwrap_or(now + max_sleep);
        let sleep = backoff.min(until.saturating_duration_since(now));
        if !sleep.is_zero() {
            // A socket call that gives the loop work unparks it.
            std::thread::park_timeout(sleep);
        }
        backoff = (backoff * 2).min(max_sleep);
    }
}
