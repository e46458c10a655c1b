//! perftest over the stack's own RoCEv2, in both roles, with perftest's
//! out-of-band exchange over the stack's own TCP: `uperf --rdma
//! --perftest` (UD: `ib_send_bw -c UD`, `ib_send_lat -c UD`) and `uperf
//! --rdma rc` (RC: the six send/write/read bw/lat tests).
//!
//! One engine for both transports:
//! - `exchange`: the session's steps and the out-of-band messages
//!   ([`Session`], [`Exchange`]), generic over a [`Transport`];
//! - `ud` ([`Ud`]) and [`rc`] ([`rc::Rc`]): each transport's settings,
//!   report, QP and data phase;
//! - `format`: perftest's banner, address lines and tables;
//! - `app`: the [`Client`] and [`Server`] apps and the `uperf` front end
//!   ([`User`]).
//!
//! A session is a state machine driven from the poll loop. Output follows
//! perftest's layout (banner, addresses, table) so the two sides' reports
//! read alike; the byte formats are in [`ustack::wire::exchange`], the
//! message transport is [`crate::oob::MsgConn`].

mod app;
mod exchange;
mod format;
pub mod rc;
mod ud;

pub use app::{Client, PerftestRole, Server, User, WAITING, server_addr};
pub use exchange::{Exchange, Session, SessionReport, Timeouts, Transport};
pub use format::*;
pub use ud::*;
pub use ustack::wire::exchange::PERFTEST_PORT;

/// Fewest iterations perftest accepts.
pub const MIN_ITERS: u64 = 5;
/// perftest's bw tx depth and completion moderation.
const BW_TX_DEPTH: u64 = 128;
const BW_CQ_MOD: usize = 100;
