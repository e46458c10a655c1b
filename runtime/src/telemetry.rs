//! Telemetry: a stack's [`Snapshot`]s published as JSON lines on a Unix
//! socket, the way DPDK telemetry does, without slowing the poll loop.
//!
//! The loop calls [`Publisher::publish`] from its stats callback. That only
//! clones the snapshot into a bounded channel with `try_send`; when the
//! channel is full the snapshot is skipped (and counted). A publisher thread
//! serializes each snapshot once and writes it to every client through a
//! non-blocking socket; a client that falls more than [`MAX_BACKLOG`] bytes
//! behind, or whose socket fails, is dropped. Nothing the loop does waits on
//! a client.
//!
//! Each line is one JSON object: `name`, `version` (the runtime's), `pid`,
//! `seq`, `publisher` (clients, skipped snapshots, dropped clients) and the
//! fields of [`Snapshot`]
//! (`at_ns`, `stack`, `port`, `pools`, `connections`, `connections_total`).
//! A client that connects gets the latest line at once, then every new one.
//!
//! The socket is created with mode 0600 (bound under a temporary name,
//! chmod'ed, then renamed into place), a stale socket left by a dead stack is
//! replaced, and the file is removed when the publisher is dropped.

use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam::channel::{self, Receiver, RecvTimeoutError, Sender, TrySendError};
use serde::Serialize;

use ustack::node::Snapshot;

/// Most TCP connections listed in one snapshot (`connections_total` counts all).
pub use ustack::node::MAX_CONNECTIONS;
/// Bytes a client may fall behind before it is dropped.
pub const MAX_BACKLOG: usize = 1 << 20;
/// Most socket clients at once; more are refused.
pub const MAX_CLIENTS: usize = 32;
/// Snapshots waiting for the publisher thread; more are skipped.
const QUEUE: usize = 8;
/// How often the publisher thread looks for new clients when idle.
const ACCEPT_INTERVAL: Duration = Duration::from_millis(50);

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The socket's directory does not exist (it is not created).
    #[error("telemetry socket {}: directory {} does not exist", .path.display(), .dir.display())]
    NoDir {
        /// The socket path asked for.
        path: PathBuf,
        /// Its missing parent directory.
        dir: PathBuf,
    },
    /// Something other than a socket is at the path; it is not touched.
    #[error("telemetry socket {}: exists and is not a socket (left alone)", .0.display())]
    NotSocket(PathBuf),
    /// A live stack answers on the socket already.
    #[error("telemetry socket {}: a running stack already publishes there", .0.display())]
    InUse(PathBuf),
    /// A file-system or socket operation failed.
    #[error("telemetry socket {}: {what}: {err}", .path.display())]
    Io {
        /// The socket path.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        #[source]
        err: io::Error,
    },
}

fn io_err(path: &Path, what: &'static str) -> impl FnOnce(io::Error) -> TelemetryError + use<> {
    let path = path.to_owned();
    move |err| TelemetryError::Io { path, what, err }
}

pub use ustack_telemetry_format::VERSION;
pub use ustack_telemetry_format::socket::{default_dir, discover, resolve};

/// [`resolve`], creating the default directory (mode 0700) for a bare name.
pub fn socket_path(arg: &Path) -> Result<PathBuf, TelemetryError> {
    let path = resolve(arg);
    if path != arg {
        let dir = default_dir();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io_err(&dir, "cannot create the telemetry directory"))?;
    }
    Ok(path)
}

/// Reads a publisher's counters from another thread (the metrics endpoint).
#[derive(Debug, Clone)]
pub struct PublisherHandle {
    skipped: Arc<AtomicU64>,
    live: Arc<LiveStats>,
}

impl PublisherHandle {
    /// The counters now.
    pub fn stats(&self) -> PublisherStats {
        PublisherStats {
            clients: self.live.clients.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            dropped_clients: self.live.dropped_clients.load(Ordering::Relaxed),
        }
    }
}

/// The publisher thread's counters, as it last left them.
#[derive(Debug, Default)]
struct LiveStats {
    clients: AtomicU64,
    dropped_clients: AtomicU64,
}

/// Counters of the publisher itself, sent in every line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PublisherStats {
    /// Socket clients attached now.
    pub clients: u64,
    /// Snapshots the loop skipped because the publisher thread was behind.
    pub skipped: u64,
    /// Clients dropped for being slow or gone.
    pub dropped_clients: u64,
}

#[derive(Serialize)]
struct Line<'a> {
    name: &'a str,
    version: &'static str,
    pid: u32,
    seq: u64,
    publisher: PublisherStats,
    /// The program's own counters, when it gave some.
    #[serde(skip_serializing_if = "Option::is_none")]
    app: Option<std::collections::BTreeMap<&'static str, u64>>,
    #[serde(flatten)]
    snapshot: &'a serde_json::Value,
}

/// Reads a program's own counters (name, value) for telemetry; called on
/// the publisher's thread, never the loop's.
pub type AppCounters = fn() -> Vec<(&'static str, u64)>;

/// A process holding sockets of a stack that several processes share
/// (`ustack exec`'s forked children and joined programs).
#[derive(Debug, Clone, Serialize)]
pub struct Holder {
    /// Its process id.
    pub pid: u32,
    /// `owner` (it runs the stack) or `client`.
    pub role: &'static str,
    /// How many sockets it holds.
    pub sockets: u64,
    /// Its TCP connections (local, remote): each connection's `holders`
    /// in telemetry lists the processes holding it.
    #[serde(skip)]
    pub connections: Vec<(std::net::SocketAddr, std::net::SocketAddr)>,
}

/// Reads which processes hold the stack's sockets; empty while one
/// process has the stack to itself. Called on the publisher's (or the
/// metrics endpoint's) thread, never the loop's.
pub type HoldersSource = fn() -> Vec<Holder>;

static HOLDERS: std::sync::OnceLock<HoldersSource> = std::sync::OnceLock::new();

/// Say where the processes holding this process's stack are read from
/// (once; the LD_PRELOAD layer does): telemetry lines gain `processes`
/// (pid, role, sockets) and each connection `holders` (pids), the
/// metrics `ustack_process_sockets`.
pub fn set_holders_source(read: HoldersSource) {
    let _ = HOLDERS.set(read);
}

/// Add the holders to a telemetry line's value (see [`set_holders_source`]).
pub(crate) fn add_holders(line: &mut serde_json::Value) {
    let Some(read) = HOLDERS.get() else { return };
    let holders = read();
    if holders.is_empty() {
        return;
    }
    let Some(obj) = line.as_object_mut() else {
        return;
    };
    // Each connection's holders, by its two addresses as telemetry
    // writes them: one map, not a search per connection.
    let mut by_conn: std::collections::HashMap<(String, String), Vec<u32>> =
        std::collections::HashMap::new();
    for h in &holders {
        for (l, r) in &h.connections {
            by_conn
                .entry((l.to_string(), r.to_string()))
                .or_default()
                .push(h.pid);
        }
    }
    if let Some(conns) = obj.get_mut("connections").and_then(|c| c.as_array_mut()) {
        for c in conns {
            let key = (
                c.get("local")
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_string(),
                c.get("remote")
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_string(),
            );
            if let (Some(pids), Some(o)) = (by_conn.get(&key), c.as_object_mut()) {
                o.insert("holders".into(), pids.clone().into());
            }
        }
    }
    if let Ok(v) = serde_json::to_value(&holders) {
        obj.insert("processes".into(), v);
    }
}

/// Hands snapshots from the poll loop to the publisher thread.
#[derive(Debug)]
pub struct Publisher {
    tx: Option<Sender<Snapshot>>,
    subscribe: Sender<Sender<Arc<str>>>,
    skipped: Arc<AtomicU64>,
    live: Arc<LiveStats>,
    thread: Option<JoinHandle<Option<Worker>>>,
    /// The thread's state while it is paused ([`Publisher::pause`]).
    parked: Option<Worker>,
    /// Asks the thread to stop and hand its state back.
    pause: Arc<AtomicBool>,
    /// Shared with the thread: the program's counters, once set.
    app: Arc<std::sync::OnceLock<AppCounters>>,
    path: Option<PathBuf>,
}

impl Publisher {
    /// Start publishing snapshots of the stack called `name`, on the Unix
    /// socket `socket` when given (see [`socket_path`]), and to in-process
    /// subscribers ([`Publisher::subscribe`]).
    pub fn start(name: &str, socket: Option<&Path>) -> Result<Publisher, TelemetryError> {
        Self::start_gated(name, socket, None)
    }

    fn start_gated(
        name: &str,
        socket: Option<&Path>,
        gate: Option<Arc<std::sync::Mutex<()>>>,
    ) -> Result<Publisher, TelemetryError> {
        let listener = socket.map(bind).transpose()?;
        let (tx, rx) = channel::bounded(QUEUE);
        let (subscribe, subs) = channel::unbounded();
        let skipped = Arc::new(AtomicU64::new(0));
        let worker = Worker {
            name: name.to_owned(),
            pid: std::process::id(),
            seq: 0,
            listener,
            clients: Vec::new(),
            subscribers: Vec::new(),
            last: None,
            dropped_clients: 0,
            skipped: skipped.clone(),
            shards: Vec::new(),
            gate,
            rx,
            subs,
            pause: Arc::new(AtomicBool::new(false)),
            app: Arc::default(),
            live: Arc::default(),
        };
        let pause = worker.pause.clone();
        let live = worker.live.clone();
        let app = worker.app.clone();
        let thread = worker
            .spawn()
            .map_err(io_err(socket.unwrap_or(Path::new("-")), "cannot start"))?;
        Ok(Publisher {
            tx: Some(tx),
            subscribe,
            skipped,
            live,
            thread: Some(thread),
            parked: None,
            pause,
            app,
            path: socket.map(Path::to_owned),
        })
    }

    /// Add the program's own counters to every line, under `app` (once:
    /// a second call is ignored).
    pub fn app_counters(&mut self, read: AppCounters) {
        let _ = self.app.set(read);
    }

    /// Stop the publisher's thread without ending it: its socket, clients
    /// and queue stay as they are until [`resume`](Self::resume). Before
    /// `fork`, so that the process that keeps the stack also keeps
    /// publishing (a thread is not copied into a child).
    pub fn pause(&mut self) {
        let Some(t) = self.thread.take() else { return };
        self.pause.store(true, Ordering::Release);
        self.parked = t.join().ok().flatten();
        self.pause.store(false, Ordering::Release);
    }

    /// Run a paused publisher on, on a new thread of this process (whose
    /// id the lines carry from now on).
    pub fn resume(&mut self) -> Result<(), TelemetryError> {
        let Some(mut w) = self.parked.take() else {
            return Ok(());
        };
        w.pid = std::process::id();
        let path = self.path.clone().unwrap_or_else(|| "-".into());
        self.thread = Some(w.spawn().map_err(io_err(&path, "cannot start"))?);
        Ok(())
    }

    /// The socket's path, if it has one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Hand a snapshot to the publisher thread. Never blocks: when the thread
    /// is behind, the snapshot is skipped (and counted).
    pub fn publish(&self, s: &Snapshot) {
        let Some(tx) = &self.tx else { return };
        if tx.is_full() {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if let Err(TrySendError::Full(_)) = tx.try_send(s.clone()) {
            self.skipped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A reader of this publisher's counters for another thread.
    pub fn handle(&self) -> PublisherHandle {
        PublisherHandle {
            skipped: self.skipped.clone(),
            live: self.live.clone(),
        }
    }

    /// Snapshots skipped so far.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// An in-process feed of the same JSON lines (without the newline). It
    /// holds a few lines; a subscriber that does not keep up misses some. The
    /// channel disconnects when the publisher is dropped.
    pub fn subscribe(&self) -> Receiver<Arc<str>> {
        let (tx, rx) = channel::bounded(4);
        let _ = self.subscribe.send(tx);
        rx
    }
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("name", &self.name)
            .field("pid", &self.pid)
            .field("seq", &self.seq)
            .field("clients", &self.clients.len())
            .finish_non_exhaustive()
    }
}

impl Drop for Publisher {
    /// Publishes what is queued, closes every client and removes the socket.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(mut w) = self.parked.take() {
            w.flush();
        }
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Bind `path` with mode 0600, replacing a stale socket.
fn bind(path: &Path) -> Result<UnixListener, TelemetryError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(TelemetryError::NoDir {
            path: path.to_owned(),
            dir: dir.to_owned(),
        });
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => {
            return Err(TelemetryError::NotSocket(path.to_owned()));
        }
        Ok(_) => {
            if UnixStream::connect(path).is_ok() {
                return Err(TelemetryError::InUse(path.to_owned()));
            }
            std::fs::remove_file(path).map_err(io_err(path, "cannot remove the stale socket"))?;
        }
        Err(_) => {}
    }
    // Bind under a temporary name, restrict it, then move it into place, so
    // the socket is never reachable with looser permissions.
    let tmp = dir.join(format!(".ustack-{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(io_err(path, "cannot create the socket"))?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&tmp, path))
        .and_then(|()| listener.set_nonblocking(true));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_err(path, "cannot create the socket")(e));
    }
    Ok(listener)
}

/// One socket client and the bytes it has yet to receive.
struct Client {
    stream: UnixStream,
    pending: Vec<u8>,
}

impl Client {
    /// Queue `line` and write what the socket takes; false when the client
    /// is gone or too far behind.
    fn push(&mut self, line: &[u8]) -> bool {
        if self.pending.len() + line.len() > MAX_BACKLOG {
            return false;
        }
        self.pending.extend_from_slice(line);
        self.flush()
    }

    fn flush(&mut self) -> bool {
        let mut done = 0;
        let alive = loop {
            if done == self.pending.len() {
                break true;
            }
            match self.stream.write(&self.pending[done..]) {
                Ok(0) => break false,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break false,
            }
        };
        self.pending.drain(..done);
        alive
    }
}

struct Worker {
    name: String,
    pid: u32,
    seq: u64,
    listener: Option<UnixListener>,
    clients: Vec<Client>,
    subscribers: Vec<Sender<Arc<str>>>,
    /// The latest line, for clients that connect between snapshots.
    last: Option<Arc<str>>,
    dropped_clients: u64,
    skipped: Arc<AtomicU64>,
    /// The latest snapshot of each shard, on a host with several queues.
    shards: Vec<Option<serde_json::Value>>,
    /// Held by a test to stall the thread (as a slow disk or a stuck
    /// client would), so it can check that `publish` never waits.
    gate: Option<Arc<std::sync::Mutex<()>>>,
    /// Snapshots from the loop.
    rx: Receiver<Snapshot>,
    /// New in-process subscribers.
    subs: Receiver<Sender<Arc<str>>>,
    /// Set by [`Publisher::pause`]: return the state instead of running on.
    pause: Arc<AtomicBool>,
    /// The program's own counters, read for each line.
    app: Arc<std::sync::OnceLock<AppCounters>>,
    /// Clients and dropped clients, for [`PublisherHandle`].
    live: Arc<LiveStats>,
}

impl Worker {
    /// Run on a thread of its own.
    fn spawn(self) -> std::io::Result<JoinHandle<Option<Worker>>> {
        std::thread::Builder::new()
            .name("ustack-telemetry".into())
            .spawn(move || self.run())
    }

    /// Publish until the loop's side hangs up (None) or a pause is asked
    /// for (the state, to run on later).
    fn run(mut self) -> Option<Worker> {
        loop {
            if self.pause.load(Ordering::Acquire) {
                return Some(self);
            }
            let next = self.rx.recv_timeout(ACCEPT_INTERVAL);
            self.subscribers.extend(self.subs.try_iter());
            self.accept();
            if let Some(g) = &self.gate {
                drop(g.lock());
            }
            match next {
                Ok(s) => self.broadcast(&s),
                Err(RecvTimeoutError::Timeout) => self.flush(),
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        // Give slow clients what is still queued, without waiting on them.
        self.flush();
        None
    }

    fn accept(&mut self) {
        let Some(listener) = &self.listener else {
            return;
        };
        while let Ok((stream, _)) = listener.accept() {
            if self.clients.len() >= MAX_CLIENTS || stream.set_nonblocking(true).is_err() {
                self.dropped_clients += 1;
                continue;
            }
            let mut c = Client {
                stream,
                pending: Vec::new(),
            };
            let alive = match &self.last {
                Some(line) => c.push(line.as_bytes()) && c.push(b"\n"),
                None => true,
            };
            if alive {
                self.clients.push(c);
            } else {
                self.dropped_clients += 1;
            }
        }
        self.count_clients();
    }

    /// The value to publish for `s`: the snapshot itself, or for a shard
    /// of a multi-queue host the totals over the latest snapshot of every
    /// shard, with each shard's own figures under `shards`.
    fn value(&mut self, s: &Snapshot) -> Option<serde_json::Value> {
        let value = serde_json::to_value(s).ok()?;
        let Some(shard) = s.shard.filter(|sh| sh.count > 1) else {
            return Some(value);
        };
        self.shards.resize(shard.count, None);
        *self.shards.get_mut(shard.index)? = Some(value);
        Some(merge_shards(&self.shards))
    }

    fn broadcast(&mut self, s: &Snapshot) {
        let Some(mut snapshot) = self.value(s) else {
            return;
        };
        add_holders(&mut snapshot);
        self.seq += 1;
        let line = Line {
            name: &self.name,
            version: VERSION,
            pid: self.pid,
            seq: self.seq,
            publisher: PublisherStats {
                clients: self.clients.len() as u64,
                skipped: self.skipped.load(Ordering::Relaxed),
                dropped_clients: self.dropped_clients,
            },
            app: self.app.get().map(|read| read().into_iter().collect()),
            snapshot: &snapshot,
        };
        let Ok(mut bytes) = serde_json::to_vec(&line) else {
            return;
        };
        let text: Arc<str> = String::from_utf8_lossy(&bytes).into();
        bytes.push(b'\n');
        let before = self.clients.len();
        self.clients.retain_mut(|c| c.push(&bytes));
        self.dropped_clients += (before - self.clients.len()) as u64;
        self.subscribers.retain(|tx| {
            !matches!(
                tx.try_send(text.clone()),
                Err(TrySendError::Disconnected(_))
            )
        });
        self.last = Some(text);
        self.count_clients();
    }

    fn count_clients(&self) {
        let live = &self.live;
        live.clients
            .store(self.clients.len() as u64, Ordering::Relaxed);
        live.dropped_clients
            .store(self.dropped_clients, Ordering::Relaxed);
    }

    fn flush(&mut self) {
        let before = self.clients.len();
        self.clients.retain_mut(Client::flush);
        self.dropped_clients += (before - self.clients.len()) as u64;
        self.count_clients();
    }
}

/// Totals over shard snapshots (JSON objects of [`Snapshot`]): counters are
/// summed, `at_ns` is the latest, pools and connections are listed together
/// (connections up to [`MAX_CONNECTIONS`]); `shards` keeps each shard's
/// `shard`, `stack`, `port` and `connections_total`.
pub(crate) fn merge_shards(shards: &[Option<serde_json::Value>]) -> serde_json::Value {
    use serde_json::{Map, Value};
    let mut total = Map::new();
    let mut per_shard = Vec::new();
    let (mut pools, mut conns) = (Vec::new(), Vec::new());
    let mut at_ns = 0u64;
    for snap in shards.iter().flatten() {
        let Value::Object(obj) = snap else { continue };
        at_ns = at_ns.max(obj.get("at_ns").and_then(Value::as_u64).unwrap_or(0));
        let mut one = Map::new();
        for (k, v) in obj {
            match k.as_str() {
                "at_ns" => {}
                "pools" => pools.extend(v.as_array().into_iter().flatten().cloned()),
                "connections" => conns.extend(v.as_array().into_iter().flatten().cloned()),
                "shard" => {
                    one.insert(k.clone(), v.clone());
                }
                _ => {
                    one.insert(k.clone(), v.clone());
                    match total.get_mut(k) {
                        Some(acc) => add_json(acc, v),
                        None => {
                            total.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
        }
        per_shard.push(Value::Object(one));
    }
    conns.truncate(MAX_CONNECTIONS);
    total.insert("at_ns".into(), at_ns.into());
    total.insert("pools".into(), Value::Array(pools));
    total.insert("connections".into(), Value::Array(conns));
    total.insert("shards".into(), Value::Array(per_shard));
    Value::Object(total)
}

/// `acc += v` over matching JSON trees: integers add, objects add key by
/// key, anything else keeps `acc`.
fn add_json(acc: &mut serde_json::Value, v: &serde_json::Value) {
    use serde_json::Value;
    match (acc, v) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, bv) in b {
                match a.get_mut(k) {
                    Some(av) => add_json(av, bv),
                    None => {
                        a.insert(k.clone(), bv.clone());
                    }
                }
            }
        }
        (acc @ Value::Number(_), Value::Number(b)) => {
            if let (Some(x), Some(y)) = (acc.as_u64(), b.as_u64()) {
                *acc = x.saturating_add(y).into();
            } else if let (Some(x), Some(y)) = (acc.as_f64(), b.as_f64()) {
                *acc = (x + y).into();
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use std::io::{BufRead, BufReader};
    use ustack::phy::pool::PoolStats;

    fn snapshot(at_ns: u64) -> Snapshot {
        Snapshot {
            at_ns,
            stack: Default::default(),
            port: Default::default(),
            pools: vec![PoolStats {
                name: "rx".into(),
                capacity: 8,
                in_use: 1,
                alloc_failures: 0,
                buf_size: 2048,
            }],
            connections: Vec::new(),
            connections_total: 0,
            offloads: Default::default(),
            shard: None,
            rc_qps: Vec::new(),
        }
    }

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ustack-tele-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn shard_snapshots_publish_as_totals_and_per_shard() {
        use ustack::node::ShardSnapshot;
        use ustack::shard::ShardStats;
        let mut a = snapshot(5);
        a.port.rx_packets = 3;
        a.shard = Some(ShardSnapshot {
            index: 0,
            count: 2,
            stats: ShardStats::default(),
        });
        let mut b = snapshot(7);
        b.port.rx_packets = 4;
        b.connections_total = 2;
        b.shard = Some(ShardSnapshot {
            index: 1,
            count: 2,
            stats: ShardStats {
                mail_in: 2,
                ..ShardStats::default()
            },
        });
        let values = [a, b].map(|s| Some(serde_json::to_value(&s).unwrap()));
        let m = merge_shards(&values);
        assert_eq!(m["port"]["rx_packets"], 7);
        assert_eq!(m["connections_total"], 2);
        assert_eq!(m["at_ns"], 7);
        assert_eq!(m["pools"].as_array().unwrap().len(), 2);
        assert_eq!(m["shards"][0]["port"]["rx_packets"], 3);
        assert_eq!(m["shards"][1]["shard"]["index"], 1);
        assert_eq!(m["shards"][1]["shard"]["mail_in"], 2);
        // One shard not heard from yet: the totals are the others'.
        let m = merge_shards(&[None, values[1].clone()]);
        assert_eq!(m["port"]["rx_packets"], 4);
    }
    #[test]
    fn a_paused_publisher_keeps_its_clients_and_resumes_with_app_counters() {
        let dir = tmpdir("pause");
        let path = dir.join("p.sock");
        let mut p = Publisher::start("paused", Some(&path)).unwrap();
        let mut r = BufReader::new(UnixStream::connect(&path).unwrap());
        std::thread::sleep(ACCEPT_INTERVAL * 3);
        p.publish(&snapshot(1));
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        p.pause();
        assert!(p.thread.is_none() && p.parked.is_some());
        // While paused nothing is published (the thread is gone) ...
        p.publish(&snapshot(2));
        p.app_counters(|| vec![("refused", 3)]);
        p.resume().unwrap();
        // ... and what was queued goes out once it runs again, to the same
        // client, with the program's counters.
        line.clear();
        r.read_line(&mut line).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["seq"], 2);
        assert_eq!(v["at_ns"], 2);
        assert_eq!(v["app"]["refused"], 3);
        // A paused publisher that is dropped still cleans up.
        p.pause();
        drop(p);
        assert!(!path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn publishes_json_lines_with_mode_0600_and_cleans_up() {
        let dir = tmpdir("lines");
        let path = dir.join("a.sock");
        let p = Publisher::start("test", Some(&path)).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let local = p.subscribe();
        let mut r = BufReader::new(UnixStream::connect(&path).unwrap());
        // Let the thread accept the client, then publish.
        std::thread::sleep(ACCEPT_INTERVAL * 3);
        p.publish(&snapshot(7));
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["name"], "test");
        assert_eq!(v["seq"], 1);
        assert_eq!(v["at_ns"], 7);
        assert_eq!(v["pools"][0]["name"], "rx");
        assert_eq!(v["pid"], std::process::id());
        let l = local.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(&*l, line.trim_end());
        // A late client gets the latest line at once.
        let mut late = BufReader::new(UnixStream::connect(&path).unwrap());
        let mut again = String::new();
        late.read_line(&mut again).unwrap();
        assert_eq!(again, line);
        drop(p);
        assert!(!path.exists(), "socket removed on drop");
        // Clients see the end of the stream.
        let mut rest = String::new();
        assert_eq!(r.read_line(&mut rest).unwrap(), 0);
        assert!(local.recv().is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn replaces_a_stale_socket_and_refuses_a_live_one() {
        let dir = tmpdir("stale");
        let path = dir.join("s.sock");
        drop(UnixListener::bind(&path).unwrap()); // stale: nobody listens
        let p = Publisher::start("one", Some(&path)).unwrap();
        let e = Publisher::start("two", Some(&path)).unwrap_err();
        assert!(matches!(e, TelemetryError::InUse(_)), "{e}");
        drop(p);
        std::fs::write(&path, b"x").unwrap();
        let e = Publisher::start("three", Some(&path)).unwrap_err();
        assert!(matches!(e, TelemetryError::NotSocket(_)), "{e}");
        assert!(path.exists(), "a regular file is never removed");
        let e = Publisher::start("four", Some(&dir.join("no/such/dir.sock"))).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn publish_never_waits_for_a_stalled_publisher_thread() {
        // The publisher thread is stuck (the test holds its gate) while
        // the loop publishes far more than the queue holds: every call must
        // return, the overflow is skipped and counted, nothing piles up.
        let gate = Arc::new(std::sync::Mutex::new(()));
        let stalled = gate.lock().unwrap();
        let p = Arc::new(Publisher::start_gated("stalled", None, Some(gate.clone())).unwrap());
        const CALLS: u64 = 1000;
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let loop_side = {
            let p = p.clone();
            std::thread::spawn(move || {
                let s = snapshot(1);
                for _ in 0..CALLS {
                    p.publish(&s);
                }
                done_tx.send(()).unwrap();
            })
        };
        // A publish that waited would never finish while the gate is held.
        let finished = done_rx.recv_timeout(Duration::from_secs(30));
        // (Failing here releases the gate as `stalled` drops, so the
        // blocked thread finishes and the test ends instead of hanging.)
        assert!(finished.is_ok(), "publish waited for the stalled thread");
        loop_side.join().unwrap();
        // The queue holds QUEUE snapshots (the thread may have taken one
        // before it stalled); all the others were skipped, not queued.
        let skipped = p.skipped();
        assert!(
            (CALLS - QUEUE as u64 - 1..=CALLS - QUEUE as u64).contains(&skipped),
            "skipped {skipped} of {CALLS}"
        );
        drop(stalled);
        drop(p);
    }

    #[test]
    fn a_client_that_never_reads_is_dropped() {
        let dir = tmpdir("slow");
        let path = dir.join("slow.sock");
        let p = Publisher::start("slow", Some(&path)).unwrap();
        let _sleeper = UnixStream::connect(&path).unwrap();
        std::thread::sleep(ACCEPT_INTERVAL * 3);
        let mut big = snapshot(1);
        big.pools = (0..2000)
            .map(|i| PoolStats {
                name: format!("pool-{i}"),
                capacity: i,
                in_use: 0,
                alloc_failures: 0,
                buf_size: 2048,
            })
            .collect();
        // Each line is ~150 KB and the client reads nothing: past
        // MAX_BACKLOG behind, the publisher thread drops it.
        for i in 0..200 {
            big.at_ns = i;
            p.publish(&big);
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut r = BufReader::new(UnixStream::connect(&path).unwrap());
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert!(
            v["publisher"]["dropped_clients"].as_u64().unwrap() >= 1,
            "{}",
            v["publisher"]
        );
        drop(p);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bare_names_go_in_the_default_dir() {
        assert_eq!(resolve(Path::new("demo")), default_dir().join("demo.sock"));
        assert_eq!(resolve(Path::new("a.sock")), default_dir().join("a.sock"));
        assert_eq!(resolve(Path::new("./x.sock")), PathBuf::from("./x.sock"));
    }
}
