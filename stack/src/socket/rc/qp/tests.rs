//! The QP's unit tests: PSN arithmetic, timer encodings, go-back-N
//! against late ACKs, the local ACK timer.

use std::time::Duration;

use super::*;
use crate::wire::rc::NakCode;

#[test]
fn psn_arithmetic_wraps_at_24_bits() {
    assert_eq!(psn_add(PSN_MASK, 1), 0);
    assert_eq!(psn_diff(0, PSN_MASK), 1);
    assert_eq!(psn_diff(PSN_MASK, 0), -1);
    assert_eq!(psn_diff(5, 5), 0);
    assert_eq!(psn_diff(0x40_0000, 0), 0x40_0000);
    assert_eq!(psn_diff(0x80_0000, 0), -0x80_0000);
}

fn ack(syndrome: Syndrome) -> RcHeaders<'static> {
    RcHeaders {
        opcode: RcOpcode::Acknowledge,
        reth: None,
        atomic: None,
        aeth: Some((syndrome, 0)),
        atomic_ack: None,
        imm: None,
        payload: &[],
    }
}

fn sent(qp: &mut RcQp, mrs: &MrTable) -> Vec<(u32, RcOpcode)> {
    let mut out = Vec::new();
    qp.poll_transmit(Instant::ZERO, mrs, &mut |p| {
        out.push((p.psn, p.opcode));
        Ok(())
    })
    .unwrap();
    out
}

/// A go-back to the middle of a message, then a late ACK for that
/// whole message: sending resumes at the next message's first packet.
#[test]
fn a_late_ack_during_a_go_back_moves_the_resend_point() {
    let mrs = MrTable::new((1, 2));
    let mut qp = RcQp::new(0x1000, &RcQpConfig::default(), 1024, 100);
    qp.connect(RcDest {
        ip: core::net::Ipv4Addr::new(10, 0, 0, 2).into(),
        qpn: 7,
        psn: 0,
    });
    for (id, len) in [(1, 3000), (2, 10)] {
        let data = vec![0u8; len];
        let wr = RcSendWr {
            wr_id: id,
            op: RcOp::Send,
            local: Local::Inline(&data),
            signaled: true,
            solicited: false,
        };
        qp.post_send(&wr, &mrs).unwrap();
    }
    let first: Vec<u32> = sent(&mut qp, &mrs).iter().map(|p| p.0).collect();
    assert_eq!(first, [100, 101, 102, 103]);
    let mut mrs = mrs;
    let now = Instant::ZERO;
    // The peer lost 101: go back to it.
    assert_eq!(
        qp.on_packet(
            now,
            101,
            false,
            &ack(Syndrome::Nak(NakCode::PsnSequenceError)),
            &mut mrs
        ),
        Rx::Ok
    );
    // Before anything is resent, a late ACK for 102 (all of message 1).
    assert_eq!(
        qp.on_packet(
            now,
            102,
            false,
            &ack(Syndrome::Ack { credits: 31 }),
            &mut mrs
        ),
        Rx::Ok
    );
    assert_eq!(sent(&mut qp, &mrs), [(103, RcOpcode::SendOnly)]);
    assert_eq!(qp.stats.retransmits, 1);
    let mut wcs = Vec::new();
    qp.poll_cq(8, &mut wcs);
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
}

/// The QP of the timer tests: 1024-byte packets, timeout 14 (67 ms,
/// perftest's), connected.
fn timer_qp() -> (RcQp, MrTable) {
    let cfg = RcQpConfig {
        timeout: 14,
        ..RcQpConfig::default()
    };
    let mut qp = RcQp::new(0x1000, &cfg, 1024, 100);
    qp.connect(RcDest {
        ip: core::net::Ipv4Addr::new(10, 0, 0, 2).into(),
        qpn: 7,
        psn: 0,
    });
    (qp, MrTable::new((1, 2)))
}

fn post(qp: &mut RcQp, mrs: &MrTable, id: u64, len: usize) {
    let data = vec![0u8; len];
    let wr = RcSendWr {
        wr_id: id,
        op: RcOp::Send,
        local: Local::Inline(&data),
        signaled: true,
        solicited: false,
    };
    qp.post_send(&wr, mrs).unwrap();
}

/// What the QP sends when polled at `now` (the table polls right
/// after the timers, with the same `now`).
fn step(qp: &mut RcQp, mrs: &MrTable, now: Instant) -> Vec<u32> {
    qp.on_timer(now);
    let mut out = Vec::new();
    qp.poll_transmit(now, mrs, &mut |p| {
        out.push(p.psn);
        Ok(())
    })
    .unwrap();
    out
}

/// The local ACK timer (IBA 9.7.6.1.3) never fires before `ack_timeout`
/// has passed since what armed it: the first send with nothing
/// outstanding, the last progress (an ACK of some of what is
/// outstanding restarts it), or the resend after a timeout. A manual
/// clock walks in 1 ms steps through a 4-packet message (perftest's
/// `ib_send_lat -s 4096` at a 1024-byte MTU) whose ACKs are lost,
/// partly acknowledged, resent and acknowledged, then a new message
/// after a quiet time; every timeout must come at least 67 ms after
/// the event before it, and no later than the step after.
#[test]
fn the_ack_timer_never_fires_before_the_timeout_after_a_send_or_progress() {
    let (mut qp, mut mrs) = timer_qp();
    let to = ack_timeout(14);
    let ms = Duration::from_millis(1);
    let at = |n: u64| Instant::ZERO + Duration::from_millis(n);
    // Scripted inputs: (time in ms, PSN acknowledged) and when the
    // second message is posted.
    let acks = [(20u64, 101u32), (120, 103), (350, 104)];
    let post_second = 300u64;
    post(&mut qp, &mrs, 1, 4096);
    // The event the running timer counts from, and every timeout seen.
    let mut armed: Option<Instant> = None;
    let mut fired = Vec::new();
    for n in 0..600u64 {
        let now = at(n);
        if n == post_second {
            post(&mut qp, &mrs, 2, 1000);
        }
        for &(t, psn) in &acks {
            if t == n {
                let before = qp.una;
                let r = qp.on_packet(
                    now,
                    psn,
                    false,
                    &ack(Syndrome::Ack { credits: 31 }),
                    &mut mrs,
                );
                assert_eq!(r, Rx::Ok, "ACK {psn} at {n} ms");
                if qp.una != before {
                    // Progress restarts the timer (or stops it).
                    armed = (qp.una != qp.sent_next).then_some(now);
                }
            }
        }
        let timeouts = qp.stats.ack_timeouts;
        let idle = qp.una == qp.sent_next;
        let sent = step(&mut qp, &mrs, now);
        if qp.stats.ack_timeouts > timeouts {
            let since = armed.expect("a timer runs");
            assert!(
                now >= since + to,
                "the ACK timer fired at {n} ms, {:?} after it was armed (timeout {to:?})",
                now.saturating_duration_since(since)
            );
            assert!(now < since + to + ms, "fired late: at {n} ms");
            fired.push(n);
            armed = Some(now);
        } else if !sent.is_empty() && idle {
            // A first send with nothing outstanding arms it.
            armed = Some(now);
        }
        let want = armed.map(|since| since + to);
        assert_eq!(qp.deadline(), want, "at {n} ms");
    }
    // Sent at 0; 100 and 101 acknowledged at 20, so the timer counts
    // from 20 and fires at 88 (not 67); the resend of 102 and 103 is
    // acknowledged at 120; message 2 goes at 300, acknowledged at 350.
    assert_eq!(fired, [88], "timeouts at (ms)");
    assert_eq!(qp.stats.retransmits, 2);
    let mut wcs = Vec::new();
    qp.poll_cq(8, &mut wcs);
    let ok: Vec<(u64, WcStatus)> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(ok, [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(qp.deadline(), None);
}

#[test]
fn timers_decode_as_the_spec_tables() {
    assert_eq!(rnr_timer(0), Duration::from_micros(655_360));
    assert_eq!(rnr_timer(1), Duration::from_micros(10));
    assert_eq!(rnr_timer(12), Duration::from_micros(640));
    assert_eq!(rnr_timer(31), Duration::from_micros(491_520));
    assert_eq!(ack_timeout(14), Duration::from_nanos(4096 << 14));
    assert_eq!(ack_timeout(0), Duration::from_nanos(4096 << 31));
}
