//! ustack: a sans-IO userspace TCP/IP engine.
//!
//! This crate is the protocol engine alone: Ethernet, ARP, IPv4 (validation,
//! fragmentation and bounded reassembly), ICMP, UDP, TCP (RFC 9293 with
//! window scaling and timestamps, SACK, NewReno and CUBIC, RFC 6298 RTO,
//! SYN cookies) and RDMA Unreliable Datagram over RoCEv2, with packet
//! pools, the [`Device`] trait and an in-process simulated link. It has no
//! threads, sockets, sleeps or clock reads. The `ustack-runtime` crate runs
//! it against the wall clock on real ports (libpcap, DPDK), publishes its
//! telemetry, and adds blocking and async socket fronts.
//!
//! # Layers
//!
//! Folders are the layers; the files at the top are the vocabulary every
//! layer shares and the engine that wires them together.
//!
//! | folder | holds |
//! |---|---|
//! | [`wire`] | parsers and emitters, leaf modules: smoltcp's views and `Repr`s, RoCEv2's BTH/DETH/ICRC ([`wire::roce`]), RC's extension headers ([`wire::rc`]), the stock RDMA tools' exchange messages ([`wire::exchange`]), the Internet [`wire::checksum`] |
//! | [`iface`] | below the transports: Ethernet demux and the IPv4 and IPv6 receive paths, the [`iface::arp`] cache and IPv6 neighbor discovery ([`iface::ndp`]), IPv4 and IPv6 transmit, [`iface::frag`] reassembly, [`iface::icmp`] (echo both ways, errors, ping sockets) |
//! | [`socket`] | the transports, each a table of sockets behind a handle: [`socket::tcp`], [`socket::udp`], [`socket::ud`] (RDMA UD), [`socket::rc`] (RDMA RC) |
//! | [`phy`] | what the engine runs on: the [`Device`] trait, packet buffer [`phy::pool`]s, per-buffer [`phy::offload`] metadata, the simulated link [`phy::sim`] and [`phy::impair`] |
//! | [`shard`] | one stack per queue: mailboxes between shards, symmetric RSS ([`shard::rss`]) |
//! | [`sim`] | the test harness: stacks on the simulated link stepped against a virtual clock ([`sim::SimNet`]) |
//!
//! At the top: [`Stack`] (the engine and its app API), [`node`] (one
//! poll-loop iteration and the in-loop [`node::App`]), and the vocabulary
//! that imports no protocol: [`config`], [`events`] (handles and readiness),
//! [`error`], [`stats`] (counters and [`stats::DropReason`]), [`time`].
//! In-loop apps (pingers, a verified bulk transfer) live outside the
//! engine, in the `ustack-kit` crate.
//!
//! # The sans-IO contract
//!
//! A [`Stack`] never reads a clock and never touches a device: every input
//! carries the current time as an [`Instant`] (nanoseconds from an origin
//! the caller picks), and every output goes to a [`Tx`] sink that lends a
//! buffer to write the frame into (a DPDK mbuf's data room, a slab buffer,
//! a `Vec` in [`VecTx`]). Four calls drive it:
//!
//! - [`Stack::receive`]`(now, frame, tx)` processes one received Ethernet
//!   frame; immediate answers (ARP replies, echo replies, resets) are
//!   written to `tx` at once.
//! - [`Stack::poll`]`(now, tx)` runs due timers (retransmission, delayed
//!   ACK, persist, TIME_WAIT, ARP retries, reassembly timeouts) and emits
//!   what sockets queued.
//! - [`Stack::poll_at`] says when `poll` next has work, so a loop can sleep
//!   (or a simulation jump) until then.
//! - [`Stack::drain_events`] hands out which sockets became readable,
//!   writable, connected, closed or errored since the last drain: one
//!   [`events::Event`] per socket, edge-triggered, never a scan.
//!
//! Socket calls through the typed views (`stack.tcp().connect(now, ..)`,
//! `stack.udp().send_to(..)`, `stack.ping().send(..)`...)
//! act on the stack's state at once and only queue frames: they leave on
//! the next `poll`. [`node::Node`] is one poll-loop iteration gluing a
//! `Stack` to a [`Device`] (`rx burst -> protocols -> app -> timers -> tx
//! burst`); the runtime loops it against the wall clock, and
//! [`sim::SimNet`] steps several nodes against a virtual clock that jumps
//! to the next deadline, so a test of a 60 s timer takes microseconds and
//! replays exactly for a given seed.
//!
//! Invariants (see ARCHITECTURE.md):
//! - the engine never reads the clock: time comes in as [`Instant`];
//! - a `Stack` holds no global state: one stack per core / NIC queue;
//! - bad input gets a counter ([`stats::DropReason`]) and a drop, never a panic;
//! - every buffer taken from a [`phy::pool::Pool`] is returned on drop.
//!
//! # Example: two stacks and no device
//!
//! The whole contract in a few lines: two stacks, frames carried between
//! them by hand, time given by the caller. A's datagram waits for ARP to
//! resolve B's address, then arrives and raises a readiness event.
//!
//! ```
//! use std::net::SocketAddrV4;
//! use ustack::events::{Readiness, SocketRef};
//! use ustack::sim::host_config;
//! use ustack::{Instant, RxMeta, Stack, VecTx};
//!
//! // 10.0.0.1 and 10.0.0.2 on one /24, with seeded secrets.
//! let mut a = Stack::new(host_config(1));
//! let mut b = Stack::new(host_config(2));
//! let server = b.udp().bind(7000)?;
//! let client = a.udp().bind(0)?;
//! a.udp().send_to(client, SocketAddrV4::new(b.ip(), 7000), b"hello")?;
//!
//! // The wire: what one stack writes, the other receives.
//! let now = Instant::from_millis(1);
//! let (mut to_a, mut to_b): (Vec<Vec<u8>>, Vec<Vec<u8>>) = (Vec::new(), Vec::new());
//! loop {
//!     let (mut out_a, mut out_b) = (VecTx::new(), VecTx::new());
//!     for frame in to_a.drain(..) {
//!         a.receive(now, &frame, RxMeta::default(), &mut out_a);
//!     }
//!     for frame in to_b.drain(..) {
//!         b.receive(now, &frame, RxMeta::default(), &mut out_b);
//!     }
//!     a.poll(now, &mut out_a);
//!     b.poll(now, &mut out_b);
//!     (to_a, to_b) = (out_b.frames, out_a.frames);
//!     if to_a.is_empty() && to_b.is_empty() {
//!         break;
//!     }
//! }
//!
//! let mut events = Vec::new();
//! b.drain_events(&mut events);
//! assert!(events.iter().any(|e| e.socket == SocketRef::Udp(server)
//!     && e.readiness.contains(Readiness::READABLE)));
//! let mut buf = [0u8; 64];
//! let (len, from) = b.udp().recv_from(server, &mut buf)?.expect("a datagram");
//! assert_eq!(&buf[..len], b"hello");
//! assert_eq!(from.ip(), core::net::IpAddr::from(a.ip()));
//! assert_eq!(b.stats().arp.tx_replies, 1);
//! # Ok::<(), ustack::Error>(())
//! ```
//!
//! # The sim harness
//!
//! [`sim::SimNet`] joins stacks by a [`sim::SimLink`] with seeded delay,
//! loss, reordering and corruption, runs in-loop apps on them, and jumps
//! its virtual clock from one deadline to the next. The `ustack-kit` crate
//! holds the in-loop apps (pingers, a verified bulk transfer) and shows
//! the harness at work in its crate docs.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod config;
pub mod error;
pub mod events;
pub mod iface;
pub mod node;
pub mod phy;
pub mod shard;
pub mod sim;
pub mod socket;
pub mod stack;
pub mod stats;
pub mod time;
pub mod wire;

pub use phy::device::{
    Device, Offloads, PortStats, Received, RxChecksum, RxMeta, RxRole, Tx, TxOffload, VecTx,
};
pub use phy::pool::{PacketBuf, Pool, PoolStats, SlabBuf, SlabPool};
pub use stack::{Config, Error, Stack};
pub use time::Instant;
