//! `uperf --rdma --perftest` client against `uperf --rdma --perftest`
//! server on the sim link, in virtual time: perftest's TCP exchange and the
//! UD data phase of send_bw and send_lat, with and without `-a`; both sides'
//! counts agree, the table rows parse in perftest's layout, lost UD packets
//! end a latency test within its timeout and are counted by a bw server,
//! and a peer that is not perftest is refused with one clear line.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use regex::Regex;
use ustack::node::{App, Control};
use ustack::sim::{LinkConfig, SimNet, host_config};
use ustack::socket::tcp::ListenHandle;
use ustack::{Instant, Stack};
use ustack_apps::perftest::{
    BW_HEADER, LAT_HEADER, PERFTEST_PORT, PerftestClient, PerftestConfig, PerftestServer,
    RESULT_LINE, Report, Row, Test,
};

const SERVER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const DELAY: Duration = Duration::from_micros(20);

fn link(loss: f64) -> LinkConfig {
    LinkConfig {
        delay: DELAY,
        rate_bps: 1_000_000_000,
        loss,
        ..LinkConfig::default()
    }
}

fn cfg(test: Test, iters: u64) -> PerftestConfig {
    let mut c = PerftestConfig::new(test);
    c.iters = iters;
    c
}

fn client(c: PerftestConfig) -> PerftestClient {
    PerftestClient::new(c, SocketAddrV4::new(SERVER, PERFTEST_PORT))
}

/// Node 0 serves, node 1 is the client; runs until the client is done
/// and the server has reported it (or virtual `secs` pass); `net.now` is
/// then within 10 ms of that moment.
fn run(
    net: &mut SimNet,
    server: &mut PerftestServer,
    client: &mut PerftestClient,
    secs: u64,
) -> (Report, Report) {
    let served = server.reports.len();
    let deadline = net.now + Duration::from_secs(secs);
    // In 10 ms slices, to stop once both sides are done.
    while net.now < deadline && !(client.done() && server.reports.len() > served) {
        let next = net.now + Duration::from_millis(10);
        net.run_until(next, &mut [server as &mut dyn App, client], |_| false);
        net.now = net.now.max(next);
    }
    let c = client.report.clone().expect("the client did not finish");
    assert_eq!(
        server.reports.len(),
        served + 1,
        "the server did not finish: {:?}",
        server.output
    );
    (c, server.reports[served].clone())
}

fn net(loss: f64) -> SimNet {
    let mut net = SimNet::new(link(loss));
    net.add(host_config(1));
    net.add(host_config(2));
    net
}

fn lines(out: &[String]) -> Vec<String> {
    out.iter()
        .flat_map(|l| l.lines().map(str::to_string).collect::<Vec<_>>())
        .collect()
}

fn bw_re() -> Regex {
    Regex::new(r"^ (\d+) +(\d+) +(n/a|\d+\.\d\d) +(n/a|\d+\.\d\d) *\t\t +(n/a|\d+\.\d{6}) *$")
        .unwrap()
}

fn lat_re() -> Regex {
    Regex::new(r"^ (\d+) +(\d+) +((n/a|\d+\.\d\d)[ \t]+){6}(n/a|\d+\.\d\d) *$").unwrap()
}

/// The table of one side: the rows between the header and the closing
/// rule, each parsed as (bytes, iterations).
fn table(out: &[String], header: &str, re: &Regex) -> Vec<(usize, u64)> {
    let l = lines(out);
    let at = l
        .iter()
        .position(|x| x == header)
        .unwrap_or_else(|| panic!("no table header in {l:#?}"));
    assert_eq!(l[at - 1], RESULT_LINE);
    let mut rows = Vec::new();
    for x in &l[at + 1..] {
        if x == RESULT_LINE {
            return rows;
        }
        if x.starts_with("uperf: only") {
            continue;
        }
        let c = re
            .captures(x)
            .unwrap_or_else(|| panic!("row {x:?} is not in perftest's format"));
        rows.push((c[1].parse().unwrap(), c[2].parse().unwrap()));
    }
    panic!("no closing rule after the table: {l:#?}")
}

#[test]
fn send_bw_moves_every_message_and_both_sides_agree() {
    let mut net = net(0.0);
    let baseline = net.pools_in_use();
    let mut server = PerftestServer::new(cfg(Test::SendBw, 200), PERFTEST_PORT, true);
    let mut c = client(cfg(Test::SendBw, 200));
    let (cr, sr) = run(&mut net, &mut server, &mut c, 30);
    assert!(cr.succeeded(), "{cr:?}");
    assert!(sr.succeeded(), "{sr:?}");
    assert!(server.done());
    assert_eq!((cr.sent, cr.send_completions, cr.expected), (200, 200, 200));
    assert_eq!((sr.received, sr.rx_bytes), (200, 200 * 1024));
    // Each knows the other's UD address from the key exchange.
    assert_eq!(sr.peer.unwrap().ip, Ipv4Addr::new(10, 0, 0, 2));
    assert_eq!(cr.peer.unwrap().ip, SERVER);
    // The default size is the MTU of a 1500-byte link: 1024.
    let re = bw_re();
    assert_eq!(table(&c.output, BW_HEADER, &re), vec![(1024, 200)]);
    assert_eq!(table(&server.output, BW_HEADER, &re), vec![(1024, 200)]);
    // The receiver timed the messages arriving at 1 Gbit/s: its average
    // is the wire rate less the RoCE headers, and it prints no peak.
    let Row::Bw(r) = sr.rows[0] else { panic!() };
    let avg = r.avg.expect("the server measured a span");
    assert!((80.0..120.0).contains(&avg), "{avg} MB/s");
    assert_eq!(r.peak, None);
    // The reconciliation lines.
    assert!(
        server.output.iter().any(|l| l
            == "uperf: perftest send_bw server: 200/200 messages received (204800 bytes) from 10.0.0.2 qpn 0x100"),
        "{:#?}",
        server.output
    );
    assert!(c.output.iter().any(|l| {
        l.starts_with("uperf: perftest send_bw client: 200 messages sent, 200 send completions")
    }));
    // Banner and addresses in perftest's words.
    let cl = lines(&c.output);
    assert!(cl.contains(&"                    Send BW Test".to_string()));
    assert!(cl.contains(&" Connection type : UD\t\tUsing SRQ      : OFF".to_string()));
    assert!(cl.contains(&" remote address: LID 0000 QPN 0x0100 PSN 000000".to_string()));
    assert!(cl.contains(&" GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:00:00:01".to_string()));
    // Both connections closed and every buffer is home.
    net.run_until(net.now + Duration::from_secs(5), &mut [], |_| false);
    for n in &net.nodes {
        let open: Vec<_> = n
            .stack
            .tcp_ref()
            .connections()
            .filter(|c| c.state != ustack::socket::tcp::State::TimeWait)
            .collect();
        assert!(open.is_empty(), "{open:?}");
    }
    assert_eq!(net.pools_in_use(), baseline, "leaked buffers");
}

#[test]
fn send_lat_ping_pongs_and_measures_the_one_way_delay() {
    let mut net = net(0.0);
    let mut server = PerftestServer::new(cfg(Test::SendLat, 200), PERFTEST_PORT, true);
    let mut c = client(cfg(Test::SendLat, 200));
    let (cr, sr) = run(&mut net, &mut server, &mut c, 30);
    assert!(cr.succeeded(), "{cr:?}");
    assert!(sr.succeeded(), "{sr:?}");
    assert_eq!((cr.sent, cr.received), (200, 200));
    assert_eq!((sr.sent, sr.received), (200, 200));
    assert_eq!(sr.rx_bytes, 400, "2-byte messages by default");
    let re = lat_re();
    assert_eq!(table(&c.output, LAT_HEADER, &re), vec![(2, 200)]);
    assert_eq!(table(&server.output, LAT_HEADER, &re), vec![(2, 200)]);
    // Posts are a round trip apart: half of it is the link's delay (plus
    // the serialisation of a 100-byte frame at 1 Gbit/s, under 1 us).
    for rep in [&cr, &sr] {
        let Row::Lat(r) = rep.rows[0] else { panic!() };
        let typical = r.typical.unwrap();
        assert!((20.0..21.0).contains(&typical), "{r:?}");
        assert!(r.min.unwrap() <= typical && typical <= r.max.unwrap());
        assert_eq!(r.stdev, Some(0.0));
    }
    assert!(c.output.iter().any(|l| l
        == "uperf: perftest send_lat client: 200 messages sent, 200/200 replies received from 10.0.0.1 qpn 0x100"));
}

#[test]
fn all_sizes_sweep_in_both_tests() {
    for test in [Test::SendBw, Test::SendLat] {
        let mut net = net(0.0);
        let mut sc = cfg(test, 50);
        sc.all_sizes = true;
        let mut server = PerftestServer::new(sc.clone(), PERFTEST_PORT, true);
        let mut c = client(sc);
        let (cr, sr) = run(&mut net, &mut server, &mut c, 60);
        assert!(cr.succeeded() && sr.succeeded(), "{cr:?} {sr:?}");
        let sizes: Vec<usize> = (1..=10).map(|i| 1 << i).collect();
        let (header, re) = match test {
            Test::SendBw => (BW_HEADER, bw_re()),
            Test::SendLat => (LAT_HEADER, lat_re()),
        };
        let expect: Vec<(usize, u64)> = sizes.iter().map(|&s| (s, 50)).collect();
        assert_eq!(table(&c.output, header, &re), expect, "{test:?}");
        assert_eq!(table(&server.output, header, &re), expect, "{test:?}");
        assert_eq!(sr.received, 500);
        assert_eq!(
            sr.rx_bytes,
            sizes.iter().map(|&s| 50 * s as u64).sum::<u64>()
        );
    }
}

#[test]
fn a_server_serves_clients_one_after_another() {
    let mut net = net(0.0);
    let mut server = PerftestServer::new(cfg(Test::SendBw, 100), PERFTEST_PORT, false);
    for _ in 0..2 {
        let mut c = client(cfg(Test::SendBw, 100));
        let (cr, sr) = run(&mut net, &mut server, &mut c, 30);
        assert!(cr.succeeded() && sr.succeeded(), "{cr:?} {sr:?}");
    }
    assert!(!server.done());
    assert_eq!(server.reports.len(), 2);
}

#[test]
fn a_lost_ud_packet_ends_a_latency_test_within_its_timeout() {
    // 10% loss: TCP recovers, a lost ping or pong is gone for good.
    let mut net = net(0.1);
    let mut sc = cfg(Test::SendLat, 1000);
    sc.timeout = Duration::from_secs(1);
    let mut server = PerftestServer::new(sc.clone(), PERFTEST_PORT, true);
    let mut c = client(sc);
    let (cr, sr) = run(&mut net, &mut server, &mut c, 60);
    let ce = cr.error.clone().expect("the client must fail");
    assert!(
        ce.contains("no reply to message") && ce.contains("within 1 s"),
        "{ce}"
    );
    let se = sr.error.clone().expect("the server must fail");
    assert!(se.contains("did not arrive within 1 s"), "{se}");
    assert!(cr.received < 1000 && cr.failure().is_some());
    // Both gave up one timeout after the loss, not at the 60 s limit.
    assert!(net.now < Instant::from_secs(60));
}

#[test]
fn a_bw_server_reports_what_arrived_and_still_closes_the_exchange() {
    let mut net = net(0.1);
    let mut server = PerftestServer::new(cfg(Test::SendBw, 200), PERFTEST_PORT, true);
    let mut c = client(cfg(Test::SendBw, 200));
    let (cr, sr) = run(&mut net, &mut server, &mut c, 120);
    // The client sent everything and got the server's close message.
    assert!(cr.succeeded(), "{cr:?}");
    assert_eq!(cr.send_completions, 200);
    // The server counted what arrived, said so, and answered the close.
    assert!(sr.error.is_none(), "{sr:?}");
    assert!((100..200).contains(&sr.received), "{sr:?}");
    assert_eq!(sr.rx_bytes, sr.received * 1024);
    assert_eq!(
        sr.failure(),
        Some(format!("{} of 200 messages arrived", sr.received))
    );
    assert!(server.output.iter().any(|l| l
        == &format!(
            "uperf: only {} of 200 messages arrived; none for 5 s",
            sr.received
        )));
    assert_eq!(
        table(&server.output, BW_HEADER, &bw_re()),
        vec![(1024, sr.received)]
    );
    assert_eq!(
        server.errors,
        vec![format!(
            "perftest send_bw server: {} of 200 messages arrived",
            sr.received
        )]
    );
}

/// A TCP server on perftest's port that is not perftest: it greets every
/// client with an SSH banner.
struct NotPerftest(Option<ListenHandle>);

impl App for NotPerftest {
    fn poll(&mut self, _: Instant, stack: &mut Stack) -> Control {
        let l = *self
            .0
            .get_or_insert_with(|| stack.tcp().listen(PERFTEST_PORT, 4).unwrap());
        while let Ok(Some(h)) = stack.tcp().accept(l) {
            stack.tcp().send(h, b"SSH-2.0-OpenSSH\n").unwrap();
        }
        Control::Continue
    }
}

#[test]
fn a_peer_that_is_not_perftest_is_refused() {
    let mut net = net(0.0);
    let mut other = NotPerftest(None);
    let mut c = client(cfg(Test::SendBw, 100));
    net.run_until(
        Instant::from_secs(40),
        &mut [&mut other as &mut dyn App, &mut c],
        |_| false,
    );
    let e = c.report.as_ref().unwrap().error.clone().unwrap();
    assert!(e.contains("not perftest"), "{e}");
    // Nobody listening: the reset says so.
    let mut net = self::net(0.0);
    let mut c = client(cfg(Test::SendBw, 100));
    net.run_until(Instant::from_secs(40), &mut [&mut (), &mut c], |_| false);
    let e = c.report.as_ref().unwrap().error.clone().unwrap();
    assert!(e.contains("TCP connection"), "{e}");
}

#[test]
fn a_size_above_the_mtu_is_refused_as_perftest_does() {
    let mut net = net(0.0);
    let mut server = PerftestServer::new(cfg(Test::SendBw, 100), PERFTEST_PORT, true);
    let mut cc = cfg(Test::SendBw, 100);
    cc.size = Some(2000);
    let mut c = client(cc);
    let (cr, sr) = run(&mut net, &mut server, &mut c, 40);
    let e = cr.error.clone().unwrap();
    assert!(
        e.starts_with("Max message size in UD cannot be greater than MTU (1024 bytes)"),
        "{e}"
    );
    assert!(sr.error.unwrap().contains("closed the connection"));
    assert_eq!(server.errors.len(), 1);
    // Neither side printed a summary for a test that never ran.
    assert!(!c.output.iter().any(|l| l.starts_with("uperf: perftest")));
    assert!(
        !server
            .output
            .iter()
            .any(|l| l.starts_with("uperf: perftest"))
    );
}
