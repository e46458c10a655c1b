//! Backends that need system libraries, each behind its cargo feature.

pub mod offload;
#[cfg(feature = "pcap")]
pub mod pcap;
#[cfg(feature = "xdp")]
pub mod xdp;
