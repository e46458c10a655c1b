//! Router discovery as a host does it (RFC 4861 §6.3.4) and stateless
//! address autoconfiguration (RFC 4862 §5.5.3): what one router
//! advertisement teaches [`Ipv6Iface`]: a default router and its
//! lifetime, the link MTU, on-link prefixes, and addresses made from
//! advertised /64 prefixes and our interface identifier. Everything
//! learnt is capped ([`MAX_ROUTERS`], [`MAX_PREFIXES`]) and expires. A
//! leaf: `ipv6.rs` validates the message, learns the router's link-layer
//! address and sends the solicitations.

use core::net::Ipv6Addr;
use std::time::Duration;

use smoltcp::wire::{Ipv6Cidr, NdiscOption, NdiscOptionRepr, NdiscPrefixInfoFlags};

use crate::iface::ipv6_iface::{Ipv6Iface, Learnt, MAX_PREFIXES, MAX_ROUTERS, MIN_MTU};
use crate::stats::DropReason;
use crate::time::Instant;

/// RFC 4862 §5.5.3 e: an advertisement lowers an address's remaining
/// valid lifetime no further than two hours (a forged one cannot take
/// the address away at once).
const TWO_HOURS: Duration = Duration::from_secs(2 * 3600);

/// A router advertisement's facts, validated by the caller.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Advert<'a> {
    /// The router (a link-local address).
    pub(crate) src: Ipv6Addr,
    /// How long it is a default router (0: it is not).
    pub(crate) lifetime: Duration,
    /// The link MTU it gives.
    pub(crate) mtu: Option<u32>,
    /// Its options (after the fixed part of the message).
    pub(crate) options: &'a [u8],
}

/// Learn what `ad` advertises at `now` (with the port's MTU
/// `port_mtu`); returns how many entries were ignored because a table
/// was full.
pub(crate) fn learn(
    ip6: &mut Ipv6Iface,
    now: Instant,
    port_mtu: usize,
    ad: &Advert<'_>,
) -> Result<u64, DropReason> {
    // Walk the options first: a malformed one drops the whole message
    // (RFC 4861 §6.1.2: options of length 0).
    let mut prefixes = Vec::new();
    let mut rest = ad.options;
    while !rest.is_empty() {
        let opt = NdiscOption::new_checked(rest).map_err(|_| DropReason::NdpInvalid)?;
        let len = usize::from(opt.data_len()) * 8;
        if len == 0 || len > rest.len() {
            return Err(DropReason::NdpInvalid);
        }
        if let Ok(NdiscOptionRepr::PrefixInformation(p)) = NdiscOptionRepr::parse(&opt) {
            prefixes.push(p);
        }
        rest = &rest[len..];
    }
    let mut ignored = 0;
    let pos = ip6.routers.iter().position(|r| r.what == ad.src);
    match (pos, ad.lifetime.is_zero()) {
        (Some(i), true) => {
            ip6.routers.remove(i);
        }
        (Some(i), false) => ip6.routers[i].until = now + ad.lifetime,
        (None, false) if ip6.routers.len() < MAX_ROUTERS => ip6.routers.push(Learnt {
            what: ad.src,
            until: now + ad.lifetime,
        }),
        (None, false) => ignored += 1,
        (None, true) => {}
    }
    if let Some(mtu) = ad.mtu.and_then(|m| usize::try_from(m).ok()) {
        // Only within what IPv6 and the port allow (§6.3.4).
        if (MIN_MTU..=port_mtu).contains(&mtu) {
            ip6.mtu = Some(mtu);
        }
    }
    for p in prefixes {
        let valid = std_duration(p.valid_lifetime);
        let preferred = std_duration(p.preferred_lifetime);
        if p.prefix.is_unicast_link_local() || preferred > valid || p.prefix_len > 128 {
            continue;
        }
        let cidr = Ipv6Cidr::new(p.prefix, p.prefix_len);
        // Only the prefix bits count (a router may send the rest set).
        let cidr = Ipv6Cidr::new(masked(cidr), p.prefix_len);
        if p.flags.contains(NdiscPrefixInfoFlags::ON_LINK) {
            ignored += on_link(ip6, now, cidr, valid);
        }
        if p.flags.contains(NdiscPrefixInfoFlags::ADDRCONF) && p.prefix_len == 64 {
            ignored += autoconf(ip6, now, cidr, valid);
        }
    }
    Ok(ignored)
}

/// A smoltcp duration as the standard library's.
pub(crate) fn std_duration(d: smoltcp::time::Duration) -> Duration {
    Duration::from_micros(d.total_micros())
}

/// The prefix bits of `c`, the rest zero.
fn masked(c: Ipv6Cidr) -> Ipv6Addr {
    let bits = u128::from(c.address());
    let len = u32::from(c.prefix_len());
    let mask = if len == 0 {
        0
    } else {
        u128::MAX << (128 - len)
    };
    Ipv6Addr::from(bits & mask)
}

/// An on-link prefix (RFC 4861 §6.3.4): kept for its valid lifetime,
/// forgotten at 0. Returns 1 when the table was full.
fn on_link(ip6: &mut Ipv6Iface, now: Instant, cidr: Ipv6Cidr, valid: Duration) -> u64 {
    let pos = ip6.on_link.iter().position(|p| p.what == cidr);
    match (pos, valid.is_zero()) {
        (Some(i), true) => {
            ip6.on_link.remove(i);
        }
        (Some(i), false) => ip6.on_link[i].until = now + valid,
        (None, false) if ip6.on_link.len() < MAX_PREFIXES => ip6.on_link.push(Learnt {
            what: cidr,
            until: now + valid,
        }),
        (None, false) => return 1,
        (None, true) => {}
    }
    0
}

/// An address made from an advertised /64 (RFC 4862 §5.5.3 d, e): a
/// new one is tentative until duplicate address detection clears it
/// (§5.4). Returns 1 when the table was full.
fn autoconf(ip6: &mut Ipv6Iface, now: Instant, prefix: Ipv6Cidr, valid: Duration) -> u64 {
    let addr = Ipv6Cidr::new(ip6.slaac_addr(prefix.address()), 64);
    let known = (ip6.slaac.iter_mut())
        .chain(ip6.tentative.iter_mut().map(|(a, _)| a))
        .find(|a| a.what == addr);
    if let Some(a) = known {
        let remaining = a.until.saturating_duration_since(now);
        if valid > TWO_HOURS || valid > remaining {
            a.until = now + valid;
        } else if remaining > TWO_HOURS {
            a.until = now + TWO_HOURS;
        }
        return 0;
    }
    if valid.is_zero() || ip6.owns(&addr.address()) {
        return 0;
    }
    if ip6.slaac.len() + ip6.tentative.len() >= MAX_PREFIXES {
        return 1;
    }
    let learnt = Learnt {
        what: addr,
        until: now + valid,
    };
    ip6.tentative.push((learnt, None));
    0
}
