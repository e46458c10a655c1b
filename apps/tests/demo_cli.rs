//! The `ustack demo` command as a user runs it: output, counters, exit codes.

use std::process::Command;

fn demo(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ustack"))
        .arg("demo")
        .args(args)
        .output()
        .expect("run ustack");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// (transmitted, received, loss%) from ping's summary line.
fn summary(stdout: &str) -> (u64, u64, f64) {
    let line = stdout
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .expect("summary line");
    let words: Vec<&str> = line.split_whitespace().collect();
    let tx = words[0].parse().unwrap();
    let rx = words[3].trim_end_matches(',').parse().unwrap();
    let loss = words[5].trim_end_matches('%').parse().unwrap();
    (tx, rx, loss)
}

#[test]
fn clean_demo_pings_without_loss_and_returns_buffers() {
    let (code, out, err) = demo(&["--duration", "1", "--no-tui", "--interval", "5"]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let (tx, rx, loss) = summary(&out);
    // Wall-clock pacing varies on a loaded machine: only require that it ran.
    assert!(tx >= 10, "{tx} pings in 1 s at 5 ms");
    assert_eq!((rx, loss), (tx, 0.0));
    assert!(out.contains("rtt min/avg/max/mdev = "));
    // Both pools are back to zero in use after the run.
    assert_eq!(
        out.matches(": 0 of 8192 in use, 0 alloc failures").count(),
        2,
        "{out}"
    );
    assert!(out.contains(&format!("echo req in/out {tx}/0")));
}

#[test]
fn demo_tcp_transfer_is_byte_exact_with_goodput() {
    let (code, out, err) = demo(&[
        "--duration",
        "8",
        "--no-tui",
        "--tcp-mib",
        "16",
        "--interval",
        "50",
    ]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("tcp: "))
        .expect("tcp summary line");
    assert!(line.starts_with("tcp: 16 MiB in "), "{line}");
    assert!(line.contains("Gbit/s goodput"), "{line}");
    assert!(line.ends_with("byte-exact (CRC-32 matches)"), "{line}");
}

#[test]
fn lossy_demo_counts_losses() {
    let (code, out, _) = demo(&["--duration", "1", "--no-tui", "--loss", "30", "--seed", "9"]);
    assert_eq!(code, 0);
    let (tx, rx, loss) = summary(&out);
    assert!(rx < tx && loss > 0.0, "{out}");
    let lost: u64 = out
        .lines()
        .find(|l| l.starts_with("sim link:"))
        .and_then(|l| l.split(", ").nth(2))
        .and_then(|w| w.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("sim link line");
    assert!(lost > 0);
}

#[test]
fn total_loss_exits_one_and_bad_flags_exit_two() {
    let (code, out, _) = demo(&["--duration", "0.3", "--no-tui", "--loss", "100"]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(summary(&out).2, 100.0);

    for bad in [
        &["--loss", "101"][..],
        &["--duration", "0"],
        &["--interval", "x"],
        &["--bogus"],
    ] {
        let (code, out, err) = demo(bad);
        assert_eq!(code, 2, "{bad:?}");
        assert!(out.is_empty());
        assert!(err.starts_with("error: "), "{err}");
        assert!(!err.contains("panicked"));
    }
}

/// `ustack exec`'s own flags refuse bad values with exit status 2 and one
/// clear error, before any library or program is looked for.
#[test]
fn exec_refuses_bad_spin_fork_and_stack_values() {
    for bad in [
        &["--spin", "x"][..],
        &["--spin", "-1"],
        &["--spin", "2000000"],
        &["--fork", "sibling"],
        &["--fork", "each"],
        &["--fork", "each", "--workers", "0"],
        &["--fork", "each", "--workers", "65"],
        &["--workers", "2"],
        &["--stack", "two words"],
        &["--stack", ""],
        &["--stack", "a/b"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ustack"))
            .args(["exec", "--sim", "--ip", "10.0.0.2/24"])
            .args(bad)
            .args(["--", "true"])
            .output()
            .expect("run ustack");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
        assert!(err.starts_with("error: "), "{bad:?}: {err}");
        assert!(bad.iter().any(|w| err.contains(w)), "{bad:?}: {err}");
    }
}

/// Run `bin args` with its stdout a pipe whose reader is already gone (as
/// under `| head -1` after head exits): (status, stderr).
pub fn with_closed_stdout(bin: &str, args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(bin)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `ustack demo | head -1`: no "failed printing to stdout" panic (101), the
/// status a SIGPIPE death gets from the shell instead, and nothing on stderr.
#[test]
fn closed_stdout_exits_quietly() {
    let (code, err) = with_closed_stdout(
        env!("CARGO_BIN_EXE_ustack"),
        &["demo", "--duration", "1", "--no-tui", "--tcp-mib", "0"],
    );
    assert_eq!(code, Some(141), "stderr:\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.is_empty(), "quiet: {err}");
}

fn help(bin: &str, args: &[&str]) -> String {
    let out = Command::new(bin).args(args).output().expect("run");
    assert_eq!(out.status.code(), Some(0));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ustack run --help` names everything the daemon serves; --dpdk and
/// --verbs are listed only in builds that have them.
#[test]
fn help_names_services_and_only_built_backends() {
    let run = help(env!("CARGO_BIN_EXE_ustack"), &["run", "--help"]);
    for what in [
        "echo (7)",
        "discard (9)",
        "iperf3 (5201",
        "UD ping responder",
    ] {
        assert!(run.contains(what), "{what} in\n{run}");
    }
    let uping = help(env!("CARGO_BIN_EXE_uping"), &["--help"]);
    let uperf = help(env!("CARGO_BIN_EXE_uperf"), &["--help"]);
    for h in [&run, &uping, &uperf] {
        assert_eq!(h.contains("--dpdk"), cfg!(feature = "dpdk"), "{h}");
        assert_eq!(h.contains("--cores"), cfg!(feature = "dpdk"), "{h}");
    }
    assert_eq!(
        uping.contains("--verbs"),
        cfg!(feature = "verbs"),
        "{uping}"
    );
}

/// `ustack send`'s own checks: port 0 and bad byte counts are refused with
/// one `error:` line and status 2; K/M/G suffixes are taken.
#[test]
fn send_refuses_port_zero_and_takes_byte_suffixes() {
    let send = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ustack"))
            .args(["send", "--ip", "10.77.0.2/24"])
            .args(extra)
            .output()
            .expect("run ustack")
    };
    for bad in [
        &["--to", "10.77.0.1:0"][..],
        &["--to", "10.77.0.1:9", "--bytes", "12X"],
        &["--to", "10.77.0.1:9", "--bytes", "0"],
        &["--to", "10.77.0.1:9", "--bytes", "99999999999T"],
    ] {
        let out = send(bad);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
        assert!(err.starts_with("error: "), "{bad:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // A suffixed count parses: the next complaint is the missing backend.
    for ok in ["64M", "512k", "1G", "1048576"] {
        let out = send(&["--to", "10.77.0.1:9", "--bytes", ok]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{ok}: {err}");
        assert!(err.contains("choose a backend"), "{ok}: {err}");
    }
}

/// Mistakes in NET found before anything starts: a gateway off the subnet
/// and a CPU that does not exist give one line and status 2, and nothing
/// on stdout (no banner first).
#[test]
fn net_mistakes_are_refused_before_the_banner() {
    for (bad, what) in [
        (
            &["--gw", "192.168.9.1"][..],
            "not another address on our subnet",
        ),
        (&["--gw", "10.77.0.2"], "not another address on our subnet"),
        (&["--core", "4096"], "no CPU 4096"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ustack"))
            // An interface that does not exist: a check that is missing
            // fails on opening it, and nothing is ever sent.
            .args(["run", "--pcap", "nosuch0", "--ip", "10.77.0.2/24"])
            .args(bad)
            .output()
            .expect("run ustack");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
        assert!(out.stdout.is_empty(), "{bad:?}: banner printed");
        assert!(err.contains(what), "{bad:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}
