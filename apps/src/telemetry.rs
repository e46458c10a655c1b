//! `--telemetry PATH` for every app, and the in-process monitor (`--tui`).
//!
//! The loop's stats callback calls [`Telemetry::publish`], which never
//! blocks (see `ustack_runtime::telemetry`).

use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use anyhow::Result;
use ustack::node::Snapshot;
use ustack_runtime::telemetry::{self, Publisher};

use crate::net::NetArgs;

/// A stack's telemetry: a publisher when `--telemetry` or a monitor asks
/// for one, nothing otherwise.
#[derive(Debug, Default)]
pub struct Telemetry {
    publisher: Option<Publisher>,
}

impl Telemetry {
    /// Publish on the socket `--telemetry` names, if any. `app` names the
    /// stack for utop (`uping 10.77.0.2/24`).
    pub fn start(net: &NetArgs, app: &str) -> Result<Telemetry> {
        let ip = net
            .ip()
            .map_or_else(|| "-".to_string(), |ip| ip.to_string());
        Telemetry::open(net.telemetry.as_deref(), &format!("{app} {ip}"), false)
    }

    /// Publish on `socket` (a path, or a bare name in the default
    /// directory), and in-process too when `local` (for a monitor).
    pub fn open(socket: Option<&Path>, name: &str, local: bool) -> Result<Telemetry> {
        if socket.is_none() && !local {
            return Ok(Telemetry::default());
        }
        let path = socket.map(telemetry::socket_path).transpose()?;
        let publisher = Publisher::start(name, path.as_deref())?;
        if let Some(p) = publisher.path() {
            tracing::info!("telemetry on {}", p.display());
        }
        Ok(Telemetry {
            publisher: Some(publisher),
        })
    }

    /// The publisher, when snapshots go somewhere.
    pub fn publisher(&self) -> Option<&Publisher> {
        self.publisher.as_ref()
    }

    /// Whether snapshots go anywhere.
    pub fn enabled(&self) -> bool {
        self.publisher.is_some()
    }

    /// Hand a snapshot to the publisher (never blocks).
    pub fn publish(&self, s: &Snapshot) {
        if let Some(p) = &self.publisher {
            p.publish(s);
        }
    }

    /// Show the monitor on this terminal, fed in-process, on its own thread
    /// (the loop keeps its core). It ends when the stack stops (this
    /// publisher is dropped) or when the user quits, which sets `stop`.
    /// `None` without a publisher.
    pub fn spawn_tui(&self, source: &str, stop: Arc<AtomicBool>) -> Option<JoinHandle<()>> {
        let updates = utop::feed::from_lines(self.publisher.as_ref()?.subscribe());
        let monitor = utop::Monitor::new(source);
        Some(std::thread::spawn(move || {
            match utop::term::run(&updates, monitor, true) {
                Ok(_) => stop.store(true, Ordering::Relaxed),
                Err(e) => tracing::warn!("the monitor stopped: {e}"),
            }
        }))
    }
}

/// Whether a live monitor can be shown (stdout is a terminal). Piped
/// output (CI, tests) keeps the plain lines.
pub fn can_show_tui() -> bool {
    std::io::stdout().is_terminal()
}

/// The socket of a second stack next to `path`: `demo.sock` -> `demo-b.sock`.
pub fn sibling(path: &Path, tag: &str) -> std::path::PathBuf {
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let name = match path.extension() {
        Some(ext) => format!("{stem}-{tag}.{}", ext.to_string_lossy()),
        None => format!("{stem}-{tag}"),
    };
    path.with_file_name(name)
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn siblings_keep_the_suffix() {
        assert_eq!(
            sibling(Path::new("/tmp/x/demo.sock"), "b"),
            Path::new("/tmp/x/demo-b.sock")
        );
        assert_eq!(sibling(Path::new("demo"), "b"), Path::new("demo-b"));
    }
}
