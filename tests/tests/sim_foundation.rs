//! Foundation scenarios on the sim link: ARP resolution, 1,000 pings clean and
//! under loss, UDP across an impaired link, and pool accounting after each.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use sha2::{Digest, Sha256};
use ustack::node::{App, Control};
use ustack::sim::{LinkConfig, SimNet, host_config, host_mac};
use ustack::socket::udp::UdpHandle;
use ustack::{Instant, Stack};
use ustack_kit::ping::{Pinger, PingerConfig};

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

fn two_hosts(cfg: LinkConfig) -> SimNet {
    let mut net = SimNet::new(cfg);
    net.add(host_config(1));
    net.add(host_config(2));
    net
}

/// Step until nothing is left on the wire or in any timer, then check every
/// pool is back to its baseline (no buffer leaked).
fn drain_and_check_pools(net: &mut SimNet) {
    let deadline = net.now + Duration::from_secs(120);
    net.run_until(deadline, &mut [], |n| n.link.in_flight() == 0);
    assert_eq!(net.link.in_flight(), 0);
    assert_eq!(net.pools_in_use(), 0, "buffers leaked");
}

fn pinger(count: u64) -> Pinger {
    let mut cfg = PingerConfig::new(B);
    cfg.count = Some(count);
    cfg.interval = Duration::from_millis(1);
    cfg.timeout = Duration::from_millis(200);
    Pinger::new(cfg)
}

#[test]
fn stacks_resolve_each_other_by_arp() {
    let mut net = two_hosts(LinkConfig::default());
    let mut p = pinger(1);
    let ok = net.run_until(Instant::from_secs(5), &mut [&mut p], |n| {
        !n.nodes[0].stack.addr_ref().neighbours(n.now).is_empty()
            && !n.nodes[1].stack.addr_ref().neighbours(n.now).is_empty()
    });
    assert!(ok);
    assert_eq!(
        net.nodes[0].stack.addr_ref().neighbours(net.now),
        vec![(B, host_mac(2))]
    );
    assert_eq!(
        net.nodes[1].stack.addr_ref().neighbours(net.now),
        vec![(A, host_mac(1))]
    );
    drain_and_check_pools(&mut net);
}

#[test]
fn thousand_pings_clean_link_no_loss() {
    let mut net = two_hosts(LinkConfig {
        delay: Duration::from_micros(50),
        ..LinkConfig::default()
    });
    let mut p = pinger(1000);
    // run_until stops when nothing is left to do: the pinger is finished.
    net.run_until(Instant::from_secs(60), &mut [&mut p], |_| false);
    assert!(p.finished(net.now));
    assert!(
        net.now < Instant::from_secs(60),
        "finished early, not at the deadline"
    );
    let s = p.summary();
    assert_eq!(
        (s.transmitted, s.received, s.duplicates, s.errors),
        (1000, 1000, 0, 0)
    );
    assert_eq!(s.loss_percent(), 0.0);
    // RTT is two one-way delays on the virtual clock; only the first ping,
    // which waited for ARP, may take longer.
    assert_eq!(s.rtt.min, Duration::from_micros(100));
    assert!(s.rtt.max <= Duration::from_micros(200), "{:?}", s.rtt.max);
    let b = net.nodes[1].stack.stats();
    assert_eq!(b.icmp.rx_echo_requests, 1000);
    assert_eq!(b.icmp.tx_echo_replies, 1000);
    // The only frame B did not use: A's gratuitous ARP, sent before B knew A.
    assert_eq!(
        b.drops.nonzero().collect::<Vec<_>>(),
        vec![("arp_not_for_us", 1)]
    );
    assert_eq!(net.nodes[0].stack.stats().icmp.rx_echo_replies, 1000);
    drain_and_check_pools(&mut net);
}

#[test]
fn twenty_percent_loss_is_counted_and_never_hangs() {
    let mut net = two_hosts(LinkConfig {
        loss: 0.20,
        seed: 42,
        ..LinkConfig::default()
    });
    let mut p = pinger(1000);
    net.run_until(Instant::from_secs(120), &mut [&mut p], |_| false);
    assert!(p.finished(net.now), "pinger must finish, not hang");
    let s = p.summary();
    assert_eq!(s.transmitted, 1000);
    let lost = s.transmitted - s.received;
    // Each round trip crosses the lossy wire twice: expect ~36% lost.
    assert!((250..=450).contains(&lost), "lost {lost}");
    let link = net.link.stats();
    assert!(link.lost > 0);
    // Every request that arrived was answered, every reply that arrived was counted.
    let b = net.nodes[1].stack.stats();
    let a = net.nodes[0].stack.stats();
    assert_eq!(a.icmp.rx_echo_replies, s.received);
    assert_eq!(b.icmp.tx_echo_replies, b.icmp.rx_echo_requests);
    // Lost frames on the wire account for exactly the difference.
    assert_eq!(link.sent, link.delivered + link.lost);
    drain_and_check_pools(&mut net);
}

/// Echoes every UDP datagram back to its sender.
struct UdpEcho {
    port: u16,
    h: Option<UdpHandle>,
}

impl App for UdpEcho {
    fn poll(&mut self, _: Instant, stack: &mut Stack) -> Control {
        let h = *self
            .h
            .get_or_insert_with(|| stack.udp().bind(self.port).expect("bind"));
        let mut buf = vec![0u8; 65_536];
        while let Ok(Some((n, from))) = stack.udp().recv_from(h, &mut buf) {
            stack.udp().send_to(h, from, &buf[..n]).expect("send");
        }
        Control::Continue
    }
}

/// Sends numbered datagrams of varying size, collects the echoes.
struct UdpClient {
    h: Option<UdpHandle>,
    sizes: Vec<usize>,
    next: usize,
    received: Vec<Vec<u8>>,
}

fn payload(i: usize, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len).map(|j| (i * 31 + j * 7) as u8).collect();
    v[..4].copy_from_slice(&(i as u32).to_be_bytes());
    v
}

impl App for UdpClient {
    fn poll(&mut self, _: Instant, stack: &mut Stack) -> Control {
        let h = *self
            .h
            .get_or_insert_with(|| stack.udp().bind(0).expect("bind"));
        // A few in flight at a time.
        while self.next < self.sizes.len() && self.next < self.received.len() + 8 {
            let d = payload(self.next, self.sizes[self.next]);
            stack
                .udp()
                .send_to(h, SocketAddrV4::new(B, 7), &d)
                .expect("send");
            self.next += 1;
        }
        let mut buf = vec![0u8; 65_536];
        while let Ok(Some((n, _))) = stack.udp().recv_from(h, &mut buf) {
            self.received.push(buf[..n].to_vec());
        }
        Control::Continue
    }
}

#[test]
fn udp_echo_over_reordering_duplicating_link_including_fragments() {
    let mut net = two_hosts(LinkConfig {
        reorder: 0.1,
        duplicate: 0.05,
        delay: Duration::from_micros(20),
        jitter: Duration::from_micros(30),
        seed: 7,
        ..LinkConfig::default()
    });
    let sizes: Vec<usize> = (0..200)
        .map(|i| [16, 512, 1472, 3000, 9000][i % 5])
        .collect();
    let mut client = UdpClient {
        h: None,
        sizes: sizes.clone(),
        next: 0,
        received: Vec::new(),
    };
    let mut echo = UdpEcho { port: 7, h: None };
    let ok = net.run_until(
        Instant::from_secs(30),
        &mut [&mut client, &mut echo],
        |_| false,
    );
    assert!(!ok);
    // Duplicates mean some datagrams come back twice; every one must be intact.
    let mut seen = std::collections::BTreeMap::new();
    for d in &client.received {
        let i = u32::from_be_bytes(d[..4].try_into().unwrap()) as usize;
        assert_eq!(
            Sha256::digest(d),
            Sha256::digest(payload(i, sizes[i])),
            "datagram {i} corrupted"
        );
        seen.insert(i, ());
    }
    assert_eq!(seen.len(), sizes.len(), "every datagram echoed");
    assert!(net.nodes[1].stack.stats().ipv4.reassembled > 0);
    assert!(net.link.stats().duplicated > 0 && net.link.stats().reordered > 0);
    drain_and_check_pools(&mut net);
}

#[test]
fn corrupted_frames_are_dropped_never_delivered() {
    let mut net = two_hosts(LinkConfig {
        corrupt: 0.3,
        seed: 3,
        ..LinkConfig::default()
    });
    let mut p = pinger(500);
    net.run_until(Instant::from_secs(60), &mut [&mut p], |_| false);
    let s = p.summary();
    assert_eq!(s.transmitted, 500);
    assert!(s.received < 500);
    let a = net.nodes[0].stack.stats();
    let b = net.nodes[1].stack.stats();
    let drops = a.drops.total() + b.drops.total();
    assert!(drops > 0, "corruption must show in drop counters");
    for st in [&a, &b] {
        assert_eq!(st.eth.rx_frames, st.eth.rx_accepted + st.drops.total());
    }
    drain_and_check_pools(&mut net);
}

#[test]
fn rate_limited_link_paces_frames() {
    // 1 Mbit/s: a 1514-byte frame takes ~12 ms to serialize.
    let mut net = two_hosts(LinkConfig {
        rate_bps: 1_000_000,
        ..LinkConfig::default()
    });
    let mut cfg = PingerConfig::new(B);
    cfg.count = Some(5);
    cfg.size = 1472;
    cfg.interval = Duration::from_millis(100);
    let mut p = Pinger::new(cfg);
    net.run_until(Instant::from_secs(10), &mut [&mut p], |_| false);
    let s = p.summary();
    assert_eq!(s.received, 5);
    // Request and reply each serialize once: 2 x 1514 x 8 bits at 1 Mbit/s.
    assert!(
        s.rtt.min >= Duration::from_micros(24_000),
        "{:?}",
        s.rtt.min
    );
    drain_and_check_pools(&mut net);
}

#[test]
fn unreachable_host_times_out_and_arp_gives_up() {
    let mut net = two_hosts(LinkConfig::default());
    let mut cfg = PingerConfig::new(Ipv4Addr::new(10, 0, 0, 77));
    cfg.count = Some(3);
    cfg.interval = Duration::from_millis(200);
    let mut p = Pinger::new(cfg);
    net.run_until(Instant::from_secs(30), &mut [&mut p], |_| false);
    let s = p.summary();
    assert_eq!((s.transmitted, s.received), (3, 0));
    let arp = net.nodes[0].stack.stats().arp;
    assert_eq!(arp.unresolved, 1);
    assert_eq!(arp.pending_packets, 0);
    assert_eq!(arp.pending_dropped, 3);
    drain_and_check_pools(&mut net);
}
