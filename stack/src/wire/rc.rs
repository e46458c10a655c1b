//! RC packet formats (IBTA Vol. 1 §9.2-9.4, as Linux rxe speaks them): the
//! RC opcodes of the Base Transport Header and the extended headers that
//! follow it: RETH (RDMA address), AETH (acknowledgement), AtomicETH,
//! AtomicAckETH and the immediate data. Views in smoltcp's style
//! (`new_checked`, getters on `AsRef`, setters on `AsMut`; after
//! `check_len` no accessor panics) and [`RcHeaders`] to parse and emit the
//! whole set an opcode calls for. The BTH itself is [`crate::wire::roce::BthPacket`].

use core::ops::Range;

pub use crate::wire::roce::IMM_LEN;
use crate::wire::roce::WireError;

/// RDMA Extended Transport Header length.
pub const RETH_LEN: usize = 16;
/// ACK Extended Transport Header length.
pub const AETH_LEN: usize = 4;
/// Atomic Extended Transport Header length.
pub const ATOMIC_ETH_LEN: usize = 28;
/// Atomic ACK Extended Transport Header length.
pub const ATOMIC_ACK_ETH_LEN: usize = 8;
/// The RC opcodes (the BTH opcode's transport bits are 000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RcOpcode {
    /// SEND First.
    SendFirst = 0x00,
    /// SEND Middle.
    SendMiddle = 0x01,
    /// SEND Last.
    SendLast = 0x02,
    /// SEND Last with Immediate.
    SendLastImm = 0x03,
    /// SEND Only.
    SendOnly = 0x04,
    /// SEND Only with Immediate.
    SendOnlyImm = 0x05,
    /// RDMA WRITE First.
    WriteFirst = 0x06,
    /// RDMA WRITE Middle.
    WriteMiddle = 0x07,
    /// RDMA WRITE Last.
    WriteLast = 0x08,
    /// RDMA WRITE Last with Immediate.
    WriteLastImm = 0x09,
    /// RDMA WRITE Only.
    WriteOnly = 0x0a,
    /// RDMA WRITE Only with Immediate.
    WriteOnlyImm = 0x0b,
    /// RDMA READ Request.
    ReadRequest = 0x0c,
    /// RDMA READ Response First.
    ReadResponseFirst = 0x0d,
    /// RDMA READ Response Middle.
    ReadResponseMiddle = 0x0e,
    /// RDMA READ Response Last.
    ReadResponseLast = 0x0f,
    /// RDMA READ Response Only.
    ReadResponseOnly = 0x10,
    /// Acknowledge.
    Acknowledge = 0x11,
    /// ATOMIC Acknowledge.
    AtomicAcknowledge = 0x12,
    /// CmpSwap.
    CompareSwap = 0x13,
    /// FetchAdd.
    FetchAdd = 0x14,
}

impl RcOpcode {
    /// Every RC opcode, in value order.
    pub const ALL: [RcOpcode; 21] = [
        RcOpcode::SendFirst,
        RcOpcode::SendMiddle,
        RcOpcode::SendLast,
        RcOpcode::SendLastImm,
        RcOpcode::SendOnly,
        RcOpcode::SendOnlyImm,
        RcOpcode::WriteFirst,
        RcOpcode::WriteMiddle,
        RcOpcode::WriteLast,
        RcOpcode::WriteLastImm,
        RcOpcode::WriteOnly,
        RcOpcode::WriteOnlyImm,
        RcOpcode::ReadRequest,
        RcOpcode::ReadResponseFirst,
        RcOpcode::ReadResponseMiddle,
        RcOpcode::ReadResponseLast,
        RcOpcode::ReadResponseOnly,
        RcOpcode::Acknowledge,
        RcOpcode::AtomicAcknowledge,
        RcOpcode::CompareSwap,
        RcOpcode::FetchAdd,
    ];

    /// The RC opcode with this BTH value, if it is one (SEND with
    /// invalidate, 0x16-0x17, is not spoken).
    pub fn from_u8(v: u8) -> Option<RcOpcode> {
        RcOpcode::ALL.iter().copied().find(|o| *o as u8 == v)
    }

    /// Whether the packet carries a RETH: the first or only packet of an
    /// RDMA WRITE, and a READ request.
    pub fn has_reth(self) -> bool {
        use RcOpcode::*;
        matches!(self, WriteFirst | WriteOnly | WriteOnlyImm | ReadRequest)
    }

    /// Whether the packet carries an AETH: acknowledgements and the READ
    /// responses that carry one (first, last, only).
    pub fn has_aeth(self) -> bool {
        use RcOpcode::*;
        matches!(
            self,
            ReadResponseFirst
                | ReadResponseLast
                | ReadResponseOnly
                | Acknowledge
                | AtomicAcknowledge
        )
    }

    /// Whether the packet carries immediate data.
    pub fn has_imm(self) -> bool {
        use RcOpcode::*;
        matches!(
            self,
            SendLastImm | SendOnlyImm | WriteLastImm | WriteOnlyImm
        )
    }

    /// Whether the packet carries an AtomicETH (an atomic request).
    pub fn has_atomic_eth(self) -> bool {
        matches!(self, RcOpcode::CompareSwap | RcOpcode::FetchAdd)
    }

    /// Whether the packet carries an AtomicAckETH.
    pub fn has_atomic_ack_eth(self) -> bool {
        self == RcOpcode::AtomicAcknowledge
    }

    /// Whether the packet may carry payload.
    pub fn has_payload(self) -> bool {
        use RcOpcode::*;
        !matches!(
            self,
            ReadRequest | Acknowledge | AtomicAcknowledge | CompareSwap | FetchAdd
        )
    }

    /// Whether a requester sends it (as opposed to a responder).
    pub fn is_request(self) -> bool {
        use RcOpcode::*;
        !matches!(
            self,
            ReadResponseFirst
                | ReadResponseMiddle
                | ReadResponseLast
                | ReadResponseOnly
                | Acknowledge
                | AtomicAcknowledge
        )
    }

    /// Whether it begins a multi-packet message (First).
    pub fn is_first(self) -> bool {
        use RcOpcode::*;
        matches!(self, SendFirst | WriteFirst | ReadResponseFirst)
    }

    /// Whether it ends a message (Last or Only, and single-packet
    /// requests and responses).
    pub fn is_last(self) -> bool {
        !self.is_first() && !self.is_middle()
    }

    /// Whether it is inside a multi-packet message (Middle).
    pub fn is_middle(self) -> bool {
        use RcOpcode::*;
        matches!(self, SendMiddle | WriteMiddle | ReadResponseMiddle)
    }

    /// Bytes of extended headers between the BTH and the payload.
    pub fn ext_len(self) -> usize {
        let mut n = 0;
        if self.has_reth() {
            n += RETH_LEN;
        }
        if self.has_atomic_eth() {
            n += ATOMIC_ETH_LEN;
        }
        if self.has_aeth() {
            n += AETH_LEN;
        }
        if self.has_atomic_ack_eth() {
            n += ATOMIC_ACK_ETH_LEN;
        }
        if self.has_imm() {
            n += IMM_LEN;
        }
        n
    }
}

mod field {
    use super::Range;
    pub const RETH_VA: Range<usize> = 0..8;
    pub const RETH_RKEY: Range<usize> = 8..12;
    pub const RETH_LEN: Range<usize> = 12..16;
    pub const AETH_SYNDROME: usize = 0;
    pub const AETH_MSN: Range<usize> = 1..4;
    pub const ATOMIC_VA: Range<usize> = 0..8;
    pub const ATOMIC_RKEY: Range<usize> = 8..12;
    pub const ATOMIC_SWAP_ADD: Range<usize> = 12..20;
    pub const ATOMIC_COMPARE: Range<usize> = 20..28;
    pub const ATOMIC_ACK_ORIG: Range<usize> = 0..8;
}

fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_be_bytes(a)
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

macro_rules! view {
    ($(#[$doc:meta])* $name:ident, $len:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// A view of `buffer` without a length check: accessors may
            /// panic on a short buffer unless `check_len` succeeded.
            pub const fn new_unchecked(buffer: T) -> Self {
                $name { buffer }
            }

            /// A view of `buffer`, or [`WireError::Truncated`] when it is
            /// too short for the header.
            pub fn new_checked(buffer: T) -> Result<Self, WireError> {
                let p = Self::new_unchecked(buffer);
                p.check_len()?;
                Ok(p)
            }

            /// [`WireError::Truncated`] when the buffer is too short; after
            /// `Ok`, no accessor panics.
            pub fn check_len(&self) -> Result<(), WireError> {
                if self.buffer.as_ref().len() < $len {
                    Err(WireError::Truncated)
                } else {
                    Ok(())
                }
            }
        }
    };
}

view!(
    /// A view of an RDMA Extended Transport Header: the remote address,
    /// key and length of a WRITE or READ.
    RethPacket,
    RETH_LEN
);

impl<T: AsRef<[u8]>> RethPacket<T> {
    /// Virtual address (bytes 0-7).
    pub fn va(&self) -> u64 {
        be64(&self.buffer.as_ref()[field::RETH_VA])
    }
    /// R_Key (bytes 8-11).
    pub fn rkey(&self) -> u32 {
        be32(&self.buffer.as_ref()[field::RETH_RKEY])
    }
    /// DMA length (bytes 12-15): the whole message's.
    pub fn dma_len(&self) -> u32 {
        be32(&self.buffer.as_ref()[field::RETH_LEN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RethPacket<T> {
    /// Set the virtual address.
    pub fn set_va(&mut self, v: u64) {
        self.buffer.as_mut()[field::RETH_VA].copy_from_slice(&v.to_be_bytes());
    }
    /// Set the R_Key.
    pub fn set_rkey(&mut self, v: u32) {
        self.buffer.as_mut()[field::RETH_RKEY].copy_from_slice(&v.to_be_bytes());
    }
    /// Set the DMA length.
    pub fn set_dma_len(&mut self, v: u32) {
        self.buffer.as_mut()[field::RETH_LEN].copy_from_slice(&v.to_be_bytes());
    }
}

view!(
    /// A view of an ACK Extended Transport Header: the syndrome and the
    /// message sequence number.
    AethPacket,
    AETH_LEN
);

impl<T: AsRef<[u8]>> AethPacket<T> {
    /// The syndrome byte.
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from_u8(self.buffer.as_ref()[field::AETH_SYNDROME])
    }
    /// MSN (24 bits): the responder's count of completed messages.
    pub fn msn(&self) -> u32 {
        let b = &self.buffer.as_ref()[field::AETH_MSN];
        u32::from_be_bytes([0, b[0], b[1], b[2]])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AethPacket<T> {
    /// Set the syndrome.
    pub fn set_syndrome(&mut self, s: Syndrome) {
        self.buffer.as_mut()[field::AETH_SYNDROME] = s.to_u8();
    }
    /// Set the MSN (masked to 24 bits).
    pub fn set_msn(&mut self, v: u32) {
        self.buffer.as_mut()[field::AETH_MSN]
            .copy_from_slice(&(v & 0x00ff_ffff).to_be_bytes()[1..]);
    }
}

/// What an AETH says (IBTA Vol. 1 §9.7.5.1): bits 6-5 of the syndrome
/// pick the kind, bits 4-0 its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syndrome {
    /// ACK with the credit count (0-30; 31 means invalid / no credits
    /// given).
    Ack {
        /// Encoded end-to-end credit count.
        credits: u8,
    },
    /// Receiver-not-ready NAK with the encoded RNR timer (0-31; 0 is
    /// 655.36 ms, 1 is 0.01 ms, ...).
    RnrNak {
        /// Encoded minimum RNR NAK timer.
        timer: u8,
    },
    /// NAK with its code.
    Nak(NakCode),
    /// A reserved encoding (bits 6-5 = 10, or an unassigned NAK code).
    Reserved(u8),
}

/// NAK codes (the syndrome's low bits with kind 11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NakCode {
    /// PSN sequence error: the requester retransmits from the PSN given.
    PsnSequenceError,
    /// Invalid request (an opcode out of sequence, a length or key
    /// the responder cannot take).
    InvalidRequest,
    /// Remote access error (R_Key or range).
    RemoteAccessError,
    /// Remote operational error.
    RemoteOperationalError,
    /// Invalid RD request.
    InvalidRdRequest,
}

impl Syndrome {
    /// Decode a syndrome byte (bit 7 is reserved and ignored).
    pub fn from_u8(v: u8) -> Syndrome {
        let value = v & 0x1f;
        match (v >> 5) & 0x3 {
            0b00 => Syndrome::Ack { credits: value },
            0b01 => Syndrome::RnrNak { timer: value },
            0b11 => match value {
                0 => Syndrome::Nak(NakCode::PsnSequenceError),
                1 => Syndrome::Nak(NakCode::InvalidRequest),
                2 => Syndrome::Nak(NakCode::RemoteAccessError),
                3 => Syndrome::Nak(NakCode::RemoteOperationalError),
                4 => Syndrome::Nak(NakCode::InvalidRdRequest),
                _ => Syndrome::Reserved(v & 0x7f),
            },
            _ => Syndrome::Reserved(v & 0x7f),
        }
    }

    /// Encode (bit 7 zero).
    pub fn to_u8(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(c) => {
                0x60 | match c {
                    NakCode::PsnSequenceError => 0,
                    NakCode::InvalidRequest => 1,
                    NakCode::RemoteAccessError => 2,
                    NakCode::RemoteOperationalError => 3,
                    NakCode::InvalidRdRequest => 4,
                }
            }
            Syndrome::Reserved(v) => v & 0x7f,
        }
    }
}

view!(
    /// A view of an Atomic Extended Transport Header: the address, key
    /// and operands of CmpSwap or FetchAdd.
    AtomicEthPacket,
    ATOMIC_ETH_LEN
);

impl<T: AsRef<[u8]>> AtomicEthPacket<T> {
    /// Virtual address of the 8-byte target.
    pub fn va(&self) -> u64 {
        be64(&self.buffer.as_ref()[field::ATOMIC_VA])
    }
    /// R_Key.
    pub fn rkey(&self) -> u32 {
        be32(&self.buffer.as_ref()[field::ATOMIC_RKEY])
    }
    /// Swap value (CmpSwap) or the addend (FetchAdd).
    pub fn swap_add(&self) -> u64 {
        be64(&self.buffer.as_ref()[field::ATOMIC_SWAP_ADD])
    }
    /// Compare value (CmpSwap).
    pub fn compare(&self) -> u64 {
        be64(&self.buffer.as_ref()[field::ATOMIC_COMPARE])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEthPacket<T> {
    /// Set the virtual address.
    pub fn set_va(&mut self, v: u64) {
        self.buffer.as_mut()[field::ATOMIC_VA].copy_from_slice(&v.to_be_bytes());
    }
    /// Set the R_Key.
    pub fn set_rkey(&mut self, v: u32) {
        self.buffer.as_mut()[field::ATOMIC_RKEY].copy_from_slice(&v.to_be_bytes());
    }
    /// Set the swap value or addend.
    pub fn set_swap_add(&mut self, v: u64) {
        self.buffer.as_mut()[field::ATOMIC_SWAP_ADD].copy_from_slice(&v.to_be_bytes());
    }
    /// Set the compare value.
    pub fn set_compare(&mut self, v: u64) {
        self.buffer.as_mut()[field::ATOMIC_COMPARE].copy_from_slice(&v.to_be_bytes());
    }
}

view!(
    /// A view of an Atomic ACK Extended Transport Header: the value the
    /// target held before the operation.
    AtomicAckEthPacket,
    ATOMIC_ACK_ETH_LEN
);

impl<T: AsRef<[u8]>> AtomicAckEthPacket<T> {
    /// The original remote data.
    pub fn orig(&self) -> u64 {
        be64(&self.buffer.as_ref()[field::ATOMIC_ACK_ORIG])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEthPacket<T> {
    /// Set the original remote data.
    pub fn set_orig(&mut self, v: u64) {
        self.buffer.as_mut()[field::ATOMIC_ACK_ORIG].copy_from_slice(&v.to_be_bytes());
    }
}

/// An RC packet's extended headers and payload, after the BTH, in the
/// order the spec lays them out: RETH or AtomicETH, AETH, AtomicAckETH,
/// immediate data, payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcHeaders<'a> {
    /// The opcode they belong to.
    pub opcode: RcOpcode,
    /// (virtual address, R_Key, DMA length).
    pub reth: Option<(u64, u32, u32)>,
    /// (virtual address, R_Key, swap or add, compare).
    pub atomic: Option<(u64, u32, u64, u64)>,
    /// (syndrome, MSN).
    pub aeth: Option<(Syndrome, u32)>,
    /// The original value an atomic found.
    pub atomic_ack: Option<u64>,
    /// Immediate data (network order, as carried).
    pub imm: Option<u32>,
    /// The payload (without pad or ICRC).
    pub payload: &'a [u8],
}

impl<'a> RcHeaders<'a> {
    /// Parse what follows a BTH with `opcode`: `rest` runs to the end of
    /// the payload (pad and ICRC already removed). Errors when `rest` is
    /// too short for the headers the opcode calls for, or when an opcode
    /// without payload has some.
    pub fn parse(opcode: RcOpcode, rest: &'a [u8]) -> Result<Self, WireError> {
        if rest.len() < opcode.ext_len() {
            return Err(WireError::Truncated);
        }
        let mut at = 0;
        let mut take = |n: usize| {
            let s = &rest[at..at + n];
            at += n;
            s
        };
        let reth = opcode.has_reth().then(|| {
            let r = RethPacket::new_unchecked(take(RETH_LEN));
            (r.va(), r.rkey(), r.dma_len())
        });
        let atomic = opcode.has_atomic_eth().then(|| {
            let a = AtomicEthPacket::new_unchecked(take(ATOMIC_ETH_LEN));
            (a.va(), a.rkey(), a.swap_add(), a.compare())
        });
        let aeth = opcode.has_aeth().then(|| {
            let a = AethPacket::new_unchecked(take(AETH_LEN));
            (a.syndrome(), a.msn())
        });
        let atomic_ack = opcode
            .has_atomic_ack_eth()
            .then(|| AtomicAckEthPacket::new_unchecked(take(ATOMIC_ACK_ETH_LEN)).orig());
        let imm = opcode.has_imm().then(|| be32(take(IMM_LEN)));
        let payload = &rest[at..];
        if !opcode.has_payload() && !payload.is_empty() {
            return Err(WireError::Malformed);
        }
        Ok(RcHeaders {
            opcode,
            reth,
            atomic,
            aeth,
            atomic_ack,
            imm,
            payload,
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub fn buffer_len(&self) -> usize {
        self.opcode.ext_len() + self.payload.len()
    }

    /// Write the extended headers and payload into `buf` (at least
    /// [`buffer_len`](Self::buffer_len) bytes). A header the opcode calls
    /// for but `self` lacks is written as zeros.
    pub fn emit(&self, buf: &mut [u8]) {
        let op = self.opcode;
        let mut at = 0;
        if op.has_reth() {
            let (va, rkey, len) = self.reth.unwrap_or_default();
            let mut r = RethPacket::new_unchecked(&mut buf[at..at + RETH_LEN]);
            r.set_va(va);
            r.set_rkey(rkey);
            r.set_dma_len(len);
            at += RETH_LEN;
        }
        if op.has_atomic_eth() {
            let (va, rkey, swap, cmp) = self.atomic.unwrap_or_default();
            let mut a = AtomicEthPacket::new_unchecked(&mut buf[at..at + ATOMIC_ETH_LEN]);
            a.set_va(va);
            a.set_rkey(rkey);
            a.set_swap_add(swap);
            a.set_compare(cmp);
            at += ATOMIC_ETH_LEN;
        }
        if op.has_aeth() {
            let (s, msn) = self.aeth.unwrap_or((Syndrome::Ack { credits: 0 }, 0));
            let mut a = AethPacket::new_unchecked(&mut buf[at..at + AETH_LEN]);
            a.set_syndrome(s);
            a.set_msn(msn);
            at += AETH_LEN;
        }
        if op.has_atomic_ack_eth() {
            AtomicAckEthPacket::new_unchecked(&mut buf[at..at + ATOMIC_ACK_ETH_LEN])
                .set_orig(self.atomic_ack.unwrap_or(0));
            at += ATOMIC_ACK_ETH_LEN;
        }
        if op.has_imm() {
            buf[at..at + IMM_LEN].copy_from_slice(&self.imm.unwrap_or(0).to_be_bytes());
            at += IMM_LEN;
        }
        buf[at..at + self.payload.len()].copy_from_slice(self.payload);
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn opcode_values_and_header_sets_follow_the_spec() {
        // Every value 0x00-0x14 is an RC opcode; 0x15 and up (here) are not.
        for v in 0u8..=0x14 {
            assert_eq!(RcOpcode::from_u8(v).map(|o| o as u8), Some(v));
        }
        assert_eq!(RcOpcode::from_u8(0x15), None);
        assert_eq!(RcOpcode::from_u8(0x64), None, "UD SEND_ONLY is not RC");
        use RcOpcode::*;
        assert_eq!(WriteOnly.ext_len(), RETH_LEN);
        assert_eq!(WriteOnlyImm.ext_len(), RETH_LEN + IMM_LEN);
        assert_eq!(WriteMiddle.ext_len(), 0);
        assert_eq!(ReadRequest.ext_len(), RETH_LEN);
        assert_eq!(ReadResponseMiddle.ext_len(), 0);
        assert_eq!(ReadResponseOnly.ext_len(), AETH_LEN);
        assert_eq!(AtomicAcknowledge.ext_len(), AETH_LEN + ATOMIC_ACK_ETH_LEN);
        assert_eq!(CompareSwap.ext_len(), ATOMIC_ETH_LEN);
        assert!(SendFirst.is_first() && SendMiddle.is_middle() && SendLast.is_last());
        assert!(SendOnly.is_last() && !SendOnly.is_first());
        assert!(ReadRequest.is_request() && !Acknowledge.is_request());
    }

    #[test]
    fn syndromes_decode_as_rxe_sends_them() {
        // rxe: AETH_ACK_UNLIMITED = 0x1f, AETH_RNR_NAK = 0x20 | timer,
        // NAK PSN sequence error 0x60, invalid request 0x61, remote access 0x62.
        assert_eq!(Syndrome::from_u8(0x1f), Syndrome::Ack { credits: 31 });
        assert_eq!(Syndrome::from_u8(0x2e), Syndrome::RnrNak { timer: 14 });
        assert_eq!(
            Syndrome::from_u8(0x60),
            Syndrome::Nak(NakCode::PsnSequenceError)
        );
        assert_eq!(
            Syndrome::from_u8(0x61),
            Syndrome::Nak(NakCode::InvalidRequest)
        );
        assert_eq!(
            Syndrome::from_u8(0x62),
            Syndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(
            Syndrome::from_u8(0x63),
            Syndrome::Nak(NakCode::RemoteOperationalError)
        );
        assert_eq!(Syndrome::from_u8(0x45), Syndrome::Reserved(0x45));
        assert_eq!(Syndrome::from_u8(0x6a), Syndrome::Reserved(0x6a));
        for v in 0u8..0x80 {
            assert_eq!(Syndrome::from_u8(v).to_u8(), v, "{v:#x}");
        }
    }

    #[test]
    fn a_write_first_packet_parses_field_by_field() {
        // RETH: va 0x1122334455667788, rkey 0xdeadbeef, length 8192; payload 3 bytes.
        let bytes = [
            0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0x20, 0,
            1, 2, 3,
        ];
        let h = RcHeaders::parse(RcOpcode::WriteFirst, &bytes).unwrap();
        assert_eq!(h.reth, Some((0x1122_3344_5566_7788, 0xdead_beef, 8192)));
        assert_eq!(h.payload, &[1, 2, 3]);
        assert_eq!(
            RcHeaders::parse(RcOpcode::WriteFirst, &bytes[..15]),
            Err(WireError::Truncated)
        );
        // An acknowledge with payload is malformed.
        assert_eq!(
            RcHeaders::parse(RcOpcode::Acknowledge, &[0x1f, 0, 0, 1, 9]),
            Err(WireError::Malformed)
        );
    }

    fn opcode() -> impl Strategy<Value = RcOpcode> {
        prop::sample::select(RcOpcode::ALL.to_vec())
    }

    proptest! {
        #[test]
        fn parse_emit_parse_round_trips(op in opcode(), va in any::<u64>(), rkey in any::<u32>(),
                                        len in any::<u32>(), swap in any::<u64>(), cmp in any::<u64>(),
                                        syn in 0u8..0x80, msn in 0u32..0x0100_0000, orig in any::<u64>(),
                                        imm in any::<u32>(), payload in prop::collection::vec(any::<u8>(), 0..64)) {
            let h = RcHeaders {
                opcode: op,
                reth: op.has_reth().then_some((va, rkey, len)),
                atomic: op.has_atomic_eth().then_some((va, rkey, swap, cmp)),
                aeth: op.has_aeth().then_some((Syndrome::from_u8(syn), msn)),
                atomic_ack: op.has_atomic_ack_eth().then_some(orig),
                imm: op.has_imm().then_some(imm),
                payload: if op.has_payload() { &payload } else { &[] },
            };
            let mut buf = vec![0u8; h.buffer_len()];
            h.emit(&mut buf);
            prop_assert_eq!(RcHeaders::parse(op, &buf), Ok(h));
        }

        #[test]
        fn parse_never_panics(v in any::<u8>(), rest in prop::collection::vec(any::<u8>(), 0..80)) {
            if let Some(op) = RcOpcode::from_u8(v) {
                let _ = RcHeaders::parse(op, &rest);
            }
        }
    }
}
