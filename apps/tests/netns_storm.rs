//! A storm of crafted and random frames (scapy, from the Linux namespace)
//! at `ustack run` on pcap while a Linux `nc` transfer runs through its TCP
//! echo: bad checksums at every layer, overlapping and endless fragments,
//! TCP option garbage, every flag combination, zero and huge windows, RST
//! and SYN with wrong sequence numbers on the live connection's 4-tuple,
//! ARP claiming the stack's address, ARP spoofing the live peer's MAC, RoCE
//! with a bad ICRC, random bytes. The daemon must not panic, the transfer
//! must come back byte-exact, ping must still be answered, and the drop
//! counters printed at stop must name the attacks. Needs root and scapy.
#![cfg(feature = "pcap")]

#[macro_use]
mod common;
use common::*;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const STORM: &str = r#"
import random, sys, time
from scapy.all import (ARP, Ether, ICMP, IP, TCP, UDP, Raw, conf, get_if_hwaddr,
                       sendp, sniff)
conf.verb = 0
iface, linux_ip, stack_ip, stack_mac, rounds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
me = get_if_hwaddr(iface)
rnd = random.Random(7)
E = Ether(src=me, dst=stack_mac)

# The live connection's 4-tuple and sequence numbers, from one of its segments.
live = sniff(iface=iface, count=1, timeout=20,
             lfilter=lambda p: TCP in p and p[TCP].dport == 7 and p[IP].src == linux_ip and len(p[TCP].payload) > 0)
if not live:
    print("no live segment seen", file=sys.stderr)
    sys.exit(3)
t = live[0][TCP]
sport, seq, ack = t.sport, t.seq, t.ack
print("live tuple %s:%d seq %d ack %d" % (linux_ip, sport, seq, ack))

def burst():
    f = []
    ip = IP(src=linux_ip, dst=stack_ip)
    # Bad checksums at every layer.
    f.append(E / IP(src=linux_ip, dst=stack_ip, chksum=0x1234) / ICMP() / Raw(b"x" * 8))
    f.append(E / ip / ICMP(chksum=0x1234) / Raw(b"x" * 8))
    f.append(E / ip / UDP(sport=1, dport=9, chksum=0x1234) / Raw(b"x" * 8))
    f.append(E / ip / TCP(sport=sport, dport=7, seq=seq, ack=ack, flags="A", chksum=0x1234) / Raw(b"y" * 20))
    # Overlapping fragments, and first fragments that never complete.
    ident = rnd.randrange(65536)
    f.append(E / IP(src=linux_ip, dst=stack_ip, id=ident, flags="MF", frag=0, proto=17) / Raw(b"a" * 32))
    f.append(E / IP(src=linux_ip, dst=stack_ip, id=ident, flags="MF", frag=2, proto=17) / Raw(b"b" * 32))
    for _ in range(4):
        f.append(E / IP(src=linux_ip, dst=stack_ip, id=rnd.randrange(65536), flags="MF",
                        frag=rnd.randrange(8000), proto=17) / Raw(b"c" * 1024))
    # TCP option garbage (on a closed port and on the echo port).
    for dport in (9999, 7):
        opts = bytes(rnd.randrange(256) for _ in range(rnd.choice((4, 8, 20, 40))))
        g = TCP(sport=rnd.randrange(1024, 65536), dport=dport, flags="S", seq=rnd.randrange(2**32))
        g.dataofs = 5 + len(opts) // 4
        f.append(E / ip / (g / Raw(opts)))
    # Every flag combination, zero and huge windows, on a closed port.
    for flags in range(256):
        f.append(E / ip / TCP(sport=40000 + flags, dport=9999, flags=flags,
                              seq=rnd.randrange(2**32), ack=rnd.randrange(2**32),
                              window=rnd.choice((0, 1, 65535))))
    # Injection on the live 4-tuple, never at the exact next sequence number:
    # a RST far out of the window, a RST inside it but not exact (challenge
    # ACK), a SYN (challenge ACK), old data with a zero and a huge window.
    for off in (-(2**31), 30003):
        f.append(E / ip / TCP(sport=sport, dport=7, flags="R", seq=(seq + off) % 2**32))
    f.append(E / ip / TCP(sport=sport, dport=7, flags="S", seq=rnd.randrange(2**32)))
    for w in (0, 65535):
        f.append(E / ip / TCP(sport=sport, dport=7, flags="A", seq=(seq - 100000) % 2**32,
                              ack=ack, window=w) / Raw(b"z" * 10))
    # ARP: someone claims the stack's address; and spoofing the live Linux
    # peer's MAC, by an unsolicited reply and by a request to the stack
    # (a fresh entry keeps its MAC: refused and counted).
    f.append(Ether(src="02:66:66:66:66:66", dst="ff:ff:ff:ff:ff:ff") /
             ARP(op=1, hwsrc="02:66:66:66:66:66", psrc=stack_ip, pdst=stack_ip))
    f.append(E / ARP(op=2, hwsrc="02:66:66:66:66:67", psrc=linux_ip,
                     hwdst=stack_mac, pdst=stack_ip))
    f.append(Ether(src="02:66:66:66:66:67", dst="ff:ff:ff:ff:ff:ff") /
             ARP(op=1, hwsrc="02:66:66:66:66:67", psrc=linux_ip, pdst=stack_ip))
    # RoCEv2 UD SEND to QPN 2 with a wrong ICRC.
    bth = bytes([0x64, 0, 0xff, 0xff, 0, 0, 0, 2, 0, 0, 0, 1])
    deth = bytes([0x11, 0x11, 0x11, 0x11, 0, 0, 0, 0x11])
    f.append(E / IP(src=linux_ip, dst=stack_ip, flags="DF") / UDP(sport=49152, dport=4791, chksum=0) /
             Raw(bth + deth + b"ping" + b"\xde\xad\xbe\xef"))
    # Random bytes to the stack's MAC.
    for _ in range(16):
        f.append(Raw(bytes(Ether(src=me, dst=stack_mac, type=rnd.choice((0x0800, 0x0806, 0x1234)))) +
                     bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 200)))))
    return f

sent = 0
for _ in range(rounds):
    b = burst()
    sendp(b, iface=iface)
    sent += len(b)
    time.sleep(0.05)
print("storm sent %d frames" % sent)
"#;

/// The `name=count` pairs of the `drops` line of `ustack run`'s report.
fn drops(report: &str) -> Vec<(String, u64)> {
    report
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("drops"))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    Some((k.to_string(), v.parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The system Python (scapy comes from Debian's python3-scapy).
fn python() -> &'static str {
    if std::path::Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

fn have_scapy() -> bool {
    Command::new(python())
        .args(["-c", "import scapy.all"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn storm_during_a_transfer_is_counted_and_survived() {
    need_root!();
    if !have_scapy() {
        ustack_test_skip::skip_test!("python3 has no scapy (apt-get install python3-scapy)");
    }
    let topo = Topo::up("st");
    let child = topo
        .bin(
            env!("CARGO_BIN_EXE_ustack"),
            &["run", "--pcap", &topo.stack_if(), "--ip", "10.77.0.2/24"],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ustack run");
    let daemon = Daemon::new(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !topo.arping_once() {
        assert!(Instant::now() < deadline, "ustack run did not come up");
    }
    // The stack's MAC, as the Linux host resolved it (ping fills the table).
    let ping = topo.linux(&["ping", "-c", "1", "-W", "2", "10.77.0.2"]);
    assert!(ping.status.success(), "ping before the storm");
    let neigh = topo.linux(&["ip", "-j", "neigh", "show", "10.77.0.2"]);
    let j: serde_json::Value = serde_json::from_slice(&neigh.stdout).expect("ip -j neigh");
    let stack_mac = j[0]["lladdr"].as_str().expect("stack MAC").to_string();

    // The transfer: 16 MiB through the echo service, in the background,
    // written 1 MiB every 0.5 s so it lasts as long as the storm.
    const BYTES: usize = 16 << 20;
    let (input, _) = random_file(BYTES);
    let output = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    let nc = Command::new("ip")
        .args(["netns", "exec", &topo.ns("linux"), "sh", "-c"])
        .arg(format!(
            "for i in $(seq 0 15); do dd if={} bs=1M skip=$i count=1 status=none; sleep 0.5; done \
             | nc -N -w 60 10.77.0.2 7 > {}",
            input.display(),
            output.display()
        ))
        .spawn()
        .expect("start nc");
    let nc = Daemon::new(nc);

    let mut script = tempfile::Builder::new().suffix(".py").tempfile().unwrap();
    script.write_all(STORM.as_bytes()).unwrap();
    let storm = topo.linux(&[
        python(),
        &script.path().display().to_string(),
        &topo.linux_if(),
        "10.77.0.1",
        "10.77.0.2",
        &stack_mac,
        "20",
    ]);
    let storm_out = String::from_utf8_lossy(&storm.stdout).into_owned();
    assert!(
        storm.status.success(),
        "storm: {storm_out}{}",
        String::from_utf8_lossy(&storm.stderr)
    );

    let (code, _, nc_err) = nc.wait();
    assert_eq!(code, 0, "nc: {nc_err}");
    assert_eq!(std::fs::metadata(&output).unwrap().len(), BYTES as u64);
    assert_eq!(
        sha256(&output),
        sha256(&input),
        "echo differs from what was sent"
    );

    let ping = topo.linux(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.77.0.2"]);
    let ping_text = String::from_utf8_lossy(&ping.stdout);
    assert!(ping.status.success(), "ping after the storm: {ping_text}");

    let (code, out, err) = daemon.stop();
    assert_eq!(code, 0, "{out}{err}");
    assert!(!err.contains("panicked"), "{err}");
    let d = drops(&out);
    eprintln!("{storm_out}drops after the storm: {d:?}");
    for reason in [
        "ipv4_bad_checksum",
        "icmp_bad_checksum",
        "udp_bad_checksum",
        "tcp_bad_checksum",
        "frag_overlap",
        "tcp_no_socket",
        "arp_conflict",
        "arp_spoof_refused",
        "ud_bad_icrc",
        "eth_unknown_type",
    ] {
        assert!(
            d.iter().any(|(k, v)| k == reason && *v > 0),
            "no {reason} drops counted: {out}"
        );
    }
    assert!(
        out.contains(&format!("tcp services: {BYTES} bytes in, {BYTES} echoed")),
        "{out}"
    );
}
