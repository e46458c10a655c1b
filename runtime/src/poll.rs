//! The poll loop: [`Node::step`] against the wall clock, run to completion
//! on one (optionally pinned) core, with an idle back-off for shared
//! machines and pure busy-poll for dedicated cores.
//!
//! There is one loop, `EventLoop`, built the same way by every front:
//! the in-loop app ([`run`], and each core of a sharded run) and the
//! spawned runtime the blocking and async fronts share. It is generic over
//! the clock ([`LoopClock`]) and over how the stack is reached
//! (`StackLock`: owned by the loop, or behind the lock the fronts'
//! threads share); `iterate` is the one iteration every front runs. When
//! idle, every front sleeps on the device where it can wake the loop
//! ([`Device::wait_rx`]: pcap's descriptor; the spawned loop polls the
//! device's [`Device::rx_fd`] with an eventfd its fronts write, outside
//! every lock), else in the back-off.

use std::time::Duration;

use ustack::Stack;
use ustack::events::Event;
use ustack::node::{App, Node, Port, RxWait, Snapshot};
use ustack::phy::device::Device;
use ustack::sim::SimNet;
use ustack::time::{Instant, earliest};

use crate::clock::Clock;

/// How the loop waits when an iteration did nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleMode {
    /// Never sleep (dedicated core on bare metal).
    BusyPoll,
    /// Sleep with an exponential back-off up to `max_sleep`, never past the
    /// next timer (laptops, shared machines). A port that wakes the loop
    /// when frames come (pcap, net_tap) is waited on instead; on one that
    /// cannot (memif), after [`DEEP_IDLE_AFTER`] with nothing to do the
    /// back-off goes on doubling up to [`DEEP_IDLE_SLEEP`].
    Backoff {
        /// Longest single sleep while recently busy (the back-off doubles
        /// from 1 µs up to it).
        max_sleep: Duration,
    },
}

/// How long a loop without a port wake-up stays idle before its back-off
/// may grow past `max_sleep`, to [`DEEP_IDLE_SLEEP`].
pub const DEEP_IDLE_AFTER: Duration = Duration::from_secs(1);

/// The longest sleep of a loop idle for [`DEEP_IDLE_AFTER`]: each wake-up
/// of a sleeping thread costs the machine a context switch (about 15 µs
/// of CPU on the VMs measured in BENCHMARKS.md), so an idle DPDK port
/// without receive interrupts polls 250 times a second, not 1,000. The
/// first frame after a silence may wait this long; `--core` busy-polls.
pub const DEEP_IDLE_SLEEP: Duration = Duration::from_millis(4);

/// The idle back-off's state: the next sleep, and since when nothing
/// happened.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    step: Duration,
    idle_since: Option<ustack::time::Instant>,
}

impl Backoff {
    pub(crate) const fn new() -> Self {
        Backoff {
            step: Duration::from_micros(1),
            idle_since: None,
        }
    }

    /// Something happened: the next sleep is short again.
    pub(crate) fn reset(&mut self) {
        *self = Backoff::new();
    }

    /// Make the next step the longest (`max_sleep`) at once.
    pub(crate) fn longest(&mut self, max_sleep: Duration) {
        self.step = self.step.max(max_sleep);
    }

    /// The next pause of a loop giving way to a caller that drives the
    /// stack: the back-off doubled, at most `cap`.
    pub(crate) fn yield_step(&mut self, cap: Duration) -> Duration {
        self.step = (self.step * 2).min(cap);
        self.step
    }

    /// The sleep to take now, at most `until`, and the back-off doubled
    /// for the next.
    pub(crate) fn next(
        &mut self,
        now: ustack::time::Instant,
        max_sleep: Duration,
        until: Duration,
    ) -> Duration {
        let since = *self.idle_since.get_or_insert(now);
        let cap = if now.saturating_duration_since(since) >= DEEP_IDLE_AFTER {
            max_sleep.max(DEEP_IDLE_SLEEP)
        } else {
            max_sleep
        };
        let sleep = self.step.min(until);
        self.step = (self.step * 2).min(cap);
        sleep
    }
}

/// Poll-loop settings.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// What an idle iteration does: busy-poll or back off.
    pub idle: IdleMode,
    /// CPU to pin the loop's thread to.
    pub core: Option<usize>,
    /// How often to hand a [`Snapshot`] to the stats callback.
    pub stats_interval: Duration,
    /// Stop after this long (engine time from the start).
    pub duration: Option<Duration>,
    /// Also hand every snapshot to this feed (the metrics endpoint's;
    /// see [`crate::metrics::Feed`]), whatever `on_stats` does with it.
    pub metrics: Option<crate::metrics::Feed>,
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            idle: IdleMode::Backoff {
                max_sleep: Duration::from_millis(1),
            },
            core: None,
            stats_interval: Duration::from_millis(250),
            duration: None,
            metrics: None,
        }
    }
}

/// Why the loop could not start, or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The thread could not be pinned to this CPU.
    #[error("cannot pin to core {0}: no such core or not permitted")]
    Pin(usize),
    /// The device stopped working ([`Device::failure`]'s reason).
    #[error("{0}")]
    Device(String),
}

/// Pin the calling thread to `core`.
pub fn pin_to_core(core: usize) -> Result<(), RunError> {
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    let id = ids
        .into_iter()
        .find(|c| c.id == core)
        .ok_or(RunError::Pin(core))?;
    if core_affinity::set_for_current(id) {
        Ok(())
    } else {
        Err(RunError::Pin(core))
    }
}

/// Where the loop reads the time, once per iteration: the wall [`Clock`],
/// or a test's.
pub trait LoopClock {
    /// Engine time now.
    fn now(&self) -> Instant;
}

impl LoopClock for Clock {
    fn now(&self) -> Instant {
        Clock::now(self)
    }
}

/// How an iteration reaches the stack: the loop owns it (`&mut Stack`), or
/// it sits behind the lock the fronts' threads share (the spawned
/// runtime's, which also wakes whoever waits on this iteration's events).
pub(crate) trait StackLock {
    /// The stack, held for one iteration.
    type Guard<'a>: StackGuard
    where
        Self: 'a;
    /// Take the stack for an iteration.
    fn lock(&mut self) -> Self::Guard<'_>;
}

/// The stack held for one iteration (see [`StackLock`]).
pub(crate) trait StackGuard {
    /// The stack.
    fn stack(&mut self) -> &mut Stack;
    /// This iteration's readiness events: note whom to wake (still under
    /// the lock, so no wake-up is lost).
    fn events(&mut self, events: &[Event]) {
        let _ = events;
    }
    /// Let the stack go (fairly, where others wait for it), then wake
    /// whom the events named.
    fn release(self);
}

impl StackLock for &mut Stack {
    type Guard<'a>
        = &'a mut Stack
    where
        Self: 'a;
    fn lock(&mut self) -> &mut Stack {
        self
    }
}

impl StackGuard for &mut Stack {
    fn stack(&mut self) -> &mut Stack {
        self
    }
    fn release(self) {}
}

/// Where a loop's snapshots go.
pub(crate) trait StatsSink {
    /// Whether a snapshot is wanted at all (taking one visits every
    /// counter).
    fn wanted(&self) -> bool;
    /// Hand a snapshot on.
    fn publish(&mut self, s: &Snapshot);
}

/// A callback that wants every snapshot.
pub(crate) struct OnStats<F>(pub F);

impl<F: FnMut(&Snapshot)> StatsSink for OnStats<F> {
    fn wanted(&self) -> bool {
        true
    }
    fn publish(&mut self, s: &Snapshot) {
        (self.0)(s);
    }
}

/// A loop's schedule: its clock, when snapshots are due, when its
/// configured duration ends.
#[derive(Debug)]
pub(crate) struct Schedule<C> {
    pub clock: C,
    /// When the loop's configured duration ends.
    pub end: Option<Instant>,
    next_stats: Instant,
    stats_interval: Duration,
    /// The port stamps received frames (see [`RxWait::Stamped`]).
    stamps: bool,
    /// The address conflict notice was given.
    told_conflict: bool,
}

impl<C: LoopClock> Schedule<C> {
    /// A schedule from now for a loop on a port with these `caps`.
    pub fn new(clock: C, cfg: &LoopConfig, stamps: bool) -> Self {
        let start = clock.now();
        Schedule {
            end: cfg.duration.map(|d| start + d),
            next_stats: start + cfg.stats_interval,
            stats_interval: cfg.stats_interval,
            stamps,
            told_conflict: false,
            clock,
        }
    }
}

/// What one iteration found.
#[derive(Debug, Clone)]
pub(crate) struct Turn {
    pub now: Instant,
    /// It moved frames or had work.
    pub busy: bool,
    /// When the loop must run again even if nothing arrives: the stack's
    /// and the app's timers, the next snapshot, the end of the duration.
    pub wake_at: Option<Instant>,
    /// The app asked to exit, or the duration ended.
    pub done: bool,
    /// Output is still to leave (only looked at when stopping).
    pub pending: bool,
    /// The device stopped working (its reason).
    pub failure: Option<String>,
    /// The app awaits only replies the port stamps, and it stamps them.
    pub stamped: bool,
    /// The app awaits nothing from the port.
    pub awaits_nothing: bool,
}

/// One iteration, the same for every front: take the stack, step the port
/// with the app, note whom the events wake, take a snapshot when one is
/// due, let the stack go, publish.
pub(crate) fn iterate<D, A, L, C, S>(
    port: &mut Port<D>,
    app: &mut A,
    lock: &mut L,
    sched: &mut Schedule<C>,
    sink: &mut S,
    stopping: bool,
) -> Turn
where
    D: Device,
    A: App + ?Sized,
    L: StackLock,
    C: LoopClock,
    S: StatsSink,
{
    let mut g = lock.lock();
    // The clock is read once the stack is ours: read before the lock,
    // `now` would be late by however long a socket call held it, and
    // every timer armed in this iteration (TCP's RTO, an RC QP's ACK
    // timer) would fire that much early.
    let now = sched.clock.now();
    let report = port.step(g.stack(), now, app);
    g.events(port.events());
    let stats_due = now >= sched.next_stats;
    if stats_due {
        crate::notice::tell_conflict(g.stack(), &mut sched.told_conflict);
        sched.next_stats = now + sched.stats_interval;
    }
    let snapshot = (stats_due && sink.wanted()).then(|| port.snapshot(g.stack(), now));
    let poll_at = port.poll_at(g.stack(), app);
    let done = report.exit || sched.end.is_some_and(|e| now >= e);
    // Stopping: output still to leave (immediate work, or bytes not yet
    // acknowledged)? Only looked at then: it visits every connection.
    let pending = (stopping || done)
        && (report.busy()
            || poll_at.is_some_and(|t| t <= now)
            || g.stack().tcp_ref().connections().any(|c| c.send_queued > 0));
    g.release();
    if let Some(s) = snapshot {
        sink.publish(&s);
    }
    let wait = app.rx_wait();
    Turn {
        now,
        busy: report.busy(),
        wake_at: [poll_at, Some(sched.next_stats), sched.end]
            .into_iter()
            .fold(None, earliest),
        done,
        pending,
        failure: port.dev.failure(),
        stamped: sched.stamps && wait == RxWait::Stamped,
        awaits_nothing: wait == RxWait::Nothing,
    }
}

/// A last snapshot to `sink` (the loop ends), so a monitor sees the end
/// state.
pub(crate) fn publish_last<D, L, C, S>(
    port: &Port<D>,
    lock: &mut L,
    sched: &Schedule<C>,
    sink: &mut S,
) where
    D: Device,
    L: StackLock,
    C: LoopClock,
    S: StatsSink,
{
    if !sink.wanted() {
        return;
    }
    let mut g = lock.lock();
    let s = port.snapshot(g.stack(), sched.clock.now());
    g.release();
    sink.publish(&s);
}

/// What differs between the fronts, for the one [`EventLoop`].
pub(crate) trait Driven {
    /// Run one iteration (`stopping`: also say whether output is still to
    /// leave), or `None` when another thread runs them now (a caller
    /// driving the stack: the loop yields).
    fn turn(&mut self, stopping: bool) -> Option<Turn>;
    /// Whether the loop was asked to stop.
    fn stop_asked(&mut self) -> bool;
    /// Whether the loop was asked to pause (see `Runtime::pause`).
    fn pause_asked(&self) -> bool {
        false
    }
    /// How long a stopping loop runs on while output is still to leave.
    fn linger(&self) -> Option<Duration> {
        None
    }
    /// A last snapshot (the loop ends).
    fn publish_last(&mut self);
    /// Wait on the device for frames ([`Device::wait_rx`]) for at most
    /// `timeout`, holding no lock others need: whether it could (a wake-up
    /// may be spurious); `false`, at once, where it cannot, and the loop
    /// sleeps in its back-off instead.
    fn wait_rx(&mut self, timeout: Duration) -> bool;
    /// The longest wait on the device: how soon an idle loop sees a stop
    /// request it is not woken for ([`MAX_DEVICE_WAIT`]). A loop that
    /// others wake when they give it work or stop it (the spawned one)
    /// waits up to its next timer.
    fn max_device_wait(&self) -> Duration {
        MAX_DEVICE_WAIT
    }
}

/// Why [`EventLoop::run`] returned without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Stopped,
    Paused,
}

/// The one poll loop every front runs: iterations until asked to stop,
/// and between them busy-poll or the idle wait (on the device where it
/// can wake the loop, else the back-off).
#[derive(Debug)]
pub(crate) struct EventLoop {
    idle: IdleMode,
    core: Option<usize>,
    backoff: Backoff,
    /// Once asked to stop: until when queued output may still leave.
    draining: Option<Instant>,
}

impl EventLoop {
    /// A loop with `cfg`'s idle mode and core.
    pub fn new(cfg: &LoopConfig) -> Self {
        EventLoop {
            idle: cfg.idle,
            core: cfg.core,
            backoff: Backoff::new(),
            draining: None,
        }
    }

    /// Run until stopped, paused, or the device fails.
    pub fn run(&mut self, d: &mut impl Driven) -> Result<Outcome, RunError> {
        if let Some(core) = self.core.take() {
            pin_to_core(core)?;
        }
        loop {
            let stop = d.stop_asked();
            let Some(turn) = d.turn(stop) else {
                // A caller drives the stack: stay out of its way (on a
                // shared CPU each wake-up here preempts it: at 100 µs one
                // round trip in fifteen of a 6 µs ping-pong paid a context
                // switch, sockperf's p99 of 37 µs). A caller that stops
                // driving to wait in the kernel wakes this thread
                // (`Net::stop_driving`); the sleep only bounds how long a
                // caller that just went away leaves the stack alone.
                std::thread::park_timeout(self.backoff.yield_step(DRIVEN_SLEEP));
                continue;
            };
            if stop || turn.done {
                // Let what the app queued leave (a last write, a FIN, a
                // datagram), for at most the linger, as a kernel socket
                // would.
                let linger = d.linger().unwrap_or_default();
                let until = *self.draining.get_or_insert(turn.now + linger);
                if !turn.pending || turn.now >= until {
                    d.publish_last();
                    return Ok(Outcome::Stopped);
                }
            }
            if d.pause_asked() {
                return Ok(Outcome::Paused);
            }
            if let Some(why) = turn.failure {
                d.publish_last();
                return Err(RunError::Device(why));
            }
            let IdleMode::Backoff { max_sleep } = self.idle else {
                continue;
            };
            if turn.busy {
                self.backoff.reset();
                continue;
            }
            let until = turn
                .wake_at
                .unwrap_or(turn.now + max_sleep)
                .saturating_duration_since(turn.now);
            if !until.is_zero() {
                self.idle_wait(d, &turn, max_sleep, until);
            }
        }
    }

    /// An idle loop waits: up to `until` (the next timer).
    fn idle_wait(
        &mut self,
        d: &mut impl Driven,
        turn: &Turn,
        max_sleep: Duration,
        until: Duration,
    ) {
        if turn.stamped {
            // Replies wait in the port with their arrival stamped: one
            // wake-up per timer (a ping's next send), not one per frame.
            std::thread::park_timeout(until.min(MAX_RX_WAIT));
            return;
        }
        // A device that wakes us when frames come (pcap) is waited on up
        // to the next timer: an idle or lightly loaded loop wakes once per
        // packet or timer instead of every back-off step. (The spawned
        // loop waits on the device and on the fronts' wake-up together.)
        if d.wait_rx(until.min(d.max_device_wait())) {
            return;
        }
        if turn.awaits_nothing {
            // Awaiting nothing, on a port that cannot wake us: poll it at
            // the back-off's longest step, not from 1 µs up.
            self.backoff.longest(max_sleep);
        }
        // Others (the spawned loop's fronts) unpark us when they give us
        // work.
        let sleep = self.backoff.next(turn.now, max_sleep, until);
        std::thread::park_timeout(sleep);
    }
}

/// The in-loop front: the loop owns the node and calls the app.
struct InLoop<'a, D: Device, A: ?Sized, C, S, F> {
    port: &'a mut Port<D>,
    stack: &'a mut Stack,
    app: &'a mut A,
    sched: Schedule<C>,
    sink: S,
    stop: F,
}

impl<D, A, C, S, F> Driven for InLoop<'_, D, A, C, S, F>
where
    D: Device,
    A: App + ?Sized,
    C: LoopClock,
    S: StatsSink,
    F: FnMut() -> bool,
{
    fn turn(&mut self, stopping: bool) -> Option<Turn> {
        Some(iterate(
            self.port,
            self.app,
            &mut self.stack,
            &mut self.sched,
            &mut self.sink,
            stopping,
        ))
    }
    fn stop_asked(&mut self) -> bool {
        (self.stop)()
    }
    fn publish_last(&mut self) {
        publish_last(self.port, &mut self.stack, &self.sched, &mut self.sink);
    }
    fn wait_rx(&mut self, timeout: Duration) -> bool {
        self.port.dev.wait_rx(timeout)
    }
}

/// Run the loop until the app exits, `stop` returns true, or the duration ends.
/// `on_stats` gets a snapshot every `stats_interval` and once at the end.
pub fn run<D: Device, A: App + ?Sized>(
    node: &mut Node<D>,
    app: &mut A,
    cfg: &LoopConfig,
    clock: &Clock,
    stop: impl FnMut() -> bool,
    on_stats: impl FnMut(&Snapshot),
) -> Result<(), RunError> {
    run_with_clock(node, app, cfg, *clock, stop, on_stats)
}

/// [`run`] on any [`LoopClock`].
pub(crate) fn run_with_clock<D: Device, A: App + ?Sized, C: LoopClock>(
    node: &mut Node<D>,
    app: &mut A,
    cfg: &LoopConfig,
    clock: C,
    stop: impl FnMut() -> bool,
    mut on_stats: impl FnMut(&Snapshot),
) -> Result<(), RunError> {
    let stamps = node.dev().caps().rx_timestamps;
    let mut front = InLoop {
        port: &mut node.port,
        stack: &mut node.stack,
        app,
        sched: Schedule::new(clock, cfg, stamps),
        sink: OnStats(|s: &Snapshot| {
            if let Some(feed) = &cfg.metrics {
                feed.publish(s);
            }
            on_stats(s);
        }),
        stop,
    };
    EventLoop::new(cfg).run(&mut front).map(|_| ())
}

/// Longest wait on a device's wake-up when no timer is due sooner: how
/// quickly a stop request (Ctrl-C, a closed stdout) is seen by an idle loop.
pub const MAX_DEVICE_WAIT: Duration = Duration::from_millis(50);

/// Longest sleep while frames may wait, stamped, in the port
/// ([`RxWait::Stamped`]): how late an ARP request or an echo request from
/// another host may be answered while a ping's replies are batched.
pub const MAX_RX_WAIT: Duration = Duration::from_millis(1);

/// The longest sleep of a loop thread while a caller drives the stack
/// (run to completion): how long a caller that wrote and then went to
/// wait in the kernel without a socket call (packetdrill's wire client
/// on its control connection) leaves its data unsent, long enough that a
/// caller spinning on the same CPU is preempted once a millisecond at
/// most. At 5 ms such a write left 6 ms late, past packetdrill's 4 ms.
pub const DRIVEN_SLEEP: Duration = Duration::from_millis(1);

/// Run a [`SimNet`] against the wall clock until `done` or `duration`
/// passes, sleeping when nothing is due (the demo's two stacks on one
/// simulated link). `net.now` follows `clock`.
pub fn run_sim_realtime(
    net: &mut SimNet,
    clock: &Clock,
    duration: Duration,
    apps: &mut [&mut dyn App],
    mut done: impl FnMut(&mut SimNet) -> bool,
) -> bool {
    let end = clock.now() + duration;
    loop {
        net.now = clock.now();
        let busy = net.step(apps);
        if done(net) {
            return true;
        }
        if net.now >= end {
            return false;
        }
        if !busy {
            let wake = earliest(net.next_wakeup(apps), Some(end)).unwrap_or(end);
            let cap = net.now + Duration::from_millis(1);
            let sleep = wake.min(cap).saturating_duration_since(clock.now());
            if !sleep.is_zero() {
                std::thread::sleep(sleep);
            }
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use ustack::time::Instant;

    #[test]
    fn backoff_doubles_to_max_then_deepens_after_a_quiet_second() {
        let max = Duration::from_millis(1);
        let far = Duration::from_secs(10);
        let mut b = Backoff::new();
        let t0 = Instant::from_secs(5);
        let steps: Vec<_> = (0..14).map(|_| b.next(t0, max, far)).collect();
        assert_eq!(steps[0], Duration::from_micros(1));
        assert_eq!(steps[10], Duration::from_micros(1024).min(max));
        assert_eq!(*steps.last().unwrap(), max, "capped while recently busy");
        // Still idle a second later: the sleeps grow to the deep cap.
        let later = t0 + DEEP_IDLE_AFTER;
        let deep: Vec<_> = (0..6).map(|_| b.next(later, max, far)).collect();
        assert_eq!(*deep.last().unwrap(), DEEP_IDLE_SLEEP);
        assert!(deep.windows(2).all(|w| w[0] <= w[1]));
        // Never past the next timer.
        assert_eq!(
            b.next(later, max, Duration::from_micros(7)),
            Duration::from_micros(7)
        );
        // Work resets both the step and the quiet time.
        b.reset();
        assert_eq!(b.next(later, max, far), Duration::from_micros(1));
        let steps: Vec<_> = (0..14).map(|_| b.next(later, max, far)).collect();
        assert_eq!(*steps.last().unwrap(), max);
    }

    /// The loop sleeps on the device for every front: a fake port that
    /// can wake the loop counts the waits of an idle in-loop app and a
    /// sharded run ([`Device::wait_rx`]); a spawned runtime (the blocking
    /// and async fronts' loop) polls the port's descriptor
    /// ([`Device::rx_fd`]) and its fronts' eventfd, outside its locks.
    mod sleeps_on_the_device {
        use std::net::{Ipv4Addr, SocketAddrV4};
        use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

        use rustix::event::EventfdFlags;
        use ustack::phy::device::{DeviceCaps, PortStats};
        use ustack::phy::pool::PoolStats;
        use ustack::sim::{SimLink, SimPort};
        use ustack::wire::EthernetAddress;

        use super::*;
        use crate::Builder;

        /// What the fake port saw.
        #[derive(Debug, Default)]
        struct Seen {
            /// `wait_rx` calls.
            waits: AtomicUsize,
            /// `rx_burst` calls (iterations, the loop's or a caller's).
            bursts: AtomicUsize,
            /// Readings of a readable descriptor (a "frame arrived").
            arrivals: AtomicUsize,
            /// Frames sent.
            sent: AtomicUsize,
            /// The thread that read the last "frame".
            reader: parking_lot::Mutex<Option<std::thread::ThreadId>>,
        }

        /// A sim port whose `wait_rx` counts its calls and sleeps out the
        /// timeout (at most 1 ms), as a descriptor with no frames would;
        /// with `rx`, an eventfd is its descriptor (written by a test: a
        /// frame arrived; read back by `rx_burst`).
        struct Waits {
            port: SimPort,
            seen: Arc<Seen>,
            rx: Option<OwnedFd>,
        }

        impl Device for Waits {
            type Buf = <SimPort as Device>::Buf;
            fn caps(&self) -> DeviceCaps {
                self.port.caps()
            }
            fn rx_burst(&mut self, now: Instant, out: &mut Vec<Self::Buf>, max: usize) -> usize {
                self.seen.bursts.fetch_add(1, Ordering::SeqCst);
                if let Some(fd) = &self.rx {
                    if rustix::io::read(fd, &mut [0u8; 8]).is_ok() {
                        *self.seen.reader.lock() = Some(std::thread::current().id());
                        self.seen.arrivals.fetch_add(1, Ordering::SeqCst);
                    }
                }
                self.port.rx_burst(now, out, max)
            }
            fn tx_burst(&mut self, now: Instant, pkts: &mut Vec<Self::Buf>) -> usize {
                let n = self.port.tx_burst(now, pkts);
                self.seen.sent.fetch_add(n, Ordering::SeqCst);
                n
            }
            fn alloc_tx(&mut self) -> Option<Self::Buf> {
                self.port.alloc_tx()
            }
            fn port_stats(&self) -> PortStats {
                self.port.port_stats()
            }
            fn pool_stats(&self, out: &mut Vec<PoolStats>) {
                self.port.pool_stats(out);
            }
            fn poll_at(&self) -> Option<Instant> {
                self.port.poll_at()
            }
            fn wait_rx(&mut self, timeout: Duration) -> bool {
                self.seen.waits.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(timeout.min(Duration::from_millis(1)));
                true
            }
            fn rx_fd(&self) -> Option<BorrowedFd<'_>> {
                self.rx.as_ref().map(AsFd::as_fd)
            }
        }

        fn node_with(rx: Option<OwnedFd>) -> (Node<Waits>, Arc<Seen>) {
            let seen = Arc::new(Seen::default());
            let cfg = Builder::new()
                .sim(&SimLink::new(Default::default()))
                .ip(Ipv4Addr::new(10, 0, 0, 2), 24)
                .build()
                .unwrap();
            let port =
                SimLink::new(Default::default()).attach(EthernetAddress([2, 0, 0, 0, 0, 2]), 64);
            let dev = Waits {
                port,
                seen: seen.clone(),
                rx,
            };
            (Node::new(Stack::new(cfg.stack), dev), seen)
        }

        fn node() -> (Node<Waits>, Arc<Seen>) {
            node_with(None)
        }

        /// A port with an eventfd as its descriptor, and the eventfd (to
        /// make it readable: a frame arrived).
        fn node_with_fd() -> (Node<Waits>, Arc<Seen>, OwnedFd) {
            let fd =
                rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).unwrap();
            let ours = fd.try_clone().unwrap();
            let (node, seen) = node_with(Some(fd));
            (node, seen, ours)
        }

        /// A spawned loop that would sleep an hour if nothing woke it: no
        /// snapshot due, a back-off of an hour.
        fn sleepy() -> LoopConfig {
            LoopConfig {
                idle: IdleMode::Backoff {
                    max_sleep: Duration::from_secs(3600),
                },
                stats_interval: Duration::from_secs(3600),
                ..LoopConfig::default()
            }
        }

        /// Generous: only a loop that sleeps out its hour misses it.
        const DEADLINE: Duration = Duration::from_secs(20);

        fn until(what: &str, mut f: impl FnMut() -> bool) {
            let t0 = std::time::Instant::now();
            while !f() {
                assert!(t0.elapsed() < DEADLINE, "{what}: not within {DEADLINE:?}");
                std::thread::sleep(Duration::from_millis(1));
            }
        }

        /// Until the loop sleeps in its poll (its stack idle).
        fn asleep(net: &crate::Net) {
            until("the loop sleeps on the device", || net.shared.wake.asleep());
        }

        const IDLE: Duration = Duration::from_millis(200);

        /// A datagram to 10.0.0.`host` sent on `h` by a socket call on
        /// another thread (which has ended when this returns).
        fn send_from_another_thread(net: &crate::Net, h: ustack::socket::udp::UdpHandle, host: u8) {
            let caller = net.clone();
            std::thread::spawn(move || {
                let dst = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, host), 9);
                caller
                    .with_stack(|s| s.udp().send_to(h, dst, b"wake up"))
                    .unwrap()
                    .unwrap();
            })
            .join()
            .unwrap();
        }

        /// A spawned runtime on a port with a descriptor (and that
        /// descriptor, to make frames arrive), a UDP socket bound on port
        /// 4000, the loop asleep on the device.
        fn asleep_with_udp() -> (
            crate::Runtime,
            crate::Net,
            Arc<Seen>,
            OwnedFd,
            ustack::socket::udp::UdpHandle,
        ) {
            let (node, seen, frame) = node_with_fd();
            let rt = crate::spawned::spawn(node, (), sleepy(), None, None).unwrap();
            let net = rt.net().clone();
            let h = net.with_stack(|s| s.udp().bind(4000)).unwrap().unwrap();
            asleep(&net);
            (rt, net, seen, frame, h)
        }

        #[test]
        fn in_loop_app() {
            let (mut node, seen) = node();
            let t0 = std::time::Instant::now();
            run(
                &mut node,
                &mut (),
                &LoopConfig::default(),
                &Clock::new(),
                || t0.elapsed() >= IDLE,
                |_| {},
            )
            .unwrap();
            assert!(seen.waits.load(Ordering::Relaxed) >= 10, "{seen:?}");
        }

        #[test]
        fn spawned_runtime_of_the_blocking_and_async_fronts() {
            let (node, seen, frame) = node_with_fd();
            let rt = crate::spawned::spawn(node, (), sleepy(), None, None).unwrap();
            let net = rt.net().clone();
            for i in 1..=3 {
                asleep(&net);
                // While it sleeps, the core is free: a caller drives the
                // stack (an iteration on this thread) without waiting.
                let bursts = seen.bursts.load(Ordering::SeqCst);
                net.drive();
                assert!(
                    seen.bursts.load(Ordering::SeqCst) > bursts,
                    "drive ran no turn"
                );
                // A frame arrives: the loop wakes and receives it (it
                // would otherwise sleep an hour).
                asleep(&net);
                rustix::io::write(&frame, &1u64.to_ne_bytes()).unwrap();
                until("the loop reads the frame", || {
                    seen.arrivals.load(Ordering::SeqCst) == i
                });
            }
            rt.stop().unwrap();
            // The device's own wait (under the core's lock) is never used.
            assert_eq!(seen.waits.load(Ordering::Relaxed), 0);
        }

        /// A caller that drove the stack keeps the loop's thread out of
        /// its way until it says it stops driving (to wait in the kernel):
        /// then the loop takes the stack back and sleeps on the device.
        #[test]
        fn a_caller_that_stops_driving_hands_the_stack_back() {
            let (node, seen, frame) = node_with_fd();
            let rt = crate::spawned::spawn(node, (), sleepy(), None, None).unwrap();
            let net = rt.net().clone();
            asleep(&net);
            net.drive();
            assert!(net.shared.driving(), "a caller just drove");
            net.stop_driving();
            assert!(!net.shared.driving(), "the caller stopped driving");
            // The loop runs again: a frame is read by its thread.
            rustix::io::write(&frame, &1u64.to_ne_bytes()).unwrap();
            until("the loop reads the frame", || {
                seen.arrivals.load(Ordering::SeqCst) == 1
            });
            rt.stop().unwrap();
        }

        /// A caller that waits on the device (run to completion while it
        /// blocks) reads the frames itself, on its own thread, woken by
        /// the device's descriptor; a socket call from another thread
        /// wakes it through the wake-up descriptor and its frame leaves
        /// from the waiter's iteration. One waiter at a time; when it
        /// goes, the loop's thread takes the device back.
        #[test]
        fn a_caller_waiting_on_the_device_runs_the_stack() {
            use rustix::event::{PollFd, PollFlags, Timespec};
            let (rt, net, seen, frame, h) = asleep_with_udp();
            let mut w = net.device_waiter().expect("the device has a descriptor");
            let other = net.clone();
            let taken = std::thread::spawn(move || other.device_waiter().is_none());
            assert!(taken.join().unwrap(), "one waiter at a time");
            // The same thread again (a signal handler during the wait):
            // it waits, nested, and the outer wait keeps the role.
            drop(net.device_waiter().expect("nested"));
            let other = net.clone();
            let taken = std::thread::spawn(move || other.device_waiter().is_none());
            assert!(taken.join().unwrap(), "still one waiter");
            // The waiter's poll: `None` when work came since its last
            // iteration (it must not sleep), else which descriptors woke it.
            let poll = |w: &mut crate::DeviceWaiter<'_>, sleep: Duration| -> Option<[bool; 2]> {
                if !w.sleep() {
                    return None;
                }
                let [dev, wake] = w.fds();
                let mut fds = [
                    PollFd::new(&dev, PollFlags::IN),
                    PollFd::new(&wake, PollFlags::IN),
                ];
                let ts = Timespec {
                    tv_sec: sleep.as_secs() as i64,
                    tv_nsec: sleep.subsec_nanos().into(),
                };
                rustix::event::poll(&mut fds, Some(&ts)).unwrap();
                let r = fds.map(|f| f.revents().contains(PollFlags::IN));
                w.woke(r[1]);
                Some(r)
            };
            // The loop's thread may still finish an iteration it began.
            let mut sleep = Duration::ZERO;
            until("the waiter gets an iteration", || {
                sleep = w.turn().expect("the loop runs");
                !sleep.is_zero()
            });
            assert_eq!(sleep, MAX_DEVICE_WAIT, "an idle stack sleeps long");
            rustix::io::write(&frame, &1u64.to_ne_bytes()).unwrap();
            assert_eq!(
                poll(&mut w, sleep),
                Some([true, false]),
                "the frame wakes the waiter"
            );
            w.turn().unwrap();
            assert_eq!(seen.arrivals.load(Ordering::SeqCst), 1);
            assert_eq!(*seen.reader.lock(), Some(std::thread::current().id()));
            let sent = seen.sent.load(Ordering::SeqCst);
            send_from_another_thread(&net, h, 9);
            // Given before the waiter slept: it does not sleep.
            assert_eq!(poll(&mut w, Duration::from_secs(3600)), None);
            w.turn().unwrap();
            assert!(
                seen.sent.load(Ordering::SeqCst) > sent,
                "the waiter sent the frame"
            );
            // Given while it sleeps: the wake-up ends its sleep. (A
            // wake-up the loop's thread left unread for the waiter may end
            // one sleep early: the waiter takes it and sleeps again.)
            let sent = seen.sent.load(Ordering::SeqCst);
            let caller = net.clone();
            let t = std::thread::spawn(move || {
                until("the waiter sleeps", || caller.shared.wake.asleep());
                let dst = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 8), 9);
                caller
                    .with_stack(|s| s.udp().send_to(h, dst, b"wake up"))
                    .unwrap()
                    .unwrap();
            });
            let mut sleeps = 0;
            while seen.sent.load(Ordering::SeqCst) == sent {
                sleeps += 1;
                assert!(sleeps < 1000, "the waiter never sent the frame");
                let r = poll(&mut w, DEADLINE);
                assert_ne!(r, Some([false, false]), "the wake-up ends the sleep");
                w.turn().unwrap();
            }
            t.join().unwrap();
            drop(w);
            net.stop_driving();
            rustix::io::write(&frame, &1u64.to_ne_bytes()).unwrap();
            until("the loop's thread reads the frame", || {
                seen.arrivals.load(Ordering::SeqCst) == 2
            });
            assert_ne!(*seen.reader.lock(), Some(std::thread::current().id()));
            rt.stop().unwrap();
        }

        /// With callers driving (run to completion under exec), a socket
        /// call that gives the stack work while the loop's thread sleeps
        /// on the device runs the iteration itself: its frame leaves
        /// before the call returns, and the loop's thread is not woken.
        #[test]
        fn a_socket_call_of_a_driving_caller_sends_without_waking_the_loop() {
            let (rt, net, seen, _frame, h) = asleep_with_udp();
            net.set_callers_drive(true);
            let woken = net.shared.wake.woken.load(Ordering::SeqCst);
            let sent = seen.sent.load(Ordering::SeqCst);
            let dst = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 7), 9);
            net.with_stack(|s| s.udp().send_to(h, dst, b"now"))
                .unwrap()
                .unwrap();
            assert!(seen.sent.load(Ordering::SeqCst) > sent, "sent in the call");
            assert_eq!(net.shared.wake.woken.load(Ordering::SeqCst), woken);
            rt.stop().unwrap();
        }

        #[test]
        fn spawned_runtime_on_a_port_without_a_descriptor_backs_off() {
            let (node, seen) = node();
            let rt = crate::spawned::spawn(node, (), LoopConfig::default(), None, None).unwrap();
            std::thread::sleep(IDLE);
            rt.stop().unwrap();
            // Parked in the back-off (which socket calls unpark): its
            // device's `wait_rx` would hold the core's lock.
            assert_eq!(seen.waits.load(Ordering::Relaxed), 0);
            assert!(seen.bursts.load(Ordering::Relaxed) >= 10);
        }

        /// A socket call from another thread that gives the loop work
        /// wakes it from its sleep on the device at once: the datagram's
        /// frame (an ARP request for its destination) leaves long before
        /// the loop's hour-long wait would end, through the eventfd.
        #[test]
        fn a_socket_call_wakes_a_spawned_loop_asleep_on_the_device() {
            let (rt, net, seen, _frame, h) = asleep_with_udp();
            for i in 1..=3u8 {
                asleep(&net);
                let (sent, woken) = (
                    seen.sent.load(Ordering::SeqCst),
                    net.shared.wake.woken.load(Ordering::SeqCst),
                );
                send_from_another_thread(&net, h, 10 + i);
                until("the call's frame leaves", || {
                    seen.sent.load(Ordering::SeqCst) > sent
                });
                // The fronts' eventfd ended the wait, not a timeout.
                assert!(net.shared.wake.woken.load(Ordering::SeqCst) > woken);
            }
            rt.stop().unwrap();
            assert_eq!(seen.waits.load(Ordering::Relaxed), 0);
        }

        #[test]
        fn sharded_run() {
            let cfg = Builder::new()
                .dpdk("--no-huge")
                .ip(Ipv4Addr::new(10, 0, 0, 2), 24)
                .cores(&[0])
                .backoff(true)
                .build()
                .unwrap();
            let (node, seen) = node();
            let stop = AtomicBool::new(false);
            let done = crate::net::sharded::run_on_queues(
                &cfg,
                &[0],
                vec![node.port.dev],
                &[],
                Some(IDLE),
                &stop,
                None,
                |_| (),
            )
            .unwrap();
            assert_eq!(done.len(), 1);
            assert!(seen.waits.load(Ordering::Relaxed) >= 10, "{seen:?}");
        }
    }
}
