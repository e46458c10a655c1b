//! UDP sockets: bind, send_to, recv_from, with bounded queues both ways.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddrV4;

use crate::stack::{Error, Stack};

/// A bound UDP socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpHandle(pub(crate) usize);

/// Largest UDP payload over IPv4.
pub const MAX_UDP_PAYLOAD: usize = 65_507;
/// First port handed out for port 0.
const EPHEMERAL_FIRST: u16 = 49_152;

#[derive(Debug)]
pub(crate) struct UdpSocket {
    pub port: u16,
    pub rx: VecDeque<(SocketAddrV4, Vec<u8>)>,
    pub rx_bytes: usize,
    pub tx: VecDeque<(SocketAddrV4, Vec<u8>)>,
    pub tx_bytes: usize,
    pub queued: bool,
}

#[derive(Debug, Default)]
pub(crate) struct UdpTable {
    pub sockets: Vec<Option<UdpSocket>>,
    pub by_port: HashMap<u16, usize>,
    pub next_ephemeral: u16,
    pub ready: VecDeque<usize>,
}

impl UdpTable {
    pub fn get_mut(&mut self, h: UdpHandle) -> Result<&mut UdpSocket, Error> {
        self.sockets
            .get_mut(h.0)
            .and_then(Option::as_mut)
            .ok_or(Error::InvalidHandle)
    }

    pub fn by_port(&mut self, port: u16) -> Option<&mut UdpSocket> {
        let i = *self.by_port.get(&port)?;
        self.sockets.get_mut(i)?.as_mut()
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
}

impl Stack {
    /// Bind a socket to `port` (0 picks an ephemeral port).
    pub fn udp_bind(&mut self, port: u16) -> Result<UdpHandle, Error> {
        let port = match port {
            0 => self.udp.pick_ephemeral().ok_or(Error::NoFreePort)?,
            p if self.udp.by_port.contains_key(&p) => return Err(Error::AddrInUse),
            p => p,
        };
        let sock = UdpSocket {
            port,
            rx: VecDeque::new(),
            rx_bytes: 0,
            tx: VecDeque::new(),
            tx_bytes: 0,
            queued: false,
        };
        let idx = match self.udp.sockets.iter().position(Option::is_none) {
            Some(i) => {
                self.udp.sockets[i] = Some(sock);
                i
            }
            None => {
                self.udp.sockets.push(Some(sock));
                self.udp.sockets.len() - 1
            }
        };
        self.udp.by_port.insert(port, idx);
        Ok(UdpHandle(idx))
    }

    /// The local port of a socket.
    pub fn udp_local_port(&mut self, h: UdpHandle) -> Result<u16, Error> {
        Ok(self.udp.get_mut(h)?.port)
    }

    /// Queue a datagram to `dst`; it leaves on the next poll.
    pub fn udp_send_to(
        &mut self,
        h: UdpHandle,
        dst: SocketAddrV4,
        data: &[u8],
    ) -> Result<(), Error> {
        if data.len() > MAX_UDP_PAYLOAD {
            return Err(Error::TooLarge);
        }
        let cap = self.link.cfg.udp_tx_queue_bytes;
        let s = self.udp.get_mut(h)?;
        if s.tx_bytes + data.len() > cap && !s.tx.is_empty() {
            return Err(Error::QueueFull);
        }
        s.tx_bytes += data.len();
        s.tx.push_back((dst, data.to_vec()));
        if !s.queued {
            s.queued = true;
            self.udp.ready.push_back(h.0);
        }
        Ok(())
    }

    /// Take the next datagram: copies up to `buf.len()` bytes (the rest of a
    /// longer datagram is discarded, as with a datagram socket) and returns
    /// the datagram's full length and its source.
    pub fn udp_recv_from(
        &mut self,
        h: UdpHandle,
        buf: &mut [u8],
    ) -> Result<Option<(usize, SocketAddrV4)>, Error> {
        let s = self.udp.get_mut(h)?;
        let Some((src, data)) = s.rx.pop_front() else {
            return Ok(None);
        };
        s.rx_bytes -= data.len();
        let n = data.len().min(buf.len());
        buf[..n].copy_from_slice(&data[..n]);
        Ok(Some((data.len(), src)))
    }

    /// Close a socket; queued datagrams are discarded.
    pub fn udp_close(&mut self, h: UdpHandle) -> Result<(), Error> {
        let port = self.udp.get_mut(h)?.port;
        self.udp.sockets[h.0] = None;
        self.udp.by_port.remove(&port);
        self.udp.ready.retain(|&i| i != h.0);
        Ok(())
    }
}
