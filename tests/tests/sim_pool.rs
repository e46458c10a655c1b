//! Pool exhaustion on the sim link: a receiver whose port copies frames into
//! its own pool (as a NIC does) runs dry, counts the frames it could not
//! take (`rx_nombuf`), does not deadlock, and the TCP transfer through it
//! completes byte-exact once buffers come back; every pool returns to zero.

use std::net::SocketAddrV4;
use std::time::Duration;

use ustack::node::Node;
use ustack::sim::{LinkConfig, SimNet, host_config};
use ustack::{Device, Instant, Pool, Stack};
use ustack_kit::bulk::{BulkRecv, BulkSend};

/// Two stacks: A (10.0.0.1) with a normal port, B (10.0.0.2) receiving into
/// its own pool of `b_bufs` buffers.
fn net_with_rx_pool(b_bufs: usize, rate_bps: u64) -> SimNet {
    let mut net = SimNet::new(LinkConfig {
        delay: Duration::from_micros(100),
        rate_bps,
        ..LinkConfig::default()
    });
    net.add(host_config(1));
    let cfg = host_config(2);
    let port = net.link.attach_with_rx_pool(cfg.mac, b_bufs);
    net.nodes.push(Node::new(Stack::new(cfg), port));
    net
}

/// Run until the transfer is done (true) or `limit` of virtual time passes.
fn run_transfer(
    net: &mut SimNet,
    send: &mut BulkSend,
    recv: &mut BulkRecv,
    limit: Duration,
) -> bool {
    let end = net.now + limit;
    while net.now < end {
        let until = net.now + Duration::from_millis(100);
        net.run_until(until, &mut [&mut *send, &mut *recv], |_| false);
        net.now = net.now.max(until);
        if send.done() && recv.completed.len() == 1 {
            return true;
        }
    }
    false
}

fn finish_and_check(net: &mut SimNet, send: &BulkSend, recv: &BulkRecv, bytes: u64) {
    assert!(send.done() && send.error.is_none(), "{:?}", send.error);
    assert_eq!(recv.errors, vec![]);
    assert_eq!(recv.corrupt_bytes, 0);
    assert_eq!(recv.completed.len(), 1);
    let got = recv.completed[0];
    assert_eq!((got.bytes, got.crc), (bytes, send.transfer.crc));
    // TIME_WAIT passes; no connection left, every buffer home.
    net.run_until(net.now + Duration::from_secs(130), &mut [], |_| false);
    for n in &net.nodes {
        assert_eq!(n.stack.tcp_ref().connections().count(), 0);
        let s = n.stack.stats();
        assert_eq!(s.eth.rx_frames, s.eth.rx_accepted + s.drops.total());
    }
    assert_eq!(net.link.in_flight(), 0);
    assert_eq!(net.pools_in_use(), 0, "buffers leaked");
}

#[test]
fn receiver_pool_held_dry_then_released_transfer_completes() {
    const BYTES: u64 = 8 << 20;
    let mut net = net_with_rx_pool(1024, 1_000_000_000);
    let dst = SocketAddrV4::new(net.nodes[1].stack.ip(), 5001);
    let mut send = BulkSend::new(dst, BYTES);
    let mut recv = BulkRecv::new(5001, 4);
    // The transfer gets going.
    net.run_until(
        Instant::from_millis(10),
        &mut [&mut send, &mut recv],
        |_| false,
    );
    assert!(recv.open() == 1 && recv.completed.is_empty());
    // Something (an app, a slow consumer) holds every buffer of B's pool.
    // It takes every buffer that comes back, for 2 s.
    let pool = net.nodes[1].dev().pool().clone();
    let mut held = Vec::new();
    let before = net.nodes[1].dev().port_stats();
    let end = net.now + Duration::from_secs(2);
    while net.now < end {
        while let Some(b) = pool.alloc() {
            held.push(b);
        }
        let until = net.now + Duration::from_micros(100);
        net.run_until(until, &mut [&mut send, &mut recv], |_| false);
        net.now = net.now.max(until);
    }
    assert_eq!(held.len(), 1024);
    let during = net.nodes[1].dev().port_stats();
    let nombuf = during.rx_nombuf - before.rx_nombuf;
    let stack_b = net.nodes[1].stack.stats();
    eprintln!(
        "pool dry for 2 s: rx_nombuf {nombuf}, B tx_no_buffer {}, pool alloc failures {}",
        stack_b.eth.tx_no_buffer,
        pool.stats().alloc_failures
    );
    // Nothing was received while dry; every frame that came was counted.
    assert!(nombuf > 0);
    assert!(during.rx_packets - before.rx_packets < 50);
    assert!(recv.completed.is_empty());
    // Buffers come back: the transfer resumes (retransmission timers) and
    // completes byte-exact.
    drop(held);
    let ok = run_transfer(&mut net, &mut send, &mut recv, Duration::from_secs(120));
    assert!(ok, "transfer did not resume");
    let a = net.nodes[0].stack.stats().tcp;
    eprintln!(
        "resumed: {} bytes byte-exact, sender retransmits {} timeouts {}",
        BYTES, a.retransmits, a.totals.timeouts
    );
    assert!(a.totals.timeouts > 0);
    finish_and_check(&mut net, &send, &recv, BYTES);
}

#[test]
fn tiny_receive_pool_drops_bursts_and_tcp_recovers() {
    const BYTES: u64 = 4 << 20;
    // 24 buffers: fewer than a window of segments in flight.
    let mut net = net_with_rx_pool(24, 0);
    let dst = SocketAddrV4::new(net.nodes[1].stack.ip(), 5001);
    let mut send = BulkSend::new(dst, BYTES);
    let mut recv = BulkRecv::new(5001, 4);
    let ok = run_transfer(&mut net, &mut send, &mut recv, Duration::from_secs(300));
    let port = net.nodes[1].dev().port_stats();
    let a = net.nodes[0].stack.stats().tcp;
    eprintln!(
        "tiny pool (24 buffers): rx_nombuf {}, received {}, sender retransmits {}",
        port.rx_nombuf, port.rx_packets, a.retransmits
    );
    assert!(ok, "transfer did not complete");
    assert!(port.rx_nombuf > 0);
    assert!(a.retransmits > 0);
    finish_and_check(&mut net, &send, &recv, BYTES);
}
