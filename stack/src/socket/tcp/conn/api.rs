//! The app-facing calls: reading and writing, closing, shutting down and
//! aborting, and per-connection options (Nagle, cork, keepalive, user
//! timeout).

use std::time::Duration;

use super::super::time_wait::TimeWait;
use super::timers::Timer;
use super::{KeepAlive, State, TcpConn, TxStamp};
use crate::error::ConnError;
use crate::socket::tcp::seq::Seq;
use crate::time::Instant;

impl TcpConn {
    /// Out-of-order bytes held.
    pub fn ooo_bytes(&self) -> usize {
        self.rcv.buf.ooo_bytes()
    }

    /// Drop out-of-order data under memory pressure (the peer resends it).
    pub fn drop_ooo(&mut self) -> usize {
        let n = self.rcv.buf.drop_ooo();
        if n > 0 {
            self.stats.ooo_dropped += 1;
        }
        n
    }

    /// Bytes the app can read now.
    pub fn recv_available(&self) -> usize {
        self.rcv.buf.readable()
    }

    /// Whether the peer has closed its side and every byte was read.
    pub fn recv_finished(&self) -> bool {
        self.rcv.peer_fin.is_some_and(|f| self.rcv.nxt.diff(f) > 0) && self.rcv.buf.readable() == 0
    }

    /// Copy received bytes out without consuming them (`MSG_PEEK`).
    pub fn peek(&self, dst: &mut [u8]) -> usize {
        self.rcv.buf.peek(dst)
    }

    /// Read received bytes. Opening the window may trigger a window update.
    pub fn recv(&mut self, dst: &mut [u8]) -> usize {
        let n = self.rcv.buf.read(dst);
        self.after_read(n);
        n
    }

    /// Zero-copy read: `f` sees received bytes in place (those that lie in
    /// one piece of the ring; call again for the rest) and returns how many
    /// it consumed, with a value of its own. As [`recv`](Self::recv) for
    /// the window.
    pub fn recv_with<R>(&mut self, f: impl FnOnce(&[u8]) -> (usize, R)) -> (usize, R) {
        let (n, r) = self.rcv.buf.read_with(f);
        self.after_read(n);
        (n, r)
    }

    /// Bytes the app can write now.
    pub fn send_capacity(&self) -> usize {
        if self.snd.fin_queued
            || !matches!(
                self.state,
                State::SynSent | State::SynReceived | State::Established | State::CloseWait
            )
        {
            return 0;
        }
        self.snd.buf.free()
    }

    /// Nagle's algorithm on or off for this connection (off is TCP_NODELAY).
    pub fn set_nagle(&mut self, on: bool) {
        self.cfg.nagle = on;
    }

    /// Whether Nagle's algorithm is on.
    pub fn nagle(&self) -> bool {
        self.cfg.nagle
    }

    /// TCP_CORK: while set, only full-sized segments of new data leave (a
    /// FIN, or uncorking, sends the rest).
    pub fn set_cork(&mut self, on: bool) {
        self.snd.corked = on;
    }

    /// `MSG_MORE`: the app says more data follows this send, so its tail
    /// is held as under [`set_cork`](Self::set_cork) until a send
    /// without it (`false`) or the persist timer (as Linux, at most an
    /// RTO).
    pub fn set_more(&mut self, on: bool) {
        self.snd.more = on;
    }

    /// Send what is queued now, once, past cork, `MSG_MORE` and Nagle
    /// (what setting `TCP_NODELAY` does on Linux, corked or not).
    pub fn push(&mut self) {
        self.snd.push = true;
    }

    /// Whether the connection is corked.
    pub fn corked(&self) -> bool {
        self.snd.corked
    }

    /// Let new data leave in TCP segments of up to `max` bytes of IP
    /// packet that are cut into frames (by the port: TSO; by the stack
    /// when the port cannot: GSO); 0 turns it off.
    pub fn set_tso_max(&mut self, max: usize) {
        self.snd.tso_max = max;
    }

    /// Free send space at which a writer that found the buffer full is told
    /// it may write again: a quarter of the buffer, at most 64 KiB.
    pub fn send_low_water(&self) -> usize {
        (self.snd.buf.capacity() / 4).clamp(1, 64 << 10)
    }

    /// End a record (`MSG_EOR`) after the bytes queued so far: the
    /// segment holding the record's last byte ends there, new or
    /// retransmitted. At most 1024 records wait unacknowledged (the
    /// oldest mark is dropped past that).
    pub fn end_record(&mut self) {
        let end = self.snd.data_start + self.snd.buf.len();
        if self.snd.buf.is_empty() || self.snd.records.back() == Some(&end) {
            return;
        }
        if self.snd.records.len() >= 1024 {
            self.snd.records.pop_front();
        }
        self.snd.records.push_back(end);
    }

    /// Queue bytes to send; returns how many were taken.
    pub fn send(&mut self, data: &[u8]) -> usize {
        if self.send_capacity() == 0 {
            return 0;
        }
        self.note_write();
        self.snd.buf.write(data)
    }

    /// A write with nothing in flight may follow idle time
    /// ([`TcpConn::restart_after_idle`]); the first write of a Fast Open
    /// client with a cookie lets its SYN go, carrying the data.
    fn note_write(&mut self) {
        if self.snd.max == self.snd.una {
            self.snd.wrote_when_idle = true;
        }
        if std::mem::take(&mut self.fast_open.deferred) {
            self.owed.send_syn = true;
        }
    }

    /// Zero-copy send: `f` writes into the send ring in place (the free
    /// space that lies in one piece; empty when nothing may be sent now)
    /// and returns how many bytes it wrote, with a value of its own.
    pub fn send_with<R>(&mut self, f: impl FnOnce(&mut [u8]) -> (usize, R)) -> (usize, R) {
        if self.send_capacity() == 0 {
            return f(&mut []);
        }
        self.note_write();
        self.snd.buf.write_with(f)
    }

    /// Ask for transmit timestamps of the last byte queued so far, known
    /// to the app as `key`: when it first leaves (`sent`) and when the
    /// peer acknowledges it (`acked`); [`take_tx_stamps`](Self::take_tx_stamps)
    /// reads them. Nothing when no byte is queued.
    pub fn stamp_last_byte(&mut self, now: Instant, key: u32, sent: bool, acked: bool) {
        let end = self.snd.data_start + self.snd.buf.len();
        if self.snd.buf.is_empty() || end.diff(self.snd.una) <= 0 {
            return;
        }
        let (nxt, una) = (self.snd.max, self.snd.una);
        self.tx_stamps
            .request(now, end - 1, key, sent, acked, nxt, una);
    }

    /// The transmit timestamps taken since the last call, oldest first.
    pub fn take_tx_stamps(&mut self) -> Vec<TxStamp> {
        self.tx_stamps.take()
    }

    /// Bytes written and not yet acknowledged.
    pub fn send_queued(&self) -> usize {
        self.snd.buf.len()
    }

    /// Close the sending side (FIN after queued data).
    pub fn close(&mut self) {
        match self.state {
            // Nothing was sent yet: there is nobody to say goodbye to.
            State::SynSent if self.snd.buf.is_empty() => {
                self.state = State::Closed;
                self.clear_timers();
            }
            // The FIN (after the queued data) waits for the handshake to finish.
            State::SynSent | State::SynReceived => self.snd.fin_queued = true,
            State::Established => {
                self.snd.fin_queued = true;
                self.state = State::FinWait1;
            }
            State::CloseWait => {
                self.snd.fin_queued = true;
                self.state = State::LastAck;
            }
            _ => {}
        }
    }

    /// The app closed the connection entirely (not a half-close): it will
    /// read nothing more. RFC 1122 4.2.2.13: data still unread, or data that
    /// arrives from now on, is lost, so the connection is reset to say so
    /// (as Linux does); otherwise it closes as [`close`](Self::close) does,
    /// and if the peer never sends its FIN, FIN-WAIT-2 ends after
    /// `fin_wait2_timeout` with a RST.
    pub fn release(&mut self, now: Instant) {
        self.orphaned = true;
        let handed_out = self.state.synchronized() || self.fast_open_pending();
        if self.rcv.buf.readable() > 0 && handed_out {
            self.reset_orphan(None);
            return;
        }
        self.close();
        self.arm_fin_wait2(now);
    }

    /// Reset an orphaned connection that lost data; `ack` is the offending
    /// segment's acknowledgment (the peer's next expected sequence number):
    /// the reset answers that segment as RFC 9293 3.10.7.1 forms one,
    /// `<SEQ=SEG.ACK><CTL=RST>` without the ACK flag (Linux's, from the
    /// segment). Without one (the app closed with unread data), an active
    /// reset with the ACK flag, as Linux's.
    pub(super) fn reset_orphan(&mut self, ack: Option<Seq>) {
        self.owed.rst_pending = Some(match ack {
            Some(ack) => (ack, None),
            None => (self.snd.nxt, Some(self.rcv.nxt)),
        });
        self.error = Some(ConnError::Aborted);
        self.state = State::Closed;
        self.clear_timers();
    }

    /// Abort: send RST (if synchronized) and close at once.
    pub fn abort(&mut self) {
        // With the ACK flag, as Linux's active resets carry it.
        if self.state.synchronized() || self.state == State::SynReceived {
            self.owed.rst_pending = Some((self.snd.nxt, Some(self.rcv.nxt)));
        }
        self.error = Some(ConnError::Aborted);
        self.state = State::Closed;
    }

    /// Whether the connection can be forgotten (closed and nothing left to send).
    pub fn is_finished(&self) -> bool {
        self.state == State::Closed && self.owed.rst_pending.is_none()
    }

    /// In TIME-WAIT with nothing owed to the peer: what the small record
    /// that replaces the connection keeps ([`super::time_wait`]); the
    /// record expires when the connection's 2 MSL would have.
    pub(crate) fn time_wait_record(&self, now: Instant) -> Option<TimeWait> {
        if self.state != State::TimeWait || self.owed.ack_now || self.owed.rst_pending.is_some() {
            return None;
        }
        let window = self.rcv.adv.since(self.rcv.nxt) >> self.rcv.wscale;
        Some(TimeWait {
            snd_nxt: self.snd.nxt,
            rcv_nxt: self.rcv.nxt,
            window: u16::try_from(window).unwrap_or(u16::MAX),
            ts: self
                .opts
                .ts_enabled
                .then_some((self.opts.ts_offset, self.opts.ts_recent)),
            expires: self
                .timers
                .get(Timer::TimeWait)
                .unwrap_or(now + self.cfg.time_wait),
        })
    }

    /// Turn keepalive on (with its timings) or off; idle time counts from
    /// the peer's last segment, or from `now` if later.
    pub fn set_keepalive(&mut self, now: Instant, ka: Option<KeepAlive>) {
        self.live.keepalive = ka;
        self.live.ka_probes = 0;
        self.live.ka_pending = false;
        // `last_rx` serves keepalive alone: counting from now changes
        // nothing else (Linux restarts the timer when the option is set).
        self.live.last_rx = self.live.last_rx.max(now);
    }

    /// Whether keepalive is on.
    pub fn keepalive(&self) -> Option<KeepAlive> {
        self.live.keepalive
    }

    /// `TCP_USER_TIMEOUT` (RFC 5482, as Linux does it): when data sent
    /// stays unacknowledged for longer than `timeout`, the connection
    /// fails with `TimedOut` (and a reset), however many retransmissions
    /// that took; while it is set it replaces the retransmission count
    /// limit. `None` (or zero, Linux's "use the default") turns it off.
    pub fn set_user_timeout(&mut self, timeout: Option<Duration>) {
        self.live.user_timeout = timeout.filter(|t| !t.is_zero());
    }

    /// The user timeout, when set.
    pub fn user_timeout(&self) -> Option<Duration> {
        self.live.user_timeout
    }
}
