//! The connection's timers: a [`TimerTable`] indexed by [`Timer`], and what
//! each expiry does (retransmission, probes, delayed ACK, keepalive, user
//! timeout, FIN-WAIT-2 and TIME-WAIT).

use std::time::Duration;

use super::{Frto, State, TcpConn};
use crate::error::ConnError;
use crate::time::Instant;

/// Least persist (zero-window probe) interval.
const PERSIST_MIN: Duration = Duration::from_millis(200);
/// Longest persist interval.
const PERSIST_MAX: Duration = Duration::from_secs(60);

/// The connection's timers, each a deadline in the [`TimerTable`].
///
/// Keepalive and the user timeout are not here: their deadlines follow
/// from when the peer last spoke and since when data has waited, which
/// change on nearly every segment, so [`TcpConn::poll_at`] derives them
/// instead of storing them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timer {
    /// Retransmission timeout (RFC 6298), also for the SYN and SYN-ACK.
    Rto,
    /// Persist: a zero-window probe, or the sender SWS override (RFC 9293 3.8.6.2.1).
    Persist,
    /// Delayed ACK (RFC 9293 3.8.6.3).
    DelayedAck,
    /// End of TIME-WAIT (2 MSL).
    TimeWait,
    /// An orphaned connection in FIN-WAIT-2 gives up on the peer's FIN.
    FinWait2,
    /// Tail loss probe (RFC 8985 7.2): the probe timeout, before the RTO.
    Tlp,
    /// RACK's reordering timer (RFC 8985 6.2): segments sent before a
    /// delivered one count as lost when it expires.
    Reorder,
}

impl Timer {
    const COUNT: usize = 7;
}

/// Added to twice the smoothed RTT for a probe timeout: a floor for the
/// timer's granularity, and when a single segment is in flight, the
/// worst-case delayed ACK the peer may hold its answer for (RFC 8985
/// 7.2's WCDelAckT, Linux's 200 ms).
const PTO_SLACK: Duration = Duration::from_millis(2);
const PTO_DELAYED_ACK: Duration = Duration::from_millis(200);

/// One optional deadline per [`Timer`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct TimerTable {
    at: [Option<Instant>; Timer::COUNT],
}

impl TimerTable {
    /// Arm `timer` to fire at `at` (re-arming it if it was set).
    pub(super) fn set(&mut self, timer: Timer, at: Instant) {
        self.at[timer as usize] = Some(at);
    }

    /// Disarm `timer`.
    pub(super) fn stop(&mut self, timer: Timer) {
        self.at[timer as usize] = None;
    }

    /// Disarm each of `timers`.
    pub(super) fn stop_all(&mut self, timers: &[Timer]) {
        for &t in timers {
            self.stop(t);
        }
    }

    /// When `timer` fires, if it is set.
    pub(super) fn get(&self, timer: Timer) -> Option<Instant> {
        self.at[timer as usize]
    }

    /// Arm `timer` at `at` unless it is already set; its deadline either way.
    pub(super) fn get_or_set(&mut self, timer: Timer, at: Instant) -> Instant {
        *self.at[timer as usize].get_or_insert(at)
    }

    /// Whether `timer` is set.
    pub(super) fn is_set(&self, timer: Timer) -> bool {
        self.at[timer as usize].is_some()
    }

    /// Whether `timer` is set and due at `now`.
    pub(super) fn expired(&self, timer: Timer, now: Instant) -> bool {
        self.at[timer as usize].is_some_and(|t| now >= t)
    }

    /// The earliest deadline of all set timers.
    pub(super) fn next(&self) -> Option<Instant> {
        self.at.iter().flatten().min().copied()
    }
}

impl TcpConn {
    /// Stop every timer but TIME-WAIT's (the connection is closing or closed).
    pub(super) fn clear_timers(&mut self) {
        self.timers.stop_all(&[
            Timer::Rto,
            Timer::Persist,
            Timer::DelayedAck,
            Timer::FinWait2,
            Timer::Tlp,
            Timer::Reorder,
        ]);
    }

    /// (Re)start the probe timeout (RFC 8985 7.2) after new data left or
    /// an ACK advanced: with SACK, data in flight, no recovery and no
    /// probe out, at twice the smoothed RTT (plus a delayed ACK's worth
    /// for a single segment), or at the RTO if that comes first: the
    /// probe then goes instead of the timeout's retransmission.
    pub(super) fn arm_tail_probe(&mut self, now: Instant) {
        self.timers.stop(Timer::Tlp);
        let flight = self.snd.max.since(self.snd.una);
        let eligible = self.cfg.tail_loss_probe
            && self.opts.sack_enabled
            // A FIN in flight too (after a close), as Linux: a lost FIN
            // is probed like a lost last segment.
            && matches!(
                self.state,
                State::Established
                    | State::CloseWait
                    | State::FinWait1
                    | State::Closing
                    | State::LastAck
            )
            && !self.rec.in_recovery
            && self.rec.tlp.high.is_none()
            && flight > 0;
        let (true, Some(srtt)) = (eligible, self.rec.rtt.srtt()) else {
            return;
        };
        let slack = if flight <= self.max_payload() {
            PTO_DELAYED_ACK
        } else {
            PTO_SLACK
        };
        let mut at = now + srtt * 2 + slack;
        if let Some(rto) = self.timers.get(Timer::Rto) {
            at = at.min(rto);
        }
        self.timers.set(Timer::Tlp, at);
    }

    pub(super) fn arm_fin_wait2(&mut self, now: Instant) {
        if self.orphaned && self.state == State::FinWait2 && !self.timers.is_set(Timer::FinWait2) {
            self.timers
                .set(Timer::FinWait2, now + self.cfg.fin_wait2_timeout);
        }
    }

    pub(super) fn arm_persist(&mut self, now: Instant) {
        let base = self.rec.rtt.rto().max(PERSIST_MIN);
        let d = base
            .saturating_mul(1 << self.persist_backoff.min(16))
            .min(PERSIST_MAX);
        self.timers.set(Timer::Persist, now + d);
    }

    /// When the user timeout ends the connection: only with data in flight
    /// on a synchronized connection.
    pub(super) fn user_timeout_at(&self) -> Option<Instant> {
        let t = self.live.user_timeout?;
        if !self.state.synchronized() || self.in_flight() == 0 {
            return None;
        }
        Some(self.live.unacked_since? + t)
    }

    /// When the next keepalive probe (or the verdict on the last one) is
    /// due: only on an established connection with nothing in flight or
    /// queued (retransmissions time out on their own).
    pub(super) fn keepalive_at(&self) -> Option<Instant> {
        let ka = self.live.keepalive?;
        if self.state != State::Established || self.in_flight() > 0 || self.send_queued() > 0 {
            return None;
        }
        Some(if self.live.ka_probes == 0 {
            self.live.last_rx + ka.idle
        } else {
            self.live.ka_last_probe + ka.interval
        })
    }

    /// The next time [`on_timer`](Self::on_timer) or a transmit is due.
    pub fn poll_at(&self) -> Option<Instant> {
        if self.owed.ack_now
            || self.owed.send_syn && matches!(self.state, State::SynSent | State::SynReceived)
            || self.owed.rst_pending.is_some()
        {
            return Some(Instant::ZERO);
        }
        if self.state == State::TimeWait && !self.timers.is_set(Timer::TimeWait) {
            return Some(Instant::ZERO);
        }
        [
            self.timers.next(),
            self.keepalive_at(),
            self.user_timeout_at(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Run expired timers.
    pub fn on_timer(&mut self, now: Instant) {
        if self.state == State::TimeWait {
            match self.timers.get(Timer::TimeWait) {
                None => self.timers.set(Timer::TimeWait, now + self.cfg.time_wait),
                Some(t) if now >= t => {
                    self.state = State::Closed;
                    self.timers.stop(Timer::TimeWait);
                }
                Some(_) => {}
            }
        }
        if self.timers.expired(Timer::FinWait2, now) {
            // The peer never closed: give up as Linux does, with a reset.
            self.reset_orphan(None);
            self.error = Some(ConnError::TimedOut);
            return;
        }
        if self.user_timeout_at().is_some_and(|t| now >= t) {
            // Sent data waited longer than the app allows (Linux: ETIMEDOUT).
            self.error = Some(ConnError::TimedOut);
            self.owed.rst_pending = Some((self.snd.nxt, Some(self.rcv.nxt)));
            self.state = State::Closed;
            self.clear_timers();
            return;
        }
        if let Some((ka, t)) = self.live.keepalive.zip(self.keepalive_at()) {
            if now >= t {
                if self.live.ka_probes >= ka.count {
                    // Nothing came back: the peer is gone (Linux: ETIMEDOUT).
                    self.error = Some(ConnError::TimedOut);
                    self.owed.rst_pending = Some((self.snd.nxt, Some(self.rcv.nxt)));
                    self.state = State::Closed;
                    self.clear_timers();
                    return;
                }
                self.live.ka_probes += 1;
                self.live.ka_last_probe = now;
                self.live.ka_pending = true;
                self.stats.keepalive_probes += 1;
            }
        }
        if self.timers.expired(Timer::DelayedAck, now) {
            self.timers.stop(Timer::DelayedAck);
            self.owed.ack_now = true;
            // No reply carried the ACK in time: not interactive after all.
            self.owed.pingpong = false;
        }
        if self.timers.expired(Timer::Persist, now) {
            self.timers.stop(Timer::Persist);
            self.owed.probe_pending = true;
            self.stats.zero_window_probes += 1;
            self.persist_backoff = (self.persist_backoff + 1).min(16);
        }
        if self.timers.expired(Timer::Tlp, now) {
            self.timers.stop(Timer::Tlp);
            if !self.rec.in_recovery && self.snd.max.diff(self.snd.una) > 0 {
                // The probe goes; the RTO counts from it.
                self.rec.tlp.owed = true;
                self.timers.set(Timer::Rto, now + self.rec.rtt.rto());
            }
        }
        if self.timers.expired(Timer::Reorder, now) {
            self.timers.stop(Timer::Reorder);
            self.on_reorder_timeout(now);
        }
        if self.timers.expired(Timer::Rto, now) {
            self.on_rto(now);
        }
    }

    pub(super) fn on_rto(&mut self, now: Instant) {
        self.timers.stop(Timer::Rto);
        self.stats.timeouts += 1;
        self.rec.retries += 1;
        let limit = if self.state.synchronized() {
            self.cfg.max_retries
        } else {
            self.cfg.syn_retries
        };
        // A user timeout replaces the count (it ends the connection itself).
        let counted = self.live.user_timeout.is_none() || !self.state.synchronized();
        if counted && self.rec.retries > limit {
            // Linux: the soft error an ICMP message left, else a timeout.
            self.error = Some(self.soft_error.unwrap_or(ConnError::TimedOut));
            if self.state.synchronized() {
                self.owed.rst_pending = Some((self.snd.nxt, Some(self.rcv.nxt)));
            }
            self.state = State::Closed;
            self.clear_timers();
            return;
        }
        self.rec.rtt.backoff();
        self.forget_rtt_timing();
        // The timeout takes over from any tail probe.
        self.rec.tlp = Default::default();
        self.timers.stop(Timer::Tlp);
        match self.state {
            State::SynSent | State::SynReceived => {
                self.snd.nxt = self.snd.iss;
                self.owed.send_syn = true;
            }
            _ => {
                let prior = (self.rec.cc.cwnd(), self.rec.cc.ssthresh());
                let frto = self.frto_may_judge().then_some(Frto {
                    high: self.snd.max,
                    new_data: false,
                });
                self.undo_begin(Some(prior));
                self.rec.frto = frto;
                self.rec.cc.on_timeout(now, self.in_flight());
                self.rec.in_recovery = false;
                self.rec.dupacks = 0;
                self.rec.scoreboard.clear();
                self.rec.rack.reset_delivery();
                self.timers.stop(Timer::Reorder);
                self.rec.loss_until = Some(self.snd.max);
                self.rec.cwr_until = None;
                self.ecn_window_cut();
                // Go back: resend from the first unacknowledged byte.
                self.snd.nxt = self.snd.una;
                self.rec.high_rxt = self.snd.una;
            }
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    const ALL: [Timer; Timer::COUNT] = [
        Timer::Rto,
        Timer::Persist,
        Timer::DelayedAck,
        Timer::TimeWait,
        Timer::FinWait2,
        Timer::Tlp,
        Timer::Reorder,
    ];

    #[test]
    fn a_new_table_has_nothing_set() {
        let t = TimerTable::default();
        assert_eq!(t.next(), None);
        for timer in ALL {
            assert!(!t.is_set(timer));
            assert_eq!(t.get(timer), None);
            assert!(!t.expired(timer, Instant::from_millis(u32::MAX as u64)));
        }
    }

    #[test]
    fn timers_are_independent_and_next_is_the_earliest() {
        let mut t = TimerTable::default();
        for (i, timer) in ALL.into_iter().enumerate() {
            t.set(timer, Instant::from_millis(100 - 10 * i as u64));
        }
        for (i, timer) in ALL.into_iter().enumerate() {
            assert_eq!(
                t.get(timer),
                Some(Instant::from_millis(100 - 10 * i as u64))
            );
        }
        assert_eq!(t.next(), Some(Instant::from_millis(40)));
        t.stop(Timer::Reorder);
        assert_eq!(t.next(), Some(Instant::from_millis(50)));
        t.stop(Timer::Tlp);
        assert_eq!(t.next(), Some(Instant::from_millis(60)));
        t.stop(Timer::FinWait2);
        assert_eq!(t.next(), Some(Instant::from_millis(70)));
        assert!(t.is_set(Timer::Rto));
        t.stop_all(&[Timer::TimeWait, Timer::DelayedAck, Timer::Persist]);
        assert_eq!(t.next(), Some(Instant::from_millis(100)));
        t.stop(Timer::Rto);
        assert_eq!(t.next(), None);
    }

    #[test]
    fn set_rearms_and_get_or_set_keeps_an_armed_deadline() {
        let mut t = TimerTable::default();
        t.set(Timer::Rto, Instant::from_millis(50));
        t.set(Timer::Rto, Instant::from_millis(80));
        assert_eq!(t.get(Timer::Rto), Some(Instant::from_millis(80)));
        let at = t.get_or_set(Timer::DelayedAck, Instant::from_millis(40));
        assert_eq!(at, Instant::from_millis(40));
        let at = t.get_or_set(Timer::DelayedAck, Instant::from_millis(10));
        assert_eq!(at, Instant::from_millis(40));
        assert_eq!(t.next(), Some(Instant::from_millis(40)));
    }

    #[test]
    fn expired_is_inclusive_of_the_deadline() {
        let mut t = TimerTable::default();
        t.set(Timer::Persist, Instant::from_millis(200));
        assert!(!t.expired(Timer::Persist, Instant::from_millis(199)));
        assert!(t.expired(Timer::Persist, Instant::from_millis(200)));
        assert!(t.expired(Timer::Persist, Instant::from_millis(201)));
        assert!(!t.expired(Timer::Rto, Instant::from_millis(201)));
    }
}
