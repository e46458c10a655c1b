//! Explicit Congestion Notification (RFC 3168 6.1), as Linux does it:
//! the handshake that turns it on, ECT(0) on new data, the receiver's
//! echo of a congestion mark (ECE until the sender's CWR), and the
//! sender's answer to an echo: the window reduced once per window of data
//! (Linux's CWR state, by proportional rate reduction), and CWR on the
//! next new segment.

use super::{Ecn, Outgoing, Segment, TcpConn};
use crate::time::Instant;

/// The ECN codepoint of a packet that met congestion (RFC 3168 5).
const CE: u8 = 3;

impl TcpConn {
    /// The ECN flags of our SYN or SYN-ACK (RFC 3168 6.1.1): a first SYN
    /// asks with ECE and CWR when configured to (a retransmitted one does
    /// not, in case a middlebox drops ECN-setup SYNs: RFC 3168 6.1.1.1,
    /// Linux's `tcp_ecn_fallback`); a SYN-ACK agrees with ECE alone.
    pub(super) fn ecn_syn_flags(&mut self, synack: bool, first: bool) -> (bool, bool) {
        if synack {
            return (self.ecn.ok, false);
        }
        if first {
            self.ecn.ok = self.cfg.ecn == Ecn::On;
        }
        let ask = self.ecn.ok && first;
        (ask, ask)
    }

    /// The peer's SYN or SYN-ACK decides ECN: a SYN asks with ECE and CWR
    /// (and itself Not-ECT: RFC 3168 6.1.1 forbids ECT on a SYN), which we
    /// grant unless configured off; a SYN-ACK agrees with ECE without
    /// CWR to the request we made.
    pub(super) fn ecn_on_syn(&mut self, syn: &Segment<'_>) {
        self.ecn.ok = if syn.hdr.ack.is_some() {
            self.ecn.ok && syn.hdr.ece && !syn.hdr.cwr
        } else {
            self.cfg.ecn != Ecn::Off && syn.hdr.ece && syn.hdr.cwr && syn.ecn == 0
        };
    }

    /// A segment with data arrived (RFC 3168 6.1.3, Linux's
    /// `tcp_ecn_accept_cwr` and `tcp_ecn_check_ce`): a CWR ends our echo
    /// (and is acknowledged at once: the sender's window may be small);
    /// a CE mark starts it, and ACKs go at once for the next two
    /// segments; a Not-ECT segment after ECT ones (a retransmission, as
    /// likely as not) is acknowledged at once too.
    pub(super) fn ecn_on_data(&mut self, seg: &Segment<'_>) {
        if !self.ecn.ok {
            return;
        }
        if seg.hdr.cwr {
            self.ecn.echo = false;
            self.owed.ack_now = true;
        }
        match seg.ecn {
            0 if self.ecn.seen => self.quick_ack(2),
            0 => {}
            CE => {
                if !self.ecn.echo {
                    self.quick_ack(2);
                    self.ecn.echo = true;
                }
                self.ecn.seen = true;
            }
            _ => self.ecn.seen = true,
        }
    }

    /// Acknowledge the next `n` in-order segments at once (Linux's
    /// `tcp_enter_quickack_mode`), leaving interactive mode.
    fn quick_ack(&mut self, n: u32) {
        self.owed.quick_acks = self.owed.quick_acks.max(n);
        self.owed.pingpong = false;
    }

    /// An ACK with ECE (not a SYN's) on an ECN connection: congestion on
    /// the way to the peer (RFC 3168 6.1.2). Outside recovery and outside
    /// a reduction already under way, the window is reduced as for a loss
    /// (without retransmitting: Linux's `tcp_enter_cwr`), spread over the
    /// next round trip by PRR, and CWR goes out on the next new data.
    pub(super) fn ecn_on_echo(&mut self, now: Instant, seg: &Segment<'_>) {
        if !self.ecn.ok || !seg.hdr.ece || seg.hdr.syn {
            return;
        }
        if self.rec.in_recovery || self.rec.loss_until.is_some() || self.rec.cwr_until.is_some() {
            return;
        }
        self.begin_reduction(now);
        self.rec.cwr_until = Some(self.snd.nxt);
        self.ecn.cwr_owed = true;
        self.stats.ecn_reductions += 1;
    }

    /// The window was cut (recovery, a timeout): the peer learns it by
    /// CWR on the next new data, as after an echo (Linux queues it on
    /// every reduction), so it stops echoing a mark this cut answers.
    pub(super) fn ecn_window_cut(&mut self) {
        if self.ecn.ok {
            self.ecn.cwr_owed = true;
        }
    }

    /// After an ACK: a reduction ends once the ACKs pass what was in
    /// flight when it began (strictly past it, so the CWR has reached the
    /// receiver: Linux's exit from its CWR state); the window is then
    /// ssthresh.
    pub(super) fn ecn_end_reduction(&mut self, now: Instant) {
        if let Some(high) = self.rec.cwr_until {
            if self.snd.una.diff(high) > 0 {
                self.rec.cwr_until = None;
                self.rec.cc.on_recovery_end(now);
            }
        }
    }

    /// Whether a segment we send now carries ECE: while we echo a mark.
    pub(super) fn ecn_echoing(&self) -> bool {
        self.ecn.ok && self.ecn.echo
    }

    /// Mark a segment of data about to leave: when new, ECT(0) and the
    /// CWR owed (RFC 3168 6.1.2: retransmissions, pure ACKs and probes
    /// leave Not-ECT). In a segment the stack or the port cuts into
    /// frames, CWR rides on the first only.
    pub(super) fn ecn_mark(&mut self, seg: &mut Outgoing, new_data: bool) {
        if !self.ecn.ok || seg.hdr.syn {
            return;
        }
        if new_data && seg.payload_len > 0 {
            seg.ect = true;
            if std::mem::take(&mut self.ecn.cwr_owed) {
                seg.hdr.cwr = true;
            }
        }
    }
}
