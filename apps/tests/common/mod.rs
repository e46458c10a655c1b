//! What every netns test shares: the root check, the topology guard made by
//! `tools/netns.sh` (removed on drop, also when a test fails), a daemon that
//! is stopped with SIGTERM and killed if it lingers, and small parsers.
#![allow(dead_code)]

#[macro_use]
pub mod lab;
#[macro_use]
pub mod stock;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use ustack_kit::bulk::fill_pattern;

pub fn root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout == b"0\n")
        .unwrap_or(false)
}

/// Skip where namespaces cannot be made: a failure under `CI=true`, else
/// a line in tools/test.sh's list of skips (`ustack_test_skip`).
#[allow(unused_macros)]
macro_rules! need_root {
    () => {
        if !common::root() {
            ustack_test_skip::skip_test!("network namespaces need root");
        }
    };
}

pub fn netns_sh() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tools/netns.sh")
}

/// A topology of our own: `TAG-linux` (10.77.0.1 on `TAG-l`) and `TAG-stack`
/// (`TAG-s`, no kernel address); removed on drop.
pub struct Topo {
    pub tag: String,
}

impl Topo {
    /// `short` names the test (a few letters); `netem` is passed to tc.
    pub fn up_with(short: &str, netem: Option<&str>) -> Topo {
        reap_stale(short);
        let tag = format!("{short}{}", std::process::id() % 10_000);
        // The guard exists before anything is made, so a failing `up` is cleaned too.
        let topo = Topo { tag: tag.clone() };
        let mut cmd = Command::new(netns_sh());
        cmd.args(["up", &tag]);
        if let Some(n) = netem {
            cmd.env("NETEM", n);
        }
        let out = cmd.output().expect("run netns.sh");
        assert!(
            out.status.success(),
            "netns.sh up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        topo
    }

    pub fn up(short: &str) -> Topo {
        Topo::up_with(short, None)
    }

    pub fn ns(&self, side: &str) -> String {
        format!("{}-{side}", self.tag)
    }

    /// The veth end in the stack namespace (no kernel address).
    pub fn stack_if(&self) -> String {
        format!("{}-s", self.tag)
    }

    /// The veth end in the Linux namespace.
    pub fn linux_if(&self) -> String {
        format!("{}-l", self.tag)
    }

    /// IPv6 back on for the Linux host (the topology turns it off in
    /// both namespaces) with `addr` (`fd77::1/64`) on its veth, usable at
    /// once (no duplicate address detection wait). The stack side keeps
    /// IPv6 off, so its kernel never answers for ustack.
    pub fn linux_ipv6(&self, addr: &str) {
        let lv = self.linux_if();
        for args in [
            vec!["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=0"],
            vec![
                "sysctl",
                "-qw",
                &format!("net.ipv6.conf.{lv}.disable_ipv6=0"),
            ],
            vec!["ip", "-6", "addr", "add", addr, "dev", &lv, "nodad"],
        ] {
            let o = self.linux(&args);
            assert!(
                o.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }

    pub fn in_ns(&self, side: &str, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.ns(side)])
            .args(args)
            .output()
            .expect("run in a namespace")
    }

    /// Run a command on the Linux host.
    pub fn linux(&self, args: &[&str]) -> Output {
        self.in_ns("linux", args)
    }

    /// A binary of ours in the stack namespace.
    pub fn bin(&self, exe: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns("stack"), exe]);
        c.args(args);
        c
    }

    /// Whether the Linux host gets an ARP answer for 10.77.0.2 within a second.
    pub fn arping_once(&self) -> bool {
        self.linux(&[
            "arping",
            "-c",
            "1",
            "-w",
            "1",
            "-I",
            &self.linux_if(),
            "10.77.0.2",
        ])
        .status
        .success()
    }
}

/// Remove the namespaces an earlier run of the test tagged `short` left
/// behind when it was killed (SIGKILL, a timeout: no `Drop` ran): those
/// whose tag's number matches no live process (tags are the creating
/// process's id modulo 10,000, so a live creator always matches).
fn reap_stale(short: &str) {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    let live: std::collections::HashSet<u32> = std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .map(|pid| pid % 10_000)
                .collect()
        })
        .unwrap_or_default();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some((tag, side)) = name.rsplit_once('-') else {
            continue;
        };
        let Some(n) = tag.strip_prefix(short).and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if matches!(side, "linux" | "stack") && !live.contains(&n) {
            let _ = Command::new(netns_sh()).args(["down", tag]).output();
        }
    }
}

impl Drop for Topo {
    fn drop(&mut self) {
        let _ = Command::new(netns_sh()).args(["down", &self.tag]).output();
    }
}

/// A long-running process (`ustack run`, a server); stopped with SIGTERM by
/// `stop`, killed on drop.
pub struct Daemon {
    pub child: Option<Child>,
}

impl Daemon {
    pub fn new(child: Child) -> Self {
        Daemon { child: Some(child) }
    }

    /// Start `cmd` with its stdout and stderr piped (for [`stop`](Self::stop)).
    pub fn spawn(cmd: &mut Command) -> Self {
        let child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {:?}: {e}", cmd.get_program()));
        Daemon::new(child)
    }

    /// SIGTERM, wait, and return (exit code, stdout, stderr).
    pub fn stop(mut self) -> (i32, String, String) {
        let child = self.child.take().expect("running");
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let out = child.wait_with_output().expect("wait for the daemon");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Wait at most `limit` for it to exit by itself: `Ok((exit code,
    /// stdout, stderr))`; past `limit` it is stopped as by
    /// [`stop`](Self::stop) and its output comes back as `Err`.
    pub fn wait_at_most(
        mut self,
        limit: std::time::Duration,
    ) -> Result<(i32, String, String), (i32, String, String)> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let child = self.child.as_mut().expect("running");
            match child.try_wait() {
                Ok(Some(_)) => return Ok(self.wait()),
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                _ => return Err(self.stop()),
            }
        }
    }

    /// Wait for it to exit by itself: (exit code, stdout, stderr).
    pub fn wait(mut self) -> (i32, String, String) {
        let out = self
            .child
            .take()
            .expect("running")
            .wait_with_output()
            .expect("wait for the process");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Topo {
    /// 64 MiB from a Linux client through the echo service of `d` (a
    /// `ustack run` on this topology) and back, byte-exact; then, with `d`
    /// stopped, 64 MiB from `ustack send NET_FLAG TAG-s` (and `extra`) to
    /// a Linux `nc -l`, checked by content and by the CRC-32 it prints.
    /// Returns what `d` printed at exit (its counters).
    #[allow(dead_code)]
    pub fn tcp_both_ways(&self, d: Daemon, net_flag: &str, extra: &[&str]) -> String {
        const BYTES: usize = 64 << 20;
        let (input, data) = random_file(BYTES);
        let output = tempfile::NamedTempFile::new().unwrap().into_temp_path();
        let shell = format!(
            "nc -N -w 30 10.77.0.2 7 < {} > {}",
            input.display(),
            output.display()
        );
        let nc = self.linux(&["sh", "-c", &shell]);
        assert!(
            nc.status.success(),
            "nc: {}",
            String::from_utf8_lossy(&nc.stderr)
        );
        let echoed = std::fs::read(&output).unwrap();
        assert_eq!(echoed.len(), BYTES);
        assert!(echoed == data, "echo differs from what was sent");
        let (code, out, err) = d.stop();
        assert_eq!(code, 0, "{out}{err}");
        assert!(
            out.contains(&format!("tcp services: {BYTES} bytes in, {BYTES} echoed")),
            "{out}"
        );
        // ustack client -> Linux server.
        let received = tempfile::NamedTempFile::new().unwrap().into_temp_path();
        let server = Daemon::spawn(
            Command::new("ip")
                .args(["netns", "exec", &self.ns("linux"), "sh", "-c"])
                .arg(format!(
                    "nc -l -N -w 60 10.77.0.1 5001 > {}",
                    received.display()
                )),
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
        let send = self
            .bin(
                env!("CARGO_BIN_EXE_ustack"),
                &[
                    "send",
                    net_flag,
                    &self.stack_if(),
                    "--ip",
                    "10.77.0.2/24",
                    "--to",
                    "10.77.0.1:5001",
                    "--bytes",
                    &BYTES.to_string(),
                ],
            )
            .args(extra)
            .output()
            .expect("ustack send");
        let text = String::from_utf8_lossy(&send.stdout);
        assert!(
            send.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&send.stderr)
        );
        let (code, _, err) = server.wait();
        assert_eq!(code, 0, "nc -l: {err}");
        let got = std::fs::read(&received).unwrap();
        let mut want = vec![0u8; BYTES];
        fill_pattern(0, &mut want);
        assert_eq!(got.len(), BYTES);
        assert!(got == want, "bytes at the Linux server differ");
        assert!(
            text.contains(&format!("crc32 {:08x}", crc32fast::hash(&want))),
            "{text}"
        );
        out
    }

    /// A stock `iperf3 -s -1 -J` on the Linux side (10.77.0.1), given half
    /// a second to listen; it exits by itself after one test.
    pub fn linux_iperf3_server(&self) -> Daemon {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns("linux")])
            .args(["iperf3", "-s", "-1", "-J", "-B", "10.77.0.1"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start iperf3 -s");
        std::thread::sleep(std::time::Duration::from_millis(500));
        Daemon::new(child)
    }
}

/// The JSON `what` printed on stdout, or a panic showing all it printed.
pub fn stdout_json(what: &str, stdout: &[u8], stderr: &[u8]) -> serde_json::Value {
    serde_json::from_slice(stdout).unwrap_or_else(|e| {
        panic!(
            "{what} JSON: {e}: {}{}",
            String::from_utf8_lossy(stdout),
            String::from_utf8_lossy(stderr)
        )
    })
}

/// Every JSON object line of a program's output, in order.
pub fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

/// The number before `word` in `text` ("5 received" -> 5).
pub fn count_before(text: &str, word: &str) -> u64 {
    let words: Vec<&str> = text.split_whitespace().collect();
    let i = words
        .iter()
        .position(|w| w.trim_end_matches(',') == word)
        .unwrap_or_else(|| panic!("'{word}' in {text}"));
    words[i - 1]
        .parse()
        .unwrap_or_else(|_| panic!("number before '{word}' in {text}"))
}

/// A temp file of `bytes` bytes of the bulk pattern, and the bytes.
pub fn random_file(bytes: usize) -> (tempfile::TempPath, Vec<u8>) {
    let mut data = vec![0u8; bytes];
    fill_pattern(7, &mut data);
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(&data).unwrap();
    (f.into_temp_path(), data)
}

pub fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// No panic and no backtrace in a process's stderr.
pub fn no_crash(err: &str) {
    assert!(!err.contains("panicked"), "{err}");
    assert!(!err.contains("stack backtrace"), "{err}");
}

/// Whether `prog` is on the PATH.
pub fn have_program(prog: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Skip when a stock program the test drives is missing (as
/// [`need_root`]: a failure under `CI=true`).
#[allow(unused_macros)]
macro_rules! need_program {
    ($prog:expr, $package:expr) => {
        if !common::have_program($prog) {
            ustack_test_skip::skip_test!(
                "{} is not installed (apt-get install {})",
                $prog,
                $package
            );
        }
    };
}

/// The NET flag of the backend the tests' stacks run on: `--pcap`, or
/// `--xdp` with `USTACK_TEST_BACKEND=xdp` (tools/test.sh runs the
/// stock-program suite once more that way).
#[allow(dead_code)]
pub fn backend_flag() -> &'static str {
    match std::env::var("USTACK_TEST_BACKEND").as_deref() {
        Ok("xdp") => "--xdp",
        Ok("pcap") | Ok("") | Err(_) => "--pcap",
        Ok(other) => panic!("USTACK_TEST_BACKEND={other}: say pcap or xdp"),
    }
}

impl Topo {
    /// `ustack run --pcap TAG-s --ip 10.77.0.2/24 EXTRA` in the stack
    /// namespace (`--xdp` as [`backend_flag`] says), returned once it
    /// answers ARP.
    pub fn ustack_run(&self, extra: &[&str]) -> Daemon {
        self.ustack_run_on(backend_flag(), extra)
    }

    /// [`ustack_run`](Self::ustack_run) on the backend `net_flag` names
    /// (`--pcap`, `--xdp`).
    pub fn ustack_run_on(&self, net_flag: &str, extra: &[&str]) -> Daemon {
        let child = self
            .bin(
                env!("CARGO_BIN_EXE_ustack"),
                &["run", net_flag, &self.stack_if(), "--ip", "10.77.0.2/24"],
            )
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start ustack run");
        let d = Daemon::new(child);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !self.arping_once() {
            assert!(
                std::time::Instant::now() < deadline,
                "ustack run did not come up"
            );
        }
        d
    }
}

impl Daemon {
    /// The process id (`ip netns exec` execs the program: it is the
    /// program's own).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Resident memory (VmRSS) in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("the daemon's /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no VmRSS in {status}"))
    }
}

/// A fresh telemetry snapshot from the JSON-lines socket at `path` (waits
/// for the socket to appear). A new client gets the latest line at once,
/// which may be up to one publishing interval old: the line after it is
/// taken, so whatever happened before the call is in it.
pub fn telemetry(path: &Path) -> serde_json::Value {
    use std::io::BufRead;
    use std::time::{Duration, Instant};
    let deadline = Instant::now() + Duration::from_secs(10);
    let stream = loop {
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                panic!("telemetry socket {}: {e}", path.display())
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut r = std::io::BufReader::new(stream);
    let mut line = String::new();
    for _ in 0..2 {
        line.clear();
        r.read_line(&mut line).expect("a telemetry line");
    }
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("telemetry JSON: {e}: {line}"))
}

/// A drop counter (`stack.drops.NAME`) of a telemetry snapshot.
pub fn telemetry_drop(snapshot: &serde_json::Value, name: &str) -> u64 {
    snapshot["stack"]["drops"][name].as_u64().unwrap_or(0)
}

/// A reader attached to a telemetry socket for the whole life of the
/// stack that publishes there: it reads every JSON line until the
/// publisher closes the socket (the stack stopped), and keeps the last one,
/// which is the stack's final snapshot.
pub struct TelemetryTail {
    path: PathBuf,
    rx: std::sync::mpsc::Receiver<Result<(u64, serde_json::Value), String>>,
}

impl TelemetryTail {
    /// Attach in a thread of its own; the socket may not exist yet (it is
    /// waited for up to 20 s, so a tail can be set up before the program
    /// starts).
    pub fn attach(path: &Path) -> TelemetryTail {
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.to_owned();
        std::thread::spawn(move || {
            let _ = tx.send(tail_lines(&p));
        });
        TelemetryTail {
            path: path.to_owned(),
            rx,
        }
    }

    /// The last line received before the socket closed, and how many lines
    /// came; panics when the socket is still open after `within`, or when
    /// no line came at all.
    pub fn last(self, within: std::time::Duration) -> (u64, serde_json::Value) {
        match self.rx.recv_timeout(within) {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => panic!("telemetry {}: {e}", self.path.display()),
            Err(_) => panic!(
                "telemetry {}: the socket is still open {within:?} after the stack was told to stop",
                self.path.display()
            ),
        }
    }
}

/// [`TelemetryTail`]'s thread: connect, read to the end, keep the last line.
fn tail_lines(path: &Path) -> Result<(u64, serde_json::Value), String> {
    use std::io::BufRead;
    use std::time::{Duration, Instant};
    let deadline = Instant::now() + Duration::from_secs(20);
    let stream = loop {
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("never accepted a connection: {e}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    };
    // The stack publishes a few times a second: a long silence is a fault.
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .map_err(|e| e.to_string())?;
    let mut r = std::io::BufReader::new(stream);
    let (mut lines, mut last) = (0u64, String::new());
    let mut line = String::new();
    loop {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) if line.ends_with('\n') => {
                lines += 1;
                std::mem::swap(&mut last, &mut line);
            }
            // A line cut short by the close: the one before is the last.
            Ok(_) => break,
            Err(e) => return Err(format!("no line for 20 s after {lines} lines: {e}")),
        }
    }
    if lines == 0 {
        return Err("the socket closed before any line came".into());
    }
    serde_json::from_str(&last)
        .map(|v| (lines, v))
        .map_err(|e| format!("last line is not JSON: {e}: {last}"))
}

/// Every pool of a telemetry snapshot as (name, in use); at least one.
pub fn pools_in_use(snap: &serde_json::Value) -> Vec<(String, u64)> {
    let pools: Vec<(String, u64)> = snap["pools"]
        .as_array()
        .unwrap_or_else(|| panic!("no pools in {snap}"))
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap_or("?").to_string(),
                p["in_use"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("pool without in_use: {p}")),
            )
        })
        .collect();
    assert!(!pools.is_empty(), "no pools in {snap}");
    pools
}

/// The records of a classic pcap file (Ethernet): (seconds since the
/// first record, frame bytes), in file order.
pub fn pcap_records(path: &Path) -> Vec<(f64, Vec<u8>)> {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut reader = pcap_file::pcap::PcapReader::new(file)
        .unwrap_or_else(|e| panic!("{}: not a pcap file: {e}", path.display()));
    let mut out = Vec::new();
    let mut t0 = None;
    while let Some(pkt) = reader.next_packet() {
        let Ok(pkt) = pkt else { break };
        let t = pkt.timestamp.as_secs_f64();
        let t0 = *t0.get_or_insert(t);
        out.push((t - t0, pkt.data.into_owned()));
    }
    out
}

/// A RoCEv2 frame's sender, BTH opcode and PSN (`None` for anything else).
pub fn roce_bth(frame: &[u8]) -> Option<(std::net::Ipv4Addr, u8, u32)> {
    if frame.len() < 14 + 20 || frame[12..14] != [0x08, 0x00] {
        return None;
    }
    let ip = &frame[14..];
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ip[0] >> 4 != 4 || ip[9] != 17 || ip.len() < ihl + 8 + 12 {
        return None;
    }
    let udp = &ip[ihl..];
    if u16::from_be_bytes([udp[2], udp[3]]) != 4791 {
        return None;
    }
    let bth = &udp[8..];
    let src = std::net::Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    Some((
        src,
        bth[0],
        u32::from_be_bytes([0, bth[9], bth[10], bth[11]]),
    ))
}
