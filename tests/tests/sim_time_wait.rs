//! Short connections whose server closes first (HTTP/1.0): the server holds
//! each 4-tuple in TIME-WAIT for 2 MSL, and a client that comes back from
//! the same port before then (Linux picks ports pseudo-randomly; a busy
//! server holds thousands) must get a new connection, not the old one's
//! ACK (RFC 6191: its timestamp or sequence number is newer). Before the
//! fix, a lighttpd under `ab` stopped accepting after about 3,200
//! connections: every port the client reused met a TIME-WAIT that answered
//! its SYN with an ACK, the client reset it, and the SYN went round again.

use std::net::SocketAddrV4;
use std::time::Duration;

use ustack::node::{App, Control};
use ustack::sim::{LinkConfig, SimNet, host_config};
use ustack::socket::tcp::{ListenHandle, TcpHandle};
use ustack::{Instant, Stack};

const RESPONSE: &[u8] = b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello";

/// Accepts, answers every connection at once and closes first.
#[derive(Default)]
struct CloseFirstServer {
    listener: Option<ListenHandle>,
    served: usize,
}

impl App for CloseFirstServer {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let l = *self
            .listener
            .get_or_insert_with(|| stack.tcp().listen(80, 64).expect("listen"));
        while let Some(h) = stack.tcp().accept(l).expect("accept") {
            assert_eq!(stack.tcp().send(h, RESPONSE).expect("send"), RESPONSE.len());
            stack.tcp().close(now, h).expect("close");
            self.served += 1;
        }
        Control::Continue
    }
}

/// Connects from one local port again and again, reads the response to
/// the end and closes.
struct SamePortClient {
    dst: SocketAddrV4,
    port: u16,
    total: usize,
    conn: Option<(TcpHandle, Vec<u8>)>,
    done: usize,
    errors: Vec<String>,
    /// The last connection still holds the port at our end (LAST-ACK):
    /// try again then.
    retry_at: Option<Instant>,
}

impl App for SamePortClient {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        if self.done + self.errors.len() >= self.total {
            return Control::Continue;
        }
        let Some((h, got)) = self.conn.as_mut() else {
            if self.retry_at.is_some_and(|t| now < t) {
                return Control::Continue;
            }
            self.retry_at = None;
            match stack.tcp().connect_from(now, self.port, self.dst) {
                Ok(h) => self.conn = Some((h, Vec::new())),
                Err(ustack::Error::AddrInUse) => {
                    self.retry_at = Some(now + Duration::from_millis(1));
                }
                Err(e) => self.errors.push(format!("connect: {e}")),
            }
            return Control::Continue;
        };
        let h = *h;
        let mut buf = [0u8; 256];
        while let Ok(n @ 1..) = stack.tcp().recv(h, &mut buf) {
            got.extend_from_slice(&buf[..n]);
        }
        let st = stack.tcp_ref().status(h).expect("status");
        if let Some(e) = st.error {
            self.errors.push(format!("connection {}: {e}", self.done));
            let _ = stack.tcp().close(now, h);
            self.conn = None;
        } else if st.eof {
            assert_eq!(got.as_slice(), RESPONSE, "connection {}", self.done);
            stack.tcp().close(now, h).expect("close");
            self.conn = None;
            self.done += 1;
        }
        Control::Continue
    }

    fn poll_at(&self) -> Option<Instant> {
        (self.conn.is_none() && self.done + self.errors.len() < self.total)
            .then(|| self.retry_at.unwrap_or(Instant::ZERO))
    }
}

#[test]
fn a_client_port_in_time_wait_at_the_server_opens_again_at_once() {
    const N: usize = 50;
    let mut net = SimNet::new(LinkConfig {
        delay: Duration::from_micros(100),
        ..LinkConfig::default()
    });
    net.add(host_config(1));
    net.add(host_config(2));
    let dst = SocketAddrV4::new(net.nodes[1].stack.ip(), 80);
    let mut client = SamePortClient {
        dst,
        port: 40_000,
        total: N,
        conn: None,
        done: 0,
        errors: Vec::new(),
        retry_at: None,
    };
    let mut server = CloseFirstServer::default();
    // Far less than 2 MSL (60 s): every connection after the first meets
    // the last one's TIME-WAIT at the server. Before the fix the second
    // never got its SYN-ACK (its SYN was answered by the old ACK).
    let start = net.now;
    net.run_until(
        start + Duration::from_secs(10),
        &mut [&mut client, &mut server],
        |_| false,
    );
    assert_eq!(client.errors, Vec::<String>::new());
    assert_eq!(client.done, N, "connections completed in 10 s");
    assert_eq!(server.served, N);
    let s = net.nodes[1].stack.stats().tcp;
    assert_eq!(s.time_wait_reopened, (N - 1) as u64, "{s:?}");
    // What the server holds now is one small TIME-WAIT record, not a
    // connection: no connection slot, no buffers.
    assert_eq!(s.time_wait, 1, "{s:?}");
    assert_eq!(s.connections, 1, "{s:?}");
    assert_eq!(net.nodes[1].stack.tcp_ref().connections().count(), 0);
    // 2 MSL later the record is gone, and every buffer is home.
    net.run_until(net.now + Duration::from_secs(70), &mut [], |_| false);
    let s = net.nodes[1].stack.stats().tcp;
    assert_eq!((s.time_wait, s.connections), (0, 0), "{s:?}");
    assert_eq!(net.pools_in_use(), 0);
}

#[test]
fn an_old_syn_to_a_time_wait_record_gets_its_ack_and_no_connection() {
    // Without timestamps the sequence number decides: the client's ISN
    // for the same 4-tuple a moment later is ahead of the old one's
    // (RFC 6528's clock), so it reopens; the record answers anything else
    // with its ACK (RFC 9293 3.10.7.4), counted.
    let mut net = SimNet::new(LinkConfig {
        delay: Duration::from_micros(100),
        ..LinkConfig::default()
    });
    let mut c1 = host_config(1);
    c1.tcp.timestamps = false;
    let mut c2 = host_config(2);
    c2.tcp.timestamps = false;
    net.add(c1);
    net.add(c2);
    let dst = SocketAddrV4::new(net.nodes[1].stack.ip(), 80);
    let mut client = SamePortClient {
        dst,
        port: 40_001,
        total: 5,
        conn: None,
        done: 0,
        errors: Vec::new(),
        retry_at: None,
    };
    let mut server = CloseFirstServer::default();
    let start = net.now;
    net.run_until(
        start + Duration::from_secs(10),
        &mut [&mut client, &mut server],
        |_| false,
    );
    assert_eq!(client.errors, Vec::<String>::new());
    let s = net.nodes[1].stack.stats().tcp;
    assert_eq!(
        (client.done, server.served),
        (5, 5),
        "{s:?} {:?}",
        net.nodes[0].stack.stats().tcp
    );
    let s = net.nodes[1].stack.stats().tcp;
    assert_eq!(s.time_wait_reopened, 4, "{s:?}");
}
