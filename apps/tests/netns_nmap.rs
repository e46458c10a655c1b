//! nmap (Debian's package, not ours) scanning `ustack run` on pcap from the
//! Linux namespace. FIN, NULL and Xmas scans send segments with neither SYN,
//! ACK nor RST: a listener drops them unanswered (RFC 9293 3.10.7.2), a
//! closed port answers RST. So nmap must report the served ports (echo 7,
//! discard 9, iperf3 5201) `open|filtered` and the others `closed`, the
//! stack must count the drops (`tcp_listen_no_ack`) and still answer ping.
//! Needs root and nmap.
#![cfg(feature = "pcap")]

#[macro_use]
mod common;
use common::*;

use std::collections::BTreeMap;

const OPEN: [u16; 3] = [7, 9, 5201];
const CLOSED: [u16; 3] = [1, 8, 10];

/// Port -> state from nmap's grepable output (`-oG -`): the `Ports:` field
/// lists `port/state/proto/owner/service/rpc/version/` entries.
fn grepable_ports(text: &str) -> BTreeMap<u16, String> {
    let mut ports = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("Host:")) {
        let Some((_, list)) = line.split_once("Ports: ") else {
            continue;
        };
        // Other fields follow after a tab ("Ignored State: ...").
        let list = list.split('\t').next().unwrap_or("");
        for entry in list.split(", ") {
            let mut f = entry.trim().split('/');
            if let (Some(port), Some(state)) = (f.next(), f.next()) {
                let port = port.parse().unwrap_or_else(|_| panic!("port in {line}"));
                ports.insert(port, state.to_string());
            }
        }
    }
    ports
}

#[test]
fn grepable_output_parses() {
    let text = "# Nmap 7.93 scan initiated\nHost: 10.77.0.2 ()\tStatus: Up\n\
                Host: 10.77.0.2 ()\tPorts: 1/closed/tcp//tcpmux///, 7/open|filtered/tcp//echo///\tIgnored State: closed (2)\n";
    let p = grepable_ports(text);
    assert_eq!(p.get(&1).map(String::as_str), Some("closed"));
    assert_eq!(p.get(&7).map(String::as_str), Some("open|filtered"));
    assert_eq!(p.len(), 2);
}

#[test]
fn fin_null_and_xmas_scans_see_open_ports_and_ping_still_works() {
    need_root!();
    need_program!("nmap", "nmap");
    let topo = Topo::up("nm");
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ustack.sock");
    let daemon = topo.ustack_run(&["--telemetry", &sock.display().to_string()]);
    let before = telemetry_drop(&telemetry(&sock), "tcp_listen_no_ack");

    let ports: Vec<String> = OPEN.iter().chain(&CLOSED).map(u16::to_string).collect();
    let ports = ports.join(",");
    for scan in ["-sF", "-sN", "-sX"] {
        // -Pn: no host discovery (the stack is there, ARP finds it); -n: no
        // DNS; the only address scanned is the stack's, inside the topology.
        let out = topo.linux(&[
            "nmap",
            scan,
            "-Pn",
            "-n",
            "-T4",
            "--max-retries",
            "2",
            "-p",
            &ports,
            "-e",
            &topo.linux_if(),
            "-oG",
            "-",
            "10.77.0.2",
        ]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "nmap {scan}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let states = grepable_ports(&text);
        for p in OPEN {
            assert_eq!(
                states.get(&p).map(String::as_str),
                Some("open|filtered"),
                "nmap {scan}: port {p} (served by ustack run) in\n{text}"
            );
        }
        for p in CLOSED {
            assert_eq!(
                states.get(&p).map(String::as_str),
                Some("closed"),
                "nmap {scan}: port {p} (nothing listens) in\n{text}"
            );
        }
    }

    // Each scan sent at least one probe to each of the three listeners.
    let after = telemetry_drop(&telemetry(&sock), "tcp_listen_no_ack");
    assert!(
        after >= before + 3 * OPEN.len() as u64,
        "tcp_listen_no_ack went from {before} to {after}"
    );

    let ping = topo.linux(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.77.0.2"]);
    let text = String::from_utf8_lossy(&ping.stdout);
    assert!(ping.status.success(), "ping after the scans: {text}");
    assert_eq!(count_before(&text, "received"), 3, "{text}");

    let (code, out, err) = daemon.stop();
    assert_eq!(code, 0, "{out}{err}");
    no_crash(&err);
}
