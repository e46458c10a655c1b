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
fn exec_refuses_bad_spin_and_fork_values() {
    for bad in [
        &["--spin", "x"][..],
        &["--spin", "-1"],
        &["--spin", "2000000"],
        &["--fork", "sibling"],
        &["--fork", "each"],
        &["--fork", "each", "--workers", "0"],
        &["--fork", "each", "--workers", "65"],
        &["--workers", "2"],
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
