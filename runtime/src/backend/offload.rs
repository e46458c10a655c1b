//! What a kernel's offloads do to the frames a capture sees, and how a pcap
//! port copes with them on an interface left at its defaults (a laptop's).
//!
//! - **GRO/LRO aggregates.** With generic receive offload on, the kernel
//!   merges consecutive TCP segments of a flow into one frame larger than
//!   the MTU before a packet socket sees it. [`split_aggregate`] cuts such a
//!   frame (IPv4 total length consistent with the frame) back into segments
//!   that fit the MTU. The kernel merges only segments whose checksums it
//!   verified, so the pieces get checksums computed here: the bytes are
//!   the ones it checked.
//! - **Partial checksums.** A local peer with transmit checksum offload
//!   (veth, tap, a bridge) hands over TCP and UDP segments whose checksum
//!   field holds only the pseudo-header sum (the NIC was to finish it).
//!   [`is_partial_checksum`] recognises that exact pattern; the port counts
//!   it and, when allowed (`--accept-partial-checksum`), completes the
//!   checksum ([`complete_checksum`]).
//! - **The interface's own offloads.** [`OffloadGuard`] turns GRO and LRO
//!   off on the stack's interface (with CAP_NET_ADMIN) and puts them back
//!   when dropped; without the right, it says which `ethtool -K` command
//!   to run. It reads and sets them with the ethtool ioctl
//!   (`ustack-ethtool`), never by running `ethtool`: the port opens inside
//!   programs under `ustack exec`, and one that reaps every child on
//!   SIGCHLD (ncat) took the child's status from us (or we its).

pub use ustack::phy::offload::{
    complete_checksum, is_partial_checksum, l4_checksum_ok, split_aggregate,
};
#[cfg(any(feature = "pcap", feature = "xdp"))]
use ustack::{
    phy::device::PortStats,
    phy::pool::{PacketBuf, Pool, SlabBuf, SlabPool},
    time::Instant,
};

#[cfg(any(feature = "pcap", feature = "xdp"))]
/// A frame the kernel handed a port (pcap, AF_XDP), put in `out` as the
/// engine takes it: copied into a buffer of `pool` stamped `at`; an
/// aggregate larger than the MTU cut back into segments (if its checksum
/// is one the kernel left); a partial checksum completed when
/// `accept_partial`. Counted in `stats`. Returns the frames pushed and
/// whether a partial checksum was left as it came (for the port's notice).
pub(crate) fn deliver(
    data: &[u8],
    at: Instant,
    mtu: usize,
    accept_partial: bool,
    pool: &mut SlabPool,
    stats: &mut PortStats,
    out: &mut Vec<SlabBuf>,
) -> (usize, bool) {
    if data.len() > mtu + 14 {
        // Merged by the kernel (GRO, or a local sender's TSO).
        let whole = is_partial_checksum(data) || l4_checksum_ok(data);
        let before = out.len();
        let cut = whole
            .then(|| {
                split_aggregate(data, mtu, |seg| {
                    let Some(mut buf) = pool.alloc() else {
                        stats.rx_nombuf += 1;
                        return;
                    };
                    if buf.set_len(seg.len()) {
                        buf.as_mut().copy_from_slice(seg);
                        buf.set_rx_timestamp(at);
                        stats.rx_packets += 1;
                        stats.rx_bytes += seg.len() as u64;
                        out.push(buf);
                    }
                })
            })
            .flatten();
        return match cut {
            Some(_) => {
                stats.rx_gro_frames += 1;
                (out.len() - before, false)
            }
            None => {
                stats.rx_oversize += 1;
                (0, false)
            }
        };
    }
    let Some(mut buf) = pool.alloc() else {
        stats.rx_nombuf += 1;
        return (0, false);
    };
    if !buf.set_len(data.len()) {
        stats.rx_oversize += 1;
        return (0, false);
    }
    buf.as_mut().copy_from_slice(data);
    buf.set_rx_timestamp(at);
    let mut left = false;
    if is_partial_checksum(data) {
        stats.rx_partial_checksum += 1;
        if accept_partial {
            complete_checksum(buf.as_mut());
        } else {
            left = true;
        }
    }
    stats.rx_packets += 1;
    stats.rx_bytes += data.len() as u64;
    out.push(buf);
    (1, left)
}

#[cfg(any(feature = "pcap", feature = "xdp"))]
/// The notice for partial checksums a port drops (see [`deliver`]).
pub(crate) fn partial_checksum_notice(port: &str, iface: &str) -> String {
    format!(
        "{port} on {iface}: TCP/UDP frames arrive with partial checksums (the sender's \
         checksum offload) and are dropped: turn it off where they come from \
         (`ethtool -K IF tx off` on the sending interface{}) or run with \
         --accept-partial-checksum",
        veth_peer_hint(iface)
    )
}

#[cfg(any(feature = "pcap", feature = "xdp"))]
/// For a veth: which interface its peer is (`iflink`), for a message.
fn veth_peer_hint(iface: &str) -> String {
    let read = |f: &str| std::fs::read_to_string(format!("/sys/class/net/{iface}/{f}"));
    match (read("iflink"), read("ifindex")) {
        (Ok(link), Ok(index)) if link.trim() != index.trim() => {
            format!(": the peer of {iface}, ifindex {}", link.trim())
        }
        _ => String::new(),
    }
}

/// The interface offloads that change the frames a capture sees, by the
/// kernel's feature names (`ethtool -k` shows them as
/// generic-receive-offload, large-receive-offload, rx-gro-hw), with the
/// short names `ethtool -K` takes.
const RECEIVE_OFFLOADS: [(&str, &str); 3] = [
    ("rx-gro", "gro"),
    ("rx-lro", "lro"),
    ("rx-gro-hw", "rx-gro-hw"),
];

/// What [`OffloadGuard::engage`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OffloadOutcome {
    /// Nothing to change (all off, or the interface has none).
    AlreadyOff,
    /// Turned off (and put back when the guard drops): the short names.
    TurnedOff(Vec<String>),
    /// On and left on: the command that would turn them off, and why it
    /// was not run.
    LeftOn {
        /// `ethtool -K IF ... off`.
        command: String,
        /// Why (no CAP_NET_ADMIN: "Operation not permitted").
        why: String,
    },
}

/// Receive offloads turned off on an interface for as long as it lives.
#[derive(Debug)]
pub struct OffloadGuard {
    iface: String,
    restore: Vec<String>,
}

/// Each receive offload of `iface` that is on and not fixed, by its
/// `ethtool -K` name.
fn receive_offloads_on(iface: &str) -> Result<Vec<&'static str>, String> {
    let features = ustack_ethtool::features(iface).map_err(|e| e.to_string())?;
    Ok(RECEIVE_OFFLOADS
        .iter()
        .filter(|(name, _)| features.get(name).is_some_and(|f| f.active && !f.fixed))
        .map(|(_, short)| *short)
        .collect())
}

/// Ask for the receive offloads named (by their `ethtool -K` names) on or
/// off, as `ethtool -K IF NAME on|off...` would (CAP_NET_ADMIN).
fn set_offloads(iface: &str, names: &[&str], on: bool) -> Result<(), String> {
    let changes: Vec<(&str, bool)> = RECEIVE_OFFLOADS
        .iter()
        .filter(|(_, short)| names.contains(short))
        .map(|(name, _)| (*name, on))
        .collect();
    ustack_ethtool::set_features(iface, &changes).map_err(|e| e.to_string())
}

impl OffloadGuard {
    /// Turn the receive offloads of `iface` off where they are on; the
    /// guard puts them back on drop. `None` when nothing was changed, with
    /// what was found.
    pub fn engage(iface: &str) -> (Option<OffloadGuard>, OffloadOutcome) {
        let on = match receive_offloads_on(iface) {
            Ok(on) if on.is_empty() => return (None, OffloadOutcome::AlreadyOff),
            Ok(on) => on,
            // An interface the ioctl cannot query: nothing known.
            Err(_) => return (None, OffloadOutcome::AlreadyOff),
        };
        let command = format!(
            "ethtool -K {iface} {}",
            on.iter()
                .map(|n| format!("{n} off"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        match set_offloads(iface, &on, false) {
            Ok(()) => {
                let names: Vec<String> = on.iter().map(|s| (*s).to_string()).collect();
                (
                    Some(OffloadGuard {
                        iface: iface.to_string(),
                        restore: names.clone(),
                    }),
                    OffloadOutcome::TurnedOff(names),
                )
            }
            Err(why) => (None, OffloadOutcome::LeftOn { command, why }),
        }
    }
}

impl Drop for OffloadGuard {
    fn drop(&mut self) {
        let names: Vec<&str> = self.restore.iter().map(String::as_str).collect();
        if let Err(e) = set_offloads(&self.iface, &names, true) {
            tracing::warn!(
                "pcap on {}: could not turn {} back on: {e}",
                self.iface,
                self.restore.join(", ")
            );
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use smoltcp::wire::{
        EthernetAddress, EthernetFrame, EthernetProtocol, EthernetRepr, IpAddress, IpProtocol,
        Ipv4Address, Ipv4Packet, Ipv4Repr, TcpControl, TcpPacket, TcpRepr, TcpSeqNumber,
    };
    use ustack::wire::checksum;

    const A: Ipv4Address = Ipv4Address::new(10, 0, 0, 1);
    const B: Ipv4Address = Ipv4Address::new(10, 0, 0, 2);

    /// An Ethernet/IPv4/TCP frame with `payload`, checksums right.
    fn tcp_frame(payload: &[u8], fin: bool) -> Vec<u8> {
        let tcp = TcpRepr {
            src_port: 5001,
            dst_port: 40000,
            control: if fin {
                TcpControl::Fin
            } else {
                TcpControl::Psh
            },
            seq_number: TcpSeqNumber(1000),
            ack_number: Some(TcpSeqNumber(77)),
            window_len: 500,
            window_scale: None,
            max_seg_size: None,
            sack_permitted: false,
            sack_ranges: [None; 3],
            timestamp: None,
            payload,
        };
        let ip = Ipv4Repr {
            src_addr: A,
            dst_addr: B,
            next_header: IpProtocol::Tcp,
            payload_len: tcp.buffer_len(),
            hop_limit: 64,
        };
        let eth = EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
            ethertype: EthernetProtocol::Ipv4,
        };
        let mut f = vec![0u8; 14 + 20 + tcp.buffer_len()];
        let mut e = EthernetFrame::new_unchecked(&mut f[..]);
        eth.emit(&mut e);
        let mut i = Ipv4Packet::new_unchecked(e.payload_mut());
        ip.emit(&mut i, &smoltcp::phy::ChecksumCapabilities::default());
        let mut t = TcpPacket::new_unchecked(i.payload_mut());
        tcp.emit(
            &mut t,
            &IpAddress::Ipv4(A),
            &IpAddress::Ipv4(B),
            &smoltcp::phy::ChecksumCapabilities::default(),
        );
        f
    }

    #[test]
    fn an_aggregate_splits_into_valid_segments_carrying_every_byte() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let frame = tcp_frame(&data, true);
        let mut got = Vec::new();
        let mut pieces = Vec::new();
        let n = split_aggregate(&frame, 1500, |f| pieces.push(f.to_vec())).expect("an aggregate");
        assert_eq!(n, pieces.len());
        assert_eq!(n, data.len().div_ceil(1460));
        for (i, p) in pieces.iter().enumerate() {
            assert!(p.len() <= 1514);
            let eth = EthernetFrame::new_checked(&p[..]).unwrap();
            let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
            assert!(ip.verify_checksum());
            assert_eq!(usize::from(ip.total_len()), p.len() - 14);
            let tcp = TcpPacket::new_checked(ip.payload()).unwrap();
            assert!(tcp.verify_checksum(&IpAddress::Ipv4(A), &IpAddress::Ipv4(B)));
            assert_eq!(tcp.seq_number(), TcpSeqNumber(1000) + got.len());
            assert_eq!(tcp.fin(), i + 1 == n, "FIN only on the last");
            got.extend_from_slice(tcp.payload());
        }
        assert_eq!(got, data);
    }

    #[test]
    fn frames_that_fit_or_lie_about_their_length_are_not_aggregates() {
        assert_eq!(
            split_aggregate(&tcp_frame(&[1; 1000], false), 1500, |_| {}),
            None
        );
        let mut bad = tcp_frame(&[1; 5000], false);
        // An IPv4 total length that disagrees with the frame.
        bad[16..18].copy_from_slice(&3000u16.to_be_bytes());
        assert_eq!(split_aggregate(&bad, 1500, |_| panic!("split")), None);
        assert_eq!(
            split_aggregate(&[0u8; 3000], 1500, |_| panic!("split")),
            None
        );
    }

    #[test]
    fn a_partial_checksum_is_recognised_and_completed() {
        let mut f = tcp_frame(b"hello", false);
        assert!(!is_partial_checksum(&f));
        // What a sender with checksum offload leaves: the pseudo-header sum.
        let seg_len = f.len() - 34;
        let sum = checksum::fold(checksum::pseudo_header(A, B, 6, seg_len));
        f[34 + 16..34 + 18].copy_from_slice(&sum.to_be_bytes());
        assert!(is_partial_checksum(&f));
        complete_checksum(&mut f);
        assert!(!is_partial_checksum(&f));
        assert_eq!(f, tcp_frame(b"hello", false));
        // Any other wrong checksum is not that pattern.
        f[34 + 16] ^= 0x40;
        assert!(!is_partial_checksum(&f));
    }
}
