//! Undoing a needless window cut (RFC 3708's D-SACK detection, RFC 3522's
//! Eifel detection by timestamps, the response of RFC 4015), as Linux
//! does it: a fast recovery or a timeout whose retransmissions all came
//! back as duplicates, or whose acknowledgment echoes a timestamp older
//! than the first retransmission (the original arrived, only late), gives
//! the window and ssthresh back and ends the episode.

use super::{TcpConn, Undo};
use crate::socket::tcp::segment::Segment;
use crate::socket::tcp::seq::Seq;
use crate::time::Instant;

impl TcpConn {
    /// A loss episode begins (fast recovery, or a timeout outside one):
    /// keep what it is about to cut (`prior`: nothing for an episode that
    /// continues an ECN reduction, which no duplicate can undo). A
    /// timeout during recovery, or again after one, keeps the episode's.
    pub(super) fn undo_begin(&mut self, prior: Option<(usize, usize)>) {
        if self.rec.undo.is_some() && (self.rec.in_recovery || self.rec.loss_until.is_some()) {
            return;
        }
        self.rec.undo = Some(Undo {
            marker: self.snd.una,
            prior,
            retrans: None,
            retrans_end: self.snd.una,
            stamp: None,
        });
    }

    /// A retransmission of `start..end` left at `now`: one more a D-SACK
    /// must report for the episode to be needless; the first one's TSval
    /// is what Eifel compares echoes with.
    pub(super) fn undo_note_retransmit(&mut self, now: Instant, start: Seq, end: Seq) {
        let tsval = self.tsval(now);
        if !self.rec.in_recovery && self.rec.loss_until.is_none() {
            // Not in an episode (a tail loss probe): its own business.
            return;
        }
        let Some(u) = self.rec.undo.as_mut() else {
            return;
        };
        if start.diff(u.marker) < 0 {
            return;
        }
        *u.retrans.get_or_insert(0) += 1;
        if end.diff(u.retrans_end) > 0 {
            u.retrans_end = end;
        }
        u.stamp.get_or_insert(tsval);
    }

    /// An ACK's first SACK block reports a duplicate (RFC 2883: below the
    /// cumulative ACK, or inside the second block): within what the
    /// episode retransmitted, each segment it covers was sent needlessly.
    pub(super) fn undo_on_dsack(&mut self, seg: &Segment<'_>, ack: Seq) {
        let Some((start, end)) = seg.dsack(ack) else {
            return;
        };
        let mss = self.max_payload().max(1);
        let Some(u) = self.rec.undo.as_mut() else {
            return;
        };
        if start.diff(u.marker) < 0 || end.diff(u.retrans_end) > 0 {
            return;
        }
        if let Some(n) = u.retrans.as_mut() {
            *n = n.saturating_sub(end.since(start).div_ceil(mss).max(1) as u32);
        }
    }

    /// Whether the episode proved needless (Linux's `tcp_may_undo`):
    /// every retransmission came back as a duplicate, or (`eifel`: an ACK
    /// of the episode) `seg` echoes a timestamp from before the first
    /// retransmission.
    fn may_undo(&self, seg: &Segment<'_>, eifel: bool) -> bool {
        let Some(u) = self.rec.undo else {
            return false;
        };
        let echoed_before = match (eifel && self.opts.ts_enabled, seg.hdr.timestamp, u.stamp) {
            (true, Some((_, tsecr)), Some(stamp)) => {
                tsecr != 0 && (tsecr.wrapping_sub(stamp) as i32) < 0
            }
            _ => false,
        };
        u.retrans == Some(0) || echoed_before
    }

    /// After an ACK: undo the episode if it proved needless: in recovery
    /// (an ACK that moves `SND.UNA` and echoes an original, or once
    /// D-SACKs covered every retransmission), when it ends, on the D-SACKs that follow its end
    /// (until the next episode), and after a timeout on an ACK of new
    /// data (`was_lost`: the ACK came in the timeout's going back).
    /// Returns whether it did.
    pub(super) fn try_undo(
        &mut self,
        seg: &Segment<'_>,
        was_recovering: bool,
        was_lost: bool,
        una_advanced: bool,
    ) -> bool {
        // Eifel looks at ACKs that move `SND.UNA` only (Linux's partial
        // and full ACKs of recovery): a duplicate ACK echoes the last
        // in-order segment's timestamp, older than any retransmission,
        // whether or not the originals were lost.
        let eifel = (was_recovering || was_lost) && una_advanced;
        if (was_lost && !una_advanced) || !self.may_undo(seg, eifel) {
            return false;
        }
        self.undo_episode()
    }

    /// Give back what the episode cut and end it.
    fn undo_episode(&mut self) -> bool {
        let Some(u) = self.rec.undo.take() else {
            return false;
        };
        if let Some((cwnd, ssthresh)) = u.prior {
            self.rec.cc.undo(cwnd, ssthresh);
        }
        self.rec.in_recovery = false;
        if self.rec.loss_until.take().is_some() {
            // Going back after the timeout stops: what was in flight
            // arrived, so new data follows what was sent.
            self.snd.nxt = self.snd.max;
            self.rec.high_rxt = self.snd.una;
        }
        self.rec.frto = None;
        self.rec.cwr_until = None;
        self.stats.undos += 1;
        true
    }

    /// Whether a timeout may be judged by F-RTO (RFC 5682 3.1, its SACK
    /// form, as Linux's): it begins an episode (no recovery under way)
    /// on a SACK connection, and nothing the peer reported beyond
    /// `SND.UNA` (had it, the loss would be known, and an ACK above the
    /// hole could come from that data).
    pub(super) fn frto_may_judge(&self) -> bool {
        self.cfg.frto
            && self.opts.sack_enabled
            && !self.rec.in_recovery
            && self.rec.loss_until.is_none()
            && self.rec.scoreboard.is_empty()
    }

    /// F-RTO's steps on an ACK after the timeout (`was_lost`): an ACK
    /// beyond what was retransmitted acknowledges data sent only once,
    /// so the timeout was needless (step 3b: undone); the first ACK of
    /// the retransmission lets new data out instead of more
    /// retransmissions (step 2b); a duplicate or SACK after that says the
    /// loss was real (step 3a: going back over the flight as usual).
    pub(super) fn frto_on_ack(&mut self, ack: Seq, una_advanced: bool, sacked: usize) {
        let Some(mut f) = self.rec.frto else {
            return;
        };
        let retrans_end = self.rec.undo.map_or(self.snd.una, |u| u.retrans_end);
        if una_advanced && ack.diff(retrans_end) > 0 && self.undo_episode() {
            return;
        }
        if self.rec.loss_until.is_none() {
            // Everything in flight at the timeout is acknowledged (step
            // 2a): nothing to judge.
            self.rec.frto = None;
            return;
        }
        if !f.new_data && una_advanced {
            let data_end = self.snd.data_start + self.snd.buf.len();
            let unsent = data_end.diff(self.snd.max) > 0;
            let window = (self.snd.una + self.snd.wnd).diff(self.snd.max) > 0;
            if unsent && window {
                f.new_data = true;
                self.snd.nxt = self.snd.max;
                self.rec.frto = Some(f);
            } else {
                self.rec.frto = None;
            }
        } else if f.new_data && (sacked > 0 || !una_advanced) {
            // The loss was real: go back over the flight.
            self.rec.frto = None;
            self.snd.nxt = self.snd.una;
            self.rec.high_rxt = self.snd.una;
        }
    }
}
