//! A ustack socket's readiness levels (readable, writable, hang-up,
//! error), read from the stack: what `poll`, `select`, epoll and the
//! blocking calls wait for.

use ustack::socket::tcp::State as TcpState;

use ustack::Stack;

use crate::fd::{Kind, Sock};
use crate::share::access;

/// What a socket is ready for now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Level {
    pub readable: bool,
    pub writable: bool,
    /// The peer closed its side (EPOLLRDHUP).
    pub rdhup: bool,
    /// Both sides are closed (EPOLLHUP).
    pub hup: bool,
    /// An error is pending (EPOLLERR).
    pub err: bool,
}

/// The socket's readiness levels, from the stack.
pub fn level(sock: &Sock) -> Level {
    let Ok(acc) = access() else {
        return Level {
            err: true,
            hup: true,
            ..Level::default()
        };
    };
    let kind = *sock.kind.lock();
    let (pending_error, reported, shut_rd, shut_wr) = {
        let o = sock.opts.lock();
        (o.pending_error != 0, o.error_reported, o.shut_rd, o.shut_wr)
    };
    let r = acc.level_of(kind, sock.stream, reported);
    let mut l = r.ok().and_then(Result::ok).unwrap_or(Level {
        err: true,
        hup: true,
        ..Level::default()
    });
    l.err |= pending_error;
    // Zero-copy completions wait on the error queue (EPOLLERR, as Linux).
    crate::sock::zerocopy_refresh(sock);
    l.err |= sock.zc.lock().pending();
    // And transmit timestamps.
    crate::sock::timestamping_refresh(sock);
    l.err |= sock.ts.lock().pending();
    if shut_rd && matches!(kind, Kind::Stream { .. } | Kind::Dgram { .. }) {
        // Linux: a socket shut for reading reads end-of-stream at once
        // (EPOLLIN | EPOLLRDHUP); shut both ways, EPOLLHUP too.
        l.readable = true;
        l.rdhup = true;
        l.hup |= shut_wr;
    }
    l
}

/// What the stack says of a socket's readiness (before the options kept
/// here: a pending error, `shutdown`).
pub fn from_stack(s: &Stack, kind: Kind, stream: bool, reported: bool) -> Level {
    match kind {
        Kind::Fresh { .. } if stream => Level {
            // An unconnected TCP socket: Linux says POLLOUT | POLLHUP.
            writable: true,
            hup: true,
            ..Level::default()
        },
        Kind::Fresh { .. } => Level {
            writable: true,
            ..Level::default()
        },
        Kind::Listener { handle, .. } => Level {
            readable: s.tcp_ref().pending_accepts(handle).unwrap_or(0) > 0,
            ..Level::default()
        },
        Kind::Stream { handle, connecting } => match s.tcp_ref().status(handle) {
            Ok(st) => {
                let closed = st.closed();
                // Once reported, an error is no longer pending (POLLERR).
                let err = st.error.is_some() && !reported;
                // A Fast Open connect with a cookie is connected for the
                // program before its SYN leaves (with the first write).
                let connected =
                    st.state.synchronized() || (st.state == TcpState::SynSent && !connecting);
                Level {
                    readable: st.readable > 0 || st.eof || err || closed,
                    writable: (connected && st.writable > 0 && !closed) || err,
                    rdhup: st.eof || closed,
                    hup: closed || err || (st.eof && st.state == TcpState::Closed),
                    err,
                }
            }
            Err(_) => Level {
                readable: true,
                hup: true,
                err: true,
                ..Level::default()
            },
        },
        Kind::Dgram { handle, .. } => Level {
            readable: s
                .udp_ref()
                .pending(handle)
                .map(|p| p.0 > 0)
                .unwrap_or(false),
            // Linux's sock_writeable: under half the send buffer in use.
            writable: s
                .udp_ref()
                .tx_queued(handle)
                .map(|(queued, cap)| queued < cap / 2)
                .unwrap_or(true),
            ..Level::default()
        },
        Kind::Closed => Level {
            hup: true,
            ..Level::default()
        },
    }
}
