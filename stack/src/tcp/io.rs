//! TCP on the data path: segment demux on receive, emission on poll.

use core::net::SocketAddrV4;

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{IpAddress, IpProtocol, TcpControl, TcpPacket, TcpRepr, TcpTimestampRepr};

use super::conn::{Header, Outgoing, Segment, State, TcpConn};
use super::{FlowKey, Seq, TcpTable, local};
use crate::device::Tx;
use crate::events::Readiness;
use crate::link::{IpMeta, Link};
use crate::stats::DropReason;
use crate::time::Instant;

fn segment_from<'a>(r: &TcpRepr<'a>) -> Segment<'a> {
    let mut sack = [None; 3];
    for (slot, range) in sack.iter_mut().zip(r.sack_ranges.iter()) {
        *slot = range.map(|(a, b)| (Seq(a), Seq(b)));
    }
    Segment {
        hdr: Header {
            seq: r.seq_number.into(),
            ack: r.ack_number.map(Seq::from),
            syn: r.control == TcpControl::Syn,
            fin: r.control == TcpControl::Fin,
            rst: r.control == TcpControl::Rst,
            window: r.window_len,
            mss: r.max_seg_size,
            wscale: r.window_scale,
            sack_permitted: r.sack_permitted,
            sack,
            timestamp: r.timestamp.map(|t| (t.tsval, t.tsecr)),
        },
        payload: r.payload,
    }
}

/// What an app can see of a connection, before and after an input, to
/// tell which readiness events it caused.
#[derive(Debug, Clone, Copy)]
struct Levels {
    readable: usize,
    writable: usize,
    state: State,
    eof: bool,
    error: bool,
}

impl Levels {
    fn of(c: &TcpConn) -> Self {
        Levels {
            readable: c.recv_available(),
            writable: c.send_capacity(),
            state: c.state(),
            eof: c.recv_finished(),
            error: c.error().is_some(),
        }
    }

    /// The events from `self` to `after`; WRITABLE once the free send space
    /// climbs back to `low` (not for every byte acknowledged).
    fn changes(self, after: Levels, low: usize) -> Readiness {
        let mut r = Readiness::NONE;
        let opening = matches!(self.state, State::SynSent | State::SynReceived);
        if after.readable > self.readable || (after.eof && !self.eof) {
            r |= Readiness::READABLE;
        }
        if opening && after.state.synchronized() {
            r |= Readiness::CONNECTED | Readiness::WRITABLE;
        } else if self.writable < low && after.writable >= low {
            r |= Readiness::WRITABLE;
        }
        let ended = |s: State| matches!(s, State::Closed | State::TimeWait);
        if (after.eof && !self.eof) || (ended(after.state) && !ended(self.state)) {
            r |= Readiness::CLOSED;
        }
        if after.error && !self.error {
            r |= Readiness::ERROR;
        }
        r
    }
}

/// Emit one segment; `payload` writes `out.payload_len` bytes.
fn emit<T: Tx>(
    link: &mut Link,
    now: Instant,
    tx: &mut T,
    local_port: u16,
    remote: SocketAddrV4,
    out: &Outgoing,
    payload: impl FnOnce(&mut [u8]),
) -> bool {
    let control = if out.hdr.syn {
        TcpControl::Syn
    } else if out.hdr.rst {
        TcpControl::Rst
    } else if out.hdr.fin {
        TcpControl::Fin
    } else if out.payload_len > 0 {
        TcpControl::Psh
    } else {
        TcpControl::None
    };
    let mut sack_ranges = [None; 3];
    for (slot, r) in sack_ranges.iter_mut().zip(out.hdr.sack.iter()) {
        *slot = r.map(|(a, b)| (a.0, b.0));
    }
    let repr = TcpRepr {
        src_port: local_port,
        dst_port: remote.port(),
        control,
        seq_number: out.hdr.seq.into(),
        ack_number: out.hdr.ack.map(Into::into),
        window_len: out.hdr.window,
        window_scale: out.hdr.wscale,
        max_seg_size: out.hdr.mss,
        sack_permitted: out.hdr.sack_permitted,
        sack_ranges,
        timestamp: out.hdr.timestamp.map(|(v, e)| TcpTimestampRepr::new(v, e)),
        payload: &[],
    };
    let hdr = repr.header_len();
    let (me, peer) = (link.ip(), *remote.ip());
    let (src, dst) = (IpAddress::Ipv4(me), IpAddress::Ipv4(peer));
    let fill = link.checksum.tcp.tx();
    let len = hdr + out.payload_len;
    let mut payload = Some(payload);
    if fill && (link.offloads.tx_tcp_checksum || out.tso_segsz > 0) {
        // The port finishes the checksum (and cuts a TSO segment): leave it
        // the pseudo-header sum, without the length for TSO (each frame's
        // length is the port's to add, as DPDK and Linux expect).
        let tso = u16::try_from(out.tso_segsz).unwrap_or(0);
        let phdr_len = if tso > 0 { 0 } else { len };
        let partial = crate::checksum::fold(crate::checksum::pseudo_header(me, peer, 6, phdr_len));
        let built = link.send_tcp_offloaded(now, tx, peer, hdr, len, tso, |ip| {
            let buf = &mut ip[smoltcp::wire::IPV4_HEADER_LEN..];
            if let Some(p) = payload.take() {
                p(&mut buf[hdr..]);
            }
            let mut pkt = TcpPacket::new_unchecked(&mut *buf);
            repr.emit(&mut pkt, &src, &dst, &ChecksumCapabilities::ignored());
            pkt.set_checksum(partial);
        });
        match built {
            Ok(true) => return true,
            Err(_) => return false,
            // Next hop not resolved: the ordinary path below holds the
            // packet for ARP (a TSO segment cannot wait there).
            Ok(false) if out.tso_segsz > 0 => return false,
            Ok(false) => {}
        }
    }
    let Some(payload) = payload else {
        return false;
    };
    link.send_ip(now, tx, peer, IpProtocol::Tcp, len, |buf| {
        payload(&mut buf[hdr..]);
        let mut pkt = TcpPacket::new_unchecked(&mut *buf);
        repr.emit(&mut pkt, &src, &dst, &ChecksumCapabilities::ignored());
        if fill {
            // Our own word-wide sum (crate::checksum), not smoltcp's.
            pkt.set_checksum(0);
            let c = crate::checksum::compute(me, peer, 6, buf);
            TcpPacket::new_unchecked(buf).set_checksum(c);
        }
    })
    .is_ok()
}

/// Bits of a SYN-cookie SYN-ACK's TSval that carry the peer's options:
/// its window scale (4 bits, 15 for none) and SACK-permitted (bit 4).
const COOKIE_OPTS_MASK: u32 = 0x3f;
const COOKIE_NO_WSCALE: u32 = 0xf;
const COOKIE_SACK: u32 = 0x10;

/// The TSval of a SYN-cookie SYN-ACK: the clock the connection will use
/// (its timestamp offset comes from the ISN, the cookie) with the peer's
/// options in the low bits, never ahead of that clock, so the
/// connection's later TSvals do not go backwards.
fn cookie_tsval(now: Instant, cookie: Seq, wscale: Option<u8>, sack: bool) -> u32 {
    let clock = TcpConn::tsval_at(now, cookie);
    let opts = wscale.map_or(COOKIE_NO_WSCALE, |w| u32::from(w.min(14)))
        | if sack { COOKIE_SACK } else { 0 };
    let ts = (clock & !COOKIE_OPTS_MASK) | opts;
    if (ts.wrapping_sub(clock) as i32) > 0 {
        ts.wrapping_sub(COOKIE_OPTS_MASK + 1)
    } else {
        ts
    }
}

/// The peer's window scale and SACK-permitted, from the TSecr of the ACK
/// that completes a SYN-cookie handshake.
fn cookie_options(tsecr: u32) -> (Option<u8>, bool) {
    let w = tsecr & COOKIE_NO_WSCALE;
    let wscale = (w != COOKIE_NO_WSCALE).then_some(w as u8);
    (wscale, tsecr & COOKIE_SACK != 0)
}

impl TcpTable {
    /// A TCP segment for us: to its connection (one hash lookup), to a
    /// listener (new connection, SYN cookie, or dropped), or answered
    /// with a reset.
    pub(crate) fn process<T: Tx>(
        &mut self,
        link: &mut Link,
        now: Instant,
        meta: IpMeta<'_>,
        body: &[u8],
        tx: &mut T,
    ) -> Result<(), DropReason> {
        if meta.broadcast {
            return Err(DropReason::TcpBroadcast);
        }
        let pkt = TcpPacket::new_checked(body).map_err(|_| DropReason::TcpMalformed)?;
        let (src, dst) = (IpAddress::Ipv4(meta.src), IpAddress::Ipv4(meta.dst));
        if link.checksum.tcp.rx()
            && !link.rx_l4_good
            && !crate::checksum::verifies(meta.src, meta.dst, 6, body)
        {
            return Err(DropReason::TcpBadChecksum);
        }
        let repr = TcpRepr::parse(&pkt, &src, &dst, &ChecksumCapabilities::ignored())
            .map_err(|_| DropReason::TcpMalformed)?;
        let seg = segment_from(&repr);
        self.stats.segs_in += 1;
        let remote = SocketAddrV4::new(meta.src, repr.src_port);
        let key = FlowKey {
            local_port: repr.dst_port,
            remote,
        };
        if let Some(&slot) = self.flows.get(&key) {
            self.deliver(now, slot, &seg);
            return Ok(());
        }
        let listening = self.listeners.contains_key(&repr.dst_port);
        if link.may_pass && !(listening && seg.hdr.syn && seg.hdr.ack.is_none()) {
            // Perhaps a sibling shard's flow (or listener), on the wrong queue.
            link.passed = true;
            return Ok(());
        }
        let me = local(link.ip(), repr.dst_port);
        if listening && !seg.hdr.rst {
            return self.listen_input(link, now, tx, me, remote, &seg);
        }
        if !seg.hdr.rst {
            self.send_reset(link, now, tx, me, remote, &seg);
        }
        Err(DropReason::TcpNoSocket)
    }

    /// An ICMP fragmentation-needed about one of our segments (RFC 1191):
    /// the connection it quotes lowers its MSS to fit `mtu`, when the
    /// quoted sequence number is one it has in flight (RFC 5927 5.1, so a
    /// forged message must guess it).
    pub(crate) fn frag_needed(
        &mut self,
        now: Instant,
        local_port: u16,
        remote: SocketAddrV4,
        seq: u32,
        mtu: u16,
    ) -> Result<(), DropReason> {
        let key = FlowKey { local_port, remote };
        let slot = *self.flows.get(&key).ok_or(DropReason::IcmpUnhandled)?;
        let conn = (self.slots.get_mut(slot as usize))
            .and_then(|s| s.conn.as_mut())
            .ok_or(DropReason::IcmpUnhandled)?;
        if !conn.on_path_mtu(now, Seq(seq), usize::from(mtu)) {
            return Err(DropReason::IcmpUnhandled);
        }
        self.mark_dirty(slot);
        Ok(())
    }

    fn deliver(&mut self, now: Instant, slot: u32, seg: &Segment<'_>) {
        let tcp = self;
        let Some(s) = tcp.slots.get_mut(slot as usize) else {
            return;
        };
        let Some(conn) = s.conn.as_mut() else { return };
        let levels = Levels::of(conn);
        let before = conn.state();
        let ooo_before = conn.ooo_bytes();
        conn.on_segment(now, seg);
        let after = conn.state();
        let changed = levels.changes(Levels::of(conn), conn.send_low_water());
        tcp.ooo_total = (tcp.ooo_total + conn.ooo_bytes()).saturating_sub(ooo_before);
        if tcp.ooo_total > tcp.cfg.max_ooo_total {
            // Memory pressure: this connection gives its out-of-order data back.
            let freed = conn.drop_ooo();
            tcp.ooo_total = tcp.ooo_total.saturating_sub(freed);
            tcp.stats.ooo_pruned += 1;
        }
        if let Some(want) = conn.take_rcvbuf_request() {
            // Autotuning: grow within the stack-wide budget.
            let have = conn.rcvbuf_capacity();
            let room = tcp.cfg.autotune_memory.saturating_sub(tcp.autotune_bytes);
            let grant = (want - have).min(room);
            if grant >= tcp.cfg.mss {
                conn.grow_rcvbuf(have + grant);
                tcp.autotune_bytes += conn.rcvbuf_capacity() - have;
                tcp.stats.rcvbuf_grown += 1;
            } else {
                tcp.stats.autotune_limited += 1;
            }
        }
        if seg.hdr.rst && after == State::Closed {
            tcp.stats.resets_received += 1;
        }
        if before != after
            && matches!(
                after,
                State::Established | State::FinWait1 | State::CloseWait
            )
            && matches!(before, State::SynSent | State::SynReceived)
        {
            tcp.stats.established += 1;
            if let (true, Some(port)) = (s.embryonic, s.listener) {
                s.embryonic = false;
                if let Some(l) = tcp.listeners.get_mut(&port) {
                    l.embryonic = l.embryonic.saturating_sub(1);
                    l.ready.push_back(slot);
                    tcp.raise_listener(port);
                }
            }
        }
        tcp.raise(slot, changed);
        tcp.mark_dirty(slot);
    }

    fn listen_input<T: Tx>(
        &mut self,
        link: &mut Link,
        now: Instant,
        tx: &mut T,
        me: SocketAddrV4,
        remote: SocketAddrV4,
        seg: &Segment<'_>,
    ) -> Result<(), DropReason> {
        let Some(l) = self.listeners.get(&me.port()) else {
            return Err(DropReason::TcpNoSocket);
        };
        let full = l.ready.len() + l.embryonic >= l.backlog;
        if seg.hdr.syn && seg.hdr.ack.is_none() {
            if full {
                // Backlog full: answer statelessly with a SYN cookie.
                self.stats.listen_overflows += 1;
                let mss = seg
                    .hdr
                    .mss
                    .unwrap_or(536)
                    .min(u16::try_from(self.cfg.mss).unwrap_or(u16::MAX));
                let cookie = self.cookie(now, me, remote, seg.hdr.seq, mss);
                let cfg = &self.cfg;
                let wscale = seg.hdr.wscale.filter(|_| cfg.window_scaling);
                let sack = cfg.sack && seg.hdr.sack_permitted;
                // With timestamps, the options ride in the low bits of our
                // TSval and come back in the final ACK's TSecr (as Linux
                // does); without, the cookie carries only the MSS.
                let timestamp = match seg.hdr.timestamp {
                    Some((peer_tsval, _)) if cfg.timestamps => {
                        Some((cookie_tsval(now, cookie, wscale, sack), peer_tsval))
                    }
                    _ => None,
                };
                let ts = timestamp.is_some();
                let out = Outgoing::from(Header {
                    seq: cookie,
                    ack: Some(seg.hdr.seq + 1),
                    syn: true,
                    window: u16::try_from(cfg.recv_buffer).unwrap_or(u16::MAX),
                    mss: Some(mss),
                    wscale: (ts && wscale.is_some()).then(|| cfg.rcv_wscale()),
                    sack_permitted: ts && sack,
                    timestamp,
                    ..Header::default()
                });
                if emit(link, now, tx, me.port(), remote, &out, |_| {}) {
                    self.stats.syn_cookies_sent += 1;
                    self.stats.segs_out += 1;
                }
                return Ok(());
            }
            let iss = self.isn(now, me, remote);
            let conn = TcpConn::accept(self.cfg.clone(), me, remote, iss, seg);
            let slot = self.insert_passive(conn, me.port());
            self.schedule(slot);
            return Ok(());
        }
        // RFC 9293 3.10.7.2: with neither SYN nor ACK (nor RST, handled by
        // the caller) a segment to a listener is dropped unanswered (a FIN,
        // NULL or Xmas scan learns nothing from silence).
        if seg.hdr.ack.is_none() {
            return Err(DropReason::TcpListenNoAck);
        }
        // An ACK for no connection: perhaps the third step of a cookie handshake.
        if let (Some(ack), false) = (seg.hdr.ack, seg.hdr.syn) {
            let peer_isn = seg.hdr.seq - 1;
            if let Some(mss) = self.check_cookie(now, me, remote, peer_isn, ack - 1) {
                self.stats.syn_cookies_accepted += 1;
                // The peer's SYN options, from the TSecr echo of our TSval.
                let (wscale, sack_permitted, timestamp) = match seg.hdr.timestamp {
                    Some((tsval, tsecr)) if self.cfg.timestamps => {
                        let (wscale, sack) = cookie_options(tsecr);
                        (wscale, sack, Some((tsval, 0)))
                    }
                    _ => (None, false, None),
                };
                let syn = Segment::from(Header {
                    seq: peer_isn,
                    syn: true,
                    window: seg.hdr.window,
                    mss: Some(mss),
                    wscale,
                    sack_permitted,
                    timestamp,
                    ..Header::default()
                });
                let mut conn = TcpConn::accept(self.cfg.clone(), me, remote, ack - 1, &syn);
                conn.cookie_established();
                let slot = self.insert_passive(conn, me.port());
                self.deliver(now, slot, seg);
                return Ok(());
            }
            self.stats.syn_cookies_failed += 1;
        }
        self.send_reset(link, now, tx, me, remote, seg);
        Err(DropReason::TcpNoSocket)
    }

    /// RFC 9293 3.10.7.1: the reset for a segment that belongs to nothing,
    /// within the stack's reset rate (`Config::rst_rate`).
    fn send_reset<T: Tx>(
        &mut self,
        link: &mut Link,
        now: Instant,
        tx: &mut T,
        me: SocketAddrV4,
        remote: SocketAddrV4,
        seg: &Segment<'_>,
    ) {
        let out = match seg.hdr.ack {
            Some(ack) => Outgoing::from(Header {
                seq: ack,
                rst: true,
                ..Header::default()
            }),
            None => Outgoing::from(Header {
                seq: Seq(0),
                ack: Some(seg.hdr.seq + seg.len()),
                rst: true,
                ..Header::default()
            }),
        };
        if !link.rst_limit.take(now) {
            self.stats.resets_rate_limited += 1;
            return;
        }
        if emit(link, now, tx, me.port(), remote, &out, |_| {}) {
            self.stats.resets_sent += 1;
            self.stats.segs_out += 1;
        }
    }

    /// Timers that are due, then every connection with something to send.
    pub(crate) fn poll<T: Tx>(&mut self, link: &mut Link, now: Instant, tx: &mut T) {
        while let Some(std::cmp::Reverse((at, slot))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            if let Some(s) = self.slots.get_mut(slot as usize) {
                if s.timer == Some(at) {
                    s.timer = None;
                    self.mark_dirty(slot);
                }
            }
        }
        while let Some(slot) = self.dirty.pop_front() {
            let TcpTable { slots, stats, .. } = self;
            let Some(s) = slots.get_mut(slot as usize) else {
                continue;
            };
            s.dirty = false;
            let Some(conn) = s.conn.as_mut() else {
                continue;
            };
            let before = conn.stats().retransmits;
            let levels = Levels::of(conn);
            conn.set_tso_max(link.offloads.tso_max);
            while let Some(out) = conn.poll_transmit(now) {
                let (port, remote) = (conn.local().port(), conn.remote());
                let c: &TcpConn = conn;
                if emit(link, now, tx, port, remote, &out, |buf| {
                    c.copy_payload(&out, buf);
                }) {
                    stats.segs_out += 1;
                    if out.hdr.rst {
                        stats.resets_sent += 1;
                    }
                }
            }
            stats.retransmits += conn.stats().retransmits - before;
            let changed = levels.changes(Levels::of(conn), conn.send_low_water());
            self.raise(slot, changed);
            self.schedule(slot);
            self.reap(slot);
        }
    }
}
