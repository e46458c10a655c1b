//! The iperf3-compatible client run by `uperf -c`: one test against a stock
//! `iperf3 -s` (or `uperf -s`, or `ustack run`), driven from the poll loop.
//!
//! Sequence (iperf 3.12): cookie on the control connection; the server asks
//! for parameters (9) and to create streams (10); each data stream connects
//! and sends the cookie; the server says start (1) and running (2); after
//! `time` seconds the client says test end (4); results are exchanged (13)
//! both ways as JSON; the server says display (14); the client says done (16).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use ustack::node::{App, Control};
use ustack::socket::tcp::{State, TcpHandle};
use ustack::{Instant, Stack};
use ustack_kit::bulk::fill_pattern;

use crate::cpu::CpuSample;
use crate::iperf::*;

/// The server ended the test with an error (followed by two i32s).
const SERVER_ERROR: u8 = 0xfe;
const SERVER_TERMINATE: u8 = 11;
/// How long to wait for our last bytes to leave after the test.
const LINGER: Duration = Duration::from_secs(1);

/// What `uperf -c` was asked to do.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub server: SocketAddr,
    /// Seconds of data transfer.
    pub time: f64,
    pub parallel: usize,
    /// The server sends, we receive.
    pub reverse: bool,
    /// Bytes per write (iperf3's block length).
    pub len: usize,
    /// Seconds between interval reports; 0 turns them off.
    pub interval: f64,
    pub connect_timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Connecting,
    /// Waiting for PARAM_EXCHANGE, CREATE_STREAMS, TEST_START, TEST_RUNNING.
    Setup,
    Running,
    AwaitExchange,
    AwaitServerResults,
    AwaitDisplay,
    Closing,
    Done,
}

#[derive(Debug, Default, Clone, Copy)]
struct RttStats {
    min: u64,
    max: u64,
    sum: u64,
    n: u64,
    max_cwnd: u64,
    max_snd_wnd: u64,
}

#[derive(Debug)]
struct Stream {
    h: TcpHandle,
    id: u32,
    cookie_sent: bool,
    bytes: u64,
    interval_bytes: u64,
    interval_retrans: u64,
    rtt: RttStats,
}

impl Stream {
    fn socket(&self) -> u32 {
        self.id + 4
    }
}

/// One test run by `uperf -c`.
pub struct IperfClient {
    cfg: ClientConfig,
    stop: Arc<AtomicBool>,
    phase: Phase,
    cookie: Vec<u8>,
    ctrl: Option<TcpHandle>,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    streams: Vec<Stream>,
    buf: Vec<u8>,
    began: Instant,
    started: Option<Instant>,
    interval_start: Instant,
    end_at: Option<Instant>,
    linger_until: Option<Instant>,
    test_secs: f64,
    cpu: Option<CpuSample>,
    our_cpu: (f64, f64, f64),
    connected: Vec<Value>,
    intervals: Vec<Value>,
    server_results: Option<Value>,
    mss: usize,
    congestion: &'static str,
    /// Per stream at the end: (socket, our bytes, their bytes, retransmits, receiver seconds).
    summary_rows: Vec<(u32, u64, u64, u64, f64)>,
    /// Lines to print (text mode).
    pub output: Vec<String>,
    /// Why the test failed, as iperf3 words it.
    pub error: Option<String>,
}

impl core::fmt::Debug for IperfClient {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("IperfClient")
            .field("server", &self.cfg.server)
            .field("phase", &self.phase)
            .finish()
    }
}

/// A cookie as iperf3 makes them: 36 characters of base32 and a NUL.
fn make_cookie() -> Vec<u8> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut rng = fastrand_seed();
    let mut c: Vec<u8> = (0..COOKIE_LEN - 1)
        .map(|_| {
            rng = rng
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ALPHABET[(rng >> 59) as usize]
        })
        .collect();
    c.push(0);
    c
}

fn fastrand_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

fn secs(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64()
}

fn bps(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 * 8.0 / secs
    } else {
        0.0
    }
}

impl IperfClient {
    pub fn new(cfg: ClientConfig, stop: Arc<AtomicBool>) -> Self {
        let len = cfg.len;
        IperfClient {
            cfg,
            stop,
            phase: Phase::Connecting,
            cookie: make_cookie(),
            ctrl: None,
            inbuf: Vec::new(),
            out: Vec::new(),
            streams: Vec::new(),
            buf: vec![0; len],
            began: Instant::ZERO,
            started: None,
            interval_start: Instant::ZERO,
            end_at: None,
            linger_until: None,
            test_secs: 0.0,
            cpu: None,
            our_cpu: (0.0, 0.0, 0.0),
            connected: Vec::new(),
            intervals: Vec::new(),
            server_results: None,
            mss: 0,
            congestion: "",
            summary_rows: Vec::new(),
            output: Vec::new(),
            error: None,
        }
    }

    /// Whether the test ran to the end.
    pub fn succeeded(&self) -> bool {
        self.phase == Phase::Done && self.error.is_none()
    }

    fn fail(&mut self, stack: &mut Stack, now: Instant, why: String) {
        if self.error.is_none() {
            self.error = Some(why);
        }
        self.close_all(stack, now);
    }

    fn close_all(&mut self, stack: &mut Stack, now: Instant) {
        // What is still queued for the server (IPERF_DONE, CLIENT_TERMINATE)
        // goes out ahead of our FIN.
        if let Some(c) = self.ctrl {
            send_out(stack, c, &mut self.out);
        }
        for s in &self.streams {
            let _ = stack.tcp().close(now, s.h);
        }
        // The control connection is only shut down here, so the closing
        // phase can watch our last bytes get acknowledged.
        if let Some(c) = self.ctrl {
            let _ = stack.tcp().shutdown(c);
        }
        self.phase = Phase::Closing;
        self.linger_until = Some(now + LINGER);
    }

    fn params_json(&self) -> Value {
        let mut p = json!({
            "tcp": true, "omit": 0, "time": self.cfg.time.round() as u64, "num": 0,
            "blockcount": 0, "parallel": self.cfg.parallel, "len": self.cfg.len,
            "pacing_timer": 1000, "client_version": "3.12",
        });
        if self.cfg.reverse {
            p["reverse"] = json!(true);
        }
        p
    }

    /// Handle the control bytes that arrived, as far as the phase allows.
    fn control(&mut self, stack: &mut Stack, now: Instant) {
        loop {
            let Some(&state) = self.inbuf.first() else {
                return;
            };
            match (self.phase, state) {
                (Phase::AwaitServerResults, _) => {
                    match take_json(&mut self.inbuf) {
                        Ok(Some(json)) => match serde_json::from_slice::<Value>(&json) {
                            Ok(v) => {
                                self.server_results = Some(v);
                                self.phase = Phase::AwaitDisplay;
                            }
                            Err(e) => {
                                return self.fail(stack, now, format!("bad results JSON: {e}"));
                            }
                        },
                        Ok(None) => return,
                        Err(e) => return self.fail(stack, now, e),
                    }
                    continue;
                }
                (_, ACCESS_DENIED) => {
                    return self.fail(
                        stack,
                        now,
                        "the server is busy running a test. try again later".into(),
                    );
                }
                (_, SERVER_ERROR) => {
                    if self.inbuf.len() < 9 {
                        return;
                    }
                    let i_errno = i32::from_be_bytes([
                        self.inbuf[1],
                        self.inbuf[2],
                        self.inbuf[3],
                        self.inbuf[4],
                    ]);
                    return self.fail(
                        stack,
                        now,
                        format!("the server reported an error (i_errno {i_errno})"),
                    );
                }
                (_, SERVER_TERMINATE) => {
                    return self.fail(stack, now, "the server has terminated".into());
                }
                (Phase::Setup, PARAM_EXCHANGE) => {
                    let p = frame_json(&self.params_json());
                    self.out.extend(p);
                }
                (Phase::Setup, CREATE_STREAMS) => {
                    for i in 0..self.cfg.parallel {
                        match stack.tcp().connect(now, self.cfg.server) {
                            Ok(h) => self.streams.push(Stream {
                                h,
                                id: stream_id(i),
                                cookie_sent: false,
                                bytes: 0,
                                interval_bytes: 0,
                                interval_retrans: 0,
                                rtt: RttStats::default(),
                            }),
                            Err(e) => {
                                return self.fail(
                                    stack,
                                    now,
                                    format!("unable to create a new stream: {e}"),
                                );
                            }
                        }
                    }
                }
                (Phase::Setup, TEST_START) => {}
                (Phase::Setup, TEST_RUNNING) => self.start(stack, now),
                (Phase::AwaitExchange, EXCHANGE_RESULTS) => {
                    self.test_secs = self.started.map_or(0.0, |s| secs(s, now));
                    if let Some(c) = self.cpu {
                        self.our_cpu = c.percent_since();
                    }
                    let r = frame_json(&self.results_json(stack));
                    self.out.extend(r);
                    self.phase = Phase::AwaitServerResults;
                }
                (Phase::AwaitDisplay, DISPLAY_RESULTS) => {
                    self.out.push(IPERF_DONE);
                    self.summary(stack);
                    self.phase = Phase::Closing;
                    self.inbuf.remove(0);
                    self.close_all(stack, now);
                    return;
                }
                (phase, other) => {
                    return self.fail(
                        stack,
                        now,
                        format!("unexpected state {other} from the server in {phase:?}"),
                    );
                }
            }
            self.inbuf.remove(0);
        }
    }

    fn start(&mut self, stack: &mut Stack, now: Instant) {
        self.phase = Phase::Running;
        self.started = Some(now);
        self.interval_start = now;
        self.end_at = Some(now + Duration::from_secs_f64(self.cfg.time));
        self.cpu = Some(CpuSample::now());
        let mut lines = Vec::new();
        for s in &self.streams {
            if let Some(i) = stack.tcp_ref().info(s.h) {
                self.mss = i.mss;
                self.congestion = i.congestion;
                lines.push(format!(
                    "[{:3}] local {} port {} connected to {} port {}",
                    s.socket(),
                    i.local.ip(),
                    i.local.port(),
                    i.remote.ip(),
                    i.remote.port()
                ));
                self.connected.push(json!({
                    "socket": s.socket(), "local_host": i.local.ip().to_string(),
                    "local_port": i.local.port(), "remote_host": i.remote.ip().to_string(),
                    "remote_port": i.remote.port(),
                }));
            }
        }
        lines.push(if self.cfg.reverse {
            "[ ID] Interval           Transfer     Bitrate".into()
        } else {
            "[ ID] Interval           Transfer     Bitrate         Retr  Cwnd".into()
        });
        self.output.extend(lines);
    }

    fn move_data(&mut self, stack: &mut Stack) {
        for s in &mut self.streams {
            if self.cfg.reverse {
                while let Ok(n) = stack.tcp().recv(s.h, &mut self.buf) {
                    if n == 0 {
                        break;
                    }
                    s.bytes += n as u64;
                    s.interval_bytes += n as u64;
                }
                continue;
            }
            loop {
                let room = stack
                    .tcp_ref()
                    .status(s.h)
                    .map_or(0, |st| st.writable)
                    .min(self.buf.len());
                if room == 0 {
                    break;
                }
                fill_pattern(s.bytes, &mut self.buf[..room]);
                match stack.tcp().send(s.h, &self.buf[..room]) {
                    Ok(n) if n > 0 => {
                        s.bytes += n as u64;
                        s.interval_bytes += n as u64;
                    }
                    _ => break,
                }
            }
        }
    }

    fn report_interval(&mut self, stack: &Stack, now: Instant) {
        let Some(started) = self.started else { return };
        let from = secs(started, self.interval_start);
        let to = secs(started, now);
        if to - from < 0.000_1 {
            return;
        }
        let sender = !self.cfg.reverse;
        let mut lines = Vec::new();
        let mut streams = Vec::new();
        let (mut sum, mut sum_retr) = (0u64, 0u64);
        for s in &mut self.streams {
            let info = stack.tcp_ref().info(s.h);
            let retr_total = info.as_ref().map_or(0, |i| i.stats.retransmits);
            let retr = retr_total.saturating_sub(s.interval_retrans);
            s.interval_retrans = retr_total;
            let cwnd = info.as_ref().map_or(0, |i| i.cwnd as u64);
            let snd_wnd = info.as_ref().map_or(0, |i| i.snd_wnd as u64);
            let (rtt, rttvar) = info.as_ref().map_or((0, 0), |i| {
                (i.srtt_us.unwrap_or(0), i.rttvar_us.unwrap_or(0))
            });
            if rtt > 0 {
                let r = &mut s.rtt;
                r.min = if r.n == 0 { rtt } else { r.min.min(rtt) };
                r.max = r.max.max(rtt);
                r.sum += rtt;
                r.n += 1;
            }
            s.rtt.max_cwnd = s.rtt.max_cwnd.max(cwnd);
            s.rtt.max_snd_wnd = s.rtt.max_snd_wnd.max(snd_wnd);
            let rate = bps(s.interval_bytes, to - from);
            lines.push(if sender {
                format!(
                    "[{:3}] {:6.2}-{:<6.2} sec  {}  {}  {:4}   {}       ",
                    s.socket(),
                    from,
                    to,
                    fmt_bytes(s.interval_bytes),
                    fmt_rate(rate),
                    retr,
                    fmt_bytes(cwnd)
                )
            } else {
                format!(
                    "[{:3}] {:6.2}-{:<6.2} sec  {}  {}                  ",
                    s.socket(),
                    from,
                    to,
                    fmt_bytes(s.interval_bytes),
                    fmt_rate(rate)
                )
            });
            let mut j = json!({
                "socket": s.socket(), "start": from, "end": to, "seconds": to - from,
                "bytes": s.interval_bytes, "bits_per_second": rate, "omitted": false,
                "sender": sender,
            });
            if sender {
                j["retransmits"] = json!(retr);
                j["snd_cwnd"] = json!(cwnd);
                j["snd_wnd"] = json!(snd_wnd);
                j["rtt"] = json!(rtt);
                j["rttvar"] = json!(rttvar);
                j["pmtu"] = json!(self.mss + 40);
            }
            streams.push(j);
            sum += s.interval_bytes;
            sum_retr += retr;
            s.interval_bytes = 0;
        }
        let rate = bps(sum, to - from);
        let mut sum_j = json!({
            "start": from, "end": to, "seconds": to - from, "bytes": sum,
            "bits_per_second": rate, "omitted": false, "sender": sender,
        });
        if sender {
            sum_j["retransmits"] = json!(sum_retr);
        }
        if self.streams.len() > 1 {
            lines.push(if sender {
                format!(
                    "[SUM] {:6.2}-{:<6.2} sec  {}  {}  {:4}             ",
                    from,
                    to,
                    fmt_bytes(sum),
                    fmt_rate(rate),
                    sum_retr
                )
            } else {
                format!(
                    "[SUM] {:6.2}-{:<6.2} sec  {}  {}                  ",
                    from,
                    to,
                    fmt_bytes(sum),
                    fmt_rate(rate)
                )
            });
            lines.push("- - - - - - - - - - - - - - - - - - - - - - - - -".into());
        }
        self.intervals
            .push(json!({"streams": streams, "sum": sum_j}));
        self.interval_start = now;
        if self.cfg.interval > 0.0 {
            self.output.extend(lines);
        }
    }

    fn retransmits(&self, stack: &Stack, s: &Stream) -> u64 {
        stack.tcp_ref().info(s.h).map_or(0, |i| i.stats.retransmits)
    }

    fn results_json(&self, stack: &Stack) -> Value {
        let sender = !self.cfg.reverse;
        let streams: Vec<Value> = self
            .streams
            .iter()
            .map(|s| {
                let retr = if sender {
                    self.retransmits(stack, s) as i64
                } else {
                    -1
                };
                json!({"id": s.id, "bytes": s.bytes, "retransmits": retr, "jitter": 0,
                       "errors": 0, "packets": 0, "start_time": 0, "end_time": self.test_secs})
            })
            .collect();
        json!({
            "cpu_util_total": self.our_cpu.0, "cpu_util_user": self.our_cpu.1,
            "cpu_util_system": self.our_cpu.2,
            "sender_has_retransmits": if sender { 1 } else { -1 },
            "congestion_used": self.congestion,
            "streams": streams,
        })
    }

    /// The server's numbers for stream `id`: (bytes, retransmits, seconds).
    fn server_stream(&self, id: u32) -> (u64, Option<u64>, Option<f64>) {
        let Some(streams) = self
            .server_results
            .as_ref()
            .and_then(|r| r["streams"].as_array())
        else {
            return (0, None, None);
        };
        let Some(s) = streams
            .iter()
            .find(|s| s["id"].as_u64() == Some(u64::from(id)))
        else {
            return (0, None, None);
        };
        // iperf 3.12 prints -1 as u64::MAX.
        let retr = s["retransmits"]
            .as_u64()
            .filter(|&r| r != u64::MAX && s["retransmits"].as_i64() != Some(-1));
        let secs = match (s["start_time"].as_f64(), s["end_time"].as_f64()) {
            (Some(a), Some(b)) if b > a => Some(b - a),
            _ => None,
        };
        (s["bytes"].as_u64().unwrap_or(0), retr, secs)
    }

    /// Per stream: (socket, our bytes, their bytes, sender retransmits, receiver seconds).
    fn totals(&self, stack: &Stack) -> Vec<(u32, u64, u64, u64, f64)> {
        self.streams
            .iter()
            .map(|s| {
                let (theirs, their_retr, their_secs) = self.server_stream(s.id);
                let retr = if self.cfg.reverse {
                    their_retr.unwrap_or(0)
                } else {
                    self.retransmits(stack, s)
                };
                let rsecs = if self.cfg.reverse {
                    self.test_secs
                } else {
                    their_secs.unwrap_or(self.test_secs)
                };
                (s.socket(), s.bytes, theirs, retr, rsecs)
            })
            .collect()
    }

    /// (sent, received) bytes: sender's count first, whichever side sent.
    fn sent_received(&self, ours: u64, theirs: u64) -> (u64, u64) {
        if self.cfg.reverse {
            (theirs, ours)
        } else {
            (ours, theirs)
        }
    }

    fn summary(&mut self, stack: &Stack) {
        let t = self.test_secs;
        let mut text = Vec::new();
        // With several streams each interval already ends in a separator.
        if self.streams.len() < 2 || self.cfg.interval == 0.0 {
            text.push("- - - - - - - - - - - - - - - - - - - - - - - - -".to_string());
        }
        text.push("[ ID] Interval           Transfer     Bitrate         Retr".to_string());
        let rows = self.totals(stack);
        let mut sums = (0u64, 0u64, 0u64, 0f64);
        for &(socket, ours, theirs, retr, rsecs) in &rows {
            let (sent, recvd) = self.sent_received(ours, theirs);
            text.push(format!(
                "[{socket:3}] {:6.2}-{:<6.2} sec  {}  {}  {retr:4}             sender",
                0.0,
                t,
                fmt_bytes(sent),
                fmt_rate(bps(sent, t))
            ));
            text.push(format!(
                "[{socket:3}] {:6.2}-{:<6.2} sec  {}  {}                  receiver",
                0.0,
                rsecs,
                fmt_bytes(recvd),
                fmt_rate(bps(recvd, rsecs))
            ));
            sums.0 += sent;
            sums.1 += recvd;
            sums.2 += retr;
            sums.3 = sums.3.max(rsecs);
        }
        if rows.len() > 1 {
            let (sent, recvd, retr, rsecs) = sums;
            text.push(format!(
                "[SUM] {:6.2}-{:<6.2} sec  {}  {}  {retr:4}             sender",
                0.0,
                t,
                fmt_bytes(sent),
                fmt_rate(bps(sent, t))
            ));
            text.push(format!(
                "[SUM] {:6.2}-{:<6.2} sec  {}  {}                  receiver",
                0.0,
                rsecs,
                fmt_bytes(recvd),
                fmt_rate(bps(recvd, rsecs))
            ));
        }
        text.push(String::new());
        text.push("iperf Done.".into());
        self.summary_rows = rows;
        self.output.extend(text);
    }

    /// The run as iperf3's `-J` prints it (`start`, `intervals`, `end`, and
    /// `error` when the test failed).
    pub fn json(&self, started_wall: std::time::SystemTime) -> Value {
        let timesecs = started_wall
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut start = json!({
            "connected": self.connected,
            "version": concat!("uperf ", env!("CARGO_PKG_VERSION"), " (iperf 3.12 protocol)"),
            "system_info": "ustack userspace TCP/IP",
            "timestamp": {"time": http_date(timesecs), "timesecs": timesecs},
            "connecting_to": {"host": self.cfg.server.ip().to_string(), "port": self.cfg.server.port()},
            "cookie": String::from_utf8_lossy(&self.cookie[..COOKIE_LEN - 1]),
            "tcp_mss_default": self.mss,
            "target_bitrate": 0,
            "test_start": {
                "protocol": "TCP", "num_streams": self.cfg.parallel, "blksize": self.cfg.len,
                "omit": 0, "duration": self.cfg.time.round() as u64, "bytes": 0, "blocks": 0,
                "reverse": u8::from(self.cfg.reverse), "tos": 0, "target_bitrate": 0,
            },
        });
        if self.connected.is_empty() {
            start["connected"] = json!([]);
        }
        let sender = !self.cfg.reverse;
        let t = self.test_secs;
        let mut streams = Vec::new();
        let (mut sent, mut recvd, mut retr, mut rsecs) = (0u64, 0u64, 0u64, 0f64);
        for (i, &(socket, ours, theirs, r, rs)) in self.summary_rows.iter().enumerate() {
            let (s_bytes, r_bytes) = self.sent_received(ours, theirs);
            let rtt = self.streams.get(i).map(|s| s.rtt).unwrap_or_default();
            streams.push(json!({
                "sender": {
                    "socket": socket, "start": 0, "end": t, "seconds": t, "bytes": s_bytes,
                    "bits_per_second": bps(s_bytes, t), "retransmits": r,
                    "max_snd_cwnd": rtt.max_cwnd, "max_snd_wnd": rtt.max_snd_wnd,
                    "max_rtt": rtt.max, "min_rtt": rtt.min,
                    "mean_rtt": rtt.sum.checked_div(rtt.n).unwrap_or(0), "sender": sender,
                },
                "receiver": {
                    "socket": socket, "start": 0, "end": rs, "seconds": rs, "bytes": r_bytes,
                    "bits_per_second": bps(r_bytes, rs), "sender": sender,
                },
            }));
            sent += s_bytes;
            recvd += r_bytes;
            retr += r;
            rsecs = rsecs.max(rs);
        }
        let remote = self.server_results.as_ref();
        let cpu = |k: &str| remote.and_then(|r| r[k].as_f64()).unwrap_or(0.0);
        let end = json!({
            "streams": streams,
            "sum_sent": {"start": 0, "end": t, "seconds": t, "bytes": sent,
                         "bits_per_second": bps(sent, t), "retransmits": retr, "sender": sender},
            "sum_received": {"start": 0, "end": rsecs, "seconds": rsecs, "bytes": recvd,
                             "bits_per_second": bps(recvd, rsecs), "sender": sender},
            "cpu_utilization_percent": {
                "host_total": self.our_cpu.0, "host_user": self.our_cpu.1,
                "host_system": self.our_cpu.2, "remote_total": cpu("cpu_util_total"),
                "remote_user": cpu("cpu_util_user"), "remote_system": cpu("cpu_util_system"),
            },
            "sender_tcp_congestion": if sender { self.congestion.to_string() } else {
                remote.and_then(|r| r["congestion_used"].as_str()).unwrap_or("").to_string() },
            "receiver_tcp_congestion": if sender {
                remote.and_then(|r| r["congestion_used"].as_str()).unwrap_or("").to_string()
            } else { self.congestion.to_string() },
        });
        let mut v = json!({"start": start, "intervals": self.intervals, "end": end});
        if let Some(e) = &self.error {
            v["error"] = json!(e);
        }
        v
    }
}

/// `Mon, 23 Nov 2026 00:52:56 GMT` for seconds since the epoch.
fn http_date(secs: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (proleptic Gregorian calendar).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{}, {:02} {} {} {:02}:{:02}:{:02} GMT",
        DAYS[(days % 7) as usize],
        day,
        MONTHS[(month - 1) as usize],
        year,
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

impl App for IperfClient {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        if self.phase == Phase::Done {
            return Control::Exit;
        }
        if self.phase == Phase::Connecting && self.ctrl.is_none() {
            self.began = now;
            self.output.push(format!(
                "Connecting to host {}, port {}",
                self.cfg.server.ip(),
                self.cfg.server.port()
            ));
            if self.cfg.reverse {
                self.output.push(format!(
                    "Reverse mode, remote host {} is sending",
                    self.cfg.server.ip()
                ));
            }
            match stack.tcp().connect(now, self.cfg.server) {
                Ok(h) => self.ctrl = Some(h),
                Err(e) => {
                    self.error = Some(format!("unable to connect to server: {e}"));
                    self.phase = Phase::Done;
                    return Control::Exit;
                }
            }
        }
        let Some(ctrl) = self.ctrl else {
            return Control::Exit;
        };
        if self.phase == Phase::Closing {
            send_out(stack, ctrl, &mut self.out);
            let gone = stack.tcp_ref().status(ctrl).map_or(true, |s| {
                matches!(
                    s.state,
                    State::Closed | State::TimeWait | State::FinWait2 | State::LastAck
                ) && s.unacked == 0
                    || s.error.is_some()
            });
            if gone || self.linger_until.is_some_and(|t| now >= t) {
                let _ = stack.tcp().close(now, ctrl);
                self.phase = Phase::Done;
                return Control::Exit;
            }
            return Control::Continue;
        }
        if self.stop.load(Ordering::Relaxed) {
            // As iperf3 on SIGINT: the interval so far and the summary of
            // what this side saw (the server's numbers never came, so its
            // column reads 0), then "interrupt - the client has terminated".
            if matches!(self.phase, Phase::Running | Phase::AwaitExchange) {
                if self.phase == Phase::Running {
                    self.report_interval(stack, now);
                }
                if let Some(started) = self.started {
                    self.test_secs = secs(started, now);
                }
                self.summary(stack);
                // No "iperf Done.": the test did not finish.
                if self.output.last().is_some_and(|l| l == "iperf Done.") {
                    self.output.pop();
                    if self.output.last().is_some_and(String::is_empty) {
                        self.output.pop();
                    }
                }
            }
            self.out.push(CLIENT_TERMINATE);
            send_out(stack, ctrl, &mut self.out);
            self.fail(stack, now, "interrupt - the client has terminated".into());
            return Control::Continue;
        }
        let status = stack.tcp_ref().status(ctrl);
        match status {
            Ok(s) if s.error.is_some() => {
                let e = s.error.map(|e| e.to_string()).unwrap_or_default();
                let why = if self.phase == Phase::Connecting {
                    format!("unable to connect to server: {e}")
                } else {
                    format!("control socket has closed unexpectedly: {e}")
                };
                self.fail(stack, now, why);
                return Control::Continue;
            }
            Ok(s) if self.phase == Phase::Connecting => {
                if s.state == State::Established {
                    self.out.extend_from_slice(&self.cookie);
                    self.phase = Phase::Setup;
                } else if now.saturating_duration_since(self.began) >= self.cfg.connect_timeout {
                    self.fail(
                        stack,
                        now,
                        format!(
                            "unable to connect to server: no answer from {} within {:.1} s{}",
                            self.cfg.server,
                            self.cfg.connect_timeout.as_secs_f64(),
                            crate::bad_checksum_hint(stack)
                        ),
                    );
                    return Control::Continue;
                } else {
                    return Control::Continue;
                }
            }
            Ok(_) => {}
            Err(e) => {
                self.fail(stack, now, format!("control connection lost: {e}"));
                return Control::Continue;
            }
        }
        // Control bytes in.
        let mut b = [0u8; 4096];
        while let Ok(n) = stack.tcp().recv(ctrl, &mut b) {
            if n == 0 {
                break;
            }
            self.inbuf.extend_from_slice(&b[..n]);
        }
        self.control(stack, now);
        if matches!(self.phase, Phase::Closing | Phase::Done) {
            return Control::Continue;
        }
        if stack.tcp_ref().status(ctrl).is_ok_and(|s| s.eof) {
            self.fail(stack, now, "control socket has closed unexpectedly".into());
            return Control::Continue;
        }
        // Data streams: the cookie first, then data.
        for s in &mut self.streams {
            if !s.cookie_sent
                && stack
                    .tcp_ref()
                    .status(s.h)
                    .is_ok_and(|st| st.state == State::Established)
                && stack.tcp().send(s.h, &self.cookie).ok() == Some(COOKIE_LEN)
            {
                s.cookie_sent = true;
            }
        }
        // After the test end the server may reset the data streams (iperf3
        // closes them with unread data): only a failure before counts.
        let stream_error = matches!(self.phase, Phase::Setup | Phase::Running)
            .then(|| {
                self.streams
                    .iter()
                    .find_map(|s| stack.tcp_ref().status(s.h).ok().and_then(|st| st.error))
            })
            .flatten();
        if let Some(e) = stream_error {
            self.fail(stack, now, format!("data stream failed: {e}"));
            return Control::Continue;
        }
        let running = self.phase == Phase::Running;
        // Forward: send while running. Reverse: keep reading what the server
        // sent until our results go out.
        if running || self.cfg.reverse && self.phase == Phase::AwaitExchange {
            self.move_data(stack);
        }
        if running {
            if now
                .saturating_duration_since(self.interval_start)
                .as_secs_f64()
                >= self.cfg.interval.max(0.1).min(self.cfg.time.max(0.1))
                && self.end_at.is_some_and(|e| now < e)
            {
                self.report_interval(stack, now);
            }
            if self.end_at.is_some_and(|e| now >= e) {
                self.report_interval(stack, now);
                self.out.push(TEST_END);
                self.phase = Phase::AwaitExchange;
            }
        }
        send_out(stack, ctrl, &mut self.out);
        Control::Continue
    }

    fn poll_at(&self) -> Option<Instant> {
        match self.phase {
            Phase::Running => {
                let next =
                    self.interval_start + Duration::from_secs_f64(self.cfg.interval.max(0.1));
                Some(self.end_at.map_or(next, |e| e.min(next)))
            }
            Phase::Closing => self.linger_until,
            Phase::Connecting => Some(self.began + self.cfg.connect_timeout),
            _ => None,
        }
    }
}

fn send_out(stack: &mut Stack, h: TcpHandle, out: &mut Vec<u8>) {
    if out.is_empty() {
        return;
    }
    if let Ok(n) = stack.tcp().send(h, out) {
        out.drain(..n);
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn dates_like_iperf3() {
        assert_eq!(http_date(1_795_395_176), "Mon, 23 Nov 2026 00:52:56 GMT");
        assert_eq!(http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(http_date(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
    }

    #[test]
    fn cookies_are_iperf3_shaped() {
        let c = make_cookie();
        assert_eq!(c.len(), COOKIE_LEN);
        assert_eq!(c[COOKIE_LEN - 1], 0);
        assert!(
            c[..COOKIE_LEN - 1]
                .iter()
                .all(|b| b"abcdefghijklmnopqrstuvwxyz234567".contains(b))
        );
        assert_ne!(make_cookie(), make_cookie());
    }
}
