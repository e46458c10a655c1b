//! TCP segments with fuzzed header fields and raw option bytes, correct
//! checksums, to a stack listening on 5001 (backlog 4, so SYN cookies too).
//! A segment may take its acknowledgment number from the stack's latest
//! SYN-ACK, so inputs complete handshakes and reach established state.
//! The stack also opens a Fast Open client connection to the peer's port
//! 80 (its SYN asks for a cookie): a segment may go to it, so fuzzed
//! SYN-ACKs bring it cookies (RFC 7413's option, any length or form).
//! ECN is on both ways (RFC 3168): the flags take any ECE and CWR, and
//! each packet any ECN codepoint (CE marks included).
#![no_main]

use libfuzzer_sys::fuzz_target;
use smoltcp::wire::{EthernetFrame, IpProtocol, Ipv4Packet, TcpPacket};
use ustack::{Instant, VecTx};
use ustack_fuzz::{
    PEER, Reader, TCP_PORT, TcpFields, US, finish, ip_frame_tos, receive_counted, stack,
    tcp_segment,
};

/// The sequence number after the last SYN-ACK the stack sent to `port`,
/// or with `client`, after the last SYN it sent from `port`.
fn synack_next(tx: &VecTx, port: u16, client: bool) -> Option<u32> {
    tx.frames.iter().rev().find_map(|f| {
        let e = EthernetFrame::new_checked(&f[..]).ok()?;
        let ip = Ipv4Packet::new_checked(e.payload()).ok()?;
        if ip.next_header() != IpProtocol::Tcp {
            return None;
        }
        let t = TcpPacket::new_checked(ip.payload()).ok()?;
        let ours = if client {
            !t.ack() && t.src_port() == port
        } else {
            t.ack() && t.dst_port() == port
        };
        (t.syn() && ours).then(|| (t.seq_number().0 as u32).wrapping_add(1))
    })
}

fuzz_target!(|data: &[u8]| {
    let mut r = Reader::new(data);
    let mut s = stack();
    let mut tx = VecTx::new();
    let mut ms = 0;
    let mut peer_seq = 1000u32;
    let client = s
        .tcp()
        .connect(Instant::ZERO, std::net::SocketAddrV4::new(PEER, 80))
        .ok();
    let client_port = client.and_then(|h| {
        let _ = s.tcp().fast_open_connect(h);
        Some(s.tcp_ref().info(h)?.local.port())
    });
    s.poll(Instant::ZERO, &mut tx);
    while !r.is_empty() {
        let ctl = r.u8();
        let mut src_port = 40000 + u16::from(ctl & 3);
        let mut dst_port = TCP_PORT;
        if ctl & 4 != 0 {
            let pick = r.u16();
            match client_port {
                // To the Fast Open client, from the server it dialled.
                Some(p) if pick & 1 == 1 => (src_port, dst_port) = (80, p),
                _ => dst_port = pick,
            }
        }
        let mut f = TcpFields {
            src_port,
            dst_port,
            seq: if ctl & 8 != 0 { r.u32() } else { peer_seq },
            ack: r.u32(),
            flags: r.u16() & 0x1ff,
            window: r.u16(),
            urgent: 0,
            options: r.chunk(40),
        };
        if ctl & 0x10 != 0 {
            let to_client = Some(f.dst_port) == client_port && f.src_port == 80;
            let port = if to_client { f.dst_port } else { src_port };
            f.ack = synack_next(&tx, port, to_client).unwrap_or(f.ack);
            f.flags |= 0x10;
        }
        let ecn = r.u8() & 3;
        let payload = r.chunk(200);
        let seg = tcp_segment(PEER, US, &f, payload);
        if let Ok(p) = TcpPacket::new_checked(&seg[..]) {
            // smoltcp's parser accepts what we built, or refuses it cleanly.
            let _ = smoltcp::wire::TcpRepr::parse(
                &p,
                &PEER.into(),
                &US.into(),
                &smoltcp::phy::ChecksumCapabilities::default(),
            );
        }
        peer_seq = f
            .seq
            .wrapping_add(payload.len() as u32)
            .wrapping_add(u32::from(f.flags & 3 != 0));
        let frame = ip_frame_tos(IpProtocol::Tcp, ecn, &seg);
        ms += u64::from(ctl >> 5) * 50;
        let now = Instant::from_millis(ms);
        receive_counted(&mut s, now, &frame, &mut tx);
        s.poll(now, &mut tx);
    }
    finish(&mut s, tx);
});
