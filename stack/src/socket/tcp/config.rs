//! Per-connection TCP configuration: [`TcpConfig`] and [`KeepAlive`].
//!
//! A leaf: it names the congestion-control algorithm and the RTO bounds and
//! nothing of the connection itself, so the stack's `Config` takes it from
//! here.

use std::time::Duration;

use super::cc::Algorithm;
use super::rtt::RttConfig;

/// The largest window scale shift (RFC 7323 §2.3).
pub(crate) const MAX_WSCALE: u8 = 14;

/// Explicit Congestion Notification (RFC 3168) on new connections, as
/// Linux's `tcp_ecn` sysctl chooses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ecn {
    /// Never: our SYNs do not ask, and a peer's request is declined.
    Off,
    /// A peer's request is granted; our SYNs do not ask (Linux's
    /// default, `tcp_ecn` 2).
    #[default]
    Accept,
    /// Our SYNs ask, and a peer's request is granted (`tcp_ecn` 1).
    On,
}

/// Per-connection tuning.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    /// MSS we announce (MTU minus 40).
    pub mss: usize,
    /// Send buffer in bytes: how much the app may write ahead of the
    /// peer's acknowledgments (fixed for the connection's life).
    pub send_buffer: usize,
    /// Receive buffer a connection starts with.
    pub recv_buffer: usize,
    /// Largest receive buffer autotuning may grow a connection's to (no
    /// larger than `recv_buffer`: no autotuning). The window grows with the
    /// measured bandwidth-delay product as Linux's `tcp_rcv_space_adjust`
    /// does, within the stack's `autotune_memory`.
    pub recv_buffer_max: usize,
    /// Bytes of receive-buffer growth all connections of a stack may hold
    /// together beyond their initial buffers.
    pub autotune_memory: usize,
    /// Offer the window scale option (RFC 7323 §2) on our SYN.
    pub window_scaling: bool,
    /// Offer timestamps (RFC 7323 §3: RTT samples and PAWS) on our SYN.
    pub timestamps: bool,
    /// Offer SACK-permitted (RFC 2018) on our SYN; with the peer's consent,
    /// loss recovery follows RFC 6675.
    pub sack: bool,
    /// Nagle's algorithm (RFC 9293 3.7.4); off is TCP_NODELAY.
    pub nagle: bool,
    /// Delayed ACK timeout; `None` acknowledges every segment at once.
    pub delayed_ack: Option<Duration>,
    /// Congestion control algorithm (NewReno or CUBIC).
    pub congestion: Algorithm,
    /// Retransmission timeout bounds (RFC 6298): initial, floor, ceiling.
    pub rtt: RttConfig,
    /// TIME_WAIT length (2 MSL).
    pub time_wait: Duration,
    /// How long a connection the app closed may wait in FIN-WAIT-2 for the
    /// peer's FIN before it is reset and freed (Linux: `tcp_fin_timeout`).
    pub fin_wait2_timeout: Duration,
    /// SYN (or SYN-ACK) retransmissions before giving up.
    pub syn_retries: u32,
    /// Data retransmission timeouts in a row before giving up.
    pub max_retries: u32,
    /// Out-of-order ranges a receive buffer holds.
    pub max_ooo_ranges: usize,
    /// Challenge ACKs per second (RFC 5961 §7).
    pub challenge_ack_limit: u32,
    /// Out-of-order bytes held across all connections of a stack; beyond it
    /// the connection that grew the total drops its out-of-order data.
    pub max_ooo_total: usize,
    /// The secret TCP Fast Open cookies (RFC 7413) are made with, as
    /// SipHash-2-4's two key halves (Linux's `tcp_fastopen_key` words
    /// 0-1 and 2-3, each pair read as one little-endian 64-bit number);
    /// `None` draws one from the stack's seed. Fast Open is on per
    /// listener ([`crate::socket::tcp::Tcp::set_fast_open`]).
    pub fast_open_key: Option<(u64, u64)>,
    /// Listeners with Fast Open on take data from SYNs that carry no
    /// valid cookie too (Linux's `tcp_fastopen` bit 0x200).
    pub fast_open_no_cookie: bool,
    /// Tail loss probes (RFC 8985 7) on SACK connections: a lost last
    /// segment is sent again about two round trips after it left rather
    /// than at the retransmission timeout.
    pub tail_loss_probe: bool,
    /// RACK (RFC 8985 6) on SACK connections: a segment sent before one
    /// that was delivered is lost once a reordering window more than the
    /// round trip has passed, retransmissions included; and the window
    /// in recovery falls by proportional rate reduction (RFC 6937) rather
    /// than to ssthresh at once. Off: RFC 6675's SACK count alone, with
    /// its pipe against the reduced window.
    pub rack: bool,
    /// A sender idle for longer than its retransmission timeout starts
    /// again from at most the initial window (RFC 5681 §4.1, as Linux's
    /// `tcp_slow_start_after_idle`: the window halved per timeout of
    /// idleness, never below the initial one).
    pub slow_start_after_idle: bool,
    /// F-RTO (RFC 5682, as Linux's `tcp_frto`): after a timeout that no
    /// loss signal preceded, the first ACK lets new data out rather than
    /// the flight again, and an ACK of data sent only once then shows the
    /// timeout was needless (the window is given back).
    pub frto: bool,
    /// CUBIC leaves slow start by RFC 9406's HyStart++ (a rise of the
    /// round's smallest RTT over the last round's starts five rounds of
    /// Conservative Slow Start, undone if the RTT falls back) rather than
    /// by Linux's HyStart (the default, which packetdrill's CUBIC scripts
    /// assert: a rise over the connection's smallest RTT ends it at once).
    pub hystart_plus_plus: bool,
    /// ECN (RFC 3168): whether our SYNs ask for it and whether a peer's
    /// request is granted. On a connection that has it, new data leaves
    /// ECN-capable (ECT(0)), a congestion mark is echoed, and an echo
    /// reduces the window as a loss would, without the loss.
    pub ecn: Ecn,
}

impl TcpConfig {
    /// The window scale we announce: enough for the largest receive buffer
    /// a connection may grow to.
    pub fn rcv_wscale(&self) -> u8 {
        if self.window_scaling {
            wscale_for(self.recv_buffer.max(self.recv_buffer_max))
        } else {
            0
        }
    }
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            mss: 1460,
            send_buffer: 256 << 10,
            recv_buffer: 256 << 10,
            recv_buffer_max: 4 << 20,
            autotune_memory: 256 << 20,
            window_scaling: true,
            timestamps: true,
            sack: true,
            nagle: true,
            delayed_ack: Some(Duration::from_millis(40)),
            congestion: Algorithm::default(),
            rtt: RttConfig::default(),
            time_wait: Duration::from_secs(60),
            fin_wait2_timeout: Duration::from_secs(60),
            syn_retries: 6,
            max_retries: 15,
            max_ooo_ranges: 32,
            challenge_ack_limit: 100,
            max_ooo_total: 64 << 20,
            fast_open_key: None,
            fast_open_no_cookie: false,
            tail_loss_probe: true,
            rack: true,
            slow_start_after_idle: true,
            ecn: Ecn::default(),
            hystart_plus_plus: false,
            frto: true,
        }
    }
}

/// TCP keepalive (RFC 1122 4.2.3.6, as Linux does it): after `idle` with
/// no segment from the peer and nothing of ours in flight, a probe (an
/// empty segment one byte before `SND.UNA`, which draws an ACK) every
/// `interval`; once `count` probes went unanswered the connection is reset
/// and fails with `TimedOut`. Off by default, as on Linux (`SO_KEEPALIVE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeepAlive {
    /// Idle time before the first probe (Linux: `TCP_KEEPIDLE`, 7200 s).
    pub idle: Duration,
    /// Time between probes (`TCP_KEEPINTVL`, 75 s).
    pub interval: Duration,
    /// Unanswered probes before giving up (`TCP_KEEPCNT`, 9).
    pub count: u32,
}

impl Default for KeepAlive {
    fn default() -> Self {
        KeepAlive {
            idle: Duration::from_secs(7200),
            interval: Duration::from_secs(75),
            count: 9,
        }
    }
}

/// The window scale that lets a 16-bit window field cover `capacity` bytes.
pub(crate) fn wscale_for(capacity: usize) -> u8 {
    let mut s = 0u8;
    while s < MAX_WSCALE && (capacity >> s) > usize::from(u16::MAX) {
        s += 1;
    }
    s
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn wscale_for_buffers() {
        assert_eq!(wscale_for(65_535), 0);
        assert_eq!(wscale_for(65_536), 1);
        assert_eq!(wscale_for(1 << 20), 5);
        assert_eq!(wscale_for(usize::MAX), MAX_WSCALE);
    }
}
