//! TCP (RFC 9293) with window and congestion control.

pub mod buffer;
pub mod cc;
pub mod rtt;
pub mod scoreboard;
pub mod seq;

pub use seq::Seq;
