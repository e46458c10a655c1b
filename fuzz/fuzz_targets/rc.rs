//! RoCEv2 RC queue pairs with live traffic: two stacks, A (10.0.0.1) and B
//! (10.0.0.2), on a sim link (20 µs delay, 1 Gbit/s) with a connected RC QP
//! pair, regions on both (a live one with every access, two guard regions
//! around it that only allow remote reads, one that allows no remote
//! access), and SENDs (into posted receives), WRITEs and READs of sizes the
//! input picks in flight both ways. Then the input drives:
//! - crafted RC packets into A or B: any opcode 0x00-0x14 (and a few
//!   non-RC), PSNs near the live ones or anywhere, AckReq, RETHs near the
//!   live regions' addresses and keys, AETHs with any syndrome byte and
//!   MSN, immediate data, payloads of any length, pad counts that lie,
//!   ICRC repaired or not, wrong peers, wrong QPNs;
//! - mutated copies of real frames the link carried (to their receiver or
//!   turned around to the other stack);
//! - app operations: post sends (SEND, SEND-imm, WRITE, WRITE-imm, READ;
//!   regions, inline, bad keys and ranges), post receives, poll CQs,
//!   set_error, destroy and recreate a QP (one side or both), deregister
//!   and register the live region again, a device that takes only a few
//!   frames per step;
//! - time jumps (up to seconds: ACK timeouts, RNR timers, retries).
//!
//! Asserts: no panic; every frame either stack receives counted once;
//! every frame either stack sends well-formed (IPv4 checksum, RoCE frames
//! on UDP 4791 with a BTH whose RC opcode's headers parse, payload within
//! the path MTU, pad consistent, ICRC verifies); every completion names a
//! work request posted on that QP, once, with its opcode and length, and
//! no successful completion of an unsignaled one; a QP never holds more
//! work plus completions than was posted; refused local regions are
//! refused; at the end, after both QPs go to error, every receive and
//! every signaled send has completed, queues are empty, the guard regions
//! and the no-remote-access region still hold their pattern, and every
//! pool buffer is back.
//!
//! Input: three config bytes (path MTU, retry counts, timers, window, READ
//! limits, a first PSN near the wrap), six u16 sizes of the initial work,
//! one byte of initial progress, then operations (see `Fuzz::op`).
#![no_main]

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use smoltcp::wire::{
    ArpPacket, ArpRepr, ETHERNET_HEADER_LEN, EthernetAddress, EthernetFrame, EthernetProtocol,
    IPV4_HEADER_LEN, Icmpv4Packet, IpAddress, IpProtocol, Ipv4Packet, TcpPacket, UdpPacket,
};
use ustack::node::Node;
use ustack::sim::{LinkConfig, SimNet, host_config, host_mac};
use ustack::socket::rc::{
    Access, Local, MrHandle, MrInfo, QpState, RcDest, RcOp, RcQpConfig, RcQpHandle, RcQpStatus,
    RcSendWr, Sge, Wc, WcOpcode, WcStatus,
};
use ustack::wire::rc::{RcHeaders, RcOpcode, Syndrome};
use ustack::wire::roce::{
    BTH_LEN, BthPacket, ICRC_LEN, PSN_MASK, ROCE_PORT, icrc_fill, icrc_verify,
};
use ustack::{Device, PacketBuf, VecTx};
use ustack_fuzz::{Reader, fix_checksums, receive_counted};

/// The live region: send sources at 0, two receive slots at 4 KiB and
/// 8 KiB, WRITE target and READ destination at 12 KiB.
const LIVE: usize = 16 << 10;
const SLOT: usize = 4096;
const GUARD: usize = 4096;
/// Buffers per sim port (small, so set-up stays cheap; a dry pool drops).
const POOL: usize = 256;
/// Steps one `run_for` may take before it jumps to its deadline, and all
/// of them in one input (bounds the time an input takes).
const STEPS_PER_RUN: u32 = 400;
const STEPS_TOTAL: u32 = 6000;
const MAX_OPS: usize = 64;
/// Captured frames kept for mutation.
const TEMPLATES: usize = 128;

/// `RC_FUZZ_DEBUG=1`: print completions and the QPs' final status.
fn debug() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("RC_FUZZ_DEBUG").is_some())
}

fn ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, i as u8 + 1)
}

fn mac(i: usize) -> EthernetAddress {
    host_mac(i as u8 + 1)
}

/// The bytes a protected region holds, different per side and region.
fn pattern(side: usize, tag: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ tag ^ ((side as u8) << 7) ^ ((i >> 8) as u8))
        .collect()
}

/// A side's regions: the live one and the three that must never change.
#[derive(Debug, Clone, Copy)]
struct Regions {
    live: MrHandle,
    live_info: MrInfo,
    /// Guard below, no-remote-access, guard above (handle, info, tag).
    fixed: [(MrHandle, MrInfo, u8); 3],
}

/// A work request posted and not yet seen completed.
#[derive(Debug, Clone, Copy)]
struct Posted {
    recv: bool,
    opcode: WcOpcode,
    signaled: bool,
    len: usize,
}

#[derive(Debug)]
struct Side {
    qp: Option<RcQpHandle>,
    /// The current (or last) QP's number: where crafted packets go.
    qpn: u32,
    posted: HashMap<u64, Posted>,
    regions: Regions,
}

impl Side {
    fn complete(&mut self, wc: &Wc) {
        let p = self
            .posted
            .remove(&wc.wr_id)
            .unwrap_or_else(|| panic!("completion for no posted work request (or twice): {wc:?}"));
        assert_eq!(wc.qp_num, self.qpn, "completion on the wrong QP: {wc:?}");
        if p.recv {
            assert!(
                matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm),
                "receive completed as {wc:?}"
            );
            if wc.status == WcStatus::Success && wc.opcode == WcOpcode::Recv {
                assert!(
                    wc.byte_len <= p.len,
                    "received more than posted: {wc:?} {p:?}"
                );
            }
        } else {
            assert_eq!(wc.opcode, p.opcode, "send completed as another op: {wc:?}");
            assert_eq!(wc.byte_len, p.len, "send completion length: {wc:?}");
            assert!(
                p.signaled || wc.status != WcStatus::Success,
                "unsignaled send reported a success: {wc:?}"
            );
        }
    }
}

struct Fuzz {
    net: SimNet,
    sides: [Side; 2],
    outs: [VecTx; 2],
    tx_limit: Option<usize>,
    /// (receiver, frame) of what the wire carried.
    templates: Vec<(usize, Vec<u8>)>,
    captured: usize,
    next_wr: u64,
    qcfg: RcQpConfig,
    mtu: usize,
    steps: u32,
    /// Inline send data.
    inline: Vec<u8>,
}

fn register(s: &mut ustack::Stack, side: usize) -> Regions {
    let mut reg = |len: usize, access: Access, tag: Option<u8>| {
        let h = s.rc().reg_mr(len, access).expect("register");
        let fill = match tag {
            Some(t) => pattern(side, t, len),
            None => pattern(side, 0x5a, len),
        };
        s.rc().mr_mut(h).expect("region").copy_from_slice(&fill);
        (h, s.rc_ref().mr_info(h).expect("info"), tag.unwrap_or(0))
    };
    let lo = reg(GUARD, Access::REMOTE_READ, Some(0x11));
    let live = reg(LIVE, Access::ALL, None);
    let noremote = reg(GUARD, Access::LOCAL_WRITE, Some(0x22));
    let hi = reg(GUARD, Access::REMOTE_READ, Some(0x33));
    Regions {
        live: live.0,
        live_info: live.1,
        fixed: [lo, noremote, hi],
    }
}

impl Fuzz {
    fn new(r: &mut Reader<'_>) -> Fuzz {
        let (c0, c1, c2) = (r.u8(), r.u8(), r.u8());
        let mtu = [256, 512, 1024, 256][usize::from(c0 & 3)];
        let qcfg = RcQpConfig {
            qpn: None,
            psn: (c2 & 0x40 != 0).then(|| PSN_MASK - u32::from(c2 >> 7) * 5 - 1),
            mtu: Some(mtu),
            max_send_wr: 16,
            max_recv_wr: 16,
            timeout: 8 + (c1 & 7),
            retry_cnt: (c0 >> 2) & 7,
            rnr_retry: (c0 >> 5) & 7,
            min_rnr_timer: c1 >> 3,
            max_rd_atomic: 1 + usize::from((c2 >> 2) & 3),
            max_dest_rd_atomic: 1 + usize::from((c2 >> 4) & 3),
            window: [1024, 4, 16, 64][usize::from(c2 & 3)],
            traffic_class: c1 & 7,
        };
        let link = LinkConfig {
            delay: Duration::from_micros(20),
            rate_bps: 1_000_000_000,
            ..LinkConfig::default()
        };
        let mut net = SimNet::new(link);
        for n in 1..=2 {
            let cfg = host_config(n);
            let port = net.link.attach(cfg.mac, POOL);
            net.nodes.push(Node::new(ustack::Stack::new(cfg), port));
        }
        let mut sides = Vec::new();
        for (i, node) in net.nodes.iter_mut().enumerate() {
            let s = &mut node.stack;
            let regions = register(s, i);
            let qp = s.rc().create_qp(&qcfg).expect("create qp");
            let qpn = s.rc_ref().qp_status(qp).expect("status").qpn;
            sides.push(Side {
                qp: Some(qp),
                qpn,
                posted: HashMap::new(),
                regions,
            });
        }
        let sides: [Side; 2] = sides.try_into().expect("two sides");
        let mut f = Fuzz {
            net,
            sides,
            outs: [VecTx::new(), VecTx::new()],
            tx_limit: None,
            templates: Vec::new(),
            captured: 0,
            next_wr: 1,
            qcfg,
            mtu,
            steps: 0,
            inline: (0..8192).map(|i| (i * 7) as u8).collect(),
        };
        f.connect(0, |st| st.initial_psn);
        f.connect(1, |st| st.initial_psn);
        // Work in flight both ways: two receives each, then a SEND, a
        // WRITE and a READ each, of the input's sizes.
        let sizes: Vec<usize> = (0..6).map(|_| usize::from(r.u16()) % (SLOT + 1)).collect();
        for x in 0..2 {
            for k in 0..2 {
                let sge = f.live_sge(x, SLOT * (1 + k), SLOT);
                f.post_recv_sge(x, sge);
            }
        }
        for x in 0..2 {
            let (sl, wl, rl) = (sizes[3 * x], sizes[3 * x + 1], sizes[3 * x + 2]);
            let peer = f.sides[1 - x].regions.live_info;
            let src = f.live_sge(x, 0, sl);
            f.post_send_wr(x, RcOp::Send, Local::Sge(src), true);
            let src = f.live_sge(x, 0, wl);
            let op = RcOp::Write {
                remote_addr: peer.addr + 3 * SLOT as u64,
                rkey: peer.rkey,
            };
            f.post_send_wr(x, op, Local::Sge(src), true);
            let dst = f.live_sge(x, 3 * SLOT, rl);
            let op = RcOp::Read {
                remote_addr: peer.addr,
                rkey: peer.rkey,
            };
            f.post_send_wr(x, op, Local::Sge(dst), true);
        }
        let first = Duration::from_micros(u64::from(r.u8()) * 2);
        f.run_for(first);
        f
    }

    fn stack(&mut self, x: usize) -> &mut ustack::Stack {
        &mut self.net.nodes[x].stack
    }

    fn status(&self, x: usize) -> Option<RcQpStatus> {
        let qp = self.sides[x].qp?;
        self.net.nodes[x].stack.rc_ref().qp_status(qp).ok()
    }

    /// Connect side `x`'s QP to its peer's current QP, expecting the PSN
    /// `psn` picks from the peer's status.
    fn connect(&mut self, x: usize, psn: impl Fn(&RcQpStatus) -> u32) {
        let (Some(qp), Some(peer)) = (self.sides[x].qp, self.status(1 - x)) else {
            return;
        };
        let dest = RcDest {
            ip: ip(1 - x).into(),
            qpn: peer.qpn,
            psn: psn(&peer),
        };
        let r = self.stack(x).rc().connect(qp, dest);
        let st = self.status(x).expect("status");
        match r {
            Ok(()) => assert_eq!(st.state, QpState::Rts),
            Err(_) => assert_ne!(st.state, QpState::Init, "connect refused in INIT"),
        }
    }

    fn live_sge(&self, x: usize, off: usize, len: usize) -> Sge {
        let i = self.sides[x].regions.live_info;
        Sge {
            addr: i.addr.wrapping_add(off as u64),
            len: len as u32,
            lkey: i.lkey,
        }
    }

    fn wr_id(&mut self) -> u64 {
        self.next_wr += 1;
        self.next_wr
    }

    fn post_recv_sge(&mut self, x: usize, sge: Sge) -> bool {
        let Some(qp) = self.sides[x].qp else {
            return false;
        };
        let id = self.wr_id();
        let ok = self.stack(x).rc().post_recv(qp, id, sge).is_ok();
        if ok {
            let p = Posted {
                recv: true,
                opcode: WcOpcode::Recv,
                signaled: true,
                len: sge.len as usize,
            };
            self.sides[x].posted.insert(id, p);
        }
        ok
    }

    fn post_send_wr(&mut self, x: usize, op: RcOp, local: Local<'_>, signaled: bool) -> bool {
        let Some(qp) = self.sides[x].qp else {
            return false;
        };
        let id = self.wr_id();
        let len = match local {
            Local::Sge(s) => s.len as usize,
            Local::Inline(b) => b.len(),
        };
        let wr = RcSendWr {
            wr_id: id,
            op,
            local,
            signaled,
            solicited: id.is_multiple_of(3),
        };
        let ok = self.net.nodes[x].stack.rc().post_send(qp, &wr).is_ok();
        if ok {
            let opcode = match op {
                RcOp::Send | RcOp::SendImm(_) => WcOpcode::Send,
                RcOp::Write { .. } | RcOp::WriteImm { .. } => WcOpcode::RdmaWrite,
                RcOp::Read { .. } => WcOpcode::RdmaRead,
                RcOp::CompareSwap { .. } => WcOpcode::CompareSwap,
                RcOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            };
            let p = Posted {
                recv: false,
                opcode,
                signaled,
                len,
            };
            self.sides[x].posted.insert(id, p);
        }
        ok
    }

    // ------------------------------------------------------------ stepping

    /// One step of both stacks at `net.now`: the wire's frames in
    /// (recorded, counted once), timers and output, every frame sent
    /// checked and put on the wire. Returns whether anything moved.
    fn step(&mut self) -> bool {
        self.steps += 1;
        let now = self.net.now;
        let mut busy = false;
        let Fuzz {
            net,
            outs,
            templates,
            captured,
            ..
        } = self;
        let mut events = Vec::new();
        for (i, node) in net.nodes.iter_mut().enumerate() {
            let mut rx = Vec::new();
            node.port.dev.rx_burst(now, &mut rx, 64);
            busy |= !rx.is_empty();
            for buf in rx {
                let frame: &[u8] = buf.as_ref();
                if templates.len() < TEMPLATES {
                    templates.push((i, frame.to_vec()));
                } else if (*captured).is_multiple_of(3) {
                    templates[(*captured / 3) % TEMPLATES] = (i, frame.to_vec());
                }
                *captured += 1;
                receive_counted(&mut node.stack, now, frame, &mut outs[i]);
            }
            node.stack.drain_events(&mut events);
            node.stack.poll(now, &mut outs[i]);
        }
        for i in 0..2 {
            busy |= self.flush(i);
        }
        busy
    }

    /// Check what side `i` sent and put it on the wire.
    fn flush(&mut self, i: usize) -> bool {
        let frames = std::mem::take(&mut self.outs[i].frames);
        self.outs[i].limit = self.tx_limit;
        if frames.is_empty() {
            return false;
        }
        let now = self.net.now;
        let dev = &mut self.net.nodes[i].port.dev;
        let mut q = Vec::new();
        for f in &frames {
            check_sent(i, f, self.mtu);
            // A dry pool drops the frame, as a full NIC ring would.
            if let Some(mut b) = dev.alloc_tx()
                && b.set_len(f.len())
            {
                b.as_mut().copy_from_slice(f);
                q.push(b);
            }
        }
        dev.tx_burst(now, &mut q);
        // Frames the port refused drop here (their buffers go home).
        q.clear();
        true
    }

    /// Run in virtual time for `d`, stepping at every wake-up (bounded:
    /// past the step budget time jumps to the deadline).
    fn run_for(&mut self, d: Duration) {
        let deadline = self.net.now + d;
        let mut here = 0u32;
        loop {
            let busy = self.step();
            here += 1;
            self.check_queues();
            if here >= STEPS_PER_RUN || self.steps >= STEPS_TOTAL {
                if self.net.now < deadline {
                    self.net.now = deadline;
                    self.step();
                    self.check_queues();
                }
                return;
            }
            let now = self.net.now;
            let next = if busy {
                now
            } else {
                match self.net.next_wakeup(&[]) {
                    Some(t) if t > now => t,
                    Some(_) => now + Duration::from_micros(1),
                    None => return,
                }
            };
            if next > deadline {
                self.net.now = deadline.max(now);
                return;
            }
            self.net.now = next;
        }
    }

    // -------------------------------------------------------------- checks

    /// Completions never exceed the work posted: what a QP holds (queued
    /// sends and receives, completions not polled) is at most what was
    /// posted and not yet polled.
    fn check_queues(&self) {
        for x in 0..2 {
            if let Some(st) = self.status(x) {
                let held = st.send_outstanding + st.recv_posted + st.cq_depth;
                assert!(
                    held <= self.sides[x].posted.len(),
                    "QP {x} holds {held} work requests and completions, {} posted: {st:?}",
                    self.sides[x].posted.len()
                );
                assert_eq!(st.qpn, self.sides[x].qpn);
            }
        }
    }

    fn poll_cq(&mut self, x: usize, max: usize) {
        let Some(qp) = self.sides[x].qp else { return };
        let mut wcs = Vec::new();
        let n = self
            .stack(x)
            .rc()
            .poll_cq(qp, max, &mut wcs)
            .expect("poll a live QP");
        assert_eq!(n, wcs.len());
        assert!(n <= max);
        for wc in &wcs {
            if debug() {
                eprintln!("side {x} at {:?}: {wc:?}", self.net.now);
            }
            self.sides[x].complete(wc);
        }
    }

    // ------------------------------------------------------------- the ops

    fn op(&mut self, r: &mut Reader<'_>) {
        let op = r.u8();
        let x = usize::from((op >> 4) & 1);
        match op % 13 {
            0..=3 => self.crafted(x, op, r),
            4 | 5 => self.mutated(op, r),
            6 => self.app_send(x, r),
            7 => self.app_recv(x, r),
            8 => {
                let max = usize::from(r.u8() % 20);
                self.poll_cq(x, max);
            }
            9 => {
                let t = r.u8();
                let d = match t >> 6 {
                    0 => Duration::from_micros(u64::from(t)),
                    1 => Duration::from_micros(u64::from(t & 63) * 50),
                    2 => Duration::from_millis(u64::from(t & 63) * 10),
                    _ => Duration::from_millis(u64::from(t & 63) * 100),
                };
                self.run_for(d);
            }
            10 => self.lifecycle(x, r),
            _ => self.run_for(Duration::from_micros(60)),
        }
        self.check_queues();
    }

    /// set_error, destroy, recreate, reconnect, dereg/reg, device limits.
    fn lifecycle(&mut self, x: usize, r: &mut Reader<'_>) {
        let b = r.u8();
        match b % 8 {
            0 => {
                if let Some(qp) = self.sides[x].qp {
                    self.stack(x).rc().set_error(qp).expect("set_error");
                    assert_eq!(self.status(x).expect("status").state, QpState::Error);
                }
            }
            1 => self.destroy(x),
            2 => {
                // Recreate one side: the peer keeps its old connection.
                self.destroy(x);
                self.create(x);
                let pick = b >> 3;
                self.connect(x, |st| match pick % 3 {
                    0 => st.initial_psn,
                    1 => st.una_psn,
                    _ => st.next_psn,
                });
            }
            3 => {
                // A fresh connected pair.
                self.destroy(0);
                self.destroy(1);
                self.create(0);
                self.create(1);
                self.connect(0, |st| st.initial_psn);
                self.connect(1, |st| st.initial_psn);
            }
            4 => {
                // The live region goes away (work and peers naming it
                // fail) and a new one takes its place.
                let old = self.sides[x].regions.live;
                self.stack(x).rc().dereg_mr(old).expect("dereg");
                assert!(self.stack(x).rc_ref().mr_info(old).is_err());
                let s = self.stack(x);
                let h = s.rc().reg_mr(LIVE, Access::ALL).expect("register");
                let info = s.rc_ref().mr_info(h).expect("info");
                self.sides[x].regions.live = h;
                self.sides[x].regions.live_info = info;
            }
            5 => self.tx_limit = Some(usize::from(b >> 3) % 6),
            6 => self.tx_limit = None,
            _ => {
                // Connect again: refused unless in INIT.
                self.connect(x, |st| st.next_psn);
            }
        }
    }

    fn destroy(&mut self, x: usize) {
        if let Some(qp) = self.sides[x].qp.take() {
            self.stack(x).rc().destroy_qp(qp).expect("destroy");
            assert!(self.stack(x).rc_ref().qp_status(qp).is_err());
            self.sides[x].posted.clear();
        }
    }

    fn create(&mut self, x: usize) {
        if self.sides[x].qp.is_some() {
            return;
        }
        let cfg = self.qcfg.clone();
        let qp = self.stack(x).rc().create_qp(&cfg).expect("create");
        let st = self.stack(x).rc_ref().qp_status(qp).expect("status");
        assert_eq!(st.state, QpState::Init);
        self.sides[x].qp = Some(qp);
        self.sides[x].qpn = st.qpn;
    }

    /// Info of a region of side `x` by selector: live, guards, no-remote.
    fn region(&self, x: usize, sel: u8) -> MrInfo {
        let r = &self.sides[x].regions;
        match sel % 4 {
            0 => r.live_info,
            k => r.fixed[usize::from(k - 1)].1,
        }
    }

    fn app_send(&mut self, x: usize, r: &mut Reader<'_>) {
        let b = r.u8();
        let len = match r.u8() % 4 {
            0 => usize::from(r.u8()),
            1 => self.mtu * (1 + usize::from(r.u8() % 4)),
            2 => usize::from(r.u16()) % (SLOT + 1),
            _ => usize::from(r.u16()) % (2 * LIVE),
        };
        let peer = self.region(1 - x, r.u8());
        let (remote_addr, rkey) = match (b >> 5) & 3 {
            0 | 1 => (
                peer.addr.wrapping_add(u64::from(r.u16()) % LIVE as u64),
                peer.rkey,
            ),
            2 => (peer.addr, peer.rkey ^ u32::from(r.u8())),
            _ => ((u64::from(r.u32()) << 32) | u64::from(r.u32()), r.u32()),
        };
        let imm = r.u32();
        // Atomics: mostly at an aligned address, sometimes not (refused
        // when posted).
        let aligned = if imm & 1 == 0 {
            remote_addr & !7
        } else {
            remote_addr
        };
        let op = match b % 7 {
            0 => RcOp::Send,
            1 => RcOp::SendImm(imm),
            2 => RcOp::Write { remote_addr, rkey },
            3 => RcOp::WriteImm {
                remote_addr,
                rkey,
                imm,
            },
            4 => RcOp::Read { remote_addr, rkey },
            5 => RcOp::FetchAdd {
                remote_addr: aligned,
                rkey,
                add: u64::from(imm),
            },
            _ => RcOp::CompareSwap {
                remote_addr: aligned,
                rkey,
                compare: u64::from(imm >> 8),
                swap: u64::from(imm),
            },
        };
        let atomic = matches!(op, RcOp::FetchAdd { .. } | RcOp::CompareSwap { .. });
        // An atomic's local side is 8 bytes, mostly.
        let len = if atomic && imm & 2 == 0 { 8 } else { len };
        // READs and atomics write their local bytes.
        let is_read = atomic || matches!(op, RcOp::Read { .. });
        let signaled = r.u8() & 3 != 0;
        match (b >> 3) & 3 {
            0 | 1 => {
                let off = usize::from(r.u16()) % LIVE;
                let sge = self.live_sge(x, off, len);
                self.post_send_wr(x, op, Local::Sge(sge), signaled);
            }
            2 if !is_read => {
                let data = self.inline[..len.min(self.inline.len())].to_vec();
                self.post_send_wr(x, op, Local::Inline(&data), signaled);
            }
            _ => {
                // A fixed region as the local side: a source is fine, a
                // READ destination must be refused (no local write on the
                // guards; the no-remote one is never named for a READ).
                let k = if is_read {
                    [0, 2][usize::from(r.u8() & 1)]
                } else {
                    usize::from(r.u8() % 3)
                };
                let (_, info, _) = self.sides[x].regions.fixed[k];
                let sge = Sge {
                    addr: info.addr,
                    len: len.min(GUARD) as u32,
                    lkey: info.lkey,
                };
                let ok = self.post_send_wr(x, op, Local::Sge(sge), signaled);
                assert!(
                    !(is_read && ok && sge.len > 0),
                    "a READ into a region without local write was posted"
                );
            }
        }
    }

    fn app_recv(&mut self, x: usize, r: &mut Reader<'_>) {
        let b = r.u8();
        let off = usize::from(r.u16()) % LIVE;
        let len = match b % 3 {
            0 => usize::from(r.u16()) % (SLOT + 1),
            1 => self.mtu * usize::from(r.u8() % 4),
            _ => usize::from(r.u16()),
        };
        if b & 0x80 != 0 {
            // A guard as the receive buffer: refused.
            let (_, info, _) = self.sides[x].regions.fixed[usize::from(b & 1) * 2];
            let sge = Sge {
                addr: info.addr,
                len: len.clamp(1, GUARD) as u32,
                lkey: info.lkey,
            };
            assert!(
                !self.post_recv_sge(x, sge),
                "a receive into a region without local write was posted"
            );
        } else {
            let sge = self.live_sge(x, off, len);
            self.post_recv_sge(x, sge);
        }
    }

    /// A PSN near one the QPs know, or anywhere.
    fn psn(&self, x: usize, r: &mut Reader<'_>) -> u32 {
        let sel = r.u8();
        let st = self.status(x);
        let peer = self.status(1 - x);
        let base = match (sel % 8, st, peer) {
            (0 | 1, Some(s), _) => s.expected_psn,
            (2, Some(s), _) => s.una_psn,
            (3, Some(s), _) => s.next_psn,
            (4, Some(s), _) => s.initial_psn,
            (5, _, Some(p)) => p.next_psn,
            (6, _, Some(p)) => p.una_psn,
            _ => return r.u32() & PSN_MASK,
        };
        let delta = if sel & 0x80 != 0 {
            i32::from(r.u16() as i16) << 4
        } else {
            i32::from(r.u8() as i8)
        };
        (base as i32).wrapping_add(delta) as u32 & PSN_MASK
    }

    /// A packet built field by field into side `x`.
    fn crafted(&mut self, x: usize, op: u8, r: &mut Reader<'_>) {
        let flags = r.u8();
        let more = r.u8();
        let opsel = r.u8();
        let opcode = if opsel < 0xf0 {
            opsel % 0x15
        } else {
            [0x15, 0x16, 0x17, 0x1f, 0x64, 0x24, 0xff, 0x20][usize::from(opsel & 7)]
        };
        let psn = self.psn(x, r);
        let dest_qp = match flags & 3 {
            0 | 1 => self.sides[x].qpn,
            2 => self.sides[1 - x].qpn,
            _ => r.u32() & PSN_MASK,
        };
        let src_ip = if flags & 4 != 0 {
            Ipv4Addr::new(10, 0, 0, 3)
        } else {
            ip(1 - x)
        };
        // RETH / AtomicETH: near a region of either side, or anywhere.
        let rsel = r.u8();
        let info = self.region(if rsel & 0x80 != 0 { 1 - x } else { x }, rsel);
        let va = match (rsel >> 4) & 3 {
            0 => info.addr + u64::from(r.u16()) % (info.len as u64 + 1),
            1 => info.addr + info.len as u64 - u64::from(r.u8()),
            2 => info.addr.wrapping_add(i64::from(r.u16() as i16) as u64),
            _ => (u64::from(r.u32()) << 32) | u64::from(r.u32()),
        };
        let rkey = match (rsel >> 2) & 3 {
            0 | 1 => info.rkey,
            2 => info.rkey ^ u32::from(r.u8()),
            _ => r.u32(),
        };
        // Payload: the path MTU, a short one, any length up to a frame.
        let plen = match more & 3 {
            0 => self.mtu,
            1 => usize::from(r.u8()),
            2 => usize::from(r.u16()) % (self.mtu + 65),
            _ => {
                if more & 4 != 0 {
                    usize::from(r.u16()) % 1400
                } else {
                    0
                }
            }
        };
        let rc = RcOpcode::from_u8(opcode);
        let plen = match rc {
            Some(o) if !o.has_payload() && more & 8 == 0 => 0,
            _ => plen,
        };
        let dma_len = match (more >> 4) & 3 {
            0 => plen as u32,
            1 => u32::from(r.u16()),
            2 => r.u32(),
            _ => (info.len as u64 + info.addr).wrapping_sub(va) as u32,
        };
        let payload = vec![r.u8(); plen];
        let syndrome = r.u8();
        let msn = r.u32() & PSN_MASK;
        let imm = r.u32();
        let orig = (u64::from(r.u32()) << 32) | u64::from(r.u32());
        let mut ext = match rc {
            Some(o) => {
                let h = RcHeaders {
                    opcode: o,
                    reth: Some((va, rkey, dma_len)),
                    atomic: Some((va, rkey, orig, !orig)),
                    aeth: Some((Syndrome::Ack { credits: 0 }, msn)),
                    atomic_ack: Some(orig),
                    imm: Some(imm),
                    payload: &[],
                };
                let mut b = vec![0u8; h.buffer_len()];
                h.emit(&mut b);
                if o.has_aeth() {
                    // Any syndrome byte, reserved kinds and bit 7 too.
                    let at =
                        if o.has_reth() { 16 } else { 0 } + if o.has_atomic_eth() { 28 } else { 0 };
                    b[at] = syndrome;
                }
                b
            }
            None => r.chunk(40).to_vec(),
        };
        if more & 0x40 != 0 {
            let keep = usize::from(r.u8()) % (ext.len() + 1);
            ext.truncate(keep);
        }
        // Pad: honest, or a count that lies about the bytes there.
        let (pad_field, pad_bytes) = if flags & 0x40 != 0 {
            (r.u8() & 3, usize::from(r.u8() % 8))
        } else {
            let p = (4 - plen % 4) % 4;
            (p as u8, p)
        };
        let (version, pkey) = if flags & 0x20 != 0 {
            let v = r.u8();
            (v & 0xf, if v & 0x10 != 0 { r.u16() } else { 0xffff })
        } else {
            (0, 0xffff)
        };
        let mut roce = vec![0u8; BTH_LEN];
        roce[0] = opcode;
        roce[1] = (u8::from(op & 0x40 != 0) << 7) | 0x40 | (pad_field << 4) | version;
        roce[2..4].copy_from_slice(&pkey.to_be_bytes());
        roce[5..8].copy_from_slice(&dest_qp.to_be_bytes()[1..]);
        roce[8] = u8::from(flags & 8 != 0) << 7;
        roce[9..12].copy_from_slice(&psn.to_be_bytes()[1..]);
        roce.extend_from_slice(&ext);
        roce.extend_from_slice(&payload);
        roce.resize(roce.len() + pad_bytes + ICRC_LEN, 0);
        let sport = if flags & 0x80 != 0 { r.u16() } else { 0xc000 };
        let frame = roce_frame(x, src_ip, sport, &roce, flags & 0x10 == 0, r);
        let now = self.net.now;
        receive_counted(&mut self.net.nodes[x].stack, now, &frame, &mut self.outs[x]);
    }

    /// A frame the wire carried, mutated, to its receiver or turned around.
    fn mutated(&mut self, op: u8, r: &mut Reader<'_>) {
        if self.templates.is_empty() {
            return;
        }
        let k = usize::from(r.u16()) % self.templates.len();
        let (mut to, mut f) = self.templates[k].clone();
        let b = r.u8();
        if b & 1 != 0 && f.len() >= ETHERNET_HEADER_LEN + IPV4_HEADER_LEN {
            // Turn it around: the other stack gets it, as if from its peer.
            to = 1 - to;
            f[0..6].copy_from_slice(&mac(to).0);
            f[6..12].copy_from_slice(&mac(1 - to).0);
            f[26..30].copy_from_slice(&ip(1 - to).octets());
            f[30..34].copy_from_slice(&ip(to).octets());
        }
        // BTH at 42 (Ethernet, IPv4 without options, UDP).
        const BTH: usize = ETHERNET_HEADER_LEN + IPV4_HEADER_LEN + 8;
        if b & 2 != 0 && f.len() >= BTH + BTH_LEN {
            let psn = self.psn(to, r);
            f[BTH + 9..BTH + 12].copy_from_slice(&psn.to_be_bytes()[1..]);
        }
        if b & 4 != 0 && f.len() > BTH {
            f[BTH] = r.u8() % 0x15;
        }
        for _ in 0..(b >> 5) {
            // Mostly in the RoCE headers, sometimes anywhere.
            let at = if r.bool() {
                BTH + usize::from(r.u8() % 48)
            } else {
                usize::from(r.u16())
            };
            let v = r.u8();
            let n = f.len().max(1);
            if let Some(byte) = f.get_mut(at % n) {
                *byte ^= v;
            }
        }
        if b & 8 != 0 {
            let n = usize::from(r.u16()) % (f.len() + 1);
            f.truncate(n);
        }
        if op & 0x80 == 0 {
            fix_checksums(&mut f);
        }
        let now = self.net.now;
        receive_counted(&mut self.net.nodes[to].stack, now, &f, &mut self.outs[to]);
    }

    // -------------------------------------------------------------- the end

    fn finish(&mut self) {
        self.tx_limit = None;
        self.outs[0].limit = None;
        self.outs[1].limit = None;
        self.run_for(Duration::from_secs(2));
        for x in 0..2 {
            self.poll_cq(x, usize::MAX);
            if let Some(qp) = self.sides[x].qp {
                self.stack(x).rc().set_error(qp).expect("set_error");
            }
        }
        // Let what is owed leave and land (nothing new starts in error).
        self.steps = 0;
        self.run_for(Duration::from_secs(1));
        for _ in 0..1000 {
            if self.net.link.in_flight() == 0 && self.outs.iter().all(|o| o.frames.is_empty()) {
                break;
            }
            self.net.now += Duration::from_millis(1);
            self.step();
        }
        assert_eq!(self.net.link.in_flight(), 0, "the wire never went quiet");
        for x in 0..2 {
            self.poll_cq(x, usize::MAX);
            if debug() {
                eprintln!("side {x}: {:#?}", self.status(x));
            }
            if let Some(st) = self.status(x) {
                assert_eq!(st.state, QpState::Error);
                assert_eq!(st.send_outstanding, 0, "{st:?}");
                assert_eq!(st.recv_posted, 0, "{st:?}");
                assert_eq!(st.cq_depth, 0, "{st:?}");
                assert_eq!(st.reads_outstanding, 0, "{st:?}");
                // Everything posted has completed, except unsignaled
                // sends that succeeded silently.
                // (`corpus/rc/regress-recv-lost-when-qp-errors-mid-send`:
                // the receive a multi-packet SEND was landing in once went
                // without a completion when the QP failed.)
                let left: Vec<_> = self.sides[x]
                    .posted
                    .iter()
                    .filter(|(_, p)| p.recv || p.signaled)
                    .collect();
                assert!(left.is_empty(), "side {x}: never completed: {left:?}");
            }
            let stack = &self.net.nodes[x].stack;
            for (h, info, tag) in self.sides[x].regions.fixed {
                let now = stack.rc_ref().mr(h).expect("fixed region");
                assert_eq!(stack.rc_ref().mr_info(h).expect("info"), info);
                if now != pattern(x, tag, info.len).as_slice() {
                    let at = now
                        .iter()
                        .zip(pattern(x, tag, info.len))
                        .position(|(a, b)| *a != b);
                    panic!("side {x}: protected region {tag:#x} modified at byte {at:?}");
                }
            }
            let st = stack.stats();
            assert_eq!(st.eth.rx_frames, st.eth.rx_accepted + st.drops.total());
        }
        assert_eq!(self.net.pools_in_use(), 0, "pool buffers leaked");
    }
}

/// Ethernet, IPv4 (DF) and UDP to 4791 around `roce` (BTH through ICRC),
/// from `src` to side `x`; the ICRC is computed when `icrc` (else zero or
/// the input's bytes).
fn roce_frame(
    x: usize,
    src: Ipv4Addr,
    sport: u16,
    roce: &[u8],
    icrc: bool,
    r: &mut Reader<'_>,
) -> Vec<u8> {
    let udp_len = 8 + roce.len();
    let ip_len = IPV4_HEADER_LEN + udp_len;
    let mut f = vec![0u8; ETHERNET_HEADER_LEN + ip_len];
    f[0..6].copy_from_slice(&mac(x).0);
    f[6..12].copy_from_slice(&mac(1 - x).0);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ipb = &mut f[ETHERNET_HEADER_LEN..];
    ipb[0] = 0x45;
    ipb[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
    ipb[6] = 0x40;
    ipb[8] = 64;
    ipb[9] = 17;
    ipb[12..16].copy_from_slice(&src.octets());
    ipb[16..20].copy_from_slice(&ip(x).octets());
    Ipv4Packet::new_unchecked(&mut ipb[..]).fill_checksum();
    let udp = &mut ipb[IPV4_HEADER_LEN..];
    udp[0..2].copy_from_slice(&sport.to_be_bytes());
    udp[2..4].copy_from_slice(&ROCE_PORT.to_be_bytes());
    udp[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    udp[8..].copy_from_slice(roce);
    if icrc {
        icrc_fill(ipb);
    } else if r.bool() {
        let n = ipb.len();
        let v = r.u32();
        ipb[n - ICRC_LEN..].copy_from_slice(&v.to_le_bytes());
    }
    f
}

/// Everything side `i` sends must be well-formed: from its MAC and
/// address, checksums right, and RoCE frames whole RC packets.
fn check_sent(i: usize, frame: &[u8], mtu: usize) {
    let f = EthernetFrame::new_checked(frame).expect("sent frame parses");
    assert_eq!(f.src_addr(), mac(i));
    match f.ethertype() {
        EthernetProtocol::Arp => {
            let p = ArpPacket::new_checked(f.payload()).expect("arp parses");
            ArpRepr::parse(&p).expect("arp repr");
        }
        EthernetProtocol::Ipv4 => {
            let p = Ipv4Packet::new_checked(f.payload()).expect("ipv4 parses");
            assert!(p.verify_checksum(), "sent IPv4 checksum");
            assert_eq!(p.src_addr(), ip(i));
            let whole = p.frag_offset() == 0 && !p.more_frags();
            let (src, dst) = (IpAddress::Ipv4(ip(i)), IpAddress::Ipv4(p.dst_addr()));
            let ip_bytes = &f.payload()[..usize::from(p.total_len())];
            match p.next_header() {
                IpProtocol::Tcp => {
                    let t = TcpPacket::new_checked(p.payload()).expect("tcp parses");
                    assert!(t.verify_checksum(&src, &dst), "sent TCP checksum");
                }
                IpProtocol::Icmp if !whole => {}
                IpProtocol::Icmp => {
                    let m = Icmpv4Packet::new_checked(p.payload()).expect("icmp parses");
                    assert!(m.verify_checksum(), "sent ICMP checksum");
                }
                IpProtocol::Udp if whole => {
                    let u = UdpPacket::new_checked(p.payload()).expect("udp parses");
                    assert_eq!(usize::from(u.len()), p.payload().len());
                    if u.dst_port() == ROCE_PORT {
                        assert!(p.dont_frag(), "RoCE without DF");
                        check_rc(ip_bytes, u.payload(), mtu);
                    } else {
                        assert!(
                            u.checksum() == 0 || u.verify_checksum(&src, &dst),
                            "sent UDP checksum"
                        );
                    }
                }
                IpProtocol::Udp => panic!("a fragmented UDP datagram was sent"),
                other => panic!("sent unexpected IP protocol {other}"),
            }
        }
        other => panic!("sent unexpected ethertype {other}"),
    }
}

fn check_rc(ip_bytes: &[u8], roce: &[u8], mtu: usize) {
    let bth = BthPacket::new_checked(roce).expect("BTH");
    assert_eq!(bth.version(), 0);
    assert_eq!(bth.pkey(), 0xffff);
    let op = u8::from(bth.opcode());
    let opcode = RcOpcode::from_u8(op).unwrap_or_else(|| panic!("sent non-RC opcode {op:#x}"));

    let pad = usize::from(bth.pad_count());
    let body = roce
        .len()
        .checked_sub(BTH_LEN + ICRC_LEN + pad)
        .expect("RC packet shorter than its BTH, pad and ICRC");
    let h = RcHeaders::parse(opcode, &roce[BTH_LEN..BTH_LEN + body])
        .unwrap_or_else(|e| panic!("sent {opcode:?} does not parse: {e:?}"));
    assert_eq!((h.payload.len() + pad) % 4, 0, "pad count of {opcode:?}");
    assert!(pad < 4);
    assert!(
        h.payload.len() <= mtu,
        "{opcode:?} payload beyond the path MTU"
    );
    if opcode.is_first() || opcode.is_middle() {
        assert_eq!(h.payload.len(), mtu, "{opcode:?} not a full MTU");
    }
    if let Some((va, ..)) = h.atomic {
        assert_eq!(va % 8, 0, "sent a misaligned {opcode:?}");
    }
    if let Some((Syndrome::Reserved(v), _)) = h.aeth {
        panic!("sent a reserved syndrome {v:#x}");
    }
    assert!(icrc_verify(ip_bytes), "sent ICRC does not verify");
}

fuzz_target!(|data: &[u8]| {
    let mut r = Reader::new(data);
    let mut f = Fuzz::new(&mut r);
    let mut ops = 0;
    while !r.is_empty() && ops < MAX_OPS {
        ops += 1;
        f.op(&mut r);
    }
    f.finish();
});
