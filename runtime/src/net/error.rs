//! Why a stack could not start, or stopped with an error: [`Error`], and
//! [`ConfigError`] for what [`Builder::build`](super::Builder::build)
//! refuses. The messages speak of settings, never of command-line flags:
//! a program that reads flags says which flag (see `crate::cli`).

use std::net::{Ipv4Addr, Ipv6Addr};

use ustack::wire::{EthernetAddress, Ipv4Cidr};

use crate::poll::RunError;
use crate::telemetry::TelemetryError;

/// A setting [`Builder::build`](super::Builder::build) refuses: missing,
/// out of range, or contradicting another. Found before anything opens.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// No backend was chosen.
    #[error("choose a backend: pcap IFACE, dpdk \"EAL ARGS\" or sim")]
    NoBackend,
    /// The pcap backend names no interface.
    #[error("the pcap backend needs an interface name")]
    NoInterface,
    /// No address was given.
    #[error("an address is required (A.B.C.D/LEN)")]
    NoAddress,
    /// The prefix length is above 32.
    #[error("prefix length /{0} is above /32")]
    PrefixTooLong(u8),
    /// The address cannot be a host's own (unspecified, loopback,
    /// multicast, broadcast).
    #[error("{addr} cannot be the stack's address: it is {why}")]
    BadAddress {
        /// The address given.
        addr: Ipv4Addr,
        /// What kind of address it is.
        why: &'static str,
    },
    /// An IPv6 address cannot be the stack's own, or its prefix length is
    /// not 1 to 128.
    #[error("{addr}/{prefix} cannot be the stack's IPv6 address: {why}")]
    BadIpv6 {
        /// The address given.
        addr: Ipv6Addr,
        /// Its prefix length.
        prefix: u8,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The gateway is not another host on our subnet.
    #[error("gateway {gateway} is not another address on our subnet {subnet}")]
    GatewayOffSubnet {
        /// The gateway given.
        gateway: Ipv4Addr,
        /// Our address and prefix.
        subnet: Ipv4Cidr,
    },
    /// The IPv6 gateway is not an address a router can have.
    #[error("{0} cannot be an IPv6 gateway: a unicast address is needed")]
    BadGateway6(Ipv6Addr),
    /// The MAC is a group (multicast or broadcast) address.
    #[error("{0} is not a unicast MAC")]
    MacNotUnicast(EthernetAddress),
    /// The IP MTU is out of the range the stack supports.
    #[error("MTU {0} is not in 576..=9000")]
    Mtu(usize),
    /// The IP MTU is above the interface's (read from sysfs).
    #[error("MTU {mtu} is above the MTU of {iface} ({link_mtu})")]
    MtuAboveInterface {
        /// The MTU asked for.
        mtu: usize,
        /// The interface.
        iface: String,
        /// The interface's MTU.
        link_mtu: usize,
    },
    /// The receive buffer limit is zero.
    #[error("a receive buffer limit of 0 bytes")]
    ZeroReceiveBuffer,
    /// A CPU this process may not run on (or that does not exist).
    #[error("no CPU {cpu} to run on: this process may use CPUs {}", list(.allowed))]
    NoSuchCpu {
        /// The CPU asked for.
        cpu: usize,
        /// The CPUs this process may use.
        allowed: Vec<usize>,
    },
    /// An empty list of cores.
    #[error("a list of cores is required for a sharded run")]
    NoCores,
    /// A core listed twice.
    #[error("core {0} is listed twice")]
    DuplicateCore(usize),
    /// Several cores on a backend other than DPDK.
    #[error("several cores need DPDK: each core owns one queue pair of a DPDK port")]
    CoresNeedDpdk,
    /// A capture file or impairments with several cores.
    #[error("a capture file and impairments work with one core")]
    CoresWithWrappers,
    /// Several cores asked of a runtime that runs one.
    #[error("a spawned runtime runs one core: use run_sharded for several")]
    SpawnWithCores,
    /// A replica index not below the count.
    #[error("replica {index} of {count}: the index must be below the count")]
    Replica {
        /// The index given.
        index: usize,
        /// The count given.
        count: usize,
    },
    /// A replica with several cores.
    #[error("a replica runs one core: several cores and replicas do not mix")]
    ReplicaWithCores,
    /// DPDK port settings without the DPDK backend.
    #[error("DPDK port settings given, but the backend is not DPDK")]
    DpdkPortWithoutDpdk,
    /// A DPDK pool of no mbufs.
    #[error("a DPDK port needs mbufs in its pool (0 given)")]
    NoMbufs,
}

/// CPUs as a comma-separated list.
fn list(cpus: &[usize]) -> String {
    cpus.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Why a stack could not be started or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is missing, out of range or contradicts another.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A command-line mistake, said in the flags' terms (`crate::cli`).
    #[error("{0}")]
    Usage(String),
    /// The runtime is not in the state the call needs (stopped already,
    /// paused instead of stopped).
    #[error("{0}")]
    State(&'static str),
    /// This build lacks the backend the configuration names.
    #[error("{0}")]
    Unsupported(&'static str),
    /// The poll loop could not pin its core, or the device failed while
    /// running (an interface gone or down).
    #[error(transparent)]
    Run(#[from] RunError),
    /// The telemetry socket could not be set up.
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    /// The metrics endpoint could not listen (`--metrics`).
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    /// The pcap port or capture file could not be opened.
    #[cfg(feature = "pcap")]
    #[error(transparent)]
    Pcap(#[from] crate::backend::pcap::PcapError),
    /// The AF_XDP socket or its XDP program could not be set up.
    #[cfg(feature = "xdp")]
    #[error(transparent)]
    Xdp(#[from] ustack_xdp::XdpError),
    /// The DPDK EAL or port could not be set up.
    #[cfg(feature = "dpdk")]
    #[error(transparent)]
    Dpdk(#[from] ustack_dpdk::DpdkError),
    /// The OS refused a poll-loop thread.
    #[error("cannot start a poll-loop thread: {0}")]
    Thread(std::io::Error),
    /// A poll-loop thread panicked (a bug: the engine never panics on input).
    #[error("a poll-loop thread panicked")]
    Panicked,
    /// Another host answered the probe for our address (RFC 5227).
    #[error(
        "{ip} is already in use on this link by {mac}: pick another address (or stop the other stack)"
    )]
    AddressInUse {
        /// The address asked for (IPv4, or one of the IPv6 ones).
        ip: std::net::IpAddr,
        /// The other host's MAC.
        mac: smoltcp::wire::EthernetAddress,
    },
}
