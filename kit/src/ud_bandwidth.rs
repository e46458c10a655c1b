//! [`UdBandwidth`]: an ib_send_bw-style message-size sweep to a
//! [`crate::ud_responder::UdResponder`] acting as the sink, measured from
//! send completion timestamps; after each size it asks the sink how many
//! messages arrived.

use std::time::Duration;

use ustack::Error;
use ustack::node::{App, Control};
use ustack::socket::ud::{
    Completion, DEFAULT_QKEY, QpConfig, QpHandle, SendWr, TsSource, UdAddr, UdError, UdTransport,
    WcOpcode, WcStatus,
};
use ustack::stack::Stack;
use ustack::time::Instant;

use crate::ud_wire::{KIND_STATS, KIND_STATS_REQ, Msg, PING_LEN, post_recvs, repost};

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
    /// The sink (a [`crate::ud_responder::UdResponder`]) to send to.
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
    fn sweep_sizes_double_up_to_the_largest() {
        assert_eq!(sweep_sizes(1444), vec![64, 128, 256, 512, 1024, 1444]);
        assert_eq!(sweep_sizes(1024), vec![64, 128, 256, 512, 1024]);
    }
}
