//! In-loop apps shared by the binaries and the tests.

pub mod bulk;
pub mod ping;
