//! The errors the app API returns.

use serde::Serialize;

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
    Tcp(#[from] ConnError),
}

/// Why a connection ended abnormally.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, thiserror::Error)]
pub enum ConnError {
    /// The peer answered our SYN with a RST (nothing listens there), or
    /// reset the connection before the handshake completed.
    #[error("connection refused")]
    Refused,
    /// The peer reset an established connection (an RST exactly at
    /// `rcv_nxt`, RFC 5961 §3).
    #[error("connection reset by peer")]
    Reset,
    /// Retransmissions ran out (`syn_retries` for the handshake,
    /// `max_retries` for data), or an orphaned connection waited longer
    /// than `fin_wait2_timeout` for the peer's FIN.
    #[error("connection timed out")]
    TimedOut,
    /// We ended it: the app aborted, or closed with data unread or arriving
    /// after close (RFC 1122 4.2.2.13), and a RST went out.
    #[error("connection aborted")]
    Aborted,
}
