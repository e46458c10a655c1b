//! The Linux TCP settings of the program's network namespace that ustack
//! has a knob for, read when the stack starts: a program under
//! `ustack exec` gets the behaviour the host's administrator (or a test
//! script) chose with `sysctl`, as it would on the kernel's stack.
//!
//! | sysctl (`/proc/sys/net/ipv4/`) | engine setting |
//! |---|---|
//! | `tcp_timestamps` 0 | no timestamps option (RFC 7323) in SYNs |
//! | `tcp_sack` 0 | no SACK-permitted in SYNs |
//! | `tcp_window_scaling` 0 | no window scale option |
//!
//! A file that cannot be read leaves the setting as it was.

use ustack::Config;

/// `/proc/sys/net/ipv4/NAME` as a number.
fn read(name: &str) -> Option<i64> {
    std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Turn off what the namespace's sysctls turn off (a [`Config`] tweak for
/// the runtime's builder, run when the stack starts).
pub fn apply(c: &mut Config) {
    if read("tcp_timestamps") == Some(0) {
        c.tcp.timestamps = false;
    }
    if read("tcp_sack") == Some(0) {
        c.tcp.sack = false;
    }
    if read("tcp_window_scaling") == Some(0) {
        c.tcp.window_scaling = false;
    }
}
