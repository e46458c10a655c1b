//! The two halves of a probe transport that [`crate::ping_engine::PingEngine`]
//! drives: [`ProbeKind`] (its types, and how a reply becomes an RTT sample
//! and an event) and [`Probe`] (open, send request `seq`, collect what was
//! heard) over the thing it sends on, plus what passes between them.

use std::fmt::Debug;
use std::time::Duration;

use ustack::time::Instant;

use crate::ping_stats::SummaryExtra;

/// A request in flight, as the engine keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent<S> {
    /// When the probe sent it (the turn's `now`).
    pub posted: Instant,
    /// What the probe learnt of it since ([`Heard::Stamped`]).
    pub stamp: S,
}

/// What a probe heard of one request, by the sequence number on the wire
/// (the low [`ProbeKind::SEQ_BITS`] bits of the engine's).
#[derive(Debug)]
pub enum Heard<K: ProbeKind + ?Sized> {
    /// A reply to request `seq`.
    Reply {
        /// The request's sequence number as the reply carries it.
        seq: u64,
        /// The reply.
        reply: K::Reply,
    },
    /// Request `seq` failed (an ICMP error, a send completed in error):
    /// it counts in [`crate::ping_stats::PingSummary::errors`], `event`
    /// goes to the front end.
    Failed {
        /// The request's sequence number.
        seq: u64,
        /// What to tell the front end, if anything.
        event: Option<K::Event>,
    },
    /// Something learnt about request `seq` while it waits (a send
    /// completion's timestamp), kept in its [`Sent::stamp`].
    Stamped {
        /// The request's sequence number.
        seq: u64,
        /// The new stamp.
        stamp: K::Stamp,
    },
}

/// Why a probe did not send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError<E> {
    /// No room now (a full send queue): the request is tried again on the
    /// next turn, under the same sequence number.
    Busy,
    /// The pinger cannot go on.
    Failed(E),
}

/// The transport-independent half of a probe: its types and how a reply
/// becomes a sample and an event.
pub trait ProbeKind: Debug {
    /// Width of the sequence number on the wire: 16 for ICMP (it wraps
    /// after 65,535 requests), 64 for UD.
    const SEQ_BITS: u32;
    /// What the probe holds once open (a ping socket, a QP).
    type Handle: Copy + Debug;
    /// What is kept per outstanding request besides its send time.
    type Stamp: Copy + Default + Debug;
    /// A reply as the probe heard it.
    type Reply: Debug;
    /// What the front end is told of (a reply line).
    type Event: Debug;
    /// Why the pinger stopped.
    type Error: Debug;
    /// What the summary holds beyond ping's totals.
    type Extra: SummaryExtra;

    /// The first reply to the request `sent`: its RTT if it was timed, and
    /// the event to report; `extra` takes the transport's own counts.
    fn answer(
        &self,
        now: Instant,
        sent: &Sent<Self::Stamp>,
        reply: Self::Reply,
        extra: &mut Self::Extra,
    ) -> (Option<Duration>, Self::Event);

    /// A further reply to a request already answered (ping's `DUP!`).
    fn duplicate(&self, reply: Self::Reply) -> Self::Event;
}

/// The I/O half of a probe, over `N` (the stack, or any UD transport).
pub trait Probe<N: ?Sized>: ProbeKind {
    /// Open what the probe sends on (first turn).
    fn open(&mut self, net: &mut N) -> Result<Self::Handle, Self::Error>;

    /// Send request `seq` (from 1; the probe puts its low
    /// [`SEQ_BITS`](ProbeKind::SEQ_BITS) bits on the wire).
    fn send(
        &mut self,
        now: Instant,
        net: &mut N,
        h: Self::Handle,
        seq: u64,
    ) -> Result<(), SendError<Self::Error>>;

    /// Everything heard since the last turn, in order, into `heard`.
    fn collect(&mut self, now: Instant, net: &mut N, h: Self::Handle, heard: &mut Vec<Heard<Self>>);
}
