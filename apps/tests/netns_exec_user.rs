//! Programs that run as another user on ustack (`ustack exec --user`, and
//! `setpriv` with ambient capabilities in front of `ustack exec`), in
//! namespaces the test makes (tools/netns.sh): a stock
//! `python3 -m http.server` as `nobody` serves a file that a Linux `curl`
//! fetches byte-exact (SHA-256), the server's process runs with nobody's
//! ids and only CAP_NET_RAW and CAP_NET_ADMIN, and without those
//! capabilities the stack refuses to start with one line. Needs root,
//! the `pcap` feature and the preload library.
#![cfg(feature = "pcap")]

#[macro_use]
mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{Daemon, Topo, no_crash, sha256};

/// The system's Python (a `python3` on the PATH may be a pyenv shim).
const PYTHON: &str = "/usr/bin/python3";

/// CAP_NET_ADMIN (12) and CAP_NET_RAW (13) as /proc's capability masks.
const NET_CAPS: &str = "0000000000003000";

/// `libustack_preload.so`: `USTACK_PRELOAD_LIB`, else the release build's.
fn preload_lib() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("USTACK_PRELOAD_LIB") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    let here = Path::new(env!("CARGO_BIN_EXE_ustack")).parent()?;
    [
        here.parent()?.join("release/libustack_preload.so"),
        here.join("libustack_preload.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// A directory anyone may read, holding `file.bin` (4 MiB of the bulk
/// pattern); and the file's SHA-256.
fn served_dir() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut data = vec![0u8; 4 << 20];
    ustack_kit::bulk::fill_pattern(3, &mut data);
    let file = dir.path().join("file.bin");
    std::fs::write(&file, &data).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let sum = sha256(&file);
    (dir, sum)
}

/// `ustack exec` in the stack namespace as 10.77.0.2: `before` goes in
/// front of `ustack` (a setpriv), `flags` after `exec`.
fn exec(topo: &Topo, lib: &Path, before: &[&str], flags: &[&str], program: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &topo.ns("stack")])
        .args(before)
        .arg(env!("CARGO_BIN_EXE_ustack"))
        .args(["exec", "--pcap", &topo.stack_if(), "--ip", "10.77.0.2/24"])
        .args(flags)
        .arg("--")
        .args(program)
        .env("USTACK_PRELOAD_LIB", lib);
    c
}

/// `curl` on the Linux host fetching the file into `out`, retried until
/// the server listens (at most 20 s) or exits.
fn fetch(topo: &Topo, out: &Path, server: &mut Daemon) -> Output {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let o = topo.linux(&[
            "curl",
            "-sS",
            "--max-time",
            "20",
            "-o",
            out.to_str().unwrap(),
            "http://10.77.0.2:8000/file.bin",
        ]);
        let exited = server
            .child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
        if o.status.success() || exited || Instant::now() > deadline {
            return o;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A field of /proc/PID/status ("Uid", "CapAmb", ...).
fn status_field(pid: u32, name: &str) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status:\n{s}"))
}

/// Serve the file from `python3 -m http.server` started by `cmd` (in the
/// served directory), fetch it from Linux and check it, the server's ids
/// and capabilities; then stop it.
fn serve_and_fetch(topo: &Topo, dir: &Path, sum: &str, cmd: &mut Command) {
    cmd.current_dir(dir);
    let mut server = Daemon::spawn(cmd);
    let pid = server.child.as_ref().unwrap().id();
    let out = tempfile::NamedTempFile::new().unwrap();
    let o = fetch(topo, out.path(), &mut server);
    let (uid, gid) = (status_field(pid, "Uid"), status_field(pid, "Gid"));
    let (amb, eff) = (status_field(pid, "CapAmb"), status_field(pid, "CapEff"));
    let (code, sout, serr) = server.stop();
    assert!(
        o.status.success(),
        "curl: {}{}\nserver ({code}): {sout}{serr}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(sha256(out.path()), sum, "the file came whole: {serr}");
    // Every id is nobody's (ip netns exec, ustack, setpriv and env all
    // exec: the pid is the server's).
    assert_eq!(
        uid.split_whitespace().collect::<Vec<_>>(),
        ["65534"; 4],
        "Uid"
    );
    assert_eq!(
        gid.split_whitespace().collect::<Vec<_>>(),
        ["65534"; 4],
        "Gid"
    );
    assert_eq!(
        (amb.as_str(), eff.as_str()),
        (NET_CAPS, NET_CAPS),
        "capabilities"
    );
    assert!(
        serr.contains("GET /file.bin"),
        "the server logged the fetch: {serr}"
    );
    no_crash(&serr);
}

#[test]
fn exec_user_runs_a_server_as_nobody_on_ustack() {
    need_root!();
    need_program!("setpriv", "util-linux");
    need_program!("curl", "curl");
    let Some(lib) = preload_lib() else {
        ustack_test_skip::skip_test!(
            "libustack_preload.so is not built (cargo build --release --all-features -p ustack-preload)"
        );
    };
    let topo = Topo::up("xu");
    let (dir, sum) = served_dir();
    let server = [PYTHON, "-m", "http.server", "8000", "--bind", "10.77.0.2"];

    // `ustack exec --user nobody`.
    serve_and_fetch(
        &topo,
        dir.path(),
        &sum,
        &mut exec(&topo, &lib, &[], &["--user", "nobody"], &server),
    );

    // The documented shape with setpriv in front of `ustack exec`.
    let setpriv = [
        "setpriv",
        "--reuid=nobody",
        "--regid=nogroup",
        "--clear-groups",
        "--inh-caps=+net_raw,+net_admin",
        "--ambient-caps=+net_raw,+net_admin",
        "--",
    ];
    serve_and_fetch(
        &topo,
        dir.path(),
        &sum,
        &mut exec(&topo, &lib, &setpriv, &[], &server),
    );

    // Without the capabilities the stack cannot open its interface: one
    // line and status 2 at the program's first socket.
    let o = exec(
        &topo,
        &lib,
        &[
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "--",
        ],
        &[],
        &[PYTHON, "-c", "import socket; socket.socket()"],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("permission"), "{err}");
    no_crash(&err);

    // A user that does not exist is one line and no program.
    let o = exec(
        &topo,
        &lib,
        &[],
        &["--user", "no-such-user-here"],
        &["true"],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("no such user"), "{err}");
}
