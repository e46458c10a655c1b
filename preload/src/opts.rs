//! `setsockopt` and `getsockopt` on ustack sockets: the options programs
//! set, kept per socket and applied to the connection where the stack acts
//! on them; TCP_INFO filled from the connection's real state. An option the
//! layer does not know fails with ENOPROTOOPT (as Linux does for an
//! unknown one), counted and reported once.

use std::ffi::c_int;

use ustack::tcp::State;

use crate::fd::{Kind, Sock};
use crate::sock::{self, Res};

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

/// `setsockopt` with the option's bytes.
pub fn set(s: &Sock, level: c_int, name: c_int, val: &[u8]) -> Res<()> {
    let mut o = s.opts.lock();
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => o.reuse_addr = int(val)? != 0,
        (libc::SOL_SOCKET, libc::SO_REUSEPORT) => o.reuse_port = int(val)? != 0,
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => {
            o.keepalive = int(val)? != 0;
            drop(o);
            sock::apply_tcp_opts(s);
        }
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => o.sndbuf = int(val)?,
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => o.rcvbuf = int(val)?,
        (libc::SOL_SOCKET, libc::SO_RCVTIMEO) => o.rcvtimeo_us = timeval_us(val)?,
        (libc::SOL_SOCKET, libc::SO_SNDTIMEO) => o.sndtimeo_us = timeval_us(val)?,
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            // struct linger: two ints, on/off and seconds.
            let b = bytes::<8>(val)?;
            let on = c_int::from_ne_bytes([b[0], b[1], b[2], b[3]]);
            let secs = c_int::from_ne_bytes([b[4], b[5], b[6], b[7]]);
            o.linger = (on != 0).then_some(secs);
        }
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => {
            o.nodelay = int(val)? != 0;
            drop(o);
            sock::apply_tcp_opts(s);
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
        // Kept as the kernel keeps them; the stack does not act on them.
        (libc::IPPROTO_IP, libc::IP_TOS) | (libc::SOL_SOCKET, libc::SO_PRIORITY) => {
            int(val)?;
        }
        _ => {
            drop(o);
            crate::unsupported_option(level, name);
            return Err(libc::ENOPROTOOPT);
        }
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
        (libc::SOL_SOCKET, libc::SO_DOMAIN) => put(libc::AF_INET),
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
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => put(b(o.keepalive)),
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
            // Linux reports twice what was set (bookkeeping room); the
            // default is the stack's send buffer.
            let v = if o.sndbuf > 0 {
                o.sndbuf * 2
            } else {
                256 << 10
            };
            put(v)
        }
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
            let v = if o.rcvbuf > 0 {
                o.rcvbuf * 2
            } else {
                256 << 10
            };
            put(v)
        }
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            let mut v = b(o.linger.is_some()).to_ne_bytes().to_vec();
            v.extend_from_slice(&o.linger.unwrap_or(0).to_ne_bytes());
            Ok(v)
        }
        (libc::SOL_SOCKET, libc::SO_RCVTIMEO | libc::SO_SNDTIMEO) => {
            put_timeval(if name == libc::SO_RCVTIMEO {
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
            let mss = sock::tcp_info(s).map_or(536, |i| i.mss as c_int);
            put(mss)
        }
        (libc::IPPROTO_TCP, libc::TCP_INFO) => {
            let mut t = TcpInfo::default();
            if let Some(i) = sock::tcp_info(s) {
                let mss = i.mss.max(1);
                t.tcpi_state = linux_state(i.state);
                t.tcpi_rto = i.rto_us as u32;
                t.tcpi_snd_mss = i.mss as u32;
                t.tcpi_rcv_mss = i.mss as u32;
                t.tcpi_advmss = i.mss as u32;
                t.tcpi_pmtu = (i.mss + 40) as u32;
                t.tcpi_unacked = (i.in_flight / mss) as u32;
                t.tcpi_rtt = i.srtt_us.unwrap_or(0) as u32;
                t.tcpi_rttvar = i.rttvar_us.unwrap_or(0) as u32;
                t.tcpi_snd_cwnd = (i.cwnd / mss) as u32;
                t.tcpi_snd_ssthresh = (i.ssthresh / mss).min(u32::MAX as usize) as u32;
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
            } else if matches!(*s.kind.lock(), Kind::Listener { .. }) {
                t.tcpi_state = linux_state(State::Listen);
            } else {
                t.tcpi_state = linux_state(State::Closed);
            }
            Ok(t.bytes())
        }
        (libc::IPPROTO_IP, libc::IP_TOS) => put(0 as c_int),
        _ => {
            crate::unsupported_option(level, name);
            Err(libc::ENOPROTOOPT)
        }
    }
}

/// Linux's `struct tcp_info` as far as programs read it (through
/// `tcpi_rcv_wnd`, 232 bytes; the kernel's is longer and callers pass
/// their own size, which `getsockopt` honours).
#[derive(Debug, Default)]
struct TcpInfo {
    tcpi_state: u8,
    tcpi_rto: u32,
    tcpi_snd_mss: u32,
    tcpi_rcv_mss: u32,
    tcpi_unacked: u32,
    tcpi_pmtu: u32,
    tcpi_rtt: u32,
    tcpi_rttvar: u32,
    tcpi_snd_ssthresh: u32,
    tcpi_snd_cwnd: u32,
    tcpi_advmss: u32,
    tcpi_rcv_space: u32,
    tcpi_total_retrans: u32,
    tcpi_bytes_acked: u64,
    tcpi_bytes_received: u64,
    tcpi_segs_out: u32,
    tcpi_segs_in: u32,
    tcpi_notsent_bytes: u32,
    tcpi_bytes_sent: u64,
    tcpi_snd_wnd: u32,
    tcpi_rcv_wnd: u32,
}

impl TcpInfo {
    /// The bytes in the kernel's layout (offsets from `linux/tcp.h`).
    fn bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; 232];
        let mut put32 = |off: usize, v: u32| b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        put32(8, self.tcpi_rto);
        put32(16, self.tcpi_snd_mss);
        put32(20, self.tcpi_rcv_mss);
        put32(24, self.tcpi_unacked);
        put32(60, self.tcpi_pmtu);
        put32(68, self.tcpi_rtt);
        put32(72, self.tcpi_rttvar);
        put32(76, self.tcpi_snd_ssthresh);
        put32(80, self.tcpi_snd_cwnd);
        put32(84, self.tcpi_advmss);
        put32(96, self.tcpi_rcv_space);
        put32(100, self.tcpi_total_retrans);
        put32(136, self.tcpi_segs_out);
        put32(140, self.tcpi_segs_in);
        put32(144, self.tcpi_notsent_bytes);
        put32(224, self.tcpi_snd_wnd);
        put32(228, self.tcpi_rcv_wnd);
        let mut put64 = |off: usize, v: u64| b[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        put64(120, self.tcpi_bytes_acked);
        put64(128, self.tcpi_bytes_received);
        put64(192, self.tcpi_bytes_sent);
        b[0] = self.tcpi_state;
        b
    }
}
