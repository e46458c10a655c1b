//! The stack's life in the process: `USTACK_NET` checked before `main`,
//! the stack started at the first AF_INET socket (when no other process of
//! the program holds the claim), stopped at exit, given up or handed over
//! at `fork`.

use std::os::fd::RawFd;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

use clap::Parser;
use parking_lot::Mutex;
use ustack_runtime::cli::NetArgs;

use crate::real::real;
use crate::state::{DETACHED, ForkMode, STATE, State, WORKER, state};

/// The environment variable `ustack exec` passes the NET flags in.
pub const ENV: &str = "USTACK_NET";

/// Names the program's claim on the stack (set by `ustack exec` to its own
/// pid, which the program keeps across `exec`): every process of the
/// program's tree shares it, and one at a time holds it (the one running
/// the stack), so no NIC is driven by two processes.
pub const OWNER: &str = "USTACK_PID";

/// A stack's name (`ustack exec --stack NAME`): every program started with
/// the same name shares one stack, run by the first of them to open a
/// socket.
pub const STACK_ENV: &str = "USTACK_STACK";

/// Who keeps the stack across `fork` (`USTACK_FORK`: parent, child, or
/// `each:N`).
pub const FORK_ENV: &str = "USTACK_FORK";

/// How long a waiting thread drives the stack itself before it sleeps, in
/// microseconds (`USTACK_SPIN_US`, from `ustack exec --spin`; 0: never).
pub const SPIN_ENV: &str = "USTACK_SPIN_US";

/// Children forked so far ([`ForkMode::Each`]: the next child's index).
static FORKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Leave at once with one line on stderr (a bad `USTACK_NET`, a backend
/// that cannot open): before `main`, so the program never starts half-way.
fn fail(msg: &str) -> ! {
    eprintln!("ustack exec: {msg}");
    // SAFETY: _exit ends the process without running Rust or C destructors.
    unsafe { libc::_exit(2) }
}

/// What `USTACK_NET` asks for, checked before `main`: the stack a process
/// of the program starts at its first AF_INET socket.
#[derive(Debug)]
struct Plan {
    builder: ustack_runtime::Builder,
    fork: ForkMode,
    spin: Duration,
    telemetry: Option<std::path::PathBuf>,
    capture: Option<std::path::PathBuf>,
    /// The abstract Unix socket name the process running the stack holds
    /// (one per `ustack exec`, from `USTACK_PID`).
    claim: String,
}

static PLAN: OnceLock<Plan> = OnceLock::new();

/// This process image asked for the stack already (at its first AF_INET
/// socket): it got it, or another process of the program has it.
static TRIED: AtomicBool = AtomicBool::new(false);

/// The claim's descriptor in this process (-1: none).
static CLAIM_FD: AtomicI32 = AtomicI32::new(-1);

/// The process running the stack here (a `vfork` child shares this
/// memory, not the pid): 0 when none.
static OWNER_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Held while a stack starts (two threads' first sockets at once).
static STARTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Check `USTACK_NET` (a bad flag is one line on stderr and exit status 2
/// before `main`) and keep it for the first AF_INET socket; without it,
/// do nothing (every call then goes to the C library unchanged).
pub fn init() {
    let Ok(spec) = std::env::var(ENV) else {
        return;
    };
    let Some(words) = shlex::split(&spec) else {
        fail(&format!("{ENV} is not a valid argument list: {spec:?}"));
    };
    let args =
        match Wrapper::try_parse_from(std::iter::once("ustack exec".to_string()).chain(words)) {
            Ok(a) => a.net,
            Err(e) => {
                let line = e.to_string();
                fail(line.lines().next().unwrap_or("bad NET flags"));
            }
        };
    // The runtime's notices (offloads, partial checksums) on the
    // program's stderr, as `ustack run` prints them.
    ustack_runtime::set_notice_sink(|msg| eprintln!("ustack: {msg}"));
    // Which processes hold which sockets, once the stack is shared.
    ustack_runtime::set_holders_source(crate::share::server::telemetry_holders);
    let builder = match args.builder() {
        Ok(b) => b.app_counters(counters).configure(crate::sysctl::apply),
        Err(e) => fail(&e.to_string()),
    };
    for (flag, iface) in [
        ("--pcap", args.pcap.as_ref()),
        ("--xdp", args.xdp.as_ref().map(|x| &x.0)),
    ] {
        if let Some(iface) = iface {
            if !std::path::Path::new("/sys/class/net").join(iface).exists() {
                fail(&format!("{flag} {iface}: no such network interface"));
            }
        }
    }
    let fork = match std::env::var(FORK_ENV).as_deref() {
        Ok("child") => ForkMode::Child,
        Ok("parent") | Err(_) => ForkMode::Parent,
        Ok(other) => match other.strip_prefix("each:").map(str::parse::<usize>) {
            Some(Ok(workers)) if (1..=64).contains(&workers) => ForkMode::Each { workers },
            _ => fail(&format!(
                "{FORK_ENV}={other}: say parent, child or each:N (N workers, 1 to 64)"
            )),
        },
    };
    let spin = match std::env::var(SPIN_ENV).as_deref() {
        Err(_) => Duration::ZERO,
        Ok(v) => match v.parse::<u64>() {
            Ok(us) if us <= 1_000_000 => Duration::from_micros(us),
            _ => fail(&format!("{SPIN_ENV}={v}: microseconds, 0 to 1000000")),
        },
    };
    // The program's processes share one claim: the first `ustack exec`
    // process names it (LD_PRELOAD set by hand: this process does).
    let id = match std::env::var(OWNER) {
        Ok(id) => id,
        Err(_) => {
            let id = std::process::id().to_string();
            // SAFETY: before `main`, while this is the only thread.
            unsafe { std::env::set_var(OWNER, &id) };
            id
        }
    };
    // `ustack exec --stack NAME`: unrelated programs share one stack.
    let claim = match std::env::var(STACK_ENV) {
        Ok(name) if !name.is_empty() => format!("ustack-stack-{name}"),
        _ => format!("ustack-exec-{id}"),
    };
    let plan = Plan {
        builder,
        fork,
        spin,
        telemetry: args.telemetry.clone(),
        capture: args.capture.clone(),
        claim,
    };
    if PLAN.set(plan).is_err() {
        return;
    }
    crate::share::rights::init();
    crate::share::exec::keep_layer_env();
    // Exec'd by a process that shares a stack: this program does too.
    crate::share::exec::rejoin();
    // SAFETY: registering plain `extern "C" fn()` handlers.
    unsafe {
        libc::atexit(at_exit);
        libc::pthread_atfork(
            Some(before_fork),
            Some(after_fork_parent),
            Some(after_fork_child),
        );
    }
}

/// Whether this process runs the stack or may start it (`USTACK_NET` was
/// given, and it did not give the stack up at a `fork`).
pub fn planned() -> bool {
    state().is_some()
        || PLAN.get().is_some() && !DETACHED.load(Ordering::Relaxed)
        || crate::share::is_client()
}

/// Whether a new AF_INET socket is ustack's: this process's stack,
/// started now when no other process runs the program's stack, or the
/// stack of another process shared (the process this one was forked
/// from, or the one holding the claim: this one joins it). The first
/// process to open an AF_INET socket takes the stack (a shell or wrapper
/// script that opens none leaves it to the program it starts) and holds
/// it until it exits. False: the kernel's.
pub fn start_for_socket() -> bool {
    start_stack().is_some() || crate::share::is_client()
}

/// This process's stack, started now when no other process of the
/// program runs one.
fn start_stack() -> Option<&'static State> {
    if let Some(s) = state() {
        return Some(s);
    }
    if crate::share::is_client() {
        return None;
    }
    if DETACHED.load(Ordering::Relaxed) {
        if PLAN.get().is_some() {
            crate::report::notice("child-socket", || {
                format!(
                    "process {} (forked) opened an AF_INET socket: it runs on the kernel's network stack, since the process it was forked from runs the stack (ustack exec --fork child hands the stack to the child)",
                    std::process::id()
                )
            });
        }
        return None;
    }
    if TRIED.load(Ordering::Acquire) {
        return None;
    }
    let plan = PLAN.get()?;
    let _one = STARTING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(s) = state() {
        return Some(s);
    }
    if TRIED.swap(true, Ordering::AcqRel) {
        return None;
    }
    let before = crate::own::open_now();
    let Some(fd) = claim(&plan.claim) else {
        // Another process runs the stack: share it.
        if !crate::share::join(&plan.claim) {
            eprintln!(
                "ustack exec: process {} runs on the kernel's sockets: another process has the stack and cannot be reached",
                std::process::id()
            );
        }
        return None;
    };
    let runtime = match plan.builder.clone().spawn() {
        Ok(rt) => rt,
        Err(e) => fail(&e.to_string()),
    };
    crate::own::record_since(&before);
    CLAIM_FD.store(fd, Ordering::Release);
    OWNER_PID.store(std::process::id(), Ordering::Release);
    // Run to completion (a spin time): socket calls that give the stack
    // work run its iteration themselves.
    runtime.net().set_callers_drive(!plan.spin.is_zero());
    let started = State {
        spin: plan.spin,
        net: runtime.net().clone(),
        runtime: Mutex::new(Some(runtime)),
        fork: plan.fork,
        builder: plan.builder.clone(),
        telemetry: plan.telemetry.clone(),
        capture: plan.capture.clone(),
    };
    let _ = STATE.set(started);
    let s = state()?;
    // Other processes of the program (or of programs joined by name) may
    // share it.
    crate::share::server::listen(&s.net, &plan.claim);
    Some(s)
}

/// Take the program's claim on the stack: bind the abstract Unix socket
/// `name` (one process at a time can; the kernel lets it go when the
/// descriptor's last copy closes, at exit or exec). Its descriptor, or
/// None when another process holds it.
fn claim(name: &str) -> Option<RawFd> {
    let r = real();
    // SAFETY: the C library's socket; CLOEXEC so an exec lets the claim go.
    let fd = unsafe { (r.socket)(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: an all-zero sockaddr_un is valid; the name is copied in below.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // Abstract: a leading NUL, then the name (no file to clean up).
    let bytes = name.as_bytes();
    let n = bytes.len().min(addr.sun_path.len() - 1);
    for (d, &b) in addr.sun_path[1..=n].iter_mut().zip(bytes) {
        *d = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + n;
    // SAFETY: `addr` is a sockaddr_un valid for `len` bytes.
    let ok = unsafe {
        (r.bind)(
            fd,
            (&addr as *const libc::sockaddr_un).cast(),
            len as libc::socklen_t,
        )
    } == 0;
    if ok {
        return Some(fd);
    }
    // SAFETY: closing the socket made above.
    unsafe { (r.close)(fd) };
    None
}

/// Close this process's copy of the claim (a forked child that does not
/// run the stack, or a parent that handed it to its child), so the claim
/// ends with the process that runs the stack.
fn drop_claim() {
    let fd = CLAIM_FD.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        // SAFETY: the claim socket this process holds a copy of.
        unsafe { (real().close)(fd) };
    }
}

/// At exit: close what the program left open (FIN, or RST for unread
/// data, as the kernel does), then let the loop send it and stop. When
/// other processes share the stack, a keeper runs it on for them first
/// ([`keep_for_clients`]).
extern "C" fn at_exit() {
    let Some(s) = state() else { return };
    crate::stdio::flush_all();
    for (fd, _) in crate::fd::all() {
        crate::sock::close(fd);
    }
    if WORKER.get().is_none() && crate::share::server::has_clients() {
        keep_for_clients(s);
    }
    if let Some(rt) = s.runtime.lock().take() {
        let _ = rt.stop();
    }
}

/// A fork the layer makes for itself (the keeper): the fork handlers do
/// nothing.
static KEEPING: AtomicBool = AtomicBool::new(false);

/// The owner exits while other processes share its stack (a daemon's
/// parent that opened the sockets, the first of two programs on a named
/// stack): a copy of it, the keeper, runs the stack on until the last of
/// them is gone, then closes it and exits; the owner exits at once. The
/// stack's loop and the share server stop between two iterations, the
/// process forks holding the descriptor table, and the keeper runs both
/// again on the copied device, sockets and channels (as `--fork child`
/// hands a stack over). Returns in the owner (the stack is the keeper's
/// now: the caller's stop finds nothing), or when the fork failed (the
/// stack ends here).
fn keep_for_clients(s: &'static State) {
    crate::share::server::stop_thread();
    let mut rt = s.runtime.lock();
    let Some(runtime) = rt.as_mut() else { return };
    if runtime.pause().is_err() {
        return;
    }
    KEEPING.store(true, Ordering::Release);
    let table = crate::fd::hold();
    // SAFETY: fork in a process whose other threads of the layer are
    // stopped (the loop paused, the server joined); the child runs only
    // the layer's code below and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    drop(table);
    KEEPING.store(false, Ordering::Release);
    match pid {
        0 => {
            // The program's sockets are closed above: none of the
            // standard descriptors is a ustack socket now.
            become_keeper();
            let ok = runtime.resume().is_ok() && crate::share::server::restart(&s.net).is_ok();
            if ok {
                crate::share::server::wait_for_no_clients();
            }
            if let Some(r) = rt.take() {
                let _ = r.stop();
            }
            // SAFETY: _exit ends the keeper without the program's exit
            // handlers (the owner ran them) or a second flush of its stdio.
            unsafe { libc::_exit(0) }
        }
        p if p > 0 => {
            // The device, the telemetry socket and the sockets are the
            // keeper's: nothing of them is closed or removed here.
            runtime.leak_after_fork();
            if let Some(r) = rt.take() {
                std::mem::forget(r);
            }
        }
        _ => {
            let _ = runtime.resume();
        }
    }
}

/// The process running the stack execs a program that loads the layer
/// (haproxy's master re-executing itself, a server exec'ing its
/// successor): the stack cannot live on in the new program's memory, so
/// a copy of this process, the keeper, runs it on (as when an owner
/// exits while others share it) and this process becomes its client,
/// holding every socket it holds, which the exec then carries as a
/// forked child's exec does (`share::exec`). True when it is a client
/// now; false leaves the exec as it was (the stack ends with this image).
pub fn hand_over_for_exec() -> bool {
    if crate::share::is_client() || WORKER.get().is_some() {
        return false;
    }
    let Some(s) = state() else { return false };
    if OWNER_PID.load(Ordering::Acquire) != std::process::id() {
        return false;
    }
    let Ok((ours, theirs)) = crate::share::chan::pair() else {
        return false;
    };
    if crate::share::server::add_child(&s.net, ours).is_err() {
        crate::share::chan::close(ours);
        crate::share::chan::close(theirs);
        return false;
    }
    crate::share::server::stop_thread();
    let mut rt = s.runtime.lock();
    let Some(runtime) = rt.as_mut() else {
        return false;
    };
    if runtime.pause().is_err() {
        let _ = crate::share::server::restart(&s.net);
        return false;
    }
    // The go-between says through this pipe whether the keeper runs.
    let mut said = [-1; 2];
    // SAFETY: pipe2 into our two-descriptor array.
    if unsafe { libc::pipe2(said.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        let _ = runtime.resume();
        let _ = crate::share::server::restart(&s.net);
        crate::share::chan::close(theirs);
        return false;
    }
    KEEPING.store(true, Ordering::Release);
    let table = crate::fd::hold();
    // SAFETY: fork in a process whose other threads of the layer are
    // stopped (the loop paused, the server joined); the child runs only
    // the layer's code below and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    drop(table);
    KEEPING.store(false, Ordering::Release);
    // The keeper is not the program's child (a master that waits for
    // every child of its own before it exits, as haproxy's does, would
    // wait for it while it waits for the master): the child forks it and
    // exits at once.
    let made = pid > 0 && {
        let mut b = [0u8; 1];
        let got = loop {
            // SAFETY: reading one byte of our pipe into `b`.
            let n = unsafe { libc::read(said[0], b.as_mut_ptr().cast(), 1) };
            if n >= 0 || crate::real::errno() != libc::EINTR {
                break n;
            }
        };
        // SAFETY: reaping the go-between (ECHILD when the program reaps
        // its children itself or ignores them: harmless).
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        got == 1 && b[0] == 1
    };
    if pid != 0 {
        // SAFETY: closing our pipe's two ends (the go-between's are its own).
        unsafe {
            libc::close(said[0]);
            libc::close(said[1]);
        }
    }
    match pid {
        0 => {
            KEEPING.store(true, Ordering::Release);
            // SAFETY: a fork in the single thread of the child just made
            // (the fork handlers off: this fork is the layer's).
            let keeper = unsafe { libc::fork() };
            KEEPING.store(false, Ordering::Release);
            if keeper != 0 {
                let ok = [u8::from(keeper > 0)];
                // SAFETY: one byte to the pipe, then leaving the go-between
                // without the program's exit handlers.
                unsafe {
                    libc::write(said[1], ok.as_ptr().cast(), 1);
                    libc::_exit(0)
                }
            }
            // SAFETY: the keeper's copies of the pipe.
            unsafe {
                libc::close(said[0]);
                libc::close(said[1]);
            }
            crate::share::chan::close(theirs);
            become_keeper();
            // Nothing of the program's is the keeper's but the sockets
            // (the exec'd program holds them now: kept here for it).
            let table: Vec<std::os::fd::RawFd> =
                crate::fd::all().into_iter().map(|(fd, _)| fd).collect();
            let foreign: Vec<std::os::fd::RawFd> = std::fs::read_dir("/proc/self/fd")
                .map(|d| {
                    d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                        .collect()
                })
                .unwrap_or_default();
            for fd in foreign {
                if fd > 2 && !crate::own::guarded(fd) && !table.contains(&fd) {
                    // SAFETY: closing the keeper's copy of a program's descriptor.
                    unsafe { (real().close)(fd) };
                }
            }
            let ok = runtime.resume().is_ok();
            for fd in table {
                crate::sock::close(fd);
            }
            if ok && crate::share::server::restart(&s.net).is_ok() {
                crate::share::server::wait_for_no_clients();
            }
            if let Some(r) = rt.take() {
                let _ = r.stop();
            }
            // SAFETY: _exit ends the keeper without the program's exit
            // handlers or a flush of its stdio.
            unsafe { libc::_exit(0) }
        }
        _ if made => {
            runtime.leak_after_fork();
            if let Some(r) = rt.take() {
                std::mem::forget(r);
            }
            drop(rt);
            DETACHED.store(true, Ordering::Relaxed);
            OWNER_PID.store(0, Ordering::Release);
            drop_claim();
            crate::share::after_hand_over(theirs);
            true
        }
        _ => {
            let _ = runtime.resume();
            let _ = crate::share::server::restart(&s.net);
            crate::share::chan::close(theirs);
            false
        }
    }
}

/// In a keeper just forked: named so, its standard descriptors on
/// /dev/null (it holds no terminal or pipe of the program's: a shell
/// reading the program's output sees its end).
fn become_keeper() {
    // SAFETY: naming this thread; the name is a static C string.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"ustack-keeper".as_ptr()) };
    let r = real();
    // SAFETY: the C library's open of a static path, and dup2 of it onto
    // the standard descriptors.
    unsafe {
        let null = (r.open)(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            for std_fd in 0..=2 {
                (r.dup2)(null, std_fd);
            }
            if null > 2 {
                (r.close)(null);
            }
        }
    }
}

/// How this process's stack goes through a `fork`: a worker's own stack
/// stays with it (its children run on the kernel's sockets).
fn fork_mode() -> Option<(&'static State, ForkMode)> {
    if WORKER.get().is_some() {
        return None;
    }
    let s = STATE.get()?;
    Some((s, s.fork))
}

/// Before `fork`: when the stack moves to the child, or the master's
/// stack ends for workers of their own, pause its loop (the thread exits
/// holding no lock; the device and sockets stay as they are), then hold
/// the descriptor table still.
extern "C" fn before_fork() {
    if KEEPING.load(Ordering::Acquire) {
        return;
    }
    match fork_mode() {
        Some((s, ForkMode::Child | ForkMode::Each { .. })) if !DETACHED.load(Ordering::Relaxed) => {
            if let Some(rt) = s.runtime.lock().as_mut() {
                let _ = rt.pause();
            }
        }
        Some((_, ForkMode::Child | ForkMode::Each { .. })) => {}
        // The default: the child shares the stack (this process's, or the
        // one this process shares).
        _ if state().is_some() || crate::share::is_client() => {
            crate::share::before_fork();
        }
        _ => {}
    }
    crate::fd::lock_for_fork();
}

/// The parent: it keeps the stack (its paused loop, if any, runs on), or,
/// when the stack moved to the child, gives it up without touching the
/// device, or, when each child has a stack, ends its own (its capture is
/// its own) at the first fork; its ustack descriptors only close from
/// then on.
extern "C" fn after_fork_parent() {
    if KEEPING.load(Ordering::Acquire) {
        return;
    }
    crate::fd::unlock_after_fork();
    crate::share::after_fork_parent();
    match fork_mode() {
        Some((s, ForkMode::Child)) if !DETACHED.load(Ordering::Relaxed) => {
            if let Some(rt) = s.runtime.lock().as_mut() {
                rt.leak_after_fork();
            }
            DETACHED.store(true, Ordering::Relaxed);
            drop_claim();
        }
        Some((s, ForkMode::Each { .. })) => {
            FORKS.fetch_add(1, Ordering::Relaxed);
            if !DETACHED.swap(true, Ordering::Relaxed) {
                if let Some(rt) = s.runtime.lock().take() {
                    let _ = rt.stop();
                }
            }
        }
        _ => {}
    }
}

/// The child: it takes the stack over (its loop starts on a thread of the
/// child), starts a stack of its own (each child a replica), or by default
/// runs on the kernel's sockets while the stack, its thread and its NIC
/// stay the parent's; inherited ustack descriptors then only close (their
/// kernel eventfd), and other calls on them fail (EBADF).
extern "C" fn after_fork_child() {
    if KEEPING.load(Ordering::Acquire) {
        return;
    }
    crate::fd::unlock_after_fork();
    match fork_mode() {
        Some((s, ForkMode::Child)) if !DETACHED.load(Ordering::Relaxed) => {
            OWNER_PID.store(std::process::id(), Ordering::Release);
            if let Some(rt) = s.runtime.lock().as_mut() {
                if let Err(e) = rt.resume() {
                    eprintln!("ustack exec: the forked child cannot run the stack: {e}");
                    DETACHED.store(true, Ordering::Relaxed);
                }
            }
        }
        Some((s, ForkMode::Each { workers })) => {
            // The master's paused stack is the master's: not a byte of its
            // device is touched here.
            if let Some(rt) = s.runtime.lock().as_mut() {
                rt.leak_after_fork();
            }
            DETACHED.store(true, Ordering::Relaxed);
            let index = FORKS.load(Ordering::Relaxed) % workers;
            if let Err(e) = start_worker(s, index, workers) {
                eprintln!("ustack exec: worker {index} cannot start its stack: {e}");
            }
        }
        Some(_) => {
            DETACHED.store(true, Ordering::Relaxed);
            drop_claim();
            crate::share::after_fork_child();
        }
        // A worker's child runs on the kernel's sockets.
        None if WORKER.get().is_some() => DETACHED.store(true, Ordering::Relaxed),
        // A client's child is a client too.
        None if crate::share::is_client() => crate::share::after_fork_child(),
        // No stack was started here: the child may start it.
        None => {}
    }
}

/// A worker's own stack: replica `index` of `workers` on the master's
/// interface (its telemetry socket and capture file named `PATH.wINDEX`),
/// and the master's listening and bound sockets opened again on it.
fn start_worker(master: &State, index: usize, workers: usize) -> Result<(), String> {
    let suffixed = |p: &std::path::Path| {
        let mut s = p.as_os_str().to_owned();
        s.push(format!(".w{index}"));
        std::path::PathBuf::from(s)
    };
    let mut b = master.builder.clone().replica(index, workers);
    if let Some(t) = &master.telemetry {
        b = b.telemetry(suffixed(t));
    }
    if let Some(c) = &master.capture {
        b = b.capture(suffixed(c));
    }
    let before = crate::own::open_now();
    let runtime = b.spawn().map_err(|e| e.to_string())?;
    crate::own::record_since(&before);
    let net = runtime.net().clone();
    net.set_callers_drive(!master.spin.is_zero());
    let state = State {
        spin: master.spin,
        net,
        runtime: Mutex::new(Some(runtime)),
        fork: ForkMode::Parent,
        builder: master.builder.clone(),
        telemetry: None,
        capture: None,
    };
    if WORKER.set(state).is_err() {
        return Err("a worker stack exists already".into());
    }
    crate::sock::reopen_inherited();
    Ok(())
}

/// The layer's counters in each telemetry line (`app`): calls and options
/// refused, and the ustack descriptors open now.
fn counters() -> Vec<(&'static str, u64)> {
    vec![
        ("preload_unsupported", crate::report::unsupported_count()),
        ("preload_descriptors", crate::fd::open_count() as u64),
    ]
}

/// The NET flags as a command line of their own.
#[derive(Parser, Debug)]
#[command(name = "ustack exec")]
struct Wrapper {
    #[command(flatten)]
    net: NetArgs,
}
