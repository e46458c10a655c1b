//! AF_XDP for ustack: an XDP socket with its UMEM and four rings
//! ([`Xsk`]), and the XDP program that sends the stack's frames to it and
//! every other frame to the kernel ([`Steering`]), so a host keeps its own
//! addresses (and ssh) on the interface the stack runs on.
//!
//! The rings are `xdpilone`'s (no libbpf or libxdp); the program is
//! `bpf/steer.c`, compiled by clang at build time and loaded with `aya`.
//! The runtime's `XdpPort` (feature `xdp`) turns these into a ustack
//! device.
//!
//! This crate is an unsafe boundary, as `dpdk/` is: the UMEM is memory the
//! kernel writes, and reading it, mapping it and the packet-socket
//! membership are the only `unsafe` blocks, each saying why it is sound
//! (`// SAFETY:`). Nothing unsafe appears in a public signature.
#![deny(clippy::undocumented_unsafe_blocks)]

mod member;
mod steer;
mod xsk;

pub use member::UnicastMembership;
pub use steer::{Steering, SteeringMode};
pub use xsk::{Sent, Xsk, XskConfig, XskStats};

/// What can go wrong opening or running AF_XDP.
#[derive(Debug, thiserror::Error)]
pub enum XdpError {
    /// No interface has this name.
    #[error("no interface named '{0}' (see `ip link`)")]
    NoSuchInterface(String),
    /// The interface has fewer queues than the one asked for.
    #[error("'{iface}' has no queue {queue} (see `ethtool -l {iface}`)")]
    NoSuchQueue {
        /// The interface.
        iface: String,
        /// The queue asked for.
        queue: u32,
    },
    /// The process may not: AF_XDP and loading an XDP program need
    /// capabilities.
    #[error(
        "no permission for AF_XDP on '{0}': run as root or give the binary CAP_NET_ADMIN, \
         CAP_NET_RAW, CAP_BPF and CAP_IPC_LOCK"
    )]
    Permission(String),
    /// Another XDP program is attached to the interface.
    #[error(
        "'{0}' already has an XDP program attached (another stack, or `ip link set dev {0} xdp off` to remove it)"
    )]
    Busy(String),
    /// Another AF_XDP socket is bound to the queue.
    #[error("queue {queue} of '{iface}' is taken by another AF_XDP socket (another stack on it?)")]
    QueueBusy {
        /// The interface.
        iface: String,
        /// The queue.
        queue: u32,
    },
    /// The MTU asks for frames larger than a UMEM frame holds.
    #[error("MTU {mtu} is above what AF_XDP carries here ({max})")]
    Mtu {
        /// The MTU asked for.
        mtu: usize,
        /// The largest MTU this port carries.
        max: usize,
    },
    /// A system call failed.
    #[error("AF_XDP on '{iface}': {what}: {err}")]
    Os {
        /// The interface.
        iface: String,
        /// What was being done.
        what: &'static str,
        /// The error.
        err: std::io::Error,
    },
    /// The XDP program could not be loaded, attached or fed.
    #[error("XDP program on '{iface}': {what}: {msg}")]
    Program {
        /// The interface.
        iface: String,
        /// What was being done.
        what: &'static str,
        /// aya's message.
        msg: String,
    },
}

impl XdpError {
    /// An OS error, mapped to [`Permission`](Self::Permission) when it is one.
    pub(crate) fn os(iface: &str, what: &'static str, err: std::io::Error) -> Self {
        match err.raw_os_error() {
            Some(libc::EPERM | libc::EACCES) => XdpError::Permission(iface.to_string()),
            Some(libc::ENODEV) => XdpError::NoSuchInterface(iface.to_string()),
            _ => XdpError::Os {
                iface: iface.to_string(),
                what,
                err,
            },
        }
    }
}

/// The index of interface `iface`, or [`XdpError::NoSuchInterface`].
pub fn if_index(iface: &str) -> Result<u32, XdpError> {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/ifindex"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| XdpError::NoSuchInterface(iface.to_string()))
}

/// The interface's own MAC address (`/sys/class/net/IFACE/address`).
pub fn if_mac(iface: &str) -> Result<[u8; 6], XdpError> {
    let text = std::fs::read_to_string(format!("/sys/class/net/{iface}/address"))
        .map_err(|_| XdpError::NoSuchInterface(iface.to_string()))?;
    let mut mac = [0u8; 6];
    let mut parts = text.trim().split(':');
    for b in &mut mac {
        *b = parts
            .next()
            .and_then(|p| u8::from_str_radix(p, 16).ok())
            .ok_or_else(|| XdpError::NoSuchInterface(iface.to_string()))?;
    }
    Ok(mac)
}

/// How many receive queues the interface has (`/sys/class/net/IFACE/queues`).
pub fn rx_queues(iface: &str) -> u32 {
    std::fs::read_dir(format!("/sys/class/net/{iface}/queues"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
                .count() as u32
        })
        .unwrap_or(1)
        .max(1)
}
