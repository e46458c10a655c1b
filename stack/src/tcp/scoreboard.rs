//! The sender's SACK scoreboard (RFC 6675): which bytes above snd_una the
//! peer holds, which are lost, and how much is in the pipe.

use super::seq::Seq;

/// Most SACKed ranges remembered; beyond it the highest is forgotten
/// (at worst it is retransmitted needlessly).
const MAX_RANGES: usize = 64;

/// SACKed ranges above snd_una, sorted and disjoint.
#[derive(Debug, Clone, Default)]
pub struct Scoreboard {
    ranges: Vec<(Seq, Seq)>,
}

impl Scoreboard {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn clear(&mut self) {
        self.ranges.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Forget everything below the cumulative ACK.
    pub fn advance(&mut self, snd_una: Seq) {
        self.ranges.retain(|&(_, e)| e.diff(snd_una) > 0);
        for r in &mut self.ranges {
            if r.0.diff(snd_una) < 0 {
                r.0 = snd_una;
            }
        }
    }

    /// Record SACK blocks; returns newly SACKed bytes. Blocks outside
    /// [snd_una, snd_nxt] or empty are ignored.
    pub fn add(&mut self, snd_una: Seq, snd_nxt: Seq, blocks: &[(Seq, Seq)]) -> usize {
        let mut new = 0;
        for &(s, e) in blocks {
            if s.diff(snd_una) < 0 || e.diff(snd_nxt) > 0 || e.diff(s) <= 0 {
                continue;
            }
            let before = self.sacked_bytes();
            // Merge every range overlapping or adjacent to [s, e).
            let key = |x: Seq| x.since(snd_una);
            let first = self.ranges.partition_point(|r| key(r.1) < key(s));
            let last = self.ranges.partition_point(|r| key(r.0) <= key(e));
            let start = self.ranges[first..last].first().map_or(s, |r| r.0.min(s));
            let end = self.ranges[first..last].last().map_or(e, |r| r.1.max(e));
            self.ranges
                .splice(first..last, std::iter::once((start, end)));
            if self.ranges.len() > MAX_RANGES {
                self.ranges.pop();
            }
            new += self.sacked_bytes().saturating_sub(before);
        }
        new
    }

    pub fn is_sacked(&self, seq: Seq) -> bool {
        self.ranges.iter().any(|&(s, e)| seq.in_range(s, e))
    }

    pub fn sacked_bytes(&self) -> usize {
        self.ranges.iter().map(|&(s, e)| e.since(s)).sum()
    }

    pub fn highest_sacked(&self) -> Option<Seq> {
        self.ranges.last().map(|r| r.1)
    }

    /// The loss edge: every unSACKed byte below it is lost (RFC 6675
    /// IsLost), none above it. Holes below the `dup_thresh`-th range from the
    /// top, or below enough SACKed bytes, are lost.
    fn loss_edge(&self, mss: usize, dup_thresh: usize) -> Option<Seq> {
        let mut count = 0;
        let mut bytes = 0;
        for &(s, e) in self.ranges.iter().rev() {
            count += 1;
            bytes += e.since(s);
            if count >= dup_thresh || bytes > dup_thresh.saturating_sub(1) * mss {
                return Some(s);
            }
        }
        None
    }

    /// RFC 6675 IsLost(seq).
    pub fn is_lost(&self, seq: Seq, mss: usize, dup_thresh: usize) -> bool {
        !self.is_sacked(seq)
            && self
                .loss_edge(mss, dup_thresh)
                .is_some_and(|edge| seq.diff(edge) < 0)
    }

    /// UnSACKed bytes in [a, b).
    fn unsacked_in(&self, a: Seq, b: Seq) -> usize {
        if b.diff(a) <= 0 {
            return 0;
        }
        let mut n = b.since(a);
        for &(s, e) in &self.ranges {
            let lo = s.max(a);
            let hi = e.min(b);
            if hi.diff(lo) > 0 {
                n -= hi.since(lo);
            }
        }
        n
    }

    /// RFC 6675 pipe, in bytes.
    pub fn pipe(
        &self,
        snd_una: Seq,
        snd_nxt: Seq,
        high_rxt: Seq,
        mss: usize,
        dup_thresh: usize,
    ) -> usize {
        let outstanding = self.unsacked_in(snd_una, snd_nxt);
        let lost = match self.loss_edge(mss, dup_thresh) {
            Some(edge) => self.unsacked_in(snd_una, edge.min(snd_nxt)),
            None => 0,
        };
        let retransmitted = self.unsacked_in(snd_una, high_rxt.min(snd_nxt));
        outstanding - lost + retransmitted
    }

    /// RFC 6675 NextSeg() rule 1: the first lost, unSACKed byte at or above
    /// max(high_rxt, snd_una), as (start, len <= mss).
    pub fn next_lost(
        &self,
        snd_una: Seq,
        snd_nxt: Seq,
        high_rxt: Seq,
        mss: usize,
        dup_thresh: usize,
    ) -> Option<(Seq, usize)> {
        let edge = self.loss_edge(mss, dup_thresh)?;
        let mut at = high_rxt.max(snd_una);
        for &(s, e) in &self.ranges {
            if at.diff(edge) >= 0 || at.diff(snd_nxt) >= 0 {
                return None;
            }
            if at.diff(s) < 0 {
                let len = s.since(at).min(snd_nxt.since(at)).min(mss);
                return (len > 0).then_some((at, len));
            }
            at = at.max(e);
        }
        None
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;

    const MSS: usize = 1000;
    const UNA: Seq = Seq(10_000);

    fn seg(i: usize) -> (Seq, Seq) {
        (UNA + i * MSS, UNA + (i + 1) * MSS)
    }

    #[test]
    fn merges_and_ignores_out_of_window() {
        let mut sb = Scoreboard::new();
        let nxt = UNA + 10 * MSS;
        assert_eq!(sb.add(UNA, nxt, &[seg(2), seg(3)]), 2000);
        assert_eq!(sb.ranges, vec![(UNA + 2000, UNA + 4000)]);
        assert_eq!(sb.add(UNA, nxt, &[seg(3)]), 0);
        assert_eq!(
            sb.add(
                UNA,
                nxt,
                &[(UNA - 5, UNA + 10), (nxt, nxt + 1), (UNA + 50, UNA + 50)]
            ),
            0
        );
        sb.add(UNA, nxt, &[seg(6)]);
        assert_eq!(sb.sacked_bytes(), 3000);
        sb.advance(UNA + 3500);
        assert_eq!(sb.ranges, vec![(UNA + 3500, UNA + 4000), seg(6)]);
        assert_eq!(sb.highest_sacked(), Some(UNA + 7000));
    }

    #[test]
    fn rfc6675_example_lost_pipe_nextseg() {
        // Ten segments out; 2, 4, 5, 6 SACKed (0-based: 1, 3, 4, 5).
        let mut sb = Scoreboard::new();
        let nxt = UNA + 10 * MSS;
        sb.add(UNA, nxt, &[seg(1), seg(3)]);
        sb.add(UNA, nxt, &[(UNA + 3000, UNA + 6000)]);
        // Three ranges' worth of SACKed bytes above segment 0 and 2.
        assert!(sb.is_lost(UNA, MSS, 3));
        assert!(sb.is_lost(UNA + 2000, MSS, 3));
        assert!(!sb.is_lost(UNA + 6000, MSS, 3));
        // Outstanding unSACKed: 0, 2, 6..9 = 6 segments; 0 and 2 lost.
        assert_eq!(sb.pipe(UNA, nxt, UNA, MSS, 3), 4 * MSS);
        assert_eq!(sb.next_lost(UNA, nxt, UNA, MSS, 3), Some((UNA, MSS)));
        // Retransmit segment 0: it counts in the pipe again.
        assert_eq!(sb.pipe(UNA, nxt, UNA + 1000, MSS, 3), 5 * MSS);
        assert_eq!(
            sb.next_lost(UNA, nxt, UNA + 1000, MSS, 3),
            Some((UNA + 2000, MSS))
        );
        assert_eq!(sb.next_lost(UNA, nxt, UNA + 3000, MSS, 3), None);
    }

    #[test]
    fn one_range_below_threshold_is_not_loss() {
        let mut sb = Scoreboard::new();
        let nxt = UNA + 10 * MSS;
        sb.add(UNA, nxt, &[seg(1)]);
        assert!(!sb.is_lost(UNA, MSS, 3));
        assert_eq!(sb.next_lost(UNA, nxt, UNA, MSS, 3), None);
        assert_eq!(sb.pipe(UNA, nxt, UNA, MSS, 3), 9 * MSS);
    }

    #[test]
    fn wraps_around_sequence_space() {
        let una = Seq(u32::MAX - 1500);
        let nxt = una + 10 * MSS;
        let mut sb = Scoreboard::new();
        sb.add(
            una,
            nxt,
            &[
                (una + 1000, una + 2000),
                (una + 3000, una + 4000),
                (una + 5000, una + 6000),
            ],
        );
        assert!(sb.is_lost(una, MSS, 3));
        assert_eq!(sb.next_lost(una, nxt, una, MSS, 3), Some((una, MSS)));
        sb.advance(una + 2500);
        assert_eq!(sb.sacked_bytes(), 2000);
    }

    proptest! {
        #[test]
        fn sacked_bytes_match_a_byte_model(blocks in proptest::collection::vec((0usize..100, 1usize..20), 0..20), high in 0usize..120) {
            let una = Seq(u32::MAX - 50);
            let nxt = una + 100;
            let mut sb = Scoreboard::new();
            let mut model = [false; 100];
            for (s, l) in blocks {
                let e = (s + l).min(100);
                sb.add(una, nxt, &[(una + s, una + e)]);
                for b in model.iter_mut().take(e).skip(s) { *b = true; }
            }
            prop_assert_eq!(sb.sacked_bytes(), model.iter().filter(|b| **b).count());
            for (i, b) in model.iter().enumerate() {
                prop_assert_eq!(sb.is_sacked(una + i), *b);
            }
            let high_rxt = una + high.min(100);
            let pipe = sb.pipe(una, nxt, high_rxt, 10, 3);
            prop_assert!(pipe <= 100 + high.min(100));
        }
    }
}
