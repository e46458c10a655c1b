//! TCP segments with fuzzed header fields and raw option bytes, correct
//! checksums, to a stack listening on 5001 (backlog 4, so SYN cookies too).
//! A segment may take its acknowledgment number from the stack's latest
//! SYN-ACK, so inputs complete handshakes and reach established state.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smoltcp::wire::{EthernetFrame, IpProtocol, Ipv4Packet, TcpPacket};
use ustack::{Instant, VecTx};
use ustack_fuzz::{
    PEER, Reader, TCP_PORT, TcpFields, US, finish, ip_frame, receive_counted, stack, tcp_segment,
};

/// The sequence number after the last SYN-ACK the stack sent to `port`.
fn synack_next(tx: &VecTx, port: u16) -> Option<u32> {
    tx.frames.iter().rev().find_map(|f| {
        let e = EthernetFrame::new_checked(&f[..]).ok()?;
        let ip = Ipv4Packet::new_checked(e.payload()).ok()?;
        if ip.next_header() != IpProtocol::Tcp {
            return None;
        }
        let t = TcpPacket::new_checked(ip.payload()).ok()?;
        (t.syn() && t.ack() && t.dst_port() == port)
            .then(|| (t.seq_number().0 as u32).wrapping_add(1))
    })
}

fuzz_target!(|data: &[u8]| {
    let mut r = Reader::new(data);
    let mut s = stack();
    let mut tx = VecTx::new();
    let mut ms = 0;
    let mut peer_seq = 1000u32;
    while !r.is_empty() {
        let ctl = r.u8();
        let src_port = 40000 + u16::from(ctl & 3);
        let mut f = TcpFields {
            src_port,
            dst_port: if ctl & 4 != 0 { r.u16() } else { TCP_PORT },
            seq: if ctl & 8 != 0 { r.u32() } else { peer_seq },
            ack: r.u32(),
            flags: r.u16() & 0x1ff,
            window: r.u16(),
            urgent: 0,
            options: r.chunk(40),
        };
        if ctl & 0x10 != 0 {
            f.ack = synack_next(&tx, src_port).unwrap_or(f.ack);
            f.flags |= 0x10;
        }
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
        let frame = ip_frame(IpProtocol::Tcp, &seg);
        ms += u64::from(ctl >> 5) * 50;
        let now = Instant::from_millis(ms);
        receive_counted(&mut s, now, &frame, &mut tx);
        s.poll(now, &mut tx);
    }
    finish(&mut s, tx);
});
