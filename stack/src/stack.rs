//! The engine: one `Stack` per port queue, driven by `receive` and `poll`.
//!
//! Receive path: Ethernet -> ARP | IPv4 (validate, reassemble) -> ICMP |
//! UDP (RoCEv2 to UD) | TCP. Every frame ends accepted or dropped with one
//! [`DropReason`]. Transmit path: sockets queue work; [`Stack::poll`] emits
//! it through a [`Tx`], resolving next hops with ARP and fragmenting above
//! the MTU. Each layer keeps its own sockets ([`crate::iface::icmp`],
//! [`crate::socket::udp`], [`crate::socket::tcp`], [`crate::socket::ud`]) and reaches the wire
//! through the crate-private `link` module (ARP, IPv4 transmit, rate
//! limits); this file wires them together and is the app API's front door.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use smoltcp::wire::{EthernetAddress, Icmpv4DstUnreachable, Icmpv4Message, IpProtocol};
use tracing::trace;

use crate::events::Event;
use crate::iface::addr::{Addr, AddrRef};
use crate::iface::frag::{Reassembled, Reassembler};
use crate::iface::icmp::{IcmpOutcome, PingTable};
use crate::iface::input::{self, IpIn};
use crate::iface::ipv6::Icmpv6Error;
use crate::iface::ipv6_iface::Ipv6Iface;
use crate::iface::link::{IpMeta, Link, LinkConfig};
use crate::phy::device::{Received, RxMeta, Tx};
use crate::socket::ping::Ping;
use crate::socket::rc::{Rc, RcRef, RcTable};
use crate::socket::tcp::{Tcp, TcpRef, TcpTable};
use crate::socket::ud::{Ud, UdTable};
use crate::socket::udp::{Udp, UdpRef, UdpTable};
use crate::stats::{DropReason, Stats};
use crate::time::{Instant, earliest};

pub use crate::config::Config;
pub use crate::error::Error;

/// How much of a datagram whose reassembly timed out its ICMP error may
/// quote: what fits IPv6's minimum MTU after the error's headers (IPv4's
/// quotes 8 bytes of it).
const FRAG_ERROR_QUOTE: usize = 1184;

/// One instance of the protocol engine.
#[derive(Debug)]
pub struct Stack {
    /// What the stack was built with ([`Stack::config`]); each layer holds
    /// the part it reads.
    cfg: Config,
    pub(crate) link: Link,
    frags: Reassembler,
    pub(crate) pings: PingTable,
    pub(crate) udp: UdpTable,
    pub(crate) tcp: TcpTable,
    pub(crate) ud: UdTable,
    pub(crate) rc: RcTable,
}

impl Stack {
    /// A stack with the address, limits and secret of `cfg`; the TCP MSS is
    /// capped to fit the MTU (`mtu - 40`). With [`Config::announce`] the
    /// first [`poll`](Self::poll) sends a gratuitous ARP for our address.
    pub fn new(cfg: Config) -> Self {
        let mut cfg_tcp = cfg.tcp.clone();
        cfg_tcp.mss = cfg_tcp.mss.min(cfg.mtu.saturating_sub(40)).max(64);
        let secret = cfg.secret;
        let link = LinkConfig {
            mac: cfg.mac,
            ip: cfg.ip,
            gateway: cfg.gateway,
            mtu: cfg.mtu,
            ttl: cfg.ttl,
            arp: cfg.arp.clone(),
            icmp_error_rate: cfg.icmp_error_rate,
            rst_rate: cfg.rst_rate,
            announce: cfg.announce,
            answer_broadcast_ping: cfg.answer_broadcast_ping,
            gso_max: cfg.gso_max,
            secret,
            shard: cfg.shard,
        };
        let ip6 = Ipv6Iface::new(cfg.mac, &cfg.ipv6, cfg.ipv6_auto, secret.1)
            .routing(cfg.accept_ra, cfg.gateway6);
        Stack {
            frags: Reassembler::new(cfg.frag.clone()),
            link: Link::new(link, ip6),
            pings: PingTable::default(),
            udp: UdpTable::new(cfg.udp_rx_queue_bytes),
            tcp: TcpTable::new(cfg_tcp, secret),
            ud: UdTable::default(),
            rc: RcTable::new(secret),
            cfg,
        }
    }

    /// The configuration the stack was built with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Our IPv4 address.
    pub fn ip(&self) -> Ipv4Addr {
        self.link.ip()
    }

    /// Whether IPv6 is on (an IPv6 address was configured).
    pub fn ipv6_on(&self) -> bool {
        self.link.ip6.enabled()
    }

    /// Our IPv6 addresses, the link-local one first (none with IPv6 off).
    pub fn ipv6_addrs(&self) -> Vec<Ipv6Addr> {
        self.link.ip6.addrs().collect()
    }

    /// Whether `ip` is one of our addresses (either family).
    pub fn owns(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(a) => a == self.link.ip(),
            IpAddr::V6(a) => self.link.ip6.is_ours(&a),
        }
    }

    /// Our Ethernet address.
    pub fn mac(&self) -> EthernetAddress {
        self.link.cfg.mac
    }

    /// Our address on the link: ARP neighbours, duplicate-address probing.
    pub fn addr(&mut self) -> Addr<'_> {
        Addr::new(&mut self.link)
    }

    /// Our address on the link, read-only: neighbours, a conflict seen.
    pub fn addr_ref(&self) -> AddrRef<'_> {
        AddrRef::new(&self.link)
    }

    /// A copy of every counter, gauges filled in.
    pub fn stats(&self) -> Stats {
        let mut s = self.link.stats.clone();
        s.arp = self.link.arp().stats();
        s.ipv6.neighbors = self.link.ip6.neighbors.len() as u64;
        s.ipv6.routers =
            (self.link.ip6.routers.len() + usize::from(self.link.ip6.gateway.is_some())) as u64;
        s.ipv6.slaac_addresses = self.link.ip6.slaac.len() as u64;
        s.ipv6.pending_packets = self.link.ip6.pending.packets() as u64;
        s.ipv6.pending_dropped = self.link.ip6.pending.dropped;
        s.ipv6.unresolved = self.link.ip6.pending.unresolved;
        s.ipv4.reassembly_bytes = self.frags.mem() as u64;
        s.ipv4.reassembly_bytes_hwm = self.frags.mem_hwm as u64;
        s.ipv4.reassembly_timeouts = self.frags.timeouts;
        s.ipv4.reassembly_evicted = self.frags.evicted;
        s.udp.sockets = self.udp.count() as u64;
        s.tcp = self.tcp.stats();
        s.ud.qps = self.ud.count() as u64;
        s.rc = self.rc.stats();
        s
    }

    /// Readiness events since the last call, appended to `out`: one per
    /// socket that became readable, writable, connected, closed or errored
    /// (see [`crate::events`]).
    pub fn drain_events(&mut self, out: &mut Vec<Event>) {
        self.tcp.drain_events(out);
        self.udp.drain_events(out);
        self.pings.drain_events(out);
        self.rc.drain_events(out);
    }

    /// Whether readiness events wait to be drained.
    pub fn has_events(&self) -> bool {
        self.tcp.has_events()
            || self.udp.has_events()
            || self.pings.has_events()
            || self.rc.has_events()
    }

    // ---------------------------------------------------------------- receive

    /// Use a port's offloads from now on (a [`crate::node::Port`] sets its
    /// device's on every step): checksums the port fills and verifies, TSO,
    /// merged frames above the MTU.
    pub fn set_offloads(&mut self, offloads: crate::phy::device::Offloads) {
        self.link.offloads = offloads;
    }

    /// The offloads in use.
    pub fn offloads(&self) -> crate::phy::device::Offloads {
        self.link.offloads
    }

    /// Process one received frame, with what came with it (`meta`: the
    /// port's checksum verdict and stamp, the frame's role among shards;
    /// `RxMeta::default()` for a plain frame owned here). Replies (ARP,
    /// echo, ICMP errors, resets) are written to `tx` at once.
    /// [`Received::PassOn`] says a [`RxRole::MayPass`](crate::RxRole::MayPass) segment was left
    /// for the next shard.
    pub fn receive<T: Tx>(
        &mut self,
        now: Instant,
        frame: &[u8],
        meta: RxMeta,
        tx: &mut T,
    ) -> Received {
        self.link.stats.eth.rx_frames += 1;
        self.link.stats.eth.rx_bytes += frame.len() as u64;
        match self.process_ethernet(now, frame, meta, tx) {
            Ok(received) => {
                self.link.stats.eth.rx_accepted += 1;
                received
            }
            Err(reason) => {
                trace!(reason = reason.name(), len = frame.len(), "drop");
                self.link.stats.drops.inc(reason);
                Received::Taken
            }
        }
    }

    fn process_ethernet<T: Tx>(
        &mut self,
        now: Instant,
        frame: &[u8],
        rx: RxMeta,
        tx: &mut T,
    ) -> Result<Received, DropReason> {
        match input::ethernet(&mut self.link, &mut self.frags, now, frame, rx, tx)? {
            IpIn::Done => Ok(Received::Taken),
            IpIn::TooBig(t) => match t.error {
                Some(e) => (self.tcp).icmp_error(now, t.local_port, t.remote, t.seq, e),
                None => (self.tcp).frag_needed(now, t.local_port, t.remote, t.seq, t.mtu),
            }
            .map(|()| Received::Taken),
            IpIn::Datagram { meta, body, packet } => {
                self.process_transport(now, meta, body, Some(packet), tx)
            }
            IpIn::Reassembled(whole) => {
                self.process_transport(now, whole.meta(), &whole.datagram.payload, None, tx)
            }
        }
    }

    fn process_transport<T: Tx>(
        &mut self,
        now: Instant,
        meta: IpMeta<'_>,
        body: &[u8],
        // The whole IPv4 packet, header included (not for reassembled ones).
        ip: Option<&[u8]>,
        tx: &mut T,
    ) -> Result<Received, DropReason> {
        let done = match meta.protocol {
            IpProtocol::Icmp => match self.pings.process(&mut self.link, now, meta, body, tx)? {
                IcmpOutcome::Done => Ok(()),
                IcmpOutcome::TcpFragNeeded {
                    local_port,
                    remote,
                    seq,
                    mtu,
                } => self
                    .tcp
                    .frag_needed(now, local_port, remote.into(), seq, mtu),
                IcmpOutcome::TcpError {
                    local_port,
                    remote,
                    seq,
                    error,
                } => (self.tcp).icmp_error(now, local_port, remote.into(), seq, error),
            },
            IpProtocol::Icmpv6 => self.pings.process6(&mut self.link, now, meta, body),
            IpProtocol::Udp => match self.udp.process(&mut self.link, now, meta, body, tx)? {
                None => Ok(()),
                Some(roce) if crate::socket::ud::is_rc(roce) => {
                    let ip = crate::socket::ud::roce_packet(ip, roce)?;
                    match self.rc.process(now, ip, roce) {
                        // An RC opcode sent to a UD QP.
                        Err(DropReason::UdUnknownQpn)
                            if self.ud.has_qpn(
                                crate::wire::roce::BthPacket::new_unchecked(roce).dest_qp(),
                            ) =>
                        {
                            Err(DropReason::UdBadOpcode)
                        }
                        r => r,
                    }
                }
                Some(roce) => self
                    .ud
                    .process_roce(&mut self.link, now, meta.rx.at, ip, roce),
            },
            IpProtocol::Tcp => return self.tcp.process(&mut self.link, now, meta, body, tx),
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
        };
        done.map(|()| Received::Taken)
    }

    // ------------------------------------------------------------------- poll

    /// Run timers and emit what sockets queued.
    pub fn poll<T: Tx>(&mut self, now: Instant, tx: &mut T) {
        self.link.poll(now, tx);
        crate::iface::ipv6::poll(&mut self.link, now, tx);
        for owed in self.frags.poll(now, FRAG_ERROR_QUOTE) {
            self.reassembly_timed_out(now, tx, &owed);
        }
        self.pings.emit(&mut self.link, now, tx);
        self.udp.emit(&mut self.link, now, tx);
        self.tcp.poll(&mut self.link, now, tx);
        self.ud.emit(&mut self.link, now, tx);
        self.rc.poll(&mut self.link, now, tx);
    }

    /// ICMP time exceeded, fragment reassembly time exceeded (RFC 792 type
    /// 11 code 1; RFC 8200 §4.5, ICMPv6 type 3 code 1), to the sender of a
    /// datagram whose first fragment came and whose rest did not in time.
    fn reassembly_timed_out<T: Tx>(&mut self, now: Instant, tx: &mut T, owed: &Reassembled) {
        let link = &mut self.link;
        match (owed.key.src, owed.key.dst) {
            (IpAddr::V4(to), IpAddr::V4(_)) => {
                let error = (Icmpv4Message::TimeExceeded, 1);
                if link.send_error(now, tx, error, to, &owed.header, &owed.payload) {
                    link.stats.icmp.tx_time_exceeded += 1;
                }
            }
            (IpAddr::V6(to), IpAddr::V6(dst)) => {
                let error = Icmpv6Error::REASSEMBLY_TIME_EXCEEDED;
                let (head, tail) = (&owed.header[..], &owed.payload[..]);
                let sent =
                    crate::iface::ipv6::send_error(link, now, tx, (to, dst), error, head, tail);
                link.stats.ipv6.tx_time_exceeded += u64::from(sent);
            }
            _ => {}
        }
    }

    /// The next time [`poll`](Self::poll) has work (may be in the past: poll now).
    pub fn poll_at(&self) -> Option<Instant> {
        if self.link.announce_due()
            || self.link.probe_due()
            || self.has_events()
            || self.pings.has_work()
            || self.udp.has_work()
            || self.tcp.has_work()
            || self.ud.has_work()
            || self.rc.has_work()
        {
            return Some(Instant::ZERO);
        }
        earliest(
            earliest(
                earliest(self.link.arp().poll_at(), self.frags.poll_at()),
                crate::iface::ipv6::poll_at(&self.link),
            ),
            earliest(self.tcp.next_timer(), self.rc.next_timer()),
        )
    }

    // ------------------------------------------------------------ sockets

    /// The TCP sockets: listen, accept, connect, send, receive, close.
    pub fn tcp(&mut self) -> Tcp<'_> {
        let cfg = &self.link.cfg;
        let (v4, shard) = ((cfg.ip, cfg.gateway), cfg.shard);
        Tcp::new(&mut self.tcp, v4, &self.link.ip6, shard)
    }

    /// The TCP sockets, read-only: status, peek, telemetry.
    pub fn tcp_ref(&self) -> TcpRef<'_> {
        TcpRef::new(&self.tcp)
    }

    /// The UDP sockets: bind, connect, send and receive datagrams.
    pub fn udp(&mut self) -> Udp<'_> {
        Udp::new(&mut self.udp, self.cfg.udp_tx_queue_bytes, &self.link.ip6)
    }

    /// The UDP sockets, read-only: pending datagrams, queued bytes, peek.
    pub fn udp_ref(&self) -> UdpRef<'_> {
        UdpRef::new(&self.udp, self.cfg.udp_tx_queue_bytes)
    }

    /// The ICMP echo (ping) sockets.
    pub fn ping(&mut self) -> Ping<'_> {
        Ping::new(&mut self.pings)
    }

    /// The RoCEv2 UD queue pairs: a [`UdTransport`](crate::socket::ud::UdTransport).
    pub fn ud(&mut self) -> Ud<'_> {
        Ud::new(&mut self.ud, &self.rc, self.link.cfg.mtu)
    }

    /// Largest UD message on this stack's link: one packet within the IP
    /// MTU, with room for immediate data, rounded down to a multiple of 4.
    pub fn ud_max_msg(&self) -> usize {
        crate::socket::ud::max_msg(self.link.cfg.mtu)
    }

    /// The RC queue pairs and memory regions.
    pub fn rc(&mut self) -> Rc<'_> {
        Rc::new(&mut self.rc, &self.ud, self.link.cfg.mtu)
    }

    /// The RC queue pairs and memory regions, read-only.
    pub fn rc_ref(&self) -> RcRef<'_> {
        RcRef::new(&self.rc)
    }
}

/// Seconds as a `Duration` (for config literals).
pub const fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::iface::icmp::PingEvent;
    use crate::iface::link::{IpHeader, write_eth};
    use crate::phy::device::VecTx;
    use core::net::SocketAddrV4;
    use smoltcp::phy::ChecksumCapabilities;
    use smoltcp::wire::Ipv4Address;
    use smoltcp::wire::{
        ArpOperation, ArpPacket, ArpRepr, EthernetRepr, Icmpv4Message, Icmpv4Packet, Icmpv4Repr,
        IpAddress, Ipv4Cidr, UdpPacket, UdpRepr,
    };
    use smoltcp::wire::{
        ETHERNET_HEADER_LEN as ETH_LEN, EthernetFrame, EthernetProtocol, IPV4_HEADER_LEN as IP_LEN,
        Ipv4Packet,
    };

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
            tos: 0,
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
        s.receive(T0, frame, crate::RxMeta::default(), &mut tx);
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
        assert_eq!(s.addr_ref().neighbours(T0), vec![(PEER_IP, PEER_MAC)]);
        assert_eq!(s.stats().arp.tx_replies, 1);
    }

    #[test]
    fn arp_for_other_hosts_is_dropped_and_not_learned() {
        let mut s = stack();
        let other = Ipv4Addr::new(10, 0, 0, 3);
        let (out, drop) = feed(&mut s, &arp(ArpOperation::Request, PEER_IP, other));
        assert!(out.is_empty());
        assert_eq!(drop, Some(DropReason::ArpNotForUs));
        assert!(s.addr_ref().neighbours(T0).is_empty());
        // Someone claiming our address is never learned.
        let (_, drop) = feed(&mut s, &arp(ArpOperation::Reply, OUR_IP, OUR_IP));
        assert_eq!(drop, Some(DropReason::ArpConflict));
    }

    #[test]
    fn a_probe_answered_by_the_holder_of_our_address_is_a_conflict() {
        // The newcomer, configured with the address `holder` already uses.
        let mut newcomer = Stack::new(Config::new(PEER_MAC, Ipv4Cidr::new(OUR_IP, 24)));
        let mut holder = stack();
        newcomer.addr().probe();
        assert_eq!(newcomer.poll_at(), Some(Instant::ZERO));
        let mut tx = VecTx::new();
        newcomer.poll(T0, &mut tx);
        // Only the probe: the announcement waits for the end of probing.
        assert_eq!(tx.frames.len(), 1);
        let probe = tx.frames.pop().expect("a probe");
        let f = EthernetFrame::new_checked(&probe[..]).unwrap();
        assert!(f.dst_addr().is_broadcast());
        let a = ArpPacket::new_checked(f.payload()).unwrap();
        assert_eq!(a.source_protocol_addr(), &[0u8; 4][..]);
        assert_eq!(a.target_protocol_addr(), &OUR_IP.octets()[..]);
        let (answer, _) = feed(&mut holder, &probe);
        assert_eq!(answer.len(), 1, "the holder answers the probe");
        // The holder did not learn the prober's 0.0.0.0.
        assert!(holder.addr_ref().neighbours(T0).is_empty());
        assert_eq!(newcomer.addr_ref().conflict(), None);
        let (_, drop) = feed(&mut newcomer, &answer[0]);
        assert_eq!(drop, Some(DropReason::ArpConflict));
        assert_eq!(newcomer.addr_ref().conflict(), Some(OUR_MAC));
        // Probing over: the announcement leaves.
        newcomer.addr().end_probing();
        newcomer.poll(T0, &mut tx);
        assert_eq!(tx.frames.len(), 1);
    }

    #[test]
    fn a_probing_stack_does_not_answer_for_its_address() {
        let mut s = stack();
        s.addr().probe();
        let mut tx = VecTx::new();
        s.poll(T0, &mut tx);
        let (answer, _) = feed(&mut s, &arp(ArpOperation::Request, PEER_IP, OUR_IP));
        assert!(answer.is_empty(), "answered while probing (RFC 5227 2.1.1)");
        s.addr().end_probing();
        let (answer, _) = feed(&mut s, &arp(ArpOperation::Request, PEER_IP, OUR_IP));
        assert_eq!(answer.len(), 1, "answers once probing is over");
    }

    #[test]
    fn gratuitous_arp_updates_known_entry_only() {
        let mut s = stack();
        let (_, drop) = feed(&mut s, &arp(ArpOperation::Request, PEER_IP, PEER_IP));
        assert_eq!(drop, Some(DropReason::ArpNotForUs));
        assert!(s.addr_ref().neighbours(T0).is_empty());
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
        let h = s.udp().bind(7000).unwrap();
        assert_eq!(s.udp().bind(7000), Err(Error::AddrInUse));
        let frame = eth(
            OUR_MAC,
            EthernetProtocol::Ipv4,
            &ipv4(PEER_IP, OUR_IP, IpProtocol::Udp, &udp(5555, 7000, b"ping!")),
        );
        assert_eq!(feed(&mut s, &frame).1, None);
        let mut buf = [0u8; 64];
        let (n, from) = s.udp().recv_from(h, &mut buf).unwrap().unwrap();
        assert_eq!(
            (&buf[..n], from),
            (&b"ping!"[..], SocketAddrV4::new(PEER_IP, 5555).into())
        );
        assert_eq!(s.udp().recv_from(h, &mut buf).unwrap(), None);

        s.udp().send_to(h, from, b"pong!").unwrap();
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

        let e = s.udp().bind(0).unwrap();
        assert!(s.udp_ref().local_port(e).unwrap() >= 49_152);
        s.udp().close(h).unwrap();
        assert_eq!(s.udp().recv_from(h, &mut buf), Err(Error::InvalidHandle));
        assert_eq!(feed(&mut s, &frame).1, Some(DropReason::UdpNoSocket));
    }

    /// A queue larger than one poll's budget leaves over several polls,
    /// whole datagrams in order, sockets taking turns; a sender refused
    /// for a full queue is told WRITABLE once a poll made room.
    #[test]
    fn udp_queue_leaves_in_bounded_polls_and_in_order() {
        use crate::events::{Readiness, SocketRef};
        let mut s = stack();
        feed(&mut s, &arp(ArpOperation::Request, PEER_IP, OUR_IP));
        let a = s.udp().bind(7000).unwrap();
        let b = s.udp().bind(7001).unwrap();
        let dst = SocketAddrV4::new(PEER_IP, 9);
        let big = vec![7u8; 30_000];
        let mut queued = 0;
        while s.udp().send_to(a, dst, &big).is_ok() {
            queued += 1;
        }
        assert_eq!(s.udp().send_to(a, dst, &big), Err(Error::QueueFull));
        s.udp().send_to(b, dst, b"small").unwrap();
        let mut per_poll = Vec::new();
        let mut ports = Vec::new();
        let mut writable = false;
        for i in 0..100 {
            let mut tx = VecTx::new();
            s.poll(T0, &mut tx);
            let mut ev = Vec::new();
            s.drain_events(&mut ev);
            writable |= ev.iter().any(|e| {
                e.socket == SocketRef::Udp(a) && e.readiness.contains(Readiness::WRITABLE)
            });
            if tx.frames.is_empty() {
                break;
            }
            assert!(i < 99, "the queue never emptied");
            let mut datagrams = 0;
            for f in &tx.frames {
                let (_, ip) = parse_ip(f);
                if ip.frag_offset() == 0 {
                    datagrams += 1;
                    let u = UdpPacket::new_unchecked(ip.payload());
                    ports.push(u.src_port());
                }
            }
            per_poll.push(datagrams);
        }
        // 30,000 bytes each: a poll takes whole datagrams until 64 KiB
        // are reached (three), plus the other socket's on its turn.
        assert!(per_poll.iter().all(|&n| n <= 4), "{per_poll:?}");
        assert!(per_poll.len() > 2, "{per_poll:?}");
        assert_eq!(ports.len(), queued + 1);
        // The other socket's datagram did not wait for the whole queue.
        let small = ports.iter().position(|&p| p == 7001).unwrap();
        assert!(small <= 3, "{ports:?}");
        assert!(writable, "no WRITABLE after the queue drained");
        assert_eq!(s.udp_ref().tx_queued(a).unwrap().0, 0);
    }

    /// Sockets sharing a UDP port (iperf3's UDP server binds its port
    /// again after connecting the first socket to the client): binds as
    /// Linux allows them, and each datagram to the socket Linux picks.
    #[test]
    fn udp_port_sharing_and_connected_sockets() {
        use crate::socket::udp::UdpReuse;
        let addr = UdpReuse {
            addr: true,
            port: false,
        };
        let port = UdpReuse {
            addr: false,
            port: true,
        };
        let mut s = stack();
        feed(&mut s, &arp(ArpOperation::Request, PEER_IP, OUR_IP));
        let from = |s: &mut Stack, src: u16, body: &[u8]| {
            let f = eth(
                OUR_MAC,
                EthernetProtocol::Ipv4,
                &ipv4(PEER_IP, OUR_IP, IpProtocol::Udp, &udp(src, 7000, body)),
            );
            feed(s, &f).1
        };
        let got = |s: &mut Stack, h: crate::socket::udp::UdpHandle| {
            let mut buf = [0u8; 16];
            s.udp()
                .recv_from(h, &mut buf)
                .unwrap()
                .map(|(n, a)| (buf[..n].to_vec(), a.port()))
        };
        // Sharing needs every socket on the port to ask for the same kind.
        let a = s.udp().bind_reuse(7000, addr).unwrap();
        assert_eq!(s.udp().bind(7000), Err(Error::AddrInUse));
        assert_eq!(s.udp().bind_reuse(7000, port), Err(Error::AddrInUse));
        // Connected to 5001: only 5001's datagrams; the others to the
        // unconnected socket bound last.
        s.udp()
            .connect(a, Some(SocketAddrV4::new(PEER_IP, 5001).into()))
            .unwrap();
        let b = s.udp().bind_reuse(7000, addr).unwrap();
        assert_eq!(from(&mut s, 5001, b"to a"), None);
        assert_eq!(from(&mut s, 5002, b"to b"), None);
        assert_eq!(got(&mut s, a), Some((b"to a".to_vec(), 5001)));
        assert_eq!(got(&mut s, a), None);
        assert_eq!(got(&mut s, b), Some((b"to b".to_vec(), 5002)));
        // A connected socket alone on its port drops the rest, and says so
        // (port unreachable, as Linux with no socket for the datagram).
        s.udp().close(b).unwrap();
        assert_eq!(from(&mut s, 5003, b"x"), Some(DropReason::UdpNoSocket));
        assert_eq!(from(&mut s, 5001, b"still a"), None);
        assert_eq!(got(&mut s, a), Some((b"still a".to_vec(), 5001)));
        // Dissolved: everyone's again.
        s.udp().connect(a, None).unwrap();
        assert_eq!(from(&mut s, 5003, b"y"), None);
        assert_eq!(got(&mut s, a), Some((b"y".to_vec(), 5003)));
        s.udp().close(a).unwrap();
        // SO_REUSEPORT: each source keeps one socket, and the sources
        // spread over both.
        let p1 = s.udp().bind_reuse(7000, port).unwrap();
        let p2 = s.udp().bind_reuse(7000, port).unwrap();
        let mut by_source = std::collections::HashMap::new();
        for round in 0..2 {
            for src in 6000..6032u16 {
                assert_eq!(from(&mut s, src, b"r"), None);
                let on = match (got(&mut s, p1), got(&mut s, p2)) {
                    (Some(_), None) => p1,
                    (None, Some(_)) => p2,
                    other => panic!("source {src}: {other:?}"),
                };
                if round == 0 {
                    by_source.insert(src, on);
                } else {
                    assert_eq!(by_source[&src], on, "source {src} moved");
                }
            }
        }
        let on_p1 = by_source.values().filter(|&&h| h == p1).count();
        assert!(
            (1..32).contains(&on_p1),
            "{on_p1} of 32 sources on one socket"
        );
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
        let h = a.ping().open(1).unwrap();
        a.ping().send(h, PEER_IP, 1, 4000).unwrap();
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
                rx.receive(T0, f, crate::RxMeta::default(), &mut out);
            }
            rx.poll(T0, &mut out);
            frames = out.frames;
            toward_b = !toward_b;
        }
        assert!(b.stats().ipv4.reassembled >= 1);
        assert!(a.stats().ipv4.tx_fragments >= 3);
        match a.ping().recv(h).unwrap() {
            Some(PingEvent::Reply(r)) => {
                assert_eq!((r.from, r.seq, r.bytes), (PEER_IP.into(), 1, 4008));
                assert!(r.rtt().is_some());
            }
            other => panic!("expected a reply, got {other:?}"),
        }
        assert_eq!(b.stats().ipv4.reassembly_bytes, 0);
    }

    #[test]
    fn no_route_without_gateway() {
        let mut s = stack();
        let h = s.udp().bind(1).unwrap();
        s.udp()
            .send_to(
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

    /// Every frame stack A sends while it moves `total` bytes (and a FIN)
    /// to B over a lossless wire, with `gso_max`; B's bytes read; A's
    /// TCP counters.
    fn transfer_frames(
        gso_max: usize,
        total: usize,
    ) -> (Vec<Vec<u8>>, Vec<u8>, crate::socket::tcp::TcpStats) {
        let mut cfg = crate::sim::host_config(1);
        cfg.gso_max = gso_max;
        let mut a = Stack::new(cfg);
        let mut b = Stack::new(crate::sim::host_config(2));
        let l = b.tcp().listen(80, 8).unwrap();
        let h = a.tcp().connect(T0, SocketAddrV4::new(b.ip(), 80)).unwrap();
        let data: Vec<u8> = (0..total).map(|i| (i * 7 % 251) as u8).collect();
        let (mut sent, mut closed, mut got, mut peer) = (0, false, Vec::new(), None);
        let (mut to_a, mut to_b): (Vec<Vec<u8>>, Vec<Vec<u8>>) = (Vec::new(), Vec::new());
        let mut from_a = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        for step in 0..20_000u64 {
            let now = Instant::from_micros(1_000 + 50 * step);
            let (mut out_a, mut out_b) = (VecTx::new(), VecTx::new());
            for f in to_a.drain(..) {
                a.receive(now, &f, crate::RxMeta::default(), &mut out_a);
            }
            for f in to_b.drain(..) {
                b.receive(now, &f, crate::RxMeta::default(), &mut out_b);
            }
            if sent < total {
                // Uneven writes, so segments end mid-frame and Nagle
                // holds short tails.
                let end = total.min(sent + 30_001);
                sent += a.tcp().send(h, &data[sent..end]).unwrap_or(0);
            } else if !closed {
                a.tcp().close(now, h).unwrap();
                closed = true;
            }
            if peer.is_none() {
                peer = b.tcp().accept(l).unwrap();
            }
            if let Some(p) = peer {
                while let Ok(n @ 1..) = b.tcp().recv(p, &mut buf) {
                    got.extend_from_slice(&buf[..n]);
                }
            }
            a.poll(now, &mut out_a);
            b.poll(now, &mut out_b);
            from_a.extend(out_a.frames.iter().cloned());
            (to_a, to_b) = (out_b.frames, out_a.frames);
            if closed && got.len() == total && to_a.is_empty() && to_b.is_empty() {
                break;
            }
        }
        (from_a, got, a.stats().tcp)
    }

    #[test]
    fn software_gso_sends_the_frames_segment_by_segment_sending_sends() {
        // Not a multiple of the MSS, written in uneven pieces: segments end
        // in short tails that SWS avoidance and Nagle decide on.
        let total = 1_000_003;
        let (plain, got_plain, stats_plain) = transfer_frames(0, total);
        let (gso, got_gso, stats_gso) = transfer_frames(crate::config::DEFAULT_GSO_MAX, total);
        let data: Vec<u8> = (0..total).map(|i| (i * 7 % 251) as u8).collect();
        assert!(got_plain == data && got_gso == data, "both byte-exact");
        assert_eq!(stats_plain.gso_segments, 0);
        assert!(
            stats_gso.gso_segments > 10,
            "GSO cut {} segments",
            stats_gso.gso_segments
        );
        assert_eq!(plain.len(), gso.len(), "as many frames");
        for (i, (p, g)) in plain.iter().zip(&gso).enumerate() {
            assert!(p == g, "frame {i} differs");
        }
        assert_eq!(stats_plain.segs_out, stats_gso.segs_out);
        let tcp_frames = gso
            .iter()
            .filter(|f| f[12..14] == [0x08, 0x00] && f[14 + 9] == 6)
            .count();
        assert_eq!(
            stats_gso.segs_out as usize, tcp_frames,
            "every frame counted"
        );
    }
}
