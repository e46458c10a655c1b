//! RoCEv2 Reliable Connected (RC) transport spoken by the stack: queue
//! pairs with a requester, a completer and a responder ([`qp`]), memory
//! regions with keys ([`mr`]), and the packet formats ([`wire`]). Sans-IO
//! like TCP: the table takes parsed packets and `now`, and emits on
//! [`Stack::poll`](crate::Stack::poll).
//!
//! The app API is the verbs shape ([`Rc`], from `stack.rc()`): register memory regions,
//! create a QP (it starts in INIT with its QPN and first PSN chosen),
//! connect it to the peer's (address, QPN, PSN) learnt out of band (the
//! stock tools' TCP exchange, [`crate::wire::exchange`]), post receives and
//! SEND / WRITE / READ work requests naming bytes of a region, and poll
//! its completion queue.
//!
//! What is spoken: SEND, SEND with immediate, RDMA WRITE, WRITE with
//! immediate, RDMA READ, each segmented at the path MTU (FIRST / MIDDLE /
//! LAST / ONLY, one PSN per packet, a READ taking as many PSNs as its
//! responses); AckReq on the last packet of a message and every 64
//! packets; coalesced ACKs; go-back-N from the oldest unacknowledged PSN on
//! a sequence NAK, a gap in READ responses or the ACK timeout (4.096 µs ×
//! 2^timeout, `retry_cnt` tries); RNR NAK with its timer and `rnr_retry`
//! (7 is forever); duplicates re-acknowledged, duplicate READs replayed;
//! invalid-request and remote-access NAKs that move both QPs to the error
//! state; 8-byte atomics (compare-and-swap, fetch-and-add) executed once
//! each, a duplicate answered from the saved result.

pub mod mr;
pub mod qp;
mod verbs;
mod view;
use crate::wire::rc as wire;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::Hasher;

use siphasher::sip::SipHasher24;
use slotmap::SlotMap;

use crate::error::Error;
pub use crate::events::RcQpHandle;
use crate::events::{Event, Pending, Readiness, SocketRef};
use crate::iface::link::Link;
use crate::phy::device::Tx;
use crate::socket::ud::{Roce, roce_source, send_roce};
use crate::stats::DropReason;
pub use crate::stats::RcQpStats;
use crate::time::Instant;
use crate::wire::roce::{
    self as udwire, BTH_LEN, BthPacket, DEFAULT_PKEY, ICRC_LEN, MAX_QPN, PSN_MASK,
};

use mr::MrTable;
pub use mr::{Access, MrHandle, MrInfo};
use qp::{OutPacket, RcQp, Rx};
pub use verbs::{
    ATOMIC_LEN, Local, MAX_MSG, QpState, RcDest, RcError, RcOp, RcQpConfig, RcQpStatus, RcSendWr,
    Sge, Wc, WcOpcode, WcStatus,
};
pub use view::{Rc, RcRef};
use wire::{RcHeaders, RcOpcode};

/// The stack's RC QPs (hashed by QPN) and memory regions.
#[derive(Debug)]
pub(crate) struct RcTable {
    qps: SlotMap<RcQpHandle, (RcQp, QpSched)>,
    by_qpn: HashMap<u32, RcQpHandle>,
    pub(crate) mrs: MrTable,
    next_qpn: u32,
    psn_seq: u64,
    secret: (u64, u64),
    timers: BinaryHeap<Reverse<(Instant, RcQpHandle)>>,
    ready: VecDeque<RcQpHandle>,
    /// QPs with readiness events to hand out.
    events: VecDeque<RcQpHandle>,
    /// Counters of QPs already destroyed (so totals never go back).
    gone: RcQpStats,
}

/// A QP's place in the table's queues.
#[derive(Debug, Default)]
struct QpSched {
    queued: bool,
    timer_at: Option<Instant>,
    /// Completions the app has been told about (raised READABLE for).
    cq_told: usize,
    error_told: bool,
    events: Pending,
}

/// RC QPNs start here (UD's start at 0x100): rxe-like small numbers,
/// clear of the well-known UD services.
const FIRST_RC_QPN: u32 = 0x1000;

impl RcTable {
    pub(crate) fn new(secret: (u64, u64)) -> Self {
        RcTable {
            qps: SlotMap::with_key(),
            by_qpn: HashMap::new(),
            mrs: MrTable::new(secret),
            next_qpn: FIRST_RC_QPN,
            psn_seq: 0,
            secret,
            timers: BinaryHeap::new(),
            ready: VecDeque::new(),
            events: VecDeque::new(),
            gone: RcQpStats::default(),
        }
    }

    pub(crate) fn has_qpn(&self, qpn: u32) -> bool {
        self.by_qpn.contains_key(&qpn)
    }

    pub(crate) fn has_work(&self) -> bool {
        !self.ready.is_empty()
    }

    pub(crate) fn next_timer(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((t, _))| *t)
    }

    /// Gauges and totals over every QP, live and gone.
    pub(crate) fn stats(&self) -> crate::stats::RcStats {
        let mut totals = self.gone;
        for (q, _) in self.qps.values() {
            add_stats(&mut totals, &q.stats);
        }
        crate::stats::RcStats {
            qps: self.qps.len() as u64,
            mrs: self.mrs.count() as u64,
            mr_bytes: self.mrs.bytes() as u64,
            totals,
        }
    }

    pub(crate) fn status(&self, max: usize) -> Vec<RcQpStatus> {
        self.qps
            .values()
            .take(max)
            .map(|(q, _)| qp_status(q))
            .collect()
    }

    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    pub(crate) fn drain_events(&mut self, out: &mut Vec<Event>) {
        for h in self.events.drain(..) {
            if let Some((_, s)) = self.qps.get_mut(h) {
                let readiness = s.events.take();
                if !readiness.is_empty() {
                    out.push(Event {
                        socket: SocketRef::RcQp(h),
                        readiness,
                    });
                }
            }
        }
    }

    /// After anything that may give a QP work, completions or a new
    /// timer: queue it to send, raise its events, arm its timer.
    fn schedule(&mut self, h: RcQpHandle) {
        if let Some((qp, s)) = self.qps.get_mut(h) {
            if qp.wants_tx() && !s.queued {
                s.queued = true;
                self.ready.push_back(h);
            }
        }
        self.notice(h);
    }

    /// Raise the QP's events (new completions, the error state) and arm
    /// its timer.
    fn notice(&mut self, h: RcQpHandle) {
        let Some((qp, s)) = self.qps.get_mut(h) else {
            return;
        };
        let mut r = Readiness::NONE;
        if qp.cq_len() > s.cq_told {
            r |= Readiness::READABLE;
        }
        s.cq_told = qp.cq_len();
        if qp.state == QpState::Error && !s.error_told {
            s.error_told = true;
            r |= Readiness::ERROR;
        }
        if s.events.raise(r) {
            self.events.push_back(h);
        }
        if let Some(t) = qp.deadline() {
            if s.timer_at.is_none_or(|old| t < old) {
                s.timer_at = Some(t);
                self.timers.push(Reverse((t, h)));
            }
        }
    }

    fn pick_qpn(&mut self, taken: &dyn Fn(u32) -> bool) -> Option<u32> {
        for _ in 0..MAX_QPN {
            let q = self.next_qpn.max(FIRST_RC_QPN);
            self.next_qpn = if q >= MAX_QPN { FIRST_RC_QPN } else { q + 1 };
            if !self.by_qpn.contains_key(&q) && !taken(q) {
                return Some(q);
            }
        }
        None
    }

    fn random_psn(&mut self) -> u32 {
        self.psn_seq += 1;
        let mut h = SipHasher24::new_with_keys(self.secret.0 ^ 0x0070_736e, self.secret.1);
        h.write_u64(self.psn_seq);
        h.finish() as u32 & PSN_MASK
    }

    pub(crate) fn create_qp(
        &mut self,
        cfg: &RcQpConfig,
        link_mtu: usize,
        ud_taken: &dyn Fn(u32) -> bool,
    ) -> Result<RcQpHandle, RcError> {
        let path = crate::socket::ud::ib_path_mtu(link_mtu).ok_or(RcError::BadMtu(link_mtu))?;
        let pmtu = match cfg.mtu {
            None => path,
            Some(m) if [256, 512, 1024, 2048, 4096].contains(&m) && m <= path => m,
            Some(m) => return Err(RcError::BadMtu(m)),
        };
        let qpn = match cfg.qpn {
            Some(q) if !(2..=MAX_QPN).contains(&q) => return Err(RcError::BadQpn(q)),
            Some(q) if self.by_qpn.contains_key(&q) || ud_taken(q) => {
                return Err(RcError::QpnInUse(q));
            }
            Some(q) => q,
            None => self.pick_qpn(ud_taken).ok_or(RcError::QueueFull)?,
        };
        let psn = match cfg.psn {
            Some(p) => p & PSN_MASK,
            None => self.random_psn(),
        };
        let h = self
            .qps
            .insert((RcQp::new(qpn, cfg, pmtu, psn), QpSched::default()));
        self.by_qpn.insert(qpn, h);
        Ok(h)
    }

    fn qp(&self, h: RcQpHandle) -> Result<&RcQp, RcError> {
        self.qps
            .get(h)
            .map(|(q, _)| q)
            .ok_or(RcError::InvalidHandle)
    }

    fn qp_mut(&mut self, h: RcQpHandle) -> Result<&mut RcQp, RcError> {
        self.qps
            .get_mut(h)
            .map(|(q, _)| q)
            .ok_or(RcError::InvalidHandle)
    }

    /// Receive path for RC packets (the BTH opcode is an RC one). `ip` is
    /// the whole IPv4 packet, checked (ICRC included) by the caller.
    pub(crate) fn process(
        &mut self,
        now: Instant,
        ip: &[u8],
        roce: &[u8],
    ) -> Result<(), DropReason> {
        let bth = BthPacket::new_checked(roce).map_err(|_| DropReason::UdMalformed)?;
        if bth.version() != 0 {
            return Err(DropReason::UdMalformed);
        }
        if bth.pkey() & 0x7fff != DEFAULT_PKEY & 0x7fff {
            return Err(DropReason::UdBadPkey);
        }
        let opcode = RcOpcode::from_u8(u8::from(bth.opcode())).ok_or(DropReason::UdBadOpcode)?;
        let pad = usize::from(bth.pad_count());
        let body = roce
            .len()
            .checked_sub(BTH_LEN + ICRC_LEN + pad)
            .ok_or(DropReason::UdMalformed)?;
        let hdrs = RcHeaders::parse(opcode, &roce[BTH_LEN..BTH_LEN + body])
            .map_err(|_| DropReason::UdMalformed)?;
        let h = *self
            .by_qpn
            .get(&bth.dest_qp())
            .ok_or(DropReason::UdUnknownQpn)?;
        let (qp, _) = self.qps.get_mut(h).ok_or(DropReason::UdUnknownQpn)?;
        let src = roce_source(ip);
        if qp.dest.is_none_or(|d| d.ip != src) {
            return Err(DropReason::RcWrongPeer);
        }
        let r = qp.on_packet(now, bth.psn(), bth.ack_req(), &hdrs, &mut self.mrs);
        self.schedule(h);
        match r {
            Rx::Ok => Ok(()),
            Rx::BadState => Err(DropReason::RcBadState),
            Rx::Stale => Err(DropReason::RcStale),
        }
    }

    /// Run due timers and emit what QPs have to send.
    pub(crate) fn poll<T: Tx>(&mut self, link: &mut Link, now: Instant, tx: &mut T) {
        while let Some(Reverse((t, h))) = self.timers.peek().copied() {
            if t > now {
                break;
            }
            self.timers.pop();
            let Some((qp, s)) = self.qps.get_mut(h) else {
                continue;
            };
            if s.timer_at == Some(t) {
                s.timer_at = None;
            }
            qp.on_timer(now);
            self.schedule(h);
        }
        let mut again = Vec::new();
        while let Some(h) = self.ready.pop_front() {
            let Some((qp, s)) = self.qps.get_mut(h) else {
                continue;
            };
            s.queued = false;
            let Some(dest) = qp.dest else { continue };
            let src_qpn = qp.qpn;
            let tclass = qp.tclass;
            let mrs = &self.mrs;
            let r = qp.poll_transmit(now, mrs, &mut |p| {
                send_packet(link, now, tx, dest, tclass, src_qpn, p)
            });
            if r.is_err() || qp.wants_tx_now() {
                again.push(h);
            }
            // Sending arms timers and may fail the QP (a region gone).
            self.notice(h);
        }
        for h in again {
            if let Some((_, s)) = self.qps.get_mut(h) {
                if !s.queued {
                    s.queued = true;
                    self.ready.push_back(h);
                }
            }
        }
    }
}

/// Put one RC packet on the wire: `IP | UDP 4791 | BTH | headers |
/// payload | pad | ICRC` (IPv4 with DF set, or IPv6).
fn send_packet<T: Tx>(
    link: &mut Link,
    now: Instant,
    tx: &mut T,
    dest: RcDest,
    tclass: u8,
    src_qpn: u32,
    p: &OutPacket<'_>,
) -> Result<(), Error> {
    // One packet waits for the neighbor's address; the rest stay in the
    // QP until it is known (the queue of packets waiting for a neighbor
    // is small, and a window dropped there costs a go-back-N).
    if link.resolving(dest.ip) {
        return Err(Error::QueueFull);
    }
    let pad = (4 - p.hdrs.payload.len() % 4) % 4;
    let roce_len = BTH_LEN + p.hdrs.buffer_len() + pad + ICRC_LEN;
    let sport = udwire::udp_source_port(src_qpn, dest.qpn);
    let at = Roce {
        dst: dest.ip,
        tclass,
        sport,
    };
    send_roce(link, now, tx, at, roce_len, |roce| {
        let mut bth = BthPacket::new_unchecked(roce);
        bth.set_opcode(udwire::Opcode::from(p.opcode as u8));
        bth.set_flags(p.solicited, true, pad as u8);
        bth.set_pkey(DEFAULT_PKEY);
        bth.set_resv8a(0);
        bth.set_dest_qp(dest.qpn);
        bth.set_ack_req(p.ack_req);
        bth.set_psn(p.psn);
        let rest = bth.payload_mut();
        let n = p.hdrs.buffer_len();
        p.hdrs.emit(&mut rest[..n]);
        rest[n..n + pad + ICRC_LEN].fill(0);
    })
}

fn add_stats(t: &mut RcQpStats, s: &RcQpStats) {
    t.tx_packets += s.tx_packets;
    t.tx_bytes += s.tx_bytes;
    t.rx_packets += s.rx_packets;
    t.rx_bytes += s.rx_bytes;
    t.retransmits += s.retransmits;
    t.ack_timeouts += s.ack_timeouts;
    t.seq_naks_sent += s.seq_naks_sent;
    t.seq_naks_received += s.seq_naks_received;
    t.rnr_naks_sent += s.rnr_naks_sent;
    t.rnr_naks_received += s.rnr_naks_received;
    t.naks_sent += s.naks_sent;
    t.remote_errors += s.remote_errors;
    t.acks_sent += s.acks_sent;
    t.duplicates += s.duplicates;
    t.out_of_sequence += s.out_of_sequence;
    t.read_gaps += s.read_gaps;
    t.stale_acks += s.stale_acks;
    t.access_errors += s.access_errors;
    t.malformed += s.malformed;
    t.errors += s.errors;
}

fn qp_status(q: &RcQp) -> RcQpStatus {
    let (initial_psn, next_psn, una_psn, expected_psn) = q.psns();
    let (send_outstanding, recv_posted) = q.outstanding();
    RcQpStatus {
        qpn: q.qpn,
        state: q.state,
        dest: q.dest,
        mtu: q.pmtu(),
        initial_psn,
        next_psn,
        una_psn,
        expected_psn,
        send_outstanding,
        recv_posted,
        reads_outstanding: q.reads_outstanding(),
        cq_depth: q.cq_len(),
        stats: q.stats,
    }
}
