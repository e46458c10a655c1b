//! Where snapshots come from: a stack's Unix socket, or an in-process
//! publisher's local feed.

use std::io::{BufRead, BufReader, ErrorKind};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use crossbeam::channel::{self, Receiver, Sender};

use crate::model::Frame;

/// How often a detached utop tries the socket again.
const RECONNECT_INTERVAL: Duration = Duration::from_millis(500);

/// What a feed reports.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// A new snapshot.
    Frame(Box<Frame>),
    /// Attached (again) to the stack; snapshots follow.
    Attached,
    /// The stack went away; the text says which.
    Gone(String),
    /// A line that is not ustack telemetry.
    Garbled(String),
}

impl Update {
    /// One telemetry line as an update.
    pub fn from_line(line: &str) -> Update {
        match Frame::parse(line) {
            Ok(f) => Update::Frame(Box::new(f)),
            Err(e) => Update::Garbled(format!("not ustack telemetry: {e}")),
        }
    }
}

/// Connect to the telemetry socket at `path`, with a clear error for every
/// way that fails.
pub fn attach(path: &Path) -> Result<UnixStream> {
    let p = path.display();
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => {
            bail!("no stack at {p}: no such socket")
        }
        Err(e) => bail!("cannot attach to {p}: {e}"),
        Ok(m) if !m.file_type().is_socket() => bail!("cannot attach to {p}: not a socket"),
        Ok(_) => {}
    }
    match UnixStream::connect(path) {
        Ok(s) => Ok(s),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
            bail!("no stack at {p}: nobody listens (a stale socket)")
        }
        Err(e) if e.kind() == ErrorKind::PermissionDenied => {
            bail!("cannot attach to {p}: permission denied")
        }
        Err(e) => bail!("cannot attach to {p}: {e}"),
    }
}

/// Read snapshots from `stream` on a thread. When the stack goes away the
/// feed says so and reattaches once a stack listens at `path` again.
pub fn follow(path: PathBuf, stream: UnixStream) -> Receiver<Update> {
    let (tx, rx) = channel::bounded(16);
    std::thread::spawn(move || {
        let mut stream = stream;
        loop {
            if !pump(BufReader::new(stream), &tx) {
                return;
            }
            let gone = format!("stack at {} exited", path.display());
            if tx.send(Update::Gone(gone)).is_err() {
                return;
            }
            stream = loop {
                std::thread::sleep(RECONNECT_INTERVAL);
                if let Ok(s) = UnixStream::connect(&path) {
                    break s;
                }
            };
            if tx.send(Update::Attached).is_err() {
                return;
            }
        }
    });
    rx
}

/// Forward lines until the stream ends; false when nobody listens any more.
fn pump(reader: impl BufRead, tx: &Sender<Update>) -> bool {
    for line in reader.lines() {
        let Ok(line) = line else { break };
        if tx.send(Update::from_line(&line)).is_err() {
            return false;
        }
    }
    true
}

/// Updates from an in-process publisher's local feed
/// (`ustack_runtime::telemetry::Publisher::subscribe`). Ends with `Gone` when the
/// publisher is dropped.
pub fn from_lines(lines: Receiver<Arc<str>>) -> Receiver<Update> {
    let (tx, rx) = channel::bounded(16);
    std::thread::spawn(move || {
        for line in lines.iter() {
            if tx.send(Update::from_line(&line)).is_err() {
                return;
            }
        }
        let _ = tx.send(Update::Gone("the stack stopped".into()));
    });
    rx
}

/// Read one frame from an attached socket within `timeout`: `Ok(None)` when
/// the stack closed the connection first.
pub fn read_frame(reader: &mut BufReader<UnixStream>, timeout: Duration) -> Result<Option<Frame>> {
    reader.get_ref().set_read_timeout(Some(timeout))?;
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(0) => Ok(None),
        Ok(_) => {
            Ok(Some(Frame::parse(&line).map_err(|e| {
                anyhow::anyhow!("not ustack telemetry ({e})")
            })?))
        }
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            bail!("no snapshot within {} s", timeout.as_secs_f64())
        }
        Err(e) if e.kind() == ErrorKind::ConnectionReset => Ok(None),
        Err(e) => Err(e.into()),
    }
}
