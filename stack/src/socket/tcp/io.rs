//! TCP on the data path: segment demux on receive, emission on poll.

use core::net::{IpAddr, SocketAddr};

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{IpAddress, IpProtocol, TcpControl, TcpPacket, TcpRepr, TcpTimestampRepr};

use super::conn::{State, TcpConn};
use super::segment::{Header, Outgoing, Segment};
use super::time_wait::TwAnswer;
use super::{FlowKey, ListenHandle, Seq, TcpTable, fastopen, local};
use crate::events::Readiness;
use crate::iface::link::{IpMeta, Link};
use crate::phy::device::{Received, RxChecksum, RxRole, Tx};
use crate::stats::DropReason;
use crate::time::Instant;

fn segment_from<'a>(r: &TcpRepr<'a>) -> Segment<'a> {
    let mut sack = [None; 3];
    for (slot, range) in sack.iter_mut().zip(r.sack_ranges.iter()) {
        *slot = range.map(|(a, b)| (Seq(a), Seq(b)));
    }
    Segment {
        hdr: Header {
            seq: r.seq_number.into(),
            ack: r.ack_number.map(Seq::from),
            syn: r.control == TcpControl::Syn,
            fin: r.control == TcpControl::Fin,
            rst: r.control == TcpControl::Rst,
            window: r.window_len,
            mss: r.max_seg_size,
            wscale: r.window_scale,
            sack_permitted: r.sack_permitted,
            sack,
            timestamp: r.timestamp.map(|t| (t.tsval, t.tsecr)),
            // `TcpRepr` has no ECN flags: `process` reads them.
            ..Header::default()
        },
        payload: r.payload,
        ecn: 0,
    }
}

/// Header prediction on receive (after Van Jacobson's): the segment a
/// bulk transfer is made of, ACK set, no SYN, FIN or RST, with no options
/// or only a timestamps option at one of its canonical places (after two
/// NOPs, as Linux sends it, or first and ended by EOL, as smoltcp and this
/// stack emit it), read straight from the header without smoltcp's
/// general option walk. Anything else is `None` and goes through
/// `TcpRepr::parse`; when it is `Some`, the segment is the one
/// `segment_from(TcpRepr::parse(..))` gives (property-tested below).
/// `pkt` has passed `check_len`.
fn predicted_segment<'a>(pkt: &TcpPacket<&'a [u8]>) -> Option<Segment<'a>> {
    if !pkt.ack() || pkt.syn() || pkt.fin() || pkt.rst() {
        return None;
    }
    if pkt.src_port() == 0 || pkt.dst_port() == 0 {
        return None;
    }
    let timestamp = match pkt.options() {
        [] => None,
        [1, 1, 8, 10, ts @ ..] | [8, 10, ts @ .., 0, _] if ts.len() == 8 => {
            let word = |i: usize| u32::from_be_bytes([ts[i], ts[i + 1], ts[i + 2], ts[i + 3]]);
            Some((word(0), word(4)))
        }
        _ => return None,
    };
    Some(Segment {
        hdr: Header {
            seq: pkt.seq_number().into(),
            ack: Some(pkt.ack_number().into()),
            window: pkt.window_len(),
            timestamp,
            ..Header::default()
        },
        payload: pkt.payload(),
        ecn: 0,
    })
}

/// What an app can see of a connection, before and after an input, to
/// tell which readiness events it caused.
#[derive(Debug, Clone, Copy)]
struct Levels {
    readable: usize,
    writable: usize,
    state: State,
    eof: bool,
    error: bool,
}

impl Levels {
    fn of(c: &TcpConn) -> Self {
        Levels {
            readable: c.recv_available(),
            writable: c.send_capacity(),
            state: c.state(),
            eof: c.recv_finished(),
            error: c.error().is_some(),
        }
    }

    /// The events from `self` to `after`; WRITABLE once the free send space
    /// climbs back to `low` (not for every byte acknowledged).
    fn changes(self, after: Levels, low: usize) -> Readiness {
        let mut r = Readiness::NONE;
        let opening = matches!(self.state, State::SynSent | State::SynReceived);
        if after.readable > self.readable || (after.eof && !self.eof) {
            r |= Readiness::READABLE;
        }
        if opening && after.state.synchronized() {
            r |= Readiness::CONNECTED | Readiness::WRITABLE;
        } else if self.writable < low && after.writable >= low {
            r |= Readiness::WRITABLE;
        }
        let ended = |s: State| matches!(s, State::Closed | State::TimeWait);
        if (after.eof && !self.eof) || (ended(after.state) && !ended(self.state)) {
            r |= Readiness::CLOSED;
        }
        if after.error && !self.error {
            r |= Readiness::ERROR;
        }
        r
    }
}

/// Whether `repr` has the shape of a bulk transfer's segments (ACK set,
/// no SYN or RST, no SYN options, no SACK blocks): its header is then
/// sized and written the short way ([`header_len`], [`write_header`]).
fn predicted_shape(repr: &TcpRepr<'_>) -> bool {
    repr.ack_number.is_some()
        && matches!(
            repr.control,
            TcpControl::None | TcpControl::Psh | TcpControl::Fin
        )
        && repr.max_seg_size.is_none()
        && repr.window_scale.is_none()
        && !repr.sack_permitted
        && repr.sack_ranges == [None; 3]
}

/// `repr.header_len()`, without its walk over every option for the
/// predicted shape (20 bytes, and 12 with timestamps).
fn header_len(repr: &TcpRepr<'_>) -> usize {
    if !predicted_shape(repr) {
        return repr.header_len();
    }
    if repr.timestamp.is_some() { 32 } else { 20 }
}

/// The ECE flag's bit in the TCP header's flags byte (RFC 3168 6.1).
const ECE: u8 = 0x40;
/// The CWR flag's bit.
const CWR: u8 = 0x80;
/// ECT(0), the ECN codepoint of an ECN-capable packet (RFC 3168 5).
const ECT0: u8 = 2;

/// A segment's header as it leaves: smoltcp's `TcpRepr`, and what it has
/// no field for.
#[derive(Debug, Clone, Copy)]
struct Head<'a> {
    repr: TcpRepr<'a>,
    /// ECE and CWR (RFC 3168 6.1), as their bits in the flags byte.
    flags: u8,
    /// The IP header's ECN codepoint (ECT(0) on new data with ECN).
    ecn: u8,
}

/// `head.repr.emit(pkt, ..)`, its ECN flags set, with the checksum left zero (as with
/// `ChecksumCapabilities::ignored()`): the same bytes (property-tested
/// below), the predicted shape without the general option machinery.
/// The payload, if any, is already in place (`repr.payload` is empty).
///
/// For the predicted shape it returns the header's one's-complement sum
/// (unfolded, [`crate::wire::checksum::sum`]'s kind), computed from the values
/// written: summing the bytes back would load words the small stores just
/// wrote, which cannot be forwarded from the store buffer and stall.
fn write_header(
    pkt: &mut TcpPacket<&mut [u8]>,
    head: &Head<'_>,
    src: &IpAddress,
    dst: &IpAddress,
) -> Option<u64> {
    let repr = &head.repr;
    let (true, Some(ack)) = (predicted_shape(repr), repr.ack_number) else {
        repr.emit(pkt, src, dst, &ChecksumCapabilities::ignored());
        pkt.set_ece(head.flags & ECE != 0);
        pkt.set_cwr(head.flags & CWR != 0);
        return None;
    };
    let hl = header_len(repr);
    let mut flags = 0x10u16 | u16::from(head.flags); // ACK, ECE, CWR
    match repr.control {
        TcpControl::Psh => flags |= 0x08,
        TcpControl::Fin => flags |= 0x01,
        _ => {}
    }
    // The fields in the order `TcpRepr::emit` writes them.
    pkt.set_src_port(repr.src_port);
    pkt.set_dst_port(repr.dst_port);
    pkt.set_seq_number(repr.seq_number);
    pkt.set_ack_number(ack);
    pkt.set_window_len(repr.window_len);
    pkt.set_header_len(hl as u8);
    pkt.clear_flags();
    pkt.set_psh(flags & 0x08 != 0);
    pkt.set_fin(flags & 0x01 != 0);
    pkt.set_ack(true);
    pkt.set_ece(head.flags & ECE != 0);
    pkt.set_cwr(head.flags & CWR != 0);
    let mut sum = u64::from(repr.src_port)
        + u64::from(repr.dst_port)
        + crate::wire::checksum::words(repr.seq_number.0 as u32)
        + crate::wire::checksum::words(ack.0 as u32)
        + u64::from(repr.window_len)
        + u64::from(((hl as u16 / 4) << 12) | flags);
    if let Some(ts) = repr.timestamp {
        // What `TcpOption::TimeStamp` then `EndOfList` write: kind,
        // length, TSval, TSecr, and the padding zeroed.
        let o = pkt.options_mut();
        o[..2].copy_from_slice(&[8, 10]);
        o[2..6].copy_from_slice(&ts.tsval.to_be_bytes());
        o[6..10].copy_from_slice(&ts.tsecr.to_be_bytes());
        o[10..].fill(0);
        sum += 0x080a
            + crate::wire::checksum::words(ts.tsval)
            + crate::wire::checksum::words(ts.tsecr);
    }
    pkt.set_urgent_at(0);
    pkt.set_checksum(0);
    Some(sum)
}

/// Emit one segment; `payload(offset, buf, summed)` writes the bytes of
/// `out`'s payload from `offset` on into `buf` (`buf.len()` of them), and
/// when `summed` asks, returns their one's-complement sum (`None`: sum
/// them here, from the frame). Returns the frames sent.
///
/// A segment with `tso_segsz` is cut into frames by the port when it has
/// TSO; otherwise here (GSO in software, [`crate::Config::gso_max`]): each
/// frame is the segment `out` would be with its payload cut to that
/// frame's bytes (sequence number moved on, FIN on the last only).
fn emit<T: Tx>(
    link: &mut Link,
    now: Instant,
    tx: &mut T,
    local: SocketAddr,
    remote: SocketAddr,
    out: &Outgoing,
    mut payload: impl FnMut(usize, &mut [u8], bool) -> Option<u64>,
) -> usize {
    let control = if out.hdr.syn {
        TcpControl::Syn
    } else if out.hdr.rst {
        TcpControl::Rst
    } else if out.hdr.fin {
        TcpControl::Fin
    } else if out.payload_len > 0 {
        TcpControl::Psh
    } else {
        TcpControl::None
    };
    let mut sack_ranges = [None; 3];
    for (slot, r) in sack_ranges.iter_mut().zip(out.hdr.sack.iter()) {
        *slot = r.map(|(a, b)| (a.0, b.0));
    }
    let repr = TcpRepr {
        src_port: local.port(),
        dst_port: remote.port(),
        control,
        seq_number: out.hdr.seq.into(),
        ack_number: out.hdr.ack.map(Into::into),
        window_len: out.hdr.window,
        window_scale: out.hdr.wscale,
        max_seg_size: out.hdr.mss,
        sack_permitted: out.hdr.sack_permitted,
        sack_ranges,
        timestamp: out.hdr.timestamp.map(|(v, e)| TcpTimestampRepr::new(v, e)),
        payload: &[],
    };
    let head = Head {
        repr,
        flags: if out.hdr.ece { ECE } else { 0 } | if out.hdr.cwr { CWR } else { 0 },
        ecn: if out.ect { ECT0 } else { 0 },
    };
    let (me, peer) = (local.ip(), remote.ip());
    if let Some((cookie, exp)) = out.fast_open {
        let (opt, n) = fastopen::option_bytes(&cookie, exp);
        let data = out.payload_len;
        let sent = emit_with_option(link, now, tx, me, peer, &head, &opt[..n], data, |buf| {
            payload(0, buf, false);
        });
        return usize::from(sent);
    }
    // IPv6 segments are cut here: the port's TSO is set up for IPv4; and
    // so is one with CWR, which a port would copy onto every frame.
    if out.tso_segsz > 0 && (link.offloads.tso_max == 0 || peer.is_ipv6() || out.hdr.cwr) {
        let mut sent = 0;
        for offset in (0..out.payload_len).step_by(out.tso_segsz) {
            let n = out.tso_segsz.min(out.payload_len - offset);
            let mut frame = head;
            frame.repr.seq_number = repr.seq_number + offset;
            if offset + n < out.payload_len {
                frame.repr.control = TcpControl::Psh;
            }
            if offset > 0 {
                // CWR on the first frame only (RFC 3168 6.1.2's one
                // segment per window reduction).
                frame.flags &= !CWR;
            }
            sent += usize::from(emit_frame(
                link,
                now,
                tx,
                me,
                peer,
                &frame,
                n,
                0,
                |buf, summed| payload(offset, buf, summed),
            ));
        }
        return sent;
    }
    usize::from(emit_frame(
        link,
        now,
        tx,
        me,
        peer,
        &head,
        out.payload_len,
        out.tso_segsz,
        |buf, summed| payload(0, buf, summed),
    ))
}

/// One segment of `head`'s header and `payload_len` bytes of payload that
/// `payload` writes (see [`emit`]), as one frame, or as a TSO segment the
/// port cuts when `tso_segsz` is set.
#[allow(clippy::too_many_arguments)]
fn emit_frame<T: Tx>(
    link: &mut Link,
    now: Instant,
    tx: &mut T,
    me: IpAddr,
    peer: IpAddr,
    head: &Head<'_>,
    payload_len: usize,
    tso_segsz: usize,
    payload: impl FnOnce(&mut [u8], bool) -> Option<u64>,
) -> bool {
    let (IpAddr::V4(me), IpAddr::V4(peer)) = (me, peer) else {
        return emit_frame6(link, now, tx, me, peer, head, payload_len, payload);
    };
    let hdr = header_len(&head.repr);
    let (src, dst) = (IpAddress::Ipv4(me), IpAddress::Ipv4(peer));
    let fill = link.checksum.tcp.tx();
    let len = hdr + payload_len;
    let mut payload = Some(payload);
    if fill && (link.offloads.tx_tcp_checksum || tso_segsz > 0) {
        // The port finishes the checksum (and cuts a TSO segment): leave it
        // the pseudo-header sum, without the length for TSO (each frame's
        // length is the port's to add, as DPDK and Linux expect).
        let tso = u16::try_from(tso_segsz).unwrap_or(0);
        let phdr_len = if tso > 0 { 0 } else { len };
        let partial = crate::wire::checksum::fold(crate::wire::checksum::pseudo_header(
            me, peer, 6, phdr_len,
        ));
        let built = link.send_tcp_offloaded(now, tx, peer, head.ecn, hdr, len, tso, |ip| {
            let buf = &mut ip[smoltcp::wire::IPV4_HEADER_LEN..];
            if let Some(p) = payload.take() {
                p(&mut buf[hdr..], false);
            }
            let mut pkt = TcpPacket::new_unchecked(&mut *buf);
            let _ = write_header(&mut pkt, head, &src, &dst);
            pkt.set_checksum(partial);
        });
        match built {
            Ok(true) => return true,
            Err(_) => return false,
            // Next hop not resolved: the ordinary path below holds the
            // packet for ARP (a TSO segment cannot wait there).
            Ok(false) if tso_segsz > 0 => return false,
            Ok(false) => {}
        }
    }
    let Some(payload) = payload else {
        return false;
    };
    link.send_ip_tos(now, tx, peer, IpProtocol::Tcp, head.ecn, len, |buf| {
        fill_segment(buf, hdr, head, me.into(), peer.into(), fill, payload);
    })
    .is_ok()
}

/// Write a segment into `buf`: `head`'s header (`hdr` bytes), the payload
/// `payload` writes after it, and when `summed`, the checksum over the
/// pseudo-header of `me` and `peer`: our own word-wide sum
/// (crate::wire::checksum), not smoltcp's, the payload's taken as it was
/// copied, when it was, and the header's from its values, when known.
fn fill_segment(
    buf: &mut [u8],
    hdr: usize,
    head: &Head<'_>,
    me: IpAddr,
    peer: IpAddr,
    summed: bool,
    payload: impl FnOnce(&mut [u8], bool) -> Option<u64>,
) {
    use crate::wire::checksum::{compute_ip, fold, pseudo_header_ip, sum};
    let (src, dst) = (IpAddress::from(me), IpAddress::from(peer));
    let payload_sum = payload(&mut buf[hdr..], summed);
    let mut pkt = TcpPacket::new_unchecked(&mut *buf);
    let header_sum = write_header(&mut pkt, head, &src, &dst);
    if !summed {
        return;
    }
    let c = match payload_sum {
        Some(p) => {
            let phdr = pseudo_header_ip(me, peer, 6, buf.len());
            let h = header_sum.unwrap_or_else(|| sum(0, &buf[..hdr]));
            !fold(phdr + h + p)
        }
        None => compute_ip(me, peer, 6, buf),
    };
    TcpPacket::new_unchecked(buf).set_checksum(c);
}

/// A segment whose header carries, after `head`'s
/// options, one that `TcpRepr` has no field for (`extra`: a SYN-ACK's
/// Fast Open cookie), NOP-padded to 4-byte boundaries. Its checksum is
/// always ours. False when it did not fit or go out.
#[allow(clippy::too_many_arguments)]
fn emit_with_option<T: Tx>(
    link: &mut Link,
    now: Instant,
    tx: &mut T,
    me: IpAddr,
    peer: IpAddr,
    head: &Head<'_>,
    extra: &[u8],
    payload_len: usize,
    payload: impl FnOnce(&mut [u8]),
) -> bool {
    const FIXED: usize = 20;
    let repr = &head.repr;
    let base = repr.header_len();
    let mut scratch = [0u8; 60];
    let Some(bytes) = scratch.get_mut(..base) else {
        return false;
    };
    let (src, dst) = (IpAddress::from(me), IpAddress::from(peer));
    repr.emit(
        &mut TcpPacket::new_unchecked(&mut *bytes),
        &src,
        &dst,
        &ChecksumCapabilities::ignored(),
    );
    // smoltcp pads its options with end-of-list: they end where the list does.
    let mut used = FIXED;
    while used < base && bytes[used] != 0 {
        used += if bytes[used] == 1 {
            1
        } else {
            usize::from(bytes.get(used + 1).copied().unwrap_or(0)).max(2)
        };
    }
    // The option starts on a 4-byte boundary and NOPs pad it to one, as
    // Linux lays its options out (and sizes its SYN-ACKs).
    let at = used.next_multiple_of(4);
    let hdr = (at + extra.len()).next_multiple_of(4);
    if hdr > scratch.len() || used > base {
        return false;
    }
    let write = |buf: &mut [u8]| {
        buf[..used].copy_from_slice(&scratch[..used]);
        buf[used..at].fill(1);
        buf[at..at + extra.len()].copy_from_slice(extra);
        buf[at + extra.len()..hdr].fill(1);
        payload(&mut buf[hdr..]);
        let mut pkt = TcpPacket::new_unchecked(&mut *buf);
        pkt.set_header_len(hdr as u8);
        pkt.set_ece(head.flags & ECE != 0);
        pkt.set_cwr(head.flags & CWR != 0);
        pkt.set_checksum(0);
        let c = crate::wire::checksum::compute_ip(me, peer, 6, buf);
        TcpPacket::new_unchecked(buf).set_checksum(c);
    };
    match (me, peer) {
        (IpAddr::V4(_), IpAddr::V4(p)) => link
            .send_ip_tos(
                now,
                tx,
                p,
                IpProtocol::Tcp,
                head.ecn,
                hdr + payload_len,
                write,
            )
            .is_ok(),
        (IpAddr::V6(m), IpAddr::V6(p)) => {
            let ports = u32::from(repr.src_port) << 16 | u32::from(repr.dst_port);
            let (len, proto) = (hdr + payload_len, (IpProtocol::Tcp, head.ecn));
            crate::iface::ipv6::send(link, now, tx, m, p, proto, ports, len, write).is_ok()
        }
        _ => false,
    }
}

/// [`emit_frame`] over IPv6 (or a mixed pair, which no connection has:
/// dropped): the checksum always ours (RFC 8200 §8.1), no port offloads.
#[allow(clippy::too_many_arguments)]
fn emit_frame6<T: Tx>(
    link: &mut Link,
    now: Instant,
    tx: &mut T,
    me: IpAddr,
    peer: IpAddr,
    head: &Head<'_>,
    payload_len: usize,
    payload: impl FnOnce(&mut [u8], bool) -> Option<u64>,
) -> bool {
    let (IpAddr::V6(me6), IpAddr::V6(peer6)) = (me, peer) else {
        return false;
    };
    let repr = &head.repr;
    let hdr = header_len(repr);
    let len = hdr + payload_len;
    let ports = u32::from(repr.src_port) << 16 | u32::from(repr.dst_port);
    let proto = (IpProtocol::Tcp, head.ecn);
    let fill = |buf: &mut [u8]| fill_segment(buf, hdr, head, me, peer, true, payload);
    crate::iface::ipv6::send(link, now, tx, me6, peer6, proto, ports, len, fill).is_ok()
}

/// Bits of a SYN-cookie SYN-ACK's TSval that carry the peer's options:
/// its window scale (4 bits, 15 for none), SACK-permitted (bit 4) and
/// ECN granted (bit 5), as Linux packs them.
const COOKIE_OPTS_MASK: u32 = 0x3f;
const COOKIE_NO_WSCALE: u32 = 0xf;
const COOKIE_SACK: u32 = 0x10;
const COOKIE_ECN: u32 = 0x20;

/// The TSval of a SYN-cookie SYN-ACK: the clock the connection will use
/// (its timestamp offset, keyed by the 4-tuple) with the peer's options in
/// the low bits, never ahead of that clock, so the connection's later
/// TSvals do not go backwards.
fn cookie_tsval(now: Instant, ts_offset: u32, wscale: Option<u8>, sack: bool, ecn: bool) -> u32 {
    let clock = TcpConn::tsval_at(now, ts_offset);
    let opts = wscale.map_or(COOKIE_NO_WSCALE, |w| u32::from(w.min(14)))
        | if sack { COOKIE_SACK } else { 0 }
        | if ecn { COOKIE_ECN } else { 0 };
    let ts = (clock & !COOKIE_OPTS_MASK) | opts;
    if (ts.wrapping_sub(clock) as i32) > 0 {
        ts.wrapping_sub(COOKIE_OPTS_MASK + 1)
    } else {
        ts
    }
}

/// The peer's window scale, SACK-permitted and ECN, from the TSecr of the
/// ACK that completes a SYN-cookie handshake.
fn cookie_options(tsecr: u32) -> (Option<u8>, bool, bool) {
    let w = tsecr & COOKIE_NO_WSCALE;
    let wscale = (w != COOKIE_NO_WSCALE).then_some(w as u8);
    (wscale, tsecr & COOKIE_SACK != 0, tsecr & COOKIE_ECN != 0)
}

/// What a listener takes from a SYN beyond its [`Segment`].
struct SynExtras<'a> {
    /// The ISN must be beyond this (a new incarnation from TIME-WAIT).
    isn_floor: Option<Seq>,
    /// The SYN's Fast Open option.
    fast_open: Option<fastopen::FastOpenOption<'a>>,
}

/// A listener's Fast Open answer to a SYN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FastOpen {
    /// The ordinary handshake.
    No,
    /// The ordinary handshake; the SYN-ACK gives the client its cookie.
    Offer([u8; fastopen::COOKIE_LEN], bool),
    /// A connection now, with the SYN's data.
    Open,
}

impl TcpTable {
    /// A TCP segment for us: to its connection (one hash lookup), to a
    /// listener (new connection, SYN cookie, or dropped), or answered
    /// with a reset.
    pub(crate) fn process<T: Tx>(
        &mut self,
        link: &mut Link,
        now: Instant,
        meta: IpMeta<'_>,
        body: &[u8],
        tx: &mut T,
    ) -> Result<Received, DropReason> {
        if meta.broadcast {
            return Err(DropReason::TcpBroadcast);
        }
        let pkt = TcpPacket::new_checked(body).map_err(|_| DropReason::TcpMalformed)?;
        let verified = match (meta.src, meta.dst) {
            // The port's verdict and the checksum switch apply to IPv4.
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                !link.checksum.tcp.rx()
                    || meta.rx.checksum == RxChecksum::Good
                    || crate::wire::checksum::verifies(s, d, 6, body)
            }
            (s, d) => crate::wire::checksum::verifies_ip(s, d, 6, body),
        };
        if !verified {
            return Err(DropReason::TcpBadChecksum);
        }
        let mut seg = match predicted_segment(&pkt) {
            Some(seg) => seg,
            None => {
                let (src, dst) = (IpAddress::from(meta.src), IpAddress::from(meta.dst));
                segment_from(
                    &TcpRepr::parse(&pkt, &src, &dst, &ChecksumCapabilities::ignored())
                        .map_err(|_| DropReason::TcpMalformed)?,
                )
            }
        };
        seg.hdr.ece = pkt.ece();
        seg.hdr.cwr = pkt.cwr();
        seg.ecn = meta.ecn();
        self.stats.segs_in += 1;
        let (src_port, dst_port) = (pkt.src_port(), pkt.dst_port());
        let remote = SocketAddr::new(meta.src, src_port);
        let key = FlowKey {
            local_port: dst_port,
            remote,
        };
        if let Some(&slot) = self.flows.get(&key) {
            if seg.hdr.syn && seg.hdr.ack.is_some() {
                self.keep_fast_open_cookie(slot, remote.ip(), pkt.options());
            }
            self.deliver(now, slot, &seg);
            return Ok(Received::Taken);
        }
        let mut isn_floor = None;
        if let Some(tw) = self.time_wait.get_mut(&key) {
            match tw.on_segment(now, &seg, self.cfg.time_wait) {
                TwAnswer::Ack(out) => {
                    if emit(
                        link,
                        now,
                        tx,
                        SocketAddr::new(meta.dst, dst_port),
                        remote,
                        &out,
                        |_, _, _| Some(0),
                    ) > 0
                    {
                        self.stats.segs_out += 1;
                        self.stats.time_wait_acks += 1;
                    }
                    return Ok(Received::Taken);
                }
                TwAnswer::Ignore => return Ok(Received::Taken),
                TwAnswer::Reopen => {
                    // A new incarnation: the listener takes its SYN below,
                    // with an ISN beyond anything the old one sent (as
                    // Linux does), so its old duplicates stay out of the
                    // new window.
                    isn_floor = Some(tw.snd_nxt + 65_537);
                    self.time_wait.remove(&key);
                    self.stats.time_wait_reopened += 1;
                    self.stats.connections = self.stats.connections.saturating_sub(1);
                    self.stats.time_wait = self.time_wait.len() as u64;
                }
            }
        }
        let listener = self.listener_for(dst_port, remote.ip());
        let listening = listener.is_some();
        if meta.rx.role == RxRole::MayPass && !(listening && seg.hdr.syn && seg.hdr.ack.is_none()) {
            // Perhaps a sibling shard's flow (or listener), on the wrong queue.
            return Ok(Received::PassOn);
        }
        let me = local(meta.dst, dst_port);
        if let (Some(l), false) = (listener, seg.hdr.rst) {
            let syn = SynExtras {
                isn_floor,
                fast_open: (seg.hdr.syn && seg.hdr.ack.is_none())
                    .then(|| fastopen::find(pkt.options()))
                    .flatten(),
            };
            return (self.listen_input(link, now, tx, l, me, remote, &seg, syn))
                .map(|()| Received::Taken);
        }
        if !seg.hdr.rst {
            self.send_reset(link, now, tx, me, remote, &seg);
        }
        Err(DropReason::TcpNoSocket)
    }

    /// An ICMP fragmentation-needed (RFC 1191) or ICMPv6 packet too big
    /// (RFC 8201) about one of our segments:
    /// the connection it quotes lowers its MSS to fit `mtu`, when the
    /// quoted sequence number is one it has in flight (RFC 5927 5.1, so a
    /// forged message must guess it).
    pub(crate) fn frag_needed(
        &mut self,
        now: Instant,
        local_port: u16,
        remote: SocketAddr,
        seq: u32,
        mtu: u16,
    ) -> Result<(), DropReason> {
        let key = FlowKey { local_port, remote };
        let slot = *self.flows.get(&key).ok_or(DropReason::IcmpUnhandled)?;
        let conn = (self.slots.get_mut(slot as usize))
            .and_then(|s| s.conn.as_mut())
            .ok_or(DropReason::IcmpUnhandled)?;
        if !conn.on_path_mtu(now, Seq(seq), usize::from(mtu)) {
            return Err(DropReason::IcmpUnhandled);
        }
        self.mark_dirty(slot);
        Ok(())
    }

    /// An ICMP error (unreachable, time exceeded, parameter problem)
    /// quoting one of our segments, `seq` its sequence number: what it
    /// does to the connection is [`TcpConn::on_icmp_error`]'s.
    pub(crate) fn icmp_error(
        &mut self,
        now: Instant,
        local_port: u16,
        remote: SocketAddr,
        seq: u32,
        error: crate::error::ConnError,
    ) -> Result<(), DropReason> {
        let key = FlowKey { local_port, remote };
        let slot = *self.flows.get(&key).ok_or(DropReason::IcmpUnhandled)?;
        let s = self
            .slots
            .get_mut(slot as usize)
            .ok_or(DropReason::IcmpUnhandled)?;
        let conn = s.conn.as_mut().ok_or(DropReason::IcmpUnhandled)?;
        let before = conn.state();
        if !conn.on_icmp_error(Seq(seq), error) {
            return Err(DropReason::IcmpUnhandled);
        }
        if before != State::Closed && conn.state() == State::Closed {
            let r = Readiness::CLOSED | Readiness::ERROR;
            self.raise(slot, r);
            // A dropped half-open connection goes now: a segment right
            // behind the error (its final ACK) meets no connection.
            self.reap(now, slot);
        }
        self.mark_dirty(slot);
        Ok(())
    }

    /// A SYN-ACK to a SYN that carried a Fast Open option: the cookie it
    /// gives is kept for the next connection to that server (RFC 7413
    /// 4.1.2); one without the option leaves what was kept.
    fn keep_fast_open_cookie(&mut self, slot: u32, server: IpAddr, options: &[u8]) {
        let asked = self
            .slots
            .get(slot as usize)
            .and_then(|s| s.conn.as_ref())
            .is_some_and(|c| c.state() == super::State::SynSent && c.asked_fast_open());
        let cookie = fastopen::find(options).and_then(|f| fastopen::Cookie::new(f.cookie));
        let (true, Some(cookie)) = (asked, cookie) else {
            return;
        };
        if self.fast_open_cookies.len() >= super::MAX_FAST_OPEN_COOKIES
            && !self.fast_open_cookies.contains_key(&server)
        {
            let any = self.fast_open_cookies.keys().next().copied();
            if let Some(k) = any {
                self.fast_open_cookies.remove(&k);
            }
        }
        self.fast_open_cookies.insert(server, cookie);
    }

    fn deliver(&mut self, now: Instant, slot: u32, seg: &Segment<'_>) {
        let tcp = self;
        let Some(s) = tcp.slots.get_mut(slot as usize) else {
            return;
        };
        let Some(conn) = s.conn.as_mut() else { return };
        let levels = Levels::of(conn);
        let before = conn.state();
        let ooo_before = conn.ooo_bytes();
        let queued_before = conn.send_queued();
        conn.on_segment(now, seg);
        let after = conn.state();
        let mut changed = levels.changes(Levels::of(conn), conn.send_low_water());
        if conn.ack_events() && conn.send_queued() < queued_before {
            // The app asked to hear of every acknowledgment (its zero-copy
            // sends complete with them).
            changed |= Readiness::WRITABLE;
        }
        tcp.ooo_total = (tcp.ooo_total + conn.ooo_bytes()).saturating_sub(ooo_before);
        if tcp.ooo_total > tcp.cfg.max_ooo_total {
            // Memory pressure: this connection gives its out-of-order data back.
            let freed = conn.drop_ooo();
            tcp.ooo_total = tcp.ooo_total.saturating_sub(freed);
            tcp.stats.ooo_pruned += 1;
        }
        if let Some(want) = conn.take_rcvbuf_request() {
            // Autotuning: grow within the stack-wide budget.
            let have = conn.rcvbuf_capacity();
            let room = tcp.cfg.autotune_memory.saturating_sub(tcp.autotune_bytes);
            let grant = (want - have).min(room);
            if grant >= tcp.cfg.mss {
                conn.grow_rcvbuf(have + grant);
                tcp.autotune_bytes += conn.rcvbuf_capacity() - have;
                tcp.stats.rcvbuf_grown += 1;
            } else {
                tcp.stats.autotune_limited += 1;
            }
        }
        if seg.hdr.rst && after == State::Closed {
            tcp.stats.resets_received += 1;
        }
        let handshake_over = if after != State::SynReceived {
            s.fast_open_of.take()
        } else {
            None
        };
        if before != after
            && matches!(
                after,
                State::Established | State::FinWait1 | State::CloseWait
            )
            && matches!(before, State::SynSent | State::SynReceived)
        {
            tcp.stats.established += 1;
            if let (true, Some(h)) = (s.embryonic, s.listener) {
                s.embryonic = false;
                if let Some(l) = tcp.listeners.get_mut(&h) {
                    l.embryonic = l.embryonic.saturating_sub(1);
                    l.ready.push_back(slot);
                    tcp.raise_listener(h);
                }
            }
        }
        tcp.leave_fast_open_queue(handshake_over);
        tcp.raise(slot, changed);
        tcp.mark_dirty(slot);
    }

    #[allow(clippy::too_many_arguments)]
    fn listen_input<T: Tx>(
        &mut self,
        link: &mut Link,
        now: Instant,
        tx: &mut T,
        listener: ListenHandle,
        me: SocketAddr,
        remote: SocketAddr,
        seg: &Segment<'_>,
        syn: SynExtras<'_>,
    ) -> Result<(), DropReason> {
        let Some(l) = self.listeners.get(&listener) else {
            return Err(DropReason::TcpNoSocket);
        };
        let full = l.ready.len() + l.embryonic >= l.backlog;
        let fast_open_room = l.fast_open > l.fast_open_pending;
        let max_segment = l.max_segment;
        if seg.hdr.syn && seg.hdr.ack.is_none() {
            if full {
                // Backlog full: answer statelessly with a SYN cookie.
                self.stats.listen_overflows += 1;
                let mss = seg
                    .hdr
                    .mss
                    .unwrap_or(536)
                    .min(u16::try_from(self.cfg_for(&remote).mss).unwrap_or(u16::MAX));
                let cookie = self.cookie(now, me, remote, seg.hdr.seq, mss);
                let cfg = &self.cfg;
                let wscale = seg.hdr.wscale.filter(|_| cfg.window_scaling);
                let sack = cfg.sack && seg.hdr.sack_permitted;
                let ecn = cfg.ecn != super::Ecn::Off
                    && seg.hdr.ece
                    && seg.hdr.cwr
                    && seg.ecn == 0
                    && seg.hdr.timestamp.is_some();
                // With timestamps, the options ride in the low bits of our
                // TSval and come back in the final ACK's TSecr (as Linux
                // does); without, the cookie carries only the MSS.
                let timestamp = match seg.hdr.timestamp {
                    Some((peer_tsval, _)) if cfg.timestamps => Some((
                        cookie_tsval(now, self.ts_offset(me, remote), wscale, sack, ecn),
                        peer_tsval,
                    )),
                    _ => None,
                };
                let ts = timestamp.is_some();
                let out = Outgoing::from(Header {
                    seq: cookie,
                    ack: Some(seg.hdr.seq + 1),
                    syn: true,
                    window: u16::try_from(cfg.recv_buffer).unwrap_or(u16::MAX),
                    mss: Some(mss),
                    wscale: (ts && wscale.is_some()).then(|| cfg.rcv_wscale()),
                    sack_permitted: ts && sack,
                    timestamp,
                    ece: ts && ecn,
                    ..Header::default()
                });
                if emit(link, now, tx, me, remote, &out, |_, _, _| Some(0)) > 0 {
                    self.stats.syn_cookies_sent += 1;
                    self.stats.segs_out += 1;
                }
                return Ok(());
            }
            let iss = match (self.isn(now, me, remote), syn.isn_floor) {
                (isn, Some(floor)) if isn.diff(floor) < 0 => floor,
                (isn, _) => isn,
            };
            let mut cfg = self.cfg_for(&remote);
            if let Some(m) = max_segment {
                cfg.mss = cfg.mss.min(m);
            }
            let fast_open = match syn.fast_open {
                _ if !fast_open_room => FastOpen::No,
                None if seg.payload.is_empty() => FastOpen::No,
                _ if cfg.fast_open_no_cookie => FastOpen::Open,
                None => FastOpen::No,
                Some(o) => {
                    let valid = fastopen::cookie(self.fast_open_key, remote.ip(), me.ip());
                    if o.cookie == valid {
                        FastOpen::Open
                    } else {
                        // A request (empty), or a cookie we did not make
                        // (or made under another key): the right one goes
                        // back and the SYN's data is not taken.
                        self.stats.fast_open_cookies_sent += 1;
                        FastOpen::Offer(valid, o.exp)
                    }
                }
            };
            let mut conn = match fast_open {
                FastOpen::Open => TcpConn::accept_fast_open(cfg, me, remote, iss, seg),
                _ => TcpConn::accept(cfg, me, remote, iss, seg),
            };
            if let FastOpen::Offer(cookie, exp) = fast_open {
                conn.offer_fast_open_cookie(cookie, exp);
            }
            conn.set_ts_offset(self.ts_offset(me, remote));
            let open = fast_open == FastOpen::Open;
            if open {
                self.stats.fast_open_accepted += 1;
            }
            // Fast Open: ready for `accept` now, with the SYN's data to read.
            let slot = self.insert_passive(conn, listener, open);
            self.schedule(slot);
            return Ok(());
        }
        // RFC 9293 3.10.7.2: with neither SYN nor ACK (nor RST, handled by
        // the caller) a segment to a listener is dropped unanswered (a FIN,
        // NULL or Xmas scan learns nothing from silence).
        if seg.hdr.ack.is_none() {
            return Err(DropReason::TcpListenNoAck);
        }
        // An ACK for no connection: perhaps the third step of a cookie handshake.
        if let (Some(ack), false) = (seg.hdr.ack, seg.hdr.syn) {
            let peer_isn = seg.hdr.seq - 1;
            if let Some(mss) = self.check_cookie(now, me, remote, peer_isn, ack - 1) {
                self.stats.syn_cookies_accepted += 1;
                // The peer's SYN options, from the TSecr echo of our TSval.
                let (wscale, sack_permitted, ecn, timestamp) = match seg.hdr.timestamp {
                    Some((tsval, tsecr)) if self.cfg.timestamps => {
                        let (wscale, sack, ecn) = cookie_options(tsecr);
                        (wscale, sack, ecn, Some((tsval, 0)))
                    }
                    _ => (None, false, false, None),
                };
                let syn = Segment::from(Header {
                    seq: peer_isn,
                    syn: true,
                    window: seg.hdr.window,
                    mss: Some(mss),
                    wscale,
                    sack_permitted,
                    timestamp,
                    // The SYN's ECN request, granted by the SYN-ACK.
                    ece: ecn,
                    cwr: ecn,
                    ..Header::default()
                });
                let mut conn = TcpConn::accept(self.cfg_for(&remote), me, remote, ack - 1, &syn);
                conn.set_ts_offset(self.ts_offset(me, remote));
                conn.cookie_established();
                let slot = self.insert_passive(conn, listener, false);
                self.deliver(now, slot, seg);
                return Ok(());
            }
            self.stats.syn_cookies_failed += 1;
        }
        self.send_reset(link, now, tx, me, remote, seg);
        Err(DropReason::TcpNoSocket)
    }

    /// RFC 9293 3.10.7.1: the reset for a segment that belongs to nothing,
    /// within the stack's reset rate (`Config::rst_rate`).
    fn send_reset<T: Tx>(
        &mut self,
        link: &mut Link,
        now: Instant,
        tx: &mut T,
        me: SocketAddr,
        remote: SocketAddr,
        seg: &Segment<'_>,
    ) {
        let out = match seg.hdr.ack {
            Some(ack) => Outgoing::from(Header {
                seq: ack,
                rst: true,
                ..Header::default()
            }),
            None => Outgoing::from(Header {
                seq: Seq(0),
                ack: Some(seg.hdr.seq + seg.len()),
                rst: true,
                ..Header::default()
            }),
        };
        if !link.rst_limit.take(now) {
            self.stats.resets_rate_limited += 1;
            return;
        }
        if emit(link, now, tx, me, remote, &out, |_, _, _| Some(0)) > 0 {
            self.stats.resets_sent += 1;
            self.stats.segs_out += 1;
        }
    }

    /// Timers that are due, then every connection with something to send.
    pub(crate) fn poll<T: Tx>(&mut self, link: &mut Link, now: Instant, tx: &mut T) {
        self.expire_time_wait(now);
        while let Some(std::cmp::Reverse((at, slot))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            if let Some(s) = self.slots.get_mut(slot as usize) {
                if s.timer == Some(at) {
                    s.timer = None;
                    self.mark_dirty(slot);
                }
            }
        }
        while let Some(slot) = self.dirty.pop_front() {
            let TcpTable { slots, stats, .. } = self;
            let Some(s) = slots.get_mut(slot as usize) else {
                continue;
            };
            s.dirty = false;
            let Some(conn) = s.conn.as_mut() else {
                continue;
            };
            let before = conn.stats().retransmits;
            let levels = Levels::of(conn);
            conn.set_tso_max(match link.offloads.tso_max {
                0 => link.cfg.gso_max,
                port => port,
            });
            while let Some(out) = conn.poll_transmit(now) {
                let (me, remote) = (conn.local(), conn.remote());
                let c: &TcpConn = conn;
                let frames = emit(link, now, tx, me, remote, &out, |at, buf, summed| {
                    if summed {
                        c.copy_payload_summed(&out, at, buf)
                    } else {
                        c.copy_payload(&out, at, buf);
                        None
                    }
                });
                stats.segs_out += frames as u64;
                if frames > 0 && out.hdr.rst {
                    stats.resets_sent += 1;
                }
                if frames > 1 {
                    stats.gso_segments += 1;
                    conn.count_extra_frames(frames - 1);
                }
            }
            stats.retransmits += conn.stats().retransmits - before;
            let changed = levels.changes(Levels::of(conn), conn.send_low_water());
            self.raise(slot, changed);
            self.schedule(slot);
            self.reap(now, slot);
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;

    /// A TCP header with `options` (padded to 4 with `pad`) and `payload`.
    fn segment_bytes(
        ports: (u16, u16),
        flags: u16,
        options: &[u8],
        pad: u8,
        payload: &[u8],
    ) -> Vec<u8> {
        let opt_len = options.len().div_ceil(4) * 4;
        let mut b = vec![0u8; 20 + opt_len];
        b[0..2].copy_from_slice(&ports.0.to_be_bytes());
        b[2..4].copy_from_slice(&ports.1.to_be_bytes());
        b[4..8].copy_from_slice(&0x8000_1234u32.to_be_bytes());
        b[8..12].copy_from_slice(&0xfedc_ba98u32.to_be_bytes());
        let offset = u16::try_from((20 + opt_len) / 4).unwrap() << 12;
        b[12..14].copy_from_slice(&(offset | (flags & 0x1ff)).to_be_bytes());
        b[14..16].copy_from_slice(&0xabcdu16.to_be_bytes());
        b[20..20 + options.len()].copy_from_slice(options);
        b[20 + options.len()..].fill(pad);
        b.extend_from_slice(payload);
        b
    }

    /// What the general path makes of `bytes`, if it parses.
    fn general(bytes: &[u8]) -> Option<Segment<'_>> {
        let pkt = TcpPacket::new_checked(bytes).ok()?;
        let a = IpAddress::v4(10, 0, 0, 1);
        let repr = TcpRepr::parse(&pkt, &a, &a, &ChecksumCapabilities::ignored()).ok()?;
        Some(segment_from(&repr))
    }

    fn predicted(bytes: &[u8]) -> Option<Segment<'_>> {
        predicted_segment(&TcpPacket::new_checked(bytes).ok()?)
    }

    const TS: [u8; 10] = [8, 10, 0, 0, 0, 7, 0x80, 0, 0, 9];

    #[test]
    fn canonical_segments_are_predicted_as_parsed() {
        let ack = 0x10;
        let nop_nop_ts: Vec<u8> = [1, 1].iter().chain(TS.iter()).copied().collect();
        let ts_eol: Vec<u8> = TS.iter().chain([0].iter()).copied().collect();
        for options in [&[][..], &nop_nop_ts, &ts_eol] {
            for flags in [ack, ack | 0x08, ack | 0x20 | 0x100] {
                for payload in [&[][..], &b"data"[..]] {
                    let b = segment_bytes((80, 4000), flags, options, 0, payload);
                    let fast = predicted(&b).expect("predicted");
                    let slow = general(&b).expect("parses");
                    assert_eq!(fast.hdr, slow.hdr);
                    assert_eq!(fast.payload, slow.payload);
                    assert_eq!(fast.hdr.timestamp.is_some(), !options.is_empty());
                }
            }
        }
        // Not predicted: SYN, FIN, RST, no ACK, SACK, MSS, a zero port.
        for (flags, options, ports) in [
            (0x12, &nop_nop_ts[..], (80, 4000)),
            (0x11, &nop_nop_ts[..], (80, 4000)),
            (0x14, &[][..], (80, 4000)),
            (0x08, &[][..], (80, 4000)),
            (0x10, &[1, 1, 5, 10, 0, 0, 0, 1, 0, 0, 0, 2][..], (80, 4000)),
            (0x10, &[2, 4, 5, 0xb4][..], (80, 4000)),
            (0x10, &[][..], (0, 4000)),
            (0x10, &[][..], (80, 0)),
        ] {
            let b = segment_bytes(ports, flags, options, 0, b"x");
            assert!(predicted(&b).is_none(), "{flags:#x} {options:?} {ports:?}");
        }
    }

    fn options() -> impl Strategy<Value = Vec<u8>> {
        let ts = proptest::collection::vec(any::<u8>(), 8);
        prop_oneof![
            Just(vec![]),
            ts.clone().prop_map(|t| [&[1, 1, 8, 10][..], &t].concat()),
            (ts.clone(), any::<u8>()).prop_map(|(t, x)| [&[8, 10][..], &t, &[0, x]].concat()),
            (ts, any::<[u8; 4]>()).prop_map(|(t, x)| [&x[..], &t].concat()),
            proptest::collection::vec(
                prop_oneof![Just(0u8), Just(1), Just(8), Just(10), Just(5), any::<u8>()],
                0..40
            ),
        ]
    }

    fn repr_strategy() -> impl Strategy<Value = TcpRepr<'static>> {
        let control = prop_oneof![
            Just(TcpControl::None),
            Just(TcpControl::Psh),
            Just(TcpControl::Fin),
            Just(TcpControl::Syn),
            Just(TcpControl::Rst),
        ];
        let sack = proptest::option::weighted(0.2, any::<(u32, u32)>());
        (
            (any::<u16>(), any::<u16>(), control, any::<i32>()),
            (proptest::option::weighted(0.9, any::<i32>()), any::<u16>()),
            (
                proptest::option::weighted(0.1, any::<u8>()),
                proptest::option::weighted(0.1, any::<u16>()),
                proptest::bool::weighted(0.1),
            ),
            [sack.clone(), sack.clone(), sack],
            proptest::option::weighted(0.8, any::<(u32, u32)>()),
        )
            .prop_map(
                |((sp, dp, control, seq), (ack, window), (ws, mss, sp_ok), sack, ts)| TcpRepr {
                    src_port: sp,
                    dst_port: dp,
                    control,
                    seq_number: smoltcp::wire::TcpSeqNumber(seq),
                    ack_number: ack.map(smoltcp::wire::TcpSeqNumber),
                    window_len: window,
                    window_scale: ws,
                    max_seg_size: mss,
                    sack_permitted: sp_ok,
                    // SYN options and SACK blocks never meet (together
                    // they overflow the 60-byte header smoltcp can write).
                    sack_ranges: if ws.is_some() || mss.is_some() || sp_ok {
                        [None; 3]
                    } else {
                        sack
                    },
                    timestamp: ts.map(|(v, e)| TcpTimestampRepr::new(v, e)),
                    payload: &[],
                },
            )
    }

    proptest! {
        /// The short way writes the bytes `TcpRepr::emit` writes (and the
        /// ECN flags), over any old contents of the buffer, and sizes the
        /// header as it does.
        #[test]
        fn written_headers_are_smoltcps(
            repr in repr_strategy(),
            (ece, cwr) in (any::<bool>(), any::<bool>()),
            junk in any::<u8>(),
            payload in proptest::collection::vec(any::<u8>(), 0..32),
        ) {
            prop_assert_eq!(header_len(&repr), repr.header_len());
            let hl = repr.header_len();
            let a = IpAddress::v4(10, 0, 0, 1);
            let mut ours = vec![junk; hl + payload.len()];
            ours[hl..].copy_from_slice(&payload);
            let mut theirs = ours.clone();
            let flags = if ece { ECE } else { 0 } | if cwr { CWR } else { 0 };
            let head = Head { repr, flags, ecn: 0 };
            let sum = write_header(&mut TcpPacket::new_unchecked(&mut ours[..]), &head, &a, &a);
            if let Some(sum) = sum {
                // The sum from values is the sum of the bytes written.
                prop_assert_eq!(
                    crate::wire::checksum::fold(sum),
                    crate::wire::checksum::fold(crate::wire::checksum::sum(0, &ours[..hl]))
                );
            }
            let mut pkt = TcpPacket::new_unchecked(&mut theirs[..]);
            repr.emit(&mut pkt, &a, &a, &ChecksumCapabilities::ignored());
            pkt.set_ece(ece);
            pkt.set_cwr(cwr);
            prop_assert_eq!(ours, theirs);
        }
    }

    proptest! {
        /// The prediction never disagrees with the general parse: when it
        /// takes a segment, the segment is the one `TcpRepr::parse` gives.
        #[test]
        fn prediction_agrees_with_the_general_parse(
            ports in (prop_oneof![Just(0u16), any::<u16>()], prop_oneof![Just(0u16), any::<u16>()]),
            flags in prop_oneof![Just(0x10u16), Just(0x18), any::<u16>()],
            opts in options(),
            pad in prop_oneof![Just(0u8), Just(1), any::<u8>()],
            payload in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let b = segment_bytes(ports, flags, &opts, pad, &payload);
            if let Some(fast) = predicted(&b) {
                let slow = general(&b).expect("a predicted segment parses");
                prop_assert_eq!(fast.hdr, slow.hdr);
                prop_assert_eq!(fast.payload, slow.payload);
            }
        }
    }
}
