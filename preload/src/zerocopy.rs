//! `SO_ZEROCOPY` and `MSG_ZEROCOPY` as Linux's programs use them: every
//! send with `MSG_ZEROCOPY` on a socket that turned the option on gets
//! the next number (from 0), and once the stack is done with its bytes
//! (acknowledged by the peer, for TCP; sent, for UDP) a completion for
//! that number waits on the socket's error queue, where
//! `recvmsg(MSG_ERRQUEUE)` reads it as a `sock_extended_err` (origin
//! `SO_EE_ORIGIN_ZEROCOPY`, the range of numbers in `ee_info`..`ee_data`;
//! consecutive completions not yet read merge into one, as Linux's do).
//!
//! The layer copies the bytes into the stack's send buffer at the call,
//! so the caller may reuse its buffer at once; the completions say so
//! with `SO_EE_CODE_ZEROCOPY_COPIED`, which Linux also reports whenever
//! it copied (on loopback and most virtual links).

use std::collections::VecDeque;

/// `SO_EE_ORIGIN_ZEROCOPY`.
const ORIGIN_ZEROCOPY: u8 = 5;
/// `SO_EE_CODE_ZEROCOPY_COPIED`.
const CODE_COPIED: u8 = 1;

/// A socket's zero-copy sends and their completions.
#[derive(Debug, Default)]
pub struct ZeroCopy {
    /// `SO_ZEROCOPY` is on.
    pub on: bool,
    /// The next send's number (Linux's `sk_zckey`).
    next: u32,
    /// Sends the stack still holds: the connection's byte count their
    /// last byte ends at, and their number.
    waiting: VecDeque<(u64, u32)>,
    /// Completions not yet read: ranges of numbers, oldest first.
    done: VecDeque<(u32, u32)>,
}

impl ZeroCopy {
    /// A zero-copy send whose last byte is the connection's `end`th
    /// (`None`: a datagram, done at once).
    pub fn sent(&mut self, end: Option<u64>) {
        let id = self.next;
        self.next = self.next.wrapping_add(1);
        match end {
            Some(end) => self.waiting.push_back((end, id)),
            None => self.complete(id),
        }
    }

    /// The peer acknowledged `acked` bytes of the connection (all of them
    /// when `ended`: a closed connection holds no buffers).
    pub fn acked(&mut self, acked: u64, ended: bool) {
        while let Some(&(end, id)) = self.waiting.front() {
            if end > acked && !ended {
                break;
            }
            self.waiting.pop_front();
            self.complete(id);
        }
    }

    /// Whether sends wait for their acknowledgment.
    pub fn waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    fn complete(&mut self, id: u32) {
        match self.done.back_mut() {
            Some(last) if last.1.wrapping_add(1) == id => last.1 = id,
            _ => self.done.push_back((id, id)),
        }
    }

    /// Whether a completion waits to be read (`POLLERR`).
    pub fn pending(&self) -> bool {
        !self.done.is_empty()
    }

    /// The oldest completion, as the bytes of a `sock_extended_err`.
    pub fn take(&mut self) -> Option<[u8; 16]> {
        let (lo, hi) = self.done.pop_front()?;
        let mut e = [0u8; 16];
        // ee_errno (u32) 0, ee_origin, ee_type 0, ee_code, ee_pad,
        // ee_info (u32), ee_data (u32).
        e[4] = ORIGIN_ZEROCOPY;
        e[6] = CODE_COPIED;
        e[8..12].copy_from_slice(&lo.to_ne_bytes());
        e[12..16].copy_from_slice(&hi.to_ne_bytes());
        Some(e)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    fn range(e: [u8; 16]) -> (u32, u32) {
        let w = |i: usize| u32::from_ne_bytes(e[i..i + 4].try_into().unwrap());
        assert_eq!((e[4], e[6]), (ORIGIN_ZEROCOPY, CODE_COPIED));
        (w(8), w(12))
    }

    #[test]
    fn completions_follow_acknowledgments_and_merge_while_unread() {
        let mut z = ZeroCopy::default();
        z.sent(Some(4000));
        z.sent(Some(8000));
        z.acked(3999, false);
        assert!(!z.pending());
        z.acked(8000, false);
        assert_eq!(z.take().map(range), Some((0, 1)));
        assert_eq!(z.take(), None);
        z.sent(Some(8001));
        z.acked(8001, false);
        assert_eq!(z.take().map(range), Some((2, 2)));
        // Read in between: separate completions.
        z.sent(None);
        assert_eq!(z.take().map(range), Some((3, 3)));
        z.sent(Some(9000));
        z.sent(Some(9500));
        z.acked(9000, false);
        assert_eq!(z.take().map(range), Some((4, 4)));
        z.acked(9000, true);
        assert_eq!(z.take().map(range), Some((5, 5)));
        assert!(!z.waiting());
    }
}
