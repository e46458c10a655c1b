//! Control messages (`struct cmsghdr`) in the kernel's layout: built for
//! `recvmsg` and `getsockopt`, parsed from `sendmsg`.

use std::ffi::c_int;

use crate::real::Res;

/// Control messages in the kernel's layout (`struct cmsghdr`, each padded
/// to the size of a long) for a buffer of `room` bytes: the bytes, and
/// whether some did not fit (MSG_CTRUNC).
pub fn cmsgs(list: &[(c_int, c_int, &[u8])], room: usize) -> (Vec<u8>, bool) {
    let hdr = std::mem::size_of::<libc::cmsghdr>();
    let align = std::mem::size_of::<usize>();
    let mut out = Vec::new();
    for &(level, ty, data) in list {
        let len = hdr + data.len();
        let space = len.div_ceil(align) * align;
        if out.len() + space > room {
            return (out, true);
        }
        out.extend_from_slice(&len.to_ne_bytes());
        out.extend_from_slice(&level.to_ne_bytes());
        out.extend_from_slice(&ty.to_ne_bytes());
        out.extend_from_slice(data);
        out.resize(out.len() + space - len, 0);
    }
    (out, false)
}

/// The control messages in a caller's buffer: (level, type, data) each.
pub fn parse_cmsgs(ctl: &[u8]) -> Res<Vec<(c_int, c_int, &[u8])>> {
    let hdr = std::mem::size_of::<libc::cmsghdr>();
    let align = std::mem::size_of::<usize>();
    let mut v = Vec::new();
    let mut at = 0;
    while ctl.len() >= at + hdr {
        let field = |o: usize, n: usize| &ctl[at + o..at + o + n];
        let len = usize::from_ne_bytes(field(0, 8).try_into().map_err(|_| libc::EINVAL)?);
        let level = c_int::from_ne_bytes(field(8, 4).try_into().map_err(|_| libc::EINVAL)?);
        let ty = c_int::from_ne_bytes(field(12, 4).try_into().map_err(|_| libc::EINVAL)?);
        if len < hdr || at + len > ctl.len() {
            return Err(libc::EINVAL);
        }
        v.push((level, ty, &ctl[at + hdr..at + len]));
        at += len.div_ceil(align) * align;
    }
    Ok(v)
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn control_messages_round_trip_in_the_kernels_layout() {
        let pktinfo = [7u8; 12];
        let (b, cut) = cmsgs(&[(libc::IPPROTO_IP, libc::IP_PKTINFO, &pktinfo)], 64);
        assert!(!cut);
        // CMSG_SPACE(12) on x86-64: a 16-byte header, 12 bytes padded to 16.
        assert_eq!(b.len(), 32);
        assert_eq!(usize::from_ne_bytes(b[..8].try_into().unwrap()), 28);
        let back = parse_cmsgs(&b).unwrap();
        assert_eq!(
            back,
            vec![(libc::IPPROTO_IP, libc::IP_PKTINFO, &pktinfo[..])]
        );
        // No room: nothing written, MSG_CTRUNC.
        let (b, cut) = cmsgs(&[(libc::IPPROTO_IP, libc::IP_PKTINFO, &pktinfo)], 31);
        assert!(cut && b.is_empty());
        // A header claiming more than the buffer: EINVAL.
        let mut bad = cmsgs(&[(0, 0, &[1, 2, 3, 4])], 64).0;
        bad[0] = 200;
        assert_eq!(parse_cmsgs(&bad), Err(libc::EINVAL));
    }
}
