//! `uping --pinglist` (mesh mode) against several stacks on the sim link,
//! in virtual time: per-(target, probe) counts, loss and RTT percentiles,
//! every probe type (icmp, udp, tcp, ud) against `ustack run`'s services,
//! the Prometheus families, and a ping list changed while running.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use ustack::node::{App, Control};
use ustack::sim::{LinkConfig, SimNet, host_config};
use ustack::{Instant, Stack};
use ustack_apps::mesh::{
    ListSource, MeshConfig, MeshMetrics, MeshPinger, Probe, Reloader, Target, parse_pinglist,
};
use ustack_apps::services::Services;
use ustack_kit::ud_ping::UdResponder;
use ustack_runtime::metrics::{Family, MetricsSource, Value};

fn mesh(link: LinkConfig, targets: Vec<Target>, rate: f64, secs: u64) -> (MeshPinger, SimNet) {
    let mut net = SimNet::new(link);
    for n in 1..=5 {
        net.add(host_config(n));
    }
    let baseline = net.pools_in_use();
    let mut pinger = MeshPinger::new(MeshConfig::new(targets, rate, Duration::from_secs(secs)));
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
        assert_eq!(t.probe, Probe::Icmp);
        assert_eq!(t.sent, 5_000, "{}", t.target.addr);
        assert_eq!(t.received, 5_000, "{}", t.target.addr);
        assert_eq!(t.lost, 0);
        assert_eq!(t.duplicates, 0);
        assert_eq!(t.rtt.len(), 5_000);
        assert_eq!(t.rtt_buckets.count(), 5_000);
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
    assert_eq!(t0["probe"], "icmp");
    let (p50, p99, max) = (
        t0["rtt_ms"]["p50"].as_f64().unwrap(),
        t0["rtt_ms"]["p99"].as_f64().unwrap(),
        t0["rtt_ms"]["max"].as_f64().unwrap(),
    );
    assert!(p50 > 0.0 && p50 <= p99 && p99 <= max, "{t0}");
    assert!(p.all_answered());
    let text = p.report();
    assert!(text.contains("20000 requests"), "{text}");
    assert!(text.lines().nth(1).unwrap().contains("probe"), "{text}");
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
    targets.push(Target::new(
        Ipv4Addr::new(10, 0, 0, 99),
        Some("nobody"),
        Probe::Icmp,
    ));
    let (p, _) = mesh(link, targets, 10_000.0, 2);
    for t in &p.stats[..4] {
        // Request and reply each cross a 5% loss link: about 9.75% lost.
        let loss = t.loss_percent();
        assert!((6.0..=14.0).contains(&loss), "{}: {loss}%", t.target.addr);
        assert_eq!(t.received as usize, t.rtt.len() as usize);
        // Every probe ended one way or the other.
        assert_eq!(t.received + t.lost, t.sent, "{}", t.target.addr);
    }
    let silent = &p.stats[4];
    assert_eq!(silent.received, 0);
    assert!(silent.sent > 0);
    assert_eq!(silent.lost, silent.sent);
    assert_eq!(silent.loss_percent(), 100.0);
    assert_eq!(silent.up, Some(false));
    assert!(!p.all_answered());
}

/// What `ustack run` serves to a mesh: TCP and UDP echo, the UD responder
/// (and ICMP, which every stack answers).
#[derive(Debug)]
struct Responder {
    svc: Services,
    ud: UdResponder,
}

impl Responder {
    fn new() -> Self {
        Responder {
            svc: Services::new(),
            ud: UdResponder::default(),
        }
    }
}

impl App for Responder {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        self.svc.poll(now, stack);
        self.ud.poll(now, stack);
        Control::Continue
    }
    fn poll_at(&self) -> Option<Instant> {
        self.ud.poll_at()
    }
}

fn family<'a>(fams: &'a [Family], name: &str) -> &'a Family {
    fams.iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no family {name}"))
}

/// The sample of (target, probe) in a family.
fn sample<'a>(f: &'a Family, target: &str, probe: &str) -> Option<&'a Value> {
    f.samples
        .iter()
        .find(|s| {
            s.labels.contains(&("target".into(), target.into()))
                && s.labels.contains(&("probe".into(), probe.into()))
        })
        .map(|s| &s.value)
}

fn number(v: Option<&Value>) -> f64 {
    match v {
        Some(Value::Number(n)) => *n,
        other => panic!("not a number: {other:?}"),
    }
}

#[test]
fn every_probe_type_against_ustack_run_services() {
    let mut net = SimNet::new(LinkConfig::default());
    for n in 1..=3 {
        net.add(host_config(n));
    }
    let baseline = net.pools_in_use();
    let list = "10.0.0.2 a probes=icmp,udp,tcp,ud\n\
                10.0.0.3 b probes=tcp,udp,ud,icmp\n\
                10.0.0.99 ghost probes=icmp,udp,tcp,ud\n";
    let metrics = Arc::new(MeshMetrics::new());
    let mut pinger = MeshPinger::new(MeshConfig::new(
        parse_pinglist(list).unwrap(),
        4_000.0,
        Duration::from_secs(2),
    ))
    .with_metrics(metrics.clone());
    let (mut r1, mut r2) = (Responder::new(), Responder::new());
    net.run_until(
        Instant::ZERO + Duration::from_secs(12),
        &mut [&mut pinger, &mut r1, &mut r2],
        |_| false,
    );
    assert!(pinger.done(), "the mesh did not finish");
    assert_eq!(pinger.stats.len(), 12);
    let text = pinger.report();
    for addr in [Ipv4Addr::new(10, 0, 0, 2), Ipv4Addr::new(10, 0, 0, 3)] {
        for probe in [Probe::Icmp, Probe::Udp, Probe::Tcp, Probe::Ud] {
            let s = pinger.series(addr, probe).unwrap();
            // 4,000/s over 12 series for 2 s: about 666 each.
            assert!(s.sent >= 600, "{addr} {probe}: sent {}\n{text}", s.sent);
            assert_eq!(s.received, s.sent, "{addr} {probe}\n{text}");
            assert_eq!(s.lost, 0, "{addr} {probe}: {:?}", s.last_error);
            assert_eq!(s.up, Some(true), "{addr} {probe}");
            // The TCP connect is a probe without an RTT sample.
            let rtts = if probe == Probe::Tcp {
                s.sent - 1
            } else {
                s.sent
            };
            assert_eq!(s.rtt_buckets.count(), rtts, "{addr} {probe}");
            assert_eq!(s.rtt.len(), rtts, "{addr} {probe}");
        }
    }
    for n in [1, 2] {
        let svc = if n == 1 { &r1 } else { &r2 };
        let udp = pinger
            .series(Ipv4Addr::new(10, 0, 0, n as u8 + 1), Probe::Udp)
            .unwrap();
        assert_eq!(svc.svc.udp_echoed, udp.sent, "the UDP echo answered each");
        let ud = pinger
            .series(Ipv4Addr::new(10, 0, 0, n as u8 + 1), Probe::Ud)
            .unwrap();
        assert_eq!(svc.ud.stats().pongs, ud.sent);
    }
    let ghost = Ipv4Addr::new(10, 0, 0, 99);
    for probe in [Probe::Icmp, Probe::Udp, Probe::Tcp, Probe::Ud] {
        let s = pinger.series(ghost, probe).unwrap();
        assert!(s.sent > 0, "{probe}");
        assert_eq!(s.received, 0, "{probe}");
        assert_eq!(s.lost, s.sent, "{probe}: every probe ran out");
        assert_eq!(s.up, Some(false), "{probe}");
        assert!(s.last_error.is_some(), "{probe}");
    }
    assert!(!pinger.all_answered());

    // The metrics as the endpoint would serve them.
    let mut fams = Vec::new();
    metrics.collect(&mut fams);
    let sent = family(&fams, "ustack_mesh_probes_sent_total");
    assert_eq!(sent.samples.len(), 12);
    let s = pinger
        .series(Ipv4Addr::new(10, 0, 0, 2), Probe::Udp)
        .unwrap();
    assert_eq!(number(sample(sent, "10.0.0.2", "udp")), s.sent as f64);
    assert!(
        sent.samples[0]
            .labels
            .contains(&("source".into(), "10.0.0.1".into()))
    );
    assert!(
        sent.samples[0]
            .labels
            .contains(&("target_name".into(), "a".into()))
    );
    let lost = family(&fams, "ustack_mesh_probes_lost_total");
    assert_eq!(number(sample(lost, "10.0.0.2", "tcp")), 0.0);
    let ghost_tcp = pinger.series(ghost, Probe::Tcp).unwrap();
    assert_eq!(
        number(sample(lost, "10.0.0.99", "tcp")),
        ghost_tcp.lost as f64
    );
    let up = family(&fams, "ustack_mesh_target_up");
    assert_eq!(number(sample(up, "10.0.0.3", "ud")), 1.0);
    assert_eq!(number(sample(up, "10.0.0.99", "icmp")), 0.0);
    let connect = family(&fams, "ustack_mesh_tcp_connect_seconds");
    assert_eq!(connect.samples.len(), 3, "one per tcp series");
    match sample(connect, "10.0.0.2", "tcp") {
        Some(Value::Histogram { count, buckets, .. }) => {
            assert_eq!(*count, 1);
            assert_eq!(buckets.last().unwrap().1, 1, "under 1 s");
        }
        other => panic!("{other:?}"),
    }
    match sample(family(&fams, "ustack_mesh_rtt_seconds"), "10.0.0.3", "icmp") {
        Some(Value::Histogram { count, buckets, .. }) => {
            let s = pinger
                .series(Ipv4Addr::new(10, 0, 0, 3), Probe::Icmp)
                .unwrap();
            assert_eq!(*count, s.received);
            assert_eq!(buckets.last().unwrap().1, *count, "all under 1 s");
        }
        other => panic!("{other:?}"),
    }
    let errors = family(&fams, "ustack_mesh_last_error_info");
    assert!(
        errors
            .samples
            .iter()
            .all(|s| s.labels.contains(&("target".into(), "10.0.0.99".into()))),
        "only the ghost has errors: {errors:?}"
    );
    assert_eq!(errors.samples.len(), 4);
    assert_eq!(
        number(Some(&family(&fams, "ustack_mesh_targets").samples[0].value)),
        3.0
    );

    // The services close their side after the mesh's FIN: no buffer kept.
    net.run_until(
        net.now + Duration::from_secs(1),
        &mut [&mut (), &mut r1, &mut r2],
        |_| false,
    );
    assert_eq!(net.pools_in_use(), baseline, "leaked buffers");
}

/// A dual-stack mesh: the same four probes to one host by its IPv4
/// address and to another by its IPv6 one (UD over its IPv6 GID), every
/// probe answered, and the metrics carry the family and the source of
/// the target's family.
#[test]
fn every_probe_type_over_ipv6_beside_ipv4() {
    let mut net = SimNet::new(LinkConfig::default());
    for n in 1..=3u16 {
        let mut c = host_config(n as u8);
        c.ipv6 = vec![ustack::wire::Ipv6Cidr::new(
            Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, n),
            64,
        )];
        net.add(c);
    }
    let baseline = net.pools_in_use();
    let list = "10.0.0.2 four probes=icmp,udp,tcp,ud\n\
                fd77::3 six probes=icmp,udp,tcp,ud\n";
    let metrics = Arc::new(MeshMetrics::new());
    let mut pinger = MeshPinger::new(MeshConfig::new(
        parse_pinglist(list).unwrap(),
        2_000.0,
        Duration::from_secs(2),
    ))
    .with_metrics(metrics.clone());
    let (mut r1, mut r2) = (Responder::new(), Responder::new());
    net.run_until(
        Instant::ZERO + Duration::from_secs(12),
        &mut [&mut pinger, &mut r1, &mut r2],
        |_| false,
    );
    assert!(pinger.done(), "the mesh did not finish");
    let text = pinger.report();
    let six: IpAddr = "fd77::3".parse().unwrap();
    for addr in [IpAddr::from([10, 0, 0, 2]), six] {
        for probe in [Probe::Icmp, Probe::Udp, Probe::Tcp, Probe::Ud] {
            let s = pinger.series(addr, probe).unwrap();
            assert!(s.sent >= 400, "{addr} {probe}: sent {}\n{text}", s.sent);
            assert_eq!(s.received, s.sent, "{addr} {probe}\n{text}");
            assert_eq!(s.lost, 0, "{addr} {probe}: {:?}", s.last_error);
        }
    }
    assert!(text.contains("fd77::3"), "{text}");
    assert_eq!(
        r2.ud.stats().pongs,
        pinger.series(six, Probe::Ud).unwrap().sent
    );
    let st = net.nodes[2].stack.stats();
    assert!(st.ipv6.rx_packets > 1_000, "{:?}", st.ipv6);
    let mut fams = Vec::new();
    metrics.collect(&mut fams);
    let sent = family(&fams, "ustack_mesh_probes_sent_total");
    for x in &sent.samples {
        let v6 = x.labels.contains(&("target".into(), "fd77::3".into()));
        let (source, fam) = if v6 {
            ("fd77::1", "ipv6")
        } else {
            ("10.0.0.1", "ipv4")
        };
        assert!(
            x.labels.contains(&("source".into(), source.into())),
            "{x:?}"
        );
        assert!(x.labels.contains(&("family".into(), fam.into())), "{x:?}");
    }
    net.run_until(
        net.now + Duration::from_secs(1),
        &mut [&mut (), &mut r1, &mut r2],
        |_| false,
    );
    assert_eq!(net.pools_in_use(), baseline, "leaked buffers");
}

/// Mesh mode over RDMA UD: four UD responders, 10,000 pings/s in all.
#[test]
fn ud_mesh_at_ten_thousand_per_second() {
    use ustack::socket::ud::{DEFAULT_QKEY, RESPONDER_QPN};

    let mut net = SimNet::new(LinkConfig::default());
    for n in 1..=5 {
        net.add(host_config(n));
    }
    let baseline = net.pools_in_use();
    let targets = ustack_apps::mesh::parse_pinglist_with(
        "10.0.0.2 a\n10.0.0.3 b\n10.0.0.4 c\n10.0.0.5 d\n",
        Probe::Ud,
    )
    .unwrap();
    let mut pinger = MeshPinger::new(MeshConfig::new(targets, 10_000.0, Duration::from_secs(2)));
    let mut responders: Vec<UdResponder> = (0..4)
        .map(|_| UdResponder::new(RESPONDER_QPN, DEFAULT_QKEY))
        .collect();
    {
        let [r1, r2, r3, r4] = &mut responders[..] else {
            unreachable!()
        };
        let apps: &mut [&mut dyn App] = &mut [&mut pinger, r1, r2, r3, r4];
        net.run_until(Instant::ZERO + Duration::from_secs(10), apps, |_| false);
    }
    assert!(pinger.done());
    let (text, json) = (pinger.report(), pinger.json());
    assert_eq!(json["sent"], 20_000, "{text}");
    assert_eq!(json["received"], 20_000, "{text}");
    for t in json["targets"].as_array().unwrap() {
        assert_eq!(t["probe"], "ud");
        assert_eq!(t["sent"], 5_000);
        assert_eq!(t["loss_percent"], 0.0);
        assert!(t["rtt_ms"]["p99"].as_f64().unwrap() >= t["rtt_ms"]["p50"].as_f64().unwrap());
    }
    for r in &responders {
        assert_eq!(r.stats().pongs, 5_000, "{:?}", r.stats());
    }
    assert!(
        text.contains("mesh ping statistics: 4 targets, 20000 requests"),
        "{text}"
    );
    net.run_until(net.now + Duration::from_millis(100), &mut [], |_| false);
    assert_eq!(net.pools_in_use(), baseline, "leaked buffers");
}

/// A ping list file changed while the mesh runs (until stopped): the new
/// target starts, the removed one stops and leaves the metrics.
#[test]
fn pinglist_file_reloaded_while_running() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mesh.txt");
    let first = "10.0.0.2 a\n";
    std::fs::write(&path, first).unwrap();
    let mut net = SimNet::new(LinkConfig::default());
    for n in 1..=3 {
        net.add(host_config(n));
    }
    let metrics = Arc::new(MeshMetrics::new());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let reloader = Reloader {
        source: ListSource::File(path.clone()),
        default_probe: Probe::Icmp,
        every: Duration::from_millis(20),
        current: first.into(),
        errors: metrics.pinglist_errors.clone(),
        stop: stop.clone(),
    }
    .spawn(tx)
    .unwrap();
    // Duration zero: a monitor that never ends by itself.
    let mut pinger = MeshPinger::new(MeshConfig::new(
        parse_pinglist(first).unwrap(),
        200.0,
        Duration::ZERO,
    ))
    .with_metrics(metrics.clone())
    .with_updates(rx);
    let (mut r1, mut r2) = (Responder::new(), Responder::new());
    let mut step = |net: &mut SimNet, pinger: &mut MeshPinger| {
        net.run_until(
            net.now + Duration::from_millis(100),
            &mut [pinger, &mut r1, &mut r2],
            |_| false,
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    // Run until `cond` holds, for at most 30 s of real time.
    let wait_for = |what: &str,
                    net: &mut SimNet,
                    pinger: &mut MeshPinger,
                    step: &mut dyn FnMut(&mut SimNet, &mut MeshPinger),
                    cond: &dyn Fn(&MeshPinger) -> bool| {
        let t0 = std::time::Instant::now();
        while !cond(pinger) {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{what}: never happened"
            );
            step(net, pinger);
        }
    };
    let a = Ipv4Addr::new(10, 0, 0, 2);
    let b = Ipv4Addr::new(10, 0, 0, 3);
    wait_for("answers from .2", &mut net, &mut pinger, &mut step, &|p| {
        p.series(a, Probe::Icmp).is_some_and(|s| s.received > 10)
    });
    // A bad list is counted and changes nothing.
    std::fs::write(&path, "10.0.0.2 a\nnot-an-address\n").unwrap();
    let m = metrics.clone();
    wait_for("a counted error", &mut net, &mut pinger, &mut step, &|_| {
        m.pinglist_errors.load(std::sync::atomic::Ordering::Relaxed) == 1
    });
    assert_eq!(pinger.reloads(), 0);
    std::fs::write(&path, "10.0.0.2 a\n10.0.0.3 b probes=udp,tcp\n").unwrap();
    wait_for(
        "answers from the new target",
        &mut net,
        &mut pinger,
        &mut step,
        &|p| {
            p.series(b, Probe::Udp).is_some_and(|s| s.received > 5)
                && p.series(b, Probe::Tcp).is_some_and(|s| s.received > 5)
        },
    );
    assert_eq!(pinger.reloads(), 1);
    assert_eq!(pinger.stats.len(), 3);
    step(&mut net, &mut pinger);
    step(&mut net, &mut pinger);
    let mut fams = Vec::new();
    metrics.collect(&mut fams);
    let recv = family(&fams, "ustack_mesh_probes_received_total");
    assert!(number(sample(recv, "10.0.0.3", "udp")) > 0.0);
    assert_eq!(
        number(Some(
            &family(&fams, "ustack_mesh_pinglist_reloads_total").samples[0].value
        )),
        1.0
    );
    assert_eq!(
        number(Some(&family(&fams, "ustack_mesh_targets").samples[0].value)),
        2.0
    );
    // .2 leaves the list: its series stops and leaves the metrics.
    std::fs::write(&path, "10.0.0.3 b probes=udp,tcp\n").unwrap();
    wait_for(
        "the removed target gone",
        &mut net,
        &mut pinger,
        &mut step,
        &|p| p.series(a, Probe::Icmp).is_none(),
    );
    step(&mut net, &mut pinger);
    step(&mut net, &mut pinger);
    let mut fams = Vec::new();
    metrics.collect(&mut fams);
    let sent = family(&fams, "ustack_mesh_probes_sent_total");
    assert!(sample(sent, "10.0.0.2", "icmp").is_none(), "{sent:?}");
    assert!(sample(sent, "10.0.0.3", "tcp").is_some());
    assert!(!pinger.done(), "--duration 0 runs on");
    let json = pinger.json();
    assert_eq!(json["pinglist_reloads"], 2);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    reloader.join().unwrap();
}

/// Three agents (`uping --responder`: `MeshAgent` with the echo services
/// and the UD responder) in a full mesh, every probe type both ways: each
/// answers the others' probes while it sends its own; nothing lost.
#[test]
fn agents_with_responders_answer_each_other_in_a_full_mesh() {
    let mut net = SimNet::new(LinkConfig::default());
    for n in 1..=3 {
        net.add(host_config(n));
    }
    let baseline = net.pools_in_use();
    let mut pingers: Vec<MeshPinger> = (1..=3u8)
        .map(|me| {
            let list: String = (1..=3u8)
                .filter(|&o| o != me)
                .map(|o| format!("10.0.0.{o} agent-{o} probes=icmp,udp,tcp,ud\n"))
                .collect();
            MeshPinger::new(MeshConfig::new(
                parse_pinglist(&list).unwrap(),
                800.0,
                Duration::from_secs(2),
            ))
        })
        .collect();
    let [p1, p2, p3] = &mut pingers[..] else {
        unreachable!()
    };
    let mut a1 = ustack_apps::mesh::MeshAgent::new(p1, true);
    let mut a2 = ustack_apps::mesh::MeshAgent::new(p2, true);
    let mut a3 = ustack_apps::mesh::MeshAgent::new(p3, true);
    net.run_until(
        Instant::ZERO + Duration::from_secs(12),
        &mut [&mut a1, &mut a2, &mut a3],
        |_| false,
    );
    for a in [&a1, &a2, &a3] {
        assert_eq!(a.responder_error(), None);
    }
    drop((a1, a2, a3));
    for (i, p) in pingers.iter().enumerate() {
        assert!(p.done(), "agent {} did not finish", i + 1);
        assert_eq!(p.stats.len(), 8);
        let text = p.report();
        for s in &p.stats {
            // 800/s over 8 series for 2 s: 200 each.
            assert!(s.sent >= 190, "agent {}: {text}", i + 1);
            assert_eq!(s.lost, 0, "agent {}: {:?}\n{text}", i + 1, s.last_error);
            assert_eq!(s.received, s.sent, "agent {}: {text}", i + 1);
        }
    }
    // Every stack answered UD pings on its responder's QP.
    for n in 0..3 {
        let ud = net.nodes[n].stack.stats().ud;
        assert!(ud.rx_packets >= 2 * 200, "node {n}: {ud:?}");
    }
    net.run_until(net.now + Duration::from_millis(100), &mut [], |_| false);
    assert_eq!(net.pools_in_use(), baseline, "leaked buffers");
}
