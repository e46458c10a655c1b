//! ARP cache: entries with expiry, a bounded queue of packets waiting for
//! resolution, and a per-address request rate limit.
//!
//! The cache is a plain data structure driven by the [`Stack`](crate::Stack):
//! it decides, the stack emits.

use core::net::Ipv4Addr;
use std::collections::VecDeque;

use crate::iface::resolve::{Limits, Resolving};
use std::time::Duration;

use smoltcp::wire::EthernetAddress;

use crate::stats::ArpStats;
use crate::time::Instant;

/// ARP tuning.
#[derive(Debug, Clone)]
pub struct ArpConfig {
    /// How long a learned entry stays valid.
    pub entry_ttl: Duration,
    /// Most entries held; new unsolicited entries are refused beyond it.
    pub max_entries: usize,
    /// Least time between two requests for the same address.
    pub request_interval: Duration,
    /// Requests sent for one address before its pending packets are dropped.
    pub max_requests: u32,
    /// Packets held per unresolved address (the oldest is dropped beyond it).
    pub pending_per_addr: usize,
    /// Bytes held per unresolved address (the oldest is dropped beyond it).
    pub pending_bytes_per_addr: usize,
    /// Bytes held across all unresolved addresses (new packets are dropped beyond it).
    pub pending_bytes_total: usize,
    /// Unresolved addresses held at once.
    pub max_pending_addrs: usize,
    /// Refuse an ARP packet that would change the MAC of an entry (fresh
    /// or stale) unless it answers our own request for that address
    /// (spoofing defence; a host that really moved is learned when the
    /// entry expires and we ask again).
    pub lock_fresh_entries: bool,
}

impl Default for ArpConfig {
    fn default() -> Self {
        ArpConfig {
            entry_ttl: Duration::from_secs(60),
            max_entries: 1024,
            request_interval: Duration::from_millis(500),
            max_requests: 5,
            pending_per_addr: 256,
            pending_bytes_per_addr: 256 << 10,
            pending_bytes_total: 1 << 20,
            max_pending_addrs: 64,
            lock_fresh_entries: true,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    mac: EthernetAddress,
    expires: Instant,
}

/// [`ArpCache::learn`] refused to change a fresh entry's MAC (counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MacChangeRefused;

pub use crate::iface::resolve::Enqueue;

/// The ARP table of one stack.
#[derive(Debug)]
pub struct ArpCache {
    cfg: ArpConfig,
    entries: foldhash::HashMap<Ipv4Addr, Entry>,
    /// Packets waiting for an answer.
    pending: Resolving<Ipv4Addr>,
    /// Most entries ever held (flood reports).
    entries_hwm: usize,
    pub(crate) stats: ArpStats,
    /// The entry the last successful lookup found (address, MAC, expiry):
    /// a flow's segments all ask for the same next hop, and this answers
    /// them without hashing. Cleared whenever an entry changes or goes.
    last: Option<(Ipv4Addr, EthernetAddress, Instant)>,
}

impl ArpCache {
    /// An empty cache with the limits of `cfg`.
    pub fn new(cfg: ArpConfig) -> Self {
        let pending = Resolving::new(Limits {
            request_interval: cfg.request_interval,
            max_requests: cfg.max_requests,
            per_addr: cfg.pending_per_addr,
            bytes_per_addr: cfg.pending_bytes_per_addr,
            bytes_total: cfg.pending_bytes_total,
            max_addrs: cfg.max_pending_addrs,
        });
        ArpCache {
            cfg,
            entries: foldhash::HashMap::default(),
            pending,
            entries_hwm: 0,
            stats: ArpStats::default(),
            last: None,
        }
    }

    /// The MAC for `ip` if known and fresh. Counts a hit or a miss.
    pub fn lookup(&mut self, now: Instant, ip: Ipv4Addr) -> Option<EthernetAddress> {
        if let Some((last, mac, expires)) = self.last {
            if last == ip && expires > now {
                self.stats.hits += 1;
                return Some(mac);
            }
        }
        match self.entries.get(&ip) {
            Some(e) if e.expires > now => {
                self.stats.hits += 1;
                self.last = Some((ip, e.mac, e.expires));
                Some(e.mac)
            }
            Some(_) => {
                self.last = None;
                self.entries.remove(&ip);
                self.stats.misses += 1;
                None
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// Is a request for `ip` outstanding (packets wait for its answer)?
    pub(crate) fn asking(&self, ip: Ipv4Addr) -> bool {
        self.pending.asked(&ip)
    }

    /// Is there an entry (fresh or not) or an outstanding request for `ip`?
    pub fn knows(&self, ip: Ipv4Addr) -> bool {
        self.entries.contains_key(&ip) || self.pending.asked(&ip)
    }

    /// Record `ip -> mac`. `solicited` entries (a reply to our request, or a
    /// request addressed to us) are added, others only refresh existing
    /// entries. When the table is full, only an answer to our own request
    /// may evict a fresh entry (the one closest to expiry); a request to us
    /// takes an expired entry's place or is not learned (`table_full`), so
    /// a flood of requests cannot push out the neighbours we talk to.
    /// Returns the packets that were waiting for this address.
    pub fn learn(
        &mut self,
        now: Instant,
        ip: Ipv4Addr,
        mac: EthernetAddress,
        solicited: bool,
    ) -> Result<VecDeque<Vec<u8>>, MacChangeRefused> {
        let expires = now + self.cfg.entry_ttl;
        let asked = self.pending.asked(&ip);
        // Whatever happens to the table below, the remembered lookup is
        // looked up again.
        self.last = None;
        if let Some(e) = self.entries.get_mut(&ip) {
            // A stale entry is locked too: its MAC changes when we ask.
            if e.mac != mac && !asked && self.cfg.lock_fresh_entries {
                self.stats.spoof_refused += 1;
                return Err(MacChangeRefused);
            }
            *e = Entry { mac, expires };
        } else if solicited || asked {
            if self.entries.len() >= self.cfg.max_entries && !self.evict_one(now, asked) {
                self.stats.table_full += 1;
            } else {
                self.entries.insert(ip, Entry { mac, expires });
                self.entries_hwm = self.entries_hwm.max(self.entries.len());
            }
        }
        Ok(self.pending.resolved(&ip))
    }

    /// Make room: drop an expired entry, else (when `fresh_too`) the one
    /// closest to expiry. Only runs when the table is full.
    fn evict_one(&mut self, now: Instant, fresh_too: bool) -> bool {
        self.last = None;
        let victim = self
            .entries
            .iter()
            .find(|(_, e)| e.expires <= now)
            .or_else(|| {
                fresh_too
                    .then(|| self.entries.iter().min_by_key(|(_, e)| e.expires))
                    .flatten()
            })
            .map(|(ip, _)| *ip);
        victim.is_some_and(|ip| self.entries.remove(&ip).is_some())
    }

    /// Hold `packet` until `ip` resolves.
    pub fn enqueue(&mut self, now: Instant, ip: Ipv4Addr, packet: Vec<u8>) -> Enqueue {
        self.pending.enqueue(now, ip, packet)
    }

    /// Timers: addresses whose request should be repeated now; gives up (and
    /// drops the queued packets) after `max_requests`. Also expires entries.
    pub fn poll(&mut self, now: Instant, retry: &mut Vec<Ipv4Addr>) {
        self.pending.poll(now, retry);
    }

    /// Next time [`poll`](Self::poll) has work.
    pub fn poll_at(&self) -> Option<Instant> {
        self.pending.poll_at()
    }

    /// Counters with the gauges filled in.
    pub fn stats(&self) -> ArpStats {
        ArpStats {
            entries: self.entries.len() as u64,
            pending_packets: self.pending.packets() as u64,
            entries_hwm: self.entries_hwm as u64,
            pending_bytes_hwm: self.pending.bytes_hwm as u64,
            pending_dropped: self.pending.dropped,
            unresolved: self.pending.unresolved,
            ..self.stats.clone()
        }
    }

    /// Current entries (for tools and tests).
    pub fn entries(&self, now: Instant) -> Vec<(Ipv4Addr, EthernetAddress)> {
        self.entries
            .iter()
            .filter(|(_, e)| e.expires > now)
            .map(|(ip, e)| (*ip, e.mac))
            .collect()
    }
}

#[cfg(test)]
mod test {
    use super::*;

    const IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
    const MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);

    proptest::proptest! {
        /// The remembered last lookup never answers other than the table:
        /// every lookup gives the MAC of the fresh entry `entries` lists,
        /// through learning, refreshing, MAC changes we asked for,
        /// eviction from a full table and expiry.
        #[test]
        fn lookups_always_agree_with_the_table(
            ops in proptest::collection::vec(
                (0u8..4, 0u8..3, 0u8..3, proptest::bool::ANY, 0u64..40),
                1..200,
            )
        ) {
            let mut c = ArpCache::new(ArpConfig {
                max_entries: 2,
                entry_ttl: core::time::Duration::from_secs(60),
                ..ArpConfig::default()
            });
            let mut now = Instant::ZERO;
            for (op, host, mac, solicited, secs) in ops {
                let ip = Ipv4Addr::new(10, 0, 0, 10 + host);
                let mac = EthernetAddress([2, 0, 0, 0, 1, mac]);
                now += core::time::Duration::from_secs(secs);
                match op {
                    0 => {
                        let _ = c.learn(now, ip, mac, solicited);
                    }
                    1 => {
                        if c.enqueue(now, ip, vec![0; 8]) == Enqueue::QueuedSendRequest {
                            // Our own request: its answer may change the MAC.
                            let _ = c.learn(now, ip, mac, true);
                        }
                    }
                    _ => {
                        let want = c.entries(now).iter().find(|(i, _)| *i == ip).map(|(_, m)| *m);
                        let before = c.stats();
                        proptest::prop_assert_eq!(c.lookup(now, ip), want);
                        let after = c.stats();
                        proptest::prop_assert_eq!(after.hits - before.hits, u64::from(want.is_some()));
                        proptest::prop_assert_eq!(after.misses - before.misses, u64::from(want.is_none()));
                    }
                }
            }
        }
    }

    #[test]
    fn entry_expires() {
        let mut c = ArpCache::new(ArpConfig::default());
        c.learn(Instant::ZERO, IP, MAC, true).unwrap();
        assert_eq!(c.lookup(Instant::from_secs(59), IP), Some(MAC));
        assert_eq!(c.lookup(Instant::from_secs(61), IP), None);
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.entries), (1, 1, 0));
    }

    #[test]
    fn unsolicited_only_refreshes() {
        let mut c = ArpCache::new(ArpConfig::default());
        c.learn(Instant::ZERO, IP, MAC, false).unwrap();
        assert_eq!(c.lookup(Instant::ZERO, IP), None);
        c.learn(Instant::ZERO, IP, MAC, true).unwrap();
        // The same MAC refreshes the entry.
        c.learn(Instant::from_secs(30), IP, MAC, false).unwrap();
        assert_eq!(c.lookup(Instant::from_secs(80), IP), Some(MAC));
    }

    #[test]
    fn a_fresh_entry_keeps_its_mac_until_we_ask_again() {
        let mut c = ArpCache::new(ArpConfig::default());
        c.learn(Instant::ZERO, IP, MAC, true).unwrap();
        let spoof = EthernetAddress([2, 0, 0, 0, 0, 9]);
        // Unsolicited, or a request to us from a spoofed sender: refused.
        for solicited in [false, true] {
            assert_eq!(
                c.learn(Instant::from_secs(1), IP, spoof, solicited),
                Err(MacChangeRefused)
            );
        }
        assert_eq!(c.lookup(Instant::from_secs(1), IP), Some(MAC));
        assert_eq!(c.stats().spoof_refused, 2);
        // The host really moved: once the entry expires we ask, and learn.
        let later = Instant::from_secs(61);
        assert_eq!(c.lookup(later, IP), None);
        assert_eq!(c.enqueue(later, IP, vec![1]), Enqueue::QueuedSendRequest);
        assert_eq!(c.learn(later, IP, spoof, false).unwrap().len(), 1);
        assert_eq!(c.lookup(later, IP), Some(spoof));
        // Our own outstanding request is answered even for a fresh entry.
        let moved = EthernetAddress([2, 0, 0, 0, 0, 7]);
        c.enqueue(later, IP, vec![2]);
        assert!(c.learn(later, IP, moved, false).is_ok());
        // Without the lock, RFC 826's merge updates it.
        let mut open = ArpCache::new(ArpConfig {
            lock_fresh_entries: false,
            ..ArpConfig::default()
        });
        open.learn(Instant::ZERO, IP, MAC, true).unwrap();
        open.learn(Instant::from_secs(1), IP, spoof, false).unwrap();
        assert_eq!(open.lookup(Instant::from_secs(1), IP), Some(spoof));
    }

    #[test]
    fn pending_queue_is_bounded_and_rate_limited() {
        let cfg = ArpConfig::default();
        let mut c = ArpCache::new(cfg.clone());
        let t0 = Instant::ZERO;
        assert_eq!(c.enqueue(t0, IP, vec![0]), Enqueue::QueuedSendRequest);
        let n = cfg.pending_per_addr + 20;
        for i in 1..n {
            assert_eq!(c.enqueue(t0, IP, vec![i as u8]), Enqueue::Queued);
        }
        assert_eq!(c.stats().pending_packets, cfg.pending_per_addr as u64);
        assert_eq!(c.stats().pending_dropped, (n - cfg.pending_per_addr) as u64);
        let t1 = t0 + cfg.request_interval;
        assert_eq!(c.enqueue(t1, IP, vec![0xee]), Enqueue::QueuedSendRequest);
        let waiting = c.learn(t1, IP, MAC, true).unwrap();
        // The newest packets were kept.
        assert_eq!(waiting.back(), Some(&vec![0xee]));
        assert_eq!(waiting.len(), cfg.pending_per_addr);
        assert_eq!(c.stats().pending_packets, 0);
    }

    #[test]
    fn pending_bytes_are_bounded_per_address_and_in_total() {
        let cfg = ArpConfig {
            pending_bytes_per_addr: 10_000,
            pending_bytes_total: 15_000,
            ..ArpConfig::default()
        };
        let mut c = ArpCache::new(cfg);
        for _ in 0..10 {
            c.enqueue(Instant::ZERO, IP, vec![0; 3000]);
        }
        // 3 x 3000 fit in 10,000 per address.
        assert_eq!(c.stats().pending_packets, 3);
        let other = Ipv4Addr::new(10, 0, 0, 3);
        for _ in 0..10 {
            c.enqueue(Instant::ZERO, other, vec![0; 3000]);
        }
        // The total cap of 15,000 leaves room for 2 more.
        assert_eq!(c.stats().pending_packets, 5);
        assert_eq!(c.learn(Instant::ZERO, other, MAC, true).unwrap().len(), 2);
    }

    #[test]
    fn unresolved_gives_up_after_max_requests() {
        let cfg = ArpConfig::default();
        let mut c = ArpCache::new(cfg.clone());
        c.enqueue(Instant::ZERO, IP, vec![1, 2, 3]);
        let mut now = Instant::ZERO;
        let mut retries = 0;
        for _ in 0..20 {
            now = c.poll_at().unwrap_or(now);
            let mut r = Vec::new();
            c.poll(now, &mut r);
            retries += r.len();
            if c.poll_at().is_none() {
                break;
            }
        }
        assert_eq!(retries as u32, cfg.max_requests - 1);
        let s = c.stats();
        assert_eq!(
            (s.unresolved, s.pending_dropped, s.pending_packets),
            (1, 1, 0)
        );
    }

    #[test]
    fn table_and_pending_addresses_are_bounded() {
        let cfg = ArpConfig {
            max_entries: 4,
            max_pending_addrs: 2,
            ..ArpConfig::default()
        };
        let mut c = ArpCache::new(cfg);
        for i in 0..100u8 {
            c.learn(
                Instant::from_millis(i.into()),
                Ipv4Addr::new(10, 0, 1, i),
                MAC,
                true,
            )
            .unwrap();
        }
        assert_eq!(c.stats().entries, 4);
        // Requests to us do not push out fresh entries: the first stay.
        assert_eq!(c.stats().table_full, 96);
        let t = Instant::from_secs(1);
        assert!(c.lookup(t, Ipv4Addr::new(10, 0, 1, 0)).is_some());
        assert!(c.lookup(t, Ipv4Addr::new(10, 0, 1, 99)).is_none());
        // An answer to our own request evicts the entry closest to expiry.
        let wanted = Ipv4Addr::new(10, 0, 1, 200);
        assert_eq!(c.enqueue(t, wanted, vec![1]), Enqueue::QueuedSendRequest);
        assert_eq!(c.learn(t, wanted, MAC, false).unwrap().len(), 1);
        assert_eq!(c.lookup(t, wanted), Some(MAC));
        assert!(c.lookup(t, Ipv4Addr::new(10, 0, 1, 0)).is_none());
        assert_eq!(c.stats().entries, 4);
        // Expired entries make room for requests again.
        let later = Instant::from_secs(62);
        c.learn(later, Ipv4Addr::new(10, 0, 1, 99), MAC, true)
            .unwrap();
        assert!(c.lookup(later, Ipv4Addr::new(10, 0, 1, 99)).is_some());
        // Pending addresses: when full, the one asked about longest ago
        // gives way to the new one.
        let (p1, p2, p3) = (
            Ipv4Addr::new(1, 1, 1, 1),
            Ipv4Addr::new(1, 1, 1, 2),
            Ipv4Addr::new(1, 1, 1, 3),
        );
        assert_eq!(c.enqueue(later, p1, vec![1]), Enqueue::QueuedSendRequest);
        let t2 = later + Duration::from_millis(1);
        assert_eq!(c.enqueue(t2, p2, vec![2]), Enqueue::QueuedSendRequest);
        let dropped = c.stats().pending_dropped;
        assert_eq!(c.enqueue(t2, p3, vec![3]), Enqueue::QueuedSendRequest);
        assert_eq!(c.stats().pending_dropped, dropped + 1);
        assert_eq!(c.stats().pending_packets, 2);
        assert!(!c.knows(p1) && c.knows(p2) && c.knows(p3));
    }
}
