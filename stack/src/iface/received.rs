//! What the layers below the transports hand up for one received frame
//! ([`IpIn`]), shared by the IPv4 and IPv6 receive paths (a leaf: the
//! paths import it, it imports neither).

use core::net::SocketAddr;

use smoltcp::wire::IpProtocol;

use crate::error::ConnError;
use crate::iface::frag::Reassembled;
use crate::iface::link::IpMeta;
use crate::phy::device::{RxChecksum, RxMeta};

/// What the layers below the transports made of a frame.
#[derive(Debug)]
pub(crate) enum IpIn<'a> {
    /// Nothing left for a transport: an ARP packet, or a fragment held
    /// until its datagram is whole.
    Done,
    /// A datagram for a transport, in the frame.
    Datagram {
        /// Its header's facts.
        meta: IpMeta<'a>,
        /// The payload (the transport's header and data).
        body: &'a [u8],
        /// The whole IP packet, header included.
        packet: &'a [u8],
    },
    /// A datagram joined from fragments (its bytes are its own).
    Reassembled(Whole),
    /// An ICMPv6 packet too big about one of our TCP segments.
    TooBig(TooBig),
}

/// A reassembled datagram with what its last fragment came with.
#[derive(Debug)]
pub(crate) struct Whole {
    /// The datagram.
    pub(crate) datagram: Reassembled,
    broadcast: bool,
    rx: RxMeta,
}

impl Whole {
    /// `datagram`, sent to a broadcast address or group when
    /// `broadcast`, with what came with its last fragment.
    pub(crate) fn new(datagram: Reassembled, broadcast: bool, rx: RxMeta) -> Self {
        Whole {
            datagram,
            broadcast,
            rx,
        }
    }

    /// Its header's facts (the first fragment's header and TTL; no port
    /// checksum verdict applies to a joined datagram).
    pub(crate) fn meta(&self) -> IpMeta<'_> {
        let key = self.datagram.key;
        IpMeta {
            src: key.src,
            dst: key.dst,
            protocol: IpProtocol::from(key.protocol),
            ttl: self.datagram.ttl(),
            broadcast: self.broadcast,
            header: &self.datagram.header,
            rx: RxMeta {
                checksum: RxChecksum::Unknown,
                ..self.rx
            },
        }
    }
}

/// An ICMPv6 packet too big (RFC 4443 §3.2) quoting one of our TCP
/// segments: its connection lowers its MSS to the path MTU (RFC 8201).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooBig {
    /// The segment's source port (ours).
    pub(crate) local_port: u16,
    /// Where it went.
    pub(crate) remote: SocketAddr,
    /// Its sequence number (the connection checks it is in flight).
    pub(crate) seq: u32,
    /// The path MTU, at least IPv6's minimum of 1,280 (RFC 8201 §4).
    pub(crate) mtu: u16,
    /// Not a packet too big but another error about the segment
    /// (unreachable, time exceeded, parameter problem): what it means
    /// for the connection (`mtu` is then 0).
    pub(crate) error: Option<ConnError>,
}
