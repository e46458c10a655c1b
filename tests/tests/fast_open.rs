//! TCP Fast Open on the server side (RFC 7413), on raw frames: cookies
//! made and checked as Linux makes them, data in a SYN taken and handed to
//! `accept` at once, and everything that must fall back to the ordinary
//! handshake (no cookie, a wrong one, Fast Open off, its queue full).

use std::net::{IpAddr, Ipv4Addr};

use ustack::sim::{host_config, host_mac};
use ustack::socket::tcp::{State, fastopen};
use ustack::wire::*;
use ustack::{Config, Instant, Stack, VecTx};

const US: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const T0: Instant = Instant::ZERO;
const KEY: (u64, u64) = (0xb2b2_b2b2_a1a1_a1a1, 0xd4d4_d4d4_c3c3_c3c3);
const PEER_ISN: u32 = 5000;

fn config() -> Config {
    let mut cfg = host_config(1);
    cfg.announce = false;
    cfg.tcp.fast_open_key = Some(KEY);
    cfg
}

fn stack() -> Stack {
    with_peer(Stack::new(config()))
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

/// A frame with a TCP segment from the peer's port `sport` to our 80:
/// flags, sequence and acknowledgment numbers, extra options after the
/// MSS option (4-byte aligned), payload.
fn segment(sport: u16, syn: bool, seq: u32, ack: Option<u32>, opts: &[u8], data: &[u8]) -> Vec<u8> {
    let mut o = vec![2, 4, 0x05, 0xb4];
    if !syn {
        o.clear();
    }
    o.extend_from_slice(opts);
    while o.len() % 4 != 0 {
        o.push(1);
    }
    let hl = 20 + o.len();
    let mut t = vec![0u8; hl + data.len()];
    t[20..hl].copy_from_slice(&o);
    t[hl..].copy_from_slice(data);
    let mut p = TcpPacket::new_unchecked(&mut t[..]);
    p.set_src_port(sport);
    p.set_dst_port(80);
    p.set_seq_number(TcpSeqNumber(seq as i32));
    p.set_ack_number(TcpSeqNumber(ack.unwrap_or(0) as i32));
    p.set_header_len(hl as u8);
    p.clear_flags();
    p.set_syn(syn);
    p.set_ack(ack.is_some());
    p.set_window_len(65_535);
    p.fill_checksum(&IpAddress::Ipv4(PEER), &IpAddress::Ipv4(US));
    let ip = Ipv4Repr {
        src_addr: PEER,
        dst_addr: US,
        next_header: IpProtocol::Tcp,
        payload_len: t.len(),
        hop_limit: 64,
    };
    let mut b = vec![0u8; ip.buffer_len() + t.len()];
    ip.emit(
        &mut Ipv4Packet::new_unchecked(&mut b[..]),
        &ChecksumCapabilities::default(),
    );
    b[ip.buffer_len()..].copy_from_slice(&t);
    eth(host_mac(1), EthernetProtocol::Ipv4, &b)
}

/// Receive `f` (nothing when empty) and poll; the TCP segments sent, as
/// (header bytes after the fixed 20, sequence, acknowledgment, payload).
fn feed(s: &mut Stack, f: &[u8]) -> Vec<Sent> {
    let mut tx = VecTx::new();
    if !f.is_empty() {
        s.receive(T0, f, ustack::RxMeta::default(), &mut tx);
    }
    s.poll(T0, &mut tx);
    tx.frames
        .iter()
        .filter_map(|f| {
            let ip = Ipv4Packet::new_checked(&f[ETHERNET_HEADER_LEN..]).ok()?;
            let t = TcpPacket::new_checked(ip.payload()).ok()?;
            assert!(t.verify_checksum(&IpAddress::Ipv4(US), &IpAddress::Ipv4(PEER)));
            Some(Sent {
                syn: t.syn(),
                rst: t.rst(),
                seq: t.seq_number().0 as u32,
                ack: t.ack().then(|| t.ack_number().0 as u32),
                cookie: fastopen::find(t.options()).map(|o| o.cookie.to_vec()),
                exp: fastopen::find(t.options()).is_some_and(|o| o.exp),
                payload: t.payload().to_vec(),
            })
        })
        .collect()
}

#[derive(Debug)]
struct Sent {
    syn: bool,
    rst: bool,
    seq: u32,
    ack: Option<u32>,
    cookie: Option<Vec<u8>>,
    exp: bool,
    payload: Vec<u8>,
}

/// A stack listening on port 80 with Fast Open on (a queue of 8).
fn fast_open_server() -> (Stack, ustack::socket::tcp::ListenHandle) {
    let mut s = stack();
    let l = s.tcp().listen(80, 8).unwrap();
    s.tcp().set_fast_open(l, 8).unwrap();
    (s, l)
}

fn valid_cookie() -> Vec<u8> {
    fastopen::cookie(KEY, IpAddr::V4(PEER), IpAddr::V4(US)).to_vec()
}

fn fo(cookie: &[u8]) -> Vec<u8> {
    let mut o = vec![34, 2 + cookie.len() as u8];
    o.extend_from_slice(cookie);
    o
}

fn fo_exp(cookie: &[u8]) -> Vec<u8> {
    let mut o = vec![254, 4 + cookie.len() as u8, 0xf9, 0x89];
    o.extend_from_slice(cookie);
    o
}

#[test]
fn a_cookie_request_gets_linuxs_cookie_in_the_form_asked() {
    let (mut s, l) = fast_open_server();
    for (port, opt, exp) in [(40_000, fo(&[]), false), (40_001, fo_exp(&[]), true)] {
        let out = feed(&mut s, &segment(port, true, PEER_ISN, None, &opt, &[]));
        let synack = &out[0];
        assert!(synack.syn);
        assert_eq!(synack.ack, Some(PEER_ISN + 1));
        assert_eq!(
            synack.cookie.as_deref(),
            Some(&valid_cookie()[..]),
            "{out:?}"
        );
        assert_eq!(synack.exp, exp);
    }
    assert_eq!(
        s.tcp().accept(l).unwrap(),
        None,
        "nothing before the handshake"
    );
    assert_eq!(s.stats().tcp.fast_open_cookies_sent, 2);
}

#[test]
fn syn_data_with_a_valid_cookie_is_accepted_at_once() {
    let (mut s, l) = fast_open_server();
    let out = feed(
        &mut s,
        &segment(
            40_000,
            true,
            PEER_ISN,
            None,
            &fo(&valid_cookie()),
            b"GET / now",
        ),
    );
    let synack = &out[0];
    assert!(synack.syn);
    assert_eq!(
        synack.ack,
        Some(PEER_ISN + 1 + 9),
        "the SYN-ACK takes the data"
    );
    assert_eq!(synack.cookie, None, "a valid cookie is not sent back");
    let h = s
        .tcp()
        .accept(l)
        .unwrap()
        .expect("handed out before the handshake");
    let info = s.tcp_ref().info(h).unwrap();
    assert_eq!(info.state, State::SynReceived);
    assert!(info.syn_data);
    let mut buf = [0u8; 64];
    assert_eq!(s.tcp().recv(h, &mut buf).unwrap(), 9);
    assert_eq!(&buf[..9], b"GET / now");
    // RFC 7413 3: the server's answer leaves before the client's ACK.
    assert_eq!(s.tcp().send(h, b"200 OK").unwrap(), 6);
    let out = feed(&mut s, &[]);
    let iss = synack.seq;
    assert_eq!((out[0].seq, &out[0].payload[..]), (iss + 1, &b"200 OK"[..]));
    assert_eq!(out[0].ack, Some(PEER_ISN + 10));
    // The handshake ends with the ACK of both.
    feed(
        &mut s,
        &segment(40_000, false, PEER_ISN + 10, Some(iss + 7), &[], &[]),
    );
    assert_eq!(s.tcp_ref().info(h).unwrap().state, State::Established);
    assert_eq!(s.stats().tcp.fast_open_accepted, 1);
}

#[test]
fn a_wrong_cookie_gets_the_right_one_and_the_data_waits() {
    let (mut s, l) = fast_open_server();
    let mut wrong = valid_cookie();
    wrong[0] ^= 1;
    let out = feed(
        &mut s,
        &segment(40_000, true, PEER_ISN, None, &fo_exp(&wrong), b"data"),
    );
    assert_eq!(
        out[0].ack,
        Some(PEER_ISN + 1),
        "only the SYN is acknowledged"
    );
    assert_eq!(out[0].cookie.as_deref(), Some(&valid_cookie()[..]));
    assert!(out[0].exp);
    assert_eq!(s.tcp().accept(l).unwrap(), None);
    assert_eq!(s.stats().tcp.fast_open_accepted, 0);
}

#[test]
fn fast_open_off_or_full_falls_back_to_the_handshake() {
    // Off: a valid cookie changes nothing, and no cookie goes back.
    let mut s = stack();
    let l = s.tcp().listen(80, 8).unwrap();
    let out = feed(
        &mut s,
        &segment(40_000, true, PEER_ISN, None, &fo(&valid_cookie()), b"data"),
    );
    assert_eq!(
        (out[0].ack, out[0].cookie.as_ref()),
        (Some(PEER_ISN + 1), None)
    );
    assert_eq!(s.tcp().accept(l).unwrap(), None);

    // A queue of one: the second Fast Open SYN waits for the first's handshake.
    let mut s = stack();
    let l = s.tcp().listen(80, 8).unwrap();
    s.tcp().set_fast_open(l, 1).unwrap();
    let opt = fo(&valid_cookie());
    let first = feed(&mut s, &segment(40_000, true, PEER_ISN, None, &opt, b"one"));
    assert_eq!(first[0].ack, Some(PEER_ISN + 4));
    let out = feed(&mut s, &segment(40_001, true, PEER_ISN, None, &opt, b"two"));
    assert_eq!(
        out[0].ack,
        Some(PEER_ISN + 1),
        "queue full: the ordinary way"
    );
    // The first completes; the queue has room again.
    feed(
        &mut s,
        &segment(
            40_000,
            false,
            PEER_ISN + 4,
            Some(first[0].seq + 1),
            &[],
            &[],
        ),
    );
    let out = feed(
        &mut s,
        &segment(40_002, true, PEER_ISN, None, &opt, b"three"),
    );
    assert_eq!(out[0].ack, Some(PEER_ISN + 6));
    assert_eq!(s.stats().tcp.fast_open_accepted, 2);
}

#[test]
fn without_a_cookie_data_is_taken_only_when_configured() {
    let mut cfg = config();
    cfg.tcp.fast_open_no_cookie = true;
    let mut s = with_peer(Stack::new(cfg));
    let l = s.tcp().listen(80, 8).unwrap();
    s.tcp().set_fast_open(l, 8).unwrap();
    let out = feed(
        &mut s,
        &segment(40_000, true, PEER_ISN, None, &[], b"plain"),
    );
    assert_eq!(out[0].ack, Some(PEER_ISN + 6));
    assert!(s.tcp().accept(l).unwrap().is_some());
    // A SYN with neither cookie nor data is an ordinary one.
    let out = feed(&mut s, &segment(40_001, true, PEER_ISN, None, &[], &[]));
    assert_eq!(out[0].ack, Some(PEER_ISN + 1));
    assert_eq!(s.tcp().accept(l).unwrap(), None);
}

/// A reset of a Fast Open connection not yet accepted: `accept` still
/// hands it out, its data readable, then the reset (as Linux).
#[test]
fn a_reset_before_accept_leaves_the_data_and_says_reset() {
    let (mut s, l) = fast_open_server();
    let out = feed(
        &mut s,
        &segment(
            40_000,
            true,
            PEER_ISN,
            None,
            &fo(&valid_cookie()),
            b"0123456789",
        ),
    );
    assert!(!out[0].rst);
    let mut rst = segment(40_000, false, PEER_ISN + 11, Some(out[0].seq + 1), &[], &[]);
    // Set RST on the segment (the TCP flags byte, then the checksum again).
    let off = ETHERNET_HEADER_LEN + IPV4_HEADER_LEN;
    {
        let mut p = TcpPacket::new_unchecked(&mut rst[off..]);
        p.set_rst(true);
        p.fill_checksum(&IpAddress::Ipv4(PEER), &IpAddress::Ipv4(US));
    }
    feed(&mut s, &rst);
    let h = s.tcp().accept(l).unwrap().expect("still handed out");
    let mut buf = [0u8; 64];
    assert_eq!(s.tcp().recv(h, &mut buf).unwrap(), 10);
    let st = s.tcp_ref().status(h).unwrap();
    assert_eq!(
        st.error,
        Some(ustack::socket::tcp::ConnError::Reset),
        "{st:?}"
    );
}

/// `s`, having learnt the peer's MAC from its ARP request (so replies
/// leave at once).
fn with_peer(mut s: Stack) -> Stack {
    let arp = ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Request,
        source_hardware_addr: host_mac(2),
        source_protocol_addr: PEER,
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: US,
    };
    let mut b = vec![0u8; arp.buffer_len()];
    arp.emit(&mut ArpPacket::new_unchecked(&mut b[..]));
    s.receive(
        T0,
        &eth(EthernetAddress::BROADCAST, EthernetProtocol::Arp, &b),
        ustack::RxMeta::default(),
        &mut VecTx::new(),
    );
    s
}

/// Fast Open's client side (RFC 7413 3 and 4.1.2) between two stacks on
/// the sim link: the first connection's SYN asks for a cookie and the
/// handshake is the usual one; the server's cookie is kept, so the next
/// connection sends nothing until the app writes, then its SYN carries
/// the data, which the server takes from the SYN and hands to its app
/// before the handshake ends.
#[test]
fn a_client_keeps_the_cookie_and_sends_its_data_in_the_next_syn() {
    use std::net::SocketAddrV4;
    use std::time::Duration;
    use ustack::sim::{LinkConfig, SimNet};

    let mut net = SimNet::new(LinkConfig {
        delay: Duration::from_millis(5),
        ..LinkConfig::default()
    });
    for n in [1, 2] {
        let mut cfg = host_config(n);
        cfg.tcp.fast_open_key = Some(KEY);
        net.add(cfg);
    }
    let l = net.nodes[1].stack.tcp().listen(80, 8).unwrap();
    net.nodes[1].stack.tcp().set_fast_open(l, 8).unwrap();
    let server = SocketAddrV4::new(net.nodes[1].stack.ip(), 80);
    let established = |net: &mut SimNet, h| {
        net.nodes[0]
            .stack
            .tcp_ref()
            .status(h)
            .is_ok_and(|s| s.state == State::Established)
    };

    // No cookie yet: the SYN asks for one.
    let now = net.now;
    let h = net.nodes[0].stack.tcp().connect(now, server).unwrap();
    assert!(!net.nodes[0].stack.tcp().fast_open_connect(h).unwrap());
    let deadline = net.now + Duration::from_secs(5);
    let mut first = None;
    assert!(net.run_until(deadline, &mut [], |n| {
        first = first.or_else(|| n.nodes[1].stack.tcp().accept(l).ok().flatten());
        established(n, h) && first.is_some()
    }));
    assert_eq!(net.nodes[1].stack.stats().tcp.fast_open_cookies_sent, 1);
    assert_eq!(net.nodes[1].stack.stats().tcp.fast_open_accepted, 0);

    // The cookie was kept: the SYN waits for the write.
    let now = net.now;
    let h2 = net.nodes[0].stack.tcp().connect(now, server).unwrap();
    assert!(net.nodes[0].stack.tcp().fast_open_connect(h2).unwrap());
    let sent = net.nodes[0].stack.stats().tcp.segs_out;
    let later = net.now + Duration::from_secs(2);
    net.run_until(later, &mut [], |_| false);
    assert_eq!(
        net.nodes[0].stack.stats().tcp.segs_out,
        sent,
        "no SYN before the write"
    );
    assert_eq!(
        net.nodes[0]
            .stack
            .tcp()
            .send(h2, b"GET / HTTP/1.0\r\n\r\n")
            .unwrap(),
        18
    );
    // Half a round trip later the server's app has the data (from the SYN).
    let deadline = net.now + Duration::from_millis(6);
    let mut got = Vec::new();
    assert!(net.run_until(deadline, &mut [], |n| {
        let tcp = &mut n.nodes[1].stack;
        if let Ok(Some(c)) = tcp.tcp().accept(l) {
            let mut buf = [0u8; 64];
            let k = tcp.tcp().recv(c, &mut buf).unwrap();
            got.extend_from_slice(&buf[..k]);
        }
        !got.is_empty()
    }));
    assert_eq!(got, b"GET / HTTP/1.0\r\n\r\n");
    assert_eq!(net.nodes[1].stack.stats().tcp.fast_open_accepted, 1);
    let deadline = net.now + Duration::from_secs(1);
    assert!(net.run_until(deadline, &mut [], |n| established(n, h2)));
    assert_eq!(
        net.nodes[0].stack.tcp_ref().info(h2).unwrap().in_flight,
        0,
        "the SYN-ACK acknowledged the data"
    );
}
