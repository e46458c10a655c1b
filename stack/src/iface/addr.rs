//! [`Addr`]: our address on the link, a view of a stack's link: the ARP
//! entries it holds, and duplicate-address detection (RFC 5227 probing).
//! `stack.addr()` lends it mutably, `stack.addr_ref()` read-only
//! ([`AddrRef`]).

use core::net::{Ipv4Addr, Ipv6Addr};

use smoltcp::wire::EthernetAddress;

use crate::iface::link::Link;
use crate::iface::ndp::NeighborState;
use crate::time::Instant;

/// Our address: probing for a conflict.
#[derive(Debug)]
pub struct Addr<'a> {
    link: &'a mut Link,
}

/// Our address and its neighbours, read-only.
#[derive(Debug)]
pub struct AddrRef<'a> {
    link: &'a Link,
}

impl<'a> Addr<'a> {
    pub(crate) fn new(link: &'a mut Link) -> Self {
        Addr { link }
    }

    /// Send an ARP probe for our address on the next poll (RFC 5227
    /// 2.1.1), and with IPv6 on a duplicate address detection probe for
    /// each IPv6 address (RFC 4862 §5.4.2): a host that holds an address
    /// answers, and [`AddrRef::conflict`] or [`AddrRef::conflict6`] then
    /// names it.
    pub fn probe(&mut self) {
        self.link.probe_address();
    }

    /// Probing is over (no conflict): the gratuitous ARP that announces the
    /// address, held back while probing, leaves on the next poll.
    pub fn end_probing(&mut self) {
        self.link.end_probing();
    }
}

impl<'a> AddrRef<'a> {
    pub(crate) fn new(link: &'a Link) -> Self {
        AddrRef { link }
    }

    /// ARP entries that are fresh at `now`.
    pub fn neighbours(&self, now: Instant) -> Vec<(Ipv4Addr, EthernetAddress)> {
        self.link.arp().entries(now)
    }

    /// Our IPv6 addresses, the link-local one first (none when IPv6 is off).
    pub fn ipv6(&self) -> Vec<Ipv6Addr> {
        self.link.ip6.addrs().collect()
    }

    /// The IPv6 address packets to `dst` leave from (a global address
    /// matching its prefix, else the first global one, the link-local one
    /// for link-local destinations); `None` when IPv6 is off.
    pub fn ipv6_source(&self, dst: Ipv6Addr) -> Option<Ipv6Addr> {
        self.link
            .ip6
            .enabled()
            .then(|| self.link.ip6.source_for(&dst))
            .flatten()
    }

    /// The IPv6 neighbor cache at `now`: address, MAC, state.
    pub fn ipv6_neighbours(&self, now: Instant) -> Vec<(Ipv6Addr, EthernetAddress, NeighborState)> {
        self.link.ip6.neighbors.entries(now)
    }

    /// The MAC address of another host seen using our IP address (it
    /// answered a probe, or sent ARP from our address), if any.
    pub fn conflict(&self) -> Option<EthernetAddress> {
        self.link.conflict()
    }

    /// The first of our IPv6 addresses another host was seen holding (it
    /// advertised it), and that host's MAC.
    pub fn conflict6(&self) -> Option<(Ipv6Addr, EthernetAddress)> {
        self.link.ip6.conflict
    }
}
