//! What the layer says about itself: calls and options it refused
//! (counted, and said once per kind on stderr) and what it left to the
//! kernel (said once per kind, in a line starting `ustack:`).

use std::collections::HashSet;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// Calls and options the layer refused, in all.
static UNSUPPORTED: AtomicU64 = AtomicU64::new(0);
static REPORTED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Count an unsupported call and say so on stderr once per kind.
pub fn unsupported(what: &str) {
    UNSUPPORTED.fetch_add(1, Ordering::Relaxed);
    let mut seen = REPORTED.lock();
    if seen
        .get_or_insert_with(HashSet::new)
        .insert(what.to_string())
    {
        eprintln!("ustack-preload: not supported (reported once): {what}");
    }
}

/// Notices said so far, by kind.
static NOTICED: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);

/// Say once per process on stderr, in one line starting `ustack:`, that
/// the layer left something to the kernel or refused it (`kind` names the
/// case; the first message of a kind is the one said).
pub fn notice(kind: &'static str, msg: impl FnOnce() -> String) {
    let first = NOTICED.lock().get_or_insert_with(HashSet::new).insert(kind);
    if first {
        eprintln!("ustack: {}", msg());
    }
}

/// An unsupported socket option.
pub fn unsupported_option(level: c_int, name: c_int) {
    let lvl = match level {
        libc::SOL_SOCKET => "SOL_SOCKET".to_string(),
        libc::IPPROTO_TCP => "IPPROTO_TCP".to_string(),
        libc::IPPROTO_IP => "IPPROTO_IP".to_string(),
        l => l.to_string(),
    };
    unsupported(&format!("socket option {lvl}/{name} (ENOPROTOOPT)"));
}

/// Calls and options refused so far (for telemetry and tests).
pub fn unsupported_count() -> u64 {
    UNSUPPORTED.load(Ordering::Relaxed)
}
