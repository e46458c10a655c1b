//! The sender's SACK scoreboard (RFC 6675): which bytes above snd_una the
//! peer reported holding, which of the others count as lost, how much is in
//! the pipe, and which hole to retransmit next.
//!
//! The scoreboard keeps SACKed ranges only, sorted and disjoint, so every
//! query costs O(ranges) rather than O(bytes). Loss is monotone: an unSACKed
//! byte is lost (IsLost) exactly when it lies below the *loss edge*, the start
//! of the highest SACKed range counted from the top at which the RFC's
//! threshold (`dup_thresh` ranges, or more than `(dup_thresh - 1) * mss`
//! bytes) is reached. `pipe` and `next_lost` are computed from that edge.
//!
//! Inside, sequence numbers are compared as offsets from snd_una (modulo
//! 2^32), so the scoreboard works across sequence-number wraparound as long as
//! snd_nxt - snd_una < 2^31, which TCP guarantees.

use super::seq::Seq;

/// Most SACKed ranges remembered. When a block would need one more, the
/// highest range is forgotten (or the new block is ignored when it would be
/// the highest). Forgetting the highest range is the cheap side: those bytes
/// look unSACKed and above the loss edge, so they count in the pipe (a
/// conservative overestimate) and are not retransmitted unless later SACKs
/// above them mark them lost; the receiver reports them again in later ACKs.
/// Forgetting a low range instead would mark bytes the peer holds as lost and
/// retransmit them at once; merging ranges would mark holes SACKed and leave
/// them to the retransmission timer.
pub const MAX_RANGES: usize = 64;

/// The sender's SACK scoreboard: SACKed ranges above snd_una.
#[derive(Debug, Clone)]
pub struct Scoreboard {
    /// `[start, end)` ranges, sorted, disjoint and never adjacent (touching
    /// ranges merge), at most [`MAX_RANGES`]; allocated once.
    ranges: Vec<(Seq, Seq)>,
    /// Every unSACKed byte below this is lost by time (RACK, RFC 8985
    /// 6.2: sent a reordering window and more before a segment that was
    /// delivered), whatever the SACK count above it says.
    lost_below: Option<Seq>,
}

impl Default for Scoreboard {
    fn default() -> Self {
        Self::new()
    }
}

/// `x - base` modulo 2^32: the offset of `x` from `base`.
fn off(base: Seq, x: Seq) -> u32 {
    x.0.wrapping_sub(base.0)
}

/// Offsets from snd_una at or above this are behind snd_una (negative).
const HALF: u32 = 1 << 31;

/// An offset `x - base`, or 0 when `x` is behind `base`.
fn off_or_zero(base: Seq, x: Seq) -> u32 {
    let o = off(base, x);
    if o >= HALF { 0 } else { o }
}

/// Bytes as a `usize` (lossless on every target this crate builds for; a
/// 16-bit target saturates).
fn bytes(n: u32) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

impl Scoreboard {
    /// An empty scoreboard with room for [`MAX_RANGES`] ranges.
    pub fn new() -> Self {
        Scoreboard {
            ranges: Vec::with_capacity(MAX_RANGES),
            lost_below: None,
        }
    }

    /// Forget every range and every loss (for instance after a
    /// retransmission timeout).
    pub fn clear(&mut self) {
        self.ranges.clear();
        self.lost_below = None;
    }

    /// Mark every unSACKed byte below `seq` lost (RACK's verdict by
    /// time); the mark only moves up, and goes once `snd_una` passes it.
    pub fn mark_lost_below(&mut self, seq: Seq) {
        if self.lost_below.is_none_or(|l| seq.diff(l) > 0) {
            self.lost_below = Some(seq);
        }
    }

    /// Whether any byte of `[start, end)` (clipped to at or above
    /// `snd_una`) is unSACKed.
    pub fn any_unsacked(&self, snd_una: Seq, start: Seq, end: Seq) -> bool {
        self.unsacked_bytes(snd_una, start, end) > 0
    }

    /// UnSACKed bytes of `[start, end)` (clipped to at or above `snd_una`).
    pub fn unsacked_bytes(&self, snd_una: Seq, start: Seq, end: Seq) -> usize {
        let (a, b) = (off_or_zero(snd_una, start), off_or_zero(snd_una, end));
        bytes(self.unsacked_in(snd_una, a, b))
    }

    /// The first unSACKed byte of `[start, end)`, all at or above `snd_una`.
    pub fn first_unsacked(&self, snd_una: Seq, start: Seq, end: Seq) -> Option<Seq> {
        let (mut at, b) = (off_or_zero(snd_una, start), off_or_zero(snd_una, end));
        for &(s, e) in &self.ranges {
            let (ks, ke) = (off_or_zero(snd_una, s), off_or_zero(snd_una, e));
            if ke <= at {
                continue;
            }
            if ks > at || at >= b {
                break;
            }
            at = ke;
        }
        (at < b).then(|| snd_una + bytes(at))
    }

    /// UnSACKed bytes counted lost (below the loss edge) in
    /// `[snd_una, snd_nxt)`.
    pub fn lost_bytes(&self, snd_una: Seq, snd_nxt: Seq, mss: usize, dup_thresh: usize) -> usize {
        let nxt = off_or_zero(snd_una, snd_nxt);
        self.loss_edge(mss, dup_thresh).map_or(0, |edge| {
            bytes(self.unsacked_in(snd_una, 0, off_or_zero(snd_una, edge).min(nxt)))
        })
    }

    /// Forget everything below the cumulative ACK: ranges ending at or below
    /// `snd_una` go, a range straddling it is trimmed to start there.
    pub fn advance(&mut self, snd_una: Seq) {
        // Ranges are sorted, so the ones to forget are a prefix.
        let gone = self.ranges.iter().take_while(|r| r.1 <= snd_una).count();
        self.ranges.drain(..gone);
        if self.lost_below.is_some_and(|l| l.diff(snd_una) <= 0) {
            self.lost_below = None;
        }
        if let Some(r) = self.ranges.first_mut() {
            if r.0 < snd_una {
                r.0 = snd_una;
            }
        }
    }

    /// Record the SACK blocks `(start, end)` of one ACK; returns the number
    /// of bytes they newly mark SACKed.
    ///
    /// A block is used only when `snd_una <= start < end <= snd_nxt` (RFC
    /// 2018; bogus or stale blocks, like RFC 5961's out-of-window ACKs, are
    /// ignored), and nothing is used when `snd_nxt` is behind `snd_una`.
    /// Ranges below `snd_una` are forgotten first, as by
    /// [`advance`](Self::advance). Bytes of a range forgotten to stay within
    /// [`MAX_RANGES`] are not subtracted from the result.
    pub fn add(&mut self, snd_una: Seq, snd_nxt: Seq, blocks: &[(Seq, Seq)]) -> usize {
        self.advance(snd_una);
        let window = off(snd_una, snd_nxt);
        if window >= HALF {
            return 0;
        }
        let mut new = 0;
        for &(s, e) in blocks {
            let (ks, ke) = (off(snd_una, s), off(snd_una, e));
            if ks >= ke || ke > window {
                continue;
            }
            new += self.insert(snd_una, ks, ke);
        }
        new
    }

    /// Merge `[una + ks, una + ke)` into the ranges (all at or above `una`);
    /// returns bytes newly covered.
    fn insert(&mut self, una: Seq, ks: u32, ke: u32) -> usize {
        let key = |x: Seq| off(una, x);
        // Ranges overlapping or adjacent to the block: [first, last).
        let first = self.ranges.partition_point(|r| key(r.1) < ks);
        let last = self.ranges.partition_point(|r| key(r.0) <= ke);
        let Some(touched) = self.ranges.get(first..last) else {
            return 0;
        };
        let overlap = touched
            .iter()
            .map(|r| key(r.1).min(ke).saturating_sub(key(r.0).max(ks)))
            .fold(0u32, u32::saturating_add);
        let start = touched.first().map_or(ks, |r| key(r.0).min(ks));
        let end = touched.last().map_or(ke, |r| key(r.1).max(ke));
        let merged = (una + bytes(start), una + bytes(end));
        if first == last {
            if self.ranges.len() >= MAX_RANGES {
                if first == self.ranges.len() {
                    // The new block would be the highest: it is the one forgotten.
                    return 0;
                }
                self.ranges.pop();
            }
            self.ranges.insert(first, merged);
        } else {
            self.ranges[first] = merged;
            self.ranges.drain(first + 1..last);
        }
        bytes((ke - ks).saturating_sub(overlap))
    }

    /// Whether the byte `seq` is SACKed.
    pub fn is_sacked(&self, seq: Seq) -> bool {
        self.ranges.iter().any(|&(s, e)| seq.in_range(s, e))
    }

    /// Bytes SACKed in total.
    pub fn sacked_bytes(&self) -> usize {
        self.ranges.iter().map(|&(s, e)| e.since(s)).sum()
    }

    /// Whether no byte is SACKed.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// One past the highest SACKed byte (the end of the highest range), or
    /// `None` when nothing is SACKed.
    pub fn highest_sacked(&self) -> Option<Seq> {
        self.ranges.last().map(|r| r.1)
    }

    /// The loss edge: every unSACKed byte below it is lost (RFC 6675
    /// IsLost), none at or above it. `None` when nothing is lost.
    ///
    /// For an unSACKed byte, the SACKed ranges above it are whole ranges, so
    /// walking down from the highest range and accumulating ranges and bytes,
    /// the first range at which the threshold is met starts the lost region.
    fn loss_edge(&self, mss: usize, dup_thresh: usize) -> Option<Seq> {
        let by_count = self.sack_loss_edge(mss, dup_thresh);
        match (by_count, self.lost_below) {
            (Some(a), Some(b)) => Some(if b.diff(a) > 0 { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    /// The loss edge by RFC 6675's count of SACKed ranges and bytes alone.
    fn sack_loss_edge(&self, mss: usize, dup_thresh: usize) -> Option<Seq> {
        let dup_thresh = dup_thresh.max(1);
        let byte_thresh = (dup_thresh - 1).saturating_mul(mss.max(1));
        let mut sacked = 0usize;
        for (count, &(s, e)) in self.ranges.iter().rev().enumerate() {
            sacked = sacked.saturating_add(e.since(s));
            if count + 1 >= dup_thresh || sacked > byte_thresh {
                return Some(s);
            }
        }
        None
    }

    /// RFC 6675 IsLost(seq): true when at least `dup_thresh` discontiguous
    /// SACKed ranges lie above `seq`, or more than `(dup_thresh - 1) * mss`
    /// bytes are SACKed above it.
    ///
    /// A SACKed byte is never lost. `dup_thresh` and `mss` are taken as at
    /// least 1. The scoreboard does not know snd_una: asking about a byte
    /// already acknowledged answers as if it were still outstanding.
    pub fn is_lost(&self, seq: Seq, mss: usize, dup_thresh: usize) -> bool {
        !self.is_sacked(seq)
            && self
                .loss_edge(mss, dup_thresh)
                .is_some_and(|edge| seq < edge)
    }

    /// UnSACKed bytes at offsets `[a, b)` from `una`.
    fn unsacked_in(&self, una: Seq, a: u32, b: u32) -> u32 {
        if b <= a {
            return 0;
        }
        let sacked = self
            .ranges
            .iter()
            .map(|&(s, e)| {
                let (ks, ke) = (off_or_zero(una, s), off_or_zero(una, e));
                ke.min(b).saturating_sub(ks.max(a))
            })
            .fold(0u32, u32::saturating_add);
        (b - a).saturating_sub(sacked)
    }

    /// RFC 6675 pipe (SetPipe), in bytes, over `[snd_una, snd_nxt)`: an
    /// unSACKed byte counts once if it is not lost, plus once more if it was
    /// retransmitted (it lies below `high_rxt`); lost bytes not retransmitted
    /// and SACKed bytes count zero.
    ///
    /// `high_rxt` is one past the highest byte retransmitted; at or below
    /// `snd_una` it means nothing was. Computed from ranges, O(ranges):
    /// `pipe = unsacked - lost + retransmitted`, each an unSACKed count over a
    /// prefix of `[snd_una, snd_nxt)`. Returns 0 when `snd_nxt` is behind
    /// `snd_una`.
    pub fn pipe(
        &self,
        snd_una: Seq,
        snd_nxt: Seq,
        high_rxt: Seq,
        mss: usize,
        dup_thresh: usize,
    ) -> usize {
        let nxt = off_or_zero(snd_una, snd_nxt);
        let outstanding = self.unsacked_in(snd_una, 0, nxt);
        let lost = self.loss_edge(mss, dup_thresh).map_or(0, |edge| {
            self.unsacked_in(snd_una, 0, off_or_zero(snd_una, edge).min(nxt))
        });
        let rxt = self.unsacked_in(snd_una, 0, off_or_zero(snd_una, high_rxt).min(nxt));
        bytes(outstanding - lost.min(outstanding)).saturating_add(bytes(rxt))
    }

    /// RFC 6675 NextSeg() rule (1): the first unSACKed, lost byte at or above
    /// `max(high_rxt, snd_una)`, as `(start, len)` where `len <= mss` and the
    /// segment runs into neither the next SACKed range nor `snd_nxt`. `None`
    /// when there is none. Rules (2) and (3), new data and the rescue
    /// retransmission, are the caller's. `mss` is taken as at least 1.
    pub fn next_lost(
        &self,
        snd_una: Seq,
        snd_nxt: Seq,
        high_rxt: Seq,
        mss: usize,
        dup_thresh: usize,
    ) -> Option<(Seq, usize)> {
        let edge = self.loss_edge(mss, dup_thresh)?;
        let nxt = off_or_zero(snd_una, snd_nxt);
        // Nothing at or above the edge is lost; nothing at or above snd_nxt
        // was sent.
        let limit = off_or_zero(snd_una, edge).min(nxt);
        let mut at = off_or_zero(snd_una, high_rxt);
        for &(s, e) in &self.ranges {
            if at >= limit {
                return None;
            }
            let (ks, ke) = (off_or_zero(snd_una, s), off_or_zero(snd_una, e));
            if at < ks {
                // A hole [at, ks), lost up to the edge (a range start by
                // the SACK count; by time, anywhere).
                let len = bytes(ks.min(limit) - at).min(mss.max(1));
                return Some((snd_una + bytes(at), len));
            }
            at = at.max(ke);
        }
        // Above the highest range only a loss by time reaches.
        (at < limit).then(|| (snd_una + bytes(at), bytes(limit - at).min(mss.max(1))))
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;

    const MSS: usize = 1000;
    const UNA: Seq = Seq(10_000);

    /// Segment `i` (0-based) of `MSS` bytes after `una`.
    fn seg_at(una: Seq, i: usize) -> (Seq, Seq) {
        (una + i * MSS, una + (i + 1) * MSS)
    }

    fn seg(i: usize) -> (Seq, Seq) {
        seg_at(UNA, i)
    }

    #[test]
    fn blocks_merge_overlap_and_out_of_window_are_ignored() {
        let mut sb = Scoreboard::new();
        let nxt = UNA + 10 * MSS;
        assert!(sb.is_empty());
        assert_eq!(sb.add(UNA, nxt, &[seg(2), seg(3)]), 2000);
        assert_eq!(sb.ranges, vec![(UNA + 2000, UNA + 4000)]);
        // Already known: nothing new.
        assert_eq!(sb.add(UNA, nxt, &[seg(3)]), 0);
        // Overlapping both sides of a gap: only the gap is new.
        assert_eq!(sb.add(UNA, nxt, &[seg(5)]), 1000);
        assert_eq!(sb.add(UNA, nxt, &[(UNA + 3500, UNA + 5500)]), 1000);
        assert_eq!(sb.ranges, vec![(UNA + 2000, UNA + 6000)]);
        // Below snd_una, past snd_nxt, empty, reversed: ignored.
        let bad = [
            (UNA - 5, UNA + 10),
            (nxt - 10, nxt + 1),
            (UNA + 50, UNA + 50),
            (UNA + 60, UNA + 50),
            (nxt + 100, nxt + 200),
            (UNA - 300, UNA - 200),
        ];
        assert_eq!(sb.add(UNA, nxt, &bad), 0);
        assert_eq!(sb.sacked_bytes(), 4000);
        // A block ending exactly at snd_nxt is fine.
        assert_eq!(sb.add(UNA, nxt, &[seg(9)]), 1000);
        assert_eq!(sb.highest_sacked(), Some(nxt));
        // snd_nxt behind snd_una: nothing is used.
        assert_eq!(sb.add(UNA, UNA - 1, &[seg(0)]), 0);
        assert!(sb.is_sacked(UNA + 2000));
        assert!(!sb.is_sacked(UNA + 6000));
        assert!(!sb.is_sacked(UNA + 1999));
    }

    #[test]
    fn adjacent_blocks_merge_into_one_range() {
        let mut sb = Scoreboard::new();
        let nxt = UNA + 10 * MSS;
        assert_eq!(sb.add(UNA, nxt, &[seg(1), seg(3), seg(2)]), 3000);
        assert_eq!(sb.ranges, vec![(UNA + 1000, UNA + 4000)]);
    }

    #[test]
    fn advance_trims_and_forgets() {
        let mut sb = Scoreboard::new();
        let nxt = UNA + 10 * MSS;
        sb.add(UNA, nxt, &[seg(2), seg(3), seg(6)]);
        sb.advance(UNA + 3500);
        assert_eq!(sb.ranges, vec![(UNA + 3500, UNA + 4000), seg(6)]);
        assert_eq!(sb.sacked_bytes(), 1500);
        sb.advance(UNA + 7000);
        assert!(sb.is_empty());
        assert_eq!(sb.highest_sacked(), None);
        // `add` forgets what lies below its snd_una too.
        sb.add(UNA, nxt, &[seg(1), seg(4)]);
        assert_eq!(sb.add(UNA + 3000, nxt, &[seg(5)]), 1000);
        assert_eq!(sb.ranges, vec![(UNA + 4000, UNA + 6000)]);
        sb.clear();
        assert!(sb.is_empty());
    }

    #[test]
    fn range_count_is_bounded_forgetting_the_highest() {
        let mut sb = Scoreboard::new();
        let cap = sb.ranges.capacity();
        let nxt = UNA + 1000;
        // Every other byte: 64 ranges fill the board.
        for i in 0..MAX_RANGES {
            assert_eq!(
                sb.add(UNA, nxt, &[(UNA + (2 * i + 1), UNA + (2 * i + 2))]),
                1
            );
        }
        assert_eq!(sb.ranges.len(), MAX_RANGES);
        let top = sb.highest_sacked();
        // A new highest block is ignored.
        assert_eq!(sb.add(UNA, nxt, &[(UNA + 900, UNA + 910)]), 0);
        assert_eq!(sb.highest_sacked(), top);
        // Blocks touching a range still merge.
        assert_eq!(sb.add(UNA, nxt, &[(UNA + 2, UNA + 3)]), 1);
        assert_eq!(sb.ranges.len(), MAX_RANGES - 1);
        assert_eq!(sb.add(UNA, nxt, &[(UNA + 500, UNA + 510)]), 10);
        assert_eq!(sb.ranges.len(), MAX_RANGES);
        // A new lower block takes the highest range's place.
        assert_eq!(sb.add(UNA, nxt, &[(UNA + 300, UNA + 310)]), 10);
        assert_eq!(sb.ranges.len(), MAX_RANGES);
        assert_eq!(sb.highest_sacked(), Some(UNA + 310));
        assert_eq!(sb.ranges.capacity(), cap, "no reallocation");
    }

    #[test]
    fn is_lost_by_range_count_and_by_bytes() {
        let nxt = UNA + 100 * MSS;
        // Three small discontiguous ranges above: lost by count.
        let mut sb = Scoreboard::new();
        sb.add(
            UNA,
            nxt,
            &[
                (UNA + 1000, UNA + 1100),
                (UNA + 2000, UNA + 2100),
                (UNA + 3000, UNA + 3100),
            ],
        );
        assert!(sb.is_lost(UNA, MSS, 3));
        assert!(sb.is_lost(UNA + 999, MSS, 3));
        // Only two ranges (300 bytes) above the second hole.
        assert!(!sb.is_lost(UNA + 1100, MSS, 3));
        assert!(!sb.is_lost(UNA + 1050, MSS, 3), "SACKed is never lost");
        // Fewer ranges needed with a lower threshold.
        assert!(sb.is_lost(UNA + 1100, MSS, 2));
        assert!(!sb.is_lost(UNA + 3100, MSS, 1));
        assert!(sb.is_lost(UNA + 2100, MSS, 1));
        // Two ranges of bytes: lost only past (3 - 1) * MSS bytes.
        let mut sb = Scoreboard::new();
        sb.add(
            UNA,
            nxt,
            &[(UNA + 1000, UNA + 2000), (UNA + 3000, UNA + 4000)],
        );
        assert!(!sb.is_lost(UNA, MSS, 3));
        sb.add(UNA, nxt, &[(UNA + 4000, UNA + 4001)]);
        assert!(sb.is_lost(UNA, MSS, 3));
        // One range of more than 2 * MSS bytes.
        let mut sb = Scoreboard::new();
        sb.add(UNA, nxt, &[(UNA + 1000, UNA + 3000)]);
        assert!(!sb.is_lost(UNA, MSS, 3));
        sb.add(UNA, nxt, &[(UNA + 3000, UNA + 3001)]);
        assert!(sb.is_lost(UNA, MSS, 3));
        assert!(!sb.is_lost(UNA + 3001, MSS, 3));
        // Nothing SACKed: nothing lost.
        assert!(!Scoreboard::new().is_lost(UNA, MSS, 3));
    }

    #[test]
    fn rfc6675_example_lost_pipe_nextseg() {
        // Ten segments of 1000 bytes out; segments 2, 4, 5, 6 (1-based)
        // SACKed, i.e. 0-based 1, 3, 4, 5.
        let mut sb = Scoreboard::new();
        let nxt = UNA + 10 * MSS;
        assert_eq!(sb.add(UNA, nxt, &[seg(1)]), 1000);
        assert_eq!(sb.add(UNA, nxt, &[seg(3), seg(1)]), 1000);
        assert_eq!(sb.add(UNA, nxt, &[(UNA + 3000, UNA + 6000), seg(3)]), 2000);
        // Above segment 0: 2 ranges, 4000 bytes; above segment 2: one range
        // of 3000 bytes > 2 * MSS. Both lost; 6..9 are not.
        assert!(sb.is_lost(UNA, MSS, 3));
        assert!(sb.is_lost(UNA + 2000, MSS, 3));
        assert!(sb.is_lost(UNA + 2999, MSS, 3));
        assert!(!sb.is_lost(UNA + 6000, MSS, 3));
        assert!(!sb.is_lost(UNA + 9999, MSS, 3));
        // Outstanding unSACKed: 0, 2, 6, 7, 8, 9; lost: 0 and 2.
        assert_eq!(sb.pipe(UNA, nxt, UNA, MSS, 3), 4 * MSS);
        assert_eq!(sb.next_lost(UNA, nxt, UNA, MSS, 3), Some((UNA, MSS)));
        // After retransmitting segment 0, it counts in the pipe again.
        let hr = UNA + MSS;
        assert_eq!(sb.pipe(UNA, nxt, hr, MSS, 3), 5 * MSS);
        assert_eq!(sb.next_lost(UNA, nxt, hr, MSS, 3), Some((UNA + 2000, MSS)));
        // After segment 2 too: high_rxt covers the SACKed 1 (counts zero).
        let hr = UNA + 3 * MSS;
        assert_eq!(sb.pipe(UNA, nxt, hr, MSS, 3), 6 * MSS);
        assert_eq!(sb.next_lost(UNA, nxt, hr, MSS, 3), None);
        // The cumulative ACK covers 0..2: the rest is 6..9 in flight.
        sb.advance(UNA + 6 * MSS);
        assert!(sb.is_empty());
    }

    #[test]
    fn pipe_counts_retransmitted_lost_bytes_once_and_others_twice() {
        let mut sb = Scoreboard::new();
        let nxt = UNA + 10 * MSS;
        // Segments 5, 7, 9 SACKed: 0..4 lost (3 ranges above), 6 and 8 not.
        sb.add(UNA, nxt, &[seg(5), seg(7), seg(9)]);
        assert_eq!(sb.pipe(UNA, nxt, UNA, MSS, 3), 2 * MSS);
        // Retransmitted up to the middle of segment 6: 0..4 once (lost,
        // retransmitted), half of 6 twice.
        let hr = UNA + 6500;
        assert_eq!(sb.pipe(UNA, nxt, hr, MSS, 3), 5000 + 2000 + 500);
        // high_rxt past snd_nxt is clamped; behind snd_una means none.
        assert_eq!(sb.pipe(UNA, nxt, nxt + 5000, MSS, 3), 5000 + 2 * 2000);
        assert_eq!(sb.pipe(UNA, nxt, UNA - 100, MSS, 3), 2 * MSS);
        // snd_nxt behind snd_una: empty.
        assert_eq!(sb.pipe(UNA, UNA - 1, UNA, MSS, 3), 0);
        // Nothing SACKed: everything sent is in flight.
        let empty = Scoreboard::new();
        assert_eq!(empty.pipe(UNA, nxt, UNA, MSS, 3), 10 * MSS);
        assert_eq!(empty.pipe(UNA, nxt, UNA + 1500, MSS, 3), 10 * MSS + 1500);
    }

    #[test]
    fn next_lost_walks_holes_in_order_and_respects_high_rxt() {
        let mut sb = Scoreboard::new();
        let nxt = UNA + 20 * MSS;
        // Holes: [0, 2000), [3000, 3500), [4000, 6000); SACKed 2, 3.5-4, 6..9.
        sb.add(
            UNA,
            nxt,
            &[
                seg(2),
                (UNA + 3500, UNA + 4000),
                (UNA + 6000, UNA + 7000),
                (UNA + 8000, UNA + 10_000),
            ],
        );
        let mut high = UNA;
        let mut got = Vec::new();
        while let Some((s, len)) = sb.next_lost(UNA, nxt, high, MSS, 3) {
            got.push((s.since(UNA), len));
            high = s + len;
        }
        assert_eq!(
            got,
            vec![
                (0, 1000),
                (1000, 1000),
                (3000, 500),
                (4000, 1000),
                (5000, 1000)
            ]
        );
        // The hole [7000, 8000) has 1 range (2000 bytes) above: not lost.
        assert!(!sb.is_lost(UNA + 7000, MSS, 3));
        // Starting inside a hole starts there; inside a range skips it.
        assert_eq!(
            sb.next_lost(UNA, nxt, UNA + 1200, MSS, 3),
            Some((UNA + 1200, 800))
        );
        assert_eq!(
            sb.next_lost(UNA, nxt, UNA + 2500, MSS, 3),
            Some((UNA + 3000, 500))
        );
        // A small MSS cuts the segment; high_rxt below snd_una is snd_una.
        assert_eq!(sb.next_lost(UNA, nxt, UNA - 7, 300, 3), Some((UNA, 300)));
        // snd_nxt cuts it too.
        let mut sb = Scoreboard::new();
        sb.add(UNA, nxt, &[seg(5), seg(7), seg(9)]);
        assert_eq!(sb.next_lost(UNA, UNA + 500, UNA, MSS, 3), Some((UNA, 500)));
        assert_eq!(
            sb.next_lost(UNA, nxt, UNA + 4500, MSS, 3),
            Some((UNA + 4500, 500))
        );
        assert_eq!(Scoreboard::new().next_lost(UNA, nxt, UNA, MSS, 3), None);
    }

    #[test]
    fn a_loss_by_time_extends_the_edge_into_a_hole_and_goes_with_snd_una() {
        let mut sb = Scoreboard::new();
        let nxt = UNA + 10 * MSS;
        // One SACKed segment: nothing lost by the count.
        sb.add(UNA, nxt, &[seg(7)]);
        assert_eq!(sb.next_lost(UNA, nxt, UNA, MSS, 3), None);
        // RACK marks what was sent before the SACKed one up to the middle
        // of the hole below it.
        sb.mark_lost_below(UNA + 5 * MSS + 500);
        sb.mark_lost_below(UNA + 2 * MSS); // never moves down
        assert_eq!(sb.lost_bytes(UNA, nxt, MSS, 3), 5 * MSS + 500);
        assert!(sb.is_lost(UNA + 5 * MSS + 499, MSS, 3));
        assert!(!sb.is_lost(UNA + 5 * MSS + 500, MSS, 3));
        assert_eq!(
            sb.next_lost(UNA, nxt, UNA + 5 * MSS, MSS, 3),
            Some((UNA + 5 * MSS, 500))
        );
        assert_eq!(sb.next_lost(UNA, nxt, UNA + 5 * MSS + 500, MSS, 3), None);
        // Lost bytes leave the pipe (RFC 6675 SetPipe).
        assert_eq!(
            sb.pipe(UNA, nxt, UNA, MSS, 3),
            10 * MSS - MSS - (5 * MSS + 500)
        );
        assert_eq!(sb.first_unsacked(UNA, seg(7).0, seg(9).1), Some(seg(8).0));
        assert_eq!(sb.first_unsacked(UNA, seg(7).0, seg(7).1), None);
        assert_eq!(sb.unsacked_bytes(UNA, seg(6).0, seg(9).1), 3 * MSS);
        sb.advance(UNA + 6 * MSS);
        assert_eq!(sb.lost_bytes(UNA + 6 * MSS, nxt, MSS, 3), 0);
        sb.mark_lost_below(UNA + 7 * MSS);
        sb.clear();
        assert_eq!(sb.lost_bytes(UNA + 6 * MSS, nxt, MSS, 3), 0);
    }

    #[test]
    fn wraps_around_sequence_space() {
        let una = Seq(u32::MAX - 1500);
        let nxt = una + 10 * MSS;
        let mut sb = Scoreboard::new();
        let blocks = [seg_at(una, 1), seg_at(una, 3), seg_at(una, 5)];
        assert_eq!(sb.add(una, nxt, &blocks), 3000);
        // Segment 1 runs across 2^32.
        assert!(sb.is_sacked(Seq(u32::MAX)));
        assert!(sb.is_sacked(Seq(0)));
        assert!(sb.is_lost(una, MSS, 3));
        assert!(!sb.is_lost(una + 4000, MSS, 3));
        assert_eq!(sb.next_lost(una, nxt, una, MSS, 3), Some((una, MSS)));
        // Only segment 0 has three ranges above it; segment 2 has two, and
        // 2000 bytes (not more than 2 * MSS).
        assert!(!sb.is_lost(una + 2000, MSS, 3));
        assert_eq!(sb.next_lost(una, nxt, una + MSS, MSS, 3), None);
        // UnSACKed 0, 2, 4, 6..9; lost: 0.
        assert_eq!(sb.pipe(una, nxt, una, MSS, 3), 6 * MSS);
        assert_eq!(sb.highest_sacked(), Some(una + 6000));
        sb.advance(una + 2500);
        assert_eq!(sb.sacked_bytes(), 2000);
        assert_eq!(sb.ranges[0], seg_at(una, 3));
    }

    /// Per-byte model of one scoreboard over a small window.
    struct Model {
        sacked: Vec<bool>,
    }

    impl Model {
        /// RFC 6675 IsLost straight from the definition, for byte `i`.
        fn is_lost(&self, i: usize, mss: usize, dup: usize) -> bool {
            if self.sacked[i] {
                return false;
            }
            let above = &self.sacked[i + 1..];
            let bytes = above.iter().filter(|b| **b).count();
            let ranges = above
                .iter()
                .enumerate()
                .filter(|&(j, b)| *b && (j == 0 || !above[j - 1]))
                .count();
            ranges >= dup.max(1) || bytes > (dup.max(1) - 1) * mss.max(1)
        }

        /// RFC 6675 SetPipe, octet by octet.
        fn pipe(&self, high_rxt: usize, mss: usize, dup: usize) -> usize {
            (0..self.sacked.len())
                .filter(|&i| !self.sacked[i])
                .map(|i| usize::from(!self.is_lost(i, mss, dup)) + usize::from(i < high_rxt))
                .sum()
        }
    }

    proptest! {
        #[test]
        fn scoreboard_matches_a_byte_model(
            base in any::<u32>(),
            blocks in proptest::collection::vec((-20i64..140, 0usize..30), 0..24),
            high in 0usize..130,
            mss in 1usize..40,
            dup in 1usize..5,
            acked in 0usize..110,
        ) {
            const W: usize = 100;
            let una = Seq(base);
            let nxt = una + W;
            let mut sb = Scoreboard::new();
            let mut model = Model { sacked: vec![false; W] };
            for (s, l) in blocks {
                let start = if s < 0 { una - s.unsigned_abs() as usize } else { una + s as usize };
                let end = start + l;
                let valid = s >= 0 && l > 0 && s as usize + l <= W;
                let before = model.sacked.iter().filter(|b| **b).count();
                if valid {
                    for b in &mut model.sacked[s as usize..s as usize + l] {
                        *b = true;
                    }
                }
                let after = model.sacked.iter().filter(|b| **b).count();
                prop_assert_eq!(sb.add(una, nxt, &[(start, end)]), after - before);
            }
            prop_assert_eq!(sb.sacked_bytes(), model.sacked.iter().filter(|b| **b).count());
            prop_assert_eq!(sb.is_empty(), !model.sacked.contains(&true));
            for i in 0..W {
                prop_assert_eq!(sb.is_sacked(una + i), model.sacked[i]);
                prop_assert_eq!(sb.is_lost(una + i, mss, dup), model.is_lost(i, mss, dup), "byte {}", i);
            }
            let high_rxt = una + high;
            let pipe = sb.pipe(una, nxt, high_rxt, mss, dup);
            prop_assert_eq!(pipe, model.pipe(high.min(W), mss, dup));
            prop_assert!(pipe <= W + high.min(W));
            // NextSeg rule 1 against the model.
            let from = high.min(W);
            let want = (from..W)
                .find(|&i| model.is_lost(i, mss, dup))
                .map(|i| {
                    let run = model.sacked[i..].iter().take_while(|b| !**b).count();
                    (una + i, run.min(mss))
                });
            prop_assert_eq!(sb.next_lost(una, nxt, high_rxt, mss, dup), want);
            // The cumulative ACK moves: only what lies above stays.
            let acked = acked.min(W);
            sb.advance(una + acked);
            let left = model.sacked[acked..].iter().filter(|b| **b).count();
            prop_assert_eq!(sb.sacked_bytes(), left);
            for i in 0..W {
                prop_assert_eq!(sb.is_sacked(una + i), i >= acked && model.sacked[i]);
            }
        }
    }
}
