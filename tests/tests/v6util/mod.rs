//! Frames for the IPv6 sim tests, built with smoltcp's wire types (not
//! ours): ICMPv6, UDP, extension headers and fragments between `PEER`
//! (sim host 2's MAC) and a stack on `GLOBAL` (sim host 1).
#![allow(dead_code)]

use std::net::Ipv6Addr;

use smoltcp::wire::{NdiscPrefixInfoFlags, NdiscPrefixInformation, NdiscRouterFlags};
use ustack::iface::ipv6::{ALL_NODES, link_local, multicast_mac};
use ustack::sim::{host_config, host_mac};
use ustack::stats::DropReason;
use ustack::wire::*;
use ustack::{Config, Instant, RxMeta, Stack, VecTx};

pub const T0: Instant = Instant::ZERO;
pub const GLOBAL: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 2);
pub const PEER: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 1);

pub fn peer_mac() -> EthernetAddress {
    host_mac(2)
}

pub fn config() -> Config {
    let mut cfg = host_config(1);
    cfg.announce = false;
    cfg.ipv6 = vec![Ipv6Cidr::new(GLOBAL, 64)];
    cfg
}

/// An Ethernet frame carrying `icmp` from `src` to `dst`.
pub fn icmpv6_frame(
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

pub fn receive(s: &mut Stack, frame: &[u8]) -> VecTx {
    let mut tx = VecTx::new();
    s.receive(T0, frame, RxMeta::default(), &mut tx);
    tx
}

pub fn drops(s: &Stack, r: DropReason) -> u64 {
    s.stats().drops.get(r)
}

/// A frame from PEER (host 2's MAC) to GLOBAL carrying `chain` (extension
/// headers, the first of type `first`, their next-header bytes as given)
/// and then `upper`.
pub fn v6_frame(first: IpProtocol, chain: &[u8], upper: &[u8]) -> Vec<u8> {
    v6_frame_from(GLOBAL, PEER, first, &[chain, upper].concat())
}

/// A UDP datagram from PEER:4000 to GLOBAL:7 with its IPv6 checksum.
pub fn udp6(data: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 8 + data.len()];
    UdpRepr {
        src_port: 4000,
        dst_port: 7,
    }
    .emit(
        &mut UdpPacket::new_unchecked(&mut b[..]),
        &IpAddress::Ipv6(PEER),
        &IpAddress::Ipv6(GLOBAL),
        data.len(),
        |p| p.copy_from_slice(data),
        &smoltcp::phy::ChecksumCapabilities::default(),
    );
    b
}

/// An options header (hop-by-hop or destination) whose next header is
/// `next`, holding `opts` padded to 8 bytes with PadN.
pub fn opts_header(next: IpProtocol, opts: &[u8]) -> Vec<u8> {
    let mut h = vec![u8::from(next), 0];
    h.extend_from_slice(opts);
    let pad = (8 - h.len() % 8) % 8;
    match pad {
        0 => {}
        1 => h.push(0),
        n => {
            h.extend_from_slice(&[1, (n - 2) as u8]);
            h.resize(h.len() + n - 2, 0);
        }
    }
    h[1] = (h.len() / 8 - 1) as u8;
    h
}

/// A fragment header: next header `next`, `offset` (bytes, a multiple
/// of 8), more-fragments `more`, identification `id`.
pub fn frag_header(next: IpProtocol, offset: usize, more: bool, id: u32) -> Vec<u8> {
    let mut h = vec![u8::from(next), 0];
    h.extend_from_slice(&((offset as u16) | u16::from(more)).to_be_bytes());
    h.extend_from_slice(&id.to_be_bytes());
    h
}

/// The one frame the stack sent, as (Ethernet dst, IPv6 src, IPv6 dst,
/// hop limit, ICMPv6 bytes).
pub fn only_reply(tx: &VecTx) -> (EthernetAddress, Ipv6Addr, Ipv6Addr, u8, Vec<u8>) {
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

/// Frames polled out of `s` at `now`.
pub fn polled_at(s: &mut Stack, now: Instant) -> Vec<Vec<u8>> {
    let mut tx = VecTx::new();
    s.poll(now, &mut tx);
    tx.frames
}

/// The IPv6 destination and Ethernet destination of `frame`.
pub fn v6_dst(frame: &[u8]) -> (EthernetAddress, Ipv6Addr) {
    let eth = EthernetFrame::new_checked(frame).unwrap();
    let ip = Ipv6Packet::new_checked(eth.payload()).unwrap();
    (eth.dst_addr(), ip.dst_addr())
}

pub fn solicit(target: Ipv6Addr, lladdr: Option<EthernetAddress>) -> Icmpv6Repr<'static> {
    Icmpv6Repr::Ndisc(NdiscRepr::NeighborSolicit {
        target_addr: target,
        lladdr: lladdr.map(RawHardwareAddress::from),
    })
}

/// The router of these tests: its link-local address (host 2's MAC).
pub fn router_ll() -> Ipv6Addr {
    link_local(peer_mac())
}

/// A router advertisement from `router` (at the peer's MAC) with
/// `lifetime` seconds as default router, an MTU, and one prefix.
pub fn router_advert(
    router: Ipv6Addr,
    lifetime: u64,
    mtu: Option<u32>,
    prefix: Option<(Ipv6Addr, u8, u32)>,
) -> Vec<u8> {
    use smoltcp::time::Duration as D;
    let ra = Icmpv6Repr::Ndisc(NdiscRepr::RouterAdvert {
        hop_limit: 64,
        flags: NdiscRouterFlags::empty(),
        router_lifetime: D::from_secs(lifetime),
        reachable_time: D::from_millis(0),
        retrans_time: D::from_millis(0),
        lladdr: Some(RawHardwareAddress::from(peer_mac())),
        mtu,
        prefix_info: prefix.map(|(p, len, valid)| NdiscPrefixInformation {
            prefix_len: len,
            flags: NdiscPrefixInfoFlags::ON_LINK | NdiscPrefixInfoFlags::ADDRCONF,
            valid_lifetime: D::from_secs(u64::from(valid)),
            preferred_lifetime: D::from_secs(u64::from(valid / 2)),
            prefix: p,
        }),
    });
    icmpv6_frame(multicast_mac(ALL_NODES), router, ALL_NODES, 255, &ra)
}

/// A frame from `src` (PEER's MAC) to `dst` (host 1's MAC) carrying
/// `payload` as `next`, hop limit 64.
pub fn v6_frame_from(dst: Ipv6Addr, src: Ipv6Addr, next: IpProtocol, payload: &[u8]) -> Vec<u8> {
    let ip = Ipv6Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: next,
        payload_len: payload.len(),
        hop_limit: 64,
    };
    let mut buf = vec![0u8; ETHERNET_HEADER_LEN + ip.buffer_len() + payload.len()];
    let mut eth = EthernetFrame::new_unchecked(&mut buf[..]);
    EthernetRepr {
        src_addr: peer_mac(),
        dst_addr: host_mac(1),
        ethertype: EthernetProtocol::Ipv6,
    }
    .emit(&mut eth);
    let mut pkt = Ipv6Packet::new_unchecked(eth.payload_mut());
    ip.emit(&mut pkt);
    pkt.payload_mut().copy_from_slice(payload);
    buf
}
