//! Software versions of what a NIC's offload engine does to TCP/IPv4
//! frames: cut a large segment into frames (TSO, or a GRO aggregate back
//! into segments), finish a checksum left partial, check one. The pcap
//! port uses them on what the kernel's offloads hand it; the sim port uses
//! them to play a NIC with offloads, so the engine's offload path is
//! tested end to end.

use core::net::Ipv4Addr;

use smoltcp::wire::{EthernetFrame, EthernetProtocol, IpProtocol, Ipv4Packet, TcpPacket};

use crate::wire::checksum;

/// Ethernet header length.
const ETH: usize = 14;

/// Cut a TCP/IPv4 aggregate larger than `mtu` (IP bytes) into frames that
/// fit, calling `emit` with each; returns how many, or `None` when `frame`
/// is no such aggregate (not IPv4/TCP, options in the IP header, a length
/// that disagrees with the frame, a fragment).
pub fn split_aggregate(frame: &[u8], mtu: usize, emit: impl FnMut(&[u8])) -> Option<usize> {
    let (ihl, thl) = tcp_headers(frame)?;
    let per = mtu.checked_sub(ihl + thl).filter(|&p| p > 0)?;
    split_tcp(frame, per, emit)
}

/// The IPv4 and TCP header lengths of a whole, unfragmented TCP/IPv4
/// frame whose IP length agrees with the frame's.
fn tcp_headers(frame: &[u8]) -> Option<(usize, usize)> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
    let total = usize::from(ip.total_len());
    if ip.next_header() != IpProtocol::Tcp
        || total != frame.len() - ETH
        || ip.more_frags()
        || ip.frag_offset() != 0
    {
        return None;
    }
    let tcp = TcpPacket::new_checked(ip.payload()).ok()?;
    Some((usize::from(ip.header_len()), usize::from(tcp.header_len())))
}

/// Cut a TCP/IPv4 frame into frames of `per` payload bytes each, as a
/// NIC's segmentation offload (TSO) does: headers copied, IPv4 length,
/// identification and checksum, TCP sequence number and checksum set per
/// frame, FIN and PSH on the last only. `None` when `frame` is no whole
/// TCP/IPv4 frame or its payload fits in one.
pub fn split_tcp(frame: &[u8], per: usize, mut emit: impl FnMut(&[u8])) -> Option<usize> {
    let (ihl, thl) = tcp_headers(frame)?;
    if per == 0 {
        return None;
    }
    let ip = Ipv4Packet::new_unchecked(&frame[ETH..]);
    let tcp = TcpPacket::new_unchecked(ip.payload());
    let payload = tcp.payload();
    if payload.len() <= per {
        return None;
    }
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    let (seq, id, fin, psh) = (tcp.seq_number(), ip.ident(), tcp.fin(), tcp.psh());
    let headers = ETH + ihl + thl;
    let mut buf = vec![0u8; headers + per];
    let mut count = 0;
    for (i, chunk) in payload.chunks(per).enumerate() {
        let last = (i + 1) * per >= payload.len();
        let len = headers + chunk.len();
        let out = &mut buf[..len];
        out[..headers].copy_from_slice(&frame[..headers]);
        out[headers..].copy_from_slice(chunk);
        {
            let mut ip = Ipv4Packet::new_unchecked(&mut out[ETH..]);
            ip.set_total_len(u16::try_from(len - ETH).ok()?);
            ip.set_ident(id.wrapping_add(i as u16));
            ip.fill_checksum();
        }
        let seg = &mut out[ETH + ihl..];
        let mut tcp = TcpPacket::new_unchecked(&mut *seg);
        tcp.set_seq_number(seq + i * per);
        // FIN and PSH belong to the aggregate's end.
        tcp.set_fin(fin && last);
        tcp.set_psh(psh && last);
        tcp.set_checksum(0);
        let c = checksum::compute(src, dst, u8::from(IpProtocol::Tcp), seg);
        TcpPacket::new_unchecked(&mut *seg).set_checksum(c);
        emit(out);
        count += 1;
    }
    Some(count)
}

/// The transport part of an IPv4 TCP or UDP frame: (protocol number,
/// source, destination, where the transport bytes start and end).
fn transport(frame: &[u8]) -> Option<(u8, Ipv4Addr, Ipv4Addr, usize, usize)> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
    let proto = ip.next_header();
    if !matches!(proto, IpProtocol::Tcp | IpProtocol::Udp)
        || ip.frag_offset() != 0
        || ip.more_frags()
    {
        return None;
    }
    let start = ETH + usize::from(ip.header_len());
    let end = ETH + usize::from(ip.total_len());
    if end > frame.len() || end < start + 8 {
        return None;
    }
    Some((u8::from(proto), ip.src_addr(), ip.dst_addr(), start, end))
}

/// Where the checksum field sits in a TCP or UDP header.
fn checksum_at(proto: u8) -> usize {
    if proto == u8::from(IpProtocol::Tcp) {
        16
    } else {
        6
    }
}

/// Whether `frame` is a TCP or UDP/IPv4 segment whose checksum field holds
/// the pseudo-header sum alone, as a sender with checksum offload leaves
/// it for the NIC (and a local peer hands it over as it is), and whose
/// real checksum does not verify.
pub fn is_partial_checksum(frame: &[u8]) -> bool {
    let Some((proto, src, dst, start, end)) = transport(frame) else {
        return false;
    };
    let seg = &frame[start..end];
    let at = checksum_at(proto);
    let got = u16::from_be_bytes([seg[at], seg[at + 1]]);
    got == checksum::fold(checksum::pseudo_header(src, dst, proto, seg.len()))
        && !checksum::verifies(src, dst, proto, seg)
}

/// Whether an IPv4 TCP/UDP frame's transport checksum verifies.
pub fn l4_checksum_ok(frame: &[u8]) -> bool {
    transport(frame).is_some_and(|(proto, src, dst, start, end)| {
        checksum::verifies(src, dst, proto, &frame[start..end])
    })
}

/// Finish a partial checksum in place (see [`is_partial_checksum`]).
pub fn complete_checksum(frame: &mut [u8]) {
    let Some((proto, src, dst, start, end)) = transport(frame) else {
        return;
    };
    let seg = &mut frame[start..end];
    let at = checksum_at(proto);
    seg[at..at + 2].fill(0);
    let mut c = checksum::compute(src, dst, proto, seg);
    if c == 0 && at == 6 {
        // UDP sends a computed zero as all ones (zero means "none").
        c = 0xffff;
    }
    seg[at..at + 2].copy_from_slice(&c.to_be_bytes());
}

/// What the port is asked to finish on one transmitted frame.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxOffload {
    /// Ethernet header bytes.
    pub l2_len: u8,
    /// IPv4 header bytes.
    pub l3_len: u8,
    /// TCP header bytes (options included).
    pub l4_len: u8,
    /// With TSO: the payload bytes of each frame the port cuts the segment
    /// into (0: the frame is one segment; only its checksums are left).
    pub tso_segsz: u16,
}

/// What the port found of a received frame's transport checksum.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RxChecksum {
    /// The port did not check (the engine verifies).
    #[default]
    Unknown,
    /// The port verified it.
    Good,
    /// The port found it wrong (the engine verifies again, and drops).
    Bad,
}
