//! What tools nobody on the project wrote found (scapy, nmap, hping3,
//! tshark's expert analysis), each as a test on raw frames that failed
//! before the fix: stale bytes in reused buffers, ICMP error quotes, the
//! listener's answer to scans, data after close, orphaned FIN-WAIT-2,
//! reset rate, IPv4 IDs, path MTU, Record Route, SYN-cookie options.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use ustack::sim::{host_config, host_mac};
use ustack::socket::tcp::State;
use ustack::stats::DropReason;
use ustack::wire::*;
use ustack::{Config, Instant, Stack, VecTx};

const US: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const T0: Instant = Instant::ZERO;

fn config() -> Config {
    let mut cfg = host_config(1);
    cfg.announce = false;
    cfg.secret = (0x1111, 0x2222);
    cfg
}

/// A stack that knows the peer's MAC (so replies leave at once).
fn stack_with(cfg: Config) -> Stack {
    let mut s = Stack::new(cfg);
    let mut tx = VecTx::new();
    s.receive(
        T0,
        &arp_request(PEER, US),
        ustack::RxMeta::default(),
        &mut tx,
    );
    s
}

fn stack() -> Stack {
    stack_with(config())
}

fn arp_request(spa: Ipv4Addr, tpa: Ipv4Addr) -> Vec<u8> {
    let repr = ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Request,
        source_hardware_addr: host_mac(2),
        source_protocol_addr: spa,
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: tpa,
    };
    let mut b = vec![0u8; repr.buffer_len()];
    repr.emit(&mut ArpPacket::new_unchecked(&mut b[..]));
    eth(EthernetAddress::BROADCAST, EthernetProtocol::Arp, &b)
}

fn eth(dst: EthernetAddress, ethertype: EthernetProtocol, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; ETHERNET_HEADER_LEN + payload.len()];
    EthernetRepr {
        src_addr: host_mac(2),
        dst_addr: dst,
        ethertype,
    }
    .emit(&mut EthernetFrame::new_unchecked(&mut f[..]));
    f[ETHERNET_HEADER_LEN..].copy_from_slice(payload);
    f
}

/// An IPv4 header the way a foreign host writes it: its own ID, TOS, TTL,
/// no DF, and options.
#[derive(Clone, Copy)]
struct Hdr<'a> {
    protocol: IpProtocol,
    ident: u16,
    options: &'a [u8],
    frag: (u16, bool),
}

impl Hdr<'_> {
    fn of(protocol: IpProtocol) -> Self {
        Hdr {
            protocol,
            ident: 0xbeef,
            options: &[],
            frag: (0, false),
        }
    }
}

fn ip_packet(h: Hdr<'_>, payload: &[u8]) -> Vec<u8> {
    let hl = IPV4_HEADER_LEN + h.options.len();
    let mut p = vec![0u8; hl + payload.len()];
    p[IPV4_HEADER_LEN..hl].copy_from_slice(h.options);
    p[hl..].copy_from_slice(payload);
    let mut pkt = Ipv4Packet::new_unchecked(&mut p[..]);
    pkt.set_version(4);
    pkt.set_header_len(hl as u8);
    pkt.set_dscp(0x04);
    pkt.set_total_len((hl + payload.len()) as u16);
    pkt.set_ident(h.ident);
    pkt.clear_flags();
    pkt.set_more_frags(h.frag.1);
    pkt.set_frag_offset(h.frag.0);
    pkt.set_hop_limit(61);
    pkt.set_next_header(h.protocol);
    pkt.set_src_addr(PEER);
    pkt.set_dst_addr(US);
    pkt.fill_checksum();
    p
}

fn frame(h: Hdr<'_>, payload: &[u8]) -> Vec<u8> {
    eth(host_mac(1), EthernetProtocol::Ipv4, &ip_packet(h, payload))
}

fn udp(dst_port: u16, data: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 8 + data.len()];
    UdpRepr {
        src_port: 5555,
        dst_port,
    }
    .emit(
        &mut UdpPacket::new_unchecked(&mut b[..]),
        &IpAddress::Ipv4(PEER),
        &IpAddress::Ipv4(US),
        data.len(),
        |p| p.copy_from_slice(data),
        &ChecksumCapabilities::default(),
    );
    b
}

fn echo_request(data: &[u8]) -> Vec<u8> {
    let repr = Icmpv4Repr::EchoRequest {
        ident: 0x4242,
        seq_no: 9,
        data,
    };
    let mut b = vec![0u8; repr.buffer_len()];
    repr.emit(
        &mut Icmpv4Packet::new_unchecked(&mut b[..]),
        &ChecksumCapabilities::default(),
    );
    b
}

/// A TCP segment from the peer's port 40000.
struct Seg<'a> {
    dst_port: u16,
    src_port: u16,
    control: TcpControl,
    seq: u32,
    ack: Option<u32>,
    window: u16,
    wscale: Option<u8>,
    sack_permitted: bool,
    sack: [Option<(u32, u32)>; 3],
    ts: Option<(u32, u32)>,
    payload: &'a [u8],
}

impl Default for Seg<'_> {
    fn default() -> Self {
        Seg {
            dst_port: 80,
            src_port: 40_000,
            control: TcpControl::None,
            seq: 1000,
            ack: None,
            window: 65_535,
            wscale: None,
            sack_permitted: false,
            sack: [None; 3],
            ts: None,
            payload: &[],
        }
    }
}

fn tcp(s: &Seg<'_>) -> Vec<u8> {
    let repr = TcpRepr {
        src_port: s.src_port,
        dst_port: s.dst_port,
        control: s.control,
        seq_number: TcpSeqNumber(s.seq as i32),
        ack_number: s.ack.map(|a| TcpSeqNumber(a as i32)),
        window_len: s.window,
        window_scale: s.wscale,
        max_seg_size: (s.control == TcpControl::Syn).then_some(1460),
        sack_permitted: s.sack_permitted,
        sack_ranges: s.sack,
        timestamp: s.ts.map(|(v, e)| TcpTimestampRepr::new(v, e)),
        payload: s.payload,
    };
    let mut b = vec![0u8; repr.buffer_len()];
    repr.emit(
        &mut TcpPacket::new_unchecked(&mut b[..]),
        &IpAddress::Ipv4(PEER),
        &IpAddress::Ipv4(US),
        &ChecksumCapabilities::default(),
    );
    b
}

fn tcp_frame(s: &Seg<'_>) -> Vec<u8> {
    frame(Hdr::of(IpProtocol::Tcp), &tcp(s))
}

/// Receive `f` (nothing when empty) and poll; what the stack sent.
fn feed(s: &mut Stack, now: Instant, f: &[u8]) -> Vec<Vec<u8>> {
    let mut tx = VecTx::new();
    if !f.is_empty() {
        s.receive(now, f, ustack::RxMeta::default(), &mut tx);
    }
    s.poll(now, &mut tx);
    tx.frames
}

fn ipv4_of(f: &[u8]) -> Ipv4Packet<&[u8]> {
    let ip = Ipv4Packet::new_checked(&f[ETHERNET_HEADER_LEN..]).unwrap();
    assert!(ip.verify_checksum());
    ip
}

/// The TCP segments among `frames`, parsed.
fn segments(frames: &[Vec<u8>]) -> Vec<TcpRepr<'_>> {
    frames
        .iter()
        .filter_map(|f| {
            let ip = Ipv4Packet::new_checked(&f[ETHERNET_HEADER_LEN..]).ok()?;
            if ip.next_header() != IpProtocol::Tcp {
                return None;
            }
            let hl = usize::from(ip.header_len());
            let body = &f[ETHERNET_HEADER_LEN + hl..];
            let p = TcpPacket::new_checked(body).ok()?;
            assert!(p.verify_checksum(&IpAddress::Ipv4(US), &IpAddress::Ipv4(PEER)));
            TcpRepr::parse(
                &p,
                &IpAddress::Ipv4(US),
                &IpAddress::Ipv4(PEER),
                &ChecksumCapabilities::default(),
            )
            .ok()
        })
        .collect()
}

fn drop_count(s: &Stack, r: DropReason) -> u64 {
    s.stats().drops.get(r)
}

// ------------------------------------------------------- stale bytes

#[test]
fn icmp_errors_zero_the_unused_word_and_quote_the_datagram_as_received() {
    // Buffers that held something else before (a reused pool buffer).
    for poison in [0x00, 0xa5, 0xff] {
        let mut s = stack();
        // Record Route with room, then NOP and EOL: 12 bytes of options.
        let opts = [7, 7, 4, 0, 0, 0, 0, 1, 1, 1, 1, 0];
        let cases: Vec<Vec<u8>> = vec![
            ip_packet(Hdr::of(IpProtocol::Udp), &udp(9999, b"to a closed port")),
            ip_packet(
                Hdr {
                    options: &opts,
                    ident: 0x1357,
                    ..Hdr::of(IpProtocol::Udp)
                },
                &udp(9998, b"with options"),
            ),
            ip_packet(Hdr::of(IpProtocol::Unknown(253)), b"an unknown protocol"),
        ];
        for (i, dgram) in cases.iter().enumerate() {
            let mut tx = VecTx::poisoned(poison);
            let f = eth(host_mac(1), EthernetProtocol::Ipv4, dgram);
            s.receive(
                Instant::from_millis(i as u64 * 20),
                &f,
                ustack::RxMeta::default(),
                &mut tx,
            );
            assert_eq!(tx.frames.len(), 1, "case {i}: one ICMP error");
            let ip = ipv4_of(&tx.frames[0]);
            assert_eq!(ip.next_header(), IpProtocol::Icmp);
            let icmp = Icmpv4Packet::new_checked(ip.payload()).unwrap();
            assert!(icmp.verify_checksum());
            assert_eq!(u8::from(icmp.msg_type()), 3);
            assert_eq!(
                &ip.payload()[4..8],
                &[0, 0, 0, 0],
                "case {i}, poison {poison:#x}: the unused word leaks"
            );
            let hl = usize::from(Ipv4Packet::new_checked(&dgram[..]).unwrap().header_len());
            assert_eq!(
                &ip.payload()[8..],
                &dgram[..hl + 8],
                "case {i}: the quote is the header and 8 bytes as received"
            );
        }
    }
}

#[test]
fn icmp_error_about_a_reassembled_datagram_quotes_its_first_fragment() {
    let mut s = stack();
    let body = udp(9999, &[0x5a; 64]);
    let (a, b) = body.split_at(32);
    let first = ip_packet(
        Hdr {
            frag: (0, true),
            ident: 0x4444,
            ..Hdr::of(IpProtocol::Udp)
        },
        a,
    );
    let second = ip_packet(
        Hdr {
            frag: (32, false),
            ident: 0x4444,
            ..Hdr::of(IpProtocol::Udp)
        },
        b,
    );
    let mut tx = VecTx::poisoned(0xee);
    s.receive(
        T0,
        &eth(host_mac(1), EthernetProtocol::Ipv4, &second),
        ustack::RxMeta::default(),
        &mut tx,
    );
    s.receive(
        T0,
        &eth(host_mac(1), EthernetProtocol::Ipv4, &first),
        ustack::RxMeta::default(),
        &mut tx,
    );
    assert_eq!(tx.frames.len(), 1);
    let ip = ipv4_of(&tx.frames[0]);
    assert_eq!(&ip.payload()[4..8], &[0, 0, 0, 0]);
    assert_eq!(&ip.payload()[8..], &first[..IPV4_HEADER_LEN + 8]);
}

/// Everything the stack builds, from two identical stacks whose buffers
/// start as 0x00 and as 0xff: any byte a builder leaves unwritten differs.
fn every_kind_of_frame(poison: u8) -> Vec<Vec<u8>> {
    let mut cfg = config();
    cfg.announce = true;
    let mut s = Stack::new(cfg);
    let mut out = Vec::new();
    // Receive `f` (if any), poll, keep what was sent.
    let mut go = |s: &mut Stack, now: Instant, f: Option<&[u8]>| {
        let mut tx = VecTx::poisoned(poison);
        if let Some(f) = f {
            s.receive(now, f, ustack::RxMeta::default(), &mut tx);
        }
        s.poll(now, &mut tx);
        out.extend(tx.frames);
    };
    let l = s.tcp().listen(80, 1).unwrap();
    let u = s.udp().bind(7000).unwrap();
    let p = s.ping().open(77).unwrap();
    // Gratuitous ARP, an ARP request for an unknown host (with a ping held).
    s.ping().send(p, Ipv4Addr::new(10, 0, 0, 9), 1, 56).unwrap();
    go(&mut s, T0, None);
    // ARP reply, echo reply, echo reply with Record Route, ICMP errors.
    go(&mut s, T0, Some(&arp_request(PEER, US)));
    go(
        &mut s,
        T0,
        Some(&frame(Hdr::of(IpProtocol::Icmp), &echo_request(&[1; 40]))),
    );
    let rr = [7, 11, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    go(
        &mut s,
        T0,
        Some(&frame(
            Hdr {
                options: &rr,
                ..Hdr::of(IpProtocol::Icmp)
            },
            &echo_request(&[2; 3]),
        )),
    );
    go(
        &mut s,
        T0,
        Some(&frame(Hdr::of(IpProtocol::Udp), &udp(1, b"x"))),
    );
    // A ping, a UDP datagram, a fragmented UDP datagram.
    s.ping().send(p, PEER, 2, 3).unwrap();
    s.udp()
        .send_to(u, SocketAddrV4::new(PEER, 9), b"hello")
        .unwrap();
    s.udp()
        .send_to(u, SocketAddrV4::new(PEER, 9), &[3; 3000])
        .unwrap();
    go(&mut s, T0, None);
    // TCP: RST to a closed port, SYN-ACK with every option, data with SACK
    // blocks in our ACKs, a SYN-cookie SYN-ACK, an active open's SYN.
    go(
        &mut s,
        T0,
        Some(&tcp_frame(&Seg {
            dst_port: 81,
            control: TcpControl::Syn,
            ..Seg::default()
        })),
    );
    let syn = Seg {
        control: TcpControl::Syn,
        wscale: Some(7),
        sack_permitted: true,
        ts: Some((100, 0)),
        ..Seg::default()
    };
    let mut probe = stack_with(config());
    probe.tcp().listen(80, 1).unwrap();
    let synack = feed(&mut probe, T0, &tcp_frame(&syn));
    let synack = segments(&synack)[0];
    go(&mut s, T0, Some(&tcp_frame(&syn)));
    let iss = synack.seq_number.0 as u32;
    let ack = Seg {
        seq: 1001,
        ack: Some(iss + 1),
        ts: Some((101, synack.timestamp.unwrap().tsval)),
        ..Seg::default()
    };
    go(&mut s, T0, Some(&tcp_frame(&ack)));
    go(
        &mut s,
        T0,
        Some(&tcp_frame(&Seg {
            seq: 1001 + 100,
            payload: &[9; 50],
            ..ack
        })),
    );
    go(
        &mut s,
        T0,
        Some(&tcp_frame(&Seg {
            src_port: 40_001,
            ..syn
        })),
    );
    go(
        &mut s,
        T0,
        Some(&tcp_frame(&Seg {
            src_port: 40_002,
            ..syn
        })),
    );
    let h = s.tcp().accept(l).unwrap().unwrap();
    s.tcp().send(h, &[4; 3000]).unwrap();
    s.tcp().connect(T0, SocketAddrV4::new(PEER, 443)).unwrap();
    go(&mut s, T0, None);
    out
}

#[test]
fn no_frame_carries_bytes_its_builder_did_not_write() {
    let clean = every_kind_of_frame(0x00);
    let dirty = every_kind_of_frame(0xff);
    assert!(
        clean.len() >= 15,
        "the scenario emits every kind: {}",
        clean.len()
    );
    assert_eq!(clean.len(), dirty.len());
    for (i, (a, b)) in clean.iter().zip(&dirty).enumerate() {
        assert_eq!(a, b, "frame {i} depends on what its buffer held before");
    }
}

// ------------------------------------------------------------- TCP

#[test]
fn listener_drops_fin_null_and_xmas_scans_unanswered() {
    let mut s = stack();
    s.tcp().listen(80, 8).unwrap();
    let scans = [
        ("FIN", TcpControl::Fin, &[][..]),
        ("NULL", TcpControl::None, &[][..]),
        ("FIN+PSH", TcpControl::Fin, &b"x"[..]),
    ];
    for (name, control, payload) in scans {
        let out = feed(
            &mut s,
            T0,
            &tcp_frame(&Seg {
                control,
                payload,
                ..Seg::default()
            }),
        );
        assert!(out.is_empty(), "{name} scan answered: {out:?}");
    }
    // The Xmas scan: FIN, PSH and URG set (crafted; TcpRepr has no URG).
    let mut b = tcp(&Seg {
        control: TcpControl::Fin,
        ..Seg::default()
    });
    let mut p = TcpPacket::new_unchecked(&mut b[..]);
    p.set_psh(true);
    p.set_urg(true);
    p.fill_checksum(&IpAddress::Ipv4(PEER), &IpAddress::Ipv4(US));
    assert!(feed(&mut s, T0, &frame(Hdr::of(IpProtocol::Tcp), &b)).is_empty());
    assert_eq!(drop_count(&s, DropReason::TcpListenNoAck), 4);
    // A closed port still answers the same scan with RST (RFC 9293 3.10.7.1).
    let out = feed(
        &mut s,
        T0,
        &tcp_frame(&Seg {
            dst_port: 81,
            control: TcpControl::Fin,
            ..Seg::default()
        }),
    );
    assert_eq!(segments(&out)[0].control, TcpControl::Rst);
    // And the listener still accepts connections.
    let out = feed(
        &mut s,
        T0,
        &tcp_frame(&Seg {
            control: TcpControl::Syn,
            ..Seg::default()
        }),
    );
    assert_eq!(segments(&out)[0].control, TcpControl::Syn);
}

/// A connection accepted on port 80 from the peer's 40000; returns the
/// handle, our ISS and the time.
fn accepted(s: &mut Stack) -> (ustack::socket::tcp::TcpHandle, u32) {
    let l = s.tcp().listen(80, 8).unwrap();
    let out = feed(
        s,
        T0,
        &tcp_frame(&Seg {
            control: TcpControl::Syn,
            ..Seg::default()
        }),
    );
    let iss = segments(&out)[0].seq_number.0 as u32;
    feed(
        s,
        T0,
        &tcp_frame(&Seg {
            seq: 1001,
            ack: Some(iss + 1),
            ..Seg::default()
        }),
    );
    (s.tcp().accept(l).unwrap().unwrap(), iss)
}

#[test]
fn data_after_close_is_answered_with_rst() {
    let mut s = stack();
    let (h, iss) = accepted(&mut s);
    s.tcp().close(T0, h).unwrap();
    let out = feed(&mut s, T0, &[]);
    let fin = &segments(&out)[0];
    assert_eq!(fin.control, TcpControl::Fin);
    // The peer acknowledges our FIN but keeps sending: nobody will read it.
    let out = feed(
        &mut s,
        T0,
        &tcp_frame(&Seg {
            seq: 1001,
            ack: Some(iss + 2),
            payload: b"late data",
            ..Seg::default()
        }),
    );
    let rst = &segments(&out)[0];
    assert_eq!(rst.control, TcpControl::Rst);
    assert_eq!(
        rst.seq_number.0 as u32,
        iss + 2,
        "RST at the peer's SEG.ACK"
    );
    assert_eq!(s.stats().tcp.connections, 0, "the connection is gone");
}

#[test]
fn close_with_unread_data_resets_and_half_close_does_not() {
    let mut s = stack();
    let (h, iss) = accepted(&mut s);
    feed(
        &mut s,
        T0,
        &tcp_frame(&Seg {
            seq: 1001,
            ack: Some(iss + 1),
            payload: b"unread",
            ..Seg::default()
        }),
    );
    s.tcp().close(T0, h).unwrap();
    let out = feed(&mut s, T0, &[]);
    assert_eq!(segments(&out)[0].control, TcpControl::Rst);
    assert_eq!(s.stats().tcp.connections, 0);

    // shutdown() only closes our side: data keeps arriving and is readable.
    let mut s = stack();
    let (h, iss) = accepted(&mut s);
    s.tcp().shutdown(h).unwrap();
    feed(&mut s, T0, &[]);
    let out = feed(
        &mut s,
        T0,
        &tcp_frame(&Seg {
            seq: 1001,
            ack: Some(iss + 2),
            payload: b"still welcome",
            ..Seg::default()
        }),
    );
    assert!(segments(&out).iter().all(|r| r.control != TcpControl::Rst));
    let mut buf = [0u8; 64];
    assert_eq!(s.tcp().recv(h, &mut buf).unwrap(), 13);
}

#[test]
fn orphaned_fin_wait2_ends_after_its_timeout() {
    let mut cfg = config();
    // Shorter than the ARP entry's life, so the RST leaves at once.
    cfg.tcp.fin_wait2_timeout = Duration::from_secs(30);
    let mut s = stack_with(cfg);
    let (h, iss) = accepted(&mut s);
    s.tcp().close(T0, h).unwrap();
    feed(&mut s, T0, &[]);
    // The FIN is acknowledged; the peer never closes.
    feed(
        &mut s,
        T0,
        &tcp_frame(&Seg {
            seq: 1001,
            ack: Some(iss + 2),
            ..Seg::default()
        }),
    );
    let states: Vec<State> = s.tcp_ref().connections().map(|c| c.state).collect();
    assert_eq!(states, vec![State::FinWait2]);
    assert!(feed(&mut s, Instant::from_secs(29), &[]).is_empty());
    assert_eq!(s.stats().tcp.connections, 1);
    let out = feed(&mut s, Instant::from_secs(30), &[]);
    assert_eq!(segments(&out)[0].control, TcpControl::Rst);
    assert_eq!(s.stats().tcp.connections, 0);

    // A half-closed connection the app still holds waits for the peer.
    let mut s = stack();
    let (h, iss) = accepted(&mut s);
    s.tcp().shutdown(h).unwrap();
    feed(&mut s, T0, &[]);
    feed(
        &mut s,
        T0,
        &tcp_frame(&Seg {
            seq: 1001,
            ack: Some(iss + 2),
            ..Seg::default()
        }),
    );
    feed(&mut s, Instant::from_secs(3600), &[]);
    assert_eq!(s.tcp_ref().status(h).unwrap().state, State::FinWait2);
}

#[test]
fn resets_for_closed_ports_are_rate_limited() {
    let mut cfg = config();
    cfg.rst_rate = 10;
    let mut s = stack_with(cfg);
    let mut rsts = 0;
    for i in 0..100u32 {
        let out = feed(
            &mut s,
            T0,
            &tcp_frame(&Seg {
                dst_port: 81,
                ack: Some(i),
                ..Seg::default()
            }),
        );
        rsts += segments(&out).len();
    }
    assert_eq!(rsts, 10);
    assert_eq!(s.stats().tcp.resets_rate_limited, 90);
    // The bucket refills with time.
    let out = feed(
        &mut s,
        Instant::from_secs(1),
        &tcp_frame(&Seg {
            dst_port: 81,
            ack: Some(7),
            ..Seg::default()
        }),
    );
    assert_eq!(segments(&out).len(), 1);
}

#[test]
fn tcp_sets_df_and_honours_fragmentation_needed() {
    let mut s = stack();
    let (h, iss) = accepted(&mut s);
    s.tcp().send(h, &[7; 6000]).unwrap();
    let out = feed(&mut s, T0, &[]);
    let first = out
        .iter()
        .find(|f| !segments(std::slice::from_ref(f))[0].payload.is_empty())
        .unwrap()
        .clone();
    let ip = ipv4_of(&first);
    assert!(ip.dont_frag(), "TCP sets DF");
    assert_eq!(usize::from(ip.total_len()), 1500);
    // A router says the next hop carries 1000 bytes, quoting our segment.
    let quoted = &first[ETHERNET_HEADER_LEN..ETHERNET_HEADER_LEN + IPV4_HEADER_LEN + 8];
    let mut icmp = vec![0u8; 8 + quoted.len()];
    icmp[0] = 3;
    icmp[1] = 4;
    icmp[6..8].copy_from_slice(&1000u16.to_be_bytes());
    icmp[8..].copy_from_slice(quoted);
    Icmpv4Packet::new_unchecked(&mut icmp[..]).fill_checksum();
    // A forged one (sequence number not in flight) changes nothing.
    let mut forged = icmp.clone();
    forged[8 + IPV4_HEADER_LEN + 4..8 + IPV4_HEADER_LEN + 8]
        .copy_from_slice(&(iss + 1_000_000).to_be_bytes());
    Icmpv4Packet::new_unchecked(&mut forged[..]).fill_checksum();
    feed(&mut s, T0, &frame(Hdr::of(IpProtocol::Icmp), &forged));
    assert_eq!(s.tcp_ref().info(h).unwrap().mss, 1460);
    let out = feed(&mut s, T0, &frame(Hdr::of(IpProtocol::Icmp), &icmp));
    assert_eq!(s.tcp_ref().info(h).unwrap().mss, 960);
    assert_eq!(s.tcp_ref().info(h).unwrap().stats.pmtu_reductions, 1);
    // What is in flight goes again, in segments that fit.
    let sent: Vec<usize> = out
        .iter()
        .map(|f| usize::from(ipv4_of(f).total_len()))
        .collect();
    assert!(!sent.is_empty());
    assert!(sent.iter().all(|&l| l <= 1000), "{sent:?}");
}

#[test]
fn syn_cookie_keeps_window_scale_sack_and_timestamps() {
    let mut s = stack();
    let l = s.tcp().listen(80, 1).unwrap();
    let syn = Seg {
        control: TcpControl::Syn,
        wscale: Some(7),
        sack_permitted: true,
        ts: Some((5000, 0)),
        ..Seg::default()
    };
    // The first SYN fills the backlog; the second is answered with a cookie.
    feed(&mut s, T0, &tcp_frame(&syn));
    let out = feed(
        &mut s,
        T0,
        &tcp_frame(&Seg {
            src_port: 40_001,
            ..syn
        }),
    );
    assert_eq!(s.stats().tcp.syn_cookies_sent, 1);
    let synack = segments(&out)[0];
    assert_eq!(
        synack.window_scale,
        Some(ustack::socket::tcp::TcpConfig::default().rcv_wscale())
    );
    assert!(synack.sack_permitted);
    let tsval = synack.timestamp.expect("timestamps kept").tsval;
    let cookie = synack.seq_number.0 as u32;
    feed(
        &mut s,
        T0,
        &tcp_frame(&Seg {
            src_port: 40_001,
            seq: 1001,
            ack: Some(cookie + 1),
            window: 1000,
            ts: Some((5001, tsval)),
            ..Seg::default()
        }),
    );
    assert_eq!(s.stats().tcp.syn_cookies_accepted, 1);
    // Accept both; the cookie connection is the one from 40001.
    let mut cookie_conn = None;
    while let Some(h) = s.tcp().accept(l).unwrap() {
        if s.tcp_ref().info(h).unwrap().remote.port() == 40_001 {
            cookie_conn = Some(h);
        }
    }
    let h = cookie_conn.expect("the cookie connection was accepted");
    // Window scale: the peer's 1000 is 1000 << 7.
    assert_eq!(s.tcp_ref().info(h).unwrap().snd_wnd, 128_000);
    // SACK and timestamps: an out-of-order segment draws an ACK with both.
    let out = feed(
        &mut s,
        T0,
        &tcp_frame(&Seg {
            src_port: 40_001,
            seq: 1001 + 500,
            ack: Some(cookie + 1),
            window: 1000,
            ts: Some((5002, tsval)),
            payload: &[1; 100],
            ..Seg::default()
        }),
    );
    let ack = &segments(&out)[0];
    assert_eq!(ack.sack_ranges[0], Some((1501, 1601)));
    let ts = ack.timestamp.expect("timestamps on");
    // RFC 7323 4.3: TS.Recent moves only with in-order segments.
    assert_eq!(ts.tsecr, 5001);
    assert!(
        ts.tsval.wrapping_sub(tsval) as i32 >= 0,
        "TSval never goes back"
    );
}

/// The IPv4 ID of the next UDP datagram from socket `u` to `dst`.
fn next_udp_id(s: &mut Stack, u: ustack::socket::udp::UdpHandle, dst: Ipv4Addr) -> u16 {
    s.udp().send_to(u, SocketAddrV4::new(dst, 9), b"x").unwrap();
    let mut tx = VecTx::new();
    s.poll(T0, &mut tx);
    ipv4_of(&tx.frames[0]).ident()
}

/// The first IPv4 ID a stack with `cfg` sends to the peer.
fn first_udp_id(cfg: Config) -> u16 {
    let mut s = stack_with(cfg);
    let u = s.udp().bind(7000).unwrap();
    next_udp_id(&mut s, u, PEER)
}

#[test]
fn ip_ids_are_per_destination() {
    let mut s = stack();
    let other = Ipv4Addr::new(10, 0, 0, 3);
    let mut tx = VecTx::new();
    s.receive(
        T0,
        &arp_request(other, US),
        ustack::RxMeta::default(),
        &mut tx,
    );
    let u = s.udp().bind(7000).unwrap();
    let a0 = next_udp_id(&mut s, u, PEER);
    for _ in 0..100 {
        next_udp_id(&mut s, u, other);
    }
    let a1 = next_udp_id(&mut s, u, PEER);
    assert_eq!(
        a1,
        a0.wrapping_add(1),
        "traffic to another host does not move the IDs a peer sees"
    );
    // And where they start depends on the stack's secret.
    let mut cfg = config();
    cfg.secret = (0x3333, 0x4444);
    assert_ne!(first_udp_id(config()), first_udp_id(cfg));
}

#[test]
fn echo_reply_carries_the_record_route_with_our_address() {
    let mut s = stack();
    // RR of 3 slots, one filled by the peer.
    let rr = [7, 15, 8, 10, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let out = feed(
        &mut s,
        T0,
        &frame(
            Hdr {
                options: &rr,
                ..Hdr::of(IpProtocol::Icmp)
            },
            &echo_request(b"route"),
        ),
    );
    let ip = ipv4_of(&out[0]);
    assert_eq!(usize::from(ip.header_len()), 20 + 16);
    let opts = &out[0][ETHERNET_HEADER_LEN + 20..ETHERNET_HEADER_LEN + 36];
    assert_eq!(
        opts,
        &[7, 15, 12, 10, 0, 0, 2, 10, 0, 0, 1, 0, 0, 0, 0, 0][..]
    );
    let reply = Icmpv4Packet::new_checked(ip.payload()).unwrap();
    assert_eq!(reply.msg_type(), Icmpv4Message::EchoReply);
    assert_eq!(reply.data(), b"route");
    // A full Record Route comes back unchanged; no options, none back.
    let full = [7, 7, 8, 10, 0, 0, 2, 0];
    let out = feed(
        &mut s,
        T0,
        &frame(
            Hdr {
                options: &full,
                ..Hdr::of(IpProtocol::Icmp)
            },
            &echo_request(b"full"),
        ),
    );
    assert_eq!(
        &out[0][ETHERNET_HEADER_LEN + 20..ETHERNET_HEADER_LEN + 28],
        &full[..]
    );
    let out = feed(
        &mut s,
        T0,
        &frame(Hdr::of(IpProtocol::Icmp), &echo_request(b"x")),
    );
    assert_eq!(ipv4_of(&out[0]).header_len(), 20);
}

/// `TCP_MAXSEG` (packetdrill's `mss-setsockopt-tcp_maxseg-*`): a
/// listener's SYN-ACK and a connection's SYN announce the lowered MSS,
/// and the connection's segments keep to it although the peer offers
/// more. Before, the option was kept without effect.
#[test]
fn tcp_maxseg_lowers_the_mss_announced_and_sent() {
    let mut s = stack();
    let l = s.tcp().listen(80, 8).unwrap();
    s.tcp().set_listener_max_segment(l, 1100).unwrap();
    let out = feed(
        &mut s,
        T0,
        &tcp_frame(&Seg {
            control: TcpControl::Syn,
            ..Seg::default()
        }),
    );
    let synack = segments(&out)[0];
    assert_eq!(synack.max_seg_size, Some(1100), "{synack:?}");
    let iss = synack.seq_number.0 as u32;
    feed(
        &mut s,
        T0,
        &tcp_frame(&Seg {
            seq: 1001,
            ack: Some(iss + 1),
            ..Seg::default()
        }),
    );
    let h = s.tcp().accept(l).unwrap().unwrap();
    assert_eq!(
        s.tcp_ref().info(h).unwrap().mss,
        1100,
        "the peer offered 1460"
    );
    s.tcp().send(h, &[7; 5000]).unwrap();
    let out = feed(&mut s, T0, &[]);
    let sizes: Vec<usize> = segments(&out).iter().map(|r| r.payload.len()).collect();
    assert!(
        !sizes.is_empty() && sizes.iter().all(|&n| n <= 1100),
        "{sizes:?}"
    );

    // Active open: set before the first poll, the SYN announces it.
    let mut s = stack();
    let h = s
        .tcp()
        .connect(T0, std::net::SocketAddr::from((PEER, 9000)))
        .unwrap();
    s.tcp().set_max_segment(h, 1000).unwrap();
    let out = feed(&mut s, T0, &[]);
    assert_eq!(segments(&out)[0].max_seg_size, Some(1000));
}

/// An ICMP destination unreachable (code 1, host) from the path,
/// quoting our segment `quoted` (its TCP bytes, from our address to
/// the peer's).
fn host_unreachable(quoted: &[u8]) -> Vec<u8> {
    let header = Ipv4Repr {
        src_addr: US,
        dst_addr: PEER,
        next_header: IpProtocol::Tcp,
        payload_len: quoted.len(),
        hop_limit: 64,
    };
    let repr = Icmpv4Repr::DstUnreachable {
        reason: Icmpv4DstUnreachable::HostUnreachable,
        header,
        data: &quoted[..8],
    };
    let mut b = vec![0u8; repr.buffer_len()];
    repr.emit(
        &mut Icmpv4Packet::new_unchecked(&mut b[..]),
        &ChecksumCapabilities::default(),
    );
    frame(Hdr::of(IpProtocol::Icmp), &b)
}

/// The TCP bytes of the first TCP segment among `frames`.
fn tcp_bytes(frames: &[Vec<u8>]) -> Vec<u8> {
    let f = frames
        .iter()
        .find(|f| ipv4_of(f).next_header() == IpProtocol::Tcp)
        .expect("a TCP segment");
    ipv4_of(f).payload().to_vec()
}

/// ICMP errors about our TCP segments (packetdrill's
/// `fastopen/server/icmp-baseline`, RFC 5461), as Linux takes them: a
/// half-open passive connection is dropped (its final ACK then meets a
/// reset), an active open fails with "no route to host" at once instead
/// of retrying for minutes, an established connection keeps going, and
/// a quote of a sequence number not in flight is ignored. Before, only
/// fragmentation-needed was acted on.
#[test]
fn icmp_unreachable_ends_handshakes_not_connections() {
    // Passive: SYN, SYN-ACK, then the path says the peer is unreachable.
    let mut s = stack();
    let l = s.tcp().listen(80, 8).unwrap();
    let out = feed(
        &mut s,
        T0,
        &tcp_frame(&Seg {
            control: TcpControl::Syn,
            ..Seg::default()
        }),
    );
    let synack = tcp_bytes(&out);
    let iss = segments(&out)[0].seq_number.0 as u32;
    // The error and the final ACK right behind it, in one burst (no poll
    // between them).
    let mut tx = VecTx::new();
    s.receive(
        T0,
        &host_unreachable(&synack),
        ustack::RxMeta::default(),
        &mut tx,
    );
    assert_eq!(
        s.stats().tcp.connections,
        0,
        "the half-open connection is gone"
    );
    let ack = tcp_frame(&Seg {
        seq: 1001,
        ack: Some(iss + 1),
        ..Seg::default()
    });
    s.receive(T0, &ack, ustack::RxMeta::default(), &mut tx);
    s.poll(T0, &mut tx);
    assert_eq!(segments(&tx.frames)[0].control, TcpControl::Rst);
    assert_eq!(s.tcp().accept(l).unwrap(), None);

    // Active: the SYN is unreachable.
    let mut s = stack();
    let h = s
        .tcp()
        .connect(T0, std::net::SocketAddr::from((PEER, 9000)))
        .unwrap();
    let syn = tcp_bytes(&feed(&mut s, T0, &[]));
    let mut wrong = syn.clone();
    wrong[4] ^= 0x80; // a sequence number never sent: ignored
    feed(&mut s, T0, &host_unreachable(&wrong));
    assert_eq!(s.tcp_ref().status(h).unwrap().state, State::SynSent);
    feed(&mut s, T0, &host_unreachable(&syn));
    let st = s.tcp_ref().status(h).unwrap();
    assert_eq!(
        (st.state, st.error),
        (
            State::Closed,
            Some(ustack::socket::tcp::ConnError::HostUnreachable)
        )
    );

    // Established: a soft error, the connection carries on.
    let mut s = stack();
    let (h, _) = accepted(&mut s);
    s.tcp().send(h, b"data").unwrap();
    let data = tcp_bytes(&feed(&mut s, T0, &[]));
    feed(&mut s, T0, &host_unreachable(&data));
    let st = s.tcp_ref().status(h).unwrap();
    assert_eq!((st.state, st.error), (State::Established, None));
}

/// `set_ack_events` (what the layer's `MSG_ZEROCOPY` completions wait
/// on, packetdrill's `zerocopy/epoll_edge`): an ACK of a few bytes, far
/// from the send buffer's low-water mark, raises WRITABLE only when it
/// was asked for.
#[test]
fn ack_events_report_every_acknowledgment_when_asked() {
    for asked in [false, true] {
        let mut s = stack();
        let (h, iss) = accepted(&mut s);
        s.tcp().set_ack_events(h, asked).unwrap();
        s.tcp().send(h, b"0123456789").unwrap();
        feed(&mut s, T0, &[]);
        let mut events = Vec::new();
        s.drain_events(&mut events);
        events.clear();
        feed(
            &mut s,
            T0,
            &tcp_frame(&Seg {
                seq: 1001,
                ack: Some(iss + 11),
                ..Seg::default()
            }),
        );
        s.drain_events(&mut events);
        let writable = events.iter().any(|e| {
            e.socket == ustack::events::SocketRef::Tcp(h)
                && e.readiness.contains(ustack::events::Readiness::WRITABLE)
        });
        assert_eq!(writable, asked, "{events:?}");
    }
}
