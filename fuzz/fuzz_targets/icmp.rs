//! ICMP messages behind a valid IPv4 header (checksum repaired unless the
//! input says not): echo requests and replies (a ping socket is open and
//! has sent one), destination unreachable quoting anything.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{Icmpv4Packet, Icmpv4Repr, IpProtocol};
use ustack::{Instant, VecTx};
use ustack_fuzz::{Reader, finish, fix_checksums, ip_frame, receive_counted, stack};

fuzz_target!(|data: &[u8]| {
    let mut r = Reader::new(data);
    let mut s = stack();
    let mut tx = VecTx::new();
    s.poll(Instant::ZERO, &mut tx);
    let mut ms = 0;
    while !r.is_empty() {
        let ctl = r.u8();
        let body = r.chunk(200);
        if let Ok(p) = Icmpv4Packet::new_checked(body)
            && let Ok(repr) = Icmpv4Repr::parse(&p, &ChecksumCapabilities::ignored())
        {
            let mut out = vec![0u8; repr.buffer_len()];
            repr.emit(
                &mut Icmpv4Packet::new_unchecked(&mut out[..]),
                &ChecksumCapabilities::default(),
            );
            let again = Icmpv4Repr::parse(
                &Icmpv4Packet::new_unchecked(&out[..]),
                &ChecksumCapabilities::default(),
            );
            assert!(again.is_ok(), "emitted ICMP parses");
        }
        let mut frame = ip_frame(IpProtocol::Icmp, body);
        if ctl & 1 == 0 {
            fix_checksums(&mut frame);
        }
        ms += u64::from(ctl >> 1);
        receive_counted(&mut s, Instant::from_millis(ms), &frame, &mut tx);
    }
    finish(&mut s, tx);
});
