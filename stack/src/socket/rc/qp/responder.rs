//! The responder (rxe_resp.c): requests from the peer, checked against
//! the expected PSN (a gap NAKed once, duplicates acknowledged again, a
//! READ replayed, an atomic answered from its saved result), SENDs placed
//! in posted receives (an RNR NAK when there is none), WRITEs, READs and
//! atomics executed against memory regions; and what is owed back, in
//! PSN order: coalesced ACKs, NAKs, READ responses, atomic answers.

use super::{BURST, OutPacket, RcQp, RespCtx, RespItem, Rx, psn_add, psn_diff};
use crate::error::Error;
use crate::socket::rc::mr::{Access, MrTable};
use crate::socket::rc::verbs::{WcOpcode, WcStatus};
use crate::wire::rc::{NakCode, RcHeaders, RcOpcode, Syndrome};
use crate::wire::roce::PSN_MASK;

/// The AETH credit field value for "no credit limit" (rxe's).
const CREDITS_UNLIMITED: u8 = 0x1f;

/// An ACK or NAK (Acknowledge), or an atomic's answer (AtomicAcknowledge
/// with the value found).
fn ack_packet(psn: u32, syndrome: Syndrome, msn: u32, orig: Option<u64>) -> OutPacket<'static> {
    let opcode = if orig.is_some() {
        RcOpcode::AtomicAcknowledge
    } else {
        RcOpcode::Acknowledge
    };
    let mut pkt = OutPacket::new(opcode, psn);
    pkt.hdrs.aeth = Some((syndrome, msn));
    pkt.hdrs.atomic_ack = orig;
    pkt
}

impl RcQp {
    pub(super) fn queue_ack(&mut self, psn: u32, syndrome: Syndrome) {
        if let (Some(RespItem::Ack { .. }), Syndrome::Ack { .. }) = (self.out.back(), syndrome) {
            self.out.pop_back();
        }
        self.out.push_back(RespItem::Ack { psn, syndrome });
    }

    fn nak(&mut self, psn: u32, code: NakCode) -> Rx {
        self.queue_ack(psn, Syndrome::Nak(code));
        self.stats.naks_sent += 1;
        // Invalid request, remote access and operational errors end the
        // connection (IBTA 9.9.3.1.3; rxe moves the QP to error).
        self.rq_flush_and_error();
        Rx::Ok
    }

    pub(super) fn rq_flush_and_error(&mut self) {
        let out = std::mem::take(&mut self.out);
        self.fail(WcStatus::Flushed);
        // The NAK still leaves.
        self.out = out
            .into_iter()
            .filter(|i| matches!(i, RespItem::Ack { .. }))
            .collect();
        self.reads_queued = 0;
    }

    pub(super) fn on_request(
        &mut self,
        psn: u32,
        ack_req: bool,
        h: &RcHeaders<'_>,
        mrs: &mut MrTable,
    ) -> Rx {
        use RcOpcode::*;
        let d = psn_diff(psn, self.epsn);
        if d > 0 {
            // A gap: ask for the missing packet once until it comes.
            self.stats.out_of_sequence += 1;
            if !self.nak_sent {
                self.nak_sent = true;
                self.stats.seq_naks_sent += 1;
                self.queue_ack(self.epsn, Syndrome::Nak(NakCode::PsnSequenceError));
            }
            return Rx::Ok;
        }
        if d < 0 {
            return self.on_duplicate(psn, h, mrs);
        }
        // In sequence: the opcode must continue what is in progress.
        let op = h.opcode;
        let continuing = matches!(
            op,
            SendMiddle | SendLast | SendLastImm | WriteMiddle | WriteLast | WriteLastImm
        );
        let ok_seq = match self.ctx {
            Some(RespCtx::Send { .. }) => matches!(op, SendMiddle | SendLast | SendLastImm),
            Some(RespCtx::Write { .. }) => matches!(op, WriteMiddle | WriteLast | WriteLastImm),
            None => !continuing,
        };
        if !ok_seq {
            return self.nak(psn, NakCode::InvalidRequest);
        }
        let n = h.payload.len();
        let full = op.is_first() || op.is_middle();
        if (full && n != self.pmtu) || n > self.pmtu {
            return self.nak(psn, NakCode::InvalidRequest);
        }
        let mut advance = 1;
        match op {
            SendFirst | SendOnly | SendOnlyImm | SendMiddle | SendLast | SendLastImm => {
                let (recv, off) = match self.ctx {
                    Some(RespCtx::Send { recv, off }) => (recv, off),
                    _ => match self.rq.pop_front() {
                        Some(r) => (r, 0),
                        None => return self.rnr(psn),
                    },
                };
                if off + n > recv.sge.len as usize {
                    // The message does not fit the posted buffer.
                    self.push_recv_wc(
                        recv.wr_id,
                        WcOpcode::Recv,
                        WcStatus::LocalLengthError,
                        off + n,
                        None,
                    );
                    self.ctx = None;
                    return self.nak(psn, NakCode::InvalidRequest);
                }
                if mrs
                    .write(
                        recv.sge.lkey,
                        recv.sge.addr + off as u64,
                        h.payload,
                        Access::LOCAL_WRITE,
                    )
                    .is_err()
                {
                    self.push_recv_wc(
                        recv.wr_id,
                        WcOpcode::Recv,
                        WcStatus::LocalProtectionError,
                        0,
                        None,
                    );
                    self.ctx = None;
                    return self.nak(psn, NakCode::RemoteOperationalError);
                }
                if op.is_last() {
                    self.ctx = None;
                    self.push_recv_wc(
                        recv.wr_id,
                        WcOpcode::Recv,
                        WcStatus::Success,
                        off + n,
                        h.imm,
                    );
                    self.msn = psn_add(self.msn, 1);
                } else {
                    self.ctx = Some(RespCtx::Send { recv, off: off + n });
                }
            }
            WriteFirst | WriteOnly | WriteOnlyImm | WriteMiddle | WriteLast | WriteLastImm => {
                let (va, rkey, len, off) = match (self.ctx, h.reth) {
                    (Some(RespCtx::Write { va, rkey, len, off }), _) => (va, rkey, len, off),
                    (None, Some((va, rkey, len))) => {
                        let len = len as usize;
                        if let Err(f) = mrs.check(rkey, va, len, Access::REMOTE_WRITE) {
                            self.stats.access_errors += 1;
                            tracing::debug!(qpn = self.qpn, ?f, "rc write refused");
                            return self.nak(psn, NakCode::RemoteAccessError);
                        }
                        (va, rkey, len, 0)
                    }
                    _ => return self.nak(psn, NakCode::InvalidRequest),
                };
                let last = op.is_last();
                if off + n > len || (last && off + n != len) {
                    return self.nak(psn, NakCode::InvalidRequest);
                }
                // WRITE with immediate consumes a receive: without one,
                // nothing of this packet is placed.
                let recv = if op.has_imm() {
                    match self.rq.pop_front() {
                        Some(r) => Some(r),
                        None => {
                            if op == WriteOnlyImm {
                                self.ctx = None;
                            } else {
                                self.ctx = Some(RespCtx::Write { va, rkey, len, off });
                            }
                            return self.rnr(psn);
                        }
                    }
                } else {
                    None
                };
                if mrs
                    .write(rkey, va + off as u64, h.payload, Access::REMOTE_WRITE)
                    .is_err()
                {
                    self.stats.access_errors += 1;
                    return self.nak(psn, NakCode::RemoteAccessError);
                }
                self.stats.rx_bytes += n as u64;
                if last {
                    self.ctx = None;
                    self.msn = psn_add(self.msn, 1);
                    if let Some(r) = recv {
                        self.push_recv_wc(
                            r.wr_id,
                            WcOpcode::RecvRdmaWithImm,
                            WcStatus::Success,
                            len,
                            h.imm,
                        );
                    }
                } else {
                    self.ctx = Some(RespCtx::Write {
                        va,
                        rkey,
                        len,
                        off: off + n,
                    });
                }
            }
            ReadRequest => {
                let Some((va, rkey, len)) = h.reth else {
                    return self.nak(psn, NakCode::InvalidRequest);
                };
                let len = len as usize;
                if self.reads_queued >= self.max_dest_rd_atomic {
                    return self.nak(psn, NakCode::InvalidRequest);
                }
                if let Err(f) = mrs.check(rkey, va, len, Access::REMOTE_READ) {
                    self.stats.access_errors += 1;
                    tracing::debug!(qpn = self.qpn, ?f, "rc read refused");
                    return self.nak(psn, NakCode::RemoteAccessError);
                }
                advance = self.npkts(len);
                self.reads_queued += 1;
                self.out.push_back(RespItem::Read {
                    psn,
                    va,
                    rkey,
                    len,
                    next: 0,
                });
                self.msn = psn_add(self.msn, 1);
            }
            CompareSwap | FetchAdd => {
                let Some((va, rkey, swap_add, compare)) = h.atomic else {
                    return self.nak(psn, NakCode::InvalidRequest);
                };
                // An atomic's target is 8 aligned bytes (IBTA 9.4.5).
                if va % 8 != 0 {
                    return self.nak(psn, NakCode::InvalidRequest);
                }
                let cur = match mrs.read(rkey, va, 8, Access::REMOTE_ATOMIC) {
                    Ok(b) => {
                        let mut w = [0u8; 8];
                        w.copy_from_slice(b);
                        u64::from_ne_bytes(w)
                    }
                    Err(f) => {
                        self.stats.access_errors += 1;
                        tracing::debug!(qpn = self.qpn, ?f, "rc atomic refused");
                        return self.nak(psn, NakCode::RemoteAccessError);
                    }
                };
                let new = match op {
                    CompareSwap if cur == compare => swap_add,
                    CompareSwap => cur,
                    _ => cur.wrapping_add(swap_add),
                };
                if mrs
                    .write(rkey, va, &new.to_ne_bytes(), Access::REMOTE_ATOMIC)
                    .is_err()
                {
                    return self.nak(psn, NakCode::RemoteAccessError);
                }
                // Kept for a duplicate: an atomic runs once, its answer
                // may be sent again.
                if self.atomics_done.len() >= self.max_dest_rd_atomic {
                    self.atomics_done.pop_front();
                }
                self.atomics_done.push_back((psn, cur));
                self.out.push_back(RespItem::Atomic { psn, orig: cur });
                self.msn = psn_add(self.msn, 1);
            }
            _ => return Rx::Stale,
        }
        self.stats.rx_packets += 1;
        if matches!(
            op,
            SendFirst | SendOnly | SendOnlyImm | SendMiddle | SendLast | SendLastImm
        ) {
            self.stats.rx_bytes += n as u64;
        }
        self.epsn = psn_add(self.epsn, advance);
        self.nak_sent = false;
        if ack_req && !matches!(op, ReadRequest | CompareSwap | FetchAdd) {
            self.queue_ack(
                psn,
                Syndrome::Ack {
                    credits: CREDITS_UNLIMITED,
                },
            );
        }
        Rx::Ok
    }

    fn rnr(&mut self, psn: u32) -> Rx {
        self.stats.rnr_naks_sent += 1;
        self.queue_ack(
            psn,
            Syndrome::RnrNak {
                timer: self.min_rnr_timer,
            },
        );
        Rx::Ok
    }

    /// A request already executed: acknowledge it again, or replay a READ.
    fn on_duplicate(&mut self, psn: u32, h: &RcHeaders<'_>, mrs: &MrTable) -> Rx {
        self.stats.duplicates += 1;
        if matches!(h.opcode, RcOpcode::CompareSwap | RcOpcode::FetchAdd) {
            // Answered again from the saved result, never run twice.
            let Some(&(_, orig)) = self.atomics_done.iter().find(|(p, _)| *p == psn) else {
                return Rx::Stale;
            };
            self.out.push_back(RespItem::Atomic { psn, orig });
            return Rx::Ok;
        }
        if h.opcode == RcOpcode::ReadRequest {
            let Some((va, rkey, len)) = h.reth else {
                return Rx::Stale;
            };
            let len = len as usize;
            // Only a replay that fits the window of what was executed.
            if psn_diff(psn_add(psn, self.npkts(len)), self.epsn) > 0
                || mrs.check(rkey, va, len, Access::REMOTE_READ).is_err()
            {
                return Rx::Stale;
            }
            // The requester went back to `psn` and asks again for all it
            // sent from there: responses still owed from `psn` on are
            // superseded (a stream cut short at `psn`, later ones and
            // later ACKs dropped: they would pass the replay).
            let pmtu = self.pmtu;
            let mut dropped = 0;
            self.out.retain_mut(|item| match item {
                RespItem::Read {
                    psn: p,
                    len: l,
                    next,
                    ..
                } => {
                    let d = psn_diff(psn, *p);
                    if d <= 0 {
                        dropped += 1;
                        return false;
                    }
                    *l = (*l).min(d as usize * pmtu);
                    if *next as usize * pmtu >= *l {
                        dropped += 1;
                        return false;
                    }
                    true
                }
                RespItem::Ack { psn: a, .. } | RespItem::Atomic { psn: a, .. } => {
                    psn_diff(*a, psn) < 0
                }
            });
            self.reads_queued -= dropped;
            if self.reads_queued >= self.max_dest_rd_atomic {
                return Rx::Stale;
            }
            self.reads_queued += 1;
            self.out.push_back(RespItem::Read {
                psn,
                va,
                rkey,
                len,
                next: 0,
            });
            return Rx::Ok;
        }
        self.queue_ack(
            psn_add(self.epsn, PSN_MASK),
            Syndrome::Ack {
                credits: CREDITS_UNLIMITED,
            },
        );
        Rx::Ok
    }

    pub(super) fn emit_responses(
        &mut self,
        mrs: &MrTable,
        emit: &mut dyn FnMut(&OutPacket<'_>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        use RcOpcode::*;
        let mut budget = BURST;
        while let Some(item) = self.out.front_mut() {
            match *item {
                RespItem::Ack { psn, syndrome } => {
                    emit(&ack_packet(psn, syndrome, self.msn, None))?;
                    self.stats.acks_sent += 1;
                    self.out.pop_front();
                }
                RespItem::Atomic { psn, orig } => {
                    let ack = Syndrome::Ack {
                        credits: CREDITS_UNLIMITED,
                    };
                    emit(&ack_packet(psn, ack, self.msn, Some(orig)))?;
                    self.stats.acks_sent += 1;
                    self.out.pop_front();
                }
                RespItem::Read {
                    psn,
                    va,
                    rkey,
                    len,
                    next,
                } => {
                    if budget == 0 {
                        return Ok(());
                    }
                    let n = len.div_ceil(self.pmtu).max(1) as u32;
                    let off = next as usize * self.pmtu;
                    let end = (off + self.pmtu).min(len);
                    let data = match mrs.read(rkey, va + off as u64, end - off, Access::REMOTE_READ)
                    {
                        Ok(d) => d,
                        Err(_) => {
                            // The region went away under the READ.
                            self.out.pop_front();
                            self.reads_queued -= 1;
                            self.queue_ack(
                                psn_add(psn, next),
                                Syndrome::Nak(NakCode::RemoteAccessError),
                            );
                            continue;
                        }
                    };
                    let opcode = match (next == 0, next + 1 == n) {
                        (true, true) => ReadResponseOnly,
                        (true, false) => ReadResponseFirst,
                        (false, false) => ReadResponseMiddle,
                        (false, true) => ReadResponseLast,
                    };
                    let mut pkt = OutPacket::new(opcode, psn_add(psn, next));
                    pkt.hdrs.aeth = opcode.has_aeth().then_some((
                        Syndrome::Ack {
                            credits: CREDITS_UNLIMITED,
                        },
                        self.msn,
                    ));
                    pkt.hdrs.payload = data;
                    emit(&pkt)?;
                    budget -= 1;
                    self.stats.tx_packets += 1;
                    self.stats.tx_bytes += data.len() as u64;
                    if next + 1 == n {
                        self.out.pop_front();
                        self.reads_queued -= 1;
                    } else if let Some(RespItem::Read { next, .. }) = self.out.front_mut() {
                        *next += 1;
                    }
                }
            }
        }
        Ok(())
    }
}
