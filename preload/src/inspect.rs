//! Calls that inspect a descriptor: a ustack socket looks like a socket
//! to them, as a kernel socket would (its eventfd underneath is the
//! layer's business).
//!
//! - `fstat` and its variants (`fstat64`, `__fxstat`, `__fxstat64`,
//!   `fstatat`/`newfstatat` with `AT_EMPTY_PATH`, `statx`): mode
//!   `S_IFSOCK | 0777`, size 0, an inode number of its own per socket.
//!   Ruby's `Socket.for_fd` and vsftpd's `fstat(0)` check ask this.
//! - `/proc/self/fd/N` (also `/proc/PID/fd/N` of this process,
//!   `/proc/thread-self/fd/N` and `/dev/fd/N`): `readlink` gives
//!   `socket:[INO]`, and `stat` through the link the socket's `fstat`.
//! - the socket ioctls' names, for the message an unsupported one gets.
//!
//! What another process reads about this one (`ls -l /proc/PID/fd`, `ss`,
//! `lsof`) still shows the eventfd: only this process's calls pass here.

use std::ffi::{CStr, c_char, c_int, c_uint};
use std::sync::Arc;

use libc::{size_t, ssize_t};

use crate::fd::{self, Kind, Sock};
use crate::real::Res;
use crate::real::{real, set_errno};
use crate::sock;

/// A socket's mode bits, as Linux reports them (`S_IFSOCK | 0777`).
const SOCK_MODE: u32 = libc::S_IFSOCK | 0o777;

/// The ustack socket a descriptor number names (checked: a number closed
/// behind the layer's back is not taken for one).
fn socket_of(fd: c_int) -> Option<Arc<Sock>> {
    sock::get_checked(fd)
}

/// Make an eventfd's `stat` a socket's.
fn patch_stat(st: &mut libc::stat, s: &Sock) {
    st.st_mode = SOCK_MODE;
    st.st_ino = s.ino;
    st.st_size = 0;
    st.st_blocks = 0;
    st.st_blksize = 4096;
    st.st_nlink = 1;
    st.st_rdev = 0;
}

/// `fstat` of a ustack socket into the caller's buffer.
///
/// # Safety
/// `buf` valid for a `struct stat`.
unsafe fn fstat_socket(fd: c_int, s: &Sock, buf: *mut libc::stat) -> c_int {
    if buf.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the C library's fstat of our eventfd into the caller's buffer.
    let r = unsafe { (real().fstat)(fd, buf) };
    if r == 0 {
        // SAFETY: filled by fstat just now.
        patch_stat(unsafe { &mut *buf }, s);
    }
    r
}

/// The descriptor number a `/proc/self/fd/N`-style path names, when the
/// path is one (this process's descriptor table seen through /proc).
fn proc_fd_number(path: &[u8]) -> Option<c_int> {
    let rest = if let Some(r) = path.strip_prefix(b"/dev/fd/") {
        r
    } else {
        let r = path.strip_prefix(b"/proc/")?;
        let slash = r.iter().position(|&b| b == b'/')?;
        let (who, tail) = (&r[..slash], &r[slash..]);
        let me = who == b"self"
            || who == b"thread-self"
            || std::str::from_utf8(who)
                .ok()
                .and_then(|w| w.parse::<u32>().ok())
                .is_some_and(|pid| pid == std::process::id());
        if !me {
            return None;
        }
        tail.strip_prefix(b"/fd/")?
    };
    if rest.is_empty() || rest.len() > 10 || !rest.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(rest).ok()?.parse().ok()
}

/// The ustack socket a path names through /proc, if any.
///
/// # Safety
/// `path` null or a C string.
unsafe fn socket_at_path(path: *const c_char) -> Option<(c_int, Arc<Sock>)> {
    if path.is_null() || fd::is_empty() {
        return None;
    }
    // SAFETY: the caller's C string.
    let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
    let n = proc_fd_number(bytes)?;
    Some((n, socket_of(n)?))
}

/// Whether a `*at` call's path and flags name `dirfd` itself.
///
/// # Safety
/// `path` null or a C string.
unsafe fn names_dirfd(path: *const c_char, flags: c_int) -> bool {
    // SAFETY: the caller's C string.
    flags & libc::AT_EMPTY_PATH != 0 && (path.is_null() || unsafe { *path } == 0)
}

/// The ustack socket a `*at` call names, if any: `dirfd` itself (with
/// `AT_EMPTY_PATH` and an empty path), or a socket through
/// `/proc/self/fd/N` when links are followed.
///
/// # Safety
/// `path` null or a C string.
unsafe fn socket_named(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
) -> Option<(c_int, Arc<Sock>)> {
    // SAFETY: the caller's path.
    if unsafe { names_dirfd(path, flags) } {
        return socket_of(dirfd).map(|s| (dirfd, s));
    }
    if flags & libc::AT_SYMLINK_NOFOLLOW != 0 {
        return None;
    }
    // SAFETY: the caller's path.
    unsafe { socket_at_path(path) }
}

/// `fstat(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstat(fd: c_int, buf: *mut libc::stat) -> c_int {
    match socket_of(fd) {
        // SAFETY: the caller's buffer.
        Some(s) => unsafe { fstat_socket(fd, &s, buf) },
        // SAFETY: passing the call on.
        None => unsafe { (real().fstat)(fd, buf) },
    }
}

/// `fstat64` (the same on 64-bit).
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstat64(fd: c_int, buf: *mut libc::stat) -> c_int {
    // SAFETY: the same call.
    unsafe { fstat(fd, buf) }
}

/// `__fxstat` (what programs built before glibc 2.33 call for `fstat`).
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstat(_ver: c_int, fd: c_int, buf: *mut libc::stat) -> c_int {
    // SAFETY: the same call (one `struct stat` layout on 64-bit).
    unsafe { fstat(fd, buf) }
}

/// `__fxstat64`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstat64(_ver: c_int, fd: c_int, buf: *mut libc::stat) -> c_int {
    // SAFETY: the same call.
    unsafe { fstat(fd, buf) }
}

/// `fstatat(2)` (`newfstatat`): the descriptor itself with
/// `AT_EMPTY_PATH`, or a ustack socket through `/proc/self/fd/N`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstatat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's path.
    if let Some((n, s)) = unsafe { socket_named(dirfd, path, flags) } {
        // SAFETY: the caller's buffer.
        return unsafe { fstat_socket(n, &s, buf) };
    }
    // SAFETY: the caller's path.
    if unsafe { names_dirfd(path, flags) } {
        // SAFETY: the C library's fstat of the caller's descriptor.
        return unsafe { (real().fstat)(dirfd, buf) };
    }
    // SAFETY: passing the call on.
    unsafe { (real().fstatat)(dirfd, path, buf, flags) }
}

/// `fstatat64`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstatat64(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: the same call.
    unsafe { fstatat(dirfd, path, buf, flags) }
}

/// `__fxstatat` (pre-2.33 builds).
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstatat(
    _ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: the same call.
    unsafe { fstatat(dirfd, path, buf, flags) }
}

/// `__fxstatat64`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstatat64(
    _ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: the same call.
    unsafe { fstatat(dirfd, path, buf, flags) }
}

/// `stat(2)`: a ustack socket through `/proc/self/fd/N`, else the C
/// library's.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stat(path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: as fstatat from the working directory.
    unsafe { fstatat(libc::AT_FDCWD, path, buf, 0) }
}

/// `stat64`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stat64(path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: the same call.
    unsafe { stat(path, buf) }
}

/// `statx(2)`: the socket's mode, size and inode for a ustack socket (the
/// descriptor with `AT_EMPTY_PATH`, or through `/proc/self/fd/N`).
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    buf: *mut libc::statx,
) -> c_int {
    // SAFETY: the caller's path.
    let Some((n, s)) = (unsafe { socket_named(dirfd, path, flags) }) else {
        // SAFETY: passing the call on.
        return unsafe { (real().statx)(dirfd, path, flags, mask, buf) };
    };
    if buf.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the C library's statx of our eventfd into the caller's buffer.
    let r = unsafe { (real().statx)(n, c"".as_ptr(), flags | libc::AT_EMPTY_PATH, mask, buf) };
    if r == 0 {
        // SAFETY: filled by statx just now.
        let x = unsafe { &mut *buf };
        x.stx_mode = SOCK_MODE as u16;
        x.stx_ino = s.ino;
        x.stx_size = 0;
        x.stx_blocks = 0;
        x.stx_blksize = 4096;
        x.stx_nlink = 1;
        x.stx_mask |= libc::STATX_TYPE | libc::STATX_MODE | libc::STATX_INO | libc::STATX_SIZE;
    }
    r
}

/// Write `socket:[INO]` into a `readlink` buffer (truncated, no NUL, as
/// readlink does).
///
/// # Safety
/// `buf` valid for `size` bytes.
unsafe fn link_text(s: &Sock, buf: *mut c_char, size: size_t) -> ssize_t {
    let text = format!("socket:[{}]", s.ino);
    let n = text.len().min(size);
    if buf.is_null() && n > 0 {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller's buffer of `size` bytes.
    unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n) };
    n as ssize_t
}

/// `readlink(2)`: `/proc/self/fd/N` of a ustack socket reads
/// `socket:[INO]`, as a kernel socket's does.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readlink(path: *const c_char, buf: *mut c_char, size: size_t) -> ssize_t {
    // SAFETY: the caller's path.
    if let Some((_, s)) = unsafe { socket_at_path(path) } {
        // SAFETY: the caller's buffer.
        return unsafe { link_text(&s, buf, size) };
    }
    // SAFETY: passing the call on.
    unsafe { (real().readlink)(path, buf, size) }
}

/// `readlinkat(2)`: as `readlink`, also for `N` relative to an open
/// `/proc/self/fd` directory.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readlinkat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    size: size_t,
) -> ssize_t {
    if !path.is_null() && !fd::is_empty() {
        // SAFETY: the caller's C string.
        let p = unsafe { CStr::from_ptr(path) }.to_bytes();
        let n = if p.first() == Some(&b'/') || dirfd == libc::AT_FDCWD {
            proc_fd_number(p)
        } else if p.iter().all(u8::is_ascii_digit) && is_proc_fd_dir(dirfd) {
            std::str::from_utf8(p).ok().and_then(|t| t.parse().ok())
        } else {
            None
        };
        if let Some(s) = n.and_then(socket_of) {
            // SAFETY: the caller's buffer.
            return unsafe { link_text(&s, buf, size) };
        }
    }
    // SAFETY: passing the call on.
    unsafe { (real().readlinkat)(dirfd, path, buf, size) }
}

/// Whether `dirfd` is this process's `/proc/PID/fd` directory.
fn is_proc_fd_dir(dirfd: c_int) -> bool {
    let link = format!("/proc/self/fd/{dirfd}\0");
    let mut out = [0u8; 64];
    // SAFETY: the C library's readlink into our buffer.
    let n = unsafe { (real().readlink)(link.as_ptr().cast(), out.as_mut_ptr().cast(), out.len()) };
    let Ok(n) = usize::try_from(n) else {
        return false;
    };
    let want = format!("/proc/{}/fd", std::process::id());
    &out[..n] == want.as_bytes()
}

/// Bytes a `SIOCOUTQ` reports: sent but not acknowledged, and not yet
/// sent (TCP); queued for the wire (UDP).
pub fn send_queued(s: &Sock) -> Res<usize> {
    let kind = *s.kind.lock();
    match kind {
        Kind::Stream { .. } => Ok(crate::sock::tcp_info(s).map_or(0, |i| i.send_queued)),
        Kind::Dgram { handle, .. } => Ok(crate::share::access()?
            .udp_tx_queued(handle)?
            .map_or(0, |q| q.0)),
        // Linux: EINVAL on a listening socket.
        Kind::Listener { .. } => Err(libc::EINVAL),
        Kind::Fresh { .. } | Kind::Closed => Ok(0),
    }
}

/// The name of a socket-level ioctl the layer does not implement (None:
/// an interface query, or not a socket request).
pub fn socket_ioctl_name(req: libc::c_ulong) -> Option<&'static str> {
    Some(match req {
        0x5452 => "FIOASYNC",
        0x8901 => "FIOSETOWN",
        0x8902 => "SIOCSPGRP",
        0x8903 => "FIOGETOWN",
        0x8904 => "SIOCGPGRP",
        0x8905 => "SIOCATMARK",
        0x8906 => "SIOCGSTAMP",
        0x8907 => "SIOCGSTAMPNS",
        0x894B => "SIOCOUTQNSD",
        _ => return None,
    })
}

#[cfg(test)]
mod test {
    use super::{proc_fd_number, socket_ioctl_name};

    #[test]
    fn proc_fd_paths_name_this_process_only() {
        let me = std::process::id();
        assert_eq!(proc_fd_number(b"/proc/self/fd/7"), Some(7));
        assert_eq!(proc_fd_number(b"/proc/thread-self/fd/12"), Some(12));
        assert_eq!(proc_fd_number(b"/dev/fd/3"), Some(3));
        assert_eq!(
            proc_fd_number(format!("/proc/{me}/fd/5").as_bytes()),
            Some(5)
        );
        assert_eq!(
            proc_fd_number(format!("/proc/{}/fd/5", me + 1).as_bytes()),
            None
        );
        assert_eq!(proc_fd_number(b"/proc/self/fdinfo/5"), None);
        assert_eq!(proc_fd_number(b"/proc/self/fd/"), None);
        assert_eq!(proc_fd_number(b"/proc/self/fd/5x"), None);
        assert_eq!(proc_fd_number(b"/etc/passwd"), None);
    }

    #[test]
    fn unimplemented_socket_ioctls_have_names() {
        assert_eq!(socket_ioctl_name(0x8905), Some("SIOCATMARK"));
        assert_eq!(socket_ioctl_name(0x8915), None); // SIOCGIFADDR: the kernel's
    }
}
