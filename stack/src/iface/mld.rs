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
//!
//! A router that speaks only MLDv1 (RFC 2710) is heard too (§8.2.1): its
//! query (24 bytes where a version 2 query has at least 28) puts the host
//! in MLDv1 compatibility mode for the Older Version Querier Present
//! Timeout (§9.12: 260 s with the defaults), in which every report is a
//! version 1 report, one per group, sent to the group itself.

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
/// ICMPv6 type of a query, of either version (§5.1; RFC 2710 §3).
pub(crate) const QUERY: u8 = 130;
/// ICMPv6 type of a version 1 report (RFC 2710 §3).
const REPORT_V1: u8 = 131;
/// Bytes of a version 1 query or report (RFC 2710 §3, RFC 3810 §8.1).
pub(crate) const V1_LEN: usize = 24;
/// How long a version 1 query keeps the host in compatibility mode
/// (§9.12: robustness 2 × query interval 125 s + query response
/// interval 10 s).
const OLDER_VERSION_QUERIER_PRESENT: Duration = Duration::from_secs(260);
/// Record types (§5.2.12): the state of a group, as a query's answer,
/// and a change to it, as an unsolicited report says (EXCLUDE with no
/// sources: "every source", a plain join).
pub(crate) const MODE_IS_EXCLUDE: u8 = 2;
const CHANGE_TO_EXCLUDE: u8 = 4;

/// A report due now: which version, and for version 2 the record type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Report {
    /// A version 2 report with one record of this type per group.
    V2(u8),
    /// One version 1 report per group (compatibility mode, §8.2.1).
    V1,
}

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
    /// Until when an MLDv1 router was heard: the host speaks version 1
    /// until then (§8.2.1).
    v1_until: Option<Instant>,
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
            v1_until: None,
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

    /// A version 1 query arrived with `max_delay`: the host speaks MLDv1
    /// for the next 260 s (§8.2.1), and answers this query in it.
    pub(crate) fn query_v1(&mut self, now: Instant, max_delay: Duration) {
        self.v1_until = Some(now + OLDER_VERSION_QUERIER_PRESENT);
        self.query(now, max_delay);
    }

    /// Whether the host is in MLDv1 compatibility mode at `now`.
    pub(crate) fn speaks_v1(&self, now: Instant) -> bool {
        self.v1_until.is_some_and(|t| now < t)
    }

    /// When the next report is due.
    pub(crate) fn due(&self) -> Option<Instant> {
        self.due
    }

    /// The report due by `now`, if one is; the next is scheduled (an
    /// unsolicited report is repeated).
    pub(crate) fn take(&mut self, now: Instant) -> Option<Report> {
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
        if self.speaks_v1(now) {
            Some(Report::V1)
        } else {
            Some(Report::V2(record))
        }
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

/// A version 1 query's maximum response delay in milliseconds and its
/// multicast address (unspecified for a general query), if `body` (an
/// ICMPv6 message whose checksum was verified) is one: type 130 and
/// exactly 24 bytes (§8.1).
pub(crate) fn parse_v1_query(body: &[u8]) -> Option<(Duration, Ipv6Addr)> {
    if body.len() != V1_LEN || body[0] != QUERY {
        return None;
    }
    let ms = u16::from_be_bytes([body[4], body[5]]);
    let group: [u8; 16] = body[8..24].try_into().ok()?;
    Some((Duration::from_millis(u64::from(ms)), Ipv6Addr::from(group)))
}

/// Write a version 1 report (RFC 2710 §3) for `group` into `out` (24
/// bytes); the checksum is left 0 for the caller.
pub(crate) fn write_v1_report(out: &mut [u8], group: Ipv6Addr) {
    out[0] = REPORT_V1;
    out[1..8].fill(0);
    out[8..24].copy_from_slice(&group.octets());
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
        assert_eq!(m.take(first), Some(Report::V2(CHANGE_TO_EXCLUDE)));
        let second = m.due().unwrap();
        assert!(second > first && second <= first + Duration::from_secs(1));
        assert_eq!(m.take(second), Some(Report::V2(CHANGE_TO_EXCLUDE)));
        assert_eq!(m.due(), None);
        // The same addresses again: nothing owed.
        m.addresses(second, 5);
        assert_eq!(m.due(), None);
        // A query: one answer of the current state within its delay.
        let q = second + Duration::from_secs(5);
        m.query(q, Duration::from_secs(10));
        let due = m.due().unwrap();
        assert!(due > q && due <= q + Duration::from_secs(10));
        assert_eq!(m.take(due), Some(Report::V2(MODE_IS_EXCLUDE)));
        assert_eq!(m.due(), None);
    }

    #[test]
    fn a_version_1_query_makes_version_1_reports_for_260_s() {
        let mut m = Mld::new(9);
        let t0 = Instant::ZERO + Duration::from_secs(3);
        m.query_v1(t0, Duration::from_secs(1));
        assert!(m.speaks_v1(t0));
        let due = m.due().unwrap();
        assert!(due > t0 && due <= t0 + Duration::from_secs(1));
        assert_eq!(m.take(due), Some(Report::V1));
        // A change of addresses within the 260 s: version 1 too.
        let t1 = t0 + Duration::from_secs(100);
        m.addresses(t1, 11);
        for _ in 0..2 {
            let due = m.due().unwrap();
            assert_eq!(m.take(due), Some(Report::V1));
        }
        assert_eq!(m.due(), None);
        // After it, version 2 again.
        let t2 = t0 + Duration::from_secs(261);
        assert!(!m.speaks_v1(t2));
        m.addresses(t2, 13);
        let due = m.due().unwrap();
        assert_eq!(m.take(due), Some(Report::V2(CHANGE_TO_EXCLUDE)));
    }

    #[test]
    fn version_1_queries_parse_and_reports_write() {
        let mut q = [0u8; V1_LEN];
        q[0] = QUERY;
        q[4..6].copy_from_slice(&10_000u16.to_be_bytes());
        let (delay, group) = parse_v1_query(&q).unwrap();
        assert_eq!(delay, Duration::from_secs(10));
        assert!(group.is_unspecified());
        // A version 2 query (28 bytes) or another type is not one.
        assert_eq!(parse_v1_query(&[QUERY; 28]), None);
        q[0] = REPORT_V1;
        assert_eq!(parse_v1_query(&q), None);
        let g = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00, 2);
        let mut r = [0xffu8; V1_LEN];
        write_v1_report(&mut r, g);
        assert_eq!(r[0], REPORT_V1);
        assert_eq!(&r[1..8], &[0; 7]);
        assert_eq!(&r[8..], &g.octets());
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
