//! The one way a ustack test says it cannot run on this machine (no root,
//! a program or the preload library missing, a feature not built).
//!
//! A skipped test would otherwise pass: a run without root or packages
//! would go green having tested nothing. So a skip is
//!
//! - under `CI=true` (or `CI=1`): a panic naming what is missing, so the
//!   test fails;
//! - otherwise: the reason on stderr, and a line `test: reason` appended
//!   to the file named by `USTACK_SKIP_LOG` (tools/test.sh sets it and
//!   lists the lines at its end).
//!
//! Tests call [`skip_test!`] (say why and return) or, to leave out one
//! part of a test and go on, [`skip`].
#![forbid(unsafe_code)]

use std::io::Write;

/// The variable naming the file skips are appended to.
pub const SKIP_LOG_VAR: &str = "USTACK_SKIP_LOG";

/// Whether this is a CI run, where nothing may be skipped: `CI` is `true`
/// (any case) or `1`.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// The running test's name: the test binary (without cargo's hash) and
/// the test thread's name (libtest names each test's thread after it),
/// e.g. `netns_preload::redis_benchmark_get_set`.
pub fn test_name() -> String {
    let bin = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|s| match s.rsplit_once('-') {
            Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_string(),
            _ => s,
        })
        .unwrap_or_else(|| "test".into());
    match std::thread::current().name() {
        Some(t) if t != "main" => format!("{bin}::{t}"),
        _ => bin,
    }
}

/// Record that the running test (or a part of it) does not run here
/// because of `reason`: under CI a panic (the test fails), otherwise a
/// line on stderr and in `USTACK_SKIP_LOG`. The caller returns (or leaves
/// the part out) after it. The panic names the caller's line.
#[track_caller]
pub fn skip(reason: &str) {
    let name = test_name();
    if in_ci() {
        panic!("{name}: cannot run here under CI=true: {reason}");
    }
    eprintln!("SKIPPED {name}: {reason}");
    if let Some(path) = std::env::var_os(SKIP_LOG_VAR).filter(|p| !p.is_empty()) {
        // One write of one line: O_APPEND keeps lines of parallel tests whole.
        let line = format!("{name}: {}\n", reason.replace('\n', " "));
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            eprintln!("cannot append to {}: {e}", path.to_string_lossy());
        }
    }
}

/// Skip the running test: [`skip`] with a `format!` reason, then `return`
/// (`Default::default()`, so it also serves a helper returning `Option`).
#[macro_export]
macro_rules! skip_test {
    ($($reason:tt)+) => {{
        $crate::skip(&format!($($reason)+));
        return Default::default();
    }};
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn the_name_is_the_binary_and_the_test() {
        let name = test_name();
        assert!(
            name.starts_with("ustack_test_skip::")
                && name.ends_with("the_name_is_the_binary_and_the_test"),
            "{name}"
        );
    }

    // CI and the log file are process-wide: one test covers both ways.
    #[test]
    fn a_skip_is_logged_or_under_ci_fails() {
        let log = std::env::temp_dir().join(format!("ustack-skip-{}.log", std::process::id()));
        let _ = std::fs::remove_file(&log);
        // The environment is set for a child run of this binary, once
        // without CI and once with it.
        let exe = std::env::current_exe().unwrap();
        for ci in ["", "true"] {
            let o = std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "test::child_skips",
                    "--include-ignored",
                    "--nocapture",
                ])
                .env("CI", ci)
                .env(SKIP_LOG_VAR, &log)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stdout).into_owned()
                + &String::from_utf8_lossy(&o.stderr);
            if ci.is_empty() {
                assert!(o.status.success(), "{err}");
                assert!(err.contains("SKIPPED"), "{err}");
            } else {
                assert!(
                    !o.status.success(),
                    "under CI the skip fails the test: {err}"
                );
                assert!(
                    err.contains("cannot run here under CI=true: no frobnicator"),
                    "{err}"
                );
            }
        }
        let lines = std::fs::read_to_string(&log).unwrap();
        let _ = std::fs::remove_file(&log);
        assert_eq!(
            lines,
            "ustack_test_skip::test::child_skips: no frobnicator (apt-get install frob)\n"
        );
    }

    /// Run only by the test above, in a child process.
    #[test]
    #[ignore = "run by a_skip_is_logged_or_under_ci_fails"]
    fn child_skips() {
        let f = || -> Option<u32> {
            skip_test!("no {} (apt-get install {})", "frobnicator", "frob");
        };
        assert_eq!(f(), None);
    }
}
