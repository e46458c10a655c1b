//! Many connections on the sim link: 10,000 concurrent transfers, SYN cookies
//! under a full backlog, and memory per idle connection.

use std::net::SocketAddrV4;
use std::time::Duration;

use ustack::app::bulk::{BulkRecv, BulkSend};
use ustack::node::{App, Control};
use ustack::sim::{LinkConfig, SimNet};
use ustack::{Instant, Stack};

mod common;
use common::{ManyClients, small_buffers};

fn run(
    clients: usize,
    bytes: u64,
    backlog: usize,
    per_poll: usize,
) -> (SimNet, ManyClients, BulkRecv) {
    let mut net = SimNet::new(LinkConfig {
        delay: Duration::from_micros(50),
        queue_frames: 1 << 16,
        ..LinkConfig::default()
    });
    net.add(small_buffers(1));
    net.add(small_buffers(2));
    let dst = SocketAddrV4::new(net.nodes[1].stack.ip(), 5001);
    let mut many = ManyClients {
        dst,
        total: clients,
        bytes,
        per_poll,
        clients: Vec::new(),
    };
    let mut server = BulkRecv::new(5001, backlog);
    for _ in 0..10_000 {
        net.run_until(
            net.now + Duration::from_millis(100),
            &mut [&mut many, &mut server],
            |_| false,
        );
        if server.completed.len() == clients && many.clients.iter().all(BulkSend::done) {
            break;
        }
    }
    (net, many, server)
}

#[test]
fn ten_thousand_connections_each_moving_data_then_closed() {
    const N: usize = 10_000;
    let (mut net, many, server) = run(N, 2000, N, 500);
    assert!(
        many.clients.iter().all(|c| c.error.is_none()),
        "client errors"
    );
    assert_eq!(server.errors, vec![]);
    assert_eq!(server.corrupt_bytes, 0);
    assert_eq!(server.completed.len(), N);
    assert!(server.completed.iter().all(|t| t.bytes == 2000));
    // Every connection ends: TIME_WAIT passes, tables empty, buffers home.
    net.run_until(net.now + Duration::from_secs(130), &mut [], |_| false);
    for n in &net.nodes {
        assert_eq!(n.stack.tcp_connections().count(), 0);
    }
    assert_eq!(net.pools_in_use(), 0);
    let s = net.nodes[1].stack.stats().tcp;
    assert_eq!(s.passive_opens, N as u64);
    assert_eq!(s.established, N as u64);
}

#[test]
fn syn_cookies_accept_clients_when_backlog_is_full() {
    const N: usize = 200;
    // Backlog 4 and 200 clients at once: most handshakes complete through cookies.
    let (net, many, server) = run(N, 5000, 4, N);
    let s = net.nodes[1].stack.stats().tcp;
    assert!(s.syn_cookies_sent > 0, "{s:?}");
    assert!(s.syn_cookies_accepted > 0, "{s:?}");
    assert_eq!(s.syn_cookies_failed, 0);
    assert!(many.clients.iter().all(|c| c.error.is_none()));
    assert_eq!(server.completed.len(), N);
    assert!(server.completed.iter().all(|t| t.bytes == 5000));
    assert_eq!(server.corrupt_bytes, 0);
}

/// Opens connections and keeps them open, idle.
struct IdleClients {
    dst: SocketAddrV4,
    want: usize,
    handles: Vec<ustack::tcp::TcpHandle>,
}

impl App for IdleClients {
    fn poll(&mut self, _: Instant, stack: &mut Stack) -> Control {
        while self.handles.len() < self.want {
            self.handles
                .push(stack.tcp_connect(self.dst).expect("connect"));
        }
        Control::Continue
    }
}

/// Accepts connections and keeps them open, idle.
struct IdleServer {
    listener: Option<ustack::tcp::ListenHandle>,
    accepted: Vec<ustack::tcp::TcpHandle>,
}

impl App for IdleServer {
    fn poll(&mut self, _: Instant, stack: &mut Stack) -> Control {
        let l = *self
            .listener
            .get_or_insert_with(|| stack.tcp_listen(5001, 4096).expect("listen"));
        while let Ok(Some(h)) = stack.tcp_accept(l) {
            self.accepted.push(h);
        }
        Control::Continue
    }
}

#[test]
fn memory_per_idle_connection_is_reported() {
    let mut net = SimNet::new(LinkConfig::default());
    net.add(small_buffers(1));
    net.add(small_buffers(2));
    let dst = SocketAddrV4::new(net.nodes[1].stack.ip(), 5001);
    let mut clients = IdleClients {
        dst,
        want: 1000,
        handles: Vec::new(),
    };
    let mut server = IdleServer {
        listener: None,
        accepted: Vec::new(),
    };
    net.run_until(
        Instant::from_secs(5),
        &mut [&mut clients, &mut server],
        |_| false,
    );
    assert_eq!(server.accepted.len(), 1000);
    for h in &server.accepted {
        assert_eq!(
            net.nodes[1].stack.tcp_status(*h).unwrap().state,
            ustack::tcp::State::Established
        );
    }
    let per_conn = ustack::tcp::TcpConn::memory_estimate(&net.nodes[1].stack.config().tcp);
    eprintln!("memory per idle connection: {per_conn} bytes (8 KiB send + 8 KiB receive buffers)");
    assert!(per_conn < 64 << 10, "{per_conn}");
}
