//! The in-loop TCP API of [`Stack`]: listen, accept, connect, send, recv,
//! shutdown, close, abort, status.

use std::net::SocketAddrV4;

use super::conn::{ConnError, ConnInfo, State, TcpConn};
use super::{ListenHandle, Listener, TcpHandle, local};
use crate::stack::{Error, Stack};

/// What an app polls for: readiness and end of stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpStatus {
    pub state: State,
    /// Bytes ready to read.
    pub readable: usize,
    /// Bytes that can be written now.
    pub writable: usize,
    /// Bytes written and not yet acknowledged.
    pub unacked: usize,
    /// The peer closed its side and everything was read.
    pub eof: bool,
    /// The connection ended abnormally.
    pub error: Option<ConnError>,
}

impl TcpStatus {
    /// The connection can carry no more data in either direction.
    pub fn closed(&self) -> bool {
        matches!(self.state, State::Closed | State::TimeWait)
    }
}

impl Stack {
    /// Listen on `port` with room for `backlog` connections waiting for
    /// `accept` (beyond it, SYN cookies answer).
    pub fn tcp_listen(&mut self, port: u16, backlog: usize) -> Result<ListenHandle, Error> {
        if port == 0 {
            return Err(Error::NoFreePort);
        }
        if self.tcp.listeners.contains_key(&port) {
            return Err(Error::AddrInUse);
        }
        self.tcp.listeners.insert(
            port,
            Listener {
                backlog: backlog.max(1),
                ready: Default::default(),
                embryonic: 0,
            },
        );
        Ok(ListenHandle(port))
    }

    /// Stop listening; connections already accepted are unaffected.
    pub fn tcp_unlisten(&mut self, l: ListenHandle) {
        if let Some(lst) = self.tcp.listeners.remove(&l.0) {
            for slot in lst.ready {
                if let Some(c) = self
                    .tcp
                    .slots
                    .get_mut(slot as usize)
                    .and_then(|s| s.conn.as_mut())
                {
                    c.abort();
                }
                self.tcp.mark_dirty(slot);
            }
        }
    }

    /// The next established connection on a listener.
    pub fn tcp_accept(&mut self, l: ListenHandle) -> Result<Option<TcpHandle>, Error> {
        let lst = self
            .tcp
            .listeners
            .get_mut(&l.0)
            .ok_or(Error::InvalidHandle)?;
        let Some(slot) = lst.ready.pop_front() else {
            return Ok(None);
        };
        let s = &mut self.tcp.slots[slot as usize];
        s.released = false;
        s.listener = None;
        Ok(Some(self.tcp.handle(slot)))
    }

    /// Open a connection to `remote` from an ephemeral port; the SYN leaves on the next poll.
    pub fn tcp_connect(&mut self, remote: SocketAddrV4) -> Result<TcpHandle, Error> {
        let (me, shard) = (self.ip(), self.link.cfg.shard);
        let port = (self.tcp)
            .pick_port(remote, |p| shard.owns_tcp(me, p, remote))
            .ok_or(Error::NoFreePort)?;
        let local = local(self.ip(), port);
        let iss = self.tcp.isn(self.now, local, remote);
        let conn = TcpConn::connect(self.tcp.cfg.clone(), local, remote, iss);
        let slot = self.tcp.insert(conn, None);
        self.tcp.slots[slot as usize].released = false;
        self.tcp.stats.active_opens += 1;
        Ok(self.tcp.handle(slot))
    }

    fn conn_mut(&mut self, h: TcpHandle) -> Result<&mut TcpConn, Error> {
        self.tcp.get_mut(h).ok_or(Error::InvalidHandle)
    }

    /// Queue bytes; returns how many fit in the send buffer (0 when full).
    pub fn tcp_send(&mut self, h: TcpHandle, data: &[u8]) -> Result<usize, Error> {
        let c = self.conn_mut(h)?;
        if let Some(e) = c.error() {
            return Err(Error::Tcp(e));
        }
        if c.send_capacity() == 0
            && matches!(
                c.state(),
                State::Closed
                    | State::FinWait1
                    | State::FinWait2
                    | State::Closing
                    | State::LastAck
                    | State::TimeWait
            )
        {
            return Err(Error::Closed);
        }
        let n = c.send(data);
        if n > 0 {
            self.tcp.mark_dirty(h.slot);
        }
        Ok(n)
    }

    /// Read received bytes (0 when none are ready; see [`TcpStatus::eof`]).
    pub fn tcp_recv(&mut self, h: TcpHandle, buf: &mut [u8]) -> Result<usize, Error> {
        let c = self.conn_mut(h)?;
        let n = c.recv(buf);
        if n == 0 {
            if let Some(e) = c.error() {
                return Err(Error::Tcp(e));
            }
        } else {
            self.tcp.mark_dirty(h.slot);
        }
        Ok(n)
    }

    pub fn tcp_status(&self, h: TcpHandle) -> Result<TcpStatus, Error> {
        let c = self.tcp.get(h).ok_or(Error::InvalidHandle)?;
        Ok(TcpStatus {
            state: c.state(),
            readable: c.recv_available(),
            writable: c.send_capacity(),
            unacked: c.send_queued(),
            eof: c.recv_finished(),
            error: c.error(),
        })
    }

    /// Telemetry view of one connection.
    pub fn tcp_info(&self, h: TcpHandle) -> Option<ConnInfo> {
        self.tcp.get(h).map(TcpConn::info)
    }

    /// Telemetry view of every connection.
    pub fn tcp_connections(&self) -> impl Iterator<Item = ConnInfo> + '_ {
        self.tcp
            .slots
            .iter()
            .filter_map(|s| s.conn.as_ref())
            .map(TcpConn::info)
    }

    /// Close the sending side (FIN after queued data); the handle stays valid
    /// to read what the peer still sends.
    pub fn tcp_shutdown(&mut self, h: TcpHandle) -> Result<(), Error> {
        self.conn_mut(h)?.close();
        self.tcp.mark_dirty(h.slot);
        Ok(())
    }

    /// Close and release the handle: queued data is still delivered, then
    /// FIN; the connection finishes (TIME_WAIT included) on its own. As on
    /// Linux, received data the app never read, or data that arrives after
    /// the close, resets the connection instead (RFC 1122 4.2.2.13), and a
    /// peer that never sends its FIN is reset after
    /// `TcpConfig::fin_wait2_timeout`.
    pub fn tcp_close(&mut self, h: TcpHandle) -> Result<(), Error> {
        let now = self.now;
        self.conn_mut(h)?.release(now);
        self.tcp.slots[h.slot as usize].released = true;
        self.tcp.mark_dirty(h.slot);
        Ok(())
    }

    /// Reset the connection (RST) and release the handle.
    pub fn tcp_abort(&mut self, h: TcpHandle) -> Result<(), Error> {
        self.conn_mut(h)?.abort();
        self.tcp.slots[h.slot as usize].released = true;
        self.tcp.mark_dirty(h.slot);
        Ok(())
    }
}
