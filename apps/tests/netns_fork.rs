//! One stack shared by a program and the processes it forks, under
//! `ustack exec`: a forking server's children serve the connections their
//! parent accepted, children open sockets of their own on the stack, a
//! child that execs a program hands it the connection it inherited, a
//! child killed with SIGKILL in the middle of its work leaves the others
//! running and its connection closed as the kernel would close it, a
//! thousand children come and go without a socket or a buffer left behind,
//! connections passed between processes with `SCM_RIGHTS` are served by
//! the receiver, and haproxy's master-worker mode (its master execs
//! itself) serves across reloads, and C stdio streams (`fdopen`, and
//! `stdin`/`stdout` of a program exec'd on a connection) read and write
//! ustack sockets.
//! The stack runs as 10.77.0.2, Linux as 10.77.0.1, in namespaces the test
//! makes and removes. Needs root; the all-features build runs it.
#![cfg(feature = "pcap")]

#[macro_use]
mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::lab::*;
use common::{no_crash, pools_in_use, telemetry};

/// One test at a time: each loads the machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const PORT: u16 = 7440;

/// A forking TCP server (Python's `socketserver.ForkingMixIn`: the parent
/// accepts, a child per connection serves it, the parent closes its copy).
/// A child echoes what it reads until end of stream; one whose first line
/// is `KILL` sends 50,000 bytes and kills itself with SIGKILL; one whose
/// first line is `UP HOST PORT` opens a connection of its own to HOST:PORT
/// and relays both ways. Exits 0 on SIGTERM.
const SERVER: &str = r#"
import os, signal, socket, socketserver, sys, threading
class H(socketserver.BaseRequestHandler):
    def handle(self):
        s = self.request
        first = s.recv(65536)
        if first.startswith(b"KILL"):
            s.sendall(b"k" * 50000)
            os.kill(os.getpid(), signal.SIGKILL)
        if first.startswith(b"EXECL"):
            # The C library's variadic execl (more arguments than
            # registers): sh, then cat, serve the connection.
            s.sendall(b"ready\n")
            os.dup2(s.fileno(), 0); os.dup2(s.fileno(), 1)
            import ctypes
            ctypes.CDLL(None).execl(b"/bin/sh", b"sh", b"-c", b"exec cat", b"sh", b"a", b"b", b"c", b"d", None)
        if first.startswith(b"SPAWN"):
            # posix_spawn with the connection as the new program's
            # standard input and output (file actions), then this
            # child waits for it and leaves without a shutdown.
            s.sendall(b"ready\n")
            fa = [(os.POSIX_SPAWN_DUP2, s.fileno(), 0), (os.POSIX_SPAWN_DUP2, s.fileno(), 1)]
            pid = os.posix_spawn("/bin/sh", ["sh", "-c", "exec cat"], os.environ, file_actions=fa)
            s.close(); os.waitpid(pid, 0); os._exit(0)
        if first.startswith(b"EXEC"):
            s.sendall(b"ready\n")
            os.dup2(s.fileno(), 0); os.dup2(s.fileno(), 1)
            os.execv("/bin/cat", ["cat"])
        if first.startswith(b"UP "):
            _, host, port = first.split()[:3]
            up = socket.create_connection((host.decode(), int(port)))
            def back():
                while True:
                    d = up.recv(65536)
                    if not d: break
                    s.sendall(d)
                s.shutdown(socket.SHUT_WR)
            t = threading.Thread(target=back); t.start()
            while True:
                d = s.recv(65536)
                if not d: break
                up.sendall(d)
            up.shutdown(socket.SHUT_WR); t.join(); up.close()
            return
        d = first
        while d:
            s.sendall(d)
            d = s.recv(65536)
class S(socketserver.ForkingMixIn, socketserver.TCPServer):
    allow_reuse_address = True
    request_queue_size = 64
srv = S(("0.0.0.0", int(sys.argv[1])), H)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
print("listening", flush=True)
srv.serve_forever()
"#;

/// The Linux side: `K` connections at once to HOST:PORT, each sending
/// `N` random bytes (after an optional first line) and reading the echo;
/// prints a JSON object: how many came back byte-exact, and for a `KILL`
/// connection the bytes it got before end of stream and how it ended.
const CLIENT: &str = r#"
import json, os, socket, sys, threading
host, port, n, k, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
out = {"exact": 0, "conns": k}
lock = threading.Lock()
def echo(i):
    data = os.urandom(n)
    s = socket.create_connection((host, port), timeout=30)
    got = bytearray()
    def rd():
        while len(got) < n:
            d = s.recv(65536)
            if not d: break
            got.extend(d)
    t = threading.Thread(target=rd); t.start()
    s.sendall(data); t.join(); s.close()
    with lock:
        out["exact"] += data == bytes(got)
def killed():
    s = socket.create_connection((host, port), timeout=30)
    s.sendall(b"KILL\n")
    got, end = 0, "eof"
    try:
        while True:
            d = s.recv(65536)
            if not d: break
            got += len(d)
    except ConnectionResetError:
        end = "reset"
    except socket.timeout:
        end = "timeout"
    out["killed_got"], out["killed_end"] = got, end
ts = [threading.Thread(target=echo, args=(i,)) for i in range(k)]
if mode == "kill":
    ts.append(threading.Thread(target=killed))
[t.start() for t in ts]; [t.join() for t in ts]
print(json.dumps(out))
"#;

fn script(lab: &Lab, name: &str, text: &str) -> String {
    let p = lab.path(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// The forking server on ustack, listening.
fn start_server(lab: &Lab) -> Preloaded {
    let srv = script(lab, "fork_server.py", SERVER);
    let server = lab.start(Host::Stack, false, &["python3", &srv, &PORT.to_string()]);
    lab.wait_port("10.77.0.2", PORT);
    server
}

/// The stack's telemetry once no connection is open: the port probe of
/// `start_server` (`nc -z`) ends a moment after it returns, as its forked
/// child closes, and a baseline taken before then counts it.
fn quiet(sock: &std::path::Path) -> serde_json::Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = telemetry(sock);
        if now["connections_total"].as_u64() == Some(0) {
            return now;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the port probe's connection never closed: {}",
            now["connections_total"]
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The stack's telemetry once its connection count is back at `before`'s
/// (the last children's connections close a moment after their clients'),
/// or after 20 s; and how a line counts connections.
fn settled(
    sock: &std::path::Path,
    before: &serde_json::Value,
) -> (serde_json::Value, fn(&serde_json::Value) -> u64) {
    fn conns(s: &serde_json::Value) -> u64 {
        s["connections_total"].as_u64().unwrap_or(u64::MAX)
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut now = telemetry(sock);
    while conns(&now) > conns(before) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        now = telemetry(sock);
    }
    (now, conns)
}

/// Run the Linux client; its JSON answer.
fn client(lab: &Lab, n: usize, k: usize, mode: &str) -> serde_json::Value {
    client_at(lab, PORT, n, k, mode)
}

/// Run the Linux client against `port`; its JSON answer.
fn client_at(lab: &Lab, port: u16, n: usize, k: usize, mode: &str) -> serde_json::Value {
    let cli = script(lab, "fork_client.py", CLIENT);
    let o = lab.linux(&[
        "timeout",
        "90",
        "python3",
        &cli,
        "10.77.0.2",
        &port.to_string(),
        &n.to_string(),
        &k.to_string(),
        mode,
    ]);
    common::stdout_json("fork client", &o.stdout, &o.stderr)
}

/// Children of a forking server serve the connections their parent
/// accepted (8 at once, 1 MiB each way, byte-exact); a child killed with
/// SIGKILL right after it queued 50,000 bytes leaves its siblings' transfers
/// whole, and its connection ends as the kernel ends a dead process's (the
/// 50,000 bytes, then end of stream); the server accepts afterwards, and
/// stops cleanly with no pool buffer in use.
#[test]
fn forked_children_serve_and_a_killed_one_is_closed_as_the_kernel_would() {
    need_root!();
    need_program!("python3", "python3");
    let _turn = serial();
    let lab = Lab::new("fk", need_preload!());
    let server = start_server(&lab);
    let r = client(&lab, 1 << 20, 8, "kill");
    eprintln!("forked children: {r}");
    assert_eq!(r["exact"], 8, "{r}");
    assert_eq!(r["killed_got"], 50_000, "{r}");
    assert_eq!(r["killed_end"], "eof", "{r}");
    let r = client(&lab, 100_000, 2, "echo");
    assert_eq!(r["exact"], 2, "after the kill: {r}");
    let end = server.stop();
    end.check(0);
    let (rx, tx) = end.tcp_bytes();
    assert!(
        rx >= 10 * 100_000 && tx >= 8 * (1 << 20) + 50_000,
        "the stack's TCP totals {rx}/{tx} do not hold the children's traffic"
    );
}

/// A child opens a connection of its own on the shared stack (to a Linux
/// echo server) and relays its client's stream through it, 4 at once,
/// byte-exact.
#[test]
fn forked_children_open_sockets_of_their_own() {
    need_root!();
    need_program!("python3", "python3");
    let _turn = serial();
    let lab = Lab::new("fu", need_preload!());
    // Echoes until end of stream, then closes (ncat -e cat may close
    // before cat wrote the last bytes back).
    let _echo = lab.linux_echo_peer(7442, 7441);
    let server = start_server(&lab);
    let relay = r#"
import os, socket, sys, threading
res = []
def one():
    data = os.urandom(300000)
    s = socket.create_connection(("10.77.0.2", int(sys.argv[1])), timeout=30)
    s.sendall(b"UP 10.77.0.1 7441\n")
    import time; time.sleep(0.3)
    got = bytearray()
    def rd():
        while True:
            d = s.recv(65536)
            if not d: break
            got.extend(d)
    t = threading.Thread(target=rd); t.start()
    s.sendall(data); s.shutdown(socket.SHUT_WR); t.join(); s.close()
    res.append(bytes(got) == data)
ts = [threading.Thread(target=one) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
print(sum(res))
"#;
    let cli = script(&lab, "relay_client.py", relay);
    let o = lab.linux(&["timeout", "60", "python3", &cli, &PORT.to_string()]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "4",
        "relayed through children's own connections: {}",
        text(&o)
    );
    server.stop().check(0);
}

/// Who holds what is visible: while a forked child serves a connection,
/// the stack's telemetry lists the owner and the child (`processes`, with
/// their socket counts), the connection names the child among its
/// `holders`, and `utop --once` shows it in the Pids column.
#[test]
fn telemetry_and_utop_show_which_process_holds_a_connection() {
    need_root!();
    need_program!("python3", "python3");
    let _turn = serial();
    let lab = Lab::new("fw", need_preload!());
    let server = start_server(&lab);
    let sock = lab.path("ustack-1.sock");
    // The port probe's connection gone first: the only connection with a
    // holder is then the one below.
    quiet(&sock);
    // A Linux client that holds its connection open for a while.
    let hold = "import socket, time\n\
                s = socket.create_connection(('10.77.0.2', 7440))\n\
                s.sendall(b'hello'); s.recv(16); time.sleep(8)\n";
    let mut holder = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &lab.topo.ns("linux"),
            "python3",
            "-c",
            hold,
        ])
        .spawn()
        .expect("start the holding client");
    let deadline = std::time::Instant::now() + Duration::from_secs(6);
    let mut line = telemetry(&sock);
    let held = |l: &serde_json::Value| {
        l["connections"].as_array().and_then(|cs| {
            cs.iter()
                .find(|c| {
                    c["local"] == "10.77.0.2:7440"
                        && c["holders"].as_array().is_some_and(|h| !h.is_empty())
                })
                .cloned()
        })
    };
    while held(&line).is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        line = telemetry(&sock);
    }
    let conn = held(&line).unwrap_or_else(|| panic!("no connection with holders: {line}"));
    let procs = line["processes"].as_array().cloned().unwrap_or_default();
    assert!(
        procs.iter().any(|p| p["role"] == "owner"),
        "processes should list the owner: {procs:?}"
    );
    // The child serving the connection.
    let holders: Vec<u64> = conn["holders"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|h| h.as_u64())
        .collect();
    let child = procs
        .iter()
        .find(|p| p["role"] == "client" && holders.contains(&p["pid"].as_u64().unwrap_or(0)))
        .unwrap_or_else(|| panic!("no client in {procs:?} holds the connection ({holders:?})"));
    assert!(child["sockets"].as_u64().unwrap() >= 1, "{procs:?}");
    let child = child["pid"].as_u64().unwrap();
    let (code, out, err) = utop_once(&sock);
    assert_eq!(code, 0, "utop --once: {out}{err}");
    assert!(
        out.contains("Pids") && out.contains(&child.to_string()),
        "utop --once does not show the child {child} holding the connection: {out}"
    );
    let _ = holder.kill();
    let _ = holder.wait();
    server.stop().check(0);
}

/// A fork made with a raw `syscall(SYS_clone, SIGCHLD, 0)` (as vsftpd
/// makes its sessions) is a fork to the layer: the child sends and reads
/// on the connection its parent opened (an echo, byte-exact). One that
/// asks for a new network namespace is refused with EPERM, said once on
/// stderr (vsftpd then falls back to fork).
#[test]
fn a_raw_clone_is_a_fork_and_new_namespaces_are_refused() {
    need_root!();
    need_program!("python3", "python3");
    let _turn = serial();
    let lab = Lab::new("fc", need_preload!());
    let _echo = lab.linux_echo_peer(7444, 7445);
    let prog = r#"
import ctypes, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
SYS_clone, SIGCHLD, CLONE_NEWNET = 56, 17, 0x40000000
s = socket.create_connection(("10.77.0.1", 7445), timeout=10)
out = {}
pid = libc.syscall(SYS_clone, ctypes.c_long(SIGCHLD), ctypes.c_long(0))
if pid == 0:
    data = os.urandom(100000)
    s.sendall(data)
    got = b""
    while len(got) < len(data):
        d = s.recv(65536)
        if not d: break
        got += d
    os._exit(0 if got == data else 3)
_, status = os.waitpid(pid, 0)
out["child"] = os.waitstatus_to_exitcode(status)
r = libc.syscall(SYS_clone, ctypes.c_long(SIGCHLD | CLONE_NEWNET), ctypes.c_long(0))
if r == 0:
    os._exit(0)
out["namespaced"] = [r, ctypes.get_errno()]
print(json.dumps(out), flush=True)
"#;
    let script = script(&lab, "raw_clone.py", prog);
    let end = lab.run(Host::Stack, &["python3", &script]);
    end.check(0);
    let v: serde_json::Value = serde_json::from_str(end.out.trim())
        .unwrap_or_else(|e| panic!("{e}: {}{}", end.out, end.err));
    assert_eq!(v["child"], 0, "the raw clone's child echo: {v} {}", end.err);
    assert_eq!(v["namespaced"][0], -1, "{v}");
    // EPERM.
    assert_eq!(v["namespaced"][1], 1, "{v}");
    assert!(end.err.contains("raw clone system call"), "{}", end.err);
}

/// A child that execs a program (by `execv`, by the variadic `execl`, or
/// starts one by `posix_spawn`) with the connection as its standard input
/// and output (as inetd and sshd's re-exec do): the new program rejoins
/// the stack and echoes 1 MiB on each of 4 connections at once,
/// byte-exact; when it exits, the connection ends (the parent closed its
/// copy) and the stack's connections are back where they were.
#[test]
fn an_execd_child_serves_the_connection_it_inherited() {
    need_root!();
    need_program!("python3", "python3");
    let _turn = serial();
    let lab = Lab::new("fx", need_preload!());
    let server = start_server(&lab);
    let sock = lab.path("ustack-1.sock");
    let before = quiet(&sock);
    let execd = r#"
import os, socket, sys, threading
res = []
def one():
    data = os.urandom(1 << 20)
    s = socket.create_connection(("10.77.0.2", int(sys.argv[1])), timeout=30)
    s.sendall(sys.argv[2].encode() + b"\n")
    hello = b""
    while not hello.endswith(b"\n"):
        d = s.recv(1)
        if not d: break
        hello += d
    got = bytearray()
    def rd():
        while True:
            d = s.recv(65536)
            if not d: break
            got.extend(d)
    t = threading.Thread(target=rd); t.start()
    s.sendall(data); s.shutdown(socket.SHUT_WR); t.join(); s.close()
    res.append(hello == b"ready\n" and bytes(got) == data)
ts = [threading.Thread(target=one) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
print(sum(res))
"#;
    let cli = script(&lab, "exec_client.py", execd);
    for how in ["EXEC", "EXECL", "SPAWN"] {
        let o = lab.linux(&["timeout", "90", "python3", &cli, &PORT.to_string(), how]);
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).trim(),
            "4",
            "echoed by cat exec'd in forked children ({how}): {}",
            text(&o)
        );
    }
    let (now, conns) = settled(&sock, &before);
    assert_eq!(
        conns(&now),
        conns(&before),
        "connections after the exec'd children"
    );
    server.stop().check(0);
}

/// A thousand children come and go (one short connection each): the
/// stack's connections and pool buffers are back where they were before.
/// `USTACK_FORK_CHILDREN` sets how many (`tools/long-suite` runs 10,000).
#[test]
fn a_thousand_children_leave_nothing_behind() {
    need_root!();
    need_program!("python3", "python3");
    let _turn = serial();
    let lab = Lab::new("fl", need_preload!());
    let server = start_server(&lab);
    let sock = lab.path("ustack-1.sock");
    let before = quiet(&sock);
    let many = r#"
import socket, sys
ok = 0
for i in range(int(sys.argv[2])):
    s = socket.create_connection(("10.77.0.2", int(sys.argv[1])), timeout=20)
    s.sendall(b"x" * 100)
    got = b""
    while len(got) < 100:
        d = s.recv(100 - len(got))
        if not d: break
        got += d
    s.close()
    ok += got == b"x" * 100
print(ok)
"#;
    let cli = script(&lab, "many_client.py", many);
    let children: u64 = std::env::var("USTACK_FORK_CHILDREN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    // Five minutes a thousand: far beyond what a working stack needs.
    let limit = (children * 3 / 10).max(300).to_string();
    let n = children.to_string();
    let o = lab.linux(&["timeout", &limit, "python3", &cli, &PORT.to_string(), &n]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), n, "{}", text(&o));
    let (now, conns) = settled(&sock, &before);
    assert_eq!(
        conns(&now),
        conns(&before),
        "connections before {} and after {children} children {}",
        conns(&before),
        conns(&now)
    );
    assert_eq!(
        pools_in_use(&now),
        pools_in_use(&before),
        "pool buffers in use"
    );
    server.stop().check(0);
}

/// Two processes of one program (a shell starting two servers): the first
/// to open a socket runs the stack, the other joins it; each serves its
/// own port (1 MiB echoes, byte-exact).
#[test]
fn two_processes_of_one_program_share_the_stack() {
    need_root!();
    need_program!("python3", "python3");
    let _turn = serial();
    let lab = Lab::new("fj", need_preload!());
    let srv = script(&lab, "fork_server.py", SERVER);
    let both = format!(
        "python3 {srv} {PORT} & A=$!; python3 {srv} {OTHER} & B=$!; \
         trap 'kill $A $B; wait; exit 0' TERM; wait"
    );
    let server = lab.start(Host::Stack, false, &["sh", "-c", &both]);
    lab.wait_port("10.77.0.2", PORT);
    lab.wait_port("10.77.0.2", OTHER);
    let r = client(&lab, 1 << 20, 4, "echo");
    assert_eq!(r["exact"], 4, "the first server: {r}");
    let r = client_at(&lab, OTHER, 1 << 20, 4, "echo");
    assert_eq!(r["exact"], 4, "the second server: {r}");
    let end = server.stop();
    end.check(0);
    assert!(
        !end.err.contains("runs on the kernel's sockets"),
        "a process of the program was left on the kernel's sockets: {}",
        end.err
    );
}

/// A second port for a second server.
const OTHER: u16 = 7443;

/// A server that hands each connection it accepts to another process with
/// `SCM_RIGHTS` over a Unix socketpair, and closes its own copy; the
/// receiver checks that TCP_INFO says it is established, then echoes it
/// until end of stream. `MODE` says who passes to whom:
/// `o2c` the parent (which runs the stack) to a forked worker, `c2o` a
/// forked acceptor to the parent, `c2c` one forked child to another.
const PASSING: &str = r#"
import os, signal, socket, sys, threading
port, mode = int(sys.argv[1]), sys.argv[2]
lst = socket.socket(); lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(("0.0.0.0", port)); lst.listen(64)
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
def echo(c):
    # TCP_INFO and TCP_MAXSEG read the connection's state in whichever
    # process holds it: a receiver that sees it not established echoes
    # nothing.
    info = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    if info[0] != 1 or c.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG) <= 0:
        c.close(); return
    while True:
        d = c.recv(65536)
        if not d: break
        c.sendall(d)
    c.close()
def receive(u):
    while True:
        msg, fds, _, _ = socket.recv_fds(u, 16, 1)
        if not msg: return
        for fd in fds:
            threading.Thread(target=echo, args=(socket.socket(fileno=fd),)).start()
def give(u):
    while True:
        c, _ = lst.accept()
        socket.send_fds(u, [b"c"], [c.fileno()])
        c.close()
kids = []
def child(f):
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, lambda *x: os._exit(0))
        f(); os._exit(0)
    kids.append(pid)
def stop(*x):
    for k in kids: os.kill(k, signal.SIGTERM)
    for k in kids: os.waitpid(k, 0)
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
if mode == "o2c":
    child(lambda: receive(b)); print("ready", flush=True); give(a)
elif mode == "c2o":
    child(lambda: give(a)); print("ready", flush=True); receive(b)
else:
    child(lambda: give(a)); child(lambda: receive(b)); print("ready", flush=True)
    while True: signal.pause()
"#;

/// A connection passed between the processes sharing the stack
/// (`SCM_RIGHTS`) is served by the receiver, whichever way it goes: from
/// the process running the stack to a child, from a child to it, and
/// between two children (4 connections at once, 1 MiB echoed each,
/// byte-exact); afterwards no connection is left open (a pass holds a
/// socket only until it is received), and the server stops cleanly.
#[test]
fn a_connection_passed_with_scm_rights_is_served_by_the_receiver() {
    need_root!();
    need_program!("python3", "python3");
    let _turn = serial();
    for (i, mode) in ["o2c", "c2o", "c2c"].into_iter().enumerate() {
        let lab = Lab::new(&format!("fr{i}"), need_preload!());
        let prog = script(&lab, "passing.py", PASSING);
        let server = lab.start(
            Host::Stack,
            false,
            &["python3", &prog, &PORT.to_string(), mode],
        );
        lab.wait_port("10.77.0.2", PORT);
        let sock = lab.path("ustack-1.sock");
        let before = quiet(&sock);
        let r = client(&lab, 1 << 20, 4, "echo");
        assert_eq!(r["exact"], 4, "{mode}: connections passed and echoed: {r}");
        let r = client(&lab, 1 << 16, 4, "echo");
        assert_eq!(r["exact"], 4, "{mode}: a second round: {r}");
        let (now, conns) = settled(&sock, &before);
        assert_eq!(
            conns(&now),
            conns(&before),
            "{mode}: connections left open after the passes"
        );
        let end = server.stop();
        end.check(0);
        no_crash(&end.err);
    }
}

/// An nginx configuration in `root`: a master and one worker serving a
/// 10 kB file on 10.77.0.2:8080 (in the foreground, or as a daemon).
fn nginx_conf(root: &std::path::Path, daemon: bool) -> std::path::PathBuf {
    std::fs::create_dir_all(root.join("html")).unwrap();
    std::fs::write(root.join("html/index.html"), "n".repeat(10_000)).unwrap();
    let r = root.display();
    let conf = format!(
        "daemon {d};\nmaster_process on;\nworker_processes 1;\nuser root;\n\
         pid {r}/nginx.pid;\nerror_log {r}/error.log info;\n\
         events {{ worker_connections 1024; }}\n\
         http {{ access_log off; client_body_temp_path {r}; proxy_temp_path {r};\n\
           fastcgi_temp_path {r}; uwsgi_temp_path {r}; scgi_temp_path {r};\n\
           server {{ listen 10.77.0.2:8080; root {r}/html; }} }}\n",
        d = if daemon { "on" } else { "off" }
    );
    let path = root.join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    path
}

/// Two unrelated programs joined to one stack by name (`ustack exec
/// --stack`): redis-server on 6379 runs it, nginx (a master and a worker)
/// on 8080 joins; both are served on one address at the same time
/// (redis-benchmark and ab at once, every request answered), and each
/// stops cleanly.
#[test]
fn unrelated_programs_share_a_named_stack() {
    need_root!();
    need_program!("redis-server", "redis-server");
    need_program!("redis-benchmark", "redis-tools");
    need_program!("nginx", "nginx-light");
    need_program!("ab", "apache2-utils");
    let _turn = serial();
    let lab = Lab::new("fn", need_preload!());
    lab.stack.set(Some("redis-nginx"));
    let (redis, _) = start_redis(&lab);
    let root = lab.path("nginx");
    let conf = nginx_conf(&root, false);
    let conf_s = conf.display().to_string();
    let nginx = lab.start_with(Host::Stack, false, false, &["nginx", "-c", &conf_s]);
    lab.wait_port("10.77.0.2", 8080);
    let both = format!(
        "redis-benchmark -h 10.77.0.2 -p 6379 -n 20000 -c 10 -t set,get -q > {r} 2>&1 & \
         ab -n 3000 -c 8 http://10.77.0.2:8080/ > {a} 2>&1; wait",
        r = lab.path("redis-bench.txt").display(),
        a = lab.path("ab.txt").display()
    );
    let o = lab.linux(&["timeout", "120", "sh", "-c", &both]);
    let bench = std::fs::read_to_string(lab.path("redis-bench.txt")).unwrap_or_default();
    let ab = std::fs::read_to_string(lab.path("ab.txt")).unwrap_or_default();
    assert!(o.status.success(), "load: {}", text(&o));
    for t in ["SET", "GET"] {
        assert!(
            bench
                .split(['\r', '\n'])
                .any(|l| l.trim().starts_with(t) && l.contains("requests per second")),
            "redis-benchmark {t}: {bench}"
        );
    }
    assert!(ab.contains("Complete requests:      3000"), "ab: {ab}");
    assert!(ab.contains("Failed requests:        0"), "ab: {ab}");
    assert!(!ab.contains("Non-2xx responses"), "ab: {ab}");
    let got = lab.linux(&["redis-cli", "-h", "10.77.0.2", "set", "k", "shared"]);
    assert_eq!(String::from_utf8_lossy(&got.stdout).trim(), "OK");
    let nginx_end = nginx.stop();
    no_crash(&nginx_end.err);
    let got = lab.linux(&["redis-cli", "-h", "10.77.0.2", "get", "k"]);
    assert_eq!(
        String::from_utf8_lossy(&got.stdout).trim(),
        "shared",
        "redis after nginx left the stack"
    );
    redis.stop().check(0);
}

/// nginx as a daemon: the process `ustack exec` starts opens the listening
/// socket and the stack, forks the daemon (which forks its worker) and
/// exits at once. A keeper runs the stack on for them: the server answers
/// (ab, every request); a binary upgrade (SIGUSR2, then SIGQUIT to the old
/// master) leaves the new master serving on the inherited listener; and
/// once nginx has quit the keeper is gone too, with no process left in
/// the namespace.
#[test]
fn a_daemon_keeps_the_stack_its_parent_started() {
    need_root!();
    need_program!("nginx", "nginx-light");
    need_program!("ab", "apache2-utils");
    let _turn = serial();
    let lab = Lab::new("fd", need_preload!());
    let root = lab.path("nginx");
    let conf = nginx_conf(&root, true);
    let conf_s = conf.display().to_string();
    let log = std::fs::File::create(lab.path("nginx.out")).unwrap();
    // By its full path: a binary upgrade executes the master's argv[0].
    let o = std::process::Command::new("sh")
        .args(["-c", "command -v nginx"])
        .output()
        .expect("sh");
    let nginx = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let (mut cmd, _) = lab.exec(Host::Stack, false, true, &[&nginx, "-c", &conf_s]);
    let status = cmd
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .status()
        .expect("run nginx");
    let out = std::fs::read_to_string(lab.path("nginx.out")).unwrap_or_default();
    assert!(status.success(), "nginx (daemon on): {status}: {out}");
    no_crash(&out);
    let ns = lab.topo.ns(Host::Stack.side());
    let pids = || {
        let o = std::process::Command::new("ip")
            .args(["netns", "pids", &ns])
            .output()
            .expect("ip netns pids");
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let comms = |p: &[String]| {
        p.iter()
            .map(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .unwrap_or_default()
                    .trim()
                    .to_string()
            })
            .collect::<Vec<_>>()
    };
    lab.wait_port("10.77.0.2", 8080);
    let running = comms(&pids());
    assert!(
        running.iter().any(|c| c == "ustack-keeper"),
        "no keeper runs the stack: {running:?}"
    );
    let ab = |when: &str| {
        let o = lab.linux(&["ab", "-n", "2000", "-c", "4", "http://10.77.0.2:8080/"]);
        let ab = text(&o);
        assert!(
            ab.contains("Complete requests:      2000"),
            "ab {when}: {ab}"
        );
        assert!(ab.contains("Failed requests:        0"), "ab {when}: {ab}");
    };
    ab("after the start");
    let kill = |sig: &str, pid: &str| {
        let _ = std::process::Command::new("kill")
            .args([sig, pid.trim()])
            .status();
    };
    let wait_for = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !done() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
        let log = std::fs::read_to_string(root.join("error.log")).unwrap_or_default();
        assert!(done(), "{what}: nginx's log: {log}");
    };
    // The binary upgrade: SIGUSR2 makes the master (a client of the
    // keeper) fork and exec a new nginx, whose environment nginx cleans
    // (the layer's entries go back in), with the listener inherited; the
    // old master then quits and the new one serves.
    let old = std::fs::read_to_string(root.join("nginx.pid")).unwrap();
    kill("-USR2", &old);
    let oldbin = root.join("nginx.pid.oldbin");
    let new_pid = || std::fs::read_to_string(root.join("nginx.pid")).unwrap_or_default();
    wait_for("a new master after SIGUSR2", &|| {
        oldbin.exists() && !new_pid().trim().is_empty() && new_pid() != old
    });
    kill("-QUIT", &old);
    wait_for("the old master's exit", &|| {
        !std::path::Path::new(&format!("/proc/{}", old.trim())).exists()
    });
    ab("after the binary upgrade");
    let master = new_pid();
    kill("-QUIT", &master);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !pids().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let left = pids();
    assert!(
        left.is_empty(),
        "processes left after nginx quit: {:?}",
        comms(&left)
    );
}

/// haproxy in master-worker mode (`-W`, as its systemd unit runs it): the
/// master opens the listener, forks a worker, then re-executes itself,
/// so the process running the stack execs. A keeper runs the stack on
/// and the new master image rejoins it with the listener it kept. Three
/// reloads (SIGUSR2: the master execs again, a new worker takes the
/// listening sockets from the old one over `SCM_RIGHTS`, `-x sockpair@`)
/// each leave it serving (20 requests answered after each); SIGTERM ends
/// the master, its workers and the keeper.
#[test]
fn haproxy_master_worker_serves_across_reloads() {
    need_root!();
    need_program!("haproxy", "haproxy");
    need_program!("curl", "curl");
    let _turn = serial();
    let lab = Lab::new("fh", need_preload!());
    let conf = lab.path("haproxy-mw.cfg");
    std::fs::write(
        &conf,
        "defaults\n  mode http\n  timeout connect 5s\n  timeout client 10s\n  timeout server 10s\n\
         frontend f\n  bind 10.77.0.2:8095\n  http-request return status 200 content-type text/plain string \"served by haproxy\\n\"\n",
    )
    .unwrap();
    let conf = conf.display().to_string();
    let server = lab.start(Host::Stack, false, &["haproxy", "-W", "-db", "-f", &conf]);
    lab.wait_port("10.77.0.2", 8095);
    let answered = || {
        (0..20)
            .filter(|_| {
                let o = lab.linux(&["curl", "-s", "-m", "5", "http://10.77.0.2:8095/"]);
                String::from_utf8_lossy(&o.stdout) == "served by haproxy\n"
            })
            .count()
    };
    assert_eq!(answered(), 20, "requests answered after the start");
    for reload in 1..=3 {
        let _ = std::process::Command::new("kill")
            .args(["-USR2", &server.pid().to_string()])
            .status();
        // The new worker is up once the old one has left.
        let workers = || {
            let o = std::process::Command::new("pgrep")
                .args(["-c", "-f", &format!("haproxy -sf .* -f {conf}")])
                .output()
                .unwrap();
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<u32>()
                .unwrap_or(0)
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while workers() != 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(answered(), 20, "requests answered after reload {reload}");
    }
    let end = server.stop();
    no_crash(&end.err);
    assert!(
        !end.err.contains("Loading failure") && !end.err.contains("cannot bind"),
        "a reload failed: {}",
        end.err
    );
    let left = || {
        let o = std::process::Command::new("pgrep")
            .args(["-f", &format!("-f {conf}")])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !left().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        left(),
        "",
        "processes of haproxy (or its keeper) left after SIGTERM"
    );
}

/// The process running the stack starts a program with `posix_spawn`,
/// the connection it accepted as that program's standard input and
/// output (file actions), and closes its own copy: `cat` rejoins the
/// stack and echoes 1 MiB byte-exact, three times in a row.
#[test]
fn a_program_the_owner_posix_spawns_serves_the_connection() {
    need_root!();
    need_program!("python3", "python3");
    let _turn = serial();
    let lab = Lab::new("fp", need_preload!());
    let owner = r#"
import os, socket, sys
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("0.0.0.0", int(sys.argv[1]))); l.listen(8)
while True:
    c, _ = l.accept()
    fa = [(os.POSIX_SPAWN_DUP2, c.fileno(), 0), (os.POSIX_SPAWN_DUP2, c.fileno(), 1)]
    pid = os.posix_spawn("/bin/cat", ["cat"], os.environ, file_actions=fa)
    c.close()
    os.waitpid(pid, 0)
"#;
    let prog = script(&lab, "spawner.py", owner);
    let server = lab.start(Host::Stack, false, &["python3", &prog, &PORT.to_string()]);
    lab.wait_port("10.77.0.2", PORT);
    for round in 0..3 {
        let r = client(&lab, 1 << 20, 1, "echo");
        assert_eq!(
            r["exact"], 1,
            "round {round}: echoed by the spawned cat: {r}"
        );
    }
    let end = server.stop();
    no_crash(&end.err);
}

/// A forked child whose SIGALRM handler makes socket calls (TCP_INFO,
/// SIOCOUTQ) every 200 µs while its main flow sends and receives on the
/// same connection (thousands of calls to the owner, each one a signal
/// may interrupt): the handler's calls wait for the call in progress, the
/// child never hangs, and 4 MiB come back from the Linux echo
/// byte-exact.
const ALARMED_C: &str = r#"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <linux/sockios.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

static int s;
static volatile long alarms, handler_ok;

static void on_alarm(int sig) {
    (void)sig;
    struct tcp_info ti;
    socklen_t l = sizeof ti;
    int queued = 0;
    if (getsockopt(s, IPPROTO_TCP, TCP_INFO, &ti, &l) == 0 && ti.tcpi_state == 1 &&
        ioctl(s, SIOCOUTQ, &queued) == 0)
        handler_ok++;
    alarms++;
}

int main(int argc, char **argv) {
    s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) { perror("connect"); return 2; }
    pid_t pid = fork();
    if (pid == 0) {
        struct sigaction sa = {0};
        sa.sa_handler = on_alarm;
        sa.sa_flags = SA_RESTART;
        sigaction(SIGALRM, &sa, NULL);
        struct itimerval it = {{0, 200}, {0, 200}};
        setitimer(ITIMER_REAL, &it, NULL);
        static unsigned char out[1024], in[1024];
        unsigned long sum_out = 0, sum_in = 0;
        for (int i = 0; i < 4096; i++) {
            for (int j = 0; j < 1024; j++) { out[j] = (unsigned char)(i * 31 + j * 7); sum_out += out[j] * (unsigned long)(j + 1); }
            if (send(s, out, sizeof out, 0) != sizeof out) { perror("send"); _exit(3); }
            size_t got = 0;
            while (got < sizeof in) {
                ssize_t n = recv(s, in + got, sizeof in - got, 0);
                if (n <= 0) { perror("recv"); _exit(4); }
                got += n;
            }
            for (int j = 0; j < 1024; j++) sum_in += in[j] * (unsigned long)(j + 1);
        }
        struct itimerval off = {{0, 0}, {0, 0}};
        setitimer(ITIMER_REAL, &off, NULL);
        printf("%s alarms=%ld handler_ok=%ld\n", sum_in == sum_out ? "exact" : "differs", alarms, handler_ok);
        fflush(stdout);
        _exit(sum_in == sum_out && handler_ok > 0 ? 0 : 5);
    }
    /* A child that hangs (a handler waiting for a lock its own call
       holds) is killed after 40 s: the test fails instead of hanging. */
    int st;
    for (int i = 0; i < 4000; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 6;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    printf("hung\n");
    return 7;
}
"#;

#[test]
fn a_signal_handler_in_a_child_makes_socket_calls_mid_call() {
    need_root!();
    need_program!("cc", "gcc");
    let _turn = serial();
    let lab = Lab::new("fs", need_preload!());
    let bin = lab.compile_c("alarmed", ALARMED_C);
    let _peer = lab.linux_echo_peer(7461, 7462);
    let started = lab.start(
        Host::Stack,
        false,
        &[&bin.display().to_string(), "10.77.0.1", "7462"],
    );
    let end = started.wait_within(Duration::from_secs(60));
    no_crash(&end.err);
    assert!(
        end.out.contains("exact") && end.code == 0,
        "the alarmed child: code {:?}, out {:?}, err {}",
        end.code,
        end.out,
        end.err
    );
}

/// A pre-forked Perl server whose workers fork per connection; the
/// grandchild points STDIN and STDOUT at the connection and execs
/// `sha256sum`, which reads and writes them through C stdio (as inetd
/// services do).
const PERL_PREFORK: &str = r#"
use strict; use IO::Socket::INET;
my $l = IO::Socket::INET->new(LocalAddr=>'10.77.0.2', LocalPort=>$ARGV[0], Listen=>16,
    ReuseAddr=>1, Proto=>'tcp') or die "listen: $!";
my @kids;
for my $i (1..3) {
  my $pid = fork(); die "fork: $!" unless defined $pid;
  if ($pid == 0) {
    while (1) {
      my $c = $l->accept or next;
      my $pid2 = fork();
      if ($pid2 == 0) {
        open(STDIN, '<&', $c) or die "dup in: $!";
        open(STDOUT, '>&', $c) or die "dup out: $!";
        close $c; close $l;
        exec('sha256sum') or die "exec: $!";
      }
      close $c; waitpid($pid2, 0);
    }
  }
  push @kids, $pid;
}
$SIG{TERM} = sub { kill 'TERM', @kids; exit 0 };
waitpid($_, 0) for @kids;
"#;

/// Uses C stdio on connections: even ones through `fdopen` (reading and
/// writing streams, `fileno` checked), odd ones in a forked child that
/// `dup2`s the connection onto 0 and 1 and then uses `stdin` and
/// `stdout`. Each line comes back upper-cased; `N` connections, then
/// exit.
const STDIO_C: &str = r#"
#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
static int serve(FILE *in, FILE *out) {
    char line[4096]; long n = 0;
    while (fgets(line, sizeof line, in)) {
        for (char *p = line; *p; p++) *p = toupper((unsigned char)*p);
        if (fputs(line, out) == EOF) return 1;
        n++;
    }
    fprintf(out, "lines %ld\n", n);
    return fflush(out) == EOF || ferror(in);
}
int main(int argc, char **argv) {
    int port = atoi(argv[1]), conns = atoi(argv[2]), bad = 0, one = 1;
    int l = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 8)) { perror("listen"); return 2; }
    for (int i = 0; i < conns; i++) {
        int c = accept(l, NULL, NULL);
        if (c < 0) { perror("accept"); return 2; }
        if (i % 2 == 0) {
            FILE *in = fdopen(c, "r"), *out = fdopen(dup(c), "w");
            if (!in || !out || fileno(in) != c) { fprintf(stderr, "fdopen\n"); return 3; }
            bad |= serve(in, out);
            fclose(in); fclose(out);
        } else {
            pid_t p = fork();
            if (p == 0) {
                if (dup2(c, 0) != 0 || dup2(c, 1) != 1) _exit(4);
                close(c); close(l);
                int r = serve(stdin, stdout);
                if (fileno(stdin) != 0 || fileno(stdout) != 1) r = 5;
                exit(r);
            }
            close(c);
            int st = 0; waitpid(p, &st, 0);
            bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
        }
    }
    printf("%s\n", bad ? "failed" : "served");
    return bad;
}
"#;

/// Sends each connection `n` bytes (lines or random data) with the
/// write side shut after, reads to the end, and prints how many answers
/// matched.
const STDIO_CLIENT: &str = r#"
import hashlib, os, socket, sys, threading, time
port, conns, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ok = []
def one():
    if mode == "lines":
        data = b"".join(os.urandom(1 + i % 300).hex().encode() + b"\n" for i in range(3000))
        want = data.upper() + b"lines 3000\n"
    else:
        data = os.urandom(1 << 20)
        want = hashlib.sha256(data).hexdigest().encode() + b"  -\n"
    for _ in range(150):
        try:
            s = socket.create_connection(("10.77.0.2", port), timeout=30)
            break
        except ConnectionRefusedError:
            time.sleep(0.1)
    got = bytearray()
    def rd():
        while True:
            d = s.recv(65536)
            if not d: break
            got.extend(d)
    t = threading.Thread(target=rd); t.start()
    s.sendall(data); s.shutdown(socket.SHUT_WR); t.join(); s.close()
    ok.append(bytes(got) == want)
    if bytes(got) != want:
        print("mismatch", len(got), len(want), bytes(got[:80]), file=sys.stderr)
for _ in range(conns // 2 if mode == "lines" else 1):
    ts = [threading.Thread(target=one) for _ in range(2 if mode == "lines" else conns)]
    [t.start() for t in ts]; [t.join() for t in ts]
print(sum(ok))
"#;

#[test]
fn c_stdio_reads_and_writes_ustack_sockets() {
    need_root!();
    need_program!("cc", "gcc");
    need_program!("perl", "perl");
    need_program!("python3", "python3");
    let _turn = serial();
    let lab = Lab::new("fi", need_preload!());
    let cli = script(&lab, "stdio_client.py", STDIO_CLIENT);

    // fdopen, and dup2 onto the standard descriptors in a forked child.
    let bin = lab.compile_c("stdio_server", STDIO_C);
    let server = lab.start(
        Host::Stack,
        false,
        &[&bin.display().to_string(), "7471", "6"],
    );
    lab.wait_arp("10.77.0.2");
    let o = lab.linux(&["timeout", "60", "python3", &cli, "7471", "6", "lines"]);
    let end = server.wait_within(Duration::from_secs(30));
    no_crash(&end.err);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "6",
        "lines upper-cased through fdopen and dup2'd stdio: {}\nserver: {:?} {}",
        text(&o),
        end.out,
        end.err
    );
    assert!(
        end.out.contains("served") && end.code == 0,
        "the stdio server: code {:?}, out {:?}, err {}",
        end.code,
        end.out,
        end.err
    );

    // An exec'd program whose standard descriptors are the connection.
    let pl = script(&lab, "prefork.pl", PERL_PREFORK);
    let server = lab.start(Host::Stack, false, &["perl", &pl, "7472"]);
    lab.wait_port("10.77.0.2", 7472);
    let o = lab.linux(&["timeout", "90", "python3", &cli, "7472", "4", "sha"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "4",
        "sha256sum exec'd on the connection by a pre-forked worker: {}",
        text(&o)
    );
    server.stop();
}
