//! The errors the app API returns: one [`Error`] for every socket view,
//! with the detail of a failed RDMA verb in [`UdError`] and [`RcError`]
//! (the verbs transport returns those as well).

use serde::Serialize;

/// Errors the app API returns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
    /// The connection's sending side is closed (after `tcp().close` or in a
    /// closing state): no more data may be written.
    #[error("connection closed")]
    Closed,
    /// The connection ended abnormally (refused, reset, timed out, aborted).
    #[error(transparent)]
    Tcp(#[from] ConnError),
    /// An RDMA UD verb failed (the stack's RoCEv2 transport or verbs).
    #[error(transparent)]
    Ud(#[from] UdError),
    /// An RDMA RC verb failed.
    #[error(transparent)]
    Rc(#[from] RcError),
}

/// Why a connection ended abnormally.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, thiserror::Error)]
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
    /// An ICMP error said the network cannot be reached (net
    /// unreachable), ending a connection being opened, or reported when
    /// retransmissions then ran out (RFC 1122 4.2.3.9, RFC 5461).
    #[error("network is unreachable")]
    NetUnreachable,
    /// An ICMP error said the host cannot be reached (host unreachable,
    /// administratively prohibited, time exceeded), as `NetUnreachable`.
    #[error("no route to host")]
    HostUnreachable,
    /// An ICMP parameter problem or protocol unreachable about our
    /// segments, as `NetUnreachable`.
    #[error("protocol error")]
    ProtocolError,
}

/// Errors of the UD API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UdError {
    /// The handle names no QP (destroyed, or stale).
    #[error("no such queue pair")]
    InvalidQp,
    /// The QP number asked for in `QpConfig::qpn` is taken.
    #[error("QP number {0} is in use")]
    QpnInUse(u32),
    /// The QP number asked for is not in 2..=0xffffff (0 and 1 are the
    /// InfiniBand SMI and GSI QPs).
    #[error("QP number {0} is out of range (2..=0xffffff)")]
    BadQpn(u32),
    /// The send or receive queue holds its maximum of work requests (or no
    /// QP number is free).
    #[error("work queue full")]
    QueueFull,
    /// The message (first field, bytes) exceeds the transport's largest
    /// UD message (second field, bytes).
    #[error("message of {0} bytes exceeds the largest UD message ({1} bytes)")]
    TooLarge(usize, usize),
    /// The posted receive buffer (bytes) cannot even hold the GRH space.
    #[error("receive buffer of {0} bytes is smaller than the 40-byte GRH space")]
    BufferTooSmall(usize),
    /// No RDMA device on the host (verbs transport).
    #[error("no RDMA device")]
    NoDevice,
    /// The device cannot do what is asked (e.g. a port without an IPv4 GID).
    #[error("{0}")]
    Unsupported(&'static str),
    /// A verbs call failed.
    #[error("{op}: {msg}")]
    Device {
        /// The verbs operation that failed.
        op: &'static str,
        /// The OS error it reported.
        msg: String,
    },
}

/// Errors of the RC API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RcError {
    /// The handle names no QP or region.
    #[error("no such queue pair or memory region")]
    InvalidHandle,
    /// The QP number asked for is taken (by an RC or a UD QP).
    #[error("QP number {0} is in use")]
    QpnInUse(u32),
    /// The QP number asked for is not in 2..=0xffffff.
    #[error("QP number {0} is out of range (2..=0xffffff)")]
    BadQpn(u32),
    /// The path MTU asked for is not 256, 512, 1024, 2048 or 4096, or
    /// does not fit the link.
    #[error("path MTU {0} is not an InfiniBand MTU that fits the link")]
    BadMtu(usize),
    /// The work queue holds its maximum.
    #[error("work queue full")]
    QueueFull,
    /// The local bytes are not in a region with the access needed.
    #[error("local protection error: the bytes are not in a region that allows this")]
    LocalProtection,
    /// A READ or an atomic needs a region to land in, not inline data.
    #[error("an RDMA READ or atomic needs a memory region, not inline data")]
    InlineRead,
    /// An atomic's local bytes are not exactly 8, or its remote address is
    /// not 8-byte aligned.
    #[error("an atomic works on 8 bytes at an 8-byte aligned address")]
    AtomicShape,
    /// The message exceeds 2^31 bytes.
    #[error("message of {0} bytes exceeds the RC limit of 2^31")]
    TooLarge(usize),
    /// The QP is in the error state.
    #[error("queue pair is in the error state")]
    QpError,
    /// The QP is not in the state the call needs (connect twice).
    #[error("queue pair is not in INIT")]
    BadState,
    /// No memory for the region.
    #[error("cannot register a memory region")]
    NoMemory,
}
