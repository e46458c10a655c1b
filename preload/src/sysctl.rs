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
//! | `tcp_slow_start_after_idle` 0 | the window kept across idle time |
//! | `tcp_fastopen` 0x2, 0x200, 0x400 | Fast Open server (RFC 7413): on for listeners, data without a cookie, on for every listener without `TCP_FASTOPEN` |
//! | `tcp_fastopen_key` | the Fast Open cookie secret (so cookies are the host's) |
//! | `tcp_frto` 0 | no F-RTO (RFC 5682) after a timeout |
//! | `tcp_ecn` 0, 1, 2 | ECN (RFC 3168): off; asked for and granted; granted only (the default). 3 (AccECN) counts as 1, 4 and 5 as 2 |
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
    if read("tcp_slow_start_after_idle") == Some(0) {
        c.tcp.slow_start_after_idle = false;
    }
    if read("tcp_frto") == Some(0) {
        c.tcp.frto = false;
    }
    if let Some(mode) = read("tcp_ecn").and_then(ecn_mode) {
        c.tcp.ecn = mode;
    }
    c.tcp.fast_open_no_cookie = fast_open_flags() & FASTOPEN_SERVER_NO_COOKIE != 0;
    if let Some(key) = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_fastopen_key")
        .ok()
        .and_then(|k| fast_open_key(&k))
    {
        c.tcp.fast_open_key = Some(key);
    }
}

/// The ECN mode a `tcp_ecn` value chooses: Accurate ECN's values (3:
/// ask for it; 4, 5: grant it) map to classic ECN's, which is what
/// ustack speaks.
fn ecn_mode(v: i64) -> Option<ustack::socket::tcp::Ecn> {
    use ustack::socket::tcp::Ecn;
    match v {
        0 => Some(Ecn::Off),
        1 | 3 => Some(Ecn::On),
        2 | 4 | 5 => Some(Ecn::Accept),
        _ => None,
    }
}

/// `tcp_fastopen`'s client bit: `MSG_FASTOPEN` and
/// `TCP_FASTOPEN_CONNECT` may be used (Linux's default).
pub const FASTOPEN_CLIENT: i64 = 0x1;
/// `tcp_fastopen`'s server bit: listeners may take data in SYNs.
pub const FASTOPEN_SERVER: i64 = 0x2;
/// `tcp_fastopen`'s bit for data in SYNs without a cookie.
pub const FASTOPEN_SERVER_NO_COOKIE: i64 = 0x200;
/// `tcp_fastopen`'s bit for Fast Open on every listener, its queue the
/// backlog, without the `TCP_FASTOPEN` option.
pub const FASTOPEN_SERVER_ALWAYS: i64 = 0x400;

/// `net.ipv4.tcp_fastopen` (Linux's default 1: the client side only).
pub fn fast_open_flags() -> i64 {
    read("tcp_fastopen").unwrap_or(1)
}

/// The SipHash key of `tcp_fastopen_key`'s text (`w0-w1-w2-w3` in hex,
/// perhaps followed by `,` and a backup key): the words in little-endian
/// order, two to a key half, as Linux keys its cookies.
fn fast_open_key(text: &str) -> Option<(u64, u64)> {
    let primary = text.trim().split(',').next()?;
    let words: Vec<u32> = primary
        .split('-')
        .map(|w| u32::from_str_radix(w, 16))
        .collect::<Result<_, _>>()
        .ok()?;
    let [w0, w1, w2, w3] = words[..] else {
        return None;
    };
    let half = |lo: u32, hi: u32| u64::from(hi) << 32 | u64::from(lo);
    Some((half(w0, w1), half(w2, w3)))
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn fast_open_key_reads_linuxs_text() {
        assert_eq!(
            fast_open_key("a1a1a1a1-b2b2b2b2-c3c3c3c3-d4d4d4d4\n"),
            Some((0xb2b2_b2b2_a1a1_a1a1, 0xd4d4_d4d4_c3c3_c3c3))
        );
        assert_eq!(
            fast_open_key("00000001-00000002-00000003-00000004,ffffffff-0-0-0"),
            Some((0x2_0000_0001, 0x4_0000_0003))
        );
        assert_eq!(fast_open_key("a1-b2-c3"), None);
        assert_eq!(fast_open_key("zz-0-0-0"), None);
    }
}
