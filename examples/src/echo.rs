//! A TCP echo server as an in-loop [`App`]: the poll loop calls it on its
//! own thread, between receiving and transmitting, so an echo leaves in the
//! same loop iteration its request arrived in. No locks, no wake-ups, no
//! copies beyond one scratch buffer: the lowest-latency way to use ustack.
//!
//! It reacts to readiness events instead of scanning its connections: the
//! listener's READABLE means connections wait to be accepted; a
//! connection's READABLE (data, or the peer's FIN), WRITABLE (room again in
//! the send buffer), CLOSED or ERROR means that connection has work.
//! Events are edges (like `EPOLLET`), so each connection is pumped until it
//! would block: until nothing is left to read or no room is left to write.

use std::collections::HashSet;

use ustack::events::{Event, SocketRef};
use ustack::node::{App, Control};
use ustack::socket::tcp::{ListenHandle, TcpHandle};
use ustack::{Instant, Stack};

/// Echoes every TCP connection to `port` back to its sender.
#[derive(Debug)]
pub struct EchoServer {
    port: u16,
    listener: Option<ListenHandle>,
    /// Connections accepted and not yet closed.
    open: HashSet<TcpHandle>,
    /// Scratch space between `tcp().recv` and `tcp().send`.
    buf: Vec<u8>,
    error: Option<String>,
    /// Connections accepted so far.
    pub connections: u64,
    /// Bytes echoed so far.
    pub bytes: u64,
}

impl EchoServer {
    /// An echo server for `port`; it starts listening on its first turn.
    pub fn new(port: u16) -> Self {
        EchoServer {
            port,
            listener: None,
            open: HashSet::new(),
            buf: vec![0; 64 << 10],
            error: None,
            connections: 0,
            bytes: 0,
        }
    }

    /// Why the server stopped early (the port was taken), if it did.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Take every connection that finished its handshake.
    fn accept(&mut self, now: Instant, stack: &mut Stack, listener: ListenHandle) {
        while let Ok(Some(h)) = stack.tcp().accept(listener) {
            self.open.insert(h);
            self.connections += 1;
            // Data (even the peer's FIN) may have arrived with the handshake.
            self.pump(now, stack, h);
        }
    }

    /// Move what `h` received into its send buffer, as much as both allow;
    /// close it once the peer has finished and everything went back.
    fn pump(&mut self, now: Instant, stack: &mut Stack, h: TcpHandle) {
        loop {
            let Ok(st) = stack.tcp_ref().status(h) else {
                self.open.remove(&h);
                return;
            };
            if st.error.is_some() || st.closed() {
                // Reset, timed out, or gone: release the handle.
                return self.close(now, stack, h);
            }
            // Read only what can be written back now: the rest waits in the
            // connection's receive buffer, whose window then closes, so a
            // client that does not read its echoes slows down (backpressure).
            let n = st.readable.min(st.writable).min(self.buf.len());
            if n == 0 {
                if st.eof {
                    // The peer sent FIN and every byte went back: close
                    // (our FIN follows the echoed bytes).
                    self.close(now, stack, h);
                }
                // Otherwise wait for the next READABLE or WRITABLE event.
                return;
            }
            let got = match stack.tcp().recv(h, &mut self.buf[..n]) {
                Ok(got) if got > 0 => got,
                _ => return self.close(now, stack, h),
            };
            // Fits: `writable` said there was room for `n >= got` bytes.
            let sent = stack.tcp().send(h, &self.buf[..got]).unwrap_or(0);
            self.bytes += sent as u64;
        }
    }

    /// Close `h` and forget it: queued data still leaves, then FIN; the
    /// handle is released.
    fn close(&mut self, now: Instant, stack: &mut Stack, h: TcpHandle) {
        let _ = stack.tcp().close(now, h);
        self.open.remove(&h);
    }
}

impl App for EchoServer {
    /// Each iteration's readiness events, before [`poll`](Self::poll).
    fn on_events(&mut self, now: Instant, events: &[Event], stack: &mut Stack) {
        for ev in events {
            match ev.socket {
                SocketRef::Listener(l) if Some(l) == self.listener => self.accept(now, stack, l),
                // Only connections we accepted: an event may name one that
                // still waits in the listener's queue.
                SocketRef::Tcp(h) if self.open.contains(&h) => self.pump(now, stack, h),
                _ => {}
            }
        }
    }

    /// Called every iteration: listen once, exit if that failed.
    fn poll(&mut self, _now: Instant, stack: &mut Stack) -> Control {
        if self.listener.is_none() && self.error.is_none() {
            match stack.tcp().listen(self.port, 128) {
                Ok(l) => self.listener = Some(l),
                Err(e) => self.error = Some(format!("cannot listen on port {}: {e}", self.port)),
            }
        }
        if self.error.is_some() {
            Control::Exit
        } else {
            Control::Continue
        }
    }
}
