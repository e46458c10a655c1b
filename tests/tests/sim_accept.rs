//! A connection reset after its handshake, before the app accepts it: as on
//! Linux, `accept` still hands it out and the app reads the reset. Before,
//! the stack freed it from the listener's queue, so a blocking `accept`
//! waited for a connection that would never come (packetdrill's
//! `mss-getsockopt-tcp_maxseg-server.pkt` hung: its wire server resets the
//! connection as soon as its last packet is injected, 100 ms before the
//! script's `accept`).

use std::net::SocketAddrV4;
use std::time::Duration;

use ustack::node::{App, Control};
use ustack::sim::{LinkConfig, SimNet, host_config};
use ustack::socket::tcp::{ConnError, ListenHandle, TcpHandle};
use ustack::{Instant, Stack};

/// Connects, and resets the connection 10 ms after it is established (its
/// final ACK gone).
struct ConnectThenReset {
    dst: SocketAddrV4,
    conn: Option<TcpHandle>,
    established_at: Option<Instant>,
    reset: bool,
}

impl App for ConnectThenReset {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let h = *self
            .conn
            .get_or_insert_with(|| stack.tcp().connect(now, self.dst).expect("connect"));
        if self.established_at.is_none()
            && stack
                .tcp_ref()
                .status(h)
                .expect("status")
                .state
                .synchronized()
        {
            self.established_at = Some(now);
        }
        if !self.reset
            && self
                .established_at
                .is_some_and(|t| now >= t + Duration::from_millis(10))
        {
            stack.tcp().abort(h).expect("abort");
            self.reset = true;
        }
        Control::Continue
    }

    fn poll_at(&self) -> Option<Instant> {
        self.established_at
            .filter(|_| !self.reset)
            .map(|t| t + Duration::from_millis(10))
    }
}

/// Listens, and accepts only from `accept_at` on.
struct LateAccept {
    listener: Option<ListenHandle>,
    accept_at: Instant,
    accepted: Vec<TcpHandle>,
}

impl App for LateAccept {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let l = *self
            .listener
            .get_or_insert_with(|| stack.tcp().listen(80, 1).expect("listen"));
        if now >= self.accept_at {
            while let Some(h) = stack.tcp().accept(l).expect("accept") {
                self.accepted.push(h);
            }
        }
        Control::Continue
    }

    fn poll_at(&self) -> Option<Instant> {
        Some(self.accept_at)
    }
}

#[test]
fn a_connection_reset_before_accept_is_still_accepted_and_reads_the_reset() {
    let mut net = SimNet::new(LinkConfig {
        delay: Duration::from_micros(100),
        ..LinkConfig::default()
    });
    net.add(host_config(1));
    net.add(host_config(2));
    let dst = SocketAddrV4::new(net.nodes[1].stack.ip(), 80);
    let mut client = ConnectThenReset {
        dst,
        conn: None,
        established_at: None,
        reset: false,
    };
    let mut server = LateAccept {
        listener: None,
        accept_at: net.now + Duration::from_millis(100),
        accepted: Vec::new(),
    };
    let until = net.now + Duration::from_millis(300);
    net.run_until(until, &mut [&mut client, &mut server], |_| false);
    assert!(client.reset, "the handshake never completed");
    let s = net.nodes[1].stack.stats().tcp;
    assert_eq!((s.established, s.resets_received), (1, 1), "{s:?}");
    assert_eq!(server.accepted.len(), 1, "accept found nothing: {s:?}");
    let h = server.accepted[0];
    let stack = &mut net.nodes[1].stack;
    let st = stack.tcp_ref().status(h).expect("the accepted connection");
    assert_eq!(st.error, Some(ConnError::Reset));
    // Closing it frees everything.
    stack.tcp().close(net.now, h).expect("close");
    net.run_until(net.now + Duration::from_millis(10), &mut [], |_| false);
    assert_eq!(net.nodes[1].stack.stats().tcp.connections, 0);
    assert_eq!(net.pools_in_use(), 0);
}
