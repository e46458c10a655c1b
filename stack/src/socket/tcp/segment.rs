//! The segment vocabulary both the connection and TIME-WAIT records
//! speak: a parsed incoming [`Segment`], an [`Outgoing`] one, and the
//! [`Header`] they share. A leaf: it imports only [`Seq`].

use super::seq::Seq;

/// The header fields and options of a segment, in either direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// Sequence number of the first octet (or of the SYN/FIN).
    pub seq: Seq,
    /// Acknowledgment number, when the ACK flag is set.
    pub ack: Option<Seq>,
    /// SYN flag.
    pub syn: bool,
    /// FIN flag.
    pub fin: bool,
    /// RST flag.
    pub rst: bool,
    /// The 16-bit window field as on the wire: not yet shifted by the
    /// window scale (and never scaled on a SYN, RFC 7323 §2.2).
    pub window: u16,
    /// MSS option (RFC 9293 3.7.1), SYN only: the largest payload in
    /// bytes the sender accepts.
    pub mss: Option<u16>,
    /// Window scale option (RFC 7323 §2), SYN only: the shift count the
    /// sender applies to the windows it advertises.
    pub wscale: Option<u8>,
    /// SACK-permitted option (RFC 2018 §2), SYN only.
    pub sack_permitted: bool,
    /// SACK blocks (RFC 2018 §3), each the left and right edge of a range
    /// held out of order; at most three fit beside timestamps.
    pub sack: [Option<(Seq, Seq)>; 3],
    /// Timestamps option (RFC 7323 §3) as (TSval, TSecr).
    pub timestamp: Option<(u32, u32)>,
    /// ECN-Echo flag (RFC 3168 6.1): on a SYN with CWR, a request for
    /// ECN; on a SYN-ACK alone, its acceptance; otherwise, congestion
    /// was experienced on the way to the sender.
    pub ece: bool,
    /// Congestion Window Reduced flag (RFC 3168 6.1): the sender cut its
    /// window after an ECE (on a SYN with ECE: the ECN request).
    pub cwr: bool,
}

/// A parsed incoming segment (from `smoltcp::wire::TcpRepr`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Segment<'a> {
    /// Header fields and options.
    pub hdr: Header,
    /// The segment's data (borrowed from the received frame).
    pub payload: &'a [u8],
    /// The ECN codepoint of the IP header it came in (RFC 3168 5: 0
    /// Not-ECT, 2 ECT(0), 1 ECT(1), 3 CE).
    pub ecn: u8,
}

impl Segment<'_> {
    /// The duplicate this ACK (acknowledging `ack`) reports, if any: its
    /// first SACK block when below the cumulative ACK or inside the
    /// second block (RFC 2883 4's D-SACK).
    pub fn dsack(&self, ack: Seq) -> Option<(Seq, Seq)> {
        let (start, end) = self.hdr.sack[0]?;
        let inside_next =
            self.hdr.sack[1].is_some_and(|(s, e)| start.diff(s) >= 0 && end.diff(e) <= 0);
        (end.diff(ack) <= 0 || inside_next).then_some((start, end))
    }

    /// Sequence space the segment occupies.
    pub fn len(&self) -> usize {
        self.payload.len() + usize::from(self.hdr.syn) + usize::from(self.hdr.fin)
    }
    /// Whether the segment occupies no sequence space (a pure ACK or RST).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A segment to send: its header and a range of the send buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outgoing {
    /// Header fields and options to emit.
    pub hdr: Header,
    /// Offset in bytes of the payload from the start of the send buffer
    /// (its first unacknowledged byte).
    pub payload_offset: usize,
    /// Payload length in bytes (0 for a pure ACK, SYN or RST).
    pub payload_len: usize,
    /// For a segment the port is to cut (TSO): the payload bytes of each
    /// frame. 0 for a segment that leaves as one frame.
    pub tso_segsz: usize,
    /// A TCP Fast Open option (RFC 7413): a SYN-ACK's cookie, a client
    /// SYN's cookie or its request for one (empty), and whether it goes in
    /// the experimental option (kind 254) rather than kind 34.
    pub fast_open: Option<(super::fastopen::Cookie, bool)>,
    /// Leaves ECN-capable, marked ECT(0) in the IP header (RFC 3168 6.1.2:
    /// new data on a connection that negotiated ECN).
    pub ect: bool,
}

impl From<Header> for Outgoing {
    /// A segment without payload.
    fn from(hdr: Header) -> Self {
        Outgoing {
            hdr,
            payload_offset: 0,
            payload_len: 0,
            tso_segsz: 0,
            fast_open: None,
            ect: false,
        }
    }
}

impl From<Header> for Segment<'_> {
    /// A segment without payload.
    fn from(hdr: Header) -> Self {
        Segment {
            hdr,
            payload: &[],
            ecn: 0,
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn a_dsack_is_a_first_block_below_the_ack_or_inside_the_second() {
        let seg = |sack: [Option<(Seq, Seq)>; 3]| {
            Segment::from(Header {
                sack,
                ..Header::default()
            })
        };
        let ack = Seq(1000);
        let below = seg([Some((Seq(500), Seq(600))), None, None]);
        assert_eq!(below.dsack(ack), Some((Seq(500), Seq(600))));
        let inside = seg([
            Some((Seq(1200), Seq(1300))),
            Some((Seq(1100), Seq(1400))),
            None,
        ]);
        assert_eq!(inside.dsack(ack), Some((Seq(1200), Seq(1300))));
        let plain = seg([
            Some((Seq(1200), Seq(1300))),
            Some((Seq(1400), Seq(1500))),
            None,
        ]);
        assert_eq!(plain.dsack(ack), None);
        assert_eq!(seg([None; 3]).dsack(ack), None);
    }
}
