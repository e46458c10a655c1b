//! Loss detection by time (RACK, RFC 8985 6) and the window in recovery
//! (proportional rate reduction, RFC 6937), on top of the SACK
//! scoreboard's count (RFC 6675).

use super::timers::Timer;
use super::{CaState, DUP_THRESH, Prr, TcpConn};
use crate::time::Instant;

impl TcpConn {
    /// The SACK count that marks a segment lost (RFC 6675's DupThresh):
    /// 3, or as many segments as deliveries were seen out of order
    /// (Linux's `tp->reordering`), so reordering the path showed is not
    /// taken for loss by the count; RACK's clock still finds real losses.
    pub(super) fn sack_thresh(&self) -> usize {
        self.rec.rack.reordering().max(DUP_THRESH)
    }

    /// RACK's verdict after an ACK or on its timer: lost originals move
    /// the scoreboard's edge, retransmissions lost again are flagged for
    /// the sender, the reordering timer waits for the rest. Enters
    /// recovery on a new loss; returns whether there was one.
    pub(super) fn detect_loss_by_time(&mut self, now: Instant) -> bool {
        if !self.cfg.rack || (self.rec.scoreboard.is_empty() && !self.rec.in_recovery) {
            self.timers.stop(Timer::Reorder);
            return false;
        }
        let seg = self.max_payload().max(1);
        let sacked_segs = self.rec.scoreboard.sacked_bytes().div_ceil(seg);
        let reo_wnd = self
            .rec
            .rack
            .reo_wnd(self.rec.in_recovery, sacked_segs, self.rec.rtt.srtt());
        let v = self
            .rec
            .rack
            .detect(now, self.snd.una, &self.rec.scoreboard, reo_wnd);
        match v.wait {
            Some(wait) => self.timers.set(Timer::Reorder, now + wait),
            None => self.timers.stop(Timer::Reorder),
        }
        let lost_before = self.lost_bytes();
        if let Some(edge) = v.lost_below {
            self.rec.scoreboard.mark_lost_below(edge);
        }
        let newly_lost = v.lost_again || self.lost_bytes() > lost_before;
        if newly_lost && !self.rec.in_recovery {
            self.enter_recovery(now);
        }
        newly_lost
    }

    /// The reordering timer expired (Linux's `tcp_rack_reo_timeout`):
    /// what waited is judged again; a recovery it starts counts one
    /// segment delivered for the window's first step.
    pub(super) fn on_reorder_timeout(&mut self, now: Instant) {
        let was_recovering = self.rec.in_recovery;
        if self.detect_loss_by_time(now) && !was_recovering && self.rec.in_recovery {
            let seg = self.max_payload();
            self.reduce_window(seg, false, false);
        }
    }

    /// A window reduction begins (fast recovery, or an ECN echo): PRR
    /// counts from the window now (RecoverFS), and the controller cuts
    /// ssthresh (and its own window) once.
    pub(super) fn begin_reduction(&mut self, now: Instant) {
        let seg = self.max_payload().max(1);
        self.rec.prr = Prr {
            prior_cwnd: self.rec.cc.cwnd().div_ceil(seg).max(1),
            ..Prr::default()
        };
        self.rec.cc.on_congestion(now, self.in_flight());
        self.rec.prr.window = self.rec.cc.cwnd();
    }

    /// PRR's step on an ACK in recovery (RFC 6937 3, as Linux's
    /// `tcp_cwnd_reduction`): `delivered` bytes this ACK reported
    /// delivered. Above ssthresh, send in proportion to the deliveries
    /// (ssthresh / RecoverFS of them); at or below it, slow-start back up
    /// to it (PRR-SSRB: one more segment per ACK that advanced without a
    /// new loss). The first step always lets one segment go: the fast
    /// retransmission.
    pub(super) fn reduce_window(&mut self, delivered: usize, una_advanced: bool, newly_lost: bool) {
        let seg = self.max_payload().max(1);
        let newly = delivered.div_ceil(seg);
        if newly == 0 {
            return;
        }
        let pipe = self.flight_estimate();
        let in_flight = pipe.div_ceil(seg);
        let ssthresh = self.rec.cc.ssthresh() / seg;
        let p = &mut self.rec.prr;
        p.delivered += newly;
        let quota = if in_flight > ssthresh {
            ((ssthresh * p.delivered + p.prior_cwnd - 1) / p.prior_cwnd.max(1))
                .saturating_sub(p.out)
        } else {
            let mut n = p.delivered.saturating_sub(p.out).max(newly);
            if una_advanced && !newly_lost {
                n += 1;
            }
            n.min(ssthresh - in_flight)
        };
        let quota = quota.max(usize::from(p.out == 0));
        p.window = pipe + quota * seg;
    }

    /// Whether PRR sets the window now: in recovery, or in a reduction
    /// for an ECN echo, with SACK (and RACK's PRR on).
    pub(super) fn reducing(&self) -> bool {
        (self.rec.in_recovery || self.rec.cwr_until.is_some())
            && self.opts.sack_enabled
            && self.cfg.rack
    }

    /// The congestion window the sender obeys: PRR's in a reduction, the
    /// controller's otherwise.
    pub(super) fn send_window(&self) -> usize {
        if self.reducing() {
            self.rec.prr.window
        } else {
            self.rec.cc.cwnd()
        }
    }

    /// Where loss recovery and congestion response stand (Linux's
    /// `tcpi_ca_state`).
    pub(super) fn ca_state(&self) -> CaState {
        if self.rec.loss_until.is_some() {
            CaState::Loss
        } else if self.rec.in_recovery {
            CaState::Recovery
        } else if self.rec.cwr_until.is_some() {
            CaState::Cwr
        } else if self.rec.dupacks > 0 || !self.rec.scoreboard.is_empty() {
            CaState::Disorder
        } else {
            CaState::Open
        }
    }

    /// Segments of `len` bytes left in a reduction (PRR's prr_out).
    pub(super) fn count_recovery_send(&mut self, len: usize) {
        if self.rec.in_recovery || self.rec.cwr_until.is_some() {
            self.rec.prr.out += len.div_ceil(self.max_payload().max(1)).max(1);
        }
    }

    /// Bytes in flight counted lost, retransmitted or not.
    pub(super) fn lost_bytes(&self) -> usize {
        if !self.opts.sack_enabled {
            return 0;
        }
        self.rec
            .scoreboard
            .lost_bytes(self.snd.una, self.snd.max, self.snd.mss, self.sack_thresh())
    }

    /// Bytes retransmitted in this recovery and not yet delivered.
    pub(super) fn retrans_bytes(&self) -> usize {
        if !self.rec.in_recovery || self.rec.high_rxt.diff(self.snd.una) <= 0 {
            return 0;
        }
        self.rec
            .scoreboard
            .unsacked_bytes(self.snd.una, self.snd.una, self.rec.high_rxt)
    }
}
