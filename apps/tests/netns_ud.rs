//! RDMA UD (RoCEv2 by the stack) over a veth pair through libpcap, in
//! namespaces the test makes and removes itself: `uping --rdma` against
//! `ustack run`'s responder, clean and with the daemon impaired; the capture
//! dissected by tshark (opcode, QPNs, Q_Key, PSNs) and every packet's ICRC
//! recomputed here with the test's own CRC-32; `uperf --rdma` prints its
//! table. Needs root and the `pcap` feature; skips with the reason otherwise.
#![cfg(feature = "pcap")]

#[macro_use]
mod common;
use common::*;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

impl Topo {
    /// `ustack run` as 10.77.0.2 in the stack namespace, ready when it
    /// answers ARP.
    fn daemon(&self, extra: &[&str]) -> Daemon {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns("stack")])
            .arg(env!("CARGO_BIN_EXE_ustack"))
            .args(["run", "--pcap", &format!("{}-s", self.tag)])
            .args(["--ip", "10.77.0.2/24"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ustack run");
        let d = Daemon { child: Some(child) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let ok = Command::new("ip")
                .args(["netns", "exec", &self.ns("linux")])
                .args(["arping", "-c", "1", "-w", "1", "-I"])
                .arg(format!("{}-l", self.tag))
                .arg("10.77.0.2")
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                return d;
            }
        }
        panic!("ustack run did not come up");
    }

    /// A ustack app as 10.77.0.3 on the Linux side's veth (pcap takes its
    /// own MAC and address there; the kernel keeps 10.77.0.1).
    fn app(&self, bin: &str, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.ns("linux"), bin])
            .args(["--pcap", &format!("{}-l", self.tag), "--ip", "10.77.0.3/24"])
            .args(args)
            .output()
            .expect("run the app")
    }
}

fn temp_pcap() -> tempfile::TempPath {
    tempfile::Builder::new()
        .suffix(".pcap")
        .tempfile()
        .unwrap()
        .into_temp_path()
}

/// "N packets transmitted, M received" from ping-style output.
fn sent_received(out: &str) -> (u64, u64) {
    let re = regex::Regex::new(r"(\d+) packets transmitted, (\d+) received").unwrap();
    let c = re
        .captures(out)
        .unwrap_or_else(|| panic!("no summary in {out}"));
    (c[1].parse().unwrap(), c[2].parse().unwrap())
}

// ------------------------------------------------- the test's own ICRC

/// Bitwise reflected CRC-32 (polynomial 0xEDB88320), written here so the
/// check does not share code with the stack.
fn crc32(bytes: impl IntoIterator<Item = u8>) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// The RoCEv2 ICRC of an IPv4 packet (ICRC in its last 4 bytes): 8 bytes
/// of ones, then the packet with TOS, TTL, IP checksum, UDP checksum and
/// BTH byte 4 set to ones.
fn roce_icrc(ip: &[u8]) -> u32 {
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let mut m = ip[..ip.len() - 4].to_vec();
    for at in [1, 8, 10, 11, ihl + 6, ihl + 7, ihl + 8 + 4] {
        m[at] = 0xff;
    }
    crc32([0xffu8; 8].into_iter().chain(m))
}

/// Ethernet frames of a pcap file (the writer's byte order).
fn pcap_frames(path: &Path) -> Vec<Vec<u8>> {
    let d = std::fs::read(path).unwrap();
    let le = match &d[..4] {
        [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1] => true,
        [0xa1, 0xb2, 0xc3, 0xd4] | [0xa1, 0xb2, 0x3c, 0x4d] => false,
        m => panic!("not a pcap file: {m:x?}"),
    };
    let rd = |at: usize| {
        let b = [d[at], d[at + 1], d[at + 2], d[at + 3]];
        if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        }
    };
    let mut at = 24;
    let mut out = Vec::new();
    while at + 16 <= d.len() {
        let n = rd(at + 8) as usize;
        out.push(d[at + 16..at + 16 + n].to_vec());
        at += 16 + n;
    }
    out
}

fn num(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap(),
        None => s.parse().unwrap(),
    }
}

#[test]
fn uping_rdma_against_ustack_run_dissected_by_tshark_with_icrc() {
    need_root!();
    let topo = Topo::up("ud");
    let cap = temp_pcap();
    let d = topo.daemon(&["--capture", &cap.display().to_string()]);
    let out = topo.app(
        env!("CARGO_BIN_EXE_uping"),
        // DSCP 26 (AF31) and ECT(0) in the pings' traffic class.
        &[
            "--rdma",
            "--tclass",
            "106",
            "-c",
            "10",
            "-i",
            "0.05",
            "-W",
            "1",
            "10.77.0.2",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(sent_received(&text), (10, 10), "{text}");
    assert!(text.contains("0% packet loss"), "{text}");
    let lines =
        regex::Regex::new(r"(?m)^56 bytes from 10\.77\.0\.2 qpn 2: ud_seq=\d+ time=[\d.]+ ms$")
            .unwrap();
    assert_eq!(lines.find_iter(&text).count(), 10, "{text}");
    assert!(text.contains("rtt min/avg/max/mdev = "), "{text}");
    assert!(text.contains("rtt p50/p99/max = "), "{text}");
    let (code, dout, derr) = d.stop();
    assert_eq!(code, 0, "{derr}");
    assert!(dout.contains("rdma ud: qpn 2: 10 pings answered"), "{dout}");

    // tshark's RoCE dissector on the daemon's capture (both directions).
    let fields = [
        "infiniband.bth.opcode",
        "infiniband.bth.destqp",
        "infiniband.deth.srcqp",
        "infiniband.deth.q_key",
        "infiniband.bth.psn",
        "infiniband.bth.p_key",
        "ip.dst",
        "ip.dsfield",
    ];
    let mut args = vec![
        "-r".to_string(),
        cap.display().to_string(),
        "-d".into(),
        "udp.port==4791,infiniband".into(),
        "-Y".into(),
        "infiniband".into(),
        "-T".into(),
        "fields".into(),
    ];
    for f in fields {
        args.push("-e".into());
        args.push(f.into());
    }
    let ts = Command::new("tshark").args(&args).output().unwrap();
    assert!(
        ts.status.success(),
        "{}",
        String::from_utf8_lossy(&ts.stderr)
    );
    let rows: Vec<Vec<String>> = String::from_utf8_lossy(&ts.stdout)
        .lines()
        .map(|l| l.split('\t').map(str::to_string).collect())
        .collect();
    assert_eq!(rows.len(), 20, "{rows:?}");
    let pings: Vec<_> = rows.iter().filter(|r| r[6] == "10.77.0.2").collect();
    let pongs: Vec<_> = rows.iter().filter(|r| r[6] == "10.77.0.3").collect();
    assert_eq!((pings.len(), pongs.len()), (10, 10));
    let client_qpn = num(&pings[0][2]);
    for (i, r) in pings.iter().enumerate() {
        assert_eq!(num(&r[0]), 0x64, "UD SEND_ONLY");
        assert_eq!(num(&r[1]), 2, "to the responder QPN");
        assert_eq!(num(&r[2]), client_qpn);
        assert_eq!(num(&r[3]), 0x1111_1111, "perftest Q_Key");
        assert_eq!(num(&r[4]), i as u64, "PSN per QP");
        assert_eq!(num(&r[5]), 0xffff);
        assert_eq!(num(&r[7]), 106, "the traffic class in the TOS byte");
    }
    for (i, r) in pongs.iter().enumerate() {
        assert_eq!(num(&r[0]), 0x64);
        assert_eq!((num(&r[1]), num(&r[2])), (client_qpn, 2));
        assert_eq!(num(&r[3]), 0x1111_1111);
        assert_eq!(num(&r[4]), i as u64);
        assert_eq!(num(&r[7]), 0, "the responder's QP sends class 0");
    }

    // Every RoCE packet's ICRC, recomputed here (it masks the TOS byte).
    let mut checked = 0;
    for f in pcap_frames(&cap) {
        if f.len() < 14 + 28 || f[12..14] != [0x08, 0x00] || f[14 + 9] != 17 {
            continue;
        }
        let ip = &f[14..];
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        if u16::from_be_bytes([ip[ihl + 2], ip[ihl + 3]]) != 4791 {
            continue;
        }
        let ip = &ip[..usize::from(u16::from_be_bytes([ip[2], ip[3]]))];
        let sport = u16::from_be_bytes([ip[ihl], ip[ihl + 1]]);
        assert!(sport >= 0xc000, "UDP source port {sport:#x}");
        let wire = u32::from_le_bytes(ip[ip.len() - 4..].try_into().unwrap());
        assert_eq!(roce_icrc(ip), wire, "ICRC of packet {checked}");
        checked += 1;
    }
    assert_eq!(checked, 20);
}

/// The same over IPv6 GIDs: `uping --rdma fd77::2` against `ustack run`
/// with an IPv6 address; tshark dissects the RoCE frames over IPv6, and
/// `tools/roce-icrc.py` recomputes every ICRC over IPv6's masks.
#[test]
fn uping_rdma_over_ipv6_against_ustack_run() {
    need_root!();
    let topo = Topo::up("u6");
    let cap = temp_pcap();
    let d = topo.daemon(&[
        "--ip",
        "fd77::2/64",
        "--capture",
        &cap.display().to_string(),
    ]);
    let out = topo.app(
        env!("CARGO_BIN_EXE_uping"),
        &[
            "--ip",
            "fd77::3/64",
            "--rdma",
            "-c",
            "10",
            "-i",
            "0.05",
            "-W",
            "2",
            "fd77::2",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(sent_received(&text), (10, 10), "{text}");
    let lines =
        regex::Regex::new(r"(?m)^56 bytes from fd77::2 qpn 2: ud_seq=\d+ time=[\d.]+ ms$").unwrap();
    assert_eq!(lines.find_iter(&text).count(), 10, "{text}");
    let (code, dout, derr) = d.stop();
    assert_eq!(code, 0, "{derr}");
    assert!(dout.contains("rdma ud: qpn 2: 10 pings answered"), "{dout}");
    let ts = Command::new("tshark")
        .args(["-r", &cap.display().to_string()])
        .args(["-d", "udp.port==4791,infiniband", "-Y", "infiniband"])
        .args(["-T", "fields", "-e", "ipv6.dst", "-e", "udp.checksum"])
        .args(["-e", "infiniband.bth.opcode", "-e", "infiniband.deth.q_key"])
        .output()
        .unwrap();
    assert!(
        ts.status.success(),
        "{}",
        String::from_utf8_lossy(&ts.stderr)
    );
    let rows: Vec<Vec<String>> = String::from_utf8_lossy(&ts.stdout)
        .lines()
        .map(|l| l.split('\t').map(str::to_string).collect())
        .collect();
    assert_eq!(rows.len(), 20, "{rows:?}");
    for dst in ["fd77::2", "fd77::3"] {
        let n = rows.iter().filter(|r| r[0] == dst).count();
        assert_eq!(n, 10, "to {dst}: {rows:?}");
    }
    for r in &rows {
        assert_eq!(num(&r[1]), 0, "UDP checksum 0: {r:?}");
        assert_eq!(num(&r[2]), 0x64, "UD SEND_ONLY");
        assert_eq!(num(&r[3]), 0x1111_1111);
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let icrc = Command::new("python3")
        .arg(repo.join("tools/roce-icrc.py"))
        .arg(&*cap)
        .output()
        .unwrap();
    let t = String::from_utf8_lossy(&icrc.stdout);
    assert!(icrc.status.success(), "{t}");
    for sender in ["fd77::2", "fd77::3"] {
        assert!(
            t.contains(&format!("{sender}: 10 valid ICRC, 0 invalid")),
            "{t}"
        );
    }
}

#[test]
fn uping_rdma_counts_loss_when_the_daemon_is_impaired() {
    need_root!();
    let topo = Topo::up("ul");
    let d = topo.daemon(&["--impair", "loss=0.2,seed=5"]);
    let out = topo.app(
        env!("CARGO_BIN_EXE_uping"),
        &[
            "--rdma",
            "-c",
            "60",
            "-i",
            "0.01",
            "-W",
            "1",
            "-q",
            "10.77.0.2",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (sent, got) = sent_received(&text);
    assert_eq!(sent, 60, "{text}");
    assert!(got > 0 && got < 60, "loss must show: {text}");
    let loss = regex::Regex::new(r"received, ([\d.]+)% packet loss")
        .unwrap()
        .captures(&text)
        .unwrap()[1]
        .parse::<f64>()
        .unwrap();
    assert!(
        (loss - 100.0 * (60 - got) as f64 / 60.0).abs() < 0.01,
        "{text}"
    );
    let (code, dout, derr) = d.stop();
    assert_eq!(code, 0, "{derr}");
    // The daemon answered exactly the pings it saw, and we got at most that.
    let answered: u64 = regex::Regex::new(r"qpn 2: (\d+) pings answered")
        .unwrap()
        .captures(&dout)
        .unwrap_or_else(|| panic!("{dout}"))[1]
        .parse()
        .unwrap();
    assert!(answered >= got && answered <= 60, "{answered} {got}");
}

#[test]
fn uperf_rdma_prints_the_send_bw_table() {
    need_root!();
    let topo = Topo::up("ub");
    let d = topo.daemon(&[]);
    let out = topo.app(
        env!("CARGO_BIN_EXE_uperf"),
        &["-c", "10.77.0.2", "--rdma", "--iters", "200"],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(
        text.contains("#bytes     #iterations    BW peak[MB/sec]"),
        "{text}"
    );
    // A size whose sends all complete within one poll has no span to
    // divide by: its figures are "n/a", never 0.00.
    let row = regex::Regex::new(
        r"(?m)^ (\d+)\s+200\s+([\d.]+|n/a)\s+([\d.]+|n/a)\s+([\d.]+|n/a)\s+(\d+)/200$",
    )
    .unwrap();
    let sizes: Vec<u64> = row
        .captures_iter(&text)
        .map(|c| c[1].parse().unwrap())
        .collect();
    assert_eq!(sizes, vec![64, 128, 256, 512, 1024], "{text}");
    for c in row.captures_iter(&text) {
        if &c[3] != "n/a" {
            assert!(c[3].parse::<f64>().unwrap() > 0.0, "{text}");
        }
    }
    let (code, dout, _) = d.stop();
    assert_eq!(code, 0);
    assert!(dout.contains("sink messages"), "{dout}");
}
