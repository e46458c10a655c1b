//! Retransmission timeout estimation per RFC 6298, with exponential backoff.
//!
//! The estimator keeps SRTT and RTTVAR in integer nanoseconds (no float
//! drift, no overflow: intermediate sums are 128-bit) and derives the base
//! RTO from them; [`RttEstimator::rto`] applies the backoff on top.

use std::time::Duration;

/// Bounds and constants of the RTO computation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RttConfig {
    /// RTO before the first measurement (RFC 6298 §2.1: 1 s).
    pub initial_rto: Duration,
    /// Floor of the RTO's variance term: RTO = SRTT + max(G, 4 RTTVAR,
    /// `min_rto`), as Linux's (`tcp_rto_min` bounds `rttvar_us`). RFC
    /// 6298 §2.4 floors the whole RTO at 1 s; deployed stacks use 200 ms,
    /// and a userspace stack on a short link may go lower. On the
    /// variance term, a path whose RTT nears the floor keeps a margin
    /// over it (a delayed ACK does not fire the timer), and the timings
    /// match Linux's, which packetdrill's scripts spell.
    pub min_rto: Duration,
    /// Ceiling of the RTO, backoff included (RFC 6298 §2.5: at least 60 s).
    /// If it is below `min_rto`, it wins.
    pub max_rto: Duration,
    /// Clock granularity G (RFC 6298 §2).
    pub granularity: Duration,
}

impl Default for RttConfig {
    fn default() -> Self {
        RttConfig {
            initial_rto: Duration::from_secs(1),
            min_rto: Duration::from_millis(200),
            max_rto: Duration::from_secs(60),
            granularity: Duration::from_millis(1),
        }
    }
}

/// SRTT, RTTVAR and the RTO of one connection (RFC 6298).
#[derive(Debug, Clone)]
pub struct RttEstimator {
    cfg: RttConfig,
    /// Smoothed RTT in nanoseconds; `None` until the first measurement.
    srtt: Option<u64>,
    /// RTT variation in nanoseconds (meaningful once `srtt` is set).
    rttvar: u64,
    /// RTO before backoff, already clamped to the configured bounds.
    base_rto: Duration,
    /// Timer expirations since the last measurement or reset.
    backoffs: u32,
}

/// Nanoseconds of `d`, saturating at `u64::MAX` (about 584 years).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `v` saturated into `u64`.
fn sat_u64(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

impl RttEstimator {
    /// An estimator with no measurement yet: the RTO is `initial_rto`,
    /// clamped to `[min_rto, max_rto]`.
    pub fn new(cfg: RttConfig) -> Self {
        let base_rto = clamp(&cfg, cfg.initial_rto);
        RttEstimator {
            cfg,
            srtt: None,
            rttvar: 0,
            base_rto,
            backoffs: 0,
        }
    }

    /// Feed one RTT measurement R.
    ///
    /// The caller applies Karn's rule: no sample from a retransmitted segment
    /// unless it comes from a timestamp echo. First sample (RFC 6298 §2.2):
    /// SRTT = R, RTTVAR = R/2. Later ones (§2.3): RTTVAR = 3/4 RTTVAR +
    /// 1/4 |SRTT - R|, then SRTT = 7/8 SRTT + 1/8 R. RTO = SRTT + max(G,
    /// 4 RTTVAR, `min_rto`), at most `max_rto`. A measurement also clears
    /// the backoff (§5.7 note, Karn).
    pub fn sample(&mut self, rtt: Duration) {
        let r = nanos(rtt);
        let (srtt, rttvar) = match self.srtt {
            None => (r, r / 2),
            Some(s) => {
                let delta = u128::from(s.abs_diff(r));
                let var = (3 * u128::from(self.rttvar) + delta) / 4;
                let srtt = (7 * u128::from(s) + u128::from(r)) / 8;
                (sat_u64(srtt), sat_u64(var))
            }
        };
        self.srtt = Some(srtt);
        self.rttvar = rttvar;
        let g = u128::from(nanos(self.cfg.granularity));
        let floor = u128::from(nanos(self.cfg.min_rto));
        let rto = u128::from(srtt) + g.max(4 * u128::from(rttvar)).max(floor);
        self.base_rto = clamp(&self.cfg, Duration::from_nanos(sat_u64(rto)));
        self.backoffs = 0;
    }

    /// Smoothed RTT, once there has been a measurement.
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt.map(Duration::from_nanos)
    }

    /// RTT variation, once there has been a measurement.
    pub fn rttvar(&self) -> Option<Duration> {
        self.srtt.map(|_| Duration::from_nanos(self.rttvar))
    }

    /// The current RTO with backoff: the base RTO doubled once per
    /// [`backoff`](Self::backoff), capped at `max_rto`.
    pub fn rto(&self) -> Duration {
        let max = self.cfg.max_rto;
        1u32.checked_shl(self.backoffs)
            .and_then(|factor| self.base_rto.checked_mul(factor))
            .map_or(max, |d| d.min(max))
    }

    /// The retransmission timer expired: double the RTO (RFC 6298 §5.5).
    pub fn backoff(&mut self) {
        self.backoffs = self.backoffs.saturating_add(1);
    }

    /// Timer expirations since the last measurement or
    /// [`reset_backoff`](Self::reset_backoff).
    pub fn backoffs(&self) -> u32 {
        self.backoffs
    }

    /// Drop the backoff, going back to the base RTO.
    pub fn reset_backoff(&mut self) {
        self.backoffs = 0;
    }
}

/// `d` within `[min_rto, max_rto]`; `max_rto` wins if the bounds cross
/// (`Duration::clamp` would panic).
fn clamp(cfg: &RttConfig, d: Duration) -> Duration {
    d.max(cfg.min_rto).min(cfg.max_rto)
}

#[cfg(test)]
mod test {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn no_floor() -> RttConfig {
        RttConfig {
            min_rto: Duration::ZERO,
            ..RttConfig::default()
        }
    }

    #[test]
    fn initial_rto_before_any_sample() {
        let r = RttEstimator::new(RttConfig::default());
        assert_eq!(r.rto(), ms(1000));
        assert_eq!(r.srtt(), None);
        assert_eq!(r.rttvar(), None);
        assert_eq!(r.backoffs(), 0);
    }

    #[test]
    fn first_sample() {
        let mut r = RttEstimator::new(no_floor());
        r.sample(ms(100));
        assert_eq!(r.srtt(), Some(ms(100)));
        assert_eq!(r.rttvar(), Some(ms(50)));
        // 100 + max(1, 4 * 50)
        assert_eq!(r.rto(), ms(300));
    }

    #[test]
    fn converges_to_a_steady_rtt() {
        let mut r = RttEstimator::new(no_floor());
        r.sample(ms(500));
        for _ in 0..200 {
            r.sample(ms(40));
        }
        let srtt = r.srtt().unwrap_or_default();
        assert!(
            srtt.abs_diff(ms(40)) < Duration::from_micros(10),
            "{srtt:?}"
        );
        let var = r.rttvar().unwrap_or(Duration::MAX);
        assert!(var < Duration::from_micros(10), "{var:?}");
        // RTTVAR has vanished: RTO = SRTT + G.
        assert!(
            r.rto().abs_diff(ms(41)) < Duration::from_micros(50),
            "{:?}",
            r.rto()
        );
    }

    #[test]
    fn floor_holds_the_rto() {
        let mut r = RttEstimator::new(RttConfig::default());
        for _ in 0..100 {
            r.sample(ms(10));
        }
        // On the variance term, as Linux's: SRTT + 200 ms.
        assert!(
            r.rto().abs_diff(ms(210)) < Duration::from_micros(50),
            "{:?}",
            r.rto()
        );
        // A lower, configurable floor.
        let mut r = RttEstimator::new(RttConfig {
            min_rto: ms(5),
            ..RttConfig::default()
        });
        for _ in 0..100 {
            r.sample(Duration::from_micros(100));
        }
        assert!(r.rto().abs_diff(Duration::from_micros(5100)) < Duration::from_micros(5));
    }

    #[test]
    fn granularity_bounds_the_variance_term() {
        let mut r = RttEstimator::new(RttConfig {
            min_rto: Duration::ZERO,
            granularity: ms(10),
            ..RttConfig::default()
        });
        r.sample(ms(2));
        // 4 * RTTVAR = 4 ms < G = 10 ms.
        assert_eq!(r.rto(), ms(12));
    }

    #[test]
    fn ceiling_holds_the_rto() {
        let mut r = RttEstimator::new(RttConfig::default());
        r.sample(Duration::from_secs(100));
        assert_eq!(r.rto(), Duration::from_secs(60));
        // Absurd samples neither panic nor overflow.
        r.sample(Duration::MAX);
        r.sample(Duration::ZERO);
        assert_eq!(r.rto(), Duration::from_secs(60));
    }

    #[test]
    fn initial_rto_is_clamped() {
        let r = RttEstimator::new(RttConfig {
            initial_rto: Duration::from_secs(600),
            ..RttConfig::default()
        });
        assert_eq!(r.rto(), Duration::from_secs(60));
        let r = RttEstimator::new(RttConfig {
            initial_rto: ms(50),
            ..RttConfig::default()
        });
        assert_eq!(r.rto(), ms(200));
        // Crossed bounds: the ceiling wins, nothing panics.
        let mut r = RttEstimator::new(RttConfig {
            min_rto: Duration::from_secs(10),
            max_rto: Duration::from_secs(2),
            ..RttConfig::default()
        });
        r.sample(ms(1));
        assert_eq!(r.rto(), Duration::from_secs(2));
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let mut r = RttEstimator::new(RttConfig::default());
        r.sample(ms(100));
        assert_eq!(r.rto(), ms(300));
        r.backoff();
        assert_eq!(r.backoffs(), 1);
        assert_eq!(r.rto(), ms(600));
        r.backoff();
        assert_eq!(r.rto(), ms(1200));
        for _ in 0..5 {
            r.backoff();
        }
        // 300 ms * 2^7 = 38.4 s, still under the cap.
        assert_eq!(r.rto(), ms(38_400));
        r.backoff();
        assert_eq!(r.rto(), Duration::from_secs(60));
        // Far past the shift width: still the cap, no panic.
        for _ in 0..100 {
            r.backoff();
        }
        assert_eq!(r.backoffs(), 108);
        assert_eq!(r.rto(), Duration::from_secs(60));
        r.reset_backoff();
        assert_eq!(r.backoffs(), 0);
        assert_eq!(r.rto(), ms(300));
    }

    #[test]
    fn backoff_applies_to_the_initial_rto() {
        let mut r = RttEstimator::new(RttConfig::default());
        r.backoff();
        r.backoff();
        assert_eq!(r.rto(), ms(4000));
    }

    #[test]
    fn new_sample_resets_backoff() {
        let mut r = RttEstimator::new(RttConfig::default());
        r.sample(ms(100));
        for _ in 0..4 {
            r.backoff();
        }
        assert_eq!(r.rto(), ms(4800));
        r.sample(ms(100));
        assert_eq!(r.backoffs(), 0);
        // SRTT 100, RTTVAR 3/4 * 50 = 37.5: RTO = 100 + max(150, 200) ms.
        assert_eq!(r.rto(), ms(300));
    }

    #[test]
    fn jittery_series_matches_hand_computation() {
        let mut r = RttEstimator::new(no_floor());
        // R (ms):   80   120   40       200        100
        // RTTVAR:   40   40    41.25    61.09375   47.20703125
        // SRTT:     80   85    79.375   94.453125  95.146484375
        // RTTVAR = 3/4 RTTVAR + 1/4 |SRTT - R| with the SRTT before the
        // sample; then SRTT = 7/8 SRTT + 1/8 R. Nanoseconds truncate.
        let steps: [(u64, u64, u64); 5] = [
            (80, 80_000_000, 40_000_000),
            (120, 85_000_000, 40_000_000),
            (40, 79_375_000, 41_250_000),
            (200, 94_453_125, 61_093_750),
            (100, 95_146_484, 47_207_031),
        ];
        for (sample, srtt, var) in steps {
            r.sample(ms(sample));
            assert_eq!(
                (r.srtt(), r.rttvar()),
                (
                    Some(Duration::from_nanos(srtt)),
                    Some(Duration::from_nanos(var))
                ),
                "after R = {sample} ms"
            );
        }
        // RTO = 95.146484 + 4 * 47.207031 ms.
        assert_eq!(r.rto(), Duration::from_nanos(283_974_608));
    }
}
