//! The stack's own MAC in the interface's unicast filter, for as long as
//! the stack runs: a packet socket's `PACKET_MR_UNICAST` membership (the
//! kernel counts it, and removes it when the socket closes, also when the
//! process dies), so a NIC delivers frames for a MAC that is not its own
//! without being made promiscuous.

use std::os::fd::{FromRawFd, OwnedFd};

use crate::XdpError;

/// A packet socket holding one unicast address in an interface's filter.
#[derive(Debug)]
pub struct UnicastMembership {
    _sock: OwnedFd,
}

impl UnicastMembership {
    /// Add `mac` to the unicast filter of interface `ifindex` (`iface`,
    /// for messages).
    pub fn add(iface: &str, ifindex: u32, mac: [u8; 6]) -> Result<Self, XdpError> {
        // SAFETY: socket(2) with constant arguments; the result is checked
        // before it is used.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(XdpError::os(
                iface,
                "packet socket",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: `fd` is a descriptor socket(2) just returned, owned by
        // nobody else; OwnedFd closes it once.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut addr = [0u8; 8];
        addr[..6].copy_from_slice(&mac);
        let mreq = libc::packet_mreq {
            mr_ifindex: ifindex as libc::c_int,
            mr_type: libc::PACKET_MR_UNICAST as libc::c_ushort,
            mr_alen: 6,
            mr_address: addr,
        };
        // SAFETY: `mreq` is a valid packet_mreq that lives across the call;
        // the length passed is its size.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_PACKET,
                libc::PACKET_ADD_MEMBERSHIP,
                (&raw const mreq).cast(),
                size_of::<libc::packet_mreq>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(XdpError::os(
                iface,
                "unicast filter",
                std::io::Error::last_os_error(),
            ));
        }
        Ok(UnicastMembership { _sock: sock })
    }
}
