//! ustack's side: two `Stack`s in one thread, each in a `runtime::Node`
//! over a tiny in-memory frame queue (lossless, no delay; frames move by
//! ownership, buffers come from ustack's `SlabPool`), the same kind of link
//! smoltcp gets in `smol.rs`. Driven by the wall clock read once per
//! iteration (as the poll loop does), never sleeping. (`ustack::sim`'s
//! SimLink is the test harness: its impairment machinery, timed delivery
//! heap and software RSS would be charged to ustack here, not to smoltcp.)

use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use anyhow::{Result, bail};
use serde_json::{Value, json};
use ustack::phy::device::{Device, DeviceCaps, Offloads, RxChecksum};

use crate::Offload;
use ustack::node::{App, Control, Node};
use ustack::sim::host_config;
use ustack::socket::tcp::{ListenHandle, TcpHandle};
use ustack::{Instant, PoolStats, PortStats, SlabBuf, SlabPool, Stack};
use ustack_runtime::clock::Clock;

/// The wire: one frame queue per direction.
#[derive(Debug, Default)]
struct Wire {
    queues: [VecDeque<SlabBuf>; 2],
    frames: u64,
}

/// One end of the wire as a ustack `Device`.
#[derive(Debug)]
pub struct QueueDev {
    wire: Rc<RefCell<Wire>>,
    me: usize,
    pool: SlabPool,
    stats: PortStats,
    /// The NIC offloads this end plays (`--offload`).
    offloads: Offloads,
}

impl Device for QueueDev {
    type Buf = SlabBuf;

    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            mtu: 1500,
            busy_poll_only: false,
            offloads: self.offloads,
            rx_timestamps: false,
        }
    }

    fn rx_burst(&mut self, _: Instant, out: &mut Vec<SlabBuf>, max: usize) -> usize {
        let mut w = self.wire.borrow_mut();
        let q = &mut w.queues[self.me];
        let n = q.len().min(max);
        out.extend(q.drain(..n));
        self.stats.rx_packets += n as u64;
        n
    }

    fn tx_burst(&mut self, _: Instant, pkts: &mut Vec<SlabBuf>) -> usize {
        let n = pkts.len();
        let mut w = self.wire.borrow_mut();
        w.frames += n as u64;
        if self.offloads.tx_tcp_checksum {
            // What a NIC pair with offloads does, at no CPU cost: the
            // sender's fills the checksums (and cuts a TSO segment), the
            // receiver's verifies them (and merges the pieces back, LRO).
            for b in pkts.iter_mut() {
                if b.tx_offload().is_some() {
                    b.clear_tx_offload();
                    b.set_rx_checksum(RxChecksum::Good);
                }
            }
        }
        w.queues[1 - self.me].extend(pkts.drain(..));
        self.stats.tx_packets += n as u64;
        n
    }

    fn alloc_tx(&mut self) -> Option<SlabBuf> {
        use ustack::Pool;
        self.pool.alloc()
    }

    fn port_stats(&self) -> PortStats {
        self.stats.clone()
    }

    fn pool_stats(&self, out: &mut Vec<PoolStats>) {
        use ustack::Pool;
        out.push(self.pool.stats());
    }
}

/// Buffers per port pool. `SlabPool` hands buffers out in FIFO order, so
/// its whole slab is the working set: 8192 x 2 KiB (16 MiB, the sim
/// link's size) misses the caches on every frame written; 1024 (2 MiB) is
/// still far more than the ~200 frames a 256 KiB window keeps in flight.
const POOL_BUFS: usize = 1024;

/// Two stacks on one wire: node 0 is 10.0.0.1, node 1 is 10.0.0.2.
struct Pair {
    nodes: [Node<QueueDev>; 2],
    wire: Rc<RefCell<Wire>>,
    now: Instant,
    /// Steps taken (each steps both nodes once).
    steps: u64,
}

impl Pair {
    fn step(&mut self, rx: &mut Receiver, tx: &mut Sender) {
        let now = self.now;
        self.steps += 1;
        self.nodes[0].step(now, rx);
        self.nodes[1].step(now, tx);
    }
}

/// Port of the measured flow.
const FLOW_PORT: u16 = 5001;
/// Port the idle established connections connect to.
const IDLE_PORT: u16 = 6000;
/// First port of the idle listeners.
const LISTEN_BASE: u16 = 20_000;
/// Connections opened per loop iteration while setting up.
const OPEN_PER_POLL: usize = 256;

/// Receiver (node 0): idle listeners, accepts idle connections, sinks the flow.
#[derive(Debug, Default)]
struct Receiver {
    idle_listeners: usize,
    listeners: Vec<ListenHandle>,
    idle_listener: Option<ListenHandle>,
    flow_listener: Option<ListenHandle>,
    accepted: Vec<TcpHandle>,
    flow: Option<TcpHandle>,
    got: u64,
    buf: Vec<u8>,
    /// Consume in place (`tcp_recv_with`) instead of copying out.
    zero_copy: bool,
    error: Option<String>,
}

impl App for Receiver {
    fn poll(&mut self, _: Instant, stack: &mut Stack) -> Control {
        if self.flow_listener.is_none() {
            let r = (|| -> Result<(), ustack::Error> {
                for i in 0..self.idle_listeners {
                    let port = LISTEN_BASE + u16::try_from(i).unwrap_or(0);
                    self.listeners.push(stack.tcp().listen(port, 16)?);
                }
                self.idle_listener = Some(stack.tcp().listen(IDLE_PORT, 1 << 16)?);
                self.flow_listener = Some(stack.tcp().listen(FLOW_PORT, 4)?);
                Ok(())
            })();
            if let Err(e) = r {
                self.error = Some(format!("listen: {e}"));
                return Control::Exit;
            }
        }
        if let Some(l) = self.idle_listener {
            while let Ok(Some(h)) = stack.tcp().accept(l) {
                self.accepted.push(h);
            }
        }
        if let Some(l) = self.flow_listener
            && let Ok(Some(h)) = stack.tcp().accept(l)
        {
            self.flow = Some(h);
        }
        if let Some(h) = self.flow {
            loop {
                let r = if self.zero_copy {
                    // Consumed where it lies in the receive ring.
                    stack.tcp().recv_with(h, |b| (b.len(), ())).map(|(n, ())| n)
                } else {
                    stack.tcp().recv(h, &mut self.buf)
                };
                match r {
                    Ok(0) => break,
                    Ok(n) => self.got += n as u64,
                    Err(e) => {
                        self.error = Some(format!("recv: {e}"));
                        break;
                    }
                }
            }
        }
        Control::Continue
    }
}

/// Sender (node 1): opens the idle connections, then the flow, and sends.
#[derive(Debug, Default)]
struct Sender {
    idle_conns: usize,
    conns: Vec<TcpHandle>,
    dst: Option<std::net::IpAddr>,
    start_flow: bool,
    flow: Option<TcpHandle>,
    total: u64,
    sent: u64,
    buf: Vec<u8>,
    /// Claim send-ring space in place (`tcp_send_with`) instead of copying.
    zero_copy: bool,
    error: Option<String>,
}

impl App for Sender {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let Some(dst) = self.dst else {
            return Control::Continue;
        };
        let want = (self.idle_conns - self.conns.len()).min(OPEN_PER_POLL);
        for _ in 0..want {
            match stack.tcp().connect(now, SocketAddr::new(dst, IDLE_PORT)) {
                Ok(h) => self.conns.push(h),
                Err(e) => {
                    self.error = Some(format!("connect: {e}"));
                    return Control::Exit;
                }
            }
        }
        if !self.start_flow {
            return Control::Continue;
        }
        let h = match self.flow {
            Some(h) => h,
            None => match stack.tcp().connect(now, SocketAddr::new(dst, FLOW_PORT)) {
                Ok(h) => *self.flow.insert(h),
                Err(e) => {
                    self.error = Some(format!("connect: {e}"));
                    return Control::Exit;
                }
            },
        };
        while self.sent < self.total {
            let n = (self.total - self.sent).min(self.buf.len() as u64) as usize;
            let r = if self.zero_copy {
                // The send ring's space is claimed in place.
                stack
                    .tcp()
                    .send_with(h, |b| (b.len().min(n), ()))
                    .map(|(k, ())| k)
            } else {
                stack.tcp().send(h, &self.buf[..n])
            };
            match r {
                Ok(0) => break,
                Ok(k) => self.sent += k as u64,
                Err(e) => {
                    self.error = Some(format!("send: {e}"));
                    return Control::Exit;
                }
            }
        }
        Control::Continue
    }
}

/// The IPv6 address of bench host `n` (`--ipv6`).
fn ipv6_of(n: u8) -> std::net::Ipv6Addr {
    std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(n))
}

fn net(buffer: usize, offload: Offload, ipv6: bool) -> Pair {
    let wire = Rc::new(RefCell::new(Wire::default()));
    let offloads = Offloads {
        tx_tcp_checksum: offload != Offload::None,
        rx_checksum: offload != Offload::None,
        tso_max: if offload == Offload::Tso { 65535 } else { 0 },
        rx_large: offload == Offload::Tso,
    };
    let buf_size = if offload == Offload::Tso {
        65535 + 14
    } else {
        2048
    };
    let node = |n: u8| {
        let mut c = host_config(n);
        if ipv6 {
            c.ipv6 = vec![ustack::wire::Ipv6Cidr::new(ipv6_of(n), 64)];
        }
        c.tcp.send_buffer = buffer;
        c.tcp.recv_buffer = buffer;
        let dev = QueueDev {
            wire: wire.clone(),
            me: usize::from(n - 1),
            pool: SlabPool::new(format!("bench-{n}"), POOL_BUFS, buf_size),
            stats: PortStats::default(),
            offloads,
        };
        Node::new(Stack::new(c), dev)
    };
    Pair {
        nodes: [node(1), node(2)],
        wire: wire.clone(),
        now: Instant::ZERO,
        steps: 0,
    }
}

/// Where the loop's `now` comes from.
#[derive(Debug)]
enum Time {
    /// The wall clock, read once per iteration (as the poll loop does).
    Wall(Clock),
    /// A virtual clock that moves a fixed step per reading: the same
    /// iterations natively and under valgrind (stable instruction counts).
    Virtual(std::cell::Cell<Instant>, Duration),
}

impl Time {
    fn now(&self) -> Instant {
        match self {
            Time::Wall(c) => c.now(),
            Time::Virtual(t, step) => {
                let n = t.get() + *step;
                t.set(n);
                n
            }
        }
    }
}

/// Step both nodes on `clock` until `done` or `limit` passes.
fn drive(
    net: &mut Pair,
    clock: &Time,
    rx: &mut Receiver,
    tx: &mut Sender,
    limit: Duration,
    mut done: impl FnMut(&Receiver, &Sender) -> bool,
) -> Result<()> {
    let end = clock.now() + limit;
    loop {
        net.now = clock.now();
        net.step(rx, tx);
        if let Some(e) = rx.error.as_ref().or(tx.error.as_ref()) {
            bail!("{e}");
        }
        if done(rx, tx) {
            return Ok(());
        }
        if net.now > end {
            bail!(
                "gave up after {limit:?}: {} of {} idle connections, {} of {} bytes",
                rx.accepted.len(),
                tx.idle_conns,
                rx.got,
                tx.total
            );
        }
    }
}

/// Set up the idle sockets, then time one flow of `bytes`.
pub fn goodput(
    idle: usize,
    bytes: u64,
    buffer: usize,
    zero_copy: bool,
    offload: Offload,
    virtual_step: Option<Duration>,
    ipv6: bool,
) -> Result<crate::Goodput> {
    let mut net = net(buffer, offload, ipv6);
    let dst = if ipv6 {
        ipv6_of(1).into()
    } else {
        net.nodes[0].stack.ip().into()
    };
    let mut rx = Receiver {
        idle_listeners: idle / 2,
        buf: vec![0; 64 << 10],
        zero_copy,
        ..Default::default()
    };
    let mut tx = Sender {
        idle_conns: idle - idle / 2,
        dst: Some(dst),
        total: bytes,
        buf: vec![0x5a; 64 << 10],
        zero_copy,
        ..Default::default()
    };
    let clock = match virtual_step {
        Some(step) => Time::Virtual(std::cell::Cell::new(Instant::ZERO), step),
        None => Time::Wall(Clock::new()),
    };
    let want = tx.idle_conns;
    drive(
        &mut net,
        &clock,
        &mut rx,
        &mut tx,
        Duration::from_secs(120),
        |rx, _| rx.flow_listener.is_some() && rx.accepted.len() == want,
    )?;
    // Let the handshakes' last ACKs settle.
    let settle = clock.now() + Duration::from_millis(100);
    drive(
        &mut net,
        &clock,
        &mut rx,
        &mut tx,
        Duration::from_secs(1),
        |_, _| clock.now() > settle,
    )?;
    let frames0 = net.wire.borrow().frames;
    let steps0 = net.steps;
    tx.start_flow = true;
    let t0 = std::time::Instant::now();
    let cpu0 = crate::thread_cpu_secs();
    drive(
        &mut net,
        &clock,
        &mut rx,
        &mut tx,
        Duration::from_secs(600),
        |rx, _| rx.got >= bytes,
    )?;
    let wall = t0.elapsed().as_secs_f64();
    let cpu = crate::thread_cpu_secs() - cpu0;
    let frames1 = net.wire.borrow().frames;
    let (Some(sh), Some(rh)) = (tx.flow, rx.flow) else {
        bail!("the flow has no connection");
    };
    let (Some(si), Some(ri)) = (
        net.nodes[1].stack.tcp_ref().info(sh),
        net.nodes[0].stack.tcp_ref().info(rh),
    ) else {
        bail!("the flow's connection is gone");
    };
    // Sanity: every idle connection is still there and established.
    let established = net.nodes[0]
        .stack
        .tcp_ref()
        .connections()
        .filter(|c| c.state == ustack::socket::tcp::State::Established)
        .count();
    if established < want + 1 {
        bail!(
            "only {established} established connections, want {}",
            want + 1
        );
    }
    Ok(crate::Goodput {
        bytes: rx.got,
        wall_secs: wall,
        cpu_secs: cpu,
        frames: frames1 - frames0,
        data_frames: si.stats.segs_out,
        // App -> send ring, ring -> frame (tcp::io::emit), frame -> receive
        // ring, ring -> app. The wire moves frames without copying.
        copied: si.stats.bytes_out
            + ri.stats.bytes_in
            + if zero_copy { 0 } else { tx.sent + rx.got },
        retransmits: si.stats.retransmits,
        iterations: net.steps - steps0,
    })
}

/// Resident memory per idle established connection (both ends in this process).
pub fn memory(conns: usize, buffer: usize) -> Result<Value> {
    let mut net = net(buffer, Offload::None, false);
    let dst = net.nodes[0].stack.ip().into();
    // Warm up: one connection and the pools, so the baseline holds them.
    let mut rx = Receiver {
        buf: vec![0; 64 << 10],
        ..Default::default()
    };
    let mut tx = Sender {
        idle_conns: 1,
        dst: Some(dst),
        ..Default::default()
    };
    let clock = Time::Wall(Clock::new());
    drive(
        &mut net,
        &clock,
        &mut rx,
        &mut tx,
        Duration::from_secs(10),
        |rx, _| rx.accepted.len() == 1,
    )?;
    let before = crate::rss_bytes()?;
    tx.idle_conns = conns + 1;
    drive(
        &mut net,
        &clock,
        &mut rx,
        &mut tx,
        Duration::from_secs(300),
        |rx, _| rx.accepted.len() == conns + 1,
    )?;
    let settle = clock.now() + Duration::from_millis(200);
    drive(
        &mut net,
        &clock,
        &mut rx,
        &mut tx,
        Duration::from_secs(1),
        |_, _| clock.now() > settle,
    )?;
    let after = crate::rss_bytes()?;
    let established = |i: usize| {
        net.nodes[i]
            .stack
            .tcp_ref()
            .connections()
            .filter(|c| c.state == ustack::socket::tcp::State::Established)
            .count()
    };
    let (e0, e1) = (established(0), established(1));
    if e0 != conns + 1 || e1 != conns + 1 {
        bail!("established: server {e0}, client {e1}, want {}", conns + 1);
    }
    let grown = after.saturating_sub(before);
    let est = ustack::socket::tcp::TcpConn::memory_estimate(&net.nodes[0].stack.config().tcp);
    Ok(json!({
        "measure": "memory",
        "stack": "ustack",
        "conns": conns,
        "buffer": buffer,
        "rss_before": before,
        "rss_after": after,
        // Each connection has two ends here (client and server stack).
        "rss_per_conn_end": grown as f64 / (2 * conns) as f64,
        "rss_per_conn_both_ends": grown as f64 / conns as f64,
        "allocated_per_conn_end": est,
    }))
}
