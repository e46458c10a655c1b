//! TCP send and receive rings.
//!
//! Both rings have a fixed capacity (autotuning raises a [`RecvBuffer`]'s,
//! [`RecvBuffer::grow`]) and take memory as data passes: nothing until the
//! first byte, then a few KiB doubling up to the capacity, so a segment
//! allocates only while a ring is still growing, a few times in a
//! connection's life. [`SendBuffer`] holds what the app wrote until
//! the peer acknowledges it; [`RecvBuffer`] holds what arrived until the app
//! reads it, including out-of-order data, which sits at its final position in
//! the same ring (so filling the hole in front of it makes it readable with no
//! copy). A short, bounded list of the out-of-order ranges gives the SACK
//! blocks to advertise (RFC 2018).
//!
//! No method panics on any argument: offsets and lengths out of range are
//! clamped or ignored, as each method documents.

use crate::wire::checksum;

/// Bytes a ring allocates when it is first written (or more, if the first
/// write is larger); it then doubles as data needs, up to its capacity.
/// Tests use a small one so that their small buffers grow too.
#[cfg(not(test))]
const FIRST_ALLOCATION: usize = 4096;
#[cfg(test)]
const FIRST_ALLOCATION: usize = 16;

/// A byte ring of fixed logical capacity addressed by logical position from
/// its start (`head`).
///
/// The memory behind it is allocated as data arrives, not up front: a
/// connection that carries a 100-byte request and its reply touches 4 KiB,
/// not the hundreds of kilobytes its window allows (zeroing those was most
/// of the cost of a short connection). The allocation starts at
/// [`FIRST_ALLOCATION`] bytes and doubles, up to the capacity, when a
/// write reaches past it; growing lays the held bytes out from the
/// allocation's first byte again. Invariant: every byte written lies at a
/// logical position below the allocation's length, so positions wrap at
/// that length, which equals the capacity once fully grown.
///
/// Every method clamps: bytes that would fall outside `[0, capacity)` are not
/// copied.
#[derive(Debug)]
struct Ring {
    buf: Box<[u8]>,
    head: usize,
    cap: usize,
}

impl Ring {
    fn new(capacity: usize) -> Self {
        Ring {
            buf: Box::default(),
            head: 0,
            cap: capacity,
        }
    }

    fn capacity(&self) -> usize {
        self.cap
    }

    /// Bytes allocated now (at most the capacity).
    fn allocated(&self) -> usize {
        self.buf.len()
    }

    /// Physical index of logical position `pos` (`pos < allocated`).
    fn index(&self, pos: usize) -> usize {
        let len = self.buf.len();
        // head < len and pos < len: the sum cannot overflow (a slice is at
        // most isize::MAX bytes).
        let i = self.head + pos;
        if i >= len { i - len } else { i }
    }

    /// Make logical positions `..end` writable (`end <= capacity`):
    /// allocate at least double (a power of two, or the capacity), held
    /// bytes moved to the new allocation's start.
    fn reserve(&mut self, end: usize) {
        let have = self.buf.len();
        if end <= have {
            return;
        }
        let want = end
            .max(have * 2)
            .max(FIRST_ALLOCATION)
            .checked_next_power_of_two()
            .unwrap_or(self.cap)
            .min(self.cap);
        let mut buf = vec![0; want].into_boxed_slice();
        self.read(0, &mut buf[..have]);
        self.buf = buf;
        self.head = 0;
    }

    /// Copy `src` to logical positions `pos..`; what would run past the
    /// capacity is not copied. Returns bytes copied.
    fn write(&mut self, pos: usize, src: &[u8]) -> usize {
        if pos >= self.cap {
            return 0;
        }
        let n = src.len().min(self.cap - pos);
        self.reserve(pos + n);
        let len = self.buf.len();
        let at = self.index(pos);
        let first = n.min(len - at);
        let (a, b) = src[..n].split_at(first);
        self.buf[at..at + first].copy_from_slice(a);
        self.buf[..b.len()].copy_from_slice(b);
        n
    }

    /// Copy logical positions `pos..` into `dst`; what would run past the
    /// allocation (bytes never written) is not copied. Returns bytes
    /// copied.
    fn read(&self, pos: usize, dst: &mut [u8]) -> usize {
        let len = self.buf.len();
        if pos >= len {
            return 0;
        }
        let n = dst.len().min(len - pos);
        let at = self.index(pos);
        let first = n.min(len - at);
        let (a, b) = dst[..n].split_at_mut(first);
        a.copy_from_slice(&self.buf[at..at + first]);
        let rest = b.len();
        b.copy_from_slice(&self.buf[..rest]);
        n
    }

    /// [`read`](Self::read), also giving the one's-complement sum of the
    /// bytes copied (a `checksum::sum` accumulator over them as one
    /// run), taken from the ring as each piece is copied: summing the
    /// source beats summing the bytes just written (they are still on
    /// their way to the cache).
    fn read_summed(&self, pos: usize, dst: &mut [u8]) -> (usize, u64) {
        let len = self.buf.len();
        if pos >= len {
            return (0, 0);
        }
        let n = dst.len().min(len - pos);
        let at = self.index(pos);
        let first = n.min(len - at);
        let (a, b) = dst[..n].split_at_mut(first);
        let src_a = &self.buf[at..at + first];
        let mut acc = checksum::sum(0, src_a);
        a.copy_from_slice(src_a);
        let src_b = &self.buf[..b.len()];
        if !src_b.is_empty() {
            let sum_b = checksum::sum(0, src_b);
            // After an odd first piece the second starts mid-word: its
            // sum is the byte-swapped one (RFC 1071 2.B).
            acc += if first % 2 == 1 {
                u64::from(checksum::fold(sum_b).swap_bytes())
            } else {
                sum_b
            };
            b.copy_from_slice(src_b);
        }
        (n, acc)
    }

    /// The bytes at logical positions `pos..pos + max` that lie in one
    /// piece (up to where the ring wraps, or its allocation ends).
    fn chunk(&self, pos: usize, max: usize) -> &[u8] {
        let len = self.buf.len();
        if pos >= len {
            return &[];
        }
        let at = self.index(pos);
        let n = max.min(len - pos).min(len - at);
        &self.buf[at..at + n]
    }

    /// [`chunk`](Self::chunk), writable, for bytes about to be written:
    /// the allocation grows (at most doubling) when `pos..pos + max`
    /// reaches past it, so the piece may be shorter than `max` even when
    /// the capacity has room; the rest comes in the next call.
    fn chunk_mut(&mut self, pos: usize, max: usize) -> &mut [u8] {
        if pos >= self.cap {
            return &mut [];
        }
        let max = max.min(self.cap - pos);
        if max > 0 {
            let have = self.buf.len().max(FIRST_ALLOCATION);
            self.reserve(pos + max.min(have));
        }
        let len = self.buf.len();
        if pos >= len {
            return &mut [];
        }
        let at = self.index(pos);
        let n = max.min(len - pos).min(len - at);
        &mut self.buf[at..at + n]
    }

    /// Raise the capacity to `capacity` (never lowered); memory follows
    /// when data needs it.
    fn grow(&mut self, capacity: usize) {
        self.cap = self.cap.max(capacity);
    }

    /// Move the start forward by `n` bytes (`n <= allocated`).
    fn advance(&mut self, n: usize) {
        let len = self.buf.len();
        if len == 0 {
            return;
        }
        self.head = self.index(n.min(len) % len);
    }

    /// Start again at the ring's first byte: only when it holds nothing.
    /// A ring drained as fast as it fills then reuses its first few
    /// kilobytes, which stay in the L1 cache, instead of writing every
    /// segment to lines last touched a whole capacity ago.
    fn rewind(&mut self) {
        self.head = 0;
    }
}

/// Bytes the app wrote that the peer has not acknowledged: a ring of fixed
/// capacity. The first held byte is the oldest unacknowledged one; sent and
/// unsent bytes are not told apart here (the connection knows how far it
/// sent).
#[derive(Debug)]
pub struct SendBuffer {
    ring: Ring,
    len: usize,
}

impl SendBuffer {
    /// An empty buffer of `capacity` bytes (memory is allocated as bytes
    /// are written, up to the capacity).
    pub fn new(capacity: usize) -> Self {
        SendBuffer {
            ring: Ring::new(capacity),
            len: 0,
        }
    }

    /// Bytes the buffer can hold.
    pub fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// Bytes of memory behind the buffer now (grows with use, up to the
    /// capacity).
    pub fn allocated(&self) -> usize {
        self.ring.allocated()
    }

    /// Bytes held (sent-unacked plus unsent).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no byte is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Room left for [`write`](Self::write).
    pub fn free(&self) -> usize {
        self.capacity() - self.len
    }

    /// Append as much of `data` as fits; returns bytes taken (possibly 0).
    pub fn write(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.free());
        let n = self.ring.write(self.len, &data[..n]);
        self.len += n;
        n
    }

    /// Zero-copy append: `f` gets the free space that lies in one piece
    /// after the held bytes (empty when full; the rest of the free space,
    /// past the ring's wrap, comes in the next call) and returns how many
    /// bytes it wrote from the start, with a value of its own. Bytes past
    /// the slice's length are not taken.
    pub fn write_with<R>(&mut self, f: impl FnOnce(&mut [u8]) -> (usize, R)) -> (usize, R) {
        let free = self.free();
        let chunk = self.ring.chunk_mut(self.len, free);
        let max = chunk.len();
        let (n, r) = f(chunk);
        let n = n.min(max);
        self.len += n;
        (n, r)
    }

    /// Copy the bytes starting `offset` bytes after the first held byte into
    /// `dst`; returns bytes copied, `min(dst.len(), len - offset)`, and 0 when
    /// `offset >= len`.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> usize {
        let n = dst.len().min(self.len.saturating_sub(offset));
        if n == 0 {
            return 0;
        }
        self.ring.read(offset, &mut dst[..n])
    }

    /// [`read_at`](Self::read_at), also giving the one's-complement sum
    /// of the bytes copied (a `crate::wire::checksum::sum` accumulator).
    pub fn read_at_summed(&self, offset: usize, dst: &mut [u8]) -> (usize, u64) {
        let n = dst.len().min(self.len.saturating_sub(offset));
        if n == 0 {
            return (0, 0);
        }
        self.ring.read_summed(offset, &mut dst[..n])
    }

    /// Drop the first `n` bytes (acknowledged); `n` is clamped to
    /// [`len`](Self::len).
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.len);
        self.ring.advance(n);
        self.len -= n;
        if self.len == 0 {
            self.ring.rewind();
        }
    }
}

/// What [`RecvBuffer::write_at`] did with a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteOutcome {
    /// Bytes that became readable in order: how far rcv_nxt moves.
    pub advanced: usize,
    /// New bytes stored, in order or not (bytes already held and bytes
    /// trimmed at the window do not count).
    pub accepted: usize,
    /// The segment was out of order, touched no range already held, and
    /// holding it would have exceeded the range limit: nothing was stored.
    pub dropped: bool,
}

/// One out-of-order range, as offsets from rcv_nxt, and when it was last
/// touched by a segment (for the SACK block order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ooo {
    start: usize,
    end: usize,
    stamp: u64,
}

/// Received bytes: in-order data the app has not read, plus out-of-order data
/// held at its offset in the same ring, with the list of out-of-order ranges.
///
/// Offsets are relative to rcv_nxt, the next byte expected in order (the
/// first byte after the readable ones). The caller moves its rcv_nxt by
/// [`WriteOutcome::advanced`] after each [`write_at`](Self::write_at).
///
/// Out-of-order ranges are kept sorted, disjoint and never adjacent (touching
/// ranges merge), and there are at most `max_ranges` of them. They always lie
/// inside the window, so `readable + ooo_bytes <= capacity`.
#[derive(Debug)]
pub struct RecvBuffer {
    ring: Ring,
    readable: usize,
    /// Sorted by start, disjoint, separated by at least one missing byte, all
    /// starting after rcv_nxt (start >= 1) and ending within the window.
    ranges: Vec<Ooo>,
    max_ranges: usize,
    /// Sum of the ranges' lengths.
    ooo: usize,
    /// Stamp given to the range a segment last touched.
    clock: u64,
}

impl RecvBuffer {
    /// An empty buffer of `capacity` bytes holding at most `max_ranges`
    /// out-of-order ranges (memory for the bytes is allocated as they
    /// arrive, up to the capacity; the range list now).
    ///
    /// `max_ranges` is clamped to `capacity / 2`, the most disjoint,
    /// non-adjacent ranges a window of that size can hold. With
    /// `max_ranges == 0` every out-of-order segment is dropped.
    pub fn new(capacity: usize, max_ranges: usize) -> Self {
        let max_ranges = max_ranges.min(capacity / 2);
        RecvBuffer {
            ring: Ring::new(capacity),
            readable: 0,
            ranges: Vec::with_capacity(max_ranges),
            max_ranges,
            ooo: 0,
            clock: 0,
        }
    }

    /// Bytes the buffer can hold.
    pub fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// Bytes of memory behind the buffer now (grows with use, up to the
    /// capacity).
    pub fn allocated(&self) -> usize {
        self.ring.allocated()
    }

    /// Contiguous bytes ready for the app.
    pub fn readable(&self) -> usize {
        self.readable
    }

    /// `capacity - readable`: the receive window the connection may
    /// advertise. Out-of-order bytes sit inside this window, so they do not
    /// reduce it.
    pub fn window(&self) -> usize {
        self.capacity() - self.readable
    }

    /// Out-of-order bytes held (not yet readable).
    pub fn ooo_bytes(&self) -> usize {
        self.ooo
    }

    /// Out-of-order ranges held (at most the `max_ranges` given to
    /// [`new`](Self::new), after clamping).
    pub fn ooo_ranges(&self) -> usize {
        self.ranges.len()
    }

    /// Store a segment whose first byte is `offset` bytes after rcv_nxt.
    ///
    /// Bytes beyond the window (`offset + len > window()`) are trimmed; a
    /// segment starting at or past the window stores nothing. Bytes already
    /// held are ignored (first copy wins). In-order data (`offset == 0`)
    /// extends the readable bytes and merges every out-of-order range that
    /// became contiguous. An out-of-order segment that overlaps or touches a
    /// held range merges with it; one that touches none needs a new range,
    /// and is refused (`dropped`) when `max_ranges` are already held.
    ///
    /// Segments starting before rcv_nxt cannot be expressed: the caller trims
    /// what it already has before calling.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> WriteOutcome {
        let mut out = WriteOutcome::default();
        let window = self.window();
        if data.is_empty() || offset >= window {
            return out;
        }
        // offset < window, so neither sum overflows.
        let end = offset + data.len().min(window - offset);
        // Ranges overlapping or adjacent to [offset, end): [first, last).
        let first = self.ranges.partition_point(|r| r.end < offset);
        let last = self.ranges.partition_point(|r| r.start <= end);
        let touched = &self.ranges[first..last];
        if offset > 0 && touched.is_empty() && self.ranges.len() >= self.max_ranges {
            out.dropped = true;
            return out;
        }
        // Copy only the gaps between held ranges: first copy wins.
        let base = self.readable;
        let mut pos = offset;
        for r in touched {
            let gap_end = r.start.min(end);
            if gap_end > pos {
                out.accepted += self.ring.write(
                    base + pos,
                    data.get(pos - offset..gap_end - offset).unwrap_or_default(),
                );
            }
            pos = pos.max(r.end);
        }
        if end > pos {
            out.accepted += self.ring.write(
                base + pos,
                data.get(pos - offset..end - offset).unwrap_or_default(),
            );
        }
        let start = touched.first().map_or(offset, |r| r.start.min(offset));
        let merged_end = touched.last().map_or(end, |r| r.end.max(end));
        let held_before: usize = touched.iter().map(|r| r.end - r.start).sum();
        self.clock = self.clock.wrapping_add(1);
        if start == 0 {
            // In order: the merged block becomes readable, rcv_nxt moves past
            // it and every remaining range shifts down.
            self.ranges.drain(first..last);
            self.ooo -= held_before;
            self.readable += merged_end;
            out.advanced = merged_end;
            for r in &mut self.ranges {
                r.start -= merged_end;
                r.end -= merged_end;
            }
        } else {
            let merged = Ooo {
                start,
                end: merged_end,
                stamp: self.clock,
            };
            if first == last {
                // A new range; room was checked above, so no reallocation.
                self.ranges.insert(first, merged);
            } else {
                self.ranges[first] = merged;
                self.ranges.drain(first + 1..last);
            }
            self.ooo = self.ooo - held_before + (merged_end - start);
        }
        out
    }

    /// Grow the buffer to `capacity` bytes (autotuning), keeping every byte
    /// and out-of-order range; a smaller `capacity` changes nothing.
    pub fn grow(&mut self, capacity: usize) {
        self.ring.grow(capacity);
    }

    /// Copy up to `dst.len()` readable bytes out and keep them (a later
    /// read returns them again); returns bytes copied.
    pub fn peek(&self, dst: &mut [u8]) -> usize {
        let n = dst.len().min(self.readable);
        self.ring.read(0, &mut dst[..n])
    }

    /// Copy up to `dst.len()` readable bytes out and free them; returns bytes
    /// read.
    pub fn read(&mut self, dst: &mut [u8]) -> usize {
        let n = dst.len().min(self.readable);
        let n = self.ring.read(0, &mut dst[..n]);
        self.free_read(n);
        n
    }

    /// Free `n` bytes the app read, rewinding the ring when that empties it.
    fn free_read(&mut self, n: usize) {
        self.ring.advance(n);
        self.readable -= n;
        if self.readable == 0 && self.ranges.is_empty() {
            self.ring.rewind();
        }
    }

    /// Zero-copy read: `f` gets the readable bytes that lie in one piece
    /// from the first (the rest, past the ring's wrap, comes in the next
    /// call) and returns how many of them it consumed, with a value of its
    /// own; those are freed.
    pub fn read_with<R>(&mut self, f: impl FnOnce(&[u8]) -> (usize, R)) -> (usize, R) {
        let chunk = self.ring.chunk(0, self.readable);
        let max = chunk.len();
        let (n, r) = f(chunk);
        let n = n.min(max);
        self.free_read(n);
        (n, r)
    }

    /// Out-of-order ranges as `(start, end)` offsets from rcv_nxt, written
    /// into `out` (cleared first): the range holding the most recently
    /// received segment first, then the others, most recently updated first
    /// (RFC 2018 §4); at most `max` of them.
    ///
    /// Allocates nothing once `out` has room for `max` entries.
    pub fn sack_ranges(&self, out: &mut Vec<(usize, usize)>, max: usize) {
        out.clear();
        // Selection by descending stamp (stamps are distinct): O(max * ranges)
        // with both small, and no scratch space.
        let mut below: Option<u64> = None;
        while out.len() < max {
            let next = self
                .ranges
                .iter()
                .filter(|r| below.is_none_or(|b| r.stamp < b))
                .max_by_key(|r| r.stamp);
            let Some(r) = next else { break };
            out.push((r.start, r.end));
            below = Some(r.stamp);
        }
    }

    /// Drop all out-of-order data (memory pressure); returns bytes freed. The
    /// peer will send it again.
    pub fn drop_ooo(&mut self) -> usize {
        let n = self.ooo;
        self.ranges.clear();
        self.ooo = 0;
        n
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    proptest! {
        /// A summed read copies what `read_at` copies, and its sum is the
        /// checksum of those bytes as one run, wherever the ring wraps
        /// (odd pieces included).
        #[test]
        fn summed_reads_copy_and_sum_like_plain_ones(
            cap in 1usize..64,
            consumed in 0usize..200,
            fill in 0usize..64,
            offset in 0usize..70,
            want in 0usize..70,
        ) {
            let mut b = SendBuffer::new(cap);
            // Move the ring's head around so reads wrap at any place.
            let data = stream(consumed + fill);
            let mut k = 0;
            while k < consumed {
                let n = b.write(&data[k..consumed]);
                b.consume(n);
                k += n.max(1);
            }
            b.write(&data[consumed..]);
            let mut plain = vec![0xa5u8; want];
            let mut summed = vec![0xa5u8; want];
            let n = b.read_at(offset, &mut plain);
            let (m, sum) = b.read_at_summed(offset, &mut summed);
            prop_assert_eq!(n, m);
            prop_assert_eq!(&plain, &summed);
            prop_assert_eq!(checksum::fold(sum), checksum::fold(checksum::sum(0, &plain[..n])));
        }
    }

    /// A byte stream whose bytes differ from their neighbours and repeat only
    /// after a long period.
    fn stream(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 253) as u8).collect()
    }

    /// The ranges' invariants: sorted, disjoint, non-adjacent, after rcv_nxt,
    /// inside the window, bounded, and summing to `ooo_bytes`.
    fn check_ranges(r: &RecvBuffer) {
        let mut prev_end = 0;
        for x in &r.ranges {
            assert!(x.start > prev_end, "{:?}", r.ranges);
            assert!(x.end > x.start);
            prev_end = x.end;
        }
        assert!(prev_end <= r.window());
        assert!(r.ranges.len() <= r.max_ranges);
        let sum: usize = r.ranges.iter().map(|x| x.end - x.start).sum();
        assert_eq!(sum, r.ooo_bytes());
        assert!(r.readable() + r.ooo_bytes() <= r.capacity());
    }

    #[test]
    fn peek_copies_and_leaves_the_bytes_across_the_wrap() {
        let mut r = RecvBuffer::new(8, 2);
        r.write_at(0, b"abcdef");
        let mut out = [0u8; 6];
        assert_eq!(r.read(&mut out[..5]), 5);
        r.write_at(0, b"ghijk");
        let mut peeked = [0u8; 10];
        assert_eq!(r.peek(&mut peeked), 6);
        assert_eq!(&peeked[..6], b"fghijk");
        assert_eq!(r.readable(), 6);
        assert_eq!(r.read(&mut out), 6);
        assert_eq!(&out, b"fghijk");
        assert_eq!(r.peek(&mut peeked), 0);
    }

    #[test]
    fn zero_copy_write_and_read_come_in_pieces_around_the_wrap() {
        let mut s = SendBuffer::new(10);
        s.write(b"abcdefgh");
        s.consume(6);
        // Free: positions 8, 9 before the wrap, then 0..6.
        let (n, seen) = s.write_with(|b| {
            b.copy_from_slice(&b"ij"[..b.len()]);
            (b.len(), b.len())
        });
        assert_eq!((n, seen), (2, 2));
        // A closure that claims more than it was given is clamped.
        let (n, ()) = s.write_with(|b| {
            b[..3].copy_from_slice(b"klm");
            (99, ())
        });
        assert_eq!(n, 6);
        assert_eq!(s.len(), 10);
        assert_eq!(s.write_with(|b| (b.len(), ())).0, 0, "full: an empty slice");
        let mut out = [0u8; 5];
        assert_eq!(s.read_at(0, &mut out), 5);
        assert_eq!(&out, b"ghijk");

        let mut r = RecvBuffer::new(8, 2);
        r.write_at(0, b"abcdef");
        assert_eq!(r.read_with(|b| (b.len().min(5), ())).0, 5);
        r.write_at(0, b"ghijk");
        // Readable: "f", "g", "h" before the wrap, then "ijk".
        let (n, first) = r.read_with(|b| (1, b.to_vec()));
        assert_eq!((n, first.as_slice()), (1, &b"fgh"[..]));
        let (n, rest) = r.read_with(|b| (b.len(), b.to_vec()));
        assert_eq!((n, rest.as_slice()), (2, &b"gh"[..]));
        let (n, rest) = r.read_with(|b| (b.len(), b.to_vec()));
        assert_eq!((n, rest.as_slice()), (3, &b"ijk"[..]));
        assert_eq!(r.readable(), 0);
        assert_eq!(r.read_with(|b| (b.len() + 1, ())).0, 0);
    }

    #[test]
    fn send_write_read_consume_wraps() {
        let mut s = SendBuffer::new(10);
        assert_eq!(s.capacity(), 10);
        assert_eq!(s.write(b"abcdefgh"), 8);
        s.consume(6);
        assert_eq!(s.write(b"ijklmnopqrs"), 8);
        assert_eq!(s.len(), 10);
        assert_eq!(s.free(), 0);
        assert_eq!(s.write(b"x"), 0);
        let mut out = [0u8; 10];
        assert_eq!(s.read_at(0, &mut out), 10);
        assert_eq!(&out, b"ghijklmnop");
        let mut out = [0u8; 4];
        assert_eq!(s.read_at(3, &mut out), 4);
        assert_eq!(&out, b"jklm");
        assert_eq!(s.read_at(8, &mut out), 2);
        assert_eq!(&out[..2], b"op");
    }

    #[test]
    fn send_out_of_range_is_clamped() {
        let mut s = SendBuffer::new(8);
        s.write(b"abc");
        let mut out = [0u8; 8];
        assert_eq!(s.read_at(3, &mut out), 0);
        assert_eq!(s.read_at(usize::MAX, &mut out), 0);
        assert_eq!(s.read_at(1, &mut []), 0);
        s.consume(usize::MAX);
        assert!(s.is_empty());
        // Zero capacity: nothing fits, nothing breaks.
        let mut z = SendBuffer::new(0);
        assert_eq!(z.write(b"abc"), 0);
        assert_eq!(z.read_at(0, &mut out), 0);
        z.consume(5);
        assert_eq!((z.len(), z.free()), (0, 0));
    }

    #[test]
    fn recv_in_order_and_out_of_order() {
        let d = stream(100);
        let mut r = RecvBuffer::new(64, 4);
        let o = r.write_at(20, &d[20..30]);
        assert_eq!(
            o,
            WriteOutcome {
                advanced: 0,
                accepted: 10,
                dropped: false
            }
        );
        assert_eq!((r.ooo_bytes(), r.ooo_ranges(), r.readable()), (10, 1, 0));
        assert_eq!(r.window(), 64);
        let o = r.write_at(0, &d[0..20]);
        assert_eq!((o.advanced, o.accepted), (30, 20));
        assert_eq!((r.ooo_bytes(), r.ooo_ranges(), r.readable()), (0, 0, 30));
        assert_eq!(r.window(), 34);
        let mut out = vec![0u8; 40];
        assert_eq!(r.read(&mut out), 30);
        assert_eq!(&out[..30], &d[..30]);
        assert_eq!(r.window(), 64);
        check_ranges(&r);
    }

    #[test]
    fn drained_rings_start_again_at_their_first_byte() {
        let d = stream(200);
        let mut r = RecvBuffer::new(64, 4);
        let mut out = vec![0u8; 64];
        r.write_at(0, &d[..40]);
        assert_eq!(r.read(&mut out[..30]), 30);
        assert_eq!(r.ring.head, 30, "bytes still held: no rewind");
        // Out-of-order data held: no rewind either (its offset counts
        // from the head).
        r.write_at(20, &d[60..70]);
        assert_eq!(r.read(&mut out), 10);
        assert_eq!(r.ring.head, 40);
        r.write_at(0, &d[40..60]);
        assert_eq!(r.read_with(|b| (b.len(), ())).0, 24);
        assert_eq!(r.read(&mut out), 6);
        assert_eq!(&out[..6], &d[64..70]);
        assert_eq!(r.ring.head, 0, "drained: back to the first byte");
        r.write_at(0, &d[70..100]);
        assert_eq!(r.read(&mut out), 30);
        assert_eq!(&out[..30], &d[70..100]);

        let mut s = SendBuffer::new(64);
        s.write(&d[..50]);
        s.consume(20);
        assert_eq!(s.ring.head, 20);
        s.consume(30);
        assert_eq!(s.ring.head, 0, "all acknowledged: back to the first byte");
        s.write(&d[..10]);
        let mut back = [0u8; 10];
        assert_eq!(s.read_at(0, &mut back), 10);
        assert_eq!(&back, &d[..10]);
    }

    #[test]
    fn recv_merges_bridging_segment_and_shifts_ranges() {
        let d = stream(200);
        let mut r = RecvBuffer::new(200, 8);
        r.write_at(10, &d[10..20]);
        r.write_at(30, &d[30..40]);
        r.write_at(60, &d[60..70]);
        assert_eq!(r.ooo_ranges(), 3);
        // Bridges the first two ranges, overlapping both.
        let o = r.write_at(15, &d[15..35]);
        assert_eq!((o.advanced, o.accepted), (0, 10));
        assert_eq!(r.ooo_ranges(), 2);
        assert_eq!(r.ooo_bytes(), 40);
        // Adjacent (touching) data merges too.
        let o = r.write_at(40, &d[40..45]);
        assert_eq!(o.accepted, 5);
        assert_eq!(r.ooo_ranges(), 2);
        // Fill the head: [0, 45) becomes readable; [60, 70) shifts to [15, 25).
        let o = r.write_at(0, &d[0..10]);
        assert_eq!((o.advanced, o.accepted), (45, 10));
        let mut v = Vec::new();
        r.sack_ranges(&mut v, 4);
        assert_eq!(v, vec![(15, 25)]);
        check_ranges(&r);
        let mut out = vec![0u8; 45];
        assert_eq!(r.read(&mut out), 45);
        assert_eq!(out, &d[..45]);
    }

    #[test]
    fn recv_trims_to_window_and_first_copy_wins() {
        let mut r = RecvBuffer::new(16, 4);
        let o = r.write_at(4, &[1u8; 20]);
        assert_eq!(o.accepted, 12);
        let o = r.write_at(4, &[2u8; 4]);
        assert_eq!((o.accepted, o.advanced, o.dropped), (0, 0, false));
        let o = r.write_at(0, &[3u8; 8]);
        assert_eq!((o.advanced, o.accepted), (16, 4));
        assert_eq!(r.window(), 0);
        // A closed window takes nothing.
        assert_eq!(r.write_at(0, &[4u8; 4]), WriteOutcome::default());
        let mut out = [0u8; 16];
        assert_eq!(r.read(&mut out), 16);
        assert_eq!(&out[..4], &[3; 4]);
        assert_eq!(&out[4..], &[1; 12]);
    }

    #[test]
    fn recv_out_of_range_offsets_are_ignored() {
        let mut r = RecvBuffer::new(32, 4);
        assert_eq!(r.write_at(32, &[1; 4]), WriteOutcome::default());
        assert_eq!(r.write_at(usize::MAX, &[1; 4]), WriteOutcome::default());
        assert_eq!(r.write_at(usize::MAX - 1, &[]), WriteOutcome::default());
        let o = r.write_at(31, &[9; 15]);
        assert_eq!(o.accepted, 1);
        check_ranges(&r);
        let mut z = RecvBuffer::new(0, 4);
        assert_eq!(z.write_at(0, &[1; 4]), WriteOutcome::default());
        assert_eq!(z.read(&mut [0; 4]), 0);
        assert_eq!(z.window(), 0);
    }

    #[test]
    fn recv_ring_wraps_with_out_of_order_data() {
        let d = stream(1000);
        let mut r = RecvBuffer::new(100, 4);
        let mut out = vec![0u8; 100];
        // Move the ring start near its end.
        r.write_at(0, &d[0..90]);
        assert_eq!(r.read(&mut out[..90]), 90);
        // Out of order across the physical end of the ring, then the hole.
        r.write_at(20, &d[110..150]);
        let o = r.write_at(0, &d[90..110]);
        assert_eq!(o.advanced, 60);
        assert_eq!(r.read(&mut out), 60);
        assert_eq!(&out[..60], &d[90..150]);
    }

    #[test]
    fn recv_range_limit_drops_new_ranges_only() {
        let mut r = RecvBuffer::new(1000, 2);
        r.write_at(100, &[0; 10]);
        r.write_at(300, &[0; 10]);
        let o = r.write_at(500, &[0; 10]);
        assert_eq!(
            o,
            WriteOutcome {
                advanced: 0,
                accepted: 0,
                dropped: true
            }
        );
        // Touching a held range is still fine, and so is in-order data.
        assert!(!r.write_at(110, &[0; 10]).dropped);
        assert!(!r.write_at(290, &[0; 10]).dropped);
        assert_eq!(r.write_at(0, &[0; 10]).advanced, 10);
        assert_eq!(r.ooo_bytes(), 40);
        assert_eq!(r.drop_ooo(), 40);
        assert_eq!((r.ooo_bytes(), r.ooo_ranges()), (0, 0));
        assert_eq!(r.readable(), 10);
        // No ranges allowed: every out-of-order segment is dropped.
        let mut r = RecvBuffer::new(1000, 0);
        assert!(r.write_at(5, &[0; 10]).dropped);
        assert_eq!(r.write_at(0, &[0; 10]).advanced, 10);
    }

    #[test]
    fn sack_order_most_recent_first() {
        let mut r = RecvBuffer::new(1000, 8);
        r.write_at(100, &[0; 10]); // A
        r.write_at(300, &[0; 10]); // B
        r.write_at(500, &[0; 10]); // C
        let mut v = Vec::with_capacity(3);
        r.sack_ranges(&mut v, 3);
        assert_eq!(v, vec![(500, 510), (300, 310), (100, 110)]);
        // A duplicate inside A names A first: it holds the latest segment.
        r.write_at(102, &[0; 3]);
        r.sack_ranges(&mut v, 3);
        assert_eq!(v, vec![(100, 110), (500, 510), (300, 310)]);
        // Extending B moves it up; `max` bounds the count.
        r.write_at(310, &[0; 5]);
        r.sack_ranges(&mut v, 2);
        assert_eq!(v, vec![(300, 315), (100, 110)]);
        r.sack_ranges(&mut v, 0);
        assert!(v.is_empty());
        // In-order data reaching A makes A readable too; the others shift.
        assert_eq!(r.write_at(0, &[0; 100]).advanced, 110);
        r.sack_ranges(&mut v, 3);
        assert_eq!(v, vec![(190, 205), (390, 400)]);
    }

    #[test]
    fn memory_follows_the_bytes_not_the_capacity() {
        let mut s = SendBuffer::new(256 << 10);
        let mut r = RecvBuffer::new(256 << 10, 4);
        assert_eq!((s.allocated(), r.allocated()), (0, 0));
        assert_eq!(s.write(&[7; 100]), 100);
        assert_eq!(r.write_at(0, &[7; 100]).advanced, 100);
        assert_eq!(s.allocated(), FIRST_ALLOCATION.max(100).next_power_of_two());
        assert_eq!(r.allocated(), s.allocated());
        // Autotuning raises the capacity; memory waits for data.
        r.grow(4 << 20);
        assert_eq!(r.capacity(), 4 << 20);
        assert_eq!(r.allocated(), FIRST_ALLOCATION.max(100).next_power_of_two());
        // An out-of-order byte far into the window needs memory up to it.
        assert_eq!(r.write_at(100_000, &[9]).accepted, 1);
        assert!(r.allocated() > 100_100 && r.allocated() <= 4 << 20);
        // Growth keeps the held bytes, wrapped or not.
        let mut out = [0u8; 100];
        assert_eq!(r.read(&mut out), 100);
        assert_eq!(out, [7; 100]);
        let d = stream(300 << 10);
        let mut s = SendBuffer::new(256 << 10);
        let mut taken = s.write(&d[..1000]);
        s.consume(900);
        let mut acked = 900;
        while taken < d.len() && s.free() > 0 {
            taken += s.write(&d[taken..(taken + 5000).min(d.len())]);
        }
        assert_eq!(s.allocated(), 256 << 10);
        let mut back = vec![0u8; s.len()];
        assert_eq!(s.read_at(0, &mut back), s.len());
        assert_eq!(&back[..], &d[acked..taken]);
        acked += 1;
        s.consume(1);
        assert_eq!(s.read_at(0, &mut back[..10]), 10);
        assert_eq!(&back[..10], &d[acked..acked + 10]);
    }

    proptest! {
        #[test]
        fn recv_yields_exactly_the_stream_prefix(
            segs in proptest::collection::vec((0usize..3000, 1usize..400), 1..80),
            reads in proptest::collection::vec(0usize..500, 1..40),
            max_ranges in 0usize..6,
        ) {
            const CAP: usize = 1024;
            let d = stream(4000);
            let mut r = RecvBuffer::new(CAP, max_ranges);
            let mut nxt = 0usize;
            // Per-byte model of what is held out of order (absolute positions).
            let mut held = vec![false; d.len()];
            let mut got = Vec::new();
            let mut reads = reads.into_iter().cycle();
            for (start, len) in segs {
                let end = (start + len).min(d.len());
                // Trim what was already delivered, as a connection does.
                let s = start.max(nxt);
                if s >= end {
                    continue;
                }
                let win_end = nxt + r.window();
                let new_ooo_range = s > nxt
                    && !(s.saturating_sub(1)..(end + 1).min(d.len())).any(|i| held[i]);
                let runs = held.windows(2).filter(|w| !w[0] && w[1]).count()
                    + usize::from(held[0]);
                let want_drop = s < win_end && new_ooo_range && runs >= max_ranges.min(CAP / 2);
                let want_accepted = if want_drop {
                    0
                } else {
                    (s..end.min(win_end)).filter(|&i| !held[i]).count()
                };
                let o = r.write_at(s - nxt, &d[s..end]);
                prop_assert_eq!(o.dropped, want_drop);
                prop_assert_eq!(o.accepted, want_accepted);
                if !want_drop {
                    for h in held.iter_mut().take(end.min(win_end)).skip(s) {
                        *h = true;
                    }
                }
                // The model: bytes from nxt held contiguously become readable.
                let adv = held[nxt..].iter().take_while(|h| **h).count();
                prop_assert_eq!(o.advanced, adv);
                for h in held.iter_mut().skip(nxt).take(adv) {
                    *h = false;
                }
                nxt += adv;
                prop_assert_eq!(r.ooo_bytes(), held.iter().filter(|h| **h).count());
                check_ranges(&r);
                let mut buf = vec![0u8; reads.next().unwrap_or(1)];
                let n = r.read(&mut buf);
                got.extend_from_slice(&buf[..n]);
                prop_assert_eq!(r.window(), CAP - r.readable());
            }
            // Then the rest of the stream in order, the app reading everything.
            let mut buf = vec![0u8; CAP + 1];
            loop {
                let n = r.read(&mut buf);
                got.extend_from_slice(&buf[..n]);
                if nxt == d.len() {
                    break;
                }
                let end = (nxt + 100).min(d.len());
                let o = r.write_at(0, &d[nxt..end]);
                prop_assert!(o.advanced >= end - nxt);
                nxt += o.advanced;
                check_ranges(&r);
            }
            prop_assert_eq!(got.len(), nxt);
            prop_assert_eq!(&got[..], &d[..nxt]);
            prop_assert_eq!(nxt, d.len());
        }

        #[test]
        fn send_matches_a_vecdeque_model(
            ops in proptest::collection::vec((0u8..4, 0usize..300), 1..150),
        ) {
            let mut s = SendBuffer::new(256);
            let mut model = VecDeque::new();
            let mut k = 0u8;
            for (op, n) in ops {
                match op {
                    0 => {
                        let data: Vec<u8> = (0..n)
                            .map(|_| {
                                k = k.wrapping_add(1);
                                k
                            })
                            .collect();
                        let w = s.write(&data);
                        prop_assert_eq!(w, n.min(256 - model.len()));
                        model.extend(&data[..w]);
                    }
                    1 => {
                        s.consume(n);
                        model.drain(..n.min(model.len()));
                    }
                    2 => {
                        // Zero-copy: as much of n bytes as the piece takes.
                        let (w, ()) = s.write_with(|b| {
                            let w = b.len().min(n);
                            for x in &mut b[..w] {
                                k = k.wrapping_add(1);
                                *x = k;
                                model.push_back(k);
                            }
                            (w, ())
                        });
                        prop_assert!(w <= 256 - (model.len() - w));
                        prop_assert!(s.allocated() <= 256);
                    }
                    _ => {
                        let off = n % 270;
                        let mut buf = vec![0u8; 1 + n % 97];
                        let got = s.read_at(off, &mut buf);
                        let want: Vec<u8> =
                            model.iter().skip(off).take(buf.len()).copied().collect();
                        prop_assert_eq!(&buf[..got], &want[..]);
                    }
                }
                prop_assert_eq!(s.len(), model.len());
                prop_assert_eq!(s.free(), 256 - model.len());
                prop_assert_eq!(s.is_empty(), model.is_empty());
            }
        }
    }
}
