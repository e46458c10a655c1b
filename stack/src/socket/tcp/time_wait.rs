//! TIME-WAIT as a small record (RFC 9293 3.6.1), not a connection.
//!
//! A connection that reaches TIME-WAIT after the app released it keeps only
//! what TIME-WAIT needs: the two sequence numbers, the window it last
//! advertised, its timestamp clock and the peer's last timestamp, and when
//! it expires: a few dozen bytes in place of its buffers and TCB (Linux's
//! `tcp_timewait_sock` is about 200 bytes). The record answers a
//! retransmitted FIN (and restarts 2 MSL), answers other stray segments with
//! an ACK, ignores a RST (RFC 1337), and gives way to a SYN of a new
//! incarnation of the same 4-tuple whose timestamp, or without timestamps
//! whose sequence number, is newer than anything of the old one (RFC 6191,
//! RFC 1122 4.2.2.13; as Linux does). Without that, a client that reuses a
//! port (Linux picks ports pseudo-randomly, and a busy HTTP/1.0 server holds
//! thousands in TIME-WAIT) gets an ACK for its SYN, answers it with RST, and
//! retries until it gives up.

use std::collections::VecDeque;
use std::time::Duration;

use super::FlowKey;
use super::segment::{Header, Outgoing, Segment};
use super::seq::Seq;
use crate::time::Instant;

/// What TIME-WAIT keeps of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimeWait {
    /// Our next sequence number (after our FIN).
    pub snd_nxt: Seq,
    /// The peer's next sequence number (after its FIN).
    pub rcv_nxt: Seq,
    /// The window field the connection last sent.
    pub window: u16,
    /// With timestamps: our clock's offset and the peer's last TSval.
    pub ts: Option<(u32, u32)>,
    /// When the record goes (2 MSL after the last FIN).
    pub expires: Instant,
}

/// What a segment to a TIME-WAIT record calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TwAnswer {
    /// Send this ACK.
    Ack(Outgoing),
    /// A SYN of a new incarnation: forget the record and let the listener
    /// take the SYN.
    Reopen,
    /// Nothing to do (a RST, or an ACK of what we hold).
    Ignore,
}

impl TimeWait {
    /// A segment for the record's 4-tuple at `now`; `msl2` restarts the
    /// timer on a retransmitted FIN.
    pub fn on_segment(&mut self, now: Instant, seg: &Segment<'_>, msl2: Duration) -> TwAnswer {
        if seg.hdr.rst {
            // RFC 1337: a reset must not cut TIME-WAIT short.
            return TwAnswer::Ignore;
        }
        if seg.hdr.syn && seg.hdr.ack.is_none() {
            // RFC 6191: a newer timestamp; without timestamps on both
            // sides, a sequence number beyond the old one's (RFC 1122
            // 4.2.2.13).
            let newer = match (self.ts, seg.hdr.timestamp) {
                (Some((_, recent)), Some((tsval, _))) => (tsval.wrapping_sub(recent) as i32) > 0,
                _ => seg.hdr.seq.diff(self.rcv_nxt) > 0,
            };
            if newer {
                return TwAnswer::Reopen;
            }
            return TwAnswer::Ack(self.ack(now));
        }
        if seg.hdr.fin {
            // The peer did not hear our ACK of its FIN: again, and 2 MSL
            // from now.
            self.expires = now + msl2;
            return TwAnswer::Ack(self.ack(now));
        }
        if seg.is_empty() && seg.hdr.seq == self.rcv_nxt {
            // An empty ACK at the edge: nothing owed (answering it could
            // start an ACK loop).
            return TwAnswer::Ignore;
        }
        TwAnswer::Ack(self.ack(now))
    }

    /// The ACK the record sends.
    pub fn ack(&self, now: Instant) -> Outgoing {
        Outgoing::from(Header {
            seq: self.snd_nxt,
            ack: Some(self.rcv_nxt),
            window: self.window,
            timestamp: self
                .ts
                .map(|(offset, recent)| ((now.as_millis() as u32).wrapping_add(offset), recent)),
            ..Header::default()
        })
    }
}

/// The stack's TIME-WAIT records: looked up by 4-tuple, expired in the
/// order they were made (every record waits the same 2 MSL; a record whose
/// timer restarted is queued again when its first turn comes).
#[derive(Debug, Default)]
pub(crate) struct TimeWaitTable {
    records: foldhash::HashMap<FlowKey, TimeWait>,
    expiry: VecDeque<(Instant, FlowKey)>,
}

impl TimeWaitTable {
    /// Records held now.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether `key` is in TIME-WAIT.
    pub fn contains(&self, key: &FlowKey) -> bool {
        self.records.contains_key(key)
    }

    /// The record for `key`.
    pub fn get_mut(&mut self, key: &FlowKey) -> Option<&mut TimeWait> {
        self.records.get_mut(key)
    }

    /// Hold `tw` for `key` (replacing an older one).
    pub fn insert(&mut self, key: FlowKey, tw: TimeWait) {
        self.expiry.push_back((tw.expires, key));
        self.records.insert(key, tw);
    }

    /// Forget `key` (a new incarnation took the 4-tuple).
    pub fn remove(&mut self, key: &FlowKey) {
        self.records.remove(key);
    }

    /// The earliest expiry (perhaps of a record already gone or restarted:
    /// a wake-up that finds nothing due costs a queue pop).
    pub fn next_expiry(&self) -> Option<Instant> {
        self.expiry.front().map(|e| e.0)
    }

    /// Drop the records due at `now`; returns how many went.
    pub fn expire(&mut self, now: Instant) -> usize {
        let mut gone = 0;
        while let Some(&(at, key)) = self.expiry.front() {
            if at > now {
                break;
            }
            self.expiry.pop_front();
            match self.records.get(&key) {
                Some(tw) if tw.expires <= now => {
                    self.records.remove(&key);
                    gone += 1;
                }
                // Restarted: its turn comes again.
                Some(tw) => self.expiry.push_back((tw.expires, key)),
                None => {}
            }
        }
        if self.records.is_empty() && self.records.capacity() > 1024 {
            // Memory goes back after a burst of short connections.
            self.records.shrink_to_fit();
            self.expiry.shrink_to_fit();
        }
        gone
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use core::net::{Ipv4Addr, SocketAddr};

    const MSL2: Duration = Duration::from_secs(60);

    fn record(ts: Option<(u32, u32)>) -> TimeWait {
        TimeWait {
            snd_nxt: Seq(5000),
            rcv_nxt: Seq(9000),
            window: 512,
            ts,
            expires: Instant::from_secs(70),
        }
    }

    fn seg(hdr: Header) -> Segment<'static> {
        Segment::from(hdr)
    }

    #[test]
    fn a_newer_syn_reopens_an_older_gets_our_ack() {
        let now = Instant::from_secs(10);
        // With timestamps: the TSval decides (RFC 6191), whatever the ISN.
        let mut tw = record(Some((7, 1000)));
        let syn = |tsval, isn| {
            seg(Header {
                seq: Seq(isn),
                syn: true,
                timestamp: Some((tsval, 0)),
                ..Header::default()
            })
        };
        assert_eq!(tw.on_segment(now, &syn(1001, 1), MSL2), TwAnswer::Reopen);
        let TwAnswer::Ack(ack) = tw.on_segment(now, &syn(999, 20_000), MSL2) else {
            panic!("an old SYN gets the record's ACK");
        };
        assert_eq!(ack.hdr.seq, Seq(5000));
        assert_eq!(ack.hdr.ack, Some(Seq(9000)));
        assert_eq!(ack.hdr.window, 512);
        assert_eq!(ack.hdr.timestamp, Some((10_007, 1000)));
        // Without timestamps: the sequence number decides.
        let mut tw = record(None);
        let plain = |isn| {
            seg(Header {
                seq: Seq(isn),
                syn: true,
                ..Header::default()
            })
        };
        assert_eq!(tw.on_segment(now, &plain(9001), MSL2), TwAnswer::Reopen);
        assert!(matches!(
            tw.on_segment(now, &plain(8000), MSL2),
            TwAnswer::Ack(_)
        ));
    }

    #[test]
    fn a_fin_again_restarts_the_timer_a_reset_is_ignored() {
        let mut tw = record(None);
        let now = Instant::from_secs(30);
        let fin = seg(Header {
            seq: Seq(8999),
            ack: Some(Seq(5000)),
            fin: true,
            ..Header::default()
        });
        assert!(matches!(tw.on_segment(now, &fin, MSL2), TwAnswer::Ack(_)));
        assert_eq!(tw.expires, now + MSL2);
        let rst = seg(Header {
            seq: Seq(9000),
            rst: true,
            ..Header::default()
        });
        assert_eq!(tw.on_segment(now, &rst, MSL2), TwAnswer::Ignore);
        let ack = seg(Header {
            seq: Seq(9000),
            ack: Some(Seq(5000)),
            ..Header::default()
        });
        assert_eq!(tw.on_segment(now, &ack, MSL2), TwAnswer::Ignore);
    }

    #[test]
    fn records_expire_in_order_and_a_restarted_one_waits_its_new_time() {
        let key = |p| FlowKey {
            local_port: 80,
            remote: SocketAddr::new(Ipv4Addr::new(10, 0, 0, 2).into(), p),
        };
        let mut t = TimeWaitTable::default();
        for (p, at) in [(1, 60), (2, 61), (3, 62)] {
            t.insert(
                key(p),
                TimeWait {
                    expires: Instant::from_secs(at),
                    ..record(None)
                },
            );
        }
        t.get_mut(&key(1)).unwrap().expires = Instant::from_secs(100);
        assert_eq!(t.next_expiry(), Some(Instant::from_secs(60)));
        assert_eq!(t.expire(Instant::from_secs(61)), 1);
        assert!(t.contains(&key(1)) && !t.contains(&key(2)) && t.contains(&key(3)));
        assert_eq!(t.expire(Instant::from_secs(99)), 1);
        assert_eq!(t.len(), 1);
        assert_eq!(t.expire(Instant::from_secs(100)), 1);
        assert_eq!(t.len(), 0);
        assert_eq!(t.next_expiry(), None);
    }
}
