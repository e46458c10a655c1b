//! Floods on the sim link: SYN, fragments, ARP, RoCEv2 UD and IPv6 (NS, RA,
//! fragments, extension-header chains), each sent by
//! a raw attacker port at a stack that serves a legitimate peer at the same
//! time. Each test asserts the memory the flood can take stays under its cap
//! (and prints the high-water mark), that the attack is counted, that the
//! peer is still served byte-exact, and that every buffer comes home.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use sha2::{Digest, Sha256};
use ustack::node::{App, Control};
use ustack::sim::{LinkConfig, SimNet, SimPort, host_config, host_mac};
use ustack::socket::ud::{DEFAULT_QKEY, RESPONDER_QPN, UdAddr};
use ustack::socket::udp::UdpHandle;
use ustack::stats::DropReason;
use ustack::wire::roce::{UdSendRepr, icrc_fill};
use ustack::wire::*;
use ustack::{Device, Instant, PacketBuf, SlabBuf, Stack};
use ustack_kit::bulk::{BulkRecv, BulkSend};
use ustack_kit::ping::{Pinger, PingerConfig};
use ustack_kit::ud_ping::{UdPinger, UdPingerConfig, UdResponder};

mod common;
use common::small_buffers;

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
/// The attacker's own address (it answers ARP for it: the server's gateway).
const X: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 66);
const SLICE: Duration = Duration::from_millis(1);

/// A raw port on the link: sends whatever frames it is given and answers
/// ARP requests for its own address; everything else it receives is counted
/// and dropped (its buffers go home at once).
struct Attacker {
    port: SimPort,
    rx: Vec<SlabBuf>,
    received: u64,
    sent: u64,
}

impl Attacker {
    fn attach(net: &SimNet) -> Self {
        Attacker {
            port: net.link.attach(host_mac(66), 8192),
            rx: Vec::new(),
            received: 0,
            sent: 0,
        }
    }

    fn inject(&mut self, now: Instant, frames: Vec<Vec<u8>>) {
        let mut out = Vec::with_capacity(frames.len());
        for f in frames {
            let mut b = self.port.alloc_tx().expect("attacker pool");
            assert!(b.set_len(f.len()));
            b.as_mut().copy_from_slice(&f);
            out.push(b);
        }
        self.sent += out.len() as u64;
        self.port.tx_burst(now, &mut out);
    }

    /// Drain what reached us; answer ARP requests for `X`.
    fn pump(&mut self, now: Instant) {
        let mut replies = Vec::new();
        while self.port.rx_burst(now, &mut self.rx, 1024) > 0 {
            for b in self.rx.drain(..) {
                self.received += 1;
                if let Some(r) = arp_answer(b.as_ref()) {
                    replies.push(r);
                }
            }
        }
        if !replies.is_empty() {
            self.inject(now, replies);
        }
    }
}

fn arp_answer(frame: &[u8]) -> Option<Vec<u8>> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Arp {
        return None;
    }
    let repr = ArpRepr::parse(&ArpPacket::new_checked(eth.payload()).ok()?).ok()?;
    let ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Request,
        source_hardware_addr,
        source_protocol_addr,
        target_protocol_addr,
        ..
    } = repr
    else {
        return None;
    };
    (target_protocol_addr == X).then(|| {
        arp(
            ArpOperation::Reply,
            host_mac(66),
            X,
            source_hardware_addr,
            source_protocol_addr,
            source_hardware_addr,
        )
    })
}

/// Run the sim for `slices` slices of [`SLICE`], injecting `flood(i)` at the
/// start of slice `i` and draining the attacker after each.
fn flood_for(
    net: &mut SimNet,
    apps: &mut [&mut dyn App],
    atk: &mut Attacker,
    slices: usize,
    mut flood: impl FnMut(usize) -> Vec<Vec<u8>>,
) {
    for i in 0..slices {
        atk.inject(net.now, flood(i));
        let until = net.now + SLICE;
        net.run_until(until, apps, |_| false);
        net.now = net.now.max(until);
        atk.pump(net.now);
    }
}

/// Run on (no flood) until `done` or `secs` of virtual time pass.
fn settle(
    net: &mut SimNet,
    apps: &mut [&mut dyn App],
    atk: &mut Attacker,
    secs: u64,
    mut done: impl FnMut(&SimNet) -> bool,
) -> bool {
    let end = net.now + Duration::from_secs(secs);
    while net.now < end {
        let until = net.now + Duration::from_millis(10);
        if net.run_until(until, apps, |n| done(n)) {
            atk.pump(net.now);
            return true;
        }
        net.now = net.now.max(until);
        atk.pump(net.now);
    }
    done(net)
}

/// Every frame counted once, and every buffer (nodes' and attacker's) home.
fn check_accounting_and_pools(net: &mut SimNet, atk: &mut Attacker) {
    for n in &net.nodes {
        let s = n.stack.stats();
        assert_eq!(s.eth.rx_frames, s.eth.rx_accepted + s.drops.total());
    }
    settle(net, &mut [], atk, 5, |n| n.link.in_flight() == 0);
    atk.pump(net.now);
    assert_eq!(net.link.in_flight(), 0);
    assert_eq!(net.pools_in_use(), 0, "node buffers leaked");
    assert_eq!(atk.port.pool().in_use(), 0, "attacker buffers leaked");
}

// ------------------------------------------------------------ frame builders

fn eth(src: EthernetAddress, dst: EthernetAddress, ty: EthernetProtocol, p: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; ETHERNET_HEADER_LEN + p.len()];
    EthernetRepr {
        src_addr: src,
        dst_addr: dst,
        ethertype: ty,
    }
    .emit(&mut EthernetFrame::new_unchecked(&mut f[..]));
    f[ETHERNET_HEADER_LEN..].copy_from_slice(p);
    f
}

/// An IPv4 packet; `frag` is (offset in bytes, more fragments, ident).
fn ipv4(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: IpProtocol,
    payload: &[u8],
    frag: Option<(u16, bool, u16)>,
) -> Vec<u8> {
    let mut p = vec![0u8; IPV4_HEADER_LEN + payload.len()];
    let mut pkt = Ipv4Packet::new_unchecked(&mut p[..]);
    Ipv4Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: proto,
        payload_len: payload.len(),
        hop_limit: 64,
    }
    .emit(&mut pkt, &ChecksumCapabilities::default());
    if let Some((offset, more, ident)) = frag {
        pkt.set_dont_frag(false);
        pkt.set_more_frags(more);
        pkt.set_frag_offset(offset);
        pkt.set_ident(ident);
        pkt.fill_checksum();
    }
    p[IPV4_HEADER_LEN..].copy_from_slice(payload);
    p
}

fn tcp_syn(src: SocketAddrV4, dst: SocketAddrV4, isn: u32) -> Vec<u8> {
    let repr = TcpRepr {
        src_port: src.port(),
        dst_port: dst.port(),
        control: TcpControl::Syn,
        seq_number: TcpSeqNumber(isn as i32),
        ack_number: None,
        window_len: 65_535,
        window_scale: Some(7),
        max_seg_size: Some(1460),
        sack_permitted: true,
        sack_ranges: [None; 3],
        timestamp: None,
        payload: &[],
    };
    let mut b = vec![0u8; repr.buffer_len()];
    repr.emit(
        &mut TcpPacket::new_unchecked(&mut b[..]),
        &IpAddress::Ipv4(*src.ip()),
        &IpAddress::Ipv4(*dst.ip()),
        &ChecksumCapabilities::default(),
    );
    b
}

fn arp(
    op: ArpOperation,
    sha: EthernetAddress,
    spa: Ipv4Addr,
    tha: EthernetAddress,
    tpa: Ipv4Addr,
    eth_dst: EthernetAddress,
) -> Vec<u8> {
    let repr = ArpRepr::EthernetIpv4 {
        operation: op,
        source_hardware_addr: sha,
        source_protocol_addr: spa,
        target_hardware_addr: tha,
        target_protocol_addr: tpa,
    };
    let mut a = vec![0u8; repr.buffer_len()];
    repr.emit(&mut ArpPacket::new_unchecked(&mut a[..]));
    eth(sha, eth_dst, EthernetProtocol::Arp, &a)
}

fn icmp_echo(src: Ipv4Addr, dst: Ipv4Addr, seq: u16) -> Vec<u8> {
    let repr = Icmpv4Repr::EchoRequest {
        ident: 7,
        seq_no: seq,
        data: &[0x42; 56],
    };
    let mut e = vec![0u8; repr.buffer_len()];
    repr.emit(
        &mut Icmpv4Packet::new_unchecked(&mut e[..]),
        &ChecksumCapabilities::default(),
    );
    ipv4(src, dst, IpProtocol::Icmp, &e, None)
}

/// A RoCEv2 UD SEND from `src` to `dst` QPN `qpn`; `good_icrc` false flips
/// one ICRC bit.
fn roce(src: Ipv4Addr, dst: Ipv4Addr, qpn: u32, qkey: u32, psn: u32, good_icrc: bool) -> Vec<u8> {
    let payload = [0xa5u8; 64];
    let repr = UdSendRepr {
        solicited: false,
        mig_req: true,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp: qpn,
        ack_req: false,
        psn,
        qkey,
        src_qp: 0x99,
        imm: None,
        payload: &payload,
    };
    let udp_len = 8 + repr.buffer_len();
    let mut udp = vec![0u8; udp_len];
    udp[0..2].copy_from_slice(&0xc123u16.to_be_bytes());
    udp[2..4].copy_from_slice(&4791u16.to_be_bytes());
    udp[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    repr.emit(&mut udp[8..]);
    let mut ip = ipv4(src, dst, IpProtocol::Udp, &udp, None);
    {
        let mut p = Ipv4Packet::new_unchecked(&mut ip[..]);
        p.set_dont_frag(true);
        p.fill_checksum();
    }
    assert!(icrc_fill(&mut ip));
    if !good_icrc {
        let n = ip.len();
        ip[n - 1] ^= 0x01;
    }
    eth(host_mac(66), host_mac(2), EthernetProtocol::Ipv4, &ip)
}

// ------------------------------------------------------------------ SYN flood

/// Opens a verified bulk transfer every `every`, `total` of them.
struct Staggered {
    dst: SocketAddrV4,
    every: Duration,
    next: Instant,
    total: usize,
    bytes: u64,
    clients: Vec<BulkSend>,
}

impl App for Staggered {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        if self.clients.len() < self.total && now >= self.next {
            self.clients.push(BulkSend::new(self.dst, self.bytes));
            self.next = now + self.every;
        }
        for c in self.clients.iter_mut().filter(|c| !c.done()) {
            c.poll(now, stack);
        }
        Control::Continue
    }
    fn poll_at(&self) -> Option<Instant> {
        (self.clients.len() < self.total).then_some(self.next)
    }
}

#[test]
fn syn_flood_cookies_keep_serving_legitimate_clients() {
    const BACKLOG: usize = 8;
    const CLIENTS: usize = 20;
    const PER_SLICE: usize = 500;
    const SLICES: usize = 100;
    let mut net = SimNet::new(LinkConfig {
        delay: Duration::from_micros(50),
        queue_frames: 1 << 16,
        ..LinkConfig::default()
    });
    net.add(small_buffers(1));
    let mut server_cfg = small_buffers(2);
    // Spoofed off-link sources are answered through the attacker's port.
    server_cfg.gateway = Some(X);
    net.add(server_cfg);
    let mut atk = Attacker::attach(&net);
    let dst = SocketAddrV4::new(B, 5001);
    let mut clients = Staggered {
        dst,
        every: Duration::from_millis(4),
        // The flood fills the backlog first.
        next: Instant::from_millis(10),
        total: CLIENTS,
        bytes: 64 << 10,
        clients: Vec::new(),
    };
    let mut server = BulkRecv::new(5001, BACKLOG);
    let mut rng = fastrand::Rng::with_seed(0x5eed);
    let mut n = 0u32;
    flood_for(
        &mut net,
        &mut [&mut clients, &mut server],
        &mut atk,
        SLICES,
        |_| {
            (0..PER_SLICE)
                .map(|_| {
                    n += 1;
                    let src = SocketAddrV4::new(
                        Ipv4Addr::from(0xac10_0000 | (n & 0xf_ffff)),
                        rng.u16(1024..61_024),
                    );
                    let seg = tcp_syn(src, dst, rng.u32(..));
                    let ip = ipv4(*src.ip(), B, IpProtocol::Tcp, &seg, None);
                    eth(host_mac(66), host_mac(2), EthernetProtocol::Ipv4, &ip)
                })
                .collect()
        },
    );
    let done = settle(
        &mut net,
        &mut [&mut clients, &mut server],
        &mut atk,
        60,
        |_| false,
    );
    let _ = done;
    let s = net.nodes[1].stack.stats().tcp;
    eprintln!(
        "SYN flood: {} spoofed SYNs, backlog {BACKLOG}: cookies sent {} accepted {} failed {}, \
         connection table hwm {}, backlog hwm {}, listen overflows {}",
        SLICES * PER_SLICE,
        s.syn_cookies_sent,
        s.syn_cookies_accepted,
        s.syn_cookies_failed,
        s.connections_hwm,
        s.backlog_hwm,
        s.listen_overflows
    );
    assert!(
        s.syn_cookies_sent >= (SLICES * PER_SLICE - BACKLOG) as u64,
        "{s:?}"
    );
    assert!(s.syn_cookies_accepted >= CLIENTS as u64, "{s:?}");
    // Of 50,000 SYNs only the backlog's worth made state; the rest were
    // answered statelessly. The table held the backlog plus the clients at
    // most (cookie connections join the accept queue beyond the backlog).
    assert_eq!(s.passive_opens - s.syn_cookies_accepted, BACKLOG as u64);
    assert!(s.backlog_hwm <= (BACKLOG + CLIENTS) as u64, "{s:?}");
    assert!(s.connections_hwm <= (BACKLOG + CLIENTS) as u64, "{s:?}");
    // Every legitimate client moved its bytes, byte-exact.
    assert_eq!(clients.clients.len(), CLIENTS);
    assert!(
        clients
            .clients
            .iter()
            .all(|c| c.done() && c.error.is_none())
    );
    assert_eq!(server.errors, vec![]);
    assert_eq!(server.corrupt_bytes, 0);
    assert_eq!(server.completed.len(), CLIENTS);
    let mut sent: Vec<_> = (clients.clients.iter())
        .map(|c| (c.transfer.bytes, c.transfer.crc))
        .collect();
    let mut got: Vec<_> = (server.completed.iter())
        .map(|t| (t.bytes, t.crc))
        .collect();
    sent.sort_unstable();
    got.sort_unstable();
    assert_eq!(sent, got);
    assert!(got.iter().all(|&(b, _)| b == 64 << 10));
    // The cookies went out through the gateway (the attacker's port).
    assert!(atk.received >= s.syn_cookies_sent / 2);
    // Half-open flood entries time out, TIME_WAIT passes: tables empty.
    settle(&mut net, &mut [], &mut atk, 200, |n| {
        n.nodes
            .iter()
            .all(|n| n.stack.tcp_ref().connections().count() == 0)
    });
    for node in &net.nodes {
        assert_eq!(node.stack.tcp_ref().connections().count(), 0);
    }
    check_accounting_and_pools(&mut net, &mut atk);
}

// ------------------------------------------------------------- fragment flood

/// Sends `count` UDP datagrams of `len` bytes (fragmented on the wire), one
/// every `every`, and records the hash of each.
struct UdpSender {
    sock: Option<UdpHandle>,
    dst: SocketAddrV4,
    len: usize,
    every: Duration,
    next: Instant,
    count: usize,
    hashes: Vec<[u8; 32]>,
}

impl App for UdpSender {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let h = *self
            .sock
            .get_or_insert_with(|| stack.udp().bind(0).unwrap());
        if self.hashes.len() < self.count && now >= self.next {
            let i = self.hashes.len();
            let data: Vec<u8> = (0..self.len).map(|k| (k * 7 + i * 13) as u8).collect();
            stack.udp().send_to(h, self.dst, &data).unwrap();
            self.hashes.push(Sha256::digest(&data).into());
            self.next = now + self.every;
        }
        Control::Continue
    }
    fn poll_at(&self) -> Option<Instant> {
        (self.hashes.len() < self.count).then_some(self.next)
    }
}

/// Receives datagrams on a port and records the hash of each.
struct UdpSink {
    sock: Option<UdpHandle>,
    port: u16,
    hashes: Vec<[u8; 32]>,
}

impl App for UdpSink {
    fn poll(&mut self, _: Instant, stack: &mut Stack) -> Control {
        let h = *self
            .sock
            .get_or_insert_with(|| stack.udp().bind(self.port).unwrap());
        let mut buf = vec![0u8; 65_536];
        while let Ok(Some((n, _))) = stack.udp().recv_from(h, &mut buf) {
            self.hashes.push(Sha256::digest(&buf[..n]).into());
        }
        Control::Continue
    }
}

#[test]
fn fragment_flood_stays_under_the_reassembly_cap() {
    const CAP: usize = 256 << 10;
    const SLICES: usize = 200;
    const LEGIT: usize = 50;
    let mut net = SimNet::new(LinkConfig {
        delay: Duration::from_micros(50),
        queue_frames: 1 << 16,
        ..LinkConfig::default()
    });
    net.add(host_config(1));
    let mut cfg = host_config(2);
    cfg.frag.mem_cap = CAP;
    net.add(cfg);
    let mut atk = Attacker::attach(&net);
    let mut sender = UdpSender {
        sock: None,
        dst: SocketAddrV4::new(B, 9000),
        len: 6000,
        every: Duration::from_millis(3),
        next: Instant::from_millis(5),
        count: LEGIT,
        hashes: Vec::new(),
    };
    let mut sink = UdpSink {
        sock: None,
        port: 9000,
        hashes: Vec::new(),
    };
    let mut ident = 0u16;
    let spoof = |i: u32| Ipv4Addr::from(0xac10_0000 | (i & 0xffff));
    flood_for(
        &mut net,
        &mut [&mut sender, &mut sink],
        &mut atk,
        SLICES,
        |slice| {
            let mut frames = Vec::new();
            let piece = [0x77u8; 1480];
            let mut push = |src, off, more, id, len: usize| {
                let udp = &piece[..len];
                let ip = ipv4(src, B, IpProtocol::Udp, udp, Some((off, more, id)));
                frames.push(eth(host_mac(66), host_mac(2), EthernetProtocol::Ipv4, &ip));
            };
            for _ in 0..40 {
                // Endless first fragments, each a new datagram.
                ident = ident.wrapping_add(1);
                push(spoof(u32::from(ident)), 0, true, ident, 1480);
            }
            for _ in 0..4 {
                // Far fragments: each charges ~64 KiB.
                ident = ident.wrapping_add(1);
                push(spoof(u32::from(ident)), 64_000, true, ident, 1480);
            }
            for _ in 0..4 {
                // Overlapping pieces of one datagram.
                ident = ident.wrapping_add(1);
                let src = spoof(u32::from(ident) + slice as u32);
                push(src, 0, true, ident, 1480);
                push(src, 800, true, ident, 1480);
            }
            frames
        },
    );
    settle(&mut net, &mut [&mut sender, &mut sink], &mut atk, 5, |_| {
        false
    });
    let s = net.nodes[1].stack.stats();
    eprintln!(
        "fragment flood: {} attack fragments, cap {} B: reassembly hwm {} B, evicted {}, \
         frag_overlap {}, frag_no_memory {}, legit datagrams {}/{}",
        atk.sent,
        CAP,
        s.ipv4.reassembly_bytes_hwm,
        s.ipv4.reassembly_evicted,
        s.drops.get(DropReason::FragOverlap),
        s.drops.get(DropReason::FragNoMemory),
        sink.hashes.len(),
        LEGIT
    );
    assert!(s.ipv4.reassembly_bytes_hwm <= CAP as u64);
    assert!(
        s.ipv4.reassembly_bytes_hwm > CAP as u64 / 2,
        "cap never reached"
    );
    assert!(s.ipv4.reassembly_evicted > 1000, "{:?}", s.ipv4);
    assert_eq!(
        s.drops.get(DropReason::FragOverlap),
        (SLICES * 4) as u64,
        "every overlap counted"
    );
    // Every legitimate fragmented datagram arrived, byte-exact, in order.
    assert_eq!(sink.hashes, sender.hashes);
    assert_eq!(sender.hashes.len(), LEGIT);
    // Incomplete datagrams time out: nothing held.
    settle(&mut net, &mut [], &mut atk, 40, |_| false);
    let s = net.nodes[1].stack.stats();
    assert_eq!(s.ipv4.reassembly_bytes, 0);
    assert!(s.ipv4.reassembly_timeouts > 0);
    check_accounting_and_pools(&mut net, &mut atk);
}

// ------------------------------------------------------------------ ARP flood

fn pinger(count: u64, ident: u16) -> Pinger {
    let mut cfg = PingerConfig::new(B);
    cfg.ident = ident;
    cfg.count = Some(count);
    cfg.interval = Duration::from_millis(2);
    cfg.timeout = Duration::from_millis(500);
    Pinger::new(cfg)
}

#[test]
fn arp_flood_keeps_table_and_pending_queue_bounded() {
    const MAX_ENTRIES: usize = 256;
    const SLICES: usize = 200;
    let mut net = SimNet::new(LinkConfig {
        delay: Duration::from_micros(50),
        queue_frames: 1 << 16,
        ..LinkConfig::default()
    });
    // A /16: the flood's thousands of senders are all on the link.
    let on_link = |n: u8| {
        let mut c = host_config(n);
        c.ip = Ipv4Cidr::new(Ipv4Addr::new(10, 0, 0, n), 16);
        c
    };
    net.add(on_link(1));
    let mut cfg = on_link(2);
    cfg.arp.max_entries = MAX_ENTRIES;
    // Short-lived entries: the live peer's expires many times during the
    // flood and must be resolved again through a full pending queue.
    cfg.arp.entry_ttl = Duration::from_millis(30);
    let pending_cap = cfg.arp.pending_bytes_total;
    net.add(cfg);
    let mut atk = Attacker::attach(&net);
    let mut ping = pinger(500, 1);
    let mut k = 0u32;
    let sender = |k: u32| {
        let ip = Ipv4Addr::from(0x0a00_0000 | (0x0100 + k % 0xfe00));
        let mac = EthernetAddress([0x02, 0xaa, (k >> 16) as u8, (k >> 8) as u8, k as u8, 1]);
        (ip, mac)
    };
    let bcast = EthernetAddress::BROADCAST;
    flood_for(&mut net, &mut [&mut ping], &mut atk, SLICES, |i| {
        let mut f = Vec::new();
        for _ in 0..20 {
            k += 1;
            let (ip, mac) = sender(k);
            // Requests for the stack from new senders (learned: they are for us).
            f.push(arp(
                ArpOperation::Request,
                mac,
                ip,
                EthernetAddress([0; 6]),
                B,
                bcast,
            ));
            k += 1;
            let (ip, mac) = sender(k);
            // Unsolicited replies and gratuitous announcements (not learned).
            f.push(arp(
                ArpOperation::Reply,
                mac,
                ip,
                host_mac(2),
                B,
                host_mac(2),
            ));
            k += 1;
            let (ip, mac) = sender(k);
            f.push(arp(
                ArpOperation::Request,
                mac,
                ip,
                EthernetAddress([0; 6]),
                ip,
                bcast,
            ));
            // Echo requests from unresolved senders: each reply waits for ARP.
            k += 1;
            let (ip, _) = sender(k + 0x8000);
            let echo = icmp_echo(ip, B, k as u16);
            f.push(eth(
                host_mac(66),
                host_mac(2),
                EthernetProtocol::Ipv4,
                &echo,
            ));
        }
        // A spoofed reply for the live peer while its entry is fresh (before
        // it first expires): refused. (A spoof that races the answer to our
        // own request can win, as with any ARP; see README.)
        if (2..20).contains(&i) {
            let spoofed = EthernetAddress([0x02, 0x66, 0, 0, 0, i as u8]);
            f.push(arp(
                ArpOperation::Reply,
                spoofed,
                A,
                host_mac(2),
                B,
                host_mac(2),
            ));
        }
        f
    });
    let s = net.nodes[1].stack.stats();
    let during = ping.summary();
    eprintln!(
        "ARP flood: {} frames, table cap {MAX_ENTRIES}: entries hwm {}, pending bytes hwm {} \
         (cap {pending_cap}), pending dropped {}, table full {}, spoofs refused {}; \
         pings during the flood {}/{}",
        atk.sent,
        s.arp.entries_hwm,
        s.arp.pending_bytes_hwm,
        s.arp.pending_dropped,
        s.arp.table_full,
        s.drops.get(DropReason::ArpSpoofRefused),
        during.received,
        during.transmitted
    );
    assert!(s.arp.rx_requests + s.arp.rx_replies >= (SLICES * 60) as u64);
    assert!(s.arp.table_full > 0, "{:?}", s.arp);
    assert!(s.arp.entries_hwm <= MAX_ENTRIES as u64, "{:?}", s.arp);
    assert!(s.arp.entries_hwm >= MAX_ENTRIES as u64 / 2, "{:?}", s.arp);
    assert!(s.arp.pending_bytes_hwm <= pending_cap as u64, "{:?}", s.arp);
    assert!(s.arp.pending_dropped > 0, "{:?}", s.arp);
    assert!(s.drops.get(DropReason::ArpNotForUs) > 0);
    // Spoofed replies for the live peer: refused, never learned.
    assert_eq!(s.drops.get(DropReason::ArpSpoofRefused), 18);
    assert!(
        !(net.nodes[1].stack.addr_ref().neighbours(net.now).iter())
            .any(|&(ip, mac)| ip == A && mac != host_mac(1)),
        "the live peer's entry was spoofed"
    );
    // The real peer is answered during the flood and after it.
    assert!(during.received * 10 >= during.transmitted * 9, "{during:?}");
    settle(&mut net, &mut [&mut ping], &mut atk, 5, |_| false);
    let mut after = pinger(100, 2);
    settle(&mut net, &mut [&mut after], &mut atk, 5, |_| false);
    let a = after.summary();
    assert_eq!((a.transmitted, a.received), (100, 100));
    check_accounting_and_pools(&mut net, &mut atk);
}

// ------------------------------------------------------------------- UD flood

#[test]
fn ud_flood_is_dropped_by_reason_and_ud_ping_still_answered() {
    const SLICES: usize = 200;
    const DEPTH: usize = 8;
    let mut net = SimNet::new(LinkConfig {
        delay: Duration::from_micros(50),
        queue_frames: 1 << 16,
        ..LinkConfig::default()
    });
    net.add(host_config(1));
    net.add(host_config(2));
    let mut atk = Attacker::attach(&net);
    let mut cfg = UdPingerConfig::new(UdAddr {
        ip: B.into(),
        qpn: RESPONDER_QPN,
    });
    cfg.count = Some(500);
    cfg.interval = Duration::from_millis(1);
    cfg.timeout = Duration::from_millis(200);
    let mut ping = UdPinger::new(cfg.clone());
    let mut responder = UdResponder::default().with_depth(DEPTH);
    let mut psn = 0u32;
    flood_for(
        &mut net,
        &mut [&mut ping, &mut responder],
        &mut atk,
        SLICES,
        |i| {
            let mut f = Vec::new();
            // A burst at the responder with a good ICRC: sunk, or dropped
            // once its DEPTH posted buffers are taken.
            for _ in 0..16u32 {
                psn += 1;
                f.push(roce(X, B, RESPONDER_QPN, DEFAULT_QKEY, psn, true));
            }
            for j in 0..16u32 {
                psn += 1;
                f.push(roce(X, B, RESPONDER_QPN, DEFAULT_QKEY, psn, false));
                f.push(roce(X, B, RESPONDER_QPN, 0xbad, psn, true));
                f.push(roce(
                    X,
                    B,
                    1000 + i as u32 * 16 + j,
                    DEFAULT_QKEY,
                    psn,
                    true,
                ));
                f.push(roce(X, B, 1000 + j, DEFAULT_QKEY, psn, false));
            }
            f
        },
    );
    settle(
        &mut net,
        &mut [&mut ping, &mut responder],
        &mut atk,
        5,
        |_| false,
    );
    let s = net.nodes[1].stack.stats();
    let d = |r| s.drops.get(r);
    let during = ping.summary().clone();
    eprintln!(
        "UD flood: {} RoCEv2 SENDs: bad_icrc {} unknown_qpn {} bad_qkey {} no_recv_buffer {} \
         cq_full {}; responder sank {}; CQ depth hwm {} (bound {}); UD pings during {}/{}",
        atk.sent,
        d(DropReason::UdBadIcrc),
        d(DropReason::UdUnknownQpn),
        d(DropReason::UdBadQkey),
        d(DropReason::UdNoRecvBuffer),
        d(DropReason::UdCqFull),
        responder.stats().sink_msgs,
        s.ud.cq_depth_hwm,
        2 * DEPTH,
        during.received,
        during.transmitted,
    );
    let per = (SLICES * 16) as u64;
    assert_eq!(d(DropReason::UdBadIcrc), 2 * per);
    assert_eq!(d(DropReason::UdUnknownQpn), per);
    assert_eq!(d(DropReason::UdBadQkey), per);
    // Good SENDs at the responder: sunk or dropped for want of a buffer.
    assert_eq!(
        responder.stats().sink_msgs + d(DropReason::UdNoRecvBuffer) + d(DropReason::UdCqFull),
        per
    );
    assert!(d(DropReason::UdNoRecvBuffer) > 0);
    assert!(s.ud.cq_depth_hwm <= 2 * DEPTH as u64);
    assert_eq!(s.eth.rx_frames, s.eth.rx_accepted + s.drops.total());
    assert_eq!(during.transmitted, 500);
    assert!(during.received * 2 >= during.transmitted, "{during:?}");
    // After the flood every ping is answered.
    let mut after = UdPinger::new(UdPingerConfig {
        count: Some(100),
        ..cfg
    });
    settle(
        &mut net,
        &mut [&mut after, &mut responder],
        &mut atk,
        5,
        |_| false,
    );
    let a = after.summary();
    assert_eq!((a.transmitted, a.received), (100, 100));
    check_accounting_and_pools(&mut net, &mut atk);
}

// ----------------------------------------------------------- IPv6 floods

mod v6util;

/// Every IPv6 flood at once, at the stack on `fd77::2` (host 1) while host
/// 2 (`fd77::1`) pings it: neighbor solicitations from thousands of
/// spoofed on-link senders (each teaching a neighbor), router
/// advertisements from a new router with a new prefix each time, first
/// fragments of datagrams that never finish, and packets behind chains of
/// 12 destination options headers. The neighbor cache, the routers, the
/// SLAAC addresses and the reassembly memory stay at their caps, the
/// chains are refused by reason, every ping is answered, and every buffer
/// comes home.
#[test]
fn ipv6_floods_of_ns_ra_fragments_and_header_chains_stay_bounded() {
    use std::net::Ipv6Addr;
    use ustack::iface::ipv6::{MAX_PREFIXES, MAX_ROUTERS, multicast_mac, solicited_node};
    use ustack::iface::ndp::MAX_NEIGHBORS;
    use v6util::{GLOBAL, PEER};
    const SLICES: usize = 200;
    const CAP: usize = 256 << 10;
    let mut net = SimNet::new(LinkConfig {
        delay: Duration::from_micros(50),
        queue_frames: 1 << 16,
        ..LinkConfig::default()
    });
    // Node 0 runs the pinger (host 2, the peer); node 1 is the victim
    // (host 1: the frames of v6util go to its MAC).
    let mut peer = host_config(2);
    peer.announce = false;
    peer.ipv6 = vec![Ipv6Cidr::new(PEER, 64)];
    net.add(peer);
    let mut victim = v6util::config();
    victim.frag.mem_cap = CAP;
    net.add(victim);
    let mut atk = Attacker::attach(&net);
    let mut cfg = PingerConfig::new(GLOBAL);
    cfg.count = Some(200);
    cfg.interval = Duration::from_millis(2);
    cfg.timeout = Duration::from_millis(500);
    let mut ping = Pinger::new(cfg);
    let group = solicited_node(GLOBAL);
    let mut k = 0u32;
    flood_for(&mut net, &mut [&mut ping], &mut atk, SLICES, |slice| {
        let mut f = Vec::new();
        for _ in 0..20 {
            k += 1;
            let src = Ipv6Addr::new(0xfd77, 0, 0, 0, 1, 0, (k >> 16) as u16, k as u16);
            let mac = EthernetAddress([0x02, 0xbb, (k >> 16) as u8, (k >> 8) as u8, k as u8, 1]);
            let ns = v6util::solicit(GLOBAL, Some(mac));
            f.push(v6util::icmpv6_frame(
                multicast_mac(group),
                src,
                group,
                255,
                &ns,
            ));
        }
        for _ in 0..2 {
            k += 1;
            let router = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, (k >> 16) as u16, k as u16);
            let prefix = Ipv6Addr::new(0xfd00, k as u16, 0, 0, 0, 0, 0, 0);
            f.push(v6util::router_advert(
                router,
                1800,
                None,
                Some((prefix, 64, 3600)),
            ));
        }
        for _ in 0..10 {
            k += 1;
            let src = Ipv6Addr::new(0xfd77, 0, 0, 0, 2, 0, (k >> 16) as u16, k as u16);
            let body = [
                v6util::frag_header(IpProtocol::Udp, 0, true, k),
                vec![0x55; 1400],
            ]
            .concat();
            f.push(v6util::v6_frame_from(
                GLOBAL,
                src,
                IpProtocol::Ipv6Frag,
                &body,
            ));
        }
        if slice % 2 == 0 {
            let mut chain = Vec::new();
            for i in 0..12 {
                let next = if i == 11 {
                    IpProtocol::Udp
                } else {
                    IpProtocol::Ipv6Opts
                };
                chain.extend(v6util::opts_header(next, &[]));
            }
            f.push(v6util::v6_frame(
                IpProtocol::Ipv6Opts,
                &chain,
                &v6util::udp6(b"deep"),
            ));
        }
        f
    });
    settle(&mut net, &mut [&mut ping], &mut atk, 5, |_| false);
    let s = net.nodes[1].stack.stats();
    let neighbors = net.nodes[1].stack.addr_ref().ipv6_neighbours(net.now).len();
    eprintln!(
        "IPv6 floods: {} frames; neighbors {} (gauge {}), routers {}, SLAAC addresses {}, \
         reassembly hwm {} B, evicted {}, ra_ignored {}, bad extensions {}, pings {}/{}",
        atk.sent,
        neighbors,
        s.ipv6.neighbors,
        s.ipv6.routers,
        s.ipv6.slaac_addresses,
        s.ipv4.reassembly_bytes_hwm,
        s.ipv4.reassembly_evicted,
        s.ipv6.ra_ignored,
        s.drops.get(DropReason::Ipv6BadExtension),
        ping.summary().received,
        ping.summary().transmitted,
    );
    assert!(s.ipv6.rx_neighbor_solicits >= (SLICES * 20) as u64);
    assert!(neighbors <= MAX_NEIGHBORS && s.ipv6.neighbors <= MAX_NEIGHBORS as u64);
    assert!(s.ipv6.rx_router_adverts >= (SLICES * 2) as u64);
    assert!(s.ipv6.routers <= MAX_ROUTERS as u64 && s.ipv6.routers > 0);
    assert!(s.ipv6.slaac_addresses <= MAX_PREFIXES as u64);
    assert!(s.ipv4.reassembly_bytes_hwm <= CAP as u64);
    assert!(
        s.ipv4.reassembly_evicted > 0,
        "no datagram was ever evicted"
    );
    assert_eq!(
        s.drops.get(DropReason::Ipv6BadExtension),
        (SLICES / 2) as u64,
        "every chain refused"
    );
    assert!(ping.finished(net.now));
    let p = ping.summary();
    assert_eq!(
        (p.transmitted, p.received),
        (200, 200),
        "the peer was served"
    );
    check_accounting_and_pools(&mut net, &mut atk);
}
