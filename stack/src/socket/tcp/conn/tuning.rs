//! Receive-buffer autotuning and the window we advertise (receiver SWS
//! avoidance, never shrinking the right edge).

use std::time::Duration;

use super::TcpConn;
use crate::socket::tcp::seq::Seq;
use crate::time::Instant;

/// The receiver's side of window autotuning, after Linux's
/// `tcp_rcv_rtt_measure` and `tcp_rcv_space_adjust`: the receiver's RTT is
/// the time the peer takes to fill the window we advertised, and once per
/// such RTT the bytes the app read in it are compared with the last
/// measure; when they grow, the buffer should hold twice that (the window
/// must stay ahead of the sender's congestion window).
#[derive(Debug, Default)]
pub(super) struct RcvTune {
    /// The right edge we advertised when timing started, and when.
    rtt_mark: Option<(Seq, Instant)>,
    /// Smallest receiver RTT measured.
    rtt: Option<Duration>,
    /// Bytes the app has read in all.
    read: u64,
    /// `read` and the time at the start of the current measure.
    space_mark: (u64, Instant),
    /// Most bytes the app read in one receiver RTT.
    space: u64,
    /// A larger buffer asked of the stack (granted by [`TcpConn::grow_rcvbuf`]).
    want: Option<usize>,
}

impl TcpConn {
    /// The app took `n` bytes: autotuning's count, and a window update
    /// when the opening is worth one.
    pub(super) fn after_read(&mut self, n: usize) {
        self.rcv.tune.read += n as u64;
        if n > 0 && self.state.synchronized() {
            let advertised = self.rcv.adv.since(self.rcv.nxt);
            let could = self.advertisable_window();
            // Receiver SWS avoidance: announce the opening only when it is
            // worth a segment and the peer's view is less than half of it.
            if advertised < could / 2
                && could - advertised >= (self.rcv.buf.capacity() / 2).min(self.snd.mss)
            {
                self.owed.ack_now = true;
            }
        }
    }

    /// Receive window we could advertise now: the buffer's free space less
    /// a reserve for [`window_to_advertise`]'s rounding up, which moves the
    /// edge on by up to a window-scale unit per ACK while the window
    /// closes (never shrinking it): a sixteenth of the ring, at most 64
    /// units, at least one. Past the reserve (a very long fill with no
    /// read), bytes the ring cannot take are dropped and resent, as Linux
    /// does, rather than the window shrunk.
    ///
    /// [`window_to_advertise`]: Self::window_to_advertise
    pub(super) fn advertisable_window(&self) -> usize {
        let max = usize::from(u16::MAX) << self.rcv.wscale;
        let reserve = if self.rcv.wscale == 0 {
            0
        } else {
            (self.rcv.buf.capacity() / 16)
                .min(64 << self.rcv.wscale)
                .max((1 << self.rcv.wscale) - 1)
        };
        self.rcv.buf.window().saturating_sub(reserve).min(max)
    }

    /// The window field for an outgoing segment; moves `rcv_adv` forward only
    /// and only by useful amounts (SWS avoidance), and does not shrink the
    /// window (RFC 9293 3.8.6): the field is the distance to `rcv_adv`
    /// rounded up to a whole window-scale unit, since rounding down would
    /// move the right edge the peer sees to the left whenever `rcv_nxt`
    /// advances by other than whole units. The edge so announced becomes
    /// `rcv_adv` (as Linux does; RFC 7323 appendix F describes the effect),
    /// within the ring's free space.
    pub(super) fn window_to_advertise(&mut self) -> u16 {
        let new_edge = self.rcv.nxt + self.advertisable_window();
        let grow = new_edge.since(self.rcv.adv);
        if self.rcv.adv.diff(self.rcv.nxt) < 0
            || grow >= (self.rcv.buf.capacity() / 2).min(self.snd.mss)
        {
            self.rcv.adv = new_edge;
        }
        let edge = self.rcv.adv.since(self.rcv.nxt);
        let field = edge
            .div_ceil(1 << self.rcv.wscale)
            .min(usize::from(u16::MAX));
        self.rcv.adv = self.rcv.nxt + (field << self.rcv.wscale);
        field as u16
    }

    /// After in-order data arrived: time the receiver RTT, and once per RTT
    /// ask for a larger buffer when the app read more than before.
    pub(super) fn autotune(&mut self, now: Instant) {
        let t = &mut self.rcv.tune;
        match t.rtt_mark {
            Some((edge, at)) if self.rcv.nxt.diff(edge) >= 0 => {
                let sample = now.saturating_duration_since(at);
                if !sample.is_zero() {
                    t.rtt = Some(t.rtt.map_or(sample, |r| r.min(sample)));
                }
                t.rtt_mark = Some((self.rcv.adv, now));
            }
            Some(_) => {}
            None => {
                t.rtt_mark = Some((self.rcv.adv, now));
                t.space_mark = (t.read, now);
            }
        }
        let Some(rtt) = t.rtt else { return };
        if now.saturating_duration_since(t.space_mark.1) < rtt {
            return;
        }
        let copied = t.read - t.space_mark.0;
        t.space_mark = (t.read, now);
        if copied <= t.space {
            return;
        }
        // Twice what the app read in one RTT, and twice the growth again
        // while it is growing fast (the sender is in slow start).
        let grow = copied - t.space;
        let mut target = 2 * copied + 16 * self.snd.mss as u64;
        if t.space > 0 {
            target += 2 * target * grow / t.space.max(1);
        }
        t.space = copied;
        let max = self.cfg.recv_buffer_max as u64;
        let target = target.min(max) as usize;
        if target > self.rcv.buf.capacity() {
            t.want = Some(target);
        }
    }

    /// The larger receive buffer autotuning asks for, if any (the stack
    /// grants it within its memory limit with [`grow_rcvbuf`](Self::grow_rcvbuf)).
    pub fn take_rcvbuf_request(&mut self) -> Option<usize> {
        self.rcv.tune.want.take()
    }

    /// Receive buffer size now.
    pub fn rcvbuf_capacity(&self) -> usize {
        self.rcv.buf.capacity()
    }

    /// Grow the receive buffer to `capacity` bytes: the window opens by the
    /// difference on the next segment we send.
    pub fn grow_rcvbuf(&mut self, capacity: usize) {
        self.rcv
            .buf
            .grow(capacity.min(self.cfg.recv_buffer_max.max(self.cfg.recv_buffer)));
    }
}
