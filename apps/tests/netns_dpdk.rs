//! The DPDK backend with virtual devices and no hugepages, in network
//! namespaces the test makes and removes itself (tools/netns.sh):
//! `net_af_packet` on a veth answers Linux ping/arping and echoes TCP
//! byte-exact, `net_tap` answers the kernel, two stacks joined by `net_memif`
//! ping each other and move TCP byte-exact, mbufs all come back, and bad
//! input gives one error line and exit status 2 or a counted drop.
//! Needs root and `--features dpdk` (the all-features build).
#![cfg(feature = "dpdk")]

#[macro_use]
mod common;
use common::*;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ustack_kit::bulk::fill_pattern;

/// EAL without hugepages or PCI; each process gets its own file prefix.
const EAL: &str = "--no-huge -m 256 --no-pci";

impl Topo {
    fn af_packet(&self) -> String {
        format!("{EAL} --vdev=net_af_packet0,iface={}-s", self.tag)
    }

    /// `ustack run` with these EAL arguments and flags.
    fn daemon(&self, eal: &str, ip: &str, extra: &[&str]) -> Daemon {
        let child = self
            .bin(
                env!("CARGO_BIN_EXE_ustack"),
                &["run", "--dpdk", eal, "--ip", ip],
            )
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ustack run");
        Daemon { child: Some(child) }
    }

    /// Wait until the stack at 10.77.0.2 answers ARP from the Linux side.
    fn wait_arp(&self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            let out = self.linux(&[
                "arping",
                "-c",
                "1",
                "-w",
                "1",
                "-I",
                &format!("{}-l", self.tag),
                "10.77.0.2",
            ]);
            if out.status.success() {
                return;
            }
        }
        panic!("ustack run --dpdk did not come up");
    }
}

/// (in use, capacity, alloc failures) from the report's `pool` line.
fn pool_line(report: &str) -> (u64, u64, u64) {
    let line = report
        .lines()
        .find(|l| l.trim_start().starts_with("pool"))
        .unwrap_or_else(|| panic!("pool line in {report}"));
    // "  pool   NAME: X of Y in use, Z alloc failures"
    let w: Vec<&str> = line.split_whitespace().collect();
    (
        w[2].parse().unwrap(),
        w[4].parse().unwrap(),
        w[7].parse().unwrap(),
    )
}

/// The mbuf accounting every run must end with: nothing taken (af_packet
/// and memif hold no mbufs at rest, so the baseline is 0) and no leak
/// reported when the port closed.
fn assert_mbufs_returned(out: &str, err: &str) {
    let (in_use, capacity, _) = pool_line(out);
    assert!(capacity > 0, "{out}");
    assert_eq!(in_use, 0, "mbufs not back at baseline: {out}");
    assert!(!err.contains("not returned"), "{err}");
}

/// `bytes` random bytes through the TCP echo (port 7) at `addr`, sent with
/// `nc` from the namespace `side`: the echo must come back whole and equal.
fn nc_echo(topo: &Topo, side: &str, addr: &str, bytes: usize) {
    let (input, _) = random_file(bytes);
    let output = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    let nc = topo.in_ns(
        side,
        &[
            "sh",
            "-c",
            &format!(
                "nc -N -w 30 {addr} 7 < {} > {}",
                input.display(),
                output.display()
            ),
        ],
    );
    assert!(
        nc.status.success(),
        "nc: {}",
        String::from_utf8_lossy(&nc.stderr)
    );
    assert_eq!(std::fs::metadata(&output).unwrap().len(), bytes as u64);
    assert_eq!(sha256(&input), sha256(&output), "echo differs");
}

#[test]
fn af_packet_answers_ping_arping_and_echoes_tcp_from_linux() {
    need_root!();
    let topo = Topo::up("da");
    let d = topo.daemon(&topo.af_packet(), "10.77.0.2/24", &[]);
    topo.wait_arp();
    let ping = topo.linux(&["ping", "-c", "10", "-i", "0.05", "10.77.0.2"]);
    let text = String::from_utf8_lossy(&ping.stdout);
    assert!(ping.status.success(), "{text}");
    assert_eq!(count_before(&text, "received"), 10, "{text}");
    let arping = topo.linux(&[
        "arping",
        "-c",
        "3",
        "-I",
        &format!("{}-l", topo.tag),
        "10.77.0.2",
    ]);
    let text = String::from_utf8_lossy(&arping.stdout);
    assert!(text.contains("3 packets received"), "{text}");

    const BYTES: usize = 4 << 20;
    nc_echo(&topo, "linux", "10.77.0.2", BYTES);

    let (code, out, err) = d.stop();
    assert_eq!(code, 0, "{out}{err}");
    no_crash(&err);
    assert!(out.contains("echo req in/out 10/0"), "{out}");
    assert!(
        out.contains(&format!("tcp services: {BYTES} bytes in, {BYTES} echoed")),
        "{out}"
    );
    assert_mbufs_returned(&out, &err);
}

/// net_tap makes a kernel tap interface in the stack's namespace; the
/// kernel there (10.77.2.1 on the tap) pings the stack on the other side.
#[test]
fn tap_vdev_answers_the_kernel() {
    need_root!();
    let topo = Topo::up("dt");
    let tap = format!("{}t", topo.tag);
    // --tso: net_tap's segmentation runs in software in the loop's thread,
    // so the stack uses it there only when asked; here it is, to test the
    // TSO path on a port that cuts segments.
    let d = topo.daemon(
        &format!("{EAL} --vdev=net_tap0,iface={tap}"),
        "10.77.2.2/24",
        &["--tso"],
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while !topo
        .in_ns("stack", &["ip", "link", "show", &tap])
        .status
        .success()
    {
        assert!(Instant::now() < deadline, "no tap interface {tap}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        topo.in_ns("stack", &["ip", "addr", "add", "10.77.2.1/24", "dev", &tap])
            .status
            .success()
    );
    assert!(
        topo.in_ns("stack", &["ip", "link", "set", &tap, "up"])
            .status
            .success()
    );
    let ping = topo.in_ns(
        "stack",
        &["ping", "-c", "5", "-i", "0.1", "-W", "2", "10.77.2.2"],
    );
    let text = String::from_utf8_lossy(&ping.stdout);
    assert!(ping.status.success(), "{text}");
    assert_eq!(count_before(&text, "received"), 5, "{text}");
    // TCP both ways through net_tap's checksum offloads (on by default:
    // the engine leaves the TCP checksum to the port on transmit and
    // trusts the port's verdict on receive): the kernel checks every
    // checksum the port filled, and the echo is byte-exact.
    const BYTES: usize = 2 << 20;
    nc_echo(&topo, "stack", "10.77.2.2", BYTES);
    let (code, out, err) = d.stop();
    assert_eq!(code, 0, "{out}{err}");
    no_crash(&err);
    assert!(out.contains("echo req in/out 5/0"), "{out}");
    assert!(
        out.contains(&format!("tcp services: {BYTES} bytes in, {BYTES} echoed")),
        "{out}"
    );
    // The port did offer them, and the engine used them.
    assert!(
        out.contains("offload tx tcp checksum, rx tcp checksum, tso "),
        "{out}"
    );
    // TSO: the engine handed the port segments longer than a frame, from
    // the port's pool of large mbufs, and the port cut them: more frames
    // left the port than the engine built (the echo above is byte-exact,
    // so every cut frame's checksums and sequence numbers were right).
    let tx_of = |prefix: &str| -> u64 {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .unwrap_or_else(|| panic!("{prefix} line in {out}"));
        let w: Vec<&str> = line.split_whitespace().collect();
        let at = w.iter().position(|&x| x == "tx").unwrap();
        w[at + 1].parse().unwrap()
    };
    let (port_tx, built) = (tx_of("port "), tx_of("eth "));
    assert!(
        port_tx > built,
        "port sent {port_tx}, engine built {built}:\n{out}"
    );
    assert!(
        out.contains("pool   ustack-p0-tso: 0 of 255 in use"),
        "{out}"
    );
    // The tap driver keeps its rx ring filled with mbufs, so in use is not
    // 0 at rest; after the port closes every one must be back.
    let (in_use, capacity, _) = pool_line(&out);
    assert!(in_use < capacity, "{out}");
    assert!(!err.contains("not returned"), "{err}");
}

/// Two stack processes joined by memif: uping, then a TCP transfer to the
/// discard service checked by CRC-32 on both ends.
#[test]
fn two_stacks_over_memif_ping_and_move_tcp_byte_exact() {
    need_root!();
    let topo = Topo::up("dm");
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("memif.sock");
    let memif = |role: &str| {
        format!(
            "{EAL} --vdev=net_memif0,role={role},socket={},socket-abstract=no",
            sock.display()
        )
    };
    let d = topo.daemon(&memif("server"), "10.77.1.2/24", &[]);
    let deadline = Instant::now() + Duration::from_secs(15);
    while !sock.exists() {
        assert!(Instant::now() < deadline, "memif server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let up = topo
        .bin(
            env!("CARGO_BIN_EXE_uping"),
            &[
                "--dpdk",
                &memif("client"),
                "--ip",
                "10.77.1.3/24",
                "-c",
                "5",
                "-i",
                "0.1",
                "-W",
                "3",
                "10.77.1.2",
            ],
        )
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&up.stdout);
    assert_eq!(
        up.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&up.stderr)
    );
    assert_eq!(count_before(&text, "received"), 5, "{text}");

    const BYTES: usize = 16 << 20;
    let send = topo
        .bin(
            env!("CARGO_BIN_EXE_ustack"),
            &[
                "send",
                "--dpdk",
                &memif("client"),
                "--ip",
                "10.77.1.3/24",
                "--to",
                "10.77.1.2:9",
                "--bytes",
                &BYTES.to_string(),
            ],
        )
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&send.stdout);
    let serr = String::from_utf8_lossy(&send.stderr);
    assert!(send.status.success(), "{text}{serr}");
    assert!(!serr.contains("not returned"), "{serr}");
    let mut want = vec![0u8; BYTES];
    fill_pattern(0, &mut want);
    let crc = format!("{:08x}", crc32fast::hash(&want));
    assert!(text.contains(&format!("crc32 {crc}")), "{text}");
    eprintln!("memif: {}", text.trim());

    let (code, out, err) = d.stop();
    assert_eq!(code, 0, "{out}{err}");
    no_crash(&err);
    assert!(out.contains("echo req in/out 5/0"), "{out}");
    assert!(
        out.contains(&format!("tcp discard: {BYTES} bytes, crc32 {crc}")),
        "{out}"
    );
    assert_mbufs_returned(&out, &err);
}

#[test]
fn bad_arguments_missing_port_and_tiny_pool() {
    need_root!();
    let topo = Topo::up("de");
    let run = |eal: &str| {
        topo.bin(
            env!("CARGO_BIN_EXE_ustack"),
            &["run", "--dpdk", eal, "--ip", "10.77.0.2/24"],
        )
        .output()
        .unwrap()
    };
    // Bad EAL arguments.
    let out = run("--no-huge --bogus-option");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    no_crash(&err);
    assert!(
        err.trim_end()
            .lines()
            .last()
            .unwrap()
            .starts_with("ustack: EAL initialisation failed: invalid arguments"),
        "{err}"
    );
    // No vdev, so no port 0.
    let out = run(EAL);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    no_crash(&err);
    assert!(
        err.trim_end()
            .lines()
            .last()
            .unwrap()
            .starts_with("ustack: no DPDK port 0: EAL found 0 port(s)"),
        "{err}"
    );
    // Not root: the tap device cannot be made, and the error names the
    // capabilities the process lacks.
    let eal = format!("{EAL} --vdev=net_tap0");
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &topo.ns("stack"),
            "setpriv",
            "--reuid",
            "65534",
        ])
        .args(["--regid", "65534", "--clear-groups", "--inh-caps=-all"])
        .args([env!("CARGO_BIN_EXE_ustack"), "run", "--dpdk", &eal])
        .args(["--ip", "10.77.0.2/24"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    no_crash(&err);
    let last = err.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("ustack: no DPDK port 0: EAL found 0 port(s)")
            && last.contains("this process lacks CAP_NET_ADMIN, CAP_NET_RAW, CAP_IPC_LOCK"),
        "{err}"
    );
    // A port number that does not exist.
    let out = topo
        .bin(
            env!("CARGO_BIN_EXE_ustack"),
            &[
                "run",
                "--dpdk",
                &topo.af_packet(),
                "--dpdk-port",
                "3",
                "--ip",
                "10.77.0.2/24",
            ],
        )
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("ustack: no DPDK port 3: EAL found 1 port(s)"),
        "{err}"
    );

    // A pool of 8 mbufs under a burst of pings and a TCP echo: drops are
    // counted, the stack keeps going, TCP recovers, every mbuf comes back.
    let d = topo.daemon(&topo.af_packet(), "10.77.0.2/24", &["--dpdk-mbufs", "8"]);
    topo.wait_arp();
    let ping = topo.linux(&[
        "ping",
        "-f",
        "-l",
        "100",
        "-c",
        "3000",
        "-s",
        "1200",
        "-W",
        "2",
        "10.77.0.2",
    ]);
    let ptext = String::from_utf8_lossy(&ping.stdout);
    let replies = count_before(&ptext, "received");
    assert!(replies > 0, "{ptext}");
    const BYTES: usize = 1 << 20;
    nc_echo(&topo, "linux", "10.77.0.2", BYTES);
    let (code, out, err) = d.stop();
    assert_eq!(code, 0, "{out}{err}");
    no_crash(&err);
    let (_, capacity, failures) = pool_line(&out);
    assert_eq!(capacity, 8, "{out}");
    // Every request the stack could not answer is an allocation failure.
    assert!(
        failures > 0,
        "no counted drop under a dry pool: {out}\n{ptext}"
    );
    let answered = 3000 - replies;
    assert!(failures >= answered.min(1), "{out}");
    assert_mbufs_returned(&out, &err);
}

/// iperf3 interop on DPDK af_packet: a stock `iperf3 -c` against `uperf -s`
/// both ways, and `uperf -c` against a stock `iperf3 -s`; the JSON parses
/// and the byte counts agree.
#[test]
fn iperf3_both_ways_on_af_packet() {
    need_root!();
    let topo = Topo::up("di");
    let eal = topo.af_packet();
    for reverse in [false, true] {
        let server = topo
            .bin(
                env!("CARGO_BIN_EXE_uperf"),
                &["--dpdk", &eal, "--ip", "10.77.0.2/24", "-s", "-1"],
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start uperf -s");
        let server = Daemon {
            child: Some(server),
        };
        topo.wait_arp();
        let mut args = vec!["iperf3", "-c", "10.77.0.2", "-J", "-t", "2"];
        if reverse {
            args.push("-R");
        }
        let client = topo.linux(&args);
        let json: serde_json::Value = serde_json::from_slice(&client.stdout).unwrap_or_else(|e| {
            panic!(
                "iperf3 JSON: {e}: {}",
                String::from_utf8_lossy(&client.stdout)
            )
        });
        assert!(client.status.success(), "iperf3 -R={reverse}: {json}");
        let sent = json["end"]["sum_sent"]["bytes"].as_u64().unwrap();
        let received = json["end"]["sum_received"]["bytes"].as_u64().unwrap();
        assert!(sent > 1 << 20, "{json}");
        assert!(received <= sent && received + (8 << 20) >= sent, "{json}");
        let (code, out, err) = server.stop();
        assert_eq!(code, 0, "{out}{err}");
        no_crash(&err);
        assert!(out.lines().any(|l| l.ends_with("receiver")), "{out}");
    }
    // Our client, their server.
    let server = topo.linux_iperf3_server();
    let client = topo
        .bin(
            env!("CARGO_BIN_EXE_uperf"),
            &[
                "--dpdk",
                &eal,
                "--ip",
                "10.77.0.2/24",
                "-c",
                "10.77.0.1",
                "-J",
                "-t",
                "2",
                "-P",
                "2",
            ],
        )
        .output()
        .unwrap();
    let ours = stdout_json("uperf", &client.stdout, &client.stderr);
    assert!(client.status.success(), "{ours}");
    // `iperf3 -s -1` exits by itself after the test.
    let (_, out, err) = server.wait();
    let theirs = stdout_json("iperf3 -s", out.as_bytes(), err.as_bytes());
    // The server's own count (iperf3 -s reports only what it measured).
    assert_eq!(
        ours["end"]["sum_received"]["bytes"], theirs["end"]["sum_received"]["bytes"],
        "{ours} vs {theirs}"
    );
    assert!(ours["end"]["sum_received"]["bytes"].as_u64().unwrap() > 1 << 20);
}

/// `ustack run --cores 0,1` on `net_af_packet` with two queue pairs (the
/// kernel fans frames out by its symmetric flow hash): many Linux
/// connections spread over both cores, every echo byte-exact, ping
/// answered, each core's counters nonzero and each core's mbufs returned.
#[test]
fn two_cores_on_af_packet_qpairs_share_the_connections() {
    need_root!();
    let topo = Topo::up("dq");
    let eal = format!("{},qpairs=2", topo.af_packet());
    let d = topo.daemon(&eal, "10.77.0.2/24", &["--cores", "0,1", "--backoff"]);
    topo.wait_arp();
    const CONNS: usize = 16;
    const BYTES: usize = 256 << 10;
    let files: Vec<_> = (0..CONNS)
        .map(|_| {
            let (input, _) = random_file(BYTES);
            let output = tempfile::NamedTempFile::new().unwrap().into_temp_path();
            (input, output)
        })
        .collect();
    let script: String = files
        .iter()
        .map(|(i, o)| {
            format!(
                "nc -N -w 30 10.77.0.2 7 < {} > {} & ",
                i.display(),
                o.display()
            )
        })
        .collect::<String>()
        + "wait";
    let nc = topo.linux(&["sh", "-c", &script]);
    let differ: Vec<(usize, u64)> = (files.iter().enumerate())
        .filter(|(_, (i, o))| sha256(i) != sha256(o))
        .map(|(n, (_, o))| (n, std::fs::metadata(o).map_or(0, |m| m.len())))
        .collect();
    let ping = topo.linux(&["ping", "-c", "5", "-i", "0.05", "10.77.0.2"]);
    let text = String::from_utf8_lossy(&ping.stdout);

    let (code, out, err) = d.stop();
    assert!(
        nc.status.success(),
        "{}",
        String::from_utf8_lossy(&nc.stderr)
    );
    assert_eq!(
        differ,
        vec![],
        "echoes (index, bytes back) differ: {out}{err}"
    );
    assert_eq!(count_before(&text, "received"), 5, "{text}");
    assert_eq!(code, 0, "{out}{err}");
    no_crash(&err);
    let total = CONNS * BYTES;
    assert!(
        out.contains(&format!("tcp services: {total} bytes in, {total} echoed")),
        "{out}"
    );
    // One counter block per core: both received frames and accepted
    // connections, and each returned its mbufs.
    let blocks: Vec<&str> = out.split("ustack 10.77.0.2/24 core ").skip(1).collect();
    assert_eq!(blocks.len(), 2, "{out}");
    let mut passive = 0;
    for b in &blocks {
        let rx: u64 = b
            .lines()
            .find(|l| l.trim_start().starts_with("port"))
            .and_then(|l| l.split_whitespace().nth(2))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(rx > 0, "a core received nothing: {b}");
        let tcp = b
            .lines()
            .find(|l| l.trim_start().starts_with("tcp"))
            .unwrap_or_else(|| panic!("{b}"));
        let p: u64 = tcp.split_whitespace().nth(4).unwrap().parse().unwrap();
        assert!(p > 0, "a core accepted no connection: {tcp}");
        passive += p;
        // No connection was reset by Linux. Resets out are allowed: DPDK's
        // af_packet fans out with PACKET_FANOUT_FLAG_ROLLOVER, so under
        // load some frames of a flow land on the other queue and reach
        // their shard through the mailbox late; a stale ACK that comes
        // after its connection closed gets the RST any closed port gives
        // (seen in 3 of 10 runs before this session's changes too).
        assert!(
            b.lines()
                .any(|l| l.trim_start().starts_with("tcp") && l.contains("/0  retransmits")),
            "{b}"
        );
        assert_mbufs_returned(b, &err);
    }
    assert_eq!(passive, CONNS as u64, "{out}");
}

/// `uping` and `uperf -c` with `--cores 0,1` on af_packet with two queue
/// pairs: the app runs on the first core, the second answers ARP and hands
/// over what is the app's (ICMP by steering, TCP by passing on); the Linux
/// peers answer every ping and count every byte uperf reports.
#[test]
fn ping_and_iperf_client_with_two_cores() {
    need_root!();
    let topo = Topo::up("dp");
    let eal = format!("{},qpairs=2", topo.af_packet());
    let net = [
        "--dpdk",
        &eal,
        "--ip",
        "10.77.0.2/24",
        "--cores",
        "0,1",
        "--backoff",
    ];
    let ping = topo
        .bin(env!("CARGO_BIN_EXE_uping"), &net)
        .args(["-c", "10", "-i", "0.05", "-W", "3", "10.77.0.1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&ping.stdout);
    let err = String::from_utf8_lossy(&ping.stderr);
    assert_eq!(ping.status.code(), Some(0), "{text}{err}");
    assert_eq!(count_before(&text, "received"), 10, "{text}");
    no_crash(&err);

    let server = topo.linux_iperf3_server();
    let client = topo
        .bin(env!("CARGO_BIN_EXE_uperf"), &net)
        .args(["-c", "10.77.0.1", "-J", "-t", "2", "-P", "4"])
        .output()
        .unwrap();
    let ours = stdout_json("uperf", &client.stdout, &client.stderr);
    assert!(client.status.success(), "{ours}");
    no_crash(&String::from_utf8_lossy(&client.stderr));
    let (_, out, err) = server.wait();
    let theirs = stdout_json("iperf3 -s", out.as_bytes(), err.as_bytes());
    let bytes = &theirs["end"]["sum_received"]["bytes"];
    assert!(bytes.as_u64().unwrap_or(0) > 0, "{theirs}");
    assert_eq!(
        ours["end"]["sum_received"]["bytes"], *bytes,
        "{ours} vs {theirs}"
    );
}
