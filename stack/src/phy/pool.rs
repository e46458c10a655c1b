//! Packet buffers and pools.
//!
//! One [`Pool`] abstraction with the same counters everywhere (capacity, in
//! use, allocation failures). [`SlabPool`] is the pure-Rust implementation used
//! by the sim and pcap backends: a fixed number of fixed-size buffers allocated
//! once, handed out without allocating, and returned when the [`SlabBuf`] is
//! dropped. On DPDK an mbuf pool sits behind the same trait, and the engine
//! reads and writes the mbuf's data room in place (no copy).

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use serde::Serialize;

use crate::phy::offload::{RxChecksum, TxOffload};
use crate::stats::stats;
use crate::time::Instant;

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
    /// When the port received this frame, on the poll loop's clock, where
    /// it stamps frames ([`crate::phy::device::DeviceCaps::rx_timestamps`]):
    /// a frame that waited in the port before a poll read it keeps its
    /// arrival time.
    fn rx_timestamp(&self) -> Option<Instant> {
        None
    }
}

stats! {
    /// Counters every pool publishes.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    pub struct PoolStats {
        /// The pool's name in telemetry (e.g. `rx`, `tx`, a DPDK mempool name).
        label name: String,
        /// Buffers the pool holds in all.
        gauge capacity: usize,
        /// Buffers handed out and not yet returned (a gauge).
        gauge in_use: usize,
        /// Allocations refused because every buffer was in use.
        counter alloc_failures: u64,
        /// Bytes each buffer can hold.
        gauge buf_size: usize,
    }
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

/// Most buffers the owner thread's cache holds (see [`SlabPool`]); it
/// gives half back to the shared list when it would hold more, and takes
/// up to half from it when it is empty.
const CACHE_MAX: usize = 64;

/// Allocations in a row by one thread before it takes a pool's cache: a
/// thread that touches a pool only briefly (a start-up probe before the
/// loop's thread takes the port over) leaves the cache to the next.
const CLAIM_AFTER: u32 = 256;

/// No thread owns the pool's cache yet.
const NO_OWNER: u64 = 0;

/// Thread numbers for cache ownership (0 is [`NO_OWNER`]).
static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

/// A thread's side of the pools: its number and the caches it owns.
struct Local {
    /// This thread's number, [`NO_OWNER`] until first asked.
    number: Cell<u64>,
    /// The caches of the pools this thread owns, at each pool's `slot`.
    caches: RefCell<Vec<ThreadCache>>,
}

impl Local {
    fn number(&self) -> u64 {
        let n = self.number.get();
        if n != NO_OWNER {
            return n;
        }
        let n = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
        self.number.set(n);
        n
    }
}

thread_local! {
    static LOCAL: Local = const {
        Local {
            number: Cell::new(NO_OWNER),
            caches: RefCell::new(Vec::new()),
        }
    };
}

/// Run `f` on this thread's cache at `slot` when this thread is `owner`
/// and the cache is the one of the pool at `pool`; `None` otherwise (or
/// when the caches cannot be reached while the thread ends). A cache left
/// holding the last references to its pool is freed on the way out.
fn with_cache<R>(
    owner: u64,
    slot: usize,
    pool: *const SlabInner,
    f: impl FnOnce(&mut ThreadCache) -> R,
) -> Option<R> {
    LOCAL
        .try_with(|l| {
            if owner == NO_OWNER || l.number() != owner {
                return None;
            }
            let mut caches = l.caches.try_borrow_mut().ok()?;
            let cache = caches.get_mut(slot)?;
            if !std::ptr::eq(cache.pool.as_ptr(), pool) {
                return None;
            }
            let r = f(cache);
            if !cache.bufs.is_empty() && cache.abandoned() {
                // The last handle and buffer are gone: free the slab now
                // rather than when the thread ends.
                cache.bufs.clear();
            }
            Some(r)
        })
        .ok()
        .flatten()
}

/// A free buffer and its pool's reference: a buffer taken from a cache
/// carries the reference it came with, so the pool's reference count is
/// not touched on the way.
type Cached = (Box<[u8]>, Arc<SlabInner>);

/// Free buffers of one pool, kept by the thread that owns its cache.
#[derive(Debug)]
struct ThreadCache {
    pool: Weak<SlabInner>,
    bufs: Vec<Cached>,
}

impl ThreadCache {
    /// Whether nothing but this cache holds the pool (no handle, no buffer
    /// out): its buffers and the pool can be freed.
    fn abandoned(&self) -> bool {
        self.pool.strong_count() <= self.bufs.len()
    }
}

impl Drop for ThreadCache {
    /// The thread ends (or the entry is reused): the buffers go back to
    /// the shared list (and are freed with their pool when it is
    /// abandoned), and another thread may own the pool's cache from now on
    /// (a runtime whose loop thread ends and another starts).
    fn drop(&mut self) {
        let Some(p) = self.pool.upgrade() else {
            return;
        };
        let mut free = p.free();
        free.extend(self.bufs.drain(..).map(|(d, _)| d));
        drop(free);
        p.cached.store(0, Ordering::Relaxed);
        p.owner.store(NO_OWNER, Ordering::Relaxed);
    }
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
    /// The thread whose cache serves this pool, [`NO_OWNER`] until one
    /// thread made [`CLAIM_AFTER`] allocations in a row (never for a pool
    /// too small to spare a cache).
    owner: AtomicU64,
    /// The thread allocating while nobody owns the cache, and its
    /// allocations in a row.
    candidate: AtomicU64,
    streak: AtomicU32,
    /// The index of this pool's cache in the owner thread's caches (`Local::caches`)
    /// (read and written by the owner only).
    slot: AtomicUsize,
    /// Buffers in the owner thread's cache (written by the owner only;
    /// other threads read it for `in_use`).
    cached: AtomicUsize,
    /// Most buffers the owner's cache holds: `CACHE_MAX`, less for a small
    /// pool (another thread could not use what the cache holds).
    cache_max: usize,
}

impl SlabInner {
    /// The free list. It is only held for a push or a pop, so a panic
    /// elsewhere cannot leave it half-updated: keep going with it.
    fn free(&self) -> MutexGuard<'_, Vec<Box<[u8]>>> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Make the calling thread the owner of this pool's cache once it made
    /// [`CLAIM_AFTER`] allocations in a row, if nobody is yet and the pool
    /// is large enough to spare one.
    fn claim(self: &Arc<Self>) {
        if self.cache_max < 2 {
            return;
        }
        let _ = LOCAL.try_with(|l| {
            let me = l.number();
            if self.candidate.load(Ordering::Relaxed) != me {
                self.candidate.store(me, Ordering::Relaxed);
                self.streak.store(1, Ordering::Relaxed);
                return;
            }
            let streak = self.streak.load(Ordering::Relaxed) + 1;
            self.streak.store(streak, Ordering::Relaxed);
            if streak < CLAIM_AFTER {
                return;
            }
            let Ok(mut caches) = l.caches.try_borrow_mut() else {
                return;
            };
            if self
                .owner
                .compare_exchange(NO_OWNER, me, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
            {
                return;
            }
            let entry = ThreadCache {
                pool: Arc::downgrade(self),
                bufs: Vec::with_capacity(self.cache_max + 1),
            };
            // Reuse the place of a pool that is gone (its buffers are
            // freed with the entry), else add one.
            let slot = match caches.iter().position(ThreadCache::abandoned) {
                Some(i) => {
                    caches[i] = entry;
                    i
                }
                None => {
                    caches.push(entry);
                    caches.len() - 1
                }
            };
            self.slot.store(slot, Ordering::Relaxed);
        });
    }

    /// A free buffer and a reference to this pool: from the owner's cache
    /// (refilled from the shared list half a cache at a time), else from
    /// the shared list.
    fn take(self: &Arc<Self>) -> Option<Cached> {
        let mut owner = self.owner.load(Ordering::Relaxed);
        if owner == NO_OWNER {
            self.claim();
            owner = self.owner.load(Ordering::Relaxed);
        }
        {
            let half = self.cache_max / 2;
            let slot = self.slot.load(Ordering::Relaxed);
            let got = with_cache(owner, slot, Arc::as_ptr(self), |c| {
                if c.bufs.is_empty() {
                    let mut free = self.free();
                    let from = free.len().saturating_sub(half);
                    // Oldest first, so the most recently freed is taken first.
                    c.bufs
                        .extend(free.drain(from..).map(|d| (d, Arc::clone(self))));
                }
                let got = c.bufs.pop();
                self.cached.store(c.bufs.len(), Ordering::Relaxed);
                got
            });
            if let Some(got) = got {
                return got;
            }
        }
        self.free().pop().map(|d| (d, Arc::clone(self)))
    }

    /// Give a buffer back with its reference: to the owner's cache (half
    /// of it goes to the shared list when full), else to the shared list.
    fn give(item: Cached) {
        let pool: &SlabInner = &item.1;
        let (owner, slot, max) = (
            pool.owner.load(Ordering::Relaxed),
            pool.slot.load(Ordering::Relaxed),
            pool.cache_max,
        );
        let ptr = Arc::as_ptr(&item.1);
        let mut item = Some(item);
        if owner != NO_OWNER {
            with_cache(owner, slot, ptr, |c| {
                c.bufs.extend(item.take());
                if c.bufs.len() > max {
                    // The oldest half goes back; the hot end stays.
                    let p = Arc::clone(&c.bufs[0].1);
                    p.free().extend(c.bufs.drain(..max / 2).map(|(d, _)| d));
                }
                if let Some((_, p)) = c.bufs.first() {
                    p.cached.store(c.bufs.len(), Ordering::Relaxed);
                }
            });
        }
        if let Some((d, p)) = item {
            p.free().push(d);
        }
    }

    /// Buffers handed out: neither in the shared list nor in the owner's
    /// cache.
    fn in_use(&self) -> usize {
        let free = self.free().len();
        self.capacity
            .saturating_sub(free)
            .saturating_sub(self.cached.load(Ordering::Relaxed))
    }
}

/// A fixed slab of equal-size buffers. Cloning shares the same slab.
///
/// Thread-safe (a short-held lock around the shared free list), so a
/// buffer may be dropped on another thread than the one that took it. The
/// first thread to make 256 allocations in a row owns a small cache of free
/// buffers (at most 64, and at most an eighth of the pool) in a
/// thread-local list: its
/// allocations and frees (a poll loop takes and drops every frame on its
/// own thread) take no lock, and move buffers to and from the shared list
/// half a cache at a time, each buffer with the pool reference it holds
/// (so a frame's trip out and back touches no atomic counter). Cached
/// buffers count as free. A cache goes back to the shared list when its
/// thread ends, and the next thread to allocate enough owns a new one. When the
/// last handle or buffer of a pool goes on the owner thread, its cache
/// (the last references) goes with it; when it goes on another thread,
/// the cache keeps the slab until the owner thread ends or next takes a
/// cache of another pool.
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
                owner: AtomicU64::new(NO_OWNER),
                candidate: AtomicU64::new(NO_OWNER),
                streak: AtomicU32::new(0),
                slot: AtomicUsize::new(0),
                cached: AtomicUsize::new(0),
                cache_max: (capacity / 8).min(CACHE_MAX),
            }),
        }
    }

    /// Buffers currently handed out.
    pub fn in_use(&self) -> usize {
        self.inner.in_use()
    }
}

impl Drop for SlabPool {
    /// The last handle going while only the owner's cache (this thread's)
    /// holds the pool's other references frees the slab now.
    fn drop(&mut self) {
        let inner = &self.inner;
        let owner = inner.owner.load(Ordering::Relaxed);
        let slot = inner.slot.load(Ordering::Relaxed);
        with_cache(owner, slot, Arc::as_ptr(inner), |c| {
            if Arc::strong_count(inner) <= c.bufs.len() + 1 {
                c.bufs.clear();
                inner.cached.store(0, Ordering::Relaxed);
            }
        });
    }
}

impl Pool for SlabPool {
    type Buf = SlabBuf;

    // Inlined so the buffer is built where the caller keeps it: returned
    // through memory, its small field stores were read back as 16-byte
    // words, which the store buffer cannot forward (a stall per frame).
    #[inline]
    fn alloc(&self) -> Option<SlabBuf> {
        match self.inner.take() {
            Some((data, pool)) => Some(SlabBuf {
                data,
                len: 0,
                pool: Some(pool),
                tx_offload: None,
                rx_checksum: RxChecksum::Unknown,
                rx_at: None,
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
    /// The pool it returns to (`None` only while it does, in `drop`).
    pool: Option<Arc<SlabInner>>,
    /// What the sender asked the port to finish (a software port that
    /// models offloads reads it).
    tx_offload: Option<TxOffload>,
    /// What a software port that models receive offloads found.
    rx_checksum: RxChecksum,
    /// When the port received it (a port that stamps frames sets it).
    rx_at: Option<Instant>,
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

    /// Stamp when the port received this frame (on the poll loop's clock).
    pub fn set_rx_timestamp(&mut self, at: Instant) {
        self.rx_at = Some(at);
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
        b.rx_at = self.rx_at;
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
    fn rx_timestamp(&self) -> Option<Instant> {
        self.rx_at
    }
}

impl Drop for SlabBuf {
    fn drop(&mut self) {
        let data = std::mem::take(&mut self.data);
        if let Some(pool) = self.pool.take() {
            SlabInner::give((data, pool));
        }
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

    /// Allocate on this thread until it owns the pool's cache.
    fn own(pool: &SlabPool) {
        for _ in 0..CLAIM_AFTER {
            drop(pool.alloc());
        }
        let me = LOCAL.with(Local::number);
        assert_eq!(pool.inner.owner.load(Ordering::Relaxed), me);
    }

    #[test]
    #[allow(clippy::disallowed_methods)] // the test's own thread, not the engine's
    fn a_thread_that_allocates_briefly_leaves_the_cache_to_the_next() {
        let pool = SlabPool::new("t", 256, 64);
        let p = pool.clone();
        std::thread::spawn(move || {
            for _ in 0..CLAIM_AFTER - 1 {
                drop(p.alloc());
            }
        })
        .join()
        .unwrap();
        assert_eq!(pool.inner.owner.load(Ordering::Relaxed), NO_OWNER);
        own(&pool);
        assert_eq!(pool.in_use(), 0);
    }

    #[test]
    fn the_owner_threads_cache_counts_as_free() {
        let pool = SlabPool::new("t", 256, 64);
        own(&pool);
        // 256 / 8 = 32 cached at most.
        let mut held = Vec::new();
        for round in 0..5 {
            for _ in 0..(100 + round * 30) {
                held.push(pool.alloc().unwrap());
            }
            assert_eq!(pool.in_use(), held.len());
            held.truncate(round * 7);
            assert_eq!(pool.in_use(), held.len());
            assert!(pool.inner.cached.load(Ordering::Relaxed) <= 32);
        }
        drop(held);
        assert_eq!(pool.in_use(), 0);
        // Every buffer can still be taken: cache and shared list together.
        let all: Vec<_> = (0..256).map(|_| pool.alloc().unwrap()).collect();
        assert!(pool.alloc().is_none());
        assert_eq!(pool.stats().alloc_failures, 1);
        drop(all);
        assert_eq!(pool.stats().in_use, 0);
    }

    #[test]
    #[allow(clippy::disallowed_methods)] // the test's own thread, not the engine's
    fn a_cache_goes_back_when_its_thread_ends() {
        let pool = SlabPool::new("t", 128, 32);
        let p = pool.clone();
        std::thread::spawn(move || {
            // This thread owns the cache and ends with buffers in it.
            own(&p);
            let bufs: Vec<_> = (0..100).map(|_| p.alloc().unwrap()).collect();
            drop(bufs);
            assert!(p.inner.cached.load(Ordering::Relaxed) > 0);
        })
        .join()
        .unwrap();
        assert_eq!(pool.inner.cached.load(Ordering::Relaxed), 0);
        assert_eq!(pool.inner.free().len(), 128);
        // The cache is free to be owned again: by this thread, now.
        assert_eq!(pool.inner.owner.load(Ordering::Relaxed), NO_OWNER);
        own(&pool);
        // Another thread (this one) can take every buffer.
        let all: Vec<_> = (0..128).map(|_| pool.alloc().unwrap()).collect();
        assert_eq!(pool.in_use(), 128);
        drop(all);
        assert_eq!(pool.in_use(), 0);
    }

    #[test]
    #[allow(clippy::disallowed_methods)] // the test's own thread, not the engine's
    fn a_gone_pools_cache_is_freed_and_its_place_reused() {
        std::thread::spawn(|| {
            let entries = || LOCAL.with(|l| l.caches.borrow().len());
            let held = || {
                LOCAL.with(|l| {
                    l.caches
                        .borrow()
                        .iter()
                        .map(|e| e.bufs.len())
                        .sum::<usize>()
                })
            };
            for round in 0..10 {
                let pool = SlabPool::new("t", 64, 32);
                let weak = Arc::downgrade(&pool.inner);
                own(&pool);
                let bufs: Vec<_> = (0..20).map(|_| pool.alloc().unwrap()).collect();
                if round % 2 == 0 {
                    drop(bufs);
                    drop(pool);
                } else {
                    // The handle first; the last buffer home frees it.
                    drop(pool);
                    drop(bufs);
                }
                // Nothing holds the pool: neither its slab nor its
                // buffers are kept by this thread's cache.
                assert_eq!(weak.strong_count(), 0);
                assert_eq!(held(), 0);
            }
            // One place, reused by each new pool.
            assert_eq!(entries(), 1);
        })
        .join()
        .unwrap();
    }

    #[test]
    #[allow(clippy::disallowed_methods)] // the test's own thread, not the engine's
    fn a_small_pool_keeps_no_cache() {
        let pool = SlabPool::new("t", 8, 32);
        for _ in 0..2 * CLAIM_AFTER {
            drop(pool.alloc().unwrap());
        }
        assert_eq!(pool.inner.owner.load(Ordering::Relaxed), NO_OWNER);
        let p = pool.clone();
        // Another thread gets every buffer: none sit in a cache.
        let n = std::thread::spawn(move || (0..8).filter_map(|_| p.alloc()).count())
            .join()
            .unwrap();
        assert_eq!(n, 8);
        assert_eq!(pool.in_use(), 0);
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
