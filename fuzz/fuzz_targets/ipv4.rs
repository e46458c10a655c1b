//! IPv4 packets with fuzzed headers, options and fragment fields, valid
//! header checksums, into a stack: header validation and reassembly
//! (overlaps, duplicates, holes, far offsets, the memory cap, timeouts).
#![no_main]

use libfuzzer_sys::fuzz_target;
use smoltcp::wire::{EthernetAddress, EthernetProtocol, IpProtocol, Ipv4Packet};
use ustack::{Instant, VecTx};
use ustack_fuzz::{
    IpFields, PEER, Reader, US, eth, finish, fix_checksums, ipv4, receive_counted, stack, us_mac,
};

fuzz_target!(|data: &[u8]| {
    let mut r = Reader::new(data);
    let mut s = stack();
    let mut tx = VecTx::new();
    let mut ms = 0u64;
    while !r.is_empty() {
        let ctl = r.u8();
        let frame = if ctl & 1 == 0 {
            // Structured: few idents so fragments of one datagram meet.
            let flags = r.u8();
            let f = IpFields {
                src: if flags & 0x10 != 0 { US } else { PEER },
                dst: if flags & 0x20 != 0 {
                    std::net::Ipv4Addr::BROADCAST
                } else {
                    US
                },
                protocol: IpProtocol::from([1u8, 6, 17, 99][usize::from(flags >> 6)]),
                ident: u16::from(flags & 3),
                dont_frag: flags & 4 != 0,
                more_frags: flags & 8 != 0,
                frag_offset: r.u16(),
                ttl: r.u8(),
                tos: flags.rotate_left(3),
                options: r.chunk(40),
            };
            let payload = r.chunk(255);
            let mut p = ipv4(&f, payload);
            if ctl & 2 != 0 {
                // Lie about the total length (checksum still right).
                let tl = r.u16();
                let mut ip = Ipv4Packet::new_unchecked(&mut p[..]);
                ip.set_total_len(tl);
                ip.fill_checksum();
            }
            eth(us_mac(), EthernetProtocol::Ipv4, &p)
        } else {
            let mut f = eth(
                if ctl & 2 != 0 {
                    EthernetAddress::BROADCAST
                } else {
                    us_mac()
                },
                EthernetProtocol::Ipv4,
                r.chunk(255),
            );
            fix_checksums(&mut f);
            f
        };
        ms += u64::from(ctl >> 2) * 250;
        receive_counted(&mut s, Instant::from_millis(ms), &frame, &mut tx);
        if ctl & 0x80 != 0 {
            s.poll(Instant::from_millis(ms), &mut tx);
        }
    }
    finish(&mut s, tx);
});
