//! IPv6 packets to the stack (fd00::1 and its link-local address): the
//! header's fields from the input, the body behind it as ICMPv6 with its
//! checksum repaired unless the input says not (so echo and neighbor
//! discovery with every option layout are reached), or any other next
//! header. What the stack answers must be well formed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smoltcp::wire::{
    ETHERNET_HEADER_LEN, EthernetFrame, EthernetProtocol, EthernetRepr, IPV6_HEADER_LEN,
    Icmpv6Packet, IpProtocol, Ipv6Packet,
};
use ustack::iface::ipv6::{ALL_NODES, link_local, multicast_mac, solicited_node};
use ustack::{Instant, VecTx};
use ustack_fuzz::{Reader, finish, peer_mac, receive_counted, stack, us_mac, v6};

fuzz_target!(|data: &[u8]| {
    let mut r = Reader::new(data);
    let mut s = stack();
    let mut tx = VecTx::new();
    let mut ms = 0;
    while !r.is_empty() {
        let ctl = r.u8();
        let hop_limit = r.u8();
        let body = r.chunk(300).to_vec();
        let dst = match ctl >> 5 {
            0 => v6(1),
            1 => link_local(us_mac()),
            2 => solicited_node(v6(1)),
            3 => ALL_NODES,
            _ => v6(9),
        };
        let src = match (ctl >> 3) & 3 {
            0 => v6(2),
            1 => link_local(peer_mac()),
            2 => std::net::Ipv6Addr::UNSPECIFIED,
            _ => v6(1),
        };
        let next = if ctl & 4 == 0 {
            IpProtocol::Icmpv6
        } else {
            IpProtocol::from(r.u8())
        };
        let eth_dst = if dst.is_multicast() {
            multicast_mac(dst)
        } else {
            us_mac()
        };
        let mut frame = vec![0u8; ETHERNET_HEADER_LEN + IPV6_HEADER_LEN + body.len()];
        EthernetRepr {
            src_addr: peer_mac(),
            dst_addr: eth_dst,
            ethertype: EthernetProtocol::Ipv6,
        }
        .emit(&mut EthernetFrame::new_unchecked(&mut frame[..]));
        {
            let mut ip = Ipv6Packet::new_unchecked(&mut frame[ETHERNET_HEADER_LEN..]);
            ip.set_version(6);
            ip.set_payload_len(body.len() as u16);
            ip.set_next_header(next);
            ip.set_hop_limit(hop_limit);
            ip.set_src_addr(src);
            ip.set_dst_addr(dst);
            ip.payload_mut().copy_from_slice(&body);
            if next == IpProtocol::Icmpv6 && ctl & 1 == 0 && body.len() >= 4 {
                let mut icmp = Icmpv6Packet::new_unchecked(ip.payload_mut());
                icmp.fill_checksum(&src, &dst);
            }
        }
        if ctl & 2 == 2 {
            // A length that lies about the payload.
            let extra = usize::from(r.u8());
            frame.truncate(frame.len().saturating_sub(extra));
        }
        ms += 1;
        receive_counted(&mut s, Instant::from_millis(ms), &frame, &mut tx);
    }
    finish(&mut s, tx);
});
