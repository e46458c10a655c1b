//! ustack-runtime: runs the sans-IO [`ustack`] engine.
//!
//! The engine takes `now` and frames and returns work; this crate owns
//! everything around it that touches the world: the wall [`clock`], the
//! [`poll`] loop (pinned, busy-poll or idle back-off), the backends, the
//! multi-core launcher, the [`telemetry`] publisher, and the fronts apps
//! use. It is the way in for any Rust program on ustack: the `ustack`,
//! `uping` and `uperf` binaries, `utop`, the examples and the tests all
//! start their stacks here.
//!
//! # From a builder to a running stack
//!
//! [`Builder`] reads like the command line (`--pcap IFACE | --xdp
//! IFACE[:QUEUE] | --dpdk "EAL ARGS" | --sim`, `--ip`, `--gw`, `--mac`,
//! `--core`, `--telemetry`,
//! `--capture`) and [`build`](Builder::build)s a typed [`NetConfig`]: the
//! [`Backend`], the engine's [`ustack::Config`] and the loop's settings.
//! Then either:
//!
//! - [`Builder::run`]`(&mut app, &stop)` opens the backend and runs the poll
//!   loop on the calling thread with an in-loop app until the app exits or
//!   `stop` is set; or
//! - [`Builder::spawn`] (or [`spawn_with`](Builder::spawn_with) to keep an
//!   in-loop app beside) starts the loop on a thread of its own and returns
//!   a [`Runtime`], whose [`Net`] handle opens sockets from any thread or
//!   task; [`Runtime::stop`] (or dropping it) ends the loop.
//!
//! Backends: [`Backend::Sim`] (an in-process [`ustack::sim::SimLink`]: no
//! root, no NIC), [`Backend::Pcap`] (feature `pcap`: any interface through
//! libpcap, the stack taking its own MAC and address), [`Backend::Xdp`]
//! (feature `xdp`: a queue of an interface through AF_XDP, an XDP program
//! sending the stack's frames to it and the rest to the kernel),
//! [`Backend::Dpdk`]
//! (feature `dpdk`: a DPDK port, busy-polled on a pinned core). A capture
//! file ([`Builder::capture`], feature `pcap`) and impairments
//! ([`Builder::impair`]) wrap any of them. Lower down,
//! [`net::with_node`] hands the opened [`ustack::node::Node`] with its
//! concrete device type to your code, and [`run()`] is the loop itself.
//!
//! # Three fronts
//!
//! - **In the loop**: a [`ustack::node::App`] is called on the loop's thread
//!   every iteration with `&mut Stack` and the iteration's readiness events;
//!   the lowest latency, no locks (`uping` and `uperf` are built so).
//! - **[`blocking`]**: `std::io`-style `TcpListener`, `TcpStream` and
//!   `UdpSocket` for ordinary threads, with read and write timeouts.
//! - **[`aio`]**: the same sockets as futures for any executor, with the
//!   `futures-io` traits (tokio's `AsyncRead`/`AsyncWrite` behind the
//!   `tokio` feature).
//!
//! The blocking and async fronts share the stack with the loop behind one
//! fair lock; a call that cannot proceed registers its waker, and the loop
//! wakes it on the socket's readiness event (see [`ustack::events`]).
//! [`Net::with_stack`] reaches anything else of the engine (statistics,
//! connection info, the UD verbs).
//!
//! # Telemetry
//!
//! With [`Builder::telemetry`] the loop hands a [`ustack::node::Snapshot`]
//! of every counter (port, pools, each layer, drops by reason, TCP
//! connections) to a [`telemetry::Publisher`] a few times a second; a
//! thread of its own writes them as JSON lines on a Unix socket, where
//! `utop` reads them. Publishing never blocks the loop: a snapshot the
//! publisher is not ready for is skipped and counted.
//!
//! # Metrics
//!
//! With [`Builder::metrics`] (`--metrics ADDR:PORT`) a [`metrics`]
//! endpoint serves Prometheus text on that address of the kernel's
//! network: the loop leaves each snapshot in a [`metrics::Feed`] (never
//! waiting), and a scrape converts the latest one, plus the program's own
//! [`metrics::MetricsSource`]s, on the endpoint's threads.
//!
//! # Multi-core
//!
//! One stack per core and NIC queue pair, shared-nothing: with several
//! [`cores`](Builder::cores) (DPDK) [`net::run_sharded`] runs one loop per
//! core, each with its own queue pair, pools and stack, fed by symmetric
//! RSS so both directions of a flow meet on one core; ARP is replicated
//! between the shards and steering rules bring a port's traffic to one of
//! them (see [`ustack::shard`]). [`net::run_primary`] runs a single-node app
//! (a ping, an iperf3 server) on the first core with the others answering
//! beside it.
//!
//! # Example
//!
//! Two stacks on a simulated link: B's loop runs on a thread of its own
//! (its stack answers ARP and ping by itself), A's loop runs here with an
//! in-loop pinger until the pinger is done.
//!
//! ```
//! use std::net::Ipv4Addr;
//! use std::sync::atomic::AtomicBool;
//! use std::time::Duration;
//! use ustack_kit::ping::{Pinger, PingerConfig};
//! use ustack_runtime::Builder;
//!
//! let link = ustack::sim::SimLink::new(Default::default());
//! let b = Builder::new().sim(&link).ip(Ipv4Addr::new(10, 0, 0, 2), 24).spawn()?;
//!
//! let mut ping = Pinger::new(PingerConfig {
//!     count: Some(3),
//!     interval: Duration::from_millis(10),
//!     ..PingerConfig::new(Ipv4Addr::new(10, 0, 0, 2))
//! });
//! let stop = AtomicBool::new(false);
//! Builder::new()
//!     .sim(&link)
//!     .ip(Ipv4Addr::new(10, 0, 0, 1), 24)
//!     .run(&mut ping, &stop)?;
//! assert_eq!(ping.summary().received, 3);
//!
//! // B's counters, read through its handle, then B's loop stops.
//! let icmp = b.net().with_stack(|stack| stack.stats().icmp)?;
//! assert_eq!(icmp.tx_echo_replies, 3);
//! b.stop()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The [`blocking`] and [`aio`] module docs show a TCP echo between two
//! spawned stacks with each front; [`rdma`] shows an RC WRITE between two.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod aio;
pub mod backend;
pub mod blocking;
#[cfg(feature = "cli")]
pub mod cli;
pub mod clock;
#[cfg(feature = "cli")]
pub mod config_file;
pub mod metrics;
pub mod net;
mod notice;
pub mod poll;
pub mod rdma;
mod spawned;
pub mod telemetry;

pub use clock::Clock;
pub use notice::set_notice_sink;
pub use telemetry::{Holder, HoldersSource, set_holders_source};

pub use net::{AppCounters, Backend, Builder, Error, NetConfig};
pub use poll::{IdleMode, LoopConfig, RunError, pin_to_core, run};
pub use spawned::{DeviceWaiter, Net, Runtime, Watcher, io_error};

/// The README's Rust examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
mod readme {}
