//! The runtime's fronts on stacks whose loops run on their own threads, two
//! stacks on one simulated link: blocking streams from ordinary threads,
//! async streams from an executor (64 MiB byte-exact, 1,000 connections on
//! one stack), UDP both ways, refused connects, a stopped loop, a
//! dropped listener refusing new connections, and RDMA RC queue pairs
//! (blocking sender, async receiver).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use futures::executor::LocalPool;
use futures::task::LocalSpawnExt;
use futures::{AsyncReadExt, AsyncWriteExt};
use sha2::{Digest, Sha256};
use ustack::node::{App, Control};
use ustack::sim::{LinkConfig, SimLink};
use ustack::{Instant, Stack};
use ustack_kit::bulk::{BulkRecv, BulkSend, count_mismatches, fill_pattern};
use ustack_runtime::{Builder, Runtime, aio, blocking};

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

/// Stacks A and B on one link, each with its loop on a thread.
fn pair(link: LinkConfig) -> (Runtime, Runtime) {
    let link = SimLink::new(link);
    let a = Builder::new().sim(&link).ip(A, 24).spawn().expect("A");
    let b = Builder::new().sim(&link).ip(B, 24).spawn().expect("B");
    (a, b)
}

/// Host B's in-loop apps: receives on 5001, sends to A:6001.
struct HostB {
    recv: BulkRecv,
    send: BulkSend,
}

impl App for HostB {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        self.recv.poll(now, stack);
        self.send.poll(now, stack);
        Control::Continue
    }
}

const BYTES: usize = 8 << 20;

#[test]
fn blocking_streams_both_ways_beside_an_in_loop_app() {
    let link = SimLink::new(LinkConfig {
        delay: Duration::from_micros(50),
        ..LinkConfig::default()
    });
    let a = Builder::new().sim(&link).ip(A, 24).spawn().expect("A");
    let listener = blocking::TcpListener::bind(a.net(), 6001, 4).expect("listen");
    let b = Builder::new()
        .sim(&link)
        .ip(B, 24)
        .spawn_with(HostB {
            recv: BulkRecv::new(5001, 4),
            send: BulkSend::new(SocketAddrV4::new(A, 6001), BYTES as u64),
        })
        .expect("B");
    let reader = std::thread::spawn(move || {
        let (mut s, peer) = listener.accept().expect("accept");
        assert_eq!(peer.ip(), std::net::IpAddr::V4(B));
        let mut got = Vec::new();
        s.read_to_end(&mut got).expect("read to end");
        got
    });
    let mut out =
        blocking::TcpStream::connect(a.net(), SocketAddrV4::new(B, 5001)).expect("connect");
    let mut data = vec![0u8; BYTES];
    fill_pattern(0, &mut data);
    out.write_all(&data).expect("write_all");
    out.shutdown().expect("shutdown");
    let got = reader.join().expect("reader thread");
    assert_eq!(got.len(), BYTES);
    assert_eq!(count_mismatches(0, &got), 0);
    // Wait (bounded) until B has the whole stream and our FIN.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let done = b
            .net()
            .with_stack(|s| s.stats().tcp.totals.bytes_in >= BYTES as u64)
            .unwrap();
        if done {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    drop(out);
    let host_b = b.stop().expect("B's loop");
    assert_eq!(host_b.send.error, None);
    assert!(host_b.send.done());
    assert_eq!(host_b.recv.errors, vec![]);
    assert_eq!(host_b.recv.completed.len(), 1);
    assert_eq!(host_b.recv.completed[0].bytes, BYTES as u64);
    assert_eq!(host_b.recv.corrupt_bytes, 0);
    assert_eq!(host_b.recv.completed[0].crc, crc32fast::hash(&data));
    a.stop().expect("A's loop");
}

#[test]
fn connect_to_a_closed_port_is_refused_and_a_stopped_loop_says_so() {
    let (a, b) = pair(LinkConfig::default());
    let err = blocking::TcpStream::connect(a.net(), SocketAddrV4::new(B, 9))
        .expect_err("nothing listens on 9");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    let net = a.net().clone();
    a.stop().expect("A's loop");
    let err = blocking::TcpStream::connect(&net, SocketAddrV4::new(B, 9)).expect_err("stopped");
    assert_eq!(err.kind(), std::io::ErrorKind::NotConnected);
    drop(b);
}

#[test]
fn a_dropped_listener_refuses_new_connections() {
    let (a, b) = pair(LinkConfig::default());
    let listener = blocking::TcpListener::bind(b.net(), 7000, 4).expect("listen");
    let first = blocking::TcpStream::connect(a.net(), SocketAddrV4::new(B, 7000)).expect("open");
    drop(listener);
    let err = blocking::TcpStream::connect(a.net(), SocketAddrV4::new(B, 7000))
        .expect_err("not listening any more");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    // The port is free to listen on again.
    blocking::TcpListener::bind(b.net(), 7000, 4).expect("listen again");
    drop(first);
}

/// 64 MiB of a seeded pattern.
fn payload(len: usize) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(7);
    (0..len).map(|_| rng.u8(..)).collect()
}

#[test]
fn two_async_tasks_exchange_64_mib_byte_exact() {
    const LEN: usize = 64 << 20;
    let (a, b) = pair(LinkConfig::default());
    let data = payload(LEN);
    let want = Sha256::digest(&data);
    let listener = aio::TcpListener::bind(b.net(), 5201, 4).expect("listen");
    let mut pool = LocalPool::new();
    let spawner = pool.spawner();
    let server = spawner
        .spawn_local_with_handle(async move {
            let (mut s, _) = listener.accept().await?;
            let mut got = Vec::with_capacity(LEN);
            s.read_to_end(&mut got).await?;
            // Send it all back, then close.
            s.write_all(&got).await?;
            s.close().await?;
            Ok::<_, std::io::Error>(Sha256::digest(&got))
        })
        .unwrap();
    let net = a.net().clone();
    let client = spawner
        .spawn_local_with_handle(async move {
            let mut c = aio::TcpStream::connect(&net, SocketAddrV4::new(B, 5201)).await?;
            c.write_all(&data).await?;
            c.close().await?;
            let mut back = Vec::with_capacity(LEN);
            c.read_to_end(&mut back).await?;
            Ok::<_, std::io::Error>(Sha256::digest(&back))
        })
        .unwrap();
    let (server, client) = pool.run_until(async { futures::join!(server, client) });
    assert_eq!(server.expect("server"), want, "server got every byte");
    assert_eq!(client.expect("client"), want, "the echo came back whole");
}

#[test]
fn a_thousand_async_connections_share_one_stack() {
    const CONNS: usize = 1000;
    let (a, b) = pair(LinkConfig::default());
    let listener = aio::TcpListener::bind(b.net(), 7, 1024).expect("listen");
    let mut pool = LocalPool::new();
    let spawner = pool.spawner();
    // The server: accept every connection, echo it in its own task.
    let s2 = spawner.clone();
    spawner
        .spawn_local(async move {
            for _ in 0..CONNS {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                s2.spawn_local(async move {
                    let mut buf = [0u8; 4096];
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if s.write_all(&buf[..n]).await.is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    let _ = s.close().await;
                })
                .unwrap();
            }
        })
        .unwrap();
    let clients: Vec<_> = (0..CONNS)
        .map(|i| {
            let net = a.net().clone();
            spawner
                .spawn_local_with_handle(async move {
                    let mut c = aio::TcpStream::connect(&net, SocketAddrV4::new(B, 7)).await?;
                    let msg: Vec<u8> = (0..1000).map(|j| (i * 7 + j) as u8).collect();
                    c.write_all(&msg).await?;
                    c.close().await?;
                    let mut back = Vec::new();
                    c.read_to_end(&mut back).await?;
                    Ok::<_, std::io::Error>(back == msg)
                })
                .unwrap()
        })
        .collect();
    let results = pool.run_until(futures::future::join_all(clients));
    let ok = results.iter().filter(|r| matches!(r, Ok(true))).count();
    assert_eq!(
        ok,
        CONNS,
        "{:?}",
        results.iter().find(|r| !matches!(r, Ok(true)))
    );
    let stats = b.net().with_stack(|s| s.stats().tcp).unwrap();
    assert_eq!(stats.passive_opens, CONNS as u64);
    assert!(stats.connections_hwm >= 2, "connections were open at once");
}

#[test]
fn udp_both_ways_async_and_blocking() {
    let (a, b) = pair(LinkConfig::default());
    let echo = blocking::UdpSocket::bind(b.net(), 7).expect("bind 7");
    let server = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        for _ in 0..100 {
            let (n, from) = echo.recv_from(&mut buf).expect("recv");
            echo.send_to(&buf[..n], from).expect("send");
        }
    });
    let sock = aio::UdpSocket::bind(a.net(), 0).expect("bind");
    futures::executor::block_on(async {
        let mut buf = [0u8; 2048];
        for i in 0..100u16 {
            let msg = i.to_be_bytes().repeat(1 + usize::from(i));
            sock.send_to(&msg, SocketAddrV4::new(B, 7)).await.unwrap();
            let (n, from) = sock.recv_from(&mut buf).await.unwrap();
            assert_eq!(from, SocketAddrV4::new(B, 7).into());
            assert_eq!(&buf[..n], &msg[..]);
        }
    });
    server.join().unwrap();
}

#[test]
fn a_paused_loop_resumes_where_it_stopped() {
    let (mut a, b) = pair(LinkConfig::default());
    let listener = blocking::TcpListener::bind(b.net(), 7100, 4).expect("listen");
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut got = Vec::new();
        s.read_to_end(&mut got).expect("read");
        got
    });
    let mut c = blocking::TcpStream::connect(a.net(), SocketAddrV4::new(B, 7100)).expect("connect");
    c.write_all(b"before ").expect("write");
    // Paused (as before a fork): the connection, its data and the device wait.
    a.pause().expect("pause");
    a.resume().expect("resume");
    c.write_all(b"and after").expect("write");
    c.shutdown().expect("shutdown");
    assert_eq!(server.join().unwrap(), b"before and after");
    drop(c);
    a.stop().expect("A's loop");
}

/// Run to completion: a caller that drives the loop itself between its
/// calls (`Net::drive`) moves the frames of its own transfer, beside the
/// loop's thread, byte-exact; a paused loop is driven by nobody.
#[test]
fn a_caller_drives_the_loop_itself() {
    let (mut a, b) = pair(LinkConfig::default());
    let listener = blocking::TcpListener::bind(b.net(), 7200, 4).expect("listen");
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut got = Vec::new();
        s.read_to_end(&mut got).expect("read");
        got
    });
    let net = a.net().clone();
    let mut c = blocking::TcpStream::connect(&net, SocketAddrV4::new(B, 7200)).expect("connect");
    let data = payload(4 << 20);
    let mut driven = 0u32;
    for chunk in data.chunks(64 << 10) {
        c.write_all(chunk).expect("write");
        for _ in 0..50 {
            driven += u32::from(net.drive());
        }
    }
    c.shutdown().expect("shutdown");
    let got = server.join().unwrap();
    assert_eq!(Sha256::digest(&got), Sha256::digest(&data));
    assert!(driven > 0, "no iteration of the caller's moved a frame");
    a.pause().expect("pause");
    assert!(!net.drive(), "a paused loop was driven");
    a.resume().expect("resume");
    drop(c);
    a.stop().expect("A's loop");
}

/// RC from both fronts: a thread SENDs 64 messages of 64 KiB with the
/// blocking front while a task on an executor receives them (async front,
/// woken by the QP's readiness event); every message compared by hash.
/// Then the peer's QP goes away and the sender's completion reports the
/// retry count spent (the ERROR event wakes the waiter).
#[test]
fn rc_queue_pairs_from_the_blocking_and_async_fronts() {
    use ustack::socket::rc::{
        Access, Local, QpState, RcDest, RcOp, RcQpConfig, RcSendWr, WcOpcode, WcStatus,
    };
    use ustack_runtime::rdma::{MemoryRegion, RcQp};
    const MSG: usize = 64 * 1024;
    const N: u64 = 64;
    let (a, b) = pair(LinkConfig::default());
    // An ACK timeout of 67 ms (4.096 us << 14): the two stacks' threads
    // share two CPUs with whatever else runs, and a 1 ms one (timeout 8)
    // with one retry ran out on a loaded machine (RetryExceeded mid-way).
    let cfg = RcQpConfig {
        retry_cnt: 1,
        timeout: 14,
        ..RcQpConfig::default()
    };
    let qa = RcQp::create(a.net(), &cfg).unwrap();
    let qb = RcQp::create(b.net(), &cfg).unwrap();
    let (sa, sb) = (qa.status().unwrap(), qb.status().unwrap());
    qa.connect(RcDest {
        ip: B.into(),
        qpn: sb.qpn,
        psn: sb.initial_psn,
    })
    .unwrap();
    qb.connect(RcDest {
        ip: A.into(),
        qpn: sa.qpn,
        psn: sa.initial_psn,
    })
    .unwrap();
    let src = MemoryRegion::register(a.net(), MSG, Access::NONE).unwrap();
    let dst = MemoryRegion::register(b.net(), MSG * N as usize, Access::LOCAL_WRITE).unwrap();
    for i in 0..N {
        qb.post_recv(i, dst.sge(i as usize * MSG, MSG as u32))
            .unwrap();
    }
    let receiver = std::thread::spawn(move || {
        let mut pool = LocalPool::new();
        let digests = pool.run_until(async {
            let mut got = Vec::new();
            while got.len() < N as usize {
                for wc in qb.completions(16).await.unwrap() {
                    assert_eq!(
                        (wc.opcode, wc.status, wc.byte_len),
                        (WcOpcode::Recv, WcStatus::Success, MSG)
                    );
                    let bytes = dst.read(wc.wr_id as usize * MSG, MSG).unwrap();
                    got.push((wc.wr_id, Sha256::digest(&bytes).to_vec()));
                }
            }
            got
        });
        (digests, qb)
    });
    let mut sent = Vec::new();
    for i in 0..N {
        let mut msg = vec![0u8; MSG];
        fill_pattern(i * MSG as u64, &mut msg);
        src.write(0, &msg).unwrap();
        sent.push((i, Sha256::digest(&msg).to_vec()));
        qa.post_send(&RcSendWr {
            wr_id: i,
            op: RcOp::Send,
            local: Local::Sge(src.sge(0, MSG as u32)),
            signaled: true,
            solicited: false,
        })
        .unwrap();
        // The region is reused: wait until this SEND is acknowledged.
        let wcs = qa
            .wait_completions(1, Some(Duration::from_secs(20)))
            .unwrap();
        assert_eq!((wcs[0].wr_id, wcs[0].status), (i, WcStatus::Success));
    }
    let (got, qb) = receiver.join().unwrap();
    assert_eq!(got, sent, "every message arrived whole and in order");
    // The peer goes away: the next SEND fails after the retry count.
    drop(qb);
    qa.post_send(&RcSendWr {
        wr_id: 99,
        op: RcOp::Send,
        local: Local::Inline(b"anyone?"),
        signaled: true,
        solicited: false,
    })
    .unwrap();
    let wcs = qa
        .wait_completions(4, Some(Duration::from_secs(20)))
        .unwrap();
    assert_eq!((wcs[0].wr_id, wcs[0].status), (99, WcStatus::RetryExceeded));
    assert_eq!(qa.status().unwrap().state, QpState::Error);
    let _ = (a.stop(), b.stop());
}

/// The `now` a spawned loop hands the stack (and its app) is read once
/// the stack is the loop's: an iteration that first waited for the
/// stack's lock (a socket call holding it) must not arm its timers from
/// the time before the wait, or they fire early by the wait (an RC QP's
/// ACK timer, TCP's RTO). A thread holds the lock for 100 ms at a time
/// while the loop runs; the app sees how old each `now` is.
#[test]
fn a_spawned_loop_reads_the_clock_after_it_takes_the_stack() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use ustack_runtime::Clock;

    struct Lag {
        clock: Clock,
        worst_us: Arc<AtomicU64>,
        polls: Arc<AtomicU64>,
    }
    impl App for Lag {
        fn poll(&mut self, now: Instant, _stack: &mut Stack) -> Control {
            let lag = self.clock.now().saturating_duration_since(now);
            self.worst_us
                .fetch_max(lag.as_micros() as u64, Ordering::Relaxed);
            self.polls.fetch_add(1, Ordering::Relaxed);
            Control::Continue
        }
    }
    let link = SimLink::new(LinkConfig::default());
    let worst_us = Arc::new(AtomicU64::new(0));
    let polls = Arc::new(AtomicU64::new(0));
    let rt = Builder::new()
        .sim(&link)
        .ip(A, 24)
        .spawn_with(Lag {
            clock: Clock::new(),
            worst_us: worst_us.clone(),
            polls: polls.clone(),
        })
        .expect("spawn");
    for _ in 0..5 {
        rt.net()
            .with_stack(|_| std::thread::sleep(Duration::from_millis(100)))
            .unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = rt.stop();
    assert!(polls.load(Ordering::Relaxed) > 5, "the loop ran");
    let worst = worst_us.load(Ordering::Relaxed);
    // Read before the lock, `now` was about 100 ms old each time.
    assert!(
        worst < 30_000,
        "an iteration ran on a clock reading {worst} µs old"
    );
}
