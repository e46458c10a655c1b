//! Counters per layer, as plain structs the poll loop copies into snapshots.
//!
//! Every received frame ends either accepted (`rx_accepted`) or dropped with
//! exactly one [`DropReason`], so `rx_frames == rx_accepted + drops.total()`.
//!
//! Each number declares its [`Kind`] (counter or gauge) where it is
//! declared: the structs are written with [`stats!`](crate::stats) and
//! implement [`Metrics`], which exporters (Prometheus) read instead of
//! guessing from a field's name.

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

/// What a statistic measures over time (as Prometheus types it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Only grows, from 0 when the stack starts (packets, bytes, events).
    Counter,
    /// A level now, which goes up and down (entries held, bytes queued,
    /// sockets open) or a high-water mark.
    Gauge,
}

/// A statistics struct whose every number declares its [`Kind`].
pub trait Metrics {
    /// The kind of the number at `path` in this struct's serialized form:
    /// a field's name, followed for a nested struct by a path in it (the
    /// fields of a flattened struct are this struct's own; a list's
    /// elements are passed over, so `["pools", "in_use"]` of a snapshot
    /// names every pool's `in_use`). `None` when no number of a declared
    /// kind is there (unknown names, labels such as a pool's name).
    fn kind(path: &[&str]) -> Option<Kind>;
}

/// Defines a statistics struct whose fields say what they are, and its
/// [`Metrics`] impl. Each field (all `pub`) starts with one word:
/// `counter` or `gauge` (a number of that [`Kind`]), `label` (not a
/// metric: a name or an index the series are told apart by), `nested` (a
/// struct implementing [`Metrics`], serialized under the field's name) or
/// `flattened` (the same, its fields serialized as this struct's own;
/// write `#[serde(flatten)]` on it too).
///
/// ```ignore
/// stats! {
///     /// UDP counters.
///     #[derive(Debug, Default, Serialize)]
///     pub struct UdpStats {
///         /// Datagrams sent.
///         counter tx_datagrams: u64,
///         /// Sockets bound now.
///         gauge sockets: u64,
///     }
/// }
/// ```
macro_rules! stats {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                $(#[$fmeta:meta])*
                $kind:ident $field:ident : $ty:ty,
            )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $(
                $(#[$fmeta])*
                pub $field: $ty,
            )*
        }

        impl $crate::stats::Metrics for $name {
            fn kind(path: &[&str]) -> Option<$crate::stats::Kind> {
                None $(.or_else(|| $crate::stats::stats!(@kind path, $kind, $field, $ty)))*
            }
        }
    };
    (@kind $path:ident, counter, $field:ident, $ty:ty) => {
        ($path == [stringify!($field)]).then_some($crate::stats::Kind::Counter)
    };
    (@kind $path:ident, gauge, $field:ident, $ty:ty) => {
        ($path == [stringify!($field)]).then_some($crate::stats::Kind::Gauge)
    };
    (@kind $path:ident, label, $field:ident, $ty:ty) => {
        None
    };
    (@kind $path:ident, nested, $field:ident, $ty:ty) => {
        match $path.split_first() {
            Some((first, rest)) if *first == stringify!($field) => {
                <$ty as $crate::stats::Metrics>::kind(rest)
            }
            _ => None,
        }
    };
    (@kind $path:ident, flattened, $field:ident, $ty:ty) => {
        <$ty as $crate::stats::Metrics>::kind($path)
    };
}
pub(crate) use stats;

macro_rules! drop_reasons {
    ($($(#[$doc:meta])* $variant:ident => $name:literal,)*) => {
        /// Why a received frame was dropped. Each has its own counter.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(usize)]
        pub enum DropReason {
            $($(#[$doc])* $variant,)*
        }

        impl DropReason {
            /// Every reason, in counter order.
            pub const ALL: &'static [DropReason] = &[$(DropReason::$variant,)*];

            /// The counter's name in telemetry and test output.
            pub const fn name(self) -> &'static str {
                match self {
                    $(DropReason::$variant => $name,)*
                }
            }
        }
    };
}

drop_reasons! {
    /// Shorter than an Ethernet header.
    EthTruncated => "eth_truncated",
    /// Longer than the MTU allows.
    EthOversize => "eth_oversize",
    /// Destination MAC is neither ours nor broadcast.
    EthNotForUs => "eth_not_for_us",
    /// Source MAC is broadcast or multicast.
    EthBadSource => "eth_bad_source",
    /// EtherType we do not speak.
    EthUnknownType => "eth_unknown_type",
    /// ARP packet too short or with unsupported hardware/protocol types.
    ArpMalformed => "arp_malformed",
    /// ARP whose target is another host (and that taught us nothing).
    ArpNotForUs => "arp_not_for_us",
    /// ARP claiming our own address from another MAC (a conflict or a spoof).
    ArpConflict => "arp_conflict",
    /// ARP that would change a fresh entry's MAC without answering our
    /// request (a spoof, or a host that moved: learned when we ask again).
    ArpSpoofRefused => "arp_spoof_refused",
    /// Shorter than the IPv4 header or the header length says.
    Ipv4Truncated => "ipv4_truncated",
    /// Version field is not 4.
    Ipv4BadVersion => "ipv4_bad_version",
    /// IHL below 5 words.
    Ipv4BadHeaderLen => "ipv4_bad_header_len",
    /// Total length below the header length or beyond the frame.
    Ipv4BadTotalLen => "ipv4_bad_total_len",
    /// Header checksum does not verify.
    Ipv4BadChecksum => "ipv4_bad_checksum",
    /// Destination is not one of our addresses.
    Ipv4NotForUs => "ipv4_not_for_us",
    /// Source is broadcast, multicast, unspecified or ourselves.
    Ipv4BadSource => "ipv4_bad_source",
    /// Protocol we do not serve (answered with protocol unreachable).
    Ipv4UnknownProtocol => "ipv4_unknown_protocol",
    /// Shorter than the IPv6 header.
    Ipv6Truncated => "ipv6_truncated",
    /// Version field is not 6.
    Ipv6BadVersion => "ipv6_bad_version",
    /// Payload length beyond the frame.
    Ipv6BadLength => "ipv6_bad_length",
    /// Destination is none of our addresses and no group we are in.
    Ipv6NotForUs => "ipv6_not_for_us",
    /// Source is multicast, loopback or ourselves (or unspecified where
    /// only neighbor discovery may use it).
    Ipv6BadSource => "ipv6_bad_source",
    /// Next header we do not serve yet.
    Ipv6UnknownNextHeader => "ipv6_unknown_next_header",
    /// An extension header cut short, a chain longer than 8, or
    /// hop-by-hop options anywhere but first (RFC 8200 §4).
    Ipv6BadExtension => "ipv6_bad_extension",
    /// An option we do not know whose type says to discard the packet
    /// (RFC 8200 §4.2).
    Ipv6BadOption => "ipv6_bad_option",
    /// A routing header with segments left: a host does not forward
    /// (RFC 8200 §4.4; type 0 deprecated by RFC 5095).
    Ipv6RoutingHeader => "ipv6_routing_header",
    /// ICMPv6 too short or of a malformed layout.
    Icmpv6Malformed => "icmpv6_malformed",
    /// ICMPv6 checksum does not verify.
    Icmpv6BadChecksum => "icmpv6_bad_checksum",
    /// ICMPv6 type we do not handle (or an echo to a group).
    Icmpv6Unhandled => "icmpv6_unhandled",
    /// Neighbor discovery message RFC 4861 says to discard (hop limit
    /// not 255, a bad option, a multicast target).
    NdpInvalid => "ndp_invalid",
    /// Neighbor solicitation for an address that is not ours.
    NdpNotForUs => "ndp_not_for_us",
    /// Neighbor advertisement from another host for one of our addresses.
    NdpConflict => "ndp_conflict",
    /// Fragment with an impossible offset/length.
    FragBad => "frag_bad",
    /// Fragment overlapping one already held (the whole datagram is dropped).
    FragOverlap => "frag_overlap",
    /// Reassembly memory or datagram cap reached.
    FragNoMemory => "frag_no_memory",
    /// ICMP too short or of a malformed layout.
    IcmpMalformed => "icmp_malformed",
    /// ICMP checksum does not verify.
    IcmpBadChecksum => "icmp_bad_checksum",
    /// ICMP type we do not handle, or a reply no socket waits for.
    IcmpUnhandled => "icmp_unhandled",
    /// UDP header or length inconsistent with the IP payload.
    UdpMalformed => "udp_malformed",
    /// UDP checksum does not verify.
    UdpBadChecksum => "udp_bad_checksum",
    /// No socket bound to the port (answered with port unreachable).
    UdpNoSocket => "udp_no_socket",
    /// The socket's receive queue is full.
    UdpQueueFull => "udp_queue_full",
    /// TCP header or options malformed, or an invalid flag combination.
    TcpMalformed => "tcp_malformed",
    /// TCP checksum does not verify.
    TcpBadChecksum => "tcp_bad_checksum",
    /// Segment for no connection and no listener (answered with RST).
    TcpNoSocket => "tcp_no_socket",
    /// Segment to a listener with neither SYN, ACK nor RST (a FIN, NULL or
    /// Xmas scan): dropped unanswered, RFC 9293 3.10.7.2.
    TcpListenNoAck => "tcp_listen_no_ack",
    /// TCP segment sent to a broadcast address.
    TcpBroadcast => "tcp_broadcast",
    /// RoCEv2 packet too short for its headers, or not a whole IPv4 packet.
    UdMalformed => "ud_malformed",
    /// RoCEv2 invariant CRC does not verify.
    UdBadIcrc => "ud_bad_icrc",
    /// BTH opcode other than UD SEND_ONLY (with or without immediate) for
    /// a UD QP, or not an RC opcode for an RC one.
    UdBadOpcode => "ud_bad_opcode",
    /// P_Key not of the default partition.
    UdBadPkey => "ud_bad_pkey",
    /// Destination QP number we do not have.
    UdUnknownQpn => "ud_unknown_qpn",
    /// Q_Key differs from the destination QP's.
    UdBadQkey => "ud_bad_qkey",
    /// No receive buffer posted on the destination QP.
    UdNoRecvBuffer => "ud_no_recv_buffer",
    /// Message larger than the posted receive buffer (completed in error).
    UdRecvTooSmall => "ud_recv_too_small",
    /// The QP's completion queue is full.
    UdCqFull => "ud_cq_full",
    /// RC packet from an address other than the QP's connected peer.
    RcWrongPeer => "rc_wrong_peer",
    /// RC packet for a QP not connected, or in the error state.
    RcBadState => "rc_bad_state",
    /// RC response or ACK matching nothing outstanding (stale, duplicate,
    /// out of order), or one of the wrong length for its place.
    RcStale => "rc_stale",
}

/// One counter per [`DropReason`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drops {
    counts: [u64; DropReason::ALL.len()],
}

impl Default for Drops {
    fn default() -> Self {
        Drops {
            counts: [0; DropReason::ALL.len()],
        }
    }
}

impl Drops {
    /// Count one drop for `reason`.
    pub fn inc(&mut self, reason: DropReason) {
        self.counts[reason as usize] += 1;
    }
    /// The counter for `reason`.
    pub fn get(&self, reason: DropReason) -> u64 {
        self.counts[reason as usize]
    }
    /// Drops for every reason together.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }
    /// Nonzero counters with their names.
    pub fn nonzero(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        DropReason::ALL
            .iter()
            .map(|r| (r.name(), self.get(*r)))
            .filter(|(_, c)| *c > 0)
    }
}

/// Every reason's counter is a counter.
impl Metrics for Drops {
    fn kind(path: &[&str]) -> Option<Kind> {
        match path {
            [reason] if DropReason::ALL.iter().any(|r| r.name() == *reason) => Some(Kind::Counter),
            _ => None,
        }
    }
}

impl Serialize for Drops {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(DropReason::ALL.len()))?;
        for r in DropReason::ALL {
            m.serialize_entry(r.name(), &self.get(*r))?;
        }
        m.end()
    }
}

stats! {
    /// Ethernet-level counters of the engine (what it parsed and emitted).
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    pub struct EthStats {
        /// Frames handed to [`Stack::receive`](crate::Stack::receive).
        counter rx_frames: u64,
        /// Bytes of those frames, Ethernet header included (no FCS).
        counter rx_bytes: u64,
        /// Frames processed without a drop (the rest are in [`Stats::drops`]).
        counter rx_accepted: u64,
        /// Frames written to the transmit sink.
        counter tx_frames: u64,
        /// Bytes of those frames, Ethernet header included.
        counter tx_bytes: u64,
        /// Frames the engine wanted to send but got no buffer for.
        counter tx_no_buffer: u64,
    }
}

stats! {
    /// ARP (RFC 826) counters and gauges of the [`ArpCache`](crate::iface::arp::ArpCache).
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    pub struct ArpStats {
        /// Entries in the cache now, fresh or not yet evicted (a gauge).
        gauge entries: u64,
        /// IPv4 packets waiting for an address to resolve now (a gauge).
        gauge pending_packets: u64,
        /// Well-formed ARP requests received.
        counter rx_requests: u64,
        /// Well-formed ARP replies received.
        counter rx_replies: u64,
        /// Received ARP packets whose sender and target address are the same.
        counter rx_gratuitous: u64,
        /// Requests we broadcast: first asks and retries.
        counter tx_requests: u64,
        /// Replies we sent to requests for our address.
        counter tx_replies: u64,
        /// Gratuitous requests announcing our own address (one at start-up
        /// when [`Config::announce`](crate::Config::announce) is set).
        counter tx_gratuitous: u64,
        /// Lookups on transmit that found a fresh entry.
        counter hits: u64,
        /// Lookups on transmit that found no entry or an expired one.
        counter misses: u64,
        /// Packets dropped from the pending queue (full, or never resolved).
        counter pending_dropped: u64,
        /// Resolutions that gave up after the last retry.
        counter unresolved: u64,
        /// New entries refused because the table was full.
        counter table_full: u64,
        /// Packets that would have changed a fresh entry's MAC without our
        /// asking (spoofing), refused.
        counter spoof_refused: u64,
        /// Most entries held at once.
        gauge entries_hwm: u64,
        /// Most bytes of packets waiting for resolution at once.
        gauge pending_bytes_hwm: u64,
    }
}

stats! {
    /// IPv4 (RFC 791) counters, fragmentation and reassembly included.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    pub struct Ipv4Stats {
        /// Valid packets addressed to us (each fragment counts once).
        counter rx_packets: u64,
        /// Bytes of those packets by their total length field, headers included.
        counter rx_bytes: u64,
        /// Datagrams sent (a fragmented one counts once; see `tx_fragments`),
        /// including those held for ARP resolution.
        counter tx_packets: u64,
        /// Bytes of those datagrams, IPv4 header included (one header per datagram).
        counter tx_bytes: u64,
        /// Fragments received (MF set or a nonzero offset).
        counter rx_fragments: u64,
        /// Datagrams reassembled whole from fragments.
        counter reassembled: u64,
        /// Incomplete datagrams dropped when their reassembly timer expired
        /// ([`FragConfig::timeout`](crate::iface::frag::FragConfig::timeout)).
        counter reassembly_timeouts: u64,
        /// Bytes held by incomplete datagrams now (a gauge).
        gauge reassembly_bytes: u64,
        /// Most bytes held for reassembly at once.
        gauge reassembly_bytes_hwm: u64,
        /// Incomplete datagrams dropped to make room (cap or datagram count).
        counter reassembly_evicted: u64,
        /// Fragments sent for datagrams larger than the MTU.
        counter tx_fragments: u64,
        /// Sends refused with [`Error::NoRoute`](crate::Error::NoRoute): to
        /// ourselves, to 0.0.0.0, or off-link with no gateway.
        counter tx_no_route: u64,
    }
}

stats! {
    /// IPv6 (RFC 8200), ICMPv6 (RFC 4443) and neighbor discovery (RFC
    /// 4861) counters.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    pub struct Ipv6Stats {
        /// Packets that passed validation.
        counter rx_packets: u64,
        /// Bytes of those packets, header included.
        counter rx_bytes: u64,
        /// Fragments received.
        counter rx_fragments: u64,
        /// Datagrams joined from fragments.
        counter reassembled: u64,
        /// Packets sent (each fragment one).
        counter tx_packets: u64,
        /// Bytes of those packets, header included.
        counter tx_bytes: u64,
        /// Fragments sent (datagrams larger than the MTU, RFC 8200 §4.5).
        counter tx_fragments: u64,
        /// Sends refused: IPv6 off, to ourselves or the unspecified
        /// address, or off-link with no router.
        counter tx_no_route: u64,
        /// Echo requests received (answered or not).
        counter rx_echo_requests: u64,
        /// Echo replies sent.
        counter tx_echo_replies: u64,
        /// Neighbor solicitations received.
        counter rx_neighbor_solicits: u64,
        /// Neighbor advertisements sent.
        counter tx_neighbor_adverts: u64,
        /// Neighbor advertisements received.
        counter rx_neighbor_adverts: u64,
        /// Neighbor solicitations sent (to resolve a neighbor).
        counter tx_neighbor_solicits: u64,
        /// Destination unreachable messages sent (port unreachable).
        counter tx_dest_unreachable: u64,
        /// Time exceeded messages sent (RFC 4443 §3.3 code 1: fragment
        /// reassembly time exceeded).
        counter tx_time_exceeded: u64,
        /// Parameter problem messages sent (RFC 4443 §3.4: an erroneous
        /// header field, an unrecognized next header or option).
        counter tx_param_problems: u64,
        /// MLD reports sent for our solicited-node groups (RFC 3810;
        /// version 1 ones counted here and below).
        counter tx_mld_reports: u64,
        /// MLDv1 reports sent (RFC 2710), one per group, while an MLDv1
        /// router was heard in the last 260 s (RFC 3810 §8.2.1).
        counter tx_mld_v1_reports: u64,
        /// Echo requests our ping sockets sent over IPv6.
        counter tx_echo_requests: u64,
        /// Echo replies to our ping sockets over IPv6.
        counter rx_echo_replies: u64,
        /// Redirects taken (RFC 4861 §8.3: from the router packets to the
        /// destination went to).
        counter rx_redirects: u64,
        /// Path MTUs lowered by packet too big messages (RFC 8201).
        counter path_mtus_learnt: u64,
        /// Addresses from advertised prefixes that duplicate address
        /// detection found held by another host, and that were not used.
        counter slaac_duplicates: u64,
        /// MLD queries received from a router (link-local, hop limit 1).
        counter rx_mld_queries: u64,
        /// Of those, version 1 queries (RFC 2710: 24 bytes).
        counter rx_mld_v1_queries: u64,
        /// Packets dropped while waiting for a neighbor (queue full, or
        /// the neighbor never answered).
        counter pending_dropped: u64,
        /// Neighbors given up after unanswered solicitations.
        counter unresolved: u64,
        /// Packet too big messages received (RFC 4443 §3.2; those about
        /// our TCP segments lower the connection's MSS, RFC 8201).
        counter rx_packet_too_big: u64,
        /// Duplicate address detection probes sent (RFC 4862 §5.4.2).
        counter tx_dad_probes: u64,
        /// Router advertisements received (taken or not).
        counter rx_router_adverts: u64,
        /// Router solicitations sent (at start, until a router answers).
        counter tx_router_solicits: u64,
        /// Routers, prefixes or addresses an advertisement offered that
        /// were not taken: their table was full.
        counter ra_ignored: u64,
        /// Entries in the neighbor cache.
        gauge neighbors: u64,
        /// Default routers known (advertised, and one configured).
        gauge routers: u64,
        /// Addresses made from advertised prefixes (SLAAC).
        gauge slaac_addresses: u64,
        /// Packets waiting for a neighbor to answer.
        gauge pending_packets: u64,
    }
}

stats! {
    /// ICMP (RFC 792) counters.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    pub struct IcmpStats {
        /// Echo requests received (answered or not).
        counter rx_echo_requests: u64,
        /// Echo replies sent.
        counter tx_echo_replies: u64,
        /// Echo requests sent by ping sockets.
        counter tx_echo_requests: u64,
        /// Echo replies received (delivered to a ping socket or not).
        counter rx_echo_replies: u64,
        /// Destination-unreachable messages received.
        counter rx_dest_unreachable: u64,
        /// Destination-unreachable messages sent (port or protocol unreachable).
        counter tx_dest_unreachable: u64,
        /// Time exceeded messages sent: a datagram's fragments did not all
        /// come within the reassembly timeout (RFC 792 code 1).
        counter tx_time_exceeded: u64,
        /// Errors not sent because of the ICMP error rate limit.
        counter rate_limited: u64,
    }
}

stats! {
    /// UDP (RFC 768) counters.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    pub struct UdpStats {
        /// Datagrams delivered to a socket's receive queue.
        counter rx_datagrams: u64,
        /// Payload bytes of those datagrams.
        counter rx_bytes: u64,
        /// Datagrams sent.
        counter tx_datagrams: u64,
        /// Payload bytes of those datagrams.
        counter tx_bytes: u64,
        /// Sockets bound now (a gauge).
        gauge sockets: u64,
    }
}

stats! {
    /// RDMA UD (RoCEv2) counters: payload bytes of SENDs.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    pub struct UdStats {
        /// UD queue pairs open now (a gauge).
        gauge qps: u64,
        /// SENDs delivered into a posted receive buffer.
        counter rx_packets: u64,
        /// Payload bytes of those SENDs.
        counter rx_bytes: u64,
        /// SENDs emitted.
        counter tx_packets: u64,
        /// Payload bytes of those SENDs.
        counter tx_bytes: u64,
        /// Sends completed in error (no route).
        counter tx_errors: u64,
        /// Most completions waiting in one QP's completion queue at once.
        gauge cq_depth_hwm: u64,
    }
}

stats! {
    /// RoCEv2 RC: gauges, and every QP's counters summed (QPs destroyed
    /// included).
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    pub struct RcStats {
        /// RC queue pairs open now (a gauge).
        gauge qps: u64,
        /// Memory regions registered now (a gauge).
        gauge mrs: u64,
        /// Bytes of those regions (a gauge).
        gauge mr_bytes: u64,
        /// The QPs' counters.
        #[serde(flatten)]
        flattened totals: RcQpStats,
    }
}

stats! {
    /// All engine counters.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    pub struct Stats {
        /// Ethernet: frames in and out.
        nested eth: EthStats,
        /// ARP cache and messages.
        nested arp: ArpStats,
        /// IPv4, fragmentation and reassembly.
        nested ipv4: Ipv4Stats,
        /// IPv6, ICMPv6 and neighbor discovery.
        nested ipv6: Ipv6Stats,
        /// ICMP echo and errors.
        nested icmp: IcmpStats,
        /// UDP sockets.
        nested udp: UdpStats,
        /// TCP connections, listeners and per-connection totals.
        nested tcp: TcpStats,
        /// RDMA UD over RoCEv2.
        nested ud: UdStats,
        /// RDMA RC over RoCEv2.
        nested rc: RcStats,
        /// Received frames dropped, one counter per [`DropReason`].
        nested drops: Drops,
    }
}

stats! {
    /// Counters of the TCP layer.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    pub struct TcpStats {
        /// Connections opened by the app (`tcp().connect`).
        counter active_opens: u64,
        /// Connections opened by a listener: SYNs accepted into the backlog,
        /// and SYN-cookie handshakes completed.
        counter passive_opens: u64,
        /// Handshakes completed (SYN-SENT or SYN-RECEIVED to a synchronized state).
        counter established: u64,
        /// RST segments sent, by connections and for segments matching no socket.
        counter resets_sent: u64,
        /// Acceptable RST segments that closed a connection.
        counter resets_received: u64,
        /// Resets for segments matching no connection left unsent for the
        /// reset rate limit.
        counter resets_rate_limited: u64,
        /// SYN-ACKs carrying a SYN cookie, sent because a backlog was full.
        counter syn_cookies_sent: u64,
        /// ACKs to a listener that carried a valid cookie and became connections.
        counter syn_cookies_accepted: u64,
        /// ACKs to a listener whose cookie did not verify (answered with RST).
        counter syn_cookies_failed: u64,
        /// SYNs that found their listener's backlog full (answered with a cookie).
        counter listen_overflows: u64,
        /// Connections TCP Fast Open (RFC 7413) opened from a SYN, with
        /// its data taken.
        counter fast_open_accepted: u64,
        /// SYN-ACKs giving a client a Fast Open cookie (it asked for one,
        /// or sent one that did not verify).
        counter fast_open_cookies_sent: u64,
        /// Well-formed segments received, whatever became of them.
        counter segs_in: u64,
        /// Segments emitted onto the link (each frame of a segment the stack
        /// cuts itself counts; a TSO port's segment counts once).
        counter segs_out: u64,
        /// Segments the stack cut into several frames itself (GSO, for a port
        /// without TSO, [`crate::Config::gso_max`]).
        counter gso_segments: u64,
        /// Retransmitted segments emitted (sum of the connections' retransmits
        /// as they are sent).
        counter retransmits: u64,
        /// Connections held now, in any state including TIME_WAIT (a gauge).
        gauge connections: u64,
        /// Of those, TIME-WAIT records (the small kind a released connection
        /// becomes, without buffers; a gauge).
        gauge time_wait: u64,
        /// SYNs of a new incarnation that took a 4-tuple out of TIME-WAIT
        /// (RFC 6191: a newer timestamp or sequence number).
        counter time_wait_reopened: u64,
        /// Segments to a TIME-WAIT record answered with its ACK.
        counter time_wait_acks: u64,
        /// Most connections held at once (the table's high-water mark).
        gauge connections_hwm: u64,
        /// Most connections a listener held in its backlog at once (waiting
        /// for accept plus half-open), across listeners.
        gauge backlog_hwm: u64,
        /// Out-of-order bytes held across connections now.
        gauge ooo_bytes: u64,
        /// Times a connection's out-of-order data was dropped for the stack-wide cap.
        counter ooo_pruned: u64,
        /// Receive buffers grown by autotuning.
        counter rcvbuf_grown: u64,
        /// Autotuning growths refused for the stack-wide `autotune_memory`.
        counter autotune_limited: u64,
        /// Bytes receive buffers hold now beyond their initial size.
        gauge autotune_bytes: u64,
        /// Per-connection counters summed over every connection, live and closed.
        nested totals: ConnStats,
    }
}

stats! {
    /// One QP's counters (and the totals of all of them in [`crate::stats::RcStats`]).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
    pub struct RcQpStats {
        /// Packets sent (requests, responses, including retransmissions).
        counter tx_packets: u64,
        /// Payload bytes sent the first time (SEND/WRITE data, READ responses).
        counter tx_bytes: u64,
        /// Requests taken in sequence.
        counter rx_packets: u64,
        /// Payload bytes placed (received SENDs and WRITEs, READ responses).
        counter rx_bytes: u64,
        /// Request packets sent again (go-back-N).
        counter retransmits: u64,
        /// ACK timeouts.
        counter ack_timeouts: u64,
        /// PSN-sequence NAKs sent (one per gap).
        counter seq_naks_sent: u64,
        /// PSN-sequence NAKs received.
        counter seq_naks_received: u64,
        /// RNR NAKs sent (no receive posted).
        counter rnr_naks_sent: u64,
        /// RNR NAKs received.
        counter rnr_naks_received: u64,
        /// Other NAKs sent (invalid request, remote access, operational).
        counter naks_sent: u64,
        /// Fatal NAKs received.
        counter remote_errors: u64,
        /// ACKs (and NAKs) sent.
        counter acks_sent: u64,
        /// Requests that arrived again after they were executed.
        counter duplicates: u64,
        /// Requests ahead of the expected PSN.
        counter out_of_sequence: u64,
        /// Gaps seen in READ responses.
        counter read_gaps: u64,
        /// ACKs and responses matching nothing outstanding.
        counter stale_acks: u64,
        /// WRITEs and READs refused for key, access or range.
        counter access_errors: u64,
        /// Responses with the wrong length or opcode for their place.
        counter malformed: u64,
        /// Times the QP went to the error state.
        counter errors: u64,
    }
}

stats! {
    /// Counters of one connection, for telemetry.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    pub struct ConnStats {
        /// Segments delivered to the connection.
        counter segs_in: u64,
        /// Segments the connection produced (data, ACKs, SYN, FIN, RST).
        counter segs_out: u64,
        /// Payload bytes received in order (readable by the app).
        counter bytes_in: u64,
        /// Payload bytes sent and acknowledged by the peer.
        counter bytes_out: u64,
        /// Segments sent again: after a timeout, in fast recovery, or after a
        /// path MTU drop.
        counter retransmits: u64,
        /// Entries into fast recovery (three duplicate ACKs, or SACK marking
        /// the head lost, RFC 6675).
        counter fast_retransmits: u64,
        /// Retransmission timer expiries (RFC 6298 5.4-5.6).
        counter timeouts: u64,
        /// Tail loss probes sent (RFC 8985 7): new data or the last
        /// segment again, two round trips after the last send went
        /// unanswered, so a lost tail is repaired without a timeout.
        counter tail_loss_probes: u64,
        /// Duplicate ACKs received (RFC 5681 §2 definition).
        counter dup_acks: u64,
        /// Persist timer expiries that forced a zero-window probe (RFC 9293 3.8.6.1).
        counter zero_window_probes: u64,
        /// Challenge ACKs sent for suspicious RST, SYN or old ACKs (RFC 5961),
        /// within the per-second limit.
        counter challenge_acks: u64,
        /// Times out-of-order data was dropped: the range limit was reached,
        /// or the stack-wide out-of-order cap pruned this connection.
        counter ooo_dropped: u64,
        /// Segments rejected: unacceptable sequence numbers (RFC 9293
        /// 3.10.7.4), PAWS failures (RFC 7323 §5), bad ACKs in SYN-SENT.
        counter bad_segments: u64,
        /// Times an ICMP fragmentation-needed lowered the MSS (path MTU).
        counter pmtu_reductions: u64,
        /// Keepalive probes sent (RFC 1122 4.2.3.6).
        counter keepalive_probes: u64,
        /// Window reductions for an ECN echo (RFC 3168 6.1.2): congestion
        /// the path marked rather than dropped.
        counter ecn_reductions: u64,
        /// Window cuts undone: a fast recovery or timeout proved needless
        /// (D-SACKs for every retransmission, RFC 3708, or an ACK echoing
        /// a timestamp from before the first one, RFC 3522).
        counter undos: u64,
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn reason_names_are_unique_and_indexed() {
        let mut seen = std::collections::HashSet::new();
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
            assert!(seen.insert(r.name()));
        }
        let mut d = Drops::default();
        d.inc(DropReason::UdpNoSocket);
        d.inc(DropReason::UdpNoSocket);
        assert_eq!(d.total(), 2);
        assert_eq!(d.nonzero().collect::<Vec<_>>(), vec![("udp_no_socket", 2)]);
        let j = serde_json::to_value(&d).unwrap();
        assert_eq!(j["udp_no_socket"], 2);
    }

    /// Every number in `v` (a serialized struct) by its path, lists passed over.
    fn numbers(v: &serde_json::Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        match v {
            serde_json::Value::Number(_) => out.push(path.clone()),
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    path.push(k.clone());
                    numbers(v, path, out);
                    path.pop();
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| numbers(v, path, out)),
            _ => {}
        }
    }

    #[test]
    fn every_number_declares_its_kind() {
        let mut paths = Vec::new();
        numbers(
            &serde_json::to_value(Stats::default()).unwrap(),
            &mut Vec::new(),
            &mut paths,
        );
        assert!(paths.len() > 150, "{}", paths.len());
        for p in &paths {
            let p: Vec<&str> = p.iter().map(String::as_str).collect();
            assert!(
                Stats::kind(&p).is_some(),
                "no kind for stack.{}",
                p.join(".")
            );
        }
        let k = |p: &[&str]| Stats::kind(p);
        assert_eq!(k(&["arp", "entries"]), Some(Kind::Gauge));
        assert_eq!(k(&["arp", "entries_hwm"]), Some(Kind::Gauge));
        assert_eq!(k(&["arp", "rx_requests"]), Some(Kind::Counter));
        assert_eq!(k(&["tcp", "totals", "segs_in"]), Some(Kind::Counter));
        assert_eq!(k(&["rc", "mr_bytes"]), Some(Kind::Gauge));
        assert_eq!(k(&["rc", "retransmits"]), Some(Kind::Counter)); // flattened
        assert_eq!(k(&["drops", "tcp_bad_checksum"]), Some(Kind::Counter));
        assert_eq!(k(&["drops", "no_such_reason"]), None);
        assert_eq!(k(&["tcp"]), None);
        assert_eq!(k(&["tcp", "no_such_field"]), None);
        assert_eq!(k(&["arp", "entries", "deeper"]), None);
        assert_eq!(k(&[]), None);
    }
}
