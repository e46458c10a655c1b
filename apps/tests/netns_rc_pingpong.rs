//! `uping --rdma=rc --pingpong` in both roles (ibv_rc_pingpong's client
//! and server) against each other: two ustack processes on a veth pair,
//! each over pcap in its own namespace, speaking the tool's TCP exchange
//! and RoCEv2 RC. Both print the tool's lines and the QP's counters; a
//! clean run has no retransmission, timeout or NAK on either side. A
//! server that goes away mid-run (it stops after fewer iterations, or is
//! killed) leaves the client with one error line and a non-zero exit,
//! never a hang: the iteration timeout in the first case, the QP's spent
//! retries in the second. Needs root and the `pcap` feature; skips
//! with the reason otherwise.
#![cfg(feature = "pcap")]

#[macro_use]
mod common;
use common::*;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const SERVER_IP: &str = "10.77.0.2";

impl Topo {
    /// `uping --rdma=rc --pingpong --listen ARGS` as 10.77.0.2 in the stack
    /// namespace, returned once it answers ARP.
    fn rc_server(&self, args: &[&str]) -> Daemon {
        let child = self
            .bin(
                env!("CARGO_BIN_EXE_uping"),
                &["--pcap", &self.stack_if(), "--ip", "10.77.0.2/24"],
            )
            .args(["--rdma=rc", "--pingpong", "--listen"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the RC pingpong server");
        let d = Daemon::new(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.arping_once() {
            assert!(Instant::now() < deadline, "the server did not come up");
        }
        d
    }

    /// `uping --rdma=rc --pingpong ARGS 10.77.0.2` as 10.77.0.3 on the
    /// Linux side's veth (pcap takes its own MAC and address there), killed
    /// if it runs past `limit`.
    fn rc_client(&self, args: &[&str], limit: Duration) -> Output {
        rc_client(&self.ns("linux"), &self.linux_if(), args, limit)
    }
}

/// [`Topo::rc_client`] by names.
fn rc_client(ns: &str, iface: &str, args: &[&str], limit: Duration) -> Output {
    wait_limited(spawn_rc_client(ns, iface, args), limit)
}

/// The client started, its output piped.
fn spawn_rc_client(ns: &str, iface: &str, args: &[&str]) -> Child {
    Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(env!("CARGO_BIN_EXE_uping"))
        .args(["--pcap", iface, "--ip", "10.77.0.3/24"])
        .args(["--rdma=rc", "--pingpong"])
        .args(args)
        .arg(SERVER_IP)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the RC pingpong client")
}

/// Its output once it exits; killed (and the test failed) past `limit`.
fn wait_limited(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "the client hung past {limit:?}:\n{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The `rc qp ...` counters line of a run.
fn counters(out: &str) -> &str {
    out.lines()
        .find(|l| l.starts_with("rc qp 0x"))
        .unwrap_or_else(|| panic!("no counters line in {out}"))
}

/// The QPN of an address line (`local address:` or `remote address:`).
fn qpn(out: &str, which: &str) -> String {
    out.lines()
        .find_map(|l| l.trim_start().strip_prefix(which))
        .and_then(|l| l.split("QPN ").nth(1))
        .and_then(|s| s.split(',').next())
        .unwrap_or_else(|| panic!("no {which} line in {out}"))
        .to_string()
}

/// The figure before `unit` on the line holding it (`= 12.34 usec/iter`).
fn figure(out: &str, unit: &str) -> f64 {
    out.lines()
        .find(|l| l.ends_with(unit))
        .and_then(|l| l.split_whitespace().rev().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {unit} in {out}"))
}

#[test]
fn rc_pingpong_both_roles() {
    need_root!();
    let topo = Topo::up("rcpp");
    const N: u64 = 200;
    let n = N.to_string();
    for size in [4096usize, 1] {
        let s = size.to_string();
        let server = topo.rc_server(&["-c", &n, "-s", &s]);
        let o = topo.rc_client(&["-c", &n, "-s", &s], Duration::from_secs(60));
        let client = text(&o);
        let (code, sout, serr) = server.wait();
        let server_out = format!("{sout}{serr}");
        eprintln!("-s {size} client:\n{client}\n-s {size} server:\n{server_out}");
        assert!(o.status.success(), "{client}");
        assert_eq!(code, 0, "{server_out}");
        let bytes = format!("{} bytes in ", size as u64 * N * 2);
        for out in [&client, &server_out] {
            assert!(out.contains(&format!("{N} iters in ")), "{out}");
            assert!(out.contains(&bytes), "{out}");
            assert!(figure(out, "usec/iter") > 0.0, "{out}");
            assert!(figure(out, "Mbit/sec") > 0.0, "{out}");
            assert!(out.contains("GID ::ffff:10.77.0."), "{out}");
            let c = counters(out);
            for word in [
                "retransmits",
                "ack-timeouts",
                "seq-naks-sent",
                "seq-naks-received",
                "rnr-naks-sent",
                "rnr-naks-received",
                "duplicates",
                "out-of-sequence",
            ] {
                assert_eq!(count_before(c, word), 0, "{word}: {c}");
            }
            // Every message is ceil(size / 1024) packets at path MTU 1024,
            // sent once and taken once.
            let packets = N * size.div_ceil(1024) as u64;
            assert_eq!(count_before(c, "packets"), packets, "{c}");
            assert_eq!(count_before(c, "received"), packets, "{c}");
        }
        // Each side connected to the QP the other announced.
        assert_eq!(
            qpn(&client, "remote address:"),
            qpn(&server_out, "local address:")
        );
        assert_eq!(
            qpn(&server_out, "remote address:"),
            qpn(&client, "local address:")
        );
    }
}

#[test]
fn rc_pingpong_server_goes_away() {
    need_root!();
    let topo = Topo::up("rcgo");
    // The server runs 50 iterations and exits; the client wants 200.
    let server = topo.rc_server(&["-c", "50", "-s", "1"]);
    let started = Instant::now();
    let o = topo.rc_client(
        &["-c", "200", "-s", "1", "-W", "2"],
        Duration::from_secs(60),
    );
    let client = text(&o);
    let (code, sout, serr) = server.wait();
    eprintln!("client:\n{client}\nserver:\n{sout}{serr}");
    assert_eq!(code, 0, "{sout}{serr}");
    assert!(sout.contains("50 iters in"), "{sout}");
    assert_eq!(o.status.code(), Some(2), "{client}");
    let stderr = String::from_utf8_lossy(&o.stderr);
    let errors: Vec<&str> = stderr.lines().collect();
    assert_eq!(errors.len(), 1, "one error line: {stderr}");
    assert!(
        errors[0].starts_with("uping: iteration 51 of 200: ")
            && errors[0].contains("10.77.0.2:18515 stopped answering"),
        "{stderr}"
    );
    assert!(!client.contains("iters in"), "{client}");
    eprintln!(
        "the client gave up {:.1} s after it started",
        started.elapsed().as_secs_f64()
    );

    // Killed mid-run: nothing acknowledges the client's next message, its
    // QP spends its retries and the run ends on that completion's error.
    let server = topo.rc_server(&["-c", "100000000", "-s", "1"]);
    let mut child = spawn_rc_client(
        &topo.ns("linux"),
        &topo.linux_if(),
        &["-c", "100000000", "-s", "1"],
    );
    // The client prints the server's address once the server's QP is
    // connected, and posts its first message at once.
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    while !seen.contains("remote address:") {
        let before = seen.len();
        out.read_line(&mut seen).unwrap();
        assert!(seen.len() > before, "the client ended early: {seen}");
    }
    drop(server); // SIGKILL
    let rest = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let o = wait_limited(child, Duration::from_secs(60));
    let t = format!("{seen}{}{}", rest.join().unwrap(), text(&o));
    eprintln!("client of a killed server:\n{t}");
    assert_eq!(o.status.code(), Some(2), "{t}");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(stderr.lines().count(), 1, "one error line: {stderr}");
    assert!(
        stderr.starts_with("uping: iteration ")
            && stderr.contains("10.77.0.2:18515 stopped answering"),
        "{stderr}"
    );
}
