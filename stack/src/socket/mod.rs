//! The transports, each a table of sockets behind a handle type:
//! [`tcp`] (RFC 9293 connections and listeners), [`udp`], [`ud`] (RDMA
//! unreliable-datagram queue pairs over RoCEv2) and [`rc`] (reliable
//! connected queue pairs). ICMP echo sockets live with ICMP in
//! [`crate::iface::icmp`].

pub mod rc;
pub mod tcp;
pub mod ud;
pub mod udp;
