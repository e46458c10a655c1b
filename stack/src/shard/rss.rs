//! Receive-side scaling: which queue (and so which core's stack) a frame
//! belongs to.
//!
//! The hash is Toeplitz, the one NICs compute, with a *symmetric* key (the
//! 16-bit pattern `0x6d5a` repeated): swapping source and destination
//! (addresses and ports) gives the same hash, so both directions of a flow
//! land on one queue. Non-fragmented TCP hashes the 4-tuple; every other IPv4
//! packet (UDP, ICMP, fragments) hashes the address pair only, so the pieces
//! of a fragmented datagram and a ping and its reply stay together. The
//! queue is `RETA[hash % 128]` with the table DPDK programs by default
//! (`RETA[i] = i % queues`), so the sim's software RSS and a NIC agree.
//!
//! Frames without an IPv4 header (ARP) have no queue of their own: a NIC
//! gives them to queue 0, and the shards replicate ARP to each other (see
//! [`crate::shard`]).

use core::net::{IpAddr, Ipv4Addr};

use smoltcp::wire::{
    EthernetFrame, EthernetProtocol, IpProtocol, Ipv4Packet, Ipv6Packet, TcpPacket,
};

/// The symmetric Toeplitz key (40 bytes, as NICs take it).
pub const SYMMETRIC_KEY: [u8; 40] = {
    let mut k = [0u8; 40];
    let mut i = 0;
    while i < 40 {
        k[i] = if i % 2 == 0 { 0x6d } else { 0x5a };
        i += 1;
    }
    k
};

/// Entries of the redirection table.
pub const RETA_SIZE: u32 = 128;

/// The Toeplitz hash of `input` under `key` (input at most `key.len() - 4` bytes).
pub fn toeplitz(key: &[u8], input: &[u8]) -> u32 {
    let bit = |idx: usize| -> u32 {
        key.get(idx / 8)
            .map_or(0, |b| u32::from(b >> (7 - idx % 8)) & 1)
    };
    // The 32-bit window of the key that lines up with the current input bit.
    let mut window = key
        .iter()
        .take(4)
        .fold(0u32, |acc, &b| (acc << 8) | u32::from(b));
    let mut hash = 0u32;
    for (i, byte) in input.iter().enumerate() {
        for b in 0..8 {
            if byte & (0x80 >> b) != 0 {
                hash ^= window;
            }
            window = (window << 1) | bit(i * 8 + b + 32);
        }
    }
    hash
}

/// The queue for `hash` among `queues` (the default redirection table).
pub fn queue_of_hash(hash: u32, queues: usize) -> usize {
    (hash % RETA_SIZE) as usize % queues.max(1)
}

/// Hash of a TCP flow (either direction gives the same value).
pub fn tcp_hash(src: Ipv4Addr, src_port: u16, dst: Ipv4Addr, dst_port: u16) -> u32 {
    let mut input = [0u8; 12];
    input[..4].copy_from_slice(&src.octets());
    input[4..8].copy_from_slice(&dst.octets());
    input[8..10].copy_from_slice(&src_port.to_be_bytes());
    input[10..].copy_from_slice(&dst_port.to_be_bytes());
    toeplitz(&SYMMETRIC_KEY, &input)
}

/// Hash of an address pair (non-TCP traffic and fragments).
pub fn ip_hash(src: Ipv4Addr, dst: Ipv4Addr) -> u32 {
    let mut input = [0u8; 8];
    input[..4].copy_from_slice(&src.octets());
    input[4..].copy_from_slice(&dst.octets());
    toeplitz(&SYMMETRIC_KEY, &input)
}

/// The queue of a TCP flow among `queues`.
pub fn tcp_queue(
    src: Ipv4Addr,
    src_port: u16,
    dst: Ipv4Addr,
    dst_port: u16,
    queues: usize,
) -> usize {
    queue_of_hash(tcp_hash(src, src_port, dst, dst_port), queues)
}

/// The RSS hash of a TCP flow of either family (IPv6's input is both
/// addresses then both ports, 36 bytes, as NICs take it).
pub fn tcp_hash_ip(src: IpAddr, src_port: u16, dst: IpAddr, dst_port: u16) -> u32 {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => tcp_hash(s, src_port, d, dst_port),
        (s, d) => {
            let mut input = [0u8; 36];
            input[..16].copy_from_slice(&v6_octets(s));
            input[16..32].copy_from_slice(&v6_octets(d));
            input[32..34].copy_from_slice(&src_port.to_be_bytes());
            input[34..].copy_from_slice(&dst_port.to_be_bytes());
            toeplitz(&SYMMETRIC_KEY, &input)
        }
    }
}

/// An address as IPv6 octets (an IPv4 one mapped).
fn v6_octets(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// The RSS hash of an IPv6 frame's payload (`None` for a runt).
fn frame_hash6(payload: &[u8]) -> Option<u32> {
    let ip = Ipv6Packet::new_checked(payload).ok()?;
    let (src, dst) = (IpAddr::V6(ip.src_addr()), IpAddr::V6(ip.dst_addr()));
    if ip.next_header() == IpProtocol::Tcp {
        if let Ok(tcp) = TcpPacket::new_checked(ip.payload()) {
            return Some(tcp_hash_ip(src, tcp.src_port(), dst, tcp.dst_port()));
        }
    }
    let mut input = [0u8; 32];
    input[..16].copy_from_slice(&v6_octets(src));
    input[16..].copy_from_slice(&v6_octets(dst));
    Some(toeplitz(&SYMMETRIC_KEY, &input))
}

/// The RSS hash of an Ethernet frame, or `None` when it carries no IP
/// header (ARP, other EtherTypes, runts).
pub fn frame_hash(frame: &[u8]) -> Option<u32> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() == EthernetProtocol::Ipv6 {
        return frame_hash6(eth.payload());
    }
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    let fragment = ip.more_frags() || ip.frag_offset() != 0;
    if ip.next_header() == IpProtocol::Tcp && !fragment {
        if let Ok(tcp) = TcpPacket::new_checked(ip.payload()) {
            return Some(tcp_hash(src, tcp.src_port(), dst, tcp.dst_port()));
        }
    }
    Some(ip_hash(src, dst))
}

/// The queue of a frame among `queues`; frames without IP go to queue 0.
pub fn frame_queue(frame: &[u8], queues: usize) -> usize {
    frame_hash(frame).map_or(0, |h| queue_of_hash(h, queues))
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;

    /// The key of Microsoft's RSS verification suite.
    const MS_KEY: [u8; 40] = [
        0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f,
        0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30,
        0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
    ];

    fn input(src: [u8; 4], dst: [u8; 4], ports: Option<(u16, u16)>) -> Vec<u8> {
        let mut v = [src, dst].concat();
        if let Some((s, d)) = ports {
            v.extend_from_slice(&s.to_be_bytes());
            v.extend_from_slice(&d.to_be_bytes());
        }
        v
    }

    #[test]
    fn matches_the_published_verification_vectors() {
        // (source, destination, source port, destination port, IPv4 hash, TCP hash)
        let cases = [
            (
                [66, 9, 149, 187],
                [161, 142, 100, 80],
                2794,
                1766,
                0x323e_8fc2,
                0x51cc_c178,
            ),
            (
                [199, 92, 111, 2],
                [65, 69, 140, 83],
                14230,
                4739,
                0xd718_262a,
                0xc626_b0ea,
            ),
            (
                [24, 19, 198, 95],
                [12, 22, 207, 184],
                12898,
                38024,
                0xd2d0_a5de,
                0x5c2b_394a,
            ),
            (
                [38, 27, 205, 30],
                [209, 142, 163, 6],
                48228,
                2217,
                0x8298_9176,
                0xafc7_327f,
            ),
            (
                [153, 39, 163, 191],
                [202, 188, 127, 2],
                44251,
                1303,
                0x5d18_09c5,
                0x10e8_28a2,
            ),
        ];
        for (src, dst, sp, dp, ip, tcp) in cases {
            assert_eq!(toeplitz(&MS_KEY, &input(src, dst, None)), ip, "{src:?}");
            assert_eq!(toeplitz(&MS_KEY, &input(src, dst, Some((sp, dp)))), tcp);
        }
    }

    #[test]
    fn arp_and_runts_go_to_queue_zero() {
        assert_eq!(frame_hash(&[0u8; 10]), None);
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(frame_queue(&arp, 4), 0);
    }

    #[test]
    fn queues_are_all_used() {
        let a = Ipv4Addr::new(10, 0, 0, 1);
        let b = Ipv4Addr::new(10, 0, 0, 2);
        let mut seen = [0u32; 4];
        for port in 40_000..41_000 {
            seen[tcp_queue(a, port, b, 5201, 4)] += 1;
        }
        assert!(seen.iter().all(|&n| n > 150), "{seen:?}");
    }

    proptest! {
        #[test]
        fn symmetric_both_ways(a in any::<u32>(), b in any::<u32>(), pa in any::<u16>(), pb in any::<u16>()) {
            let (a, b) = (Ipv4Addr::from(a), Ipv4Addr::from(b));
            prop_assert_eq!(tcp_hash(a, pa, b, pb), tcp_hash(b, pb, a, pa));
            prop_assert_eq!(ip_hash(a, b), ip_hash(b, a));
        }
    }
}
