//! In-loop apps on the ustack engine.
//!
//! Each is a [`ustack::node::App`]: called on the loop's thread with the
//! stack and the iteration's readiness events, so the same code runs on the
//! simulated link, in the runtime's loop on a real port, and in tests. The
//! engine itself holds no app; these are the ones the binaries (`ustack
//! demo`, `uping`, `ustack run`'s UD responder), the examples and the tests
//! share:
//!
//! - [`ping_engine`]: the one pinger engine (schedule, outstanding
//!   requests, iputils' linger, duplicates, statistics in [`ping_stats`]),
//!   with the probe transport ([`probe`]) plugged in;
//! - [`ping`]: the ICMP echo pinger with iputils-style statistics (the
//!   engine with ICMP echo as its probe);
//! - [`ud_ping`]: the same engine over RoCEv2 UD SENDs, with completion
//!   timestamps; [`ud_responder`] answers them, [`ud_bandwidth`] sweeps
//!   message sizes;
//! - [`bulk`]: a TCP transfer of a known pattern, verified by CRC at the
//!   receiver.
//! # Example: the sim harness
//!
//! [`ustack::sim::SimNet`] joins stacks by a [`ustack::sim::SimLink`] with seeded delay,
//! loss, reordering and corruption, runs in-loop apps on them, and jumps
//! its virtual clock from one deadline to the next. Three pings over a
//! link with 5 ms one-way delay, then 1 MiB over TCP with 1% loss each
//! way, verified byte for byte: seconds of virtual time, milliseconds of
//! real time.
//!
//! ```
//! use std::net::SocketAddrV4;
//! use std::time::Duration;
//! use ustack::Instant;
//! use ustack_kit::bulk::{BulkRecv, BulkSend};
//! use ustack_kit::ping::{Pinger, PingerConfig};
//! use ustack::sim::{LinkConfig, SimNet, host_config};
//!
//! let link = LinkConfig { delay: Duration::from_millis(5), ..LinkConfig::default() };
//! let mut net = SimNet::new(link.clone());
//! net.add(host_config(1));
//! let b = net.add(host_config(2));
//! let b_ip = net.nodes[b].stack.ip();
//!
//! // Node 0 pings node 1 three times; node 1's stack answers by itself.
//! let mut ping = Pinger::new(PingerConfig {
//!     count: Some(3),
//!     interval: Duration::from_millis(100),
//!     ..PingerConfig::new(b_ip)
//! });
//! net.run_until(Instant::from_secs(5), &mut [&mut ping], |_| false);
//! let summary = ping.summary();
//! assert_eq!((summary.transmitted, summary.received), (3, 3));
//! assert!(summary.rtt.min >= Duration::from_millis(10)); // virtual time
//!
//! // Now 1% loss each way, and a bulk transfer from node 0 to node 1.
//! net.link.set_config(LinkConfig { loss: 0.01, ..link });
//! let mut send = BulkSend::new(SocketAddrV4::new(b_ip, 5001), 1 << 20);
//! let mut recv = BulkRecv::new(5001, 8);
//! let deadline = net.now + Duration::from_secs(60);
//! while !send.done() && net.now < deadline {
//!     let step = net.now + Duration::from_millis(100);
//!     net.run_until(step, &mut [&mut send, &mut recv], |_| false);
//! }
//! assert!(send.done() && send.error.is_none());
//! assert_eq!(recv.corrupt_bytes, 0);
//! assert_eq!(recv.completed[0].bytes, 1 << 20);
//! assert_eq!(recv.completed[0].crc, send.transfer.crc);
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod bulk;
pub mod ping;
pub mod ping_engine;
pub mod ping_stats;
pub mod probe;
pub mod ud_bandwidth;
pub mod ud_ping;
pub mod ud_responder;
mod ud_wire;
