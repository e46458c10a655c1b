//! The transports, each a table of sockets behind a handle type and a
//! typed view the [`Stack`](crate::Stack) lends: [`tcp`] (RFC 9293
//! connections and listeners, `stack.tcp()`), [`udp`] (`stack.udp()`),
//! [`ping`] (ICMP echo sockets, `stack.ping()`; the echo machinery lives
//! with ICMP in [`crate::iface::icmp`]), [`ud`] (RDMA unreliable-datagram
//! queue pairs over RoCEv2, `stack.ud()`) and [`rc`] (reliable connected
//! queue pairs, `stack.rc()`). Every view returns the one
//! [`Error`](crate::Error).

pub mod ping;
pub mod rc;
pub mod tcp;
pub mod ud;
pub mod udp;
