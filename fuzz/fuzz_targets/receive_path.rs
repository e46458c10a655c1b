//! The receive path with live connections: a stack holding two established
//! TCP connections (one accepted, one opened; data in flight both ways) with
//! its real peer on an in-memory wire in virtual time, fed arbitrary frames:
//! raw bytes, mutated copies of the peer's real frames (checksums repaired
//! or not), and hand-made segments on the live 4-tuples with any sequence
//! and acknowledgment numbers, flags, windows and options (RST and SYN
//! injection, zero and huge windows, option garbage). Asserts: no panic,
//! every frame counted once, everything sent well-formed, and reassembly
//! memory given back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smoltcp::wire::IpProtocol;
use ustack_fuzz::{
    PEER, Pair, Reader, TcpFields, US, fix_checksums, ip_frame, receive_counted, tcp_segment,
};

fuzz_target!(|data: &[u8]| {
    let mut p = Pair::established();
    let mut r = Reader::new(data);
    let mut ops = 0;
    while !r.is_empty() && ops < 64 {
        ops += 1;
        let op = r.u8();
        let now = p.now;
        match op % 6 {
            0 => {
                let frame = r.chunk(255).to_vec();
                receive_counted(&mut p.a, now, &frame, &mut p.a_out);
            }
            1 if !p.templates.is_empty() => {
                let k = usize::from(r.u8()) % p.templates.len();
                let mut frame = p.templates[k].clone();
                for _ in 0..(r.u8() % 4) {
                    let at = usize::from(r.u16()) % frame.len().max(1);
                    let v = r.u8();
                    if let Some(b) = frame.get_mut(at) {
                        *b ^= v;
                    }
                }
                if op & 0x40 != 0 {
                    frame.truncate(usize::from(r.u16()) % (frame.len() + 1));
                }
                if op & 0x80 == 0 {
                    fix_checksums(&mut frame);
                }
                receive_counted(&mut p.a, now, &frame, &mut p.a_out);
            }
            2 if !p.conns.is_empty() => {
                // A segment on a live 4-tuple: sequence numbers near the
                // connection's (from the peer's own last frames) or anywhere.
                let (_, local_port, remote) = p.conns[usize::from(op >> 3) % p.conns.len()];
                let (base_seq, base_ack) = p.peer_seq.get(&local_port).copied().unwrap_or((0, 0));
                let f = TcpFields {
                    src_port: remote.port(),
                    dst_port: local_port,
                    seq: base_seq.wrapping_add(i32::from(r.u16() as i16) as u32),
                    ack: base_ack.wrapping_add(i32::from(r.u16() as i16) as u32),
                    flags: r.u16() & 0x1ff,
                    window: if op & 0x80 != 0 {
                        [0, 1, u16::MAX][usize::from(r.u8()) % 3]
                    } else {
                        r.u16()
                    },
                    urgent: 0,
                    options: r.chunk(40),
                };
                let payload = r.chunk(255);
                let seg = tcp_segment(PEER, US, &f, payload);
                receive_counted(
                    &mut p.a,
                    now,
                    &ip_frame(IpProtocol::Tcp, &seg),
                    &mut p.a_out,
                );
            }
            3 => p.step(u64::from(r.u8()) * 10),
            4 if !p.conns.is_empty() => {
                let (h, _, _) = p.conns[usize::from(op >> 3) % p.conns.len()];
                match r.u8() % 4 {
                    0 => drop(p.a.tcp().send(h, &[0x63; 1000])),
                    1 => drop(p.a.tcp().shutdown(h)),
                    2 => drop(p.a.tcp().close(p.now, h)),
                    _ => drop(p.a.tcp().abort(h)),
                }
            }
            _ => {
                // Let the real peer talk for a while.
                for _ in 0..4 {
                    p.step(1);
                }
            }
        }
    }
    // Minutes later: every timer has fired, nothing panicked, and the
    // totals still add up.
    for _ in 0..8 {
        p.step(30_000);
    }
    let st = p.a.stats();
    assert_eq!(st.eth.rx_frames, st.eth.rx_accepted + st.drops.total());
    assert_eq!(st.ipv4.reassembly_bytes, 0);
});
