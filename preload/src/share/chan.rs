//! A client's channel to the owner: a `SOCK_SEQPACKET` socketpair, one
//! message a call and one an answer, a descriptor riding along where a
//! call needs one (`SCM_RIGHTS`). The C library's own calls, never the
//! layer's.

use std::ffi::c_int;
use std::os::fd::RawFd;

use crate::real::{Res, errno, real};

/// The largest message: a call with 64 KiB of data and its header.
pub const MAX_MSG: usize = 80 * 1024;

/// A new channel: (one end, the other), both close-on-exec.
pub fn pair() -> Res<(RawFd, RawFd)> {
    let mut fds = [-1; 2];
    // SAFETY: socketpair fills two ints.
    let r = unsafe {
        (real().socketpair)(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r < 0 {
        return Err(errno());
    }
    Ok((high(fds[0]), high(fds[1])))
}

/// Move a channel's end to a number from 512 up (close-on-exec), out of
/// the way of programs that `dup2` onto small fixed numbers (sshd's
/// re-exec puts its pipes on 3 to 5); where that fails, keep `fd`.
pub fn high(fd: RawFd) -> RawFd {
    // SAFETY: duplicating a descriptor this process owns.
    let moved = unsafe { (real().fcntl)(fd, libc::F_DUPFD_CLOEXEC, 512) };
    if moved < 0 {
        return fd;
    }
    close(fd);
    moved
}

/// Close a channel's end.
pub fn close(fd: RawFd) {
    // SAFETY: a channel descriptor this process owns.
    unsafe { (real().close)(fd) };
}

/// A client's message without a descriptor: a plain `write` (a seqpacket
/// socket keeps the message whole). sshd's pre-authentication sandbox, a
/// seccomp filter, lets `read` and `write` through and kills a process
/// that calls `sendmsg`. Its price: when the owner is gone, a client that
/// does not ignore `SIGPIPE` dies of it.
fn write_msg(fd: RawFd, msg: &[u8]) -> Res<()> {
    loop {
        // SAFETY: writing our buffer to the channel.
        let r = unsafe { (real().write)(fd, msg.as_ptr().cast(), msg.len()) };
        if r >= 0 {
            return Ok(());
        }
        let e = errno();
        if e != libc::EINTR {
            return Err(e);
        }
    }
}

/// Send one message, with `pass` as `SCM_RIGHTS` when given (never a
/// `SIGPIPE`: the owner answers clients that may be gone).
pub fn send(fd: RawFd, msg: &[u8], pass: Option<RawFd>) -> Res<()> {
    let mut iov = libc::iovec {
        iov_base: msg.as_ptr() as *mut libc::c_void,
        iov_len: msg.len(),
    };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<c_int>() as u32) } as usize;
    let mut ctl = vec![0u8; space];
    // SAFETY: an all-zero msghdr is valid; its pointers are set below.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    if let Some(p) = pass {
        m.msg_control = ctl.as_mut_ptr().cast();
        m.msg_controllen = space;
        // SAFETY: the control buffer holds one header with one int.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&m);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<c_int>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<c_int>(), p);
        }
    }
    loop {
        // SAFETY: `m` points at live buffers for the call.
        let r = unsafe { (real().sendmsg)(fd, &m, libc::MSG_NOSIGNAL) };
        if r >= 0 {
            return Ok(());
        }
        let e = errno();
        if e != libc::EINTR {
            return Err(e);
        }
    }
}

/// Receive one message into `buf`: its length (0: the other end is gone)
/// and the descriptor that came with it.
pub fn recv(fd: RawFd, buf: &mut [u8]) -> Res<(usize, Option<RawFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<c_int>() as u32) } as usize;
    let mut ctl = vec![0u8; space];
    // SAFETY: an all-zero msghdr is valid; its pointers are set below.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl.as_mut_ptr().cast();
    m.msg_controllen = space;
    let n = loop {
        // SAFETY: `m` points at live buffers for the call.
        let r = unsafe { (real().recvmsg)(fd, &mut m, libc::MSG_CMSG_CLOEXEC) };
        if r >= 0 {
            break r as usize;
        }
        let e = errno();
        if e != libc::EINTR {
            return Err(e);
        }
    };
    let mut got = None;
    // SAFETY: the kernel filled the control buffer as `m` says.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&m);
        if !c.is_null() && (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS
        {
            got = Some(std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<c_int>()));
        }
    }
    Ok((n, got))
}

/// A call: send `msg` (and `pass`), wait for the answer. EPIPE when the
/// owner is gone.
pub fn call(fd: RawFd, msg: &[u8], pass: Option<RawFd>) -> Res<Vec<u8>> {
    match pass {
        Some(_) => send(fd, msg, pass)?,
        None => write_msg(fd, msg)?,
    }
    let mut buf = vec![0u8; MAX_MSG];
    // The owner never passes a descriptor back: a plain `read` (see
    // `write_msg`).
    let n = loop {
        // SAFETY: reading into our buffer.
        let r = unsafe { (real().read)(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if r >= 0 {
            break r as usize;
        }
        let e = errno();
        if e != libc::EINTR {
            return Err(e);
        }
    };
    if n == 0 {
        return Err(libc::EPIPE);
    }
    buf.truncate(n);
    Ok(buf)
}
