//! One RC queue pair's state machine, split as Linux rxe splits it
//! (drivers/infiniband/sw/rxe), following IBTA Vol. 1 chapter 9 as rxe
//! applies it:
//! - here, the QP itself: state, attributes, the send, receive and
//!   completion queues, PSN arithmetic, posting, the error state, and the
//!   two calls the table makes per packet and per poll (`on_packet`,
//!   `poll_transmit`);
//! - `requester` (rxe_req.c): work requests segmented into request
//!   packets (one PSN each), go-back-N, the ACK timeout and RNR timers;
//! - `completer` (rxe_comp.c): ACKs, NAKs, READ responses and atomic
//!   answers, which complete the send queue;
//! - `responder` (rxe_resp.c): incoming requests (PSN checks, duplicates,
//!   RNR NAKs, RECV placement, WRITE, READ and atomics against memory
//!   regions) and the ACKs and responses owed for them.
//!
//! Sans-IO: it takes `now` and parsed packets and hands packets to an
//! emit callback; the table around it (`RcTable` in the parent module)
//! puts them on the wire.

mod completer;
mod requester;
mod responder;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::time::Duration;

use super::mr::{Access, MrTable};
use super::verbs::{
    ATOMIC_LEN, Local, MAX_MSG, QpState, RcDest, RcError, RcOp, RcQpConfig, RcSendWr, Sge, Wc,
    WcOpcode, WcStatus,
};
use crate::error::Error;
use crate::stats::RcQpStats;
use crate::time::Instant;
use crate::wire::rc::{RcHeaders, RcOpcode, Syndrome};
use crate::wire::roce::PSN_MASK;

/// Request packets, and READ responses, one QP emits per poll, so one
/// large message does not starve other QPs or fill the device alone.
const BURST: u32 = 64;

pub(crate) fn psn_add(a: u32, n: u32) -> u32 {
    a.wrapping_add(n) & PSN_MASK
}

/// `a - b` in 24-bit sequence space: negative when `a` is behind.
pub(crate) fn psn_diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b) << 8) as i32) >> 8
}

/// The RNR NAK timer an encoded value stands for (IBTA Vol. 1 table 45).
pub fn rnr_timer(code: u8) -> Duration {
    const US: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    Duration::from_micros(u64::from(US[usize::from(code & 31)]))
}

/// The local ACK timeout an encoded value stands for: 4.096 µs × 2^t
/// (0 means none: it is taken as the largest, 2^31).
pub fn ack_timeout(t: u8) -> Duration {
    let t = if t == 0 { 31 } else { t.min(31) };
    Duration::from_nanos(4096u64 << t)
}

/// A send work request's data source as kept in the send queue.
#[derive(Debug)]
enum LocalBuf {
    Sge(Sge),
    Inline(Vec<u8>),
}

#[derive(Debug)]
struct SendWqe {
    wr_id: u64,
    op: RcOp,
    local: LocalBuf,
    len: usize,
    signaled: bool,
    solicited: bool,
    first_psn: u32,
    npkts: u32,
    /// READ: response packets placed so far.
    read_done: u32,
}

impl SendWqe {
    fn last_psn(&self) -> u32 {
        psn_add(self.first_psn, self.npkts - 1)
    }

    /// READ or atomic: complete only when its response is in.
    fn fetches(&self) -> bool {
        self.op.fetches()
    }

    fn complete(&self) -> bool {
        !self.fetches() || self.read_done == self.npkts
    }

    fn wc_opcode(&self) -> WcOpcode {
        match self.op {
            RcOp::Send | RcOp::SendImm(_) => WcOpcode::Send,
            RcOp::Write { .. } | RcOp::WriteImm { .. } => WcOpcode::RdmaWrite,
            RcOp::Read { .. } => WcOpcode::RdmaRead,
            RcOp::CompareSwap { .. } => WcOpcode::CompareSwap,
            RcOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct RecvWqe {
    wr_id: u64,
    sge: Sge,
}

/// A multi-packet request the responder is in the middle of.
#[derive(Debug, Clone, Copy)]
enum RespCtx {
    Send {
        recv: RecvWqe,
        off: usize,
    },
    Write {
        va: u64,
        rkey: u32,
        len: usize,
        off: usize,
    },
}

/// What the responder owes its peer, in PSN order (an ACK must not pass
/// the READ responses of earlier requests).
#[derive(Debug, Clone, Copy)]
enum RespItem {
    Ack {
        psn: u32,
        syndrome: Syndrome,
    },
    /// An atomic's answer: the value it found.
    Atomic {
        psn: u32,
        orig: u64,
    },
    Read {
        psn: u32,
        va: u64,
        rkey: u32,
        len: usize,
        next: u32,
    },
}

/// A packet the QP wants on the wire (BTH fields and what follows it).
#[derive(Debug)]
pub(crate) struct OutPacket<'a> {
    pub opcode: RcOpcode,
    pub psn: u32,
    pub ack_req: bool,
    pub solicited: bool,
    pub hdrs: RcHeaders<'a>,
}

impl OutPacket<'_> {
    /// A packet of `opcode` at `psn` with no extended header and no
    /// payload, AckReq and solicited event clear: what the requester's
    /// and the responder's packets fill in from.
    fn new(opcode: RcOpcode, psn: u32) -> Self {
        OutPacket {
            opcode,
            psn,
            ack_req: false,
            solicited: false,
            hdrs: RcHeaders {
                opcode,
                reth: None,
                atomic: None,
                aeth: None,
                atomic_ack: None,
                imm: None,
                payload: &[],
            },
        }
    }
}

/// One RC queue pair.
#[derive(Debug)]
pub(crate) struct RcQp {
    pub(crate) qpn: u32,
    pub(crate) state: QpState,
    pub(crate) dest: Option<RcDest>,
    pmtu: usize,
    timeout: Duration,
    retry_cnt: u8,
    rnr_retry: u8,
    min_rnr_timer: u8,
    max_rd_atomic: usize,
    max_dest_rd_atomic: usize,
    window: u32,
    /// The traffic class of its packets ([`RcQpConfig::traffic_class`]).
    pub(crate) tclass: u8,
    max_send: usize,
    max_recv: usize,
    // ---- requester / completer
    /// The PSN the QP started sending with.
    init_psn: u32,
    sq: VecDeque<SendWqe>,
    /// PSN the next posted work request starts at.
    post_psn: u32,
    /// Next packet to send: `sq[req_idx]`, packet `req_off` of it.
    req_idx: usize,
    req_off: u32,
    /// Oldest PSN not acknowledged.
    una: u32,
    /// One past the highest PSN ever sent.
    sent_next: u32,
    noack_pkts: u32,
    retry_left: u8,
    rnr_left: u8,
    ack_deadline: Option<Instant>,
    rnr_until: Option<Instant>,
    /// The PSN a gap in READ responses last rewound to (one rewind per gap).
    rewound_for: Option<u32>,
    send_cqes: usize,
    // ---- responder
    epsn: u32,
    msn: u32,
    rq: VecDeque<RecvWqe>,
    recv_cqes: usize,
    ctx: Option<RespCtx>,
    nak_sent: bool,
    out: VecDeque<RespItem>,
    reads_queued: usize,
    /// The last atomics executed: (PSN, value found), for duplicates.
    atomics_done: VecDeque<(u32, u64)>,
    // ---- both
    /// The last poll stopped at its budget with packets still to send.
    more: bool,
    cq: VecDeque<Wc>,
    pub(crate) stats: RcQpStats,
}

/// The result of looking at a packet: what the table counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rx {
    /// Taken (possibly as a duplicate or with a NAK sent).
    Ok,
    /// Dropped: the QP is not connected, or in error.
    BadState,
    /// Dropped: a response that matches nothing outstanding, or a packet
    /// that breaks the rules without a NAK to send for it.
    Stale,
}

impl RcQp {
    pub(crate) fn new(qpn: u32, cfg: &RcQpConfig, pmtu: usize, init_psn: u32) -> Self {
        RcQp {
            qpn,
            state: QpState::Init,
            dest: None,
            pmtu,
            timeout: ack_timeout(cfg.timeout),
            retry_cnt: cfg.retry_cnt.min(7),
            rnr_retry: cfg.rnr_retry.min(7),
            min_rnr_timer: cfg.min_rnr_timer & 31,
            max_rd_atomic: cfg.max_rd_atomic.max(1),
            max_dest_rd_atomic: cfg.max_dest_rd_atomic.max(1),
            window: cfg.window.clamp(1, 1 << 22),
            tclass: cfg.traffic_class,
            max_send: cfg.max_send_wr.max(1),
            max_recv: cfg.max_recv_wr.max(1),
            init_psn,
            sq: VecDeque::new(),
            post_psn: init_psn,
            req_idx: 0,
            req_off: 0,
            una: init_psn,
            sent_next: init_psn,
            noack_pkts: 0,
            retry_left: cfg.retry_cnt.min(7),
            rnr_left: cfg.rnr_retry.min(7),
            ack_deadline: None,
            rnr_until: None,
            rewound_for: None,
            send_cqes: 0,
            epsn: 0,
            msn: 0,
            rq: VecDeque::new(),
            recv_cqes: 0,
            ctx: None,
            nak_sent: false,
            out: VecDeque::new(),
            reads_queued: 0,
            atomics_done: VecDeque::new(),
            more: false,
            cq: VecDeque::new(),
            stats: RcQpStats::default(),
        }
    }

    pub(crate) fn pmtu(&self) -> usize {
        self.pmtu
    }

    pub(crate) fn connect(&mut self, dest: RcDest) {
        self.epsn = dest.psn & PSN_MASK;
        self.dest = Some(dest);
        self.state = QpState::Rts;
    }

    fn npkts(&self, len: usize) -> u32 {
        len.div_ceil(self.pmtu).max(1) as u32
    }

    // ------------------------------------------------------------- posting

    pub(crate) fn post_send(&mut self, wr: &RcSendWr<'_>, mrs: &MrTable) -> Result<(), RcError> {
        if self.state == QpState::Error {
            return Err(RcError::QpError);
        }
        if self.sq.len() + self.send_cqes >= self.max_send {
            return Err(RcError::QueueFull);
        }
        let (local, len) = match wr.local {
            Local::Inline(b) => {
                if wr.op.fetches() {
                    return Err(RcError::InlineRead);
                }
                (LocalBuf::Inline(b.to_vec()), b.len())
            }
            Local::Sge(sge) => {
                let need = if wr.op.fetches() {
                    Access::LOCAL_WRITE
                } else {
                    Access::NONE
                };
                mrs.check(sge.lkey, sge.addr, sge.len as usize, need)
                    .map_err(|_| RcError::LocalProtection)?;
                (LocalBuf::Sge(sge), sge.len as usize)
            }
        };
        if len > MAX_MSG {
            return Err(RcError::TooLarge(len));
        }
        if let RcOp::CompareSwap { remote_addr, .. } | RcOp::FetchAdd { remote_addr, .. } = wr.op {
            if len != ATOMIC_LEN || remote_addr % 8 != 0 {
                return Err(RcError::AtomicShape);
            }
        }
        let npkts = self.npkts(len);
        let first_psn = self.post_psn;
        self.post_psn = psn_add(first_psn, npkts);
        self.sq.push_back(SendWqe {
            wr_id: wr.wr_id,
            op: wr.op,
            local,
            len,
            signaled: wr.signaled,
            solicited: wr.solicited,
            first_psn,
            npkts,
            read_done: 0,
        });
        Ok(())
    }

    pub(crate) fn post_recv(&mut self, wr_id: u64, sge: Sge, mrs: &MrTable) -> Result<(), RcError> {
        if self.state == QpState::Error {
            return Err(RcError::QpError);
        }
        if self.rq.len() + self.recv_cqes >= self.max_recv {
            return Err(RcError::QueueFull);
        }
        mrs.check(sge.lkey, sge.addr, sge.len as usize, Access::LOCAL_WRITE)
            .map_err(|_| RcError::LocalProtection)?;
        self.rq.push_back(RecvWqe { wr_id, sge });
        Ok(())
    }

    pub(crate) fn poll_cq(&mut self, max: usize, out: &mut Vec<Wc>) -> usize {
        let n = max.min(self.cq.len());
        for c in self.cq.drain(..n) {
            match c.opcode {
                WcOpcode::Recv | WcOpcode::RecvRdmaWithImm => self.recv_cqes -= 1,
                _ => self.send_cqes -= 1,
            }
            out.push(c);
        }
        n
    }

    pub(crate) fn cq_len(&self) -> usize {
        self.cq.len()
    }

    /// Work requests posted and not completed (send, receive).
    pub(crate) fn outstanding(&self) -> (usize, usize) {
        (self.sq.len(), self.rq.len())
    }

    /// PSNs: first, next to post, oldest unacknowledged, expected from the peer.
    pub(crate) fn psns(&self) -> (u32, u32, u32, u32) {
        (self.init_psn, self.post_psn, self.una, self.epsn)
    }

    /// READs sent whose responses are not all in.
    pub(crate) fn reads_outstanding(&self) -> usize {
        self.sq
            .iter()
            .take(self.req_idx)
            .filter(|w| w.fetches() && !w.complete())
            .count()
    }

    // -------------------------------------------------------------- timers

    /// When [`on_timer`](Self::on_timer) has work.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match (self.ack_deadline, self.rnr_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether packets are owed right now (a READ response cut short by
    /// the per-poll budget, or a device that was full).
    pub(crate) fn wants_tx_now(&self) -> bool {
        !self.out.is_empty() || self.more
    }

    /// Whether the QP has packets it could send now.
    pub(crate) fn wants_tx(&self) -> bool {
        !self.out.is_empty()
            || (self.state == QpState::Rts
                && self.rnr_until.is_none()
                && self.req_idx < self.sq.len())
    }

    // -------------------------------------------------------------- errors

    /// Move to the error state: the oldest send work request completes
    /// with `status`, everything else posted is flushed.
    fn fail(&mut self, status: WcStatus) {
        if self.state == QpState::Error {
            return;
        }
        self.state = QpState::Error;
        self.stats.errors += 1;
        let mut first = true;
        while let Some(w) = self.sq.pop_front() {
            let s = if first { status } else { WcStatus::Flushed };
            first = false;
            self.push_send_wc(&w, s, true);
        }
        self.req_idx = 0;
        self.req_off = 0;
        // A SEND in progress holds the oldest receive: it is flushed first.
        if let Some(RespCtx::Send { recv, .. }) = self.ctx.take() {
            self.push_recv_wc(recv.wr_id, WcOpcode::Recv, WcStatus::Flushed, 0, None);
        }
        while let Some(r) = self.rq.pop_front() {
            self.push_recv_wc(r.wr_id, WcOpcode::Recv, WcStatus::Flushed, 0, None);
        }
        self.ack_deadline = None;
        self.rnr_until = None;
    }

    /// The app destroyed the QP or asked for the error state.
    pub(crate) fn set_error(&mut self) {
        self.out.clear();
        self.reads_queued = 0;
        self.fail(WcStatus::Flushed);
    }

    fn push_send_wc(&mut self, w: &SendWqe, status: WcStatus, force: bool) {
        if !(w.signaled || force || status != WcStatus::Success) {
            return;
        }
        self.send_cqes += 1;
        self.cq.push_back(Wc {
            wr_id: w.wr_id,
            opcode: w.wc_opcode(),
            status,
            byte_len: w.len,
            imm: None,
            qp_num: self.qpn,
        });
    }

    fn push_recv_wc(
        &mut self,
        wr_id: u64,
        opcode: WcOpcode,
        status: WcStatus,
        len: usize,
        imm: Option<u32>,
    ) {
        self.recv_cqes += 1;
        self.cq.push_back(Wc {
            wr_id,
            opcode,
            status,
            byte_len: len,
            imm,
            qp_num: self.qpn,
        });
    }

    // -------------------------------------------------------------- receive

    /// A packet for this QP from its peer: a request goes to the
    /// responder, anything else (ACKs, NAKs, responses) to the completer.
    pub(crate) fn on_packet(
        &mut self,
        now: Instant,
        psn: u32,
        ack_req: bool,
        h: &RcHeaders<'_>,
        mrs: &mut MrTable,
    ) -> Rx {
        if self.state != QpState::Rts {
            return Rx::BadState;
        }
        if h.opcode.is_request() {
            self.on_request(psn, ack_req, h, mrs)
        } else {
            self.on_response(now, psn, h, mrs)
        }
    }

    // ------------------------------------------------------------- transmit

    /// Hand every packet the QP may send now to `emit`, responder's owed
    /// packets first. `emit` returns `Err(QueueFull)` when the device has
    /// no room: the packet is kept for the next poll.
    pub(crate) fn poll_transmit(
        &mut self,
        now: Instant,
        mrs: &MrTable,
        emit: &mut dyn FnMut(&OutPacket<'_>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        self.more = false;
        self.emit_responses(mrs, emit)?;
        self.send_requests(now, mrs, emit)
    }
}
