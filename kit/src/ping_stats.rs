//! What a ping run reports, whatever carried the probes: [`RttStats`]
//! (iputils' min/avg/max/mdev), [`PingSummary`] (its totals, with room for
//! a transport's own figures in [`PingSummary::extra`]) and [`linger`]
//! (iputils' wait for the last replies). [`crate::ping_engine`] keeps them.

use std::time::Duration;

/// How long a pinger with a count waits after its last request for the
/// replies still outstanding, decided when that request leaves, as iputils
/// ping does (`schedule_exit`): with any reply in, twice the longest RTT
/// seen but at least one interval; with none, the whole `timeout` (`-W`).
/// It stops sooner when every request is answered.
pub fn linger(received: u64, max_rtt: Duration, interval: Duration, timeout: Duration) -> Duration {
    if received > 0 {
        (max_rtt * 2).max(interval)
    } else {
        timeout
    }
}

/// Running RTT statistics, as iputils ping reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RttStats {
    /// Samples taken.
    pub count: u64,
    /// Smallest RTT (zero before the first sample).
    pub min: Duration,
    /// Largest RTT.
    pub max: Duration,
    sum_ns: f64,
    sum_sq_ns: f64,
}

impl RttStats {
    /// Take one sample.
    pub fn add(&mut self, rtt: Duration) {
        if self.count == 0 || rtt < self.min {
            self.min = rtt;
        }
        self.max = self.max.max(rtt);
        let ns = rtt.as_nanos() as f64;
        self.sum_ns += ns;
        self.sum_sq_ns += ns * ns;
        self.count += 1;
    }

    /// Mean RTT (zero before the first sample).
    pub fn avg(&self) -> Duration {
        if self.count == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos((self.sum_ns / self.count as f64) as u64)
    }

    /// Mean deviation as ping computes it: `sqrt(E[rtt^2] - E[rtt]^2)`.
    pub fn mdev(&self) -> Duration {
        if self.count == 0 {
            return Duration::ZERO;
        }
        let n = self.count as f64;
        let mean = self.sum_ns / n;
        let var = (self.sum_sq_ns / n - mean * mean).max(0.0);
        Duration::from_nanos(var.sqrt() as u64)
    }
}

/// What a transport keeps beside ping's totals ([`PingSummary::extra`]):
/// `()` for ICMP, [`crate::ud_ping::UdExtra`] (NIC-stamped count, samples
/// for percentiles) for UD.
pub trait SummaryExtra: Default + Clone + core::fmt::Debug {
    /// One timed answer (every RTT [`PingSummary::record`] takes).
    fn sample(&mut self, rtt: Duration) {
        let _ = rtt;
    }
}

impl SummaryExtra for () {}

/// Totals of a ping run; `X` holds what a transport reports beyond them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PingSummary<X = ()> {
    /// Requests sent.
    pub transmitted: u64,
    /// Requests answered (first reply to each; duplicates not counted).
    pub received: u64,
    /// Further replies to a request already answered (ping's `DUP!`).
    pub duplicates: u64,
    /// Requests that failed: answered with an ICMP destination
    /// unreachable, or a UD send that completed in error.
    pub errors: u64,
    /// RTTs of the answered requests that were timed.
    pub rtt: RttStats,
    /// The transport's own figures.
    pub extra: X,
}

impl<X> PingSummary<X> {
    /// Packet loss in percent of transmitted.
    pub fn loss_percent(&self) -> f64 {
        if self.transmitted == 0 {
            return 0.0;
        }
        100.0 * (self.transmitted.saturating_sub(self.received)) as f64 / self.transmitted as f64
    }

    /// Lost requests (sent, never answered).
    pub fn lost(&self) -> u64 {
        self.transmitted.saturating_sub(self.received)
    }
}

impl<X: SummaryExtra> PingSummary<X> {
    /// One answered request and its RTT.
    pub fn record(&mut self, rtt: Duration) {
        self.received += 1;
        self.rtt.add(rtt);
        self.extra.sample(rtt);
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn rtt_stats_match_ping_formula() {
        let mut s = RttStats::default();
        for ms in [1u64, 2, 3, 4] {
            s.add(Duration::from_millis(ms));
        }
        assert_eq!(s.min, Duration::from_millis(1));
        assert_eq!(s.max, Duration::from_millis(4));
        assert_eq!(s.avg(), Duration::from_micros(2500));
        // sqrt(7.5 - 6.25) ms = 1.118 ms
        assert_eq!(s.mdev().as_micros(), 1118);
    }

    #[test]
    fn loss_percent() {
        let s: PingSummary = PingSummary {
            transmitted: 10,
            received: 7,
            ..PingSummary::default()
        };
        assert!((s.loss_percent() - 30.0).abs() < 1e-9);
        assert_eq!(s.lost(), 3);
        assert_eq!(PingSummary::<()>::default().loss_percent(), 0.0);
    }

    #[test]
    fn linger_as_iputils() {
        let ms = Duration::from_millis;
        assert_eq!(linger(0, ms(0), ms(1000), ms(10_000)), ms(10_000));
        assert_eq!(linger(2, ms(3), ms(1000), ms(10_000)), ms(1000));
        assert_eq!(linger(2, ms(800), ms(1000), ms(10_000)), ms(1600));
    }
}
