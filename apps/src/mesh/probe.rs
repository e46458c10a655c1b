//! What every probe kind of the mesh provides ([`Prober`]), and what the
//! kinds share: the series view they settle answers on ([`Series`]), the
//! probes in flight ([`InFlight`]) and the UDP/TCP probe message.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::time::Duration;

use ustack::node::RxWait;
use ustack::{Instant, Stack};

use super::{MeshConfig, Probe, TargetStats};

/// One probe kind of the mesh (icmp, udp, ud, tcp): its socket, its
/// probes in flight, and how it sends, receives and gives up. The
/// [`MeshPinger`](super::MeshPinger) drives every kind through it.
pub(crate) trait Prober: std::fmt::Debug {
    /// The kind, as the ping list names it.
    fn kind(&self) -> Probe;
    /// Open the socket (or QP) if it is not open yet.
    fn open(&mut self, cfg: &MeshConfig, stack: &mut Stack) -> Result<(), String>;
    /// Close it, and any connection of the series.
    fn close(&mut self, now: Instant, stack: &mut Stack, series: &mut Series<'_>);
    /// Take the answers that came (TCP: connection progress too).
    fn receive(&mut self, now: Instant, stack: &mut Stack, series: &mut Series<'_>);
    /// Send one probe of series `i`.
    fn send(
        &mut self,
        i: usize,
        now: Instant,
        stack: &mut Stack,
        series: &mut Series<'_>,
        ctx: &mut SendCtx<'_>,
    );
    /// Probes whose wait ran out are lost.
    fn expire(&mut self, now: Instant, stack: &mut Stack, series: &mut Series<'_>) {
        let _ = stack;
        self.in_flight()
            .expire(now, |id| series.lose(id, "timeout"));
    }
    /// The ping list changed; `gone` are the series that stopped.
    fn list_changed(&mut self, stack: &mut Stack, gone: &[TargetStats], series: &mut Series<'_>) {
        let _ = (stack, gone, series);
    }
    /// The probes waiting for answers.
    fn in_flight(&mut self) -> &mut InFlight;
    /// Nothing is awaited any more.
    fn settled(&self, stats: &[TargetStats]) -> bool;
    /// The next deadline of a probe (or connect) in flight.
    fn next_deadline(&self, stats: &[TargetStats]) -> Option<Instant>;
    /// How the loop should read frames for this kind's answers.
    fn rx_wait(&self, stats: &[TargetStats]) -> RxWait;
}

/// What a send needs besides the series.
#[derive(Debug)]
pub(crate) struct SendCtx<'a> {
    pub(crate) cfg: &'a MeshConfig,
    /// When the probe is lost.
    pub(crate) deadline: Instant,
    /// UD, UDP and TCP message sequence numbers (one run for the three).
    pub(crate) next_key: &'a mut u64,
}

/// The series as the probers see them: in ping-list order, and their
/// positions by id.
#[derive(Debug)]
pub(crate) struct Series<'a> {
    pub(crate) stats: &'a mut [TargetStats],
    pub(crate) index: &'a HashMap<u64, usize>,
}

impl Series<'_> {
    pub(crate) fn by_id(&mut self, id: u64) -> Option<&mut TargetStats> {
        let i = *self.index.get(&id)?;
        self.stats.get_mut(i)
    }

    /// Whether series `id` probes `ok`'s target.
    pub(crate) fn is(&self, id: u64, ok: impl FnOnce(&TargetStats) -> bool) -> bool {
        self.index.get(&id).is_some_and(|&i| ok(&self.stats[i]))
    }

    /// Series `id` lost a probe for `why`.
    pub(crate) fn lose(&mut self, id: u64, why: &str) {
        if let Some(s) = self.by_id(id) {
            s.lose(Some(why));
        }
    }

    /// An answer: to the probe `id` it matched (its RTT recorded), or,
    /// matching none in flight, a duplicate or late one counted on the
    /// `probe` series of the target it came from.
    pub(crate) fn settle(
        &mut self,
        id: Option<u64>,
        probe: Probe,
        from: IpAddr,
        rtt: impl FnOnce() -> Duration,
    ) {
        match id {
            Some(id) => {
                let rtt = rtt();
                if let Some(s) = self.by_id(id) {
                    s.answered(rtt);
                }
            }
            None => {
                if let Some(s) = self
                    .stats
                    .iter_mut()
                    .find(|s| s.probe == probe && s.target.addr == from)
                {
                    s.duplicates += 1;
                }
            }
        }
    }
}

/// The wait of a kind whose answers are timed by the port's receive
/// stamp (ICMP, UD): they may wait in a port that stamps frames.
pub(crate) fn stamped_wait(f: &InFlight) -> RxWait {
    if f.map.is_empty() {
        RxWait::Nothing
    } else {
        RxWait::Stamped
    }
}

/// Probes waiting for answers, by key (an ICMP sequence, or a UD, UDP or
/// TCP message's sequence), each with its series and deadline.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    pub(crate) map: HashMap<u64, (u64, Instant)>,
    /// Keys in send order (deadlines ascending); answered ones stay until
    /// those before them are answered or expire.
    order: VecDeque<(u64, u64, Instant)>,
}

impl InFlight {
    /// Track `key`; the series of a probe it replaces (a wrapped ICMP sequence).
    pub(crate) fn insert(&mut self, key: u64, id: u64, deadline: Instant) -> Option<u64> {
        self.order.push_back((key, id, deadline));
        self.map.insert(key, (id, deadline)).map(|(old, _)| old)
    }

    /// The series `key` was sent for, removing it, if `ok` accepts it.
    pub(crate) fn take(&mut self, key: u64, ok: impl FnOnce(u64) -> bool) -> Option<u64> {
        match self.map.get(&key) {
            Some(&(id, _)) if ok(id) => {
                self.map.remove(&key);
                self.prune();
                Some(id)
            }
            _ => None,
        }
    }

    /// Forget answered probes at the front of the send order, so the next
    /// deadline is an unanswered probe's (answers mostly come in order:
    /// the loop does not wake for the deadlines of probes long answered).
    fn prune(&mut self) {
        while let Some(&(key, id, deadline)) = self.order.front() {
            if self.map.get(&key) == Some(&(id, deadline)) {
                break;
            }
            self.order.pop_front();
        }
    }

    /// Remove the probes whose deadline passed, calling `lost` with each one's series.
    pub(crate) fn expire(&mut self, now: Instant, mut lost: impl FnMut(u64)) {
        while let Some(&(key, id, deadline)) = self.order.front() {
            if deadline > now {
                break;
            }
            self.order.pop_front();
            if self.map.get(&key) == Some(&(id, deadline)) {
                self.map.remove(&key);
                lost(id);
            }
        }
        self.prune();
    }

    /// Remove every probe of series `id`; how many there were.
    pub(crate) fn drop_series(&mut self, id: u64) -> u64 {
        let before = self.map.len();
        self.map.retain(|_, (s, _)| *s != id);
        self.prune();
        (before - self.map.len()) as u64
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.order.front().map(|e| e.2)
    }
}

/// UDP and TCP probe messages: `"UMSH" | 4 zero | seq u64 | send time u64`
/// (big-endian, engine nanoseconds), then filler.
pub(crate) const MSG_LEN: usize = 24;
const MSG_MAGIC: &[u8; 4] = b"UMSH";

pub(crate) fn write_msg(buf: &mut [u8], seq: u64, now: Instant) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = i as u8;
    }
    buf[..4].copy_from_slice(MSG_MAGIC);
    buf[4..8].fill(0);
    buf[8..16].copy_from_slice(&seq.to_be_bytes());
    buf[16..24].copy_from_slice(&now.as_nanos().to_be_bytes());
}

pub(crate) fn be64(p: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&p[at..at + 8]);
    u64::from_be_bytes(b)
}

/// (seq, send time) of an echoed probe message.
pub(crate) fn read_msg(p: &[u8]) -> Option<(u64, u64)> {
    (p.len() >= MSG_LEN && &p[..4] == MSG_MAGIC).then(|| (be64(p, 8), be64(p, 16)))
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::mesh::ud::{read_ud_pong, write_ud_ping};

    fn at(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    #[test]
    fn inflight_expiry_counts_only_unanswered() {
        let mut f = InFlight::default();
        assert_eq!(f.insert(1, 10, at(100)), None);
        assert_eq!(f.insert(2, 11, at(110)), None);
        assert_eq!(f.insert(3, 10, at(120)), None);
        // Answered by the wrong series: not taken.
        assert_eq!(f.take(1, |id| id == 11), None);
        assert_eq!(f.take(1, |id| id == 10), Some(10));
        assert_eq!(f.take(1, |_| true), None, "a duplicate finds nothing");
        let mut lost = Vec::new();
        f.expire(at(99), |id| lost.push(id));
        assert!(lost.is_empty());
        f.expire(at(110), |id| lost.push(id));
        assert_eq!(lost, vec![11], "1 was answered, 2 ran out, 3 still waits");
        assert_eq!(f.next_deadline(), Some(at(120)));
        // A wrapped key replaces the old probe, which the caller counts lost.
        assert_eq!(f.insert(3, 12, at(200)), Some(10));
        f.expire(at(150), |id| lost.push(id));
        assert_eq!(lost, vec![11], "the replaced entry does not expire twice");
        assert_eq!(f.insert(4, 12, at(210)), None);
        assert_eq!(f.drop_series(12), 2);
        f.expire(at(1000), |id| lost.push(id));
        assert_eq!(lost, vec![11]);
    }

    #[test]
    fn answered_probes_set_no_deadline() {
        let mut f = InFlight::default();
        for k in 1..=4 {
            f.insert(k, 10, at(100 + k));
        }
        assert_eq!(f.take(1, |_| true), Some(10));
        assert_eq!(f.next_deadline(), Some(at(102)), "1 was answered");
        // Answered out of order: 3 waits behind 2 until 2 is settled.
        assert_eq!(f.take(3, |_| true), Some(10));
        assert_eq!(f.next_deadline(), Some(at(102)));
        assert_eq!(f.take(2, |_| true), Some(10));
        assert_eq!(f.next_deadline(), Some(at(104)), "2 and 3 answered");
        assert_eq!(f.order.len(), 1);
        assert_eq!(f.take(4, |_| true), Some(10));
        assert_eq!(f.next_deadline(), None);
        assert!(f.order.is_empty());
    }

    #[test]
    fn messages_round_trip() {
        let mut b = [0u8; 64];
        write_msg(&mut b, 7, Instant::from_nanos(99));
        assert_eq!(read_msg(&b), Some((7, 99)));
        assert_eq!(read_msg(&b[..MSG_LEN - 1]), None);
        let mut u = [0u8; 40];
        write_ud_ping(&mut u, 5, Instant::from_nanos(1234));
        assert_eq!(read_ud_pong(&u), None, "a ping is not a pong");
        u[4] = 2;
        u[32..40].copy_from_slice(&17u64.to_be_bytes());
        assert_eq!(read_ud_pong(&u), Some((5, 1234, 17)));
    }
}
