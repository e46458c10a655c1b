//! The Prometheus endpoint of a stack (`--metrics`, `Builder::metrics`):
//! a real runtime on the simulated link answers pings, and its endpoint,
//! scraped over TCP on 127.0.0.1, shows the counters move, passes
//! `promtool check metrics`, and answers bad requests with 4xx.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use ustack_kit::ping::{Pinger, PingerConfig};
use ustack_runtime::Builder;

/// A free port on 127.0.0.1 (bound, then released for the endpoint).
fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Send `req`; the status code and the body.
fn http(addr: SocketAddr, req: &[u8]) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = s.write_all(req);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, head.to_owned(), body.to_owned())
}

/// The value of the first series of `name` whose labels contain `labels`.
fn sample(body: &str, name: &str, labels: &str) -> Option<f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.split(['{', ' ']).next() == Some(name) && l.contains(labels))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `promtool check metrics` on `text`; without promtool, a skip of this
/// part (`ustack_test_skip`: a failure under `CI=true`).
fn promtool_check(text: &str) {
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        ustack_test_skip::skip(
            "promtool is not installed (apt-get install prometheus): its check left out",
        );
        return;
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics:\n{}{}\n--- body ---\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_stacks_endpoint_serves_moving_counters_that_promtool_accepts() {
    let link = ustack::sim::SimLink::new(Default::default());
    let addr = free_addr();
    let b = Builder::new()
        .sim(&link)
        .ip(Ipv4Addr::new(10, 0, 0, 2), 24)
        .metrics(addr)
        .spawn()
        .expect("stack B with --metrics");

    // Another stack asking for the same address: one clear error.
    let e = Builder::new()
        .sim(&link)
        .ip(Ipv4Addr::new(10, 0, 0, 3), 24)
        .metrics(addr)
        .spawn()
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with(&format!("cannot serve metrics on {addr}: ")),
        "{e}"
    );

    // A pings B 20 times; B's loop answers and publishes its counters.
    let mut ping = Pinger::new(PingerConfig {
        count: Some(20),
        interval: Duration::from_millis(5),
        ..PingerConfig::new(Ipv4Addr::new(10, 0, 0, 2))
    });
    let stop = AtomicBool::new(false);
    Builder::new()
        .sim(&link)
        .ip(Ipv4Addr::new(10, 0, 0, 1), 24)
        .run(&mut ping, &stop)
        .unwrap();
    assert_eq!(ping.summary().received, 20);

    // Snapshots come every 250 ms: scrape until the replies show (a
    // retry, not a timing assertion).
    let end = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let (code, head, body) = http(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(code, 200, "{head}\n{body}");
        assert!(
            head.contains("Content-Type: text/plain; version=0.0.4"),
            "{head}"
        );
        if sample(&body, "ustack_icmp_tx_echo_replies_total", "") == Some(20.0) {
            break body;
        }
        assert!(Instant::now() < end, "the replies never showed:\n{body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(sample(&body, "ustack_up", ""), Some(1.0), "{body}");
    assert_eq!(
        sample(&body, "ustack_icmp_rx_echo_requests_total", ""),
        Some(20.0)
    );
    assert!(sample(&body, "ustack_port_rx_packets_total", "").unwrap() >= 21.0);
    assert!(
        sample(&body, "ustack_pool_buffers", "pool=\"sim-").is_some(),
        "{body}"
    );
    assert_eq!(
        sample(&body, "ustack_drops_total", "reason=\"tcp_bad_checksum\""),
        Some(0.0)
    );
    assert!(sample(&body, "ustack_snapshot_age_seconds", "").is_some());
    // Every series is the stack's.
    assert!(
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .all(|l| l.contains("stack=\"")),
        "{body}"
    );
    promtool_check(&body);

    // Bad requests get 4xx, and the endpoint serves on.
    assert_eq!(http(addr, b"GET /nope HTTP/1.1\r\n\r\n").0, 404);
    assert_eq!(http(addr, b"DELETE /metrics HTTP/1.1\r\n\r\n").0, 405);
    assert_eq!(http(addr, b"NOT HTTP\r\n\r\n").0, 400);
    let mut big = b"GET /metrics HTTP/1.1\r\nCookie: ".to_vec();
    big.extend(std::iter::repeat_n(b'x', 64 * 1024));
    big.extend(b"\r\n\r\n");
    assert_eq!(http(addr, &big).0, 431);
    let (code, _, page) = http(addr, b"GET / HTTP/1.0\r\n\r\n");
    assert_eq!(code, 200);
    assert!(page.contains("/metrics"), "{page}");
    assert_eq!(http(addr, b"GET /metrics HTTP/1.1\r\n\r\n").0, 200);

    // The endpoint goes with the stack.
    b.stop().unwrap();
    let gone = TcpStream::connect(addr);
    assert!(gone.is_err(), "still listening after the stack stopped");
}
