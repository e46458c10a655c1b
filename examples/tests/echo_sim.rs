//! The in-loop `EchoServer` that `echo-server` and `multicore-echo` run,
//! without root or a NIC: on a stack of the simulated link with loss,
//! duplication and reordering, it echoes parallel clients on another stack
//! byte-exact and closes every connection it accepted.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use futures::{AsyncReadExt, AsyncWriteExt};
use ustack::sim::{LinkConfig, SimLink};
use ustack_examples::echo::EchoServer;
use ustack_runtime::{Builder, aio, blocking};

#[test]
fn echo_server_echoes_parallel_clients_over_an_impaired_link() {
    const CONNS: usize = 8;
    const BYTES: usize = 512 << 10;
    let link = SimLink::new(LinkConfig {
        loss: 0.01,
        duplicate: 0.01,
        reorder: 0.02,
        reorder_delay: Duration::from_micros(200),
        seed: 7,
        ..LinkConfig::default()
    });
    let server = (Builder::new().sim(&link).ip(Ipv4Addr::new(10, 0, 0, 2), 24))
        .spawn_with(EchoServer::new(7))
        .expect("server stack");
    let client = (Builder::new().sim(&link).ip(Ipv4Addr::new(10, 0, 0, 1), 24))
        .spawn()
        .expect("client stack");
    let to = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 7);

    // Each client writes its data and reads the echo at the same time (the
    // echo would fill its windows otherwise), on one thread, bounded in time.
    let one = |i: usize| {
        let net = client.net().clone();
        async move {
            let mut rng = fastrand::Rng::with_seed(i as u64);
            let data: Vec<u8> = (0..BYTES).map(|_| rng.u8(..)).collect();
            let (mut r, mut w) = aio::TcpStream::connect(&net, to).await?.split();
            let write = async {
                w.write_all(&data).await?;
                w.close().await
            };
            let mut back = Vec::new();
            let (wrote, read) = futures::join!(write, r.read_to_end(&mut back));
            wrote?;
            read?;
            Ok::<_, std::io::Error>(back == data)
        }
    };
    let all = async { Ok(futures::future::join_all((0..CONNS).map(one)).await) };
    let results = blocking::block_on(all, Some(Duration::from_secs(120))).expect("in time");
    assert!(results.iter().all(|r| matches!(r, Ok(true))), "{results:?}");

    // The server closes its side after each client's FIN: nothing stays open.
    let deadline = Instant::now() + Duration::from_secs(30);
    while (server.net())
        .with_stack(|s| s.tcp_ref().connections().count())
        .unwrap()
        > 0
    {
        assert!(Instant::now() < deadline, "connections left open");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The link did lose segments: recovery was exercised on both sides.
    let retransmits =
        |net: &ustack_runtime::Net| (net.with_stack(|s| s.stats().tcp.retransmits)).unwrap();
    assert!(retransmits(client.net()) > 0 && retransmits(server.net()) > 0);
    let echo = server.stop().expect("server loop");
    assert_eq!(echo.error(), None);
    assert_eq!(echo.connections, CONNS as u64);
    assert_eq!(echo.bytes, (CONNS * BYTES) as u64);
    client.stop().expect("client loop");
}
