//! Parse -> emit -> parse gives the same representation: ustack's RoCEv2
//! `UdSendRepr` (BTH, DETH, immediate data, payload; pad and ICRC are
//! recomputed), and smoltcp's TCP and IPv4 reprs as ustack uses them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{IpAddress, Ipv4Packet, Ipv4Repr, TcpPacket, TcpRepr};
use ustack::wire::roce::UdSendRepr;
use ustack_fuzz::{PEER, US};

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    match which % 3 {
        0 => {
            let Ok(repr) = UdSendRepr::parse(body) else {
                return;
            };
            let mut out = vec![0u8; repr.buffer_len()];
            repr.emit(&mut out);
            let again = UdSendRepr::parse(&out).expect("emitted UD SEND parses");
            assert_eq!(repr, again);
            // The emitted form is canonical: a second round gives the same bytes.
            let mut out2 = vec![0u8; again.buffer_len()];
            again.emit(&mut out2);
            assert_eq!(out, out2);
        }
        1 => {
            let (src, dst) = (IpAddress::Ipv4(PEER), IpAddress::Ipv4(US));
            let caps = ChecksumCapabilities::ignored();
            let Ok(p) = TcpPacket::new_checked(body) else {
                return;
            };
            let Ok(mut repr) = TcpRepr::parse(&p, &src, &dst, &caps) else {
                return;
            };
            // SACK blocks only mean something on an ACK (RFC 2018), and
            // smoltcp emits either SACK-permitted (SYN) or blocks, not both:
            // compare what a segment ustack emits can carry.
            if repr.ack_number.is_none() || repr.sack_permitted {
                repr.sack_ranges = [None; 3];
            }
            let mut out = vec![0u8; repr.buffer_len()];
            repr.emit(
                &mut TcpPacket::new_unchecked(&mut out[..]),
                &src,
                &dst,
                &ChecksumCapabilities::default(),
            );
            let p2 = TcpPacket::new_checked(&out[..]).expect("emitted TCP is long enough");
            assert!(p2.verify_checksum(&src, &dst));
            let again = TcpRepr::parse(&p2, &src, &dst, &ChecksumCapabilities::default())
                .expect("emitted TCP parses");
            assert_eq!(repr, again);
        }
        _ => {
            let caps = ChecksumCapabilities::ignored();
            let Ok(p) = Ipv4Packet::new_checked(body) else {
                return;
            };
            let Ok(repr) = Ipv4Repr::parse(&p, &caps) else {
                return;
            };
            let mut out = vec![0u8; repr.buffer_len() + repr.payload_len];
            repr.emit(
                &mut Ipv4Packet::new_unchecked(&mut out[..]),
                &ChecksumCapabilities::default(),
            );
            let p2 = Ipv4Packet::new_checked(&out[..]).expect("emitted IPv4 is long enough");
            let again = Ipv4Repr::parse(&p2, &ChecksumCapabilities::default())
                .expect("emitted IPv4 parses");
            assert_eq!(repr, again);
        }
    }
});
