//! Readiness events: what became readable, writable, connected, closed or
//! errored since the app last asked.
//!
//! The stack records an event when a socket's state changes on the receive
//! or transmit path (never by scanning sockets); [`crate::Stack::drain_events`]
//! hands them out, one [`Event`] per socket with every change since the last
//! drain merged. Events are edges, as epoll's `EPOLLET`: a consumer reads or
//! writes until the call would block, then waits for the next event. The
//! levels behind them stay available (`tcp().status`, `udp().recv_from`...).
//!
//! Each socket table queues a socket once until it is drained, so the
//! queues never hold more entries than there are sockets, whether anyone
//! drains them or not.

use serde::{Deserialize, Serialize};
use std::ops::{BitOr, BitOrAssign};

/// The socket an [`Event`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SocketRef {
    /// A TCP connection.
    Tcp(TcpHandle),
    /// A TCP listener: readable when a connection waits for `tcp().accept`.
    Listener(ListenHandle),
    /// A UDP socket.
    Udp(UdpHandle),
    /// A ping socket.
    Ping(PingHandle),
    /// An RDMA RC queue pair: readable when completions wait in its
    /// queue, errored when it moved to the error state.
    RcQp(RcQpHandle),
}

/// What changed, as a set of flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Readiness(u8);

impl Readiness {
    /// Nothing.
    pub const NONE: Readiness = Readiness(0);
    /// New data (or the peer's end of stream) to read; a connection to
    /// accept on a listener; a datagram or ping reply to receive.
    pub const READABLE: Readiness = Readiness(1);
    /// Room to write again after the socket was full.
    pub const WRITABLE: Readiness = Readiness(2);
    /// The handshake completed (an active open, or an accepted connection).
    pub const CONNECTED: Readiness = Readiness(4);
    /// The peer closed its side, or the connection ended.
    pub const CLOSED: Readiness = Readiness(8);
    /// The connection failed (refused, reset, timed out).
    pub const ERROR: Readiness = Readiness(16);

    /// Whether every flag of `other` is set here.
    pub const fn contains(self, other: Readiness) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any flag of `other` is set here.
    pub const fn intersects(self, other: Readiness) -> bool {
        self.0 & other.0 != 0
    }

    /// Whether no flag is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl BitOr for Readiness {
    type Output = Readiness;
    fn bitor(self, rhs: Readiness) -> Readiness {
        Readiness(self.0 | rhs.0)
    }
}

impl BitOrAssign for Readiness {
    fn bitor_assign(&mut self, rhs: Readiness) {
        self.0 |= rhs.0;
    }
}

/// One socket's changes since the last drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// The socket the event is about.
    pub socket: SocketRef,
    /// What changed since the last drain (one or more flags).
    pub readiness: Readiness,
}

/// A socket's pending flags and whether it sits in its table's queue.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Pending {
    pub flags: Readiness,
    pub queued: bool,
}

impl Pending {
    /// Add `r`; returns true when the socket must be queued (it was not).
    pub fn raise(&mut self, r: Readiness) -> bool {
        if r.is_empty() {
            return false;
        }
        self.flags |= r;
        !std::mem::replace(&mut self.queued, true)
    }

    /// Take the flags and leave the queue.
    pub fn take(&mut self) -> Readiness {
        self.queued = false;
        std::mem::take(&mut self.flags)
    }
}

/// A connection handle: a slot and the generation that owned it, so a stale
/// handle to a reused slot is refused rather than aliasing a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TcpHandle {
    pub(crate) slot: u32,
    pub(crate) generation: u32,
}

/// A listening socket: its port and the family of peers it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ListenHandle {
    pub(crate) port: u16,
    pub(crate) family: Family,
}

impl ListenHandle {
    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The peers it takes.
    pub fn family(&self) -> Family {
        self.family
    }
}

/// Which peers a listener or a UDP socket takes, by address family: both
/// (as an `AF_INET6` socket with `IPV6_V6ONLY` off, Linux's default, and
/// the engine's), or one. Sockets of families that do not overlap share
/// a port (an `AF_INET` listener and an `IPV6_V6ONLY` one on port 80).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Family {
    /// IPv4 and IPv6 peers.
    #[default]
    Both,
    /// IPv4 peers only (an `AF_INET` socket, or an `AF_INET6` one bound
    /// to a v4-mapped address).
    V4,
    /// IPv6 peers only (`IPV6_V6ONLY`).
    V6,
}

impl Family {
    /// The family of one peer.
    pub fn of(ip: core::net::IpAddr) -> Family {
        if ip.is_ipv4() { Family::V4 } else { Family::V6 }
    }

    /// Whether a peer at `ip` is taken.
    pub fn takes(self, ip: core::net::IpAddr) -> bool {
        self.overlaps(Family::of(ip))
    }

    /// Whether some peer would be taken by both.
    pub fn overlaps(self, other: Family) -> bool {
        !matches!(
            (self, other),
            (Family::V4, Family::V6) | (Family::V6, Family::V4)
        )
    }
}

slotmap::new_key_type! {
    /// A bound UDP socket. Handles carry a generation: one kept after
    /// `udp().close` is refused (`InvalidHandle`), never another socket.
    pub struct UdpHandle;
}

slotmap::new_key_type! {
    /// A ping socket (one ICMP echo identifier). Handles carry a
    /// generation: one kept after `ping_close` is refused, never another
    /// socket.
    pub struct PingHandle;
}

slotmap::new_key_type! {
    /// An RC queue pair of the stack. Stale handles are refused.
    pub struct RcQpHandle;
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn flags_merge_and_a_socket_queues_once() {
        let mut p = Pending::default();
        assert!(!p.raise(Readiness::NONE));
        assert!(p.raise(Readiness::READABLE));
        assert!(!p.raise(Readiness::WRITABLE));
        let r = p.take();
        assert!(r.contains(Readiness::READABLE | Readiness::WRITABLE));
        assert!(!r.intersects(Readiness::ERROR | Readiness::CLOSED));
        assert!(p.take().is_empty());
        assert!(p.raise(Readiness::ERROR));
    }
}
