//! IPv6 against the Linux kernel over the pcap backend, in namespaces the
//! test makes and removes itself: Linux resolves ustack's addresses by
//! neighbor discovery (the neighbor entry it learns carries ustack's MAC)
//! and `ping -6` gets every echo answered, to the configured address and
//! to the link-local one made from the MAC; UDP over IPv6 both ways
//! (the echo service; datagrams and pings above the MTU in fragments both
//! ways) and ICMPv6 port unreachable as Linux reads it; TCP
//! over IPv6 (8 MiB echoed byte-exact, a closed port refused, stock
//! `iperf3 -6` both ways against the iperf3 server); MLDv2 reports that
//! a snooping bridge learns ustack's groups from; `uping` over IPv6.
//! Needs root; the all-features build runs it.
#![cfg(feature = "pcap")]

#[macro_use]
mod common;
use common::*;

use std::process::Command;
use std::time::{Duration, Instant};

/// The MAC `ustack run --ip 10.77.0.2/24` takes (02:75:73 and the
/// address's last three bytes) and the link-local address made from it.
const MAC: &str = "02:75:73:4d:00:02";
const LINK_LOCAL: &str = "fe80::75:73ff:fe4d:2";

/// Linux's side of the UDP check: 20 datagrams of 1,000 random bytes to
/// the echo port, each compared with its echo; then a connected socket to
/// a closed port.
const UDP6: &str = r#"
import os, socket
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s.settimeout(3)
ok = 0
for i in range(20):
    msg = os.urandom(1000)
    s.sendto(msg, ("fd77::2", 7))
    try:
        data, src = s.recvfrom(4096)
    except socket.timeout:
        continue
    if data == msg and src[0] == "fd77::2" and src[1] == 7:
        ok += 1
print("echoed", ok, "of 20")
# Above the MTU: Linux sends fragments, ustack joins them, and its echo
# leaves in fragments Linux joins.
big = 0
for n in (3000, 20000):
    msg = os.urandom(n)
    s.sendto(msg, ("fd77::2", 7))
    try:
        data, src = s.recvfrom(65536)
    except socket.timeout:
        continue
    if data == msg:
        big += 1
print("big", big, "of 2")
c = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
c.settimeout(3)
c.connect(("fd77::2", 9999))
c.send(b"anyone?")
try:
    c.recv(16)
    print("refused no")
except ConnectionRefusedError:
    print("refused yes")
except socket.timeout:
    print("refused timeout")
"#;

/// Linux's side of the TCP check: 8 MiB of random bytes through the echo
/// port (written and read at once), compared by SHA-256; then a connect
/// to a closed port.
const TCP6: &str = r#"
import hashlib, os, socket, threading
data = os.urandom(8 << 20)
s = socket.create_connection(("fd77::2", 7), timeout=20)
def writer():
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
t = threading.Thread(target=writer)
t.start()
got = bytearray()
while True:
    b = s.recv(1 << 16)
    if not b:
        break
    got += b
t.join()
same = hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
print("echo", "same" if same else "differs", len(got))
try:
    socket.create_connection(("fd77::2", 9999), timeout=5)
    print("closed accepted")
except ConnectionRefusedError:
    print("closed refused")
"#;

#[test]
fn linux_resolves_and_pings_ustack_over_ipv6() {
    need_root!();
    let topo = Topo::up("v6");
    let lv = topo.linux_if();
    topo.linux_ipv6("fd77::1/64");
    let d = dual_stack_run(&topo);
    // Ready when it answers: the first pings may be lost while it starts.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !topo
        .linux(&["ping", "-6", "-c", "1", "-W", "1", "fd77::2"])
        .status
        .success()
    {
        assert!(Instant::now() < deadline, "ustack never answered ping -6");
    }
    let ping = topo.linux(&["ping", "-6", "-c", "10", "-i", "0.05", "fd77::2"]);
    let text = String::from_utf8_lossy(&ping.stdout);
    assert!(ping.status.success(), "{text}");
    assert_eq!(count_before(&text, "received"), 10, "{text}");
    // Linux learnt ustack's MAC by neighbor discovery.
    let neigh = topo.linux(&["ip", "-6", "neigh", "show", "fd77::2", "dev", &lv]);
    let neigh = String::from_utf8_lossy(&neigh.stdout);
    assert!(neigh.contains(&format!("lladdr {MAC}")), "{neigh}");
    // The link-local address from the MAC answers too.
    let target = format!("{LINK_LOCAL}%{lv}");
    let ping = topo.linux(&["ping", "-6", "-c", "3", "-i", "0.05", &target]);
    let text = String::from_utf8_lossy(&ping.stdout);
    assert!(ping.status.success(), "{text}");
    assert_eq!(count_before(&text, "received"), 3, "{text}");
    // UDP over IPv6: the echo service on port 7 returns every datagram
    // to Linux's socket, from the address Linux sent to; a datagram to a
    // closed port is refused with ICMPv6 port unreachable, which Linux
    // reports on the connected socket as ECONNREFUSED.
    let udp = topo.linux(&[common::lab::PYTHON, "-c", UDP6]);
    let said = String::from_utf8_lossy(&udp.stdout);
    assert!(
        udp.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&udp.stderr)
    );
    assert!(said.contains("echoed 20 of 20"), "{said}");
    assert!(said.contains("big 2 of 2"), "{said}");
    // A ping above the MTU: the request joined, the reply in fragments.
    let ping = topo.linux(&[
        "ping", "-6", "-c", "3", "-i", "0.1", "-s", "4000", "fd77::2",
    ]);
    let text = String::from_utf8_lossy(&ping.stdout);
    assert!(ping.status.success(), "{text}");
    assert_eq!(count_before(&text, "received"), 3, "{text}");
    assert!(said.contains("refused yes"), "{said}");
    // TCP over IPv6: 8 MiB through the echo service on port 7, compared
    // by SHA-256; a closed port refuses the connection (a reset).
    let tcp = topo.linux(&[common::lab::PYTHON, "-c", TCP6]);
    let said = String::from_utf8_lossy(&tcp.stdout);
    assert!(
        tcp.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&tcp.stderr)
    );
    assert!(said.contains("echo same"), "{said}");
    assert!(said.contains("closed refused"), "{said}");
    // Stock iperf3 -6 against the iperf3 server, both directions.
    if common::have_program("iperf3") {
        for args in [&["-t", "1"][..], &["-t", "1", "-R"]] {
            let client = topo.linux(&[&["iperf3", "-6", "-c", "fd77::2", "-J"][..], args].concat());
            let json: serde_json::Value =
                serde_json::from_slice(&client.stdout).expect("iperf3 JSON");
            assert!(client.status.success(), "iperf3 -6 {args:?}: {json}");
            assert!(
                json["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0) > 1 << 20,
                "iperf3 -6 {args:?}: {json}"
            );
        }
    } else {
        ustack_test_skip::skip_test!("iperf3 is not installed (apt-get install iperf3)");
    }
    let (code, out, err) = d.stop();
    assert_eq!(code, 0, "{out}{err}");
    assert!(!err.contains("panicked"), "{err}");
    // The stack counted what Linux saw answered (and at least one
    // solicitation for each address).
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("ipv6"))
        .unwrap_or_else(|| panic!("no ipv6 line in {out}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    // The number `skip` words after `w`.
    let after = |w: &str, skip: usize| -> u64 {
        let i = words
            .iter()
            .position(|x| *x == w)
            .unwrap_or_else(|| panic!("{w} in {line}"));
        words[i + skip].parse().unwrap_or_else(|_| panic!("{line}"))
    };
    assert!(after("req", 2) >= 13, "echo requests: {line}");
    assert!(after("rep", 2) >= 13, "echo replies: {line}");
    assert!(after("sol", 2) >= 2, "solicitations: {line}");
}

/// Duplicate address detection at start: a stack given the Linux host's
/// IPv6 address finds it taken (Linux advertises it in answer to the
/// probe) and exits 2 with one line naming the address and the holder's
/// MAC, as for an IPv4 address.
#[test]
fn a_stack_given_a_taken_ipv6_address_exits_2() {
    need_root!();
    let topo = Topo::up("v6d");
    let lv = topo.linux_if();
    topo.linux_ipv6("fd77::1/64");
    // The Linux end's MAC, read in its namespace (sysfs there).
    let mac = topo.linux(&["cat", &format!("/sys/class/net/{lv}/address")]);
    let mac = String::from_utf8_lossy(&mac.stdout)
        .trim()
        .replace(':', "-");
    assert_eq!(mac.len(), 17, "{mac}");
    let o = topo.in_ns(
        "stack",
        &[
            "timeout",
            "20",
            env!("CARGO_BIN_EXE_ustack"),
            "run",
            "--pcap",
            &topo.stack_if(),
            "--ip",
            "10.77.0.2/24",
            "--ip",
            "fd77::1/64",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let line = err.lines().last().unwrap_or_default();
    assert!(
        line.contains("fd77::1 is already in use") && line.contains(&mac),
        "{err}"
    );
}

/// `ustack run` on the stack's end with 10.77.0.2/24 and fd77::2/64.
fn dual_stack_run(topo: &Topo) -> Daemon {
    ustack_run_with(topo, &["--ip", "fd77::2/64"])
}

/// `ustack run` on the stack's end with 10.77.0.2/24 and `more` flags.
fn ustack_run_with(topo: &Topo, more: &[&str]) -> Daemon {
    let iface = topo.stack_if();
    let mut args = vec!["run", "--pcap", &iface, "--ip", "10.77.0.2/24"];
    args.extend_from_slice(more);
    Daemon::spawn(&mut topo.bin(env!("CARGO_BIN_EXE_ustack"), &args))
}

/// The Linux host's end on a bridge `br0` with multicast snooping that
/// floods no unknown multicast toward ustack's port, speaking MLD
/// `version` as a querier (every 2 s, answers within 1 s) with its
/// counters on; fd77::1/64 on the bridge. What `run` printed is returned
/// by it.
fn snooping_bridge(topo: &Topo, version: &str) -> impl Fn(&[&str]) -> String {
    let run = |args: &[&str]| {
        let o = topo.linux(args);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let lv = topo.linux_if();
    run(&["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=0"]);
    run(&[
        "ip",
        "link",
        "add",
        "br0",
        "type",
        "bridge",
        "mcast_snooping",
        "1",
        "mcast_mld_version",
        version,
        "mcast_querier",
        "1",
        "mcast_stats_enabled",
        "1",
        "mcast_query_interval",
        "200",
        "mcast_query_response_interval",
        "100",
        "mcast_startup_query_interval",
        "100",
    ]);
    run(&["ip", "link", "set", &lv, "master", "br0"]);
    run(&["bridge", "link", "set", "dev", &lv, "mcast_flood", "off"]);
    run(&["sysctl", "-qw", "net.ipv6.conf.br0.disable_ipv6=0"]);
    run(&["ip", "link", "set", "br0", "up"]);
    run(&[
        "ip",
        "-6",
        "addr",
        "add",
        "fd77::1/64",
        "dev",
        "br0",
        "nodad",
    ]);
    run
}

/// The bridge's table once both of ustack's solicited-node groups (the
/// link-local and the configured address) are on ustack's port.
fn groups_learnt(topo: &Topo, run: &dyn Fn(&[&str]) -> String) -> String {
    let port = format!("port {} grp", topo.linux_if());
    let groups = ["ff02::1:ff4d:2", "ff02::1:ff00:2"];
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mdb = run(&["bridge", "mdb", "show"]);
        let learnt = groups
            .iter()
            .all(|g| mdb.lines().any(|l| l.contains(&port) && l.contains(g)));
        if learnt {
            return mdb;
        }
        assert!(Instant::now() < deadline, "groups never learnt:\n{mdb}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The MLD reports of `version` (`v1` or `v2`) the bridge counted
/// received on ustack's port (`ip link xstats`).
fn reports_received(topo: &Topo, run: &dyn Fn(&[&str]) -> String, version: &str) -> u64 {
    let xs = run(&[
        "ip",
        "link",
        "xstats",
        "type",
        "bridge_slave",
        "dev",
        &topo.linux_if(),
    ]);
    // "MLD reports:" then "RX: v1 N v2 M".
    let rx = xs
        .lines()
        .skip_while(|l| !l.contains("MLD reports:"))
        .nth(1)
        .unwrap_or_else(|| panic!("no MLD report counters:\n{xs}"));
    let words: Vec<&str> = rx.split_whitespace().collect();
    let at = words
        .iter()
        .position(|w| *w == version)
        .unwrap_or_else(|| panic!("{rx}"));
    words[at + 1].parse().unwrap_or_else(|_| panic!("{rx}"))
}

/// MLDv2 as a snooping switch reads it: the Linux host's end sits on a
/// bridge with multicast snooping, and its port toward ustack floods no
/// unknown multicast. The bridge learns both of ustack's solicited-node
/// groups from its reports (the link-local and the configured address),
/// and Linux resolves and pings ustack across it.
#[test]
fn a_snooping_bridge_learns_our_groups_from_mld_reports() {
    need_root!();
    let topo = Topo::up("v6m");
    let run = snooping_bridge(&topo, "2");
    let d = dual_stack_run(&topo);
    let mdb = groups_learnt(&topo, &run);
    assert!(
        !mdb.contains("grp ff02::1 "),
        "all-nodes is never reported: {mdb}"
    );
    assert!(reports_received(&topo, &run, "v2") > 0);
    // Linux resolves and pings ustack across the bridge.
    let ping = topo.linux(&["ping", "-6", "-c", "3", "-i", "0.2", "-W", "2", "fd77::2"]);
    let text = String::from_utf8_lossy(&ping.stdout);
    assert!(ping.status.success(), "{text}\n{mdb}");
    let (code, out, err) = d.stop();
    assert_eq!(code, 0, "{out}{err}");
}

/// A switch that speaks only MLDv1 (RFC 2710; a Linux bridge with
/// `mcast_mld_version 1` querying every 2 s): its queries are answered
/// with version 1 reports (RFC 3810 §8.2.1), which the bridge counts on
/// ustack's port, and it keeps both groups there; Linux pings across it.
#[test]
fn an_mldv1_snooping_bridge_gets_version_1_reports() {
    need_root!();
    let topo = Topo::up("v6q");
    let run = snooping_bridge(&topo, "1");
    let d = dual_stack_run(&topo);
    groups_learnt(&topo, &run);
    let deadline = Instant::now() + Duration::from_secs(15);
    while reports_received(&topo, &run, "v1") < 2 {
        assert!(
            Instant::now() < deadline,
            "no MLDv1 reports from ustack in answer to the bridge's queries"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let ping = topo.linux(&["ping", "-6", "-c", "3", "-i", "0.2", "-W", "2", "fd77::2"]);
    assert!(
        ping.status.success(),
        "{}",
        String::from_utf8_lossy(&ping.stdout)
    );
    let (code, out, err) = d.stop();
    assert_eq!(code, 0, "{out}{err}");
}

/// `--slaac` alone (no IPv6 `--ip`): radvd on Linux advertises
/// fd88::/64, and `ustack run` takes an address from it (the prefix and
/// its MAC's interface identifier); Linux pings that address and the
/// link-local one, and the echo service returns 1 MiB over TCP to the
/// new address byte-exact.
#[test]
fn slaac_alone_takes_an_address_from_radvd() {
    need_root!();
    need_program!("radvd", "radvd");
    let topo = Topo::up("v6s");
    topo.linux_ipv6("fd88::1/64");
    let lv = topo.linux_if();
    let fwd = topo.linux(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
    assert!(fwd.status.success());
    let conf = std::env::temp_dir().join(format!("ustack-v6s-{}-radvd.conf", std::process::id()));
    std::fs::write(
        &conf,
        format!(
            "interface {lv} {{\n  AdvSendAdvert on;\n  MinRtrAdvInterval 3;\n  MaxRtrAdvInterval 4;\n  \
             prefix fd88::/64 {{ AdvOnLink on; AdvAutonomous on; }};\n}};\n"
        ),
    )
    .unwrap();
    let pid = conf.with_extension("pid");
    let radvd = Daemon::spawn(
        Command::new("ip")
            .args(["netns", "exec", &topo.ns("linux")])
            .args(["radvd", "-n", "-m", "stderr", "-C"])
            .arg(&conf)
            .arg("-p")
            .arg(&pid),
    );
    let d = ustack_run_with(&topo, &["--slaac"]);
    let slaac = "fd88::75:73ff:fe4d:2";
    let deadline = Instant::now() + Duration::from_secs(20);
    while !topo
        .linux(&["ping", "-6", "-c", "1", "-W", "1", slaac])
        .status
        .success()
    {
        assert!(Instant::now() < deadline, "{slaac} never answered ping -6");
    }
    let ll = format!("{LINK_LOCAL}%{lv}");
    let ping = topo.linux(&["ping", "-6", "-c", "2", "-i", "0.2", "-W", "2", &ll]);
    assert!(
        ping.status.success(),
        "{}",
        String::from_utf8_lossy(&ping.stdout)
    );
    let echo = TCP6.replace("fd77::2", slaac).replace("8 << 20", "1 << 20");
    let tcp = topo.linux(&[common::lab::PYTHON, "-c", &echo]);
    let out = String::from_utf8_lossy(&tcp.stdout);
    assert!(
        out.contains("echo same 1048576"),
        "{out}{}",
        String::from_utf8_lossy(&tcp.stderr)
    );
    let (code, out, err) = d.stop();
    let _ = radvd.stop();
    let _ = std::fs::remove_file(&conf);
    let _ = std::fs::remove_file(&pid);
    assert_eq!(code, 0, "{out}{err}");
}

/// `uping` over IPv6 against the Linux kernel: ICMPv6 echo requests from
/// ustack answered, 4,000-byte ones too (fragmented both ways), with
/// iputils' lines; `-6` with an IPv4 HOST is refused in one line.
#[test]
fn uping_pings_linux_over_ipv6() {
    need_root!();
    let topo = Topo::up("v6p");
    topo.linux_ipv6("fd77::1/64");
    let uping = |args: &[&str]| {
        let base = [
            "--pcap",
            &topo.stack_if(),
            "--ip",
            "10.77.0.2/24",
            "--ip",
            "fd77::2/64",
        ];
        let all: Vec<&str> = base.iter().copied().chain(args.iter().copied()).collect();
        let mut cmd = topo.bin(env!("CARGO_BIN_EXE_uping"), &all);
        cmd.output().expect("run uping")
    };
    for (size, bytes) in [("56", "64 bytes"), ("4000", "4008 bytes")] {
        let o = uping(&["-c", "3", "-i", "0.2", "-W", "3", "-s", size, "fd77::1"]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(out.contains("3 packets transmitted, 3 received"), "{out}");
        assert_eq!(
            out.matches(&format!("{bytes} from fd77::1: icmp_seq="))
                .count(),
            3,
            "{out}"
        );
    }
    let o = uping(&["-6", "-c", "1", "10.77.0.1"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("not an IPv6 address"), "{err}");
}

/// `uperf -c` to a Linux `iperf3 -s` over IPv6, both directions: the
/// client's JSON counts the bytes, and so does Linux's server.
#[test]
fn uperf_client_to_linux_iperf3_over_ipv6() {
    need_root!();
    need_program!("iperf3", "iperf3");
    let topo = Topo::up("v6u");
    topo.linux_ipv6("fd77::1/64");
    let server = Daemon::spawn(
        Command::new("ip")
            .args(["netns", "exec", &topo.ns("linux")])
            .args(["iperf3", "-s", "-B", "fd77::1"]),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !topo
        .linux(&["ss", "-Hltn", "sport = :5201"])
        .stdout
        .windows(4)
        .any(|w| w == b"5201")
    {
        assert!(Instant::now() < deadline, "iperf3 -s never listened");
        std::thread::sleep(Duration::from_millis(100));
    }
    for reverse in [false, true] {
        let iface = topo.stack_if();
        let mut args = vec![
            "--pcap",
            &iface,
            "--ip",
            "10.77.0.2/24",
            "--ip",
            "fd77::2/64",
            "-c",
            "fd77::1",
            "-t",
            "1",
            "-J",
        ];
        if reverse {
            args.push("-R");
        }
        let o = topo
            .bin(env!("CARGO_BIN_EXE_uperf"), &args)
            .output()
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| {
            panic!(
                "uperf -R={reverse}: {}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        });
        assert!(o.status.success(), "uperf -R={reverse}: {json}");
        assert_eq!(json["start"]["connecting_to"]["host"], "fd77::1", "{json}");
        let got = json["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
        assert!(got > 1 << 20, "uperf -R={reverse}: {json}");
    }
    let (_, out, err) = server.stop();
    assert!(!err.contains("error"), "{out}{err}");
}
