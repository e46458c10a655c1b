//! The sim harness: several stacks on one [`SimLink`], stepped against a
//! virtual clock that jumps to the next event, so a test of a 60 s timer
//! runs in microseconds, deterministically for a given seed.
//!
//! The link itself (a small switch with seeded loss, reordering,
//! duplication, corruption, delay and a rate limit) is a device,
//! [`crate::phy::sim`]; its types are re-exported here so a test takes
//! everything of the sim from one place.

use std::time::Duration;

use smoltcp::wire::{Ipv4Address, Ipv4Cidr};

use crate::node::{App, Node};
use crate::phy::device::Offloads;
use crate::shard::SteerRule;
use crate::stack::{Config, Stack};
use crate::time::{Instant, earliest};

pub use crate::phy::sim::{
    LinkConfig, LinkStats, SIM_BUF_SIZE, SIM_POOL_BUFS, SimLink, SimPort, host_mac,
};

/// Config of sim host `n`: MAC `02:00:00:00:00:n`, address `10.0.0.n/24`,
/// the secret seeded by `n` (a simulation replays exactly).
pub fn host_config(n: u8) -> Config {
    Config::with_seed(
        host_mac(n),
        Ipv4Cidr::new(Ipv4Address::new(10, 0, 0, n), 24),
        u64::from(n),
    )
}

/// Several stacks on one sim link, stepped against a virtual clock.
#[derive(Debug)]
pub struct SimNet {
    /// The wire every node is attached to.
    pub link: SimLink,
    /// The stacks, in the order [`add`](Self::add) returned their indices.
    pub nodes: Vec<Node<SimPort>>,
    /// Virtual time: where the last step ran (starts at [`Instant::ZERO`]).
    pub now: Instant,
}

/// Steps at one instant before the harness forces time forward (guards
/// against an app that always claims work at the current time).
const MAX_STEPS_PER_INSTANT: u32 = 100_000;
/// Idle steps at one instant (nothing moved, yet a deadline claims "now")
/// before the harness skips ahead by [`STALE_SKIP`].
const MAX_IDLE_STEPS_PER_INSTANT: u32 = 16;
const STALE_SKIP: Duration = Duration::from_millis(1);

impl SimNet {
    /// An empty network on a fresh wire with the impairments of `cfg`, at
    /// virtual time zero.
    pub fn new(cfg: LinkConfig) -> Self {
        SimNet {
            link: SimLink::new(cfg),
            nodes: Vec::new(),
            now: Instant::ZERO,
        }
    }

    /// Add a stack; returns its index.
    pub fn add(&mut self, cfg: Config) -> usize {
        let port = self.link.attach(cfg.mac, SIM_POOL_BUFS);
        self.nodes.push(Node::new(Stack::new(cfg), port));
        self.nodes.len() - 1
    }

    /// Add a host whose port plays a NIC with `offloads` (see
    /// [`SimLink::attach_offloaded`]). Returns its index.
    pub fn add_offloaded(&mut self, cfg: Config, offloads: Offloads) -> usize {
        let port = self.link.attach_offloaded(cfg.mac, SIM_POOL_BUFS, offloads);
        self.nodes.push(Node::new(Stack::new(cfg), port));
        self.nodes.len() - 1
    }

    /// Add a host with `queues` queues: one stack per queue (shards wired
    /// to each other, `steer` rules applied), fed by software RSS. Returns
    /// the node indices, shard 0 first.
    pub fn add_sharded(&mut self, cfg: Config, queues: usize, steer: &[SteerRule]) -> Vec<usize> {
        let ports = self.link.attach_queues(cfg.mac, queues, SIM_POOL_BUFS);
        let shards = crate::shard::shards(ports.len(), steer);
        let first = self.nodes.len();
        for (port, shard) in ports.into_iter().zip(shards) {
            let mut c = cfg.clone();
            c.shard = shard.id;
            // One gratuitous ARP per host is enough.
            c.announce &= shard.id.index == 0;
            self.nodes.push(Node::sharded(Stack::new(c), port, shard));
        }
        (first..self.nodes.len()).collect()
    }

    /// Step every node once at `self.now`; `apps[i]` runs in node `i` (nodes
    /// without an app run `()`). Returns whether anything moved.
    pub fn step(&mut self, apps: &mut [&mut dyn App]) -> bool {
        let mut busy = false;
        for (i, node) in self.nodes.iter_mut().enumerate() {
            let r = match apps.get_mut(i) {
                Some(app) => node.step(self.now, &mut **app),
                None => node.step(self.now, &mut ()),
            };
            busy |= r.busy();
        }
        busy
    }

    /// The earliest time any node or app has work.
    pub fn next_wakeup(&self, apps: &[&mut dyn App]) -> Option<Instant> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| match apps.get(i) {
                Some(app) => n.poll_at(&**app),
                None => n.poll_at(&()),
            })
            .fold(None, earliest)
    }

    /// Run in virtual time until `done` holds (true) or `deadline` passes or
    /// nothing is left to happen (false).
    pub fn run_until(
        &mut self,
        deadline: Instant,
        apps: &mut [&mut dyn App],
        mut done: impl FnMut(&mut SimNet) -> bool,
    ) -> bool {
        let mut steps_here = 0u32;
        let mut idle_here = 0u32;
        loop {
            let busy = self.step(apps);
            if done(self) {
                return true;
            }
            let wake = self.next_wakeup(apps);
            let next = if busy && steps_here < MAX_STEPS_PER_INSTANT {
                steps_here += 1;
                self.now
            } else {
                match wake {
                    None if !busy => return false,
                    Some(t) if t > self.now => t,
                    _ if busy => self.now + Duration::from_micros(1),
                    _ if idle_here < MAX_IDLE_STEPS_PER_INSTANT => {
                        idle_here += 1;
                        self.now
                    }
                    _ => self.now + STALE_SKIP,
                }
            };
            if next > self.now {
                steps_here = 0;
                idle_here = 0;
            }
            if next > deadline {
                self.now = deadline;
                return false;
            }
            self.now = next;
        }
    }

    /// Buffers of all port pools currently handed out (frames in flight count).
    pub fn pools_in_use(&self) -> usize {
        self.nodes.iter().map(|n| n.dev().pool().in_use()).sum()
    }
}
