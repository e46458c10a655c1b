//! IPv6 below the transports (RFC 8200): our addresses (`Ipv6Iface`:
//! the link-local one made from the MAC, RFC 4291 Appendix A, and the
//! configured ones), the receive path (header validated, addressed to us
//! or to a group we are in), ICMPv6 echo answered (RFC 4443 §4) and
//! neighbor discovery (RFC 4861): solicitations for our addresses
//! answered, the senders learnt in the neighbor cache ([`crate::iface::ndp`]).
//!
//! What comes next (issue 35): extension headers and fragments, TCP and
//! UDP over IPv6, router discovery and SLAAC, duplicate address
//! detection, MLD. Until then a packet for another next header is counted
//! and dropped.

use core::net::Ipv6Addr;

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    ETHERNET_HEADER_LEN as ETH_LEN, EthernetAddress, EthernetProtocol, IPV6_HEADER_LEN,
    Icmpv6Packet, Icmpv6Repr, IpProtocol, Ipv6Cidr, Ipv6Packet, Ipv6Repr, NdiscNeighborFlags,
    NdiscRepr, RawHardwareAddress,
};

use crate::iface::link::{Link, write_eth};
use crate::iface::ndp::Neighbors;
use crate::phy::device::{RxMeta, Tx};
use crate::stats::DropReason;
use crate::time::Instant;

/// All-nodes multicast (RFC 4291 §2.7.1).
pub const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// Hop limit of the packets we originate.
const HOP_LIMIT: u8 = 64;

/// Our IPv6 addresses and neighbors.
#[derive(Debug, Default)]
pub(crate) struct Ipv6Iface {
    /// Our unicast addresses, the link-local one first; empty when IPv6
    /// is off (no address configured).
    addrs: Vec<Ipv6Cidr>,
    pub(crate) neighbors: Neighbors,
}

impl Ipv6Iface {
    /// IPv6 with the link-local address made from `mac` and `configured`;
    /// off when `configured` is empty.
    pub(crate) fn new(mac: EthernetAddress, configured: &[Ipv6Cidr]) -> Self {
        if configured.is_empty() {
            return Ipv6Iface::default();
        }
        let ll = Ipv6Cidr::new(link_local(mac), 64);
        let mut addrs = vec![ll];
        addrs.extend(configured.iter().filter(|c| c.address() != ll.address()));
        Ipv6Iface {
            addrs,
            neighbors: Neighbors::default(),
        }
    }

    /// Whether IPv6 is on.
    pub(crate) fn enabled(&self) -> bool {
        !self.addrs.is_empty()
    }

    /// Our unicast addresses, the link-local one first.
    pub(crate) fn addrs(&self) -> impl Iterator<Item = Ipv6Addr> + '_ {
        self.addrs.iter().map(|c| c.address())
    }

    fn is_ours(&self, a: &Ipv6Addr) -> bool {
        self.addrs().any(|m| m == *a)
    }

    /// Whether we take packets to `dst`: one of our addresses, all-nodes,
    /// or the solicited-node group of one of them.
    fn accepts(&self, dst: &Ipv6Addr) -> bool {
        *dst == ALL_NODES || self.addrs().any(|m| m == *dst || solicited_node(m) == *dst)
    }

    /// Whether a frame to the multicast MAC `mac` is for a group we are in
    /// (RFC 2464 §7: 33:33 and the group's low 32 bits).
    pub(crate) fn accepts_mac(&self, mac: EthernetAddress) -> bool {
        self.enabled()
            && (mac == multicast_mac(ALL_NODES)
                || self
                    .addrs()
                    .any(|m| mac == multicast_mac(solicited_node(m))))
    }
}

/// The link-local address of a MAC (RFC 4291 Appendix A: modified EUI-64).
pub fn link_local(mac: EthernetAddress) -> Ipv6Addr {
    let m = mac.0;
    Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        m[0] ^ 0x02,
        m[1],
        m[2],
        0xff,
        0xfe,
        m[3],
        m[4],
        m[5],
    ])
}

/// The solicited-node multicast group of an address (RFC 4291 §2.7.1).
pub fn solicited_node(a: Ipv6Addr) -> Ipv6Addr {
    let o = a.octets();
    Ipv6Addr::from([
        0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, o[13], o[14], o[15],
    ])
}

/// The Ethernet group address of an IPv6 multicast group (RFC 2464 §7).
pub fn multicast_mac(group: Ipv6Addr) -> EthernetAddress {
    let o = group.octets();
    EthernetAddress([0x33, 0x33, o[12], o[13], o[14], o[15]])
}

/// Validate an IPv6 packet (RFC 8200 §3: version, payload length within
/// the frame, addressed to us, a source that can be a host) and hand its
/// ICMPv6 to [`icmpv6`]. `eth_src` is the frame's sender.
pub(crate) fn ipv6<T: Tx>(
    link: &mut Link,
    now: Instant,
    eth_src: EthernetAddress,
    payload: &[u8],
    rx: RxMeta,
    tx: &mut T,
) -> Result<(), DropReason> {
    let _ = rx;
    if payload.len() < IPV6_HEADER_LEN {
        return Err(DropReason::Ipv6Truncated);
    }
    let pkt = Ipv6Packet::new_unchecked(payload);
    if pkt.version() != 6 {
        return Err(DropReason::Ipv6BadVersion);
    }
    let end = IPV6_HEADER_LEN + usize::from(pkt.payload_len());
    if end > payload.len() {
        return Err(DropReason::Ipv6BadLength);
    }
    let (src, dst) = (pkt.src_addr(), pkt.dst_addr());
    if !link.ip6.accepts(&dst) {
        return Err(DropReason::Ipv6NotForUs);
    }
    if src.is_multicast() || link.ip6.is_ours(&src) || src.is_loopback() {
        return Err(DropReason::Ipv6BadSource);
    }
    link.stats.ipv6.rx_packets += 1;
    link.stats.ipv6.rx_bytes += end as u64;
    let body = &payload[IPV6_HEADER_LEN..end];
    match pkt.next_header() {
        IpProtocol::Icmpv6 => icmpv6(link, now, eth_src, &pkt, body, tx),
        _ => Err(DropReason::Ipv6UnknownNextHeader),
    }
}

/// Answer an echo request; answer a neighbor solicitation for one of our
/// addresses and learn its sender; learn from an advertisement.
fn icmpv6<T: Tx>(
    link: &mut Link,
    now: Instant,
    eth_src: EthernetAddress,
    ip: &Ipv6Packet<&[u8]>,
    body: &[u8],
    tx: &mut T,
) -> Result<(), DropReason> {
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    let packet = Icmpv6Packet::new_checked(body).map_err(|_| DropReason::Icmpv6Malformed)?;
    if !packet.verify_checksum(&src, &dst) {
        return Err(DropReason::Icmpv6BadChecksum);
    }
    let caps = ChecksumCapabilities::ignored();
    let repr =
        Icmpv6Repr::parse(&src, &dst, &packet, &caps).map_err(|_| DropReason::Icmpv6Malformed)?;
    match repr {
        Icmpv6Repr::EchoRequest {
            ident,
            seq_no,
            data,
        } => {
            link.stats.ipv6.rx_echo_requests += 1;
            if src.is_unspecified() {
                return Err(DropReason::Ipv6BadSource);
            }
            if dst.is_multicast() {
                // Linux answers pings to all-nodes only when asked to
                // (`icmp_echo_ignore_multicast` is on by default).
                return Err(DropReason::Icmpv6Unhandled);
            }
            let reply = Icmpv6Repr::EchoReply {
                ident,
                seq_no,
                data,
            };
            let mac = link.ip6.neighbors.lookup(&src).unwrap_or(eth_src);
            if send_icmpv6(link, tx, mac, dst, src, HOP_LIMIT, &reply) {
                link.stats.ipv6.tx_echo_replies += 1;
            }
            Ok(())
        }
        Icmpv6Repr::Ndisc(nd) => ndisc(link, now, eth_src, ip, nd, tx),
        _ => Err(DropReason::Icmpv6Unhandled),
    }
}

/// Neighbor discovery (RFC 4861 §7.1: hop limit 255, code 0; §7.2).
fn ndisc<T: Tx>(
    link: &mut Link,
    now: Instant,
    eth_src: EthernetAddress,
    ip: &Ipv6Packet<&[u8]>,
    nd: NdiscRepr<'_>,
    tx: &mut T,
) -> Result<(), DropReason> {
    if ip.hop_limit() != 255 {
        return Err(DropReason::NdpInvalid);
    }
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    let mac_of = |ll: Option<RawHardwareAddress>| -> Result<Option<EthernetAddress>, DropReason> {
        match ll {
            None => Ok(None),
            Some(raw) if raw.len() == 6 => {
                let mac = EthernetAddress::from_bytes(raw.as_bytes());
                if mac.is_unicast() {
                    Ok(Some(mac))
                } else {
                    Err(DropReason::NdpInvalid)
                }
            }
            Some(_) => Err(DropReason::NdpInvalid),
        }
    };
    match nd {
        NdiscRepr::NeighborSolicit {
            target_addr,
            lladdr,
        } => {
            link.stats.ipv6.rx_neighbor_solicits += 1;
            let lladdr = mac_of(lladdr)?;
            if target_addr.is_multicast() {
                return Err(DropReason::NdpInvalid);
            }
            // From the unspecified address (duplicate address detection):
            // to the solicited-node group, and no link-layer option.
            let dad = src.is_unspecified();
            if dad && (lladdr.is_some() || !dst.is_multicast()) {
                return Err(DropReason::NdpInvalid);
            }
            if !link.ip6.is_ours(&target_addr) {
                return Err(DropReason::NdpNotForUs);
            }
            if let (false, Some(mac)) = (dad, lladdr) {
                link.ip6.neighbors.learn(now, src, mac, false, true);
            }
            let (to, to_mac, flags) = if dad {
                (
                    ALL_NODES,
                    multicast_mac(ALL_NODES),
                    NdiscNeighborFlags::OVERRIDE,
                )
            } else {
                (
                    src,
                    lladdr.unwrap_or(eth_src),
                    NdiscNeighborFlags::SOLICITED | NdiscNeighborFlags::OVERRIDE,
                )
            };
            let advert = Icmpv6Repr::Ndisc(NdiscRepr::NeighborAdvert {
                flags,
                target_addr,
                lladdr: Some(RawHardwareAddress::from(link.cfg.mac)),
            });
            if send_icmpv6(link, tx, to_mac, target_addr, to, 255, &advert) {
                link.stats.ipv6.tx_neighbor_adverts += 1;
            }
            Ok(())
        }
        NdiscRepr::NeighborAdvert {
            flags,
            target_addr,
            lladdr,
        } => {
            link.stats.ipv6.rx_neighbor_adverts += 1;
            let lladdr = mac_of(lladdr)?;
            let solicited = flags.contains(NdiscNeighborFlags::SOLICITED);
            if target_addr.is_multicast() || (solicited && dst.is_multicast()) {
                return Err(DropReason::NdpInvalid);
            }
            if link.ip6.is_ours(&target_addr) {
                // Another host claims our address (RFC 4862 §5.4.4).
                return Err(DropReason::NdpConflict);
            }
            let Some(mac) = lladdr.or(Some(eth_src)) else {
                return Ok(());
            };
            let overrides = flags.contains(NdiscNeighborFlags::OVERRIDE);
            link.ip6
                .neighbors
                .learn(now, target_addr, mac, solicited, overrides);
            Ok(())
        }
        _ => Err(DropReason::Icmpv6Unhandled),
    }
}

/// Write an ICMPv6 message from `src` to `dst` (at `mac`) and send it.
fn send_icmpv6<T: Tx>(
    link: &mut Link,
    tx: &mut T,
    mac: EthernetAddress,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    hop_limit: u8,
    repr: &Icmpv6Repr<'_>,
) -> bool {
    let ip = Ipv6Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: IpProtocol::Icmpv6,
        payload_len: repr.buffer_len(),
        hop_limit,
    };
    let len = ETH_LEN + ip.buffer_len() + repr.buffer_len();
    let me = link.cfg.mac;
    let sent = tx.send(len, |buf| {
        write_eth(buf, me, mac, EthernetProtocol::Ipv6);
        let mut pkt = Ipv6Packet::new_unchecked(&mut buf[ETH_LEN..]);
        ip.emit(&mut pkt);
        let mut icmp = Icmpv6Packet::new_unchecked(pkt.payload_mut());
        repr.emit(&src, &dst, &mut icmp, &ChecksumCapabilities::default());
    });
    if sent {
        link.stats.ipv6.tx_packets += 1;
        link.stats.eth.tx_frames += 1;
        link.stats.eth.tx_bytes += len as u64;
    }
    sent
}
