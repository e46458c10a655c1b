//! Pieces shared by the `ustack`, `uping` and `uperf` binaries.
#![forbid(unsafe_code)]

pub mod iperf;
pub mod iperf_server;
pub mod net;
pub mod report;
pub mod services;
