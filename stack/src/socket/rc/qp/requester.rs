//! The requester (rxe_req.c): the send queue's work requests become
//! request packets, segmented at the path MTU with one PSN each (a READ
//! takes as many PSNs as its responses); go-back-N from a PSN; the local
//! ACK timeout and the RNR NAK timer.

use super::{BURST, LocalBuf, OutPacket, RcQp, psn_add, psn_diff};
use crate::error::Error;
use crate::socket::rc::mr::{Access, MrFault, MrTable};
use crate::socket::rc::verbs::{QpState, RcOp, WcStatus};
use crate::time::Instant;
use crate::wire::rc::RcOpcode;

/// Packets sent without AckReq before one asks for an ACK (rxe's
/// `RXE_MAX_PKT_PER_ACK`).
const MAX_PKT_PER_ACK: u32 = 64;

/// SEND's opcodes, and WRITE's: first, middle, last, last with
/// immediate, only, only with immediate.
const SEND_OPCODES: [RcOpcode; 6] = [
    RcOpcode::SendFirst,
    RcOpcode::SendMiddle,
    RcOpcode::SendLast,
    RcOpcode::SendLastImm,
    RcOpcode::SendOnly,
    RcOpcode::SendOnlyImm,
];
const WRITE_OPCODES: [RcOpcode; 6] = [
    RcOpcode::WriteFirst,
    RcOpcode::WriteMiddle,
    RcOpcode::WriteLast,
    RcOpcode::WriteLastImm,
    RcOpcode::WriteOnly,
    RcOpcode::WriteOnlyImm,
];

/// The opcode of a message's packet from its family (see
/// [`SEND_OPCODES`]): where it sits and whether the message carries
/// immediate data.
fn segment_opcode(family: [RcOpcode; 6], first: bool, last: bool, imm: bool) -> RcOpcode {
    let [f, m, l, l_imm, only, only_imm] = family;
    match (first, last, imm) {
        (true, true, false) => only,
        (true, true, true) => only_imm,
        (true, false, _) => f,
        (false, false, _) => m,
        (false, true, false) => l,
        (false, true, true) => l_imm,
    }
}

impl RcQp {
    pub(crate) fn on_timer(&mut self, now: Instant) {
        if self.rnr_until.is_some_and(|t| t <= now) {
            self.rnr_until = None;
        }
        if self.state != QpState::Rts {
            self.ack_deadline = None;
            return;
        }
        let Some(t) = self.ack_deadline else { return };
        if t > now {
            return;
        }
        if self.una == self.sent_next {
            self.ack_deadline = None;
            return;
        }
        self.stats.ack_timeouts += 1;
        self.retry(now);
    }

    /// Go back to `psn`: the next packet sent is the one that carries it.
    pub(super) fn rewind(&mut self, psn: u32) {
        self.noack_pkts = 0;
        for (i, w) in self.sq.iter().enumerate() {
            let d = psn_diff(psn, w.first_psn);
            if d >= 0 && (d as u32) < w.npkts {
                self.req_idx = i;
                self.req_off = if w.fetches() { w.read_done } else { d as u32 };
                return;
            }
        }
        self.req_idx = self.sq.len();
        self.req_off = 0;
    }

    /// A retry of everything from `una`, counted against the retry count.
    pub(super) fn retry(&mut self, now: Instant) {
        if self.retry_left == 0 {
            self.fail(WcStatus::RetryExceeded);
            return;
        }
        self.retry_left -= 1;
        self.rewind(self.una);
        self.ack_deadline = Some(now + self.timeout);
    }

    /// Send request packets from the send queue, from the next one due:
    /// at most a burst, within the window and the READs allowed out.
    /// Nothing while an RNR NAK's timer runs.
    pub(super) fn send_requests(
        &mut self,
        now: Instant,
        mrs: &MrTable,
        emit: &mut dyn FnMut(&OutPacket<'_>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        if self.state != QpState::Rts || self.rnr_until.is_some() {
            return Ok(());
        }
        let mut budget = BURST;
        while self.req_idx < self.sq.len() {
            if budget == 0 {
                self.more = true;
                break;
            }
            budget -= 1;
            let outstanding = psn_diff(self.next_tx_psn(), self.una);
            if outstanding > 0 && outstanding as u32 >= self.window {
                break;
            }
            let w = &self.sq[self.req_idx];
            if w.fetches() && self.reads_outstanding() >= self.max_rd_atomic {
                break;
            }
            let sent = self.emit_request(now, mrs, emit);
            match sent {
                Ok(()) => {}
                Err(Error::QueueFull) => return Err(Error::QueueFull),
                Err(_) => {
                    self.fail(WcStatus::LocalProtectionError);
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    pub(super) fn next_tx_psn(&self) -> u32 {
        match self.sq.get(self.req_idx) {
            Some(w) => psn_add(w.first_psn, self.req_off),
            None => self.post_psn,
        }
    }

    fn emit_request(
        &mut self,
        now: Instant,
        mrs: &MrTable,
        emit: &mut dyn FnMut(&OutPacket<'_>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        use RcOpcode::*;
        let pmtu = self.pmtu;
        let w = &self.sq[self.req_idx];
        let k = self.req_off;
        let psn = psn_add(w.first_psn, k);
        let (pkt, consumed) = if let RcOp::Read { remote_addr, rkey } = w.op {
            let off = k as usize * pmtu;
            let mut pkt = OutPacket::new(ReadRequest, psn);
            pkt.ack_req = true;
            pkt.hdrs.reth = Some((remote_addr + off as u64, rkey, (w.len - off) as u32));
            (pkt, w.npkts - k)
        } else if let RcOp::CompareSwap {
            remote_addr, rkey, ..
        }
        | RcOp::FetchAdd {
            remote_addr, rkey, ..
        } = w.op
        {
            let (opcode, swap_add, compare) = match w.op {
                RcOp::CompareSwap { compare, swap, .. } => (CompareSwap, swap, compare),
                RcOp::FetchAdd { add, .. } => (FetchAdd, add, 0),
                _ => unreachable!("matched above"),
            };
            let mut pkt = OutPacket::new(opcode, psn);
            pkt.ack_req = true;
            pkt.hdrs.atomic = Some((remote_addr, rkey, swap_add, compare));
            (pkt, 1)
        } else {
            let off = k as usize * pmtu;
            let end = (off + pmtu).min(w.len);
            let data: &[u8] = match &w.local {
                LocalBuf::Inline(v) => &v[off..end],
                LocalBuf::Sge(s) => mrs
                    .read(s.lkey, s.addr + off as u64, end - off, Access::NONE)
                    .map_err(|_: MrFault| Error::InvalidHandle)?,
            };
            let (first, last) = (k == 0, k + 1 == w.npkts);
            let (family, imm, target) = match w.op {
                RcOp::Send => (SEND_OPCODES, None, None),
                RcOp::SendImm(i) => (SEND_OPCODES, Some(i), None),
                RcOp::Write { remote_addr, rkey } => {
                    (WRITE_OPCODES, None, Some((remote_addr, rkey)))
                }
                RcOp::WriteImm {
                    remote_addr,
                    rkey,
                    imm,
                } => (WRITE_OPCODES, Some(imm), Some((remote_addr, rkey))),
                RcOp::Read { .. } | RcOp::CompareSwap { .. } | RcOp::FetchAdd { .. } => {
                    unreachable!("handled above")
                }
            };
            let opcode = segment_opcode(family, first, last, imm.is_some());
            // RETH on a WRITE's first packet; immediate data on the last.
            let reth = target
                .filter(|_| first)
                .map(|(addr, rkey)| (addr, rkey, w.len as u32));
            let imm = imm.filter(|_| last);
            // Also when the packet fills a small window: otherwise
            // nothing would ask for the ACK that opens it again.
            let ack_req = last || self.noack_pkts + 1 >= MAX_PKT_PER_ACK.min(self.window);
            let mut pkt = OutPacket::new(opcode, psn);
            pkt.ack_req = ack_req;
            pkt.solicited = last && w.solicited;
            pkt.hdrs.reth = reth;
            pkt.hdrs.imm = imm;
            pkt.hdrs.payload = data;
            (pkt, 1)
        };
        emit(&pkt)?;
        let bytes = pkt.hdrs.payload.len() as u64;
        let ack_req = pkt.ack_req;
        let is_read = self.sq[self.req_idx].fetches();
        self.noack_pkts = if ack_req { 0 } else { self.noack_pkts + 1 };
        let end = psn_add(psn, consumed);
        if psn_diff(psn, self.sent_next) < 0 {
            self.stats.retransmits += 1;
        } else {
            self.stats.tx_bytes += bytes;
        }
        if psn_diff(end, self.sent_next) > 0 {
            self.sent_next = end;
        }
        self.stats.tx_packets += 1;
        if is_read || self.req_off + 1 == self.sq[self.req_idx].npkts {
            self.req_idx += 1;
            self.req_off = 0;
        } else {
            self.req_off += 1;
        }
        if self.ack_deadline.is_none() {
            self.ack_deadline = Some(now + self.timeout);
        }
        Ok(())
    }
}
