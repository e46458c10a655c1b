//! utop: a terminal monitor of running ustack stacks.
//!
//! A stack publishes snapshots as JSON lines on a Unix socket
//! (`ustack_runtime::telemetry`; the line's format, [`model`], is the
//! `ustack-telemetry-format` crate's, which utop links instead of the
//! runtime); [`feed`] attaches to one and turns its lines into
//! [`feed::Update`]s, [`monitor::Monitor`] keeps the latest snapshot, the
//! rates between the last two and the view (pane, sort, filter), and
//! [`term`] draws it with ratatui: only when something shown changed, and
//! then only the changed cells (ratatui's buffer diff), through a
//! [`term::CountingWriter`] that counts the bytes each frame writes.
//!
//! The same monitor runs in-process (`ustack run --tui`, `ustack demo`) on
//! a publisher's local feed ([`feed::from_lines`]).
#![forbid(unsafe_code)]

pub mod cli;
pub mod feed;
pub mod monitor;
pub mod prometheus;
pub mod term;
mod view;

pub use ustack_telemetry_format::line as model;

pub use feed::Update;
pub use model::Frame;
pub use monitor::{Monitor, Pane};
pub use view::buffer_text;
