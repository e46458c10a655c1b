//! The out-of-band exchange of the stock RDMA tools (`ibv_ud_pingpong`,
//! perftest) spoken over the stack's own TCP: fixed-size messages, each
//! written in one piece (the tools read each with a single `read()` of
//! exactly its length) and read as exactly that many bytes. The formats are
//! in [`ustack::wire::exchange`].

use std::net::SocketAddrV4;

use ustack::socket::tcp::TcpHandle;
use ustack::{Instant, Stack};

/// Why an exchange stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OobError {
    /// The TCP connection failed (refused, reset, timed out).
    #[error("TCP connection to the exchange port failed: {0}")]
    Connection(String),
    /// The peer closed the connection before the message was complete.
    #[error("the peer closed the exchange connection")]
    Closed,
    /// The peer sent bytes that are not the expected message.
    #[error("unexpected exchange message: {0}")]
    Protocol(String),
}

/// One exchange connection: queued writes, and received bytes kept until
/// a message of the expected length is complete.
#[derive(Debug)]
pub struct MsgConn {
    h: TcpHandle,
    rx: Vec<u8>,
    tx: Vec<u8>,
    connected: bool,
}

impl MsgConn {
    /// Connect to a tool listening at `to`.
    pub fn connect(now: Instant, stack: &mut Stack, to: SocketAddrV4) -> Result<Self, OobError> {
        let h = stack
            .tcp()
            .connect(now, to)
            .map_err(|e| OobError::Connection(e.to_string()))?;
        Ok(Self::accepted(stack, h))
    }

    /// Wrap an accepted connection.
    pub fn accepted(stack: &mut Stack, h: TcpHandle) -> Self {
        // Each message in its own segment, at once.
        let _ = stack.tcp().set_nodelay(h, true);
        MsgConn {
            h,
            rx: Vec::new(),
            tx: Vec::new(),
            connected: false,
        }
    }

    /// The connection's handle.
    pub fn handle(&self) -> TcpHandle {
        self.h
    }

    /// Queue a message (sent by [`poll`](Self::poll), in order).
    pub fn send(&mut self, msg: &[u8]) {
        self.tx.extend_from_slice(msg);
    }

    /// Everything queued has been handed to TCP.
    pub fn flushed(&self) -> bool {
        self.tx.is_empty()
    }

    /// Move queued bytes out and received bytes in. Errors once the
    /// connection failed; a peer's orderly close is reported by
    /// [`recv_exact`](Self::recv_exact) when a message is missing.
    pub fn poll(&mut self, stack: &mut Stack) -> Result<(), OobError> {
        let st = stack
            .tcp_ref()
            .status(self.h)
            .map_err(|e| OobError::Connection(e.to_string()))?;
        if let Some(e) = st.error {
            return Err(OobError::Connection(format!("{e:?}")));
        }
        if !self.connected {
            if st.writable == 0 && st.state == ustack::socket::tcp::State::SynSent {
                return Ok(());
            }
            self.connected = true;
        }
        if !self.tx.is_empty() {
            let n = stack.tcp().send(self.h, &self.tx).unwrap_or(0);
            self.tx.drain(..n);
        }
        let mut buf = [0u8; 512];
        loop {
            match stack.tcp().recv(self.h, &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => self.rx.extend_from_slice(&buf[..n]),
            }
        }
        Ok(())
    }

    /// The next `n` received bytes, once they are all here.
    pub fn recv_exact(&mut self, stack: &Stack, n: usize) -> Result<Option<Vec<u8>>, OobError> {
        if self.rx.len() >= n {
            return Ok(Some(self.rx.drain(..n).collect()));
        }
        match stack.tcp_ref().status(self.h) {
            Ok(st) if st.eof || st.closed() => Err(OobError::Closed),
            Ok(_) => Ok(None),
            Err(e) => Err(OobError::Connection(e.to_string())),
        }
    }

    /// Bytes received and not yet taken.
    pub fn pending(&self) -> &[u8] {
        &self.rx
    }

    /// Close our side (after the last message is flushed).
    pub fn close(self, now: Instant, stack: &mut Stack) {
        let _ = stack.tcp().close(now, self.h);
    }
}
