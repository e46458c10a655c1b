//! Multicast Listener Discovery version 2 as a host does it (RFC 3810),
//! for the groups IPv6 needs: the solicited-node group of each of our
//! addresses, so a switch that snoops multicast delivers neighbor
//! solicitations to us. The all-nodes group is never reported (§6).
//!
//! When our addresses change (at start, or when an advertised prefix
//! gives a new one) the host sends unsolicited reports, `ROBUSTNESS`
//! times, the first after a random delay of up to a second (§6.1,
//! RFC 4862 §5.4.2); a query is answered with the current state of every
//! group after a random delay within the query's maximum response delay
//! (§6.2). A leaf: `ipv6.rs` validates queries and sends the reports.

use core::net::Ipv6Addr;
use std::hash::BuildHasher;
use std::time::Duration;

use crate::time::Instant;

/// All MLDv2-capable routers (RFC 3810 §5.2.14): where reports go.
pub const ALL_MLDV2_ROUTERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0x16);

/// Unsolicited reports sent for each change (§9.1, the robustness
/// variable's default).
const ROBUSTNESS: u8 = 2;
/// Most time between unsolicited reports (§9.11: 1 s).
const UNSOLICITED_REPORT_INTERVAL: Duration = Duration::from_secs(1);
/// Bytes of one address record with no sources (§5.2.4).
pub(crate) const RECORD_LEN: usize = 20;
/// ICMPv6 type of a version 2 report (§5.2).
const REPORT_V2: u8 = 143;
/// Record types (§5.2.12): the state of a group, as a query's answer,
/// and a change to it, as an unsolicited report says (EXCLUDE with no
/// sources: "every source", a plain join).
pub(crate) const MODE_IS_EXCLUDE: u8 = 2;
const CHANGE_TO_EXCLUDE: u8 = 4;

/// What the host owes the routers.
#[derive(Debug)]
pub(crate) struct Mld {
    /// A fingerprint of the addresses whose groups were last announced
    /// ([`fingerprint`]); 0 before the first.
    announced: u128,
    /// When the next report leaves.
    due: Option<Instant>,
    /// Unsolicited reports still to send after the next.
    left: u8,
    /// The next report answers a query (records of the current state)
    /// rather than announcing a change.
    answers: bool,
    /// Random delays (§6.1, §6.2) are drawn from the stack's secret.
    secret: u64,
    draws: u64,
}

impl Mld {
    /// Nothing announced yet; delays drawn from `secret`.
    pub(crate) fn new(secret: u64) -> Self {
        Mld {
            announced: 0,
            due: None,
            left: 0,
            answers: false,
            secret,
            draws: 0,
        }
    }

    /// A delay drawn evenly from `0..max` (at least 1 µs).
    fn draw(&mut self, max: Duration) -> Duration {
        self.draws += 1;
        let h = foldhash::fast::FixedState::with_seed(self.secret).hash_one(self.draws);
        let max_us = u64::try_from(max.as_micros()).unwrap_or(u64::MAX).max(1);
        Duration::from_micros(1 + h % max_us)
    }

    /// Our addresses are now those of fingerprint `now_addrs`: when they
    /// changed, unsolicited reports are owed, the first within a second.
    pub(crate) fn addresses(&mut self, now: Instant, now_addrs: u128) {
        if now_addrs == self.announced {
            return;
        }
        self.announced = now_addrs;
        self.answers = false;
        self.left = ROBUSTNESS;
        let at = now + self.draw(UNSOLICITED_REPORT_INTERVAL);
        self.due = Some(self.due.map_or(at, |d| d.min(at)));
    }

    /// A query we must answer arrived with `max_delay`: a report of every
    /// group's state is owed within it (one already due sooner stands,
    /// §6.2 rule 1).
    pub(crate) fn query(&mut self, now: Instant, max_delay: Duration) {
        let at = now + self.draw(max_delay);
        if self.left == 0 {
            self.answers = true;
        }
        self.due = Some(self.due.map_or(at, |d| d.min(at)));
    }

    /// When the next report is due.
    pub(crate) fn due(&self) -> Option<Instant> {
        self.due
    }

    /// The record type of a report due by `now`, if one is; the next is
    /// scheduled (an unsolicited report is repeated).
    pub(crate) fn take(&mut self, now: Instant) -> Option<u8> {
        if self.due.is_none_or(|d| d > now) {
            return None;
        }
        let record = if self.answers && self.left == 0 {
            MODE_IS_EXCLUDE
        } else {
            CHANGE_TO_EXCLUDE
        };
        self.answers = false;
        self.left = self.left.saturating_sub(1);
        self.due = if self.left > 0 {
            Some(now + self.draw(UNSOLICITED_REPORT_INTERVAL))
        } else {
            None
        };
        Some(record)
    }
}

/// A fingerprint of a set of addresses (order does not matter): what
/// [`Mld::addresses`] compares, without allocating on every poll.
pub(crate) fn fingerprint(addrs: impl Iterator<Item = Ipv6Addr>) -> u128 {
    addrs.fold(0, |f, a| f ^ a.to_bits().rotate_left(1)) | 1
}

/// A query's maximum response delay (§5.1.3): the code in milliseconds
/// below 32,768, else a floating-point value.
pub(crate) fn max_response_delay(code: u16) -> Duration {
    let ms = if code < 0x8000 {
        u64::from(code)
    } else {
        let mant = u64::from(code & 0x0fff);
        let exp = u32::from((code >> 12) & 7);
        (mant | 0x1000) << (exp + 3)
    };
    Duration::from_millis(ms)
}

/// Write a version 2 report (§5.2) with one record of type `record` and no
/// sources per group into `out` (which must hold `8 + RECORD_LEN` bytes
/// per group); the checksum is left 0 for the caller.
pub(crate) fn write_report(out: &mut [u8], groups: &[Ipv6Addr], record: u8) {
    out[0] = REPORT_V2;
    out[1..6].fill(0);
    let n = u16::try_from(groups.len()).unwrap_or(u16::MAX);
    out[6..8].copy_from_slice(&n.to_be_bytes());
    for (i, g) in groups.iter().enumerate() {
        let r = &mut out[8 + i * RECORD_LEN..8 + (i + 1) * RECORD_LEN];
        r[0] = record;
        r[1..4].fill(0);
        r[4..].copy_from_slice(&g.octets());
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn unsolicited_reports_twice_within_a_second_each_then_answers() {
        let mut m = Mld::new(7);
        let t0 = Instant::ZERO;
        m.addresses(t0, 5);
        let first = m.due().unwrap();
        assert!(first > t0 && first <= t0 + Duration::from_secs(1));
        assert_eq!(m.take(t0), None);
        assert_eq!(m.take(first), Some(CHANGE_TO_EXCLUDE));
        let second = m.due().unwrap();
        assert!(second > first && second <= first + Duration::from_secs(1));
        assert_eq!(m.take(second), Some(CHANGE_TO_EXCLUDE));
        assert_eq!(m.due(), None);
        // The same addresses again: nothing owed.
        m.addresses(second, 5);
        assert_eq!(m.due(), None);
        // A query: one answer of the current state within its delay.
        let q = second + Duration::from_secs(5);
        m.query(q, Duration::from_secs(10));
        let due = m.due().unwrap();
        assert!(due > q && due <= q + Duration::from_secs(10));
        assert_eq!(m.take(due), Some(MODE_IS_EXCLUDE));
        assert_eq!(m.due(), None);
    }

    #[test]
    fn response_delay_codes() {
        assert_eq!(max_response_delay(10_000), Duration::from_secs(10));
        // Exponent 0, mantissa 0: 0x1000 << 3 ms.
        assert_eq!(max_response_delay(0x8000), Duration::from_millis(32_768));
    }

    #[test]
    fn fingerprint_ignores_order() {
        let a = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
        let b = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 2);
        assert_eq!(
            fingerprint([a, b].into_iter()),
            fingerprint([b, a].into_iter())
        );
        assert_ne!(
            fingerprint([a].into_iter()),
            fingerprint([a, b].into_iter())
        );
        assert_ne!(fingerprint(core::iter::empty()), 0);
    }
}
