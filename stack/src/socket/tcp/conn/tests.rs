use super::super::cc::Algorithm;
use super::timers::Timer;
use super::*;
use core::net::{IpAddr, Ipv4Addr};

const A: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 40000);
const B: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), 80);

/// A segment in flight, owning its payload.
#[derive(Debug, Clone)]
struct Wire {
    out: Outgoing,
    payload: Vec<u8>,
}

impl Wire {
    fn seg(&self) -> Segment<'_> {
        Segment {
            hdr: self.out.hdr,
            payload: &self.payload,
            ecn: if self.out.ect { 2 } else { 0 },
        }
    }
}

fn drain(c: &mut TcpConn, now: Instant) -> Vec<Wire> {
    let mut v = Vec::new();
    while let Some(out) = c.poll_transmit(now) {
        let mut payload = vec![0; out.payload_len];
        c.copy_payload(&out, 0, &mut payload);
        v.push(Wire { out, payload });
        assert!(v.len() < 10_000, "runaway transmit");
    }
    v
}

fn cfg() -> TcpConfig {
    TcpConfig {
        delayed_ack: None,
        ..TcpConfig::default()
    }
}

/// Client and server with the handshake done.
fn established(ccfg: TcpConfig, scfg: TcpConfig) -> (TcpConn, TcpConn, Instant) {
    let t = Instant::from_millis(1);
    let mut c = TcpConn::connect(ccfg, A, B, Seq(1000));
    let syn = drain(&mut c, t);
    assert_eq!(syn.len(), 1);
    assert!(syn[0].out.hdr.syn && syn[0].out.hdr.ack.is_none());
    let mut s = TcpConn::accept(scfg, B, A, Seq(5000), &syn[0].seg());
    let synack = drain(&mut s, t);
    assert!(synack[0].out.hdr.syn && synack[0].out.hdr.ack == Some(Seq(1001)));
    c.on_segment(t, &synack[0].seg());
    assert_eq!(c.state(), State::Established);
    for w in drain(&mut c, t) {
        s.on_segment(t, &w.seg());
    }
    assert_eq!(s.state(), State::Established);
    (c, s, t)
}

/// Exchange segments until quiet; `keep` decides which segments survive.
fn run(
    c: &mut TcpConn,
    s: &mut TcpConn,
    now: &mut Instant,
    step: Duration,
    mut keep: impl FnMut(bool, &Wire) -> bool,
) {
    let limit = *now + Duration::from_secs(120);
    for _ in 0..100_000 {
        if *now > limit {
            return;
        }
        let from_c = drain(c, *now);
        let from_s = drain(s, *now);
        if from_c.is_empty() && from_s.is_empty() {
            let next = [c.poll_at(), s.poll_at()].into_iter().flatten().min();
            match next {
                Some(t) if t > *now && t < *now + Duration::from_secs(300) => *now = t,
                _ => return,
            }
            continue;
        }
        for w in from_c {
            if keep(true, &w) {
                s.on_segment(*now, &w.seg());
            }
        }
        for w in from_s {
            if keep(false, &w) {
                c.on_segment(*now, &w.seg());
            }
        }
        *now += step;
    }
    panic!("no quiescence");
}

/// Send `msg` from `c` to `s` for `rounds` rounds of exchanges until
/// quiet (the receiver reading all each time), growing the window;
/// returns how much of `msg` was queued.
fn grow_window(
    c: &mut TcpConn,
    s: &mut TcpConn,
    now: &mut Instant,
    msg: &[u8],
    rounds: usize,
) -> usize {
    let mut sent = c.send(msg);
    for _ in 0..rounds {
        run(c, s, now, Duration::from_micros(100), |_, _| true);
        read_all(s);
        sent += c.send(&msg[sent..]);
    }
    sent
}

/// Exchange until quiet (nothing lost any more), 1 ms a step; the bytes
/// the receiver then reads.
fn finish(c: &mut TcpConn, s: &mut TcpConn, now: &mut Instant) -> usize {
    run(c, s, now, Duration::from_millis(1), |_, _| true);
    read_all(s).len()
}

fn read_all(c: &mut TcpConn) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = c.recv(&mut buf);
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn handshake_negotiates_options() {
    let (c, s, _) = established(cfg(), cfg());
    assert!(c.opts.ts_enabled && s.opts.ts_enabled);
    assert!(c.opts.sack_enabled && s.opts.sack_enabled);
    assert_eq!(c.mss(), 1460);
    // Buffers that may autotune up to 4 MiB need a shift of 7 to fit 16 bits.
    assert_eq!(c.rcv.wscale, 7);
    assert_eq!(s.snd.wscale, 7);
}

#[test]
fn segments_leave_room_for_options() {
    let (mut c, _s, now) = established(cfg(), cfg());
    c.send(&[0u8; 100_000]);
    let out = drain(&mut c, now);
    assert!(!out.is_empty());
    // 1460 MSS minus 12 bytes of timestamp option.
    assert!(
        out.iter().all(|w| w.out.payload_len <= 1448),
        "{:?}",
        out.iter().map(|w| w.out.payload_len).max()
    );
    assert_eq!(out[0].out.payload_len, 1448);
}

#[test]
fn options_off_when_peer_lacks_them() {
    let plain = TcpConfig {
        window_scaling: false,
        timestamps: false,
        sack: false,
        mss: 536,
        ..cfg()
    };
    let (c, s, _) = established(cfg(), plain);
    assert!(!c.opts.ts_enabled && !c.opts.sack_enabled);
    assert_eq!((c.rcv.wscale, c.snd.wscale), (0, 0));
    assert_eq!(c.mss(), 536);
    assert_eq!(s.mss(), 536);
}

#[test]
fn data_both_ways_and_graceful_close_to_time_wait() {
    let (mut c, mut s, mut now) = established(cfg(), cfg());
    let msg: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
    assert_eq!(c.send(&msg), msg.len());
    assert_eq!(s.send(b"hello"), 5);
    let mut got = Vec::new();
    let mut got_c = Vec::new();
    for _ in 0..50 {
        run(
            &mut c,
            &mut s,
            &mut now,
            Duration::from_micros(10),
            |_, _| true,
        );
        got.extend(read_all(&mut s));
        got_c.extend(read_all(&mut c));
    }
    assert_eq!(got, msg);
    assert_eq!(got_c, b"hello");
    c.close();
    assert_eq!(c.state(), State::FinWait1);
    run(
        &mut c,
        &mut s,
        &mut now,
        Duration::from_micros(10),
        |_, _| true,
    );
    assert_eq!(s.state(), State::CloseWait);
    assert_eq!(c.state(), State::FinWait2);
    assert!(s.recv_finished());
    s.close();
    let t0 = now;
    run(
        &mut c,
        &mut s,
        &mut now,
        Duration::from_micros(10),
        |_, _| true,
    );
    assert_eq!(s.state(), State::Closed);
    // TIME_WAIT lasts 2 MSL, then the connection is gone.
    assert_eq!(c.state(), State::Closed);
    assert!(now >= t0 + Duration::from_secs(60));
    assert_eq!(c.stats().retransmits, 0, "{:?}", c.stats());
}

#[test]
fn reset_in_time_wait_is_ignored_and_the_app_sees_end_of_stream() {
    let (mut c, mut s, mut now) = established(cfg(), cfg());
    c.close();
    for w in drain(&mut c, now) {
        s.on_segment(now, &w.seg());
    }
    s.close();
    let fin = drain(&mut s, now);
    for w in &fin {
        c.on_segment(now, &w.seg());
    }
    assert_eq!(c.state(), State::TimeWait);
    drain(&mut c, now);
    // A reset at exactly the right sequence number (a peer that forgot
    // the connection answering a duplicate): RFC 1337 ignores it.
    let rst = Segment::from(Header {
        seq: c.rcv.nxt,
        rst: true,
        ..Header::default()
    });
    now += Duration::from_millis(1);
    c.on_segment(now, &rst);
    assert_eq!(c.state(), State::TimeWait);
    assert_eq!(c.error(), None);
    assert!(c.recv_finished());
}

#[test]
fn simultaneous_open() {
    let t = Instant::from_millis(1);
    let mut a = TcpConn::connect(cfg(), A, B, Seq(100));
    let mut b = TcpConn::connect(cfg(), B, A, Seq(900));
    let sa = drain(&mut a, t);
    let sb = drain(&mut b, t);
    a.on_segment(t, &sb[0].seg());
    b.on_segment(t, &sa[0].seg());
    assert_eq!(
        (a.state(), b.state()),
        (State::SynReceived, State::SynReceived)
    );
    let mut now = t;
    run(
        &mut a,
        &mut b,
        &mut now,
        Duration::from_micros(10),
        |_, _| true,
    );
    assert_eq!(
        (a.state(), b.state()),
        (State::Established, State::Established)
    );
}

#[test]
fn simultaneous_close() {
    let (mut c, mut s, mut now) = established(cfg(), cfg());
    c.close();
    s.close();
    let fc = drain(&mut c, now);
    let fs = drain(&mut s, now);
    for w in &fs {
        c.on_segment(now, &w.seg());
    }
    for w in &fc {
        s.on_segment(now, &w.seg());
    }
    assert_eq!((c.state(), s.state()), (State::Closing, State::Closing));
    run(
        &mut c,
        &mut s,
        &mut now,
        Duration::from_micros(10),
        |_, _| true,
    );
    assert_eq!((c.state(), s.state()), (State::Closed, State::Closed));
}

#[test]
fn rst_in_window_gets_challenge_ack_exact_rst_resets() {
    let (mut c, _s, now) = established(cfg(), cfg());
    let rcv_nxt = c.rcv.nxt;
    let rst = |seq| Wire {
        out: Outgoing::from(Header {
            seq,
            rst: true,
            ..Header::default()
        }),
        payload: vec![],
    };
    c.on_segment(now, &rst(rcv_nxt + 100).seg());
    assert_eq!(c.state(), State::Established);
    assert_eq!(c.stats().challenge_acks, 1);
    let ack = drain(&mut c, now);
    assert_eq!(ack.len(), 1);
    assert_eq!(ack[0].out.hdr.ack, Some(rcv_nxt));
    // Out of window: silently ignored.
    c.on_segment(now, &rst(rcv_nxt + 10_000_000).seg());
    assert_eq!(c.stats().challenge_acks, 1);
    c.on_segment(now, &rst(rcv_nxt).seg());
    assert_eq!(c.state(), State::Closed);
    assert_eq!(c.error(), Some(ConnError::Reset));
}

#[test]
fn syn_in_established_gets_challenge_ack() {
    let (mut c, _s, now) = established(cfg(), cfg());
    let syn = Wire {
        out: Outgoing::from(Header {
            seq: c.rcv.nxt + 5,
            syn: true,
            ..Header::default()
        }),
        payload: vec![],
    };
    c.on_segment(now, &syn.seg());
    assert_eq!(c.state(), State::Established);
    assert_eq!(c.stats().challenge_acks, 1);
}

#[test]
fn close_before_established_still_delivers_data() {
    let t = Instant::from_millis(1);
    let mut c = TcpConn::connect(cfg(), A, B, Seq(1000));
    let syn = drain(&mut c, t);
    c.send(b"queued before the handshake");
    c.close();
    assert_eq!(c.state(), State::SynSent);
    let mut s = TcpConn::accept(cfg(), B, A, Seq(5000), &syn[0].seg());
    let mut now = t;
    run(
        &mut c,
        &mut s,
        &mut now,
        Duration::from_micros(10),
        |_, _| true,
    );
    assert_eq!(read_all(&mut s), b"queued before the handshake");
    assert!(s.recv_finished());
    assert_eq!(c.state(), State::FinWait2);
}

#[test]
fn refused_connection() {
    let t = Instant::from_millis(1);
    let mut c = TcpConn::connect(cfg(), A, B, Seq(1000));
    let syn = drain(&mut c, t);
    let rst = Wire {
        out: Outgoing::from(Header {
            seq: Seq(0),
            ack: Some(syn[0].out.hdr.seq + 1),
            rst: true,
            ..Header::default()
        }),
        payload: vec![],
    };
    c.on_segment(t, &rst.seg());
    assert_eq!(c.error(), Some(ConnError::Refused));
    assert!(c.is_finished());
}

#[test]
fn syn_retries_then_times_out() {
    let mut c = TcpConn::connect(cfg(), A, B, Seq(1000));
    let mut now = Instant::from_millis(1);
    let mut syns = 0;
    for _ in 0..100 {
        syns += drain(&mut c, now).len();
        match c.poll_at() {
            Some(t) => now = t.max(now),
            None => break,
        }
    }
    assert_eq!(c.error(), Some(ConnError::TimedOut));
    assert_eq!(syns as u32, 1 + TcpConfig::default().syn_retries);
}

const KA: KeepAlive = KeepAlive {
    idle: Duration::from_secs(10),
    interval: Duration::from_secs(2),
    count: 3,
};

#[test]
fn keepalive_probes_an_answering_peer_and_stays_up() {
    let (mut c, mut s, mut now) = established(cfg(), cfg());
    c.set_keepalive(now, Some(KA));
    assert_eq!(c.poll_at(), Some(now + KA.idle));
    // An hour of silence from both apps: the peer answers each probe.
    let end = now + Duration::from_secs(3600);
    while now < end {
        now = c.poll_at().expect("keepalive armed");
        let probes = drain(&mut c, now);
        assert_eq!(probes.len(), 1);
        let p = &probes[0];
        assert_eq!(p.out.hdr.seq, c.snd.una - 1);
        assert!(p.payload.is_empty() && !p.out.hdr.rst);
        s.on_segment(now, &p.seg());
        for w in drain(&mut s, now) {
            c.on_segment(now, &w.seg());
        }
    }
    assert_eq!(c.state(), State::Established);
    assert_eq!(c.error(), None);
    // One probe per idle period, every one answered.
    assert_eq!(c.stats().keepalive_probes, 3600 / 10);
    c.set_keepalive(now, None);
    assert_eq!(c.poll_at(), None);
}

#[test]
fn keepalive_resets_a_silent_peer_after_count_probes() {
    let (mut c, _s, mut now) = established(cfg(), cfg());
    let start = now;
    c.set_keepalive(now, Some(KA));
    let mut probes = 0;
    while let Some(t) = c.poll_at() {
        now = t;
        for w in drain(&mut c, now) {
            if w.out.hdr.rst {
                assert_eq!(c.error(), Some(ConnError::TimedOut));
            } else {
                probes += 1;
            }
        }
        if c.state() == State::Closed {
            break;
        }
    }
    assert_eq!(probes, KA.count);
    assert_eq!(c.error(), Some(ConnError::TimedOut));
    // Idle, then `count` intervals for the probes' answers.
    assert_eq!(now - start, KA.idle + KA.interval * KA.count);
}

#[test]
fn keepalive_waits_while_data_is_in_flight() {
    let (mut c, _s, now) = established(cfg(), cfg());
    c.set_keepalive(now, Some(KA));
    c.send(b"unanswered");
    let out = drain(&mut c, now);
    assert_eq!(out.len(), 1);
    // Only the retransmission timer runs, not keepalive.
    assert!(c.poll_at().is_some_and(|t| t < now + KA.idle));
    assert_eq!(c.keepalive_at(), None);
}

#[test]
fn user_timeout_fails_unacknowledged_data_with_timed_out() {
    let ut = Duration::from_secs(3);
    let (mut c, mut s, mut now) = established(cfg(), cfg());
    c.set_user_timeout(Some(ut));
    assert_eq!(c.user_timeout(), Some(ut));
    // Idle: no deadline.
    assert_eq!(c.user_timeout_at(), None);
    // Answered data restarts the clock and leaves nothing pending.
    c.send(b"answered");
    for w in drain(&mut c, now) {
        s.on_segment(now, &w.seg());
    }
    assert!(c.user_timeout_at().is_some_and(|t| t == now + ut));
    now += Duration::from_millis(10);
    for w in drain(&mut s, now + Duration::from_millis(200)) {
        c.on_segment(now, &w.seg());
    }
    assert_eq!(c.user_timeout_at(), None);
    // Now the peer vanishes: retransmissions, then the timeout.
    let start = now;
    c.send(b"unanswered");
    let mut rsts = 0;
    let mut sent = drain(&mut c, now).len();
    while let Some(t) = c.poll_at() {
        now = t.max(now);
        for w in drain(&mut c, now) {
            if w.out.hdr.rst {
                rsts += 1;
            } else {
                sent += 1;
            }
        }
        if c.state() == State::Closed {
            break;
        }
    }
    assert_eq!(c.error(), Some(ConnError::TimedOut));
    assert_eq!(rsts, 1);
    // The first transmission and some retransmissions, far fewer than
    // the retry limit.
    assert!(sent >= 2 && (sent as u32) < TcpConfig::default().max_retries);
    assert_eq!(now - start, ut);
}

#[test]
fn user_timeout_longer_than_the_retry_limit_keeps_retransmitting() {
    let ut = Duration::from_secs(24 * 3600);
    let (mut c, _s, mut now) = established(cfg(), cfg());
    c.set_user_timeout(Some(ut));
    let start = now;
    c.send(b"unanswered");
    let mut sent = drain(&mut c, now).len() as u32;
    while let Some(t) = c.poll_at() {
        now = t.max(now);
        sent += drain(&mut c, now).iter().filter(|w| !w.out.hdr.rst).count() as u32;
        if c.state() == State::Closed {
            break;
        }
    }
    assert_eq!(c.error(), Some(ConnError::TimedOut));
    assert!(sent > TcpConfig::default().max_retries + 1);
    assert_eq!(now - start, ut);
    // Zero turns it off: the count limit again.
    c.set_user_timeout(Some(Duration::ZERO));
    assert_eq!(c.user_timeout(), None);
}

#[test]
fn slow_reader_zero_window_probe_and_recovery() {
    let small = TcpConfig {
        recv_buffer: 8192,
        ..cfg()
    };
    let (mut c, mut s, mut now) = established(cfg(), small);
    let msg: Vec<u8> = (0..50_000u32).map(|i| (i * 7) as u8).collect();
    let mut sent = c.send(&msg);
    run(
        &mut c,
        &mut s,
        &mut now,
        Duration::from_micros(50),
        |_, _| true,
    );
    // The receiver's buffer is full and nobody reads: the window is zero.
    assert_eq!(s.recv_available(), 8192);
    assert_eq!(c.snd_wnd(), 0);
    // Time passes: the sender probes rather than giving up.
    let mut probes_seen = 0;
    for _ in 0..5 {
        let t = c.poll_at().expect("persist timer armed");
        now = now.max(t);
        let out = drain(&mut c, now);
        probes_seen += out.len();
        for w in out {
            s.on_segment(now, &w.seg());
        }
        for w in drain(&mut s, now) {
            c.on_segment(now, &w.seg());
        }
    }
    assert!(probes_seen >= 5 && c.stats().zero_window_probes >= 5);
    assert_eq!(c.state(), State::Established);
    // The reader drains: a window update restarts the flow; all data arrives.
    let mut got = Vec::new();
    for _ in 0..200 {
        got.extend(read_all(&mut s));
        if sent < msg.len() {
            sent += c.send(&msg[sent..]);
        }
        run(
            &mut c,
            &mut s,
            &mut now,
            Duration::from_micros(50),
            |_, _| true,
        );
    }
    got.extend(read_all(&mut s));
    assert_eq!(got, msg);
}

#[test]
fn the_right_edge_never_moves_left_while_the_window_closes() {
    // A reader that never reads and a window scale of several bits:
    // full-sized segments (not a multiple of the scale unit) fill the
    // buffer. Every ACK's right edge (ACK + window << scale) must be at
    // or beyond the one before (RFC 9293 3.8.6; rounding the window
    // down to the scale moved it back by up to a unit).
    let rcv = TcpConfig {
        recv_buffer: 64 << 10,
        ..cfg()
    };
    let (mut c, mut s, mut now) = established(cfg(), rcv);
    assert!(s.rcv.wscale >= 5, "scale {}", s.rcv.wscale);
    let shift = s.rcv.wscale;
    let msg = vec![7u8; 200_000];
    c.send(&msg);
    let mut edges = Vec::new();
    run(
        &mut c,
        &mut s,
        &mut now,
        Duration::from_micros(50),
        |from_client, w| {
            if !from_client {
                if let Some(ack) = w.out.hdr.ack {
                    let field = w.out.hdr.window;
                    edges.push((ack + (usize::from(field) << shift), field));
                }
            }
            true
        },
    );
    assert!(edges.len() > 8, "{} ACKs", edges.len());
    for pair in edges.windows(2) {
        let ((before, _), (after, field)) = (pair[0], pair[1]);
        assert!(
            after.diff(before) >= 0,
            "the right edge moved left by {} bytes (window field {field})",
            before.diff(after)
        );
    }
    // The window did close: the reader holds (about) a buffer's worth,
    // all the sender had acknowledged.
    assert!(s.recv_available() > (56 << 10), "{}", s.recv_available());
    assert_eq!(s.recv_available() as u64, c.stats().bytes_out);
}

#[test]
fn loss_triggers_fast_retransmit_and_cwnd_reduction() {
    for alg in [Algorithm::NewReno, Algorithm::Cubic] {
        for sack in [true, false] {
            let cc = TcpConfig {
                congestion: alg,
                sack,
                ..cfg()
            };
            // The receiver's window never closes during the test.
            let rc = TcpConfig {
                recv_buffer: 8 << 20,
                ..cc.clone()
            };
            let (mut c, mut s, mut now) = established(cc, rc);
            let msg = vec![0x5a; 4_000_000];
            let sent = grow_window(&mut c, &mut s, &mut now, &msg, 5);
            assert!(sent < msg.len());
            // NewReno reduces from the flight at the loss (RFC 5681: the
            // window, or the send buffer when slow start grew the window
            // past it), CUBIC from the window (RFC 9438).
            let before = match alg {
                Algorithm::NewReno => c.cwnd().min(cfg().send_buffer),
                Algorithm::Cubic => c.cwnd(),
            };
            let mut dropped = false;
            run(
                &mut c,
                &mut s,
                &mut now,
                Duration::from_micros(100),
                |from_c, w| {
                    // Drop exactly one data segment.
                    if from_c && w.out.payload_len > 0 && !dropped {
                        dropped = true;
                        return false;
                    }
                    true
                },
            );
            assert!(dropped);
            assert!(
                c.stats().fast_retransmits >= 1,
                "{alg:?} sack={sack}: {:?}",
                c.stats()
            );
            assert_eq!(
                c.stats().timeouts,
                0,
                "{alg:?} sack={sack} recovered without RTO"
            );
            let after = c.ssthresh();
            let expect = match alg {
                Algorithm::NewReno => 0.5,
                Algorithm::Cubic => 0.7,
            };
            let ratio = after as f64 / before as f64;
            assert!(
                (ratio - expect).abs() < 0.15,
                "{alg:?}: ssthresh {after} after cwnd {before}"
            );
        }
    }
}

#[test]
fn rto_recovers_from_tail_loss_with_backoff() {
    let (mut c, mut s, mut now) = established(cfg(), cfg());
    c.send(&[1u8; 3000]);
    // Lose everything the client sends for a while.
    let mut lost = 0;
    let until = now + Duration::from_secs(3);
    run(
        &mut c,
        &mut s,
        &mut now,
        Duration::from_micros(10),
        |from_c, w| {
            let _ = w;
            if from_c && lost < 3 {
                lost += 1;
                return false;
            }
            true
        },
    );
    let _ = until;
    assert!(c.stats().timeouts >= 1);
    assert_eq!(read_all(&mut s), vec![1u8; 3000]);
    assert_eq!(c.in_flight(), 0);
}

#[test]
fn delayed_ack_acks_every_second_segment_or_on_timer() {
    let dcfg = TcpConfig {
        delayed_ack: Some(Duration::from_millis(40)),
        ..TcpConfig::default()
    };
    let (mut c, mut s, now) = established(cfg(), dcfg);
    // Quick-ACK mode first: the opening segments are ACKed one by one.
    for _ in 0..16 {
        c.send(&[7u8; 1460]);
        for w in drain(&mut c, now) {
            s.on_segment(now, &w.seg());
        }
        for a in drain(&mut s, now) {
            c.on_segment(now, &a.seg());
        }
    }
    c.send(&[7u8; 1460]);
    for w in drain(&mut c, now) {
        s.on_segment(now, &w.seg());
    }
    // One segment: no ACK yet, the timer is set.
    assert!(drain(&mut s, now).is_empty());
    assert_eq!(s.poll_at(), Some(now + Duration::from_millis(40)));
    assert_eq!(drain(&mut s, now + Duration::from_millis(40)).len(), 1);
    // Two full segments: ACK at once.
    c.send(&[7u8; 2920]);
    let now2 = now + Duration::from_millis(50);
    for w in drain(&mut c, now2) {
        s.on_segment(now2, &w.seg());
    }
    assert_eq!(drain(&mut s, now2).len(), 1);
}

#[test]
fn quick_ack_mode_acks_the_first_segments_at_once_and_again_after_idle() {
    let dcfg = TcpConfig {
        delayed_ack: Some(Duration::from_millis(40)),
        ..TcpConfig::default()
    };
    let (mut c, mut s, now) = established(cfg(), dcfg);
    let acks = |c: &mut TcpConn, s: &mut TcpConn, now: Instant, len: usize| {
        c.send(&vec![1u8; len]);
        for w in drain(c, now) {
            s.on_segment(now, &w.seg());
        }
        let a = drain(s, now);
        for seg in &a {
            c.on_segment(now, &seg.seg());
        }
        a.len()
    };
    // min(16, window / 2 MSS): each of the first 16 small segments gets
    // its ACK at once (Linux's quick-ACK mode), the 17th waits.
    for i in 0..16 {
        assert_eq!(acks(&mut c, &mut s, now, 100), 1, "segment {i}");
    }
    assert_eq!(acks(&mut c, &mut s, now, 100), 0, "delayed after 16");
    let later = now + Duration::from_millis(40);
    assert_eq!(drain(&mut s, later).len(), 1, "the delayed ACK");
    // After an idle period longer than the RTO, quick-ACK mode again.
    let idle = later + Duration::from_secs(5);
    assert_eq!(acks(&mut c, &mut s, idle, 100), 1, "after idle");
    // A reply within the delayed-ACK time makes the connection
    // interactive: the next request's ACK waits to ride on a reply.
    let t = idle + Duration::from_millis(1);
    s.send(b"reply");
    for seg in drain(&mut s, t) {
        c.on_segment(t, &seg.seg());
    }
    for seg in drain(&mut c, t) {
        s.on_segment(t, &seg.seg());
    }
    assert_eq!(acks(&mut c, &mut s, t, 100), 0, "interactive: delayed");
}

#[test]
fn nagle_holds_small_segments_while_data_is_unacked() {
    let (mut c, _s, now) = established(
        TcpConfig {
            nagle: true,
            ..cfg()
        },
        cfg(),
    );
    c.send(b"a");
    assert_eq!(drain(&mut c, now).len(), 1);
    c.send(b"b");
    assert!(drain(&mut c, now).is_empty(), "Nagle waits for the ACK");
    let (mut c2, _s2, now2) = established(
        TcpConfig {
            nagle: false,
            ..cfg()
        },
        cfg(),
    );
    c2.send(b"a");
    drain(&mut c2, now2);
    c2.send(b"b");
    assert_eq!(drain(&mut c2, now2).len(), 1, "no Nagle: sent at once");
}

#[test]
fn nodelay_and_cork_per_connection() {
    let (mut c, _s, now) = established(cfg(), cfg());
    // TCP_NODELAY switched on at run time.
    c.set_nagle(false);
    c.send(b"a");
    drain(&mut c, now);
    c.send(b"b");
    assert_eq!(drain(&mut c, now).len(), 1, "no Nagle: sent at once");
    // Corked: small writes wait; a full segment goes; uncorking sends the rest.
    c.set_cork(true);
    c.send(b"cd");
    assert!(drain(&mut c, now).is_empty(), "corked");
    c.send(&vec![7u8; c.mss()]);
    let full = drain(&mut c, now);
    assert_eq!(full.len(), 1);
    assert_eq!(full[0].payload.len(), c.max_payload());
    c.set_cork(false);
    let rest = drain(&mut c, now);
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].payload.len(), 2 + c.mss() - c.max_payload());
}

#[test]
fn msg_more_holds_a_tail_until_push_or_the_timer() {
    let (mut c, mut s, mut now) = established(cfg(), cfg());
    c.set_nagle(false);
    // MSG_MORE: the small write waits, though Nagle is off.
    c.set_more(true);
    c.send(b"abc");
    assert!(drain(&mut c, now).is_empty(), "held by MSG_MORE");
    // Setting TCP_NODELAY pushes it (Linux's TCP_NAGLE_PUSH), once.
    c.push();
    let sent = drain(&mut c, now);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].payload, b"abc");
    let rtt = Duration::from_millis(10);
    exchange(&mut c, &mut s, &sent, now, rtt);
    now += rtt;
    assert_eq!(c.info().in_flight, 0);
    c.set_cork(true);
    c.send(b"de");
    assert!(drain(&mut c, now).is_empty(), "the push was used up");
    // With nothing in flight to clock it, the persist timer sends a
    // held tail (Linux's 200 ms ceiling on a cork).
    let at = c.poll_at().expect("a timer for the held tail");
    assert!(at - now <= Duration::from_secs(1), "{:?}", at - now);
    let late = drain(&mut c, at);
    assert_eq!(late.len(), 1, "{late:?}");
    assert_eq!(late[0].payload, b"de");
    // MSG_MORE lasts until the next ACK, as Linux's.
    c.set_cork(false);
    exchange(&mut c, &mut s, &late, at, rtt);
    now = at + rtt;
    c.set_more(true);
    c.send(b"f");
    assert!(drain(&mut c, now).is_empty());
    c.send(&[7u8; 4000]);
    let full = drain(&mut c, now);
    assert!(!full.is_empty());
    exchange(&mut c, &mut s, &full, now, rtt);
    let rest = drain(&mut c, now + rtt);
    assert_eq!(rest.len(), 1, "the ACK let the held tail go");
}

#[test]
fn data_for_a_closed_socket_draws_a_reset_formed_from_it() {
    let (mut c, mut s, now) = established(cfg(), cfg());
    // The app closes: FIN, and nobody reads any more.
    c.release(now);
    let fin = drain(&mut c, now);
    assert!(fin.iter().any(|w| w.out.hdr.fin));
    // The peer sends data before it sees the FIN.
    s.send(b"late");
    let data: Vec<Wire> = drain(&mut s, now)
        .into_iter()
        .filter(|w| !w.payload.is_empty())
        .collect();
    assert_eq!(data.len(), 1);
    c.on_segment(now, &data[0].seg());
    let rst = drain(&mut c, now);
    assert_eq!(rst.len(), 1, "{rst:?}");
    // RFC 9293 3.10.7.1: <SEQ=SEG.ACK><CTL=RST>, no ACK flag (Linux's).
    assert!(rst[0].out.hdr.rst);
    assert_eq!(rst[0].out.hdr.ack, None);
    assert_eq!(Some(rst[0].out.hdr.seq), data[0].out.hdr.ack);
}

#[test]
fn nagle_does_not_hold_a_lost_small_tail_after_rto() {
    // (The timeout's path: no tail loss probe to repair it first.)
    let (mut c, mut s, mut now) = established(
        TcpConfig {
            nagle: true,
            tail_loss_probe: false,
            ..cfg()
        },
        cfg(),
    );
    // 1448 + 1448 + a small tail of 1104 that Nagle holds until the ACK;
    // the tail's first transmission is lost.
    let data: Vec<u8> = (0..4000u32).map(|i| i as u8).collect();
    assert_eq!(c.send(&data), 4000);
    let mut lost = 0;
    run(
        &mut c,
        &mut s,
        &mut now,
        Duration::from_micros(100),
        |from_c, w| {
            if from_c && w.out.payload_len == 1104 && lost == 0 {
                lost += 1;
                return false;
            }
            true
        },
    );
    assert_eq!(lost, 1);
    assert_eq!(read_all(&mut s), data);
    assert_eq!(c.send_queued(), 0, "everything acknowledged");
    assert!(c.stats.timeouts >= 1 && c.stats.retransmits >= 1);
}

#[test]
fn old_timestamps_are_rejected_paws() {
    let (mut c, _s, now) = established(cfg(), cfg());
    let mut w = Wire {
        out: Outgoing::from(Header {
            seq: c.rcv.nxt,
            ack: Some(c.snd.una),
            window: 1000,
            timestamp: Some((c.opts.ts_recent.wrapping_sub(1000), 0)),
            ..Header::default()
        }),
        payload: b"stale".to_vec(),
    };
    c.on_segment(now, &w.seg());
    assert_eq!(c.recv_available(), 0);
    w.out.hdr.timestamp = Some((c.opts.ts_recent.wrapping_add(1), 0));
    c.on_segment(now, &w.seg());
    assert_eq!(c.recv_available(), 5);
}

#[test]
fn abort_sends_rst() {
    let (mut c, mut s, now) = established(cfg(), cfg());
    c.abort();
    let out = drain(&mut c, now);
    assert!(out[0].out.hdr.rst);
    s.on_segment(now, &out[0].seg());
    assert_eq!(s.error(), Some(ConnError::Reset));
}

#[test]
fn receiver_sws_avoidance_waits_for_a_useful_window() {
    let small = TcpConfig {
        recv_buffer: 16_384,
        recv_buffer_max: 16_384,
        ..cfg()
    };
    let (mut c, mut s, mut now) = established(cfg(), small);
    c.send(&vec![1u8; 40_000]);
    run(
        &mut c,
        &mut s,
        &mut now,
        Duration::from_micros(50),
        |_, _| true,
    );
    assert_eq!(s.recv_available(), 16_384);
    // Reading less than an MSS must not announce a tiny window.
    let mut buf = [0u8; 500];
    s.recv(&mut buf);
    assert!(
        drain(&mut s, now).is_empty(),
        "no window update for 500 bytes"
    );
    // Reading past half the buffer does.
    let mut big = vec![0u8; 8000];
    s.recv(&mut big);
    let upd = drain(&mut s, now);
    assert_eq!(upd.len(), 1);
    assert!(usize::from(upd[0].out.hdr.window) << s.rcv.wscale >= 8000);
}

proptest::proptest! {
    /// Acceptability agrees with the RFC's inequalities computed in
    /// unwrapped 64-bit space, wherever the window sits in sequence space.
    #[test]
    fn acceptance_matches_unwrapped_model(
        base in proptest::prelude::any::<u32>(),
        rel in -70_000i64..70_000,
        len in 0usize..3000,
        wnd in proptest::prop_oneof![proptest::strategy::Just(0usize), 1usize..65_536],
    ) {
        let rcv_nxt = Seq(base);
        let seq = Seq((i64::from(base) + rel).rem_euclid(1 << 32) as u32);
        let (nxt, w) = (0i64, wnd as i64);
        let first = rel;
        let last = rel + len as i64 - 1;
        let inside = |x: i64| nxt <= x && x < nxt + w;
        let model = match (len, wnd) {
            (0, 0) => first == nxt,
            (0, _) => inside(first),
            (_, 0) => false,
            _ => inside(first) || inside(last),
        };
        proptest::prop_assert_eq!(segment_acceptable(seq, len, rcv_nxt, wnd), model);
    }
}

/// One small exchange, so the sender has seen the receiver's scaled
/// window (the SYN's is unscaled): an ACK that changes the window is a
/// window update, never a duplicate ACK (RFC 5681 2).
fn settle_window(c: &mut TcpConn, s: &mut TcpConn, now: Instant) {
    c.send(b"x");
    for w in drain(c, now) {
        s.on_segment(now, &w.seg());
    }
    for a in drain(s, now) {
        c.on_segment(now, &a.seg());
    }
    assert_eq!(read_all(s), b"x");
}

/// A connection without SACK, its window settled, and the first flight
/// of a long send.
fn nosack_flight() -> (TcpConn, TcpConn, Instant, Vec<Wire>) {
    let nosack = TcpConfig {
        sack: false,
        ..cfg()
    };
    let (mut c, mut s, now) = established(nosack.clone(), nosack);
    settle_window(&mut c, &mut s, now);
    c.send(&[3u8; 40 * 1460]);
    let flight = drain(&mut c, now);
    (c, s, now, flight)
}

#[test]
fn limited_transmit_sends_a_new_segment_on_each_of_the_first_two_dupacks() {
    let (mut c, mut s, now, flight) = nosack_flight();
    assert!(flight.len() >= 4, "an initial window of several segments");
    let first_seq = flight[0].out.hdr.seq;
    // The first segment is lost; each later one draws a duplicate ACK.
    let mut dupacks = Vec::new();
    for w in &flight[1..4] {
        s.on_segment(now, &w.seg());
        dupacks.extend(drain(&mut s, now));
    }
    assert_eq!(
        dupacks.len(),
        3,
        "one duplicate ACK per out-of-order segment"
    );
    let highest = flight.last().unwrap().out.hdr.seq;
    for (i, d) in dupacks[..2].iter().enumerate() {
        c.on_segment(now, &d.seg());
        let out = drain(&mut c, now);
        assert_eq!(out.len(), 1, "dupack {}: one new segment", i + 1);
        assert!(
            out[0].out.hdr.seq.diff(highest) > 0,
            "new data, not a retransmission"
        );
    }
    // The third enters fast retransmit: the lost segment goes again.
    c.on_segment(now, &dupacks[2].seg());
    let out = drain(&mut c, now);
    assert_eq!(out.first().map(|w| w.out.hdr.seq), Some(first_seq));
}

#[test]
fn a_cumulative_ack_grows_the_window_only_by_what_dupacks_had_not_reported() {
    let (mut c, mut s, now, flight) = nosack_flight();
    // Segments 1 and 2 arrive before 0: two duplicate ACKs, then the
    // hole fills and one ACK covers all three.
    let mut acks = Vec::new();
    for i in [1, 2, 0] {
        s.on_segment(now, &flight[i].seg());
        acks.extend(drain(&mut s, now));
    }
    let cwnd_before = c.rec.cc.cwnd();
    for a in &acks {
        c.on_segment(now, &a.seg());
    }
    // Slow start adds the hole's segment only: the two others were
    // reported delivered by the duplicate ACKs (which, as in Linux, do
    // not grow the window), so the cumulative ACK does not count them
    // again.
    assert_eq!(
        c.rec.cc.cwnd(),
        cwnd_before + flight[0].payload.len(),
        "only the hole's segment"
    );
}

#[test]
fn record_ends_are_segment_boundaries_new_and_retransmitted() {
    // (The timeout's retransmission: no tail loss probe before it.)
    let no_tlp = TcpConfig {
        tail_loss_probe: false,
        ..cfg()
    };
    let (mut c, mut s, now) = established(no_tlp, cfg());
    settle_window(&mut c, &mut s, now);
    c.send(&[1u8; 3000]);
    for _ in 0..5 {
        c.send(&[2u8; 400]);
        c.end_record();
    }
    c.send(&[3u8; 3000]);
    let first = drain(&mut c, now);
    let lens: Vec<usize> = first.iter().map(|w| w.payload.len()).collect();
    let max = c.max_payload();
    // Full segments up to the first record end, which ends a short one;
    // each 400-byte record then leaves alone (short segments with more
    // queued behind them, which Nagle does not hold); then the rest,
    // whose short tail Nagle holds while data is in flight.
    let mut want = vec![max, max, 3400 - 2 * max];
    want.extend([400; 4]);
    want.extend([max, max]);
    assert_eq!(lens, want);
    // The first two arrive, the rest are lost: the retransmission after
    // the timeout stops at the record end too.
    for w in &first[..2] {
        s.on_segment(now, &w.seg());
    }
    for a in drain(&mut s, now) {
        c.on_segment(now, &a.seg());
    }
    let at = c.poll_at().expect("retransmission timer");
    let again = drain(&mut c, at);
    assert_eq!(again.first().map(|w| w.payload.len()), Some(3400 - 2 * max));
}

/// Deliver `from`'s segments to `to` half an RTT later, and `to`'s
/// answers back to `from` after another half.
fn exchange(from: &mut TcpConn, to: &mut TcpConn, segs: &[Wire], at: Instant, rtt: Duration) {
    for w in segs {
        to.on_segment(at + rtt / 2, &w.seg());
    }
    for a in drain(to, at + rtt / 2) {
        from.on_segment(at + rtt, &a.seg());
    }
}

/// An established pair whose client has measured `rtt` (three
/// exchanges), and the time after them.
fn established_at_rtt(rtt: Duration) -> (TcpConn, TcpConn, Instant) {
    established_at_rtt_with(rtt, cfg())
}

/// [`established_at_rtt`] with the client's configuration.
fn established_at_rtt_with(rtt: Duration, ccfg: TcpConfig) -> (TcpConn, TcpConn, Instant) {
    let (mut c, mut s, mut now) = established(ccfg, cfg());
    for _ in 0..3 {
        c.send(b"x");
        let w = drain(&mut c, now);
        exchange(&mut c, &mut s, &w, now, rtt);
        now += rtt;
    }
    read_all(&mut s);
    (c, s, now)
}

/// A lost last segment (RFC 8985 7): the tail loss probe sends it again
/// before the retransmission timeout would; the ACK it draws completes
/// the transfer without a timeout (the window stays open, reduced once,
/// not collapsed to one segment). Before, the tail waited for the RTO.
#[test]
fn a_lost_tail_is_probed_before_the_timeout() {
    let rtt = Duration::from_millis(100);
    let (mut c, mut s, mut now) = established_at_rtt(rtt);
    let max = c.max_payload();
    c.send(&vec![7u8; 4 * max]);
    let flight = drain(&mut c, now);
    assert_eq!(flight.len(), 4);
    let sent_at = now;
    // The first three arrive; the last is lost.
    exchange(&mut c, &mut s, &flight[..3], now, rtt);
    now += rtt;
    let rto = c.timers.get(Timer::Rto).expect("RTO armed");
    let pto = c.timers.get(Timer::Tlp).expect("probe timer armed");
    assert!(pto <= rto, "the probe comes first: {pto:?} vs {rto:?}");
    let cwnd = c.rec.cc.cwnd();
    let probe = drain(&mut c, pto);
    assert_eq!(probe.len(), 1, "one probe");
    assert_eq!(
        probe[0].out.hdr.seq, flight[3].out.hdr.seq,
        "the last segment again"
    );
    assert_eq!(c.stats().tail_loss_probes, 1);
    exchange(&mut c, &mut s, &probe, pto, rtt);
    assert_eq!(c.in_flight(), 0, "repaired by the probe");
    assert_eq!(c.stats().timeouts, 0);
    assert!(
        c.rec.cc.cwnd() < cwnd && c.rec.cc.cwnd() > 2 * max,
        "reduced once"
    );
    assert_eq!(read_all(&mut s).len(), 4 * max);
    assert!(
        pto - sent_at < Duration::from_millis(450),
        "{:?}",
        pto - sent_at
    );
    let _ = now;
}

/// Without loss, the probe timer is restarted by every ACK and never
/// fires: no probe, nothing sent twice.
#[test]
fn no_probe_while_acks_keep_coming() {
    let (mut c, mut s, mut now) = established(cfg(), cfg());
    let rtt = Duration::from_millis(10);
    c.send(&vec![1u8; 200_000]);
    for _ in 0..200 {
        let w = drain(&mut c, now);
        if w.is_empty() && c.in_flight() == 0 {
            break;
        }
        exchange(&mut c, &mut s, &w, now, rtt);
        now += rtt;
        read_all(&mut s);
    }
    assert_eq!(c.in_flight(), 0);
    assert_eq!(c.stats().tail_loss_probes, 0);
    assert_eq!(c.stats().retransmits, 0);
}

/// A hole below a tail probe the peer got (RFC 8985 6.2): the ACK that
/// SACKs the probe shows the segment before it lost, and it is sent again
/// at once (fast recovery), not at the RTO. (With RACK the hole goes even
/// before the probe: RACK's own tests are below; this one is without.)
#[test]
fn a_sacked_probe_marks_the_hole_below_it_lost() {
    let rtt = Duration::from_millis(100);
    let no_rack = TcpConfig {
        rack: false,
        ..cfg()
    };
    let (mut c, mut s, mut now) = established_at_rtt_with(rtt, no_rack);
    let max = c.max_payload();
    c.send(&vec![9u8; 4 * max]);
    let flight = drain(&mut c, now);
    // The third is lost: the fourth draws one SACK (below the dupack threshold).
    for i in [0, 1, 3] {
        s.on_segment(now + rtt / 2, &flight[i].seg());
    }
    for a in drain(&mut s, now + rtt / 2) {
        c.on_segment(now + rtt, &a.seg());
    }
    now += rtt;
    let pto = c.timers.get(Timer::Tlp).expect("probe timer armed");
    let probe = drain(&mut c, pto);
    assert_eq!(probe[0].out.hdr.seq, flight[3].out.hdr.seq);
    // The probe's ACK SACKs it again: the third goes at once.
    s.on_segment(pto + rtt / 2, &probe[0].seg());
    let acks = drain(&mut s, pto + rtt / 2);
    let mut again = Vec::new();
    for a in acks {
        c.on_segment(pto + rtt, &a.seg());
        again.extend(drain(&mut c, pto + rtt));
    }
    assert_eq!(
        again.first().map(|w| w.out.hdr.seq),
        Some(flight[2].out.hdr.seq),
        "{again:?}"
    );
    assert_eq!(c.stats().timeouts, 0);
    exchange(&mut c, &mut s, &again, pto + rtt, rtt);
    assert_eq!(c.in_flight(), 0);
    assert_eq!(read_all(&mut s).len(), 4 * max);
}

/// An app-limited sender's window grows to twice what it had in flight
/// and no further (Linux's `tcp_is_cwnd_limited` in slow start): small
/// writes one at a time, each acknowledged, never inflate it.
#[test]
fn an_app_limited_window_grows_only_to_twice_its_flight() {
    let (mut c, mut s, mut now) = established(cfg(), cfg());
    let w0 = c.cwnd();
    for _ in 0..50 {
        assert_eq!(c.send(&[7u8; 1000]), 1000);
        run(
            &mut c,
            &mut s,
            &mut now,
            Duration::from_millis(1),
            |_, _| true,
        );
        read_all(&mut s);
    }
    // One segment in flight at a time: the window stays where it began
    // (it is already more than twice that).
    assert_eq!(c.cwnd(), w0);
    // A write of 40 segments fills the window: now it limits, and grows.
    assert_eq!(c.send(&[7u8; 40_000]), 40_000);
    run(
        &mut c,
        &mut s,
        &mut now,
        Duration::from_millis(1),
        |_, _| true,
    );
    assert!(c.cwnd() > w0, "{} > {w0}", c.cwnd());
}

/// After idle time longer than the retransmission timeout, the next write
/// starts from the initial window (RFC 5681 §4.1, Linux's
/// `tcp_slow_start_after_idle`); with the setting off the window stays.
#[test]
fn slow_start_after_idle_restarts_the_window() {
    for restart in [true, false] {
        let ccfg = TcpConfig {
            slow_start_after_idle: restart,
            ..cfg()
        };
        let (mut c, mut s, mut now) = established(ccfg, cfg());
        let w0 = c.cwnd();
        assert_eq!(c.send(&[7u8; 200_000]), 200_000);
        run(
            &mut c,
            &mut s,
            &mut now,
            Duration::from_millis(1),
            |_, _| true,
        );
        read_all(&mut s);
        let grown = c.cwnd();
        assert!(grown > 2 * w0, "{grown} > 2 x {w0}");
        // Idle for 5 s, then a write.
        now += Duration::from_secs(5);
        assert_eq!(c.send(&[7u8; 1000]), 1000);
        let _ = drain(&mut c, now);
        let expect = if restart { w0 } else { grown };
        assert_eq!(c.cwnd(), expect, "restart={restart}");
    }
}

/// Client and server with the handshake done across a path of round trip
/// `rtt` (so the first RTT sample, and RACK's min_RTT, is `rtt`).
fn established_across(ccfg: TcpConfig, rtt: Duration) -> (TcpConn, TcpConn, Instant) {
    let t = Instant::from_millis(1);
    let mut c = TcpConn::connect(ccfg, A, B, Seq(1000));
    let syn = drain(&mut c, t);
    let mut s = TcpConn::accept(cfg(), B, A, Seq(5000), &syn[0].seg());
    let synack = drain(&mut s, t + rtt / 2);
    c.on_segment(t + rtt, &synack[0].seg());
    for w in drain(&mut c, t + rtt) {
        s.on_segment(t + rtt + rtt / 2, &w.seg());
    }
    assert_eq!(s.state(), State::Established);
    (c, s, t + rtt)
}

/// Run `c`'s timers up to `until` (nothing delivered); what it sent.
fn timers_until(c: &mut TcpConn, until: Instant) -> Vec<Wire> {
    let mut out = Vec::new();
    while let Some(t) = c.poll_at().filter(|&t| t <= until) {
        c.on_timer(t);
        out.extend(drain(c, t));
    }
    out
}

fn starts(ws: &[Wire]) -> Vec<Seq> {
    ws.iter().map(|w| w.out.hdr.seq).collect()
}

/// RACK (RFC 8985 6.2) and PRR (RFC 6937) as packetdrill's
/// prr-ss-ack-below-snd_una script has them: of ten segments the first,
/// fourth and seventh are lost; three SACKs start recovery and let the
/// first hole alone go (PRR's first step), nothing more leaves on a timer,
/// and the ACK that delivers the retransmission and the fourth (which was
/// only late) sends the next three by RACK's verdict (all sent before the
/// SACKed eighth) within PRR's slow-start bound.
#[test]
fn rack_marks_by_time_and_prr_paces_the_repair() {
    let rtt = Duration::from_millis(10);
    let (mut c, mut s, now) = established_across(cfg(), rtt);
    let max = c.max_payload();
    c.send(&vec![1u8; 10 * max]);
    let flight = drain(&mut c, now);
    assert_eq!(flight.len(), 10);
    let t1 = now + rtt / 2;
    let mut acks = Vec::new();
    for i in [1, 2, 7] {
        s.on_segment(t1, &flight[i].seg());
        acks.extend(drain(&mut s, t1));
    }
    assert_eq!(acks.len(), 3);
    let t2 = now + rtt;
    let mut sent = Vec::new();
    for a in &acks {
        c.on_segment(t2, &a.seg());
        sent.extend(drain(&mut c, t2));
    }
    assert_eq!(starts(&sent), [flight[0].out.hdr.seq]);
    assert!(c.info().recovering);
    // Every segment sent before the SACKed eighth is lost (no reordering
    // seen, recovery on: no reordering window): 1, 4, 5, 6, 7.
    assert_eq!(c.info().lost, 5 * max);
    assert!(timers_until(&mut c, t2 + rtt).is_empty());
    // The late fourth and the retransmission arrive (in that order: the
    // fourth's older timestamp would fail PAWS after the retransmission).
    let t3 = t2 + rtt;
    let mut acks = Vec::new();
    for w in [&flight[3], &sent[0]] {
        s.on_segment(t3 - rtt / 2, &w.seg());
        acks.extend(drain(&mut s, t3 - rtt / 2));
    }
    let ack = acks.last().expect("an ACK");
    assert_eq!(ack.out.hdr.ack, Some(flight[4].out.hdr.seq));
    c.on_segment(t3, &ack.seg());
    let sent = drain(&mut c, t3);
    assert_eq!(starts(&sent), [4, 5, 6].map(|i| flight[i].out.hdr.seq));
}

/// After a timeout the sender goes back over the flight (Linux's Loss
/// state): what is in flight is what it sent again, less what the peer
/// SACKed. Segments RACK then finds lost (sent before the retransmission
/// that was delivered) do not leave the pipe and let a burst out: the ACK
/// of the first retransmission lets exactly the slow-start window's two
/// segments go, and no fast recovery starts on top of the timeout.
#[test]
fn after_a_timeout_the_flight_is_what_was_sent_again() {
    let rtt = Duration::from_millis(100);
    let (mut c, mut s, now) = established_across(cfg(), rtt);
    let max = c.max_payload();
    c.send(&vec![3u8; 4 * max]);
    let flight = drain(&mut c, now);
    assert_eq!(flight.len(), 4);
    // Only the last arrives; its SACK comes back. Then the tail probe and
    // the timeout's retransmission of the first are lost too, up to the
    // second timeout's retransmission of the first, which arrives.
    s.on_segment(now + rtt / 2, &flight[3].seg());
    for a in drain(&mut s, now + rtt / 2) {
        c.on_segment(now + rtt, &a.seg());
    }
    assert!(drain(&mut c, now + rtt).is_empty());
    let mut t = now + rtt;
    let mut again = Vec::new();
    while c.stats().timeouts < 2 {
        t = c.poll_at().expect("a timer");
        c.on_timer(t);
        again = drain(&mut c, t);
    }
    assert_eq!(starts(&again), [flight[0].out.hdr.seq]);
    s.on_segment(t + rtt / 2, &again[0].seg());
    let ack = drain(&mut s, t + rtt / 2).remove(0);
    assert!(ack.out.hdr.sack[0].is_some(), "the fourth is SACKed");
    c.on_segment(t + rtt, &ack.seg());
    let sent = drain(&mut c, t + rtt);
    assert_eq!(starts(&sent), [1, 2].map(|i| flight[i].out.hdr.seq));
    assert!(!c.info().recovering);
    exchange(&mut c, &mut s, &sent, t + rtt, rtt);
    assert_eq!(c.in_flight(), 0);
    assert_eq!(read_all(&mut s).len(), 4 * max);
}

/// A client that asks for ECN (RFC 3168) and a server that grants it.
fn ecn_pair() -> (TcpConn, TcpConn, Instant) {
    let ask = TcpConfig {
        ecn: Ecn::On,
        ..cfg()
    };
    established(ask, cfg())
}

#[test]
fn ecn_is_asked_for_in_the_syn_and_granted_in_the_syn_ack() {
    for (client, server, on) in [
        (Ecn::On, Ecn::Accept, true),
        (Ecn::On, Ecn::On, true),
        (Ecn::On, Ecn::Off, false),
        (Ecn::Accept, Ecn::Accept, false),
    ] {
        let t = Instant::from_millis(1);
        let ccfg = TcpConfig {
            ecn: client,
            ..cfg()
        };
        let mut c = TcpConn::connect(ccfg, A, B, Seq(1000));
        let syn = drain(&mut c, t);
        let asked = client == Ecn::On;
        assert_eq!((syn[0].out.hdr.ece, syn[0].out.hdr.cwr), (asked, asked));
        assert!(!syn[0].out.ect, "a SYN is never ECN-capable");
        let scfg = TcpConfig {
            ecn: server,
            ..cfg()
        };
        let mut s = TcpConn::accept(scfg, B, A, Seq(5000), &syn[0].seg());
        let synack = drain(&mut s, t);
        assert_eq!(synack[0].out.hdr.ece, on, "{client:?} {server:?}");
        assert!(!synack[0].out.hdr.cwr && !synack[0].out.ect);
        c.on_segment(t, &synack[0].seg());
        for w in drain(&mut c, t) {
            assert!(!w.out.ect && !w.out.hdr.ece, "the third ACK is plain");
            s.on_segment(t, &w.seg());
        }
        assert_eq!((c.info().ecn, s.info().ecn), (on, on));
        // New data is ECT(0) on an ECN connection only; ACKs never are.
        c.send(&[7u8; 3000]);
        let data = drain(&mut c, t);
        assert!(data.iter().all(|w| w.out.ect == on && !w.out.hdr.cwr));
        for w in &data {
            s.on_segment(t, &w.seg());
        }
        assert!(drain(&mut s, t).iter().all(|w| !w.out.ect));
        assert_eq!(s.info().ecn_seen, on);
    }
}

#[test]
fn a_retransmitted_syn_does_not_ask_for_ecn_and_then_ecn_stays_off() {
    let ccfg = TcpConfig {
        ecn: Ecn::On,
        ..cfg()
    };
    let mut c = TcpConn::connect(ccfg, A, B, Seq(1000));
    let first = drain(&mut c, Instant::from_millis(1));
    assert!(first[0].out.hdr.ece && first[0].out.hdr.cwr);
    let later = c.poll_at().expect("the SYN's timer");
    let again = drain(&mut c, later);
    assert!(again[0].out.hdr.syn);
    assert!(!again[0].out.hdr.ece && !again[0].out.hdr.cwr);
    // The server saw only the plain SYN: its SYN-ACK does not agree.
    let mut s = TcpConn::accept(cfg(), B, A, Seq(5000), &again[0].seg());
    let synack = drain(&mut s, later);
    assert!(!synack[0].out.hdr.ece);
    c.on_segment(later, &synack[0].seg());
    assert!(!c.info().ecn);
    c.send(&[1u8; 100]);
    assert!(drain(&mut c, later).iter().all(|w| !w.out.ect));
}

#[test]
fn a_congestion_mark_is_echoed_until_cwr_and_cuts_the_window_once() {
    let (mut c, mut s, mut now) = ecn_pair();
    let msg = vec![0x3c; 2_000_000];
    let sent = grow_window(&mut c, &mut s, &mut now, &msg, 4);
    let cwnd = c.cwnd();
    assert!(cwnd > 20 * 1448, "{cwnd}");
    // The receiver's window update reaches the sender.
    for w in drain(&mut s, now) {
        c.on_segment(now, &w.seg());
    }
    // One window of data; the first segment meets congestion on the way.
    let data: Vec<Wire> = drain(&mut c, now)
        .into_iter()
        .filter(|w| w.out.payload_len > 0)
        .collect();
    assert!(
        data.len() > 4 && data.iter().all(|w| w.out.ect),
        "{:?}",
        data.iter()
            .map(|w| (w.out.payload_len, w.out.ect))
            .collect::<Vec<_>>()
    );
    let mut seg = data[0].seg();
    seg.ecn = 3;
    s.on_segment(now, &seg);
    let acks = drain(&mut s, now);
    assert!(!acks.is_empty(), "a marked segment is acknowledged at once");
    assert!(acks.iter().all(|w| w.out.hdr.ece));
    // The echo goes on for the rest of the window (no CWR yet).
    for w in &data[1..] {
        s.on_segment(now, &w.seg());
    }
    let echoes: Vec<Wire> = drain(&mut s, now);
    assert!(!echoes.is_empty() && echoes.iter().all(|w| w.out.hdr.ece));
    // The sender cuts its window once for all the echoes of this window.
    now += Duration::from_micros(100);
    for w in acks.iter().chain(&echoes) {
        c.on_segment(now, &w.seg());
    }
    assert_eq!(c.stats().ecn_reductions, 1);
    assert_eq!(c.info().ca_state, CaState::Cwr);
    assert!(c.ssthresh() < cwnd);
    // The next new data carries CWR (once); the receiver stops echoing.
    c.send(&msg[sent..]);
    let next = drain(&mut c, now);
    assert!(!next.is_empty());
    assert!(next[0].out.hdr.cwr && next[0].out.ect);
    assert!(next[1..].iter().all(|w| !w.out.hdr.cwr));
    for w in &next {
        s.on_segment(now, &w.seg());
    }
    let after = drain(&mut s, now);
    assert!(!after.is_empty() && after.iter().all(|w| !w.out.hdr.ece));
    // No loss: nothing was sent again, and the stream arrives whole.
    run(
        &mut c,
        &mut s,
        &mut now,
        Duration::from_micros(100),
        |_, _| true,
    );
    assert_eq!(c.stats().retransmits, 0);
    assert_eq!(c.stats().ecn_reductions, 1);
    assert_eq!(c.info().ca_state, CaState::Open);
}

/// A delay spike, not a loss (RFC 3522, Eifel): the ACKs of a flight come
/// after the retransmission timeout fired and resent its first segment;
/// they echo the originals' timestamps, older than the retransmission's,
/// so the timeout was needless: the window and ssthresh come back and
/// the sender goes on with new data instead of going back over the
/// flight. A real loss (only the retransmission arrives) keeps the cut.
#[test]
fn a_needless_timeout_is_undone_by_the_echoed_timestamps() {
    for spurious in [true, false] {
        let rtt = Duration::from_millis(20);
        let (mut c, mut s, mut now) = established_at_rtt(rtt);
        let max = c.max_payload();
        c.send(&vec![9u8; 8 * max]);
        let flight = drain(&mut c, now);
        assert_eq!(flight.len(), 8);
        let (cwnd, ssthresh) = (c.cwnd(), c.ssthresh());
        let rto = c.timers.get(Timer::Rto).expect("RTO armed");
        // The probe timer comes first: let it fire (a probe of the last
        // segment, held back too), then the timeout.
        let probe_at = c.poll_at().unwrap();
        let held = drain(&mut c, probe_at);
        now = rto.max(c.timers.get(Timer::Rto).unwrap());
        let again = drain(&mut c, now);
        assert_eq!(c.stats().timeouts, 1, "{held:?}");
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].out.hdr.seq, flight[0].out.hdr.seq);
        assert!(c.cwnd() < cwnd);
        if spurious {
            // The originals arrive (late); their ACKs come back.
            exchange(&mut c, &mut s, &flight, now, rtt);
            assert_eq!(c.stats().undos, 1);
            assert_eq!((c.cwnd(), c.ssthresh()), (cwnd, ssthresh));
            assert_eq!(c.info().ca_state, CaState::Open);
        } else {
            // The first was lost: only its retransmission arrives.
            exchange(&mut c, &mut s, &again, now, rtt);
            assert_eq!(c.stats().undos, 0);
            assert!(c.cwnd() < cwnd);
        }
        now += rtt;
        assert_eq!(finish(&mut c, &mut s, &mut now), 8 * max);
    }
}

/// Reordering taken for a loss (RFC 3708): three segments overtake the
/// first, whose fast retransmission is needless: the original arrives,
/// then the retransmission, which the receiver reports with a D-SACK
/// (RFC 2883), and the sender gives the window back. Without timestamps,
/// so the D-SACK alone tells.
#[test]
fn a_needless_fast_retransmit_is_undone_by_a_dsack() {
    let no_ts = TcpConfig {
        timestamps: false,
        ..cfg()
    };
    let (mut c, mut s, now) = established(no_ts.clone(), no_ts);
    let max = c.max_payload();
    c.send(&vec![5u8; 6 * max]);
    let flight = drain(&mut c, now);
    assert_eq!(flight.len(), 6);
    let (cwnd, ssthresh) = (c.cwnd(), c.ssthresh());
    // Segments 2..6 overtake the first: SACKed duplicate ACKs.
    for w in &flight[1..] {
        s.on_segment(now, &w.seg());
    }
    let dupacks = drain(&mut s, now);
    for a in &dupacks {
        c.on_segment(now, &a.seg());
    }
    assert!(c.info().recovering, "fast recovery on the SACKs");
    assert!(c.cwnd() < cwnd);
    let resent = drain(&mut c, now);
    assert_eq!(resent[0].out.hdr.seq, flight[0].out.hdr.seq);
    // The original arrives: everything is acknowledged.
    s.on_segment(now, &flight[0].seg());
    for a in drain(&mut s, now) {
        assert!(a.out.hdr.sack[0].is_none());
        c.on_segment(now, &a.seg());
    }
    assert!(!c.info().recovering);
    assert_eq!(c.stats().undos, 0, "not yet: nothing said it was needless");
    // Then the retransmission: a duplicate, reported as such.
    s.on_segment(now, &resent[0].seg());
    let dsack = drain(&mut s, now);
    let first = flight[0].out.hdr.seq;
    assert_eq!(dsack[0].out.hdr.sack[0], Some((first, first + max)));
    c.on_segment(now, &dsack[0].seg());
    assert_eq!(c.stats().undos, 1);
    assert_eq!((c.cwnd(), c.ssthresh()), (cwnd, ssthresh));
    // Each duplicate is reported once.
    s.on_segment(now, &resent[0].seg());
    let again = drain(&mut s, now);
    assert_eq!(again[0].out.hdr.sack[0], Some((first, first + max)));
    assert!(drain(&mut s, now).is_empty());
}

/// F-RTO (RFC 5682 3.1), without timestamps: after a timeout the first
/// ACK (of the first segment only) lets two new segments out instead of
/// the flight again. Then, when the originals were only late, an ACK of
/// data sent once shows the timeout was needless: the window comes back.
/// When they were lost, the SACK of the new data says so and the sender
/// goes back over the flight.
#[test]
fn frto_sends_new_data_after_a_timeout_and_tells_a_needless_one() {
    for late in [true, false] {
        let no_ts = TcpConfig {
            timestamps: false,
            ..cfg()
        };
        let (mut c, mut s, mut now) = established(no_ts.clone(), no_ts);
        let max = c.max_payload();
        c.send(&vec![3u8; 20 * max]);
        let flight = drain(&mut c, now);
        assert_eq!(flight.len(), 10, "the initial window");
        let high = c.snd.max;
        let (cwnd, ssthresh) = (c.cwnd(), c.ssthresh());
        // Nothing comes back: the probe, then the timeout.
        now = c.poll_at().unwrap();
        let _probe = drain(&mut c, now);
        now = c.poll_at().unwrap();
        let resent: Vec<Wire> = drain(&mut c, now);
        assert_eq!(c.stats().timeouts, 1);
        let first = flight[0].out.hdr.seq;
        assert!(resent.iter().any(|w| w.out.hdr.seq == first), "{resent:?}");
        // The first segment arrives (the original if late, else the
        // retransmission): its ACK lets new data out (step 2b).
        s.on_segment(now, &flight[0].seg());
        for a in drain(&mut s, now) {
            c.on_segment(now, &a.seg());
        }
        let next = drain(&mut c, now);
        assert_eq!(next.len(), 2, "{next:?}");
        assert!(
            next.iter().all(|w| w.out.hdr.seq.diff(high) >= 0),
            "new data: {:?} {high:?} {:?}",
            next.iter().map(|w| w.out.hdr.seq).collect::<Vec<_>>(),
            c.stats()
        );
        if late {
            // The rest of the flight arrives: data sent once is ACKed.
            for w in &flight[1..] {
                s.on_segment(now, &w.seg());
            }
            for a in drain(&mut s, now) {
                c.on_segment(now, &a.seg());
            }
            assert_eq!(c.stats().undos, 1);
            assert_eq!((c.cwnd(), c.ssthresh()), (cwnd, ssthresh));
        } else {
            // Lost: the new data arrives above a hole, and is SACKed.
            for w in &next {
                s.on_segment(now, &w.seg());
            }
            for a in drain(&mut s, now) {
                c.on_segment(now, &a.seg());
            }
            assert_eq!(c.stats().undos, 0);
            let back = drain(&mut c, now);
            assert_eq!(back[0].out.hdr.seq, flight[1].out.hdr.seq, "goes back");
        }
        assert_eq!(finish(&mut c, &mut s, &mut now), 20 * max);
    }
}

/// A real loss is not undone: the duplicate ACKs that follow the fast
/// retransmission echo the timestamp of the last segment before the
/// hole, older than the retransmission's, yet say nothing of the
/// original (Eifel looks only at ACKs that move `SND.UNA`).
#[test]
fn duplicate_acks_after_a_fast_retransmit_do_not_undo_it() {
    let rtt = Duration::from_millis(20);
    let (mut c, mut s, mut now) = established_at_rtt(rtt);
    let max = c.max_payload();
    c.send(&vec![4u8; 10 * max]);
    let flight = drain(&mut c, now);
    assert_eq!(flight.len(), 10);
    let cwnd = c.cwnd();
    now += rtt / 2;
    // The first is lost; the next four arrive: three duplicate ACKs and
    // a fourth start recovery; the retransmission leaves.
    for w in &flight[1..5] {
        s.on_segment(now, &w.seg());
    }
    now += rtt / 2;
    for a in drain(&mut s, now) {
        c.on_segment(now, &a.seg());
    }
    assert!(c.info().recovering);
    let resent = drain(&mut c, now);
    assert_eq!(resent[0].out.hdr.seq, flight[0].out.hdr.seq);
    // The rest's duplicate ACKs come a few milliseconds later.
    now += Duration::from_millis(5);
    for w in &flight[5..] {
        s.on_segment(now, &w.seg());
    }
    for a in drain(&mut s, now) {
        c.on_segment(now, &a.seg());
    }
    assert_eq!(c.stats().undos, 0);
    assert!(c.info().recovering && c.cwnd() < cwnd);
    // The retransmission arrives: recovery ends with the cut kept.
    now += rtt / 2;
    exchange(&mut c, &mut s, &resent, now, rtt);
    assert_eq!(c.stats().undos, 0);
    assert!(!c.info().recovering && c.cwnd() < cwnd);
    assert_eq!(finish(&mut c, &mut s, &mut now), 10 * max);
}
