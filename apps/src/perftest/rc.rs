//! `uperf --rdma rc`: perftest's RC tests (`ib_send_bw`, `ib_write_bw`,
//! `ib_read_bw`, `ib_send_lat`, `ib_write_lat`, `ib_read_lat`, connection
//! type RC) over the stack's own RoCEv2 RC, with perftest's out-of-band
//! exchange over the stack's own TCP, in both roles.
//!
//! The exchange is perftest's (4.5-0.x, version "6.06"): the preamble
//! (version, page and cache-line size, MTU), then key messages carrying the
//! QP number, first PSN, out_reads, and the buffer's rkey and vaddr. How
//! many and where depends on the program, as in its `main`:
//! - send_bw / send_lat: three key exchanges (the QP is connected after the
//!   first), then per size a sync after the receiver posted its receives,
//!   the data phase and, for bw with `-a`, one more sync; then the close
//!   exchange (a key exchange and `"done\0"`).
//! - write_bw / read_bw: three key exchanges (the last after RTR); the
//!   client runs every size back to back, then syncs, sends its last
//!   report (size, iterations, peak, average, message rate: five 8-byte
//!   big-endian exchanges, perftest's `xchg_bw_reports`) and closes; the
//!   server waits for that sync, prints the client's report and closes.
//! - write_lat / read_lat: four key exchanges. write_lat runs every size
//!   back to back on both sides and ends without a close exchange (the
//!   stock tool just exits); read_lat's server goes straight to the close
//!   exchange, which its client answers after its runs.
//!
//! Data phases as perftest runs them:
//! - bw senders (SEND, WRITE, READ): `iters` work requests of `size`
//!   bytes, at most tx depth (128) outstanding, completion moderation (one
//!   signaled every `cq_mod` = 100, and the last; every one above 8 KiB
//!   without `-a`, as perftest disables moderation there), READs at most
//!   the peer's out_reads outstanding. Figures from post and completion
//!   times (`print_report_bw`).
//! - send_bw server: posts rx depth (512 at most) receives, reposts until
//!   `iters` are posted, counts receives (timing from the first).
//! - write_bw / read_bw server: nothing but the syncs.
//! - send_lat: strict ping-pong of signaled SENDs with receives, the
//!   client first.
//! - write_lat: each side WRITEs its counter-stamped buffer into the
//!   peer's and polls the last byte of its own receive half for the
//!   peer's next count (the server writes first); the poll loop is the
//!   app's turn in the stack's loop.
//! - read_lat: the client READs one message at a time; the server is idle.
//!
//! Latency is from the gaps between successive posts (halved except for
//! READ), as `print_report_lat`. Output follows perftest's layout.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::Result;
use ustack::socket::rc::{
    Access, Local, MrHandle, MrInfo, RcDest, RcOp, RcQpConfig, RcQpHandle, RcQpStatus, RcSendWr,
    Sge, Wc, WcOpcode, WcStatus,
};
use ustack::wire::exchange::KeyMsg;
use ustack::{Instant, Stack};

use super::app::{Client, PerftestRole, Server, User};
use super::exchange::{
    CYCLE_BUFFER, Exchange, Fail, Run, Step, Timeouts, Transport, peer_ip, session_report,
};
use super::format::{
    AddrVerb, BW_HEADER, BannerInfo, BwRow, LAT_HEADER, RESULT_LINE, Row, address_lines_verb,
    banner_with, bw_receiver_row, bw_sender_row_cq, lat_row_rtt,
};
use super::{BW_CQ_MOD, BW_TX_DEPTH, MIN_ITERS};

/// perftest's largest `-a` size (`MAX_SIZE`): 8 MiB.
pub const MAX_SWEEP_SIZE: usize = 8 << 20;
/// The largest `-s` accepted here (each side registers twice this).
pub const MAX_SIZE: usize = 1 << 30;
/// perftest's default bw message size for RC (`DEF_SIZE_BW`).
pub const BW_DEFAULT_SIZE: usize = 65_536;
/// perftest's default latency message size (`DEF_SIZE_LAT`).
pub const LAT_DEFAULT_SIZE: usize = 2;
/// perftest's SEND receive depth (`DEF_RX_SEND`), at most `iters`.
const RX_SEND_DEPTH: u64 = 512;
/// Above this size (without `-a`) perftest signals every work request.
const CQ_MOD_SIZE_LIMIT: usize = 8192;
/// The out_reads we announce for READ tests: the engine answers 128
/// READs at once (`RcQpConfig::max_dest_rd_atomic`), as rxe does.
const OUT_READS: u16 = 128;
/// How long a side waits for the peer's whole data phase (the syncs that
/// follow it).
const RUN_WAIT: Duration = Duration::from_secs(300);
/// How long write_lat keeps its QP after its last completion, so the
/// peer's last WRITE is surely acknowledged, unless the peer closes first.
const DRAIN: Duration = Duration::from_millis(300);

/// The RC verb a test uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// SEND / RECV.
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
}

impl Op {
    /// `send`, `write`, `read`.
    pub fn name(self) -> &'static str {
        match self {
            Op::Send => "send",
            Op::Write => "write",
            Op::Read => "read",
        }
    }
    /// perftest's `testsStr`.
    fn verb_title(self) -> &'static str {
        match self {
            Op::Send => "Send",
            Op::Write => "RDMA_Write",
            Op::Read => "RDMA_Read",
        }
    }
    fn addr_verb(self) -> AddrVerb {
        match self {
            Op::Send => AddrVerb::Send,
            Op::Write => AddrVerb::Write,
            Op::Read => AddrVerb::Read,
        }
    }
}

impl std::str::FromStr for Op {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "send" => Ok(Op::Send),
            "write" => Ok(Op::Write),
            "read" => Ok(Op::Read),
            _ => Err(format!("'{s}' is not an RC operation: send, write or read")),
        }
    }
}

/// Settings of one side (perftest's flags; both sides must agree on the
/// op, `iters`, `size` and `all_sizes`, as with perftest).
#[derive(Debug, Clone)]
pub struct RcConfig {
    /// The verb.
    pub op: Op,
    /// The latency test instead of the bandwidth test.
    pub latency: bool,
    /// Messages per size (`-n`).
    pub iters: u64,
    /// Message size (`-s`): 65536 for bw and 2 for lat without it.
    pub size: Option<usize>,
    /// Sweep 2, 4, ... 8 MiB (`-a`).
    pub all_sizes: bool,
    /// Longest wait in a data phase without progress.
    pub timeout: Duration,
    /// Longest wait for each exchange message.
    pub exchange_timeout: Duration,
    /// Longest wait for the TCP connection (client).
    pub connect_timeout: Duration,
    /// Our GID is our IPv6 address, not our IPv4 one mapped (perftest's
    /// `--ipv6`; a server follows the client's family anyway).
    pub ipv6: bool,
    /// The traffic class of our packets (perftest's `--tclass`).
    pub tclass: u8,
}

impl RcConfig {
    /// perftest's defaults: 1000 iterations; 5 s without progress, 30 s per
    /// exchange message, 5 s to connect.
    pub fn new(op: Op, latency: bool) -> Self {
        RcConfig {
            op,
            latency,
            iters: 1000,
            size: None,
            all_sizes: false,
            timeout: Duration::from_secs(5),
            exchange_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            ipv6: false,
            tclass: 0,
        }
    }

    /// `send_bw`, `write_lat`, ...
    pub fn name(&self) -> String {
        format!(
            "{}_{}",
            self.op.name(),
            if self.latency { "lat" } else { "bw" }
        )
    }

    fn title(&self) -> String {
        format!(
            "{} {} Test",
            self.op.verb_title(),
            if self.latency { "Latency" } else { "BW" }
        )
    }

    /// The sizes the test runs.
    pub fn sizes(&self) -> Vec<usize> {
        if self.all_sizes {
            sweep_sizes()
        } else {
            vec![self.size.unwrap_or(if self.latency {
                LAT_DEFAULT_SIZE
            } else {
                BW_DEFAULT_SIZE
            })]
        }
    }

    /// The largest size: what the buffer is made for.
    fn max_size(&self) -> usize {
        self.sizes().into_iter().max().unwrap_or(1)
    }

    fn tx_depth(&self) -> u64 {
        if self.latency {
            1
        } else {
            BW_TX_DEPTH.min(self.iters)
        }
    }

    /// perftest's rx depth for SEND tests (with its odd-depth workaround).
    fn rx_depth(&self) -> u64 {
        let d = RX_SEND_DEPTH.min(self.iters);
        if !self.all_sizes && d % 2 == 1 {
            d + 1
        } else {
            d
        }
    }

    /// Completion moderation: 100 (at most the tx depth), 1 above 8 KiB
    /// without `-a`; latency tests signal every work request.
    pub fn cq_mod(&self) -> usize {
        if self.latency {
            return 1;
        }
        if !self.all_sizes && self.max_size() > CQ_MOD_SIZE_LIMIT {
            return 1;
        }
        BW_CQ_MOD.min(self.tx_depth() as usize).max(1)
    }

    /// Pre-run key exchanges of the program.
    fn keys(&self) -> u8 {
        if self.latency && self.op != Op::Send {
            4
        } else {
            3
        }
    }
}

/// The sizes of an RC `-a` sweep: 2, 4, ... 8 MiB.
pub fn sweep_sizes() -> Vec<usize> {
    (1..24).map(|i| 1usize << i).collect()
}

/// perftest's `BUFF_SIZE`: a message's share of the buffer (at least a page).
fn buff_size(size: usize) -> usize {
    size.max(CYCLE_BUFFER as usize)
}

/// The access a side's buffer needs.
fn access(op: Op) -> Access {
    match op {
        Op::Send => Access::LOCAL_WRITE,
        Op::Write => Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        Op::Read => Access::LOCAL_WRITE | Access::REMOTE_READ,
    }
}

/// perftest's bw report exchange: size, iterations (8 bytes each, big
/// endian), peak, average and message rate (doubles, bytes swapped to big
/// endian); a figure we have none of is sent as 0.
pub fn report_msgs(r: &BwRow) -> [[u8; 8]; 5] {
    let f = |v: Option<f64>| v.unwrap_or(0.0).to_bits().to_be_bytes();
    [
        (r.bytes as u64).to_be_bytes(),
        r.iters.to_be_bytes(),
        f(r.peak),
        f(r.avg),
        f(r.msg_rate),
    ]
}

/// A peer's bw report from its five messages.
pub fn parse_report(m: &[[u8; 8]; 5]) -> BwRow {
    let f = |b: [u8; 8]| Some(f64::from_bits(u64::from_be_bytes(b)));
    BwRow {
        bytes: u64::from_be_bytes(m[0]) as usize,
        iters: u64::from_be_bytes(m[1]),
        peak: f(m[2]),
        avg: f(m[3]),
        msg_rate: f(m[4]),
    }
}

// ------------------------------------------------------------ report

/// What one session did, for the summary line and the tests.
#[derive(Debug, Clone, PartialEq)]
pub struct RcReport {
    /// `send_bw`, ...
    pub name: String,
    /// Our role.
    pub client: bool,
    /// The peer's address and QP number.
    pub peer: Option<(IpAddr, u32)>,
    /// The table rows, one per size (a bw server: the client's report).
    pub rows: Vec<Row>,
    /// Data messages this side completed as the requester (SENDs, WRITEs,
    /// READs).
    pub done: u64,
    /// Data messages taken from the peer (receives; write_lat: polled counts).
    pub received: u64,
    /// Completions polled without error.
    pub completions: u64,
    /// Completions with an error.
    pub errors: u64,
    /// Messages this side moves each way it moves them (iterations times
    /// sizes).
    pub expected: u64,
    /// The data phase (or the wait for it) started.
    pub started: bool,
    /// The QP's status at the end.
    pub qp: Option<RcQpStatus>,
    /// Why the session failed.
    pub error: Option<String>,
    /// What the session must have done to succeed.
    pub needs: Needs,
}

/// What a role waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Every message completed as the requester.
    Done,
    /// Every message received.
    Received,
    /// Both.
    Both,
    /// Only the exchange (write/read bw server, read_lat server).
    Exchange,
}

impl RcReport {
    fn new(cfg: &RcConfig, client: bool) -> Self {
        let needs = match (cfg.op, cfg.latency, client) {
            (_, false, true) | (Op::Read, true, true) => Needs::Done,
            (Op::Send, false, false) => Needs::Received,
            (Op::Send | Op::Write, true, _) => Needs::Both,
            (Op::Write | Op::Read, false, false) | (Op::Read, true, false) => Needs::Exchange,
        };
        RcReport {
            name: cfg.name(),
            client,
            peer: None,
            rows: Vec::new(),
            done: 0,
            received: 0,
            completions: 0,
            errors: 0,
            expected: 0,
            started: false,
            qp: None,
            error: None,
            needs,
        }
    }

    /// The session ran to its end and every message it waited for came.
    pub fn succeeded(&self) -> bool {
        self.error.is_none()
            && self.errors == 0
            && match self.needs {
                Needs::Done => self.done == self.expected,
                Needs::Received => self.received == self.expected,
                Needs::Both => self.done == self.expected && self.received == self.expected,
                Needs::Exchange => self.started,
            }
    }

    /// The reconciliation line, e.g. `uperf: perftest write_bw client (RC):
    /// 200 messages, 2 completions, 0 errors; peer 10.77.0.3 qpn 0x11; qp
    /// 0x1000: 0 retransmits, 0 RNR NAKs, 0 ACK timeouts, 0 sequence NAKs,
    /// 0 duplicates, 0 READ gaps`.
    pub fn summary_line(&self) -> String {
        let role = if self.client { "client" } else { "server" };
        let peer = self
            .peer
            .map_or_else(String::new, |(ip, q)| format!("; peer {ip} qpn {q:#x}"));
        let qp = self.qp.as_ref().map_or_else(String::new, |q| {
            format!(
                "; qp {:#x}: {} retransmits, {} RNR NAKs, {} ACK timeouts, {} sequence NAKs, {} duplicates, {} READ gaps",
                q.qpn,
                q.stats.retransmits,
                q.stats.rnr_naks_received,
                q.stats.ack_timeouts,
                q.stats.seq_naks_received,
                q.stats.duplicates,
                q.stats.read_gaps
            )
        });
        format!(
            "uperf: perftest {} {role} (RC): {} messages, {} completions, {} errors{peer}{qp}",
            self.name,
            self.done + self.received,
            self.completions,
            self.errors
        )
    }

    /// What failed, or which messages are missing; `None` on success.
    pub fn failure(&self) -> Option<String> {
        if let Some(e) = &self.error {
            return Some(e.clone());
        }
        if self.succeeded() {
            return None;
        }
        Some(match self.needs {
            _ if self.errors > 0 => format!("{} completions with errors", self.errors),
            Needs::Received => format!("{} of {} messages arrived", self.received, self.expected),
            Needs::Exchange => "the test did not start".to_string(),
            _ => format!(
                "{} of {} messages completed, {} of {} received",
                self.done, self.expected, self.received, self.expected
            ),
        })
    }
}

// ------------------------------------------------------------ data phase

/// Where write_lat is in its iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Polling our buffer for the peer's count.
    Poll,
    /// Ready to post the next WRITE.
    Post,
    /// Waiting for the WRITE's completion.
    Complete,
}

/// The buffer: a send half and a receive half of `buff` bytes each, as
/// perftest lays it out; the peer WRITEs into and READs from the second.
#[derive(Debug, Clone, Copy)]
struct Buf {
    mr: MrHandle,
    info: MrInfo,
    buff: usize,
}

impl Buf {
    fn local(&self, len: usize) -> Sge {
        Sge {
            addr: self.info.addr,
            len: len as u32,
            lkey: self.info.lkey,
        }
    }
    fn recv(&self, len: usize) -> Sge {
        Sge {
            addr: self.info.addr + self.buff as u64,
            len: len as u32,
            lkey: self.info.lkey,
        }
    }
}

/// The RC side of a perftest session: its QP, buffer and data phase
/// (driven by
/// [`Session`](super::Session)).
#[derive(Debug)]
pub struct Rc {
    cfg: RcConfig,
    client: bool,
    qp: Option<RcQpHandle>,
    buf: Option<Buf>,
    peer: Option<KeyMsg>,
    mtu: usize,
    sizes: Vec<usize>,
    size_idx: usize,
    run: Option<Run<Phase>>,
    /// READs in flight at most (the peer's out_reads), else the tx depth.
    window: u64,
    cq_mod: usize,
    last_row: Option<BwRow>,
    peer_report: Vec<[u8; 8]>,
    wcs: Vec<Wc>,
    report: RcReport,
}

session_report!(RcReport);

impl Transport for Rc {
    type Config = RcConfig;
    type Report = RcReport;

    fn new(cfg: RcConfig, client: bool) -> Self {
        let report = RcReport::new(&cfg, client);
        let cq_mod = cfg.cq_mod();
        Rc {
            cfg,
            client,
            qp: None,
            buf: None,
            peer: None,
            mtu: 0,
            sizes: Vec::new(),
            size_idx: 0,
            run: None,
            window: 1,
            cq_mod,
            last_row: None,
            peer_report: Vec::new(),
            wcs: Vec::new(),
            report,
        }
    }

    fn test_name(cfg: &RcConfig) -> String {
        cfg.name()
    }

    fn check(cfg: &RcConfig, _stack: &Stack) -> Result<()> {
        check_config(cfg)
    }

    fn ipv6_gid(cfg: &RcConfig) -> bool {
        cfg.ipv6
    }

    fn timeouts(cfg: &RcConfig) -> Timeouts {
        Timeouts {
            exchange: cfg.exchange_timeout,
            connect: cfg.connect_timeout,
        }
    }

    fn step_wait(&self, x: &Exchange) -> Option<Duration> {
        match x.step {
            Step::Drain => Some(DRAIN),
            _ if self.waits_for_run(x) => Some(RUN_WAIT.max(self.cfg.exchange_timeout)),
            _ => None,
        }
    }

    /// After the MTU is known: the sizes, the buffer, the QP, our key, the
    /// banner.
    fn setup(
        &mut self,
        x: &mut Exchange,
        now: Instant,
        stack: &mut Stack,
        mtu: usize,
    ) -> Result<(), Fail> {
        self.mtu = mtu;
        let cfg = &self.cfg;
        self.sizes = cfg.sizes();
        self.report.expected = cfg.iters * self.sizes.len() as u64;
        let buff = buff_size(cfg.max_size());
        let mr = stack
            .rc()
            .reg_mr(2 * buff, access(cfg.op))
            .map_err(|e| format!("registering a {} byte buffer: {e}", 2 * buff))?;
        let info = stack
            .rc_ref()
            .mr_info(mr)
            .map_err(|e| format!("the buffer's keys: {e}"))?;
        self.buf = Some(Buf { mr, info, buff });
        let qc = RcQpConfig {
            mtu: Some(self.mtu),
            max_send_wr: cfg.tx_depth() as usize + 16,
            max_recv_wr: cfg.rx_depth() as usize + 16,
            max_rd_atomic: usize::from(OUT_READS),
            max_dest_rd_atomic: usize::from(OUT_READS),
            traffic_class: cfg.tclass,
            ..RcQpConfig::default()
        };
        let qp = stack
            .rc()
            .create_qp(&qc)
            .map_err(|e| format!("creating the RC queue pair: {e}"))?;
        self.qp = Some(qp);
        let st = stack
            .rc_ref()
            .qp_status(qp)
            .map_err(|e| format!("the RC queue pair: {e}"))?;
        x.me = KeyMsg {
            lid: 0,
            out_reads: if cfg.op == Op::Read { OUT_READS } else { 1 },
            qpn: st.qpn,
            psn: st.initial_psn,
            rkey: info.rkey,
            vaddr: info.addr + buff as u64,
            gid: x.our_gid(stack)?,
            srqn: 0,
        };
        let send_server = cfg.op == Op::Send && !self.client;
        x.output.push(banner_with(&BannerInfo {
            title: &cfg.title(),
            connection: "RC",
            tx_depth: self.client.then(|| cfg.tx_depth()),
            rx_depth: send_server.then(|| cfg.rx_depth()),
            cq_mod: (!cfg.latency).then_some(self.cq_mod),
            mtu: self.mtu,
            out_reads: (cfg.op == Op::Read).then_some(OUT_READS),
        }));
        x.goto(now, Step::Key(0));
        Ok(())
    }

    fn on_key(
        &mut self,
        x: &mut Exchange,
        now: Instant,
        stack: &mut Stack,
        i: u8,
        k: KeyMsg,
    ) -> Result<(), Fail> {
        let n = self.cfg.keys();
        if self.peer.is_none() {
            let ip = peer_ip(&k, &x.me)?;
            let qp = self.qp.ok_or("no queue pair")?;
            stack
                .rc()
                .connect(
                    qp,
                    RcDest {
                        ip,
                        qpn: k.qpn,
                        psn: k.psn,
                    },
                )
                .map_err(|e| format!("connecting the RC queue pair: {e}"))?;
            self.peer = Some(k);
            self.report.peer = Some((ip, k.qpn));
            let depth = self.cfg.tx_depth();
            self.window = if self.cfg.op == Op::Read {
                depth.min(u64::from(k.out_reads.max(1)))
            } else {
                depth
            };
        }
        // The exchange where perftest prints the remote side (the third of
        // SEND tests, the one before the RTR sync otherwise).
        let remote_at = if self.cfg.op == Op::Send { 2 } else { n - 2 };
        if i == remote_at {
            let verb = self.cfg.op.addr_verb();
            x.output.push(address_lines_verb("local", &x.me, verb));
            x.output.push(address_lines_verb("remote", &k, verb));
        }
        if i + 1 < n {
            x.goto(now, Step::Key(i + 1));
            return Ok(());
        }
        self.report.started = true;
        let idle_server = !self.client && self.cfg.op != Op::Send;
        let read_lat_server = idle_server && self.cfg.latency;
        if !read_lat_server {
            x.output.push(RESULT_LINE.to_string());
            x.output.push(
                if self.cfg.latency {
                    LAT_HEADER
                } else {
                    BW_HEADER
                }
                .to_string(),
            );
        }
        match (self.cfg.op, self.cfg.latency, self.client) {
            (Op::Send, ..) => self.enter_prerun(x, now, stack),
            (_, true, false) if self.cfg.op == Op::Read => {
                x.goto(now, Step::Close);
                Ok(())
            }
            (_, false, false) => {
                x.goto(now, Step::EndSync);
                Ok(())
            }
            _ => self.start_run(x, now, stack),
        }
    }

    fn start_run(&mut self, x: &mut Exchange, now: Instant, stack: &mut Stack) -> Result<(), Fail> {
        match self.run.as_mut() {
            Some(r) => r.waiting_since = now,
            None => self.run = Some(self.new_run(now, 0)),
        }
        x.goto(now, Step::Run);
        self.run_turn(x, now, stack)
    }

    fn run_turn(&mut self, x: &mut Exchange, now: Instant, stack: &mut Stack) -> Result<(), Fail> {
        self.poll_cq(now, stack)?;
        let iters = self.cfg.iters;
        let client = self.client;
        let Some(run) = self.run.as_ref() else {
            return Ok(());
        };
        let finished = match (self.cfg.op, self.cfg.latency, client) {
            // bw senders (and the READ latency client, one at a time).
            (_, false, true) | (Op::Read, true, true) => {
                let depth = if self.cfg.latency { 1 } else { self.window };
                while self
                    .run
                    .as_ref()
                    .is_some_and(|r| r.posted < iters && r.posted - r.completed < depth)
                {
                    self.post(now, stack)?;
                }
                self.run.as_ref().is_some_and(|r| r.completed == iters)
            }
            (Op::Send, false, false) => run.received >= iters,
            (Op::Send, true, _) => {
                // Ping-pong: the client sends first; each side sends once
                // its last send completed and the peer's message came.
                let may_post = run.posted < iters
                    && run.completed == run.posted
                    && if client {
                        run.received == run.posted
                    } else {
                        run.received > run.posted
                    };
                if may_post {
                    self.post(now, stack)?;
                }
                self.run.as_ref().is_some_and(|r| {
                    r.posted == iters && r.completed == iters && r.received == iters
                })
            }
            (Op::Write, true, _) => self.write_lat_turn(now, stack)?,
            _ => true,
        };
        if finished {
            return self.finish_run(x, now, stack);
        }
        let Some(run) = self.run.as_ref() else {
            return Ok(());
        };
        if now >= run.waiting_since + self.cfg.timeout {
            return Err(format!(
                "{} of {} bytes: nothing moved for {} s ({} posted, {} completed, {} received of {iters}){}",
                self.cfg.name(),
                run.size,
                self.cfg.timeout.as_secs_f64(),
                run.posted,
                run.completed,
                run.received,
                self.qp
                    .and_then(|q| stack.rc_ref().qp_status(q).ok())
                    .map_or_else(String::new, |s| format!(
                        "; qp state {:?}, {} retransmits, {} ACK timeouts, {} RNR NAKs",
                        s.state,
                        s.stats.retransmits,
                        s.stats.ack_timeouts,
                        s.stats.rnr_naks_received
                    ))
            ));
        }
        Ok(())
    }

    fn next_size(&mut self, x: &mut Exchange, now: Instant, stack: &mut Stack) -> Result<(), Fail> {
        self.size_idx += 1;
        if self.size_idx < self.sizes.len() {
            return if self.cfg.op == Op::Send {
                self.enter_prerun(x, now, stack)
            } else {
                self.start_run(x, now, stack)
            };
        }
        match (self.cfg.op, self.cfg.latency) {
            (Op::Write, true) => {
                x.output.push(RESULT_LINE.to_string());
                x.goto(now, Step::Drain);
            }
            (Op::Read, true) => x.goto(now, Step::Close),
            (Op::Send, _) => {
                x.output.push(RESULT_LINE.to_string());
                x.goto(now, Step::Close);
            }
            _ => {
                x.output.push(RESULT_LINE.to_string());
                x.goto(now, Step::EndSync);
            }
        }
        Ok(())
    }

    /// perftest's `xchg_bw_reports`: five 8-byte messages each way; the
    /// server prints the client's.
    fn report_exchange(
        &mut self,
        x: &mut Exchange,
        now: Instant,
        stack: &Stack,
        i: u8,
    ) -> Result<(), Fail> {
        let mine = report_msgs(&self.last_row.unwrap_or(BwRow {
            bytes: 0,
            iters: 0,
            peak: None,
            avg: None,
            msg_rate: None,
        }))[usize::from(i)];
        if let Some(b) = x.xchg(stack, &mine, 8)? {
            let mut m = [0u8; 8];
            m.copy_from_slice(&b);
            self.peer_report.push(m);
            if i < 4 {
                x.goto(now, Step::Reports(i + 1));
            } else {
                if !self.client {
                    let mut all = [[0u8; 8]; 5];
                    all.copy_from_slice(&self.peer_report);
                    let row = Row::Bw(parse_report(&all));
                    x.output.push(row.to_string());
                    self.report.rows.push(row);
                }
                x.goto(now, Step::Close);
            }
        }
        Ok(())
    }

    fn on_close(&mut self, x: &mut Exchange) {
        // perftest prints its closing line after the close exchange where
        // it runs no data phase after it.
        if self.cfg.op != Op::Send && (!self.client || self.cfg.latency) {
            x.output.push(RESULT_LINE.to_string());
        }
    }

    fn run_deadline(&self) -> Option<Instant> {
        self.run
            .as_ref()
            .map(|r| r.waiting_since + self.cfg.timeout)
    }

    fn release(&mut self, stack: &mut Stack) {
        if let Some(qp) = self.qp.take() {
            if let Ok(st) = stack.rc_ref().qp_status(qp) {
                self.report.qp = Some(st);
            }
            let _ = stack.rc().destroy_qp(qp);
        }
        if let Some(b) = self.buf.take() {
            let _ = stack.rc().dereg_mr(b.mr);
        }
    }

    fn report(&self) -> &RcReport {
        &self.report
    }

    fn report_mut(&mut self) -> &mut RcReport {
        &mut self.report
    }
}

impl Rc {
    /// Whether this step waits for the peer's data phase.
    fn waits_for_run(&self, x: &Exchange) -> bool {
        match x.step {
            Step::EndSync => !self.client,
            Step::Close => {
                (self.cfg.op == Op::Read && self.cfg.latency && !self.client)
                    || (self.cfg.op == Op::Send && !self.cfg.latency && self.client)
            }
            Step::AfterRun => self.client,
            _ => false,
        }
    }

    fn receives_here(&self) -> bool {
        self.cfg.op == Op::Send && (self.cfg.latency || !self.client)
    }

    /// Post the receives of the next size, then sync: the peer sends only
    /// after our answer to this exchange.
    fn enter_prerun(
        &mut self,
        x: &mut Exchange,
        now: Instant,
        stack: &mut Stack,
    ) -> Result<(), Fail> {
        let mut posted = 0;
        if self.receives_here() {
            let size = self.sizes[self.size_idx];
            let want = self.cfg.rx_depth();
            while posted < want {
                self.post_recv(stack, size)?;
                posted += 1;
            }
        }
        self.run = Some(self.new_run(now, posted));
        x.goto(now, Step::PreRun);
        Ok(())
    }

    fn post_recv(&mut self, stack: &mut Stack, size: usize) -> Result<(), Fail> {
        let (Some(qp), Some(b)) = (self.qp, self.buf) else {
            return Ok(());
        };
        stack
            .rc()
            .post_recv(qp, 0, b.recv(size))
            .map_err(|e| format!("posting a receive: {e}"))
    }

    fn new_run(&self, now: Instant, recv_posted: u64) -> Run<Phase> {
        let size = self.sizes[self.size_idx];
        let n = self.cfg.iters.min(1 << 24) as usize;
        Run {
            size,
            posted: 0,
            completed: 0,
            received: 0,
            recv_posted,
            tposted: Vec::with_capacity(n),
            tcompleted: if self.cfg.latency {
                Vec::new()
            } else {
                vec![Instant::ZERO; n]
            },
            first_rx: None,
            last_rx: None,
            waiting_since: now,
            // The write_lat server writes first.
            extra: if self.client {
                Phase::Poll
            } else {
                Phase::Post
            },
        }
    }

    /// Post the next work request of the run.
    fn post(&mut self, now: Instant, stack: &mut Stack) -> Result<(), Fail> {
        let (Some(qp), Some(b), Some(peer)) = (self.qp, self.buf, self.peer) else {
            return Err("the queue pair is not set up".to_string());
        };
        let iters = self.cfg.iters;
        let cq_mod = self.cq_mod as u64;
        let window = self.window;
        let latency = self.cfg.latency;
        let op = self.cfg.op;
        let Some(run) = self.run.as_mut() else {
            return Ok(());
        };
        let s = run.posted;
        let signaled = latency
            || s % cq_mod == cq_mod - 1
            || s + 1 == iters
            // Fewer READs may be in flight than a moderation period: the
            // one that fills the window must be signaled, or none would be.
            || (window < cq_mod && s + 1 - run.completed >= window);
        let rop = match op {
            Op::Send => RcOp::Send,
            Op::Write => RcOp::Write {
                remote_addr: peer.vaddr,
                rkey: peer.rkey,
            },
            Op::Read => RcOp::Read {
                remote_addr: peer.vaddr,
                rkey: peer.rkey,
            },
        };
        let wr = RcSendWr {
            wr_id: s,
            op: rop,
            local: Local::Sge(b.local(run.size)),
            signaled,
            solicited: false,
        };
        stack
            .rc()
            .post_send(qp, &wr)
            .map_err(|e| format!("posting {} {} of {iters}: {e}", op.name(), s + 1))?;
        run.posted += 1;
        run.tposted.push(now);
        run.waiting_since = now;
        Ok(())
    }

    fn poll_cq(&mut self, now: Instant, stack: &mut Stack) -> Result<(), Fail> {
        let Some(qp) = self.qp else {
            return Ok(());
        };
        let mut wcs = std::mem::take(&mut self.wcs);
        let r = self.take_wcs(now, stack, qp, &mut wcs);
        wcs.clear();
        self.wcs = wcs;
        r
    }

    fn take_wcs(
        &mut self,
        now: Instant,
        stack: &mut Stack,
        qp: RcQpHandle,
        wcs: &mut Vec<Wc>,
    ) -> Result<(), Fail> {
        let iters = self.cfg.iters;
        let rx_depth = self.cfg.rx_depth();
        while stack.rc().poll_cq(qp, 64, wcs).unwrap_or(0) > 0 {
            for c in wcs.drain(..) {
                if c.status != WcStatus::Success {
                    self.report.errors += 1;
                    return Err(format!(
                        "{:?} work request {} completed with error {:?}",
                        c.opcode, c.wr_id, c.status
                    ));
                }
                self.report.completions += 1;
                let Some(run) = self.run.as_mut() else {
                    continue;
                };
                run.waiting_since = now;
                match c.opcode {
                    WcOpcode::Send
                    | WcOpcode::RdmaWrite
                    | WcOpcode::RdmaRead
                    | WcOpcode::CompareSwap
                    | WcOpcode::FetchAdd => {
                        let upto = (c.wr_id + 1).min(run.posted);
                        if upto > run.completed {
                            self.report.done += upto - run.completed;
                            run.completed = upto;
                        }
                        if let Some(t) = run.tcompleted.get_mut(c.wr_id as usize) {
                            *t = now;
                        }
                    }
                    WcOpcode::Recv | WcOpcode::RecvRdmaWithImm => {
                        run.received += 1;
                        self.report.received += 1;
                        run.first_rx.get_or_insert(now);
                        run.last_rx = Some(now);
                        // perftest reposts while the total stays within
                        // the iterations.
                        let repost = run.recv_posted < iters
                            && (!self.cfg.latency || run.received + rx_depth <= iters);
                        if repost {
                            run.recv_posted += 1;
                            let size = run.size;
                            self.post_recv(stack, size)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// write_lat: poll our receive half's last byte for the peer's count,
    /// post our WRITE with our count in its last byte, wait for its
    /// completion; returns whether the run is over.
    fn write_lat_turn(&mut self, now: Instant, stack: &mut Stack) -> Result<bool, Fail> {
        let iters = self.cfg.iters;
        let Some(b) = self.buf else {
            return Ok(true);
        };
        loop {
            let Some(run) = self.run.as_mut() else {
                return Ok(true);
            };
            match run.extra {
                Phase::Poll => {
                    if run.received >= iters {
                        run.extra = Phase::Post;
                        continue;
                    }
                    let want = (run.received + 1) as u8;
                    let at = b.buff + run.size - 1;
                    let seen = stack
                        .rc_ref()
                        .mr(b.mr)
                        .map_err(|e| format!("reading the buffer: {e}"))?
                        .get(at)
                        .copied();
                    if seen != Some(want) {
                        return Ok(false);
                    }
                    run.received += 1;
                    run.waiting_since = now;
                    self.report.received += 1;
                    run.extra = Phase::Post;
                }
                Phase::Post => {
                    if run.posted >= iters {
                        run.extra = Phase::Complete;
                        continue;
                    }
                    let count = (run.posted + 1) as u8;
                    let at = run.size - 1;
                    let data = stack
                        .rc()
                        .mr_mut(b.mr)
                        .map_err(|e| format!("writing the buffer: {e}"))?;
                    if let Some(x) = data.get_mut(at) {
                        *x = count;
                    }
                    self.post(now, stack)?;
                    if let Some(run) = self.run.as_mut() {
                        run.extra = Phase::Complete;
                    }
                }
                Phase::Complete => {
                    if run.completed < run.posted {
                        return Ok(false);
                    }
                    if run.posted >= iters && run.received >= iters {
                        return Ok(true);
                    }
                    run.extra = Phase::Poll;
                }
            }
        }
    }

    fn finish_run(
        &mut self,
        x: &mut Exchange,
        now: Instant,
        stack: &mut Stack,
    ) -> Result<(), Fail> {
        let Some(run) = self.run.take() else {
            return Ok(());
        };
        let row = match (self.cfg.op, self.cfg.latency, self.client) {
            (op, true, _) => Row::Lat(lat_row_rtt(
                run.size,
                &run.tposted,
                if op == Op::Read { 1 } else { 2 },
            )),
            (Op::Send, false, false) => Row::Bw(bw_receiver_row(
                run.size,
                run.received,
                run.first_rx,
                run.last_rx,
            )),
            _ => {
                let r = bw_sender_row_cq(run.size, &run.tposted, &run.tcompleted, self.cq_mod);
                self.last_row = Some(r);
                Row::Bw(r)
            }
        };
        x.output.push(row.to_string());
        self.report.rows.push(row);
        if self.cfg.op == Op::Send && !self.cfg.latency && self.cfg.all_sizes {
            x.goto(now, Step::AfterRun);
            Ok(())
        } else {
            self.next_size(x, now, stack)
        }
    }
}

/// `uperf -c HOST --rdma rc`: one session against a perftest RC server.
pub type RcClient = Client<Rc>;

/// `uperf -s --rdma rc`: perftest RC clients, one after another.
pub type RcServer = Server<Rc>;

// ------------------------------------------------------------ front end

/// Where `uperf --rdma rc` runs.
pub type RcRole = PerftestRole;

/// Runs `uperf --rdma rc` on a node.
pub type RcUser = User<Rc>;

/// Refuse settings perftest would refuse, before touching the network.
pub fn check_config(cfg: &RcConfig) -> Result<()> {
    if cfg.iters < MIN_ITERS {
        anyhow::bail!(
            "perftest runs at least {MIN_ITERS} iterations (-n {})",
            cfg.iters
        );
    }
    if let Some(s) = cfg.size {
        if s == 0 || s > MAX_SIZE {
            anyhow::bail!("--size {s}: give 1 byte to {MAX_SIZE} bytes");
        }
    }
    Ok(())
}

#[cfg(test)]
mod test {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddrV4};
    use ustack::wire::exchange::ipv4_gid;

    #[test]
    fn names_titles_and_defaults_like_perftest() {
        let c = RcConfig::new(Op::Write, false);
        assert_eq!(c.name(), "write_bw");
        assert_eq!(c.title(), "RDMA_Write BW Test");
        assert_eq!(c.sizes(), vec![65536]);
        // Above 8 KiB perftest signals every work request.
        assert_eq!(c.cq_mod(), 1);
        assert_eq!(c.keys(), 3);
        let mut c = RcConfig::new(Op::Read, true);
        assert_eq!(c.title(), "RDMA_Read Latency Test");
        assert_eq!(c.sizes(), vec![2]);
        assert_eq!((c.keys(), c.tx_depth(), c.cq_mod()), (4, 1, 1));
        c.all_sizes = true;
        assert_eq!(c.max_size(), MAX_SWEEP_SIZE);
        let mut s = RcConfig::new(Op::Send, false);
        s.size = Some(1024);
        s.iters = 1000;
        assert_eq!((s.cq_mod(), s.tx_depth(), s.rx_depth()), (100, 128, 512));
        s.iters = 199;
        // min(512, 199) is odd: perftest's workaround adds one.
        assert_eq!((s.cq_mod(), s.tx_depth(), s.rx_depth()), (100, 128, 200));
        s.iters = 50;
        assert_eq!(s.cq_mod(), 50);
        s.all_sizes = true;
        // -a keeps moderation on whatever the size.
        s.iters = 1000;
        assert_eq!(s.cq_mod(), 100);
        assert_eq!(sweep_sizes().first(), Some(&2));
        assert_eq!(sweep_sizes().last(), Some(&(8 << 20)));
        assert_eq!(sweep_sizes().len(), 23);
        assert_eq!("read".parse::<Op>(), Ok(Op::Read));
        assert!("atomic".parse::<Op>().is_err());
    }

    #[test]
    fn bw_reports_round_trip_in_network_order() {
        let r = BwRow {
            bytes: 65536,
            iters: 200,
            peak: Some(1234.5),
            avg: Some(1000.25),
            msg_rate: Some(0.016),
        };
        let m = report_msgs(&r);
        assert_eq!(m[0], [0, 0, 0, 0, 0, 1, 0, 0]);
        assert_eq!(m[1], [0, 0, 0, 0, 0, 0, 0, 200]);
        // A double's bytes, most significant first (perftest's bswap).
        assert_eq!(m[2], 1234.5f64.to_be_bytes());
        assert_eq!(parse_report(&m), r);
        let none = BwRow {
            peak: None,
            avg: None,
            msg_rate: None,
            ..r
        };
        assert_eq!(parse_report(&report_msgs(&none)).avg, Some(0.0));
    }

    #[test]
    fn rc_address_lines_carry_keys_like_perftest() {
        let k = KeyMsg {
            qpn: 0x1000,
            psn: 0x5a3c1e,
            out_reads: 128,
            rkey: 0x1a2b3c,
            vaddr: 0x7e00_0000_1000,
            gid: ipv4_gid(Ipv4Addr::new(10, 77, 0, 2)),
            ..KeyMsg::default()
        };
        let l = address_lines_verb("local", &k, AddrVerb::Read);
        assert_eq!(
            l.lines().next().unwrap(),
            " local address: LID 0000 QPN 0x1000 PSN 0x5a3c1e OUT 0x80 RKey 0x1a2b3c VAddr 0x007e0000001000"
        );
        let w = address_lines_verb("remote", &k, AddrVerb::Write);
        assert!(w.starts_with(" remote address: LID 0000 QPN 0x1000 PSN 0x5a3c1e RKey 0x1a2b3c VAddr 0x007e0000001000\n GID: "));
        assert!(!address_lines_verb("local", &k, AddrVerb::Send).contains("RKey"));
    }

    #[test]
    fn reports_need_what_the_role_waits_for() {
        let mut c = RcConfig::new(Op::Write, false);
        c.iters = 10;
        let mut r = RcReport::new(&c, false);
        assert_eq!(r.needs, Needs::Exchange);
        assert!(r.failure().is_some());
        r.started = true;
        assert_eq!(r.failure(), None);
        let mut r = RcReport::new(&c, true);
        r.expected = 10;
        r.done = 9;
        assert!(r.failure().unwrap().contains("9 of 10"));
        r.done = 10;
        r.completions = 10;
        assert!(r.succeeded());
        assert!(r.summary_line().starts_with(
            "uperf: perftest write_bw client (RC): 10 messages, 10 completions, 0 errors"
        ));
        let l = RcConfig::new(Op::Send, true);
        assert_eq!(RcReport::new(&l, true).needs, Needs::Both);
        assert_eq!(
            RcReport::new(&RcConfig::new(Op::Read, true), false).needs,
            Needs::Exchange
        );
        assert_eq!(
            RcReport::new(&RcConfig::new(Op::Read, true), true).needs,
            Needs::Done
        );
        assert_eq!(
            RcReport::new(&RcConfig::new(Op::Send, false), false).needs,
            Needs::Received
        );
    }

    mod sim {
        use super::*;
        use ustack::node::App;
        use ustack::sim::{LinkConfig, SimNet, host_config};

        const SERVER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

        /// Node 0 serves, node 1 is the client, on a 1 Gbit/s sim link
        /// with `loss`, in virtual time: both reports once both finished.
        fn pair(cfg: &RcConfig, loss: f64) -> (RcReport, RcReport, Vec<String>, Vec<String>) {
            let mut net = SimNet::new(LinkConfig {
                delay: Duration::from_micros(20),
                rate_bps: 1_000_000_000,
                loss,
                ..LinkConfig::default()
            });
            net.add(host_config(1));
            net.add(host_config(2));
            let mut server =
                RcServer::new(cfg.clone(), ustack::wire::exchange::PERFTEST_PORT, true);
            let mut client = RcClient::new(
                cfg.clone(),
                SocketAddrV4::new(SERVER, ustack::wire::exchange::PERFTEST_PORT),
            );
            let deadline = net.now + Duration::from_secs(120);
            while net.now < deadline && (!client.done() || server.reports.is_empty()) {
                let next = net.now + Duration::from_millis(10);
                net.run_until(
                    next,
                    &mut [&mut server as &mut dyn App, &mut client],
                    |_| false,
                );
                net.now = net.now.max(next);
            }
            let c = client.report.clone().expect("the client did not finish");
            let s = server
                .reports
                .first()
                .cloned()
                .unwrap_or_else(|| panic!("the server did not finish: {:?}", server.output));
            (c, s, client.output.clone(), server.output.clone())
        }

        fn rows(r: &RcReport) -> Vec<usize> {
            r.rows
                .iter()
                .map(|r| match r {
                    Row::Lat(l) => l.bytes,
                    Row::Bw(b) => b.bytes,
                })
                .collect()
        }

        #[test]
        fn every_rc_test_runs_both_roles_on_the_sim_link() {
            for op in [Op::Send, Op::Write, Op::Read] {
                for latency in [false, true] {
                    for size in [2, 4096] {
                        let mut cfg = RcConfig::new(op, latency);
                        cfg.iters = 50;
                        cfg.size = Some(size);
                        let (c, s, co, so) = pair(&cfg, 0.0);
                        let what = format!("{} {size}: {co:?} {so:?}", cfg.name());
                        assert_eq!(c.failure(), None, "{what}");
                        assert_eq!(s.failure(), None, "{what}");
                        assert_eq!(rows(&c), vec![size], "{what}");
                        let n = 50;
                        match (op, latency) {
                            (Op::Send, false) => {
                                assert_eq!((c.done, s.received), (n, n), "{what}");
                                assert_eq!(rows(&s), vec![size], "{what}");
                            }
                            (Op::Send | Op::Write, true) => {
                                assert_eq!((c.done, c.received), (n, n), "{what}");
                                assert_eq!((s.done, s.received), (n, n), "{what}");
                                assert_eq!(rows(&s), vec![size], "{what}");
                            }
                            // The bw server prints the client's report.
                            (_, false) => {
                                assert_eq!(c.done, n, "{what}");
                                assert_eq!(s.rows, c.rows, "{what}");
                            }
                            (Op::Read, true) => {
                                assert_eq!(c.done, n, "{what}");
                                assert!(s.rows.is_empty(), "{what}");
                            }
                        }
                        for r in [&c, &s] {
                            let st = r.qp.as_ref().expect("QP status");
                            assert_eq!(st.stats.retransmits, 0, "{what}");
                        }
                    }
                }
            }
        }

        #[test]
        fn a_sweep_reaches_8_mib_and_loss_is_recovered() {
            let mut cfg = RcConfig::new(Op::Write, false);
            cfg.iters = 5;
            cfg.all_sizes = true;
            let (c, s, ..) = pair(&cfg, 0.0);
            assert_eq!(c.failure(), None);
            assert_eq!(rows(&c), sweep_sizes());
            assert_eq!(rows(&s), vec![8 << 20], "the client's last report");
            // RC under 1% loss: every message still completes, by
            // retransmission.
            for (op, latency) in [(Op::Send, false), (Op::Read, false), (Op::Write, true)] {
                let mut cfg = RcConfig::new(op, latency);
                cfg.iters = 200;
                cfg.size = Some(4096);
                let (c, s, co, so) = pair(&cfg, 0.01);
                assert_eq!(c.failure(), None, "{co:?} {so:?}");
                assert_eq!(s.failure(), None, "{co:?} {so:?}");
                let retx = |r: &RcReport| r.qp.as_ref().map_or(0, |q| q.stats.retransmits);
                assert!(retx(&c) + retx(&s) > 0, "{co:?} {so:?}");
            }
        }
    }

    #[test]
    fn banner_for_rc() {
        let b = banner_with(&BannerInfo {
            title: "RDMA_Read BW Test",
            connection: "RC",
            tx_depth: Some(128),
            rx_depth: None,
            cq_mod: Some(100),
            mtu: 1024,
            out_reads: Some(128),
        });
        assert!(b.contains(" Connection type : RC\t\tUsing SRQ      : OFF\n"));
        assert!(b.contains(" Outstand reads  : 128\n"));
        assert!(!b.contains("Max inline data"));
    }
}
