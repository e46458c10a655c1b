//! Calls and options of the LD_PRELOAD layer under `ustack exec`, against
//! Linux in namespaces made by each test (the topology of
//! netns_preload.rs): bad input gets the errno Linux gives, keepalive and
//! `TCP_USER_TIMEOUT` against a silent peer, shells and wrappers hand the
//! stack on, a program that closes every descriptor keeps its stack, DNS
//! servers (dnsmasq, unbound), `sendmmsg`/`recvmmsg` with `IP_PKTINFO`,
//! `SHUT_RD`, and every socket option of the README's table.
//!
//! The tests take turns (one lock) and find the library as
//! netns_preload.rs says.

#[macro_use]
mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use common::lab::*;
use common::{Daemon, json_lines, stdout_json};

/// One test at a time: each loads the machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

// ------------------------------------------------------------ bad input

/// Each case's outcome as one JSON object: "ok", a value, or the errno's
/// name.
const BAD_INPUT: &str = r#"
import errno, json, select, socket, sys, time
peer, reset_port, echo_port, closed_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
out = {}

def name(e):
    if e == errno.EOPNOTSUPP:
        return "EOPNOTSUPP"
    return errno.errorcode.get(e, str(e)) if e else "0"

def attempt(key, f):
    try:
        r = f()
        out[key] = "ok" if r is None else r
    except OSError as e:
        out[key] = name(e.errno)

# Socket options: one no kernel knows, twice (reported once), and
# TCP_CONGESTION cubic (accepted: the stack's algorithms are cubic and reno).
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
attempt("setsockopt_unknown", lambda: s.setsockopt(socket.IPPROTO_TCP, 9999, 1))
attempt("setsockopt_unknown_again", lambda: s.setsockopt(socket.IPPROTO_TCP, 9999, 1))
attempt("getsockopt_unknown", lambda: s.getsockopt(socket.SOL_SOCKET, 9999) and None)
attempt("setsockopt_congestion", lambda: s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"cubic"))
s.close()

# AF_INET6 with no IPv6 address in the namespaces: no source address.
attempt("inet6_socket", lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close())
s6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
attempt("inet6_connect", lambda: s6.connect(("2001:db8::1", 80)))
s6.close()

# A non-blocking connect: EINPROGRESS, then writable with SO_ERROR 0.
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setblocking(False)
out["nonblock_connect"] = name(s.connect_ex((peer, echo_port)))
_, w, _ = select.select([], [s], [], 5)
out["nonblock_select_writable"] = bool(w)
out["nonblock_so_error"] = name(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
p = select.poll()
p.register(s, select.POLLOUT)
out["nonblock_poll"] = [ev for _, ev in p.poll(5000)]
s.setblocking(True)
s.sendall(b"x")
out["echo"] = s.recv(10).decode()
# MSG_PEEK on TCP.
s.sendall(b"peek")
time.sleep(0.3)
attempt("msg_peek", lambda: s.recv(10, socket.MSG_PEEK).decode())
attempt("after_peek", lambda: s.recv(10).decode())
s.close()

# bind, then connect: the bound port is the connection's.
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 47123))
s.connect((peer, echo_port))
out["bound_connect_port"] = s.getsockname()[1]
s.sendall(b"b")
out["bound_connect_echo"] = s.recv(10).decode()
s2 = socket.socket()
s2.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s2.bind(("0.0.0.0", 47123))
attempt("bound_connect_same_flow", lambda: s2.connect((peer, echo_port)))
s2.close()
s.close()

# A closed port: ECONNREFUSED, blocking and not.
s = socket.socket()
attempt("connect_closed", lambda: s.connect((peer, closed_port)))
s.close()
s = socket.socket()
s.setblocking(False)
out["nonblock_connect_closed"] = name(s.connect_ex((peer, closed_port)))
select.select([], [s], [], 5)
out["nonblock_closed_so_error"] = name(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
s.close()

# A peer that resets mid-request.
s = socket.socket()
s.connect((peer, reset_port))
s.sendall(b"GET / HTTP/1.0\r\n")
attempt("reset_recv", lambda: s.recv(100))
attempt("reset_send_after", lambda: s.send(b"more"))
s.close()

print(json.dumps(out), flush=True)
"#;

/// Non-blocking UDP sends of 65,000-byte datagrams, faster than any link
/// drains them: how many were taken and how many failed with EAGAIN.
const UDP_FLOOD: &str = r#"
import errno, json, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
# The socket started the stack: one datagram resolves the peer's MAC, and
# the pause gives the test's telemetry reader time to attach (the flood
# itself is over in a fraction of a second, and the socket goes with the
# program).
s.sendto(b"hello", (sys.argv[1], 9))
time.sleep(0.5)
s.setblocking(False)
data = b"u" * 65000
sent = eagain = 0
worst = 0.0
# Whether a sender outruns the port is up to the scheduler: go on (up to
# 20,000 datagrams) until the queue was found full at least once.
for i in range(20000):
    if eagain and i >= 2000:
        break
    t = time.monotonic()
    try:
        s.sendto(data, (sys.argv[1], 9))
        sent += 1
    except BlockingIOError:
        eagain += 1
    worst = max(worst, time.monotonic() - t)
print(json.dumps({"sent": sent, "eagain": eagain, "worst_ms": worst * 1000}), flush=True)
"#;

/// The bad-input script's results under ustack (10.77.0.2) and, for
/// reference, on the Linux kernel (10.77.0.1, its peer on the same host),
/// and the ustack run's stderr.
fn bad_input_results(short: &str) -> (Value, Value, String) {
    let lab = Lab::new(short, preload_lib().expect("the library"));
    let script = lab.path("bad.py");
    std::fs::write(&script, BAD_INPUT).unwrap();
    let script = script.display().to_string();
    let peer = lab.linux_echo_peer(7001, 7002);
    let args = ["10.77.0.1", "7001", "7002", "7003"];
    let o = lab.linux(&[&[PYTHON, &script][..], &args].concat());
    let linux = stdout_json("bad input on Linux", &o.stdout, &o.stderr);
    let end = lab.run(Host::Stack, &[&[PYTHON, &script][..], &args].concat());
    end.check(0);
    let ours = stdout_json(
        "bad input on ustack",
        end.out.as_bytes(),
        end.err.as_bytes(),
    );
    drop(peer);
    // The refusals are counted in the stack's telemetry too, and every
    // ustack descriptor was closed by the end.
    let last = end.last.as_ref().expect("a last telemetry line");
    let refused = last["app"]["preload_unsupported"].as_u64();
    assert!(refused.is_some_and(|n| n >= 3), "app counters: {last}");
    assert_eq!(last["app"]["preload_descriptors"], 0, "{last}");
    (ours, linux, end.err)
}

/// Bad input from an unmodified Python program: the errno Linux gives.
#[test]
fn bad_input_gets_the_errno_linux_gives() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let _ = need_preload!();
    let (ours, linux, err) = bad_input_results("pb");
    eprintln!("ustack: {ours}\nLinux:  {linux}");
    let want = [
        // An option no kernel knows: ENOPROTOOPT, as Linux.
        ("setsockopt_unknown", "ENOPROTOOPT"),
        ("setsockopt_unknown_again", "ENOPROTOOPT"),
        ("getsockopt_unknown", "ENOPROTOOPT"),
        // AF_INET6 (ustack's): the socket opens, and connect fails as on
        // Linux (no IPv6 address in the namespaces: EADDRNOTAVAIL).
        ("inet6_socket", "ok"),
        ("nonblock_connect", "EINPROGRESS"),
        ("nonblock_so_error", "0"),
        ("echo", "x"),
        ("connect_closed", "ECONNREFUSED"),
        ("nonblock_connect_closed", "EINPROGRESS"),
        ("nonblock_closed_so_error", "ECONNREFUSED"),
        ("reset_recv", "ECONNRESET"),
        ("bound_connect_echo", "b"),
        // The same 4-tuple twice: Linux says EADDRNOTAVAIL.
        ("bound_connect_same_flow", "EADDRNOTAVAIL"),
    ];
    for (key, value) in want {
        assert_eq!(ours[key], value, "ustack {key}: {ours}");
        assert_eq!(linux[key], value, "Linux {key}: {linux}");
    }
    assert_eq!(
        ours["inet6_connect"], linux["inet6_connect"],
        "{ours} vs {linux}"
    );
    assert_eq!(ours["inet6_connect"], "EADDRNOTAVAIL", "{ours}");
    assert_eq!(ours["bound_connect_port"], 47123, "{ours}");
    assert_eq!(linux["bound_connect_port"], 47123, "{linux}");
    assert_eq!(ours["nonblock_select_writable"], true, "{ours}");
    // POLLOUT (4) alone.
    assert_eq!(ours["nonblock_poll"], serde_json::json!([4]), "{ours}");
    assert_eq!(
        ours["nonblock_poll"], linux["nonblock_poll"],
        "{ours} vs {linux}"
    );
    // TCP_CONGESTION cubic is accepted, as on Linux (the README's table).
    assert_eq!(ours["setsockopt_congestion"], "ok", "{ours}");
    assert_eq!(linux["setsockopt_congestion"], "ok", "{linux}");
    // MSG_PEEK on TCP leaves the bytes for the next read, as Linux does.
    assert_eq!(linux["msg_peek"], "peek", "{linux}");
    assert_eq!(ours["msg_peek"], linux["msg_peek"], "{ours}");
    assert_eq!(ours["after_peek"], linux["after_peek"], "{ours} vs {linux}");
    assert_eq!(linux["after_peek"], "peek", "{linux}");
    // Each refusal said once on stderr.
    let said = |what: &str| err.lines().filter(|l| l.contains(what)).count();
    assert_eq!(said("IPPROTO_TCP/9999 (ENOPROTOOPT)"), 1, "{err}");
    assert_eq!(said("SOL_SOCKET/9999 (ENOPROTOOPT)"), 1, "{err}");
}

/// After recv reported the reset, Linux says EPIPE on the next send (the
/// error is reported once; the socket is then closed).
#[test]
fn send_after_a_reported_reset_gives_epipe() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let _ = need_preload!();
    let (ours, linux, _) = bad_input_results("pe");
    assert_eq!(linux["reset_send_after"], "EPIPE", "{linux}");
    assert_eq!(
        ours["reset_send_after"], linux["reset_send_after"],
        "{ours}"
    );
}

/// A non-blocking UDP socket whose send queue is full: EAGAIN. (With
/// `--spin 0`: run to completion sends each datagram within its own
/// `sendto`, and a queue that never fills says nothing.)
#[test]
fn udp_full_send_queue_nonblocking_gives_eagain() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("pu", need_preload!());
    lab.spin.set(Some(0));
    let script = lab.path("udp.py");
    std::fs::write(&script, UDP_FLOOD).unwrap();
    let end = lab.run(
        Host::Stack,
        &[PYTHON, &script.display().to_string(), "10.77.0.1"],
    );
    end.check(0);
    let r = stdout_json("udp flood", end.out.as_bytes(), end.err.as_bytes());
    eprintln!("non-blocking UDP flood on ustack: {r}");
    assert!(r["eagain"].as_u64().unwrap() > 0, "no EAGAIN: {r}");
}

// ------------------------------------------------------------ silent peers

/// A client script against an echo peer (`PEER`, on ustack) that falls
/// silent: both scripts written to the lab, and the peer's two ports.
struct SilentPeer<'a> {
    lab: &'a Lab,
    peer_py: String,
    client_py: String,
    ports: [&'static str; 2],
}

impl<'a> SilentPeer<'a> {
    /// Write `PEER` and the client script `client` (as file `name`).
    fn new(lab: &'a Lab, client: &str, name: &str, ports: [&'static str; 2]) -> Self {
        let peer_py = lab.path("peer.py");
        std::fs::write(&peer_py, PEER).unwrap();
        let client_py = lab.path(name);
        std::fs::write(&client_py, client).unwrap();
        SilentPeer {
            lab,
            peer_py: peer_py.display().to_string(),
            client_py: client_py.display().to_string(),
            ports,
        }
    }

    /// An echo server on ustack at `ip` (`host`), answering "ready".
    fn start(&self, host: Host, ip: &str) -> Preloaded {
        let [p1, p2] = self.ports;
        let program = [PYTHON, &self.peer_py, ip, p1, p2];
        let mut peer = self.lab.start_with(host, false, false, &program);
        use std::io::BufRead;
        let out = peer.daemon.child.as_mut().unwrap().stdout.take().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(out).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "the peer did not start");
        peer
    }
}

/// Wait for the client's marker, silence the peer (SIGSTOP) until the
/// client has ended (`ended`), then end the peer.
fn silence_peer_while(peer: Preloaded, marker: &Path, ended: &mut dyn FnMut() -> bool) {
    let signal = |sig: &str| {
        let ok = Command::new("kill")
            .args([sig, &peer.pid().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} the peer");
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !marker.exists() {
        assert!(Instant::now() < deadline, "the client never got going");
        std::thread::sleep(Duration::from_millis(20));
    }
    signal("-STOP");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ended() {
        if Instant::now() >= deadline {
            signal("-CONT");
            panic!("the client still waits 60 s after its peer fell silent");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    signal("-CONT");
    drop(peer);
}

// ------------------------------------------------------------ keepalive

/// Connect, check the echo, turn keepalive on (1 s idle, 1 s between
/// probes, 2 probes), leave a marker file, then wait in `recv`: prints the
/// errno it ends with.
const KEEPALIVE: &str = r#"
import errno, json, socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
s.sendall(b"x")
assert s.recv(10) == b"x"
s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 2)
out = {"keepcnt": s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)}
open(sys.argv[3], "w").close()
t = time.monotonic()
try:
    out["recv"] = repr(s.recv(10))
except OSError as e:
    out["recv"] = errno.errorcode.get(e.errno, str(e.errno))
out["secs"] = round(time.monotonic() - t, 1)
print(json.dumps(out), flush=True)
"#;

/// Keepalive against a peer that falls silent (a ustack process stopped
/// with SIGSTOP: nothing answers, nothing resets): the blocked `recv`
/// fails with the errno Linux's own client gets, ETIMEDOUT, and the
/// probes are counted in telemetry.
#[test]
fn keepalive_times_out_a_silent_peer_as_linux_does() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("pk", need_preload!());
    let silent = SilentPeer::new(&lab, KEEPALIVE, "keepalive.py", ["7101", "7102"]);
    let client_py = silent.client_py.clone();
    // Linux's own client, from 10.77.0.1, to a peer at 10.77.0.2.
    let peer = silent.start(Host::Stack, "10.77.0.2");
    let marker = lab.path("linux.up");
    let mut linux = lab.linux_daemon(&[
        PYTHON,
        &client_py,
        "10.77.0.2",
        "7102",
        &marker.display().to_string(),
    ]);
    silence_peer_while(peer, &marker, &mut || {
        linux
            .child
            .as_mut()
            .unwrap()
            .try_wait()
            .is_ok_and(|s| s.is_some())
    });
    let (code, out, err) = linux.wait();
    assert_eq!(code, 0, "Linux client: {out}{err}");
    let linux = stdout_json("keepalive on Linux", out.as_bytes(), err.as_bytes());
    // The same program on ustack, from 10.77.0.2, to a peer at 10.77.0.3.
    let peer = silent.start(Host::LinuxSide, "10.77.0.3");
    let marker = lab.path("ustack.up");
    let mut ours = lab.start(
        Host::Stack,
        false,
        &[
            PYTHON,
            &client_py,
            "10.77.0.3",
            "7102",
            &marker.display().to_string(),
        ],
    );
    silence_peer_while(peer, &marker, &mut || ours.exited_within(Duration::ZERO));
    let end = ours.wait();
    end.check(0);
    let got = stdout_json(
        "keepalive on ustack",
        end.out.as_bytes(),
        end.err.as_bytes(),
    );
    eprintln!("keepalive: Linux {linux}, ustack {got}");
    assert_eq!(linux["recv"], "ETIMEDOUT", "{linux}");
    assert_eq!(got["recv"], linux["recv"], "{got}");
    assert_eq!(got["keepcnt"], 2, "{got}");
    let probes =
        end.last.as_ref().expect("telemetry")["stack"]["tcp"]["totals"]["keepalive_probes"]
            .as_u64()
            .unwrap_or(0);
    assert!(probes >= 2, "keepalive probes counted: {probes}");
}

// ------------------------------------------------------- wrappers and shells

/// Echo `LEN` bytes through the peer at ADDR:PORT, wait HOLD seconds, and
/// print one JSON line with their count and SHA-256 (`error`: the errno
/// name, if it failed).
const ECHO_CLIENT: &str = r#"
import errno, hashlib, json, socket, sys, time
want, hold = int(sys.argv[3]), float(sys.argv[4])
block = bytes(range(256)) * 256
h, sent, got = hashlib.sha256(), 0, 0
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
    while got < want:
        if sent < want:
            n = min(len(block), want - sent)
            s.sendall(block[:n])
            sent += n
        d = s.recv(1 << 16)
        if not d:
            break
        h.update(d)
        got += len(d)
    time.sleep(hold)
    s.close()
    print(json.dumps({"got": got, "sha256": h.hexdigest()}), flush=True)
except OSError as e:
    print(json.dumps({"error": errno.errorcode.get(e.errno, str(e))}), flush=True)
"#;

/// A shell or wrapper script that opens no AF_INET socket leaves the stack
/// to the programs it starts: `sh -c 'client; client'` runs both clients
/// on ustack, one after the other (each takes the stack at its first
/// socket and lets it go at exit). Two at once: the first runs the stack,
/// the other joins it; both on ustack.
#[test]
fn a_shell_hands_the_stack_to_the_programs_it_starts() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("ps", need_preload!());
    let client = lab.path("echo_client.py");
    std::fs::write(&client, ECHO_CLIENT).unwrap();
    let peer = lab.linux_echo_peer(7301, 7302);
    const LEN: usize = 1_000_000;
    let want = lab.pattern_sha256(LEN);
    let one = |hold: u32| format!("{PYTHON} {} 10.77.0.1 7302 {LEN} {hold}", client.display());
    // One after the other: both on ustack.
    let end = lab
        .start_with(
            Host::Stack,
            false,
            false,
            &["sh", "-c", &format!("{}; {}", one(0), one(0))],
        )
        .wait();
    end.check(0);
    let got = json_lines(&end.out);
    assert_eq!(got.len(), 2, "{}{}", end.out, end.err);
    for g in &got {
        assert_eq!(g["got"], LEN, "{g}: {}", end.err);
        assert_eq!(g["sha256"], want.as_str(), "{g}");
    }
    // At once: the second joins the first's stack.
    let end = lab
        .start_with(
            Host::Stack,
            false,
            false,
            // Each holds its connection 2 s: the other starts meanwhile.
            &["sh", "-c", &format!("{} & {}; wait", one(2), one(2))],
        )
        .wait();
    end.check(0);
    let got = json_lines(&end.out);
    assert_eq!(got.len(), 2, "{}{}", end.out, end.err);
    let ok = got.iter().filter(|g| g["sha256"] == want.as_str()).count();
    assert_eq!(ok, 2, "{got:?}: {}", end.err);
    assert!(
        !end.err.contains("runs on the kernel's sockets"),
        "{}",
        end.err
    );
    drop(peer);
}

// ------------------------------------------------- the stack's own descriptors

/// Close every descriptor the program did not open, as daemons and
/// OpenSSH do: first `close` each descriptor open at start (the stack's,
/// and any the test's own parents left inheritable) and `dup2` onto each
/// one that refused, then `close_range` (os.closerange), `closefrom`
/// (ctypes) and a `close` loop over every number, and print what is still
/// open; run with [`ECHO_CLIENT`] after it (the same arguments), which
/// then echoes `LEN` bytes through the peer.
const CLOSE_ALL: &str = r#"
import ctypes, errno, hashlib, json, os, socket, sys
def name(e):
    return errno.errorcode.get(e.errno, str(e.errno))
def open_fds():
    # The listing's own descriptor is closed by the time it returns.
    listed = sorted(int(x) for x in os.listdir("/proc/self/fd") if int(x) > 2)
    alive = []
    for fd in listed:
        try:
            os.fstat(fd)
            alive.append(fd)
        except OSError:
            pass
    return alive
# The first AF_INET socket starts the stack; its descriptors are the
# ones open now that were not before.
before = open_fds()
warm = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
start = [fd for fd in open_fds() if fd != warm.fileno()]
out = {"start": start, "new": [fd for fd in start if fd not in before], "close": [], "dup2": []}
null = os.open("/dev/null", os.O_RDONLY)
out["kept"] = []
for fd in start:
    try:
        os.close(fd)
        out["close"].append("ok")
        continue
    except OSError as e:
        out["close"].append(name(e))
    out["kept"].append(fd)
    try:
        os.dup2(null, fd)
        out["dup2"].append("ok")
    except OSError as e:
        out["dup2"].append(name(e))
os.close(null)
os.closerange(3, 1 << 20)
ctypes.CDLL(None).closefrom(3)
for fd in range(3, 256):
    try:
        os.close(fd)
    except OSError:
        pass
out["after"] = open_fds()
print(json.dumps(out), flush=True)
"#;

/// A program that closes every descriptor it did not open (OpenSSH's
/// `closefrom(3)`, Python's `os.closerange`, a daemon's close loop) keeps
/// its stack: the stack's own descriptors (its NIC's, telemetry's) refuse
/// `close` and `dup2`, survive `close_range` and `closefrom`, and TCP
/// still carries every byte. Stock ssh, run the same way, then gets the
/// Linux kernel's refusal instead of EIO from a stack whose NIC it closed.
#[test]
fn closing_every_descriptor_leaves_the_stack_its_own() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("pd", need_preload!());
    let script = lab.path("close_all.py");
    std::fs::write(&script, format!("{CLOSE_ALL}{ECHO_CLIENT}")).unwrap();
    let peer = lab.linux_echo_peer(7201, 7202);
    const LEN: usize = 3_000_000;
    // Without telemetry: a telemetry client's connection is opened after
    // the stack starts and is not kept from the program (README).
    let end = lab
        .start_with(
            Host::Stack,
            false,
            false,
            &[
                PYTHON,
                &script.display().to_string(),
                "10.77.0.1",
                "7202",
                &LEN.to_string(),
                "0",
            ],
        )
        .wait();
    end.check(0);
    let [r, echoed] = &json_lines(&end.out)[..] else {
        panic!("two result lines: {}{}", end.out, end.err);
    };
    eprintln!("closing every descriptor on ustack: {r}");
    // The stack's own (at least its NIC's socket: the descriptors its
    // start opened) refused, the rest closed.
    let kept = r["kept"].as_array().expect("kept").clone();
    assert!(!kept.is_empty(), "no descriptor refused close: {r}");
    assert_eq!(r["new"], serde_json::Value::Array(kept.clone()), "{r}");
    let refusals = |key: &str, errno: &str| {
        r[key]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| *v == errno)
            .count()
    };
    assert_eq!(refusals("close", "EBADF"), kept.len(), "{r}");
    assert_eq!(refusals("dup2", "EBUSY"), kept.len(), "{r}");
    // close_range, closefrom and the loop left exactly those open.
    assert_eq!(r["after"], serde_json::Value::Array(kept), "{r}");
    assert_eq!(echoed["got"], LEN, "{echoed}");
    assert_eq!(echoed["sha256"], lab.pattern_sha256(LEN), "{echoed}");
    // Stock ssh: closefrom(3) first thing, then a connect to a port
    // nobody listens on.
    if Command::new("ssh").arg("-V").output().is_ok() {
        let end = lab
            .start_with(
                Host::Stack,
                false,
                false,
                &[
                    "ssh",
                    "-o",
                    "BatchMode=yes",
                    "-o",
                    "ConnectTimeout=10",
                    "root@10.77.0.1",
                    "true",
                ],
            )
            .wait();
        assert!(
            end.err.contains("Connection refused"),
            "ssh on ustack: {}",
            end.err
        );
    } else {
        ustack_test_skip::skip(
            "ssh is not installed (apt-get install openssh-client): its part left out",
        );
    }
    drop(peer);
}

// ------------------------------------------- calls and options (issue 33.3)

/// dnsmasq's default wildcard socket on ustack (`IP_PKTINFO`: the query's
/// destination and interface in `recvmsg`, the reply's source in
/// `sendmsg`) answers `dig` from the Linux host. Before: dnsmasq exited
/// at start (IP_PKTINFO: ENOPROTOOPT). Over TCP its wildcard listener
/// closes the connection: it looks the interface's address up in the
/// kernel's list, where the stack's is not (the README says so).
#[test]
fn dnsmasq_on_ustack_answers_dig() {
    need_root!();
    need_program!("dnsmasq", "dnsmasq");
    need_program!("dig", "bind9-dnsutils");
    let _turn = serial();
    let lab = Lab::new("pd", need_preload!());
    let pid = lab.path("dnsmasq.pid").display().to_string();
    let dnsmasq = lab.start_with(
        Host::Stack,
        false,
        false,
        &[
            "dnsmasq",
            "--no-daemon",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--address=/test.example/10.9.9.9",
            "--port",
            "53",
            "--user=root",
            &format!("--pid-file={pid}"),
        ],
    );
    lab.wait_arp("10.77.0.2");
    let dig = |args: &[&str]| {
        let o = lab.linux(
            &[
                &["dig", "@10.77.0.2", "+short", "+tries=1", "+time=2"][..],
                args,
            ]
            .concat(),
        );
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut udp = dig(&["www.test.example"]);
    while udp != "10.9.9.9" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        udp = dig(&["www.test.example"]);
    }
    let again = dig(&["mail.test.example"]);
    let mut d = dnsmasq;
    let running = !d.exited_within(Duration::ZERO);
    let end = d.stop();
    assert!(running, "dnsmasq ended: {}{}", end.out, end.err);
    assert_eq!(udp, "10.9.9.9", "dig; dnsmasq said: {}", end.err);
    assert_eq!(again, "10.9.9.9", "dig again; dnsmasq said: {}", end.err);
}

/// unbound on ustack answers from a local-data zone (UDP and TCP). Before:
/// it refused to start (IP_MTU_DISCOVER: ENOPROTOOPT).
#[test]
fn unbound_on_ustack_answers_from_local_data() {
    need_root!();
    need_program!("unbound", "unbound");
    need_program!("dig", "bind9-dnsutils");
    let _turn = serial();
    let lab = Lab::new("pu", need_preload!());
    let conf = lab.path("unbound.conf");
    std::fs::write(
        &conf,
        format!(
            "server:\n  interface: 10.77.0.2\n  port: 53\n  do-ip6: no\n  \
             do-daemonize: no\n  use-syslog: no\n  logfile: \"\"\n  chroot: \"\"\n  \
             username: \"\"\n  pidfile: \"\"\n  directory: \"{}\"\n  verbosity: 1\n  \
             access-control: 10.77.0.0/24 allow\n  local-zone: \"test.example.\" static\n  \
             local-data: \"host.test.example. IN A 10.9.9.8\"\n\
             remote-control:\n  control-enable: no\n",
            lab.dir.path().display()
        ),
    )
    .unwrap();
    let conf = conf.display().to_string();
    let mut unbound = lab.start_with(Host::Stack, false, false, &["unbound", "-d", "-c", &conf]);
    lab.wait_arp("10.77.0.2");
    let dig = |args: &[&str]| {
        let o = lab.linux(
            &[
                &["dig", "@10.77.0.2", "+short", "+tries=1", "+time=2"][..],
                args,
            ]
            .concat(),
        );
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut udp = dig(&["host.test.example"]);
    while udp != "10.9.9.8" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        udp = dig(&["host.test.example"]);
    }
    let tcp = dig(&["+tcp", "host.test.example"]);
    let running = !unbound.exited_within(Duration::ZERO);
    let end = unbound.stop();
    assert!(running, "unbound ended: {}{}", end.out, end.err);
    assert_eq!(udp, "10.9.9.8", "dig over UDP; unbound said: {}", end.err);
    assert_eq!(tcp, "10.9.9.8", "dig over TCP; unbound said: {}", end.err);
}

/// A UDP echo on the Linux host: every datagram back to its sender.
const UDP_ECHO: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    d, a = s.recvfrom(65536)
    s.sendto(d, a)
"#;

/// `sendmmsg` of eight datagrams of different sizes to the echo, then
/// `recvmmsg` (MSG_WAITFORONE) until all eight are back: each datagram's
/// length and SHA-256; then `IP_PKTINFO` on `recvmsg` (destination and
/// interface) and as a source on `sendmsg`.
const MMSG: &str = r#"
import ctypes, errno, hashlib, json, socket, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
class msghdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32),
                ("iov", ctypes.POINTER(iovec)), ("iovlen", ctypes.c_size_t),
                ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]
class mmsghdr(ctypes.Structure):
    _fields_ = [("hdr", msghdr), ("len", ctypes.c_uint)]
peer, port, iface = sys.argv[1], int(sys.argv[2]), sys.argv[3]
IP_PKTINFO = 8  # Python 3.11's socket module lacks the name
out = {}
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect((peer, port))
sizes = [1, 100, 512, 1000, 1472, 3000, 9000, 20000]
data = [bytes((i * 7 + j) & 255 for j in range(n)) for i, n in enumerate(sizes)]
want = [hashlib.sha256(d).hexdigest() for d in data]
N = len(data)
msgs = (mmsghdr * N)()
keep = []
for i, d in enumerate(data):
    b = ctypes.create_string_buffer(d, len(d))
    io = (iovec * 1)(iovec(ctypes.cast(b, ctypes.c_void_p), len(d)))
    keep += [b, io]
    msgs[i].hdr.iov = io
    msgs[i].hdr.iovlen = 1
sent = libc.sendmmsg(s.fileno(), msgs, N, 0)
out["sent"] = sent if sent >= 0 else errno.errorcode[ctypes.get_errno()]
out["sent_lens"] = [msgs[i].len for i in range(N)]
rmsgs = (mmsghdr * N)()
bufs = []
for i in range(N):
    b = ctypes.create_string_buffer(65536)
    io = (iovec * 1)(iovec(ctypes.cast(b, ctypes.c_void_p), 65536))
    bufs.append(b)
    keep.append(io)
    rmsgs[i].hdr.iov = io
    rmsgs[i].hdr.iovlen = 1
got, calls = [], 0
deadline = time.monotonic() + 10
while len(got) < N and time.monotonic() < deadline:
    n = libc.recvmmsg(s.fileno(), ctypes.byref(rmsgs), N - len(got), 0x10000, None)
    calls += 1
    if n < 0:
        out["recv_error"] = errno.errorcode[ctypes.get_errno()]
        break
    for i in range(n):
        got.append(bufs[i].raw[:rmsgs[i].len])
out["calls"] = calls
out["got_sha256"] = sorted(hashlib.sha256(g).hexdigest() for g in got)
out["want_sha256"] = sorted(want)
# IP_PKTINFO: the destination and the interface of a datagram received.
s.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
s.send(b"pktinfo")
d, anc, flags, addr = s.recvmsg(100, socket.CMSG_SPACE(12))
for level, ty, cd in anc:
    if level == socket.IPPROTO_IP and ty == IP_PKTINFO:
        idx, spec, dst = struct.unpack("i4s4s", cd[:12])
        out["pktinfo"] = [idx, socket.inet_ntoa(spec), socket.inet_ntoa(dst)]
out["ifindex"] = socket.if_nametoindex(iface)
out["pktinfo_data"] = d.decode()
# IP_PKTINFO as the source of a send: our address, or none.
me = s.getsockname()[0]
for name, src in [("send_ours", me), ("send_any", "0.0.0.0"), ("send_other", "10.77.0.99")]:
    info = struct.pack("i4s4s", 0, socket.inet_aton(src), socket.inet_aton("0.0.0.0"))
    try:
        s.sendmsg([name.encode()], [(socket.IPPROTO_IP, IP_PKTINFO, info)])
        s.settimeout(5)
        out[name] = s.recv(100).decode()
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e))
# IP_RECVERR: kept; the error queue is empty (Linux: EAGAIN).
s.setsockopt(socket.IPPROTO_IP, 11, 1)  # IP_RECVERR
s.setblocking(True)
try:
    s.recvmsg(100, 100, socket.MSG_ERRQUEUE)
    out["errqueue"] = "ok"
except OSError as e:
    out["errqueue"] = errno.errorcode.get(e.errno, str(e))
print(json.dumps(out), flush=True)
"#;

/// The Linux UDP echo at 10.77.0.1:`port`, returned once it listens.
fn linux_udp_echo(lab: &Lab, port: u16) -> Daemon {
    let script = lab.path("udp-echo.py");
    std::fs::write(&script, UDP_ECHO).unwrap();
    let mut echo = lab.linux_daemon(&[
        PYTHON,
        &script.display().to_string(),
        "10.77.0.1",
        &port.to_string(),
    ]);
    use std::io::BufRead;
    let out = echo.child.as_mut().unwrap().stdout.take().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(out).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "the UDP echo did not start");
    echo
}

/// sendmmsg and recvmmsg on ustack, byte-exact, and IP_PKTINFO both ways;
/// the same script on the Linux kernel gives the same answers. Before:
/// both calls went to the kernel with a ustack descriptor (ENOTSOCK).
#[test]
fn sendmmsg_recvmmsg_and_pktinfo_byte_exact() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("pm", need_preload!());
    let echo = linux_udp_echo(&lab, 7201);
    let script = lab.path("mmsg.py");
    std::fs::write(&script, MMSG).unwrap();
    let script = script.display().to_string();
    let stack_if = lab.topo.stack_if();
    let end = lab
        .start_with(
            Host::Stack,
            false,
            false,
            &[PYTHON, &script, "10.77.0.1", "7201", &stack_if],
        )
        .wait();
    drop(echo);
    end.check(0);
    let ours = stdout_json("mmsg on ustack", end.out.as_bytes(), end.err.as_bytes());
    eprintln!("ustack: {ours}");
    assert_eq!(ours["sent"], 8, "{ours}");
    assert_eq!(
        ours["sent_lens"],
        serde_json::json!([1, 100, 512, 1000, 1472, 3000, 9000, 20000]),
        "{ours}"
    );
    assert_eq!(ours["got_sha256"], ours["want_sha256"], "{ours}");
    assert!(ours.get("recv_error").is_none(), "{ours}");
    let ifindex = ours["ifindex"].as_i64().expect("ifindex");
    assert_eq!(
        ours["pktinfo"],
        serde_json::json!([ifindex, "10.77.0.2", "10.77.0.2"]),
        "{ours}"
    );
    assert_eq!(ours["pktinfo_data"], "pktinfo", "{ours}");
    assert_eq!(ours["send_ours"], "send_ours", "{ours}");
    assert_eq!(ours["send_any"], "send_any", "{ours}");
    // Linux says ENETUNREACH for a source that is not its own.
    assert_eq!(ours["send_other"], "ENETUNREACH", "{ours}");
    assert_eq!(ours["errqueue"], "EAGAIN", "{ours}");
}

/// After `shutdown(SHUT_RD)`: what is queued is read, then 0 at once from
/// recv, read, readv and recvmsg; poll and epoll say readable (POLLIN,
/// and POLLRDHUP); a connected UDP socket: EAGAIN without waiting, 0
/// instead of a wait (as Linux). Printed as JSON.
const SHUT_RD: &str = r#"
import errno, json, os, select, signal, socket, sys
out = {}
class Blocked(Exception):
    pass
def on_alarm(*_):
    raise Blocked()
signal.signal(signal.SIGALRM, on_alarm)
def attempt(name, f):
    try:
        out[name] = f()
    except (socket.timeout, Blocked):
        out[name] = "blocked"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e))
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
s.sendall(b"queued")
# Wait until the echo is back, unread, then shut reading.
p = select.poll()
p.register(s, select.POLLIN)
p.poll(5000)
import time; time.sleep(0.2)
s.shutdown(socket.SHUT_RD)
s.settimeout(3)
p = select.poll()
p.register(s, select.POLLIN | select.POLLRDHUP)
attempt("poll", lambda: [ev & (select.POLLIN | select.POLLRDHUP) for _, ev in p.poll(0)])
ep = select.epoll()
ep.register(s.fileno(), select.EPOLLIN | select.EPOLLRDHUP)
attempt("epoll", lambda: [ev & (select.EPOLLIN | select.EPOLLRDHUP) for _, ev in ep.poll(0)])
attempt("recv_queued", lambda: s.recv(100).decode())
attempt("recv", lambda: len(s.recv(100)))
attempt("read", lambda: len(os.read(s.fileno(), 100)))
attempt("readv", lambda: os.readv(s.fileno(), [bytearray(10)]))
attempt("recvmsg", lambda: len(s.recvmsg(100)[0]))
attempt("send_after", lambda: s.send(b"still writes"))
s.close()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
attempt("udp_unconnected", lambda: u.shutdown(socket.SHUT_RD))
u.connect((sys.argv[1], 9))
u.shutdown(socket.SHUT_RD)
# Linux: EAGAIN without waiting, 0 instead of a wait.
attempt("udp_recv_dontwait", lambda: len(u.recv(100, socket.MSG_DONTWAIT)))
signal.alarm(3)
attempt("udp_recv_blocking", lambda: len(u.recv(100)))
signal.alarm(0)
p = select.poll()
p.register(u, select.POLLIN)
attempt("udp_poll", lambda: [ev & select.POLLIN for _, ev in p.poll(0)])
print(json.dumps(out), flush=True)
"#;

/// shutdown(SHUT_RD) then read returns 0 at once, as on Linux (the same
/// script on the kernel's sockets gives the same answers). Before: the
/// read blocked ("blocked" after the script's 3 s timeout).
#[test]
fn shutdown_rd_then_read_returns_zero_as_linux_does() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("ps", need_preload!());
    let peer = lab.linux_echo_peer(7301, 7302);
    let script = lab.path("shutrd.py");
    std::fs::write(&script, SHUT_RD).unwrap();
    let script = script.display().to_string();
    let o = lab.linux(&[PYTHON, &script, "10.77.0.1", "7302"]);
    let linux = stdout_json("SHUT_RD on Linux", &o.stdout, &o.stderr);
    let end = lab
        .start_with(
            Host::Stack,
            false,
            false,
            &[PYTHON, &script, "10.77.0.1", "7302"],
        )
        .wait();
    drop(peer);
    end.check(0);
    let ours = stdout_json("SHUT_RD on ustack", end.out.as_bytes(), end.err.as_bytes());
    eprintln!("ustack: {ours}\nLinux:  {linux}");
    assert_eq!(linux["recv"], 0, "{linux}");
    assert_eq!(linux["recv_queued"], "queued", "{linux}");
    for key in [
        "poll",
        "epoll",
        "recv_queued",
        "recv",
        "read",
        "readv",
        "recvmsg",
        "send_after",
        "udp_unconnected",
        "udp_recv_dontwait",
        "udp_recv_blocking",
        "udp_poll",
    ] {
        assert_eq!(
            ours[key], linux[key],
            "{key}: ustack {ours} vs Linux {linux}"
        );
    }
}

/// Set TCP_USER_TIMEOUT (ms, argv[3]) on a connection to an echo at
/// ADDR:PORT, echo once, create the marker file, then send and wait for
/// the answer: the errno and how long it took.
const USER_TIMEOUT: &str = r#"
import errno, json, socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(sys.argv[3]))
ut = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
s.sendall(b"x")
s.recv(1)
open(sys.argv[4], "w").close()
time.sleep(0.5)
t = time.monotonic()
try:
    s.sendall(b"unanswered")
    d = s.recv(100)
    res = "data" if d else "eof"
except OSError as e:
    res = errno.errorcode.get(e.errno, str(e))
print(json.dumps({"recv": res, "secs": time.monotonic() - t, "user_timeout": ut}), flush=True)
"#;

/// TCP_USER_TIMEOUT: a connection whose peer vanishes (SIGSTOPped, its
/// stack with it) fails with ETIMEDOUT soon after the timeout, long before
/// the retransmission limit's give-up (minutes), as on Linux. Before: the
/// option was refused (ENOPROTOOPT) and the program ended.
#[test]
fn user_timeout_fails_a_vanished_peer_with_etimedout() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("pt", need_preload!());
    let silent = SilentPeer::new(&lab, USER_TIMEOUT, "ut.py", ["7401", "7402"]);
    let client_py = silent.client_py.clone();
    // Linux's client to a ustack peer at 10.77.0.2.
    let peer = silent.start(Host::Stack, "10.77.0.2");
    let marker = lab.path("linux.up");
    let mut linux = lab.linux_daemon(&[
        PYTHON,
        &client_py,
        "10.77.0.2",
        "7402",
        "2000",
        &marker.display().to_string(),
    ]);
    silence_peer_while(peer, &marker, &mut || {
        linux
            .child
            .as_mut()
            .unwrap()
            .try_wait()
            .is_ok_and(|s| s.is_some())
    });
    let (code, out, err) = linux.wait();
    assert_eq!(code, 0, "Linux client: {out}{err}");
    let linux = stdout_json("user timeout on Linux", out.as_bytes(), err.as_bytes());
    // The same program on ustack, to a ustack peer at 10.77.0.3.
    let peer = silent.start(Host::LinuxSide, "10.77.0.3");
    let marker = lab.path("ustack.up");
    let mut ours = lab.start(
        Host::Stack,
        false,
        &[
            PYTHON,
            &client_py,
            "10.77.0.3",
            "7402",
            "2000",
            &marker.display().to_string(),
        ],
    );
    silence_peer_while(peer, &marker, &mut || ours.exited_within(Duration::ZERO));
    let end = ours.wait();
    end.check(0);
    let got = stdout_json(
        "user timeout on ustack",
        end.out.as_bytes(),
        end.err.as_bytes(),
    );
    eprintln!("user timeout: Linux {linux}, ustack {got}");
    assert_eq!(linux["recv"], "ETIMEDOUT", "{linux}");
    assert_eq!(got["recv"], "ETIMEDOUT", "{got}");
    assert_eq!(got["user_timeout"], 2000, "{got}");
    // After the 2 s timeout, well before the retry limit's give-up.
    let secs = got["secs"].as_f64().expect("secs");
    assert!((1.5..30.0).contains(&secs), "{got}");
    let retrans = end.last.as_ref().expect("telemetry")["stack"]["tcp"]["totals"]["retransmits"]
        .as_u64()
        .unwrap_or(0);
    assert!(retrans >= 1, "retransmitted before giving up: {retrans}");
}

/// Every row of the README's socket option table, checked on a connected
/// TCP socket and a connected UDP socket: `implemented` and `kept` set
/// and get (a kept int reads back as set), `get only` gets and refuses a
/// set with ENOPROTOOPT, `refused: E...` fails with that errno. Prints the
/// rows checked and every mismatch.
const OPTIONS: &str = r#"
import errno, json, re, socket, struct, sys
readme, peer, port, iface = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
levels = {"SOL_SOCKET": socket.SOL_SOCKET, "IPPROTO_IP": socket.IPPROTO_IP,
          "IPPROTO_TCP": socket.IPPROTO_TCP, "IPPROTO_UDP": socket.IPPROTO_UDP,
          "IPPROTO_IPV6": socket.IPPROTO_IPV6}
row = re.compile(r"^\| `([A-Z0-9_]+)` \| (\w+) \| (\d+) \| ([^|]+?) \| ([^|]*)\|")
rows = [m.groups() for m in map(row.match, open(readme)) if m]
special = {
    "SO_LINGER": struct.pack("ii", 1, 5),
    "SO_RCVTIMEO": struct.pack("ll", 1, 0),
    "SO_SNDTIMEO": struct.pack("ll", 1, 0),
    "SO_BINDTODEVICE": iface.encode(),
    "TCP_CONGESTION": b"cubic",
    "IP_OPTIONS": b"",
    "TCP_MAXSEG": 1000,
    "IP_TOS": 16,
    "IP_TTL": 32,
    "IP_MTU_DISCOVER": 2,
    "TCP_USER_TIMEOUT": 5000,
    "TCP_KEEPIDLE": 60,
    "IPV6_MTU": 1400,
}
tcp = socket.create_connection((peer, port), timeout=10)
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.connect((peer, 9))
# IPv6 options on AF_INET6 sockets, connected to the peer's v4-mapped
# address (dual stack); IPV6_V6ONLY on fresh ones (Linux: EINVAL once bound).
tcp6 = socket.create_connection(("::ffff:" + peer, port), timeout=10)
udp6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
udp6.connect(("::ffff:" + peer, 9))
def err(f):
    try:
        f()
        return "ok"
    except OSError as e:
        if e.errno == errno.EOPNOTSUPP:
            return "EOPNOTSUPP"  # Python names 95 ENOTSUP
        return errno.errorcode.get(e.errno, str(e))
bad, checked = [], 0
for name, level, num, outcome, note in rows:
    lv, num = levels[level], int(num)
    socks = {"IPPROTO_TCP": [tcp], "IPPROTO_UDP": [udp],
             "IPPROTO_IPV6": [tcp6, udp6]}.get(level, [tcp, udp])
    if note.strip().startswith("TCP only"):
        socks = [tcp]
    if name == "IPV6_V6ONLY":
        socks = [socket.socket(socket.AF_INET6, t) for t in (socket.SOCK_STREAM, socket.SOCK_DGRAM)]
    if name in ("TCP_FASTOPEN", "TCP_FASTOPEN_CONNECT"):
        # A listener's option, and one set before connecting (Linux:
        # EINVAL on a connection for both): a fresh socket.
        socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM)]
    for s in socks:
        kind = "tcp" if s.type == socket.SOCK_STREAM else "udp"
        val = special.get(name, 1)
        got = {"set": err(lambda: s.setsockopt(lv, num, val)),
               "get": err(lambda: s.getsockopt(lv, num, 64))}
        want = {}
        if outcome in ("implemented", "kept"):
            want = {"set": "ok", "get": "ok"}
        elif outcome == "get only":
            want = {"set": "ENOPROTOOPT", "get": "ok"}
        elif outcome.startswith("refused: "):
            want = {"set": outcome[len("refused: "):]}
        else:
            want = {"outcome": "unknown"}
        if outcome == "kept" and isinstance(val, int) and got["get"] == "ok":
            v = struct.unpack("i", s.getsockopt(lv, num, 64)[:4])[0]
            got["value"], want["value"] = v, val
        for k in want:
            if got.get(k) != want[k]:
                bad.append({"option": name, "on": kind, "want": want, "got": got})
                break
        checked += 1
# Options of another protocol's level, as Linux: ENOPROTOOPT.
cross = [err(lambda: udp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)),
         err(lambda: tcp.setsockopt(socket.IPPROTO_UDP, 1, 1)),
         err(lambda: tcp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1))]
print(json.dumps({"rows": len(rows), "checked": checked, "bad": bad, "cross": cross}), flush=True)
"#;

/// The README's socket option table and the layer agree, row by row.
/// Before: IP_PKTINFO, IP_MTU_DISCOVER, IP_RECVERR, TCP_USER_TIMEOUT,
/// TCP_DEFER_ACCEPT, TCP_QUICKACK, TCP_NOTSENT_LOWAT, TCP_FASTOPEN and
/// most of the rest failed with ENOPROTOOPT.
#[test]
fn socket_options_match_the_readme_table() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("po", need_preload!());
    let peer = lab.linux_echo_peer(7501, 7502);
    let script = lab.path("options.py");
    std::fs::write(&script, OPTIONS).unwrap();
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let end = lab
        .start_with(
            Host::Stack,
            false,
            false,
            &[
                PYTHON,
                &script.display().to_string(),
                &readme.display().to_string(),
                "10.77.0.1",
                "7502",
                &lab.topo.stack_if(),
            ],
        )
        .wait();
    drop(peer);
    end.check(0);
    let got = stdout_json("options on ustack", end.out.as_bytes(), end.err.as_bytes());
    let rows = got["rows"].as_u64().unwrap_or(0);
    assert!(rows >= 140, "the README's table has {rows} rows: {got}");
    assert!(got["checked"].as_u64().unwrap_or(0) > rows, "{got}");
    assert_eq!(
        got["bad"],
        serde_json::json!([]),
        "rows that disagree: {got}"
    );
    assert_eq!(
        got["cross"],
        serde_json::json!(["ENOPROTOOPT", "ENOPROTOOPT", "ENOPROTOOPT"]),
        "{got}"
    );
}

/// Reads `TCP_INFO` with the system's `linux/tcp.h` layout after echoing
/// 200,000 bytes: the byte counts, windows, options and window scales
/// must be where the header puts them.
const TCP_INFO_C: &str = r#"
#include <arpa/inet.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    if (connect(s, (struct sockaddr *)&a, sizeof a)) { perror("connect"); return 2; }
    static char buf[200000];
    memset(buf, 'x', sizeof buf);
    long sent = 0, got = 0;
    while (sent < (long)sizeof buf) {
        ssize_t n = write(s, buf + sent, sizeof buf - sent);
        if (n <= 0) { perror("write"); return 2; }
        sent += n;
    }
    static char in[65536];
    while (got < sent) {
        ssize_t n = read(s, in, sizeof in);
        if (n <= 0) { perror("read"); return 2; }
        got += n;
    }
    /* tcpi_rcv_wnd follows tcpi_snd_wnd (Linux 6.2 on; older headers end
       at tcpi_snd_wnd). */
    union { struct tcp_info ti; char raw[512]; } u;
    struct tcp_info ti;
    socklen_t len = sizeof u;
    memset(&u, 0xff, sizeof u);
    if (getsockopt(s, IPPROTO_TCP, TCP_INFO, &u, &len)) { perror("TCP_INFO"); return 2; }
    ti = u.ti;
    unsigned rcv_wnd;
    memcpy(&rcv_wnd, (char *)&u.ti.tcpi_snd_wnd + 4, 4);
    printf("{\"len\": %u, \"state\": %u, \"options\": %u, \"snd_wscale\": %u, \"rcv_wscale\": %u, "
           "\"bytes_acked\": %llu, \"bytes_sent\": %llu, \"bytes_received\": %llu, "
           "\"snd_wnd\": %u, \"rcv_wnd\": %u, \"snd_mss\": %u, \"ca_state\": %u}\n",
           len, ti.tcpi_state, ti.tcpi_options, ti.tcpi_snd_wscale, ti.tcpi_rcv_wscale,
           (unsigned long long)ti.tcpi_bytes_acked, (unsigned long long)ti.tcpi_bytes_sent,
           (unsigned long long)ti.tcpi_bytes_received, ti.tcpi_snd_wnd, rcv_wnd,
           ti.tcpi_snd_mss, ti.tcpi_ca_state);
    close(s);
    return 0;
}
"#;

/// `TCP_INFO` in the kernel's layout, read through the system header:
/// before, `tcpi_bytes_sent`, `tcpi_snd_wnd` and `tcpi_rcv_wnd` sat 8
/// and 4 bytes early (an older draft of the struct), and the options
/// and window scales were 0. Then with `net.ipv4.tcp_timestamps=0` and
/// `tcp_sack=0` in the stack's namespace: neither is used.
#[test]
fn tcp_info_has_the_kernel_layout() {
    need_root!();
    need_program!("cc", "gcc");
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("ti", need_preload!());
    let bin = lab.compile_c("tcp_info", TCP_INFO_C);
    let peer = lab.linux_echo_peer(7521, 7522);
    let run = || {
        let end = lab
            .start(
                Host::Stack,
                false,
                &[&bin.display().to_string(), "10.77.0.1", "7522"],
            )
            .wait();
        end.check(0);
        stdout_json("TCP_INFO", end.out.as_bytes(), end.err.as_bytes())
    };
    let got = run();
    let n = |k: &str| got[k].as_u64().unwrap_or(u64::MAX);
    assert_eq!(n("state"), 1, "ESTABLISHED: {got}");
    assert_eq!(n("bytes_acked"), 200_000, "{got}");
    assert_eq!(n("bytes_received"), 200_000, "{got}");
    assert!(
        n("bytes_sent") >= 200_000 && n("bytes_sent") < 300_000,
        "{got}"
    );
    assert!(n("snd_wnd") > 0 && n("snd_wnd") < 1 << 30, "{got}");
    assert!(n("rcv_wnd") > 0 && n("rcv_wnd") < 1 << 30, "{got}");
    assert_eq!(n("options") & 7, 7, "timestamps, SACK, window scale: {got}");
    assert!(n("snd_wscale") > 0 && n("rcv_wscale") > 0, "{got}");
    assert_eq!(n("snd_mss"), 1448, "{got}");
    assert_eq!(n("ca_state"), 0, "{got}");
    assert_eq!(n("len"), 280, "Linux 6.18's size: {got}");

    // The namespace's sysctls turn timestamps and SACK off for the stack
    // too (the kernel's sockets there would go without them).
    let ns = lab.topo.ns("stack");
    let o = std::process::Command::new("ip")
        .args(["netns", "exec", &ns, "sysctl", "-q", "-w"])
        .args(["net.ipv4.tcp_timestamps=0", "net.ipv4.tcp_sack=0"])
        .output()
        .unwrap();
    assert!(o.status.success(), "sysctl: {}", text(&o));
    let got = run();
    drop(peer);
    let n = |k: &str| got[k].as_u64().unwrap_or(u64::MAX);
    assert_eq!(n("options") & 7, 4, "window scale only: {got}");
    assert_eq!(n("snd_mss"), 1460, "no timestamps option: {got}");
    assert_eq!(n("bytes_acked"), 200_000, "{got}");
}

/// A Fast Open server on ustack: listens with `TCP_FASTOPEN`, answers
/// each connection that brought data with it, and prints per connection
/// whether `TCP_INFO` says the data came in the SYN (`TCPI_OPT_SYN_DATA`).
/// Connections without data (the harness's port probe) are skipped.
const FAST_OPEN_SERVER: &str = r#"
import json, socket, sys
port, want = int(sys.argv[1]), int(sys.argv[2])
l = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("0.0.0.0", port))
l.setsockopt(socket.IPPROTO_TCP, socket.TCP_FASTOPEN, 16)
l.listen(16)
seen = []
while len(seen) < want:
    c, _ = l.accept()
    syn_data = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)[5] & 32 != 0
    data = c.recv(1000)
    if data:
        c.sendall(b"echo:" + data)
        seen.append({"data": data.decode(), "syn_data": syn_data})
    c.close()
print(json.dumps(seen), flush=True)
"#;

/// The Linux client: `sendto(MSG_FASTOPEN)` on fresh sockets, so the
/// kernel asks for a cookie on the first and sends data in the SYN of
/// the next; prints the answers and whether the kernel's `TCP_INFO` says
/// the server took the SYN's data.
const FAST_OPEN_CLIENT: &str = r#"
import json, socket, sys
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
out = []
for i in range(n):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.sendto(b"hello %d" % i, socket.MSG_FASTOPEN, (host, port))
    s.settimeout(10)
    answer = b""
    while not answer.endswith(b"hello %d" % i):
        chunk = s.recv(100)
        if not chunk:
            break
        answer += chunk
    syn_data = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)[5] & 32 != 0
    out.append({"answer": answer.decode(), "syn_data_acked": syn_data})
    s.close()
print(json.dumps(out), flush=True)
"#;

/// TCP Fast Open (RFC 7413) between the kernel's client and a ustack
/// server: the kernel's first connection asks for a cookie and gets one
/// (its SYN's data is not taken), the next two carry the cookie and data
/// in their SYN, which the server takes (both sides' `TCP_INFO` say so).
/// Before, the layer kept `TCP_FASTOPEN` without effect and every SYN's
/// data waited for the handshake.
#[test]
fn linux_fast_open_client_gets_a_cookie_and_its_syn_data_taken() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    // The stack's namespace turns the server side on (0x2), as a host's
    // administrator would; the Linux side's default (1) is the client.
    let lab = Lab::new("fo", need_preload!());
    let (server, client) = fast_open_scripts(&lab, "stack");
    let srv = lab.start(Host::Stack, false, &[PYTHON, &server, "7531", "3"]);
    lab.wait_port("10.77.0.2", 7531);
    let c = lab.linux(&[PYTHON, &client, "10.77.0.2", "7531", "3"]);
    assert!(c.status.success(), "client: {}", text(&c));
    let got = stdout_json("client", &c.stdout, &c.stderr);
    let end = srv.wait();
    end.check(0);
    let served = stdout_json("server", end.out.as_bytes(), end.err.as_bytes());
    check_fast_open(&got, &served);
}

/// Fast Open between the two scripts above: `tcp_fastopen=3` (server and
/// client) in the lab's `side` namespace, the scripts written; their
/// paths.
fn fast_open_scripts(lab: &Lab, side: &str) -> (String, String) {
    let ns = lab.topo.ns(side);
    let o = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns,
            "sysctl",
            "-q",
            "-w",
            "net.ipv4.tcp_fastopen=3",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "sysctl: {}", text(&o));
    let server = lab.path("fo_server.py");
    std::fs::write(&server, FAST_OPEN_SERVER).unwrap();
    let client = lab.path("fo_client.py");
    std::fs::write(&client, FAST_OPEN_CLIENT).unwrap();
    (server.display().to_string(), client.display().to_string())
}

/// The three answers came back, and the second and third connections'
/// data went in their SYN and was taken, as both sides' `TCP_INFO` say.
fn check_fast_open(got: &Value, served: &Value) {
    for i in 0..3 {
        assert_eq!(got[i]["answer"], format!("echo:hello {i}"), "{got}");
        assert_eq!(served[i]["data"], format!("hello {i}"), "{served}");
    }
    let flags = |v: &Value, k: &str| (0..3).map(|i| v[i][k].as_bool()).collect::<Vec<_>>();
    let taken = [Some(false), Some(true), Some(true)];
    assert_eq!(flags(served, "syn_data"), taken, "server: {served}");
    assert_eq!(flags(got, "syn_data_acked"), taken, "client: {got}");
}

/// TCP Fast Open's client side on ustack against the kernel's server
/// (RFC 7413): the stock Python client above under `ustack exec`, its
/// first connection asking for a cookie (its data waits for the
/// handshake), the next two sending data in their SYN with the kernel's
/// cookie, which the kernel takes: both sides' `TCP_INFO` say so, and the
/// answers come back. Before, the layer connected and then sent, and
/// every SYN went without data.
#[test]
fn ustack_fast_open_client_keeps_linuxs_cookie_and_sends_data_in_its_syn() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("foc", need_preload!());
    let (server, client) = fast_open_scripts(&lab, "linux");
    let srv = lab.linux_daemon(&[PYTHON, &server, "7532", "3"]);
    let up = lab.linux(&[
        "sh",
        "-c",
        "for i in $(seq 100); do ss -Hltn 'sport = :7532' | grep -q LISTEN && exit 0; sleep 0.1; done; exit 1",
    ]);
    assert!(up.status.success(), "the kernel's server never listened");
    let c = lab.start(
        Host::Stack,
        false,
        &[PYTHON, &client, "10.77.0.1", "7532", "3"],
    );
    let end = c.wait();
    end.check(0);
    let got = stdout_json("client", end.out.as_bytes(), end.err.as_bytes());
    let (code, out, err) = srv
        .wait_at_most(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("the kernel's server did not end: {e:?}"));
    assert_eq!(code, 0, "server: {err}");
    let served = stdout_json("server", out.as_bytes(), err.as_bytes());
    check_fast_open(&got, &served);
}

/// `MSG_ZEROCOPY` sends to the Linux echo peer: before any, the error
/// queue is empty (EAGAIN); after 16 sends, `POLLERR` and
/// `recvmsg(MSG_ERRQUEUE)` give completions covering numbers 0..=15 in
/// order, as Linux's `sock_extended_err` (origin zerocopy, code copied);
/// the echo comes back byte-exact.
const ZEROCOPY: &str = r#"
import errno, hashlib, json, select, socket, struct, sys
peer, port = sys.argv[1], int(sys.argv[2])
MSG_ZEROCOPY, SO_ZEROCOPY = 0x4000000, 60
s = socket.create_connection((peer, port), timeout=10)
out = {}
s.setblocking(False)
try:
    s.recvmsg(1, 64, socket.MSG_ERRQUEUE)
    out["empty"] = "ok"
except OSError as e:
    out["empty"] = errno.errorcode.get(e.errno, str(e))
s.settimeout(10)
s.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
out["option"] = s.getsockopt(socket.SOL_SOCKET, SO_ZEROCOPY)
data = bytes(i % 251 for i in range(16 * 8192))
for i in range(16):
    n = s.send(data[i * 8192:(i + 1) * 8192], MSG_ZEROCOPY)
    assert n == 8192, n
ranges = []
p = select.poll()
p.register(s, select.POLLERR)
while sum(hi - lo + 1 for lo, hi, _, _ in ranges) < 16:
    if not p.poll(10000):
        break
    msg, anc, flags, _ = s.recvmsg(1, 64, socket.MSG_ERRQUEUE)
    for level, kind, d in anc:
        assert (level, kind) == (socket.IPPROTO_IP, 11), (level, kind)  # IP_RECVERR
        err, origin, typ, code, pad, info, dat = struct.unpack("=IBBBBII", d[:16])
        ranges.append((info, dat, origin, code))
    out["flags_errqueue"] = bool(flags & socket.MSG_ERRQUEUE)
out["ranges"] = ranges
got = b""
while len(got) < len(data):
    chunk = s.recv(65536)
    if not chunk:
        break
    got += chunk
out["echo"] = hashlib.sha256(got).hexdigest() == hashlib.sha256(data).hexdigest()
print(json.dumps(out), flush=True)
"#;

/// `SO_ZEROCOPY` and `MSG_ZEROCOPY` on ustack (before, the option was
/// refused with EOPNOTSUPP, and programs that insist on it failed):
/// completions arrive once the peer acknowledged the bytes.
#[test]
fn msg_zerocopy_completions_arrive_on_the_error_queue() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("zc", need_preload!());
    let peer = lab.linux_echo_peer(7541, 7542);
    let script = lab.path("zerocopy.py");
    std::fs::write(&script, ZEROCOPY).unwrap();
    let end = lab.run(
        Host::Stack,
        &[PYTHON, &script.display().to_string(), "10.77.0.1", "7542"],
    );
    drop(peer);
    end.check(0);
    let got = stdout_json("zerocopy", end.out.as_bytes(), end.err.as_bytes());
    assert_eq!(got["empty"], "EAGAIN", "{got}");
    assert_eq!(got["option"], 1, "{got}");
    assert_eq!(got["echo"], true, "{got}");
    assert_eq!(got["flags_errqueue"], true, "{got}");
    let ranges = got["ranges"].as_array().cloned().unwrap_or_default();
    let mut next = 0;
    for r in &ranges {
        let f = |i: usize| r[i].as_u64().unwrap_or(u64::MAX);
        assert_eq!(f(0), next, "in order, no gap: {got}");
        assert!(f(1) >= f(0), "{got}");
        assert_eq!((f(2), f(3)), (5, 1), "origin zerocopy, code copied: {got}");
        next = f(1) + 1;
    }
    assert_eq!(next, 16, "every send completed: {got}");
}

/// Two 2,000-byte sends on a socket with `SO_TIMESTAMPING` (TX_SCHED,
/// TX_SOFTWARE, TX_ACK, SOFTWARE, OPT_ID): each send's last byte
/// (keys 1999 and 3999) is stamped SCHED, SND and ACK on the error
/// queue, each with an `SCM_TIMESTAMPING` message (the software time,
/// `CLOCK_REALTIME`) and an `IP_RECVERR` one (`ENOMSG`, origin
/// timestamping, the kind in `ee_info`, the key in `ee_data`), as Linux
/// gives them; `POLLERR` says they wait.
const TIMESTAMPING: &str = r#"
import errno, json, select, socket, struct, sys, time
peer, port = sys.argv[1], int(sys.argv[2])
SO_TIMESTAMPING = 37
flags = (1 << 1) | (1 << 4) | (1 << 7) | (1 << 8) | (1 << 9)
s = socket.create_connection((peer, port), timeout=10)
s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, flags)
out = {"option": s.getsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING)}
before = time.time()
for _ in range(2):
    assert s.send(b"x" * 2000) == 2000
got = b""
while len(got) < 4000:
    got += s.recv(65536)
stamps = []
p = select.poll()
p.register(s, select.POLLERR)
while len(stamps) < 6 and p.poll(5000):
    msg, anc, fl, _ = s.recvmsg(0, 512, socket.MSG_ERRQUEUE)
    kinds = [(level, kind) for level, kind, _ in anc]
    assert kinds == [(socket.SOL_SOCKET, SO_TIMESTAMPING), (socket.IPPROTO_IP, 11)], kinds
    sec, nsec = struct.unpack("=qq", anc[0][2][:16])
    err, origin, typ, code, pad, info, key = struct.unpack("=IBBBBII", anc[1][2][:16])
    stamps.append({"errno": err, "origin": origin, "info": info, "key": key,
                   "at": sec + nsec / 1e9 - before, "flags": fl})
out["stamps"] = stamps
out["after"] = time.time() - before
print(json.dumps(out), flush=True)
"#;

/// `SO_TIMESTAMPING` transmit timestamps on ustack (before, the option
/// was kept without effect and nothing came on the error queue).
#[test]
fn so_timestamping_stamps_each_send_when_it_leaves_and_is_acknowledged() {
    need_root!();
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("ts", need_preload!());
    let peer = lab.linux_echo_peer(7543, 7544);
    let script = lab.path("timestamping.py");
    std::fs::write(&script, TIMESTAMPING).unwrap();
    let end = lab.run(
        Host::Stack,
        &[PYTHON, &script.display().to_string(), "10.77.0.1", "7544"],
    );
    drop(peer);
    end.check(0);
    let got = stdout_json("timestamping", end.out.as_bytes(), end.err.as_bytes());
    assert_eq!(got["option"], 0x392, "{got}");
    let stamps = got["stamps"].as_array().cloned().unwrap_or_default();
    let mut seen: Vec<(u64, u64)> = stamps
        .iter()
        .map(|s| {
            (
                s["info"].as_u64().unwrap_or(9),
                s["key"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    seen.sort_unstable();
    // SND 0, SCHED 1, ACK 2, for keys 1999 and 3999.
    assert_eq!(
        seen,
        vec![
            (0, 1999),
            (0, 3999),
            (1, 1999),
            (1, 3999),
            (2, 1999),
            (2, 3999)
        ],
        "{got}"
    );
    let after = got["after"].as_f64().unwrap_or(0.0);
    for s in &stamps {
        assert_eq!(
            (s["errno"].as_u64(), s["origin"].as_u64()),
            (Some(42), Some(4)),
            "{got}"
        );
        let at = s["at"].as_f64().unwrap_or(-1.0);
        assert!(
            (0.0..=after).contains(&at),
            "stamped between the send and the end: {got}"
        );
        let fl = s["flags"].as_i64().unwrap_or(0);
        assert_eq!(fl & 0x2000, 0x2000, "MSG_ERRQUEUE: {got}");
    }
    // A key's ACK comes no earlier than its SND.
    for key in [1999, 3999] {
        let at = |info: u64| {
            stamps
                .iter()
                .find(|s| s["info"] == info && s["key"] == key)
                .and_then(|s| s["at"].as_f64())
                .unwrap_or(f64::NAN)
        };
        assert!(at(2) >= at(0), "key {key}: {got}");
    }
}
