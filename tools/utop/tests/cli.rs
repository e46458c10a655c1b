//! `utop` as a user runs it, against stand-in stacks on Unix sockets the
//! test creates: `--once`, a stack that exits, bad paths, discovery.

use std::io::Write;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A temporary directory removed on drop.
struct TmpDir(PathBuf);

impl TmpDir {
    fn new(tag: &str) -> TmpDir {
        let d = std::env::temp_dir().join(format!("utop-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TmpDir(d)
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const LINE: &str = r#"{"name":"fake stack","pid":7,"seq":1,"at_ns":1000,"pools":[{"name":"fake-pool","capacity":64,"in_use":3,"alloc_failures":0,"buf_size":2048}],"port":{"rx_packets":11},"stack":{"arp":{"entries":1}},"connections":[{"local":"10.77.0.2:7","remote":"10.77.0.1:40000","state":"Established"}],"connections_total":1}"#;

/// A stand-in stack at `path`: each client gets `lines`, then the
/// connection closes. Serves `clients` connections, on a thread.
fn fake_stack(path: &Path, lines: &'static [&'static str], clients: usize) {
    let l = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().take(clients) {
            let mut s = s.unwrap();
            for line in lines {
                let _ = writeln!(s, "{line}");
            }
        }
    });
}

fn utop(args: &[&str], env: &[(&str, &Path)]) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_utop"));
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let Output {
        status,
        stdout,
        stderr,
    } = c.output().expect("run utop");
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

#[test]
fn once_prints_a_plain_frame() {
    let d = TmpDir::new("once");
    let sock = d.0.join("s.sock");
    fake_stack(&sock, &[LINE], 1);
    let (code, out, err) = utop(&["--once", "--telemetry", sock.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(!out.contains('\x1b'), "plain text");
    assert!(out.contains("fake stack (pid 7)"), "{out}");
    assert!(out.contains("fake-pool"), "{out}");
    let row = out
        .lines()
        .find(|l| l.contains("10.77.0.1:40000"))
        .expect(&out);
    assert!(row.contains("ESTABLISHED"), "{row}");
    // The stack closed after one snapshot: the frame says so.
    assert!(
        err.contains(&format!("stack at {} exited", sock.display())),
        "{err}"
    );
}

#[test]
fn a_stack_that_exits_before_a_snapshot_is_reported() {
    let d = TmpDir::new("exit");
    let sock = d.0.join("gone.sock");
    fake_stack(&sock, &[], 1);
    let (code, out, err) = utop(&["--once", "--telemetry", sock.to_str().unwrap()], &[]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert_eq!(
        err.trim(),
        format!("utop: stack at {} exited", sock.display())
    );
}

#[test]
fn bad_paths_are_one_line_and_exit_2() {
    let d = TmpDir::new("bad");
    let missing = d.0.join("no/such/dir.sock");
    let (code, _, err) = utop(&["--once", "--telemetry", missing.to_str().unwrap()], &[]);
    assert_eq!(code, 2);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("no stack at") && err.contains("no such socket"),
        "{err}"
    );

    let file = d.0.join("plain");
    std::fs::write(&file, "x").unwrap();
    let (code, _, err) = utop(&["--once", "--telemetry", file.to_str().unwrap()], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("not a socket"), "{err}");

    let stale = d.0.join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    let (code, _, err) = utop(&["--once", "--telemetry", stale.to_str().unwrap()], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("nobody listens"), "{err}");

    let garbage = d.0.join("garbage.sock");
    fake_stack(&garbage, &["hello"], 1);
    let (code, _, err) = utop(&["--once", "--telemetry", garbage.to_str().unwrap()], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("not ustack telemetry"), "{err}");
}

#[test]
fn interactive_mode_needs_a_terminal() {
    let d = TmpDir::new("tty");
    let sock = d.0.join("s.sock");
    fake_stack(&sock, &[LINE], 1);
    let (code, _, err) = utop(&["--telemetry", sock.to_str().unwrap()], &[]);
    assert_eq!(code, 2);
    assert!(
        err.contains("not a terminal") && err.contains("--once"),
        "{err}"
    );
}

#[test]
fn without_a_path_utop_finds_the_stack_in_the_default_dir() {
    let run = TmpDir::new("xdg");
    let xdg = [("XDG_RUNTIME_DIR", run.0.as_path())];
    let (code, _, err) = utop(&["--once"], &xdg);
    assert_eq!(code, 2);
    assert!(err.contains("no running stack found"), "{err}");

    let dir = run.0.join("ustack");
    std::fs::create_dir(&dir).unwrap();
    // A stale socket is skipped; the live one is picked (the probe is a client too).
    drop(UnixListener::bind(dir.join("dead.sock")).unwrap());
    fake_stack(&dir.join("one.sock"), &[LINE], 3);
    let (code, out, err) = utop(&["--once"], &xdg);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("fake-pool"), "{out}");

    // A bare name means NAME.sock in the default directory.
    fake_stack(&dir.join("two.sock"), &[LINE], 3);
    let (code, out, err) = utop(&["--once", "--telemetry", "two"], &xdg);
    assert_eq!(code, 0, "{out}\n{err}");

    // Two live stacks and no terminal to ask on: list them and exit.
    let (code, _, err) = utop(&["--once"], &xdg);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("2 stacks running") && err.contains("one.sock") && err.contains("two.sock"),
        "{err}"
    );
    assert!(err.contains("--telemetry PATH"), "{err}");
}

/// `utop --once | head -1` after head has exited: quiet, status 141 (as a
/// SIGPIPE death), not "Broken pipe" with status 2.
#[test]
fn once_into_a_closed_pipe_is_quiet() {
    let dir = TmpDir::new("epipe");
    let sock = dir.0.join("s.sock");
    fake_stack(&sock, &[LINE, LINE], 1);
    let mut child = Command::new(env!("CARGO_BIN_EXE_utop"))
        .args(["--once", "--telemetry", sock.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "stderr: {err}");
    assert!(
        !err.contains("Broken pipe") && !err.contains("panicked"),
        "{err}"
    );
}
