//! What the engine runs on: the [`device`] trait (burst receive and
//! transmit, capabilities), packet buffer [`pool`]s, per-buffer
//! [`offload`] metadata, and the in-process simulated link ([`sim`]) with
//! its [`impair`]ment wrapper for any device.

pub mod device;
pub mod impair;
pub mod offload;
pub mod pool;
pub mod sim;
