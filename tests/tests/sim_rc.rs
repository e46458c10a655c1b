//! RoCEv2 RC spoken by the stack, on the sim link: SEND, SEND with
//! immediate, WRITE, WRITE with immediate and READ from 1 B to 8 MB
//! byte-exact on a clean link and under loss, reordering and duplication
//! (go-back-N visible in the counters), RNR NAKs and their retry count,
//! the ACK timeout's retry count, bad keys and ranges (the NAK the spec
//! names, both QPs in error, nothing written), crafted packets far out of
//! window and a NAK storm, and every buffer back in its pool.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use ustack::sim::{LinkConfig, SimNet, host_config};
use ustack::socket::rc::{
    Access, Local, MrHandle, QpState, RcDest, RcOp, RcQpConfig, RcQpHandle, RcQpStatus, RcSendWr,
    Sge, Wc, WcOpcode, WcStatus,
};
use ustack::stats::DropReason;
use ustack::wire::Ipv6Cidr;
use ustack::wire::rc::{NakCode, RcHeaders, RcOpcode, Syndrome};
use ustack::wire::roce::{BTH_LEN, BthPacket, ICRC_LEN, Opcode, ROCE_PORT, icrc_fill};
use ustack::{Instant, Stack, VecTx};

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const MAX: usize = 8 << 20;

struct Pair {
    net: SimNet,
    qa: RcQpHandle,
    qb: RcQpHandle,
    /// A's region (sources of SEND/WRITE, READ destination).
    ma: MrHandle,
    /// B's region (receives, WRITE target, READ source).
    mb: MrHandle,
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| rng.u8(..)).collect()
}

fn pair(link: LinkConfig, qcfg: &RcQpConfig, region: usize) -> Pair {
    pair_on(link, qcfg, region, (A.into(), B.into()))
}

/// IPv6 addresses of the hosts of [`pair_v6`].
const A6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 1);
const B6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 2);

/// A pair whose QPs are connected over `addrs` (A's, B's): IPv4, or IPv6
/// (both hosts then get `A6`/`B6` beside their IPv4 addresses).
fn pair_on(link: LinkConfig, qcfg: &RcQpConfig, region: usize, addrs: (IpAddr, IpAddr)) -> Pair {
    let mut net = SimNet::new(link);
    for (n, me) in [(1, addrs.0), (2, addrs.1)] {
        let mut c = host_config(n);
        if let IpAddr::V6(v6) = me {
            c.ipv6 = vec![Ipv6Cidr::new(v6, 64)];
        }
        net.add(c);
    }
    let (qa, ma) = {
        let s = &mut net.nodes[0].stack;
        (
            s.rc().create_qp(qcfg).unwrap(),
            s.rc().reg_mr(region, Access::ALL).unwrap(),
        )
    };
    let (qb, mb) = {
        let s = &mut net.nodes[1].stack;
        (
            s.rc().create_qp(qcfg).unwrap(),
            s.rc().reg_mr(region, Access::ALL).unwrap(),
        )
    };
    let sa = net.nodes[0].stack.rc_ref().qp_status(qa).unwrap();
    let sb = net.nodes[1].stack.rc_ref().qp_status(qb).unwrap();
    assert_eq!(sa.state, QpState::Init);
    net.nodes[0]
        .stack
        .rc()
        .connect(
            qa,
            RcDest {
                ip: addrs.1,
                qpn: sb.qpn,
                psn: sb.initial_psn,
            },
        )
        .unwrap();
    net.nodes[1]
        .stack
        .rc()
        .connect(
            qb,
            RcDest {
                ip: addrs.0,
                qpn: sa.qpn,
                psn: sa.initial_psn,
            },
        )
        .unwrap();
    Pair {
        net,
        qa,
        qb,
        ma,
        mb,
    }
}

fn sge(s: &Stack, mr: MrHandle, off: usize, len: usize) -> Sge {
    let i = s.rc_ref().mr_info(mr).unwrap();
    Sge {
        addr: i.addr + off as u64,
        len: len as u32,
        lkey: i.lkey,
    }
}

/// A signaled, unsolicited send work request.
fn wr(wr_id: u64, op: RcOp, local: Local<'_>) -> RcSendWr<'_> {
    RcSendWr {
        wr_id,
        op,
        local,
        signaled: true,
        solicited: false,
    }
}

impl Pair {
    /// Run until A has `na` and B has `nb` completions (or a minute of
    /// virtual time passes); returns them.
    fn run(&mut self, na: usize, nb: usize, secs: u64) -> (Vec<Wc>, Vec<Wc>) {
        let (qa, qb) = (self.qa, self.qb);
        let mut wa = Vec::new();
        let mut wb = Vec::new();
        let deadline = self.net.now + Duration::from_secs(secs);
        self.net.run_until(deadline, &mut [], |n| {
            // (A QP a test destroyed has nothing to poll.)
            let _ = n.nodes[0].stack.rc().poll_cq(qa, usize::MAX, &mut wa);
            let _ = n.nodes[1].stack.rc().poll_cq(qb, usize::MAX, &mut wb);
            wa.len() >= na && wb.len() >= nb
        });
        (wa, wb)
    }

    fn a(&mut self) -> &mut Stack {
        &mut self.net.nodes[0].stack
    }

    fn b(&mut self) -> &mut Stack {
        &mut self.net.nodes[1].stack
    }

    /// Let everything in flight land and check no buffer is held.
    fn drain(&mut self) {
        let deadline = self.net.now + Duration::from_secs(5);
        self.net.run_until(deadline, &mut [], |_| false);
        assert_eq!(self.net.link.in_flight(), 0);
        assert_eq!(self.net.pools_in_use(), 0, "buffers leaked");
    }

    /// One message of `len` bytes with `op` from A to B, checked
    /// byte-exact; returns A's and B's completions.
    fn transfer(&mut self, kind: &str, len: usize, seed: u64) {
        let (qa, qb, ma, mb) = (self.qa, self.qb, self.ma, self.mb);
        let data = pattern(len, seed);
        let ib = self.b().rc_ref().mr_info(mb).unwrap();
        let (wr_op, recv) = match kind {
            "send" => (RcOp::Send, true),
            "send_imm" => (RcOp::SendImm(seed as u32), true),
            "write" => (
                RcOp::Write {
                    remote_addr: ib.addr,
                    rkey: ib.rkey,
                },
                false,
            ),
            "write_imm" => (
                RcOp::WriteImm {
                    remote_addr: ib.addr,
                    rkey: ib.rkey,
                    imm: seed as u32,
                },
                true,
            ),
            "read" => (
                RcOp::Read {
                    remote_addr: ib.addr,
                    rkey: ib.rkey,
                },
                false,
            ),
            _ => unreachable!(),
        };
        // The source side holds the pattern, the other side zeros.
        if kind == "read" {
            self.b().rc().mr_mut(mb).unwrap()[..len].copy_from_slice(&data);
            self.a().rc().mr_mut(ma).unwrap()[..len].fill(0);
        } else {
            self.a().rc().mr_mut(ma).unwrap()[..len].copy_from_slice(&data);
            self.b().rc().mr_mut(mb).unwrap()[..len].fill(0);
        }
        if recv {
            let rs = if kind == "write_imm" {
                sge(self.b(), mb, 0, 0)
            } else {
                sge(self.b(), mb, 0, len)
            };
            self.b().rc().post_recv(qb, 7, rs).unwrap();
        }
        let local = sge(self.a(), ma, 0, len);
        self.a()
            .rc()
            .post_send(qa, &wr(42, wr_op, Local::Sge(local)))
            .unwrap();
        let (wa, wb) = self.run(1, usize::from(recv), 600);
        assert_eq!(
            wa.len(),
            1,
            "{kind} {len}: no completion at A (status {:?})",
            self.a().rc_ref().qp_status(qa)
        );
        assert_eq!(wa[0].status, WcStatus::Success, "{kind} {len}");
        assert_eq!(wa[0].wr_id, 42);
        assert_eq!(wa[0].byte_len, len);
        assert_eq!(
            wa[0].opcode,
            match kind {
                "send" | "send_imm" => WcOpcode::Send,
                "read" => WcOpcode::RdmaRead,
                _ => WcOpcode::RdmaWrite,
            }
        );
        if recv {
            assert_eq!(wb.len(), 1, "{kind} {len}: no receive completion");
            assert_eq!(wb[0].status, WcStatus::Success);
            assert_eq!(wb[0].wr_id, 7);
            assert_eq!(wb[0].byte_len, len);
            let imm = (kind.ends_with("imm")).then_some(seed as u32);
            assert_eq!(wb[0].imm, imm);
            assert_eq!(
                wb[0].opcode,
                if kind == "write_imm" {
                    WcOpcode::RecvRdmaWithImm
                } else {
                    WcOpcode::Recv
                }
            );
        } else {
            assert!(wb.is_empty(), "{kind}: the responder completes nothing");
        }
        let got = if kind == "read" {
            self.a().rc_ref().mr(ma).unwrap()[..len].to_vec()
        } else {
            self.b().rc_ref().mr(mb).unwrap()[..len].to_vec()
        };
        assert!(got == data, "{kind} {len}: bytes differ");
    }
}

const SIZES: [usize; 8] = [1, 1023, 1024, 1025, 4096, 65_536, 1 << 20, MAX];
const KINDS: [&str; 5] = ["send", "send_imm", "write", "write_imm", "read"];

fn sweep(link: LinkConfig, qcfg: &RcQpConfig) -> Pair {
    sweep_on(pair(link, qcfg, MAX))
}

fn sweep_on(mut p: Pair) -> Pair {
    let mut seed = 1;
    for len in SIZES {
        for kind in KINDS {
            seed += 1;
            p.transfer(kind, len, seed);
        }
    }
    p.drain();
    p
}

#[test]
fn every_operation_from_1_byte_to_8_mib_is_byte_exact_on_a_clean_link() {
    // A lossless fabric, as RoCE is run on (PFC): no queue ever drops.
    let lossless = LinkConfig {
        queue_frames: 1 << 20,
        ..LinkConfig::default()
    };
    let mut p = sweep(lossless, &RcQpConfig::default());
    assert_eq!(p.net.link.stats().queue_drops, 0);
    let (qa, qb) = (p.qa, p.qb);
    let sa = p.a().rc_ref().qp_status(qa).unwrap();
    let sb = p.b().rc_ref().qp_status(qb).unwrap();
    assert_eq!(sa.state, QpState::Rts);
    assert_eq!(sa.stats.retransmits, 0, "{sa:?}");
    assert_eq!(sa.stats.ack_timeouts, 0, "{sa:?}");
    assert_eq!(sb.stats.seq_naks_sent, 0, "{sb:?}");
    // Every PSN was acknowledged and nothing is outstanding.
    assert_eq!(sa.una_psn, sa.next_psn);
    assert_eq!(sb.expected_psn, sa.next_psn);
    assert_eq!(sa.send_outstanding, 0);
    assert_eq!(sa.mtu, 1024);
    let st = p.a().stats();
    assert_eq!(st.rc.qps, 1);
    assert_eq!(st.rc.mrs, 1);
    assert_eq!(st.drops.total(), 0);
}

fn lossy(loss: f64, seed: u64) -> LinkConfig {
    LinkConfig {
        loss,
        reorder: loss / 2.0,
        duplicate: loss / 2.0,
        delay: Duration::from_micros(20),
        // A 10 Gbit/s wire: the data in flight is bounded by what the
        // link holds, as on a real one.
        rate_bps: 10_000_000_000,
        seed,
        ..LinkConfig::default()
    }
}

/// The whole sweep on a lossy link; the requester's and responder's
/// status after it (printed for the record).
fn lossy_sweep(loss: f64, seed: u64, cfg: &RcQpConfig) -> (RcQpStatus, RcQpStatus) {
    let mut p = sweep(lossy(loss, seed), cfg);
    let (qa, qb) = (p.qa, p.qb);
    let sa = p.a().rc_ref().qp_status(qa).unwrap();
    let sb = p.b().rc_ref().qp_status(qb).unwrap();
    eprintln!(
        "{}% loss: requester {:?}\nresponder {:?}\nlink {:?}",
        loss * 100.0,
        sa.stats,
        sb.stats,
        p.net.link.stats()
    );
    (sa, sb)
}

#[test]
fn every_operation_survives_1_percent_loss_reordering_and_duplication() {
    let (sa, sb) = lossy_sweep(0.01, 11, &RcQpConfig::default());
    assert!(sa.stats.retransmits > 0, "go-back-N never ran: {sa:?}");
    assert!(sb.stats.seq_naks_sent > 0 && sa.stats.seq_naks_received > 0);
    assert!(
        sb.stats.duplicates > 0,
        "duplicates were never seen: {sb:?}"
    );
    assert!(
        sa.stats.read_gaps > 0,
        "no READ response was ever lost: {sa:?}"
    );
}

/// RoCEv2 over IPv6 GIDs: every operation and size byte-exact under 1%
/// loss, reordering and duplication, the ICRC over the IPv6 header, and
/// nothing sent over IPv4.
#[test]
fn every_operation_over_ipv6_gids_survives_1_percent_loss() {
    let link = lossy(0.01, 12);
    let p = pair_on(link, &RcQpConfig::default(), MAX, (A6.into(), B6.into()));
    let mut p = sweep_on(p);
    let (qa, qb) = (p.qa, p.qb);
    let sa = p.a().rc_ref().qp_status(qa).unwrap();
    let sb = p.b().rc_ref().qp_status(qb).unwrap();
    assert!(sa.stats.retransmits > 0, "go-back-N never ran: {sa:?}");
    assert_eq!(sa.dest.map(|d| d.ip), Some(B6.into()));
    for s in [p.a().stats(), p.b().stats()] {
        assert!(s.ipv6.tx_packets > 1000 && s.ipv6.rx_packets > 1000);
        assert_eq!(s.ipv4.tx_packets, 0, "RC over IPv6 sent IPv4");
        assert_eq!(s.drops.get(DropReason::UdBadIcrc), 0);
    }
    assert!(sb.stats.rx_bytes > 0);
}

#[test]
fn every_operation_survives_10_percent_loss() {
    let cfg = RcQpConfig {
        window: 128,
        ..RcQpConfig::default()
    };
    let (sa, sb) = lossy_sweep(0.10, 12, &cfg);
    assert!(sa.stats.retransmits > 1000, "{sa:?}");
    assert!(sa.stats.ack_timeouts > 0, "{sa:?}");
    assert!(sb.stats.seq_naks_sent > 0);
    assert_eq!(sa.state, QpState::Rts);
    assert_eq!(sb.state, QpState::Rts);
}

#[test]
fn a_send_without_a_receive_is_rnr_nakked_until_one_is_posted() {
    let mut p = pair(LinkConfig::default(), &RcQpConfig::default(), 4096);
    let (qa, qb, ma, mb) = (p.qa, p.qb, p.ma, p.mb);
    p.a().rc().mr_mut(ma).unwrap()[..100].copy_from_slice(&[9; 100]);
    let local = sge(p.a(), ma, 0, 100);
    p.a()
        .rc()
        .post_send(qa, &wr(1, RcOp::Send, Local::Sge(local)))
        .unwrap();
    // 5 ms of no receive: the RNR timer (0.64 ms) runs several times.
    let (wa, _) = p.run(1, 0, 0);
    assert!(wa.is_empty());
    let deadline = p.net.now + Duration::from_millis(5);
    p.net.run_until(deadline, &mut [], |_| false);
    let rnr = p.b().rc_ref().qp_status(qb).unwrap().stats.rnr_naks_sent;
    assert!(rnr >= 3, "{rnr} RNR NAKs");
    assert_eq!(
        p.a()
            .rc_ref()
            .qp_status(qa)
            .unwrap()
            .stats
            .rnr_naks_received,
        rnr
    );
    let rs = sge(p.b(), mb, 0, 4096);
    p.b().rc().post_recv(qb, 2, rs).unwrap();
    let (wa, wb) = p.run(1, 1, 10);
    assert_eq!(wa[0].status, WcStatus::Success);
    assert_eq!((wb[0].status, wb[0].byte_len), (WcStatus::Success, 100));
    assert_eq!(&p.b().rc_ref().mr(mb).unwrap()[..100], &[9; 100]);
    p.drain();
}

#[test]
fn rnr_retries_run_out_and_both_sides_report_it() {
    let cfg = RcQpConfig {
        rnr_retry: 2,
        ..RcQpConfig::default()
    };
    let mut p = pair(LinkConfig::default(), &cfg, 4096);
    let (qa, ma) = (p.qa, p.ma);
    let local = sge(p.a(), ma, 0, 10);
    for id in 0..3 {
        p.a()
            .rc()
            .post_send(qa, &wr(id, RcOp::Send, Local::Sge(local)))
            .unwrap();
    }
    let (wa, _) = p.run(3, 0, 10);
    assert_eq!(wa[0].status, WcStatus::RnrRetryExceeded);
    assert_eq!(wa[1].status, WcStatus::Flushed);
    assert_eq!(wa[2].status, WcStatus::Flushed);
    let sa = p.a().rc_ref().qp_status(qa).unwrap();
    assert_eq!(sa.state, QpState::Error);
    assert_eq!(sa.stats.rnr_naks_received, 3, "first try and 2 retries");
    // A QP in error takes no new work.
    assert!(
        p.a()
            .rc()
            .post_send(qa, &wr(9, RcOp::Send, Local::Inline(b"x")))
            .is_err()
    );
    p.drain();
}

#[test]
fn a_silent_peer_exhausts_the_retry_count() {
    let cfg = RcQpConfig {
        retry_cnt: 3,
        timeout: 10,
        ..RcQpConfig::default()
    };
    let mut p = pair(LinkConfig::default(), &cfg, 4096);
    let (qa, qb) = (p.qa, p.qb);
    // The peer's QP is gone: nothing answers.
    p.b().rc().destroy_qp(qb).unwrap();
    p.a()
        .rc()
        .post_send(qa, &wr(5, RcOp::Send, Local::Inline(b"hello")))
        .unwrap();
    let (wa, _) = p.run(1, 0, 10);
    assert_eq!(wa[0].status, WcStatus::RetryExceeded);
    let sa = p.a().rc_ref().qp_status(qa).unwrap();
    assert_eq!(sa.stats.ack_timeouts, 4, "the first timeout and 3 retries");
    assert_eq!(sa.stats.retransmits, 3);
    assert_eq!(sa.state, QpState::Error);
    assert!(p.b().stats().drops.get(DropReason::UdUnknownQpn) >= 4);
    p.drain();
}

#[test]
fn a_write_with_a_bad_key_or_range_is_refused_and_writes_nothing() {
    for case in [
        "bad rkey",
        "past the end",
        "no remote write",
        "read past the end",
    ] {
        let mut p = pair(LinkConfig::default(), &RcQpConfig::default(), 4096);
        let (qa, qb, mb) = (p.qa, p.qb, p.mb);
        let ib = p.b().rc_ref().mr_info(mb).unwrap();
        let ro = p.b().rc().reg_mr(4096, Access::REMOTE_READ).unwrap();
        let iro = p.b().rc_ref().mr_info(ro).unwrap();
        let ma = p.ma;
        let local = sge(p.a(), ma, 0, 100);
        let op = match case {
            "bad rkey" => RcOp::Write {
                remote_addr: ib.addr,
                rkey: ib.rkey ^ 0x55,
            },
            "past the end" => RcOp::Write {
                remote_addr: ib.addr + 4000,
                rkey: ib.rkey,
            },
            "no remote write" => RcOp::Write {
                remote_addr: iro.addr,
                rkey: iro.rkey,
            },
            _ => RcOp::Read {
                remote_addr: iro.addr + 4090,
                rkey: iro.rkey,
            },
        };
        p.a().rc().mr_mut(ma).unwrap()[..100].fill(0xee);
        p.a()
            .rc()
            .post_send(qa, &wr(3, op, Local::Sge(local)))
            .unwrap();
        let (wa, _) = p.run(1, 0, 10);
        assert_eq!(wa[0].status, WcStatus::RemoteAccessError, "{case}");
        assert_eq!(
            p.a().rc_ref().qp_status(qa).unwrap().state,
            QpState::Error,
            "{case}"
        );
        let sb = p.b().rc_ref().qp_status(qb).unwrap();
        assert_eq!(sb.state, QpState::Error, "{case}");
        assert_eq!(sb.stats.access_errors, 1, "{case}");
        assert!(
            p.b().rc_ref().mr(mb).unwrap().iter().all(|&b| b == 0),
            "{case}: bytes were written"
        );
        assert!(
            p.b().rc_ref().mr(ro).unwrap().iter().all(|&b| b == 0),
            "{case}: bytes were written"
        );
        p.drain();
    }
}

/// A crafted RC packet from A's address to B's QP.
fn crafted(p: &mut Pair, op: RcOpcode, psn: u32, hdrs: RcHeaders<'_>) -> Vec<u8> {
    let qb = p.qb;
    let qpn = p.b().rc_ref().qp_status(qb).unwrap().qpn;
    let n = hdrs.buffer_len();
    let pad = (4 - hdrs.payload.len() % 4) % 4;
    let udp_len = 8 + BTH_LEN + n + pad + ICRC_LEN;
    let ip_len = 20 + udp_len;
    let mut f = vec![0u8; 14 + ip_len];
    f[0..6].copy_from_slice(&p.b().mac().0);
    f[6..12].copy_from_slice(&p.a().mac().0);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip = &mut f[14..];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
    ip[6] = 0x40;
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&A.octets());
    ip[16..20].copy_from_slice(&B.octets());
    let mut v4 = smoltcp::wire::Ipv4Packet::new_unchecked(&mut ip[..]);
    v4.fill_checksum();
    ip[20..22].copy_from_slice(&0xc000u16.to_be_bytes());
    ip[22..24].copy_from_slice(&ROCE_PORT.to_be_bytes());
    ip[24..26].copy_from_slice(&(udp_len as u16).to_be_bytes());
    let mut bth = BthPacket::new_unchecked(&mut ip[28..]);
    bth.set_opcode(Opcode::from(op as u8));
    bth.set_flags(false, true, pad as u8);
    bth.set_pkey(0xffff);
    bth.set_dest_qp(qpn);
    bth.set_ack_req(true);
    bth.set_psn(psn);
    hdrs.emit(&mut ip[28 + BTH_LEN..28 + BTH_LEN + n]);
    assert!(icrc_fill(ip));
    f
}

fn hdrs(opcode: RcOpcode, payload: &[u8]) -> RcHeaders<'_> {
    RcHeaders {
        opcode,
        reth: None,
        atomic: None,
        aeth: None,
        atomic_ack: None,
        imm: None,
        payload,
    }
}

#[test]
fn crafted_packets_far_out_of_window_get_one_nak_and_harm_nothing() {
    let mut p = pair(LinkConfig::default(), &RcQpConfig::default(), 4096);
    let (qa, qb, mb) = (p.qa, p.qb, p.mb);
    let epsn = p.b().rc_ref().qp_status(qb).unwrap().expected_psn;
    let mut tx = VecTx::default();
    // 100 SENDs far ahead of the expected PSN (and 100 far behind): one
    // sequence NAK for the gap, duplicates re-acknowledged, nothing placed.
    for i in 0..100u32 {
        let ahead = crafted(
            &mut p,
            RcOpcode::SendOnly,
            (epsn + 0x40_0000 + i) & 0xff_ffff,
            hdrs(RcOpcode::SendOnly, b"evil"),
        );
        let behind = crafted(
            &mut p,
            RcOpcode::SendOnly,
            (epsn + 0xc0_0000 + i) & 0xff_ffff,
            hdrs(RcOpcode::SendOnly, b"evil"),
        );
        p.b()
            .receive(Instant::ZERO, &ahead, ustack::RxMeta::default(), &mut tx);
        p.b()
            .receive(Instant::ZERO, &behind, ustack::RxMeta::default(), &mut tx);
    }
    // Wrong opcodes for the place: a MIDDLE with nothing begun is an
    // invalid request (the QP moves to error, as the spec says).
    let sb = p.b().rc_ref().qp_status(qb).unwrap();
    assert_eq!(sb.stats.seq_naks_sent, 1);
    assert_eq!(sb.stats.out_of_sequence, 100);
    assert_eq!(sb.stats.duplicates, 100);
    assert_eq!(sb.state, QpState::Rts);
    assert!(p.b().rc_ref().mr(mb).unwrap().iter().all(|&b| b == 0));
    // The QP still works end to end afterwards.
    let _ = std::mem::take(&mut tx);
    p.transfer("write", 3000, 77);
    p.transfer("send", 1000, 78);
    let epsn = p_epsn(&mut p);
    let middle = crafted(
        &mut p,
        RcOpcode::SendMiddle,
        epsn,
        hdrs(RcOpcode::SendMiddle, &[1; 1024]),
    );
    let now = p.net.now;
    p.b()
        .receive(now, &middle, ustack::RxMeta::default(), &mut tx);
    let sb = p.b().rc_ref().qp_status(qb).unwrap();
    assert_eq!(sb.state, QpState::Error);
    assert_eq!(sb.stats.naks_sent, 1);
    let _ = qa;
    p.drain();
}

fn p_epsn(p: &mut Pair) -> u32 {
    let qb = p.qb;
    p.b().rc_ref().qp_status(qb).unwrap().expected_psn
}

#[test]
fn a_nak_storm_costs_bounded_retries_and_then_the_qp() {
    let cfg = RcQpConfig {
        retry_cnt: 2,
        ..RcQpConfig::default()
    };
    let mut p = pair(LinkConfig::default(), &cfg, 4096);
    let qa = p.qa;
    // Take B's QP out so only the storm answers A.
    let qb = p.qb;
    p.b().rc().set_error(qb).unwrap();
    p.a()
        .rc()
        .post_send(qa, &wr(1, RcOp::Send, Local::Inline(&[5; 3000])))
        .unwrap();
    let step = p.net.now + Duration::from_micros(10);
    p.net.run_until(step, &mut [], |_| false);
    let sa = p.a().rc_ref().qp_status(qa).unwrap();
    let first = sa.una_psn;
    assert_eq!(sa.stats.tx_packets, 3);
    // 1,000 sequence NAKs for the first PSN, from B's address to A's QP.
    let qpn_a = sa.qpn;
    let mut tx = VecTx::default();
    for _ in 0..1000 {
        let mut f = crafted_ack(
            &mut p,
            qpn_a,
            first,
            Syndrome::Nak(NakCode::PsnSequenceError),
        );
        let n = f.len();
        assert!(icrc_fill(&mut f[14..n]));
        let now = p.net.now;
        p.a().receive(now, &f, ustack::RxMeta::default(), &mut tx);
        let step = p.net.now + Duration::from_micros(1);
        p.net.run_until(step, &mut [], |_| false);
    }
    // The same PSN NAKed 1,000 times went back once: 3 packets resent.
    let sa = p.a().rc_ref().qp_status(qa).unwrap();
    assert_eq!(sa.stats.seq_naks_received, 1000);
    assert_eq!(sa.stats.retransmits, 3, "{sa:?}");
    assert_eq!(sa.state, QpState::Rts);
    // Then the ACK timeout spends the rest of the retry count (the NAK
    // took one) and the QP fails.
    let (wa, _) = p.run(1, 0, 10);
    assert_eq!(wa[0].status, WcStatus::RetryExceeded);
    let sa = p.a().rc_ref().qp_status(qa).unwrap();
    assert_eq!(sa.state, QpState::Error);
    assert_eq!(sa.stats.retransmits, 6, "{sa:?}");
    p.drain();
}

/// An ACK-type packet from B's address to A's QP `qpn`.
fn crafted_ack(p: &mut Pair, qpn: u32, psn: u32, s: Syndrome) -> Vec<u8> {
    let h = RcHeaders {
        aeth: Some((s, 0)),
        ..hdrs(RcOpcode::Acknowledge, &[])
    };
    let mut f = crafted(p, RcOpcode::Acknowledge, psn, h);
    // Turn it around: from B to A, to A's QP.
    let (ma, mb) = (p.a().mac().0, p.b().mac().0);
    f[0..6].copy_from_slice(&ma);
    f[6..12].copy_from_slice(&mb);
    f[14 + 12..14 + 16].copy_from_slice(&B.octets());
    f[14 + 16..14 + 20].copy_from_slice(&A.octets());
    let ip = &mut f[14..];
    let mut v4 = smoltcp::wire::Ipv4Packet::new_unchecked(&mut ip[..]);
    v4.fill_checksum();
    BthPacket::new_unchecked(&mut ip[28..]).set_dest_qp(qpn);
    f
}

#[test]
fn a_small_window_asks_for_the_ack_that_opens_it() {
    // 4 packets in flight at most, no retries allowed: every window's last
    // packet must ask for an ACK, or the QP would stall until the timeout.
    let cfg = RcQpConfig {
        window: 4,
        retry_cnt: 0,
        ..RcQpConfig::default()
    };
    let link = LinkConfig {
        delay: Duration::from_micros(20),
        ..LinkConfig::default()
    };
    let mut p = pair(link, &cfg, 1 << 16);
    for (i, kind) in KINDS.iter().enumerate() {
        p.transfer(kind, 1 << 16, i as u64);
    }
    let qa = p.qa;
    let sa = p.a().rc_ref().qp_status(qa).unwrap();
    assert_eq!(
        (sa.stats.ack_timeouts, sa.stats.retransmits),
        (0, 0),
        "{sa:?}"
    );
    p.drain();
}

#[test]
fn a_qp_failing_mid_send_flushes_the_receive_it_was_filling() {
    let mut p = pair(LinkConfig::default(), &RcQpConfig::default(), 8192);
    let (qb, mb) = (p.qb, p.mb);
    for id in [1, 2] {
        let s = sge(p.b(), mb, 0, 8192);
        p.b().rc().post_recv(qb, id, s).unwrap();
    }
    // The first packet of a 3-packet SEND, and nothing more.
    let epsn = p_epsn(&mut p);
    let first = crafted(
        &mut p,
        RcOpcode::SendFirst,
        epsn,
        hdrs(RcOpcode::SendFirst, &[3; 1024]),
    );
    let mut tx = VecTx::default();
    p.b()
        .receive(Instant::ZERO, &first, ustack::RxMeta::default(), &mut tx);
    assert_eq!(
        p.b().rc_ref().qp_status(qb).unwrap().recv_posted,
        1,
        "one receive is being filled"
    );
    p.b().rc().set_error(qb).unwrap();
    let (_, wb) = p.run(0, 2, 1);
    let got: Vec<_> = wb.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, [(1, WcStatus::Flushed), (2, WcStatus::Flushed)]);
    p.drain();
}

/// 200 fetch-and-adds under 10% loss with reordering and duplication:
/// each runs exactly once (the counter ends at 200 x 3 and every value
/// found is a distinct step), duplicates answered from the saved result.
#[test]
fn atomics_run_once_each_under_loss_and_duplication() {
    let cfg = RcQpConfig {
        window: 16,
        ..RcQpConfig::default()
    };
    let mut p = pair(lossy(0.10, 21), &cfg, 4096);
    let (qa, qb, ma, mb) = (p.qa, p.qb, p.ma, p.mb);
    let ib = p.b().rc_ref().mr_info(mb).unwrap();
    let target = ib.addr + 64;
    let mut found = Vec::new();
    for i in 0..200u64 {
        // Each result lands in its own 8 bytes of A's region.
        let local = sge(p.a(), ma, (i as usize % 64) * 8, 8);
        p.a()
            .rc()
            .post_send(
                qa,
                &wr(
                    i,
                    RcOp::FetchAdd {
                        remote_addr: target,
                        rkey: ib.rkey,
                        add: 3,
                    },
                    Local::Sge(local),
                ),
            )
            .unwrap();
        let (wa, _) = p.run(1, 0, 60);
        assert_eq!(
            (wa[0].wr_id, wa[0].status, wa[0].opcode),
            (i, WcStatus::Success, WcOpcode::FetchAdd)
        );
        let off = (i as usize % 64) * 8;
        let got = u64::from_ne_bytes(
            p.a().rc_ref().mr(ma).unwrap()[off..off + 8]
                .try_into()
                .unwrap(),
        );
        found.push(got);
    }
    let counter = u64::from_ne_bytes(p.b().rc_ref().mr(mb).unwrap()[64..72].try_into().unwrap());
    assert_eq!(counter, 600, "every add ran exactly once");
    assert_eq!(found, (0..200).map(|i| i * 3).collect::<Vec<_>>());
    let sb = p.b().rc_ref().qp_status(qb).unwrap();
    assert!(
        sb.stats.duplicates > 0,
        "no duplicate reached the responder: {sb:?}"
    );
    // Compare-and-swap: a match swaps, a mismatch leaves the value.
    let local = sge(p.a(), ma, 0, 8);
    for (compare, swap, expect_found, expect_after) in
        [(600, 7, 600, 7), (600, 9, 7, 7), (7, 1, 7, 1)]
    {
        p.a()
            .rc()
            .post_send(
                qa,
                &wr(
                    1000,
                    RcOp::CompareSwap {
                        remote_addr: target,
                        rkey: ib.rkey,
                        compare,
                        swap,
                    },
                    Local::Sge(local),
                ),
            )
            .unwrap();
        let (wa, _) = p.run(1, 0, 60);
        assert_eq!(
            (wa[0].status, wa[0].opcode),
            (WcStatus::Success, WcOpcode::CompareSwap)
        );
        let got = u64::from_ne_bytes(p.a().rc_ref().mr(ma).unwrap()[0..8].try_into().unwrap());
        let after = u64::from_ne_bytes(p.b().rc_ref().mr(mb).unwrap()[64..72].try_into().unwrap());
        assert_eq!((got, after), (expect_found, expect_after));
    }
    p.drain();
}

#[test]
fn atomics_need_8_aligned_bytes_and_remote_atomic_access() {
    let mut p = pair(LinkConfig::default(), &RcQpConfig::default(), 4096);
    let (qa, qb, ma) = (p.qa, p.qb, p.ma);
    let ro = p
        .b()
        .rc()
        .reg_mr(4096, Access::REMOTE_READ | Access::REMOTE_WRITE)
        .unwrap();
    let iro = p.b().rc_ref().mr_info(ro).unwrap();
    let local = sge(p.a(), ma, 0, 8);
    let op = |addr| RcOp::FetchAdd {
        remote_addr: addr,
        rkey: iro.rkey,
        add: 1,
    };
    assert_eq!(
        p.a()
            .rc()
            .post_send(qa, &wr(1, op(iro.addr + 4), Local::Sge(local))),
        Err(ustack::Error::Rc(ustack::socket::rc::RcError::AtomicShape))
    );
    let long = sge(p.a(), ma, 0, 16);
    assert_eq!(
        p.a()
            .rc()
            .post_send(qa, &wr(1, op(iro.addr), Local::Sge(long))),
        Err(ustack::Error::Rc(ustack::socket::rc::RcError::AtomicShape))
    );
    assert_eq!(
        p.a()
            .rc()
            .post_send(qa, &wr(1, op(iro.addr), Local::Inline(&[0; 8]))),
        Err(ustack::Error::Rc(ustack::socket::rc::RcError::InlineRead))
    );
    // A region without remote atomic access: refused, nothing changed.
    p.a()
        .rc()
        .post_send(qa, &wr(2, op(iro.addr), Local::Sge(local)))
        .unwrap();
    let (wa, _) = p.run(1, 0, 10);
    assert_eq!(wa[0].status, WcStatus::RemoteAccessError);
    let sb = p.b().rc_ref().qp_status(qb).unwrap();
    assert_eq!((sb.state, sb.stats.access_errors), (QpState::Error, 1));
    assert!(p.b().rc_ref().mr(ro).unwrap().iter().all(|&b| b == 0));
    p.drain();
}

/// An RC QP's traffic class (`RcQpConfig::traffic_class`) marks every
/// packet it sends, requests and acknowledgements alike (the IPv4 TOS
/// byte); the ICRC masks it, so the operation completes.
#[test]
fn an_rc_qps_traffic_class_marks_its_packets() {
    const TCLASS: u8 = 0x6a;
    let cfg = RcQpConfig {
        traffic_class: TCLASS,
        ..RcQpConfig::default()
    };
    let mut p = pair(LinkConfig::default(), &cfg, 4096);
    let (qa, qb, ma, mb) = (p.qa, p.qb, p.ma, p.mb);
    let rs = sge(p.b(), mb, 0, 4096);
    p.b().rc().post_recv(qb, 1, rs).unwrap();
    p.a().rc().mr_mut(ma).unwrap()[..100].copy_from_slice(&[7; 100]);
    let local = sge(p.a(), ma, 0, 100);
    p.a()
        .rc()
        .post_send(qa, &wr(1, RcOp::Send, Local::Sge(local)))
        .unwrap();
    let (wa, wb) = p.run(1, 1, 10);
    assert_eq!(
        (wa[0].status, wb[0].status),
        (WcStatus::Success, WcStatus::Success)
    );
    // The next request, as A puts it on the wire.
    let rs = sge(p.b(), mb, 0, 4096);
    p.b().rc().post_recv(qb, 2, rs).unwrap();
    p.a()
        .rc()
        .post_send(qa, &wr(2, RcOp::Send, Local::Sge(local)))
        .unwrap();
    let now = p.net.now;
    let mut tx = VecTx::new();
    p.a().poll(now, &mut tx);
    assert!(!tx.frames.is_empty());
    for f in &tx.frames {
        assert_eq!(u16::from_be_bytes([f[12], f[13]]), 0x0800);
        assert_eq!(f[15], TCLASS, "the TOS byte of A's request");
    }
    // B takes it (ICRC good) and its acknowledgement is marked too.
    let mut back = VecTx::new();
    for f in &tx.frames {
        p.b().receive(now, f, ustack::RxMeta::default(), &mut back);
    }
    p.b().poll(now, &mut back);
    assert!(!back.frames.is_empty(), "B acknowledges");
    for f in &back.frames {
        assert_eq!(f[15], TCLASS, "the TOS byte of B's acknowledgement");
    }
    let mut wc = Vec::new();
    p.b().rc().poll_cq(qb, 8, &mut wc).unwrap();
    assert_eq!(wc.len(), 1);
    assert_eq!((wc[0].status, wc[0].byte_len), (WcStatus::Success, 100));
}
