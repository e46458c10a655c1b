//! `uperf --rdma --perftest`: perftest's `ib_send_bw -c UD` and
//! `ib_send_lat -c UD` over the stack's own RoCEv2 UD, with perftest's
//! out-of-band exchange over the stack's own TCP, in both roles.
//!
//! A session is a state machine driven from the poll loop: the preamble
//! (version, page and cache-line size, MTU), three key exchanges, then per
//! message size a sync key exchange (after the receiver posted its
//! buffers), the data phase and, for bw with `-a`, one more key exchange;
//! then the close key exchange and `"done\0"`. The client writes then reads
//! each message and the server reads then writes, as perftest does
//! (`ctx_hand_shake`, `ctx_xchg_data_ethernet`). The byte formats are in
//! [`ustack::ud::exchange`]; the message transport is [`MsgConn`].
//!
//! Data phases as perftest runs them:
//! - bw client: `iters` SENDs of `size` bytes, at most tx-depth (128)
//!   outstanding; figures from post and send completion times.
//! - bw server: counts receives until `iters` arrived (timing from the
//!   first one), or gives up after `timeout` without a new one and reports
//!   how many came (perftest waits 60-120 s, then exits without a report).
//! - lat: strict ping-pong, the client first; every send's post time is
//!   kept and latency is half the time between successive posts. Unlike
//!   perftest, a reply missing for `timeout` ends the test: UD loses
//!   packets and perftest would hang.
//!
//! Output follows perftest's layout (banner, addresses, table) so the two
//! sides' reports read alike; a figure without a time span prints `n/a`.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use ustack::device::Device;
use ustack::node::{App, Control, Node};
use ustack::tcp::{ListenHandle, State};
use ustack::ud::exchange::{
    DONE, KEY_MSG_LEN, KeyMsg, VERSION_LEN, gid_ipv4, ipv4_gid, mtu_bytes, mtu_enum, mtu_msg,
    parse_mtu_msg, parse_version, version_msg,
};
use ustack::ud::{
    Completion, GRH_LEN, QpConfig, QpHandle, SendWr, UdAddr, UdTransport, WcOpcode, WcStatus,
};
use ustack::{Instant, Stack};
use ustack_runtime::LoopConfig;

use crate::net::NodeRunner;
use crate::oob::{MsgConn, OobError};

pub use ustack::ud::exchange::PERFTEST_PORT;

/// perftest's `RESULT_LINE` (without its newline): 87 dashes.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";
/// perftest's latency table header (`RESULT_FMT_LAT`, trailing space included).
pub const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";
/// perftest's bandwidth table header (`RESULT_FMT`).
pub const BW_HEADER: &str =
    " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";
/// The device name in our banner.
pub const DEVICE_NAME: &str = "ustack (RoCEv2 by the stack)";
/// Fewest iterations perftest accepts.
pub const MIN_ITERS: u64 = 5;
/// perftest's page size (`cycle_buffer`) and cache line, as exchanged.
pub(crate) const CYCLE_BUFFER: u32 = 4096;
pub(crate) const CACHE_LINE: u32 = 64;
/// perftest's UD receive depth: `min(iters, 16000)`.
const MAX_RX_DEPTH: u64 = 16_000;
/// perftest's bw tx depth and completion moderation.
pub(crate) const BW_TX_DEPTH: u64 = 128;
pub(crate) const BW_CQ_MOD: usize = 100;
/// The size perftest's latency test uses without `-s`.
pub const LAT_DEFAULT_SIZE: usize = 2;
/// How long a bw client waits for the server's close message: the server
/// answers once every message arrived, and a stock server gives up only
/// 60 to 120 s after the last one.
pub(crate) const BW_CLOSE_WAIT: Duration = Duration::from_secs(150);
/// How long to wait for our last messages (close key, "done") to be
/// acknowledged before closing the connection.
pub(crate) const LINGER: Duration = Duration::from_secs(2);
/// Most peak-bandwidth windows started (perftest starts one at every
/// message, quadratic in the iterations).
const PEAK_STARTS: usize = 20_000;
/// perftest's message when `-s` exceeds the UD MTU.
pub const TOO_LARGE_MSG: &str = "Max message size in UD cannot be greater than MTU";

/// Which perftest program the session speaks with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// `ib_send_bw -c UD`.
    SendBw,
    /// `ib_send_lat -c UD`.
    SendLat,
}

impl Test {
    /// The name in our summary lines.
    pub fn name(self) -> &'static str {
        match self {
            Test::SendBw => "send_bw",
            Test::SendLat => "send_lat",
        }
    }
    fn title(self) -> &'static str {
        match self {
            Test::SendBw => "Send BW Test",
            Test::SendLat => "Send Latency Test",
        }
    }
}

/// Settings of one side (perftest's flags; both sides must agree on
/// `iters` and `all_sizes`, as with perftest).
#[derive(Debug, Clone)]
pub struct PerftestConfig {
    /// bw or lat.
    pub test: Test,
    /// Messages per size (`-n`).
    pub iters: u64,
    /// Message size (`-s`; client only): lat 2 and bw the MTU without it.
    pub size: Option<usize>,
    /// Sweep 2, 4, ... up to the MTU (`-a`).
    pub all_sizes: bool,
    /// Q_Key of our QP and of every send.
    pub qkey: u32,
    /// lat: longest wait for the next message; bw server: longest wait
    /// for the next message before reporting what arrived.
    pub timeout: Duration,
    /// Longest wait for each exchange message.
    pub exchange_timeout: Duration,
    /// Longest wait for the TCP connection (client).
    pub connect_timeout: Duration,
}

impl PerftestConfig {
    /// perftest's defaults: 1000 iterations, Q_Key 0x11111111, 5 s
    /// message timeout, 30 s per exchange message, 5 s to connect.
    pub fn new(test: Test) -> Self {
        PerftestConfig {
            test,
            iters: 1000,
            size: None,
            all_sizes: false,
            qkey: ustack::ud::DEFAULT_QKEY,
            timeout: Duration::from_secs(5),
            exchange_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
        }
    }

    fn rx_depth(&self) -> u64 {
        self.iters.min(MAX_RX_DEPTH)
    }

    fn tx_depth(&self) -> u64 {
        match self.test {
            Test::SendBw => BW_TX_DEPTH.min(self.iters),
            Test::SendLat => 1,
        }
    }
}

// ------------------------------------------------------------ figures

/// One row of perftest's latency table, microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatRow {
    /// Message size.
    pub bytes: usize,
    /// Iterations run.
    pub iters: u64,
    /// Smallest, largest (without the two largest samples), median, mean,
    /// standard deviation, 99th and 99.9th percentile; `None` without a
    /// time span.
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub typical: Option<f64>,
    pub avg: Option<f64>,
    pub stdev: Option<f64>,
    pub p99: Option<f64>,
    pub p999: Option<f64>,
}

/// One row of perftest's bandwidth table (MB = 2^20 bytes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwRow {
    /// Message size.
    pub bytes: usize,
    /// Messages the figures count.
    pub iters: u64,
    /// Best MB/s over windows ending at completion-moderation points
    /// (sender only); `None` without a span (and at a receiver).
    pub peak: Option<f64>,
    /// MB/s over the whole run.
    pub avg: Option<f64>,
    /// Million messages per second over the whole run.
    pub msg_rate: Option<f64>,
}

/// A row of either table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Row {
    /// A latency row.
    Lat(LatRow),
    /// A bandwidth row.
    Bw(BwRow),
}

impl std::fmt::Display for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Row::Lat(r) => f.write_str(&lat_row_line(r)),
            Row::Bw(r) => f.write_str(&bw_row_line(r)),
        }
    }
}

/// `%-7.{prec}f` of a figure, `n/a` when there is none.
fn fig(v: Option<f64>, prec: usize) -> String {
    format!("{:<7}", crate::report::figure(v, prec))
}

/// A row as perftest prints it (`REPORT_FMT_LAT`).
pub fn lat_row_line(r: &LatRow) -> String {
    format!(
        " {:<7} {}          {}        {}      {}  \t       {}     \t{}\t\t{} \t\t{}",
        r.bytes,
        r.iters,
        fig(r.min, 2),
        fig(r.max, 2),
        fig(r.typical, 2),
        fig(r.avg, 2),
        fig(r.stdev, 2),
        fig(r.p99, 2),
        fig(r.p999, 2)
    )
}

/// A row as perftest prints it (`REPORT_FMT`).
pub fn bw_row_line(r: &BwRow) -> String {
    format!(
        " {:<7}    {:<10}       {}            {}\t\t   {}",
        r.bytes,
        r.iters,
        fig(r.peak, 2),
        fig(r.avg, 2),
        fig(r.msg_rate, 6)
    )
}

/// perftest's latency figures from the post time of every send
/// (`print_report_lat`): the `iters - 1` gaps between successive posts,
/// halved (a round trip is two one-way trips), sorted, the two largest
/// dropped. The standard deviation keeps perftest's truncation of each
/// deviation and its square to whole microseconds, so both tools print the
/// same figure for the same samples.
pub fn lat_row(bytes: usize, tposted: &[Instant]) -> LatRow {
    lat_row_rtt(bytes, tposted, 2)
}

/// [`lat_row`] with perftest's `rtt_factor`: 2 when each gap is a round
/// trip of two one-way messages (SEND, WRITE ping-pong), 1 when it is one
/// operation's round trip (RDMA READ).
pub fn lat_row_rtt(bytes: usize, tposted: &[Instant], rtt_factor: u32) -> LatRow {
    let iters = tposted.len() as u64;
    let mut d: Vec<u64> = tposted
        .windows(2)
        .map(|w| w[1].as_nanos().saturating_sub(w[0].as_nanos()))
        .collect();
    d.sort_unstable();
    let none = LatRow {
        bytes,
        iters,
        min: None,
        max: None,
        typical: None,
        avg: None,
        stdev: None,
        p99: None,
        p999: None,
    };
    // perftest needs at least 5 iterations: 4 gaps, 2 kept.
    let Some(n) = d.len().checked_sub(2).filter(|&n| n >= 2) else {
        return none;
    };
    if d[..=n].iter().all(|&x| x == 0) {
        return none;
    }
    let us = |x: u64| x as f64 / 1000.0 / f64::from(rtt_factor.max(1));
    let median = if (n - 1) % 2 == 1 {
        (d[n / 2] + d[n / 2 - 1]) / 2
    } else {
        d[n / 2]
    };
    let avg = d[..n].iter().map(|&x| us(x)).sum::<f64>() / n as f64;
    let var = d[..n]
        .iter()
        .map(|&x| {
            let dev = (avg - us(x)) as i32;
            f64::from((f64::from(dev).powi(2)) as i32)
        })
        .sum::<f64>()
        / n as f64;
    let at = |q: f64| d[((n as f64 * q).ceil() as usize).min(n)];
    LatRow {
        min: Some(us(d[0])),
        max: Some(us(d[n])),
        typical: Some(us(median)),
        avg: Some(avg),
        stdev: Some(var.sqrt()),
        p99: Some(us(at(0.99))),
        p999: Some(us(at(0.999))),
        ..none
    }
}

const MB: f64 = (1u64 << 20) as f64;

/// A sender's figures (`print_report_bw`): the average from the first post
/// to the last send completion; the peak is the best of perftest's windows,
/// from a post to a completion-moderation point (every 100th completion,
/// and the last), among those with a time span.
pub fn bw_sender_row(bytes: usize, tposted: &[Instant], tcompleted: &[Instant]) -> BwRow {
    bw_sender_row_cq(bytes, tposted, tcompleted, BW_CQ_MOD)
}

/// [`bw_sender_row`] with perftest's completion moderation `cq_mod`: the
/// peak windows end at every `cq_mod`-th completion (and the last); only
/// those entries of `tcompleted` are read.
pub fn bw_sender_row_cq(
    bytes: usize,
    tposted: &[Instant],
    tcompleted: &[Instant],
    cq_mod: usize,
) -> BwRow {
    let cq_mod = cq_mod.max(1);
    let n = tposted.len().min(tcompleted.len());
    let row = BwRow {
        bytes,
        iters: n as u64,
        peak: None,
        avg: None,
        msg_rate: None,
    };
    if n == 0 {
        return row;
    }
    let ns = |t: &Instant| t.as_nanos();
    let span = ns(&tcompleted[n - 1]).saturating_sub(ns(&tposted[0]));
    if span == 0 {
        return row;
    }
    let secs = span as f64 / 1e9;
    // Nanoseconds per message of the best window. Windows without a span
    // (posted and completed within one turn of the loop, whose clock
    // stamps both) measure nothing and are skipped.
    let mut best: Option<f64> = None;
    let step = n.div_ceil(PEAK_STARTS).max(1);
    for i in (0..n).step_by(step) {
        let mut window = |j: usize| {
            let t = ns(&tcompleted[j]).saturating_sub(ns(&tposted[i]));
            if t > 0 {
                let per = t as f64 / (j - i + 1) as f64;
                best = Some(best.map_or(per, |b| b.min(per)));
            }
        };
        let mut j = (i + 1).div_ceil(cq_mod) * cq_mod - 1;
        while j < n {
            window(j);
            j += cq_mod;
        }
        if n % cq_mod != 0 {
            window(n - 1);
        }
    }
    BwRow {
        peak: best.map(|b| bytes as f64 * 1e9 / b / MB),
        avg: Some(n as f64 * bytes as f64 / secs / MB),
        msg_rate: Some(n as f64 / secs / 1e6),
        ..row
    }
}

/// A receiver's figures: `count` messages of `bytes` from the first to the
/// last receive completion (perftest's server starts its clock at the first
/// packet and prints no peak).
pub fn bw_receiver_row(
    bytes: usize,
    count: u64,
    first: Option<Instant>,
    last: Option<Instant>,
) -> BwRow {
    let span = match (first, last) {
        (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
        _ => 0.0,
    };
    let (avg, msg_rate) = if span > 0.0 {
        (
            Some(count as f64 * bytes as f64 / span / MB),
            Some(count as f64 / span / 1e6),
        )
    } else {
        (None, None)
    };
    BwRow {
        bytes,
        iters: count,
        peak: None,
        avg,
        msg_rate,
    }
}

/// C's `%#0{width}x`: `0x` and hex digits padded to `width` in all, or
/// just zeros for 0 (C adds no `0x` to a zero).
pub(crate) fn c_alt_hex(v: u64, width: usize) -> String {
    if v == 0 {
        "0".repeat(width)
    } else {
        format!("{v:#0width$x}")
    }
}

/// perftest's address lines for one side (`ctx_print_pingpong_data`):
/// LID, QPN and PSN, then the GID's bytes in decimal.
pub fn address_lines(side: &str, k: &KeyMsg) -> String {
    address_lines_verb(side, k, AddrVerb::Send)
}

/// What perftest adds to an address line for the test's verb.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrVerb {
    /// SEND tests: nothing.
    Send,
    /// WRITE tests: the buffer's RKey and VAddr.
    Write,
    /// READ tests: the outstanding reads, then RKey and VAddr.
    Read,
}

/// [`address_lines`] for a test of `verb` (`READ_FMT`, `RDMA_FMT`).
pub fn address_lines_verb(side: &str, k: &KeyMsg, verb: AddrVerb) -> String {
    let gid: Vec<String> = k.gid.iter().map(|b| format!("{b:02}")).collect();
    let mut extra = String::new();
    if verb == AddrVerb::Read {
        extra += &format!(" OUT {}", c_alt_hex(u64::from(k.out_reads), 4));
    }
    if verb != AddrVerb::Send {
        extra += &format!(
            " RKey {} VAddr {}",
            c_alt_hex(u64::from(k.rkey), 8),
            c_alt_hex(k.vaddr, 16)
        );
    }
    format!(
        " {side} address: LID {} QPN {} PSN {}{extra}\n GID: {}",
        c_alt_hex(u64::from(k.lid), 4),
        c_alt_hex(u64::from(k.qpn), 6),
        c_alt_hex(u64::from(k.psn), 6),
        gid.join(":")
    )
}

/// perftest's banner (`ctx_print_test_info`) for our side.
pub fn banner(cfg: &PerftestConfig, client: bool, mtu: usize) -> String {
    banner_with(&BannerInfo {
        title: cfg.test.title(),
        connection: "UD",
        tx_depth: client.then(|| cfg.tx_depth()),
        rx_depth: (!client).then(|| cfg.rx_depth()),
        cq_mod: (cfg.test == Test::SendBw).then(|| BW_CQ_MOD.min(cfg.tx_depth() as usize)),
        mtu,
        out_reads: None,
    })
}

/// What a banner shows (`ctx_print_test_info`'s fields that vary).
#[derive(Debug, Clone)]
pub struct BannerInfo<'a> {
    /// The test's title, e.g. `Send BW Test`.
    pub title: &'a str,
    /// `UD` or `RC`.
    pub connection: &'a str,
    /// The `TX depth` line, if shown.
    pub tx_depth: Option<u64>,
    /// The `RX depth` line, if shown.
    pub rx_depth: Option<u64>,
    /// The `CQ Moderation` line (bw tests).
    pub cq_mod: Option<usize>,
    /// The path MTU.
    pub mtu: usize,
    /// READ tests show `Outstand reads` instead of `Max inline data`.
    pub out_reads: Option<u16>,
}

/// perftest's banner from its varying fields.
pub fn banner_with(b: &BannerInfo<'_>) -> String {
    let mut s = format!(
        "{RESULT_LINE}\n                    {}\n Dual-port       : OFF\t\tDevice         : {DEVICE_NAME}\n Number of qps   : 1\t\tTransport type : IB\n Connection type : {}\t\tUsing SRQ      : OFF\n",
        b.title, b.connection
    );
    if let Some(d) = b.tx_depth {
        s += &format!(" TX depth        : {d}\n");
    }
    if let Some(d) = b.rx_depth {
        s += &format!(" RX depth        : {d}\n");
    }
    if let Some(m) = b.cq_mod {
        s += &format!(" CQ Moderation   : {m}\n");
    }
    let inline_or_reads = match b.out_reads {
        Some(r) => format!(" Outstand reads  : {r}"),
        None => " Max inline data : 0[B]".to_string(),
    };
    s += &format!(
        " Mtu             : {}[B]\n Link type       : Ethernet\n GID index       : 0\n{inline_or_reads}\n rdma_cm QPs\t : OFF\n Data ex. method : Ethernet\n{RESULT_LINE}",
        b.mtu
    );
    s
}

/// The sizes of a `-a` sweep: 2, 4, ... up to `mtu`.
pub fn sweep_sizes(mtu: usize) -> Vec<usize> {
    (1..usize::BITS)
        .map(|i| 1usize << i)
        .take_while(|&s| s <= mtu)
        .collect()
}

// ------------------------------------------------------------ session

/// What one session did, for the summary line and the tests.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// bw or lat.
    pub test: Test,
    /// Our role.
    pub client: bool,
    /// The peer's UD address (from its key message).
    pub peer: Option<UdAddr>,
    /// The table rows, one per size.
    pub rows: Vec<Row>,
    /// UD SENDs posted.
    pub sent: u64,
    /// Their completions.
    pub send_completions: u64,
    /// UD messages received.
    pub received: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Messages the test is to move each way it moves them (iterations
    /// times sizes).
    pub expected: u64,
    /// The data phase started (the exchange got through).
    pub started: bool,
    /// Why the session failed.
    pub error: Option<String>,
}

impl Report {
    fn new(test: Test, client: bool) -> Self {
        Report {
            test,
            client,
            peer: None,
            rows: Vec::new(),
            sent: 0,
            send_completions: 0,
            received: 0,
            rx_bytes: 0,
            expected: 0,
            started: false,
            error: None,
        }
    }

    /// The session ran to its end and every message it waited for came.
    pub fn succeeded(&self) -> bool {
        self.error.is_none()
            && match (self.test, self.client) {
                (Test::SendBw, true) => self.send_completions == self.expected,
                (Test::SendBw, false) => self.received == self.expected,
                (Test::SendLat, _) => {
                    self.received == self.expected && self.send_completions == self.expected
                }
            }
    }

    /// The reconciliation line, e.g. `uperf: perftest send_bw server:
    /// 1000/1000 messages received (1024000 bytes) from 10.77.0.3 qpn 0x11`.
    pub fn summary_line(&self) -> String {
        let peer = self
            .peer
            .map_or_else(String::new, |p| format!(" from {} qpn {:#x}", p.ip, p.qpn));
        let to = self
            .peer
            .map_or_else(String::new, |p| format!(" to {} qpn {:#x}", p.ip, p.qpn));
        let t = self.test.name();
        match (self.test, self.client) {
            (Test::SendBw, true) => format!(
                "uperf: perftest {t} client: {} messages sent, {} send completions{to}",
                self.sent, self.send_completions
            ),
            (Test::SendBw, false) => format!(
                "uperf: perftest {t} server: {}/{} messages received ({} bytes){peer}",
                self.received, self.expected, self.rx_bytes
            ),
            (Test::SendLat, true) => format!(
                "uperf: perftest {t} client: {} messages sent, {}/{} replies received{peer}",
                self.sent, self.received, self.expected
            ),
            (Test::SendLat, false) => format!(
                "uperf: perftest {t} server: {}/{} messages received ({} bytes), {} echoed{to}",
                self.received, self.expected, self.rx_bytes, self.send_completions
            ),
        }
    }

    /// What failed, or which messages are missing; `None` on success.
    pub fn failure(&self) -> Option<String> {
        if let Some(e) = &self.error {
            return Some(e.clone());
        }
        (!self.succeeded()).then(|| match (self.test, self.client) {
            (Test::SendBw, false) => {
                format!("{} of {} messages arrived", self.received, self.expected)
            }
            _ => format!(
                "{} of {} messages completed",
                self.send_completions, self.expected
            ),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Version,
    CycleBuffer,
    CacheLine,
    Mtu,
    Key1,
    Key2,
    Key3,
    PreRun,
    Run,
    AfterRun,
    Close,
    Linger,
    Finished,
}

impl Step {
    fn what(self) -> &'static str {
        match self {
            Step::Version => "the version exchange",
            Step::CycleBuffer | Step::CacheLine => "the system data exchange",
            Step::Mtu => "the MTU exchange",
            Step::Key1 | Step::Key2 | Step::Key3 => "the key exchange",
            Step::PreRun => "the sync before the test",
            Step::Run => "the test",
            Step::AfterRun => "the sync after a size",
            Step::Close => "the close exchange",
            Step::Linger | Step::Finished => "closing",
        }
    }
}

/// The data phase of one size.
#[derive(Debug)]
struct Run {
    size: usize,
    posted: u64,
    completed: u64,
    received: u64,
    recv_posted: u64,
    tposted: Vec<Instant>,
    tcompleted: Vec<Instant>,
    first_rx: Option<Instant>,
    last_rx: Option<Instant>,
    /// Since when we wait (last send or receive).
    waiting_since: Instant,
    seen_size: Option<usize>,
    msg: Vec<u8>,
}

/// One perftest UD connection, either side (driven by [`Client`] and
/// [`Server`]).
#[derive(Debug)]
pub struct Session {
    cfg: PerftestConfig,
    client: bool,
    conn: MsgConn,
    connect_to: Option<SocketAddrV4>,
    step: Step,
    wrote: bool,
    since: Instant,
    started: bool,
    qp: Option<QpHandle>,
    me: KeyMsg,
    peer: Option<KeyMsg>,
    mtu: usize,
    sizes: Vec<usize>,
    size_idx: usize,
    run: Option<Run>,
    recv_outstanding: u64,
    spare: Vec<Vec<u8>>,
    cqes: Vec<Completion>,
    report: Report,
    output: Vec<String>,
}

/// Why a session stops: a message for the user.
type Fail = String;

/// One lock-step exchange of `len`-byte messages, as perftest's
/// `ctx_xchg_data_ethernet` and `ctx_hand_shake`: the client writes `mine`
/// (once: `wrote` remembers it) then reads, the server reads then writes.
pub(crate) fn lockstep(
    conn: &mut MsgConn,
    stack: &Stack,
    client: bool,
    wrote: &mut bool,
    mine: &[u8],
    len: usize,
) -> Result<Option<Vec<u8>>, OobError> {
    if client && !*wrote {
        conn.send(mine);
        *wrote = true;
    }
    let got = conn.recv_exact(stack, len)?;
    if got.is_some() && !client {
        conn.send(mine);
    }
    Ok(got)
}

/// The peer's version message: perftest 5.70 or later.
pub(crate) fn check_peer_version(b: &[u8]) -> Result<(), Fail> {
    match parse_version(b) {
        Some(v) if v >= 5.70 => Ok(()),
        Some(v) => Err(format!(
            "the peer's perftest version {v} is older than 5.70, which this exchange needs"
        )),
        None => Err(format!(
            "the peer is not perftest: its first message is not a version ({:?})",
            String::from_utf8_lossy(b)
        )),
    }
}

/// The MTU both sides use: the smaller of ours (`cap` bytes) and the
/// peer's message.
pub(crate) fn negotiate_mtu(b: &[u8], cap: usize) -> usize {
    let local = mtu_enum(cap);
    let curr = match parse_mtu_msg(b) {
        Some(remote) => local.min(mtu_enum(remote)),
        None => local,
    };
    mtu_bytes(curr).unwrap_or(cap).min(cap)
}

/// A peer's key message, or why it is not one (`what`: the step).
pub(crate) fn parse_peer_key(b: &[u8], what: &str) -> Result<KeyMsg, Fail> {
    KeyMsg::parse(b).ok_or_else(|| {
        format!(
            "the peer is not perftest: expected a key message in {what}, got {:?}",
            String::from_utf8_lossy(&b[..b.len().min(40)])
        )
    })
}

/// The IPv4 address of a peer's key (its GID must be IPv4-mapped).
pub(crate) fn peer_ip(k: &KeyMsg) -> Result<Ipv4Addr, Fail> {
    gid_ipv4(&k.gid).ok_or_else(|| {
        "Found Incompatibility issue with GID types: the peer's GID is not \
         IPv4-mapped (run perftest with the IPv4 RoCEv2 GID, e.g. -x 1 on rxe)"
            .to_string()
    })
}

impl Session {
    fn new(cfg: PerftestConfig, client: bool, conn: MsgConn, to: Option<SocketAddrV4>) -> Self {
        let report = Report::new(cfg.test, client);
        Session {
            cfg,
            client,
            conn,
            connect_to: to,
            step: Step::Version,
            wrote: false,
            since: Instant::ZERO,
            started: false,
            qp: None,
            me: KeyMsg::default(),
            peer: None,
            mtu: 0,
            sizes: Vec::new(),
            size_idx: 0,
            run: None,
            recv_outstanding: 0,
            spare: Vec::new(),
            cqes: Vec::new(),
            report,
            output: Vec::new(),
        }
    }

    fn goto(&mut self, now: Instant, step: Step) {
        self.step = step;
        self.wrote = false;
        self.since = now;
    }

    /// How long the current exchange step may wait.
    fn step_timeout(&self) -> Duration {
        match self.step {
            Step::Close if self.client && self.cfg.test == Test::SendBw => {
                BW_CLOSE_WAIT.max(self.cfg.exchange_timeout)
            }
            Step::AfterRun if self.client => BW_CLOSE_WAIT.max(self.cfg.exchange_timeout),
            Step::Linger => LINGER,
            _ => self.cfg.exchange_timeout,
        }
    }

    /// One lock-step exchange of `len`-byte messages: the client writes
    /// `mine` then reads, the server reads then writes.
    fn xchg(&mut self, stack: &Stack, mine: &[u8], len: usize) -> Result<Option<Vec<u8>>, Fail> {
        lockstep(
            &mut self.conn,
            stack,
            self.client,
            &mut self.wrote,
            mine,
            len,
        )
        .map_err(|e| self.oob_fail(&e))
    }

    fn oob_fail(&self, e: &OobError) -> Fail {
        match e {
            OobError::Closed if self.client && self.step == Step::Close => {
                "the server closed the connection instead of answering the close exchange \
                 (a perftest server gives up like that when UD messages were lost)"
                    .to_string()
            }
            OobError::Closed => {
                format!("the peer closed the connection during {}", self.step.what())
            }
            e => format!("{} (during {})", e, self.step.what()),
        }
    }

    fn my_key(&self) -> [u8; KEY_MSG_LEN] {
        self.me.to_wire()
    }

    fn parse_key(&self, b: &[u8]) -> Result<KeyMsg, Fail> {
        parse_peer_key(b, self.step.what())
    }

    fn fail(&mut self, stack: &mut Stack, why: Fail) {
        if self.report.error.is_none() {
            self.report.error = Some(why);
        }
        self.end(stack);
    }

    fn end(&mut self, stack: &mut Stack) {
        if let Some(qp) = self.qp.take() {
            let _ = stack.destroy_qp(qp);
        }
        let _ = self.conn.poll(stack);
        let _ = stack.tcp_close(self.conn.handle());
        self.step = Step::Finished;
    }

    fn turn(&mut self, now: Instant, stack: &mut Stack) -> Result<(), Fail> {
        if let Err(e) = self.conn.poll(stack) {
            if self.step == Step::Linger {
                // The peer is gone after the close exchange: nothing lost.
                self.end(stack);
                return Ok(());
            }
            return Err(self.oob_fail(&e));
        }
        if let Some(to) = self.connect_to {
            let syn_sent = stack
                .tcp_status(self.conn.handle())
                .is_ok_and(|s| s.state == State::SynSent);
            if syn_sent {
                if now >= self.since + self.cfg.connect_timeout {
                    return Err(format!(
                        "connecting to {to} timed out after {} ms: is a perftest server there?{}",
                        self.cfg.connect_timeout.as_millis(),
                        crate::bad_checksum_hint(stack)
                    ));
                }
                return Ok(());
            }
            self.connect_to = None;
            self.since = now;
        }
        // Several steps can complete in one turn (messages already here).
        loop {
            let step = self.step;
            self.step_once(now, stack)?;
            if self.step == step || self.step == Step::Finished {
                break;
            }
            if let Err(e) = self.conn.poll(stack) {
                return Err(self.oob_fail(&e));
            }
        }
        if !matches!(self.step, Step::Run | Step::Finished)
            && now >= self.since + self.step_timeout()
        {
            if self.step == Step::Linger {
                self.end(stack);
                return Ok(());
            }
            return Err(format!(
                "no answer from the peer within {} s during {}",
                self.step_timeout().as_secs(),
                self.step.what()
            ));
        }
        Ok(())
    }

    fn step_once(&mut self, now: Instant, stack: &mut Stack) -> Result<(), Fail> {
        match self.step {
            Step::Version => {
                if let Some(b) = self.xchg(stack, &version_msg(), VERSION_LEN)? {
                    check_peer_version(&b)?;
                    self.goto(now, Step::CycleBuffer);
                }
            }
            Step::CycleBuffer => {
                if self.xchg(stack, &CYCLE_BUFFER.to_be_bytes(), 4)?.is_some() {
                    self.goto(now, Step::CacheLine);
                }
            }
            Step::CacheLine => {
                if self.xchg(stack, &CACHE_LINE.to_be_bytes(), 4)?.is_some() {
                    self.goto(now, Step::Mtu);
                }
            }
            Step::Mtu => {
                let cap = stack.ud_max_msg();
                if let Some(b) = self.xchg(stack, &mtu_msg(cap), 2)? {
                    self.mtu = negotiate_mtu(&b, cap);
                    self.setup(now, stack)?;
                }
            }
            Step::Key1 => {
                let mine = self.my_key();
                if let Some(b) = self.xchg(stack, &mine, KEY_MSG_LEN)? {
                    let k = self.parse_key(&b)?;
                    let ip = peer_ip(&k)?;
                    self.peer = Some(k);
                    self.report.peer = Some(UdAddr { ip, qpn: k.qpn });
                    self.goto(now, Step::Key2);
                }
            }
            Step::Key2 => {
                let mine = self.my_key();
                if let Some(b) = self.xchg(stack, &mine, KEY_MSG_LEN)? {
                    self.parse_key(&b)?;
                    self.output.push(address_lines("local", &self.me));
                    self.goto(now, Step::Key3);
                }
            }
            Step::Key3 => {
                let mine = self.my_key();
                if let Some(b) = self.xchg(stack, &mine, KEY_MSG_LEN)? {
                    let k = self.parse_key(&b)?;
                    self.output.push(address_lines("remote", &k));
                    self.output.push(RESULT_LINE.to_string());
                    self.output.push(
                        match self.cfg.test {
                            Test::SendBw => BW_HEADER,
                            Test::SendLat => LAT_HEADER,
                        }
                        .to_string(),
                    );
                    self.enter_prerun(now, stack)?;
                }
            }
            Step::PreRun => {
                let mine = self.my_key();
                if let Some(b) = self.xchg(stack, &mine, KEY_MSG_LEN)? {
                    self.parse_key(&b)?;
                    self.start_run(now, stack)?;
                }
            }
            Step::Run => self.run_turn(now, stack)?,
            Step::AfterRun => {
                let mine = self.my_key();
                if let Some(b) = self.xchg(stack, &mine, KEY_MSG_LEN)? {
                    self.parse_key(&b)?;
                    self.next_size(now, stack)?;
                }
            }
            Step::Close => {
                let mine = self.my_key();
                if let Some(b) = self.xchg(stack, &mine, KEY_MSG_LEN)? {
                    self.parse_key(&b)?;
                    self.conn.send(DONE);
                    self.goto(now, Step::Linger);
                }
            }
            Step::Linger => {
                let acked = stack
                    .tcp_status(self.conn.handle())
                    .map_or(true, |s| s.unacked == 0 || s.closed());
                if self.conn.flushed() && acked {
                    self.end(stack);
                }
            }
            Step::Finished => {}
        }
        Ok(())
    }

    /// After the MTU is known: the sizes, the QP, our key, the banner.
    fn setup(&mut self, now: Instant, stack: &mut Stack) -> Result<(), Fail> {
        let cfg = &self.cfg;
        self.sizes = if cfg.all_sizes {
            sweep_sizes(self.mtu)
        } else {
            let size = match (cfg.size, cfg.test) {
                (Some(s), _) => s,
                (None, Test::SendLat) => LAT_DEFAULT_SIZE.min(self.mtu),
                (None, Test::SendBw) => self.mtu,
            };
            if size > self.mtu {
                return Err(format!("{TOO_LARGE_MSG} ({} bytes)", self.mtu));
            }
            vec![size]
        };
        if self.sizes.is_empty() {
            return Err(format!(
                "the UD MTU of {} bytes holds no test size",
                self.mtu
            ));
        }
        self.report.expected = cfg.iters * self.sizes.len() as u64;
        let mut qc = QpConfig::new(cfg.qkey);
        qc.max_send_wr = cfg.tx_depth() as usize + 2;
        qc.max_recv_wr = cfg.rx_depth() as usize;
        let qp = stack
            .create_qp(&qc)
            .map_err(|e| format!("creating the UD queue pair: {e}"))?;
        self.qp = Some(qp);
        self.me = KeyMsg {
            lid: 0,
            out_reads: 1,
            qpn: stack.qp_num(qp).unwrap_or(0),
            psn: 0,
            rkey: 0,
            vaddr: 0,
            gid: ipv4_gid(stack.ip()),
            srqn: 0,
        };
        self.output.push(banner(&self.cfg, self.client, self.mtu));
        self.goto(now, Step::Key1);
        Ok(())
    }

    fn receives_here(&self) -> bool {
        self.cfg.test == Test::SendLat || !self.client
    }

    /// Post the receive buffers of the next size, then sync: the peer
    /// sends only after our answer to this exchange.
    fn enter_prerun(&mut self, now: Instant, stack: &mut Stack) -> Result<(), Fail> {
        if self.receives_here() {
            let want = self.cfg.rx_depth();
            while self.recv_outstanding < want {
                self.post_one_recv(stack)?;
            }
        }
        self.goto(now, Step::PreRun);
        Ok(())
    }

    fn post_one_recv(&mut self, stack: &mut Stack) -> Result<(), Fail> {
        let (Some(qp), len) = (self.qp, GRH_LEN + self.mtu) else {
            return Ok(());
        };
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.resize(len, 0);
        stack
            .post_recv(qp, 0, buf)
            .map_err(|e| format!("posting a receive buffer: {e}"))?;
        self.recv_outstanding += 1;
        Ok(())
    }

    fn start_run(&mut self, now: Instant, stack: &mut Stack) -> Result<(), Fail> {
        self.report.started = true;
        let size = self.sizes[self.size_idx];
        let cap = self.cfg.iters.min(1 << 20) as usize;
        self.run = Some(Run {
            size,
            posted: 0,
            completed: 0,
            received: 0,
            // Buffers left from an earlier size count as this size's.
            recv_posted: if self.receives_here() {
                self.recv_outstanding
            } else {
                0
            },
            tposted: Vec::with_capacity(cap),
            tcompleted: Vec::with_capacity(if self.client { cap } else { 0 }),
            first_rx: None,
            last_rx: None,
            waiting_since: now,
            seen_size: None,
            msg: (0..size).map(|i| i as u8).collect(),
        });
        self.goto(now, Step::Run);
        if self.client && self.cfg.test == Test::SendLat {
            self.send(now, stack, None)?;
        }
        self.run_turn(now, stack)
    }

    /// Post one SEND to the peer: our message, or `echo`.
    fn send(&mut self, now: Instant, stack: &mut Stack, echo: Option<&[u8]>) -> Result<bool, Fail> {
        let (Some(qp), Some(peer), Some(run)) = (self.qp, self.report.peer, self.run.as_mut())
        else {
            return Ok(false);
        };
        let wr = SendWr {
            wr_id: run.posted,
            dest: peer,
            remote_qkey: self.cfg.qkey,
            imm: None,
            solicited: false,
            data: echo.unwrap_or(&run.msg),
        };
        match stack.post_send(qp, &wr) {
            Ok(()) => {
                run.posted += 1;
                run.tposted.push(now);
                run.waiting_since = now;
                self.report.sent += 1;
                Ok(true)
            }
            Err(ustack::ud::UdError::QueueFull) => Ok(false),
            Err(e) => Err(format!("posting a send: {e}")),
        }
    }

    fn run_turn(&mut self, now: Instant, stack: &mut Stack) -> Result<(), Fail> {
        let Some(qp) = self.qp else {
            return Ok(());
        };
        let iters = self.cfg.iters;
        let mut cqes = std::mem::take(&mut self.cqes);
        let mut echoes: Vec<Vec<u8>> = Vec::new();
        while stack.poll_cq(qp, now, 256, &mut cqes).unwrap_or(0) > 0 {
            for mut c in cqes.drain(..) {
                let Some(run) = self.run.as_mut() else {
                    continue;
                };
                match (c.opcode, c.status) {
                    (WcOpcode::Send, WcStatus::Success) => {
                        run.completed += 1;
                        // As perftest: when the completion is seen (the
                        // loop stamps a burst of sends with one time).
                        run.tcompleted.push(now);
                        self.report.send_completions += 1;
                    }
                    (WcOpcode::Send, st) => {
                        return Err(format!(
                            "send {} completed with error {st:?} (no route to the peer?)",
                            run.completed + 1
                        ));
                    }
                    (WcOpcode::Recv, WcStatus::Success) => {
                        self.recv_outstanding -= 1;
                        let len = c.payload().len();
                        run.received += 1;
                        run.first_rx.get_or_insert(c.timestamp);
                        run.last_rx = Some(c.timestamp);
                        run.waiting_since = now;
                        run.seen_size = Some(len);
                        self.report.received += 1;
                        self.report.rx_bytes += len as u64;
                        if self.cfg.test == Test::SendLat && !self.client {
                            echoes.push(c.payload().to_vec());
                        } else if self.cfg.test == Test::SendLat {
                            echoes.push(Vec::new());
                        }
                        let repost = run.recv_posted < iters;
                        if let Some(b) = c.buf.take() {
                            self.spare.push(b);
                        }
                        if repost {
                            if let Some(run) = self.run.as_mut() {
                                run.recv_posted += 1;
                            }
                            self.post_one_recv(stack)?;
                        }
                    }
                    (WcOpcode::Recv, st) => {
                        return Err(format!(
                            "receive {} completed with error {st:?} ({} bytes)",
                            run.received + 1,
                            c.byte_len.saturating_sub(GRH_LEN)
                        ));
                    }
                }
            }
        }
        self.cqes = cqes;
        // (posted, completed, received, size, waiting since) of the run.
        let state = |s: &Self| {
            s.run
                .as_ref()
                .map(|r| (r.posted, r.completed, r.received, r.size, r.waiting_since))
        };
        let Some((_, _, received, _, waiting_since)) = state(self) else {
            return Ok(());
        };
        let expired = now >= waiting_since + self.cfg.timeout;
        let secs = self.cfg.timeout.as_secs_f64();
        match (self.cfg.test, self.client) {
            (Test::SendLat, client) => {
                // A reply (client) or a message (server) lets the next send go.
                for e in echoes {
                    if state(self).is_some_and(|s| s.0 < iters) {
                        let echo = (!client).then_some(e.as_slice());
                        if !self.send(now, stack, echo)? {
                            return Err("the send queue is full".to_string());
                        }
                    }
                }
                let Some((posted, completed, received, size, since)) = state(self) else {
                    return Ok(());
                };
                if posted == iters && received == iters && completed == iters {
                    return self.finish_run(now, stack);
                }
                if now >= since + self.cfg.timeout {
                    return Err(if client {
                        format!(
                            "no reply to message {posted} of {iters} ({size} bytes) within {secs} s (a UD packet was lost, or the peer stopped)"
                        )
                    } else {
                        format!(
                            "message {} of {iters} did not arrive within {secs} s (a UD packet was lost, or the peer stopped)",
                            received + 1
                        )
                    });
                }
            }
            (Test::SendBw, true) => {
                let depth = self.cfg.tx_depth();
                while state(self).is_some_and(|s| s.0 < iters && s.0 - s.1 < depth) {
                    if !self.send(now, stack, None)? {
                        break;
                    }
                }
                let Some((posted, completed, ..)) = state(self) else {
                    return Ok(());
                };
                if completed == iters {
                    return self.finish_run(now, stack);
                }
                if expired && posted > completed {
                    return Err(format!(
                        "{} of {posted} sends did not complete within {secs} s",
                        posted - completed
                    ));
                }
            }
            (Test::SendBw, false) => {
                if received >= iters {
                    return self.finish_run(now, stack);
                }
                if expired {
                    self.output.push(format!(
                        "uperf: only {received} of {iters} messages arrived; none for {secs} s"
                    ));
                    return self.finish_run(now, stack);
                }
            }
        }
        Ok(())
    }

    fn finish_run(&mut self, now: Instant, stack: &mut Stack) -> Result<(), Fail> {
        let Some(run) = self.run.take() else {
            return Ok(());
        };
        let bytes = run.seen_size.unwrap_or(run.size);
        let row = match (self.cfg.test, self.client) {
            (Test::SendLat, _) => Row::Lat(lat_row(bytes, &run.tposted)),
            (Test::SendBw, true) => Row::Bw(bw_sender_row(run.size, &run.tposted, &run.tcompleted)),
            (Test::SendBw, false) => Row::Bw(bw_receiver_row(
                bytes,
                run.received,
                run.first_rx,
                run.last_rx,
            )),
        };
        self.output.push(row.to_string());
        self.report.rows.push(row);
        if self.cfg.test == Test::SendBw && self.cfg.all_sizes {
            self.goto(now, Step::AfterRun);
            Ok(())
        } else {
            self.next_size(now, stack)
        }
    }

    fn next_size(&mut self, now: Instant, stack: &mut Stack) -> Result<(), Fail> {
        self.size_idx += 1;
        if self.size_idx < self.sizes.len() {
            self.enter_prerun(now, stack)
        } else {
            self.output.push(RESULT_LINE.to_string());
            self.goto(now, Step::Close);
            Ok(())
        }
    }
}

// ------------------------------------------------------------ apps

/// What the perftest client and server apps need of a session: the UD
/// one ([`Session`]) or the RC one ([`crate::perftest_rc::Session`]).
pub trait PerftestSession: std::fmt::Debug + Sized {
    /// The test's settings.
    type Config: Clone + std::fmt::Debug;
    /// What one session did.
    type Report: SessionReport + Clone + std::fmt::Debug;
    /// A session over `conn`: the client's (connected to `to`) or the
    /// server's.
    fn open(cfg: Self::Config, client: bool, conn: MsgConn, to: Option<SocketAddrV4>) -> Self;
    /// The client's report when it could not connect: `why`.
    fn unconnected(cfg: &Self::Config, why: String) -> Self::Report;
    /// The test's name (`send_bw`, ...), for the error lines.
    fn test_name(cfg: &Self::Config) -> String;
    /// Refuse settings perftest would refuse, before touching the network.
    fn check(cfg: &Self::Config, stack: &Stack) -> Result<()>;
    /// One turn of the session.
    fn poll(&mut self, now: Instant, stack: &mut Stack);
    /// When the session wants its next turn.
    fn poll_at(&self) -> Option<Instant>;
    /// The session ended (its report is final).
    fn finished(&self) -> bool;
    /// The data phase runs (the loop should busy-poll).
    fn in_run(&self) -> bool;
    /// Lines to print, in order, not yet taken.
    fn output(&mut self) -> &mut Vec<String>;
    /// What the session did so far.
    fn report(&self) -> &Self::Report;
}

/// What the apps need of a session's report.
pub trait SessionReport {
    /// The data phase (or the wait for it) started.
    fn started(&self) -> bool;
    /// The reconciliation line.
    fn summary_line(&self) -> String;
    /// What failed, or which messages are missing; `None` on success.
    fn failure(&self) -> Option<String>;
}

impl SessionReport for Report {
    fn started(&self) -> bool {
        self.started
    }
    fn summary_line(&self) -> String {
        Report::summary_line(self)
    }
    fn failure(&self) -> Option<String> {
        Report::failure(self)
    }
}

impl PerftestSession for Session {
    type Config = PerftestConfig;
    type Report = Report;

    fn open(cfg: PerftestConfig, client: bool, conn: MsgConn, to: Option<SocketAddrV4>) -> Self {
        Session::new(cfg, client, conn, to)
    }

    fn unconnected(cfg: &PerftestConfig, why: String) -> Report {
        let mut r = Report::new(cfg.test, true);
        r.error = Some(why);
        r
    }

    fn test_name(cfg: &PerftestConfig) -> String {
        cfg.test.name().to_string()
    }

    fn check(cfg: &PerftestConfig, stack: &Stack) -> Result<()> {
        check_config(cfg, stack.ud_max_msg())
    }

    fn poll(&mut self, now: Instant, stack: &mut Stack) {
        if self.step == Step::Finished {
            return;
        }
        if !self.started {
            self.started = true;
            self.since = now;
        }
        if let Err(why) = self.turn(now, stack) {
            self.fail(stack, why);
        }
    }

    fn poll_at(&self) -> Option<Instant> {
        match self.step {
            Step::Finished => None,
            Step::Run => self
                .run
                .as_ref()
                .map(|r| r.waiting_since + self.cfg.timeout),
            _ => Some(self.since + self.step_timeout()),
        }
    }

    fn finished(&self) -> bool {
        self.step == Step::Finished
    }

    fn in_run(&self) -> bool {
        self.step == Step::Run
    }

    fn output(&mut self) -> &mut Vec<String> {
        &mut self.output
    }

    fn report(&self) -> &Report {
        &self.report
    }
}

/// Gives `s` its turn and moves its lines to `output`, with the summary
/// line once it finished (if its test started); whether it finished.
fn drive<S: PerftestSession>(
    s: &mut S,
    now: Instant,
    stack: &mut Stack,
    output: &mut Vec<String>,
) -> bool {
    s.poll(now, stack);
    output.append(s.output());
    if !s.finished() {
        return false;
    }
    if s.report().started() {
        output.push(s.report().summary_line());
    }
    true
}

/// A perftest client: one session against a perftest server.
#[derive(Debug)]
pub struct Client<S: PerftestSession> {
    cfg: S::Config,
    server: SocketAddrV4,
    session: Option<S>,
    /// Lines to print (banner, addresses, table, summary), in order.
    pub output: Vec<String>,
    /// The session's report, once it ended.
    pub report: Option<S::Report>,
}

/// `uperf -c HOST --rdma --perftest`: one session against a perftest server.
pub type PerftestClient = Client<Session>;

impl<S: PerftestSession> Client<S> {
    /// A client of the perftest server at `server`.
    pub fn new(cfg: S::Config, server: SocketAddrV4) -> Self {
        Client {
            cfg,
            server,
            session: None,
            output: Vec::new(),
            report: None,
        }
    }

    /// The session ended (see [`report`](Self::report)).
    pub fn done(&self) -> bool {
        self.report.is_some()
    }

    /// The data phase runs (the loop should busy-poll).
    pub fn in_run(&self) -> bool {
        self.session.as_ref().is_some_and(S::in_run)
    }
}

impl<S: PerftestSession> App for Client<S> {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        if self.report.is_some() {
            return Control::Exit;
        }
        if self.session.is_none() {
            match MsgConn::connect(stack, self.server) {
                Ok(conn) => {
                    self.session = Some(S::open(self.cfg.clone(), true, conn, Some(self.server)));
                }
                Err(e) => {
                    let why = format!("{}: {e}", self.server);
                    self.report = Some(S::unconnected(&self.cfg, why));
                    return Control::Exit;
                }
            }
        }
        let Some(s) = self.session.as_mut() else {
            return Control::Continue;
        };
        if drive(s, now, stack, &mut self.output) {
            self.report = Some(s.report().clone());
            return Control::Exit;
        }
        Control::Continue
    }

    fn poll_at(&self) -> Option<Instant> {
        match &self.session {
            None if self.report.is_none() => Some(Instant::ZERO),
            None => None,
            Some(s) => s.poll_at(),
        }
    }
}

/// The server's waiting banner, as perftest prints it.
pub const WAITING: &str = "\n************************************\n* Waiting for client to connect... *\n************************************";

/// A perftest server: perftest clients, one after another.
#[derive(Debug)]
pub struct Server<S: PerftestSession> {
    cfg: S::Config,
    port: u16,
    one_off: bool,
    listener: Option<ListenHandle>,
    session: Option<S>,
    /// Lines to print, in order.
    pub output: Vec<String>,
    /// One report per client served.
    pub reports: Vec<S::Report>,
    /// Why a client's session failed, one line each, as they come (the
    /// server goes on with the next client unless it is one-off).
    pub errors: Vec<String>,
    /// Listening failed.
    pub error: Option<String>,
    exit: bool,
}

/// `uperf -s --rdma --perftest`: perftest clients, one after another.
pub type PerftestServer = Server<Session>;

impl<S: PerftestSession> Server<S> {
    /// A server on TCP `port`; with `one_off` it exits after one client.
    pub fn new(cfg: S::Config, port: u16, one_off: bool) -> Self {
        Server {
            cfg,
            port,
            one_off,
            listener: None,
            session: None,
            output: Vec::new(),
            reports: Vec::new(),
            errors: Vec::new(),
            error: None,
            exit: false,
        }
    }

    /// A session's data phase runs (the loop should busy-poll).
    pub fn in_run(&self) -> bool {
        self.session.as_ref().is_some_and(S::in_run)
    }

    /// The server stopped (one-off done, or listening failed).
    pub fn done(&self) -> bool {
        self.exit
    }
}

impl<S: PerftestSession> App for Server<S> {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        if self.exit {
            return Control::Exit;
        }
        let Some(l) = self.listener else {
            match stack.tcp_listen(self.port, 1) {
                Ok(l) => {
                    self.listener = Some(l);
                    self.output.push(WAITING.to_string());
                }
                Err(e) => {
                    self.error = Some(format!("listening on TCP port {}: {e}", self.port));
                    self.exit = true;
                    return Control::Exit;
                }
            }
            return Control::Continue;
        };
        if self.session.is_none() {
            if let Ok(Some(h)) = stack.tcp_accept(l) {
                let conn = MsgConn::accepted(stack, h);
                self.session = Some(S::open(self.cfg.clone(), false, conn, None));
            }
        }
        let Some(s) = self.session.as_mut() else {
            return Control::Continue;
        };
        if drive(s, now, stack, &mut self.output) {
            if let Some(e) = s.report().failure() {
                let name = S::test_name(&self.cfg);
                self.errors.push(format!("perftest {name} server: {e}"));
            }
            self.reports.push(s.report().clone());
            self.session = None;
            if self.one_off {
                stack.tcp_unlisten(l);
                self.exit = true;
                return Control::Exit;
            }
            self.output.push(WAITING.to_string());
        }
        Control::Continue
    }

    fn poll_at(&self) -> Option<Instant> {
        match &self.session {
            _ if self.exit => None,
            Some(s) => s.poll_at(),
            None => None,
        }
    }
}

// ------------------------------------------------------------ front end

/// Where `uperf --rdma --perftest` (or `--rdma rc`) runs.
#[derive(Debug, Clone)]
pub enum PerftestRole {
    /// Connect to the perftest server at this address.
    Client(SocketAddrV4),
    /// Listen on this TCP port; `one_off` exits after one client.
    Server {
        /// TCP port.
        port: u16,
        /// Exit after one client.
        one_off: bool,
    },
}

/// Runs a perftest test on a node.
#[derive(Debug)]
pub struct User<S: PerftestSession> {
    /// The test's settings.
    pub cfg: S::Config,
    /// Client or server.
    pub role: PerftestRole,
    /// The poll loop's settings.
    pub lcfg: LoopConfig,
}

/// Runs `uperf --rdma --perftest` on a node.
pub type PerftestUser = User<Session>;

/// Prints an app's lines as they come; busy-polls during data phases (the
/// latency figures are taken on the loop's clock).
struct Front<A> {
    app: A,
}

trait PerftestApp: App {
    fn lines(&mut self) -> Vec<String>;
    fn error_lines(&mut self) -> Vec<String> {
        Vec::new()
    }
    fn busy(&self) -> bool;
}

impl<S: PerftestSession> PerftestApp for Client<S> {
    fn lines(&mut self) -> Vec<String> {
        std::mem::take(&mut self.output)
    }
    fn busy(&self) -> bool {
        self.in_run()
    }
}

impl<S: PerftestSession> PerftestApp for Server<S> {
    fn lines(&mut self) -> Vec<String> {
        std::mem::take(&mut self.output)
    }
    fn error_lines(&mut self) -> Vec<String> {
        std::mem::take(&mut self.errors)
    }
    fn busy(&self) -> bool {
        self.in_run()
    }
}

impl<A: PerftestApp> Front<A> {
    fn print(&mut self) {
        for line in self.app.lines() {
            crate::outln!("{line}");
        }
        for e in self.app.error_lines() {
            eprintln!("uperf: error - {e}");
        }
    }
}

impl<A: PerftestApp> App for Front<A> {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let c = self.app.poll(now, stack);
        self.print();
        c
    }
    fn poll_at(&self) -> Option<Instant> {
        if self.app.busy() {
            Some(Instant::ZERO)
        } else {
            self.app.poll_at()
        }
    }
}

/// Refuse settings perftest would refuse, before touching the network.
pub fn check_config(cfg: &PerftestConfig, max_msg: usize) -> Result<()> {
    if cfg.iters < MIN_ITERS {
        anyhow::bail!(
            "perftest runs at least {MIN_ITERS} iterations (-n {})",
            cfg.iters
        );
    }
    if let Some(s) = cfg.size {
        if s > max_msg {
            anyhow::bail!("{TOO_LARGE_MSG} ({max_msg} bytes here): -l {s}");
        }
    }
    Ok(())
}

impl<S: PerftestSession> NodeRunner for User<S> {
    type Output = ExitCode;
    type Error = anyhow::Error;
    fn run<D>(self, mut node: Node<D>) -> Result<ExitCode>
    where
        D: Device + Send + 'static,
        D::Buf: Send,
    {
        S::check(&self.cfg, &node.stack)?;
        let name = S::test_name(&self.cfg);
        match self.role {
            PerftestRole::Client(server) => {
                let mut front = Front {
                    app: Client::<S>::new(self.cfg, server),
                };
                crate::run_app(&mut node, &mut front, &self.lcfg, None)?;
                front.print();
                match front.app.report.as_ref().map(|r| r.failure()) {
                    Some(None) => Ok(ExitCode::SUCCESS),
                    Some(Some(e)) => {
                        eprintln!("uperf: error - perftest {name} client: {e}");
                        Ok(ExitCode::from(1))
                    }
                    None => {
                        eprintln!("uperf: error - perftest {name} client: interrupted");
                        Ok(ExitCode::from(1))
                    }
                }
            }
            PerftestRole::Server { port, one_off } => {
                let mut front = Front {
                    app: Server::<S>::new(self.cfg, port, one_off),
                };
                crate::run_app(&mut node, &mut front, &self.lcfg, None)?;
                front.print();
                if let Some(e) = &front.app.error {
                    eprintln!("uperf: error - {e}");
                    return Ok(ExitCode::from(1));
                }
                // One-off: the client's test decides; otherwise the server
                // ran until stopped and said what failed as it went.
                let failed = front.app.reports.iter().any(|r| r.failure().is_some());
                Ok(if one_off && (failed || front.app.reports.is_empty()) {
                    ExitCode::from(1)
                } else {
                    ExitCode::SUCCESS
                })
            }
        }
    }
}

/// The IPv4 address and port of a perftest server.
pub fn server_addr(host: Ipv4Addr, port: Option<u16>) -> SocketAddrV4 {
    SocketAddrV4::new(host, port.unwrap_or(PERFTEST_PORT))
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn alt_hex_like_c() {
        assert_eq!(c_alt_hex(0, 4), "0000");
        assert_eq!(c_alt_hex(0x11, 6), "0x0011");
        assert_eq!(c_alt_hex(0x5a3c1e, 6), "0x5a3c1e");
        assert_eq!(c_alt_hex(0, 6), "000000");
    }

    #[test]
    fn address_lines_like_perftest() {
        let k = KeyMsg {
            qpn: 0x11,
            psn: 0x5a3c1e,
            gid: ipv4_gid(Ipv4Addr::new(192, 168, 1, 2)),
            ..KeyMsg::default()
        };
        assert_eq!(
            address_lines("local", &k),
            " local address: LID 0000 QPN 0x0011 PSN 0x5a3c1e\n GID: 00:00:00:00:00:00:00:00:00:00:255:255:192:168:01:02"
        );
    }

    #[test]
    fn banner_layout() {
        let cfg = PerftestConfig::new(Test::SendBw);
        let b = banner(&cfg, true, 1024);
        let lines: Vec<&str> = b.lines().collect();
        assert_eq!(lines[0], RESULT_LINE);
        assert_eq!(RESULT_LINE.len(), 87);
        assert_eq!(lines[1], "                    Send BW Test");
        assert!(lines.contains(&" Connection type : UD\t\tUsing SRQ      : OFF"));
        assert!(lines.contains(&" TX depth        : 128"));
        assert!(lines.contains(&" CQ Moderation   : 100"));
        assert!(lines.contains(&" Mtu             : 1024[B]"));
        assert!(lines.contains(&" Link type       : Ethernet"));
        assert!(lines.contains(&" Data ex. method : Ethernet"));
        assert_eq!(*lines.last().unwrap(), RESULT_LINE);
        let lat = banner(&PerftestConfig::new(Test::SendLat), false, 1024);
        assert!(lat.contains("Send Latency Test\n"));
        assert!(lat.contains(" RX depth        : 1000\n"));
        assert!(!lat.contains("CQ Moderation"));
    }

    fn at_us(us: &[u64]) -> Vec<Instant> {
        let mut t = 0;
        us.iter()
            .map(|d| {
                t += d;
                Instant::from_nanos(t * 1000)
            })
            .collect()
    }

    #[test]
    fn latency_figures_as_perftest_computes_them() {
        // 10 posts: 9 gaps of 10 us (x6), 20, 40 and 100 us. The two
        // largest are dropped; perftest's max is delta[measure_cnt], the
        // smaller of the two dropped (40 us, halved: 20).
        let t = at_us(&[0, 10, 10, 10, 10, 10, 10, 20, 40, 100]);
        let r = lat_row(2, &t);
        assert_eq!(r.iters, 10);
        assert_eq!(r.min, Some(5.0));
        assert_eq!(r.max, Some(20.0));
        // 7 kept: 6 x 10 us and 1 x 20 us, halved.
        assert_eq!(r.typical, Some(5.0));
        let avg = (6.0 * 5.0 + 10.0) / 7.0;
        assert!((r.avg.unwrap() - avg).abs() < 1e-9);
        // Deviations truncated: (5.71-5)=0, (5.71-10)=-4 -> 16/7.
        assert!((r.stdev.unwrap() - (16.0f64 / 7.0).sqrt()).abs() < 1e-9);
        // ceil(7 * 0.99) = 7: the first dropped sample.
        assert_eq!(r.p99, Some(20.0));
        assert_eq!(r.p999, Some(20.0));
        let line = lat_row_line(&r);
        assert!(line.starts_with(" 2       10          5.00   "), "{line:?}");
        // No time span: n/a, never 0.00.
        let flat = lat_row(2, &[Instant::ZERO; 6]);
        assert_eq!(flat.min, None);
        assert!(lat_row_line(&flat).contains("n/a"));
        // Too few samples.
        assert_eq!(lat_row(2, &at_us(&[0, 1, 1])).avg, None);
    }

    #[test]
    fn median_of_an_even_count_averages_the_middle_two() {
        // 6 gaps kept of 8: 2,4,6,8,10,12 us (+ 2 large): median (6+8)/2.
        let t = at_us(&[0, 2, 4, 6, 8, 10, 12, 100, 200]);
        let r = lat_row(8, &t);
        assert_eq!(r.typical, Some(3.5));
    }

    #[test]
    fn bandwidth_figures_as_perftest_computes_them() {
        // 200 messages of 1024 bytes, one posted and completed every
        // microsecond: 1024 B/us.
        let tp: Vec<Instant> = (0..200).map(Instant::from_micros).collect();
        let tc: Vec<Instant> = (0..200).map(|i| Instant::from_micros(i + 1)).collect();
        let r = bw_sender_row(1024, &tp, &tc);
        let mbs = 1024.0 * 1e6 / MB;
        assert_eq!(r.iters, 200);
        assert!((r.avg.unwrap() - mbs).abs() < 1e-6, "{r:?}");
        assert!((r.msg_rate.unwrap() - 1.0).abs() < 1e-9);
        // The best window is the first message alone (1 us for 1 message).
        assert!((r.peak.unwrap() - mbs).abs() < 1e-6);
        let line = bw_row_line(&r);
        assert!(
            line.starts_with(" 1024       200              "),
            "{line:?}"
        );
        assert!(line.ends_with("1.000000"), "{line:?}");
        // Each message posted and completed in one turn of the loop: the
        // one-message windows have no span and are skipped; the best is
        // 2 messages (98 and 99) in 1 us.
        let t: Vec<Instant> = (0..200).map(Instant::from_micros).collect();
        let r = bw_sender_row(1024, &t, &t);
        assert!((r.peak.unwrap() - 1024.0 * 2.0 / 1e-6 / MB).abs() < 1e-6);
        assert!((r.avg.unwrap() - 1024.0 * 200.0 / 199e-6 / MB).abs() < 1e-6);
        // Everything in one instant: n/a.
        let same = vec![Instant::from_micros(5); 10];
        let r = bw_sender_row(64, &same, &same);
        assert_eq!((r.peak, r.avg, r.msg_rate), (None, None, None));
        assert!(bw_row_line(&r).contains("n/a"));
        let r = bw_receiver_row(
            1024,
            100,
            Some(Instant::from_millis(1)),
            Some(Instant::from_millis(2)),
        );
        assert_eq!(r.peak, None);
        assert!((r.msg_rate.unwrap() - 0.1).abs() < 1e-9);
        assert_eq!(bw_receiver_row(1024, 1, None, None).avg, None);
    }

    #[test]
    fn sweep_goes_from_two_to_the_mtu() {
        assert_eq!(
            sweep_sizes(1024),
            vec![2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
        );
        assert_eq!(sweep_sizes(4096).len(), 12);
    }

    #[test]
    fn summary_lines() {
        let mut r = Report::new(Test::SendBw, false);
        r.peer = Some(UdAddr {
            ip: Ipv4Addr::new(10, 77, 0, 3),
            qpn: 0x11,
        });
        r.expected = 1000;
        r.received = 1000;
        r.rx_bytes = 1_024_000;
        assert_eq!(
            r.summary_line(),
            "uperf: perftest send_bw server: 1000/1000 messages received (1024000 bytes) from 10.77.0.3 qpn 0x11"
        );
        assert_eq!(r.failure(), None);
        r.received = 990;
        assert_eq!(r.failure().as_deref(), Some("990 of 1000 messages arrived"));
        let mut c = Report::new(Test::SendBw, true);
        c.expected = 1000;
        c.sent = 1000;
        c.send_completions = 1000;
        assert!(c.summary_line().starts_with(
            "uperf: perftest send_bw client: 1000 messages sent, 1000 send completions"
        ));
        assert!(c.succeeded());
    }
}
