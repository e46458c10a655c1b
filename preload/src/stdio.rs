//! C stdio streams on ustack sockets.
//!
//! The C library's stdio reads and writes a stream's descriptor with its
//! own internal `read`/`write`, which no `LD_PRELOAD` interposes: a
//! `FILE` on a ustack socket's number would read the socket's eventfd
//! (its 8-byte counter, then EAGAIN). An inetd-style program (a forked
//! worker `dup2`s the connection onto 0 and 1 and execs `sha256sum`), or
//! one that `fdopen`s its connection, uses stdio on the socket.
//!
//! Such a stream is made with `fopencookie`, whose callbacks are the
//! layer's `read`, `write` and `close` of the number, and whose
//! descriptor field is set to the number so `fileno` answers as for any
//! stream (`struct _IO_FILE` is glibc's public ABI; the offset is
//! checked at build time against the field's place). `fdopen` of a
//! ustack socket returns one; when the standard descriptors 0, 1 or 2
//! become ustack sockets (carried into an exec'd program, or `dup2`ed
//! onto them), `stdin`, `stdout` or `stderr` is pointed at one (glibc
//! documents the three as ordinary variables a program may set), with
//! the old stream's buffering. At exit, the layer flushes every stream
//! before it closes the sockets.

use std::ffi::{c_char, c_int, c_void};

use libc::{FILE, size_t, ssize_t};

/// glibc's `cookie_io_functions_t`.
#[repr(C)]
struct CookieIo {
    read: Option<unsafe extern "C" fn(*mut c_void, *mut c_char, size_t) -> ssize_t>,
    write: Option<unsafe extern "C" fn(*mut c_void, *const c_char, size_t) -> ssize_t>,
    seek: Option<unsafe extern "C" fn(*mut c_void, *mut i64, c_int) -> c_int>,
    close: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
}

/// The head of glibc's `struct _IO_FILE` up to `_fileno`.
#[repr(C)]
struct FileHead {
    flags: c_int,
    /// `_IO_read_ptr` .. `_IO_save_end`, `_markers`, `_chain`.
    pointers: [*mut c_void; 13],
    fileno: c_int,
}

/// `_fileno`'s offset in glibc's x86-64 `FILE` (checked by the C test in
/// the fd suite through `fileno`).
const _: () = assert!(std::mem::offset_of!(FileHead, fileno) == 112);

/// glibc's `_IO_UNBUFFERED` and `_IO_LINE_BUF` stream flags.
const UNBUFFERED: c_int = 0x0002;
const LINE_BUF: c_int = 0x0200;

unsafe extern "C" {
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, io: CookieIo) -> *mut FILE;
    fn setvbuf(f: *mut FILE, buf: *mut c_char, mode: c_int, size: size_t) -> c_int;
    fn fflush(f: *mut FILE) -> c_int;
    static mut stdin: *mut FILE;
    static mut stdout: *mut FILE;
    static mut stderr: *mut FILE;
}

fn cookie_fd(cookie: *mut c_void) -> c_int {
    cookie as usize as c_int
}

unsafe extern "C" fn cookie_read(cookie: *mut c_void, buf: *mut c_char, n: size_t) -> ssize_t {
    // SAFETY: stdio's buffer of `n` bytes, read through the layer.
    unsafe { crate::exports::io::read(cookie_fd(cookie), buf.cast(), n) }
}

unsafe extern "C" fn cookie_write(cookie: *mut c_void, buf: *const c_char, n: size_t) -> ssize_t {
    // SAFETY: stdio's `n` bytes, written through the layer.
    unsafe { crate::exports::io::write(cookie_fd(cookie), buf.cast(), n) }
}

unsafe extern "C" fn cookie_close(cookie: *mut c_void) -> c_int {
    // SAFETY: the stream's descriptor, closed through the layer.
    unsafe { crate::exports::descriptors::close(cookie_fd(cookie)) }
}

/// A stream on the ustack socket `fd`, its `fileno` being `fd`; null
/// (errno set) when the C library cannot make one.
///
/// # Safety
/// `mode` is a C string.
pub unsafe fn open(fd: c_int, mode: *const c_char) -> *mut FILE {
    let io = CookieIo {
        read: Some(cookie_read),
        write: Some(cookie_write),
        seek: None,
        close: Some(cookie_close),
    };
    // SAFETY: a C mode string and callbacks that live as long as the
    // library.
    let f = unsafe { fopencookie(fd as usize as *mut c_void, mode, io) };
    if !f.is_null() {
        // SAFETY: `f` is a glibc stream, whose head is `FileHead`.
        unsafe { (*f.cast::<FileHead>()).fileno = fd };
    }
    f
}

/// The standard descriptor `fd` (0, 1 or 2) is a ustack socket now:
/// point its stream at one on the socket, with the old stream's
/// buffering, after flushing what the old one held. Other numbers, and
/// a stream already ours, are left alone.
pub fn standard_became_socket(fd: c_int) {
    // SAFETY: the C library's stream variables, set as glibc allows;
    // the program's other threads are inside the layer's call or not
    // using this stream (a program racing its own dup2 with stdio on
    // the same stream has a race on Linux too).
    unsafe {
        let (var, mode) = match fd {
            0 => (&raw mut stdin, c"r"),
            1 => (&raw mut stdout, c"w"),
            2 => (&raw mut stderr, c"w"),
            _ => return,
        };
        let old = *var;
        if !old.is_null() && is_cookie_on(old, fd) {
            return;
        }
        let flags = if old.is_null() {
            0
        } else {
            fflush(old);
            (*old.cast::<FileHead>()).flags
        };
        let new = open(fd, mode.as_ptr());
        if new.is_null() {
            return;
        }
        if flags & UNBUFFERED != 0 {
            setvbuf(new, std::ptr::null_mut(), libc::_IONBF, 0);
        } else if flags & LINE_BUF != 0 {
            setvbuf(new, std::ptr::null_mut(), libc::_IOLBF, 0);
        }
        OURS[fd as usize].store(new.cast(), std::sync::atomic::Ordering::Release);
        *var = new;
    }
}

/// The streams this module made for 0, 1 and 2.
static OURS: [std::sync::atomic::AtomicPtr<c_void>; 3] = [
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
];

fn is_cookie_on(f: *mut FILE, fd: c_int) -> bool {
    OURS[fd as usize].load(std::sync::atomic::Ordering::Acquire) == f.cast()
}

/// At exit, before the layer closes the sockets: write out what every
/// stream holds (the C library would, after the layer's exit handler).
pub fn flush_all() {
    // SAFETY: fflush(NULL) flushes every open output stream.
    unsafe { fflush(std::ptr::null_mut()) };
}
