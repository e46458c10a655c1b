//! ARP payloads behind a valid Ethernet header (to us or broadcast), with
//! time passing between them: learning, conflicts, replies, the cache and
//! its pending queue (a UDP send is queued for an address being resolved).
#![no_main]

use std::net::{Ipv4Addr, SocketAddrV4};

use libfuzzer_sys::fuzz_target;
use smoltcp::wire::{ArpPacket, ArpRepr, EthernetAddress, EthernetProtocol};
use ustack::{Instant, VecTx};
use ustack_fuzz::{Reader, eth, finish, receive_counted, stack, us_mac};

fuzz_target!(|data: &[u8]| {
    let mut r = Reader::new(data);
    let mut s = stack();
    let mut tx = VecTx::new();
    // Something waits for resolution of 10.0.0.3 and 10.0.0.4.
    if let Ok(h) = s.udp().bind(0) {
        for n in [3, 4] {
            let _ = s
                .udp()
                .send_to(h, SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, n), 9), b"hi");
        }
    }
    let mut now = Instant::ZERO;
    s.poll(now, &mut tx);
    while !r.is_empty() {
        let ctl = r.u8();
        let payload = r.chunk(64);
        if let Ok(p) = ArpPacket::new_checked(payload)
            && let Ok(repr) = ArpRepr::parse(&p)
        {
            // Round trip: what parses emits the same bytes it parsed from.
            let mut out = vec![0u8; repr.buffer_len()];
            repr.emit(&mut ArpPacket::new_unchecked(&mut out[..]));
            let again =
                ArpRepr::parse(&ArpPacket::new_unchecked(&out[..])).expect("emitted ARP parses");
            assert_eq!(repr, again);
        }
        let dst = if ctl & 1 == 0 {
            us_mac()
        } else {
            EthernetAddress::BROADCAST
        };
        let frame = eth(dst, EthernetProtocol::Arp, payload);
        now += std::time::Duration::from_millis(u64::from(ctl >> 1) * 100);
        receive_counted(&mut s, now, &frame, &mut tx);
        if ctl & 0x80 != 0 {
            s.poll(now, &mut tx);
        }
    }
    finish(&mut s, tx);
});
