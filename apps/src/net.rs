//! The `NET` flags every app takes (the runtime's [`NetArgs`]), and the
//! launcher calls with them.

use std::sync::atomic::AtomicBool;

use anyhow::{Result, bail};
use ustack::node::App;
use ustack::shard::{ShardId, SteerRule};
use ustack_runtime::net::ShardResult;

pub use ustack_runtime::cli::{CoreList, NetArgs};
pub use ustack_runtime::net::NodeRunner;

/// Run one poll loop per core of `--cores` (see [`ustack_runtime::net::run_sharded`]).
pub fn run_sharded<A, F>(
    net: &NetArgs,
    steer: &[SteerRule],
    duration: Option<std::time::Duration>,
    stop: &AtomicBool,
    publisher: Option<&ustack_runtime::telemetry::Publisher>,
    make: F,
) -> Result<Vec<ShardResult<A>>>
where
    A: App + Send,
    F: Fn(ShardId) -> A + Sync,
{
    if net.cores.is_none() {
        bail!("--cores LIST is required for a sharded run");
    }
    let cfg = net.net_config()?;
    Ok(ustack_runtime::net::run_sharded(
        &cfg, steer, duration, stop, publisher, make,
    )?)
}

/// Open the backend the flags name and hand a node on it to `user`.
pub fn with_node<U: NodeRunner<Error = anyhow::Error>>(
    net: &NetArgs,
    user: U,
) -> Result<U::Output> {
    ustack_runtime::net::with_node(&net.net_config()?, user)
}
