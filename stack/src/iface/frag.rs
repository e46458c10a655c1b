//! IPv4 reassembly within a memory cap and a timeout.
//!
//! Policy: fragments are held per (src, dst, id, protocol) until the datagram
//! is complete or its timer runs out. Memory is charged for the buffer each
//! datagram needs (up to its highest offset), so a single fragment at offset
//! 65000 costs 64 KiB and an attacker cannot hold more than `mem_cap`. When a
//! new datagram would pass the cap, the oldest incomplete one is evicted.
//! Any overlap drops the whole datagram (no ambiguity to exploit).

use core::net::IpAddr;
use std::collections::HashMap;
use std::time::Duration;

use crate::stats::DropReason;
use crate::time::Instant;

/// Reassembly limits.
#[derive(Debug, Clone)]
pub struct FragConfig {
    /// Bytes held across all incomplete datagrams.
    pub mem_cap: usize,
    /// Incomplete datagrams held at once.
    pub max_datagrams: usize,
    /// Pieces per datagram (bounds the work of an insert).
    pub max_pieces: usize,
    /// Time from first fragment to giving up.
    pub timeout: Duration,
}

impl Default for FragConfig {
    fn default() -> Self {
        FragConfig {
            mem_cap: 1 << 20,
            max_datagrams: 64,
            max_pieces: 64,
            timeout: Duration::from_secs(30),
        }
    }
}

/// Identifies one datagram being reassembled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FragKey {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Identification field (RFC 791 3.1: 16 bits; RFC 8200 §4.5: 32).
    pub ident: u32,
    /// Protocol number (6 TCP, 17 UDP, 1 ICMP, ...).
    pub protocol: u8,
}

#[derive(Debug)]
struct Datagram {
    started: Instant,
    data: Vec<u8>,
    /// Received byte ranges, sorted, disjoint.
    pieces: Vec<(usize, usize)>,
    /// Known once the last fragment (MF clear) arrived.
    total_len: Option<usize>,
    /// The first fragment's IPv4 header as received (empty until it arrives).
    header: Vec<u8>,
}

impl Datagram {
    fn received(&self) -> usize {
        self.pieces.iter().map(|(s, e)| e - s).sum()
    }
    fn complete(&self) -> bool {
        self.total_len.is_some_and(|t| self.received() == t)
    }
}

/// A reassembled datagram.
#[derive(Debug, PartialEq, Eq)]
pub struct Reassembled {
    /// The datagram's identity (RFC 791: source, destination, ID, protocol).
    pub key: FragKey,
    /// The first fragment's IP header, IPv4 options included, as received
    /// (what an ICMP error about the datagram quotes; IPv6's fixed header).
    pub header: Vec<u8>,
    /// The whole payload, fragments joined in order.
    pub payload: Vec<u8>,
}

impl Reassembled {
    /// The first fragment's TTL (hop limit).
    pub fn ttl(&self) -> u8 {
        let at = if self.key.src.is_ipv6() { 7 } else { 8 };
        self.header.get(at).copied().unwrap_or(0)
    }
}

/// The reassembly buffer of one stack.
#[derive(Debug)]
pub struct Reassembler {
    cfg: FragConfig,
    datagrams: HashMap<FragKey, Datagram>,
    mem: usize,
    pub(crate) mem_hwm: usize,
    pub(crate) timeouts: u64,
    /// Incomplete datagrams dropped to make room for a new one.
    pub(crate) evicted: u64,
}

/// Largest IPv4 payload: 65535 minus a 20-byte header.
const MAX_PAYLOAD: usize = 65_515;
/// Largest IPv6 fragmentable part: the payload length field's 65535
/// minus the fragment header.
const MAX_PAYLOAD6: usize = 65_527;

impl Reassembler {
    /// An empty reassembler with the limits of `cfg`.
    pub fn new(cfg: FragConfig) -> Self {
        Reassembler {
            cfg,
            datagrams: HashMap::new(),
            mem: 0,
            mem_hwm: 0,
            timeouts: 0,
            evicted: 0,
        }
    }

    /// Bytes held now.
    pub fn mem(&self) -> usize {
        self.mem
    }

    /// Add one fragment: `offset` in bytes, `more` the MF flag, `header`
    /// its IPv4 header as received (kept from the first fragment).
    pub fn insert(
        &mut self,
        now: Instant,
        key: FragKey,
        offset: usize,
        more: bool,
        header: &[u8],
        payload: &[u8],
    ) -> Result<Option<Reassembled>, DropReason> {
        let end = offset + payload.len();
        let max = if key.src.is_ipv6() {
            MAX_PAYLOAD6
        } else {
            MAX_PAYLOAD
        };
        if end > max || (more && (payload.is_empty() || payload.len() % 8 != 0)) {
            return Err(DropReason::FragBad);
        }
        if !self.datagrams.contains_key(&key) {
            self.make_room(end)?;
            self.datagrams.insert(
                key,
                Datagram {
                    started: now,
                    data: Vec::new(),
                    pieces: Vec::new(),
                    total_len: None,
                    header: Vec::new(),
                },
            );
        }
        let grow = end.saturating_sub(self.datagrams.get(&key).map_or(0, |d| d.data.len()));
        if self.mem + grow > self.cfg.mem_cap {
            self.remove(&key);
            return Err(DropReason::FragNoMemory);
        }
        let Some(d) = self.datagrams.get_mut(&key) else {
            return Err(DropReason::FragNoMemory);
        };
        if d.pieces.contains(&(offset, end)) {
            // An exact duplicate (a retransmitted or duplicated frame): ignore it.
            return Ok(None);
        }
        let overlaps = d.pieces.iter().any(|&(s, e)| offset < e && s < end);
        let bad_len = match d.total_len {
            Some(t) => end > t || (!more && end != t),
            None => !more && d.pieces.iter().any(|&(_, e)| e > end),
        };
        if overlaps || bad_len || d.pieces.len() >= self.cfg.max_pieces {
            let reason = if overlaps {
                DropReason::FragOverlap
            } else {
                DropReason::FragBad
            };
            self.remove(&key);
            return Err(reason);
        }
        if d.data.len() < end {
            d.data.resize(end, 0);
            self.mem += grow;
            self.mem_hwm = self.mem_hwm.max(self.mem);
        }
        d.data[offset..end].copy_from_slice(payload);
        let at = d.pieces.partition_point(|&(s, _)| s < offset);
        d.pieces.insert(at, (offset, end));
        if !more {
            d.total_len = Some(end);
        }
        if offset == 0 {
            d.header = header.to_vec();
        }
        if !d.complete() {
            return Ok(None);
        }
        let Some(d) = self.remove(&key) else {
            return Ok(None);
        };
        Ok(Some(Reassembled {
            key,
            header: d.header,
            payload: d.data,
        }))
    }

    fn remove(&mut self, key: &FragKey) -> Option<Datagram> {
        let d = self.datagrams.remove(key)?;
        self.mem -= d.data.len();
        Some(d)
    }

    /// Evict the oldest datagrams until a new one of `need` bytes fits.
    fn make_room(&mut self, need: usize) -> Result<(), DropReason> {
        if need > self.cfg.mem_cap {
            return Err(DropReason::FragNoMemory);
        }
        while self.datagrams.len() >= self.cfg.max_datagrams || self.mem + need > self.cfg.mem_cap {
            let oldest = self
                .datagrams
                .iter()
                .min_by_key(|(_, d)| d.started)
                .map(|(k, _)| *k);
            match oldest {
                Some(k) => {
                    self.remove(&k);
                    self.evicted += 1;
                }
                None => return Err(DropReason::FragNoMemory),
            }
        }
        Ok(())
    }

    /// Drop datagrams older than the timeout. Those whose first fragment
    /// had come come back (its header, and the payload's first bytes as
    /// far as they arrived in one piece, at most `quote` of them): an ICMP
    /// time exceeded, "fragment reassembly time exceeded", is owed to
    /// their senders (RFC 792, RFC 8200 §4.5).
    pub fn poll(&mut self, now: Instant, quote: usize) -> Vec<Reassembled> {
        let timeout = self.cfg.timeout;
        let expired: Vec<FragKey> = self
            .datagrams
            .iter()
            .filter(|(_, d)| now >= d.started + timeout)
            .map(|(k, _)| *k)
            .collect();
        let mut owed = Vec::new();
        for key in expired {
            if let Some(d) = self.datagrams.get_mut(&key)
                && !d.header.is_empty()
                && let Some(&(0, end)) = d.pieces.first()
            {
                let payload = d.data[..end.min(quote).min(d.data.len())].to_vec();
                let header = std::mem::take(&mut d.header);
                owed.push(Reassembled {
                    key,
                    header,
                    payload,
                });
            }
            self.remove(&key);
            self.timeouts += 1;
        }
        owed
    }

    /// When the oldest incomplete datagram times out ([`poll`](Self::poll)
    /// has work), if any is held.
    pub fn poll_at(&self) -> Option<Instant> {
        self.datagrams
            .values()
            .map(|d| d.started + self.cfg.timeout)
            .min()
    }

    /// Incomplete datagrams held now.
    pub fn len(&self) -> usize {
        self.datagrams.len()
    }

    /// Whether no incomplete datagram is held.
    pub fn is_empty(&self) -> bool {
        self.datagrams.is_empty()
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use core::net::Ipv4Addr;

    const KEY: FragKey = FragKey {
        src: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        dst: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
        ident: 7,
        protocol: 17,
    };

    /// A fragment header stand-in (TTL 64 at byte 8).
    const H: [u8; 20] = [
        0x45, 0, 0, 0, 0, 7, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
    ];

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[test]
    fn reassembles_out_of_order() {
        let mut r = Reassembler::new(FragConfig::default());
        let d = data(3000);
        let t = Instant::ZERO;
        assert_eq!(r.insert(t, KEY, 2400, false, &H, &d[2400..]), Ok(None));
        assert_eq!(r.insert(t, KEY, 0, true, &H, &d[..1200]), Ok(None));
        let got = r
            .insert(t, KEY, 1200, true, &H, &d[1200..2400])
            .unwrap()
            .unwrap();
        assert_eq!(got.payload, d);
        assert_eq!(r.mem(), 0);
        assert!(r.is_empty());
    }

    #[test]
    fn overlap_drops_datagram() {
        let mut r = Reassembler::new(FragConfig::default());
        let d = data(64);
        let t = Instant::ZERO;
        r.insert(t, KEY, 0, true, &H, &d[..32]).unwrap();
        assert_eq!(
            r.insert(t, KEY, 24, true, &H, &d[24..56]),
            Err(DropReason::FragOverlap)
        );
        assert!(r.is_empty());
        assert_eq!(r.mem(), 0);
    }

    #[test]
    fn exact_duplicate_is_ignored() {
        let mut r = Reassembler::new(FragConfig::default());
        let d = data(48);
        let t = Instant::ZERO;
        r.insert(t, KEY, 0, true, &H, &d[..24]).unwrap();
        assert_eq!(r.insert(t, KEY, 0, true, &H, &d[..24]), Ok(None));
        let got = r.insert(t, KEY, 24, false, &H, &d[24..]).unwrap().unwrap();
        assert_eq!(got.payload, d);
    }

    #[test]
    fn bad_fragments_rejected() {
        let mut r = Reassembler::new(FragConfig::default());
        let t = Instant::ZERO;
        // MF set with a length not a multiple of 8.
        assert_eq!(
            r.insert(t, KEY, 0, true, &H, &[0; 10]),
            Err(DropReason::FragBad)
        );
        // Beyond the largest datagram.
        assert_eq!(
            r.insert(t, KEY, 65_512, false, &H, &[0; 8]),
            Err(DropReason::FragBad)
        );
        // Data past the end the last fragment declared.
        r.insert(t, KEY, 8, false, &H, &[0; 8]).unwrap();
        assert_eq!(
            r.insert(t, KEY, 16, true, &H, &[0; 8]),
            Err(DropReason::FragBad)
        );
    }

    #[test]
    fn memory_cap_and_timeout() {
        let cfg = FragConfig {
            mem_cap: 100_000,
            ..FragConfig::default()
        };
        let mut r = Reassembler::new(cfg.clone());
        // Endless far-offset fragments: memory never passes the cap.
        for i in 0..1000u16 {
            let key = FragKey {
                ident: u32::from(i),
                ..KEY
            };
            let _ = r.insert(
                Instant::from_millis(i.into()),
                key,
                60_000,
                true,
                &H,
                &[0; 8],
            );
            assert!(r.mem() <= cfg.mem_cap);
        }
        assert!(r.mem_hwm <= cfg.mem_cap);
        assert!(!r.is_empty());
        // Only fragments at offset 60,000: no first fragment, no error owed.
        let owed = r.poll(Instant::from_secs(31) + Duration::from_secs(1), 1232);
        assert!(owed.is_empty());
        assert!(r.is_empty());
        assert_eq!(r.mem(), 0);
        assert!(r.timeouts > 0);
    }

    #[test]
    fn datagram_count_capped() {
        let cfg = FragConfig {
            max_datagrams: 3,
            ..FragConfig::default()
        };
        let mut r = Reassembler::new(cfg);
        for i in 0..10u16 {
            let key = FragKey {
                ident: u32::from(i),
                ..KEY
            };
            r.insert(Instant::from_millis(i.into()), key, 0, true, &H, &[0; 8])
                .unwrap();
            assert!(r.len() <= 3);
        }
    }

    #[test]
    fn an_expired_datagram_with_its_first_fragment_owes_an_error() {
        let mut r = Reassembler::new(FragConfig::default());
        let key = |ident| FragKey {
            src: IpAddr::from([10, 0, 0, 2]),
            dst: IpAddr::from([10, 0, 0, 1]),
            ident,
            protocol: 17,
        };
        let t0 = Instant::ZERO;
        // Datagram 1: the first 16 bytes, then a hole. Datagram 2: only
        // a later piece.
        let first: Vec<u8> = (0..16).collect();
        assert!(r.insert(t0, key(1), 0, true, &H, &first).unwrap().is_none());
        assert!(
            r.insert(t0, key(2), 64, true, &H, &[9; 8])
                .unwrap()
                .is_none()
        );
        assert!(r.poll(t0 + Duration::from_secs(29), 8).is_empty());
        let owed = r.poll(t0 + Duration::from_secs(30), 8);
        assert_eq!(owed.len(), 1);
        assert_eq!(owed[0].key, key(1));
        assert_eq!(owed[0].header, H.to_vec());
        assert_eq!(owed[0].payload, first[..8].to_vec());
        assert!(r.is_empty());
        assert_eq!(r.timeouts, 2);
    }
}
