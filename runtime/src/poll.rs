//! The poll loop: [`Node::step`] against the wall clock, run to completion
//! on one (optionally pinned) core, with an idle back-off for shared
//! machines and pure busy-poll for dedicated cores.

use std::time::Duration;

use ustack::device::Device;
use ustack::node::{App, Node, RxWait, Snapshot};
use ustack::sim::SimNet;
use ustack::time::earliest;

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
    let mut backoff = Backoff::new();
    let mut told_conflict = false;
    // Frames may wait, stamped, in a port that stamps them for an app
    // that measures with the stamps (see `RxWait::Stamped`).
    let stamps = node.dev().caps().rx_timestamps;
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
            crate::notice::tell_conflict(&node.stack, &mut told_conflict);
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
            backoff.reset();
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
        let wait = app.rx_wait();
        if stamps && wait == RxWait::Stamped {
            // Replies wait in the port with their arrival stamped: one
            // wake-up per timer (a ping's next send), not one per frame.
            std::thread::sleep(until.min(MAX_RX_WAIT));
            continue;
        }
        // A device that wakes us when frames come (pcap) is waited on up to
        // the next timer: an idle or lightly loaded loop wakes once per
        // packet or timer instead of every back-off step.
        if node.dev_mut().wait_rx(until.min(MAX_DEVICE_WAIT)) {
            continue;
        }
        if wait == RxWait::Nothing {
            // Awaiting nothing, on a port that cannot wake us: poll it at
            // the back-off's longest step, not from 1 µs up.
            backoff.longest(max_sleep);
        }
        std::thread::sleep(backoff.next(now, max_sleep, until));
    }
}

/// Longest wait on a device's wake-up when no timer is due sooner: how
/// quickly a stop request (Ctrl-C, a closed stdout) is seen by an idle loop.
pub const MAX_DEVICE_WAIT: Duration = Duration::from_millis(50);

/// Longest sleep while frames may wait, stamped, in the port
/// ([`RxWait::Stamped`]): how late an ARP request or an echo request from
/// another host may be answered while a ping's replies are batched.
pub const MAX_RX_WAIT: Duration = Duration::from_millis(1);

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
}
