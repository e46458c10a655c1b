//! TCP sequence numbers: 32-bit, compared modulo 2^32 (RFC 9293 §3.4).

use core::cmp::Ordering;
use core::ops::{Add, AddAssign, Sub};

/// A TCP sequence number. Comparisons are modular: `a < b` when `b` is ahead
/// of `a` by less than 2^31. This is not a total order across the whole
/// space, so `Seq` implements `PartialOrd` only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Seq(pub u32);

impl Seq {
    /// `self - other` as a signed distance.
    pub fn diff(self, other: Seq) -> i32 {
        self.0.wrapping_sub(other.0) as i32
    }

    /// Bytes from `earlier` up to `self`, zero when `earlier` is ahead.
    pub fn since(self, earlier: Seq) -> usize {
        usize::try_from(self.diff(earlier)).unwrap_or(0)
    }

    /// The later of the two in modular order.
    pub fn max(self, other: Seq) -> Seq {
        if self.diff(other) >= 0 { self } else { other }
    }

    /// The earlier of the two in modular order.
    pub fn min(self, other: Seq) -> Seq {
        if self.diff(other) <= 0 { self } else { other }
    }

    /// `lo <= self < hi` in modular order.
    pub fn in_range(self, lo: Seq, hi: Seq) -> bool {
        self.diff(lo) >= 0 && self.diff(hi) < 0
    }
}

impl PartialOrd for Seq {
    fn partial_cmp(&self, other: &Seq) -> Option<Ordering> {
        Some(self.diff(*other).cmp(&0))
    }
}

impl Add<usize> for Seq {
    type Output = Seq;
    fn add(self, n: usize) -> Seq {
        Seq(self.0.wrapping_add(n as u32))
    }
}

impl AddAssign<usize> for Seq {
    fn add_assign(&mut self, n: usize) {
        *self = *self + n;
    }
}

impl Sub<usize> for Seq {
    type Output = Seq;
    fn sub(self, n: usize) -> Seq {
        Seq(self.0.wrapping_sub(n as u32))
    }
}

impl From<smoltcp::wire::TcpSeqNumber> for Seq {
    fn from(s: smoltcp::wire::TcpSeqNumber) -> Seq {
        Seq(s.0 as u32)
    }
}

impl From<Seq> for smoltcp::wire::TcpSeqNumber {
    fn from(s: Seq) -> smoltcp::wire::TcpSeqNumber {
        smoltcp::wire::TcpSeqNumber(s.0 as i32)
    }
}

impl core::fmt::Display for Seq {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps_around() {
        let a = Seq(u32::MAX - 10);
        let b = a + 20;
        assert_eq!(b, Seq(9));
        assert!(a < b);
        assert!(b > a);
        assert_eq!(b.since(a), 20);
        assert_eq!(a.since(b), 0);
        assert_eq!(b - 20, a);
        assert!(Seq(5).in_range(a, b));
        assert!(!b.in_range(a, b));
        assert_eq!(a.max(b), b);
        assert_eq!(a.min(b), a);
    }

    proptest! {
        #[test]
        fn add_then_compare(base in any::<u32>(), n in 1usize..(1 << 31)) {
            let a = Seq(base);
            let b = a + n;
            prop_assert!(a < b);
            prop_assert!(b > a);
            prop_assert_eq!(b.since(a), n);
            prop_assert_eq!(a.since(b), 0);
            prop_assert_eq!(b - n, a);
            prop_assert!(a.in_range(a, b));
            prop_assert!(!b.in_range(a, b));
        }

        #[test]
        fn diff_is_antisymmetric(x in any::<u32>(), y in any::<u32>()) {
            let (a, b) = (Seq(x), Seq(y));
            prop_assume!(a.diff(b) != i32::MIN);
            prop_assert_eq!(a.diff(b), -b.diff(a));
            prop_assert_eq!(a.max(b).diff(a.min(b)) >= 0, true);
        }
    }
}
