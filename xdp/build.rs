//! Compiles the steering program (`bpf/steer.c`) to BPF with clang; the
//! object is embedded in the crate and loaded at run time.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "bpf/steer.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=CLANG");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("steer.o");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    // The kernel's asm/ headers sit in the multiarch folder on Debian.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg(format!("-I{multiarch}"))
        .args(["-c", src, "-o"])
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!(
            "{clang} could not compile {src} ({s}): the xdp feature needs clang and libbpf-dev"
        ),
        Err(e) => panic!(
            "the xdp feature compiles its XDP program with clang, which could not run ({e}): \
             install clang and libbpf-dev (Debian: apt install clang libbpf-dev) or set CLANG"
        ),
    }
}
