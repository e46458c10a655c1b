//! RoCEv2 wire formats that smoltcp lacks: the InfiniBand Base Transport
//! Header (BTH), the Datagram Extended Transport Header (DETH) and the
//! invariant CRC (ICRC), in the `smoltcp::wire` style.
//!
//! Panic contract (as in smoltcp's `wire`): a view made with `new_checked`
//! (or `new_unchecked` followed by a successful `check_len`) never panics in
//! an accessor.

use thiserror::Error;

/// UDP destination port of RoCEv2.
pub const ROCE_PORT: u16 = 4791;
/// BTH length.
pub const BTH_LEN: usize = 12;
/// DETH length.
pub const DETH_LEN: usize = 8;
/// Immediate data length.
pub const IMM_LEN: usize = 4;
/// ICRC length.
pub const ICRC_LEN: usize = 4;
/// IPv6 header length (RoCEv2 over IPv6 carries no extension header).
const IPV6_LEN: usize = 40;
/// The default partition key (full member of the default partition).
pub const DEFAULT_PKEY: u16 = 0xffff;
/// Largest QP number (24 bits).
pub const MAX_QPN: u32 = 0x00ff_ffff;
/// PSNs are 24 bits.
pub const PSN_MASK: u32 = 0x00ff_ffff;

/// A malformed or unsupported RoCE packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum WireError {
    /// Shorter than the BTH, DETH, immediate data, pad and ICRC it announces.
    #[error("packet shorter than its headers")]
    Truncated,
    /// A BTH opcode other than UD SEND_ONLY (with or without immediate).
    #[error("opcode is not a UD SEND")]
    BadOpcode,
    /// The BTH's TVer field is not 0.
    #[error("unsupported transport header version")]
    BadVersion,
    /// Headers that disagree with the opcode (an RC acknowledgement or
    /// request that carries payload).
    #[error("headers do not match the opcode")]
    Malformed,
}

/// BTH opcodes the UD path speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    /// UD SEND_ONLY (0x64).
    UdSendOnly,
    /// UD SEND_ONLY_WITH_IMMEDIATE (0x65).
    UdSendOnlyImm,
    /// Any other opcode (RC, UC, RD, or a UD opcode we do not speak).
    Unknown(u8),
}

impl From<u8> for Opcode {
    fn from(v: u8) -> Self {
        match v {
            0x64 => Opcode::UdSendOnly,
            0x65 => Opcode::UdSendOnlyImm,
            x => Opcode::Unknown(x),
        }
    }
}

impl From<Opcode> for u8 {
    fn from(v: Opcode) -> u8 {
        match v {
            Opcode::UdSendOnly => 0x64,
            Opcode::UdSendOnlyImm => 0x65,
            Opcode::Unknown(x) => x,
        }
    }
}

fn be24(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}

fn put_be24(b: &mut [u8], v: u32) {
    b.copy_from_slice(&v.to_be_bytes()[1..]);
}

/// A view of a Base Transport Header (IBTA Vol. 1 §9.2) and what follows it.
#[derive(Debug, Clone)]
pub struct BthPacket<T: AsRef<[u8]>> {
    buffer: T,
}

mod field {
    use std::ops::Range;

    pub const OPCODE: usize = 0;
    /// SE (0x80), MigReq (0x40), PadCnt (0x30), TVer (0x0f).
    pub const FLAGS: usize = 1;
    pub const PKEY: Range<usize> = 2..4;
    /// FECN (0x80), BECN (0x40), reserved: masked to ones in the ICRC.
    pub const RESV8A: usize = 4;
    pub const DEST_QP: Range<usize> = 5..8;
    /// AckReq (0x80), reserved.
    pub const ACK: usize = 8;
    pub const PSN: Range<usize> = 9..12;

    pub const QKEY: Range<usize> = 0..4;
    pub const DETH_RESV: usize = 4;
    pub const SRC_QP: Range<usize> = 5..8;
}

impl<T: AsRef<[u8]>> BthPacket<T> {
    /// A view of `buffer` without a length check: accessors may panic on
    /// a buffer shorter than [`BTH_LEN`] unless [`check_len`](Self::check_len)
    /// succeeded.
    pub const fn new_unchecked(buffer: T) -> Self {
        BthPacket { buffer }
    }

    /// A view of `buffer`, or [`WireError::Truncated`] when it cannot hold a BTH.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// [`WireError::Truncated`] when the buffer is shorter than [`BTH_LEN`];
    /// after `Ok`, no accessor panics.
    pub fn check_len(&self) -> Result<(), WireError> {
        if self.buffer.as_ref().len() < BTH_LEN {
            Err(WireError::Truncated)
        } else {
            Ok(())
        }
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// OpCode (byte 0): transport type and operation.
    pub fn opcode(&self) -> Opcode {
        Opcode::from(self.buffer.as_ref()[field::OPCODE])
    }
    /// SE, Solicited Event (byte 1, bit 7): the responder should raise an event.
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & 0x80 != 0
    }
    /// MigReq (byte 1, bit 6): path migration state (real RNICs set it on UD).
    pub fn mig_req(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & 0x40 != 0
    }
    /// PadCnt (byte 1, bits 5-4): pad bytes after the payload, 0..=3.
    pub fn pad_count(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] >> 4) & 0x3
    }
    /// TVer (byte 1, bits 3-0): transport header version, 0.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & 0x0f
    }
    /// P_Key (bytes 2-3): partition key ([`DEFAULT_PKEY`] here).
    pub fn pkey(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::PKEY];
        u16::from_be_bytes([b[0], b[1]])
    }
    /// FECN (byte 4, bit 7): forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::RESV8A] & 0x80 != 0
    }
    /// BECN (byte 4, bit 6): backward explicit congestion notification.
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::RESV8A] & 0x40 != 0
    }
    /// DestQP (bytes 5-7): the destination queue pair number, 24 bits.
    pub fn dest_qp(&self) -> u32 {
        be24(&self.buffer.as_ref()[field::DEST_QP])
    }
    /// AckReq (byte 8, bit 7): the requester asks for an acknowledgment
    /// (unused on UD).
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK] & 0x80 != 0
    }
    /// PSN (bytes 9-11): packet sequence number, 24 bits.
    pub fn psn(&self) -> u32 {
        be24(&self.buffer.as_ref()[field::PSN])
    }
    /// Everything after the BTH.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[BTH_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> BthPacket<T> {
    /// Set the OpCode (byte 0).
    pub fn set_opcode(&mut self, v: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = v.into();
    }
    /// Flags byte: SE, MigReq, PadCnt, TVer 0.
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad: u8) {
        let mut f = (pad & 0x3) << 4;
        if solicited {
            f |= 0x80;
        }
        if mig_req {
            f |= 0x40;
        }
        self.buffer.as_mut()[field::FLAGS] = f;
    }
    /// Set the P_Key (bytes 2-3).
    pub fn set_pkey(&mut self, v: u16) {
        self.buffer.as_mut()[field::PKEY].copy_from_slice(&v.to_be_bytes());
    }
    /// Byte 4: FECN, BECN, reserved.
    pub fn set_resv8a(&mut self, v: u8) {
        self.buffer.as_mut()[field::RESV8A] = v;
    }
    /// Set DestQP (bytes 5-7); `v` is masked to 24 bits.
    pub fn set_dest_qp(&mut self, v: u32) {
        put_be24(&mut self.buffer.as_mut()[field::DEST_QP], v & MAX_QPN);
    }
    /// Set byte 8: AckReq, the reserved bits zero.
    pub fn set_ack_req(&mut self, v: bool) {
        self.buffer.as_mut()[field::ACK] = if v { 0x80 } else { 0 };
    }
    /// Set the PSN (bytes 9-11); `v` is masked to 24 bits.
    pub fn set_psn(&mut self, v: u32) {
        put_be24(&mut self.buffer.as_mut()[field::PSN], v & PSN_MASK);
    }
    /// Everything after the BTH, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[BTH_LEN..]
    }
}

/// A view of a Datagram Extended Transport Header (IBTA Vol. 1 §9.3.2),
/// the 8 bytes after the BTH of a UD packet.
#[derive(Debug, Clone)]
pub struct DethPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> DethPacket<T> {
    /// A view of `buffer` without a length check: accessors may panic on
    /// a buffer shorter than [`DETH_LEN`] unless [`check_len`](Self::check_len)
    /// succeeded.
    pub const fn new_unchecked(buffer: T) -> Self {
        DethPacket { buffer }
    }

    /// A view of `buffer`, or [`WireError::Truncated`] when it cannot hold a DETH.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// [`WireError::Truncated`] when the buffer is shorter than [`DETH_LEN`];
    /// after `Ok`, no accessor panics.
    pub fn check_len(&self) -> Result<(), WireError> {
        if self.buffer.as_ref().len() < DETH_LEN {
            Err(WireError::Truncated)
        } else {
            Ok(())
        }
    }

    /// Q_Key (bytes 0-3): must match the destination QP's for the SEND to
    /// be accepted.
    pub fn qkey(&self) -> u32 {
        let b = &self.buffer.as_ref()[field::QKEY];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }
    /// SrcQP (bytes 5-7): the sender's queue pair number, 24 bits.
    pub fn src_qp(&self) -> u32 {
        be24(&self.buffer.as_ref()[field::SRC_QP])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> DethPacket<T> {
    /// Set the Q_Key (bytes 0-3).
    pub fn set_qkey(&mut self, v: u32) {
        self.buffer.as_mut()[field::QKEY].copy_from_slice(&v.to_be_bytes());
    }
    /// Set SrcQP (bytes 5-7, masked to 24 bits) and zero the reserved byte 4.
    pub fn set_src_qp(&mut self, v: u32) {
        let b = self.buffer.as_mut();
        b[field::DETH_RESV] = 0;
        put_be24(&mut b[field::SRC_QP], v & MAX_QPN);
    }
}

/// A parsed UD SEND: the BTH and DETH fields, immediate data and payload
/// (without pad and ICRC). Parse it from the UDP payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdSendRepr<'a> {
    /// BTH SE: solicited event.
    pub solicited: bool,
    /// BTH MigReq.
    pub mig_req: bool,
    /// BTH P_Key: partition key.
    pub pkey: u16,
    /// BTH FECN: congestion experienced on the way here.
    pub fecn: bool,
    /// BTH BECN: congestion reported back.
    pub becn: bool,
    /// BTH DestQP: the receiving queue pair, 24 bits.
    pub dest_qp: u32,
    /// BTH AckReq.
    pub ack_req: bool,
    /// BTH PSN: packet sequence number, 24 bits.
    pub psn: u32,
    /// DETH Q_Key: the key the receiving QP checks.
    pub qkey: u32,
    /// DETH SrcQP: the sending queue pair, 24 bits.
    pub src_qp: u32,
    /// Immediate data (ImmDt), present with opcode SEND_ONLY_WITH_IMMEDIATE.
    pub imm: Option<u32>,
    /// The message, without pad and ICRC.
    pub payload: &'a [u8],
}

impl<'a> UdSendRepr<'a> {
    /// Parse a UDP payload `BTH | DETH | [ImmDt] | payload | pad | ICRC`.
    /// The ICRC is not checked here (see [`icrc_verify`]).
    pub fn parse(udp_payload: &'a [u8]) -> Result<Self, WireError> {
        let bth = BthPacket::new_checked(udp_payload)?;
        let imm = match bth.opcode() {
            Opcode::UdSendOnly => false,
            Opcode::UdSendOnlyImm => true,
            Opcode::Unknown(_) => return Err(WireError::BadOpcode),
        };
        if bth.version() != 0 {
            return Err(WireError::BadVersion);
        }
        let rest = &udp_payload[BTH_LEN..];
        let deth = DethPacket::new_checked(rest)?;
        let hdr = DETH_LEN + if imm { IMM_LEN } else { 0 };
        let pad = usize::from(bth.pad_count());
        if rest.len() < hdr + pad + ICRC_LEN {
            return Err(WireError::Truncated);
        }
        let imm = if imm {
            let b = &rest[DETH_LEN..DETH_LEN + IMM_LEN];
            Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        } else {
            None
        };
        let payload = &rest[hdr..rest.len() - ICRC_LEN - pad];
        Ok(UdSendRepr {
            solicited: bth.solicited(),
            mig_req: bth.mig_req(),
            pkey: bth.pkey(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            dest_qp: bth.dest_qp(),
            ack_req: bth.ack_req(),
            psn: bth.psn(),
            qkey: deth.qkey(),
            src_qp: deth.src_qp(),
            imm,
            payload,
        })
    }

    /// Pad bytes that bring the payload to a multiple of 4.
    pub fn pad(&self) -> usize {
        (4 - self.payload.len() % 4) % 4
    }

    /// Bytes of the UDP payload: headers, payload, pad and ICRC.
    pub fn buffer_len(&self) -> usize {
        BTH_LEN
            + DETH_LEN
            + if self.imm.is_some() { IMM_LEN } else { 0 }
            + self.payload.len()
            + self.pad()
            + ICRC_LEN
    }

    /// Write headers, payload and zero pad into `buf` (at least
    /// [`buffer_len`](Self::buffer_len) bytes). The ICRC bytes are left
    /// zero: fill them with [`icrc_fill`] once the IPv4 and UDP headers
    /// in front are final.
    pub fn emit(&self, buf: &mut [u8]) {
        let pad = self.pad();
        let mut bth = BthPacket::new_unchecked(&mut *buf);
        bth.set_opcode(if self.imm.is_some() {
            Opcode::UdSendOnlyImm
        } else {
            Opcode::UdSendOnly
        });
        bth.set_flags(self.solicited, self.mig_req, pad as u8);
        bth.set_pkey(self.pkey);
        bth.set_resv8a(u8::from(self.fecn) << 7 | u8::from(self.becn) << 6);
        bth.set_dest_qp(self.dest_qp);
        bth.set_ack_req(self.ack_req);
        bth.set_psn(self.psn);
        let rest = bth.payload_mut();
        let mut deth = DethPacket::new_unchecked(&mut *rest);
        deth.set_qkey(self.qkey);
        deth.set_src_qp(self.src_qp);
        let mut at = DETH_LEN;
        if let Some(imm) = self.imm {
            rest[at..at + IMM_LEN].copy_from_slice(&imm.to_be_bytes());
            at += IMM_LEN;
        }
        rest[at..at + self.payload.len()].copy_from_slice(self.payload);
        at += self.payload.len();
        rest[at..at + pad + ICRC_LEN].fill(0);
    }
}

/// The ICRC of a RoCEv2 packet. `ip` is the IPv4 or IPv6 packet from its
/// header up to and including the 4 ICRC bytes at its end (whose value is
/// ignored).
///
/// CRC-32 (the Ethernet polynomial, as `crc32fast`) over 8 bytes of 0xFF
/// (the masked LRH that RoCE does not have), the IP header with its
/// variant fields set to ones (IPv4: TOS, TTL and header checksum; IPv6:
/// traffic class, flow label and hop limit), the UDP header with its
/// checksum set to ones, the BTH with byte 4 (FECN, BECN, reserved) set to
/// ones, then everything up to the ICRC (InfiniBand annex A17).
///
/// Returns `None` when `ip` is too short to hold IP, UDP, BTH and ICRC, or
/// is IPv6 with an extension header before UDP (RoCEv2 carries none: the
/// GRH is the bare IPv6 header).
pub fn icrc(ip: &[u8]) -> Option<u32> {
    let first = *ip.first()?;
    let udp_at = match first >> 4 {
        4 => usize::from(first & 0x0f) * 4,
        6 if ip.get(6) == Some(&17) => IPV6_LEN,
        _ => return None,
    };
    let bth_at = udp_at + 8;
    if udp_at < 20 || ip.len() < bth_at + BTH_LEN + ICRC_LEN {
        return None;
    }
    let end = ip.len() - ICRC_LEN;
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xff; 8]);
    if udp_at == IPV6_LEN && first >> 4 == 6 {
        // IPv6: version kept, traffic class and flow label masked, payload
        // length and next header, hop limit masked, addresses.
        h.update(&[first | 0x0f, 0xff, 0xff, 0xff]);
        h.update(&ip[4..7]);
        h.update(&[0xff]);
        h.update(&ip[8..IPV6_LEN]);
    } else {
        // IPv4: version/IHL, TOS masked, total length .. flags/offset, TTL
        // masked, protocol, checksum masked, addresses and options.
        h.update(&ip[..1]);
        h.update(&[0xff]);
        h.update(&ip[2..8]);
        h.update(&[0xff]);
        h.update(&ip[9..10]);
        h.update(&[0xff, 0xff]);
        h.update(&ip[12..udp_at]);
    }
    // UDP: ports and length, checksum masked.
    h.update(&ip[udp_at..udp_at + 6]);
    h.update(&[0xff, 0xff]);
    // BTH with byte 4 masked, then the rest.
    h.update(&ip[bth_at..bth_at + 4]);
    h.update(&[0xff]);
    h.update(&ip[bth_at + 5..end]);
    Some(h.finalize())
}

/// Whether the packet's ICRC (least significant byte first in its last 4
/// bytes) matches [`icrc`].
pub fn icrc_verify(ip: &[u8]) -> bool {
    let Some(crc) = icrc(ip) else {
        return false;
    };
    ip[ip.len() - ICRC_LEN..] == crc.to_le_bytes()
}

/// Compute and write the ICRC into the last 4 bytes of `ip`. Returns false
/// (and writes nothing) when `ip` is too short.
pub fn icrc_fill(ip: &mut [u8]) -> bool {
    let Some(crc) = icrc(ip) else {
        return false;
    };
    let n = ip.len();
    ip[n - ICRC_LEN..].copy_from_slice(&crc.to_le_bytes());
    true
}

/// The UDP source port for a QP pair: 0xC000-0xFFFF, fixed per pair, so
/// ECMP spreads QPs but never reorders one (the flow-label idea of RoCEv2).
pub fn udp_source_port(src_qp: u32, dest_qp: u32) -> u16 {
    let v = (u64::from(src_qp & MAX_QPN) * u64::from((dest_qp & MAX_QPN) | 1))
        ^ (u64::from(src_qp) << 7);
    let fl = ((v & 0xf_ffff) ^ (v >> 20)) as u32 & 0xf_ffff;
    let port = (fl & 0x3fff) ^ (fl >> 14);
    0xc000 | (port & 0x3fff) as u16
}

#[cfg(test)]
mod test {
    use super::*;

    const TEMPL: UdSendRepr<'static> = UdSendRepr {
        solicited: false,
        mig_req: true,
        pkey: DEFAULT_PKEY,
        fecn: false,
        becn: false,
        dest_qp: 0x2d49,
        ack_req: false,
        psn: 15_937,
        qkey: 0x7227_6001,
        src_qp: 0x2d47,
        imm: None,
        payload: b"0123456789abcdefghijklmnopqrstuvwxyz",
    };

    /// A whole IPv4 packet around `repr` (TOS 0x6a, TTL 1, UDP checksum 0).
    fn ip_packet(repr: &UdSendRepr) -> Vec<u8> {
        let udp_len = 8 + repr.buffer_len();
        let mut p = vec![0u8; 20 + udp_len];
        p[0] = 0x45;
        p[1] = 0x6a;
        p[2..4].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
        p[4..6].copy_from_slice(&0x0b12u16.to_be_bytes());
        p[6] = 0x40;
        p[8] = 1;
        p[9] = 17;
        p[12..16].copy_from_slice(&[10, 200, 200, 3]);
        p[16..20].copy_from_slice(&[10, 200, 200, 4]);
        p[20..22].copy_from_slice(&udp_source_port(repr.src_qp, repr.dest_qp).to_be_bytes());
        p[22..24].copy_from_slice(&ROCE_PORT.to_be_bytes());
        p[24..26].copy_from_slice(&(udp_len as u16).to_be_bytes());
        repr.emit(&mut p[28..]);
        assert!(icrc_fill(&mut p));
        p
    }

    #[test]
    fn round_trip_parse_emit_parse() {
        for imm in [None, Some(0xdead_beef)] {
            for len in [0usize, 1, 2, 3, 4, 5, 64, 1023] {
                let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
                let repr = UdSendRepr {
                    imm,
                    payload: &data,
                    solicited: len % 2 == 1,
                    fecn: true,
                    ..TEMPL
                };
                let mut buf = vec![0u8; repr.buffer_len()];
                repr.emit(&mut buf);
                assert_eq!(buf.len() % 4, 0, "padded to words");
                let back = UdSendRepr::parse(&buf).unwrap();
                assert_eq!(back, repr);
                let mut again = vec![0u8; back.buffer_len()];
                back.emit(&mut again);
                assert_eq!(again, buf);
                let bth = BthPacket::new_checked(&buf[..]).unwrap();
                assert_eq!(bth.pad_count() as usize, repr.pad());
                assert_eq!(
                    u8::from(bth.opcode()),
                    if imm.is_some() { 0x65 } else { 0x64 }
                );
            }
        }
    }

    #[test]
    fn parse_rejects_bad_input() {
        let mut buf = vec![0u8; TEMPL.buffer_len()];
        TEMPL.emit(&mut buf);
        for n in 0..BTH_LEN + DETH_LEN + ICRC_LEN {
            assert_eq!(UdSendRepr::parse(&buf[..n]), Err(WireError::Truncated));
        }
        let mut bad = buf.clone();
        bad[0] = 0x04; // RC SEND_ONLY
        assert_eq!(UdSendRepr::parse(&bad), Err(WireError::BadOpcode));
        let mut bad = buf.clone();
        bad[1] |= 0x01;
        assert_eq!(UdSendRepr::parse(&bad), Err(WireError::BadVersion));
        // A pad count longer than what is there.
        let empty = UdSendRepr {
            payload: &[],
            ..TEMPL
        };
        let mut b = vec![0u8; empty.buffer_len()];
        empty.emit(&mut b);
        b[1] |= 0x30;
        assert_eq!(UdSendRepr::parse(&b), Err(WireError::Truncated));
    }

    #[test]
    fn icrc_ignores_masked_fields_only() {
        let p = ip_packet(&TEMPL);
        assert!(icrc_verify(&p));
        // Masked: TOS (1), TTL (8), IP checksum (10, 11), UDP checksum
        // (26, 27), BTH byte 4 (32). Changing them keeps the ICRC.
        for at in [1usize, 8, 10, 11, 26, 27, 28 + 4] {
            let mut q = p.clone();
            q[at] ^= 0x5a;
            assert!(icrc_verify(&q), "byte {at} must be masked");
        }
        // Every other bit is covered.
        for at in 0..p.len() - ICRC_LEN {
            if [1usize, 8, 10, 11, 26, 27, 32].contains(&at) {
                continue;
            }
            for bit in 0..8 {
                let mut q = p.clone();
                q[at] ^= 1 << bit;
                assert!(!icrc_verify(&q), "byte {at} bit {bit} must be covered");
            }
        }
        // The ICRC itself is checked.
        let mut q = p.clone();
        let n = q.len();
        q[n - 1] ^= 0x80;
        assert!(!icrc_verify(&q));
        assert_eq!(icrc(&p[..30]), None);
        assert!(!icrc_verify(&[]));
    }

    /// The packet of `ip_packet` over IPv6 (fd00::3 to fd00::4).
    fn ip6_packet(repr: &UdSendRepr) -> Vec<u8> {
        let udp_len = 8 + repr.buffer_len();
        let mut p = vec![0u8; 40 + udp_len];
        p[0] = 0x66;
        p[1] = 0xa1;
        p[2] = 0x23;
        p[3] = 0x45;
        p[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        p[6] = 17;
        p[7] = 64;
        p[8] = 0xfd;
        p[23] = 3;
        p[24] = 0xfd;
        p[39] = 4;
        p[40..42].copy_from_slice(&udp_source_port(repr.src_qp, repr.dest_qp).to_be_bytes());
        p[42..44].copy_from_slice(&ROCE_PORT.to_be_bytes());
        p[44..46].copy_from_slice(&(udp_len as u16).to_be_bytes());
        repr.emit(&mut p[48..]);
        assert!(icrc_fill(&mut p));
        p
    }

    #[test]
    fn icrc_over_ipv6_masks_class_label_and_hop_limit() {
        let p = ip6_packet(&TEMPL);
        assert!(icrc_verify(&p));
        // Masked: traffic class and flow label (the low nibble of byte 0,
        // bytes 1-3), hop limit (7), UDP checksum (46, 47), BTH byte 4.
        let masked = [1usize, 2, 3, 7, 46, 47, 48 + 4];
        for at in masked {
            let mut q = p.clone();
            q[at] ^= 0x5a;
            assert!(icrc_verify(&q), "byte {at} must be masked");
        }
        let mut q = p.clone();
        q[0] ^= 0x0f;
        assert!(icrc_verify(&q), "the traffic class's high nibble is masked");
        for at in 0..p.len() - ICRC_LEN {
            if masked.contains(&at) {
                continue;
            }
            for bit in 0..8 {
                if at == 0 && bit < 4 {
                    continue;
                }
                let mut q = p.clone();
                q[at] ^= 1 << bit;
                assert!(!icrc_verify(&q), "byte {at} bit {bit} must be covered");
            }
        }
        // Written out by hand: the masked copy through crc32fast.
        let mut m = vec![0xffu8; 8];
        m.extend_from_slice(&p[..p.len() - 4]);
        m[8] |= 0x0f;
        for at in masked {
            m[8 + at] = 0xff;
        }
        assert_eq!(icrc(&p), Some(crc32fast::hash(&m)));
        // An extension header before UDP is not RoCEv2.
        let mut q = p.clone();
        q[6] = 0;
        assert_eq!(icrc(&q), None);
    }

    #[test]
    fn icrc_is_crc32_over_the_masked_bytes() {
        // The same CRC written out by hand: build the masked copy and run
        // crc32fast over it in one go.
        let p = ip_packet(&UdSendRepr {
            imm: Some(7),
            ..TEMPL
        });
        let mut m = vec![0xffu8; 8];
        m.extend_from_slice(&p[..p.len() - 4]);
        for at in [8 + 1, 8 + 8, 8 + 10, 8 + 11, 8 + 26, 8 + 27, 8 + 32] {
            m[at] = 0xff;
        }
        assert_eq!(icrc(&p), Some(crc32fast::hash(&m)));
        assert_eq!(&p[p.len() - 4..], &crc32fast::hash(&m).to_le_bytes());
    }

    #[test]
    fn udp_source_port_in_range_and_fixed() {
        for (a, b) in [(0, 0), (2, 3), (0xff_ffff, 0xff_ffff), (0x2d47, 0x2d49)] {
            let p = udp_source_port(a, b);
            assert!(p >= 0xc000);
            assert_eq!(p, udp_source_port(a, b));
        }
        assert_ne!(udp_source_port(2, 3), udp_source_port(4, 3));
    }

    /// Frames of a classic pcap file (microsecond or nanosecond, either byte
    /// order): the format is small enough to read here.
    pub(crate) fn pcap_frames(data: &[u8]) -> Vec<&[u8]> {
        let magic = u32::from_le_bytes(data[..4].try_into().unwrap());
        let le = match magic {
            0xa1b2_c3d4 | 0xa1b2_3c4d => true,
            0xd4c3_b2a1 | 0x4d3c_b2a1 => false,
            m => panic!("not a pcap file: magic {m:#x}"),
        };
        let u32_at = |at: usize| {
            let b: [u8; 4] = data[at..at + 4].try_into().unwrap();
            if le {
                u32::from_le_bytes(b)
            } else {
                u32::from_be_bytes(b)
            }
        };
        assert_eq!(u32_at(20), 1, "link type Ethernet");
        let mut frames = Vec::new();
        let mut at = 24;
        while at + 16 <= data.len() {
            let incl = u32_at(at + 8) as usize;
            let orig = u32_at(at + 12) as usize;
            assert_eq!(incl, orig, "frame {} truncated", frames.len() + 1);
            frames.push(&data[at + 16..at + 16 + incl]);
            at += 16 + incl;
        }
        assert_eq!(at, data.len(), "trailing bytes");
        frames
    }

    #[test]
    fn real_rnic_capture_parses_and_passes_icrc() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../testdata/rnic_roce_ud_send.pcap"
        );
        let data = match std::fs::read(path) {
            Ok(d) => d,
            Err(e) => panic!("{path}: {e}"),
        };
        let frames = pcap_frames(&data);
        assert_eq!(frames.len(), 75);
        let mut psns = Vec::new();
        for (i, f) in frames.iter().enumerate() {
            let ip = &f[14..];
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            let ip = &ip[..total];
            assert_eq!(ip[1], 0x6a, "frame {i}: TOS");
            assert_eq!(ip[9], 17);
            let udp = &ip[ihl..];
            assert_eq!(u16::from_be_bytes([udp[2], udp[3]]), ROCE_PORT);
            assert_eq!(&udp[6..8], &[0, 0], "UDP checksum 0");
            assert!(icrc_verify(ip), "frame {}: ICRC", i + 1);
            let repr = UdSendRepr::parse(&udp[8..]).unwrap();
            assert!(repr.mig_req);
            assert_eq!(repr.pkey, DEFAULT_PKEY);
            assert_eq!(repr.qkey, 0x7227_6001);
            assert_eq!(repr.imm, None);
            // Re-emitting the parsed fields gives the same bytes, ICRC too.
            let mut again = ip.to_vec();
            repr.emit(&mut again[ihl + 8..]);
            assert!(icrc_fill(&mut again));
            assert_eq!(&again[..], ip, "frame {}: emit", i + 1);
            // One flipped payload bit fails the check.
            let mut bad = ip.to_vec();
            bad[ihl + 8 + BTH_LEN + DETH_LEN] ^= 1;
            assert!(!icrc_verify(&bad));
            psns.push((repr.src_qp, repr.psn));
        }
        // Both directions of the pings are there (several QP pairs).
        let qps: std::collections::HashSet<u32> = psns.iter().map(|p| p.0).collect();
        assert!(qps.len() >= 2, "{qps:x?}");
    }
}
