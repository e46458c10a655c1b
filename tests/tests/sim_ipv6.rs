//! IPv6 below the transports, on raw frames: the link-local address made
//! from the MAC, neighbor solicitations answered (unicast, multicast, and
//! duplicate address detection), advertisements learnt, echo answered,
//! and what RFC 4861 and RFC 8200 say to drop, dropped with its counter.
//! Frames are built and parsed with smoltcp's wire types, not ours.

use std::net::Ipv6Addr;

use ustack::iface::ipv6::{ALL_NODES, link_local, multicast_mac, solicited_node};
use ustack::iface::ndp::NeighborState;
use ustack::phy::sim::{host_config, host_mac};
use ustack::stats::DropReason;
use ustack::wire::*;
use ustack::{Config, Instant, RxMeta, Stack, VecTx};

const T0: Instant = Instant::ZERO;
const GLOBAL: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 2);
const PEER: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 1);

fn peer_mac() -> EthernetAddress {
    host_mac(2)
}

fn config() -> Config {
    let mut cfg = host_config(1);
    cfg.announce = false;
    cfg.ipv6 = vec![Ipv6Cidr::new(GLOBAL, 64)];
    cfg
}

/// An Ethernet frame carrying `icmp` from `src` to `dst`.
fn icmpv6_frame(
    dst_mac: EthernetAddress,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    hop_limit: u8,
    icmp: &Icmpv6Repr<'_>,
) -> Vec<u8> {
    let ip = Ipv6Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: IpProtocol::Icmpv6,
        payload_len: icmp.buffer_len(),
        hop_limit,
    };
    let mut buf = vec![0u8; ETHERNET_HEADER_LEN + ip.buffer_len() + icmp.buffer_len()];
    let mut eth = EthernetFrame::new_unchecked(&mut buf[..]);
    EthernetRepr {
        src_addr: peer_mac(),
        dst_addr: dst_mac,
        ethertype: EthernetProtocol::Ipv6,
    }
    .emit(&mut eth);
    let mut pkt = Ipv6Packet::new_unchecked(eth.payload_mut());
    ip.emit(&mut pkt);
    icmp.emit(
        &src,
        &dst,
        &mut Icmpv6Packet::new_unchecked(pkt.payload_mut()),
        &smoltcp::phy::ChecksumCapabilities::default(),
    );
    buf
}

/// The one frame the stack sent, as (Ethernet dst, IPv6 src, IPv6 dst,
/// hop limit, ICMPv6 bytes).
fn only_reply(tx: &VecTx) -> (EthernetAddress, Ipv6Addr, Ipv6Addr, u8, Vec<u8>) {
    assert_eq!(tx.frames.len(), 1, "one reply expected: {:?}", tx.frames);
    let eth = EthernetFrame::new_checked(&tx.frames[0][..]).unwrap();
    assert_eq!(eth.ethertype(), EthernetProtocol::Ipv6);
    assert_eq!(eth.src_addr(), host_mac(1));
    let ip = Ipv6Packet::new_checked(eth.payload()).unwrap();
    assert_eq!(ip.next_header(), IpProtocol::Icmpv6);
    let icmp = Icmpv6Packet::new_checked(ip.payload()).unwrap();
    assert!(icmp.verify_checksum(&ip.src_addr(), &ip.dst_addr()));
    (
        eth.dst_addr(),
        ip.src_addr(),
        ip.dst_addr(),
        ip.hop_limit(),
        ip.payload().to_vec(),
    )
}

fn receive(s: &mut Stack, frame: &[u8]) -> VecTx {
    let mut tx = VecTx::new();
    s.receive(T0, frame, RxMeta::default(), &mut tx);
    tx
}

fn drops(s: &Stack, r: DropReason) -> u64 {
    s.stats().drops.get(r)
}

fn solicit(target: Ipv6Addr, lladdr: Option<EthernetAddress>) -> Icmpv6Repr<'static> {
    Icmpv6Repr::Ndisc(NdiscRepr::NeighborSolicit {
        target_addr: target,
        lladdr: lladdr.map(RawHardwareAddress::from),
    })
}

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
