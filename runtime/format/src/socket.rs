//! Where telemetry sockets live: `--telemetry NAME` is `NAME.sock` in
//! [`default_dir`], where `utop` finds it; a path with a `/` is used as
//! given.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// The directory stacks publish in when given a bare name, and where `utop`
/// looks for them: `$XDG_RUNTIME_DIR/ustack`, else `/tmp/ustack-$UID`.
pub fn default_dir() -> PathBuf {
    if let Some(run) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        let run = PathBuf::from(run);
        if run.is_dir() {
            return run.join("ustack");
        }
    }
    // The owner of /proc/self is our uid (std has no getuid).
    let uid = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
    PathBuf::from(format!("/tmp/ustack-{uid}"))
}

/// Where `--telemetry ARG` means: a value with a `/` is a path as given; a
/// bare name is `NAME.sock` in [`default_dir`], where `utop` finds it.
pub fn resolve(arg: &Path) -> PathBuf {
    if arg.as_os_str().as_encoded_bytes().contains(&b'/') {
        return arg.to_owned();
    }
    let mut name = arg.as_os_str().to_owned();
    if arg.extension().is_none_or(|e| e != "sock") {
        name.push(".sock");
    }
    default_dir().join(name)
}

/// Live stack sockets in `dir` (those that accept a connection), sorted.
/// Stale sockets of dead stacks are skipped.
pub fn discover(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let is_socket = entry.file_type().is_ok_and(|t| t.is_socket());
        if is_socket && UnixStream::connect(entry.path()).is_ok() {
            found.push(entry.path());
        }
    }
    found.sort();
    Ok(found)
}
