//! A stack on a network port, from a typed configuration: which backend,
//! addressing, cores, telemetry and capture ([`NetConfig`], made by
//! [`Builder`]), opening the backend, and the multi-core launcher (one
//! stack per queue pair, steering and pass-on between them).
//!
//! Apps are generic over the device: [`with_node`] opens what the
//! configuration names and hands a concrete [`Node`](ustack::node::Node)
//! to a [`NodeRunner`], so nothing is boxed on the data path.
//!
//! The pieces: `builder` (the [`Builder`] and its checks), `open` (opening
//! a backend, [`with_node`], the telemetry publisher and the metrics
//! endpoint), `sharded` (one stack per core: [`run_sharded`],
//! [`run_primary`]) and `error` ([`Error`]).

use std::net::SocketAddr;
use std::path::PathBuf;

use ustack::Config;
use ustack::sim::{LinkConfig, SimLink};

use crate::poll::{IdleMode, LoopConfig};

mod builder;
mod error;
mod open;
pub(crate) mod sharded;

pub use crate::telemetry::AppCounters;
pub use builder::Builder;
pub use error::{ConfigError, Error};
pub use open::{NodeRunner, run_app, start_metrics, with_node};
pub use sharded::{ShardResult, run_primary, run_sharded};

/// Where frames come from and go.
#[derive(Debug, Clone)]
pub enum Backend {
    /// A network interface through libpcap (feature `pcap`): the stack
    /// takes its own MAC and address on it, promiscuous.
    Pcap(String),
    /// A DPDK port (feature `dpdk`), the EAL started with `eal_args`.
    Dpdk {
        /// Arguments for `rte_eal_init`, split like a shell would.
        eal_args: String,
        /// The DPDK port id.
        port: u16,
        /// Mbufs in the port's pool.
        mbufs: u32,
    },
    /// A queue of a network interface through AF_XDP (feature `xdp`): an
    /// XDP program steers the stack's frames to it, the kernel keeps the
    /// rest.
    Xdp {
        /// The interface.
        iface: String,
        /// Its queue.
        queue: u32,
    },
    /// A port on an in-process simulated link (tests, examples, the demo):
    /// stacks attached to the same [`SimLink`] reach each other.
    Sim(SimLink),
}

/// Everything needed to run a stack on a port.
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// Where frames come from and go.
    pub backend: Backend,
    /// The engine's settings: address, gateway, MAC, MTU, TCP tuning.
    pub stack: Config,
    /// Pin the poll loop to this CPU.
    pub core: Option<usize>,
    /// With DPDK: one poll loop per CPU, each with its own queue pair and stack.
    pub cores: Option<Vec<usize>>,
    /// Keep the idle back-off on pinned cores instead of busy-polling.
    pub backoff: bool,
    /// Use the port's offloads (DPDK: TCP checksums, TSO) where it has them.
    pub offloads: bool,
    /// DPDK: use TSO also on net_tap, which segments in software in the
    /// loop's thread.
    pub software_tso: bool,
    /// Publish telemetry on this Unix socket (a path, or a bare name in
    /// [`crate::telemetry::default_dir`]).
    pub telemetry: Option<PathBuf>,
    /// Write every frame sent and received to this pcap file (feature `pcap`).
    pub capture: Option<PathBuf>,
    /// Impair the port's frames both ways (a testing aid).
    pub impair: Option<LinkConfig>,
    /// Counters of the program around the stack, published in every
    /// telemetry line under `app` (see [`Builder::app_counters`]).
    pub app_counters: Option<AppCounters>,
    /// This stack is one of several processes on one replicated port (see
    /// [`Builder::replica`]).
    pub replica: Option<ustack::shard::ShardId>,
    /// pcap: finish partial checksums from a local sender instead of
    /// dropping them (see [`Builder::accept_partial_checksum`]).
    pub accept_partial_checksum: bool,
    /// Skip the start-up probe for our addresses (see [`Builder::probe`]).
    pub no_probe: bool,
    /// Extra Prometheus metrics from the program (see
    /// [`Builder::metrics_source`]).
    pub metrics_sources: Vec<crate::metrics::SharedSource>,
    /// Serve Prometheus metrics over HTTP on this address of the kernel's
    /// network (see [`Builder::metrics`]).
    pub metrics: Option<SocketAddr>,
    /// Where the loop leaves its snapshots for the metrics endpoint
    /// ([`loop_config`](Self::loop_config) hands it to the loop when
    /// `metrics` is set).
    pub metrics_feed: crate::metrics::Feed,
}

impl NetConfig {
    /// Whether the stack probes for its address at start: on ports other
    /// hosts share (pcap, DPDK), not on the simulated link, nor when
    /// turned off ([`Builder::probe`]).
    pub fn probes(&self) -> bool {
        !self.no_probe && !matches!(self.backend, Backend::Sim(..))
    }

    /// The poll loop's settings: pinned to `core` if given, and
    /// busy-polling when that core is dedicated to a DPDK port (otherwise
    /// the loop backs off when idle, so shared CPUs are not starved).
    pub fn loop_config(&self) -> LoopConfig {
        let pinned = self.core.is_some() || self.cores.is_some();
        let dpdk = matches!(self.backend, Backend::Dpdk { .. });
        let idle = if dpdk && pinned && !self.backoff {
            IdleMode::BusyPoll
        } else {
            LoopConfig::default().idle
        };
        LoopConfig {
            core: self.core,
            idle,
            metrics: self.metrics.map(|_| self.metrics_feed.clone()),
            ..LoopConfig::default()
        }
    }

    /// A short description of the backend for log lines.
    pub fn describe(&self) -> String {
        match &self.backend {
            Backend::Pcap(i) => format!("pcap {i}"),
            Backend::Dpdk { eal_args, .. } => format!("dpdk \"{eal_args}\""),
            Backend::Xdp { iface, queue } => format!("xdp {iface}:{queue}"),
            Backend::Sim(_) => "sim".into(),
        }
    }
}
