//! `uperf -c` against `uperf -s` in one process on the sim link, in virtual
//! time: forward, reverse, parallel streams and loss; the byte counts each
//! side reports agree; failures give iperf3's messages.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use ustack::node::{App, Control};
use ustack::sim::{LinkConfig, SimNet, host_config};
use ustack::{Instant, Stack};
use ustack_apps::iperf_client::{ClientConfig, IperfClient};
use ustack_apps::iperf_server::IperfServer;

const SERVER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

fn config(time: f64, parallel: usize, reverse: bool) -> ClientConfig {
    ClientConfig {
        server: SocketAddrV4::new(SERVER, 5201).into(),
        time,
        parallel,
        reverse,
        len: 128 << 10,
        interval: 1.0,
        connect_timeout: Duration::from_secs(3),
    }
}

/// A 100 Mbit/s link with 1 ms of delay: a finite amount of data in virtual time.
fn link() -> LinkConfig {
    LinkConfig {
        rate_bps: 100_000_000,
        delay: Duration::from_millis(1),
        ..LinkConfig::default()
    }
}

fn client(cfg: ClientConfig) -> IperfClient {
    IperfClient::new(cfg, Arc::new(AtomicBool::new(false)))
}

/// Run server (node 0) and client (node 1) until the client is done.
fn run(link: LinkConfig, server: &mut dyn App, client: &mut IperfClient) -> SimNet {
    let mut net = SimNet::new(link);
    net.add(host_config(1));
    net.add(host_config(2));
    let baseline = net.pools_in_use();
    let mut done = false;
    let mut client_app = ClientApp {
        c: client,
        done: &mut done,
    };
    let finished = net.run_until(
        Instant::ZERO + Duration::from_secs(60),
        &mut [server, &mut client_app],
        |_| false,
    );
    assert!(!finished);
    assert!(done, "the client did not finish: {client:?}");
    // Let the last segments drain, then every buffer is back.
    net.run_until(net.now + Duration::from_secs(2), &mut [], |_| false);
    assert_eq!(net.pools_in_use(), baseline, "leaked buffers");
    net
}

struct ClientApp<'a> {
    c: &'a mut IperfClient,
    done: &'a mut bool,
}

impl App for ClientApp<'_> {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        if *self.done {
            return Control::Exit;
        }
        if self.c.poll(now, stack) == Control::Exit {
            *self.done = true;
        }
        Control::Continue
    }
    fn poll_at(&self) -> Option<Instant> {
        if *self.done { None } else { self.c.poll_at() }
    }
}

fn check_test(link: LinkConfig, parallel: usize, reverse: bool) {
    let mut server = IperfServer::new(5201, true);
    let mut c = client(config(2.0, parallel, reverse));
    run(link, &mut server, &mut c);
    assert!(c.succeeded(), "client error: {:?}", c.error);
    let j = c.json(std::time::SystemTime::now());
    let sent = j["end"]["sum_sent"]["bytes"].as_u64().unwrap();
    let received = j["end"]["sum_received"]["bytes"].as_u64().unwrap();
    assert_eq!(server.finished.len(), 1, "{:?}", server.output);
    let s = &server.finished[0];
    assert_eq!(s.reverse, reverse);
    assert_eq!(s.streams, parallel);
    if reverse {
        // The server sent, we received: each side's own count is the other's view.
        assert_eq!(sent, s.bytes);
        assert_eq!(received, s.client_bytes);
    } else {
        assert_eq!(received, s.bytes);
        assert_eq!(sent, s.client_bytes);
    }
    assert!(received > 1 << 20, "{j}");
    // TCP is reliable: whatever was read was sent, and the receiver read
    // (nearly) everything before the test ended.
    assert!(received <= sent, "{received} > {sent}");
    let streams = j["end"]["streams"].as_array().unwrap();
    assert_eq!(streams.len(), parallel);
    assert_eq!(j["start"]["test_start"]["num_streams"], parallel);
    assert_eq!(j["start"]["test_start"]["reverse"], u8::from(reverse));
    assert_eq!(j["start"]["connected"].as_array().unwrap().len(), parallel);
    let intervals = j["intervals"].as_array().unwrap();
    assert!((2..=3).contains(&intervals.len()), "{}", intervals.len());
    let interval_sum: u64 = intervals
        .iter()
        .map(|i| i["sum"]["bytes"].as_u64().unwrap())
        .sum();
    if reverse {
        // The receiver keeps reading what was in flight until the results go out.
        assert!(interval_sum <= received && interval_sum > received / 2);
    } else {
        assert_eq!(interval_sum, sent, "intervals add up to the total");
    }
    let text = c.output.join("\n");
    assert!(text.contains("iperf Done."), "{text}");
    assert_eq!(
        text.matches(" sender").count(),
        parallel + usize::from(parallel > 1)
    );
    assert_eq!(
        text.matches(" receiver").count(),
        parallel + usize::from(parallel > 1)
    );
}

#[test]
fn forward_one_stream() {
    check_test(link(), 1, false);
}

#[test]
fn reverse_parallel_streams() {
    check_test(link(), 3, true);
}

#[test]
fn forward_parallel_under_loss_counts_retransmits() {
    let link = LinkConfig {
        loss: 0.01,
        seed: 7,
        ..link()
    };
    let mut server = IperfServer::new(5201, true);
    let mut c = client(config(2.0, 2, false));
    run(link, &mut server, &mut c);
    assert!(c.succeeded(), "{:?}", c.error);
    let j = c.json(std::time::SystemTime::now());
    assert!(
        j["end"]["sum_sent"]["retransmits"].as_u64().unwrap() > 0,
        "{j}"
    );
    assert_eq!(
        j["end"]["sum_received"]["bytes"].as_u64(),
        Some(server.finished[0].bytes)
    );
}

#[test]
fn no_server_is_connection_refused() {
    let mut c = client(config(1.0, 1, false));
    run(link(), &mut (), &mut c);
    let e = c.error.clone().unwrap();
    assert!(e.starts_with("unable to connect to server"), "{e}");
    assert!(e.contains("refused"), "{e}");
    assert!(c.json(std::time::SystemTime::now())["error"].is_string());
}

#[test]
fn silent_host_times_out() {
    let mut cfg = config(1.0, 1, false);
    cfg.server = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 99), 5201).into();
    let mut c = client(cfg);
    run(link(), &mut (), &mut c);
    let e = c.error.clone().unwrap();
    assert!(e.contains("no answer from 10.0.0.99:5201"), "{e}");
}

/// A server that accepts the control connection and closes it mid-setup.
struct Rude {
    l: Option<ustack::socket::tcp::ListenHandle>,
}

impl App for Rude {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let l = *self
            .l
            .get_or_insert_with(|| stack.tcp().listen(5201, 4).unwrap());
        while let Ok(Some(h)) = stack.tcp().accept(l) {
            stack.tcp().send(h, &[9]).unwrap();
            stack.tcp().close(now, h).unwrap();
        }
        Control::Continue
    }
}

#[test]
fn server_closing_mid_test_is_reported() {
    let mut c = client(config(1.0, 1, false));
    run(link(), &mut Rude { l: None }, &mut c);
    let e = c.error.clone().unwrap();
    assert!(e.contains("control socket has closed unexpectedly"), "{e}");
}

#[test]
fn busy_server_denies_a_second_client() {
    // The first client holds the server; a second one on another host is told it is busy.
    let mut net = SimNet::new(link());
    for n in 1..=3 {
        net.add(host_config(n));
    }
    let mut server = IperfServer::new(5201, false);
    let mut first = client(config(3.0, 1, false));
    let mut second = client(config(1.0, 1, false));
    let (mut d1, mut d2) = (false, false);
    let mut a1 = ClientApp {
        c: &mut first,
        done: &mut d1,
    };
    // The second client starts half a second later.
    struct Later<'a>(ClientApp<'a>);
    impl App for Later<'_> {
        fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
            if now < Instant::ZERO + Duration::from_millis(500) {
                return Control::Continue;
            }
            self.0.poll(now, stack)
        }
        fn poll_at(&self) -> Option<Instant> {
            Some(
                self.0
                    .poll_at()
                    .unwrap_or(Instant::ZERO + Duration::from_millis(500))
                    .max(Instant::ZERO + Duration::from_millis(500)),
            )
        }
    }
    let mut a2 = Later(ClientApp {
        c: &mut second,
        done: &mut d2,
    });
    net.run_until(
        Instant::ZERO + Duration::from_secs(30),
        &mut [&mut server, &mut a1, &mut a2],
        |_| false,
    );
    assert!(d1 && d2);
    assert!(first.succeeded(), "{:?}", first.error);
    let e = second.error.clone().unwrap();
    assert!(e.contains("busy"), "{e}");
}

/// A stock iperf3 client's control connection, by hand: cookie, then the
/// parameters it is given; keeps every byte the server sends until it
/// closes.
struct RawClient {
    params: serde_json::Value,
    h: Option<ustack::socket::tcp::TcpHandle>,
    stage: u8,
    got: Vec<u8>,
}

impl App for RawClient {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let h = match self.h {
            Some(h) => h,
            None => *self.h.insert(
                stack
                    .tcp()
                    .connect(now, SocketAddrV4::new(SERVER, 5201))
                    .unwrap(),
            ),
        };
        let Ok(st) = stack.tcp_ref().status(h) else {
            return Control::Exit;
        };
        if self.stage == 0 && st.state == ustack::socket::tcp::State::Established {
            let mut cookie = [b'a'; 37];
            cookie[36] = 0;
            stack.tcp().send(h, &cookie).unwrap();
            self.stage = 1;
        }
        let mut b = [0u8; 256];
        while let Ok(n) = stack.tcp().recv(h, &mut b) {
            if n == 0 {
                break;
            }
            self.got.extend_from_slice(&b[..n]);
        }
        if self.stage == 1 && self.got.first() == Some(&ustack_apps::iperf::PARAM_EXCHANGE) {
            stack
                .tcp()
                .send(h, &ustack_apps::iperf::frame_json(&self.params))
                .unwrap();
            self.stage = 2;
        }
        if st.eof || st.error.is_some() {
            let _ = stack.tcp().close(now, h);
            return Control::Exit;
        }
        Control::Continue
    }
}

/// `iperf3 -c -u` and `--bidir` against the server: iperf3's own error
/// state (SERVER_ERROR, IEUNIMP and an errno) goes out before the close,
/// so the stock client prints "an option you are trying to set is not
/// implemented yet" rather than "control socket has closed unexpectedly".
#[test]
fn refused_tests_get_iperf3_error_state() {
    for (params, errno) in [
        (
            serde_json::json!({"udp": true, "omit": 0, "time": 2, "parallel": 1, "len": 1460,
            "bandwidth": 1048576, "client_version": "3.12"}),
            93i32,
        ),
        (
            serde_json::json!({"tcp": true, "omit": 0, "time": 2, "parallel": 1, "len": 131072,
            "bidirectional": true, "client_version": "3.12"}),
            95,
        ),
    ] {
        let mut net = SimNet::new(link());
        net.add(host_config(1));
        net.add(host_config(2));
        let mut server = IperfServer::new(5201, false);
        let mut raw = RawClient {
            params: params.clone(),
            h: None,
            stage: 0,
            got: Vec::new(),
        };
        net.run_until(
            Instant::ZERO + Duration::from_secs(5),
            &mut [&mut server, &mut raw],
            |_| false,
        );
        let mut want = vec![ustack_apps::iperf::PARAM_EXCHANGE, 0xfe];
        want.extend(13i32.to_be_bytes());
        want.extend(errno.to_be_bytes());
        assert_eq!(raw.got, want, "{params}: {:?}", server.output);
        assert!(
            server.output.iter().any(|l| l.contains("not supported")),
            "{:?}",
            server.output
        );
    }
}

/// Ctrl-C during `uperf -c`: iperf3's partial summary (the interval so
/// far, then sender and receiver lines), and the interrupt as the error.
#[test]
fn interrupted_client_prints_the_partial_summary() {
    let stop = Arc::new(AtomicBool::new(false));
    let mut c = IperfClient::new(config(10.0, 1, false), stop.clone());
    let mut server = IperfServer::new(5201, false);
    let mut net = SimNet::new(link());
    net.add(host_config(1));
    net.add(host_config(2));
    let mut done = false;
    let at = |s: f64| Instant::ZERO + Duration::from_secs_f64(s);
    {
        let mut app = ClientApp {
            c: &mut c,
            done: &mut done,
        };
        net.run_until(at(2.5), &mut [&mut server, &mut app], |_| false);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    {
        let mut app = ClientApp {
            c: &mut c,
            done: &mut done,
        };
        net.run_until(at(10.0), &mut [&mut server, &mut app], |_| false);
    }
    assert!(done, "the client stopped");
    let text = c.output.join("\n");
    assert!(
        c.error.as_deref() == Some("interrupt - the client has terminated"),
        "{:?}",
        c.error
    );
    assert!(text.contains("- - - - - - - - -"), "{text}");
    let sender = text.lines().find(|l| l.ends_with("sender")).expect(&text);
    assert!(sender.contains("  0.00-2."), "{sender}");
    assert!(!sender.contains(" 0.00 Bytes"), "{sender}");
    assert!(text.lines().any(|l| l.ends_with("receiver")), "{text}");
    assert!(!text.contains("iperf Done."), "{text}");
}
