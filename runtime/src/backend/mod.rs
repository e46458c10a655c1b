//! Backends that need system libraries, each behind its cargo feature.

#[cfg(feature = "pcap")]
pub mod pcap;
