//! The poll loop: `rx burst -> protocols -> app work -> timers -> tx burst -> stats`,
//! run to completion on one (optionally pinned) core.
//!
//! [`Node`] is one iteration's worth of glue between a [`Stack`] and a
//! [`Device`]; [`run`] loops it against a real clock, and the sim harness
//! ([`crate::sim::SimNet`]) steps several nodes against a virtual one.

use std::time::Duration;

use serde::Serialize;

use crate::clock::Clock;
use crate::device::{Device, DeviceTx, PortStats};
use crate::pool::PoolStats;
use crate::shard::{Mail, Route, Shard, ShardStats};
use crate::stack::Stack;
use crate::stats::Stats;
use crate::tcp::ConnInfo;
use crate::time::{Instant, earliest};

/// Frames per rx or tx burst.
pub const BURST: usize = 32;

/// What an app tells the loop after its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    Continue,
    Exit,
}

/// Code that runs inside the poll loop, holding socket handles of the stack.
pub trait App {
    /// Called once per loop iteration, after received frames are processed
    /// and before timers and transmit.
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control;
    /// The next time the app must run even if nothing arrives.
    fn poll_at(&self) -> Option<Instant> {
        None
    }
}

/// The app that does nothing (a stack that only answers).
impl App for () {
    fn poll(&mut self, _: Instant, _: &mut Stack) -> Control {
        Control::Continue
    }
}

/// Several apps in one loop; exits when all have exited.
impl<A: App> App for Vec<A> {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let mut all_done = true;
        for a in self.iter_mut() {
            all_done &= a.poll(now, stack) == Control::Exit;
        }
        if all_done {
            Control::Exit
        } else {
            Control::Continue
        }
    }
    fn poll_at(&self) -> Option<Instant> {
        self.iter().map(App::poll_at).fold(None, earliest)
    }
}

/// What one iteration did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepReport {
    pub rx: usize,
    pub tx: u64,
    pub exit: bool,
}

impl StepReport {
    /// Whether anything moved (the idle back-off resets when it did).
    pub fn busy(&self) -> bool {
        self.rx > 0 || self.tx > 0
    }
}

/// Counters of one stack instance at one moment: what telemetry publishes.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// Engine time of the snapshot, nanoseconds.
    pub at_ns: u64,
    pub stack: Stats,
    pub port: PortStats,
    pub pools: Vec<PoolStats>,
    /// TCP connections in slot order, at most [`crate::telemetry::MAX_CONNECTIONS`].
    pub connections: Vec<ConnInfo>,
    /// Every live TCP connection, listed or not.
    pub connections_total: u64,
    /// This stack's shard (index, count) and mailbox counters, on a host
    /// with several queues.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<ShardSnapshot>,
}

/// A shard's place and mailbox counters in a [`Snapshot`].
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ShardSnapshot {
    pub index: usize,
    pub count: usize,
    #[serde(flatten)]
    pub stats: ShardStats,
}

/// A stack bound to a device.
#[derive(Debug)]
pub struct Node<D: Device> {
    pub stack: Stack,
    pub dev: D,
    /// The mailboxes to sibling shards, on a host with several queues.
    pub shard: Option<Shard>,
    rx: Vec<D::Buf>,
    txq: Vec<D::Buf>,
}

impl<D: Device> Node<D> {
    pub fn new(stack: Stack, dev: D) -> Self {
        Node {
            stack,
            dev,
            shard: None,
            rx: Vec::with_capacity(BURST),
            txq: Vec::with_capacity(BURST),
        }
    }

    /// A node that is shard `shard.id` of a host with several queues; its
    /// stack's config must carry the same [`crate::shard::ShardId`].
    pub fn sharded(stack: Stack, dev: D, shard: Shard) -> Self {
        let mut node = Node::new(stack, dev);
        node.shard = Some(shard);
        node
    }

    /// One loop iteration at `now`.
    pub fn step<A: App + ?Sized>(&mut self, now: Instant, app: &mut A) -> StepReport {
        let mut rx = self.dev.rx_burst(now, &mut self.rx, BURST);
        let mut tx = DeviceTx::new(&mut self.dev, &mut self.txq, now, BURST);
        if let Some(shard) = &mut self.shard {
            for mail in shard.take_mail(BURST) {
                rx += 1;
                match mail {
                    Mail::Frame(f) => self.stack.receive(now, &f, &mut tx),
                    Mail::ArpReplica(f) => self.stack.receive_replica(now, &f, &mut tx),
                    Mail::Unclaimed { frame, hops } => {
                        let last = hops + 1 >= shard.id.count;
                        if self.stack.receive_or_pass(now, &frame, &mut tx, !last) {
                            shard.pass_on(&frame, hops + 1);
                        }
                    }
                }
            }
        }
        for buf in self.rx.drain(..) {
            let frame = buf.as_ref();
            match self.shard.as_mut().map(|s| (s.route(frame), s)) {
                None => self.stack.receive(now, frame, &mut tx),
                Some((Route::Local, shard)) => {
                    if self
                        .stack
                        .receive_or_pass(now, frame, &mut tx, shard.id.count > 1)
                    {
                        shard.pass_on(frame, 1);
                    }
                }
                Some((Route::LocalAndReplicate, shard)) => {
                    shard.replicate_arp(frame);
                    self.stack.receive(now, frame, &mut tx);
                }
                Some((Route::Forward(to), shard)) => shard.forward(to, frame),
            }
            // `buf` drops here: the frame's buffer goes back to its pool.
        }
        let exit = app.poll(now, &mut self.stack) == Control::Exit;
        self.stack.poll(now, &mut tx);
        tx.flush();
        StepReport {
            rx,
            tx: tx.sent,
            exit,
        }
    }

    /// When this node next has work without outside input.
    pub fn poll_at<A: App + ?Sized>(&self, app: &A) -> Option<Instant> {
        if self.shard.as_ref().is_some_and(Shard::has_mail) {
            return Some(Instant::ZERO);
        }
        earliest(
            earliest(self.stack.poll_at(), self.dev.poll_at()),
            app.poll_at(),
        )
    }

    pub fn snapshot(&self, now: Instant) -> Snapshot {
        let mut pools = Vec::new();
        self.dev.pool_stats(&mut pools);
        let stack = self.stack.stats();
        Snapshot {
            at_ns: now.as_nanos(),
            connections: (self.stack.tcp_connections())
                .take(crate::telemetry::MAX_CONNECTIONS)
                .collect(),
            connections_total: stack.tcp.connections,
            shard: self.shard.as_ref().map(|s| ShardSnapshot {
                index: s.id.index,
                count: s.id.count,
                stats: s.stats,
            }),
            stack,
            port: self.dev.port_stats(),
            pools,
        }
    }
}

/// How the loop waits when an iteration did nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleMode {
    /// Never sleep (dedicated core on bare metal).
    BusyPoll,
    /// Sleep with an exponential back-off up to `max_sleep`, never past the
    /// next timer (laptops, shared machines).
    Backoff { max_sleep: Duration },
}

/// Poll-loop settings.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    pub idle: IdleMode,
    /// CPU to pin the loop's thread to.
    pub core: Option<usize>,
    /// How often to hand a [`Snapshot`] to the stats callback.
    pub stats_interval: Duration,
    /// Stop after this long (engine time from the start).
    pub duration: Option<Duration>,
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
        }
    }
}

/// Why the loop could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot pin to core {0}: no such core or not permitted")]
    Pin(usize),
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

/// Run the loop until the app exits, `stop` returns true, or the duration ends.
/// `on_stats` gets a snapshot every `stats_interval` and once at the end.
pub fn run<D: Device, A: App + ?Sized>(
    node: &mut Node<D>,
    app: &mut A,
    cfg: &LoopConfig,
    clock: &Clock,
    mut stop: impl FnMut() -> bool,
    mut on_stats: impl FnMut(&Snapshot),
) -> Result<(), RunError> {
    if let Some(core) = cfg.core {
        pin_to_core(core)?;
    }
    let start = clock.now();
    let end = cfg.duration.map(|d| start + d);
    let mut next_stats = start + cfg.stats_interval;
    let mut backoff = Duration::from_micros(1);
    loop {
        let now = clock.now();
        let report = node.step(now, app);
        if now >= next_stats {
            on_stats(&node.snapshot(now));
            next_stats = now + cfg.stats_interval;
        }
        if report.exit || end.is_some_and(|e| now >= e) || stop() {
            on_stats(&node.snapshot(now));
            return Ok(());
        }
        if let Some(why) = node.dev.failure() {
            on_stats(&node.snapshot(now));
            return Err(RunError::Device(why));
        }
        let IdleMode::Backoff { max_sleep } = cfg.idle else {
            continue;
        };
        if report.busy() {
            backoff = Duration::from_micros(1);
            continue;
        }
        let wake = [node.poll_at(app), Some(next_stats), end]
            .into_iter()
            .fold(None, earliest)
            .unwrap_or(now + max_sleep);
        let sleep = backoff.min(wake.saturating_duration_since(now));
        if !sleep.is_zero() {
            std::thread::sleep(sleep);
        }
        backoff = (backoff * 2).min(max_sleep);
    }
}
