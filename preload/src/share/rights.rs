//! Passing a ustack socket to another process (`SCM_RIGHTS`).
//!
//! A ustack socket's descriptor is an eventfd: `sendmsg` on a Unix socket
//! hands the receiver a descriptor to the same eventfd, which the kernel
//! names by an id (`eventfd-id` in `/proc/self/fdinfo`, Linux 6.0 on).
//! The sender *lends* each ustack socket it passes: the owner's server
//! keeps it open under that id while it is in flight (as the kernel keeps
//! a file in flight open), with what the receiver needs to rebuild it
//! (kind, flags, options: [`Carried`]). The receiver's `recvmsg` looks at
//! each eventfd it got and *claims* those lent: the socket is in its table
//! from then on, and the server counts it among what the receiver holds.
//!
//! A socket passed to a process that never claims it (one without the
//! layer, or a message never read) stays open in the stack, as a kernel
//! socket does while a descriptor to it sits in a Unix socket's queue.

use std::ffi::CString;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering};

use super::exec::Carried;
use super::{Op, client, server};
use crate::real::real;

/// A descriptor of `/proc` kept from before `main` (-1: none): a program
/// that chroots (vsftpd's session process) still reads its descriptors'
/// `fdinfo` through it.
static PROC: AtomicI32 = AtomicI32::new(-1);

/// Before `main`, in a program on the stack: keep a descriptor of `/proc`.
pub fn init() {
    // SAFETY: the C library's open of a static path.
    let fd = unsafe {
        (real().open)(
            c"/proc".as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            0,
        )
    };
    if fd >= 0 {
        crate::own::record(fd);
        PROC.store(fd, Ordering::Release);
    }
}

/// The kernel's id of eventfd `fd` (None: not an eventfd, or a kernel
/// without the field).
pub fn eventfd_id(fd: RawFd) -> Option<u64> {
    let r = real();
    let proc = PROC.load(Ordering::Acquire);
    let rel = CString::new(format!("{}/fdinfo/{fd}", std::process::id())).ok()?;
    let flags = libc::O_RDONLY | libc::O_CLOEXEC;
    let f = if proc >= 0 {
        // SAFETY: opening a path under our /proc descriptor.
        unsafe { (r.openat)(proc, rel.as_ptr(), flags, 0) }
    } else {
        let abs = CString::new(format!("/proc/{}", rel.to_str().ok()?)).ok()?;
        // SAFETY: the C library's open of our path.
        unsafe { (r.open)(abs.as_ptr(), flags, 0) }
    };
    if f < 0 {
        return None;
    }
    let mut buf = [0u8; 512];
    // SAFETY: reading into our buffer, then closing our descriptor.
    let n = unsafe {
        let n = (r.read)(f, buf.as_mut_ptr().cast(), buf.len());
        (r.close)(f);
        n
    };
    let info = std::str::from_utf8(buf.get(..usize::try_from(n).ok()?)?).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("eventfd-id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Before a `sendmsg` on a kernel socket whose control messages pass
/// `fds`: lend the ustack sockets among them. The ids lent, to take back
/// with [`unlend`] when the send fails.
pub fn lend(fds: &[RawFd]) -> Vec<u64> {
    let mut lent = Vec::new();
    for &fd in fds {
        let Some(sock) = crate::sock::get_checked(fd) else {
            continue;
        };
        let Some(id) = eventfd_id(fd) else {
            crate::report::notice("pass-socket", || {
                "a ustack socket passed with SCM_RIGHTS cannot be named (no eventfd id: a kernel before 6.0, or no /proc): the receiver gets a plain eventfd".to_string()
            });
            continue;
        };
        let carried = Carried::of(&sock, Vec::new());
        let r = server::socket_ref(carried.kind);
        let Ok(bytes) = postcard::to_stdvec(&carried) else {
            continue;
        };
        let ok = match client() {
            Some(c) => c
                .call::<()>(
                    &Op::lend {
                        r,
                        id,
                        carried: bytes,
                    },
                    None,
                )
                .is_ok_and(|r| r.is_ok()),
            None => server::lend(r, id, bytes),
        };
        if ok {
            lent.push(id);
        }
    }
    lent
}

/// The `sendmsg` that would have passed `ids` failed: they are not in
/// flight.
pub fn unlend(ids: &[u64]) {
    for &id in ids {
        let _ = claim_carried(id, true);
    }
}

/// After a `recvmsg` on a kernel socket gave this process `fds`: those
/// that are ustack sockets another process lent become this one's.
pub fn adopt(fds: &[RawFd]) {
    if !crate::lifecycle::planned() {
        return;
    }
    for &fd in fds {
        let Some(id) = eventfd_id(fd) else {
            continue;
        };
        if !crate::lifecycle::start_for_socket() {
            return;
        }
        let Some(mut carried) = claim_carried(id, false) else {
            continue;
        };
        carried.fds = vec![fd];
        let Some((sock, r)) = carried.install() else {
            continue;
        };
        match (client(), r) {
            // The owner takes it back: its own watcher from now on.
            (None, Some(r)) => server::adopted(r, &sock),
            _ => sock.notify(),
        }
    }
}

/// Claim (or, `undo`, take back) the socket lent under `id`: what it was.
fn claim_carried(id: u64, undo: bool) -> Option<Carried> {
    let bytes = match client() {
        Some(c) => c
            .call::<Option<Vec<u8>>>(&Op::claim { id, undo }, None)
            .ok()?
            .ok()??,
        None => server::claim(None, id, undo)?,
    };
    postcard::from_bytes(&bytes).ok()
}
