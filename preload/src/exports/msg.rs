//! Message calls: `recvmsg`/`sendmsg` (with control messages) and the
//! batches `recvmmsg`/`sendmmsg`.

use std::ffi::{c_int, c_uint};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use libc::{msghdr, ssize_t, timespec};

use crate::cmsg::{cmsgs, parse_cmsgs};
use crate::exports::args::{guard, iovecs, ours, read_addr, write_addr};
use crate::exports::io::do_send;
use crate::fd::Sock;
use crate::real::{real, set_errno};
use crate::sock::{self, RecvFlags};

/// A `recvmsg` on a ustack socket: the bytes or datagram, its source, and
/// the control messages the socket asked for (`IP_PKTINFO`: the stack's
/// interface and address; `IP_RECVORIGDSTADDR`: the address and port the
/// datagram was sent to; `IPV6_RECVPKTINFO`: the address and interface,
/// for an IPv6 datagram). -1 with errno on failure.
///
/// # Safety
/// `m` is the caller's msghdr: its iovecs, name and control buffers valid
/// for their lengths.
unsafe fn recvmsg_ours(s: &Arc<Sock>, m: &mut msghdr, flags: c_int) -> ssize_t {
    if flags & libc::MSG_ERRQUEUE != 0 {
        // SAFETY: the caller's msghdr.
        return unsafe { recv_error_queue(s, m) };
    }
    // SAFETY: its iovecs.
    let mut v = match unsafe { iovecs(m.msg_iov, m.msg_iovlen as c_int) } {
        Ok(v) => v,
        Err(e) => {
            set_errno(e);
            return -1;
        }
    };
    let room: usize = v.iter().map(|b| b.len()).sum();
    let f = RecvFlags {
        dontwait: flags & libc::MSG_DONTWAIT != 0,
        waitall: flags & libc::MSG_WAITALL != 0,
        peek: flags & libc::MSG_PEEK != 0,
        trunc: true,
    };
    let r = match sock::recv(s, &mut v, f) {
        Ok(r) => r,
        Err(e) => {
            set_errno(e);
            return -1;
        }
    };
    let n = r.full.max(r.len) as ssize_t;
    match r.from {
        Some(a) if !m.msg_name.is_null() => {
            let mut alen = m.msg_namelen;
            // SAFETY: the caller's name buffer of `msg_namelen` bytes.
            unsafe { write_addr(a, s.v6, m.msg_name.cast(), &mut alen) };
            m.msg_namelen = alen;
        }
        _ => m.msg_namelen = 0,
    }
    m.msg_flags = if n as usize > room {
        libc::MSG_TRUNC
    } else {
        0
    };
    let (pktinfo, origdst, pktinfo6) = {
        let o = s.opts.lock();
        (o.pktinfo, o.origdstaddr, o.recvpktinfo6)
    };
    let ifindex = crate::opts::stack_iface().1;
    let mut list: Vec<(c_int, c_int, Vec<u8>)> = Vec::new();
    let local = r
        .from
        .map(|from| (sock::local_for(from.ip()), sock::local_addr(s)));
    match local {
        Some((IpAddr::V4(ip), port)) if pktinfo || origdst => {
            let ip = ip.octets();
            if pktinfo {
                // struct in_pktinfo: ifindex, spec_dst, addr.
                let mut p = ifindex.to_ne_bytes().to_vec();
                p.extend_from_slice(&ip);
                p.extend_from_slice(&ip);
                list.push((libc::IPPROTO_IP, libc::IP_PKTINFO, p));
            }
            if let (true, Ok(port)) = (origdst, port) {
                // struct sockaddr_in (IP_ORIGDSTADDR is 20).
                let mut a = (libc::AF_INET as u16).to_ne_bytes().to_vec();
                a.extend_from_slice(&port.port().to_be_bytes());
                a.extend_from_slice(&ip);
                a.extend_from_slice(&[0; 8]);
                list.push((libc::IPPROTO_IP, 20, a));
            }
        }
        Some((IpAddr::V6(ip), _)) if pktinfo6 => {
            // struct in6_pktinfo: the address, then the interface index.
            let mut p = ip.octets().to_vec();
            p.extend_from_slice(&ifindex.to_ne_bytes());
            list.push((libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, p));
        }
        _ => {}
    }
    let borrowed: Vec<(c_int, c_int, &[u8])> = list
        .iter()
        .map(|(l, t, d)| (*l, *t, d.as_slice()))
        .collect();
    let room_ctl = if m.msg_control.is_null() {
        0
    } else {
        m.msg_controllen
    };
    let (ctl, truncated) = cmsgs(&borrowed, room_ctl);
    if !ctl.is_empty() {
        // SAFETY: the caller's control buffer holds `msg_controllen` bytes,
        // and `ctl` is no longer.
        unsafe {
            std::ptr::copy_nonoverlapping(ctl.as_ptr(), m.msg_control.cast::<u8>(), ctl.len())
        };
    }
    m.msg_controllen = ctl.len();
    if truncated {
        m.msg_flags |= libc::MSG_CTRUNC;
    }
    if flags & libc::MSG_TRUNC != 0 {
        n
    } else {
        (n as usize).min(room) as ssize_t
    }
}

/// `recvmsg(MSG_ERRQUEUE)`: the oldest transmit timestamp
/// ([`crate::tstamp`]: an `SCM_TIMESTAMPING` control message, then the
/// error), else the oldest zero-copy completion, as Linux gives it (no
/// data, one `IP_RECVERR` or `IPV6_RECVERR` control message with the
/// `sock_extended_err`); EAGAIN when the queue is empty (no ICMP errors
/// are queued: `IP_RECVERR` is kept, not acted on).
///
/// # Safety
/// `m` is the caller's msghdr: its name and control buffers valid for
/// their lengths.
unsafe fn recv_error_queue(s: &Arc<Sock>, m: &mut msghdr) -> ssize_t {
    // Run to completion, as a non-blocking receive: ACKs that came a
    // moment ago complete sends (and two completions that are both due
    // are reported as one range, as Linux's would be).
    crate::state::drive_once();
    sock::timestamping_refresh(s);
    sock::zerocopy_refresh(s);
    // A transmit timestamp (with its SCM_TIMESTAMPING message before the
    // error), else a zero-copy completion.
    let (stamp, payload_cut) = {
        let mut ts = s.ts.lock();
        let cut = ts.flags & crate::tstamp::OPT_TSONLY == 0;
        (ts.take(), cut)
    };
    let (err, stamp_ctl, data_cut) = match stamp {
        Some(r) => (r.extended_err(), Some(r.scm_timestamping()), payload_cut),
        None => match s.zc.lock().take() {
            Some(e) => (e, None, false),
            None => {
                set_errno(libc::EAGAIN);
                return -1;
            }
        },
    };
    // The extended error, then the offender's address (none here: zeroed,
    // a sockaddr_in or sockaddr_in6 as the socket's family).
    let (level, kind, offender) = if s.v6 {
        (libc::IPPROTO_IPV6, libc::IPV6_RECVERR, 28)
    } else {
        (libc::IPPROTO_IP, libc::IP_RECVERR, 16)
    };
    let mut data = err.to_vec();
    data.resize(err.len() + offender, 0);
    let room = if m.msg_control.is_null() {
        0
    } else {
        m.msg_controllen
    };
    let mut msgs: Vec<(c_int, c_int, &[u8])> = Vec::with_capacity(2);
    if let Some(t) = stamp_ctl.as_ref() {
        // SCM_TIMESTAMPING (SO_TIMESTAMPING's number).
        msgs.push((libc::SOL_SOCKET, 37, &t[..]));
    }
    msgs.push((level, kind, &data[..]));
    let (ctl, truncated) = cmsgs(&msgs, room);
    if !ctl.is_empty() {
        // SAFETY: the caller's control buffer holds `msg_controllen` bytes,
        // and `ctl` is no longer.
        unsafe {
            std::ptr::copy_nonoverlapping(ctl.as_ptr(), m.msg_control.cast::<u8>(), ctl.len())
        };
    }
    m.msg_controllen = ctl.len();
    m.msg_namelen = 0;
    // A timestamp's error message carries the sent segment's bytes in
    // Linux, unless OPT_TSONLY; none are given here, so they read as cut.
    m.msg_flags = libc::MSG_ERRQUEUE
        | if truncated { libc::MSG_CTRUNC } else { 0 }
        | if data_cut { libc::MSG_TRUNC } else { 0 };
    0
}

/// A `sendmsg` on a ustack socket. An `IP_PKTINFO` control message may
/// name the source: the stack's own address (or none) is all there is.
/// -1 with errno on failure.
///
/// # Safety
/// `m` is the caller's msghdr: its iovecs, name and control buffers valid
/// for their lengths.
unsafe fn sendmsg_ours(s: &Arc<Sock>, m: &msghdr, flags: c_int) -> ssize_t {
    // SAFETY: its iovecs.
    let v = match unsafe { iovecs(m.msg_iov, m.msg_iovlen as c_int) } {
        Ok(v) => v,
        Err(e) => {
            set_errno(e);
            return -1;
        }
    };
    if s.stream && flags & libc::MSG_FASTOPEN != 0 && !m.msg_name.is_null() {
        // SAFETY: the caller's address of `msg_namelen` bytes.
        if let Err(e) = unsafe { super::io::fast_open_to(s, m.msg_name.cast(), m.msg_namelen) } {
            set_errno(e);
            return -1;
        }
    }
    let dst = if m.msg_name.is_null() || s.stream {
        None
    } else {
        // SAFETY: the caller's address.
        match unsafe { read_addr(m.msg_name.cast(), m.msg_namelen, s.v6) } {
            Ok(a) => Some(a),
            Err(e) => {
                set_errno(e);
                return -1;
            }
        }
    };
    if !s.stream && !m.msg_control.is_null() && m.msg_controllen > 0 {
        // SAFETY: the caller's control buffer of `msg_controllen` bytes.
        let ctl =
            unsafe { std::slice::from_raw_parts(m.msg_control.cast::<u8>(), m.msg_controllen) };
        let list = match parse_cmsgs(ctl) {
            Ok(l) => l,
            Err(e) => {
                set_errno(e);
                return -1;
            }
        };
        for (level, ty, data) in list {
            let (spec, unroutable) = match (level, ty) {
                (libc::IPPROTO_IP, libc::IP_PKTINFO) if data.len() >= 12 => (
                    IpAddr::V4(Ipv4Addr::new(data[4], data[5], data[6], data[7])),
                    // Not an address of ours: no route from it (Linux
                    // says ENETUNREACH).
                    libc::ENETUNREACH,
                ),
                (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) if data.len() >= 20 => {
                    let mut a = [0u8; 16];
                    a.copy_from_slice(&data[..16]);
                    // Linux: EINVAL for a source that is not the host's.
                    (IpAddr::V6(Ipv6Addr::from(a)), libc::EINVAL)
                }
                _ => continue,
            };
            if !spec.is_unspecified() && !sock::owns(spec) {
                set_errno(unroutable);
                return -1;
            }
        }
    }
    let bufs: Vec<&[u8]> = v.into_iter().map(|b| &*b).collect();
    do_send(s.clone(), &bufs, dst, flags)
}

/// The descriptors a message's `SCM_RIGHTS` control messages pass.
///
/// # Safety
/// `m`'s control buffer is valid for `msg_controllen` bytes.
unsafe fn passed_fds(m: &msghdr) -> Vec<c_int> {
    if m.msg_control.is_null() || m.msg_controllen == 0 {
        return Vec::new();
    }
    // SAFETY: the caller's control buffer, valid for its length.
    let ctl = unsafe { std::slice::from_raw_parts(m.msg_control as *const u8, m.msg_controllen) };
    let Ok(list) = parse_cmsgs(ctl) else {
        return Vec::new();
    };
    list.into_iter()
        .filter(|&(level, ty, _)| level == libc::SOL_SOCKET && ty == libc::SCM_RIGHTS)
        .flat_map(|(_, _, data)| {
            data.chunks_exact(4)
                .map(|c| c_int::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        })
        .collect()
}

/// `recvmsg(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    match ours(fd) {
        None => {
            // SAFETY: passing the call on.
            let n = unsafe { (real().recvmsg)(fd, msg, flags) };
            if n >= 0 && !msg.is_null() {
                // SAFETY: the kernel just filled the caller's msghdr.
                let passed = unsafe { passed_fds(&*msg) };
                if !passed.is_empty() {
                    let saved = crate::real::errno();
                    crate::share::rights::adopt(&passed);
                    set_errno(saved);
                }
            }
            n
        }
        Some(Err(e)) => {
            set_errno(e);
            -1
        }
        Some(Ok(s)) => guard(-1, || {
            if msg.is_null() {
                set_errno(libc::EFAULT);
                return -1;
            }
            // SAFETY: the caller's msghdr and its buffers.
            unsafe { recvmsg_ours(&s, &mut *msg, flags) }
        }),
    }
}

/// `sendmsg(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    match ours(fd) {
        None => {
            let lent = if msg.is_null() || crate::fd::is_empty() {
                Vec::new()
            } else {
                // SAFETY: the caller's msghdr, its control buffer valid for
                // its length.
                crate::share::rights::lend(&unsafe { passed_fds(&*msg) })
            };
            // SAFETY: passing the call on.
            let n = unsafe { (real().sendmsg)(fd, msg, flags) };
            if n < 0 && !lent.is_empty() {
                let saved = crate::real::errno();
                crate::share::rights::unlend(&lent);
                set_errno(saved);
            }
            n
        }
        Some(Err(e)) => {
            set_errno(e);
            -1
        }
        Some(Ok(s)) => guard(-1, || {
            if msg.is_null() {
                set_errno(libc::EFAULT);
                return -1;
            }
            // SAFETY: the caller's msghdr and its buffers.
            unsafe { sendmsg_ours(&s, &*msg, flags) }
        }),
    }
}

/// Linux's bound on a `recvmmsg`/`sendmmsg` batch (UIO_MAXIOV).
const MMSG_MAX: c_uint = 1024;

/// `recvmmsg(2)`: `recvmsg` for each message in turn, as Linux: a blocking
/// socket waits for each (the first only with MSG_WAITFORONE, after which
/// the rest are taken without waiting); `timeout` is checked after each
/// message. An error after some messages ends the batch with their count.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    msgvec: *mut libc::mmsghdr,
    vlen: c_uint,
    flags: c_int,
    timeout: *mut timespec,
) -> c_int {
    match ours(fd) {
        // SAFETY: passing the call on.
        None => unsafe { (real().recvmmsg)(fd, msgvec, vlen, flags, timeout) },
        Some(Err(e)) => {
            set_errno(e);
            -1
        }
        Some(Ok(s)) => guard(-1, || {
            if msgvec.is_null() && vlen > 0 {
                set_errno(libc::EFAULT);
                return -1;
            }
            let deadline = if timeout.is_null() {
                None
            } else {
                // SAFETY: the caller's timespec.
                let t = unsafe { *timeout };
                if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) {
                    set_errno(libc::EINVAL);
                    return -1;
                }
                Some(std::time::Instant::now() + Duration::new(t.tv_sec as u64, t.tv_nsec as u32))
            };
            let wait_for_one = flags & libc::MSG_WAITFORONE != 0;
            let mut flags = flags & !libc::MSG_WAITFORONE;
            let mut done: c_uint = 0;
            while done < vlen.min(MMSG_MAX) {
                // SAFETY: the caller's array of `vlen` mmsghdrs.
                let mm = unsafe { &mut *msgvec.add(done as usize) };
                // SAFETY: each holds a msghdr with valid buffers.
                let n = unsafe { recvmsg_ours(&s, &mut mm.msg_hdr, flags) };
                if n < 0 {
                    if done == 0 {
                        return -1;
                    }
                    break;
                }
                mm.msg_len = n as c_uint;
                done += 1;
                if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                    break;
                }
                if s.stream && n == 0 {
                    break;
                }
                if wait_for_one {
                    flags |= libc::MSG_DONTWAIT;
                }
            }
            done as c_int
        }),
    }
}

/// `sendmmsg(2)`: `sendmsg` for each message in turn; an error after some
/// messages ends the batch with their count, as Linux.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmmsg(
    fd: c_int,
    msgvec: *mut libc::mmsghdr,
    vlen: c_uint,
    flags: c_int,
) -> c_int {
    match ours(fd) {
        // SAFETY: passing the call on.
        None => unsafe { (real().sendmmsg)(fd, msgvec, vlen, flags) },
        Some(Err(e)) => {
            set_errno(e);
            -1
        }
        Some(Ok(s)) => guard(-1, || {
            if msgvec.is_null() && vlen > 0 {
                set_errno(libc::EFAULT);
                return -1;
            }
            let mut done: c_uint = 0;
            while done < vlen.min(MMSG_MAX) {
                // SAFETY: the caller's array of `vlen` mmsghdrs.
                let mm = unsafe { &mut *msgvec.add(done as usize) };
                // SAFETY: each holds a msghdr with valid buffers.
                let n = unsafe { sendmsg_ours(&s, &mm.msg_hdr, flags) };
                if n < 0 {
                    if done == 0 {
                        return -1;
                    }
                    break;
                }
                mm.msg_len = n as c_uint;
                done += 1;
            }
            done as c_int
        }),
    }
}
