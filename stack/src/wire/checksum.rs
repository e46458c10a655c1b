//! The Internet checksum (RFC 1071) over whole segments, 32 bytes a step.
//!
//! `smoltcp::wire` sums 16-bit words one by one; a TCP segment of 1460
//! bytes is the hottest loop of a bulk transfer (a fifth of the time on the
//! sim link). The one's-complement sum is associative over any word size
//! and byte-order independent (RFC 1071 section 2), so this adds native
//! 32-bit words into eight 64-bit accumulators, folds, and swaps once. The
//! results are identical to smoltcp's (property-tested below).

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One's-complement sum of `data` (odd length padded with a zero byte),
/// not yet folded: add more with [`sum`], finish with [`fold`].
pub fn sum(acc: u64, data: &[u8]) -> u64 {
    let (even, last) = match data.split_last() {
        Some((&b, rest)) if data.len() % 2 == 1 => (rest, Some(b)),
        _ => (data, None),
    };
    // Native-order 32-bit words into wide accumulators, eight lanes of 32
    // bytes a step (the compiler vectorizes this: two SSE2 vectors of
    // 64-bit lanes; one accumulator would serialize on its adds); the sum
    // is byte-order independent up to a final swap (RFC 1071 section 2.B).
    let mut lanes = [0u64; 8];
    let mut blocks = even.chunks_exact(32);
    for b in &mut blocks {
        for (lane, w) in lanes.iter_mut().zip(b.chunks_exact(4)) {
            *lane += u64::from(u32::from_ne_bytes([w[0], w[1], w[2], w[3]]));
        }
    }
    let mut native: u64 = lanes.iter().sum();
    let mut words = blocks.remainder().chunks_exact(4);
    for w in &mut words {
        native += u64::from(u32::from_ne_bytes([w[0], w[1], w[2], w[3]]));
    }
    if let [a, b] = words.remainder() {
        native += u64::from(u16::from_ne_bytes([*a, *b]));
    }
    let mut acc = acc + u64::from(u16::from_be(fold(native)));
    if let Some(b) = last {
        acc += u64::from(b) << 8;
    }
    acc
}

/// Fold a [`sum`] to 16 bits (not complemented).
#[inline]
pub fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The sum of a 32-bit field's two 16-bit words (a [`sum`] accumulator):
/// how a header's checksum is taken from its values instead of its bytes.
#[inline]
pub fn words(v: u32) -> u64 {
    u64::from(v >> 16) + u64::from(v & 0xffff)
}

/// The sum of the IPv4 pseudo-header for `protocol` and `len` bytes.
#[inline]
pub fn pseudo_header(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, len: usize) -> u64 {
    words(u32::from(src)) + words(u32::from(dst)) + u64::from(protocol) + (len as u64 & 0xffff_ffff)
}

/// Whether a transport segment (checksum field included) verifies.
#[inline]
pub fn verifies(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, segment: &[u8]) -> bool {
    fold(sum(
        pseudo_header(src, dst, protocol, segment.len()),
        segment,
    )) == 0xffff
}

/// The checksum to store in a segment whose checksum field is zero.
#[inline]
pub fn compute(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, segment: &[u8]) -> u16 {
    !fold(sum(
        pseudo_header(src, dst, protocol, segment.len()),
        segment,
    ))
}

/// The sum of the pseudo-header of either family: IPv4's, or IPv6's
/// (RFC 8200 §8.1: both addresses, the upper-layer length as 32 bits, the
/// next header). Mixed families (never built here) sum as IPv6 with the
/// IPv4 one mapped.
#[inline(always)]
pub fn pseudo_header_ip(src: IpAddr, dst: IpAddr, protocol: u8, len: usize) -> u64 {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => pseudo_header(s, d, protocol, len),
        (s, d) => {
            let v6 = |a: IpAddr| match a {
                IpAddr::V4(a) => a.to_ipv6_mapped(),
                IpAddr::V6(a) => a,
            };
            // Four 32-bit words (2^16 = 1 in one's complement: the same
            // as eight 16-bit ones once folded).
            let addr_sum = |a: Ipv6Addr| {
                let b = a.to_bits();
                u64::from((b >> 96) as u32)
                    + u64::from((b >> 64) as u32)
                    + u64::from((b >> 32) as u32)
                    + u64::from(b as u32)
            };
            addr_sum(v6(s)) + addr_sum(v6(d)) + words(len as u32) + u64::from(protocol)
        }
    }
}

/// [`verifies`] for either family.
#[inline(always)]
pub fn verifies_ip(src: IpAddr, dst: IpAddr, protocol: u8, segment: &[u8]) -> bool {
    fold(sum(
        pseudo_header_ip(src, dst, protocol, segment.len()),
        segment,
    )) == 0xffff
}

/// [`compute`] for either family.
#[inline(always)]
pub fn compute_ip(src: IpAddr, dst: IpAddr, protocol: u8, segment: &[u8]) -> u16 {
    !fold(sum(
        pseudo_header_ip(src, dst, protocol, segment.len()),
        segment,
    ))
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;
    use smoltcp::wire::{IpAddress, TcpPacket};

    proptest! {
        #[test]
        fn agrees_with_smoltcp(mut seg in proptest::collection::vec(any::<u8>(), 20..3000),
                               src in any::<u32>(), dst in any::<u32>()) {
            let (s, d) = (Ipv4Addr::from(src), Ipv4Addr::from(dst));
            let (a, b) = (IpAddress::Ipv4(s), IpAddress::Ipv4(d));
            TcpPacket::new_unchecked(&mut seg[..]).fill_checksum(&a, &b);
            let theirs = TcpPacket::new_unchecked(&seg[..]).checksum();
            prop_assert!(verifies(s, d, 6, &seg));
            seg[16] = 0;
            seg[17] = 0;
            prop_assert_eq!(compute(s, d, 6, &seg), theirs);
        }

        #[test]
        fn agrees_with_smoltcp_over_ipv6(mut seg in proptest::collection::vec(any::<u8>(), 20..3000),
                                         src in any::<u128>(), dst in any::<u128>()) {
            let (s, d) = (Ipv6Addr::from(src), Ipv6Addr::from(dst));
            let (a, b) = (IpAddress::Ipv6(s), IpAddress::Ipv6(d));
            TcpPacket::new_unchecked(&mut seg[..]).fill_checksum(&a, &b);
            let theirs = TcpPacket::new_unchecked(&seg[..]).checksum();
            prop_assert!(verifies_ip(s.into(), d.into(), 6, &seg));
            seg[16] = 0;
            seg[17] = 0;
            prop_assert_eq!(compute_ip(s.into(), d.into(), 6, &seg), theirs);
        }
    }

    #[test]
    fn a_computed_checksum_verifies_and_a_flipped_bit_does_not() {
        let (s, d) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let mut seg: Vec<u8> = (0..1461u32).map(|i| (i * 7) as u8).collect();
        seg[16] = 0;
        seg[17] = 0;
        let c = compute(s, d, 6, &seg);
        seg[16..18].copy_from_slice(&c.to_be_bytes());
        assert!(verifies(s, d, 6, &seg));
        seg[700] ^= 4;
        assert!(!verifies(s, d, 6, &seg));
    }
}
