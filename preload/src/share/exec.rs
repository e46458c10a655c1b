//! `exec` in a process that shares the stack: the new program rejoins it.
//!
//! A forked child that execs (sshd re-executing itself for each
//! connection, a server running a helper with the connection as its
//! standard input and output) keeps its descriptors that are not
//! close-on-exec, ustack sockets among them; its memory, and with it the
//! layer's table of which numbers are sockets, is gone. So the exec
//! functions (`execve`, `execv`, `execvp`, `execvpe`) of a client carry
//! the client over: its channel to the owner stays open across the exec,
//! and the sockets that survive it (their numbers, kinds, flags and
//! options) ride in the new program's environment, in `USTACK_SHARE`.
//! Before its `main`, the new program reads them back into its table,
//! takes the channel as its own, and tells the owner which sockets it
//! still holds; those that closed at the exec are let go as a close would.
//!
//! The variadic `execl`, `execlp` and `execle` are the layer's too (an
//! assembly entry turns the list into an array, `exports::exec`), and so
//! is `posix_spawn` ([`prepare_spawn`]: the sockets are named by their
//! eventfds' ids, since its file actions renumber descriptors).

use std::ffi::CString;
use std::os::fd::RawFd;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use ustack::events::SocketRef;

use super::{Op, client};
use crate::fd::{Kind, Opts, Sock};
use crate::real::real;

/// The environment variable the sockets ride in across an exec.
pub const ENV: &str = "USTACK_SHARE";

/// The layer's own environment entries as the program started with them
/// (`LD_PRELOAD` and the `USTACK_*` flags), kept before `main`: a program
/// that hands its children a cleaned environment (nginx keeps only what
/// its `env` directives name) still starts them on the stack when they
/// inherit its sockets.
static LAYER_ENV: std::sync::OnceLock<Vec<CString>> = std::sync::OnceLock::new();

/// Before `main`: keep the layer's entries of this program's environment.
pub fn keep_layer_env() {
    let kept = std::env::vars_os()
        .filter(|(k, _)| {
            let k = k.to_string_lossy();
            k == "LD_PRELOAD" || (k.starts_with("USTACK_") && k != ENV)
        })
        .filter_map(|(k, v)| {
            let mut e = k.into_encoded_bytes();
            e.push(b'=');
            e.extend_from_slice(v.as_encoded_bytes());
            CString::new(e).ok()
        })
        .collect();
    let _ = LAYER_ENV.set(kept);
}

/// The layer's entries that `names` (the keys of the new program's
/// environment) lack; an `LD_PRELOAD` of other libraries gets ours first.
/// For an exec that carries sockets into a program whose environment
/// would not load the layer.
pub fn missing_layer_env(env: &[&[u8]]) -> Vec<CString> {
    let Some(kept) = LAYER_ENV.get() else {
        return Vec::new();
    };
    let key = |e: &[u8]| e.split(|&b| b == b'=').next().unwrap_or_default().to_vec();
    kept.iter()
        .filter_map(|k| {
            let name = key(k.as_bytes());
            match env.iter().find(|e| key(e) == name) {
                None => Some(k.clone()),
                Some(theirs) if name == b"LD_PRELOAD" => {
                    let ours = &k.as_bytes()[name.len() + 1..];
                    let mut e = k.as_bytes().to_vec();
                    e.push(b':');
                    e.extend_from_slice(&theirs[name.len() + 1..]);
                    (!theirs.windows(ours.len()).any(|w| w == ours))
                        .then(|| CString::new(e).ok())
                        .flatten()
                }
                Some(_) => None,
            }
        })
        .collect()
}

/// Whether a ustack socket of this process survives an exec (one of its
/// descriptors is not close-on-exec).
pub fn carries_sockets() -> bool {
    crate::fd::all().into_iter().any(|(fd, _)| !cloexec(fd))
}

/// A socket carried across an exec (or passed to another process,
/// [`super::rights`]).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Carried {
    stream: bool,
    v6: bool,
    pub(crate) kind: Kind,
    nonblocking: bool,
    /// Its descriptor numbers (each one's kernel descriptor survives the
    /// exec; a passed socket's, the receiver's).
    pub(crate) fds: Vec<RawFd>,
    /// Its eventfd's id, for a program started by `posix_spawn`, which
    /// finds its descriptors by it (their numbers are the file actions').
    pub(crate) id: Option<u64>,
    opts: CarriedOpts,
}

/// The options of a carried socket that the new program can read back
/// (those the stack applies are in the stack already).
#[derive(Debug, Serialize, Deserialize)]
struct CarriedOpts {
    reuse_addr: bool,
    reuse_port: bool,
    keepalive: bool,
    nodelay: bool,
    cork: bool,
    linger: Option<i32>,
    rcvtimeo_us: i64,
    sndtimeo_us: i64,
    shut_rd: bool,
    shut_wr: bool,
    v6only: bool,
    bound: Option<std::net::IpAddr>,
}

impl Carried {
    /// What of `s` another program needs to rebuild it, named by `fds`.
    pub(crate) fn of(s: &Sock, fds: Vec<RawFd>) -> Self {
        Carried {
            stream: s.stream,
            v6: s.v6,
            kind: *s.kind.lock(),
            nonblocking: s.nonblocking.load(std::sync::atomic::Ordering::Relaxed),
            fds,
            id: None,
            opts: CarriedOpts::from(&s.opts.lock()),
        }
    }

    /// The socket rebuilt in this process, its descriptors in the table
    /// (none: it is not carried); its stack handle.
    pub(crate) fn install(&self) -> Option<(Arc<Sock>, Option<SocketRef>)> {
        let &first = self.fds.first()?;
        let sock = Sock::new(self.stream, self.v6, first, self.nonblocking);
        *sock.kind.lock() = self.kind;
        self.opts.apply(&mut sock.opts.lock());
        for &fd in &self.fds[1..] {
            sock.add_fd(fd);
        }
        for &fd in &self.fds {
            crate::sock::insert(fd, sock.clone());
        }
        Some((sock, super::server::socket_ref(self.kind)))
    }
}

impl CarriedOpts {
    fn from(o: &Opts) -> Self {
        CarriedOpts {
            reuse_addr: o.reuse_addr,
            reuse_port: o.reuse_port,
            keepalive: o.keepalive,
            nodelay: o.nodelay,
            cork: o.cork,
            linger: o.linger,
            rcvtimeo_us: o.rcvtimeo_us,
            sndtimeo_us: o.sndtimeo_us,
            shut_rd: o.shut_rd,
            shut_wr: o.shut_wr,
            v6only: o.v6only,
            bound: o.bound,
        }
    }

    fn apply(&self, o: &mut Opts) {
        o.reuse_addr = self.reuse_addr;
        o.reuse_port = self.reuse_port;
        o.keepalive = self.keepalive;
        o.nodelay = self.nodelay;
        o.cork = self.cork;
        o.linger = self.linger;
        o.rcvtimeo_us = self.rcvtimeo_us;
        o.sndtimeo_us = self.sndtimeo_us;
        o.shut_rd = self.shut_rd;
        o.shut_wr = self.shut_wr;
        o.v6only = self.v6only;
        o.bound = self.bound;
    }
}

/// What crosses the exec: the channel and the surviving sockets.
#[derive(Debug, Serialize, Deserialize)]
struct Carry {
    chan: RawFd,
    socks: Vec<Carried>,
}

/// Whether descriptor `fd` closes at exec.
fn cloexec(fd: RawFd) -> bool {
    // SAFETY: F_GETFD only reads the descriptor's flags.
    let f = unsafe { (real().fcntl)(fd, libc::F_GETFD) };
    f < 0 || f & libc::FD_CLOEXEC != 0
}

/// Set or clear close-on-exec on `fd`.
fn set_cloexec(fd: RawFd, on: bool) {
    let flag = if on { libc::FD_CLOEXEC } else { 0 };
    // SAFETY: F_SETFD on a descriptor of the layer's own.
    unsafe { (real().fcntl)(fd, libc::F_SETFD, flag) };
}

/// An exec is about to run in this process: when it is a client, the
/// `USTACK_SHARE=...` entry for the new program's environment (its
/// channel left open across the exec); None otherwise. Call [`failed`]
/// when the exec returns.
pub fn prepare() -> Option<CString> {
    let c = client()?;
    if c.pid != std::process::id() {
        // A child made by `vfork` (its parent's memory): the channel is
        // the parent's, and the new program must not take it.
        return None;
    }
    let mut socks: Vec<(Arc<Sock>, Vec<RawFd>)> = Vec::new();
    for (fd, s) in crate::fd::all() {
        if cloexec(fd) {
            continue;
        }
        match socks.iter_mut().find(|(o, _)| Arc::ptr_eq(o, &s)) {
            Some((_, fds)) => fds.push(fd),
            None => socks.push((s, vec![fd])),
        }
    }
    let carry = Carry {
        chan: c.fd,
        socks: socks
            .into_iter()
            .map(|(s, fds)| Carried::of(&s, fds))
            .collect(),
    };
    let entry = encode(&postcard::to_stdvec(&carry).ok()?)?;
    set_cloexec(c.fd, false);
    Some(entry)
}

/// A `posix_spawn` in a process on the stack, of a program that loads
/// the layer: the `USTACK_SHARE=...` entry for its environment, and the
/// end of the new channel it inherits (the caller closes this process's
/// copy after the spawn). The owner counts the new process as a child
/// holding what this one holds; every socket is listed by its eventfd's
/// id, and the new program keeps those its file actions and
/// close-on-exec flags leave it (the owner lets go of the rest when it
/// says so, `Op::exec`).
pub fn prepare_spawn() -> Option<(CString, RawFd)> {
    let (ours, theirs) = super::chan::pair().ok()?;
    let registered = if let Some(s) = crate::state::state() {
        super::server::add_child(&s.net, ours).is_ok()
    } else if let Some(c) = client() {
        let ok = c.call::<()>(&Op::fork {}, Some(ours)).is_ok();
        super::chan::close(ours);
        ok
    } else {
        false
    };
    if !registered {
        super::chan::close(ours);
        super::chan::close(theirs);
        return None;
    }
    let mut socks: Vec<Arc<Sock>> = Vec::new();
    for (_, s) in crate::fd::all() {
        if !socks.iter().any(|o| Arc::ptr_eq(o, &s)) {
            socks.push(s);
        }
    }
    let carry = Carry {
        chan: theirs,
        socks: socks
            .iter()
            .filter_map(|s| {
                let id = super::rights::eventfd_id(s.any_fd()?)?;
                let mut c = Carried::of(s, Vec::new());
                c.id = Some(id);
                Some(c)
            })
            .collect(),
    };
    let entry = postcard::to_stdvec(&carry).ok().and_then(|b| encode(&b));
    let Some(entry) = entry else {
        super::chan::close(theirs);
        return None;
    };
    set_cloexec(theirs, false);
    Some((entry, theirs))
}

/// The `USTACK_SHARE=...` entry for `bytes`.
fn encode(bytes: &[u8]) -> Option<CString> {
    let mut entry = format!("{ENV}=");
    for b in bytes {
        entry.push_str(&format!("{b:02x}"));
    }
    CString::new(entry).ok()
}

/// This process's descriptors naming the eventfd of id `id`.
fn fds_of(id: u64) -> Vec<RawFd> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let mut fds: Vec<RawFd> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&fd| super::rights::eventfd_id(fd) == Some(id))
        .collect();
    fds.sort_unstable();
    fds
}

/// The exec failed: this program goes on, and its channel closes at a
/// later exec again.
pub fn failed() {
    if let Some(c) = client() {
        let saved = crate::real::errno();
        set_cloexec(c.fd, true);
        crate::real::set_errno(saved);
    }
}

/// Before `main`: when this program was exec'd by a client, rejoin its
/// stack with the sockets it carried (`USTACK_SHARE` is taken out of the
/// environment). A malformed value is said once and ignored.
pub fn rejoin() {
    let Ok(value) = std::env::var(ENV) else {
        return;
    };
    // SAFETY: before `main`, while this is the only thread.
    unsafe { std::env::remove_var(ENV) };
    let bytes: Option<Vec<u8>> = (0..value.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(value.get(i..i + 2)?, 16).ok())
        .collect();
    let Some(carry) = bytes.and_then(|b| postcard::from_bytes::<Carry>(&b).ok()) else {
        eprintln!("ustack exec: {ENV} is malformed: this program does not share the stack");
        return;
    };
    if crate::fd::identity(carry.chan).is_none() {
        eprintln!(
            "ustack exec: the channel {ENV} names is not open: this program does not share the stack"
        );
        return;
    }
    set_cloexec(carry.chan, true);
    super::become_client(carry.chan);
    let mut keep: Vec<SocketRef> = Vec::new();
    for mut c in carry.socks {
        if let (true, Some(id)) = (c.fds.is_empty(), c.id) {
            c.fds = fds_of(id);
        }
        if let Some((_, Some(r))) = c.install() {
            keep.push(r);
        }
    }
    for fd in 0..=2 {
        if crate::fd::get(fd).is_some() {
            crate::stdio::standard_became_socket(fd);
        }
    }
    if let Some(cl) = client() {
        let _ = cl.call::<()>(&Op::exec { keep }, None);
    }
}
