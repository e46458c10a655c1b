//! ustack: a sans-IO userspace TCP/IP engine.
//!
//! The protocol core ([`Stack`]) never reads a clock and never touches a device:
//! every entry point takes `now` and bytes, and frames leave through a [`Tx`]
//! sink that writes straight into a device buffer. [`node::Node`] is one poll-loop
//! iteration gluing a `Stack` to a [`Device`] (the `ustack-runtime` crate runs
//! it against the wall clock, with threads, sockets and backends); [`sim`]
//! provides an in-process link with seeded impairments and a manual clock for
//! tests. This crate has no threads, sockets, sleeps or clock reads.
//!
//! Invariants (see ARCHITECTURE.md):
//! - the engine never reads the clock: time comes in as [`Instant`];
//! - a `Stack` holds no global state: one stack per core / NIC queue;
//! - bad input gets a counter ([`stats::DropReason`]) and a drop, never a panic;
//! - every buffer taken from a [`pool::Pool`] is returned on drop.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod app;
pub mod arp;
pub mod checksum;
pub mod config;
pub mod device;
pub mod error;
pub mod events;
pub mod frag;
pub mod icmp;
pub mod impair;
pub(crate) mod link;
pub mod node;
pub mod pool;
pub mod rss;
pub mod shard;
pub mod sim;
pub mod stack;
pub mod stats;
pub mod tcp;
pub mod time;
pub mod ud;
pub mod udp;

pub use device::{Device, PortStats, Tx, VecTx};
pub use pool::{PacketBuf, Pool, PoolStats, SlabBuf, SlabPool};
pub use stack::{Config, Error, Stack};
pub use time::Instant;

/// Wire formats, re-exported from `smoltcp::wire` so apps and tests name one source.
pub mod wire {
    pub use smoltcp::phy::ChecksumCapabilities;
    pub use smoltcp::wire::{
        ArpOperation, ArpPacket, ArpRepr, ETHERNET_HEADER_LEN, EthernetAddress, EthernetFrame,
        EthernetProtocol, EthernetRepr, IPV4_HEADER_LEN, Icmpv4Message, Icmpv4Packet, Icmpv4Repr,
        IpAddress, IpProtocol, Ipv4Address, Ipv4Cidr, Ipv4Packet, Ipv4Repr, TcpControl, TcpPacket,
        TcpRepr, TcpSeqNumber, TcpTimestampRepr, UDP_HEADER_LEN, UdpPacket, UdpRepr,
    };
}
