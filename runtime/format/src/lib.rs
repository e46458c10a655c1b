//! The telemetry format of a ustack stack, apart from the runtime that
//! publishes it, so a reader (`utop`, a sidecar) links this and the engine,
//! not the runtime.
//!
//! A stack publishes one JSON object per line on a Unix socket (the
//! runtime's `telemetry::Publisher`): `name`, `version` ([`VERSION`]),
//! `pid`, `seq`, `publisher` (its own counters), `app` (the program's
//! counters, when it has some) and the fields of the engine's
//! [`ustack::node::Snapshot`] (`at_ns`, `stack`, `port`, `offloads`,
//! `pools`, `connections`, `connections_total`, `shard`, `rc_qps`); a
//! multi-core stack adds `shards`, each core's own figures. A client that
//! connects gets the latest line at once, then every new one.
//!
//! - [`line`](mod@line): a lenient reader of one line (every field has a default,
//!   protocol sections stay generic JSON), so readers and stacks of
//!   different versions still understand each other;
//! - [`socket`]: where sockets live (`--telemetry NAME`) and which are live;
//! - [`metrics`]: one line as Prometheus metric families (the names of
//!   `tools/prometheus/README.md`, each field's kind as the engine
//!   declares it), the text exposition, and the HTTP endpoint that serves
//!   it (the runtime's `--metrics`, `utop --prometheus`).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod line;
pub mod metrics;
pub mod socket;

/// The version sent in every line (`ustack_info{version}`): the
/// workspace's, which the runtime shares.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
