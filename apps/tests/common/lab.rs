//! The set-up of the tests that run stock programs under `ustack exec`
//! (netns_preload.rs, netns_stock.rs): a topology with a ustack host
//! (10.77.0.2 on `TAG-s`) and a Linux host (10.77.0.1 on `TAG-l`, and a
//! second ustack beside the kernel as 10.77.0.3), the preload library, a
//! preloaded program with its telemetry tail and process tree, and how it
//! ended.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

use regex::Regex;
use serde_json::Value;

use super::{Daemon, TelemetryTail, Topo, no_crash, pools_in_use, sha256};

/// The Python that is surely the system's (a `python3` on the PATH may be
/// a pyenv shim).
pub const PYTHON: &str = "/usr/bin/python3";

/// How long a stopped program's stack may take to close its telemetry
/// socket (it lets queued output leave for up to a second first).
pub const STOP_WITHIN: Duration = Duration::from_secs(20);

// ------------------------------------------------------------ the library

/// `libustack_preload.so`: `USTACK_PRELOAD_LIB`, else the one
/// tools/test.sh's release build makes (`target/release`, all features),
/// else one beside the `ustack` under test (`target/debug`).
pub fn preload_lib() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("USTACK_PRELOAD_LIB") {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    let exe = Path::new(env!("CARGO_BIN_EXE_ustack"));
    let here = exe.parent()?;
    let lib = [
        here.parent()?.join("release/libustack_preload.so"),
        here.join("libustack_preload.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())?;
    warn_if_stale(&lib);
    Some(lib)
}

pub fn modified(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// Say so when a source of the library is newer than the library.
pub fn warn_if_stale(lib: &Path) {
    let Some(built) = modified(lib) else { return };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut newer = Vec::new();
    for dir in ["preload/src", "runtime/src", "stack/src"] {
        let mut stack = vec![root.join(dir)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if modified(&p).is_some_and(|t| t > built) {
                    newer.push(p);
                }
            }
        }
    }
    if !newer.is_empty() {
        eprintln!(
            "warning: {} is older than {} source files (e.g. {}): rebuild it \
             (cargo build --release --all-features -p ustack-preload)",
            lib.display(),
            newer.len(),
            newer[0].display()
        );
    }
}

/// The library, or skip (loudly) saying how to build it.
#[allow(unused_macros)]
macro_rules! need_preload {
    () => {
        match $crate::common::lab::preload_lib() {
            Some(lib) => lib,
            None => {
                ustack_test_skip::skip_test!(
                    "libustack_preload.so is not built: \
                     cargo build --release --all-features -p ustack-preload \
                     (tools/test.sh builds it), or set USTACK_PRELOAD_LIB"
                );
            }
        }
    };
}

// ------------------------------------------------------------ the set-up

/// Where a preloaded program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    /// 10.77.0.2 on `TAG-s` in `TAG-stack`.
    Stack,
    /// 10.77.0.3 on `TAG-l` in `TAG-linux`, beside the kernel's 10.77.0.1.
    LinuxSide,
}

impl Host {
    /// Its stack's address.
    pub fn ip(self) -> &'static str {
        match self {
            Host::Stack => "10.77.0.2",
            Host::LinuxSide => "10.77.0.3",
        }
    }

    /// Its stack's IPv6 address and prefix (with [`Lab::ipv6`]).
    pub fn ip6(self) -> &'static str {
        match self {
            Host::Stack => "fd77::2/64",
            Host::LinuxSide => "fd77::3/64",
        }
    }

    /// Its namespace's side (`TAG-SIDE`).
    pub fn side(self) -> &'static str {
        match self {
            Host::Stack => "stack",
            Host::LinuxSide => "linux",
        }
    }

    /// The veth end its stack takes.
    pub fn iface(self, topo: &Topo) -> String {
        match self {
            Host::Stack => topo.stack_if(),
            Host::LinuxSide => topo.linux_if(),
        }
    }
}

/// A test's topology, library and scratch directory.
pub struct Lab {
    /// The namespaces (removed on drop).
    pub topo: Topo,
    /// `libustack_preload.so`.
    pub lib: PathBuf,
    /// Scratch files (configurations, data, telemetry sockets).
    pub dir: tempfile::TempDir,
    /// Programs started so far (names their telemetry sockets).
    pub runs: std::cell::Cell<u32>,
    /// `ustack exec --spin` for the programs it starts (None: the default,
    /// run to completion).
    pub spin: std::cell::Cell<Option<u32>>,
    /// `ustack exec --fork each --workers N` for the programs it starts.
    pub fork_each: std::cell::Cell<Option<u32>>,
    /// IPv6 on too (see [`Lab::ipv6`]).
    pub v6: std::cell::Cell<bool>,
    /// `ustack exec --stack NAME` for the programs it starts.
    pub stack: std::cell::Cell<Option<&'static str>>,
}

impl Lab {
    /// A topology tagged `short`, and a scratch directory.
    pub fn new(short: &str, lib: PathBuf) -> Lab {
        Lab {
            topo: Topo::up(short),
            lib,
            dir: tempfile::tempdir().expect("a temp dir"),
            runs: std::cell::Cell::new(0),
            spin: std::cell::Cell::new(None),
            fork_each: std::cell::Cell::new(None),
            v6: std::cell::Cell::new(false),
            stack: std::cell::Cell::new(None),
        }
    }

    /// IPv6 beside IPv4: the Linux host gets `fd77::1/64` on its veth (the
    /// topology turns IPv6 off; the stack side's kernel keeps it off, so
    /// it never answers for ustack), and the programs started from now on
    /// get `--ip fd77::2/64` (`fd77::3/64` beside Linux).
    pub fn ipv6(&self) {
        self.topo.linux_ipv6("fd77::1/64");
        self.v6.set(true);
    }

    /// A file in the scratch directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `ustack exec NET [--fork child] -- PROGRAM` on `host`, publishing
    /// telemetry on a socket of its own (returned) when `telemetry`.
    pub fn exec(
        &self,
        host: Host,
        fork_child: bool,
        telemetry: bool,
        program: &[&str],
    ) -> (Command, PathBuf) {
        let n = self.runs.get() + 1;
        self.runs.set(n);
        let sock = self.path(&format!("ustack-{n}.sock"));
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.topo.ns(host.side())])
            .arg(env!("CARGO_BIN_EXE_ustack"))
            .args(["exec", super::backend_flag(), &host.iface(&self.topo)])
            .args(["--ip", &format!("{}/24", host.ip())]);
        if self.v6.get() {
            c.args(["--ip", host.ip6()]);
        }
        if telemetry {
            c.arg("--telemetry").arg(&sock);
        }
        if fork_child {
            c.args(["--fork", "child"]);
        }
        if let Some(us) = self.spin.get() {
            c.args(["--spin", &us.to_string()]);
        }
        if let Some(n) = self.fork_each.get() {
            c.args(["--fork", "each", "--workers", &n.to_string()]);
        }
        if let Some(name) = self.stack.get() {
            c.args(["--stack", name]);
        }
        c.arg("--")
            .args(program)
            .env("USTACK_PRELOAD_LIB", &self.lib);
        (c, sock)
    }

    /// Start a program on ustack, a telemetry reader attached to it.
    pub fn start(&self, host: Host, fork_child: bool, program: &[&str]) -> Preloaded {
        self.start_with(host, fork_child, true, program)
    }

    /// Start a program on ustack, with telemetry and a reader or without.
    pub fn start_with(
        &self,
        host: Host,
        fork_child: bool,
        telemetry: bool,
        program: &[&str],
    ) -> Preloaded {
        let (mut c, sock) = self.exec(host, fork_child, telemetry, program);
        let tail = telemetry.then(|| TelemetryTail::attach(&sock));
        let child = c
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {program:?}: {e}"));
        Preloaded {
            what: program.join(" "),
            tree: Tree::new(child.id()),
            daemon: Daemon::new(child),
            tail,
            sock,
        }
    }

    /// Run a program on ustack to its end.
    pub fn run(&self, host: Host, program: &[&str]) -> Ended {
        self.start(host, false, program).wait()
    }

    /// Compile a C program (`cc`) into the lab's directory: its path.
    pub fn compile_c(&self, name: &str, source: &str) -> PathBuf {
        let src = self.path(&format!("{name}.c"));
        let bin = self.path(name);
        std::fs::write(&src, source).unwrap();
        let o = Command::new("cc")
            .arg("-O1")
            .arg("-o")
            .arg(&bin)
            .arg(&src)
            .output()
            .expect("run cc");
        assert!(o.status.success(), "cc {name}: {}", text(&o));
        bin
    }

    /// A command on the Linux host (the kernel's sockets).
    pub fn linux(&self, args: &[&str]) -> Output {
        self.topo.linux(args)
    }

    /// A Linux program kept running (a server), in the Linux namespace.
    pub fn linux_daemon(&self, args: &[&str]) -> Daemon {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.topo.ns("linux")])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {args:?}: {e}"));
        Daemon::new(child)
    }

    /// SHA-256 of the first `len` bytes of 0, 1, ..., 255, 0, 1, ... (what
    /// the echo clients send).
    pub fn pattern_sha256(&self, len: usize) -> String {
        let f = self.path(&format!("pattern-{len}.bin"));
        std::fs::write(&f, (0..=255u8).cycle().take(len).collect::<Vec<u8>>()).unwrap();
        sha256(&f)
    }

    /// Wait until `ip` answers ARP on the Linux side (its stack is up).
    pub fn wait_arp(&self, ip: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        let iface = self.topo.linux_if();
        while !self
            .linux(&["arping", "-c", "1", "-w", "1", "-I", &iface, ip])
            .status
            .success()
        {
            assert!(Instant::now() < deadline, "{ip} never answered ARP");
        }
    }

    /// Wait until a TCP connect from the Linux host to `ip:port` succeeds.
    pub fn wait_port(&self, ip: &str, port: u16) {
        self.wait_arp(ip);
        let deadline = Instant::now() + Duration::from_secs(15);
        let port = port.to_string();
        while !self
            .linux(&["nc", "-z", "-w", "1", ip, &port])
            .status
            .success()
        {
            assert!(Instant::now() < deadline, "{ip}:{port} never listened");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A program on ustack with a telemetry reader attached.
pub struct Preloaded {
    /// Its command line.
    pub what: String,
    /// First, so that a failing test kills the program's children (a
    /// forked worker or BGSAVE child) before the program itself.
    pub tree: Tree,
    /// The process (`ip netns exec` execs `ustack`, which execs the program).
    pub daemon: Daemon,
    /// Its stack's telemetry, read to the end.
    pub tail: Option<TelemetryTail>,
    /// Its stack's telemetry socket.
    pub sock: PathBuf,
}

/// A process tree killed (SIGSTOP then SIGKILL, by PID) on drop unless
/// disarmed: the process and every descendant, found before any is killed
/// (an orphan would be adopted by init and lost).
pub struct Tree {
    /// The root of the tree (None: disarmed).
    pub pid: Option<u32>,
}

impl Tree {
    /// Armed on `pid`.
    pub fn new(pid: u32) -> Tree {
        Tree { pid: Some(pid) }
    }

    /// Kill nothing on drop.
    pub fn disarm(&mut self) {
        self.pid = None;
    }
}

/// Every process's parent, from /proc.
pub fn parents() -> Vec<(u32, u32)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces and parens.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok());
        if let Some(ppid) = ppid {
            v.push((pid, ppid));
        }
    }
    v
}

impl Drop for Tree {
    fn drop(&mut self) {
        let Some(root) = self.pid else { return };
        let all = parents();
        let mut tree = vec![root];
        let mut i = 0;
        while i < tree.len() {
            let p = tree[i];
            tree.extend(all.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
            i += 1;
        }
        // Stopped first, so that no parent sees a child die and starts
        // another (nginx's master respawns its worker).
        for sig in ["-STOP", "-KILL"] {
            for pid in &tree {
                let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
            }
        }
    }
}

/// How a preloaded program ended, and its stack's last snapshot.
pub struct Ended {
    /// Its command line.
    pub what: String,
    /// Exit status (-1: ended by a signal).
    pub code: i32,
    /// What it printed on stdout.
    pub out: String,
    /// What it printed on stderr.
    pub err: String,
    /// Telemetry lines read and the last one (with telemetry).
    pub lines: u64,
    /// The last telemetry line.
    pub last: Option<Value>,
}

impl Preloaded {
    /// The program's process id.
    pub fn pid(&self) -> u32 {
        self.daemon.pid()
    }

    /// Whether it exits within `within`.
    pub fn exited_within(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let child = self.daemon.child.as_mut().expect("running");
        loop {
            if child.try_wait().is_ok_and(|s| s.is_some()) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM by PID, then the end (a program that does not stop fails
    /// the test, and is killed with its children).
    pub fn stop(mut self) -> Ended {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        assert!(
            self.exited_within(STOP_WITHIN),
            "{} still running {STOP_WITHIN:?} after SIGTERM",
            self.what
        );
        self.ended()
    }

    /// Its own end (within a minute).
    pub fn wait(mut self) -> Ended {
        let within = Duration::from_secs(60);
        assert!(
            self.exited_within(within),
            "{} still running after {within:?}",
            self.what
        );
        self.ended()
    }

    /// Its own end, or SIGTERM after `within` (a server waiting for a
    /// client that failed).
    pub fn wait_within(mut self, within: Duration) -> Ended {
        if self.exited_within(within) {
            return self.ended();
        }
        eprintln!("{} still running after {within:?}: stopping it", self.what);
        self.stop()
    }

    /// The exited program's status and output, and its stack's last
    /// telemetry line.
    pub fn ended(mut self) -> Ended {
        self.tree.disarm();
        let (code, out, err) = self.daemon.wait();
        let (lines, last) = match self.tail {
            Some(t) => {
                let (n, v) = t.last(STOP_WITHIN);
                (n, Some(v))
            }
            None => (0, None),
        };
        Ended {
            what: self.what,
            code,
            out,
            err,
            lines,
            last,
        }
    }

    /// `utop --once` on its socket shows it: its pid, its pool, live.
    pub fn check_utop(&self) {
        let (code, out, err) = utop_once(&self.sock);
        assert_eq!(code, 0, "utop --once on {}: {out}{err}", self.what);
        let pid = format!("(pid {})", self.pid());
        assert!(
            out.contains(&pid) && out.contains("Pools") && out.contains("pcap-"),
            "utop --once does not show {} {pid}: {out}",
            self.what
        );
    }
}

impl Ended {
    /// Exit status `code`, no panic, and (with telemetry) every pool back
    /// at zero in the last snapshot the stack published.
    pub fn check(&self, code: i32) {
        assert_eq!(
            self.code, code,
            "{} exit status: {}{}",
            self.what, self.out, self.err
        );
        no_crash(&self.err);
        let Some(last) = &self.last else { return };
        let pools = pools_in_use(last);
        assert!(
            pools.iter().all(|p| p.1 == 0),
            "{}: pool buffers still in use when its stack stopped ({} lines read): {pools:?}",
            self.what,
            self.lines
        );
    }

    /// TCP byte totals of the stack's last snapshot: (in, out).
    pub fn tcp_bytes(&self) -> (u64, u64) {
        tcp_bytes(self.last.as_ref().expect("telemetry"))
    }
}

/// `stack.tcp.totals.bytes_in` and `bytes_out` of a snapshot.
pub fn tcp_bytes(snap: &Value) -> (u64, u64) {
    let t = &snap["stack"]["tcp"]["totals"];
    (
        t["bytes_in"]
            .as_u64()
            .unwrap_or_else(|| panic!("no tcp totals in {snap}")),
        t["bytes_out"].as_u64().unwrap_or(0),
    )
}

/// The `utop` binary beside this test's binaries (`cargo test --workspace`
/// builds it), else the same steps through the utop library.
pub fn utop_once(sock: &Path) -> (i32, String, String) {
    let bin = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.parent()?.join("utop")))
        .filter(|b| b.is_file());
    if let Some(bin) = bin {
        let out = Command::new(bin)
            .args(["--once", "--width", "180", "--telemetry"])
            .arg(sock)
            .output()
            .expect("run utop");
        return (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
    }
    let stream = match utop::feed::attach(sock) {
        Ok(s) => s,
        Err(e) => return (2, String::new(), format!("utop: {e:#}")),
    };
    let mut r = std::io::BufReader::new(stream);
    let mut m = utop::Monitor::new(sock.display().to_string());
    for wait in [5, 1] {
        match utop::feed::read_frame(&mut r, Duration::from_secs(wait)) {
            Ok(Some(f)) => m.on_update(utop::Update::Frame(Box::new(f))),
            _ => break,
        }
    }
    (0, m.text_frame(180), String::new())
}

/// A finished command's stdout and stderr, as text.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The first capture of `re` in `text`, parsed.
pub fn cap<T: std::str::FromStr>(text: &str, re: &str) -> T {
    let r = Regex::new(re).unwrap();
    let c = r
        .captures(text)
        .unwrap_or_else(|| panic!("no /{re}/ in:\n{text}"));
    c[1].parse()
        .unwrap_or_else(|_| panic!("/{re}/ matched {:?}, not a number", &c[1]))
}

/// The Linux side's peer: on RESET_PORT it resets each connection after its
/// first bytes (SO_LINGER 0, then close); on ECHO_PORT it echoes.
pub const PEER: &str = r#"
import socket, struct, sys, threading
ip, reset_port, echo_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def listener(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((ip, port))
    s.listen(16)
    return s

def resetter(s):
    while True:
        c, _ = s.accept()
        c.recv(100)
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()

def echo(c):
    try:
        while True:
            d = c.recv(65536)
            if not d:
                break
            c.sendall(d)
    except OSError:
        pass
    c.close()

def echoer(s):
    while True:
        c, _ = s.accept()
        threading.Thread(target=echo, args=(c,), daemon=True).start()

a, b = listener(reset_port), listener(echo_port)
threading.Thread(target=resetter, args=(a,), daemon=True).start()
print("ready", flush=True)
echoer(b)
"#;

impl Lab {
    /// The Python peer ([`PEER`]) on the Linux host at 10.77.0.1: it resets
    /// every connection to `reset_port` and echoes on `echo_port`; returned
    /// once it listens.
    pub fn linux_echo_peer(&self, reset_port: u16, echo_port: u16) -> Daemon {
        let script = self.path("peer.py");
        std::fs::write(&script, PEER).unwrap();
        let mut peer = self.linux_daemon(&[
            PYTHON,
            &script.display().to_string(),
            "10.77.0.1",
            &reset_port.to_string(),
            &echo_port.to_string(),
        ]);
        use std::io::BufRead;
        let out = peer.child.as_mut().unwrap().stdout.take().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(out).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "the peer did not start");
        peer
    }
}

/// redis-server without persistence on ustack (its dump directory in the
/// lab), answering PING.
pub fn start_redis(lab: &Lab) -> (Preloaded, PathBuf) {
    let dir = lab.path("redis");
    std::fs::create_dir(&dir).unwrap();
    let dir_s = dir.display().to_string();
    let server = lab.start(
        Host::Stack,
        false,
        &[
            "redis-server",
            "--port",
            "6379",
            "--bind",
            "10.77.0.2",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--dir",
            &dir_s,
        ],
    );
    lab.wait_arp("10.77.0.2");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !lab
        .linux(&["redis-cli", "-h", "10.77.0.2", "ping"])
        .stdout
        .starts_with(b"PONG")
    {
        assert!(
            Instant::now() < deadline,
            "redis-server never answered PING"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (server, dir)
}
