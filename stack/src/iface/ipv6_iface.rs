//! `Ipv6Iface`: our IPv6 addresses (the link-local one made from the
//! MAC, RFC 4291 Appendix A, and the configured ones), the groups they
//! imply (all-nodes, solicited-node: RFC 4291 §2.7.1) and their Ethernet
//! addresses (RFC 2464 §7), the source address for a destination, and
//! what the link keeps for IPv6: the neighbor cache, the packets waiting
//! for a neighbor, and what router advertisements taught (RFC 4861 §6.3.4:
//! default routers, on-link prefixes, the link MTU; RFC 4862: addresses
//! made from advertised prefixes), all bounded. A leaf the link holds; the
//! protocol that uses it is [`crate::iface::ipv6`].

use core::net::Ipv6Addr;
use std::time::Duration;

use smoltcp::wire::{EthernetAddress, Ipv6Cidr};

use crate::iface::mld::Mld;
use crate::iface::ndp::Neighbors;
use crate::iface::resolve::{Limits, Resolving};
use crate::time::Instant;

/// The least MTU an IPv6 link has (RFC 8200 §5).
pub(crate) const MIN_MTU: usize = 1280;

/// All-routers multicast (RFC 4291 §2.7.1): router solicitations go here.
pub const ALL_ROUTERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);

/// Most default routers kept from advertisements (more are ignored and
/// counted: an advertisement flood cannot grow the table).
pub const MAX_ROUTERS: usize = 8;

/// Most advertised prefixes kept, on-link ones and addresses made from
/// them each (Linux's `max_addresses` is 16 too).
pub const MAX_PREFIXES: usize = 16;

/// Router solicitations sent at start when no advertisement came (RFC
/// 4861 §10 `MAX_RTR_SOLICITATIONS`), `RTR_SOLICITATION_INTERVAL` apart.
pub(crate) const RTR_SOLICITATIONS: u8 = 3;
/// See [`RTR_SOLICITATIONS`].
pub(crate) const RTR_SOLICITATION_INTERVAL: Duration = Duration::from_secs(4);

/// Something an advertisement taught, kept until `until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Learnt<T> {
    pub(crate) what: T,
    pub(crate) until: Instant,
}

/// Most redirected destinations remembered (the oldest gives way).
pub const MAX_REDIRECTS: usize = 64;
/// How long a redirect holds: as long as Linux keeps a route it learnt
/// from one that nothing refreshed (its route cache's 10 minutes).
pub(crate) const REDIRECT_LIFETIME: Duration = Duration::from_secs(600);

/// Most destinations whose path MTU is remembered (the oldest gives way).
pub const MAX_PATH_MTUS: usize = 64;
/// How long a learnt path MTU holds before the link MTU is tried again
/// (RFC 8201 §5.3 says at least 5 minutes; Linux's `mtu_expires` is 10).
pub(crate) const PATH_MTU_LIFETIME: Duration = Duration::from_secs(600);

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
    /// Our MAC (interface identifiers of addresses made from prefixes).
    mac: EthernetAddress,
    /// Take router advertisements (Linux's `accept_ra`).
    pub(crate) accept_ra: bool,
    /// A configured default router (`--gw` of IPv6).
    pub(crate) gateway: Option<Ipv6Addr>,
    /// Default routers advertised, by their link-local address.
    pub(crate) routers: Vec<Learnt<Ipv6Addr>>,
    /// Prefixes advertised as on-link.
    pub(crate) on_link: Vec<Learnt<Ipv6Cidr>>,
    /// Addresses made from advertised prefixes (SLAAC).
    pub(crate) slaac: Vec<Learnt<Ipv6Cidr>>,
    /// Redirects taken (RFC 4861 §8.3): a destination and the neighbor
    /// its packets go to instead of the default router (itself when the
    /// router says it is on-link), until when; at most [`MAX_REDIRECTS`].
    pub(crate) redirects: Vec<(Ipv6Addr, Learnt<Ipv6Addr>)>,
    /// Path MTUs packet too big messages taught (RFC 8201 §5.2), per
    /// destination, until when (§5.3: then the link MTU is tried again);
    /// at most [`MAX_PATH_MTUS`].
    pub(crate) path_mtus: Vec<(Ipv6Addr, Learnt<usize>)>,
    /// Addresses made from advertised prefixes that duplicate address
    /// detection has not yet cleared (RFC 4862 §5.4): not used, and not
    /// answered for, until then. Beside each: when its probe's wait ends
    /// (None: the probe is still to send).
    pub(crate) tentative: Vec<(Learnt<Ipv6Cidr>, Option<Instant>)>,
    /// The link MTU an advertisement gave (never above the port's).
    pub(crate) mtu: Option<usize>,
    /// Router solicitations sent, and when the next is due (None: not
    /// armed yet; the first poll arms it `first_solicit_delay` later).
    pub(crate) solicits_sent: u8,
    pub(crate) next_solicit: Option<Instant>,
    /// RFC 4861 §6.3.7: a random delay of up to a second before the
    /// first solicitation (from the stack's secret), so hosts started
    /// together do not solicit at once.
    pub(crate) first_solicit_delay: Duration,
    /// Duplicate address detection probes owed to the next poll (RFC 4862
    /// §5.4.2), one per address.
    pub(crate) dad_due: bool,
    /// The first of our addresses another host was seen holding (it
    /// advertised it: RFC 4862 §5.4.4), and that host's MAC.
    pub(crate) conflict: Option<(Ipv6Addr, EthernetAddress)>,
    /// MLDv2 reports owed for our solicited-node groups.
    pub(crate) mld: Mld,
    /// The last route the transmit path worked out, to a neighbor whose
    /// MAC is known (a run of segments to one peer looks it up once).
    /// Only ICMPv6 input and the poll change what a route depends on
    /// (addresses, prefixes, routers, redirects, path MTUs, neighbors):
    /// both forget it, on the way in and on the way out.
    /// The destination and its route (the MAC always known).
    pub(crate) route_memo: Option<(Ipv6Addr, Route)>,
    /// When the poll next has work ([`crate::iface::ipv6::poll_at`] after
    /// the last one; `Instant::ZERO`: at once). What may bring work
    /// sooner (ICMPv6 input, a packet held for a neighbor, a probe owed)
    /// sets it to zero.
    pub(crate) poll_due: Instant,
    /// The flow label last worked out, with its flow (source,
    /// destination, protocol, ports): a keyed hash per packet otherwise.
    pub(crate) label_memo: Option<(Ipv6Addr, Ipv6Addr, u8, u32, u32)>,
}

/// Where packets to one destination go, and from which of our addresses
/// (what the transmit path works out from the tables, and remembers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Route {
    /// The next hop: the destination on-link, else the router.
    pub(crate) hop: Ipv6Addr,
    /// The next hop's MAC, when known.
    pub(crate) mac: Option<EthernetAddress>,
    /// The path MTU to the destination.
    pub(crate) mtu: usize,
    /// Our source address for it ([`Ipv6Iface::source_for`]).
    pub(crate) src: Option<Ipv6Addr>,
}

impl Default for Ipv6Iface {
    fn default() -> Self {
        Ipv6Iface {
            addrs: Vec::new(),
            neighbors: Neighbors::default(),
            pending: Resolving::new(NDP_LIMITS),
            next_frag_id: 0,
            retry: Vec::new(),
            mac: EthernetAddress([0; 6]),
            accept_ra: true,
            gateway: None,
            routers: Vec::new(),
            on_link: Vec::new(),
            slaac: Vec::new(),
            tentative: Vec::new(),
            redirects: Vec::new(),
            path_mtus: Vec::new(),
            mtu: None,
            solicits_sent: 0,
            next_solicit: None,
            first_solicit_delay: Duration::ZERO,
            dad_due: false,
            conflict: None,
            mld: Mld::new(0),
            route_memo: None,
            poll_due: Instant::ZERO,
            label_memo: None,
        }
    }
}

impl Ipv6Iface {
    /// IPv6 with the link-local address made from `mac` and `configured`
    /// (off when `configured` is empty, unless `auto`: the link-local
    /// address alone); fragment IDs start from `secret`.
    pub(crate) fn new(
        mac: EthernetAddress,
        configured: &[Ipv6Cidr],
        auto: bool,
        secret: u64,
    ) -> Self {
        if configured.is_empty() && !auto {
            return Ipv6Iface::default();
        }
        let ll = Ipv6Cidr::new(link_local(mac), 64);
        let mut addrs = vec![ll];
        addrs.extend(configured.iter().filter(|c| c.address() != ll.address()));
        Ipv6Iface {
            addrs,
            mac,
            next_frag_id: (secret ^ (secret >> 32)) as u32,
            first_solicit_delay: Duration::from_micros(1 + (secret >> 20) % 1_000_000),
            mld: Mld::new(secret.rotate_left(7)),
            ..Ipv6Iface::default()
        }
    }

    /// With router advertisements taken (`accept_ra`) or not, and a
    /// configured default router.
    pub(crate) fn routing(mut self, accept_ra: bool, gateway: Option<Ipv6Addr>) -> Self {
        self.accept_ra = accept_ra;
        self.gateway = gateway;
        self
    }

    /// The address of ours made from an advertised /64 `prefix` and the
    /// interface identifier of our MAC (RFC 4862 §5.5.3 d, modified EUI-64
    /// as the link-local address).
    pub(crate) fn slaac_addr(&self, prefix: Ipv6Addr) -> Ipv6Addr {
        let mut a = prefix.octets();
        a[8..].copy_from_slice(&link_local(self.mac).octets()[8..]);
        Ipv6Addr::from(a)
    }

    /// The neighbor a packet to `dst` goes to (RFC 4861 §5.2): `dst`
    /// itself when on-link (link-local, multicast, in the prefix of one of
    /// our configured addresses or of an advertised on-link prefix), else
    /// the configured gateway or the first advertised default router;
    /// `None`: no route (or IPv6 off).
    pub(crate) fn next_hop(&self, dst: &Ipv6Addr) -> Option<Ipv6Addr> {
        if !self.enabled() {
            return None;
        }
        let on_link = dst.is_unicast_link_local()
            || dst.is_multicast()
            || self.addrs.iter().any(|c| in_prefix(c, dst))
            || self.on_link.iter().any(|p| in_prefix(&p.what, dst));
        if on_link {
            return Some(*dst);
        }
        if let Some((_, r)) = self.redirects.iter().find(|(d, _)| d == dst) {
            return Some(r.what);
        }
        self.default_router()
    }

    /// The router off-link packets go to: the configured gateway, else
    /// the first advertised default router.
    fn default_router(&self) -> Option<Ipv6Addr> {
        self.gateway.or(self.routers.first().map(|r| r.what))
    }

    /// Take a redirect (RFC 4861 §8.1, §8.3) from `router` for `dest` to
    /// `target` at `now`: only from the router that packets to `dest` go
    /// to now, for a unicast destination, to a link-local target or to
    /// the destination itself (on-link). Whether it was taken.
    pub(crate) fn redirect(
        &mut self,
        now: Instant,
        router: Ipv6Addr,
        dest: Ipv6Addr,
        target: Ipv6Addr,
    ) -> bool {
        let valid = router.is_unicast_link_local()
            && !dest.is_multicast()
            && (target == dest || target.is_unicast_link_local())
            && self.next_hop(&dest) == Some(router);
        if !valid {
            return false;
        }
        let learnt = Learnt {
            what: target,
            until: now + REDIRECT_LIFETIME,
        };
        remember(&mut self.redirects, MAX_REDIRECTS, dest, learnt);
        true
    }

    /// The MTU of the link for IPv6: an advertised one, else the port's.
    pub(crate) fn mtu(&self, port_mtu: usize) -> usize {
        self.mtu.unwrap_or(port_mtu).min(port_mtu)
    }

    /// The MTU of the path to `dst`: a packet too big's, else the link's.
    pub(crate) fn path_mtu(&self, dst: &Ipv6Addr, port_mtu: usize) -> usize {
        let link = self.mtu(port_mtu);
        match self.path_mtus.iter().find(|(d, _)| d == dst) {
            Some((_, m)) => m.what.min(link),
            None => link,
        }
    }

    /// A packet too big said the path to `dst` takes `mtu` at `now`: it
    /// is kept when it lowers what we use (RFC 8201 §4: never below
    /// IPv6's minimum, never raised by such a message). Whether it did.
    pub(crate) fn learn_path_mtu(
        &mut self,
        now: Instant,
        dst: Ipv6Addr,
        mtu: usize,
        port_mtu: usize,
    ) -> bool {
        let mtu = mtu.max(MIN_MTU);
        if mtu >= self.path_mtu(&dst, port_mtu) {
            return false;
        }
        let learnt = Learnt {
            what: mtu,
            until: now + PATH_MTU_LIFETIME,
        };
        remember(&mut self.path_mtus, MAX_PATH_MTUS, dst, learnt);
        true
    }

    /// Forget what advertisements taught that expired by `now`.
    pub(crate) fn expire(&mut self, now: Instant) {
        self.routers.retain(|r| r.until > now);
        self.on_link.retain(|p| p.until > now);
        self.slaac.retain(|a| a.until > now);
        self.tentative.retain(|(a, _)| a.until > now);
        self.redirects.retain(|(_, r)| r.until > now);
        self.path_mtus.retain(|(_, m)| m.until > now);
    }

    /// When something learnt next expires, or a router solicitation or an
    /// MLD report is due.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let learnt = (self.routers.iter().map(|r| r.until))
            .chain(self.on_link.iter().map(|p| p.until))
            .chain(self.slaac.iter().map(|a| a.until))
            .chain(self.tentative.iter().map(|(a, _)| a.until))
            .chain(self.redirects.iter().map(|(_, r)| r.until))
            .chain(self.path_mtus.iter().map(|(_, m)| m.until))
            .min();
        // A tentative address's probe is due now (None), or its wait ends.
        let dad = (self.tentative.iter())
            .map(|(_, done)| done.unwrap_or(Instant::ZERO))
            .min();
        [learnt, self.solicit_due(), self.mld.due(), dad]
            .into_iter()
            .flatten()
            .min()
    }

    /// The groups we listen to and report (RFC 3810 §6): the
    /// solicited-node group of each address, once each.
    pub(crate) fn groups(&self) -> Vec<Ipv6Addr> {
        let mut groups: Vec<Ipv6Addr> = self.addrs().map(solicited_node).collect();
        groups.sort_unstable();
        groups.dedup();
        groups
    }

    /// Whether router solicitations are wanted: IPv6 on, advertisements
    /// taken, no router known yet, not all sent.
    pub(crate) fn wants_routers(&self) -> bool {
        self.enabled()
            && self.accept_ra
            && self.routers.is_empty()
            && self.solicits_sent < RTR_SOLICITATIONS
    }

    /// When the next router solicitation is due (None: none wanted, or
    /// not armed yet).
    pub(crate) fn solicit_due(&self) -> Option<Instant> {
        self.next_solicit.filter(|_| self.wants_routers())
    }

    /// The source address for packets to `dst` (RFC 6724, for the
    /// addresses a host of ours has): the link-local one for a link-local
    /// or link-scope multicast destination; else one whose prefix holds
    /// `dst` (rule 8, the longest match, as far as /64s go), else the
    /// first configured one, else one made from an advertised prefix, else
    /// the link-local one; `None` when IPv6 is off.
    pub(crate) fn source_for(&self, dst: &Ipv6Addr) -> Option<Ipv6Addr> {
        let link_scope =
            dst.is_unicast_link_local() || (dst.is_multicast() && dst.segments()[0] & 0x000f == 2);
        let ll = self.addrs.first()?.address();
        if link_scope {
            return Some(ll);
        }
        let global = || {
            (self.addrs[1..].iter())
                .copied()
                .chain(self.slaac.iter().map(|a| a.what))
        };
        let matching = global().find(|c| in_prefix(c, dst));
        Some(matching.or(global().next()).map_or(ll, |c| c.address()))
    }

    /// Whether `a` is one of our addresses.
    pub(crate) fn owns(&self, a: &Ipv6Addr) -> bool {
        self.is_ours(a)
    }

    /// Whether IPv6 is on.
    pub(crate) fn enabled(&self) -> bool {
        !self.addrs.is_empty()
    }

    /// Our unicast addresses: the link-local one first, the configured
    /// ones, then those made from advertised prefixes.
    pub(crate) fn addrs(&self) -> impl Iterator<Item = Ipv6Addr> + '_ {
        (self.addrs.iter().map(|c| c.address())).chain(self.slaac.iter().map(|a| a.what.address()))
    }

    pub(crate) fn is_ours(&self, a: &Ipv6Addr) -> bool {
        // The tables themselves, not the chained iterator of `addrs`:
        // this runs for every packet both ways.
        self.addrs.iter().any(|c| c.address() == *a)
            || self.slaac.iter().any(|s| s.what.address() == *a)
    }

    /// Whether `a` is one of our addresses still under duplicate address
    /// detection.
    pub(crate) fn is_tentative(&self, a: &Ipv6Addr) -> bool {
        self.tentative.iter().any(|(t, _)| t.what.address() == *a)
    }

    /// Take tentative address `a` away: another host holds it (RFC 4862
    /// §5.4.5). Whether it was one.
    pub(crate) fn give_up_tentative(&mut self, a: &Ipv6Addr) -> bool {
        let before = self.tentative.len();
        self.tentative.retain(|(t, _)| t.what.address() != *a);
        self.tentative.len() != before
    }

    /// Our addresses and the tentative ones: whose solicited-node groups
    /// we listen to (a tentative address's, to hear another host's probe).
    fn listening(&self) -> impl Iterator<Item = Ipv6Addr> + '_ {
        self.addrs()
            .chain(self.tentative.iter().map(|(t, _)| t.what.address()))
    }

    /// Whether we take packets to `dst`: one of our addresses, all-nodes,
    /// or the solicited-node group of one of them or of a tentative one.
    pub(crate) fn accepts(&self, dst: &Ipv6Addr) -> bool {
        self.is_ours(dst)
            || *dst == ALL_NODES
            || self.listening().any(|m| solicited_node(m) == *dst)
    }

    /// Whether a frame to the multicast MAC `mac` is for a group we are in
    /// (RFC 2464 §7: 33:33 and the group's low 32 bits).
    pub(crate) fn accepts_mac(&self, mac: EthernetAddress) -> bool {
        self.enabled()
            && (mac == multicast_mac(ALL_NODES)
                || self
                    .listening()
                    .any(|m| mac == multicast_mac(solicited_node(m))))
    }
}

/// Whether `a` is in the prefix of `c`: smoltcp's `contains_addr` with
/// one 128-bit compare (it walks the bytes; this runs for every packet
/// sent).
fn in_prefix(c: &Ipv6Cidr, a: &Ipv6Addr) -> bool {
    match u32::from(c.prefix_len()) {
        0 => true,
        len => (c.address().to_bits() ^ a.to_bits()) >> (128 - len.min(128)) == 0,
    }
}

/// Keep what was learnt about `dst` in a per-destination table of at
/// most `cap` entries: it replaces what was there for `dst`; when full,
/// the oldest gives way.
fn remember<T>(
    table: &mut Vec<(Ipv6Addr, Learnt<T>)>,
    cap: usize,
    dst: Ipv6Addr,
    learnt: Learnt<T>,
) {
    table.retain(|(d, _)| *d != dst);
    if table.len() >= cap {
        table.remove(0);
    }
    table.push((dst, learnt));
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

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn in_prefix_agrees_with_smoltcp() {
        let addrs = [
            Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 2),
            Ipv6Addr::new(0xfd77, 0, 0, 1, 0, 0, 0, 2),
            Ipv6Addr::new(0xfe80, 0, 0, 0, 0x75, 0x73ff, 0xfe4d, 2),
            Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 0),
            Ipv6Addr::UNSPECIFIED,
        ];
        for len in [0u8, 1, 16, 48, 63, 64, 65, 127, 128] {
            for p in addrs {
                let c = Ipv6Cidr::new(p, len);
                for a in addrs {
                    assert_eq!(in_prefix(&c, &a), c.contains_addr(&a), "{c} {a}");
                }
            }
        }
    }
}
