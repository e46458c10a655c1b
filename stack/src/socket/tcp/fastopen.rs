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
/// The longest cookie RFC 7413 4.1.1 allows.
pub const MAX_COOKIE: usize = 16;
/// The shortest cookie RFC 7413 4.1.1 allows.
pub const MIN_COOKIE: usize = 4;

/// A cookie as a SYN or SYN-ACK carries it: 4 to 16 bytes, or none (a
/// client's SYN asking for one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cookie {
    bytes: [u8; MAX_COOKIE],
    len: u8,
}

impl Cookie {
    /// No cookie: the option of a SYN that asks for one.
    pub const REQUEST: Cookie = Cookie {
        bytes: [0; MAX_COOKIE],
        len: 0,
    };

    /// A cookie of `b`, when its length is one RFC 7413 allows.
    pub fn new(b: &[u8]) -> Option<Cookie> {
        if !(MIN_COOKIE..=MAX_COOKIE).contains(&b.len()) {
            return None;
        }
        let mut bytes = [0; MAX_COOKIE];
        bytes[..b.len()].copy_from_slice(b);
        Some(Cookie {
            bytes,
            len: b.len() as u8,
        })
    }

    /// The cookie's bytes (none for a request).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// Whether this is a request (no cookie).
    pub fn is_request(&self) -> bool {
        self.len == 0
    }
}

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

/// The option carrying `cookie` (a SYN-ACK's answer, a client's SYN, or
/// with an empty cookie a client's request), as bytes (`len` of them
/// used), in kind 34 or the experimental form.
pub fn option_bytes(cookie: &Cookie, exp: bool) -> ([u8; 4 + MAX_COOKIE], usize) {
    let mut out = [0; 4 + MAX_COOKIE];
    let c = cookie.as_bytes();
    if exp {
        out[0] = EXP_KIND;
        out[2..4].copy_from_slice(&EXP_MAGIC.to_be_bytes());
        out[4..4 + c.len()].copy_from_slice(c);
        out[1] = (4 + c.len()) as u8;
        (out, 4 + c.len())
    } else {
        out[0] = KIND;
        out[2..2 + c.len()].copy_from_slice(c);
        out[1] = (2 + c.len()) as u8;
        (out, 2 + c.len())
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
        let nine = Cookie::new(&[9; 8]).unwrap();
        let (b, n) = option_bytes(&nine, true);
        assert_eq!(find(&b[..n]).map(|f| f.cookie), Some(&[9u8; 8][..]));
        let seven = Cookie::new(&[7; 16]).unwrap();
        let (b, n) = option_bytes(&seven, false);
        assert_eq!(
            find(&b[..n]).map(|f| (f.cookie, f.exp)),
            Some((&[7u8; 16][..], false))
        );
        let (b, n) = option_bytes(&Cookie::REQUEST, false);
        assert_eq!(&b[..n], &[34, 2]);
        assert_eq!(find(&b[..n]).map(|f| f.cookie), Some(&[][..]));
        assert_eq!(Cookie::new(&[1; 3]), None, "shorter than 4");
        assert_eq!(Cookie::new(&[1; 17]), None, "longer than 16");
    }
}
