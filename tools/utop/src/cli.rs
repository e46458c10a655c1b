//! The command line of `utop`: its clap definition, shared by the binary
//! and the man page and completion generator (`packaging/docgen`).

use std::path::PathBuf;

use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "utop",
    version,
    about = "Monitor a running ustack: pools, ports, protocols, TCP connections",
    after_help = "Keys: Tab/1-5 pane, s sort column, r reverse, / filter (Esc clears), q/Ctrl-C quit.\n\
                  Stacks publish with `--telemetry PATH`; a bare NAME means\n\
                  $XDG_RUNTIME_DIR/ustack/NAME.sock (else /tmp/ustack-$UID/NAME.sock)."
)]
pub struct Cli {
    /// The stack's telemetry socket: a path, or a bare NAME in the default
    /// directory. Without it, utop attaches to the one stack running there.
    #[arg(long, value_name = "PATH")]
    pub telemetry: Option<PathBuf>,
    /// Print one text frame (plain text, no escape codes) and exit.
    #[arg(long)]
    pub once: bool,
    /// Width of the `--once` frame.
    #[arg(long, default_value_t = 160, value_parser = clap::value_parser!(u16).range(40..=1000))]
    pub width: u16,
    /// Show the bytes each frame writes to the terminal.
    #[arg(long)]
    pub debug_draw: bool,
    /// Serve the stack's telemetry as Prometheus metrics on ADDR:PORT
    /// (GET /metrics) instead of showing it; reattaches when the stack
    /// restarts, and serves `ustack_up 0` while it is away.
    #[arg(long, value_name = "ADDR:PORT", conflicts_with = "once")]
    pub prometheus: Option<std::net::SocketAddr>,
}
