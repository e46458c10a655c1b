//! One stack per core: [`run_sharded`] (an app per shard) and
//! [`run_primary`] (a single-node app on the first core, the others
//! answering beside it).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ustack::Stack;
use ustack::node::{App, Node, Snapshot};
use ustack::phy::device::Device;
use ustack::shard::{Shard, ShardId, Steer, SteerRule};

use super::open::start_metrics;
use super::{ConfigError, Error, NetConfig, NodeRunner};
use crate::clock::Clock;
use crate::poll::{IdleMode, LoopConfig};
use crate::telemetry::Publisher;

/// One shard's app and its last snapshot, after a sharded run.
pub type ShardResult<A> = (A, Option<Snapshot>);

/// The queue pairs of the DPDK port, one per core of `cfg.cores`.
#[cfg(feature = "dpdk")]
fn open_dpdk_queues(cfg: &NetConfig, queues: usize) -> Result<Vec<ustack_dpdk::DpdkPort>, Error> {
    use super::open::dpdk_port_config;
    use ustack_dpdk::{DpdkPort, Eal};
    let super::Backend::Dpdk { eal_args, port, .. } = &cfg.backend else {
        return Err(ConfigError::CoresNeedDpdk.into());
    };
    if cfg.capture.is_some() || cfg.impair.is_some() {
        return Err(ConfigError::CoresWithWrappers.into());
    }
    let eal = Eal::init(eal_args)?;
    let queues = u16::try_from(queues).unwrap_or(u16::MAX);
    let ports = DpdkPort::open_queues(&eal, &dpdk_port_config(cfg), queues)?;
    if let Some(p) = ports.first() {
        let info = p.port().info();
        tracing::info!(
            "DPDK port {} ({}): {} queue pairs, {}",
            port,
            info.driver,
            ports.len(),
            if info.rss {
                "symmetric RSS"
            } else {
                "the driver's own flow distribution"
            }
        );
    }
    Ok(ports)
}

/// Without DPDK there are no queues to shard over.
#[cfg(not(feature = "dpdk"))]
fn open_dpdk_queues(_: &NetConfig, _: usize) -> Result<Vec<ustack::sim::SimPort>, Error> {
    Err(Error::Unsupported(
        "this build has no DPDK backend: rebuild with --features dpdk (needs dpdk-dev)",
    ))
}

/// The cores of a sharded configuration.
fn cores(cfg: &NetConfig) -> Result<Vec<usize>, Error> {
    let cores = cfg.cores.clone().unwrap_or_default();
    if cores.is_empty() {
        return Err(ConfigError::NoCores.into());
    }
    Ok(cores)
}

/// The stack of shard `id`: the host's configuration with its shard, one
/// gratuitous ARP per host.
fn shard_stack(cfg: &NetConfig, id: ShardId) -> Stack {
    let mut c = cfg.stack.clone();
    c.shard = id;
    c.announce &= id.index == 0;
    Stack::new(c)
}

/// Run one poll loop per core of `cfg.cores`, each on its own queue pair of
/// the DPDK port with its own stack (shard `i` of N, `steer` rules between
/// them) and the app `make(shard)`, until every app exits, the duration
/// passes or `stop` is set. Snapshots of all shards go to `publisher`,
/// which publishes their totals and each shard's figures.
pub fn run_sharded<A, F>(
    cfg: &NetConfig,
    steer: &[SteerRule],
    duration: Option<Duration>,
    stop: &AtomicBool,
    publisher: Option<&Publisher>,
    make: F,
) -> Result<Vec<ShardResult<A>>, Error>
where
    A: App + Send,
    F: Fn(ShardId) -> A + Sync,
{
    let cores = cores(cfg)?;
    let _endpoint = start_metrics(cfg)?;
    let metrics = cfg.metrics.map(|_| cfg.metrics_feed.clone());
    if let (Some(feed), Some(p)) = (&metrics, publisher) {
        feed.set_publisher(p.handle());
    }
    let ports = open_dpdk_queues(cfg, cores.len())?;
    run_on_queues(cfg, &cores, ports, steer, duration, stop, publisher, make)
}

/// [`run_sharded`] on queues already open, one per core.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_on_queues<D, A, F>(
    cfg: &NetConfig,
    cores: &[usize],
    ports: Vec<D>,
    steer: &[SteerRule],
    duration: Option<Duration>,
    stop: &AtomicBool,
    publisher: Option<&Publisher>,
    make: F,
) -> Result<Vec<ShardResult<A>>, Error>
where
    D: Device + Send,
    D::Buf: Send,
    A: App + Send,
    F: Fn(ShardId) -> A + Sync,
{
    let metrics = cfg.metrics.map(|_| cfg.metrics_feed.clone());
    let shards = ustack::shard::shards(cores.len(), steer);
    let idle = if cfg.backoff {
        LoopConfig::default().idle
    } else {
        IdleMode::BusyPoll
    };
    std::thread::scope(|scope| {
        let threads: Vec<_> = ports
            .into_iter()
            .zip(shards)
            .zip(cores)
            .map(|((port, shard), &core)| {
                let stack = shard_stack(cfg, shard.id);
                let mut app = make(shard.id);
                let lcfg = LoopConfig {
                    core: Some(core),
                    idle,
                    duration,
                    metrics: metrics.clone(),
                    ..LoopConfig::default()
                };
                std::thread::Builder::new()
                    .name(format!("ustack-core{core}"))
                    .spawn_scoped(scope, move || {
                        let mut node = Node::sharded(stack, port, shard);
                        let mut last = None;
                        let r = crate::poll::run(
                            &mut node,
                            &mut app,
                            &lcfg,
                            &Clock::new(),
                            || stop.load(Ordering::Relaxed),
                            |s| {
                                if let Some(p) = publisher {
                                    p.publish(s);
                                }
                                last = Some(s.clone());
                            },
                        );
                        // One shard failing (or exiting) ends the others.
                        stop.store(true, Ordering::Relaxed);
                        r.map(|()| (app, last))
                    })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| match t {
                Ok(t) => t.join().map_err(|_| Error::Panicked)?.map_err(Error::from),
                Err(e) => Err(Error::Thread(e)),
            })
            .collect()
    })
}

/// An app that runs on one node (ping, iperf3) on a host with several
/// cores: the app runs on shard 0 (the first core) and the other shards
/// answer ARP and ping and hand shard 0 what is its own: ICMP and RoCE
/// (UDP 4791) by steering, TCP segments by passing on what they do not own.
pub fn run_primary<U: NodeRunner>(cfg: &NetConfig, user: U) -> Result<U::Output, U::Error> {
    let cores = cores(cfg)?;
    let mut ports = open_dpdk_queues(cfg, cores.len())?;
    let steer = [
        SteerRule {
            what: Steer::Icmp,
            to: 0,
        },
        SteerRule {
            what: Steer::UdpPort(ustack::wire::roce::ROCE_PORT),
            to: 0,
        },
    ];
    let mut shards = ustack::shard::shards(cores.len(), &steer);
    let idle = cfg.loop_config().idle;
    let stop = Arc::new(AtomicBool::new(false));
    if ports.is_empty() || shards.is_empty() {
        return Err(Error::State("the port has no queue").into());
    }
    let (port0, shard0): (_, Shard) = (ports.remove(0), shards.remove(0));
    let node0 = Node::sharded(shard_stack(cfg, shard0.id), port0, shard0);
    std::thread::scope(|scope| {
        for ((port, shard), &core) in ports.into_iter().zip(shards).zip(&cores[1..]) {
            let mut node = Node::sharded(shard_stack(cfg, shard.id), port, shard);
            let (stop, lcfg) = (
                &stop,
                LoopConfig {
                    core: Some(core),
                    idle,
                    ..LoopConfig::default()
                },
            );
            let spawned = std::thread::Builder::new()
                .name(format!("ustack-core{core}"))
                .spawn_scoped(scope, move || {
                    let r = crate::poll::run(
                        &mut node,
                        &mut (),
                        &lcfg,
                        &Clock::new(),
                        || stop.load(Ordering::Relaxed),
                        |_| {},
                    );
                    if let Err(e) = r {
                        tracing::error!("core {core}: {e}");
                    }
                });
            if let Err(e) = spawned {
                stop.store(true, Ordering::Relaxed);
                return Err(Error::Thread(e).into());
            }
        }
        crate::poll::pin_to_core(cores[0]).map_err(Error::from)?;
        let out = user.run(node0);
        stop.store(true, Ordering::Relaxed);
        out
    })
}
