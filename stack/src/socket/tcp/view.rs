//! [`Tcp`]: the TCP app API, a view of a [`Stack`]'s connections and
//! listeners. `stack.tcp()` lends it mutably, `stack.tcp_ref()` read-only.
//! Each call acts at once; what it queues leaves on the next
//! [`Stack::poll`].

use core::borrow::{Borrow, BorrowMut};
use core::net::SocketAddrV4;
use std::time::Duration;

use super::{ConnInfo, KeepAlive, ListenHandle, TcpHandle, TcpStatus, TcpTable};
use crate::error::Error;
use crate::stack::Stack;
use crate::time::Instant;

/// The TCP sockets of a stack (`S` is `&Stack` or `&mut Stack`).
#[derive(Debug)]
pub struct Tcp<S> {
    stack: S,
}

impl<S> Tcp<S> {
    pub(crate) fn new(stack: S) -> Self {
        Tcp { stack }
    }
}

impl<S: Borrow<Stack>> Tcp<S> {
    fn table(&self) -> &TcpTable {
        &self.stack.borrow().tcp
    }

    /// Established connections waiting for [`accept`](Tcp::accept) on a listener.
    pub fn pending_accepts(&self, l: ListenHandle) -> Result<usize, Error> {
        self.table().pending_accepts(l)
    }

    /// Copy received bytes without taking them (a later `recv` returns
    /// them again): `MSG_PEEK`.
    pub fn peek(&self, h: TcpHandle, buf: &mut [u8]) -> Result<usize, Error> {
        self.table().peek(h, buf)
    }

    /// Readiness and end of stream of a connection.
    pub fn status(&self, h: TcpHandle) -> Result<TcpStatus, Error> {
        self.table().status(h)
    }

    /// Telemetry view of one connection.
    pub fn info(&self, h: TcpHandle) -> Option<ConnInfo> {
        self.table().info(h)
    }
}

impl<'a> Tcp<&'a Stack> {
    /// Telemetry view of every connection.
    pub fn connections(self) -> impl Iterator<Item = ConnInfo> + 'a {
        self.stack.tcp.connections()
    }
}

impl<S: BorrowMut<Stack>> Tcp<S> {
    fn table_mut(&mut self) -> &mut TcpTable {
        &mut self.stack.borrow_mut().tcp
    }

    /// Listen on `port` with room for `backlog` connections waiting for
    /// [`accept`](Tcp::accept) (beyond it, SYN cookies answer).
    pub fn listen(&mut self, port: u16, backlog: usize) -> Result<ListenHandle, Error> {
        self.table_mut().listen(port, backlog)
    }

    /// Stop listening: new SYNs to the port get a reset, and connections
    /// not yet accepted are reset; accepted ones are unaffected.
    pub fn unlisten(&mut self, l: ListenHandle) {
        self.table_mut().unlisten(l);
    }

    /// The next established connection on a listener.
    pub fn accept(&mut self, l: ListenHandle) -> Result<Option<TcpHandle>, Error> {
        self.table_mut().accept(l)
    }

    /// Open a connection to `remote` from an ephemeral port at `now`; the
    /// SYN leaves on the next poll.
    pub fn connect(&mut self, now: Instant, remote: SocketAddrV4) -> Result<TcpHandle, Error> {
        let stack = self.stack.borrow_mut();
        let (me, shard) = (stack.ip(), stack.link.cfg.shard);
        stack.tcp.connect(now, me, shard, remote)
    }

    /// Open a connection to `remote` from local `port` at `now` (`bind`
    /// then `connect`); `AddrInUse` when that flow exists or a listener
    /// holds the port. On a host with several shards the flow may hash to
    /// another shard: the app asked for the port.
    pub fn connect_from(
        &mut self,
        now: Instant,
        port: u16,
        remote: SocketAddrV4,
    ) -> Result<TcpHandle, Error> {
        let stack = self.stack.borrow_mut();
        let me = stack.ip();
        stack.tcp.connect_from(now, me, port, remote)
    }

    /// Queue bytes; returns how many fit in the send buffer (0 when full).
    pub fn send(&mut self, h: TcpHandle, data: &[u8]) -> Result<usize, Error> {
        self.table_mut().send(h, data)
    }

    /// Read received bytes (0 when none are ready; see [`TcpStatus::eof`]).
    pub fn recv(&mut self, h: TcpHandle, buf: &mut [u8]) -> Result<usize, Error> {
        self.table_mut().recv(h, buf)
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
        self.table_mut().send_with(h, f)
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
        self.table_mut().recv_with(h, f)
    }

    /// Close the sending side (FIN after queued data); the handle stays valid
    /// to read what the peer still sends.
    pub fn shutdown(&mut self, h: TcpHandle) -> Result<(), Error> {
        self.table_mut().shutdown(h)
    }

    /// Close at `now` and release the handle: queued data is still
    /// delivered, then FIN; the connection finishes (TIME_WAIT included)
    /// on its own. As on Linux, received data the app never read, or data
    /// that arrives after the close, resets the connection instead (RFC
    /// 1122 4.2.2.13), and a peer that never sends its FIN is reset after
    /// `TcpConfig::fin_wait2_timeout`.
    pub fn close(&mut self, now: Instant, h: TcpHandle) -> Result<(), Error> {
        self.table_mut().close(now, h)
    }

    /// `TCP_NODELAY`: with `on`, small segments leave at once instead of
    /// waiting for the previous one's acknowledgment (Nagle off).
    pub fn set_nodelay(&mut self, h: TcpHandle, on: bool) -> Result<(), Error> {
        self.table_mut().set_nagle(h, !on)
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
        self.table_mut().set_keepalive(now, h, ka)
    }

    /// `TCP_USER_TIMEOUT` (RFC 5482): when sent data stays unacknowledged
    /// longer than `timeout`, the connection fails with `TimedOut` (the
    /// retransmission count no longer limits it); `None` turns it off.
    pub fn set_user_timeout(
        &mut self,
        h: TcpHandle,
        timeout: Option<Duration>,
    ) -> Result<(), Error> {
        self.table_mut().set_user_timeout(h, timeout)
    }

    /// `TCP_CORK`: while on, only full-sized segments leave; turning it
    /// off sends what was held.
    pub fn set_cork(&mut self, h: TcpHandle, on: bool) -> Result<(), Error> {
        self.table_mut().set_cork(h, on)
    }

    /// Reset the connection (RST) and release the handle.
    pub fn abort(&mut self, h: TcpHandle) -> Result<(), Error> {
        self.table_mut().abort(h)
    }
}
