//! `uperf -c --rr` against the echo service of `ustack run` in one process
//! on the sim link, in virtual time: every transaction's echo is checked
//! byte for byte, the server echoed exactly what the client counted, loss
//! only slows it down, and a closed port or a silent host fail clearly.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use ustack::Instant;
use ustack::node::App;
use ustack::sim::{LinkConfig, SimNet, host_config};
use ustack_apps::rr::{RrClient, RrConfig};
use ustack_apps::services::Services;

const SERVER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

fn client(port: u16, size: usize) -> RrClient {
    RrClient::new(RrConfig {
        server: SocketAddrV4::new(SERVER, port).into(),
        size,
        time: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(2),
    })
}

/// Server (node 0) runs the echo service, the client (node 1) the test.
fn run(link: LinkConfig, server: &mut Services, c: &mut RrClient) -> SimNet {
    let mut net = SimNet::new(link);
    net.add(host_config(1));
    net.add(host_config(2));
    let baseline = net.pools_in_use();
    net.run_until(
        Instant::from_secs(30),
        &mut [server as &mut dyn App, c],
        |_| false,
    );
    assert!(
        c.done(),
        "the client did not finish: {c:?} {:?} {:?}",
        net.nodes[1]
            .stack
            .tcp_ref()
            .connections()
            .collect::<Vec<_>>(),
        net.nodes[0]
            .stack
            .tcp_ref()
            .connections()
            .collect::<Vec<_>>()
    );
    // The close goes through, then every buffer is home.
    net.run_until(net.now + Duration::from_secs(2), &mut [server], |_| false);
    assert_eq!(net.pools_in_use(), baseline, "leaked buffers");
    net
}

fn link(delay_us: u64, loss: f64) -> LinkConfig {
    LinkConfig {
        delay: Duration::from_micros(delay_us),
        loss,
        ..LinkConfig::default()
    }
}

#[test]
fn sixty_four_byte_transactions_are_echoed_exactly() {
    let mut server = Services::new();
    let mut c = client(7, 64);
    let net = run(link(50, 0.0), &mut server, &mut c);
    assert!(c.succeeded(), "{:?}", c.error);
    assert_eq!(c.mismatched, 0);
    // One transaction per round trip: with 50 us each way, about 10,000 in
    // one virtual second (never more than the link allows).
    assert!(c.transactions > 1000, "{}", c.transactions);
    assert!(c.transactions <= 10_000, "{}", c.transactions);
    // The server saw and echoed exactly the client's requests.
    assert_eq!(server.bytes_in, c.transactions * 64);
    assert_eq!(server.bytes_echoed, c.transactions * 64);
    let j = c.json();
    assert_eq!(j["transactions"], c.transactions);
    assert_eq!(j["size"], 64);
    assert!(j.get("error").is_none(), "{j}");
    let text = c.summary();
    assert!(
        text.contains(&format!("{} transactions", c.transactions)),
        "{text}"
    );
    // Both ends counted the same segments the other sent.
    let s = net.nodes[0].stack.stats().tcp;
    assert_eq!(s.passive_opens, 1);
}

#[test]
fn larger_requests_span_segments_and_survive_loss() {
    let mut server = Services::new();
    // 4,000 bytes: three segments per request each way, 2% loss both ways.
    let mut c = client(7, 4000);
    run(link(50, 0.02), &mut server, &mut c);
    assert!(c.succeeded(), "{:?}", c.error);
    assert_eq!(c.mismatched, 0);
    assert!(c.transactions > 10, "{}", c.transactions);
    assert_eq!(server.bytes_in, c.transactions * 4000);
    assert_eq!(server.bytes_echoed, c.transactions * 4000);
}

#[test]
fn closed_port_and_silent_host_fail_clearly() {
    let mut server = Services::new();
    let mut c = client(8, 64);
    run(link(50, 0.0), &mut server, &mut c);
    assert!(!c.succeeded());
    assert_eq!(c.transactions, 0);
    let e = c.error.clone().unwrap();
    assert!(e.starts_with("unable to connect to server"), "{e}");

    // Every frame lost: the connect times out.
    let mut server = Services::new();
    let mut c = client(7, 64);
    run(link(50, 1.0), &mut server, &mut c);
    let e = c.error.clone().unwrap();
    assert!(e.contains("timed out"), "{e}");
    assert_eq!(server.bytes_in, 0);
}
