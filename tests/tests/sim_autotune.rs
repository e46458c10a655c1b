//! Receive-window autotuning on the sim link: on a path whose
//! bandwidth-delay product is larger than the initial receive buffer, the
//! receiver grows its window with the measured BDP (and the transfer gets
//! faster in virtual time), never past `recv_buffer_max`, and all
//! connections together never past the stack's `autotune_memory`.

use std::net::SocketAddrV4;
use std::time::Duration;

use ustack::sim::{LinkConfig, SimNet, host_config};
use ustack::socket::tcp::TcpStats;
use ustack::{Config, Instant};
use ustack_kit::bulk::{BulkRecv, BulkSend};

/// What one transfer showed.
struct Run {
    /// Virtual time from start to the last byte.
    took: Duration,
    /// Largest receive window the receiver advertised (from its telemetry).
    peak_rcv_wnd: usize,
    receiver: TcpStats,
}

/// 16 MiB from host 1 to host 2 over 1 Gbit/s with a 10 ms RTT (a BDP of
/// 1.25 MB, five times the initial 256 KiB buffer).
fn transfer(receiver: impl Fn(&mut Config)) -> Run {
    const BYTES: u64 = 16 << 20;
    let link = LinkConfig {
        delay: Duration::from_millis(5),
        rate_bps: 1_000_000_000,
        queue_frames: 100_000,
        ..LinkConfig::default()
    };
    let mut net = SimNet::new(link);
    let mut sender = host_config(1);
    // The sender must be able to keep a BDP in flight.
    sender.tcp.send_buffer = 8 << 20;
    net.add(sender);
    let mut cfg = host_config(2);
    receiver(&mut cfg);
    net.add(cfg);
    let b = net.nodes[1].stack.ip();
    let mut send = BulkSend::new(SocketAddrV4::new(b, 5001), BYTES);
    let mut recv = BulkRecv::new(5001, 4);
    let mut peak = 0;
    let deadline = Instant::from_secs(60);
    while !(send.done() && recv.completed.len() == 1) && net.now < deadline {
        let until = net.now + Duration::from_millis(5);
        net.run_until(until, &mut [&mut send, &mut recv], |_| false);
        for c in net.nodes[1].stack.tcp_ref().connections() {
            peak = peak.max(c.rcv_wnd);
        }
    }
    assert_eq!(send.error, None);
    assert!(recv.errors.is_empty(), "{:?}", recv.errors);
    let got = *recv.completed.first().expect("the transfer completed");
    assert_eq!(got.bytes, BYTES);
    assert_eq!(got.crc, send.transfer.crc, "byte-exact");
    // Let both ends finish closing.
    let until = net.now + Duration::from_secs(1);
    net.run_until(until, &mut [&mut send, &mut recv], |_| false);
    assert_eq!(net.nodes[1].stack.stats().tcp.connections, 0);
    Run {
        took: got
            .finished
            .unwrap()
            .saturating_duration_since(got.started.unwrap()),
        peak_rcv_wnd: peak,
        receiver: net.nodes[1].stack.stats().tcp,
    }
}

#[test]
fn window_grows_with_the_bandwidth_delay_product() {
    let fixed = transfer(|c| c.tcp.recv_buffer_max = c.tcp.recv_buffer);
    let tuned = transfer(|_| {});
    let initial = Config::new(host_config(2).mac, host_config(2).ip)
        .tcp
        .recv_buffer;
    assert_eq!(fixed.receiver.rcvbuf_grown, 0);
    assert!(fixed.peak_rcv_wnd <= initial);
    assert!(tuned.receiver.rcvbuf_grown > 0);
    assert!(
        tuned.peak_rcv_wnd > 1_250_000,
        "the window passes the BDP: {}",
        tuned.peak_rcv_wnd
    );
    assert!(tuned.peak_rcv_wnd <= 4 << 20, "and stays under the max");
    // Virtual time: deterministic, not a wall-clock measurement.
    assert!(
        tuned.took * 2 < fixed.took,
        "autotuned {:?} vs fixed {:?}",
        tuned.took,
        fixed.took
    );
    // The connection is gone: the growth was given back.
    assert_eq!(tuned.receiver.autotune_bytes, 0);
}

#[test]
fn growth_stays_within_the_stack_memory_limit() {
    let limit = 512 << 10;
    let run = transfer(|c| c.tcp.autotune_memory = limit);
    assert!(run.receiver.autotune_limited > 0);
    let initial = host_config(2).tcp.recv_buffer;
    assert!(
        run.peak_rcv_wnd <= initial + limit,
        "{} > {}",
        run.peak_rcv_wnd,
        initial + limit
    );
}
