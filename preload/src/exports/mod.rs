//! The interposed C functions for sockets, descriptors and readiness. Each
//! looks its descriptor up: a ustack socket's goes to `sock`/`poll`,
//! everything else to the C library unchanged. C arguments are checked and
//! turned into Rust values here (`args`).

pub mod args;
pub mod descriptors;
pub mod exec;
pub mod io;
pub mod limits;
pub mod msg;
pub mod readiness;
pub mod socket;
