//! The steering program (`bpf/steer.c`): loaded, fed the stack's MAC and
//! addresses, attached to the interface, detached when dropped.

use std::net::IpAddr;
use std::os::fd::AsRawFd;

use aya::Ebpf;
use aya::maps::{Array, HashMap, XskMap};
use aya::programs::{Xdp, XdpMode};

use crate::XdpError;

/// The program, compiled by `build.rs`.
static PROGRAM: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/steer.o"));

/// Byte 7 of the `station` entry: the stack has a MAC of its own, so every
/// unicast frame to it is the stack's.
const OWN_MAC: u8 = 1;

/// How the program runs on the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SteeringMode {
    /// In the driver, before the kernel allocates anything (veth and most
    /// NICs' drivers).
    Native,
    /// In the kernel's generic receive path (any interface, slower).
    Generic,
}

/// The steering program attached to an interface; detached on drop.
pub struct Steering {
    ebpf: Ebpf,
    iface: String,
    mode: SteeringMode,
}

impl core::fmt::Debug for Steering {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Steering")
            .field("iface", &self.iface)
            .field("mode", &self.mode)
            .finish()
    }
}

/// An address as the program keys it: IPv6 as it is, IPv4 v4-mapped.
fn key(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// A failure of the program or its maps.
fn fail(iface: &str, what: &'static str, e: &dyn std::fmt::Display) -> XdpError {
    XdpError::Program {
        iface: iface.to_string(),
        what,
        msg: e.to_string(),
    }
}

impl Steering {
    /// Load the program for a stack with MAC `mac` (its own, or the
    /// interface's when `own_mac` is false: then unicast frames are told
    /// apart by address) and addresses `addrs`, and attach it to `iface`:
    /// natively where the driver can, generically otherwise.
    pub fn attach(
        iface: &str,
        mac: [u8; 6],
        own_mac: bool,
        addrs: &[IpAddr],
    ) -> Result<Self, XdpError> {
        let program = |what: &'static str| move |e: &dyn std::fmt::Display| fail(iface, what, e);
        let mut ebpf = Ebpf::load(PROGRAM).map_err(|e| match &e {
            aya::EbpfError::MapError(aya::maps::MapError::CreateError { io_error, .. })
                if matches!(io_error.raw_os_error(), Some(libc::EPERM)) =>
            {
                XdpError::Permission(iface.to_string())
            }
            _ => program("load")(&e),
        })?;
        {
            let mut station: Array<_, u64> = Array::try_from(
                ebpf.map_mut("station")
                    .ok_or_else(|| program("maps")(&"no station map"))?,
            )
            .map_err(|e| program("station map")(&e))?;
            let mut v = [0u8; 8];
            v[..6].copy_from_slice(&mac);
            v[7] = if own_mac { OWN_MAC } else { 0 };
            station
                .set(0, u64::from_ne_bytes(v), 0)
                .map_err(|e| program("station map")(&e))?;
        }
        {
            let mut ours: HashMap<_, [u8; 16], u8> = HashMap::try_from(
                ebpf.map_mut("ours")
                    .ok_or_else(|| program("maps")(&"no ours map"))?,
            )
            .map_err(|e| program("address map")(&e))?;
            for &ip in addrs {
                ours.insert(key(ip), 1, 0)
                    .map_err(|e| program("address map")(&e))?;
            }
        }
        let prog: &mut Xdp = ebpf
            .program_mut("steer")
            .ok_or_else(|| program("load")(&"no steer program"))?
            .try_into()
            .map_err(|e| program("load")(&e))?;
        prog.load().map_err(|e| match &e {
            aya::programs::ProgramError::LoadError { io_error, .. }
                if matches!(io_error.raw_os_error(), Some(libc::EPERM)) =>
            {
                XdpError::Permission(iface.to_string())
            }
            _ => program("verify")(&e),
        })?;
        let busy = |e: &aya::programs::ProgramError| {
            let text = format!("{e:?}");
            text.contains("EBUSY")
                || text.contains("Device or resource busy")
                || text.contains("os error 16")
        };
        let mode = match prog.attach(iface, XdpMode::Driver) {
            Ok(_) => SteeringMode::Native,
            Err(e) if busy(&e) => return Err(XdpError::Busy(iface.to_string())),
            Err(native) => {
                tracing::debug!("native XDP on {iface} refused ({native}); generic");
                match prog.attach(iface, XdpMode::Skb) {
                    Ok(_) => SteeringMode::Generic,
                    Err(e) if busy(&e) => return Err(XdpError::Busy(iface.to_string())),
                    Err(e) => return Err(program("attach")(&e)),
                }
            }
        };
        Ok(Steering {
            ebpf,
            iface: iface.to_string(),
            mode,
        })
    }

    /// Where the program runs.
    pub fn mode(&self) -> SteeringMode {
        self.mode
    }

    /// Send the frames of receive queue `queue` that the program picks to
    /// the socket `fd` (an [`crate::Xsk`]'s).
    pub fn register(&mut self, queue: u32, fd: impl AsRawFd) -> Result<(), XdpError> {
        let err = |e: &dyn std::fmt::Display| fail(&self.iface, "socket map", e);
        let mut xsks: XskMap<_> = XskMap::try_from(
            self.ebpf
                .map_mut("xsks")
                .ok_or_else(|| err(&"no xsks map"))?,
        )
        .map_err(|e| err(&e))?;
        xsks.set(queue, fd, 0).map_err(|e| err(&e))
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn addresses_are_keyed_in_sixteen_bytes() {
        let v4 = key("10.77.0.2".parse().unwrap());
        assert_eq!(v4[..12], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
        assert_eq!(v4[12..], [10, 77, 0, 2]);
        let v6 = key("fd77::2".parse().unwrap());
        assert_eq!(v6[0], 0xfd);
        assert_eq!(v6[15], 2);
    }

    #[test]
    fn the_program_is_embedded() {
        // An ELF object for BPF (machine 247) with the program's section.
        assert_eq!(&PROGRAM[..4], b"\x7fELF");
        assert_eq!(u16::from_le_bytes([PROGRAM[18], PROGRAM[19]]), 247);
    }
}
