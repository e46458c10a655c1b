//! rdma-core's `ibv_rc_pingpong` as a partner, over the stack's own RoCEv2
//! RC ([`ustack::rc`]) and its own TCP for the tool's address exchange
//! ([`PingpongDest`], the same 52-byte message as `ibv_ud_pingpong`'s).
//!
//! Both roles run the tool's data phase as `rc_pingpong.c` does:
//!
//! - one buffer of `-s` bytes filled with `0x7b`, registered once; every
//!   receive and every send names all of it;
//! - `rx_depth` (500) receives posted before the exchange, topped up to
//!   `rx_depth` when all but one are used;
//! - the exchange: the client writes its address, the server (its QP
//!   already connected) answers with its own, the client writes `"done"`;
//! - every send signaled; a send is posted only when both the previous
//!   send and a receive have completed (the tool's `pending` bits), the
//!   client posting the first one; each side stops when it counted `-n`
//!   send and `-n` receive completions (`scnt`, `rcnt`);
//! - path MTU 1024 (the tool's `--mtu` default), `timeout` 14,
//!   `retry_cnt` 7, `rnr_retry` 7, `min_rnr_timer` 12.
//!
//! It prints the tool's lines (`local address:`, `remote address:`, `N
//! bytes in S seconds = X Mbit/sec`, `N iters in S seconds = U usec/iter`)
//! and then the QP's counters. Where the stock tool would wait forever
//! (a peer that stops answering), each iteration has a timeout and the run
//! ends with one error line.

use std::net::{IpAddr, Ipv6Addr, SocketAddrV4};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, bail};
use ustack::node::{App, Control, Node};
use ustack::phy::device::Device;
use ustack::socket::rc::{
    Access, Local, MrHandle, RcDest, RcOp, RcQpConfig, RcQpHandle, RcQpStatus, RcSendWr, Sge, Wc,
    WcStatus,
};
use ustack::socket::tcp::ListenHandle;
use ustack::wire::exchange::{DONE, PINGPONG_MSG_LEN, PingpongDest, gid_ip, ip_gid};
use ustack::{Instant, Stack};
use ustack_runtime::LoopConfig;

use crate::net::NodeRunner;
use crate::oob::MsgConn;

/// `ibv_rc_pingpong`'s default message size (`-s`).
pub const DEFAULT_SIZE: usize = 4096;
/// `ibv_rc_pingpong`'s default number of exchanges (`-n`).
pub const DEFAULT_ITERS: u64 = 1000;
/// `ibv_rc_pingpong`'s default path MTU (`--mtu`).
pub const DEFAULT_MTU: usize = 1024;
/// `ibv_rc_pingpong`'s default receive depth (`-r`).
pub const RX_DEPTH: usize = 500;

/// The tool's work request ids (`PINGPONG_RECV_WRID`, `PINGPONG_SEND_WRID`):
/// also the bits of its `pending` mask.
const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

/// How long a peer has to finish the address exchange once connected.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// Which end of the tool's exchange we are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Connect to a stock server at this address (`ibv_rc_pingpong` with
    /// no host argument) and send first.
    Client(SocketAddrV4),
    /// Wait on this TCP port for one stock client (`ibv_rc_pingpong HOST`).
    Server(u16),
}

/// `uping --rdma=rc --pingpong` settings.
#[derive(Debug, Clone)]
pub struct RcPingpongOpts {
    /// Client or server.
    pub role: Role,
    /// Exchanges (the peer's `-n`).
    pub iters: u64,
    /// Bytes per message (the peer's `-s`).
    pub size: usize,
    /// The InfiniBand path MTU (the peer's `--mtu`).
    pub mtu: usize,
    /// Receives kept posted (the tool's `-r`).
    pub rx_depth: usize,
    /// How long an iteration may wait for a completion.
    pub timeout: Duration,
    /// The client sends from our IPv6 GID (a server answers in the family
    /// of the client's GID).
    pub ipv6: bool,
    /// The traffic class of our packets (`--tclass`; ibv_rc_pingpong sends
    /// 0 and takes any).
    pub tclass: u8,
    /// The poll loop's settings (pinning, idle mode, the metrics feed).
    pub lcfg: LoopConfig,
}

impl RcPingpongOpts {
    /// The tool's defaults for `role`: 1000 iterations of 4096 bytes, path
    /// MTU 1024, 500 receives, 5 s per iteration.
    pub fn new(role: Role) -> Self {
        RcPingpongOpts {
            role,
            iters: DEFAULT_ITERS,
            size: DEFAULT_SIZE,
            mtu: DEFAULT_MTU,
            rx_depth: RX_DEPTH,
            timeout: Duration::from_secs(5),
            ipv6: false,
            tclass: 0,
            lcfg: LoopConfig::default(),
        }
    }
}

/// `ibv_wc_status_str` and the enum value, as the tool prints a failure.
fn status_str(s: WcStatus) -> (&'static str, u8) {
    match s {
        WcStatus::Success => ("success", 0),
        WcStatus::LocalLengthError => ("local length error", 1),
        WcStatus::LocalProtectionError => ("local protection error", 4),
        WcStatus::Flushed => ("Work Request Flushed Error", 5),
        WcStatus::RemoteInvalidRequest => ("remote invalid request error", 9),
        WcStatus::RemoteAccessError => ("remote access error", 10),
        WcStatus::RemoteOperationalError => ("remote operation error", 11),
        WcStatus::RetryExceeded => ("transport retry counter exceeded", 12),
        WcStatus::RnrRetryExceeded => ("RNR retry counter exceeded", 13),
    }
}

/// A GID as the tool prints it (`inet_ntop(AF_INET6, ...)`).
fn gid_text(gid: &[u8; 16]) -> String {
    Ipv6Addr::from(*gid).to_string()
}

/// The tool's address line (`"  local address:  LID ..."`).
pub fn address_line(which: &str, d: &PingpongDest) -> String {
    format!(
        "  {which} LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        d.lid,
        d.qpn,
        d.psn,
        gid_text(&d.gid)
    )
}

/// The tool's two closing lines for `iters` exchanges of `size` bytes in
/// `usec` microseconds.
pub fn result_lines(size: usize, iters: u64, usec: f64) -> [String; 2] {
    let bytes = size as u64 * iters * 2;
    [
        format!(
            "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
            usec / 1e6,
            bytes as f64 * 8.0 / usec
        ),
        format!(
            "{iters} iters in {:.2} seconds = {:.2} usec/iter",
            usec / 1e6,
            usec / iters as f64
        ),
    ]
}

/// The QP's counters as one line (each `N word`, for scripts).
pub fn counters_line(st: &RcQpStatus) -> String {
    let s = &st.stats;
    format!(
        "rc qp 0x{:06x}: {} packets sent, {} received, {} retransmits, {} ack-timeouts, \
         {} seq-naks-sent, {} seq-naks-received, {} rnr-naks-sent, {} rnr-naks-received, \
         {} duplicates, {} out-of-sequence, {} acks-sent",
        st.qpn,
        s.tx_packets,
        s.rx_packets,
        s.retransmits,
        s.ack_timeouts,
        s.seq_naks_sent,
        s.seq_naks_received,
        s.rnr_naks_sent,
        s.rnr_naks_received,
        s.duplicates,
        s.out_of_sequence,
        s.acks_sent
    )
}

#[derive(Debug)]
enum Phase {
    /// Nothing set up yet.
    Start,
    /// Server: waiting for the client's connection.
    Listen(ListenHandle),
    /// Waiting for the peer's address.
    Exchange { conn: MsgConn, since: Instant },
    /// Server: answered; waiting for the client's "done".
    AwaitDone { conn: MsgConn, since: Instant },
    /// The ping-pong itself.
    Data,
    /// Over (done, or failed).
    Finished,
}

/// The tool's data-phase state: `scnt`, `rcnt`, `routs`, `pending`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoopState {
    /// Send completions.
    pub scnt: u64,
    /// Receive completions.
    pub rcnt: u64,
    /// Receives posted and not completed.
    pub routs: usize,
    /// What the next send waits for (`RECV_WRID | SEND_WRID` bits).
    pub pending: u64,
}

/// What one completion asks of the caller (besides counting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing.
    Nothing,
    /// Post this many receives.
    Repost(usize),
    /// Post the next send.
    Send,
    /// Post receives, then the next send.
    RepostAndSend(usize),
}

impl LoopState {
    /// Count one successful completion of `wr_id` the tool's way
    /// (`parse_single_wc`); `Err` for an id that is neither.
    pub fn complete(&mut self, wr_id: u64, iters: u64, rx_depth: usize) -> Result<Step, String> {
        let mut repost = 0;
        match wr_id {
            SEND_WRID => self.scnt += 1,
            RECV_WRID => {
                self.routs = self.routs.saturating_sub(1);
                if self.routs <= 1 {
                    repost = rx_depth - self.routs;
                }
                self.rcnt += 1;
            }
            other => return Err(format!("Completion for unknown wr_id {other}")),
        }
        self.pending &= !wr_id;
        let send = self.scnt < iters && self.pending == 0;
        if send {
            self.pending = RECV_WRID | SEND_WRID;
        }
        Ok(match (repost, send) {
            (0, false) => Step::Nothing,
            (n, false) => Step::Repost(n),
            (0, true) => Step::Send,
            (n, true) => Step::RepostAndSend(n),
        })
    }

    /// Both counts reached `iters` (the tool's loop condition).
    pub fn done(&self, iters: u64) -> bool {
        self.rcnt >= iters && self.scnt >= iters
    }
}

/// Either role of `ibv_rc_pingpong`, as an in-loop app.
#[derive(Debug)]
pub struct RcPingpong {
    o: RcPingpongOpts,
    phase: Phase,
    qp: Option<RcQpHandle>,
    mr: Option<MrHandle>,
    sge: Sge,
    local: Option<PingpongDest>,
    remote: Option<PingpongDest>,
    /// The client's exchange connection while its "done" drains.
    closing: Option<MsgConn>,
    st: LoopState,
    start: Option<Instant>,
    end: Option<Instant>,
    last_progress: Instant,
    error: Option<String>,
    status: Option<RcQpStatus>,
    wcs: Vec<Wc>,
    /// Lines to print.
    pub output: Vec<String>,
}

impl RcPingpong {
    /// An app that sets up on its first turn.
    pub fn new(o: RcPingpongOpts) -> Self {
        RcPingpong {
            o,
            phase: Phase::Start,
            qp: None,
            mr: None,
            sge: Sge {
                addr: 0,
                len: 0,
                lkey: 0,
            },
            local: None,
            remote: None,
            closing: None,
            st: LoopState::default(),
            start: None,
            end: None,
            last_progress: Instant::ZERO,
            error: None,
            status: None,
            wcs: Vec::new(),
            output: Vec::new(),
        }
    }

    /// Why the run stopped early, if it did.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Whether all iterations completed.
    pub fn finished(&self) -> bool {
        self.end.is_some() && self.error.is_none()
    }

    /// The tool's time: from the start of the data phase (client: after
    /// its first send is posted; server: after the exchange) to the last
    /// completion.
    pub fn elapsed(&self) -> Duration {
        self.start
            .zip(self.end)
            .map_or(Duration::ZERO, |(a, b)| b.saturating_duration_since(a))
    }

    /// The loop's counts.
    pub fn counts(&self) -> LoopState {
        self.st
    }

    /// The QP's status when the run ended (or now, while it runs).
    pub fn qp_status(&self) -> Option<&RcQpStatus> {
        self.status.as_ref()
    }

    /// The settings.
    pub fn opts(&self) -> &RcPingpongOpts {
        &self.o
    }

    fn fail(&mut self, stack: &Stack, why: String) -> Control {
        if let Some(qp) = self.qp {
            self.status = stack.rc_ref().qp_status(qp).ok();
        }
        self.error = Some(why);
        self.phase = Phase::Finished;
        Control::Exit
    }

    fn peer_name(&self) -> String {
        match self.o.role {
            Role::Client(a) => a.to_string(),
            Role::Server(_) => self
                .remote
                .and_then(|d| gid_ip(&d.gid))
                .map_or_else(|| "the client".into(), |ip| ip.to_string()),
        }
    }

    /// Buffer, QP, receives, our address; then listen or connect.
    fn setup(&mut self, now: Instant, stack: &mut Stack) -> Result<Phase, String> {
        let o = &self.o;
        let mr = stack
            .rc()
            .reg_mr(o.size, Access::LOCAL_WRITE)
            .map_err(|e| format!("Couldn't register MR: {e}"))?;
        self.mr = Some(mr);
        // The tool's buffer: 0x7b everywhere.
        if let Ok(b) = stack.rc().mr_mut(mr) {
            b.fill(0x7b);
        }
        let info = stack.rc_ref().mr_info(mr).map_err(|e| e.to_string())?;
        self.sge = Sge {
            addr: info.addr,
            len: o.size as u32,
            lkey: info.lkey,
        };
        let cfg = RcQpConfig {
            mtu: Some(o.mtu),
            max_send_wr: 1,
            max_recv_wr: o.rx_depth,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            traffic_class: o.tclass,
            ..RcQpConfig::default()
        };
        let qp = stack
            .rc()
            .create_qp(&cfg)
            .map_err(|e| format!("Couldn't create QP: {e}"))?;
        self.qp = Some(qp);
        for _ in 0..o.rx_depth {
            stack
                .rc()
                .post_recv(qp, RECV_WRID, self.sge)
                .map_err(|e| format!("Couldn't post receive ({}): {e}", self.st.routs))?;
            self.st.routs += 1;
        }
        let s = stack.rc_ref().qp_status(qp).map_err(|e| e.to_string())?;
        let local = PingpongDest {
            lid: 0,
            qpn: s.qpn,
            psn: s.initial_psn,
            gid: ip_gid(crate::pingpong::our_gid_addr(stack, o.ipv6, None)?),
        };
        self.local = Some(local);
        // A server prints its address once it knows the client's family.
        if matches!(self.o.role, Role::Client(_)) {
            self.output.push(address_line("local address: ", &local));
        }
        match self.o.role {
            Role::Client(to) => {
                let mut conn = MsgConn::connect(now, stack, to)
                    .map_err(|e| format!("Couldn't connect to {to}: {e}"))?;
                conn.send(&local.to_wire());
                Ok(Phase::Exchange { conn, since: now })
            }
            Role::Server(port) => {
                let l = stack
                    .tcp()
                    .listen(port, 1)
                    .map_err(|e| format!("Couldn't listen to port {port}: {e}"))?;
                Ok(Phase::Listen(l))
            }
        }
    }

    /// The peer's address arrived: check it, connect the QP to it.
    fn take_peer(&mut self, stack: &mut Stack, msg: &[u8]) -> Result<(), String> {
        let peer = PingpongDest::parse(msg).ok_or_else(|| {
            format!(
                "not an ibv_rc_pingpong address: {:?}",
                String::from_utf8_lossy(&msg[..msg.len().min(24)])
            )
        })?;
        self.remote = Some(peer);
        let ip = gid_ip(&peer.gid).ok_or(
            "the peer's GID is zero: run ibv_rc_pingpong with -g and the index of a RoCE v2 GID",
        )?;
        let local = self.local.as_mut().ok_or("no local address")?;
        let ours = gid_ip(&local.gid).unwrap_or(IpAddr::V4(stack.ip()));
        if ours.is_ipv6() != ip.is_ipv6() {
            if matches!(self.o.role, Role::Client(_)) {
                return Err(format!(
                    "the peer's GID is {ip}, ours {ours}: both ends need GIDs of one family (-6, or the peer's -g)"
                ));
            }
            // A server answers in the family of the client's GID.
            local.gid = ip_gid(crate::pingpong::our_gid_addr(
                stack,
                ip.is_ipv6(),
                Some(ip),
            )?);
        }
        if matches!(self.o.role, Role::Server(_)) {
            self.output.push(address_line("local address: ", local));
        }
        self.output.push(address_line("remote address:", &peer));
        let qp = self.qp.ok_or("no QP")?;
        stack
            .rc()
            .connect(
                qp,
                RcDest {
                    ip,
                    qpn: peer.qpn,
                    psn: peer.psn,
                },
            )
            .map_err(|e| format!("Couldn't connect to remote QP: {e}"))
    }

    fn post_send(&mut self, stack: &mut Stack) -> Result<(), String> {
        let qp = self.qp.ok_or("no QP")?;
        let wr = RcSendWr {
            wr_id: SEND_WRID,
            op: RcOp::Send,
            local: Local::Sge(self.sge),
            signaled: true,
            solicited: false,
        };
        stack
            .rc()
            .post_send(qp, &wr)
            .map_err(|e| format!("Couldn't post send: {e}"))
    }

    /// Top the receives up by `n` (the tool's check: all of them posted).
    fn post_recvs(&mut self, stack: &mut Stack, n: usize) -> Result<(), String> {
        if n == 0 {
            return Ok(());
        }
        let qp = self.qp.ok_or("no QP")?;
        for _ in 0..n {
            if stack.rc().post_recv(qp, RECV_WRID, self.sge).is_err() {
                break;
            }
            self.st.routs += 1;
        }
        if self.st.routs < self.o.rx_depth {
            return Err(format!("Couldn't post receive ({})", self.st.routs));
        }
        Ok(())
    }

    fn begin_data(&mut self, now: Instant, stack: &mut Stack) -> Result<(), String> {
        self.st.pending = RECV_WRID;
        if matches!(self.o.role, Role::Client(_)) {
            self.post_send(stack)?;
            self.st.pending |= SEND_WRID;
        }
        self.start = Some(now);
        self.last_progress = now;
        self.phase = Phase::Data;
        Ok(())
    }

    /// Which iteration the run is in (1-based), for messages.
    fn iteration(&self) -> u64 {
        (self.st.scnt.min(self.st.rcnt) + 1).min(self.o.iters)
    }

    fn data(&mut self, now: Instant, stack: &mut Stack) -> Result<bool, String> {
        let qp = self.qp.ok_or("no QP")?;
        let mut wcs = std::mem::take(&mut self.wcs);
        let mut result = Ok(false);
        'poll: while stack.rc().poll_cq(qp, 16, &mut wcs).unwrap_or(0) > 0 {
            for wc in wcs.drain(..) {
                if wc.status != WcStatus::Success {
                    let (what, code) = status_str(wc.status);
                    let why = if matches!(
                        wc.status,
                        WcStatus::RetryExceeded | WcStatus::RnrRetryExceeded
                    ) {
                        format!(
                            ": {} stopped answering (no acknowledgement after every retry)",
                            self.peer_name()
                        )
                    } else {
                        String::new()
                    };
                    result = Err(format!(
                        "iteration {} of {}: Failed status {what} ({code}) for wr_id {}{why}",
                        self.iteration(),
                        self.o.iters,
                        wc.wr_id
                    ));
                    break 'poll;
                }
                self.last_progress = now;
                match self.st.complete(wc.wr_id, self.o.iters, self.o.rx_depth) {
                    Err(e) => {
                        result = Err(e);
                        break 'poll;
                    }
                    Ok(step) => {
                        let (repost, send) = match step {
                            Step::Nothing => (0, false),
                            Step::Repost(n) => (n, false),
                            Step::Send => (0, true),
                            Step::RepostAndSend(n) => (n, true),
                        };
                        let r = self
                            .post_recvs(stack, repost)
                            .and_then(|()| if send { self.post_send(stack) } else { Ok(()) });
                        if let Err(e) = r {
                            result = Err(e);
                            break 'poll;
                        }
                    }
                }
            }
            if self.st.done(self.o.iters) {
                result = Ok(true);
                break;
            }
        }
        wcs.clear();
        self.wcs = wcs;
        if result == Ok(false) && self.st.done(self.o.iters) {
            result = Ok(true);
        }
        if result == Ok(false) && now.saturating_duration_since(self.last_progress) > self.o.timeout
        {
            return Err(format!(
                "iteration {} of {}: no completion within {:.1} s: {} stopped answering \
                 ({} sends and {} receives completed)",
                self.iteration(),
                self.o.iters,
                self.o.timeout.as_secs_f64(),
                self.peer_name(),
                self.st.scnt,
                self.st.rcnt
            ));
        }
        result
    }

    fn step(&mut self, now: Instant, stack: &mut Stack) -> Result<bool, String> {
        match std::mem::replace(&mut self.phase, Phase::Finished) {
            Phase::Start => self.phase = self.setup(now, stack)?,
            Phase::Listen(l) => match stack.tcp().accept(l) {
                Ok(Some(h)) => {
                    // The tool takes one client and closes its listener.
                    stack.tcp().unlisten(l);
                    self.phase = Phase::Exchange {
                        conn: MsgConn::accepted(stack, h),
                        since: now,
                    };
                }
                Ok(None) => self.phase = Phase::Listen(l),
                Err(e) => return Err(format!("accept() failed: {e}")),
            },
            Phase::Exchange { mut conn, since } => {
                let got = conn
                    .poll(stack)
                    .and_then(|()| conn.recv_exact(stack, PINGPONG_MSG_LEN))
                    .map_err(|e| format!("Couldn't read remote address: {e}"))?;
                let Some(msg) = got else {
                    if now.saturating_duration_since(since) > EXCHANGE_TIMEOUT {
                        return Err(format!(
                            "Couldn't read remote address: none from {} within {} s",
                            self.peer_name(),
                            EXCHANGE_TIMEOUT.as_secs()
                        ));
                    }
                    self.phase = Phase::Exchange { conn, since };
                    return Ok(false);
                };
                self.take_peer(stack, &msg)?;
                match self.o.role {
                    Role::Client(_) => {
                        conn.send(DONE);
                        let _ = conn.poll(stack);
                        self.closing = Some(conn);
                        self.begin_data(now, stack)?;
                    }
                    Role::Server(_) => {
                        // Connected before answering, as the tool's server.
                        let local = self.local.ok_or("no local address")?;
                        conn.send(&local.to_wire());
                        conn.poll(stack)
                            .map_err(|e| format!("Couldn't send local address: {e}"))?;
                        self.phase = Phase::AwaitDone { conn, since: now };
                    }
                }
            }
            Phase::AwaitDone { mut conn, since } => {
                let got = conn
                    .poll(stack)
                    .and_then(|()| conn.recv_exact(stack, DONE.len()))
                    .map_err(|e| format!("Couldn't send/recv local address: {e}"))?;
                match got {
                    Some(_) => {
                        conn.close(now, stack);
                        self.begin_data(now, stack)?;
                    }
                    None if now.saturating_duration_since(since) > EXCHANGE_TIMEOUT => {
                        return Err(format!(
                            "Couldn't send/recv local address: no \"done\" within {} s",
                            EXCHANGE_TIMEOUT.as_secs()
                        ));
                    }
                    None => self.phase = Phase::AwaitDone { conn, since },
                }
            }
            Phase::Data => {
                self.phase = Phase::Data;
                if let Some(mut c) = self.closing.take() {
                    let _ = c.poll(stack);
                    if c.flushed() {
                        c.close(now, stack);
                    } else {
                        self.closing = Some(c);
                    }
                }
                if self.data(now, stack)? {
                    self.end = Some(now);
                    if let Some(c) = self.closing.take() {
                        c.close(now, stack);
                    }
                    self.phase = Phase::Finished;
                    return Ok(true);
                }
            }
            Phase::Finished => return Ok(true),
        }
        Ok(false)
    }
}

impl App for RcPingpong {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        if self.error.is_some() {
            return Control::Exit;
        }
        match self.step(now, stack) {
            Err(e) => self.fail(stack, e),
            Ok(true) => {
                if let Some(qp) = self.qp {
                    self.status = stack.rc_ref().qp_status(qp).ok();
                }
                Control::Exit
            }
            Ok(false) => Control::Continue,
        }
    }

    fn poll_at(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Data => Some(self.last_progress + self.o.timeout),
            Phase::Exchange { since, .. } | Phase::AwaitDone { since, .. } => {
                Some(*since + EXCHANGE_TIMEOUT)
            }
            _ => None,
        }
    }
}

/// Runs `uping --rdma=rc --pingpong` (either role) on a node.
#[derive(Debug)]
pub struct RcPingpongUser(pub RcPingpongOpts);

impl NodeRunner for RcPingpongUser {
    type Output = ExitCode;
    type Error = anyhow::Error;
    fn run<D>(self, mut node: Node<D>) -> Result<ExitCode>
    where
        D: Device + Send + 'static,
        D::Buf: Send,
    {
        let o = self.0;
        if o.size == 0 || o.size > ustack::socket::rc::MAX_MSG {
            bail!(
                "invalid -s value: '{}': an RC message holds 1 to {} bytes",
                o.size,
                ustack::socket::rc::MAX_MSG
            );
        }
        match o.role {
            Role::Client(to) => crate::outln!(
                "RDMA RC PINGPONG {to} (ibv_rc_pingpong server): {} iters of {} bytes, path MTU {}",
                o.iters,
                o.size,
                o.mtu
            ),
            Role::Server(port) => crate::outln!(
                "RDMA RC PINGPONG server on TCP {port} (one ibv_rc_pingpong client): {} iters of {} bytes, path MTU {}",
                o.iters,
                o.size,
                o.mtu
            ),
        }
        let lcfg = o.lcfg.clone();
        let mut front = Front(RcPingpong::new(o.clone()));
        crate::run_app(&mut node, &mut front, &lcfg, None)?;
        let p = front.0;
        if let Some(s) = p.qp_status() {
            crate::outln!("{}", counters_line(s));
        }
        if let Some(e) = p.error() {
            bail!("{e}");
        }
        if !p.finished() {
            bail!(
                "stopped after {} of {} iterations",
                p.counts().scnt.min(p.counts().rcnt),
                o.iters
            );
        }
        let usec = (p.elapsed().as_secs_f64() * 1e6).max(1.0);
        for l in result_lines(o.size, o.iters, usec) {
            crate::outln!("{l}");
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Prints the app's lines as they come.
struct Front(RcPingpong);

impl App for Front {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let c = self.0.poll(now, stack);
        for line in self.0.output.drain(..) {
            crate::outln!("{line}");
        }
        c
    }

    fn poll_at(&self) -> Option<Instant> {
        self.0.poll_at()
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use std::net::Ipv4Addr;

    /// The tool's loop, client side: a send only when the previous send
    /// and a receive have both completed; done at n of each.
    #[test]
    fn client_loop_waits_for_both_completions() {
        let mut s = LoopState {
            routs: RX_DEPTH,
            pending: RECV_WRID | SEND_WRID,
            ..LoopState::default()
        };
        assert_eq!(s.complete(SEND_WRID, 3, RX_DEPTH), Ok(Step::Nothing));
        assert_eq!(s.complete(RECV_WRID, 3, RX_DEPTH), Ok(Step::Send));
        // The receive may come before the send's completion.
        assert_eq!(s.complete(RECV_WRID, 3, RX_DEPTH), Ok(Step::Nothing));
        assert_eq!(s.complete(SEND_WRID, 3, RX_DEPTH), Ok(Step::Send));
        assert_eq!(s.complete(SEND_WRID, 3, RX_DEPTH), Ok(Step::Nothing));
        assert!(!s.done(3));
        // The last send is not followed by another.
        assert_eq!(s.complete(RECV_WRID, 3, RX_DEPTH), Ok(Step::Nothing));
        assert!(s.done(3));
        assert_eq!((s.scnt, s.rcnt), (3, 3));
    }

    /// Server side: it answers each receive, starting with none pending.
    #[test]
    fn server_loop_answers_each_receive() {
        let mut s = LoopState {
            routs: RX_DEPTH,
            pending: RECV_WRID,
            ..LoopState::default()
        };
        assert_eq!(s.complete(RECV_WRID, 2, RX_DEPTH), Ok(Step::Send));
        assert_eq!(s.complete(SEND_WRID, 2, RX_DEPTH), Ok(Step::Nothing));
        assert_eq!(s.complete(RECV_WRID, 2, RX_DEPTH), Ok(Step::Send));
        assert!(!s.done(2));
        assert_eq!(s.complete(SEND_WRID, 2, RX_DEPTH), Ok(Step::Nothing));
        assert!(s.done(2));
    }

    /// Receives are topped up to the depth when one is left.
    #[test]
    fn receives_are_replenished_at_one_left() {
        let mut s = LoopState {
            routs: 3,
            pending: RECV_WRID,
            ..LoopState::default()
        };
        assert_eq!(s.complete(RECV_WRID, 100, 3), Ok(Step::Send));
        assert_eq!(s.routs, 2);
        assert_eq!(s.complete(SEND_WRID, 100, 3), Ok(Step::Nothing));
        assert_eq!(s.complete(RECV_WRID, 100, 3), Ok(Step::RepostAndSend(2)));
        assert!(s.complete(7, 100, 3).is_err());
    }

    #[test]
    fn lines_as_the_tool_prints_them() {
        let d = PingpongDest {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid: ip_gid(Ipv4Addr::new(10, 77, 0, 3).into()),
        };
        assert_eq!(
            address_line("local address: ", &d),
            "  local address:  LID 0x0000, QPN 0x000011, PSN 0xabcdef, GID ::ffff:10.77.0.3"
        );
        assert_eq!(
            address_line("remote address:", &d),
            "  remote address: LID 0x0000, QPN 0x000011, PSN 0xabcdef, GID ::ffff:10.77.0.3"
        );
        let [b, i] = result_lines(4096, 1000, 2_000_000.0);
        assert_eq!(b, "8192000 bytes in 2.00 seconds = 32.77 Mbit/sec");
        assert_eq!(i, "1000 iters in 2.00 seconds = 2000.00 usec/iter");
        assert_eq!(status_str(WcStatus::RetryExceeded).1, 12);
    }
}
