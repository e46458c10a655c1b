//! The HTTP side of the metrics endpoint: a std [`TcpListener`] on the
//! kernel's network (the management side, never the stack's own port),
//! one short-lived thread per scrape, at most [`Limits::max_connections`]
//! at once.
//!
//! Requests are parsed with `httparse` (hyper's parser) over a bounded
//! buffer; the rest is small enough to keep here, where every limit is
//! ours to set: `GET`/`HEAD /metrics` is the scrape (readable from any
//! origin: CORS `*`), `/` the mesh page (`page.html`: the source x target
//! matrices drawn in the browser from `/metrics`), any other path 404, any other method 405, a request `httparse`
//! refuses 400, a request head over [`Limits::max_header_bytes`] (or with
//! more than 64 header fields) 431, a client that has not sent its request
//! within [`Limits::timeout`] 408. Each connection serves one request and
//! is closed. A connection past the limit gets a 503 at once. Reads and
//! writes time out, and a whole exchange ends after
//! [`Limits::timeout`] twice over, so no client holds a thread for long.
//!
//! The scrape function runs on the connection's thread; it must only read
//! published state (see the runtime's `metrics::MetricsSource`). A panic
//! in it is caught and answered with 500.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::Family;

/// What a scrape serves: the families of this moment.
pub type ScrapeFn = Arc<dyn Fn() -> Vec<Family> + Send + Sync>;

/// How often the accepting thread looks for connections (and for a
/// request to pause or stop).
const ACCEPT_INTERVAL: Duration = Duration::from_millis(20);
/// Most header fields in a request.
const MAX_HEADERS: usize = 64;

/// Bounds on what clients may cost.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Scrapes served at once; more get 503.
    pub max_connections: usize,
    /// Time a client has to send its request head, and the write timeout.
    pub timeout: Duration,
    /// Largest request head (request line and headers), bytes; more is 431.
    pub max_header_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 8,
            timeout: Duration::from_secs(5),
            max_header_bytes: 8192,
        }
    }
}

/// Why the metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address could not be bound (in use, not an address of this
    /// host, a privileged port).
    #[error("cannot serve metrics on {addr}: {err}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        err: io::Error,
    },
    /// The OS refused a thread.
    #[error("cannot serve metrics on {addr}: cannot start a thread: {err}")]
    Thread {
        /// The endpoint's address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        err: io::Error,
    },
}

struct State {
    scrape: ScrapeFn,
    limits: Limits,
    /// Connections being served.
    active: AtomicUsize,
    /// Ask the accepting thread to return.
    stop: AtomicBool,
    /// Connections turned away with 503.
    refused: AtomicUsize,
}

/// A running metrics endpoint; stops (and closes its socket) when dropped.
pub struct Endpoint {
    addr: SocketAddr,
    listener: Arc<TcpListener>,
    state: Arc<State>,
    acceptor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("addr", &self.addr)
            .field("running", &self.acceptor.is_some())
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// Listen on `addr` (port 0 picks a free one: see
    /// [`local_addr`](Self::local_addr)) and serve `scrape` with the
    /// default [`Limits`].
    pub fn bind(addr: SocketAddr, scrape: ScrapeFn) -> Result<Endpoint, MetricsError> {
        Self::bind_with(addr, scrape, Limits::default())
    }

    /// [`bind`](Self::bind) with other limits.
    pub fn bind_with(
        addr: SocketAddr,
        scrape: ScrapeFn,
        limits: Limits,
    ) -> Result<Endpoint, MetricsError> {
        let bind_err = |err| MetricsError::Bind { addr, err };
        let listener = TcpListener::bind(addr).map_err(bind_err)?;
        listener.set_nonblocking(true).map_err(bind_err)?;
        let local = listener.local_addr().map_err(bind_err)?;
        let mut ep = Endpoint {
            addr: local,
            listener: Arc::new(listener),
            state: Arc::new(State {
                scrape,
                limits: Limits {
                    max_connections: limits.max_connections.max(1),
                    ..limits
                },
                active: AtomicUsize::new(0),
                stop: AtomicBool::new(false),
                refused: AtomicUsize::new(0),
            }),
            acceptor: None,
        };
        ep.resume()?;
        Ok(ep)
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections turned away so far because [`Limits::max_connections`]
    /// were being served.
    pub fn refused(&self) -> usize {
        self.state.refused.load(Ordering::Relaxed)
    }

    /// Stop accepting and wait until no scrape is being served (each ends
    /// within its timeouts); the socket stays open, and connections wait
    /// in its backlog until [`resume`](Self::resume). Before `fork`: a
    /// thread is not copied into the child, and none holds a lock then.
    pub fn pause(&mut self) {
        let Some(t) = self.acceptor.take() else {
            return;
        };
        self.state.stop.store(true, Ordering::Release);
        let _ = t.join();
        while self.state.active.load(Ordering::Acquire) > 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.state.stop.store(false, Ordering::Release);
    }

    /// Accept again, on a new thread of this process (after `fork`, in
    /// the process that keeps the stack).
    pub fn resume(&mut self) -> Result<(), MetricsError> {
        if self.acceptor.is_some() {
            return Ok(());
        }
        let (listener, state) = (self.listener.clone(), self.state.clone());
        let t = std::thread::Builder::new()
            .name("ustack-metrics".into())
            .spawn(move || accept_loop(&listener, &state))
            .map_err(|err| MetricsError::Thread {
                addr: self.addr,
                err,
            })?;
        self.acceptor = Some(t);
        Ok(())
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(t) = self.acceptor.take() {
            self.state.stop.store(true, Ordering::Release);
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, state: &Arc<State>) {
    while !state.stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => admit(stream, state),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // WouldBlock, or a transient failure (out of descriptors, a
            // connection reset before accept): look again shortly.
            Err(_) => std::thread::sleep(ACCEPT_INTERVAL),
        }
    }
}

/// Counts a connection being served; uncounted when its thread ends,
/// however it ends.
struct Active(Arc<State>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

fn admit(stream: TcpStream, state: &Arc<State>) {
    let limits = state.limits;
    // Accepted sockets do not inherit the listener's non-blocking mode on
    // Linux; make sure, then bound every read and write.
    let setup = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(limits.timeout)))
        .and_then(|()| stream.set_write_timeout(Some(limits.timeout)));
    if setup.is_err() {
        return;
    }
    let n = state.active.fetch_add(1, Ordering::AcqRel);
    let guard = Active(state.clone());
    if n >= limits.max_connections {
        state.refused.fetch_add(1, Ordering::Relaxed);
        // Answered here without reading: a short write on a fresh socket
        // goes to its send buffer at once; a short timeout covers the rest.
        let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
        let mut stream = stream;
        let _ = respond(
            &mut stream,
            503,
            "Service Unavailable",
            &[],
            "too many scrapes at once\n",
            false,
        );
        drop(guard);
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("ustack-scrape".into())
        .spawn(move || {
            let _guard = guard;
            let mut stream = stream;
            serve(&mut stream, &_guard.0);
        });
    if spawned.is_err() {
        state.refused.fetch_add(1, Ordering::Relaxed);
    }
}

/// What a request head came to.
#[derive(Debug, PartialEq)]
enum Head {
    /// A complete request: method and path (without the query).
    Request { method: String, path: String },
    /// Not a request (400).
    Malformed,
    /// Too large (431).
    TooLarge,
    /// The client sent nothing more in time (408).
    TimedOut,
    /// The client closed before a complete request (nothing to answer).
    Closed,
}

/// Read a request head from `r`, at most `max` bytes, until `deadline`.
fn read_head(r: &mut impl Read, max: usize, deadline: Instant) -> Head {
    let mut buf = vec![0u8; max];
    let mut len = 0;
    loop {
        if len > 0 {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(&buf[..len]) {
                Ok(httparse::Status::Complete(_)) => {
                    let method = req.method.unwrap_or_default().to_owned();
                    let target = req.path.unwrap_or_default();
                    let path = target.split(['?', '#']).next().unwrap_or_default();
                    return Head::Request {
                        method,
                        path: path.to_owned(),
                    };
                }
                Ok(httparse::Status::Partial) => {}
                Err(httparse::Error::TooManyHeaders) => return Head::TooLarge,
                Err(_) => return Head::Malformed,
            }
        }
        if len == buf.len() {
            return Head::TooLarge;
        }
        if Instant::now() >= deadline {
            return Head::TimedOut;
        }
        match r.read(&mut buf[len..]) {
            Ok(0) => return Head::Closed,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Head::TimedOut;
            }
            Err(_) => return Head::Closed,
        }
    }
}

/// The page at `/`: the mesh's source x target matrices, drawn in the
/// browser from this endpoint's `/metrics` and those of the agents named
/// in its query string (`?agents=host:port,...`); one self-contained file,
/// nothing else fetched.
const INDEX: &str = include_str!("page.html");

/// `/metrics` may be read by a page from another origin (the mesh page of
/// another agent): the metrics are read-only and public on the management
/// network anyway.
const CORS: (&str, &str) = ("Access-Control-Allow-Origin", "*");

fn serve(stream: &mut TcpStream, state: &State) {
    let limits = state.limits;
    let deadline = Instant::now() + limits.timeout;
    let (method, path) = match read_head(stream, limits.max_header_bytes, deadline) {
        Head::Request { method, path } => (method, path),
        Head::Malformed => {
            let _ = respond(stream, 400, "Bad Request", &[], "bad request\n", false);
            return;
        }
        Head::TooLarge => {
            let _ = respond(
                stream,
                431,
                "Request Header Fields Too Large",
                &[],
                "request header too large\n",
                false,
            );
            return;
        }
        Head::TimedOut => {
            let _ = respond(
                stream,
                408,
                "Request Timeout",
                &[],
                "request timeout\n",
                false,
            );
            return;
        }
        Head::Closed => return,
    };
    let head = method == "HEAD";
    if method != "GET" && !head {
        let _ = respond(
            stream,
            405,
            "Method Not Allowed",
            &[("Allow", "GET, HEAD")],
            "only GET and HEAD\n",
            false,
        );
        return;
    }
    let write_deadline = Instant::now() + limits.timeout * 2;
    let _ = match path.as_str() {
        "/metrics" => {
            let scrape = state.scrape.clone();
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                super::text::render(&scrape())
            })) {
                Ok(body) => respond_until(
                    stream,
                    (200, "OK"),
                    &[("Content-Type", super::text::CONTENT_TYPE), CORS],
                    &body,
                    head,
                    write_deadline,
                ),
                Err(_) => respond(
                    stream,
                    500,
                    "Internal Server Error",
                    &[],
                    "scrape failed\n",
                    head,
                ),
            }
        }
        "/" => respond(
            stream,
            200,
            "OK",
            &[("Content-Type", "text/html; charset=utf-8")],
            INDEX,
            head,
        ),
        _ => respond(
            stream,
            404,
            "Not Found",
            &[],
            "not found: try /metrics\n",
            head,
        ),
    };
}

fn respond(
    w: &mut impl Write,
    code: u16,
    reason: &str,
    headers: &[(&str, &str)],
    body: &str,
    head_only: bool,
) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    respond_until(w, (code, reason), headers, body, head_only, deadline)
}

/// Write a response in pieces, giving up at `deadline` (a reader too slow
/// to take the body in time loses it).
fn respond_until(
    w: &mut impl Write,
    (code, reason): (u16, &str),
    headers: &[(&str, &str)],
    body: &str,
    head_only: bool,
    deadline: Instant,
) -> io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if !headers.iter().any(|(k, _)| *k == "Content-Type") {
        out.push_str("Content-Type: text/plain; charset=utf-8\r\n");
    }
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    w.write_all(out.as_bytes())?;
    if !head_only {
        for chunk in body.as_bytes().chunks(16 * 1024) {
            if Instant::now() >= deadline {
                return Err(io::ErrorKind::TimedOut.into());
            }
            w.write_all(chunk)?;
        }
    }
    w.flush()
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::metrics::{Kind, Sample, Value};
    use std::io::BufRead;

    fn families() -> Vec<Family> {
        vec![Family {
            name: "ustack_test_total".into(),
            help: "A test counter.".into(),
            kind: Kind::Counter,
            samples: vec![Sample {
                labels: vec![("stack".into(), "t".into())],
                value: Value::Number(7.0),
            }],
        }]
    }

    fn endpoint(limits: Limits) -> Endpoint {
        Endpoint::bind_with("127.0.0.1:0".parse().unwrap(), Arc::new(families), limits).unwrap()
    }

    /// Send `req` and read the whole answer: (status code, headers and body).
    fn exchange(addr: SocketAddr, req: &[u8]) -> (u16, String) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        // The server may answer (and close) before it read everything.
        let _ = s.write_all(req);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out).into_owned();
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (code, text)
    }

    #[test]
    fn serves_metrics_and_answers_bad_requests_with_4xx() {
        let ep = endpoint(Limits::default());
        let a = ep.local_addr();
        let (code, text) = exchange(a, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(code, 200, "{text}");
        assert!(
            text.contains("Content-Type: text/plain; version=0.0.4"),
            "{text}"
        );
        assert!(
            text.contains("Access-Control-Allow-Origin: *\r\n"),
            "{text}"
        );
        assert!(text.contains("\r\n\r\n# HELP ustack_test_total A test counter.\n# TYPE ustack_test_total counter\nustack_test_total{stack=\"t\"} 7\n"), "{text}");
        // A query string is not part of the path.
        assert_eq!(exchange(a, b"GET /metrics?x=1 HTTP/1.0\r\n\r\n").0, 200);
        let (code, text) = exchange(a, b"HEAD /metrics HTTP/1.1\r\n\r\n");
        assert_eq!(code, 200);
        assert!(text.ends_with("\r\n\r\n"), "no body for HEAD: {text}");
        let (code, text) = exchange(a, b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(code, 200);
        assert!(text.contains("href=\"/metrics\""), "{text}");
        assert!(text.contains("<title>ustack mesh</title>"), "{text}");
        assert!(text.contains("text/html"), "{text}");
        assert_eq!(exchange(a, b"GET /nope HTTP/1.1\r\n\r\n").0, 404);
        let (code, text) = exchange(a, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
        assert_eq!(code, 405);
        assert!(text.contains("Allow: GET, HEAD"), "{text}");
        assert_eq!(exchange(a, b"GARBAGE\x01 / HTTP/1.1\r\n\r\n").0, 400);
        assert_eq!(exchange(a, b"GET /metrics HTTP/9.9\r\n\r\n").0, 400);
        assert_eq!(exchange(a, b"\r\n\r\n\r\n\x00\xff\r\n\r\n").0, 400);
        // A head past the limit, in one huge header or in too many.
        let mut big = b"GET /metrics HTTP/1.1\r\nX-Big: ".to_vec();
        big.extend(std::iter::repeat_n(b'a', 20_000));
        big.extend(b"\r\n\r\n");
        assert_eq!(exchange(a, &big).0, 431);
        let mut many = b"GET /metrics HTTP/1.1\r\n".to_vec();
        for i in 0..100 {
            many.extend(format!("X-{i}: 1\r\n").as_bytes());
        }
        many.extend(b"\r\n");
        assert_eq!(exchange(a, &many).0, 431);
        // Still serving after all that.
        assert_eq!(exchange(a, b"GET /metrics HTTP/1.1\r\n\r\n").0, 200);
    }

    #[test]
    fn a_stalled_client_gets_408_and_frees_its_thread() {
        let ep = endpoint(Limits {
            max_connections: 1,
            timeout: Duration::from_millis(300),
            ..Limits::default()
        });
        let a = ep.local_addr();
        // Half a request, then nothing: the only slot is taken until the
        // timeout, then the client is told and the slot is free again.
        let mut stalled = TcpStream::connect(a).unwrap();
        stalled.write_all(b"GET /metr").unwrap();
        let mut r = std::io::BufReader::new(stalled);
        let mut status = String::new();
        r.read_line(&mut status).unwrap();
        assert!(status.starts_with("HTTP/1.1 408"), "{status}");
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let (code, _) = exchange(a, b"GET /metrics HTTP/1.1\r\n\r\n");
            if code == 200 {
                break;
            }
            assert_eq!(code, 503);
            assert!(Instant::now() < end, "the slot was never freed");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn concurrent_scrapes_past_the_limit_get_503_and_the_rest_200() {
        let ep = endpoint(Limits {
            max_connections: 2,
            timeout: Duration::from_secs(10),
            ..Limits::default()
        });
        let a = ep.local_addr();
        // Two clients hold both slots (connected, request unfinished).
        let held: Vec<TcpStream> = (0..2)
            .map(|_| {
                let mut s = TcpStream::connect(a).unwrap();
                s.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
                s
            })
            .collect();
        // Wait until the server has taken both (a retry, not a timing claim).
        let end = Instant::now() + Duration::from_secs(30);
        while ep.state.active.load(Ordering::Acquire) < 2 {
            assert!(Instant::now() < end);
            std::thread::sleep(Duration::from_millis(5));
        }
        let (code, text) = exchange(a, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert_eq!(code, 503, "{text}");
        assert!(ep.refused() >= 1);
        // The held ones finish their requests and are served.
        let threads: Vec<_> = held
            .into_iter()
            .map(|mut s| {
                std::thread::spawn(move || {
                    s.write_all(b"\r\n").unwrap();
                    let mut out = String::new();
                    s.read_to_string(&mut out).unwrap();
                    out
                })
            })
            .collect();
        for t in threads {
            assert!(t.join().unwrap().starts_with("HTTP/1.1 200"));
        }
        // Many scrapes from many threads: each gets 200 or 503, never
        // anything else, and the endpoint keeps serving.
        let scrapers: Vec<_> = (0..16)
            .map(|_| std::thread::spawn(move || exchange(a, b"GET /metrics HTTP/1.1\r\n\r\n").0))
            .collect();
        let codes: Vec<u16> = scrapers.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(codes.iter().all(|c| *c == 200 || *c == 503), "{codes:?}");
        assert!(codes.contains(&200), "{codes:?}");
    }

    #[test]
    fn a_paused_endpoint_keeps_its_socket_and_serves_after_resume() {
        let mut ep = endpoint(Limits::default());
        let a = ep.local_addr();
        ep.pause();
        // Connections wait in the backlog while paused ...
        let mut s = TcpStream::connect(a).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        ep.resume().unwrap();
        // ... and are served once it accepts again.
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    }

    #[test]
    fn a_panicking_scrape_is_a_500() {
        let ep = Endpoint::bind(
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(|| panic!("a source's bug")),
        )
        .unwrap();
        assert_eq!(
            exchange(ep.local_addr(), b"GET /metrics HTTP/1.1\r\n\r\n").0,
            500
        );
        assert_eq!(exchange(ep.local_addr(), b"GET / HTTP/1.1\r\n\r\n").0, 200);
    }

    #[test]
    fn binding_an_address_in_use_is_one_clear_error() {
        let ep = endpoint(Limits::default());
        let e = Endpoint::bind(ep.local_addr(), Arc::new(Vec::new)).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("cannot serve metrics on {}: ", ep.local_addr())),
            "{text}"
        );
        assert!(text.contains("already in use"), "{text}");
    }
}
