//! When a connection last sent and received, and how long it spent
//! sending and what held it back: the times Linux's `tcp_info` reports
//! (`tcpi_last_data_sent`, `tcpi_last_data_recv`, `tcpi_last_ack_recv`,
//! `tcpi_busy_time`, `tcpi_rwnd_limited`). Linux's third limit, the app
//! waiting for send-buffer space (`tcpi_sndbuf_limited`), is not timed:
//! a send takes no `now` here.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::time::Instant;

/// What the sender is doing, in rising order: a higher state replaces a
/// lower one when it starts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Limit {
    /// Nothing queued or unacknowledged.
    #[default]
    Idle,
    /// Data queued or in flight, sent as the windows allow.
    Busy,
    /// New data waits for the peer's receive window.
    Rwnd,
}

/// The connection's clock of events and of time spent per [`Limit`].
#[derive(Debug, Default, Clone)]
pub(super) struct Chrono {
    limit: Limit,
    since: Instant,
    /// Time spent busy and receive-window limited.
    spent: [Duration; 2],
    /// New data last left.
    pub(super) data_sent: Option<Instant>,
    /// Data last arrived (or the connection was established).
    pub(super) data_recv: Option<Instant>,
    /// An acceptable ACK last arrived (or the connection was established).
    pub(super) ack_recv: Option<Instant>,
}

impl Chrono {
    /// The connection reached ESTABLISHED: the "last" times start there,
    /// as Linux's do.
    pub(super) fn established(&mut self, now: Instant) {
        self.data_sent = Some(now);
        self.data_recv = Some(now);
        self.ack_recv = Some(now);
    }

    fn set(&mut self, now: Instant, limit: Limit) {
        if self.limit != Limit::Idle {
            self.spent[self.limit as usize - 1] += now.saturating_duration_since(self.since);
        }
        self.limit = limit;
        self.since = now;
    }

    /// `limit` begins, unless a higher one is under way.
    pub(super) fn start(&mut self, now: Instant, limit: Limit) {
        if limit > self.limit {
            self.set(now, limit);
        }
    }

    /// `limit` ends: the connection is idle if nothing is queued or in
    /// flight (`drained`), else back to busy if `limit` was the one under
    /// way.
    pub(super) fn stop(&mut self, now: Instant, limit: Limit, drained: bool) {
        if drained {
            if self.limit != Limit::Idle {
                self.set(now, Limit::Idle);
            }
        } else if limit == self.limit && limit > Limit::Busy {
            self.set(now, Limit::Busy);
        }
    }

    /// The times as of `now`.
    pub(super) fn at(&self, now: Instant) -> ConnTimes {
        let mut spent = self.spent;
        if self.limit != Limit::Idle {
            spent[self.limit as usize - 1] += now.saturating_duration_since(self.since);
        }
        let ago = |t: Option<Instant>| {
            t.map_or(0, |t| {
                u32::try_from(now.saturating_duration_since(t).as_millis()).unwrap_or(u32::MAX)
            })
        };
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        ConnTimes {
            last_data_sent_ms: ago(self.data_sent),
            last_data_recv_ms: ago(self.data_recv),
            last_ack_recv_ms: ago(self.ack_recv),
            busy_us: spent.iter().copied().map(us).sum(),
            rwnd_limited_us: us(spent[1]),
        }
    }
}

/// When a connection last sent and received, and how long it spent
/// sending (Linux's `tcp_info` fields of the same names).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnTimes {
    /// Milliseconds since new data last left (0 before the handshake).
    pub last_data_sent_ms: u32,
    /// Milliseconds since data last arrived (or the handshake ended).
    pub last_data_recv_ms: u32,
    /// Milliseconds since an acceptable ACK last arrived.
    pub last_ack_recv_ms: u32,
    /// Microseconds with data queued or in flight, limited or not.
    pub busy_us: u64,
    /// Of which: new data waited for the peer's receive window.
    pub rwnd_limited_us: u64,
}

#[cfg(test)]
mod test {
    use super::*;

    fn ms(n: u64) -> Instant {
        Instant::ZERO + Duration::from_millis(n)
    }

    #[test]
    fn time_is_split_by_what_held_the_sender_back() {
        let mut c = Chrono::default();
        c.established(ms(0));
        // Written into a zero window: limited by it from the start.
        c.start(ms(10), Limit::Rwnd);
        c.start(ms(10), Limit::Busy);
        // The window opens: busy until the last ACK.
        c.stop(ms(210), Limit::Rwnd, false);
        c.stop(ms(240), Limit::Busy, true);
        let t = c.at(ms(300));
        assert_eq!(t.rwnd_limited_us, 200_000);
        assert_eq!(t.busy_us, 230_000);
        assert_eq!(t.last_data_recv_ms, 300);
        // Idle time counts for nothing; a stop of a limit not under way
        // changes nothing.
        c.start(ms(400), Limit::Busy);
        c.stop(ms(450), Limit::Rwnd, false);
        let t = c.at(ms(500));
        assert_eq!(t.rwnd_limited_us, 200_000);
        assert_eq!(t.busy_us, 330_000);
    }
}
