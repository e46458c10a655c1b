//! [`Tcp`]: the TCP app API, a view of a stack's connections and
//! listeners. `stack.tcp()` lends it mutably, `stack.tcp_ref()` read-only.
//! Each call acts at once; what it queues leaves on the next
//! `Stack::poll`.

use core::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use super::{
    ConnInfo, ConnTimes, Family, KeepAlive, ListenHandle, TcpHandle, TcpStatus, TcpTable, TxStamp,
};
use smoltcp::wire::Ipv4Cidr;

use crate::error::Error;
use crate::iface::ipv6_iface::Ipv6Iface;
use crate::shard::ShardId;
use crate::time::Instant;

/// The TCP sockets of a stack, lent mutably by `stack.tcp()`: with the
/// address and shard a connection is opened from.
#[derive(Debug)]
pub struct Tcp<'a> {
    table: &'a mut TcpTable,
    ip: Ipv4Cidr,
    gateway: Option<Ipv4Addr>,
    ip6: &'a Ipv6Iface,
    shard: ShardId,
}

/// The same, read-only: what `tcp_ref()` lends.
#[derive(Debug)]
pub struct TcpRef<'a> {
    table: &'a TcpTable,
}

impl<'a> Tcp<'a> {
    pub(crate) fn new(
        table: &'a mut TcpTable,
        (ip, gateway): (Ipv4Cidr, Option<Ipv4Addr>),
        ip6: &'a Ipv6Iface,
        shard: ShardId,
    ) -> Self {
        Tcp {
            table,
            ip,
            gateway,
            ip6,
            shard,
        }
    }

    /// Our address for a connection to `remote`: the IPv4 one, or the
    /// IPv6 one of the right scope. `NoRoute` when the destination is
    /// neither on-link nor behind a gateway or router, or is IPv6 with
    /// IPv6 off (Linux's ENETUNREACH at connect, rather than a SYN that
    /// never leaves).
    fn source_for(&self, remote: &SocketAddr) -> Result<IpAddr, Error> {
        match remote {
            SocketAddr::V4(r) if self.ip.contains_addr(r.ip()) || self.gateway.is_some() => {
                Ok(IpAddr::V4(self.ip.address()))
            }
            SocketAddr::V4(_) => Err(Error::NoRoute),
            SocketAddr::V6(r) if self.ip6.next_hop(r.ip()).is_some() => self
                .ip6
                .source_for(r.ip())
                .map(IpAddr::V6)
                .ok_or(Error::NoRoute),
            SocketAddr::V6(_) => Err(Error::NoRoute),
        }
    }

    /// Listen on `port` with room for `backlog` connections waiting for
    /// [`accept`](Tcp::accept) (beyond it, SYN cookies answer); peers of
    /// either family.
    pub fn listen(&mut self, port: u16, backlog: usize) -> Result<ListenHandle, Error> {
        self.table.listen(port, backlog, Family::Both)
    }

    /// As [`listen`](Tcp::listen), for peers of `family` only (a POSIX
    /// layer's `AF_INET` and `IPV6_V6ONLY` sockets): listeners of families
    /// that do not overlap share the port; `AddrInUse` when they overlap.
    pub fn listen_family(
        &mut self,
        port: u16,
        backlog: usize,
        family: Family,
    ) -> Result<ListenHandle, Error> {
        self.table.listen(port, backlog, family)
    }

    /// TCP Fast Open (RFC 7413) on a listener: a SYN with a valid cookie
    /// (or with data and none, under [`TcpConfig::fast_open_no_cookie`])
    /// opens a connection that [`accept`](Tcp::accept) hands out at once
    /// with the SYN's data to read, and a SYN asking for a cookie gets
    /// one; at most `queue` such connections may wait for their handshake
    /// to finish (beyond, SYNs open connections the usual way). 0 turns
    /// it off.
    ///
    /// [`TcpConfig::fast_open_no_cookie`]: crate::socket::tcp::TcpConfig::fast_open_no_cookie
    pub fn set_fast_open(&mut self, l: ListenHandle, queue: usize) -> Result<(), Error> {
        self.table.set_fast_open(l, queue)
    }

    /// Stop listening: new SYNs to the port get a reset, and connections
    /// not yet accepted are reset; accepted ones are unaffected.
    pub fn unlisten(&mut self, l: ListenHandle) {
        self.table.unlisten(l);
    }

    /// The next established connection on a listener.
    pub fn accept(&mut self, l: ListenHandle) -> Result<Option<TcpHandle>, Error> {
        self.table.accept(l)
    }

    /// Open a connection to `remote` from an ephemeral port at `now`; the
    /// SYN leaves on the next poll.
    pub fn connect(
        &mut self,
        now: Instant,
        remote: impl Into<SocketAddr>,
    ) -> Result<TcpHandle, Error> {
        let remote = remote.into();
        let (me, shard) = (self.source_for(&remote)?, self.shard);
        self.table.connect(now, me, shard, remote)
    }

    /// Open a connection to `remote` from local `port` at `now` (`bind`
    /// then `connect`); `AddrInUse` when that flow exists or a listener
    /// holds the port. On a host with several shards the flow may hash to
    /// another shard: the app asked for the port.
    pub fn connect_from(
        &mut self,
        now: Instant,
        port: u16,
        remote: impl Into<SocketAddr>,
    ) -> Result<TcpHandle, Error> {
        let remote = remote.into();
        let me = self.source_for(&remote)?;
        self.table.connect_from(now, me, port, remote)
    }

    /// Make a connection just opened (by [`connect`](Self::connect) or
    /// [`connect_from`](Self::connect_from), before the next poll) a TCP
    /// Fast Open client's (RFC 7413): with a cookie this stack kept for
    /// the server, the SYN waits for the first [`send`](Self::send) and
    /// carries its data, and the result is true (the app may write at
    /// once, as after Linux's `TCP_FASTOPEN_CONNECT`); without, the SYN
    /// asks the server for a cookie and the result is false.
    pub fn fast_open_connect(&mut self, h: TcpHandle) -> Result<bool, Error> {
        self.table.fast_open_connect(h)
    }

    /// Queue bytes; returns how many fit in the send buffer (0 when full).
    pub fn send(&mut self, h: TcpHandle, data: &[u8]) -> Result<usize, Error> {
        self.table.send(h, data)
    }

    /// Read received bytes (0 when none are ready; see [`TcpStatus::eof`]).
    pub fn recv(&mut self, h: TcpHandle, buf: &mut [u8]) -> Result<usize, Error> {
        self.table.recv(h, buf)
    }

    /// Zero-copy send: `f` writes the data straight into the connection's
    /// send ring (the free space in one piece; call again for the rest
    /// after the ring's wrap) and returns how many bytes it wrote, with a
    /// value of its own. Errors as [`send`](Tcp::send).
    pub fn send_with<R>(
        &mut self,
        h: TcpHandle,
        f: impl FnOnce(&mut [u8]) -> (usize, R),
    ) -> Result<(usize, R), Error> {
        self.table.send_with(h, f)
    }

    /// Zero-copy receive: `f` reads received bytes where they lie in the
    /// receive ring (in one piece; call again for the rest) and returns how
    /// many it consumed, with a value of its own. Errors as
    /// [`recv`](Tcp::recv).
    pub fn recv_with<R>(
        &mut self,
        h: TcpHandle,
        f: impl FnOnce(&[u8]) -> (usize, R),
    ) -> Result<(usize, R), Error> {
        self.table.recv_with(h, f)
    }

    /// Close the sending side (FIN after queued data); the handle stays valid
    /// to read what the peer still sends.
    pub fn shutdown(&mut self, h: TcpHandle) -> Result<(), Error> {
        self.table.shutdown(h)
    }

    /// Close at `now` and release the handle: queued data is still
    /// delivered, then FIN; the connection finishes (TIME_WAIT included)
    /// on its own. As on Linux, received data the app never read, or data
    /// that arrives after the close, resets the connection instead (RFC
    /// 1122 4.2.2.13), and a peer that never sends its FIN is reset after
    /// `TcpConfig::fin_wait2_timeout`.
    pub fn close(&mut self, now: Instant, h: TcpHandle) -> Result<(), Error> {
        self.table.close(now, h)
    }

    /// A WRITABLE event on every ACK that frees send-buffer space, not
    /// only once the free space climbs past the low-water mark: for an
    /// app that follows what the peer acknowledged (the LD_PRELOAD
    /// layer's `MSG_ZEROCOPY` completions).
    pub fn set_ack_events(&mut self, h: TcpHandle, on: bool) -> Result<(), Error> {
        self.table.set_ack_events(h, on)
    }

    /// Transmit timestamps (`SO_TIMESTAMPING`) of the last byte queued
    /// so far, which the app knows as `key`: when it first leaves for the
    /// port (`sent`) and when the peer acknowledges it (`acked`), read
    /// with [`take_tx_stamps`](Tcp::take_tx_stamps). Nothing when no
    /// byte waits. Bounded per connection ([`crate::socket::tcp::conn::MAX_STAMPS`]).
    pub fn stamp_last_byte(
        &mut self,
        h: TcpHandle,
        now: Instant,
        key: u32,
        sent: bool,
        acked: bool,
    ) -> Result<(), Error> {
        self.table.stamp_last_byte(h, now, key, sent, acked)
    }

    /// The transmit timestamps taken since the last call, oldest first.
    pub fn take_tx_stamps(&mut self, h: TcpHandle) -> Result<Vec<TxStamp>, Error> {
        self.table.take_tx_stamps(h)
    }

    /// `TCP_MAXSEG`: segments of at most `mss` bytes (of payload and
    /// options) both ways: the MSS option our SYN announces (set it before
    /// the first poll after [`connect`](Tcp::connect)) and the largest
    /// segment we send. It only lowers what the path and the peer allow.
    pub fn set_max_segment(&mut self, h: TcpHandle, mss: usize) -> Result<(), Error> {
        self.table.set_max_segment(h, mss)
    }

    /// `TCP_MAXSEG` on a listener: its connections announce and send
    /// segments of at most `mss` bytes ([`set_max_segment`](Tcp::set_max_segment)).
    pub fn set_listener_max_segment(&mut self, l: ListenHandle, mss: usize) -> Result<(), Error> {
        self.table.set_listener_max_segment(l, mss)
    }

    /// `TCP_NODELAY`: with `on`, small segments leave at once instead of
    /// waiting for the previous one's acknowledgment (Nagle off).
    pub fn set_nodelay(&mut self, h: TcpHandle, on: bool) -> Result<(), Error> {
        self.table.set_nagle(h, !on)
    }

    /// `SO_KEEPALIVE` with `TCP_KEEPIDLE`/`KEEPINTVL`/`KEEPCNT`, from
    /// `now`: probe an idle connection and reset it (`TimedOut`) when the
    /// peer is gone; `None` turns it off.
    pub fn set_keepalive(
        &mut self,
        now: Instant,
        h: TcpHandle,
        ka: Option<KeepAlive>,
    ) -> Result<(), Error> {
        self.table.set_keepalive(now, h, ka)
    }

    /// `TCP_USER_TIMEOUT` (RFC 5482): when sent data stays unacknowledged
    /// longer than `timeout`, the connection fails with `TimedOut` (the
    /// retransmission count no longer limits it); `None` turns it off.
    pub fn set_user_timeout(
        &mut self,
        h: TcpHandle,
        timeout: Option<Duration>,
    ) -> Result<(), Error> {
        self.table.set_user_timeout(h, timeout)
    }

    /// Send what is queued now, once, past cork, `MSG_MORE` and Nagle
    /// (setting `TCP_NODELAY` does so on Linux).
    pub fn push(&mut self, h: TcpHandle) -> Result<(), Error> {
        self.table.push(h)
    }

    /// `MSG_MORE`: while on (the last send said more follows), its tail
    /// is held as under `TCP_CORK`; turning it off sends it.
    pub fn set_more(&mut self, h: TcpHandle, on: bool) -> Result<(), Error> {
        self.table.set_more(h, on)
    }

    /// `TCP_CORK`: while on, only full-sized segments leave; turning it
    /// off sends what was held.
    pub fn set_cork(&mut self, h: TcpHandle, on: bool) -> Result<(), Error> {
        self.table.set_cork(h, on)
    }

    /// End a record after the bytes queued so far (`MSG_EOR`): no
    /// segment, new or retransmitted, carries bytes from both sides.
    pub fn end_record(&mut self, h: TcpHandle) -> Result<(), Error> {
        self.table.end_record(h)
    }

    /// Reset the connection (RST) and release the handle.
    pub fn abort(&mut self, h: TcpHandle) -> Result<(), Error> {
        self.table.abort(h)
    }
}

impl<'a> TcpRef<'a> {
    pub(crate) fn new(table: &'a TcpTable) -> Self {
        TcpRef { table }
    }

    /// Established connections waiting for [`accept`](Tcp::accept) on a listener.
    pub fn pending_accepts(&self, l: ListenHandle) -> Result<usize, Error> {
        self.table.pending_accepts(l)
    }

    /// Copy received bytes without taking them (a later `recv` returns
    /// them again): `MSG_PEEK`.
    pub fn peek(&self, h: TcpHandle, buf: &mut [u8]) -> Result<usize, Error> {
        self.table.peek(h, buf)
    }

    /// Readiness and end of stream of a connection.
    pub fn status(&self, h: TcpHandle) -> Result<TcpStatus, Error> {
        self.table.status(h)
    }

    /// Telemetry view of one connection.
    pub fn info(&self, h: TcpHandle) -> Option<ConnInfo> {
        self.table.info(h)
    }
    /// When one connection last sent and received, and how long it spent
    /// sending, as of `now` (Linux's `tcp_info` times).
    pub fn times(&self, h: TcpHandle, now: Instant) -> Option<ConnTimes> {
        self.table.times(h, now)
    }
    /// Telemetry view of every connection.
    pub fn connections(&self) -> impl Iterator<Item = ConnInfo> + 'a {
        self.table.connections()
    }
}
