//! [`Pinger`]: ICMP echo requests on a schedule, with ping's statistics:
//! the [`PingEngine`] with [`IcmpProbe`], which sends on the stack's ping
//! sockets.

use core::net::IpAddr;
use std::time::Duration;

use ustack::iface::icmp::{PingEvent, PingHandle, PingReply};
use ustack::stack::{Error, Stack};
use ustack::time::Instant;

use crate::ping_engine::{Heard, PingEngine, Probe, ProbeKind, Schedule, SendError, Sent};
pub use crate::ping_stats::{PingSummary, RttStats, linger};

/// What to ping and how.
#[derive(Debug, Clone)]
pub struct PingerConfig {
    /// The host to ping (ICMP or ICMPv6 by its family).
    pub dst: IpAddr,
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

impl PingerConfig {
    /// Ping `dst` as iputils does by default: 56 data bytes once a second
    /// without end, a 1 s wait for the last reply, identifier 0x5553.
    pub fn new(dst: impl Into<IpAddr>) -> Self {
        PingerConfig {
            dst: dst.into(),
            ident: 0x5553,
            count: None,
            interval: Duration::from_secs(1),
            size: 56,
            timeout: Duration::from_secs(1),
        }
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
        from: IpAddr,
        /// The request's sequence number.
        seq: u16,
        /// ICMP code (RFC 792: 1 host, 3 port unreachable, ...).
        code: u8,
    },
}

/// ICMP echo over one of the stack's ping sockets: the [`Probe`] of
/// [`Pinger`]. Every call it makes into the [`Stack`] is here.
#[derive(Debug)]
pub struct IcmpProbe {
    cfg: PingerConfig,
}

impl ProbeKind for IcmpProbe {
    /// `icmp_seq` is 16 bits; it counts from 1, as iputils does.
    const SEQ_BITS: u32 = 16;
    type Handle = PingHandle;
    type Stamp = ();
    type Reply = PingReply;
    type Event = PingerEvent;
    type Error = Error;
    type Extra = ();

    /// Timed by the timestamp the request carried in its data (iputils'
    /// timeval), so no per-request state is needed.
    fn answer(
        &self,
        _now: Instant,
        _sent: &Sent<()>,
        reply: PingReply,
        _extra: &mut (),
    ) -> (Option<Duration>, PingerEvent) {
        let rtt = reply.rtt();
        let duplicate = false;
        (rtt, PingerEvent::Reply { reply, duplicate })
    }

    fn duplicate(&self, reply: PingReply) -> PingerEvent {
        PingerEvent::Reply {
            reply,
            duplicate: true,
        }
    }
}

impl Probe<Stack> for IcmpProbe {
    fn open(&mut self, stack: &mut Stack) -> Result<PingHandle, Error> {
        stack.ping().open(self.cfg.ident)
    }

    fn send(
        &mut self,
        _now: Instant,
        stack: &mut Stack,
        h: PingHandle,
        seq: u64,
    ) -> Result<(), SendError<Error>> {
        let (dst, size) = (self.cfg.dst, self.cfg.size);
        stack
            .ping()
            .send(h, dst, seq as u16, size)
            .map_err(SendError::Failed)
    }

    fn collect(
        &mut self,
        _now: Instant,
        stack: &mut Stack,
        h: PingHandle,
        heard: &mut Vec<Heard<Self>>,
    ) {
        while let Ok(Some(ev)) = stack.ping().recv(h) {
            heard.push(match ev {
                PingEvent::Reply(reply) => Heard::Reply {
                    seq: reply.seq.into(),
                    reply,
                },
                PingEvent::Unreachable { from, seq, code } => Heard::Failed {
                    seq: seq.into(),
                    event: Some(PingerEvent::Unreachable { from, seq, code }),
                },
            });
        }
    }
}

/// An app that pings one host over ICMP (the engine's `poll_transport`
/// takes the [`Stack`]).
pub type Pinger = PingEngine<IcmpProbe>;

impl Pinger {
    /// A pinger that opens its ping socket and sends its first request on
    /// its first poll.
    pub fn new(cfg: PingerConfig) -> Self {
        let sched = Schedule {
            count: cfg.count,
            interval: cfg.interval,
            timeout: cfg.timeout,
            batch: Duration::ZERO,
        };
        PingEngine::with_probe(IcmpProbe { cfg }, sched)
    }

    /// Totals so far.
    pub fn summary(&self) -> PingSummary {
        *self.totals()
    }

    /// The error that stopped the pinger, if any (identifier in use, no route).
    pub fn error(&self) -> Option<Error> {
        self.failure().cloned()
    }

    /// What this pinger pings and how.
    pub fn config(&self) -> &PingerConfig {
        &self.probe().cfg
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use ustack::node::{App, Control};

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
        use ustack::sim::{LinkConfig, SimNet, host_config};
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
}
