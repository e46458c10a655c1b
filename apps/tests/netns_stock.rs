//! The stock-program suite: more unmodified programs under `ustack exec`
//! (`LD_PRELOAD` of `libustack_preload.so`) against Linux peers, in the
//! namespaces of `common::lab` (ustack as 10.77.0.2, the Linux kernel as
//! 10.77.0.1). One topology per kind of program; the programs of a kind run
//! one after another on ports of their own, so the suite stays short as it
//! grows.
//!
//! Every program is checked end to end (files and streams by SHA-256,
//! requests counted by the client and by the server) and gets a verdict.
//! [`EXPECTED`] says which programs work today and why the others do not
//! (a capability another issue builds, a defect being fixed): a test runs
//! every program of its kind, prints each verdict, and fails when one
//! differs from the table, either way. A program that stops working fails
//! the suite; one that starts working fails it too, until the table says
//! so.
//!
//! - web servers: lighttpd (keep-alive, and 30,000 HTTP/1.0 connections
//!   from `ab -c 16`), apache2 single-process (`-X`), Python http.server,
//!   a Node http server;
//! - proxies and relays: haproxy in front of a Linux web server, socat
//!   (one connection, relayed to a Linux echo), ncat listening, a Python
//!   asyncio echo server with four clients at once;
//! - clients of Linux servers: curl (keep-alive) and wget against nginx,
//!   OpenBSD nc and ncat through a Linux echo, ssh against sshd, ab against
//!   nginx, rsync against `rsync --daemon`, dig against dnsmasq;
//! - DNS servers: dnsmasq (UDP and TCP), unbound;
//! - servers that fork per connection: sshd, Apache's prefork MPM,
//!   vsftpd, PostgreSQL.

#[macro_use]
mod common;

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::lab::*;
use common::{Daemon, no_crash, sha256};

/// Whether a program works under `ustack exec` today.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Checked end to end, every check passing.
    Works,
    /// Does not work yet, for the reason given (no program of the table
    /// is so now; kept for the next one found).
    #[allow(dead_code)]
    Fails(&'static str),
}

/// Every program of the suite and its expected verdict (the README's
/// table "Stock programs under ustack exec" says the same).
const EXPECTED: &[(&str, Verdict)] = &[
    // web servers
    ("lighttpd", Verdict::Works),
    ("apache2 -X", Verdict::Works),
    ("python3 -m http.server", Verdict::Works),
    ("node http", Verdict::Works),
    // proxies and relays
    ("haproxy", Verdict::Works),
    ("socat", Verdict::Works),
    ("ncat -l", Verdict::Works),
    ("python3 asyncio", Verdict::Works),
    // clients
    ("curl", Verdict::Works),
    ("wget", Verdict::Works),
    ("nc", Verdict::Works),
    ("ncat", Verdict::Works),
    ("ssh", Verdict::Works),
    ("ab", Verdict::Works),
    ("rsync", Verdict::Works),
    ("dig", Verdict::Works),
    // DNS servers
    ("dnsmasq", Verdict::Works),
    ("unbound", Verdict::Works),
    // forking servers
    ("sshd", Verdict::Works),
    ("apache2 prefork", Verdict::Works),
    ("vsftpd", Verdict::Works),
    ("postgres", Verdict::Works),
];

/// One test at a time: each loads the machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

use common::stock::*;

/// The verdicts of one kind of program, judged against [`EXPECTED`].
struct Verdicts {
    kind: &'static str,
    lines: Vec<String>,
    wrong: Vec<String>,
}

impl Verdicts {
    fn new(kind: &'static str) -> Verdicts {
        Verdicts {
            kind,
            lines: Vec::new(),
            wrong: Vec::new(),
        }
    }

    /// Run `check` for `program` (a panic in it is its failure; whatever
    /// it started is stopped as it unwinds) and judge the outcome; skipped
    /// (said) when the binary `needs` is not installed.
    fn run(&mut self, program: &'static str, needs: &str, check: impl FnOnce() -> Outcome) {
        if !common::have_program(needs) {
            let line = format!("{} {program}: skipped: {needs} is not installed", self.kind);
            eprintln!("{line}");
            self.lines.push(line);
            return;
        }
        let expected = EXPECTED
            .iter()
            .find(|(p, _)| *p == program)
            .unwrap_or_else(|| panic!("{program} is not in EXPECTED"))
            .1;
        let started = Instant::now();
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(check)).unwrap_or_else(|e| {
            Err(e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".into()))
        });
        let secs = started.elapsed().as_secs_f64();
        let line = match (&outcome, expected) {
            (Ok(what), Verdict::Works) => format!("works: {what}"),
            (Err(why), Verdict::Fails(known)) => {
                format!("fails as expected ({known}): {}", first_line(why))
            }
            (Ok(what), Verdict::Fails(known)) => {
                self.wrong.push(program.into());
                format!(
                    "WORKS NOW, expected to fail ({known}): {what}: \
                     set it to Works in EXPECTED and in the README"
                )
            }
            (Err(why), Verdict::Works) => {
                self.wrong.push(program.into());
                format!("REGRESSION, expected to work: {why}")
            }
        };
        let line = format!("{} {program} ({secs:.1} s): {line}", self.kind);
        eprintln!("{line}");
        self.lines.push(line);
    }

    /// Fail unless every verdict was the expected one.
    fn assert_all(self) {
        assert!(
            self.wrong.is_empty(),
            "{}: verdicts differ from EXPECTED for {:?}:\n{}",
            self.kind,
            self.wrong,
            self.lines.join("\n")
        );
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

// ------------------------------------------------------------ web servers

const LIGHTTPD_PORT: u16 = 8081;
const APACHE_PORT: u16 = 8082;
const PY_HTTP_PORT: u16 = 8083;
const NODE_PORT: u16 = 8084;

/// HTTP/1.0 connections ab makes to lighttpd: more than Linux's ephemeral
/// port range (28,232), so ab comes back from ports that lighttpd's stack
/// still holds in TIME-WAIT (it closes first): each such SYN must open a
/// new connection (RFC 6191). Before that fix, the stack stopped accepting
/// after about 3,200 connections.
const AB_CONNECTIONS: u64 = 30_000;

/// lighttpd: files byte-exact over one keep-alive connection, then
/// [`AB_CONNECTIONS`] HTTP/1.0 connections from `ab -c 16`, each counted
/// by ab and in lighttpd's access log.
fn lighttpd(lab: &Lab, sums: &std::collections::HashMap<String, String>) -> Outcome {
    let conf = lab.path("lighttpd.conf");
    let log = lab.path("lighttpd-access.log");
    std::fs::write(
        &conf,
        format!(
            "server.document-root = \"{www}\"\n\
             server.bind = \"10.77.0.2\"\n\
             server.port = {LIGHTTPD_PORT}\n\
             server.errorlog = \"{err}\"\n\
             server.modules = (\"mod_accesslog\")\n\
             accesslog.filename = \"{log}\"\n\
             server.max-keep-alive-requests = 1000\n",
            www = lab.path("www").display(),
            err = lab.path("lighttpd-error.log").display(),
            log = log.display(),
        ),
    )
    .unwrap();
    let server = lab.start(
        Host::Stack,
        false,
        &["lighttpd", "-D", "-f", &conf.display().to_string()],
    );
    let server = listening(lab, server, LIGHTTPD_PORT)?;
    let base = format!("http://10.77.0.2:{LIGHTTPD_PORT}");
    let files = curl_files(lab, sums, &base, true)?;
    let load = ab(lab, &format!("{base}/small.bin"), AB_CONNECTIONS, 16)?;
    // The access log is written out at the latest when lighttpd stops.
    let ended = stop_clean(server)?;
    let logged = count_lines(&log, "GET /small.bin");
    ensure!(
        logged == AB_CONNECTIONS + 1,
        "lighttpd logged {logged} requests for small.bin, clients made {}",
        AB_CONNECTIONS + 1
    );
    let tcp = &ended.last.as_ref().ok_or("lighttpd: no telemetry")?["stack"]["tcp"];
    let reopened = tcp["time_wait_reopened"].as_u64().unwrap_or(0);
    ensure!(
        reopened > 0,
        "no SYN reopened a 4-tuple in TIME-WAIT over {AB_CONNECTIONS} connections: {tcp}"
    );
    Ok(format!(
        "{files}; {load}, each in its access log; {reopened} took a 4-tuple out of TIME-WAIT"
    ))
}

/// An apache2 configuration in `dir` (written there as `apache2.conf`,
/// returned): the MPM `mpm` (event, prefork), listening on
/// 10.77.0.2:`port`, serving `dir/www`, each request logged in `log`,
/// with `extra` lines.
fn apache_conf(dir: &Path, mpm: &str, port: u16, log: &Path, extra: &str) -> std::path::PathBuf {
    let conf = dir.join("apache2.conf");
    let d = dir.display();
    std::fs::write(
        &conf,
        format!(
            "ServerRoot \"{d}\"\n\
             ServerName ustack-stock\n\
             LoadModule mpm_{mpm}_module /usr/lib/apache2/modules/mod_mpm_{mpm}.so\n\
             LoadModule authz_core_module /usr/lib/apache2/modules/mod_authz_core.so\n\
             Listen 10.77.0.2:{port}\n\
             PidFile {d}/apache2.pid\n\
             DefaultRuntimeDir {d}\n\
             Mutex file:{d}\n\
             ErrorLog {d}/apache2-error.log\n\
             LogFormat \"%h %r %>s %B\" short\n\
             CustomLog {log} short\n\
             DocumentRoot {d}/www\n\
             User www-data\n\
             Group www-data\n\
             {extra}\
             <Directory {d}/www>\n  Require all granted\n</Directory>\n",
            log = log.display(),
        ),
    )
    .unwrap();
    conf
}

/// apache2 as one process (`-X`, the event MPM) with a configuration of
/// its own: files byte-exact over keep-alive, 500 HTTP/1.0 requests from
/// ab, each in its access log.
fn apache2(lab: &Lab, sums: &std::collections::HashMap<String, String>) -> Outcome {
    let dir = lab.dir.path();
    let log = dir.join("apache2-access.log");
    let conf = apache_conf(dir, "event", APACHE_PORT, &log, "");
    let server = lab.start(
        Host::Stack,
        false,
        &["apache2", "-X", "-f", &conf.display().to_string()],
    );
    let server = listening(lab, server, APACHE_PORT)?;
    let base = format!("http://10.77.0.2:{APACHE_PORT}");
    let files = curl_files(lab, sums, &base, true)?;
    let load = ab(lab, &format!("{base}/small.bin"), 500, 8)?;
    stop_clean(server)?;
    let logged = count_lines(&log, "GET /small.bin");
    ensure!(
        logged == 501,
        "apache2 logged {logged} requests for small.bin, clients made 501"
    );
    Ok(format!("{files}; {load}, each in its access log"))
}

/// Python's http.server (a thread per connection): files byte-exact, 300
/// HTTP/1.0 requests from ab, each in its log on stderr.
fn python_http(lab: &Lab, sums: &std::collections::HashMap<String, String>) -> Outcome {
    let www = lab.path("www").display().to_string();
    let server = lab.start(
        Host::Stack,
        false,
        &[
            PYTHON,
            "-m",
            "http.server",
            &PY_HTTP_PORT.to_string(),
            "--bind",
            "10.77.0.2",
            "--directory",
            &www,
        ],
    );
    let server = listening(lab, server, PY_HTTP_PORT)?;
    let base = format!("http://10.77.0.2:{PY_HTTP_PORT}");
    let files = curl_files(lab, sums, &base, false)?;
    let load = ab(lab, &format!("{base}/small.bin"), 300, 8)?;
    let ended = stop_clean(server)?;
    let logged = ended
        .err
        .lines()
        .filter(|l| l.contains("\"GET /small.bin"))
        .count();
    ensure!(
        logged == 301,
        "http.server logged {logged} requests for small.bin, clients made 301"
    );
    Ok(format!("{files}; {load}, each in its log"))
}

/// A Node http server (a script of ours): files byte-exact over
/// keep-alive, 300 HTTP/1.0 requests from ab, counted by the server.
const NODE_HTTP: &str = r#"
const http = require('http'), fs = require('fs'), path = require('path');
const [ip, port, root] = process.argv.slice(2);
let served = 0;
http.createServer((req, res) => {
  fs.readFile(path.join(root, path.basename(req.url)), (err, data) => {
    served++;
    if (err) { res.writeHead(404); res.end(); return; }
    res.writeHead(200, {'Content-Length': data.length});
    res.end(data);
  });
}).listen(Number(port), ip, () => console.log('ready'));
process.on('SIGTERM', () => { console.log(`served ${served}`); process.exit(0); });
"#;

fn node_http(lab: &Lab, sums: &std::collections::HashMap<String, String>) -> Outcome {
    let script = lab.path("http.js");
    std::fs::write(&script, NODE_HTTP).unwrap();
    let server = lab.start(
        Host::Stack,
        false,
        &[
            "node",
            &script.display().to_string(),
            "10.77.0.2",
            &NODE_PORT.to_string(),
            &lab.path("www").display().to_string(),
        ],
    );
    let server = listening(lab, server, NODE_PORT)?;
    let base = format!("http://10.77.0.2:{NODE_PORT}");
    let files = curl_files(lab, sums, &base, true)?;
    let load = ab(lab, &format!("{base}/small.bin"), 300, 8)?;
    let ended = stop_clean(server)?;
    let served = number(&ended.out, r"served (\d+)")?;
    ensure!(
        served == 300 + FILES.len() as u64,
        "node served {served} requests, clients made {}",
        300 + FILES.len()
    );
    Ok(format!("{files}; {load}, each counted by the server"))
}

/// Web servers on ustack, Linux clients (curl, ab).
#[test]
fn stock_web_servers_on_ustack() {
    need_root!();
    let lib = need_preload!();
    let _turn = serial();
    let lab = Lab::new("sw", lib);
    let sums = content(&lab);
    let mut v = Verdicts::new("web server");
    v.run("lighttpd", "lighttpd", || lighttpd(&lab, &sums));
    v.run("apache2 -X", "apache2", || apache2(&lab, &sums));
    v.run("python3 -m http.server", "python3", || {
        python_http(&lab, &sums)
    });
    v.run("node http", "node", || node_http(&lab, &sums));
    v.assert_all();
}

// ------------------------------------------------------------ proxies and relays

const HAPROXY_PORT: u16 = 8091;
const SOCAT_PORT: u16 = 8092;
const NCAT_PORT: u16 = 8093;
const ASYNCIO_PORT: u16 = 8094;
/// The Linux side's web server (Python http.server) behind haproxy.
const BACKEND_PORT: u16 = 9080;
/// The Linux side's echo ([`LINUX_ECHO`]).
const ECHO_PORT: u16 = 9001;

/// haproxy (`-db`, HTTP mode) on ustack in front of a Linux web server:
/// files byte-exact through it, 300 HTTP/1.0 requests from ab, each
/// answered and each in the backend's log.
fn haproxy(lab: &Lab, sums: &std::collections::HashMap<String, String>) -> Outcome {
    let www = lab.path("www").display().to_string();
    let backend = lab.linux_daemon(&[
        PYTHON,
        "-m",
        "http.server",
        &BACKEND_PORT.to_string(),
        "--bind",
        "10.77.0.1",
        "--directory",
        &www,
    ]);
    let conf = lab.path("haproxy.cfg");
    std::fs::write(
        &conf,
        format!(
            "global\n  maxconn 256\n\
             defaults\n  mode http\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n\
             frontend web\n  bind 10.77.0.2:{HAPROXY_PORT}\n  default_backend linux\n\
             backend linux\n  server web1 10.77.0.1:{BACKEND_PORT}\n"
        ),
    )
    .unwrap();
    let server = lab.start(
        Host::Stack,
        false,
        &["haproxy", "-db", "-f", &conf.display().to_string()],
    );
    let server = listening(lab, server, HAPROXY_PORT)?;
    let base = format!("http://10.77.0.2:{HAPROXY_PORT}");
    let files = curl_files(lab, sums, &base, true)?;
    let load = ab(lab, &format!("{base}/small.bin"), 300, 8)?;
    stop_clean(server)?;
    let (_, _, log) = backend.stop();
    let logged = log
        .lines()
        .filter(|l| l.contains("\"GET /small.bin"))
        .count();
    ensure!(
        logged == 301,
        "the backend logged {logged} requests for small.bin, clients made 301"
    );
    Ok(format!("{files}; {load}, each in the backend's log"))
}

/// socat relaying one connection (no fork) to the Linux echo: the stream
/// comes back byte-exact, and socat ends by itself.
fn socat(lab: &Lab, sums: &std::collections::HashMap<String, String>) -> Outcome {
    let server = lab.start(
        Host::Stack,
        false,
        &[
            "socat",
            &format!("TCP-LISTEN:{SOCAT_PORT},bind=10.77.0.2,reuseaddr"),
            &format!("TCP:10.77.0.1:{ECHO_PORT}"),
        ],
    );
    // No probe connection: socat serves exactly one.
    let server = serving(server, SOCAT_PORT, || lab.topo.arping_once())?;
    let back = lab.path("socat-back.bin");
    let sent = lab.path("www/stream.bin");
    let ok = wait_for(Duration::from_secs(15), || {
        linux_nc(&lab.topo, "10.77.0.2", SOCAT_PORT, &sent, &back)
            .status
            .success()
            && std::fs::metadata(&back).is_ok_and(|m| m.len() > 0)
    });
    ensure!(ok, "no answer through socat");
    ensure!(
        sha256(&back) == sums["stream.bin"],
        "the stream came back through socat other than sent ({} bytes of {STREAM_BYTES})",
        std::fs::metadata(&back).map(|m| m.len()).unwrap_or(0)
    );
    let ended = server.wait_within(Duration::from_secs(20));
    no_crash(&ended.err);
    ensure!(
        ended.code == 0,
        "socat exited with {}: {}",
        ended.code,
        tail(&ended.err)
    );
    Ok(format!(
        "{STREAM_BYTES} bytes relayed to the Linux echo and back, byte-exact; exit 0"
    ))
}

/// ncat listening (`--recv-only`, output to a file through sh): what a
/// Linux nc sent arrives byte-exact, and ncat ends with the connection.
/// Started [`NCAT_STARTS`] times: its SIGCHLD handler meets the child the
/// pcap stack's start runs (`ethtool -k`) in some starts and not in
/// others, so one clean start proves nothing.
fn ncat_listen(lab: &Lab, sums: &std::collections::HashMap<String, String>) -> Outcome {
    for run in 0..NCAT_STARTS {
        ncat_listen_once(lab, sums, run)?;
    }
    Ok(format!(
        "{NCAT_STARTS} starts, each receiving {STREAM_BYTES} bytes byte-exact; exit 0"
    ))
}

/// Times ncat -l is started.
const NCAT_STARTS: u32 = 5;

fn ncat_listen_once(
    lab: &Lab,
    sums: &std::collections::HashMap<String, String>,
    run: u32,
) -> Result<(), String> {
    let got = lab.path(&format!("ncat-got-{run}.bin"));
    let server = lab.start(
        Host::Stack,
        false,
        &[
            "sh",
            "-c",
            &format!(
                "exec ncat -l 10.77.0.2 {NCAT_PORT} --recv-only > {}",
                got.display()
            ),
        ],
    );
    let server = serving(server, NCAT_PORT, || lab.topo.arping_once())?;
    let sent = lab.path("www/stream.bin");
    let back = lab.path("ncat-back.bin");
    let ok = wait_for(Duration::from_secs(15), || {
        linux_nc(&lab.topo, "10.77.0.2", NCAT_PORT, &sent, &back)
            .status
            .success()
    });
    ensure!(ok, "ncat -l never took the connection");
    let ended = server.wait_within(Duration::from_secs(20));
    no_crash(&ended.err);
    ensure!(
        ended.code == 0,
        "ncat exited with {}: {}",
        ended.code,
        tail(&ended.err)
    );
    ensure!(
        sha256(&got) == sums["stream.bin"],
        "ncat received other than sent ({} bytes of {STREAM_BYTES})",
        std::fs::metadata(&got).map(|m| m.len()).unwrap_or(0)
    );
    Ok(())
}

/// A Python asyncio echo server (`asyncio.start_server`): prints "served N"
/// after each connection.
const ASYNCIO_ECHO: &str = r#"
import asyncio, sys
served = 0
async def echo(r, w):
    global served
    while True:
        d = await r.read(65536)
        if not d:
            break
        w.write(d)
        await w.drain()
    w.close()
    await w.wait_closed()
    served += 1
    print(f"served {served}", flush=True)
async def main():
    srv = await asyncio.start_server(echo, sys.argv[1], int(sys.argv[2]))
    async with srv:
        await srv.serve_forever()
asyncio.run(main())
"#;

/// Four Linux clients at once through the asyncio echo: each stream back
/// byte-exact, each connection counted by the server.
fn asyncio_echo(lab: &Lab, sums: &std::collections::HashMap<String, String>) -> Outcome {
    let script = lab.path("aecho.py");
    std::fs::write(&script, ASYNCIO_ECHO).unwrap();
    let server = lab.start(
        Host::Stack,
        false,
        &[
            PYTHON,
            &script.display().to_string(),
            "10.77.0.2",
            &ASYNCIO_PORT.to_string(),
        ],
    );
    let server = listening(lab, server, ASYNCIO_PORT)?;
    let sent = lab.path("www/stream.bin");
    let backs: Vec<_> = (0..4)
        .map(|i| lab.path(&format!("aecho-{i}.bin")))
        .collect();
    let topo = &lab.topo;
    std::thread::scope(|s| {
        for b in &backs {
            let sent = &sent;
            s.spawn(move || linux_nc(topo, "10.77.0.2", ASYNCIO_PORT, sent, b));
        }
    });
    for b in &backs {
        ensure!(
            sha256(b) == sums["stream.bin"],
            "a stream came back other than sent ({} bytes of {STREAM_BYTES})",
            std::fs::metadata(b).map(|m| m.len()).unwrap_or(0)
        );
    }
    let ended = stop_clean(server)?;
    // The probe connection of `listening` is one more.
    ensure!(
        ended.out.contains("served 5"),
        "the server counted other than 5 connections: {}",
        tail(&ended.out)
    );
    Ok(format!(
        "4 clients at once, {STREAM_BYTES} bytes each echoed byte-exact, every connection counted"
    ))
}

/// Proxies and relays on ustack between Linux clients and Linux servers.
#[test]
fn stock_proxies_and_relays_on_ustack() {
    need_root!();
    let lib = need_preload!();
    let _turn = serial();
    let lab = Lab::new("sr", lib);
    let sums = content(&lab);
    let _echo = linux_echo(&lab, ECHO_PORT);
    let mut v = Verdicts::new("proxy/relay");
    v.run("haproxy", "haproxy", || haproxy(&lab, &sums));
    v.run("socat", "socat", || socat(&lab, &sums));
    v.run("ncat -l", "ncat", || ncat_listen(&lab, &sums));
    v.run("python3 asyncio", "python3", || asyncio_echo(&lab, &sums));
    v.assert_all();
}

// ------------------------------------------------------------ clients

const NGINX_PORT: u16 = 9080;
const SSHD_LINUX_PORT: u16 = 2222;
const RSYNCD_PORT: u16 = 8730;
const DNSMASQ_PORT: u16 = 5353;

/// A Linux nginx (one process) serving `www/` on 10.77.0.1:[`NGINX_PORT`],
/// logging every request; returned once it listens.
fn linux_nginx(lab: &Lab) -> Daemon {
    let dir = lab.path("nginx");
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    let d = dir.display();
    let conf = dir.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\nuser root;\n\
             pid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections 256; }}\n\
             http {{\n  access_log {d}/access.log;\n  client_body_temp_path {d}/tmp;\n\
               proxy_temp_path {d}/tmp;\n  fastcgi_temp_path {d}/tmp;\n  uwsgi_temp_path {d}/tmp;\n\
               scgi_temp_path {d}/tmp;\n\
               server {{ listen 10.77.0.1:{NGINX_PORT}; root {www}; }}\n}}\n",
            www = lab.path("www").display()
        ),
    )
    .unwrap();
    let nginx = lab.linux_daemon(&[
        "nginx",
        "-e",
        &format!("{d}/error.log"),
        "-p",
        &d.to_string(),
        "-c",
        &conf.display().to_string(),
    ]);
    let port = NGINX_PORT.to_string();
    assert!(
        wait_for(Duration::from_secs(10), || lab
            .linux(&["nc", "-z", "-w", "1", "10.77.0.1", &port])
            .status
            .success()),
        "the Linux nginx did not start"
    );
    nginx
}

/// curl on ustack fetching every file from the Linux nginx over one
/// connection: byte-exact, one connect, each request in nginx's log.
fn curl_client(lab: &Lab, sums: &std::collections::HashMap<String, String>) -> Outcome {
    let log = lab.path("nginx/access.log");
    let before = count_lines(&log, "curl/");
    let mut args = vec![
        "timeout",
        "60",
        "curl",
        "-s",
        "-w",
        "%{http_code} %{num_connects}\n",
    ];
    let outs: Vec<_> = FILES
        .iter()
        .map(|(n, _)| {
            (
                format!("http://10.77.0.1:{NGINX_PORT}/{n}"),
                lab.path(&format!("curl-{n}")).display().to_string(),
            )
        })
        .collect();
    for (url, out) in &outs {
        args.extend(["-o", out, url]);
    }
    let ended = client(lab, &args)?;
    let lines: Vec<&str> = ended.out.lines().collect();
    ensure!(
        lines.len() == FILES.len() && lines.iter().all(|l| l.starts_with("200 ")),
        "curl: {}",
        ended.out
    );
    ensure!(
        lines.iter().skip(1).all(|l| l.ends_with(" 0")),
        "curl opened a connection per file (no keep-alive): {}",
        ended.out
    );
    for ((name, _), (_, out)) in FILES.iter().zip(&outs) {
        ensure!(
            sha256(Path::new(out)) == sums[*name],
            "{name}: the SHA-256 of what curl got differs"
        );
    }
    // nginx writes its log line when a request ends.
    let logged = wait_for(Duration::from_secs(5), || {
        count_lines(&log, "curl/") - before == FILES.len() as u64
    });
    ensure!(logged, "nginx did not log every request of curl");
    Ok(format!(
        "{} files byte-exact over one connection, each in nginx's log",
        FILES.len()
    ))
}

/// wget on ustack fetching the big file from the Linux nginx: byte-exact.
fn wget_client(lab: &Lab, sums: &std::collections::HashMap<String, String>) -> Outcome {
    let out = lab.path("wget-big.bin");
    client(
        lab,
        &[
            "timeout",
            "60",
            "wget",
            "-q",
            "-O",
            &out.display().to_string(),
            &format!("http://10.77.0.1:{NGINX_PORT}/big.bin"),
        ],
    )?;
    ensure!(
        sha256(&out) == sums["big.bin"],
        "the SHA-256 of what wget got differs"
    );
    Ok("1 MiB byte-exact".into())
}

/// A stream client on ustack (`nc` or `ncat`, through sh for the
/// redirections) through the Linux echo: the stream comes back byte-exact.
fn stream_client(
    lab: &Lab,
    sums: &std::collections::HashMap<String, String>,
    cmd: &str,
) -> Outcome {
    let back = lab.path(&format!("{}-back.bin", cmd.split(' ').next().unwrap()));
    client(
        lab,
        &[
            "sh",
            "-c",
            &format!(
                "exec timeout 60 {cmd} 10.77.0.1 {ECHO_PORT} < {} > {}",
                lab.path("www/stream.bin").display(),
                back.display()
            ),
        ],
    )?;
    ensure!(
        sha256(&back) == sums["stream.bin"],
        "the stream came back other than sent ({} bytes of {STREAM_BYTES})",
        std::fs::metadata(&back).map(|m| m.len()).unwrap_or(0)
    );
    Ok(format!(
        "{STREAM_BYTES} bytes through the Linux echo, byte-exact"
    ))
}

/// Host and user keys for ssh, and an sshd configuration serving them on
/// `addr:port`: the configuration's path and the user key's.
fn ssh_keys(lab: &Lab, addr: &str, port: u16) -> (String, String) {
    let dir = lab.path("ssh");
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.display();
    for key in ["host", "user"] {
        let k = dir.join(key);
        if !k.exists() {
            let o = std::process::Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(&k)
                .output()
                .expect("ssh-keygen");
            assert!(o.status.success(), "ssh-keygen: {}", text(&o));
        }
    }
    std::fs::copy(dir.join("user.pub"), dir.join("authorized_keys")).unwrap();
    // sshd wants its privilege separation directory.
    let _ = std::fs::create_dir_all("/run/sshd");
    let conf = dir.join(format!("sshd-{port}.conf"));
    std::fs::write(
        &conf,
        format!(
            "Port {port}\nListenAddress {addr}\nHostKey {d}/host\nPidFile {d}/sshd-{port}.pid\n\
             AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nPermitRootLogin yes\n\
             UsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             Subsystem sftp internal-sftp\n"
        ),
    )
    .unwrap();
    (
        conf.display().to_string(),
        dir.join("user").display().to_string(),
    )
}

/// ssh options for a test server: the user key, no host key check.
fn ssh_opts(key: &str, port: u16) -> Vec<String> {
    [
        "-i",
        key,
        "-p",
        &port.to_string(),
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "LogLevel=ERROR",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// ssh on ustack to a Linux sshd: the stream sent to a remote `sha256sum`
/// arrives byte-exact.
fn ssh_client(lab: &Lab, sums: &std::collections::HashMap<String, String>) -> Outcome {
    let (conf, key) = ssh_keys(lab, "10.77.0.1", SSHD_LINUX_PORT);
    let _sshd = lab.linux_daemon(&["/usr/sbin/sshd", "-D", "-e", "-f", &conf]);
    let port = SSHD_LINUX_PORT.to_string();
    ensure!(
        wait_for(Duration::from_secs(10), || lab
            .linux(&["nc", "-z", "-w", "1", "10.77.0.1", &port])
            .status
            .success()),
        "the Linux sshd did not start"
    );
    let ended = client(
        lab,
        &[
            "sh",
            "-c",
            &format!(
                "exec timeout 60 ssh {} root@10.77.0.1 sha256sum < {}",
                ssh_opts(&key, SSHD_LINUX_PORT).join(" "),
                lab.path("www/stream.bin").display()
            ),
        ],
    )?;
    ensure!(
        ended.out.split_whitespace().next() == Some(sums["stream.bin"].as_str()),
        "the remote sha256sum says {}",
        ended.out.trim()
    );
    Ok(format!(
        "{STREAM_BYTES} bytes to a remote sha256sum, byte-exact"
    ))
}

/// ab on ustack against the Linux nginx: 300 HTTP/1.0 requests, each
/// answered and each in nginx's log.
fn ab_client(lab: &Lab) -> Outcome {
    let log = lab.path("nginx/access.log");
    let before = count_lines(&log, "ApacheBench");
    let url = format!("http://10.77.0.1:{NGINX_PORT}/small.bin");
    let ended = client(
        lab,
        &[
            "timeout", "60", "ab", "-q", "-s", "10", "-n", "300", "-c", "8", &url,
        ],
    )?;
    let load = check_ab(&url, &format!("{}{}", ended.out, ended.err), 300)?;
    let logged = wait_for(Duration::from_secs(5), || {
        count_lines(&log, "ApacheBench") - before == 300
    });
    ensure!(logged, "nginx did not log every request of ab");
    Ok(format!("{load}, each in nginx's log"))
}

/// rsync on ustack pulling `www/` from a Linux `rsync --daemon`: every
/// file byte-exact.
fn rsync_client(lab: &Lab, sums: &std::collections::HashMap<String, String>) -> Outcome {
    let conf = lab.path("rsyncd.conf");
    std::fs::write(
        &conf,
        format!(
            "pid file = {}\nuse chroot = no\n[www]\n  path = {}\n  read only = yes\n  uid = root\n  gid = root\n",
            lab.path("rsyncd.pid").display(),
            lab.path("www").display()
        ),
    )
    .unwrap();
    let _rsyncd = lab.linux_daemon(&[
        "rsync",
        "--daemon",
        "--no-detach",
        &format!("--config={}", conf.display()),
        "--address=10.77.0.1",
        &format!("--port={RSYNCD_PORT}"),
    ]);
    let port = RSYNCD_PORT.to_string();
    ensure!(
        wait_for(Duration::from_secs(10), || lab
            .linux(&["nc", "-z", "-w", "1", "10.77.0.1", &port])
            .status
            .success()),
        "the Linux rsync daemon did not start"
    );
    let dest = lab.path("rsync-got");
    client(
        lab,
        &[
            "timeout",
            "60",
            "rsync",
            "-a",
            &format!("rsync://10.77.0.1:{RSYNCD_PORT}/www/"),
            &format!("{}/", dest.display()),
        ],
    )?;
    for (name, sum) in sums {
        ensure!(
            sha256(&dest.join(name)) == *sum,
            "{name}: rsync got other than served"
        );
    }
    Ok(format!("{} files byte-exact", sums.len()))
}

/// dig on ustack asking a Linux dnsmasq, over UDP and over TCP.
fn dig_client(lab: &Lab) -> Outcome {
    let _dnsmasq = lab.linux_daemon(&[
        "dnsmasq",
        "-d",
        "-k",
        "--no-resolv",
        "--no-hosts",
        &format!("--port={DNSMASQ_PORT}"),
        "--listen-address=10.77.0.1",
        "--bind-interfaces",
        "--address=/stock.test/10.1.2.3",
        "--user=root",
        &format!("--pid-file={}", lab.path("dnsmasq-linux.pid").display()),
    ]);
    std::thread::sleep(Duration::from_millis(500));
    for transport in ["+notcp", "+tcp"] {
        let ended = client(
            lab,
            &[
                // dig under ustack may hang and ignore SIGTERM.
                "timeout",
                "-s",
                "KILL",
                "15",
                "dig",
                "+short",
                "+time=2",
                "+tries=2",
                transport,
                "@10.77.0.1",
                "-p",
                &DNSMASQ_PORT.to_string(),
                "a.stock.test",
            ],
        )?;
        ensure!(
            ended.out.trim() == "10.1.2.3",
            "dig {transport}: {}",
            tail(&format!("{}{}", ended.out, ended.err))
        );
    }
    Ok("answered over UDP and TCP".into())
}

/// Clients on ustack against Linux servers.
#[test]
fn stock_clients_on_ustack() {
    need_root!();
    let lib = need_preload!();
    let _turn = serial();
    let lab = Lab::new("sc", lib);
    let sums = content(&lab);
    let _echo = linux_echo(&lab, ECHO_PORT);
    let _nginx = linux_nginx(&lab);
    let mut v = Verdicts::new("client");
    v.run("curl", "curl", || curl_client(&lab, &sums));
    v.run("wget", "wget", || wget_client(&lab, &sums));
    v.run("nc", "nc", || stream_client(&lab, &sums, "nc -N"));
    v.run("ncat", "ncat", || stream_client(&lab, &sums, "ncat"));
    v.run("ssh", "ssh", || ssh_client(&lab, &sums));
    v.run("ab", "ab", || ab_client(&lab));
    v.run("rsync", "rsync", || rsync_client(&lab, &sums));
    v.run("dig", "dig", || dig_client(&lab));
    v.assert_all();
}

// ------------------------------------------------------------ DNS servers

const DNSMASQ_STACK_PORT: u16 = 5353;
const UNBOUND_PORT: u16 = 5354;

/// Queries each DNS server gets over UDP (and a few over TCP).
const DNS_QUERIES: u64 = 20;

/// `dig` from the Linux host: `n` names under stock.test asked of
/// 10.77.0.2:`port` in one batch; how many came back as `want`.
fn dig_batch(lab: &Lab, port: u16, n: u64, tcp: bool, want: &str) -> u64 {
    let batch = lab.path(&format!("dig-{port}-{tcp}.txt"));
    let names: String = (0..n).map(|i| format!("q{i}.stock.test\n")).collect();
    std::fs::write(&batch, names).unwrap();
    let o = lab.linux(&[
        "timeout",
        "60",
        "dig",
        "+short",
        "+time=2",
        "+tries=2",
        if tcp { "+tcp" } else { "+notcp" },
        "@10.77.0.2",
        "-p",
        &port.to_string(),
        "-f",
        &batch.display().to_string(),
    ]);
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.trim() == want)
        .count() as u64
}

/// `server` once a DNS server on ustack answers one query.
fn dns_up(lab: &Lab, server: Preloaded, port: u16, want: &str) -> Result<Preloaded, String> {
    serving(server, port, || dig_batch(lab, port, 1, false, want) == 1)
}

/// dnsmasq (`--address`) on ustack: every query over UDP and over TCP
/// answered with its address, each in its query log.
fn dnsmasq(lab: &Lab) -> Outcome {
    let server = lab.start(
        Host::Stack,
        false,
        &[
            "dnsmasq",
            "-d",
            "-k",
            "--log-queries",
            "--no-resolv",
            "--no-hosts",
            &format!("--port={DNSMASQ_STACK_PORT}"),
            "--listen-address=10.77.0.2",
            "--bind-interfaces",
            "--address=/stock.test/10.1.2.3",
            "--user=root",
            &format!("--pid-file={}", lab.path("dnsmasq.pid").display()),
        ],
    );
    let server = dns_up(lab, server, DNSMASQ_STACK_PORT, "10.1.2.3")?;
    let udp = dig_batch(lab, DNSMASQ_STACK_PORT, DNS_QUERIES, false, "10.1.2.3");
    ensure!(
        udp == DNS_QUERIES,
        "{udp} of {DNS_QUERIES} UDP queries answered"
    );
    let tcp = dig_batch(lab, DNSMASQ_STACK_PORT, 5, true, "10.1.2.3");
    ensure!(tcp == 5, "{tcp} of 5 TCP queries answered");
    let ended = stop_clean(server)?;
    let logged = ended
        .err
        .lines()
        .filter(|l| l.contains("query[A] q") && l.contains("from 10.77.0.1"))
        .count() as u64;
    // The readiness probe asked one more.
    ensure!(
        logged == DNS_QUERIES + 5 + 1,
        "dnsmasq logged {logged} queries, dig asked {}",
        DNS_QUERIES + 5 + 1
    );
    Ok(format!(
        "{DNS_QUERIES} UDP and 5 TCP queries answered, each in its query log"
    ))
}

/// unbound with a local zone on ustack: every query over UDP and TCP
/// answered with its address.
fn unbound(lab: &Lab) -> Outcome {
    let conf = lab.path("unbound.conf");
    std::fs::write(
        &conf,
        format!(
            "server:\n  interface: 10.77.0.2\n  port: {UNBOUND_PORT}\n  do-ip6: no\n\
               username: \"\"\n  chroot: \"\"\n  directory: \"{}\"\n  pidfile: \"\"\n\
               use-syslog: no\n  logfile: \"\"\n  access-control: 10.77.0.0/24 allow\n\
               num-threads: 1\n  so-reuseport: no\n\
               local-zone: \"stock.test.\" redirect\n\
               local-data: \"stock.test. IN A 10.1.2.4\"\n\
             remote-control:\n  control-enable: no\n",
            lab.dir.path().display()
        ),
    )
    .unwrap();
    let server = lab.start(
        Host::Stack,
        false,
        &["unbound", "-d", "-c", &conf.display().to_string()],
    );
    let server = dns_up(lab, server, UNBOUND_PORT, "10.1.2.4")?;
    let udp = dig_batch(lab, UNBOUND_PORT, DNS_QUERIES, false, "10.1.2.4");
    ensure!(
        udp == DNS_QUERIES,
        "{udp} of {DNS_QUERIES} UDP queries answered"
    );
    let tcp = dig_batch(lab, UNBOUND_PORT, 5, true, "10.1.2.4");
    ensure!(tcp == 5, "{tcp} of 5 TCP queries answered");
    stop_clean(server)?;
    Ok(format!("{DNS_QUERIES} UDP and 5 TCP queries answered"))
}

/// DNS servers on ustack, Linux dig as the client.
#[test]
fn stock_dns_servers_on_ustack() {
    need_root!();
    let lib = need_preload!();
    need_program!("dig", "bind9-dnsutils");
    let _turn = serial();
    let lab = Lab::new("sd", lib);
    let mut v = Verdicts::new("DNS server");
    v.run("dnsmasq", "dnsmasq", || dnsmasq(&lab));
    v.run("unbound", "unbound", || unbound(&lab));
    v.assert_all();
}

// ------------------------------------------------------------ forking servers

const SSHD_STACK_PORT: u16 = 2223;
const FTP_PORT: u16 = 2121;
const PG_PORT: u16 = 5433;
const PREFORK_PORT: u16 = 8086;

/// sshd on ustack (a child per connection, which re-executes sshd with
/// the connection as its standard input and output, and forks its
/// privilege-separated children): 20 sessions in a row each run a
/// command, a stream reaches a remote `sha256sum` byte-exact, and scp
/// copies 64 MiB there and back (SFTP up, the legacy protocol down),
/// byte-exact.
fn sshd(lab: &Lab, sums: &std::collections::HashMap<String, String>) -> Outcome {
    let (conf, key) = ssh_keys(lab, "10.77.0.2", SSHD_STACK_PORT);
    let server = lab.start(
        Host::Stack,
        false,
        &["/usr/sbin/sshd", "-D", "-e", "-f", &conf],
    );
    let server = listening(lab, server, SSHD_STACK_PORT)?;
    let opts = ssh_opts(&key, SSHD_STACK_PORT).join(" ");
    for i in 0..20 {
        let o = lab.linux(&[
            "sh",
            "-c",
            &format!("timeout 30 ssh {opts} root@10.77.0.2 echo session-{i}"),
        ]);
        let t = text(&o);
        ensure!(
            t.trim() == format!("session-{i}"),
            "ssh session {i} to sshd on ustack: {}",
            tail(&t)
        );
    }
    let o = lab.linux(&[
        "sh",
        "-c",
        &format!(
            "timeout 30 ssh {opts} root@10.77.0.2 sha256sum < {}",
            lab.path("www/stream.bin").display()
        ),
    ]);
    let t = text(&o);
    ensure!(
        t.split_whitespace().next() == Some(sums["stream.bin"].as_str()),
        "ssh to sshd on ustack: {}",
        tail(&t)
    );
    // scp: 64 MiB up and back down.
    let big = lab.path("scp-64m.bin");
    let mut data = vec![0u8; 64 << 20];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    std::fs::write(&big, &data).unwrap();
    drop(data);
    let want = sha256(&big);
    let up = lab.path("scp-up.bin");
    let down = lab.path("scp-down.bin");
    let scp = opts.replacen("-p ", "-P ", 1);
    for (args, got) in [
        (
            format!("{scp} {} root@10.77.0.2:{}", big.display(), up.display()),
            &up,
        ),
        (
            format!(
                "-O {scp} root@10.77.0.2:{} {}",
                up.display(),
                down.display()
            ),
            &down,
        ),
    ] {
        let o = lab.linux(&["sh", "-c", &format!("timeout 120 scp {args}")]);
        ensure!(
            o.status.success() && got.exists() && sha256(got) == want,
            "scp of 64 MiB with sshd on ustack: {}",
            tail(&text(&o))
        );
    }
    for f in [&big, &up, &down] {
        let _ = std::fs::remove_file(f);
    }
    stop_clean(server)?;
    Ok(format!(
        "20 sessions running a command, {STREAM_BYTES} bytes to a remote sha256sum and 64 MiB by scp both ways, byte-exact"
    ))
}

/// Apache httpd with `mpm_prefork` (8 to 16 children, each accepting on
/// the listener it inherited): `ab -n 20000 -c 32` with and without
/// keep-alive, none failed, every request in the access log (written by
/// the children).
fn apache2_prefork(lab: &Lab) -> Outcome {
    let dir = lab.path("prefork");
    std::fs::create_dir_all(dir.join("www")).unwrap();
    std::fs::copy(lab.path("www/small.bin"), dir.join("www/small.bin")).unwrap();
    let _ = std::process::Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(&dir)
        .status();
    let log = dir.join("access.log");
    let conf = apache_conf(
        &dir,
        "prefork",
        PREFORK_PORT,
        &log,
        "StartServers 8\nMinSpareServers 8\nMaxSpareServers 16\nMaxRequestWorkers 64\n\
         KeepAlive On\nMaxKeepAliveRequests 1000\n",
    );
    // In a process group of its own: at shutdown the prefork parent
    // signals its whole group (killpg), which would be the test's.
    let server = lab.start(
        Host::Stack,
        false,
        &[
            "setsid",
            "apache2",
            "-DFOREGROUND",
            "-f",
            &conf.display().to_string(),
        ],
    );
    let server = listening(lab, server, PREFORK_PORT)?;
    let url = format!("http://10.77.0.2:{PREFORK_PORT}/small.bin");
    let close = ab(lab, &url, 20_000, 32)?;
    let o = lab.linux(&[
        "timeout", "120", "ab", "-q", "-k", "-s", "10", "-n", "20000", "-c", "32", &url,
    ]);
    let kept = check_ab(&url, &text(&o), 20_000)?;
    stop_clean(server)?;
    let logged = count_lines(&log, "GET /small.bin");
    ensure!(
        logged == 40_000,
        "apache2 (prefork) logged {logged} requests for small.bin, clients made 40000"
    );
    Ok(format!(
        "{close}, then with keep-alive {kept}, each in the access log"
    ))
}

/// vsftpd (standalone, anonymous, read-only) on ustack: curl fetches the
/// big file twice (passive mode), byte-exact.
fn vsftpd(lab: &Lab, sums: &std::collections::HashMap<String, String>) -> Outcome {
    let conf = lab.path("vsftpd.conf");
    // vsftpd refuses an anonymous root the ftp user may write.
    let root = lab.path("ftp");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::copy(lab.path("www/big.bin"), root.join("big.bin")).unwrap();
    let _ = std::fs::create_dir_all("/var/run/vsftpd/empty");
    std::fs::write(
        &conf,
        format!(
            "listen=YES\nlisten_ipv6=NO\nlisten_address=10.77.0.2\nlisten_port={FTP_PORT}\n\
             background=NO\nanonymous_enable=YES\nno_anon_password=YES\nlocal_enable=NO\n\
             write_enable=NO\nanon_root={}\nseccomp_sandbox=NO\npasv_enable=YES\n\
             pasv_min_port=30000\npasv_max_port=30100\nxferlog_enable=NO\n\
             secure_chroot_dir=/var/run/vsftpd/empty\n",
            root.display()
        ),
    )
    .unwrap();
    let server = lab.start(Host::Stack, false, &["vsftpd", &conf.display().to_string()]);
    let server = listening(lab, server, FTP_PORT)?;
    for i in 0..2 {
        let got = lab.path(&format!("ftp-{i}.bin"));
        let o = lab.linux(&[
            "curl",
            "-sS",
            "-m",
            "30",
            "-o",
            &got.display().to_string(),
            &format!("ftp://10.77.0.2:{FTP_PORT}/big.bin"),
        ]);
        ensure!(o.status.success(), "curl ftp: {}", tail(&text(&o)));
        ensure!(
            sha256(&got) == sums["big.bin"],
            "the file fetched by FTP differs"
        );
    }
    stop_clean(server)?;
    Ok("1 MiB fetched twice by FTP, byte-exact".into())
}

/// PostgreSQL on ustack (a cluster of its own, made by initdb as the
/// postgres user): psql from Linux creates a table, inserts 100 rows and
/// reads their sum back, over two connections.
fn postgres(lab: &Lab) -> Outcome {
    let bin = Path::new("/usr/lib/postgresql/15/bin");
    ensure!(bin.join("initdb").exists(), "no {}/initdb", bin.display());
    let data = lab.path("pg");
    std::fs::create_dir_all(&data).unwrap();
    let chown = std::process::Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(&data)
        .output()
        .expect("chown");
    ensure!(chown.status.success(), "chown: {}", text(&chown));
    let o = std::process::Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(bin.join("initdb"))
        .args(["-A", "trust", "-U", "postgres", "-D"])
        .arg(&data)
        .output()
        .expect("initdb");
    ensure!(o.status.success(), "initdb: {}", tail(&text(&o)));
    // The Linux host may connect (initdb lets only local users in).
    let hba = data.join("pg_hba.conf");
    let mut rules = std::fs::read_to_string(&hba).unwrap_or_default();
    rules.push_str("host all all 10.77.0.0/24 trust\n");
    std::fs::write(&hba, rules).unwrap();
    // postgres refuses root; its stack needs the backend's rights (AF_XDP
    // also loads a program and registers locked memory).
    let caps = match common::backend_flag() {
        "--xdp" => "+net_raw,+net_admin,+bpf,+ipc_lock",
        _ => "+net_raw,+net_admin",
    };
    let (inh, ambient) = (
        format!("--inh-caps={caps}"),
        format!("--ambient-caps={caps}"),
    );
    // No telemetry: the postgres user may not make a socket in the lab.
    let server = lab.start_with(
        Host::Stack,
        false,
        false,
        &[
            "setpriv",
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            &inh,
            &ambient,
            "--",
            &bin.join("postgres").display().to_string(),
            "-D",
            &data.display().to_string(),
            "-k",
            &data.display().to_string(),
            "-c",
            "listen_addresses=10.77.0.2",
            "-p",
            &PG_PORT.to_string(),
        ],
    );
    let server = listening(lab, server, PG_PORT)?;
    let psql = |sql: &str| {
        lab.linux(&[
            "timeout",
            "30",
            "psql",
            "-h",
            "10.77.0.2",
            "-p",
            &PG_PORT.to_string(),
            "-U",
            "postgres",
            "-At",
            "-c",
            sql,
        ])
    };
    let o = psql("CREATE TABLE t (n int); INSERT INTO t SELECT generate_series(1, 100);");
    ensure!(o.status.success(), "psql: {}", tail(&text(&o)));
    let o = psql("SELECT count(*), sum(n) FROM t;");
    ensure!(
        String::from_utf8_lossy(&o.stdout).trim() == "100|5050",
        "psql: {}",
        tail(&text(&o))
    );
    stop_clean(server)?;
    Ok("100 rows written and summed over two connections".into())
}

/// Servers that fork a process per connection, on ustack.
#[test]
fn stock_forking_servers_on_ustack() {
    need_root!();
    let lib = need_preload!();
    let _turn = serial();
    let lab = Lab::new("sf", lib);
    let sums = content(&lab);
    let mut v = Verdicts::new("forking server");
    v.run("sshd", "/usr/sbin/sshd", || sshd(&lab, &sums));
    v.run("apache2 prefork", "apache2", || apache2_prefork(&lab));
    v.run("vsftpd", "vsftpd", || vsftpd(&lab, &sums));
    v.run("postgres", "psql", || postgres(&lab));
    v.assert_all();
}
