//! The RDMA UD front ends: `uping --rdma` (ping/pong over RoCEv2 UD),
//! `uperf -c HOST --rdma` (ib_send_bw-style message-size sweep) and
//! `uperf -s --rdma` (the sink), over the stack's own RoCEv2 transport on
//! any backend. `ustack run` hosts the same [`UdResponder`].

use crate::report::ms;
use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Result, bail};
use ustack::node::{App, Control, Node};
use ustack::phy::device::Device;
use ustack::socket::ud::{DEFAULT_QKEY, RESPONDER_QPN, UdAddr};
use ustack::{Instant, Stack};
use ustack_kit::ud_ping::{
    BwResult, UdBandwidth, UdBandwidthConfig, UdPingSummary, UdPinger, UdPingerConfig, UdPong,
    UdResponder,
};
use ustack_runtime::clock::Clock;
use ustack_runtime::{self as runtime, LoopConfig};

use crate::net::NodeRunner;

/// A QPN or Q_Key: decimal or 0x-prefixed hex.
pub fn parse_u32(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("'{s}' is not a number (decimal or 0x hex)"))
}

/// A QPN: 2..=0xffffff.
pub fn parse_qpn(s: &str) -> Result<u32, String> {
    match parse_u32(s)? {
        q @ 2..=0xff_ffff => Ok(q),
        q => Err(format!("QPN {q} is out of range (2..=0xffffff)")),
    }
}

/// Defaults for the flags: the responder's QPN and perftest's Q_Key.
pub const DEFAULT_QPN_STR: &str = "2";
pub const DEFAULT_QKEY_STR: &str = "0x11111111";
const _: () = assert!(RESPONDER_QPN == 2 && DEFAULT_QKEY == 0x1111_1111);

/// RTT with more decimals for shorter times, as iputils prints them.
fn reply_time(d: Duration) -> String {
    let us = (d.as_nanos() + 500) / 1000;
    match us {
        100_000.. => format!("{}", us / 1000),
        10_000.. => format!("{}.{:01}", us / 1000, (us % 1000) / 100),
        1_000.. => format!("{}.{:02}", us / 1000, (us % 1000) / 10),
        _ => format!("{}.{:03}", us / 1000, us % 1000),
    }
}

// ---------------------------------------------------------------- uping

/// `uping --rdma` settings.
#[derive(Debug, Clone)]
pub struct PingOpts {
    pub dst: IpAddr,
    pub qpn: u32,
    pub qkey: u32,
    pub count: Option<u64>,
    pub interval: Duration,
    pub size: usize,
    pub timeout: Duration,
    pub quiet: bool,
    pub json: bool,
    /// The pings' traffic class (`--tclass`).
    pub tclass: u8,
    /// The poll loop's settings (pinning, idle mode, the metrics feed).
    pub lcfg: LoopConfig,
}

/// One reply line, shaped like uping's ICMP lines.
pub fn pong_line(p: &UdPong) -> String {
    let dup = if p.duplicate { " (DUP!)" } else { "" };
    let time = if p.duplicate {
        String::new()
    } else {
        format!(" time={} ms", reply_time(p.rtt))
    };
    format!(
        "{} bytes from {}: ud_seq={}{time}{dup}",
        p.bytes, p.from, p.seq
    )
}

/// The summary lines, shaped like ping's, plus the percentiles.
pub fn ping_summary(dst: UdAddr, s: &UdPingSummary, elapsed: Duration) -> String {
    let mut out = crate::report::ping_statistics(
        &dst.to_string(),
        "rdma ud ping",
        [s.transmitted, s.received, s.duplicates, s.errors],
        &s.rtt,
        elapsed,
    );
    if s.rtt.count > 0 {
        let p = |q| s.percentile(q).map(ms).unwrap_or_default();
        out += &format!(
            "rtt p50/p99/max = {}/{}/{} ms\n",
            p(0.5),
            p(0.99),
            ms(s.rtt.max)
        );
        out += rtt_clock_line(s);
    }
    out
}

/// Which clock measured the RTTs: the NIC's completion timestamps (verbs on
/// a device that stamps completions) or the poll loop's.
pub fn rtt_clock_line(s: &UdPingSummary) -> &'static str {
    if s.extra.nic_stamped == 0 {
        "rtt clock = poll loop (post to receive completion)\n"
    } else if s.extra.nic_stamped == s.received {
        "rtt clock = nic (send to receive completion timestamps)\n"
    } else {
        "rtt clock = nic where both completions were stamped, else poll loop\n"
    }
}

fn ping_json(
    dst: UdAddr,
    s: &UdPingSummary,
    elapsed: Duration,
    replies: Vec<serde_json::Value>,
) -> serde_json::Value {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    serde_json::json!({
        "host": dst.ip.to_string(),
        "qpn": dst.qpn,
        "transmitted": s.transmitted,
        "received": s.received,
        "duplicates": s.duplicates,
        "errors": s.errors,
        "loss_percent": s.loss_percent(),
        "time_ms": elapsed.as_millis() as u64,
        "rtt_clock": if s.extra.nic_stamped > 0 { "nic" } else { "poll" },
        "rtt_ms": (s.rtt.count > 0).then(|| serde_json::json!({
            "min": ms(s.rtt.min), "avg": ms(s.rtt.avg()), "max": ms(s.rtt.max),
            "mdev": ms(s.rtt.mdev()),
            "p50": s.percentile(0.5).map(ms), "p99": s.percentile(0.99).map(ms),
        })),
        "replies": replies,
    })
}

struct PingFront {
    pinger: UdPinger,
    quiet: bool,
    json: bool,
    replies: Vec<serde_json::Value>,
}

impl App for PingFront {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let ctl = self.pinger.poll(now, stack);
        let events: Vec<UdPong> = self.pinger.drain_events().collect();
        for p in events {
            if self.json {
                self.replies.push(serde_json::json!({
                    "seq": p.seq, "bytes": p.bytes, "qpn": p.from.qpn,
                    "time_ms": p.rtt.as_secs_f64() * 1e3, "duplicate": p.duplicate,
                }));
            } else if !self.quiet {
                crate::outln!("{}", pong_line(&p));
            }
        }
        ctl
    }
    fn poll_at(&self) -> Option<Instant> {
        self.pinger.next_wakeup()
    }
    fn rx_wait(&self) -> ustack::node::RxWait {
        self.pinger.rx_wait()
    }
}

/// Runs `uping --rdma` on a node.
#[derive(Debug)]
pub struct PingUser(pub PingOpts);

impl NodeRunner for PingUser {
    type Output = ExitCode;
    type Error = anyhow::Error;
    fn run<D>(self, mut node: Node<D>) -> Result<ExitCode>
    where
        D: Device + Send + 'static,
        D::Buf: Send,
    {
        let o = self.0;
        let dst = UdAddr {
            ip: o.dst,
            qpn: o.qpn,
        };
        let max = node.stack.ud_max_msg();
        if o.size > max {
            bail!(
                "invalid -s value: '{}': a UD message holds at most {max} bytes here",
                o.size
            );
        }
        let mut cfg = UdPingerConfig::new(dst);
        cfg.qkey = o.qkey;
        cfg.count = o.count;
        cfg.interval = o.interval;
        cfg.size = o.size;
        cfg.timeout = o.timeout;
        cfg.traffic_class = o.tclass;
        let size = cfg.size.max(ustack_kit::ud_ping::PING_LEN);
        let mut front = PingFront {
            pinger: UdPinger::new(cfg),
            quiet: o.quiet,
            json: o.json,
            replies: Vec::new(),
        };
        if !o.json {
            crate::outln!(
                "RDMA UD PING {dst} qkey {:#010x}: {size} bytes per message, RoCEv2 from {}",
                o.qkey,
                node.stack.ip()
            );
        }
        let stop = crate::stop_flag()?;
        let clock = Clock::new();
        let lcfg = o.lcfg.clone();
        runtime::run(
            &mut node,
            &mut front,
            &lcfg,
            &clock,
            || stop.load(Ordering::Relaxed),
            |_| {},
        )?;
        if let Some(e) = front.pinger.error() {
            bail!("{dst}: {e}");
        }
        let s = front.pinger.summary().clone();
        // iputils' `time`: first request to last request.
        let elapsed = front
            .pinger
            .started()
            .zip(front.pinger.last_sent())
            .map_or(Duration::ZERO, |(a, b)| b.saturating_duration_since(a));
        if o.json {
            crate::outln!("{}", ping_json(dst, &s, elapsed, front.replies));
        } else {
            crate::out!("{}", ping_summary(dst, &s, elapsed));
        }
        Ok(if s.received > 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        })
    }
}

/// `uping --rdma --verbs`: the same pinger on a real RNIC through ibverbs
/// (NIC completion timestamps where the device has them).
#[cfg(feature = "verbs")]
pub fn verbs_ping(o: &PingOpts) -> Result<ExitCode> {
    use ustack_verbs::{VerbsConfig, VerbsUd};
    let mut dev = VerbsUd::open(&VerbsConfig {
        ipv6: o.dst.is_ipv6(),
        ..VerbsConfig::default()
    })?;
    let dst = UdAddr {
        ip: o.dst,
        qpn: o.qpn,
    };
    let mut cfg = UdPingerConfig::new(dst);
    cfg.qkey = o.qkey;
    cfg.count = o.count;
    cfg.interval = o.interval;
    cfg.size = o.size;
    cfg.timeout = o.timeout;
    cfg.traffic_class = o.tclass;
    let mut p = UdPinger::new(cfg);
    crate::outln!(
        "RDMA UD PING {dst} qkey {:#010x}: verbs device {} ({})",
        o.qkey,
        dev.device(),
        dev.local_ip()
    );
    let stop = crate::stop_flag()?;
    let clock = Clock::new();
    while !stop.load(Ordering::Relaxed) {
        let now = clock.now();
        let done = p.poll_transport(now, &mut dev as &mut dyn ustack::socket::ud::UdTransport)
            == Control::Exit;
        for e in p.drain_events() {
            if !o.quiet {
                crate::outln!("{}", pong_line(&e));
            }
        }
        if done {
            break;
        }
        std::thread::sleep(Duration::from_micros(20));
    }
    if let Some(e) = p.error() {
        bail!("{dst}: {e}");
    }
    let elapsed = p
        .started()
        .map_or(Duration::ZERO, |t| clock.now().saturating_duration_since(t));
    crate::out!("{}", ping_summary(dst, p.summary(), elapsed));
    Ok(if p.summary().received > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Without the `verbs` feature: say how to get it.
#[cfg(not(feature = "verbs"))]
pub fn verbs_ping(_: &PingOpts) -> Result<ExitCode> {
    bail!("this build has no ibverbs transport: rebuild with --features verbs")
}

// ---------------------------------------------------------------- uperf

/// `uperf -c HOST --rdma` settings.
#[derive(Debug, Clone)]
pub struct BwOpts {
    pub dst: IpAddr,
    pub qpn: u32,
    pub qkey: u32,
    pub iterations: u64,
    /// One size instead of the sweep.
    pub size: Option<usize>,
    /// The poll loop's settings (pinning, idle mode, the metrics feed).
    pub lcfg: LoopConfig,
}

/// The ib_send_bw table header.
pub fn bw_header() -> String {
    let rule = "-".repeat(95);
    format!(
        "{rule}\n #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]   Delivered\n"
    )
}

/// One row of the table (MB = 2^20 bytes, as perftest).
pub fn bw_row(r: &BwResult) -> String {
    let delivered = match r.delivered {
        Some(d) => format!("{d}/{}", r.iterations),
        None => "n/a".to_string(),
    };
    let fig = crate::report::figure;
    format!(
        " {:<10} {:<14} {:<18} {:<20} {:<15} {delivered}",
        r.bytes,
        r.iterations,
        fig(r.bw_peak_mbs, 2),
        fig(r.bw_avg_mbs, 2),
        fig(r.msg_rate_mpps, 6)
    )
}

struct BwFront(UdBandwidth);

impl App for BwFront {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let c = self.0.poll(now, stack);
        for r in self.0.take_results() {
            crate::outln!("{}", bw_row(&r));
        }
        c
    }
    fn poll_at(&self) -> Option<Instant> {
        self.0.next_wakeup()
    }
}

/// Runs `uperf -c HOST --rdma` on a node.
#[derive(Debug)]
pub struct BwUser(pub BwOpts);

impl NodeRunner for BwUser {
    type Output = ExitCode;
    type Error = anyhow::Error;
    fn run<D>(self, mut node: Node<D>) -> Result<ExitCode>
    where
        D: Device + Send + 'static,
        D::Buf: Send,
    {
        let o = self.0;
        let max = node.stack.ud_max_msg();
        let dst = UdAddr {
            ip: o.dst,
            qpn: o.qpn,
        };
        let mut cfg = UdBandwidthConfig::new(dst, max);
        cfg.qkey = o.qkey;
        cfg.iterations = o.iterations;
        if let Some(s) = o.size {
            if s == 0 || s > max {
                bail!("message size {s} is out of range: a UD message holds 1 to {max} bytes here");
            }
            cfg.sizes = vec![s];
        }
        crate::outln!(
            "                    Send BW Test (RoCEv2 UD by ustack)\n Dual-port: OFF  Transport: RoCEv2 UD  QP: to {dst}  Q_Key {:#010x}\n TX depth: {}  Max msg: {max} bytes  Iterations: {}",
            o.qkey,
            cfg.tx_depth,
            cfg.iterations
        );
        crate::out!("{}", bw_header());
        let mut front = BwFront(UdBandwidth::new(cfg));
        let lcfg = o.lcfg.clone();
        crate::run_app(&mut node, &mut front, &lcfg, None)?;
        crate::outln!("{}", "-".repeat(95));
        if let Some(e) = front.0.error() {
            bail!("{dst}: {e}");
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Runs `uperf -s --rdma`: the UD responder as a sink until Ctrl-C.
#[derive(Debug)]
pub struct SinkUser {
    pub qpn: u32,
    pub qkey: u32,
    /// The poll loop's settings (pinning, idle mode, the metrics feed).
    pub lcfg: LoopConfig,
}

impl NodeRunner for SinkUser {
    type Output = ExitCode;
    type Error = anyhow::Error;
    fn run<D>(self, mut node: Node<D>) -> Result<ExitCode>
    where
        D: Device + Send + 'static,
        D::Buf: Send,
    {
        let mut r = UdResponder::new(self.qpn, self.qkey);
        crate::outln!(
            "uperf: RDMA UD sink on {} qpn {} qkey {:#010x} (also answers UD pings)",
            node.stack.ip(),
            self.qpn,
            self.qkey
        );
        let lcfg = self.lcfg.clone();
        crate::run_app(&mut node, &mut r, &lcfg, None)?;
        if let Some(e) = r.error() {
            bail!("{e}");
        }
        crate::outln!("{}", responder_line(&r));
        Ok(ExitCode::SUCCESS)
    }
}

/// One line about a responder's work (for `ustack run` and the sink).
pub fn responder_line(r: &UdResponder) -> String {
    let s = r.stats();
    format!(
        "rdma ud: qpn {}: {} pings answered, {} sink messages ({} bytes), {} echoed",
        r.qpn(),
        s.pongs,
        s.sink_msgs,
        s.sink_bytes,
        s.echoed
    )
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn numbers_parse_decimal_and_hex() {
        assert_eq!(parse_u32("0x11111111"), Ok(0x1111_1111));
        assert_eq!(parse_u32("17"), Ok(17));
        assert!(parse_u32("x").is_err());
        assert!(parse_qpn("1").is_err());
        assert!(parse_qpn("0x1000000").is_err());
        assert_eq!(parse_qpn(DEFAULT_QPN_STR), Ok(RESPONDER_QPN));
        assert_eq!(parse_u32(DEFAULT_QKEY_STR), Ok(DEFAULT_QKEY));
    }

    #[test]
    fn table_row_like_perftest() {
        let r = BwResult {
            bytes: 64,
            iterations: 1000,
            bw_peak_mbs: Some(12.5),
            bw_avg_mbs: Some(10.25),
            msg_rate_mpps: Some(0.167_936),
            delivered: Some(1000),
        };
        let unmeasured = BwResult {
            bw_peak_mbs: None,
            bw_avg_mbs: None,
            msg_rate_mpps: None,
            ..r
        };
        assert!(
            bw_row(&unmeasured).contains(" n/a "),
            "{}",
            bw_row(&unmeasured)
        );
        assert!(!bw_row(&unmeasured).contains("0.00"));
        let row = bw_row(&r);
        assert!(row.starts_with(" 64 "));
        assert!(row.contains("12.50") && row.contains("10.25") && row.contains("0.167936"));
        assert!(row.ends_with("1000/1000"));
        assert!(bw_header().contains("#bytes     #iterations    BW peak[MB/sec]"));
    }
}
