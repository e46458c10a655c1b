//! `uping --pinglist` (mesh mode) against several stacks on the sim link at
//! 10,000 pings per second, in virtual time: per-target counts, loss and RTT
//! percentiles.

use std::net::Ipv4Addr;
use std::time::Duration;

use ustack::Instant;
use ustack::sim::{LinkConfig, SimNet, host_config};
use ustack_apps::mesh::{MeshConfig, MeshPinger, Target, parse_pinglist};

fn mesh(link: LinkConfig, targets: Vec<Target>, rate: f64, secs: u64) -> (MeshPinger, SimNet) {
    let mut net = SimNet::new(link);
    for n in 1..=5 {
        net.add(host_config(n));
    }
    let baseline = net.pools_in_use();
    let mut pinger = MeshPinger::new(MeshConfig {
        targets,
        rate,
        duration: Duration::from_secs(secs),
        wait: Duration::from_secs(1),
        size: 56,
        ident: 0x4d31,
    });
    net.run_until(
        Instant::ZERO + Duration::from_secs(secs + 10),
        &mut [&mut pinger],
        |_| false,
    );
    assert!(pinger.done(), "the mesh did not finish");
    net.run_until(net.now + Duration::from_millis(100), &mut [], |_| false);
    assert_eq!(net.pools_in_use(), baseline, "leaked buffers");
    (pinger, net)
}

fn four_targets() -> Vec<Target> {
    parse_pinglist("10.0.0.2 a\n10.0.0.3 b\n10.0.0.4 c\n10.0.0.5 d\n").unwrap()
}

#[test]
fn ten_thousand_pings_per_second_clean() {
    let (p, net) = mesh(LinkConfig::default(), four_targets(), 10_000.0, 2);
    for t in &p.stats {
        assert_eq!(t.sent, 5_000, "{}", t.target.addr);
        assert_eq!(t.received, 5_000, "{}", t.target.addr);
        assert_eq!(t.duplicates, 0);
        assert_eq!(t.rtt.len(), 5_000);
    }
    // Each target's stack answered exactly its share, plus the one
    // uncounted warm-up request that resolved ARP.
    for n in 1..=4 {
        assert_eq!(net.nodes[n].stack.stats().icmp.tx_echo_replies, 5_001);
    }
    let j = p.json();
    assert_eq!(j["sent"], 20_000);
    assert_eq!(j["received"], 20_000);
    let rate = j["rate_achieved"].as_f64().unwrap();
    assert!((9_900.0..=10_100.0).contains(&rate), "{rate}");
    let t0 = &j["targets"][0];
    assert_eq!(t0["label"], "a");
    let (p50, p99, max) = (
        t0["rtt_ms"]["p50"].as_f64().unwrap(),
        t0["rtt_ms"]["p99"].as_f64().unwrap(),
        t0["rtt_ms"]["max"].as_f64().unwrap(),
    );
    assert!(p50 > 0.0 && p50 <= p99 && p99 <= max, "{t0}");
    assert!(p.all_answered());
    let text = p.report();
    assert!(text.contains("20000 requests"), "{text}");
    assert_eq!(text.lines().count(), 2 + 4, "{text}");
}

#[test]
fn loss_is_counted_per_target() {
    let link = LinkConfig {
        loss: 0.05,
        seed: 11,
        ..LinkConfig::default()
    };
    let mut targets = four_targets();
    targets.push(Target {
        addr: Ipv4Addr::new(10, 0, 0, 99),
        label: Some("nobody".into()),
    });
    let (p, _) = mesh(link, targets, 10_000.0, 2);
    for t in &p.stats[..4] {
        // Request and reply each cross a 5% loss link: about 9.75% lost.
        let loss = t.loss_percent();
        assert!((6.0..=14.0).contains(&loss), "{}: {loss}%", t.target.addr);
        assert_eq!(t.received as usize, t.rtt.len() as usize);
    }
    let silent = &p.stats[4];
    assert_eq!(silent.received, 0);
    assert!(silent.sent > 0);
    assert_eq!(silent.loss_percent(), 100.0);
    assert!(!p.all_answered());
}

/// Mesh mode over RDMA UD: four UD responders, 10,000 pings/s in all.
#[test]
fn ud_mesh_at_ten_thousand_per_second() {
    use ustack::node::App;
    use ustack::ud::ping::UdResponder;
    use ustack::ud::{DEFAULT_QKEY, RESPONDER_QPN};
    use ustack_apps::rdma::UdMeshUser;

    let mut net = SimNet::new(LinkConfig::default());
    for n in 1..=5 {
        net.add(host_config(n));
    }
    let baseline = net.pools_in_use();
    let user = UdMeshUser {
        targets: four_targets(),
        rate: 10_000.0,
        duration: Duration::from_secs(2),
        wait: Duration::from_secs(1),
        size: 64,
        qpn: RESPONDER_QPN,
        qkey: DEFAULT_QKEY,
        json: true,
        lcfg: Default::default(),
    };
    let mut pingers = user.pingers();
    let mut responders: Vec<UdResponder> = (0..4)
        .map(|_| UdResponder::new(RESPONDER_QPN, DEFAULT_QKEY))
        .collect();
    {
        let [r1, r2, r3, r4] = &mut responders[..] else {
            unreachable!()
        };
        let apps: &mut [&mut dyn App] = &mut [&mut pingers, r1, r2, r3, r4];
        net.run_until(Instant::ZERO + Duration::from_secs(10), apps, |_| false);
    }
    let (text, json) = user.report(&pingers);
    assert_eq!(json["sent"], 20_000, "{text}");
    assert_eq!(json["received"], 20_000, "{text}");
    for t in json["targets"].as_array().unwrap() {
        assert_eq!(t["sent"], 5_000);
        assert_eq!(t["loss_percent"], 0.0);
        assert!(t["rtt_ms"]["p99"].as_f64().unwrap() >= t["rtt_ms"]["p50"].as_f64().unwrap());
    }
    for r in &responders {
        assert_eq!(r.stats().pongs, 5_000, "{:?}", r.stats());
    }
    assert!(
        text.contains("rdma ud mesh statistics: 4 targets, 20000 requests"),
        "{text}"
    );
    drop(pingers);
    net.run_until(net.now + Duration::from_millis(100), &mut [], |_| false);
    assert_eq!(net.pools_in_use(), baseline, "leaked buffers");
}
