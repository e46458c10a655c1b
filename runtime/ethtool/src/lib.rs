//! An interface's offload features ("rx-gro", "rx-lro", ...: the kernel's
//! names, as `ethtool -k` lists them with `--show-features` names) read and
//! set with the `SIOCETHTOOL` ioctl: `ETHTOOL_GSSET_INFO` and
//! `ETHTOOL_GSTRINGS` for the names, `ETHTOOL_GFEATURES` and
//! `ETHTOOL_SFEATURES` for the bits (linux/ethtool.h).
//!
//! No child process: the pcap backend runs inside programs started by
//! `ustack exec`, and a program that reaps every child on SIGCHLD (ncat)
//! would take `ethtool`'s exit status from us, or we its. The socket the
//! ioctl goes through is made with a raw system call (rustix), so an
//! LD_PRELOAD layer in the same process never sees it.
//!
//! The one `unsafe` is the ioctl; the kernel reads and writes only the
//! buffer the request's header sizes, which this crate allocates to fit.

use std::io;
use std::os::fd::OwnedFd;

use rustix::ioctl::{Opcode, Updater};
use rustix::net::{AddressFamily, SocketType};

/// `SIOCETHTOOL` (linux/sockios.h).
const SIOCETHTOOL: Opcode = 0x8946;
/// `ETHTOOL_GSTRINGS`: a string set's names.
const ETHTOOL_GSTRINGS: u32 = 0x1b;
/// `ETHTOOL_GSSET_INFO`: string set sizes.
const ETHTOOL_GSSET_INFO: u32 = 0x37;
/// `ETHTOOL_GFEATURES`: the feature bits.
const ETHTOOL_GFEATURES: u32 = 0x3a;
/// `ETHTOOL_SFEATURES`: request feature changes.
const ETHTOOL_SFEATURES: u32 = 0x3b;
/// `ETH_SS_FEATURES`: the string set naming the feature bits.
const ETH_SS_FEATURES: u32 = 4;
/// `ETH_GSTRING_LEN`: one name's bytes.
const ETH_GSTRING_LEN: usize = 32;

/// One feature's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Feature {
    /// In effect now.
    pub active: bool,
    /// Asked for (by default or by a user).
    pub requested: bool,
    /// Cannot be changed (`[fixed]` in `ethtool -k`): not offered by the
    /// device, or marked never-changeable.
    pub fixed: bool,
}

/// An interface's features, as `ETHTOOL_GFEATURES` reported them.
#[derive(Debug, Clone)]
pub struct Features {
    names: Vec<String>,
    /// Per 32 features: available, requested, active, never changed.
    blocks: Vec<[u32; 4]>,
}

impl Features {
    /// The feature called `name` (the kernel's name, e.g. "rx-gro"), or
    /// `None` when this kernel has no such feature.
    pub fn get(&self, name: &str) -> Option<Feature> {
        let i = self.names.iter().position(|n| n == name)?;
        let b = self.blocks.get(i / 32)?;
        let bit = 1u32 << (i % 32);
        Some(Feature {
            active: b[2] & bit != 0,
            requested: b[1] & bit != 0,
            fixed: b[0] & bit == 0 || b[3] & bit != 0,
        })
    }

    /// Every feature's name, in the kernel's order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }
}

/// A socket for the ioctl (any family reaches the device ioctls; AF_UNIX
/// needs no network stack). Made by a raw system call.
fn control_socket() -> io::Result<OwnedFd> {
    Ok(rustix::net::socket(
        AddressFamily::UNIX,
        SocketType::DGRAM,
        None,
    )?)
}

/// `SIOCETHTOOL` on `iface` with the request in `buf` (its first word is
/// the command; the kernel reads and writes within `buf`).
fn ethtool(fd: &OwnedFd, iface: &str, buf: &mut [u32]) -> io::Result<()> {
    // SAFETY: an all-zero ifreq is a valid value (name and union of
    // integers and pointers).
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    let name = iface.as_bytes();
    if name.is_empty() || name.len() >= ifr.ifr_name.len() || name.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {iface:?}"),
        ));
    }
    for (d, s) in ifr.ifr_name.iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    ifr.ifr_ifru.ifru_data = buf.as_mut_ptr().cast();
    // SAFETY: `ifr` names the interface and points at `buf`, which lives
    // past the call; every request built here sizes its header (`len`,
    // `size`, `sset_mask`) so that what the kernel reads or writes fits
    // in `buf` (checked by the callers before the call). The ioctl writes
    // `ifr` itself only within its own size.
    unsafe { rustix::ioctl::ioctl(fd, Updater::<SIOCETHTOOL, libc::ifreq>::new(&mut ifr)) }?;
    Ok(())
}

/// The names of the feature bits: `ETHTOOL_GSSET_INFO` for their count,
/// then `ETHTOOL_GSTRINGS`.
fn feature_names(fd: &OwnedFd, iface: &str) -> io::Result<Vec<String>> {
    // struct ethtool_sset_info: cmd, reserved, u64 sset_mask, u32 data[1].
    let mut info = [ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_FEATURES, 0, 0];
    ethtool(fd, iface, &mut info)?;
    if info[2] & (1 << ETH_SS_FEATURES) == 0 {
        return Err(io::Error::other("the interface reports no feature names"));
    }
    let n = info[4] as usize;
    if n > 4096 {
        return Err(io::Error::other(format!("{n} feature names")));
    }
    // struct ethtool_gstrings: cmd, string_set, len, then len names.
    let mut buf = vec![0u32; 3 + n * ETH_GSTRING_LEN / 4];
    buf[..3].copy_from_slice(&[ETHTOOL_GSTRINGS, ETH_SS_FEATURES, n as u32]);
    ethtool(fd, iface, &mut buf)?;
    let n = (buf[2] as usize).min(n);
    let bytes: Vec<u8> = buf[3..].iter().flat_map(|w| w.to_ne_bytes()).collect();
    Ok(bytes
        .chunks(ETH_GSTRING_LEN)
        .take(n)
        .map(|c| {
            let end = c.iter().position(|&b| b == 0).unwrap_or(c.len());
            String::from_utf8_lossy(&c[..end]).into_owned()
        })
        .collect())
}

/// The feature blocks: struct ethtool_gfeatures (cmd, size, then `size`
/// blocks of available, requested, active, never_changed).
fn feature_blocks(fd: &OwnedFd, iface: &str, words: usize) -> io::Result<Vec<[u32; 4]>> {
    let mut buf = vec![0u32; 2 + 4 * words];
    buf[..2].copy_from_slice(&[ETHTOOL_GFEATURES, words as u32]);
    ethtool(fd, iface, &mut buf)?;
    let have = (buf[1] as usize).min(words);
    Ok(buf[2..]
        .chunks(4)
        .take(have)
        .map(|c| [c[0], c[1], c[2], c[3]])
        .collect())
}

/// `iface`'s features (no privilege needed).
pub fn features(iface: &str) -> io::Result<Features> {
    let fd = control_socket()?;
    let names = feature_names(&fd, iface)?;
    let blocks = feature_blocks(&fd, iface, names.len().div_ceil(32))?;
    Ok(Features { names, blocks })
}

/// Ask for each named feature on (`true`) or off (needs CAP_NET_ADMIN;
/// EPERM without it). A name this kernel does not know is an error, and
/// nothing is changed then.
pub fn set_features(iface: &str, changes: &[(&str, bool)]) -> io::Result<()> {
    let fd = control_socket()?;
    let names = feature_names(&fd, iface)?;
    // The kernel wants exactly its own number of blocks.
    let words = names.len().div_ceil(32);
    // struct ethtool_sfeatures: cmd, size, then `size` blocks of valid,
    // requested.
    let mut buf = vec![0u32; 2 + 2 * words];
    buf[..2].copy_from_slice(&[ETHTOOL_SFEATURES, words as u32]);
    for (name, on) in changes {
        let i = names.iter().position(|n| n == name).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{iface} has no feature {name}"),
            )
        })?;
        let bit = 1u32 << (i % 32);
        buf[2 + 2 * (i / 32)] |= bit;
        if *on {
            buf[3 + 2 * (i / 32)] |= bit;
        }
    }
    ethtool(&fd, iface, &mut buf)
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn the_loopback_interface_lists_its_features() {
        let f = features("lo").expect("lo's features");
        assert!(
            f.names().count() > 32,
            "{:?}",
            f.names().collect::<Vec<_>>()
        );
        // Every kernel since 2.6.39 names these.
        for name in ["rx-gro", "rx-lro", "tx-checksum-ip-generic"] {
            assert!(f.get(name).is_some(), "no {name}");
        }
        assert!(f.get("no-such-feature").is_none());
        // lo has no LRO to turn on: ethtool says "off [fixed]".
        let lro = f.get("rx-lro").unwrap();
        assert!(!lro.active && lro.fixed, "{lro:?}");
    }

    #[test]
    fn bad_names_are_refused_before_any_call() {
        for bad in ["", "an-interface-name-too-long", "a\0b"] {
            let e = features(bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
        let e = features("nosuchif0").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENODEV), "{e}");
        let e = set_features("lo", &[("no-such-feature", false)]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    }
}
