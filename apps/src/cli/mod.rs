//! The command lines of the binaries (`ustack`, `uping`, `uperf`) as clap
//! definitions: the binaries parse them, and `packaging/docgen` makes the
//! man pages and shell completions from the same definitions.

pub mod uperf;
pub mod uping;
pub mod ustack;
