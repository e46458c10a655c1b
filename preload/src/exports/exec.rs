//! The exec functions: a process that shares the stack carries its
//! sockets and its channel to the new program (`share::exec`); every
//! other exec goes to the C library unchanged.

use std::ffi::{c_char, c_int};

use crate::real::real;

unsafe extern "C" {
    /// The process's environment (the C library's; `setenv` replaces it).
    static mut environ: *const *const c_char;
}

/// The C library's exec function `f`, on `envp` with `USTACK_SHARE` set
/// when this process shares the stack (any such entry the caller passed
/// is left out).
///
/// # Safety
/// `path`, `argv` and `envp` as `execve(2)` takes them.
unsafe fn carried(
    f: unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int,
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    if !crate::share::is_client() && crate::state::state().is_none() {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { f(path, argv, envp) };
    }
    let prefix = format!("{}=", crate::share::exec::ENV);
    let mut env: Vec<*const c_char> = Vec::new();
    // Whether the new program loads this library with the NET flags:
    // only then can it rejoin the stack.
    let (mut preload, mut net) = (false, false);
    let mut p = envp;
    // SAFETY: `envp` is a NULL-terminated array of C strings (or null).
    unsafe {
        while !p.is_null() && !(*p).is_null() {
            let s = std::ffi::CStr::from_ptr(*p).to_bytes();
            if let Some(v) = s.strip_prefix(b"LD_PRELOAD=") {
                preload |= v.windows(16).any(|w| w == b"ustack_preload.s");
            }
            net |= s.starts_with(b"USTACK_NET=");
            if !s.starts_with(prefix.as_bytes()) {
                env.push(*p);
            }
            p = p.add(1);
        }
    }
    // The process running the stack hands it to a keeper first (the new
    // image cannot hold it).
    let entry = if preload
        && net
        && (crate::share::is_client() || crate::lifecycle::hand_over_for_exec())
    {
        crate::share::exec::prepare()
    } else {
        None
    };
    let Some(entry) = entry else {
        // The new program does not load the layer: the channel closes at
        // the exec, and the owner lets go of what this process held.
        // SAFETY: the caller's arguments, passed on.
        return unsafe { f(path, argv, envp) };
    };
    env.push(entry.as_ptr());
    env.push(std::ptr::null());
    // SAFETY: the caller's path and arguments; `env` a NULL-terminated
    // array of C strings alive for the call.
    let r = unsafe { f(path, argv, env.as_ptr()) };
    crate::share::exec::failed();
    r
}

/// `execve(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { carried(real().execve, path, argv, envp) }
}

/// `execv(3)`: `execve` on the process's environment.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: the caller's arguments; `environ` is the C library's.
    unsafe { carried(real().execve, path, argv, environ) }
}

/// `execvpe(3)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { carried(real().execvpe, file, argv, envp) }
}

/// `execvp(3)`: `execvpe` on the process's environment.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: the caller's arguments; `environ` is the C library's.
    unsafe { carried(real().execvpe, file, argv, environ) }
}
