//! Mbuf pools and owned mbufs.

use std::ffi::CString;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dpdk_sys::{rte_mbuf, rte_mempool};
use ustack::phy::device::{RxChecksum, TxOffload};
use ustack::phy::pool::{PacketBuf, Pool, PoolStats};

use crate::{DpdkError, Eal, rte_errno, strerror};

#[derive(Debug)]
pub(crate) struct PoolInner {
    mp: NonNull<rte_mempool>,
    name: String,
    capacity: usize,
    buf_size: usize,
    alloc_failures: AtomicU64,
    /// Keeps the EAL alive while the pool (and any of its mbufs) exists.
    _eal: Eal,
}

// SAFETY: a DPDK mempool is multi-producer/multi-consumer safe (the default
// ring ops); the pointer is only used through thread-safe mempool calls.
unsafe impl Send for PoolInner {}
// SAFETY: as above; shared access only reads counters or gets/puts objects.
unsafe impl Sync for PoolInner {}

impl Drop for PoolInner {
    fn drop(&mut self) {
        // Every `Mbuf` holds an Arc of this, and ports hold one while their
        // rx queues may hold mbufs, so nothing of the pool is in use here
        // (unless a mbuf was leaked, which in_use reports).
        let in_use = self.in_use();
        if in_use != 0 {
            tracing::warn!(
                "mbuf pool {}: {in_use} mbufs still in use at free",
                self.name
            );
        }
        // SAFETY: `mp` came from rte_pktmbuf_pool_create and is freed once.
        unsafe { dpdk_sys::rte_mempool_free(self.mp.as_ptr()) };
    }
}

impl PoolInner {
    fn in_use(&self) -> usize {
        // SAFETY: `mp` is a live mempool for as long as `self` exists.
        unsafe { dpdk_sys::rte_mempool_in_use_count(self.mp.as_ptr()) as usize }
    }
}

/// A pool of packet mbufs (`rte_pktmbuf_pool_create`). Cloning shares it.
#[derive(Debug, Clone)]
pub struct MbufPool {
    inner: Arc<PoolInner>,
}

impl MbufPool {
    /// `count` mbufs with `data_room` bytes each (headroom included; 0 for
    /// DPDK's default of 2048 + 128), on the NUMA socket `socket` (or any).
    pub fn new(
        eal: &Eal,
        name: &str,
        count: u32,
        data_room: u16,
        socket: Option<i32>,
    ) -> Result<MbufPool, DpdkError> {
        let err = |reason: String| DpdkError::Pool {
            name: name.to_string(),
            count,
            reason,
        };
        if count == 0 {
            return Err(err("needs at least one mbuf".into()));
        }
        let cname = CString::new(name).map_err(|_| err("name contains NUL".into()))?;
        let data_room = if data_room == 0 {
            dpdk_sys::RTE_MBUF_DEFAULT_BUF_SIZE as u16
        } else {
            data_room
        };
        if u32::from(data_room) <= dpdk_sys::RTE_PKTMBUF_HEADROOM {
            return Err(err(format!(
                "data room {data_room} is not larger than the headroom"
            )));
        }
        // A per-lcore cache only when the pool is large enough for it
        // (DPDK requires cache <= count / 1.5).
        let cache = if count >= 1024 {
            (count / 8).min(256)
        } else {
            0
        };
        // SAFETY: the EAL is initialised (we hold `eal`); the name is a valid
        // C string copied by DPDK.
        let mp = unsafe {
            dpdk_sys::rte_pktmbuf_pool_create(
                cname.as_ptr(),
                count,
                cache,
                0,
                data_room,
                socket.unwrap_or(dpdk_sys::SOCKET_ID_ANY),
            )
        };
        let mp = NonNull::new(mp).ok_or_else(|| {
            let e = rte_errno();
            err(match e {
                libc::ENOMEM => "not enough EAL memory (raise -m or use fewer mbufs)".into(),
                libc::EEXIST => "a pool of that name already exists".into(),
                _ => strerror(e),
            })
        })?;
        Ok(MbufPool {
            inner: Arc::new(PoolInner {
                mp,
                name: name.to_string(),
                capacity: count as usize,
                buf_size: usize::from(data_room) - dpdk_sys::RTE_PKTMBUF_HEADROOM as usize,
                alloc_failures: AtomicU64::new(0),
                _eal: eal.clone(),
            }),
        })
    }

    /// Mbufs currently taken (by us or by the driver), per `rte_mempool_in_use_count`.
    pub fn in_use(&self) -> usize {
        self.inner.in_use()
    }

    pub fn capacity(&self) -> usize {
        self.inner.capacity
    }

    /// Bytes of frame each mbuf holds (its data room less the headroom).
    pub fn data_room(&self) -> usize {
        self.inner.buf_size
    }

    pub(crate) fn raw(&self) -> *mut rte_mempool {
        self.inner.mp.as_ptr()
    }

    /// Wrap an mbuf this pool's driver handed over.
    ///
    /// # Safety
    /// `m` must be a valid mbuf owned by the caller (not referenced elsewhere).
    pub(crate) unsafe fn adopt(&self, m: NonNull<rte_mbuf>) -> Mbuf {
        Mbuf {
            ptr: m,
            _pool: Arc::clone(&self.inner),
        }
    }
}

impl Pool for MbufPool {
    type Buf = Mbuf;

    fn alloc(&self) -> Option<Mbuf> {
        // SAFETY: `raw()` is a live mempool of packet mbufs.
        let m = unsafe { dpdk_sys::ustack_pktmbuf_alloc(self.raw()) };
        match NonNull::new(m) {
            // SAFETY: a freshly allocated mbuf is owned by nobody else.
            Some(m) => Some(unsafe { self.adopt(m) }),
            None => {
                self.inner.alloc_failures.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    fn stats(&self) -> PoolStats {
        PoolStats {
            name: self.inner.name.clone(),
            capacity: self.inner.capacity,
            in_use: self.in_use(),
            alloc_failures: self.inner.alloc_failures.load(Ordering::Relaxed),
            buf_size: self.inner.buf_size,
        }
    }
}

/// One owned, single-segment packet mbuf; freed (back to its pool) on drop.
///
/// `as_ref()`/`as_mut()` are the frame bytes in the mbuf's data room
/// (`rte_pktmbuf_mtod`, `data_len` bytes).
#[derive(Debug)]
pub struct Mbuf {
    ptr: NonNull<rte_mbuf>,
    /// Keeps the mempool (and the EAL) alive while the mbuf exists.
    _pool: Arc<PoolInner>,
}

// SAFETY: an mbuf we own is referenced by nobody else, and freeing it from
// any thread is allowed (non-EAL threads bypass the per-lcore cache).
unsafe impl Send for Mbuf {}

impl Mbuf {
    /// Give up ownership: the raw pointer now belongs to whoever takes it
    /// (the driver, on transmit).
    pub(crate) fn into_raw(self) -> *mut rte_mbuf {
        let me = ManuallyDrop::new(self);
        // SAFETY: `me` is never used again and its Drop never runs, so the
        // Arc is moved out exactly once and released here.
        drop(unsafe { std::ptr::read(&me._pool) });
        me.ptr.as_ptr()
    }

    pub(crate) fn as_raw(&self) -> *mut rte_mbuf {
        self.ptr.as_ptr()
    }

    /// Lower a TSO frame's segment size so each frame it is cut into
    /// (headers included) is at most `max_frame` bytes; other frames are
    /// left alone.
    pub(crate) fn clamp_tso_frame(&mut self, max_frame: u16) {
        // SAFETY: `ptr` is a valid mbuf we own exclusively; the shim only
        // reads its offload fields and lowers `tso_segsz`.
        unsafe { dpdk_sys::ustack_mbuf_clamp_tso_frame(self.ptr.as_ptr(), max_frame) }
    }

    /// Segments in the chain (1 for everything this crate hands out).
    pub fn segments(&self) -> u16 {
        // SAFETY: `ptr` is a valid mbuf we own.
        unsafe { dpdk_sys::ustack_mbuf_nb_segs(self.ptr.as_ptr()) }
    }

    /// Bytes of headroom in front of the frame.
    pub fn headroom(&self) -> usize {
        // SAFETY: `ptr` is a valid mbuf we own.
        usize::from(unsafe { dpdk_sys::ustack_mbuf_headroom(self.ptr.as_ptr()) })
    }

    /// Grow the frame by `n` bytes at the end; the new bytes, or `None` if
    /// there is no room (`rte_pktmbuf_append`).
    pub fn append(&mut self, n: u16) -> Option<&mut [u8]> {
        // SAFETY: `ptr` is a valid mbuf we own exclusively (&mut self).
        let p = unsafe { dpdk_sys::ustack_mbuf_append(self.ptr.as_ptr(), n) };
        // SAFETY: on success DPDK returns `n` writable bytes inside this
        // mbuf's data room, borrowed for as long as `self` is.
        NonNull::new(p).map(|p| unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), n.into()) })
    }

    /// Grow the frame by `n` bytes at the front (into the headroom); the
    /// new bytes, or `None` if the headroom is too small (`rte_pktmbuf_prepend`).
    pub fn prepend(&mut self, n: u16) -> Option<&mut [u8]> {
        // SAFETY: `ptr` is a valid mbuf we own exclusively (&mut self).
        let p = unsafe { dpdk_sys::ustack_mbuf_prepend(self.ptr.as_ptr(), n) };
        // SAFETY: on success `p` starts `n` writable bytes in the data room.
        NonNull::new(p).map(|p| unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), n.into()) })
    }
}

impl Drop for Mbuf {
    fn drop(&mut self) {
        // SAFETY: we own the mbuf; after this it is never touched again.
        unsafe { dpdk_sys::ustack_pktmbuf_free(self.ptr.as_ptr()) };
    }
}

impl AsRef<[u8]> for Mbuf {
    fn as_ref(&self) -> &[u8] {
        let m = self.ptr.as_ptr();
        // SAFETY: `m` is a valid mbuf we own; mtod points at `data_len`
        // initialised bytes of its first segment (the only one), borrowed
        // for as long as `self`.
        unsafe {
            let len = usize::from(dpdk_sys::ustack_mbuf_data_len(m));
            std::slice::from_raw_parts(dpdk_sys::ustack_mbuf_data(m), len)
        }
    }
}

impl AsMut<[u8]> for Mbuf {
    fn as_mut(&mut self) -> &mut [u8] {
        let m = self.ptr.as_ptr();
        // SAFETY: as in `as_ref`, and `&mut self` makes the borrow exclusive.
        unsafe {
            let len = usize::from(dpdk_sys::ustack_mbuf_data_len(m));
            std::slice::from_raw_parts_mut(dpdk_sys::ustack_mbuf_data(m), len)
        }
    }
}

impl PacketBuf for Mbuf {
    fn len(&self) -> usize {
        // SAFETY: `ptr` is a valid mbuf we own.
        usize::from(unsafe { dpdk_sys::ustack_mbuf_data_len(self.ptr.as_ptr()) })
    }

    fn capacity(&self) -> usize {
        // SAFETY: `ptr` is a valid mbuf we own.
        usize::from(unsafe { dpdk_sys::ustack_mbuf_room(self.ptr.as_ptr()) })
    }

    fn set_len(&mut self, len: usize) -> bool {
        let Ok(len) = u16::try_from(len) else {
            return false;
        };
        // SAFETY: `ptr` is a valid mbuf we own exclusively; the shim refuses
        // lengths beyond the data room. Bytes newly exposed are the data
        // room's previous contents (initialised memory from the mempool).
        unsafe { dpdk_sys::ustack_mbuf_set_len(self.ptr.as_ptr(), len) == 0 }
    }

    fn set_tx_offload(&mut self, o: TxOffload) {
        use dpdk_sys::offload::*;
        // The port fills the TCP checksum over the pseudo-header sum the
        // engine left; the IPv4 header checksum is already written.
        let mut flags = RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_TCP_CKSUM;
        if o.tso_segsz > 0 {
            // A TSO segment (the engine asks only when its payload exceeds
            // one segment, and left the pseudo-header sum without the
            // length): DPDK's contract for IPv4 TSO also asks the port for
            // each frame's IPv4 checksum, over a zeroed field.
            flags |= RTE_MBUF_F_TX_TCP_SEG | RTE_MBUF_F_TX_IP_CKSUM;
            let at = usize::from(o.l2_len) + 10;
            if let Some(field) = self.as_mut().get_mut(at..at + 2) {
                field.fill(0);
            }
        }
        // SAFETY: `ptr` is a valid mbuf we own exclusively; the shim only
        // sets its offload fields.
        unsafe {
            dpdk_sys::ustack_mbuf_tx_offload(
                self.ptr.as_ptr(),
                flags,
                u16::from(o.l2_len),
                u16::from(o.l3_len),
                u16::from(o.l4_len),
                o.tso_segsz,
            )
        }
    }

    fn rx_checksum(&self) -> RxChecksum {
        use dpdk_sys::offload::*;
        // SAFETY: `ptr` is a valid mbuf we own.
        let f = unsafe { dpdk_sys::ustack_mbuf_ol_flags(self.ptr.as_ptr()) };
        match (
            f & RTE_MBUF_F_RX_L4_CKSUM_GOOD != 0,
            f & RTE_MBUF_F_RX_L4_CKSUM_BAD != 0,
        ) {
            (true, false) => RxChecksum::Good,
            (false, true) => RxChecksum::Bad,
            _ => RxChecksum::Unknown,
        }
    }
}
