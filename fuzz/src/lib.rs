//! Pieces the fuzz targets share: a byte reader over the fuzz input, frame
//! builders, a checksum fixer (so mutated frames get past the checksums and
//! reach the code behind them), the "counted once" check, and stacks with
//! live TCP connections for the receive-path target.

use std::net::{Ipv4Addr, SocketAddrV4};

use smoltcp::wire::{
    ArpPacket, ArpRepr, ETHERNET_HEADER_LEN, EthernetAddress, EthernetFrame, EthernetProtocol,
    IPV4_HEADER_LEN, Icmpv4Packet, IpAddress, IpProtocol, Ipv4Packet, TcpPacket, TcpSeqNumber,
    UdpPacket,
};
use ustack::sim::{host_config, host_mac};
use ustack::socket::tcp::TcpConfig;
use ustack::socket::ud::{DEFAULT_QKEY, QpConfig, RESPONDER_QPN, UdTransport};
use ustack::wire::roce::{ROCE_PORT, icrc_fill};
use ustack::{Instant, Stack, VecTx};

/// The stack under test: 10.0.0.1, MAC 02:00:00:00:00:01.
pub const US: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// The peer the frames claim to come from: 10.0.0.2.
pub const PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
pub const UDP_PORT: u16 = 7;
pub const TCP_PORT: u16 = 5001;
pub const PING_IDENT: u16 = 1;

pub fn us_mac() -> EthernetAddress {
    host_mac(1)
}

pub fn peer_mac() -> EthernetAddress {
    host_mac(2)
}

/// Reads the fuzz input front to back; past the end it yields zeros.
#[derive(Debug)]
pub struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data }
    }
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    pub fn u8(&mut self) -> u8 {
        let Some((&b, rest)) = self.data.split_first() else {
            return 0;
        };
        self.data = rest;
        b
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }
    /// Up to `n` bytes (fewer at the end of the input).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }
    /// A length-prefixed chunk (one byte of length, `max` at most).
    pub fn chunk(&mut self, max: usize) -> &'a [u8] {
        let n = usize::from(self.u8()) % (max + 1);
        self.bytes(n)
    }
    pub fn rest(&mut self) -> &'a [u8] {
        self.bytes(self.data.len())
    }
}

/// Small buffers so windows fill and close within a short input.
pub fn small_tcp() -> TcpConfig {
    TcpConfig {
        send_buffer: 8 << 10,
        recv_buffer: 8 << 10,
        // Our SYNs ask for ECN and requests are granted: fuzzed segments
        // reach ECN's receiver and sender paths (RFC 3168).
        ecn: ustack::socket::tcp::Ecn::On,
        ..TcpConfig::default()
    }
}

/// Host `n`'s IPv6 address (fd00::n).
pub fn v6(n: u8) -> std::net::Ipv6Addr {
    std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(n))
}

/// Host `n` of the sim subnet (with IPv6 at fd00::n), quiet (no gratuitous ARP), small TCP buffers.
pub fn host(n: u8) -> Stack {
    let mut cfg = host_config(n);
    cfg.announce = false;
    cfg.tcp = small_tcp();
    cfg.ipv6 = vec![smoltcp::wire::Ipv6Cidr::new(v6(n), 64)];
    Stack::new(cfg)
}

/// The stack every layer target feeds: a UDP socket on 7, a TCP listener on
/// 5001, a ping socket, the UD responder QP with receive buffers posted, and
/// the peer's MAC learned (so replies leave at once).
pub fn stack() -> Stack {
    stack_and_qp().0
}

/// [`stack`] and its responder QP's handle.
pub fn stack_and_qp() -> (Stack, Option<ustack::socket::ud::QpHandle>) {
    let mut s = host(1);
    let _ = s.udp().bind(UDP_PORT);
    let _ = s.tcp().listen(TCP_PORT, 4);
    if let Ok(h) = s.ping().open(PING_IDENT) {
        let _ = s.ping().send(h, PEER, 1, 16);
    }
    let mut qp = QpConfig::new(DEFAULT_QKEY);
    qp.qpn = Some(RESPONDER_QPN);
    qp.max_recv_wr = 4;
    qp.max_send_wr = 4;
    let h = s.ud().create_qp(&qp).ok();
    if let Some(h) = h {
        for i in 0..4 {
            let _ = s.ud().post_recv(h, i, vec![0; 64 + 40 * (i as usize)]);
        }
    }
    // An ARP request for us from the peer: learned, answered.
    let mut tx = VecTx::new();
    s.receive(
        Instant::ZERO,
        &arp_request(),
        ustack::RxMeta::default(),
        &mut tx,
    );
    (s, h)
}

pub fn arp_request() -> Vec<u8> {
    let arp = ArpRepr::EthernetIpv4 {
        operation: smoltcp::wire::ArpOperation::Request,
        source_hardware_addr: peer_mac(),
        source_protocol_addr: PEER,
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: US,
    };
    let mut a = vec![0u8; arp.buffer_len()];
    arp.emit(&mut ArpPacket::new_unchecked(&mut a[..]));
    eth(us_mac(), EthernetProtocol::Arp, &a)
}

/// An Ethernet frame from the peer.
pub fn eth(dst: EthernetAddress, ethertype: EthernetProtocol, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; ETHERNET_HEADER_LEN + payload.len()];
    let mut e = EthernetFrame::new_unchecked(&mut f[..]);
    e.set_dst_addr(dst);
    e.set_src_addr(peer_mac());
    e.set_ethertype(ethertype);
    f[ETHERNET_HEADER_LEN..].copy_from_slice(payload);
    f
}

/// IPv4 header fields a target may choose.
#[derive(Debug, Clone, Copy)]
pub struct IpFields<'a> {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub protocol: IpProtocol,
    pub ident: u16,
    pub dont_frag: bool,
    pub more_frags: bool,
    /// In bytes (a multiple of 8 on the wire).
    pub frag_offset: u16,
    pub ttl: u8,
    /// The TOS byte: DSCP and the ECN codepoint (RFC 3168: 3 is CE).
    pub tos: u8,
    /// Raw option bytes (padded to a multiple of 4, at most 40).
    pub options: &'a [u8],
}

impl Default for IpFields<'_> {
    fn default() -> Self {
        IpFields {
            src: PEER,
            dst: US,
            protocol: IpProtocol::Udp,
            ident: 1,
            dont_frag: true,
            more_frags: false,
            frag_offset: 0,
            ttl: 64,
            tos: 0,
            options: &[],
        }
    }
}

/// An IPv4 packet with a valid header checksum.
pub fn ipv4(f: &IpFields<'_>, payload: &[u8]) -> Vec<u8> {
    let opts = &f.options[..f.options.len().min(40)];
    let hl = IPV4_HEADER_LEN + opts.len().div_ceil(4) * 4;
    let total = (hl + payload.len()).min(usize::from(u16::MAX));
    let mut p = vec![0u8; total];
    let mut ip = Ipv4Packet::new_unchecked(&mut p[..]);
    ip.set_version(4);
    ip.set_header_len(hl as u8);
    ip.set_total_len(total as u16);
    ip.set_ident(f.ident);
    ip.clear_flags();
    ip.set_dont_frag(f.dont_frag);
    ip.set_more_frags(f.more_frags);
    ip.set_frag_offset(f.frag_offset & !7);
    ip.set_hop_limit(f.ttl);
    ip.set_dscp(f.tos >> 2);
    ip.set_ecn(f.tos & 3);
    ip.set_next_header(f.protocol);
    ip.set_src_addr(f.src);
    ip.set_dst_addr(f.dst);
    p[IPV4_HEADER_LEN..IPV4_HEADER_LEN + opts.len()].copy_from_slice(opts);
    p[hl..].copy_from_slice(&payload[..total - hl]);
    Ipv4Packet::new_unchecked(&mut p[..]).fill_checksum();
    p
}

/// A whole frame from the peer to us: Ethernet, IPv4 with `protocol`, and
/// `body` (whose checksum [`fix_checksums`] may then repair).
pub fn ip_frame(protocol: IpProtocol, body: &[u8]) -> Vec<u8> {
    ip_frame_tos(protocol, 0, body)
}

/// [`ip_frame`] with `tos` in the IPv4 header's TOS byte.
pub fn ip_frame_tos(protocol: IpProtocol, tos: u8, body: &[u8]) -> Vec<u8> {
    let f = IpFields {
        protocol,
        tos,
        ..IpFields::default()
    };
    eth(us_mac(), EthernetProtocol::Ipv4, &ipv4(&f, body))
}

/// Repair every checksum a frame carries where its lengths allow: the IPv4
/// header, then (unfragmented packets) the ICMP, UDP or TCP checksum and the
/// RoCEv2 ICRC. Lengths are left as they are, so malformed packets stay
/// malformed; only the checksum guards fall.
pub fn fix_checksums(frame: &mut [u8]) {
    let Ok(eth) = EthernetFrame::new_checked(&mut *frame) else {
        return;
    };
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return;
    }
    let ipb = &mut frame[ETHERNET_HEADER_LEN..];
    let Ok(mut ip) = Ipv4Packet::new_checked(&mut *ipb) else {
        return;
    };
    ip.fill_checksum();
    let (src, dst) = (
        IpAddress::Ipv4(ip.src_addr()),
        IpAddress::Ipv4(ip.dst_addr()),
    );
    let fragment = ip.more_frags() || ip.frag_offset() != 0;
    let proto = ip.next_header();
    let hl = usize::from(ip.header_len());
    let tl = usize::from(ip.total_len());
    if fragment || hl > tl {
        return;
    }
    let ip_all = &mut ipb[..tl];
    let body = &mut ip_all[hl..];
    match proto {
        IpProtocol::Icmp => {
            if let Ok(mut p) = Icmpv4Packet::new_checked(&mut *body) {
                p.fill_checksum();
            }
        }
        IpProtocol::Tcp => {
            if let Ok(mut p) = TcpPacket::new_checked(&mut *body) {
                p.fill_checksum(&src, &dst);
            }
        }
        IpProtocol::Udp => {
            let roce = match UdpPacket::new_checked(&mut *body) {
                Ok(mut p) => {
                    let roce = p.dst_port() == ROCE_PORT;
                    // RoCEv2 senders leave the UDP checksum zero.
                    if roce {
                        p.set_checksum(0);
                    } else {
                        p.fill_checksum(&src, &dst);
                    }
                    roce
                }
                Err(_) => false,
            };
            if roce {
                icrc_fill(ip_all);
            }
        }
        _ => {}
    }
}

/// Feed one frame and check it was counted exactly once (accepted or
/// dropped by one reason), and that the totals still add up.
pub fn receive_counted(s: &mut Stack, now: Instant, frame: &[u8], tx: &mut VecTx) {
    let before = s.stats();
    let done_before = before.eth.rx_accepted + before.drops.total();
    s.receive(now, frame, ustack::RxMeta::default(), tx);
    let after = s.stats();
    assert_eq!(after.eth.rx_frames, before.eth.rx_frames + 1);
    assert_eq!(
        after.eth.rx_accepted + after.drops.total(),
        done_before + 1,
        "a frame must end accepted or dropped, once"
    );
    assert_eq!(
        after.eth.rx_frames,
        after.eth.rx_accepted + after.drops.total()
    );
}

/// Everything the stack emits must parse, with valid checksums, from us.
pub fn assert_well_formed(frame: &[u8]) {
    let f = EthernetFrame::new_checked(frame).expect("emitted frame parses");
    assert_eq!(f.src_addr(), us_mac());
    match f.ethertype() {
        EthernetProtocol::Arp => {
            let p = ArpPacket::new_checked(f.payload()).expect("arp parses");
            ArpRepr::parse(&p).expect("arp repr");
        }
        EthernetProtocol::Ipv4 => {
            let p = Ipv4Packet::new_checked(f.payload()).expect("ipv4 parses");
            assert!(p.verify_checksum(), "emitted IPv4 checksum");
            assert_eq!(p.src_addr(), US);
            let whole = p.frag_offset() == 0 && !p.more_frags();
            let (src, dst) = (IpAddress::Ipv4(US), IpAddress::Ipv4(p.dst_addr()));
            match p.next_header() {
                IpProtocol::Icmp if whole => {
                    let i = Icmpv4Packet::new_checked(p.payload()).expect("icmp parses");
                    assert!(i.verify_checksum(), "emitted ICMP checksum");
                }
                IpProtocol::Tcp => {
                    let t = TcpPacket::new_checked(p.payload()).expect("tcp parses");
                    assert!(t.verify_checksum(&src, &dst), "emitted TCP checksum");
                }
                IpProtocol::Udp if whole => {
                    let u = UdpPacket::new_checked(p.payload()).expect("udp parses");
                    assert!(
                        u.checksum() == 0 || u.verify_checksum(&src, &dst),
                        "emitted UDP checksum"
                    );
                }
                _ => {}
            }
        }
        EthernetProtocol::Ipv6 => {
            let p = smoltcp::wire::Ipv6Packet::new_checked(f.payload()).expect("ipv6 parses");
            // ICMPv6, or an MLDv2 report behind its 8-byte hop-by-hop
            // header (router alert).
            let body = match p.next_header() {
                IpProtocol::Icmpv6 => p.payload(),
                IpProtocol::HopByHop => {
                    let h = p.payload();
                    assert_eq!(h.get(..2), Some(&[58u8, 0][..]), "hop-by-hop then ICMPv6");
                    &h[8..]
                }
                other => panic!("only ICMPv6 is sent, not {other}"),
            };
            let i = smoltcp::wire::Icmpv6Packet::new_checked(body).expect("icmpv6 parses");
            assert!(
                i.verify_checksum(&p.src_addr(), &p.dst_addr()),
                "emitted ICMPv6 checksum"
            );
        }
        other => panic!("emitted unexpected ethertype {other}"),
    }
}

/// Poll far in the future (timers fire, reassembly times out) and check
/// what the stack sent and that reassembly memory was given back.
pub fn finish(s: &mut Stack, mut tx: VecTx) {
    s.poll(Instant::from_secs(1000), &mut tx);
    for f in &tx.frames {
        assert_well_formed(f);
    }
    assert_eq!(s.stats().ipv4.reassembly_bytes, 0);
}

/// A TCP segment's header fields and raw option bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpFields<'a> {
    pub src_port: u16,
    pub dst_port: u16,
    pub seq: u32,
    pub ack: u32,
    /// FIN SYN RST PSH ACK URG ECE CWR in the low bits, NS in bit 8.
    pub flags: u16,
    pub window: u16,
    pub urgent: u16,
    /// Up to 40 bytes, zero-padded to a multiple of 4.
    pub options: &'a [u8],
}

/// A TCP segment with a correct checksum from `src` to `dst`.
pub fn tcp_segment(src: Ipv4Addr, dst: Ipv4Addr, f: &TcpFields<'_>, payload: &[u8]) -> Vec<u8> {
    let opts = &f.options[..f.options.len().min(40)];
    let hl = 20 + opts.len().div_ceil(4) * 4;
    let mut b = vec![0u8; hl + payload.len()];
    let mut t = TcpPacket::new_unchecked(&mut b[..]);
    t.set_src_port(f.src_port);
    t.set_dst_port(f.dst_port);
    t.set_seq_number(TcpSeqNumber(f.seq as i32));
    t.set_ack_number(TcpSeqNumber(f.ack as i32));
    t.set_header_len(hl as u8);
    t.set_fin(f.flags & 0x01 != 0);
    t.set_syn(f.flags & 0x02 != 0);
    t.set_rst(f.flags & 0x04 != 0);
    t.set_psh(f.flags & 0x08 != 0);
    t.set_ack(f.flags & 0x10 != 0);
    t.set_urg(f.flags & 0x20 != 0);
    t.set_ece(f.flags & 0x40 != 0);
    t.set_cwr(f.flags & 0x80 != 0);
    t.set_ns(f.flags & 0x100 != 0);
    t.set_window_len(f.window);
    t.set_urgent_at(f.urgent);
    t.options_mut()[..opts.len()].copy_from_slice(opts);
    t.payload_mut().copy_from_slice(payload);
    t.fill_checksum(&IpAddress::Ipv4(src), &IpAddress::Ipv4(dst));
    b
}

/// Two stacks joined by a lossless in-memory wire in virtual time: `a` (the
/// stack under test, 10.0.0.1) and `b` (its peer, 10.0.0.2).
#[derive(Debug)]
pub struct Pair {
    pub a: Stack,
    pub b: Stack,
    pub now: Instant,
    /// Frames `a` sent (not yet given to `b`).
    pub a_out: VecTx,
    /// Every frame `b` ever sent to `a`: templates for mutation.
    pub templates: Vec<Vec<u8>>,
    /// Connections on `a`: (handle, local port, remote).
    pub conns: Vec<(ustack::socket::tcp::TcpHandle, u16, std::net::SocketAddr)>,
    pub b_conns: Vec<ustack::socket::tcp::TcpHandle>,
    /// Per local port of `a`: the next sequence number the peer would send
    /// and the last acknowledgment number it sent (from its real frames).
    pub peer_seq: std::collections::HashMap<u16, (u32, u32)>,
}

impl Pair {
    /// `b` connects to `a`:5001 and `a` connects to `b`:6000; both send a
    /// little data, so `a` holds two established connections with data in
    /// flight both ways.
    pub fn established() -> Pair {
        let mut a = host(1);
        let mut b = host(2);
        let la = a.tcp().listen(TCP_PORT, 4).ok();
        let lb = b.tcp().listen(6000, 4).ok();
        let _ = a.udp().bind(UDP_PORT);
        let mut p = Pair {
            a,
            b,
            now: Instant::ZERO,
            a_out: VecTx::new(),
            templates: Vec::new(),
            conns: Vec::new(),
            b_conns: Vec::new(),
            peer_seq: Default::default(),
        };
        let bc =
            p.b.tcp()
                .connect(p.now, SocketAddrV4::new(US, TCP_PORT))
                .ok();
        let ac = p.a.tcp().connect(p.now, SocketAddrV4::new(PEER, 6000)).ok();
        let mut a_acc = None;
        let mut b_acc = None;
        for _ in 0..50 {
            p.step(1);
            if let (None, Some(l)) = (a_acc, la) {
                a_acc = p.a.tcp().accept(l).ok().flatten();
            }
            if let (None, Some(l)) = (b_acc, lb) {
                b_acc = p.b.tcp().accept(l).ok().flatten();
            }
            if a_acc.is_some() && b_acc.is_some() {
                break;
            }
        }
        for h in [a_acc, ac].into_iter().flatten() {
            let _ = p.a.tcp().send(h, &[0x61; 3000]);
            if let Some(info) = p.a.tcp_ref().info(h) {
                p.conns.push((h, info.local.port(), info.remote));
            }
        }
        for h in [bc, b_acc].into_iter().flatten() {
            let _ = p.b.tcp().send(h, &[0x62; 3000]);
            p.b_conns.push(h);
        }
        for _ in 0..4 {
            p.step(1);
        }
        p
    }

    /// Advance `ms` milliseconds: both stacks poll, frames cross the wire
    /// (a's into b, b's into a with the counting check), apps read.
    pub fn step(&mut self, ms: u64) {
        self.now += std::time::Duration::from_millis(ms);
        let now = self.now;
        self.a.poll(now, &mut self.a_out);
        let mut b_out = VecTx::new();
        for f in std::mem::take(&mut self.a_out.frames) {
            assert_well_formed(&f);
            self.b
                .receive(now, &f, ustack::RxMeta::default(), &mut b_out);
        }
        self.b.poll(now, &mut b_out);
        for f in b_out.frames {
            if let Some((port, next, ack)) = tcp_next(&f) {
                self.peer_seq.insert(port, (next, ack));
            }
            receive_counted(&mut self.a, now, &f, &mut self.a_out);
            if self.templates.len() < 64 {
                self.templates.push(f);
            }
        }
        let mut buf = [0u8; 4096];
        for &(h, _, _) in &self.conns {
            while matches!(self.a.tcp().recv(h, &mut buf), Ok(n) if n > 0) {}
        }
        for &h in &self.b_conns {
            while matches!(self.b.tcp().recv(h, &mut buf), Ok(n) if n > 0) {}
        }
    }
}

/// A TCP frame's destination port, the sequence number after it, and its
/// acknowledgment number.
pub fn tcp_next(frame: &[u8]) -> Option<(u16, u32, u32)> {
    let e = EthernetFrame::new_checked(frame).ok()?;
    let ip = Ipv4Packet::new_checked(e.payload()).ok()?;
    if ip.next_header() != IpProtocol::Tcp {
        return None;
    }
    let t = TcpPacket::new_checked(ip.payload()).ok()?;
    let len = t.payload().len() as u32 + u32::from(t.syn()) + u32::from(t.fin());
    Some((
        t.dst_port(),
        (t.seq_number().0 as u32).wrapping_add(len),
        t.ack_number().0 as u32,
    ))
}
