//! `SO_TIMESTAMPING` transmit timestamps on TCP sockets, as Linux gives
//! them: a send on a socket that asked for `SOF_TIMESTAMPING_TX_SCHED`,
//! `TX_SOFTWARE` or `TX_ACK` has its last byte stamped by the stack when
//! it first leaves (reported as `SCM_TSTAMP_SCHED` and `SCM_TSTAMP_SND`:
//! the stack hands the segment to the port at once, so both are that
//! moment) and when the peer acknowledges it (`SCM_TSTAMP_ACK`).
//! `recvmsg(MSG_ERRQUEUE)` reads each as an `SCM_TIMESTAMPING` control
//! message (the software time in the first `timespec`, `CLOCK_REALTIME`)
//! and an `IP_RECVERR` one (`ee_errno` `ENOMSG`, origin
//! `SO_EE_ORIGIN_TIMESTAMPING`, the kind in `ee_info`, and with
//! `SOF_TIMESTAMPING_OPT_ID` the byte's number in `ee_data`: counted from
//! the first byte not yet acknowledged when the option was set, or from
//! the next byte written with `OPT_ID_TCP`).
//!
//! Receive timestamps are not given (the stack's frames carry no
//! software receive stamp the program could be given yet).

use std::collections::VecDeque;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `SOF_TIMESTAMPING_TX_SOFTWARE`.
pub const TX_SOFTWARE: u32 = 1 << 1;
/// `SOF_TIMESTAMPING_OPT_ID`.
pub const OPT_ID: u32 = 1 << 7;
/// `SOF_TIMESTAMPING_TX_SCHED`.
pub const TX_SCHED: u32 = 1 << 8;
/// `SOF_TIMESTAMPING_TX_ACK`.
pub const TX_ACK: u32 = 1 << 9;
/// `SOF_TIMESTAMPING_OPT_TSONLY`: no data beside the stamp.
pub const OPT_TSONLY: u32 = 1 << 11;
/// `SOF_TIMESTAMPING_OPT_ID_TCP`: keys count from the next byte written.
pub const OPT_ID_TCP: u32 = 1 << 16;
/// The flags Linux knows (`SOF_TIMESTAMPING_MASK`, to `OPT_RX_FILTER`).
pub const KNOWN: u32 = (1 << 18) - 1;

/// `SCM_TSTAMP_SND`, `SCM_TSTAMP_SCHED`, `SCM_TSTAMP_ACK`.
pub const SND: u32 = 0;
/// See [`SND`].
pub const SCHED: u32 = 1;
/// See [`SND`].
pub const ACK: u32 = 2;

/// `SO_EE_ORIGIN_TIMESTAMPING`.
const ORIGIN_TIMESTAMPING: u8 = 4;

/// Most stamps kept unread (the oldest give way), as the stack keeps.
const MAX_READY: usize = 4096;

/// One stamp ready to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ready {
    /// `SCM_TSTAMP_*`.
    pub kind: u32,
    /// `ee_data`.
    pub key: u32,
    /// When, since the Unix epoch (`CLOCK_REALTIME`).
    pub at: Duration,
}

/// A socket's timestamping settings and its stamps not yet read.
#[derive(Debug, Default)]
pub struct Timestamping {
    /// The `SOF_TIMESTAMPING_*` flags set.
    pub flags: u32,
    /// With `OPT_ID`: the connection's byte count keys start from.
    pub base: u64,
    ready: VecDeque<Ready>,
}

impl Timestamping {
    /// Whether sends are stamped: (when they leave, when acknowledged).
    pub fn wants(&self) -> (bool, bool) {
        (
            self.flags & (TX_SCHED | TX_SOFTWARE) != 0,
            self.flags & TX_ACK != 0,
        )
    }

    /// The key of a send whose last byte is the connection's `end`th.
    pub fn key(&self, end: u64) -> u32 {
        if self.flags & OPT_ID == 0 {
            return 0;
        }
        end.saturating_sub(1).wrapping_sub(self.base) as u32
    }

    /// The stack stamped the send known as `key`: it left (`sent`: SCHED
    /// and SND, as asked) or was acknowledged, `ago` before `now`.
    pub fn stamped(&mut self, key: u32, sent: bool, ago: Duration, now: SystemTime) {
        let at = now
            .checked_sub(ago)
            .unwrap_or(now)
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let kinds: &[(u32, bool)] = if sent {
            &[
                (SCHED, self.flags & TX_SCHED != 0),
                (SND, self.flags & TX_SOFTWARE != 0),
            ]
        } else {
            &[(ACK, self.flags & TX_ACK != 0)]
        };
        for &(kind, on) in kinds {
            if !on {
                continue;
            }
            if self.ready.len() >= MAX_READY {
                self.ready.pop_front();
            }
            self.ready.push_back(Ready { kind, key, at });
        }
    }

    /// Whether a stamp waits to be read (`POLLERR`).
    pub fn pending(&self) -> bool {
        !self.ready.is_empty()
    }

    /// The oldest stamp.
    pub fn take(&mut self) -> Option<Ready> {
        self.ready.pop_front()
    }
}

impl Ready {
    /// The `sock_extended_err` of the `IP_RECVERR` control message.
    pub fn extended_err(&self) -> [u8; 16] {
        let mut e = [0u8; 16];
        e[..4].copy_from_slice(&(libc::ENOMSG as u32).to_ne_bytes());
        e[4] = ORIGIN_TIMESTAMPING;
        e[8..12].copy_from_slice(&self.kind.to_ne_bytes());
        e[12..16].copy_from_slice(&self.key.to_ne_bytes());
        e
    }

    /// The `scm_timestamping` of the `SCM_TIMESTAMPING` control message:
    /// three `timespec`s, the software time first.
    pub fn scm_timestamping(&self) -> [u8; 48] {
        let mut t = [0u8; 48];
        t[..8].copy_from_slice(&(self.at.as_secs() as i64).to_ne_bytes());
        t[8..16].copy_from_slice(&i64::from(self.at.subsec_nanos()).to_ne_bytes());
        t
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn keys_count_from_the_base_with_opt_id() {
        let mut t = Timestamping {
            flags: TX_SCHED | TX_SOFTWARE | TX_ACK | OPT_ID,
            base: 0,
            ..Timestamping::default()
        };
        assert_eq!(t.key(2000), 1999);
        t.base = 1000;
        assert_eq!(t.key(4000), 2999);
        t.flags &= !OPT_ID;
        assert_eq!(t.key(4000), 0);
    }

    #[test]
    fn a_sent_stamp_is_sched_then_snd_and_reads_as_linux_lays_it_out() {
        let mut t = Timestamping {
            flags: TX_SCHED | TX_SOFTWARE | TX_ACK | OPT_ID,
            ..Timestamping::default()
        };
        let now = UNIX_EPOCH + Duration::new(100, 500);
        t.stamped(1999, true, Duration::from_nanos(500), now);
        t.stamped(1999, false, Duration::ZERO, now);
        let kinds: Vec<u32> = std::iter::from_fn(|| t.take()).map(|r| r.kind).collect();
        assert_eq!(kinds, vec![SCHED, SND, ACK]);
        t.stamped(7, true, Duration::from_nanos(500), now);
        let r = t.take().unwrap();
        assert_eq!(r.at, Duration::from_secs(100));
        let e = r.extended_err();
        assert_eq!(
            u32::from_ne_bytes(e[..4].try_into().unwrap()),
            libc::ENOMSG as u32
        );
        assert_eq!(
            (e[4], u32::from_ne_bytes(e[12..16].try_into().unwrap())),
            (4, 7)
        );
        assert_eq!(
            i64::from_ne_bytes(r.scm_timestamping()[..8].try_into().unwrap()),
            100
        );
        assert_eq!(t.take().map(|r| r.kind), Some(SND));
        // Only what was asked: no SCHED without TX_SCHED.
        t.flags = TX_SOFTWARE;
        t.stamped(1, true, Duration::ZERO, now);
        assert_eq!(t.take().map(|r| r.kind), Some(SND));
        assert!(!t.pending());
    }
}
