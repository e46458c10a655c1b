//! RACK (RFC 8985 6): loss detected by time. A segment is lost once a
//! segment sent after it was delivered and a reordering window more than
//! the round trip has passed since it left; a retransmission can be lost
//! again the same way (the SACK count of RFC 6675 cannot see that).
//!
//! The log keeps each transmission in flight in sequence order: its range,
//! when it (last) left, and whether it was a retransmission. New data
//! appends a record (a TSO burst is one); a retransmission splits the
//! records it covers at its edges and restamps them. Original
//! transmissions leave in sequence order, so the originals a verdict
//! marks lost are a prefix: the scoreboard keeps that as its RACK edge
//! ([`Scoreboard::mark_lost_below`]); retransmissions lost again are
//! flagged here, for the sender to repair first.
//!
//! The log also gives the congestion controller an RTT sample per ACK
//! (HyStart): the newest segment an ACK covers, when no retransmission
//! since it left makes the sample ambiguous (Karn).

use std::collections::VecDeque;
use std::time::Duration;

use super::scoreboard::Scoreboard;
use super::seq::Seq;
use crate::time::Instant;

/// Most transmissions logged; past it new data goes unlogged (no verdict
/// by time for it: RFC 6675's count still finds its losses) until ACKs
/// drain the log.
const MAX_LOGGED: usize = 1 << 16;
/// The largest degree of reordering remembered, in segments (Linux's
/// `tcp_max_reordering`).
const MAX_REORDERING: usize = 300;
/// The degree of reordering assumed before any is seen, in segments
/// (RFC 5681's duplicate-ACK threshold; Linux's `tcp_reordering`).
pub const INITIAL_REORDERING: usize = 3;

/// One transmission in flight.
#[derive(Debug, Clone, Copy)]
struct Sent {
    start: Seq,
    end: Seq,
    /// When it last left.
    at: Instant,
    /// It was retransmitted at least once.
    rexmit: bool,
    /// A retransmission that RACK found lost again, not yet sent anew.
    lost: bool,
}

/// What one pass of [`Rack::detect`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Original transmissions below this are lost.
    pub lost_below: Option<Seq>,
    /// Some retransmission was found lost again.
    pub lost_again: bool,
    /// Segments not yet lost but sent before the delivered one: look again
    /// after this long (the reordering timer).
    pub wait: Option<Duration>,
}

/// RACK's state for one connection.
#[derive(Debug)]
pub struct Rack {
    log: VecDeque<Sent>,
    /// When the most recently sent segment that was delivered left, and
    /// its end (RACK.xmit_ts, RACK.end_seq).
    newest: Option<(Instant, Seq)>,
    /// The RTT of that segment (RACK.rtt).
    rtt: Duration,
    /// The smallest RTT seen (RACK.min_RTT).
    min_rtt: Option<Duration>,
    /// How many ACKs showed reordering (RACK.reordering_seen when not
    /// zero).
    reord_seen: u32,
    /// How far, in segments, a delivery was seen out of order (Linux's
    /// `tp->reordering`, `tcpi_reordering`).
    reordering: usize,
    /// Per-ACK RTT samples only from segments starting here or later: a
    /// retransmission makes what was in flight when it left ambiguous.
    karn_from: Option<Seq>,
    /// The end of the highest retransmission in the log: above it the
    /// records are originals, in the order they left.
    rexmit_high: Option<Seq>,
}

impl Default for Rack {
    fn default() -> Self {
        Self::new()
    }
}

/// `a` sent after `b` (RFC 8985's RACK_sent_after): later, or at the same
/// time and ending higher.
fn sent_after(a: (Instant, Seq), b: (Instant, Seq)) -> bool {
    a.0 > b.0 || (a.0 == b.0 && a.1.diff(b.1) > 0)
}

impl Rack {
    /// Nothing sent yet.
    pub fn new() -> Self {
        Rack {
            log: VecDeque::new(),
            newest: None,
            rtt: Duration::ZERO,
            min_rtt: None,
            reord_seen: 0,
            reordering: INITIAL_REORDERING,
            karn_from: None,
            rexmit_high: None,
        }
    }

    /// The degree of reordering seen, in segments (at least
    /// [`INITIAL_REORDERING`]).
    pub fn reordering(&self) -> usize {
        self.reordering
    }

    /// How many ACKs showed reordering.
    pub fn reord_seen(&self) -> u32 {
        self.reord_seen
    }

    /// An RTT measured by any means (RACK.min_RTT follows every sample).
    pub fn on_rtt(&mut self, rtt: Duration) {
        self.min_rtt = Some(self.min_rtt.map_or(rtt, |m| m.min(rtt)));
    }

    /// `[start, end)` left now: new data when it starts where the log
    /// ends (or the log is empty), else a retransmission of what it covers.
    pub fn on_sent(&mut self, now: Instant, start: Seq, end: Seq, retransmission: bool) {
        if end.diff(start) <= 0 {
            return;
        }
        if !retransmission {
            if self.log.len() < MAX_LOGGED && self.log.back().is_none_or(|l| start.diff(l.end) >= 0)
            {
                self.log.push_back(Sent {
                    start,
                    end,
                    at: now,
                    rexmit: false,
                    lost: false,
                });
            }
            return;
        }
        if self.rexmit_high.is_none_or(|h| end.diff(h) > 0) {
            self.rexmit_high = Some(end);
        }
        self.split_at(start);
        self.split_at(end);
        let first = self.log.partition_point(|r| r.end.diff(start) <= 0);
        for r in self.log.iter_mut().skip(first) {
            if r.start.diff(end) >= 0 {
                break;
            }
            r.at = now;
            r.rexmit = true;
            r.lost = false;
        }
    }

    /// Everything in flight is ambiguous for RTT samples from now on
    /// (Karn): a timeout, or recovery starting.
    pub fn forget_samples(&mut self, snd_max: Seq) {
        self.karn_from = Some(snd_max);
    }

    /// Cut the record that straddles `seq` in two.
    fn split_at(&mut self, seq: Seq) {
        let i = self.log.partition_point(|r| r.end.diff(seq) <= 0);
        if let Some(r) = self.log.get(i).copied() {
            if r.start.diff(seq) < 0 && r.end.diff(seq) > 0 {
                self.log[i].end = seq;
                self.log.insert(i + 1, Sent { start: seq, ..r });
            }
        }
    }

    /// The cumulative ACK reached `ack`: acknowledged records go. Returns
    /// when the newest segment it covers left, for a per-ACK RTT sample,
    /// unless a retransmission made it ambiguous.
    pub fn on_cumulative_ack(&mut self, ack: Seq) -> Option<Instant> {
        let mut newest = None;
        while let Some(r) = self.log.front_mut() {
            if r.start.diff(ack) >= 0 {
                break;
            }
            let clean = !r.rexmit && self.karn_from.is_none_or(|k| r.start.diff(k) >= 0);
            newest = clean.then_some(r.at);
            if r.end.diff(ack) > 0 {
                // Acknowledged in part: kept for the rest.
                r.start = ack;
                break;
            }
            self.log.pop_front();
        }
        if self.log.is_empty() {
            if self.karn_from.is_some_and(|k| k.diff(ack) <= 0) {
                self.karn_from = None;
            }
            self.rexmit_high = None;
        }
        newest
    }

    /// One ACK's news, before the scoreboard takes it in: `[una, ack)`
    /// acknowledged and `blocks` SACKed, `sb` as it was. Moves RACK's
    /// newest delivered segment (RFC 8985 6.2 step 2) and notes
    /// reordering (step 3: an original delivered below the highest SACKed
    /// byte).
    pub fn on_ack(
        &mut self,
        now: Instant,
        una: Seq,
        ack: Seq,
        blocks: &[(Seq, Seq)],
        sb: &Scoreboard,
        mss: usize,
    ) {
        let fack = sb.highest_sacked();
        let mut lowest_original: Option<Seq> = None;
        // Linux's order, which packetdrill's scripts see through RACK.rtt:
        // SACK blocks by sequence, then the cumulative ACK; RACK.rtt is the
        // last segment's (RFC 8985 orders by send time instead, so that
        // it is the newest's).
        let mut sacked = [(Seq(0), Seq(0)); 4];
        let n = blocks.len().min(3);
        sacked[..n].copy_from_slice(&blocks[..n]);
        sacked[..n].sort_by(|a, b| a.0.diff(b.0).cmp(&0));
        let acked = (ack.diff(una) > 0).then_some((una, ack));
        let mss = mss.max(1);
        for (i, &(s, e)) in sacked[..n].iter().chain(acked.iter()).enumerate() {
            let cumulative = i == n;
            if e.diff(s) <= 0 {
                continue;
            }
            let first = self.log.partition_point(|r| r.end.diff(s) <= 0);
            for r in self.log.iter().skip(first) {
                if r.start.diff(e) >= 0 {
                    break;
                }
                let (lo, hi) = (r.start.max(s), r.end.min(e));
                // A block counts for a segment only when it covers one
                // whole (Linux SACKs whole segments: a block of one byte
                // of a segment delivers nothing).
                if !cumulative && hi.since(lo) < mss.min(r.end.since(r.start)) {
                    continue;
                }
                let Some(new) = sb.first_unsacked(una, lo, hi) else {
                    continue; // delivered before
                };
                let rtt = now.saturating_duration_since(r.at);
                if r.rexmit && self.min_rtt.is_some_and(|m| rtt < m) {
                    // Too soon for the retransmission: the original
                    // arrived (RFC 8985 6.2 step 2).
                    continue;
                }
                if !r.rexmit && lowest_original.is_none_or(|l| new.diff(l) < 0) {
                    lowest_original = Some(new);
                }
                self.rtt = rtt;
                if self.newest.is_none_or(|n| sent_after((r.at, hi), n)) {
                    self.newest = Some((r.at, hi));
                }
            }
        }
        if let (Some(low), Some(fack)) = (lowest_original, fack) {
            if low.diff(fack) < 0 {
                self.reord_seen = self.reord_seen.saturating_add(1);
                let degree = fack.since(low).div_ceil(mss);
                if degree > self.reordering {
                    self.reordering = degree.min(MAX_REORDERING);
                }
            }
        }
    }

    /// RACK.reo_wnd (RFC 8985 6.2 step 4, as Linux's `tcp_rack_reo_wnd`):
    /// none while no reordering was seen and recovery is on or as many
    /// segments as the reordering degree are SACKed; else a quarter of the
    /// smallest RTT, at most the smoothed one.
    pub fn reo_wnd(
        &self,
        in_recovery: bool,
        sacked_segs: usize,
        srtt: Option<Duration>,
    ) -> Duration {
        if self.reord_seen == 0 && (in_recovery || sacked_segs >= self.reordering) {
            return Duration::ZERO;
        }
        let quarter = self.min_rtt.unwrap_or_default() / 4;
        srtt.map_or(quarter, |s| quarter.min(s))
    }

    /// RFC 8985 6.2 step 5: every segment in flight, unSACKed, sent before
    /// the newest delivered one and longer ago than RACK.rtt plus
    /// `reo_wnd` is lost; the rest sent before it are waited for.
    pub fn detect(
        &mut self,
        now: Instant,
        una: Seq,
        sb: &Scoreboard,
        reo_wnd: Duration,
    ) -> Verdict {
        let mut v = Verdict::default();
        let Some(newest) = self.newest else {
            return v;
        };
        for r in self.log.iter_mut() {
            if r.end.diff(una) <= 0 || r.lost {
                continue;
            }
            // The part of the record sent before the newest delivered one.
            let end = if r.at < newest.0 {
                r.end
            } else if r.at == newest.0 && r.start.diff(newest.1) < 0 {
                r.end.min(newest.1)
            } else if self.rexmit_high.is_none_or(|h| r.start.diff(h) >= 0) {
                // Only originals above, each sent after this one.
                break;
            } else {
                continue;
            };
            if !sb.any_unsacked(una, r.start.max(una), end) {
                continue;
            }
            let deadline = r.at + self.rtt + reo_wnd;
            if deadline <= now {
                if r.rexmit {
                    r.lost = true;
                    v.lost_again = true;
                } else if v.lost_below.is_none_or(|l| end.diff(l) > 0) {
                    v.lost_below = Some(end);
                }
            } else {
                let left = deadline.saturating_duration_since(now);
                v.wait = Some(v.wait.map_or(left, |w| w.max(left)));
            }
        }
        v
    }

    /// The first retransmission found lost again and not yet resent, as
    /// `(start, len)`, its unSACKed start at or above `una`.
    pub fn next_lost_again(&self, una: Seq, sb: &Scoreboard) -> Option<(Seq, usize)> {
        self.log
            .iter()
            .filter(|r| r.lost && r.end.diff(una) > 0)
            .find_map(|r| {
                let s = sb.first_unsacked(una, r.start.max(una), r.end)?;
                Some((s, r.end.since(s)))
            })
    }

    /// UnSACKed bytes of retransmissions found lost again (in the pipe as
    /// retransmitted, but gone).
    pub fn lost_again_bytes(&self, una: Seq, sb: &Scoreboard) -> usize {
        self.log
            .iter()
            .filter(|r| r.lost && r.end.diff(una) > 0)
            .filter(|r| sb.any_unsacked(una, r.start.max(una), r.end))
            .map(|r| r.end.since(r.start.max(una)))
            .sum()
    }

    /// Forget every verdict and delivery (a timeout starts over).
    pub fn reset_delivery(&mut self) {
        self.newest = None;
        for r in &mut self.log {
            r.lost = false;
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    const MSS: usize = 1000;

    fn ms(n: u64) -> Instant {
        Instant::from_millis(n)
    }

    /// Segment `i` of `MSS` bytes from sequence 1.
    fn seg(i: usize) -> (Seq, Seq) {
        (Seq(1) + i * MSS, Seq(1) + (i + 1) * MSS)
    }

    /// Ten segments sent at 100 ms as one burst, then `rtt` later the
    /// eighth SACKed.
    fn sacked_eighth(rtt: u64) -> (Rack, Scoreboard) {
        let mut rack = Rack::new();
        rack.on_rtt(Duration::from_millis(rtt));
        rack.on_sent(ms(100), seg(0).0, seg(9).1, false);
        let mut sb = Scoreboard::new();
        rack.on_ack(ms(100 + rtt), Seq(1), Seq(1), &[seg(7)], &sb, MSS);
        sb.add(Seq(1), seg(9).1, &[seg(7)]);
        (rack, sb)
    }

    #[test]
    fn segments_sent_before_a_delivered_one_are_lost_after_the_reordering_window() {
        let (mut rack, mut sb) = sacked_eighth(100);
        // One segment SACKed, no reordering seen: a quarter of min_RTT.
        let reo = rack.reo_wnd(false, 1, Some(Duration::from_millis(100)));
        assert_eq!(reo, Duration::from_millis(25));
        let v = rack.detect(ms(200), Seq(1), &sb, reo);
        assert_eq!(v.lost_below, None);
        assert_eq!(v.wait, Some(Duration::from_millis(25)));
        // Once the window has passed, everything below the SACKed eighth
        // (and nothing above it: the ninth and tenth left with it).
        let v = rack.detect(ms(225), Seq(1), &sb, reo);
        assert_eq!(v.wait, None);
        sb.mark_lost_below(v.lost_below.expect("a verdict"));
        assert_eq!(sb.lost_bytes(Seq(1), seg(9).1, MSS, 3), 7 * MSS);
        assert!(sb.is_lost(seg(6).0, MSS, 3) && !sb.is_lost(seg(8).0, MSS, 3));
        // In recovery, or with as many SACKed as the reordering degree,
        // there is no window.
        assert_eq!(rack.reo_wnd(true, 1, None), Duration::ZERO);
        assert_eq!(rack.reo_wnd(false, 3, None), Duration::ZERO);
    }

    #[test]
    fn a_retransmission_is_judged_by_its_own_time_and_can_be_lost_again() {
        let (mut rack, mut sb) = sacked_eighth(100);
        // The first two are resent at 230 and 231 ms.
        rack.on_sent(ms(230), seg(0).0, seg(0).1, true);
        rack.on_sent(ms(231), seg(1).0, seg(1).1, true);
        assert_eq!(rack.log.len(), 3, "split at the retransmissions' edges");
        // Not lost again while nothing sent after them was delivered.
        let v = rack.detect(ms(300), Seq(1), &sb, Duration::ZERO);
        assert!(!v.lost_again);
        // The second's retransmission is SACKed: the first's, sent before
        // it and a round trip ago, is lost again.
        rack.on_ack(ms(331), Seq(1), Seq(1), &[seg(1)], &sb, MSS);
        sb.add(Seq(1), seg(9).1, &[seg(1), seg(7)]);
        let v = rack.detect(ms(331), Seq(1), &sb, Duration::ZERO);
        assert!(v.lost_again);
        assert_eq!(rack.next_lost_again(Seq(1), &sb), Some((seg(0).0, MSS)));
        assert_eq!(rack.lost_again_bytes(Seq(1), &sb), MSS);
        // Sent anew, it waits for its own verdict.
        rack.on_sent(ms(332), seg(0).0, seg(0).1, true);
        assert_eq!(rack.next_lost_again(Seq(1), &sb), None);
    }

    #[test]
    fn reordering_is_measured_from_the_highest_sacked_byte() {
        let (mut rack, mut sb) = sacked_eighth(100);
        assert_eq!(
            (rack.reordering(), rack.reord_seen()),
            (INITIAL_REORDERING, 0)
        );
        // The third, never resent, arrives below the SACKed eighth: five
        // segments of reordering.
        rack.on_ack(ms(201), Seq(1), Seq(1), &[seg(2)], &sb, MSS);
        sb.add(Seq(1), seg(9).1, &[seg(2)]);
        assert_eq!((rack.reordering(), rack.reord_seen()), (6, 1));
        assert_eq!(
            rack.reo_wnd(true, 2, Some(Duration::from_millis(100))),
            Duration::from_millis(25),
            "a window again once reordering was seen"
        );
    }

    #[test]
    fn a_block_of_less_than_a_segment_delivers_nothing() {
        let mut rack = Rack::new();
        rack.on_sent(ms(100), seg(0).0, seg(3).1, false);
        let sb = Scoreboard::new();
        let last_byte = (seg(3).1 - 1, seg(3).1);
        rack.on_ack(ms(200), Seq(1), Seq(1), &[last_byte], &sb, MSS);
        assert_eq!(
            rack.detect(ms(900), Seq(1), &sb, Duration::ZERO),
            Verdict::default()
        );
    }

    #[test]
    fn cumulative_acks_drain_the_log_and_give_karn_safe_samples() {
        let mut rack = Rack::new();
        rack.on_sent(ms(100), seg(0).0, seg(1).1, false);
        rack.on_sent(ms(110), seg(2).0, seg(2).1, false);
        assert_eq!(rack.on_cumulative_ack(seg(0).1), Some(ms(100)));
        assert_eq!(rack.log.front().map(|r| r.start), Some(seg(1).0));
        rack.forget_samples(seg(2).1);
        assert_eq!(rack.on_cumulative_ack(seg(2).1), None);
        assert!(rack.log.is_empty());
        rack.on_sent(ms(120), seg(3).0, seg(3).1, false);
        assert_eq!(rack.on_cumulative_ack(seg(3).1), Some(ms(120)));
    }
}
