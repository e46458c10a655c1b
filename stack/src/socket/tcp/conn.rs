//! One TCP connection (RFC 9293): the state machine, sans-IO.
//!
//! Input: [`TcpConn::on_segment`] with a parsed [`Segment`] and `now`.
//! Output: [`TcpConn::poll_transmit`] returns the next segment to send as an
//! [`Outgoing`] header plus a range of the send buffer, which the caller
//! copies straight into the device buffer with [`TcpConn::copy_payload`].
//! Timers: [`TcpConn::poll_at`] and [`TcpConn::on_timer`].

use core::net::SocketAddrV4;
use std::time::Duration;

use serde::Serialize;

use super::buffer::{RecvBuffer, SendBuffer};
use super::cc::{CongestionControl, new_controller};
use super::config::MAX_WSCALE;
pub use super::config::{KeepAlive, TcpConfig};
use super::rtt::RttEstimator;
use super::scoreboard::Scoreboard;
pub use super::segment::{Header, Outgoing, Segment};
use super::seq::Seq;
use crate::error::ConnError;
pub use crate::stats::ConnStats;
use crate::time::Instant;

/// RFC 9293 connection states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum State {
    /// No connection: never opened, or ended (closed, reset, timed out).
    Closed,
    /// Waiting for a SYN (listeners live in the table; a connection is
    /// never in this state itself).
    Listen,
    /// Active open: our SYN is sent, waiting for the SYN-ACK.
    SynSent,
    /// Passive open (or simultaneous open): SYN received and SYN-ACK sent,
    /// waiting for the ACK that completes the handshake.
    SynReceived,
    /// Handshake done; data flows both ways.
    Established,
    /// We closed: our FIN is sent (or queued behind data), not yet acknowledged.
    FinWait1,
    /// Our FIN is acknowledged; waiting for the peer's FIN.
    FinWait2,
    /// The peer closed (its FIN arrived); we may still send until the app closes.
    CloseWait,
    /// Both sides closed at once: the peer's FIN arrived before ours was acknowledged.
    Closing,
    /// The peer closed first and we have sent our FIN; waiting for its ACK.
    LastAck,
    /// Both FINs exchanged; the connection lingers for 2 MSL
    /// ([`TcpConfig::time_wait`]) to absorb late segments.
    TimeWait,
}

impl State {
    /// Whether the three-way handshake has completed.
    pub fn synchronized(self) -> bool {
        !matches!(
            self,
            State::Closed | State::Listen | State::SynSent | State::SynReceived
        )
    }
}

impl ConnStats {
    /// Add another connection's counters to these.
    pub fn add(&mut self, o: &ConnStats) {
        self.segs_in += o.segs_in;
        self.segs_out += o.segs_out;
        self.bytes_in += o.bytes_in;
        self.bytes_out += o.bytes_out;
        self.retransmits += o.retransmits;
        self.fast_retransmits += o.fast_retransmits;
        self.timeouts += o.timeouts;
        self.dup_acks += o.dup_acks;
        self.zero_window_probes += o.zero_window_probes;
        self.keepalive_probes += o.keepalive_probes;
        self.challenge_acks += o.challenge_acks;
        self.ooo_dropped += o.ooo_dropped;
        self.bad_segments += o.bad_segments;
        self.pmtu_reductions += o.pmtu_reductions;
    }
}

/// A snapshot of one connection for telemetry and tests.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConnInfo {
    /// Our address and port.
    pub local: SocketAddrV4,
    /// The peer's address and port.
    pub remote: SocketAddrV4,
    /// RFC 9293 state.
    pub state: State,
    /// Congestion window, bytes.
    pub cwnd: usize,
    /// Slow-start threshold, bytes.
    pub ssthresh: usize,
    /// The peer's advertised receive window (scaled), bytes.
    pub snd_wnd: usize,
    /// Our receive window: free receive-buffer space, bytes.
    pub rcv_wnd: usize,
    /// Smoothed RTT (RFC 6298), microseconds; `None` before the first sample.
    pub srtt_us: Option<u64>,
    /// RTT variation (RFC 6298), microseconds; `None` before the first sample.
    pub rttvar_us: Option<u64>,
    /// Current retransmission timeout including backoff, microseconds.
    pub rto_us: u64,
    /// Bytes sent and not yet acknowledged.
    pub in_flight: usize,
    /// Bytes in the send buffer (unacknowledged plus not yet sent).
    pub send_queued: usize,
    /// Bytes received in order and not yet read by the app.
    pub recv_queued: usize,
    /// Bytes held out of order.
    pub ooo_bytes: usize,
    /// MSS for segments we send, bytes (the smaller of ours and the
    /// peer's, lowered by path MTU discovery).
    pub mss: usize,
    /// Congestion control in use (`"newreno"` or `"cubic"`).
    pub congestion: &'static str,
    /// The connection's counters.
    pub stats: ConnStats,
}

const DUP_THRESH: usize = 3;
/// RFC 9293: the default MSS when the peer sends none.
const DEFAULT_MSS: usize = 536;
/// Least persist (zero-window probe) interval.
const PERSIST_MIN: Duration = Duration::from_millis(200);
const PERSIST_MAX: Duration = Duration::from_secs(60);

/// One TCP connection.
#[derive(Debug)]
pub struct TcpConn {
    cfg: TcpConfig,
    state: State,
    local: SocketAddrV4,
    remote: SocketAddrV4,
    error: Option<ConnError>,

    // Send side.
    iss: Seq,
    snd_una: Seq,
    snd_nxt: Seq,
    /// Highest sequence number sent (snd_nxt may go back after a timeout).
    snd_max: Seq,
    snd_wnd: usize,
    max_snd_wnd: usize,
    snd_wl1: Seq,
    snd_wl2: Seq,
    snd_wscale: u8,
    /// Sequence number of the first byte in `sndbuf`.
    data_start: Seq,
    sndbuf: SendBuffer,
    /// The app has closed its sending side: a FIN follows the data.
    fin_queued: bool,
    /// TCP_CORK: hold partial segments of new data.
    corked: bool,
    /// MSS for segments we send.
    mss: usize,
    /// Largest IP packet the port cuts into frames (TSO); 0 without.
    tso_max: usize,

    // Receive side.
    irs: Seq,
    rcv_nxt: Seq,
    /// Right edge of the window we last advertised.
    rcv_adv: Seq,
    rcv_wscale: u8,
    rcvbuf: RecvBuffer,
    /// Peer's FIN, once seen (possibly ahead of rcv_nxt).
    peer_fin: Option<Seq>,
    /// Receive-window autotuning ([`TcpConn::autotune`]).
    tune: RcvTune,

    // Options in use.
    ts_enabled: bool,
    ts_recent: u32,
    ts_offset: u32,
    last_ack_sent: Seq,
    sack_enabled: bool,
    scoreboard: Scoreboard,

    // Loss recovery and congestion control.
    cc: Box<dyn CongestionControl>,
    rtt: RttEstimator,
    /// Segment being timed for an RTT sample (Karn: cleared on retransmit).
    rtt_probe: Option<(Seq, Instant)>,
    dupacks: usize,
    in_recovery: bool,
    recovery_point: Seq,
    high_rxt: Seq,
    retries: u32,

    // Timers.
    rto_at: Option<Instant>,
    persist_at: Option<Instant>,
    persist_backoff: u32,
    delack_at: Option<Instant>,
    time_wait_at: Option<Instant>,
    /// When an orphaned connection in FIN-WAIT-2 gives up on the peer's FIN.
    fin_wait2_at: Option<Instant>,
    /// The app closed the connection entirely ([`TcpConn::release`]): it
    /// reads nothing more, so new data is answered with RST.
    orphaned: bool,
    /// Keepalive, when the app turned it on.
    keepalive: Option<KeepAlive>,
    /// When the peer last sent us a segment.
    last_rx: Instant,
    /// Keepalive probes sent since then, and when the last left.
    ka_probes: u32,
    ka_last_probe: Instant,
    /// A keepalive probe is owed.
    ka_pending: bool,
    /// `TCP_USER_TIMEOUT` (RFC 5482): how long sent data may stay
    /// unacknowledged before the connection fails with `TimedOut`.
    user_timeout: Option<Duration>,
    /// Since when the oldest unacknowledged data has waited (None: nothing
    /// in flight).
    unacked_since: Option<Instant>,

    // What to send next.
    ack_now: bool,
    /// Duplicate ACKs owed: one per out-of-order segment (RFC 5681 4.2),
    /// even when a burst of them is processed before we transmit.
    dupacks_owed: u32,
    /// Full-size segments received since our last ACK (ACK every second one).
    unacked_segs: u32,
    send_syn: bool,
    rst_pending: Option<(Seq, Option<Seq>)>,
    probe_pending: bool,
    challenge_tokens: u32,
    challenge_second: u64,
    /// Reused for SACK blocks so building an ACK never allocates.
    sack_scratch: Vec<(usize, usize)>,

    stats: ConnStats,
}

/// The receiver's side of window autotuning, after Linux's
/// `tcp_rcv_rtt_measure` and `tcp_rcv_space_adjust`: the receiver's RTT is
/// the time the peer takes to fill the window we advertised, and once per
/// such RTT the bytes the app read in it are compared with the last
/// measure; when they grow, the buffer should hold twice that (the window
/// must stay ahead of the sender's congestion window).
#[derive(Debug, Default)]
struct RcvTune {
    /// The right edge we advertised when timing started, and when.
    rtt_mark: Option<(Seq, Instant)>,
    /// Smallest receiver RTT measured.
    rtt: Option<Duration>,
    /// Bytes the app has read in all.
    read: u64,
    /// `read` and the time at the start of the current measure.
    space_mark: (u64, Instant),
    /// Most bytes the app read in one receiver RTT.
    space: u64,
    /// A larger buffer asked of the stack (granted by [`TcpConn::grow_rcvbuf`]).
    want: Option<usize>,
}

/// RFC 9293 3.10.7.4, the four cases of segment acceptability.
pub fn segment_acceptable(seq: Seq, len: usize, rcv_nxt: Seq, wnd: usize) -> bool {
    let start_ok = seq.in_range(rcv_nxt, rcv_nxt + wnd);
    match (len, wnd) {
        (0, 0) => seq == rcv_nxt,
        (0, _) => start_ok,
        (_, 0) => false,
        _ => start_ok || (seq + (len - 1)).in_range(rcv_nxt, rcv_nxt + wnd),
    }
}

/// The offset of a connection's TSval clock until the table sets the one
/// keyed by its 4-tuple ([`TcpConn::set_ts_offset`]): derived from the ISN.
fn ts_offset(iss: Seq) -> u32 {
    iss.0.rotate_left(13)
}

impl TcpConn {
    fn new(
        cfg: TcpConfig,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        iss: Seq,
        state: State,
    ) -> Self {
        let mss = cfg.mss.max(64);
        TcpConn {
            cc: new_controller(cfg.congestion, mss),
            rtt: RttEstimator::new(cfg.rtt.clone()),
            sndbuf: SendBuffer::new(cfg.send_buffer),
            rcvbuf: RecvBuffer::new(cfg.recv_buffer, cfg.max_ooo_ranges),
            rcv_wscale: cfg.rcv_wscale(),
            state,
            local,
            remote,
            error: None,
            iss,
            snd_una: iss,
            snd_nxt: iss,
            snd_max: iss,
            snd_wnd: 0,
            max_snd_wnd: 0,
            snd_wl1: Seq(0),
            snd_wl2: Seq(0),
            snd_wscale: 0,
            data_start: iss + 1,
            fin_queued: false,
            corked: false,
            mss,
            tso_max: 0,
            irs: Seq(0),
            rcv_nxt: Seq(0),
            rcv_adv: Seq(0),
            peer_fin: None,
            tune: RcvTune::default(),
            ts_enabled: false,
            ts_recent: 0,
            ts_offset: ts_offset(iss),
            last_ack_sent: Seq(0),
            sack_enabled: false,
            scoreboard: Scoreboard::new(),
            rtt_probe: None,
            dupacks: 0,
            in_recovery: false,
            recovery_point: iss,
            high_rxt: iss,
            retries: 0,
            rto_at: None,
            persist_at: None,
            persist_backoff: 0,
            delack_at: None,
            time_wait_at: None,
            fin_wait2_at: None,
            orphaned: false,
            keepalive: None,
            last_rx: Instant::ZERO,
            ka_probes: 0,
            ka_last_probe: Instant::ZERO,
            ka_pending: false,
            user_timeout: None,
            unacked_since: None,
            ack_now: false,
            dupacks_owed: 0,
            unacked_segs: 0,
            send_syn: true,
            rst_pending: None,
            probe_pending: false,
            challenge_tokens: cfg.challenge_ack_limit,
            challenge_second: 0,
            sack_scratch: Vec::with_capacity(3),
            stats: ConnStats::default(),
            cfg,
        }
    }

    /// Active open: a SYN goes out on the next poll.
    pub fn connect(cfg: TcpConfig, local: SocketAddrV4, remote: SocketAddrV4, iss: Seq) -> Self {
        Self::new(cfg, local, remote, iss, State::SynSent)
    }

    /// Passive open from a listener that received `syn`: a SYN-ACK goes out on the next poll.
    pub fn accept(
        cfg: TcpConfig,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        iss: Seq,
        syn: &Segment<'_>,
    ) -> Self {
        let mut c = Self::new(cfg, local, remote, iss, State::SynReceived);
        c.take_syn_options(syn);
        c.irs = syn.hdr.seq;
        c.rcv_nxt = syn.hdr.seq + 1;
        c.rcv_adv = c.rcv_nxt;
        c.snd_wnd = usize::from(syn.hdr.window);
        c.max_snd_wnd = c.snd_wnd;
        c.snd_wl1 = syn.hdr.seq;
        c
    }

    fn take_syn_options(&mut self, syn: &Segment<'_>) {
        self.mss = self
            .cfg
            .mss
            .min(syn.hdr.mss.map_or(DEFAULT_MSS, usize::from))
            .max(64);
        self.cc.set_mss(self.mss);
        match syn.hdr.wscale {
            Some(s) if self.cfg.window_scaling => self.snd_wscale = s.min(MAX_WSCALE),
            _ => {
                self.snd_wscale = 0;
                self.rcv_wscale = 0;
            }
        }
        self.sack_enabled = self.cfg.sack && syn.hdr.sack_permitted;
        if let (true, Some((tsval, _))) = (self.cfg.timestamps, syn.hdr.timestamp) {
            self.ts_enabled = true;
            self.ts_recent = tsval;
        } else {
            self.ts_enabled = false;
        }
    }

    /// The final ACK of a SYN-cookie handshake arrived: the connection is
    /// established without ever having been in SYN-RECEIVED here.
    pub fn cookie_established(&mut self) {
        self.send_syn = false;
        self.snd_nxt = self.iss + 1;
        self.snd_max = self.snd_nxt;
    }

    // ------------------------------------------------------------ accessors

    /// RFC 9293 state.
    pub fn state(&self) -> State {
        self.state
    }
    /// Our address and port.
    pub fn local(&self) -> SocketAddrV4 {
        self.local
    }
    /// The peer's address and port.
    pub fn remote(&self) -> SocketAddrV4 {
        self.remote
    }
    /// Why the connection ended abnormally, once it has.
    pub fn error(&self) -> Option<ConnError> {
        self.error
    }
    /// The connection's counters.
    pub fn stats(&self) -> &ConnStats {
        &self.stats
    }
    /// Congestion window, bytes.
    pub fn cwnd(&self) -> usize {
        self.cc.cwnd()
    }
    /// Slow-start threshold, bytes.
    pub fn ssthresh(&self) -> usize {
        self.cc.ssthresh()
    }
    /// The peer's advertised receive window (scaled), bytes.
    pub fn snd_wnd(&self) -> usize {
        self.snd_wnd
    }
    /// Let new data leave in TCP segments of up to `max` bytes of IP
    /// packet that are cut into frames (by the port: TSO; by the stack
    /// when the port cannot: GSO); 0 turns it off.
    pub fn set_tso_max(&mut self, max: usize) {
        self.tso_max = max;
    }

    /// MSS for segments we send, bytes (payload per frame, before options).
    pub fn mss(&self) -> usize {
        self.mss
    }
    /// Bytes one connection with `cfg` occupies: the struct, its two rings
    /// and its congestion controller (the demux entry and timer slot aside).
    pub fn memory_estimate(cfg: &TcpConfig) -> usize {
        std::mem::size_of::<TcpConn>() + cfg.send_buffer + cfg.recv_buffer + 128
    }

    /// Bytes in flight (sent, not yet acknowledged).
    pub fn in_flight(&self) -> usize {
        self.snd_max.since(self.snd_una)
    }
    /// A snapshot of state, windows, RTT and counters (for telemetry).
    pub fn info(&self) -> ConnInfo {
        ConnInfo {
            local: self.local,
            remote: self.remote,
            state: self.state,
            cwnd: self.cc.cwnd(),
            ssthresh: self.cc.ssthresh(),
            snd_wnd: self.snd_wnd,
            rcv_wnd: self.rcvbuf.window(),
            srtt_us: self.rtt.srtt().map(|d| d.as_micros() as u64),
            rttvar_us: self.rtt.rttvar().map(|d| d.as_micros() as u64),
            rto_us: self.rtt.rto().as_micros() as u64,
            in_flight: self.in_flight(),
            send_queued: self.sndbuf.len(),
            recv_queued: self.rcvbuf.readable(),
            ooo_bytes: self.rcvbuf.ooo_bytes(),
            mss: self.mss,
            congestion: self.cc.name(),
            stats: self.stats.clone(),
        }
    }

    // ------------------------------------------------------------- app side

    /// Out-of-order bytes held.
    pub fn ooo_bytes(&self) -> usize {
        self.rcvbuf.ooo_bytes()
    }

    /// Drop out-of-order data under memory pressure (the peer resends it).
    pub fn drop_ooo(&mut self) -> usize {
        let n = self.rcvbuf.drop_ooo();
        if n > 0 {
            self.stats.ooo_dropped += 1;
        }
        n
    }

    /// Bytes the app can read now.
    pub fn recv_available(&self) -> usize {
        self.rcvbuf.readable()
    }

    /// Whether the peer has closed its side and every byte was read.
    pub fn recv_finished(&self) -> bool {
        self.peer_fin.is_some_and(|f| self.rcv_nxt.diff(f) > 0) && self.rcvbuf.readable() == 0
    }

    /// Copy received bytes out without consuming them (`MSG_PEEK`).
    pub fn peek(&self, dst: &mut [u8]) -> usize {
        self.rcvbuf.peek(dst)
    }

    /// Read received bytes. Opening the window may trigger a window update.
    pub fn recv(&mut self, dst: &mut [u8]) -> usize {
        let n = self.rcvbuf.read(dst);
        self.after_read(n);
        n
    }

    /// Zero-copy read: `f` sees received bytes in place (those that lie in
    /// one piece of the ring; call again for the rest) and returns how many
    /// it consumed, with a value of its own. As [`recv`](Self::recv) for
    /// the window.
    pub fn recv_with<R>(&mut self, f: impl FnOnce(&[u8]) -> (usize, R)) -> (usize, R) {
        let (n, r) = self.rcvbuf.read_with(f);
        self.after_read(n);
        (n, r)
    }

    /// The app took `n` bytes: autotuning's count, and a window update
    /// when the opening is worth one.
    fn after_read(&mut self, n: usize) {
        self.tune.read += n as u64;
        if n > 0 && self.state.synchronized() {
            let advertised = self.rcv_adv.since(self.rcv_nxt);
            let could = self.advertisable_window();
            // Receiver SWS avoidance: announce the opening only when it is
            // worth a segment and the peer's view is less than half of it.
            if advertised < could / 2
                && could - advertised >= (self.rcvbuf.capacity() / 2).min(self.mss)
            {
                self.ack_now = true;
            }
        }
    }

    /// Bytes the app can write now.
    pub fn send_capacity(&self) -> usize {
        if self.fin_queued
            || !matches!(
                self.state,
                State::SynSent | State::SynReceived | State::Established | State::CloseWait
            )
        {
            return 0;
        }
        self.sndbuf.free()
    }

    /// Nagle's algorithm on or off for this connection (off is TCP_NODELAY).
    pub fn set_nagle(&mut self, on: bool) {
        self.cfg.nagle = on;
    }

    /// Whether Nagle's algorithm is on.
    pub fn nagle(&self) -> bool {
        self.cfg.nagle
    }

    /// TCP_CORK: while set, only full-sized segments of new data leave (a
    /// FIN, or uncorking, sends the rest).
    pub fn set_cork(&mut self, on: bool) {
        self.corked = on;
    }

    /// Whether the connection is corked.
    pub fn corked(&self) -> bool {
        self.corked
    }

    /// Free send space at which a writer that found the buffer full is told
    /// it may write again: a quarter of the buffer, at most 64 KiB.
    pub fn send_low_water(&self) -> usize {
        (self.sndbuf.capacity() / 4).clamp(1, 64 << 10)
    }

    /// Queue bytes to send; returns how many were taken.
    pub fn send(&mut self, data: &[u8]) -> usize {
        if self.send_capacity() == 0 {
            return 0;
        }
        self.sndbuf.write(data)
    }

    /// Zero-copy send: `f` writes into the send ring in place (the free
    /// space that lies in one piece; empty when nothing may be sent now)
    /// and returns how many bytes it wrote, with a value of its own.
    pub fn send_with<R>(&mut self, f: impl FnOnce(&mut [u8]) -> (usize, R)) -> (usize, R) {
        if self.send_capacity() == 0 {
            return f(&mut []);
        }
        self.sndbuf.write_with(f)
    }

    /// Bytes written and not yet acknowledged.
    pub fn send_queued(&self) -> usize {
        self.sndbuf.len()
    }

    /// Close the sending side (FIN after queued data).
    pub fn close(&mut self) {
        match self.state {
            // Nothing was sent yet: there is nobody to say goodbye to.
            State::SynSent if self.sndbuf.is_empty() => {
                self.state = State::Closed;
                self.clear_timers();
            }
            // The FIN (after the queued data) waits for the handshake to finish.
            State::SynSent | State::SynReceived => self.fin_queued = true,
            State::Established => {
                self.fin_queued = true;
                self.state = State::FinWait1;
            }
            State::CloseWait => {
                self.fin_queued = true;
                self.state = State::LastAck;
            }
            _ => {}
        }
    }

    /// The app closed the connection entirely (not a half-close): it will
    /// read nothing more. RFC 1122 4.2.2.13: data still unread, or data that
    /// arrives from now on, is lost, so the connection is reset to say so
    /// (as Linux does); otherwise it closes as [`close`](Self::close) does,
    /// and if the peer never sends its FIN, FIN-WAIT-2 ends after
    /// `fin_wait2_timeout` with a RST.
    pub fn release(&mut self, now: Instant) {
        self.orphaned = true;
        if self.rcvbuf.readable() > 0 && self.state.synchronized() {
            self.reset_orphan(None);
            return;
        }
        self.close();
        self.arm_fin_wait2(now);
    }

    /// Reset an orphaned connection that lost data; `ack` is the offending
    /// segment's acknowledgment (the peer's next expected sequence number).
    fn reset_orphan(&mut self, ack: Option<Seq>) {
        self.rst_pending = Some((ack.unwrap_or(self.snd_nxt), Some(self.rcv_nxt)));
        self.error = Some(ConnError::Aborted);
        self.state = State::Closed;
        self.clear_timers();
    }

    fn arm_fin_wait2(&mut self, now: Instant) {
        if self.orphaned && self.state == State::FinWait2 && self.fin_wait2_at.is_none() {
            self.fin_wait2_at = Some(now + self.cfg.fin_wait2_timeout);
        }
    }

    /// Abort: send RST (if synchronized) and close at once.
    pub fn abort(&mut self) {
        if self.state.synchronized() || self.state == State::SynReceived {
            self.rst_pending = Some((self.snd_nxt, None));
        }
        self.error = Some(ConnError::Aborted);
        self.state = State::Closed;
    }

    /// Whether the connection can be forgotten (closed and nothing left to send).
    pub fn is_finished(&self) -> bool {
        self.state == State::Closed && self.rst_pending.is_none()
    }

    /// In TIME-WAIT with nothing owed to the peer: what the small record
    /// that replaces the connection keeps ([`super::time_wait`]); the
    /// record expires when the connection's 2 MSL would have.
    pub(crate) fn time_wait_record(&self, now: Instant) -> Option<super::time_wait::TimeWait> {
        if self.state != State::TimeWait || self.ack_now || self.rst_pending.is_some() {
            return None;
        }
        let window = self.rcv_adv.since(self.rcv_nxt) >> self.rcv_wscale;
        Some(super::time_wait::TimeWait {
            snd_nxt: self.snd_nxt,
            rcv_nxt: self.rcv_nxt,
            window: u16::try_from(window).unwrap_or(u16::MAX),
            ts: self.ts_enabled.then_some((self.ts_offset, self.ts_recent)),
            expires: self.time_wait_at.unwrap_or(now + self.cfg.time_wait),
        })
    }

    // ------------------------------------------------------------- windows

    /// Receive window we could advertise now: the buffer's free space less
    /// a reserve for [`window_to_advertise`]'s rounding up, which moves the
    /// edge on by up to a window-scale unit per ACK while the window
    /// closes (never shrinking it): a sixteenth of the ring, at most 64
    /// units, at least one. Past the reserve (a very long fill with no
    /// read), bytes the ring cannot take are dropped and resent, as Linux
    /// does, rather than the window shrunk.
    ///
    /// [`window_to_advertise`]: Self::window_to_advertise
    fn advertisable_window(&self) -> usize {
        let max = usize::from(u16::MAX) << self.rcv_wscale;
        let reserve = if self.rcv_wscale == 0 {
            0
        } else {
            (self.rcvbuf.capacity() / 16)
                .min(64 << self.rcv_wscale)
                .max((1 << self.rcv_wscale) - 1)
        };
        self.rcvbuf.window().saturating_sub(reserve).min(max)
    }

    /// The window field for an outgoing segment; moves `rcv_adv` forward only
    /// and only by useful amounts (SWS avoidance), and does not shrink the
    /// window (RFC 9293 3.8.6): the field is the distance to `rcv_adv`
    /// rounded up to a whole window-scale unit, since rounding down would
    /// move the right edge the peer sees to the left whenever `rcv_nxt`
    /// advances by other than whole units. The edge so announced becomes
    /// `rcv_adv` (as Linux does; RFC 7323 appendix F describes the effect),
    /// within the ring's free space.
    fn window_to_advertise(&mut self) -> u16 {
        let new_edge = self.rcv_nxt + self.advertisable_window();
        let grow = new_edge.since(self.rcv_adv);
        if self.rcv_adv.diff(self.rcv_nxt) < 0 || grow >= (self.rcvbuf.capacity() / 2).min(self.mss)
        {
            self.rcv_adv = new_edge;
        }
        let edge = self.rcv_adv.since(self.rcv_nxt);
        let field = edge
            .div_ceil(1 << self.rcv_wscale)
            .min(usize::from(u16::MAX));
        self.rcv_adv = self.rcv_nxt + (field << self.rcv_wscale);
        field as u16
    }

    /// TCP option bytes a data segment carries now (timestamps, SACK
    /// blocks), padded to 4 as smoltcp emits them. The MSS excludes options
    /// (RFC 6691), so payloads shrink by this much.
    fn option_overhead(&self) -> usize {
        let mut n = if self.ts_enabled { 10 } else { 0 };
        if self.sack_enabled && self.rcvbuf.ooo_bytes() > 0 {
            n += 2 + 8 * self.rcvbuf.ooo_ranges().min(3);
        }
        n.div_ceil(4) * 4
    }

    /// Largest payload of a segment sent now.
    fn max_payload(&self) -> usize {
        self.mss.saturating_sub(self.option_overhead()).max(1)
    }

    fn tsval(&self, now: Instant) -> u32 {
        (now.as_millis() as u32).wrapping_add(self.ts_offset)
    }

    /// The TSval a connection whose timestamp clock has `offset` sends at
    /// `now` (milliseconds plus the offset).
    pub(crate) fn tsval_at(now: Instant, offset: u32) -> u32 {
        (now.as_millis() as u32).wrapping_add(offset)
    }

    /// Set the offset of the connection's timestamp clock before its first
    /// segment: the table keys it by the 4-tuple (as Linux does), so every
    /// incarnation of a 4-tuple counts on from the last one's TSvals and a
    /// peer holding the last in TIME-WAIT takes the new SYN (RFC 6191)
    /// instead of answering it as an old duplicate.
    pub(crate) fn set_ts_offset(&mut self, offset: u32) {
        self.ts_offset = offset;
    }

    // -------------------------------------------------------------- input

    /// Process one segment addressed to this connection.
    pub fn on_segment(&mut self, now: Instant, seg: &Segment<'_>) {
        self.stats.segs_in += 1;
        // The peer is alive (keepalive counts idle time from here).
        self.last_rx = now;
        self.ka_probes = 0;
        match self.state {
            State::Closed | State::Listen => {}
            State::SynSent => self.on_segment_syn_sent(now, seg),
            _ => self.on_segment_synchronized(now, seg),
        }
    }

    fn on_segment_syn_sent(&mut self, now: Instant, seg: &Segment<'_>) {
        if let Some(ack) = seg.hdr.ack {
            if ack.diff(self.iss) <= 0 || ack.diff(self.snd_max) > 0 {
                if !seg.hdr.rst {
                    self.rst_pending = Some((ack, None));
                }
                self.stats.bad_segments += 1;
                return;
            }
        }
        if seg.hdr.rst {
            if seg.hdr.ack.is_some() {
                self.error = Some(ConnError::Refused);
                self.state = State::Closed;
                self.clear_timers();
            }
            return;
        }
        if !seg.hdr.syn {
            return;
        }
        self.take_syn_options(seg);
        self.irs = seg.hdr.seq;
        self.rcv_nxt = seg.hdr.seq + 1;
        self.rcv_adv = self.rcv_nxt;
        if let Some(ack) = seg.hdr.ack {
            self.snd_una = ack;
            self.data_start = ack;
            self.sample_rtt(now, ack);
            self.snd_wnd = usize::from(seg.hdr.window) << self.snd_wscale;
            self.max_snd_wnd = self.snd_wnd;
            self.snd_wl1 = seg.hdr.seq;
            self.snd_wl2 = ack;
            self.state = if self.fin_queued {
                State::FinWait1
            } else {
                State::Established
            };
            self.retries = 0;
            self.rto_at = None;
            self.ack_now = true;
        } else {
            // Simultaneous open: answer with SYN-ACK.
            self.state = State::SynReceived;
            self.snd_wnd = usize::from(seg.hdr.window);
            self.snd_wl1 = seg.hdr.seq;
            self.snd_nxt = self.iss;
            self.send_syn = true;
        }
    }

    /// RFC 9293 acceptability test against what we advertised, or more if
    /// the buffer has room for it.
    fn acceptable(&self, seg: &Segment<'_>) -> bool {
        let wnd = self
            .rcv_adv
            .since(self.rcv_nxt)
            .max(self.advertisable_window());
        segment_acceptable(seg.hdr.seq, seg.len(), self.rcv_nxt, wnd)
    }

    fn challenge_ack(&mut self, now: Instant) {
        let second = now.as_nanos() / 1_000_000_000;
        if second != self.challenge_second {
            self.challenge_second = second;
            self.challenge_tokens = self.cfg.challenge_ack_limit;
        }
        if self.challenge_tokens > 0 {
            self.challenge_tokens -= 1;
            self.stats.challenge_acks += 1;
            self.ack_now = true;
        }
    }

    fn on_segment_synchronized(&mut self, now: Instant, seg: &Segment<'_>) {
        // PAWS (RFC 7323 §5): an old timestamp means an old duplicate.
        if self.ts_enabled && !seg.hdr.rst {
            if let Some((tsval, _)) = seg.hdr.timestamp {
                if (tsval.wrapping_sub(self.ts_recent) as i32) < 0 && !seg.hdr.syn {
                    self.ack_now = true;
                    self.stats.bad_segments += 1;
                    return;
                }
            }
        }
        if self.state == State::SynReceived
            && seg.hdr.syn
            && !seg.hdr.rst
            && seg.hdr.ack.is_none()
            && seg.hdr.seq == self.irs
        {
            // The peer retransmitted its SYN: our SYN-ACK was lost.
            self.snd_nxt = self.iss;
            self.send_syn = true;
            return;
        }
        if !self.acceptable(seg) {
            if !seg.hdr.rst {
                self.ack_now = true;
            }
            self.stats.bad_segments += 1;
            return;
        }
        if seg.hdr.rst && self.state == State::TimeWait {
            // RFC 1337: a reset must not cut TIME-WAIT short (an old
            // duplicate would let the next incarnation take stale data),
            // and the app, which has read or will read the end of stream,
            // learns of no error after the close completed.
            self.stats.bad_segments += 1;
            return;
        }
        if seg.hdr.rst {
            // RFC 5961 §3: only an exact match resets; in-window gets a challenge.
            if seg.hdr.seq == self.rcv_nxt {
                self.error = Some(if self.state == State::SynReceived {
                    ConnError::Refused
                } else {
                    ConnError::Reset
                });
                self.state = State::Closed;
                self.clear_timers();
            } else {
                self.challenge_ack(now);
            }
            return;
        }
        if seg.hdr.syn {
            // RFC 5961 §4: a SYN in a synchronized state gets a challenge ACK.
            self.challenge_ack(now);
            return;
        }
        let Some(ack) = seg.hdr.ack else {
            return;
        };
        if self.state == State::SynReceived {
            if ack.diff(self.snd_una) > 0 && ack.diff(self.snd_max) <= 0 {
                self.state = State::Established;
                self.snd_wnd = usize::from(seg.hdr.window) << self.snd_wscale;
                self.max_snd_wnd = self.snd_wnd;
                self.snd_wl1 = seg.hdr.seq;
                self.snd_wl2 = ack;
                self.retries = 0;
                if self.fin_queued {
                    self.state = State::FinWait1;
                }
            } else {
                self.rst_pending = Some((ack, None));
                return;
            }
        }
        // RFC 5961 §5: ACKs too far behind are challenged, ACKs ahead are answered.
        if ack.diff(self.snd_max) > 0 {
            self.ack_now = true;
            return;
        }
        let floor = self.snd_una - self.max_snd_wnd.max(self.mss);
        if ack.diff(floor) < 0 {
            self.challenge_ack(now);
            return;
        }
        if self.ts_enabled {
            if let Some((tsval, _)) = seg.hdr.timestamp {
                if seg.hdr.seq.diff(self.last_ack_sent) <= 0
                    && (tsval.wrapping_sub(self.ts_recent) as i32) >= 0
                {
                    self.ts_recent = tsval;
                }
            }
        }
        self.process_ack(now, seg, ack);
        if self.state == State::Closed {
            return;
        }
        self.process_data(now, seg);
    }

    fn process_ack(&mut self, now: Instant, seg: &Segment<'_>, ack: Seq) {
        let window = usize::from(seg.hdr.window) << self.snd_wscale;
        let mut newly_sacked = 0;
        if self.sack_enabled {
            let mut blocks = [(Seq(0), Seq(0)); 3];
            let mut n = 0;
            for b in seg.hdr.sack.iter().flatten() {
                blocks[n] = *b;
                n += 1;
            }
            if n > 0 {
                newly_sacked = self
                    .scoreboard
                    .add(self.snd_una, self.snd_max, &blocks[..n]);
            }
        }
        if ack.diff(self.snd_una) > 0 {
            let acked = ack.since(self.snd_una);
            // Grow the window only while it limits the sender (RFC 7661):
            // an app-limited or receiver-limited flow must not inflate it.
            let flight = self.snd_max.since(self.snd_una);
            let cwnd = self.cc.cwnd();
            let cwnd_limited =
                flight + self.mss >= cwnd || (self.cc.in_slow_start() && flight * 2 >= cwnd);
            self.snd_una = ack;
            if self.snd_nxt.diff(ack) < 0 {
                self.snd_nxt = ack;
            }
            // Bytes of data acknowledged (the SYN and FIN take sequence space too).
            let data_acked = ack.since(self.data_start).min(self.sndbuf.len());
            self.sndbuf.consume(data_acked);
            self.data_start += data_acked;
            self.stats.bytes_out += data_acked as u64;
            self.scoreboard.advance(ack);
            self.sample_rtt(now, ack);
            self.retries = 0;
            // The peer made progress: the user timeout counts from here.
            self.unacked_since = (self.in_flight() > 0).then_some(now);
            self.rtt.reset_backoff();
            self.dupacks = 0;
            if self.in_recovery {
                if ack.diff(self.recovery_point) >= 0 {
                    self.in_recovery = false;
                    self.cc.on_recovery_end(now);
                } else if !self.sack_enabled {
                    // NewReno partial ACK (RFC 6582): retransmit the next hole now.
                    self.high_rxt = self.snd_una;
                }
            } else if cwnd_limited {
                self.cc.on_ack(now, acked, self.rtt.srtt());
            }
            self.rto_at = if self.snd_max.diff(self.snd_una) > 0 {
                Some(now + self.rtt.rto())
            } else {
                None
            };
            self.on_fin_acked(now);
        } else if ack == self.snd_una
            && seg.payload.is_empty()
            && !seg.hdr.fin
            && window == self.snd_wnd
            && self.snd_max.diff(self.snd_una) > 0
        {
            self.dupacks += 1;
            self.stats.dup_acks += 1;
            let lost =
                self.sack_enabled && self.scoreboard.is_lost(self.snd_una, self.mss, DUP_THRESH);
            if !self.in_recovery && (self.dupacks >= DUP_THRESH || lost) {
                self.enter_recovery(now);
            }
        } else if newly_sacked > 0
            && !self.in_recovery
            && self.scoreboard.is_lost(self.snd_una, self.mss, DUP_THRESH)
        {
            self.enter_recovery(now);
        }
        // Window update (RFC 9293 3.10.7.4).
        if self.snd_wl1.diff(seg.hdr.seq) < 0
            || (self.snd_wl1 == seg.hdr.seq && self.snd_wl2.diff(ack) <= 0)
        {
            self.snd_wnd = window;
            self.max_snd_wnd = self.max_snd_wnd.max(window);
            self.snd_wl1 = seg.hdr.seq;
            self.snd_wl2 = ack;
            if window > 0 {
                self.persist_at = None;
                self.persist_backoff = 0;
            }
        }
    }

    fn enter_recovery(&mut self, now: Instant) {
        self.in_recovery = true;
        self.recovery_point = self.snd_max;
        self.high_rxt = self.snd_una;
        self.cc.on_congestion(now, self.in_flight());
        self.stats.fast_retransmits += 1;
        self.rtt_probe = None;
    }

    fn on_fin_acked(&mut self, now: Instant) {
        let fin_acked =
            self.fin_queued && self.sndbuf.is_empty() && self.snd_una.diff(self.data_start) > 0;
        if !fin_acked {
            return;
        }
        match self.state {
            State::FinWait1 => {
                self.state = State::FinWait2;
                self.arm_fin_wait2(now);
            }
            State::Closing => self.enter_time_wait(),
            State::LastAck => {
                self.state = State::Closed;
                self.clear_timers();
            }
            _ => {}
        }
    }

    fn enter_time_wait(&mut self) {
        self.state = State::TimeWait;
        self.rto_at = None;
        self.persist_at = None;
        self.fin_wait2_at = None;
        self.time_wait_at = None; // set on the next timer poll with `now`
    }

    fn sample_rtt(&mut self, now: Instant, ack: Seq) {
        if let Some((seq, sent)) = self.rtt_probe {
            if ack.diff(seq) > 0 {
                self.rtt.sample(now.saturating_duration_since(sent));
                self.rtt_probe = None;
            }
        }
    }

    fn process_data(&mut self, now: Instant, seg: &Segment<'_>) {
        if self.orphaned
            && matches!(self.state, State::FinWait1 | State::FinWait2)
            && (seg.hdr.seq + seg.payload.len()).diff(self.rcv_nxt) > 0
            && !seg.payload.is_empty()
        {
            // RFC 1122 4.2.2.13: nobody will read this; say so with a reset.
            self.reset_orphan(seg.hdr.ack);
            return;
        }
        if seg.hdr.fin {
            self.peer_fin = Some(seg.hdr.seq + seg.payload.len());
        }
        let receiving = matches!(
            self.state,
            State::Established | State::FinWait1 | State::FinWait2
        );
        if receiving && !seg.payload.is_empty() {
            // Trim what we already have.
            let skip = self.rcv_nxt.since(seg.hdr.seq).min(seg.payload.len());
            let data = &seg.payload[skip..];
            let offset = seg.hdr.seq.since(self.rcv_nxt);
            let before_ooo = self.rcvbuf.ooo_bytes();
            let out = self.rcvbuf.write_at(offset, data);
            if out.dropped {
                self.stats.ooo_dropped += 1;
            }
            self.stats.bytes_in += out.advanced as u64;
            self.rcv_nxt += out.advanced;
            if out.advanced > 0 {
                self.autotune(now);
            }
            if offset > 0 {
                // Out of order: an immediate duplicate ACK for each (with SACK).
                self.dupacks_owed = (self.dupacks_owed + 1).min(64);
                self.ack_now = true;
            } else if before_ooo > 0 || out.advanced < data.len() {
                // Filling a hole, or beyond the window: ACK now.
                self.ack_now = true;
            } else {
                self.unacked_segs += 1;
                match self.cfg.delayed_ack {
                    Some(d) if self.unacked_segs < 2 && seg.payload.len() < 2 * self.mss => {
                        self.delack_at.get_or_insert(now + d);
                    }
                    _ => self.ack_now = true,
                }
            }
        }
        if let Some(fin) = self.peer_fin {
            if fin == self.rcv_nxt && self.state.synchronized() {
                self.rcv_nxt += 1;
                self.ack_now = true;
                match self.state {
                    State::Established => self.state = State::CloseWait,
                    State::FinWait1 => {
                        let fin_acked = self.fin_queued
                            && self.sndbuf.is_empty()
                            && self.snd_una.diff(self.data_start) > 0;
                        if fin_acked {
                            self.enter_time_wait();
                        } else {
                            self.state = State::Closing;
                        }
                    }
                    State::FinWait2 => self.enter_time_wait(),
                    _ => {}
                }
            } else if seg.hdr.fin && self.state == State::TimeWait && fin.diff(self.rcv_nxt) < 0 {
                // A retransmitted FIN: ACK again and restart 2 MSL.
                self.ack_now = true;
                self.time_wait_at = None;
            }
        }
    }

    /// ICMP fragmentation-needed quoting our segment `seq` with next-hop
    /// `mtu` (RFC 1191): lower the MSS to fit it and send what is in flight
    /// again in segments of the new size; not a congestion signal, so the
    /// window stays. Returns false (ignored) when `seq` is not in flight, or
    /// the MTU is implausible (below 576, Linux's floor of 552 rounded to
    /// the IPv4 minimum a host must reassemble) or no smaller than now.
    pub fn on_path_mtu(&mut self, now: Instant, seq: Seq, mtu: usize) -> bool {
        const MIN_MTU: usize = 576;
        let in_flight = seq.diff(self.snd_una) >= 0 && seq.diff(self.snd_max) < 0;
        if !self.state.synchronized() || !in_flight || mtu < MIN_MTU {
            return false;
        }
        let mss = mtu - 40;
        if mss >= self.mss {
            return false;
        }
        self.mss = mss;
        self.cc.set_mss(mss);
        self.stats.pmtu_reductions += 1;
        // Go back to the first unacknowledged byte (RFC 1191 / Linux's
        // tcp_simple_retransmit), keeping cwnd.
        self.snd_nxt = self.snd_una;
        self.high_rxt = self.snd_una;
        self.scoreboard.clear();
        self.in_recovery = false;
        self.dupacks = 0;
        self.rtt_probe = None;
        self.rto_at = Some(now + self.rtt.rto());
        true
    }

    // ------------------------------------------------------ autotuning

    /// After in-order data arrived: time the receiver RTT, and once per RTT
    /// ask for a larger buffer when the app read more than before.
    fn autotune(&mut self, now: Instant) {
        let t = &mut self.tune;
        match t.rtt_mark {
            Some((edge, at)) if self.rcv_nxt.diff(edge) >= 0 => {
                let sample = now.saturating_duration_since(at);
                if !sample.is_zero() {
                    t.rtt = Some(t.rtt.map_or(sample, |r| r.min(sample)));
                }
                t.rtt_mark = Some((self.rcv_adv, now));
            }
            Some(_) => {}
            None => {
                t.rtt_mark = Some((self.rcv_adv, now));
                t.space_mark = (t.read, now);
            }
        }
        let Some(rtt) = t.rtt else { return };
        if now.saturating_duration_since(t.space_mark.1) < rtt {
            return;
        }
        let copied = t.read - t.space_mark.0;
        t.space_mark = (t.read, now);
        if copied <= t.space {
            return;
        }
        // Twice what the app read in one RTT, and twice the growth again
        // while it is growing fast (the sender is in slow start).
        let grow = copied - t.space;
        let mut target = 2 * copied + 16 * self.mss as u64;
        if t.space > 0 {
            target += 2 * target * grow / t.space.max(1);
        }
        t.space = copied;
        let max = self.cfg.recv_buffer_max as u64;
        let target = target.min(max) as usize;
        if target > self.rcvbuf.capacity() {
            t.want = Some(target);
        }
    }

    /// The larger receive buffer autotuning asks for, if any (the stack
    /// grants it within its memory limit with [`grow_rcvbuf`](Self::grow_rcvbuf)).
    pub fn take_rcvbuf_request(&mut self) -> Option<usize> {
        self.tune.want.take()
    }

    /// Receive buffer size now.
    pub fn rcvbuf_capacity(&self) -> usize {
        self.rcvbuf.capacity()
    }

    /// Grow the receive buffer to `capacity` bytes: the window opens by the
    /// difference on the next segment we send.
    pub fn grow_rcvbuf(&mut self, capacity: usize) {
        self.rcvbuf
            .grow(capacity.min(self.cfg.recv_buffer_max.max(self.cfg.recv_buffer)));
    }

    // ------------------------------------------------------------- timers

    fn clear_timers(&mut self) {
        self.rto_at = None;
        self.persist_at = None;
        self.delack_at = None;
        self.fin_wait2_at = None;
    }

    /// Turn keepalive on (with its timings) or off; idle time counts from
    /// the peer's last segment, or from `now` if later.
    pub fn set_keepalive(&mut self, now: Instant, ka: Option<KeepAlive>) {
        self.keepalive = ka;
        self.ka_probes = 0;
        self.ka_pending = false;
        // `last_rx` serves keepalive alone: counting from now changes
        // nothing else (Linux restarts the timer when the option is set).
        self.last_rx = self.last_rx.max(now);
    }

    /// Whether keepalive is on.
    pub fn keepalive(&self) -> Option<KeepAlive> {
        self.keepalive
    }

    /// `TCP_USER_TIMEOUT` (RFC 5482, as Linux does it): when data sent
    /// stays unacknowledged for longer than `timeout`, the connection
    /// fails with `TimedOut` (and a reset), however many retransmissions
    /// that took; while it is set it replaces the retransmission count
    /// limit. `None` (or zero, Linux's "use the default") turns it off.
    pub fn set_user_timeout(&mut self, timeout: Option<Duration>) {
        self.user_timeout = timeout.filter(|t| !t.is_zero());
    }

    /// The user timeout, when set.
    pub fn user_timeout(&self) -> Option<Duration> {
        self.user_timeout
    }

    /// When the user timeout ends the connection: only with data in flight
    /// on a synchronized connection.
    fn user_timeout_at(&self) -> Option<Instant> {
        let t = self.user_timeout?;
        if !self.state.synchronized() || self.in_flight() == 0 {
            return None;
        }
        Some(self.unacked_since? + t)
    }

    /// When the next keepalive probe (or the verdict on the last one) is
    /// due: only on an established connection with nothing in flight or
    /// queued (retransmissions time out on their own).
    fn keepalive_at(&self) -> Option<Instant> {
        let ka = self.keepalive?;
        if self.state != State::Established || self.in_flight() > 0 || self.send_queued() > 0 {
            return None;
        }
        Some(if self.ka_probes == 0 {
            self.last_rx + ka.idle
        } else {
            self.ka_last_probe + ka.interval
        })
    }

    /// The next time [`on_timer`](Self::on_timer) or a transmit is due.
    pub fn poll_at(&self) -> Option<Instant> {
        if self.ack_now
            || self.send_syn && matches!(self.state, State::SynSent | State::SynReceived)
            || self.rst_pending.is_some()
        {
            return Some(Instant::ZERO);
        }
        if self.state == State::TimeWait && self.time_wait_at.is_none() {
            return Some(Instant::ZERO);
        }
        [
            self.rto_at,
            self.persist_at,
            self.delack_at,
            self.time_wait_at,
            self.fin_wait2_at,
            self.keepalive_at(),
            self.user_timeout_at(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Run expired timers.
    pub fn on_timer(&mut self, now: Instant) {
        if self.state == State::TimeWait {
            match self.time_wait_at {
                None => self.time_wait_at = Some(now + self.cfg.time_wait),
                Some(t) if now >= t => {
                    self.state = State::Closed;
                    self.time_wait_at = None;
                }
                Some(_) => {}
            }
        }
        if self.fin_wait2_at.is_some_and(|t| now >= t) {
            // The peer never closed: give up as Linux does, with a reset.
            self.reset_orphan(None);
            self.error = Some(ConnError::TimedOut);
            return;
        }
        if self.user_timeout_at().is_some_and(|t| now >= t) {
            // Sent data waited longer than the app allows (Linux: ETIMEDOUT).
            self.error = Some(ConnError::TimedOut);
            self.rst_pending = Some((self.snd_nxt, Some(self.rcv_nxt)));
            self.state = State::Closed;
            self.clear_timers();
            return;
        }
        if let Some((ka, t)) = self.keepalive.zip(self.keepalive_at()) {
            if now >= t {
                if self.ka_probes >= ka.count {
                    // Nothing came back: the peer is gone (Linux: ETIMEDOUT).
                    self.error = Some(ConnError::TimedOut);
                    self.rst_pending = Some((self.snd_nxt, Some(self.rcv_nxt)));
                    self.state = State::Closed;
                    self.clear_timers();
                    return;
                }
                self.ka_probes += 1;
                self.ka_last_probe = now;
                self.ka_pending = true;
                self.stats.keepalive_probes += 1;
            }
        }
        if self.delack_at.is_some_and(|t| now >= t) {
            self.delack_at = None;
            self.ack_now = true;
        }
        if self.persist_at.is_some_and(|t| now >= t) {
            self.persist_at = None;
            self.probe_pending = true;
            self.stats.zero_window_probes += 1;
            self.persist_backoff = (self.persist_backoff + 1).min(16);
        }
        if self.rto_at.is_some_and(|t| now >= t) {
            self.on_rto(now);
        }
    }

    fn on_rto(&mut self, now: Instant) {
        self.rto_at = None;
        self.stats.timeouts += 1;
        self.retries += 1;
        let limit = if self.state.synchronized() {
            self.cfg.max_retries
        } else {
            self.cfg.syn_retries
        };
        // A user timeout replaces the count (it ends the connection itself).
        let counted = self.user_timeout.is_none() || !self.state.synchronized();
        if counted && self.retries > limit {
            self.error = Some(ConnError::TimedOut);
            if self.state.synchronized() {
                self.rst_pending = Some((self.snd_nxt, Some(self.rcv_nxt)));
            }
            self.state = State::Closed;
            self.clear_timers();
            return;
        }
        self.rtt.backoff();
        self.rtt_probe = None;
        match self.state {
            State::SynSent | State::SynReceived => {
                self.snd_nxt = self.iss;
                self.send_syn = true;
            }
            _ => {
                self.cc.on_timeout(now, self.in_flight());
                self.in_recovery = false;
                self.dupacks = 0;
                self.scoreboard.clear();
                // Go back: resend from the first unacknowledged byte.
                self.snd_nxt = self.snd_una;
                self.high_rxt = self.snd_una;
            }
        }
    }

    // ------------------------------------------------------------- output

    fn base_segment(&mut self, now: Instant) -> Outgoing {
        let window = self.window_to_advertise();
        let mut sack = [None; 3];
        if self.sack_enabled && self.rcvbuf.ooo_bytes() > 0 {
            self.rcvbuf.sack_ranges(&mut self.sack_scratch, 3);
            for (slot, &(s, e)) in sack.iter_mut().zip(self.sack_scratch.iter()) {
                *slot = Some((self.rcv_nxt + s, self.rcv_nxt + e));
            }
        }
        Outgoing::from(Header {
            seq: self.snd_nxt,
            ack: Some(self.rcv_nxt),
            window,
            sack,
            timestamp: self.ts_enabled.then(|| (self.tsval(now), self.ts_recent)),
            ..Header::default()
        })
    }

    fn sent_ack(&mut self, seg: &Outgoing) {
        if let Some(ack) = seg.hdr.ack {
            self.last_ack_sent = ack;
        }
        self.dupacks_owed = self.dupacks_owed.saturating_sub(1);
        self.ack_now = self.dupacks_owed > 0;
        self.delack_at = None;
        self.unacked_segs = 0;
        self.stats.segs_out += 1;
    }

    /// A segment from [`poll_transmit`](Self::poll_transmit) left as
    /// `extra` more frames than one (cut by the stack: GSO).
    pub(crate) fn count_extra_frames(&mut self, extra: usize) {
        self.stats.segs_out += extra as u64;
    }

    /// The next segment to send, if any. Call repeatedly until `None`.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Outgoing> {
        self.on_timer(now);
        if let Some((seq, ack)) = self.rst_pending.take() {
            self.stats.segs_out += 1;
            return Some(Outgoing::from(Header {
                seq,
                ack,
                rst: true,
                ..Header::default()
            }));
        }
        match self.state {
            State::Closed | State::Listen => return None,
            State::SynSent => return self.transmit_syn(now),
            State::SynReceived => {
                if let Some(seg) = self.transmit_syn(now) {
                    return Some(seg);
                }
                // Simultaneous open: acknowledge the peer's SYN-ACK.
                if self.ack_now {
                    let seg = self.base_segment(now);
                    self.sent_ack(&seg);
                    return Some(seg);
                }
                return None;
            }
            _ => {}
        }
        if let Some(seg) = self.transmit_data(now) {
            return Some(seg);
        }
        if self.probe_pending {
            self.probe_pending = false;
            // Zero-window probe: an old sequence number draws an ACK with the window.
            let mut seg = self.base_segment(now);
            seg.hdr.seq = self.snd_una - 1;
            self.sent_ack(&seg);
            self.arm_persist(now);
            return Some(seg);
        }
        if self.ka_pending {
            self.ka_pending = false;
            // Keepalive probe: an old sequence number draws the peer's ACK.
            let mut seg = self.base_segment(now);
            seg.hdr.seq = self.snd_una - 1;
            self.sent_ack(&seg);
            return Some(seg);
        }
        if self.ack_now {
            let seg = self.base_segment(now);
            self.sent_ack(&seg);
            return Some(seg);
        }
        None
    }

    fn transmit_syn(&mut self, now: Instant) -> Option<Outgoing> {
        if !self.send_syn {
            return None;
        }
        self.send_syn = false;
        let synack = self.state == State::SynReceived;
        let seg = Outgoing::from(Header {
            seq: self.iss,
            ack: synack.then_some(self.rcv_nxt),
            syn: true,
            window: u16::try_from(self.rcvbuf.window()).unwrap_or(u16::MAX),
            mss: Some(u16::try_from(self.cfg.mss).unwrap_or(u16::MAX)),
            wscale: (self.cfg.window_scaling
                && (!synack || self.snd_wscale > 0 || self.rcv_wscale > 0))
                .then_some(self.rcv_wscale),
            sack_permitted: self.cfg.sack && (!synack || self.sack_enabled),
            timestamp: (self.cfg.timestamps && (!synack || self.ts_enabled))
                .then(|| (self.tsval(now), if synack { self.ts_recent } else { 0 })),
            ..Header::default()
        });
        if synack {
            self.rcv_adv = self.rcv_nxt + usize::from(seg.hdr.window);
        }
        self.snd_nxt = self.iss + 1;
        if self.snd_max.diff(self.snd_nxt) < 0 {
            self.snd_max = self.snd_nxt;
        }
        if self.retries == 0 {
            self.rtt_probe = Some((self.iss, now));
        }
        self.rto_at = Some(now + self.rtt.rto());
        self.sent_ack(&seg);
        Some(seg)
    }

    fn arm_persist(&mut self, now: Instant) {
        let base = self.rtt.rto().max(PERSIST_MIN);
        let d = base
            .saturating_mul(1 << self.persist_backoff.min(16))
            .min(PERSIST_MAX);
        self.persist_at = Some(now + d);
    }

    /// Data (new or retransmitted) and FIN.
    fn transmit_data(&mut self, now: Instant) -> Option<Outgoing> {
        let data_end = self.data_start + self.sndbuf.len();
        // Loss recovery: retransmit holes first.
        if self.in_recovery {
            if let Some(seg) = self.retransmit_in_recovery(now) {
                return Some(seg);
            }
        }
        let flight = self.flight_estimate();
        let cwnd = self.cc.cwnd();
        let wnd_edge = self.snd_una + self.snd_wnd;
        let unsent = data_end.since(self.snd_nxt);
        let fin_due = self.fin_queued
            && matches!(
                self.state,
                State::FinWait1 | State::Closing | State::LastAck
            )
            && self.snd_nxt.diff(data_end) >= 0
            && self.snd_nxt.diff(data_end + 1) < 0;
        if unsent == 0 && !fin_due {
            return None;
        }
        let usable_wnd = wnd_edge.since(self.snd_nxt);
        let usable_cwnd = cwnd.saturating_sub(flight);
        let max_payload = self.max_payload();
        // With TSO, new data leaves in segments of whole frames the port
        // cuts (a retransmission stays one frame).
        let tso_cap = if self.tso_max > 0 && self.snd_nxt == self.snd_max {
            let header = 40 + self.mss.saturating_sub(max_payload);
            (self.tso_max.saturating_sub(header) / max_payload * max_payload).max(max_payload)
        } else {
            max_payload
        };
        let mut len = unsent.min(tso_cap).min(usable_wnd).min(usable_cwnd);
        if len > max_payload {
            // Whole frames only: a short tail is left to the next call,
            // which applies SWS avoidance, cork and Nagle to it as to any
            // short segment (Linux's tcp_mss_split_point), so a burst cut
            // into frames leaves exactly as segment by segment.
            len -= len % max_payload;
        }
        // A persist expiry forces one segment past SWS avoidance and Nagle
        // (RFC 9293 3.8.6.2.1 override timeout).
        let forced = self.probe_pending && len > 0;
        if unsent > 0 && len == 0 {
            if usable_wnd == 0 && self.persist_at.is_none() && self.rto_at.is_none() {
                // Zero window: keep probing while data waits.
                self.arm_persist(now);
            }
            return None;
        }
        if len > 0 && len < max_payload && len < unsent && !forced && len < self.max_snd_wnd / 2 {
            // Sender SWS avoidance: wait for a full segment, or for the
            // override timer when nothing is in flight to clock us.
            if self.persist_at.is_none() && self.rto_at.is_none() {
                self.arm_persist(now);
            }
            return None;
        }
        let new_data = self.snd_nxt == self.snd_max;
        if len > 0 && len < max_payload && self.corked && !forced && new_data && !self.fin_queued {
            // TCP_CORK: only full segments until the app uncorks.
            return None;
        }
        if len > 0
            && len < max_payload
            && self.cfg.nagle
            && !forced
            && self.snd_max.diff(self.snd_una) > 0
            && new_data
            && !self.fin_queued
        {
            // Nagle: one small segment in flight at a time. It holds new data
            // only: a retransmission (after an RTO rolled snd_nxt back) of a
            // small tail must go, or nothing would ever acknowledge it.
            return None;
        }
        if forced {
            self.probe_pending = false;
        }
        let retransmit = self.snd_nxt.diff(self.snd_max) < 0;
        let mut seg = self.base_segment(now);
        seg.payload_offset = self.snd_nxt.since(self.data_start);
        seg.payload_len = len;
        if len > max_payload {
            seg.tso_segsz = max_payload;
        }
        let after = self.snd_nxt + len;
        if self.fin_queued
            && after == data_end
            && matches!(
                self.state,
                State::FinWait1 | State::Closing | State::LastAck
            )
        {
            seg.hdr.fin = true;
        }
        let advance = len + usize::from(seg.hdr.fin);
        if advance == 0 {
            return None;
        }
        if retransmit {
            self.stats.retransmits += 1;
        } else if self.rtt_probe.is_none() {
            self.rtt_probe = Some((self.snd_nxt, now));
        }
        self.snd_nxt += advance;
        if self.snd_max.diff(self.snd_nxt) < 0 {
            self.snd_max = self.snd_nxt;
        }
        if self.rto_at.is_none() {
            self.rto_at = Some(now + self.rtt.rto());
        }
        if self.unacked_since.is_none() {
            self.unacked_since = Some(now);
        }
        self.sent_ack(&seg);
        Some(seg)
    }

    /// Bytes counted against cwnd: RFC 6675 pipe with SACK, else the flight
    /// (inflated by duplicate ACKs during NewReno fast recovery).
    fn flight_estimate(&self) -> usize {
        if self.sack_enabled && !self.scoreboard.is_empty() {
            return self.scoreboard.pipe(
                self.snd_una,
                self.snd_max,
                self.high_rxt,
                self.mss,
                DUP_THRESH,
            );
        }
        let flight = self.snd_nxt.since(self.snd_una);
        if self.in_recovery {
            flight.saturating_sub(self.dupacks.saturating_sub(DUP_THRESH) * self.mss)
        } else {
            flight
        }
    }

    fn retransmit_in_recovery(&mut self, now: Instant) -> Option<Outgoing> {
        let (start, len) = if self.sack_enabled {
            let pipe = self.flight_estimate();
            if pipe + self.mss > self.cc.cwnd() && self.high_rxt.diff(self.snd_una) > 0 {
                return None;
            }
            self.scoreboard
                .next_lost(
                    self.snd_una,
                    self.snd_max,
                    self.high_rxt,
                    self.mss,
                    DUP_THRESH,
                )
                .or_else(|| {
                    // First retransmission of the recovery: the head segment.
                    (self.high_rxt == self.snd_una).then_some((self.snd_una, self.mss))
                })?
        } else {
            // NewReno: retransmit the segment at snd_una once per (partial) ACK.
            if self.high_rxt != self.snd_una {
                return None;
            }
            (self.snd_una, self.mss)
        };
        let data_end = self.data_start + self.sndbuf.len();
        let len = len.min(data_end.since(start)).min(self.max_payload());
        let fin = self.fin_queued && start + len == data_end && self.snd_max.diff(data_end) > 0;
        if len == 0 && !fin {
            self.high_rxt = start + 1;
            return None;
        }
        let mut seg = self.base_segment(now);
        seg.hdr.seq = start;
        seg.payload_offset = start.since(self.data_start);
        seg.payload_len = len;
        seg.hdr.fin = fin;
        self.high_rxt = start + (len + usize::from(fin));
        self.stats.retransmits += 1;
        self.rto_at = Some(now + self.rtt.rto());
        self.sent_ack(&seg);
        Some(seg)
    }

    /// Copy a segment's payload, from byte `at` of it on, from the send
    /// buffer into `dst`.
    pub fn copy_payload(&self, seg: &Outgoing, at: usize, dst: &mut [u8]) -> usize {
        let n = seg.payload_len.saturating_sub(at).min(dst.len());
        self.sndbuf.read_at(seg.payload_offset + at, &mut dst[..n])
    }

    /// [`copy_payload`](Self::copy_payload), also giving the one's-complement
    /// sum of what it wrote (a `crate::wire::checksum::sum` accumulator) when it
    /// filled all of `dst`; `None` when it wrote less.
    pub fn copy_payload_summed(&self, seg: &Outgoing, at: usize, dst: &mut [u8]) -> Option<u64> {
        let n = seg.payload_len.saturating_sub(at).min(dst.len());
        let (copied, sum) = self
            .sndbuf
            .read_at_summed(seg.payload_offset + at, &mut dst[..n]);
        (copied == dst.len()).then_some(sum)
    }
}

#[cfg(test)]
mod test {
    use super::super::cc::Algorithm;
    use super::*;
    use core::net::Ipv4Addr;

    const A: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 40000);
    const B: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 80);

    /// A segment in flight, owning its payload.
    #[derive(Debug, Clone)]
    struct Wire {
        out: Outgoing,
        payload: Vec<u8>,
    }

    impl Wire {
        fn seg(&self) -> Segment<'_> {
            Segment {
                hdr: self.out.hdr,
                payload: &self.payload,
            }
        }
    }

    fn drain(c: &mut TcpConn, now: Instant) -> Vec<Wire> {
        let mut v = Vec::new();
        while let Some(out) = c.poll_transmit(now) {
            let mut payload = vec![0; out.payload_len];
            c.copy_payload(&out, 0, &mut payload);
            v.push(Wire { out, payload });
            assert!(v.len() < 10_000, "runaway transmit");
        }
        v
    }

    fn cfg() -> TcpConfig {
        TcpConfig {
            delayed_ack: None,
            ..TcpConfig::default()
        }
    }

    /// Client and server with the handshake done.
    fn established(ccfg: TcpConfig, scfg: TcpConfig) -> (TcpConn, TcpConn, Instant) {
        let t = Instant::from_millis(1);
        let mut c = TcpConn::connect(ccfg, A, B, Seq(1000));
        let syn = drain(&mut c, t);
        assert_eq!(syn.len(), 1);
        assert!(syn[0].out.hdr.syn && syn[0].out.hdr.ack.is_none());
        let mut s = TcpConn::accept(scfg, B, A, Seq(5000), &syn[0].seg());
        let synack = drain(&mut s, t);
        assert!(synack[0].out.hdr.syn && synack[0].out.hdr.ack == Some(Seq(1001)));
        c.on_segment(t, &synack[0].seg());
        assert_eq!(c.state(), State::Established);
        for w in drain(&mut c, t) {
            s.on_segment(t, &w.seg());
        }
        assert_eq!(s.state(), State::Established);
        (c, s, t)
    }

    /// Exchange segments until quiet; `keep` decides which segments survive.
    fn run(
        c: &mut TcpConn,
        s: &mut TcpConn,
        now: &mut Instant,
        step: Duration,
        mut keep: impl FnMut(bool, &Wire) -> bool,
    ) {
        let limit = *now + Duration::from_secs(120);
        for _ in 0..100_000 {
            if *now > limit {
                return;
            }
            let from_c = drain(c, *now);
            let from_s = drain(s, *now);
            if from_c.is_empty() && from_s.is_empty() {
                let next = [c.poll_at(), s.poll_at()].into_iter().flatten().min();
                match next {
                    Some(t) if t > *now && t < *now + Duration::from_secs(300) => *now = t,
                    _ => return,
                }
                continue;
            }
            for w in from_c {
                if keep(true, &w) {
                    s.on_segment(*now, &w.seg());
                }
            }
            for w in from_s {
                if keep(false, &w) {
                    c.on_segment(*now, &w.seg());
                }
            }
            *now += step;
        }
        panic!("no quiescence");
    }

    fn read_all(c: &mut TcpConn) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = c.recv(&mut buf);
            if n == 0 {
                return out;
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    #[test]
    fn handshake_negotiates_options() {
        let (c, s, _) = established(cfg(), cfg());
        assert!(c.ts_enabled && s.ts_enabled);
        assert!(c.sack_enabled && s.sack_enabled);
        assert_eq!(c.mss(), 1460);
        // Buffers that may autotune up to 4 MiB need a shift of 7 to fit 16 bits.
        assert_eq!(c.rcv_wscale, 7);
        assert_eq!(s.snd_wscale, 7);
    }

    #[test]
    fn segments_leave_room_for_options() {
        let (mut c, _s, now) = established(cfg(), cfg());
        c.send(&[0u8; 100_000]);
        let out = drain(&mut c, now);
        assert!(!out.is_empty());
        // 1460 MSS minus 12 bytes of timestamp option.
        assert!(
            out.iter().all(|w| w.out.payload_len <= 1448),
            "{:?}",
            out.iter().map(|w| w.out.payload_len).max()
        );
        assert_eq!(out[0].out.payload_len, 1448);
    }

    #[test]
    fn options_off_when_peer_lacks_them() {
        let plain = TcpConfig {
            window_scaling: false,
            timestamps: false,
            sack: false,
            mss: 536,
            ..cfg()
        };
        let (c, s, _) = established(cfg(), plain);
        assert!(!c.ts_enabled && !c.sack_enabled);
        assert_eq!((c.rcv_wscale, c.snd_wscale), (0, 0));
        assert_eq!(c.mss(), 536);
        assert_eq!(s.mss(), 536);
    }

    #[test]
    fn data_both_ways_and_graceful_close_to_time_wait() {
        let (mut c, mut s, mut now) = established(cfg(), cfg());
        let msg: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        assert_eq!(c.send(&msg), msg.len());
        assert_eq!(s.send(b"hello"), 5);
        let mut got = Vec::new();
        let mut got_c = Vec::new();
        for _ in 0..50 {
            run(
                &mut c,
                &mut s,
                &mut now,
                Duration::from_micros(10),
                |_, _| true,
            );
            got.extend(read_all(&mut s));
            got_c.extend(read_all(&mut c));
        }
        assert_eq!(got, msg);
        assert_eq!(got_c, b"hello");
        c.close();
        assert_eq!(c.state(), State::FinWait1);
        run(
            &mut c,
            &mut s,
            &mut now,
            Duration::from_micros(10),
            |_, _| true,
        );
        assert_eq!(s.state(), State::CloseWait);
        assert_eq!(c.state(), State::FinWait2);
        assert!(s.recv_finished());
        s.close();
        let t0 = now;
        run(
            &mut c,
            &mut s,
            &mut now,
            Duration::from_micros(10),
            |_, _| true,
        );
        assert_eq!(s.state(), State::Closed);
        // TIME_WAIT lasts 2 MSL, then the connection is gone.
        assert_eq!(c.state(), State::Closed);
        assert!(now >= t0 + Duration::from_secs(60));
        assert_eq!(c.stats().retransmits, 0, "{:?}", c.stats());
    }

    #[test]
    fn reset_in_time_wait_is_ignored_and_the_app_sees_end_of_stream() {
        let (mut c, mut s, mut now) = established(cfg(), cfg());
        c.close();
        for w in drain(&mut c, now) {
            s.on_segment(now, &w.seg());
        }
        s.close();
        let fin = drain(&mut s, now);
        for w in &fin {
            c.on_segment(now, &w.seg());
        }
        assert_eq!(c.state(), State::TimeWait);
        drain(&mut c, now);
        // A reset at exactly the right sequence number (a peer that forgot
        // the connection answering a duplicate): RFC 1337 ignores it.
        let rst = Segment::from(Header {
            seq: c.rcv_nxt,
            rst: true,
            ..Header::default()
        });
        now += Duration::from_millis(1);
        c.on_segment(now, &rst);
        assert_eq!(c.state(), State::TimeWait);
        assert_eq!(c.error(), None);
        assert!(c.recv_finished());
    }

    #[test]
    fn simultaneous_open() {
        let t = Instant::from_millis(1);
        let mut a = TcpConn::connect(cfg(), A, B, Seq(100));
        let mut b = TcpConn::connect(cfg(), B, A, Seq(900));
        let sa = drain(&mut a, t);
        let sb = drain(&mut b, t);
        a.on_segment(t, &sb[0].seg());
        b.on_segment(t, &sa[0].seg());
        assert_eq!(
            (a.state(), b.state()),
            (State::SynReceived, State::SynReceived)
        );
        let mut now = t;
        run(
            &mut a,
            &mut b,
            &mut now,
            Duration::from_micros(10),
            |_, _| true,
        );
        assert_eq!(
            (a.state(), b.state()),
            (State::Established, State::Established)
        );
    }

    #[test]
    fn simultaneous_close() {
        let (mut c, mut s, mut now) = established(cfg(), cfg());
        c.close();
        s.close();
        let fc = drain(&mut c, now);
        let fs = drain(&mut s, now);
        for w in &fs {
            c.on_segment(now, &w.seg());
        }
        for w in &fc {
            s.on_segment(now, &w.seg());
        }
        assert_eq!((c.state(), s.state()), (State::Closing, State::Closing));
        run(
            &mut c,
            &mut s,
            &mut now,
            Duration::from_micros(10),
            |_, _| true,
        );
        assert_eq!((c.state(), s.state()), (State::Closed, State::Closed));
    }

    #[test]
    fn rst_in_window_gets_challenge_ack_exact_rst_resets() {
        let (mut c, _s, now) = established(cfg(), cfg());
        let rcv_nxt = c.rcv_nxt;
        let rst = |seq| Wire {
            out: Outgoing::from(Header {
                seq,
                rst: true,
                ..Header::default()
            }),
            payload: vec![],
        };
        c.on_segment(now, &rst(rcv_nxt + 100).seg());
        assert_eq!(c.state(), State::Established);
        assert_eq!(c.stats().challenge_acks, 1);
        let ack = drain(&mut c, now);
        assert_eq!(ack.len(), 1);
        assert_eq!(ack[0].out.hdr.ack, Some(rcv_nxt));
        // Out of window: silently ignored.
        c.on_segment(now, &rst(rcv_nxt + 10_000_000).seg());
        assert_eq!(c.stats().challenge_acks, 1);
        c.on_segment(now, &rst(rcv_nxt).seg());
        assert_eq!(c.state(), State::Closed);
        assert_eq!(c.error(), Some(ConnError::Reset));
    }

    #[test]
    fn syn_in_established_gets_challenge_ack() {
        let (mut c, _s, now) = established(cfg(), cfg());
        let syn = Wire {
            out: Outgoing::from(Header {
                seq: c.rcv_nxt + 5,
                syn: true,
                ..Header::default()
            }),
            payload: vec![],
        };
        c.on_segment(now, &syn.seg());
        assert_eq!(c.state(), State::Established);
        assert_eq!(c.stats().challenge_acks, 1);
    }

    #[test]
    fn close_before_established_still_delivers_data() {
        let t = Instant::from_millis(1);
        let mut c = TcpConn::connect(cfg(), A, B, Seq(1000));
        let syn = drain(&mut c, t);
        c.send(b"queued before the handshake");
        c.close();
        assert_eq!(c.state(), State::SynSent);
        let mut s = TcpConn::accept(cfg(), B, A, Seq(5000), &syn[0].seg());
        let mut now = t;
        run(
            &mut c,
            &mut s,
            &mut now,
            Duration::from_micros(10),
            |_, _| true,
        );
        assert_eq!(read_all(&mut s), b"queued before the handshake");
        assert!(s.recv_finished());
        assert_eq!(c.state(), State::FinWait2);
    }

    #[test]
    fn refused_connection() {
        let t = Instant::from_millis(1);
        let mut c = TcpConn::connect(cfg(), A, B, Seq(1000));
        let syn = drain(&mut c, t);
        let rst = Wire {
            out: Outgoing::from(Header {
                seq: Seq(0),
                ack: Some(syn[0].out.hdr.seq + 1),
                rst: true,
                ..Header::default()
            }),
            payload: vec![],
        };
        c.on_segment(t, &rst.seg());
        assert_eq!(c.error(), Some(ConnError::Refused));
        assert!(c.is_finished());
    }

    #[test]
    fn syn_retries_then_times_out() {
        let mut c = TcpConn::connect(cfg(), A, B, Seq(1000));
        let mut now = Instant::from_millis(1);
        let mut syns = 0;
        for _ in 0..100 {
            syns += drain(&mut c, now).len();
            match c.poll_at() {
                Some(t) => now = t.max(now),
                None => break,
            }
        }
        assert_eq!(c.error(), Some(ConnError::TimedOut));
        assert_eq!(syns as u32, 1 + TcpConfig::default().syn_retries);
    }

    const KA: KeepAlive = KeepAlive {
        idle: Duration::from_secs(10),
        interval: Duration::from_secs(2),
        count: 3,
    };

    #[test]
    fn keepalive_probes_an_answering_peer_and_stays_up() {
        let (mut c, mut s, mut now) = established(cfg(), cfg());
        c.set_keepalive(now, Some(KA));
        assert_eq!(c.poll_at(), Some(now + KA.idle));
        // An hour of silence from both apps: the peer answers each probe.
        let end = now + Duration::from_secs(3600);
        while now < end {
            now = c.poll_at().expect("keepalive armed");
            let probes = drain(&mut c, now);
            assert_eq!(probes.len(), 1);
            let p = &probes[0];
            assert_eq!(p.out.hdr.seq, c.snd_una - 1);
            assert!(p.payload.is_empty() && !p.out.hdr.rst);
            s.on_segment(now, &p.seg());
            for w in drain(&mut s, now) {
                c.on_segment(now, &w.seg());
            }
        }
        assert_eq!(c.state(), State::Established);
        assert_eq!(c.error(), None);
        // One probe per idle period, every one answered.
        assert_eq!(c.stats().keepalive_probes, 3600 / 10);
        c.set_keepalive(now, None);
        assert_eq!(c.poll_at(), None);
    }

    #[test]
    fn keepalive_resets_a_silent_peer_after_count_probes() {
        let (mut c, _s, mut now) = established(cfg(), cfg());
        let start = now;
        c.set_keepalive(now, Some(KA));
        let mut probes = 0;
        while let Some(t) = c.poll_at() {
            now = t;
            for w in drain(&mut c, now) {
                if w.out.hdr.rst {
                    assert_eq!(c.error(), Some(ConnError::TimedOut));
                } else {
                    probes += 1;
                }
            }
            if c.state() == State::Closed {
                break;
            }
        }
        assert_eq!(probes, KA.count);
        assert_eq!(c.error(), Some(ConnError::TimedOut));
        // Idle, then `count` intervals for the probes' answers.
        assert_eq!(now - start, KA.idle + KA.interval * KA.count);
    }

    #[test]
    fn keepalive_waits_while_data_is_in_flight() {
        let (mut c, _s, now) = established(cfg(), cfg());
        c.set_keepalive(now, Some(KA));
        c.send(b"unanswered");
        let out = drain(&mut c, now);
        assert_eq!(out.len(), 1);
        // Only the retransmission timer runs, not keepalive.
        assert!(c.poll_at().is_some_and(|t| t < now + KA.idle));
        assert_eq!(c.keepalive_at(), None);
    }

    #[test]
    fn user_timeout_fails_unacknowledged_data_with_timed_out() {
        let ut = Duration::from_secs(3);
        let (mut c, mut s, mut now) = established(cfg(), cfg());
        c.set_user_timeout(Some(ut));
        assert_eq!(c.user_timeout(), Some(ut));
        // Idle: no deadline.
        assert_eq!(c.user_timeout_at(), None);
        // Answered data restarts the clock and leaves nothing pending.
        c.send(b"answered");
        for w in drain(&mut c, now) {
            s.on_segment(now, &w.seg());
        }
        assert!(c.user_timeout_at().is_some_and(|t| t == now + ut));
        now += Duration::from_millis(10);
        for w in drain(&mut s, now + Duration::from_millis(200)) {
            c.on_segment(now, &w.seg());
        }
        assert_eq!(c.user_timeout_at(), None);
        // Now the peer vanishes: retransmissions, then the timeout.
        let start = now;
        c.send(b"unanswered");
        let mut rsts = 0;
        let mut sent = drain(&mut c, now).len();
        while let Some(t) = c.poll_at() {
            now = t.max(now);
            for w in drain(&mut c, now) {
                if w.out.hdr.rst {
                    rsts += 1;
                } else {
                    sent += 1;
                }
            }
            if c.state() == State::Closed {
                break;
            }
        }
        assert_eq!(c.error(), Some(ConnError::TimedOut));
        assert_eq!(rsts, 1);
        // The first transmission and some retransmissions, far fewer than
        // the retry limit.
        assert!(sent >= 2 && (sent as u32) < TcpConfig::default().max_retries);
        assert_eq!(now - start, ut);
    }

    #[test]
    fn user_timeout_longer_than_the_retry_limit_keeps_retransmitting() {
        let ut = Duration::from_secs(24 * 3600);
        let (mut c, _s, mut now) = established(cfg(), cfg());
        c.set_user_timeout(Some(ut));
        let start = now;
        c.send(b"unanswered");
        let mut sent = drain(&mut c, now).len() as u32;
        while let Some(t) = c.poll_at() {
            now = t.max(now);
            sent += drain(&mut c, now).iter().filter(|w| !w.out.hdr.rst).count() as u32;
            if c.state() == State::Closed {
                break;
            }
        }
        assert_eq!(c.error(), Some(ConnError::TimedOut));
        assert!(sent > TcpConfig::default().max_retries + 1);
        assert_eq!(now - start, ut);
        // Zero turns it off: the count limit again.
        c.set_user_timeout(Some(Duration::ZERO));
        assert_eq!(c.user_timeout(), None);
    }

    #[test]
    fn slow_reader_zero_window_probe_and_recovery() {
        let small = TcpConfig {
            recv_buffer: 8192,
            ..cfg()
        };
        let (mut c, mut s, mut now) = established(cfg(), small);
        let msg: Vec<u8> = (0..50_000u32).map(|i| (i * 7) as u8).collect();
        let mut sent = c.send(&msg);
        run(
            &mut c,
            &mut s,
            &mut now,
            Duration::from_micros(50),
            |_, _| true,
        );
        // The receiver's buffer is full and nobody reads: the window is zero.
        assert_eq!(s.recv_available(), 8192);
        assert_eq!(c.snd_wnd(), 0);
        // Time passes: the sender probes rather than giving up.
        let mut probes_seen = 0;
        for _ in 0..5 {
            let t = c.poll_at().expect("persist timer armed");
            now = now.max(t);
            let out = drain(&mut c, now);
            probes_seen += out.len();
            for w in out {
                s.on_segment(now, &w.seg());
            }
            for w in drain(&mut s, now) {
                c.on_segment(now, &w.seg());
            }
        }
        assert!(probes_seen >= 5 && c.stats().zero_window_probes >= 5);
        assert_eq!(c.state(), State::Established);
        // The reader drains: a window update restarts the flow; all data arrives.
        let mut got = Vec::new();
        for _ in 0..200 {
            got.extend(read_all(&mut s));
            if sent < msg.len() {
                sent += c.send(&msg[sent..]);
            }
            run(
                &mut c,
                &mut s,
                &mut now,
                Duration::from_micros(50),
                |_, _| true,
            );
        }
        got.extend(read_all(&mut s));
        assert_eq!(got, msg);
    }

    #[test]
    fn the_right_edge_never_moves_left_while_the_window_closes() {
        // A reader that never reads and a window scale of several bits:
        // full-sized segments (not a multiple of the scale unit) fill the
        // buffer. Every ACK's right edge (ACK + window << scale) must be at
        // or beyond the one before (RFC 9293 3.8.6; rounding the window
        // down to the scale moved it back by up to a unit).
        let rcv = TcpConfig {
            recv_buffer: 64 << 10,
            ..cfg()
        };
        let (mut c, mut s, mut now) = established(cfg(), rcv);
        assert!(s.rcv_wscale >= 5, "scale {}", s.rcv_wscale);
        let shift = s.rcv_wscale;
        let msg = vec![7u8; 200_000];
        c.send(&msg);
        let mut edges = Vec::new();
        run(
            &mut c,
            &mut s,
            &mut now,
            Duration::from_micros(50),
            |from_client, w| {
                if !from_client {
                    if let Some(ack) = w.out.hdr.ack {
                        let field = w.out.hdr.window;
                        edges.push((ack + (usize::from(field) << shift), field));
                    }
                }
                true
            },
        );
        assert!(edges.len() > 8, "{} ACKs", edges.len());
        for pair in edges.windows(2) {
            let ((before, _), (after, field)) = (pair[0], pair[1]);
            assert!(
                after.diff(before) >= 0,
                "the right edge moved left by {} bytes (window field {field})",
                before.diff(after)
            );
        }
        // The window did close: the reader holds (about) a buffer's worth,
        // all the sender had acknowledged.
        assert!(s.recv_available() > (56 << 10), "{}", s.recv_available());
        assert_eq!(s.recv_available() as u64, c.stats().bytes_out);
    }

    #[test]
    fn loss_triggers_fast_retransmit_and_cwnd_reduction() {
        for alg in [Algorithm::NewReno, Algorithm::Cubic] {
            for sack in [true, false] {
                let cc = TcpConfig {
                    congestion: alg,
                    sack,
                    ..cfg()
                };
                // The receiver's window never closes during the test.
                let rc = TcpConfig {
                    recv_buffer: 8 << 20,
                    ..cc.clone()
                };
                let (mut c, mut s, mut now) = established(cc, rc);
                let msg = vec![0x5a; 4_000_000];
                let mut sent = c.send(&msg);
                // Grow cwnd first.
                for _ in 0..5 {
                    run(
                        &mut c,
                        &mut s,
                        &mut now,
                        Duration::from_micros(100),
                        |_, _| true,
                    );
                    read_all(&mut s);
                    sent += c.send(&msg[sent..]);
                }
                assert!(sent < msg.len());
                let before = c.cwnd();
                let mut dropped = false;
                run(
                    &mut c,
                    &mut s,
                    &mut now,
                    Duration::from_micros(100),
                    |from_c, w| {
                        // Drop exactly one data segment.
                        if from_c && w.out.payload_len > 0 && !dropped {
                            dropped = true;
                            return false;
                        }
                        true
                    },
                );
                assert!(dropped);
                assert!(
                    c.stats().fast_retransmits >= 1,
                    "{alg:?} sack={sack}: {:?}",
                    c.stats()
                );
                assert_eq!(
                    c.stats().timeouts,
                    0,
                    "{alg:?} sack={sack} recovered without RTO"
                );
                let after = c.ssthresh();
                let expect = match alg {
                    Algorithm::NewReno => 0.5,
                    Algorithm::Cubic => 0.7,
                };
                let ratio = after as f64 / before as f64;
                assert!(
                    (ratio - expect).abs() < 0.15,
                    "{alg:?}: ssthresh {after} after cwnd {before}"
                );
            }
        }
    }

    #[test]
    fn rto_recovers_from_tail_loss_with_backoff() {
        let (mut c, mut s, mut now) = established(cfg(), cfg());
        c.send(&[1u8; 3000]);
        // Lose everything the client sends for a while.
        let mut lost = 0;
        let until = now + Duration::from_secs(3);
        run(
            &mut c,
            &mut s,
            &mut now,
            Duration::from_micros(10),
            |from_c, w| {
                let _ = w;
                if from_c && lost < 3 {
                    lost += 1;
                    return false;
                }
                true
            },
        );
        let _ = until;
        assert!(c.stats().timeouts >= 1);
        assert_eq!(read_all(&mut s), vec![1u8; 3000]);
        assert_eq!(c.in_flight(), 0);
    }

    #[test]
    fn delayed_ack_acks_every_second_segment_or_on_timer() {
        let dcfg = TcpConfig {
            delayed_ack: Some(Duration::from_millis(40)),
            ..TcpConfig::default()
        };
        let (mut c, mut s, now) = established(cfg(), dcfg);
        c.send(&[7u8; 1460]);
        for w in drain(&mut c, now) {
            s.on_segment(now, &w.seg());
        }
        // One segment: no ACK yet, the timer is set.
        assert!(drain(&mut s, now).is_empty());
        assert_eq!(s.poll_at(), Some(now + Duration::from_millis(40)));
        assert_eq!(drain(&mut s, now + Duration::from_millis(40)).len(), 1);
        // Two full segments: ACK at once.
        c.send(&[7u8; 2920]);
        let now2 = now + Duration::from_millis(50);
        for w in drain(&mut c, now2) {
            s.on_segment(now2, &w.seg());
        }
        assert_eq!(drain(&mut s, now2).len(), 1);
    }

    #[test]
    fn nagle_holds_small_segments_while_data_is_unacked() {
        let (mut c, _s, now) = established(
            TcpConfig {
                nagle: true,
                ..cfg()
            },
            cfg(),
        );
        c.send(b"a");
        assert_eq!(drain(&mut c, now).len(), 1);
        c.send(b"b");
        assert!(drain(&mut c, now).is_empty(), "Nagle waits for the ACK");
        let (mut c2, _s2, now2) = established(
            TcpConfig {
                nagle: false,
                ..cfg()
            },
            cfg(),
        );
        c2.send(b"a");
        drain(&mut c2, now2);
        c2.send(b"b");
        assert_eq!(drain(&mut c2, now2).len(), 1, "no Nagle: sent at once");
    }

    #[test]
    fn nodelay_and_cork_per_connection() {
        let (mut c, _s, now) = established(cfg(), cfg());
        // TCP_NODELAY switched on at run time.
        c.set_nagle(false);
        c.send(b"a");
        drain(&mut c, now);
        c.send(b"b");
        assert_eq!(drain(&mut c, now).len(), 1, "no Nagle: sent at once");
        // Corked: small writes wait; a full segment goes; uncorking sends the rest.
        c.set_cork(true);
        c.send(b"cd");
        assert!(drain(&mut c, now).is_empty(), "corked");
        c.send(&vec![7u8; c.mss()]);
        let full = drain(&mut c, now);
        assert_eq!(full.len(), 1);
        assert_eq!(full[0].payload.len(), c.max_payload());
        c.set_cork(false);
        let rest = drain(&mut c, now);
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].payload.len(), 2 + c.mss() - c.max_payload());
    }

    #[test]
    fn nagle_does_not_hold_a_lost_small_tail_after_rto() {
        let (mut c, mut s, mut now) = established(
            TcpConfig {
                nagle: true,
                ..cfg()
            },
            cfg(),
        );
        // 1448 + 1448 + a small tail of 1104 that Nagle holds until the ACK;
        // the tail's first transmission is lost.
        let data: Vec<u8> = (0..4000u32).map(|i| i as u8).collect();
        assert_eq!(c.send(&data), 4000);
        let mut lost = 0;
        run(
            &mut c,
            &mut s,
            &mut now,
            Duration::from_micros(100),
            |from_c, w| {
                if from_c && w.out.payload_len == 1104 && lost == 0 {
                    lost += 1;
                    return false;
                }
                true
            },
        );
        assert_eq!(lost, 1);
        assert_eq!(read_all(&mut s), data);
        assert_eq!(c.send_queued(), 0, "everything acknowledged");
        assert!(c.stats.timeouts >= 1 && c.stats.retransmits >= 1);
    }

    #[test]
    fn old_timestamps_are_rejected_paws() {
        let (mut c, _s, now) = established(cfg(), cfg());
        let mut w = Wire {
            out: Outgoing::from(Header {
                seq: c.rcv_nxt,
                ack: Some(c.snd_una),
                window: 1000,
                timestamp: Some((c.ts_recent.wrapping_sub(1000), 0)),
                ..Header::default()
            }),
            payload: b"stale".to_vec(),
        };
        c.on_segment(now, &w.seg());
        assert_eq!(c.recv_available(), 0);
        w.out.hdr.timestamp = Some((c.ts_recent.wrapping_add(1), 0));
        c.on_segment(now, &w.seg());
        assert_eq!(c.recv_available(), 5);
    }

    #[test]
    fn abort_sends_rst() {
        let (mut c, mut s, now) = established(cfg(), cfg());
        c.abort();
        let out = drain(&mut c, now);
        assert!(out[0].out.hdr.rst);
        s.on_segment(now, &out[0].seg());
        assert_eq!(s.error(), Some(ConnError::Reset));
    }

    #[test]
    fn receiver_sws_avoidance_waits_for_a_useful_window() {
        let small = TcpConfig {
            recv_buffer: 16_384,
            recv_buffer_max: 16_384,
            ..cfg()
        };
        let (mut c, mut s, mut now) = established(cfg(), small);
        c.send(&vec![1u8; 40_000]);
        run(
            &mut c,
            &mut s,
            &mut now,
            Duration::from_micros(50),
            |_, _| true,
        );
        assert_eq!(s.recv_available(), 16_384);
        // Reading less than an MSS must not announce a tiny window.
        let mut buf = [0u8; 500];
        s.recv(&mut buf);
        assert!(
            drain(&mut s, now).is_empty(),
            "no window update for 500 bytes"
        );
        // Reading past half the buffer does.
        let mut big = vec![0u8; 8000];
        s.recv(&mut big);
        let upd = drain(&mut s, now);
        assert_eq!(upd.len(), 1);
        assert!(usize::from(upd[0].out.hdr.window) << s.rcv_wscale >= 8000);
    }

    proptest::proptest! {
        /// Acceptability agrees with the RFC's inequalities computed in
        /// unwrapped 64-bit space, wherever the window sits in sequence space.
        #[test]
        fn acceptance_matches_unwrapped_model(
            base in proptest::prelude::any::<u32>(),
            rel in -70_000i64..70_000,
            len in 0usize..3000,
            wnd in proptest::prop_oneof![proptest::strategy::Just(0usize), 1usize..65_536],
        ) {
            let rcv_nxt = Seq(base);
            let seq = Seq((i64::from(base) + rel).rem_euclid(1 << 32) as u32);
            let (nxt, w) = (0i64, wnd as i64);
            let first = rel;
            let last = rel + len as i64 - 1;
            let inside = |x: i64| nxt <= x && x < nxt + w;
            let model = match (len, wnd) {
                (0, 0) => first == nxt,
                (0, _) => inside(first),
                (_, 0) => false,
                _ => inside(first) || inside(last),
            };
            proptest::prop_assert_eq!(segment_acceptable(seq, len, rcv_nxt, wnd), model);
        }
    }
}
