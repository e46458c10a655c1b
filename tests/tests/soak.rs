//! Soak: thousands of TCP connections opened, used and closed or aborted
//! over an impaired sim link whose loss, reordering, duplication and
//! corruption change every virtual second. Every byte is checked against
//! the stream pattern and every completed transfer by (length, CRC-32) on
//! both ends; at the end no connection is left and every pool is back at
//! zero. Not in CI's default run:
//!
//! ```text
//! USTACK_SOAK_SECS=120 cargo test --release -p ustack-tests --test soak -- --ignored --nocapture
//! ```

use std::net::SocketAddrV4;
use std::time::Duration;

use ustack::node::{App, Control};
use ustack::sim::{LinkConfig, SimNet, host_config};
use ustack::socket::tcp::{ListenHandle, TcpHandle};
use ustack::{Instant, Stack};
use ustack_kit::bulk::{BulkSend, count_mismatches};

/// Longest transfer of one connection.
const MAX_BYTES: u64 = 200 << 10;
/// Connections open at once.
const ACTIVE: usize = 64;
/// A server connection silent this long is aborted (the client's RST may
/// have been lost).
const IDLE: Duration = Duration::from_secs(20);

/// Opens connections of random sizes, `ACTIVE` at a time; one in ten is
/// aborted part-way.
struct Cycler {
    dst: SocketAddrV4,
    rng: fastrand::Rng,
    running: bool,
    active: Vec<(BulkSend, Option<u64>)>,
    started: u64,
    ok: Vec<(u64, u32)>,
    aborted: u64,
    /// Client errors by kind.
    errors: std::collections::BTreeMap<String, u64>,
}

impl App for Cycler {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        while self.running && self.active.len() < ACTIVE {
            let size = match self.rng.u64(..10) {
                0 => 0,
                1 => self.rng.u64(..100),
                _ => self.rng.u64(..MAX_BYTES),
            };
            let abort = (self.rng.f64() <= 0.1).then(|| self.rng.u64(..=size));
            self.active.push((BulkSend::new(self.dst, size), abort));
            self.started += 1;
        }
        let mut i = 0;
        while i < self.active.len() {
            let (c, abort) = &mut self.active[i];
            c.poll(now, stack);
            let cut = abort.is_some_and(|a| c.transfer.bytes >= a) && !c.done();
            if cut {
                if let Some(h) = c.handle() {
                    let _ = stack.tcp().abort(h);
                }
                self.aborted += 1;
            } else if c.done() {
                match &c.error {
                    Some(e) => *self.errors.entry(e.to_string()).or_default() += 1,
                    None => self.ok.push((c.transfer.bytes, c.transfer.crc)),
                }
            } else {
                i += 1;
                continue;
            }
            self.active.swap_remove(i);
        }
        Control::Continue
    }
    fn poll_at(&self) -> Option<Instant> {
        (self.running && self.active.len() < ACTIVE).then_some(Instant::ZERO)
    }
}

struct ServerConn {
    h: TcpHandle,
    got: u64,
    crc: crc32fast::Hasher,
    last: Instant,
    abort_at: Option<u64>,
}

/// Accepts, verifies every byte, closes at EOF; aborts one in ten part-way
/// and any connection silent for [`IDLE`].
struct Server {
    listener: Option<ListenHandle>,
    rng: fastrand::Rng,
    conns: Vec<ServerConn>,
    buf: Vec<u8>,
    accepted: u64,
    clean: Vec<(u64, u32)>,
    corrupt: u64,
    bytes: u64,
    aborted: u64,
    idle_aborts: u64,
    resets: u64,
}

impl App for Server {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let l = *self
            .listener
            .get_or_insert_with(|| stack.tcp().listen(5001, 256).expect("listen"));
        while let Ok(Some(h)) = stack.tcp().accept(l) {
            self.accepted += 1;
            let abort_at = (self.rng.f64() <= 0.1).then(|| self.rng.u64(..MAX_BYTES / 2));
            self.conns.push(ServerConn {
                h,
                got: 0,
                crc: crc32fast::Hasher::new(),
                last: now,
                abort_at,
            });
        }
        let mut i = 0;
        while i < self.conns.len() {
            let c = &mut self.conns[i];
            let mut failed = false;
            loop {
                match stack.tcp().recv(c.h, &mut self.buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        self.corrupt += count_mismatches(c.got, &self.buf[..n]);
                        c.crc.update(&self.buf[..n]);
                        c.got += n as u64;
                        self.bytes += n as u64;
                        c.last = now;
                    }
                    Err(_) => {
                        failed = true;
                        break;
                    }
                }
            }
            let eof = stack.tcp_ref().status(c.h).is_ok_and(|s| s.eof);
            if failed {
                self.resets += 1;
                let _ = stack.tcp().close(now, c.h);
            } else if c.abort_at.is_some_and(|a| c.got >= a) && !eof {
                self.aborted += 1;
                let _ = stack.tcp().abort(c.h);
            } else if eof {
                self.clean.push((c.got, c.crc.clone().finalize()));
                let _ = stack.tcp().close(now, c.h);
            } else if now.saturating_duration_since(c.last) >= IDLE {
                self.idle_aborts += 1;
                let _ = stack.tcp().abort(c.h);
            } else {
                i += 1;
                continue;
            }
            self.conns.swap_remove(i);
        }
        Control::Continue
    }
    fn poll_at(&self) -> Option<Instant> {
        self.conns.iter().map(|c| c.last + IDLE).min()
    }
}

/// Impairments for one virtual second: sometimes clean, sometimes bad.
fn weather(rng: &mut fastrand::Rng, seed: u64) -> LinkConfig {
    let clean = rng.f64() <= 0.2;
    let p = |rng: &mut fastrand::Rng, max: f64| {
        if clean {
            0.0
        } else {
            rng.u64(..1000) as f64 / 1000.0 * max
        }
    };
    LinkConfig {
        loss: p(rng, 0.05),
        duplicate: p(rng, 0.05),
        corrupt: p(rng, 0.01),
        reorder: p(rng, 0.1),
        reorder_delay: Duration::from_micros(100 + rng.u64(..900)),
        delay: Duration::from_micros(20 + rng.u64(..500)),
        jitter: Duration::from_micros(rng.u64(..50)),
        // 1 Gbit/s: virtual time moves about as fast as the wall clock, so
        // timers (RTO, TIME_WAIT, port reuse) take part.
        rate_bps: 1_000_000_000,
        queue_frames: 1 << 14,
        seed,
        ..LinkConfig::default()
    }
}

#[test]
#[ignore = "minutes long: USTACK_SOAK_SECS (default 120), run with --ignored"]
fn soak_thousands_of_connections_over_a_changing_impaired_link() {
    let secs: u64 = std::env::var("USTACK_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    let mut rng = fastrand::Rng::with_seed(0x50a6_5eed);
    let mut net = SimNet::new(weather(&mut rng, 1));
    for n in [1, 2] {
        let mut c = host_config(n);
        c.tcp.send_buffer = 64 << 10;
        c.tcp.recv_buffer = 64 << 10;
        // Short TIME_WAIT so the 16,384 ephemeral ports cycle (about a
        // thousand connections a second).
        c.tcp.time_wait = Duration::from_secs(5);
        net.add(c);
    }
    let dst = SocketAddrV4::new(net.nodes[1].stack.ip(), 5001);
    let mut client = Cycler {
        dst,
        rng: fastrand::Rng::with_seed(rng.u64(..)),
        running: true,
        active: Vec::new(),
        started: 0,
        ok: Vec::new(),
        aborted: 0,
        errors: Default::default(),
    };
    let mut server = Server {
        listener: None,
        rng: fastrand::Rng::with_seed(rng.u64(..)),
        conns: Vec::new(),
        buf: vec![0; 64 << 10],
        accepted: 0,
        clean: Vec::new(),
        corrupt: 0,
        bytes: 0,
        aborted: 0,
        idle_aborts: 0,
        resets: 0,
    };
    let wall = std::time::Instant::now();
    let mut next_report = Duration::from_secs(10);
    let mut next_weather = net.now;
    let mut max_pool = 0usize;
    let mut epochs = 0u64;
    let slice = Duration::from_millis(10);
    while wall.elapsed() < Duration::from_secs(secs) {
        if net.now >= next_weather {
            epochs += 1;
            net.link.set_config(weather(&mut rng, epochs));
            next_weather = net.now + Duration::from_secs(1);
        }
        let until = net.now + slice;
        net.run_until(until, &mut [&mut client, &mut server], |_| false);
        net.now = net.now.max(until);
        max_pool = max_pool.max(net.pools_in_use());
        if wall.elapsed() >= next_report {
            next_report += Duration::from_secs(10);
            let tcp = net.nodes[0].stack.stats().tcp;
            eprintln!(
                "[{:>4}s wall, {:>6.1}s virtual] connections {} started, {} ok, {} aborted; \
                 {} MiB verified; retransmits {}; pool in use {} (max {})",
                wall.elapsed().as_secs(),
                net.now.as_nanos() as f64 / 1e9,
                client.started,
                client.ok.len(),
                client.aborted + server.aborted,
                server.bytes >> 20,
                tcp.retransmits,
                net.pools_in_use(),
                max_pool
            );
        }
    }
    // Stop opening; let the open ones finish over a milder link.
    client.running = false;
    net.link.set_config(LinkConfig {
        rate_bps: 1_000_000_000,
        loss: 0.01,
        reorder: 0.05,
        delay: Duration::from_micros(100),
        seed: 99,
        ..LinkConfig::default()
    });
    let end = net.now + Duration::from_secs(600);
    while (!client.active.is_empty() || !server.conns.is_empty()) && net.now < end {
        let until = net.now + Duration::from_millis(100);
        net.run_until(until, &mut [&mut client, &mut server], |_| false);
        net.now = net.now.max(until);
    }
    // TIME_WAIT passes.
    net.run_until(
        net.now + Duration::from_secs(130),
        &mut [&mut client, &mut server],
        |_| false,
    );
    let (a, b) = (net.nodes[0].stack.stats(), net.nodes[1].stack.stats());
    let link = net.link.stats();
    eprintln!(
        "soak summary: {} s wall, {:.1} s virtual, {} weather changes\n  \
         connections: {} opened, {} accepted, {} completed byte-exact, {} aborted by the \
         client, {} by the server, {} idle server aborts, client errors {:?}, \
         {} server resets (client aborts)\n  \
         bytes verified: {} ({} MiB), corrupt 0\n  \
         retransmits: client {} server {}, RTO timeouts {}\n  \
         link: {} frames, {} lost, {} duplicated, {} corrupted, {} reordered\n  \
         max pool buffers in use: {}; at the end: {}",
        wall.elapsed().as_secs(),
        net.now.as_nanos() as f64 / 1e9,
        epochs,
        client.started,
        server.accepted,
        client.ok.len(),
        client.aborted,
        server.aborted,
        server.idle_aborts,
        client.errors,
        server.resets,
        server.bytes,
        server.bytes >> 20,
        a.tcp.retransmits,
        b.tcp.retransmits,
        a.tcp.totals.timeouts + b.tcp.totals.timeouts,
        link.sent,
        link.lost,
        link.duplicated,
        link.corrupted,
        link.reordered,
        max_pool,
        net.pools_in_use()
    );
    assert!(client.active.is_empty() && server.conns.is_empty());
    assert!(client.started > 1000, "too few connections cycled");
    assert_eq!(server.corrupt, 0, "bytes differ from the stream");
    // Every transfer the client saw complete arrived whole on the server,
    // same length and CRC.
    let mut clean = server.clean.clone();
    clean.sort_unstable();
    for want in &client.ok {
        let at = clean.binary_search(want);
        assert!(
            at.is_ok(),
            "client transfer {want:?} not seen by the server"
        );
        clean.remove(at.unwrap_or(0));
    }
    // A client's connection fails only when the server aborted it.
    let resets = client
        .errors
        .get("connection reset by peer")
        .copied()
        .unwrap_or(0);
    let errors: u64 = client.errors.values().sum();
    assert_eq!(errors, resets, "{:?}", client.errors);
    assert!(resets <= server.aborted);
    for n in &net.nodes {
        assert_eq!(n.stack.tcp_ref().connections().count(), 0);
        let s = n.stack.stats();
        assert_eq!(s.eth.rx_frames, s.eth.rx_accepted + s.drops.total());
    }
    assert_eq!(net.link.in_flight(), 0);
    assert_eq!(net.pools_in_use(), 0, "buffers leaked");
}
