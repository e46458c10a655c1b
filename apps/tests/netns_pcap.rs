//! The pcap backend against the real Linux kernel, in network namespaces the
//! test makes and removes itself (tools/netns.sh): ping and arping answered,
//! TCP both ways byte-exact (clean and under netem loss and reordering),
//! counters that agree with Linux's, and clear errors. Needs root; the
//! all-features build (`--features pcap`) runs it.
#![cfg(feature = "pcap")]

#[macro_use]
mod common;
use common::*;

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

impl Topo {
    /// A ustack command in the stack namespace.
    fn ustack(&self, args: &[&str]) -> Command {
        self.bin(env!("CARGO_BIN_EXE_ustack"), args)
    }

    fn daemon(&self) -> Daemon {
        self.daemon_with(&[])
    }

    /// `uping` in the stack namespace as 10.77.0.2.
    fn uping(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns("stack"),
                env!("CARGO_BIN_EXE_uping"),
                "--pcap",
                &self.stack_if(),
                "--ip",
                "10.77.0.2/24",
            ])
            .args(args)
            .output()
            .expect("run uping")
    }

    fn daemon_with(&self, extra: &[&str]) -> Daemon {
        let child = self
            .ustack(&["run", "--pcap", &self.stack_if(), "--ip", "10.77.0.2/24"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ustack run");
        let d = Daemon { child: Some(child) };
        // Ready when it answers ARP.
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self
                .linux(&[
                    "arping",
                    "-c",
                    "1",
                    "-w",
                    "1",
                    "-I",
                    &format!("{}-l", self.tag),
                    "10.77.0.2",
                ])
                .status
                .success()
            {
                return d;
            }
        }
        panic!("ustack run did not come up");
    }
}

/// (rx, tx) packets from a `port   rx N pkts ... tx M pkts` counters line.
fn port_packets(report: &str) -> (u64, u64) {
    let line = report
        .lines()
        .find(|l| l.trim_start().starts_with("port"))
        .expect("port line");
    let w: Vec<&str> = line.split_whitespace().collect();
    (w[2].parse().unwrap(), w[7].parse().unwrap())
}

#[test]
fn linux_ping_and_arping_are_answered_and_counters_agree() {
    need_root!();
    let topo = Topo::up("pg");
    let d = topo.daemon();
    let ping = topo.linux(&["ping", "-c", "20", "-i", "0.05", "10.77.0.2"]);
    let text = String::from_utf8_lossy(&ping.stdout);
    assert!(ping.status.success(), "{text}");
    assert_eq!(count_before(&text, "received"), 20, "{text}");
    let arping = topo.linux(&[
        "arping",
        "-c",
        "3",
        "-I",
        &format!("{}-l", topo.tag),
        "10.77.0.2",
    ]);
    let text = String::from_utf8_lossy(&arping.stdout);
    assert!(arping.status.success(), "{text}");
    assert!(text.contains("3 packets received"), "{text}");
    let (code, out, err) = d.stop();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("echo req in/out 20/0"), "{out}");
    assert!(!err.contains("panicked"));
    // What Linux sent is what the stack received, and the other way round.
    let link = topo.linux(&[
        "ip",
        "-s",
        "-j",
        "link",
        "show",
        "dev",
        &format!("{}-l", topo.tag),
    ]);
    let j: serde_json::Value = serde_json::from_slice(&link.stdout).expect("ip -j output");
    let stats = &j[0]["stats64"];
    let (linux_rx, linux_tx) = (
        stats["rx"]["packets"].as_u64().unwrap(),
        stats["tx"]["packets"].as_u64().unwrap(),
    );
    let (ustack_rx, ustack_tx) = port_packets(&out);
    // Every frame the stack sent reached Linux. Linux's counters are read
    // after the stack stopped, so a frame the kernel sends on its own in
    // between (a neighbour probe) is on Linux's side only: allow one or two.
    assert_eq!(ustack_tx, linux_rx, "{out}\n{stats}");
    assert!(
        ustack_rx <= linux_tx && linux_tx - ustack_rx <= 2,
        "stack rx {ustack_rx}, Linux tx {linux_tx}: {out}\n{stats}"
    );
    assert!(ustack_rx >= 20 + 3, "{out}");
}

/// 64 MiB each way with Linux over pcap (see [`Topo::tcp_both_ways`]).
fn tcp_both_ways(short: &str, impair: &[&str]) {
    let topo = Topo::up(short);
    let d = topo.daemon_with(impair);
    let _ = topo.tcp_both_ways(d, "--pcap", impair);
}

/// Kills a child on drop unless taken.
struct Guard(Option<Child>);
fn scopeguard(c: Child) -> Guard {
    Guard(Some(c))
}
impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn tcp_with_linux_both_ways_clean() {
    need_root!();
    tcp_both_ways("tc", &[]);
}

/// 2% loss and 10% reordering on every frame in and out of the stack. This
/// kernel has no tc netem, so ustack's own `--impair` layer does it; Linux
/// has to recover from what it loses, and ustack from what Linux's frames lose.
#[test]
fn tcp_with_linux_both_ways_under_loss_and_reordering() {
    need_root!();
    tcp_both_ways(
        "tl",
        &["--impair", "loss=0.02,reorder=0.1,reorder_ms=1,seed=3"],
    );
}

#[test]
fn clear_errors_for_bad_interface_permission_and_link_down() {
    need_root!();
    let topo = Topo::up("er");
    let out = topo
        .ustack(&["run", "--pcap", "nosuch0", "--ip", "10.77.0.2/24"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        err.trim(),
        "ustack: no interface named 'nosuch0' (see `ip link`)"
    );

    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &topo.ns("stack"),
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ])
        .args([
            env!("CARGO_BIN_EXE_ustack"),
            "run",
            "--pcap",
            &topo.stack_if(),
            "--ip",
            "10.77.0.2/24",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.starts_with("ustack: no permission to capture"), "{err}");
    assert_eq!(err.lines().count(), 1);

    let d = topo.daemon();
    let down = Command::new("ip")
        .args([
            "netns",
            "exec",
            &topo.ns("stack"),
            "ip",
            "link",
            "set",
            &topo.stack_if(),
            "down",
        ])
        .status()
        .unwrap();
    assert!(down.success());
    let mut d = d;
    let mut child = d.child.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "ustack did not notice the interface going down"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(status.code(), Some(2));
    assert_eq!(
        err.trim(),
        format!("ustack: interface '{}' is down", topo.stack_if())
    );
}

#[test]
fn capture_file_opens_in_tshark() {
    need_root!();
    let topo = Topo::up("cp");
    let pcap = tempfile::Builder::new()
        .suffix(".pcap")
        .tempfile()
        .unwrap()
        .into_temp_path();
    let child = topo
        .ustack(&[
            "run",
            "--pcap",
            &topo.stack_if(),
            "--ip",
            "10.77.0.2/24",
            "--capture",
            &pcap.display().to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let d = Daemon { child: Some(child) };
    std::thread::sleep(Duration::from_millis(500));
    let ping = topo.linux(&["ping", "-c", "3", "-i", "0.1", "10.77.0.2"]);
    assert!(ping.status.success());
    let (code, _, err) = d.stop();
    assert_eq!(code, 0, "{err}");
    let tshark = Command::new("tshark")
        .args([
            "-r",
            &pcap.display().to_string(),
            "-Y",
            "icmp",
            "-T",
            "fields",
            "-e",
            "icmp.type",
        ])
        .output()
        .unwrap();
    assert!(
        tshark.status.success(),
        "{}",
        String::from_utf8_lossy(&tshark.stderr)
    );
    let types: Vec<String> = String::from_utf8_lossy(&tshark.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    // Three requests in, three replies out, both in the file.
    assert_eq!(types.iter().filter(|t| *t == "8").count(), 3, "{types:?}");
    assert_eq!(types.iter().filter(|t| *t == "0").count(), 3, "{types:?}");
}

/// iputils ping's output, as regexes; Linux ping and uping must both match.
struct PingFormat {
    header: regex::Regex,
    reply: regex::Regex,
    summary: regex::Regex,
    rtt: regex::Regex,
}

impl PingFormat {
    fn new() -> Self {
        PingFormat {
            header: regex::Regex::new(r"^PING (\S+) \((\S+)\) (\d+)\((\d+)\) bytes of data\.$").unwrap(),
            reply: regex::Regex::new(r"^(\d+) bytes from ([\d.]+): icmp_seq=(\d+) ttl=(\d+) time=([\d.]+) ms$").unwrap(),
            summary: regex::Regex::new(
                r"^(\d+) packets transmitted, (\d+) received(?:, \+(\d+) duplicates)?(?:, \+(\d+) errors)?, ([\d.]+)% packet loss, time (\d+)ms$",
            )
            .unwrap(),
            rtt: regex::Regex::new(r"^rtt min/avg/max/mdev = ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms$").unwrap(),
        }
    }

    /// Check every line; returns (reply seqs, transmitted, received, loss%).
    fn parse(&self, out: &str, host: &str) -> (Vec<u32>, u64, u64, f64) {
        let lines: Vec<&str> = out.lines().collect();
        let h = self
            .header
            .captures(lines[0])
            .unwrap_or_else(|| panic!("header: {}", lines[0]));
        assert_eq!(&h[1], host);
        let mut seqs = Vec::new();
        let mut i = 1;
        while i < lines.len() && !lines[i].is_empty() {
            let c = self
                .reply
                .captures(lines[i])
                .unwrap_or_else(|| panic!("reply line: {:?}", lines[i]));
            assert_eq!(&c[2], host);
            assert_eq!(&c[1], "64");
            seqs.push(c[3].parse().unwrap());
            i += 1;
        }
        assert_eq!(
            lines.get(i + 1).copied(),
            Some(format!("--- {host} ping statistics ---").as_str())
        );
        let s = self
            .summary
            .captures(lines[i + 2])
            .unwrap_or_else(|| panic!("summary: {}", lines[i + 2]));
        let (tx, rx, loss) = (
            s[1].parse().unwrap(),
            s[2].parse().unwrap(),
            s[5].parse().unwrap(),
        );
        if rx > 0 {
            let r = self
                .rtt
                .captures(lines[i + 3])
                .unwrap_or_else(|| panic!("rtt: {}", lines[i + 3]));
            let v: Vec<f64> = (1..=4).map(|k| r[k].parse().unwrap()).collect();
            assert!(v[0] <= v[1] && v[1] <= v[2], "min <= avg <= max: {v:?}");
        }
        (seqs, tx, rx, loss)
    }
}

#[test]
fn uping_output_matches_iputils_against_linux_and_ustack() {
    need_root!();
    let fmt = PingFormat::new();
    let topo = Topo::up("up");
    // The format, learnt from Linux's own ping first.
    let d = topo.daemon();
    let linux = topo.linux(&["ping", "-c", "3", "-i", "0.1", "10.77.0.2"]);
    let (seqs, tx, rx, loss) = fmt.parse(&String::from_utf8_lossy(&linux.stdout), "10.77.0.2");
    assert_eq!((seqs, tx, rx, loss), (vec![1, 2, 3], 3, 3, 0.0));

    // uping on the Linux side of the link (own address 10.77.0.3) to `ustack run`.
    let up = topo.linux(&[
        env!("CARGO_BIN_EXE_uping"),
        "--pcap",
        &format!("{}-l", topo.tag),
        "--ip",
        "10.77.0.3/24",
        "-c",
        "5",
        "-i",
        "0.1",
        "10.77.0.2",
    ]);
    let text = String::from_utf8_lossy(&up.stdout);
    assert_eq!(
        up.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&up.stderr)
    );
    assert_eq!(
        fmt.parse(&text, "10.77.0.2"),
        (vec![1, 2, 3, 4, 5], 5, 5, 0.0)
    );
    drop(d.stop());

    // uping in the stack's namespace to the Linux kernel.
    let up = topo.uping(&["-c", "4", "-i", "0.1", "10.77.0.1"]);
    let text = String::from_utf8_lossy(&up.stdout);
    assert_eq!(
        up.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&up.stderr)
    );
    assert_eq!(fmt.parse(&text, "10.77.0.1"), (vec![1, 2, 3, 4], 4, 4, 0.0));

    // Nobody at .99: no reply, 100% loss, exit status 1.
    let up = topo.uping(&["-c", "2", "-i", "0.1", "-W", "1", "10.77.0.99"]);
    let text = String::from_utf8_lossy(&up.stdout);
    assert_eq!(up.status.code(), Some(1), "{text}");
    assert_eq!(fmt.parse(&text, "10.77.0.99"), (vec![], 2, 0, 100.0));

    // Loss is counted: the stack drops 30% of frames each way.
    let up = topo.uping(&[
        "--impair",
        "loss=0.3,seed=4",
        "-c",
        "40",
        "-i",
        "0.02",
        "-W",
        "1",
        "10.77.0.1",
    ]);
    let text = String::from_utf8_lossy(&up.stdout);
    let (seqs, tx, rx, loss) = fmt.parse(&text, "10.77.0.1");
    assert_eq!(tx, 40);
    assert!(rx < 40 && rx > 5, "{text}");
    assert_eq!(seqs.len() as u64, rx);
    assert!(
        (loss - 100.0 * (40 - rx) as f64 / 40.0).abs() < 0.01,
        "{text}"
    );
}

/// Stock iperf3 client against `uperf -s`: forward, reverse, parallel.
#[test]
fn stock_iperf3_client_against_uperf_server() {
    need_root!();
    let topo = Topo::up("ip");
    for args in [
        &["-t", "2"][..],
        &["-t", "2", "-R"],
        &["-t", "2", "-P", "2"],
        &["-t", "2", "-R", "-P", "3"],
    ] {
        let server = Command::new("ip")
            .args([
                "netns",
                "exec",
                &topo.ns("stack"),
                env!("CARGO_BIN_EXE_uperf"),
                "--pcap",
                &topo.stack_if(),
                "--ip",
                "10.77.0.2/24",
                "-s",
                "-1",
                "-J",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut server = scopeguard(server);
        std::thread::sleep(Duration::from_millis(700));
        let client = topo.linux(&[&["iperf3", "-c", "10.77.0.2", "-J"][..], args].concat());
        let json: serde_json::Value = serde_json::from_slice(&client.stdout).unwrap_or_else(|e| {
            panic!(
                "iperf3 {args:?} JSON: {e}: {}",
                String::from_utf8_lossy(&client.stdout)
            )
        });
        assert!(client.status.success(), "iperf3 {args:?}: {json}");
        assert!(json.get("error").is_none(), "{json}");
        let sent = json["end"]["sum_sent"]["bytes"].as_u64().unwrap();
        let received = json["end"]["sum_received"]["bytes"].as_u64().unwrap();
        let streams = json["end"]["streams"].as_array().unwrap().len();
        let want = args
            .iter()
            .position(|a| *a == "-P")
            .map_or(1, |i| args[i + 1].parse().unwrap());
        assert_eq!(streams, want, "{args:?}");
        assert!(sent > 10 << 20, "{args:?}: only {sent} bytes");
        // What arrived is what was sent, less what was still in flight at the end.
        assert!(
            received <= sent && received + (8 << 20) * want as u64 >= sent,
            "{args:?}: sent {sent}, received {received}"
        );
        let out = server.0.take().unwrap().wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "uperf {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // uperf -s -J: iperf3's keys, and the count it measured is the one
        // the client reports for the server's side.
        let ours: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("uperf -s -J: {e}: {}", String::from_utf8_lossy(&out.stdout))
        });
        let key = if args.contains(&"-R") {
            "sum_sent"
        } else {
            "sum_received"
        };
        assert_eq!(
            ours["end"][key]["bytes"], json["end"][key]["bytes"],
            "{args:?} {key}: {ours} vs {json}"
        );
        assert_eq!(ours["end"]["streams"].as_array().unwrap().len(), want);
        assert!(!ours["intervals"].as_array().unwrap().is_empty(), "{ours}");
    }
}

/// `ustack run` serves iperf3 on 5201, test after test.
#[test]
fn ustack_run_serves_iperf3() {
    need_root!();
    let topo = Topo::up("ir");
    let d = topo.daemon();
    for args in [&["-t", "1"][..], &["-t", "1", "-R"]] {
        let client = topo.linux(&[&["iperf3", "-c", "10.77.0.2", "-J"][..], args].concat());
        let json: serde_json::Value = serde_json::from_slice(&client.stdout).expect("iperf3 JSON");
        assert!(client.status.success(), "iperf3 {args:?}: {json}");
        // A missing figure fails here too, with the client's JSON shown.
        assert!(
            json["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0) > 1 << 20,
            "iperf3 {args:?}: {json}"
        );
    }
    let (code, out, err) = d.stop();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("; 2 iperf3 tests"), "{out}");
}

/// `uperf -c` against a stock `iperf3 -s`: forward, reverse, parallel. Both
/// sides print iperf3 JSON, and each side's view of the bytes sent and
/// received is the same numbers.
#[test]
fn uperf_client_against_stock_iperf3_server() {
    need_root!();
    let topo = Topo::up("ic");
    for args in [
        &["-t", "2"][..],
        &["-t", "2", "-R"],
        &["-t", "2", "-P", "2"],
        &["-t", "2", "-R", "-P", "3"],
    ] {
        let server = topo.linux_iperf3_server();
        let client = Command::new("ip")
            .args(["netns", "exec", &topo.ns("stack")])
            .arg(env!("CARGO_BIN_EXE_uperf"))
            .args(["--pcap", &topo.stack_if(), "--ip", "10.77.0.2/24"])
            .args(["-c", "10.77.0.1", "-J"])
            .args(args)
            .output()
            .unwrap();
        let ours = stdout_json(&format!("uperf {args:?}"), &client.stdout, &client.stderr);
        assert!(client.status.success(), "uperf {args:?}: {ours}");
        assert!(ours.get("error").is_none(), "{ours}");
        let (code, out, err) = server.wait();
        let theirs = stdout_json("iperf3 -s", out.as_bytes(), err.as_bytes());
        assert_eq!(code, 0, "iperf3 -s: {theirs}");
        let want = args
            .iter()
            .position(|a| *a == "-P")
            .map_or(1, |i| args[i + 1].parse().unwrap());
        // iperf3 -s reports only what it measured itself (the other sum is
        // 0 in its JSON): that count must be the one uperf reports for it.
        let key = if args.contains(&"-R") {
            "sum_sent"
        } else {
            "sum_received"
        };
        let a = ours["end"][key]["bytes"].as_u64().unwrap();
        let b = theirs["end"][key]["bytes"].as_u64().unwrap();
        assert_eq!(a, b, "{args:?} {key}: uperf says {a}, iperf3 says {b}");
        assert!(theirs.get("error").is_none(), "{theirs}");
        let sent = ours["end"]["sum_sent"]["bytes"].as_u64().unwrap();
        let received = ours["end"]["sum_received"]["bytes"].as_u64().unwrap();
        assert!(sent > 10 << 20, "{args:?}: only {sent} bytes");
        assert!(
            received <= sent && received + (8 << 20) * want as u64 >= sent,
            "{args:?}: sent {sent}, received {received}"
        );
        assert_eq!(ours["end"]["streams"].as_array().unwrap().len(), want);
        assert_eq!(theirs["end"]["streams"].as_array().unwrap().len(), want);
        assert!(ours["intervals"].as_array().unwrap().len() >= 2);
    }
}

/// `uperf -c` text output is iperf3's, and its mistakes are iperf3's too.
#[test]
fn uperf_client_text_output_and_errors() {
    need_root!();
    let topo = Topo::up("it");
    let uperf = |args: &[&str]| {
        Command::new("ip")
            .args(["netns", "exec", &topo.ns("stack")])
            .arg(env!("CARGO_BIN_EXE_uperf"))
            .args(["--pcap", &topo.stack_if(), "--ip", "10.77.0.2/24"])
            .args(args)
            .output()
            .unwrap()
    };
    // Nobody listens: refused, exit 1 like iperf3.
    let out = uperf(&["-c", "10.77.0.1", "-t", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("unable to connect to server") && err.contains("refused"),
        "{err}"
    );
    // An address nobody has: no answer within the connect timeout.
    let out = uperf(&["-c", "10.77.0.9", "-t", "1", "--connect-timeout", "1500"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no answer from 10.77.0.9:5201"), "{err}");
    // Bad flags: clap's usage error, exit 2.
    let out = uperf(&["-c", "10.77.0.1", "-P", "0"]);
    assert_eq!(out.status.code(), Some(2));
    // A real test: the lines a user knows.
    let server = Command::new("ip")
        .args(["netns", "exec", &topo.ns("linux")])
        .args(["iperf3", "-s", "-1", "-B", "10.77.0.1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _server = scopeguard(server);
    std::thread::sleep(Duration::from_millis(500));
    let out = uperf(&["-c", "10.77.0.1", "-t", "2"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let interval = regex::Regex::new(
        r"^\[\s*\d+\]\s+\d+\.\d\d-\d+\.\d\d\s+sec\s+[\d.]+ [KMG]?Bytes\s+[\d.]+ [KMG]?bits/sec\s+\d+\s+[\d.]+ [KMG]?Bytes\s*$",
    )
    .unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("Connecting to host 10.77.0.1, port 5201"),
        "{text}"
    );
    assert!(lines[1].contains("local 10.77.0.2 port"), "{text}");
    assert!(lines[2].starts_with("[ ID] Interval"), "{text}");
    assert_eq!(
        lines.iter().filter(|l| interval.is_match(l)).count(),
        2,
        "{text}"
    );
    assert!(
        lines.iter().any(|l| l.trim_end().ends_with("sender")),
        "{text}"
    );
    assert!(
        lines.iter().any(|l| l.trim_end().ends_with("receiver")),
        "{text}"
    );
    assert_eq!(lines.last(), Some(&"iperf Done."), "{text}");
}

/// Rough edges a new user hit (issue 18), against the kernel in our own
/// namespaces: a closed stdout, an absent host, an interrupted send, an
/// MTU the interface cannot carry.
#[test]
fn rough_edges_closed_stdout_absent_host_interrupt_and_mtu() {
    need_root!();
    let topo = Topo::up("re");
    let closed = |mut c: Command| {
        let mut child = c
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        // Both exit on their own (a count, a --duration) if the fix is gone.
        let out = child.wait_with_output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // `uping ... | head -1` and `ustack run ... | head -2`, head gone: no
    // "failed printing to stdout" panic, the shell's SIGPIPE status.
    let mut c = topo.bin(
        env!("CARGO_BIN_EXE_uping"),
        &["--pcap", &topo.stack_if(), "--ip", "10.77.0.2/24"],
    );
    c.args(["-c", "3", "-i", "0.2", "10.77.0.1"]);
    let (code, err) = closed(c);
    assert_eq!(code, Some(141), "uping: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let mut c = topo.ustack(&["run", "--pcap", &topo.stack_if(), "--ip", "10.77.0.2/24"]);
    c.args(["--duration", "20"]);
    let (code, err) = closed(c);
    assert_eq!(code, Some(141), "ustack run: {err}");
    assert!(!err.contains("panicked"), "{err}");

    // ARP for the target fails: iputils' line for each request, counted
    // as errors, and ping's exit status 1.
    let out = topo.uping(&["-c", "2", "-i", "0.2", "-W", "30", "10.77.0.9"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    for seq in [1, 2] {
        assert!(
            text.contains(&format!(
                "From 10.77.0.2 icmp_seq={seq} Destination Host Unreachable"
            )),
            "{text}"
        );
    }
    assert!(
        text.contains("2 packets transmitted, 0 received, +2 errors"),
        "{text}"
    );

    // `ustack send` to a host that never answers ARP says so.
    let out = topo
        .ustack(&["send", "--pcap", &topo.stack_if(), "--ip", "10.77.0.2/24"])
        .args(["--to", "10.77.0.9:9", "--bytes", "1M", "--timeout", "5"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no ARP reply from 10.77.0.9"), "{err}");
    assert!(!err.contains("written"), "{err}");

    // SIGTERM during a send is reported as an interrupt, not a timeout.
    let child = topo
        .ustack(&["send", "--pcap", &topo.stack_if(), "--ip", "10.77.0.2/24"])
        .args(["--to", "10.77.0.9:9", "--bytes", "1M"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let (code, _, err) = Daemon::new(child).stop();
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("interrupted after"), "{err}");
    assert!(!err.contains("not finished after 120"), "{err}");

    // An IP MTU above the interface's: said at start, before the banner.
    let out = topo
        .ustack(&["run", "--pcap", &topo.stack_if(), "--ip", "10.77.0.2/24"])
        .args(["--mtu", "9000"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(out.stdout.is_empty());
    assert!(
        err.contains(&format!(
            "--mtu 9000 is above the MTU of {} (1500)",
            topo.stack_if()
        )),
        "{err}"
    );
}

/// A stock `iperf3 -c` against `uperf -s`: `-u` and `--bidir` are refused
/// with iperf3's own error (printed by the client), and `-O` is honoured so
/// the sender's and receiver's totals agree.
#[test]
fn stock_iperf3_refusals_and_omit_against_uperf_server() {
    need_root!();
    let topo = Topo::up("io");
    let server = Command::new("ip")
        .args([
            "netns",
            "exec",
            &topo.ns("stack"),
            env!("CARGO_BIN_EXE_uperf"),
        ])
        .args(["--pcap", &topo.stack_if(), "--ip", "10.77.0.2/24", "-s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _server = scopeguard(server);
    std::thread::sleep(Duration::from_millis(700));
    for args in [&["-u", "-t", "1"][..], &["--bidir", "-t", "1"]] {
        let out = topo.linux(&[&["iperf3", "-c", "10.77.0.2"][..], args].concat());
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{args:?}: {text}");
        assert!(
            text.contains("an option you are trying to set is not implemented yet"),
            "{args:?}: {text}"
        );
        assert!(!text.contains("closed unexpectedly"), "{args:?}: {text}");
    }
    let out = topo.linux(&["iperf3", "-c", "10.77.0.2", "-t", "2", "-O", "1", "-J"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(out.status.success(), "{json}");
    let sent = json["end"]["sum_sent"]["bytes"].as_u64().unwrap();
    let received = json["end"]["sum_received"]["bytes"].as_u64().unwrap();
    // Without -O honoured the server counts the omitted second too:
    // received would be about 1.5 x sent.
    assert!(
        received <= sent + sent / 10 && received >= sent / 2,
        "sent {sent}, received {received}"
    );
}
