//! Retransmission timeout per RFC 6298.

use std::time::Duration;

/// RTO bounds.
#[derive(Debug, Clone)]
pub struct RttConfig {
    /// RTO before the first sample (RFC 6298 2.1: 1 s).
    pub initial_rto: Duration,
    /// Floor of the RTO. RFC 6298 says 1 s; stacks use 200 ms, and a
    /// userspace stack on a fast link may go lower.
    pub min_rto: Duration,
    /// Ceiling of the RTO, backoff included (at least 60 s).
    pub max_rto: Duration,
    /// Clock granularity G.
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

/// Smoothed RTT, its variation, and the RTO with exponential backoff.
#[derive(Debug, Clone)]
pub struct RttEstimator {
    cfg: RttConfig,
    srtt: Option<Duration>,
    rttvar: Duration,
    rto: Duration,
    backoffs: u32,
}

impl RttEstimator {
    pub fn new(cfg: RttConfig) -> Self {
        let rto = cfg.initial_rto.clamp(cfg.min_rto, cfg.max_rto);
        RttEstimator {
            cfg,
            srtt: None,
            rttvar: Duration::ZERO,
            rto,
            backoffs: 0,
        }
    }

    /// One measurement R (the caller applies Karn's rule). Resets the backoff.
    pub fn sample(&mut self, r: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(srtt) => {
                let delta = srtt.abs_diff(r);
                self.rttvar = self.rttvar * 3 / 4 + delta / 4;
                self.srtt = Some(srtt * 7 / 8 + r / 8);
            }
        }
        let srtt = self.srtt.unwrap_or(r);
        let rto = srtt + self.cfg.granularity.max(self.rttvar * 4);
        self.rto = rto.clamp(self.cfg.min_rto, self.cfg.max_rto);
        self.backoffs = 0;
    }

    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }

    pub fn rttvar(&self) -> Option<Duration> {
        self.srtt.map(|_| self.rttvar)
    }

    /// The RTO with backoff applied.
    pub fn rto(&self) -> Duration {
        let factor = 1u32 << self.backoffs.min(16);
        self.rto.saturating_mul(factor).min(self.cfg.max_rto)
    }

    /// The timer expired: double the RTO (RFC 6298 5.5).
    pub fn backoff(&mut self) {
        self.backoffs = (self.backoffs + 1).min(16);
    }

    pub fn backoffs(&self) -> u32 {
        self.backoffs
    }

    pub fn reset_backoff(&mut self) {
        self.backoffs = 0;
    }
}

#[cfg(test)]
mod test {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn first_sample_and_convergence() {
        let mut r = RttEstimator::new(RttConfig::default());
        assert_eq!(r.rto(), ms(1000));
        r.sample(ms(100));
        assert_eq!(r.srtt(), Some(ms(100)));
        assert_eq!(r.rttvar(), Some(ms(50)));
        // 100 + 4 * 50
        assert_eq!(r.rto(), ms(300));
        for _ in 0..100 {
            r.sample(ms(100));
        }
        assert_eq!(r.srtt(), Some(ms(100)));
        // RTTVAR decays toward 0; the floor holds the RTO.
        assert_eq!(r.rto(), ms(200));
    }

    #[test]
    fn hand_computed_series() {
        let mut r = RttEstimator::new(RttConfig {
            min_rto: Duration::ZERO,
            ..RttConfig::default()
        });
        r.sample(ms(80));
        r.sample(ms(120));
        // RTTVAR = 3/4*40 + 1/4*40 = 40; SRTT = 7/8*80 + 1/8*120 = 85
        assert_eq!(r.srtt(), Some(ms(85)));
        assert_eq!(r.rttvar(), Some(ms(40)));
        assert_eq!(r.rto(), ms(245));
    }

    #[test]
    fn backoff_doubles_caps_and_resets() {
        let mut r = RttEstimator::new(RttConfig::default());
        r.sample(ms(100));
        r.backoff();
        assert_eq!(r.rto(), ms(600));
        r.backoff();
        assert_eq!(r.rto(), ms(1200));
        for _ in 0..20 {
            r.backoff();
        }
        assert_eq!(r.rto(), Duration::from_secs(60));
        r.sample(ms(100));
        assert_eq!(r.backoffs(), 0);
        assert!(r.rto() < ms(400));
    }

    #[test]
    fn floor_is_configurable() {
        let mut r = RttEstimator::new(RttConfig {
            min_rto: Duration::from_millis(5),
            ..RttConfig::default()
        });
        r.sample(Duration::from_micros(100));
        for _ in 0..50 {
            r.sample(Duration::from_micros(100));
        }
        assert_eq!(r.rto(), ms(5));
    }
}
