//! UD apps over any [`UdTransport`]: [`UdPinger`] (ping/pong with send and
//! receive completion timestamps, PingWeave-style statistics),
//! [`UdResponder`] (answers pings, sinks everything else, reports its sink
//! counters) and [`UdBandwidth`] (ib_send_bw-style message-size sweep).
//!
//! Each is an [`App`] for the stack's own RoCEv2 transport and has a
//! `poll_transport` that drives any other transport (ibverbs) the same way.
//!
//! Message layout (big-endian), at least [`PING_LEN`] bytes:
//! `"UDPG" | kind (1 ping, 2 pong, 3 stats request, 4 stats reply) | 3 zero |
//! seq u64 | a u64 | b u64 | c u64 | filler`. A ping carries its post time in
//! `a`; a pong echoes seq and `a`, and carries the responder's receive
//! completion time in `b` and its processing delay (post of the pong minus
//! receive) in `c`. A stats reply carries the sink's messages in `a`, bytes
//! in `b`. Anything else is sink data.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::ping::RttStats;
use ustack::Error;
use ustack::node::{App, Control, RxWait};
use ustack::socket::ud::{
    Completion, DEFAULT_QKEY, GRH_LEN, QpConfig, QpHandle, RESPONDER_QPN, SendWr, TsSource, UdAddr,
    UdError, UdTransport, WcOpcode, WcStatus,
};
use ustack::stack::Stack;
use ustack::time::Instant;

/// Smallest ping message.
pub const PING_LEN: usize = 40;
const MAGIC: &[u8; 4] = b"UDPG";
const KIND_PING: u8 = 1;
const KIND_PONG: u8 = 2;
const KIND_STATS_REQ: u8 = 3;
const KIND_STATS: u8 = 4;

/// A decoded control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Msg {
    kind: u8,
    seq: u64,
    a: u64,
    b: u64,
    c: u64,
}

impl Msg {
    fn parse(p: &[u8]) -> Option<Msg> {
        if p.len() < PING_LEN || &p[..4] != MAGIC {
            return None;
        }
        let u = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&p[at..at + 8]);
            u64::from_be_bytes(b)
        };
        Some(Msg {
            kind: p[4],
            seq: u(8),
            a: u(16),
            b: u(24),
            c: u(32),
        })
    }

    /// Write into `buf` (at least [`PING_LEN`]); the rest is a counting pattern.
    fn write(&self, buf: &mut [u8]) {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = i as u8;
        }
        buf[..4].copy_from_slice(MAGIC);
        buf[4] = self.kind;
        buf[5..8].fill(0);
        buf[8..16].copy_from_slice(&self.seq.to_be_bytes());
        buf[16..24].copy_from_slice(&self.a.to_be_bytes());
        buf[24..32].copy_from_slice(&self.b.to_be_bytes());
        buf[32..40].copy_from_slice(&self.c.to_be_bytes());
    }
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Post `n` receive buffers of `size` payload bytes (plus the GRH space).
fn post_recvs<T: UdTransport + ?Sized>(
    t: &mut T,
    qp: QpHandle,
    n: usize,
    size: usize,
) -> Result<(), Error> {
    for i in 0..n {
        t.post_recv(qp, i as u64, vec![0u8; GRH_LEN + size])?;
    }
    Ok(())
}

/// Give a receive buffer back to the QP.
fn repost<T: UdTransport + ?Sized>(t: &mut T, qp: QpHandle, c: &mut Completion) {
    if let Some(buf) = c.buf.take() {
        // Only fails if the queue is full, which cannot be: this buffer
        // just left it.
        let _ = t.post_recv(qp, c.wr_id, buf);
    }
}

// ------------------------------------------------------------------ pinger

/// What to ping and how.
#[derive(Debug, Clone)]
pub struct UdPingerConfig {
    /// The responder to ping (address and QP number).
    pub dst: UdAddr,
    /// Q_Key of our QP and of the pings (the responder's must match).
    pub qkey: u32,
    /// Pings to send; `None` for no limit.
    pub count: Option<u64>,
    /// Time between pings.
    pub interval: Duration,
    /// Message bytes (at least [`PING_LEN`]).
    pub size: usize,
    /// How long to wait for pongs after the last ping when none has come
    /// back by then (`-W`); with pongs in, the wait is
    /// [`crate::ping::linger`]'s, as iputils ping does.
    pub timeout: Duration,
    /// Coalesce sends: wake at most once per `batch` and send every ping
    /// due by then (at most [`MAX_BURST`] at once). The rate is kept; pings
    /// leave in small bursts, and the loop sleeps between them instead of
    /// waking for each (10,000 pings/s are 1,000 wake-ups with 1 ms).
    /// Zero (the default): one wake-up per ping, on time.
    pub batch: Duration,
}

/// Most pings a batching pinger sends in one turn.
pub const MAX_BURST: usize = 64;

impl UdPingerConfig {
    /// Ping `dst` once a second without end with 64-byte messages, Q_Key
    /// [`DEFAULT_QKEY`] and a 1 s wait for the last pong.
    pub fn new(dst: UdAddr) -> Self {
        UdPingerConfig {
            dst,
            qkey: DEFAULT_QKEY,
            count: None,
            interval: Duration::from_secs(1),
            size: 64,
            timeout: Duration::from_secs(1),
            batch: Duration::ZERO,
        }
    }
}

/// One pong, for a front end to print.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdPong {
    /// The ping's sequence number (from 1).
    pub seq: u64,
    /// The responder (address and QP number).
    pub from: UdAddr,
    /// Message bytes received.
    pub bytes: usize,
    /// Round trip, less the responder's processing delay: our receive
    /// completion minus our send completion where the NIC stamped both,
    /// else the receive's poll-loop time minus the post time.
    pub rtt: Duration,
    /// The responder's processing delay (its pong post minus its receive
    /// completion), as it reported it.
    pub server_delay: Duration,
    /// A second pong for the same ping (`rtt` and `server_delay` are zero).
    pub duplicate: bool,
    /// Which clock measured `rtt`.
    pub ts_source: TsSource,
}

/// Totals of a UD ping run, with percentiles.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UdPingSummary {
    /// Pings posted.
    pub transmitted: u64,
    /// Pings answered (first pong to each).
    pub received: u64,
    /// Further pongs to a ping already answered.
    pub duplicates: u64,
    /// Sends that completed in error.
    pub errors: u64,
    /// RTTs of the answered pings.
    pub rtt: RttStats,
    /// Of `received`, the RTTs measured between two NIC completion
    /// timestamps; the others are on the poll loop's clock.
    pub nic_stamped: u64,
    /// RTT samples in nanoseconds (the first million).
    samples: Vec<u64>,
}

/// Most RTT samples kept for percentiles.
const MAX_SAMPLES: usize = 1 << 20;

impl UdPingSummary {
    /// Lost pings in percent of those sent (0 before the first).
    pub fn loss_percent(&self) -> f64 {
        if self.transmitted == 0 {
            return 0.0;
        }
        100.0 * self.transmitted.saturating_sub(self.received) as f64 / self.transmitted as f64
    }

    /// Lost pings (sent, never answered).
    pub fn lost(&self) -> u64 {
        self.transmitted.saturating_sub(self.received)
    }

    /// One answered ping and its RTT (the sample kept for percentiles up
    /// to the first million).
    pub fn record(&mut self, rtt: Duration) {
        self.received += 1;
        self.rtt.add(rtt);
        if self.samples.len() < MAX_SAMPLES {
            self.samples.push(ns(rtt));
        }
    }

    /// The `q` quantile (0.0..=1.0) of the RTTs, nearest rank.
    pub fn percentile(&self, q: f64) -> Option<Duration> {
        if self.samples.is_empty() {
            return None;
        }
        let mut s = self.samples.clone();
        s.sort_unstable();
        let rank = ((q.clamp(0.0, 1.0) * s.len() as f64).ceil() as usize).clamp(1, s.len());
        Some(Duration::from_nanos(s[rank - 1]))
    }
}

#[derive(Debug, Clone, Copy)]
struct Sent {
    posted: Instant,
    /// The send completion's timestamp and its clock.
    tx_ts: Option<(Instant, TsSource)>,
}

/// An app that pings one UD peer.
#[derive(Debug)]
pub struct UdPinger {
    cfg: UdPingerConfig,
    qp: Option<QpHandle>,
    qpn: u32,
    next_send: Option<Instant>,
    /// When the pinger last sent (a batching pinger sends once per window).
    last_burst: Option<Instant>,
    first_send: Option<Instant>,
    last_send: Option<Instant>,
    /// When the wait for outstanding pongs ends, once the last ping of a
    /// counted run has left.
    linger_until: Option<Instant>,
    outstanding: HashMap<u64, Sent>,
    answered: HashMap<u64, ()>,
    summary: UdPingSummary,
    events: VecDeque<UdPong>,
    keep_events: bool,
    error: Option<Error>,
    done: bool,
    cqes: Vec<Completion>,
    msg: Vec<u8>,
}

const EVENT_BACKLOG: usize = 65_536;
const RECV_DEPTH: usize = 64;

impl UdPinger {
    /// A pinger that creates its QP, posts its receive buffers and sends
    /// its first ping on its first turn; `cfg.size` is raised to
    /// [`PING_LEN`] if smaller.
    pub fn new(mut cfg: UdPingerConfig) -> Self {
        cfg.size = cfg.size.max(PING_LEN);
        UdPinger {
            msg: vec![0; cfg.size],
            cfg,
            qp: None,
            qpn: 0,
            next_send: None,
            last_burst: None,
            first_send: None,
            last_send: None,
            linger_until: None,
            outstanding: HashMap::new(),
            answered: HashMap::new(),
            summary: UdPingSummary::default(),
            events: VecDeque::new(),
            keep_events: true,
            error: None,
            done: false,
            cqes: Vec::new(),
        }
    }

    /// Keep no per-pong events (summary only).
    pub fn quiet(mut self) -> Self {
        self.keep_events = false;
        self
    }

    /// What this pinger pings and how.
    pub fn config(&self) -> &UdPingerConfig {
        &self.cfg
    }
    /// Totals so far.
    pub fn summary(&self) -> &UdPingSummary {
        &self.summary
    }
    /// The error that stopped the pinger (QP creation, a failed post), if any.
    pub fn error(&self) -> Option<&Error> {
        self.error.as_ref()
    }
    /// Our QP number, once created.
    pub fn local_qpn(&self) -> Option<u32> {
        self.qp.map(|_| self.qpn)
    }
    /// When the first ping was posted, if one was.
    pub fn started(&self) -> Option<Instant> {
        self.first_send
    }
    /// When the latest ping left, if one did.
    pub fn last_sent(&self) -> Option<Instant> {
        self.last_send
    }
    /// Pongs since the last call (none when [`quiet`](Self::quiet)).
    pub fn drain_events(&mut self) -> impl Iterator<Item = UdPong> + '_ {
        self.events.drain(..)
    }

    fn all_sent(&self) -> bool {
        self.cfg
            .count
            .is_some_and(|c| self.summary.transmitted >= c)
    }

    /// All pings sent and each answered or timed out.
    pub fn finished(&self, now: Instant) -> bool {
        self.error.is_some()
            || (self.all_sent()
                && (self.outstanding.is_empty() || self.linger_until.is_some_and(|t| now >= t)))
    }

    fn on_completion(&mut self, now: Instant, c: &Completion) {
        match c.opcode {
            WcOpcode::Send => {
                if c.status != WcStatus::Success {
                    if self.outstanding.remove(&c.wr_id).is_some() {
                        self.summary.errors += 1;
                    }
                } else if let Some(s) = self.outstanding.get_mut(&c.wr_id) {
                    s.tx_ts = Some((c.timestamp, c.ts_source));
                }
            }
            WcOpcode::Recv => {
                if c.status != WcStatus::Success {
                    return;
                }
                let Some(m) = Msg::parse(c.payload()).filter(|m| m.kind == KIND_PONG) else {
                    return;
                };
                let Some(from) = c.src else { return };
                let duplicate = match self.outstanding.remove(&m.seq) {
                    Some(sent) => {
                        // Both ends of the RTT on one clock: the NIC's when
                        // it stamped both completions, else the loop's.
                        let (tx, rx, clock) = match sent.tx_ts {
                            Some((tx, src)) if src == c.ts_source => (tx, c.timestamp, src),
                            _ if c.ts_source == TsSource::Poll => {
                                (sent.posted, c.timestamp, TsSource::Poll)
                            }
                            _ => (sent.posted, now, TsSource::Poll),
                        };
                        let server = Duration::from_nanos(m.c);
                        let rtt = rx.saturating_duration_since(tx).saturating_sub(server);
                        self.summary.record(rtt);
                        if clock == TsSource::Nic {
                            self.summary.nic_stamped += 1;
                        }
                        self.answered.insert(m.seq, ());
                        self.push(UdPong {
                            seq: m.seq,
                            from,
                            bytes: c.payload().len(),
                            rtt,
                            server_delay: server,
                            duplicate: false,
                            ts_source: clock,
                        });
                        false
                    }
                    None => true,
                };
                if duplicate && self.answered.contains_key(&m.seq) {
                    self.summary.duplicates += 1;
                    self.push(UdPong {
                        seq: m.seq,
                        from,
                        bytes: c.payload().len(),
                        rtt: Duration::ZERO,
                        server_delay: Duration::ZERO,
                        duplicate: true,
                        ts_source: c.ts_source,
                    });
                }
            }
        }
    }

    fn push(&mut self, ev: UdPong) {
        if !self.keep_events {
            return;
        }
        if self.events.len() >= EVENT_BACKLOG {
            self.events.pop_front();
        }
        self.events.push_back(ev);
    }

    /// One turn against any transport.
    pub fn poll_transport<T: UdTransport + ?Sized>(&mut self, now: Instant, t: &mut T) -> Control {
        if self.error.is_some() {
            return Control::Exit;
        }
        let qp = match self.qp {
            Some(qp) => qp,
            None => match self.open(t) {
                Ok(qp) => {
                    self.next_send = Some(now);
                    qp
                }
                Err(e) => {
                    self.error = Some(e);
                    return Control::Exit;
                }
            },
        };
        let mut cqes = std::mem::take(&mut self.cqes);
        while t.poll_cq(qp, now, 64, &mut cqes).unwrap_or(0) > 0 {
            for mut c in cqes.drain(..) {
                self.on_completion(now, &c);
                if c.opcode == WcOpcode::Recv {
                    repost(t, qp, &mut c);
                }
            }
        }
        self.cqes = cqes;
        let mut burst = 0;
        // A batching pinger sends at most once per window, whatever woke it.
        let may_send = self.last_burst.is_none_or(|t| now >= t + self.cfg.batch);
        while let Some(due) = self
            .next_send
            .filter(|d| may_send && now >= *d && !self.all_sent())
        {
            if burst == 0 {
                self.last_burst = Some(now);
            }
            burst += 1;
            let seq = self.summary.transmitted + 1;
            Msg {
                kind: KIND_PING,
                seq,
                a: now.as_nanos(),
                b: 0,
                c: 0,
            }
            .write(&mut self.msg);
            let wr = SendWr {
                wr_id: seq,
                dest: self.cfg.dst,
                remote_qkey: self.cfg.qkey,
                imm: None,
                solicited: false,
                data: &self.msg,
            };
            match t.post_send(qp, &wr) {
                Ok(()) => {
                    self.summary.transmitted += 1;
                    self.outstanding.insert(
                        seq,
                        Sent {
                            posted: now,
                            tx_ts: None,
                        },
                    );
                    self.first_send.get_or_insert(now);
                    self.last_send = Some(now);
                    if self.all_sent() {
                        let s = &self.summary;
                        let wait = crate::ping::linger(
                            s.received,
                            s.rtt.max,
                            self.cfg.interval,
                            self.cfg.timeout,
                        );
                        self.linger_until = Some(now + wait);
                    }
                }
                Err(Error::Ud(UdError::QueueFull)) => {
                    self.next_send = Some(now);
                    break;
                }
                Err(e) => {
                    self.error = Some(e);
                    return Control::Exit;
                }
            }
            let next = due + self.cfg.interval;
            if self.cfg.batch.is_zero() {
                // Late: the schedule restarts from now (no catching up).
                self.next_send = Some(if next < now { now } else { next });
                break;
            }
            self.next_send = Some(next);
            if burst >= MAX_BURST {
                // Further behind than a burst: give up the lost schedule.
                if next + self.cfg.batch < now {
                    self.next_send = Some(now);
                }
                break;
            }
        }
        let timeout = self.cfg.timeout;
        if self.outstanding.len() > 1024 {
            self.outstanding.retain(|_, s| now < s.posted + timeout);
        }
        if self.answered.len() > 4096 {
            self.answered.clear();
        }
        if self.finished(now) {
            self.done = true;
            Control::Exit
        } else {
            Control::Continue
        }
    }

    fn open<T: UdTransport + ?Sized>(&mut self, t: &mut T) -> Result<QpHandle, Error> {
        let mut qc = QpConfig::new(self.cfg.qkey);
        qc.max_recv_wr = RECV_DEPTH;
        qc.max_send_wr = 256;
        let qp = t.create_qp(&qc)?;
        self.qpn = t.qp_num(qp)?;
        post_recvs(t, qp, RECV_DEPTH, t.max_msg_size().max(self.cfg.size))?;
        self.qp = Some(qp);
        Ok(qp)
    }

    /// When the pinger next needs a turn.
    pub fn next_wakeup(&self) -> Option<Instant> {
        if self.error.is_some() || self.done {
            return None;
        }
        if self.qp.is_none() {
            return Some(Instant::ZERO);
        }
        if !self.all_sent() {
            return self.next_send.map(|t| match self.last_burst {
                Some(b) => t.max(b + self.cfg.batch),
                None => t,
            });
        }
        if self.outstanding.is_empty() {
            return None;
        }
        self.linger_until
    }
}

impl App for UdPinger {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        self.poll_transport(now, &mut stack.ud())
    }
    fn poll_at(&self) -> Option<Instant> {
        self.next_wakeup()
    }
    /// Once a pong has come (so the peer's address is resolved), the pong
    /// of the last ping is timed by the port's receive stamp (the receive
    /// completion's timestamp): it may wait for the next send. Pings
    /// whose pongs were lost (still outstanding) wait for nothing.
    fn rx_wait(&self) -> RxWait {
        let last_out = self.outstanding.contains_key(&self.summary.transmitted);
        match (self.summary.received > 0, last_out) {
            (true, true) => RxWait::Stamped,
            (true, false) => RxWait::Nothing,
            _ => RxWait::Prompt,
        }
    }
}

// --------------------------------------------------------------- responder

/// Counters of a responder.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResponderStats {
    /// Pings received.
    pub pings: u64,
    /// Pongs posted in answer.
    pub pongs: u64,
    /// Pongs not sent (send queue full).
    pub pong_drops: u64,
    /// Messages that were not pings or stats requests (bandwidth data).
    pub sink_msgs: u64,
    /// Payload bytes of those messages.
    pub sink_bytes: u64,
    /// Messages from an echo peer sent back as they came.
    pub echoed: u64,
    /// Echoes not sent (send queue full).
    pub echo_drops: u64,
}

/// Most peers a responder echoes for at once (the oldest is forgotten).
pub const MAX_ECHO_PEERS: usize = 64;

/// Answers UD pings on a well-known QPN and sinks other messages.
#[derive(Debug)]
pub struct UdResponder {
    qkey: u32,
    qpn: u32,
    depth: usize,
    qp: Option<QpHandle>,
    stats: ResponderStats,
    error: Option<Error>,
    cqes: Vec<Completion>,
    msg: Vec<u8>,
    /// Peers whose every message is sent back unchanged, oldest first.
    echo_peers: VecDeque<UdAddr>,
}

impl Default for UdResponder {
    fn default() -> Self {
        UdResponder::new(RESPONDER_QPN, DEFAULT_QKEY)
    }
}

impl UdResponder {
    /// A responder on `qpn` (the stack's transport honours it; verbs picks
    /// its own, see [`qpn`](Self::qpn)) with Q_Key `qkey`.
    pub fn new(qpn: u32, qkey: u32) -> Self {
        UdResponder {
            qkey,
            qpn,
            depth: 512,
            qp: None,
            stats: ResponderStats::default(),
            error: None,
            cqes: Vec::new(),
            msg: vec![0; PING_LEN],
            echo_peers: VecDeque::new(),
        }
    }

    /// Send every message from `peer` back to it unchanged, whatever it
    /// holds: what a stock ping-pong peer (`ibv_ud_pingpong`, perftest's
    /// latency test) expects of its partner. Asked for by the peer's address
    /// exchange; at most [`MAX_ECHO_PEERS`] at once, the oldest forgotten.
    pub fn echo_for(&mut self, peer: UdAddr) {
        self.echo_peers.retain(|p| *p != peer);
        if self.echo_peers.len() >= MAX_ECHO_PEERS {
            self.echo_peers.pop_front();
        }
        self.echo_peers.push_back(peer);
    }

    /// Receive buffers kept posted (default 512).
    pub fn with_depth(mut self, depth: usize) -> Self {
        self.depth = depth.max(1);
        self
    }

    /// Counters so far.
    pub fn stats(&self) -> ResponderStats {
        self.stats
    }
    /// The QP number: the one asked for, or once the QP exists, the one
    /// the transport gave it.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }
    /// Why the responder could not start (QP number taken, no device), if
    /// it could not.
    pub fn error(&self) -> Option<&Error> {
        self.error.as_ref()
    }

    fn open<T: UdTransport + ?Sized>(&mut self, t: &mut T) -> Result<QpHandle, Error> {
        let mut qc = QpConfig::new(self.qkey);
        qc.qpn = Some(self.qpn);
        qc.max_recv_wr = self.depth;
        qc.max_send_wr = self.depth;
        let qp = t.create_qp(&qc)?;
        self.qpn = t.qp_num(qp)?;
        post_recvs(t, qp, self.depth, t.max_msg_size())?;
        Ok(qp)
    }

    /// One turn against any transport: create the QP on the first turn,
    /// then answer pings and stats requests and sink everything else.
    /// Always [`Control::Continue`] (a responder that failed to start
    /// stays idle, see [`error`](Self::error)).
    pub fn poll_transport<T: UdTransport + ?Sized>(&mut self, now: Instant, t: &mut T) -> Control {
        if self.error.is_some() {
            return Control::Continue;
        }
        let qp = match self.qp {
            Some(qp) => qp,
            None => match self.open(t) {
                Ok(qp) => {
                    self.qp = Some(qp);
                    qp
                }
                Err(e) => {
                    tracing::warn!(error = %e, "UD responder not started");
                    self.error = Some(e);
                    return Control::Continue;
                }
            },
        };
        let mut cqes = std::mem::take(&mut self.cqes);
        while t.poll_cq(qp, now, 64, &mut cqes).unwrap_or(0) > 0 {
            for mut c in cqes.drain(..) {
                if c.opcode == WcOpcode::Recv {
                    self.on_recv(now, t, qp, &c);
                    repost(t, qp, &mut c);
                }
            }
        }
        self.cqes = cqes;
        Control::Continue
    }

    fn on_recv<T: UdTransport + ?Sized>(
        &mut self,
        now: Instant,
        t: &mut T,
        qp: QpHandle,
        c: &Completion,
    ) {
        if c.status != WcStatus::Success {
            return;
        }
        let payload = c.payload();
        if let Some(src) = c.src.filter(|s| self.echo_peers.contains(s)) {
            let wr = SendWr {
                wr_id: 0,
                dest: src,
                remote_qkey: self.qkey,
                imm: None,
                solicited: false,
                data: payload,
            };
            match t.post_send(qp, &wr) {
                Ok(()) => self.stats.echoed += 1,
                Err(_) => self.stats.echo_drops += 1,
            }
            return;
        }
        let (Some(m), Some(src)) = (Msg::parse(payload), c.src) else {
            self.stats.sink_msgs += 1;
            self.stats.sink_bytes += payload.len() as u64;
            return;
        };
        let reply = match m.kind {
            KIND_PING => {
                self.stats.pings += 1;
                // Answer with the same size, so the RTT covers both ways alike.
                self.msg.resize(payload.len(), 0);
                Msg {
                    kind: KIND_PONG,
                    seq: m.seq,
                    a: m.a,
                    b: c.timestamp.as_nanos(),
                    c: ns(now.saturating_duration_since(c.timestamp)),
                }
            }
            KIND_STATS_REQ => {
                self.msg.resize(PING_LEN, 0);
                Msg {
                    kind: KIND_STATS,
                    seq: m.seq,
                    a: self.stats.sink_msgs,
                    b: self.stats.sink_bytes,
                    c: 0,
                }
            }
            _ => {
                self.stats.sink_msgs += 1;
                self.stats.sink_bytes += payload.len() as u64;
                return;
            }
        };
        reply.write(&mut self.msg);
        let wr = SendWr {
            wr_id: m.seq,
            dest: src,
            remote_qkey: self.qkey,
            imm: None,
            solicited: false,
            data: &self.msg,
        };
        match t.post_send(qp, &wr) {
            Ok(()) if m.kind == KIND_PING => self.stats.pongs += 1,
            Ok(()) => {}
            Err(_) => self.stats.pong_drops += 1,
        }
    }
}

impl App for UdResponder {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        self.poll_transport(now, &mut stack.ud())
    }
}

// --------------------------------------------------------------- bandwidth

/// One row of the bandwidth table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwResult {
    /// Message size, bytes.
    pub bytes: usize,
    /// Sends that completed successfully at this size.
    pub iterations: u64,
    /// MB/s (2^20 bytes), as perftest reports by default: the best window
    /// of tx-depth consecutive send completions. `None` when every send
    /// completed at the same instant of the clock (within one poll): there
    /// is no span to divide by.
    pub bw_peak_mbs: Option<f64>,
    /// MB/s (2^20 bytes) from the first post to the last send completion
    /// (NIC timestamps: first to last send completion). `None` as above.
    pub bw_avg_mbs: Option<f64>,
    /// Millions of messages per second over the same span as `bw_avg_mbs`.
    pub msg_rate_mpps: Option<f64>,
    /// Messages the sink counted for this size, if it answered.
    pub delivered: Option<u64>,
}

/// Bandwidth-test settings.
#[derive(Debug, Clone)]
pub struct UdBandwidthConfig {
    /// The sink (a [`UdResponder`]) to send to.
    pub dst: UdAddr,
    /// Q_Key of our QP and of the messages.
    pub qkey: u32,
    /// Message sizes to sweep, bytes, in order.
    pub sizes: Vec<usize>,
    /// Messages sent at each size.
    pub iterations: u64,
    /// Sends kept outstanding (perftest's tx-depth).
    pub tx_depth: usize,
    /// How long to wait for the sink's counters after each size.
    pub stats_timeout: Duration,
}

impl UdBandwidthConfig {
    /// A sweep to `dst` over [`sweep_sizes`]`(max_msg)`, 1000 messages per
    /// size, 128 outstanding, Q_Key [`DEFAULT_QKEY`].
    pub fn new(dst: UdAddr, max_msg: usize) -> Self {
        UdBandwidthConfig {
            dst,
            qkey: DEFAULT_QKEY,
            sizes: sweep_sizes(max_msg),
            iterations: 1000,
            tx_depth: 128,
            stats_timeout: Duration::from_millis(500),
        }
    }
}

/// 64, 128, ... powers of two below `max`, then `max` itself.
pub fn sweep_sizes(max: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = 64;
    while s < max {
        v.push(s);
        s *= 2;
    }
    if max >= PING_LEN {
        v.push(max);
    }
    v
}

#[derive(Debug)]
enum BwPhase {
    Sending,
    AwaitStats { asked: Instant },
}

/// Sends `iterations` messages of each size as fast as the send queue
/// allows and measures from send completion timestamps (sender side, like
/// ib_send_bw); after each size asks the sink how many arrived.
#[derive(Debug)]
pub struct UdBandwidth {
    cfg: UdBandwidthConfig,
    qp: Option<QpHandle>,
    size_idx: usize,
    phase: BwPhase,
    posted: u64,
    completed: u64,
    first_post: Option<Instant>,
    tx_ts: Vec<Instant>,
    /// The send completions carry NIC timestamps.
    tx_nic: bool,
    in_flight: usize,
    sink_before: Option<u64>,
    pending: Option<BwResult>,
    results: Vec<BwResult>,
    error: Option<Error>,
    stats_seq: u64,
    cqes: Vec<Completion>,
    msg: Vec<u8>,
}

impl UdBandwidth {
    /// A sweep that creates its QP and asks the sink's counters on its
    /// first turn.
    pub fn new(cfg: UdBandwidthConfig) -> Self {
        UdBandwidth {
            cfg,
            qp: None,
            size_idx: 0,
            phase: BwPhase::AwaitStats {
                asked: Instant::FAR_FUTURE,
            },
            posted: 0,
            completed: 0,
            first_post: None,
            tx_ts: Vec::new(),
            tx_nic: false,
            in_flight: 0,
            sink_before: None,
            pending: None,
            results: Vec::new(),
            error: None,
            stats_seq: 0,
            cqes: Vec::new(),
            msg: Vec::new(),
        }
    }

    /// Rows finished so far (take them to print as they come).
    pub fn take_results(&mut self) -> Vec<BwResult> {
        std::mem::take(&mut self.results)
    }
    /// The error that stopped the sweep (QP creation failed), if any.
    pub fn error(&self) -> Option<&Error> {
        self.error.as_ref()
    }
    /// Every size measured (or the sweep failed).
    pub fn done(&self) -> bool {
        self.error.is_some() || self.size_idx > self.cfg.sizes.len()
    }

    fn ask_stats<T: UdTransport + ?Sized>(&mut self, now: Instant, t: &mut T, qp: QpHandle) {
        self.stats_seq += 1;
        let mut m = vec![0u8; PING_LEN];
        Msg {
            kind: KIND_STATS_REQ,
            seq: self.stats_seq,
            a: 0,
            b: 0,
            c: 0,
        }
        .write(&mut m);
        let wr = SendWr {
            wr_id: u64::MAX,
            dest: self.cfg.dst,
            remote_qkey: self.cfg.qkey,
            imm: None,
            solicited: false,
            data: &m,
        };
        let _ = t.post_send(qp, &wr);
        self.phase = BwPhase::AwaitStats { asked: now };
    }

    fn finish_size(&mut self, sink_now: Option<u64>) {
        if let Some(mut r) = self.pending.take() {
            r.delivered = match (self.sink_before, sink_now) {
                (Some(a), Some(b)) => Some(b.saturating_sub(a)),
                _ => None,
            };
            self.results.push(r);
        }
        self.sink_before = sink_now;
        // Next size.
        self.size_idx += 1;
        self.posted = 0;
        self.completed = 0;
        self.first_post = None;
        self.tx_ts.clear();
        self.phase = BwPhase::Sending;
        if let Some(&size) = self.cfg.sizes.get(self.size_idx - 1) {
            self.msg = (0..size).map(|i| i as u8).collect();
        } else {
            self.size_idx = self.cfg.sizes.len() + 1;
        }
    }

    fn result(&self, size: usize) -> BwResult {
        let ts = &self.tx_ts;
        // The span starts at the first post on the loop's clock, or at the
        // first send completion when the NIC stamped them (its clock is not
        // the loop's).
        let start = if self.tx_nic {
            ts.first().copied()
        } else {
            self.first_post
        }
        .unwrap_or(Instant::ZERO);
        let end = ts.last().copied().unwrap_or(start);
        let secs = end.saturating_duration_since(start).as_secs_f64();
        let mb = |msgs: f64, secs: f64| msgs * size as f64 / secs / f64::from(1u32 << 20);
        let n = ts.len() as f64;
        let (avg, rate) = if secs > 0.0 {
            (Some(mb(n, secs)), Some(n / secs / 1e6))
        } else {
            (None, None)
        };
        // Peak: the best window of tx-depth consecutive completions.
        let w = self.cfg.tx_depth.clamp(1, ts.len().max(1));
        let mut peak = avg;
        for i in w..ts.len() {
            let d = ts[i].saturating_duration_since(ts[i - w]).as_secs_f64();
            if d > 0.0 {
                let m = mb(w as f64, d);
                peak = Some(peak.map_or(m, |p| p.max(m)));
            }
        }
        BwResult {
            bytes: size,
            iterations: self.tx_ts.len() as u64,
            bw_peak_mbs: peak,
            bw_avg_mbs: avg,
            msg_rate_mpps: rate,
            delivered: None,
        }
    }

    /// One turn against any transport: keep `tx_depth` sends outstanding
    /// for the current size, then ask the sink's count and move on.
    /// [`Control::Exit`] once [`done`](Self::done).
    pub fn poll_transport<T: UdTransport + ?Sized>(&mut self, now: Instant, t: &mut T) -> Control {
        if self.done() {
            return Control::Exit;
        }
        let qp = match self.qp {
            Some(qp) => qp,
            None => {
                let mut qc = QpConfig::new(self.cfg.qkey);
                qc.max_send_wr = self.cfg.tx_depth.max(2) + 1;
                qc.max_recv_wr = 16;
                let opened = t.create_qp(&qc).and_then(|qp| {
                    post_recvs(t, qp, 16, PING_LEN)?;
                    Ok(qp)
                });
                match opened {
                    Ok(qp) => {
                        self.qp = Some(qp);
                        // Ask the sink's counters before the first size.
                        self.ask_stats(now, t, qp);
                        qp
                    }
                    Err(e) => {
                        self.error = Some(e);
                        return Control::Exit;
                    }
                }
            }
        };
        let mut cqes = std::mem::take(&mut self.cqes);
        let mut sink = None;
        while t.poll_cq(qp, now, 256, &mut cqes).unwrap_or(0) > 0 {
            for mut c in cqes.drain(..) {
                match c.opcode {
                    WcOpcode::Send if c.wr_id != u64::MAX => {
                        self.in_flight = self.in_flight.saturating_sub(1);
                        self.completed += 1;
                        if c.status == WcStatus::Success {
                            self.tx_nic = c.ts_source == TsSource::Nic;
                            self.tx_ts.push(c.timestamp);
                        }
                    }
                    WcOpcode::Send => {}
                    WcOpcode::Recv => {
                        if let Some(m) = Msg::parse(c.payload()) {
                            if m.kind == KIND_STATS && m.seq == self.stats_seq {
                                sink = Some(m.a);
                            }
                        }
                        repost(t, qp, &mut c);
                    }
                }
            }
        }
        self.cqes = cqes;
        match self.phase {
            BwPhase::AwaitStats { asked } => {
                if sink.is_some() || now >= asked + self.cfg.stats_timeout {
                    self.finish_size(sink);
                }
            }
            BwPhase::Sending => {
                let size = self.msg.len();
                while self.posted < self.cfg.iterations && self.in_flight < self.cfg.tx_depth {
                    let wr = SendWr {
                        wr_id: self.posted,
                        dest: self.cfg.dst,
                        remote_qkey: self.cfg.qkey,
                        imm: None,
                        solicited: false,
                        data: &self.msg,
                    };
                    match t.post_send(qp, &wr) {
                        Ok(()) => {
                            self.posted += 1;
                            self.in_flight += 1;
                            self.first_post.get_or_insert(now);
                        }
                        Err(Error::Ud(UdError::QueueFull)) => break,
                        Err(e) => {
                            self.error = Some(e);
                            return Control::Exit;
                        }
                    }
                }
                if self.completed >= self.cfg.iterations {
                    self.pending = Some(self.result(size));
                    self.ask_stats(now, t, qp);
                }
            }
        }
        if self.done() {
            Control::Exit
        } else {
            Control::Continue
        }
    }

    /// When the sweep next needs a turn: at once while sending, at the
    /// stats timeout while waiting for the sink's answer.
    pub fn next_wakeup(&self) -> Option<Instant> {
        match self.phase {
            _ if self.done() => None,
            BwPhase::AwaitStats { asked } if self.qp.is_some() => {
                Some(asked + self.cfg.stats_timeout)
            }
            _ => Some(Instant::ZERO),
        }
    }
}

impl App for UdBandwidth {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        self.poll_transport(now, &mut stack.ud())
    }
    fn poll_at(&self) -> Option<Instant> {
        self.next_wakeup()
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn pinger_waits_on_stamps_only_for_its_last_ping_once_answered() {
        let dst = UdAddr {
            ip: core::net::Ipv4Addr::new(10, 0, 0, 2),
            qpn: RESPONDER_QPN,
        };
        let mut p = UdPinger::new(UdPingerConfig::new(dst));
        let sent = Sent {
            posted: Instant::ZERO,
            tx_ts: None,
        };
        // Nothing answered yet (ARP may be pending): read frames at once.
        assert_eq!(p.rx_wait(), RxWait::Prompt);
        p.summary.transmitted = 1;
        p.outstanding.insert(1, sent);
        assert_eq!(p.rx_wait(), RxWait::Prompt);
        // Answered once: the last ping's pong may wait, stamped.
        p.outstanding.remove(&1);
        p.summary.received = 1;
        assert_eq!(p.rx_wait(), RxWait::Nothing);
        p.summary.transmitted = 2;
        p.outstanding.insert(2, sent);
        assert_eq!(p.rx_wait(), RxWait::Stamped);
        // Its pong lost, a later one answered: the lost one waits for nothing.
        p.summary.transmitted = 3;
        p.outstanding.insert(3, sent);
        p.outstanding.remove(&3);
        p.summary.received = 2;
        assert_eq!(p.rx_wait(), RxWait::Nothing);
    }

    #[test]
    fn msg_round_trip_and_percentiles() {
        let m = Msg {
            kind: KIND_PONG,
            seq: 9,
            a: 1,
            b: 2,
            c: 3,
        };
        let mut b = vec![0u8; 64];
        m.write(&mut b);
        assert_eq!(Msg::parse(&b), Some(m));
        assert_eq!(Msg::parse(&b[..39]), None);
        let mut s = UdPingSummary::default();
        for ms in 1..=100u64 {
            s.samples.push(ms * 1_000_000);
        }
        assert_eq!(s.percentile(0.5), Some(Duration::from_millis(50)));
        assert_eq!(s.percentile(0.99), Some(Duration::from_millis(99)));
        assert_eq!(s.percentile(1.0), Some(Duration::from_millis(100)));
        assert_eq!(sweep_sizes(1444), vec![64, 128, 256, 512, 1024, 1444]);
        assert_eq!(sweep_sizes(1024), vec![64, 128, 256, 512, 1024]);
    }
}
