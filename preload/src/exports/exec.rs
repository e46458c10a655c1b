//! The exec functions: a process that shares the stack carries its
//! sockets and its channel to the new program (`share::exec`); every
//! other exec goes to the C library unchanged.

use std::ffi::{c_char, c_int};

use crate::real::real;

unsafe extern "C" {
    /// The process's environment (the C library's; `setenv` replaces it).
    static mut environ: *const *const c_char;
}

/// The entries of environment `envp` without any `USTACK_SHARE` (a new
/// one goes in), and whether a program started with it loads this
/// library with the NET flags (only then can it rejoin the stack).
///
/// # Safety
/// `envp` is a NULL-terminated array of C strings, or null.
unsafe fn scan_env(envp: *const *const c_char) -> (Vec<*const c_char>, bool) {
    let prefix = format!("{}=", crate::share::exec::ENV);
    let mut env = Vec::new();
    let (mut preload, mut net) = (false, false);
    let mut p = envp;
    // SAFETY: as the caller says.
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
    (env, preload && net)
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
    // SAFETY: `envp` as the caller says.
    let (mut env, mut loads) = unsafe { scan_env(envp) };
    // A cleaned environment, while sockets would go with the exec: the
    // layer's entries go back in (they would be dead otherwise).
    let restored = if loads || !crate::share::exec::carries_sockets() {
        Vec::new()
    } else {
        let names: Vec<&[u8]> = env
            .iter()
            // SAFETY: `env` holds the caller's C strings.
            .map(|&p| unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes())
            .collect();
        crate::share::exec::missing_layer_env(&names)
    };
    if !restored.is_empty() {
        let dropped: Vec<&[u8]> = restored
            .iter()
            .map(|r| {
                r.as_bytes()
                    .split(|&b| b == b'=')
                    .next()
                    .unwrap_or_default()
            })
            .collect();
        env.retain(|&p| {
            // SAFETY: `env` holds the caller's C strings.
            let e = unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes();
            !dropped
                .iter()
                .any(|d| e.starts_with(d) && e.get(d.len()) == Some(&b'='))
        });
        env.extend(restored.iter().map(|r| r.as_ptr()));
        loads = true;
    }
    // The process running the stack hands it to a keeper first (the new
    // image cannot hold it).
    let entry = if loads && (crate::share::is_client() || crate::lifecycle::hand_over_for_exec()) {
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

/// `posix_spawn(3)` or `posix_spawnp(3)` (the C library's `f`): from a
/// process on the stack, of a program that loads the layer, with a
/// channel of its own and `USTACK_SHARE` in its environment, so it
/// rejoins the stack with the sockets it inherits.
///
/// # Safety
/// The arguments as `posix_spawn(3)` takes them.
unsafe fn spawned(
    f: unsafe extern "C" fn(
        *mut libc::pid_t,
        *const c_char,
        *const libc::posix_spawn_file_actions_t,
        *const libc::posix_spawnattr_t,
        *const *mut c_char,
        *const *mut c_char,
    ) -> c_int,
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    let on_stack = crate::share::is_client() || crate::state::state().is_some();
    if !on_stack || crate::fd::is_empty() || envp.is_null() {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { f(pid, path, actions, attr, argv, envp) };
    }
    // SAFETY: `envp` as the caller says.
    let (mut env, loads) = unsafe { scan_env(envp.cast()) };
    let prepared = if loads {
        crate::share::exec::prepare_spawn()
    } else {
        None
    };
    let Some((entry, theirs)) = prepared else {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { f(pid, path, actions, attr, argv, envp) };
    };
    env.push(entry.as_ptr());
    env.push(std::ptr::null());
    // SAFETY: the caller's arguments; `env` a NULL-terminated array of C
    // strings alive for the call (the C library does not write them).
    let r = unsafe { f(pid, path, actions, attr, argv, env.as_ptr().cast()) };
    // The new process has its copy (or, failed, none: the owner sees the
    // channel hang up and lets go of what it counted).
    crate::share::chan::close(theirs);
    r
}

/// `posix_spawn(3)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { spawned(real().posix_spawn, pid, path, actions, attr, argv, envp) }
}

/// `posix_spawnp(3)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { spawned(real().posix_spawnp, pid, file, actions, attr, argv, envp) }
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

// The variadic `execl`, `execlp` and `execle` (the C library's call the
// kernel without passing through `execve` above): an assembly entry per
// function (a naked function) lays the register arguments out next to
// those the caller passed on the stack, so the list (`arg0, ..., NULL`,
// and for `execle` the environment after it) is one array in memory, and
// hands it to [`ustack_execl_list`]. x86-64 System V only: elsewhere the
// C library's own functions stay (and carry nothing).
#[cfg(target_arch = "x86_64")]
macro_rules! execl_entry {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// A C call (variadic: the list ends with a null pointer).
        #[cfg(target_arch = "x86_64")]
        #[unsafe(no_mangle)]
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name(path: *const c_char, arg0: *const c_char) -> c_int {
            core::arch::naked_asm!(
                // The return address out of the way; the five register
                // arguments after `path` pushed so that they sit just
                // below the caller's stack arguments: one array from
                // `arg0` on.
                "pop r11",
                "push r9",
                "push r8",
                "push rcx",
                "push rdx",
                "push rsi",
                "push rbx",
                "mov rbx, r11",
                // The stack is aligned to 16 here (8 mod 16 at entry,
                // +8 -40 -8).
                "lea rsi, [rsp + 8]",
                concat!("mov edx, ", $kind),
                "call {list}",
                // Only a failed exec returns: the stack put back as it came.
                "mov r11, rbx",
                "pop rbx",
                "add rsp, 40",
                "push r11",
                "ret",
                list = sym ustack_execl_list,
            )
        }
    };
}

execl_entry!(
    /// `execl(3)`: `execv` on the list.
    execl,
    "0"
);
execl_entry!(
    /// `execlp(3)`: `execvp` on the list.
    execlp,
    "1"
);
execl_entry!(
    /// `execle(3)`: `execve` on the list and the environment after it.
    execle,
    "2"
);

/// The list of an `execl` (`kind` 0), `execlp` (1) or `execle` (2) call,
/// as one array: `execv`, `execvp` or `execve` on it.
///
/// # Safety
/// `args` is a NULL-terminated array of C strings, for `execle` followed
/// by the environment pointer, as the caller of the variadic function
/// passed them.
#[cfg(target_arch = "x86_64")]
unsafe extern "C" fn ustack_execl_list(
    path: *const c_char,
    args: *const *const c_char,
    kind: c_int,
) -> c_int {
    // SAFETY: as the caller says.
    unsafe {
        match kind {
            0 => execv(path, args),
            1 => execvp(path, args),
            _ => {
                let mut end = args;
                while !(*end).is_null() {
                    end = end.add(1);
                }
                let envp = *end.add(1) as *const *const c_char;
                execve(path, args, envp)
            }
        }
    }
}
