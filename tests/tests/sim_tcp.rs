//! TCP on the sim link: byte-exact bulk transfers in both directions at once
//! under every impairment, window behaviour, congestion response, and pool
//! accounting. Set USTACK_TCP_MIB to change the transfer size (default 256).

use std::net::SocketAddrV4;
use std::time::Duration;

use ustack::node::{App, Control};
use ustack::sim::{LinkConfig, SimNet, host_config};
use ustack::socket::tcp::cc::Algorithm;
use ustack::{Config, Device, Instant, Stack};
use ustack_kit::bulk::{BulkRecv, BulkSend};

/// One host's apps: a sender toward the other host and a receiver.
struct Both {
    send: BulkSend,
    recv: BulkRecv,
}

impl App for Both {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        self.recv.poll(now, stack);
        self.send.poll(now, stack);
        Control::Continue
    }
    fn poll_at(&self) -> Option<Instant> {
        ustack::time::earliest(self.send.poll_at(), self.recv.poll_at())
    }
}

fn mib() -> u64 {
    std::env::var("USTACK_TCP_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// Transfer `bytes` each way at once between two stacks; assert byte-exact
/// delivery, no errors and every buffer returned. Returns the net for more checks.
fn both_ways(
    link: LinkConfig,
    bytes: u64,
    tweak: impl Fn(&mut Config),
    deadline_s: u64,
) -> (SimNet, [Both; 2]) {
    both_ways_with(link, bytes, tweak, deadline_s, |r| r)
}

fn both_ways_with(
    link: LinkConfig,
    bytes: u64,
    tweak: impl Fn(&mut Config),
    deadline_s: u64,
    recv: impl Fn(BulkRecv) -> BulkRecv,
) -> (SimNet, [Both; 2]) {
    let mut net = SimNet::new(link);
    for n in [1u8, 2] {
        let mut cfg = host_config(n);
        tweak(&mut cfg);
        net.add(cfg);
    }
    run_both_ways(net, bytes, deadline_s, recv)
}

/// [`both_ways_with`] on hosts already added to `net`.
fn run_both_ways(
    mut net: SimNet,
    bytes: u64,
    deadline_s: u64,
    recv: impl Fn(BulkRecv) -> BulkRecv,
) -> (SimNet, [Both; 2]) {
    let a = net.nodes[0].stack.ip();
    let b = net.nodes[1].stack.ip();
    let mut apps = [
        Both {
            send: BulkSend::new(SocketAddrV4::new(b, 5001), bytes),
            recv: recv(BulkRecv::new(5001, 8)),
        },
        Both {
            send: BulkSend::new(SocketAddrV4::new(a, 5001), bytes),
            recv: recv(BulkRecv::new(5001, 8)),
        },
    ];
    let deadline = Instant::from_secs(deadline_s);
    loop {
        let [x, y] = &mut apps;
        let before = net.now;
        net.run_until(net.now + Duration::from_millis(500), &mut [x, y], |_| false);
        let stuck = net.now == before;
        let finished = apps
            .iter()
            .all(|h| h.send.done() && h.recv.completed.len() == 1);
        if std::env::var_os("USTACK_DEBUG").is_some() {
            eprintln!(
                "t={} err={:?}/{:?} {:?}",
                net.now,
                apps[0].send.error,
                apps[1].send.error,
                net.nodes[0]
                    .stack
                    .tcp_ref()
                    .connections()
                    .map(|c| (
                        c.state,
                        c.cwnd,
                        c.in_flight,
                        c.send_queued,
                        c.snd_wnd,
                        c.stats.retransmits,
                        c.stats.timeouts
                    ))
                    .collect::<Vec<_>>()
            );
        }
        if finished || stuck || net.now >= deadline {
            break;
        }
    }
    for (i, h) in apps.iter().enumerate() {
        assert_eq!(h.send.error, None, "host {i} sender");
        assert!(
            h.send.done(),
            "host {i} sender not done at {}: {:?}",
            net.now,
            net.nodes[i]
                .stack
                .tcp_ref()
                .connections()
                .collect::<Vec<_>>()
        );
        assert!(
            h.recv.errors.is_empty(),
            "host {i} receiver: {:?}",
            h.recv.errors
        );
        assert_eq!(h.recv.corrupt_bytes, 0, "host {i} received corrupt bytes");
        assert_eq!(h.recv.completed.len(), 1, "host {i}");
    }
    // Each receiver got exactly what the other side sent, hash compared.
    for (rx, tx) in [(0, 1), (1, 0)] {
        let got = apps[rx].recv.completed[0];
        let sent = apps[tx].send.transfer;
        assert_eq!(got.bytes, bytes);
        assert_eq!(got.crc, sent.crc, "CRC-32 of the stream differs");
    }
    // Segments fit the MTU with their options (or the port's TSO cut them
    // to it): nothing was fragmented.
    for n in &net.nodes {
        assert_eq!(n.stack.stats().ipv4.tx_fragments, 0);
    }
    // Let TIME_WAIT and the wire drain, then every buffer is home.
    let end = net.now + Duration::from_secs(130);
    net.run_until(end, &mut [], |_| false);
    assert_eq!(net.link.in_flight(), 0);
    assert_eq!(net.pools_in_use(), 0, "buffers leaked");
    for n in &net.nodes {
        assert_eq!(
            n.stack.tcp_ref().connections().count(),
            0,
            "connections left behind"
        );
    }
    (net, apps)
}

fn bytes() -> u64 {
    mib() << 20
}

#[test]
fn clean_link() {
    let (net, _) = both_ways(LinkConfig::default(), bytes(), |_| {}, 600);
    let s = net.nodes[0].stack.stats().tcp;
    assert_eq!(s.retransmits, 0, "no loss, no retransmission");
    assert_eq!(s.totals.timeouts, 0);
    assert!(s.totals.bytes_out >= bytes());
}

#[test]
fn one_percent_loss() {
    let link = LinkConfig {
        loss: 0.01,
        delay: Duration::from_micros(100),
        seed: 11,
        ..LinkConfig::default()
    };
    let (net, _) = both_ways(link, bytes(), |_| {}, 3600);
    let s = net.nodes[0].stack.stats().tcp;
    assert!(s.retransmits > 0);
    // Most losses are repaired by fast retransmit, not by timeouts.
    assert!(
        s.totals.fast_retransmits > s.totals.timeouts,
        "{:?}",
        s.totals
    );
}

#[test]
fn ten_percent_loss() {
    let link = LinkConfig {
        loss: 0.10,
        delay: Duration::from_micros(100),
        seed: 12,
        ..LinkConfig::default()
    };
    both_ways(link, bytes(), |_| {}, 36_000);
}

#[test]
fn reordering() {
    let link = LinkConfig {
        reorder: 0.05,
        reorder_delay: Duration::from_micros(300),
        delay: Duration::from_micros(100),
        seed: 13,
        ..LinkConfig::default()
    };
    both_ways(link, bytes(), |_| {}, 3600);
}

#[test]
fn duplication() {
    let link = LinkConfig {
        duplicate: 0.05,
        delay: Duration::from_micros(100),
        seed: 14,
        ..LinkConfig::default()
    };
    both_ways(link, bytes(), |_| {}, 3600);
}

#[test]
fn corruption_point_one_percent() {
    let link = LinkConfig {
        corrupt: 0.001,
        delay: Duration::from_micros(100),
        seed: 15,
        ..LinkConfig::default()
    };
    let (net, _) = both_ways(link, bytes(), |_| {}, 3600);
    let drops: u64 = net
        .nodes
        .iter()
        .map(|n| n.stack.stats().drops.total())
        .sum();
    assert!(drops > 0, "corrupted frames must be dropped by checksum");
}

#[test]
fn long_delay_small_buffer_window_scaling_and_zero_windows() {
    // 50 ms each way. Buffers of 256 KiB need window scaling; readers that
    // take 128 KiB every 500 ms leave the window at zero longer than the
    // persist timer, so senders probe, and resume when the window opens.
    let link = LinkConfig {
        delay: Duration::from_millis(50),
        seed: 16,
        ..LinkConfig::default()
    };
    let (net, _) = both_ways_with(
        link,
        bytes(),
        |c| {
            c.tcp.recv_buffer = 256 << 10;
            c.tcp.send_buffer = 256 << 10;
        },
        36_000,
        |r| r.slow_reader(128 << 10, Duration::from_millis(500)),
    );
    let s = net.nodes[0].stack.stats().tcp;
    assert!(s.totals.zero_window_probes > 0, "{:?}", s.totals);
    assert_eq!(s.retransmits, 0, "{:?}", s.totals);
}

#[test]
fn newreno_and_cubic_both_complete_under_loss() {
    for alg in [Algorithm::NewReno, Algorithm::Cubic] {
        let link = LinkConfig {
            loss: 0.02,
            delay: Duration::from_micros(200),
            seed: 17,
            ..LinkConfig::default()
        };
        both_ways(link, bytes() / 16, |c| c.tcp.congestion = alg, 3600);
    }
}

#[test]
fn out_of_order_memory_cap_holds_and_transfer_survives() {
    let link = LinkConfig {
        loss: 0.02,
        reorder: 0.05,
        delay: Duration::from_micros(200),
        seed: 18,
        ..LinkConfig::default()
    };
    let (net, _) = both_ways(link, bytes() / 16, |c| c.tcp.max_ooo_total = 16 << 10, 3600);
    let s = net.nodes[1].stack.stats().tcp;
    assert!(s.ooo_pruned > 0, "the 16 KiB cap must have been hit: {s:?}");
    assert_eq!(s.ooo_bytes, 0);
}

/// A sender that writes the pattern straight into the send ring and a
/// receiver that checks it where it lies in the receive ring (the zero-copy
/// API), under loss and reordering: byte-exact, in pieces around the
/// rings' wrap.
struct ZeroCopy {
    to: Option<SocketAddrV4>,
    listener: Option<ustack::socket::tcp::ListenHandle>,
    h: Option<ustack::socket::tcp::TcpHandle>,
    total: u64,
    moved: u64,
    mismatches: u64,
    pieces: u64,
}

impl App for ZeroCopy {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        use ustack_kit::bulk::{count_mismatches, fill_pattern};
        if self.h.is_none() {
            match self.to {
                Some(to) => self.h = stack.tcp().connect(now, to).ok(),
                None => {
                    let l = *self
                        .listener
                        .get_or_insert_with(|| stack.tcp().listen(9000, 4).unwrap());
                    self.h = stack.tcp().accept(l).unwrap();
                }
            }
        }
        let Some(h) = self.h else {
            return Control::Continue;
        };
        loop {
            let at = self.moved;
            let left = self.total - at;
            let r = if self.to.is_some() {
                stack.tcp().send_with(h, |b| {
                    let n = b.len().min(left as usize);
                    fill_pattern(at, &mut b[..n]);
                    (n, ())
                })
            } else {
                let mut bad = 0;
                let r = stack.tcp().recv_with(h, |b| {
                    bad = count_mismatches(at, b);
                    (b.len(), ())
                });
                self.mismatches += bad;
                r
            };
            match r {
                Ok((0, ())) | Err(_) => break,
                Ok((n, ())) => {
                    self.moved += n as u64;
                    self.pieces += 1;
                }
            }
        }
        Control::Continue
    }
}

#[test]
fn zero_copy_send_and_receive_are_byte_exact_under_loss_and_reordering() {
    let link = LinkConfig {
        loss: 0.01,
        reorder: 0.05,
        reorder_delay: Duration::from_micros(300),
        delay: Duration::from_micros(100),
        seed: 21,
        ..LinkConfig::default()
    };
    let mut net = SimNet::new(link);
    net.add(host_config(1));
    net.add(host_config(2));
    let total = 32 << 20;
    let dst = SocketAddrV4::new(net.nodes[1].stack.ip(), 9000);
    let new = |to| ZeroCopy {
        to,
        listener: None,
        h: None,
        total,
        moved: 0,
        mismatches: 0,
        pieces: 0,
    };
    let (mut tx, mut rx) = (new(Some(dst)), new(None));
    net.run_until(Instant::from_secs(3600), &mut [&mut tx, &mut rx], |_| false);
    assert_eq!(tx.moved, total);
    assert_eq!(rx.moved, total, "every byte arrived");
    assert_eq!(rx.mismatches, 0, "byte-exact");
    // The rings wrapped many times: more pieces than whole-ring writes.
    assert!(tx.pieces > total / (256 << 10) && rx.pieces > total / (256 << 10));
    assert!(
        net.nodes[0].stack.stats().tcp.retransmits > 0,
        "loss was repaired"
    );
    assert_eq!(net.pools_in_use(), 0, "buffers leaked");
}

/// Two hosts whose ports play a NIC with checksum offload (and TSO up to
/// `tso_max`, 0 for none), on a link with loss, reordering and corruption.
fn offloaded_pair(seed: u64, tso_max: usize) -> SimNet {
    let link = LinkConfig {
        loss: 0.01,
        reorder: 0.05,
        corrupt: 0.001,
        delay: Duration::from_micros(100),
        seed,
        ..LinkConfig::default()
    };
    let offloads = ustack::Offloads {
        tx_tcp_checksum: true,
        rx_checksum: true,
        tso_max,
        rx_large: false,
    };
    let mut net = SimNet::new(link);
    for n in [1u8, 2] {
        net.add_offloaded(host_config(n), offloads);
    }
    net
}

#[test]
fn software_gso_with_checksum_offload_is_byte_exact_under_loss_reordering_and_corruption() {
    // A port with checksum offload and no TSO (net_tap without --tso):
    // the stack cuts bursts into frames itself, each frame's checksum left
    // to the port.
    let (net, _) = run_both_ways(offloaded_pair(34, 0), 16 << 20, 600, |r| r);
    for n in &net.nodes {
        let tcp = n.stack.stats().tcp;
        assert!(tcp.gso_segments > 0, "no burst was cut in software");
        assert!(tcp.retransmits > 0, "loss was repaired");
    }
}

#[test]
fn checksum_offload_and_tso_are_byte_exact_under_loss_reordering_and_corruption() {
    // Ports that play a NIC with offloads: the engine leaves the TCP
    // checksum to the port and hands it segments of up to 64 KiB, which the
    // port cuts into frames; received frames come marked checksum-good
    // when they verify (a corrupted one is not marked, and the engine's
    // own check drops it).
    let bytes = 32 << 20;
    let (net, _) = run_both_ways(offloaded_pair(33, 65535), bytes, 600, |r| r);
    for n in &net.nodes {
        let (segs, frames) = (
            n.stack.stats().tcp.segs_out,
            n.port.dev.port_stats().tx_packets,
        );
        // TSO: the port sent several frames per segment the engine built.
        assert!(
            frames > 2 * segs,
            "no TSO: {segs} segments, {frames} frames"
        );
        assert!(n.stack.stats().tcp.retransmits > 0, "loss was repaired");
    }
    let bad: u64 = net
        .nodes
        .iter()
        .map(|n| {
            n.stack
                .stats()
                .drops
                .get(ustack::stats::DropReason::TcpBadChecksum)
        })
        .sum();
    assert!(
        bad > 0,
        "corrupted frames were caught by the engine's own check"
    );
}

/// A connect to an IPv4 address off the stack's subnet with no gateway
/// fails at once with `NoRoute` (Linux's ENETUNREACH) and queues nothing;
/// with a gateway it opens, as does one on the subnet.
#[test]
fn connect_off_subnet_without_a_gateway_has_no_route() {
    use smoltcp::wire::{EthernetAddress, Ipv4Address, Ipv4Cidr};
    use std::net::Ipv4Addr;
    let mac = EthernetAddress([2, 0, 0, 0, 0, 1]);
    let cidr = Ipv4Cidr::new(Ipv4Address::new(10, 9, 0, 2), 24);
    let mut s = Stack::new(Config::with_seed(mac, cidr, 7));
    let far = SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 1), 80);
    let near = SocketAddrV4::new(Ipv4Addr::new(10, 9, 0, 1), 80);
    let t = Instant::from_micros(0);
    assert!(matches!(
        s.tcp().connect(t, far),
        Err(ustack::Error::NoRoute)
    ));
    assert!(matches!(
        s.tcp().connect_from(t, 4000, far),
        Err(ustack::Error::NoRoute)
    ));
    assert_eq!(s.stats().tcp.active_opens, 0);
    s.tcp().connect(t, near).expect("on the subnet");
    let mut cfg = Config::with_seed(mac, cidr, 7);
    cfg.gateway = Some(Ipv4Addr::new(10, 9, 0, 1));
    let mut g = Stack::new(cfg);
    g.tcp().connect(t, far).expect("through the gateway");
}

/// ECN end to end (RFC 3168): a bottleneck (a rate limit and a finite
/// queue) that marks ECN-capable packets Congestion Experienced past a
/// threshold. With ECN asked for and granted, the senders learn of the
/// queue from the marks (ECT(0) on the wire, CE read on receipt, ECE
/// echoed, CWR sent): the transfers finish byte-exact with no queue drop
/// and nothing sent twice. Without ECN the same link tail-drops and the
/// senders retransmit.
#[test]
fn ecn_marks_replace_drops_at_a_marking_bottleneck() {
    use ustack::socket::tcp::Ecn;
    let link = LinkConfig {
        rate_bps: 200_000_000,
        delay: Duration::from_millis(1),
        queue_frames: 120,
        ecn_mark: 40,
        seed: 7,
        ..LinkConfig::default()
    };
    let bytes = 16 << 20;
    for ecn in [Ecn::On, Ecn::Off] {
        let (net, _) = both_ways(link.clone(), bytes, |c| c.tcp.ecn = ecn, 600);
        let wire = net.link.stats();
        let totals: Vec<_> = net.nodes.iter().map(|n| n.stack.stats().tcp).collect();
        let retransmits: u64 = totals.iter().map(|s| s.retransmits).sum();
        let reductions: u64 = totals.iter().map(|s| s.totals.ecn_reductions).sum();
        if ecn == Ecn::On {
            assert!(wire.ce_marked > 0, "{wire:?} {totals:?}");
            assert_eq!(wire.queue_drops, 0, "{wire:?}");
            assert_eq!(retransmits, 0, "{totals:?}");
            assert!(reductions > 0, "{totals:?}");
        } else {
            assert_eq!(wire.ce_marked, 0, "{wire:?}");
            assert!(wire.queue_drops > 0, "{wire:?}");
            assert!(retransmits > 0, "{totals:?}");
            assert_eq!(reductions, 0);
        }
    }
}
