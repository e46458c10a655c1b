//! [`Udp`]: the UDP app API, a view of a stack's datagram sockets.
//! `stack.udp()` lends it mutably, `stack.udp_ref()` read-only.

use core::net::SocketAddr;

use super::{Family, UdpHandle, UdpReuse, UdpTable};
use crate::error::Error;
use crate::iface::ipv6_iface::Ipv6Iface;

/// The UDP sockets of a stack, lent mutably by `stack.udp()`, with the
/// most bytes a socket queues to send (`Config::udp_tx_queue_bytes`) and
/// the IPv6 routes a datagram may take.
#[derive(Debug)]
pub struct Udp<'a> {
    table: &'a mut UdpTable,
    tx_cap: usize,
    ip6: &'a Ipv6Iface,
}

/// The same, read-only: what `udp_ref()` lends.
#[derive(Debug)]
pub struct UdpRef<'a> {
    table: &'a UdpTable,
    tx_cap: usize,
}

impl<'a> Udp<'a> {
    pub(crate) fn new(table: &'a mut UdpTable, tx_cap: usize, ip6: &'a Ipv6Iface) -> Self {
        Udp { table, tx_cap, ip6 }
    }

    /// Bind a socket to `port` (0 picks an ephemeral port); `AddrInUse`
    /// when another socket has the port.
    pub fn bind(&mut self, port: u16) -> Result<UdpHandle, Error> {
        self.table.bind(port, UdpReuse::default(), Family::Both)
    }

    /// Bind a socket to `port` sharing it as `reuse` says (a POSIX
    /// layer's `SO_REUSEADDR`/`SO_REUSEPORT`): the port takes it when
    /// every socket on it asked for the same sharing.
    pub fn bind_reuse(&mut self, port: u16, reuse: UdpReuse) -> Result<UdpHandle, Error> {
        self.table.bind(port, reuse, Family::Both)
    }

    /// As [`bind_reuse`](Udp::bind_reuse), for datagrams from peers of
    /// `family` only (a POSIX layer's `AF_INET` and `IPV6_V6ONLY`
    /// sockets): sockets of families that do not overlap share the port.
    pub fn bind_family(
        &mut self,
        port: u16,
        reuse: UdpReuse,
        family: Family,
    ) -> Result<UdpHandle, Error> {
        self.table.bind(port, reuse, family)
    }

    /// Connect a socket to `peer`: from then on only `peer`'s datagrams
    /// are received on it, and on a shared port they go to it before any
    /// unconnected socket. `None` dissolves the association.
    pub fn connect(&mut self, h: UdpHandle, peer: Option<SocketAddr>) -> Result<(), Error> {
        self.table.connect(h, peer)
    }

    /// Queue a datagram to `dst`; it leaves on the next poll. `QueueFull`
    /// when the socket holds `Config::udp_tx_queue_bytes` already (a
    /// WRITABLE event follows when it drains).
    pub fn send_to(
        &mut self,
        h: UdpHandle,
        dst: impl Into<SocketAddr>,
        data: &[u8],
    ) -> Result<(), Error> {
        let (cap, dst) = (self.tx_cap, dst.into());
        // An IPv6 destination with no route is refused now, as Linux's
        // sendto says ENETUNREACH, rather than dropped at the next poll.
        if let SocketAddr::V6(d) = dst
            && self.ip6.next_hop(d.ip()).is_none()
        {
            return Err(Error::NoRoute);
        }
        self.table.send_to(h, dst, data, cap)
    }

    /// Take the next datagram: copies up to `buf.len()` bytes (the rest of a
    /// longer datagram is discarded, as with a datagram socket) and returns
    /// the datagram's full length and its source.
    pub fn recv_from(
        &mut self,
        h: UdpHandle,
        buf: &mut [u8],
    ) -> Result<Option<(usize, SocketAddr)>, Error> {
        self.table.recv_from(h, buf)
    }

    /// Close a socket; received datagrams are discarded, queued ones still
    /// leave on the next poll.
    pub fn close(&mut self, h: UdpHandle) -> Result<(), Error> {
        self.table.close(h)
    }
}

impl<'a> UdpRef<'a> {
    pub(crate) fn new(table: &'a UdpTable, tx_cap: usize) -> Self {
        UdpRef { table, tx_cap }
    }

    /// The local port of a socket.
    pub fn local_port(&self, h: UdpHandle) -> Result<u16, Error> {
        self.table.local_port(h)
    }

    /// Copy the next datagram and leave it queued (`MSG_PEEK`).
    pub fn peek_from(
        &self,
        h: UdpHandle,
        buf: &mut [u8],
    ) -> Result<Option<(usize, SocketAddr)>, Error> {
        self.table.peek_from(h, buf)
    }

    /// Datagrams waiting on the socket, and the length of the next one.
    pub fn pending(&self, h: UdpHandle) -> Result<(usize, Option<usize>), Error> {
        self.table.pending(h)
    }

    /// Bytes queued on a socket to leave on the next poll, and the most it
    /// holds (`Config::udp_tx_queue_bytes`): a POSIX layer reports the
    /// socket writable while under half of that, as Linux does.
    pub fn tx_queued(&self, h: UdpHandle) -> Result<(usize, usize), Error> {
        Ok((self.table.tx_queued(h)?, self.tx_cap))
    }
}
