//! `utop --prometheus ADDR:PORT`: a sidecar that serves a running stack's
//! telemetry as Prometheus metrics, for stacks started without
//! `--metrics` (or by a program that does not take the flag).
//!
//! A thread reads the stack's telemetry socket and keeps the latest line;
//! each scrape converts it with the converter the runtime's endpoint uses
//! (`ustack_telemetry_format::metrics::convert`), so the sidecar serves
//! the same names as the stack's own endpoint. When the stack is not there (not
//! started yet, exited, restarting) the socket is tried again every half
//! second, and a scrape answers 200 with `ustack_up 0` and nothing else:
//! Prometheus' own `up` stays 1 (the sidecar answers), so an alert on
//! `ustack_up == 0` tells a stopped stack from a stopped sidecar.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ustack_telemetry_format::metrics::{self, Endpoint, Family, convert};

/// How often the sidecar tries the socket again while the stack is away.
pub const RECONNECT_INTERVAL: Duration = Duration::from_millis(500);

/// The latest line of the stack, when it has one.
type Latest = Arc<Mutex<Option<(Instant, serde_json::Value)>>>;

/// A running sidecar: the endpoint and the socket reader.
#[derive(Debug)]
pub struct Sidecar {
    endpoint: Endpoint,
}

impl Sidecar {
    /// Serve `addr` for the stack publishing at `socket` (which need not
    /// exist yet).
    pub fn start(socket: PathBuf, addr: SocketAddr) -> anyhow::Result<Sidecar> {
        let latest: Latest = Arc::default();
        let fallback = socket
            .file_stem()
            .map_or_else(|| "ustack".into(), |s| s.to_string_lossy().into_owned());
        let scrape_latest = latest.clone();
        let endpoint = Endpoint::bind(addr, Arc::new(move || families(&scrape_latest, &fallback)))?;
        std::thread::Builder::new()
            .name("utop-telemetry".into())
            .spawn(move || follow(&socket, &latest))?;
        Ok(Sidecar { endpoint })
    }

    /// The address the endpoint listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.endpoint.local_addr()
    }
}

fn lock(latest: &Latest) -> std::sync::MutexGuard<'_, Option<(Instant, serde_json::Value)>> {
    latest
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What a scrape serves: `ustack_up` and the latest line's families.
fn families(latest: &Latest, fallback: &str) -> Vec<Family> {
    let line = lock(latest).clone();
    let mut out = Vec::new();
    let stack = match line {
        Some((at, line)) => {
            out.push(convert::up(true));
            let opts = metrics::Options {
                age: Some(at.elapsed()),
                ..metrics::Options::default()
            };
            out.extend(convert::line_families(&line, &opts));
            convert::stack_label(&line)
        }
        None => {
            out.push(convert::up(false));
            fallback.to_owned()
        }
    };
    convert::add_label(&mut out, "stack", &stack);
    out
}

/// Read lines from the socket for ever, attaching again when the stack
/// goes away; the latest line is forgotten while it is away.
fn follow(socket: &Path, latest: &Latest) {
    loop {
        if let Ok(stream) = UnixStream::connect(socket) {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<serde_json::Value>(&line) {
                    Ok(v) if v.is_object() => *lock(latest) = Some((Instant::now(), v)),
                    _ => {} // not telemetry: keep the last good line
                }
            }
            *lock(latest) = None;
        }
        std::thread::sleep(RECONNECT_INTERVAL);
    }
}
