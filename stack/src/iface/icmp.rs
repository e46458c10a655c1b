//! ICMP: echo requests answered (Record Route updated), ping sockets for
//! apps (send requests, receive timestamped replies and unreachables), and
//! fragmentation-needed handed to TCP.
//!
//! A request carries its transmit time (engine nanoseconds, big-endian) in the
//! first 8 bytes of its data when the data is at least 8 bytes long, the way
//! iputils ping carries a timeval; the reply brings it back, so no per-request
//! state is kept and the RTT survives loss and reordering.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddrV4};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use slotmap::SlotMap;
use smoltcp::wire::{
    IPV4_HEADER_LEN as IP_LEN, Icmpv4DstUnreachable, Icmpv4Message, Icmpv4Packet, Icmpv4Repr,
    IpProtocol, Ipv4Packet,
};

use crate::error::{ConnError, Error};
pub use crate::events::PingHandle;
use crate::events::{Event, Pending, Readiness, SocketRef};
use crate::iface::link::{IpMeta, Link};
use crate::phy::device::Tx;
use crate::stats::DropReason;
use crate::time::Instant;

/// An echo reply delivered to the app.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PingReply {
    /// The replying host (the reply's source address).
    pub from: IpAddr,
    /// Echo identifier (RFC 792): the ping socket's.
    pub ident: u16,
    /// Echo sequence number, as sent in the request.
    pub seq: u16,
    /// The reply's TTL (IPv4) or hop limit (IPv6) as received.
    pub ttl: u8,
    /// ICMP message length (8-byte header plus data), as ping prints it.
    pub bytes: usize,
    /// Transmit time read back from the data, if it carried one.
    pub sent_at: Option<Instant>,
    /// When the reply arrived, on the poll loop's clock: the port's receive
    /// stamp where it has one (libpcap's kernel stamp), else the poll that
    /// processed it.
    pub received_at: Instant,
}

impl PingReply {
    /// Round-trip time, when the request carried a timestamp.
    pub fn rtt(&self) -> Option<Duration> {
        self.sent_at
            .map(|s| self.received_at.saturating_duration_since(s))
    }
}

/// What a ping socket receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PingEvent {
    /// An echo reply to one of our requests.
    Reply(PingReply),
    /// An ICMP destination-unreachable about one of our requests.
    Unreachable {
        /// The host that sent the error (a router or the destination).
        from: IpAddr,
        /// Sequence number of the quoted request.
        seq: u16,
        /// ICMP code (RFC 792: 0 net, 1 host, 2 protocol, 3 port
        /// unreachable, 4 fragmentation needed, ...).
        code: u8,
    },
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct PingRequest {
    pub dst: IpAddr,
    pub seq: u16,
    pub size: usize,
}

#[derive(Debug)]
pub(crate) struct PingSocket {
    ident: u16,
    tx: VecDeque<PingRequest>,
    rx: VecDeque<PingEvent>,
    queued: bool,
    events: Pending,
}

/// Most events or requests a ping socket holds.
const PING_QUEUE: usize = 4096;
/// Largest echo data we send (IPv4 maximum minus headers).
pub const MAX_PING_DATA: usize = 65_507;

/// The ping sockets of a stack, and the ICMP layer.
#[derive(Debug, Default)]
pub(crate) struct PingTable {
    sockets: SlotMap<PingHandle, PingSocket>,
    by_ident: HashMap<u16, PingHandle>,
    /// Sockets with requests to send.
    ready: VecDeque<PingHandle>,
    /// Sockets with pending readiness events.
    events: Vec<PingHandle>,
}

impl PingTable {
    fn get_mut(&mut self, h: PingHandle) -> Result<&mut PingSocket, Error> {
        self.sockets.get_mut(h).ok_or(Error::InvalidHandle)
    }

    /// Whether requests wait to be sent.
    pub fn has_work(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Deliver an event; false if the socket's queue is full.
    fn deliver(&mut self, ident: u16, ev: PingEvent) -> Option<bool> {
        let h = *self.by_ident.get(&ident)?;
        let s = self.sockets.get_mut(h)?;
        if s.rx.len() >= PING_QUEUE {
            return Some(false);
        }
        s.rx.push_back(ev);
        if s.events.raise(Readiness::READABLE) {
            self.events.push(h);
        }
        Some(true)
    }

    /// Whether events wait to be drained.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Hand out pending events.
    pub fn drain_events(&mut self, out: &mut Vec<Event>) {
        for h in self.events.drain(..) {
            if let Some(s) = self.sockets.get_mut(h) {
                let readiness = s.events.take();
                if !readiness.is_empty() {
                    out.push(Event {
                        socket: SocketRef::Ping(h),
                        readiness,
                    });
                }
            }
        }
    }

    /// Open a ping socket with echo identifier `ident`.
    pub fn open(&mut self, ident: u16) -> Result<PingHandle, Error> {
        if self.by_ident.contains_key(&ident) {
            return Err(Error::AddrInUse);
        }
        let h = self.sockets.insert(PingSocket {
            ident,
            tx: VecDeque::new(),
            rx: VecDeque::new(),
            queued: false,
            events: Pending::default(),
        });
        self.by_ident.insert(ident, h);
        Ok(h)
    }

    /// Queue an echo request with `size` bytes of data to `dst` (ICMP or
    /// ICMPv6 by its family).
    pub fn send(&mut self, h: PingHandle, dst: IpAddr, seq: u16, size: usize) -> Result<(), Error> {
        if size > MAX_PING_DATA {
            return Err(Error::TooLarge);
        }
        let s = self.get_mut(h)?;
        if s.tx.len() >= PING_QUEUE {
            return Err(Error::QueueFull);
        }
        s.tx.push_back(PingRequest { dst, seq, size });
        if !s.queued {
            s.queued = true;
            self.ready.push_back(h);
        }
        Ok(())
    }

    /// Next reply or error for this socket.
    pub fn recv(&mut self, h: PingHandle) -> Result<Option<PingEvent>, Error> {
        Ok(self.get_mut(h)?.rx.pop_front())
    }

    /// Close a ping socket; queued requests and events are discarded.
    pub fn close(&mut self, h: PingHandle) -> Result<(), Error> {
        let s = self.sockets.remove(h).ok_or(Error::InvalidHandle)?;
        self.by_ident.remove(&s.ident);
        self.ready.retain(|&i| i != h);
        self.events.retain(|&i| i != h);
        Ok(())
    }
}

/// Fill echo data: an 8-byte timestamp, then a counting pattern.
pub(crate) fn fill_echo_data(data: &mut [u8], now: Instant) {
    for (i, b) in data.iter_mut().enumerate() {
        *b = (i & 0xff) as u8;
    }
    if let Some(ts) = data.get_mut(..8) {
        ts.copy_from_slice(&now.as_nanos().to_be_bytes());
    }
}

/// The timestamp carried by echo data, if long enough.
pub(crate) fn echo_timestamp(data: &[u8]) -> Option<Instant> {
    let b: [u8; 8] = data.get(..8)?.try_into().ok()?;
    Some(Instant::from_nanos(u64::from_be_bytes(b)))
}

/// What the ICMP layer leaves for another layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IcmpOutcome {
    /// Handled here.
    Done,
    /// Fragmentation needed for one of our TCP segments (RFC 1191).
    TcpFragNeeded {
        local_port: u16,
        remote: SocketAddrV4,
        seq: u32,
        mtu: u16,
    },
    /// Another error about one of our TCP segments (unreachable, time
    /// exceeded, parameter problem): what it means for a connection.
    TcpError {
        local_port: u16,
        remote: SocketAddrV4,
        seq: u32,
        error: ConnError,
    },
}

/// The connection error an ICMP destination unreachable `code` means
/// (Linux's `icmp_err_convert`, in the errors a connection has); port
/// unreachable is a refusal.
fn unreachable_error(code: u8) -> ConnError {
    match code {
        0 | 6 | 9 | 11 => ConnError::NetUnreachable,
        2 => ConnError::ProtocolError,
        3 => ConnError::Refused,
        _ => ConnError::HostUnreachable,
    }
}

/// The TCP segment an ICMP error quotes (`data`: our IPv4 header and at
/// least 8 bytes after it), when it is one of ours: local port, peer
/// and sequence number.
fn quoted_tcp(link: &Link, data: &[u8]) -> Option<(u16, SocketAddrV4, u32)> {
    if data.len() < IP_LEN {
        return None;
    }
    let quoted = Ipv4Packet::new_unchecked(data);
    let inner = data.get(usize::from(quoted.header_len())..)?;
    if quoted.next_header() != IpProtocol::Tcp || inner.len() < 8 || quoted.src_addr() != link.ip()
    {
        return None;
    }
    let remote = SocketAddrV4::new(quoted.dst_addr(), u16::from_be_bytes([inner[2], inner[3]]));
    let seq = u32::from_be_bytes([inner[4], inner[5], inner[6], inner[7]]);
    Some((u16::from_be_bytes([inner[0], inner[1]]), remote, seq))
}

impl PingTable {
    /// An ICMP message for us: echo requests are answered (Record Route
    /// updated), replies and unreachables go to the ping socket they name.
    /// A fragmentation-needed about one of our TCP segments is handed back
    /// for the TCP layer.
    pub(crate) fn process<T: Tx>(
        &mut self,
        link: &mut Link,
        now: Instant,
        meta: IpMeta<'_>,
        body: &[u8],
        tx: &mut T,
    ) -> Result<IcmpOutcome, DropReason> {
        let pkt = Icmpv4Packet::new_checked(body).map_err(|_| DropReason::IcmpMalformed)?;
        if !pkt.verify_checksum() {
            return Err(DropReason::IcmpBadChecksum);
        }
        match pkt.msg_type() {
            Icmpv4Message::EchoRequest => {
                link.stats.icmp.rx_echo_requests += 1;
                if meta.broadcast && !link.cfg.answer_broadcast_ping {
                    return Err(DropReason::IcmpUnhandled);
                }
                let reply = Icmpv4Repr::EchoReply {
                    ident: pkt.echo_ident(),
                    seq_no: pkt.echo_seq_no(),
                    data: pkt.data(),
                };
                let caps = link.checksum.clone();
                let mut rr = [0u8; 40];
                let options = record_route(meta.header, link.ip(), &mut rr);
                let sent = link.send_ip_with_options(
                    now,
                    tx,
                    meta.src_v4(),
                    IpProtocol::Icmp,
                    0,
                    options,
                    reply.buffer_len(),
                    |buf| {
                        reply.emit(&mut Icmpv4Packet::new_unchecked(buf), &caps);
                    },
                );
                if sent.is_ok() {
                    link.stats.icmp.tx_echo_replies += 1;
                }
                Ok(IcmpOutcome::Done)
            }
            Icmpv4Message::EchoReply => {
                let data = pkt.data();
                let reply = PingReply {
                    from: meta.src,
                    ident: pkt.echo_ident(),
                    seq: pkt.echo_seq_no(),
                    ttl: meta.ttl,
                    bytes: body.len(),
                    sent_at: echo_timestamp(data),
                    received_at: meta.rx.at.unwrap_or(now),
                };
                link.stats.icmp.rx_echo_replies += 1;
                match self.deliver(reply.ident, PingEvent::Reply(reply)) {
                    Some(true) => Ok(IcmpOutcome::Done),
                    _ => Err(DropReason::IcmpUnhandled),
                }
            }
            Icmpv4Message::DstUnreachable => {
                link.stats.icmp.rx_dest_unreachable += 1;
                // The quoted datagram: our IPv4 header, then 8 bytes of ICMP.
                // Only the header and 8 bytes are quoted, so the quoted total
                // length exceeds what is here: check the header alone.
                let data = pkt.data();
                if data.len() < IP_LEN {
                    return Err(DropReason::IcmpMalformed);
                }
                let quoted = Ipv4Packet::new_unchecked(data);
                let inner = data
                    .get(usize::from(quoted.header_len())..)
                    .ok_or(DropReason::IcmpMalformed)?;
                if quoted.next_header() == IpProtocol::Tcp
                    && pkt.msg_code() == u8::from(Icmpv4DstUnreachable::FragRequired)
                    && inner.len() >= 8
                    && quoted.src_addr() == link.ip()
                {
                    // RFC 1191: the next-hop MTU is in bytes 6-7 of the header.
                    let mtu = u16::from_be_bytes([body[6], body[7]]);
                    let remote = SocketAddrV4::new(
                        quoted.dst_addr(),
                        u16::from_be_bytes([inner[2], inner[3]]),
                    );
                    let local_port = u16::from_be_bytes([inner[0], inner[1]]);
                    let seq = u32::from_be_bytes([inner[4], inner[5], inner[6], inner[7]]);
                    return Ok(IcmpOutcome::TcpFragNeeded {
                        local_port,
                        remote,
                        seq,
                        mtu,
                    });
                }
                if let Some((local_port, remote, seq)) = quoted_tcp(link, data) {
                    return Ok(IcmpOutcome::TcpError {
                        local_port,
                        remote,
                        seq,
                        error: unreachable_error(pkt.msg_code()),
                    });
                }
                if quoted.next_header() == IpProtocol::Icmp
                    && inner.len() >= 8
                    && inner[0] == u8::from(Icmpv4Message::EchoRequest)
                {
                    let ident = u16::from_be_bytes([inner[4], inner[5]]);
                    let seq = u16::from_be_bytes([inner[6], inner[7]]);
                    let ev = PingEvent::Unreachable {
                        from: meta.src,
                        seq,
                        code: pkt.msg_code(),
                    };
                    if self.deliver(ident, ev) == Some(true) {
                        return Ok(IcmpOutcome::Done);
                    }
                }
                Err(DropReason::IcmpUnhandled)
            }
            Icmpv4Message::TimeExceeded | Icmpv4Message::ParamProblem => {
                let (local_port, remote, seq) =
                    quoted_tcp(link, pkt.data()).ok_or(DropReason::IcmpUnhandled)?;
                let error = if pkt.msg_type() == Icmpv4Message::TimeExceeded {
                    ConnError::HostUnreachable
                } else {
                    ConnError::ProtocolError
                };
                Ok(IcmpOutcome::TcpError {
                    local_port,
                    remote,
                    seq,
                    error,
                })
            }
            _ => Err(DropReason::IcmpUnhandled),
        }
    }

    /// Send the echo requests sockets queued.
    pub(crate) fn emit<T: Tx>(&mut self, link: &mut Link, now: Instant, tx: &mut T) {
        while let Some(h) = self.ready.pop_front() {
            let Some(sock) = self.sockets.get_mut(h) else {
                continue;
            };
            sock.queued = false;
            let ident = sock.ident;
            let requests: Vec<_> = sock.tx.drain(..).collect();
            for req in requests {
                let len = 8 + req.size;
                let dst = match req.dst {
                    IpAddr::V4(dst) => dst,
                    IpAddr::V6(dst) => {
                        echo_request6(link, now, tx, dst, ident, req);
                        continue;
                    }
                };
                let sent = link.send_ip(now, tx, dst, IpProtocol::Icmp, len, |buf| {
                    let mut p = Icmpv4Packet::new_unchecked(buf);
                    p.set_msg_type(Icmpv4Message::EchoRequest);
                    p.set_msg_code(0);
                    p.set_echo_ident(ident);
                    p.set_echo_seq_no(req.seq);
                    fill_echo_data(p.data_mut(), now);
                    p.fill_checksum();
                });
                if sent.is_ok() {
                    link.stats.icmp.tx_echo_requests += 1;
                }
            }
        }
    }
}

/// An ICMPv6 echo request (RFC 4443 §4.1) from the source the
/// destination calls for, its data as IPv4's (the send time first).
fn echo_request6<T: Tx>(
    link: &mut Link,
    now: Instant,
    tx: &mut T,
    dst: Ipv6Addr,
    ident: u16,
    req: PingRequest,
) {
    let Some(src) = link.ip6.source_for(&dst) else {
        link.stats.ipv6.tx_no_route += 1;
        return;
    };
    let len = 8 + req.size;
    let sent = crate::iface::ipv6::send(
        link,
        now,
        tx,
        src,
        dst,
        (IpProtocol::Icmpv6, 0),
        0,
        len,
        |b| {
            b[0] = ECHO_REQUEST6;
            b[1..4].fill(0);
            b[4..6].copy_from_slice(&ident.to_be_bytes());
            b[6..8].copy_from_slice(&req.seq.to_be_bytes());
            fill_echo_data(&mut b[8..], now);
            let c = crate::wire::checksum::compute_ip(src.into(), dst.into(), 58, b);
            b[2..4].copy_from_slice(&c.to_be_bytes());
        },
    );
    if sent.is_ok() {
        link.stats.ipv6.tx_echo_requests += 1;
    }
}

/// ICMPv6 echo request and reply (RFC 4443 §4).
const ECHO_REQUEST6: u8 = 128;
const ECHO_REPLY6: u8 = 129;

impl PingTable {
    /// An ICMPv6 echo reply for us (the receive path hands up only
    /// those): to the ping socket its identifier names.
    pub(crate) fn process6(
        &mut self,
        link: &mut Link,
        now: Instant,
        meta: IpMeta<'_>,
        body: &[u8],
    ) -> Result<(), DropReason> {
        let (IpAddr::V6(src), IpAddr::V6(dst)) = (meta.src, meta.dst) else {
            return Err(DropReason::Icmpv6Malformed);
        };
        if body.len() < 8 || body[0] != ECHO_REPLY6 || body[1] != 0 {
            return Err(DropReason::Icmpv6Malformed);
        }
        if crate::wire::checksum::compute_ip(src.into(), dst.into(), 58, body) != 0 {
            return Err(DropReason::Icmpv6BadChecksum);
        }
        link.stats.ipv6.rx_echo_replies += 1;
        let reply = PingReply {
            from: meta.src,
            ident: u16::from_be_bytes([body[4], body[5]]),
            seq: u16::from_be_bytes([body[6], body[7]]),
            ttl: meta.ttl,
            bytes: body.len(),
            sent_at: echo_timestamp(&body[8..]),
            received_at: meta.rx.at.unwrap_or(now),
        };
        match self.deliver(reply.ident, PingEvent::Reply(reply)) {
            Some(true) => Ok(()),
            _ => Err(DropReason::Icmpv6Unhandled),
        }
    }
}

/// The options of an echo reply (RFC 1122 3.2.2.6): a Record Route option
/// in the request's header is copied with our address added where it has
/// room, padded to a multiple of 4 in `out`. Other options are not echoed.
/// Empty when the request had no (well-formed) Record Route.
fn record_route<'a>(header: &[u8], me: Ipv4Addr, out: &'a mut [u8; 40]) -> &'a [u8] {
    const EOL: u8 = 0;
    const NOP: u8 = 1;
    const RR: u8 = 7;
    let mut opts = header.get(IP_LEN..).unwrap_or_default();
    while let Some(&kind) = opts.first() {
        match kind {
            EOL => break,
            NOP => opts = &opts[1..],
            _ => {
                let len = usize::from(opts.get(1).copied().unwrap_or(0));
                let Some(opt) = opts.get(..len).filter(|_| len >= 2) else {
                    return &[];
                };
                if kind == RR {
                    // Type, length, pointer (1-based, at least 4), then slots.
                    let ptr = usize::from(opt.get(2).copied().unwrap_or(0));
                    if len < 3 || ptr < 4 {
                        return &[];
                    }
                    out[..len].copy_from_slice(opt);
                    if ptr + 3 <= len {
                        out[ptr - 1..ptr + 3].copy_from_slice(&me.octets());
                        out[2] = (ptr + 4) as u8;
                    }
                    let padded = len.div_ceil(4) * 4;
                    out[len..padded].fill(EOL);
                    return &out[..padded];
                }
                opts = &opts[len..];
            }
        }
    }
    &[]
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn timestamp_round_trip() {
        let mut d = [0u8; 56];
        fill_echo_data(&mut d, Instant::from_nanos(123_456_789));
        assert_eq!(echo_timestamp(&d), Some(Instant::from_nanos(123_456_789)));
        assert_eq!(d[8], 8);
        let mut short = [0u8; 4];
        fill_echo_data(&mut short, Instant::from_nanos(1));
        assert_eq!(echo_timestamp(&short), None);
    }
}
