//! A safe wrapper over the system DPDK (crate `dpdk-sys`) and ustack's DPDK
//! [`Device`](ustack::phy::device::Device).
//!
//! - [`Eal`]: EAL initialised once per process from an argument string;
//!   cleaned up when the last handle (held by pools and ports) drops.
//! - [`MbufPool`] / [`Mbuf`]: an mbuf mempool with ustack's pool counters,
//!   and an owned mbuf that frees itself on drop. Its bytes are the mbuf's
//!   data room: the engine reads received frames and writes outgoing ones in
//!   place, no copy.
//! - [`Port`]: an ethdev port (N rx/tx queues, descriptors, MTU, promiscuous
//!   mode, link, stats and xstats), stopped and closed on drop.
//! - [`DpdkPort`]: port + pool as a ustack `Device`.
//!
//! This crate is the unsafe boundary: every `unsafe` block says why it is
//! sound (`// SAFETY:`), and no raw DPDK pointer appears in a public
//! signature.
#![deny(clippy::undocumented_unsafe_blocks)]

mod device;
mod eal;
mod mbuf;
mod port;

pub use device::{DpdkPort, DpdkPortConfig};
pub use eal::Eal;
pub use mbuf::{Mbuf, MbufPool};
pub use port::{EthStats, LinkStatus, Port, PortConfig, PortInfo, PortQueue};

/// Everything that can go wrong setting DPDK up.
#[derive(Debug, thiserror::Error)]
pub enum DpdkError {
    #[error("the DPDK EAL is already initialised in this process (one rte_eal_init per process)")]
    AlreadyInitialized,
    #[error("EAL arguments '{0}' cannot be split (unbalanced quotes?)")]
    BadArgs(String),
    #[error("EAL initialisation failed: {reason} (EAL arguments: '{args}')")]
    EalInit { args: String, reason: String },
    #[error(
        "no DPDK port {port}: EAL found {available} port(s); add a virtual device (e.g. --vdev=net_af_packet0,iface=IFACE) or bind a NIC{}",
        privilege_hint(*available)
    )]
    NoSuchPort { port: u16, available: u16 },
    #[error("mbuf pool '{name}' of {count} mbufs: {reason}")]
    Pool {
        name: String,
        count: u32,
        reason: String,
    },
    #[error("DPDK port {port}: {what}: {reason}")]
    Port {
        port: u16,
        what: &'static str,
        reason: String,
    },
}

/// Linux capability numbers (linux/capability.h) the DPDK devices need.
const CAP_NET_ADMIN: u32 = 12;
const CAP_NET_RAW: u32 = 13;
const CAP_IPC_LOCK: u32 = 14;

/// This process's effective capabilities (`CapEff` of /proc/self/status),
/// or `None` where that cannot be read.
fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// When the EAL found no port and the process lacks what DPDK's devices
/// need to open (their probes fail with a log line per device, not an
/// error code), which capabilities those are; empty otherwise.
fn privilege_hint(available: u16) -> String {
    if available > 0 {
        return String::new();
    }
    let Some(caps) = effective_caps() else {
        return String::new();
    };
    let missing: Vec<&str> = [
        (CAP_NET_ADMIN, "CAP_NET_ADMIN"),
        (CAP_NET_RAW, "CAP_NET_RAW"),
        (CAP_IPC_LOCK, "CAP_IPC_LOCK"),
    ]
    .into_iter()
    .filter(|(bit, _)| caps & (1 << bit) == 0)
    .map(|(_, name)| name)
    .collect();
    if missing.is_empty() {
        return String::new();
    }
    format!(
        " (this process lacks {}: net_tap needs CAP_NET_ADMIN, net_af_packet and net_af_xdp CAP_NET_RAW, a NIC bound to vfio-pci read-write access to its /dev/vfio group and CAP_IPC_LOCK or a large LimitMEMLOCK; run as root or give the binary those capabilities)",
        missing.join(", ")
    )
}

/// DPDK's text for an errno value (negative or positive).
pub(crate) fn strerror(err: i32) -> String {
    // SAFETY: rte_strerror returns a pointer to a static or thread-local
    // NUL-terminated string that stays valid until the next call on this
    // thread; it is copied out immediately.
    unsafe {
        let p = dpdk_sys::rte_strerror(err.abs());
        if p.is_null() {
            return format!("error {}", err.abs());
        }
        std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// The calling thread's `rte_errno`.
pub(crate) fn rte_errno() -> i32 {
    // SAFETY: reads a thread-local integer; no preconditions.
    unsafe { dpdk_sys::ustack_errno() }
}

#[cfg(test)]
mod test;
