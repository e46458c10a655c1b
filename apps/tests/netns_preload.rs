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
//! - redis BGSAVE (fork, the stack stays with the parent) under load; a
//!   `--fork child` stack's telemetry moves with it;
//!
//! - nginx with two `reuseport` workers (`--fork each --workers 2`): a
//!   stack per worker, both serving.
//!
//! The layer's calls and options are tested in netns_preload_calls.rs,
//! descriptors and libuv programs in netns_preload_fds.rs.
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
        // Listening before a client runs (a fixed wait lost the race on
        // a loaded machine: "Connection refused").
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        let filter = format!("sport = :{SOCKPERF_PORT}");
        while !String::from_utf8_lossy(&lab.linux(&["ss", "-Hltn", &filter]).stdout)
            .contains(SOCKPERF_PORT)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the Linux sockperf server never listened"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
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
