//! perftest's output: the banner, the address lines and the latency and
//! bandwidth tables, with the figures computed as perftest computes them
//! (`print_report_lat`, `print_report_bw`); a figure without a time span
//! prints `n/a`.

use ustack::Instant;
use ustack::wire::exchange::KeyMsg;

use super::BW_CQ_MOD;

/// perftest's `RESULT_LINE` (without its newline): 87 dashes.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";
/// perftest's latency table header (`RESULT_FMT_LAT`, trailing space included).
pub const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";
/// perftest's bandwidth table header (`RESULT_FMT`).
pub const BW_HEADER: &str =
    " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";
/// The device name in our banner.
pub const DEVICE_NAME: &str = "ustack (RoCEv2 by the stack)";
/// Most peak-bandwidth windows started (perftest starts one at every
/// message, quadratic in the iterations).
const PEAK_STARTS: usize = 20_000;

/// One row of perftest's latency table, microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatRow {
    /// Message size.
    pub bytes: usize,
    /// Iterations run.
    pub iters: u64,
    /// Smallest, largest (without the two largest samples), median, mean,
    /// standard deviation, 99th and 99.9th percentile; `None` without a
    /// time span.
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub typical: Option<f64>,
    pub avg: Option<f64>,
    pub stdev: Option<f64>,
    pub p99: Option<f64>,
    pub p999: Option<f64>,
}

/// One row of perftest's bandwidth table (MB = 2^20 bytes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwRow {
    /// Message size.
    pub bytes: usize,
    /// Messages the figures count.
    pub iters: u64,
    /// Best MB/s over windows ending at completion-moderation points
    /// (sender only); `None` without a span (and at a receiver).
    pub peak: Option<f64>,
    /// MB/s over the whole run.
    pub avg: Option<f64>,
    /// Million messages per second over the whole run.
    pub msg_rate: Option<f64>,
}

/// A row of either table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Row {
    /// A latency row.
    Lat(LatRow),
    /// A bandwidth row.
    Bw(BwRow),
}

impl std::fmt::Display for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Row::Lat(r) => f.write_str(&lat_row_line(r)),
            Row::Bw(r) => f.write_str(&bw_row_line(r)),
        }
    }
}

/// `%-7.{prec}f` of a figure, `n/a` when there is none.
fn fig(v: Option<f64>, prec: usize) -> String {
    format!("{:<7}", crate::report::figure(v, prec))
}

/// A row as perftest prints it (`REPORT_FMT_LAT`).
pub fn lat_row_line(r: &LatRow) -> String {
    format!(
        " {:<7} {}          {}        {}      {}  \t       {}     \t{}\t\t{} \t\t{}",
        r.bytes,
        r.iters,
        fig(r.min, 2),
        fig(r.max, 2),
        fig(r.typical, 2),
        fig(r.avg, 2),
        fig(r.stdev, 2),
        fig(r.p99, 2),
        fig(r.p999, 2)
    )
}

/// A row as perftest prints it (`REPORT_FMT`).
pub fn bw_row_line(r: &BwRow) -> String {
    format!(
        " {:<7}    {:<10}       {}            {}\t\t   {}",
        r.bytes,
        r.iters,
        fig(r.peak, 2),
        fig(r.avg, 2),
        fig(r.msg_rate, 6)
    )
}

/// perftest's latency figures from the post time of every send
/// (`print_report_lat`): the `iters - 1` gaps between successive posts,
/// halved (a round trip is two one-way trips), sorted, the two largest
/// dropped. The standard deviation keeps perftest's truncation of each
/// deviation and its square to whole microseconds, so both tools print the
/// same figure for the same samples.
pub fn lat_row(bytes: usize, tposted: &[Instant]) -> LatRow {
    lat_row_rtt(bytes, tposted, 2)
}

/// [`lat_row`] with perftest's `rtt_factor`: 2 when each gap is a round
/// trip of two one-way messages (SEND, WRITE ping-pong), 1 when it is one
/// operation's round trip (RDMA READ).
pub fn lat_row_rtt(bytes: usize, tposted: &[Instant], rtt_factor: u32) -> LatRow {
    let iters = tposted.len() as u64;
    let mut d: Vec<u64> = tposted
        .windows(2)
        .map(|w| w[1].as_nanos().saturating_sub(w[0].as_nanos()))
        .collect();
    d.sort_unstable();
    let none = LatRow {
        bytes,
        iters,
        min: None,
        max: None,
        typical: None,
        avg: None,
        stdev: None,
        p99: None,
        p999: None,
    };
    // perftest needs at least 5 iterations: 4 gaps, 2 kept.
    let Some(n) = d.len().checked_sub(2).filter(|&n| n >= 2) else {
        return none;
    };
    if d[..=n].iter().all(|&x| x == 0) {
        return none;
    }
    let us = |x: u64| x as f64 / 1000.0 / f64::from(rtt_factor.max(1));
    let median = if (n - 1) % 2 == 1 {
        (d[n / 2] + d[n / 2 - 1]) / 2
    } else {
        d[n / 2]
    };
    let avg = d[..n].iter().map(|&x| us(x)).sum::<f64>() / n as f64;
    let var = d[..n]
        .iter()
        .map(|&x| {
            let dev = (avg - us(x)) as i32;
            f64::from((f64::from(dev).powi(2)) as i32)
        })
        .sum::<f64>()
        / n as f64;
    let at = |q: f64| d[((n as f64 * q).ceil() as usize).min(n)];
    LatRow {
        min: Some(us(d[0])),
        max: Some(us(d[n])),
        typical: Some(us(median)),
        avg: Some(avg),
        stdev: Some(var.sqrt()),
        p99: Some(us(at(0.99))),
        p999: Some(us(at(0.999))),
        ..none
    }
}

const MB: f64 = (1u64 << 20) as f64;

/// A sender's figures (`print_report_bw`): the average from the first post
/// to the last send completion; the peak is the best of perftest's windows,
/// from a post to a completion-moderation point (every 100th completion,
/// and the last), among those with a time span.
pub fn bw_sender_row(bytes: usize, tposted: &[Instant], tcompleted: &[Instant]) -> BwRow {
    bw_sender_row_cq(bytes, tposted, tcompleted, BW_CQ_MOD)
}

/// [`bw_sender_row`] with perftest's completion moderation `cq_mod`: the
/// peak windows end at every `cq_mod`-th completion (and the last); only
/// those entries of `tcompleted` are read.
pub fn bw_sender_row_cq(
    bytes: usize,
    tposted: &[Instant],
    tcompleted: &[Instant],
    cq_mod: usize,
) -> BwRow {
    let cq_mod = cq_mod.max(1);
    let n = tposted.len().min(tcompleted.len());
    let row = BwRow {
        bytes,
        iters: n as u64,
        peak: None,
        avg: None,
        msg_rate: None,
    };
    if n == 0 {
        return row;
    }
    let ns = |t: &Instant| t.as_nanos();
    let span = ns(&tcompleted[n - 1]).saturating_sub(ns(&tposted[0]));
    if span == 0 {
        return row;
    }
    let secs = span as f64 / 1e9;
    // Nanoseconds per message of the best window. Windows without a span
    // (posted and completed within one turn of the loop, whose clock
    // stamps both) measure nothing and are skipped.
    let mut best: Option<f64> = None;
    let step = n.div_ceil(PEAK_STARTS).max(1);
    for i in (0..n).step_by(step) {
        let mut window = |j: usize| {
            let t = ns(&tcompleted[j]).saturating_sub(ns(&tposted[i]));
            if t > 0 {
                let per = t as f64 / (j - i + 1) as f64;
                best = Some(best.map_or(per, |b| b.min(per)));
            }
        };
        let mut j = (i + 1).div_ceil(cq_mod) * cq_mod - 1;
        while j < n {
            window(j);
            j += cq_mod;
        }
        if n % cq_mod != 0 {
            window(n - 1);
        }
    }
    BwRow {
        peak: best.map(|b| bytes as f64 * 1e9 / b / MB),
        avg: Some(n as f64 * bytes as f64 / secs / MB),
        msg_rate: Some(n as f64 / secs / 1e6),
        ..row
    }
}

/// A receiver's figures: `count` messages of `bytes` from the first to the
/// last receive completion (perftest's server starts its clock at the first
/// packet and prints no peak).
pub fn bw_receiver_row(
    bytes: usize,
    count: u64,
    first: Option<Instant>,
    last: Option<Instant>,
) -> BwRow {
    let span = match (first, last) {
        (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
        _ => 0.0,
    };
    let (avg, msg_rate) = if span > 0.0 {
        (
            Some(count as f64 * bytes as f64 / span / MB),
            Some(count as f64 / span / 1e6),
        )
    } else {
        (None, None)
    };
    BwRow {
        bytes,
        iters: count,
        peak: None,
        avg,
        msg_rate,
    }
}

/// C's `%#0{width}x`: `0x` and hex digits padded to `width` in all, or
/// just zeros for 0 (C adds no `0x` to a zero).
pub(crate) fn c_alt_hex(v: u64, width: usize) -> String {
    if v == 0 {
        "0".repeat(width)
    } else {
        format!("{v:#0width$x}")
    }
}

/// perftest's address lines for one side (`ctx_print_pingpong_data`):
/// LID, QPN and PSN, then the GID's bytes in decimal.
pub fn address_lines(side: &str, k: &KeyMsg) -> String {
    address_lines_verb(side, k, AddrVerb::Send)
}

/// What perftest adds to an address line for the test's verb.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrVerb {
    /// SEND tests: nothing.
    Send,
    /// WRITE tests: the buffer's RKey and VAddr.
    Write,
    /// READ tests: the outstanding reads, then RKey and VAddr.
    Read,
}

/// [`address_lines`] for a test of `verb` (`READ_FMT`, `RDMA_FMT`).
pub fn address_lines_verb(side: &str, k: &KeyMsg, verb: AddrVerb) -> String {
    let gid: Vec<String> = k.gid.iter().map(|b| format!("{b:02}")).collect();
    let mut extra = String::new();
    if verb == AddrVerb::Read {
        extra += &format!(" OUT {}", c_alt_hex(u64::from(k.out_reads), 4));
    }
    if verb != AddrVerb::Send {
        extra += &format!(
            " RKey {} VAddr {}",
            c_alt_hex(u64::from(k.rkey), 8),
            c_alt_hex(k.vaddr, 16)
        );
    }
    format!(
        " {side} address: LID {} QPN {} PSN {}{extra}\n GID: {}",
        c_alt_hex(u64::from(k.lid), 4),
        c_alt_hex(u64::from(k.qpn), 6),
        c_alt_hex(u64::from(k.psn), 6),
        gid.join(":")
    )
}

/// What a banner shows (`ctx_print_test_info`'s fields that vary).
#[derive(Debug, Clone)]
pub struct BannerInfo<'a> {
    /// The test's title, e.g. `Send BW Test`.
    pub title: &'a str,
    /// `UD` or `RC`.
    pub connection: &'a str,
    /// The `TX depth` line, if shown.
    pub tx_depth: Option<u64>,
    /// The `RX depth` line, if shown.
    pub rx_depth: Option<u64>,
    /// The `CQ Moderation` line (bw tests).
    pub cq_mod: Option<usize>,
    /// The path MTU.
    pub mtu: usize,
    /// READ tests show `Outstand reads` instead of `Max inline data`.
    pub out_reads: Option<u16>,
}

/// perftest's banner from its varying fields.
pub fn banner_with(b: &BannerInfo<'_>) -> String {
    let mut s = format!(
        "{RESULT_LINE}\n                    {}\n Dual-port       : OFF\t\tDevice         : {DEVICE_NAME}\n Number of qps   : 1\t\tTransport type : IB\n Connection type : {}\t\tUsing SRQ      : OFF\n",
        b.title, b.connection
    );
    if let Some(d) = b.tx_depth {
        s += &format!(" TX depth        : {d}\n");
    }
    if let Some(d) = b.rx_depth {
        s += &format!(" RX depth        : {d}\n");
    }
    if let Some(m) = b.cq_mod {
        s += &format!(" CQ Moderation   : {m}\n");
    }
    let inline_or_reads = match b.out_reads {
        Some(r) => format!(" Outstand reads  : {r}"),
        None => " Max inline data : 0[B]".to_string(),
    };
    s += &format!(
        " Mtu             : {}[B]\n Link type       : Ethernet\n GID index       : 0\n{inline_or_reads}\n rdma_cm QPs\t : OFF\n Data ex. method : Ethernet\n{RESULT_LINE}",
        b.mtu
    );
    s
}

#[cfg(test)]
mod test {
    use super::*;
    use std::net::Ipv4Addr;
    use ustack::wire::exchange::ipv4_gid;

    #[test]
    fn alt_hex_like_c() {
        assert_eq!(c_alt_hex(0, 4), "0000");
        assert_eq!(c_alt_hex(0x11, 6), "0x0011");
        assert_eq!(c_alt_hex(0x5a3c1e, 6), "0x5a3c1e");
        assert_eq!(c_alt_hex(0, 6), "000000");
    }

    #[test]
    fn address_lines_like_perftest() {
        let k = KeyMsg {
            qpn: 0x11,
            psn: 0x5a3c1e,
            gid: ipv4_gid(Ipv4Addr::new(192, 168, 1, 2)),
            ..KeyMsg::default()
        };
        assert_eq!(
            address_lines("local", &k),
            " local address: LID 0000 QPN 0x0011 PSN 0x5a3c1e\n GID: 00:00:00:00:00:00:00:00:00:00:255:255:192:168:01:02"
        );
    }

    fn at_us(us: &[u64]) -> Vec<Instant> {
        let mut t = 0;
        us.iter()
            .map(|d| {
                t += d;
                Instant::from_nanos(t * 1000)
            })
            .collect()
    }

    #[test]
    fn latency_figures_as_perftest_computes_them() {
        // 10 posts: 9 gaps of 10 us (x6), 20, 40 and 100 us. The two
        // largest are dropped; perftest's max is delta[measure_cnt], the
        // smaller of the two dropped (40 us, halved: 20).
        let t = at_us(&[0, 10, 10, 10, 10, 10, 10, 20, 40, 100]);
        let r = lat_row(2, &t);
        assert_eq!(r.iters, 10);
        assert_eq!(r.min, Some(5.0));
        assert_eq!(r.max, Some(20.0));
        // 7 kept: 6 x 10 us and 1 x 20 us, halved.
        assert_eq!(r.typical, Some(5.0));
        let avg = (6.0 * 5.0 + 10.0) / 7.0;
        assert!((r.avg.unwrap() - avg).abs() < 1e-9);
        // Deviations truncated: (5.71-5)=0, (5.71-10)=-4 -> 16/7.
        assert!((r.stdev.unwrap() - (16.0f64 / 7.0).sqrt()).abs() < 1e-9);
        // ceil(7 * 0.99) = 7: the first dropped sample.
        assert_eq!(r.p99, Some(20.0));
        assert_eq!(r.p999, Some(20.0));
        let line = lat_row_line(&r);
        assert!(line.starts_with(" 2       10          5.00   "), "{line:?}");
        // No time span: n/a, never 0.00.
        let flat = lat_row(2, &[Instant::ZERO; 6]);
        assert_eq!(flat.min, None);
        assert!(lat_row_line(&flat).contains("n/a"));
        // Too few samples.
        assert_eq!(lat_row(2, &at_us(&[0, 1, 1])).avg, None);
    }

    #[test]
    fn median_of_an_even_count_averages_the_middle_two() {
        // 6 gaps kept of 8: 2,4,6,8,10,12 us (+ 2 large): median (6+8)/2.
        let t = at_us(&[0, 2, 4, 6, 8, 10, 12, 100, 200]);
        let r = lat_row(8, &t);
        assert_eq!(r.typical, Some(3.5));
    }

    #[test]
    fn bandwidth_figures_as_perftest_computes_them() {
        // 200 messages of 1024 bytes, one posted and completed every
        // microsecond: 1024 B/us.
        let tp: Vec<Instant> = (0..200).map(Instant::from_micros).collect();
        let tc: Vec<Instant> = (0..200).map(|i| Instant::from_micros(i + 1)).collect();
        let r = bw_sender_row(1024, &tp, &tc);
        let mbs = 1024.0 * 1e6 / MB;
        assert_eq!(r.iters, 200);
        assert!((r.avg.unwrap() - mbs).abs() < 1e-6, "{r:?}");
        assert!((r.msg_rate.unwrap() - 1.0).abs() < 1e-9);
        // The best window is the first message alone (1 us for 1 message).
        assert!((r.peak.unwrap() - mbs).abs() < 1e-6);
        let line = bw_row_line(&r);
        assert!(
            line.starts_with(" 1024       200              "),
            "{line:?}"
        );
        assert!(line.ends_with("1.000000"), "{line:?}");
        // Each message posted and completed in one turn of the loop: the
        // one-message windows have no span and are skipped; the best is
        // 2 messages (98 and 99) in 1 us.
        let t: Vec<Instant> = (0..200).map(Instant::from_micros).collect();
        let r = bw_sender_row(1024, &t, &t);
        assert!((r.peak.unwrap() - 1024.0 * 2.0 / 1e-6 / MB).abs() < 1e-6);
        assert!((r.avg.unwrap() - 1024.0 * 200.0 / 199e-6 / MB).abs() < 1e-6);
        // Everything in one instant: n/a.
        let same = vec![Instant::from_micros(5); 10];
        let r = bw_sender_row(64, &same, &same);
        assert_eq!((r.peak, r.avg, r.msg_rate), (None, None, None));
        assert!(bw_row_line(&r).contains("n/a"));
        let r = bw_receiver_row(
            1024,
            100,
            Some(Instant::from_millis(1)),
            Some(Instant::from_millis(2)),
        );
        assert_eq!(r.peak, None);
        assert!((r.msg_rate.unwrap() - 0.1).abs() < 1e-9);
        assert_eq!(bw_receiver_row(1024, 1, None, None).avg, None);
    }
}
