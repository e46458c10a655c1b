//! [`Ping`]: ICMP echo sockets, a view of a stack's ping table (the
//! echo machinery itself lives with ICMP in [`crate::iface::icmp`]).
//! `stack.ping()` lends it.

use core::net::IpAddr;

use crate::error::Error;
use crate::iface::icmp::PingTable;
pub use crate::iface::icmp::{PingEvent, PingHandle, PingReply};

/// The ping sockets of a stack.
#[derive(Debug)]
pub struct Ping<'a> {
    table: &'a mut PingTable,
}

impl<'a> Ping<'a> {
    pub(crate) fn new(table: &'a mut PingTable) -> Self {
        Ping { table }
    }

    /// Open a ping socket with echo identifier `ident`.
    pub fn open(&mut self, ident: u16) -> Result<PingHandle, Error> {
        self.table.open(ident)
    }

    /// Queue an echo request with `size` bytes of data to `dst`, ICMP or
    /// ICMPv6 by its family; it leaves on the next poll.
    pub fn send(
        &mut self,
        h: PingHandle,
        dst: impl Into<IpAddr>,
        seq: u16,
        size: usize,
    ) -> Result<(), Error> {
        self.table.send(h, dst.into(), seq, size)
    }

    /// Next reply or error for this socket.
    pub fn recv(&mut self, h: PingHandle) -> Result<Option<PingEvent>, Error> {
        self.table.recv(h)
    }

    /// Close a ping socket; queued requests and events are discarded.
    pub fn close(&mut self, h: PingHandle) -> Result<(), Error> {
        self.table.close(h)
    }
}
