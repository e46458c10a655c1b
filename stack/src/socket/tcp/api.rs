//! The TCP app API on the table: listen, accept, connect, send, recv,
//! shutdown, close, abort, status (the `Stack`'s `tcp_*` methods call these).

use core::net::{IpAddr, SocketAddr};

use super::conn::{ConnInfo, ConnTimes, KeepAlive, State, TcpConn, TxStamp};
use super::{Family, ListenHandle, Listener, TcpHandle, TcpTable, local};
use crate::error::{ConnError, Error};
use crate::events::Pending;
use crate::shard::ShardId;
use crate::time::Instant;

/// What an app polls for: readiness and end of stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TcpStatus {
    /// RFC 9293 state.
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

impl TcpTable {
    /// Listen on `port` for peers of `family` with room for `backlog`
    /// connections waiting for `accept` (beyond it, SYN cookies answer).
    /// `AddrInUse` when a listener there takes peers of the same family.
    pub fn listen(
        &mut self,
        port: u16,
        backlog: usize,
        family: Family,
    ) -> Result<ListenHandle, Error> {
        if port == 0 {
            return Err(Error::NoFreePort);
        }
        let taken = [Family::Both, Family::V4, Family::V6].into_iter().any(|f| {
            f.overlaps(family)
                && self
                    .listeners
                    .contains_key(&ListenHandle { port, family: f })
        });
        if taken {
            return Err(Error::AddrInUse);
        }
        let handle = ListenHandle { port, family };
        self.listeners.insert(
            handle,
            Listener {
                backlog: backlog.max(1),
                ready: Default::default(),
                embryonic: 0,
                fast_open: 0,
                fast_open_pending: 0,
                max_segment: None,
                events: Pending::default(),
            },
        );
        Ok(handle)
    }

    /// Fast Open's queue length on a listener ([`super::Tcp::set_fast_open`]).
    pub fn set_fast_open(&mut self, l: ListenHandle, queue: usize) -> Result<(), Error> {
        let lst = self.listeners.get_mut(&l).ok_or(Error::InvalidHandle)?;
        lst.fast_open = queue;
        Ok(())
    }

    /// Stop listening; connections already accepted are unaffected. Those
    /// not yet accepted (established or half-open) are reset: nobody will
    /// accept them. (A scan over the slots, once per listener closed.)
    pub fn unlisten(&mut self, l: ListenHandle) {
        if self.listeners.remove(&l).is_none() {
            return;
        }
        self.listener_events.retain(|&h| h != l);
        for slot in 0..self.slots.len() as u32 {
            let s = &mut self.slots[slot as usize];
            if s.listener != Some(l) {
                continue;
            }
            s.listener = None;
            s.embryonic = false;
            if let Some(c) = s.conn.as_mut() {
                c.abort();
            }
            self.mark_dirty(slot);
        }
    }

    /// Established connections waiting for `accept` on a listener.
    pub fn pending_accepts(&self, l: ListenHandle) -> Result<usize, Error> {
        (self.listeners.get(&l))
            .map(|lst| lst.ready.len())
            .ok_or(Error::InvalidHandle)
    }

    /// The next established connection on a listener.
    pub fn accept(&mut self, l: ListenHandle) -> Result<Option<TcpHandle>, Error> {
        let lst = self.listeners.get_mut(&l).ok_or(Error::InvalidHandle)?;
        let Some(slot) = lst.ready.pop_front() else {
            return Ok(None);
        };
        let s = &mut self.slots[slot as usize];
        s.released = false;
        s.listener = None;
        Ok(Some(self.handle(slot)))
    }

    /// Open a connection from `me` (an ephemeral port whose flow hashes to
    /// `shard`) to `remote`; the SYN leaves on the next poll.
    pub fn connect(
        &mut self,
        now: Instant,
        me: IpAddr,
        shard: ShardId,
        remote: SocketAddr,
    ) -> Result<TcpHandle, Error> {
        let port = self
            .pick_port(remote, |p| shard.owns_tcp(me, p, remote))
            .ok_or(Error::NoFreePort)?;
        self.open_from(now, me, port, remote)
    }

    /// Active open from a local port the app chose (`bind` then
    /// `connect`): `AddrInUse` when that flow exists already or a listener
    /// holds the port.
    pub fn connect_from(
        &mut self,
        now: Instant,
        me: IpAddr,
        port: u16,
        remote: SocketAddr,
    ) -> Result<TcpHandle, Error> {
        if port == 0 || !self.port_free(port, remote) {
            return Err(Error::AddrInUse);
        }
        self.open_from(now, me, port, remote)
    }

    fn open_from(
        &mut self,
        now: Instant,
        me: IpAddr,
        port: u16,
        remote: SocketAddr,
    ) -> Result<TcpHandle, Error> {
        let local = local(me, port);
        let iss = self.isn(now, local, remote);
        let mut conn = TcpConn::connect(self.cfg_for(&remote), local, remote, iss);
        conn.set_ts_offset(self.ts_offset(local, remote));
        let slot = self.insert(conn, None);
        self.slots[slot as usize].released = false;
        self.stats.active_opens += 1;
        Ok(self.handle(slot))
    }

    /// Make a connection just opened a TCP Fast Open client's (RFC 7413):
    /// with a cookie kept for its server, the SYN waits for the first
    /// write and carries its data (true: the app may write at once);
    /// without, the SYN asks for one. Before the SYN left only.
    pub fn fast_open_connect(&mut self, h: TcpHandle) -> Result<bool, Error> {
        let remote = self.conn_mut(h)?.remote();
        let cookie = self.fast_open_cookies.get(&remote.ip()).copied();
        let deferred = self.conn_mut(h)?.use_fast_open(cookie);
        self.mark_dirty(h.slot);
        Ok(deferred)
    }

    fn conn_mut(&mut self, h: TcpHandle) -> Result<&mut TcpConn, Error> {
        self.get_mut(h).ok_or(Error::InvalidHandle)
    }

    /// Queue bytes; returns how many fit in the send buffer (0 when full).
    pub fn send(&mut self, h: TcpHandle, data: &[u8]) -> Result<usize, Error> {
        self.send_op(h, |c| (c.send(data), ())).map(|(n, ())| n)
    }

    /// Zero-copy send ([`TcpConn::send_with`]); errors as [`send`](Self::send).
    pub fn send_with<R>(
        &mut self,
        h: TcpHandle,
        f: impl FnOnce(&mut [u8]) -> (usize, R),
    ) -> Result<(usize, R), Error> {
        self.send_op(h, |c| c.send_with(f))
    }

    fn send_op<R>(
        &mut self,
        h: TcpHandle,
        op: impl FnOnce(&mut TcpConn) -> (usize, R),
    ) -> Result<(usize, R), Error> {
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
        let (n, r) = op(c);
        if n > 0 {
            self.mark_dirty(h.slot);
        }
        Ok((n, r))
    }

    /// Read received bytes (0 when none are ready; see [`TcpStatus::eof`]).
    pub fn recv(&mut self, h: TcpHandle, buf: &mut [u8]) -> Result<usize, Error> {
        self.recv_op(h, |c| (c.recv(buf), ())).map(|(n, ())| n)
    }

    /// Zero-copy read ([`TcpConn::recv_with`]); errors as [`recv`](Self::recv).
    pub fn recv_with<R>(
        &mut self,
        h: TcpHandle,
        f: impl FnOnce(&[u8]) -> (usize, R),
    ) -> Result<(usize, R), Error> {
        self.recv_op(h, |c| c.recv_with(f))
    }

    fn recv_op<R>(
        &mut self,
        h: TcpHandle,
        op: impl FnOnce(&mut TcpConn) -> (usize, R),
    ) -> Result<(usize, R), Error> {
        let c = self.conn_mut(h)?;
        let (n, r) = op(c);
        if n == 0 {
            if let Some(e) = c.error() {
                return Err(Error::Tcp(e));
            }
        } else {
            self.mark_dirty(h.slot);
        }
        Ok((n, r))
    }

    /// Copy received bytes out and leave them to be read again; errors as
    /// [`recv`](Self::recv).
    pub fn peek(&self, h: TcpHandle, buf: &mut [u8]) -> Result<usize, Error> {
        let c = self.get(h).ok_or(Error::InvalidHandle)?;
        let n = c.peek(buf);
        if n == 0 {
            if let Some(e) = c.error() {
                return Err(Error::Tcp(e));
            }
        }
        Ok(n)
    }

    pub fn status(&self, h: TcpHandle) -> Result<TcpStatus, Error> {
        let c = self.get(h).ok_or(Error::InvalidHandle)?;
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
    pub fn info(&self, h: TcpHandle) -> Option<ConnInfo> {
        self.get(h).map(TcpConn::info)
    }

    /// When one connection last sent and received, and how long it spent
    /// sending, as of `now` ([`TcpConn::times`]).
    pub fn times(&self, h: TcpHandle, now: Instant) -> Option<ConnTimes> {
        self.get(h).map(|c| c.times(now))
    }

    /// Telemetry view of every connection.
    pub fn connections(&self) -> impl Iterator<Item = ConnInfo> + '_ {
        self.slots
            .iter()
            .filter_map(|s| s.conn.as_ref())
            .map(TcpConn::info)
    }

    /// Close the sending side (FIN after queued data); the handle stays valid
    /// to read what the peer still sends.
    pub fn shutdown(&mut self, h: TcpHandle) -> Result<(), Error> {
        self.conn_mut(h)?.close();
        self.mark_dirty(h.slot);
        Ok(())
    }

    /// Close and release the handle: queued data is still delivered, then
    /// FIN; the connection finishes (TIME_WAIT included) on its own. As on
    /// Linux, received data the app never read, or data that arrives after
    /// the close, resets the connection instead (RFC 1122 4.2.2.13), and a
    /// peer that never sends its FIN is reset after
    /// `TcpConfig::fin_wait2_timeout`.
    pub fn close(&mut self, now: Instant, h: TcpHandle) -> Result<(), Error> {
        self.conn_mut(h)?.release(now);
        self.slots[h.slot as usize].released = true;
        self.mark_dirty(h.slot);
        Ok(())
    }

    /// Transmit timestamps of the last byte queued ([`super::Tcp::stamp_last_byte`]).
    pub fn stamp_last_byte(
        &mut self,
        h: TcpHandle,
        now: Instant,
        key: u32,
        sent: bool,
        acked: bool,
    ) -> Result<(), Error> {
        self.conn_mut(h)?.stamp_last_byte(now, key, sent, acked);
        Ok(())
    }

    /// Transmit timestamps taken ([`super::Tcp::take_tx_stamps`]).
    pub fn take_tx_stamps(&mut self, h: TcpHandle) -> Result<Vec<TxStamp>, Error> {
        Ok(self.conn_mut(h)?.take_tx_stamps())
    }

    /// Events for every acknowledgment ([`super::Tcp::set_ack_events`]).
    pub fn set_ack_events(&mut self, h: TcpHandle, on: bool) -> Result<(), Error> {
        self.conn_mut(h)?.set_ack_events(on);
        Ok(())
    }

    /// `TCP_MAXSEG` on a connection ([`super::Tcp::set_max_segment`]).
    pub fn set_max_segment(&mut self, h: TcpHandle, mss: usize) -> Result<(), Error> {
        self.conn_mut(h)?.clamp_mss(mss);
        self.mark_dirty(h.slot);
        Ok(())
    }

    /// `TCP_MAXSEG` on a listener ([`super::Tcp::set_listener_max_segment`]).
    pub fn set_listener_max_segment(&mut self, l: ListenHandle, mss: usize) -> Result<(), Error> {
        let lst = self.listeners.get_mut(&l).ok_or(Error::InvalidHandle)?;
        lst.max_segment = Some(mss);
        Ok(())
    }

    /// Nagle's algorithm on or off (off is `TCP_NODELAY`).
    pub fn set_nagle(&mut self, h: TcpHandle, on: bool) -> Result<(), Error> {
        self.conn_mut(h)?.set_nagle(on);
        self.mark_dirty(h.slot);
        Ok(())
    }

    /// Keepalive on (with its timings) or off, from `now`.
    pub fn set_keepalive(
        &mut self,
        now: Instant,
        h: TcpHandle,
        ka: Option<KeepAlive>,
    ) -> Result<(), Error> {
        self.conn_mut(h)?.set_keepalive(now, ka);
        self.mark_dirty(h.slot);
        Ok(())
    }

    /// `TCP_USER_TIMEOUT`: how long sent data may stay unacknowledged
    /// before the connection fails with `TimedOut` (None: off).
    pub fn set_user_timeout(
        &mut self,
        h: TcpHandle,
        timeout: Option<std::time::Duration>,
    ) -> Result<(), Error> {
        self.conn_mut(h)?.set_user_timeout(timeout);
        self.mark_dirty(h.slot);
        Ok(())
    }

    /// End a record after the bytes queued so far (`MSG_EOR`): no
    /// segment carries bytes from both sides of it.
    pub fn end_record(&mut self, h: TcpHandle) -> Result<(), Error> {
        self.conn_mut(h)?.end_record();
        self.mark_dirty(h.slot);
        Ok(())
    }

    /// `TCP_CORK` on or off; uncorking sends what was held.
    pub fn set_cork(&mut self, h: TcpHandle, on: bool) -> Result<(), Error> {
        self.conn_mut(h)?.set_cork(on);
        self.mark_dirty(h.slot);
        Ok(())
    }

    /// Send what is queued now, once, past cork and Nagle
    /// ([`TcpConn::push`]).
    pub fn push(&mut self, h: TcpHandle) -> Result<(), Error> {
        self.conn_mut(h)?.push();
        self.mark_dirty(h.slot);
        Ok(())
    }

    /// `MSG_MORE` on a send or off; off sends what was held.
    pub fn set_more(&mut self, h: TcpHandle, on: bool) -> Result<(), Error> {
        self.conn_mut(h)?.set_more(on);
        self.mark_dirty(h.slot);
        Ok(())
    }

    /// Reset the connection (RST) and release the handle.
    pub fn abort(&mut self, h: TcpHandle) -> Result<(), Error> {
        self.conn_mut(h)?.abort();
        self.slots[h.slot as usize].released = true;
        self.mark_dirty(h.slot);
        Ok(())
    }
}
