//! Memory regions: the bytes RC peers may WRITE into and READ from, with
//! their keys and access flags. The engine owns the bytes (a `Vec<u8>` per
//! region, placed at a virtual address of its own choosing, as a kernel
//! maps a registered buffer); the app reads and writes them through the
//! stack, and every remote or local use is checked against the region's
//! range and access flags first. Nothing is ever written outside a region.

use std::collections::HashMap;
use std::hash::Hasher;

use siphasher::sip::SipHasher24;
use slotmap::SlotMap;

slotmap::new_key_type! {
    /// A registered memory region. Stale handles (after
    /// [`dereg_mr`](crate::socket::rc::Rc::dereg_mr)) are refused, never another region.
    pub struct MrHandle;
}

/// What a memory region allows, as the verbs access flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access(u8);

impl Access {
    /// Local reads only (a send source).
    pub const NONE: Access = Access(0);
    /// The region may receive: RECV buffers and READ destinations.
    pub const LOCAL_WRITE: Access = Access(1);
    /// Peers may RDMA WRITE into it.
    pub const REMOTE_WRITE: Access = Access(2);
    /// Peers may RDMA READ from it.
    pub const REMOTE_READ: Access = Access(4);
    /// Peers may run atomics on it.
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// Every flag.
    pub const ALL: Access = Access(15);

    /// Whether every flag of `other` is set in `self`.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// A region as the app and its peer see it: the address range it covers,
/// its keys and what it allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrInfo {
    /// Virtual address of the first byte (what a peer puts in a RETH).
    pub addr: u64,
    /// Length in bytes.
    pub len: usize,
    /// Local key (what SGEs name).
    pub lkey: u32,
    /// Remote key (what a peer's WRITE or READ must carry).
    pub rkey: u32,
    /// What the region allows.
    pub access: Access,
}

/// Why a region cannot be used for an access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MrFault {
    /// No region has the key.
    Key,
    /// The region does not allow the access.
    Access,
    /// The range runs outside the region.
    Range,
}

#[derive(Debug)]
struct Mr {
    info: MrInfo,
    data: Vec<u8>,
}

/// The stack's memory regions, found by key.
#[derive(Debug)]
pub(crate) struct MrTable {
    mrs: SlotMap<MrHandle, Mr>,
    by_key: HashMap<u32, MrHandle>,
    next_addr: u64,
    counter: u32,
    secret: (u64, u64),
}

/// Where the first region's address is placed; regions are page aligned
/// with an unmapped page between them.
const FIRST_ADDR: u64 = 0x7e00_0000_0000;
const PAGE: u64 = 4096;

impl MrTable {
    pub(crate) fn new(secret: (u64, u64)) -> Self {
        MrTable {
            mrs: SlotMap::with_key(),
            by_key: HashMap::new(),
            next_addr: FIRST_ADDR,
            counter: 0,
            secret,
        }
    }

    pub(crate) fn count(&self) -> usize {
        self.mrs.len()
    }

    pub(crate) fn bytes(&self) -> usize {
        self.mrs.values().map(|m| m.data.len()).sum()
    }

    /// Register `len` zeroed bytes. Keys are a counter in the high 24 bits
    /// and a keyed hash in the low 8, so a stale or guessed key rarely
    /// names a live region.
    pub(crate) fn register(&mut self, len: usize, access: Access) -> Option<MrHandle> {
        let key = loop {
            self.counter = self.counter.wrapping_add(1) & 0x00ff_ffff;
            let mut h = SipHasher24::new_with_keys(self.secret.0, self.secret.1 ^ 0x6d72);
            h.write_u32(self.counter);
            let key = (self.counter << 8) | (h.finish() as u32 & 0xff);
            if key != 0 && !self.by_key.contains_key(&key) {
                break key;
            }
            if self.by_key.len() >= 0x00ff_fff0 {
                return None;
            }
        };
        let addr = self.next_addr;
        let span = (len as u64).div_ceil(PAGE).max(1) * PAGE + PAGE;
        self.next_addr = self.next_addr.checked_add(span)?;
        let info = MrInfo {
            addr,
            len,
            lkey: key,
            rkey: key,
            access,
        };
        let h = self.mrs.insert(Mr {
            info,
            data: vec![0; len],
        });
        self.by_key.insert(key, h);
        Some(h)
    }

    pub(crate) fn deregister(&mut self, h: MrHandle) -> bool {
        match self.mrs.remove(h) {
            Some(m) => {
                self.by_key.remove(&m.info.lkey);
                true
            }
            None => false,
        }
    }

    pub(crate) fn info(&self, h: MrHandle) -> Option<MrInfo> {
        self.mrs.get(h).map(|m| m.info)
    }

    pub(crate) fn data(&self, h: MrHandle) -> Option<&[u8]> {
        self.mrs.get(h).map(|m| &m.data[..])
    }

    pub(crate) fn data_mut(&mut self, h: MrHandle) -> Option<&mut [u8]> {
        self.mrs.get_mut(h).map(|m| &mut m.data[..])
    }

    /// Find the region `key` names and check that `[addr, addr + len)`
    /// lies in it and that it allows `need`. A zero-length access needs no
    /// region at all (the spec lets it carry any key).
    pub(crate) fn check(
        &self,
        key: u32,
        addr: u64,
        len: usize,
        need: Access,
    ) -> Result<Option<(MrHandle, usize)>, MrFault> {
        if len == 0 {
            return Ok(None);
        }
        let h = *self.by_key.get(&key).ok_or(MrFault::Key)?;
        let m = &self.mrs[h];
        if !m.info.access.contains(need) {
            return Err(MrFault::Access);
        }
        let off = addr.checked_sub(m.info.addr).ok_or(MrFault::Range)?;
        let end = off.checked_add(len as u64).ok_or(MrFault::Range)?;
        if end > m.info.len as u64 {
            return Err(MrFault::Range);
        }
        Ok(Some((h, off as usize)))
    }

    /// The bytes `[addr, addr + len)` of the region `key` names, checked
    /// as [`check`](Self::check).
    pub(crate) fn read(
        &self,
        key: u32,
        addr: u64,
        len: usize,
        need: Access,
    ) -> Result<&[u8], MrFault> {
        Ok(match self.check(key, addr, len, need)? {
            Some((h, off)) => &self.mrs[h].data[off..off + len],
            None => &[],
        })
    }

    /// Copy `bytes` to `addr` in the region `key` names, checked as
    /// [`check`](Self::check).
    pub(crate) fn write(
        &mut self,
        key: u32,
        addr: u64,
        bytes: &[u8],
        need: Access,
    ) -> Result<(), MrFault> {
        if let Some((h, off)) = self.check(key, addr, bytes.len(), need)? {
            self.mrs[h].data[off..off + bytes.len()].copy_from_slice(bytes);
        }
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn accesses_are_checked_against_key_flags_and_range() {
        let mut t = MrTable::new((1, 2));
        let a = t
            .register(100, Access::REMOTE_WRITE | Access::LOCAL_WRITE)
            .unwrap();
        let b = t.register(8192, Access::REMOTE_READ).unwrap();
        let (ia, ib) = (t.info(a).unwrap(), t.info(b).unwrap());
        assert_ne!(ia.rkey, ib.rkey);
        // Regions never touch: a write running past `a` cannot land in `b`.
        assert!(ib.addr >= ia.addr + 100 + PAGE);
        assert_eq!(
            t.write(ia.rkey, ia.addr + 90, &[7; 10], Access::REMOTE_WRITE),
            Ok(())
        );
        assert_eq!(&t.data(a).unwrap()[90..], &[7; 10]);
        assert_eq!(
            t.write(ia.rkey, ia.addr + 91, &[7; 10], Access::REMOTE_WRITE),
            Err(MrFault::Range)
        );
        assert_eq!(
            t.write(ia.rkey, ia.addr - 1, &[7; 1], Access::REMOTE_WRITE),
            Err(MrFault::Range)
        );
        assert_eq!(
            t.write(ia.rkey, u64::MAX, &[7; 2], Access::REMOTE_WRITE),
            Err(MrFault::Range)
        );
        assert_eq!(
            t.read(ia.rkey, ia.addr, 4, Access::REMOTE_READ),
            Err(MrFault::Access)
        );
        assert_eq!(
            t.read(ib.rkey ^ 0x100, ib.addr, 4, Access::REMOTE_READ),
            Err(MrFault::Key)
        );
        assert_eq!(
            t.read(ib.rkey, ib.addr, 8192, Access::REMOTE_READ)
                .unwrap()
                .len(),
            8192
        );
        // Zero length needs no region.
        assert_eq!(t.read(0xdead, 0, 0, Access::REMOTE_READ), Ok(&[][..]));
        assert!(t.deregister(a));
        assert!(!t.deregister(a));
        assert_eq!(
            t.write(ia.rkey, ia.addr, &[1], Access::REMOTE_WRITE),
            Err(MrFault::Key)
        );
        assert_eq!(t.count(), 1);
    }
}
