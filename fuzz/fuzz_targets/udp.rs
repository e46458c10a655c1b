//! UDP datagrams behind a valid IPv4 header, checksum repaired unless the
//! input says not: sockets, queue limits, port unreachable and its rate
//! limit, zero ports and lengths that disagree with IPv4's.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smoltcp::wire::IpProtocol;
use ustack::{Instant, VecTx};
use ustack_fuzz::{Reader, finish, fix_checksums, ip_frame, receive_counted, stack};

fuzz_target!(|data: &[u8]| {
    let mut r = Reader::new(data);
    let mut s = stack();
    let mut tx = VecTx::new();
    let mut ms = 0;
    while !r.is_empty() {
        let ctl = r.u8();
        let mut body = r.chunk(255).to_vec();
        if ctl & 2 != 0 && body.len() >= 4 {
            // Aim at a bound port (7), an unbound one, or RoCE (4791).
            let port: u16 = [7, 9, 4791][usize::from(ctl >> 6) % 3];
            body[2..4].copy_from_slice(&port.to_be_bytes());
        }
        let mut frame = ip_frame(IpProtocol::Udp, &body);
        if ctl & 1 == 0 {
            fix_checksums(&mut frame);
        }
        ms += u64::from((ctl >> 2) & 0xf);
        receive_counted(&mut s, Instant::from_millis(ms), &frame, &mut tx);
    }
    finish(&mut s, tx);
});
