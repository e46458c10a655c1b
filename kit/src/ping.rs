//! [`Pinger`]: sends ICMP echo requests on a schedule and keeps ping's statistics.

use core::net::Ipv4Addr;
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use ustack::iface::icmp::{PingEvent, PingHandle, PingReply};
use ustack::node::{App, Control, RxWait};
use ustack::stack::Stack;
use ustack::time::Instant;

/// What to ping and how.
#[derive(Debug, Clone)]
pub struct PingerConfig {
    /// The host to ping.
    pub dst: Ipv4Addr,
    /// ICMP echo identifier (one ping socket per identifier on a stack).
    pub ident: u16,
    /// Requests to send; `None` for no limit.
    pub count: Option<u64>,
    /// Time between requests (ping's `-i`).
    pub interval: Duration,
    /// Echo data bytes (56 like ping's default).
    pub size: usize,
    /// How long to wait for replies after the last request when none has
    /// come back by then (ping's `-W`). With replies in, the wait is
    /// [`linger`]'s: twice the longest RTT, at least one interval.
    pub timeout: Duration,
}

/// How long a pinger with a count waits after its last request for the
/// replies still outstanding, decided when that request leaves, as iputils
/// ping does (`schedule_exit`): with any reply in, twice the longest RTT
/// seen but at least one interval; with none, the whole `timeout` (`-W`).
/// It stops sooner when every request is answered.
pub fn linger(received: u64, max_rtt: Duration, interval: Duration, timeout: Duration) -> Duration {
    if received > 0 {
        (max_rtt * 2).max(interval)
    } else {
        timeout
    }
}

impl PingerConfig {
    /// Ping `dst` as iputils does by default: 56 data bytes once a second
    /// without end, a 1 s wait for the last reply, identifier 0x5553.
    pub fn new(dst: Ipv4Addr) -> Self {
        PingerConfig {
            dst,
            ident: 0x5553,
            count: None,
            interval: Duration::from_secs(1),
            size: 56,
            timeout: Duration::from_secs(1),
        }
    }
}

/// Running RTT statistics, as iputils ping reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RttStats {
    /// Samples taken.
    pub count: u64,
    /// Smallest RTT (zero before the first sample).
    pub min: Duration,
    /// Largest RTT.
    pub max: Duration,
    sum_ns: f64,
    sum_sq_ns: f64,
}

impl RttStats {
    /// Take one sample.
    pub fn add(&mut self, rtt: Duration) {
        if self.count == 0 || rtt < self.min {
            self.min = rtt;
        }
        self.max = self.max.max(rtt);
        let ns = rtt.as_nanos() as f64;
        self.sum_ns += ns;
        self.sum_sq_ns += ns * ns;
        self.count += 1;
    }

    /// Mean RTT (zero before the first sample).
    pub fn avg(&self) -> Duration {
        if self.count == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos((self.sum_ns / self.count as f64) as u64)
    }

    /// Mean deviation as ping computes it: `sqrt(E[rtt^2] - E[rtt]^2)`.
    pub fn mdev(&self) -> Duration {
        if self.count == 0 {
            return Duration::ZERO;
        }
        let n = self.count as f64;
        let mean = self.sum_ns / n;
        let var = (self.sum_sq_ns / n - mean * mean).max(0.0);
        Duration::from_nanos(var.sqrt() as u64)
    }
}

/// Totals of a ping run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PingSummary {
    /// Requests sent.
    pub transmitted: u64,
    /// Requests answered (first reply to each; duplicates not counted).
    pub received: u64,
    /// Further replies to a request already answered (ping's `DUP!`).
    pub duplicates: u64,
    /// Requests answered with an ICMP destination unreachable.
    pub errors: u64,
    /// RTTs of the answered requests that carried a timestamp.
    pub rtt: RttStats,
}

impl PingSummary {
    /// Packet loss in percent of transmitted.
    pub fn loss_percent(&self) -> f64 {
        if self.transmitted == 0 {
            return 0.0;
        }
        100.0 * (self.transmitted.saturating_sub(self.received)) as f64 / self.transmitted as f64
    }
}

/// An event for a front end to print.
#[derive(Debug, Clone, PartialEq)]
pub enum PingerEvent {
    /// An echo reply (ping's `64 bytes from ...` line).
    Reply {
        /// The reply as the stack delivered it.
        reply: PingReply,
        /// A second reply to the same request (ping's `DUP!`).
        duplicate: bool,
    },
    /// A destination unreachable about one of our outstanding requests.
    Unreachable {
        /// The host that sent the error.
        from: Ipv4Addr,
        /// The request's sequence number.
        seq: u16,
        /// ICMP code (RFC 792: 1 host, 3 port unreachable, ...).
        code: u8,
    },
}

/// Most events kept for the front end before the oldest are discarded.
const EVENT_BACKLOG: usize = 65_536;

/// An app that pings one host.
#[derive(Debug)]
pub struct Pinger {
    cfg: PingerConfig,
    handle: Option<PingHandle>,
    next_send: Option<Instant>,
    first_send: Option<Instant>,
    last_send: Option<Instant>,
    /// When the wait for outstanding replies ends, once the last request
    /// of a counted run has left ([`linger`]).
    linger_until: Option<Instant>,
    /// Sequence numbers sent and not yet answered, with their send time.
    outstanding: HashMap<u16, Instant>,
    answered: HashSet<u16>,
    summary: PingSummary,
    events: VecDeque<PingerEvent>,
    error: Option<ustack::stack::Error>,
    keep_events: bool,
    done: bool,
}

impl Pinger {
    /// A pinger that opens its ping socket and sends its first request on
    /// its first poll.
    pub fn new(cfg: PingerConfig) -> Self {
        Pinger {
            cfg,
            handle: None,
            next_send: None,
            first_send: None,
            last_send: None,
            linger_until: None,
            outstanding: HashMap::new(),
            answered: HashSet::new(),
            summary: PingSummary::default(),
            events: VecDeque::new(),
            error: None,
            keep_events: true,
            done: false,
        }
    }

    /// Do not keep per-reply events (summary only).
    pub fn quiet(mut self) -> Self {
        self.keep_events = false;
        self
    }

    /// Totals so far.
    pub fn summary(&self) -> PingSummary {
        self.summary
    }

    /// The error that stopped the pinger, if any (identifier in use, no route).
    pub fn error(&self) -> Option<ustack::stack::Error> {
        self.error.clone()
    }

    /// What this pinger pings and how.
    pub fn config(&self) -> &PingerConfig {
        &self.cfg
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

    /// Events since the last call.
    pub fn drain_events(&mut self) -> impl Iterator<Item = PingerEvent> + '_ {
        self.events.drain(..)
    }

    fn all_sent(&self) -> bool {
        self.cfg
            .count
            .is_some_and(|c| self.summary.transmitted >= c)
    }

    /// Send no more requests (a deadline passed); replies are still taken.
    pub fn stop_sending(&mut self) {
        self.next_send = None;
    }

    /// All requests sent and each answered or timed out (as of `now`), or
    /// the pinger stopped on an error.
    pub fn finished(&self, now: Instant) -> bool {
        if self.error.is_some() {
            return true;
        }
        if !self.all_sent() {
            return false;
        }
        self.outstanding.is_empty() || self.linger_until.is_some_and(|t| now >= t)
    }

    fn push_event(&mut self, ev: PingerEvent) {
        if !self.keep_events {
            return;
        }
        if self.events.len() >= EVENT_BACKLOG {
            self.events.pop_front();
        }
        self.events.push_back(ev);
    }

    fn on_event(&mut self, ev: PingEvent) {
        match ev {
            PingEvent::Reply(reply) => {
                let duplicate = self.outstanding.remove(&reply.seq).is_none();
                if duplicate {
                    if !self.answered.contains(&reply.seq) {
                        // Not ours (stale or forged): ignore.
                        return;
                    }
                    self.summary.duplicates += 1;
                } else {
                    self.answered.insert(reply.seq);
                    self.summary.received += 1;
                    if let Some(rtt) = reply.rtt() {
                        self.summary.rtt.add(rtt);
                    }
                }
                self.push_event(PingerEvent::Reply { reply, duplicate });
            }
            PingEvent::Unreachable { from, seq, code } => {
                if self.outstanding.remove(&seq).is_some() {
                    self.summary.errors += 1;
                    self.push_event(PingerEvent::Unreachable { from, seq, code });
                }
            }
        }
    }
}

impl App for Pinger {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        if self.error.is_some() {
            return Control::Exit;
        }
        let h = match self.handle {
            Some(h) => h,
            None => match stack.ping().open(self.cfg.ident) {
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
        while let Ok(Some(ev)) = stack.ping().recv(h) {
            self.on_event(ev);
        }
        if let Some(t) = self.next_send.filter(|t| now >= *t && !self.all_sent()) {
            // icmp_seq counts from 1, as iputils does.
            let seq = ((self.summary.transmitted + 1) % 65_536) as u16;
            match stack.ping().send(h, self.cfg.dst, seq, self.cfg.size) {
                Ok(()) => {
                    self.summary.transmitted += 1;
                    self.outstanding.insert(seq, now);
                    self.answered.remove(&seq);
                    self.first_send.get_or_insert(now);
                    self.last_send = Some(now);
                    if self.all_sent() {
                        let s = &self.summary;
                        let wait =
                            linger(s.received, s.rtt.max, self.cfg.interval, self.cfg.timeout);
                        self.linger_until = Some(now + wait);
                    }
                }
                Err(e) => {
                    self.error = Some(e);
                    return Control::Exit;
                }
            }
            // Keep the schedule (no drift), but never burst to catch up.
            let next = t + self.cfg.interval;
            self.next_send = Some(if next < now { now } else { next });
        }
        // Forget requests older than the timeout: they count as lost.
        let timeout = self.cfg.timeout;
        if self.outstanding.len() > 1024 {
            self.outstanding.retain(|_, sent| now < *sent + timeout);
        }
        if self.finished(now) {
            self.done = true;
            Control::Exit
        } else {
            Control::Continue
        }
    }

    fn poll_at(&self) -> Option<Instant> {
        if self.error.is_some() || self.done {
            return None;
        }
        if self.handle.is_none() {
            return Some(Instant::ZERO);
        }
        if !self.all_sent() {
            return self.next_send;
        }
        if self.outstanding.is_empty() {
            return None;
        }
        self.linger_until
    }
    /// Once a reply has come (so the peer's address is resolved), the
    /// reply to the last request is timed by the port's receive stamp
    /// ([`PingReply::received_at`]): it may wait for the next send.
    /// Requests whose replies were lost (still outstanding) wait for
    /// nothing.
    fn rx_wait(&self) -> RxWait {
        let last = (self.summary.transmitted % 65_536) as u16;
        match (
            self.summary.received > 0,
            self.outstanding.contains_key(&last),
        ) {
            (true, true) => RxWait::Stamped,
            (true, false) => RxWait::Nothing,
            _ => RxWait::Prompt,
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn rtt_stats_match_ping_formula() {
        let mut s = RttStats::default();
        for ms in [1u64, 2, 3, 4] {
            s.add(Duration::from_millis(ms));
        }
        assert_eq!(s.min, Duration::from_millis(1));
        assert_eq!(s.max, Duration::from_millis(4));
        assert_eq!(s.avg(), Duration::from_micros(2500));
        // sqrt(7.5 - 6.25) ms = 1.118 ms
        assert_eq!(s.mdev().as_micros(), 1118);
    }

    #[test]
    fn loss_percent() {
        let s = PingSummary {
            transmitted: 10,
            received: 7,
            ..PingSummary::default()
        };
        assert!((s.loss_percent() - 30.0).abs() < 1e-9);
        assert_eq!(PingSummary::default().loss_percent(), 0.0);
    }

    /// Runs a pinger on node 0 and notes when it exits.
    struct Timed {
        pinger: Pinger,
        exited: Option<Instant>,
    }

    impl App for Timed {
        fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
            if self.exited.is_none() && self.pinger.poll(now, stack) == Control::Exit {
                self.exited = Some(now);
            }
            Control::Continue
        }
        fn poll_at(&self) -> Option<Instant> {
            self.exited
                .is_none()
                .then(|| self.pinger.poll_at())
                .flatten()
        }
    }

    /// `-c COUNT -i 1 -W 20` to host 2 of a sim link (1 ms each way).
    /// Request n leaves at n-1 s; those in `lose` are lost on the wire (the
    /// link drops everything from 0.4 s before to 0.5 s after), and with
    /// `all_lost` the link drops everything, ARP included. The pinger's exit
    /// time in virtual seconds, and its summary.
    fn ping_run(count: u64, lose: &[u64], all_lost: bool) -> (f64, PingSummary) {
        use ustack::phy::sim::{LinkConfig, SimNet, host_config};
        let link = |loss: f64| LinkConfig {
            delay: Duration::from_millis(1),
            loss,
            ..LinkConfig::default()
        };
        let mut net = SimNet::new(link(if all_lost { 1.0 } else { 0.0 }));
        net.add(host_config(1));
        net.add(host_config(2));
        let dst = net.nodes[1].stack.ip();
        let mut cfg = PingerConfig::new(dst);
        cfg.count = Some(count);
        cfg.timeout = Duration::from_secs(20);
        let mut app = Timed {
            pinger: Pinger::new(cfg),
            exited: None,
        };
        let at = |s: f64| Instant::ZERO + Duration::from_secs_f64(s);
        for &seq in lose {
            let sent = seq as f64 - 1.0;
            net.run_until(at(sent - 0.4), &mut [&mut app], |_| false);
            net.link.set_config(link(1.0));
            net.run_until(at(sent + 0.5), &mut [&mut app], |_| false);
            net.link.set_config(link(0.0));
        }
        net.run_until(at(100.0), &mut [&mut app], |_| false);
        let exited = app.exited.expect("the pinger exits");
        (
            exited
                .saturating_duration_since(Instant::ZERO)
                .as_secs_f64(),
            app.pinger.summary(),
        )
    }

    /// iputils applies -W only when nothing came back: one lost reply of
    /// `-c 3 -W 20` ends one interval after the last request (2 x RTT is
    /// less), not 20 s after it.
    #[test]
    fn one_lost_reply_waits_the_linger_not_the_timeout() {
        let (t, s) = ping_run(3, &[2], false);
        assert_eq!((s.transmitted, s.received), (3, 2));
        assert!(
            (t - 3.0).abs() < 0.01,
            "exited at {t} s, want 2 s + 1 interval"
        );
        let (t, s) = ping_run(3, &[3], false);
        assert_eq!((s.transmitted, s.received), (3, 2));
        assert!((t - 3.0).abs() < 0.01, "exited at {t} s");
    }

    /// With every reply lost the whole -W is waited, from the last request.
    #[test]
    fn no_reply_waits_the_whole_timeout() {
        let (t, s) = ping_run(1, &[], true);
        assert_eq!((s.transmitted, s.received), (1, 0));
        assert!((t - 20.0).abs() < 0.01, "exited at {t} s, want -W 20");
        // All answered: done at the last reply.
        let (t, s) = ping_run(2, &[], false);
        assert_eq!(s.received, 2);
        assert!(t < 1.01, "exited at {t} s");
    }

    #[test]
    fn linger_as_iputils() {
        let ms = Duration::from_millis;
        assert_eq!(linger(0, ms(0), ms(1000), ms(10_000)), ms(10_000));
        assert_eq!(linger(2, ms(3), ms(1000), ms(10_000)), ms(1000));
        assert_eq!(linger(2, ms(800), ms(1000), ms(10_000)), ms(1600));
    }
}
