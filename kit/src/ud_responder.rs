//! [`UdResponder`]: answers UD pings on a well-known QPN (QPN 2 on the
//! stack's own transport), answers the bandwidth sweep's requests for its
//! counters, sinks everything else, and echoes peers that asked for it
//! through an address exchange. Messages as [`crate::ud_ping`] lays them
//! out.

use std::collections::VecDeque;

use ustack::Error;
use ustack::node::{App, Control};
use ustack::socket::ud::{
    Completion, DEFAULT_QKEY, QpConfig, QpHandle, RESPONDER_QPN, SendWr, UdAddr, UdTransport,
    WcOpcode, WcStatus,
};
use ustack::stack::Stack;
use ustack::time::Instant;

use crate::ud_wire::{
    KIND_PING, KIND_PONG, KIND_STATS, KIND_STATS_REQ, Msg, PING_LEN, ns, post_recvs, repost,
};

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
