//! What an IPv6 host owes beyond neighbor discovery, on raw frames built
//! with smoltcp's wire types: redirects taken from the first-hop router
//! (RFC 4861 §8); MLDv2 reports for its solicited-node groups
//! (RFC 3810), unsolicited and in answer to a query; the ICMP errors
//! beyond port unreachable: a parameter
//! problem for an unknown next header (RFC 8200 §4, RFC 4443 §3.4) and
//! for an unknown option to a group only when its type asks for it (RFC
//! 4443 §2.4 (e.3)), time exceeded when a datagram's fragments do not all
//! come in time (IPv4 and IPv6), and one flow label per flow (RFC 6437).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use ustack::iface::ipv6::{ALL_NODES, link_local, multicast_mac, solicited_node};
use ustack::iface::mld::ALL_MLDV2_ROUTERS;
use ustack::sim::{host_config, host_mac};
use ustack::wire::*;
use ustack::{Instant, Stack, VecTx};

mod v6util;
use v6util::*;

/// A stack that knows PEER's MAC (PEER solicited it), so what it sends
/// PEER leaves at once.
fn host() -> Stack {
    let mut s = Stack::new(config());
    let ns = solicit(GLOBAL, Some(peer_mac()));
    let group = solicited_node(GLOBAL);
    receive(
        &mut s,
        &icmpv6_frame(multicast_mac(group), PEER, group, 255, &ns),
    );
    s
}

/// (type, code, parameter) of an ICMPv6 message.
fn head(icmp: &[u8]) -> (u8, u8, u32) {
    (
        icmp[0],
        icmp[1],
        u32::from_be_bytes(icmp[4..8].try_into().unwrap()),
    )
}

/// An upper layer we do not speak gets a parameter problem, code 1,
/// pointing at the fixed header's next-header byte (6), or at the byte of
/// the extension header that named it; the packet is quoted.
#[test]
fn unknown_next_header_gets_a_parameter_problem() {
    let mut s = host();
    let sctp = IpProtocol::from(132);
    let frame = v6_frame(sctp, &[], &[0u8; 12]);
    let tx = receive(&mut s, &frame);
    let (mac, src, dst, _, icmp) = only_reply(&tx);
    assert_eq!((mac, src, dst), (peer_mac(), GLOBAL, PEER));
    assert_eq!(head(&icmp), (4, 1, 6));
    assert_eq!(&icmp[8..], &frame[ETHERNET_HEADER_LEN..]);
    // After a destination options header at byte 40: its first byte.
    let chain = opts_header(sctp, &[]);
    let tx = receive(&mut s, &v6_frame(IpProtocol::Ipv6Opts, &chain, &[0u8; 12]));
    assert_eq!(head(&only_reply(&tx).4), (4, 1, 40));
    assert_eq!(s.stats().ipv6.tx_param_problems, 2);
    // "No next header" is no error.
    let tx = receive(&mut s, &v6_frame(IpProtocol::Ipv6NoNxt, &[], &[]));
    assert!(tx.frames.is_empty());
}

/// A packet sent to a group: an unknown option of type 11 is dropped in
/// silence, one of type 10 is answered (the only parameter problem owed
/// for a packet to a group), and an unknown next header is not.
#[test]
fn errors_about_packets_to_a_group() {
    let mut s = host();
    let to_group = |first: IpProtocol, chain: &[u8], upper: &[u8]| {
        let mut f = v6_frame(first, chain, upper);
        let mut eth = EthernetFrame::new_unchecked(&mut f[..]);
        eth.set_dst_addr(multicast_mac(ALL_NODES));
        Ipv6Packet::new_unchecked(eth.payload_mut()).set_dst_addr(ALL_NODES);
        f
    };
    let opt11 = opts_header(IpProtocol::Udp, &[0xc0, 0]);
    assert!(
        receive(&mut s, &to_group(IpProtocol::Ipv6Opts, &opt11, &[]))
            .frames
            .is_empty()
    );
    let sctp = IpProtocol::from(132);
    assert!(
        receive(&mut s, &to_group(sctp, &[], &[0; 8]))
            .frames
            .is_empty()
    );
    let opt10 = opts_header(IpProtocol::Udp, &[0x80, 0]);
    let tx = receive(&mut s, &to_group(IpProtocol::Ipv6Opts, &opt10, &[]));
    let (_, src, dst, _, icmp) = only_reply(&tx);
    // From our own address (not the group), to the sender.
    assert_eq!((src, dst), (GLOBAL, PEER));
    assert_eq!(head(&icmp), (4, 2, 42));
}

/// The first fragment of a datagram whose rest never comes: after the
/// reassembly timeout (30 s), time exceeded code 1 quoting it; a datagram
/// whose first fragment never came owes nothing.
#[test]
fn reassembly_timeout_sends_time_exceeded_over_ipv6() {
    let mut s = host();
    let first = [frag_header(IpProtocol::Udp, 0, true, 7), udp6(&[5u8; 64])].concat();
    let later = [frag_header(IpProtocol::Udp, 512, true, 8), vec![6u8; 64]].concat();
    for f in [&first, &later] {
        assert!(
            receive(&mut s, &v6_frame(IpProtocol::Ipv6Frag, f, &[]))
                .frames
                .is_empty()
        );
    }
    assert!(polled_at(&mut s, T0 + Duration::from_secs(29)).is_empty());
    // What goes to PEER (a router solicitation may leave too).
    let mut tx = VecTx::new();
    s.poll(T0 + Duration::from_secs(30), &mut tx);
    tx.frames.retain(|f| v6_dst(f).1 == PEER);
    let (_, src, dst, _, icmp) = only_reply(&tx);
    assert_eq!((src, dst), (GLOBAL, PEER));
    assert_eq!(head(&icmp), (3, 1, 0));
    // The fixed header as received, then the first fragment's payload.
    let quoted = Ipv6Packet::new_unchecked(&icmp[8..48]);
    assert_eq!((quoted.src_addr(), quoted.dst_addr()), (PEER, GLOBAL));
    assert_eq!(&icmp[48..], &udp6(&[5u8; 64])[..]);
    let st = s.stats();
    assert_eq!((st.ipv6.tx_time_exceeded, st.icmp.tx_time_exceeded), (1, 0));
}

/// The same over IPv4: type 11 code 1, the header and the first 8 bytes.
#[test]
fn reassembly_timeout_sends_time_exceeded_over_ipv4() {
    let mut cfg = host_config(1);
    cfg.announce = false;
    let mut s = Stack::new(cfg);
    let (me, peer) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
    // The peer asks for our MAC: we learn its own.
    let arp = ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Request,
        source_hardware_addr: host_mac(2),
        source_protocol_addr: peer,
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: me,
    };
    let mut frame = vec![0u8; ETHERNET_HEADER_LEN + arp.buffer_len()];
    let mut eth = EthernetFrame::new_unchecked(&mut frame[..]);
    eth.set_src_addr(host_mac(2));
    eth.set_dst_addr(EthernetAddress::BROADCAST);
    eth.set_ethertype(EthernetProtocol::Arp);
    arp.emit(&mut ArpPacket::new_unchecked(eth.payload_mut()));
    receive(&mut s, &frame);
    // The first fragment of a UDP datagram: 16 bytes, more to come.
    let ip = Ipv4Repr {
        src_addr: peer,
        dst_addr: me,
        next_header: IpProtocol::Udp,
        payload_len: 16,
        hop_limit: 64,
    };
    let mut frame = vec![0u8; ETHERNET_HEADER_LEN + 20 + 16];
    let mut eth = EthernetFrame::new_unchecked(&mut frame[..]);
    eth.set_src_addr(host_mac(2));
    eth.set_dst_addr(host_mac(1));
    eth.set_ethertype(EthernetProtocol::Ipv4);
    let mut pkt = Ipv4Packet::new_unchecked(eth.payload_mut());
    ip.emit(&mut pkt, &smoltcp::phy::ChecksumCapabilities::default());
    pkt.set_ident(99);
    pkt.set_more_frags(true);
    pkt.payload_mut()
        .copy_from_slice(&(0..16).collect::<Vec<u8>>());
    pkt.fill_checksum();
    assert!(receive(&mut s, &frame).frames.is_empty());
    let out = polled_at(&mut s, T0 + Duration::from_secs(30));
    assert_eq!(out.len(), 1);
    let eth = EthernetFrame::new_checked(&out[0][..]).unwrap();
    assert_eq!(eth.dst_addr(), host_mac(2));
    let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
    assert_eq!((ip.src_addr(), ip.dst_addr()), (me, peer));
    let icmp = Icmpv4Packet::new_checked(ip.payload()).unwrap();
    assert!(icmp.verify_checksum());
    assert_eq!(
        (icmp.msg_type(), icmp.msg_code()),
        (Icmpv4Message::TimeExceeded, 1)
    );
    let quoted = &ip.payload()[8..];
    assert_eq!(quoted.len(), 20 + 8);
    assert_eq!(&quoted[20..], &(0..8).collect::<Vec<u8>>()[..]);
    assert_eq!(s.stats().icmp.tx_time_exceeded, 1);
}

/// The flow label of each packet we send (the fixed header's low 20 bits
/// of its first word).
fn flow_label(frame: &[u8]) -> u32 {
    let ip = &frame[ETHERNET_HEADER_LEN..];
    u32::from_be_bytes([ip[0], ip[1], ip[2], ip[3]]) & 0x000f_ffff
}

/// One label per flow, never 0 (RFC 6437 §3): every datagram of one UDP
/// flow, every fragment of one datagram, and a TCP connection's
/// retransmitted SYN carry their flow's label; another flow has another.
#[test]
fn one_flow_label_per_flow() {
    let mut s = host();
    let peer = |port| SocketAddr::new(PEER.into(), port);
    let a = s.udp().bind(5000).unwrap();
    let b = s.udp().bind(5001).unwrap();
    s.udp().send_to(a, peer(53), b"one").unwrap();
    s.udp().send_to(a, peer(53), b"two").unwrap();
    s.udp().send_to(a, peer(53), &[0u8; 3000]).unwrap();
    s.udp().send_to(b, peer(53), b"three").unwrap();
    let out = polled_at(&mut s, T0);
    assert_eq!(out.len(), 2 + 3 + 1, "two datagrams, three fragments, one");
    let labels: Vec<u32> = out.iter().map(|f| flow_label(f)).collect();
    assert!(labels.iter().all(|&l| l != 0), "{labels:?}");
    assert!(labels[..5].iter().all(|&l| l == labels[0]), "{labels:?}");
    assert_ne!(labels[5], labels[0]);
    // TCP: the SYN and its retransmission share one label.
    s.tcp().connect(T0, peer(80)).unwrap();
    let to_peer = |mut frames: Vec<Vec<u8>>| {
        frames.retain(|f| v6_dst(f).1 == PEER);
        frames
    };
    let syn = to_peer(polled_at(&mut s, T0));
    let again = to_peer(polled_at(&mut s, T0 + Duration::from_secs(3)));
    assert_eq!((syn.len(), again.len()), (1, 1));
    assert_eq!(flow_label(&syn[0]), flow_label(&again[0]));
    assert_ne!(flow_label(&syn[0]), 0);
    // Another stack (another secret) labels the same flow otherwise.
    let mut cfg = config();
    cfg.secret = (1, 2);
    let mut other = Stack::new(cfg);
    let ns = solicit(GLOBAL, Some(peer_mac()));
    let group = solicited_node(GLOBAL);
    receive(
        &mut other,
        &icmpv6_frame(multicast_mac(group), PEER, group, 255, &ns),
    );
    let h = other.udp().bind(5000).unwrap();
    other.udp().send_to(h, peer(53), b"one").unwrap();
    assert_ne!(flow_label(&polled_at(&mut other, T0)[0]), labels[0]);
}

/// The MLDv2 reports in `frames`: (IPv6 source, record types and groups).
fn mld_reports(frames: &[Vec<u8>]) -> Vec<(Ipv6Addr, Vec<(u8, Ipv6Addr)>)> {
    let mut out = Vec::new();
    for f in frames {
        let eth = EthernetFrame::new_checked(&f[..]).unwrap();
        let ip = Ipv6Packet::new_checked(eth.payload()).unwrap();
        if ip.dst_addr() != ALL_MLDV2_ROUTERS {
            continue;
        }
        assert_eq!(eth.dst_addr(), multicast_mac(ALL_MLDV2_ROUTERS));
        assert_eq!(ip.hop_limit(), 1);
        assert_eq!(ip.next_header(), IpProtocol::HopByHop);
        // Hop-by-hop: ICMPv6 next, the router alert option for MLD.
        let p = ip.payload();
        assert_eq!(&p[..6], &[58, 0, 5, 2, 0, 0]);
        let icmp = Icmpv6Packet::new_checked(&p[8..]).unwrap();
        assert!(icmp.verify_checksum(&ip.src_addr(), &ip.dst_addr()));
        assert_eq!(u8::from(icmp.msg_type()), 143);
        let b = &p[8..];
        let n = usize::from(u16::from_be_bytes([b[6], b[7]]));
        assert_eq!(b.len(), 8 + 20 * n);
        let records = (0..n)
            .map(|i| {
                let r = &b[8 + 20 * i..8 + 20 * (i + 1)];
                assert_eq!(&r[1..4], &[0, 0, 0], "no aux data, no sources");
                (r[0], Ipv6Addr::from(<[u8; 16]>::try_from(&r[4..]).unwrap()))
            })
            .collect();
        out.push((ip.src_addr(), records));
    }
    out
}

/// Poll `s` every 10 ms from `from` for `span`; every frame sent.
fn run(s: &mut Stack, from: Instant, span: Duration) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    let mut t = from;
    while t <= from + span {
        frames.extend(polled_at(s, t));
        t += Duration::from_millis(10);
    }
    frames
}

/// At start: two unsolicited reports (a join of every solicited-node
/// group, link-local and configured addresses alike), the first within a
/// second, from the link-local address; never the all-nodes group. A
/// general query from a router is answered with the state of every group
/// within its maximum response delay; a query that is not from a
/// link-local address with hop limit 1 is not.
#[test]
fn mld_reports_our_groups_at_start_and_on_query() {
    let mut s = Stack::new(config());
    let ll = link_local(host_mac(1));
    let groups = {
        let mut g = vec![solicited_node(ll), solicited_node(GLOBAL)];
        g.sort();
        g
    };
    let joined: Vec<(u8, Ipv6Addr)> = groups.iter().map(|&g| (4, g)).collect();
    let first = run(&mut s, T0, Duration::from_secs(1));
    let reports = mld_reports(&first);
    assert!(!reports.is_empty(), "a report within the first second");
    let reports = [
        reports,
        mld_reports(&run(
            &mut s,
            T0 + Duration::from_millis(1010),
            Duration::from_secs(5),
        )),
    ]
    .concat();
    assert_eq!(reports.len(), 2, "{reports:?}");
    for (src, records) in &reports {
        assert_eq!(*src, ll);
        assert_eq!(records, &joined);
    }
    assert_eq!(s.stats().ipv6.tx_mld_reports, 2);
    // A general query (to all nodes, from a router's link-local address,
    // hop limit 1, the answer within 1 s).
    let router = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0x99);
    let query = Icmpv6Repr::Mld(smoltcp::wire::MldRepr::Query {
        max_resp_code: 1000,
        mcast_addr: Ipv6Addr::UNSPECIFIED,
        s_flag: false,
        qrv: 2,
        qqic: 125,
        num_srcs: 0,
        data: &[],
    });
    let t = T0 + Duration::from_secs(10);
    let ignored = icmpv6_frame(multicast_mac(ALL_NODES), router, ALL_NODES, 64, &query);
    assert!(receive(&mut s, &ignored).frames.is_empty());
    assert!(mld_reports(&run(&mut s, t, Duration::from_secs(2))).is_empty());
    assert_eq!(s.stats().ipv6.rx_mld_queries, 0);
    let frame = icmpv6_frame(multicast_mac(ALL_NODES), router, ALL_NODES, 1, &query);
    let mut tx = VecTx::new();
    let t = T0 + Duration::from_secs(20);
    s.receive(t, &frame, ustack::RxMeta::default(), &mut tx);
    assert!(tx.frames.is_empty(), "not at once");
    let answers = mld_reports(&run(&mut s, t, Duration::from_secs(1)));
    assert_eq!(answers.len(), 1);
    let state: Vec<(u8, Ipv6Addr)> = groups.iter().map(|&g| (2, g)).collect();
    assert_eq!(answers[0].1, state);
    assert_eq!(s.stats().ipv6.rx_mld_queries, 1);
    // Nothing more until something changes.
    assert!(
        mld_reports(&run(
            &mut s,
            t + Duration::from_secs(2),
            Duration::from_secs(5)
        ))
        .is_empty()
    );
}

/// Redirects as a Linux host takes them (RFC 4861 §8): from the router
/// that packets to a destination go to, a better first hop (its MAC from
/// the message) or the news that the destination is on-link; one from
/// any other host is dropped.
/// The MLDv1 reports in `frames` (RFC 2710: type 131, 24 bytes, to the
/// group itself, hop limit 1 behind the router alert): their groups.
fn mld_v1_reports(frames: &[Vec<u8>]) -> Vec<Ipv6Addr> {
    let mut out = Vec::new();
    for f in frames {
        let eth = EthernetFrame::new_checked(&f[..]).unwrap();
        let ip = Ipv6Packet::new_checked(eth.payload()).unwrap();
        let p = ip.payload();
        if ip.next_header() != IpProtocol::HopByHop || p.len() != 8 + 24 || p[8] != 131 {
            continue;
        }
        assert_eq!(&p[..6], &[58, 0, 5, 2, 0, 0]);
        assert_eq!(ip.hop_limit(), 1);
        let icmp = &p[8..];
        assert!(ustack::wire::checksum::verifies_ip(
            ip.src_addr().into(),
            ip.dst_addr().into(),
            58,
            icmp
        ));
        let group = Ipv6Addr::from(<[u8; 16]>::try_from(&icmp[8..24]).unwrap());
        assert_eq!(ip.dst_addr(), group, "sent to the group itself");
        assert_eq!(eth.dst_addr(), multicast_mac(group));
        out.push(group);
    }
    out
}

/// An MLDv1 general query (RFC 2710: 24 bytes) from `router` at hop
/// limit `hop_limit`, with a 1 s maximum response delay.
fn mld_v1_query(router: Ipv6Addr, hop_limit: u8) -> Vec<u8> {
    let mut q = [0u8; 24];
    q[0] = 130;
    q[4..6].copy_from_slice(&1000u16.to_be_bytes());
    let sum = ustack::wire::checksum::compute_ip(router.into(), ALL_NODES.into(), 58, &q);
    q[2..4].copy_from_slice(&sum.to_be_bytes());
    let mut f = v6_frame_from(ALL_NODES, router, IpProtocol::Icmpv6, &q);
    f[..6].copy_from_slice(multicast_mac(ALL_NODES).as_bytes());
    f[14 + 7] = hop_limit;
    f
}

/// A router that speaks only MLDv1 (RFC 3810 §8.2.1): its query (24
/// bytes) is answered within its delay by one version 1 report per
/// group, each to the group; so are later changes while it was heard in
/// the last 260 s, and version 2 comes back after.
#[test]
fn an_mldv1_router_is_answered_in_version_1() {
    let mut s = Stack::new(config());
    let ll = link_local(host_mac(1));
    let mut groups = vec![solicited_node(ll), solicited_node(GLOBAL)];
    groups.sort();
    // The unsolicited version 2 reports of the start.
    let start = run(&mut s, T0, Duration::from_secs(3));
    assert_eq!(mld_reports(&start).len(), 2);
    assert!(mld_v1_reports(&start).is_empty());
    let router = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0x99);
    // Hop limit 64: not a query a router sends; ignored.
    let t = T0 + Duration::from_secs(10);
    assert!(receive(&mut s, &mld_v1_query(router, 64)).frames.is_empty());
    let after = run(&mut s, t, Duration::from_secs(2));
    assert!(mld_v1_reports(&after).is_empty() && mld_reports(&after).is_empty());
    assert_eq!(s.stats().ipv6.rx_mld_v1_queries, 0);
    let t = T0 + Duration::from_secs(20);
    let mut tx = VecTx::new();
    s.receive(
        t,
        &mld_v1_query(router, 1),
        ustack::RxMeta::default(),
        &mut tx,
    );
    assert!(tx.frames.is_empty(), "not at once");
    assert_eq!(s.stats().ipv6.rx_mld_v1_queries, 1);
    let answered = run(&mut s, t, Duration::from_secs(1));
    let mut got = mld_v1_reports(&answered);
    got.sort();
    assert_eq!(got, groups);
    assert!(mld_reports(&answered).is_empty(), "no version 2 report");
    assert_eq!(s.stats().ipv6.tx_mld_v1_reports, 2);
    // A bad checksum is dropped and answers nothing.
    let mut bad = mld_v1_query(router, 1);
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert!(receive(&mut s, &bad).frames.is_empty());
    let after = run(&mut s, t + Duration::from_secs(2), Duration::from_secs(2));
    assert!(mld_v1_reports(&after).is_empty() && mld_reports(&after).is_empty());
    assert_eq!(s.stats().ipv6.rx_mld_v1_queries, 1);
}

#[test]
fn redirects_from_the_first_hop_router_are_taken() {
    let mut s = host();
    receive(&mut s, &router_advert(router_ll(), 1800, None, None));
    let far = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 9);
    let h = s.udp().bind(5000).unwrap();
    let send = |s: &mut Stack| {
        s.udp()
            .send_to(h, SocketAddr::new(far.into(), 53), b"x")
            .unwrap();
        polled_at(s, T0)
            .into_iter()
            .map(|f| v6_dst(&f))
            .filter(|(_, d)| *d == far || d.segments()[0] == 0xff02)
            .collect::<Vec<_>>()
    };
    assert_eq!(send(&mut s), vec![(peer_mac(), far)], "via the router");
    let better = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0x77);
    let better_mac = EthernetAddress([0x02, 0, 0, 0, 0, 0x77]);
    let redirect = |from: Ipv6Addr, target: Ipv6Addr, mac: Option<EthernetAddress>| {
        let r = Icmpv6Repr::Ndisc(NdiscRepr::Redirect {
            target_addr: target,
            dest_addr: far,
            lladdr: mac.map(RawHardwareAddress::from),
            redirected_hdr: None,
        });
        icmpv6_frame(host_mac(1), from, link_local(host_mac(1)), 255, &r)
    };
    // Not from the router: dropped, nothing changes.
    let stranger = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0x66);
    receive(&mut s, &redirect(stranger, better, Some(better_mac)));
    assert_eq!(send(&mut s), vec![(peer_mac(), far)]);
    assert_eq!(s.stats().ipv6.rx_redirects, 0);
    // From the router: the better first hop, at the MAC it gave.
    receive(&mut s, &redirect(router_ll(), better, Some(better_mac)));
    assert_eq!(send(&mut s), vec![(better_mac, far)]);
    // From the router now in use (the redirected one): on-link, so the
    // destination itself is solicited.
    receive(&mut s, &redirect(better, far, None));
    assert_eq!(
        send(&mut s),
        vec![(multicast_mac(solicited_node(far)), solicited_node(far))]
    );
    assert_eq!(s.stats().ipv6.rx_redirects, 2);
}

/// Packet too big for a UDP flow (RFC 8201): the path MTU to that
/// destination drops to what the message says (never below 1,280, never
/// raised by a later message), datagrams there leave in fragments that
/// fit, other destinations keep the link MTU, and after 10 minutes the
/// link MTU is tried again.
#[test]
fn packet_too_big_lowers_the_path_mtu_for_udp() {
    let mut s = host();
    let h = s.udp().bind(5000).unwrap();
    let sizes = |s: &mut Stack, at: Instant, to: Ipv6Addr| -> Vec<usize> {
        s.udp()
            .send_to(h, SocketAddr::new(to.into(), 53), &[1u8; 1400])
            .unwrap();
        polled_at(s, at)
            .into_iter()
            .filter(|f| v6_dst(f).1 == to)
            .map(|f| f.len() - ETHERNET_HEADER_LEN)
            .collect()
    };
    assert_eq!(sizes(&mut s, T0, PEER), vec![1448]);
    let too_big = |mtu: u32| {
        let header = Ipv6Repr {
            src_addr: GLOBAL,
            dst_addr: PEER,
            next_header: IpProtocol::Udp,
            payload_len: 1408,
            hop_limit: 64,
        };
        let ptb = Icmpv6Repr::PktTooBig {
            mtu,
            header,
            data: &[0x13, 0x88, 0, 53, 0x05, 0x80, 0, 0],
        };
        let router = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 0x99);
        icmpv6_frame(host_mac(1), router, GLOBAL, 64, &ptb)
    };
    receive(&mut s, &too_big(1300));
    let frags = sizes(&mut s, T0, PEER);
    assert_eq!(frags.len(), 2, "{frags:?}");
    assert!(frags.iter().all(|&n| n <= 1300), "{frags:?}");
    // Below the minimum: 1,280. A larger MTU later: not taken.
    receive(&mut s, &too_big(600));
    receive(&mut s, &too_big(1400));
    let frags = sizes(&mut s, T0, PEER);
    assert!(frags.iter().all(|&n| n <= 1280), "{frags:?}");
    assert!(frags.iter().any(|&n| n > 1250), "{frags:?}");
    assert_eq!(s.stats().ipv6.path_mtus_learnt, 2);
    // Another destination: the link's MTU.
    let other = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 3);
    let ns = solicit(GLOBAL, Some(EthernetAddress([2, 0, 0, 0, 0, 3])));
    let group = solicited_node(GLOBAL);
    receive(
        &mut s,
        &icmpv6_frame(multicast_mac(group), other, group, 255, &ns),
    );
    assert_eq!(sizes(&mut s, T0, other), vec![1448]);
    // Ten minutes on: the link MTU again.
    let later = T0 + Duration::from_secs(601);
    polled_at(&mut s, later);
    assert_eq!(sizes(&mut s, later, PEER), vec![1448]);
}

/// A neighbor that moves to another MAC (an advertisement with the
/// override flag, RFC 4861 §7.2.5) is sent to at its new MAC from the
/// next packet on, also in a run of packets to it (the transmit path
/// remembers its last route).
#[test]
fn a_neighbor_that_moves_is_followed_at_once() {
    let mut s = host();
    let h = s.udp().bind(5000).unwrap();
    let send = |s: &mut Stack| {
        for _ in 0..2 {
            s.udp()
                .send_to(h, SocketAddr::new(PEER.into(), 53), b"x")
                .unwrap();
        }
        polled_at(s, T0)
            .into_iter()
            .map(|f| v6_dst(&f))
            .filter(|(_, d)| *d == PEER)
            .collect::<Vec<_>>()
    };
    assert_eq!(send(&mut s), vec![(peer_mac(), PEER); 2]);
    let moved = EthernetAddress([0x02, 0, 0, 0, 0, 0x42]);
    let na = Icmpv6Repr::Ndisc(NdiscRepr::NeighborAdvert {
        flags: NdiscNeighborFlags::OVERRIDE,
        target_addr: PEER,
        lladdr: Some(RawHardwareAddress::from(moved)),
    });
    receive(
        &mut s,
        &icmpv6_frame(host_mac(1), PEER, ALL_NODES, 255, &na),
    );
    assert_eq!(send(&mut s), vec![(moved, PEER); 2]);
}
