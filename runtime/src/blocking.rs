//! The threaded front: ordinary threads use TCP connections of a stack running
//! in its poll loop through blocking [`TcpStream`]s (`std::io::Read` +
//! `Write`), over crossbeam channels.
//!
//! [`StreamFront`] is the in-loop half (an [`App`]); [`Connector`] (cloneable,
//! `Send`) opens connections and listeners from any thread. Queues are
//! bounded both ways, so a slow reader thread closes the TCP window and a
//! slow network blocks the writer thread: backpressure end to end.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddrV4;

use crossbeam::channel::{Receiver, RecvTimeoutError, Sender, TryRecvError, TrySendError, bounded};

use ustack::node::{App, Control};
use ustack::stack::{Error, Stack};
use ustack::tcp::{ListenHandle, State, TcpHandle};
use ustack::time::Instant;

/// Chunks queued per direction per stream.
const QUEUE: usize = 64;
/// Largest chunk moved from the stack to a reader thread.
const CHUNK: usize = 64 << 10;

enum Up {
    Data(Vec<u8>),
    Shutdown,
}

enum Down {
    Data(Vec<u8>),
    Eof,
    Error(io::ErrorKind, String),
}

/// The loop's end of one stream.
struct LoopStream {
    h: TcpHandle,
    up: Receiver<Up>,
    down: Sender<Down>,
    /// A chunk partly written into the send buffer.
    pending: Option<(Vec<u8>, usize)>,
    /// Bytes read from the stack that the reader's queue had no room for.
    held: Option<Vec<u8>>,
    /// A blocking connect waiting for the handshake, with the thread's half.
    connecting: Option<(Sender<io::Result<TcpStream>>, TcpStream)>,
    app_gone: bool,
    eof_sent: bool,
}

struct LoopListener {
    l: ListenHandle,
    accepted: Sender<TcpStream>,
}

enum Request {
    Connect(SocketAddrV4, Sender<io::Result<TcpStream>>),
    Listen(u16, usize, Sender<io::Result<TcpListener>>),
}

/// The in-loop half: run it as (part of) the app of a stack's poll loop.
pub struct StreamFront {
    requests: Receiver<Request>,
    streams: Vec<LoopStream>,
    listeners: Vec<LoopListener>,
    buf: Vec<u8>,
}

impl core::fmt::Debug for StreamFront {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("StreamFront")
            .field("streams", &self.streams.len())
            .finish()
    }
}

/// Opens connections and listeners from any thread.
#[derive(Debug, Clone)]
pub struct Connector {
    requests: Sender<Request>,
}

/// A new front: the app for the loop and a connector for threads.
pub fn front() -> (StreamFront, Connector) {
    let (tx, rx) = bounded(256);
    (
        StreamFront {
            requests: rx,
            streams: Vec::new(),
            listeners: Vec::new(),
            buf: vec![0; CHUNK],
        },
        Connector { requests: tx },
    )
}

fn io_err(e: Error) -> io::Error {
    let kind = match e {
        Error::AddrInUse => io::ErrorKind::AddrInUse,
        Error::NoRoute => io::ErrorKind::HostUnreachable,
        Error::Closed => io::ErrorKind::NotConnected,
        Error::Tcp(ustack::tcp::ConnError::Refused) => io::ErrorKind::ConnectionRefused,
        Error::Tcp(ustack::tcp::ConnError::Reset) => io::ErrorKind::ConnectionReset,
        Error::Tcp(ustack::tcp::ConnError::TimedOut) => io::ErrorKind::TimedOut,
        Error::Tcp(ustack::tcp::ConnError::Aborted) => io::ErrorKind::ConnectionAborted,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e)
}

fn loop_gone() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "the stack's poll loop has stopped",
    )
}

impl Connector {
    /// Connect and wait until the connection is established (or fails).
    pub fn connect(&self, remote: SocketAddrV4) -> io::Result<TcpStream> {
        let (tx, rx) = bounded(1);
        self.requests
            .send(Request::Connect(remote, tx))
            .map_err(|_| loop_gone())?;
        rx.recv().map_err(|_| loop_gone())?
    }

    /// Listen on `port`.
    pub fn listen(&self, port: u16, backlog: usize) -> io::Result<TcpListener> {
        let (tx, rx) = bounded(1);
        self.requests
            .send(Request::Listen(port, backlog, tx))
            .map_err(|_| loop_gone())?;
        rx.recv().map_err(|_| loop_gone())?
    }
}

/// A listening socket for threads.
#[derive(Debug)]
pub struct TcpListener {
    accepted: Receiver<TcpStream>,
}

impl TcpListener {
    /// Wait for the next connection.
    pub fn accept(&self) -> io::Result<TcpStream> {
        self.accepted.recv().map_err(|_| loop_gone())
    }

    /// Wait at most `timeout`; `Ok(None)` when none came.
    pub fn accept_timeout(&self, timeout: std::time::Duration) -> io::Result<Option<TcpStream>> {
        match self.accepted.recv_timeout(timeout) {
            Ok(s) => Ok(Some(s)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err(loop_gone()),
        }
    }
}

/// A blocking TCP stream for an ordinary thread. Dropping it closes the
/// connection (FIN after the data written so far).
#[derive(Debug)]
pub struct TcpStream {
    up: Sender<Up>,
    down: Receiver<Down>,
    /// Unread rest of the last chunk.
    rest: VecDeque<u8>,
    eof: bool,
}

impl core::fmt::Debug for Up {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Up::Data(d) => write!(f, "Data({})", d.len()),
            Up::Shutdown => f.write_str("Shutdown"),
        }
    }
}

impl core::fmt::Debug for Down {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Down::Data(d) => write!(f, "Data({})", d.len()),
            Down::Eof => f.write_str("Eof"),
            Down::Error(k, m) => write!(f, "Error({k:?}, {m})"),
        }
    }
}

impl TcpStream {
    /// Close the sending side (FIN once queued data is sent); reading goes on.
    pub fn shutdown(&self) -> io::Result<()> {
        self.up.send(Up::Shutdown).map_err(|_| loop_gone())
    }
}

impl io::Read for TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        while self.rest.is_empty() && !self.eof {
            match self.down.recv() {
                Ok(Down::Data(d)) => self.rest.extend(d),
                Ok(Down::Eof) | Err(_) => self.eof = true,
                Ok(Down::Error(kind, msg)) => return Err(io::Error::new(kind, msg)),
            }
        }
        let n = buf.len().min(self.rest.len());
        for (dst, src) in buf.iter_mut().zip(self.rest.drain(..n)) {
            *dst = src;
        }
        Ok(n)
    }
}

impl io::Write for TcpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(CHUNK);
        self.up
            .send(Up::Data(buf[..n].to_vec()))
            .map_err(|_| loop_gone())?;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Both ends of a new stream.
fn stream_pair(h: TcpHandle) -> (LoopStream, TcpStream) {
    let (up_tx, up_rx) = bounded(QUEUE);
    let (down_tx, down_rx) = bounded(QUEUE);
    (
        LoopStream {
            h,
            up: up_rx,
            down: down_tx,
            pending: None,
            held: None,
            connecting: None,
            app_gone: false,
            eof_sent: false,
        },
        TcpStream {
            up: up_tx,
            down: down_rx,
            rest: VecDeque::new(),
            eof: false,
        },
    )
}

impl StreamFront {
    fn take_requests(&mut self, stack: &mut Stack) {
        while let Ok(req) = self.requests.try_recv() {
            match req {
                Request::Connect(remote, reply) => match stack.tcp_connect(remote) {
                    Ok(h) => {
                        // The thread's half is handed over once established.
                        let (mut ls, ts) = stream_pair(h);
                        ls.connecting = Some((reply, ts));
                        self.streams.push(ls);
                    }
                    Err(e) => {
                        let _ = reply.send(Err(io_err(e)));
                    }
                },
                Request::Listen(port, backlog, reply) => match stack.tcp_listen(port, backlog) {
                    Ok(l) => {
                        let (tx, rx) = bounded(backlog.max(1));
                        self.listeners.push(LoopListener { l, accepted: tx });
                        let _ = reply.send(Ok(TcpListener { accepted: rx }));
                    }
                    Err(e) => {
                        let _ = reply.send(Err(io_err(e)));
                    }
                },
            }
        }
    }

    fn accept(&mut self, stack: &mut Stack) {
        for li in &self.listeners {
            while !li.accepted.is_full() {
                let Ok(Some(h)) = stack.tcp_accept(li.l) else {
                    break;
                };
                let (ls, ts) = stream_pair(h);
                if li.accepted.try_send(ts).is_ok() {
                    self.streams.push(ls);
                } else {
                    let _ = stack.tcp_abort(h);
                }
            }
        }
    }

    /// Move data between one stream's queues and its connection; false when done.
    fn pump(s: &mut LoopStream, stack: &mut Stack, buf: &mut [u8]) -> bool {
        let Ok(status) = stack.tcp_status(s.h) else {
            return false;
        };
        if let Some((reply, ts)) = s.connecting.take() {
            if let Some(e) = status.error {
                let _ = reply.send(Err(io_err(Error::Tcp(e))));
                let _ = stack.tcp_close(s.h);
                return false;
            }
            if matches!(status.state, State::SynSent | State::SynReceived) {
                s.connecting = Some((reply, ts));
                return true;
            }
            let _ = reply.send(Ok(ts));
        }
        // Thread -> network.
        loop {
            if s.pending.is_none() && !s.app_gone {
                match s.up.try_recv() {
                    Ok(Up::Data(d)) => s.pending = Some((d, 0)),
                    Ok(Up::Shutdown) => {
                        let _ = stack.tcp_shutdown(s.h);
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        s.app_gone = true;
                        break;
                    }
                }
            }
            let Some((d, off)) = s.pending.as_mut() else {
                break;
            };
            match stack.tcp_send(s.h, &d[*off..]) {
                Ok(n) => {
                    *off += n;
                    if *off < d.len() {
                        break;
                    }
                    s.pending = None;
                }
                Err(e) => {
                    let _ = s
                        .down
                        .try_send(Down::Error(io_err(e).kind(), e.to_string()));
                    s.pending = None;
                    break;
                }
            }
        }
        // Network -> thread, only as far as the thread's queue has room.
        loop {
            if let Some(d) = s.held.take() {
                match s.down.try_send(Down::Data(d)) {
                    Ok(()) => {}
                    Err(TrySendError::Full(Down::Data(d))) => {
                        s.held = Some(d);
                        break;
                    }
                    Err(_) => break,
                }
            }
            match stack.tcp_recv(s.h, buf) {
                Ok(0) => break,
                Ok(n) => s.held = Some(buf[..n].to_vec()),
                Err(e) => {
                    let _ = s
                        .down
                        .try_send(Down::Error(io_err(e).kind(), e.to_string()));
                    break;
                }
            }
        }
        if s.held.is_none() && status.eof && !s.eof_sent && s.down.try_send(Down::Eof).is_ok() {
            s.eof_sent = true;
        }
        if s.app_gone && s.pending.is_none() {
            // The thread dropped its stream: FIN after what it wrote.
            let _ = stack.tcp_close(s.h);
            return false;
        }
        !(status.error.is_some() && s.held.is_none())
    }
}

impl App for StreamFront {
    fn poll(&mut self, _: Instant, stack: &mut Stack) -> Control {
        self.take_requests(stack);
        self.accept(stack);
        let buf = &mut self.buf;
        self.streams.retain_mut(|s| Self::pump(s, stack, buf));
        Control::Continue
    }

    // No `poll_at`: threads act without the loop knowing, so the loop's idle
    // back-off (at most 1 ms by default) bounds how long a request waits.
}
