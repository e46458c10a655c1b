//! `Neighbors`: the IPv6 neighbor cache (RFC 4861 §7.3): what link-layer
//! address each neighbor has, learnt from the solicitations and
//! advertisements it sends, with the state RFC 4861 gives an entry.
//! Bounded: when full, the entry seen longest ago gives way.

use core::net::Ipv6Addr;
use std::time::Duration;

use serde::Serialize;
use smoltcp::wire::EthernetAddress;

use crate::time::Instant;

/// Most entries a cache holds.
pub const MAX_NEIGHBORS: usize = 1024;

/// How long a confirmed entry stays REACHABLE (RFC 4861
/// `REACHABLE_TIME`, 30 s).
pub const REACHABLE_TIME: Duration = Duration::from_secs(30);

/// An entry's state (RFC 4861 §7.3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NeighborState {
    /// Confirmed reachable within [`REACHABLE_TIME`]: a solicited
    /// advertisement answered us.
    Reachable,
    /// Learnt without a confirmation (an unsolicited message, or a
    /// reachable entry grown old): used, and checked again when it is.
    Stale,
}

/// One neighbor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Neighbor {
    mac: EthernetAddress,
    state: NeighborState,
    /// When it was learnt or last confirmed.
    at: Instant,
}

/// The neighbor cache of one stack.
#[derive(Debug, Default)]
pub(crate) struct Neighbors {
    /// Keyed by foldhash (looked up for every packet sent).
    entries: foldhash::HashMap<Ipv6Addr, Neighbor>,
}

impl Neighbors {
    /// Learn `ip` at `mac` from a message it sent: a solicited
    /// advertisement confirms it (REACHABLE); anything else leaves it
    /// STALE (RFC 4861 §7.2.3, §7.2.5). An advertisement without the
    /// override flag does not move a known entry to another address.
    pub(crate) fn learn(
        &mut self,
        now: Instant,
        ip: Ipv6Addr,
        mac: EthernetAddress,
        solicited: bool,
        overrides: bool,
    ) {
        if let Some(n) = self.entries.get_mut(&ip) {
            if n.mac != mac && !overrides {
                return;
            }
            let state = if solicited {
                NeighborState::Reachable
            } else if n.mac == mac {
                n.state
            } else {
                NeighborState::Stale
            };
            *n = Neighbor {
                mac,
                state,
                at: now,
            };
            return;
        }
        if self.entries.len() >= MAX_NEIGHBORS {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, n)| n.at)
                .map(|(ip, _)| *ip);
            if let Some(ip) = oldest {
                self.entries.remove(&ip);
            }
        }
        let state = if solicited {
            NeighborState::Reachable
        } else {
            NeighborState::Stale
        };
        self.entries.insert(
            ip,
            Neighbor {
                mac,
                state,
                at: now,
            },
        );
    }

    /// The link-layer address of `ip`, if known.
    pub(crate) fn lookup(&self, ip: &Ipv6Addr) -> Option<EthernetAddress> {
        self.entries.get(ip).map(|n| n.mac)
    }

    /// Every entry with its state at `now` (a REACHABLE entry older than
    /// [`REACHABLE_TIME`] is STALE).
    pub(crate) fn entries(&self, now: Instant) -> Vec<(Ipv6Addr, EthernetAddress, NeighborState)> {
        let mut v: Vec<_> = self
            .entries
            .iter()
            .map(|(ip, n)| {
                let state = match n.state {
                    NeighborState::Reachable if now - n.at > REACHABLE_TIME => NeighborState::Stale,
                    s => s,
                };
                (*ip, n.mac, state)
            })
            .collect();
        v.sort_by_key(|e| e.0);
        v
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod test {
    use super::*;

    const A: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
    const M1: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);
    const M2: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);

    #[test]
    fn solicited_confirms_unsolicited_leaves_stale() {
        let mut n = Neighbors::default();
        n.learn(Instant::ZERO, A, M1, false, true);
        assert_eq!(
            n.entries(Instant::ZERO),
            vec![(A, M1, NeighborState::Stale)]
        );
        n.learn(Instant::ZERO, A, M1, true, false);
        assert_eq!(n.entries(Instant::ZERO)[0].2, NeighborState::Reachable);
        let later = Instant::ZERO + REACHABLE_TIME + Duration::from_secs(1);
        assert_eq!(n.entries(later)[0].2, NeighborState::Stale);
    }

    #[test]
    fn no_override_keeps_the_known_address() {
        let mut n = Neighbors::default();
        n.learn(Instant::ZERO, A, M1, true, true);
        n.learn(Instant::ZERO, A, M2, true, false);
        assert_eq!(n.lookup(&A), Some(M1));
        n.learn(Instant::ZERO, A, M2, false, true);
        assert_eq!(n.lookup(&A), Some(M2));
        assert_eq!(n.entries(Instant::ZERO)[0].2, NeighborState::Stale);
    }

    #[test]
    fn bounded_the_oldest_gives_way() {
        let mut n = Neighbors::default();
        for i in 0..=MAX_NEIGHBORS as u16 {
            let ip = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 1, i);
            n.learn(Instant::from_millis(u64::from(i)), ip, M1, false, true);
        }
        assert_eq!(n.len(), MAX_NEIGHBORS);
        assert_eq!(n.lookup(&Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 1, 0)), None);
    }
}
