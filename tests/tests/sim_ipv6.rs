//! IPv6 below the transports, on raw frames: the link-local address made
//! from the MAC, neighbor solicitations answered (unicast, multicast, and
//! duplicate address detection), advertisements learnt, echo answered,
//! and what RFC 4861 and RFC 8200 say to drop, dropped with its counter.
//! Frames are built and parsed with smoltcp's wire types, not ours.

use std::net::Ipv6Addr;

use ustack::iface::ipv6::{ALL_NODES, ALL_ROUTERS, link_local, multicast_mac, solicited_node};
use ustack::iface::ndp::NeighborState;
use ustack::sim::{host_config, host_mac};
use ustack::stats::DropReason;
use ustack::wire::*;
use ustack::{Instant, RxMeta, Stack, VecTx};

mod v6util;
use v6util::*;

fn parse_advert(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    bytes: &[u8],
) -> (NdiscNeighborFlags, Ipv6Addr, Option<EthernetAddress>) {
    let pkt = Icmpv6Packet::new_checked(bytes).unwrap();
    match Icmpv6Repr::parse(&src, &dst, &pkt, &Default::default()).unwrap() {
        Icmpv6Repr::Ndisc(NdiscRepr::NeighborAdvert {
            flags,
            target_addr,
            lladdr,
        }) => (
            flags,
            target_addr,
            lladdr.map(|l| EthernetAddress::from_bytes(l.as_bytes())),
        ),
        other => panic!("not an advertisement: {other:?}"),
    }
}

#[test]
fn addresses_link_local_from_the_mac_then_configured() {
    let s = Stack::new(config());
    let ll = link_local(host_mac(1));
    // Modified EUI-64: the universal/local bit flipped, ff:fe in the middle.
    let m = host_mac(1).0;
    let want = Ipv6Addr::new(
        0xfe80,
        0,
        0,
        0,
        u16::from_be_bytes([m[0] ^ 2, m[1]]),
        u16::from_be_bytes([m[2], 0xff]),
        u16::from_be_bytes([0xfe, m[3]]),
        u16::from_be_bytes([m[4], m[5]]),
    );
    assert_eq!(ll, want);
    assert_eq!(s.addr_ref().ipv6(), vec![ll, GLOBAL]);
    // Without a configured address IPv6 is off.
    assert!(Stack::new(host_config(1)).addr_ref().ipv6().is_empty());
}

#[test]
fn solicitation_to_the_solicited_node_group_is_answered_and_teaches_the_sender() {
    let mut s = Stack::new(config());
    let group = solicited_node(GLOBAL);
    let f = icmpv6_frame(
        multicast_mac(group),
        PEER,
        group,
        255,
        &solicit(GLOBAL, Some(peer_mac())),
    );
    let tx = receive(&mut s, &f);
    let (eth_dst, src, dst, hops, icmp) = only_reply(&tx);
    assert_eq!((eth_dst, src, dst, hops), (peer_mac(), GLOBAL, PEER, 255));
    let (flags, target, lladdr) = parse_advert(src, dst, &icmp);
    assert_eq!(
        flags,
        NdiscNeighborFlags::SOLICITED | NdiscNeighborFlags::OVERRIDE
    );
    assert_eq!((target, lladdr), (GLOBAL, Some(host_mac(1))));
    let st = s.stats().ipv6;
    assert_eq!((st.rx_neighbor_solicits, st.tx_neighbor_adverts), (1, 1));
    assert_eq!(
        s.addr_ref().ipv6_neighbours(T0),
        vec![(PEER, peer_mac(), NeighborState::Stale)]
    );
    assert_eq!(s.stats().ipv6.neighbors, 1);
}

#[test]
fn duplicate_address_detection_is_answered_to_all_nodes() {
    let mut s = Stack::new(config());
    let ll = link_local(host_mac(1));
    let group = solicited_node(ll);
    let f = icmpv6_frame(
        multicast_mac(group),
        Ipv6Addr::UNSPECIFIED,
        group,
        255,
        &solicit(ll, None),
    );
    let tx = receive(&mut s, &f);
    let (eth_dst, src, dst, _, icmp) = only_reply(&tx);
    assert_eq!(
        (eth_dst, src, dst),
        (multicast_mac(ALL_NODES), ll, ALL_NODES)
    );
    let (flags, target, _) = parse_advert(src, dst, &icmp);
    assert_eq!((flags, target), (NdiscNeighborFlags::OVERRIDE, ll));
    assert!(s.addr_ref().ipv6_neighbours(T0).is_empty());
}

#[test]
fn what_neighbor_discovery_must_discard() {
    let mut s = Stack::new(config());
    let group = solicited_node(GLOBAL);
    // Hop limit other than 255: it crossed a router (RFC 4861 §7.1.1).
    let f = icmpv6_frame(
        multicast_mac(group),
        PEER,
        group,
        64,
        &solicit(GLOBAL, Some(peer_mac())),
    );
    assert!(receive(&mut s, &f).frames.is_empty());
    assert_eq!(drops(&s, DropReason::NdpInvalid), 1);
    // A target that is not ours.
    let other = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 9);
    let f = icmpv6_frame(
        multicast_mac(group),
        PEER,
        group,
        255,
        &solicit(other, Some(peer_mac())),
    );
    assert!(receive(&mut s, &f).frames.is_empty());
    assert_eq!(drops(&s, DropReason::NdpNotForUs), 1);
    // A corrupted checksum.
    let mut f = icmpv6_frame(peer_mac_to_us(), PEER, GLOBAL, 255, &solicit(GLOBAL, None));
    let last = f.len() - 1;
    f[last] ^= 0xff;
    assert!(receive(&mut s, &f).frames.is_empty());
    assert_eq!(drops(&s, DropReason::Icmpv6BadChecksum), 1);
    // Another host advertising our address.
    let claim = Icmpv6Repr::Ndisc(NdiscRepr::NeighborAdvert {
        flags: NdiscNeighborFlags::OVERRIDE,
        target_addr: GLOBAL,
        lladdr: Some(RawHardwareAddress::from(peer_mac())),
    });
    let f = icmpv6_frame(multicast_mac(ALL_NODES), PEER, ALL_NODES, 255, &claim);
    assert!(receive(&mut s, &f).frames.is_empty());
    assert_eq!(drops(&s, DropReason::NdpConflict), 1);
    // A group we are not in.
    let f = icmpv6_frame(
        multicast_mac(solicited_node(other)),
        PEER,
        solicited_node(other),
        255,
        &solicit(other, Some(peer_mac())),
    );
    assert!(receive(&mut s, &f).frames.is_empty());
    assert_eq!(drops(&s, DropReason::EthNotForUs), 1);
}

fn peer_mac_to_us() -> EthernetAddress {
    host_mac(1)
}

#[test]
fn a_solicited_advertisement_makes_the_neighbor_reachable() {
    let mut s = Stack::new(config());
    let advert = Icmpv6Repr::Ndisc(NdiscRepr::NeighborAdvert {
        flags: NdiscNeighborFlags::SOLICITED | NdiscNeighborFlags::OVERRIDE,
        target_addr: PEER,
        lladdr: Some(RawHardwareAddress::from(peer_mac())),
    });
    let f = icmpv6_frame(host_mac(1), PEER, GLOBAL, 255, &advert);
    assert!(receive(&mut s, &f).frames.is_empty());
    assert_eq!(
        s.addr_ref().ipv6_neighbours(T0),
        vec![(PEER, peer_mac(), NeighborState::Reachable)]
    );
    assert_eq!(s.stats().ipv6.neighbors, 1);
}

#[test]
fn echo_requests_are_answered_with_their_data() {
    let mut s = Stack::new(config());
    let data: Vec<u8> = (0..56).collect();
    let req = Icmpv6Repr::EchoRequest {
        ident: 0x77,
        seq_no: 3,
        data: &data,
    };
    let f = icmpv6_frame(host_mac(1), PEER, GLOBAL, 64, &req);
    let tx = receive(&mut s, &f);
    let (eth_dst, src, dst, _, icmp) = only_reply(&tx);
    assert_eq!((eth_dst, src, dst), (peer_mac(), GLOBAL, PEER));
    let pkt = Icmpv6Packet::new_checked(&icmp[..]).unwrap();
    match Icmpv6Repr::parse(&src, &dst, &pkt, &Default::default()).unwrap() {
        Icmpv6Repr::EchoReply {
            ident,
            seq_no,
            data: got,
        } => assert_eq!((ident, seq_no, got), (0x77, 3, &data[..])),
        other => panic!("not an echo reply: {other:?}"),
    }
    // To the link-local address as well.
    let ll = link_local(host_mac(1));
    let peer_ll = link_local(peer_mac());
    let f = icmpv6_frame(host_mac(1), peer_ll, ll, 64, &req);
    let (_, src, dst, _, _) = only_reply(&receive(&mut s, &f));
    assert_eq!((src, dst), (ll, peer_ll));
    let st = s.stats().ipv6;
    assert_eq!((st.rx_echo_requests, st.tx_echo_replies), (2, 2));
    // An echo to all-nodes is not answered (Linux's default).
    let f = icmpv6_frame(multicast_mac(ALL_NODES), PEER, ALL_NODES, 64, &req);
    assert!(receive(&mut s, &f).frames.is_empty());
    assert_eq!(drops(&s, DropReason::Icmpv6Unhandled), 1);
}

#[test]
fn headers_that_fail_validation() {
    let mut s = Stack::new(config());
    let req = Icmpv6Repr::EchoRequest {
        ident: 1,
        seq_no: 1,
        data: b"x",
    };
    let good = icmpv6_frame(host_mac(1), PEER, GLOBAL, 64, &req);
    let mut bad_version = good.clone();
    bad_version[ETHERNET_HEADER_LEN] = 0x40;
    receive(&mut s, &bad_version);
    assert_eq!(drops(&s, DropReason::Ipv6BadVersion), 1);
    let truncated = &good[..good.len() - 1];
    receive(&mut s, truncated);
    assert_eq!(drops(&s, DropReason::Ipv6BadLength), 1);
    receive(&mut s, &good[..ETHERNET_HEADER_LEN + 20]);
    assert_eq!(drops(&s, DropReason::Ipv6Truncated), 1);
    let other = icmpv6_frame(
        host_mac(1),
        PEER,
        Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 9),
        64,
        &req,
    );
    receive(&mut s, &other);
    assert_eq!(drops(&s, DropReason::Ipv6NotForUs), 1);
    let spoof = icmpv6_frame(host_mac(1), GLOBAL, GLOBAL, 64, &req);
    receive(&mut s, &spoof);
    assert_eq!(drops(&s, DropReason::Ipv6BadSource), 1);
    // With IPv6 off the frame is an EtherType we do not speak.
    let mut off = Stack::new(host_config(1));
    receive(&mut off, &good);
    assert_eq!(drops(&off, DropReason::EthUnknownType), 1);
    assert_eq!(s.stats().ipv6.tx_packets, 0);
}

// ------------------------------------------------------------ UDP over IPv6

/// Two stacks with IPv6 on: `fd77::1` and `fd77::2`.
fn pair() -> (Stack, Stack) {
    let mut a = host_config(1);
    a.announce = false;
    a.ipv6 = vec![Ipv6Cidr::new(
        Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 1),
        64,
    )];
    let mut b = host_config(2);
    b.announce = false;
    b.ipv6 = vec![Ipv6Cidr::new(
        Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 2),
        64,
    )];
    (Stack::new(a), Stack::new(b))
}

/// Hand every frame `from` polls out to `to`; the frames `to` sent back.
fn deliver(frames: &[Vec<u8>], to: &mut Stack) -> Vec<Vec<u8>> {
    let mut tx = VecTx::new();
    for f in frames {
        to.receive(T0, f, RxMeta::default(), &mut tx);
    }
    to.poll(T0, &mut tx);
    tx.frames
}

fn polled(s: &mut Stack) -> Vec<Vec<u8>> {
    let mut tx = VecTx::new();
    s.poll(T0, &mut tx);
    tx.frames
}

/// A datagram to a neighbor not yet known waits while the neighbor is
/// solicited; the advertisement releases it; the answer goes straight
/// back (the solicitation taught the other side); the source is the
/// configured address and the checksum verifies over IPv6.
#[test]
fn udp_over_ipv6_resolves_the_neighbor_then_both_ways() {
    let (mut a, mut b) = pair();
    let (ip_a, ip_b) = (PEER, GLOBAL);
    let ha = a.udp().bind(5000).unwrap();
    let hb = b.udp().bind(7).unwrap();
    let to_b = std::net::SocketAddr::new(ip_b.into(), 7);
    a.udp().send_to(ha, to_b, b"over six").unwrap();
    let out = polled(&mut a);
    assert_eq!(out.len(), 1, "only the solicitation leaves first");
    let (mac, src, dst, hops, icmp) = only_reply(&VecTx {
        frames: out.clone(),
        ..VecTx::new()
    });
    assert_eq!(mac, multicast_mac(solicited_node(ip_b)));
    assert_eq!((src, dst, hops), (ip_a, solicited_node(ip_b), 255));
    let pkt = Icmpv6Packet::new_checked(&icmp[..]).unwrap();
    match Icmpv6Repr::parse(&src, &dst, &pkt, &Default::default()).unwrap() {
        Icmpv6Repr::Ndisc(NdiscRepr::NeighborSolicit {
            target_addr,
            lladdr,
        }) => {
            assert_eq!(target_addr, ip_b);
            assert_eq!(
                lladdr.map(|l| l.as_bytes().to_vec()),
                Some(host_mac(1).0.to_vec())
            );
        }
        other => panic!("not a solicitation: {other:?}"),
    }
    assert_eq!(a.stats().ipv6.pending_packets, 1);
    // B answers; A's held datagram leaves on the advertisement.
    let advert = deliver(&out, &mut b);
    assert_eq!(advert.len(), 1);
    let datagram = deliver(&advert, &mut a);
    assert_eq!(datagram.len(), 1);
    assert_eq!(a.stats().ipv6.pending_packets, 0);
    let eth = EthernetFrame::new_checked(&datagram[0][..]).unwrap();
    assert_eq!(eth.dst_addr(), host_mac(2));
    let ip = Ipv6Packet::new_checked(eth.payload()).unwrap();
    assert_eq!((ip.src_addr(), ip.dst_addr()), (ip_a, ip_b));
    let udp = UdpPacket::new_checked(ip.payload()).unwrap();
    assert!(udp.verify_checksum(&IpAddress::Ipv6(ip_a), &IpAddress::Ipv6(ip_b)));
    assert_eq!(deliver(&datagram, &mut b), Vec::<Vec<u8>>::new());
    let mut buf = [0u8; 64];
    let (n, from) = b.udp().recv_from(hb, &mut buf).unwrap().unwrap();
    assert_eq!(&buf[..n], b"over six");
    assert_eq!(from, std::net::SocketAddr::new(ip_a.into(), 5000));
    // The answer needs no solicitation: B learnt A from its solicitation.
    b.udp().send_to(hb, from, b"and back").unwrap();
    let back = polled(&mut b);
    assert_eq!(back.len(), 1);
    deliver(&back, &mut a);
    let (n, from) = a.udp().recv_from(ha, &mut buf).unwrap().unwrap();
    assert_eq!((&buf[..n], from), (&b"and back"[..], to_b));
    assert_eq!(b.stats().udp.rx_datagrams, 1);
    assert_eq!(a.stats().udp.rx_datagrams, 1);
    assert_eq!(a.stats().ipv6.tx_neighbor_solicits, 1);
}

/// A datagram above the MTU leaves in fragments (RFC 8200 §4.5): every
/// fragment but the last a multiple of 8 bytes, one identification, the
/// offsets contiguous, and the pieces joined give the datagram, whose
/// checksum verifies.
#[test]
fn a_large_udp_datagram_leaves_in_fragments() {
    let (mut a, mut b) = pair();
    let ha = a.udp().bind(5000).unwrap();
    b.udp().bind(7).unwrap();
    // Let A know B first.
    a.udp().send_to(ha, (GLOBAL, 7), b"hi").unwrap();
    let ns = polled(&mut a);
    let na = deliver(&ns, &mut b);
    deliver(&na, &mut a);
    let data: Vec<u8> = (0..4000u32).map(|i| (i * 13) as u8).collect();
    a.udp().send_to(ha, (GLOBAL, 7), &data).unwrap();
    let frames = polled(&mut a);
    assert_eq!(frames.len(), 3, "4,008 bytes in fragments of at most 1,448");
    let mut joined = Vec::new();
    let mut ident = None;
    for (i, f) in frames.iter().enumerate() {
        let eth = EthernetFrame::new_checked(&f[..]).unwrap();
        assert!(eth.payload().len() <= 1500);
        let ip = Ipv6Packet::new_checked(eth.payload()).unwrap();
        assert_eq!(ip.next_header(), IpProtocol::Ipv6Frag);
        let p = ip.payload();
        assert_eq!(p[0], u8::from(IpProtocol::Udp));
        let word = u16::from_be_bytes([p[2], p[3]]);
        let (offset, more) = (usize::from(word & !7), word & 1 == 1);
        assert_eq!(offset, joined.len());
        assert_eq!(more, i + 1 < frames.len());
        let id = u32::from_be_bytes([p[4], p[5], p[6], p[7]]);
        assert_eq!(*ident.get_or_insert(id), id);
        if more {
            assert_eq!((p.len() - 8) % 8, 0);
        }
        joined.extend_from_slice(&p[8..]);
    }
    let udp = UdpPacket::new_checked(&joined[..]).unwrap();
    assert!(udp.verify_checksum(&IpAddress::Ipv6(PEER), &IpAddress::Ipv6(GLOBAL)));
    assert_eq!(udp.payload(), &data[..]);
    assert_eq!(a.stats().ipv6.tx_fragments, 3);
}

/// A datagram to a port nobody bound is answered with ICMPv6 port
/// unreachable quoting it (RFC 4443 §3.1), as Linux does.
#[test]
fn udp_to_a_closed_port_gets_port_unreachable() {
    let (mut a, mut b) = pair();
    let ha = a.udp().bind(5000).unwrap();
    a.udp().send_to(ha, (GLOBAL, 9999), b"anyone?").unwrap();
    let ns = polled(&mut a);
    let na = deliver(&ns, &mut b);
    let datagram = deliver(&na, &mut a);
    let sent = datagram[0].clone();
    let err = deliver(&datagram, &mut b);
    assert_eq!(err.len(), 1);
    let eth = EthernetFrame::new_checked(&err[0][..]).unwrap();
    let ip = Ipv6Packet::new_checked(eth.payload()).unwrap();
    assert_eq!((ip.src_addr(), ip.dst_addr()), (GLOBAL, PEER));
    let pkt = Icmpv6Packet::new_checked(ip.payload()).unwrap();
    assert!(pkt.verify_checksum(&GLOBAL, &PEER));
    let icmp = ip.payload();
    assert_eq!((icmp[0], icmp[1]), (1, 4), "destination unreachable, port");
    assert_eq!(&icmp[8..], &sent[ETHERNET_HEADER_LEN..]);
    assert_eq!(b.stats().ipv6.tx_dest_unreachable, 1);
    assert_eq!(drops(&b, DropReason::UdpNoSocket), 1);
}

// ------------------------------------------------------------ TCP over IPv6

/// A host's apps: a sender toward the other host and a receiver.
struct Both {
    send: ustack_kit::bulk::BulkSend,
    recv: ustack_kit::bulk::BulkRecv,
}

impl ustack::node::App for Both {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> ustack::node::Control {
        self.recv.poll(now, stack);
        self.send.poll(now, stack);
        ustack::node::Control::Continue
    }
    fn poll_at(&self) -> Option<Instant> {
        ustack::time::earliest(self.send.poll_at(), self.recv.poll_at())
    }
}

/// `bytes` each way at once over IPv6 between `fd77::1` and `fd77::2` on
/// a link with `link`'s impairments: both streams byte-exact (CRC of the
/// pattern), and the frames on the wire IPv6 (no IPv4 segment).
fn tcp6_both_ways(link: ustack::sim::LinkConfig, bytes: u64) -> ustack::sim::SimNet {
    use ustack::sim::SimNet;
    use ustack_kit::bulk::{BulkRecv, BulkSend};
    let mut net = SimNet::new(link);
    let (a, b) = pair();
    let (ca, cb) = (a.config().clone(), b.config().clone());
    net.add(ca);
    net.add(cb);
    let mut apps = [
        Both {
            send: BulkSend::new((GLOBAL, 5001), bytes),
            recv: BulkRecv::new(5001, 8),
        },
        Both {
            send: BulkSend::new((PEER, 5001), bytes),
            recv: BulkRecv::new(5001, 8),
        },
    ];
    let [x, y] = &mut apps;
    net.run_until(Instant::from_secs(120), &mut [x, y], |_| false);
    for (i, h) in apps.iter().enumerate() {
        assert_eq!(h.send.error, None, "host {i}");
        assert!(h.send.done(), "host {i} did not finish");
        assert_eq!(h.recv.completed.len(), 1, "host {i}");
        let got = h.recv.completed[0];
        assert_eq!(got.bytes, bytes);
        assert_eq!(
            got.crc,
            apps[1 - i].send.transfer.crc,
            "host {i}: bytes differ"
        );
    }
    for n in &net.nodes {
        let s = n.stack.stats();
        assert!(s.ipv6.tx_packets > 0);
        assert_eq!(s.ipv4.tx_packets, 0, "an IPv4 packet left");
    }
    net
}

/// A transfer each way at once over IPv6: byte-exact, the MSS 20 bytes
/// below IPv4's (1,440 on a 1,500-byte MTU, so the peer's segments fit),
/// no frame above the MTU.
#[test]
fn tcp_over_ipv6_both_ways_byte_exact() {
    let net = tcp6_both_ways(ustack::sim::LinkConfig::default(), 4 << 20);
    for n in &net.nodes {
        let s = n.stack.stats();
        assert_eq!(s.tcp.established, 2);
        assert_eq!(s.ipv6.tx_fragments, 0, "TCP never fragments");
        assert_eq!(
            s.drops.get(DropReason::EthOversize),
            0,
            "a frame above the MTU"
        );
        assert_eq!(s.drops.get(DropReason::TcpBadChecksum), 0);
    }
}

/// The same under loss, reordering, duplication and corruption: SACK,
/// retransmission and the checksum over the IPv6 pseudo-header at work.
#[test]
fn tcp_over_ipv6_under_impairment() {
    let link = ustack::sim::LinkConfig {
        loss: 0.02,
        reorder: 0.05,
        duplicate: 0.01,
        corrupt: 0.005,
        seed: 6,
        ..Default::default()
    };
    let net = tcp6_both_ways(link, 1 << 20);
    let retransmits: u64 = net
        .nodes
        .iter()
        .map(|n| n.stack.stats().tcp.retransmits)
        .sum();
    assert!(retransmits > 0, "no loss recovered");
}

/// A SYN over IPv6 carries MSS 1,440 and is answered by a SYN-ACK from
/// the address it was sent to; a SYN to a closed port gets a reset.
#[test]
fn tcp_over_ipv6_syn_options_and_reset() {
    let (mut a, mut b) = pair();
    b.tcp().listen(80, 4).unwrap();
    a.tcp().connect(T0, (GLOBAL, 80)).unwrap();
    a.tcp().connect(T0, (GLOBAL, 81)).unwrap();
    let ns = polled(&mut a);
    let na = deliver(&ns, &mut b);
    let syns = deliver(&na, &mut a);
    assert_eq!(syns.len(), 2, "both SYNs left once the neighbor was known");
    let answers = deliver(&syns, &mut b);
    let mut seen = Vec::new();
    for f in syns.iter().chain(&answers) {
        let eth = EthernetFrame::new_checked(&f[..]).unwrap();
        let ip = Ipv6Packet::new_checked(eth.payload()).unwrap();
        let (src, dst) = (
            IpAddress::Ipv6(ip.src_addr()),
            IpAddress::Ipv6(ip.dst_addr()),
        );
        let tcp = TcpPacket::new_checked(ip.payload()).unwrap();
        assert!(tcp.verify_checksum(&src, &dst));
        let repr = TcpRepr::parse(&tcp, &src, &dst, &Default::default()).unwrap();
        seen.push((
            ip.src_addr(),
            repr.dst_port,
            repr.control,
            repr.ack_number.is_some(),
            repr.max_seg_size,
        ));
    }
    seen.sort_by_key(|s| (s.0, s.1));
    assert!(seen.contains(&(PEER, 80, TcpControl::Syn, false, Some(1440))));
    assert!(seen.contains(&(PEER, 81, TcpControl::Syn, false, Some(1440))));
    let syn_ack = |s: &&(Ipv6Addr, u16, TcpControl, bool, Option<u16>)| {
        s.0 == GLOBAL && s.2 == TcpControl::Syn && s.3 && s.4 == Some(1440)
    };
    assert_eq!(seen.iter().filter(syn_ack).count(), 1, "{seen:?}");
    assert!(seen.iter().any(|s| s.0 == GLOBAL && s.2 == TcpControl::Rst));
}

// ------------------------------------------- extension headers, fragments

/// A stack with a UDP socket on port 7; how many datagrams it got.
fn udp_host() -> (Stack, ustack::socket::udp::UdpHandle) {
    let mut s = Stack::new(config());
    let h = s.udp().bind(7).unwrap();
    (s, h)
}

fn got(s: &mut Stack, h: ustack::socket::udp::UdpHandle) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 70_000];
    while let Some((n, _)) = s.udp().recv_from(h, &mut buf).unwrap() {
        out.push(buf[..n].to_vec());
    }
    out
}

/// Options headers are walked: padding, an unknown option whose type
/// says skip, hop-by-hop then destination options, then UDP.
#[test]
fn extension_headers_are_walked_to_the_transport() {
    let (mut s, h) = udp_host();
    let mut chain = opts_header(IpProtocol::Ipv6Opts, &[1, 2, 0, 0]);
    chain.extend(opts_header(IpProtocol::Udp, &[0x3e, 2, 9, 9, 0]));
    receive(
        &mut s,
        &v6_frame(IpProtocol::HopByHop, &chain, &udp6(b"through")),
    );
    assert_eq!(got(&mut s, h), vec![b"through".to_vec()]);
    // A routing header with nothing left to route is passed over too.
    let route = vec![u8::from(IpProtocol::Udp), 0, 4, 0, 0, 0, 0, 0];
    receive(
        &mut s,
        &v6_frame(IpProtocol::Ipv6Route, &route, &udp6(b"routed")),
    );
    assert_eq!(got(&mut s, h), vec![b"routed".to_vec()]);
}

/// What RFC 8200 §4 says to discard, discarded with its reason: an
/// unknown option of a discarding type, hop-by-hop anywhere but first, a
/// routing header with segments left, a header cut short, a chain too
/// long. The first three tell the sender with a parameter problem (RFC
/// 4443 §3.4) whose code and pointer name the field, as Linux does.
#[test]
fn extension_headers_that_must_be_refused() {
    let (mut s, h) = udp_host();
    // The sender as a neighbor, so errors to it leave at once.
    let ns = solicit(GLOBAL, Some(peer_mac()));
    let group = solicited_node(GLOBAL);
    receive(
        &mut s,
        &icmpv6_frame(multicast_mac(group), PEER, group, 255, &ns),
    );
    let cases: Vec<(IpProtocol, Vec<u8>, DropReason)> = vec![
        (
            IpProtocol::Ipv6Opts,
            opts_header(IpProtocol::Udp, &[0x80, 0]),
            DropReason::Ipv6BadOption,
        ),
        (
            IpProtocol::Ipv6Opts,
            [
                opts_header(IpProtocol::HopByHop, &[]),
                opts_header(IpProtocol::Udp, &[]),
            ]
            .concat(),
            DropReason::Ipv6BadExtension,
        ),
        (
            IpProtocol::Ipv6Route,
            vec![u8::from(IpProtocol::Udp), 0, 0, 1, 0, 0, 0, 0],
            DropReason::Ipv6RoutingHeader,
        ),
        (
            IpProtocol::Ipv6Opts,
            vec![u8::from(IpProtocol::Udp), 3, 1, 4],
            DropReason::Ipv6BadExtension,
        ),
        (
            IpProtocol::Ipv6Opts,
            (0..9)
                .flat_map(|i| {
                    opts_header(
                        if i < 8 {
                            IpProtocol::Ipv6Opts
                        } else {
                            IpProtocol::Udp
                        },
                        &[],
                    )
                })
                .collect(),
            DropReason::Ipv6BadExtension,
        ),
    ];
    // (code, pointer) of the parameter problem each case owes: option
    // type 0x80 at byte 42; the byte naming the misplaced hop-by-hop
    // header (40); the routing type (42); none for the last two.
    let problems = [Some((2, 42)), Some((1, 40)), Some((0, 42)), None, None];
    for ((first, chain, reason), problem) in cases.into_iter().zip(problems) {
        let before = drops(&s, reason);
        let frame = v6_frame(first, &chain, &udp6(b"no"));
        let tx = receive(&mut s, &frame);
        assert_eq!(drops(&s, reason), before + 1, "{reason:?}");
        match problem {
            None => assert!(tx.frames.is_empty()),
            Some((code, pointer)) => {
                let (mac, src, dst, _, icmp) = only_reply(&tx);
                assert_eq!((mac, src, dst), (peer_mac(), GLOBAL, PEER));
                assert_eq!((icmp[0], icmp[1]), (4, code), "{reason:?}");
                assert_eq!(u32::from_be_bytes(icmp[4..8].try_into().unwrap()), pointer);
                // The packet quoted from its fixed header on.
                assert_eq!(&icmp[8..], &frame[ETHERNET_HEADER_LEN..]);
            }
        }
    }
    assert_eq!(s.stats().ipv6.tx_param_problems, 3);
    assert!(got(&mut s, h).is_empty());
}

/// Fragments out of order are joined (the datagram byte-exact); an atomic
/// fragment (RFC 6946) is taken as it is; an overlap drops the datagram
/// (RFC 5722), and so do its other fragments' bytes.
#[test]
fn fragments_joined_atomic_taken_overlaps_dropped() {
    let (mut s, h) = udp_host();
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    let dgram = udp6(&data);
    let pieces = [
        (1232, &dgram[1232..2464]),
        (0, &dgram[..1232]),
        (2464, &dgram[2464..]),
    ];
    for (off, piece) in pieces {
        let more = off + piece.len() < dgram.len();
        let f = frag_header(IpProtocol::Udp, off, more, 77);
        receive(&mut s, &v6_frame(IpProtocol::Ipv6Frag, &f, piece));
    }
    assert_eq!(got(&mut s, h), vec![data.clone()]);
    assert_eq!(s.stats().ipv6.reassembled, 1);
    assert_eq!(s.stats().ipv6.rx_fragments, 3);
    // Atomic.
    let f = frag_header(IpProtocol::Udp, 0, false, 78);
    receive(
        &mut s,
        &v6_frame(IpProtocol::Ipv6Frag, &f, &udp6(b"atomic")),
    );
    assert_eq!(got(&mut s, h), vec![b"atomic".to_vec()]);
    // Overlap: the second fragment starts inside the first.
    let f1 = frag_header(IpProtocol::Udp, 0, true, 79);
    receive(&mut s, &v6_frame(IpProtocol::Ipv6Frag, &f1, &dgram[..1232]));
    let f2 = frag_header(IpProtocol::Udp, 1224, true, 79);
    receive(
        &mut s,
        &v6_frame(IpProtocol::Ipv6Frag, &f2, &dgram[1224..2000]),
    );
    assert_eq!(drops(&s, DropReason::FragOverlap), 1);
    assert!(got(&mut s, h).is_empty());
}

/// Between two stacks: a datagram above the MTU leaves in fragments and
/// arrives whole.
#[test]
fn large_datagrams_between_two_stacks() {
    let (mut a, mut b) = pair();
    let ha = a.udp().bind(5000).unwrap();
    let hb = b.udp().bind(7).unwrap();
    a.udp().send_to(ha, (GLOBAL, 7), b"hi").unwrap();
    let ns = polled(&mut a);
    let na = deliver(&ns, &mut b);
    let first = deliver(&na, &mut a);
    deliver(&first, &mut b);
    let data: Vec<u8> = (0..20_000u32).map(|i| (i * 31) as u8).collect();
    a.udp().send_to(ha, (GLOBAL, 7), &data).unwrap();
    let frames = polled(&mut a);
    assert!(frames.len() > 10);
    deliver(&frames, &mut b);
    let mut buf = vec![0u8; 30_000];
    let mut seen = Vec::new();
    while let Some((n, _)) = b.udp().recv_from(hb, &mut buf).unwrap() {
        seen.push(buf[..n].to_vec());
    }
    assert_eq!(seen, vec![b"hi".to_vec(), data]);
    assert_eq!(b.stats().ipv6.reassembled, 1);
}

// ------------------------------------------------------------ families

/// Frames between `a` and `b` until neither sends any more (address
/// resolution, handshakes).
fn settle(a: &mut Stack, b: &mut Stack) {
    let mut out = polled(a);
    for _ in 0..16 {
        let back = deliver(&out, b);
        out = deliver(&back, a);
        if out.is_empty() && back.is_empty() {
            return;
        }
    }
    panic!("the two stacks never went quiet");
}

/// An IPv4 listener and an IPv6-only one share port 80, each taking its
/// own family's peers (nginx's `listen 80; listen [::]:80;`); a
/// dual-stack listener there is refused, and a port with an IPv4 listener
/// only resets an IPv6 SYN.
#[test]
fn tcp_listeners_of_two_families_share_a_port() {
    use std::net::{IpAddr, Ipv4Addr};
    use ustack::Error;
    use ustack::socket::tcp::{ConnError, Family};
    let (mut a, mut b) = pair();
    let l4 = b.tcp().listen_family(80, 4, Family::V4).unwrap();
    let l6 = b.tcp().listen_family(80, 4, Family::V6).unwrap();
    assert_eq!(b.tcp().listen(80, 4), Err(Error::AddrInUse));
    assert_eq!(
        b.tcp().listen_family(80, 4, Family::V4),
        Err(Error::AddrInUse)
    );
    b.tcp().listen_family(81, 4, Family::V4).unwrap();
    let b4 = Ipv4Addr::new(10, 0, 0, 2);
    let c4 = a.tcp().connect(T0, (b4, 80)).unwrap();
    let c6 = a.tcp().connect(T0, (GLOBAL, 80)).unwrap();
    let refused = a.tcp().connect(T0, (GLOBAL, 81)).unwrap();
    settle(&mut a, &mut b);
    let remote = |b: &mut Stack, l| {
        let h = b.tcp().accept(l).unwrap().expect("a connection to accept");
        assert_eq!(b.tcp().accept(l).unwrap(), None, "only one");
        b.tcp_ref().info(h).unwrap().remote.ip()
    };
    assert_eq!(remote(&mut b, l4), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
    assert_eq!(remote(&mut b, l6), IpAddr::V6(PEER));
    for c in [c4, c6] {
        assert!(a.tcp_ref().status(c).unwrap().state.synchronized());
    }
    let st = a.tcp_ref().status(refused).unwrap();
    assert_eq!(st.error, Some(ConnError::Refused));
    // The listeners close apart: the IPv6 one's port is free for a
    // dual-stack listener only once the IPv4 one is gone too.
    b.tcp().unlisten(l6);
    assert_eq!(b.tcp().listen(80, 4), Err(Error::AddrInUse));
    b.tcp().unlisten(l4);
    let both = b.tcp().listen(80, 4).unwrap();
    assert_eq!((both.port(), both.family()), (80, Family::Both));
}

/// UDP sockets of the two families share a port without asking for
/// reuse, and each receives only its family's datagrams; a dual-stack
/// bind there is refused.
#[test]
fn udp_sockets_of_two_families_share_a_port() {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    use ustack::Error;
    use ustack::socket::udp::{Family, UdpReuse};
    let (mut a, mut b) = pair();
    let s4 = b
        .udp()
        .bind_family(53, UdpReuse::default(), Family::V4)
        .unwrap();
    let s6 = b
        .udp()
        .bind_family(53, UdpReuse::default(), Family::V6)
        .unwrap();
    assert_eq!(
        b.udp().bind_family(53, UdpReuse::default(), Family::Both),
        Err(Error::AddrInUse)
    );
    let ha = a.udp().bind(4000).unwrap();
    let b4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), 53);
    let b6 = SocketAddr::new(GLOBAL.into(), 53);
    a.udp().send_to(ha, b4, b"four").unwrap();
    a.udp().send_to(ha, b6, b"six").unwrap();
    settle(&mut a, &mut b);
    let mut buf = [0u8; 16];
    let (n, from) = b.udp().recv_from(s4, &mut buf).unwrap().unwrap();
    assert_eq!(
        (&buf[..n], from.ip()),
        (&b"four"[..], IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)))
    );
    let (n, from) = b.udp().recv_from(s6, &mut buf).unwrap().unwrap();
    assert_eq!((&buf[..n], from.ip()), (&b"six"[..], IpAddr::V6(PEER)));
    assert_eq!(b.udp().recv_from(s4, &mut buf).unwrap(), None);
    assert_eq!(b.udp().recv_from(s6, &mut buf).unwrap(), None);
    // With the IPv6 socket gone, an IPv6 datagram finds no socket.
    b.udp().close(s6).unwrap();
    a.udp().send_to(ha, b6, b"six again").unwrap();
    settle(&mut a, &mut b);
    assert_eq!(b.udp().recv_from(s4, &mut buf).unwrap(), None);
    assert_eq!(b.stats().drops.get(DropReason::UdpNoSocket), 1);
}

// ------------------------------------------------ router discovery, SLAAC

/// At start the stack solicits routers (after a random delay of up to a
/// second, three times 4 s apart, then stops); an advertisement gives it
/// a default router (off-link packets go to the router's MAC), an
/// address made from the advertised prefix and its MAC (answered to
/// echo), and the link MTU (datagrams above it leave in fragments); a
/// router lifetime of 0 takes the router away (off-link: no route).
#[test]
fn router_advertisement_gives_a_router_an_address_and_the_mtu() {
    use std::net::SocketAddr;
    use std::time::Duration;
    let mut s = Stack::new(config());
    assert!(polled_at(&mut s, T0).is_empty(), "no solicitation at once");
    let mut sent = Vec::new();
    for ms in (0..14_000).step_by(100) {
        let now = T0 + Duration::from_millis(ms);
        for f in polled_at(&mut s, now) {
            let (mac, dst) = v6_dst(&f);
            // MLD reports are sim_ipv6_host.rs's to check.
            if dst == ustack::iface::mld::ALL_MLDV2_ROUTERS {
                continue;
            }
            assert_eq!((mac, dst), (multicast_mac(ALL_ROUTERS), ALL_ROUTERS));
            sent.push(ms);
        }
    }
    assert_eq!(sent.len(), 3, "three solicitations: {sent:?}");
    assert!(sent[0] <= 1000 && sent[1] - sent[0] >= 4000, "{sent:?}");
    assert_eq!(s.stats().ipv6.tx_router_solicits, 3);
    // Before any router: an off-link destination has no route, and
    // sendto and connect say so at once (Linux: ENETUNREACH).
    let h = s.udp().bind(5000).unwrap();
    let far_ip = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 9);
    let far = SocketAddr::new(far_ip.into(), 53);
    let no_route = |r: Result<_, ustack::Error>| matches!(r, Err(ustack::Error::NoRoute));
    assert!(no_route(s.udp().send_to(h, far, b"x")));
    assert!(no_route(s.tcp().connect(T0, far).map(|_| ())));
    assert!(polled(&mut s).is_empty());
    // The advertisement.
    let prefix = Ipv6Addr::new(0xfd88, 0, 0, 0, 0, 0, 0, 0);
    let ra = router_advert(router_ll(), 1800, Some(1400), Some((prefix, 64, 3600)));
    receive(&mut s, &ra);
    let st = s.stats().ipv6;
    assert_eq!(
        (st.rx_router_adverts, st.routers, st.slaac_addresses),
        (1, 1, 0)
    );
    // The prefix and the interface identifier of the link-local address.
    let mut slaac = link_local(host_mac(1)).octets();
    slaac[..8].copy_from_slice(&prefix.octets()[..8]);
    let slaac = Ipv6Addr::from(slaac);
    // Tentative until duplicate address detection (RFC 4862 §5.4): a
    // probe from the unspecified address, then a second for a holder.
    let t = T0 + Duration::from_secs(15);
    let probes: Vec<_> = polled_at(&mut s, t)
        .into_iter()
        .filter(|f| v6_dst(f).1 == solicited_node(slaac))
        .collect();
    assert_eq!(probes.len(), 1);
    assert!(!s.ipv6_addrs().contains(&slaac));
    polled_at(&mut s, t + Duration::from_secs(1));
    assert!(s.ipv6_addrs().contains(&slaac), "{:?}", s.ipv6_addrs());
    assert_eq!(s.stats().ipv6.slaac_addresses, 1);
    // The new address answers echo.
    let echo = Icmpv6Repr::EchoRequest {
        ident: 1,
        seq_no: 1,
        data: b"slaac",
    };
    let tx = receive(&mut s, &icmpv6_frame(host_mac(1), PEER, slaac, 64, &echo));
    let (_, src, dst, _, _) = only_reply(&tx);
    assert_eq!((src, dst), (slaac, PEER));
    // Off-link now goes to the router (its MAC learnt from the
    // advertisement), in fragments above the advertised MTU of 1400.
    s.udp().send_to(h, far, &[7u8; 1380]).unwrap();
    let out = polled(&mut s);
    assert_eq!(out.len(), 2, "two fragments under an MTU of 1400");
    for f in &out {
        assert!(f.len() - ETHERNET_HEADER_LEN <= 1400);
        assert_eq!(v6_dst(f), (peer_mac(), far_ip));
    }
    // A connection too: its SYN goes to the router.
    s.tcp().connect(T0, far).unwrap();
    let syn = polled(&mut s);
    assert_eq!(syn.len(), 1);
    assert_eq!(v6_dst(&syn[0]), (peer_mac(), far_ip));
    // No more solicitations once a router is known.
    let later = polled_at(&mut s, T0 + Duration::from_secs(30));
    assert!(later.iter().all(|f| v6_dst(f).1 != ALL_ROUTERS));
    // Lifetime 0: no default router any more.
    receive(&mut s, &router_advert(router_ll(), 0, None, None));
    assert_eq!(s.stats().ipv6.routers, 0);
    assert!(no_route(s.udp().send_to(h, far, b"y")));
    assert!(no_route(s.tcp().connect(T0, far).map(|_| ())));
    assert!(polled(&mut s).is_empty());
    // The address made from the prefix stays until its valid lifetime.
    assert!(s.ipv6_addrs().contains(&slaac));
    polled_at(&mut s, T0 + Duration::from_secs(3601));
    assert!(!s.ipv6_addrs().contains(&slaac));
}

/// SLAAC alone (`ipv6_auto`, no IPv6 address configured): the stack
/// speaks IPv6 from its link-local address (solicits routers from it,
/// answers echo to it), and an advertised prefix gives it a global
/// address that answers too. Without `ipv6_auto` nothing of this
/// happens: IPv6 is off.
#[test]
fn slaac_alone_speaks_ipv6_from_the_link_local_address() {
    use std::time::Duration;
    let ll = link_local(host_mac(1));
    let mut off = config();
    off.ipv6.clear();
    let mut cfg = off.clone();
    cfg.ipv6_auto = true;
    let mut quiet = Stack::new(off);
    assert!(!quiet.ipv6_on());
    assert!(polled_at(&mut quiet, T0 + Duration::from_secs(2)).is_empty());
    let mut s = Stack::new(cfg);
    assert!(s.ipv6_on());
    assert_eq!(s.ipv6_addrs(), vec![ll]);
    assert!(polled_at(&mut s, T0).is_empty(), "no solicitation at once");
    let solicits: Vec<Vec<u8>> = polled_at(&mut s, T0 + Duration::from_secs(1))
        .into_iter()
        .filter(|f| v6_dst(f).1 == ALL_ROUTERS)
        .collect();
    assert_eq!(solicits.len(), 1, "a router solicitation within a second");
    let echo = Icmpv6Repr::EchoRequest {
        ident: 1,
        seq_no: 1,
        data: b"link-local",
    };
    let peer_ll = link_local(peer_mac());
    let tx = receive(&mut s, &icmpv6_frame(host_mac(1), peer_ll, ll, 64, &echo));
    let (_, src, dst, _, _) = only_reply(&tx);
    assert_eq!((src, dst), (ll, peer_ll));
    // The same echo is not answered with IPv6 off.
    assert!(
        receive(
            &mut quiet,
            &icmpv6_frame(host_mac(1), peer_ll, ll, 64, &echo)
        )
        .frames
        .is_empty()
    );
    let prefix = Ipv6Addr::new(0xfd88, 0, 0, 0, 0, 0, 0, 0);
    receive(
        &mut s,
        &router_advert(router_ll(), 1800, None, Some((prefix, 64, 3600))),
    );
    let mut slaac = ll.octets();
    slaac[..8].copy_from_slice(&prefix.octets()[..8]);
    let slaac = Ipv6Addr::from(slaac);
    polled_at(&mut s, T0 + Duration::from_secs(15));
    polled_at(&mut s, T0 + Duration::from_secs(16));
    assert_eq!(s.ipv6_addrs(), vec![ll, slaac]);
    let tx = receive(&mut s, &icmpv6_frame(host_mac(1), PEER, slaac, 64, &echo));
    let (_, src, dst, _, _) = only_reply(&tx);
    assert_eq!((src, dst), (slaac, PEER));
}

/// An advertisement flood from many routers with many prefixes keeps
/// the tables at their caps (the rest counted as ignored); one from a
/// global source address, or with an option of length 0, is dropped.
#[test]
fn router_advertisement_flood_is_bounded() {
    use ustack::iface::ipv6::{MAX_PREFIXES, MAX_ROUTERS};
    let mut s = Stack::new(config());
    for i in 0..100u16 {
        let mut router = link_local(peer_mac()).octets();
        router[14..].copy_from_slice(&(i | 0x8000).to_be_bytes());
        let prefix = Ipv6Addr::new(0xfd00, i, 0, 0, 0, 0, 0, 0);
        let ra = router_advert(Ipv6Addr::from(router), 600, None, Some((prefix, 64, 600)));
        receive(&mut s, &ra);
    }
    // The addresses clear duplicate address detection (a probe each,
    // then a second).
    polled_at(&mut s, T0);
    polled_at(&mut s, T0 + std::time::Duration::from_secs(1));
    let st = s.stats().ipv6;
    assert_eq!(st.rx_router_adverts, 100);
    assert_eq!(st.routers, MAX_ROUTERS as u64);
    assert_eq!(st.slaac_addresses, MAX_PREFIXES as u64);
    // Each advertisement beyond the caps: its router, its on-link prefix
    // and its address ignored.
    assert_eq!(
        st.ra_ignored,
        (100 - MAX_ROUTERS as u64) + 2 * (100 - MAX_PREFIXES as u64)
    );
    assert_eq!(s.ipv6_addrs().len(), 2 + MAX_PREFIXES);
    // Not from a link-local address: invalid.
    let before = drops(&s, DropReason::NdpInvalid);
    receive(&mut s, &router_advert(PEER, 600, None, None));
    assert_eq!(drops(&s, DropReason::NdpInvalid), before + 1);
    // An option of length 0: invalid (RFC 4861 §6.1.2; the parser drops
    // it as malformed); checksum fixed.
    let malformed = drops(&s, DropReason::Icmpv6Malformed);
    let mut ra = router_advert(router_ll(), 600, None, None);
    let icmp_at = ETHERNET_HEADER_LEN + IPV6_HEADER_LEN;
    ra.extend_from_slice(&[3, 0, 0, 0, 0, 0, 0, 0]);
    let plen = (ra.len() - icmp_at) as u16;
    ra[ETHERNET_HEADER_LEN + 4..ETHERNET_HEADER_LEN + 6].copy_from_slice(&plen.to_be_bytes());
    let (src, dst) = (router_ll(), ALL_NODES);
    let mut icmp = Icmpv6Packet::new_unchecked(&mut ra[icmp_at..]);
    icmp.fill_checksum(&src, &dst);
    receive(&mut s, &ra);
    assert_eq!(drops(&s, DropReason::Icmpv6Malformed), malformed + 1);
    assert_eq!(s.stats().ipv6.rx_router_adverts, 101);
}

// ------------------------------------------------------ path MTU (RFC 8201)

/// An ICMPv6 packet too big quoting one of a connection's segments in
/// flight lowers its MSS to the path MTU less 60 bytes (never below what
/// IPv6's minimum MTU of 1,280 gives), and the data goes again in
/// segments that fit; one quoting a sequence number not in flight is
/// ignored.
#[test]
fn packet_too_big_lowers_the_mss_of_the_connection_it_quotes() {
    let (mut a, mut b) = pair();
    b.tcp().listen(80, 4).unwrap();
    let c = a.tcp().connect(T0, (GLOBAL, 80)).unwrap();
    settle(&mut a, &mut b);
    assert_eq!(a.tcp_ref().info(c).unwrap().mss, 1440);
    assert_eq!(a.tcp().send(c, &[9u8; 4000]).unwrap(), 4000);
    let out = polled(&mut a);
    let first = out.first().expect("a segment").clone();
    let packet = &first[ETHERNET_HEADER_LEN..];
    assert_eq!(packet.len(), 1500);
    // A router on the way says 1,280 bytes (or less: 1,280 is the floor).
    let too_big = |mtu: u32, quoted: &[u8]| router_error(2, 0, mtu, quoted);
    // A sequence number not in flight: ignored.
    let stale = not_in_flight(packet);
    receive(&mut a, &too_big(1000, &stale));
    assert_eq!(a.tcp_ref().info(c).unwrap().mss, 1440);
    receive(&mut a, &too_big(1000, packet));
    let info = a.tcp_ref().info(c).unwrap();
    assert_eq!(info.mss, 1220, "1,280 less the IPv6 and TCP headers");
    assert_eq!(a.stats().ipv6.rx_packet_too_big, 2);
    let again = polled(&mut a);
    assert!(!again.is_empty());
    for f in &again {
        assert!(f.len() - ETHERNET_HEADER_LEN <= 1280, "{}", f.len());
    }
}

/// ICMPv6 errors about a connection's segments (RFC 4443, RFC 5461, as
/// Linux): a destination unreachable (address unreachable) quoting the
/// SYN of a connect in progress ends it with "no route to host" at once;
/// one quoting a sequence number not in flight is ignored. Before, only
/// packet too big was acted on.
#[test]
fn icmpv6_unreachable_ends_a_connect() {
    let (mut a, mut b) = pair();
    // A first connection resolves the peer; the second one's SYN is quoted.
    b.tcp().listen(80, 4).unwrap();
    a.tcp().connect(T0, (GLOBAL, 80)).unwrap();
    settle(&mut a, &mut b);
    let c = a.tcp().connect(T0, (GLOBAL, 81)).unwrap();
    let out = polled(&mut a);
    let syn = out
        .iter()
        .find(|f| f.get(ETHERNET_HEADER_LEN + 6) == Some(&6))
        .expect("the SYN")
        .clone();
    let packet = &syn[ETHERNET_HEADER_LEN..];
    // Type 1 (destination unreachable), code 3 (address unreachable).
    let unreachable = |quoted: &[u8]| router_error(1, 3, 0, quoted);
    let stale = not_in_flight(packet);
    receive(&mut a, &unreachable(&stale));
    assert_eq!(
        a.tcp_ref().status(c).unwrap().state,
        ustack::socket::tcp::State::SynSent
    );
    receive(&mut a, &unreachable(packet));
    let st = a.tcp_ref().status(c).unwrap();
    assert_eq!(
        (st.state, st.error),
        (
            ustack::socket::tcp::State::Closed,
            Some(ustack::socket::tcp::ConnError::HostUnreachable)
        )
    );
}

/// An ICMPv6 error of `kind` and `code` from PEER_ROUTER to PEER, its
/// second word `word` (packet too big: the MTU), quoting `quoted` (as
/// much as the minimum MTU holds).
fn router_error(kind: u8, code: u8, word: u32, quoted: &[u8]) -> Vec<u8> {
    let mut b = vec![kind, code, 0, 0];
    b.extend_from_slice(&word.to_be_bytes());
    b.extend_from_slice(&quoted[..quoted.len().min(1232)]);
    let mut frame = v6_frame_from(PEER, PEER_ROUTER, IpProtocol::Icmpv6, &b);
    let at = ETHERNET_HEADER_LEN + IPV6_HEADER_LEN;
    Icmpv6Packet::new_unchecked(&mut frame[at..]).fill_checksum(&PEER_ROUTER, &PEER);
    frame
}

/// The IPv6 TCP `packet` with a sequence number far from what is in
/// flight.
fn not_in_flight(packet: &[u8]) -> Vec<u8> {
    let mut stale = packet.to_vec();
    let seq = u32::from_be_bytes(stale[44..48].try_into().unwrap());
    stale[44..48].copy_from_slice(&seq.wrapping_sub(100_000).to_be_bytes());
    stale
}

/// A router beside PEER (its own address, PEER's MAC).
const PEER_ROUTER: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 0xfe);

// ------------------------------------------------- duplicate address detection

/// Probing at start sends a duplicate address detection probe for each
/// IPv6 address (from ::, to its solicited-node group, no link-layer
/// option); a host advertising one of them is recorded as the conflict.
#[test]
fn duplicate_address_detection_of_our_own_finds_the_holder() {
    let mut s = Stack::new(config());
    assert_eq!(s.addr_ref().conflict6(), None);
    s.addr().probe();
    let mut tx = VecTx::new();
    s.poll(T0, &mut tx);
    let mut probed = Vec::new();
    for f in &tx.frames {
        let eth = EthernetFrame::new_checked(&f[..]).unwrap();
        if eth.ethertype() != EthernetProtocol::Ipv6 {
            continue;
        }
        let ip = Ipv6Packet::new_checked(eth.payload()).unwrap();
        let (src, dst) = (ip.src_addr(), ip.dst_addr());
        let icmp = Icmpv6Packet::new_checked(ip.payload()).unwrap();
        match Icmpv6Repr::parse(&src, &dst, &icmp, &Default::default()).unwrap() {
            Icmpv6Repr::Ndisc(NdiscRepr::NeighborSolicit {
                target_addr,
                lladdr,
            }) => {
                assert_eq!(src, Ipv6Addr::UNSPECIFIED);
                assert_eq!(dst, solicited_node(target_addr));
                assert_eq!(eth.dst_addr(), multicast_mac(dst));
                assert_eq!(lladdr, None);
                probed.push(target_addr);
            }
            other => panic!("not a probe: {other:?}"),
        }
    }
    assert_eq!(probed, vec![link_local(host_mac(1)), GLOBAL]);
    assert_eq!(s.stats().ipv6.tx_dad_probes, 2);
    // The holder of GLOBAL answers to all-nodes, from GLOBAL (as Linux
    // does); other messages from our own address stay dropped.
    let echo = Icmpv6Repr::EchoRequest {
        ident: 1,
        seq_no: 1,
        data: b"me?",
    };
    receive(
        &mut s,
        &icmpv6_frame(host_mac(1), GLOBAL, GLOBAL, 64, &echo),
    );
    assert_eq!(drops(&s, DropReason::Ipv6BadSource), 1);
    let advert = Icmpv6Repr::Ndisc(NdiscRepr::NeighborAdvert {
        flags: NdiscNeighborFlags::OVERRIDE,
        target_addr: GLOBAL,
        lladdr: Some(RawHardwareAddress::from(peer_mac())),
    });
    receive(
        &mut s,
        &icmpv6_frame(multicast_mac(ALL_NODES), GLOBAL, ALL_NODES, 255, &advert),
    );
    assert_eq!(s.addr_ref().conflict6(), Some((GLOBAL, peer_mac())));
    assert_eq!(drops(&s, DropReason::NdpConflict), 1);
}

/// An address made from an advertised prefix that another host holds:
/// its advertisement in answer to our probe, or its own probe for the
/// same address, keeps the address from use (RFC 4862 §5.4.3-5); the
/// stack goes on with its other addresses.
#[test]
fn a_slaac_address_another_host_holds_is_not_used() {
    use std::time::Duration;
    let prefix = Ipv6Addr::new(0xfd88, 0, 0, 0, 0, 0, 0, 0);
    let mut slaac = link_local(host_mac(1)).octets();
    slaac[..8].copy_from_slice(&prefix.octets()[..8]);
    let slaac = Ipv6Addr::from(slaac);
    let group = solicited_node(slaac);
    let holder = |s: &mut Stack| {
        let na = Icmpv6Repr::Ndisc(NdiscRepr::NeighborAdvert {
            flags: NdiscNeighborFlags::OVERRIDE,
            target_addr: slaac,
            lladdr: Some(RawHardwareAddress::from(peer_mac())),
        });
        receive(
            s,
            &icmpv6_frame(multicast_mac(ALL_NODES), PEER, ALL_NODES, 255, &na),
        );
    };
    let prober = |s: &mut Stack| {
        let ns = solicit(slaac, None);
        let f = icmpv6_frame(multicast_mac(group), Ipv6Addr::UNSPECIFIED, group, 255, &ns);
        receive(s, &f);
    };
    let others: [&dyn Fn(&mut Stack); 2] = [&holder, &prober];
    for other in others {
        let mut s = Stack::new(config());
        let ra = router_advert(router_ll(), 1800, None, Some((prefix, 64, 3600)));
        receive(&mut s, &ra);
        let t = T0 + Duration::from_secs(2);
        polled_at(&mut s, t);
        other(&mut s);
        polled_at(&mut s, t + Duration::from_secs(2));
        assert!(!s.ipv6_addrs().contains(&slaac), "{:?}", s.ipv6_addrs());
        let st = s.stats().ipv6;
        assert_eq!((st.slaac_duplicates, st.slaac_addresses), (1, 0));
        // The stack itself carries on: no conflict of its own addresses.
        assert!(s.addr_ref().conflict6().is_none());
        assert!(s.ipv6_addrs().contains(&GLOBAL));
    }
}

// ---------------------------------------------------------- RoCEv2 over IPv6

/// A UD SEND to an IPv6 GID: after neighbor discovery it leaves as
/// `IPv6 (next header UDP) | UDP 4791, checksum 0 | BTH | DETH | ImmDt |
/// payload | ICRC`, the ICRC over the IPv6 masks; the receiver's
/// completion names the IPv6 sender and its GRH holds the IPv6 header, as
/// verbs gives it. A zero UDP checksum is taken only on the RoCEv2 port.
#[test]
fn roce_ud_over_ipv6_with_the_ipv6_header_as_grh() {
    use ustack::socket::ud::{GRH_LEN, QpConfig, SendWr, UdAddr, UdTransport, WcStatus};
    let (mut a, mut b) = pair();
    let qa = a.ud().create_qp(&QpConfig::new(0x1111)).unwrap();
    let mut qc = QpConfig::new(0x1111);
    qc.qpn = Some(0x77);
    let qb = b.ud().create_qp(&qc).unwrap();
    b.ud().post_recv(qb, 9, vec![0; GRH_LEN + 256]).unwrap();
    let data: Vec<u8> = (0..200u8).collect();
    let wr = SendWr {
        wr_id: 1,
        dest: UdAddr {
            ip: GLOBAL.into(),
            qpn: 0x77,
        },
        remote_qkey: 0x1111,
        imm: Some(0xfeed),
        solicited: false,
        data: &data,
    };
    a.ud().post_send(qa, &wr).unwrap();
    let ns = polled(&mut a);
    assert_eq!(ns.len(), 1, "the SEND waits for neighbor discovery");
    let na = deliver(&ns, &mut b);
    let sent = deliver(&na, &mut a);
    assert_eq!(sent.len(), 1);
    let eth = EthernetFrame::new_checked(&sent[0][..]).unwrap();
    assert_eq!(eth.ethertype(), EthernetProtocol::Ipv6);
    let ip6 = eth.payload();
    let pkt = Ipv6Packet::new_checked(ip6).unwrap();
    assert_eq!((pkt.src_addr(), pkt.dst_addr()), (PEER, GLOBAL));
    assert_eq!(pkt.next_header(), IpProtocol::Udp);
    assert_ne!(pkt.flow_label(), 0, "a flow label per QP pair");
    let udp = UdpPacket::new_checked(pkt.payload()).unwrap();
    assert_eq!(udp.dst_port(), ustack::wire::roce::ROCE_PORT);
    assert_eq!(udp.checksum(), 0);
    assert!(ustack::wire::roce::icrc_verify(ip6));
    assert_eq!(deliver(&sent, &mut b), Vec::<Vec<u8>>::new());
    let mut cq = Vec::new();
    b.ud().poll_cq(qb, T0, 8, &mut cq).unwrap();
    assert_eq!(cq.len(), 1);
    let c = &cq[0];
    assert_eq!(c.status, WcStatus::Success);
    assert_eq!(c.imm, Some(0xfeed));
    assert_eq!(c.payload(), &data[..]);
    let src = c.src.unwrap();
    assert_eq!((src.ip, src.qpn), (PEER.into(), a.ud().qp_num(qa).unwrap()));
    assert_eq!(&c.buf.as_ref().unwrap()[..GRH_LEN], &ip6[..GRH_LEN]);
    assert_eq!(b.stats().ud.rx_packets, 1);
    // One bit flipped in the payload: the ICRC catches it.
    let mut bad = sent[0].clone();
    let n = bad.len();
    bad[n - 10] ^= 1;
    b.ud().post_recv(qb, 10, vec![0; GRH_LEN + 256]).unwrap();
    deliver(&[bad], &mut b);
    assert_eq!(drops(&b, DropReason::UdBadIcrc), 1);
    // Any other UDP port over IPv6 still needs its checksum; port 4791
    // goes on to the RoCE checks (here: too short for a BTH).
    let mut h = Stack::new(config());
    h.udp().bind(7).unwrap();
    for (port, reason) in [
        (7u16, DropReason::UdpBadChecksum),
        (4791, DropReason::UdMalformed),
    ] {
        let mut u = udp6(b"plain");
        u[2..4].copy_from_slice(&port.to_be_bytes());
        u[6..8].fill(0);
        receive(&mut h, &v6_frame_from(GLOBAL, PEER, IpProtocol::Udp, &u));
        assert_eq!(drops(&h, reason), 1, "port {port}");
    }
}
