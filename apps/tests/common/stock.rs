//! What the stock-program suite (netns_stock.rs) shares: the served
//! files and their sums, waiting for a server to serve, clients run under
//! `ustack exec`, ApacheBench and its checks, and the Linux echo and nc
//! peers.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use regex::Regex;

use super::lab::*;
use super::{Daemon, Topo, no_crash, pools_in_use, sha256};

/// What a program's run found: what was checked, or the first failure.
pub type Outcome = Result<String, String>;

/// `Err(format!(...))` out of the enclosing function unless `cond`.
macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err(format!($($arg)+));
        }
    };
}

/// Files served and fetched: (name, size).
pub const FILES: [(&str, usize); 2] = [("small.bin", 100), ("big.bin", 1 << 20)];

/// The stream sent through echoes and relays.
pub const STREAM_BYTES: usize = 4 << 20;

/// A scratch directory the servers' own users may read (apache2 drops to
/// www-data), with `www/` holding [`FILES`] and `stream.bin`; the SHA-256
/// of each by name.
pub fn content(lab: &Lab) -> std::collections::HashMap<String, String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(lab.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let www = lab.path("www");
    std::fs::create_dir_all(&www).unwrap();
    let mut sums = std::collections::HashMap::new();
    for (name, len) in FILES.iter().copied().chain([("stream.bin", STREAM_BYTES)]) {
        let (tmp, data) = super::random_file(len);
        let p = www.join(name);
        std::fs::write(&p, data).unwrap();
        drop(tmp);
        sums.insert(name.to_string(), sha256(&p));
    }
    sums
}

/// The first capture of `re` in `text` as a number.
pub fn number(text: &str, re: &str) -> Result<u64, String> {
    let r = Regex::new(re).unwrap();
    r.captures(text)
        .and_then(|c| c[1].parse().ok())
        .ok_or_else(|| format!("no /{re}/ in: {}", tail(text)))
}

/// The last lines of a program's output, for a failure message.
pub fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(6)..].join(" | ")
}

/// Lines of `file` containing `needle`.
pub fn count_lines(file: &Path, needle: &str) -> u64 {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .count() as u64
}

/// Wait until `ready` holds (at most `within`).
pub fn wait_for(within: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if ready() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `server` once `probe` holds (at most 15 s); its exit status and last
/// words when it ends before.
pub fn serving(
    mut server: Preloaded,
    port: u16,
    mut probe: impl FnMut() -> bool,
) -> Result<Preloaded, String> {
    let up = wait_for(Duration::from_secs(15), || {
        server.exited_within(Duration::ZERO) || probe()
    });
    if server.exited_within(Duration::ZERO) {
        // A program that ended before its first socket has no telemetry.
        server.tail = None;
        let ended = server.ended();
        return Err(format!(
            "{} exited with {} before it served: {}",
            ended.what,
            ended.code,
            tail(&format!("{}{}", ended.out, ended.err))
        ));
    }
    ensure!(up, "{} never served on {port} (15 s)", server.what);
    Ok(server)
}

/// `server` once a TCP connect from the Linux host to 10.77.0.2:`port`
/// succeeds.
pub fn listening(lab: &Lab, server: Preloaded, port: u16) -> Result<Preloaded, String> {
    let p = port.to_string();
    serving(server, port, || {
        lab.linux(&["nc", "-z", "-w", "1", "10.77.0.2", &p])
            .status
            .success()
    })
}

/// Stop a server on ustack: it exits within 20 s of SIGTERM, without a
/// panic, every pool of its stack back at zero.
pub fn stop_clean(server: Preloaded) -> Result<Ended, String> {
    let ended = server.stop();
    no_crash(&ended.err);
    if let Some(last) = &ended.last {
        let pools = pools_in_use(last);
        ensure!(
            pools.iter().all(|p| p.1 == 0),
            "{}: pool buffers still in use when its stack stopped: {pools:?}",
            ended.what
        );
    }
    Ok(ended)
}

/// A client on ustack run to its end (within 60 s): status 0, every pool
/// of its stack back at zero; its output.
pub fn client(lab: &Lab, program: &[&str]) -> Result<Ended, String> {
    let ended = lab
        .start(Host::Stack, false, program)
        .wait_within(Duration::from_secs(60));
    no_crash(&ended.err);
    ensure!(
        ended.code == 0,
        "{} exited with {}: {}",
        ended.what,
        ended.code,
        tail(&format!("{}{}", ended.out, ended.err))
    );
    if let Some(last) = &ended.last {
        let pools = pools_in_use(last);
        ensure!(
            pools.iter().all(|p| p.1 == 0),
            "{}: pool buffers still in use at its end: {pools:?}",
            ended.what
        );
    }
    Ok(ended)
}

/// `curl` from the Linux host fetching every file of [`FILES`] from
/// `base` over one connection: each byte-exact, and one connect for all
/// (keep-alive) when `keepalive`.
pub fn curl_files(
    lab: &Lab,
    sums: &std::collections::HashMap<String, String>,
    base: &str,
    keepalive: bool,
) -> Result<String, String> {
    let mut args = vec![
        "curl",
        "-s",
        "-m",
        "30",
        "-w",
        "%{http_code} %{num_connects}\n",
    ];
    let outs: Vec<_> = FILES
        .iter()
        .map(|(n, _)| {
            (
                format!("{base}/{n}"),
                lab.path(&format!("got-{}", n)).display().to_string(),
            )
        })
        .collect();
    for (url, out) in &outs {
        args.extend(["-o", out, url]);
    }
    let o = lab.linux(&args);
    let text = text(&o);
    ensure!(o.status.success(), "curl {base}: {}", tail(&text));
    let connects: Vec<&str> = text.lines().collect();
    ensure!(
        connects.iter().all(|l| l.starts_with("200 ")),
        "curl {base}: {text}"
    );
    if keepalive {
        ensure!(
            connects.iter().skip(1).all(|l| l.ends_with(" 0")),
            "curl {base}: a new connection per file (no keep-alive): {text}"
        );
    }
    for ((name, _), (_, out)) in FILES.iter().zip(&outs) {
        ensure!(
            sha256(Path::new(out)) == sums[*name],
            "{base}/{name}: the SHA-256 of what curl got differs"
        );
    }
    Ok(format!(
        "{} files byte-exact{}",
        FILES.len(),
        if keepalive { " on one connection" } else { "" }
    ))
}

/// `ab -n n -c c` (HTTP/1.0, no keep-alive) from the Linux host: every
/// request complete, none failed, all 200.
pub fn ab(lab: &Lab, url: &str, n: u64, c: u64) -> Result<String, String> {
    let o = lab.linux(&[
        "timeout",
        "120",
        "ab",
        "-q",
        "-s",
        "10",
        "-n",
        &n.to_string(),
        "-c",
        &c.to_string(),
        url,
    ]);
    let text = text(&o);
    ensure!(o.status.success(), "ab {url}: {}", tail(&text));
    check_ab(url, &text, n)
}

pub fn check_ab(url: &str, text: &str, n: u64) -> Result<String, String> {
    let complete = number(text, r"Complete requests:\s+(\d+)")?;
    let failed = number(text, r"Failed requests:\s+(\d+)")?;
    ensure!(
        complete == n && failed == 0 && !text.contains("Non-2xx"),
        "ab {url}: {complete} complete, {failed} failed of {n}: {}",
        tail(text)
    );
    let rps = number(text, r"Requests per second:\s+(\d+)").unwrap_or(0);
    Ok(format!("{n} HTTP/1.0 requests ({rps}/s)"))
}

/// The Linux side's echo server (Python, a thread per connection): it
/// echoes until the client's FIN, then sends its own FIN, and prints
/// "echoed N" per connection.
pub const LINUX_ECHO: &str = r#"
import socket, sys, threading
ip, port = sys.argv[1], int(sys.argv[2])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((ip, port))
s.listen(64)
print("ready", flush=True)
def echo(c):
    n = 0
    with c:
        while True:
            d = c.recv(65536)
            if not d:
                break
            c.sendall(d)
            n += len(d)
        c.shutdown(socket.SHUT_WR)
    print(f"echoed {n}", flush=True)
while True:
    c, _ = s.accept()
    threading.Thread(target=echo, args=(c,), daemon=True).start()
"#;

/// Start [`LINUX_ECHO`] on 10.77.0.1:`port`, returned once it listens.
pub fn linux_echo(lab: &Lab, port: u16) -> Daemon {
    let script = lab.path("echo.py");
    std::fs::write(&script, LINUX_ECHO).unwrap();
    let mut d = lab.linux_daemon(&[
        PYTHON,
        &script.display().to_string(),
        "10.77.0.1",
        &port.to_string(),
    ]);
    use std::io::BufRead;
    let out = d.child.as_mut().unwrap().stdout.take().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(out).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "the Linux echo did not start");
    d
}

/// A Linux `nc -N` sending `file` to `addr port` and keeping what comes
/// back in `back`; its status.
pub fn linux_nc(topo: &Topo, addr: &str, port: u16, file: &Path, back: &Path) -> Output {
    topo.linux(&[
        "sh",
        "-c",
        &format!(
            "timeout 60 nc -N {addr} {port} < {} > {}",
            file.display(),
            back.display()
        ),
    ])
}
