//! IPv6 below the transports (RFC 8200), on our addresses
//! (`iface/ipv6_iface.rs`): the receive path (header validated,
//! addressed to us or to a group we are in, extension headers walked,
//! fragments joined), ICMPv6 echo answered (RFC 4443 §4), neighbor
//! discovery (RFC 4861: solicitations for our addresses answered, the
//! senders learnt in the neighbor cache, [`crate::iface::ndp`]; neighbors
//! we send to solicited), router discovery (solicitations at start,
//! advertisements learnt by `router.rs`: default routers, on-link
//! prefixes, the MTU, SLAAC addresses), the transmit path (the next hop
//! by prefix or router, fragments above the MTU, packets held for a
//! neighbor) and port unreachable.
//!
//! Duplicate address detection of our own addresses: a probe per address
//! when the link probes at start, a holder's advertisement recorded.
//!
//! Errors we send (RFC 4443 §2.4, rate-limited, never about a packet from
//! an unspecified source): port unreachable, parameter problem (an
//! unknown next header, option or routing header, pointing at the byte),
//! time exceeded when a datagram's fragments do not all come in time.
//! Packets we originate over TCP and UDP carry a flow label per flow
//! (RFC 6437).

pub use crate::iface::ipv6_iface::{
    ALL_NODES, ALL_ROUTERS, MAX_PATH_MTUS, MAX_PREFIXES, MAX_REDIRECTS, MAX_ROUTERS, link_local,
    multicast_mac, solicited_node,
};

use core::net::{Ipv6Addr, SocketAddr};

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    ETHERNET_HEADER_LEN as ETH_LEN, EthernetAddress, EthernetProtocol, IPV6_HEADER_LEN,
    Icmpv6DstUnreachable, Icmpv6Packet, Icmpv6Repr, IpProtocol, Ipv6Packet, Ipv6Repr, MldRepr,
    NdiscNeighborFlags, NdiscRepr, RawHardwareAddress,
};

use crate::error::{ConnError, Error};
use crate::iface::frag::{FragKey, Reassembler};
use crate::iface::ipv6_iface::{MIN_MTU, RTR_SOLICITATION_INTERVAL, Route};
use crate::iface::link::{IpMeta, Link, write_eth};
use crate::iface::mld;
pub(crate) use crate::iface::received::TooBig;
use crate::iface::received::{IpIn, Whole};
use crate::iface::resolve::Enqueue;
use crate::phy::device::{RxMeta, Tx};
use crate::stats::DropReason;
use crate::time::Instant;

/// ICMPv6 echo reply (RFC 4443 §4.2).
const ECHO_REPLY: u8 = 129;

/// Hop limit of the packets we originate.
const HOP_LIMIT: u8 = 64;

/// The TCP segment an ICMPv6 error quotes (`header`, then `data` from the
/// TCP header on), when it is ours: its port, peer and sequence number.
fn quoted_tcp(link: &Link, header: &Ipv6Repr, data: &[u8]) -> Option<(u16, SocketAddr, u32)> {
    if !link.ip6.is_ours(&header.src_addr)
        || header.next_header != IpProtocol::Tcp
        || data.len() < 8
    {
        return None;
    }
    let port = |i: usize| u16::from_be_bytes([data[i], data[i + 1]]);
    let seq = u32::from_be_bytes([data[4], data[5], data[6], data[7]]);
    Some((
        port(0),
        SocketAddr::new(header.dst_addr.into(), port(2)),
        seq,
    ))
}

/// Most extension headers a packet may carry before its upper layer:
/// a longer chain is dropped (bounded work per packet).
const MAX_EXTENSION_HEADERS: usize = 8;

/// Where a walk over extension headers ended: the next header that is
/// none of those it passes over, where it starts, and where the byte
/// naming it is (what a parameter problem about it points at).
#[derive(Debug, Clone, Copy)]
struct Walked {
    next: IpProtocol,
    at: usize,
    named_at: usize,
}

/// Why a packet's extension headers refused it: the drop, and the
/// parameter problem owed to its sender, if any, with whether it is owed
/// even for a packet to a multicast group (RFC 4443 §2.4 (e.3)).
#[derive(Debug, Clone, Copy)]
struct Refused {
    reason: DropReason,
    problem: Option<(Icmpv6Error, bool)>,
}

impl From<DropReason> for Refused {
    fn from(reason: DropReason) -> Self {
        Refused {
            reason,
            problem: None,
        }
    }
}

/// Walk extension headers (RFC 8200 §4) from `next`, whose header starts
/// at `at` in `p` and is named by the byte at `named_at`: hop-by-hop
/// options only first (`first`), destination options and a routing
/// header with no segments left passed over, their options checked
/// ([`options`]). Returns the next header that is not one of these (the
/// upper layer, or a fragment header). A routing header with segments
/// left is refused: a host does not forward (RFC 8200 §4.4; type 0 is
/// deprecated by RFC 5095), and its sender is told with a parameter
/// problem pointing at the routing type, as Linux does.
fn walk(p: &[u8], mut w: Walked, first: bool) -> Result<Walked, Refused> {
    for i in 0..MAX_EXTENSION_HEADERS {
        match w.next {
            next if is_extension(next) => {
                if w.next == IpProtocol::HopByHop && !(first && i == 0) {
                    return Err(Refused {
                        reason: DropReason::Ipv6BadExtension,
                        problem: Some((Icmpv6Error::parameter_problem(1, w.named_at), false)),
                    });
                }
                let len = p
                    .get(w.at + 1)
                    .map(|&l| (usize::from(l) + 1) * 8)
                    .ok_or(DropReason::Ipv6BadExtension)?;
                let h = p
                    .get(w.at..w.at + len)
                    .ok_or(DropReason::Ipv6BadExtension)?;
                if w.next == IpProtocol::Ipv6Route {
                    if h[3] != 0 {
                        return Err(Refused {
                            reason: DropReason::Ipv6RoutingHeader,
                            problem: Some((Icmpv6Error::parameter_problem(0, w.at + 2), false)),
                        });
                    }
                } else {
                    options(&h[2..], w.at + 2)?;
                }
                w = Walked {
                    next: IpProtocol::from(h[0]),
                    named_at: w.at,
                    at: w.at + len,
                };
            }
            _ => return Ok(w),
        }
    }
    Err(DropReason::Ipv6BadExtension.into())
}

/// Whether `next` names one of the extension headers [`walk`] steps over.
fn is_extension(next: IpProtocol) -> bool {
    matches!(
        next,
        IpProtocol::HopByHop | IpProtocol::Ipv6Opts | IpProtocol::Ipv6Route
    )
}

/// Check the options of a hop-by-hop or destination options header (RFC
/// 8200 §4.2), which start at byte `base` of the packet: padding skipped,
/// an unknown option whose type's two high bits are 00 skipped, any
/// other unknown option discards the packet; for 10 and 11 its sender is
/// told with a parameter problem pointing at the option (for 11 only
/// when the packet was not sent to a group).
fn options(o: &[u8], base: usize) -> Result<(), Refused> {
    let mut pos = 0;
    while let Some(&kind) = o.get(pos) {
        if kind == 0 {
            // Pad1.
            pos += 1;
            continue;
        }
        let len = o
            .get(pos + 1)
            .map(|&l| usize::from(l))
            .ok_or(DropReason::Ipv6BadExtension)?;
        if o.len() < pos + 2 + len {
            return Err(DropReason::Ipv6BadExtension.into());
        }
        // PadN (1) is known; everything else is unknown to us.
        if kind != 1 && kind & 0xc0 != 0 {
            let problem = Icmpv6Error::parameter_problem(2, base + pos);
            return Err(Refused {
                reason: DropReason::Ipv6BadOption,
                problem: match kind >> 6 {
                    2 => Some((problem, true)),
                    3 => Some((problem, false)),
                    _ => None,
                },
            });
        }
        pos += 2 + len;
    }
    Ok(())
}

/// Drop a packet its headers refused, first sending the parameter
/// problem owed to its sender (`packet` quoted from its fixed header on).
fn refuse<T: Tx>(
    link: &mut Link,
    now: Instant,
    tx: &mut T,
    (src, dst): (Ipv6Addr, Ipv6Addr),
    packet: &[u8],
    r: Refused,
) -> DropReason {
    if let Some((error, to_groups_too)) = r.problem
        && (to_groups_too || !dst.is_multicast())
        && send_error(link, now, tx, (src, dst), error, packet, &[])
    {
        link.stats.ipv6.tx_param_problems += 1;
    }
    r.reason
}

/// Validate an IPv6 packet (RFC 8200 §3: version, payload length within
/// the frame, addressed to us, a source that can be a host), walk its
/// extension headers and join its fragments (RFC 8200 §4.5, with RFC
/// 5722's rule: any overlap drops the datagram; RFC 6946's atomic
/// fragments taken as they are); ICMPv6 is handled here ([`icmpv6`]),
/// TCP and UDP come back for their tables. `eth_src` is the frame's sender.
#[allow(clippy::too_many_arguments)]
pub(crate) fn ipv6<'a, T: Tx>(
    link: &mut Link,
    frags: &mut Reassembler,
    now: Instant,
    eth_src: EthernetAddress,
    payload: &'a [u8],
    rx: RxMeta,
    tx: &mut T,
) -> Result<IpIn<'a>, DropReason> {
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
    // From one of our addresses: only another host's neighbor
    // advertisement may say so (a host that holds the address answers a
    // duplicate address probe from it, RFC 4861 §7.2.4); `icmpv6` lets
    // nothing else through.
    let from_ours = link.ip6.is_ours(&src);
    if src.is_multicast()
        || src.is_loopback()
        || (from_ours && (eth_src == link.cfg.mac || pkt.next_header() != IpProtocol::Icmpv6))
    {
        return Err(DropReason::Ipv6BadSource);
    }
    link.stats.ipv6.rx_packets += 1;
    link.stats.ipv6.rx_bytes += end as u64;
    let packet = &payload[..end];
    let start = Walked {
        next: pkt.next_header(),
        at: IPV6_HEADER_LEN,
        named_at: 6,
    };
    // Most packets carry no extension header: no walk for them.
    let mut w = if is_extension(start.next) {
        walk(packet, start, true).map_err(|r| refuse(link, now, tx, (src, dst), packet, r))?
    } else {
        start
    };
    if w.next == IpProtocol::Ipv6Frag {
        let at = w.at;
        let f = packet
            .get(at..at + FRAG_HEADER_LEN)
            .ok_or(DropReason::Ipv6BadExtension)?;
        let word = u16::from_be_bytes([f[2], f[3]]);
        let (offset, more) = (usize::from(word & !7), word & 1 == 1);
        let inner = IpProtocol::from(f[0]);
        if offset != 0 || more {
            link.stats.ipv6.rx_fragments += 1;
            if src.is_unspecified() {
                return Err(DropReason::Ipv6BadSource);
            }
            let key = FragKey {
                src: src.into(),
                dst: dst.into(),
                ident: u32::from_be_bytes([f[4], f[5], f[6], f[7]]),
                protocol: inner.into(),
            };
            let data = &packet[at + FRAG_HEADER_LEN..];
            let header = &packet[..IPV6_HEADER_LEN];
            let Some(mut datagram) = frags.insert(now, key, offset, more, header, data)? else {
                return Ok(IpIn::Done);
            };
            link.stats.ipv6.reassembled += 1;
            // The fragmentable part may open with destination options (no
            // parameter problem: its offsets are not the packet's).
            let inner = Walked {
                next: inner,
                at: 0,
                named_at: 0,
            };
            let Walked {
                next: proto,
                at: skip,
                ..
            } = walk(&datagram.payload, inner, false).map_err(|r| r.reason)?;
            datagram.payload.drain(..skip);
            datagram.key.protocol = proto.into();
            let echo_reply =
                proto == IpProtocol::Icmpv6 && datagram.payload.first() == Some(&ECHO_REPLY);
            if echo_reply || matches!(proto, IpProtocol::Tcp | IpProtocol::Udp) {
                let whole = Whole::new(datagram, dst.is_multicast(), rx);
                return Ok(IpIn::Reassembled(whole));
            }
            return match proto {
                IpProtocol::Icmpv6 => {
                    let ip = Ipv6Packet::new_unchecked(&datagram.header[..]);
                    icmpv6(link, now, eth_src, &ip, &datagram.payload, tx)
                        .map(|t| t.map_or(IpIn::Done, IpIn::TooBig))
                }
                _ => Err(DropReason::Ipv6UnknownNextHeader),
            };
        }
        // An atomic fragment (RFC 6946): the packet as it is.
        let after = Walked {
            next: inner,
            at: at + FRAG_HEADER_LEN,
            named_at: at,
        };
        w = walk(packet, after, false).map_err(|r| refuse(link, now, tx, (src, dst), packet, r))?;
    }
    let body = &packet[w.at..];
    match w.next {
        // Echo replies go to the stack's ping sockets (one claiming our
        // own source falls to `icmpv6`, which lets only an advertisement
        // through).
        IpProtocol::Icmpv6
            if body.first() == Some(&ECHO_REPLY) && !src.is_unspecified() && !from_ours =>
        {
            let meta = IpMeta {
                src: src.into(),
                dst: dst.into(),
                protocol: IpProtocol::Icmpv6,
                ttl: pkt.hop_limit(),
                broadcast: dst.is_multicast(),
                header: &payload[..IPV6_HEADER_LEN],
                rx,
            };
            Ok(IpIn::Datagram { meta, body, packet })
        }
        IpProtocol::Icmpv6 => {
            icmpv6(link, now, eth_src, &pkt, body, tx).map(|t| t.map_or(IpIn::Done, IpIn::TooBig))
        }
        protocol @ (IpProtocol::Tcp | IpProtocol::Udp) => {
            if src.is_unspecified() {
                return Err(DropReason::Ipv6BadSource);
            }
            let meta = IpMeta {
                src: src.into(),
                dst: dst.into(),
                protocol,
                ttl: pkt.hop_limit(),
                broadcast: dst.is_multicast(),
                header: &payload[..IPV6_HEADER_LEN],
                rx,
            };
            Ok(IpIn::Datagram { meta, body, packet })
        }
        // No next header (RFC 8200 §4.7): nothing follows.
        IpProtocol::Ipv6NoNxt => Ok(IpIn::Done),
        // RFC 8200 §4: a parameter problem, code 1, pointing at the byte
        // that named the protocol.
        _ => Err(refuse(
            link,
            now,
            tx,
            (src, dst),
            packet,
            Refused {
                reason: DropReason::Ipv6UnknownNextHeader,
                problem: Some((Icmpv6Error::parameter_problem(1, w.named_at), false)),
            },
        )),
    }
}

/// Answer an echo request; answer a neighbor solicitation for one of our
/// addresses and learn its sender; learn from an advertisement; a packet
/// too big about one of our TCP segments is returned for TCP.
fn icmpv6<T: Tx>(
    link: &mut Link,
    now: Instant,
    eth_src: EthernetAddress,
    ip: &Ipv6Packet<&[u8]>,
    body: &[u8],
    tx: &mut T,
) -> Result<Option<TooBig>, DropReason> {
    // What it learns may change routes (neighbors, routers, prefixes,
    // redirects, path MTUs), and it may send before and after it learns.
    link.ip6.route_memo = None;
    let r = icmpv6_message(link, now, eth_src, ip, body, tx);
    link.ip6.route_memo = None;
    link.ip6.poll_due = Instant::ZERO;
    r
}

/// [`icmpv6`] itself.
fn icmpv6_message<T: Tx>(
    link: &mut Link,
    now: Instant,
    eth_src: EthernetAddress,
    ip: &Ipv6Packet<&[u8]>,
    body: &[u8],
    tx: &mut T,
) -> Result<Option<TooBig>, DropReason> {
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    if body.len() == mld::V1_LEN && body.first() == Some(&mld::QUERY) {
        return mld_v1_query(link, now, ip, body).map(|()| None);
    }
    let packet = Icmpv6Packet::new_checked(body).map_err(|_| DropReason::Icmpv6Malformed)?;
    if !packet.verify_checksum(&src, &dst) {
        return Err(DropReason::Icmpv6BadChecksum);
    }
    let caps = ChecksumCapabilities::ignored();
    let repr =
        Icmpv6Repr::parse(&src, &dst, &packet, &caps).map_err(|_| DropReason::Icmpv6Malformed)?;
    if link.ip6.is_ours(&src)
        && !matches!(repr, Icmpv6Repr::Ndisc(NdiscRepr::NeighborAdvert { .. }))
    {
        return Err(DropReason::Ipv6BadSource);
    }
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
            let len = reply.buffer_len();
            let sent = if IPV6_HEADER_LEN + len <= link.cfg.mtu {
                let mac = link.ip6.neighbors.lookup(&src).unwrap_or(eth_src);
                send_icmpv6(link, tx, mac, dst, src, HOP_LIMIT, &reply)
            } else {
                // Above the MTU: in fragments.
                send(
                    link,
                    now,
                    tx,
                    dst,
                    src,
                    (IpProtocol::Icmpv6, 0),
                    0,
                    len,
                    |b| {
                        reply.emit(
                            &dst,
                            &src,
                            &mut Icmpv6Packet::new_unchecked(b),
                            &ChecksumCapabilities::default(),
                        );
                    },
                )
                .is_ok()
            };
            if sent {
                link.stats.ipv6.tx_echo_replies += 1;
            }
            Ok(None)
        }
        Icmpv6Repr::Ndisc(nd) => ndisc(link, now, eth_src, ip, nd, body, tx).map(|()| None),
        Icmpv6Repr::Mld(MldRepr::Query {
            max_resp_code,
            mcast_addr,
            ..
        }) => {
            // RFC 3810 §5.1.14: from a link-local source, hop limit 1.
            if !src.is_unicast_link_local() || ip.hop_limit() != 1 {
                return Err(DropReason::Icmpv6Unhandled);
            }
            link.stats.ipv6.rx_mld_queries += 1;
            // A general query, or one about a group of ours.
            let ours = mcast_addr.is_unspecified() || link.ip6.groups().contains(&mcast_addr);
            if ours {
                let delay = mld::max_response_delay(max_resp_code);
                link.ip6.mld.query(now, delay);
            }
            Ok(None)
        }
        Icmpv6Repr::PktTooBig { mtu, header, data } => {
            link.stats.ipv6.rx_packet_too_big += 1;
            if !link.ip6.is_ours(&header.src_addr) {
                return Err(DropReason::Icmpv6Unhandled);
            }
            // The path MTU to the destination, for every packet we send
            // there (UDP's datagrams leave in fragments that fit).
            let port_mtu = link.cfg.mtu;
            let size = usize::try_from(mtu).unwrap_or(usize::MAX);
            if link
                .ip6
                .learn_path_mtu(now, header.dst_addr, size, port_mtu)
            {
                link.stats.ipv6.path_mtus_learnt += 1;
            }
            // TCP with no extension header between, and enough of the
            // segment to name its connection and sequence number.
            if header.next_header != IpProtocol::Tcp || data.len() < 8 {
                return Err(DropReason::Icmpv6Unhandled);
            }
            let port = |i: usize| u16::from_be_bytes([data[i], data[i + 1]]);
            Ok(Some(TooBig {
                local_port: port(0),
                remote: SocketAddr::new(header.dst_addr.into(), port(2)),
                seq: u32::from_be_bytes([data[4], data[5], data[6], data[7]]),
                // RFC 8201 §4: never below IPv6's minimum link MTU.
                mtu: u16::try_from(mtu.max(MIN_MTU as u32)).unwrap_or(u16::MAX),
                error: None,
            }))
        }
        // RFC 4443 3.1, 3.3, 3.4 about one of our TCP segments (Linux's
        // `icmpv6_err_convert`, in the errors a connection has).
        Icmpv6Repr::DstUnreachable {
            reason,
            header,
            data,
        } => {
            let error = match reason {
                Icmpv6DstUnreachable::NoRoute => ConnError::NetUnreachable,
                Icmpv6DstUnreachable::PortUnreachable => ConnError::Refused,
                _ => ConnError::HostUnreachable,
            };
            tcp_error(link, &header, data, error)
        }
        Icmpv6Repr::TimeExceeded { header, data, .. } => {
            tcp_error(link, &header, data, ConnError::HostUnreachable)
        }
        Icmpv6Repr::ParamProblem { header, data, .. } => {
            tcp_error(link, &header, data, ConnError::ProtocolError)
        }
        _ => Err(DropReason::Icmpv6Unhandled),
    }
}

/// An ICMPv6 error other than packet too big about one of our TCP
/// segments, for TCP.
fn tcp_error(
    link: &Link,
    header: &Ipv6Repr,
    data: &[u8],
    error: ConnError,
) -> Result<Option<TooBig>, DropReason> {
    let (local_port, remote, seq) =
        quoted_tcp(link, header, data).ok_or(DropReason::Icmpv6Unhandled)?;
    Ok(Some(TooBig {
        local_port,
        remote,
        seq,
        mtu: 0,
        error: Some(error),
    }))
}

/// Neighbor discovery (RFC 4861 §7.1: hop limit 255, code 0; §7.2).
fn ndisc<T: Tx>(
    link: &mut Link,
    now: Instant,
    eth_src: EthernetAddress,
    ip: &Ipv6Packet<&[u8]>,
    nd: NdiscRepr<'_>,
    body: &[u8],
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
            if link.ip6.is_tentative(&target_addr) {
                // Another host probes the address we probe (RFC 4862
                // §5.4.3): it is a duplicate. A solicitation from a host
                // that uses it is not answered while it is tentative.
                if dad && eth_src != link.cfg.mac && link.ip6.give_up_tentative(&target_addr) {
                    link.stats.ipv6.slaac_duplicates += 1;
                    tracing::warn!(
                        "{target_addr} (from an advertised prefix) is also probed by {eth_src}: not used (RFC 4862)"
                    );
                }
                return Err(DropReason::NdpConflict);
            }
            if !link.ip6.is_ours(&target_addr) {
                return Err(DropReason::NdpNotForUs);
            }
            if let (false, Some(mac)) = (dad, lladdr) {
                link.ip6.neighbors.learn(now, src, mac, false, true);
                flush(link, tx, src);
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
            let mac = lladdr.unwrap_or(eth_src);
            if mac != link.cfg.mac && link.ip6.give_up_tentative(&target_addr) {
                // A holder answered our probe (RFC 4862 §5.4.4): the
                // address is not ours to use.
                link.stats.ipv6.slaac_duplicates += 1;
                tracing::warn!(
                    "{target_addr} (from an advertised prefix) is used by {mac}: not used (RFC 4862)"
                );
                return Err(DropReason::NdpConflict);
            }
            if link.ip6.is_ours(&target_addr) {
                // Another host claims our address (RFC 4862 §5.4.4): the
                // first is kept for the runtime to say (and to refuse the
                // address while it probes at start).
                let mac = lladdr.unwrap_or(eth_src);
                if mac != link.cfg.mac && link.ip6.conflict.is_none() {
                    link.ip6.conflict = Some((target_addr, mac));
                    tracing::warn!(
                        "address conflict: {target_addr} is also used by {mac} (RFC 4862)"
                    );
                }
                return Err(DropReason::NdpConflict);
            }
            let Some(mac) = lladdr.or(Some(eth_src)) else {
                return Ok(());
            };
            let overrides = flags.contains(NdiscNeighborFlags::OVERRIDE);
            link.ip6
                .neighbors
                .learn(now, target_addr, mac, solicited, overrides);
            flush(link, tx, target_addr);
            Ok(())
        }
        NdiscRepr::RouterAdvert {
            router_lifetime,
            lladdr,
            mtu,
            ..
        } => {
            link.stats.ipv6.rx_router_adverts += 1;
            // RFC 4861 §6.1.2: from a link-local address.
            if !src.is_unicast_link_local() {
                return Err(DropReason::NdpInvalid);
            }
            let lladdr = mac_of(lladdr)?;
            if !link.ip6.accept_ra || !link.ip6.enabled() {
                return Err(DropReason::Icmpv6Unhandled);
            }
            let ad = crate::iface::router::Advert {
                src,
                lifetime: crate::iface::router::std_duration(router_lifetime),
                mtu,
                options: body.get(RA_FIXED_LEN..).unwrap_or_default(),
            };
            let port_mtu = link.cfg.mtu;
            let ignored = crate::iface::router::learn(&mut link.ip6, now, port_mtu, &ad)?;
            link.stats.ipv6.ra_ignored += ignored;
            if let Some(mac) = lladdr {
                link.ip6.neighbors.learn(now, src, mac, false, true);
                flush(link, tx, src);
            }
            Ok(())
        }
        NdiscRepr::Redirect {
            target_addr,
            dest_addr,
            lladdr,
            ..
        } => {
            // Hosts take redirects as Linux does (`accept_redirects`).
            let lladdr = mac_of(lladdr)?;
            if !link.ip6.redirect(now, src, dest_addr, target_addr) {
                return Err(DropReason::NdpInvalid);
            }
            link.stats.ipv6.rx_redirects += 1;
            if let Some(mac) = lladdr {
                link.ip6.neighbors.learn(now, target_addr, mac, false, true);
                flush(link, tx, target_addr);
            }
            Ok(())
        }
        _ => Err(DropReason::Icmpv6Unhandled),
    }
}

/// Bytes of a router advertisement before its options (RFC 4861 §4.2).
const RA_FIXED_LEN: usize = 16;

/// A router solicitation to all routers from our link-local address,
/// with our link-layer address (RFC 4861 §6.3.7).
fn solicit_routers<T: Tx>(link: &mut Link, tx: &mut T) {
    let Some(src) = link.ip6.source_for(&ALL_ROUTERS) else {
        return;
    };
    let rs = Icmpv6Repr::Ndisc(NdiscRepr::RouterSolicit {
        lladdr: Some(RawHardwareAddress::from(link.cfg.mac)),
    });
    if send_icmpv6(
        link,
        tx,
        multicast_mac(ALL_ROUTERS),
        src,
        ALL_ROUTERS,
        255,
        &rs,
    ) {
        link.stats.ipv6.tx_router_solicits += 1;
    }
}

/// An MLDv1 query (RFC 2710, 24 bytes, which smoltcp's MLDv2 parser
/// refuses): from a link-local source with hop limit 1, as a version 2
/// query must be; a general one, or about a group of ours, is answered,
/// and either way the host speaks MLDv1 for a while (RFC 3810 §8.2.1).
fn mld_v1_query(
    link: &mut Link,
    now: Instant,
    ip: &Ipv6Packet<&[u8]>,
    body: &[u8],
) -> Result<(), DropReason> {
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    if !crate::wire::checksum::verifies_ip(src.into(), dst.into(), 58, body) {
        return Err(DropReason::Icmpv6BadChecksum);
    }
    let (delay, group) = mld::parse_v1_query(body).ok_or(DropReason::Icmpv6Malformed)?;
    if !src.is_unicast_link_local() || ip.hop_limit() != 1 {
        return Err(DropReason::Icmpv6Unhandled);
    }
    link.stats.ipv6.rx_mld_queries += 1;
    link.stats.ipv6.rx_mld_v1_queries += 1;
    if group.is_unspecified() || link.ip6.groups().contains(&group) {
        link.ip6.mld.query_v1(now, delay);
    }
    Ok(())
}

/// The reports `report` asks for: version 2 ([`send_mld_v2_report`]) or
/// one version 1 report per group ([`send_mld_v1_report`]).
fn send_mld_report<T: Tx>(link: &mut Link, tx: &mut T, report: mld::Report) {
    match report {
        mld::Report::V2(record) => send_mld_v2_report(link, tx, record),
        mld::Report::V1 => {
            for group in link.ip6.groups() {
                send_mld_v1_report(link, tx, group);
            }
        }
    }
}

/// Hop-by-hop options holding the router alert "MLD" (type 5, 2 bytes of
/// 0; RFC 2711), then PadN of 0 bytes, before an ICMPv6 message.
const MLD_HOP_BY_HOP: [u8; 8] = [58, 0, 5, 2, 0, 0, 1, 0];

/// An MLDv1 report (RFC 2710 §3) for `group`, sent to the group itself
/// from our link-local address.
fn send_mld_v1_report<T: Tx>(link: &mut Link, tx: &mut T, group: Ipv6Addr) {
    let Some(src) = link.ip6.source_for(&group) else {
        return;
    };
    if send_mld(link, tx, src, group, mld::V1_LEN, |icmp| {
        mld::write_v1_report(icmp, group);
    }) {
        link.stats.ipv6.tx_mld_v1_reports += 1;
    }
}

/// An MLDv2 report (RFC 3810 §5.2) of `record` for each of our groups, to
/// all MLDv2 routers from our link-local address.
fn send_mld_v2_report<T: Tx>(link: &mut Link, tx: &mut T, record: u8) {
    let dst = mld::ALL_MLDV2_ROUTERS;
    let Some(src) = link.ip6.source_for(&dst) else {
        return;
    };
    let groups = link.ip6.groups();
    let icmp_len = 8 + groups.len() * mld::RECORD_LEN;
    send_mld(link, tx, src, dst, icmp_len, |icmp| {
        mld::write_report(icmp, &groups, record);
    });
}

/// An MLD message of `icmp_len` bytes that `write` fills (its checksum
/// left 0), from `src` to `dst` with hop limit 1 and a hop-by-hop header
/// holding the router alert option (RFC 3810 §5, RFC 2711); counted as a
/// report. Whether it was sent.
fn send_mld<T: Tx>(
    link: &mut Link,
    tx: &mut T,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    icmp_len: usize,
    write: impl FnOnce(&mut [u8]),
) -> bool {
    let hbh = MLD_HOP_BY_HOP;
    let ip = Ipv6Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: IpProtocol::HopByHop,
        payload_len: hbh.len() + icmp_len,
        hop_limit: 1,
    };
    let len = ETH_LEN + IPV6_HEADER_LEN + hbh.len() + icmp_len;
    let me = link.cfg.mac;
    let sent = tx.send(len, |buf| {
        write_eth(buf, me, multicast_mac(dst), EthernetProtocol::Ipv6);
        ip.emit(&mut Ipv6Packet::new_unchecked(&mut buf[ETH_LEN..]));
        let at = ETH_LEN + IPV6_HEADER_LEN;
        buf[at..at + hbh.len()].copy_from_slice(&hbh);
        let icmp = &mut buf[at + hbh.len()..];
        write(icmp);
        let c = crate::wire::checksum::compute_ip(src.into(), dst.into(), 58, icmp);
        icmp[2..4].copy_from_slice(&c.to_be_bytes());
    });
    count(link, sent, len - ETH_LEN);
    if sent {
        link.stats.ipv6.tx_mld_reports += 1;
    }
    sent
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

/// Write the fixed header of a packet we originate into `buf`.
fn write_header(
    buf: &mut [u8],
    src: Ipv6Addr,
    dst: Ipv6Addr,
    next: IpProtocol,
    payload_len: usize,
    label: u32,
) {
    let mut ip = Ipv6Packet::new_unchecked(buf);
    Ipv6Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: next,
        payload_len,
        hop_limit: HOP_LIMIT,
    }
    .emit(&mut ip);
    ip.set_flow_label(label);
}

/// Send an IPv6 packet from `src` (one of ours, [`Ipv6Iface::source_for`])
/// to `dst` carrying `payload_len` bytes of `protocol` that `fill` writes,
/// with traffic class `tclass` (DSCP and ECN: TCP's ECT(0) on new data),
/// whose transport `ports` (source port high, destination low; 0 for a
/// protocol without) choose its flow label. It goes to `dst` when on-link, else to the default router
/// ([`Ipv6Iface::next_hop`](crate::iface::ipv6_iface::Ipv6Iface::next_hop);
/// `NoRoute` without one). A packet above the link MTU leaves in
/// fragments (RFC 8200 §4.5); one to a neighbor not yet known waits
/// (bounded) while it is solicited.
#[allow(clippy::too_many_arguments)]
pub(crate) fn send<T: Tx, F: FnOnce(&mut [u8])>(
    link: &mut Link,
    now: Instant,
    tx: &mut T,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    (protocol, tclass): (IpProtocol, u8),
    ports: u32,
    payload_len: usize,
    fill: F,
) -> Result<(), Error> {
    let Route { hop, mac, mtu, .. } = route(link, dst, payload_len)?;
    let proto = u8::from(protocol);
    let label = match link.ip6.label_memo {
        Some((s, d, p, o, label)) if (s, d, p, o) == (src, dst, proto, ports) => label,
        _ => {
            let labels = FlowLabels {
                hash: link.flow_hash(),
                src,
                dst,
                protocol,
            };
            let label = labels.of(ports);
            link.ip6.label_memo = Some((src, dst, proto, ports, label));
            label
        }
    };
    if IPV6_HEADER_LEN + payload_len <= mtu {
        let len = IPV6_HEADER_LEN + payload_len;
        let build = |ip: &mut [u8]| {
            write_header(ip, src, dst, protocol, payload_len, label);
            Ipv6Packet::new_unchecked(&mut *ip).set_traffic_class(tclass);
            fill(&mut ip[IPV6_HEADER_LEN..]);
        };
        send_or_hold(link, now, tx, hop, mac, len, build);
        return Ok(());
    }
    // Fragments: the payload built once, cut at multiples of 8 bytes.
    let chunk = mtu.saturating_sub(IPV6_HEADER_LEN + FRAG_HEADER_LEN) & !7;
    if chunk == 0 {
        return Err(Error::TooLarge);
    }
    let mut body = vec![0u8; payload_len];
    fill(&mut body);
    let ident = link.ip6.next_frag_id;
    link.ip6.next_frag_id = ident.wrapping_add(1);
    for (i, piece) in body.chunks(chunk).enumerate() {
        let offset = i * chunk;
        let more = offset + piece.len() < payload_len;
        let len = IPV6_HEADER_LEN + FRAG_HEADER_LEN + piece.len();
        let build = |ip: &mut [u8]| {
            write_header(
                ip,
                src,
                dst,
                IpProtocol::Ipv6Frag,
                FRAG_HEADER_LEN + piece.len(),
                label,
            );
            Ipv6Packet::new_unchecked(&mut *ip).set_traffic_class(tclass);
            let f = &mut ip[IPV6_HEADER_LEN..];
            f[0] = protocol.into();
            f[1] = 0;
            f[2..4].copy_from_slice(&((offset as u16) | u16::from(more)).to_be_bytes());
            f[4..8].copy_from_slice(&ident.to_be_bytes());
            f[FRAG_HEADER_LEN..].copy_from_slice(piece);
        };
        link.stats.ipv6.tx_fragments += 1;
        send_or_hold(link, now, tx, hop, mac, len, build);
    }
    Ok(())
}

/// The route for a packet of `payload_len` bytes to `dst`: `NoRoute` when
/// IPv6 is off, `dst` is ours or unspecified or no router is known;
/// `TooLarge` above IPv6's 64 KiB payload. The last route to a resolved
/// neighbor is remembered (`Ipv6Iface::route_memo`).
fn route(link: &mut Link, dst: Ipv6Addr, payload_len: usize) -> Result<Route, Error> {
    if let Some((_, remembered)) = link.ip6.route_memo.filter(|(d, _)| *d == dst) {
        if payload_len > usize::from(u16::MAX) {
            return Err(Error::TooLarge);
        }
        debug_assert_eq!(
            Ok(&remembered),
            work_out_route(link, dst, payload_len).as_ref()
        );
        return Ok(remembered);
    }
    let r = work_out_route(link, dst, payload_len)?;
    if r.mac.is_some() {
        link.ip6.route_memo = Some((dst, r));
    }
    Ok(r)
}

/// [`route`] from the tables.
fn work_out_route(link: &mut Link, dst: Ipv6Addr, payload_len: usize) -> Result<Route, Error> {
    if !link.ip6.enabled() || dst.is_unspecified() || link.ip6.owns(&dst) {
        link.stats.ipv6.tx_no_route += 1;
        return Err(Error::NoRoute);
    }
    if payload_len > usize::from(u16::MAX) {
        return Err(Error::TooLarge);
    }
    let Some(hop) = link.ip6.next_hop(&dst) else {
        link.stats.ipv6.tx_no_route += 1;
        return Err(Error::NoRoute);
    };
    let mac = if dst.is_multicast() {
        Some(multicast_mac(dst))
    } else {
        link.ip6.neighbors.lookup(&hop)
    };
    let mtu = link.ip6.path_mtu(&dst, link.cfg.mtu);
    let src = link.ip6.source_for(&dst);
    Ok(Route { hop, mac, mtu, src })
}

/// Send one unfragmented IPv6 packet, from the source address
/// [`Ipv6Iface::source_for`](crate::iface::ipv6_iface::Ipv6Iface::source_for)
/// picks for `dst`, whose `fill` sees the whole packet with the header
/// written (for trailers that cover the header, like RoCEv2's ICRC).
/// `TooLarge` above the path MTU; otherwise as [`send`].
pub(crate) fn send_packet<T: Tx, F: FnOnce(&mut [u8])>(
    link: &mut Link,
    now: Instant,
    tx: &mut T,
    dst: Ipv6Addr,
    protocol: IpProtocol,
    payload_len: usize,
    fill: F,
) -> Result<(), Error> {
    let Route { hop, mac, mtu, src } = route(link, dst, payload_len)?;
    let len = IPV6_HEADER_LEN + payload_len;
    if len > mtu {
        return Err(Error::TooLarge);
    }
    let Some(src) = src else {
        link.stats.ipv6.tx_no_route += 1;
        return Err(Error::NoRoute);
    };
    let labels = FlowLabels {
        hash: link.flow_hash(),
        src,
        dst,
        protocol,
    };
    let build = |ip: &mut [u8]| {
        // The label hashes the ports `fill` wrote (RoCEv2's ICRC masks
        // the label).
        write_header(ip, src, dst, protocol, payload_len, 0);
        fill(ip);
        let label = labels.of(ports_of(protocol, &ip[IPV6_HEADER_LEN..]));
        Ipv6Packet::new_unchecked(ip).set_flow_label(label);
    };
    send_or_hold(link, now, tx, hop, mac, len, build);
    Ok(())
}

/// A packet of `len` bytes that `build` writes (IPv6 header on) to the
/// port for `mac`, or, with no MAC known, held for `dst` while it is
/// solicited.
fn send_or_hold<T: Tx>(
    link: &mut Link,
    now: Instant,
    tx: &mut T,
    dst: Ipv6Addr,
    mac: Option<EthernetAddress>,
    len: usize,
    build: impl FnOnce(&mut [u8]),
) {
    match mac {
        Some(mac) => {
            let me = link.cfg.mac;
            let ok = tx.send(ETH_LEN + len, |buf| {
                write_eth(buf, me, mac, EthernetProtocol::Ipv6);
                build(&mut buf[ETH_LEN..]);
            });
            count(link, ok, len);
        }
        None => {
            let mut packet = vec![0u8; len];
            build(&mut packet);
            hold(link, now, tx, dst, packet);
        }
    }
}

/// Flow labels of the packets we originate (RFC 6437 §3): a keyed hash
/// of the 5-tuple (addresses, protocol, and the transport's ports, the
/// first four bytes of a TCP or UDP header), so every packet of one flow
/// carries one label, labels spread evenly, and no other host can
/// predict them. Other protocols (ICMPv6) hash without ports. Never 0,
/// which says "no label".
struct FlowLabels {
    hash: foldhash::fast::FixedState,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    protocol: IpProtocol,
}

impl FlowLabels {
    /// The label of a packet of the flow with transport `ports`.
    fn of(&self, ports: u32) -> u32 {
        use std::hash::BuildHasher;
        // The addresses folded to a word each before the keyed hash: one
        // hash of three words per packet (labels need spread, not every
        // bit of the input).
        let fold = |a: Ipv6Addr| {
            let b = a.to_bits();
            (b as u64) ^ ((b >> 64) as u64).rotate_left(29)
        };
        let h = self.hash.hash_one((
            fold(self.src),
            fold(self.dst),
            (u64::from(u8::from(self.protocol)) << 32) | u64::from(ports),
        ));
        match (h as u32) & 0x000f_ffff {
            0 => 1,
            l => l,
        }
    }
}

/// The ports of a TCP or UDP header starting `upper` as one word (source
/// high), 0 for other protocols: what flow labels hash.
fn ports_of(protocol: IpProtocol, upper: &[u8]) -> u32 {
    match (protocol, upper.get(..4)) {
        (IpProtocol::Tcp | IpProtocol::Udp, Some(p)) => {
            u32::from_be_bytes([p[0], p[1], p[2], p[3]])
        }
        _ => 0,
    }
}

/// A fragment header's bytes (RFC 8200 §4.5).
const FRAG_HEADER_LEN: usize = 8;

/// Count a packet of `len` bytes (IPv6 header on) handed to the port.
fn count(link: &mut Link, ok: bool, len: usize) {
    link.count_tx(ok, ETH_LEN + len);
    if ok {
        link.stats.ipv6.tx_packets += 1;
        link.stats.ipv6.tx_bytes += len as u64;
    }
}

/// Hold `packet` for `dst`, soliciting it when a solicitation is due.
fn hold<T: Tx>(link: &mut Link, now: Instant, tx: &mut T, dst: Ipv6Addr, packet: Vec<u8>) {
    link.ip6.poll_due = Instant::ZERO;
    if link.ip6.pending.enqueue(now, dst, packet) == Enqueue::QueuedSendRequest {
        solicit(link, tx, dst);
    }
}

/// A neighbor solicitation for `target` to its solicited-node group, with
/// our link-layer address (RFC 4861 §7.2.2).
fn solicit<T: Tx>(link: &mut Link, tx: &mut T, target: Ipv6Addr) {
    let group = solicited_node(target);
    let Some(src) = link.ip6.source_for(&target) else {
        return;
    };
    let ns = Icmpv6Repr::Ndisc(NdiscRepr::NeighborSolicit {
        target_addr: target,
        lladdr: Some(RawHardwareAddress::from(link.cfg.mac)),
    });
    if send_icmpv6(link, tx, multicast_mac(group), src, group, 255, &ns) {
        link.stats.ipv6.tx_neighbor_solicits += 1;
    }
}

/// Duplicate address detection (RFC 4862 §5.4.2): for each of our
/// addresses a neighbor solicitation from the unspecified address to its
/// solicited-node group, without a link-layer option; a host holding the
/// address advertises it, and the advertisement records the conflict.
fn probe_addresses<T: Tx>(link: &mut Link, tx: &mut T) {
    let addrs: Vec<Ipv6Addr> = link.ip6.addrs().collect();
    for target in addrs {
        probe(link, tx, target);
    }
}

/// One duplicate address detection probe for `target`.
fn probe<T: Tx>(link: &mut Link, tx: &mut T, target: Ipv6Addr) {
    let group = solicited_node(target);
    let ns = Icmpv6Repr::Ndisc(NdiscRepr::NeighborSolicit {
        target_addr: target,
        lladdr: None,
    });
    let any = Ipv6Addr::UNSPECIFIED;
    if send_icmpv6(link, tx, multicast_mac(group), any, group, 255, &ns) {
        link.stats.ipv6.tx_dad_probes += 1;
    }
}

/// Duplicate address detection of addresses made from advertised
/// prefixes (RFC 4862 §5.4): a probe each
/// (`DupAddrDetectTransmits` 1), then `RetransTimer` (1 s) to hear a
/// holder; an address nobody claimed is ours from then on.
fn detect_duplicates<T: Tx>(link: &mut Link, now: Instant, tx: &mut T) {
    let mut i = 0;
    while let Some(&(learnt, done)) = link.ip6.tentative.get(i) {
        match done {
            None => {
                probe(link, tx, learnt.what.address());
                link.ip6.tentative[i].1 = Some(now + DAD_WAIT);
                i += 1;
            }
            Some(t) if t <= now => {
                link.ip6.tentative.remove(i);
                link.ip6.slaac.push(learnt);
            }
            Some(_) => i += 1,
        }
    }
}

/// How long a tentative address waits for a holder to answer its probe
/// (RFC 4861 §10 `RETRANS_TIMER`).
const DAD_WAIT: core::time::Duration = core::time::Duration::from_secs(1);

/// Packets that waited for `ip` leave now that its address is known.
fn flush<T: Tx>(link: &mut Link, tx: &mut T, ip: Ipv6Addr) {
    let Some(mac) = link.ip6.neighbors.lookup(&ip) else {
        return;
    };
    for packet in link.ip6.pending.resolved(&ip) {
        let me = link.cfg.mac;
        let ok = tx.send(ETH_LEN + packet.len(), |buf| {
            write_eth(buf, me, mac, EthernetProtocol::Ipv6);
            buf[ETH_LEN..].copy_from_slice(&packet);
        });
        count(link, ok, packet.len());
    }
}

/// Timers: solicitations to repeat, neighbors to give up, router
/// solicitations due, what advertisements taught expiring.
pub(crate) fn poll<T: Tx>(link: &mut Link, now: Instant, tx: &mut T) {
    if now < link.ip6.poll_due {
        debug_assert!(poll_at(link).is_none_or(|due| due > now));
        return;
    }
    // Addresses, routes and path MTUs change here (DAD, expiry).
    link.ip6.route_memo = None;
    poll_tables(link, now, tx);
    link.ip6.route_memo = None;
    link.ip6.poll_due = poll_at(link).unwrap_or(Instant::FAR_FUTURE);
}

/// [`poll`] itself.
fn poll_tables<T: Tx>(link: &mut Link, now: Instant, tx: &mut T) {
    let mut retry = std::mem::take(&mut link.ip6.retry);
    link.ip6.pending.poll(now, &mut retry);
    for target in retry.drain(..) {
        solicit(link, tx, target);
    }
    link.ip6.retry = retry;
    if std::mem::take(&mut link.ip6.dad_due) {
        probe_addresses(link, tx);
    }
    if !link.ip6.tentative.is_empty() {
        detect_duplicates(link, now, tx);
    }
    if link.ip6.enabled() {
        let addrs = mld::fingerprint(link.ip6.addrs());
        link.ip6.mld.addresses(now, addrs);
        if let Some(report) = link.ip6.mld.take(now) {
            send_mld_report(link, tx, report);
        }
    }
    link.ip6.expire(now);
    if link.ip6.next_solicit.is_none() && link.ip6.wants_routers() {
        link.ip6.next_solicit = Some(now + link.ip6.first_solicit_delay);
    }
    if link.ip6.solicit_due().is_some_and(|due| due <= now) {
        solicit_routers(link, tx);
        link.ip6.solicits_sent += 1;
        link.ip6.next_solicit = Some(now + RTR_SOLICITATION_INTERVAL);
    }
}

/// When [`poll`] next has work.
pub(crate) fn poll_at(link: &Link) -> Option<Instant> {
    match (link.ip6.pending.poll_at(), link.ip6.next_deadline()) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// ICMPv6 destination unreachable, port unreachable (RFC 4443 §3.1)
/// about a datagram we received, never about a packet to a multicast
/// group ([`send_error`]).
pub(crate) fn send_port_unreachable<T: Tx>(
    link: &mut Link,
    now: Instant,
    tx: &mut T,
    meta: &IpMeta<'_>,
    body: &[u8],
) {
    let (core::net::IpAddr::V6(src), core::net::IpAddr::V6(dst)) = (meta.src, meta.dst) else {
        return;
    };
    if meta.broadcast {
        return;
    }
    let error = Icmpv6Error::PORT_UNREACHABLE;
    if send_error(link, now, tx, (src, dst), error, meta.header, body) {
        link.stats.ipv6.tx_dest_unreachable += 1;
    }
}

/// An ICMPv6 error message's type, code and 32-bit parameter (RFC 4443
/// §3: the pointer of a parameter problem, else 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Icmpv6Error {
    kind: u8,
    code: u8,
    param: u32,
}

impl Icmpv6Error {
    /// Destination unreachable, port unreachable (§3.1).
    const PORT_UNREACHABLE: Self = Icmpv6Error {
        kind: 1,
        code: 4,
        param: 0,
    };
    /// Time exceeded, fragment reassembly time exceeded (§3.3).
    pub(crate) const REASSEMBLY_TIME_EXCEEDED: Self = Icmpv6Error {
        kind: 3,
        code: 1,
        param: 0,
    };

    /// Parameter problem (§3.4) of `code` (0 erroneous header field, 1
    /// unrecognized next header, 2 unrecognized option) at byte `pointer`
    /// of the packet.
    fn parameter_problem(code: u8, pointer: usize) -> Self {
        Icmpv6Error {
            kind: 4,
            code,
            param: u32::try_from(pointer).unwrap_or(u32::MAX),
        }
    }
}

/// Send `error` about a packet from `to` to `dst` whose fixed header (and
/// extension headers) were `head` and whose rest was `tail` (RFC 4443
/// §2.4): from `dst` when it is one of our unicast addresses, rate-limited
/// with IPv4's errors, never to an unspecified or multicast source,
/// quoting as much of the packet as keeps the message within the minimum
/// MTU. Whether it left.
pub(crate) fn send_error<T: Tx>(
    link: &mut Link,
    now: Instant,
    tx: &mut T,
    (to, dst): (Ipv6Addr, Ipv6Addr),
    error: Icmpv6Error,
    head: &[u8],
    tail: &[u8],
) -> bool {
    if to.is_unspecified() || to.is_multicast() {
        return false;
    }
    let from = if link.ip6.is_ours(&dst) {
        Some(dst)
    } else {
        link.ip6.source_for(&to)
    };
    let Some(from) = from else {
        return false;
    };
    if !link.icmp_errors.take(now) {
        link.stats.icmp.rate_limited += 1;
        return false;
    }
    let room = MIN_MTU - IPV6_HEADER_LEN - 8;
    let head = &head[..head.len().min(room)];
    let tail = &tail[..tail.len().min(room - head.len())];
    let quote = head.len() + tail.len();
    let sent = send(
        link,
        now,
        tx,
        from,
        to,
        (IpProtocol::Icmpv6, 0),
        0,
        8 + quote,
        |b| {
            b[0] = error.kind;
            b[1] = error.code;
            b[2..4].fill(0);
            b[4..8].copy_from_slice(&error.param.to_be_bytes());
            b[8..8 + head.len()].copy_from_slice(head);
            b[8 + head.len()..].copy_from_slice(tail);
            let c = crate::wire::checksum::compute_ip(from.into(), to.into(), 58, b);
            b[2..4].copy_from_slice(&c.to_be_bytes());
        },
    );
    sent.is_ok()
}
