//! UDP: sockets with bounded queues both ways, the receive path (checksum,
//! demux by port, port unreachable) and the transmit path.

mod view;

use core::net::{IpAddr, SocketAddr};
use std::collections::{HashMap, VecDeque};

use slotmap::SlotMap;
use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::Icmpv4DstUnreachable;
use smoltcp::wire::{IpAddress, IpProtocol, UdpPacket, UdpRepr};

use crate::error::Error;
use crate::events::{Event, Pending, Readiness, SocketRef};
pub use crate::events::{Family, UdpHandle};
use crate::iface::link::{IpMeta, Link};
use crate::phy::device::Tx;
use crate::stats::DropReason;
use crate::time::Instant;
pub use view::{Udp, UdpRef};

/// Largest UDP payload over IPv4.
pub const MAX_UDP_PAYLOAD: usize = 65_507;
/// Bytes of datagrams all sockets send per poll (at least one datagram).
/// A socket with more waits for the next poll, at the back of the line:
/// one poll holds the stack (and every socket caller waiting on it) for a
/// bounded time, sockets share the port fairly, and a sender that outruns
/// the port finds its queue full (`QueueFull`: EAGAIN) instead of being
/// drained behind one long poll.
const EMIT_BUDGET: usize = 64 * 1024;
/// A UDP header's bytes (counted against the budget, so empty datagrams
/// use some).
const UDP_HEADER: usize = 8;
/// First port handed out for port 0.
const EPHEMERAL_FIRST: u16 = 49_152;

/// Datagrams with their remote ends, in order.
type Datagrams = VecDeque<(SocketAddr, Vec<u8>)>;

/// How a UDP socket shares its port with others (`SO_REUSEADDR`,
/// `SO_REUSEPORT`): a port takes another socket when every socket on it,
/// and the new one, asked for the same kind of sharing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UdpReuse {
    /// `SO_REUSEADDR`: datagrams go to a connected socket whose peer sent
    /// them, else to the socket bound last.
    pub addr: bool,
    /// `SO_REUSEPORT`: datagrams go to a connected socket whose peer sent
    /// them, else to one of the unconnected sockets chosen by the source
    /// (each source keeps its socket).
    pub port: bool,
}

#[derive(Debug)]
pub(crate) struct UdpSocket {
    port: u16,
    reuse: UdpReuse,
    /// The peers whose datagrams it takes.
    family: Family,
    /// The connected peer: only its datagrams are received.
    peer: Option<SocketAddr>,
    rx: Datagrams,
    rx_bytes: usize,
    tx: Datagrams,
    tx_bytes: usize,
    queued: bool,
    /// A send was refused for a full queue: say WRITABLE when it drains.
    tx_blocked: bool,
    events: Pending,
}

/// Every UDP socket of a stack.
#[derive(Debug, Default)]
pub(crate) struct UdpTable {
    sockets: SlotMap<UdpHandle, UdpSocket>,
    /// The sockets bound to each port, in the order they were bound.
    by_port: HashMap<u16, Vec<UdpHandle>>,
    next_ephemeral: u16,
    /// Sockets with datagrams to send.
    ready: VecDeque<UdpHandle>,
    /// Sockets with pending readiness events.
    events: Vec<UdpHandle>,
    /// Datagrams of closed sockets still to be sent (their port, and them):
    /// a datagram accepted by `send_to` leaves even if the socket closes
    /// before the next poll, as with a kernel socket.
    orphans: Vec<(u16, Datagrams)>,
    /// Bytes a socket may hold received (`Config::udp_rx_queue_bytes`).
    rx_cap: usize,
}

impl UdpTable {
    /// No sockets; each may hold `rx_cap` bytes received.
    pub(crate) fn new(rx_cap: usize) -> Self {
        UdpTable {
            rx_cap,
            ..UdpTable::default()
        }
    }

    fn get_mut(&mut self, h: UdpHandle) -> Result<&mut UdpSocket, Error> {
        self.sockets.get_mut(h).ok_or(Error::InvalidHandle)
    }

    /// Sockets bound now.
    pub fn count(&self) -> usize {
        self.sockets.len()
    }

    /// Whether datagrams wait to be sent.
    pub fn has_work(&self) -> bool {
        !self.ready.is_empty() || !self.orphans.is_empty()
    }

    fn pick_ephemeral(&mut self) -> Option<u16> {
        let span = u32::from(u16::MAX - EPHEMERAL_FIRST) + 1;
        for _ in 0..span {
            let p = self.next_ephemeral.max(EPHEMERAL_FIRST);
            self.next_ephemeral = if p == u16::MAX {
                EPHEMERAL_FIRST
            } else {
                p + 1
            };
            if !self.by_port.contains_key(&p) {
                return Some(p);
            }
        }
        None
    }

    fn raise(&mut self, h: UdpHandle, r: Readiness) {
        if let Some(s) = self.sockets.get_mut(h) {
            if s.events.raise(r) {
                self.events.push(h);
            }
        }
    }

    /// Whether events wait to be drained.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Hand out pending events.
    pub fn drain_events(&mut self, out: &mut Vec<Event>) {
        for h in self.events.drain(..) {
            if let Some(s) = self.sockets.get_mut(h) {
                let readiness = s.events.take();
                if !readiness.is_empty() {
                    out.push(Event {
                        socket: SocketRef::Udp(h),
                        readiness,
                    });
                }
            }
        }
    }

    // ------------------------------------------------------------- app API

    /// Bind a socket for peers of `family` to `port` (0 picks an
    /// ephemeral port), sharing it as `reuse` says with the sockets there
    /// whose families overlap (an IPv4 and an IPv6-only socket share a
    /// port without asking).
    pub fn bind(&mut self, port: u16, reuse: UdpReuse, family: Family) -> Result<UdpHandle, Error> {
        let port = match port {
            0 => self.pick_ephemeral().ok_or(Error::NoFreePort)?,
            p => {
                let on_port = self.by_port.get(&p).map_or(&[][..], Vec::as_slice);
                let overlapping = || {
                    (on_port.iter())
                        .filter_map(|&h| self.sockets.get(h))
                        .filter(|s| s.family.overlaps(family))
                };
                let shares =
                    |f: fn(UdpReuse) -> bool| f(reuse) && overlapping().all(|s| f(s.reuse));
                if overlapping().next().is_some() && !shares(|r| r.addr) && !shares(|r| r.port) {
                    return Err(Error::AddrInUse);
                }
                p
            }
        };
        let h = self.sockets.insert(UdpSocket {
            port,
            reuse,
            family,
            peer: None,
            rx: VecDeque::new(),
            rx_bytes: 0,
            tx: VecDeque::new(),
            tx_bytes: 0,
            queued: false,
            tx_blocked: false,
            events: Pending::default(),
        });
        self.by_port.entry(port).or_default().push(h);
        Ok(h)
    }

    /// Connect a socket to `peer` (only its datagrams are received from
    /// then on), or dissolve the association (`None`).
    pub fn connect(&mut self, h: UdpHandle, peer: Option<SocketAddr>) -> Result<(), Error> {
        self.get_mut(h)?.peer = peer;
        Ok(())
    }

    /// The socket a datagram from `src` to `port` is for: a connected one
    /// whose peer is `src`, else an unconnected one (the last bound, or
    /// with `SO_REUSEPORT` one chosen by `src`), as Linux's lookup scores
    /// them.
    fn lookup(&self, port: u16, src: SocketAddr) -> Option<UdpHandle> {
        let on_port = self.by_port.get(&port)?;
        let takes = |s: &UdpSocket| s.family.takes(src.ip());
        // Unconnected sockets of the sender's family, the last bound first
        // (no allocation: this runs for every datagram).
        let open = || {
            on_port
                .iter()
                .rev()
                .filter(|&&h| (self.sockets.get(h)).is_some_and(|s| s.peer.is_none() && takes(s)))
        };
        let mut n = 0;
        let mut all_reuse_port = true;
        for &h in on_port.iter().rev() {
            let Some(s) = self.sockets.get(h).filter(|s| takes(s)) else {
                continue;
            };
            match s.peer {
                Some(p) if p == src => return Some(h),
                Some(_) => {}
                None => {
                    n += 1;
                    all_reuse_port &= s.reuse.port;
                }
            }
        }
        if n <= 1 || !all_reuse_port {
            return open().next().copied();
        }
        let ip = match src.ip() {
            IpAddr::V4(a) => u32::from(a),
            IpAddr::V6(a) => {
                let b = a.to_bits();
                (b ^ (b >> 64) ^ (b >> 32) ^ (b >> 96)) as u32
            }
        };
        let key = ip.rotate_left(16) ^ u32::from(src.port());
        let i = (key.wrapping_mul(0x9e37_79b9) >> 16) as usize % n;
        open().nth(i).copied()
    }

    /// The local port of a socket.
    pub fn local_port(&self, h: UdpHandle) -> Result<u16, Error> {
        self.sockets
            .get(h)
            .map(|s| s.port)
            .ok_or(Error::InvalidHandle)
    }

    /// Queue a datagram to `dst` (at most `cap` bytes queued per socket).
    pub fn send_to(
        &mut self,
        h: UdpHandle,
        dst: SocketAddr,
        data: &[u8],
        cap: usize,
    ) -> Result<(), Error> {
        if data.len() > MAX_UDP_PAYLOAD {
            return Err(Error::TooLarge);
        }
        let s = self.get_mut(h)?;
        if s.tx_bytes + data.len() > cap && !s.tx.is_empty() {
            s.tx_blocked = true;
            return Err(Error::QueueFull);
        }
        s.tx_bytes += data.len();
        s.tx.push_back((dst, data.to_vec()));
        if !s.queued {
            s.queued = true;
            self.ready.push_back(h);
        }
        Ok(())
    }

    /// Take the next datagram: copies up to `buf.len()` bytes (the rest of a
    /// longer datagram is discarded, as with a datagram socket) and returns
    /// the datagram's full length and its source.
    pub fn recv_from(
        &mut self,
        h: UdpHandle,
        buf: &mut [u8],
    ) -> Result<Option<(usize, SocketAddr)>, Error> {
        let s = self.get_mut(h)?;
        let Some((src, data)) = s.rx.pop_front() else {
            return Ok(None);
        };
        s.rx_bytes -= data.len();
        let n = data.len().min(buf.len());
        buf[..n].copy_from_slice(&data[..n]);
        Ok(Some((data.len(), src)))
    }

    /// Copy the next datagram without taking it (`MSG_PEEK`); as
    /// [`recv_from`](Self::recv_from) otherwise.
    pub fn peek_from(
        &self,
        h: UdpHandle,
        buf: &mut [u8],
    ) -> Result<Option<(usize, SocketAddr)>, Error> {
        let s = self.sockets.get(h).ok_or(Error::InvalidHandle)?;
        Ok(s.rx.front().map(|(src, data)| {
            let n = data.len().min(buf.len());
            buf[..n].copy_from_slice(&data[..n]);
            (data.len(), *src)
        }))
    }

    /// Datagrams waiting to be read and the length of the first.
    pub fn pending(&self, h: UdpHandle) -> Result<(usize, Option<usize>), Error> {
        let s = self.sockets.get(h).ok_or(Error::InvalidHandle)?;
        Ok((s.rx.len(), s.rx.front().map(|(_, d)| d.len())))
    }

    /// Bytes queued on the socket to leave on the next poll.
    pub fn tx_queued(&self, h: UdpHandle) -> Result<usize, Error> {
        let s = self.sockets.get(h).ok_or(Error::InvalidHandle)?;
        Ok(s.tx_bytes)
    }

    /// Close a socket; received datagrams are discarded, queued ones still
    /// leave on the next poll.
    pub fn close(&mut self, h: UdpHandle) -> Result<(), Error> {
        let s = self.sockets.remove(h).ok_or(Error::InvalidHandle)?;
        if let Some(on_port) = self.by_port.get_mut(&s.port) {
            on_port.retain(|&i| i != h);
            if on_port.is_empty() {
                self.by_port.remove(&s.port);
            }
        }
        if !s.tx.is_empty() {
            self.orphans.push((s.port, s.tx));
        }
        self.ready.retain(|&i| i != h);
        self.events.retain(|&i| i != h);
        Ok(())
    }

    // -------------------------------------------------------- data path

    /// A UDP datagram for us: queued on the bound socket, or answered with
    /// port unreachable. RoCEv2 (port 4791) is not a socket's: its payload
    /// is returned for the UD layer.
    pub(crate) fn process<'a, T: Tx>(
        &mut self,
        link: &mut Link,
        now: Instant,
        meta: IpMeta<'_>,
        body: &'a [u8],
        tx: &mut T,
    ) -> Result<Option<&'a [u8]>, DropReason> {
        let pkt = UdpPacket::new_checked(body).map_err(|_| DropReason::UdpMalformed)?;
        if pkt.dst_port() == 0 {
            return Err(DropReason::UdpMalformed);
        }
        // IPv6 has no datagram without a checksum (RFC 8200 §8.1), but for
        // RoCEv2: RNICs and rxe send 0 over either family, the ICRC
        // covering the packet (the tunnel exception of RFC 6935).
        let roce = pkt.dst_port() == crate::wire::roce::ROCE_PORT;
        let unsummed = pkt.checksum() == 0 && (meta.src.is_ipv4() || roce);
        if !unsummed
            && !crate::wire::checksum::verifies_ip(
                meta.src,
                meta.dst,
                17,
                &body[..usize::from(pkt.len())],
            )
        {
            return Err(DropReason::UdpBadChecksum);
        }
        let (src_port, dst_port) = (pkt.src_port(), pkt.dst_port());
        // The payload as a slice of `body` (UdpPacket borrows it).
        let data = &body[8..usize::from(pkt.len()).min(body.len()).max(8)];
        if dst_port == crate::wire::roce::ROCE_PORT {
            return Ok(Some(data));
        }
        let cap = self.rx_cap;
        let Some(h) = self.lookup(dst_port, SocketAddr::new(meta.src, src_port)) else {
            if meta.src.is_ipv6() {
                crate::iface::ipv6::send_port_unreachable(link, now, tx, &meta, body);
            } else {
                link.send_unreachable(now, tx, Icmpv4DstUnreachable::PortUnreachable, meta, body);
            }
            return Err(DropReason::UdpNoSocket);
        };
        let Some(sock) = self.sockets.get_mut(h) else {
            return Err(DropReason::UdpNoSocket);
        };
        if sock.rx_bytes + data.len() > cap && !sock.rx.is_empty() {
            return Err(DropReason::UdpQueueFull);
        }
        sock.rx_bytes += data.len();
        sock.rx
            .push_back((SocketAddr::new(meta.src, src_port), data.to_vec()));
        link.stats.udp.rx_datagrams += 1;
        link.stats.udp.rx_bytes += data.len() as u64;
        self.raise(h, Readiness::READABLE);
        Ok(None)
    }

    /// Send the datagrams sockets queued (and those of sockets closed since).
    pub(crate) fn emit<T: Tx>(&mut self, link: &mut Link, now: Instant, tx: &mut T) {
        for (port, datagrams) in std::mem::take(&mut self.orphans) {
            send_all(link, now, tx, port, datagrams);
        }
        let mut budget = EMIT_BUDGET;
        while budget > 0 {
            let Some(h) = self.ready.pop_front() else {
                break;
            };
            let Some(sock) = self.sockets.get_mut(h) else {
                continue;
            };
            let port = sock.port;
            let cost = sock.tx_bytes + UDP_HEADER * sock.tx.len();
            let datagrams = if cost <= budget {
                budget -= cost;
                sock.tx_bytes = 0;
                std::mem::take(&mut sock.tx)
            } else {
                // More than this poll's share: whole datagrams up to it (at
                // least one); the socket goes to the back of the line.
                let mut part = Datagrams::new();
                while budget > 0 {
                    let Some(d) = sock.tx.pop_front() else {
                        break;
                    };
                    sock.tx_bytes -= d.1.len();
                    budget = budget.saturating_sub(d.1.len() + UDP_HEADER);
                    part.push_back(d);
                }
                part
            };
            if sock.tx.is_empty() {
                sock.queued = false;
            } else {
                self.ready.push_back(h);
            }
            // Room was made: a sender refused for a full queue may go on.
            let unblocked = std::mem::take(&mut sock.tx_blocked);
            send_all(link, now, tx, port, datagrams);
            if unblocked {
                self.raise(h, Readiness::WRITABLE);
            }
        }
    }
}

/// Send `datagrams` from local `port`.
fn send_all<T: Tx>(link: &mut Link, now: Instant, tx: &mut T, port: u16, datagrams: Datagrams) {
    for (dst, data) in datagrams {
        let repr = UdpRepr {
            src_port: port,
            dst_port: dst.port(),
        };
        let len = repr.header_len() + data.len();
        let sent = match dst.ip() {
            IpAddr::V4(to) => {
                let src = IpAddress::Ipv4(link.ip());
                let caps = link.checksum.clone();
                link.send_ip(now, tx, to, IpProtocol::Udp, len, |buf| {
                    repr.emit(
                        &mut UdpPacket::new_unchecked(buf),
                        &src,
                        &IpAddress::Ipv4(to),
                        data.len(),
                        |p| p.copy_from_slice(&data),
                        &caps,
                    );
                })
            }
            IpAddr::V6(to) => match link.ip6.source_for(&to) {
                Some(from) => {
                    let ports = u32::from(repr.src_port) << 16 | u32::from(repr.dst_port);
                    let udp = IpProtocol::Udp;
                    crate::iface::ipv6::send(link, now, tx, from, to, (udp, 0), ports, len, |buf| {
                        // The checksum always (RFC 8200 §8.1).
                        repr.emit(
                            &mut UdpPacket::new_unchecked(buf),
                            &IpAddress::Ipv6(from),
                            &IpAddress::Ipv6(to),
                            data.len(),
                            |p| p.copy_from_slice(&data),
                            &ChecksumCapabilities::default(),
                        );
                    })
                }
                None => {
                    link.stats.ipv6.tx_no_route += 1;
                    Err(Error::NoRoute)
                }
            },
        };
        if sent.is_ok() {
            link.stats.udp.tx_datagrams += 1;
            link.stats.udp.tx_bytes += data.len() as u64;
        }
    }
}
