//! The out-of-band address exchanges of the stock RDMA tools, as bytes.
//!
//! Verbs programs learn a peer's QP number and GID over a TCP connection
//! before any RDMA packet moves. Two formats matter for UD:
//!
//! - rdma-core's `ibv_ud_pingpong` (and `ibv_rc_pingpong`): one 52-byte
//!   message each way, `"%04x:%06x:%06x:%s"` of LID, QPN, PSN and the GID as
//!   32 hex digits of its 16 bytes in order, NUL-terminated; the client then
//!   writes `"done\0"`. Default TCP port [`PINGPONG_PORT`].
//! - perftest (`ib_send_lat`, `ib_send_bw`, ...): a 16-byte version string,
//!   two big-endian `u32`s (page and cache-line size), a 2-byte MTU enum
//!   digit, then 108-byte key messages ([`KeyMsg`]) at fixed points, each
//!   written in one piece and read as exactly that many bytes; `"done\0"` at
//!   the end. Default TCP port [`PERFTEST_PORT`].
//!
//! Only the formats live here (the engine holds no sockets); the apps speak
//! them over the stack's own TCP.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// `ibv_ud_pingpong`'s default TCP port.
pub const PINGPONG_PORT: u16 = 18515;
/// perftest's default TCP port.
pub const PERFTEST_PORT: u16 = 18515;
/// Length of an `ibv_*_pingpong` address message (NUL included).
pub const PINGPONG_MSG_LEN: usize = 52;
/// Length of perftest's key message with a GID (NUL included).
pub const KEY_MSG_LEN: usize = 108;
/// Length of perftest's version message.
pub const VERSION_LEN: usize = 16;
/// The perftest version we announce (perftest refuses peers below 5.70).
pub const PERFTEST_VERSION: &str = "6.06";
/// The closing message of both tools.
pub const DONE: &[u8; 5] = b"done\0";

/// A GID for an IPv4 address: `::ffff:a.b.c.d`, as RoCEv2 peers list it.
pub fn ipv4_gid(ip: Ipv4Addr) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip.octets());
    g
}

/// The IPv4 address of an IPv4-mapped GID.
pub fn gid_ipv4(g: &[u8; 16]) -> Option<Ipv4Addr> {
    (g[..10] == [0; 10] && g[10..12] == [0xff, 0xff])
        .then(|| Ipv4Addr::new(g[12], g[13], g[14], g[15]))
}

/// The GID of an address: IPv4-mapped for IPv4, the address itself for
/// IPv6 (RoCEv2 GIDs are IPv6 addresses).
pub fn ip_gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => ipv4_gid(v4),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The address of a GID: IPv4 for an IPv4-mapped one, else IPv6; `None`
/// for the all-zero GID (no address).
pub fn gid_ip(g: &[u8; 16]) -> Option<IpAddr> {
    match gid_ipv4(g) {
        Some(v4) => Some(v4.into()),
        None if *g == [0; 16] => None,
        None => Some(Ipv6Addr::from(*g).into()),
    }
}

fn hex_field(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

/// The text before the first NUL, if it is ASCII.
fn c_str(b: &[u8]) -> Option<&str> {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    std::str::from_utf8(&b[..end]).ok().filter(|s| s.is_ascii())
}

/// One side's address in `ibv_*_pingpong`'s exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PingpongDest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// Starting PSN (24 bits; UD receivers ignore it).
    pub psn: u32,
    /// GID, 16 bytes in wire order.
    pub gid: [u8; 16],
}

impl PingpongDest {
    /// The 52-byte message, NUL-terminated as the tool writes it.
    pub fn to_wire(&self) -> [u8; PINGPONG_MSG_LEN] {
        let mut s = format!(
            "{:04x}:{:06x}:{:06x}:",
            self.lid,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff
        );
        for b in self.gid {
            s += &format!("{b:02x}");
        }
        let mut out = [0u8; PINGPONG_MSG_LEN];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    /// Parses a peer's message (`None` if it is not one).
    pub fn parse(b: &[u8]) -> Option<Self> {
        let s = c_str(b)?;
        let mut f = s.split(':');
        let lid = u16::try_from(hex_field(f.next()?)?).ok()?;
        let qpn = u32::try_from(hex_field(f.next()?)?).ok()?;
        let psn = u32::try_from(hex_field(f.next()?)?).ok()?;
        let g = f.next()?;
        if f.next().is_some() || g.len() != 32 || qpn > 0xff_ffff {
            return None;
        }
        let mut gid = [0u8; 16];
        for (i, byte) in gid.iter_mut().enumerate() {
            *byte = u8::from_str_radix(g.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(PingpongDest {
            lid,
            qpn,
            psn: psn & 0xff_ffff,
            gid,
        })
    }
}

/// perftest's key message (`KEY_PRINT_FMT_GID`): what one side tells the
/// other about its QP before a test, and again at each sync point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyMsg {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// Outstanding RDMA reads (1 for SEND tests).
    pub out_reads: u16,
    /// QP number.
    pub qpn: u32,
    /// Starting PSN.
    pub psn: u32,
    /// Memory key of the buffer (unused by SEND tests).
    pub rkey: u32,
    /// Buffer address (unused by SEND tests).
    pub vaddr: u64,
    /// GID, 16 bytes in wire order.
    pub gid: [u8; 16],
    /// Shared receive queue number (0).
    pub srqn: u32,
}

impl KeyMsg {
    /// The 108-byte message: 107 characters ending in `:`, then NUL.
    pub fn to_wire(&self) -> [u8; KEY_MSG_LEN] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff,
            self.rkey,
            self.vaddr
        );
        for b in self.gid {
            s += &format!("{b:02x}:");
        }
        s += &format!("{:08x}:", self.srqn);
        let mut out = [0u8; KEY_MSG_LEN];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    /// Parses a peer's key message with a GID.
    pub fn parse(b: &[u8]) -> Option<Self> {
        let s = c_str(b)?;
        let f: Vec<&str> = s.split(':').collect();
        // 6 fields, 16 GID bytes, srqn, and the empty tail after the last ':'.
        if f.len() != 24 || !f[23].is_empty() {
            return None;
        }
        let mut gid = [0u8; 16];
        for (i, byte) in gid.iter_mut().enumerate() {
            *byte = u8::try_from(hex_field(f[6 + i])?).ok()?;
        }
        Some(KeyMsg {
            lid: u16::try_from(hex_field(f[0])?).ok()?,
            out_reads: u16::try_from(hex_field(f[1])?).ok()?,
            qpn: u32::try_from(hex_field(f[2])?).ok()? & 0xff_ffff,
            psn: u32::try_from(hex_field(f[3])?).ok()? & 0xff_ffff,
            rkey: u32::try_from(hex_field(f[4])?).ok()?,
            vaddr: hex_field(f[5])?,
            gid,
            srqn: u32::try_from(hex_field(f[22])?).ok()?,
        })
    }
}

/// perftest's version message: `"6.06"`, NUL-padded to 16 bytes.
pub fn version_msg() -> [u8; VERSION_LEN] {
    let mut out = [0u8; VERSION_LEN];
    out[..PERFTEST_VERSION.len()].copy_from_slice(PERFTEST_VERSION.as_bytes());
    out
}

/// A peer's perftest version (`atof` of the message), if it is one.
pub fn parse_version(b: &[u8]) -> Option<f64> {
    c_str(b)?.trim().parse().ok()
}

/// The InfiniBand MTU enum perftest exchanges (1 = 256 ... 5 = 4096).
pub fn mtu_enum(bytes: usize) -> u8 {
    match bytes {
        4096.. => 5,
        2048.. => 4,
        1024.. => 3,
        512.. => 2,
        _ => 1,
    }
}

/// Bytes of an MTU enum (1..=5), `None` outside it.
pub fn mtu_bytes(e: u8) -> Option<usize> {
    (1..=5).contains(&e).then(|| 128usize << e)
}

/// perftest's 2-byte MTU message: the enum as one ASCII digit and a NUL.
pub fn mtu_msg(bytes: usize) -> [u8; 2] {
    [b'0' + mtu_enum(bytes), 0]
}

/// Parses a peer's MTU message into bytes.
pub fn parse_mtu_msg(b: &[u8]) -> Option<usize> {
    mtu_bytes(c_str(b)?.parse().ok()?)
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn pingpong_messages_match_the_tool() {
        let d = PingpongDest {
            lid: 0,
            qpn: 0x11,
            psn: 0xa3f2c1,
            gid: ipv4_gid(Ipv4Addr::new(192, 168, 1, 2)),
        };
        let w = d.to_wire();
        assert_eq!(
            &w[..51],
            b"0000:000011:a3f2c1:00000000000000000000ffffc0a80102"
        );
        assert_eq!(w[51], 0);
        assert_eq!(PingpongDest::parse(&w), Some(d));
        assert_eq!(gid_ipv4(&d.gid), Some(Ipv4Addr::new(192, 168, 1, 2)));
        // Bad input: not a message, a short GID, a QPN out of range.
        assert_eq!(PingpongDest::parse(b"done\0"), None);
        assert_eq!(PingpongDest::parse(b"0000:000011:a3f2c1:00ff"), None);
        assert_eq!(
            PingpongDest::parse(b"0000:1000000:000000:00000000000000000000ffffc0a80102"),
            None
        );
        assert_eq!(PingpongDest::parse(&[0xff; 52]), None);
    }

    #[test]
    fn gids_of_either_family() {
        let v4: IpAddr = Ipv4Addr::new(10, 77, 0, 2).into();
        let v6: IpAddr = "fd77::2".parse().unwrap();
        assert_eq!(ip_gid(v4), ipv4_gid(Ipv4Addr::new(10, 77, 0, 2)));
        assert_eq!(gid_ip(&ip_gid(v4)), Some(v4));
        assert_eq!(ip_gid(v6)[..2], [0xfd, 0x77]);
        assert_eq!(gid_ip(&ip_gid(v6)), Some(v6));
        assert_eq!(gid_ip(&[0; 16]), None);
    }

    #[test]
    fn perftest_key_messages_match_the_tool() {
        let k = KeyMsg {
            lid: 0,
            out_reads: 1,
            qpn: 0x11,
            psn: 0x5a3c1e,
            rkey: 0x1234,
            vaddr: 0x55d0_c0a8_e000,
            gid: ipv4_gid(Ipv4Addr::new(192, 168, 1, 2)),
            srqn: 0,
        };
        let w = k.to_wire();
        assert_eq!(
            std::str::from_utf8(&w[..107]).unwrap(),
            "0000:0001:000011:5a3c1e:00001234:000055d0c0a8e000:00:00:00:00:00:00:00:00:00:00:ff:ff:c0:a8:01:02:00000000:"
        );
        assert_eq!(w[107], 0);
        assert_eq!(KeyMsg::parse(&w), Some(k));
        assert_eq!(KeyMsg::parse(&w[..50]), None);
        assert_eq!(KeyMsg::parse(b"6.06\0"), None);
    }

    #[test]
    fn perftest_preamble_messages() {
        let v = version_msg();
        assert_eq!(&v[..5], b"6.06\0");
        assert_eq!(parse_version(&v), Some(6.06));
        assert_eq!(mtu_msg(1024), *b"3\0");
        assert_eq!(parse_mtu_msg(b"3\0"), Some(1024));
        assert_eq!(parse_mtu_msg(b"5\0"), Some(4096));
        assert_eq!(parse_mtu_msg(b"9\0"), None);
        assert_eq!(mtu_enum(1500), 3);
        assert_eq!(mtu_enum(256), 1);
    }
}
