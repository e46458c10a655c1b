//! The completer (rxe_comp.c): ACKs, NAKs, READ responses and atomic
//! answers for this QP's requests. Acknowledged work requests complete
//! in order; a sequence NAK, a gap in READ responses or an RNR NAK sends
//! the requester back; other NAKs end the QP.

use super::{LocalBuf, RcQp, Rx, psn_add, psn_diff, rnr_timer};
use crate::socket::rc::mr::{Access, MrTable};
use crate::socket::rc::verbs::{QpState, WcStatus};
use crate::time::Instant;
use crate::wire::rc::{NakCode, RcHeaders, RcOpcode, Syndrome};
use crate::wire::roce::PSN_MASK;

/// Retry counts of 7 mean "retry forever" for RNR.
const INFINITE_RNR: u8 = 7;

impl RcQp {
    /// Whether `psn` was sent and is not yet acknowledged.
    fn in_flight(&self, psn: u32) -> bool {
        psn_diff(psn, self.una) >= 0 && psn_diff(psn, self.sent_next) < 0
    }

    /// The peer has everything up to and including `psn`: complete the
    /// work requests that covers. An ACK past a READ whose responses are
    /// not all in means they were lost: go back and ask again.
    fn ack_through(&mut self, now: Instant, psn: u32) {
        let before = self.una;
        while let Some(w) = self.sq.front() {
            if w.fetches() && !w.complete() {
                let resume = psn_add(w.first_psn, w.read_done);
                if psn_diff(psn, resume) >= 0 {
                    self.una = resume;
                    self.retry(now);
                    return;
                }
                break;
            }
            if psn_diff(psn, w.last_psn()) < 0 {
                break;
            }
            let Some(w) = self.sq.pop_front() else { break };
            if self.req_idx == 0 {
                // Being resent (a go-back) and acknowledged meanwhile.
                self.req_off = 0;
            } else {
                self.req_idx -= 1;
            }
            self.push_send_wc(&w, WcStatus::Success, false);
        }
        let next = psn_add(psn, 1);
        if psn_diff(next, self.una) > 0 && psn_diff(next, self.sent_next) <= 0 {
            self.una = next;
        }
        // A go-back in progress never resends what is acknowledged now.
        if psn_diff(self.next_tx_psn(), self.una) < 0 {
            self.rewind(self.una);
        }
        if self.una != before {
            self.retry_left = self.retry_cnt;
            self.rnr_left = self.rnr_retry;
            self.rewound_for = None;
        }
        self.ack_deadline = (self.una != self.sent_next).then(|| now + self.timeout);
    }

    pub(super) fn on_response(
        &mut self,
        now: Instant,
        psn: u32,
        h: &RcHeaders<'_>,
        mrs: &mut MrTable,
    ) -> Rx {
        use RcOpcode::*;
        match h.opcode {
            // An atomic's answer (its NAKs come as plain Acknowledge).
            AtomicAcknowledge => match h.aeth {
                Some((Syndrome::Ack { .. }, _)) => self.on_fetch_response(now, psn, h, mrs),
                _ => Rx::Stale,
            },
            Acknowledge => {
                let Some((syn, _msn)) = h.aeth else {
                    return Rx::Stale;
                };
                self.on_aeth(now, psn, syn)
            }
            ReadResponseFirst | ReadResponseMiddle | ReadResponseLast | ReadResponseOnly => {
                self.on_fetch_response(now, psn, h, mrs)
            }
            _ => Rx::Stale,
        }
    }

    fn on_aeth(&mut self, now: Instant, psn: u32, syn: Syndrome) -> Rx {
        match syn {
            Syndrome::Ack { .. } => {
                if !self.in_flight(psn) {
                    self.stats.stale_acks += 1;
                    return Rx::Stale;
                }
                self.ack_through(now, psn);
            }
            Syndrome::RnrNak { timer } => {
                self.stats.rnr_naks_received += 1;
                if !self.in_flight(psn) {
                    return Rx::Stale;
                }
                self.ack_through(now, psn_add(psn, PSN_MASK));
                if self.state != QpState::Rts {
                    return Rx::Ok;
                }
                if self.rnr_left == 0 {
                    self.fail(WcStatus::RnrRetryExceeded);
                    return Rx::Ok;
                }
                if self.rnr_left != INFINITE_RNR {
                    self.rnr_left -= 1;
                }
                self.rewind(psn);
                self.rnr_until = Some(now + rnr_timer(timer));
                self.ack_deadline = None;
            }
            Syndrome::Nak(NakCode::PsnSequenceError) => {
                self.stats.seq_naks_received += 1;
                if !self.in_flight(psn) {
                    return Rx::Stale;
                }
                self.ack_through(now, psn_add(psn, PSN_MASK));
                // One go-back per PSN: a duplicated NAK does not resend
                // everything again.
                if self.state == QpState::Rts && self.una == psn && self.rewound_for != Some(psn) {
                    self.rewound_for = Some(psn);
                    self.retry(now);
                }
            }
            Syndrome::Nak(code) => {
                if !self.in_flight(psn) {
                    return Rx::Stale;
                }
                self.ack_through(now, psn_add(psn, PSN_MASK));
                self.stats.remote_errors += 1;
                self.fail(match code {
                    NakCode::RemoteAccessError => WcStatus::RemoteAccessError,
                    NakCode::RemoteOperationalError => WcStatus::RemoteOperationalError,
                    _ => WcStatus::RemoteInvalidRequest,
                });
            }
            Syndrome::Reserved(_) => return Rx::Stale,
        }
        Rx::Ok
    }

    /// A READ response or an atomic's answer.
    fn on_fetch_response(
        &mut self,
        now: Instant,
        psn: u32,
        h: &RcHeaders<'_>,
        mrs: &mut MrTable,
    ) -> Rx {
        // Responses belong to the oldest READ or atomic not complete;
        // everything before it is implicitly acknowledged by them.
        let Some(i) = self
            .sq
            .iter()
            .take(self.req_idx)
            .position(|w| w.fetches() && !w.complete())
        else {
            self.stats.stale_acks += 1;
            return Rx::Stale;
        };
        let w = &self.sq[i];
        let expected = psn_add(w.first_psn, w.read_done);
        if psn != expected {
            if psn_diff(psn, expected) > 0 && self.rewound_for != Some(expected) {
                // A response was lost: ask again from it, once per gap.
                self.stats.read_gaps += 1;
                self.ack_through(now, psn_add(expected, PSN_MASK));
                self.una = expected;
                self.rewound_for = Some(expected);
                self.retry(now);
            } else {
                self.stats.stale_acks += 1;
            }
            return Rx::Stale;
        }
        let off = w.read_done as usize * self.pmtu;
        let orig;
        let data: &[u8] = match (w.op.is_atomic(), h.opcode, h.atomic_ack) {
            (true, RcOpcode::AtomicAcknowledge, Some(v)) => {
                // The value found, in host order (as rxe and RNICs place it).
                orig = v.to_ne_bytes();
                &orig
            }
            (false, op, _) if op != RcOpcode::AtomicAcknowledge => {
                let want = (w.len - off.min(w.len)).min(self.pmtu);
                let last = w.read_done + 1 == w.npkts;
                if h.payload.len() != want || h.opcode.is_last() != last {
                    self.stats.malformed += 1;
                    return Rx::Stale;
                }
                h.payload
            }
            _ => {
                self.stats.malformed += 1;
                return Rx::Stale;
            }
        };
        let LocalBuf::Sge(sge) = w.local else {
            return Rx::Stale;
        };
        if mrs
            .write(sge.lkey, sge.addr + off as u64, data, Access::LOCAL_WRITE)
            .is_err()
        {
            self.ack_through(now, psn_add(psn, PSN_MASK));
            self.fail(WcStatus::LocalProtectionError);
            return Rx::Ok;
        }
        self.sq[i].read_done += 1;
        self.stats.rx_bytes += data.len() as u64;
        self.ack_through(now, psn);
        Rx::Ok
    }
}
