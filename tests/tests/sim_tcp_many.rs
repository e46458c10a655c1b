//! Many connections on the sim link: 10,000 concurrent transfers, SYN cookies
//! under a full backlog. (Memory per idle connection: `memory_idle.rs`.)

use std::net::SocketAddrV4;
use std::time::Duration;

use ustack::sim::{LinkConfig, SimNet};
use ustack_kit::bulk::{BulkRecv, BulkSend};

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
        assert_eq!(n.stack.tcp_ref().connections().count(), 0);
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
