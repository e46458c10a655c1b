//! Every example run against Linux, in network namespaces the test makes
//! and removes itself (`tools/netns.sh`: `TAG-linux` with 10.77.0.1 on
//! `TAG-l`, `TAG-stack` with `TAG-s` and no kernel address, where the
//! example runs as 10.77.0.2):
//!
//! - `echo-server` and `async-echo` echo Linux `nc` connections byte-exact
//!   (SHA-256 of a few MiB each way);
//! - `http-get` fetches a few MiB from `python3 -m http.server` (same hash),
//!   and a missing file exits 1;
//! - `udp-echo` returns every datagram of a Python client, fragmented ones
//!   included;
//! - `ud-ping` gets a pong for every ping from `ustack run`'s UD responder
//!   (10.77.0.3 on the Linux side's veth, through libpcap);
//! - `multicore-echo` on two cores (DPDK `net_af_packet` with two queue
//!   pairs, no hugepages) echoes parallel connections byte-exact, each core
//!   serving some.
//!
//! Needs root, `nc`, `arping` and `python3`; the pcap tests need the
//! `pcap` feature and the multi-core one `dpdk` (`--all-features` has
//! both). A test that cannot run says why through `ustack_test_skip` (a
//! failure under `CI=true`, else listed by tools/test.sh). Bad input to any
//! example gives one error line and status 2 (no root needed).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

// ---------------------------------------------------------------- set-up

/// One namespace test at a time: they share two small cores with the
/// stacks' poll loops.
static SERIAL: Mutex<()> = Mutex::new(());

fn root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout == b"0\n")
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The test's turn, or `None` after saying why it cannot run here:
/// not root, the examples built without `feature`, a program missing.
fn may_run(feature: &str, built: bool, programs: &[&str]) -> Option<MutexGuard<'static, ()>> {
    if !root() {
        ustack_test_skip::skip_test!("network namespaces need root");
    }
    if !built {
        ustack_test_skip::skip_test!(
            "the examples were built without the `{feature}` feature \
             (cargo test -p ustack-examples --features {feature})"
        );
    }
    if let Some(p) = programs.iter().find(|p| !have(p)) {
        ustack_test_skip::skip_test!("{p} is not installed");
    }
    Some(SERIAL.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The two namespaces and their veth pair; removed on drop (declare it
/// before the processes that run in it, so they are killed first).
struct Topo {
    tag: String,
}

impl Topo {
    fn up(short: &str) -> Topo {
        let topo = Topo {
            tag: format!("{short}{}", std::process::id() % 10_000),
        };
        let out = Command::new(netns_sh())
            .args(["up", &topo.tag])
            .output()
            .expect("run tools/netns.sh");
        assert!(
            out.status.success(),
            "netns.sh up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        topo
    }

    fn ns(&self, side: &str) -> String {
        format!("{}-{side}", self.tag)
    }

    /// The veth end in the stack namespace (no kernel address).
    fn stack_if(&self) -> String {
        format!("{}-s", self.tag)
    }

    /// The veth end in the Linux namespace (10.77.0.1).
    fn linux_if(&self) -> String {
        format!("{}-l", self.tag)
    }

    /// A command in one namespace.
    fn cmd(&self, side: &str, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(side), program]);
        c
    }

    /// Run a command on the Linux host and wait for it.
    fn linux(&self, args: &[&str]) -> Output {
        self.cmd("linux", args[0])
            .args(&args[1..])
            .output()
            .expect("run in the Linux namespace")
    }

    /// An example in the stack namespace as 10.77.0.2 on its veth (pcap).
    fn example(&self, exe: &str, args: &[&str]) -> Command {
        let mut c = self.cmd("stack", exe);
        c.args(["--pcap", &self.stack_if(), "--ip", "10.77.0.2/24"]);
        c.args(args);
        c
    }

    /// Wait until 10.77.0.2 answers the Linux host's ARP.
    fn wait_arp(&self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        let iface = self.linux_if();
        while !(self.linux(&["arping", "-c", "1", "-w", "1", "-I", &iface, "10.77.0.2"]))
            .status
            .success()
        {
            assert!(Instant::now() < deadline, "10.77.0.2 never answered ARP");
        }
    }
}

impl Drop for Topo {
    fn drop(&mut self) {
        let _ = Command::new(netns_sh()).args(["down", &self.tag]).output();
    }
}

fn netns_sh() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/netns.sh")
}

/// A process that runs until stopped; killed on drop (a failing test
/// leaves nothing running).
struct Daemon(Option<Child>);

impl Daemon {
    fn spawn(mut cmd: Command) -> Daemon {
        let child = (cmd.stdout(Stdio::piped()).stderr(Stdio::piped()))
            .spawn()
            .expect("start the process");
        Daemon(Some(child))
    }

    /// SIGTERM (what Ctrl-C would do), then (exit code, stdout, stderr).
    fn stop(mut self) -> (i32, String, String) {
        let child = self.0.take().expect("running");
        // `ip netns exec` execs the program: the pid is the program's.
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let out = child.wait_with_output().expect("wait for the process");
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (
            out.status.code().unwrap_or(-1),
            text(&out.stdout),
            text(&out.stderr),
        )
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Seeded bytes, the same on every run.
fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| rng.u8(..)).collect()
}

fn sha256(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// `conns` parallel `nc` connections from the Linux host to 10.77.0.2:`port`,
/// each sending `bytes` and reading the echo: the connections whose echo
/// differs, as (index, bytes back).
fn nc_echo(topo: &Topo, port: u16, conns: usize, bytes: usize) -> Vec<(usize, usize)> {
    let dir = tempfile::tempdir().unwrap();
    let mut script = String::new();
    for i in 0..conns {
        std::fs::write(dir.path().join(format!("in{i}")), data(bytes, i as u64)).unwrap();
        script += &format!(
            "nc -N -w 30 10.77.0.2 {port} < {d}/in{i} > {d}/out{i} & ",
            d = dir.path().display()
        );
    }
    script += "wait";
    let nc = topo.linux(&["sh", "-c", &script]);
    assert!(
        nc.status.success(),
        "nc: {}",
        String::from_utf8_lossy(&nc.stderr)
    );
    (0..conns)
        .filter_map(|i| {
            let back = std::fs::read(dir.path().join(format!("out{i}"))).unwrap_or_default();
            (sha256(&back) != sha256(&data(bytes, i as u64))).then_some((i, back.len()))
        })
        .collect()
}

fn no_crash(stderr: &str) {
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("backtrace"), "{stderr}");
}

// ----------------------------------------------------------------- tests

#[test]
fn echo_server_echoes_linux_nc_byte_exact() {
    let Some(_turn) = may_run("pcap", cfg!(feature = "pcap"), &["nc", "arping"]) else {
        return;
    };
    let topo = Topo::up("xe");
    let server = Daemon::spawn(topo.example(env!("CARGO_BIN_EXE_echo-server"), &[]));
    topo.wait_arp();
    const BYTES: usize = 2 << 20;
    let differ = nc_echo(&topo, 7, 2, BYTES);
    let (code, out, err) = server.stop();
    assert_eq!(
        differ,
        vec![],
        "echoes (index, bytes back) differ: {out}{err}"
    );
    assert_eq!(code, 0, "{out}{err}");
    no_crash(&err);
    let total = 2 * BYTES;
    assert!(
        out.contains(&format!("2 connections, {total} bytes echoed")),
        "{out}"
    );
}

#[test]
fn async_echo_echoes_parallel_linux_connections_byte_exact() {
    let Some(_turn) = may_run("pcap", cfg!(feature = "pcap"), &["nc", "arping"]) else {
        return;
    };
    let topo = Topo::up("xa");
    let server = Daemon::spawn(topo.example(env!("CARGO_BIN_EXE_async-echo"), &["--port", "7007"]));
    topo.wait_arp();
    const CONNS: usize = 4;
    const BYTES: usize = 1 << 20;
    let differ = nc_echo(&topo, 7007, CONNS, BYTES);
    let (code, out, err) = server.stop();
    assert_eq!(
        differ,
        vec![],
        "echoes (index, bytes back) differ: {out}{err}"
    );
    assert_eq!(code, 0, "{out}{err}");
    no_crash(&err);
    let total = CONNS * BYTES;
    assert!(
        out.contains(&format!("{CONNS} connections, {total} bytes echoed")),
        "{out}"
    );
}

#[test]
fn http_get_fetches_a_file_from_python_http_server() {
    let Some(_turn) = may_run("pcap", cfg!(feature = "pcap"), &["nc", "python3"]) else {
        return;
    };
    let topo = Topo::up("xh");
    let dir = tempfile::tempdir().unwrap();
    const BYTES: usize = 3 << 20;
    let file = data(BYTES, 42);
    std::fs::write(dir.path().join("blob.bin"), &file).unwrap();
    let dir_arg = dir.path().display().to_string();
    let mut http = topo.cmd("linux", "python3");
    http.args(["-m", "http.server", "8000", "--bind", "10.77.0.1"])
        .args(["--directory", &dir_arg])
        .stdin(Stdio::null());
    let _server = Daemon::spawn(http);
    let deadline = Instant::now() + Duration::from_secs(15);
    while !(topo.linux(&["nc", "-z", "-w", "1", "10.77.0.1", "8000"]))
        .status
        .success()
    {
        assert!(
            Instant::now() < deadline,
            "python3 -m http.server did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let get = |path: &str| {
        (topo.example(env!("CARGO_BIN_EXE_http-get"), &[]))
            .arg(format!("http://10.77.0.1:8000{path}"))
            .output()
            .expect("run http-get")
    };
    let ok = get("/blob.bin");
    let err = String::from_utf8_lossy(&ok.stderr);
    assert_eq!(ok.status.code(), Some(0), "{err}");
    assert!(err.starts_with("HTTP/1.0 200"), "{err}");
    assert_eq!(ok.stdout.len(), BYTES, "{err}");
    assert_eq!(sha256(&ok.stdout), sha256(&file), "the body differs");
    no_crash(&err);

    let missing = get("/missing");
    let err = String::from_utf8_lossy(&missing.stderr);
    assert_eq!(missing.status.code(), Some(1), "{err}");
    assert!(err.starts_with("HTTP/1.0 404"), "{err}");
    no_crash(&err);
}

/// Datagrams of many sizes, some above the MTU (fragmented both ways),
/// each waited for and compared.
const UDP_CLIENT: &str = r#"
import os, socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
sizes = [1 + (i * 97) % 1472 for i in range(190)] + [0, 1472, 1473, 2000, 3000, 4000, 5000, 8000, 9000, 16000]
ok = 0
for n in sizes:
    m = os.urandom(n)
    s.sendto(m, ("10.77.0.2", 7))
    try:
        d, _ = s.recvfrom(65535)
        ok += d == m
    except socket.timeout:
        pass
print(ok, len(sizes))
"#;

#[test]
fn udp_echo_returns_every_datagram_of_a_python_client() {
    let Some(_turn) = may_run("pcap", cfg!(feature = "pcap"), &["python3", "arping"]) else {
        return;
    };
    let topo = Topo::up("xu");
    let server = Daemon::spawn(topo.example(env!("CARGO_BIN_EXE_udp-echo"), &[]));
    topo.wait_arp();
    let client = topo.linux(&["python3", "-c", UDP_CLIENT]);
    let got = String::from_utf8_lossy(&client.stdout).trim().to_string();
    let (code, out, err) = server.stop();
    assert!(
        client.status.success(),
        "{}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert_eq!(got, "200 200", "echoed / sent; {out}{err}");
    assert_eq!(code, 0, "{out}{err}");
    no_crash(&err);
    assert!(out.contains("200 datagrams"), "{out}");
}

/// `ustack run` (the apps package), found next to this test's binaries as
/// `cargo test --workspace` and tools/test.sh build it.
fn ustack_bin() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.parent()?.join("ustack");
    bin.is_file().then_some(bin)
}

#[test]
fn ud_ping_gets_pongs_from_ustack_runs_responder() {
    let Some(_turn) = may_run("pcap", cfg!(feature = "pcap"), &[]) else {
        return;
    };
    let Some(ustack) = ustack_bin() else {
        ustack_test_skip::skip_test!(
            "the ustack binary (the responder) is not built next to this test: \
             cargo build -p ustack-apps --features pcap, or cargo test --workspace --all-features"
        );
    };
    let topo = Topo::up("xd");
    // The responder: a second ustack as 10.77.0.3 on the Linux side's veth
    // (libpcap takes its own MAC there; the kernel keeps 10.77.0.1). Its
    // banner line says the port is open.
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut run = topo.cmd("linux", &ustack.display().to_string());
    run.args(["run", "--pcap", &topo.linux_if(), "--ip", "10.77.0.3/24"])
        .stdout(log.reopen().unwrap())
        .stderr(Stdio::piped());
    let mut responder = Daemon(Some(run.spawn().expect("start ustack run")));
    let deadline = Instant::now() + Duration::from_secs(15);
    while !std::fs::read_to_string(log.path())
        .unwrap_or_default()
        .contains("RDMA UD responder")
    {
        if let Some(status) = responder
            .0
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
        {
            let (_, _, err) = responder.stop();
            if err.contains("no pcap backend") {
                ustack_test_skip::skip_test!("{} was built without pcap", ustack.display());
            }
            panic!("ustack run exited ({status}): {err}");
        }
        assert!(Instant::now() < deadline, "ustack run did not start");
        std::thread::sleep(Duration::from_millis(50));
    }

    let ping = (topo.example(env!("CARGO_BIN_EXE_ud-ping"), &[]))
        .args(["-c", "5", "-i", "0.2", "-W", "2", "10.77.0.3"])
        .output()
        .expect("run ud-ping");
    let out = String::from_utf8_lossy(&ping.stdout);
    let err = String::from_utf8_lossy(&ping.stderr);
    assert_eq!(ping.status.code(), Some(0), "{out}{err}");
    assert_eq!(out.matches(" ud_seq=").count(), 5, "{out}");
    assert!(out.contains("5 sent, 5 received, 0% loss"), "{out}");
    assert!(out.contains("rtt min/avg/max = "), "{out}");
    no_crash(&err);

    let (code, _, err) = responder.stop();
    let log = std::fs::read_to_string(log.path()).unwrap_or_default();
    assert_eq!(code, 0, "{log}{err}");
    assert!(log.contains("5 pings answered"), "{log}");
}

#[test]
fn multicore_echo_serves_parallel_connections_on_two_cores() {
    let Some(_turn) = may_run("dpdk", cfg!(feature = "dpdk"), &["nc", "arping"]) else {
        return;
    };
    if std::thread::available_parallelism().map_or(0, |n| n.get()) < 2 {
        ustack_test_skip::skip_test!("two cores are needed");
    }
    let topo = Topo::up("xm");
    // DPDK without hugepages or PCI: net_af_packet on the veth, two queue
    // pairs (the kernel spreads flows over them); the EAL gets its own
    // --file-prefix per process.
    let eal = format!(
        "--no-huge -m 256 --no-pci --vdev=net_af_packet0,iface={},qpairs=2",
        topo.stack_if()
    );
    let mut cmd = topo.cmd("stack", env!("CARGO_BIN_EXE_multicore-echo"));
    cmd.args([
        "--dpdk",
        &eal,
        "--ip",
        "10.77.0.2/24",
        "--cores",
        "0,1",
        "--backoff",
    ]);
    let server = Daemon::spawn(cmd);
    topo.wait_arp();
    const CONNS: usize = 16;
    const BYTES: usize = 256 << 10;
    let differ = nc_echo(&topo, 7, CONNS, BYTES);
    let (code, out, err) = server.stop();
    assert_eq!(
        differ,
        vec![],
        "echoes (index, bytes back) differ: {out}{err}"
    );
    assert_eq!(code, 0, "{out}{err}");
    no_crash(&err);
    // "multicore-echo: core N: C connections, B bytes echoed", one per core.
    let cores: Vec<(u64, u64)> = (out.lines())
        .filter(|l| l.starts_with("multicore-echo: core "))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w[3].parse().unwrap(), w[5].parse().unwrap())
        })
        .collect();
    assert_eq!(cores.len(), 2, "{out}");
    assert!(
        cores.iter().all(|&(c, _)| c > 0),
        "a core served nothing: {out}"
    );
    assert_eq!(
        cores.iter().map(|c| c.0).sum::<u64>(),
        CONNS as u64,
        "{out}"
    );
    assert_eq!(
        cores.iter().map(|c| c.1).sum::<u64>(),
        (CONNS * BYTES) as u64,
        "{out}"
    );
}

/// A user's mistake is one line, `NAME: reason`, and exit status 2; no
/// namespace or root needed (each is caught before a backend opens).
#[test]
fn bad_input_is_one_error_line() {
    let ip = ["--ip", "10.77.0.2/24"];
    let cases: [(&str, &[&str], &str); 6] = [
        (env!("CARGO_BIN_EXE_echo-server"), &ip, "choose a backend"),
        (env!("CARGO_BIN_EXE_async-echo"), &ip, "choose a backend"),
        (env!("CARGO_BIN_EXE_udp-echo"), &ip, "choose a backend"),
        (
            env!("CARGO_BIN_EXE_http-get"),
            &[
                "--pcap",
                "lo",
                "--ip",
                "10.77.0.2/24",
                "http://example.com/",
            ],
            "not an IPv4 address",
        ),
        (
            env!("CARGO_BIN_EXE_ud-ping"),
            &[
                "--pcap",
                "lo",
                "--ip",
                "10.77.0.2/24",
                "-i",
                "0",
                "10.77.0.3",
            ],
            "-i 0: give a positive number of seconds",
        ),
        (
            env!("CARGO_BIN_EXE_multicore-echo"),
            &["--pcap", "lo", "--ip", "10.77.0.2/24", "--cores", "0,1"],
            "several cores need DPDK",
        ),
    ];
    for (exe, args, why) in cases {
        let out = Command::new(exe).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let name = Path::new(exe).file_name().unwrap().to_string_lossy();
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        assert!(err.starts_with(&format!("{name}: ")), "{err}");
        assert!(err.contains(why), "{name}: {err}");
        no_crash(&err);
    }
    // A malformed flag value is clap's usage error, also status 2.
    let out = Command::new(env!("CARGO_BIN_EXE_echo-server"))
        .args(["--pcap", "lo", "--ip", "10.77.0.300/24"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("'10.77.0.300' is not an IPv4 address"),
        "{err}"
    );
    no_crash(&err);
}
