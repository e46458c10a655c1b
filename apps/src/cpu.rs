//! This process's CPU time from `/proc/self/stat`, for iperf3's
//! `cpu_utilization_percent` (the engine runs in the same process, so it
//! is the stack's CPU cost too).

use std::time::Instant;

/// Clock ticks per second of `/proc` times (USER_HZ; 100 on every Linux ABI).
const USER_HZ: f64 = 100.0;

/// A reading of user and system CPU seconds and the wall clock.
#[derive(Debug, Clone, Copy)]
pub struct CpuSample {
    user: f64,
    system: f64,
    at: Instant,
}

fn times() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 11 and 12 after ')'.
    let user: f64 = f.get(11)?.parse().ok()?;
    let system: f64 = f.get(12)?.parse().ok()?;
    Some((user / USER_HZ, system / USER_HZ))
}

impl CpuSample {
    pub fn now() -> Self {
        let (user, system) = times().unwrap_or((0.0, 0.0));
        CpuSample {
            user,
            system,
            at: Instant::now(),
        }
    }

    /// Percent of one CPU used since `self`: (total, user, system).
    pub fn percent_since(&self) -> (f64, f64, f64) {
        let now = CpuSample::now();
        let wall = now.at.duration_since(self.at).as_secs_f64();
        if wall <= 0.0 {
            return (0.0, 0.0, 0.0);
        }
        let user = (now.user - self.user).max(0.0) / wall * 100.0;
        let system = (now.system - self.system).max(0.0) / wall * 100.0;
        (user + system, user, system)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn busy_loop_shows_cpu() {
        let s = CpuSample::now();
        let mut x = 0u64;
        let t = Instant::now();
        while t.elapsed().as_millis() < 300 {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        let (total, user, system) = s.percent_since();
        assert!(total > 0.0, "{total}");
        assert!((total - user - system).abs() < 1e-9);
    }
}
