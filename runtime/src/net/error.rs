//! Why a stack could not start, or stopped with an error.

use crate::poll::RunError;
use crate::telemetry::TelemetryError;

/// Why a stack could not be started or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is missing or contradicts another.
    #[error("{0}")]
    Config(String),
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
        "{ip} is already in use on this link by {mac}: pick another address with --ip (or stop the other stack)"
    )]
    AddressInUse {
        /// The address asked for.
        ip: std::net::Ipv4Addr,
        /// The other host's MAC.
        mac: smoltcp::wire::EthernetAddress,
    },
}
