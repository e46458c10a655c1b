//! The iperf3-compatible server run by `uperf -s` and by `ustack run` on 5201.

use std::fmt::Write as _;

use ustack::node::{App, Control};
use ustack::socket::tcp::{ListenHandle, TcpHandle};
use ustack::{Instant, Stack};
use ustack_kit::bulk::fill_pattern;

use crate::iperf::*;

struct Pending {
    h: TcpHandle,
    cookie: Vec<u8>,
}

struct Stream {
    h: TcpHandle,
    id: u32,
    bytes: u64,
    interval_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Params,
    Streams,
    Running,
    ClientResults,
    Done,
}

struct Test {
    ctrl: TcpHandle,
    cookie: Vec<u8>,
    phase: Phase,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    params: Option<Params>,
    streams: Vec<Stream>,
    started: Instant,
    interval_start: Instant,
    client_bytes: u64,
    /// The `-O` seconds are over (counters started again).
    omit_done: bool,
    /// The summary was printed (when the results went to the client).
    summarized: bool,
}

/// One finished test, for the caller and the tests.
#[derive(Debug, Clone, PartialEq)]
pub struct TestSummary {
    pub reverse: bool,
    pub streams: usize,
    /// Bytes we received (forward) or sent (reverse).
    pub bytes: u64,
    /// Bytes the client reported.
    pub client_bytes: u64,
    pub seconds: f64,
}

/// The server: one test at a time, as iperf3's.
pub struct IperfServer {
    port: u16,
    listener: Option<ListenHandle>,
    pending: Vec<Pending>,
    test: Option<Test>,
    buf: Vec<u8>,
    one_off: bool,
    /// Lines to print (interval reports, summaries, errors).
    pub output: Vec<String>,
    pub finished: Vec<TestSummary>,
    pub error: Option<String>,
    /// Print each test as iperf3 -s -J does (one JSON object per test)
    /// instead of text lines.
    pub json: bool,
    json_intervals: Vec<serde_json::Value>,
}

impl core::fmt::Debug for IperfServer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("IperfServer")
            .field("port", &self.port)
            .finish()
    }
}

fn send_all(stack: &mut Stack, h: TcpHandle, out: &mut Vec<u8>) {
    if out.is_empty() {
        return;
    }
    if let Ok(n) = stack.tcp().send(h, out) {
        out.drain(..n);
    }
}

impl IperfServer {
    pub fn new(port: u16, one_off: bool) -> Self {
        IperfServer {
            port,
            listener: None,
            pending: Vec::new(),
            test: None,
            buf: vec![0; 128 << 10],
            one_off,
            output: Vec::new(),
            finished: Vec::new(),
            error: None,
            json: false,
            json_intervals: Vec::new(),
        }
    }

    fn say(&mut self, line: String) {
        if self.json {
            return;
        }
        self.output.push(line);
    }

    fn new_conn(&mut self, stack: &mut Stack, h: TcpHandle, cookie: Vec<u8>, now: Instant) {
        match self.test.as_mut() {
            Some(t) if t.phase == Phase::Streams && cookie == t.cookie => {
                let id = stream_id(t.streams.len());
                t.streams.push(Stream {
                    h,
                    id,
                    bytes: 0,
                    interval_bytes: 0,
                });
                let want = t.params.as_ref().map_or(1, |p| p.parallel);
                if t.streams.len() == want {
                    t.out.extend([TEST_START, TEST_RUNNING]);
                    t.phase = Phase::Running;
                    t.started = now;
                    t.interval_start = now;
                }
            }
            Some(t) if t.phase != Phase::Done => {
                // Busy, or a data stream with the wrong cookie.
                let _ = stack.tcp().send(h, &[ACCESS_DENIED]);
                let _ = stack.tcp().close(now, h);
            }
            _ => {
                self.say(format!(
                    "Accepted connection from {}",
                    stack
                        .tcp_ref()
                        .info(h)
                        .map_or("?".into(), |i| i.remote.to_string())
                ));
                self.test = Some(Test {
                    ctrl: h,
                    cookie,
                    phase: Phase::Params,
                    inbuf: Vec::new(),
                    out: vec![PARAM_EXCHANGE],
                    params: None,
                    streams: Vec::new(),
                    started: now,
                    interval_start: now,
                    client_bytes: 0,
                    omit_done: false,
                    summarized: false,
                });
            }
        }
    }

    fn report_interval(&mut self, now: Instant, end: bool) {
        let Some(t) = self.test.as_mut() else { return };
        let from = t
            .interval_start
            .saturating_duration_since(t.started)
            .as_secs_f64();
        let to = now.saturating_duration_since(t.started).as_secs_f64();
        if to - from < 0.000_1 {
            return;
        }
        let mut lines = Vec::new();
        let mut sum = 0;
        let mut interval_bytes = Vec::new();
        for s in &mut t.streams {
            interval_bytes.push((s.id, s.interval_bytes));
            let rate = s.interval_bytes as f64 * 8.0 / (to - from);
            lines.push(format!(
                "[{:3}] {:6.2}-{:<6.2} sec  {}  {}",
                s.id + 4,
                from,
                to,
                fmt_bytes(s.interval_bytes),
                fmt_rate(rate)
            ));
            sum += s.interval_bytes;
            s.interval_bytes = 0;
        }
        if t.streams.len() > 1 {
            lines.push(format!(
                "[SUM] {:6.2}-{:<6.2} sec  {}  {}",
                from,
                to,
                fmt_bytes(sum),
                fmt_rate(sum as f64 * 8.0 / (to - from))
            ));
        }
        let sender = t.params.as_ref().is_some_and(|p| p.reverse);
        let streams: Vec<serde_json::Value> = interval_bytes
            .iter()
            .map(|&(id, b)| {
                serde_json::json!({"socket": id + 4, "start": from, "end": to, "seconds": to - from,
                    "bytes": b, "bits_per_second": b as f64 * 8.0 / (to - from),
                    "omitted": false, "sender": sender})
            })
            .collect();
        self.json_intervals.push(serde_json::json!({
            "streams": streams,
            "sum": {"start": from, "end": to, "seconds": to - from, "bytes": sum,
                    "bits_per_second": sum as f64 * 8.0 / (to - from), "omitted": false,
                    "sender": sender},
        }));
        t.interval_start = now;
        let _ = end;
        if !self.json {
            self.output.extend(lines);
        }
    }

    fn results_json(t: &Test, reverse: bool, stack: &Stack) -> serde_json::Value {
        let streams: Vec<serde_json::Value> = t
            .streams
            .iter()
            .map(|s| {
                let retrans = if reverse {
                    stack.tcp_ref().info(s.h).map_or(0, |i| i.stats.retransmits as i64)
                } else {
                    -1
                };
                serde_json::json!({"id": s.id, "bytes": s.bytes, "retransmits": retrans, "jitter": 0, "errors": 0, "packets": 0})
            })
            .collect();
        serde_json::json!({
            "cpu_util_total": 0.0, "cpu_util_user": 0.0, "cpu_util_system": 0.0,
            "sender_has_retransmits": if reverse { 1 } else { -1 },
            "streams": streams,
        })
    }

    /// Ends the test: its summary (unless printed already) and the sockets.
    fn finish(&mut self, stack: &mut Stack, now: Instant) {
        self.summarize(now);
        let Some(t) = self.test.take() else { return };
        for s in &t.streams {
            let _ = stack.tcp().close(now, s.h);
        }
        let _ = stack.tcp().close(now, t.ctrl);
    }

    /// Prints the test's summary and records it, once: as soon as the
    /// results went to the client (as iperf3's server does), so a server
    /// stopped right after the client exits has printed it.
    fn summarize(&mut self, now: Instant) {
        let Some(mut t) = self.test.take() else {
            return;
        };
        if t.summarized {
            self.test = Some(t);
            return;
        }
        t.summarized = true;
        let reverse = t.params.as_ref().is_some_and(|p| p.reverse);
        let secs = now.saturating_duration_since(t.started).as_secs_f64();
        let bytes: u64 = t.streams.iter().map(|s| s.bytes).sum();
        let mut text = String::from(
            "- - - - - - - - - - - - - - - - - - - - - - - - -\n[ ID] Interval           Transfer     Bitrate\n",
        );
        let (ours, theirs) = if reverse {
            ("sender", "receiver")
        } else {
            ("receiver", "sender")
        };
        let rate = |b: u64| {
            fmt_rate(if secs > 0.0 {
                b as f64 * 8.0 / secs
            } else {
                0.0
            })
        };
        let _ = writeln!(
            text,
            "[SUM]   0.00-{secs:<6.2} sec  {}  {}                  {theirs}",
            fmt_bytes(t.client_bytes),
            rate(t.client_bytes)
        );
        let _ = write!(
            text,
            "[SUM]   0.00-{secs:<6.2} sec  {}  {}                  {ours}",
            fmt_bytes(bytes),
            rate(bytes)
        );
        self.say(text);
        if self.json {
            let v = self.test_json(&t, reverse, secs, bytes);
            self.output
                .push(serde_json::to_string_pretty(&v).unwrap_or_else(|_| v.to_string()));
        }
        self.finished.push(TestSummary {
            reverse,
            streams: t.streams.len(),
            bytes,
            client_bytes: t.client_bytes,
            seconds: secs,
        });
        self.test = Some(t);
    }

    /// One test as iperf3 -s -J prints it: what this side measured, and
    /// the client's own count (from its results) on the other side.
    fn test_json(&mut self, t: &Test, reverse: bool, secs: f64, bytes: u64) -> serde_json::Value {
        let rate = |b: u64| {
            if secs > 0.0 {
                b as f64 * 8.0 / secs
            } else {
                0.0
            }
        };
        let (sent, received) = if reverse {
            (bytes, t.client_bytes)
        } else {
            (t.client_bytes, bytes)
        };
        let streams: Vec<serde_json::Value> = t
            .streams
            .iter()
            .map(|s| {
                let mine = serde_json::json!({"socket": s.id + 4, "start": 0, "end": secs,
                    "seconds": secs, "bytes": s.bytes, "bits_per_second": rate(s.bytes),
                    "sender": reverse});
                if reverse {
                    serde_json::json!({"sender": mine})
                } else {
                    serde_json::json!({"receiver": mine})
                }
            })
            .collect();
        let sum = |b: u64| {
            serde_json::json!({"start": 0, "end": secs, "seconds": secs, "bytes": b,
                "bits_per_second": rate(b), "sender": reverse})
        };
        serde_json::json!({
            "start": {
                "version": concat!("uperf ", env!("CARGO_PKG_VERSION"), " (iperf 3.12 protocol)"),
                "cookie": String::from_utf8_lossy(&t.cookie[..t.cookie.len().saturating_sub(1)]),
                "test_start": {"protocol": "TCP", "num_streams": t.streams.len(),
                    "reverse": u8::from(reverse)},
            },
            "intervals": std::mem::take(&mut self.json_intervals),
            "end": {
                "streams": streams,
                "sum_sent": sum(sent),
                "sum_received": sum(received),
            },
        })
    }

    /// Whether a one-off server has served its test.
    pub fn done(&self) -> bool {
        self.one_off && !self.finished.is_empty()
    }
}

impl App for IperfServer {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let l = match self.listener {
            Some(l) => l,
            None => match stack.tcp().listen(self.port, 64) {
                Ok(l) => {
                    self.say(format!("-----------------------------------------------------------\nServer listening on {}\n-----------------------------------------------------------", self.port));
                    *self.listener.insert(l)
                }
                Err(e) => {
                    self.error = Some(format!("cannot listen on port {}: {e}", self.port));
                    return Control::Exit;
                }
            },
        };
        while let Ok(Some(h)) = stack.tcp().accept(l) {
            self.pending.push(Pending {
                h,
                cookie: Vec::new(),
            });
        }
        // Read cookies of new connections.
        let mut ready = Vec::new();
        self.pending.retain_mut(|p| {
            let mut b = [0u8; COOKIE_LEN];
            let want = COOKIE_LEN - p.cookie.len();
            match stack.tcp().recv(p.h, &mut b[..want]) {
                Ok(n) => p.cookie.extend_from_slice(&b[..n]),
                Err(_) => return false,
            }
            if p.cookie.len() == COOKIE_LEN {
                ready.push((p.h, std::mem::take(&mut p.cookie)));
                return false;
            }
            !stack
                .tcp_ref()
                .status(p.h)
                .is_ok_and(|s| s.eof || s.error.is_some())
        });
        for (h, cookie) in ready {
            self.new_conn(stack, h, cookie, now);
        }
        let Some(t) = self.test.as_mut() else {
            return Control::Continue;
        };
        // Control channel in.
        let mut b = [0u8; 4096];
        let mut ctrl_gone = false;
        loop {
            match stack.tcp().recv(t.ctrl, &mut b) {
                Ok(0) => break,
                Ok(n) => t.inbuf.extend_from_slice(&b[..n]),
                Err(_) => {
                    ctrl_gone = true;
                    break;
                }
            }
        }
        if stack.tcp_ref().status(t.ctrl).is_ok_and(|s| s.eof) {
            ctrl_gone = true;
        }
        let mut error = None;
        let mut end_test = false;
        match t.phase {
            Phase::Params => match take_json(&mut t.inbuf) {
                Ok(Some(json)) => match (refusal(&json), parse_params(&json)) {
                    // iperf3's own error state, so a stock client prints
                    // why instead of "control socket has closed unexpectedly".
                    (Some(r), _) => {
                        t.out.extend(r.wire());
                        error = Some(r.reason);
                    }
                    (None, Ok(p)) => {
                        t.params = Some(p);
                        t.out.push(CREATE_STREAMS);
                        t.phase = Phase::Streams;
                    }
                    (None, Err(e)) => error = Some(e),
                },
                Ok(None) => {}
                Err(e) => error = Some(e),
            },
            Phase::Running => {
                if let Some(&state) = t.inbuf.first() {
                    t.inbuf.remove(0);
                    match state {
                        TEST_END => {
                            // A reverse test's client reads its streams to
                            // the end: close our sending side.
                            if t.params.as_ref().is_some_and(|p| p.reverse) {
                                for s in &t.streams {
                                    let _ = stack.tcp().shutdown(s.h);
                                }
                            }
                            t.out.push(EXCHANGE_RESULTS);
                            t.phase = Phase::ClientResults;
                            end_test = true;
                        }
                        CLIENT_TERMINATE => error = Some("the client terminated the test".into()),
                        other => error = Some(format!("unexpected state {other} from the client")),
                    }
                }
            }
            Phase::ClientResults => match take_json(&mut t.inbuf) {
                Ok(Some(json)) => {
                    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&json) {
                        t.client_bytes = v["streams"]
                            .as_array()
                            .map_or(0, |a| a.iter().filter_map(|s| s["bytes"].as_u64()).sum());
                    }
                    let reverse = t.params.as_ref().is_some_and(|p| p.reverse);
                    let results = Self::results_json(t, reverse, stack);
                    t.out.extend(frame_json(&results));
                    t.out.push(DISPLAY_RESULTS);
                    t.phase = Phase::Done;
                }
                Ok(None) => {}
                Err(e) => error = Some(e),
            },
            Phase::Streams | Phase::Done => {}
        }
        // iperf3's -O: what moved in the first seconds is not counted; both
        // ends start their totals (and the test's seconds) again then.
        let omit = t.params.as_ref().map_or(0.0, |p| p.omit);
        if t.phase == Phase::Running
            && !t.omit_done
            && now.saturating_duration_since(t.started).as_secs_f64() >= omit
        {
            t.omit_done = true;
            if omit > 0.0 {
                for s in &mut t.streams {
                    s.bytes = 0;
                    s.interval_bytes = 0;
                }
                t.started = now;
                t.interval_start = now;
            }
        }
        // Data streams.
        let reverse = t.params.as_ref().is_some_and(|p| p.reverse);
        let len = t.params.as_ref().map_or(128 << 10, |p| p.len);
        if t.phase == Phase::Running {
            for s in &mut t.streams {
                if reverse {
                    loop {
                        let room = stack
                            .tcp_ref()
                            .status(s.h)
                            .map_or(0, |st| st.writable)
                            .min(len)
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
        }
        // A forward test counts what arrives until the results go out, so
        // the summary and the results JSON tell the same number.
        if !reverse && t.phase != Phase::Done {
            for s in &mut t.streams {
                while let Ok(n) = stack.tcp().recv(s.h, &mut self.buf) {
                    if n == 0 {
                        break;
                    }
                    s.bytes += n as u64;
                    s.interval_bytes += n as u64;
                }
            }
        }
        send_all(stack, t.ctrl, &mut t.out);
        let phase = t.phase;
        let interval_due = phase == Phase::Running
            && now
                .saturating_duration_since(t.interval_start)
                .as_secs_f64()
                >= 1.0;
        if interval_due || end_test {
            self.report_interval(now, end_test);
        }
        if phase == Phase::Done {
            self.summarize(now);
        }
        if let Some(e) = error {
            self.say(format!("iperf3: error - {e}"));
            self.finish(stack, now);
        } else if phase == Phase::Done
            && (ctrl_gone
                || self
                    .test
                    .as_ref()
                    .is_some_and(|t| t.inbuf.first() == Some(&IPERF_DONE)))
        {
            self.finish(stack, now);
        } else if ctrl_gone && phase != Phase::Done {
            self.say("iperf3: the client has unexpectedly closed the connection".into());
            self.finish(stack, now);
        }
        if self.done() {
            Control::Exit
        } else {
            Control::Continue
        }
    }
}
