//! pcap mode on an interface left as the kernel sets it up: a veth pair
//! with checksum offload, TSO, GSO and GRO on at both ends (what a laptop's
//! NIC and a local peer look like), with `ustack run`.
//!
//! - As root: the stack turns its interface's GRO off for the run and puts
//!   it back (`ethtool -k` equal before and after); with
//!   `--accept-partial-checksum` Linux ping, a 64 MiB nc echo byte-exact
//!   and stock iperf3 both ways work, the peer's 64 KB TSO frames are cut
//!   back into segments (`rx_gro_frames`) and its partial checksums
//!   completed (`rx_partial_checksum`).
//! - Without CAP_NET_ADMIN (capsh drops it): one warning line names the
//!   `ethtool -K` command, GRO stays on, and the transfer still works.
//! - Without `--accept-partial-checksum`: one line says which frames are
//!   dropped and the two ways out.
//!
//! The goodput with offloads on against off is printed here and measured
//! by tools/bench; it is not asserted (the machines are shared).

#[macro_use]
mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Daemon, Topo, sha256, stdout_json};

/// The kernel's defaults on both veth ends, GRO on the stack's side too
/// (as a NIC's driver sets it).
fn offloads_on(topo: &Topo) {
    for (side, iface) in [("linux", topo.linux_if()), ("stack", topo.stack_if())] {
        let o = topo.in_ns(
            side,
            &[
                "ethtool", "-K", &iface, "tx", "on", "rx", "on", "tso", "on", "gso", "on", "gro",
                "on",
            ],
        );
        assert!(o.status.success(), "ethtool -K {iface}: {o:?}");
    }
}

/// `ethtool -k` of the stack's interface.
fn features(topo: &Topo) -> String {
    let o = topo.in_ns("stack", &["ethtool", "-k", &topo.stack_if()]);
    assert!(o.status.success());
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Whether GRO is on for the stack's interface.
fn gro_on(topo: &Topo) -> bool {
    features(topo)
        .lines()
        .any(|l| l.trim() == "generic-receive-offload: on")
}

/// `ustack run` on the stack side with `extra` flags, wrapped by `wrap`
/// (capsh), once it answers ARP.
fn start(topo: &Topo, wrap: Option<&str>, extra: &[&str]) -> Daemon {
    let exe = env!("CARGO_BIN_EXE_ustack");
    let iface = topo.stack_if();
    let mut args: Vec<String> = ["run", "--pcap", &iface, "--ip", "10.77.0.2/24"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &topo.ns("stack")]);
    match wrap {
        Some(drop_cap) => {
            let line = std::iter::once(exe.to_string())
                .chain(args)
                .collect::<Vec<_>>()
                .join(" ");
            c.args(["capsh", &format!("--drop={drop_cap}"), "--", "-c"])
                .arg(format!("exec {line}"));
        }
        None => {
            c.arg(exe).args(&args);
        }
    }
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ustack run");
    let d = Daemon::new(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !topo.arping_once() {
        assert!(Instant::now() < deadline, "ustack run did not come up");
    }
    d
}

/// `nc` echo of `bytes` random bytes through port 7: whether the bytes
/// came back exact.
fn echo_exact(topo: &Topo, bytes: usize) -> bool {
    let (file, _) = common::random_file(bytes);
    let want = sha256(&file);
    let o = topo.linux(&[
        "sh",
        "-c",
        &format!(
            "timeout 120 nc -N 10.77.0.2 7 < {} | sha256sum",
            file.display()
        ),
    ]);
    let ok = String::from_utf8_lossy(&o.stdout).starts_with(&want);
    if !ok {
        eprintln!(
            "echo of {bytes} bytes: want {want}, got {:?} {:?}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    ok
}

/// Stock iperf3 against the stack's port 5201 (`-R`: the stack sends):
/// bits per second the receiver counted.
fn iperf3(topo: &Topo, reverse: bool) -> f64 {
    let mut args = vec![
        "timeout",
        "30",
        "iperf3",
        "-c",
        "10.77.0.2",
        "-t",
        "2",
        "-J",
    ];
    if reverse {
        args.push("-R");
    }
    let o = topo.linux(&args);
    let v = stdout_json("iperf3", &o.stdout, &o.stderr);
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or_else(|| panic!("no receiver figure: {v}"))
}

/// Port counters from the stack's telemetry socket.
fn port(sock: &std::path::Path) -> serde_json::Value {
    common::telemetry(sock)["port"].clone()
}

#[test]
fn kernel_default_offloads_as_root() {
    need_root!();
    need_program!("ethtool", "ethtool");
    need_program!("iperf3", "iperf3");
    let topo = Topo::up("of");
    // With offloads off first: the reference goodput.
    let off = {
        let d = start(&topo, None, &[]);
        let f = (iperf3(&topo, false), iperf3(&topo, true));
        let (code, _, err) = d.stop();
        assert_eq!(code, 0, "{err}");
        f
    };
    offloads_on(&topo);
    assert!(gro_on(&topo));
    let before = features(&topo);
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("of.sock");
    let d = start(
        &topo,
        None,
        &[
            "--accept-partial-checksum",
            "--telemetry",
            &sock.display().to_string(),
        ],
    );
    assert!(!gro_on(&topo), "GRO still on while the stack runs");
    let ping = topo.linux(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.77.0.2"]);
    assert!(ping.status.success(), "ping: {ping:?}");
    assert!(echo_exact(&topo, 64 << 20), "64 MiB echo not byte-exact");
    let on = (iperf3(&topo, false), iperf3(&topo, true));
    let p = port(&sock);
    let (code, _, err) = d.stop();
    assert_eq!(code, 0, "{err}");
    // The Linux peer's TSO frames and partial checksums were seen, cut and
    // completed.
    assert!(p["rx_gro_frames"].as_u64().unwrap_or(0) > 0, "{p}");
    assert!(p["rx_partial_checksum"].as_u64().unwrap_or(0) > 0, "{p}");
    assert_eq!(p["rx_oversize"], 0, "{p}");
    assert_eq!(
        features(&topo),
        before,
        "the interface's settings were not restored"
    );
    eprintln!(
        "iperf3 to / from the stack, Gbit/s: offloads off {:.2} / {:.2}, on {:.2} / {:.2}",
        off.0 / 1e9,
        off.1 / 1e9,
        on.0 / 1e9,
        on.1 / 1e9
    );
    assert!(on.0 > 0.0 && on.1 > 0.0);
}

#[test]
fn without_cap_net_admin_one_line_names_the_fix() {
    need_root!();
    need_program!("ethtool", "ethtool");
    need_program!("capsh", "libcap2-bin");
    let topo = Topo::up("oc");
    offloads_on(&topo);
    let d = start(&topo, Some("cap_net_admin"), &["--accept-partial-checksum"]);
    assert!(gro_on(&topo), "GRO was turned off without CAP_NET_ADMIN");
    // Frames the kernel merged are cut back into segments.
    assert!(echo_exact(&topo, 8 << 20), "8 MiB echo not byte-exact");
    let (code, _, err) = d.stop();
    assert_eq!(code, 0, "{err}");
    let fix = format!("ethtool -K {} gro off", topo.stack_if());
    let lines: Vec<&str> = err.lines().filter(|l| l.contains(&fix)).collect();
    assert_eq!(lines.len(), 1, "the warning naming `{fix}`: {err}");
    assert!(lines[0].starts_with("ustack: "), "{}", lines[0]);
}

#[test]
fn partial_checksums_are_named_and_refused_by_default() {
    need_root!();
    need_program!("ethtool", "ethtool");
    let topo = Topo::up("op");
    offloads_on(&topo);
    let d = start(&topo, None, &[]);
    // The SYN carries a partial checksum: no connection, and the reason.
    let o = topo.linux(&["sh", "-c", "echo hi | timeout 3 nc -N 10.77.0.2 7 | wc -c"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "0");
    let (code, _, err) = d.stop();
    assert_eq!(code, 0, "{err}");
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("partial checksums"))
        .collect();
    assert_eq!(said.len(), 1, "one line, once: {err}");
    assert!(said[0].contains("--accept-partial-checksum") && said[0].contains("tx off"));
    // uperf -c to Linux's iperf3: the SYN-ACK comes with a partial checksum;
    // the client says so instead of "no answer".
    let server = topo.linux_iperf3_server();
    let o = topo.in_ns(
        "stack",
        &[
            env!("CARGO_BIN_EXE_uperf"),
            "--pcap",
            &topo.stack_if(),
            "--ip",
            "10.77.0.2/24",
            "-c",
            "10.77.0.1",
            "-t",
            "1",
            "--connect-timeout",
            "2000",
        ],
    );
    drop(server);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!o.status.success(), "{text}");
    assert!(
        text.contains("arrived with bad checksums") && text.contains("--accept-partial-checksum"),
        "{text}"
    );
}

/// A second stack, or a stack given the Linux host's address, finds the
/// address taken at start (RFC 5227 probe) and exits 2 with one line
/// naming it and the holder; the first stack runs on undisturbed.
#[test]
fn a_second_stack_on_a_taken_address_exits_2() {
    need_root!();
    let topo = Topo::up("oa");
    let first = topo.ustack_run(&[]);
    let exe = env!("CARGO_BIN_EXE_ustack");
    let run = |iface: &str, ip: &str| {
        let o = topo.in_ns(
            if iface == topo.stack_if() {
                "stack"
            } else {
                "linux"
            },
            // Bounded: a stack that missed the conflict would run on.
            &["timeout", "20", exe, "run", "--pcap", iface, "--ip", ip],
        );
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    // Another ustack, beside the Linux host, asking for the first's address.
    let (code, err) = run(&topo.linux_if(), "10.77.0.2/24");
    assert_eq!(code, Some(2), "{err}");
    let line = err.lines().last().unwrap_or_default();
    assert!(
        line.contains("10.77.0.2 is already in use") && line.contains("02-75-73"),
        "{err}"
    );
    // A stack asking for the Linux host's own address.
    let (code, err) = run(&topo.stack_if(), "10.77.0.1/24");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("10.77.0.1 is already in use"), "{err}");
    // The first stack still answers.
    let ping = topo.linux(&["ping", "-c", "2", "-i", "0.2", "-W", "2", "10.77.0.2"]);
    assert!(ping.status.success(), "{ping:?}");
    let (code, _, err) = first.stop();
    assert_eq!(code, 0, "{err}");
}

/// `ncat -l` under `ustack exec --pcap`, five starts in a row, each
/// serving its one connection: the port reads and sets the interface's
/// offloads without a child process. (It ran `ethtool -k`/`-K` as
/// children, and ncat's SIGCHLD handler reaps every child: about two
/// starts in three aborted.) GRO is on at each start, so each start
/// turns it off.
#[test]
fn ncat_listens_under_exec_every_time() {
    need_root!();
    need_program!("ncat", "ncat");
    need_program!("ethtool", "ethtool");
    let lab = common::lab::Lab::new("on", need_preload!());
    let topo = &lab.topo;
    for i in 0..5 {
        let o = topo.in_ns("stack", &["ethtool", "-K", &topo.stack_if(), "gro", "on"]);
        assert!(o.status.success(), "ethtool -K gro on: {o:?}");
        let server = lab.start_with(
            common::lab::Host::Stack,
            false,
            false,
            &["ncat", "-l", "10.77.0.2", "7777"],
        );
        let line = format!("hello {i}");
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let o = topo.linux(&[
                "sh",
                "-c",
                &format!("echo '{line}' | nc -N -w 2 10.77.0.2 7777"),
            ]);
            if o.status.success() {
                assert!(!gro_on(topo), "start {i}: GRO left on");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "start {i}: ncat -l never took a connection"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let end = server.wait();
        assert_eq!(end.code, 0, "start {i}: {}{}", end.out, end.err);
        assert_eq!(end.out.trim(), line, "start {i}: {}", end.err);
    }
}
