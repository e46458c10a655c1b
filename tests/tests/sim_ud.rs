//! RDMA UD (RoCEv2 by the stack) on the sim link: SENDs with and without
//! immediate data, completions with source and timestamps, UD ping under
//! loss, ICRC / Q_Key / QPN / receive-buffer drops, pools back to baseline.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use ustack::VecTx;
use ustack::sim::{LinkConfig, SimNet, host_config};
use ustack::socket::ud::{
    Completion, DEFAULT_QKEY, GRH_LEN, QpConfig, QpHandle, RESPONDER_QPN, SendWr, TsSource, UdAddr,
    UdTransport, WcOpcode, WcStatus,
};
use ustack::stats::DropReason;
use ustack::wire::roce::{BTH_LEN, DETH_LEN, icrc_fill};
use ustack::{Instant, Stack};
use ustack_kit::ud_ping::{UdBandwidth, UdBandwidthConfig, UdPinger, UdPingerConfig, UdResponder};

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const QKEY: u32 = 0x1234_5678;
const DELAY: Duration = Duration::from_micros(50);

fn two_hosts(cfg: LinkConfig) -> SimNet {
    let mut net = SimNet::new(cfg);
    net.add(host_config(1));
    net.add(host_config(2));
    net
}

fn drain_and_check_pools(net: &mut SimNet) {
    let deadline = net.now + Duration::from_secs(60);
    net.run_until(deadline, &mut [], |n| n.link.in_flight() == 0);
    assert_eq!(net.link.in_flight(), 0);
    assert_eq!(net.pools_in_use(), 0, "buffers leaked");
}

fn qp(s: &mut Stack, qpn: Option<u32>, qkey: u32) -> QpHandle {
    let mut c = QpConfig::new(qkey);
    c.qpn = qpn;
    s.ud().create_qp(&c).unwrap()
}

fn poll_all(s: &mut Stack, q: QpHandle) -> Vec<Completion> {
    let mut out = Vec::new();
    s.ud()
        .poll_cq(q, Instant::ZERO, usize::MAX, &mut out)
        .unwrap();
    out
}

fn send<'a>(dest: UdAddr, data: &'a [u8], imm: Option<u32>, wr_id: u64) -> SendWr<'a> {
    SendWr {
        wr_id,
        dest,
        remote_qkey: QKEY,
        imm,
        solicited: false,
        data,
    }
}

/// Total drops of every UD reason and the invariant every frame is counted once.
fn drop_count(s: &Stack, r: DropReason) -> u64 {
    let st = s.stats();
    assert_eq!(st.eth.rx_frames, st.eth.rx_accepted + st.drops.total());
    st.drops.get(r)
}

#[test]
fn ud_sends_with_and_without_immediate_complete_with_source_and_timestamps() {
    let mut net = two_hosts(LinkConfig {
        delay: DELAY,
        ..LinkConfig::default()
    });
    let qa = qp(&mut net.nodes[0].stack, None, QKEY);
    let qb = qp(&mut net.nodes[1].stack, Some(77), QKEY);
    let qpn_a = net.nodes[0].stack.ud().qp_num(qa).unwrap();
    assert_eq!(net.nodes[1].stack.ud().qp_num(qb).unwrap(), 77);
    for i in 0..4 {
        net.nodes[1]
            .stack
            .ud()
            .post_recv(qb, 100 + i, vec![0xee; GRH_LEN + 1024])
            .unwrap();
    }
    let to_b = UdAddr {
        ip: B.into(),
        qpn: 77,
    };
    let small: Vec<u8> = (0..13).collect();
    let big: Vec<u8> = (0..1024u32).map(|i| (i * 31) as u8).collect();
    let a = &mut net.nodes[0].stack;
    a.ud().post_send(qa, &send(to_b, &small, None, 1)).unwrap();
    a.ud()
        .post_send(qa, &send(to_b, &big, Some(0xdead_beef), 2))
        .unwrap();

    let mut got_b = Vec::new();
    let mut got_a = Vec::new();
    let ok = net.run_until(Instant::from_secs(5), &mut [], |n| {
        got_a.extend(poll_all(&mut n.nodes[0].stack, qa));
        got_b.extend(poll_all(&mut n.nodes[1].stack, qb));
        got_a.len() == 2 && got_b.len() == 2
    });
    assert!(ok, "completions: a {got_a:?} b {got_b:?}");

    // Send completions, in order, stamped when they left.
    assert_eq!(
        got_a
            .iter()
            .map(|c| (c.wr_id, c.opcode, c.status, c.byte_len))
            .collect::<Vec<_>>(),
        vec![
            (1, WcOpcode::Send, WcStatus::Success, 13),
            (2, WcOpcode::Send, WcStatus::Success, 1024)
        ]
    );
    // Receives: source address and QPN, immediate data, payload after the
    // 40-byte GRH space which holds the IPv4 header in bytes 20..40.
    for (c, (data, imm, wr_id)) in got_b
        .iter()
        .zip([(&small, None, 100), (&big, Some(0xdead_beef), 101)])
    {
        assert_eq!(c.opcode, WcOpcode::Recv);
        assert_eq!(c.status, WcStatus::Success);
        assert_eq!(c.wr_id, wr_id);
        assert_eq!(
            c.src,
            Some(UdAddr {
                ip: A.into(),
                qpn: qpn_a
            })
        );
        assert_eq!(c.imm, imm);
        assert_eq!(c.byte_len, GRH_LEN + data.len());
        assert_eq!(c.payload(), &data[..]);
        let buf = c.buf.as_ref().unwrap();
        assert_eq!(&buf[..20], &[0u8; 20]);
        assert_eq!(buf[20], 0x45);
        assert_eq!(&buf[32..36], &A.octets());
        assert_eq!(&buf[36..40], &B.octets());
        assert_eq!(c.ts_source, TsSource::Poll);
    }
    // Timestamps: both sends waited for ARP; a send held for ARP keeps the
    // time it was queued, so the gap includes resolution.
    for (tx, rx) in got_a.iter().zip(&got_b) {
        assert_eq!(tx.timestamp, Instant::ZERO);
        assert!(rx.timestamp.saturating_duration_since(tx.timestamp) > DELAY);
    }
    // Resolved now: the receive is exactly one link delay after the send.
    let sent_at = net.now;
    net.nodes[0]
        .stack
        .ud()
        .post_send(qa, &send(to_b, &small, Some(5), 3))
        .unwrap();
    got_a.clear();
    got_b.clear();
    assert!(net.run_until(Instant::from_secs(5), &mut [], |n| {
        got_a.extend(poll_all(&mut n.nodes[0].stack, qa));
        got_b.extend(poll_all(&mut n.nodes[1].stack, qb));
        got_a.len() == 1 && got_b.len() == 1
    }));
    assert!(got_a[0].timestamp >= sent_at);
    assert_eq!(
        got_b[0]
            .timestamp
            .saturating_duration_since(got_a[0].timestamp),
        DELAY
    );
    assert_eq!((got_b[0].imm, got_b[0].payload()), (Some(5), &small[..]));
    let (sa, sb) = (net.nodes[0].stack.stats(), net.nodes[1].stack.stats());
    assert_eq!((sa.ud.tx_packets, sa.ud.tx_bytes), (3, 13 + 1024 + 13));
    assert_eq!((sb.ud.rx_packets, sb.ud.rx_bytes), (3, 13 + 1024 + 13));
    assert_eq!((sa.ud.qps, sb.ud.qps), (1, 1));
    drain_and_check_pools(&mut net);
}

fn pinger(count: u64, qpn: u32) -> UdPinger {
    let mut cfg = UdPingerConfig::new(UdAddr { ip: B.into(), qpn });
    cfg.count = Some(count);
    cfg.interval = Duration::from_millis(1);
    cfg.timeout = Duration::from_millis(100);
    UdPinger::new(cfg)
}

#[test]
fn ud_ping_clean_link_rtt_is_two_delays() {
    let mut net = two_hosts(LinkConfig {
        delay: DELAY,
        ..LinkConfig::default()
    });
    let mut p = pinger(200, RESPONDER_QPN);
    let mut r = UdResponder::default();
    net.run_until(Instant::from_secs(30), &mut [&mut p, &mut r], |_| false);
    assert!(p.finished(net.now));
    let s = p.summary();
    assert_eq!((s.transmitted, s.received, s.errors), (200, 200, 0));
    assert_eq!(r.stats().pings, 200);
    // Timestamps on the virtual clock: exactly one delay each way, except
    // the first ping, which also waited for ARP (as with Linux ping).
    assert_eq!(s.rtt.min, 2 * DELAY);
    assert!(s.rtt.max > 2 * DELAY);
    assert_eq!(s.percentile(0.5), Some(2 * DELAY));
    assert_eq!(s.percentile(0.99), Some(2 * DELAY));
    let events: Vec<_> = p.drain_events().collect();
    assert_eq!(events.len(), 200);
    assert_eq!(
        events[0].from,
        UdAddr {
            ip: B.into(),
            qpn: RESPONDER_QPN
        }
    );
    drain_and_check_pools(&mut net);
}

/// The UD pinger and responder over IPv6 GIDs: the responder answers
/// the IPv6 sender, every ping comes back, neighbor discovery costs the
/// first one as ARP does over IPv4.
#[test]
fn ud_ping_over_ipv6_gids() {
    let a6: Ipv6Addr = "fd77::1".parse().unwrap();
    let b6: Ipv6Addr = "fd77::2".parse().unwrap();
    let mut net = SimNet::new(LinkConfig {
        delay: DELAY,
        ..LinkConfig::default()
    });
    for (n, me) in [(1, a6), (2, b6)] {
        let mut c = host_config(n);
        c.ipv6 = vec![ustack::wire::Ipv6Cidr::new(me, 64)];
        net.add(c);
    }
    let mut cfg = UdPingerConfig::new(UdAddr {
        ip: b6.into(),
        qpn: RESPONDER_QPN,
    });
    cfg.count = Some(100);
    cfg.interval = Duration::from_millis(1);
    cfg.timeout = Duration::from_millis(100);
    let mut p = UdPinger::new(cfg);
    let mut r = UdResponder::default();
    net.run_until(Instant::from_secs(30), &mut [&mut p, &mut r], |_| false);
    assert!(p.finished(net.now));
    let s = p.summary();
    assert_eq!((s.transmitted, s.received, s.errors), (100, 100, 0));
    assert_eq!(r.stats().pings, 100);
    assert_eq!(s.rtt.min, 2 * DELAY);
    let events: Vec<_> = p.drain_events().collect();
    assert_eq!(events[0].from.ip, std::net::IpAddr::from(b6));
    let (sa, sb) = (net.nodes[0].stack.stats(), net.nodes[1].stack.stats());
    assert_eq!((sa.ud.tx_packets, sb.ud.rx_packets), (100, 100));
    assert_eq!((sa.ipv4.tx_packets, sb.ipv4.tx_packets), (0, 0));
    drain_and_check_pools(&mut net);
}

#[test]
fn ud_ping_loss_is_counted_exactly() {
    let mut net = two_hosts(LinkConfig {
        loss: 0.2,
        delay: DELAY,
        seed: 7,
        ..LinkConfig::default()
    });
    let mut p = pinger(1000, RESPONDER_QPN);
    let mut r = UdResponder::default();
    net.run_until(Instant::from_secs(60), &mut [&mut p, &mut r], |_| false);
    assert!(p.finished(net.now));
    let s = p.summary().clone();
    let (sa, sb) = (net.nodes[0].stack.stats(), net.nodes[1].stack.stats());
    assert_eq!(s.transmitted, 1000);
    assert_eq!(sa.ud.tx_packets, 1000);
    // Every ping lost is a ping or a pong the link dropped.
    let pings_lost = sa.ud.tx_packets - sb.ud.rx_packets;
    let pongs_lost = sb.ud.tx_packets - sa.ud.rx_packets;
    assert_eq!(r.stats().pongs, sb.ud.tx_packets);
    assert_eq!(s.received, sa.ud.rx_packets);
    assert_eq!(s.lost(), pings_lost + pongs_lost);
    // About 1 - 0.8^2 = 36% lost.
    assert!(
        (25.0..47.0).contains(&s.loss_percent()),
        "{}",
        s.loss_percent()
    );
    assert!(s.percentile(0.99).is_some());
    drain_and_check_pools(&mut net);
}

#[test]
fn ud_bandwidth_sweep_delivers_everything_on_a_clean_link() {
    let mut net = two_hosts(LinkConfig::default());
    let max = net.nodes[0].stack.ud_max_msg();
    // The InfiniBand path MTU of a 1500-byte link, as rxe computes it.
    assert_eq!(max, 1024);
    let mut cfg = UdBandwidthConfig::new(
        UdAddr {
            ip: B.into(),
            qpn: RESPONDER_QPN,
        },
        max,
    );
    cfg.iterations = 500;
    cfg.tx_depth = 64;
    let mut bw = UdBandwidth::new(cfg);
    let mut r = UdResponder::default();
    net.run_until(Instant::from_secs(30), &mut [&mut bw, &mut r], |_| false);
    assert!(bw.done() && bw.error().is_none());
    let rows = bw.take_results();
    assert_eq!(
        rows.iter().map(|r| r.bytes).collect::<Vec<_>>(),
        vec![64, 128, 256, 512, 1024]
    );
    for row in &rows {
        assert_eq!(row.iterations, 500);
        assert_eq!(row.delivered, Some(500), "{row:?}");
    }
    assert_eq!(r.stats().sink_msgs, 500 * rows.len() as u64);
    drain_and_check_pools(&mut net);
}

/// Capture the frame `a` emits for one send (ARP already resolved).
fn frame_for(net: &mut SimNet, qa: QpHandle, wr: &SendWr<'_>) -> Vec<u8> {
    let now = net.now;
    let a = &mut net.nodes[0].stack;
    a.ud().post_send(qa, wr).unwrap();
    let mut tx = VecTx::new();
    a.poll(now, &mut tx);
    poll_all(a, qa);
    assert_eq!(tx.frames.len(), 1);
    tx.frames.pop().unwrap()
}

fn feed_b(net: &mut SimNet, frame: &[u8]) {
    let now = net.now;
    net.nodes[1]
        .stack
        .receive(now, frame, ustack::RxMeta::default(), &mut VecTx::new());
}

#[test]
fn bad_icrc_qkey_qpn_opcode_and_missing_buffers_are_counted() {
    let mut net = two_hosts(LinkConfig::default());
    let qa = qp(&mut net.nodes[0].stack, None, QKEY);
    let qb = qp(&mut net.nodes[1].stack, Some(9), QKEY);
    // Resolve ARP both ways with one good exchange.
    net.nodes[1]
        .stack
        .ud()
        .post_recv(qb, 1, vec![0; GRH_LEN + 64])
        .unwrap();
    let to_b = UdAddr {
        ip: B.into(),
        qpn: 9,
    };
    net.nodes[0]
        .stack
        .ud()
        .post_send(qa, &send(to_b, b"hello", None, 1))
        .unwrap();
    assert!(net.run_until(Instant::from_secs(5), &mut [], |n| {
        n.nodes[1].stack.stats().ud.rx_packets == 1
    }));
    poll_all(&mut net.nodes[1].stack, qb);
    let data = [0x5au8; 32];
    let good = frame_for(&mut net, qa, &send(to_b, &data, None, 2));
    let payload_at = 14 + 20 + 8 + BTH_LEN + DETH_LEN;
    let b = |net: &SimNet, r| drop_count(&net.nodes[1].stack, r);

    // No receive buffer posted.
    feed_b(&mut net, &good);
    assert_eq!(b(&net, DropReason::UdNoRecvBuffer), 1);

    // One flipped bit in the payload: the ICRC rejects it, nothing delivered.
    net.nodes[1]
        .stack
        .ud()
        .post_recv(qb, 2, vec![0; GRH_LEN + 64])
        .unwrap();
    let mut flipped = good.clone();
    flipped[payload_at + 3] ^= 0x10;
    feed_b(&mut net, &flipped);
    assert_eq!(b(&net, DropReason::UdBadIcrc), 1);
    assert!(poll_all(&mut net.nodes[1].stack, qb).is_empty());

    // A bad opcode with a valid ICRC.
    let mut rc = good.clone();
    rc[14 + 28] = 0x04;
    assert!(icrc_fill(&mut rc[14..]));
    feed_b(&mut net, &rc);
    assert_eq!(b(&net, DropReason::UdBadOpcode), 1);

    // Q_Key mismatch and unknown QPN.
    let mut wrong = send(to_b, &data, None, 3);
    wrong.remote_qkey = DEFAULT_QKEY;
    let f = frame_for(&mut net, qa, &wrong);
    feed_b(&mut net, &f);
    assert_eq!(b(&net, DropReason::UdBadQkey), 1);
    let f = frame_for(
        &mut net,
        qa,
        &send(
            UdAddr {
                ip: B.into(),
                qpn: 10,
            },
            &data,
            None,
            4,
        ),
    );
    feed_b(&mut net, &f);
    assert_eq!(b(&net, DropReason::UdUnknownQpn), 1);

    // Truncated after the UDP header.
    let mut short = good[..14 + 28 + 10].to_vec();
    short[14 + 2..14 + 4].copy_from_slice(&38u16.to_be_bytes());
    short[14 + 24..14 + 26].copy_from_slice(&18u16.to_be_bytes());
    short[14 + 10..14 + 12].fill(0);
    let csum = {
        let h = &short[14..34];
        let mut sum = 0u32;
        for w in h.chunks(2) {
            sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    };
    short[14 + 10..14 + 12].copy_from_slice(&csum.to_be_bytes());
    feed_b(&mut net, &short);
    assert_eq!(b(&net, DropReason::UdMalformed), 1);

    // The good frame is still accepted with the posted buffer; a buffer too
    // small for the next one completes in error, as verbs does.
    feed_b(&mut net, &good);
    let c = poll_all(&mut net.nodes[1].stack, qb);
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].wr_id, c[0].payload()), (2, &data[..]));
    net.nodes[1]
        .stack
        .ud()
        .post_recv(qb, 3, vec![0; GRH_LEN + 8])
        .unwrap();
    feed_b(&mut net, &good);
    assert_eq!(b(&net, DropReason::UdRecvTooSmall), 1);
    let c = poll_all(&mut net.nodes[1].stack, qb);
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].byte_len),
        (3, WcStatus::LocalLengthError, GRH_LEN + 32)
    );
    assert_eq!(net.nodes[1].stack.stats().ud.rx_packets, 2);
    // PSNs counted up per packet sent.
    net.nodes[0].stack.ud().destroy_qp(qa).unwrap();
    assert_eq!(net.nodes[0].stack.stats().ud.qps, 0);
    drain_and_check_pools(&mut net);
}

/// A pinger that counts the turns in which it sent something.
struct SendTurns {
    p: UdPinger,
    turns: u64,
}

impl ustack::node::App for SendTurns {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> ustack::node::Control {
        let before = self.p.summary().transmitted;
        let c = self.p.poll(now, stack);
        if self.p.summary().transmitted > before {
            self.turns += 1;
        }
        c
    }
    fn poll_at(&self) -> Option<Instant> {
        self.p.next_wakeup()
    }
}

/// 10,000 pings/s with a 1 ms batch: every ping sent and answered, in
/// about one sending turn per millisecond instead of one per ping.
#[test]
fn a_batching_pinger_keeps_its_rate_in_fewer_wakeups() {
    for (batch, max_turns, min_turns) in [
        (Duration::from_millis(1), 110, 90),
        (Duration::ZERO, 1000, 1000),
    ] {
        let mut net = two_hosts(LinkConfig {
            delay: DELAY,
            ..LinkConfig::default()
        });
        let mut cfg = UdPingerConfig::new(UdAddr {
            ip: B.into(),
            qpn: RESPONDER_QPN,
        });
        cfg.count = Some(1000);
        cfg.interval = Duration::from_micros(100);
        cfg.timeout = Duration::from_millis(100);
        cfg.batch = batch;
        let mut p = SendTurns {
            p: UdPinger::new(cfg),
            turns: 0,
        };
        let mut r = UdResponder::default();
        net.run_until(Instant::from_secs(30), &mut [&mut p, &mut r], |_| false);
        let s = p.p.summary();
        assert_eq!((s.transmitted, s.received), (1000, 1000), "batch {batch:?}");
        assert!(
            (min_turns..=max_turns).contains(&p.turns),
            "batch {batch:?}: {} sending turns",
            p.turns
        );
        // The rate held: the last ping left about 100 ms after the first.
        let span = p.p.last_sent().unwrap() - p.p.started().unwrap();
        assert!(
            span >= Duration::from_millis(98) && span <= Duration::from_millis(101),
            "batch {batch:?}: {span:?}"
        );
        drain_and_check_pools(&mut net);
    }
}

/// A port that stamps arrivals (libpcap's kernel stamps; here the sim
/// link's delivery time) dates UD receive completions and ICMP echo replies
/// by when the frame arrived, not by the later poll that read it; without
/// stamps they carry the poll's time.
#[test]
fn port_receive_stamps_date_ud_receives_and_echo_replies() {
    for stamped in [true, false] {
        let mut net = two_hosts(LinkConfig {
            delay: DELAY,
            ..LinkConfig::default()
        });
        for n in &mut net.nodes {
            n.dev_mut().set_rx_timestamps(stamped);
        }
        assert_eq!(
            ustack::phy::device::Device::caps(net.nodes[0].dev()).rx_timestamps,
            stamped
        );
        let qa = qp(&mut net.nodes[0].stack, None, QKEY);
        let qb = qp(&mut net.nodes[1].stack, Some(77), QKEY);
        for i in 0..2 {
            net.nodes[1]
                .stack
                .ud()
                .post_recv(qb, i, vec![0; GRH_LEN + 64])
                .unwrap();
        }
        let to_b = UdAddr {
            ip: B.into(),
            qpn: 77,
        };
        // The first SEND resolves B's address.
        net.nodes[0]
            .stack
            .ud()
            .post_send(qa, &send(to_b, b"arp", None, 1))
            .unwrap();
        let mut got = Vec::new();
        assert!(net.run_until(Instant::from_secs(5), &mut [], |n| {
            got.extend(poll_all(&mut n.nodes[1].stack, qb));
            !got.is_empty()
        }));
        // Now by hand: A sends at t0; B first polls 5 ms later.
        let t0 = net.now + Duration::from_millis(1);
        net.nodes[0]
            .stack
            .ud()
            .post_send(qa, &send(to_b, b"late", None, 2))
            .unwrap();
        net.nodes[0].step(t0, &mut ());
        let late = t0 + Duration::from_millis(5);
        net.nodes[1].step(late, &mut ());
        let mut cqes = Vec::new();
        net.nodes[1]
            .stack
            .ud()
            .poll_cq(qb, late, 8, &mut cqes)
            .unwrap();
        assert_eq!(cqes.len(), 1, "{cqes:?}");
        assert_eq!(cqes[0].payload(), b"late");
        let arrived = cqes[0].timestamp;
        if stamped {
            assert!(
                arrived >= t0 + DELAY && arrived < t0 + Duration::from_millis(1),
                "stamped at {arrived}, sent at {t0}"
            );
        } else {
            assert_eq!(arrived, late);
        }

        // ICMP: A pings B at t1, B answers at t1 + 1 ms, A reads at t1 + 4 ms.
        let h = net.nodes[0].stack.ping().open(0x77).unwrap();
        let t1 = late + Duration::from_millis(1);
        net.nodes[0].stack.ping().send(h, B, 1, 16).unwrap();
        net.nodes[0].step(t1, &mut ());
        net.nodes[1].step(t1 + Duration::from_millis(1), &mut ());
        net.nodes[0].step(t1 + Duration::from_millis(4), &mut ());
        let Some(ustack::iface::icmp::PingEvent::Reply(r)) =
            net.nodes[0].stack.ping().recv(h).unwrap()
        else {
            panic!("no echo reply");
        };
        let rtt = r.rtt().expect("the request carried its send time");
        if stamped {
            let answered = t1 + Duration::from_millis(1);
            assert!(
                r.received_at >= answered + DELAY && r.received_at < answered + DELAY * 4,
                "reply stamped at {}, answered at {answered}",
                r.received_at
            );
            assert!(rtt < Duration::from_millis(2), "rtt {rtt:?}");
        } else {
            assert_eq!(r.received_at, t1 + Duration::from_millis(4));
            assert_eq!(rtt, Duration::from_millis(4));
        }
        drain_and_check_pools(&mut net);
    }
}

/// The traffic class of a QP (`QpConfig::traffic_class`, verbs' GRH
/// traffic class) is on the wire: the IPv4 TOS byte or the IPv6 traffic
/// class; the ICRC masks it, so the peer takes the datagram.
#[test]
fn a_qps_traffic_class_is_on_the_wire_in_both_families() {
    // DSCP 26 (AF31) and ECT(0): 26 << 2 | 2.
    const TCLASS: u8 = 0x6a;
    let a6: Ipv6Addr = "fd77::1".parse().unwrap();
    let b6: Ipv6Addr = "fd77::2".parse().unwrap();
    let mut net = SimNet::new(LinkConfig::default());
    for (n, me) in [(1, a6), (2, b6)] {
        let mut c = host_config(n);
        c.ipv6 = vec![ustack::wire::Ipv6Cidr::new(me, 64)];
        net.add(c);
    }
    let mut c = QpConfig::new(QKEY);
    c.traffic_class = TCLASS;
    let qa = net.nodes[0].stack.ud().create_qp(&c).unwrap();
    let qb = qp(&mut net.nodes[1].stack, Some(9), QKEY);
    for (i, dst) in [std::net::IpAddr::from(B), b6.into()]
        .into_iter()
        .enumerate()
    {
        let to_b = UdAddr { ip: dst, qpn: 9 };
        let wr_id = 10 * i as u64;
        // Neighbour resolution with one datagram through the link.
        for id in [wr_id + 1, wr_id + 2] {
            net.nodes[1]
                .stack
                .ud()
                .post_recv(qb, id, vec![0; GRH_LEN + 64])
                .unwrap();
        }
        let before = net.nodes[1].stack.stats().ud.rx_packets;
        net.nodes[0]
            .stack
            .ud()
            .post_send(qa, &send(to_b, b"hello", None, wr_id + 1))
            .unwrap();
        assert!(
            net.run_until(Instant::from_secs(5 + 5 * i as u64), &mut [], |n| {
                n.nodes[1].stack.stats().ud.rx_packets == before + 1
            })
        );
        let frame = frame_for(&mut net, qa, &send(to_b, b"marked", None, wr_id + 2));
        let tclass = match dst {
            std::net::IpAddr::V4(_) => {
                assert_eq!(u16::from_be_bytes([frame[12], frame[13]]), 0x0800);
                frame[15]
            }
            std::net::IpAddr::V6(_) => {
                assert_eq!(u16::from_be_bytes([frame[12], frame[13]]), 0x86dd);
                ((frame[14] & 0x0f) << 4) | (frame[15] >> 4)
            }
        };
        assert_eq!(tclass, TCLASS, "{dst}: traffic class on the wire");
        feed_b(&mut net, &frame);
        assert_eq!(
            net.nodes[1].stack.stats().ud.rx_packets,
            before + 2,
            "{dst}: the marked datagram is taken (the ICRC masks the class)"
        );
        let got = poll_all(&mut net.nodes[1].stack, qb);
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|c| c.status == WcStatus::Success));
        // The GRH of the receive carries the class too.
        let grh = got[1].buf.as_ref().unwrap();
        let seen = match dst {
            std::net::IpAddr::V4(_) => grh[GRH_LEN - 20 + 1],
            std::net::IpAddr::V6(_) => ((grh[0] & 0x0f) << 4) | (grh[1] >> 4),
        };
        assert_eq!(seen, TCLASS, "{dst}: the receive's GRH");
    }
    drain_and_check_pools(&mut net);
}
