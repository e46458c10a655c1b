//! Descriptors under `ustack exec`: a socket's identity as the inspecting
//! calls see it, numbers recycled behind the layer's back (raw
//! `syscall(SYS_close)`, `fclose`) never taken for sockets, and libuv
//! programs (Node under HTTP load, BIND's `dig`), in namespaces made by
//! each test (the topology of netns_preload.rs).
//!
//! The tests take turns (one lock) and find the library as
//! netns_preload.rs says.

#[macro_use]
mod common;

use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::lab::*;
use common::{json_lines, stdout_json};

/// One test at a time: each loads the machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

// ------------------------------------- descriptors: identity and inspection

/// A C program (compiled at test time) that checks what a ustack socket
/// looks like to the calls that inspect a descriptor, and that a socket
/// closed behind the layer's back (a raw `syscall(SYS_close)`, as libuv
/// closes; `fclose` of an `fdopen`ed socket, which closes inside the C
/// library) leaves its number to whatever the kernel gives it next: a
/// pipe, a file, a directory work as such and are not taken for sockets.
/// Prints one JSON object; SIGALRM ends it after 20 s (the old layer
/// blocked reading the pipe as a socket).
const IDENTITY_C: &str = r#"
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static int opt(int fd, int name) {
    int v = -1; socklen_t l = sizeof v;
    if (getsockopt(fd, SOL_SOCKET, name, &v, &l) < 0) return -errno;
    return v;
}
static const char *kind(int fd) {
    struct stat st;
    if (fstat(fd, &st) < 0) return "error";
    if (S_ISSOCK(st.st_mode)) return "socket";
    if (S_ISFIFO(st.st_mode)) return "fifo";
    if (S_ISREG(st.st_mode)) return "file";
    if (S_ISDIR(st.st_mode)) return "dir";
    return "other";
}
static int connected(const char *ip, int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
    inet_pton(AF_INET, ip, &a.sin_addr);
    if (connect(s, (struct sockaddr *)&a, sizeof a) < 0) { perror("connect"); exit(3); }
    return s;
}
/* Echo "ping" through a fresh socket: the stack still works. */
static int echo_ok(const char *ip, int port) {
    int s = connected(ip, port); char b[8] = {0};
    if (write(s, "ping", 4) != 4) return 0;
    int n = 0;
    while (n < 4) { int r = read(s, b + n, 4 - n); if (r <= 0) break; n += r; }
    close(s);
    return n == 4 && memcmp(b, "ping", 4) == 0;
}

int main(int argc, char **argv) {
    const char *ip = argv[1]; int port = atoi(argv[2]); const char *file = argv[3];
    alarm(20);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in any = { .sin_family = AF_INET, .sin_port = htons(7399) };
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    printf("{\"stream_kind\":\"%s\",\"dgram_kind\":\"%s\"", kind(l), kind(u));
    struct stat st; fstat(l, &st);
    printf(",\"mode\":\"%o\"", (unsigned)st.st_mode);
    struct statx sx;
    statx(l, "", AT_EMPTY_PATH, STATX_TYPE, &sx);
    printf(",\"statx_sock\":%d", S_ISSOCK(sx.stx_mode) ? 1 : 0);
    char path[64], link[64] = {0};
    snprintf(path, sizeof path, "/proc/self/fd/%d", l);
    readlink(path, link, sizeof link - 1);
    printf(",\"proc_link\":\"%.8s\"", link);
    stat(path, &st);
    printf(",\"proc_stat_sock\":%d", S_ISSOCK(st.st_mode) ? 1 : 0);
    printf(",\"type\":[%d,%d],\"domain\":[%d,%d],\"protocol\":[%d,%d]",
           opt(l, SO_TYPE), opt(u, SO_TYPE), opt(l, SO_DOMAIN), opt(u, SO_DOMAIN),
           opt(l, SO_PROTOCOL), opt(u, SO_PROTOCOL));
    int before = opt(l, SO_ACCEPTCONN);
    bind(l, (struct sockaddr *)&any, sizeof any);
    listen(l, 8);
    printf(",\"acceptconn\":[%d,%d]", before, opt(l, SO_ACCEPTCONN));
    int nb = 1;
    printf(",\"fionbio\":%d", ioctl(u, FIONBIO, &nb));
    char b[8];
    int r = recv(u, b, sizeof b, 0);
    printf(",\"nonblocking_recv\":%d", r < 0 && errno == EAGAIN ? 1 : 0);

    /* FIONREAD: the echoed bytes queued; SIOCOUTQ: nothing unacknowledged
       once the echo is back. */
    int c = connected(ip, port);
    write(c, "hello", 5);
    struct pollfd p = { .fd = c, .events = POLLIN };
    poll(&p, 1, 5000);
    usleep(200000);
    int inq = -1, outq = -1;
    ioctl(c, FIONREAD, &inq);
    ioctl(c, SIOCOUTQ, &outq);
    printf(",\"fionread\":%d,\"siocoutq\":%d", inq, outq);
    r = ioctl(c, SIOCATMARK, &inq);
    printf(",\"siocatmark\":\"%s\"", r < 0 && errno == ENOTTY ? "ENOTTY" : "other");

    /* Closed by a raw system call; a pipe takes the number. */
    int n = c;
    syscall(SYS_close, c);
    int pp[2]; pipe(pp);
    printf(",\"pipe_same_number\":%d", pp[0] == n || pp[1] == n ? 1 : 0);
    write(pp[1], "abc", 3);
    char got[4] = {0};
    r = read(pp[0], got, 3);
    printf(",\"pipe_read\":\"%s\",\"pipe_kind\":\"%s\",\"pipe_so_type\":%d",
           r == 3 ? got : "?", kind(n), opt(n, SO_TYPE));
    close(pp[0]); close(pp[1]);

    /* Closed by a raw system call; a file takes the number. */
    c = connected(ip, port); n = c;
    syscall(SYS_close, c);
    int f = open(file, O_RDWR | O_CREAT | O_TRUNC, 0600);
    printf(",\"file_same_number\":%d", f == n ? 1 : 0);
    r = write(f, "filedata", 8);
    lseek(f, 0, SEEK_SET);
    memset(got, 0, sizeof got);
    int rr = read(f, got, 3);
    printf(",\"file_write\":%d,\"file_read\":\"%.3s\",\"file_kind\":\"%s\"", r, rr == 3 ? got : "?", kind(f));
    close(f);

    /* Closed inside the C library (fclose of fdopen); opendir takes the
       number, unseen: the layer's checks find it is no socket. */
    c = connected(ip, port); n = c;
    fclose(fdopen(c, "r+"));
    DIR *d = opendir("/");
    int dfd = dirfd(d);
    printf(",\"dir_same_number\":%d,\"dir_kind\":\"%s\",\"dir_so_type\":%d",
           dfd == n ? 1 : 0, kind(dfd), opt(dfd, SO_TYPE));
    closedir(d);

    /* A socket made by a raw system call is the kernel's, which has no
       route here (the stack's namespace gives the kernel no address). */
    int k = syscall(SYS_socket, AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(port) };
    inet_pton(AF_INET, ip, &to.sin_addr);
    r = sendto(k, "x", 1, 0, (struct sockaddr *)&to, sizeof to);
    printf(",\"raw_socket_sendto\":\"%s\"", r < 0 && errno == ENETUNREACH ? "ENETUNREACH" : "other");
    close(k);

    printf(",\"echo_after\":%d}\n", echo_ok(ip, port));
    fflush(stdout);
    close(l); close(u);
    return 0;
}
"#;

/// A ustack socket looks like a socket to every call that inspects a
/// descriptor (fstat, statx, /proc/self/fd, SO_TYPE/SO_DOMAIN/
/// SO_PROTOCOL/SO_ACCEPTCONN, FIONREAD, SIOCOUTQ, FIONBIO), and a socket
/// closed behind the layer's back never makes its recycled number a
/// socket: a pipe, a file and a directory given that number work as such
/// (ENOTSOCK for SO_TYPE, as Linux says), a socket made by a raw
/// `syscall(SYS_socket)` is the kernel's, the stack still carries new
/// connections, and no descriptor is left in the layer's table.
#[test]
fn recycled_numbers_are_never_sockets_and_sockets_look_like_sockets() {
    need_root!();
    need_program!("cc", "gcc");
    let _turn = serial();
    let lab = Lab::new("qi", need_preload!());
    let bin = lab.compile_c("identity", IDENTITY_C);
    let peer = lab.linux_echo_peer(7301, 7302);
    let file = lab.path("recycled.txt");
    let end = lab.run(
        Host::Stack,
        &[
            &bin.display().to_string(),
            "10.77.0.1",
            "7302",
            &file.display().to_string(),
        ],
    );
    drop(peer);
    end.check(0);
    let r = stdout_json("identity", end.out.as_bytes(), end.err.as_bytes());
    eprintln!("descriptor identity on ustack: {r}");
    const ENOTSOCK: i32 = 88;
    let want = serde_json::json!({
        "stream_kind": "socket", "dgram_kind": "socket", "mode": "140777",
        "statx_sock": 1, "proc_link": "socket:[", "proc_stat_sock": 1,
        // SOCK_STREAM 1, SOCK_DGRAM 2; AF_INET 2; IPPROTO_TCP 6, IPPROTO_UDP 17.
        "type": [1, 2], "domain": [2, 2], "protocol": [6, 17],
        "acceptconn": [0, 1], "fionbio": 0, "nonblocking_recv": 1,
        "fionread": 5, "siocoutq": 0, "siocatmark": "ENOTTY",
        "pipe_same_number": 1, "pipe_read": "abc", "pipe_kind": "fifo",
        "pipe_so_type": -ENOTSOCK,
        "file_same_number": 1, "file_write": 8, "file_read": "fil", "file_kind": "file",
        "dir_same_number": 1, "dir_kind": "dir", "dir_so_type": -ENOTSOCK,
        "raw_socket_sendto": "ENETUNREACH", "echo_after": 1,
    });
    for (k, v) in want.as_object().unwrap() {
        assert_eq!(&r[k], v, "{k}: {r}");
    }
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "filedata",
        "the file behind the recycled number"
    );
    // The unsupported ioctl is named once on stderr.
    assert_eq!(
        end.err
            .lines()
            .filter(|l| l.contains("ioctl SIOCATMARK"))
            .count(),
        1,
        "{}",
        end.err
    );
    // Every socket, the ones closed behind the layer's back too, left the
    // table.
    let last = end.last.as_ref().expect("a last telemetry line");
    assert_eq!(last["app"]["preload_descriptors"], 0, "{last}");
}

// ------------------------------------------------- libuv: Node and dig

/// A Node HTTP server (libuv closes every descriptor with a raw
/// `syscall(SYS_close)`): 1000-byte answers; exits 0 on SIGTERM.
const NODE_SERVER: &str = r#"
const http = require('http');
const body = 'x'.repeat(1000);
const srv = http.createServer((req, res) => res.end(body));
srv.listen(8080, process.argv[2], () => console.log('listening'));
process.on('SIGTERM', () => { srv.close(); process.exit(0); });
"#;

/// The Linux host's HTTP load for the Node test: `THREADS` threads, each
/// `PER` requests on a connection of its own (HTTP/1.1), the body checked,
/// then closed by the client first (so the TIME_WAIT is the kernel's and
/// a reused client port never meets one on ustack). Prints the answers
/// right, wrong (those not begun within 60 s too), and the rate.
const HTTP_LOAD: &str = r#"
import json, socket, sys, threading, time
ip, port, threads, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
body = b"x" * 1000
ok = [0] * threads; bad = [0] * threads
def run(k):
    for _ in range(per):
        if time.monotonic() > t0 + 60:
            bad[k] += 1
            continue
        try:
            s = socket.create_connection((ip, port), timeout=10)
            s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            data = b""
            while not (b"\r\n\r\n" in data and data.endswith(body)) and len(data) < 4096:
                d = s.recv(4096)
                if not d:
                    break
                data += d
            s.close()
            if data.startswith(b"HTTP/1.1 200") and data.endswith(body):
                ok[k] += 1
            else:
                bad[k] += 1
        except OSError:
            bad[k] += 1
t0 = time.monotonic()
ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
[t.start() for t in ts]
[t.join() for t in ts]
print(json.dumps({"ok": sum(ok), "bad": sum(bad), "rate": sum(ok) / (time.monotonic() - t0)}))
"#;

/// Stock Node (libuv closes every descriptor with a raw
/// `syscall(SYS_close)`) serves 3000 HTTP requests from 8 clients at once
/// on the Linux host, each on a connection of its own: every answer
/// right, and afterwards no connection left in the stack and only the
/// listener in the layer's table (the old layer kept every raw-closed
/// socket: their connections were never closed, and each recycled number
/// had a stale socket under it). utop still attaches (the telemetry
/// thread's clients got recycled numbers), SIGTERM ends Node, and its
/// stack ends with every pool back at zero.
///
/// Not `ab`: ab waits for the server to close, so ustack holds the
/// TIME_WAIT, and a client port Linux reuses within the run meets it: the
/// engine answers that SYN with an ACK rather than a new connection (the
/// TCP engine's matter, not the layer's).
#[test]
fn node_serves_3000_connections_and_stops_on_sigterm() {
    need_root!();
    need_program!("node", "nodejs");
    need_program!(PYTHON, "python3");
    let _turn = serial();
    let lab = Lab::new("qn", need_preload!());
    let script = lab.path("server.js");
    std::fs::write(&script, NODE_SERVER).unwrap();
    let load = lab.path("load.py");
    std::fs::write(&load, HTTP_LOAD).unwrap();
    let srv = lab.start(
        Host::Stack,
        false,
        &["node", &script.display().to_string(), "10.77.0.2"],
    );
    lab.wait_port("10.77.0.2", 8080);
    let o = lab.linux(&[
        PYTHON,
        &load.display().to_string(),
        "10.77.0.2",
        "8080",
        "8",
        "375",
    ]);
    let r = stdout_json("HTTP load", &o.stdout, &o.stderr);
    eprintln!("node on ustack, 3000 connections from 8 clients: {r}");
    assert_eq!(r["ok"], 3000, "{r}");
    assert_eq!(r["bad"], 0, "{r}");
    // The last connections close within a moment: then none is left.
    let deadline = Instant::now() + Duration::from_secs(10);
    let snap = loop {
        let snap = common::telemetry(&srv.sock);
        let left = snap["stack"]["tcp"]["connections"].as_u64();
        if left == Some(0) || Instant::now() >= deadline {
            break snap;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        snap["stack"]["tcp"]["connections"], 0,
        "{}",
        snap["stack"]["tcp"]
    );
    assert_eq!(snap["app"]["preload_descriptors"], 1, "{}", snap["app"]);
    srv.check_utop();
    let end = srv.stop();
    end.check(0);
}

/// BIND's `dig` (libuv 1.44: raw `syscall` for close, sendmmsg and
/// recvmmsg) against dnsmasq on the Linux host (the kernel's sockets),
/// over UDP: the answer dnsmasq was told to give (the old layer passed
/// the raw sendmmsg to the kernel's eventfd: ENOTSOCK, no answer).
#[test]
fn dig_asks_dnsmasq_over_udp() {
    need_root!();
    need_program!("dig", "bind9-dnsutils");
    need_program!("dnsmasq", "dnsmasq");
    let _turn = serial();
    let lab = Lab::new("qg", need_preload!());
    let _dns = lab.linux_daemon(&[
        "dnsmasq",
        "--keep-in-foreground",
        "--no-resolv",
        "--no-hosts",
        "--user=root",
        "--pid-file",
        "--bind-interfaces",
        "--listen-address=10.77.0.1",
        "--address=/ustack.test/10.77.0.99",
    ]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !lab
        .linux(&[
            "dig",
            "+short",
            "+time=1",
            "+tries=1",
            "@10.77.0.1",
            "ustack.test",
        ])
        .stdout
        .starts_with(b"10.77.0.99")
    {
        assert!(Instant::now() < deadline, "dnsmasq never answered");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Over TCP dig sets TCP_MAXSEG and TCP_USER_TIMEOUT and stops when
    // they fail: that waits for the TCP options' own issue.
    let transport = "+notcp";
    let end = lab
        .start_with(
            Host::Stack,
            false,
            false,
            &[
                "dig",
                transport,
                "+time=3",
                "+tries=2",
                "@10.77.0.1",
                "ustack.test",
                "A",
            ],
        )
        .wait();
    end.check(0);
    assert!(
        end.out
            .lines()
            .any(|l| l.starts_with("ustack.test.") && l.ends_with("10.77.0.99")),
        "dig {transport} on ustack: {}{}",
        end.out,
        end.err
    );
    // Over in well under a telemetry period: no snapshot to read.
    assert!(!end.err.contains("non-socket"), "{}", end.err);
}

// ------------------------------------------------------ fallbacks, said

/// Opens two AF_INET6 sockets (ustack's), connects an AF_INET one to the echo peer,
/// forks: the child sends on the inherited socket twice and opens an
/// AF_INET socket of its own (both on the shared stack); the parent then
/// sends too and reads the four bytes echoed.
const FALLBACKS: &str = r#"
import errno, json, os, socket, sys
a = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
b = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
pid = os.fork()
if pid == 0:
    out = []
    for _ in range(2):
        try:
            s.send(b"x")
            out.append("sent")
        except OSError as e:
            out.append(errno.errorcode.get(e.errno, str(e.errno)))
    k = socket.socket()
    k.close()
    print(json.dumps({"child_send": out}), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
s.sendall(b"ok")
got = b""
while len(got) < 4:
    d = s.recv(10)
    if not d: break
    got += d
print(json.dumps({"echo": got.decode()}), flush=True)
"#;

/// A forked child uses its parent's socket and opens its own on the shared
/// stack, with nothing said; what ustack refuses is said in one line:
/// `ustack exec` refuses a Go program (exit status 2, before it runs:
/// LD_PRELOAD cannot carry raw system calls).
#[test]
fn a_forked_child_shares_the_stack_and_go_is_refused() {
    need_root!();
    need_program!(PYTHON, "python3");
    need_program!("cc", "gcc");
    need_program!("objcopy", "binutils");
    let _turn = serial();
    let lab = Lab::new("qf", need_preload!());
    let script = lab.path("fallbacks.py");
    std::fs::write(&script, FALLBACKS).unwrap();
    let peer = lab.linux_echo_peer(7401, 7402);
    let end = lab.run(
        Host::Stack,
        &[PYTHON, &script.display().to_string(), "10.77.0.1", "7402"],
    );
    drop(peer);
    end.check(0);
    let lines = json_lines(&end.out);
    let child = lines.iter().find(|v| v.get("child_send").is_some());
    assert_eq!(
        child.map(|v| v["child_send"].clone()),
        Some(serde_json::json!(["sent", "sent"])),
        "{}{}",
        end.out,
        end.err
    );
    // The child's two bytes, then the parent's.
    assert!(lines.iter().any(|v| v["echo"] == "xxok"), "{}", end.out);
    // Nothing fell back to the kernel: nothing to say of the fork.
    for what in ["forked", "parent opened", "kernel's"] {
        assert!(!end.err.contains(what), "{what}: {}", end.err);
    }

    // A Go program (a C program given Go's build-ID note section) is
    // refused before it runs; the same program without the note runs.
    let plain = lab.compile_c(
        "hello",
        "#include <stdio.h>\nint main(void) { puts(\"ran\"); return 0; }\n",
    );
    let note = lab.path("go.note");
    // An ELF note: namesz 4, descsz 8, type 4 (NT_GO_BUILDID), "Go\0\0".
    let mut bytes = Vec::new();
    for v in [4u32, 8, 4] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    bytes.extend_from_slice(b"Go\0\0buildid1");
    std::fs::write(&note, bytes).unwrap();
    let go = lab.path("fakego");
    let o = Command::new("objcopy")
        .arg("--add-section")
        .arg(format!(".note.go.buildid={}", note.display()))
        .args(["--set-section-flags", ".note.go.buildid=alloc,readonly"])
        .arg(&plain)
        .arg(&go)
        .output()
        .expect("run objcopy");
    assert!(o.status.success(), "objcopy: {}", text(&o));
    let ran = lab
        .start_with(Host::Stack, false, false, &[&plain.display().to_string()])
        .wait();
    ran.check(0);
    assert_eq!(ran.out.trim(), "ran", "{}", ran.err);
    let refused = lab
        .start_with(Host::Stack, false, false, &[&go.display().to_string()])
        .wait();
    assert_eq!(refused.code, 2, "{}{}", refused.out, refused.err);
    assert_eq!(refused.out, "", "the Go program ran");
    let lines: Vec<&str> = refused.err.lines().collect();
    assert_eq!(lines.len(), 1, "{}", refused.err);
    assert!(
        lines[0].starts_with("ustack: ") && lines[0].contains("is a Go program"),
        "{}",
        refused.err
    );
}
