//! IPv6 against the Linux kernel over the pcap backend, in namespaces the
//! test makes and removes itself: Linux resolves ustack's addresses by
//! neighbor discovery (the neighbor entry it learns carries ustack's MAC)
//! and `ping -6` gets every echo answered, to the configured address and
//! to the link-local one made from the MAC. Needs root; the all-features
//! build runs it.
#![cfg(feature = "pcap")]

#[macro_use]
mod common;
use common::*;

use std::time::{Duration, Instant};

/// The MAC `ustack run --ip 10.77.0.2/24` takes (02:75:73 and the
/// address's last three bytes) and the link-local address made from it.
const MAC: &str = "02:75:73:4d:00:02";
const LINK_LOCAL: &str = "fe80::75:73ff:fe4d:2";

#[test]
fn linux_resolves_and_pings_ustack_over_ipv6() {
    need_root!();
    let topo = Topo::up("v6");
    let lv = topo.linux_if();
    // The topology turns IPv6 off in both namespaces; the Linux side gets
    // it back with a static address (no DAD wait). The stack side keeps
    // it off, so its kernel never answers for ustack.
    for args in [
        vec!["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=0"],
        vec![
            "sysctl",
            "-qw",
            &format!("net.ipv6.conf.{lv}.disable_ipv6=0"),
        ],
        vec!["ip", "-6", "addr", "add", "fd77::1/64", "dev", &lv, "nodad"],
    ] {
        let o = topo.linux(&args);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let d = Daemon::spawn(&mut topo.bin(
        env!("CARGO_BIN_EXE_ustack"),
        &[
            "run",
            "--pcap",
            &topo.stack_if(),
            "--ip",
            "10.77.0.2/24",
            "--ip",
            "fd77::2/64",
        ],
    ));
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
