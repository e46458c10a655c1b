//! ustack-runtime: runs the sans-IO [`ustack`] engine.
//!
//! The engine takes `now` and frames and returns work; this crate owns
//! everything around it that touches the world: the wall [`clock`], the
//! [`poll`] loop (pinned, busy-poll or back-off), backends opened from a
//! typed configuration, the multi-core launcher, the [`telemetry`]
//! publisher, and the fronts apps use ([`blocking`] streams for ordinary
//! threads).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod aio;
pub mod backend;
pub mod blocking;
pub mod clock;
pub mod net;
pub mod poll;
mod shared;
pub mod telemetry;

pub use clock::Clock;
pub use net::{Backend, Builder, Error, NetConfig};
pub use poll::{IdleMode, LoopConfig, RunError, pin_to_core, run};
pub use shared::{Net, Runtime, io_error};

/// The README's Rust examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
mod readme {}
