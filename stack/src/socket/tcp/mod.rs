//! TCP (RFC 9293) with window and congestion control.
//!
//! [`conn::TcpConn`] is one connection's state machine; this module holds the
//! table of connections and listeners: a hashed demux (4-tuple to slot, so the
//! cost per segment does not grow with the number of connections), listen
//! backlogs, RFC 6528 initial sequence numbers, SYN cookies when a backlog is
//! full, and a lazy timer heap so timers cost O(log n) rather than a scan.

mod api;
pub mod buffer;
pub mod cc;
pub mod config;
pub mod conn;
pub mod fastopen;
mod io;
pub mod rack;
pub mod rtt;
pub mod scoreboard;
pub mod segment;
pub mod seq;
mod time_wait;
mod view;

use core::net::{IpAddr, SocketAddr};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::hash::Hasher;

use siphasher::sip::SipHasher24;

pub use crate::error::ConnError;
pub use crate::events::{Family, ListenHandle, TcpHandle};
pub use crate::stats::TcpStats;
pub use api::TcpStatus;
pub use config::{Ecn, KeepAlive, TcpConfig};
pub use conn::{CaState, ConnInfo, ConnTimes, State, TcpConn, TxStamp, TxStampKind};
pub use segment::Segment;
pub use seq::Seq;
pub use view::{Tcp, TcpRef};

use crate::events::{Event, Pending, Readiness, SocketRef};
use crate::time::Instant;

/// The connection's demux key: local port and remote endpoint (the local
/// address is always the stack's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FlowKey {
    pub local_port: u16,
    pub remote: SocketAddr,
}

impl std::hash::Hash for FlowKey {
    /// The address as 128 bits and both ports as one word: what tells
    /// flows apart, without `SocketAddrV6`'s flow info and scope (equal
    /// keys still hash alike) and without building it on the stack per
    /// segment.
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        let ip = match self.remote.ip() {
            core::net::IpAddr::V4(a) => a.to_ipv6_mapped().to_bits(),
            core::net::IpAddr::V6(a) => a.to_bits(),
        };
        h.write_u128(ip);
        h.write_u32(u32::from(self.local_port) << 16 | u32::from(self.remote.port()));
    }
}

#[derive(Debug)]
pub(crate) struct Slot {
    pub generation: u32,
    pub conn: Option<TcpConn>,
    /// The app no longer holds a handle (closed or aborted it, or never accepted it).
    pub released: bool,
    /// Listener this embryonic connection belongs to, until accepted.
    pub listener: Option<ListenHandle>,
    /// Deadline registered in the timer heap.
    pub timer: Option<Instant>,
    /// Queued for `poll_transmit`.
    pub dirty: bool,
    /// Counted in its listener's embryonic (SYN-RECEIVED) total.
    pub embryonic: bool,
    /// A Fast Open connection still in SYN-RECEIVED: counted in the
    /// `fast_open_pending` of the listener in `fast_open_of`.
    pub fast_open_of: Option<ListenHandle>,
    /// Readiness events not yet drained (kept across reuse of the slot
    /// while it sits in the event queue, so it is queued once).
    pub events: Pending,
}

#[derive(Debug)]
pub(crate) struct Listener {
    pub backlog: usize,
    /// Established connections waiting for `accept`.
    pub ready: VecDeque<u32>,
    /// Connections in SYN-RECEIVED.
    pub embryonic: usize,
    /// TCP Fast Open (RFC 7413): how many connections opened by data in
    /// their SYN may wait for their handshake to finish at once (Linux's
    /// `TCP_FASTOPEN` queue length); 0 is off.
    pub fast_open: usize,
    /// Fast Open connections still in SYN-RECEIVED.
    pub fast_open_pending: usize,
    /// `TCP_MAXSEG`: its connections' MSS is at most this.
    pub max_segment: Option<usize>,
    /// Readiness events not yet drained.
    pub events: Pending,
}

/// All TCP state of one stack.
#[derive(Debug)]
pub(crate) struct TcpTable {
    pub cfg: TcpConfig,
    pub slots: Vec<Slot>,
    pub free: Vec<u32>,
    /// Keyed by a randomly seeded foldhash (SipHash cost 4% of a bulk
    /// transfer's time here).
    pub flows: foldhash::HashMap<FlowKey, u32>,
    /// Released connections in TIME-WAIT, as small records.
    pub(crate) time_wait: time_wait::TimeWaitTable,
    /// Also foldhash: the loop looks a listener up on every `accept`.
    /// Keyed by port and family: an IPv4 and an IPv6-only listener share
    /// a port.
    pub listeners: foldhash::HashMap<ListenHandle, Listener>,
    pub timers: BinaryHeap<Reverse<(Instant, u32)>>,
    pub dirty: VecDeque<u32>,
    pub next_port: u16,
    secret: (u64, u64),
    /// The Fast Open cookie secret ([`TcpConfig::fast_open_key`]).
    pub(crate) fast_open_key: (u64, u64),
    /// Fast Open cookies servers gave us, by server address (RFC 7413
    /// 4.1.2's client cache), at most [`MAX_FAST_OPEN_COOKIES`].
    pub(crate) fast_open_cookies: foldhash::HashMap<IpAddr, fastopen::Cookie>,
    pub stats: TcpStats,
    /// Counters of connections already reaped.
    pub closed_totals: conn::ConnStats,
    /// Out-of-order bytes held by all connections.
    pub ooo_total: usize,
    /// Receive-buffer bytes autotuning added, across connections.
    pub autotune_bytes: usize,
    /// Slots with pending readiness events.
    pub events: Vec<u32>,
    /// Listeners with pending readiness events.
    pub listener_events: Vec<ListenHandle>,
}

/// First ephemeral port for active opens.
const EPHEMERAL_FIRST: u16 = 49_152;
/// Most servers whose Fast Open cookie a stack keeps (a full cache
/// forgets one to take a new one).
pub(crate) const MAX_FAST_OPEN_COOKIES: usize = 4096;

impl TcpTable {
    pub fn new(cfg: TcpConfig, secret: (u64, u64)) -> Self {
        let fast_open_key = cfg.fast_open_key.unwrap_or_else(|| {
            let half = |label: u64| {
                let mut h = SipHasher24::new_with_keys(secret.0, secret.1);
                h.write_u64(label);
                h.finish()
            };
            (half(0x7466_6f6b_6579_3030), half(0x7466_6f6b_6579_3031))
        });
        TcpTable {
            fast_open_key,
            fast_open_cookies: foldhash::HashMap::default(),
            cfg,
            slots: Vec::new(),
            free: Vec::new(),
            flows: foldhash::HashMap::default(),
            time_wait: time_wait::TimeWaitTable::default(),
            listeners: foldhash::HashMap::default(),
            timers: BinaryHeap::new(),
            dirty: VecDeque::new(),
            next_port: EPHEMERAL_FIRST,
            secret,
            stats: TcpStats::default(),
            closed_totals: conn::ConnStats::default(),
            ooo_total: 0,
            autotune_bytes: 0,
            events: Vec::new(),
            listener_events: Vec::new(),
        }
    }

    /// The configuration of a connection to `remote`: over IPv6 the MSS
    /// is 20 bytes less (its header is 40 bytes to IPv4's 20), so the
    /// segments the peer sends fit the MTU.
    pub(crate) fn cfg_for(&self, remote: &SocketAddr) -> TcpConfig {
        let mut cfg = self.cfg.clone();
        if remote.is_ipv6() {
            cfg.mss = cfg.mss.saturating_sub(20);
        }
        cfg
    }

    fn hash(&self, local: SocketAddr, remote: SocketAddr, extra: u32) -> u32 {
        let mut h = SipHasher24::new_with_keys(self.secret.0, self.secret.1);
        write_ip(&mut h, local.ip());
        h.write_u16(local.port());
        write_ip(&mut h, remote.ip());
        h.write_u16(remote.port());
        h.write_u32(extra);
        h.finish() as u32
    }

    /// RFC 6528: ISN = M + F(localip, localport, remoteip, remoteport, secretkey),
    /// M a 4 µs timer.
    pub fn isn(&self, now: Instant, local: SocketAddr, remote: SocketAddr) -> Seq {
        let m = (now.as_micros() / 4) as u32;
        Seq(m.wrapping_add(self.hash(local, remote, 0)))
    }

    /// The offset of a connection's timestamp clock, keyed by its 4-tuple
    /// (the same for every incarnation of it: RFC 6191 and PAWS across
    /// incarnations need TSvals that count on; RFC 7323 5.4 and 7.1 allow a
    /// per-connection offset).
    pub fn ts_offset(&self, local: SocketAddr, remote: SocketAddr) -> u32 {
        self.hash(local, remote, 0x7473_6f66)
    }

    /// A SYN cookie: 5 bits of time (64 s units), 3 bits of MSS index, 24 bits of keyed hash.
    pub fn cookie(
        &self,
        now: Instant,
        local: SocketAddr,
        remote: SocketAddr,
        peer_isn: Seq,
        mss: u16,
    ) -> Seq {
        let t = ((now.as_millis() / 1000 / 64) & 31) as u32;
        let m = COOKIE_MSS.iter().rposition(|&v| v <= mss).unwrap_or(0) as u32;
        let h = self.hash(local, remote, peer_isn.0 ^ (t << 27)) & 0x00ff_ffff;
        Seq((t << 27) | (m << 24) | h)
    }

    /// Check the cookie echoed in `ack - 1`; returns the MSS it encoded.
    pub fn check_cookie(
        &self,
        now: Instant,
        local: SocketAddr,
        remote: SocketAddr,
        peer_isn: Seq,
        cookie: Seq,
    ) -> Option<u16> {
        let t_now = ((now.as_millis() / 1000 / 64) & 31) as u32;
        let t = cookie.0 >> 27;
        // Valid for the current and the previous 64 s period.
        if t != t_now && t != (t_now + 31) & 31 {
            return None;
        }
        let h = self.hash(local, remote, peer_isn.0 ^ (t << 27)) & 0x00ff_ffff;
        if cookie.0 & 0x00ff_ffff != h {
            return None;
        }
        COOKIE_MSS.get(((cookie.0 >> 24) & 7) as usize).copied()
    }

    pub fn get(&self, h: TcpHandle) -> Option<&TcpConn> {
        let s = self.slots.get(h.slot as usize)?;
        if s.generation != h.generation || s.released {
            return None;
        }
        s.conn.as_ref()
    }

    pub fn get_mut(&mut self, h: TcpHandle) -> Option<&mut TcpConn> {
        let s = self.slots.get_mut(h.slot as usize)?;
        if s.generation != h.generation || s.released {
            return None;
        }
        s.conn.as_mut()
    }

    pub fn handle(&self, slot: u32) -> TcpHandle {
        TcpHandle {
            slot,
            generation: self.slots.get(slot as usize).map_or(0, |s| s.generation),
        }
    }

    /// Store a new connection; returns its slot.
    pub fn insert(&mut self, conn: TcpConn, listener: Option<ListenHandle>) -> u32 {
        let key = FlowKey {
            local_port: conn.local().port(),
            remote: conn.remote(),
        };
        let slot = Slot {
            generation: 0,
            conn: Some(conn),
            released: listener.is_some(),
            listener,
            timer: None,
            dirty: false,
            embryonic: listener.is_some(),
            fast_open_of: None,
            events: Pending::default(),
        };
        let idx = match self.free.pop() {
            Some(i) => {
                let old = &self.slots[i as usize];
                let g = old.generation.wrapping_add(1);
                let queued = old.events.queued;
                self.slots[i as usize] = Slot {
                    generation: g,
                    events: Pending {
                        queued,
                        ..Pending::default()
                    },
                    ..slot
                };
                i
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        self.flows.insert(key, idx);
        self.stats.connections += 1;
        self.stats.connections_hwm = self.stats.connections_hwm.max(self.stats.connections);
        self.mark_dirty(idx);
        idx
    }

    /// Store a connection opened through the listener `l`; it counts in
    /// the backlog until it is established. One Fast Open opened
    /// (`fast_open`) is ready for `accept` at once instead, and counts in
    /// the listener's Fast Open queue until its handshake ends.
    pub fn insert_passive(&mut self, conn: TcpConn, l: ListenHandle, fast_open: bool) -> u32 {
        let slot = self.insert(conn, Some(l));
        if fast_open {
            let s = &mut self.slots[slot as usize];
            s.embryonic = false;
            s.fast_open_of = Some(l);
        }
        if let Some(lst) = self.listeners.get_mut(&l) {
            if fast_open {
                lst.fast_open_pending += 1;
                lst.ready.push_back(slot);
            } else {
                lst.embryonic += 1;
            }
            let held = (lst.ready.len() + lst.embryonic) as u64;
            self.stats.backlog_hwm = self.stats.backlog_hwm.max(held);
        }
        if fast_open {
            self.raise_listener(l);
        }
        self.stats.passive_opens += 1;
        slot
    }

    /// A Fast Open connection's handshake ended, or it went: its
    /// listener's Fast Open queue has room again.
    pub(crate) fn leave_fast_open_queue(&mut self, l: Option<ListenHandle>) {
        if let Some(lst) = l.and_then(|l| self.listeners.get_mut(&l)) {
            lst.fast_open_pending = lst.fast_open_pending.saturating_sub(1);
        }
    }

    pub fn mark_dirty(&mut self, slot: u32) {
        if let Some(s) = self.slots.get_mut(slot as usize) {
            if !s.dirty {
                s.dirty = true;
                self.dirty.push_back(slot);
            }
        }
    }

    /// Register the connection's next deadline in the timer heap (lazily:
    /// only when earlier than the one already registered).
    pub fn schedule(&mut self, slot: u32) {
        let Some(s) = self.slots.get_mut(slot as usize) else {
            return;
        };
        let Some(at) = s.conn.as_ref().and_then(TcpConn::poll_at) else {
            return;
        };
        if s.timer.is_none_or(|t| at < t) {
            s.timer = Some(at);
            self.timers.push(Reverse((at, slot)));
        }
    }

    /// Free a slot whose connection is finished and released by the app;
    /// one in TIME-WAIT with nothing left to send becomes a TIME-WAIT
    /// record (its buffers go now, not 2 MSL later).
    pub fn reap(&mut self, now: Instant, slot: u32) {
        let Some(s) = self.slots.get_mut(slot as usize) else {
            return;
        };
        if !s.released {
            return;
        }
        let tw = s.conn.as_ref().and_then(|c| c.time_wait_record(now));
        if tw.is_none() && !s.conn.as_ref().is_none_or(TcpConn::is_finished) {
            return;
        }
        if s.listener.is_some() && !s.embryonic {
            // Established and waiting for `accept`, then reset: as on
            // Linux, `accept` still hands it out (the app reads the
            // reset), so a blocking accept does not wait for another
            // connection; only its 4-tuple is freed for a new SYN.
            if let Some(c) = s.conn.as_ref() {
                let key = FlowKey {
                    local_port: c.local().port(),
                    remote: c.remote(),
                };
                if self.flows.get(&key) == Some(&slot) {
                    self.flows.remove(&key);
                }
            }
            return;
        }
        if let Some(c) = s.conn.take() {
            self.closed_totals.add(c.stats());
            self.ooo_total = self.ooo_total.saturating_sub(c.ooo_bytes());
            let grown = c.rcvbuf_capacity().saturating_sub(self.cfg.recv_buffer);
            self.autotune_bytes = self.autotune_bytes.saturating_sub(grown);
            let key = FlowKey {
                local_port: c.local().port(),
                remote: c.remote(),
            };
            if self.flows.get(&key) == Some(&slot) {
                self.flows.remove(&key);
            }
            if let Some(tw) = tw {
                self.time_wait.insert(key, tw);
            }
        }
        let fast_open_of = s.fast_open_of.take();
        self.leave_fast_open_queue(fast_open_of);
        let s = &mut self.slots[slot as usize];
        if let Some(l) = s.listener.take() {
            if let Some(lst) = self.listeners.get_mut(&l) {
                if s.embryonic {
                    lst.embryonic = lst.embryonic.saturating_sub(1);
                }
                lst.ready.retain(|&i| i != slot);
            }
        }
        s.embryonic = false;
        s.timer = None;
        s.events.flags = Readiness::NONE;
        if tw.is_none() {
            self.stats.connections = self.stats.connections.saturating_sub(1);
        }
        self.stats.time_wait = self.time_wait.len() as u64;
        self.free.push(slot);
    }

    /// TIME-WAIT records whose 2 MSL ended by `now` go.
    pub fn expire_time_wait(&mut self, now: Instant) {
        let gone = self.time_wait.expire(now) as u64;
        if gone > 0 {
            self.stats.connections = self.stats.connections.saturating_sub(gone);
            self.stats.time_wait = self.time_wait.len() as u64;
        }
    }

    /// Whether connections wait to transmit.
    pub fn has_work(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// The earliest registered timer (may be stale: a wake-up that finds
    /// nothing due costs one heap pop).
    pub fn next_timer(&self) -> Option<Instant> {
        let conn = self.timers.peek().map(|r| r.0.0);
        match (conn, self.time_wait.next_expiry()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Record readiness `r` for the connection in `slot` (not for one the
    /// app released or has not accepted yet).
    pub fn raise(&mut self, slot: u32, r: Readiness) {
        let Some(s) = self.slots.get_mut(slot as usize) else {
            return;
        };
        if s.released || s.conn.is_none() {
            return;
        }
        if s.events.raise(r) {
            self.events.push(slot);
        }
    }

    /// A connection waits for `accept` on the listener `h`.
    pub fn raise_listener(&mut self, h: ListenHandle) {
        if let Some(l) = self.listeners.get_mut(&h) {
            if l.events.raise(Readiness::READABLE) {
                self.listener_events.push(h);
            }
        }
    }

    /// The listener that takes a connection from `peer` to `port`: the
    /// one of the peer's family, else a dual-stack one.
    pub fn listener_for(&self, port: u16, peer: IpAddr) -> Option<ListenHandle> {
        let exact = ListenHandle {
            port,
            family: Family::of(peer),
        };
        let both = ListenHandle {
            port,
            family: Family::Both,
        };
        [exact, both]
            .into_iter()
            .find(|h| self.listeners.contains_key(h))
    }

    /// Whether events wait to be drained.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty() || !self.listener_events.is_empty()
    }

    /// Hand out pending events.
    pub fn drain_events(&mut self, out: &mut Vec<Event>) {
        for h in self.listener_events.drain(..) {
            if let Some(l) = self.listeners.get_mut(&h) {
                let readiness = l.events.take();
                if !readiness.is_empty() {
                    out.push(Event {
                        socket: SocketRef::Listener(h),
                        readiness,
                    });
                }
            }
        }
        for i in 0..self.events.len() {
            let slot = self.events[i];
            let Some(s) = self.slots.get_mut(slot as usize) else {
                continue;
            };
            let readiness = s.events.take();
            if !readiness.is_empty() && !s.released && s.conn.is_some() {
                out.push(Event {
                    socket: SocketRef::Tcp(TcpHandle {
                        slot,
                        generation: s.generation,
                    }),
                    readiness,
                });
            }
        }
        self.events.clear();
    }

    /// Layer counters with per-connection totals over live and closed connections.
    pub fn stats(&self) -> TcpStats {
        let mut totals = self.closed_totals.clone();
        for c in self.slots.iter().filter_map(|s| s.conn.as_ref()) {
            totals.add(c.stats());
        }
        TcpStats {
            totals,
            ooo_bytes: self.ooo_total as u64,
            autotune_bytes: self.autotune_bytes as u64,
            ..self.stats.clone()
        }
    }

    /// A free local port for an active open to `remote` that `fits` (one
    /// whose flow hashes back to this stack's queue, see [`crate::shard::rss`]).
    pub fn pick_port(&mut self, remote: SocketAddr, fits: impl Fn(u16) -> bool) -> Option<u16> {
        let span = u32::from(u16::MAX - EPHEMERAL_FIRST) + 1;
        for _ in 0..span {
            let p = self.next_port.max(EPHEMERAL_FIRST);
            self.next_port = if p == u16::MAX {
                EPHEMERAL_FIRST
            } else {
                p + 1
            };
            if self.port_free(p, remote) && fits(p) {
                return Some(p);
            }
        }
        None
    }

    /// Whether local `port` may open a connection to `remote`: no such flow
    /// and no listener on the port.
    pub fn port_free(&self, port: u16, remote: SocketAddr) -> bool {
        let key = FlowKey {
            local_port: port,
            remote,
        };
        !self.flows.contains_key(&key)
            && !self.time_wait.contains(&key)
            && self.listener_for(port, remote.ip()).is_none()
    }
}

/// MSS values a SYN cookie can carry (3 bits).
const COOKIE_MSS: [u16; 8] = [216, 536, 1024, 1220, 1360, 1440, 1460, 8960];

/// The local address a connection uses.
pub(crate) fn local(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

/// Feed an address's bytes (4 or 16 of them) to a keyed hash, with no
/// allocation: a SYN flood hashes per segment (cookies).
fn write_ip(h: &mut SipHasher24, a: IpAddr) {
    match a {
        IpAddr::V4(a) => h.write(&a.octets()),
        IpAddr::V6(a) => h.write(&a.octets()),
    }
}

#[cfg(test)]
mod test {
    use super::*;

    use core::net::Ipv4Addr;

    const L: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 80);
    const R: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), 40_000);

    fn table() -> TcpTable {
        TcpTable::new(TcpConfig::default(), (1, 2))
    }

    #[test]
    fn isn_is_keyed_per_tuple_and_advances_with_time() {
        let t = table();
        let other = SocketAddr::new(R.ip(), 40_001);
        let now = Instant::from_secs(10);
        assert_ne!(t.isn(now, L, R), t.isn(now, L, other));
        // M: one tick per 4 µs.
        assert_eq!(
            t.isn(now + std::time::Duration::from_micros(400), L, R),
            t.isn(now, L, R) + 100
        );
        // Another secret, another sequence space.
        let t2 = TcpTable::new(TcpConfig::default(), (3, 4));
        assert_ne!(t.isn(now, L, R), t2.isn(now, L, R));
    }

    #[test]
    fn syn_cookie_round_trip_and_rejection() {
        let t = table();
        let now = Instant::from_secs(1000);
        let peer = Seq(777);
        let c = t.cookie(now, L, R, peer, 1460);
        assert_eq!(t.check_cookie(now, L, R, peer, c), Some(1460));
        // Still valid in the next 64 s period, not two periods later.
        assert_eq!(
            t.check_cookie(now + std::time::Duration::from_secs(64), L, R, peer, c),
            Some(1460)
        );
        assert_eq!(
            t.check_cookie(now + std::time::Duration::from_secs(130), L, R, peer, c),
            None
        );
        // Another peer, another ISN, a flipped bit: refused.
        let other = SocketAddr::new(R.ip(), 40_001);
        assert_eq!(t.check_cookie(now, L, other, peer, c), None);
        assert_eq!(t.check_cookie(now, L, R, Seq(778), c), None);
        assert_eq!(t.check_cookie(now, L, R, peer, Seq(c.0 ^ 1)), None);
        // The MSS rounds down to a value the cookie can carry.
        let c = t.cookie(now, L, R, peer, 1400);
        assert_eq!(t.check_cookie(now, L, R, peer, c), Some(1360));
    }
}
