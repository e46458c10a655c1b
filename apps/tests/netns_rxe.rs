//! ustack's RoCEv2 UD against an independent implementation: Linux soft-RoCE
//! (`rdma_rxe`) in a QEMU guest under software emulation, booted from
//! Debian's kernel package with rdma-core's userspace and perftest
//! (`tools/rxe-guest.sh`), joined to a namespace of ours by a tap. ustack
//! runs on the tap over pcap. Stock tools on the guest's side:
//! `ibv_ud_pingpong` both roles, perftest `ib_send_lat`/`ib_send_bw -c UD`
//! both roles, and `uping --rdma --verbs` on `rxe0`. Counters are reconciled
//! on both sides (rxe's hw_counters and qkey_viol_cntr, ustack's telemetry),
//! and the ICRC of every RoCE frame in both captures is recomputed by
//! `tools/roce-icrc.py` (zlib's CRC-32). The same over IPv6 GIDs: UD pings,
//! `ibv_ud_pingpong -g`, `ibv_rc_pingpong -g` and perftest's `ib_write_bw`
//! and `ib_send_lat -c RC -x` (rxe's IPv6 GID) in both roles.
//!
//! One test, one guest boot (the boot is most of its time). Skipped with
//! the reason where the machine cannot run it (not root, no QEMU, no
//! rdma-core tools, no kernel package to fetch): a failure under `CI=true`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Daemon, TelemetryTail, telemetry_drop};

const HOST_IP: &str = "10.77.0.2";
const GUEST_IP: &str = "10.77.0.3";
const HOST_IP6: &str = "fd77::2";
const GUEST_IP6: &str = "fd77::3";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Why this machine cannot run the test, if it cannot.
fn missing() -> Option<String> {
    if !common::root() {
        return Some("not root (network namespaces and a tap need it)".into());
    }
    if !cfg!(feature = "pcap") || !cfg!(feature = "verbs") {
        return Some("built without the pcap and verbs features".into());
    }
    for p in [
        "qemu-system-x86_64",
        "busybox",
        "ibv_ud_pingpong",
        "ib_send_lat",
        "ib_send_bw",
        "rdma",
        "apt-get",
    ] {
        if !common::have_program(p) {
            return Some(format!(
                "{p} is missing (tools/test.sh installs qemu-system-x86, busybox-static, ibverbs-utils, perftest)"
            ));
        }
    }
    if !Path::new("/usr/bin/python3").exists() {
        return Some("/usr/bin/python3 is missing".into());
    }
    None
}

/// The namespace with the tap; deleted on drop (with whatever is in it).
struct Ns {
    name: String,
    tap: String,
}

impl Ns {
    fn up() -> Ns {
        let id = std::process::id() % 100_000;
        let ns = Ns {
            name: format!("rxe{id}"),
            tap: format!("rxt{id}"),
        };
        let run = |args: &[&str]| {
            let o = Command::new("ip").args(args).output().expect("ip");
            assert!(
                o.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        };
        run(&["netns", "add", &ns.name]);
        run(&["-n", &ns.name, "link", "set", "lo", "up"]);
        run(&[
            "-n", &ns.name, "tuntap", "add", "dev", &ns.tap, "mode", "tap",
        ]);
        // The guest is slow to read: a deep queue keeps bursts from ustack.
        run(&[
            "-n",
            &ns.name,
            "link",
            "set",
            &ns.tap,
            "up",
            "txqueuelen",
            "10000",
        ]);
        let _ = ns
            .exec(&[
                "ethtool", "-K", &ns.tap, "tx", "off", "rx", "off", "gso", "off", "tso", "off",
                "gro", "off",
            ])
            .output();
        ns
    }

    fn exec(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).args(args);
        c
    }

    /// A ustack program on the tap: `BIN --pcap TAP --ip HOST_IP/24 ARGS`
    /// (`ustack run` takes `run` first: pass it in `pre`).
    fn ustack(&self, bin: &str, pre: &[&str], args: &[&str]) -> Command {
        let mut c = self.exec(&[bin]);
        c.args(pre)
            .args(["--pcap", &self.tap, "--ip", &format!("{HOST_IP}/24")])
            .args(args);
        c
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// The QEMU guest and its command channel; killed on drop.
struct Guest {
    qemu: Option<Child>,
    ctl: BufReader<UnixStream>,
    log: PathBuf,
}

impl Guest {
    fn boot(ns: &Ns, dir: &Path) -> Guest {
        let ctl = dir.join(format!("ctl-{}", std::process::id()));
        let log = dir.join(format!("console-{}.log", std::process::id()));
        let _ = std::fs::remove_file(&ctl);
        let script = repo().join("tools/rxe-guest.sh");
        let qemu = ns
            .exec(&[
                script.to_str().unwrap(),
                "boot",
                dir.to_str().unwrap(),
                &ns.tap,
                ctl.to_str().unwrap(),
                log.to_str().unwrap(),
                &format!("{GUEST_IP}/24"),
                "52:54:00:77:00:03",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start qemu");
        let mut qemu = Some(qemu);
        let start = Instant::now();
        let stream = loop {
            if let Ok(s) = UnixStream::connect(&ctl) {
                break s;
            }
            if let Some(Some(st)) = qemu.as_mut().map(|q| q.try_wait().ok().flatten()) {
                let out = qemu.take().unwrap().wait_with_output().unwrap();
                panic!(
                    "qemu exited ({st}): {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            assert!(start.elapsed() < Duration::from_secs(30), "no qemu socket");
            std::thread::sleep(Duration::from_millis(50));
        };
        stream
            .set_read_timeout(Some(Duration::from_secs(180)))
            .unwrap();
        let mut g = Guest {
            qemu,
            ctl: BufReader::new(stream),
            log,
        };
        let mut line = String::new();
        loop {
            line.clear();
            match g.ctl.read_line(&mut line) {
                Ok(n) if n > 0 && line.trim_end() == "@@ready" => break,
                Ok(n) if n > 0 => {}
                _ => panic!("the guest did not come up:\n{}", g.console()),
            }
        }
        eprintln!("guest up in {:.1} s", start.elapsed().as_secs_f64());
        g
    }

    fn console(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Runs `cmd` in the guest's shell: (exit status, output).
    ///
    /// Each command goes as one `@@cmd ` line, its stdin /dev/null (so no
    /// command or its background children can read the channel). A line
    /// that arrives without its start (seen twice under load: a command
    /// line's first bytes lost, cause not found) is answered `@@garbled`
    /// and sent again.
    fn sh(&mut self, cmd: &str) -> (i32, String) {
        let mut out = String::new();
        let mut line = String::new();
        let mut sends = 0;
        'send: loop {
            sends += 1;
            assert!(sends <= 3, "guest shell garbled {cmd:?} three times\n{out}");
            let s = self.ctl.get_mut();
            s.write_all(format!("@@cmd {cmd}\n").as_bytes()).unwrap();
            loop {
                line.clear();
                let n = self
                    .ctl
                    .read_line(&mut line)
                    .unwrap_or_else(|e| panic!("guest shell, running {cmd:?}: {e}\n{out}"));
                assert!(
                    n > 0,
                    "guest shell closed running {cmd:?}\n{}",
                    self.console()
                );
                if line.trim_end() == "@@garbled" {
                    eprintln!("guest shell: {cmd:?} arrived damaged; sent again");
                    continue 'send;
                }
                if let Some(rc) = line.trim_end().strip_prefix("@@rc=") {
                    return (rc.parse().unwrap_or(-1), out);
                }
                out.push_str(&line);
            }
        }
    }

    /// Runs `cmd`, asserting it succeeds; its output.
    fn ok(&mut self, cmd: &str) -> String {
        let (rc, out) = self.sh(cmd);
        assert_eq!(rc, 0, "guest: {cmd}\n{out}");
        out
    }

    /// rxe's counters: (sent_pkts, rcvd_pkts, qkey_viol_cntr).
    fn counters(&mut self) -> (u64, u64, u64) {
        let out = self.ok(
            "cd /sys/class/infiniband/rxe0/ports/1/hw_counters && echo $(cat sent_pkts) $(cat rcvd_pkts) $(ibv_devinfo -v | sed -n 's/.*qkey_viol_cntr:[[:space:]]*//p')",
        );
        let f: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(f.len(), 3, "rxe counters: {out}");
        let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
        (f[0].parse().unwrap(), f[1].parse().unwrap(), hex(f[2]))
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if let Some(mut q) = self.qemu.take() {
            let _ = q.kill();
            let _ = q.wait();
        }
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The number before `word` in `text` (`100 received` -> 100).
fn count(text: &str, word: &str) -> u64 {
    common::count_before(text, word)
}

/// `tools/roce-icrc.py` over the captures: per sender, frames with a valid
/// ICRC; asserts none is invalid.
fn icrc_check(captures: &[&Path]) -> String {
    let o = Command::new("/usr/bin/python3")
        .arg(repo().join("tools/roce-icrc.py"))
        .args(captures)
        .output()
        .expect("run roce-icrc.py");
    let t = text(&o);
    assert!(o.status.success(), "ICRC check failed:\n{t}");
    t
}

/// The independent ICRC check itself can fail: a real RNIC's frames pass,
/// the same frames with one payload byte flipped do not.
#[test]
fn icrc_check_rejects_a_flipped_byte() {
    let good = repo().join("testdata/rnic_roce_ud_send.pcap");
    let t = icrc_check(&[&good]);
    assert!(t.contains("10.200.200.3: 60 valid ICRC, 0 invalid"), "{t}");
    let mut bytes = std::fs::read(&good).unwrap();
    // The first record's frame starts after the 24-byte file and 16-byte
    // record headers; flip its last payload byte before the ICRC.
    let caplen = u32::from_le_bytes(bytes[32..36].try_into().unwrap()) as usize;
    bytes[24 + 16 + caplen - 5] ^= 0x01;
    let bad = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(bad.path(), &bytes).unwrap();
    let o = Command::new("/usr/bin/python3")
        .arg(repo().join("tools/roce-icrc.py"))
        .arg(bad.path())
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("1 invalid"), "{}", text(&o));
}

#[test]
fn rxe_interop() {
    if let Some(why) = missing() {
        ustack_test_skip::skip_test!("{why}");
    }
    let started = Instant::now();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rxe-guest");
    std::fs::create_dir_all(&dir).unwrap();
    let uping = env!("CARGO_BIN_EXE_uping");
    let uperf = env!("CARGO_BIN_EXE_uperf");
    let ustack = env!("CARGO_BIN_EXE_ustack");
    let build = Command::new(repo().join("tools/rxe-guest.sh"))
        .args(["build", dir.to_str().unwrap(), uping])
        .output()
        .expect("run rxe-guest.sh build");
    if !build.status.success() {
        let t = text(&build);
        // Only a kernel package that cannot be fetched is a machine's limit.
        assert!(t.contains("apt-get download"), "guest build failed:\n{t}");
        ustack_test_skip::skip_test!("the guest's kernel cannot be fetched: {t}");
    }
    eprintln!("{}", text(&build).trim());
    let ns = Ns::up();
    let mut g = Guest::boot(&ns, &dir);
    let out = g.ok("ibv_devinfo -d rxe0 | grep -E 'state|active_mtu'; cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/1");
    assert!(
        out.contains("PORT_ACTIVE") && out.contains("1024") && out.contains("RoCE v2"),
        "{out}"
    );

    // ---- rxe -> ustack: `ustack run` answers; the guest pings and echoes.
    let tele = dir.join(format!("run-{}.sock", std::process::id()));
    let cap_run = dir.join(format!("run-{}.pcap", std::process::id()));
    let tail = TelemetryTail::attach(&tele);
    let run = Daemon::spawn(&mut ns.ustack(
        ustack,
        &["run"],
        &[
            "--telemetry",
            tele.to_str().unwrap(),
            "--capture",
            cap_run.to_str().unwrap(),
        ],
    ));
    // The guest's kernel resolves us by ARP before any verbs traffic.
    let (rc, out) = g.sh(&format!("ping -c 3 -W 5 {HOST_IP}"));
    assert_eq!(rc, 0, "the guest cannot reach ustack run: {out}");
    let (sent0, rcvd0, viol0) = g.counters();
    let out = g.ok(&format!(
        "uping --rdma --verbs -c 100 -i 0.01 -s 1024 -q {HOST_IP}"
    ));
    eprintln!("guest uping --rdma --verbs:\n{out}");
    assert!(
        out.contains("100 packets transmitted, 100 received"),
        "{out}"
    );
    assert!(out.contains("rtt clock = poll loop"), "{out}");
    let rtt_p50: f64 = out
        .split("rtt p50/p99/max = ")
        .nth(1)
        .and_then(|s| s.split('/').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no p50 in {out}"));
    assert!(rtt_p50 > 0.0, "RTT starts at the post time, never 0: {out}");
    let out = g.ok(&format!("ibv_ud_pingpong -g 1 -n 100 {HOST_IP}"));
    eprintln!("guest ibv_ud_pingpong (client):\n{out}");
    assert!(out.contains("100 iters in"), "{out}");
    // Bad Q_Key, unknown QPN: no answer, counted by ustack.
    let (rc, out) = g.sh(&format!(
        "uping --rdma --verbs --qkey 0x22222222 -c 5 -i 0.05 -W 1 -q {HOST_IP}"
    ));
    assert!(
        rc != 0 && out.contains("5 packets transmitted, 0 received"),
        "{out}"
    );
    let (rc, out) = g.sh(&format!(
        "uping --rdma --verbs --qpn 0x999 -c 5 -i 0.05 -W 1 -q {HOST_IP}"
    ));
    assert!(
        rc != 0 && out.contains("5 packets transmitted, 0 received"),
        "{out}"
    );
    // A perftest client at the ibv_ud_pingpong port is told apart and
    // refused at once, not left waiting.
    let (rc, out) = g.sh(&format!(
        "timeout 20 ib_send_lat -c UD -x 1 -F -n 5 {HOST_IP}"
    ));
    assert!(rc != 0 && rc != 124, "rc {rc}: {out}");
    let (sent1, rcvd1, viol1) = g.counters();
    // rxe sent 100 pings + 100 pingpong messages + 10 refused; got 200 back.
    assert_eq!(sent1 - sent0, 210, "rxe sent_pkts");
    assert_eq!(rcvd1 - rcvd0, 200, "rxe rcvd_pkts");
    assert_eq!(viol1, viol0, "nothing ustack sent had a wrong Q_Key");
    let (code, stdout, stderr) = run.stop();
    assert_eq!(code, 0, "{stdout}{stderr}");
    eprintln!(
        "{}",
        stdout
            .lines()
            .filter(|l| l.contains("rdma ud"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(stdout.contains("100 pings answered"), "{stdout}");
    assert!(stdout.contains("100 echoed"), "{stdout}");
    assert!(
        stdout.contains("that is perftest's exchange: serve it with `uperf -s --rdma --perftest`"),
        "{stdout}"
    );
    let (_, snap) = tail.last(Duration::from_secs(20));
    assert_eq!(telemetry_drop(&snap, "ud_bad_qkey"), 5, "{snap}");
    assert_eq!(telemetry_drop(&snap, "ud_unknown_qpn"), 5, "{snap}");
    let ud = &snap["stack"]["ud"];
    assert_eq!(ud["rx_packets"].as_u64(), Some(200), "{ud}");
    assert_eq!(ud["tx_packets"].as_u64(), Some(200), "{ud}");

    // ---- ustack -> rxe: the stock ibv_ud_pingpong server answers uping.
    g.ok("(ibv_ud_pingpong -g 1 -n 101 > /tmp/pp.out 2>&1; echo exit=$? >> /tmp/pp.out) &");
    let cap_ping = dir.join(format!("ping-{}.pcap", std::process::id()));
    let (sent0, rcvd0, viol0) = g.counters();
    let o = wait_for_server(|| {
        ns.ustack(
            uping,
            &[],
            &[
                "--capture",
                cap_ping.to_str().unwrap(),
                "--rdma",
                "--pingpong",
                "-c",
                "100",
                "-q",
                GUEST_IP,
            ],
        )
        .output()
        .unwrap()
    });
    let t = text(&o);
    eprintln!("uping --rdma --pingpong:\n{t}");
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("100 messages transmitted, 100 received, 0 lost"),
        "{t}"
    );
    let qpn = t
        .split("remote address: LID 0x0000, QPN ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or_else(|| panic!("no server QPN in {t}"))
        .to_string();
    // The server (one message short of its -n) drops a wrong Q_Key and
    // an unknown QPN, and counts the first.
    for (q, k) in [(qpn.as_str(), "0x22222222"), ("0x999", "0x11111111")] {
        let o = ns
            .ustack(
                uping,
                &[],
                &[
                    "--rdma", "--qpn", q, "--qkey", k, "-c", "5", "-i", "0.05", "-W", "1", "-q",
                    GUEST_IP,
                ],
            )
            .output()
            .unwrap();
        assert!(
            text(&o).contains("5 packets transmitted, 0 received"),
            "{}",
            text(&o)
        );
    }
    let (_, rcvd_mid, viol_mid) = g.counters();
    assert_eq!(rcvd_mid - rcvd0, 100, "rxe took none of the bad messages");
    assert_eq!(viol_mid - viol0, 5, "rxe counted the wrong Q_Keys");
    // One good message of the full path MTU ends the server's run.
    let o = ns
        .ustack(
            uping,
            &[],
            &[
                "--rdma", "--qpn", &qpn, "-c", "1", "-s", "1024", "-W", "1", "-q", GUEST_IP,
            ],
        )
        .output()
        .unwrap();
    assert!(text(&o).contains("1 packets transmitted"), "{}", text(&o));
    let out = wait_guest_file(&mut g, "/tmp/pp.out", "exit=");
    eprintln!("guest ibv_ud_pingpong (server):\n{out}");
    assert!(
        out.contains("101 iters in") && out.contains("exit=0"),
        "{out}"
    );
    let (sent2, _, viol2) = g.counters();
    assert_eq!(sent2 - sent0, 101, "rxe echoed every message it took");
    assert_eq!(viol2 - viol0, 5);
    // Larger than the IB path MTU: refused before anything is sent.
    let o = ns
        .ustack(uping, &[], &["--rdma", "-c", "1", "-s", "1025", GUEST_IP])
        .output()
        .unwrap();
    assert!(
        !o.status.success() && text(&o).contains("1024"),
        "{}",
        text(&o)
    );

    perftest_checks(&ns, &mut g, uperf);
    perftest_rc_checks(&ns, &mut g, uperf);
    rc_pingpong_checks(&ns, &mut g, uping, &dir);
    let (cap6_run, cap6_ping) = ipv6_checks(&ns, &mut g, (ustack, uping, uperf), &dir);

    // ---- Every RoCE frame of both senders carries a valid ICRC.
    let t = icrc_check(&[&cap_run, &cap_ping, &cap6_run, &cap6_ping]);
    eprintln!("ICRC:\n{t}");
    // IPv6: 150 each way (50 UD pings, 50 ibv_ud_pingpong messages each
    // way with ustack run, 50 with the stock server).
    for (sender, least) in [
        (HOST_IP, 200),
        (GUEST_IP, 200),
        (HOST_IP6, 150),
        (GUEST_IP6, 150),
    ] {
        let valid = t
            .lines()
            .find(|l| l.starts_with(&format!("{sender}:")))
            .map(|l| count(l, "valid"))
            .unwrap_or(0);
        assert!(valid >= least, "{sender}: {t}");
    }
    eprintln!(
        "rxe interop: {:.0} s in all",
        started.elapsed().as_secs_f64()
    );
}

/// RoCEv2 over IPv6 GIDs against rxe, both roles. rxe -> ustack: the
/// guest's `uping --rdma --verbs` to our IPv6 address (the verbs transport
/// picks rxe's IPv6 RoCE v2 GID) and stock `ibv_ud_pingpong -g` with that
/// GID's index against `ustack run`, which answers with its own IPv6 GID.
/// ustack -> rxe: `uping --rdma --pingpong -6` against the stock server.
/// Then RC: `ibv_rc_pingpong -g` and perftest's `ib_write_bw` and
/// `ib_send_lat` with `-x` that index, both roles (ours `--ipv6` as the
/// client). rxe's counters on both sides of each run; the captures' ICRCs
/// are checked by the caller.
fn ipv6_checks(
    ns: &Ns,
    g: &mut Guest,
    (ustack, uping, uperf): (&str, &str, &str),
    dir: &Path,
) -> (PathBuf, PathBuf) {
    // busybox's ip has no nodad: DAD off for the interface instead.
    g.ok("echo 0 > /proc/sys/net/ipv6/conf/eth0/accept_dad");
    g.ok(&format!("ip -6 addr add {GUEST_IP6}/64 dev eth0"));
    // rxe adds a GID for the address: its index, once listed as RoCE v2.
    let full = GUEST_IP6
        .parse::<std::net::Ipv6Addr>()
        .unwrap()
        .segments()
        .map(|x| format!("{x:04x}"))
        .join(":");
    let find = format!(
        "cd /sys/class/infiniband/rxe0/ports/1 && for i in $(ls gids); do \
         [ \"$(cat gids/$i)\" = {full} ] && [ \"$(cat gid_attrs/types/$i 2>/dev/null)\" = 'RoCE v2' ] && echo $i; done; true"
    );
    let start = Instant::now();
    let idx = loop {
        let out = g.ok(&find);
        if let Some(i) = out.split_whitespace().next() {
            break i.to_string();
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "rxe lists no RoCE v2 GID for {GUEST_IP6}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("rxe's IPv6 RoCE v2 GID: index {idx}");
    let ip6 = format!("{HOST_IP6}/64");

    // ---- rxe -> ustack over IPv6.
    let cap_run = dir.join(format!("run6-{}.pcap", std::process::id()));
    let run = Daemon::spawn(&mut ns.ustack(
        ustack,
        &["run"],
        &["--ip", &ip6, "--capture", cap_run.to_str().unwrap()],
    ));
    let (rc, out) = g.sh(&format!("ping -6 -c 3 -W 5 {HOST_IP6}"));
    assert_eq!(rc, 0, "the guest cannot reach ustack run over IPv6: {out}");
    let (sent0, rcvd0, _) = g.counters();
    let out = g.ok(&format!(
        "uping --rdma --verbs -c 50 -i 0.01 -s 1024 -q {HOST_IP6}"
    ));
    eprintln!("guest uping --rdma --verbs over IPv6:\n{out}");
    assert!(out.contains("50 packets transmitted, 50 received"), "{out}");
    assert!(out.contains(HOST_IP6), "{out}");
    let out = g.ok(&format!("ibv_ud_pingpong -g {idx} -n 50 {HOST_IP}"));
    eprintln!("guest ibv_ud_pingpong -g {idx} (client):\n{out}");
    assert!(out.contains("50 iters in"), "{out}");
    assert!(out.contains(&format!("GID {HOST_IP6}")), "{out}");
    let (sent1, rcvd1, _) = g.counters();
    assert_eq!(sent1 - sent0, 100, "rxe sent_pkts over IPv6");
    assert_eq!(rcvd1 - rcvd0, 100, "rxe rcvd_pkts over IPv6");
    let (code, stdout, stderr) = run.stop();
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("50 pings answered"), "{stdout}");
    assert!(stdout.contains("50 echoed"), "{stdout}");
    assert!(stdout.contains(&format!("peer {GUEST_IP6}")), "{stdout}");

    // ---- ustack -> rxe over IPv6: the stock server answers.
    g.ok(&format!(
        "(ibv_ud_pingpong -g {idx} -n 50 > /tmp/pp6.out 2>&1; echo exit=$? >> /tmp/pp6.out) &"
    ));
    let cap_ping = dir.join(format!("ping6-{}.pcap", std::process::id()));
    let (sent0, rcvd0, _) = g.counters();
    let o = wait_for_server(|| {
        ns.ustack(
            uping,
            &[],
            &[
                "--ip",
                &ip6,
                "--capture",
                cap_ping.to_str().unwrap(),
                "--rdma",
                "--pingpong",
                "-6",
                "-c",
                "50",
                "-q",
                GUEST_IP,
            ],
        )
        .output()
        .unwrap()
    });
    let t = text(&o);
    eprintln!("uping --rdma --pingpong -6:\n{t}");
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("50 messages transmitted, 50 received, 0 lost"),
        "{t}"
    );
    assert!(t.contains(&format!("GID {GUEST_IP6}")), "{t}");
    let out = wait_guest_file(g, "/tmp/pp6.out", "exit=");
    eprintln!("guest ibv_ud_pingpong -g {idx} (server):\n{out}");
    assert!(
        out.contains("50 iters in") && out.contains("exit=0"),
        "{out}"
    );
    let (sent1, rcvd1, _) = g.counters();
    assert_eq!((sent1 - sent0, rcvd1 - rcvd0), (50, 50));
    rc_pingpong_ipv6(ns, g, uping, dir, &idx);
    // perftest's RC programs with rxe's IPv6 GID (-x), both roles.
    for (program, size) in [
        (("ib_write_bw", "write", false), 4096),
        (("ib_send_lat", "send", true), 2),
    ] {
        perftest_rc_case(ns, g, uperf, program, size, Some(&idx));
    }
    (cap_run, cap_ping)
}

/// RC over IPv6 GIDs: stock `ibv_rc_pingpong -g` with rxe's IPv6 GID
/// against `uping --rdma=rc --pingpong` in both roles (ours the client
/// with `-6`; ours the server, answering in the client's family), 200
/// iterations of 4096 bytes (four packets at path MTU 1024): both ends
/// finish, our QP never retransmitted, timed out or NAKed, rxe's error
/// counters did not move, and its packet counters match the RoCE frames of
/// our capture, every one with a valid ICRC.
fn rc_pingpong_ipv6(ns: &Ns, g: &mut Guest, uping: &str, dir: &Path, idx: &str) {
    const N: u64 = 200;
    let ip6 = format!("{HOST_IP6}/64");
    for ours_listens in [false, true] {
        let before = rxe_hw_counters(g);
        let role = if ours_listens { "server" } else { "client" };
        let cap = dir.join(format!("rcpp6-{role}-{}.pcap", std::process::id()));
        let mut args = vec![
            "--ip".to_string(),
            ip6.clone(),
            "--capture".into(),
            cap.display().to_string(),
            "--rdma=rc".into(),
            "--pingpong".into(),
            "-c".into(),
            N.to_string(),
        ];
        let (stock, ours) = if ours_listens {
            args.push("--listen".into());
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            let server = Daemon::spawn(&mut ns.ustack(uping, &[], &a));
            let (stock, code, out, err) = stock_client_vs_server(
                g,
                &format!("timeout 120 ibv_rc_pingpong -g {idx} -n {N} {HOST_IP}"),
                server,
                "ibv_rc_pingpong -g (IPv6) client",
            );
            assert_eq!(code, 0, "{out}{err}");
            (stock, out)
        } else {
            g.ok(&format!(
                "(timeout 120 ibv_rc_pingpong -g {idx} -n {N} > /tmp/rcpp6.out 2>&1; echo exit=$? >> /tmp/rcpp6.out) &"
            ));
            args.extend(["-6".into(), GUEST_IP.into()]);
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            let o = wait_for_server(|| ns.ustack(uping, &[], &a).output().unwrap());
            assert!(o.status.success(), "{}", text(&o));
            (wait_guest_file(g, "/tmp/rcpp6.out", "exit="), text(&o))
        };
        let what = format!("RC pingpong over IPv6, ours the {role}");
        eprintln!("{what}:\n{ours}\nibv_rc_pingpong:\n{stock}");
        for out in [&stock, &ours] {
            assert!(out.contains(&format!("{N} iters in")), "{what}: {out}");
        }
        assert!(stock.contains("exit=0"), "{stock}");
        assert!(stock.contains(&format!("GID {HOST_IP6}")), "{stock}");
        assert!(ours.contains(&format!("GID {GUEST_IP6}")), "{ours}");
        for (w, v) in rc_counts(
            &ours,
            &[
                "retransmits",
                "ack-timeouts",
                "seq-naks-sent",
                "seq-naks-received",
                "rnr-naks-received",
            ],
        ) {
            assert_eq!(v, 0, "{what}: {w}: {ours}");
        }
        assert_eq!(rc_counts(&ours, &["packets"])[0].1, N * 4, "{ours}");
        let moved = rxe_moved(&before, &rxe_hw_counters(g));
        for k in RXE_RC_ERRORS {
            assert_eq!(moved.get(k), None, "{what}: rxe {k} moved: {moved:?}");
        }
        let t = icrc_check(&[&cap]);
        let valid = |ip: &str| {
            t.lines()
                .find(|l| l.starts_with(&format!("{ip}:")))
                .map_or(0, |l| count(l, "valid"))
        };
        assert!(
            !t.contains(" 1 invalid") && t.contains(", 0 invalid"),
            "{t}"
        );
        assert_eq!(
            moved.get("rcvd_pkts").copied(),
            Some(valid(HOST_IP6)),
            "{what}: {t}"
        );
        assert_eq!(
            moved.get("sent_pkts").copied(),
            Some(valid(GUEST_IP6)),
            "{what}: {t}"
        );
    }
}

/// Retries `run` while the guest's server is not listening yet (under
/// emulation it takes a moment to start).
fn wait_for_server(mut run: impl FnMut() -> Output) -> Output {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let o = run();
        let t = text(&o);
        if o.status.success() || Instant::now() >= deadline || !t.contains("TCP connection") {
            return o;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The guest file once it holds `marker` (a background command's end).
fn wait_guest_file(g: &mut Guest, path: &str, marker: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, out) = g.sh(&format!("cat {path}"));
        if out.contains(marker) || Instant::now() >= deadline {
            return out;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A perftest row (`#bytes #iterations figures...`) for `bytes` in `t`:
/// its figures (`n/a` as None).
fn perftest_row(t: &str, bytes: u64, iters: u64) -> Option<Vec<Option<f64>>> {
    t.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 5 && f[0] == bytes.to_string() && f[1] == iters.to_string())
            .then(|| f[2..].iter().map(|v| v.parse().ok()).collect())
    })
}

/// perftest `ib_send_lat -c UD` and `ib_send_bw -c UD` against `uperf
/// --rdma --perftest`, both roles, 200 messages each; both sides' counts
/// and rxe's packet counters agree.
fn perftest_checks(ns: &Ns, g: &mut Guest, uperf: &str) {
    const N: u64 = 200;
    let n = N.to_string();
    for (tool, latency) in [("ib_send_bw", false), ("ib_send_lat", true)] {
        let mode: &[&str] = if latency { &["--latency"] } else { &[] };
        let size = if latency { 2 } else { 1024 };

        // uperf is the client of the stock server.
        let (sent0, rcvd0, _) = g.counters();
        g.ok(&format!(
            "({tool} -c UD -x 1 -F -n {N} > /tmp/pt.out 2>&1; echo exit=$? >> /tmp/pt.out) &"
        ));
        let o = wait_for_server(|| {
            ns.ustack(
                uperf,
                &[],
                &["-c", GUEST_IP, "--rdma", "--perftest", "-n", &n],
            )
            .args(mode)
            .output()
            .unwrap()
        });
        let t = text(&o);
        eprintln!("uperf --perftest client vs {tool}:\n{t}");
        assert!(o.status.success(), "{t}");
        let stock = wait_guest_file(g, "/tmp/pt.out", "exit=");
        eprintln!("{tool} server:\n{stock}");
        assert!(stock.contains("exit=0"), "{stock}");
        let ours = perftest_row(&t, size, N).unwrap_or_else(|| panic!("no row: {t}"));
        let theirs = perftest_row(&stock, size, N).unwrap_or_else(|| panic!("no row: {stock}"));
        let (sent1, rcvd1, _) = g.counters();
        if latency {
            assert!(t.contains(&format!("{N}/{N} replies received")), "{t}");
            // t_typical, in microseconds, measured by both ends.
            assert!(ours[2].is_some_and(|v| v > 0.0) && theirs[2].is_some_and(|v| v > 0.0));
            assert_eq!((sent1 - sent0, rcvd1 - rcvd0), (N, N), "rxe counters");
        } else {
            assert!(
                t.contains(&format!("{N} messages sent, {N} send completions")),
                "{t}"
            );
            // The stock server's average bandwidth: it received all of them.
            assert!(theirs[1].is_some_and(|v| v > 0.0), "{stock}");
            assert_eq!(rcvd1 - rcvd0, N, "rxe rcvd_pkts");
        }

        // uperf is the server of the stock client.
        let (sent0, rcvd0, _) = g.counters();
        let server = Daemon::spawn(
            ns.ustack(uperf, &[], &["-s", "--rdma", "--perftest", "-1", "-n", &n])
                .args(mode),
        );
        let what = format!("{tool} client vs uperf --perftest server");
        let (stock, code, out, err) = stock_client_vs_server(
            g,
            &format!("timeout 60 {tool} -c UD -x 1 -F -n {N} {HOST_IP}"),
            server,
            &what,
        );
        eprintln!("{what}:\n{stock}");
        eprintln!("{out}{err}");
        assert_eq!(code, 0, "{out}{err}");
        assert!(perftest_row(&stock, size, N).is_some(), "{stock}");
        assert!(perftest_row(&out, size, N).is_some(), "{out}");
        assert!(out.contains(&format!("{N}/{N} messages received")), "{out}");
        let (sent1, rcvd1, _) = g.counters();
        assert_eq!(sent1 - sent0, N, "rxe sent_pkts");
        assert_eq!(rcvd1 - rcvd0, if latency { N } else { 0 }, "rxe rcvd_pkts");
    }
}

/// Runs the stock client `cmd` in the guest against the ustack `server`,
/// again while it cannot connect yet (the server still opening), for up to
/// 30 s; then gives the server 60 s to exit by itself. Returns the client's output with `exit=RC` appended and the
/// server's exit code, stdout and stderr; a server that does not exit
/// fails the test with both sides' output and rxe's counters.
fn stock_client_vs_server(
    g: &mut Guest,
    cmd: &str,
    server: Daemon,
    what: &str,
) -> (String, i32, String, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let stock = loop {
        let (rc, out) = g.sh(cmd);
        let retry = out.contains("Couldn't connect");
        if rc == 0 || Instant::now() >= deadline || !retry {
            break format!("{out}exit={rc}\n");
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    match server.wait_at_most(Duration::from_secs(60)) {
        Ok((code, out, err)) => (stock, code, out, err),
        Err((code, out, err)) => {
            let counters = g.sh("cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep -H . *");
            panic!(
                "{what}: the server did not exit within 60 s of the client's end.\n\
                 client:\n{stock}\nserver (stopped, exit {code}):\n{out}{err}\nrxe counters:\n{}",
                counters.1
            );
        }
    }
}

/// rxe's counters that move only when its peer misbehaves or the path
/// fails (our duplicates or gaps, our NAKs, retries exhausted), as named
/// in its hw_counters. `completer_retry_err` (rxe retried on its own
/// timer) is checked apart: see [`rxe_spurious_retries`].
const RXE_RC_ERRORS: [&str; 8] = [
    "duplicate_request",
    "out_of_seq_request",
    "rcvd_rnr_err",
    "send_rnr_err",
    "rcvd_seq_err",
    "retry_exceeded_err",
    "retry_rnr_exceeded_err",
    "send_err",
];

/// rxe's QP timeout as ibv_rc_pingpong sets it (14: 4.096 us x 2^14).
const RXE_ACK_TIMEOUT_MS: f64 = 67.1;

/// Request packets rxe sent again in a capture: (PSN, ms since the PSN
/// was first sent). rxe arms its retransmit timer only when it is not
/// already pending (rxe_req.c) and pushes it back only from the completer
/// (rxe_comp.c), so under emulation a timer armed for an earlier,
/// acknowledged message can fire while a later one is half sent: rxe then
/// resends packets that were sent less than its ACK timeout ago, which no
/// missing ACK can explain.
fn rxe_spurious_retries(cap: &Path) -> Vec<(u32, f64)> {
    let guest: std::net::Ipv4Addr = GUEST_IP.parse().unwrap();
    let mut first = std::collections::HashMap::new();
    let mut again = Vec::new();
    for (t, frame) in common::pcap_records(cap) {
        let Some((src, opcode, psn)) = common::roce_bth(&frame) else {
            continue;
        };
        // Requests only: RC ACKs (0x11) repeat the PSN they acknowledge.
        if src != guest || opcode == 0x11 {
            continue;
        }
        match first.get(&psn) {
            Some(&t0) => again.push((psn, (t - t0) * 1e3)),
            None => {
                first.insert(psn, t);
            }
        }
    }
    again
}

/// All of rxe's hw_counters: name -> value.
fn rxe_hw_counters(g: &mut Guest) -> std::collections::BTreeMap<String, u64> {
    let out = g.ok("cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep -H . *");
    let all: std::collections::BTreeMap<String, u64> = out
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
        .collect();
    assert!(
        [
            "sent_pkts",
            "rcvd_pkts",
            "retry_exceeded_err",
            "rcvd_seq_err"
        ]
        .iter()
        .all(|k| all.contains_key(*k)),
        "rxe hw_counters: {out}"
    );
    all
}

/// What moved between two reads of rxe's counters.
fn rxe_moved(
    a: &std::collections::BTreeMap<String, u64>,
    b: &std::collections::BTreeMap<String, u64>,
) -> std::collections::BTreeMap<String, u64> {
    b.iter()
        .filter_map(|(k, v)| {
            let d = v - a.get(k).copied().unwrap_or(0);
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// The `rc qp ...` counters line of a uping RC run: the named counts.
fn rc_counts(out: &str, words: &[&str]) -> Vec<(String, u64)> {
    let line = out
        .lines()
        .find(|l| l.starts_with("rc qp 0x"))
        .unwrap_or_else(|| panic!("no counters line in {out}"));
    words
        .iter()
        .map(|w| (w.to_string(), count(line, w)))
        .collect()
}

/// The figure before `unit` on the tool's line ending in it.
fn pingpong_figure(out: &str, unit: &str) -> f64 {
    out.lines()
        .find(|l| l.trim_end().ends_with(unit))
        .and_then(|l| l.split_whitespace().rev().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {unit} in {out}"))
}

/// RoCE frames with a valid ICRC per sender in one capture (all valid).
fn roce_frames(cap: &Path) -> (u64, u64) {
    let t = icrc_check(&[cap]);
    let of = |ip: &str| {
        t.lines()
            .find(|l| l.starts_with(&format!("{ip}:")))
            .map_or(0, |l| count(l, "valid"))
    };
    (of(HOST_IP), of(GUEST_IP))
}

/// One RC round's checks: our side finished clean (no retransmission,
/// timeout or NAK of ours), rxe's retry/sequence counters did not move,
/// and rxe's packet counters match the RoCE frames of our capture both
/// ways (every frame it sent, we saw; every frame we sent, it took).
fn rc_round_checks(
    what: &str,
    ours: &str,
    cap: &Path,
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) {
    let moved = rxe_moved(before, after);
    let (from_us, from_rxe) = roce_frames(cap);
    let dups = rc_counts(ours, &["duplicates"])[0].1;
    eprintln!(
        "{what}: rxe counters moved {moved:?}; capture: {from_us} RoCE frames from us, \
         {from_rxe} from rxe; {dups} duplicates received by us"
    );
    for (w, v) in rc_counts(
        ours,
        &[
            "retransmits",
            "ack-timeouts",
            "seq-naks-sent",
            "seq-naks-received",
            "rnr-naks-sent",
            "rnr-naks-received",
            "out-of-sequence",
        ],
    ) {
        assert_eq!(v, 0, "{what}: {w}: {ours}");
    }
    for k in RXE_RC_ERRORS {
        assert_eq!(moved.get(k), None, "{what}: rxe {k} moved: {moved:?}");
    }
    // rxe's own retries: each resent packet is one we counted as a
    // duplicate, and each was resent sooner than rxe's ACK timeout after
    // it first left (its timer was armed before the packet existed): none
    // waited for an ACK of ours that did not come.
    let again = rxe_spurious_retries(cap);
    let retries = moved.get("completer_retry_err").copied().unwrap_or(0);
    eprintln!(
        "{what}: rxe retried {retries} times on its own timer, resending {again:?} (PSN, ms after first sent)"
    );
    assert_eq!(again.len() as u64, dups, "{what}: {again:?}");
    assert_eq!(
        retries == 0,
        again.is_empty(),
        "{what}: {again:?} {moved:?}"
    );
    for (psn, ms) in &again {
        assert!(
            *ms < RXE_ACK_TIMEOUT_MS,
            "{what}: rxe resent PSN {psn:#x} {ms:.1} ms after sending it: a missing ACK"
        );
    }
    assert_eq!(moved.get("sent_pkts").copied(), Some(from_rxe), "{what}");
    assert_eq!(moved.get("rcvd_pkts").copied(), Some(from_us), "{what}");
}

/// Stock `ibv_rc_pingpong` against `uping --rdma=rc --pingpong`, both
/// roles, 200 iterations of the default 4096 bytes (four packets at path
/// MTU 1024) and of 1 byte: both ends finish, neither side's QP
/// retransmitted, timed out or NAKed, rxe's retry and sequence counters did
/// not move, its packet counters agree with our captures, and every RoCE
/// frame of them has a valid ICRC.
fn rc_pingpong_checks(ns: &Ns, g: &mut Guest, uping: &str, dir: &Path) {
    const N: u64 = 200;
    let n = N.to_string();
    for size in [None, Some("1")] {
        let stock_s = size.map(|s| format!(" -s {s}")).unwrap_or_default();
        let ours_s: Vec<&str> = size.map(|s| vec!["-s", s]).unwrap_or_default();
        let label = size.unwrap_or("4096");
        let packets = N * if size.is_some() { 1 } else { 4 };

        // uping is the client of the stock server.
        let before = rxe_hw_counters(g);
        g.ok(&format!(
            "(timeout 120 ibv_rc_pingpong -g 1 -n {N}{stock_s} > /tmp/rcpp.out 2>&1; echo exit=$? >> /tmp/rcpp.out) &"
        ));
        let cap = dir.join(format!("rcpp-client-{label}-{}.pcap", std::process::id()));
        let o = wait_for_server(|| {
            ns.ustack(
                uping,
                &[],
                &[
                    "--capture",
                    cap.to_str().unwrap(),
                    "--rdma=rc",
                    "--pingpong",
                ],
            )
            .args(["-c", &n])
            .args(&ours_s)
            .arg(GUEST_IP)
            .output()
            .unwrap()
        });
        let t = text(&o);
        let stock = wait_guest_file(g, "/tmp/rcpp.out", "exit=");
        let what = format!("uping --rdma=rc --pingpong -s {label} vs ibv_rc_pingpong server");
        eprintln!("{what}:\n{t}\nibv_rc_pingpong server:\n{stock}");
        assert!(o.status.success(), "{t}");
        assert!(t.contains(&format!("{N} iters in")), "{t}");
        assert!(
            stock.contains(&format!("{N} iters in")) && stock.contains("exit=0"),
            "{stock}"
        );
        assert!(pingpong_figure(&t, "usec/iter") > 0.0, "{t}");
        assert!(rc_counts(&t, &["packets"])[0].1 == packets, "{t}");
        let after = rxe_hw_counters(g);
        rc_round_checks(&what, &t, &cap, &before, &after);

        // uping is the server of the stock client.
        let before = after;
        let cap = dir.join(format!("rcpp-server-{label}-{}.pcap", std::process::id()));
        let server = Daemon::spawn(
            ns.ustack(
                uping,
                &[],
                &[
                    "--capture",
                    cap.to_str().unwrap(),
                    "--rdma=rc",
                    "--pingpong",
                    "--listen",
                ],
            )
            .args(["-c", &n])
            .args(&ours_s),
        );
        let what =
            format!("ibv_rc_pingpong client -s {label} vs uping --rdma=rc --pingpong --listen");
        let (stock, code, out, err) = stock_client_vs_server(
            g,
            &format!("timeout 120 ibv_rc_pingpong -g 1 -n {N}{stock_s} {HOST_IP}"),
            server,
            &what,
        );
        eprintln!("{what}:\n{stock}\nuping server:\n{out}{err}");
        assert!(
            stock.contains(&format!("{N} iters in")) && stock.contains("exit=0"),
            "{stock}"
        );
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.contains(&format!("{N} iters in")), "{out}");
        assert!(rc_counts(&out, &["packets"])[0].1 == packets, "{out}");
        let after = rxe_hw_counters(g);
        rc_round_checks(&what, &out, &cap, &before, &after);
    }
}

/// rxe's hw_counters by name (those that are numbers).
fn perftest_rc_rxe_counters(g: &mut Guest) -> std::collections::BTreeMap<String, u64> {
    let out = g.ok("cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep -H . *");
    let all: std::collections::BTreeMap<String, u64> = out
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
        .collect();
    assert!(all.contains_key("rcvd_seq_err"), "rxe hw_counters: {out}");
    all
}

/// The counts of our `uperf: perftest ... (RC): ...` summary line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RcSummary {
    messages: u64,
    errors: u64,
    retransmits: u64,
    rnr_naks: u64,
    ack_timeouts: u64,
    seq_naks: u64,
    /// Duplicate requests our responder saw (the peer resent).
    duplicates: u64,
    /// READ responses that skipped one (our READ asked again).
    read_gaps: u64,
}

fn perftest_rc_summary(out: &str) -> RcSummary {
    let line = out
        .lines()
        .find(|l| l.starts_with("uperf: perftest ") && l.contains("(RC):"))
        .unwrap_or_else(|| panic!("no summary line:\n{out}"))
        .replace(';', ",");
    RcSummary {
        messages: count(&line, "messages"),
        errors: count(&line, "errors"),
        retransmits: count(&line, "retransmits"),
        rnr_naks: count(&line, "RNR"),
        ack_timeouts: count(&line, "ACK"),
        seq_naks: count(&line, "sequence"),
        duplicates: count(&line, "duplicates"),
        read_gaps: count(&line, "READ"),
    }
}

/// perftest's RC programs (`ib_send_bw`, `ib_write_bw`, `ib_read_bw`,
/// `ib_send_lat`, `ib_write_lat`, `ib_read_lat`, `-c RC -x 1 -F -n 200`)
/// against `uperf --rdma rc`, both roles, at a one-packet size and one
/// above the 1024-byte path MTU: our side exits 0 with its table and
/// every message, the stock side exits 0 with its row, and both QPs end
/// without an error. rxe in a TCG guest on a loaded machine may lose or
/// delay a packet or an ACK, so a recovery is allowed where it is
/// accounted for ([`perftest_rc_recovery`]): each resend of ours follows
/// an ACK timeout or a NAK, and the two sides' counters agree.
fn perftest_rc_checks(ns: &Ns, g: &mut Guest, uperf: &str) {
    let programs = [
        ("ib_send_bw", "send", false),
        ("ib_write_bw", "write", false),
        ("ib_read_bw", "read", false),
        ("ib_send_lat", "send", true),
        ("ib_write_lat", "write", true),
        ("ib_read_lat", "read", true),
    ];
    for (tool, op, latency) in programs {
        for size in [if latency { 2u64 } else { 64 }, 4096] {
            perftest_rc_case(ns, g, uperf, (tool, op, latency), size, None);
        }
    }
}

/// One perftest RC program (`tool`, our `--op`, latency or not) at
/// `size` against `uperf --rdma rc`, both roles, 200 messages: as
/// [`perftest_rc_checks`] says. With `v6` (rxe's IPv6 RoCE v2 GID index),
/// over IPv6 GIDs: the stock side `-x` that index, ours `--ipv6` as the
/// client and following the client's family as the server; each side's
/// QP talks to the other's IPv6 address.
fn perftest_rc_case(
    ns: &Ns,
    g: &mut Guest,
    uperf: &str,
    (tool, op, latency): (&str, &str, bool),
    size: u64,
    v6: Option<&str>,
) {
    const N: u64 = 200;
    let n = N.to_string();
    let s = size.to_string();
    let ip6 = format!("{HOST_IP6}/64");
    let mut ours: Vec<&str> = vec!["--rdma", "rc", "--op", op, "-n", &n, "--size", &s];
    if latency {
        ours.push("--latency");
    }
    if v6.is_some() {
        ours.extend(["--ip", &ip6]);
    }
    let gid = v6.unwrap_or("1");
    let stock_args = format!("-c RC -x {gid} -F -n {N} -s {size}");
    // Our QP's peer, either role: the guest's address of the GID family.
    let peer = if v6.is_some() { GUEST_IP6 } else { GUEST_IP };
    let family = if v6.is_some() { " (IPv6 GIDs)" } else { "" };

    // uperf is the client of the stock server.
    let before = perftest_rc_rxe_counters(g);
    g.ok(&format!(
        "({tool} {stock_args} > /tmp/rcpt.out 2>&1; echo exit=$? >> /tmp/rcpt.out) &"
    ));
    let o = wait_for_server(|| {
        let mut c = ns.ustack(uperf, &[], &["-c", GUEST_IP]);
        c.args(&ours);
        if v6.is_some() {
            c.arg("--ipv6");
        }
        c.output().unwrap()
    });
    let t = text(&o);
    eprintln!("uperf --rdma rc client vs {tool} -s {size}{family}:\n{t}");
    let stock = wait_guest_file(g, "/tmp/rcpt.out", "exit=");
    eprintln!("{tool} server:\n{stock}");
    assert!(o.status.success(), "{t}\n{stock}");
    assert!(stock.contains("exit=0"), "{stock}");
    assert!(perftest_row(&t, size, N).is_some(), "no row: {t}");
    assert!(t.contains(&format!("peer {peer} qpn")), "{t}");
    // The stock server prints a row except ib_read_lat's (idle).
    if tool != "ib_read_lat" {
        assert!(perftest_row(&stock, size, N).is_some(), "{stock}");
    }
    let summary = perftest_rc_summary(&t);
    let want = if latency && op != "read" { 2 * N } else { N };
    assert_eq!(summary.messages, want, "{t}");
    let after = perftest_rc_rxe_counters(g);
    let what = format!("uperf client vs {tool} -s {size}{family}");
    perftest_rc_recovery(&what, &summary, latency, size, &before, &after);

    // uperf is the server of the stock client.
    let before = perftest_rc_rxe_counters(g);
    let server = Daemon::spawn(ns.ustack(uperf, &[], &["-s", "-1"]).args(&ours));
    // The stock latency tools wait forever for a lost message:
    // bounded by `timeout`, so a hang fails with both sides' output.
    let what = format!("{tool} -s {size} client vs uperf --rdma rc server{family}");
    let (stock, code, out, err) = stock_client_vs_server(
        g,
        &format!("timeout 60 {tool} {stock_args} {HOST_IP}"),
        server,
        &what,
    );
    eprintln!("{what}:\n{stock}\n{out}{err}");
    assert_eq!(code, 0, "{out}{err}\n{stock}");
    assert!(stock.contains("exit=0"), "{stock}");
    assert!(perftest_row(&stock, size, N).is_some(), "{stock}");
    if tool != "ib_read_lat" {
        assert!(perftest_row(&out, size, N).is_some(), "{out}");
    }
    assert!(out.contains(&format!("peer {peer} qpn")), "{out}");
    let summary = perftest_rc_summary(&out);
    let want = match (op, latency) {
        ("send", false) => N,
        ("send" | "write", true) => 2 * N,
        _ => 0,
    };
    assert_eq!(summary.messages, want, "{out}");
    let after = perftest_rc_rxe_counters(g);
    perftest_rc_recovery(&what, &summary, latency, size, &before, &after);
}

/// What must hold of one perftest RC run against rxe (an emulated peer:
/// a packet or an ACK may be lost or late under load), from our summary
/// and rxe's hw_counters before and after; a perfect run is not asked for.
///
/// - No error: ours, and rxe's `retry_exceeded_err`,
///   `retry_rnr_exceeded_err` and `send_err` did not move.
/// - Each resend of ours has a cause: an ACK timeout, a sequence or RNR
///   NAK, or a READ response gap; and a cause resends at most what may be
///   outstanding (one message of `size` in a latency test, the QP's
///   window of 1024 packets otherwise).
/// - The counters agree: every duplicate rxe's responder saw is a resend
///   of ours; every sequence NAK we got, rxe counted sending
///   (`out_of_seq_request`), every RNR NAK too (`send_rnr_err`); and a
///   duplicate our responder saw follows a retry rxe counted.
fn perftest_rc_recovery(
    what: &str,
    ours: &RcSummary,
    latency: bool,
    size: u64,
    a: &std::collections::BTreeMap<String, u64>,
    b: &std::collections::BTreeMap<String, u64>,
) {
    let d = |name: &str| {
        b.get(name)
            .copied()
            .unwrap_or(0)
            .saturating_sub(a.get(name).copied().unwrap_or(0))
    };
    let moved: Vec<(&String, u64)> = b.keys().map(|k| (k, d(k))).filter(|x| x.1 > 0).collect();
    eprintln!("{what}: ours {ours:?}; rxe counters moved: {moved:?}");
    assert_eq!(ours.errors, 0, "{what}: our errors");
    for name in ["retry_exceeded_err", "retry_rnr_exceeded_err", "send_err"] {
        assert_eq!(d(name), 0, "{what}: rxe {name} moved: {moved:?}");
    }
    let causes = ours.ack_timeouts + ours.seq_naks + ours.rnr_naks + ours.read_gaps;
    let per_cause = if latency {
        size.div_ceil(1024).max(1)
    } else {
        1024
    };
    assert!(
        ours.retransmits <= causes * per_cause,
        "{what}: {} resends for {causes} timeouts and NAKs (at most {per_cause} each): {ours:?}",
        ours.retransmits
    );
    assert!(
        d("duplicate_request") <= ours.retransmits,
        "{what}: rxe saw {} duplicates, we resent {}",
        d("duplicate_request"),
        ours.retransmits
    );
    assert!(
        ours.seq_naks <= d("out_of_seq_request"),
        "{what}: {} sequence NAKs received, rxe counted {moved:?}",
        ours.seq_naks
    );
    assert!(
        ours.rnr_naks <= d("send_rnr_err"),
        "{what}: {} RNR NAKs received, rxe counted {moved:?}",
        ours.rnr_naks
    );
    if ours.duplicates > 0 {
        let retries = d("completer_retry_err") + d("rcvd_seq_err") + d("rcvd_rnr_err");
        assert!(
            retries > 0,
            "{what}: {} duplicates reached us with no retry counted by rxe: {moved:?}",
            ours.duplicates
        );
    }
}
