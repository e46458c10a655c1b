//! Stock programs on ustack, unmodified, under `ustack exec`
//! (`LD_PRELOAD` of `libustack_preload.so`), against Linux and against each
//! other, in namespaces made by each test (`tools/netns.sh`): ustack as
//! 10.77.0.2 on `TAG-s`, the Linux kernel as 10.77.0.1 on `TAG-l`, and a
//! second ustack as 10.77.0.3 on `TAG-l` beside the kernel (pcap takes its
//! own MAC) where both ends run on ustack.
//!
//! - sockperf TCP ping-pong and throughput: no message dropped, duplicated
//!   or reordered, and every byte the throughput client's stack sent
//!   received by the other end (a ustack stack's TCP totals, or the Linux
//!   sockperf server's own count), and sockperf's count of messages sent
//!   matching those bytes (see `check_sent` for its one-message slack);
//! - iperf3 3.12 forward, `-R`, `-P 4`: both sides' byte counts agree;
//!   over UDP (`-u`), the receiver counted every datagram sent;
//! - redis-server under redis-benchmark GET/SET (50 clients, `-P 1` and
//!   `-P 16`): every request answered and counted by the server;
//! - nginx single process and master + 1 worker (`--fork child`), sendfile
//!   on and off: files byte-exact (SHA-256), wrk's byte total its requests
//!   times the response size, no socket error;
//! - memcached -t 4 under memcaslap, and values byte-exact;
//! - every program's stack ends with every pool at zero (the last
//!   telemetry line before the socket closes), and `utop --once` shows the
//!   program while it runs;
//! - bad input from a Python script: the errno Linux gives.
//!
//! - redis BGSAVE (fork, the stack stays with the parent) under load; a
//!   `--fork child` stack's telemetry moves with it; EPIPE after a
//!   reported reset; EAGAIN from a full UDP send queue; MSG_PEEK.
//!
//! - nginx with two `reuseport` workers (`--fork each --workers 2`): a
//!   stack per worker, both serving.
//!
//! - a program that closes every descriptor it did not open (`close`
//!   loop, `close_range`, `closefrom`, and stock ssh) keeps its stack.
//!
//! The library is looked for where tools/test.sh's release build puts it
//! (a release library beside a debug `ustack`: the stack is fast, and both
//! come from the same sources); without it the tests are skipped and say
//! how to build it. The tests take turns (one lock): each drives a loaded
//! stack on a 2-CPU machine.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use common::lab::*;
use common::{Daemon, TelemetryTail, no_crash, pools_in_use, sha256, stdout_json};

/// One test at a time: each loads the machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

// ------------------------------------------------------------ the set-up

impl Lab {
    /// The Python peer ([`PEER`]) on the Linux host at 10.77.0.1: it resets
    /// every connection to `reset_port` and echoes on `echo_port`; returned
    /// once it listens.
    fn linux_echo_peer(&self, reset_port: u16, echo_port: u16) -> Daemon {
        let script = self.path("peer.py");
        std::fs::write(&script, PEER).unwrap();
        let mut peer = self.linux_daemon(&[
            PYTHON,
            &script.display().to_string(),
            "10.77.0.1",
            &reset_port.to_string(),
            &echo_port.to_string(),
        ]);
        use std::io::BufRead;
        let out = peer.child.as_mut().unwrap().stdout.take().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(out).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "the peer did not start");
        peer
    }
}

// ------------------------------------------------------------ sockperf

const SOCKPERF_PORT: &str = "11111";
/// sockperf's message size (passed explicitly: the byte checks use it).
const SOCKPERF_MSG: u64 = 64;

/// A sockperf client's command line (2 s).
fn sockperf_client<'a>(mode: &'a str, server: &'a str) -> [&'a str; 11] {
    [
        "sockperf",
        mode,
        "--tcp",
        "-i",
        server,
        "-p",
        SOCKPERF_PORT,
        "-t",
        "2",
        "-m",
        "64",
    ]
}

/// A ping-pong's summary: every message answered once, in order; (round
/// trips, p50 µs, p99 µs).
fn check_pingpong(what: &str, out: &str) -> (u64, f64, f64) {
    let sent: u64 = cap(out, r"\[Valid Duration\].*SentMessages=(\d+)");
    let received: u64 = cap(out, r"\[Valid Duration\].*ReceivedMessages=(\d+)");
    let dropped: u64 = cap(out, r"# dropped messages = (\d+)");
    let dup: u64 = cap(out, r"# duplicated messages = (\d+)");
    let ooo: u64 = cap(out, r"# out-of-order messages = (\d+)");
    assert_eq!(
        (dropped, dup, ooo),
        (0, 0, 0),
        "{what}: dropped, duplicated, out of order:\n{out}"
    );
    assert_eq!(sent, received, "{what}:\n{out}");
    assert!(
        sent >= 200,
        "{what}: only {sent} round trips in 1.5 s:\n{out}"
    );
    let p50: f64 = cap(out, r"percentile 50\.000 =\s*([\d.]+)");
    let p99: f64 = cap(out, r"percentile 99\.000 =\s*([\d.]+)");
    (sent, p50, p99)
}

/// A throughput client's message count (at least a few thousand).
fn check_throughput(what: &str, out: &str) -> u64 {
    let n: u64 = cap(out, r"Total of (\d+) messages sent");
    assert!(n >= 5_000, "{what}: only {n} messages in 2 s:\n{out}");
    n
}

/// What a throughput client's stack sent (`bytes`) against the client's
/// count of messages: that count, or one message fewer. sockperf counts a
/// message before its `send` and keeps it counted when the end-of-run
/// SIGALRM interrupts that `send` before a byte was queued (EINTR: its
/// handler has no SA_RESTART, and a kernel socket returns the same), so
/// its total can name one message no socket ever took. Seen here: the
/// client said 1935579 messages, its last `sendto` returned EINTR, its
/// stack's `bytes_out` and the Linux server's own count were both 1935578.
fn check_sent(what: &str, msgs: u64, bytes: u64) {
    assert!(
        bytes == msgs * SOCKPERF_MSG || bytes + SOCKPERF_MSG == msgs * SOCKPERF_MSG,
        "{what}: {bytes} bytes left for {msgs} messages of {SOCKPERF_MSG} B"
    );
}

/// Wait until the ustack server behind `sock` has received `want` more
/// TCP bytes than `before` (or, with `one_short`, one message fewer that
/// stays so for a second: see [`check_sent`]), and say what it got.
fn server_received(sock: &Path, before: u64, want: u64, one_short: bool) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut short_since: Option<Instant> = None;
    loop {
        let got = tcp_bytes(&common::telemetry(sock)).0 - before;
        if got >= want || Instant::now() >= deadline {
            return got;
        }
        if one_short && got + SOCKPERF_MSG == want {
            let since = *short_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= Duration::from_secs(1) {
                return got;
            }
        } else {
            short_since = None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A Linux sockperf server's count of the messages it received (its
/// summary line at SIGINT), once the client's connection has closed
/// (the server read every byte up to the FIN).
fn linux_server_received(lab: &Lab, server: common::Daemon) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let o = lab.linux(&["ss", "-Htn", "sport", "=", ":11111"]);
        if text(&o).trim().is_empty() || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = Command::new("kill")
        .args(["-INT", &server.pid().to_string()])
        .status();
    let (_, out, err) = server.wait();
    let all = format!("{out}{err}");
    cap(&all, r"Total (\d+) messages received and handled")
}

/// sockperf TCP ping-pong and throughput, server and client each on
/// ustack: against Linux both ways, and against each other.
#[test]
fn sockperf_tcp_on_ustack_against_linux_and_itself() {
    need_root!();
    need_program!("sockperf", "sockperf");
    let _turn = serial();
    let lab = Lab::new("pk", need_preload!());
    let mut figures = Vec::new();

    // 1. Server on ustack, Linux client.
    let server = lab.start(
        Host::Stack,
        false,
        &[
            "sockperf",
            "server",
            "--tcp",
            "-i",
            "10.77.0.2",
            "-p",
            SOCKPERF_PORT,
        ],
    );
    lab.wait_port("10.77.0.2", 11111);
    let o = lab.linux(&sockperf_client("ping-pong", "10.77.0.2"));
    let (n, p50, p99) = check_pingpong("Linux -> ustack ping-pong", &text(&o));
    figures.push(format!(
        "ping-pong Linux client -> ustack server: {n} round trips, p50 {p50} us, p99 {p99} us"
    ));
    server.check_utop();
    let before = tcp_bytes(&common::telemetry(&server.sock)).0;
    let o = lab.linux(&sockperf_client("throughput", "10.77.0.2"));
    let msgs = check_throughput("Linux -> ustack throughput", &text(&o));
    // The sender is Linux's: sockperf's count is all there is to go by.
    let got = server_received(&server.sock, before, msgs * SOCKPERF_MSG, true);
    check_sent("the ustack server got", msgs, got);
    figures.push(format!(
        "throughput Linux client -> ustack server: {msgs} messages of {SOCKPERF_MSG} B in 2 s"
    ));

    // 2. Both on ustack: a client stack beside the kernel on the Linux side.
    let client = lab.run(Host::LinuxSide, &sockperf_client("ping-pong", "10.77.0.2"));
    client.check(0);
    let (n, p50, p99) = check_pingpong("ustack -> ustack ping-pong", &client.out);
    figures.push(format!(
        "ping-pong ustack client -> ustack server: {n} round trips, p50 {p50} us, p99 {p99} us"
    ));
    let before = tcp_bytes(&common::telemetry(&server.sock)).0;
    let client = lab.run(Host::LinuxSide, &sockperf_client("throughput", "10.77.0.2"));
    client.check(0);
    let msgs = check_throughput("ustack -> ustack throughput", &client.out);
    let sent = client.tcp_bytes().1;
    check_sent("the ustack client's stack sent", msgs, sent);
    let got = server_received(&server.sock, before, sent, false);
    assert_eq!(
        got, sent,
        "the ustack server got {got} bytes of the {sent} the client's stack sent ({msgs} messages)"
    );
    figures.push(format!(
        "throughput ustack client -> ustack server: {msgs} messages of {SOCKPERF_MSG} B in 2 s"
    ));

    // sockperf has no SIGTERM handler: the signal ends it (no exit code,
    // no atexit), so its last line is the last periodic snapshot.
    server.stop().check(-1);

    // 3. Client on ustack, Linux server (a fresh one for the throughput
    // run: its count at exit is of that run's messages).
    let linux_server = || {
        let d = lab.linux_daemon(&[
            "sockperf",
            "server",
            "--tcp",
            "-i",
            "10.77.0.1",
            "-p",
            SOCKPERF_PORT,
        ]);
        std::thread::sleep(Duration::from_millis(500));
        d
    };
    let server = linux_server();
    let client = lab.run(Host::Stack, &sockperf_client("ping-pong", "10.77.0.1"));
    client.check(0);
    let (n, p50, p99) = check_pingpong("ustack -> Linux ping-pong", &client.out);
    figures.push(format!(
        "ping-pong ustack client -> Linux server: {n} round trips, p50 {p50} us, p99 {p99} us"
    ));
    drop(server);
    let server = linux_server();
    let client = lab.run(Host::Stack, &sockperf_client("throughput", "10.77.0.1"));
    client.check(0);
    let msgs = check_throughput("ustack -> Linux throughput", &client.out);
    let sent = client.tcp_bytes().1;
    check_sent("the ustack client's stack sent", msgs, sent);
    let received = linux_server_received(&lab, server);
    assert_eq!(
        received * SOCKPERF_MSG,
        sent,
        "the Linux server received {received} messages, the ustack client's stack sent {sent} bytes ({msgs} messages by sockperf's count)"
    );
    figures.push(format!(
        "throughput ustack client -> Linux server: {msgs} messages of {SOCKPERF_MSG} B in 2 s"
    ));

    for f in figures {
        eprintln!("sockperf {f}");
    }
}

// ------------------------------------------------------------ iperf3

/// The iperf3 runs of each pairing: forward, reverse, four streams.
const IPERF3_RUNS: [&[&str]; 3] = [&[], &["-R"], &["-P", "4"]];

/// A client's and its server's `-J` reports of one test: no error, the
/// streams asked for, the server's own count of what it measured equal to
/// the one the client reports for it, and what arrived is what was sent
/// less what was in flight at the end. Returns the receiver's Gbit/s.
fn check_iperf3(what: &str, args: &[&str], client: &Value, server: &Value) -> f64 {
    for (side, j) in [("client", client), ("server", server)] {
        assert!(j.get("error").is_none(), "{what} {args:?} {side}: {j}");
    }
    let want = args
        .iter()
        .position(|a| *a == "-P")
        .map_or(1, |i| args[i + 1].parse().unwrap());
    for (side, j) in [("client", client), ("server", server)] {
        let streams = j["end"]["streams"].as_array().map_or(0, Vec::len);
        assert_eq!(streams, want, "{what} {args:?} {side} streams: {j}");
    }
    let sent = client["end"]["sum_sent"]["bytes"].as_u64().unwrap();
    let received = client["end"]["sum_received"]["bytes"].as_u64().unwrap();
    assert!(sent > 10 << 20, "{what} {args:?}: only {sent} bytes sent");
    assert!(
        received <= sent && received + (8 << 20) * want as u64 >= sent,
        "{what} {args:?}: sent {sent}, received {received}"
    );
    // The server measures one side (the other sum is 0 in its JSON).
    let key = if args.contains(&"-R") {
        "sum_sent"
    } else {
        "sum_received"
    };
    assert_eq!(
        server["end"][key]["bytes"], client["end"][key]["bytes"],
        "{what} {args:?} {key}: the server counted other bytes than the client reports"
    );
    client["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0)
        / 1e9
}

/// Stock iperf3 3.12 (`-s -4 -1` and `-c`: forward, `-R`, `-P 4`) on ustack
/// against Linux both ways, and against itself; every ustack process ends
/// with its pools at zero.
#[test]
fn iperf3_on_ustack_against_linux_and_itself() {
    need_root!();
    need_program!("iperf3", "iperf3");
    let _turn = serial();
    let lab = Lab::new("pi", need_preload!());
    let mut figures = Vec::new();
    let client_args = |server: &'static str, extra: &[&'static str]| {
        let mut a = vec!["iperf3", "-c", server, "-t", "2", "-J"];
        a.extend_from_slice(extra);
        a
    };

    for extra in IPERF3_RUNS {
        // Server on ustack (-4: without it iperf3 opens an AF_INET6
        // socket, which goes to the kernel by design), Linux client.
        let server = lab.start(Host::Stack, false, &["iperf3", "-s", "-4", "-1", "-J"]);
        lab.wait_arp("10.77.0.2");
        std::thread::sleep(Duration::from_millis(500));
        let args = client_args("10.77.0.2", extra);
        let o = lab.linux(&args);
        let client = stdout_json("Linux iperf3 -c", &o.stdout, &o.stderr);
        let end = server.wait_within(Duration::from_secs(15));
        end.check(0);
        let theirs = stdout_json("ustack iperf3 -s", end.out.as_bytes(), end.err.as_bytes());
        let g = check_iperf3("Linux -> ustack", extra, &client, &theirs);
        figures.push(format!("Linux -c -> ustack -s {extra:?}: {g:.2} Gbit/s"));

        // Client on ustack, Linux server.
        let linux_server = lab.topo.linux_iperf3_server();
        let end = lab.run(Host::Stack, &client_args("10.77.0.1", extra));
        end.check(0);
        let client = stdout_json("ustack iperf3 -c", end.out.as_bytes(), end.err.as_bytes());
        let (code, out, err) = linux_server.wait();
        assert_eq!(code, 0, "Linux iperf3 -s: {out}{err}");
        let theirs = stdout_json("Linux iperf3 -s", out.as_bytes(), err.as_bytes());
        let g = check_iperf3("ustack -> Linux", extra, &client, &theirs);
        figures.push(format!("ustack -c -> Linux -s {extra:?}: {g:.2} Gbit/s"));

        // Both on ustack.
        let server = lab.start(Host::Stack, false, &["iperf3", "-s", "-4", "-1", "-J"]);
        lab.wait_arp("10.77.0.2");
        std::thread::sleep(Duration::from_millis(500));
        let end = lab.run(Host::LinuxSide, &client_args("10.77.0.2", extra));
        end.check(0);
        let client = stdout_json("ustack iperf3 -c", end.out.as_bytes(), end.err.as_bytes());
        let end = server.wait_within(Duration::from_secs(15));
        end.check(0);
        let theirs = stdout_json("ustack iperf3 -s", end.out.as_bytes(), end.err.as_bytes());
        let g = check_iperf3("ustack -> ustack", extra, &client, &theirs);
        figures.push(format!("ustack -c -> ustack -s {extra:?}: {g:.2} Gbit/s"));
    }
    for f in figures {
        eprintln!("iperf3 {f}");
    }
}

/// An iperf3 UDP run's outcome, checked: both sides without error, the
/// streams asked for, and the receiving side counted what the sender sent
/// (but a tail still on the way) and lost a few percent at most (a quiet
/// veth).
/// Returns the datagrams received.
fn check_iperf3_udp(what: &str, args: &[&str], client: &Value, server: &Value) -> u64 {
    for (side, j) in [("client", client), ("server", server)] {
        assert!(j.get("error").is_none(), "{what} {args:?} {side}: {j}");
        let want = args
            .iter()
            .position(|a| *a == "-P")
            .map_or(1, |i| args[i + 1].parse().unwrap());
        let streams = j["end"]["streams"].as_array().map_or(0, Vec::len);
        assert_eq!(streams, want, "{what} {args:?} {side} streams: {j}");
    }
    let sum = &client["end"];
    let sent = sum["sum_sent"]["packets"].as_u64().unwrap_or(0);
    let got = sum["sum_received"]["packets"].as_u64().unwrap_or(0);
    let lost = sum["sum_received"]["lost_packets"].as_u64().unwrap_or(0);
    assert!(
        sent > 1000,
        "{what} {args:?}: only {sent} datagrams sent: {client}"
    );
    // The receiver counts up to the highest sequence number it saw: the
    // last datagrams may still be on the way when the test ends.
    assert!(
        got <= sent && got + sent / 20 >= sent,
        "{what} {args:?}: the receiver counted {got} of {sent} datagrams: {client}"
    );
    assert!(
        lost * 20 < sent,
        "{what} {args:?}: {lost} of {sent} datagrams lost: {client}"
    );
    sent - lost
}

/// Stock iperf3 over UDP (`-u`), the server on ustack: iperf3's UDP server
/// binds its port again after connecting the first socket to the client
/// (`SO_REUSEADDR`), so this needs UDP port sharing and connected-socket
/// demultiplexing. Forward, `-R`, `-P 2` and 8,000-byte datagrams (IP
/// fragments both ways), and the client on ustack against Linux's server.
#[test]
fn iperf3_udp_on_ustack_against_linux() {
    need_root!();
    need_program!("iperf3", "iperf3");
    let _turn = serial();
    let lab = Lab::new("pv", need_preload!());
    let runs: [&[&str]; 4] = [
        &["-b", "100M"],
        &["-b", "100M", "-R"],
        &["-b", "50M", "-P", "2"],
        &["-b", "50M", "-l", "8000"],
    ];
    let client_args = |server: &'static str, extra: &[&'static str]| {
        let mut a = vec!["iperf3", "-c", server, "-u", "-t", "2", "-J"];
        a.extend_from_slice(extra);
        a
    };
    for extra in runs {
        let server = lab.start(Host::Stack, false, &["iperf3", "-s", "-4", "-1", "-J"]);
        lab.wait_arp("10.77.0.2");
        std::thread::sleep(Duration::from_millis(500));
        let args = client_args("10.77.0.2", extra);
        let o = lab.linux(&args);
        let client = stdout_json("Linux iperf3 -c -u", &o.stdout, &o.stderr);
        let end = server.wait_within(Duration::from_secs(15));
        end.check(0);
        let theirs = stdout_json("ustack iperf3 -s", end.out.as_bytes(), end.err.as_bytes());
        let n = check_iperf3_udp("Linux -> ustack", &args, &client, &theirs);
        eprintln!("iperf3 -u Linux -c -> ustack -s {extra:?}: {n} datagrams");
    }
    let linux_server = lab.topo.linux_iperf3_server();
    let args = client_args("10.77.0.1", &["-b", "100M"]);
    let end = lab.run(Host::Stack, &args);
    end.check(0);
    let client = stdout_json(
        "ustack iperf3 -c -u",
        end.out.as_bytes(),
        end.err.as_bytes(),
    );
    let (code, out, err) = linux_server.wait();
    assert_eq!(code, 0, "Linux iperf3 -s: {out}{err}");
    let theirs = stdout_json("Linux iperf3 -s", out.as_bytes(), err.as_bytes());
    let n = check_iperf3_udp("ustack -> Linux", &args, &client, &theirs);
    eprintln!("iperf3 -u ustack -c -> Linux -s: {n} datagrams");
}

// ------------------------------------------------------------ redis

/// A redis-benchmark `--csv` report: (test, requests/s, p50 ms, p99 ms) per
/// test.
fn redis_csv(out: &str) -> Vec<(String, f64, f64, f64)> {
    let unq = |s: &str| s.trim().trim_matches('"').to_string();
    out.lines()
        .filter(|l| l.starts_with('"') && !l.starts_with("\"test\""))
        .map(|l| {
            let f: Vec<String> = l.split(',').map(unq).collect();
            let num = |i: usize| {
                f.get(i)
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or_else(|| panic!("field {i} of {l}"))
            };
            // test, rps, avg, min, p50, p95, p99, max
            (f[0].clone(), num(1), num(4), num(6))
        })
        .collect()
}

/// `redis-cli -h 10.77.0.2 ARGS` from the Linux host.
fn redis_cli(lab: &Lab, args: &[&str]) -> String {
    let o = lab.linux(&[&["redis-cli", "-h", "10.77.0.2"][..], args].concat());
    assert!(o.status.success(), "redis-cli {args:?}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A field of `redis-cli info`.
fn redis_info(lab: &Lab, section: &str, field: &str) -> String {
    let info = redis_cli(lab, &["info", section]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in {info}"))
        .trim()
        .to_string()
}

fn redis_commands(lab: &Lab) -> u64 {
    redis_info(lab, "stats", "total_commands_processed")
        .parse()
        .unwrap()
}

/// redis-benchmark GET and SET with 50 clients and `-n` requests each.
fn redis_benchmark_args(n: u64, pipeline: u32) -> Vec<String> {
    [
        "redis-benchmark",
        "-h",
        "10.77.0.2",
        "-t",
        "get,set",
        "-c",
        "50",
        "-n",
        &n.to_string(),
        "-P",
        &pipeline.to_string(),
        "--csv",
    ]
    .map(String::from)
    .to_vec()
}

/// Both tests reported (redis-benchmark reports a test once every request
/// of it was answered).
fn check_redis_benchmark(what: &str, o: &Output) -> Vec<(String, f64, f64, f64)> {
    let out = text(o);
    assert!(o.status.success(), "{what}: {out}");
    let rows = redis_csv(&out);
    let names: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(names, ["SET", "GET"], "{what}: {out}");
    assert!(rows.iter().all(|r| r.1 > 0.0), "{what}: {out}");
    rows
}

/// redis-server without persistence on ustack (its dump directory in the
/// lab), answering PING.
fn start_redis(lab: &Lab) -> (Preloaded, PathBuf) {
    let dir = lab.path("redis");
    std::fs::create_dir(&dir).unwrap();
    let dir_s = dir.display().to_string();
    let server = lab.start(
        Host::Stack,
        false,
        &[
            "redis-server",
            "--port",
            "6379",
            "--bind",
            "10.77.0.2",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--dir",
            &dir_s,
        ],
    );
    lab.wait_arp("10.77.0.2");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !lab
        .linux(&["redis-cli", "-h", "10.77.0.2", "ping"])
        .stdout
        .starts_with(b"PONG")
    {
        assert!(
            Instant::now() < deadline,
            "redis-server never answered PING"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (server, dir)
}

/// redis-server (no persistence) on ustack under redis-benchmark GET/SET
/// with 50 clients, `-P 1` and `-P 16`: every request answered and counted
/// by the server.
#[test]
fn redis_server_on_ustack_under_redis_benchmark() {
    need_root!();
    need_program!("redis-server", "redis-server");
    need_program!("redis-benchmark", "redis-tools");
    let _turn = serial();
    let lab = Lab::new("pr", need_preload!());
    let (server, _) = start_redis(&lab);
    let mut figures = Vec::new();
    for (n, pipeline) in [(50_000u64, 1u32), (200_000, 16)] {
        let before = redis_commands(&lab);
        let args = redis_benchmark_args(n, pipeline);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = lab.linux(&args);
        for (test, rps, p50, p99) in check_redis_benchmark(&format!("-P {pipeline}"), &o) {
            figures.push(format!(
                "{test} -P {pipeline}: {rps:.0} requests/s, p50 {p50} ms, p99 {p99} ms"
            ));
        }
        // Every request counted by the server; besides them come
        // redis-benchmark's CONFIG GETs and the first INFO.
        let done = redis_commands(&lab) - before;
        assert!(
            (2 * n..=2 * n + 8).contains(&done),
            "-P {pipeline}: the server processed {done} commands for 2 x {n} requests"
        );
        if pipeline == 1 {
            server.check_utop();
        }
    }
    server.stop().check(0);
    for f in figures {
        eprintln!("redis {f}");
    }
}

/// BGSAVE (a fork; the stack stays with the parent) while redis-benchmark
/// runs: the save succeeds, every request is answered, and the server
/// keeps answering. With `--spin 0`.
#[test]
fn redis_bgsave_during_load() {
    need_root!();
    need_program!("redis-server", "redis-server");
    need_program!("redis-benchmark", "redis-tools");
    let _turn = serial();
    let lab = Lab::new("ps", need_preload!());
    // Without run to completion: every wait sleeps and the stack's own
    // thread does all the polling (the other tests drive it themselves).
    lab.spin.set(Some(0));
    let (server, dir) = start_redis(&lab);
    let before = redis_commands(&lab);
    let n = 150_000u64;
    let args = redis_benchmark_args(n, 1);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let load = Command::new("ip")
        .args(["netns", "exec", &lab.topo.ns("linux")])
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut load = Daemon::new(load);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        load.child.as_mut().unwrap().try_wait().unwrap().is_none(),
        "the load ended before BGSAVE"
    );
    let reply = redis_cli(&lab, &["bgsave"]);
    assert!(reply.contains("Background saving started"), "{reply}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while redis_info(&lab, "persistence", "rdb_bgsave_in_progress") != "0" {
        assert!(Instant::now() < deadline, "BGSAVE never ended");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        redis_info(&lab, "persistence", "rdb_last_bgsave_status"),
        "ok"
    );
    assert!(
        dir.join("dump.rdb").is_file(),
        "no dump.rdb in {}",
        dir.display()
    );
    let o = load.child.take().unwrap().wait_with_output().unwrap();
    for (test, rps, p50, p99) in check_redis_benchmark("-P 1 during BGSAVE", &o) {
        eprintln!(
            "redis {test} -P 1 during BGSAVE: {rps:.0} requests/s, p50 {p50} ms, p99 {p99} ms"
        );
    }
    // Every request counted (and the INFOs that watched the save).
    let done = redis_commands(&lab) - before;
    assert!(
        done >= 2 * n,
        "the server processed {done} commands for 2 x {n} requests"
    );
    assert_eq!(redis_cli(&lab, &["ping"]).trim(), "PONG");
    let end = server.stop();
    end.check(0);
    assert!(
        end.out
            .contains("Background saving terminated with success"),
        "{}",
        end.out
    );
}

// ------------------------------------------------------------ nginx

/// A 100-byte and a 1 MiB file.
const NGINX_FILES: [(&str, usize); 2] = [("small.bin", 100), ("big.bin", 1 << 20)];

/// Responses nginx sends on one connection; the last says `Connection:
/// close` (5 bytes shorter than `keep-alive`) and wrk connects again.
const KEEPALIVE_REQUESTS: u64 = 1000;

/// wrk's exact totals, printed by a `done` hook.
const WRK_SCRIPT: &str = r#"
done = function(summary, latency, requests)
  io.write(string.format(
    "WRK requests=%d bytes=%d connect=%d read=%d write=%d status=%d timeout=%d p50=%d p99=%d\n",
    summary.requests, summary.bytes, summary.errors.connect, summary.errors.read,
    summary.errors.write, summary.errors.status, summary.errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"#;

/// An nginx prefix in `root`: the two files under `html/` and a
/// configuration (returned): one process, or a master and `workers`
/// workers; sendfile on or off.
fn nginx_conf(root: &Path, master: bool, workers: u32, sendfile: bool, reuseport: bool) -> PathBuf {
    std::fs::create_dir_all(root.join("html")).unwrap();
    std::fs::create_dir_all(root.join("tmp")).unwrap();
    for (name, size) in NGINX_FILES {
        let (tmp, _) = common::random_file(size);
        std::fs::copy(&tmp, root.join("html").join(name)).unwrap();
    }
    let r = root.display();
    let conf = format!(
        "daemon off;\n\
         master_process {master};\n\
         worker_processes {workers};\n\
         user root;\n\
         pid {r}/nginx.pid;\n\
         error_log {r}/error.log info;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n\
           access_log off;\n\
           keepalive_requests {KEEPALIVE_REQUESTS};\n\
           sendfile {sendfile};\n\
           client_body_temp_path {r}/tmp;\n\
           proxy_temp_path {r}/tmp;\n\
           fastcgi_temp_path {r}/tmp;\n\
           uwsgi_temp_path {r}/tmp;\n\
           scgi_temp_path {r}/tmp;\n\
           server {{\n\
             listen 10.77.0.2:8080{rp};\n\
             root {r}/html;\n\
           }}\n\
         }}\n",
        master = if master { "on" } else { "off" },
        sendfile = if sendfile { "on" } else { "off" },
        rp = if reuseport { " reuseport" } else { "" },
    );
    let path = root.join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    path
}

/// Curl each file (SHA-256 equal to the served one) and put wrk on it for
/// 2 s: no socket error, no bad status, and wrk's byte total its requests
/// times the response (headers as curl got them, and the file), within
/// the shorter `Connection: close` responses and one response per
/// connection cut off at the end. Returns the figures.
fn nginx_load(lab: &Lab, root: &Path, what: &str) -> Vec<String> {
    let script = lab.path("wrk.lua");
    std::fs::write(&script, WRK_SCRIPT).unwrap();
    let mut figures = Vec::new();
    for (name, size) in NGINX_FILES {
        let url = format!("http://10.77.0.2:8080/{name}");
        let got = lab.path(&format!("got-{name}"));
        let o = lab.linux(&[
            "curl",
            "-sS",
            "--fail",
            "-m",
            "10",
            "-o",
            &got.display().to_string(),
            "-w",
            "%{size_header} %{size_download}",
            &url,
        ]);
        assert!(o.status.success(), "{what} curl {name}: {}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let (header, body) = out.split_once(' ').expect("curl -w output");
        let header: u64 = header.parse().unwrap();
        assert_eq!(body.parse::<usize>().unwrap(), size, "{what} {name}: {out}");
        assert_eq!(
            sha256(&got),
            sha256(&root.join("html").join(name)),
            "{what}: {name} came back different"
        );

        let conns = 10u64;
        let o = lab.linux(&[
            "wrk",
            "-t",
            "1",
            "-c",
            &conns.to_string(),
            "-d",
            "2s",
            "-s",
            &script.display().to_string(),
            &url,
        ]);
        let out = text(&o);
        assert!(o.status.success(), "{what} wrk {name}: {out}");
        let requests: u64 = cap(&out, r"WRK requests=(\d+)");
        let bytes: u64 = cap(&out, r"WRK .*bytes=(\d+)");
        for e in ["connect", "read", "write", "status", "timeout"] {
            let n: u64 = cap(&out, &format!(r"WRK .*\b{e}=(\d+)"));
            assert_eq!(n, 0, "{what} wrk {name}: {e} errors: {out}");
        }
        assert!(!out.contains("Socket errors"), "{what} wrk {name}: {out}");
        assert!(requests >= 50, "{what} wrk {name}: {out}");
        // Every response whole: at least `requests` of them (less 5 bytes
        // for each that closed its connection), and no more than one
        // response per connection cut off at the end.
        let response = header + size as u64;
        let closing = requests / KEEPALIVE_REQUESTS;
        assert!(
            bytes >= requests * response - 5 * closing && bytes <= (requests + conns) * response,
            "{what} wrk {name}: {bytes} bytes for {requests} responses of {response} bytes \
             ({closing} of them 5 bytes shorter)"
        );
        let p50: u64 = cap(&out, r"WRK .*p50=(\d+)");
        let p99: u64 = cap(&out, r"WRK .*p99=(\d+)");
        let rps: f64 = cap(&out, r"Requests/sec:\s*([\d.]+)");
        figures.push(format!(
            "{what} {name}: {rps:.0} requests/s, p50 {p50} us, p99 {p99} us"
        ));
    }
    figures
}

/// nginx's error log: no panic of the layer went there (nginx points its
/// stderr at it).
fn nginx_error_log(root: &Path) -> String {
    std::fs::read_to_string(root.join("error.log")).unwrap_or_default()
}

/// nginx as one process (`master_process off`) and as a master with one
/// worker (`ustack exec --fork child`: the stack moves to the worker),
/// sendfile on and off, serving a 100-byte and a 1 MiB file to curl
/// (byte-exact) and wrk (byte totals right, no socket error). The single
/// process's stack ends with its pools at zero; the forked worker's
/// telemetry is in `nginx_fork_child_publishes_telemetry`.
#[test]
fn nginx_on_ustack_single_process_and_master_with_one_worker() {
    need_root!();
    need_program!("nginx", "nginx-light");
    need_program!("wrk", "wrk");
    need_program!("curl", "curl");
    let _turn = serial();
    let lab = Lab::new("pn", need_preload!());
    let mut figures = Vec::new();
    for (master, sendfile) in [(false, true), (false, false), (true, true), (true, false)] {
        let what = format!(
            "nginx {} sendfile {}",
            if master {
                "master+1 worker"
            } else {
                "single process"
            },
            if sendfile { "on" } else { "off" }
        );
        let root = lab.path(&format!("nginx-{master}-{sendfile}"));
        let conf = nginx_conf(&root, master, 1, sendfile, false);
        let (conf_s, root_s) = (conf.display().to_string(), root.display().to_string());
        let program = ["nginx", "-c", &conf_s, "-p", &root_s];
        if master {
            // No telemetry here: see nginx_fork_child_publishes_telemetry.
            let server = lab.start_with(Host::Stack, true, false, &program);
            lab.wait_port("10.77.0.2", 8080);
            figures.extend(nginx_load(&lab, &root, &what));
            let end = server.stop();
            let log = nginx_error_log(&root);
            assert_eq!(end.code, 0, "{what}: {}{}{log}", end.out, end.err);
            no_crash(&format!("{}{log}", end.err));
            assert!(
                log.contains("worker process") && log.contains("exited with code 0"),
                "{what}: {log}"
            );
        } else {
            let server = lab.start(Host::Stack, false, &program);
            lab.wait_port("10.77.0.2", 8080);
            figures.extend(nginx_load(&lab, &root, &what));
            server.check_utop();
            let end = server.stop();
            end.check(0);
            no_crash(&nginx_error_log(&root));
        }
    }
    for f in figures {
        eprintln!("{f}");
    }
}

/// With `--fork child` the stack's loop moves to nginx's worker, but the
/// telemetry publisher's thread stays in the master.
#[test]
fn nginx_fork_child_publishes_telemetry() {
    need_root!();
    need_program!("nginx", "nginx-light");
    need_program!("curl", "curl");
    let _turn = serial();
    let lab = Lab::new("pf", need_preload!());
    let root = lab.path("nginx");
    let conf = nginx_conf(&root, true, 1, true, false);
    let (conf_s, root_s) = (conf.display().to_string(), root.display().to_string());
    let server = lab.start(Host::Stack, true, &["nginx", "-c", &conf_s, "-p", &root_s]);
    lab.wait_port("10.77.0.2", 8080);
    let o = lab.linux(&[
        "curl",
        "-sS",
        "--fail",
        "-o",
        "/dev/null",
        "http://10.77.0.2:8080/small.bin",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let (code, out, err) = utop_once(&server.sock);
    assert_eq!(code, 0, "utop --once: {out}{err}");
    assert!(out.contains("Pools"), "{out}");
    let end = server.stop();
    end.check(0);
    no_crash(&nginx_error_log(&root));
}

/// nginx with two workers and `reuseport` under `--fork each --workers 2`:
/// the master's stack ends at its first fork and each worker runs a stack
/// of its own on the interface (replica 0 and 1), serving the connections
/// whose flow hash names it. Files byte-exact and wrk's byte totals right
/// (as for one worker); both workers served and saw the other's frames go
/// by; each worker's stack ends with every pool at zero, and utop attaches
/// to each.
#[test]
fn nginx_two_workers_reuseport() {
    need_root!();
    need_program!("nginx", "nginx-light");
    need_program!("wrk", "wrk");
    need_program!("curl", "curl");
    let _turn = serial();
    let lab = Lab::new("p2", need_preload!());
    lab.fork_each.set(Some(2));
    let root = lab.path("nginx");
    let conf = nginx_conf(&root, true, 2, true, true);
    let (conf_s, root_s) = (conf.display().to_string(), root.display().to_string());
    let program = ["nginx", "-c", &conf_s, "-p", &root_s];
    // The master's own socket lives only until its first fork: no reader
    // on it; one on each worker's (`PATH.wK`).
    let (mut c, sock) = lab.exec(Host::Stack, false, true, &program);
    let worker_sock = |k: usize| {
        let mut p = sock.clone().into_os_string();
        p.push(format!(".w{k}"));
        PathBuf::from(p)
    };
    let tails: Vec<TelemetryTail> = (0..2)
        .map(|k| TelemetryTail::attach(&worker_sock(k)))
        .collect();
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start nginx");
    let server = Preloaded {
        what: program.join(" "),
        tree: Tree::new(child.id()),
        daemon: Daemon::new(child),
        tail: None,
        sock: sock.clone(),
    };
    lab.wait_port("10.77.0.2", 8080);
    for f in nginx_load(&lab, &root, "nginx 2 workers reuseport") {
        eprintln!("{f}");
    }
    for k in 0..2 {
        let (code, out, err) = utop_once(&worker_sock(k));
        assert_eq!(code, 0, "utop --once on worker {k}: {out}{err}");
        assert!(out.contains("Pools") && out.contains("pcap-"), "{out}");
    }
    let end = server.stop();
    end.check(0);
    no_crash(&nginx_error_log(&root));
    for (k, tail) in tails.into_iter().enumerate() {
        let (lines, last) = tail.last(STOP_WITHIN);
        let pools = pools_in_use(&last);
        assert!(
            pools.iter().all(|p| p.1 == 0),
            "worker {k}: pool buffers in use at its end ({lines} lines): {pools:?}"
        );
        // A replica's snapshot carries its place among the shards.
        let shard = &last["shards"][0]["shard"];
        assert_eq!(shard["index"], k, "worker {k}: {shard}");
        assert_eq!(shard["count"], 2, "worker {k}: {shard}");
        let (bytes_in, bytes_out) = tcp_bytes(&last);
        assert!(
            bytes_in > 0 && bytes_out > 0,
            "worker {k} served nothing: {}",
            last["stack"]["tcp"]
        );
        let not_ours = shard["not_ours"].as_u64().unwrap_or(0);
        assert!(
            not_ours > 0,
            "worker {k} saw none of the other's frames: {shard}"
        );
        eprintln!(
            "worker {k}: {bytes_in} bytes in, {bytes_out} out, {not_ours} frames left to the other"
        );
    }
}

// ------------------------------------------------------------ memcached

/// Values of many sizes (binary, with the protocol's own `\r\nEND\r\n` in
/// them) set and got back one by one and all at once, then misses; prints
/// `ok VALUES BYTES MISSES`.
const MEMCACHED_CLIENT: &str = r#"
import random, socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
f = s.makefile("rb")
rnd = random.Random(7)
vals = {}
for i, n in enumerate([0, 1, 2, 7, 100, 1000, 1460, 4096, 65536, 100000, 500000, 1000000]):
    v = rnd.randbytes(n)
    if n >= 16:
        v = v[:4] + b"\r\nEND\r\n" + v[11:]
    key = "key%d" % i
    s.sendall(b"set %s %d 0 %d\r\n" % (key.encode(), i, n) + v + b"\r\n")
    line = f.readline()
    assert line == b"STORED\r\n", (key, n, line)
    vals[key] = (i, v)

def get(keys):
    s.sendall(b"get " + b" ".join(k.encode() for k in keys) + b"\r\n")
    got = {}
    while True:
        line = f.readline()
        if line == b"END\r\n":
            return got
        word, k, flags, n = line.split()
        assert word == b"VALUE", line
        data = f.read(int(n) + 2)
        assert data.endswith(b"\r\n"), (k, len(data))
        got[k.decode()] = (int(flags), data[:-2])

for k in vals:
    assert get([k]) == {k: vals[k]}, k
assert get(list(vals)) == vals
misses = ["nokey1", "nokey2", "nokey3"]
assert get(misses) == {}
print("ok", len(vals), sum(len(v) for _, v in vals.values()), len(misses))
"#;

/// memcached's `stats`, from the Linux host.
fn memcached_stats(lab: &Lab) -> std::collections::HashMap<String, u64> {
    let o = lab.linux(&[
        "sh",
        "-c",
        "printf 'stats\\r\\nquit\\r\\n' | nc -q 2 10.77.0.2 11211",
    ]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let stats: std::collections::HashMap<String, u64> = out
        .lines()
        .filter_map(|l| {
            let mut w = l.trim().strip_prefix("STAT ")?.split_whitespace();
            Some((w.next()?.to_string(), w.next()?.parse().ok()?))
        })
        .collect();
    assert!(
        stats.contains_key("cmd_get"),
        "memcached stats: {}",
        text(&o)
    );
    stats
}

/// memcached -t 4 on ustack (connections accepted on one thread and
/// served on others) under memcaslap: no error, no miss, the server counted
/// the client's commands; values byte-exact from a small client; misses
/// counted as sent.
#[test]
fn memcached_on_ustack_under_memcaslap() {
    need_root!();
    need_program!("memcached", "memcached");
    need_program!("memcaslap", "libmemcached-tools");
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("pm", need_preload!());
    let server = lab.start(
        Host::Stack,
        false,
        &[
            "memcached",
            "-u",
            "root",
            "-t",
            "4",
            "-l",
            "10.77.0.2",
            "-p",
            "11211",
            "-U",
            "0",
        ],
    );
    lab.wait_port("10.77.0.2", 11211);

    let o = lab.linux(&[
        "memcaslap",
        "-s",
        "10.77.0.2:11211",
        "-t",
        "3s",
        "-c",
        "32",
        "-T",
        "2",
    ]);
    let out = text(&o);
    assert!(o.status.success(), "memcaslap: {out}");
    let lower = out.to_lowercase();
    assert!(
        !lower.contains("error") && !lower.contains("fail"),
        "memcaslap: {out}"
    );
    let gets: u64 = cap(&out, r"cmd_get: (\d+)");
    let sets: u64 = cap(&out, r"cmd_set: (\d+)");
    let misses: u64 = cap(&out, r"get_misses: (\d+)");
    let tps: u64 = cap(&out, r"TPS: (\d+)");
    assert!(gets > 1000 && sets > 100, "memcaslap: {out}");
    // memcaslap sets every key before it gets it.
    assert_eq!(misses, 0, "memcaslap: {out}");
    let stats = memcached_stats(&lab);
    assert_eq!(stats["get_misses"], 0, "{stats:?}");
    // The client counts a command when it sends it: at the end of the run
    // at most one per connection was not answered yet.
    for (key, client) in [("cmd_get", gets), ("cmd_set", sets)] {
        let server_count = stats[key];
        assert!(
            server_count <= client && server_count + 32 >= client,
            "{key}: memcaslap sent {client}, memcached counted {server_count}"
        );
    }
    assert!(stats["total_connections"] >= 32, "{stats:?}");
    server.check_utop();

    let script = lab.path("mc.py");
    std::fs::write(&script, MEMCACHED_CLIENT).unwrap();
    let o = lab.linux(&[PYTHON, &script.display().to_string(), "10.77.0.2", "11211"]);
    let out = text(&o);
    assert!(
        o.status.success() && out.starts_with("ok 12 "),
        "memcached client: {out}"
    );
    let after = memcached_stats(&lab);
    assert_eq!(after["get_misses"], 3, "{after:?}");

    server.stop().check(0);
    eprintln!("memcached: memcaslap {tps} ops/s ({gets} gets, {sets} sets, {misses} misses)");
}

// ------------------------------------------------------------ bad input

/// The Linux side's peer: on RESET_PORT it resets each connection after its
/// first bytes (SO_LINGER 0, then close); on ECHO_PORT it echoes.
const PEER: &str = r#"
import socket, struct, sys, threading
ip, reset_port, echo_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def listener(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((ip, port))
    s.listen(16)
    return s

def resetter(s):
    while True:
        c, _ = s.accept()
        c.recv(100)
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()

def echo(c):
    try:
        while True:
            d = c.recv(65536)
            if not d:
                break
            c.sendall(d)
    except OSError:
        pass
    c.close()

def echoer(s):
    while True:
        c, _ = s.accept()
        threading.Thread(target=echo, args=(c,), daemon=True).start()

a, b = listener(reset_port), listener(echo_port)
threading.Thread(target=resetter, args=(a,), daemon=True).start()
print("ready", flush=True)
echoer(b)
"#;

/// Each case's outcome as one JSON object: "ok", a value, or the errno's
/// name.
const BAD_INPUT: &str = r#"
import errno, json, select, socket, sys, time
peer, reset_port, echo_port, closed_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
out = {}

def name(e):
    if e == errno.EOPNOTSUPP:
        return "EOPNOTSUPP"
    return errno.errorcode.get(e, str(e)) if e else "0"

def attempt(key, f):
    try:
        r = f()
        out[key] = "ok" if r is None else r
    except OSError as e:
        out[key] = name(e.errno)

# Socket options: one no kernel knows, twice (reported once), and
# TCP_CONGESTION cubic (accepted: the stack's algorithms are cubic and reno).
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
attempt("setsockopt_unknown", lambda: s.setsockopt(socket.IPPROTO_TCP, 9999, 1))
attempt("setsockopt_unknown_again", lambda: s.setsockopt(socket.IPPROTO_TCP, 9999, 1))
attempt("getsockopt_unknown", lambda: s.getsockopt(socket.SOL_SOCKET, 9999) and None)
attempt("setsockopt_congestion", lambda: s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"cubic"))
s.close()

# AF_INET6 goes to the kernel (no IPv6 in the namespaces).
attempt("inet6_socket", lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close())
s6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
attempt("inet6_connect", lambda: s6.connect(("2001:db8::1", 80)))
s6.close()

# A non-blocking connect: EINPROGRESS, then writable with SO_ERROR 0.
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setblocking(False)
out["nonblock_connect"] = name(s.connect_ex((peer, echo_port)))
_, w, _ = select.select([], [s], [], 5)
out["nonblock_select_writable"] = bool(w)
out["nonblock_so_error"] = name(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
p = select.poll()
p.register(s, select.POLLOUT)
out["nonblock_poll"] = [ev for _, ev in p.poll(5000)]
s.setblocking(True)
s.sendall(b"x")
out["echo"] = s.recv(10).decode()
# MSG_PEEK on TCP.
s.sendall(b"peek")
time.sleep(0.3)
attempt("msg_peek", lambda: s.recv(10, socket.MSG_PEEK).decode())
attempt("after_peek", lambda: s.recv(10).decode())
s.close()

# bind, then connect: the bound port is the connection's.
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 47123))
s.connect((peer, echo_port))
out["bound_connect_port"] = s.getsockname()[1]
s.sendall(b"b")
out["bound_connect_echo"] = s.recv(10).decode()
s2 = socket.socket()
s2.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s2.bind(("0.0.0.0", 47123))
attempt("bound_connect_same_flow", lambda: s2.connect((peer, echo_port)))
s2.close()
s.close()

# A closed port: ECONNREFUSED, blocking and not.
s = socket.socket()
attempt("connect_closed", lambda: s.connect((peer, closed_port)))
s.close()
s = socket.socket()
s.setblocking(False)
out["nonblock_connect_closed"] = name(s.connect_ex((peer, closed_port)))
select.select([], [s], [], 5)
out["nonblock_closed_so_error"] = name(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
s.close()

# A peer that resets mid-request.
s = socket.socket()
s.connect((peer, reset_port))
s.sendall(b"GET / HTTP/1.0\r\n")
attempt("reset_recv", lambda: s.recv(100))
attempt("reset_send_after", lambda: s.send(b"more"))
s.close()

print(json.dumps(out), flush=True)
"#;

/// Non-blocking UDP sends of 65,000-byte datagrams, faster than any link
/// drains them: how many were taken and how many failed with EAGAIN.
const UDP_FLOOD: &str = r#"
import errno, json, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
# The socket started the stack: one datagram resolves the peer's MAC, and
# the pause gives the test's telemetry reader time to attach (the flood
# itself is over in a fraction of a second, and the socket goes with the
# program).
s.sendto(b"hello", (sys.argv[1], 9))
time.sleep(0.5)
s.setblocking(False)
data = b"u" * 65000
sent = eagain = 0
worst = 0.0
for i in range(2000):
    t = time.monotonic()
    try:
        s.sendto(data, (sys.argv[1], 9))
        sent += 1
    except BlockingIOError:
        eagain += 1
    worst = max(worst, time.monotonic() - t)
print(json.dumps({"sent": sent, "eagain": eagain, "worst_ms": worst * 1000}), flush=True)
"#;

/// The bad-input script's results under ustack (10.77.0.2) and, for
/// reference, on the Linux kernel (10.77.0.1, its peer on the same host),
/// and the ustack run's stderr.
fn bad_input_results(short: &str) -> (Value, Value, String) {
    let lab = Lab::new(short, preload_lib().expect("the library"));
    let script = lab.path("bad.py");
    std::fs::write(&script, BAD_INPUT).unwrap();
    let script = script.display().to_string();
    let peer = lab.linux_echo_peer(7001, 7002);
    let args = ["10.77.0.1", "7001", "7002", "7003"];
    let o = lab.linux(&[&[PYTHON, &script][..], &args].concat());
    let linux = stdout_json("bad input on Linux", &o.stdout, &o.stderr);
    let end = lab.run(Host::Stack, &[&[PYTHON, &script][..], &args].concat());
    end.check(0);
    let ours = stdout_json(
        "bad input on ustack",
        end.out.as_bytes(),
        end.err.as_bytes(),
    );
    drop(peer);
    // The refusals are counted in the stack's telemetry too, and every
    // ustack descriptor was closed by the end.
    let last = end.last.as_ref().expect("a last telemetry line");
    let refused = last["app"]["preload_unsupported"].as_u64();
    assert!(refused.is_some_and(|n| n >= 3), "app counters: {last}");
    assert_eq!(last["app"]["preload_descriptors"], 0, "{last}");
    (ours, linux, end.err)
}

/// Bad input from an unmodified Python program: the errno Linux gives.
#[test]
fn bad_input_gets_the_errno_linux_gives() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let _ = need_preload!();
    let (ours, linux, err) = bad_input_results("pb");
    eprintln!("ustack: {ours}\nLinux:  {linux}");
    let want = [
        // An option no kernel knows: ENOPROTOOPT, as Linux.
        ("setsockopt_unknown", "ENOPROTOOPT"),
        ("setsockopt_unknown_again", "ENOPROTOOPT"),
        ("getsockopt_unknown", "ENOPROTOOPT"),
        // AF_INET6 is the kernel's: the socket opens, and connect fails as
        // on Linux (no IPv6 in the namespaces).
        ("inet6_socket", "ok"),
        ("nonblock_connect", "EINPROGRESS"),
        ("nonblock_so_error", "0"),
        ("echo", "x"),
        ("connect_closed", "ECONNREFUSED"),
        ("nonblock_connect_closed", "EINPROGRESS"),
        ("nonblock_closed_so_error", "ECONNREFUSED"),
        ("reset_recv", "ECONNRESET"),
        ("bound_connect_echo", "b"),
        // The same 4-tuple twice: Linux says EADDRNOTAVAIL.
        ("bound_connect_same_flow", "EADDRNOTAVAIL"),
    ];
    for (key, value) in want {
        assert_eq!(ours[key], value, "ustack {key}: {ours}");
        assert_eq!(linux[key], value, "Linux {key}: {linux}");
    }
    assert_eq!(
        ours["inet6_connect"], linux["inet6_connect"],
        "{ours} vs {linux}"
    );
    assert_ne!(ours["inet6_connect"], "ok", "{ours}");
    assert_eq!(ours["bound_connect_port"], 47123, "{ours}");
    assert_eq!(linux["bound_connect_port"], 47123, "{linux}");
    assert_eq!(ours["nonblock_select_writable"], true, "{ours}");
    // POLLOUT (4) alone.
    assert_eq!(ours["nonblock_poll"], serde_json::json!([4]), "{ours}");
    assert_eq!(
        ours["nonblock_poll"], linux["nonblock_poll"],
        "{ours} vs {linux}"
    );
    // TCP_CONGESTION cubic is accepted, as on Linux (the README's table).
    assert_eq!(ours["setsockopt_congestion"], "ok", "{ours}");
    assert_eq!(linux["setsockopt_congestion"], "ok", "{linux}");
    // MSG_PEEK on TCP leaves the bytes for the next read, as Linux does.
    assert_eq!(linux["msg_peek"], "peek", "{linux}");
    assert_eq!(ours["msg_peek"], linux["msg_peek"], "{ours}");
    assert_eq!(ours["after_peek"], linux["after_peek"], "{ours} vs {linux}");
    assert_eq!(linux["after_peek"], "peek", "{linux}");
    // Each refusal said once on stderr.
    let said = |what: &str| err.lines().filter(|l| l.contains(what)).count();
    assert_eq!(said("IPPROTO_TCP/9999 (ENOPROTOOPT)"), 1, "{err}");
    assert_eq!(said("SOL_SOCKET/9999 (ENOPROTOOPT)"), 1, "{err}");
}

/// After recv reported the reset, Linux says EPIPE on the next send (the
/// error is reported once; the socket is then closed).
#[test]
fn send_after_a_reported_reset_gives_epipe() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let _ = need_preload!();
    let (ours, linux, _) = bad_input_results("pe");
    assert_eq!(linux["reset_send_after"], "EPIPE", "{linux}");
    assert_eq!(
        ours["reset_send_after"], linux["reset_send_after"],
        "{ours}"
    );
}

/// A non-blocking UDP socket whose send queue is full: EAGAIN.
#[test]
fn udp_full_send_queue_nonblocking_gives_eagain() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("pu", need_preload!());
    let script = lab.path("udp.py");
    std::fs::write(&script, UDP_FLOOD).unwrap();
    let end = lab.run(
        Host::Stack,
        &[PYTHON, &script.display().to_string(), "10.77.0.1"],
    );
    end.check(0);
    let r = stdout_json("udp flood", end.out.as_bytes(), end.err.as_bytes());
    eprintln!("non-blocking UDP flood on ustack: {r}");
    assert!(r["eagain"].as_u64().unwrap() > 0, "no EAGAIN: {r}");
}

// ------------------------------------------------------------ silent peers

/// A client script against an echo peer (`PEER`, on ustack) that falls
/// silent: both scripts written to the lab, and the peer's two ports.
struct SilentPeer<'a> {
    lab: &'a Lab,
    peer_py: String,
    client_py: String,
    ports: [&'static str; 2],
}

impl<'a> SilentPeer<'a> {
    /// Write `PEER` and the client script `client` (as file `name`).
    fn new(lab: &'a Lab, client: &str, name: &str, ports: [&'static str; 2]) -> Self {
        let peer_py = lab.path("peer.py");
        std::fs::write(&peer_py, PEER).unwrap();
        let client_py = lab.path(name);
        std::fs::write(&client_py, client).unwrap();
        SilentPeer {
            lab,
            peer_py: peer_py.display().to_string(),
            client_py: client_py.display().to_string(),
            ports,
        }
    }

    /// An echo server on ustack at `ip` (`host`), answering "ready".
    fn start(&self, host: Host, ip: &str) -> Preloaded {
        let [p1, p2] = self.ports;
        let program = [PYTHON, &self.peer_py, ip, p1, p2];
        let mut peer = self.lab.start_with(host, false, false, &program);
        use std::io::BufRead;
        let out = peer.daemon.child.as_mut().unwrap().stdout.take().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(out).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "the peer did not start");
        peer
    }
}

/// Wait for the client's marker, silence the peer (SIGSTOP) until the
/// client has ended (`ended`), then end the peer.
fn silence_peer_while(peer: Preloaded, marker: &Path, ended: &mut dyn FnMut() -> bool) {
    let signal = |sig: &str| {
        let ok = Command::new("kill")
            .args([sig, &peer.pid().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} the peer");
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !marker.exists() {
        assert!(Instant::now() < deadline, "the client never got going");
        std::thread::sleep(Duration::from_millis(20));
    }
    signal("-STOP");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ended() {
        if Instant::now() >= deadline {
            signal("-CONT");
            panic!("the client still waits 60 s after its peer fell silent");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    signal("-CONT");
    drop(peer);
}

// ------------------------------------------------------------ keepalive

/// Connect, check the echo, turn keepalive on (1 s idle, 1 s between
/// probes, 2 probes), leave a marker file, then wait in `recv`: prints the
/// errno it ends with.
const KEEPALIVE: &str = r#"
import errno, json, socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
s.sendall(b"x")
assert s.recv(10) == b"x"
s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 2)
out = {"keepcnt": s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)}
open(sys.argv[3], "w").close()
t = time.monotonic()
try:
    out["recv"] = repr(s.recv(10))
except OSError as e:
    out["recv"] = errno.errorcode.get(e.errno, str(e.errno))
out["secs"] = round(time.monotonic() - t, 1)
print(json.dumps(out), flush=True)
"#;

/// Keepalive against a peer that falls silent (a ustack process stopped
/// with SIGSTOP: nothing answers, nothing resets): the blocked `recv`
/// fails with the errno Linux's own client gets, ETIMEDOUT, and the
/// probes are counted in telemetry.
#[test]
fn keepalive_times_out_a_silent_peer_as_linux_does() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("pk", need_preload!());
    let silent = SilentPeer::new(&lab, KEEPALIVE, "keepalive.py", ["7101", "7102"]);
    let client_py = silent.client_py.clone();
    // Linux's own client, from 10.77.0.1, to a peer at 10.77.0.2.
    let peer = silent.start(Host::Stack, "10.77.0.2");
    let marker = lab.path("linux.up");
    let mut linux = lab.linux_daemon(&[
        PYTHON,
        &client_py,
        "10.77.0.2",
        "7102",
        &marker.display().to_string(),
    ]);
    silence_peer_while(peer, &marker, &mut || {
        linux
            .child
            .as_mut()
            .unwrap()
            .try_wait()
            .is_ok_and(|s| s.is_some())
    });
    let (code, out, err) = linux.wait();
    assert_eq!(code, 0, "Linux client: {out}{err}");
    let linux = stdout_json("keepalive on Linux", out.as_bytes(), err.as_bytes());
    // The same program on ustack, from 10.77.0.2, to a peer at 10.77.0.3.
    let peer = silent.start(Host::LinuxSide, "10.77.0.3");
    let marker = lab.path("ustack.up");
    let mut ours = lab.start(
        Host::Stack,
        false,
        &[
            PYTHON,
            &client_py,
            "10.77.0.3",
            "7102",
            &marker.display().to_string(),
        ],
    );
    silence_peer_while(peer, &marker, &mut || ours.exited_within(Duration::ZERO));
    let end = ours.wait();
    end.check(0);
    let got = stdout_json(
        "keepalive on ustack",
        end.out.as_bytes(),
        end.err.as_bytes(),
    );
    eprintln!("keepalive: Linux {linux}, ustack {got}");
    assert_eq!(linux["recv"], "ETIMEDOUT", "{linux}");
    assert_eq!(got["recv"], linux["recv"], "{got}");
    assert_eq!(got["keepcnt"], 2, "{got}");
    let probes =
        end.last.as_ref().expect("telemetry")["stack"]["tcp"]["totals"]["keepalive_probes"]
            .as_u64()
            .unwrap_or(0);
    assert!(probes >= 2, "keepalive probes counted: {probes}");
}

// ------------------------------------------------------- wrappers and shells

/// Echo `LEN` bytes through the peer at ADDR:PORT, wait HOLD seconds, and
/// print one JSON line with their count and SHA-256 (`error`: the errno
/// name, if it failed).
const ECHO_CLIENT: &str = r#"
import errno, hashlib, json, socket, sys, time
want, hold = int(sys.argv[3]), float(sys.argv[4])
block = bytes(range(256)) * 256
h, sent, got = hashlib.sha256(), 0, 0
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
    while got < want:
        if sent < want:
            n = min(len(block), want - sent)
            s.sendall(block[:n])
            sent += n
        d = s.recv(1 << 16)
        if not d:
            break
        h.update(d)
        got += len(d)
    time.sleep(hold)
    s.close()
    print(json.dumps({"got": got, "sha256": h.hexdigest()}), flush=True)
except OSError as e:
    print(json.dumps({"error": errno.errorcode.get(e.errno, str(e))}), flush=True)
"#;

/// Every JSON object line of a program's output, in order.
fn json_lines(out: &str) -> Vec<Value> {
    out.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

/// A shell or wrapper script that opens no AF_INET socket leaves the stack
/// to the programs it starts: `sh -c 'client; client'` runs both clients
/// on ustack, one after the other (each takes the stack at its first
/// socket and lets it go at exit). Two at once: the first has the stack,
/// the other runs on the kernel's sockets (here without an address: it
/// fails) and says so on stderr.
#[test]
fn a_shell_hands_the_stack_to_the_programs_it_starts() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("ps", need_preload!());
    let client = lab.path("echo_client.py");
    std::fs::write(&client, ECHO_CLIENT).unwrap();
    let peer = lab.linux_echo_peer(7301, 7302);
    const LEN: usize = 1_000_000;
    let want = lab.pattern_sha256(LEN);
    let one = |hold: u32| format!("{PYTHON} {} 10.77.0.1 7302 {LEN} {hold}", client.display());
    // One after the other: both on ustack.
    let end = lab
        .start_with(
            Host::Stack,
            false,
            false,
            &["sh", "-c", &format!("{}; {}", one(0), one(0))],
        )
        .wait();
    end.check(0);
    let got = json_lines(&end.out);
    assert_eq!(got.len(), 2, "{}{}", end.out, end.err);
    for g in &got {
        assert_eq!(g["got"], LEN, "{g}: {}", end.err);
        assert_eq!(g["sha256"], want.as_str(), "{g}");
    }
    // At once: one on ustack, the other told it runs on the kernel's.
    let end = lab
        .start_with(
            Host::Stack,
            false,
            false,
            // Each holds its connection 2 s: the other starts meanwhile.
            &["sh", "-c", &format!("{} & {}; wait", one(2), one(2))],
        )
        .wait();
    end.check(0);
    let got = json_lines(&end.out);
    assert_eq!(got.len(), 2, "{}{}", end.out, end.err);
    let ok = got.iter().filter(|g| g["sha256"] == want.as_str()).count();
    assert_eq!(ok, 1, "{got:?}: {}", end.err);
    assert!(
        end.err.contains("runs on the kernel's sockets"),
        "{}",
        end.err
    );
    drop(peer);
}

// ------------------------------------------------- the stack's own descriptors

/// Close every descriptor the program did not open, as daemons and
/// OpenSSH do: first `close` each descriptor open at start (the stack's,
/// and any the test's own parents left inheritable) and `dup2` onto each
/// one that refused, then `close_range` (os.closerange), `closefrom`
/// (ctypes) and a `close` loop over every number, and print what is still
/// open; run with [`ECHO_CLIENT`] after it (the same arguments), which
/// then echoes `LEN` bytes through the peer.
const CLOSE_ALL: &str = r#"
import ctypes, errno, hashlib, json, os, socket, sys
def name(e):
    return errno.errorcode.get(e.errno, str(e.errno))
def open_fds():
    # The listing's own descriptor is closed by the time it returns.
    listed = sorted(int(x) for x in os.listdir("/proc/self/fd") if int(x) > 2)
    alive = []
    for fd in listed:
        try:
            os.fstat(fd)
            alive.append(fd)
        except OSError:
            pass
    return alive
# The first AF_INET socket starts the stack; its descriptors are the
# ones open now that were not before.
before = open_fds()
warm = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
start = [fd for fd in open_fds() if fd != warm.fileno()]
out = {"start": start, "new": [fd for fd in start if fd not in before], "close": [], "dup2": []}
null = os.open("/dev/null", os.O_RDONLY)
out["kept"] = []
for fd in start:
    try:
        os.close(fd)
        out["close"].append("ok")
        continue
    except OSError as e:
        out["close"].append(name(e))
    out["kept"].append(fd)
    try:
        os.dup2(null, fd)
        out["dup2"].append("ok")
    except OSError as e:
        out["dup2"].append(name(e))
os.close(null)
os.closerange(3, 1 << 20)
ctypes.CDLL(None).closefrom(3)
for fd in range(3, 256):
    try:
        os.close(fd)
    except OSError:
        pass
out["after"] = open_fds()
print(json.dumps(out), flush=True)
"#;

/// A program that closes every descriptor it did not open (OpenSSH's
/// `closefrom(3)`, Python's `os.closerange`, a daemon's close loop) keeps
/// its stack: the stack's own descriptors (its NIC's, telemetry's) refuse
/// `close` and `dup2`, survive `close_range` and `closefrom`, and TCP
/// still carries every byte. Stock ssh, run the same way, then gets the
/// Linux kernel's refusal instead of EIO from a stack whose NIC it closed.
#[test]
fn closing_every_descriptor_leaves_the_stack_its_own() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("pd", need_preload!());
    let script = lab.path("close_all.py");
    std::fs::write(&script, format!("{CLOSE_ALL}{ECHO_CLIENT}")).unwrap();
    let peer = lab.linux_echo_peer(7201, 7202);
    const LEN: usize = 3_000_000;
    // Without telemetry: a telemetry client's connection is opened after
    // the stack starts and is not kept from the program (README).
    let end = lab
        .start_with(
            Host::Stack,
            false,
            false,
            &[
                PYTHON,
                &script.display().to_string(),
                "10.77.0.1",
                "7202",
                &LEN.to_string(),
                "0",
            ],
        )
        .wait();
    end.check(0);
    let [r, echoed] = &json_lines(&end.out)[..] else {
        panic!("two result lines: {}{}", end.out, end.err);
    };
    eprintln!("closing every descriptor on ustack: {r}");
    // The stack's own (at least its NIC's socket: the descriptors its
    // start opened) refused, the rest closed.
    let kept = r["kept"].as_array().expect("kept").clone();
    assert!(!kept.is_empty(), "no descriptor refused close: {r}");
    assert_eq!(r["new"], serde_json::Value::Array(kept.clone()), "{r}");
    let refusals = |key: &str, errno: &str| {
        r[key]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| *v == errno)
            .count()
    };
    assert_eq!(refusals("close", "EBADF"), kept.len(), "{r}");
    assert_eq!(refusals("dup2", "EBUSY"), kept.len(), "{r}");
    // close_range, closefrom and the loop left exactly those open.
    assert_eq!(r["after"], serde_json::Value::Array(kept), "{r}");
    assert_eq!(echoed["got"], LEN, "{echoed}");
    assert_eq!(echoed["sha256"], lab.pattern_sha256(LEN), "{echoed}");
    // Stock ssh: closefrom(3) first thing, then a connect to a port
    // nobody listens on.
    if Command::new("ssh").arg("-V").output().is_ok() {
        let end = lab
            .start_with(
                Host::Stack,
                false,
                false,
                &[
                    "ssh",
                    "-o",
                    "BatchMode=yes",
                    "-o",
                    "ConnectTimeout=10",
                    "root@10.77.0.1",
                    "true",
                ],
            )
            .wait();
        assert!(
            end.err.contains("Connection refused"),
            "ssh on ustack: {}",
            end.err
        );
    } else {
        ustack_test_skip::skip(
            "ssh is not installed (apt-get install openssh-client): its part left out",
        );
    }
    drop(peer);
}

// ------------------------------------------- calls and options (issue 33.3)

/// dnsmasq's default wildcard socket on ustack (`IP_PKTINFO`: the query's
/// destination and interface in `recvmsg`, the reply's source in
/// `sendmsg`) answers `dig` from the Linux host. Before: dnsmasq exited
/// at start (IP_PKTINFO: ENOPROTOOPT). Over TCP its wildcard listener
/// closes the connection: it looks the interface's address up in the
/// kernel's list, where the stack's is not (the README says so).
#[test]
fn dnsmasq_on_ustack_answers_dig() {
    need_root!();
    need_program!("dnsmasq", "dnsmasq");
    need_program!("dig", "bind9-dnsutils");
    let _turn = serial();
    let lab = Lab::new("pd", need_preload!());
    let pid = lab.path("dnsmasq.pid").display().to_string();
    let dnsmasq = lab.start_with(
        Host::Stack,
        false,
        false,
        &[
            "dnsmasq",
            "--no-daemon",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--address=/test.example/10.9.9.9",
            "--port",
            "53",
            "--user=root",
            &format!("--pid-file={pid}"),
        ],
    );
    lab.wait_arp("10.77.0.2");
    let dig = |args: &[&str]| {
        let o = lab.linux(
            &[
                &["dig", "@10.77.0.2", "+short", "+tries=1", "+time=2"][..],
                args,
            ]
            .concat(),
        );
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut udp = dig(&["www.test.example"]);
    while udp != "10.9.9.9" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        udp = dig(&["www.test.example"]);
    }
    let again = dig(&["mail.test.example"]);
    let mut d = dnsmasq;
    let running = !d.exited_within(Duration::ZERO);
    let end = d.stop();
    assert!(running, "dnsmasq ended: {}{}", end.out, end.err);
    assert_eq!(udp, "10.9.9.9", "dig; dnsmasq said: {}", end.err);
    assert_eq!(again, "10.9.9.9", "dig again; dnsmasq said: {}", end.err);
}

/// unbound on ustack answers from a local-data zone (UDP and TCP). Before:
/// it refused to start (IP_MTU_DISCOVER: ENOPROTOOPT).
#[test]
fn unbound_on_ustack_answers_from_local_data() {
    need_root!();
    need_program!("unbound", "unbound");
    need_program!("dig", "bind9-dnsutils");
    let _turn = serial();
    let lab = Lab::new("pu", need_preload!());
    let conf = lab.path("unbound.conf");
    std::fs::write(
        &conf,
        format!(
            "server:\n  interface: 10.77.0.2\n  port: 53\n  do-ip6: no\n  \
             do-daemonize: no\n  use-syslog: no\n  logfile: \"\"\n  chroot: \"\"\n  \
             username: \"\"\n  pidfile: \"\"\n  directory: \"{}\"\n  verbosity: 1\n  \
             access-control: 10.77.0.0/24 allow\n  local-zone: \"test.example.\" static\n  \
             local-data: \"host.test.example. IN A 10.9.9.8\"\n\
             remote-control:\n  control-enable: no\n",
            lab.dir.path().display()
        ),
    )
    .unwrap();
    let conf = conf.display().to_string();
    let mut unbound = lab.start_with(Host::Stack, false, false, &["unbound", "-d", "-c", &conf]);
    lab.wait_arp("10.77.0.2");
    let dig = |args: &[&str]| {
        let o = lab.linux(
            &[
                &["dig", "@10.77.0.2", "+short", "+tries=1", "+time=2"][..],
                args,
            ]
            .concat(),
        );
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut udp = dig(&["host.test.example"]);
    while udp != "10.9.9.8" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        udp = dig(&["host.test.example"]);
    }
    let tcp = dig(&["+tcp", "host.test.example"]);
    let running = !unbound.exited_within(Duration::ZERO);
    let end = unbound.stop();
    assert!(running, "unbound ended: {}{}", end.out, end.err);
    assert_eq!(udp, "10.9.9.8", "dig over UDP; unbound said: {}", end.err);
    assert_eq!(tcp, "10.9.9.8", "dig over TCP; unbound said: {}", end.err);
}

/// A UDP echo on the Linux host: every datagram back to its sender.
const UDP_ECHO: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    d, a = s.recvfrom(65536)
    s.sendto(d, a)
"#;

/// `sendmmsg` of eight datagrams of different sizes to the echo, then
/// `recvmmsg` (MSG_WAITFORONE) until all eight are back: each datagram's
/// length and SHA-256; then `IP_PKTINFO` on `recvmsg` (destination and
/// interface) and as a source on `sendmsg`.
const MMSG: &str = r#"
import ctypes, errno, hashlib, json, socket, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
class msghdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32),
                ("iov", ctypes.POINTER(iovec)), ("iovlen", ctypes.c_size_t),
                ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]
class mmsghdr(ctypes.Structure):
    _fields_ = [("hdr", msghdr), ("len", ctypes.c_uint)]
peer, port, iface = sys.argv[1], int(sys.argv[2]), sys.argv[3]
IP_PKTINFO = 8  # Python 3.11's socket module lacks the name
out = {}
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect((peer, port))
sizes = [1, 100, 512, 1000, 1472, 3000, 9000, 20000]
data = [bytes((i * 7 + j) & 255 for j in range(n)) for i, n in enumerate(sizes)]
want = [hashlib.sha256(d).hexdigest() for d in data]
N = len(data)
msgs = (mmsghdr * N)()
keep = []
for i, d in enumerate(data):
    b = ctypes.create_string_buffer(d, len(d))
    io = (iovec * 1)(iovec(ctypes.cast(b, ctypes.c_void_p), len(d)))
    keep += [b, io]
    msgs[i].hdr.iov = io
    msgs[i].hdr.iovlen = 1
sent = libc.sendmmsg(s.fileno(), msgs, N, 0)
out["sent"] = sent if sent >= 0 else errno.errorcode[ctypes.get_errno()]
out["sent_lens"] = [msgs[i].len for i in range(N)]
rmsgs = (mmsghdr * N)()
bufs = []
for i in range(N):
    b = ctypes.create_string_buffer(65536)
    io = (iovec * 1)(iovec(ctypes.cast(b, ctypes.c_void_p), 65536))
    bufs.append(b)
    keep.append(io)
    rmsgs[i].hdr.iov = io
    rmsgs[i].hdr.iovlen = 1
got, calls = [], 0
deadline = time.monotonic() + 10
while len(got) < N and time.monotonic() < deadline:
    n = libc.recvmmsg(s.fileno(), ctypes.byref(rmsgs), N - len(got), 0x10000, None)
    calls += 1
    if n < 0:
        out["recv_error"] = errno.errorcode[ctypes.get_errno()]
        break
    for i in range(n):
        got.append(bufs[i].raw[:rmsgs[i].len])
out["calls"] = calls
out["got_sha256"] = sorted(hashlib.sha256(g).hexdigest() for g in got)
out["want_sha256"] = sorted(want)
# IP_PKTINFO: the destination and the interface of a datagram received.
s.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
s.send(b"pktinfo")
d, anc, flags, addr = s.recvmsg(100, socket.CMSG_SPACE(12))
for level, ty, cd in anc:
    if level == socket.IPPROTO_IP and ty == IP_PKTINFO:
        idx, spec, dst = struct.unpack("i4s4s", cd[:12])
        out["pktinfo"] = [idx, socket.inet_ntoa(spec), socket.inet_ntoa(dst)]
out["ifindex"] = socket.if_nametoindex(iface)
out["pktinfo_data"] = d.decode()
# IP_PKTINFO as the source of a send: our address, or none.
me = s.getsockname()[0]
for name, src in [("send_ours", me), ("send_any", "0.0.0.0"), ("send_other", "10.77.0.99")]:
    info = struct.pack("i4s4s", 0, socket.inet_aton(src), socket.inet_aton("0.0.0.0"))
    try:
        s.sendmsg([name.encode()], [(socket.IPPROTO_IP, IP_PKTINFO, info)])
        s.settimeout(5)
        out[name] = s.recv(100).decode()
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e))
# IP_RECVERR: kept; the error queue is empty (Linux: EAGAIN).
s.setsockopt(socket.IPPROTO_IP, 11, 1)  # IP_RECVERR
s.setblocking(True)
try:
    s.recvmsg(100, 100, socket.MSG_ERRQUEUE)
    out["errqueue"] = "ok"
except OSError as e:
    out["errqueue"] = errno.errorcode.get(e.errno, str(e))
print(json.dumps(out), flush=True)
"#;

/// The Linux UDP echo at 10.77.0.1:`port`, returned once it listens.
fn linux_udp_echo(lab: &Lab, port: u16) -> Daemon {
    let script = lab.path("udp-echo.py");
    std::fs::write(&script, UDP_ECHO).unwrap();
    let mut echo = lab.linux_daemon(&[
        PYTHON,
        &script.display().to_string(),
        "10.77.0.1",
        &port.to_string(),
    ]);
    use std::io::BufRead;
    let out = echo.child.as_mut().unwrap().stdout.take().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(out).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "the UDP echo did not start");
    echo
}

/// sendmmsg and recvmmsg on ustack, byte-exact, and IP_PKTINFO both ways;
/// the same script on the Linux kernel gives the same answers. Before:
/// both calls went to the kernel with a ustack descriptor (ENOTSOCK).
#[test]
fn sendmmsg_recvmmsg_and_pktinfo_byte_exact() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("pm", need_preload!());
    let echo = linux_udp_echo(&lab, 7201);
    let script = lab.path("mmsg.py");
    std::fs::write(&script, MMSG).unwrap();
    let script = script.display().to_string();
    let stack_if = lab.topo.stack_if();
    let end = lab
        .start_with(
            Host::Stack,
            false,
            false,
            &[PYTHON, &script, "10.77.0.1", "7201", &stack_if],
        )
        .wait();
    drop(echo);
    end.check(0);
    let ours = stdout_json("mmsg on ustack", end.out.as_bytes(), end.err.as_bytes());
    eprintln!("ustack: {ours}");
    assert_eq!(ours["sent"], 8, "{ours}");
    assert_eq!(
        ours["sent_lens"],
        serde_json::json!([1, 100, 512, 1000, 1472, 3000, 9000, 20000]),
        "{ours}"
    );
    assert_eq!(ours["got_sha256"], ours["want_sha256"], "{ours}");
    assert!(ours.get("recv_error").is_none(), "{ours}");
    let ifindex = ours["ifindex"].as_i64().expect("ifindex");
    assert_eq!(
        ours["pktinfo"],
        serde_json::json!([ifindex, "10.77.0.2", "10.77.0.2"]),
        "{ours}"
    );
    assert_eq!(ours["pktinfo_data"], "pktinfo", "{ours}");
    assert_eq!(ours["send_ours"], "send_ours", "{ours}");
    assert_eq!(ours["send_any"], "send_any", "{ours}");
    // Linux says ENETUNREACH for a source that is not its own.
    assert_eq!(ours["send_other"], "ENETUNREACH", "{ours}");
    assert_eq!(ours["errqueue"], "EAGAIN", "{ours}");
}

/// After `shutdown(SHUT_RD)`: what is queued is read, then 0 at once from
/// recv, read, readv and recvmsg; poll and epoll say readable (POLLIN,
/// and POLLRDHUP); a connected UDP socket: EAGAIN without waiting, 0
/// instead of a wait (as Linux). Printed as JSON.
const SHUT_RD: &str = r#"
import errno, json, os, select, signal, socket, sys
out = {}
class Blocked(Exception):
    pass
def on_alarm(*_):
    raise Blocked()
signal.signal(signal.SIGALRM, on_alarm)
def attempt(name, f):
    try:
        out[name] = f()
    except (socket.timeout, Blocked):
        out[name] = "blocked"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e))
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
s.sendall(b"queued")
# Wait until the echo is back, unread, then shut reading.
p = select.poll()
p.register(s, select.POLLIN)
p.poll(5000)
import time; time.sleep(0.2)
s.shutdown(socket.SHUT_RD)
s.settimeout(3)
p = select.poll()
p.register(s, select.POLLIN | select.POLLRDHUP)
attempt("poll", lambda: [ev & (select.POLLIN | select.POLLRDHUP) for _, ev in p.poll(0)])
ep = select.epoll()
ep.register(s.fileno(), select.EPOLLIN | select.EPOLLRDHUP)
attempt("epoll", lambda: [ev & (select.EPOLLIN | select.EPOLLRDHUP) for _, ev in ep.poll(0)])
attempt("recv_queued", lambda: s.recv(100).decode())
attempt("recv", lambda: len(s.recv(100)))
attempt("read", lambda: len(os.read(s.fileno(), 100)))
attempt("readv", lambda: os.readv(s.fileno(), [bytearray(10)]))
attempt("recvmsg", lambda: len(s.recvmsg(100)[0]))
attempt("send_after", lambda: s.send(b"still writes"))
s.close()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
attempt("udp_unconnected", lambda: u.shutdown(socket.SHUT_RD))
u.connect((sys.argv[1], 9))
u.shutdown(socket.SHUT_RD)
# Linux: EAGAIN without waiting, 0 instead of a wait.
attempt("udp_recv_dontwait", lambda: len(u.recv(100, socket.MSG_DONTWAIT)))
signal.alarm(3)
attempt("udp_recv_blocking", lambda: len(u.recv(100)))
signal.alarm(0)
p = select.poll()
p.register(u, select.POLLIN)
attempt("udp_poll", lambda: [ev & select.POLLIN for _, ev in p.poll(0)])
print(json.dumps(out), flush=True)
"#;

/// shutdown(SHUT_RD) then read returns 0 at once, as on Linux (the same
/// script on the kernel's sockets gives the same answers). Before: the
/// read blocked ("blocked" after the script's 3 s timeout).
#[test]
fn shutdown_rd_then_read_returns_zero_as_linux_does() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("ps", need_preload!());
    let peer = lab.linux_echo_peer(7301, 7302);
    let script = lab.path("shutrd.py");
    std::fs::write(&script, SHUT_RD).unwrap();
    let script = script.display().to_string();
    let o = lab.linux(&[PYTHON, &script, "10.77.0.1", "7302"]);
    let linux = stdout_json("SHUT_RD on Linux", &o.stdout, &o.stderr);
    let end = lab
        .start_with(
            Host::Stack,
            false,
            false,
            &[PYTHON, &script, "10.77.0.1", "7302"],
        )
        .wait();
    drop(peer);
    end.check(0);
    let ours = stdout_json("SHUT_RD on ustack", end.out.as_bytes(), end.err.as_bytes());
    eprintln!("ustack: {ours}\nLinux:  {linux}");
    assert_eq!(linux["recv"], 0, "{linux}");
    assert_eq!(linux["recv_queued"], "queued", "{linux}");
    for key in [
        "poll",
        "epoll",
        "recv_queued",
        "recv",
        "read",
        "readv",
        "recvmsg",
        "send_after",
        "udp_unconnected",
        "udp_recv_dontwait",
        "udp_recv_blocking",
        "udp_poll",
    ] {
        assert_eq!(
            ours[key], linux[key],
            "{key}: ustack {ours} vs Linux {linux}"
        );
    }
}

/// Set TCP_USER_TIMEOUT (ms, argv[3]) on a connection to an echo at
/// ADDR:PORT, echo once, create the marker file, then send and wait for
/// the answer: the errno and how long it took.
const USER_TIMEOUT: &str = r#"
import errno, json, socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(sys.argv[3]))
ut = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
s.sendall(b"x")
s.recv(1)
open(sys.argv[4], "w").close()
time.sleep(0.5)
t = time.monotonic()
try:
    s.sendall(b"unanswered")
    d = s.recv(100)
    res = "data" if d else "eof"
except OSError as e:
    res = errno.errorcode.get(e.errno, str(e))
print(json.dumps({"recv": res, "secs": time.monotonic() - t, "user_timeout": ut}), flush=True)
"#;

/// TCP_USER_TIMEOUT: a connection whose peer vanishes (SIGSTOPped, its
/// stack with it) fails with ETIMEDOUT soon after the timeout, long before
/// the retransmission limit's give-up (minutes), as on Linux. Before: the
/// option was refused (ENOPROTOOPT) and the program ended.
#[test]
fn user_timeout_fails_a_vanished_peer_with_etimedout() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("pt", need_preload!());
    let silent = SilentPeer::new(&lab, USER_TIMEOUT, "ut.py", ["7401", "7402"]);
    let client_py = silent.client_py.clone();
    // Linux's client to a ustack peer at 10.77.0.2.
    let peer = silent.start(Host::Stack, "10.77.0.2");
    let marker = lab.path("linux.up");
    let mut linux = lab.linux_daemon(&[
        PYTHON,
        &client_py,
        "10.77.0.2",
        "7402",
        "2000",
        &marker.display().to_string(),
    ]);
    silence_peer_while(peer, &marker, &mut || {
        linux
            .child
            .as_mut()
            .unwrap()
            .try_wait()
            .is_ok_and(|s| s.is_some())
    });
    let (code, out, err) = linux.wait();
    assert_eq!(code, 0, "Linux client: {out}{err}");
    let linux = stdout_json("user timeout on Linux", out.as_bytes(), err.as_bytes());
    // The same program on ustack, to a ustack peer at 10.77.0.3.
    let peer = silent.start(Host::LinuxSide, "10.77.0.3");
    let marker = lab.path("ustack.up");
    let mut ours = lab.start(
        Host::Stack,
        false,
        &[
            PYTHON,
            &client_py,
            "10.77.0.3",
            "7402",
            "2000",
            &marker.display().to_string(),
        ],
    );
    silence_peer_while(peer, &marker, &mut || ours.exited_within(Duration::ZERO));
    let end = ours.wait();
    end.check(0);
    let got = stdout_json(
        "user timeout on ustack",
        end.out.as_bytes(),
        end.err.as_bytes(),
    );
    eprintln!("user timeout: Linux {linux}, ustack {got}");
    assert_eq!(linux["recv"], "ETIMEDOUT", "{linux}");
    assert_eq!(got["recv"], "ETIMEDOUT", "{got}");
    assert_eq!(got["user_timeout"], 2000, "{got}");
    // After the 2 s timeout, well before the retry limit's give-up.
    let secs = got["secs"].as_f64().expect("secs");
    assert!((1.5..30.0).contains(&secs), "{got}");
    let retrans = end.last.as_ref().expect("telemetry")["stack"]["tcp"]["totals"]["retransmits"]
        .as_u64()
        .unwrap_or(0);
    assert!(retrans >= 1, "retransmitted before giving up: {retrans}");
}

/// Every row of the README's socket option table, checked on a connected
/// TCP socket and a connected UDP socket: `implemented` and `kept` set
/// and get (a kept int reads back as set), `get only` gets and refuses a
/// set with ENOPROTOOPT, `refused: E...` fails with that errno. Prints the
/// rows checked and every mismatch.
const OPTIONS: &str = r#"
import errno, json, re, socket, struct, sys
readme, peer, port, iface = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
levels = {"SOL_SOCKET": socket.SOL_SOCKET, "IPPROTO_IP": socket.IPPROTO_IP,
          "IPPROTO_TCP": socket.IPPROTO_TCP, "IPPROTO_UDP": socket.IPPROTO_UDP}
row = re.compile(r"^\| `([A-Z0-9_]+)` \| (\w+) \| (\d+) \| ([^|]+?) \| ([^|]*)\|")
rows = [m.groups() for m in map(row.match, open(readme)) if m]
special = {
    "SO_LINGER": struct.pack("ii", 1, 5),
    "SO_RCVTIMEO": struct.pack("ll", 1, 0),
    "SO_SNDTIMEO": struct.pack("ll", 1, 0),
    "SO_BINDTODEVICE": iface.encode(),
    "TCP_CONGESTION": b"cubic",
    "IP_OPTIONS": b"",
    "TCP_MAXSEG": 1000,
    "IP_TOS": 16,
    "IP_TTL": 32,
    "IP_MTU_DISCOVER": 2,
    "TCP_USER_TIMEOUT": 5000,
    "TCP_KEEPIDLE": 60,
}
tcp = socket.create_connection((peer, port), timeout=10)
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.connect((peer, 9))
def err(f):
    try:
        f()
        return "ok"
    except OSError as e:
        if e.errno == errno.EOPNOTSUPP:
            return "EOPNOTSUPP"  # Python names 95 ENOTSUP
        return errno.errorcode.get(e.errno, str(e))
bad, checked = [], 0
for name, level, num, outcome, note in rows:
    lv, num = levels[level], int(num)
    socks = {"IPPROTO_TCP": [tcp], "IPPROTO_UDP": [udp]}.get(level, [tcp, udp])
    if note.strip().startswith("TCP only"):
        socks = [tcp]
    for s in socks:
        kind = "tcp" if s is tcp else "udp"
        val = special.get(name, 1)
        got = {"set": err(lambda: s.setsockopt(lv, num, val)),
               "get": err(lambda: s.getsockopt(lv, num, 64))}
        want = {}
        if outcome in ("implemented", "kept"):
            want = {"set": "ok", "get": "ok"}
        elif outcome == "get only":
            want = {"set": "ENOPROTOOPT", "get": "ok"}
        elif outcome.startswith("refused: "):
            want = {"set": outcome[len("refused: "):]}
        else:
            want = {"outcome": "unknown"}
        if outcome == "kept" and isinstance(val, int) and got["get"] == "ok":
            v = struct.unpack("i", s.getsockopt(lv, num, 64)[:4])[0]
            got["value"], want["value"] = v, val
        for k in want:
            if got.get(k) != want[k]:
                bad.append({"option": name, "on": kind, "want": want, "got": got})
                break
        checked += 1
# Options of another protocol's level, as Linux: ENOPROTOOPT.
cross = [err(lambda: udp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)),
         err(lambda: tcp.setsockopt(socket.IPPROTO_UDP, 1, 1))]
print(json.dumps({"rows": len(rows), "checked": checked, "bad": bad, "cross": cross}), flush=True)
"#;

/// The README's socket option table and the layer agree, row by row.
/// Before: IP_PKTINFO, IP_MTU_DISCOVER, IP_RECVERR, TCP_USER_TIMEOUT,
/// TCP_DEFER_ACCEPT, TCP_QUICKACK, TCP_NOTSENT_LOWAT, TCP_FASTOPEN and
/// most of the rest failed with ENOPROTOOPT.
#[test]
fn socket_options_match_the_readme_table() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("po", need_preload!());
    let peer = lab.linux_echo_peer(7501, 7502);
    let script = lab.path("options.py");
    std::fs::write(&script, OPTIONS).unwrap();
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let end = lab
        .start_with(
            Host::Stack,
            false,
            false,
            &[
                PYTHON,
                &script.display().to_string(),
                &readme.display().to_string(),
                "10.77.0.1",
                "7502",
                &lab.topo.stack_if(),
            ],
        )
        .wait();
    drop(peer);
    end.check(0);
    let got = stdout_json("options on ustack", end.out.as_bytes(), end.err.as_bytes());
    let rows = got["rows"].as_u64().unwrap_or(0);
    assert!(rows >= 140, "the README's table has {rows} rows: {got}");
    assert!(got["checked"].as_u64().unwrap_or(0) > rows, "{got}");
    assert_eq!(
        got["bad"],
        serde_json::json!([]),
        "rows that disagree: {got}"
    );
    assert_eq!(
        got["cross"],
        serde_json::json!(["ENOPROTOOPT", "ENOPROTOOPT"]),
        "{got}"
    );
}

// ------------------------------------- descriptors: identity and inspection

/// A C program (compiled at test time) that checks what a ustack socket
/// looks like to the calls that inspect a descriptor, and that a socket
/// closed behind the layer's back (a raw `syscall(SYS_close)`, as libuv
/// closes; `fclose` of an `fdopen`ed socket, which closes inside the C
/// library) leaves its number to whatever the kernel gives it next: a
/// pipe, a file, a directory work as such and are not taken for sockets.
/// Prints one JSON object; SIGALRM ends it after 20 s (the old layer
/// blocked reading the pipe as a socket).
const IDENTITY_C: &str = r#"
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static int opt(int fd, int name) {
    int v = -1; socklen_t l = sizeof v;
    if (getsockopt(fd, SOL_SOCKET, name, &v, &l) < 0) return -errno;
    return v;
}
static const char *kind(int fd) {
    struct stat st;
    if (fstat(fd, &st) < 0) return "error";
    if (S_ISSOCK(st.st_mode)) return "socket";
    if (S_ISFIFO(st.st_mode)) return "fifo";
    if (S_ISREG(st.st_mode)) return "file";
    if (S_ISDIR(st.st_mode)) return "dir";
    return "other";
}
static int connected(const char *ip, int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
    inet_pton(AF_INET, ip, &a.sin_addr);
    if (connect(s, (struct sockaddr *)&a, sizeof a) < 0) { perror("connect"); exit(3); }
    return s;
}
/* Echo "ping" through a fresh socket: the stack still works. */
static int echo_ok(const char *ip, int port) {
    int s = connected(ip, port); char b[8] = {0};
    if (write(s, "ping", 4) != 4) return 0;
    int n = 0;
    while (n < 4) { int r = read(s, b + n, 4 - n); if (r <= 0) break; n += r; }
    close(s);
    return n == 4 && memcmp(b, "ping", 4) == 0;
}

int main(int argc, char **argv) {
    const char *ip = argv[1]; int port = atoi(argv[2]); const char *file = argv[3];
    alarm(20);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in any = { .sin_family = AF_INET, .sin_port = htons(7399) };
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    printf("{\"stream_kind\":\"%s\",\"dgram_kind\":\"%s\"", kind(l), kind(u));
    struct stat st; fstat(l, &st);
    printf(",\"mode\":\"%o\"", (unsigned)st.st_mode);
    struct statx sx;
    statx(l, "", AT_EMPTY_PATH, STATX_TYPE, &sx);
    printf(",\"statx_sock\":%d", S_ISSOCK(sx.stx_mode) ? 1 : 0);
    char path[64], link[64] = {0};
    snprintf(path, sizeof path, "/proc/self/fd/%d", l);
    readlink(path, link, sizeof link - 1);
    printf(",\"proc_link\":\"%.8s\"", link);
    stat(path, &st);
    printf(",\"proc_stat_sock\":%d", S_ISSOCK(st.st_mode) ? 1 : 0);
    printf(",\"type\":[%d,%d],\"domain\":[%d,%d],\"protocol\":[%d,%d]",
           opt(l, SO_TYPE), opt(u, SO_TYPE), opt(l, SO_DOMAIN), opt(u, SO_DOMAIN),
           opt(l, SO_PROTOCOL), opt(u, SO_PROTOCOL));
    int before = opt(l, SO_ACCEPTCONN);
    bind(l, (struct sockaddr *)&any, sizeof any);
    listen(l, 8);
    printf(",\"acceptconn\":[%d,%d]", before, opt(l, SO_ACCEPTCONN));
    int nb = 1;
    printf(",\"fionbio\":%d", ioctl(u, FIONBIO, &nb));
    char b[8];
    int r = recv(u, b, sizeof b, 0);
    printf(",\"nonblocking_recv\":%d", r < 0 && errno == EAGAIN ? 1 : 0);

    /* FIONREAD: the echoed bytes queued; SIOCOUTQ: nothing unacknowledged
       once the echo is back. */
    int c = connected(ip, port);
    write(c, "hello", 5);
    struct pollfd p = { .fd = c, .events = POLLIN };
    poll(&p, 1, 5000);
    usleep(200000);
    int inq = -1, outq = -1;
    ioctl(c, FIONREAD, &inq);
    ioctl(c, SIOCOUTQ, &outq);
    printf(",\"fionread\":%d,\"siocoutq\":%d", inq, outq);
    r = ioctl(c, SIOCATMARK, &inq);
    printf(",\"siocatmark\":\"%s\"", r < 0 && errno == ENOTTY ? "ENOTTY" : "other");

    /* Closed by a raw system call; a pipe takes the number. */
    int n = c;
    syscall(SYS_close, c);
    int pp[2]; pipe(pp);
    printf(",\"pipe_same_number\":%d", pp[0] == n || pp[1] == n ? 1 : 0);
    write(pp[1], "abc", 3);
    char got[4] = {0};
    r = read(pp[0], got, 3);
    printf(",\"pipe_read\":\"%s\",\"pipe_kind\":\"%s\",\"pipe_so_type\":%d",
           r == 3 ? got : "?", kind(n), opt(n, SO_TYPE));
    close(pp[0]); close(pp[1]);

    /* Closed by a raw system call; a file takes the number. */
    c = connected(ip, port); n = c;
    syscall(SYS_close, c);
    int f = open(file, O_RDWR | O_CREAT | O_TRUNC, 0600);
    printf(",\"file_same_number\":%d", f == n ? 1 : 0);
    r = write(f, "filedata", 8);
    lseek(f, 0, SEEK_SET);
    memset(got, 0, sizeof got);
    int rr = read(f, got, 3);
    printf(",\"file_write\":%d,\"file_read\":\"%.3s\",\"file_kind\":\"%s\"", r, rr == 3 ? got : "?", kind(f));
    close(f);

    /* Closed inside the C library (fclose of fdopen); opendir takes the
       number, unseen: the layer's checks find it is no socket. */
    c = connected(ip, port); n = c;
    fclose(fdopen(c, "r+"));
    DIR *d = opendir("/");
    int dfd = dirfd(d);
    printf(",\"dir_same_number\":%d,\"dir_kind\":\"%s\",\"dir_so_type\":%d",
           dfd == n ? 1 : 0, kind(dfd), opt(dfd, SO_TYPE));
    closedir(d);

    printf(",\"echo_after\":%d}\n", echo_ok(ip, port));
    fflush(stdout);
    close(l); close(u);
    return 0;
}
"#;

/// Compile a C program (`cc`) into the lab's directory.
fn compile_c(lab: &Lab, name: &str, source: &str) -> PathBuf {
    let src = lab.path(&format!("{name}.c"));
    let bin = lab.path(name);
    std::fs::write(&src, source).unwrap();
    let o = Command::new("cc")
        .arg("-O1")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("run cc");
    assert!(o.status.success(), "cc {name}: {}", text(&o));
    bin
}

/// A ustack socket looks like a socket to every call that inspects a
/// descriptor (fstat, statx, /proc/self/fd, SO_TYPE/SO_DOMAIN/
/// SO_PROTOCOL/SO_ACCEPTCONN, FIONREAD, SIOCOUTQ, FIONBIO), and a socket
/// closed behind the layer's back never makes its recycled number a
/// socket: a pipe, a file and a directory given that number work as such
/// (ENOTSOCK for SO_TYPE, as Linux says), the stack still carries new
/// connections, and no descriptor is left in the layer's table.
#[test]
fn recycled_numbers_are_never_sockets_and_sockets_look_like_sockets() {
    need_root!();
    need_program!("cc", "gcc");
    let _turn = serial();
    let lab = Lab::new("qi", need_preload!());
    let bin = compile_c(&lab, "identity", IDENTITY_C);
    let peer = lab.linux_echo_peer(7301, 7302);
    let file = lab.path("recycled.txt");
    let end = lab.run(
        Host::Stack,
        &[
            &bin.display().to_string(),
            "10.77.0.1",
            "7302",
            &file.display().to_string(),
        ],
    );
    drop(peer);
    end.check(0);
    let r = stdout_json("identity", end.out.as_bytes(), end.err.as_bytes());
    eprintln!("descriptor identity on ustack: {r}");
    const ENOTSOCK: i32 = 88;
    let want = serde_json::json!({
        "stream_kind": "socket", "dgram_kind": "socket", "mode": "140777",
        "statx_sock": 1, "proc_link": "socket:[", "proc_stat_sock": 1,
        // SOCK_STREAM 1, SOCK_DGRAM 2; AF_INET 2; IPPROTO_TCP 6, IPPROTO_UDP 17.
        "type": [1, 2], "domain": [2, 2], "protocol": [6, 17],
        "acceptconn": [0, 1], "fionbio": 0, "nonblocking_recv": 1,
        "fionread": 5, "siocoutq": 0, "siocatmark": "ENOTTY",
        "pipe_same_number": 1, "pipe_read": "abc", "pipe_kind": "fifo",
        "pipe_so_type": -ENOTSOCK,
        "file_same_number": 1, "file_write": 8, "file_read": "fil", "file_kind": "file",
        "dir_same_number": 1, "dir_kind": "dir", "dir_so_type": -ENOTSOCK,
        "echo_after": 1,
    });
    for (k, v) in want.as_object().unwrap() {
        assert_eq!(&r[k], v, "{k}: {r}");
    }
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "filedata",
        "the file behind the recycled number"
    );
    // The unsupported ioctl is named once on stderr.
    assert_eq!(
        end.err
            .lines()
            .filter(|l| l.contains("ioctl SIOCATMARK"))
            .count(),
        1,
        "{}",
        end.err
    );
    // Every socket, the ones closed behind the layer's back too, left the
    // table.
    let last = end.last.as_ref().expect("a last telemetry line");
    assert_eq!(last["app"]["preload_descriptors"], 0, "{last}");
}

// ------------------------------------------------- libuv: Node and dig

/// A Node HTTP server (libuv closes every descriptor with a raw
/// `syscall(SYS_close)`): 1000-byte answers; exits 0 on SIGTERM.
const NODE_SERVER: &str = r#"
const http = require('http');
const body = 'x'.repeat(1000);
const srv = http.createServer((req, res) => res.end(body));
srv.listen(8080, process.argv[2], () => console.log('listening'));
process.on('SIGTERM', () => { srv.close(); process.exit(0); });
"#;

/// The Linux host's HTTP load for the Node test: `THREADS` threads, each
/// `PER` requests on a connection of its own (HTTP/1.1), the body checked,
/// then closed by the client first (so the TIME_WAIT is the kernel's and
/// a reused client port never meets one on ustack). Prints the answers
/// right, wrong (those not begun within 60 s too), and the rate.
const HTTP_LOAD: &str = r#"
import json, socket, sys, threading, time
ip, port, threads, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
body = b"x" * 1000
ok = [0] * threads; bad = [0] * threads
def run(k):
    for _ in range(per):
        if time.monotonic() > t0 + 60:
            bad[k] += 1
            continue
        try:
            s = socket.create_connection((ip, port), timeout=10)
            s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            data = b""
            while not (b"\r\n\r\n" in data and data.endswith(body)) and len(data) < 4096:
                d = s.recv(4096)
                if not d:
                    break
                data += d
            s.close()
            if data.startswith(b"HTTP/1.1 200") and data.endswith(body):
                ok[k] += 1
            else:
                bad[k] += 1
        except OSError:
            bad[k] += 1
t0 = time.monotonic()
ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
[t.start() for t in ts]
[t.join() for t in ts]
print(json.dumps({"ok": sum(ok), "bad": sum(bad), "rate": sum(ok) / (time.monotonic() - t0)}))
"#;

/// Stock Node (libuv closes every descriptor with a raw
/// `syscall(SYS_close)`) serves 3000 HTTP requests from 8 clients at once
/// on the Linux host, each on a connection of its own: every answer
/// right, and afterwards no connection left in the stack and only the
/// listener in the layer's table (the old layer kept every raw-closed
/// socket: their connections were never closed, and each recycled number
/// had a stale socket under it). utop still attaches (the telemetry
/// thread's clients got recycled numbers), SIGTERM ends Node, and its
/// stack ends with every pool back at zero.
///
/// Not `ab`: ab waits for the server to close, so ustack holds the
/// TIME_WAIT, and a client port Linux reuses within the run meets it: the
/// engine answers that SYN with an ACK rather than a new connection (the
/// TCP engine's matter, not the layer's).
#[test]
fn node_serves_3000_connections_and_stops_on_sigterm() {
    need_root!();
    need_program!("node", "nodejs");
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("qn", need_preload!());
    let script = lab.path("server.js");
    std::fs::write(&script, NODE_SERVER).unwrap();
    let load = lab.path("load.py");
    std::fs::write(&load, HTTP_LOAD).unwrap();
    let srv = lab.start(
        Host::Stack,
        false,
        &["node", &script.display().to_string(), "10.77.0.2"],
    );
    lab.wait_port("10.77.0.2", 8080);
    let o = lab.linux(&[
        PYTHON,
        &load.display().to_string(),
        "10.77.0.2",
        "8080",
        "8",
        "375",
    ]);
    let r = stdout_json("HTTP load", &o.stdout, &o.stderr);
    eprintln!("node on ustack, 3000 connections from 8 clients: {r}");
    assert_eq!(r["ok"], 3000, "{r}");
    assert_eq!(r["bad"], 0, "{r}");
    // The last connections close within a moment: then none is left.
    let deadline = Instant::now() + Duration::from_secs(10);
    let snap = loop {
        let snap = common::telemetry(&srv.sock);
        let left = snap["stack"]["tcp"]["connections"].as_u64();
        if left == Some(0) || Instant::now() >= deadline {
            break snap;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        snap["stack"]["tcp"]["connections"], 0,
        "{}",
        snap["stack"]["tcp"]
    );
    assert_eq!(snap["app"]["preload_descriptors"], 1, "{}", snap["app"]);
    srv.check_utop();
    let end = srv.stop();
    end.check(0);
}

/// BIND's `dig` (libuv 1.44: raw `syscall` for close, sendmmsg and
/// recvmmsg) against dnsmasq on the Linux host (the kernel's sockets),
/// over UDP: the answer dnsmasq was told to give (the old layer passed
/// the raw sendmmsg to the kernel's eventfd: ENOTSOCK, no answer).
#[test]
fn dig_asks_dnsmasq_over_udp() {
    need_root!();
    need_program!("dig", "bind9-dnsutils");
    need_program!("dnsmasq", "dnsmasq");
    let _turn = serial();
    let lab = Lab::new("qg", need_preload!());
    let _dns = lab.linux_daemon(&[
        "dnsmasq",
        "--keep-in-foreground",
        "--no-resolv",
        "--no-hosts",
        "--user=root",
        "--pid-file",
        "--bind-interfaces",
        "--listen-address=10.77.0.1",
        "--address=/ustack.test/10.77.0.99",
    ]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !lab
        .linux(&[
            "dig",
            "+short",
            "+time=1",
            "+tries=1",
            "@10.77.0.1",
            "ustack.test",
        ])
        .stdout
        .starts_with(b"10.77.0.99")
    {
        assert!(Instant::now() < deadline, "dnsmasq never answered");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Over TCP dig sets TCP_MAXSEG and TCP_USER_TIMEOUT and stops when
    // they fail: that waits for the TCP options' own issue.
    let transport = "+notcp";
    let end = lab
        .start_with(
            Host::Stack,
            false,
            false,
            &[
                "dig",
                transport,
                "+time=3",
                "+tries=2",
                "@10.77.0.1",
                "ustack.test",
                "A",
            ],
        )
        .wait();
    end.check(0);
    assert!(
        end.out
            .lines()
            .any(|l| l.starts_with("ustack.test.") && l.ends_with("10.77.0.99")),
        "dig {transport} on ustack: {}{}",
        end.out,
        end.err
    );
    // Over in well under a telemetry period: no snapshot to read.
    assert!(!end.err.contains("non-socket"), "{}", end.err);
}

// ------------------------------------------------------ fallbacks, said

/// Opens two AF_INET6 sockets, connects an AF_INET one to the echo peer,
/// forks: the child sends on the inherited socket twice (EBADF) and opens
/// an AF_INET socket of its own (the kernel's); the parent then echoes.
const FALLBACKS: &str = r#"
import errno, json, os, socket, sys
a = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
b = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
pid = os.fork()
if pid == 0:
    out = []
    for _ in range(2):
        try:
            s.send(b"x")
            out.append("sent")
        except OSError as e:
            out.append(errno.errorcode.get(e.errno, str(e.errno)))
    k = socket.socket()
    k.close()
    print(json.dumps({"child_send": out}), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
s.sendall(b"ok")
print(json.dumps({"echo": s.recv(10).decode()}), flush=True)
"#;

/// What ustack leaves to the kernel or refuses is said in one line on
/// stderr, once, starting `ustack:`: a program's first AF_INET6 socket,
/// a forked child's use of its parent's socket (EBADF), a forked child's
/// own AF_INET socket; and `ustack exec` refuses a Go program (exit
/// status 2, before it runs: LD_PRELOAD cannot carry raw system calls).
#[test]
fn fallbacks_are_said_in_one_line() {
    need_root!();
    need_program!(PYTHON, "python3");
    need_program!("cc", "gcc");
    need_program!("objcopy", "binutils");
    let _turn = serial();
    let lab = Lab::new("qf", need_preload!());
    let script = lab.path("fallbacks.py");
    std::fs::write(&script, FALLBACKS).unwrap();
    let peer = lab.linux_echo_peer(7401, 7402);
    let end = lab.run(
        Host::Stack,
        &[PYTHON, &script.display().to_string(), "10.77.0.1", "7402"],
    );
    drop(peer);
    end.check(0);
    let lines = json_lines(&end.out);
    let child = lines.iter().find(|v| v.get("child_send").is_some());
    assert_eq!(
        child.map(|v| v["child_send"].clone()),
        Some(serde_json::json!(["EBADF", "EBADF"])),
        "{}{}",
        end.out,
        end.err
    );
    assert!(lines.iter().any(|v| v["echo"] == "ok"), "{}", end.out);
    let said = |what: &str| {
        let l: Vec<&str> = end.err.lines().filter(|l| l.contains(what)).collect();
        assert_eq!(l.len(), 1, "one line with {what:?}: {}", end.err);
        assert!(l[0].starts_with("ustack: "), "{}", l[0]);
    };
    said("AF_INET6");
    said("a socket its parent opened");
    said("(forked) opened an AF_INET socket");

    // A Go program (a C program given Go's build-ID note section) is
    // refused before it runs; the same program without the note runs.
    let plain = compile_c(
        &lab,
        "hello",
        "#include <stdio.h>\nint main(void) { puts(\"ran\"); return 0; }\n",
    );
    let note = lab.path("go.note");
    // An ELF note: namesz 4, descsz 8, type 4 (NT_GO_BUILDID), "Go\0\0".
    let mut bytes = Vec::new();
    for v in [4u32, 8, 4] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    bytes.extend_from_slice(b"Go\0\0buildid1");
    std::fs::write(&note, bytes).unwrap();
    let go = lab.path("fakego");
    let o = Command::new("objcopy")
        .arg("--add-section")
        .arg(format!(".note.go.buildid={}", note.display()))
        .args(["--set-section-flags", ".note.go.buildid=alloc,readonly"])
        .arg(&plain)
        .arg(&go)
        .output()
        .expect("run objcopy");
    assert!(o.status.success(), "objcopy: {}", text(&o));
    let ran = lab
        .start_with(Host::Stack, false, false, &[&plain.display().to_string()])
        .wait();
    ran.check(0);
    assert_eq!(ran.out.trim(), "ran", "{}", ran.err);
    let refused = lab
        .start_with(Host::Stack, false, false, &[&go.display().to_string()])
        .wait();
    assert_eq!(refused.code, 2, "{}{}", refused.out, refused.err);
    assert_eq!(refused.out, "", "the Go program ran");
    let lines: Vec<&str> = refused.err.lines().collect();
    assert_eq!(lines.len(), 1, "{}", refused.err);
    assert!(
        lines[0].starts_with("ustack: ") && lines[0].contains("is a Go program"),
        "{}",
        refused.err
    );
}
