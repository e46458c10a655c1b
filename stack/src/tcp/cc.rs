//! Congestion control behind a small trait: NewReno (RFC 5681/6582) and
//! CUBIC (RFC 9438). Windows are in bytes.

use std::time::Duration;

use crate::time::Instant;

/// A congestion controller of one connection.
pub trait CongestionControl: core::fmt::Debug + Send {
    fn name(&self) -> &'static str;
    /// Congestion window in bytes.
    fn cwnd(&self) -> usize;
    fn ssthresh(&self) -> usize;
    /// New data acknowledged outside loss recovery; `rtt` is the smoothed RTT.
    fn on_ack(&mut self, now: Instant, acked: usize, rtt: Option<Duration>);
    /// Loss detected by duplicate ACKs or SACK, with `flight` bytes outstanding.
    fn on_congestion(&mut self, now: Instant, flight: usize);
    /// Loss recovery ended: deflate to ssthresh.
    fn on_recovery_end(&mut self, now: Instant);
    /// Retransmission timeout: ssthresh from `flight`, cwnd of one segment.
    fn on_timeout(&mut self, now: Instant, flight: usize);
    fn set_mss(&mut self, mss: usize);
    fn in_slow_start(&self) -> bool {
        self.cwnd() < self.ssthresh()
    }
}

/// Which controller a connection uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Algorithm {
    NewReno,
    #[default]
    Cubic,
}

/// An unknown algorithm name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown congestion control '{0}' (expected newreno or cubic)")]
pub struct UnknownAlgorithm(pub String);

impl core::str::FromStr for Algorithm {
    type Err = UnknownAlgorithm;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "newreno" | "reno" => Ok(Algorithm::NewReno),
            "cubic" => Ok(Algorithm::Cubic),
            _ => Err(UnknownAlgorithm(s.to_string())),
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

/// A new controller of the given kind.
pub fn new_controller(alg: Algorithm, mss: usize) -> Box<dyn CongestionControl> {
    match alg {
        Algorithm::NewReno => Box::new(NewReno::new(mss)),
        Algorithm::Cubic => Box::new(Cubic::new(mss)),
    }
}

/// "Infinite" initial ssthresh, small enough that sums never overflow.
const SSTHRESH_INIT: usize = usize::MAX >> 2;

/// RFC 6928 initial window.
fn initial_window(mss: usize) -> usize {
    (10 * mss).min((2 * mss).max(14_600))
}

/// Shared slow-start and congestion-avoidance arithmetic.
#[derive(Debug, Clone)]
struct Window {
    mss: usize,
    cwnd: usize,
    ssthresh: usize,
    /// Bytes acknowledged toward the next +1 MSS in congestion avoidance.
    ca_acked: usize,
}

impl Window {
    fn new(mss: usize) -> Self {
        let mss = mss.max(1);
        Window {
            mss,
            cwnd: initial_window(mss),
            ssthresh: SSTHRESH_INIT,
            ca_acked: 0,
        }
    }

    /// Slow start with appropriate byte counting (RFC 3465, L = 2 MSS).
    /// Returns the bytes left over once cwnd reaches ssthresh.
    fn slow_start(&mut self, acked: usize) -> usize {
        let inc = acked.min(2 * self.mss);
        let room = self.ssthresh.saturating_sub(self.cwnd);
        let used = inc.min(room);
        self.cwnd += used;
        if used < inc { acked - used } else { 0 }
    }

    /// One MSS per cwnd of acknowledged bytes (RFC 5681 3.1, byte counted).
    fn avoid(&mut self, acked: usize) {
        self.ca_acked += acked;
        if self.ca_acked >= self.cwnd {
            self.ca_acked -= self.cwnd;
            self.cwnd += self.mss;
        }
    }

    fn floor_ssthresh(&self, v: usize) -> usize {
        v.max(2 * self.mss)
    }
}

/// NewReno: halve on loss, one segment on timeout.
#[derive(Debug, Clone)]
pub struct NewReno {
    w: Window,
}

impl NewReno {
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
    fn on_ack(&mut self, _: Instant, acked: usize, _: Option<Duration>) {
        let rest = if self.w.cwnd < self.w.ssthresh {
            self.w.slow_start(acked)
        } else {
            acked
        };
        if rest > 0 {
            self.w.avoid(rest);
        }
    }
    fn on_congestion(&mut self, _: Instant, flight: usize) {
        self.w.ssthresh = self.w.floor_ssthresh(flight / 2);
        self.w.cwnd = self.w.ssthresh;
        self.w.ca_acked = 0;
    }
    fn on_recovery_end(&mut self, _: Instant) {
        self.w.cwnd = self.w.ssthresh;
    }
    fn on_timeout(&mut self, _: Instant, flight: usize) {
        self.w.ssthresh = self.w.floor_ssthresh(flight / 2);
        self.w.cwnd = self.w.mss;
        self.w.ca_acked = 0;
    }
    fn set_mss(&mut self, mss: usize) {
        *self = NewReno::new(mss);
    }
}

/// CUBIC constants (RFC 9438 §5).
const C: f64 = 0.4;
const BETA: f64 = 0.7;

/// CUBIC (RFC 9438): a cubic function of the time since the last congestion
/// event, with a Reno-friendly floor. Slow start as NewReno.
#[derive(Debug, Clone)]
pub struct Cubic {
    w: Window,
    /// Window before the last reduction, in segments.
    w_max: f64,
    /// Start of the current congestion-avoidance epoch.
    epoch: Option<Instant>,
    /// K in seconds.
    k: f64,
    /// Reno-friendly window estimate, in segments (RFC 9438 §4.3).
    w_est: f64,
    /// cwnd at the start of the epoch, in segments.
    cwnd_epoch: f64,
}

impl Cubic {
    pub fn new(mss: usize) -> Self {
        Cubic {
            w: Window::new(mss),
            w_max: 0.0,
            epoch: None,
            k: 0.0,
            w_est: 0.0,
            cwnd_epoch: 0.0,
        }
    }

    fn segs(&self, bytes: usize) -> f64 {
        bytes as f64 / self.w.mss as f64
    }

    /// W_cubic(t) in segments.
    fn w_cubic(&self, t: f64) -> f64 {
        C * (t - self.k).powi(3) + self.w_max
    }

    fn reduce(&mut self) {
        let cwnd = self.segs(self.w.cwnd);
        // Fast convergence (§4.7): release bandwidth when losses come early.
        self.w_max = if cwnd < self.w_max {
            cwnd * (1.0 + BETA) / 2.0
        } else {
            cwnd
        };
        self.w.ssthresh = self.w.floor_ssthresh((self.w.cwnd as f64 * BETA) as usize);
        self.epoch = None;
        self.w.ca_acked = 0;
    }

    /// W_max for tests and telemetry, in bytes.
    pub fn w_max_bytes(&self) -> usize {
        (self.w_max * self.w.mss as f64) as usize
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
        let rest = if self.w.cwnd < self.w.ssthresh {
            self.w.slow_start(acked)
        } else {
            acked
        };
        if rest == 0 {
            return;
        }
        let cwnd = self.segs(self.w.cwnd);
        let epoch = match self.epoch {
            Some(e) => e,
            None => {
                // A new epoch (§4.2): K from the distance to W_max.
                self.epoch = Some(now);
                self.cwnd_epoch = cwnd;
                self.w_est = cwnd;
                self.k = if self.w_max > cwnd {
                    ((self.w_max - cwnd) / C).cbrt()
                } else {
                    0.0
                };
                if self.w_max < cwnd {
                    self.w_max = cwnd;
                }
                now
            }
        };
        let rtt = rtt.map_or(0.0, |d| d.as_secs_f64());
        let t = now.saturating_duration_since(epoch).as_secs_f64();
        // Target one RTT ahead, clamped to [cwnd, 1.5 cwnd] (§4.4).
        let target = self.w_cubic(t + rtt).clamp(cwnd, 1.5 * cwnd);
        // Reno-friendly estimate (§4.3).
        let alpha = 3.0 * (1.0 - BETA) / (1.0 + BETA);
        let acked_segs = self.segs(rest);
        self.w_est += alpha * acked_segs / cwnd;
        let next = if self.w_est > target {
            // Reno-friendly region: grow like Reno would.
            cwnd + (self.w_est - cwnd).max(0.0).min(acked_segs)
        } else {
            cwnd + (target - cwnd) / cwnd * acked_segs
        };
        let bytes = (next * self.w.mss as f64) as usize;
        self.w.cwnd = bytes.max(self.w.cwnd);
    }

    fn on_congestion(&mut self, _: Instant, _flight: usize) {
        self.reduce();
        self.w.cwnd = self.w.ssthresh;
    }

    fn on_recovery_end(&mut self, _: Instant) {
        self.w.cwnd = self.w.ssthresh;
    }

    fn on_timeout(&mut self, _: Instant, _flight: usize) {
        self.reduce();
        self.w.cwnd = self.w.mss;
    }

    fn set_mss(&mut self, mss: usize) {
        *self = Cubic::new(mss);
    }
}

#[cfg(test)]
mod test {
    use super::*;

    const MSS: usize = 1000;

    /// Ack a whole window, one MSS at a time, `rtt` apart per window.
    fn ack_window(cc: &mut dyn CongestionControl, now: &mut Instant, rtt: Duration) {
        let segs = cc.cwnd() / MSS;
        for _ in 0..segs {
            cc.on_ack(*now, MSS, Some(rtt));
        }
        *now += rtt;
    }

    #[test]
    fn initial_window_rfc6928() {
        assert_eq!(initial_window(1460), 14_600);
        assert_eq!(initial_window(536), 5360);
        assert_eq!(initial_window(9000), 18_000);
    }

    #[test]
    fn slow_start_doubles_per_rtt() {
        for alg in [Algorithm::NewReno, Algorithm::Cubic] {
            let mut cc = new_controller(alg, MSS);
            let mut now = Instant::ZERO;
            let w0 = cc.cwnd();
            ack_window(cc.as_mut(), &mut now, Duration::from_millis(10));
            assert_eq!(cc.cwnd(), 2 * w0, "{alg}");
            assert!(cc.in_slow_start());
        }
    }

    #[test]
    fn newreno_avoidance_adds_one_mss_per_window() {
        let mut cc = NewReno::new(MSS);
        cc.on_congestion(Instant::ZERO, 40 * MSS);
        assert_eq!(cc.cwnd(), 20 * MSS);
        let mut now = Instant::ZERO;
        ack_window(&mut cc, &mut now, Duration::from_millis(10));
        assert_eq!(cc.cwnd(), 21 * MSS);
        ack_window(&mut cc, &mut now, Duration::from_millis(10));
        assert_eq!(cc.cwnd(), 22 * MSS);
    }

    #[test]
    fn reductions() {
        let mut reno = NewReno::new(MSS);
        let mut cubic = Cubic::new(MSS);
        for cc in [&mut reno as &mut dyn CongestionControl, &mut cubic] {
            let mut now = Instant::ZERO;
            for _ in 0..4 {
                ack_window(cc, &mut now, Duration::from_millis(10));
            }
        }
        let (r0, c0) = (reno.cwnd(), cubic.cwnd());
        reno.on_congestion(Instant::ZERO, r0);
        cubic.on_congestion(Instant::ZERO, c0);
        assert_eq!(reno.cwnd(), r0 / 2);
        assert_eq!(cubic.cwnd(), (c0 as f64 * 0.7) as usize);
        reno.on_timeout(Instant::ZERO, r0);
        cubic.on_timeout(Instant::ZERO, c0);
        assert_eq!((reno.cwnd(), cubic.cwnd()), (MSS, MSS));
        assert!(reno.ssthresh() >= 2 * MSS && cubic.ssthresh() >= 2 * MSS);
    }

    #[test]
    fn cubic_is_concave_then_convex_around_w_max() {
        let mut cc = Cubic::new(MSS);
        // Grow to 100 segments, then lose.
        cc.w.cwnd = 100 * MSS;
        cc.w.ssthresh = 100 * MSS;
        cc.on_congestion(Instant::ZERO, 100 * MSS);
        assert_eq!(cc.cwnd(), 70 * MSS);
        let rtt = Duration::from_millis(100);
        let mut now = Instant::ZERO;
        let mut samples = Vec::new();
        for _ in 0..120 {
            ack_window(&mut cc, &mut now, rtt);
            samples.push((now.as_millis(), cc.cwnd() / MSS));
        }
        // K = cbrt(100 * 0.3 / 0.4) = 4.2 s: near K the window sits near W_max.
        let k_ms = ((100.0 * 0.3 / 0.4f64).cbrt() * 1000.0) as u64;
        let at_k = samples
            .iter()
            .find(|(t, _)| *t >= k_ms)
            .map(|(_, w)| *w)
            .unwrap();
        assert!((95..=106).contains(&at_k), "cwnd at K: {at_k}");
        // Concave before K: growth slows as W_max approaches.
        let g = |a: u64, b: u64| {
            let w = |t: u64| {
                samples
                    .iter()
                    .find(|(x, _)| *x >= t)
                    .map(|(_, w)| *w as i64)
                    .unwrap()
            };
            w(b) - w(a)
        };
        assert!(g(500, 1500) > g(2500, 3500), "concave before K");
        // Convex after K: growth speeds up again.
        assert!(
            g(k_ms + 3000, k_ms + 4000) > g(k_ms, k_ms + 1000),
            "convex after K"
        );
    }

    #[test]
    fn cubic_fast_convergence() {
        let mut cc = Cubic::new(MSS);
        cc.w.cwnd = 100 * MSS;
        cc.w.ssthresh = 100 * MSS;
        cc.on_congestion(Instant::ZERO, 0);
        assert_eq!(cc.w_max_bytes(), 100 * MSS);
        // A second loss before regaining W_max lowers W_max below the window.
        cc.on_congestion(Instant::ZERO, 0);
        assert!(cc.w_max_bytes() < 70 * MSS + MSS && cc.w_max_bytes() > 50 * MSS);
    }

    #[test]
    fn cubic_reno_friendly_at_small_bdp() {
        // Short RTT, small W_max: the cubic curve is flat, Reno's line wins.
        let mut cubic = Cubic::new(MSS);
        cubic.w.cwnd = 10 * MSS;
        cubic.w.ssthresh = 10 * MSS;
        cubic.on_congestion(Instant::ZERO, 0);
        let start = cubic.cwnd();
        let mut now = Instant::ZERO;
        for _ in 0..20 {
            ack_window(&mut cubic, &mut now, Duration::from_micros(100));
        }
        // 20 RTTs of 0.1 ms: cubic alone would barely move; Reno-friendly
        // growth adds about alpha (0.53) segment per RTT.
        let grown = (cubic.cwnd() - start) / MSS;
        assert!((5..=20).contains(&grown), "grew {grown} segments");
    }

    #[test]
    fn parse_algorithm() {
        assert_eq!("cubic".parse::<Algorithm>(), Ok(Algorithm::Cubic));
        assert_eq!("NewReno".parse::<Algorithm>(), Ok(Algorithm::NewReno));
        assert_eq!("reno".parse::<Algorithm>(), Ok(Algorithm::NewReno));
        assert!("bbr".parse::<Algorithm>().is_err());
        assert_eq!(Algorithm::Cubic.to_string(), "cubic");
    }
}
