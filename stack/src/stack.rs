//! The engine: one `Stack` per port queue, driven by `receive` and `poll`.
//!
//! Receive path: Ethernet -> ARP | IPv4 (validate, reassemble) -> ICMP | UDP.
//! Every frame ends accepted or dropped with one [`DropReason`].
//! Transmit path: sockets queue work; [`Stack::poll`] emits it through a
//! [`Tx`], resolving next hops with ARP and fragmenting above the MTU.

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, ETHERNET_HEADER_LEN as ETH_LEN, EthernetAddress,
    EthernetFrame, EthernetProtocol, EthernetRepr, IPV4_HEADER_LEN as IP_LEN, Icmpv4DstUnreachable,
    Icmpv4Message, Icmpv4Packet, Icmpv4Repr, IpAddress, IpProtocol, Ipv4Cidr, Ipv4Packet,
    UdpPacket, UdpRepr,
};
use tracing::trace;

use crate::arp::{ArpCache, ArpConfig, Enqueue};
use crate::device::Tx;
use crate::frag::{FragConfig, FragKey, Reassembler};
use crate::icmp::{PingEvent, PingReply, PingTable, echo_timestamp, fill_echo_data};
use crate::stats::{DropReason, Stats};
use crate::tcp::{TcpConfig, TcpTable};
use crate::time::{Instant, earliest};
use crate::ud::UdTable;
use crate::udp::UdpTable;

/// Errors the app API returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("address or identifier already in use")]
    AddrInUse,
    #[error("no free port")]
    NoFreePort,
    #[error("no such socket")]
    InvalidHandle,
    #[error("send queue full")]
    QueueFull,
    #[error("message too large")]
    TooLarge,
    #[error("no route to host")]
    NoRoute,
    #[error("connection closed")]
    Closed,
    #[error(transparent)]
    Tcp(#[from] crate::tcp::ConnError),
}

/// Configuration of one stack instance.
#[derive(Debug, Clone)]
pub struct Config {
    pub mac: EthernetAddress,
    /// Our address and subnet.
    pub ip: Ipv4Cidr,
    /// Next hop for addresses outside the subnet.
    pub gateway: Option<Ipv4Addr>,
    /// IP MTU (largest IPv4 packet without the Ethernet header).
    pub mtu: usize,
    /// TTL of packets we originate.
    pub ttl: u8,
    pub arp: ArpConfig,
    pub frag: FragConfig,
    /// ICMP errors per second we may send (token bucket rate and burst).
    pub icmp_error_rate: u32,
    /// Resets per second we may send for segments that match no connection
    /// (token bucket rate and burst), so an ACK or SYN flood to closed ports
    /// is not answered packet for packet. Resets within a connection are
    /// not limited.
    pub rst_rate: u32,
    /// Bytes a UDP socket may hold received.
    pub udp_rx_queue_bytes: usize,
    /// Bytes a UDP socket may hold waiting to send.
    pub udp_tx_queue_bytes: usize,
    /// Send a gratuitous ARP on the first poll.
    pub announce: bool,
    /// Answer echo requests sent to a broadcast address (Linux: no).
    pub answer_broadcast_ping: bool,
    /// Defaults for every TCP connection.
    pub tcp: TcpConfig,
    /// Key for ISNs, SYN cookies and IPv4 IDs (RFC 6528): random with
    /// [`Config::new`], derived from a seed with [`Config::with_seed`].
    pub secret: (u64, u64),
    /// Which of a host's per-queue stacks this is (active opens pick local
    /// ports whose flows hash back to this queue).
    pub shard: crate::shard::ShardId,
}

impl Config {
    /// Defaults for a host with address `ip` on a subnet, MTU 1500, and a
    /// random secret for ISNs, SYN cookies and IPv4 IDs (RFC 6528: each
    /// stack its own, unpredictable).
    pub fn new(mac: EthernetAddress, ip: Ipv4Cidr) -> Self {
        // std's RandomState keys come from the OS's random source once per
        // thread and differ for every instance: no clock, no extra crate.
        let random = std::collections::hash_map::RandomState::new();
        let secret = (random.hash_one(1u8), random.hash_one(2u8));
        Config {
            secret,
            ..Self::with_seed(mac, ip, 0)
        }
    }

    /// As [`Config::new`] with the secret derived from `seed`: the same
    /// seed gives the same sequence numbers and IDs (simulations, tests).
    pub fn with_seed(mac: EthernetAddress, ip: Ipv4Cidr, seed: u64) -> Self {
        let mix = |k: u64| {
            foldhash::fast::FixedState::with_seed(seed ^ 0x7573_7461_636b_0001).hash_one(k)
        };
        Config {
            mac,
            ip,
            gateway: None,
            mtu: 1500,
            ttl: 64,
            arp: ArpConfig::default(),
            frag: FragConfig::default(),
            icmp_error_rate: 100,
            rst_rate: 1000,
            udp_rx_queue_bytes: 1 << 20,
            udp_tx_queue_bytes: 1 << 20,
            announce: true,
            answer_broadcast_ping: false,
            tcp: TcpConfig::default(),
            secret: (mix(1), mix(2)),
            shard: crate::shard::ShardId::SINGLE,
        }
    }
}

/// A token bucket for ICMP errors (RFC 1812 4.3.2.8 style rate limit) and
/// resets.
#[derive(Debug)]
pub(crate) struct RateLimit {
    rate: u32,
    tokens: f64,
    last: Instant,
}

impl RateLimit {
    fn new(rate: u32) -> Self {
        RateLimit {
            rate,
            tokens: f64::from(rate),
            last: Instant::ZERO,
        }
    }

    pub(crate) fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        let cap = f64::from(self.rate);
        self.tokens = (self.tokens + elapsed * cap).min(cap);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// What the IP layer tells the transport about a received datagram.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IpMeta<'a> {
    pub(crate) src: Ipv4Addr,
    pub(crate) dst: Ipv4Addr,
    pub(crate) protocol: IpProtocol,
    pub(crate) ttl: u8,
    /// Addressed to a broadcast address (never answered with an ICMP error).
    pub(crate) broadcast: bool,
    /// The IPv4 header as received, options included (the first
    /// fragment's for a reassembled datagram): what ICMP errors quote.
    pub(crate) header: &'a [u8],
}

/// The layers below the transport: configuration, ARP, counters and the
/// IPv4 transmit path. Kept apart from the socket tables so a transport can
/// write a segment straight from its own buffers while `Link` emits it.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) cfg: Config,
    pub(crate) checksum: ChecksumCapabilities,
    arp: ArpCache,
    pub(crate) stats: Stats,
    /// IPv4 identification counters, one per hash bucket ([`Link::next_ident`]).
    ip_idents: Box<[u16]>,
    ident_hash: foldhash::fast::FixedState,
    announced: bool,
    icmp_errors: RateLimit,
    /// Resets for segments that belong to no connection (token bucket).
    pub(crate) rst_limit: RateLimit,
    arp_retry: Vec<Ipv4Addr>,
    /// Processing a sibling shard's copy of an ARP frame: learn, never answer.
    replica: bool,
    /// A TCP segment for no connection here may belong to a sibling shard:
    /// set `passed` instead of answering it.
    pub(crate) may_pass: bool,
    pub(crate) passed: bool,
}

/// One instance of the protocol engine.
#[derive(Debug)]
pub struct Stack {
    pub(crate) link: Link,
    frags: Reassembler,
    pub(crate) pings: PingTable,
    pub(crate) udp: UdpTable,
    pub(crate) tcp: TcpTable,
    pub(crate) ud: UdTable,
    /// The latest `now` seen (for API calls that need a time, like connect).
    pub(crate) now: Instant,
}

impl Stack {
    pub fn new(cfg: Config) -> Self {
        let mut cfg_tcp = cfg.tcp.clone();
        cfg_tcp.mss = cfg_tcp.mss.min(cfg.mtu.saturating_sub(40)).max(64);
        let secret = cfg.secret;
        Stack {
            frags: Reassembler::new(cfg.frag.clone()),
            link: Link {
                arp: ArpCache::new(cfg.arp.clone()),
                icmp_errors: RateLimit::new(cfg.icmp_error_rate),
                rst_limit: RateLimit::new(cfg.rst_rate),
                announced: !cfg.announce,
                cfg,
                checksum: ChecksumCapabilities::default(),
                stats: Stats::default(),
                ip_idents: ident_buckets(secret),
                ident_hash: foldhash::fast::FixedState::with_seed(
                    secret.0 ^ secret.1.rotate_left(32),
                ),
                arp_retry: Vec::new(),
                replica: false,
                may_pass: false,
                passed: false,
            },
            pings: PingTable::default(),
            udp: UdpTable::default(),
            tcp: TcpTable::new(cfg_tcp, secret),
            ud: UdTable::default(),
            now: Instant::ZERO,
        }
    }

    pub fn config(&self) -> &Config {
        &self.link.cfg
    }

    pub fn ip(&self) -> Ipv4Addr {
        self.link.cfg.ip.address()
    }

    pub fn mac(&self) -> EthernetAddress {
        self.link.cfg.mac
    }

    /// A copy of every counter, gauges filled in.
    pub fn stats(&self) -> Stats {
        let mut s = self.link.stats.clone();
        s.arp = self.link.arp.stats();
        s.ipv4.reassembly_bytes = self.frags.mem() as u64;
        s.ipv4.reassembly_bytes_hwm = self.frags.mem_hwm as u64;
        s.ipv4.reassembly_timeouts = self.frags.timeouts;
        s.ipv4.reassembly_evicted = self.frags.evicted;
        s.udp.sockets = self.udp.by_port.len() as u64;
        s.tcp = self.tcp.stats();
        s.ud.qps = self.ud.count() as u64;
        s
    }

    /// ARP entries that are fresh at `now`.
    pub fn arp_entries(&self, now: Instant) -> Vec<(Ipv4Addr, EthernetAddress)> {
        self.link.arp.entries(now)
    }

    // ---------------------------------------------------------------- receive

    /// Process one received frame. Replies (ARP, echo, ICMP errors) are
    /// written to `tx` at once.
    pub fn receive<T: Tx>(&mut self, now: Instant, frame: &[u8], tx: &mut T) {
        self.now = now;
        self.link.stats.eth.rx_frames += 1;
        self.link.stats.eth.rx_bytes += frame.len() as u64;
        match self.process_ethernet(now, frame, tx) {
            Ok(()) => self.link.stats.eth.rx_accepted += 1,
            Err(reason) => {
                trace!(reason = reason.name(), len = frame.len(), "drop");
                self.link.stats.drops.inc(reason);
            }
        }
    }

    /// Learn from a copy of an ARP frame a sibling shard received (see
    /// [`crate::shard`]): the cache and the packets waiting on it are
    /// updated as by [`Stack::receive`], but no reply is sent (the shard
    /// that received the frame answers it).
    pub fn receive_replica<T: Tx>(&mut self, now: Instant, frame: &[u8], tx: &mut T) {
        self.link.replica = true;
        self.receive(now, frame, tx);
        self.link.replica = false;
    }

    /// [`Stack::receive`] on a shard of a multi-queue host whose frames
    /// may arrive on the wrong queue (a driver that spreads flows by its own
    /// hash): with `may_pass`, a TCP segment that matches no connection here
    /// (other than a SYN this shard listens for) is left alone,
    /// and the return value says to pass it to the next shard. The last
    /// shard to see it (`may_pass` false) answers it as usual.
    pub fn receive_or_pass<T: Tx>(
        &mut self,
        now: Instant,
        frame: &[u8],
        tx: &mut T,
        may_pass: bool,
    ) -> bool {
        self.link.may_pass = may_pass;
        self.receive(now, frame, tx);
        self.link.may_pass = false;
        std::mem::take(&mut self.link.passed)
    }

    fn process_ethernet<T: Tx>(
        &mut self,
        now: Instant,
        frame: &[u8],
        tx: &mut T,
    ) -> Result<(), DropReason> {
        let eth = EthernetFrame::new_checked(frame).map_err(|_| DropReason::EthTruncated)?;
        if frame.len() > ETH_LEN + self.link.cfg.mtu {
            return Err(DropReason::EthOversize);
        }
        let dst = eth.dst_addr();
        if dst != self.link.cfg.mac && !dst.is_broadcast() {
            return Err(DropReason::EthNotForUs);
        }
        let src = eth.src_addr();
        if !src.is_unicast() {
            return Err(DropReason::EthBadSource);
        }
        match eth.ethertype() {
            EthernetProtocol::Arp => self.process_arp(now, eth.payload(), tx),
            EthernetProtocol::Ipv4 => self.process_ipv4(now, eth.payload(), tx),
            _ => Err(DropReason::EthUnknownType),
        }
    }

    fn process_arp<T: Tx>(
        &mut self,
        now: Instant,
        payload: &[u8],
        tx: &mut T,
    ) -> Result<(), DropReason> {
        let pkt = ArpPacket::new_checked(payload).map_err(|_| DropReason::ArpMalformed)?;
        let repr = ArpRepr::parse(&pkt).map_err(|_| DropReason::ArpMalformed)?;
        let ArpRepr::EthernetIpv4 {
            operation,
            source_hardware_addr: sha,
            source_protocol_addr: spa,
            target_protocol_addr: tpa,
            ..
        } = repr
        else {
            return Err(DropReason::ArpMalformed);
        };
        match operation {
            ArpOperation::Request => self.link.arp.stats.rx_requests += 1,
            ArpOperation::Reply => self.link.arp.stats.rx_replies += 1,
            _ => return Err(DropReason::ArpMalformed),
        }
        if !sha.is_unicast() {
            return Err(DropReason::ArpMalformed);
        }
        let me = self.ip();
        if spa == me {
            // Someone else claims our address: never learn it.
            return Err(DropReason::ArpConflict);
        }
        let for_us = tpa == me;
        let gratuitous = spa == tpa;
        if gratuitous {
            self.link.arp.stats.rx_gratuitous += 1;
        }
        let learnable = !spa.is_unspecified() && !spa.is_broadcast() && !spa.is_multicast();
        let known = self.link.arp.knows(spa);
        if learnable {
            // RFC 826: refresh a known sender; add it when it asks for us.
            // A reply to us adds an entry only when it answers our request
            // (the cache knows), so an unsolicited reply cannot plant one;
            // a replica learns what its sibling asked for.
            let adds = for_us && (operation == ArpOperation::Request || self.link.replica);
            let waiting = (self.link.arp)
                .learn(now, spa, sha, adds)
                .map_err(|_| DropReason::ArpSpoofRefused)?;
            self.link.flush_waiting(sha, waiting, tx);
        }
        if for_us && operation == ArpOperation::Request && !self.link.replica {
            self.link.send_arp(tx, ArpOperation::Reply, sha, spa);
            self.link.arp.stats.tx_replies += 1;
        }
        if for_us || (learnable && known) {
            Ok(())
        } else {
            Err(DropReason::ArpNotForUs)
        }
    }

    fn process_ipv4<T: Tx>(
        &mut self,
        now: Instant,
        payload: &[u8],
        tx: &mut T,
    ) -> Result<(), DropReason> {
        if payload.len() < IP_LEN {
            return Err(DropReason::Ipv4Truncated);
        }
        let pkt = Ipv4Packet::new_unchecked(payload);
        if pkt.version() != 4 {
            return Err(DropReason::Ipv4BadVersion);
        }
        let hl = usize::from(pkt.header_len());
        if hl < IP_LEN {
            return Err(DropReason::Ipv4BadHeaderLen);
        }
        if hl > payload.len() {
            return Err(DropReason::Ipv4Truncated);
        }
        let tl = usize::from(pkt.total_len());
        if tl < hl || tl > payload.len() {
            return Err(DropReason::Ipv4BadTotalLen);
        }
        if !pkt.verify_checksum() {
            return Err(DropReason::Ipv4BadChecksum);
        }
        let (src, dst) = (pkt.src_addr(), pkt.dst_addr());
        let me = self.ip();
        let broadcast = dst.is_broadcast() || Some(dst) == self.link.cfg.ip.broadcast();
        if dst != me && !broadcast {
            return Err(DropReason::Ipv4NotForUs);
        }
        if src.is_broadcast()
            || src.is_multicast()
            || src.is_unspecified()
            || src == me
            || Some(src) == self.link.cfg.ip.broadcast()
        {
            return Err(DropReason::Ipv4BadSource);
        }
        self.link.stats.ipv4.rx_packets += 1;
        self.link.stats.ipv4.rx_bytes += tl as u64;
        let meta = IpMeta {
            src,
            dst,
            protocol: pkt.next_header(),
            ttl: pkt.hop_limit(),
            broadcast,
            header: &payload[..hl],
        };
        let body = &payload[hl..tl];
        if pkt.more_frags() || pkt.frag_offset() != 0 {
            self.link.stats.ipv4.rx_fragments += 1;
            let key = FragKey {
                src,
                dst,
                ident: pkt.ident(),
                protocol: meta.protocol.into(),
            };
            let offset = usize::from(pkt.frag_offset());
            return match self
                .frags
                .insert(now, key, offset, pkt.more_frags(), meta.header, body)?
            {
                None => Ok(()),
                Some(whole) => {
                    self.link.stats.ipv4.reassembled += 1;
                    let meta = IpMeta {
                        ttl: whole.ttl(),
                        header: &whole.header,
                        ..meta
                    };
                    self.process_transport(now, meta, &whole.payload, None, tx)
                }
            };
        }
        self.process_transport(now, meta, body, Some(&payload[..tl]), tx)
    }

    fn process_transport<T: Tx>(
        &mut self,
        now: Instant,
        meta: IpMeta<'_>,
        body: &[u8],
        // The whole IPv4 packet, header included (not for reassembled ones).
        ip: Option<&[u8]>,
        tx: &mut T,
    ) -> Result<(), DropReason> {
        match meta.protocol {
            IpProtocol::Icmp => self.process_icmp(now, meta, body, tx),
            IpProtocol::Udp => self.process_udp(now, meta, body, ip, tx),
            IpProtocol::Tcp => self.process_tcp(now, meta, body, tx),
            _ => {
                self.link.send_unreachable(
                    now,
                    tx,
                    Icmpv4DstUnreachable::ProtoUnreachable,
                    meta,
                    body,
                );
                Err(DropReason::Ipv4UnknownProtocol)
            }
        }
    }

    fn process_icmp<T: Tx>(
        &mut self,
        now: Instant,
        meta: IpMeta<'_>,
        body: &[u8],
        tx: &mut T,
    ) -> Result<(), DropReason> {
        let pkt = Icmpv4Packet::new_checked(body).map_err(|_| DropReason::IcmpMalformed)?;
        if !pkt.verify_checksum() {
            return Err(DropReason::IcmpBadChecksum);
        }
        match pkt.msg_type() {
            Icmpv4Message::EchoRequest => {
                self.link.stats.icmp.rx_echo_requests += 1;
                if meta.broadcast && !self.link.cfg.answer_broadcast_ping {
                    return Err(DropReason::IcmpUnhandled);
                }
                let reply = Icmpv4Repr::EchoReply {
                    ident: pkt.echo_ident(),
                    seq_no: pkt.echo_seq_no(),
                    data: pkt.data(),
                };
                let caps = self.link.checksum.clone();
                let mut rr = [0u8; 40];
                let options = record_route(meta.header, self.ip(), &mut rr);
                let sent = self.link.send_ip_with_options(
                    now,
                    tx,
                    meta.src,
                    IpProtocol::Icmp,
                    options,
                    reply.buffer_len(),
                    |buf| {
                        reply.emit(&mut Icmpv4Packet::new_unchecked(buf), &caps);
                    },
                );
                if sent.is_ok() {
                    self.link.stats.icmp.tx_echo_replies += 1;
                }
                Ok(())
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
                    received_at: now,
                };
                self.link.stats.icmp.rx_echo_replies += 1;
                match self.pings.deliver(reply.ident, PingEvent::Reply(reply)) {
                    Some(true) => Ok(()),
                    _ => Err(DropReason::IcmpUnhandled),
                }
            }
            Icmpv4Message::DstUnreachable => {
                self.link.stats.icmp.rx_dest_unreachable += 1;
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
                    && quoted.src_addr() == self.ip()
                {
                    // RFC 1191: the next-hop MTU is in bytes 6-7 of the header.
                    let mtu = u16::from_be_bytes([body[6], body[7]]);
                    let remote = SocketAddrV4::new(
                        quoted.dst_addr(),
                        u16::from_be_bytes([inner[2], inner[3]]),
                    );
                    let local_port = u16::from_be_bytes([inner[0], inner[1]]);
                    let seq = u32::from_be_bytes([inner[4], inner[5], inner[6], inner[7]]);
                    return self.tcp_frag_needed(now, local_port, remote, seq, mtu);
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
                    if self.pings.deliver(ident, ev) == Some(true) {
                        return Ok(());
                    }
                }
                Err(DropReason::IcmpUnhandled)
            }
            _ => Err(DropReason::IcmpUnhandled),
        }
    }

    fn process_udp<T: Tx>(
        &mut self,
        now: Instant,
        meta: IpMeta<'_>,
        body: &[u8],
        ip: Option<&[u8]>,
        tx: &mut T,
    ) -> Result<(), DropReason> {
        let pkt = UdpPacket::new_checked(body).map_err(|_| DropReason::UdpMalformed)?;
        if pkt.dst_port() == 0 {
            return Err(DropReason::UdpMalformed);
        }
        let (src, dst) = (IpAddress::Ipv4(meta.src), IpAddress::Ipv4(meta.dst));
        if pkt.checksum() != 0 && !pkt.verify_checksum(&src, &dst) {
            return Err(DropReason::UdpBadChecksum);
        }
        if pkt.dst_port() == crate::ud::wire::ROCE_PORT {
            return self.process_roce(now, ip, pkt.payload());
        }
        let data = pkt.payload();
        let cap = self.link.cfg.udp_rx_queue_bytes;
        let Some(sock) = self.udp.by_port(pkt.dst_port()) else {
            self.link
                .send_unreachable(now, tx, Icmpv4DstUnreachable::PortUnreachable, meta, body);
            return Err(DropReason::UdpNoSocket);
        };
        if sock.rx_bytes + data.len() > cap && !sock.rx.is_empty() {
            return Err(DropReason::UdpQueueFull);
        }
        sock.rx_bytes += data.len();
        sock.rx
            .push_back((SocketAddrV4::new(meta.src, pkt.src_port()), data.to_vec()));
        self.link.stats.udp.rx_datagrams += 1;
        self.link.stats.udp.rx_bytes += data.len() as u64;
        Ok(())
    }

    // ------------------------------------------------------------------- poll

    /// Run timers and emit what sockets queued.
    pub fn poll<T: Tx>(&mut self, now: Instant, tx: &mut T) {
        self.now = now;
        if !self.link.announced {
            self.link.announced = true;
            let me = self.ip();
            self.link
                .send_arp(tx, ArpOperation::Request, EthernetAddress::BROADCAST, me);
            self.link.arp.stats.tx_gratuitous += 1;
        }
        let mut retry = std::mem::take(&mut self.link.arp_retry);
        self.link.arp.poll(now, &mut retry);
        for ip in retry.drain(..) {
            self.link
                .send_arp(tx, ArpOperation::Request, EthernetAddress::BROADCAST, ip);
            self.link.arp.stats.tx_requests += 1;
        }
        self.link.arp_retry = retry;
        self.frags.poll(now);
        self.emit_pings(now, tx);
        self.emit_udp(now, tx);
        self.poll_tcp(now, tx);
        self.emit_ud(now, tx);
    }

    /// The next time [`poll`](Self::poll) has work (may be in the past: poll now).
    pub fn poll_at(&self) -> Option<Instant> {
        if !self.link.announced
            || !self.pings.ready.is_empty()
            || !self.udp.ready.is_empty()
            || !self.tcp.dirty.is_empty()
            || self.ud.has_work()
        {
            return Some(Instant::ZERO);
        }
        let tcp = self.tcp.timers.peek().map(|r| r.0.0);
        earliest(earliest(self.link.arp.poll_at(), self.frags.poll_at()), tcp)
    }

    fn emit_pings<T: Tx>(&mut self, now: Instant, tx: &mut T) {
        while let Some(idx) = self.pings.ready.pop_front() {
            let Some(sock) = self.pings.sockets.get_mut(idx).and_then(Option::as_mut) else {
                continue;
            };
            sock.queued = false;
            let ident = sock.ident;
            let requests: Vec<_> = sock.tx.drain(..).collect();
            for req in requests {
                let len = 8 + req.size;
                let sent = self
                    .link
                    .send_ip(now, tx, req.dst, IpProtocol::Icmp, len, |buf| {
                        let mut p = Icmpv4Packet::new_unchecked(buf);
                        p.set_msg_type(Icmpv4Message::EchoRequest);
                        p.set_msg_code(0);
                        p.set_echo_ident(ident);
                        p.set_echo_seq_no(req.seq);
                        fill_echo_data(p.data_mut(), now);
                        p.fill_checksum();
                    });
                if sent.is_ok() {
                    self.link.stats.icmp.tx_echo_requests += 1;
                }
            }
        }
    }

    fn emit_udp<T: Tx>(&mut self, now: Instant, tx: &mut T) {
        while let Some(idx) = self.udp.ready.pop_front() {
            let Some(sock) = self.udp.sockets.get_mut(idx).and_then(Option::as_mut) else {
                continue;
            };
            sock.queued = false;
            let port = sock.port;
            let datagrams = std::mem::take(&mut sock.tx);
            sock.tx_bytes = 0;
            for (dst, data) in datagrams {
                let src = IpAddress::Ipv4(self.ip());
                let repr = UdpRepr {
                    src_port: port,
                    dst_port: dst.port(),
                };
                let caps = self.link.checksum.clone();
                let len = repr.header_len() + data.len();
                let sent = self
                    .link
                    .send_ip(now, tx, *dst.ip(), IpProtocol::Udp, len, |buf| {
                        repr.emit(
                            &mut UdpPacket::new_unchecked(buf),
                            &src,
                            &IpAddress::Ipv4(*dst.ip()),
                            data.len(),
                            |p| p.copy_from_slice(&data),
                            &caps,
                        );
                    });
                if sent.is_ok() {
                    self.link.stats.udp.tx_datagrams += 1;
                    self.link.stats.udp.tx_bytes += data.len() as u64;
                }
            }
        }
    }
}

impl Link {
    pub(crate) fn ip(&self) -> Ipv4Addr {
        self.cfg.ip.address()
    }

    pub(crate) fn flush_waiting<T: Tx>(
        &mut self,
        mac: EthernetAddress,
        waiting: VecDeque<Vec<u8>>,
        tx: &mut T,
    ) {
        for packet in waiting {
            let src = self.cfg.mac;
            let ok = tx.send(ETH_LEN + packet.len(), |buf| {
                write_eth(buf, src, mac, EthernetProtocol::Ipv4);
                buf[ETH_LEN..].copy_from_slice(&packet);
            });
            self.count_tx(ok, ETH_LEN + packet.len());
        }
    }

    /// ICMP destination unreachable about a datagram we received, rate-limited,
    /// never about a broadcast or an ICMP error. The message quotes the
    /// datagram's own IPv4 header and its first 8 bytes as received (RFC 792,
    /// RFC 1122 3.2.2), and every byte of it is written here: the "unused"
    /// word is zero, not whatever the buffer held before.
    pub(crate) fn send_unreachable<T: Tx>(
        &mut self,
        now: Instant,
        tx: &mut T,
        reason: Icmpv4DstUnreachable,
        meta: IpMeta<'_>,
        body: &[u8],
    ) {
        if meta.broadcast {
            return;
        }
        if !self.icmp_errors.take(now) {
            self.stats.icmp.rate_limited += 1;
            return;
        }
        let data = &body[..body.len().min(8)];
        let quote_len = meta.header.len() + data.len();
        let sent = self.send_ip(now, tx, meta.src, IpProtocol::Icmp, 8 + quote_len, |buf| {
            let mut p = Icmpv4Packet::new_unchecked(&mut *buf);
            p.set_msg_type(Icmpv4Message::DstUnreachable);
            p.set_msg_code(reason.into());
            // Checksum (filled below) and the unused word.
            buf[2..8].fill(0);
            let (hdr, rest) = buf[8..].split_at_mut(meta.header.len());
            hdr.copy_from_slice(meta.header);
            rest[..data.len()].copy_from_slice(data);
            Icmpv4Packet::new_unchecked(buf).fill_checksum();
        });
        if sent.is_ok() {
            self.stats.icmp.tx_dest_unreachable += 1;
        }
    }

    pub(crate) fn count_tx(&mut self, ok: bool, len: usize) {
        if ok {
            self.stats.eth.tx_frames += 1;
            self.stats.eth.tx_bytes += len as u64;
        } else {
            self.stats.eth.tx_no_buffer += 1;
        }
    }

    pub(crate) fn send_arp<T: Tx>(
        &mut self,
        tx: &mut T,
        operation: ArpOperation,
        target_mac: EthernetAddress,
        target_ip: Ipv4Addr,
    ) {
        let repr = ArpRepr::EthernetIpv4 {
            operation,
            source_hardware_addr: self.cfg.mac,
            source_protocol_addr: self.ip(),
            target_hardware_addr: if operation == ArpOperation::Request {
                EthernetAddress([0; 6])
            } else {
                target_mac
            },
            target_protocol_addr: target_ip,
        };
        let src = self.cfg.mac;
        let len = ETH_LEN + repr.buffer_len();
        let ok = tx.send(len, |buf| {
            write_eth(buf, src, target_mac, EthernetProtocol::Arp);
            repr.emit(&mut ArpPacket::new_unchecked(&mut buf[ETH_LEN..]));
        });
        self.count_tx(ok, len);
    }

    /// The next hop for `dst`, or `None` when there is no route.
    pub(crate) fn next_hop(&self, dst: Ipv4Addr) -> Option<Ipv4Addr> {
        if self.cfg.ip.contains_addr(&dst) {
            Some(dst)
        } else {
            self.cfg.gateway
        }
    }

    /// The identification of the next datagram to `dst` (RFC 6864, RFC 7739
    /// 5.3): one counter per bucket of a keyed hash of the destination and
    /// protocol, each starting at a keyed offset, so the IDs one peer sees
    /// tell it nothing of the traffic to others (no idle scan, no count of
    /// the host's traffic).
    pub(crate) fn next_ident(&mut self, dst: Ipv4Addr, protocol: IpProtocol) -> u16 {
        let i = self
            .ident_hash
            .hash_one((u32::from(dst), u8::from(protocol))) as usize;
        let c = &mut self.ip_idents[i % IP_ID_BUCKETS];
        *c = c.wrapping_add(1);
        *c
    }

    /// Send an IPv4 datagram whose payload `fill` writes (`payload_len` bytes):
    /// straight into a device buffer when the next hop is resolved, into the
    /// ARP queue otherwise; fragmented when larger than the MTU.
    pub(crate) fn send_ip<T: Tx, F: FnOnce(&mut [u8])>(
        &mut self,
        now: Instant,
        tx: &mut T,
        dst: Ipv4Addr,
        protocol: IpProtocol,
        payload_len: usize,
        fill: F,
    ) -> Result<(), Error> {
        self.send_ip_with_options(now, tx, dst, protocol, &[], payload_len, fill)
    }

    /// [`send_ip`](Self::send_ip) with IPv4 `options` (a multiple of 4
    /// bytes, at most 40) in the header. Options that are not copied on
    /// fragmentation (Record Route) would ride in the first fragment only:
    /// a datagram that needs fragmenting leaves without them instead.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send_ip_with_options<T: Tx, F: FnOnce(&mut [u8])>(
        &mut self,
        now: Instant,
        tx: &mut T,
        dst: Ipv4Addr,
        protocol: IpProtocol,
        options: &[u8],
        payload_len: usize,
        fill: F,
    ) -> Result<(), Error> {
        if IP_LEN + payload_len > usize::from(u16::MAX) {
            return Err(Error::TooLarge);
        }
        let max_payload = self.cfg.mtu.saturating_sub(IP_LEN);
        if IP_LEN + options.len() + payload_len <= self.cfg.mtu {
            let hl = IP_LEN + options.len();
            return self.send_packet(now, tx, dst, protocol, options, payload_len, |ip| {
                fill(&mut ip[hl..]);
            });
        }
        let (hop, mac) = self.resolve(now, dst)?;
        let header = self.header(dst, protocol);
        // Fragment: build the payload once, then cut it at multiples of 8.
        let chunk = max_payload & !7;
        if chunk == 0 {
            return Err(Error::TooLarge);
        }
        let mut body = vec![0u8; payload_len];
        fill(&mut body);
        for (i, piece) in body.chunks(chunk).enumerate() {
            let offset = i * chunk;
            let more = offset + piece.len() < payload_len;
            let len = IP_LEN + piece.len();
            match mac {
                Some(mac) => {
                    let src = self.cfg.mac;
                    let ok = tx.send(ETH_LEN + len, |buf| {
                        write_eth(buf, src, mac, EthernetProtocol::Ipv4);
                        let ip = &mut buf[ETH_LEN..];
                        header.write(ip, &[], piece.len(), offset, more);
                        ip[IP_LEN..].copy_from_slice(piece);
                    });
                    self.count_tx(ok, ETH_LEN + len);
                }
                None => {
                    let mut packet = vec![0u8; len];
                    header.write(&mut packet, &[], piece.len(), offset, more);
                    packet[IP_LEN..].copy_from_slice(piece);
                    self.hold_for_arp(now, tx, hop, packet);
                }
            }
            self.stats.ipv4.tx_fragments += 1;
        }
        self.stats.ipv4.tx_packets += 1;
        self.stats.ipv4.tx_bytes += (IP_LEN + payload_len) as u64;
        Ok(())
    }

    /// Send one unfragmented IPv4 packet whose `fill` sees the whole packet,
    /// header written (for trailers that cover the IP header, like the
    /// RoCEv2 ICRC). Errors with `TooLarge` above the MTU; otherwise as
    /// [`send_ip`](Self::send_ip).
    pub(crate) fn send_ip_packet<T: Tx, F: FnOnce(&mut [u8])>(
        &mut self,
        now: Instant,
        tx: &mut T,
        dst: Ipv4Addr,
        protocol: IpProtocol,
        payload_len: usize,
        fill: F,
    ) -> Result<(), Error> {
        self.send_packet(now, tx, dst, protocol, &[], payload_len, fill)
    }

    /// One unfragmented packet with `options` in its header; `fill` sees the
    /// whole packet with the header written.
    #[allow(clippy::too_many_arguments)]
    fn send_packet<T: Tx, F: FnOnce(&mut [u8])>(
        &mut self,
        now: Instant,
        tx: &mut T,
        dst: Ipv4Addr,
        protocol: IpProtocol,
        options: &[u8],
        payload_len: usize,
        fill: F,
    ) -> Result<(), Error> {
        let len = IP_LEN + options.len() + payload_len;
        if len > self.cfg.mtu {
            return Err(Error::TooLarge);
        }
        let (hop, mac) = self.resolve(now, dst)?;
        let header = self.header(dst, protocol);
        match mac {
            Some(mac) => {
                let src = self.cfg.mac;
                let ok = tx.send(ETH_LEN + len, |buf| {
                    write_eth(buf, src, mac, EthernetProtocol::Ipv4);
                    let ip = &mut buf[ETH_LEN..];
                    header.write(ip, options, payload_len, 0, false);
                    fill(ip);
                });
                self.count_tx(ok, ETH_LEN + len);
                if !ok {
                    return Err(Error::QueueFull);
                }
            }
            None => {
                let mut packet = vec![0u8; len];
                header.write(&mut packet, options, payload_len, 0, false);
                fill(&mut packet);
                self.hold_for_arp(now, tx, hop, packet);
            }
        }
        self.stats.ipv4.tx_packets += 1;
        self.stats.ipv4.tx_bytes += len as u64;
        Ok(())
    }

    /// The next hop for `dst` and its MAC if known (broadcast needs no ARP).
    fn resolve(
        &mut self,
        now: Instant,
        dst: Ipv4Addr,
    ) -> Result<(Ipv4Addr, Option<EthernetAddress>), Error> {
        if dst == self.ip() || dst.is_unspecified() {
            self.stats.ipv4.tx_no_route += 1;
            return Err(Error::NoRoute);
        }
        if dst.is_broadcast() || Some(dst) == self.cfg.ip.broadcast() {
            return Ok((dst, Some(EthernetAddress::BROADCAST)));
        }
        let Some(hop) = self.next_hop(dst) else {
            self.stats.ipv4.tx_no_route += 1;
            return Err(Error::NoRoute);
        };
        Ok((hop, self.arp.lookup(now, hop)))
    }

    /// The header of a datagram we originate (a fresh identification).
    /// TCP sets DF: it honours fragmentation-needed (RFC 1191) by lowering
    /// the connection's MSS instead.
    fn header(&mut self, dst: Ipv4Addr, protocol: IpProtocol) -> IpHeader {
        IpHeader {
            src: self.ip(),
            dst,
            protocol,
            ttl: self.cfg.ttl,
            ident: self.next_ident(dst, protocol),
            dont_frag: protocol == IpProtocol::Tcp,
        }
    }

    pub(crate) fn hold_for_arp<T: Tx>(
        &mut self,
        now: Instant,
        tx: &mut T,
        hop: Ipv4Addr,
        packet: Vec<u8>,
    ) {
        if self.arp.enqueue(now, hop, packet) == Enqueue::QueuedSendRequest {
            self.send_arp(tx, ArpOperation::Request, EthernetAddress::BROADCAST, hop);
            self.arp.stats.tx_requests += 1;
        }
    }
}

/// The fields of an IPv4 header we originate.
#[derive(Debug, Clone, Copy)]
struct IpHeader {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    protocol: IpProtocol,
    ttl: u8,
    ident: u16,
    dont_frag: bool,
}

impl IpHeader {
    /// Write the header, `options` after the fixed 20 bytes, for a packet
    /// (or fragment) carrying `payload_len` bytes.
    fn write(
        &self,
        buf: &mut [u8],
        options: &[u8],
        payload_len: usize,
        frag_offset: usize,
        more: bool,
    ) {
        let hl = IP_LEN + options.len();
        buf[IP_LEN..hl].copy_from_slice(options);
        let mut p = Ipv4Packet::new_unchecked(buf);
        p.set_version(4);
        p.set_header_len(hl as u8);
        p.set_dscp(0);
        p.set_ecn(0);
        p.set_total_len((hl + payload_len) as u16);
        p.set_ident(self.ident);
        p.clear_flags();
        p.set_dont_frag(self.dont_frag && !more && frag_offset == 0);
        p.set_more_frags(more);
        p.set_frag_offset(frag_offset as u16);
        p.set_hop_limit(self.ttl);
        p.set_next_header(self.protocol);
        p.set_src_addr(self.src);
        p.set_dst_addr(self.dst);
        p.fill_checksum();
    }
}

fn write_eth(
    buf: &mut [u8],
    src: EthernetAddress,
    dst: EthernetAddress,
    ethertype: EthernetProtocol,
) {
    EthernetRepr {
        src_addr: src,
        dst_addr: dst,
        ethertype,
    }
    .emit(&mut EthernetFrame::new_unchecked(buf));
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

/// Buckets of IPv4 identification counters.
const IP_ID_BUCKETS: usize = 2048;

/// The identification counters, each starting at a keyed offset.
fn ident_buckets(secret: (u64, u64)) -> Box<[u16]> {
    let seed = foldhash::fast::FixedState::with_seed(secret.1);
    (0..IP_ID_BUCKETS)
        .map(|i| seed.hash_one(i) as u16)
        .collect()
}

/// Seconds as a `Duration` (for config literals).
pub const fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::device::VecTx;
    use crate::icmp::PingEvent;
    use smoltcp::wire::Ipv4Address;

    const OUR_MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);
    const PEER_MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);
    const OUR_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const PEER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
    const T0: Instant = Instant::ZERO;

    fn stack() -> Stack {
        let mut cfg = Config::new(OUR_MAC, Ipv4Cidr::new(OUR_IP, 24));
        cfg.announce = false;
        Stack::new(cfg)
    }

    fn eth(dst: EthernetAddress, ethertype: EthernetProtocol, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; ETH_LEN + payload.len()];
        write_eth(&mut f, PEER_MAC, dst, ethertype);
        f[ETH_LEN..].copy_from_slice(payload);
        f
    }

    fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, protocol: IpProtocol, payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; IP_LEN + payload.len()];
        IpHeader {
            src,
            dst,
            protocol,
            ttl: 63,
            ident: 9,
            dont_frag: false,
        }
        .write(&mut p, &[], payload.len(), 0, false);
        p[IP_LEN..].copy_from_slice(payload);
        p
    }

    fn icmp(repr: &Icmpv4Repr) -> Vec<u8> {
        let mut b = vec![0u8; repr.buffer_len()];
        repr.emit(
            &mut Icmpv4Packet::new_unchecked(&mut b),
            &ChecksumCapabilities::default(),
        );
        b
    }

    fn udp(src_port: u16, dst_port: u16, data: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; 8 + data.len()];
        UdpRepr { src_port, dst_port }.emit(
            &mut UdpPacket::new_unchecked(&mut b),
            &IpAddress::Ipv4(PEER_IP),
            &IpAddress::Ipv4(OUR_IP),
            data.len(),
            |p| p.copy_from_slice(data),
            &ChecksumCapabilities::default(),
        );
        b
    }

    fn echo_request(data: &[u8]) -> Vec<u8> {
        let req = icmp(&Icmpv4Repr::EchoRequest {
            ident: 0x1234,
            seq_no: 7,
            data,
        });
        eth(
            OUR_MAC,
            EthernetProtocol::Ipv4,
            &ipv4(PEER_IP, OUR_IP, IpProtocol::Icmp, &req),
        )
    }

    fn arp(op: ArpOperation, spa: Ipv4Addr, tpa: Ipv4Addr) -> Vec<u8> {
        let repr = ArpRepr::EthernetIpv4 {
            operation: op,
            source_hardware_addr: PEER_MAC,
            source_protocol_addr: spa,
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: tpa,
        };
        let mut b = vec![0u8; repr.buffer_len()];
        repr.emit(&mut ArpPacket::new_unchecked(&mut b));
        eth(EthernetAddress::BROADCAST, EthernetProtocol::Arp, &b)
    }

    /// Feed one frame, return what the stack sent and the drop (if any).
    fn feed(s: &mut Stack, frame: &[u8]) -> (Vec<Vec<u8>>, Option<DropReason>) {
        let before = s.stats().drops;
        let mut tx = VecTx::new();
        s.receive(T0, frame, &mut tx);
        let after = s.stats().drops;
        let reason = DropReason::ALL
            .iter()
            .copied()
            .find(|r| after.get(*r) > before.get(*r));
        let st = s.stats();
        assert_eq!(st.eth.rx_frames, st.eth.rx_accepted + st.drops.total());
        (tx.frames, reason)
    }

    fn parse_ip(frame: &[u8]) -> (EthernetRepr, Ipv4Packet<&[u8]>) {
        let f = EthernetFrame::new_checked(frame).unwrap();
        let repr = EthernetRepr::parse(&f).unwrap();
        let ip = Ipv4Packet::new_checked(&frame[ETH_LEN..]).unwrap();
        assert!(ip.verify_checksum());
        (repr, ip)
    }

    #[test]
    fn answers_arp_request_and_learns_sender() {
        let mut s = stack();
        let (out, drop) = feed(&mut s, &arp(ArpOperation::Request, PEER_IP, OUR_IP));
        assert_eq!(drop, None);
        assert_eq!(out.len(), 1);
        let f = EthernetFrame::new_checked(&out[0][..]).unwrap();
        assert_eq!(f.dst_addr(), PEER_MAC);
        let reply = ArpRepr::parse(&ArpPacket::new_checked(f.payload()).unwrap()).unwrap();
        assert_eq!(
            reply,
            ArpRepr::EthernetIpv4 {
                operation: ArpOperation::Reply,
                source_hardware_addr: OUR_MAC,
                source_protocol_addr: OUR_IP,
                target_hardware_addr: PEER_MAC,
                target_protocol_addr: PEER_IP,
            }
        );
        assert_eq!(s.arp_entries(T0), vec![(PEER_IP, PEER_MAC)]);
        assert_eq!(s.stats().arp.tx_replies, 1);
    }

    #[test]
    fn arp_for_other_hosts_is_dropped_and_not_learned() {
        let mut s = stack();
        let other = Ipv4Addr::new(10, 0, 0, 3);
        let (out, drop) = feed(&mut s, &arp(ArpOperation::Request, PEER_IP, other));
        assert!(out.is_empty());
        assert_eq!(drop, Some(DropReason::ArpNotForUs));
        assert!(s.arp_entries(T0).is_empty());
        // Someone claiming our address is never learned.
        let (_, drop) = feed(&mut s, &arp(ArpOperation::Reply, OUR_IP, OUR_IP));
        assert_eq!(drop, Some(DropReason::ArpConflict));
    }

    #[test]
    fn gratuitous_arp_updates_known_entry_only() {
        let mut s = stack();
        let (_, drop) = feed(&mut s, &arp(ArpOperation::Request, PEER_IP, PEER_IP));
        assert_eq!(drop, Some(DropReason::ArpNotForUs));
        assert!(s.arp_entries(T0).is_empty());
        feed(&mut s, &arp(ArpOperation::Request, PEER_IP, OUR_IP));
        let (_, drop) = feed(&mut s, &arp(ArpOperation::Request, PEER_IP, PEER_IP));
        assert_eq!(drop, None);
        assert_eq!(s.stats().arp.rx_gratuitous, 2);
    }

    #[test]
    fn announces_with_gratuitous_arp_on_first_poll() {
        let mut cfg = Config::new(OUR_MAC, Ipv4Cidr::new(OUR_IP, 24));
        cfg.announce = true;
        let mut s = Stack::new(cfg);
        assert_eq!(s.poll_at(), Some(Instant::ZERO));
        let mut tx = VecTx::new();
        s.poll(T0, &mut tx);
        assert_eq!(tx.frames.len(), 1);
        let f = EthernetFrame::new_checked(&tx.frames[0][..]).unwrap();
        assert!(f.dst_addr().is_broadcast());
        let a = ArpPacket::new_checked(f.payload()).unwrap();
        assert_eq!(a.source_protocol_addr(), a.target_protocol_addr());
        s.poll(T0, &mut tx);
        assert_eq!(tx.frames.len(), 1);
    }

    #[test]
    fn answers_echo_request_with_same_data() {
        let mut s = stack();
        feed(&mut s, &arp(ArpOperation::Request, PEER_IP, OUR_IP));
        let data: Vec<u8> = (0..56).collect();
        let (out, drop) = feed(&mut s, &echo_request(&data));
        assert_eq!(drop, None);
        assert_eq!(out.len(), 1);
        let (e, ip) = parse_ip(&out[0]);
        assert_eq!(
            (e.dst_addr, ip.dst_addr(), ip.hop_limit()),
            (PEER_MAC, PEER_IP, 64)
        );
        let p = Icmpv4Packet::new_checked(ip.payload()).unwrap();
        assert!(p.verify_checksum());
        assert_eq!(p.msg_type(), Icmpv4Message::EchoReply);
        assert_eq!((p.echo_ident(), p.echo_seq_no()), (0x1234, 7));
        assert_eq!(p.data(), &data[..]);
        assert_eq!(s.stats().icmp.tx_echo_replies, 1);
    }

    #[test]
    fn echo_reply_to_unresolved_peer_waits_for_arp() {
        let mut s = stack();
        let (out, _) = feed(&mut s, &echo_request(b"hello world12345"));
        // No ARP entry yet: the reply waits and a request goes out.
        assert_eq!(out.len(), 1);
        let f = EthernetFrame::new_checked(&out[0][..]).unwrap();
        assert_eq!(f.ethertype(), EthernetProtocol::Arp);
        assert_eq!(s.stats().arp.pending_packets, 1);
        let mut reply = arp(ArpOperation::Reply, PEER_IP, OUR_IP);
        reply[..6].copy_from_slice(&OUR_MAC.0);
        let (out, drop) = feed(&mut s, &reply);
        assert_eq!(drop, None);
        assert_eq!(out.len(), 1);
        let (e, ip) = parse_ip(&out[0]);
        assert_eq!(e.dst_addr, PEER_MAC);
        assert_eq!(ip.next_header(), IpProtocol::Icmp);
        assert_eq!(s.stats().arp.pending_packets, 0);
    }

    #[test]
    fn bad_frames_are_dropped_by_reason() {
        let mut s = stack();
        feed(&mut s, &arp(ArpOperation::Request, PEER_IP, OUR_IP));
        let good = echo_request(&[1, 2, 3, 4, 5, 6, 7, 8]);
        let ip_at = ETH_LEN;
        let mut cases: Vec<(Vec<u8>, DropReason)> = vec![
            (good[..10].to_vec(), DropReason::EthTruncated),
            (vec![0u8; 1600], DropReason::EthOversize),
            (
                eth(
                    EthernetAddress([2, 9, 9, 9, 9, 9]),
                    EthernetProtocol::Ipv4,
                    &good[ip_at..],
                ),
                DropReason::EthNotForUs,
            ),
            (
                eth(OUR_MAC, EthernetProtocol::Unknown(0x88b5), &[0; 46]),
                DropReason::EthUnknownType,
            ),
            (
                eth(OUR_MAC, EthernetProtocol::Arp, &[0; 10]),
                DropReason::ArpMalformed,
            ),
            (
                eth(OUR_MAC, EthernetProtocol::Ipv4, &good[ip_at..ip_at + 12]),
                DropReason::Ipv4Truncated,
            ),
            (
                ipv4(
                    PEER_IP,
                    Ipv4Addr::new(10, 0, 0, 99),
                    IpProtocol::Icmp,
                    &[0; 8],
                ),
                DropReason::Ipv4NotForUs,
            ),
            (
                ipv4(Ipv4Addr::BROADCAST, OUR_IP, IpProtocol::Icmp, &[0; 8]),
                DropReason::Ipv4BadSource,
            ),
            (
                ipv4(PEER_IP, OUR_IP, IpProtocol::Icmp, &[8, 0, 0, 0]),
                DropReason::IcmpMalformed,
            ),
            (
                ipv4(PEER_IP, OUR_IP, IpProtocol::Udp, &[0, 1, 0, 2, 0, 3]),
                DropReason::UdpMalformed,
            ),
        ];
        let wrap = |ip: Vec<u8>| eth(OUR_MAC, EthernetProtocol::Ipv4, &ip);
        for c in cases.iter_mut() {
            if c.0.len() > 14
                && c.0[..6] != OUR_MAC.0
                && c.1 != DropReason::EthNotForUs
                && c.1 != DropReason::EthOversize
            {
                c.0 = wrap(c.0.clone());
            }
        }
        // Mutations of a good echo request.
        let mut m = |at: usize, f: &dyn Fn(&mut u8), reason: DropReason| {
            let mut g = good.clone();
            f(&mut g[at]);
            cases.push((g, reason));
        };
        m(ip_at, &|b| *b = 0x65, DropReason::Ipv4BadVersion);
        m(ip_at, &|b| *b = 0x44, DropReason::Ipv4BadHeaderLen);
        m(ip_at, &|b| *b = 0x4f, DropReason::Ipv4Truncated);
        m(ip_at + 3, &|b| *b = 0xff, DropReason::Ipv4BadTotalLen);
        m(ip_at + 3, &|b| *b = 10, DropReason::Ipv4BadTotalLen);
        m(ip_at + 8, &|b| *b ^= 1, DropReason::Ipv4BadChecksum);
        m(
            ip_at + IP_LEN + 9,
            &|b| *b ^= 1,
            DropReason::IcmpBadChecksum,
        );
        for (frame, reason) in cases {
            let (out, got) = feed(&mut s, &frame);
            assert_eq!(got, Some(reason), "frame {frame:02x?}");
            assert!(out.is_empty(), "{reason:?} must not be answered");
        }
    }

    #[test]
    fn unknown_port_and_protocol_get_icmp_unreachable() {
        let mut s = stack();
        feed(&mut s, &arp(ArpOperation::Request, PEER_IP, OUR_IP));
        let dgram = udp(5000, 9999, b"anyone?");
        let (out, drop) = feed(
            &mut s,
            &eth(
                OUR_MAC,
                EthernetProtocol::Ipv4,
                &ipv4(PEER_IP, OUR_IP, IpProtocol::Udp, &dgram),
            ),
        );
        assert_eq!(drop, Some(DropReason::UdpNoSocket));
        assert_eq!(out.len(), 1);
        let (_, ip) = parse_ip(&out[0]);
        let p = Icmpv4Packet::new_checked(ip.payload()).unwrap();
        assert!(p.verify_checksum());
        assert_eq!(
            (p.msg_type(), p.msg_code()),
            (Icmpv4Message::DstUnreachable, 3)
        );
        // The quoted header names the original datagram.
        let quoted = Ipv4Packet::new_unchecked(p.data());
        assert_eq!((quoted.src_addr(), quoted.dst_addr()), (PEER_IP, OUR_IP));
        assert_eq!(&p.data()[IP_LEN..IP_LEN + 8], &dgram[..8]);

        let (out, drop) = feed(
            &mut s,
            &eth(
                OUR_MAC,
                EthernetProtocol::Ipv4,
                &ipv4(PEER_IP, OUR_IP, IpProtocol::Unknown(253), &[0; 8]),
            ),
        );
        assert_eq!(drop, Some(DropReason::Ipv4UnknownProtocol));
        let (_, ip) = parse_ip(&out[0]);
        assert_eq!(
            Icmpv4Packet::new_checked(ip.payload()).unwrap().msg_code(),
            2
        );

        // Nothing is sent about a datagram to a broadcast address.
        let mut no_csum = dgram.clone();
        no_csum[6..8].fill(0);
        let bcast = ipv4(
            PEER_IP,
            Ipv4Addr::new(10, 0, 0, 255),
            IpProtocol::Udp,
            &no_csum,
        );
        let (out, drop) = feed(
            &mut s,
            &eth(EthernetAddress::BROADCAST, EthernetProtocol::Ipv4, &bcast),
        );
        assert_eq!(drop, Some(DropReason::UdpNoSocket));
        assert!(out.is_empty());
    }

    #[test]
    fn icmp_errors_are_rate_limited() {
        let mut s = stack();
        feed(&mut s, &arp(ArpOperation::Request, PEER_IP, OUR_IP));
        let frame = eth(
            OUR_MAC,
            EthernetProtocol::Ipv4,
            &ipv4(PEER_IP, OUR_IP, IpProtocol::Udp, &udp(1, 2, b"x")),
        );
        let mut sent = 0;
        for _ in 0..1000 {
            sent += feed(&mut s, &frame).0.len();
        }
        assert_eq!(sent, 100);
        assert_eq!(s.stats().icmp.rate_limited, 900);
    }

    #[test]
    fn udp_bind_receive_send() {
        let mut s = stack();
        feed(&mut s, &arp(ArpOperation::Request, PEER_IP, OUR_IP));
        let h = s.udp_bind(7000).unwrap();
        assert_eq!(s.udp_bind(7000), Err(Error::AddrInUse));
        let frame = eth(
            OUR_MAC,
            EthernetProtocol::Ipv4,
            &ipv4(PEER_IP, OUR_IP, IpProtocol::Udp, &udp(5555, 7000, b"ping!")),
        );
        assert_eq!(feed(&mut s, &frame).1, None);
        let mut buf = [0u8; 64];
        let (n, from) = s.udp_recv_from(h, &mut buf).unwrap().unwrap();
        assert_eq!(
            (&buf[..n], from),
            (&b"ping!"[..], SocketAddrV4::new(PEER_IP, 5555))
        );
        assert_eq!(s.udp_recv_from(h, &mut buf).unwrap(), None);

        s.udp_send_to(h, from, b"pong!").unwrap();
        let mut tx = VecTx::new();
        s.poll(T0, &mut tx);
        assert_eq!(tx.frames.len(), 1);
        let (_, ip) = parse_ip(&tx.frames[0]);
        let u = UdpPacket::new_checked(ip.payload()).unwrap();
        assert!(u.verify_checksum(&IpAddress::Ipv4(OUR_IP), &IpAddress::Ipv4(PEER_IP)));
        assert_eq!(
            (u.src_port(), u.dst_port(), u.payload()),
            (7000, 5555, &b"pong!"[..])
        );

        let e = s.udp_bind(0).unwrap();
        assert!(s.udp_local_port(e).unwrap() >= 49_152);
        s.udp_close(h).unwrap();
        assert_eq!(s.udp_recv_from(h, &mut buf), Err(Error::InvalidHandle));
        assert_eq!(feed(&mut s, &frame).1, Some(DropReason::UdpNoSocket));
    }

    #[test]
    fn large_echo_is_fragmented_and_reassembled() {
        // Two stacks back to back through VecTx: A pings B with 4000 bytes.
        let mut a = stack();
        let mut b = Stack::new({
            let mut c = Config::new(PEER_MAC, Ipv4Cidr::new(PEER_IP, 24));
            c.announce = false;
            c
        });
        let h = a.ping_open(1).unwrap();
        a.ping_send(h, PEER_IP, 1, 4000).unwrap();
        // Shuttle frames both ways until the link is quiet.
        let mut to_b = VecTx::new();
        a.poll(T0, &mut to_b);
        let mut frames = to_b.frames;
        let mut toward_b = true;
        while !frames.is_empty() {
            let mut out = VecTx::new();
            let (rx, _) = if toward_b {
                (&mut b, &mut a)
            } else {
                (&mut a, &mut b)
            };
            for f in &frames {
                rx.receive(T0, f, &mut out);
            }
            rx.poll(T0, &mut out);
            frames = out.frames;
            toward_b = !toward_b;
        }
        assert!(b.stats().ipv4.reassembled >= 1);
        assert!(a.stats().ipv4.tx_fragments >= 3);
        match a.ping_recv(h).unwrap() {
            Some(PingEvent::Reply(r)) => {
                assert_eq!((r.from, r.seq, r.bytes), (PEER_IP, 1, 4008));
                assert!(r.rtt().is_some());
            }
            other => panic!("expected a reply, got {other:?}"),
        }
        assert_eq!(b.stats().ipv4.reassembly_bytes, 0);
    }

    #[test]
    fn no_route_without_gateway() {
        let mut s = stack();
        let h = s.udp_bind(1).unwrap();
        s.udp_send_to(
            h,
            SocketAddrV4::new(Ipv4Address::new(192, 0, 2, 1), 9),
            b"x",
        )
        .unwrap();
        let mut tx = VecTx::new();
        s.poll(T0, &mut tx);
        assert!(tx.frames.is_empty());
        assert_eq!(s.stats().ipv4.tx_no_route, 1);
    }
}
