//! The layers below the transport: configuration, ARP, counters and the
//! IPv4 transmit path (next hop, fragmentation, identification), with ICMP
//! errors and resets rate-limited. Each transport (ICMP, UDP, TCP, UD)
//! holds its own sockets and reaches the wire only through a `&mut Link`.

use core::net::{IpAddr, Ipv4Addr};
use std::collections::VecDeque;
use std::hash::BuildHasher;

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, ETHERNET_HEADER_LEN as ETH_LEN, EthernetAddress,
    EthernetFrame, EthernetProtocol, EthernetRepr, IPV4_HEADER_LEN as IP_LEN, Icmpv4DstUnreachable,
    Icmpv4Message, Icmpv4Packet, IpProtocol, Ipv4Packet,
};

use crate::error::Error;
use crate::iface::arp::{ArpCache, ArpConfig, Enqueue};
use crate::iface::ipv6_iface::Ipv6Iface;
use crate::phy::device::{Offloads, RxMeta, Tx, TxOffload};
use crate::shard::ShardId;
use crate::stats::{DropReason, Stats};
use crate::time::Instant;
use crate::wire::checksum;

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
    pub(crate) src: IpAddr,
    pub(crate) dst: IpAddr,
    pub(crate) protocol: IpProtocol,
    pub(crate) ttl: u8,
    /// Addressed to a broadcast address, or (IPv6) a multicast group
    /// (never answered with an ICMP error).
    pub(crate) broadcast: bool,
    /// The IPv4 (or IPv6) header as received, options included (the first
    /// fragment's for a reassembled datagram): what ICMP errors quote.
    pub(crate) header: &'a [u8],
    /// What came with the frame (for a reassembled datagram, the last
    /// fragment's stamp and role, with no checksum verdict).
    pub(crate) rx: RxMeta,
}

impl IpMeta<'_> {
    /// The ECN codepoint of the header (RFC 3168 5): the low two bits of
    /// IPv4's TOS byte or of IPv6's traffic class.
    pub(crate) fn ecn(&self) -> u8 {
        match (self.src, self.header) {
            (IpAddr::V4(_), [_, tos, ..]) => tos & 3,
            (IpAddr::V6(_), [_, low, ..]) => (low >> 4) & 3,
            _ => 0,
        }
    }

    /// The IPv4 source (the unspecified address for an IPv6 packet: only
    /// IPv4's own paths, ICMP, ask).
    pub(crate) fn src_v4(&self) -> Ipv4Addr {
        match self.src {
            IpAddr::V4(a) => a,
            IpAddr::V6(_) => Ipv4Addr::UNSPECIFIED,
        }
    }
}

/// What the layers below the transport are set up with: the part of the
/// stack's `Config` they read, copied out by the stack, so this layer does
/// not depend on the whole configuration (and on the transports' settings
/// it holds).
#[derive(Debug, Clone)]
pub(crate) struct LinkConfig {
    /// Our Ethernet address.
    pub(crate) mac: EthernetAddress,
    /// Our IPv4 address and subnet.
    pub(crate) ip: smoltcp::wire::Ipv4Cidr,
    /// IPv4 next hop for addresses outside the subnet.
    pub(crate) gateway: Option<Ipv4Addr>,
    /// IP MTU.
    pub(crate) mtu: usize,
    /// TTL of IPv4 packets we originate.
    pub(crate) ttl: u8,
    /// ARP cache limits.
    pub(crate) arp: ArpConfig,
    /// ICMP errors per second.
    pub(crate) icmp_error_rate: u32,
    /// Resets per second for segments of no connection.
    pub(crate) rst_rate: u32,
    /// A gratuitous ARP on the first poll.
    pub(crate) announce: bool,
    /// Answer echo requests to a broadcast address.
    pub(crate) answer_broadcast_ping: bool,
    /// Software segmentation limit (0: frame by frame).
    pub(crate) gso_max: usize,
    /// Key for IPv4 identification.
    pub(crate) secret: (u64, u64),
    /// Which of a host's per-queue stacks this is.
    pub(crate) shard: ShardId,
}

/// The layers below the transport: configuration, ARP, counters and the
/// IPv4 transmit path. Kept apart from the socket tables so a transport can
/// write a segment straight from its own buffers while `Link` emits it.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) cfg: LinkConfig,
    pub(crate) checksum: ChecksumCapabilities,
    /// What the port finishes for us (from its [`crate::phy::device::DeviceCaps`]).
    pub(crate) offloads: Offloads,
    arp: ArpCache,
    /// Our IPv6 addresses and neighbors.
    pub(crate) ip6: Ipv6Iface,
    pub(crate) stats: Stats,
    /// IPv4 identification counters, one per hash bucket ([`Link::next_ident`]).
    ip_idents: Box<[u16]>,
    ident_hash: foldhash::fast::FixedState,
    /// Key of IPv6 flow labels ([`Link::flow_hash`]).
    flow_hash: foldhash::fast::FixedState,
    announced: bool,
    pub(crate) icmp_errors: RateLimit,
    /// Resets for segments that belong to no connection (token bucket).
    pub(crate) rst_limit: RateLimit,
    arp_retry: Vec<Ipv4Addr>,
    /// An RFC 5227 probe for our address is owed to the next poll.
    probe_due: bool,
    /// Probing: the announcement waits (it would claim the address in other
    /// hosts' caches before we know it is ours).
    probing: bool,
    /// The first other host seen claiming our address (RFC 5227 conflict).
    conflict: Option<EthernetAddress>,
    /// Our subnet's directed broadcast address (`cfg.ip.broadcast()`,
    /// computed once: the receive path asks for every packet).
    subnet_broadcast: Option<Ipv4Addr>,
}

impl Link {
    /// The layers below the transport with `cfg`, and IPv6 (addresses,
    /// neighbors, routers) as `ip6` was set up.
    pub(crate) fn new(cfg: LinkConfig, ip6: Ipv6Iface) -> Self {
        let secret = cfg.secret;
        Link {
            arp: ArpCache::new(cfg.arp.clone()),
            ip6,
            icmp_errors: RateLimit::new(cfg.icmp_error_rate),
            rst_limit: RateLimit::new(cfg.rst_rate),
            announced: !cfg.announce,
            subnet_broadcast: cfg.ip.broadcast(),
            cfg,
            checksum: ChecksumCapabilities::default(),
            offloads: Offloads::default(),
            stats: Stats::default(),
            ip_idents: ident_buckets(secret),
            ident_hash: foldhash::fast::FixedState::with_seed(secret.0 ^ secret.1.rotate_left(32)),
            flow_hash: foldhash::fast::FixedState::with_seed(secret.1 ^ secret.0.rotate_left(17)),
            arp_retry: Vec::new(),
            probe_due: false,
            probing: false,
            conflict: None,
        }
    }

    /// ARP's counters and entries (for the stack's snapshot).
    pub(crate) fn arp(&self) -> &ArpCache {
        &self.arp
    }

    /// The gratuitous ARP on the first poll, and ARP retries that are due.
    pub(crate) fn poll<T: Tx>(&mut self, now: Instant, tx: &mut T) {
        if std::mem::take(&mut self.probe_due) {
            self.send_probe(tx);
        }
        if !self.announced && !self.probing {
            self.announced = true;
            let me = self.ip();
            self.send_arp(tx, ArpOperation::Request, EthernetAddress::BROADCAST, me);
            self.arp.stats.tx_gratuitous += 1;
        }
        let mut retry = std::mem::take(&mut self.arp_retry);
        self.arp.poll(now, &mut retry);
        for ip in retry.drain(..) {
            self.send_arp(tx, ArpOperation::Request, EthernetAddress::BROADCAST, ip);
            self.arp.stats.tx_requests += 1;
        }
        self.arp_retry = retry;
    }

    /// Owe an ARP probe for our address (RFC 5227 2.1.1) to the next poll.
    pub(crate) fn probe_address(&mut self) {
        self.probe_due = true;
        self.probing = true;
        // Our IPv6 addresses too (RFC 4862 duplicate address detection).
        self.ip6.dad_due = self.ip6.enabled();
        self.ip6.poll_due = Instant::ZERO;
    }

    /// Probing is over: the announcement may go.
    pub(crate) fn end_probing(&mut self) {
        self.probing = false;
    }

    /// Whether a probe is owed.
    pub(crate) fn probe_due(&self) -> bool {
        self.probe_due
    }

    /// The MAC of another host seen using our address, if any.
    pub(crate) fn conflict(&self) -> Option<EthernetAddress> {
        self.conflict
    }

    /// An ARP probe: a request for our address from sender 0.0.0.0, which
    /// a host holding the address answers without learning us.
    fn send_probe<T: Tx>(&mut self, tx: &mut T) {
        let repr = ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Request,
            source_hardware_addr: self.cfg.mac,
            source_protocol_addr: Ipv4Addr::UNSPECIFIED,
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: self.ip(),
        };
        let src = self.cfg.mac;
        let len = ETH_LEN + repr.buffer_len();
        let ok = tx.send(len, |buf| {
            write_eth(buf, src, EthernetAddress::BROADCAST, EthernetProtocol::Arp);
            repr.emit(&mut ArpPacket::new_unchecked(&mut buf[ETH_LEN..]));
        });
        self.count_tx(ok, len);
        self.arp.stats.tx_requests += 1;
    }

    /// Whether the first poll still owes the gratuitous ARP.
    pub(crate) fn announce_due(&self) -> bool {
        !self.announced && !self.probing
    }

    /// An ARP packet: learn the sender (RFC 826, with the refusals
    /// ARCHITECTURE.md lists), answer requests for us (unless the frame is
    /// a sibling shard's copy, a `replica`: learn, never answer), and flush
    /// what waited on the address.
    pub(crate) fn receive_arp<T: Tx>(
        &mut self,
        now: Instant,
        payload: &[u8],
        replica: bool,
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
            ArpOperation::Request => self.arp.stats.rx_requests += 1,
            ArpOperation::Reply => self.arp.stats.rx_replies += 1,
            _ => return Err(DropReason::ArpMalformed),
        }
        if !sha.is_unicast() {
            return Err(DropReason::ArpMalformed);
        }
        let me = self.ip();
        if spa == me {
            // Someone else claims our address: never learn it. (On a host
            // with several shards, our own MAC is a sibling's answer.)
            let sibling = sha == self.cfg.mac && self.cfg.shard.count > 1;
            if !sibling && self.conflict.is_none() {
                self.conflict = Some(sha);
                tracing::warn!("address conflict: {me} is also used by {sha} (RFC 5227)");
            }
            return Err(DropReason::ArpConflict);
        }
        let for_us = tpa == me;
        let gratuitous = spa == tpa;
        if gratuitous {
            self.arp.stats.rx_gratuitous += 1;
        }
        let learnable = !spa.is_unspecified() && !spa.is_broadcast() && !spa.is_multicast();
        let known = self.arp.knows(spa);
        if learnable {
            // RFC 826: refresh a known sender; add it when it asks for us.
            // A reply to us adds an entry only when it answers our request
            // (the cache knows), so an unsolicited reply cannot plant one;
            // a replica learns what its sibling asked for.
            let adds = for_us && (operation == ArpOperation::Request || replica);
            let waiting = (self.arp)
                .learn(now, spa, sha, adds)
                .map_err(|_| DropReason::ArpSpoofRefused)?;
            self.flush_waiting(sha, waiting, tx);
        }
        // While probing the address is not ours yet (RFC 5227 2.1.1): a
        // host that resolved us then would send to a stack whose apps have
        // not started (a SYN answered with a reset).
        if for_us && operation == ArpOperation::Request && !replica && !self.probing {
            self.send_arp(tx, ArpOperation::Reply, sha, spa);
            self.arp.stats.tx_replies += 1;
        }
        if for_us || (learnable && known) {
            Ok(())
        } else {
            Err(DropReason::ArpNotForUs)
        }
    }

    /// Our subnet's directed broadcast address, if it has one.
    pub(crate) fn subnet_broadcast(&self) -> Option<Ipv4Addr> {
        self.subnet_broadcast
    }

    /// Our IPv4 address.
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
        let error = (Icmpv4Message::DstUnreachable, u8::from(reason));
        if self.send_error(now, tx, error, meta.src_v4(), meta.header, body) {
            self.stats.icmp.tx_dest_unreachable += 1;
        }
    }

    /// An ICMP error of `(type, code)` to `to` about a datagram whose
    /// header (options on) was `header` and whose payload starts `body`:
    /// the header and the payload's first 8 bytes quoted (RFC 792),
    /// rate-limited. Whether it left.
    pub(crate) fn send_error<T: Tx>(
        &mut self,
        now: Instant,
        tx: &mut T,
        (kind, code): (Icmpv4Message, u8),
        to: Ipv4Addr,
        header: &[u8],
        body: &[u8],
    ) -> bool {
        if !self.icmp_errors.take(now) {
            self.stats.icmp.rate_limited += 1;
            return false;
        }
        let data = &body[..body.len().min(8)];
        let quote_len = header.len() + data.len();
        let sent = self.send_ip(now, tx, to, IpProtocol::Icmp, 8 + quote_len, |buf| {
            let mut p = Icmpv4Packet::new_unchecked(&mut *buf);
            p.set_msg_type(kind);
            p.set_msg_code(code);
            // Checksum (filled below) and the unused word.
            buf[2..8].fill(0);
            let (hdr, rest) = buf[8..].split_at_mut(header.len());
            hdr.copy_from_slice(header);
            rest[..data.len()].copy_from_slice(data);
            Icmpv4Packet::new_unchecked(buf).fill_checksum();
        });
        sent.is_ok()
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

    /// Whether the next hop toward `dst` is being resolved (ARP or
    /// neighbor discovery asked, and a packet waits for the answer): a
    /// sender that can hold its packets (RC's requester, as an RNIC's QP
    /// waits for its address handle) sends nothing more until it is.
    pub(crate) fn resolving(&self, dst: IpAddr) -> bool {
        match dst {
            IpAddr::V4(d) => self.next_hop(d).is_some_and(|h| self.arp.asking(h)),
            IpAddr::V6(d) => (self.ip6.next_hop(&d)).is_some_and(|h| self.ip6.pending.asked(&h)),
        }
    }

    /// The next hop for `dst`, or `None` when there is no route.
    pub(crate) fn next_hop(&self, dst: Ipv4Addr) -> Option<Ipv4Addr> {
        if self.cfg.ip.contains_addr(&dst) {
            Some(dst)
        } else {
            self.cfg.gateway
        }
    }

    /// The keyed hash of IPv6 flow labels (RFC 6437): from the stack's
    /// secret, apart from the IPv4 identification's.
    pub(crate) fn flow_hash(&self) -> foldhash::fast::FixedState {
        self.flow_hash.clone()
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
        self.send_ip_tos(now, tx, dst, protocol, 0, payload_len, fill)
    }

    /// [`send_ip`](Self::send_ip) with `tos` in the header's TOS byte
    /// (DSCP and ECN, RFC 2474 and RFC 3168: TCP's ECT(0) on new data).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send_ip_tos<T: Tx, F: FnOnce(&mut [u8])>(
        &mut self,
        now: Instant,
        tx: &mut T,
        dst: Ipv4Addr,
        protocol: IpProtocol,
        tos: u8,
        payload_len: usize,
        fill: F,
    ) -> Result<(), Error> {
        self.send_ip_with_options(now, tx, dst, protocol, tos, &[], payload_len, fill)
    }

    /// [`send_ip_tos`](Self::send_ip_tos) with IPv4 `options` (a multiple of 4
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
        tos: u8,
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
            return self.send_packet(now, tx, dst, protocol, tos, options, payload_len, |ip| {
                fill(&mut ip[hl..]);
            });
        }
        let (hop, mac) = self.resolve(now, dst)?;
        let header = self.header(dst, protocol, tos);
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
        self.send_packet(now, tx, dst, protocol, 0, &[], payload_len, fill)
    }

    /// Send one unfragmented TCP packet the port finishes (its checksums,
    /// and with `tso_segsz` its segmentation: then the packet may exceed
    /// the MTU up to the port's `tso_max`). `fill` sees the whole packet,
    /// header written, and must leave the pseudo-header sum in the TCP
    /// checksum field. Returns `Ok(false)` when the next hop's MAC is not
    /// known yet: nothing was built, and the caller sends the packet the
    /// ordinary way (it waits for ARP there).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send_tcp_offloaded<T: Tx, F: FnOnce(&mut [u8])>(
        &mut self,
        now: Instant,
        tx: &mut T,
        dst: Ipv4Addr,
        tos: u8,
        tcp_header_len: usize,
        payload_len: usize,
        tso_segsz: u16,
        fill: F,
    ) -> Result<bool, Error> {
        let len = IP_LEN + payload_len;
        let limit = if tso_segsz > 0 {
            self.offloads.tso_max.min(usize::from(u16::MAX))
        } else {
            self.cfg.mtu
        };
        if len > limit {
            return Err(Error::TooLarge);
        }
        let (_, Some(mac)) = self.resolve(now, dst)? else {
            return Ok(false);
        };
        let header = self.header(dst, IpProtocol::Tcp, tos);
        let src = self.cfg.mac;
        let offload = TxOffload {
            l2_len: ETH_LEN as u8,
            l3_len: IP_LEN as u8,
            l4_len: tcp_header_len as u8,
            tso_segsz,
        };
        let ok = tx.send_offloaded(ETH_LEN + len, offload, |buf| {
            write_eth(buf, src, mac, EthernetProtocol::Ipv4);
            let ip = &mut buf[ETH_LEN..];
            header.write(ip, &[], payload_len, 0, false);
            fill(ip);
        });
        self.count_tx(ok, ETH_LEN + len);
        if !ok {
            return Err(Error::QueueFull);
        }
        self.stats.ipv4.tx_packets += 1;
        self.stats.ipv4.tx_bytes += len as u64;
        Ok(true)
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
        tos: u8,
        options: &[u8],
        payload_len: usize,
        fill: F,
    ) -> Result<(), Error> {
        let len = IP_LEN + options.len() + payload_len;
        if len > self.cfg.mtu {
            return Err(Error::TooLarge);
        }
        let (hop, mac) = self.resolve(now, dst)?;
        let header = self.header(dst, protocol, tos);
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
        if dst.is_broadcast() || Some(dst) == self.subnet_broadcast {
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
    fn header(&mut self, dst: Ipv4Addr, protocol: IpProtocol, tos: u8) -> IpHeader {
        IpHeader {
            src: self.ip(),
            dst,
            protocol,
            tos,
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
pub(crate) struct IpHeader {
    pub(crate) src: Ipv4Addr,
    pub(crate) dst: Ipv4Addr,
    pub(crate) protocol: IpProtocol,
    /// The TOS byte: DSCP (upper six bits) and ECN (lower two).
    pub(crate) tos: u8,
    pub(crate) ttl: u8,
    pub(crate) ident: u16,
    pub(crate) dont_frag: bool,
}

impl IpHeader {
    /// Write the header, `options` after the fixed 20 bytes, for a packet
    /// (or fragment) carrying `payload_len` bytes.
    pub(crate) fn write(
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
        p.set_dscp(self.tos >> 2);
        p.set_ecn(self.tos & 3);
        p.set_total_len((hl + payload_len) as u16);
        p.set_ident(self.ident);
        p.clear_flags();
        let df = self.dont_frag && !more && frag_offset == 0;
        p.set_dont_frag(df);
        p.set_more_frags(more);
        p.set_frag_offset(frag_offset as u16);
        p.set_hop_limit(self.ttl);
        p.set_next_header(self.protocol);
        p.set_src_addr(self.src);
        p.set_dst_addr(self.dst);
        // smoltcp's `fill_checksum`, summed from the values written (as
        // the TCP header is: reading back the words the small stores just
        // wrote stalls on the store buffer), options from their slice.
        let flags_frag = (u16::from(df) << 14) | (u16::from(more) << 13);
        let sum = u64::from(0x4000u16 | ((hl as u16 / 4) << 8) | u16::from(self.tos))
            + u64::from((hl + payload_len) as u16)
            + u64::from(self.ident)
            + u64::from(flags_frag | (frag_offset as u16 / 8))
            + u64::from((u16::from(self.ttl) << 8) | u16::from(u8::from(self.protocol)))
            + checksum::words(u32::from(self.src))
            + checksum::words(u32::from(self.dst));
        let options_sum = if options.is_empty() {
            0
        } else {
            u64::from(checksum::fold(checksum::sum(0, options)))
        };
        p.set_checksum(!checksum::fold(sum + options_sum));
    }
}

/// Whether an IPv4 header (options included) sums to all ones: smoltcp's
/// `Ipv4Packet::verify_checksum`, with the word-wide sum.
pub(crate) fn ipv4_checksum_ok(header: &[u8]) -> bool {
    ipv4_header_sum(header) == 0xffff
}

/// The folded one's-complement sum of an IPv4 header (what smoltcp's
/// `checksum::data` gives): `checksum::sum`, unrolled for the usual
/// 20 bytes.
fn ipv4_header_sum(header: &[u8]) -> u16 {
    if let Ok(h) = <&[u8; IP_LEN]>::try_from(header) {
        let w = |i: usize| u64::from(u32::from_ne_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]));
        return u16::from_be(checksum::fold(w(0) + w(4) + w(8) + w(12) + w(16)));
    }
    checksum::fold(checksum::sum(0, header))
}

pub(crate) fn write_eth(
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

/// Buckets of IPv4 identification counters.
const IP_ID_BUCKETS: usize = 2048;

/// The identification counters, each starting at a keyed offset.
fn ident_buckets(secret: (u64, u64)) -> Box<[u16]> {
    let seed = foldhash::fast::FixedState::with_seed(secret.1);
    (0..IP_ID_BUCKETS)
        .map(|i| seed.hash_one(i) as u16)
        .collect()
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Headers written with the word-wide sum carry smoltcp's checksum,
        /// and the receive check agrees with smoltcp's on any header.
        #[test]
        fn ipv4_header_checksums_are_smoltcps(
            src in any::<u32>(),
            dst in any::<u32>(),
            ttl in any::<u8>(),
            tos in any::<u8>(),
            ident in any::<u16>(),
            proto in any::<u8>(),
            words in 0usize..=10,
            opt in any::<[u8; 40]>(),
            payload_len in 0usize..2000,
            frag in (0usize..8000, any::<bool>()),
            dont_frag in any::<bool>(),
            flip in proptest::option::of((0usize..60, 0u8..8)),
        ) {
            let header = IpHeader {
                src: Ipv4Addr::from(src),
                dst: Ipv4Addr::from(dst),
                protocol: IpProtocol::from(proto),
                tos,
                ttl,
                ident,
                dont_frag,
            };
            let hl = IP_LEN + 4 * words;
            let mut ours = vec![0u8; hl];
            header.write(&mut ours, &opt[..4 * words], payload_len, frag.0 & !7, frag.1);
            let mut theirs = ours.clone();
            Ipv4Packet::new_unchecked(&mut theirs[..]).fill_checksum();
            prop_assert_eq!(&ours, &theirs);
            prop_assert!(ipv4_checksum_ok(&ours));
            if let Some((i, bit)) = flip {
                ours[1 + i % (hl - 1)] ^= 1 << bit;
            }
            prop_assert_eq!(
                ipv4_checksum_ok(&ours),
                Ipv4Packet::new_unchecked(&ours[..]).verify_checksum()
            );
        }
    }

    #[test]
    fn the_subnet_broadcast_is_the_configs() {
        let stack = crate::Stack::new(crate::sim::host_config(1));
        let link = &stack.link;
        assert_eq!(link.subnet_broadcast(), link.cfg.ip.broadcast());
        assert!(link.subnet_broadcast().is_some());
    }
}
