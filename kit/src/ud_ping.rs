//! UD apps over any [`UdTransport`]: [`UdPinger`] (ping/pong with send and
//! receive completion timestamps, PingWeave-style statistics: the
//! [`PingEngine`] with [`UdProbe`]), [`UdResponder`] (answers pings, sinks
//! everything else, reports its sink counters; in
//! [`crate::ud_responder`]) and [`UdBandwidth`] (ib_send_bw-style
//! message-size sweep; in [`crate::ud_bandwidth`]).
//!
//! Each is an [`ustack::node::App`] for the stack's own RoCEv2 transport
//! and has a `poll_transport` that drives any other transport (ibverbs)
//! the same way.
//!
//! Message layout (big-endian), at least [`PING_LEN`] bytes:
//! `"UDPG" | kind (1 ping, 2 pong, 3 stats request, 4 stats reply) | 3 zero |
//! seq u64 | a u64 | b u64 | c u64 | filler`. A ping carries its post time in
//! `a`; a pong echoes seq and `a`, and carries the responder's receive
//! completion time in `b` and its processing delay (post of the pong minus
//! receive) in `c`. A stats reply carries the sink's messages in `a`, bytes
//! in `b`. Anything else is sink data.

use std::time::Duration;

use ustack::socket::ud::{
    Completion, DEFAULT_QKEY, QpConfig, QpHandle, SendWr, TsSource, UdAddr, UdError, UdTransport,
    WcOpcode, WcStatus,
};
use ustack::time::Instant;
use ustack::{Error, Stack};

use crate::ping_engine::{Heard, PingEngine, Probe, ProbeKind, Schedule, SendError, Sent};
use crate::ping_stats::{PingSummary, SummaryExtra};
use crate::ud_wire::{KIND_PING, KIND_PONG, Msg, ns, post_recvs, repost};

pub use crate::ping_engine::MAX_BURST;
pub use crate::ud_bandwidth::{BwResult, UdBandwidth, UdBandwidthConfig, sweep_sizes};
pub use crate::ud_responder::{MAX_ECHO_PEERS, ResponderStats, UdResponder};
pub use crate::ud_wire::PING_LEN;

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
    /// The traffic class of the pings (`QpConfig::traffic_class`: the IPv4
    /// TOS byte or IPv6 traffic class on the wire); 0 by default.
    pub traffic_class: u8,
}

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
            traffic_class: 0,
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

/// What a UD ping run reports beyond ping's totals
/// ([`PingSummary::extra`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UdExtra {
    /// Of `received`, the RTTs measured between two NIC completion
    /// timestamps; the others are on the poll loop's clock.
    pub nic_stamped: u64,
    /// RTT samples in nanoseconds (the first million).
    samples: Vec<u64>,
}

/// Most RTT samples kept for percentiles.
const MAX_SAMPLES: usize = 1 << 20;

impl SummaryExtra for UdExtra {
    /// Kept for percentiles, up to the first million.
    fn sample(&mut self, rtt: Duration) {
        if self.samples.len() < MAX_SAMPLES {
            self.samples.push(ns(rtt));
        }
    }
}

/// Totals of a UD ping run, with percentiles ([`errors`](PingSummary::errors):
/// sends that completed in error).
pub type UdPingSummary = PingSummary<UdExtra>;

impl PingSummary<UdExtra> {
    /// The `q` quantile (0.0..=1.0) of the RTTs, nearest rank.
    pub fn percentile(&self, q: f64) -> Option<Duration> {
        if self.extra.samples.is_empty() {
            return None;
        }
        let mut s = self.extra.samples.clone();
        s.sort_unstable();
        let rank = ((q.clamp(0.0, 1.0) * s.len() as f64).ceil() as usize).clamp(1, s.len());
        Some(Duration::from_nanos(s[rank - 1]))
    }
}

/// A pong as the probe heard it.
#[derive(Debug, Clone, Copy)]
pub struct UdReply {
    seq: u64,
    from: UdAddr,
    bytes: usize,
    /// The responder's processing delay, as it reported it.
    server_delay: Duration,
    /// The receive completion's timestamp, and its clock.
    at: Instant,
    ts_source: TsSource,
}

impl UdReply {
    /// The event for a front end; a duplicate's `rtt` and `server_delay`
    /// are zero.
    fn pong(&self, rtt: Duration, server_delay: Duration, ts_source: TsSource) -> UdPong {
        UdPong {
            seq: self.seq,
            from: self.from,
            bytes: self.bytes,
            rtt,
            server_delay,
            duplicate: false,
            ts_source,
        }
    }
}

/// Most completions taken from the CQ at once.
const CQ_BATCH: usize = 64;
/// Receive buffers kept posted.
const RECV_DEPTH: usize = 64;

/// UD SENDs to a responder over any [`UdTransport`]: the [`Probe`] of
/// [`UdPinger`]. A ping carries its post time; the pong echoes it with the
/// responder's receive time and processing delay (module docs).
#[derive(Debug)]
pub struct UdProbe {
    cfg: UdPingerConfig,
    qpn: u32,
    cqes: Vec<Completion>,
    msg: Vec<u8>,
}

impl ProbeKind for UdProbe {
    const SEQ_BITS: u32 = 64;
    type Handle = QpHandle;
    /// The send completion's timestamp and its clock.
    type Stamp = Option<(Instant, TsSource)>;
    type Reply = UdReply;
    type Event = UdPong;
    type Error = Error;
    type Extra = UdExtra;

    /// Round trip less the responder's processing delay, with both ends
    /// on one clock: the NIC's when it stamped both completions, else the
    /// loop's (the post time, and the receive completion's poll-loop stamp
    /// or `now`).
    fn answer(
        &self,
        now: Instant,
        sent: &Sent<Self::Stamp>,
        r: UdReply,
        extra: &mut UdExtra,
    ) -> (Option<Duration>, UdPong) {
        let (tx, rx, clock) = match sent.stamp {
            Some((tx, src)) if src == r.ts_source => (tx, r.at, src),
            _ if r.ts_source == TsSource::Poll => (sent.posted, r.at, TsSource::Poll),
            _ => (sent.posted, now, TsSource::Poll),
        };
        let rtt = rx
            .saturating_duration_since(tx)
            .saturating_sub(r.server_delay);
        if clock == TsSource::Nic {
            extra.nic_stamped += 1;
        }
        (Some(rtt), r.pong(rtt, r.server_delay, clock))
    }

    fn duplicate(&self, r: UdReply) -> UdPong {
        UdPong {
            duplicate: true,
            ..r.pong(Duration::ZERO, Duration::ZERO, r.ts_source)
        }
    }
}

/// On any transport, as a trait object: the engine's `poll_transport`
/// takes `&mut dyn UdTransport` (ibverbs, or a stack's `ud()`).
impl<'t> Probe<dyn UdTransport + 't> for UdProbe {
    fn open(&mut self, t: &mut (dyn UdTransport + 't)) -> Result<QpHandle, Error> {
        let mut qc = QpConfig::new(self.cfg.qkey);
        qc.max_recv_wr = RECV_DEPTH;
        qc.max_send_wr = 256;
        qc.traffic_class = self.cfg.traffic_class;
        let qp = t.create_qp(&qc)?;
        self.qpn = t.qp_num(qp)?;
        post_recvs(t, qp, RECV_DEPTH, t.max_msg_size().max(self.cfg.size))?;
        Ok(qp)
    }

    fn send(
        &mut self,
        now: Instant,
        t: &mut (dyn UdTransport + 't),
        qp: QpHandle,
        seq: u64,
    ) -> Result<(), SendError<Error>> {
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
        t.post_send(qp, &wr).map_err(|e| match e {
            Error::Ud(UdError::QueueFull) => SendError::Busy,
            e => SendError::Failed(e),
        })
    }

    fn collect(
        &mut self,
        now: Instant,
        t: &mut (dyn UdTransport + 't),
        qp: QpHandle,
        heard: &mut Vec<Heard<Self>>,
    ) {
        let mut cqes = std::mem::take(&mut self.cqes);
        while t.poll_cq(qp, now, CQ_BATCH, &mut cqes).unwrap_or(0) > 0 {
            for mut c in cqes.drain(..) {
                heard.extend(heard_of(&c));
                if c.opcode == WcOpcode::Recv {
                    repost(t, qp, &mut c);
                }
            }
        }
        self.cqes = cqes;
    }
}

/// On a stack, as an in-loop app: through the stack's own RoCEv2 `ud()`.
impl Probe<Stack> for UdProbe {
    fn open(&mut self, stack: &mut Stack) -> Result<QpHandle, Error> {
        Probe::<dyn UdTransport>::open(self, &mut stack.ud())
    }

    fn send(
        &mut self,
        now: Instant,
        stack: &mut Stack,
        qp: QpHandle,
        seq: u64,
    ) -> Result<(), SendError<Error>> {
        Probe::<dyn UdTransport>::send(self, now, &mut stack.ud(), qp, seq)
    }

    fn collect(
        &mut self,
        now: Instant,
        stack: &mut Stack,
        qp: QpHandle,
        heard: &mut Vec<Heard<Self>>,
    ) {
        Probe::<dyn UdTransport>::collect(self, now, &mut stack.ud(), qp, heard);
    }
}

/// What a completion tells of a ping: a send's stamp or failure (by its
/// `wr_id`, the sequence number), or a pong.
fn heard_of(c: &Completion) -> Option<Heard<UdProbe>> {
    let seq = c.wr_id;
    match (c.opcode, c.status) {
        (WcOpcode::Send, WcStatus::Success) => Some(Heard::Stamped {
            seq,
            stamp: Some((c.timestamp, c.ts_source)),
        }),
        (WcOpcode::Send, _) => Some(Heard::Failed { seq, event: None }),
        (WcOpcode::Recv, WcStatus::Success) => {
            let m = Msg::parse(c.payload()).filter(|m| m.kind == KIND_PONG)?;
            let reply = UdReply {
                seq: m.seq,
                from: c.src?,
                bytes: c.payload().len(),
                server_delay: Duration::from_nanos(m.c),
                at: c.timestamp,
                ts_source: c.ts_source,
            };
            Some(Heard::Reply { seq: m.seq, reply })
        }
        (WcOpcode::Recv, _) => None,
    }
}

/// An app that pings one UD peer (the engine's `poll_transport` takes any
/// [`UdTransport`]).
pub type UdPinger = PingEngine<UdProbe>;

impl UdPinger {
    /// A pinger that creates its QP, posts its receive buffers and sends
    /// its first ping on its first turn; `cfg.size` is raised to
    /// [`PING_LEN`] if smaller.
    pub fn new(mut cfg: UdPingerConfig) -> Self {
        cfg.size = cfg.size.max(PING_LEN);
        let sched = Schedule {
            count: cfg.count,
            interval: cfg.interval,
            timeout: cfg.timeout,
            batch: cfg.batch,
        };
        let probe = UdProbe {
            msg: vec![0; cfg.size],
            cfg,
            qpn: 0,
            cqes: Vec::new(),
        };
        PingEngine::with_probe(probe, sched)
    }

    /// What this pinger pings and how.
    pub fn config(&self) -> &UdPingerConfig {
        &self.probe().cfg
    }
    /// Totals so far.
    pub fn summary(&self) -> &UdPingSummary {
        self.totals()
    }
    /// The error that stopped the pinger (QP creation, a failed post), if any.
    pub fn error(&self) -> Option<&Error> {
        self.failure()
    }
    /// Our QP number, once created.
    pub fn local_qpn(&self) -> Option<u32> {
        self.handle().map(|_| self.probe().qpn)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut s = UdPingSummary::default();
        assert_eq!(s.percentile(0.5), None);
        for ms in (1..=100u64).rev() {
            s.record(Duration::from_millis(ms));
        }
        assert_eq!(s.percentile(0.5), Some(Duration::from_millis(50)));
        assert_eq!(s.percentile(0.99), Some(Duration::from_millis(99)));
        assert_eq!(s.percentile(1.0), Some(Duration::from_millis(100)));
        assert_eq!((s.received, s.rtt.count), (100, 100));
    }
}
