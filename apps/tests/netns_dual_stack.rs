//! Dual-stack programs under `ustack exec`: stock servers that bind the
//! IPv6 wildcard (`::`, `[::]`) serve Linux clients over IPv4 (seen as
//! v4-mapped addresses, `::ffff:10.77.0.1`, where the program asked for
//! AF_INET6 with `IPV6_V6ONLY` off) and over IPv6; servers that open an
//! IPv4 and an IPv6-only listener on one port (nginx, redis) get each
//! family on its own socket; and a client on ustack reaches Linux through
//! a v4-mapped address and over IPv6, with the addresses each call
//! reports checked. The stack runs as 10.77.0.2 and fd77::2, Linux as
//! 10.77.0.1 and fd77::1, in namespaces the test makes and removes.
//! Needs root; the all-features build runs it.
#![cfg(feature = "pcap")]

#[macro_use]
mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::lab::*;
use common::sha256;
use common::stdout_json;
use common::stock::wait_for;

/// One test at a time: each loads the machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A file of `len` random bytes in the lab, and its SHA-256.
fn random_file(lab: &Lab, name: &str, len: usize) -> String {
    let path = lab.path(name);
    let mut data = vec![0u8; len];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    std::fs::write(&path, data).unwrap();
    sha256(&path)
}

/// `curl` on the Linux host fetching `url` into the lab's `name`: its
/// SHA-256 (curl failing fails the test).
fn fetch(lab: &Lab, url: &str, name: &str) -> String {
    let out = lab.path(name);
    let o = lab.linux(&[
        "curl",
        "-sS",
        "-g",
        "--max-time",
        "20",
        "-o",
        &out.display().to_string(),
        url,
    ]);
    assert!(o.status.success(), "curl {url}: {}", text(&o));
    sha256(&out)
}

/// `curl` on the Linux host: the body of `url`.
fn body(lab: &Lab, url: &str) -> String {
    let o = lab.linux(&["curl", "-sS", "-g", "--max-time", "20", url]);
    assert!(o.status.success(), "curl {url}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Python's `http.server --bind ::` (its dual-stack server turns
/// `IPV6_V6ONLY` off): a file fetched over IPv4 and over IPv6 is
/// byte-exact, and the server's log names the IPv4 client by its
/// v4-mapped address and the IPv6 one by its own.
#[test]
fn python_http_server_on_the_ipv6_wildcard_serves_both_families() {
    need_root!();
    need_program!("curl", "curl");
    let _turn = serial();
    let lab = Lab::new("d6p", need_preload!());
    lab.ipv6();
    let www = lab.path("");
    let want = random_file(&lab, "blob", 3 << 20);
    let server = lab.start(
        Host::Stack,
        false,
        &[
            PYTHON,
            "-m",
            "http.server",
            "8000",
            "--bind",
            "::",
            "--directory",
            &www.display().to_string(),
        ],
    );
    lab.wait_port("10.77.0.2", 8000);
    assert_eq!(
        fetch(&lab, "http://10.77.0.2:8000/blob", "over4"),
        want,
        "over IPv4"
    );
    assert_eq!(
        fetch(&lab, "http://[fd77::2]:8000/blob", "over6"),
        want,
        "over IPv6"
    );
    let end = server.stop();
    assert!(
        end.out.contains("Serving HTTP on :: port 8000"),
        "{}",
        end.out
    );
    let logged = |who: &str| {
        end.err
            .lines()
            .any(|l| l.starts_with(&format!("{who} - - ")) && l.contains("GET /blob"))
    };
    assert!(logged("::ffff:10.77.0.1"), "IPv4 client: {}", end.err);
    assert!(logged("fd77::1"), "IPv6 client: {}", end.err);
    no_crash_in(&end);
}

/// A Node server's default `listen(port)` binds `::` (libuv tries IPv6
/// first): it says so in `server.address()`, and answers both families
/// with the client's address as Node sees it.
#[test]
fn node_default_listen_serves_both_families() {
    need_root!();
    need_program!("curl", "curl");
    need_program!("node", "nodejs");
    let _turn = serial();
    let lab = Lab::new("d6n", need_preload!());
    lab.ipv6();
    let script = lab.path("server.js");
    std::fs::write(
        &script,
        "const srv = require('http').createServer((q, r) => r.end(q.socket.remoteAddress));\n\
         srv.listen(8001, () => console.log(JSON.stringify(srv.address())));\n",
    )
    .unwrap();
    let server = lab.start(Host::Stack, false, &["node", &script.display().to_string()]);
    lab.wait_port("10.77.0.2", 8001);
    assert_eq!(body(&lab, "http://10.77.0.2:8001/"), "::ffff:10.77.0.1");
    assert_eq!(body(&lab, "http://[fd77::2]:8001/"), "fd77::1");
    let end = server.stop();
    let addr = end.out.lines().next().unwrap_or_default();
    let addr: serde_json::Value = serde_json::from_str(addr).unwrap_or_default();
    assert_eq!(addr["address"], "::", "{}", end.out);
    assert_eq!(addr["family"], "IPv6", "{}", end.out);
    no_crash_in(&end);
}

/// nginx with `listen PORT; listen [::]:PORT;`: an IPv4 listener and an
/// IPv6-only one (nginx's default for `[::]`) on one port, each serving
/// its family; the access log names each client in its own family.
#[test]
fn nginx_listens_on_both_families_on_one_port() {
    need_root!();
    need_program!("curl", "curl");
    need_program!("nginx", "nginx-light");
    let _turn = serial();
    let lab = Lab::new("d6x", need_preload!());
    lab.ipv6();
    let dir = lab.path("nginx");
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    let want = random_file(&lab, "page", 1 << 20);
    let d = dir.display();
    let conf = dir.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\nuser root;\n\
             pid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n  access_log {d}/access.log;\n  client_body_temp_path {d}/tmp;\n\
               proxy_temp_path {d}/tmp;\n  fastcgi_temp_path {d}/tmp;\n  uwsgi_temp_path {d}/tmp;\n\
               scgi_temp_path {d}/tmp;\n\
               server {{ listen 8002; listen [::]:8002; root {www}; }}\n}}\n",
            www = lab.path("").display()
        ),
    )
    .unwrap();
    let server = lab.start(
        Host::Stack,
        false,
        &[
            "nginx",
            "-e",
            &format!("{d}/error.log"),
            "-p",
            &d.to_string(),
            "-c",
            &conf.display().to_string(),
        ],
    );
    lab.wait_port("10.77.0.2", 8002);
    assert_eq!(fetch(&lab, "http://10.77.0.2:8002/page", "over4"), want);
    assert_eq!(fetch(&lab, "http://[fd77::2]:8002/page", "over6"), want);
    // nginx writes the log line as a request ends.
    let log = dir.join("access.log");
    let logged = |who: &str| {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .any(|l| l.starts_with(&format!("{who} - - ")) && l.contains("GET /page"))
    };
    assert!(
        wait_for(Duration::from_secs(5), || logged("10.77.0.1")
            && logged("fd77::1")),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let end = server.stop();
    no_crash_in(&end);
    let errors = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
    assert!(!errors.contains("[emerg]"), "{errors}");
}

/// redis-server bound to `0.0.0.0 ::` (redis makes its IPv6 listener
/// IPv6-only): a key set over IPv4 is read back over IPv6.
#[test]
fn redis_bound_to_both_families() {
    need_root!();
    need_program!("redis-server", "redis-server");
    need_program!("redis-cli", "redis-tools");
    let _turn = serial();
    let lab = Lab::new("d6r", need_preload!());
    lab.ipv6();
    let server = lab.start(
        Host::Stack,
        false,
        &[
            "redis-server",
            "--port",
            "8003",
            "--bind",
            "0.0.0.0",
            "::",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--dir",
            &lab.path("").display().to_string(),
        ],
    );
    lab.wait_port("10.77.0.2", 8003);
    let cli = |host: &str, args: &[&str]| {
        let o = lab.linux(&[&["redis-cli", "-h", host, "-p", "8003"][..], args].concat());
        assert!(
            o.status.success(),
            "redis-cli -h {host} {args:?}: {}",
            text(&o)
        );
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    assert_eq!(cli("10.77.0.2", &["set", "dual", "stack"]), "OK");
    assert_eq!(cli("fd77::2", &["get", "dual"]), "stack");
    let clients = cli("fd77::2", &["client", "list"]);
    assert!(
        clients.contains("addr=[fd77::1]:") || clients.contains("addr=fd77::1:"),
        "{clients}"
    );
    let end = server.stop();
    no_crash_in(&end);
}

/// A Linux echo server for the client test: TCP and UDP on `::` with
/// `IPV6_V6ONLY` off (both families), port from argv.
const LINUX_ECHO: &str = r#"
import socket, sys, threading
port = int(sys.argv[1])
t = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
t.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("::", port))
t.listen(8)
u = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
u.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
u.bind(("::", port))
def udp():
    while True:
        data, src = u.recvfrom(65536)
        u.sendto(data, src)
threading.Thread(target=udp, daemon=True).start()
def serve(c):
    while True:
        b = c.recv(65536)
        if not b:
            break
        c.sendall(b)
    c.close()
print("ready", flush=True)
while True:
    c, _ = t.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// The client on ustack: TCP to a v4-mapped address and over IPv6 (1 MiB
/// each, echoed byte-exact), the addresses getsockname, getpeername and
/// recvfrom give, an IPv6-only socket refused a v4-mapped peer, UDP both
/// ways, `IPV6_V6ONLY`'s default; one JSON line.
const CLIENT: &str = r#"
import errno, hashlib, json, os, socket, sys
port = int(sys.argv[1])
out = {}
def echo(addr):
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect(addr)
    data = os.urandom(1 << 20)
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    got = bytearray()
    while True:
        b = s.recv(1 << 16)
        if not b:
            break
        got += b
    r = {"peer": s.getpeername()[0], "local": s.getsockname()[0],
         "same": hashlib.sha256(got).digest() == hashlib.sha256(data).digest()}
    s.close()
    return r
out["mapped"] = echo(("::ffff:10.77.0.1", port))
out["v6"] = echo(("fd77::1", port))
s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
out["v6only_default"] = s.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
try:
    s.connect(("::ffff:10.77.0.1", port))
    out["v6only_mapped"] = "ok"
except OSError as e:
    out["v6only_mapped"] = errno.errorcode.get(e.errno, str(e.errno))
u = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
u.settimeout(5)
for name, host in (("udp_mapped", "::ffff:10.77.0.1"), ("udp_v6", "fd77::1")):
    msg = os.urandom(1200)
    u.sendto(msg, (host, port))
    try:
        data, src = u.recvfrom(4096)
        out[name] = {"same": data == msg, "from": src[0], "port": src[1]}
    except socket.timeout:
        out[name] = "timeout"
out["udp_local"] = u.getsockname()[0]
print(json.dumps(out), flush=True)
"#;

/// A client on ustack reaches a Linux server through a v4-mapped address
/// and over IPv6, with every address in the socket's family.
#[test]
fn client_reaches_linux_through_mapped_and_ipv6_addresses() {
    need_root!();
    let _turn = serial();
    let lab = Lab::new("d6c", need_preload!());
    lab.ipv6();
    let echo = lab.path("echo.py");
    std::fs::write(&echo, LINUX_ECHO).unwrap();
    let _peer = lab.linux_daemon(&[PYTHON, &echo.display().to_string(), "7600"]);
    assert!(
        wait_for(Duration::from_secs(10), || lab
            .linux(&["nc", "-z", "-w", "1", "10.77.0.1", "7600"])
            .status
            .success()),
        "the Linux echo did not start"
    );
    let client = lab.path("client.py");
    std::fs::write(&client, CLIENT).unwrap();
    let end = lab
        .start(
            Host::Stack,
            false,
            &[PYTHON, &client.display().to_string(), "7600"],
        )
        .wait();
    end.check(0);
    let got = stdout_json("dual-stack client", end.out.as_bytes(), end.err.as_bytes());
    let want = serde_json::json!({
        "mapped": {"peer": "::ffff:10.77.0.1", "local": "::ffff:10.77.0.2", "same": true},
        "v6": {"peer": "fd77::1", "local": "fd77::2", "same": true},
        "v6only_default": 0,
        "v6only_mapped": "ENETUNREACH",
        "udp_mapped": {"same": true, "from": "::ffff:10.77.0.1", "port": 7600},
        "udp_v6": {"same": true, "from": "fd77::1", "port": 7600},
        "udp_local": "::",
    });
    assert_eq!(got, want);
}

/// No panic or backtrace in a stopped program's output.
fn no_crash_in(end: &Ended) {
    common::no_crash(&end.err);
}

/// On ustack: connect to `[fd99::1]:PORT` (off-link: through the default
/// router an advertisement gave) until it answers (ENETUNREACH before the
/// advertisement), echo 1 MiB, print a JSON line, then stay up until the
/// marker file appears (Linux pings the address made from the prefix
/// meanwhile).
const VIA_ROUTER: &str = r#"
import errno, hashlib, json, os, socket, sys, time
port, marker = int(sys.argv[1]), sys.argv[2]
out = {"unreachable_first": False}
deadline = time.time() + 20
while True:
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect(("fd99::1", port))
        break
    except OSError as e:
        s.close()
        if e.errno == errno.ENETUNREACH:
            out["unreachable_first"] = True
        if time.time() > deadline:
            raise
        time.sleep(0.2)
data = os.urandom(1 << 20)
s.sendall(data)
s.shutdown(socket.SHUT_WR)
got = bytearray()
while True:
    b = s.recv(1 << 16)
    if not b:
        break
    got += b
out["same"] = hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
out["local"] = s.getsockname()[0]
print(json.dumps(out), flush=True)
end = time.time() + 30
while not os.path.exists(marker) and time.time() < end:
    time.sleep(0.1)
"#;

/// A Linux router (radvd advertising fd88::/64 with an MTU of 1400, the
/// kernel forwarding) gives ustack a default router and an address made
/// from the prefix: a connection to an address beyond the router
/// (`fd99::1` on Linux's loopback) goes through it, byte-exact, and Linux
/// pings the new address. The stack's counters agree.
#[test]
fn router_advertisements_from_radvd_give_a_router_and_an_address() {
    need_root!();
    need_program!("radvd", "radvd");
    let _turn = serial();
    let lab = Lab::new("d6a", need_preload!());
    lab.ipv6();
    let lv = lab.topo.linux_if();
    for args in [
        vec!["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"],
        vec!["ip", "-6", "addr", "add", "fd88::1/64", "dev", &lv, "nodad"],
        vec!["ip", "-6", "addr", "add", "fd99::1/128", "dev", "lo"],
    ] {
        let o = lab.linux(&args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
    }
    let conf = lab.path("radvd.conf");
    std::fs::write(
        &conf,
        format!(
            "interface {lv} {{\n  AdvSendAdvert on;\n  MinRtrAdvInterval 3;\n  MaxRtrAdvInterval 4;\n  \
             AdvDefaultLifetime 60;\n  AdvLinkMTU 1400;\n  \
             prefix fd88::/64 {{ AdvOnLink on; AdvAutonomous on; }};\n}};\n"
        ),
    )
    .unwrap();
    let radvd = lab.linux_daemon(&[
        "radvd",
        "-n",
        "-m",
        "stderr",
        "-C",
        &conf.display().to_string(),
        "-p",
        &lab.path("radvd.pid").display().to_string(),
    ]);
    let echo = lab.path("echo.py");
    std::fs::write(&echo, LINUX_ECHO).unwrap();
    let _peer = lab.linux_daemon(&[PYTHON, &echo.display().to_string(), "7700"]);
    let marker = lab.path("pinged");
    let script = lab.path("via_router.py");
    std::fs::write(&script, VIA_ROUTER).unwrap();
    let mut ours = lab.start(
        Host::Stack,
        false,
        &[
            PYTHON,
            &script.display().to_string(),
            "7700",
            &marker.display().to_string(),
        ],
    );
    // The address made from fd88::/64 and ustack's MAC (02:75:73:4d:00:02).
    let slaac = "fd88::75:73ff:fe4d:2";
    let answered = wait_for(Duration::from_secs(20), || {
        ours.exited_within(Duration::ZERO)
            || lab
                .linux(&["ping", "-6", "-c", "1", "-W", "1", slaac])
                .status
                .success()
    });
    std::fs::write(&marker, b"").unwrap();
    let end = ours.wait();
    let (_, _, radvd_err) = radvd.stop();
    end.check(0);
    assert!(
        answered,
        "{slaac} never answered ping -6; radvd: {radvd_err}"
    );
    let got = stdout_json("via the router", end.out.as_bytes(), end.err.as_bytes());
    assert_eq!(got["same"], true, "{got}");
    assert_eq!(got["local"], "fd77::2", "{got}");
    let v6 = &end.last.as_ref().expect("telemetry")["stack"]["ipv6"];
    assert_eq!(v6["routers"], 1, "{v6}");
    assert_eq!(v6["slaac_addresses"], 1, "{v6}");
    assert!(v6["rx_router_adverts"].as_u64().unwrap_or(0) >= 1, "{v6}");
    assert!(v6["tx_router_solicits"].as_u64().unwrap_or(0) >= 1, "{v6}");
}
