//! What a library user gets without asking: a random secret per stack
//! (unpredictable ISNs, unforgeable SYN cookies), a listener that stops
//! answering once closed, and handles that never alias a newer socket.

use std::net::{Ipv4Addr, SocketAddrV4};

use ustack::Error;
use ustack::sim::{host_config, host_mac};
use ustack::wire::*;
use ustack::{Config, Instant, Stack, VecTx};

const US: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

fn frame(protocol: IpProtocol, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; ETHERNET_HEADER_LEN + IPV4_HEADER_LEN + payload.len()];
    EthernetRepr {
        src_addr: host_mac(2),
        dst_addr: host_mac(1),
        ethertype: EthernetProtocol::Ipv4,
    }
    .emit(&mut EthernetFrame::new_unchecked(&mut f[..]));
    Ipv4Repr {
        src_addr: PEER,
        dst_addr: US,
        next_header: protocol,
        payload_len: payload.len(),
        hop_limit: 64,
    }
    .emit(
        &mut Ipv4Packet::new_unchecked(&mut f[ETHERNET_HEADER_LEN..]),
        &ChecksumCapabilities::default(),
    );
    f[ETHERNET_HEADER_LEN + IPV4_HEADER_LEN..].copy_from_slice(payload);
    f
}

fn syn(src_port: u16, dst_port: u16) -> Vec<u8> {
    let repr = TcpRepr {
        src_port,
        dst_port,
        control: TcpControl::Syn,
        seq_number: TcpSeqNumber(1000),
        ack_number: None,
        window_len: 65_535,
        window_scale: None,
        max_seg_size: Some(1460),
        sack_permitted: false,
        sack_ranges: [None; 3],
        timestamp: None,
        payload: &[],
    };
    let mut b = vec![0u8; repr.buffer_len()];
    repr.emit(
        &mut TcpPacket::new_unchecked(&mut b[..]),
        &IpAddress::Ipv4(PEER),
        &IpAddress::Ipv4(US),
        &ChecksumCapabilities::default(),
    );
    frame(IpProtocol::Tcp, &b)
}

/// The peer's MAC learned, so answers leave at once.
fn with_peer(mut s: Stack) -> Stack {
    let repr = ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Request,
        source_hardware_addr: host_mac(2),
        source_protocol_addr: PEER,
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: US,
    };
    let mut b = vec![0u8; ETHERNET_HEADER_LEN + repr.buffer_len()];
    EthernetRepr {
        src_addr: host_mac(2),
        dst_addr: EthernetAddress::BROADCAST,
        ethertype: EthernetProtocol::Arp,
    }
    .emit(&mut EthernetFrame::new_unchecked(&mut b[..]));
    repr.emit(&mut ArpPacket::new_unchecked(&mut b[ETHERNET_HEADER_LEN..]));
    s.receive(
        Instant::ZERO,
        &b,
        ustack::RxMeta::default(),
        &mut VecTx::new(),
    );
    s
}

/// Feed `f`, poll, and return the TCP segments sent.
fn tcp_answers(s: &mut Stack, f: &[u8]) -> Vec<(TcpControl, u32, Option<u32>)> {
    let mut tx = VecTx::new();
    s.receive(
        Instant::from_millis(1),
        f,
        ustack::RxMeta::default(),
        &mut tx,
    );
    s.poll(Instant::from_millis(1), &mut tx);
    tx.frames
        .iter()
        .filter_map(|f| {
            let ip = Ipv4Packet::new_checked(&f[ETHERNET_HEADER_LEN..]).ok()?;
            (ip.next_header() == IpProtocol::Tcp).then_some(())?;
            let p = TcpPacket::new_checked(ip.payload()).ok()?;
            let r = TcpRepr::parse(
                &p,
                &IpAddress::Ipv4(US),
                &IpAddress::Ipv4(PEER),
                &ChecksumCapabilities::default(),
            )
            .ok()?;
            Some((
                r.control,
                r.seq_number.0 as u32,
                r.ack_number.map(|a| a.0 as u32),
            ))
        })
        .collect()
}

fn isn_of_a_new_stack(cfg: Config) -> u32 {
    let mut s = with_peer(Stack::new(cfg));
    s.tcp().listen(80, 8).unwrap();
    let out = tcp_answers(&mut s, &syn(40_000, 80));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, TcpControl::Syn);
    out[0].1
}

#[test]
fn every_stack_has_its_own_secret_by_default() {
    let cfg = || {
        let mut c = Config::new(host_mac(1), Ipv4Cidr::new(US, 24));
        c.announce = false;
        c
    };
    assert_ne!(cfg().secret, cfg().secret);
    // The same 4-tuple at the same instant: different ISNs.
    let isns: Vec<u32> = (0..4).map(|_| isn_of_a_new_stack(cfg())).collect();
    for (i, a) in isns.iter().enumerate() {
        for b in &isns[i + 1..] {
            assert_ne!(a, b, "{isns:?}");
        }
    }
    // A seed gives the same ones twice (simulations replay).
    let seeded = || {
        let mut c = Config::with_seed(host_mac(1), Ipv4Cidr::new(US, 24), 42);
        c.announce = false;
        c
    };
    assert_eq!(isn_of_a_new_stack(seeded()), isn_of_a_new_stack(seeded()));
}

#[test]
fn a_closed_listener_refuses_new_syns_with_rst() {
    let mut cfg = host_config(1);
    cfg.announce = false;
    let mut s = with_peer(Stack::new(cfg));
    let l = s.tcp().listen(80, 8).unwrap();
    // A half-open connection, then the listener goes away.
    assert_eq!(tcp_answers(&mut s, &syn(40_000, 80))[0].0, TcpControl::Syn);
    s.tcp().unlisten(l);
    // The half-open one is reset, and a new SYN is refused.
    let mut tx = VecTx::new();
    s.poll(Instant::from_millis(2), &mut tx);
    assert_eq!(s.stats().tcp.connections, 0, "the half-open one is gone");
    let out = tcp_answers(&mut s, &syn(40_001, 80));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, TcpControl::Rst);
    assert_eq!(out[0].2, Some(1001), "RST acknowledges the SYN");
    assert_eq!(s.tcp().accept(l), Err(Error::InvalidHandle));
}

#[test]
fn stale_handles_are_refused_never_aliased() {
    let mut s = Stack::new(host_config(1));
    let peer = SocketAddrV4::new(PEER, 9);
    // UDP: a handle kept after close does not reach the socket bound next.
    let old = s.udp().bind(7000).unwrap();
    s.udp().close(old).unwrap();
    let new = s.udp().bind(7000).unwrap();
    assert_ne!(old, new);
    assert_eq!(s.udp().send_to(old, peer, b"x"), Err(Error::InvalidHandle));
    assert_eq!(s.udp_ref().local_port(old), Err(Error::InvalidHandle));
    assert_eq!(s.udp().close(old), Err(Error::InvalidHandle));
    assert_eq!(s.udp_ref().local_port(new), Ok(7000));
    // Ping.
    let old = s.ping().open(1).unwrap();
    s.ping().close(old).unwrap();
    let new = s.ping().open(1).unwrap();
    assert_eq!(s.ping().send(old, PEER, 1, 8), Err(Error::InvalidHandle));
    assert_eq!(s.ping().recv(old), Err(Error::InvalidHandle));
    assert!(s.ping().send(new, PEER, 1, 8).is_ok());
    // UD queue pairs.
    use ustack::socket::ud::{QpConfig, UdError, UdTransport};
    let old = s.ud().create_qp(&QpConfig::new(7)).unwrap();
    s.ud().destroy_qp(old).unwrap();
    let new = s.ud().create_qp(&QpConfig::new(7)).unwrap();
    assert_eq!(
        s.ud().post_recv(old, 1, vec![0; 64]),
        Err(Error::Ud(UdError::InvalidQp))
    );
    assert_eq!(s.ud().qp_num(old), Err(Error::Ud(UdError::InvalidQp)));
    assert!(s.ud().post_recv(new, 1, vec![0; 64]).is_ok());
    // TCP connections carry a generation too.
    let old = s
        .tcp()
        .connect(Instant::ZERO, SocketAddrV4::new(PEER, 80))
        .unwrap();
    s.tcp().abort(old).unwrap();
    let mut tx = VecTx::new();
    s.poll(Instant::from_millis(1), &mut tx);
    let _new = s
        .tcp()
        .connect(Instant::from_millis(1), SocketAddrV4::new(PEER, 80))
        .unwrap();
    assert_eq!(s.tcp().send(old, b"x"), Err(Error::InvalidHandle));
}
