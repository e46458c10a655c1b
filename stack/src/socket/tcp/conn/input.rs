//! Segment arrival (RFC 9293 3.10.7): the handshake, acceptability,
//! RFC 5961's challenges, ACK processing with loss detection, and data and
//! FIN in order.

use super::timers::Timer;
use super::{DUP_THRESH, Limit, Segment, State, TcpConn};
use crate::error::ConnError;
use crate::socket::tcp::seq::Seq;
use crate::time::Instant;

/// RFC 9293 3.10.7.4, the four cases of segment acceptability.
pub fn segment_acceptable(seq: Seq, len: usize, rcv_nxt: Seq, wnd: usize) -> bool {
    let start_ok = seq.in_range(rcv_nxt, rcv_nxt + wnd);
    match (len, wnd) {
        (0, 0) => seq == rcv_nxt,
        (0, _) => start_ok,
        (_, 0) => false,
        _ => start_ok || (seq + (len - 1)).in_range(rcv_nxt, rcv_nxt + wnd),
    }
}

impl TcpConn {
    /// Process one segment addressed to this connection.
    pub fn on_segment(&mut self, now: Instant, seg: &Segment<'_>) {
        self.stats.segs_in += 1;
        // The peer is alive (keepalive counts idle time from here).
        self.live.last_rx = now;
        self.live.ka_probes = 0;
        match self.state {
            State::Closed | State::Listen => {}
            State::SynSent => self.on_segment_syn_sent(now, seg),
            _ => self.on_segment_synchronized(now, seg),
        }
    }

    pub(super) fn on_segment_syn_sent(&mut self, now: Instant, seg: &Segment<'_>) {
        if let Some(ack) = seg.hdr.ack {
            if ack.diff(self.snd.iss) <= 0 || ack.diff(self.snd.max) > 0 {
                if !seg.hdr.rst {
                    self.owed.rst_pending = Some((ack, None));
                }
                self.stats.bad_segments += 1;
                return;
            }
        }
        if seg.hdr.rst {
            if seg.hdr.ack.is_some() {
                self.error = Some(ConnError::Refused);
                self.state = State::Closed;
                self.clear_timers();
            }
            return;
        }
        if !seg.hdr.syn {
            return;
        }
        self.take_syn_options(seg);
        self.rcv.irs = seg.hdr.seq;
        self.rcv.nxt = seg.hdr.seq + 1;
        self.rcv.adv = self.rcv.nxt;
        if let Some(ack) = seg.hdr.ack {
            // Data our SYN carried (Fast Open) that the SYN-ACK covers is
            // delivered; the rest is sent again (RFC 7413 3).
            let data_acked = ack.since(self.snd.iss + 1).min(self.snd.buf.len());
            self.snd.buf.consume(data_acked);
            // Linux's TCPI_OPT_SYN_DATA on a client: the server took it.
            self.fast_open.syn_data = data_acked > 0;
            self.stats.bytes_out += data_acked as u64;
            if self.snd.nxt.diff(ack) > 0 {
                self.snd.nxt = ack;
            }
            self.snd.una = ack;
            self.snd.data_start = ack;
            self.sample_rtt(now, ack);
            self.snd.wnd = usize::from(seg.hdr.window) << self.snd.wscale;
            self.snd.max_wnd = self.snd.wnd;
            self.snd.wl1 = seg.hdr.seq;
            self.snd.wl2 = ack;
            self.state = if self.snd.fin_queued {
                State::FinWait1
            } else {
                State::Established
            };
            self.rec.retries = 0;
            self.chrono.established(now);
            self.timers.stop(Timer::Rto);
            self.owed.ack_now = true;
        } else {
            // Simultaneous open: answer with SYN-ACK.
            self.state = State::SynReceived;
            self.snd.wnd = usize::from(seg.hdr.window);
            self.snd.wl1 = seg.hdr.seq;
            self.snd.nxt = self.snd.iss;
            self.owed.send_syn = true;
        }
    }

    /// RFC 9293 acceptability test against what we advertised, or more if
    /// the buffer has room for it.
    pub(super) fn acceptable(&self, seg: &Segment<'_>) -> bool {
        let wnd = self
            .rcv
            .adv
            .since(self.rcv.nxt)
            .max(self.advertisable_window());
        segment_acceptable(seg.hdr.seq, seg.len(), self.rcv.nxt, wnd)
    }

    /// A segment that starts below `RCV.NXT` brought something again:
    /// its part below `RCV.NXT` is reported to the sender (RFC 2883's
    /// D-SACK, as Linux's `tcp_dsack_set`), so it can tell a needless
    /// retransmission and undo what it cut for it.
    fn note_duplicate(&mut self, seg: &Segment<'_>) {
        if !self.opts.sack_enabled || seg.is_empty() || seg.hdr.seq.diff(self.rcv.nxt) >= 0 {
            return;
        }
        let end = seg.hdr.seq + seg.len();
        let end = if end.diff(self.rcv.nxt) > 0 {
            self.rcv.nxt
        } else {
            end
        };
        self.owed.dsack = Some((seg.hdr.seq, end));
        self.owed.ack_now = true;
    }

    pub(super) fn challenge_ack(&mut self, now: Instant) {
        let second = now.as_nanos() / 1_000_000_000;
        if second != self.owed.challenge_second {
            self.owed.challenge_second = second;
            self.owed.challenge_tokens = self.cfg.challenge_ack_limit;
        }
        if self.owed.challenge_tokens > 0 {
            self.owed.challenge_tokens -= 1;
            self.stats.challenge_acks += 1;
            self.owed.ack_now = true;
        }
    }

    pub(super) fn on_segment_synchronized(&mut self, now: Instant, seg: &Segment<'_>) {
        // PAWS (RFC 7323 §5): an old timestamp means an old duplicate.
        if self.opts.ts_enabled && !seg.hdr.rst {
            if let Some((tsval, _)) = seg.hdr.timestamp {
                if (tsval.wrapping_sub(self.opts.ts_recent) as i32) < 0 && !seg.hdr.syn {
                    self.owed.ack_now = true;
                    self.note_duplicate(seg);
                    self.stats.bad_segments += 1;
                    return;
                }
            }
        }
        if self.state == State::SynReceived
            && seg.hdr.syn
            && !seg.hdr.rst
            && seg.hdr.ack.is_none()
            && seg.hdr.seq == self.rcv.irs
        {
            // The peer retransmitted its SYN: our SYN-ACK was lost.
            self.snd.nxt = self.snd.iss;
            self.owed.send_syn = true;
            return;
        }
        if !self.acceptable(seg) {
            if !seg.hdr.rst {
                self.owed.ack_now = true;
                self.note_duplicate(seg);
            }
            self.stats.bad_segments += 1;
            return;
        }
        if seg.hdr.rst && self.state == State::TimeWait {
            // RFC 1337: a reset must not cut TIME-WAIT short (an old
            // duplicate would let the next incarnation take stale data),
            // and the app, which has read or will read the end of stream,
            // learns of no error after the close completed.
            self.stats.bad_segments += 1;
            return;
        }
        if seg.hdr.rst {
            // RFC 5961 §3: only an exact match resets; in-window gets a challenge.
            if seg.hdr.seq == self.rcv.nxt {
                self.error = Some(
                    if self.state == State::SynReceived && !self.fast_open.child {
                        ConnError::Refused
                    } else {
                        ConnError::Reset
                    },
                );
                self.state = State::Closed;
                self.clear_timers();
            } else {
                self.challenge_ack(now);
            }
            return;
        }
        if seg.hdr.syn {
            // RFC 5961 §4: a SYN in a synchronized state gets a challenge ACK.
            self.challenge_ack(now);
            return;
        }
        let Some(ack) = seg.hdr.ack else {
            return;
        };
        if self.state == State::SynReceived {
            if ack.diff(self.snd.una) > 0 && ack.diff(self.snd.max) <= 0 {
                self.state = State::Established;
                self.chrono.established(now);
                self.snd.wnd = usize::from(seg.hdr.window) << self.snd.wscale;
                self.snd.max_wnd = self.snd.wnd;
                self.snd.wl1 = seg.hdr.seq;
                self.snd.wl2 = ack;
                self.rec.retries = 0;
                if self.snd.fin_queued {
                    self.state = State::FinWait1;
                }
            } else {
                self.owed.rst_pending = Some((ack, None));
                return;
            }
        }
        // RFC 5961 §5: ACKs too far behind are challenged, ACKs ahead are answered.
        if ack.diff(self.snd.max) > 0 {
            self.owed.ack_now = true;
            return;
        }
        let floor = self.snd.una - self.snd.max_wnd.max(self.snd.mss);
        if ack.diff(floor) < 0 {
            self.challenge_ack(now);
            return;
        }
        if self.opts.ts_enabled {
            if let Some((tsval, _)) = seg.hdr.timestamp {
                if seg.hdr.seq.diff(self.opts.last_ack_sent) <= 0
                    && (tsval.wrapping_sub(self.opts.ts_recent) as i32) >= 0
                {
                    self.opts.ts_recent = tsval;
                }
            }
        }
        self.process_ack(now, seg, ack);
        if self.state == State::Closed {
            return;
        }
        self.process_data(now, seg);
    }

    pub(super) fn process_ack(&mut self, now: Instant, seg: &Segment<'_>, ack: Seq) {
        let window = usize::from(seg.hdr.window) << self.snd.wscale;
        let mut newly_sacked = 0;
        let una_before = self.snd.una;
        let was_recovering = self.rec.in_recovery;
        let was_lost = self.rec.loss_until.is_some();
        // Bytes this ACK delivered, SACKed or acknowledged (PRR's DeliveredData).
        let mut delivered_now = 0;
        if self.opts.sack_enabled {
            let mut blocks = [(Seq(0), Seq(0)); 3];
            let mut n = 0;
            for b in seg.hdr.sack.iter().flatten() {
                blocks[n] = *b;
                n += 1;
            }
            // RACK reads the ACK against the scoreboard as it was. Without
            // SACK news, recovery or a hole, a cumulative ACK only delivers
            // segments older than all in flight: nothing RACK could use.
            if n > 0 || self.rec.in_recovery || !self.rec.scoreboard.is_empty() {
                self.rec.rack.on_ack(
                    now,
                    self.snd.una,
                    ack.min(self.snd.max),
                    &blocks[..n],
                    &self.rec.scoreboard,
                    self.max_payload(),
                );
            }
            if n > 0 {
                newly_sacked = self
                    .rec
                    .scoreboard
                    .add(self.snd.una, self.snd.max, &blocks[..n]);
            }
            self.undo_on_dsack(seg, ack);
        }
        delivered_now += newly_sacked;
        self.on_ack_after_tail_probe(now, seg, ack, newly_sacked);
        if ack.diff(self.snd.una) > 0 {
            let acked = ack.since(self.snd.una);
            // Grow the window only while it limits the sender (RFC 7661's
            // aim, by Linux's rule): an app-limited or receiver-limited
            // flow must not inflate it.
            let cwnd_limited = self.cwnd_limited();
            self.snd.una = ack;
            if self.snd.nxt.diff(ack) < 0 {
                self.snd.nxt = ack;
            }
            // Bytes of data acknowledged (the SYN and FIN take sequence space too).
            let data_acked = ack.since(self.snd.data_start).min(self.snd.buf.len());
            self.snd.buf.consume(data_acked);
            self.snd.data_start += data_acked;
            while self
                .snd
                .records
                .front()
                .is_some_and(|e| e.diff(self.snd.data_start) <= 0)
            {
                self.snd.records.pop_front();
            }
            self.stats.bytes_out += data_acked as u64;
            let sacked_before = self.rec.scoreboard.sacked_bytes();
            self.rec.scoreboard.advance(ack);
            // What this ACK delivered, as Linux counts it for the window's
            // growth: bytes SACKed earlier, or (without SACK) the segments
            // duplicate ACKs already reported, were delivered then; the
            // cumulative ACK that covers them adds only the rest (at least
            // one segment without SACK: the hole it acknowledges).
            let delivered = if self.opts.sack_enabled {
                acked.saturating_sub(sacked_before - self.rec.scoreboard.sacked_bytes())
            } else {
                let seg = self.max_payload();
                acked
                    .saturating_sub(self.rec.dupacks * seg)
                    .max(acked.min(seg))
            };
            delivered_now += delivered;
            self.sample_rtt(now, ack);
            self.sample_rtt_per_ack(now, ack);
            self.tx_stamps.on_acked(now, ack);
            self.rec.retries = 0;
            if self.rec.loss_until.is_some_and(|l| ack.diff(l) >= 0) {
                self.rec.loss_until = None;
            }
            // The peer made progress: the user timeout counts from here.
            self.live.unacked_since = (self.in_flight() > 0).then_some(now);
            self.rec.rtt.reset_backoff();
            self.rec.dupacks = 0;
            self.ecn_end_reduction(now);
            if self.rec.in_recovery {
                if ack.diff(self.rec.recovery_point) >= 0 {
                    self.rec.in_recovery = false;
                    self.rec.cc.on_recovery_end(now);
                } else if !self.opts.sack_enabled {
                    // NewReno partial ACK (RFC 6582): retransmit the next hole now.
                    self.rec.high_rxt = self.snd.una;
                }
            } else if cwnd_limited && delivered > 0 && self.rec.cwr_until.is_none() {
                self.rec.cc.on_ack(now, delivered, self.rec.rtt.srtt());
            }
            if self.snd.max.diff(self.snd.una) > 0 {
                self.timers.set(Timer::Rto, now + self.rec.rtt.rto());
                self.arm_tail_probe(now);
            } else {
                self.timers.stop_all(&[Timer::Rto, Timer::Tlp]);
            }
            self.on_fin_acked(now);
            self.chrono.ack_recv = Some(now);
            // `MSG_MORE` holds a tail only until the next ACK (Linux
            // applies it when the send pushes, not when an ACK does).
            self.snd.more = false;
            // All acknowledged and nothing queued: idle.
            if data_acked > 0 {
                let drained = self.drained();
                self.chrono.stop(now, Limit::Busy, drained);
            }
        } else if ack == self.snd.una
            && seg.payload.is_empty()
            && !seg.hdr.fin
            && window == self.snd.wnd
            && self.snd.max.diff(self.snd.una) > 0
        {
            self.rec.dupacks += 1;
            self.stats.dup_acks += 1;
            let lost = self.opts.sack_enabled
                && self
                    .rec
                    .scoreboard
                    .is_lost(self.snd.una, self.snd.mss, self.sack_thresh());
            if !self.rec.in_recovery && (self.rec.dupacks >= DUP_THRESH || lost) {
                self.enter_recovery(now);
            }
        }
        // SACK blocks that mark the first unacknowledged segment lost
        // start recovery also on an ACK that advanced the cumulative
        // point (RFC 6675 looks only on duplicate ACKs; Linux, and RACK,
        // RFC 8985, on any ACK): waiting for duplicates that may never
        // come leaves the hole to the tail probe or the RTO.
        if newly_sacked > 0
            && !self.rec.in_recovery
            && self
                .rec
                .scoreboard
                .is_lost(self.snd.una, self.snd.mss, self.sack_thresh())
        {
            self.enter_recovery(now);
        }
        let una_advanced = self.snd.una.diff(una_before) > 0;
        if self.rec.undo.is_some() && self.try_undo(seg, was_recovering, was_lost, una_advanced) {
            // The cut was needless: nothing here is lost after all.
            self.timers.stop(Timer::Reorder);
        } else if was_lost {
            self.frto_on_ack(ack, una_advanced, newly_sacked);
        }
        let newly_lost = self.opts.sack_enabled && self.detect_loss_by_time(now);
        let was_reducing = was_recovering || self.rec.cwr_until.is_some();
        self.ecn_on_echo(now, seg);
        if self.reducing() {
            self.reduce_window(delivered_now, una_advanced, newly_lost || !was_reducing);
        }
        // Window update (RFC 9293 3.10.7.4).
        if self.snd.wl1.diff(seg.hdr.seq) < 0
            || (self.snd.wl1 == seg.hdr.seq && self.snd.wl2.diff(ack) <= 0)
        {
            self.snd.wnd = window;
            self.snd.max_wnd = self.snd.max_wnd.max(window);
            self.snd.wl1 = seg.hdr.seq;
            self.snd.wl2 = ack;
            if window > 0 {
                self.timers.stop(Timer::Persist);
                self.persist_backoff = 0;
            }
        }
    }

    /// An ACK while a tail loss probe is out (RFC 8985 7.4, as Linux's
    /// `tcp_process_tlp_ack`): once it covers the probe, a probe that
    /// was a retransmission repaired a loss, unless a D-SACK says the
    /// original arrived too, and the window is reduced once; a duplicate
    /// ACK that reports nothing new says both arrived.
    fn on_ack_after_tail_probe(
        &mut self,
        now: Instant,
        seg: &Segment<'_>,
        ack: Seq,
        sacked: usize,
    ) {
        let Some(high) = self.rec.tlp.high else {
            return;
        };
        // RFC 2883: a D-SACK says the probe was a duplicate.
        let dsack = seg.dsack(ack).is_some();
        if ack.diff(high) >= 0 {
            self.rec.tlp.high = None;
            if self.rec.tlp.retrans && !dsack {
                self.rec.cc.on_congestion(now, self.in_flight());
                self.rec.cc.on_recovery_end(now);
            }
        } else if seg
            .hdr
            .sack
            .iter()
            .flatten()
            .any(|&(_, end)| end.diff(high) >= 0)
        {
            // The probe (the last data) arrived, what is below it did not:
            // sent a round trip and more before the probe, it is lost (RFC
            // 8985 6.2's rule for the segments sent before one delivered).
            if !self.rec.in_recovery && ack.diff(high) < 0 {
                self.enter_recovery(now);
            }
        } else if ack == self.snd.una && sacked == 0 && seg.payload.is_empty() {
            self.rec.tlp.high = None;
        }
    }

    pub(super) fn enter_recovery(&mut self, now: Instant) {
        if self.rec.loss_until.is_some() {
            // Going back after a timeout: everything is being resent
            // and the window was cut once already (Linux's Loss state).
            return;
        }
        self.rec.tlp = Default::default();
        self.timers.stop(Timer::Tlp);
        self.rec.in_recovery = true;
        self.rec.recovery_point = self.snd.max;
        self.rec.high_rxt = self.snd.una;
        // A reduction for an ECN echo under way goes on as the recovery's
        // (the window is cut once: Linux's `tcp_enter_recovery` from CWR).
        let continues_cwr = self.rec.cwr_until.is_some();
        let prior = (!continues_cwr).then(|| (self.rec.cc.cwnd(), self.rec.cc.ssthresh()));
        self.undo_begin(prior);
        if self.rec.cwr_until.take().is_none() {
            self.begin_reduction(now);
            self.ecn_window_cut();
        }
        self.stats.fast_retransmits += 1;
        self.forget_rtt_timing();
    }

    pub(super) fn on_fin_acked(&mut self, now: Instant) {
        let fin_acked = self.snd.fin_queued
            && self.snd.buf.is_empty()
            && self.snd.una.diff(self.snd.data_start) > 0;
        if !fin_acked {
            return;
        }
        match self.state {
            State::FinWait1 => {
                self.state = State::FinWait2;
                self.arm_fin_wait2(now);
            }
            State::Closing => self.enter_time_wait(),
            State::LastAck => {
                self.state = State::Closed;
                self.clear_timers();
            }
            _ => {}
        }
    }

    pub(super) fn enter_time_wait(&mut self) {
        self.state = State::TimeWait;
        // TIME-WAIT's own timer is set on the next timer poll, with `now`.
        self.timers
            .stop_all(&[Timer::Rto, Timer::Persist, Timer::FinWait2, Timer::TimeWait]);
    }

    pub(super) fn sample_rtt(&mut self, now: Instant, ack: Seq) {
        if let Some((seq, sent)) = self.rec.rtt_probe {
            if ack.diff(seq) > 0 {
                let rtt = now.saturating_duration_since(sent);
                self.rec.rtt.sample(rtt);
                self.rec.rack.on_rtt(rtt);
                self.rec.rtt_probe = None;
            }
        }
    }

    /// A retransmission: no RTT sample may come from what is in flight
    /// now (Karn), neither the RTO's timed segment nor the controller's
    /// per-ACK samples.
    pub(super) fn forget_rtt_timing(&mut self) {
        self.rec.rtt_probe = None;
        self.rec.rack.forget_samples(self.snd.max);
    }

    /// The RTT of the newest segment this ACK covers, wholly or in part
    /// (a burst cut by the port), for the controller (Linux's
    /// `ca_rtt_us`): given before the window grows on it.
    fn sample_rtt_per_ack(&mut self, now: Instant, ack: Seq) {
        if let Some(at) = self.rec.rack.on_cumulative_ack(ack) {
            let rtt = now.saturating_duration_since(at);
            let (una, nxt) = (ack.0, self.snd.nxt.0);
            self.rec.cc.on_rtt_sample(now, rtt, una, nxt);
        }
    }

    pub(super) fn process_data(&mut self, now: Instant, seg: &Segment<'_>) {
        if self.orphaned
            && matches!(self.state, State::FinWait1 | State::FinWait2)
            && (seg.hdr.seq + seg.payload.len()).diff(self.rcv.nxt) > 0
            && !seg.payload.is_empty()
        {
            // RFC 1122 4.2.2.13: nobody will read this; say so with a reset.
            self.reset_orphan(seg.hdr.ack);
            return;
        }
        if seg.hdr.fin {
            self.rcv.peer_fin = Some(seg.hdr.seq + seg.payload.len());
        }
        let receiving = matches!(
            self.state,
            State::Established | State::FinWait1 | State::FinWait2
        );
        if receiving && !seg.payload.is_empty() {
            self.ecn_on_data(seg);
            // Trim what we already have (and say it came twice).
            self.note_duplicate(seg);
            let skip = self.rcv.nxt.since(seg.hdr.seq).min(seg.payload.len());
            let data = &seg.payload[skip..];
            let offset = seg.hdr.seq.since(self.rcv.nxt);
            let before_ooo = self.rcv.buf.ooo_bytes();
            let out = self.rcv.buf.write_at(offset, data);
            if out.dropped {
                self.stats.ooo_dropped += 1;
            }
            self.stats.bytes_in += out.advanced as u64;
            self.rcv.nxt += out.advanced;
            if !data.is_empty() {
                self.chrono.data_recv = Some(now);
            }
            if out.advanced > 0 {
                self.autotune(now);
            }
            if offset > 0 {
                // Out of order: an immediate duplicate ACK for each (with SACK).
                self.owed.dupacks_owed = (self.owed.dupacks_owed + 1).min(64);
                self.owed.ack_now = true;
            } else if before_ooo > 0 || out.advanced < data.len() {
                // Filling a hole, or beyond the window: ACK now.
                self.owed.ack_now = true;
            } else {
                self.owed.unacked_segs += 1;
                let idle = self
                    .owed
                    .last_data
                    .is_none_or(|t| now - t > self.rec.rtt.rto());
                if idle {
                    let q = self.rcv.buf.window() / (2 * self.snd.mss.max(1));
                    self.owed.quick_acks = self.owed.quick_acks.max(q.clamp(2, 16) as u32);
                }
                self.owed.last_data = Some(now);
                let quick = self.owed.quick_acks > 0 && !self.owed.pingpong;
                match self.cfg.delayed_ack {
                    Some(d)
                        if !quick
                            && self.owed.unacked_segs < 2
                            && seg.payload.len() < 2 * self.snd.mss =>
                    {
                        self.timers.get_or_set(Timer::DelayedAck, now + d);
                    }
                    _ => self.owed.ack_now = true,
                }
            }
        }
        if let Some(fin) = self.rcv.peer_fin {
            if fin == self.rcv.nxt && self.state.synchronized() {
                self.rcv.nxt += 1;
                self.owed.ack_now = true;
                match self.state {
                    State::Established => self.state = State::CloseWait,
                    State::FinWait1 => {
                        let fin_acked = self.snd.fin_queued
                            && self.snd.buf.is_empty()
                            && self.snd.una.diff(self.snd.data_start) > 0;
                        if fin_acked {
                            self.enter_time_wait();
                        } else {
                            self.state = State::Closing;
                        }
                    }
                    State::FinWait2 => self.enter_time_wait(),
                    _ => {}
                }
            } else if seg.hdr.fin && self.state == State::TimeWait && fin.diff(self.rcv.nxt) < 0 {
                // A retransmitted FIN: ACK again and restart 2 MSL.
                self.owed.ack_now = true;
                self.timers.stop(Timer::TimeWait);
            }
        }
    }

    /// An ICMP error quoting our segment `seq` (RFC 1122 4.2.3.9, RFC
    /// 5461, as Linux's `tcp_v4_err`): a handshake in progress ends with
    /// `error` (a half-open passive one silently, as Linux drops its
    /// request, for the errors that say the peer is out of reach); an
    /// established connection keeps going and reports `error` instead of
    /// a plain timeout if its retransmissions run out. A sequence number
    /// we have not sent unacknowledged is ignored (RFC 5927 5.1): false.
    pub fn on_icmp_error(&mut self, seq: Seq, error: ConnError) -> bool {
        let in_flight = seq.diff(self.snd.una) >= 0 && seq.diff(self.snd.max) < 0;
        if !in_flight {
            return false;
        }
        match self.state {
            State::SynReceived if !self.fast_open.child => {
                // Linux drops a request on unreachable, time exceeded or
                // parameter problem; a refusal (port unreachable) waits.
                if error == ConnError::Refused {
                    return true;
                }
                self.state = State::Closed;
                self.clear_timers();
            }
            State::SynSent | State::SynReceived => {
                self.error = Some(error);
                self.state = State::Closed;
                self.clear_timers();
            }
            _ => self.soft_error = Some(error),
        }
        true
    }

    /// ICMP fragmentation-needed quoting our segment `seq` with next-hop
    /// `mtu` (RFC 1191): lower the MSS to fit it and send what is in flight
    /// again in segments of the new size; not a congestion signal, so the
    /// window stays. Returns false (ignored) when `seq` is not in flight, or
    /// the MTU is implausible (below 576, Linux's floor of 552 rounded to
    /// the IPv4 minimum a host must reassemble) or no smaller than now.
    pub fn on_path_mtu(&mut self, now: Instant, seq: Seq, mtu: usize) -> bool {
        // IPv4's floor (RFC 1191 takes 576 as the least worth using) and
        // headers; IPv6's minimum link MTU (RFC 8200 §5) and 40-byte header.
        let (min_mtu, headers) = if self.remote.is_ipv6() {
            (1280, 60)
        } else {
            (576, 40)
        };
        let in_flight = seq.diff(self.snd.una) >= 0 && seq.diff(self.snd.max) < 0;
        if !self.state.synchronized() || !in_flight || mtu < min_mtu {
            return false;
        }
        let mss = mtu - headers;
        if mss >= self.snd.mss {
            return false;
        }
        self.snd.mss = mss;
        self.rec.cc.set_mss(mss);
        self.stats.pmtu_reductions += 1;
        // Go back to the first unacknowledged byte (RFC 1191 / Linux's
        // tcp_simple_retransmit), keeping cwnd.
        self.snd.nxt = self.snd.una;
        self.rec.high_rxt = self.snd.una;
        self.rec.scoreboard.clear();
        self.rec.rack.reset_delivery();
        self.timers.stop(Timer::Reorder);
        self.rec.in_recovery = false;
        self.rec.dupacks = 0;
        self.forget_rtt_timing();
        self.timers.set(Timer::Rto, now + self.rec.rtt.rto());
        true
    }
}
