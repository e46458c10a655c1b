//! End to end: `ustack demo --telemetry PATH` under TCP load, and
//! `utop --once` attached to it, as a user runs them.

use std::io::BufReader;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The demo process, killed if the test fails before it exits.
struct Demo(Option<Child>);

impl Drop for Demo {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A temporary directory removed on drop.
struct TmpDir(PathBuf);

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `utop` binary next to this test's binaries (built by
/// `cargo test --workspace`), if there is one.
fn utop_bin() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.parent()?.join("utop");
    bin.is_file().then_some(bin)
}

/// `utop --once --telemetry sock`: (exit code, stdout, stderr). Without the
/// binary, the same steps through the utop library.
fn utop_once(sock: &Path) -> (i32, String, String) {
    if let Some(bin) = utop_bin() {
        let out = Command::new(bin)
            .args(["--once", "--width", "180", "--telemetry"])
            .arg(sock)
            .output()
            .expect("run utop");
        return (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
    }
    eprintln!("utop binary not built (cargo build -p utop): using the utop library");
    let stream = match utop::feed::attach(sock) {
        Ok(s) => s,
        Err(e) => return (2, String::new(), format!("utop: {e:#}")),
    };
    let mut r = BufReader::new(stream);
    let mut m = utop::Monitor::new(sock.display().to_string());
    for wait in [5, 1] {
        match utop::feed::read_frame(&mut r, Duration::from_secs(wait)) {
            Ok(Some(f)) => m.on_update(utop::Update::Frame(Box::new(f))),
            _ => break,
        }
    }
    (0, m.text_frame(180), String::new())
}

fn wait_for(path: &Path) {
    let end = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(Instant::now() < end, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn utop_once_shows_pools_and_the_live_tcp_connection_of_a_demo() {
    let dir = TmpDir(std::env::temp_dir().join(format!("ustack-e2e-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let sock = dir.0.join("demo.sock");
    let sock_b = dir.0.join("demo-b.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_ustack"))
        .args(["demo", "--duration", "6", "--no-tui", "--interval", "50"])
        // More than the run can send: the connection is live throughout.
        .args(["--tcp-mib", "1000000", "--telemetry"])
        .arg(&sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ustack demo");
    let mut demo = Demo(Some(child));
    wait_for(&sock);
    wait_for(&sock_b);
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode");

    // The first snapshot may come before the handshake: look again until the
    // connection shows (a retry, not a timing assertion).
    let mut attempts = 0;
    let (code, out, err) = loop {
        let r = utop_once(&sock);
        attempts += 1;
        if r.1.contains("ESTABLISHED") || attempts == 40 {
            break r;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(!out.contains('\x1b'), "plain text");
    let pool = format!("sim-{}", ustack::sim::host_mac(1));
    let row = out.lines().find(|l| l.contains(&pool)).expect(&out);
    assert!(row.contains("8192"), "pool capacity: {row}");
    assert!(out.contains("demo A 10.0.0.1"), "{out}");
    let conn = out
        .lines()
        .find(|l| l.contains("10.0.0.2:5001") && l.contains("ESTABLISHED"))
        .unwrap_or_else(|| panic!("no established connection in\n{out}"));
    assert!(conn.contains("10.0.0.1:"), "{conn}");
    assert!(out.contains("tcp 1 connections"), "{out}");
    for pane in [" Pools ", " Port ", " Protocols ", " Connections: "] {
        assert!(out.contains(pane), "{pane} in\n{out}");
    }

    // Host B publishes beside it and sees the same connection from its end.
    let (code, out_b, err_b) = utop_once(&sock_b);
    assert_eq!(code, 0, "{out_b}\n{err_b}");
    assert!(
        out_b.lines().any(|l| l
            .trim_start_matches('│')
            .trim_start()
            .starts_with("10.0.0.2:5001")
            && l.contains("ESTABLISHED")),
        "{out_b}"
    );

    // The demo's own output stays the plain lines (stdout is a pipe).
    let child = demo.0.take().unwrap();
    let done = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&done.stdout);
    assert!(done.status.success(), "{stdout}");
    assert!(stdout.contains("packets transmitted"), "{stdout}");
    assert!(
        !stdout.contains('\x1b'),
        "no TUI when stdout is not a terminal"
    );
    // The sockets are gone with the stack, and utop says so.
    assert!(!sock.exists() && !sock_b.exists());
    let (code, _, err) = utop_once(&sock);
    assert_eq!(code, 2);
    assert!(err.contains("no stack at"), "{err}");
}

/// `GET /metrics` from `addr`: the body of a 200 answer.
fn scrape(addr: std::net::SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect to utop --prometheus");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200 "), "{out}");
    out.split_once("\r\n\r\n").unwrap().1.to_owned()
}

/// A series' value: `name{...labels containing `labels`...} value`.
fn series(body: &str, name: &str, labels: &str) -> Option<f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.split(['{', ' ']).next() == Some(name) && l.contains(labels))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Scrape until `pred` holds (a retry, not a timing assertion).
fn scrape_until(addr: std::net::SocketAddr, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let body = scrape(addr);
        if pred(&body) {
            return body;
        }
        assert!(Instant::now() < end, "never {what}:\n{body}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn utop_prometheus_serves_a_demos_telemetry_and_follows_restarts() {
    let dir = TmpDir(std::env::temp_dir().join(format!("ustack-prom-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let sock = dir.0.join("demo.sock");
    // The sidecar starts before the stack: it serves `ustack_up 0`.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let _sidecar = match utop_bin() {
        Some(bin) => {
            let child = Command::new(bin)
                .arg("--prometheus")
                .arg(addr.to_string())
                .arg("--telemetry")
                .arg(&sock)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("run utop --prometheus");
            (Demo(Some(child)), None)
        }
        None => {
            eprintln!("utop binary not built (cargo build -p utop): using the utop library");
            let s = utop::prometheus::Sidecar::start(sock.clone(), addr).unwrap();
            (Demo(None), Some(s))
        }
    };
    let end = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < end, "utop --prometheus never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    let body = scrape(addr);
    assert_eq!(
        series(&body, "ustack_up", "stack=\"demo\""),
        Some(0.0),
        "{body}"
    );

    for run in 0..2 {
        let child = Command::new(env!("CARGO_BIN_EXE_ustack"))
            .args(["demo", "--duration", "3", "--no-tui", "--interval", "50"])
            .args(["--tcp-mib", "1000000", "--telemetry"])
            .arg(&sock)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run ustack demo");
        let mut demo = Demo(Some(child));
        // The line that counts the sidecar among the socket's clients is
        // written after it attached: wait for one (not just the first).
        let body = scrape_until(addr, "a moving TCP counter and the sidecar attached", |b| {
            series(b, "ustack_tcp_segments_sent_total", "stack=\"demo\"").unwrap_or(0.0) > 0.0
                && series(b, "ustack_telemetry_clients", "").unwrap_or(0.0) >= 1.0
        });
        assert_eq!(series(&body, "ustack_up", ""), Some(1.0), "{body}");
        assert!(
            series(&body, "ustack_info", "version=\"").is_some(),
            "{body}"
        );
        assert!(
            series(
                &body,
                "ustack_tcp_connection_cwnd_bytes",
                "remote=\"10.0.0.2:5001\""
            )
            .is_some()
                || series(&body, "ustack_tcp_connections", "").is_some(),
            "{body}"
        );
        assert!(
            series(&body, "ustack_telemetry_clients", "").unwrap_or(0.0) >= 1.0,
            "{body}"
        );
        if run == 0 {
            let pt = std::process::Command::new("promtool")
                .args(["check", "metrics"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn();
            match pt {
                Ok(mut pt) => {
                    use std::io::Write;
                    pt.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
                    let out = pt.wait_with_output().unwrap();
                    assert!(
                        out.status.success(),
                        "promtool: {}{}",
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
                Err(_) => ustack_test_skip::skip(
                    "promtool is not installed (apt-get install prometheus): its check left out",
                ),
            }
        }
        // The demo ends: the sidecar says the stack is down, then (next
        // run) attaches to the new one.
        let child = demo.0.take().unwrap();
        assert!(child.wait_with_output().unwrap().status.success());
        scrape_until(addr, "ustack_up 0 after the demo exited", |b| {
            series(b, "ustack_up", "") == Some(0.0)
        });
    }
}
