//! `Ipv6Iface`: our IPv6 addresses (the link-local one made from the
//! MAC, RFC 4291 Appendix A, and the configured ones), the groups they
//! imply (all-nodes, solicited-node: RFC 4291 §2.7.1) and their Ethernet
//! addresses (RFC 2464 §7), the source address for a destination, and
//! what the link keeps for IPv6: the neighbor cache and the packets
//! waiting for a neighbor. A leaf the link holds; the protocol that uses
//! it is [`crate::iface::ipv6`].

use core::net::Ipv6Addr;
use std::time::Duration;

use smoltcp::wire::{EthernetAddress, Ipv6Cidr};

use crate::iface::ndp::Neighbors;
use crate::iface::resolve::{Limits, Resolving};

/// All-nodes multicast (RFC 4291 §2.7.1).
pub const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// How packets wait for a neighbor to answer (RFC 4861 §7.2.2: a
/// solicitation every `RETRANS_TIMER`, 1 s, `MAX_MULTICAST_SOLICIT`, 3,
/// of them; the queue bounded as ARP's).
const NDP_LIMITS: Limits = Limits {
    request_interval: Duration::from_secs(1),
    max_requests: 3,
    per_addr: 256,
    bytes_per_addr: 256 << 10,
    bytes_total: 1 << 20,
    max_addrs: 64,
};

/// Our IPv6 addresses and neighbors.
#[derive(Debug)]
pub(crate) struct Ipv6Iface {
    /// Our unicast addresses, the link-local one first; empty when IPv6
    /// is off (no address configured).
    addrs: Vec<Ipv6Cidr>,
    pub(crate) neighbors: Neighbors,
    /// Packets waiting for a neighbor's advertisement.
    pub(crate) pending: Resolving<Ipv6Addr>,
    /// Identification of the next fragmented datagram (RFC 8200 §4.5,
    /// RFC 7739: started from the stack's secret, not from zero).
    pub(crate) next_frag_id: u32,
    /// Solicitations owed to the next poll (retries).
    pub(crate) retry: Vec<Ipv6Addr>,
}

impl Default for Ipv6Iface {
    fn default() -> Self {
        Ipv6Iface {
            addrs: Vec::new(),
            neighbors: Neighbors::default(),
            pending: Resolving::new(NDP_LIMITS),
            next_frag_id: 0,
            retry: Vec::new(),
        }
    }
}

impl Ipv6Iface {
    /// IPv6 with the link-local address made from `mac` and `configured`
    /// (off when `configured` is empty); fragment IDs start from `secret`.
    pub(crate) fn new(mac: EthernetAddress, configured: &[Ipv6Cidr], secret: u64) -> Self {
        if configured.is_empty() {
            return Ipv6Iface::default();
        }
        let ll = Ipv6Cidr::new(link_local(mac), 64);
        let mut addrs = vec![ll];
        addrs.extend(configured.iter().filter(|c| c.address() != ll.address()));
        Ipv6Iface {
            addrs,
            next_frag_id: (secret ^ (secret >> 32)) as u32,
            ..Ipv6Iface::default()
        }
    }

    /// The source address for packets to `dst` (RFC 6724, for the
    /// addresses a host of ours has): the link-local one for a link-local
    /// or link-scope multicast destination, else the first configured one;
    /// `None` when IPv6 is off.
    pub(crate) fn source_for(&self, dst: &Ipv6Addr) -> Option<Ipv6Addr> {
        let link_scope =
            dst.is_unicast_link_local() || (dst.is_multicast() && dst.segments()[0] & 0x000f == 2);
        match self.addrs.as_slice() {
            [] => None,
            [ll, ..] if link_scope => Some(ll.address()),
            [ll] => Some(ll.address()),
            [_, first, ..] => Some(first.address()),
        }
    }

    /// Whether `a` is one of our addresses.
    pub(crate) fn owns(&self, a: &Ipv6Addr) -> bool {
        self.is_ours(a)
    }

    /// Whether IPv6 is on.
    pub(crate) fn enabled(&self) -> bool {
        !self.addrs.is_empty()
    }

    /// Our unicast addresses, the link-local one first.
    pub(crate) fn addrs(&self) -> impl Iterator<Item = Ipv6Addr> + '_ {
        self.addrs.iter().map(|c| c.address())
    }

    pub(crate) fn is_ours(&self, a: &Ipv6Addr) -> bool {
        self.addrs().any(|m| m == *a)
    }

    /// Whether we take packets to `dst`: one of our addresses, all-nodes,
    /// or the solicited-node group of one of them.
    pub(crate) fn accepts(&self, dst: &Ipv6Addr) -> bool {
        *dst == ALL_NODES || self.addrs().any(|m| m == *dst || solicited_node(m) == *dst)
    }

    /// Whether a frame to the multicast MAC `mac` is for a group we are in
    /// (RFC 2464 §7: 33:33 and the group's low 32 bits).
    pub(crate) fn accepts_mac(&self, mac: EthernetAddress) -> bool {
        self.enabled()
            && (mac == multicast_mac(ALL_NODES)
                || self
                    .addrs()
                    .any(|m| mac == multicast_mac(solicited_node(m))))
    }
}

/// The link-local address of a MAC (RFC 4291 Appendix A: modified EUI-64).
pub fn link_local(mac: EthernetAddress) -> Ipv6Addr {
    let m = mac.0;
    Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        m[0] ^ 0x02,
        m[1],
        m[2],
        0xff,
        0xfe,
        m[3],
        m[4],
        m[5],
    ])
}

/// The solicited-node multicast group of an address (RFC 4291 §2.7.1).
pub fn solicited_node(a: Ipv6Addr) -> Ipv6Addr {
    let o = a.octets();
    Ipv6Addr::from([
        0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, o[13], o[14], o[15],
    ])
}

/// The Ethernet group address of an IPv6 multicast group (RFC 2464 §7).
pub fn multicast_mac(group: Ipv6Addr) -> EthernetAddress {
    let o = group.octets();
    EthernetAddress([0x33, 0x33, o[12], o[13], o[14], o[15]])
}
