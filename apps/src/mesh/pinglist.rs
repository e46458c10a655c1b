//! The mesh's ping list: its format, where it is read from (a file or an
//! HTTP(S) URL) and the thread that re-reads it.
//!
//! One target per line: `A.B.C.D [label words] [probes=icmp,ud,tcp,udp]
//! [tcp_port=N] [udp_port=N]`. Words of the form `key=value` are options,
//! the other words make the label; `#` starts a comment and blank lines are
//! skipped.

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::time::Duration;

/// How a target is probed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Probe {
    /// ICMP echo.
    Icmp,
    /// RDMA UD ping (RoCEv2) to the target's UD responder.
    Ud,
    /// Echo round trips on a TCP connection (the connect time is measured too).
    Tcp,
    /// Timestamped datagrams to a UDP echo service.
    Udp,
}

impl Probe {
    /// The name used in the ping list and the `probe` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Probe::Icmp => "icmp",
            Probe::Ud => "ud",
            Probe::Tcp => "tcp",
            Probe::Udp => "udp",
        }
    }
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Probe {
    type Err = String;
    fn from_str(s: &str) -> Result<Probe, String> {
        match s {
            "icmp" => Ok(Probe::Icmp),
            "ud" => Ok(Probe::Ud),
            "tcp" => Ok(Probe::Tcp),
            "udp" => Ok(Probe::Udp),
            _ => Err(format!("'{s}' is not a probe (icmp, ud, tcp, udp)")),
        }
    }
}

/// The TCP and UDP echo port (RFC 862), the default for both probes.
pub const ECHO_PORT: u16 = 7;

/// One line of a ping list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The target's address (either family).
    pub addr: IpAddr,
    /// Its label (the `target_name` label of its metrics).
    pub label: Option<String>,
    /// How it is probed (at least one, no repeats).
    pub probes: Vec<Probe>,
    /// The TCP probe's port.
    pub tcp_port: u16,
    /// The UDP probe's port.
    pub udp_port: u16,
}

impl Target {
    /// A target probed with `probe` only, on the default ports.
    pub fn new(addr: impl Into<IpAddr>, label: Option<&str>, probe: Probe) -> Target {
        Target {
            addr: addr.into(),
            label: label.map(str::to_owned),
            probes: vec![probe],
            tcp_port: ECHO_PORT,
            udp_port: ECHO_PORT,
        }
    }
}

/// Why a ping list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PinglistError {
    /// A line is wrong.
    #[error("line {line}: {what}")]
    Line {
        /// The line's number, from 1.
        line: usize,
        /// What is wrong with it.
        what: String,
    },
    /// No line names a target.
    #[error("the ping list has no targets")]
    Empty,
}

/// Parse a ping list whose targets are probed with ICMP unless they say
/// otherwise.
pub fn parse_pinglist(text: &str) -> Result<Vec<Target>, PinglistError> {
    parse_pinglist_with(text, Probe::Icmp)
}

/// Parse a ping list; targets without `probes=` get `default`.
pub fn parse_pinglist_with(text: &str, default: Probe) -> Result<Vec<Target>, PinglistError> {
    let mut targets: Vec<Target> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let bad = |what: String| PinglistError::Line { line: n + 1, what };
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let addr_s = words.next().unwrap_or("");
        let addr: IpAddr = addr_s
            .parse()
            .map_err(|_| bad(format!("'{addr_s}' is not an IPv4 or IPv6 address")))?;
        let mut t = Target::new(addr, None, default);
        let mut label: Vec<&str> = Vec::new();
        for w in words {
            let Some((key, value)) = w.split_once('=') else {
                label.push(w);
                continue;
            };
            let port = || {
                value
                    .parse::<u16>()
                    .ok()
                    .filter(|&p| p != 0)
                    .ok_or_else(|| bad(format!("{key}: '{value}' is not a port (1-65535)")))
            };
            match key {
                "probes" => {
                    let mut probes = Vec::new();
                    for p in value.split(',') {
                        let p: Probe = p.parse().map_err(|e| bad(format!("probes: {e}")))?;
                        if !probes.contains(&p) {
                            probes.push(p);
                        }
                    }
                    t.probes = probes;
                }
                "tcp_port" => t.tcp_port = port()?,
                "udp_port" => t.udp_port = port()?,
                _ => {
                    return Err(bad(format!(
                        "unknown option '{key}' (probes, tcp_port, udp_port)"
                    )));
                }
            }
        }
        if targets.iter().any(|o| o.addr == addr) {
            return Err(bad(format!("{addr} is listed twice")));
        }
        t.label = (!label.is_empty()).then(|| label.join(" "));
        targets.push(t);
    }
    if targets.is_empty() {
        return Err(PinglistError::Empty);
    }
    Ok(targets)
}

/// Where the ping list comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListSource {
    /// A file.
    File(PathBuf),
    /// An `http://` or `https://` URL, fetched over the kernel's network.
    Url(String),
}

/// How long a fetch of a ping list URL may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest ping list accepted.
const MAX_LIST_BYTES: u64 = 16 << 20;

impl ListSource {
    /// A URL when `s` starts with `http://` or `https://`, else a file.
    pub fn parse(s: &str) -> ListSource {
        let lower = s.to_ascii_lowercase();
        if lower.starts_with("http://") || lower.starts_with("https://") {
            ListSource::Url(s.to_owned())
        } else {
            ListSource::File(PathBuf::from(s))
        }
    }

    /// Read the list's text (blocking: never call it in the poll loop).
    pub fn read(&self) -> Result<String, String> {
        match self {
            ListSource::File(p) => std::fs::read_to_string(p)
                .map_err(|e| format!("cannot read the ping list {}: {e}", p.display())),
            ListSource::Url(u) => {
                let agent = ureq::Agent::config_builder()
                    .timeout_global(Some(FETCH_TIMEOUT))
                    .build()
                    .new_agent();
                let mut resp = agent
                    .get(u)
                    .call()
                    .map_err(|e| format!("cannot fetch the ping list {u}: {e}"))?;
                resp.body_mut()
                    .with_config()
                    .limit(MAX_LIST_BYTES)
                    .read_to_string()
                    .map_err(|e| format!("cannot fetch the ping list {u}: {e}"))
            }
        }
    }
}

impl fmt::Display for ListSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListSource::File(p) => write!(f, "{}", p.display()),
            ListSource::Url(u) => f.write_str(u),
        }
    }
}

/// Re-reads a ping list on its own thread.
#[derive(Debug)]
pub struct Reloader {
    /// The list's origin.
    pub source: ListSource,
    /// Targets without `probes=` get this probe.
    pub default_probe: Probe,
    /// Time between reads.
    pub every: Duration,
    /// The text of the list in force (a read with the same text changes nothing).
    pub current: String,
    /// Counts reads and parses that failed.
    pub errors: Arc<AtomicU64>,
    /// Ends the thread.
    pub stop: Arc<AtomicBool>,
}

impl Reloader {
    /// Start the thread: every `every`, read the list; when its text
    /// changed and parses, send the targets on `tx`; when the read or the
    /// parse fails, count an error and keep the old list. The thread ends
    /// when `stop` is set or the receiver is gone.
    pub fn spawn(
        mut self,
        tx: Sender<Vec<Target>>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("mesh-pinglist".into())
            .spawn(move || {
                let tick = Duration::from_millis(20).min(self.every);
                let mut waited = Duration::ZERO;
                while !self.stop.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    waited += tick;
                    if waited < self.every {
                        continue;
                    }
                    waited = Duration::ZERO;
                    if !self.once(&tx) {
                        return;
                    }
                }
            })
    }

    /// One read; false when the receiver is gone.
    pub fn once(&mut self, tx: &Sender<Vec<Target>>) -> bool {
        let text = match self.source.read() {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("{e}; keeping the old list");
                self.errors.fetch_add(1, Ordering::Relaxed);
                return true;
            }
        };
        if text == self.current {
            return true;
        }
        match parse_pinglist_with(&text, self.default_probe) {
            Ok(targets) => {
                self.current = text;
                tx.send(targets).is_ok()
            }
            Err(e) => {
                tracing::warn!("ping list {}: {e}; keeping the old list", self.source);
                self.errors.fetch_add(1, Ordering::Relaxed);
                // Counted once per change, not on every read of the same text.
                self.current = text;
                true
            }
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn plain_lists_still_parse() {
        let t = parse_pinglist("# mesh\n10.0.0.2 rack-a tor1\n\n10.0.0.3   # no label\n").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].label.as_deref(), Some("rack-a tor1"));
        assert_eq!(t[0].probes, vec![Probe::Icmp]);
        assert_eq!((t[0].tcp_port, t[0].udp_port), (7, 7));
        assert_eq!(t[1].label, None);
        assert_eq!(
            parse_pinglist("10.0.0.2\nexample.com\n")
                .unwrap_err()
                .to_string(),
            "line 2: 'example.com' is not an IPv4 or IPv6 address"
        );
        let v6 = parse_pinglist("fd77::3 six probes=icmp,udp,tcp,ud\n10.0.0.3\n").unwrap();
        assert_eq!(v6[0].addr, "fd77::3".parse::<IpAddr>().unwrap());
        assert_eq!(v6[0].probes.len(), 4);
        assert_eq!(parse_pinglist("# nothing\n\n"), Err(PinglistError::Empty));
        assert!(
            parse_pinglist("10.0.0.2\n10.0.0.2 again\n")
                .unwrap_err()
                .to_string()
                .contains("line 2: 10.0.0.2 is listed twice")
        );
    }

    #[test]
    fn options_and_defaults() {
        let text = "10.0.0.2 web one probes=icmp,tcp,udp,tcp tcp_port=8080 udp_port=9\n\
                    10.0.0.3 probes=ud\n10.0.0.4 plain\n";
        let t = parse_pinglist_with(text, Probe::Ud).unwrap();
        assert_eq!(t[0].label.as_deref(), Some("web one"));
        assert_eq!(t[0].probes, vec![Probe::Icmp, Probe::Tcp, Probe::Udp]);
        assert_eq!((t[0].tcp_port, t[0].udp_port), (8080, 9));
        assert_eq!(t[1].label, None);
        assert_eq!(t[1].probes, vec![Probe::Ud]);
        // The default probe (--rdma: ud) for lines without probes=.
        assert_eq!(t[2].probes, vec![Probe::Ud]);
    }

    #[test]
    fn option_errors_name_the_line() {
        let err = |s: &str| parse_pinglist(s).unwrap_err().to_string();
        assert_eq!(
            err("10.0.0.2\n10.0.0.3 probes=icmp,sctp\n"),
            "line 2: probes: 'sctp' is not a probe (icmp, ud, tcp, udp)"
        );
        assert_eq!(
            err("10.0.0.2 tcp_port=0\n"),
            "line 1: tcp_port: '0' is not a port (1-65535)"
        );
        assert_eq!(
            err("\n\n10.0.0.2 udp_port=70000\n"),
            "line 3: udp_port: '70000' is not a port (1-65535)"
        );
        assert_eq!(
            err("10.0.0.2 color=red\n"),
            "line 1: unknown option 'color' (probes, tcp_port, udp_port)"
        );
        assert_eq!(
            err("10.0.0.2 probes=\n"),
            "line 1: probes: '' is not a probe (icmp, ud, tcp, udp)"
        );
    }

    #[test]
    fn sources() {
        assert_eq!(
            ListSource::parse("HTTPS://h/l"),
            ListSource::Url("HTTPS://h/l".into())
        );
        assert_eq!(
            ListSource::parse("http://10.77.0.1:8000/list"),
            ListSource::Url("http://10.77.0.1:8000/list".into())
        );
        assert_eq!(
            ListSource::parse("lists/mesh.txt"),
            ListSource::File("lists/mesh.txt".into())
        );
    }

    #[test]
    fn reloader_applies_changes_and_counts_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("list");
        std::fs::write(&path, "10.0.0.2\n").unwrap();
        let errors = Arc::new(AtomicU64::new(0));
        let mut r = Reloader {
            source: ListSource::File(path.clone()),
            default_probe: Probe::Icmp,
            every: Duration::from_secs(1),
            current: "10.0.0.2\n".into(),
            errors: errors.clone(),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        assert!(r.once(&tx));
        assert!(rx.try_recv().is_err(), "unchanged text sends nothing");
        std::fs::write(&path, "10.0.0.2\n10.0.0.3 probes=udp\n").unwrap();
        assert!(r.once(&tx));
        let got = rx.try_recv().unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].probes, vec![Probe::Udp]);
        std::fs::write(&path, "10.0.0.2 probes=x\n").unwrap();
        assert!(r.once(&tx));
        assert!(rx.try_recv().is_err());
        assert_eq!(errors.load(Ordering::Relaxed), 1);
        std::fs::remove_file(&path).unwrap();
        assert!(r.once(&tx));
        assert_eq!(errors.load(Ordering::Relaxed), 2);
        drop(rx);
        std::fs::write(&path, "10.0.0.9\n").unwrap();
        assert!(!r.once(&tx), "a gone receiver ends the thread");
    }
}
