//! Engine time: a monotonic instant in nanoseconds since an arbitrary origin.
//!
//! The engine never reads a clock; callers pass `now` in. Durations are
//! `core::time::Duration`.

use core::ops::{Add, AddAssign, Sub};
use core::time::Duration;

/// A point in engine time, nanoseconds since the clock's origin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant {
    nanos: u64,
}

impl Instant {
    /// The origin.
    pub const ZERO: Instant = Instant { nanos: 0 };
    /// A time later than any the engine will see; used as "never".
    pub const FAR_FUTURE: Instant = Instant { nanos: u64::MAX };

    /// The instant `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Self {
        Instant { nanos }
    }
    /// The instant `us` microseconds after the origin (saturating).
    pub const fn from_micros(us: u64) -> Self {
        Instant {
            nanos: us.saturating_mul(1_000),
        }
    }
    /// The instant `ms` milliseconds after the origin (saturating).
    pub const fn from_millis(ms: u64) -> Self {
        Instant {
            nanos: ms.saturating_mul(1_000_000),
        }
    }
    /// The instant `s` seconds after the origin (saturating).
    pub const fn from_secs(s: u64) -> Self {
        Instant {
            nanos: s.saturating_mul(1_000_000_000),
        }
    }
    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.nanos
    }
    /// Whole microseconds since the origin (truncated).
    pub const fn as_micros(self) -> u64 {
        self.nanos / 1_000
    }
    /// Whole milliseconds since the origin (truncated).
    pub const fn as_millis(self) -> u64 {
        self.nanos / 1_000_000
    }
    /// Time elapsed since `earlier`, zero if `earlier` is in the future.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.nanos.saturating_sub(earlier.nanos))
    }
}

fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, rhs: Duration) -> Instant {
        Instant {
            nanos: self.nanos.saturating_add(duration_nanos(rhs)),
        }
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}

impl Sub<Duration> for Instant {
    type Output = Instant;
    fn sub(self, rhs: Duration) -> Instant {
        Instant {
            nanos: self.nanos.saturating_sub(duration_nanos(rhs)),
        }
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_duration_since(rhs)
    }
}

impl core::fmt::Display for Instant {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{}.{:09}s",
            self.nanos / 1_000_000_000,
            self.nanos % 1_000_000_000
        )
    }
}

/// The earlier of two optional deadlines.
pub fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Instant::from_millis(5);
        assert_eq!(t + Duration::from_millis(5), Instant::from_millis(10));
        assert_eq!(t - Duration::from_secs(1), Instant::ZERO);
        assert_eq!(Instant::ZERO - t, Duration::ZERO);
        assert_eq!(
            Instant::FAR_FUTURE + Duration::from_secs(1),
            Instant::FAR_FUTURE
        );
        assert_eq!(earliest(Some(t), None), Some(t));
        assert_eq!(earliest(Some(t), Some(Instant::ZERO)), Some(Instant::ZERO));
        assert_eq!(Instant::from_micros(1_500).to_string(), "0.001500000s");
    }
}
