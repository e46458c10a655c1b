//! One poll-loop iteration: `rx burst -> protocols -> app work -> timers ->
//! tx burst`, and the in-loop [`App`] interface.
//!
//! [`Node`] is one iteration's worth of glue between a [`Stack`] and a
//! [`Device`], given `now`: the runtime crate (`ustack-runtime`) loops it
//! against a real clock on a pinned core, and the sim harness
//! ([`crate::sim::SimNet`]) steps several nodes against a virtual one.

use serde::Serialize;

use crate::events::Event;
use crate::phy::device::{Device, DeviceTx, PortStats, Received, RxMeta, RxRole};

/// A sibling's copy of an ARP frame (mail carries no port metadata).
const REPLICA: RxMeta = RxMeta {
    checksum: crate::phy::device::RxChecksum::Unknown,
    at: None,
    role: RxRole::Replica,
};

/// A frame handed on by a sibling that may belong to the next one.
const MAY_PASS: RxMeta = RxMeta {
    checksum: crate::phy::device::RxChecksum::Unknown,
    at: None,
    role: RxRole::MayPass,
};
use crate::phy::pool::PoolStats;
use crate::shard::{Mail, Route, Shard, ShardStats};
use crate::socket::tcp::ConnInfo;
use crate::stack::Stack;
use crate::stats::{Kind, Metrics, Stats, stats};
use crate::time::{Instant, earliest};

/// Frames per rx or tx burst.
pub const BURST: usize = 32;

/// TCP connections a [`Snapshot`] lists (the total is given beside them):
/// at a few snapshots a second this bounds a telemetry line (~150 KB) and
/// the work the loop does for it.
pub const MAX_CONNECTIONS: usize = 256;

/// What an app tells the loop after its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Keep running the loop.
    Continue,
    /// This app is done: the loop ends after this iteration (a `Vec` of
    /// apps ends when every one of them has returned `Exit`).
    Exit,
}

/// Code that runs inside the poll loop, holding socket handles of the stack.
pub trait App {
    /// Called once per loop iteration, after received frames are processed
    /// (and after [`on_events`](Self::on_events)), before timers and transmit.
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control;
    /// The readiness events of this iteration (see [`crate::events`]),
    /// before [`poll`](Self::poll): an app with many sockets handles the
    /// ones that changed instead of scanning all of them.
    fn on_events(&mut self, now: Instant, events: &[Event], stack: &mut Stack) {
        let _ = (now, events, stack);
    }
    /// The next time the app must run even if nothing arrives.
    fn poll_at(&self) -> Option<Instant> {
        None
    }
    /// What the app awaits from the port now, so an idle loop knows how
    /// promptly it must read frames: [`RxWait::Prompt`] by default.
    fn rx_wait(&self) -> RxWait {
        RxWait::Prompt
    }
}

/// How promptly an app needs received frames read ([`App::rx_wait`]),
/// ordered from the least urgent: several apps wait as the most urgent
/// one (the greatest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RxWait {
    /// Nothing: frames may wait a while (a port without a wake-up is
    /// polled at the back-off's longest step, not from short sleeps).
    Nothing,
    /// Only replies the app times by the port's receive stamps
    /// ([`crate::phy::device::DeviceCaps::rx_timestamps`]: a ping's
    /// [`crate::iface::icmp::PingReply::received_at`], UD receive completions):
    /// on a port that stamps frames they may wait until the app's next
    /// [`App::poll_at`], so the loop wakes once per timer, not once per
    /// frame; on one that does not, as `Prompt`.
    Stamped,
    /// Read each frame as it comes (the loop waits on the port's wake-up,
    /// or backs off from short sleeps).
    Prompt,
}

/// The app that does nothing (a stack that only answers).
impl App for () {
    fn poll(&mut self, _: Instant, _: &mut Stack) -> Control {
        Control::Continue
    }
}

/// Several apps in one loop; exits when all have exited.
impl<A: App> App for Vec<A> {
    fn on_events(&mut self, now: Instant, events: &[Event], stack: &mut Stack) {
        for a in self.iter_mut() {
            a.on_events(now, events, stack);
        }
    }
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
    fn rx_wait(&self) -> RxWait {
        self.iter()
            .map(App::rx_wait)
            .max()
            .unwrap_or(RxWait::Prompt)
    }
    fn poll_at(&self) -> Option<Instant> {
        self.iter().map(App::poll_at).fold(None, earliest)
    }
}

/// What one iteration did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Frames processed: received from the port plus those passed in from
    /// sibling shards' mailboxes.
    pub rx: usize,
    /// Frames the port accepted for transmission.
    pub tx: u64,
    /// The app returned [`Control::Exit`].
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
    /// Every engine counter (per layer, drops by reason, TCP totals).
    pub stack: Stats,
    /// The device's port counters.
    pub port: PortStats,
    /// The offloads the port does for the engine.
    pub offloads: crate::phy::device::Offloads,
    /// Counters of every packet pool the device owns.
    pub pools: Vec<PoolStats>,
    /// TCP connections in slot order, at most [`MAX_CONNECTIONS`].
    pub connections: Vec<ConnInfo>,
    /// Every TCP connection that holds a slot, listed or not (TIME-WAIT
    /// records, which hold none, are `stack.tcp.time_wait`).
    pub connections_total: u64,
    /// This stack's shard (index, count) and mailbox counters, on a host
    /// with several queues.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<ShardSnapshot>,
    /// RDMA RC queue pairs (state, PSNs, counters), at most
    /// [`MAX_CONNECTIONS`]; absent when there are none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rc_qps: Vec<crate::socket::rc::RcQpStatus>,
}

/// The counters and gauges of a snapshot that exporters read field by
/// field: `stack`, `port`, `pools`, `shard`, each connection's `stats`,
/// and `connections_total` (a gauge). The connections' own figures
/// (windows, RTTs) and the RC QPs' are not here: an exporter names them
/// one by one.
impl Metrics for Snapshot {
    fn kind(path: &[&str]) -> Option<Kind> {
        match path {
            ["stack", rest @ ..] => Stats::kind(rest),
            ["port", rest @ ..] => PortStats::kind(rest),
            ["pools", rest @ ..] => PoolStats::kind(rest),
            ["shard", rest @ ..] => ShardSnapshot::kind(rest),
            ["connections", "stats", rest @ ..] => crate::stats::ConnStats::kind(rest),
            ["connections_total"] => Some(Kind::Gauge),
            _ => None,
        }
    }
}

stats! {
    /// A shard's place and mailbox counters in a [`Snapshot`].
    #[derive(Debug, Clone, Copy, Serialize)]
    pub struct ShardSnapshot {
        /// This shard's queue index, `0..count`.
        label index: usize,
        /// Shards (queues, cores) on the host.
        label count: usize,
        /// Mailbox counters: frames steered, passed on and replicated.
        #[serde(flatten)]
        flattened stats: ShardStats,
    }
}

/// The device side of a node: the port, its mailboxes to sibling shards and
/// the burst buffers. Apart from the [`Stack`] so a runtime can share the
/// stack with other threads (behind a lock) while the loop owns the port.
pub struct Port<D: Device> {
    /// The backend device (sim link end, pcap handle, DPDK port queue).
    pub dev: D,
    /// The mailboxes to sibling shards, on a host with several queues.
    pub shard: Option<Shard>,
    rx: Vec<D::Buf>,
    txq: Vec<D::Buf>,
    events: Vec<Event>,
    /// The device's offloads, read once.
    offloads: crate::phy::device::Offloads,
    /// Frames the device refused on transmit (a full ring), dropped here:
    /// counted in the port's `tx_errors`, so no frame goes unsaid.
    tx_refused: u64,
}

impl<D: Device + std::fmt::Debug> std::fmt::Debug for Port<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Port")
            .field("dev", &self.dev)
            .field("shard", &self.shard)
            .finish_non_exhaustive()
    }
}

impl<D: Device> Port<D> {
    /// A port on `dev`, with mailboxes to its sibling shards when `shard`
    /// is given.
    pub fn new(dev: D, shard: Option<Shard>) -> Self {
        Port {
            offloads: dev.caps().offloads,
            dev,
            shard,
            rx: Vec::with_capacity(BURST),
            txq: Vec::with_capacity(BURST),
            events: Vec::new(),
            tx_refused: 0,
        }
    }

    /// The device's counters, with the frames it refused on transmit in
    /// `tx_errors`.
    pub fn port_stats(&self) -> crate::phy::device::PortStats {
        let mut s = self.dev.port_stats();
        s.tx_errors += self.tx_refused;
        s
    }

    /// The device back (after a start-up phase driven on a port of its
    /// own); buffers still held by the port go back to their pools.
    pub fn into_device(self) -> D {
        self.dev
    }

    /// One loop iteration of `stack` on this port at `now`.
    pub fn step<A: App + ?Sized>(
        &mut self,
        stack: &mut Stack,
        now: Instant,
        app: &mut A,
    ) -> StepReport {
        stack.set_offloads(self.offloads);
        let mut rx = self.dev.rx_burst(now, &mut self.rx, BURST);
        let mut tx = DeviceTx::new(&mut self.dev, &mut self.txq, now, BURST);
        if let Some(shard) = &mut self.shard {
            for mail in shard.take_mail(BURST) {
                rx += 1;
                match mail {
                    Mail::Frame(f) => {
                        stack.receive(now, &f, RxMeta::default(), &mut tx);
                    }
                    Mail::ArpReplica(f) => {
                        stack.receive(now, &f, REPLICA, &mut tx);
                    }
                    Mail::Unclaimed { frame, hops } => {
                        let last = hops + 1 >= shard.id.count;
                        let meta = if last { RxMeta::default() } else { MAY_PASS };
                        if stack.receive(now, &frame, meta, &mut tx) == Received::PassOn {
                            shard.pass_on(&frame, hops + 1);
                        }
                    }
                }
            }
        }
        for buf in self.rx.drain(..) {
            let frame = buf.as_ref();
            let meta = RxMeta::of(&buf, now);
            match self.shard.as_mut().map(|s| (s.route(frame), s)) {
                None => {
                    stack.receive(now, frame, meta, &mut tx);
                }
                Some((Route::Local, shard)) => {
                    let role = if shard.may_pass() {
                        RxRole::MayPass
                    } else {
                        RxRole::Owner
                    };
                    let meta = RxMeta { role, ..meta };
                    if stack.receive(now, frame, meta, &mut tx) == Received::PassOn {
                        shard.pass_on(frame, 1);
                    }
                }
                Some((Route::Replica, _)) => {
                    let meta = RxMeta {
                        role: RxRole::Replica,
                        ..meta
                    };
                    stack.receive(now, frame, meta, &mut tx);
                }
                Some((Route::NotOurs, shard)) => shard.stats.not_ours += 1,
                Some((Route::LocalAndReplicate, shard)) => {
                    shard.replicate_arp(frame);
                    stack.receive(now, frame, meta, &mut tx);
                }
                Some((Route::Forward(to), shard)) => shard.forward(to, frame),
            }
            // `buf` drops here: the frame's buffer goes back to its pool.
        }
        self.events.clear();
        stack.drain_events(&mut self.events);
        if !self.events.is_empty() {
            app.on_events(now, &self.events, stack);
        }
        let exit = app.poll(now, stack) == Control::Exit;
        stack.poll(now, &mut tx);
        tx.flush();
        let (sent, refused) = (tx.sent, tx.refused);
        self.tx_refused += refused;
        StepReport { rx, tx: sent, exit }
    }

    /// The readiness events the last [`step`](Self::step) handed the app
    /// (the runtime wakes the tasks waiting on them).
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// When this port and `stack` next have work without outside input.
    pub fn poll_at<A: App + ?Sized>(&self, stack: &Stack, app: &A) -> Option<Instant> {
        if self.shard.as_ref().is_some_and(Shard::has_mail) {
            return Some(Instant::ZERO);
        }
        earliest(earliest(stack.poll_at(), self.dev.poll_at()), app.poll_at())
    }

    /// The counters of `stack` on this port.
    pub fn snapshot(&self, stack: &Stack, now: Instant) -> Snapshot {
        let mut pools = Vec::new();
        self.dev.pool_stats(&mut pools);
        let stats = stack.stats();
        Snapshot {
            at_ns: now.as_nanos(),
            connections: stack
                .tcp_ref()
                .connections()
                .take(MAX_CONNECTIONS)
                .collect(),
            connections_total: stats.tcp.connections.saturating_sub(stats.tcp.time_wait),
            rc_qps: stack.rc_ref().qps(MAX_CONNECTIONS),
            shard: self.shard.as_ref().map(|s| ShardSnapshot {
                index: s.id.index,
                count: s.id.count,
                stats: s.stats,
            }),
            stack: stats,
            port: self.port_stats(),
            offloads: self.offloads,
            pools,
        }
    }
}

/// A stack bound to a device.
#[derive(Debug)]
pub struct Node<D: Device> {
    /// The protocol engine.
    pub stack: Stack,
    /// The device it runs on.
    pub port: Port<D>,
}

impl<D: Device> Node<D> {
    /// `stack` on `dev`, alone on its port (no sibling shards).
    pub fn new(stack: Stack, dev: D) -> Self {
        Node {
            stack,
            port: Port::new(dev, None),
        }
    }

    /// A node that is shard `shard.id` of a host with several queues; its
    /// stack's config must carry the same [`crate::shard::ShardId`].
    pub fn sharded(stack: Stack, dev: D, shard: Shard) -> Self {
        Node {
            stack,
            port: Port::new(dev, Some(shard)),
        }
    }

    /// The device.
    pub fn dev(&self) -> &D {
        &self.port.dev
    }

    /// The device, to wait on it ([`Device::wait_rx`]).
    pub fn dev_mut(&mut self) -> &mut D {
        &mut self.port.dev
    }

    /// One loop iteration at `now`.
    pub fn step<A: App + ?Sized>(&mut self, now: Instant, app: &mut A) -> StepReport {
        self.port.step(&mut self.stack, now, app)
    }

    /// When this node next has work without outside input.
    pub fn poll_at<A: App + ?Sized>(&self, app: &A) -> Option<Instant> {
        self.port.poll_at(&self.stack, app)
    }

    /// The counters of this node at `now` (what telemetry publishes).
    pub fn snapshot(&self, now: Instant) -> Snapshot {
        self.port.snapshot(&self.stack, now)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    struct Waits(RxWait);

    impl App for Waits {
        fn poll(&mut self, _: Instant, _: &mut Stack) -> Control {
            Control::Continue
        }
        fn rx_wait(&self) -> RxWait {
            self.0
        }
    }

    #[test]
    fn several_apps_wait_as_the_most_urgent_one() {
        use RxWait::*;
        let of = |w: &[RxWait]| w.iter().map(|&w| Waits(w)).collect::<Vec<_>>().rx_wait();
        assert_eq!(of(&[]), Prompt, "no app: read frames as they come");
        assert_eq!(of(&[Nothing, Nothing]), Nothing);
        assert_eq!(of(&[Nothing, Stamped]), Stamped);
        assert_eq!(of(&[Stamped, Prompt, Nothing]), Prompt);
        assert_eq!(().rx_wait(), Prompt, "by default");
    }
}
