//! rdma-core's `ibv_ud_pingpong` as a partner, over the stack's RoCEv2 UD
//! and its own TCP for the tool's address exchange
//! ([`ustack::wire::exchange::PingpongDest`]).
//!
//! - [`PingpongServer`] (in `ustack run`): listens on TCP 18515, takes a
//!   stock client's address, answers with the UD responder's QPN and our
//!   GID, and has the responder echo that client's messages
//!   ([`UdResponder::echo_for`]), which is all the stock client needs.
//! - [`PingpongClient`] (`uping --rdma --pingpong HOST`): the client side
//!   against a stock server: exchange, then strict ping-pong of `-c`
//!   messages of `-s` bytes (both must match the server's `-n` and `-s`),
//!   with a timeout per message where the stock tool would hang.

use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, bail};
use ustack::node::{App, Control, Node};
use ustack::phy::device::Device;
use ustack::socket::tcp::ListenHandle;
use ustack::socket::ud::{
    Completion, DEFAULT_QKEY, GRH_LEN, QpConfig, QpHandle, SendWr, UdAddr, UdTransport, WcOpcode,
    WcStatus,
};
use ustack::wire::exchange::{
    DONE, PINGPONG_MSG_LEN, PingpongDest, VERSION_LEN, gid_ip, ip_gid, parse_version,
};
use ustack::{Instant, Stack};
use ustack_kit::ud_ping::{UdPingSummary, UdResponder};
use ustack_runtime::LoopConfig;

use crate::net::NodeRunner;
use crate::oob::{MsgConn, OobError};

/// How long a peer has to finish its address exchange.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// Exchanges in progress at once (further connections wait in the backlog).
const MAX_EXCHANGES: usize = 8;

/// A pseudo-random 24-bit PSN from the clock (UD receivers ignore it).
fn psn(now: Instant) -> u32 {
    (now.as_nanos() as u32).wrapping_mul(0x9e37_79b9) & 0xff_ffff
}

struct Exchange {
    conn: MsgConn,
    started: Instant,
    /// The peer's address, once it sent it (we then wait for "done").
    peer: Option<PingpongDest>,
}

/// The server side of `ibv_ud_pingpong`'s exchange, for `ustack run`.
#[derive(Default)]
pub struct PingpongServer {
    port: u16,
    listener: Option<ListenHandle>,
    exchanges: Vec<Exchange>,
    /// Lines to print (one per peer taken or refused).
    pub output: Vec<String>,
    /// Peers whose exchange completed.
    pub peers: u64,
    /// Why the server could not listen, if it could not.
    pub error: Option<String>,
}

impl std::fmt::Debug for PingpongServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PingpongServer")
            .field("port", &self.port)
            .field("exchanges", &self.exchanges.len())
            .field("peers", &self.peers)
            .finish()
    }
}

impl PingpongServer {
    /// A server for the exchange on TCP `port` (18515 is the tool's).
    pub fn new(port: u16) -> Self {
        PingpongServer {
            port,
            ..PingpongServer::default()
        }
    }

    /// One turn: accept, advance every exchange, register finished peers
    /// with `ud` (whose QP must exist: poll it first).
    pub fn poll(&mut self, now: Instant, stack: &mut Stack, ud: &mut UdResponder) {
        if self.error.is_some() {
            return;
        }
        let l = match self.listener {
            Some(l) => l,
            None => match stack.tcp().listen(self.port, 16) {
                Ok(l) => *self.listener.insert(l),
                Err(e) => {
                    self.error = Some(format!("ibv_ud_pingpong exchange on {}: {e}", self.port));
                    return;
                }
            },
        };
        while self.exchanges.len() < MAX_EXCHANGES {
            match stack.tcp().accept(l) {
                Ok(Some(h)) => self.exchanges.push(Exchange {
                    conn: MsgConn::accepted(stack, h),
                    started: now,
                    peer: None,
                }),
                _ => break,
            }
        }
        let mut i = 0;
        while i < self.exchanges.len() {
            match self.advance(now, stack, ud, i) {
                Ok(false) => i += 1,
                Ok(true) => {
                    let x = self.exchanges.swap_remove(i);
                    x.conn.close(now, stack);
                }
                Err(why) => {
                    let x = self.exchanges.swap_remove(i);
                    let from = stack
                        .tcp_ref()
                        .info(x.conn.handle())
                        .map(|c| c.remote.ip().to_string())
                        .unwrap_or_else(|| "?".into());
                    self.output.push(format!(
                        "rdma ud: ibv_ud_pingpong exchange from {from} refused: {why}"
                    ));
                    let _ = stack.tcp().abort(x.conn.handle());
                }
            }
        }
    }

    /// Ok(true) when the exchange is over.
    fn advance(
        &mut self,
        now: Instant,
        stack: &mut Stack,
        ud: &mut UdResponder,
        i: usize,
    ) -> Result<bool, String> {
        let x = &mut self.exchanges[i];
        if now.saturating_duration_since(x.started) > EXCHANGE_TIMEOUT {
            return Err("no complete exchange within 10 s".into());
        }
        x.conn.poll(stack).map_err(|e| e.to_string())?;
        if x.peer.is_none() {
            // perftest's client opens with its 16-byte version and waits.
            let head = x.conn.pending();
            if head.len() >= VERSION_LEN
                && !head[..VERSION_LEN].contains(&b':')
                && parse_version(&head[..VERSION_LEN]).is_some()
            {
                return Err(
                    "that is perftest's exchange: serve it with `uperf -s --rdma --perftest`"
                        .into(),
                );
            }
            let Some(msg) = x
                .conn
                .recv_exact(stack, PINGPONG_MSG_LEN)
                .map_err(|e| e.to_string())?
            else {
                return Ok(false);
            };
            let peer = PingpongDest::parse(&msg).ok_or_else(|| {
                format!(
                    "not an ibv_ud_pingpong address: {:?}",
                    String::from_utf8_lossy(&msg[..msg.len().min(24)])
                )
            })?;
            let ip = gid_ip(&peer.gid).ok_or(
                "its GID is zero (run ibv_ud_pingpong with -g and the index of a RoCE v2 GID)",
            )?;
            // Our GID in the family of the peer's.
            let me = our_gid_addr(stack, ip.is_ipv6(), Some(ip))?;
            if ud.error().is_some() {
                return Err("the UD responder is not running".into());
            }
            // Ready to echo before we answer, as the tool's server is.
            ud.echo_for(UdAddr { ip, qpn: peer.qpn });
            let ours = PingpongDest {
                lid: 0,
                qpn: ud.qpn(),
                psn: psn(now),
                gid: ip_gid(me),
            };
            x.conn.send(&ours.to_wire());
            x.conn.poll(stack).map_err(|e| e.to_string())?;
            x.peer = Some(peer);
            self.peers += 1;
            self.output.push(format!(
                "rdma ud: ibv_ud_pingpong peer {ip} qpn {:#08x}: echoing its messages on qpn {}",
                peer.qpn,
                ud.qpn()
            ));
        }
        match x.conn.recv_exact(stack, DONE.len()) {
            Ok(Some(_)) | Err(OobError::Closed) => Ok(x.conn.flushed()),
            Ok(None) => Ok(false),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Our address to name in a GID: the IPv4 one, or with `v6` an IPv6 one:
/// the source address toward `to` when the peer is known, else a global
/// address before the link-local one. An error names the flag to give
/// when IPv6 is off.
pub(crate) fn our_gid_addr(stack: &Stack, v6: bool, to: Option<IpAddr>) -> Result<IpAddr, String> {
    if !v6 {
        return Ok(stack.ip().into());
    }
    let toward = match to {
        Some(IpAddr::V6(to)) => stack.addr_ref().ipv6_source(to),
        _ => {
            let all = stack.addr_ref().ipv6();
            let global = all.iter().find(|a| !a.is_unicast_link_local());
            global.or(all.first()).copied()
        }
    };
    toward
        .map(IpAddr::V6)
        .ok_or_else(|| "an IPv6 GID needs an IPv6 address here (--ip ADDR/LEN)".to_string())
}

/// A GID as ibv_ud_pingpong prints it: `::ffff:a.b.c.d` or the IPv6
/// address.
fn gid_text(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => format!("::ffff:{v4}"),
        IpAddr::V6(v6) => v6.to_string(),
    }
}

/// `uping --rdma --pingpong` settings.
#[derive(Debug, Clone)]
pub struct PingpongOpts {
    /// The stock server's address.
    pub dst: Ipv4Addr,
    /// Its exchange port (18515).
    pub port: u16,
    /// Messages (the server's `-n`).
    pub count: u64,
    /// Bytes per message (the server's `-s`).
    pub size: usize,
    /// How long to wait for each echo before sending the next message.
    pub timeout: Duration,
    /// Print only the summary.
    pub quiet: bool,
    /// Send from our IPv6 GID (the exchange still goes to `dst`).
    pub ipv6: bool,
    /// The traffic class of our messages (`--tclass`).
    pub tclass: u8,
    /// The poll loop's settings (pinning, idle mode, the metrics feed).
    pub lcfg: LoopConfig,
}

#[derive(Debug)]
enum Phase {
    Exchange(MsgConn),
    /// Sent "done"; closing once flushed.
    Done(MsgConn),
    Data,
    Finished,
}

/// The client side of `ibv_ud_pingpong`, as an in-loop app.
#[derive(Debug)]
pub struct PingpongClient {
    o: PingpongOpts,
    phase: Phase,
    qp: Option<QpHandle>,
    peer: Option<UdAddr>,
    our_qpn: u32,
    seq: u64,
    /// The outstanding message: its sequence number and post time.
    waiting: Option<(u64, Instant)>,
    first_post: Option<Instant>,
    last_reply: Option<Instant>,
    /// Messages sent and replies matched, with their RTTs.
    pub summary: UdPingSummary,
    /// Replies that came after their message timed out.
    pub late: u64,
    /// Replies whose payload differed from what was sent.
    pub corrupt: u64,
    error: Option<String>,
    msg: Vec<u8>,
    cqes: Vec<Completion>,
    /// Lines to print.
    pub output: Vec<String>,
}

impl PingpongClient {
    /// A client that connects on its first turn.
    pub fn new(o: PingpongOpts) -> Self {
        PingpongClient {
            msg: vec![0; o.size],
            o,
            phase: Phase::Finished,
            qp: None,
            peer: None,
            our_qpn: 0,
            seq: 0,
            waiting: None,
            first_post: None,
            last_reply: None,
            summary: UdPingSummary::default(),
            late: 0,
            corrupt: 0,
            error: None,
            cqes: Vec::new(),
            output: Vec::new(),
        }
    }

    /// Why the run stopped early, if it did.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// First post to last reply.
    pub fn elapsed(&self) -> Duration {
        self.first_post
            .zip(self.last_reply)
            .map_or(Duration::ZERO, |(a, b)| b.saturating_duration_since(a))
    }

    fn fail(&mut self, why: String) -> Control {
        self.error = Some(why);
        self.phase = Phase::Finished;
        Control::Exit
    }

    fn start(&mut self, now: Instant, stack: &mut Stack) -> Result<(), String> {
        let mut qc = QpConfig::new(DEFAULT_QKEY);
        qc.max_send_wr = 4;
        qc.max_recv_wr = 16;
        qc.traffic_class = self.o.tclass;
        let qp = stack.ud().create_qp(&qc).map_err(|e| e.to_string())?;
        for i in 0..16 {
            stack
                .ud()
                .post_recv(qp, i, vec![0; GRH_LEN + self.o.size])
                .map_err(|e| e.to_string())?;
        }
        self.our_qpn = stack.ud().qp_num(qp).map_err(|e| e.to_string())?;
        self.qp = Some(qp);
        let me = our_gid_addr(stack, self.o.ipv6, None)?;
        let mut conn = MsgConn::connect(now, stack, SocketAddrV4::new(self.o.dst, self.o.port))
            .map_err(|e| e.to_string())?;
        let ours = PingpongDest {
            lid: 0,
            qpn: self.our_qpn,
            psn: 0,
            gid: ip_gid(me),
        };
        conn.send(&ours.to_wire());
        self.output.push(format!(
            "  local address:  LID 0x0000, QPN {:#08x}, PSN 0x000000: GID {}",
            self.our_qpn,
            gid_text(me)
        ));
        self.phase = Phase::Exchange(conn);
        Ok(())
    }

    fn post(
        &mut self,
        now: Instant,
        stack: &mut Stack,
        qp: QpHandle,
        peer: UdAddr,
    ) -> Result<(), String> {
        self.seq += 1;
        // Byte 0 stays 0 (the tool's -c check); the sequence number follows.
        self.msg.fill(0x7b);
        self.msg[0] = 0;
        let seq = self.seq.to_be_bytes();
        let n = seq.len().min(self.msg.len().saturating_sub(1));
        self.msg[1..1 + n].copy_from_slice(&seq[..n]);
        let wr = SendWr {
            wr_id: self.seq,
            dest: peer,
            remote_qkey: DEFAULT_QKEY,
            imm: None,
            solicited: false,
            data: &self.msg,
        };
        stack.ud().post_send(qp, &wr).map_err(|e| e.to_string())?;
        self.summary.transmitted += 1;
        self.first_post.get_or_insert(now);
        self.waiting = Some((self.seq, now));
        Ok(())
    }
}

impl App for PingpongClient {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        if self.qp.is_none() && self.error.is_none() {
            if let Err(e) = self.start(now, stack) {
                return self.fail(e);
            }
        }
        match std::mem::replace(&mut self.phase, Phase::Finished) {
            Phase::Exchange(mut conn) => {
                let got = conn
                    .poll(stack)
                    .and_then(|()| conn.recv_exact(stack, PINGPONG_MSG_LEN));
                match got {
                    Err(e) => {
                        return self.fail(format!("{}:{}: {e}", self.o.dst, self.o.port));
                    }
                    Ok(None) => self.phase = Phase::Exchange(conn),
                    Ok(Some(m)) => {
                        let Some(peer) = PingpongDest::parse(&m) else {
                            return self.fail(format!(
                                "{}:{}: the answer is not an ibv_ud_pingpong address",
                                self.o.dst, self.o.port
                            ));
                        };
                        let Some(ip) = gid_ip(&peer.gid).filter(|a| a.is_ipv6() == self.o.ipv6)
                        else {
                            return self.fail(format!(
                                "the server's GID is not an {} RoCE v2 GID: start ibv_ud_pingpong with -g and the index of one",
                                if self.o.ipv6 { "IPv6" } else { "IPv4" }
                            ));
                        };
                        self.output.push(format!(
                            "  remote address: LID 0x{:04x}, QPN {:#08x}, PSN {:#08x}, GID {}",
                            peer.lid,
                            peer.qpn,
                            peer.psn,
                            gid_text(ip)
                        ));
                        self.peer = Some(UdAddr { ip, qpn: peer.qpn });
                        conn.send(DONE);
                        let _ = conn.poll(stack);
                        self.phase = Phase::Done(conn);
                    }
                }
            }
            Phase::Done(mut conn) => {
                let _ = conn.poll(stack);
                if conn.flushed() {
                    conn.close(now, stack);
                    self.phase = Phase::Data;
                } else {
                    self.phase = Phase::Done(conn);
                }
            }
            Phase::Data => self.phase = Phase::Data,
            Phase::Finished => return Control::Exit,
        }
        if !matches!(self.phase, Phase::Data) {
            return Control::Continue;
        }
        let (Some(qp), Some(peer)) = (self.qp, self.peer) else {
            return Control::Continue;
        };
        let mut cqes = std::mem::take(&mut self.cqes);
        while stack.ud().poll_cq(qp, now, 16, &mut cqes).unwrap_or(0) > 0 {
            for c in cqes.drain(..) {
                if c.opcode != WcOpcode::Recv {
                    continue;
                }
                let payload = c.payload();
                let seq = payload
                    .get(1..9)
                    .map(|b| u64::from_be_bytes(b.try_into().unwrap_or_default()));
                if c.status == WcStatus::Success {
                    match (self.waiting, seq) {
                        (Some((want, posted)), Some(got)) if want == got => {
                            let rtt = c.timestamp.saturating_duration_since(posted);
                            if payload != self.msg.as_slice() {
                                self.corrupt += 1;
                            }
                            self.summary.record(rtt);
                            self.last_reply = Some(c.timestamp);
                            self.waiting = None;
                            if !self.o.quiet {
                                self.output.push(format!(
                                    "{} bytes from {}: ud_seq={got} time={:.3} ms",
                                    payload.len(),
                                    peer,
                                    rtt.as_secs_f64() * 1e3
                                ));
                            }
                        }
                        _ => self.late += 1,
                    }
                }
                if let Some(buf) = c.buf {
                    let _ = stack.ud().post_recv(qp, c.wr_id, buf);
                }
            }
        }
        self.cqes = cqes;
        if let Some((seq, posted)) = self.waiting {
            if now.saturating_duration_since(posted) < self.o.timeout {
                return Control::Continue;
            }
            if !self.o.quiet {
                self.output.push(format!(
                    "no answer to ud_seq={seq} within {:?}",
                    self.o.timeout
                ));
            }
            self.waiting = None;
        }
        if self.seq >= self.o.count {
            self.phase = Phase::Finished;
            return Control::Exit;
        }
        if let Err(e) = self.post(now, stack, qp, peer) {
            return self.fail(e);
        }
        Control::Continue
    }
}

/// Runs `uping --rdma --pingpong` on a node.
#[derive(Debug)]
pub struct PingpongUser(pub PingpongOpts);

impl NodeRunner for PingpongUser {
    type Output = ExitCode;
    type Error = anyhow::Error;
    fn run<D>(self, mut node: Node<D>) -> Result<ExitCode>
    where
        D: Device + Send + 'static,
        D::Buf: Send,
    {
        let o = self.0;
        let max = node.stack.ud_max_msg();
        if o.size == 0 || o.size > max {
            bail!(
                "invalid -s value: '{}': a UD message holds 1 to {max} bytes here (the InfiniBand path MTU)",
                o.size
            );
        }
        crate::outln!(
            "RDMA UD PINGPONG {}:{} (ibv_ud_pingpong server): {} messages of {} bytes",
            o.dst,
            o.port,
            o.count,
            o.size
        );
        let lcfg = o.lcfg.clone();
        let mut front = Front(PingpongClient::new(o.clone()));
        crate::run_app(&mut node, &mut front, &lcfg, None)?;
        let c = front.0;
        if let Some(e) = c.error() {
            bail!("{e}");
        }
        let s = &c.summary;
        let (sent, lost) = (s.transmitted, s.lost());
        crate::outln!("\n--- {} ibv_ud_pingpong statistics ---", o.dst);
        crate::outln!(
            "{sent} messages transmitted, {} received, {lost} lost, {} late, {} corrupt",
            s.received,
            c.late,
            c.corrupt
        );
        if s.rtt.count > 0 {
            let p = |q| s.percentile(q).map_or(0.0, |d| d.as_secs_f64() * 1e3);
            crate::outln!(
                "rtt min/avg/max = {:.3}/{:.3}/{:.3} ms, p50/p99 = {:.3}/{:.3} ms",
                s.rtt.min.as_secs_f64() * 1e3,
                s.rtt.avg().as_secs_f64() * 1e3,
                s.rtt.max.as_secs_f64() * 1e3,
                p(0.5),
                p(0.99)
            );
            crate::outln!("rtt clock = poll loop (post to receive completion)");
        }
        // The tool's own closing lines.
        let usec = c.elapsed().as_secs_f64() * 1e6;
        if usec > 0.0 {
            let bytes = (o.size as u64) * s.received * 2;
            crate::outln!(
                "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
                usec / 1e6,
                bytes as f64 * 8.0 / usec
            );
            crate::outln!(
                "{} iters in {:.2} seconds = {:.2} usec/iter",
                s.received,
                usec / 1e6,
                usec / s.received.max(1) as f64
            );
        }
        Ok(if lost == 0 && c.corrupt == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        })
    }
}

struct Front(PingpongClient);

impl App for Front {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let c = self.0.poll(now, stack);
        for line in self.0.output.drain(..) {
            crate::outln!("{line}");
        }
        c
    }
}
