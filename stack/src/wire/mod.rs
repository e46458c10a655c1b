//! Wire formats: parsers and emitters, leaf modules that import no
//! protocol.
//!
//! Ethernet, ARP, IPv4, IPv6, ICMP, ICMPv6 with neighbor discovery, UDP
//! and TCP come from `smoltcp::wire`
//! (zero-copy `Packet<&[u8]>` views with `Repr` parse and emit), re-exported
//! here so apps and tests name one source. What smoltcp lacks is written in
//! the same style: [`roce`] (RoCEv2's BTH and DETH, the ICRC), [`rc`] (the
//! reliable-connected extension headers: RETH, AETH, AtomicETH, ImmDt),
//! [`exchange`] (the connection-setup messages stock RDMA tools swap over
//! TCP) and [`checksum`] (the Internet checksum, incremental updates).

pub mod checksum;
pub mod exchange;
pub mod rc;
pub mod roce;

pub use smoltcp::phy::ChecksumCapabilities;
pub use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, ETHERNET_HEADER_LEN, EthernetAddress, EthernetFrame,
    EthernetProtocol, EthernetRepr, IPV4_HEADER_LEN, IPV6_HEADER_LEN, Icmpv4DstUnreachable,
    Icmpv4Message, Icmpv4Packet, Icmpv4Repr, Icmpv6Packet, Icmpv6Repr, IpAddress, IpCidr,
    IpProtocol, Ipv4Address, Ipv4Cidr, Ipv4Packet, Ipv4Repr, Ipv6Cidr, Ipv6Packet, Ipv6Repr,
    NdiscNeighborFlags, NdiscRepr, RawHardwareAddress, TcpControl, TcpPacket, TcpRepr,
    TcpSeqNumber, TcpTimestampRepr, UDP_HEADER_LEN, UdpPacket, UdpRepr,
};
