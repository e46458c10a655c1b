//! `setsockopt` and `getsockopt` on ustack sockets: the options programs
//! set, kept per socket and applied to the connection where the stack acts
//! on them; TCP_INFO filled from the connection's real state. Every option
//! Linux knows on TCP and UDP sockets is implemented, kept without an
//! effect of its own ([`RULES`]: reported back by `getsockopt`), or
//! refused with an errno ([`RULES`]); the README's table says which, and
//! why. An option the layer does not know fails with ENOPROTOOPT (as Linux
//! does for an unknown one), counted and reported once.

use std::ffi::c_int;

use ustack::socket::tcp::State;

use crate::fd::{Kind, Sock};
use crate::real::Res;
use crate::sock;

/// An option value's leading `N` bytes, or EINVAL when it is shorter.
fn bytes<const N: usize>(val: &[u8]) -> Res<[u8; N]> {
    val.get(..N)
        .and_then(|b| b.try_into().ok())
        .ok_or(libc::EINVAL)
}

/// An int option.
fn int(val: &[u8]) -> Res<c_int> {
    bytes::<4>(val).map(c_int::from_ne_bytes)
}

/// A `timeval` (two native longs) as microseconds.
fn timeval_us(val: &[u8]) -> Res<i64> {
    let b = bytes::<16>(val)?;
    let sec = i64::from_ne_bytes(b[..8].try_into().map_err(|_| libc::EINVAL)?);
    let usec = i64::from_ne_bytes(b[8..].try_into().map_err(|_| libc::EINVAL)?);
    if sec < 0 || !(0..1_000_000).contains(&usec) {
        return Err(libc::EDOM);
    }
    Ok(sec * 1_000_000 + usec)
}

/// What the layer does with an option it does not act on itself.
#[derive(Debug, Clone, Copy)]
enum Rule {
    /// Accepted and kept: `getsockopt` reports the value set, else `default`.
    Kept { default: c_int },
    /// Read-only: `getsockopt` reports `value`; `setsockopt` fails with ENOPROTOOPT.
    GetOnly { value: c_int },
    /// Refused (set and get) with this errno.
    Refused(c_int),
}

/// Option levels and numbers (Linux's, x86-64: `asm-generic/socket.h`,
/// `linux/in.h`, `linux/tcp.h`, `linux/udp.h`).
const SOL: c_int = libc::SOL_SOCKET;
const IP: c_int = libc::IPPROTO_IP;
const TCP: c_int = libc::IPPROTO_TCP;
const UDP: c_int = libc::IPPROTO_UDP;
const IP6: c_int = libc::IPPROTO_IPV6;

const fn kept(default: c_int) -> Rule {
    Rule::Kept { default }
}

/// The options kept without an effect, read-only, or refused (the README's
/// table gives each its reason). Options the layer acts on are matched in
/// [`set`] and [`get`] before these.
const RULES: &[(c_int, c_int, Rule)] = &[
    (SOL, 1, kept(0)),                            // SO_DEBUG
    (SOL, 5, kept(0)),                            // SO_DONTROUTE
    (SOL, 6, kept(0)),                            // SO_BROADCAST
    (SOL, 10, kept(0)),                           // SO_OOBINLINE
    (SOL, 11, kept(0)),                           // SO_NO_CHECK
    (SOL, 12, kept(0)),                           // SO_PRIORITY
    (SOL, 14, kept(0)),                           // SO_BSDCOMPAT
    (SOL, 16, kept(0)),                           // SO_PASSCRED
    (SOL, 17, Rule::Refused(libc::ENOPROTOOPT)),  // SO_PEERCRED
    (SOL, 18, kept(1)),                           // SO_RCVLOWAT
    (SOL, 19, Rule::GetOnly { value: 1 }),        // SO_SNDLOWAT
    (SOL, 26, Rule::Refused(libc::ENOPROTOOPT)),  // SO_ATTACH_FILTER
    (SOL, 27, Rule::Refused(libc::ENOPROTOOPT)),  // SO_DETACH_FILTER
    (SOL, 29, kept(0)),                           // SO_TIMESTAMP
    (SOL, 31, Rule::Refused(libc::ENOPROTOOPT)),  // SO_PEERSEC
    (SOL, 34, kept(0)),                           // SO_PASSSEC
    (SOL, 35, kept(0)),                           // SO_TIMESTAMPNS
    (SOL, 36, kept(0)),                           // SO_MARK
    (SOL, 40, kept(0)),                           // SO_RXQ_OVFL
    (SOL, 42, Rule::Refused(libc::EOPNOTSUPP)),   // SO_PEEK_OFF
    (SOL, 43, Rule::Refused(libc::ENOPROTOOPT)),  // SO_NOFCS
    (SOL, 44, Rule::Refused(libc::ENOPROTOOPT)),  // SO_LOCK_FILTER
    (SOL, 45, kept(0)),                           // SO_SELECT_ERR_QUEUE
    (SOL, 46, kept(0)),                           // SO_BUSY_POLL
    (SOL, 47, kept(-1)),                          // SO_MAX_PACING_RATE
    (SOL, 49, kept(-1)),                          // SO_INCOMING_CPU
    (SOL, 50, Rule::Refused(libc::ENOPROTOOPT)),  // SO_ATTACH_BPF
    (SOL, 51, Rule::Refused(libc::ENOPROTOOPT)),  // SO_ATTACH_REUSEPORT_CBPF
    (SOL, 52, Rule::Refused(libc::ENOPROTOOPT)),  // SO_ATTACH_REUSEPORT_EBPF
    (SOL, 55, Rule::GetOnly { value: 0 }),        // SO_MEMINFO (by name)
    (SOL, 56, Rule::GetOnly { value: 0 }),        // SO_INCOMING_NAPI_ID
    (SOL, 57, Rule::Refused(libc::ENOPROTOOPT)),  // SO_COOKIE
    (SOL, 59, Rule::Refused(libc::ENOPROTOOPT)),  // SO_PEERGROUPS
    (SOL, 61, Rule::Refused(libc::ENOPROTOOPT)),  // SO_TXTIME
    (SOL, 62, kept(0)),                           // SO_BINDTOIFINDEX
    (SOL, 69, kept(0)),                           // SO_PREFER_BUSY_POLL
    (SOL, 70, kept(0)),                           // SO_BUSY_POLL_BUDGET
    (SOL, 71, Rule::Refused(libc::ENOPROTOOPT)),  // SO_NETNS_COOKIE
    (SOL, 72, kept(0)),                           // SO_BUF_LOCK
    (SOL, 73, Rule::Refused(libc::ENOPROTOOPT)),  // SO_RESERVE_MEM
    (SOL, 74, kept(0)),                           // SO_TXREHASH
    (SOL, 75, kept(0)),                           // SO_RCVMARK
    (IP, 1, kept(0)),                             // IP_TOS
    (IP, 2, kept(64)),                            // IP_TTL
    (IP, 3, Rule::Refused(libc::ENOPROTOOPT)),    // IP_HDRINCL
    (IP, 5, Rule::Refused(libc::EINVAL)),         // IP_ROUTER_ALERT
    (IP, 6, kept(0)),                             // IP_RECVOPTS
    (IP, 7, kept(0)),                             // IP_RETOPTS
    (IP, 11, kept(0)),                            // IP_RECVERR
    (IP, 12, kept(0)),                            // IP_RECVTTL
    (IP, 13, kept(0)),                            // IP_RECVTOS
    (IP, 15, kept(0)),                            // IP_FREEBIND
    (IP, 16, Rule::Refused(libc::ENOPROTOOPT)),   // IP_IPSEC_POLICY
    (IP, 17, Rule::Refused(libc::ENOPROTOOPT)),   // IP_XFRM_POLICY
    (IP, 18, kept(0)),                            // IP_PASSSEC
    (IP, 19, Rule::Refused(libc::ENOPROTOOPT)),   // IP_TRANSPARENT
    (IP, 21, Rule::Refused(libc::ENOPROTOOPT)),   // IP_MINTTL
    (IP, 22, Rule::Refused(libc::ENOPROTOOPT)),   // IP_NODEFRAG
    (IP, 23, kept(0)),                            // IP_CHECKSUM
    (IP, 24, kept(0)),                            // IP_BIND_ADDRESS_NO_PORT
    (IP, 25, kept(0)),                            // IP_RECVFRAGSIZE
    (IP, 26, kept(0)),                            // IP_RECVERR_RFC4884
    (IP, 32, kept(0)),                            // IP_MULTICAST_IF
    (IP, 33, kept(1)),                            // IP_MULTICAST_TTL
    (IP, 34, kept(1)),                            // IP_MULTICAST_LOOP
    (IP, 35, Rule::Refused(libc::ENOPROTOOPT)),   // IP_ADD_MEMBERSHIP
    (IP, 36, Rule::Refused(libc::ENOPROTOOPT)),   // IP_DROP_MEMBERSHIP
    (IP, 37, Rule::Refused(libc::ENOPROTOOPT)),   // IP_UNBLOCK_SOURCE
    (IP, 38, Rule::Refused(libc::ENOPROTOOPT)),   // IP_BLOCK_SOURCE
    (IP, 39, Rule::Refused(libc::ENOPROTOOPT)),   // IP_ADD_SOURCE_MEMBERSHIP
    (IP, 40, Rule::Refused(libc::ENOPROTOOPT)),   // IP_DROP_SOURCE_MEMBERSHIP
    (IP, 41, Rule::Refused(libc::ENOPROTOOPT)),   // IP_MSFILTER
    (IP, 42, Rule::Refused(libc::ENOPROTOOPT)),   // MCAST_JOIN_GROUP
    (IP, 43, Rule::Refused(libc::ENOPROTOOPT)),   // MCAST_BLOCK_SOURCE
    (IP, 44, Rule::Refused(libc::ENOPROTOOPT)),   // MCAST_UNBLOCK_SOURCE
    (IP, 45, Rule::Refused(libc::ENOPROTOOPT)),   // MCAST_LEAVE_GROUP
    (IP, 46, Rule::Refused(libc::ENOPROTOOPT)),   // MCAST_JOIN_SOURCE_GROUP
    (IP, 47, Rule::Refused(libc::ENOPROTOOPT)),   // MCAST_LEAVE_SOURCE_GROUP
    (IP, 48, Rule::Refused(libc::ENOPROTOOPT)),   // MCAST_MSFILTER
    (IP, 49, kept(1)),                            // IP_MULTICAST_ALL
    (IP, 50, kept(0)),                            // IP_UNICAST_IF
    (IP, 51, Rule::Refused(libc::ENOPROTOOPT)),   // IP_LOCAL_PORT_RANGE
    (TCP, 7, kept(6)),                            // TCP_SYNCNT
    (TCP, 8, kept(60)),                           // TCP_LINGER2
    (TCP, 9, kept(0)),                            // TCP_DEFER_ACCEPT
    (TCP, 10, kept(0)),                           // TCP_WINDOW_CLAMP
    (TCP, 12, kept(1)),                           // TCP_QUICKACK
    (TCP, 14, Rule::Refused(libc::ENOPROTOOPT)),  // TCP_MD5SIG
    (TCP, 16, kept(0)),                           // TCP_THIN_LINEAR_TIMEOUTS
    (TCP, 17, kept(0)),                           // TCP_THIN_DUPACK
    (TCP, 19, Rule::Refused(libc::EPERM)),        // TCP_REPAIR
    (TCP, 20, Rule::Refused(libc::EPERM)),        // TCP_REPAIR_QUEUE
    (TCP, 21, Rule::Refused(libc::EPERM)),        // TCP_QUEUE_SEQ
    (TCP, 22, Rule::Refused(libc::EPERM)),        // TCP_REPAIR_OPTIONS
    (TCP, 23, kept(0)),                           // TCP_FASTOPEN (acted on in `set`)
    (TCP, 24, Rule::Refused(libc::ENOPROTOOPT)),  // TCP_TIMESTAMP
    (TCP, 25, kept(0)),                           // TCP_NOTSENT_LOWAT (0: the sysctl applies)
    (TCP, 26, Rule::GetOnly { value: 0 }),        // TCP_CC_INFO (by name)
    (TCP, 27, kept(0)),                           // TCP_SAVE_SYN
    (TCP, 28, Rule::Refused(libc::ENOPROTOOPT)),  // TCP_SAVED_SYN
    (TCP, 29, Rule::Refused(libc::EPERM)),        // TCP_REPAIR_WINDOW
    (TCP, 30, kept(0)), // TCP_FASTOPEN_CONNECT (acted on in `set` and `connect`)
    (TCP, 31, Rule::Refused(libc::ENOENT)), // TCP_ULP
    (TCP, 32, Rule::Refused(libc::ENOPROTOOPT)), // TCP_MD5SIG_EXT
    (TCP, 33, Rule::Refused(libc::ENOPROTOOPT)), // TCP_FASTOPEN_KEY
    (TCP, 34, kept(0)), // TCP_FASTOPEN_NO_COOKIE
    (TCP, 35, Rule::Refused(libc::ENOPROTOOPT)), // TCP_ZEROCOPY_RECEIVE
    (TCP, 36, kept(0)), // TCP_INQ
    (TCP, 37, kept(0)), // TCP_TX_DELAY
    (UDP, 1, Rule::Refused(libc::ENOPROTOOPT)), // UDP_CORK
    (UDP, 100, Rule::Refused(libc::ENOPROTOOPT)), // UDP_ENCAP
    (UDP, 101, Rule::Refused(libc::ENOPROTOOPT)), // UDP_NO_CHECK6_TX
    (UDP, 102, Rule::Refused(libc::ENOPROTOOPT)), // UDP_NO_CHECK6_RX
    (UDP, 103, Rule::Refused(libc::ENOPROTOOPT)), // UDP_SEGMENT
    (UDP, 104, Rule::Refused(libc::ENOPROTOOPT)), // UDP_GRO
    (IP6, 16, kept(64)), // IPV6_UNICAST_HOPS
    (IP6, 17, kept(0)), // IPV6_MULTICAST_IF
    (IP6, 18, kept(1)), // IPV6_MULTICAST_HOPS
    (IP6, 19, kept(1)), // IPV6_MULTICAST_LOOP
    (IP6, 20, Rule::Refused(libc::ENOPROTOOPT)), // IPV6_ADD_MEMBERSHIP
    (IP6, 21, Rule::Refused(libc::ENOPROTOOPT)), // IPV6_DROP_MEMBERSHIP
    (IP6, 23, kept(1)), // IPV6_MTU_DISCOVER
    (IP6, 25, kept(0)), // IPV6_RECVERR
    (IP6, 51, kept(0)), // IPV6_RECVHOPLIMIT
    (IP6, 62, kept(0)), // IPV6_DONTFRAG
    (IP6, 66, kept(0)), // IPV6_RECVTCLASS
    (IP6, 67, kept(0)), // IPV6_TCLASS
    (IP6, 70, kept(1)), // IPV6_AUTOFLOWLABEL
    (IP6, 72, kept(0)), // IPV6_ADDR_PREFERENCES
    (IP6, 74, kept(0)), // IPV6_RECVORIGDSTADDR
    (IP6, 75, Rule::Refused(libc::ENOPROTOOPT)), // IPV6_TRANSPARENT
    (IP6, 76, kept(0)), // IPV6_UNICAST_IF
    (IP6, 78, kept(0)), // IPV6_FREEBIND
];

fn rule(level: c_int, name: c_int) -> Option<Rule> {
    RULES
        .iter()
        .find(|(l, n, _)| *l == level && *n == name)
        .map(|r| r.2)
}

/// Whether `level` is not the socket's to take: TCP options on a UDP
/// socket, UDP options on a TCP one (Linux passes them to IP, which
/// knows neither), IPv6 options on an `AF_INET` socket.
fn wrong_level(s: &Sock, level: c_int) -> bool {
    (level == TCP && !s.stream) || (level == UDP && s.stream) || (level == IP6 && !s.v6)
}

/// An IPPROTO_IP int option: Linux takes an int, or a single byte.
fn ip_int(val: &[u8]) -> Res<c_int> {
    match val.len() {
        0 => Err(libc::EINVAL),
        1..=3 => Ok(c_int::from(val[0])),
        _ => int(val),
    }
}

/// The interface the stack runs on (`--pcap IFACE` in `USTACK_NET`): its
/// name and kernel index (0 on DPDK and the sim link).
pub fn stack_iface() -> &'static (String, c_int) {
    static IFACE: std::sync::OnceLock<(String, c_int)> = std::sync::OnceLock::new();
    IFACE.get_or_init(|| {
        let words = std::env::var("USTACK_NET")
            .ok()
            .and_then(|s| shlex::split(&s))
            .unwrap_or_default();
        let name = words
            .iter()
            .position(|w| w == "--pcap")
            .and_then(|i| words.get(i + 1).cloned())
            .unwrap_or_default();
        let index = std::fs::read_to_string(format!("/sys/class/net/{name}/ifindex"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        (name, index)
    })
}

/// A C string option's bytes up to its NUL.
fn c_str(val: &[u8]) -> &[u8] {
    let end = val.iter().position(|&b| b == 0).unwrap_or(val.len());
    &val[..end]
}

/// `setsockopt` with the option's bytes.
pub fn set(s: &Sock, level: c_int, name: c_int, val: &[u8]) -> Res<()> {
    // TCP options on a UDP socket and UDP options on a TCP socket: Linux
    // passes them to IP, which knows neither.
    if wrong_level(s, level) {
        return Err(libc::ENOPROTOOPT);
    }
    let mut o = s.opts.lock();
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => o.reuse_addr = int(val)? != 0,
        (libc::SOL_SOCKET, libc::SO_REUSEPORT) => o.reuse_port = int(val)? != 0,
        (libc::SOL_SOCKET, libc::SO_ZEROCOPY) => {
            // Linux takes 0 or 1 (crate::zerocopy: completions of copies).
            let v = int(val)?;
            if !(0..=1).contains(&v) {
                return Err(libc::EINVAL);
            }
            s.zc.lock().on = v == 1;
        }
        // SO_TIMESTAMPING and SO_TIMESTAMPING_NEW (an int, or the
        // flags and a PHC index).
        (libc::SOL_SOCKET, 37 | 65) => {
            drop(o);
            return sock::set_timestamping(s, int(val)?);
        }
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => {
            o.keepalive = int(val)? != 0;
            drop(o);
            sock::apply_tcp_opts(s);
        }
        // SO_SNDBUFFORCE and SO_RCVBUFFORCE (32, 33) as the plain ones.
        (libc::SOL_SOCKET, libc::SO_SNDBUF | 32) => o.sndbuf = int(val)?,
        (libc::SOL_SOCKET, libc::SO_RCVBUF | 33) => o.rcvbuf = int(val)?,
        // The _NEW timeouts (66, 67) share the 64-bit timeval's layout.
        (libc::SOL_SOCKET, libc::SO_RCVTIMEO | 66) => o.rcvtimeo_us = timeval_us(val)?,
        (libc::SOL_SOCKET, libc::SO_SNDTIMEO | 67) => o.sndtimeo_us = timeval_us(val)?,
        (libc::SOL_SOCKET, libc::SO_BINDTODEVICE) => {
            // One interface: the stack's (or none, which unbinds).
            let want = c_str(val);
            if !want.is_empty() && want != stack_iface().0.as_bytes() {
                return Err(libc::ENODEV);
            }
        }
        (IP, libc::IP_PKTINFO) => o.pktinfo = ip_int(val)? != 0,
        (IP, 20) => o.origdstaddr = ip_int(val)? != 0, // IP_RECVORIGDSTADDR
        (IP6, libc::IPV6_V6ONLY) => {
            // Only before bind, as Linux (EINVAL once the socket has a
            // port). The kind is locked before the options, as everywhere.
            let v = int(val)? != 0;
            drop(o);
            let kind = s.kind.lock();
            if !matches!(*kind, Kind::Fresh { port: 0 }) {
                return Err(libc::EINVAL);
            }
            s.opts.lock().v6only = v;
        }
        (IP6, libc::IPV6_RECVPKTINFO) => o.recvpktinfo6 = int(val)? != 0,
        (IP6, libc::IPV6_MTU) => {
            // 0 (the path's) or at least IPv6's minimum link MTU.
            let v = int(val)?;
            if v != 0 && v < 1280 {
                return Err(libc::EINVAL);
            }
            o.kept.set(level, name, v)?;
        }
        (IP, libc::IP_MTU_DISCOVER) => {
            // IP_PMTUDISC_DONT .. IP_PMTUDISC_OMIT.
            let v = ip_int(val)?;
            if !(0..=5).contains(&v) {
                return Err(libc::EINVAL);
            }
            o.kept.set(level, name, v)?;
        }
        (IP, libc::IP_OPTIONS) => {
            // No IP options are sent: setting none is all there is.
            if !val.is_empty() {
                drop(o);
                crate::report::unsupported_option(level, name);
                return Err(libc::ENOPROTOOPT);
            }
        }
        (TCP, libc::TCP_USER_TIMEOUT) => {
            let v = int(val)?;
            if v < 0 {
                return Err(libc::EINVAL);
            }
            o.user_timeout_ms = v;
            drop(o);
            sock::apply_tcp_opts(s);
        }
        (TCP, libc::TCP_FASTOPEN_CONNECT) => {
            // As Linux: 0 or 1, with the sysctl's client bit, before the
            // connection exists.
            let v = int(val)?;
            if !(0..=1).contains(&v) {
                return Err(libc::EINVAL);
            }
            if crate::sysctl::fast_open_flags() & crate::sysctl::FASTOPEN_CLIENT == 0 {
                return Err(libc::EOPNOTSUPP);
            }
            if !matches!(*s.kind.lock(), Kind::Fresh { .. }) {
                return Err(libc::EINVAL);
            }
            o.kept.set(level, name, v)?;
        }
        (TCP, libc::TCP_FASTOPEN) => {
            // The Fast Open queue's length (RFC 7413; 0 turns it off).
            let v = int(val)?;
            if v < 0 {
                return Err(libc::EINVAL);
            }
            drop(o);
            sock::set_fast_open(s, v)?;
            s.opts.lock().kept.set(level, name, v)?;
        }
        (TCP, libc::TCP_MAXSEG) => {
            // Linux's bounds (TCP_MIN_MSS .. MAX_TCP_WINDOW; 0: the default).
            let v = int(val)?;
            if v != 0 && !(88..=32767).contains(&v) {
                return Err(libc::EINVAL);
            }
            o.kept.set(level, name, v)?;
            drop(o);
            sock::apply_max_segment(s)?;
        }
        (TCP, libc::TCP_CONGESTION) => {
            // The stack's two algorithms; Linux says ENOENT for others.
            let algo = match c_str(val) {
                b"cubic" => 0,
                b"reno" => 1,
                _ => return Err(libc::ENOENT),
            };
            o.kept.set(level, name, algo)?;
        }
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            // struct linger: two ints, on/off and seconds.
            let b = bytes::<8>(val)?;
            let on = c_int::from_ne_bytes([b[0], b[1], b[2], b[3]]);
            let secs = c_int::from_ne_bytes([b[4], b[5], b[6], b[7]]);
            o.linger = (on != 0).then_some(secs);
        }
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => {
            o.nodelay = int(val)? != 0;
            let push = o.nodelay;
            drop(o);
            sock::apply_tcp_opts(s);
            if push {
                // As Linux: what cork or Nagle held leaves now.
                sock::push(s);
            }
        }
        (libc::IPPROTO_TCP, libc::TCP_CORK) => {
            o.cork = int(val)? != 0;
            drop(o);
            sock::apply_tcp_opts(s);
        }
        (
            libc::IPPROTO_TCP,
            name @ (libc::TCP_KEEPIDLE | libc::TCP_KEEPINTVL | libc::TCP_KEEPCNT),
        ) => {
            // Linux's bounds: 1..=32767 s, 1..=32767 s, 1..=127 probes.
            let v = int(val)?;
            let max = if name == libc::TCP_KEEPCNT {
                127
            } else {
                32767
            };
            if !(1..=max).contains(&v) {
                return Err(libc::EINVAL);
            }
            match name {
                libc::TCP_KEEPIDLE => o.keep_idle = v,
                libc::TCP_KEEPINTVL => o.keep_intvl = v,
                _ => o.keep_cnt = v,
            }
            drop(o);
            sock::apply_tcp_opts(s);
        }
        _ => match rule(level, name) {
            Some(Rule::Kept { .. }) => {
                let v = if level == IP { ip_int(val)? } else { int(val)? };
                o.kept.set(level, name, v)?;
            }
            Some(Rule::GetOnly { .. }) => return Err(libc::ENOPROTOOPT),
            Some(Rule::Refused(e)) => {
                drop(o);
                crate::report::unsupported_option(level, name);
                return Err(e);
            }
            None => {
                drop(o);
                crate::report::unsupported_option(level, name);
                return Err(libc::ENOPROTOOPT);
            }
        },
    }
    Ok(())
}

/// An int option's bytes.
fn put(v: c_int) -> Res<Vec<u8>> {
    Ok(v.to_ne_bytes().to_vec())
}

/// A `timeval` option's bytes.
fn put_timeval(us: i64) -> Res<Vec<u8>> {
    let mut v = (us / 1_000_000).to_ne_bytes().to_vec();
    v.extend_from_slice(&(us % 1_000_000).to_ne_bytes());
    Ok(v)
}

/// Linux's TCP state numbers (`include/net/tcp_states.h`).
fn linux_state(s: State) -> u8 {
    match s {
        State::Established => 1,
        State::SynSent => 2,
        State::SynReceived => 3,
        State::FinWait1 => 4,
        State::FinWait2 => 5,
        State::TimeWait => 6,
        State::Closed => 7,
        State::CloseWait => 8,
        State::LastAck => 9,
        State::Listen => 10,
        State::Closing => 11,
    }
}

/// `getsockopt`: the option's bytes (the caller copies as many as fit).
pub fn get(s: &Sock, level: c_int, name: c_int) -> Res<Vec<u8>> {
    if wrong_level(s, level) {
        return Err(libc::ENOPROTOOPT);
    }
    let o = *s.opts.lock();
    let b = |x: bool| c_int::from(x);
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_ERROR) => put(sock::take_error(s)),
        (libc::SOL_SOCKET, libc::SO_TYPE) => {
            let t = if s.stream {
                libc::SOCK_STREAM
            } else {
                libc::SOCK_DGRAM
            };
            put(t)
        }
        (libc::SOL_SOCKET, libc::SO_DOMAIN) => {
            put(if s.v6 { libc::AF_INET6 } else { libc::AF_INET })
        }
        (libc::SOL_SOCKET, libc::SO_PROTOCOL) => {
            let p = if s.stream {
                libc::IPPROTO_TCP
            } else {
                libc::IPPROTO_UDP
            };
            put(p)
        }
        (libc::SOL_SOCKET, libc::SO_ACCEPTCONN) => {
            let l = matches!(*s.kind.lock(), Kind::Listener { .. });
            put(b(l))
        }
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => put(b(o.reuse_addr)),
        (libc::SOL_SOCKET, libc::SO_REUSEPORT) => put(b(o.reuse_port)),
        (libc::SOL_SOCKET, libc::SO_ZEROCOPY) => put(b(s.zc.lock().on)),
        (libc::SOL_SOCKET, 37 | 65) => put(s.ts.lock().flags as c_int),
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => put(b(o.keepalive)),
        (libc::SOL_SOCKET, libc::SO_SNDBUF | 32) => put(reported_buffer(o.sndbuf)),
        (libc::SOL_SOCKET, libc::SO_RCVBUF | 33) => put(reported_buffer(o.rcvbuf)),
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            let mut v = b(o.linger.is_some()).to_ne_bytes().to_vec();
            v.extend_from_slice(&o.linger.unwrap_or(0).to_ne_bytes());
            Ok(v)
        }
        (libc::SOL_SOCKET, libc::SO_RCVTIMEO | libc::SO_SNDTIMEO | 66 | 67) => {
            put_timeval(if name == libc::SO_RCVTIMEO || name == 66 {
                o.rcvtimeo_us
            } else {
                o.sndtimeo_us
            })
        }
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => put(b(o.nodelay)),
        (libc::IPPROTO_TCP, libc::TCP_CORK) => put(b(o.cork)),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => {
            put(if o.keep_idle > 0 { o.keep_idle } else { 7200 })
        }
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL) => {
            put(if o.keep_intvl > 0 { o.keep_intvl } else { 75 })
        }
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT) => put(if o.keep_cnt > 0 { o.keep_cnt } else { 9 }),
        (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => {
            // The connection's MSS; before one, what was set or Linux's 536.
            let set = o.kept.get(level, name).filter(|&v| v > 0);
            let mss = sock::tcp_info(s).map_or(set.unwrap_or(536), |i| i.max_payload as c_int);
            put(mss)
        }
        (TCP, libc::TCP_USER_TIMEOUT) => put(o.user_timeout_ms),
        (TCP, libc::TCP_CONGESTION) => {
            let name: &[u8] = if o.kept.get(level, name) == Some(1) {
                b"reno"
            } else {
                b"cubic"
            };
            let mut v = name.to_vec();
            v.resize(16, 0);
            Ok(v)
        }
        (libc::SOL_SOCKET, libc::SO_BINDTODEVICE) => Ok(Vec::new()),
        (IP, libc::IP_PKTINFO) => put(b(o.pktinfo)),
        (IP, 20) => put(b(o.origdstaddr)),
        (IP6, libc::IPV6_V6ONLY) => put(b(o.v6only)),
        (IP6, libc::IPV6_RECVPKTINFO) => put(b(o.recvpktinfo6)),
        (IP6, libc::IPV6_MTU) => {
            // The path MTU of a connected socket (Linux: ENOTCONN before).
            if let Some(i) = sock::tcp_info(s) {
                put((i.mss + if i.remote.is_ipv6() { 60 } else { 40 }) as c_int)
            } else if matches!(*s.kind.lock(), Kind::Dgram { peer: Some(_), .. }) {
                put(1500)
            } else {
                Err(libc::ENOTCONN)
            }
        }
        (IP, libc::IP_MTU_DISCOVER) => put(o.kept.get(level, name).unwrap_or(1)),
        (IP, libc::IP_OPTIONS) => Ok(Vec::new()),
        (IP, 9) => {
            // IP_PKTOPTIONS (TCP only): with IP_PKTINFO, the connection's
            // interface and address as a control message (dnsmasq finds
            // a wildcard TCP connection's interface so).
            if !s.stream {
                return Err(libc::ENOPROTOOPT);
            }
            let local = sock::local_addr(s).ok().filter(|_| o.pktinfo);
            let Some(std::net::IpAddr::V4(ip)) = local.map(|a| a.ip()) else {
                return Ok(Vec::new());
            };
            let mut p = stack_iface().1.to_ne_bytes().to_vec();
            p.extend_from_slice(&ip.octets());
            p.extend_from_slice(&ip.octets());
            Ok(crate::cmsg::cmsgs(&[(IP, libc::IP_PKTINFO, &p)], usize::MAX).0)
        }
        (IP, libc::IP_MTU) => {
            // The path MTU of a connected socket (Linux: ENOTCONN before).
            if let Some(i) = sock::tcp_info(s) {
                put((i.mss + 40) as c_int)
            } else if matches!(*s.kind.lock(), Kind::Dgram { peer: Some(_), .. }) {
                put(1500)
            } else {
                Err(libc::ENOTCONN)
            }
        }
        (libc::IPPROTO_TCP, 26) if s.stream => {
            // TCP_CC_INFO: Linux's cubic and reno have no extra congestion
            // information, so it answers with none (length 0), as here.
            Ok(Vec::new())
        }
        (libc::SOL_SOCKET, 55) => {
            // SO_MEMINFO (`SK_MEMINFO_*`, nine u32s): receive and send
            // buffer sizes as SO_RCVBUF/SO_SNDBUF report them, and the
            // bytes queued to read and to send; the kernel's accounting
            // (forward allocations, option memory, backlog) is not
            // ustack's.
            let info = sock::tcp_info(s);
            let (rcvbuf, sndbuf) = (reported_buffer(o.rcvbuf), reported_buffer(o.sndbuf));
            let queued = info.as_ref().map_or(0, |i| i.send_queued) as u32;
            let unread = info.as_ref().map_or(0, |i| i.recv_queued) as u32;
            let mem: [u32; 9] = [
                unread,
                rcvbuf as u32,
                queued,
                sndbuf as u32,
                0,
                queued,
                0,
                0,
                0,
            ];
            Ok(mem.iter().flat_map(|v| v.to_ne_bytes()).collect())
        }
        (libc::IPPROTO_TCP, libc::TCP_INFO) => {
            let mut t = TcpInfo::default();
            // A look, as a non-blocking receive is: frames that came (an
            // ACK that moves cwnd) are taken in first, as the kernel has
            // taken them in by the time a program asks.
            crate::state::drive_once();
            if let Some((i, c)) = sock::tcp_info_timed(s) {
                let mss = i.mss.max(1);
                t.tcpi_state = linux_state(i.state);
                t.tcpi_ca_state = i.ca_state.linux();
                let wscale = i.wscale != (0, 0);
                t.tcpi_options = u8::from(i.timestamps)
                    | u8::from(i.sack) << 1
                    | u8::from(wscale) << 2
                    | u8::from(i.ecn) << 3
                    | u8::from(i.ecn_seen) << 4
                    | u8::from(i.syn_data) << 5;
                t.tcpi_wscales = (i.wscale.0 & 0xf) | (i.wscale.1 & 0xf) << 4;
                t.tcpi_reordering = i.reordering as u32;
                t.tcpi_lost = i.lost.div_ceil(mss) as u32;
                t.tcpi_sacked = i.sacked.div_ceil(mss) as u32;
                t.tcpi_retrans = i.retrans.div_ceil(mss) as u32;
                t.tcpi_reord_seen = i.reord_seen;
                t.tcpi_rto = i.rto_us as u32;
                t.tcpi_snd_mss = i.max_payload as u32;
                t.tcpi_rcv_mss = i.max_payload as u32;
                t.tcpi_advmss = i.max_payload as u32;
                t.tcpi_pmtu = (i.mss + 40) as u32;
                t.tcpi_unacked = (i.in_flight / mss) as u32;
                t.tcpi_rtt = i.srtt_us.unwrap_or(0) as u32;
                t.tcpi_rttvar = i.rttvar_us.unwrap_or(0) as u32;
                t.tcpi_snd_cwnd = (i.cwnd / mss) as u32;
                // Linux's TCP_INFINITE_SSTHRESH (0x7fffffff) before any
                // loss or exit from slow start.
                t.tcpi_snd_ssthresh = (i.ssthresh / mss).min(0x7fff_ffff) as u32;
                t.tcpi_total_retrans = i.stats.retransmits as u32;
                t.tcpi_bytes_acked = i.stats.bytes_out;
                t.tcpi_bytes_sent = i.stats.bytes_out + i.in_flight as u64;
                t.tcpi_bytes_received = i.stats.bytes_in;
                t.tcpi_segs_out = i.stats.segs_out as u32;
                t.tcpi_segs_in = i.stats.segs_in as u32;
                t.tcpi_snd_wnd = i.snd_wnd as u32;
                t.tcpi_rcv_wnd = i.rcv_wnd as u32;
                t.tcpi_rcv_space = i.rcv_wnd as u32;
                t.tcpi_notsent_bytes = i.send_queued.saturating_sub(i.in_flight) as u32;
                t.tcpi_last_data_sent = c.last_data_sent_ms;
                t.tcpi_last_data_recv = c.last_data_recv_ms;
                t.tcpi_last_ack_recv = c.last_ack_recv_ms;
                t.tcpi_busy_time = c.busy_us;
                t.tcpi_rwnd_limited = c.rwnd_limited_us;
            } else if matches!(*s.kind.lock(), Kind::Listener { .. }) {
                t.tcpi_state = linux_state(State::Listen);
            } else {
                t.tcpi_state = linux_state(State::Closed);
            }
            Ok(t.bytes())
        }
        _ => match rule(level, name) {
            Some(Rule::Kept { default }) => put(o.kept.get(level, name).unwrap_or(default)),
            Some(Rule::GetOnly { value }) => put(value),
            Some(Rule::Refused(e)) => {
                crate::report::unsupported_option(level, name);
                Err(e)
            }
            None => {
                crate::report::unsupported_option(level, name);
                Err(libc::ENOPROTOOPT)
            }
        },
    }
}

/// A buffer size as `SO_SNDBUF`/`SO_RCVBUF` report it: Linux gives
/// twice what was set (bookkeeping room); unset, the stack's 256 KiB.
fn reported_buffer(set: c_int) -> c_int {
    if set > 0 {
        set.saturating_mul(2)
    } else {
        256 << 10
    }
}

/// Linux's `struct tcp_info` (`linux/tcp.h`; 280 bytes as of Linux
/// 6.18, through the accurate-ECN counters: callers pass their own size,
/// which `getsockopt` honours, so an older program's shorter struct gets
/// its prefix). Fields ustack has no counterpart for are 0.
#[derive(Debug, Default)]
struct TcpInfo {
    tcpi_state: u8,
    /// `TCP_CA_Open` 0, `TCP_CA_Recovery` 3.
    tcpi_ca_state: u8,
    /// `TCPI_OPT_TIMESTAMPS` 1, `TCPI_OPT_SACK` 2, `TCPI_OPT_WSCALE` 4,
    /// `TCPI_OPT_SYN_DATA` 32.
    tcpi_options: u8,
    /// `tcpi_snd_wscale:4, tcpi_rcv_wscale:4` in one byte.
    tcpi_wscales: u8,
    tcpi_rto: u32,
    tcpi_snd_mss: u32,
    /// Milliseconds since new data last left, data last came, an ACK
    /// last came (`tcpi_last_ack_sent` is 0 on Linux too).
    tcpi_last_data_sent: u32,
    tcpi_last_data_recv: u32,
    tcpi_last_ack_recv: u32,
    /// Microseconds sending, and of them limited by the peer's window
    /// (`tcpi_sndbuf_limited` is not timed: 0).
    tcpi_busy_time: u64,
    tcpi_rwnd_limited: u64,
    tcpi_rcv_mss: u32,
    tcpi_unacked: u32,
    tcpi_sacked: u32,
    tcpi_lost: u32,
    tcpi_retrans: u32,
    tcpi_pmtu: u32,
    tcpi_rtt: u32,
    tcpi_rttvar: u32,
    tcpi_snd_ssthresh: u32,
    tcpi_snd_cwnd: u32,
    tcpi_advmss: u32,
    tcpi_reordering: u32,
    tcpi_rcv_space: u32,
    tcpi_total_retrans: u32,
    tcpi_bytes_acked: u64,
    tcpi_bytes_received: u64,
    tcpi_segs_out: u32,
    tcpi_segs_in: u32,
    tcpi_notsent_bytes: u32,
    tcpi_bytes_sent: u64,
    tcpi_reord_seen: u32,
    tcpi_snd_wnd: u32,
    tcpi_rcv_wnd: u32,
}

/// The size of [`TcpInfo::bytes`].
const TCP_INFO_LEN: usize = 280;

impl TcpInfo {
    /// The bytes in the kernel's layout (offsets from `linux/tcp.h`).
    fn bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; TCP_INFO_LEN];
        let mut put32 = |off: usize, v: u32| b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        put32(8, self.tcpi_rto);
        put32(16, self.tcpi_snd_mss);
        put32(20, self.tcpi_rcv_mss);
        put32(24, self.tcpi_unacked);
        put32(28, self.tcpi_sacked);
        put32(32, self.tcpi_lost);
        put32(36, self.tcpi_retrans);
        put32(44, self.tcpi_last_data_sent);
        put32(52, self.tcpi_last_data_recv);
        put32(56, self.tcpi_last_ack_recv);
        put32(60, self.tcpi_pmtu);
        put32(68, self.tcpi_rtt);
        put32(72, self.tcpi_rttvar);
        put32(76, self.tcpi_snd_ssthresh);
        put32(80, self.tcpi_snd_cwnd);
        put32(84, self.tcpi_advmss);
        put32(88, self.tcpi_reordering);
        put32(96, self.tcpi_rcv_space);
        put32(100, self.tcpi_total_retrans);
        put32(136, self.tcpi_segs_out);
        put32(140, self.tcpi_segs_in);
        put32(144, self.tcpi_notsent_bytes);
        put32(220, self.tcpi_reord_seen);
        put32(228, self.tcpi_snd_wnd);
        put32(232, self.tcpi_rcv_wnd);
        let mut put64 = |off: usize, v: u64| b[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        put64(120, self.tcpi_bytes_acked);
        put64(128, self.tcpi_bytes_received);
        put64(168, self.tcpi_busy_time);
        put64(176, self.tcpi_rwnd_limited);
        put64(200, self.tcpi_bytes_sent);
        b[0] = self.tcpi_state;
        b[1] = self.tcpi_ca_state;
        b[5] = self.tcpi_options;
        b[6] = self.tcpi_wscales;
        b
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::fd::{KEPT_MAX, Kept};

    #[test]
    fn kept_values_are_reported_back_and_bounded() {
        let mut k = Kept::default();
        assert_eq!(k.get(IP, 2), None);
        k.set(IP, 2, 9).unwrap();
        k.set(IP, 2, 10).unwrap();
        assert_eq!(k.get(IP, 2), Some(10));
        for n in 1..KEPT_MAX as c_int {
            k.set(TCP, 100 + n, n).unwrap();
        }
        assert_eq!(k.set(TCP, 1000, 1), Err(libc::ENOMEM));
        assert_eq!(k.get(TCP, 114), Some(14));
        // Room for every kept rule at once (the README table's test sets all).
        let kept = RULES
            .iter()
            .filter(|r| matches!(r.2, Rule::Kept { .. }))
            .count();
        assert!(kept + 4 <= KEPT_MAX, "{kept} kept rules");
    }

    #[test]
    fn every_rule_is_listed_once() {
        for (i, (l, n, _)) in RULES.iter().enumerate() {
            assert!(
                !RULES[i + 1..].iter().any(|(l2, n2, _)| l2 == l && n2 == n),
                "{l}/{n} twice"
            );
        }
    }

    #[test]
    fn ip_options_take_an_int_or_a_byte() {
        assert_eq!(ip_int(&[5]), Ok(5));
        assert_eq!(ip_int(&7i32.to_ne_bytes()), Ok(7));
        assert_eq!(ip_int(&[]), Err(libc::EINVAL));
    }
}
