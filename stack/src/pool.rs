//! Packet buffers and pools.
//!
//! One [`Pool`] abstraction with the same counters everywhere (capacity, in
//! use, allocation failures). [`SlabPool`] is the pure-Rust implementation used
//! by the sim and pcap backends: a fixed number of fixed-size buffers allocated
//! once, handed out without allocating, and returned when the [`SlabBuf`] is
//! dropped. On DPDK an mbuf pool sits behind the same trait, and the engine
//! reads and writes the mbuf's data room in place (no copy).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;

use crate::device::{RxChecksum, TxOffload};

/// A packet buffer owned by a pool; returned to the pool when dropped.
///
/// `as_ref`/`as_mut` expose the first `len()` bytes (the frame).
pub trait PacketBuf: AsRef<[u8]> + AsMut<[u8]> {
    /// Bytes of frame data.
    fn len(&self) -> usize;
    /// True when the buffer holds no frame bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Largest frame the buffer can hold.
    fn capacity(&self) -> usize;
    /// Set the frame length. Returns false (and leaves the length) if `len > capacity()`.
    fn set_len(&mut self, len: usize) -> bool;
    /// Ask the port to finish this frame (checksums, segmentation) as
    /// `offload` says. Buffers of ports without offloads ignore it.
    fn set_tx_offload(&mut self, offload: TxOffload) {
        let _ = offload;
    }
    /// What the port found of this received frame's transport checksum.
    fn rx_checksum(&self) -> RxChecksum {
        RxChecksum::Unknown
    }
}

/// Counters every pool publishes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PoolStats {
    /// The pool's name in telemetry (e.g. `rx`, `tx`, a DPDK mempool name).
    pub name: String,
    /// Buffers the pool holds in all.
    pub capacity: usize,
    /// Buffers handed out and not yet returned (a gauge).
    pub in_use: usize,
    /// Allocations refused because every buffer was in use.
    pub alloc_failures: u64,
    /// Bytes each buffer can hold.
    pub buf_size: usize,
}

/// A source of packet buffers.
pub trait Pool {
    /// The buffer type handed out; it returns itself to the pool on drop.
    type Buf: PacketBuf;
    /// Take a buffer (length 0), or `None` when the pool is exhausted (counted).
    fn alloc(&self) -> Option<Self::Buf>;
    /// The pool's counters now.
    fn stats(&self) -> PoolStats;
}

#[derive(Debug)]
struct SlabInner {
    name: String,
    buf_size: usize,
    capacity: usize,
    /// Free buffers, most recently returned last: `alloc` takes from the
    /// end, so a busy loop reuses the few buffers still in cache instead of
    /// cycling through the whole slab (a FIFO here cost 30% of sim goodput).
    free: Mutex<Vec<Box<[u8]>>>,
    alloc_failures: AtomicU64,
}

impl SlabInner {
    /// The free list. It is only held for a push or a pop, so a panic
    /// elsewhere cannot leave it half-updated: keep going with it.
    fn free(&self) -> MutexGuard<'_, Vec<Box<[u8]>>> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A fixed slab of equal-size buffers. Cloning shares the same slab.
///
/// Thread-safe (a short-held lock around the free list), so a buffer may be
/// dropped on another thread than the one that took it.
#[derive(Debug, Clone)]
pub struct SlabPool {
    inner: Arc<SlabInner>,
}

impl SlabPool {
    /// Allocate `capacity` buffers of `buf_size` bytes up front.
    pub fn new(name: impl Into<String>, capacity: usize, buf_size: usize) -> Self {
        let capacity = capacity.max(1);
        let free = (0..capacity)
            .map(|_| vec![0u8; buf_size].into_boxed_slice())
            .collect();
        SlabPool {
            inner: Arc::new(SlabInner {
                name: name.into(),
                buf_size,
                capacity,
                free: Mutex::new(free),
                alloc_failures: AtomicU64::new(0),
            }),
        }
    }

    /// Buffers currently handed out.
    pub fn in_use(&self) -> usize {
        self.inner.capacity - self.inner.free().len()
    }
}

impl Pool for SlabPool {
    type Buf = SlabBuf;

    fn alloc(&self) -> Option<SlabBuf> {
        let data = self.inner.free().pop();
        match data {
            Some(data) => Some(SlabBuf {
                data,
                len: 0,
                pool: Arc::clone(&self.inner),
                tx_offload: None,
                rx_checksum: RxChecksum::Unknown,
            }),
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

/// A buffer from a [`SlabPool`].
#[derive(Debug)]
pub struct SlabBuf {
    data: Box<[u8]>,
    len: usize,
    pool: Arc<SlabInner>,
    /// What the sender asked the port to finish (a software port that
    /// models offloads reads it).
    tx_offload: Option<TxOffload>,
    /// What a software port that models receive offloads found.
    rx_checksum: RxChecksum,
}

impl SlabBuf {
    /// The offload the engine asked for on this frame, if any.
    pub fn tx_offload(&self) -> Option<TxOffload> {
        self.tx_offload
    }

    /// Forget the transmit offload (a port finished it).
    pub fn clear_tx_offload(&mut self) {
        self.tx_offload = None;
    }

    /// Mark what the port found of this received frame's checksum.
    pub fn set_rx_checksum(&mut self, c: RxChecksum) {
        self.rx_checksum = c;
    }

    /// Copy this buffer's frame into a fresh buffer from `pool`.
    pub fn try_clone_from(&self, pool: &SlabPool) -> Option<SlabBuf> {
        let mut b = pool.alloc()?;
        if !b.set_len(self.len) {
            return None;
        }
        b.as_mut().copy_from_slice(self.as_ref());
        b.tx_offload = self.tx_offload;
        b.rx_checksum = self.rx_checksum;
        Some(b)
    }
}

impl AsRef<[u8]> for SlabBuf {
    fn as_ref(&self) -> &[u8] {
        &self.data[..self.len]
    }
}

impl AsMut<[u8]> for SlabBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.data[..self.len]
    }
}

impl PacketBuf for SlabBuf {
    fn len(&self) -> usize {
        self.len
    }
    fn capacity(&self) -> usize {
        self.data.len()
    }
    fn set_len(&mut self, len: usize) -> bool {
        if len > self.data.len() {
            return false;
        }
        self.len = len;
        true
    }
    fn set_tx_offload(&mut self, offload: TxOffload) {
        self.tx_offload = Some(offload);
    }
    fn rx_checksum(&self) -> RxChecksum {
        self.rx_checksum
    }
}

impl Drop for SlabBuf {
    fn drop(&mut self) {
        let data = std::mem::take(&mut self.data);
        self.pool.free().push(data);
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn alloc_free_and_counters() {
        let pool = SlabPool::new("t", 2, 64);
        let mut a = pool.alloc().unwrap();
        let b = pool.alloc().unwrap();
        assert!(pool.alloc().is_none());
        let s = pool.stats();
        assert_eq!((s.capacity, s.in_use, s.alloc_failures), (2, 2, 1));
        assert!(a.set_len(64));
        assert!(!a.set_len(65));
        a.as_mut().fill(7);
        let c = a.try_clone_from(&SlabPool::new("u", 1, 64)).unwrap();
        assert_eq!(c.as_ref(), a.as_ref());
        drop(a);
        drop(b);
        assert_eq!(pool.in_use(), 0);
        let again = pool.alloc().unwrap();
        assert_eq!(again.len(), 0);
    }

    #[test]
    #[allow(clippy::disallowed_methods)] // the test's own thread, not the engine's
    fn buffers_return_across_threads() {
        let pool = SlabPool::new("t", 8, 32);
        let bufs: Vec<_> = (0..8).map(|_| pool.alloc().unwrap()).collect();
        std::thread::spawn(move || drop(bufs)).join().unwrap();
        assert_eq!(pool.in_use(), 0);
    }
}
