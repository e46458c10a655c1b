//! UDP: sockets with bounded queues both ways, the receive path (checksum,
//! demux by port, port unreachable) and the transmit path.

use core::net::SocketAddrV4;
use std::collections::{HashMap, VecDeque};

use slotmap::SlotMap;
use smoltcp::wire::Icmpv4DstUnreachable;
use smoltcp::wire::{IpAddress, IpProtocol, UdpPacket, UdpRepr};

use crate::device::Tx;
use crate::error::Error;
use crate::events::{Event, Pending, Readiness, SocketRef};
use crate::link::{IpMeta, Link};
use crate::stats::DropReason;
use crate::time::Instant;

slotmap::new_key_type! {
    /// A bound UDP socket. Handles carry a generation: one kept after
    /// `udp_close` is refused (`InvalidHandle`), never another socket.
    pub struct UdpHandle;
}

/// Largest UDP payload over IPv4.
pub const MAX_UDP_PAYLOAD: usize = 65_507;
/// First port handed out for port 0.
const EPHEMERAL_FIRST: u16 = 49_152;

/// Datagrams with their remote ends, in order.
type Datagrams = VecDeque<(SocketAddrV4, Vec<u8>)>;

#[derive(Debug)]
pub(crate) struct UdpSocket {
    port: u16,
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
    by_port: HashMap<u16, UdpHandle>,
    next_ephemeral: u16,
    /// Sockets with datagrams to send.
    ready: VecDeque<UdpHandle>,
    /// Sockets with pending readiness events.
    events: Vec<UdpHandle>,
    /// Datagrams of closed sockets still to be sent (their port, and them):
    /// a datagram accepted by `send_to` leaves even if the socket closes
    /// before the next poll, as with a kernel socket.
    orphans: Vec<(u16, Datagrams)>,
}

impl UdpTable {
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

    /// Bind a socket to `port` (0 picks an ephemeral port).
    pub fn bind(&mut self, port: u16) -> Result<UdpHandle, Error> {
        let port = match port {
            0 => self.pick_ephemeral().ok_or(Error::NoFreePort)?,
            p if self.by_port.contains_key(&p) => return Err(Error::AddrInUse),
            p => p,
        };
        let h = self.sockets.insert(UdpSocket {
            port,
            rx: VecDeque::new(),
            rx_bytes: 0,
            tx: VecDeque::new(),
            tx_bytes: 0,
            queued: false,
            tx_blocked: false,
            events: Pending::default(),
        });
        self.by_port.insert(port, h);
        Ok(h)
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
        dst: SocketAddrV4,
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
    ) -> Result<Option<(usize, SocketAddrV4)>, Error> {
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
    ) -> Result<Option<(usize, SocketAddrV4)>, Error> {
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
        self.by_port.remove(&s.port);
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
        let (src, dst) = (IpAddress::Ipv4(meta.src), IpAddress::Ipv4(meta.dst));
        if pkt.checksum() != 0 && !pkt.verify_checksum(&src, &dst) {
            return Err(DropReason::UdpBadChecksum);
        }
        let (src_port, dst_port) = (pkt.src_port(), pkt.dst_port());
        // The payload as a slice of `body` (UdpPacket borrows it).
        let data = &body[8..usize::from(pkt.len()).min(body.len()).max(8)];
        if dst_port == crate::ud::wire::ROCE_PORT {
            return Ok(Some(data));
        }
        let cap = link.cfg.udp_rx_queue_bytes;
        let Some(&h) = self.by_port.get(&dst_port) else {
            link.send_unreachable(now, tx, Icmpv4DstUnreachable::PortUnreachable, meta, body);
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
            .push_back((SocketAddrV4::new(meta.src, src_port), data.to_vec()));
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
        while let Some(h) = self.ready.pop_front() {
            let Some(sock) = self.sockets.get_mut(h) else {
                continue;
            };
            sock.queued = false;
            let port = sock.port;
            let datagrams = std::mem::take(&mut sock.tx);
            sock.tx_bytes = 0;
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
        let src = IpAddress::Ipv4(link.ip());
        let repr = UdpRepr {
            src_port: port,
            dst_port: dst.port(),
        };
        let caps = link.checksum.clone();
        let len = repr.header_len() + data.len();
        let sent = link.send_ip(now, tx, *dst.ip(), IpProtocol::Udp, len, |buf| {
            repr.emit(
                &mut UdpPacket::new_unchecked(buf),
                &src,
                &IpAddress::Ipv4(*dst.ip()),
                data.len(),
                |p| p.copy_from_slice(&data),
                &caps,
            );
        });
        if sent.is_ok() {
            link.stats.udp.tx_datagrams += 1;
            link.stats.udp.tx_bytes += data.len() as u64;
        }
    }
}
