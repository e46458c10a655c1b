//! The interface: everything below the transports. Ethernet demux and the
//! IPv4 transmit path (the crate-private `link`), the [`arp`] cache, IPv4 reassembly
//! ([`frag`]) and ICMP ([`icmp`]: echo answered, errors sent and received,
//! ping sockets), [`ipv6`] (our IPv6 addresses, its receive path, ICMPv6
//! echo, neighbor discovery, router discovery and SLAAC), [`mld`] (MLDv2
//! reports for our solicited-node groups); [`addr`] is the view of our address the stack lends
//! (`stack.addr()`: ARP neighbours, RFC 5227 probing). Transports reach
//! the wire only through the link.

pub mod addr;
pub mod arp;
pub mod frag;
pub mod icmp;
pub(crate) mod input;
pub mod ipv6;
pub(crate) mod ipv6_iface;
pub(crate) mod link;
pub mod mld;
pub mod ndp;
pub(crate) mod received;
pub(crate) mod resolve;
pub(crate) mod router;
