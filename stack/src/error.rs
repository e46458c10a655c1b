//! The error the app API returns.

/// Errors the app API returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The port (TCP listener, UDP socket), echo identifier or UD QP number
    /// is already taken on this stack.
    #[error("address or identifier already in use")]
    AddrInUse,
    /// No ephemeral port (or QP number) is free, or port 0 was given
    /// where a real one is needed (listen).
    #[error("no free port")]
    NoFreePort,
    /// The handle names no socket: closed already, or stale (its slot was
    /// reused; handles carry a generation).
    #[error("no such socket")]
    InvalidHandle,
    /// The socket's send queue is full, or no transmit buffer was free;
    /// retry after the next poll (or a WRITABLE event).
    #[error("send queue full")]
    QueueFull,
    /// The message exceeds what the protocol or path carries (UDP or echo
    /// payload beyond one IPv4 datagram, a UD message beyond the path MTU,
    /// a packet that must not be fragmented beyond the MTU).
    #[error("message too large")]
    TooLarge,
    /// No route: the destination is ourselves or 0.0.0.0, or off-link
    /// with no gateway configured.
    #[error("no route to host")]
    NoRoute,
    /// The connection's sending side is closed (after `tcp_close` or in a
    /// closing state): no more data may be written.
    #[error("connection closed")]
    Closed,
    /// The connection ended abnormally (refused, reset, timed out, aborted).
    #[error(transparent)]
    Tcp(#[from] crate::socket::tcp::ConnError),
}
