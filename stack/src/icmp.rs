//! ICMP echo: ping sockets for apps (send requests, receive timestamped replies).
//!
//! A request carries its transmit time (engine nanoseconds, big-endian) in the
//! first 8 bytes of its data when the data is at least 8 bytes long, the way
//! iputils ping carries a timeval; the reply brings it back, so no per-request
//! state is kept and the RTT survives loss and reordering.

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::time::Duration;

use crate::stack::{Error, Stack};
use crate::time::Instant;

/// A ping socket (one ICMP echo identifier).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PingHandle(pub(crate) usize);

/// An echo reply delivered to the app.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PingReply {
    pub from: Ipv4Addr,
    pub ident: u16,
    pub seq: u16,
    pub ttl: u8,
    /// ICMP message length (8-byte header plus data), as ping prints it.
    pub bytes: usize,
    /// Transmit time read back from the data, if it carried one.
    pub sent_at: Option<Instant>,
    /// The poll loop's time when the reply was processed.
    pub received_at: Instant,
}

impl PingReply {
    /// Round-trip time, when the request carried a timestamp.
    pub fn rtt(&self) -> Option<Duration> {
        self.sent_at
            .map(|s| self.received_at.saturating_duration_since(s))
    }
}

/// What a ping socket receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PingEvent {
    Reply(PingReply),
    /// An ICMP destination-unreachable about one of our requests.
    Unreachable {
        from: Ipv4Addr,
        seq: u16,
        code: u8,
    },
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct PingRequest {
    pub dst: Ipv4Addr,
    pub seq: u16,
    pub size: usize,
}

#[derive(Debug)]
pub(crate) struct PingSocket {
    pub ident: u16,
    pub tx: VecDeque<PingRequest>,
    pub rx: VecDeque<PingEvent>,
    pub queued: bool,
}

/// Most events or requests a ping socket holds.
const PING_QUEUE: usize = 4096;
/// Largest echo data we send (IPv4 maximum minus headers).
pub const MAX_PING_DATA: usize = 65_507;

#[derive(Debug, Default)]
pub(crate) struct PingTable {
    pub sockets: Vec<Option<PingSocket>>,
    pub by_ident: HashMap<u16, usize>,
    /// Sockets with requests to send.
    pub ready: VecDeque<usize>,
}

impl PingTable {
    pub fn get_mut(&mut self, h: PingHandle) -> Result<&mut PingSocket, Error> {
        self.sockets
            .get_mut(h.0)
            .and_then(Option::as_mut)
            .ok_or(Error::InvalidHandle)
    }

    pub fn by_ident(&mut self, ident: u16) -> Option<&mut PingSocket> {
        let i = *self.by_ident.get(&ident)?;
        self.sockets.get_mut(i)?.as_mut()
    }

    /// Deliver an event; false if the socket's queue is full.
    pub fn deliver(&mut self, ident: u16, ev: PingEvent) -> Option<bool> {
        let s = self.by_ident(ident)?;
        if s.rx.len() >= PING_QUEUE {
            return Some(false);
        }
        s.rx.push_back(ev);
        Some(true)
    }
}

/// Fill echo data: an 8-byte timestamp, then a counting pattern.
pub(crate) fn fill_echo_data(data: &mut [u8], now: Instant) {
    for (i, b) in data.iter_mut().enumerate() {
        *b = (i & 0xff) as u8;
    }
    if let Some(ts) = data.get_mut(..8) {
        ts.copy_from_slice(&now.as_nanos().to_be_bytes());
    }
}

/// The timestamp carried by echo data, if long enough.
pub(crate) fn echo_timestamp(data: &[u8]) -> Option<Instant> {
    let b: [u8; 8] = data.get(..8)?.try_into().ok()?;
    Some(Instant::from_nanos(u64::from_be_bytes(b)))
}

impl Stack {
    /// Open a ping socket with echo identifier `ident`.
    pub fn ping_open(&mut self, ident: u16) -> Result<PingHandle, Error> {
        if self.pings.by_ident.contains_key(&ident) {
            return Err(Error::AddrInUse);
        }
        let sock = PingSocket {
            ident,
            tx: VecDeque::new(),
            rx: VecDeque::new(),
            queued: false,
        };
        let idx = match self.pings.sockets.iter().position(Option::is_none) {
            Some(i) => {
                self.pings.sockets[i] = Some(sock);
                i
            }
            None => {
                self.pings.sockets.push(Some(sock));
                self.pings.sockets.len() - 1
            }
        };
        self.pings.by_ident.insert(ident, idx);
        Ok(PingHandle(idx))
    }

    /// Queue an echo request with `size` bytes of data; it leaves on the next poll.
    pub fn ping_send(
        &mut self,
        h: PingHandle,
        dst: Ipv4Addr,
        seq: u16,
        size: usize,
    ) -> Result<(), Error> {
        if size > MAX_PING_DATA {
            return Err(Error::TooLarge);
        }
        let s = self.pings.get_mut(h)?;
        if s.tx.len() >= PING_QUEUE {
            return Err(Error::QueueFull);
        }
        s.tx.push_back(PingRequest { dst, seq, size });
        if !s.queued {
            s.queued = true;
            self.pings.ready.push_back(h.0);
        }
        Ok(())
    }

    /// Next reply or error for this socket.
    pub fn ping_recv(&mut self, h: PingHandle) -> Result<Option<PingEvent>, Error> {
        Ok(self.pings.get_mut(h)?.rx.pop_front())
    }

    /// Close a ping socket; queued requests and events are discarded.
    pub fn ping_close(&mut self, h: PingHandle) -> Result<(), Error> {
        let ident = self.pings.get_mut(h)?.ident;
        self.pings.sockets[h.0] = None;
        self.pings.by_ident.remove(&ident);
        self.pings.ready.retain(|&i| i != h.0);
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn timestamp_round_trip() {
        let mut d = [0u8; 56];
        fill_echo_data(&mut d, Instant::from_nanos(123_456_789));
        assert_eq!(echo_timestamp(&d), Some(Instant::from_nanos(123_456_789)));
        assert_eq!(d[8], 8);
        let mut short = [0u8; 4];
        fill_echo_data(&mut short, Instant::from_nanos(1));
        assert_eq!(echo_timestamp(&short), None);
    }
}
