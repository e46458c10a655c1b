//! The threaded front: ordinary threads read and write TCP streams of a stack
//! whose poll loop runs on another thread, with blocking std::io calls.

use std::io::{Read, Write};
use std::net::SocketAddrV4;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ustack::app::bulk::{BulkRecv, BulkSend, count_mismatches, fill_pattern};
use ustack::node::{App, Control};
use ustack::sim::{LinkConfig, SimNet, host_config};
use ustack::{Instant, Stack};
use ustack_runtime::blocking::front;
use ustack_runtime::clock::Clock;

/// Host B: receives on 5001, and once told to, sends to A:6001.
struct HostB {
    recv: BulkRecv,
    send: BulkSend,
    go: Arc<AtomicBool>,
    /// Set once both transfers finished on B's side.
    done: Arc<AtomicBool>,
}

impl App for HostB {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        self.recv.poll(now, stack);
        if self.go.load(Ordering::Relaxed) {
            self.send.poll(now, stack);
        }
        if self.send.done() && !self.recv.completed.is_empty() {
            self.done.store(true, Ordering::Relaxed);
        }
        Control::Continue
    }
}

const BYTES: usize = 8 << 20;

#[test]
fn blocking_streams_both_ways_through_the_front() {
    let mut net = SimNet::new(LinkConfig {
        delay: Duration::from_micros(50),
        ..LinkConfig::default()
    });
    net.add(host_config(1));
    net.add(host_config(2));
    let a = net.nodes[0].stack.ip();
    let b = net.nodes[1].stack.ip();
    let (mut front_app, connector) = front();
    let go = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let mut host_b = HostB {
        recv: BulkRecv::new(5001, 4),
        send: BulkSend::new(SocketAddrV4::new(a, 6001), BYTES as u64),
        go: go.clone(),
        done: done.clone(),
    };
    let stop2 = stop.clone();
    let looper = std::thread::spawn(move || {
        let clock = Clock::new();
        ustack_runtime::poll::run_sim_realtime(
            &mut net,
            &clock,
            Duration::from_secs(120),
            &mut [&mut front_app, &mut host_b],
            |_| stop2.load(Ordering::Relaxed),
        );
        (net, host_b)
    });

    // Accept on A while B connects to us.
    let listener = connector.listen(6001, 4).expect("listen");
    go.store(true, Ordering::Relaxed);
    let reader = std::thread::spawn(move || {
        let mut s = listener.accept().expect("accept");
        let mut got = Vec::new();
        s.read_to_end(&mut got).expect("read to end");
        got
    });

    // Write to B with blocking writes, then close.
    let mut out = connector
        .connect(SocketAddrV4::new(b, 5001))
        .expect("connect");
    let mut data = vec![0u8; BYTES];
    fill_pattern(0, &mut data);
    out.write_all(&data).expect("write_all");
    out.shutdown().expect("shutdown");
    drop(out);

    let got = reader.join().expect("reader thread");
    assert_eq!(got.len(), BYTES);
    assert_eq!(count_mismatches(0, &got), 0);

    // Wait until B has seen our FIN (bounded, so a bug fails instead of hanging).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !done.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    let (_net, host_b) = looper.join().expect("loop thread");
    assert_eq!(host_b.send.error, None);
    assert!(host_b.send.done());
    assert_eq!(host_b.recv.errors, vec![]);
    assert_eq!(host_b.recv.completed.len(), 1);
    assert_eq!(host_b.recv.completed[0].bytes, BYTES as u64);
    assert_eq!(host_b.recv.corrupt_bytes, 0);
    assert_eq!(host_b.recv.completed[0].crc, crc32fast::hash(&data));
}

#[test]
fn connect_to_closed_port_is_refused() {
    let mut net = SimNet::new(LinkConfig::default());
    net.add(host_config(1));
    net.add(host_config(2));
    let b = net.nodes[1].stack.ip();
    let (mut front_app, connector) = front();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let looper = std::thread::spawn(move || {
        let clock = Clock::new();
        ustack_runtime::poll::run_sim_realtime(
            &mut net,
            &clock,
            Duration::from_secs(30),
            &mut [&mut front_app],
            |_| stop2.load(Ordering::Relaxed),
        );
    });
    let err = connector
        .connect(SocketAddrV4::new(b, 9))
        .expect_err("nothing listens on 9");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    stop.store(true, Ordering::Relaxed);
    looper.join().unwrap();
    // With the loop gone, the connector reports it instead of hanging.
    let err = connector
        .connect(SocketAddrV4::new(b, 9))
        .expect_err("loop stopped");
    assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe);
}
