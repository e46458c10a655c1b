//! The stack's own descriptors: its NIC's (libpcap's socket, DPDK's
//! files), its telemetry and metrics sockets, its loop's wake-ups.
//!
//! Programs close descriptors they never opened: OpenSSH's clients and
//! daemons call `closefrom(3)` first thing, daemons loop `close` over every
//! number, and Python's `os.closerange` calls `close_range`. Without care
//! such a program closes the stack's NIC under it (every socket call then
//! fails with EIO). The descriptors the stack opened when it started are
//! recorded
//! here; `close` of one fails with EBADF (as if it were not open, which for
//! the program it is not), `close_range` and `closefrom` close around
//! them, and `dup2`/`dup3` onto one fail with EBUSY.
//!
//! The set is written once per stack started (at the first AF_INET
//! socket, under the start lock, or in a forked child starting a worker's
//! stack) and read with atomics, so no lock is held across `fork`.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

/// At most this many descriptors are recorded (DPDK with a few vdevs opens
/// a few dozen; more are left unprotected, and said so).
const MAX: usize = 512;

static OWN: [AtomicI32; MAX] = [const { AtomicI32::new(-1) }; MAX];
static LEN: AtomicUsize = AtomicUsize::new(0);

/// The descriptors open in this process now (from `/proc/self/fd`; the
/// listing's own descriptor is closed again by the time this returns and
/// is left out).
pub fn open_now() -> Vec<RawFd> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let mut fds: Vec<RawFd> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    fds.retain(|&fd| is_open(fd));
    fds
}

/// Whether `fd` is an open descriptor.
fn is_open(fd: RawFd) -> bool {
    // SAFETY: the C library's fcntl with F_GETFD only reads the
    // descriptor's flags; a closed number fails with EBADF.
    unsafe { (crate::real::real().fcntl)(fd, libc::F_GETFD) != -1 }
}

/// The stack just started: every descriptor open now and not in `before`
/// is the stack's (replacing any set recorded before, e.g. the master's
/// stack in a forked worker, whose copies the worker may close).
pub fn record_since(before: &[RawFd]) {
    let mine: Vec<RawFd> = open_now()
        .into_iter()
        .filter(|fd| before.binary_search(fd).is_err())
        .collect();
    if mine.len() > MAX {
        eprintln!(
            "ustack exec: the stack opened {} descriptors; the first {MAX} are kept from the program's close calls",
            mine.len()
        );
    }
    let n = mine.len().min(MAX);
    LEN.store(0, Ordering::Release);
    for (slot, &fd) in OWN.iter().zip(&mine[..n]) {
        slot.store(fd, Ordering::Relaxed);
    }
    LEN.store(n, Ordering::Release);
}

/// One more descriptor of the stack's, opened after it started (the
/// channels of the processes that share it).
pub fn record(fd: RawFd) {
    let n = LEN.load(Ordering::Acquire);
    if let Some(slot) = OWN.get(n) {
        slot.store(fd, Ordering::Relaxed);
        LEN.store(n + 1, Ordering::Release);
    }
}

/// A recorded descriptor closed by the layer: its slot becomes a hole.
pub fn forget(fd: RawFd) {
    for a in &OWN[..LEN.load(Ordering::Acquire)] {
        let _ = a.compare_exchange(fd, -1, Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// A client's channel to the stack's owner (-1: none): kept from the
/// program too.
static CHANNEL: AtomicI32 = AtomicI32::new(-1);

/// This process is a client now, over `fd` (the parent's recorded
/// descriptors are not its own any more).
pub fn set_channel(fd: RawFd) {
    CHANNEL.store(fd, Ordering::Release);
}

/// The descriptors kept from the program: the recorded ones while this
/// process runs the stack (a forked child without it may close its
/// copies), none otherwise.
fn kept() -> &'static [AtomicI32] {
    if crate::state::state().is_none() {
        return &[];
    }
    &OWN[..LEN.load(Ordering::Acquire)]
}

/// The descriptors kept from the program, ascending.
pub fn guarded_all() -> Vec<RawFd> {
    let mut v: Vec<RawFd> = kept()
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .chain(Some(CHANNEL.load(Ordering::Acquire)))
        .filter(|&fd| fd >= 0)
        .collect();
    v.sort_unstable();
    v
}

/// Whether `fd` is kept from the program.
pub fn guarded(fd: RawFd) -> bool {
    fd >= 0
        && (CHANNEL.load(Ordering::Acquire) == fd
            || kept().iter().any(|a| a.load(Ordering::Relaxed) == fd))
}

/// Split `first..=last` into the runs that hold none of `skip` (ascending).
pub fn gaps(first: u32, last: u32, skip: &[u32]) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut from = Some(first);
    for &s in skip.iter().filter(|&&s| s >= first && s <= last) {
        if let Some(f) = from {
            if s > f {
                out.push((f, s - 1));
            }
        }
        from = s.checked_add(1).filter(|&n| n <= last);
        if from.is_none() {
            break;
        }
    }
    if let Some(f) = from {
        if f <= last {
            out.push((f, last));
        }
    }
    out
}

#[cfg(test)]
mod test {
    use super::gaps;

    #[test]
    fn gaps_leave_out_the_skipped_numbers() {
        assert_eq!(gaps(3, u32::MAX, &[]), vec![(3, u32::MAX)]);
        assert_eq!(gaps(3, 10, &[3, 5, 10]), vec![(4, 4), (6, 9)]);
        assert_eq!(gaps(3, 10, &[1, 2, 11]), vec![(3, 10)]);
        assert_eq!(gaps(3, 3, &[3]), vec![]);
        assert_eq!(gaps(0, u32::MAX, &[u32::MAX]), vec![(0, u32::MAX - 1)]);
        assert_eq!(gaps(4, 9, &[5, 6, 7]), vec![(4, 4), (8, 9)]);
    }
}
