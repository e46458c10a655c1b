//! The wall-side clock: read once per poll-loop iteration and passed into the engine.
//!
//! `std::time::Instant` is `clock_gettime(CLOCK_MONOTONIC)` through the vDSO,
//! which on x86_64 reads the TSC without a system call: cheap enough to read
//! once per loop iteration.

use ustack::time::Instant;

/// A monotonic clock. Every clock of a process shares one origin (the
/// first clock's creation), so stacks on several threads, and the ends of
/// an in-process simulated link, agree on engine time.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin: std::time::Instant,
}

static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

impl Clock {
    /// A clock on the process's shared origin (set by the first clock made).
    pub fn new() -> Self {
        Clock {
            origin: *ORIGIN.get_or_init(std::time::Instant::now),
        }
    }

    /// Engine time now.
    pub fn now(&self) -> Instant {
        let d = self.origin.elapsed();
        Instant::from_nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    /// The `std` instant matching an engine instant (for sleeping until a deadline).
    pub fn to_std(&self, t: Instant) -> std::time::Instant {
        self.origin + core::time::Duration::from_nanos(t.as_nanos())
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}
