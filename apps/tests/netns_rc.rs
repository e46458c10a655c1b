//! perftest's RC tests between two ustack processes (`uperf --rdma rc`,
//! the same code in both roles) on a veth pair through libpcap, in
//! namespaces the test makes and removes itself: the server as 10.77.0.2 on
//! the stack side, the client as 10.77.0.3 on the Linux side's veth. For
//! SEND, WRITE and READ, bandwidth and latency: both exit 0, both tables
//! have their rows, the summary lines count every message and completion,
//! and the QP counters show no retransmission, ACK timeout or RNR NAK on
//! the clean link. Needs root and the `pcap` feature; skips otherwise.
#![cfg(feature = "pcap")]

#[macro_use]
mod common;
use common::*;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const N: u64 = 100;

/// The counters of a summary line (`uperf: perftest ... (RC): ...`).
#[derive(Debug, Default)]
struct Summary {
    messages: u64,
    completions: u64,
    errors: u64,
    retransmits: u64,
    rnr: u64,
    timeouts: u64,
    seq_naks: u64,
}

fn summary(out: &str) -> Summary {
    let line = out
        .lines()
        .find(|l| l.starts_with("uperf: perftest ") && l.contains("(RC):"))
        .unwrap_or_else(|| panic!("no summary line:\n{out}"));
    // count_before trims commas: make the clauses' semicolons commas.
    let line = &line.replace(';', ",");
    Summary {
        messages: count_before(line, "messages"),
        completions: count_before(line, "completions"),
        errors: count_before(line, "errors"),
        retransmits: count_before(line, "retransmits"),
        rnr: count_before(line, "RNR"),
        timeouts: count_before(line, "ACK"),
        seq_naks: count_before(line, "sequence"),
    }
}

/// The sizes of the table rows with `iters` iterations.
fn row_sizes(out: &str, iters: u64) -> Vec<u64> {
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 5 && f[1] == iters.to_string())
                .then(|| f[0].parse().ok())
                .flatten()
        })
        .collect()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

struct Case {
    op: &'static str,
    latency: bool,
    /// `--size N`, or `-a` when None.
    size: Option<u64>,
    iters: u64,
    /// IPv6 GIDs: both stacks get an IPv6 address, the client `--ipv6`
    /// (the server follows its family).
    ipv6: bool,
}

impl Case {
    fn args(&self) -> Vec<String> {
        let mut a = vec![
            "--rdma".to_string(),
            "rc".into(),
            "--op".into(),
            self.op.into(),
            "-n".into(),
            self.iters.to_string(),
        ];
        if self.latency {
            a.push("--latency".into());
        }
        match self.size {
            Some(s) => a.extend(["--size".to_string(), s.to_string()]),
            None => a.push("-a".into()),
        }
        a
    }

    /// The `--ip` flags of the server's (`host` 2) or client's (3) stack.
    fn ips(&self, host: u8) -> Vec<String> {
        let mut a = vec!["--ip".to_string(), format!("10.77.0.{host}/24")];
        if self.ipv6 {
            a.extend(["--ip".to_string(), format!("fd77::{host}/64")]);
        }
        a
    }

    fn sizes(&self) -> Vec<u64> {
        match self.size {
            Some(s) => vec![s],
            None => (1..24).map(|i| 1u64 << i).collect(),
        }
    }

    fn name(&self) -> String {
        format!(
            "{}_{} {}{}",
            self.op,
            if self.latency { "lat" } else { "bw" },
            self.size
                .map_or_else(|| "-a".to_string(), |s| format!("{s} B")),
            if self.ipv6 { " (IPv6 GIDs)" } else { "" }
        )
    }
}

fn run_case(topo: &Topo, c: &Case) {
    let uperf = env!("CARGO_BIN_EXE_uperf");
    let args = c.args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Daemon::new(
        topo.bin(uperf, &["--pcap", &topo.stack_if(), "-s", "-1"])
            .args(c.ips(2))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the uperf server"),
    );
    // The server listens once its stack runs: retry while refused.
    let deadline = Instant::now() + Duration::from_secs(15);
    let client = loop {
        let o = Command::new("ip")
            .args(["netns", "exec", &topo.ns("linux"), uperf])
            .args(["--pcap", &topo.linux_if()])
            .args(c.ips(3))
            .args(["-c", "10.77.0.2", "--connect-timeout", "2000"])
            .args(if c.ipv6 { &["--ipv6"][..] } else { &[] })
            .args(&args)
            .output()
            .expect("run the uperf client");
        let t = text(&o);
        if o.status.success() || Instant::now() >= deadline || !t.contains("connect") {
            break o;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    let ct = text(&client);
    let (code, sout, serr) = server.wait();
    let st = format!("{sout}{serr}");
    let name = c.name();
    println!("==== {name}: client\n{ct}\n---- server\n{st}");
    assert!(
        client.status.success(),
        "{name} client:\n{ct}\nserver:\n{st}"
    );
    assert_eq!(code, 0, "{name} server:\n{st}\nclient:\n{ct}");

    let sizes = c.sizes();
    let n = c.iters * sizes.len() as u64;
    // Tables: the client always has one row per size.
    assert_eq!(row_sizes(&ct, c.iters), sizes, "{name} client rows:\n{ct}");
    let server_rows = row_sizes(&st, c.iters);
    match (c.op, c.latency) {
        // The write/read bw server prints the client's last report.
        ("write" | "read", false) => {
            assert_eq!(server_rows, vec![*sizes.last().unwrap()], "{name}:\n{st}")
        }
        // The read_lat server is idle: no table, as perftest's.
        ("read", true) => {
            assert!(server_rows.is_empty(), "{name}:\n{st}");
            assert!(!st.contains("#bytes"), "{name}:\n{st}");
        }
        _ => assert_eq!(server_rows, sizes, "{name} server rows:\n{st}"),
    }
    for t in [&ct, &st] {
        assert!(t.contains("Connection type : RC"), "{name}:\n{t}");
    }
    // Each side's RC traffic went to the address of the peer's GID.
    let (to_server, to_client) = if c.ipv6 {
        ("fd77::2", "fd77::3")
    } else {
        ("10.77.0.2", "10.77.0.3")
    };
    assert!(
        ct.contains(&format!("peer {to_server} qpn")),
        "{name}:\n{ct}"
    );
    assert!(
        st.contains(&format!("peer {to_client} qpn")),
        "{name}:\n{st}"
    );

    // Counts: what each side moved, and clean QPs on both ends.
    let cs = summary(&ct);
    let ss = summary(&st);
    let (client_msgs, server_msgs) = match (c.op, c.latency) {
        ("send", true) | ("write", true) => (2 * n, 2 * n),
        ("send", false) => (n, n),
        _ => (n, 0),
    };
    assert_eq!(cs.messages, client_msgs, "{name} client:\n{ct}");
    assert_eq!(ss.messages, server_msgs, "{name} server:\n{st}");
    assert!(cs.completions > 0, "{name}:\n{ct}");
    if c.size.is_some_and(|s| s > 8192) && !c.latency {
        // perftest signals every work request above 8 KiB.
        assert_eq!(cs.completions, n, "{name}:\n{ct}");
    }
    if c.op == "send" {
        // Every receive completes.
        assert!(ss.completions >= n, "{name}:\n{st}");
    }
    for (side, s, t) in [("client", &cs, &ct), ("server", &ss, &st)] {
        assert_eq!(
            (s.errors, s.retransmits, s.timeouts, s.rnr, s.seq_naks),
            (0, 0, 0, 0, 0),
            "{name} {side}: errors, retransmits, ACK timeouts, RNR NAKs, sequence NAKs\n{t}"
        );
    }
}

#[test]
fn perftest_rc_between_two_ustacks() {
    need_root!();
    let topo = Topo::up("rc");
    let mut cases = Vec::new();
    for op in ["send", "write", "read"] {
        for latency in [false, true] {
            cases.push(Case {
                op,
                latency,
                size: Some(65536),
                iters: N,
                ipv6: false,
            });
        }
    }
    // Single-packet sizes, and sweeps to 8 MiB with few iterations.
    cases.push(Case {
        op: "send",
        latency: true,
        size: Some(2),
        iters: N,
        ipv6: false,
    });
    cases.push(Case {
        op: "write",
        latency: false,
        size: Some(1000),
        iters: N,
        ipv6: false,
    });
    // IPv6 GIDs (perftest's --ipv6): a bandwidth and a latency test.
    for (op, latency, size) in [("write", false, 65536), ("send", true, 2)] {
        cases.push(Case {
            op,
            latency,
            size: Some(size),
            iters: N,
            ipv6: true,
        });
    }
    for (op, latency) in [("send", false), ("write", true), ("read", false)] {
        cases.push(Case {
            op,
            latency,
            size: None,
            iters: 5,
            ipv6: false,
        });
    }
    for c in &cases {
        run_case(&topo, c);
    }
}

#[test]
fn bad_rc_flags_are_one_line() {
    let o = Command::new(env!("CARGO_BIN_EXE_uperf"))
        .args(["--sim", "-s", "--op", "write"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.lines()
            .next()
            .unwrap_or("")
            .contains("--op needs --rdma rc"),
        "{e}"
    );
}
