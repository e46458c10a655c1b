//! The error the app API returns.

/// Errors the app API returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("address or identifier already in use")]
    AddrInUse,
    #[error("no free port")]
    NoFreePort,
    #[error("no such socket")]
    InvalidHandle,
    #[error("send queue full")]
    QueueFull,
    #[error("message too large")]
    TooLarge,
    #[error("no route to host")]
    NoRoute,
    #[error("connection closed")]
    Closed,
    #[error(transparent)]
    Tcp(#[from] crate::tcp::ConnError),
}
