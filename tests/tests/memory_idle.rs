//! Memory per idle connection, measured: the heap the process holds before
//! and after 1,000 connections are opened and left idle (their rings
//! take memory only as data passes), counted by a
//! heap-profiling allocator (dhat in testing mode; one test per binary, so
//! nothing else allocates meanwhile).

use std::net::SocketAddrV4;

use ustack::node::{App, Control};
use ustack::sim::{LinkConfig, SimNet};
use ustack::socket::tcp::{ListenHandle, State, TcpHandle};
use ustack::{Instant, Stack};

mod common;
use common::small_buffers;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// Opens connections and keeps them open, idle.
struct IdleClients {
    dst: SocketAddrV4,
    want: usize,
    handles: Vec<TcpHandle>,
}

impl App for IdleClients {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        while self.handles.len() < self.want {
            self.handles
                .push(stack.tcp().connect(now, self.dst).expect("connect"));
        }
        Control::Continue
    }
}

/// Accepts connections and keeps them open, idle.
struct IdleServer {
    listener: Option<ListenHandle>,
    accepted: Vec<TcpHandle>,
}

impl App for IdleServer {
    fn poll(&mut self, _: Instant, stack: &mut Stack) -> Control {
        let l = *self
            .listener
            .get_or_insert_with(|| stack.tcp().listen(5001, 4096).expect("listen"));
        while let Ok(Some(h)) = stack.tcp().accept(l) {
            self.accepted.push(h);
        }
        Control::Continue
    }
}

#[test]
fn memory_per_idle_connection_is_measured() {
    const CONNS: usize = 1000;
    let _profiler = dhat::Profiler::builder().testing().build();
    let mut net = SimNet::new(LinkConfig::default());
    net.add(small_buffers(1));
    net.add(small_buffers(2));
    let dst = SocketAddrV4::new(net.nodes[1].stack.ip(), 5001);
    let mut clients = IdleClients {
        dst,
        want: 1,
        handles: Vec::with_capacity(CONNS + 1),
    };
    let mut server = IdleServer {
        listener: None,
        accepted: Vec::with_capacity(CONNS + 1),
    };
    // Warm up with one connection, so the baseline holds the pools, the
    // tables' first allocations and the sim's queues.
    net.run_until(
        Instant::from_secs(1),
        &mut [&mut clients, &mut server],
        |_| false,
    );
    assert_eq!(server.accepted.len(), 1);
    let before = dhat::HeapStats::get().curr_bytes;
    clients.want = CONNS + 1;
    net.run_until(
        Instant::from_secs(10),
        &mut [&mut clients, &mut server],
        |_| false,
    );
    let after = dhat::HeapStats::get().curr_bytes;
    assert_eq!(server.accepted.len(), CONNS + 1);
    for h in &server.accepted {
        assert_eq!(
            net.nodes[1].stack.tcp_ref().status(*h).unwrap().state,
            State::Established
        );
    }
    // Both ends of each connection live in this process.
    let per_conn = after.saturating_sub(before) / (2 * CONNS);
    let cfg = &net.nodes[1].stack.config().tcp;
    let estimate = ustack::socket::tcp::TcpConn::memory_estimate(cfg);
    eprintln!("memory per idle connection: {per_conn} bytes measured ({estimate} estimated)");
    // The connection is really counted, and its rings, which no byte has
    // passed through, take no memory: the table entry, timers and the
    // connection struct stay within 4 KiB.
    assert!(
        per_conn >= estimate / 2,
        "{per_conn} < {estimate} / 2: not measured?"
    );
    assert!(
        per_conn <= 4 << 10,
        "{per_conn} bytes per idle connection: rings allocated up front?"
    );
}
