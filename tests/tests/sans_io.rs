//! The engine crate is sans-IO: its code never starts a thread, opens a
//! socket, reads a clock or sleeps, and it depends on no crate that would.
//! (Clippy enforces the calls too, through `stack/clippy.toml`; this test
//! also catches paths clippy's lists do not name.)

use std::path::{Path, PathBuf};
use std::process::Command;

fn engine_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../stack/src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read stack/src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A file's code without its `#[cfg(test)]` module (unit tests sit at the
/// bottom of each file) and without comments.
fn engine_code(text: &str) -> String {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    code.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn engine_code_touches_no_thread_socket_or_clock() {
    const FORBIDDEN: &[&str] = &[
        "std::thread",
        "std::net",
        "std::os",
        "std::fs",
        "std::process",
        "Instant::now",
        "SystemTime",
        "sleep(",
        "park(",
    ];
    let mut files = Vec::new();
    rust_files(&engine_src(), &mut files);
    assert!(
        files.len() > 20,
        "found the engine's sources: {}",
        files.len()
    );
    let mut found = Vec::new();
    for f in &files {
        let code = engine_code(&std::fs::read_to_string(f).expect("read"));
        // One OS type may be named, never used: `Device::rx_fd` lends the
        // loop a port's descriptor (as `wait_rx` waits on it); the engine
        // never calls either. Nothing else under `std::os` passes.
        let code = code.replace("Option<std::os::fd::BorrowedFd<'_>>", "");
        for pat in FORBIDDEN {
            if code.contains(pat) {
                found.push(format!("{}: {pat}", f.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "the engine must stay sans-IO:\n{}",
        found.join("\n")
    );
}

#[test]
fn engine_depends_on_no_runtime_thread_or_socket_crate() {
    const FORBIDDEN: &[&str] = &[
        "tokio",
        "mio",
        "async-std",
        "futures",
        "crossbeam",
        "parking_lot",
        "core_affinity",
        "libc",
        "pcap",
        "socket2",
        "nix",
        "rayon",
        "ustack-runtime",
    ];
    let out = Command::new(env!("CARGO"))
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .args([
            "tree",
            "-p",
            "ustack",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--offline",
        ])
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    let crates: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(crates.contains(&"smoltcp"), "{tree}");
    for c in FORBIDDEN {
        assert!(!crates.contains(c), "the engine depends on {c}:\n{tree}");
    }
}
