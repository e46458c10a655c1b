//! `libustack_preload.so`: unmodified Linux programs on ustack.
//!
//! `ustack exec NET -- PROGRAM ARGS...` loads this library into the program
//! with `LD_PRELOAD` and the NET flags in `USTACK_NET`. Before `main` the
//! library checks those flags; the first AF_INET or AF_INET6 socket starts
//! a stack on the interface they name (one process of the program at a
//! time runs it); from then on the program's AF_INET and AF_INET6 stream
//! and datagram sockets are ustack's (an AF_INET6 socket dual-stack unless
//! `IPV6_V6ONLY`, IPv4 peers as v4-mapped addresses, as Linux's), and
//! everything else (files, pipes, AF_UNIX, raw sockets, eventfd, timerfd)
//! goes to the C library unchanged. Without `USTACK_NET` every call goes
//! to the C library.
//!
//! - A ustack socket's descriptor number is an eventfd the layer opened:
//!   the kernel never gives that number to anything else, and kernel
//!   `poll`/`epoll` sets that mix ustack sockets and kernel descriptors
//!   wake on it, because the stack's loop writes it on the socket's
//!   readiness events (`fd.rs`, `poll.rs`).
//! - Calls act on the shared stack directly (no copy through a queue);
//!   a blocking call waits in the kernel on the socket's eventfd, so a
//!   signal interrupts it with EINTR as it would a kernel socket's.
//! - `fork`: parent and child share the stack. The process that started
//!   it runs it; a child's socket calls reach it over a channel of its
//!   own (`share`), and a child that execs hands its sockets and channel
//!   to the new program (`share::exec`). Exit lets the stack go: the next
//!   process of the program to open an AF_INET socket starts it afresh
//!   (the claim, named after `USTACK_PID`, is held by one process at a
//!   time).
//! - The stack's own descriptors (its NIC's, its telemetry socket) are
//!   not the program's: `close` of one fails with EBADF, and
//!   `closefrom`/`close_range` close around them (`own.rs`).
//! - A number closed behind the layer's back (a raw `syscall(SYS_close)`,
//!   as libuv closes; a close inside the C library) is never taken for a
//!   socket once the kernel reuses it: `syscall()` is interposed
//!   (`raw.rs`), calls that make descriptors retire stale entries
//!   (`newfd.rs`), and calls off the data path check the descriptor's
//!   identity (`fd.rs`). To calls that inspect a descriptor a ustack
//!   socket is a socket (`inspect.rs`).
//! - What is left to the kernel is said once on stderr, in a line
//!   starting `ustack:`.
//! - An unsupported call or option fails with the errno Linux gives
//!   (EOPNOTSUPP, ENOPROTOOPT, ENOTTY) and is reported once on stderr.
//!
//! All of this crate's `unsafe` is the C boundary: the interposed
//! functions' raw arguments and the C library's functions.
#![deny(missing_docs)]

mod cmsg;
mod exports;
mod fd;
mod inspect;
mod level;
mod lifecycle;
mod newfd;
mod opts;
mod own;
mod poll;
mod raw;
mod real;
mod report;
mod share;
mod signals;
mod sock;
mod state;
mod stdio;
mod sysctl;
mod tstamp;
mod zerocopy;

/// Run [`lifecycle::init`] when the library is loaded, before the program's `main`.
#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;

extern "C" fn init() {
    lifecycle::init();
}

pub use report::unsupported_count;
