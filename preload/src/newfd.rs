//! Calls that make a new descriptor: the number the kernel returns was
//! free a moment ago, so a table entry under it is stale (its socket's
//! eventfd was closed behind the layer's back, by a raw system call or a
//! C library routine that closes inside itself) and is retired before
//! the caller sees the number ([`sock::fresh`]). Not every way to a new
//! descriptor can be interposed (`fopen` and `opendir` open inside the C
//! library): the calls off the data path also check a descriptor's
//! identity ([`sock::get_checked`]).

use std::ffi::{c_char, c_int, c_uint};

use libc::{mode_t, sigset_t};

use crate::real::real;
use crate::sock;

/// A new descriptor from the kernel: retire a stale entry under it.
fn made(fd: c_int) -> c_int {
    sock::fresh(fd);
    fd
}

/// Both descriptors of a pair (`pipe`, `socketpair`), after success.
///
/// # Safety
/// `fds` valid for two ints when `r` is 0.
unsafe fn made_pair(r: c_int, fds: *const c_int) -> c_int {
    if r == 0 && !fds.is_null() {
        // SAFETY: the kernel filled both.
        unsafe {
            sock::fresh(*fds);
            sock::fresh(*fds.add(1));
        }
    }
    r
}

/// `open(2)` (its mode read as the third argument, as the C library does
/// when the flags ask for one).
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: passing the call on.
    made(unsafe { (real().open)(path, flags, mode) })
}

/// `open64`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: the same call.
    unsafe { open(path, flags, mode) }
}

/// `__open_2` (fortified `open` without a mode).
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the same call without a mode.
    unsafe { open(path, flags, 0) }
}

/// `__open64_2`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the same call without a mode.
    unsafe { open(path, flags, 0) }
}

/// `openat(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openat(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> c_int {
    // SAFETY: passing the call on.
    made(unsafe { (real().openat)(dirfd, path, flags, mode) })
}

/// `openat64`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openat64(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> c_int {
    // SAFETY: the same call.
    unsafe { openat(dirfd, path, flags, mode) }
}

/// `__openat_2`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the same call without a mode.
    unsafe { openat(dirfd, path, flags, 0) }
}

/// `__openat64_2`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the same call without a mode.
    unsafe { openat(dirfd, path, flags, 0) }
}

/// `creat(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn creat(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: creat is open with these flags.
    unsafe { open(path, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, mode) }
}

/// `creat64`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the same call.
    unsafe { creat(path, mode) }
}

/// `pipe(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pipe(fds: *mut c_int) -> c_int {
    // SAFETY: passing the call on; then the caller's two ints.
    unsafe { made_pair((real().pipe)(fds), fds) }
}

/// `pipe2(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pipe2(fds: *mut c_int, flags: c_int) -> c_int {
    // SAFETY: passing the call on; then the caller's two ints.
    unsafe { made_pair((real().pipe2)(fds, flags), fds) }
}

/// `socketpair(2)` (always the kernel's: AF_UNIX).
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn socketpair(
    domain: c_int,
    ty: c_int,
    protocol: c_int,
    fds: *mut c_int,
) -> c_int {
    // SAFETY: passing the call on; then the caller's two ints.
    unsafe { made_pair((real().socketpair)(domain, ty, protocol, fds), fds) }
}

/// `eventfd(2)` (the program's own, not a ustack socket's).
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn eventfd(initval: c_uint, flags: c_int) -> c_int {
    // SAFETY: passing the call on.
    made(unsafe { (real().eventfd)(initval, flags) })
}

/// `memfd_create(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memfd_create(name: *const c_char, flags: c_uint) -> c_int {
    // SAFETY: passing the call on.
    made(unsafe { (real().memfd_create)(name, flags) })
}

/// `timerfd_create(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn timerfd_create(clock: c_int, flags: c_int) -> c_int {
    // SAFETY: passing the call on.
    made(unsafe { (real().timerfd_create)(clock, flags) })
}

/// `signalfd(2)` (a new one when `fd` is -1).
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn signalfd(fd: c_int, mask: *const sigset_t, flags: c_int) -> c_int {
    // SAFETY: passing the call on.
    let r = unsafe { (real().signalfd)(fd, mask, flags) };
    if fd == -1 { made(r) } else { r }
}

/// `inotify_init1(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn inotify_init1(flags: c_int) -> c_int {
    // SAFETY: passing the call on.
    made(unsafe { (real().inotify_init1)(flags) })
}
