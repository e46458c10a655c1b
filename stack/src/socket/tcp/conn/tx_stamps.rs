//! Transmit timestamps of a connection (what Linux's `SO_TIMESTAMPING`
//! reports for TCP): the app asks for the last byte queued so far to be
//! stamped when it first leaves (`Sent`: Linux's `SCM_TSTAMP_SCHED` and
//! `SCM_TSTAMP_SND`, both at the handover to the port here) and when the
//! peer acknowledges it (`Acked`: `SCM_TSTAMP_ACK`). Each stamp carries
//! the app's key and the time it happened; the app drains them.
//!
//! Bounded as a socket's error queue is: at most [`MAX_STAMPS`] requests
//! wait and at most as many stamps are kept (the oldest give way).

use std::collections::VecDeque;

use crate::socket::tcp::seq::Seq;
use crate::time::Instant;

/// Most requests waiting, and most stamps kept unread, per connection.
pub const MAX_STAMPS: usize = 4096;

/// What a transmit timestamp records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxStampKind {
    /// The byte's first transmission left for the port.
    Sent,
    /// The peer acknowledged the byte (cumulatively).
    Acked,
}

/// One transmit timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxStamp {
    /// The app's key for the byte (Linux's `ee_data`).
    pub key: u32,
    /// What happened to it.
    pub kind: TxStampKind,
    /// When.
    pub at: Instant,
}

/// A byte waiting for its stamps.
#[derive(Debug, Clone, Copy)]
struct Request {
    /// The byte's sequence number.
    seq: Seq,
    key: u32,
    /// Stamp its first transmission (not yet done).
    sent: bool,
    /// Stamp its acknowledgment.
    acked: bool,
}

/// A connection's requests and the stamps not yet read.
#[derive(Debug, Default)]
pub(super) struct TxStamps {
    /// In the order of their bytes.
    waiting: VecDeque<Request>,
    /// How many of the first requests are past their first transmission
    /// (waiting for the acknowledgment only): a send looks from here.
    unsent: usize,
    ready: VecDeque<TxStamp>,
}

impl TxStamps {
    /// Stamp byte `seq` (key `key`): when it first leaves (`sent`), when
    /// it is acknowledged (`acked`). `nxt` and `una` say where the
    /// connection is: a byte already sent is stamped `now`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn request(
        &mut self,
        now: Instant,
        seq: Seq,
        key: u32,
        sent: bool,
        acked: bool,
        nxt: Seq,
        una: Seq,
    ) {
        if !sent && !acked {
            return;
        }
        if self.waiting.len() >= MAX_STAMPS {
            self.pop_front();
        }
        self.waiting.push_back(Request {
            seq,
            key,
            sent,
            acked,
        });
        self.on_sent(now, nxt);
        self.on_acked(now, una);
    }

    /// The bytes before `nxt` have left: stamp those waiting for it.
    pub(super) fn on_sent(&mut self, now: Instant, nxt: Seq) {
        while let Some(r) = self.waiting.get_mut(self.unsent) {
            if r.seq.diff(nxt) >= 0 {
                break;
            }
            if std::mem::take(&mut r.sent) {
                push(&mut self.ready, r.key, TxStampKind::Sent, now);
            }
            self.unsent += 1;
        }
        while self.waiting.front().is_some_and(|r| !r.sent && !r.acked) {
            self.pop_front();
        }
    }

    /// The bytes before `una` are acknowledged: stamp those waiting for it
    /// (and, for a byte never stamped as sent, that first).
    pub(super) fn on_acked(&mut self, now: Instant, una: Seq) {
        while let Some(r) = self.waiting.front().copied() {
            if r.seq.diff(una) >= 0 {
                break;
            }
            self.pop_front();
            if r.sent {
                push(&mut self.ready, r.key, TxStampKind::Sent, now);
            }
            if r.acked {
                push(&mut self.ready, r.key, TxStampKind::Acked, now);
            }
        }
    }

    fn pop_front(&mut self) {
        self.waiting.pop_front();
        self.unsent = self.unsent.saturating_sub(1);
    }

    /// The stamps not yet read, oldest first.
    pub(super) fn take(&mut self) -> Vec<TxStamp> {
        self.ready.drain(..).collect()
    }
}

fn push(ready: &mut VecDeque<TxStamp>, key: u32, kind: TxStampKind, at: Instant) {
    if ready.len() >= MAX_STAMPS {
        ready.pop_front();
    }
    ready.push_back(TxStamp { key, kind, at });
}

#[cfg(test)]
mod test {
    use super::*;

    fn t(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    #[test]
    fn the_last_byte_is_stamped_when_it_leaves_and_when_it_is_acked() {
        let mut s = TxStamps::default();
        // Bytes 1..=2000 queued, none sent.
        s.request(t(10), Seq(2000), 1999, true, true, Seq(1), Seq(1));
        s.request(t(10), Seq(4000), 3999, true, true, Seq(1), Seq(1));
        assert!(s.ready.is_empty());
        s.on_sent(t(11), Seq(2001));
        s.on_sent(t(12), Seq(4001));
        s.on_acked(t(20), Seq(2001));
        s.on_acked(t(30), Seq(4001));
        let kinds: Vec<_> = s.take().iter().map(|x| (x.key, x.kind, x.at)).collect();
        assert_eq!(
            kinds,
            vec![
                (1999, TxStampKind::Sent, t(11)),
                (3999, TxStampKind::Sent, t(12)),
                (1999, TxStampKind::Acked, t(20)),
                (3999, TxStampKind::Acked, t(30)),
            ]
        );
        assert!(s.ready.is_empty());
    }

    #[test]
    fn only_what_was_asked_and_bounded() {
        let mut s = TxStamps::default();
        s.request(t(1), Seq(10), 9, false, true, Seq(1), Seq(1));
        s.on_sent(t(2), Seq(11));
        s.on_acked(t(3), Seq(11));
        assert_eq!(s.take().len(), 1);
        for i in 0..2 * MAX_STAMPS as u32 {
            s.request(t(4), Seq(100 + i), i, true, false, Seq(10_000), Seq(1));
        }
        assert_eq!(s.take().len(), MAX_STAMPS);
        assert!(s.waiting.len() <= MAX_STAMPS);
    }
}
