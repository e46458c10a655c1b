//! The configuration of one stack instance.

use core::net::{Ipv4Addr, Ipv6Addr};
use std::hash::BuildHasher;

use smoltcp::wire::{EthernetAddress, Ipv4Cidr, Ipv6Cidr};

use crate::iface::arp::ArpConfig;
use crate::iface::frag::FragConfig;
use crate::socket::tcp::config::TcpConfig;

/// Configuration of one stack instance.
#[derive(Debug, Clone)]
pub struct Config {
    /// Our Ethernet address (frames to any other unicast MAC are dropped).
    pub mac: EthernetAddress,
    /// Our address and subnet.
    pub ip: Ipv4Cidr,
    /// Next hop for addresses outside the subnet.
    pub gateway: Option<Ipv4Addr>,
    /// Our IPv6 addresses. Empty: IPv6 is off (its frames are dropped as
    /// an unknown EtherType). Otherwise the link-local address made from
    /// the MAC comes first, and the stack answers neighbor discovery and
    /// ICMPv6 echo for every address here.
    pub ipv6: Vec<Ipv6Cidr>,
    /// Speak IPv6 even when `ipv6` is empty: the link-local address made
    /// from the MAC alone, and the addresses router advertisements give
    /// (SLAAC, RFC 4862) when `accept_ra` is on.
    pub ipv6_auto: bool,
    /// Next hop for IPv6 destinations off-link (beside the default
    /// routers advertisements give).
    pub gateway6: Option<Ipv6Addr>,
    /// Take router advertisements (RFC 4861 §6.3.4, Linux's `accept_ra`):
    /// default routers, on-link prefixes, the link MTU, and addresses made
    /// from advertised prefixes (SLAAC, RFC 4862). With IPv6 on, the stack
    /// solicits them at start.
    pub accept_ra: bool,
    /// IP MTU (largest IPv4 packet without the Ethernet header).
    pub mtu: usize,
    /// TTL of packets we originate.
    pub ttl: u8,
    /// ARP cache size, entry lifetime, request retries and pending-queue caps.
    pub arp: ArpConfig,
    /// IPv4 reassembly limits (memory, datagrams, pieces, timeout).
    pub frag: FragConfig,
    /// ICMP errors per second we may send (token bucket rate and burst).
    pub icmp_error_rate: u32,
    /// Resets per second we may send for segments that match no connection
    /// (token bucket rate and burst), so an ACK or SYN flood to closed ports
    /// is not answered packet for packet. Resets within a connection are
    /// not limited.
    pub rst_rate: u32,
    /// Bytes a UDP socket may hold received.
    pub udp_rx_queue_bytes: usize,
    /// Bytes a UDP socket may hold waiting to send.
    pub udp_tx_queue_bytes: usize,
    /// Send a gratuitous ARP on the first poll.
    pub announce: bool,
    /// Answer echo requests sent to a broadcast address (Linux: no).
    pub answer_broadcast_ping: bool,
    /// Defaults for every TCP connection.
    pub tcp: TcpConfig,
    /// Generic segmentation offload in software, for ports without TSO:
    /// one transmit decision of TCP may cover up to this many bytes of IP
    /// packet, which the stack then builds as MTU-sized frames one after
    /// another (the frames are the ones segment-by-segment sending would
    /// build; the per-segment decision work is paid once). 0 decides
    /// frame by frame. A port with TSO uses its own limit instead.
    pub gso_max: usize,
    /// Key for ISNs, SYN cookies and IPv4 IDs (RFC 6528): random with
    /// [`Config::new`], derived from a seed with [`Config::with_seed`].
    pub secret: (u64, u64),
    /// Which of a host's per-queue stacks this is (active opens pick local
    /// ports whose flows hash back to this queue).
    pub shard: crate::shard::ShardId,
}

/// [`Config::gso_max`]'s default: 64 KiB, as a TSO port's limit.
pub const DEFAULT_GSO_MAX: usize = 65_535;

impl Config {
    /// The link-local IPv6 address the stack makes from its MAC (RFC 4862).
    pub fn link_local(&self) -> Ipv6Addr {
        crate::iface::ipv6_iface::link_local(self.mac)
    }

    /// Defaults for a host with address `ip` on a subnet, MTU 1500, and a
    /// random secret for ISNs, SYN cookies and IPv4 IDs (RFC 6528: each
    /// stack its own, unpredictable).
    pub fn new(mac: EthernetAddress, ip: Ipv4Cidr) -> Self {
        // std's RandomState keys come from the OS's random source once per
        // thread and differ for every instance: no clock, no extra crate.
        let random = std::collections::hash_map::RandomState::new();
        let secret = (random.hash_one(1u8), random.hash_one(2u8));
        Config {
            secret,
            ..Self::with_seed(mac, ip, 0)
        }
    }

    /// As [`Config::new`] with the secret derived from `seed`: the same
    /// seed gives the same sequence numbers and IDs (simulations, tests).
    pub fn with_seed(mac: EthernetAddress, ip: Ipv4Cidr, seed: u64) -> Self {
        let mix = |k: u64| {
            foldhash::fast::FixedState::with_seed(seed ^ 0x7573_7461_636b_0001).hash_one(k)
        };
        Config {
            mac,
            ip,
            gateway: None,
            ipv6: Vec::new(),
            ipv6_auto: false,
            gateway6: None,
            accept_ra: true,
            mtu: 1500,
            ttl: 64,
            arp: ArpConfig::default(),
            frag: FragConfig::default(),
            icmp_error_rate: 100,
            rst_rate: 1000,
            udp_rx_queue_bytes: 1 << 20,
            udp_tx_queue_bytes: 1 << 20,
            announce: true,
            answer_broadcast_ping: false,
            tcp: TcpConfig::default(),
            gso_max: DEFAULT_GSO_MAX,
            secret: (mix(1), mix(2)),
            shard: crate::shard::ShardId::SINGLE,
        }
    }
}
