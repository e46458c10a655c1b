//! [`Addr`]: our address on the link, a view of a [`Stack`]: the ARP
//! entries it holds, and duplicate-address detection (RFC 5227 probing).
//! `stack.addr()` lends it mutably, `stack.addr_ref()` read-only.

use core::borrow::{Borrow, BorrowMut};
use core::net::Ipv4Addr;

use smoltcp::wire::EthernetAddress;

use crate::stack::Stack;
use crate::time::Instant;

/// Our address and its neighbours (`S` is `&Stack` or `&mut Stack`).
#[derive(Debug)]
pub struct Addr<S> {
    stack: S,
}

impl<S> Addr<S> {
    pub(crate) fn new(stack: S) -> Self {
        Addr { stack }
    }
}

impl<S: Borrow<Stack>> Addr<S> {
    /// ARP entries that are fresh at `now`.
    pub fn neighbours(&self, now: Instant) -> Vec<(Ipv4Addr, EthernetAddress)> {
        self.stack.borrow().link.arp().entries(now)
    }

    /// The MAC address of another host seen using our IP address (it
    /// answered a probe, or sent ARP from our address), if any.
    pub fn conflict(&self) -> Option<EthernetAddress> {
        self.stack.borrow().link.conflict()
    }
}

impl<S: BorrowMut<Stack>> Addr<S> {
    /// Send an ARP probe for our address on the next poll (RFC 5227
    /// 2.1.1): a host that holds the address answers it, and
    /// [`conflict`](Addr::conflict) then names it.
    pub fn probe(&mut self) {
        self.stack.borrow_mut().link.probe_address();
    }

    /// Probing is over (no conflict): the gratuitous ARP that announces the
    /// address, held back while probing, leaves on the next poll.
    pub fn end_probing(&mut self) {
        self.stack.borrow_mut().link.end_probing();
    }
}
