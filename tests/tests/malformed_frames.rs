//! Property tests: random and mutated frames never panic the engine, every
//! received frame is counted exactly once (accepted or dropped by reason), and
//! whatever the engine sends in response is itself well-formed.

use std::net::Ipv4Addr;

use proptest::prelude::*;
use ustack::sim::{host_config, host_mac};
use ustack::stats::DropReason;
use ustack::wire::*;
use ustack::{Instant, Stack, VecTx};

const US: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

fn stack() -> Stack {
    let mut cfg = host_config(1);
    cfg.announce = false;
    let mut s = Stack::new(cfg);
    s.udp().bind(7).unwrap();
    s.tcp().listen(5001, 16).unwrap();
    s
}

fn tcp_syn(dst_port: u16) -> Vec<u8> {
    let repr = TcpRepr {
        src_port: 40_000,
        dst_port,
        control: TcpControl::Syn,
        seq_number: TcpSeqNumber(1000),
        ack_number: None,
        window_len: 65_535,
        window_scale: Some(7),
        max_seg_size: Some(1460),
        sack_permitted: true,
        sack_ranges: [None; 3],
        timestamp: Some(TcpTimestampRepr::new(1, 0)),
        payload: &[],
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

fn eth(ethertype: EthernetProtocol, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; ETHERNET_HEADER_LEN + payload.len()];
    EthernetRepr {
        src_addr: host_mac(2),
        dst_addr: host_mac(1),
        ethertype,
    }
    .emit(&mut EthernetFrame::new_unchecked(&mut f[..]));
    f[ETHERNET_HEADER_LEN..].copy_from_slice(payload);
    f
}

fn ip(protocol: IpProtocol, payload: &[u8], frag: Option<(u16, bool)>) -> Vec<u8> {
    let mut p = vec![0u8; IPV4_HEADER_LEN + payload.len()];
    let repr = Ipv4Repr {
        src_addr: PEER,
        dst_addr: US,
        next_header: protocol,
        payload_len: payload.len(),
        hop_limit: 64,
    };
    let mut pkt = Ipv4Packet::new_unchecked(&mut p[..]);
    repr.emit(&mut pkt, &ChecksumCapabilities::default());
    if let Some((offset, more)) = frag {
        pkt.set_dont_frag(false);
        pkt.set_more_frags(more);
        pkt.set_frag_offset(offset);
        pkt.set_ident(77);
        pkt.fill_checksum();
    }
    p[IPV4_HEADER_LEN..].copy_from_slice(payload);
    eth(EthernetProtocol::Ipv4, &p)
}

/// Valid frames of every kind the engine handles: the seeds to mutate.
fn seeds() -> Vec<Vec<u8>> {
    let arp = ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Request,
        source_hardware_addr: host_mac(2),
        source_protocol_addr: PEER,
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: US,
    };
    let mut a = vec![0u8; arp.buffer_len()];
    arp.emit(&mut ArpPacket::new_unchecked(&mut a[..]));
    let echo = Icmpv4Repr::EchoRequest {
        ident: 1,
        seq_no: 2,
        data: &[0x55; 56],
    };
    let mut e = vec![0u8; echo.buffer_len()];
    echo.emit(
        &mut Icmpv4Packet::new_unchecked(&mut e[..]),
        &ChecksumCapabilities::default(),
    );
    let udp = |port: u16| {
        let mut u = vec![0u8; 8 + 32];
        UdpRepr {
            src_port: 1234,
            dst_port: port,
        }
        .emit(
            &mut UdpPacket::new_unchecked(&mut u[..]),
            &IpAddress::Ipv4(PEER),
            &IpAddress::Ipv4(US),
            32,
            |p| p.fill(0xab),
            &ChecksumCapabilities::default(),
        );
        u
    };
    vec![
        eth(EthernetProtocol::Arp, &a),
        ip(IpProtocol::Icmp, &e, None),
        ip(IpProtocol::Udp, &udp(7), None),
        ip(IpProtocol::Udp, &udp(9), None),
        ip(IpProtocol::Udp, &udp(7)[..16], Some((0, true))),
        ip(IpProtocol::Udp, &udp(7)[16..], Some((16, false))),
        ip(IpProtocol::Tcp, &tcp_syn(5001), None),
        ip(IpProtocol::Tcp, &tcp_syn(80), None),
        ip(IpProtocol::Unknown(99), &[1, 2, 3], None),
    ]
}

/// Every frame the engine emits must parse, with valid checksums.
fn assert_well_formed(frame: &[u8]) {
    let f = EthernetFrame::new_checked(frame).expect("emitted frame parses");
    assert_eq!(f.src_addr(), host_mac(1));
    match f.ethertype() {
        EthernetProtocol::Arp => {
            let p = ArpPacket::new_checked(f.payload()).expect("arp parses");
            ArpRepr::parse(&p).expect("arp repr");
        }
        EthernetProtocol::Ipv4 => {
            let p = Ipv4Packet::new_checked(f.payload()).expect("ipv4 parses");
            assert!(p.verify_checksum());
            assert_eq!(p.src_addr(), US);
            if p.next_header() == IpProtocol::Icmp && p.frag_offset() == 0 && !p.more_frags() {
                let i = Icmpv4Packet::new_checked(p.payload()).expect("icmp parses");
                assert!(i.verify_checksum());
            }
            if p.next_header() == IpProtocol::Tcp {
                let t = TcpPacket::new_checked(p.payload()).expect("tcp parses");
                assert!(t.verify_checksum(&IpAddress::Ipv4(US), &IpAddress::Ipv4(p.dst_addr())));
            }
        }
        other => panic!("emitted unexpected ethertype {other}"),
    }
}

fn check(s: &mut Stack, frames: &[Vec<u8>]) {
    let mut tx = VecTx::new();
    for (i, f) in frames.iter().enumerate() {
        s.receive(
            Instant::from_millis(i as u64),
            f,
            ustack::RxMeta::default(),
            &mut tx,
        );
    }
    s.poll(Instant::from_secs(100), &mut tx);
    let st = s.stats();
    assert_eq!(st.eth.rx_frames, frames.len() as u64);
    assert_eq!(st.eth.rx_frames, st.eth.rx_accepted + st.drops.total());
    for f in &tx.frames {
        assert_well_formed(f);
    }
    // Reassembly memory is released by the timeout poll above.
    assert_eq!(st.ipv4.reassembly_bytes, 0);
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip { at: usize, bit: u8 },
    Set { at: usize, value: u8 },
    Truncate(usize),
    Extend(Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, value)| Mutation::Set { at, value }),
        any::<usize>().prop_map(Mutation::Truncate),
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(Mutation::Extend),
    ]
}

fn apply(frame: &mut Vec<u8>, m: &Mutation) {
    match m {
        Mutation::Flip { at, bit } if !frame.is_empty() => {
            let i = at % frame.len();
            frame[i] ^= 1 << bit;
        }
        Mutation::Set { at, value } if !frame.is_empty() => {
            let i = at % frame.len();
            frame[i] = *value;
        }
        Mutation::Truncate(n) => frame.truncate(n % (frame.len() + 1)),
        Mutation::Extend(tail) => frame.extend_from_slice(tail),
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_frames_never_panic(frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..1600), 1..16)) {
        check(&mut stack(), &frames);
    }

    #[test]
    fn mutated_frames_never_panic(picks in proptest::collection::vec((0usize..9, proptest::collection::vec(mutation(), 1..4)), 1..24)) {
        let seeds = seeds();
        let frames: Vec<Vec<u8>> = picks
            .iter()
            .map(|(i, ms)| {
                let mut f = seeds[i % seeds.len()].clone();
                for m in ms {
                    apply(&mut f, m);
                }
                f
            })
            .collect();
        check(&mut stack(), &frames);
    }

    #[test]
    fn random_ipv4_payloads_behind_a_valid_header(proto in any::<u8>(), body in proptest::collection::vec(any::<u8>(), 0..1400)) {
        check(&mut stack(), &[ip(IpProtocol::from(proto), &body, None)]);
    }
}

#[test]
fn seeds_are_accepted_as_expected() {
    let mut s = stack();
    let mut tx = VecTx::new();
    for f in seeds() {
        s.receive(Instant::ZERO, &f, ustack::RxMeta::default(), &mut tx);
    }
    let st = s.stats();
    // UDP to port 9 (no socket), TCP to a closed port and protocol 99 are drops.
    assert_eq!(st.drops.get(DropReason::UdpNoSocket), 1);
    assert_eq!(st.drops.get(DropReason::TcpNoSocket), 1);
    assert_eq!(st.drops.get(DropReason::Ipv4UnknownProtocol), 1);
    assert_eq!(st.eth.rx_accepted, 6);
    assert_eq!(st.tcp.passive_opens, 1);
    assert_eq!(st.tcp.resets_sent, 1);
    assert_eq!(st.ipv4.reassembled, 1);
    assert_eq!(st.udp.rx_datagrams, 2);
    for f in &tx.frames {
        assert_well_formed(f);
    }
}
