//! One stack per queue on the sim link: software RSS over 4 queues on each
//! host, 10,000 connections, every byte checked, no flow on two shards.

use std::net::SocketAddrV4;
use std::time::Duration;

use ustack::node::App;
use ustack::shard::{Steer, SteerRule};
use ustack::sim::{LinkConfig, SimNet, host_config};
use ustack::{Device, Stack};
use ustack_kit::bulk::{BulkRecv, BulkSend};
use ustack_kit::ping::{Pinger, PingerConfig};

mod common;
use common::{ManyClients, small_buffers};

fn link() -> LinkConfig {
    LinkConfig {
        delay: Duration::from_micros(50),
        queue_frames: 1 << 16,
        ..LinkConfig::default()
    }
}

#[test]
fn ten_thousand_connections_over_four_queues_stay_on_their_shard() {
    const QUEUES: usize = 4;
    const PER_SHARD: usize = 2_500;
    const BYTES: u64 = 2_000;
    let mut net = SimNet::new(link());
    let clients = net.add_sharded(small_buffers(1), QUEUES, &[]);
    let servers = net.add_sharded(small_buffers(2), QUEUES, &[]);
    let dst = SocketAddrV4::new(net.nodes[servers[0]].stack.ip(), 5001);
    let mut many: Vec<ManyClients> = (0..QUEUES)
        .map(|_| ManyClients {
            dst,
            total: PER_SHARD,
            bytes: BYTES,
            per_poll: 250,
            clients: Vec::new(),
        })
        .collect();
    let mut sinks: Vec<BulkRecv> = (0..QUEUES)
        .map(|_| BulkRecv::new(5001, PER_SHARD))
        .collect();
    for _ in 0..10_000 {
        let mut apps: Vec<&mut dyn App> = Vec::new();
        for m in many.iter_mut() {
            apps.push(m);
        }
        for s in sinks.iter_mut() {
            apps.push(s);
        }
        net.run_until(net.now + Duration::from_millis(100), &mut apps, |_| false);
        let completed: usize = sinks.iter().map(|s| s.completed.len()).sum();
        let sent = many.iter().all(|m| m.clients.iter().all(BulkSend::done));
        if completed == QUEUES * PER_SHARD && sent {
            break;
        }
    }
    for (i, m) in many.iter().enumerate() {
        assert_eq!(m.clients.len(), PER_SHARD);
        let errors = m.clients.iter().filter(|c| c.error.is_some()).count();
        assert_eq!(errors, 0, "client shard {i}");
    }
    let want_crc = many[0].clients[0].transfer.crc;
    for (k, sink) in sinks.iter().enumerate() {
        assert_eq!(sink.errors, vec![], "server shard {k}");
        assert_eq!(sink.corrupt_bytes, 0, "server shard {k}");
        assert!(
            sink.completed
                .iter()
                .all(|t| t.bytes == BYTES && t.crc == want_crc),
            "server shard {k}: a transfer differs"
        );
    }
    let total: usize = sinks.iter().map(|s| s.completed.len()).sum();
    assert_eq!(total, QUEUES * PER_SHARD);
    // Each client shard's flows hashed to the server shard of the same
    // index, and nothing was answered by a shard that did not own the flow.
    for q in 0..QUEUES {
        let c = net.nodes[clients[q]].stack.stats().tcp;
        let s = net.nodes[servers[q]].stack.stats().tcp;
        assert_eq!(c.active_opens, PER_SHARD as u64, "client shard {q}");
        assert_eq!(s.passive_opens, PER_SHARD as u64, "server shard {q}");
        assert_eq!(sinks[q].completed.len(), PER_SHARD, "server shard {q}");
        assert_eq!((c.resets_sent, s.resets_sent), (0, 0), "shard {q}");
        assert_eq!((c.resets_received, s.resets_received), (0, 0), "shard {q}");
        let port = net.nodes[servers[q]].dev().port_stats();
        assert!(port.rx_packets > 0 && port.tx_packets > 0, "shard {q}");
    }
    // ARP arrived on queue 0 and reached the other shards as copies.
    for &n in clients.iter().chain(&servers).skip(1) {
        let sh = net.nodes[n].port.shard.as_ref().unwrap();
        assert!(sh.stats.mail_in > 0 || sh.id.index == 0);
    }
    net.run_until(net.now + Duration::from_secs(130), &mut [], |_| false);
    for n in &net.nodes {
        assert_eq!(n.stack.tcp_ref().connections().count(), 0);
    }
    assert_eq!(net.pools_in_use(), 0);
}

#[test]
fn steered_pings_reach_the_shard_that_sent_them() {
    // A pinger on shard 0 of a 4-queue host: the replies hash by address
    // pair to some queue, and the ICMP rule brings them home.
    let mut net = SimNet::new(link());
    let rule = SteerRule {
        what: Steer::Icmp,
        to: 0,
    };
    let me = net.add_sharded(host_config(1), 4, &[rule]);
    // A peer whose replies hash to a queue other than 0.
    let my_ip = net.nodes[me[0]].stack.ip();
    let n = (2..=254u8)
        .find(|&n| {
            let h = ustack::shard::rss::ip_hash(my_ip, host_config(n).ip.address());
            ustack::shard::rss::queue_of_hash(h, 4) != 0
        })
        .unwrap();
    let peer = net.add(host_config(n));
    let target = net.nodes[peer].stack.ip();
    let mut cfg = PingerConfig::new(target);
    cfg.count = Some(20);
    cfg.interval = Duration::from_millis(10);
    cfg.timeout = Duration::from_millis(200);
    let mut pinger = Pinger::new(cfg);
    let (mut a, mut b, mut c) = ((), (), ());
    net.run_until(
        net.now + Duration::from_secs(3),
        &mut [&mut pinger, &mut a, &mut b, &mut c],
        |_| false,
    );
    assert_eq!(pinger.summary().received, 20);
    let steered: u64 = me
        .iter()
        .map(|&n| net.nodes[n].port.shard.as_ref().unwrap().stats.steered_out)
        .sum();
    assert_eq!(steered, 20, "every reply arrived on another queue");
    assert_eq!(net.pools_in_use(), 0);
}

#[test]
fn segments_on_the_wrong_queue_are_passed_to_the_owning_shard() {
    // A driver whose hash disagrees with ours (af_packet's fan-out): the
    // client's two stacks believe they sit on each other's queue, so every
    // flow they open hashes to the other queue. The shard that gets a
    // segment it does not own passes it on; transfers stay byte-exact and
    // nobody resets anything.
    let mut net = SimNet::new(link());
    let cfg = host_config(1);
    let ports = net
        .link
        .attach_queues(cfg.mac, 2, ustack::sim::SIM_POOL_BUFS);
    let shards = ustack::shard::shards(2, &[]);
    for (port, shard) in ports.into_iter().zip(shards) {
        let mut c = cfg.clone();
        c.shard = ustack::shard::ShardId {
            index: 1 - shard.id.index,
            count: 2,
        };
        c.announce &= shard.id.index == 0;
        net.nodes
            .push(ustack::node::Node::sharded(Stack::new(c), port, shard));
    }
    let server = net.add(host_config(2));
    let dst = SocketAddrV4::new(net.nodes[server].stack.ip(), 5001);
    let mut clients = ManyClients {
        dst,
        total: 20,
        bytes: 100_000,
        per_poll: 20,
        clients: Vec::new(),
    };
    let mut idle = ();
    let mut sink = BulkRecv::new(5001, 64);
    net.run_until(
        net.now + Duration::from_secs(30),
        &mut [&mut clients, &mut idle, &mut sink],
        |_| false,
    );
    assert!(
        clients
            .clients
            .iter()
            .all(|c| c.done() && c.error.is_none())
    );
    assert_eq!(sink.completed.len(), 20);
    assert_eq!(sink.corrupt_bytes, 0);
    let passed = net.nodes[1].port.shard.as_ref().unwrap().stats.passed_on;
    assert!(passed > 0, "the replies reached queue 1 and were passed on");
    let c0 = net.nodes[0].stack.stats().tcp;
    let c1 = net.nodes[1].stack.stats().tcp;
    assert_eq!((c0.active_opens, c1.active_opens), (20, 0));
    assert_eq!((c0.resets_sent, c1.resets_sent), (0, 0));
    assert_eq!(net.nodes[server].stack.stats().tcp.resets_received, 0);
    net.run_until(net.now + Duration::from_secs(130), &mut [], |_| false);
    assert_eq!(net.pools_in_use(), 0);
}
