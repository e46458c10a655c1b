//! Congestion control behind a small trait: NewReno (RFC 5681, RFC 6582) and
//! CUBIC (RFC 9438).
//!
//! Windows are in bytes. The connection owns loss detection and recovery
//! (which segments to resend, `pipe`); a controller only answers how large
//! the window is and reacts to ACKs, losses and timeouts.
//!
//! Both controllers share slow start with byte counting (RFC 3465 without
//! its limit L: every byte an ACK delivered, as Linux counts; the
//! connection grows the window only while it limits the sender) and start
//! from the RFC 6928 initial window.

use std::time::Duration;

use crate::time::Instant;

/// A congestion controller of one connection.
pub trait CongestionControl: core::fmt::Debug + Send {
    /// Short name of the algorithm, as [`Algorithm`] displays it.
    fn name(&self) -> &'static str;
    /// Congestion window in bytes.
    fn cwnd(&self) -> usize;
    /// Slow-start threshold in bytes.
    fn ssthresh(&self) -> usize;
    /// New data cumulatively acknowledged outside loss recovery: `acked`
    /// bytes; `rtt` is the latest RTT estimate if any; `now` lets CUBIC
    /// track its epoch.
    fn on_ack(&mut self, now: Instant, acked: usize, rtt: Option<Duration>);
    /// Loss detected by duplicate ACKs or SACK (entering fast recovery) with
    /// `flight` bytes outstanding: cut ssthresh and set cwnd to it.
    fn on_congestion(&mut self, now: Instant, flight: usize);
    /// Loss recovery ended (everything outstanding at its start is
    /// acknowledged): cwnd = ssthresh.
    fn on_recovery_end(&mut self, now: Instant);
    /// Retransmission timeout with `flight` bytes outstanding: ssthresh as
    /// on congestion, cwnd = 1 MSS (the loss window, RFC 5681 §3.1).
    fn on_timeout(&mut self, now: Instant, flight: usize);
    /// The sender's MSS changed (normally once, from the peer's SYN).
    fn set_mss(&mut self, mss: usize);
    /// The last loss episode's reduction proved needless (a D-SACK or
    /// timestamps showed the originals arrived): cwnd back to at least
    /// `cwnd`, ssthresh to at least `ssthresh`, their values before it
    /// (RFC 3708, RFC 4015; Linux's `tcp_undo_cwnd_reduction`).
    fn undo(&mut self, cwnd: usize, ssthresh: usize);
    /// An RTT sample from this ACK (the newest segment it acknowledged,
    /// never a retransmitted one), before [`on_ack`](Self::on_ack) for
    /// the same ACK; `una` and `nxt` are the connection's SND.UNA after
    /// the ACK and SND.NXT (rounds of slow start end at an `nxt`).
    fn on_rtt_sample(&mut self, _now: Instant, _rtt: Duration, _una: u32, _nxt: u32) {}
    /// The sender sends again after `idle` with nothing in flight, more
    /// than one retransmission timeout `rto`: the window restarts
    /// (RFC 5681 §4.1 as Linux's `tcp_cwnd_restart`).
    fn restart_after_idle(&mut self, idle: Duration, rto: Duration);
    /// Whether in slow start (cwnd < ssthresh).
    fn in_slow_start(&self) -> bool {
        self.cwnd() < self.ssthresh()
    }
}

/// Which controller a connection uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Algorithm {
    /// NewReno: halve on loss, one segment per round trip in avoidance.
    NewReno,
    /// CUBIC (RFC 9438), the default.
    #[default]
    Cubic,
}

/// A congestion-control name that [`Algorithm`] does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown congestion control {0:?} (expected newreno, reno or cubic)")]
pub struct UnknownAlgorithm(pub String);

impl core::str::FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    /// `newreno` or `reno`, and `cubic`, in any case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim();
        if name.eq_ignore_ascii_case("newreno") || name.eq_ignore_ascii_case("reno") {
            Ok(Algorithm::NewReno)
        } else if name.eq_ignore_ascii_case("cubic") {
            Ok(Algorithm::Cubic)
        } else {
            Err(UnknownAlgorithm(s.to_owned()))
        }
    }
}

impl core::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Algorithm::NewReno => "newreno",
            Algorithm::Cubic => "cubic",
        })
    }
}

/// A controller of kind `alg` for a sender with this MSS.
pub fn new_controller(alg: Algorithm, mss: usize) -> Box<dyn CongestionControl> {
    new_controller_with(alg, mss, false)
}

/// [`new_controller`]; with `hystart_plus_plus`, CUBIC leaves slow start
/// by RFC 9406's HyStart++ rather than Linux's HyStart.
pub fn new_controller_with(
    alg: Algorithm,
    mss: usize,
    hystart_plus_plus: bool,
) -> Box<dyn CongestionControl> {
    match alg {
        Algorithm::NewReno => Box::new(NewReno::new(mss)),
        Algorithm::Cubic => {
            let mut c = Cubic::new(mss);
            c.hystart.plus_plus = hystart_plus_plus;
            Box::new(c)
        }
    }
}

/// The RFC 6928 initial window: min(10 MSS, max(2 MSS, 14600 bytes)).
pub fn initial_window(mss: usize) -> usize {
    let mss = mss.clamp(1, MAX_MSS);
    (10 * mss).min((2 * mss).max(14_600))
}

/// "Infinite" ssthresh and the ceiling of cwnd: far above any real window,
/// far enough below `usize::MAX` that sums of a few windows cannot overflow.
const UNLIMITED: usize = usize::MAX >> 4;

/// The largest MSS taken (the MSS option is 16 bits); keeps window
/// arithmetic far from overflow.
const MAX_MSS: usize = u16::MAX as usize;

/// Window state and arithmetic shared by both controllers.
#[derive(Debug, Clone)]
struct Window {
    mss: usize,
    cwnd: usize,
    ssthresh: usize,
    /// Bytes acknowledged in congestion avoidance toward the next +1 MSS.
    ca_acked: usize,
    /// Nothing has happened yet: an MSS change re-derives the initial window.
    fresh: bool,
    /// The window was already cut for the current loss episode (a loss or
    /// timeout with no new data acknowledged since): a further timeout keeps
    /// ssthresh (RFC 5681 §3.1: a segment retransmitted by the timer more
    /// than once does not lower it again).
    cut: bool,
}

impl Window {
    fn new(mss: usize) -> Self {
        let mss = mss.clamp(1, MAX_MSS);
        Window {
            mss,
            cwnd: initial_window(mss),
            ssthresh: UNLIMITED,
            ca_acked: 0,
            fresh: true,
            cut: false,
        }
    }

    fn in_slow_start(&self) -> bool {
        self.cwnd < self.ssthresh
    }

    /// Note an ACK of new data (ends the loss episode).
    fn acked(&mut self) {
        self.fresh = false;
        self.cut = false;
    }

    /// Slow start: cwnd += delivered, not past ssthresh: every segment a
    /// stretch ACK covers counts (RFC 3465 without its limit L, as Linux
    /// grows it; the growth is kept in check by growing only while the
    /// window limits the sender, `TcpConn::cwnd_limited`). Returns
    /// the bytes of this ACK left over for congestion avoidance once cwnd
    /// reaches ssthresh (zero while still in slow start).
    fn slow_start(&mut self, acked: usize) -> usize {
        let room = self.ssthresh.saturating_sub(self.cwnd);
        let inc = acked;
        if inc < room {
            self.cwnd += inc;
            0
        } else {
            self.cwnd = self.ssthresh;
            acked - room
        }
    }

    /// Congestion avoidance by byte counting (RFC 5681 §3.1, RFC 3465 §2.1):
    /// exactly one MSS per cwnd of acknowledged bytes.
    fn avoid(&mut self, acked: usize) {
        self.ca_acked = self.ca_acked.saturating_add(acked);
        if self.ca_acked >= self.cwnd {
            let steps = self.ca_acked / self.cwnd;
            self.ca_acked -= steps * self.cwnd;
            self.cwnd = self
                .cwnd
                .saturating_add(steps.saturating_mul(self.mss))
                .min(UNLIMITED);
        }
    }

    /// Set ssthresh (at least 2 MSS), and cwnd to it, or to one segment
    /// (the loss window) after a timeout.
    fn reduce(&mut self, ssthresh: usize, loss_window: bool) {
        self.ssthresh = ssthresh.clamp(2 * self.mss, UNLIMITED);
        self.cwnd = if loss_window { self.mss } else { self.ssthresh };
        self.ca_acked = 0;
        self.fresh = false;
        self.cut = true;
    }

    /// Back to at least the window and threshold before a needless cut.
    fn undo(&mut self, cwnd: usize, ssthresh: usize) {
        self.cwnd = self.cwnd.max(cwnd).min(UNLIMITED);
        self.ssthresh = self.ssthresh.max(ssthresh).min(UNLIMITED);
        self.ca_acked = 0;
        self.cut = false;
    }

    /// After idle time: ssthresh at least 3/4 of cwnd (Linux's
    /// `tcp_current_ssthresh`), then cwnd halved per `rto` of `idle`
    /// beyond the first, not below the initial window (nor raised to it).
    fn restart_after_idle(&mut self, idle: Duration, rto: Duration) {
        let restart = initial_window(self.mss).min(self.cwnd);
        self.ssthresh = self.ssthresh.max(self.cwnd / 2 + self.cwnd / 4);
        let mut cwnd = self.cwnd;
        let mut left = idle;
        while left > rto && cwnd > restart && !rto.is_zero() {
            left -= rto;
            cwnd /= 2;
        }
        self.cwnd = cwnd.max(restart);
        self.ca_acked = 0;
    }

    fn set_mss(&mut self, mss: usize) {
        let mss = mss.clamp(1, MAX_MSS);
        if self.fresh {
            *self = Window::new(mss);
            return;
        }
        self.mss = mss;
        self.cwnd = self.cwnd.clamp(mss, UNLIMITED);
        self.ssthresh = self.ssthresh.clamp(2 * mss, UNLIMITED);
    }
}

/// NewReno (RFC 5681, RFC 6582): slow start, one MSS per round trip in
/// congestion avoidance, half the flight on loss, one segment on timeout.
#[derive(Debug, Clone)]
pub struct NewReno {
    w: Window,
}

impl NewReno {
    /// A controller at the initial window for this MSS.
    pub fn new(mss: usize) -> Self {
        NewReno {
            w: Window::new(mss),
        }
    }
}

impl CongestionControl for NewReno {
    fn name(&self) -> &'static str {
        "newreno"
    }

    fn cwnd(&self) -> usize {
        self.w.cwnd
    }

    fn ssthresh(&self) -> usize {
        self.w.ssthresh
    }

    fn on_ack(&mut self, _now: Instant, acked: usize, _rtt: Option<Duration>) {
        if acked == 0 {
            return;
        }
        self.w.acked();
        let rest = if self.w.in_slow_start() {
            self.w.slow_start(acked)
        } else {
            acked
        };
        if rest > 0 {
            self.w.avoid(rest);
        }
    }

    /// ssthresh = max(flight / 2, 2 MSS), cwnd = ssthresh (RFC 5681 §3.2,
    /// RFC 6675 §5 step 4.2).
    fn on_congestion(&mut self, _now: Instant, flight: usize) {
        let ssthresh = flight / 2;
        self.w.reduce(ssthresh, false);
    }

    fn on_recovery_end(&mut self, _now: Instant) {
        self.w.cwnd = self.w.ssthresh;
    }

    /// ssthresh = max(flight / 2, 2 MSS) unless the window was already cut
    /// for this loss episode; cwnd = 1 MSS.
    fn on_timeout(&mut self, _now: Instant, flight: usize) {
        let ssthresh = if self.w.cut {
            self.w.ssthresh
        } else {
            flight / 2
        };
        self.w.reduce(ssthresh, true);
    }

    fn set_mss(&mut self, mss: usize) {
        self.w.set_mss(mss);
    }

    fn undo(&mut self, cwnd: usize, ssthresh: usize) {
        self.w.undo(cwnd, ssthresh);
    }

    fn restart_after_idle(&mut self, idle: Duration, rto: Duration) {
        self.w.restart_after_idle(idle, rto);
    }
}

/// CUBIC's C, in segments per second cubed (RFC 9438 §5.1).
const CUBIC_C: f64 = 0.4;
/// CUBIC's multiplicative decrease factor β_cubic (RFC 9438 §4.6).
const CUBIC_BETA: f64 = 0.7;
/// α_cubic = 3 (1 - β) / (1 + β): the Reno-friendly additive increase per
/// round trip that matches Reno's average rate (RFC 9438 §4.3).
const CUBIC_ALPHA: f64 = 3.0 * (1.0 - CUBIC_BETA) / (1.0 + CUBIC_BETA);

/// CUBIC (RFC 9438): after a loss the window follows
/// W_cubic(t) = C (t - K)^3 + W_max, concave up to the window where the loss
/// happened and convex past it, with a Reno-friendly floor W_est. Slow start
/// is NewReno's.
///
/// The cubic quantities are kept in bytes as `f64` (windows in segments times
/// the MSS); cwnd stays an integer, with a sub-byte carry so small
/// increments are not lost. The `t + RTT` look-ahead uses the smallest RTT
/// the caller has reported (an estimate of the path's base RTT that queueing
/// does not inflate), or zero before any.
#[derive(Debug, Clone)]
pub struct Cubic {
    w: Window,
    /// W_max: the window just before the last reduction (after fast
    /// convergence), bytes. Zero before any loss.
    w_max: f64,
    /// cwnd_prior: the window when ssthresh was last set, bytes.
    cwnd_prior: f64,
    /// Start of the current congestion-avoidance epoch, `None` outside one.
    epoch: Option<Instant>,
    /// cwnd at the start of the epoch, bytes.
    cwnd_epoch: f64,
    /// K: seconds for W_cubic to climb from cwnd_epoch back to W_max.
    k: f64,
    /// W_est: the window Reno would have now, bytes (RFC 9438 §4.3).
    w_est: f64,
    /// Smallest RTT reported so far.
    min_rtt: Option<Duration>,
    /// Fraction of a byte of growth not yet added to cwnd.
    carry: f64,
    /// The last reduction was a timeout: the next epoch starts with K = 0
    /// and W_max = cwnd_epoch (RFC 9438 §4.8).
    after_timeout: bool,
    /// Slow start's exit on rising delay.
    hystart: HyStart,
}

/// HyStart's delay detection as Linux's CUBIC does it (`HYSTART_DELAY`):
/// from a window of 16 segments on, slow start ends (ssthresh = cwnd)
/// when the smallest RTT of a round's first samples (at least 8) exceeds
/// the smallest seen by an eighth of it, clamped to 4-16 ms: queues are
/// building. Linux's ACK-train detection is not done.
///
/// Or RFC 9406's HyStart++ (`plus_plus`): the round's smallest RTT is
/// compared with the last round's, and a rise enters Conservative Slow
/// Start (a quarter of slow start's growth) for up to five rounds: an RTT
/// back below the rise's resumes slow start (the rise was noise), five
/// rounds of it end slow start. Not after a timeout (standard slow start
/// then, RFC 9406 4.3).
#[derive(Debug, Clone, Default)]
struct HyStart {
    /// Slow start was left by it (until a timeout).
    found: bool,
    /// Where the current round ends (SND.NXT at its start).
    round_end: Option<u32>,
    /// The smallest RTT of this round so far.
    round_min: Option<Duration>,
    /// Samples taken this round (counting stops at the minimum).
    samples: u32,
    /// The smallest RTT sample of the connection.
    delay_min: Option<Duration>,
    /// RFC 9406's HyStart++ rather than Linux's HyStart.
    plus_plus: bool,
    /// HyStart++: the last whole round's smallest RTT.
    last_round_min: Option<Duration>,
    /// HyStart++: in Conservative Slow Start since the round whose
    /// smallest RTT (the baseline) rose, and the rounds done in it.
    css: Option<(Duration, u32)>,
    /// Bytes acknowledged in Conservative Slow Start short of a step of
    /// growth.
    carry_css: usize,
}

/// HyStart++'s growth divisor in Conservative Slow Start (RFC 9406 4.3).
const CSS_GROWTH_DIVISOR: usize = 4;
/// HyStart++'s rounds of Conservative Slow Start before avoidance.
const CSS_ROUNDS: u32 = 5;

/// Segments of cwnd from which HyStart looks (Linux's `hystart_low_window`).
const HYSTART_LOW_WINDOW: usize = 16;
/// Samples of a round before its delay is judged (`HYSTART_MIN_SAMPLES`).
const HYSTART_MIN_SAMPLES: u32 = 8;

impl Cubic {
    /// A controller at the initial window for this MSS.
    pub fn new(mss: usize) -> Self {
        Cubic {
            w: Window::new(mss),
            w_max: 0.0,
            cwnd_prior: 0.0,
            epoch: None,
            cwnd_epoch: 0.0,
            k: 0.0,
            w_est: 0.0,
            min_rtt: None,
            carry: 0.0,
            after_timeout: false,
            hystart: HyStart::default(),
        }
    }

    fn mss(&self) -> f64 {
        self.w.mss as f64
    }

    /// W_cubic(t) in bytes (RFC 9438 §4.2, eq. 1).
    fn w_cubic(&self, t: f64) -> f64 {
        CUBIC_C * (t - self.k).powi(3) * self.mss() + self.w_max
    }

    /// Start an epoch at `now` (RFC 9438 §4.2): K from the distance between
    /// cwnd_epoch and W_max, K = cbrt((W_max - cwnd_epoch) / C) in segments
    /// (K = cbrt(W_max (1 - β) / C) right after a loss without fast
    /// convergence). Negative when cwnd is already above W_max.
    fn start_epoch(&mut self, now: Instant) {
        let cwnd = self.w.cwnd as f64;
        self.epoch = Some(now);
        self.cwnd_epoch = cwnd;
        if self.after_timeout || self.w_max <= 0.0 {
            self.w_max = cwnd;
        }
        self.after_timeout = false;
        self.k = ((self.w_max - cwnd) / self.mss() / CUBIC_C).cbrt();
        self.w_est = cwnd;
    }

    /// Congestion avoidance for `acked` bytes (RFC 9438 §4.3 to §4.5).
    fn avoid(&mut self, now: Instant, acked: usize) {
        let epoch = match self.epoch {
            Some(e) => e,
            None => {
                self.start_epoch(now);
                now
            }
        };
        let mss = self.mss();
        let cwnd = self.w.cwnd as f64;
        let acked = acked as f64;
        let t = now.saturating_duration_since(epoch).as_secs_f64();
        let rtt = self.min_rtt.map_or(0.0, |d| d.as_secs_f64());

        // Reno-friendly estimate: α_cubic per window of ACKs, then 1 once
        // it has reached the window before the reduction.
        let alpha = if self.w_est >= self.cwnd_prior {
            1.0
        } else {
            CUBIC_ALPHA
        };
        self.w_est += alpha * acked * mss / cwnd;

        let next = if self.w_cubic(t) < self.w_est {
            // Reno-friendly region (§4.3): follow Reno.
            self.w_est.max(cwnd)
        } else {
            // Concave (§4.4) and convex (§4.5) regions: close the gap to
            // where the curve will be one RTT from now, by at most half a
            // window per window of ACKs.
            let target = self.w_cubic(t + rtt).max(cwnd).min(1.5 * cwnd);
            cwnd + (target - cwnd) * acked / cwnd
        };
        self.carry += next - cwnd;
        if self.carry >= 1.0 {
            let whole = self.carry.floor();
            self.carry -= whole;
            // `as` saturates; the cap keeps sums in range.
            self.w.cwnd = self.w.cwnd.saturating_add(whole as usize).min(UNLIMITED);
        }
    }

    /// W_max with fast convergence (§4.7), cwnd_prior, and ssthresh =
    /// max(cwnd β, 2 MSS) (§4.6); the epoch ends.
    fn cut(&mut self) -> usize {
        let cwnd = self.w.cwnd as f64;
        self.w_max = if cwnd < self.w_max {
            // Lost before regaining the last W_max: release bandwidth.
            cwnd * (1.0 + CUBIC_BETA) / 2.0
        } else {
            cwnd
        };
        self.cwnd_prior = cwnd;
        self.epoch = None;
        self.carry = 0.0;
        // cwnd * 0.7, exactly (the float product can land a byte short).
        let w = self.w.cwnd;
        w / 10 * 7 + w % 10 * 7 / 10
    }
}

impl CongestionControl for Cubic {
    fn name(&self) -> &'static str {
        "cubic"
    }

    fn cwnd(&self) -> usize {
        self.w.cwnd
    }

    fn ssthresh(&self) -> usize {
        self.w.ssthresh
    }

    fn on_ack(&mut self, now: Instant, acked: usize, rtt: Option<Duration>) {
        if let Some(r) = rtt.filter(|r| !r.is_zero()) {
            self.min_rtt = Some(self.min_rtt.map_or(r, |m| m.min(r)));
        }
        if acked == 0 {
            return;
        }
        self.w.acked();
        let rest = if self.w.in_slow_start() {
            if self.hystart.css.is_some() {
                // Conservative Slow Start: a quarter of the growth.
                self.hystart.carry_css += acked;
                let grow = self.hystart.carry_css / CSS_GROWTH_DIVISOR;
                self.hystart.carry_css %= CSS_GROWTH_DIVISOR;
                self.w.slow_start(grow)
            } else {
                self.w.slow_start(acked)
            }
        } else {
            acked
        };
        if rest > 0 {
            self.avoid(now, rest);
        }
    }

    /// W_max with fast convergence, ssthresh = max(cwnd β, 2 MSS),
    /// cwnd = ssthresh (RFC 9438 §4.6, §4.7). `flight` is not used: the
    /// reduction follows cwnd, as deployed CUBIC does.
    fn on_congestion(&mut self, _now: Instant, _flight: usize) {
        self.after_timeout = false;
        self.hystart.css = None;
        let ssthresh = self.cut();
        self.w.reduce(ssthresh, false);
    }

    fn on_recovery_end(&mut self, _now: Instant) {
        self.w.cwnd = self.w.ssthresh;
    }

    /// As on congestion unless the window was already cut for this loss
    /// episode, then cwnd = 1 MSS and the next epoch restarts the curve at
    /// the window where avoidance begins (RFC 9438 §4.8).
    fn on_timeout(&mut self, _now: Instant, _flight: usize) {
        let ssthresh = if self.w.cut {
            self.epoch = None;
            self.carry = 0.0;
            self.w.ssthresh
        } else {
            self.cut()
        };
        self.after_timeout = true;
        self.w.reduce(ssthresh, true);
        // Slow start again after the loss window: HyStart looks anew;
        // HyStart++ does not (RFC 9406 4.3: standard slow start).
        self.hystart = HyStart {
            delay_min: self.hystart.delay_min,
            plus_plus: self.hystart.plus_plus,
            found: self.hystart.plus_plus,
            ..HyStart::default()
        };
    }

    fn restart_after_idle(&mut self, idle: Duration, rto: Duration) {
        self.w.restart_after_idle(idle, rto);
        // The curve starts again from the window it restarts at.
        self.epoch = None;
    }

    /// The window back; the curve starts again from it (W_max as the
    /// needless cut left it: at most the window restored).
    fn undo(&mut self, cwnd: usize, ssthresh: usize) {
        self.w.undo(cwnd, ssthresh);
        self.epoch = None;
        self.after_timeout = false;
    }

    fn on_rtt_sample(&mut self, _now: Instant, rtt: Duration, una: u32, nxt: u32) {
        let rtt = rtt.max(Duration::from_micros(1));
        let h = &mut self.hystart;
        let min = h.delay_min.map_or(rtt, |m| m.min(rtt));
        h.delay_min = Some(min);
        if h.found || !self.w.in_slow_start() || self.w.cwnd < HYSTART_LOW_WINDOW * self.w.mss {
            return;
        }
        if h.round_end
            .is_none_or(|end| (una.wrapping_sub(end) as i32) > 0)
        {
            // A new round.
            h.round_end = Some(nxt);
            if h.samples >= HYSTART_MIN_SAMPLES || h.last_round_min.is_none() {
                h.last_round_min = h.round_min.or(h.last_round_min);
            }
            h.round_min = None;
            h.samples = 0;
            if let Some((baseline, rounds)) = h.css {
                if rounds + 1 >= CSS_ROUNDS {
                    // Five rounds of it: slow start is over.
                    h.css = None;
                    h.found = true;
                    self.w.ssthresh = self.w.cwnd;
                    return;
                }
                h.css = Some((baseline, rounds + 1));
            }
        }
        let round_min = h.round_min.map_or(rtt, |m| m.min(rtt));
        h.round_min = Some(round_min);
        if h.samples < HYSTART_MIN_SAMPLES {
            h.samples += 1;
            return;
        }
        if h.plus_plus {
            match (h.css, h.last_round_min) {
                (Some((baseline, _)), _) if round_min < baseline => {
                    // The rise was not a queue: slow start again.
                    h.css = None;
                }
                (None, Some(last)) => {
                    let thresh =
                        (last / 8).clamp(Duration::from_millis(4), Duration::from_millis(16));
                    if round_min >= last + thresh {
                        h.css = Some((round_min, 0));
                    }
                }
                _ => {}
            }
            return;
        }
        let margin = (min / 8).clamp(Duration::from_millis(4), Duration::from_millis(16));
        if round_min > min + margin {
            h.found = true;
            self.w.ssthresh = self.w.cwnd;
        }
    }

    fn set_mss(&mut self, mss: usize) {
        if self.w.fresh {
            let plus_plus = self.hystart.plus_plus;
            *self = Cubic {
                min_rtt: self.min_rtt,
                ..Cubic::new(mss)
            };
            self.hystart.plus_plus = plus_plus;
        } else {
            self.w.set_mss(mss);
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    const MSS: usize = 1000;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    /// One round trip of ACK clocking: a cumulative ACK per `per_ack` bytes
    /// for the whole window, spread evenly over `rtt`.
    fn round_trip(
        cc: &mut dyn CongestionControl,
        now: &mut Instant,
        rtt: Duration,
        per_ack: usize,
    ) {
        let acks = cc.cwnd().div_ceil(per_ack).max(1);
        let step = rtt / u32::try_from(acks).unwrap_or(u32::MAX);
        for _ in 0..acks {
            *now += step;
            cc.on_ack(*now, per_ack, Some(rtt));
        }
    }

    /// A controller in congestion avoidance at `w` segments, as after a loss
    /// at `w / 0.7` (CUBIC) or `2 w` (NewReno) segments.
    fn cubic_after_loss_at(segments: usize) -> Cubic {
        let mut cc = Cubic::new(MSS);
        cc.w.cwnd = segments * MSS;
        cc.on_congestion(Instant::ZERO, segments * MSS);
        cc
    }

    #[test]
    fn initial_window_per_rfc6928() {
        assert_eq!(initial_window(1460), 14_600);
        assert_eq!(initial_window(1000), 10_000);
        assert_eq!(initial_window(536), 5_360);
        assert_eq!(initial_window(9000), 18_000);
        assert_eq!(initial_window(0), 10);
        for alg in [Algorithm::NewReno, Algorithm::Cubic] {
            let cc = new_controller(alg, 1460);
            assert_eq!(cc.cwnd(), 14_600);
            assert!(cc.ssthresh() >= UNLIMITED);
            assert!(cc.in_slow_start());
            assert_eq!(cc.name(), alg.to_string());
        }
    }

    #[test]
    fn slow_start_doubles_per_round_trip() {
        for alg in [Algorithm::NewReno, Algorithm::Cubic] {
            // One ACK per segment, one per two segments (delayed ACKs),
            // and stretch ACKs of five: each doubles the window.
            for per_ack in [MSS, 2 * MSS, 5 * MSS] {
                let mut cc = new_controller(alg, MSS);
                let mut now = Instant::ZERO;
                let mut expect = cc.cwnd();
                for _ in 0..5 {
                    round_trip(cc.as_mut(), &mut now, ms(10), per_ack);
                    expect *= 2;
                    assert_eq!(cc.cwnd(), expect, "{alg} per_ack={per_ack}");
                }
                assert!(cc.in_slow_start());
            }
        }
    }

    #[test]
    fn slow_start_counts_every_segment_a_stretch_ack_covers() {
        let mut cc = NewReno::new(MSS);
        let w0 = cc.cwnd();
        cc.on_ack(Instant::ZERO, 5 * MSS, None);
        assert_eq!(cc.cwnd(), w0 + 5 * MSS);
    }

    #[test]
    fn slow_start_stops_at_ssthresh_and_spills_into_avoidance() {
        let mut cc = NewReno::new(MSS);
        cc.w.cwnd = 19 * MSS;
        cc.w.ssthresh = 20 * MSS;
        cc.on_ack(Instant::ZERO, 2 * MSS, None);
        assert_eq!(cc.cwnd(), 20 * MSS);
        assert!(!cc.in_slow_start());
        assert_eq!(cc.w.ca_acked, MSS);
    }

    #[test]
    fn newreno_avoidance_adds_one_mss_per_window() {
        let mut cc = NewReno::new(MSS);
        cc.w.cwnd = 40 * MSS;
        cc.on_congestion(Instant::ZERO, 40 * MSS);
        assert_eq!((cc.cwnd(), cc.ssthresh()), (20 * MSS, 20 * MSS));
        let mut now = Instant::ZERO;
        for n in 1..=10 {
            round_trip(&mut cc, &mut now, ms(10), MSS);
            assert_eq!(cc.cwnd(), (20 + n) * MSS);
        }
    }

    #[test]
    fn newreno_avoidance_byte_counting_has_no_drift() {
        let mut cc = NewReno::new(MSS);
        cc.w.cwnd = 20 * MSS;
        cc.w.ssthresh = 20 * MSS;
        // 29 ACKs of 700 bytes: 20300 bytes, one window and 300 more.
        for _ in 0..29 {
            cc.on_ack(Instant::ZERO, 700, None);
        }
        assert_eq!(cc.cwnd(), 21 * MSS);
        assert_eq!(cc.w.ca_acked, 300);
        // The next window is 21000 bytes: 20700 more bytes complete it.
        cc.on_ack(Instant::ZERO, 20_699, None);
        assert_eq!(cc.cwnd(), 21 * MSS);
        cc.on_ack(Instant::ZERO, 1, None);
        assert_eq!(cc.cwnd(), 22 * MSS);
    }

    #[test]
    fn newreno_halves_flight_on_congestion() {
        let mut cc = NewReno::new(MSS);
        let mut now = Instant::ZERO;
        for _ in 0..3 {
            round_trip(&mut cc, &mut now, ms(10), MSS);
        }
        assert_eq!(cc.cwnd(), 80 * MSS);
        cc.on_congestion(now, 60 * MSS);
        assert_eq!((cc.cwnd(), cc.ssthresh()), (30 * MSS, 30 * MSS));
        cc.on_recovery_end(now);
        assert_eq!(cc.cwnd(), 30 * MSS);
        // Tiny flights floor at 2 MSS.
        cc.on_congestion(now, MSS);
        assert_eq!((cc.cwnd(), cc.ssthresh()), (2 * MSS, 2 * MSS));
    }

    #[test]
    fn cubic_multiplies_by_beta_on_congestion() {
        let mut cc = Cubic::new(MSS);
        let mut now = Instant::ZERO;
        for _ in 0..3 {
            round_trip(&mut cc, &mut now, ms(10), MSS);
        }
        assert_eq!(cc.cwnd(), 80 * MSS);
        // The flight does not matter: cwnd does.
        cc.on_congestion(now, 10 * MSS);
        assert_eq!((cc.cwnd(), cc.ssthresh()), (56 * MSS, 56 * MSS));
        assert_eq!(cc.w_max, (80 * MSS) as f64);
        assert!(!cc.in_slow_start());
    }

    #[test]
    fn timeout_collapses_to_one_segment() {
        for alg in [Algorithm::NewReno, Algorithm::Cubic] {
            let mut cc = new_controller(alg, MSS);
            let mut now = Instant::ZERO;
            for _ in 0..3 {
                round_trip(cc.as_mut(), &mut now, ms(10), MSS);
            }
            cc.on_timeout(now, 80 * MSS);
            assert_eq!(cc.cwnd(), MSS, "{alg}");
            let expect = match alg {
                Algorithm::NewReno => 40 * MSS,
                Algorithm::Cubic => 56 * MSS,
            };
            assert_eq!(cc.ssthresh(), expect, "{alg}");
            assert!(cc.in_slow_start());
            // Timer expires again with nothing acknowledged: ssthresh holds.
            cc.on_timeout(now, 80 * MSS);
            assert_eq!((cc.cwnd(), cc.ssthresh()), (MSS, expect), "{alg}");
            // Slow start from one segment back to ssthresh.
            cc.on_ack(now, MSS, Some(ms(10)));
            assert_eq!(cc.cwnd(), 2 * MSS, "{alg}");
            // After progress, a new timeout is a new loss and cuts again.
            cc.on_timeout(now, 2 * MSS);
            assert_eq!((cc.cwnd(), cc.ssthresh()), (MSS, 2 * MSS), "{alg}");
        }
    }

    #[test]
    fn timeout_during_recovery_keeps_the_cut_ssthresh() {
        for alg in [Algorithm::NewReno, Algorithm::Cubic] {
            let mut cc = new_controller(alg, MSS);
            let mut now = Instant::ZERO;
            for _ in 0..3 {
                round_trip(cc.as_mut(), &mut now, ms(10), MSS);
            }
            cc.on_congestion(now, 80 * MSS);
            let ssthresh = cc.ssthresh();
            cc.on_timeout(now, 80 * MSS);
            assert_eq!((cc.cwnd(), cc.ssthresh()), (MSS, ssthresh), "{alg}");
        }
    }

    #[test]
    fn cubic_after_timeout_restarts_the_curve_at_the_avoidance_window() {
        let mut cc = Cubic::new(MSS);
        let mut now = Instant::ZERO;
        for _ in 0..3 {
            round_trip(&mut cc, &mut now, ms(10), MSS);
        }
        cc.on_timeout(now, 0);
        assert_eq!(cc.ssthresh(), 56 * MSS);
        while cc.in_slow_start() {
            round_trip(&mut cc, &mut now, ms(10), MSS);
        }
        // RFC 9438 §4.8: K = 0 and W_max = cwnd at the start of avoidance.
        assert!(cc.epoch.is_some());
        assert_eq!(cc.k, 0.0);
        assert_eq!(cc.w_max, cc.cwnd_epoch);
        assert_eq!(cc.cwnd_epoch, (56 * MSS) as f64);
    }

    #[test]
    fn cubic_is_concave_then_convex_around_w_max() {
        // A large window on a 100 ms path, so the curve, not the
        // Reno-friendly estimate, drives the window.
        let w_max = 1000.0;
        let mut cc = cubic_after_loss_at(1000);
        assert_eq!(cc.cwnd(), 700 * MSS);
        let mut now = Instant::ZERO;
        let mut trace = Vec::new();
        for _ in 0..180 {
            round_trip(&mut cc, &mut now, ms(100), MSS);
            let start = cc.epoch.unwrap_or(now);
            let t = now.saturating_duration_since(start).as_secs_f64();
            trace.push((t, cc.cwnd() as f64 / MSS as f64));
        }
        // K = cbrt(1000 * 0.3 / 0.4) ≈ 9.09 s.
        let k = (w_max * (1.0 - CUBIC_BETA) / CUBIC_C).cbrt();
        assert!((cc.k - k).abs() < 1e-9, "K = {}", cc.k);
        let at = |t: f64| trace.iter().find(|(x, _)| *x >= t).map_or(0.0, |(_, w)| *w);
        let at_k = at(k);
        assert!((at_k - w_max).abs() / w_max < 0.03, "cwnd at K: {at_k}");
        // The plateau: from K - 1 s to K + 1 s the window barely moves.
        let plateau = at(k + 1.0) - at(k - 1.0);
        assert!(plateau < 10.0, "moved {plateau} segments around K");
        // Concave before K: growth slows down approaching W_max.
        let early = at(1.5) - at(0.5);
        let late = at(k - 1.0) - at(k - 2.0);
        assert!(early > 10.0 * late, "concave: {early} then {late}");
        assert!(at(k - 1.0) < w_max);
        // Convex after K: growth speeds up past W_max.
        let first = at(k + 1.5) - at(k + 0.5);
        let second = at(k + 4.5) - at(k + 3.5);
        assert!(second > 5.0 * first, "convex: {first} then {second}");
        assert!(at(k + 4.5) > w_max * 1.03);
        // The window tracks W_cubic(t) within a few percent all along.
        for t in [1.0, 3.0, 5.0, 7.0, 11.0, 13.0, 15.0, 17.0] {
            let curve = CUBIC_C * (t - k).powi(3) + w_max;
            let got = at(t);
            assert!(
                (got - curve).abs() / curve < 0.03,
                "t={t}: cwnd {got} vs W_cubic {curve}"
            );
        }
        // Cubic stayed above Reno's estimate the whole time.
        assert!(cc.cwnd() as f64 > cc.w_est);
    }

    #[test]
    fn cubic_growth_per_window_is_bounded_by_half_a_window() {
        // Far past K the curve is steep; cwnd may only grow 1.5x per RTT.
        let mut cc = cubic_after_loss_at(100);
        let mut now = Instant::ZERO;
        round_trip(&mut cc, &mut now, ms(100), MSS);
        now += Duration::from_secs(60);
        let before = cc.cwnd();
        round_trip(&mut cc, &mut now, ms(100), MSS);
        let after = cc.cwnd();
        assert!(after > before * 14 / 10, "{before} -> {after}");
        assert!(after <= before * 16 / 10 + MSS, "{before} -> {after}");
    }

    #[test]
    fn cubic_fast_convergence() {
        let mut cc = cubic_after_loss_at(100);
        assert_eq!(cc.w_max, (100 * MSS) as f64);
        // Grow to 80 segments, short of W_max, then lose again.
        let mut now = Instant::ZERO;
        while cc.cwnd() < 80 * MSS {
            round_trip(&mut cc, &mut now, ms(100), MSS);
        }
        let at_loss = cc.cwnd() as f64;
        assert!(at_loss < (100 * MSS) as f64);
        cc.on_congestion(now, 0);
        // W_max = cwnd (1 + β) / 2, below the window at the loss.
        let expect = at_loss * (1.0 + CUBIC_BETA) / 2.0;
        assert!((cc.w_max - expect).abs() < 1.0, "{} vs {expect}", cc.w_max);
        assert!(cc.w_max < at_loss);
        assert_eq!(cc.ssthresh(), cc.cwnd());
        assert!((cc.ssthresh() as f64 - at_loss * CUBIC_BETA).abs() < 1.0);
        // Without the early loss W_max is the window itself.
        let mut cc = cubic_after_loss_at(100);
        while cc.cwnd() <= 110 * MSS {
            round_trip(&mut cc, &mut now, ms(100), MSS);
        }
        let at_loss = cc.cwnd() as f64;
        cc.on_congestion(now, 0);
        assert_eq!(cc.w_max, at_loss);
    }

    #[test]
    fn cubic_reno_friendly_at_small_bdp() {
        // W_max of 10 segments on a 100 µs path: K ≈ 1.96 s is ~20000
        // round trips away, so the cubic curve alone is flat.
        let mut cc = cubic_after_loss_at(10);
        assert_eq!(cc.cwnd(), 7 * MSS);
        let rtt = Duration::from_micros(100);
        let mut now = Instant::ZERO;
        for _ in 0..20 {
            round_trip(&mut cc, &mut now, rtt, MSS);
        }
        let curve = cc.w_cubic(
            now.saturating_duration_since(cc.epoch.unwrap_or(now))
                .as_secs_f64(),
        ) / MSS as f64;
        assert!(curve < 7.1, "cubic alone: {curve}");
        // Reno-friendly: α ≈ 0.53 segment per RTT up to cwnd_prior
        // (~6 RTTs for 3 segments), then 1 per RTT: about 7 + 3 + 14.
        let grown = cc.cwnd() as f64 / MSS as f64;
        assert!((21.0..=26.0).contains(&grown), "cwnd {grown} segments");
        assert!(cc.w_est >= cc.cwnd_prior);
    }

    #[test]
    fn cubic_not_reno_limited_at_large_bdp() {
        // The same loss at 1000 segments and 100 ms: the curve outruns Reno.
        let mut cc = cubic_after_loss_at(1000);
        let mut now = Instant::ZERO;
        for _ in 0..20 {
            round_trip(&mut cc, &mut now, ms(100), MSS);
        }
        assert!(cc.cwnd() as f64 > cc.w_est + (20 * MSS) as f64);
    }

    #[test]
    fn cubic_rtt_lookahead_uses_the_smallest_rtt() {
        let mut cc = cubic_after_loss_at(100);
        cc.on_ack(Instant::ZERO, MSS, Some(ms(50)));
        cc.on_ack(Instant::ZERO, MSS, Some(ms(300)));
        cc.on_ack(Instant::ZERO, MSS, None);
        assert_eq!(cc.min_rtt, Some(ms(50)));
    }

    #[test]
    fn floors_hold() {
        for alg in [Algorithm::NewReno, Algorithm::Cubic] {
            let mut cc = new_controller(alg, MSS);
            for _ in 0..20 {
                cc.on_congestion(Instant::ZERO, 0);
                assert!(cc.cwnd() >= MSS && cc.ssthresh() >= 2 * MSS, "{alg}");
                cc.on_recovery_end(Instant::ZERO);
                cc.on_timeout(Instant::ZERO, 0);
                assert!(cc.cwnd() >= MSS && cc.ssthresh() >= 2 * MSS, "{alg}");
                cc.on_ack(Instant::ZERO, 1, None);
            }
            assert_eq!(cc.ssthresh(), 2 * MSS, "{alg}");
        }
    }

    #[test]
    fn absurd_inputs_do_not_panic_or_overflow() {
        for alg in [Algorithm::NewReno, Algorithm::Cubic] {
            let mut cc = new_controller(alg, 0);
            cc.set_mss(usize::MAX);
            cc.on_ack(Instant::FAR_FUTURE, usize::MAX, Some(Duration::MAX));
            cc.on_congestion(Instant::ZERO, usize::MAX);
            for _ in 0..100 {
                cc.on_ack(Instant::FAR_FUTURE, usize::MAX, Some(Duration::MAX));
                cc.on_ack(Instant::ZERO, usize::MAX, Some(Duration::ZERO));
            }
            assert!(cc.cwnd() <= UNLIMITED && cc.ssthresh() <= UNLIMITED);
            cc.on_timeout(Instant::ZERO, usize::MAX);
            cc.set_mss(1);
            cc.on_ack(Instant::FAR_FUTURE, usize::MAX, None);
            assert!(cc.cwnd() >= 1);
        }
    }

    #[test]
    fn set_mss_before_traffic_rederives_the_initial_window() {
        for alg in [Algorithm::NewReno, Algorithm::Cubic] {
            let mut cc = new_controller(alg, 536);
            assert_eq!(cc.cwnd(), 5_360);
            cc.set_mss(1460);
            assert_eq!(cc.cwnd(), 14_600, "{alg}");
            // Later changes keep the window but respect the new floors.
            cc.on_timeout(Instant::ZERO, 0);
            assert_eq!(cc.cwnd(), 1460);
            cc.set_mss(9000);
            assert_eq!((cc.cwnd(), cc.ssthresh()), (9000, 18_000), "{alg}");
        }
    }

    #[test]
    fn algorithm_parses_and_displays() {
        assert_eq!("cubic".parse::<Algorithm>(), Ok(Algorithm::Cubic));
        assert_eq!("CUBIC".parse::<Algorithm>(), Ok(Algorithm::Cubic));
        assert_eq!("newreno".parse::<Algorithm>(), Ok(Algorithm::NewReno));
        assert_eq!("NewReno".parse::<Algorithm>(), Ok(Algorithm::NewReno));
        assert_eq!("reno".parse::<Algorithm>(), Ok(Algorithm::NewReno));
        assert_eq!(
            "bbr".parse::<Algorithm>(),
            Err(UnknownAlgorithm("bbr".to_owned()))
        );
        assert!("".parse::<Algorithm>().is_err());
        for alg in [Algorithm::NewReno, Algorithm::Cubic] {
            assert_eq!(alg.to_string().parse::<Algorithm>(), Ok(alg));
        }
        assert_eq!(Algorithm::default(), Algorithm::Cubic);
        assert!(UnknownAlgorithm("x".into()).to_string().contains("newreno"));
    }

    /// HyStart (delay): from 16 segments on, a round whose first 9 RTT
    /// samples all exceed the smallest seen by more than an eighth
    /// (clamped to 4-16 ms) ends slow start at the window it reached; a
    /// rise within that margin does not.
    #[test]
    fn hystart_leaves_slow_start_when_the_delay_rises() {
        for (rise_ms, leaves) in [(30, true), (10, false)] {
            let mut cc = Cubic::new(MSS);
            let now = Instant::ZERO;
            cc.on_rtt_sample(now, ms(100), 0, 0);
            // Grow to 20 segments in slow start.
            cc.on_ack(now, 10 * MSS, Some(ms(100)));
            assert_eq!(cc.cwnd(), 20 * MSS);
            // A round (ending at 1000) of samples `rise_ms` above the minimum.
            for i in 1..=9u32 {
                cc.on_rtt_sample(now, ms(100 + rise_ms), i, 1000);
                cc.on_ack(now, MSS, Some(ms(100)));
            }
            // Left at the window of the 9th sample: 28 segments.
            assert_eq!(cc.ssthresh() == 28 * MSS, leaves, "rise {rise_ms} ms");
            assert_eq!(cc.in_slow_start(), !leaves, "rise {rise_ms} ms");
        }
    }

    /// HyStart++ (RFC 9406): a round whose smallest RTT rises over the
    /// last round's by an eighth (4-16 ms) enters Conservative Slow Start,
    /// a quarter of the growth with ssthresh untouched; a round back
    /// below the rise resumes slow start; five rounds of it end slow
    /// start at the window reached.
    #[test]
    fn hystart_plus_plus_slows_then_leaves_slow_start_or_resumes_it() {
        let round = |cc: &mut Cubic, n: u32, rtt: u64| {
            // A round of 9 samples ending at n * 1000, one segment each.
            for i in 1..=9u32 {
                cc.on_rtt_sample(Instant::ZERO, ms(rtt), (n - 1) * 1000 + i, n * 1000);
                cc.on_ack(Instant::ZERO, MSS, Some(ms(rtt)));
            }
        };
        for fall_back in [false, true] {
            let mut cc = Cubic::new(MSS);
            cc.hystart.plus_plus = true;
            cc.on_ack(Instant::ZERO, 10 * MSS, Some(ms(100)));
            round(&mut cc, 1, 100);
            round(&mut cc, 2, 100);
            let before = cc.cwnd();
            assert_eq!(before, 38 * MSS);
            // The RTT rises by 30 ms: Conservative Slow Start.
            round(&mut cc, 3, 130);
            assert!(cc.hystart.css.is_some());
            assert!(cc.in_slow_start(), "ssthresh untouched");
            let in_css = cc.cwnd();
            round(&mut cc, 4, 130);
            assert_eq!(cc.cwnd() - in_css, 9 * MSS / CSS_GROWTH_DIVISOR);
            if fall_back {
                round(&mut cc, 5, 100);
                assert!(cc.hystart.css.is_none(), "resumed");
                let at = cc.cwnd();
                round(&mut cc, 6, 100);
                assert_eq!(cc.cwnd() - at, 9 * MSS, "full slow start again");
                assert!(cc.in_slow_start());
            } else {
                for n in 5..=7 {
                    round(&mut cc, n, 130);
                    assert!(cc.in_slow_start());
                }
                let reached = cc.cwnd();
                // The fifth round of it ends: slow start ends there.
                round(&mut cc, 8, 130);
                assert!(!cc.in_slow_start(), "five rounds of it end slow start");
                assert_eq!(cc.ssthresh(), reached);
            }
        }
    }
}
