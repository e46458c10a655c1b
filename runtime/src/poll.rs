//! The poll loop: [`Node::step`] against the wall clock, run to completion
//! on one (optionally pinned) core, with an idle back-off for shared
//! machines and pure busy-poll for dedicated cores.

use std::time::Duration;

use ustack::device::Device;
use ustack::node::{App, Node, Snapshot};
use ustack::sim::SimNet;
use ustack::time::earliest;

use crate::clock::Clock;

/// How the loop waits when an iteration did nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleMode {
    /// Never sleep (dedicated core on bare metal).
    BusyPoll,
    /// Sleep with an exponential back-off up to `max_sleep`, never past the
    /// next timer (laptops, shared machines).
    Backoff {
        /// Longest single sleep (the back-off doubles from 1 µs up to it).
        max_sleep: Duration,
    },
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
    let mut told_conflict = false;
    let mut on_stats = |s: &Snapshot| {
        if let Some(feed) = &cfg.metrics {
            feed.publish(s);
        }
        on_stats(s);
    };
    loop {
        let now = clock.now();
        let report = node.step(now, app);
        if now >= next_stats {
            crate::tell_conflict(&node.stack, &mut told_conflict);
            on_stats(&node.snapshot(now));
            next_stats = now + cfg.stats_interval;
        }
        if report.exit || end.is_some_and(|e| now >= e) || stop() {
            on_stats(&node.snapshot(now));
            return Ok(());
        }
        if let Some(why) = node.dev().failure() {
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
        let until = wake.saturating_duration_since(now);
        if until.is_zero() {
            continue;
        }
        // A device that wakes us when frames come (pcap) is waited on up to
        // the next timer: an idle or lightly loaded loop wakes once per
        // packet or timer instead of every back-off step.
        if node.dev_mut().wait_rx(until.min(MAX_DEVICE_WAIT)) {
            continue;
        }
        std::thread::sleep(backoff.min(until));
        backoff = (backoff * 2).min(max_sleep);
    }
}

/// Longest wait on a device's wake-up when no timer is due sooner: how
/// quickly a stop request (Ctrl-C, a closed stdout) is seen by an idle loop.
pub const MAX_DEVICE_WAIT: Duration = Duration::from_millis(50);

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
