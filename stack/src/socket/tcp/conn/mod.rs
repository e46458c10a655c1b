//! One TCP connection (RFC 9293): the state machine, sans-IO.
//!
//! Input: [`TcpConn::on_segment`] with a parsed [`Segment`] and `now`.
//! Output: [`TcpConn::poll_transmit`] returns the next segment to send as an
//! [`Outgoing`] header plus a range of the send buffer, which the caller
//! copies straight into the device buffer with [`TcpConn::copy_payload`].
//! Timers: [`TcpConn::poll_at`] and [`TcpConn::on_timer`].
//!
//! The connection's `impl` is split by concern: this file holds the state
//! (grouped as send and receive sequence space, options, recovery, timers,
//! liveness and what is owed to the peer), opening and accessors;
//! `input` processes arriving segments (RFC 9293 3.10.7), `output` decides
//! what to send, `timers` holds the `TimerTable` and what expiry
//! does, `api` the app-facing calls, `tuning` receive-buffer autotuning
//! and the window we advertise, and `chrono` the times `tcp_info` reports.

mod api;
mod chrono;
mod ecn;
mod input;
mod loss;
mod output;
mod timers;
mod tuning;
mod tx_stamps;
mod undo;

#[cfg(test)]
mod tests;

use core::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;

use super::buffer::{RecvBuffer, SendBuffer};
use super::cc::{CongestionControl, new_controller_with};
use super::config::MAX_WSCALE;
pub use super::config::{Ecn, KeepAlive, TcpConfig};
use super::fastopen;
use super::rack::Rack;
use super::rtt::RttEstimator;
use super::scoreboard::Scoreboard;
pub use super::segment::{Header, Outgoing, Segment};
use super::seq::Seq;
use crate::error::ConnError;
pub use crate::stats::ConnStats;
use crate::time::Instant;
pub use chrono::ConnTimes;
use chrono::{Chrono, Limit};
pub use input::segment_acceptable;
use timers::TimerTable;
use tuning::RcvTune;
pub use tx_stamps::{MAX_STAMPS, TxStamp, TxStampKind};

/// RFC 9293 connection states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
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
        self.tail_loss_probes += o.tail_loss_probes;
        self.timeouts += o.timeouts;
        self.dup_acks += o.dup_acks;
        self.zero_window_probes += o.zero_window_probes;
        self.keepalive_probes += o.keepalive_probes;
        self.challenge_acks += o.challenge_acks;
        self.ooo_dropped += o.ooo_dropped;
        self.bad_segments += o.bad_segments;
        self.pmtu_reductions += o.pmtu_reductions;
        self.ecn_reductions += o.ecn_reductions;
        self.undos += o.undos;
    }
}

/// A snapshot of one connection for telemetry and tests.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConnInfo {
    /// Our address and port.
    pub local: SocketAddr,
    /// The peer's address and port.
    pub remote: SocketAddr,
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
    /// Timestamps (RFC 7323) in use on the connection.
    pub timestamps: bool,
    /// SACK (RFC 2018) in use on the connection.
    pub sack: bool,
    /// Window scale shifts (ours to send, ours to receive); (0, 0) without
    /// window scaling.
    pub wscale: (u8, u8),
    /// In fast recovery (RFC 6675 / 6582) now.
    pub recovering: bool,
    /// Where loss recovery and congestion response stand (Linux's
    /// `tcpi_ca_state`).
    pub ca_state: CaState,
    /// ECN (RFC 3168) negotiated on the connection.
    pub ecn: bool,
    /// ECN-capable or congestion-marked segments came from the peer.
    pub ecn_seen: bool,
    /// Bytes in flight counted lost (RFC 6675's SACK count or RACK's
    /// time), retransmitted or not.
    pub lost: usize,
    /// Bytes in flight the peer SACKed.
    pub sacked: usize,
    /// Bytes retransmitted in this recovery and not yet delivered.
    pub retrans: usize,
    /// How far, in segments, deliveries were seen out of order (at least
    /// 3; Linux's `tcpi_reordering`).
    pub reordering: usize,
    /// How many times deliveries were seen out of order (Linux's
    /// `tcpi_reord_seen`).
    pub reord_seen: u32,
    /// The most payload one segment of ours carries: the MSS less the
    /// options every segment bears (timestamps), bytes (Linux's
    /// `mss_cache`).
    pub max_payload: usize,
    /// Opened by TCP Fast Open with data in the SYN, which was accepted
    /// (RFC 7413; Linux's `TCPI_OPT_SYN_DATA`).
    pub syn_data: bool,
    /// The connection's counters.
    pub stats: ConnStats,
}

/// Where a sender stands in loss recovery and congestion response, as
/// Linux names it (`tcpi_ca_state`, `enum tcp_ca_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum CaState {
    /// Nothing wrong.
    Open,
    /// Duplicate ACKs or SACKs seen, no loss concluded yet.
    Disorder,
    /// The window is being reduced for an ECN echo (RFC 3168).
    Cwr,
    /// Fast recovery (RFC 6675, RFC 6582).
    Recovery,
    /// Going back after a retransmission timeout.
    Loss,
}

impl CaState {
    /// Linux's number for the state (`TCP_CA_Open` 0 .. `TCP_CA_Loss` 4).
    pub fn linux(self) -> u8 {
        self as u8
    }
}

/// ECN (RFC 3168) on a connection.
#[derive(Debug, Default, Clone, Copy)]
struct EcnState {
    /// Negotiated (before the SYN-ACK, on a client: asked for).
    ok: bool,
    /// Receiver: a segment came marked CE; every segment we send carries
    /// ECE until one of the peer's carries CWR (6.1.3).
    echo: bool,
    /// Sender: CWR goes on the next new data segment (6.1.2).
    cwr_owed: bool,
    /// ECT or CE came from the peer (Linux's `TCPI_OPT_ECN_SEEN`).
    seen: bool,
}

/// Duplicate ACKs (or SACKed segments above a hole) that signal a loss.
const DUP_THRESH: usize = 3;
/// RFC 9293: the default MSS when the peer sends none.
const DEFAULT_MSS: usize = 536;

/// One TCP connection.
#[derive(Debug)]
pub struct TcpConn {
    cfg: TcpConfig,
    state: State,
    local: SocketAddr,
    remote: SocketAddr,
    error: Option<ConnError>,
    /// Send sequence space and the send buffer.
    snd: SendSpace,
    /// Receive sequence space and the receive buffer.
    rcv: RecvSpace,
    /// Options negotiated on the handshake, and their per-segment state.
    opts: Options,
    /// Loss recovery, RTT and congestion control.
    rec: Recovery,
    /// Retransmission, persist, delayed-ACK, FIN-WAIT-2 and TIME-WAIT deadlines.
    timers: TimerTable,
    /// Persist timer backoff: zero-window probes sent in a row.
    persist_backoff: u32,
    /// The app closed the connection entirely ([`TcpConn::release`]): it
    /// reads nothing more, so new data is answered with RST.
    orphaned: bool,
    /// Keepalive and user timeout.
    live: Liveness,
    /// What to send next.
    owed: Owed,
    /// TCP Fast Open (RFC 7413) on the server side.
    fast_open: FastOpenConn,
    /// Raise WRITABLE on every ACK that frees send-buffer space, not only
    /// past the low-water mark ([`TcpConn::set_ack_events`]).
    ack_events: bool,
    /// When it last sent and received, and what held the sender back.
    chrono: Chrono,
    /// The last ICMP error about the connection while it was synchronized
    /// (a soft error, RFC 1122 4.2.3.9): the error it ends with if its
    /// retransmissions run out.
    soft_error: Option<ConnError>,
    /// Transmit timestamps asked for and taken (`SO_TIMESTAMPING`).
    tx_stamps: tx_stamps::TxStamps,
    /// ECN (RFC 3168).
    ecn: EcnState,
    stats: ConnStats,
}

/// A passive connection's Fast Open state.
#[derive(Debug, Default)]
struct FastOpenConn {
    /// The cookie our SYN-ACK gives the client, and whether in the
    /// experimental option.
    synack_cookie: Option<(fastopen::Cookie, bool)>,
    /// Client: the Fast Open option our SYN carries (a cookie, with the
    /// data queued by then; or a request for one).
    syn_cookie: Option<fastopen::Cookie>,
    /// Client with a cookie: the SYN waits for the app's first write, to
    /// carry its data (Linux's `TCP_FASTOPEN_CONNECT`).
    deferred: bool,
    /// Opened by Fast Open: handed to the app in SYN-RECEIVED, where it
    /// may send data before the handshake completes.
    child: bool,
    /// The SYN's data was taken.
    syn_data: bool,
}

/// The send sequence space (RFC 9293 3.3.1) and what feeds it.
#[derive(Debug)]
struct SendSpace {
    iss: Seq,
    una: Seq,
    nxt: Seq,
    /// Highest sequence number sent (`nxt` may go back after a timeout).
    max: Seq,
    wnd: usize,
    max_wnd: usize,
    wl1: Seq,
    wl2: Seq,
    wscale: u8,
    /// Sequence number of the first byte in `buf`.
    data_start: Seq,
    buf: SendBuffer,
    /// The app has closed its sending side: a FIN follows the data.
    fin_queued: bool,
    /// TCP_CORK: hold partial segments of new data.
    corked: bool,
    /// `MSG_MORE` on the last send: its tail is held as under TCP_CORK
    /// until a send without it or the next ACK.
    more: bool,
    /// Send what is queued now, past cork and Nagle, once (setting
    /// `TCP_NODELAY`: Linux's `TCP_NAGLE_PUSH`).
    push: bool,
    /// The app queued data with nothing in flight: the next transmit
    /// looks whether the sender was idle long enough to restart its
    /// window (Linux looks when a write adds data, not at each send).
    wrote_when_idle: bool,
    /// Ends of records (`MSG_EOR`): sequence numbers just past a record's
    /// last byte, in order. No segment, new or retransmitted, carries
    /// bytes from both sides of one (Linux never merges across them).
    records: std::collections::VecDeque<Seq>,
    /// MSS for segments we send.
    mss: usize,
    /// Largest IP packet the port cuts into frames (TSO); 0 without.
    tso_max: usize,
}

/// The receive sequence space (RFC 9293 3.3.1) and its buffer.
#[derive(Debug)]
struct RecvSpace {
    irs: Seq,
    nxt: Seq,
    /// Right edge of the window we last advertised.
    adv: Seq,
    wscale: u8,
    buf: RecvBuffer,
    /// Peer's FIN, once seen (possibly ahead of `nxt`).
    peer_fin: Option<Seq>,
    /// Receive-window autotuning ([`TcpConn::autotune`]).
    tune: RcvTune,
}

/// Timestamps (RFC 7323) and SACK (RFC 2018) as negotiated.
#[derive(Debug)]
struct Options {
    ts_enabled: bool,
    ts_recent: u32,
    ts_offset: u32,
    last_ack_sent: Seq,
    sack_enabled: bool,
}

/// Loss recovery and congestion control.
#[derive(Debug)]
struct Recovery {
    scoreboard: Scoreboard,
    cc: Box<dyn CongestionControl>,
    rtt: RttEstimator,
    /// Segment being timed for an RTT sample (Karn: cleared on retransmit).
    rtt_probe: Option<(Seq, Instant)>,
    dupacks: usize,
    in_recovery: bool,
    recovery_point: Seq,
    /// After a retransmission timeout, `SND.MAX` then: until the ACKs
    /// pass it the sender is in Linux's Loss state (going back over the
    /// flight, the window already cut), where no fast recovery starts.
    loss_until: Option<Seq>,
    high_rxt: Seq,
    retries: u32,
    /// Tail loss probe (RFC 8985 7).
    tlp: TailProbe,
    /// How fully the sender used its window ([`TcpConn::cwnd_limited`]).
    usage: CwndUsage,
    /// When each transmission in flight left: loss by time (RACK, RFC
    /// 8985 6) and an RTT sample per ACK for the controller (HyStart).
    rack: Rack,
    /// Proportional rate reduction in recovery (RFC 6937), and in a
    /// reduction for an ECN echo.
    prr: Prr,
    /// A window reduction for an ECN echo (RFC 3168 6.1.2; Linux's CWR
    /// state) is under way until the ACKs pass this (`SND.NXT` then).
    cwr_until: Option<Seq>,
    /// What the last loss episode cut, while it may prove needless.
    undo: Option<Undo>,
    /// F-RTO (RFC 5682) judging the last timeout.
    frto: Option<Frto>,
}

/// F-RTO's state after a timeout (RFC 5682 3.1).
#[derive(Debug, Clone, Copy)]
struct Frto {
    /// `SND.MAX` at the timeout (Linux's `high_seq`).
    high: Seq,
    /// Step 2b taken: new data left after the first ACK, instead of
    /// more of the flight again; in flight is that new data alone.
    new_data: bool,
}

/// A loss episode (fast recovery, or a timeout) that may prove needless
/// (Linux's `undo_marker`, `undo_retrans`, `retrans_stamp`,
/// `prior_cwnd` and `prior_ssthresh`).
#[derive(Debug, Clone, Copy)]
struct Undo {
    /// `SND.UNA` when it began.
    marker: Seq,
    /// The window and ssthresh before it (none when it continued an ECN
    /// reduction, which a duplicate does not make needless).
    prior: Option<(usize, usize)>,
    /// Its retransmissions no D-SACK has reported yet (none before the
    /// first).
    retrans: Option<u32>,
    /// The end of what it retransmitted: a D-SACK above is not for one.
    retrans_end: Seq,
    /// The TSval of its first retransmission (Eifel, RFC 3522).
    stamp: Option<u32>,
}

/// Proportional rate reduction (RFC 6937, as Linux's
/// `tcp_cwnd_reduction`): in recovery the window is what is in flight
/// plus what each ACK allows, so the flight falls to ssthresh in
/// proportion to the deliveries instead of in one burst of silence, and
/// grows back to it by slow start when losses took it lower. Counted in
/// segments, as Linux counts.
#[derive(Debug, Default, Clone, Copy)]
struct Prr {
    /// Segments delivered (acknowledged or SACKed) since recovery began.
    delivered: usize,
    /// Segments sent since recovery began.
    out: usize,
    /// The congestion window when recovery began (RecoverFS), segments.
    prior_cwnd: usize,
    /// The window the last ACK allows, bytes (in flight then plus its
    /// send quota).
    window: usize,
}

/// How fully the sender used the congestion window over the last window
/// of data, as Linux tracks it (`tcp_cwnd_validate`): the window grows on
/// an ACK only when it limited the sender (RFC 7661's aim; Linux's rule,
/// which packetdrill's slow-start scripts assert): it did in this window,
/// or in slow start, it is under twice the most that was in flight.
#[derive(Debug, Clone, Copy)]
struct CwndUsage {
    /// The window held data back in the window of data now in flight.
    limited: bool,
    /// The most bytes in flight over that window.
    max_out: usize,
    /// Where that window ends (`SND.NXT` when it began): once it is
    /// acknowledged, the next send starts a new one.
    until: Seq,
}

/// The tail loss probe's state (RFC 8985 7).
#[derive(Debug, Default)]
struct TailProbe {
    /// The probe timer expired: a probe is owed.
    owed: bool,
    /// A probe is out: `SND.NXT` when it left (Linux's `tlp_high_seq`).
    high: Option<Seq>,
    /// The probe sent was a retransmission (not new data).
    retrans: bool,
}

/// Keepalive (RFC 1122 4.2.3.6) and the user timeout (RFC 5482): their
/// deadlines follow from these ([`TcpConn::poll_at`]).
#[derive(Debug)]
struct Liveness {
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
}

/// Segments owed to the peer, sent on the next [`TcpConn::poll_transmit`].
#[derive(Debug)]
struct Owed {
    ack_now: bool,
    /// Duplicate ACKs owed: one per out-of-order segment (RFC 5681 4.2),
    /// even when a burst of them is processed before we transmit.
    dupacks_owed: u32,
    /// Full-size segments received since our last ACK (ACK every second one).
    unacked_segs: u32,
    /// Quick-ACK mode, as Linux's: in-order segments still to be ACKed at
    /// once. Set when the first data arrives and again after an idle RTO,
    /// to min(16, window / 2 MSS) (at least 2), so the peer's slow start
    /// is not held back by delayed ACKs; each ACK sent uses one.
    quick_acks: u32,
    /// When in-order data last arrived.
    last_data: Option<Instant>,
    /// Interactive (Linux's "pingpong"): we sent data within the
    /// delayed-ACK time of receiving some, so ACKs wait to ride on the
    /// replies, quick-ACK mode or not; a delayed ACK that had to fire
    /// ends it.
    pingpong: bool,
    send_syn: bool,
    rst_pending: Option<(Seq, Option<Seq>)>,
    probe_pending: bool,
    challenge_tokens: u32,
    challenge_second: u64,
    /// Reused for SACK blocks so building an ACK never allocates.
    sack_scratch: Vec<(usize, usize)>,
    /// A duplicate the peer sent (RFC 2883 D-SACK): reported as the first
    /// SACK block of the next ACK, which goes at once.
    dsack: Option<(Seq, Seq)>,
}

/// The offset of a connection's TSval clock until the table sets the one
/// keyed by its 4-tuple ([`TcpConn::set_ts_offset`]): derived from the ISN.
fn ts_offset(iss: Seq) -> u32 {
    iss.0.rotate_left(13)
}

impl TcpConn {
    fn new(cfg: TcpConfig, local: SocketAddr, remote: SocketAddr, iss: Seq, state: State) -> Self {
        let mss = cfg.mss.max(64);
        TcpConn {
            state,
            local,
            remote,
            error: None,
            snd: SendSpace {
                iss,
                una: iss,
                nxt: iss,
                max: iss,
                wnd: 0,
                max_wnd: 0,
                wl1: Seq(0),
                wl2: Seq(0),
                wscale: 0,
                data_start: iss + 1,
                buf: SendBuffer::new(cfg.send_buffer),
                fin_queued: false,
                corked: false,
                more: false,
                wrote_when_idle: false,
                push: false,
                records: std::collections::VecDeque::new(),
                mss,
                tso_max: 0,
            },
            rcv: RecvSpace {
                irs: Seq(0),
                nxt: Seq(0),
                adv: Seq(0),
                wscale: cfg.rcv_wscale(),
                buf: RecvBuffer::new(cfg.recv_buffer, cfg.max_ooo_ranges),
                peer_fin: None,
                tune: RcvTune::default(),
            },
            opts: Options {
                ts_enabled: false,
                ts_recent: 0,
                ts_offset: ts_offset(iss),
                last_ack_sent: Seq(0),
                sack_enabled: false,
            },
            rec: Recovery {
                scoreboard: Scoreboard::new(),
                cc: new_controller_with(cfg.congestion, mss, cfg.hystart_plus_plus),
                rtt: RttEstimator::new(cfg.rtt.clone()),
                rtt_probe: None,
                dupacks: 0,
                in_recovery: false,
                recovery_point: iss,
                loss_until: None,
                high_rxt: iss,
                retries: 0,
                tlp: TailProbe::default(),
                usage: CwndUsage {
                    limited: false,
                    max_out: 0,
                    until: iss,
                },
                rack: Rack::new(),
                prr: Prr::default(),
                cwr_until: None,
                undo: None,
                frto: None,
            },
            timers: TimerTable::default(),
            persist_backoff: 0,
            orphaned: false,
            live: Liveness {
                keepalive: None,
                last_rx: Instant::ZERO,
                ka_probes: 0,
                ka_last_probe: Instant::ZERO,
                ka_pending: false,
                user_timeout: None,
                unacked_since: None,
            },
            owed: Owed {
                ack_now: false,
                dupacks_owed: 0,
                unacked_segs: 0,
                quick_acks: 0,
                last_data: None,
                pingpong: false,
                send_syn: true,
                rst_pending: None,
                probe_pending: false,
                challenge_tokens: cfg.challenge_ack_limit,
                challenge_second: 0,
                sack_scratch: Vec::with_capacity(3),
                dsack: None,
            },
            fast_open: FastOpenConn::default(),
            soft_error: None,
            ack_events: false,
            chrono: Chrono::default(),
            tx_stamps: tx_stamps::TxStamps::default(),
            ecn: EcnState::default(),
            stats: ConnStats::default(),
            cfg,
        }
    }

    /// Active open: a SYN goes out on the next poll.
    pub fn connect(cfg: TcpConfig, local: SocketAddr, remote: SocketAddr, iss: Seq) -> Self {
        Self::new(cfg, local, remote, iss, State::SynSent)
    }

    /// Passive open from a listener that received `syn`: a SYN-ACK goes out on the next poll.
    pub fn accept(
        cfg: TcpConfig,
        local: SocketAddr,
        remote: SocketAddr,
        iss: Seq,
        syn: &Segment<'_>,
    ) -> Self {
        let mut c = Self::new(cfg, local, remote, iss, State::SynReceived);
        c.take_syn_options(syn);
        c.rcv.irs = syn.hdr.seq;
        c.rcv.nxt = syn.hdr.seq + 1;
        c.rcv.adv = c.rcv.nxt;
        c.snd.wnd = usize::from(syn.hdr.window);
        c.snd.max_wnd = c.snd.wnd;
        c.snd.wl1 = syn.hdr.seq;
        c
    }

    /// Passive open by TCP Fast Open (RFC 7413): the SYN's data is taken
    /// (and acknowledged by the SYN-ACK), and the connection may be handed
    /// to the app now, in SYN-RECEIVED.
    pub fn accept_fast_open(
        cfg: TcpConfig,
        local: SocketAddr,
        remote: SocketAddr,
        iss: Seq,
        syn: &Segment<'_>,
    ) -> Self {
        let mut c = Self::accept(cfg, local, remote, iss, syn);
        let out = c.rcv.buf.write_at(0, syn.payload);
        c.rcv.nxt += out.advanced;
        c.rcv.adv = c.rcv.nxt;
        c.stats.bytes_in += out.advanced as u64;
        c.fast_open.child = true;
        c.fast_open.syn_data = out.advanced > 0;
        c
    }

    /// Our SYN-ACK gives the client a Fast Open cookie (it asked for one,
    /// or sent one that is not valid), in the experimental option if `exp`.
    pub fn offer_fast_open_cookie(&mut self, cookie: [u8; fastopen::COOKIE_LEN], exp: bool) {
        self.fast_open.synack_cookie = fastopen::Cookie::new(&cookie).map(|c| (c, exp));
    }

    /// Open by TCP Fast Open as a client (RFC 7413 3), before the SYN
    /// left: with the server's `cookie`, the SYN waits for the app's first
    /// write and carries its data (returns true: the app may write now);
    /// without, it leaves as it would, asking for a cookie. False and
    /// nothing done once the SYN left or outside SYN-SENT.
    pub fn use_fast_open(&mut self, cookie: Option<fastopen::Cookie>) -> bool {
        if self.state != State::SynSent || !self.owed.send_syn || self.rec.retries > 0 {
            return false;
        }
        self.fast_open.syn_cookie = Some(cookie.unwrap_or(fastopen::Cookie::REQUEST));
        self.fast_open.deferred = cookie.is_some();
        if self.fast_open.deferred {
            self.owed.send_syn = false;
        }
        self.fast_open.deferred
    }

    /// Whether our SYN carried a Fast Open option (the SYN-ACK's cookie
    /// is then ours to keep).
    pub fn asked_fast_open(&self) -> bool {
        self.fast_open.syn_cookie.is_some()
    }

    /// Opened by Fast Open and still in SYN-RECEIVED.
    pub fn fast_open_pending(&self) -> bool {
        self.fast_open.child && self.state == State::SynReceived
    }

    fn take_syn_options(&mut self, syn: &Segment<'_>) {
        self.snd.mss = self
            .cfg
            .mss
            .min(syn.hdr.mss.map_or(DEFAULT_MSS, usize::from))
            .max(64);
        self.rec.cc.set_mss(self.snd.mss);
        match syn.hdr.wscale {
            Some(s) if self.cfg.window_scaling => self.snd.wscale = s.min(MAX_WSCALE),
            _ => {
                self.snd.wscale = 0;
                self.rcv.wscale = 0;
            }
        }
        self.opts.sack_enabled = self.cfg.sack && syn.hdr.sack_permitted;
        self.ecn_on_syn(syn);
        if let (true, Some((tsval, _))) = (self.cfg.timestamps, syn.hdr.timestamp) {
            self.opts.ts_enabled = true;
            self.opts.ts_recent = tsval;
        } else {
            self.opts.ts_enabled = false;
        }
    }

    /// Tell the app of every ACK that frees send-buffer space (a WRITABLE
    /// event each time), for an app that tracks what the peer has
    /// acknowledged (Linux's `MSG_ZEROCOPY` completions), not only when
    /// the free space climbs past the low-water mark.
    pub fn set_ack_events(&mut self, on: bool) {
        self.ack_events = on;
    }

    /// Whether [`set_ack_events`](Self::set_ack_events) is on.
    pub fn ack_events(&self) -> bool {
        self.ack_events
    }

    /// `TCP_MAXSEG`: announce (if our SYN is still to go) and send
    /// segments of at most `mss` bytes; never raises what was agreed.
    pub fn clamp_mss(&mut self, mss: usize) {
        let mss = mss.max(64);
        self.cfg.mss = self.cfg.mss.min(mss);
        if self.snd.mss > mss {
            self.snd.mss = mss;
            self.rec.cc.set_mss(mss);
        }
    }

    /// The final ACK of a SYN-cookie handshake arrived: the connection is
    /// established without ever having been in SYN-RECEIVED here.
    pub fn cookie_established(&mut self) {
        self.owed.send_syn = false;
        self.snd.nxt = self.snd.iss + 1;
        self.snd.max = self.snd.nxt;
    }

    /// RFC 9293 state.
    pub fn state(&self) -> State {
        self.state
    }

    /// Our address and port.
    pub fn local(&self) -> SocketAddr {
        self.local
    }

    /// The peer's address and port.
    pub fn remote(&self) -> SocketAddr {
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
        self.rec.cc.cwnd()
    }

    /// Slow-start threshold, bytes.
    pub fn ssthresh(&self) -> usize {
        self.rec.cc.ssthresh()
    }

    /// The peer's advertised receive window (scaled), bytes.
    pub fn snd_wnd(&self) -> usize {
        self.snd.wnd
    }

    /// MSS for segments we send, bytes (payload per frame, before options).
    pub fn mss(&self) -> usize {
        self.snd.mss
    }

    /// Bytes one idle connection with `cfg` occupies: the struct and its
    /// congestion controller (the demux entry and timer slot aside). Its
    /// rings take memory only as data passes: see
    /// [`memory_bound`](Self::memory_bound).
    pub fn memory_estimate(_cfg: &TcpConfig) -> usize {
        std::mem::size_of::<TcpConn>() + 128
    }

    /// The most one connection with `cfg` can occupy: the idle estimate
    /// plus both rings at their largest (the receive ring as far as
    /// autotuning may grow it).
    pub fn memory_bound(cfg: &TcpConfig) -> usize {
        Self::memory_estimate(cfg) + cfg.send_buffer + cfg.recv_buffer.max(cfg.recv_buffer_max)
    }

    /// Bytes in flight (sent, not yet acknowledged).
    pub fn in_flight(&self) -> usize {
        self.snd.max.since(self.snd.una)
    }

    /// A snapshot of state, windows, RTT and counters (for telemetry).
    pub fn info(&self) -> ConnInfo {
        ConnInfo {
            local: self.local,
            remote: self.remote,
            state: self.state,
            cwnd: if self.reducing() {
                self.send_window()
            } else {
                self.rec.cc.cwnd()
            },
            ssthresh: self.rec.cc.ssthresh(),
            snd_wnd: self.snd.wnd,
            rcv_wnd: self.rcv.buf.window(),
            srtt_us: self.rec.rtt.srtt().map(|d| d.as_micros() as u64),
            rttvar_us: self.rec.rtt.rttvar().map(|d| d.as_micros() as u64),
            rto_us: self.rec.rtt.rto().as_micros() as u64,
            in_flight: self.in_flight(),
            send_queued: self.snd.buf.len(),
            recv_queued: self.rcv.buf.readable(),
            ooo_bytes: self.rcv.buf.ooo_bytes(),
            mss: self.snd.mss,
            congestion: self.rec.cc.name(),
            timestamps: self.opts.ts_enabled,
            sack: self.opts.sack_enabled,
            wscale: (self.snd.wscale, self.rcv.wscale),
            recovering: self.rec.in_recovery,
            ca_state: self.ca_state(),
            ecn: self.ecn.ok,
            ecn_seen: self.ecn.seen,
            lost: self.lost_bytes(),
            sacked: self.rec.scoreboard.sacked_bytes(),
            retrans: self.retrans_bytes(),
            reordering: self.rec.rack.reordering(),
            reord_seen: self.rec.rack.reord_seen(),
            max_payload: self.max_payload(),
            syn_data: self.fast_open.syn_data,
            stats: self.stats.clone(),
        }
    }

    /// When the connection last sent and received, and how long it spent
    /// sending, as of `now` (Linux's `tcp_info` times).
    pub fn times(&self, now: Instant) -> ConnTimes {
        self.chrono.at(now)
    }

    /// Nothing queued to send and nothing unacknowledged.
    fn drained(&self) -> bool {
        self.snd.buf.is_empty() && self.snd.max.diff(self.snd.una) <= 0
    }

    fn tsval(&self, now: Instant) -> u32 {
        (now.as_millis() as u32).wrapping_add(self.opts.ts_offset)
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
        self.opts.ts_offset = offset;
    }
}
