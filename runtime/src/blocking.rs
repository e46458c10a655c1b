//! The blocking front: `std::io` streams for ordinary threads, on a running
//! stack. Each call is the async front's ([`crate::aio`]) run to completion
//! on the calling thread, which parks until the loop's readiness event
//! wakes it; optional timeouts bound the wait (`SO_RCVTIMEO` style).
//!
//! ```
//! use std::io::{Read, Write};
//! use std::net::{Ipv4Addr, SocketAddrV4};
//! use ustack_runtime::Builder;
//! use ustack_runtime::blocking::{TcpListener, TcpStream};
//!
//! let link = ustack::sim::SimLink::new(Default::default());
//! let a = Builder::new().sim(&link).ip(Ipv4Addr::new(10, 0, 0, 1), 24).spawn()?;
//! let b = Builder::new().sim(&link).ip(Ipv4Addr::new(10, 0, 0, 2), 24).spawn()?;
//! let listener = TcpListener::bind(b.net(), 7, 16)?;
//! let server = std::thread::spawn(move || -> std::io::Result<()> {
//!     let (mut s, _) = listener.accept()?;
//!     let mut buf = [0u8; 5];
//!     s.read_exact(&mut buf)?;
//!     s.write_all(&buf)
//! });
//! let mut c = TcpStream::connect(a.net(), SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 7))?;
//! c.write_all(b"hello")?;
//! let mut echo = [0u8; 5];
//! c.read_exact(&mut echo)?;
//! assert_eq!(&echo, b"hello");
//! server.join().unwrap()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crate::aio;
use crate::spawned::Net;

/// Wakes a parked thread.
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Run `fut` on this thread until it completes or `timeout` passes
/// (`WouldBlock` then, as a socket with a receive timeout says). No
/// executor crate offers a timeout on its `block_on`, hence this one.
pub fn block_on<T>(
    fut: impl Future<Output = io::Result<T>>,
    timeout: Option<Duration>,
) -> io::Result<T> {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        if let Poll::Ready(r) = fut.as_mut().poll(&mut cx) {
            return r;
        }
        match deadline {
            None => std::thread::park(),
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(
                        io::ErrorKind::WouldBlock,
                        "timed out waiting on the socket",
                    ));
                }
                std::thread::park_timeout(left);
            }
        }
    }
}

/// A listening TCP socket for threads. Dropping it stops listening.
#[derive(Debug)]
pub struct TcpListener {
    inner: aio::TcpListener,
}

impl TcpListener {
    /// Listen on `port` with room for `backlog` connections waiting to be accepted.
    pub fn bind(net: &Net, port: u16, backlog: usize) -> io::Result<TcpListener> {
        Ok(TcpListener {
            inner: aio::TcpListener::bind(net, port, backlog)?,
        })
    }

    /// Block until a connection is established.
    pub fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let (s, peer) = block_on(self.inner.accept(), None)?;
        Ok((TcpStream::from(s), peer))
    }

    /// The port listened on.
    pub fn local_port(&self) -> u16 {
        self.inner.local_port()
    }
}

/// A blocking TCP stream (`std::io::Read + Write`, also through `&TcpStream`,
/// so one thread can read while another writes). Dropping the last handle
/// ([`try_clone`](Self::try_clone) makes more) closes the connection.
#[derive(Debug)]
pub struct TcpStream {
    inner: Arc<aio::TcpStream>,
    read_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
}

impl From<aio::TcpStream> for TcpStream {
    fn from(inner: aio::TcpStream) -> Self {
        TcpStream {
            inner: Arc::new(inner),
            read_timeout: None,
            write_timeout: None,
        }
    }
}

impl TcpStream {
    /// Connect to `remote`, blocking until the handshake ends.
    pub fn connect(net: &Net, remote: impl Into<SocketAddr>) -> io::Result<TcpStream> {
        Self::connect_timeout(net, remote, None)
    }

    /// Connect to `remote`, waiting at most `timeout` for the handshake
    /// (`WouldBlock` then; the half-open connection is closed).
    pub fn connect_timeout(
        net: &Net,
        remote: impl Into<SocketAddr>,
        timeout: Option<Duration>,
    ) -> io::Result<TcpStream> {
        block_on(aio::TcpStream::connect(net, remote), timeout).map(TcpStream::from)
    }

    /// Another handle on the same connection (its own timeouts).
    pub fn try_clone(&self) -> io::Result<TcpStream> {
        Ok(TcpStream {
            inner: self.inner.clone(),
            read_timeout: self.read_timeout,
            write_timeout: self.write_timeout,
        })
    }

    /// Bound how long a read waits (`None`: forever).
    pub fn set_read_timeout(&mut self, t: Option<Duration>) {
        self.read_timeout = t;
    }

    /// Bound how long a write waits for room (`None`: forever).
    pub fn set_write_timeout(&mut self, t: Option<Duration>) {
        self.write_timeout = t;
    }

    /// Close the sending side (FIN after what was written); reading stays possible.
    pub fn shutdown(&self) -> io::Result<()> {
        self.inner.shutdown()
    }

    /// The remote end.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.inner.peer_addr()
    }

    /// The local end.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

impl io::Read for &TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let s = &self.inner;
        block_on(
            std::future::poll_fn(|cx| s.poll_read_buf(cx, buf)),
            self.read_timeout,
        )
    }
}

impl io::Write for &TcpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let s = &self.inner;
        block_on(
            std::future::poll_fn(|cx| s.poll_write_buf(cx, buf)),
            self.write_timeout,
        )
    }

    /// Written bytes are in the stack's send ring already.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl io::Read for TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl io::Write for TcpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A blocking UDP socket.
#[derive(Debug)]
pub struct UdpSocket {
    inner: aio::UdpSocket,
    read_timeout: Option<Duration>,
}

impl UdpSocket {
    /// Bind to `port` (0 picks an ephemeral port).
    pub fn bind(net: &Net, port: u16) -> io::Result<UdpSocket> {
        Ok(UdpSocket {
            inner: aio::UdpSocket::bind(net, port)?,
            read_timeout: None,
        })
    }

    /// Bound how long `recv_from` waits (`None`: forever).
    pub fn set_read_timeout(&mut self, t: Option<Duration>) {
        self.read_timeout = t;
    }

    /// The port bound.
    pub fn local_port(&self) -> u16 {
        self.inner.local_port()
    }

    /// Send a datagram, waiting while the send queue is full.
    pub fn send_to(&self, buf: &[u8], dst: impl Into<SocketAddr>) -> io::Result<usize> {
        block_on(self.inner.send_to(buf, dst), None)
    }

    /// Receive a datagram (truncated to `buf`), its full length and source.
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        block_on(self.inner.recv_from(buf), self.read_timeout)
    }
}
