//! The UD apps' message format (laid out in [`crate::ud_ping`]'s module
//! docs) and the receive-buffer chores the pinger, the responder and the
//! bandwidth sweep share.

use std::time::Duration;

use ustack::Error;
use ustack::socket::ud::{Completion, GRH_LEN, QpHandle, UdTransport};

/// Smallest ping message.
pub const PING_LEN: usize = 40;
const MAGIC: &[u8; 4] = b"UDPG";
pub(crate) const KIND_PING: u8 = 1;
pub(crate) const KIND_PONG: u8 = 2;
pub(crate) const KIND_STATS_REQ: u8 = 3;
pub(crate) const KIND_STATS: u8 = 4;

/// A decoded control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Msg {
    pub kind: u8,
    pub seq: u64,
    pub a: u64,
    pub b: u64,
    pub c: u64,
}

impl Msg {
    pub fn parse(p: &[u8]) -> Option<Msg> {
        if p.len() < PING_LEN || &p[..4] != MAGIC {
            return None;
        }
        let u = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&p[at..at + 8]);
            u64::from_be_bytes(b)
        };
        Some(Msg {
            kind: p[4],
            seq: u(8),
            a: u(16),
            b: u(24),
            c: u(32),
        })
    }

    /// Write into `buf` (at least [`PING_LEN`]); the rest is a counting pattern.
    pub fn write(&self, buf: &mut [u8]) {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = i as u8;
        }
        buf[..4].copy_from_slice(MAGIC);
        buf[4] = self.kind;
        buf[5..8].fill(0);
        buf[8..16].copy_from_slice(&self.seq.to_be_bytes());
        buf[16..24].copy_from_slice(&self.a.to_be_bytes());
        buf[24..32].copy_from_slice(&self.b.to_be_bytes());
        buf[32..40].copy_from_slice(&self.c.to_be_bytes());
    }
}

pub(crate) fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Post `n` receive buffers of `size` payload bytes (plus the GRH space).
pub(crate) fn post_recvs<T: UdTransport + ?Sized>(
    t: &mut T,
    qp: QpHandle,
    n: usize,
    size: usize,
) -> Result<(), Error> {
    for i in 0..n {
        t.post_recv(qp, i as u64, vec![0u8; GRH_LEN + size])?;
    }
    Ok(())
}

/// Give a receive buffer back to the QP.
pub(crate) fn repost<T: UdTransport + ?Sized>(t: &mut T, qp: QpHandle, c: &mut Completion) {
    if let Some(buf) = c.buf.take() {
        // Only fails if the queue is full, which cannot be: this buffer
        // just left it.
        let _ = t.post_recv(qp, c.wr_id, buf);
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn msg_round_trip() {
        let m = Msg {
            kind: KIND_PONG,
            seq: 9,
            a: 1,
            b: 2,
            c: 3,
        };
        let mut b = vec![0u8; 64];
        m.write(&mut b);
        assert_eq!(Msg::parse(&b), Some(m));
        assert_eq!(Msg::parse(&b[..39]), None);
    }
}
