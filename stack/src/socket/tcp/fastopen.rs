//! TCP Fast Open on the server side (RFC 7413): the option on the wire
//! and the cookie. A leaf: the listener's decisions are in `io.rs`.
//!
//! The cookie is Linux's: SipHash-2-4, keyed by a 128-bit secret, of the
//! client's and the server's addresses (IPv4: 8 bytes, IPv6: 32), its
//! eight bytes in little-endian order. With the key a Linux host's
//! `net.ipv4.tcp_fastopen_key` gives, a client's cookie from that host
//! stays valid on ustack at the same address, and the reverse.

use core::hash::Hasher;
use core::net::IpAddr;

use siphasher::sip::SipHasher24;

/// The option kind RFC 7413 assigns.
pub const KIND: u8 = 34;
/// The experimental option (RFC 6994) clients used before kind 34: kind
/// 254 with this magic in its first two bytes.
pub const EXP_KIND: u8 = 254;
/// The experimental option's magic (RFC 7413 4.1.1's 0xF989).
pub const EXP_MAGIC: u16 = 0xf989;
/// The length of the cookies this stack makes (RFC 7413: 4 to 16).
pub const COOKIE_LEN: usize = 8;

/// A Fast Open option a SYN carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FastOpenOption<'a> {
    /// The cookie: empty for a cookie request.
    pub cookie: &'a [u8],
    /// It came as the experimental option (the answer goes back as one).
    pub exp: bool,
}

/// The Fast Open option among a SYN's TCP options (the bytes after the
/// fixed header), if there is one; a malformed option list has none.
pub fn find(mut options: &[u8]) -> Option<FastOpenOption<'_>> {
    while let [kind, rest @ ..] = options {
        match *kind {
            0 => return None,
            1 => options = rest,
            _ => {
                let len = usize::from(*rest.first()?);
                let body = options.get(2..len.max(2))?;
                if len < 2 {
                    return None;
                }
                match *kind {
                    KIND => {
                        return Some(FastOpenOption {
                            cookie: body,
                            exp: false,
                        });
                    }
                    EXP_KIND if body.len() >= 2 && body[..2] == EXP_MAGIC.to_be_bytes() => {
                        return Some(FastOpenOption {
                            cookie: &body[2..],
                            exp: true,
                        });
                    }
                    _ => {}
                }
                options = &options[len..];
            }
        }
    }
    None
}

/// The cookie for a client at `client` reaching us at `server`, under `key`.
pub fn cookie(key: (u64, u64), client: IpAddr, server: IpAddr) -> [u8; COOKIE_LEN] {
    let mut h = SipHasher24::new_with_keys(key.0, key.1);
    match (client, server) {
        (IpAddr::V4(c), IpAddr::V4(s)) => {
            h.write(&c.octets());
            h.write(&s.octets());
        }
        (c, s) => {
            h.write(&v6_octets(c));
            h.write(&v6_octets(s));
        }
    }
    h.finish().to_le_bytes()
}

fn v6_octets(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// The option a SYN-ACK carries to give the client `cookie`, as bytes
/// (`len` of them used), in the form the client asked in.
pub fn option_bytes(cookie: [u8; COOKIE_LEN], exp: bool) -> ([u8; 12], usize) {
    let mut out = [0; 12];
    if exp {
        out[0] = EXP_KIND;
        out[1] = 12;
        out[2..4].copy_from_slice(&EXP_MAGIC.to_be_bytes());
        out[4..].copy_from_slice(&cookie);
        (out, 12)
    } else {
        out[0] = KIND;
        out[1] = 10;
        out[2..10].copy_from_slice(&cookie);
        (out, 10)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    /// Linux's key `a1a1a1a1-b2b2b2b2-c3c3c3c3-d4d4d4d4` (the words in
    /// little-endian order, two to a SipHash key half).
    const KEY: (u64, u64) = (0xb2b2_b2b2_a1a1_a1a1, 0xd4d4_d4d4_c3c3_c3c3);

    #[test]
    fn cookie_is_linuxs() {
        // packetdrill's TFO_COOKIE for 192.0.2.1 -> 192.168.0.1 under the
        // key its defaults.sh sets, which Linux's SYN-ACKs carry.
        let c = cookie(
            KEY,
            "192.0.2.1".parse().unwrap(),
            "192.168.0.1".parse().unwrap(),
        );
        assert_eq!(c, [0x30, 0x21, 0xb9, 0xd8, 0x89, 0x01, 0x7e, 0xeb]);
        let c6 = cookie(
            KEY,
            "fd3d:fa7b:d17d::1".parse().unwrap(),
            "fd3d:a0b:17d6::1".parse().unwrap(),
        );
        assert_eq!(c6, [0xc1, 0xd1, 0xe9, 0x74, 0x2a, 0x47, 0xa9, 0xbc]);
    }

    #[test]
    fn finds_both_forms_and_rejects_malformed_lists() {
        let plain = [2, 4, 5, 0xb4, 1, 1, 34, 10, 1, 2, 3, 4, 5, 6, 7, 8];
        let f = find(&plain).unwrap();
        assert_eq!((f.cookie, f.exp), (&[1, 2, 3, 4, 5, 6, 7, 8][..], false));
        let exp = [4, 2, 254, 4, 0xf9, 0x89];
        let f = find(&exp).unwrap();
        assert_eq!((f.cookie, f.exp), (&[][..], true));
        assert_eq!(find(&[254, 4, 0x12, 0x34]), None, "another experiment");
        assert_eq!(find(&[34, 1]), None, "length below 2");
        assert_eq!(find(&[34, 12, 1, 2]), None, "runs past the end");
        assert_eq!(find(&[0, 34, 2]), None, "after the end of the list");
        let (b, n) = option_bytes([9; 8], true);
        assert_eq!(find(&b[..n]).map(|f| f.cookie), Some(&[9u8; 8][..]));
        let (b, n) = option_bytes([7; 8], false);
        assert_eq!(
            find(&b[..n]).map(|f| (f.cookie, f.exp)),
            Some((&[7u8; 8][..], false))
        );
    }
}
