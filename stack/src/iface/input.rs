//! The receive path below the transports: an Ethernet frame checked and
//! demultiplexed, ARP answered, an IPv4 header validated and fragments
//! reassembled; IPv6 goes to [`crate::iface::ipv6`]. What is left for the transports comes back as an
//! [`IpIn`]; every refusal is one [`DropReason`].

use smoltcp::wire::{
    ETHERNET_HEADER_LEN as ETH_LEN, EthernetFrame, EthernetProtocol, IPV4_HEADER_LEN as IP_LEN,
    Ipv4Packet,
};

use crate::iface::frag::{FragKey, Reassembler};
use crate::iface::link::{IpMeta, Link, ipv4_checksum_ok};
pub(crate) use crate::iface::received::IpIn;
use crate::iface::received::Whole;
use crate::phy::device::{RxMeta, RxRole, Tx};
use crate::stats::DropReason;
use crate::time::Instant;

/// Check an Ethernet frame for us, answer or learn from ARP, and pass an
/// IPv4 packet on to [`ipv4`].
pub(crate) fn ethernet<'a, T: Tx>(
    link: &mut Link,
    frags: &mut Reassembler,
    now: Instant,
    frame: &'a [u8],
    rx: RxMeta,
    tx: &mut T,
) -> Result<IpIn<'a>, DropReason> {
    let eth = EthernetFrame::new_checked(frame).map_err(|_| DropReason::EthTruncated)?;
    if frame.len() > ETH_LEN + link.cfg.mtu
        && !(link.offloads.rx_large && frame.len() <= ETH_LEN + usize::from(u16::MAX))
    {
        return Err(DropReason::EthOversize);
    }
    let dst = eth.dst_addr();
    if dst != link.cfg.mac && !dst.is_broadcast() && !link.ip6.accepts_mac(dst) {
        return Err(DropReason::EthNotForUs);
    }
    if !eth.src_addr().is_unicast() {
        return Err(DropReason::EthBadSource);
    }
    let payload = &frame[ETH_LEN..];
    match eth.ethertype() {
        EthernetProtocol::Arp => {
            let replica = rx.role == RxRole::Replica;
            link.receive_arp(now, payload, replica, tx)?;
            Ok(IpIn::Done)
        }
        EthernetProtocol::Ipv4 => ipv4(link, frags, now, payload, rx),
        EthernetProtocol::Ipv6 if link.ip6.enabled() => {
            crate::iface::ipv6::ipv6(link, frags, now, eth.src_addr(), payload, rx, tx)
        }
        _ => Err(DropReason::EthUnknownType),
    }
}

/// Validate an IPv4 packet (RFC 1122 3.2.1: version, lengths, checksum,
/// addressed to us, a source that can be a host) and reassemble fragments.
pub(crate) fn ipv4<'a>(
    link: &mut Link,
    frags: &mut Reassembler,
    now: Instant,
    payload: &'a [u8],
    rx: RxMeta,
) -> Result<IpIn<'a>, DropReason> {
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
    if !ipv4_checksum_ok(&payload[..hl]) {
        return Err(DropReason::Ipv4BadChecksum);
    }
    let (src, dst) = (pkt.src_addr(), pkt.dst_addr());
    let me = link.ip();
    let subnet_broadcast = link.subnet_broadcast();
    let broadcast = dst.is_broadcast() || Some(dst) == subnet_broadcast;
    if dst != me && !broadcast {
        return Err(DropReason::Ipv4NotForUs);
    }
    if src.is_broadcast()
        || src.is_multicast()
        || src.is_unspecified()
        || src == me
        || Some(src) == subnet_broadcast
    {
        return Err(DropReason::Ipv4BadSource);
    }
    link.stats.ipv4.rx_packets += 1;
    link.stats.ipv4.rx_bytes += tl as u64;
    let meta = IpMeta {
        src: src.into(),
        dst: dst.into(),
        protocol: pkt.next_header(),
        ttl: pkt.hop_limit(),
        broadcast,
        header: &payload[..hl],
        rx,
    };
    let body = &payload[hl..tl];
    if !pkt.more_frags() && pkt.frag_offset() == 0 {
        return Ok(IpIn::Datagram {
            meta,
            body,
            packet: &payload[..tl],
        });
    }
    link.stats.ipv4.rx_fragments += 1;
    let key = FragKey {
        src: src.into(),
        dst: dst.into(),
        ident: u32::from(pkt.ident()),
        protocol: meta.protocol.into(),
    };
    let offset = usize::from(pkt.frag_offset());
    match frags.insert(now, key, offset, pkt.more_frags(), meta.header, body)? {
        None => Ok(IpIn::Done),
        Some(datagram) => {
            link.stats.ipv4.reassembled += 1;
            Ok(IpIn::Reassembled(Whole::new(datagram, broadcast, rx)))
        }
    }
}
