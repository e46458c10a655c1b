//! One RC queue pair's state machine: requester (segments work requests
//! into packets, one PSN each), completer (ACKs, NAKs and READ responses,
//! go-back-N, the ACK and RNR timers) and responder (PSN checks, RECV
//! placement, WRITE and READ against memory regions, coalesced ACKs).
//! Sans-IO: it takes `now` and parsed packets and hands packets to an
//! emit callback; the table around it (`RcTable` in the parent module) puts them on
//! the wire. The rules follow IBTA Vol. 1 chapter 9 as Linux rxe applies
//! them (rxe_req.c, rxe_comp.c, rxe_resp.c).

use std::collections::VecDeque;
use std::time::Duration;

use super::mr::{Access, MrFault, MrTable};
use super::{
    Local, QpState, RcDest, RcOp, RcQpConfig, RcQpStats, RcSendWr, Sge, Wc, WcOpcode, WcStatus,
};
use crate::error::Error;
use crate::time::Instant;
use crate::wire::rc::{NakCode, RcHeaders, RcOpcode, Syndrome};
use crate::wire::roce::PSN_MASK;

/// Packets sent without AckReq before one asks for an ACK (rxe's
/// `RXE_MAX_PKT_PER_ACK`).
const MAX_PKT_PER_ACK: u32 = 64;
/// Request packets, and READ responses, one QP emits per poll, so one
/// large message does not starve other QPs or fill the device alone.
const BURST: u32 = 64;
/// The AETH credit field value for "no credit limit" (rxe's).
const CREDITS_UNLIMITED: u8 = 0x1f;
/// Retry counts of 7 mean "retry forever" for RNR.
const INFINITE_RNR: u8 = 7;

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

/// An ACK or NAK (Acknowledge), or an atomic's answer (AtomicAcknowledge
/// with the value found).
fn ack_packet(psn: u32, syndrome: Syndrome, msn: u32, orig: Option<u64>) -> OutPacket<'static> {
    let opcode = if orig.is_some() {
        RcOpcode::AtomicAcknowledge
    } else {
        RcOpcode::Acknowledge
    };
    OutPacket {
        opcode,
        psn,
        ack_req: false,
        solicited: false,
        hdrs: RcHeaders {
            opcode,
            reth: None,
            atomic: None,
            aeth: Some((syndrome, msn)),
            atomic_ack: orig,
            imm: None,
            payload: &[],
        },
    }
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

    pub(crate) fn post_send(
        &mut self,
        wr: &RcSendWr<'_>,
        mrs: &MrTable,
    ) -> Result<(), super::RcError> {
        use super::RcError;
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
        if len > super::MAX_MSG {
            return Err(RcError::TooLarge(len));
        }
        if let RcOp::CompareSwap { remote_addr, .. } | RcOp::FetchAdd { remote_addr, .. } = wr.op {
            if len != super::ATOMIC_LEN || remote_addr % 8 != 0 {
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

    pub(crate) fn post_recv(
        &mut self,
        wr_id: u64,
        sge: Sge,
        mrs: &MrTable,
    ) -> Result<(), super::RcError> {
        use super::RcError;
        if self.state == QpState::Error {
            return Err(RcError::QpError);
        }
        if self.rq.len() + self.recv_cqes >= self.max_recv {
            return Err(RcError::QueueFull);
        }
        mrs.check(sge.lkey, sge.addr, sge.len as usize, Access::LOCAL_WRITE)
            .map_err(|_| super::RcError::LocalProtection)?;
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
        if self.retry_left == 0 {
            self.fail(WcStatus::RetryExceeded);
            return;
        }
        self.retry_left -= 1;
        self.rewind(self.una);
        self.ack_deadline = Some(now + self.timeout);
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

    // ------------------------------------------------------------ completer

    /// Whether `psn` was sent and is not yet acknowledged.
    fn in_flight(&self, psn: u32) -> bool {
        psn_diff(psn, self.una) >= 0 && psn_diff(psn, self.sent_next) < 0
    }

    /// Go back to `psn`: the next packet sent is the one that carries it.
    fn rewind(&mut self, psn: u32) {
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

    /// A retry of everything from `una`, counted against the retry count.
    fn retry(&mut self, now: Instant) {
        if self.retry_left == 0 {
            self.fail(WcStatus::RetryExceeded);
            return;
        }
        self.retry_left -= 1;
        self.rewind(self.una);
        self.ack_deadline = Some(now + self.timeout);
    }

    fn on_response(&mut self, now: Instant, psn: u32, h: &RcHeaders<'_>, mrs: &mut MrTable) -> Rx {
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

    // ------------------------------------------------------------ responder

    fn queue_ack(&mut self, psn: u32, syndrome: Syndrome) {
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

    fn rq_flush_and_error(&mut self) {
        let out = std::mem::take(&mut self.out);
        self.fail(WcStatus::Flushed);
        // The NAK still leaves.
        self.out = out
            .into_iter()
            .filter(|i| matches!(i, RespItem::Ack { .. }))
            .collect();
        self.reads_queued = 0;
    }

    fn on_request(&mut self, psn: u32, ack_req: bool, h: &RcHeaders<'_>, mrs: &mut MrTable) -> Rx {
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

    // -------------------------------------------------------------- receive

    /// A packet for this QP, from `src_ok` (whether it came from the
    /// connected peer's address).
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

    fn next_tx_psn(&self) -> u32 {
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
            let pkt = OutPacket {
                opcode: ReadRequest,
                psn,
                ack_req: true,
                solicited: false,
                hdrs: RcHeaders {
                    opcode: ReadRequest,
                    reth: Some((remote_addr + off as u64, rkey, (w.len - off) as u32)),
                    atomic: None,
                    aeth: None,
                    atomic_ack: None,
                    imm: None,
                    payload: &[],
                },
            };
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
            let pkt = OutPacket {
                opcode,
                psn,
                ack_req: true,
                solicited: false,
                hdrs: RcHeaders {
                    opcode,
                    reth: None,
                    atomic: Some((remote_addr, rkey, swap_add, compare)),
                    aeth: None,
                    atomic_ack: None,
                    imm: None,
                    payload: &[],
                },
            };
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
            let pkt = OutPacket {
                opcode,
                psn,
                ack_req,
                solicited: last && w.solicited,
                hdrs: RcHeaders {
                    opcode,
                    reth,
                    atomic: None,
                    aeth: None,
                    atomic_ack: None,
                    imm,
                    payload: data,
                },
            };
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

    fn emit_responses(
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
                    emit(&OutPacket {
                        opcode,
                        psn: psn_add(psn, next),
                        ack_req: false,
                        solicited: false,
                        hdrs: RcHeaders {
                            opcode,
                            reth: None,
                            atomic: None,
                            aeth: opcode.has_aeth().then_some((
                                Syndrome::Ack {
                                    credits: CREDITS_UNLIMITED,
                                },
                                self.msn,
                            )),
                            atomic_ack: None,
                            imm: None,
                            payload: data,
                        },
                    })?;
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

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn psn_arithmetic_wraps_at_24_bits() {
        assert_eq!(psn_add(PSN_MASK, 1), 0);
        assert_eq!(psn_diff(0, PSN_MASK), 1);
        assert_eq!(psn_diff(PSN_MASK, 0), -1);
        assert_eq!(psn_diff(5, 5), 0);
        assert_eq!(psn_diff(0x40_0000, 0), 0x40_0000);
        assert_eq!(psn_diff(0x80_0000, 0), -0x80_0000);
    }

    fn ack(syndrome: Syndrome) -> RcHeaders<'static> {
        RcHeaders {
            opcode: RcOpcode::Acknowledge,
            reth: None,
            atomic: None,
            aeth: Some((syndrome, 0)),
            atomic_ack: None,
            imm: None,
            payload: &[],
        }
    }

    fn sent(qp: &mut RcQp, mrs: &MrTable) -> Vec<(u32, RcOpcode)> {
        let mut out = Vec::new();
        qp.poll_transmit(Instant::ZERO, mrs, &mut |p| {
            out.push((p.psn, p.opcode));
            Ok(())
        })
        .unwrap();
        out
    }

    /// A go-back to the middle of a message, then a late ACK for that
    /// whole message: sending resumes at the next message's first packet.
    #[test]
    fn a_late_ack_during_a_go_back_moves_the_resend_point() {
        let mrs = MrTable::new((1, 2));
        let mut qp = RcQp::new(0x1000, &RcQpConfig::default(), 1024, 100);
        qp.connect(RcDest {
            ip: core::net::Ipv4Addr::new(10, 0, 0, 2),
            qpn: 7,
            psn: 0,
        });
        for (id, len) in [(1, 3000), (2, 10)] {
            let data = vec![0u8; len];
            let wr = RcSendWr {
                wr_id: id,
                op: RcOp::Send,
                local: Local::Inline(&data),
                signaled: true,
                solicited: false,
            };
            qp.post_send(&wr, &mrs).unwrap();
        }
        let first: Vec<u32> = sent(&mut qp, &mrs).iter().map(|p| p.0).collect();
        assert_eq!(first, [100, 101, 102, 103]);
        let mut mrs = mrs;
        let now = Instant::ZERO;
        // The peer lost 101: go back to it.
        assert_eq!(
            qp.on_packet(
                now,
                101,
                false,
                &ack(Syndrome::Nak(NakCode::PsnSequenceError)),
                &mut mrs
            ),
            Rx::Ok
        );
        // Before anything is resent, a late ACK for 102 (all of message 1).
        assert_eq!(
            qp.on_packet(
                now,
                102,
                false,
                &ack(Syndrome::Ack { credits: 31 }),
                &mut mrs
            ),
            Rx::Ok
        );
        assert_eq!(sent(&mut qp, &mrs), [(103, RcOpcode::SendOnly)]);
        assert_eq!(qp.stats.retransmits, 1);
        let mut wcs = Vec::new();
        qp.poll_cq(8, &mut wcs);
        assert_eq!(wcs.len(), 1);
        assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
    }

    /// The QP of the timer tests: 1024-byte packets, timeout 14 (67 ms,
    /// perftest's), connected.
    fn timer_qp() -> (RcQp, MrTable) {
        let cfg = RcQpConfig {
            timeout: 14,
            ..RcQpConfig::default()
        };
        let mut qp = RcQp::new(0x1000, &cfg, 1024, 100);
        qp.connect(RcDest {
            ip: core::net::Ipv4Addr::new(10, 0, 0, 2),
            qpn: 7,
            psn: 0,
        });
        (qp, MrTable::new((1, 2)))
    }

    fn post(qp: &mut RcQp, mrs: &MrTable, id: u64, len: usize) {
        let data = vec![0u8; len];
        let wr = RcSendWr {
            wr_id: id,
            op: RcOp::Send,
            local: Local::Inline(&data),
            signaled: true,
            solicited: false,
        };
        qp.post_send(&wr, mrs).unwrap();
    }

    /// What the QP sends when polled at `now` (the table polls right
    /// after the timers, with the same `now`).
    fn step(qp: &mut RcQp, mrs: &MrTable, now: Instant) -> Vec<u32> {
        qp.on_timer(now);
        let mut out = Vec::new();
        qp.poll_transmit(now, mrs, &mut |p| {
            out.push(p.psn);
            Ok(())
        })
        .unwrap();
        out
    }

    /// The local ACK timer (IBA 9.7.6.1.3) never fires before `ack_timeout`
    /// has passed since what armed it: the first send with nothing
    /// outstanding, the last progress (an ACK of some of what is
    /// outstanding restarts it), or the resend after a timeout. A manual
    /// clock walks in 1 ms steps through a 4-packet message (perftest's
    /// `ib_send_lat -s 4096` at a 1024-byte MTU) whose ACKs are lost,
    /// partly acknowledged, resent and acknowledged, then a new message
    /// after a quiet time; every timeout must come at least 67 ms after
    /// the event before it, and no later than the step after.
    #[test]
    fn the_ack_timer_never_fires_before_the_timeout_after_a_send_or_progress() {
        let (mut qp, mut mrs) = timer_qp();
        let to = ack_timeout(14);
        let ms = Duration::from_millis(1);
        let at = |n: u64| Instant::ZERO + Duration::from_millis(n);
        // Scripted inputs: (time in ms, PSN acknowledged) and when the
        // second message is posted.
        let acks = [(20u64, 101u32), (120, 103), (350, 104)];
        let post_second = 300u64;
        post(&mut qp, &mrs, 1, 4096);
        // The event the running timer counts from, and every timeout seen.
        let mut armed: Option<Instant> = None;
        let mut fired = Vec::new();
        for n in 0..600u64 {
            let now = at(n);
            if n == post_second {
                post(&mut qp, &mrs, 2, 1000);
            }
            for &(t, psn) in &acks {
                if t == n {
                    let before = qp.una;
                    let r = qp.on_packet(
                        now,
                        psn,
                        false,
                        &ack(Syndrome::Ack { credits: 31 }),
                        &mut mrs,
                    );
                    assert_eq!(r, Rx::Ok, "ACK {psn} at {n} ms");
                    if qp.una != before {
                        // Progress restarts the timer (or stops it).
                        armed = (qp.una != qp.sent_next).then_some(now);
                    }
                }
            }
            let timeouts = qp.stats.ack_timeouts;
            let idle = qp.una == qp.sent_next;
            let sent = step(&mut qp, &mrs, now);
            if qp.stats.ack_timeouts > timeouts {
                let since = armed.expect("a timer runs");
                assert!(
                    now >= since + to,
                    "the ACK timer fired at {n} ms, {:?} after it was armed (timeout {to:?})",
                    now.saturating_duration_since(since)
                );
                assert!(now < since + to + ms, "fired late: at {n} ms");
                fired.push(n);
                armed = Some(now);
            } else if !sent.is_empty() && idle {
                // A first send with nothing outstanding arms it.
                armed = Some(now);
            }
            let want = armed.map(|since| since + to);
            assert_eq!(qp.deadline(), want, "at {n} ms");
        }
        // Sent at 0; 100 and 101 acknowledged at 20, so the timer counts
        // from 20 and fires at 88 (not 67); the resend of 102 and 103 is
        // acknowledged at 120; message 2 goes at 300, acknowledged at 350.
        assert_eq!(fired, [88], "timeouts at (ms)");
        assert_eq!(qp.stats.retransmits, 2);
        let mut wcs = Vec::new();
        qp.poll_cq(8, &mut wcs);
        let ok: Vec<(u64, WcStatus)> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(ok, [(1, WcStatus::Success), (2, WcStatus::Success)]);
        assert_eq!(qp.deadline(), None);
    }

    #[test]
    fn timers_decode_as_the_spec_tables() {
        assert_eq!(rnr_timer(0), Duration::from_micros(655_360));
        assert_eq!(rnr_timer(1), Duration::from_micros(10));
        assert_eq!(rnr_timer(12), Duration::from_micros(640));
        assert_eq!(rnr_timer(31), Duration::from_micros(491_520));
        assert_eq!(ack_timeout(14), Duration::from_nanos(4096 << 14));
        assert_eq!(ack_timeout(0), Duration::from_nanos(4096 << 31));
    }
}
