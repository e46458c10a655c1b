//! TCP send and receive rings.
//!
//! Both are allocated once and never grow. [`RecvBuffer`] keeps out-of-order
//! data in place (at its offset in the same ring) and a short list of the
//! ranges it holds, from which SACK blocks are built.

/// Copy `src` into the ring at logical position `pos` (from the ring's start `head`).
fn ring_write(ring: &mut [u8], head: usize, pos: usize, src: &[u8]) {
    let cap = ring.len();
    if cap == 0 || src.is_empty() {
        return;
    }
    let at = (head + pos) % cap;
    let first = src.len().min(cap - at);
    ring[at..at + first].copy_from_slice(&src[..first]);
    let rest = src.len() - first;
    ring[..rest].copy_from_slice(&src[first..]);
}

/// Copy from the ring at logical position `pos` into `dst`.
fn ring_read(ring: &[u8], head: usize, pos: usize, dst: &mut [u8]) {
    let cap = ring.len();
    if cap == 0 || dst.is_empty() {
        return;
    }
    let at = (head + pos) % cap;
    let first = dst.len().min(cap - at);
    dst[..first].copy_from_slice(&ring[at..at + first]);
    let rest = dst.len() - first;
    dst[first..].copy_from_slice(&ring[..rest]);
}

/// Bytes the app wrote that the peer has not acknowledged.
#[derive(Debug)]
pub struct SendBuffer {
    ring: Box<[u8]>,
    head: usize,
    len: usize,
}

impl SendBuffer {
    pub fn new(capacity: usize) -> Self {
        SendBuffer {
            ring: vec![0; capacity].into_boxed_slice(),
            head: 0,
            len: 0,
        }
    }
    pub fn capacity(&self) -> usize {
        self.ring.len()
    }
    /// Bytes held (sent-unacked plus unsent).
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn free(&self) -> usize {
        self.ring.len() - self.len
    }
    /// Append as much of `data` as fits; returns bytes taken.
    pub fn write(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.free());
        ring_write(&mut self.ring, self.head, self.len, &data[..n]);
        self.len += n;
        n
    }
    /// Copy bytes from `offset` after the first held byte into `dst`; returns bytes copied.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> usize {
        let n = dst.len().min(self.len.saturating_sub(offset));
        ring_read(&self.ring, self.head, offset, &mut dst[..n]);
        n
    }
    /// Drop the first `n` bytes (acknowledged); clamped to what is held.
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.len);
        if self.ring.is_empty() {
            return;
        }
        self.head = (self.head + n) % self.ring.len();
        self.len -= n;
    }
}

/// What [`RecvBuffer::write_at`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteOutcome {
    /// Bytes that became readable in order: how far rcv_nxt moves.
    pub advanced: usize,
    /// New bytes stored (in order or not).
    pub accepted: usize,
    /// An out-of-order segment refused because the range list is full.
    pub dropped: bool,
}

/// One out-of-order range, offsets relative to rcv_nxt, with the time it was last extended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    start: usize,
    end: usize,
    stamp: u64,
}

/// Received bytes not yet read, and out-of-order bytes held at their offset.
#[derive(Debug)]
pub struct RecvBuffer {
    ring: Box<[u8]>,
    head: usize,
    readable: usize,
    /// Sorted, disjoint, non-adjacent.
    ranges: Vec<Range>,
    max_ranges: usize,
    clock: u64,
}

impl RecvBuffer {
    pub fn new(capacity: usize, max_ranges: usize) -> Self {
        RecvBuffer {
            ring: vec![0; capacity].into_boxed_slice(),
            head: 0,
            readable: 0,
            ranges: Vec::with_capacity(max_ranges + 1),
            max_ranges: max_ranges.max(1),
            clock: 0,
        }
    }
    pub fn capacity(&self) -> usize {
        self.ring.len()
    }
    /// Contiguous bytes ready for the app.
    pub fn readable(&self) -> usize {
        self.readable
    }
    /// Room from rcv_nxt to the end of the ring: the window to advertise.
    pub fn window(&self) -> usize {
        self.ring.len() - self.readable
    }
    pub fn ooo_bytes(&self) -> usize {
        self.ranges.iter().map(|r| r.end - r.start).sum()
    }

    /// Out-of-order ranges held.
    pub fn ooo_ranges(&self) -> usize {
        self.ranges.len()
    }

    /// Store a segment whose first byte is `offset` bytes after rcv_nxt.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> WriteOutcome {
        let mut out = WriteOutcome::default();
        let limit = self.window();
        let end = offset.saturating_add(data.len()).min(limit);
        if offset >= end {
            return out;
        }
        // Merge with every range this one touches (overlap or adjacency).
        let first = self.ranges.partition_point(|r| r.end < offset);
        let last = self.ranges.partition_point(|r| r.start <= end);
        let touches = last - first;
        if offset > 0 && touches == 0 && self.ranges.len() >= self.max_ranges {
            out.dropped = true;
            return out;
        }
        // Copy only the gaps: bytes already held keep their first copy.
        let base = self.readable;
        let mut pos = offset;
        for r in &self.ranges[first..last] {
            if r.start > pos {
                let gap = &data[pos - offset..r.start.min(end) - offset];
                ring_write(&mut self.ring, self.head, base + pos, gap);
                out.accepted += gap.len();
            }
            pos = pos.max(r.end);
        }
        if pos < end {
            ring_write(
                &mut self.ring,
                self.head,
                base + pos,
                &data[pos - offset..end - offset],
            );
            out.accepted += end - pos;
        }
        self.clock += 1;
        let merged = Range {
            start: self.ranges[first..last]
                .first()
                .map_or(offset, |r| r.start.min(offset)),
            end: self.ranges[first..last]
                .last()
                .map_or(end, |r| r.end.max(end)),
            stamp: self.clock,
        };
        self.ranges.splice(first..last, std::iter::once(merged));
        // In order now? Then the first range becomes readable.
        if self.ranges.first().is_some_and(|r| r.start == 0) {
            let r = self.ranges.remove(0);
            out.advanced = r.end;
            self.readable += r.end;
            for x in &mut self.ranges {
                x.start -= r.end;
                x.end -= r.end;
            }
        }
        out
    }

    /// Copy readable bytes out and free them.
    pub fn read(&mut self, dst: &mut [u8]) -> usize {
        let n = dst.len().min(self.readable);
        ring_read(&self.ring, self.head, 0, &mut dst[..n]);
        if !self.ring.is_empty() {
            self.head = (self.head + n) % self.ring.len();
        }
        self.readable -= n;
        n
    }

    /// Out-of-order ranges (offsets from rcv_nxt), most recently updated
    /// first, at most `max`. Allocation-free: picks by descending stamp.
    pub fn sack_ranges(&self, out: &mut Vec<(usize, usize)>, max: usize) {
        out.clear();
        let mut below = u64::MAX;
        for _ in 0..max {
            let Some(r) = self
                .ranges
                .iter()
                .filter(|r| r.stamp < below)
                .max_by_key(|r| r.stamp)
            else {
                break;
            };
            out.push((r.start, r.end));
            below = r.stamp;
        }
    }

    /// Forget out-of-order data (memory pressure); returns bytes freed.
    pub fn drop_ooo(&mut self) -> usize {
        let n = self.ooo_bytes();
        self.ranges.clear();
        n
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;

    fn stream(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 + i / 251) as u8).collect()
    }

    #[test]
    fn send_ring_wraps() {
        let mut s = SendBuffer::new(10);
        assert_eq!(s.write(b"abcdefgh"), 8);
        s.consume(6);
        assert_eq!(s.write(b"ijklmnop"), 8);
        assert_eq!(s.len(), 10);
        let mut out = [0u8; 10];
        assert_eq!(s.read_at(0, &mut out), 10);
        assert_eq!(&out, b"ghijklmnop");
        assert_eq!(s.read_at(8, &mut out), 2);
        assert_eq!(s.read_at(11, &mut out), 0);
        s.consume(100);
        assert!(s.is_empty());
    }

    #[test]
    fn in_order_and_out_of_order() {
        let d = stream(100);
        let mut r = RecvBuffer::new(64, 4);
        let o = r.write_at(20, &d[20..30]);
        assert_eq!((o.advanced, o.accepted), (0, 10));
        assert_eq!(r.ooo_bytes(), 10);
        let o = r.write_at(0, &d[0..20]);
        assert_eq!(o.advanced, 30);
        assert_eq!(r.ooo_bytes(), 0);
        let mut out = vec![0u8; 30];
        assert_eq!(r.read(&mut out), 30);
        assert_eq!(out, &d[..30]);
    }

    #[test]
    fn trims_to_window_and_first_copy_wins() {
        let mut r = RecvBuffer::new(16, 4);
        let o = r.write_at(4, &[1u8; 20]);
        assert_eq!(o.accepted, 12);
        let o = r.write_at(4, &[2u8; 4]);
        assert_eq!(o.accepted, 0);
        let o = r.write_at(0, &[3u8; 8]);
        assert_eq!(o.advanced, 16);
        let mut out = [0u8; 16];
        r.read(&mut out);
        assert_eq!(&out[..4], &[3; 4]);
        assert_eq!(&out[4..], &[1; 12]);
    }

    #[test]
    fn sack_order_and_range_limit() {
        let mut r = RecvBuffer::new(1000, 2);
        r.write_at(100, &[0; 10]);
        r.write_at(300, &[0; 10]);
        let o = r.write_at(500, &[0; 10]);
        assert!(o.dropped);
        r.write_at(110, &[0; 10]);
        let mut v = Vec::new();
        r.sack_ranges(&mut v, 3);
        assert_eq!(v, vec![(100, 120), (300, 310)]);
        assert_eq!(r.drop_ooo(), 30);
    }

    proptest! {
        #[test]
        fn receive_reassembles_any_order(
            segs in proptest::collection::vec((0usize..3000, 1usize..400), 1..80),
            reads in proptest::collection::vec(1usize..500, 1..40),
        ) {
            let d = stream(4000);
            let mut r = RecvBuffer::new(1024, 8);
            let mut nxt = 0usize;
            let mut got = Vec::new();
            let mut reads = reads.into_iter().cycle();
            for (start, len) in segs.into_iter().chain((0..40).map(|i| (i * 100, 100))) {
                let end = (start + len).min(d.len());
                if start >= end { continue; }
                // Segments may lie before rcv_nxt: trim as a connection would.
                let s = start.max(nxt);
                if s >= end { continue; }
                let o = r.write_at(s - nxt, &d[s..end]);
                nxt += o.advanced;
                prop_assert!(r.readable() + r.ooo_bytes() <= r.capacity());
                let mut buf = vec![0u8; reads.next().unwrap_or(1)];
                let n = r.read(&mut buf);
                got.extend_from_slice(&buf[..n]);
            }
            let mut buf = vec![0u8; 4096];
            let n = r.read(&mut buf);
            got.extend_from_slice(&buf[..n]);
            prop_assert_eq!(&got[..], &d[..got.len()]);
            prop_assert_eq!(got.len(), nxt);
        }

        #[test]
        fn send_matches_model(ops in proptest::collection::vec((0u8..3, 0usize..300), 1..100)) {
            let mut s = SendBuffer::new(256);
            let mut model = std::collections::VecDeque::new();
            let mut k = 0u8;
            for (op, n) in ops {
                match op {
                    0 => {
                        let data: Vec<u8> = (0..n).map(|_| { k = k.wrapping_add(1); k }).collect();
                        let w = s.write(&data);
                        model.extend(&data[..w]);
                    }
                    1 => { s.consume(n); for _ in 0..n.min(model.len()) { model.pop_front(); } }
                    _ => {
                        let mut buf = vec![0u8; 64];
                        let got = s.read_at(n % 257, &mut buf);
                        let want: Vec<u8> = model.iter().skip(n % 257).take(64).copied().collect();
                        prop_assert_eq!(&buf[..got], &want[..]);
                    }
                }
                prop_assert_eq!(s.len(), model.len());
            }
        }
    }
}
