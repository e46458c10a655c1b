//! Counters per layer, as plain structs the poll loop copies into snapshots.
//!
//! Every received frame ends either accepted (`rx_accepted`) or dropped with
//! exactly one [`DropReason`], so `rx_frames == rx_accepted + drops.total()`.

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

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

impl Serialize for Drops {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(DropReason::ALL.len()))?;
        for r in DropReason::ALL {
            m.serialize_entry(r.name(), &self.get(*r))?;
        }
        m.end()
    }
}

/// Ethernet-level counters of the engine (what it parsed and emitted).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct EthStats {
    /// Frames handed to [`Stack::receive`](crate::Stack::receive).
    pub rx_frames: u64,
    /// Bytes of those frames, Ethernet header included (no FCS).
    pub rx_bytes: u64,
    /// Frames processed without a drop (the rest are in [`Stats::drops`]).
    pub rx_accepted: u64,
    /// Frames written to the transmit sink.
    pub tx_frames: u64,
    /// Bytes of those frames, Ethernet header included.
    pub tx_bytes: u64,
    /// Frames the engine wanted to send but got no buffer for.
    pub tx_no_buffer: u64,
}

/// ARP (RFC 826) counters and gauges of the [`ArpCache`](crate::iface::arp::ArpCache).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ArpStats {
    /// Entries in the cache now, fresh or not yet evicted (a gauge).
    pub entries: u64,
    /// IPv4 packets waiting for an address to resolve now (a gauge).
    pub pending_packets: u64,
    /// Well-formed ARP requests received.
    pub rx_requests: u64,
    /// Well-formed ARP replies received.
    pub rx_replies: u64,
    /// Received ARP packets whose sender and target address are the same.
    pub rx_gratuitous: u64,
    /// Requests we broadcast: first asks and retries.
    pub tx_requests: u64,
    /// Replies we sent to requests for our address.
    pub tx_replies: u64,
    /// Gratuitous requests announcing our own address (one at start-up
    /// when [`Config::announce`](crate::Config::announce) is set).
    pub tx_gratuitous: u64,
    /// Lookups on transmit that found a fresh entry.
    pub hits: u64,
    /// Lookups on transmit that found no entry or an expired one.
    pub misses: u64,
    /// Packets dropped from the pending queue (full, or never resolved).
    pub pending_dropped: u64,
    /// Resolutions that gave up after the last retry.
    pub unresolved: u64,
    /// New entries refused because the table was full.
    pub table_full: u64,
    /// Packets that would have changed a fresh entry's MAC without our
    /// asking (spoofing), refused.
    pub spoof_refused: u64,
    /// Most entries held at once.
    pub entries_hwm: u64,
    /// Most bytes of packets waiting for resolution at once.
    pub pending_bytes_hwm: u64,
}

/// IPv4 (RFC 791) counters, fragmentation and reassembly included.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Ipv4Stats {
    /// Valid packets addressed to us (each fragment counts once).
    pub rx_packets: u64,
    /// Bytes of those packets by their total length field, headers included.
    pub rx_bytes: u64,
    /// Datagrams sent (a fragmented one counts once; see `tx_fragments`),
    /// including those held for ARP resolution.
    pub tx_packets: u64,
    /// Bytes of those datagrams, IPv4 header included (one header per datagram).
    pub tx_bytes: u64,
    /// Fragments received (MF set or a nonzero offset).
    pub rx_fragments: u64,
    /// Datagrams reassembled whole from fragments.
    pub reassembled: u64,
    /// Incomplete datagrams dropped when their reassembly timer expired
    /// ([`FragConfig::timeout`](crate::iface::frag::FragConfig::timeout)).
    pub reassembly_timeouts: u64,
    /// Bytes held by incomplete datagrams now (a gauge).
    pub reassembly_bytes: u64,
    /// Most bytes held for reassembly at once.
    pub reassembly_bytes_hwm: u64,
    /// Incomplete datagrams dropped to make room (cap or datagram count).
    pub reassembly_evicted: u64,
    /// Fragments sent for datagrams larger than the MTU.
    pub tx_fragments: u64,
    /// Sends refused with [`Error::NoRoute`](crate::Error::NoRoute): to
    /// ourselves, to 0.0.0.0, or off-link with no gateway.
    pub tx_no_route: u64,
}

/// ICMP (RFC 792) counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IcmpStats {
    /// Echo requests received (answered or not).
    pub rx_echo_requests: u64,
    /// Echo replies sent.
    pub tx_echo_replies: u64,
    /// Echo requests sent by ping sockets.
    pub tx_echo_requests: u64,
    /// Echo replies received (delivered to a ping socket or not).
    pub rx_echo_replies: u64,
    /// Destination-unreachable messages received.
    pub rx_dest_unreachable: u64,
    /// Destination-unreachable messages sent (port or protocol unreachable).
    pub tx_dest_unreachable: u64,
    /// Errors not sent because of the ICMP error rate limit.
    pub rate_limited: u64,
}

/// UDP (RFC 768) counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct UdpStats {
    /// Datagrams delivered to a socket's receive queue.
    pub rx_datagrams: u64,
    /// Payload bytes of those datagrams.
    pub rx_bytes: u64,
    /// Datagrams sent.
    pub tx_datagrams: u64,
    /// Payload bytes of those datagrams.
    pub tx_bytes: u64,
    /// Sockets bound now (a gauge).
    pub sockets: u64,
}

/// RDMA UD (RoCEv2) counters: payload bytes of SENDs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct UdStats {
    /// UD queue pairs open now (a gauge).
    pub qps: u64,
    /// SENDs delivered into a posted receive buffer.
    pub rx_packets: u64,
    /// Payload bytes of those SENDs.
    pub rx_bytes: u64,
    /// SENDs emitted.
    pub tx_packets: u64,
    /// Payload bytes of those SENDs.
    pub tx_bytes: u64,
    /// Sends completed in error (no route).
    pub tx_errors: u64,
    /// Most completions waiting in one QP's completion queue at once.
    pub cq_depth_hwm: u64,
}

/// RoCEv2 RC: gauges, and every QP's counters summed (QPs destroyed
/// included).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RcStats {
    /// RC queue pairs open now (a gauge).
    pub qps: u64,
    /// Memory regions registered now (a gauge).
    pub mrs: u64,
    /// Bytes of those regions (a gauge).
    pub mr_bytes: u64,
    /// The QPs' counters.
    #[serde(flatten)]
    pub totals: RcQpStats,
}

/// All engine counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Ethernet: frames in and out.
    pub eth: EthStats,
    /// ARP cache and messages.
    pub arp: ArpStats,
    /// IPv4, fragmentation and reassembly.
    pub ipv4: Ipv4Stats,
    /// ICMP echo and errors.
    pub icmp: IcmpStats,
    /// UDP sockets.
    pub udp: UdpStats,
    /// TCP connections, listeners and per-connection totals.
    pub tcp: TcpStats,
    /// RDMA UD over RoCEv2.
    pub ud: UdStats,
    /// RDMA RC over RoCEv2.
    pub rc: RcStats,
    /// Received frames dropped, one counter per [`DropReason`].
    pub drops: Drops,
}

/// Counters of the TCP layer.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct TcpStats {
    /// Connections opened by the app (`tcp_connect`).
    pub active_opens: u64,
    /// Connections opened by a listener: SYNs accepted into the backlog,
    /// and SYN-cookie handshakes completed.
    pub passive_opens: u64,
    /// Handshakes completed (SYN-SENT or SYN-RECEIVED to a synchronized state).
    pub established: u64,
    /// RST segments sent, by connections and for segments matching no socket.
    pub resets_sent: u64,
    /// Acceptable RST segments that closed a connection.
    pub resets_received: u64,
    /// Resets for segments matching no connection left unsent for the
    /// reset rate limit.
    pub resets_rate_limited: u64,
    /// SYN-ACKs carrying a SYN cookie, sent because a backlog was full.
    pub syn_cookies_sent: u64,
    /// ACKs to a listener that carried a valid cookie and became connections.
    pub syn_cookies_accepted: u64,
    /// ACKs to a listener whose cookie did not verify (answered with RST).
    pub syn_cookies_failed: u64,
    /// SYNs that found their listener's backlog full (answered with a cookie).
    pub listen_overflows: u64,
    /// Well-formed segments received, whatever became of them.
    pub segs_in: u64,
    /// Segments emitted onto the link (each frame of a segment the stack
    /// cuts itself counts; a TSO port's segment counts once).
    pub segs_out: u64,
    /// Segments the stack cut into several frames itself (GSO, for a port
    /// without TSO, [`crate::Config::gso_max`]).
    pub gso_segments: u64,
    /// Retransmitted segments emitted (sum of the connections' retransmits
    /// as they are sent).
    pub retransmits: u64,
    /// Connections held now, in any state including TIME_WAIT (a gauge).
    pub connections: u64,
    /// Of those, TIME-WAIT records (the small kind a released connection
    /// becomes, without buffers; a gauge).
    pub time_wait: u64,
    /// SYNs of a new incarnation that took a 4-tuple out of TIME-WAIT
    /// (RFC 6191: a newer timestamp or sequence number).
    pub time_wait_reopened: u64,
    /// Segments to a TIME-WAIT record answered with its ACK.
    pub time_wait_acks: u64,
    /// Most connections held at once (the table's high-water mark).
    pub connections_hwm: u64,
    /// Most connections a listener held in its backlog at once (waiting
    /// for accept plus half-open), across listeners.
    pub backlog_hwm: u64,
    /// Out-of-order bytes held across connections now.
    pub ooo_bytes: u64,
    /// Times a connection's out-of-order data was dropped for the stack-wide cap.
    pub ooo_pruned: u64,
    /// Receive buffers grown by autotuning.
    pub rcvbuf_grown: u64,
    /// Autotuning growths refused for the stack-wide `autotune_memory`.
    pub autotune_limited: u64,
    /// Bytes receive buffers hold now beyond their initial size.
    pub autotune_bytes: u64,
    /// Per-connection counters summed over every connection, live and closed.
    pub totals: ConnStats,
}

/// One QP's counters (and the totals of all of them in [`crate::stats::RcStats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RcQpStats {
    /// Packets sent (requests, responses, including retransmissions).
    pub tx_packets: u64,
    /// Payload bytes sent the first time (SEND/WRITE data, READ responses).
    pub tx_bytes: u64,
    /// Requests taken in sequence.
    pub rx_packets: u64,
    /// Payload bytes placed (received SENDs and WRITEs, READ responses).
    pub rx_bytes: u64,
    /// Request packets sent again (go-back-N).
    pub retransmits: u64,
    /// ACK timeouts.
    pub ack_timeouts: u64,
    /// PSN-sequence NAKs sent (one per gap).
    pub seq_naks_sent: u64,
    /// PSN-sequence NAKs received.
    pub seq_naks_received: u64,
    /// RNR NAKs sent (no receive posted).
    pub rnr_naks_sent: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// Other NAKs sent (invalid request, remote access, operational).
    pub naks_sent: u64,
    /// Fatal NAKs received.
    pub remote_errors: u64,
    /// ACKs (and NAKs) sent.
    pub acks_sent: u64,
    /// Requests that arrived again after they were executed.
    pub duplicates: u64,
    /// Requests ahead of the expected PSN.
    pub out_of_sequence: u64,
    /// Gaps seen in READ responses.
    pub read_gaps: u64,
    /// ACKs and responses matching nothing outstanding.
    pub stale_acks: u64,
    /// WRITEs and READs refused for key, access or range.
    pub access_errors: u64,
    /// Responses with the wrong length or opcode for their place.
    pub malformed: u64,
    /// Times the QP went to the error state.
    pub errors: u64,
}

/// Counters of one connection, for telemetry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ConnStats {
    /// Segments delivered to the connection.
    pub segs_in: u64,
    /// Segments the connection produced (data, ACKs, SYN, FIN, RST).
    pub segs_out: u64,
    /// Payload bytes received in order (readable by the app).
    pub bytes_in: u64,
    /// Payload bytes sent and acknowledged by the peer.
    pub bytes_out: u64,
    /// Segments sent again: after a timeout, in fast recovery, or after a
    /// path MTU drop.
    pub retransmits: u64,
    /// Entries into fast recovery (three duplicate ACKs, or SACK marking
    /// the head lost, RFC 6675).
    pub fast_retransmits: u64,
    /// Retransmission timer expiries (RFC 6298 5.4-5.6).
    pub timeouts: u64,
    /// Duplicate ACKs received (RFC 5681 §2 definition).
    pub dup_acks: u64,
    /// Persist timer expiries that forced a zero-window probe (RFC 9293 3.8.6.1).
    pub zero_window_probes: u64,
    /// Challenge ACKs sent for suspicious RST, SYN or old ACKs (RFC 5961),
    /// within the per-second limit.
    pub challenge_acks: u64,
    /// Times out-of-order data was dropped: the range limit was reached,
    /// or the stack-wide out-of-order cap pruned this connection.
    pub ooo_dropped: u64,
    /// Segments rejected: unacceptable sequence numbers (RFC 9293
    /// 3.10.7.4), PAWS failures (RFC 7323 §5), bad ACKs in SYN-SENT.
    pub bad_segments: u64,
    /// Times an ICMP fragmentation-needed lowered the MSS (path MTU).
    pub pmtu_reductions: u64,
    /// Keepalive probes sent (RFC 1122 4.2.3.6).
    pub keepalive_probes: u64,
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
}
