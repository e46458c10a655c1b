//! What to send: SYN and SYN-ACK, data and FIN (new, or retransmitted in
//! recovery) within the windows, Nagle and cork, probes, ACKs and resets.

use super::timers::Timer;
use super::{CwndUsage, DUP_THRESH, Header, Limit, Outgoing, State, TcpConn};
use crate::socket::tcp::seq::Seq;
use crate::time::Instant;

impl TcpConn {
    /// TCP option bytes a data segment carries now (timestamps, SACK
    /// blocks), padded to 4 as smoltcp emits them. The MSS excludes options
    /// (RFC 6691), so payloads shrink by this much.
    pub(super) fn option_overhead(&self) -> usize {
        let mut n = if self.opts.ts_enabled { 10 } else { 0 };
        let blocks = self.sack_blocks();
        if blocks > 0 {
            n += 2 + 8 * blocks;
        }
        n.div_ceil(4) * 4
    }

    /// SACK blocks an ACK carries now: a D-SACK, then the ranges held out
    /// of order, three at most (what fits beside timestamps).
    fn sack_blocks(&self) -> usize {
        if !self.opts.sack_enabled {
            return 0;
        }
        let held = if self.rcv.buf.ooo_bytes() > 0 {
            self.rcv.buf.ooo_ranges()
        } else {
            0
        };
        (held + usize::from(self.owed.dsack.is_some())).min(3)
    }

    /// Largest payload of a segment sent now.
    pub(super) fn max_payload(&self) -> usize {
        self.snd.mss.saturating_sub(self.option_overhead()).max(1)
    }

    pub(super) fn base_segment(&mut self, now: Instant) -> Outgoing {
        let window = self.window_to_advertise();
        let mut sack = [None; 3];
        // RFC 2883: a duplicate's range first (taken once it is sent).
        let dsack = self.owed.dsack.filter(|_| self.opts.sack_enabled);
        let held = &mut sack[usize::from(dsack.is_some())..];
        if self.opts.sack_enabled && self.rcv.buf.ooo_bytes() > 0 {
            self.rcv
                .buf
                .sack_ranges(&mut self.owed.sack_scratch, held.len());
            for (slot, &(s, e)) in held.iter_mut().zip(self.owed.sack_scratch.iter()) {
                *slot = Some((self.rcv.nxt + s, self.rcv.nxt + e));
            }
        }
        sack[0] = dsack.or(sack[0]);
        Outgoing::from(Header {
            seq: self.snd.nxt,
            ack: Some(self.rcv.nxt),
            window,
            sack,
            timestamp: self
                .opts
                .ts_enabled
                .then(|| (self.tsval(now), self.opts.ts_recent)),
            ece: self.ecn_echoing(),
            ..Header::default()
        })
    }

    pub(super) fn sent_ack(&mut self, seg: &Outgoing) {
        if let Some(ack) = seg.hdr.ack {
            self.opts.last_ack_sent = ack;
        }
        if seg.hdr.sack[0].is_some() {
            self.owed.dsack = None;
        }
        self.owed.dupacks_owed = self.owed.dupacks_owed.saturating_sub(1);
        self.owed.ack_now = self.owed.dupacks_owed > 0;
        self.timers.stop(Timer::DelayedAck);
        self.owed.unacked_segs = 0;
        self.owed.quick_acks = self.owed.quick_acks.saturating_sub(1);
        self.stats.segs_out += 1;
    }

    /// A segment with new data left at `now`: a reply within the
    /// delayed-ACK time of the peer's data makes the connection
    /// interactive (see `Owed::pingpong`).
    fn sent_data(&mut self, now: Instant) {
        if let (Some(t), Some(d)) = (self.owed.last_data, self.cfg.delayed_ack) {
            if now - t < d {
                self.owed.pingpong = true;
            }
        }
    }

    /// A segment from [`poll_transmit`](Self::poll_transmit) left as
    /// `extra` more frames than one (cut by the stack: GSO).
    pub(crate) fn count_extra_frames(&mut self, extra: usize) {
        self.stats.segs_out += extra as u64;
    }

    /// The next segment to send, if any. Call repeatedly until `None`.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Outgoing> {
        self.on_timer(now);
        if let Some((seq, ack)) = self.owed.rst_pending.take() {
            self.stats.segs_out += 1;
            return Some(Outgoing::from(Header {
                seq,
                ack,
                rst: true,
                ..Header::default()
            }));
        }
        match self.state {
            State::Closed | State::Listen => return None,
            State::SynSent => return self.transmit_syn(now),
            State::SynReceived => {
                if let Some(seg) = self.transmit_syn(now) {
                    return Some(seg);
                }
                // Fast Open (RFC 7413 3): the server may send data before
                // the handshake completes, once its SYN-ACK is out.
                if self.fast_open.child {
                    return self.transmit_established(now);
                }
                // Simultaneous open: acknowledge the peer's SYN-ACK.
                if self.owed.ack_now {
                    let seg = self.base_segment(now);
                    self.sent_ack(&seg);
                    return Some(seg);
                }
                return None;
            }
            _ => {}
        }
        self.transmit_established(now)
    }

    /// What a synchronized connection sends: data, probes, an ACK.
    fn transmit_established(&mut self, now: Instant) -> Option<Outgoing> {
        if std::mem::take(&mut self.rec.tlp.owed) {
            if let Some(seg) = self.transmit_tail_probe(now) {
                return Some(seg);
            }
        }
        if let Some(seg) = self.transmit_data(now, false) {
            return Some(seg);
        }
        if self.owed.probe_pending {
            self.owed.probe_pending = false;
            // Zero-window probe: an old sequence number draws an ACK with the window.
            let mut seg = self.base_segment(now);
            seg.hdr.seq = self.snd.una - 1;
            self.sent_ack(&seg);
            self.arm_persist(now);
            return Some(seg);
        }
        if self.live.ka_pending {
            self.live.ka_pending = false;
            // Keepalive probe: an old sequence number draws the peer's ACK.
            let mut seg = self.base_segment(now);
            seg.hdr.seq = self.snd.una - 1;
            self.sent_ack(&seg);
            return Some(seg);
        }
        if self.owed.ack_now {
            let seg = self.base_segment(now);
            self.sent_ack(&seg);
            return Some(seg);
        }
        None
    }

    pub(super) fn transmit_syn(&mut self, now: Instant) -> Option<Outgoing> {
        if !self.owed.send_syn {
            return None;
        }
        self.owed.send_syn = false;
        let synack = self.state == State::SynReceived;
        let (ece, cwr) = self.ecn_syn_flags(synack, self.rec.retries == 0);
        let seg = Outgoing::from(Header {
            seq: self.snd.iss,
            ack: synack.then_some(self.rcv.nxt),
            syn: true,
            window: u16::try_from(self.rcv.buf.window()).unwrap_or(u16::MAX),
            mss: Some(u16::try_from(self.cfg.mss).unwrap_or(u16::MAX)),
            wscale: (self.cfg.window_scaling
                && (!synack || self.snd.wscale > 0 || self.rcv.wscale > 0))
                .then_some(self.rcv.wscale),
            sack_permitted: self.cfg.sack && (!synack || self.opts.sack_enabled),
            timestamp: (self.cfg.timestamps && (!synack || self.opts.ts_enabled)).then(|| {
                (
                    self.tsval(now),
                    if synack { self.opts.ts_recent } else { 0 },
                )
            }),
            ece,
            cwr,
            ..Header::default()
        });
        if synack {
            self.rcv.adv = self.rcv.nxt + usize::from(seg.hdr.window);
        }
        let mut seg = seg;
        seg.fast_open = self.fast_open.synack_cookie.filter(|_| synack);
        self.snd.nxt = self.snd.iss + 1;
        if let (Some(cookie), false) = (self.fast_open.syn_cookie, synack) {
            seg.fast_open = Some((cookie, false));
            if !cookie.is_request() && self.rec.retries == 0 {
                // Data in the SYN (RFC 7413 3): what fits the smallest MSS
                // a path has (the peer's is not known yet), less the
                // options any segment may carry. A retransmitted SYN goes
                // without it.
                let room = self.cfg.mss.min(1460).saturating_sub(40).max(1);
                seg.payload_offset = 0;
                seg.payload_len = self.snd.buf.len().min(room);
                self.snd.nxt += seg.payload_len;
            }
        }
        if self.snd.max.diff(self.snd.nxt) < 0 {
            self.snd.max = self.snd.nxt;
        }
        if self.rec.retries == 0 {
            self.rec.rtt_probe = Some((self.snd.iss, now));
        }
        self.timers.set(Timer::Rto, now + self.rec.rtt.rto());
        self.sent_ack(&seg);
        Some(seg)
    }

    /// The tail loss probe (RFC 8985 7.3): one segment of new data if the
    /// peer's window takes it (past the congestion window), else the last
    /// segment sent, again. The RTO restarts from it.
    fn transmit_tail_probe(&mut self, now: Instant) -> Option<Outgoing> {
        let was_new = self.snd.nxt == self.snd.max;
        let (seg, retrans) = match self.transmit_data(now, true) {
            Some(seg) => (seg, !was_new),
            None => (self.retransmit_last(now)?, true),
        };
        self.rec.tlp.high = Some(self.snd.nxt);
        self.rec.tlp.retrans = retrans;
        self.stats.tail_loss_probes += 1;
        self.timers.stop(Timer::Tlp);
        self.timers.set(Timer::Rto, now + self.rec.rtt.rto());
        Some(seg)
    }

    /// The last segment sent (its last `max_payload` bytes, and the FIN
    /// if it carried one), sent again.
    fn retransmit_last(&mut self, now: Instant) -> Option<Outgoing> {
        let data_end = self.snd.data_start + self.snd.buf.len();
        let fin = self.snd.fin_queued && self.snd.max == data_end + 1;
        let end = if fin { data_end } else { self.snd.max };
        let len = end
            .since(self.snd.una.max(self.snd.data_start))
            .min(self.max_payload());
        if len == 0 && !fin {
            return None;
        }
        let start = end - len;
        let mut seg = self.base_segment(now);
        seg.hdr.seq = start;
        seg.payload_offset = start.since(self.snd.data_start);
        seg.payload_len = len;
        seg.hdr.fin = fin;
        self.stats.retransmits += 1;
        // Karn: no RTT sample across a retransmission.
        self.forget_rtt_timing();
        self.rec.rack.on_sent(now, start, start + len, true);
        self.undo_note_retransmit(now, start, start + len);
        self.sent_ack(&seg);
        Some(seg)
    }

    /// Data (new or retransmitted) and FIN; as a tail loss probe
    /// (`probing`), one segment past the congestion window.
    pub(super) fn transmit_data(&mut self, now: Instant, probing: bool) -> Option<Outgoing> {
        let data_end = self.snd.data_start + self.snd.buf.len();
        // Loss recovery: retransmit holes first.
        if self.rec.in_recovery {
            if let Some(seg) = self.retransmit_in_recovery(now) {
                return Some(seg);
            }
        }
        if std::mem::take(&mut self.snd.wrote_when_idle) {
            self.restart_after_idle(now);
        }
        let flight = self.flight_estimate();
        let cwnd = self.send_window();
        let wnd_edge = self.snd.una + self.snd.wnd;
        let unsent = data_end.since(self.snd.nxt);
        let fin_due = self.snd.fin_queued
            && matches!(
                self.state,
                State::FinWait1 | State::Closing | State::LastAck
            )
            && self.snd.nxt.diff(data_end) >= 0
            && self.snd.nxt.diff(data_end + 1) < 0;
        if unsent == 0 && !fin_due {
            self.snd.push = false;
            return None;
        }
        let usable_wnd = wnd_edge.since(self.snd.nxt);
        let max_payload = self.max_payload();
        let mut usable_cwnd = cwnd.saturating_sub(flight);
        if probing {
            // A tail probe of new data: one segment, whatever the window.
            usable_cwnd = max_payload;
        }
        // With TSO, new data leaves in segments of whole frames the port
        // cuts (a retransmission stays one frame).
        let tso_cap = if self.snd.tso_max > 0 && self.snd.nxt == self.snd.max {
            let header = 40 + self.snd.mss.saturating_sub(max_payload);
            (self.snd.tso_max.saturating_sub(header) / max_payload * max_payload).max(max_payload)
        } else {
            max_payload
        };
        let mut len = unsent.min(tso_cap).min(usable_wnd).min(usable_cwnd);
        let record_end = self.record_end_after(self.snd.nxt);
        let ends_record = record_end.is_some_and(|e| e.since(self.snd.nxt) <= len);
        if let Some(e) = record_end.filter(|_| ends_record) {
            len = e.since(self.snd.nxt);
        }
        if len > max_payload && !ends_record {
            // Whole frames only: a short tail is left to the next call,
            // which applies SWS avoidance, cork and Nagle to it as to any
            // short segment (Linux's tcp_mss_split_point), so a burst cut
            // into frames leaves exactly as segment by segment.
            len -= len % max_payload;
        }
        // A persist expiry forces one segment past SWS avoidance and Nagle
        // (RFC 9293 3.8.6.2.1 override timeout).
        let forced = (self.owed.probe_pending || probing) && len > 0;
        // The peer's window, not the congestion window, keeps new data
        // back (Linux's `is_rwnd_limited`, timed for `tcp_info`).
        if usable_wnd < unsent.min(max_payload) && usable_cwnd > usable_wnd {
            self.chrono.start(now, Limit::Rwnd);
        }
        if unsent > 0 && len == 0 && usable_cwnd < max_payload.min(unsent) && !probing {
            // The congestion window holds data back.
            self.note_cwnd_usage(true);
        }
        if unsent > 0 && len == 0 {
            if usable_wnd == 0
                && !self.timers.is_set(Timer::Persist)
                && !self.timers.is_set(Timer::Rto)
            {
                // Zero window: keep probing while data waits.
                self.arm_persist(now);
            }
            return None;
        }
        if len > 0
            && len < max_payload
            && len < unsent
            && !forced
            && !ends_record
            && len < self.snd.max_wnd / 2
        {
            // Sender SWS avoidance: wait for a full segment, or for the
            // override timer when nothing is in flight to clock us.
            if !self.timers.is_set(Timer::Persist) && !self.timers.is_set(Timer::Rto) {
                self.arm_persist(now);
            }
            return None;
        }
        let new_data = self.snd.nxt == self.snd.max;
        // A short segment that ends a record with more data queued behind
        // it is not the tail Nagle and cork wait on (Linux applies them to
        // the last buffer of the queue only).
        let tail = !(ends_record && len < unsent);
        if len > 0
            && len < max_payload
            && tail
            && (self.snd.corked || self.snd.more)
            && !self.snd.push
            && !forced
            && new_data
            && !self.snd.fin_queued
        {
            // TCP_CORK (or `MSG_MORE`): only full segments until the app
            // uncorks; with nothing in flight to clock it, the persist
            // timer sends the tail (Linux's 200 ms ceiling on a cork: its
            // probe timer, an RTO).
            if !self.timers.is_set(Timer::Persist) && !self.timers.is_set(Timer::Rto) {
                self.arm_persist(now);
            }
            return None;
        }
        if len > 0
            && len < max_payload
            && tail
            && self.cfg.nagle
            && !self.snd.push
            && !forced
            // Data in flight (not a SYN: a Fast Open server's first
            // answer does not wait for its SYN-ACK to be acknowledged).
            && self.snd.max.diff(self.snd.data_start) > 0
            && new_data
            && !self.snd.fin_queued
        {
            // Nagle: one small segment in flight at a time. It holds new data
            // only: a retransmission (after an RTO rolled snd_nxt back) of a
            // small tail must go, or nothing would ever acknowledge it.
            return None;
        }
        if forced {
            self.owed.probe_pending = false;
        }
        let retransmit = self.snd.nxt.diff(self.snd.max) < 0;
        let mut seg = self.base_segment(now);
        seg.payload_offset = self.snd.nxt.since(self.snd.data_start);
        seg.payload_len = len;
        if len > max_payload {
            seg.tso_segsz = max_payload;
        }
        let after = self.snd.nxt + len;
        if self.snd.fin_queued
            && after == data_end
            && matches!(
                self.state,
                State::FinWait1 | State::Closing | State::LastAck
            )
        {
            seg.hdr.fin = true;
        }
        let advance = len + usize::from(seg.hdr.fin);
        if advance == 0 {
            return None;
        }
        self.ecn_mark(&mut seg, !retransmit);
        if retransmit {
            self.stats.retransmits += 1;
        } else if self.rec.rtt_probe.is_none() {
            self.rec.rtt_probe = Some((self.snd.nxt, now));
        }
        let end = self.snd.nxt + len;
        if retransmit {
            // Going back after a timeout may run past what was sent.
            let resent_end = end.min(self.snd.max);
            self.rec.rack.on_sent(now, self.snd.nxt, resent_end, true);
            self.undo_note_retransmit(now, self.snd.nxt, resent_end);
            self.rec.rack.on_sent(now, resent_end, end, false);
        } else {
            self.rec.rack.on_sent(now, self.snd.nxt, end, false);
        }
        self.count_recovery_send(len);
        self.snd.nxt += advance;
        if self.snd.max.diff(self.snd.nxt) < 0 {
            self.snd.max = self.snd.nxt;
        }
        if !self.timers.is_set(Timer::Rto) {
            self.timers.set(Timer::Rto, now + self.rec.rtt.rto());
        }
        if self.live.unacked_since.is_none() {
            self.live.unacked_since = Some(now);
        }
        if !retransmit {
            self.tx_stamps.on_sent(now, self.snd.nxt);
            // After this segment, is there room for another full one?
            self.note_cwnd_usage(usable_cwnd.saturating_sub(len) < max_payload && !probing);
            self.chrono.data_sent = Some(now);
            self.chrono.start(now, Limit::Busy);
            if len == unsent.min(max_payload) {
                self.chrono.stop(now, Limit::Rwnd, false);
            }
            self.sent_data(now);
            if !probing {
                self.arm_tail_probe(now);
            }
        }
        self.sent_ack(&seg);
        Some(seg)
    }

    /// Slow start after idle (RFC 5681 §4.1, Linux's
    /// `tcp_slow_start_after_idle_check`): the app wrote with nothing in
    /// flight and no data has left for longer than the retransmission
    /// timeout: the window restarts before the new data leaves.
    pub(super) fn restart_after_idle(&mut self, now: Instant) {
        if !self.cfg.slow_start_after_idle || self.snd.max != self.snd.una {
            return;
        }
        let Some(last) = self.chrono.data_sent else {
            return;
        };
        let idle = now.saturating_duration_since(last);
        let rto = self.rec.rtt.rto();
        if idle > rto {
            self.rec.cc.restart_after_idle(idle, rto);
        }
    }

    /// Note after sending (or being held back by the window: `limited`)
    /// how fully the window is used (Linux's `tcp_cwnd_validate`): a new
    /// window of data starts once the last is acknowledged; within one,
    /// being limited sticks, and otherwise the most in flight is kept.
    fn note_cwnd_usage(&mut self, limited: bool) {
        let out = self.snd.max.since(self.snd.una);
        let u = &mut self.rec.usage;
        if self.snd.una.diff(u.until) >= 0 || limited || (!u.limited && out > u.max_out) {
            *u = CwndUsage {
                limited,
                max_out: out,
                until: self.snd.nxt,
            };
        }
    }

    /// Whether the congestion window limits the sender, so that an ACK
    /// may grow it (Linux's `tcp_is_cwnd_limited`): it held data back in
    /// the current window of data, or in slow start it is under twice the
    /// most that was in flight (slow start may double what was used).
    pub(super) fn cwnd_limited(&self) -> bool {
        let u = &self.rec.usage;
        u.limited || (self.rec.cc.in_slow_start() && self.rec.cc.cwnd() < 2 * u.max_out)
    }

    /// The first record end (`MSG_EOR`) beyond `seq`.
    pub(super) fn record_end_after(&self, seq: Seq) -> Option<Seq> {
        // The marks are in order: a binary search, not a walk.
        let i = self.snd.records.partition_point(|e| e.diff(seq) <= 0);
        self.snd.records.get(i).copied()
    }

    /// Bytes counted against cwnd: RFC 6675 pipe with SACK, else the flight
    /// less what duplicate ACKs report delivered (NewReno fast recovery's
    /// inflation, limited transmit before it).
    pub(super) fn flight_estimate(&self) -> usize {
        if let Some(f) = self.rec.frto.filter(|f| f.new_data) {
            // F-RTO sent new data past the flight of the timeout (RFC
            // 5682 step 2b): that new data is what is in flight, the
            // rest counted lost until an ACK says otherwise.
            return self.snd.nxt.since(f.high);
        }
        if self.rec.loss_until.is_some() {
            // Going back after a timeout (Linux's Loss state, where the
            // timeout marked everything lost): in flight is what was sent
            // again since, less what the peer SACKed.
            return self
                .rec
                .scoreboard
                .unsacked_bytes(self.snd.una, self.snd.una, self.snd.nxt);
        }
        if self.opts.sack_enabled && !self.rec.scoreboard.is_empty() {
            let pipe = self.rec.scoreboard.pipe(
                self.snd.una,
                self.snd.max,
                self.rec.high_rxt,
                self.snd.mss,
                self.sack_thresh(),
            );
            // Retransmissions RACK found lost again have left the network.
            let gone = if self.rec.in_recovery {
                self.rec
                    .rack
                    .lost_again_bytes(self.snd.una, &self.rec.scoreboard)
            } else {
                0
            };
            return pipe.saturating_sub(gone);
        }
        let flight = self.snd.nxt.since(self.snd.una);
        if self.rec.in_recovery {
            flight.saturating_sub(self.rec.dupacks.saturating_sub(DUP_THRESH) * self.snd.mss)
        } else {
            // Limited transmit (RFC 3042): each of the first two duplicate
            // ACKs lets one new segment out (the segment it reports has
            // left the network), the window itself unchanged. With SACK
            // the pipe above does the same from the blocks.
            flight.saturating_sub(self.rec.dupacks.min(DUP_THRESH - 1) * self.max_payload())
        }
    }

    pub(super) fn retransmit_in_recovery(&mut self, now: Instant) -> Option<Outgoing> {
        let (start, len) = if self.opts.sack_enabled {
            let pipe = self.flight_estimate();
            if pipe + self.max_payload() > self.send_window()
                && self.rec.high_rxt.diff(self.snd.una) > 0
            {
                return None;
            }
            // A retransmission lost again first, then RFC 6675's NextSeg.
            self.rec
                .rack
                .next_lost_again(self.snd.una, &self.rec.scoreboard)
                .or_else(|| {
                    self.rec.scoreboard.next_lost(
                        self.snd.una,
                        self.snd.max,
                        self.rec.high_rxt,
                        self.snd.mss,
                        self.sack_thresh(),
                    )
                })
                .or_else(|| {
                    // First retransmission of the recovery: the head segment.
                    (self.rec.high_rxt == self.snd.una).then_some((self.snd.una, self.snd.mss))
                })?
        } else {
            // NewReno: retransmit the segment at snd_una once per (partial) ACK.
            if self.rec.high_rxt != self.snd.una {
                return None;
            }
            (self.snd.una, self.snd.mss)
        };
        let data_end = self.snd.data_start + self.snd.buf.len();
        let mut len = len.min(data_end.since(start)).min(self.max_payload());
        if let Some(e) = self.record_end_after(start) {
            len = len.min(e.since(start));
        }
        let fin = self.snd.fin_queued && start + len == data_end && self.snd.max.diff(data_end) > 0;
        if len == 0 && !fin {
            self.rec.high_rxt = start + 1;
            return None;
        }
        let mut seg = self.base_segment(now);
        seg.hdr.seq = start;
        seg.payload_offset = start.since(self.snd.data_start);
        seg.payload_len = len;
        seg.hdr.fin = fin;
        let end = start + (len + usize::from(fin));
        if end.diff(self.rec.high_rxt) > 0 {
            self.rec.high_rxt = end;
        }
        self.stats.retransmits += 1;
        self.rec.rack.on_sent(now, start, start + len, true);
        self.undo_note_retransmit(now, start, start + len);
        self.count_recovery_send(len);
        self.timers.set(Timer::Rto, now + self.rec.rtt.rto());
        self.sent_ack(&seg);
        Some(seg)
    }

    /// Copy a segment's payload, from byte `at` of it on, from the send
    /// buffer into `dst`.
    pub fn copy_payload(&self, seg: &Outgoing, at: usize, dst: &mut [u8]) -> usize {
        let n = seg.payload_len.saturating_sub(at).min(dst.len());
        self.snd.buf.read_at(seg.payload_offset + at, &mut dst[..n])
    }

    /// [`copy_payload`](Self::copy_payload), also giving the one's-complement
    /// sum of what it wrote (a `crate::wire::checksum::sum` accumulator) when it
    /// filled all of `dst`; `None` when it wrote less.
    pub fn copy_payload_summed(&self, seg: &Outgoing, at: usize, dst: &mut [u8]) -> Option<u64> {
        let n = seg.payload_len.saturating_sub(at).min(dst.len());
        let (copied, sum) = self
            .snd
            .buf
            .read_at_summed(seg.payload_offset + at, &mut dst[..n]);
        (copied == dst.len()).then_some(sum)
    }
}
