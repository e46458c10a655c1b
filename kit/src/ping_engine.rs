//! [`PingEngine`]: the one pinger. It keeps the schedule (count, interval,
//! send bursts, the next send time), the requests outstanding, the wait for
//! the last replies as iputils ping does ([`linger`]), duplicate and stray
//! replies, the statistics ([`PingSummary`]) and the events for a front end;
//! a [`Probe`] (in [`crate::probe`]) carries the requests and brings back
//! what came of them.
//!
//! Two probes plug in: ICMP echo on the stack's ping sockets
//! ([`crate::ping::IcmpProbe`], the engine is then [`crate::ping::Pinger`])
//! and UD SENDs to a responder over any [`ustack::socket::ud::UdTransport`]
//! ([`crate::ud_ping::UdProbe`], the engine is then
//! [`crate::ud_ping::UdPinger`]).
//!
//! The engine reads no clock: every turn gets `now`, so a test drives it
//! with a fake probe and a manual clock (`mod test` below).

use std::collections::{HashMap, VecDeque};
use std::fmt::Debug;
use std::time::Duration;

use ustack::node::{App, Control, RxWait};
use ustack::stack::Stack;
use ustack::time::Instant;

pub use crate::ping_stats::{PingSummary, RttStats, SummaryExtra, linger};
pub use crate::probe::{Heard, Probe, ProbeKind, SendError, Sent};

/// Most requests a batching pinger sends in one turn.
pub const MAX_BURST: usize = 64;

/// Most events kept for the front end before the oldest are discarded.
const EVENT_BACKLOG: usize = 65_536;

/// Requests outstanding above which those older than the timeout are
/// forgotten (they count as lost).
const PRUNE_ABOVE: usize = 1024;

/// How many of the latest requests the engine remembers as answered, to
/// tell a duplicate from a stray reply (iputils' `rcvd_tbl`).
const DUP_WINDOW: u64 = 1 << 16;

/// When requests leave and how long the last replies are waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// Requests to send; `None` for no limit.
    pub count: Option<u64>,
    /// Time between requests (ping's `-i`).
    pub interval: Duration,
    /// How long to wait after the last request when no reply has come
    /// (ping's `-W`); with replies in, [`linger`]'s wait.
    pub timeout: Duration,
    /// Coalesce sends: wake at most once per `batch` and send every request
    /// due by then (at most [`MAX_BURST`] at once). Zero: one wake-up per
    /// request, on time.
    pub batch: Duration,
}

/// A pinger: the engine, with the probe `K` carrying its requests.
#[derive(Debug)]
pub struct PingEngine<K: ProbeKind> {
    probe: K,
    sched: Schedule,
    handle: Option<K::Handle>,
    next_send: Option<Instant>,
    /// When the pinger last sent (a batching pinger sends once per window).
    last_burst: Option<Instant>,
    first_send: Option<Instant>,
    last_send: Option<Instant>,
    /// When the wait for outstanding replies ends, once the last request
    /// of a counted run has left ([`linger`]).
    linger_until: Option<Instant>,
    /// Requests sent and not yet answered, by sequence number.
    outstanding: HashMap<u64, Sent<K::Stamp>>,
    answered: AnsweredTable,
    summary: PingSummary<K::Extra>,
    events: VecDeque<K::Event>,
    keep_events: bool,
    error: Option<K::Error>,
    done: bool,
    heard: Vec<Heard<K>>,
}

impl<K: ProbeKind> PingEngine<K> {
    /// A pinger that opens `probe` and sends its first request on its
    /// first turn.
    pub fn with_probe(probe: K, sched: Schedule) -> Self {
        PingEngine {
            probe,
            sched,
            handle: None,
            next_send: None,
            last_burst: None,
            first_send: None,
            last_send: None,
            linger_until: None,
            outstanding: HashMap::new(),
            answered: AnsweredTable::default(),
            summary: PingSummary::default(),
            events: VecDeque::new(),
            keep_events: true,
            error: None,
            done: false,
            heard: Vec::new(),
        }
    }

    /// Keep no per-reply events (summary only).
    pub fn quiet(mut self) -> Self {
        self.keep_events = false;
        self
    }

    /// The probe (its configuration, its handle).
    pub fn probe(&self) -> &K {
        &self.probe
    }

    /// The schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.sched
    }

    /// Totals so far.
    pub fn totals(&self) -> &PingSummary<K::Extra> {
        &self.summary
    }

    /// The error that stopped the pinger, if any.
    pub fn failure(&self) -> Option<&K::Error> {
        self.error.as_ref()
    }

    /// The probe's handle, once open.
    pub fn handle(&self) -> Option<K::Handle> {
        self.handle
    }

    /// When the first request left, if one did.
    pub fn started(&self) -> Option<Instant> {
        self.first_send
    }

    /// When the latest request left, if one did (iputils' `time` in the
    /// summary runs from the first request to this one).
    pub fn last_sent(&self) -> Option<Instant> {
        self.last_send
    }

    /// Events since the last call (none when [`quiet`](Self::quiet)).
    pub fn drain_events(&mut self) -> impl Iterator<Item = K::Event> + '_ {
        self.events.drain(..)
    }

    /// Send no more requests (a deadline passed); replies are still taken.
    pub fn stop_sending(&mut self) {
        self.next_send = None;
    }

    fn all_sent(&self) -> bool {
        self.sched
            .count
            .is_some_and(|c| self.summary.transmitted >= c)
    }

    /// All requests sent and each answered or timed out (as of `now`), or
    /// the pinger stopped on an error.
    pub fn finished(&self, now: Instant) -> bool {
        self.error.is_some()
            || (self.all_sent()
                && (self.outstanding.is_empty() || self.linger_until.is_some_and(|t| now >= t)))
    }

    /// One turn: open the probe on the first, take what it heard, send
    /// what is due. [`Control::Exit`] once [`finished`](Self::finished).
    pub fn poll_transport<N: ?Sized>(&mut self, now: Instant, net: &mut N) -> Control
    where
        K: Probe<N>,
    {
        if self.error.is_some() {
            return Control::Exit;
        }
        let h = match self.handle {
            Some(h) => h,
            None => match self.probe.open(net) {
                Ok(h) => {
                    self.handle = Some(h);
                    self.next_send = Some(now);
                    h
                }
                Err(e) => {
                    self.error = Some(e);
                    return Control::Exit;
                }
            },
        };
        let mut heard = std::mem::take(&mut self.heard);
        self.probe.collect(now, net, h, &mut heard);
        for ev in heard.drain(..) {
            self.hear(now, ev);
        }
        self.heard = heard;
        if let Err(e) = self.send_due(now, net, h) {
            self.error = Some(e);
            return Control::Exit;
        }
        if self.outstanding.len() > PRUNE_ABOVE {
            let timeout = self.sched.timeout;
            self.outstanding.retain(|_, s| now < s.posted + timeout);
        }
        if self.finished(now) {
            self.done = true;
            Control::Exit
        } else {
            Control::Continue
        }
    }

    /// Send every request due by `now`: one a turn, or with a batch, up to
    /// [`MAX_BURST`] once per batch window.
    fn send_due<N: ?Sized>(
        &mut self,
        now: Instant,
        net: &mut N,
        h: K::Handle,
    ) -> Result<(), K::Error>
    where
        K: Probe<N>,
    {
        let batch = self.sched.batch;
        // A batching pinger sends at most once per window, whatever woke it.
        let may_send = self.last_burst.is_none_or(|t| now >= t + batch);
        let mut burst = 0;
        while let Some(due) = self
            .next_send
            .filter(|d| may_send && now >= *d && !self.all_sent())
        {
            if burst == 0 {
                self.last_burst = Some(now);
            }
            burst += 1;
            let seq = self.summary.transmitted + 1;
            match self.probe.send(now, net, h, seq) {
                Ok(()) => self.sent(now, seq),
                Err(SendError::Busy) => {
                    self.next_send = Some(now);
                    break;
                }
                Err(SendError::Failed(e)) => return Err(e),
            }
            let next = due + self.sched.interval;
            if batch.is_zero() {
                // Keep the schedule (no drift), but never burst to catch up.
                self.next_send = Some(next.max(now));
                break;
            }
            self.next_send = Some(next);
            if burst >= MAX_BURST {
                // Further behind than a burst: give up the lost schedule.
                if next + batch < now {
                    self.next_send = Some(now);
                }
                break;
            }
        }
        Ok(())
    }

    fn sent(&mut self, now: Instant, seq: u64) {
        self.summary.transmitted += 1;
        if K::SEQ_BITS < 64 {
            // The wire number is taken again: its older owner is lost.
            self.outstanding.remove(&seq.wrapping_sub(1 << K::SEQ_BITS));
        }
        let stamp = K::Stamp::default();
        self.outstanding.insert(seq, Sent { posted: now, stamp });
        self.answered.forget(seq);
        self.first_send.get_or_insert(now);
        self.last_send = Some(now);
        if self.all_sent() {
            let s = &self.summary;
            let wait = linger(
                s.received,
                s.rtt.max,
                self.sched.interval,
                self.sched.timeout,
            );
            self.linger_until = Some(now + wait);
        }
    }

    /// The request a wire sequence number names: the latest one sent with
    /// those low bits. `None` for one never sent.
    fn request(&self, wire: u64) -> Option<u64> {
        let last = self.summary.transmitted;
        let seq = if K::SEQ_BITS >= 64 {
            wire
        } else {
            let mask = (1u64 << K::SEQ_BITS) - 1;
            last.checked_sub(last.wrapping_sub(wire) & mask)?
        };
        (seq != 0 && seq <= last).then_some(seq)
    }

    fn hear(&mut self, now: Instant, heard: Heard<K>) {
        match heard {
            Heard::Reply { seq, reply } => {
                let Some(seq) = self.request(seq) else {
                    return; // Not ours (stale or forged): ignore.
                };
                if let Some(sent) = self.outstanding.remove(&seq) {
                    self.answered.mark(seq);
                    let extra = &mut self.summary.extra;
                    let (rtt, ev) = self.probe.answer(now, &sent, reply, extra);
                    match rtt {
                        Some(rtt) => self.summary.record(rtt),
                        None => self.summary.received += 1,
                    }
                    self.push(ev);
                } else if self.summary.transmitted - seq < DUP_WINDOW && self.answered.has(seq) {
                    self.summary.duplicates += 1;
                    let ev = self.probe.duplicate(reply);
                    self.push(ev);
                }
            }
            Heard::Failed { seq, event } => {
                let seq = self.request(seq);
                if seq.is_some_and(|s| self.outstanding.remove(&s).is_some()) {
                    self.summary.errors += 1;
                    if let Some(ev) = event {
                        self.push(ev);
                    }
                }
            }
            Heard::Stamped { seq, stamp } => {
                if let Some(s) = self.request(seq).and_then(|s| self.outstanding.get_mut(&s)) {
                    s.stamp = stamp;
                }
            }
        }
    }

    fn push(&mut self, ev: K::Event) {
        if !self.keep_events {
            return;
        }
        if self.events.len() >= EVENT_BACKLOG {
            self.events.pop_front();
        }
        self.events.push_back(ev);
    }

    /// When the pinger next needs a turn.
    pub fn next_wakeup(&self) -> Option<Instant> {
        if self.error.is_some() || self.done {
            return None;
        }
        if self.handle.is_none() {
            return Some(Instant::ZERO);
        }
        if !self.all_sent() {
            return self.next_send.map(|t| match self.last_burst {
                Some(b) => t.max(b + self.sched.batch),
                None => t,
            });
        }
        if self.outstanding.is_empty() {
            return None;
        }
        self.linger_until
    }

    /// Once a reply has come (so the peer's address is resolved), the
    /// reply to the last request is timed by the port's receive stamp (a
    /// ping reply's [`received_at`](ustack::iface::icmp::PingReply::received_at),
    /// a receive completion's timestamp): it may wait for the next send.
    /// Requests whose replies were lost (still outstanding) wait for
    /// nothing.
    pub fn rx_wait(&self) -> RxWait {
        let last_out = self.outstanding.contains_key(&self.summary.transmitted);
        match (self.summary.received > 0, last_out) {
            (true, true) => RxWait::Stamped,
            (true, false) => RxWait::Nothing,
            _ => RxWait::Prompt,
        }
    }
}

impl<K: Probe<Stack>> App for PingEngine<K> {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        self.poll_transport(now, stack)
    }
    fn poll_at(&self) -> Option<Instant> {
        self.next_wakeup()
    }
    fn rx_wait(&self) -> RxWait {
        PingEngine::rx_wait(self)
    }
}

/// Which of the last [`DUP_WINDOW`] requests were answered: one bit each,
/// by sequence number modulo the window, cleared when the number is sent.
#[derive(Debug, Clone)]
struct AnsweredTable(Vec<u64>);

impl Default for AnsweredTable {
    fn default() -> Self {
        AnsweredTable(vec![0; (DUP_WINDOW / 64) as usize])
    }
}

impl AnsweredTable {
    fn at(seq: u64) -> (usize, u64) {
        let i = seq % DUP_WINDOW;
        ((i / 64) as usize, 1 << (i % 64))
    }
    fn mark(&mut self, seq: u64) {
        let (w, b) = Self::at(seq);
        self.0[w] |= b;
    }
    fn forget(&mut self, seq: u64) {
        let (w, b) = Self::at(seq);
        self.0[w] &= !b;
    }
    fn has(&self, seq: u64) -> bool {
        let (w, b) = Self::at(seq);
        self.0[w] & b != 0
    }
}

#[cfg(test)]
mod test {
    use super::*;

    /// A transport in memory: what was sent, what is to be heard, whether
    /// the send queue is full or broken.
    #[derive(Debug, Default)]
    struct FakeNet<const BITS: u32 = 16> {
        sent: Vec<(u64, Instant)>,
        inbox: Vec<Heard<Fake<BITS>>>,
        busy: bool,
        broken: bool,
        refuse_open: bool,
    }

    /// A probe with `BITS`-bit sequence numbers whose replies carry their
    /// RTT (a stamp, when one came, overrides it).
    #[derive(Debug)]
    struct Fake<const BITS: u32 = 16>;

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Ev {
        Reply(u64, Option<Duration>),
        Dup(u64),
        Failed(u64),
    }

    impl<const BITS: u32> ProbeKind for Fake<BITS> {
        const SEQ_BITS: u32 = BITS;
        type Handle = ();
        type Stamp = u32;
        type Reply = (u64, Option<Duration>);
        type Event = Ev;
        type Error = &'static str;
        type Extra = ();
        fn answer(
            &self,
            _now: Instant,
            sent: &Sent<u32>,
            (seq, rtt): Self::Reply,
            _extra: &mut (),
        ) -> (Option<Duration>, Ev) {
            // A stamped request's RTT is its stamp in milliseconds.
            let rtt = match sent.stamp {
                0 => rtt,
                ms => Some(Duration::from_millis(ms.into())),
            };
            (rtt, Ev::Reply(seq, rtt))
        }
        fn duplicate(&self, (seq, _): Self::Reply) -> Ev {
            Ev::Dup(seq)
        }
    }

    impl<const BITS: u32> Probe<FakeNet<BITS>> for Fake<BITS> {
        fn open(&mut self, net: &mut FakeNet<BITS>) -> Result<(), &'static str> {
            if net.refuse_open {
                Err("no socket")
            } else {
                Ok(())
            }
        }
        fn send(
            &mut self,
            now: Instant,
            net: &mut FakeNet<BITS>,
            _h: (),
            seq: u64,
        ) -> Result<(), SendError<&'static str>> {
            if net.broken {
                return Err(SendError::Failed("no route"));
            }
            if net.busy {
                return Err(SendError::Busy);
            }
            net.sent.push((seq & ((1 << BITS) - 1), now));
            Ok(())
        }
        fn collect(
            &mut self,
            _: Instant,
            net: &mut FakeNet<BITS>,
            _: (),
            heard: &mut Vec<Heard<Self>>,
        ) {
            heard.append(&mut net.inbox);
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }
    fn at(n: u64) -> Instant {
        Instant::ZERO + ms(n)
    }

    fn engine(count: Option<u64>, interval: u64, timeout: u64, batch: u64) -> PingEngine<Fake> {
        let sched = Schedule {
            count,
            interval: ms(interval),
            timeout: ms(timeout),
            batch: ms(batch),
        };
        PingEngine::with_probe(Fake, sched)
    }

    fn reply(seq: u64, rtt: u64) -> Heard<Fake> {
        Heard::Reply {
            seq,
            reply: (seq, Some(ms(rtt))),
        }
    }

    /// Turns the engine at every wake-up it asks for (the manual clock),
    /// delivering each request's reply `rtt(seq)` ms after it left (none
    /// for `None`), until it exits or `end`. Returns when it exited.
    fn run(
        p: &mut PingEngine<Fake>,
        net: &mut FakeNet,
        rtt: impl Fn(u64) -> Option<u64>,
        end: u64,
    ) -> Option<Instant> {
        let mut replies: Vec<(Instant, u64, u64)> = Vec::new();
        let mut now = Instant::ZERO;
        loop {
            for &(t, seq, r) in &replies {
                if t == now {
                    net.inbox.push(reply(seq, r));
                }
            }
            let before = net.sent.len();
            if p.poll_transport(now, net) == Control::Exit {
                return Some(now);
            }
            for &(seq, sent) in &net.sent[before..] {
                if let Some(r) = rtt(seq) {
                    replies.push((sent + ms(r), seq, r));
                }
            }
            let next_reply = replies.iter().map(|r| r.0).filter(|t| *t > now).min();
            let next = ustack::time::earliest(p.next_wakeup(), next_reply)?;
            assert!(next >= now, "the wake-up goes back in time");
            if next > at(end) {
                return None;
            }
            now = next;
        }
    }

    #[test]
    fn count_sends_on_schedule_and_stops_at_the_last_reply() {
        let mut p = engine(Some(3), 1000, 5000, 0);
        let mut net = FakeNet::default();
        let exit = run(&mut p, &mut net, |seq| Some(10 * seq), 60_000);
        let sent: Vec<_> = net.sent.iter().map(|s| s.1).collect();
        assert_eq!(sent, vec![at(0), at(1000), at(2000)]);
        assert_eq!(exit, Some(at(2030)), "done at the last reply");
        let s = p.totals();
        assert_eq!(
            (s.transmitted, s.received, s.duplicates, s.errors),
            (3, 3, 0, 0)
        );
        assert_eq!(
            (s.rtt.min, s.rtt.max, s.rtt.avg()),
            (ms(10), ms(30), ms(20))
        );
        assert_eq!((p.started(), p.last_sent()), (Some(at(0)), Some(at(2000))));
        let evs: Vec<_> = p.drain_events().collect();
        assert_eq!(evs[2], Ev::Reply(3, Some(ms(30))));
        assert_eq!(p.next_wakeup(), None);
    }

    #[test]
    fn a_lost_reply_waits_the_linger_and_no_reply_the_timeout() {
        // Reply 2 lost: wait max(2 x 30 ms, interval) after the last send.
        let mut p = engine(Some(3), 1000, 20_000, 0);
        let mut net = FakeNet::default();
        let exit = run(&mut p, &mut net, |seq| (seq != 2).then_some(30), 60_000);
        assert_eq!(exit, Some(at(3000)));
        assert_eq!((p.totals().transmitted, p.totals().received), (3, 2));
        assert!((p.totals().loss_percent() - 100.0 / 3.0).abs() < 1e-9);
        // Long RTTs: twice the longest, beyond the interval.
        let mut p = engine(Some(2), 100, 20_000, 0);
        let mut net = FakeNet::default();
        let exit = run(&mut p, &mut net, |seq| (seq == 1).then_some(80), 60_000);
        assert_eq!(exit, Some(at(100 + 160)));
        // Nothing back: the whole timeout after the last request.
        let mut p = engine(Some(2), 1000, 20_000, 0);
        let mut net = FakeNet::default();
        let exit = run(&mut p, &mut net, |_| None, 60_000);
        assert_eq!(exit, Some(at(21_000)));
        assert_eq!(p.totals().received, 0);
    }

    #[test]
    fn without_a_count_it_runs_until_told_to_stop_sending() {
        let mut p = engine(None, 1000, 1000, 0);
        let mut net = FakeNet::default();
        assert_eq!(run(&mut p, &mut net, |_| Some(1), 9_500), None);
        assert_eq!(net.sent.len(), 10);
        p.stop_sending();
        assert_eq!(p.next_wakeup(), None);
        assert!(!p.finished(at(100_000)), "no count: never finished");
    }

    #[test]
    fn duplicates_counted_strays_ignored_failures_are_errors() {
        let mut p = engine(Some(3), 1000, 1000, 0);
        let mut net = FakeNet::default();
        p.poll_transport(at(0), &mut net);
        p.poll_transport(at(1000), &mut net);
        net.inbox = vec![
            reply(1, 5),
            reply(1, 5), // DUP!
            reply(3, 5), // never sent
            reply(0, 5), // never sent
            Heard::Failed {
                seq: 2,
                event: Some(Ev::Failed(2)),
            },
            Heard::Failed {
                seq: 2,
                event: Some(Ev::Failed(2)),
            }, // no longer outstanding
            reply(2, 5), // after its error: not ours any more
        ];
        p.poll_transport(at(1500), &mut net);
        let s = *p.totals();
        assert_eq!(
            (s.transmitted, s.received, s.duplicates, s.errors),
            (2, 1, 1, 1)
        );
        assert_eq!(s.rtt.count, 1);
        let evs: Vec<_> = p.drain_events().collect();
        assert_eq!(
            evs,
            vec![Ev::Reply(1, Some(ms(5))), Ev::Dup(1), Ev::Failed(2)]
        );
        // A reply without timing counts as received, with no RTT sample.
        p.poll_transport(at(2000), &mut net);
        net.inbox.push(Heard::Reply {
            seq: 3,
            reply: (3, None),
        });
        assert_eq!(p.poll_transport(at(2001), &mut net), Control::Exit);
        assert_eq!((p.totals().received, p.totals().rtt.count), (2, 1));
    }

    #[test]
    fn stamps_reach_the_answer() {
        let mut p = engine(Some(1), 1000, 1000, 0);
        let mut net = FakeNet::default();
        p.poll_transport(at(0), &mut net);
        net.inbox = vec![Heard::Stamped { seq: 1, stamp: 7 }, reply(1, 99)];
        assert_eq!(p.poll_transport(at(1), &mut net), Control::Exit);
        assert_eq!(p.totals().rtt.max, ms(7));
    }

    #[test]
    fn busy_retries_under_the_same_number_and_failure_stops() {
        let mut p = engine(Some(2), 1000, 1000, 0);
        let mut net = FakeNet {
            busy: true,
            ..FakeNet::default()
        };
        assert_eq!(p.poll_transport(at(0), &mut net), Control::Continue);
        assert_eq!(p.totals().transmitted, 0);
        assert_eq!(p.next_wakeup(), Some(at(0)), "tried again at once");
        net.busy = false;
        p.poll_transport(at(3), &mut net);
        assert_eq!(net.sent, vec![(1, at(3))]);
        assert_eq!(p.next_wakeup(), Some(at(1000)), "the schedule is kept");
        net.broken = true;
        assert_eq!(p.poll_transport(at(1000), &mut net), Control::Exit);
        assert_eq!(p.failure(), Some(&"no route"));
        assert!(p.finished(at(1000)));
        assert_eq!(p.next_wakeup(), None);
        // A probe that cannot open stops the pinger on its first turn.
        let mut p = engine(Some(2), 1000, 1000, 0);
        let mut net = FakeNet {
            refuse_open: true,
            ..FakeNet::default()
        };
        assert_eq!(p.next_wakeup(), Some(Instant::ZERO));
        assert_eq!(p.poll_transport(at(0), &mut net), Control::Exit);
        assert_eq!(p.failure(), Some(&"no socket"));
    }

    #[test]
    fn late_turns_do_not_burst_without_a_batch() {
        let mut p = engine(None, 10, 1000, 0);
        let mut net = FakeNet::default();
        p.poll_transport(at(0), &mut net);
        // 55 ms late: one request, and the schedule restarts from now.
        p.poll_transport(at(65), &mut net);
        assert_eq!(net.sent.len(), 2);
        assert_eq!(p.next_wakeup(), Some(at(65)));
        p.poll_transport(at(65), &mut net);
        assert_eq!(p.next_wakeup(), Some(at(75)));
    }

    #[test]
    fn a_batch_sends_what_is_due_once_per_window() {
        // 10 requests a millisecond, woken once per 2 ms.
        let mut p = engine(Some(1000), 0, 1000, 2);
        p.sched.interval = Duration::from_micros(100);
        let mut net = FakeNet::default();
        p.poll_transport(at(0), &mut net);
        assert_eq!(net.sent.len(), 1);
        assert_eq!(p.next_wakeup(), Some(at(2)));
        // Woken early (a reply): nothing sent before the window ends.
        p.poll_transport(at(1), &mut net);
        assert_eq!(net.sent.len(), 1);
        p.poll_transport(at(2), &mut net);
        assert_eq!(net.sent.len(), 21, "0.1 ms .. 2.0 ms");
        // Far behind: one burst, then the schedule restarts from now.
        p.poll_transport(at(100), &mut net);
        assert_eq!(net.sent.len(), 21 + MAX_BURST);
        assert_eq!(p.next_wakeup(), Some(at(102)));
    }

    #[test]
    fn short_sequence_numbers_wrap_to_the_latest_request() {
        // 4-bit numbers on the wire, as ICMP's 16 bits after 65,535 requests.
        let sched = Schedule {
            count: None,
            interval: Duration::ZERO,
            timeout: ms(1000),
            batch: Duration::ZERO,
        };
        let mut p = PingEngine::with_probe(Fake::<4>, sched);
        let mut net = FakeNet::<4>::default();
        assert_eq!(p.request(5), None, "none sent");
        for i in 0..18 {
            p.poll_transport(at(i), &mut net);
        }
        assert_eq!(p.totals().transmitted, 18);
        assert_eq!(net.sent.last().map(|s| s.0), Some(2));
        assert_eq!(p.request(2), Some(18));
        assert_eq!(p.request(3), Some(3));
        assert_eq!(p.request(0), Some(16));
        // Wire numbers 1 and 2 were taken again: requests 1 and 2 given up.
        assert!(!p.outstanding.contains_key(&1) && !p.outstanding.contains_key(&2));
        assert_eq!(p.outstanding.len(), 16, "bounded by the wrap");
        // Wire number 1 answers request 17; its second reply is a DUP.
        let reply = |seq| Heard::Reply {
            seq,
            reply: (seq, Some(ms(4))),
        };
        net.inbox = vec![reply(1), reply(1), reply(3)];
        p.poll_transport(at(18), &mut net);
        let s = p.totals();
        assert_eq!((s.received, s.duplicates), (2, 1));
        let evs: Vec<_> = p.drain_events().collect();
        assert_eq!(evs[0], Ev::Reply(1, Some(ms(4))));
        assert!(!p.outstanding.contains_key(&17) && !p.outstanding.contains_key(&3));
    }

    #[test]
    fn rx_wait_asks_for_stamps_only_for_the_last_request_once_answered() {
        let mut p = engine(None, 1000, 1000, 0);
        let mut net = FakeNet::default();
        assert_eq!(p.rx_wait(), RxWait::Prompt);
        p.poll_transport(at(0), &mut net);
        assert_eq!(p.rx_wait(), RxWait::Prompt, "nothing answered yet");
        net.inbox.push(reply(1, 1));
        p.poll_transport(at(1), &mut net);
        assert_eq!(p.rx_wait(), RxWait::Nothing);
        p.poll_transport(at(1000), &mut net);
        assert_eq!(p.rx_wait(), RxWait::Stamped);
        p.poll_transport(at(2000), &mut net);
        net.inbox.push(reply(3, 1));
        p.poll_transport(at(2001), &mut net);
        assert_eq!(p.rx_wait(), RxWait::Nothing, "2 lost, 3 answered");
    }
}
