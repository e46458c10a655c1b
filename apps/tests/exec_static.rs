//! `ustack exec` refuses a statically linked program (an ELF executable
//! without a `PT_INTERP` program header: no dynamic loader runs, so
//! `LD_PRELOAD` is never read and every socket would be the kernel's)
//! with one line and exit status 2, whether named by a path or found on
//! `PATH`; the same program linked dynamically, and a `#!` script, run.
//! NET is `--pcap lo`, checked and never opened: no program here opens a
//! socket, so no stack starts (no root, no namespace, nothing sent).

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const HELLO: &str = "#include <stdio.h>\nint main(void) { puts(\"ran\"); return 0; }\n";

/// `cc [-static] -o DIR/NAME hello.c`.
fn compile(dir: &Path, name: &str, static_link: bool) -> PathBuf {
    let src = dir.join("hello.c");
    std::fs::write(&src, HELLO).unwrap();
    let bin = dir.join(name);
    let mut cc = Command::new("cc");
    if static_link {
        cc.arg("-static");
    }
    let o = cc
        .arg("-O1")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("run cc");
    assert!(
        o.status.success(),
        "cc {name} (static: {static_link}; a static build needs libc6-dev): {}",
        String::from_utf8_lossy(&o.stderr)
    );
    bin
}

/// `ustack exec --pcap lo --ip 10.0.0.1/24 -- PROGRAM` with `path` as PATH.
fn exec(lib: &Path, program: &str, path: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ustack"))
        .args(["exec", "--pcap", "lo", "--ip", "10.0.0.1/24", "--", program])
        .env("USTACK_PRELOAD_LIB", lib)
        .env("PATH", path)
        .output()
        .expect("run ustack exec")
}

/// Refused: exit status 2, nothing on stdout, one `ustack:` line saying
/// the program is statically linked.
fn assert_refused(what: &str, o: &Output) {
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{what}: {out}{err}");
    assert_eq!(out, "", "{what} ran");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{what}: {err}");
    assert!(
        lines[0].starts_with("ustack: ") && lines[0].contains("is statically linked"),
        "{what}: {err}"
    );
}

/// Ran: exit status 0 and `want` on stdout.
fn assert_ran(what: &str, o: &Output, want: &str) {
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{what}: {out}{err}");
    assert_eq!(out.trim(), want, "{what}: {err}");
}

#[test]
fn static_programs_are_refused_dynamic_ones_and_scripts_run() {
    need_program!("cc", "gcc");
    let lib = need_preload!();
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let system = std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into());
    let path = format!("{}:{system}", bin.display());

    let fixed = compile(&bin, "hello-static", true);
    let dynamic = compile(&bin, "hello-dynamic", false);
    let script = bin.join("hello-script");
    std::fs::write(&script, "#!/bin/sh\necho ran\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();

    // By path, and found on PATH as exec would find it.
    assert_refused(
        "a static program by path",
        &exec(&lib, &fixed.display().to_string(), &system),
    );
    assert_refused(
        "a static program on PATH",
        &exec(&lib, "hello-static", &path),
    );
    assert_ran(
        "a dynamic program by path",
        &exec(&lib, &dynamic.display().to_string(), &system),
        "ran",
    );
    assert_ran(
        "a dynamic program on PATH",
        &exec(&lib, "hello-dynamic", &path),
        "ran",
    );
    assert_ran(
        "a #! script on PATH",
        &exec(&lib, "hello-script", &path),
        "ran",
    );
}
