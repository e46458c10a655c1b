//! RoCEv2: the BTH/DETH views, `UdSendRepr` and the RC extended headers
//! (`RcHeaders`: parse, emit, parse equal) on any bytes, the ICRC on
//! any packet, and UDP 4791 datagrams (ICRC repaired unless the input says
//! not) into a stack's UD path with the responder QP and receive buffers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smoltcp::wire::{EthernetProtocol, IpProtocol, UdpPacket};
use ustack::socket::ud::UdTransport;
use ustack::wire::rc::{RcHeaders, RcOpcode};
use ustack::wire::roce::{BthPacket, DethPacket, ROCE_PORT, UdSendRepr, icrc, icrc_verify};
use ustack::{Instant, VecTx};
use ustack_fuzz::{
    IpFields, Reader, eth, finish, fix_checksums, ipv4, receive_counted, stack_and_qp, us_mac,
};

fuzz_target!(|data: &[u8]| {
    let mut r = Reader::new(data);
    let (mut s, qp) = stack_and_qp();
    let mut tx = VecTx::new();
    let mut ms = 0;
    let mut completions = Vec::new();
    while !r.is_empty() {
        let ctl = r.u8();
        let body = r.chunk(255);
        // Views: after check_len no accessor panics.
        if let Ok(b) = BthPacket::new_checked(body) {
            let _ = (
                b.opcode(),
                b.solicited(),
                b.pad_count(),
                b.pkey(),
                b.dest_qp(),
                b.psn(),
                b.payload().len(),
            );
            if let Ok(d) = DethPacket::new_checked(b.payload()) {
                let _ = (d.qkey(), d.src_qp());
            }
            if let Some(op) = RcOpcode::from_u8(u8::from(b.opcode()))
                && let Ok(h) = RcHeaders::parse(op, b.payload())
            {
                let mut out = vec![0u8; h.buffer_len()];
                h.emit(&mut out);
                assert_eq!(RcHeaders::parse(op, &out), Ok(h));
            }
        }
        let _ = UdSendRepr::parse(body);
        let _ = icrc(body);
        let _ = icrc_verify(body);
        // UDP 4791 around it, optionally with a valid ICRC.
        let mut udp = vec![0u8; 8 + body.len()];
        let mut u = UdpPacket::new_unchecked(&mut udp[..]);
        u.set_src_port(0xc000 | u16::from(ctl));
        u.set_dst_port(ROCE_PORT);
        u.set_len(if ctl & 2 != 0 {
            r.u16()
        } else {
            (8 + body.len()) as u16
        });
        u.set_checksum(0);
        udp[8..].copy_from_slice(body);
        let f = IpFields {
            protocol: IpProtocol::Udp,
            dont_frag: ctl & 4 == 0,
            ..IpFields::default()
        };
        let mut frame = eth(us_mac(), EthernetProtocol::Ipv4, &ipv4(&f, &udp));
        if ctl & 1 == 0 {
            fix_checksums(&mut frame);
        }
        ms += u64::from(ctl >> 3);
        let now = Instant::from_millis(ms);
        receive_counted(&mut s, now, &frame, &mut tx);
        if let (true, Some(qp)) = (ctl & 0x80 != 0, qp) {
            // Take completions; repost their buffers.
            completions.clear();
            let _ = s.ud().poll_cq(qp, now, 8, &mut completions);
            for c in &completions {
                let _ = s.ud().post_recv(qp, c.wr_id, vec![0; 128]);
            }
        }
    }
    finish(&mut s, tx);
});
