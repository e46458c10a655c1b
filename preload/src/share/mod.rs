//! One stack for a process and the processes it forks.
//!
//! The process that started the stack (the owner) runs it, as before: its
//! socket calls act on the stack directly. When it forks, the child becomes
//! a *client* of the owner: every step of a socket call that touches the
//! stack (a receive, a send, an accept, a status look) goes to the owner
//! over a channel of the child's own (a `SOCK_SEQPACKET` socketpair made at
//! the fork), where one thread runs it on the stack and answers
//! ([`server`]). Everything else of the call (the POSIX semantics, blocking,
//! timeouts, signals) runs in the child as in the owner: a ustack socket's
//! descriptor is an eventfd, the same kernel object in every process that
//! holds it, and the owner's loop writes it on the socket's readiness, so a
//! child blocks on it in the kernel and a signal interrupts it.
//!
//! A socket lives in the stack while any process holds a descriptor to it:
//! the owner counts which sockets each client holds (all of its parent's at
//! the fork, then those it opens or accepts, less those it closes), and a
//! client that exits or is killed lets go of all of its at once (its
//! channel hangs up), as the kernel closes a dead process's descriptors.
//!
//! [`Access`] is the one way the socket calls reach the stack: `Local` in
//! the owner, `Remote` in a client. Each stack operation is written once, in
//! the [`stack_ops!`] list below: the owner runs it in place, a client
//! sends it ([`Op`]) and the owner's server runs the same body.

pub mod chan;
pub mod exec;
pub mod rights;
pub mod server;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use ustack::Error as StackError;
use ustack::events::SocketRef;
use ustack::socket::tcp::{
    ConnError, ConnInfo, ConnTimes, Family, KeepAlive, ListenHandle, TcpHandle, TcpStatus,
    TxStampKind,
};
use ustack::socket::udp::{UdpHandle, UdpReuse};
use ustack_runtime::Net;

use crate::fd::Kind;
use crate::level::Level;
use crate::real::Res;

/// An engine error as it crosses a channel (the RDMA errors, which no
/// socket call meets, travel as `Other`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub enum WireErr {
    AddrInUse,
    NoFreePort,
    InvalidHandle,
    QueueFull,
    TooLarge,
    NoRoute,
    Closed,
    Tcp(ConnError),
    Other,
}

impl From<StackError> for WireErr {
    fn from(e: StackError) -> Self {
        match e {
            StackError::AddrInUse => WireErr::AddrInUse,
            StackError::NoFreePort => WireErr::NoFreePort,
            StackError::InvalidHandle => WireErr::InvalidHandle,
            StackError::QueueFull => WireErr::QueueFull,
            StackError::TooLarge => WireErr::TooLarge,
            StackError::NoRoute => WireErr::NoRoute,
            StackError::Closed => WireErr::Closed,
            StackError::Tcp(c) => WireErr::Tcp(c),
            StackError::Ud(_) | StackError::Rc(_) => WireErr::Other,
        }
    }
}

impl From<WireErr> for StackError {
    fn from(e: WireErr) -> Self {
        match e {
            WireErr::AddrInUse => StackError::AddrInUse,
            WireErr::NoFreePort => StackError::NoFreePort,
            WireErr::InvalidHandle => StackError::InvalidHandle,
            WireErr::QueueFull => StackError::QueueFull,
            WireErr::TooLarge => StackError::TooLarge,
            WireErr::NoRoute => StackError::NoRoute,
            WireErr::Closed => StackError::Closed,
            WireErr::Tcp(c) => StackError::Tcp(c),
            WireErr::Other => StackError::Ud(ustack::error::UdError::Unsupported(
                "an RDMA error crossed a shared stack's channel",
            )),
        }
    }
}

/// How a socket call reaches the stack.
#[derive(Debug, Clone, Copy)]
pub enum Access {
    /// This process runs the stack.
    Local(&'static Net),
    /// The stack is another process's (this one was forked from it).
    Remote(&'static Client),
}

/// The stack for this process's socket calls: its own, or the owner's
/// through this client's channel; EBADF when neither.
pub fn access() -> Res<Access> {
    if let Some(s) = crate::state::state() {
        return Ok(Access::Local(&s.net));
    }
    client().map(Access::Remote).ok_or(libc::EBADF)
}

/// A lost channel or a stopped loop, as the socket calls report it.
fn gone(_: std::io::Error) -> libc::c_int {
    libc::EIO
}

/// Run `$body` on the stack of `$net`, with `$s` the stack (`&mut` for
/// `with`, `&` for `peek` and `peek_timed`) and `$now` the loop's time
/// (none for `peek`).
macro_rules! on_stack {
    (with, $net:expr, $s:ident, $now:ident, $body:expr) => {{
        let $now = $net.now();
        let _ = $now;
        $net.with_stack(|$s| $body)
    }};
    (peek, $net:expr, $s:ident, $now:ident, $body:expr) => {{
        // A look needs no time: no clock read on the readiness path.
        let $now = ();
        let _ = $now;
        $net.peek_stack(|$s| $body)
    }};
    (peek_timed, $net:expr, $s:ident, $now:ident, $body:expr) => {{
        // A look that reports ages: the loop's time, read once.
        let $now = $net.now();
        $net.peek_stack(|$s| $body)
    }};
}

/// The stack operations of the socket calls, each written once: the
/// [`Op`] a client sends, the [`Access`] method the socket calls use, and
/// the owner's side of it ([`run_op`]). A body gives a
/// `Result<T, ustack::Error>`; the method gives `Res<Result<T, ustack::Error>>`
/// (the outer error: the stack or the channel is gone).
macro_rules! stack_ops {
    ($($(#[$doc:meta])* $name:ident($($a:ident: $t:ty),*) -> $r:ty = $mode:ident |$s:ident, $now:ident| $body:expr;)*) => {
        /// A stack operation a client asks the owner for.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Serialize, Deserialize)]
        pub enum Op {
            $($(#[$doc])* $name { $($a: $t),* },)*
            /// Watch a socket the client made: its eventfd comes with the
            /// message; the client holds it from now on.
            watch { r: SocketRef },
            /// The client's last descriptor of a socket closed (with
            /// `SO_LINGER` 0: an abort).
            release { r: SocketRef, linger0: bool },
            /// The client forks: the new channel's far end comes with the
            /// message, for the child, which holds what the client holds.
            fork {},
            /// The client exec'd (a new program in the same process, on
            /// the same channel): it holds `keep` still, and nothing else.
            exec { keep: Vec<SocketRef> },
            /// The client's process id (for the holders telemetry shows).
            hello { pid: u32 },
            /// The client passes a socket (`r`, None for one not in the
            /// stack yet) to another process: it is in flight under its
            /// eventfd's `id`, rebuilt from `carried` by the receiver.
            lend { r: Option<SocketRef>, id: u64, carried: Vec<u8> },
            /// The client received the socket lent under `id` (`undo`:
            /// its own pass failed): what it was, now the client's.
            claim { id: u64, undo: bool },
        }

        impl Access {
            $($(#[$doc])*
            #[allow(clippy::unused_unit)]
            pub fn $name(self, $($a: $t),*) -> Res<Result<$r, StackError>> {
                match self {
                    Access::Local(net) => on_stack!($mode, net, $s, $now, {
                        let r: Result<$r, StackError> = $body;
                        r
                    }).map_err(gone),
                    Access::Remote(c) => c.call(&Op::$name { $($a),* }, None),
                }
            })*
        }

        /// The owner runs a client's operation: the encoded answer, or
        /// None for the operations the server handles itself.
        fn run_op(net: &Net, op: Op) -> Option<Vec<u8>> {
            match op {
                $(Op::$name { $($a),* } => {
                    let r: Result<Result<$r, WireErr>, WireErr> = on_stack!($mode, net, $s, $now, {
                        let r: Result<$r, StackError> = $body;
                        r
                    })
                        .map(|r| r.map_err(WireErr::from))
                        .map_err(|_| WireErr::Other);
                    Some(postcard::to_stdvec(&r).unwrap_or_default())
                })*
                Op::watch { .. }
                | Op::release { .. }
                | Op::fork {}
                | Op::exec { .. }
                | Op::hello { .. }
                | Op::lend { .. }
                | Op::claim { .. } => None,
            }
        }
    };
}

stack_ops! {
    /// The stack's IPv4 address.
    ip4() -> Ipv4Addr = peek |s, now| Ok(s.ip());
    /// Whether an address is the stack's.
    owns(ip: IpAddr) -> bool = peek |s, now| Ok(s.owns(ip));
    /// The stack's IPv6 addresses.
    ipv6_addrs() -> Vec<Ipv6Addr> = peek |s, now| Ok(s.ipv6_addrs());
    /// Whether IPv6 is on.
    ipv6_on() -> bool = peek |s, now| Ok(s.ipv6_on());
    /// Bind a UDP socket: its handle and port.
    udp_bind(port: u16, reuse: UdpReuse, fam: Family) -> (UdpHandle, u16) = with |s, now| {
        let h = s.udp().bind_family(port, reuse, fam)?;
        Ok((h, s.udp_ref().local_port(h)?))
    };
    /// Bind a UDP socket and set its peer.
    udp_rebind(port: u16, reuse: UdpReuse, fam: Family, peer: Option<SocketAddr>) -> UdpHandle = with |s, now| {
        let h = s.udp().bind_family(port, reuse, fam)?;
        s.udp().connect(h, peer).map(|()| h)
    };
    /// Set a UDP socket's peer.
    udp_connect(h: UdpHandle, peer: Option<SocketAddr>) -> () = with |s, now| s.udp().connect(h, peer);
    /// Listen on a port.
    tcp_listen(port: u16, backlog: usize, fam: Family) -> ListenHandle = with |s, now| {
        s.tcp().listen_family(port, backlog, fam)
    };
    /// Listen on a free port from 49152 up, as the kernel picks one.
    tcp_listen_any(backlog: usize, fam: Family) -> (ListenHandle, u16) = with |s, now| {
        (49_152..=u16::MAX)
            .find_map(|p| s.tcp().listen_family(p, backlog, fam).ok().map(|h| (h, p)))
            .ok_or(StackError::NoFreePort)
    };
    /// TCP Fast Open's queue on a listener (0: off).
    tcp_fast_open(l: ListenHandle, queue: usize) -> () = with |s, now| s.tcp().set_fast_open(l, queue);
    /// The next connection on a listener, and its peer.
    tcp_accept(l: ListenHandle) -> Option<(TcpHandle, SocketAddr)> = with |s, now| {
        let h = s.tcp().accept(l)?;
        Ok(h.and_then(|h| Some((h, s.tcp_ref().info(h)?.remote))))
    };
    /// Open a connection (from `port`, or an ephemeral one for 0); by TCP
    /// Fast Open when asked (true with it: a cookie was kept, the SYN
    /// waits for the first write).
    tcp_connect(port: u16, remote: SocketAddr, mss: Option<usize>, fast_open: bool) -> (TcpHandle, bool) = with |s, now| {
        let h = match port {
            0 => s.tcp().connect(now, remote),
            p => s.tcp().connect_from(now, p, remote),
        }?;
        // TCP_MAXSEG set before: the SYN (not yet sent) announces it.
        if let Some(m) = mss {
            s.tcp().set_max_segment(h, m)?;
        }
        let deferred = fast_open && s.tcp().fast_open_connect(h)?;
        Ok((h, deferred))
    };
    /// Transmit timestamps of the last byte queued (`SO_TIMESTAMPING`).
    tcp_stamp(h: TcpHandle, key: u32, sent: bool, acked: bool) -> () = with |s, now| {
        s.tcp().stamp_last_byte(h, now, key, sent, acked)
    };
    /// The transmit timestamps taken (key, whether a send stamp, when in
    /// the stack's nanoseconds), and the stack's time now.
    tcp_take_stamps(h: TcpHandle) -> (Vec<(u32, bool, u64)>, u64) = with |s, now| {
        let v = s.tcp().take_tx_stamps(h)?;
        let v = v.iter().map(|x| (x.key, x.kind == TxStampKind::Sent, x.at.as_nanos()));
        Ok((v.collect(), now.as_nanos()))
    };
    /// An event on every acknowledgment (zero-copy completions).
    tcp_ack_events(h: TcpHandle) -> () = with |s, now| s.tcp().set_ack_events(h, true);
    /// TCP_MAXSEG on a connection.
    tcp_max_segment(h: TcpHandle, mss: usize) -> () = with |s, now| s.tcp().set_max_segment(h, mss);
    /// TCP_MAXSEG on a listener.
    tcp_listener_max_segment(l: ListenHandle, mss: usize) -> () = with |s, now| s.tcp().set_listener_max_segment(l, mss);
    /// A connection's status.
    tcp_status(h: TcpHandle) -> TcpStatus = peek |s, now| s.tcp_ref().status(h);
    /// A connection's two ends.
    tcp_ends(h: TcpHandle) -> Option<(SocketAddr, SocketAddr)> = peek |s, now| {
        Ok(s.tcp_ref().info(h).map(|i| (i.local, i.remote)))
    };
    /// Copy up to `len` received bytes without taking them.
    tcp_peek(h: TcpHandle, len: usize) -> (Vec<u8>, Option<TcpStatus>) = peek |s, now| {
        let mut copy = vec![0; len];
        let got = s.tcp_ref().peek(h, &mut copy)?;
        copy.truncate(got);
        Ok((copy, s.tcp_ref().status(h).ok()))
    };
    /// Take up to `len` received bytes.
    tcp_recv(h: TcpHandle, len: usize) -> (Vec<u8>, Option<TcpStatus>) = with |s, now| {
        let mut buf = vec![0; len];
        let got = s.tcp().recv(h, &mut buf)?;
        buf.truncate(got);
        Ok((buf, s.tcp_ref().status(h).ok()))
    };
    /// Queue bytes to send: how many fit; with `more` (`MSG_MORE`) the
    /// tail is held.
    tcp_send(h: TcpHandle, data: Vec<u8>, more: bool) -> usize = with |s, now| {
        s.tcp().set_more(h, more)?;
        s.tcp().send(h, &data)
    };
    /// Send what is queued now past cork and Nagle (`TCP_NODELAY` set).
    tcp_push(h: TcpHandle) -> () = with |s, now| s.tcp().push(h);
    /// End a record after what is queued (`MSG_EOR`).
    tcp_end_record(h: TcpHandle) -> () = with |s, now| s.tcp().end_record(h);
    /// Shut the sending side (FIN).
    tcp_shutdown(h: TcpHandle) -> () = with |s, now| s.tcp().shutdown(h);
    /// Apply a connection's options.
    tcp_opts(h: TcpHandle, nodelay: bool, cork: bool, keepalive: Option<KeepAlive>, user_timeout: Option<Duration>) -> () = with |s, now| {
        let _ = s.tcp().set_nodelay(h, nodelay);
        let _ = s.tcp().set_cork(h, cork);
        let _ = s.tcp().set_keepalive(now, h, keepalive);
        let _ = s.tcp().set_user_timeout(h, user_timeout);
        Ok(())
    };
    /// Take the next datagram (at most `len` bytes of it): its bytes, its
    /// whole length and its source.
    udp_recv(h: UdpHandle, len: usize, peek: bool) -> Option<(Vec<u8>, usize, SocketAddr)> = with |s, now| {
        let mut buf = vec![0; len];
        let got = if peek { s.udp_ref().peek_from(h, &mut buf)? } else { s.udp().recv_from(h, &mut buf)? };
        Ok(got.map(|(full, from)| {
            buf.truncate(full.min(len));
            (buf, full, from)
        }))
    };
    /// Send one datagram.
    udp_send(h: UdpHandle, dst: SocketAddr, data: Vec<u8>) -> () = with |s, now| s.udp().send_to(h, dst, &data);
    /// Datagrams queued to read, and the next one's length.
    udp_pending(h: UdpHandle) -> (usize, Option<usize>) = peek |s, now| s.udp_ref().pending(h);
    /// Bytes queued to send, and the queue's size.
    udp_tx_queued(h: UdpHandle) -> (usize, usize) = peek |s, now| s.udp_ref().tx_queued(h);
    /// A connection's state (TCP_INFO, TCP_MAXSEG, SIOCOUTQ).
    tcp_conn_info(h: TcpHandle) -> Option<ConnWire> = peek |s, now| {
        Ok(s.tcp_ref().info(h).map(|i| ConnWire::from(&i)))
    };
    /// A connection's state with its times (TCP_INFO: one call, as a
    /// signal handler may make it every few hundred microseconds), on
    /// the owner's clock.
    tcp_conn_info_timed(h: TcpHandle) -> Option<(ConnWire, ConnTimes)> = peek_timed |s, now| {
        let tcp = s.tcp_ref();
        Ok(tcp.info(h).zip(tcp.times(h, now)).map(|(i, t)| (ConnWire::from(&i), t)))
    };
    /// What the stack says of a socket's readiness.
    level_of(kind: Kind, stream: bool, reported: bool) -> Level = peek |s, now| {
        Ok(crate::level::from_stack(s, kind, stream, reported))
    };
}

/// What of a connection's state crosses a channel (`ConnInfo` less its
/// congestion control's name and the counters no socket option reads).
#[derive(Debug, Serialize, Deserialize)]
pub struct ConnWire {
    local: SocketAddr,
    remote: SocketAddr,
    state: ustack::socket::tcp::State,
    cwnd: usize,
    ssthresh: usize,
    snd_wnd: usize,
    rcv_wnd: usize,
    srtt_us: Option<u64>,
    rttvar_us: Option<u64>,
    rto_us: u64,
    in_flight: usize,
    send_queued: usize,
    recv_queued: usize,
    ooo_bytes: usize,
    mss: usize,
    /// segs_in, segs_out, bytes_in, bytes_out, retransmits.
    counts: [u64; 5],
    /// Timestamps, SACK, in recovery, data taken from the SYN, ECN on,
    /// ECN-capable segments seen.
    flags: [bool; 6],
    ca_state: ustack::socket::tcp::CaState,
    wscale: (u8, u8),
    max_payload: usize,
    /// Lost, SACKed and retransmitted bytes, the reordering degree and
    /// how often it was seen.
    recovery: [usize; 5],
}

impl From<&ConnInfo> for ConnWire {
    fn from(i: &ConnInfo) -> Self {
        let c = &i.stats;
        ConnWire {
            local: i.local,
            remote: i.remote,
            state: i.state,
            cwnd: i.cwnd,
            ssthresh: i.ssthresh,
            snd_wnd: i.snd_wnd,
            rcv_wnd: i.rcv_wnd,
            srtt_us: i.srtt_us,
            rttvar_us: i.rttvar_us,
            rto_us: i.rto_us,
            in_flight: i.in_flight,
            send_queued: i.send_queued,
            recv_queued: i.recv_queued,
            ooo_bytes: i.ooo_bytes,
            mss: i.mss,
            counts: [
                c.segs_in,
                c.segs_out,
                c.bytes_in,
                c.bytes_out,
                c.retransmits,
            ],
            flags: [
                i.timestamps,
                i.sack,
                i.recovering,
                i.syn_data,
                i.ecn,
                i.ecn_seen,
            ],
            ca_state: i.ca_state,
            wscale: i.wscale,
            max_payload: i.max_payload,
            recovery: [
                i.lost,
                i.sacked,
                i.retrans,
                i.reordering,
                i.reord_seen as usize,
            ],
        }
    }
}

impl From<ConnWire> for ConnInfo {
    fn from(w: ConnWire) -> Self {
        let [segs_in, segs_out, bytes_in, bytes_out, retransmits] = w.counts;
        let [timestamps, sack, recovering, syn_data, ecn, ecn_seen] = w.flags;
        let [lost, sacked, retrans, reordering, reord_seen] = w.recovery;
        ConnInfo {
            local: w.local,
            remote: w.remote,
            state: w.state,
            cwnd: w.cwnd,
            ssthresh: w.ssthresh,
            snd_wnd: w.snd_wnd,
            rcv_wnd: w.rcv_wnd,
            srtt_us: w.srtt_us,
            rttvar_us: w.rttvar_us,
            rto_us: w.rto_us,
            in_flight: w.in_flight,
            send_queued: w.send_queued,
            recv_queued: w.recv_queued,
            ooo_bytes: w.ooo_bytes,
            mss: w.mss,
            congestion: "",
            timestamps,
            sack,
            wscale: w.wscale,
            recovering,
            ca_state: w.ca_state,
            ecn,
            ecn_seen,
            lost,
            sacked,
            retrans,
            reordering,
            reord_seen: u32::try_from(reord_seen).unwrap_or(u32::MAX),
            max_payload: w.max_payload,
            syn_data,
            stats: ustack::stats::ConnStats {
                segs_in,
                segs_out,
                bytes_in,
                bytes_out,
                retransmits,
                ..Default::default()
            },
        }
    }
}

/// A client's channel to the owner: one call at a time (a call never
/// waits on the stack: the owner answers at once).
#[derive(Debug)]
pub struct Client {
    fd: std::os::fd::RawFd,
    /// The process the channel is this one's in (a child made by `vfork`
    /// or a raw `clone`, which no fork handler sees, shares its parent's
    /// memory or a copy of it, but not its channel).
    pid: u32,
    /// Held for a call: one at a time on the channel.
    chan: Mutex<()>,
}

impl Client {
    /// Send `op` (with a descriptor, for [`Op::watch`] and [`Op::fork`])
    /// and read the answer.
    pub fn call<T: serde::de::DeserializeOwned>(
        &self,
        op: &Op,
        fd: Option<std::os::fd::RawFd>,
    ) -> Res<Result<T, StackError>> {
        let msg = postcard::to_stdvec(op).map_err(|_| libc::EINVAL)?;
        // Signals wait for the end of the call (the owner answers at
        // once): a handler that makes a socket call of its own would
        // otherwise come back in here, on a channel that is mid-call.
        let blocked = crate::signals::Held::new();
        let turn = self.chan.lock();
        let reply = chan::call(self.fd, &msg, fd);
        drop(turn);
        drop(blocked);
        let reply = reply?;
        let r: Result<Result<T, WireErr>, WireErr> =
            postcard::from_bytes(&reply).map_err(|_| libc::EIO)?;
        match r {
            Ok(r) => Ok(r.map_err(StackError::from)),
            Err(_) => Err(libc::EIO),
        }
    }

    /// Tell the owner about a socket this process made, and watch it.
    pub fn watch(&self, r: SocketRef, eventfd: std::os::fd::RawFd) {
        let _ = self.call::<()>(&Op::watch { r }, Some(eventfd));
    }

    /// This process's last descriptor of the socket `r` closed.
    pub fn release(&self, r: SocketRef, linger0: bool) {
        let _ = self.call::<()>(&Op::release { r, linger0 }, None);
    }
}

/// This process's channel to the owner (a forked child; null: none). A
/// child's is new at each fork (leaked: one small value per fork), so a
/// lock another thread of the parent held at the fork is never its.
static CLIENT: AtomicPtr<Client> = AtomicPtr::new(std::ptr::null_mut());

/// This process's client, when the stack is another process's.
pub fn client() -> Option<&'static Client> {
    let p = CLIENT.load(Ordering::Acquire);
    // SAFETY: null, or a Client leaked by `after_fork_child`, never freed.
    unsafe { p.as_ref() }
}

/// Whether this process is a client of another's stack.
pub fn is_client() -> bool {
    client().is_some()
}

/// The ends of the channel a fork in progress makes: (this side's copy of
/// the owner's end, the child's end).
static FORKING: Mutex<Option<(std::os::fd::RawFd, std::os::fd::RawFd)>> = Mutex::new(None);

/// Before `fork`: make the child's channel, and register it with the
/// owner (this process's server, or through this client's channel), the
/// child holding what this process holds. Returns false when there is no
/// stack to share.
pub fn before_fork() -> bool {
    let Ok((ours, theirs)) = chan::pair() else {
        return false;
    };
    let registered = if let Some(s) = crate::state::state() {
        server::add_child(&s.net, ours).is_ok()
    } else if let Some(c) = client() {
        let ok = c.call::<()>(&Op::fork {}, Some(ours)).is_ok();
        chan::close(ours);
        ok
    } else {
        false
    };
    if !registered {
        chan::close(ours);
        chan::close(theirs);
        return false;
    }
    *FORKING.lock() = Some((ours, theirs));
    true
}

/// After `fork`, in the parent: the child's end is the child's.
pub fn after_fork_parent() {
    if let Some((_, theirs)) = FORKING.lock().take() {
        chan::close(theirs);
    }
}

/// After `fork`, in the child: its channel to the owner is the one just
/// made; whatever of the parent's server and channel it inherited is
/// closed.
pub fn after_fork_child() {
    let Some((_, theirs)) = FORKING.lock().take() else {
        return;
    };
    server::forget_after_fork();
    if let Some(c) = client() {
        // The parent's channel (its lock may be held by a thread that is
        // not here): closed without it.
        chan::close(c.fd);
    }
    become_client(theirs);
}

/// This process handed its stack to a keeper (before an exec,
/// `lifecycle::hand_over_for_exec`): the server's descriptors here are
/// the keeper's copies; from now on this process is its client over
/// `fd`, holding what it held.
pub fn after_hand_over(fd: std::os::fd::RawFd) {
    server::forget_after_fork();
    become_client(fd);
}

/// Join the stack another process runs under the claim `name` (another
/// process of the program, or of a program joined by `--stack`): true
/// when this process is its client now. The owner listens a moment after
/// it takes the claim: a refused connection is tried again for up to 2 s.
pub fn join(name: &str) -> bool {
    let (addr, len) = server::join_addr(name);
    for _ in 0..200 {
        // SAFETY: the C library's socket.
        let fd = unsafe {
            (crate::real::real().socket)(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            return false;
        }
        // SAFETY: `addr` is a sockaddr_un valid for `len` bytes.
        let r = unsafe {
            (crate::real::real().connect)(fd, (&addr as *const libc::sockaddr_un).cast(), len)
        };
        if r == 0 {
            become_client(chan::high(fd));
            return true;
        }
        let e = crate::real::errno();
        chan::close(fd);
        if e != libc::ECONNREFUSED && e != libc::EAGAIN {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// From now on this process is a client of the owner over channel `fd`.
fn become_client(fd: std::os::fd::RawFd) {
    crate::own::set_channel(fd);
    crate::fd::set_shared();
    let new = Box::leak(Box::new(Client {
        fd,
        pid: std::process::id(),
        chan: Mutex::new(()),
    }));
    CLIENT.store(new, Ordering::Release);
    let _ = new.call::<()>(&Op::hello { pid: new.pid }, None);
}

/// The most data one call carries over a channel.
const CHUNK: usize = 64 * 1024;

/// The data path: in the owner straight between the caller's buffers and
/// the stack's rings (no copy more than before), in a client through the
/// channel (at most [`CHUNK`] bytes a call).
impl Access {
    /// Take received bytes into `bufs` (in order): how many, and the
    /// connection's status after.
    pub fn tcp_recv_into(
        self,
        h: TcpHandle,
        bufs: &mut [&mut [u8]],
    ) -> Res<Result<(usize, Option<TcpStatus>), StackError>> {
        match self {
            Access::Local(net) => net
                .with_stack(|s| {
                    let mut got = 0;
                    for b in bufs.iter_mut() {
                        let n = match s.tcp().recv(h, b) {
                            Ok(n) => n,
                            Err(e) if got == 0 => return Err(e),
                            Err(_) => 0,
                        };
                        got += n;
                        if n < b.len() {
                            break;
                        }
                    }
                    Ok((got, s.tcp_ref().status(h).ok()))
                })
                .map_err(gone),
            Access::Remote(_) => {
                let want = bufs.iter().map(|b| b.len()).sum::<usize>().min(CHUNK);
                Ok(self.tcp_recv(h, want)?.map(|(d, st)| {
                    crate::sock::scatter(&d, bufs);
                    (d.len(), st)
                }))
            }
        }
    }

    /// Copy received bytes into `bufs` without taking them.
    pub fn tcp_peek_into(
        self,
        h: TcpHandle,
        bufs: &mut [&mut [u8]],
    ) -> Res<Result<(usize, Option<TcpStatus>), StackError>> {
        let want = bufs.iter().map(|b| b.len()).sum::<usize>();
        let r = match self {
            Access::Local(_) => self.tcp_peek(h, want)?,
            Access::Remote(_) => self.tcp_peek(h, want.min(CHUNK))?,
        };
        Ok(r.map(|(d, st)| {
            crate::sock::scatter(&d, bufs);
            (d.len(), st)
        }))
    }

    /// Queue the bytes of `bufs` after the first `skip`: how many fit;
    /// with `more` (`MSG_MORE`) the stack holds the tail.
    pub fn tcp_send_from(
        self,
        h: TcpHandle,
        bufs: &[&[u8]],
        skip: usize,
        more: bool,
    ) -> Res<Result<usize, StackError>> {
        match self {
            Access::Local(net) => net
                .with_stack(|s| {
                    s.tcp().set_more(h, more)?;
                    let mut n = 0;
                    let mut skip = skip;
                    for b in bufs {
                        if skip >= b.len() {
                            skip -= b.len();
                            continue;
                        }
                        let k = s.tcp().send(h, &b[skip..])?;
                        skip = 0;
                        n += k;
                        if k < b.len() {
                            break;
                        }
                    }
                    Ok(n)
                })
                .map_err(gone),
            Access::Remote(_) => {
                let mut data = Vec::new();
                let mut skip = skip;
                for b in bufs {
                    if skip >= b.len() {
                        skip -= b.len();
                        continue;
                    }
                    let room = CHUNK - data.len();
                    let part = &b[skip..];
                    data.extend_from_slice(&part[..part.len().min(room)]);
                    skip = 0;
                    if data.len() == CHUNK {
                        break;
                    }
                }
                self.tcp_send(h, data, more)
            }
        }
    }

    /// The next datagram into `buf` (taken, or copied with `peek`): its
    /// whole length and source.
    pub fn udp_recv_into(
        self,
        h: UdpHandle,
        buf: &mut [u8],
        peek: bool,
    ) -> Res<Result<Option<(usize, SocketAddr)>, StackError>> {
        match self {
            Access::Local(net) if peek => net
                .peek_stack(|s| s.udp_ref().peek_from(h, buf))
                .map_err(gone),
            Access::Local(net) => net.with_stack(|s| s.udp().recv_from(h, buf)).map_err(gone),
            Access::Remote(_) => Ok(self.udp_recv(h, buf.len(), peek)?.map(|got| {
                got.map(|(d, full, from)| {
                    buf[..d.len()].copy_from_slice(&d);
                    (full, from)
                })
            })),
        }
    }

    /// Send one datagram.
    pub fn udp_send_to(
        self,
        h: UdpHandle,
        dst: SocketAddr,
        data: &[u8],
    ) -> Res<Result<(), StackError>> {
        match self {
            Access::Local(net) => net
                .with_stack(|s| s.udp().send_to(h, dst, data))
                .map_err(gone),
            Access::Remote(_) => self.udp_send(h, dst, data.to_vec()),
        }
    }

    /// The socket's last descriptor here closed: in the owner, close it in
    /// the stack (FIN, or RST with `SO_LINGER` 0; a listener leaves the
    /// port); in a client, let the owner know (it closes the socket when
    /// no process holds it any more).
    pub fn close_ref(self, r: SocketRef, linger0: bool) {
        match self {
            Access::Local(net) => {
                let now = net.now();
                let _ = net.with_stack(|s| match r {
                    SocketRef::Tcp(h) if linger0 => {
                        let _ = s.tcp().abort(h);
                    }
                    SocketRef::Tcp(h) => {
                        let _ = s.tcp().close(now, h);
                    }
                    SocketRef::Listener(h) => s.tcp().unlisten(h),
                    SocketRef::Udp(h) => {
                        let _ = s.udp().close(h);
                    }
                    SocketRef::Ping(_) | SocketRef::RcQp(_) => {}
                });
                net.unwatch(r);
            }
            Access::Remote(c) => c.release(r, linger0),
        }
    }
}
