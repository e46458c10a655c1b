//! The async front: [`TcpListener`], [`TcpStream`] and [`UdpSocket`] on a
//! running stack, usable from any executor. Streams implement the
//! `futures-io` traits (`AsyncRead`, `AsyncWrite`), and tokio's behind the
//! `tokio` feature.
//!
//! Every call works on the stack directly under its lock (no copy through
//! an intermediate queue): a read copies from the connection's receive
//! ring, a write into its send ring. A call that cannot proceed registers
//! the task's waker, and the loop wakes it on the socket's readiness event.
//!
//! ```
//! use std::net::{Ipv4Addr, SocketAddrV4};
//! use futures::{AsyncReadExt, AsyncWriteExt};
//! use ustack_runtime::Builder;
//! use ustack_runtime::aio::{TcpListener, TcpStream};
//!
//! // Two stacks on one simulated link, each with its loop on a thread.
//! let link = ustack::sim::SimLink::new(Default::default());
//! let a = Builder::new().sim(&link).ip(Ipv4Addr::new(10, 0, 0, 1), 24).spawn()?;
//! let b = Builder::new().sim(&link).ip(Ipv4Addr::new(10, 0, 0, 2), 24).spawn()?;
//! let listener = TcpListener::bind(b.net(), 7, 16)?;
//! futures::executor::block_on(async {
//!     let server = async {
//!         let (mut s, _) = listener.accept().await?;
//!         let mut buf = [0u8; 5];
//!         s.read_exact(&mut buf).await?;
//!         s.write_all(&buf).await?;
//!         s.close().await
//!     };
//!     let client = async {
//!         let mut c = TcpStream::connect(a.net(), SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 7)).await?;
//!         c.write_all(b"hello").await?;
//!         let mut echo = Vec::new();
//!         c.read_to_end(&mut echo).await?;
//!         assert_eq!(echo, b"hello");
//!         Ok::<(), std::io::Error>(())
//!     };
//!     futures::try_join!(server, client)
//! })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use ustack::Error as StackError;
use ustack::events::SocketRef;
use ustack::socket::tcp::{ListenHandle, State, TcpHandle};
use ustack::socket::udp::UdpHandle;

use crate::spawned::{Interest, Net, io_error};

/// A listening TCP socket. Dropping it stops listening: new SYNs to the
/// port are refused with a reset, and connections not yet accepted are
/// reset.
#[derive(Debug)]
pub struct TcpListener {
    net: Net,
    handle: ListenHandle,
    port: u16,
}

impl TcpListener {
    /// Listen on `port` with room for `backlog` connections waiting to be
    /// accepted (beyond it, SYN cookies answer).
    pub fn bind(net: &Net, port: u16, backlog: usize) -> io::Result<TcpListener> {
        let handle = net
            .lock()?
            .stack
            .tcp()
            .listen(port, backlog)
            .map_err(io_error)?;
        Ok(TcpListener {
            net: net.clone(),
            handle,
            port,
        })
    }

    /// The port listened on.
    pub fn local_port(&self) -> u16 {
        self.port
    }

    /// The next connection, once established.
    pub async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// Poll for the next established connection.
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(TcpStream, SocketAddr)>> {
        let mut inner = match self.net.lock() {
            Ok(i) => i,
            Err(e) => return Poll::Ready(Err(e)),
        };
        match inner.stack.tcp().accept(self.handle) {
            Ok(Some(h)) => {
                let remote = inner.stack.tcp_ref().info(h).map(|i| i.remote);
                drop(inner);
                let stream = TcpStream::from_handle(&self.net, h);
                match remote {
                    Some(r) => Poll::Ready(Ok((stream, r))),
                    None => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
                }
            }
            Ok(None) => {
                inner.wait(SocketRef::Listener(self.handle), Interest::Read, cx);
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(io_error(e))),
        }
    }
}

impl Drop for TcpListener {
    fn drop(&mut self) {
        if let Ok(mut inner) = self.net.lock() {
            inner.stack.tcp().unlisten(self.handle);
            inner.forget(SocketRef::Listener(self.handle));
        }
        self.net.kick();
    }
}

/// A TCP connection. Dropping it closes it (FIN after what was written;
/// a reset if received data was left unread, as on Linux).
#[derive(Debug)]
pub struct TcpStream {
    net: Net,
    handle: TcpHandle,
}

impl TcpStream {
    fn from_handle(net: &Net, handle: TcpHandle) -> TcpStream {
        TcpStream {
            net: net.clone(),
            handle,
        }
    }

    /// Open a connection to `remote` and wait for the handshake.
    pub async fn connect(net: &Net, remote: impl Into<SocketAddr>) -> io::Result<TcpStream> {
        let remote = remote.into();
        let h = {
            let mut inner = net.lock()?;
            let now = inner.now();
            inner.stack.tcp().connect(now, remote).map_err(io_error)?
        };
        net.kick();
        let stream = TcpStream::from_handle(net, h);
        poll_fn(|cx| stream.poll_connected(cx)).await?;
        Ok(stream)
    }

    fn poll_connected(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut inner = match self.net.lock() {
            Ok(i) => i,
            Err(e) => return Poll::Ready(Err(e)),
        };
        match inner.stack.tcp_ref().status(self.handle) {
            Ok(s) => match s.error {
                Some(e) => Poll::Ready(Err(io_error(StackError::Tcp(e)))),
                None if s.state.synchronized() => Poll::Ready(Ok(())),
                None if s.state == State::Closed => {
                    Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()))
                }
                None => {
                    inner.wait(SocketRef::Tcp(self.handle), Interest::Write, cx);
                    Poll::Pending
                }
            },
            Err(e) => Poll::Ready(Err(io_error(e))),
        }
    }

    /// The engine's handle of this connection (for `Net::with_stack`).
    pub fn handle(&self) -> TcpHandle {
        self.handle
    }

    /// The remote end.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        let inner = self.net.lock()?;
        (inner.stack.tcp_ref().info(self.handle))
            .map(|i| i.remote)
            .ok_or_else(|| io::ErrorKind::NotConnected.into())
    }

    /// The local end.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        let inner = self.net.lock()?;
        (inner.stack.tcp_ref().info(self.handle))
            .map(|i| i.local)
            .ok_or_else(|| io::ErrorKind::NotConnected.into())
    }

    /// Read into `buf`: at least one byte, or 0 at the end of the stream.
    pub fn poll_read_buf(&self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let mut inner = match self.net.lock() {
            Ok(i) => i,
            Err(e) => return Poll::Ready(Err(e)),
        };
        match inner.stack.tcp().recv(self.handle, buf) {
            Ok(0) => {}
            Ok(n) => {
                drop(inner);
                // Reading may open the window: the loop sends the update.
                self.net.kick();
                return Poll::Ready(Ok(n));
            }
            Err(e) => return Poll::Ready(Err(io_error(e))),
        }
        match inner.stack.tcp_ref().status(self.handle) {
            Ok(s) if s.eof || s.closed() => Poll::Ready(Ok(0)),
            Ok(_) => {
                inner.wait(SocketRef::Tcp(self.handle), Interest::Read, cx);
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(io_error(e))),
        }
    }

    /// Write from `buf`: at least one byte once there is room.
    pub fn poll_write_buf(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let mut inner = match self.net.lock() {
            Ok(i) => i,
            Err(e) => return Poll::Ready(Err(e)),
        };
        match inner.stack.tcp().send(self.handle, buf) {
            Ok(0) => {
                inner.wait(SocketRef::Tcp(self.handle), Interest::Write, cx);
                Poll::Pending
            }
            Ok(n) => {
                drop(inner);
                self.net.kick();
                Poll::Ready(Ok(n))
            }
            Err(e) => Poll::Ready(Err(io_error(e))),
        }
    }

    /// Close the sending side (FIN after what was written).
    pub fn shutdown(&self) -> io::Result<()> {
        let r = self.net.lock()?.stack.tcp().shutdown(self.handle);
        self.net.kick();
        r.map_err(io_error)
    }
}

impl Drop for TcpStream {
    fn drop(&mut self) {
        if let Ok(mut inner) = self.net.lock() {
            let now = inner.now();
            let _ = inner.stack.tcp().close(now, self.handle);
            inner.forget(SocketRef::Tcp(self.handle));
        }
        self.net.kick();
    }
}

impl futures_io::AsyncRead for TcpStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_read_buf(cx, buf)
    }
}

impl futures_io::AsyncWrite for TcpStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_buf(cx, buf)
    }

    /// Written bytes are in the stack's send ring already: nothing to flush.
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Sends FIN after what was written; reading stays possible.
    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.shutdown())
    }
}

#[cfg(feature = "tokio")]
impl tokio::io::AsyncRead for TcpStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.poll_read_buf(cx, buf.initialize_unfilled()) {
            Poll::Ready(Ok(n)) => {
                buf.advance(n);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(feature = "tokio")]
impl tokio::io::AsyncWrite for TcpStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_buf(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.shutdown())
    }
}

/// A UDP socket.
#[derive(Debug)]
pub struct UdpSocket {
    net: Net,
    handle: UdpHandle,
    port: u16,
}

impl UdpSocket {
    /// Bind to `port` (0 picks an ephemeral port).
    pub fn bind(net: &Net, port: u16) -> io::Result<UdpSocket> {
        let mut inner = net.lock()?;
        let handle = inner.stack.udp().bind(port).map_err(io_error)?;
        let port = inner.stack.udp_ref().local_port(handle).map_err(io_error)?;
        Ok(UdpSocket {
            net: net.clone(),
            handle,
            port,
        })
    }

    /// The port bound.
    pub fn local_port(&self) -> u16 {
        self.port
    }

    /// Send a datagram to `dst`, waiting while the send queue is full.
    pub async fn send_to(&self, buf: &[u8], dst: impl Into<SocketAddr>) -> io::Result<usize> {
        let dst = dst.into();
        poll_fn(|cx| self.poll_send_to(cx, buf, dst)).await
    }

    /// Receive a datagram (truncated to `buf`), its full length and source.
    pub async fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        poll_fn(|cx| self.poll_recv_from(cx, buf)).await
    }

    /// Poll to queue a datagram to `dst`.
    pub fn poll_send_to(
        &self,
        cx: &mut Context<'_>,
        buf: &[u8],
        dst: SocketAddr,
    ) -> Poll<io::Result<usize>> {
        let mut inner = match self.net.lock() {
            Ok(i) => i,
            Err(e) => return Poll::Ready(Err(e)),
        };
        match inner.stack.udp().send_to(self.handle, dst, buf) {
            Ok(()) => {
                drop(inner);
                self.net.kick();
                Poll::Ready(Ok(buf.len()))
            }
            Err(StackError::QueueFull) => {
                inner.wait(SocketRef::Udp(self.handle), Interest::Write, cx);
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(io_error(e))),
        }
    }

    /// Poll for the next datagram.
    pub fn poll_recv_from(
        &self,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<(usize, SocketAddr)>> {
        let mut inner = match self.net.lock() {
            Ok(i) => i,
            Err(e) => return Poll::Ready(Err(e)),
        };
        match inner.stack.udp().recv_from(self.handle, buf) {
            Ok(Some(got)) => Poll::Ready(Ok(got)),
            Ok(None) => {
                inner.wait(SocketRef::Udp(self.handle), Interest::Read, cx);
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(io_error(e))),
        }
    }
}

impl Drop for UdpSocket {
    fn drop(&mut self) {
        if let Ok(mut inner) = self.net.lock() {
            let _ = inner.stack.udp().close(self.handle);
            inner.forget(SocketRef::Udp(self.handle));
        }
    }
}
