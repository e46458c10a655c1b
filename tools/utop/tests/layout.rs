//! The monitor drawn headless: screen contents for a fixed snapshot, what a
//! frame writes to the terminal, and the engine's snapshots parsed as utop
//! reads them.

use std::net::SocketAddrV4;
use std::time::Duration;

use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::layout::Rect;
use serde_json::json;
use utop::term::Drawer;
use utop::{Frame, Monitor, Pane, Update, buffer_text};

/// A fixed snapshot: two pools, port counters, one established connection.
fn fixture(at_ms: u64, rx_packets: u64, in_use: u64) -> Box<Frame> {
    let v = json!({
        "name": "ustack 10.0.0.1/24", "pid": 4242, "seq": at_ms / 250, "at_ns": at_ms * 1_000_000,
        "publisher": {"clients": 1, "skipped": 0, "dropped_clients": 0},
        "stack": {
            "eth": {"rx_frames": 5000, "rx_bytes": 7_000_000, "rx_accepted": 4990, "tx_frames": 4000,
                    "tx_bytes": 300_000, "tx_no_buffer": 0},
            "arp": {"entries": 1, "hits": 3999, "misses": 1},
            "icmp": {"rx_echo_requests": 7, "tx_echo_replies": 7},
            "udp": {"rx_datagrams": 0, "sockets": 1},
            "tcp": {"connections": 1, "retransmits": 2, "totals": {"bytes_in": 6_500_000}},
            "ud": {"qps": 1, "rx_sends": 12},
            "drops": {"eth_not_for_us": 10, "tcp_bad_checksum": 0}
        },
        "port": {"rx_packets": rx_packets, "rx_bytes": 7_000_000, "tx_packets": 4000,
                 "tx_bytes": 300_000, "rx_missed": 3, "rx_nombuf": 0, "tx_errors": 0},
        "pools": [
            {"name": "sim-rx-pool", "capacity": 8192, "in_use": in_use, "alloc_failures": 0, "buf_size": 2048},
            {"name": "tx-slab", "capacity": 4096, "in_use": 0, "alloc_failures": 5, "buf_size": 2048}
        ],
        "connections": [{
            "local": "10.0.0.1:5001", "remote": "10.0.0.2:49152", "state": "Established",
            "cwnd": 64240, "ssthresh": 1_000_000, "snd_wnd": 65535, "rcv_wnd": 262144,
            "srtt_us": 850, "rttvar_us": 100, "rto_us": 200_000, "in_flight": 0,
            "send_queued": 0, "recv_queued": 0, "ooo_bytes": 1460, "mss": 1460,
            "congestion": "cubic",
            "stats": {"segs_in": 4500, "segs_out": 3000, "bytes_in": 6_500_000, "bytes_out": 100,
                      "retransmits": 2}
        }],
        "connections_total": 1
    });
    Box::new(serde_json::from_value(v).unwrap())
}

fn screen(m: &Monitor, w: u16, h: u16) -> String {
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    t.draw(|f| f.render_widget(m, f.area())).unwrap();
    buffer_text(t.backend().buffer())
}

fn monitor() -> Monitor {
    let mut m = Monitor::new("/run/ustack/a.sock");
    m.on_update(Update::Frame(fixture(0, 5000, 12)));
    m
}

#[test]
fn pools_pane_shows_every_pool() {
    let mut m = monitor();
    m.set_pane(Pane::Pools);
    let s = screen(&m, 120, 12);
    assert!(s.contains("ustack 10.0.0.1/24 (pid 4242)"), "{s}");
    let row = s.lines().find(|l| l.contains("sim-rx-pool")).expect(&s);
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert!(
        cells.windows(3).any(|w| w == ["8192", "12", "0.1%"]),
        "{row}"
    );
    let row = s.lines().find(|l| l.contains("tx-slab")).expect(&s);
    assert!(row.contains(" 5 "), "alloc failures shown: {row}");
    assert!(s.contains("pools 12/12288 in use, 5 alloc failures"), "{s}");
}

#[test]
fn ports_pane_shows_counters_and_drops_by_reason() {
    let mut m = monitor();
    m.set_pane(Pane::Ports);
    let s = screen(&m, 120, 20);
    let line = |name: &str| {
        s.lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("{name} in\n{s}"))
            .to_string()
    };
    assert!(line("rx packets").contains("5000"));
    assert!(line("rx missed").contains(" 3 "));
    assert!(line("eth accepted").contains("4990"));
    assert!(line("eth_not_for_us").contains("10"));
    // Zero counters are not listed as drop reasons.
    assert!(!s.contains("tcp_bad_checksum"), "{s}");
}

#[test]
fn connection_row_and_protocol_sections() {
    let m = monitor();
    let s = screen(&m, 160, 12);
    let row = s.lines().find(|l| l.contains("10.0.0.1:5001")).expect(&s);
    for cell in [
        "10.0.0.2:49152",
        "ESTABLISHED",
        "64.2K",
        "850us",
        "6.50M",
        "1.46K",
    ] {
        assert!(row.contains(cell), "{cell} in {row}");
    }
    assert!(s.contains("Connections: 1 shown of 1"), "{s}");

    let mut m = monitor();
    m.set_pane(Pane::Protocols);
    let s = screen(&m, 100, 20);
    assert!(s.contains("arp    entries 1  hits 3999  misses 1"), "{s}");
    assert!(
        s.contains("totals.bytes_in 6500000"),
        "nested counters: {s}"
    );
    // A section utop has never heard of is shown as it comes.
    assert!(s.contains("ud     qps 1  rx_sends 12"), "{s}");
}

#[test]
fn rates_come_from_successive_snapshots() {
    let mut m = monitor();
    let mut next = fixture(500, 6000, 12);
    next.connections[0].stats.bytes_in += 1_000_000;
    next.connections[0].stats.segs_in += 100;
    m.on_update(Update::Frame(next));
    let r = m.rates().port.unwrap();
    assert_eq!(r.rx_pps, 2000.0);
    let s = screen(&m, 160, 12);
    let row = s.lines().find(|l| l.contains("10.0.0.1:5001")).expect(&s);
    // 1 MB in 0.5 s, 100 segments in 0.5 s.
    assert!(row.contains("2.00M") && row.contains("200"), "{row}");
    assert!(s.contains("rx 2.00K pkt/s"), "{s}");
}

#[test]
fn filter_and_sort_pick_rows() {
    let mut m = monitor();
    let mut two = fixture(0, 5000, 12);
    let mut c = two.connections[0].clone();
    c.local = "10.0.0.1:80".into();
    c.state = "TimeWait".into();
    two.connections.push(c);
    m.on_update(Update::Frame(two));
    let order = |m: &Monitor| -> Vec<String> {
        m.connections()
            .iter()
            .map(|(c, _)| c.local.clone())
            .collect()
    };
    // Addresses sort by value (port 80 before 5001), not as text.
    assert_eq!(order(&m), ["10.0.0.1:80", "10.0.0.1:5001"]);
    use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
    let key = |c| KeyEvent::new(c, KeyModifiers::NONE);
    m.on_key(key(KeyCode::Char('r')));
    assert_eq!(order(&m), ["10.0.0.1:5001", "10.0.0.1:80"]);
    for c in "/time_w".chars() {
        m.on_key(key(KeyCode::Char(c)));
    }
    m.on_key(key(KeyCode::Enter));
    assert_eq!(order(&m), ["10.0.0.1:80"]);
    let s = screen(&m, 160, 12);
    assert!(
        s.contains("1 shown of 1") && s.contains("filter 'time_w'"),
        "{s}"
    );
}

#[test]
fn a_stack_that_exits_is_reported() {
    let mut m = monitor();
    m.on_update(Update::Gone("stack at /run/ustack/a.sock exited".into()));
    let s = screen(&m, 140, 10);
    assert!(
        s.contains("stack at /run/ustack/a.sock exited - waiting for it to come back (q quits)"),
        "{s}"
    );
    // The last snapshot stays on screen.
    assert!(s.contains("ESTABLISHED"), "{s}");
}

#[test]
fn the_same_snapshot_draws_nothing_and_one_counter_draws_a_few_cells() {
    let mut m = monitor().with_debug_draw(true);
    m.set_pane(Pane::Pools);
    let mut d = Drawer::new(Vec::new(), Some(Rect::new(0, 0, 120, 30))).unwrap();
    let first = d.draw_if_dirty(&mut m).unwrap().expect("first frame");
    assert!(first > 1000, "a full screen: {first} bytes");

    // The identical snapshot again: no frame at all.
    m.on_update(Update::Frame(fixture(0, 5000, 12)));
    assert_eq!(d.draw_if_dirty(&mut m).unwrap(), None);
    let before = d.written();

    // A later snapshot with the same counters: rates appear (zero), once.
    m.on_update(Update::Frame(fixture(250, 5000, 12)));
    assert!(d.draw_if_dirty(&mut m).unwrap().is_some());
    m.on_update(Update::Frame(fixture(500, 5000, 12)));
    assert_eq!(d.draw_if_dirty(&mut m).unwrap(), None, "nothing changed");
    assert!(d.written() > before);
    let before = d.written();
    assert_eq!(d.draw_if_dirty(&mut m).unwrap(), None);
    assert_eq!(d.written(), before, "zero bytes written");

    // One pool counter changes (12 -> 13): a few cells of the pool row, its
    // percentage and the summary line, plus the debug line's byte count.
    m.on_update(Update::Frame(fixture(750, 5000, 13)));
    let small = d.draw_if_dirty(&mut m).unwrap().expect("a frame");
    assert!(
        small < 160,
        "{small} bytes for one counter (full screen {first})"
    );
    assert_eq!(d.written() - before, small);
    eprintln!("full frame {first} bytes, one changed counter {small} bytes");
}

#[test]
fn text_frame_is_plain_and_has_every_pane() {
    let mut m = monitor();
    m.on_update(Update::Frame(fixture(250, 5400, 12)));
    let t = m.text_frame(160);
    assert!(!t.contains('\x1b'), "no escape codes");
    for s in [
        " Pools ",
        " Port ",
        " Drops by reason ",
        " Protocols ",
        "sim-rx-pool",
        "ESTABLISHED",
        "rx 1.60K pkt/s",
    ] {
        assert!(t.contains(s), "{s} in\n{t}");
    }
}

/// The engine's real snapshot, through the publisher, parsed by utop.
#[test]
fn engine_snapshots_parse_with_a_live_connection() {
    use ustack::sim::{LinkConfig, SimNet, host_config};
    use ustack_runtime::telemetry::Publisher;
    let mut net = SimNet::new(LinkConfig::default());
    let a = net.add(host_config(1));
    let b = net.add(host_config(2));
    net.nodes[b].stack.tcp().listen(5001, 4).unwrap();
    let dst = SocketAddrV4::new(net.nodes[b].stack.ip(), 5001);
    let h = net.nodes[a].stack.tcp().connect(net.now, dst).unwrap();
    let deadline = net.now + Duration::from_secs(5);
    let up = net.run_until(deadline, &mut [], |n| {
        n.nodes[a]
            .stack
            .tcp_ref()
            .status(h)
            .is_ok_and(|s| s.state.synchronized())
    });
    assert!(up, "connection established");
    let snap = net.nodes[a].snapshot(net.now);
    let p = Publisher::start("sim host A", None).unwrap();
    // Subscribed before the publish: the publisher thread sees both in order.
    let lines = p.subscribe();
    p.publish(&snap);
    let line = lines.recv_timeout(Duration::from_secs(5)).unwrap();
    let f = Frame::parse(&line).unwrap();
    assert_eq!(f.name, "sim host A");
    assert_eq!(f.pid, std::process::id());
    assert!(!f.pools.is_empty() && f.pools[0].capacity > 0);
    assert_eq!(f.connections_total, 1);
    let c = &f.connections[0];
    assert_eq!(c.state_label(), "ESTABLISHED");
    assert_eq!(c.remote, dst.to_string());
    assert!(c.cwnd > 0 && c.mss > 0);
    assert!(f.stack.contains_key("tcp") && f.stack.contains_key("arp"));
    assert!(f.counter("arp", "entries") >= 1);
}

#[test]
fn a_multi_core_stack_shows_a_row_per_core() {
    // The totals line the publisher writes for a two-core stack.
    let mut v = json!({"name": "ustack 10.0.0.1/24", "pid": 7, "port": {"rx_packets": 9000},
                       "connections_total": 16});
    v["shards"] = json!([
        {"shard": {"index": 0, "count": 2, "steered_out": 0, "passed_on": 4, "arp_replicas_out": 2,
                   "mail_in": 31, "mailbox_full": 0},
         "port": {"rx_packets": 4000, "tx_packets": 3900}, "connections_total": 7,
         "stack": {"drops": {"tcp_no_socket": 2}}},
        {"shard": {"index": 1, "count": 2, "steered_out": 31, "passed_on": 0, "arp_replicas_out": 5,
                   "mail_in": 6, "mailbox_full": 1},
         "port": {"rx_packets": 5000, "tx_packets": 4800}, "connections_total": 9,
         "stack": {"drops": {}}}
    ]);
    let frame: Frame = serde_json::from_value(v).unwrap();
    let mut m = Monitor::new("/run/ustack/a.sock");
    m.on_update(Update::Frame(Box::new(frame)));
    m.set_pane(Pane::Ports);
    let s = screen(&m, 120, 24);
    assert!(s.contains("Cores (one stack per queue)"), "{s}");
    let row = |first: &str| {
        s.lines()
            .map(|l| l.trim_matches('│').split_whitespace().collect::<Vec<_>>())
            .find(|w| w.len() > 3 && w[..3].join(" ") == first)
            .unwrap_or_else(|| panic!("{first} in\n{s}"))[3..]
            .to_vec()
    };
    assert_eq!(
        row("0 of 2"),
        ["4000", "3900", "7", "2", "0", "4", "2", "0"]
    );
    assert_eq!(
        row("1 of 2"),
        ["5000", "4800", "9", "0", "31", "0", "5", "1"]
    );
    // The text frame has it too.
    assert!(m.text_frame(120).contains("Cores (one stack per queue)"));
}

/// The standard 80x24 terminal: whole columns with their titles (not
/// every column cut to four characters), rates in bytes and bits a second,
/// and a long Protocols pane that scrolls.
#[test]
fn readable_at_80_by_24() {
    let mut m = Monitor::new("/run/ustack/a.sock");
    m.on_update(Update::Frame(fixture(0, 5000, 12)));
    m.on_update(Update::Frame(fixture(1000, 9000, 12)));
    m.set_pane(Pane::Connections);
    let s = screen(&m, 80, 24);
    let head = s.lines().find(|l| l.contains("Remote")).expect("a header");
    for title in ["Local", "Remote", "State", "SRTT", "RxB/s", "TxB/s"] {
        assert!(head.contains(title), "{title} missing from {head}\n{s}");
    }
    assert!(
        s.contains("10.0.0.1:5001") && s.contains("10.0.0.2:49152"),
        "{s}"
    );
    assert!(
        s.contains("ESTABLISHED") || s.contains("Established"),
        "{s}"
    );
    assert!(
        s.contains("columns"),
        "the title says columns are hidden: {s}"
    );
    // Rates with their units, bits beside bytes.
    // The summary wraps rather than losing its end (the transmit rate).
    let summary: String = s.lines().skip(2).take(2).collect();
    assert!(summary.contains("rx ") && summary.contains("tx "), "{s}");
    assert_eq!(summary.matches("bit/s").count(), 2, "{summary}");
    assert!(summary.contains("tcp 1 connections"), "{summary}");
    // A Protocols pane longer than the screen scrolls.
    let mut long = fixture(2000, 9000, 12);
    for i in 0..40 {
        long.stack
            .insert(format!("extra{i:02}"), serde_json::json!({"counter": i}));
    }
    m.on_update(Update::Frame(long));
    m.set_pane(Pane::Protocols);
    let top = screen(&m, 80, 24);
    assert!(top.contains("lines 1-"), "{top}");
    assert!(top.contains("eth "), "{top}");
    for _ in 0..30 {
        m.on_key(ratatui::crossterm::event::KeyEvent::from(
            ratatui::crossterm::event::KeyCode::Down,
        ));
    }
    let down = screen(&m, 80, 24);
    assert!(down.contains("lines 31-"), "{down}");
    assert!(down.contains("extra"), "{down}");
    assert!(!down.contains("eth    rx"), "{down}");
}

/// A live RC QP pair in the engine, through the publisher: the RDMA pane
/// names the QP, its peer, its state and its counters.
#[test]
fn rdma_pane_shows_the_engines_rc_queue_pairs() {
    use ustack::sim::{LinkConfig, SimNet, host_config};
    use ustack::socket::rc::{Access, Local, RcDest, RcOp, RcQpConfig, RcSendWr};
    use ustack_runtime::telemetry::Publisher;
    let mut net = SimNet::new(LinkConfig::default());
    let a = net.add(host_config(1));
    let b = net.add(host_config(2));
    let qa = net.nodes[a]
        .stack
        .rc()
        .create_qp(&RcQpConfig::default())
        .unwrap();
    let qb = net.nodes[b]
        .stack
        .rc()
        .create_qp(&RcQpConfig::default())
        .unwrap();
    let sa = net.nodes[a].stack.rc_ref().qp_status(qa).unwrap();
    let sb = net.nodes[b].stack.rc_ref().qp_status(qb).unwrap();
    let (ia, ib) = (net.nodes[a].stack.ip(), net.nodes[b].stack.ip());
    net.nodes[a]
        .stack
        .rc()
        .connect(
            qa,
            RcDest {
                ip: ib.into(),
                qpn: sb.qpn,
                psn: sb.initial_psn,
            },
        )
        .unwrap();
    net.nodes[b]
        .stack
        .rc()
        .connect(
            qb,
            RcDest {
                ip: ia.into(),
                qpn: sa.qpn,
                psn: sa.initial_psn,
            },
        )
        .unwrap();
    let mr = net.nodes[b].stack.rc().reg_mr(8192, Access::ALL).unwrap();
    let info = net.nodes[b].stack.rc_ref().mr_info(mr).unwrap();
    net.nodes[a]
        .stack
        .rc()
        .post_send(
            qa,
            &RcSendWr {
                wr_id: 1,
                op: RcOp::Write {
                    remote_addr: info.addr,
                    rkey: info.rkey,
                },
                local: Local::Inline(&[7; 5000]),
                signaled: true,
                solicited: false,
            },
        )
        .unwrap();
    let deadline = net.now + Duration::from_secs(5);
    let mut wcs = Vec::new();
    assert!(net.run_until(deadline, &mut [], |n| {
        n.nodes[a].stack.rc().poll_cq(qa, 8, &mut wcs).unwrap();
        !wcs.is_empty()
    }));
    let p = Publisher::start("rc host A", None).unwrap();
    let lines = p.subscribe();
    p.publish(&net.nodes[a].snapshot(net.now));
    let f = Frame::parse(&lines.recv_timeout(Duration::from_secs(5)).unwrap()).unwrap();
    assert_eq!(f.rc_qps.len(), 1);
    let q = &f.rc_qps[0];
    assert_eq!(q.qpn, u64::from(sa.qpn));
    assert_eq!(q.state, "Rts");
    assert_eq!(q.stats.tx_packets, 5, "5000 bytes in 1024-byte packets");
    assert_eq!(q.una_psn, q.next_psn, "all acknowledged");
    assert_eq!(f.counter("rc", "qps"), 1);
    let mut m = Monitor::new("x");
    m.on_update(Update::Frame(Box::new(f)));
    let t = m.text_frame(200);
    for s in [
        " RDMA RC queue pairs: 1 ",
        "RTS",
        &format!("{ib} qpn {}", sb.qpn),
    ] {
        assert!(t.contains(s), "{s} in\n{t}");
    }
}
