//! perftest's `ib_send_bw -c UD` and `ib_send_lat -c UD` over the stack's
//! own RoCEv2 UD: the UD transport of the perftest engine
//! ([`super::exchange`]), for `uperf --rdma --perftest`.
//!
//! Three key exchanges; per message size a sync after the receiver posted
//! its buffers, the data phase and, for bw with `-a`, one more sync; then
//! the close exchange. Data phases as perftest runs them:
//! - bw client: `iters` SENDs of `size` bytes, at most tx-depth (128)
//!   outstanding; figures from post and send completion times.
//! - bw server: counts receives until `iters` arrived (timing from the
//!   first one), or gives up after `timeout` without a new one and reports
//!   how many came (perftest waits 60-120 s, then exits without a report).
//! - lat: strict ping-pong, the client first; every send's post time is
//!   kept and latency is half the time between successive posts. Unlike
//!   perftest, a reply missing for `timeout` ends the test: UD loses
//!   packets and perftest would hang.

use std::time::Duration;

use anyhow::Result;
use ustack::socket::ud::{
    Completion, GRH_LEN, QpConfig, QpHandle, SendWr, UdAddr, UdTransport, WcOpcode, WcStatus,
};
use ustack::wire::exchange::KeyMsg;
use ustack::{Instant, Stack};

use super::app::{Client, Server, User};
use super::exchange::{Exchange, Fail, Run, Step, Timeouts, Transport, peer_ip, session_report};
use super::format::{
    BW_HEADER, BannerInfo, LAT_HEADER, RESULT_LINE, Row, address_lines, banner_with,
    bw_receiver_row, bw_sender_row, lat_row,
};
use super::{BW_CQ_MOD, BW_TX_DEPTH, MIN_ITERS};

/// perftest's UD receive depth: `min(iters, 16000)`.
const MAX_RX_DEPTH: u64 = 16_000;
/// The size perftest's latency test uses without `-s`.
pub const LAT_DEFAULT_SIZE: usize = 2;
/// How long a bw client waits for the server's close message: the server
/// answers once every message arrived, and a stock server gives up only
/// 60 to 120 s after the last one.
const BW_CLOSE_WAIT: Duration = Duration::from_secs(150);
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
    /// Our GID is our IPv6 address, not our IPv4 one mapped (perftest's
    /// `--ipv6`; a server follows the client's family anyway).
    pub ipv6: bool,
    /// The traffic class of our packets (perftest's `--tclass`).
    pub tclass: u8,
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
            qkey: ustack::socket::ud::DEFAULT_QKEY,
            timeout: Duration::from_secs(5),
            exchange_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            ipv6: false,
            tclass: 0,
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

/// The sizes of a `-a` sweep: 2, 4, ... up to `mtu`.
pub fn sweep_sizes(mtu: usize) -> Vec<usize> {
    (1..usize::BITS)
        .map(|i| 1usize << i)
        .take_while(|&s| s <= mtu)
        .collect()
}

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

/// What a UD run adds to the counts.
#[derive(Debug)]
struct UdRun {
    /// The size the messages had as they arrived.
    seen_size: Option<usize>,
    /// The message we send.
    msg: Vec<u8>,
}

/// The UD side of a perftest session: its QP, receive buffers and data
/// phase (driven by
/// [`Session`](super::Session)).
#[derive(Debug)]
pub struct Ud {
    cfg: PerftestConfig,
    client: bool,
    qp: Option<QpHandle>,
    mtu: usize,
    sizes: Vec<usize>,
    size_idx: usize,
    run: Option<Run<UdRun>>,
    recv_outstanding: u64,
    spare: Vec<Vec<u8>>,
    cqes: Vec<Completion>,
    report: Report,
}

session_report!(Report);

impl Transport for Ud {
    type Config = PerftestConfig;
    type Report = Report;
    const CLOSED_AT_CLOSE: Option<&'static str> = Some(
        "the server closed the connection instead of answering the close exchange \
         (a perftest server gives up like that when UD messages were lost)",
    );

    fn new(cfg: PerftestConfig, client: bool) -> Self {
        let report = Report::new(cfg.test, client);
        Ud {
            cfg,
            client,
            qp: None,
            mtu: 0,
            sizes: Vec::new(),
            size_idx: 0,
            run: None,
            recv_outstanding: 0,
            spare: Vec::new(),
            cqes: Vec::new(),
            report,
        }
    }

    fn test_name(cfg: &PerftestConfig) -> String {
        cfg.test.name().to_string()
    }

    fn check(cfg: &PerftestConfig, stack: &Stack) -> Result<()> {
        check_config(cfg, stack.ud_max_msg())
    }

    fn ipv6_gid(cfg: &PerftestConfig) -> bool {
        cfg.ipv6
    }

    fn timeouts(cfg: &PerftestConfig) -> Timeouts {
        Timeouts {
            exchange: cfg.exchange_timeout,
            connect: cfg.connect_timeout,
        }
    }

    fn step_wait(&self, x: &Exchange) -> Option<Duration> {
        match x.step {
            Step::Close if self.client && self.cfg.test == Test::SendBw => {
                Some(BW_CLOSE_WAIT.max(self.cfg.exchange_timeout))
            }
            Step::AfterRun if self.client => Some(BW_CLOSE_WAIT.max(self.cfg.exchange_timeout)),
            _ => None,
        }
    }

    /// After the MTU is known: the sizes, the QP, our key, the banner.
    fn setup(
        &mut self,
        x: &mut Exchange,
        now: Instant,
        stack: &mut Stack,
        mtu: usize,
    ) -> Result<(), Fail> {
        self.mtu = mtu;
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
        qc.traffic_class = cfg.tclass;
        let qp = stack
            .ud()
            .create_qp(&qc)
            .map_err(|e| format!("creating the UD queue pair: {e}"))?;
        self.qp = Some(qp);
        x.me = KeyMsg {
            lid: 0,
            out_reads: 1,
            qpn: stack.ud().qp_num(qp).unwrap_or(0),
            psn: 0,
            rkey: 0,
            vaddr: 0,
            gid: x.our_gid(stack)?,
            srqn: 0,
        };
        x.output.push(banner(&self.cfg, self.client, self.mtu));
        x.goto(now, Step::Key(0));
        Ok(())
    }

    /// Three key exchanges: the peer's address from the first, our
    /// address lines after the second, the peer's and the table header
    /// after the third.
    fn on_key(
        &mut self,
        x: &mut Exchange,
        now: Instant,
        stack: &mut Stack,
        i: u8,
        k: KeyMsg,
    ) -> Result<(), Fail> {
        match i {
            0 => {
                let ip = peer_ip(&k, &x.me)?;
                self.report.peer = Some(UdAddr { ip, qpn: k.qpn });
                x.goto(now, Step::Key(1));
            }
            1 => {
                x.output.push(address_lines("local", &x.me));
                x.goto(now, Step::Key(2));
            }
            _ => {
                x.output.push(address_lines("remote", &k));
                x.output.push(RESULT_LINE.to_string());
                x.output.push(
                    match self.cfg.test {
                        Test::SendBw => BW_HEADER,
                        Test::SendLat => LAT_HEADER,
                    }
                    .to_string(),
                );
                self.enter_prerun(x, now, stack)?;
            }
        }
        Ok(())
    }

    fn start_run(&mut self, x: &mut Exchange, now: Instant, stack: &mut Stack) -> Result<(), Fail> {
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
            extra: UdRun {
                seen_size: None,
                msg: (0..size).map(|i| i as u8).collect(),
            },
        });
        x.goto(now, Step::Run);
        if self.client && self.cfg.test == Test::SendLat {
            self.send(now, stack, None)?;
        }
        self.run_turn(x, now, stack)
    }

    fn run_turn(&mut self, x: &mut Exchange, now: Instant, stack: &mut Stack) -> Result<(), Fail> {
        let Some(qp) = self.qp else {
            return Ok(());
        };
        let iters = self.cfg.iters;
        let mut cqes = std::mem::take(&mut self.cqes);
        let mut echoes: Vec<Vec<u8>> = Vec::new();
        while stack.ud().poll_cq(qp, now, 256, &mut cqes).unwrap_or(0) > 0 {
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
                        run.extra.seen_size = Some(len);
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
                    return self.finish_run(x, now, stack);
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
                    return self.finish_run(x, now, stack);
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
                    return self.finish_run(x, now, stack);
                }
                if expired {
                    x.output.push(format!(
                        "uperf: only {received} of {iters} messages arrived; none for {secs} s"
                    ));
                    return self.finish_run(x, now, stack);
                }
            }
        }
        Ok(())
    }

    fn next_size(&mut self, x: &mut Exchange, now: Instant, stack: &mut Stack) -> Result<(), Fail> {
        self.size_idx += 1;
        if self.size_idx < self.sizes.len() {
            self.enter_prerun(x, now, stack)
        } else {
            x.output.push(RESULT_LINE.to_string());
            x.goto(now, Step::Close);
            Ok(())
        }
    }

    fn run_deadline(&self) -> Option<Instant> {
        self.run
            .as_ref()
            .map(|r| r.waiting_since + self.cfg.timeout)
    }

    fn release(&mut self, stack: &mut Stack) {
        if let Some(qp) = self.qp.take() {
            let _ = stack.ud().destroy_qp(qp);
        }
    }

    fn report(&self) -> &Report {
        &self.report
    }

    fn report_mut(&mut self) -> &mut Report {
        &mut self.report
    }
}

impl Ud {
    fn receives_here(&self) -> bool {
        self.cfg.test == Test::SendLat || !self.client
    }

    /// Post the receive buffers of the next size, then sync: the peer
    /// sends only after our answer to this exchange.
    fn enter_prerun(
        &mut self,
        x: &mut Exchange,
        now: Instant,
        stack: &mut Stack,
    ) -> Result<(), Fail> {
        if self.receives_here() {
            let want = self.cfg.rx_depth();
            while self.recv_outstanding < want {
                self.post_one_recv(stack)?;
            }
        }
        x.goto(now, Step::PreRun);
        Ok(())
    }

    fn post_one_recv(&mut self, stack: &mut Stack) -> Result<(), Fail> {
        let (Some(qp), len) = (self.qp, GRH_LEN + self.mtu) else {
            return Ok(());
        };
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.resize(len, 0);
        stack
            .ud()
            .post_recv(qp, 0, buf)
            .map_err(|e| format!("posting a receive buffer: {e}"))?;
        self.recv_outstanding += 1;
        Ok(())
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
            data: echo.unwrap_or(&run.extra.msg),
        };
        match stack.ud().post_send(qp, &wr) {
            Ok(()) => {
                run.posted += 1;
                run.tposted.push(now);
                run.waiting_since = now;
                self.report.sent += 1;
                Ok(true)
            }
            Err(ustack::Error::Ud(ustack::socket::ud::UdError::QueueFull)) => Ok(false),
            Err(e) => Err(format!("posting a send: {e}")),
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
        let bytes = run.extra.seen_size.unwrap_or(run.size);
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
        x.output.push(row.to_string());
        self.report.rows.push(row);
        if self.cfg.test == Test::SendBw && self.cfg.all_sizes {
            x.goto(now, Step::AfterRun);
            Ok(())
        } else {
            self.next_size(x, now, stack)
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

/// `uperf -c HOST --rdma --perftest`: one session against a perftest server.
pub type PerftestClient = Client<Ud>;

/// `uperf -s --rdma --perftest`: perftest clients, one after another.
pub type PerftestServer = Server<Ud>;

/// Runs `uperf --rdma --perftest` on a node.
pub type PerftestUser = User<Ud>;

#[cfg(test)]
mod test {
    use super::*;
    use std::net::Ipv4Addr;

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
            ip: Ipv4Addr::new(10, 77, 0, 3).into(),
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
