//! TCP request/response (`uperf -c HOST --rr`): send `size` bytes to an echo
//! service, wait for all of them to come back, repeat for `time`; each
//! transaction's latency goes to a histogram (netperf TCP_RR, sockperf
//! ping-pong). Every echo is checked byte for byte against its request.

use std::net::SocketAddr;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{Value, json};
use ustack::node::{App, Control};
use ustack::socket::tcp::{State, TcpHandle};
use ustack::{Instant, Stack};
use ustack_kit::bulk::fill_pattern;

/// What `uperf -c --rr` was asked to do.
#[derive(Debug, Clone)]
pub struct RrConfig {
    /// The echo service (`ustack run` serves it on port 7).
    pub server: SocketAddr,
    /// Request (and response) size in bytes.
    pub size: usize,
    /// How long to keep doing transactions.
    pub time: Duration,
    pub connect_timeout: Duration,
}

/// One request/response test, driven from the poll loop.
pub struct RrClient {
    cfg: RrConfig,
    conn: Option<TcpHandle>,
    began: Instant,
    started: Option<Instant>,
    end_at: Option<Instant>,
    finished: Option<Instant>,
    /// The request in flight, its send time, bytes sent and echoed so far.
    req: Vec<u8>,
    req_at: Instant,
    sent: usize,
    got: usize,
    buf: Vec<u8>,
    hist: Histogram<u64>,
    /// Completed transactions.
    pub transactions: u64,
    /// Echoed bytes that differed from the request (must stay 0).
    pub mismatched: u64,
    /// Why the test failed.
    pub error: Option<String>,
    done: bool,
}

impl core::fmt::Debug for RrClient {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RrClient")
            .field("cfg", &self.cfg)
            .field("transactions", &self.transactions)
            .field("error", &self.error)
            .field("done", &self.done)
            .finish()
    }
}

impl RrClient {
    pub fn new(cfg: RrConfig) -> Self {
        let size = cfg.size.max(1);
        RrClient {
            cfg,
            conn: None,
            began: Instant::ZERO,
            started: None,
            end_at: None,
            finished: None,
            req: vec![0; size],
            req_at: Instant::ZERO,
            sent: 0,
            got: 0,
            buf: vec![0; size],
            hist: Histogram::new_with_bounds(1, 60_000_000_000, 3)
                .expect("1 ns to 60 s at 3 digits is a valid histogram"),
            transactions: 0,
            mismatched: 0,
            error: None,
            done: false,
        }
    }

    /// The test ran to its end without an error.
    pub fn succeeded(&self) -> bool {
        self.done && self.error.is_none()
    }

    pub fn done(&self) -> bool {
        self.done
    }

    fn fail(&mut self, stack: &mut Stack, why: String) -> Control {
        self.error = Some(why);
        self.done = true;
        if let Some(h) = self.conn {
            let _ = stack.tcp().abort(h);
        }
        Control::Exit
    }

    fn next_request(&mut self, now: Instant) {
        fill_pattern(self.transactions * self.req.len() as u64, &mut self.req);
        self.req_at = now;
        self.sent = 0;
        self.got = 0;
    }

    /// Seconds the transactions ran.
    pub fn secs(&self) -> f64 {
        match (self.started, self.finished) {
            (Some(s), Some(f)) => f.saturating_duration_since(s).as_secs_f64(),
            _ => 0.0,
        }
    }

    /// Latency quantile in microseconds.
    pub fn quantile_us(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q) as f64 / 1e3
    }

    pub fn max_us(&self) -> f64 {
        self.hist.max() as f64 / 1e3
    }

    pub fn transactions_per_sec(&self) -> f64 {
        let s = self.secs();
        if s > 0.0 {
            self.transactions as f64 / s
        } else {
            0.0
        }
    }

    /// The summary line (text mode).
    pub fn summary(&self) -> String {
        format!(
            "rr {} bytes to {}: {} transactions in {:.2} s, {:.0} trans/s, latency p50 {:.1} us, p99 {:.1} us, max {:.1} us",
            self.req.len(),
            self.cfg.server,
            self.transactions,
            self.secs(),
            self.transactions_per_sec(),
            self.quantile_us(0.5),
            self.quantile_us(0.99),
            self.max_us()
        )
    }

    /// The result as JSON (`-J`).
    pub fn json(&self) -> Value {
        let mut v = json!({
            "measure": "rr",
            "stack": "ustack",
            "server": self.cfg.server.to_string(),
            "size": self.req.len(),
            "transactions": self.transactions,
            "secs": self.secs(),
            "tps": self.transactions_per_sec(),
            "p50_us": self.quantile_us(0.5),
            "p99_us": self.quantile_us(0.99),
            "max_us": self.max_us(),
            "mismatched_bytes": self.mismatched,
        });
        if let Some(e) = &self.error {
            v["error"] = json!(e);
        }
        v
    }
}

impl App for RrClient {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        if self.done {
            return Control::Exit;
        }
        let h = match self.conn {
            Some(h) => h,
            None => match stack.tcp().connect(now, self.cfg.server) {
                Ok(h) => {
                    self.began = now;
                    *self.conn.insert(h)
                }
                Err(e) => return self.fail(stack, format!("unable to connect: {e}")),
            },
        };
        let status = match stack.tcp_ref().status(h) {
            Ok(s) => s,
            Err(e) => return self.fail(stack, format!("connection lost: {e}")),
        };
        if let Some(e) = status.error {
            let why = if self.started.is_none() {
                format!("unable to connect to server: {e}")
            } else {
                format!("connection lost: {e}")
            };
            return self.fail(stack, why);
        }
        if self.started.is_none() {
            match status.state {
                State::Established => {
                    self.started = Some(now);
                    self.end_at = Some(now + self.cfg.time);
                    self.next_request(now);
                }
                State::SynSent | State::SynReceived => {
                    if now.saturating_duration_since(self.began) > self.cfg.connect_timeout {
                        return self.fail(
                            stack,
                            "unable to connect to server: connection timed out".into(),
                        );
                    }
                    return Control::Continue;
                }
                s => return self.fail(stack, format!("unable to connect to server: {s:?}")),
            }
        }
        // Read whatever part of the echo is there.
        while self.got < self.req.len() {
            match stack.tcp().recv(h, &mut self.buf[self.got..]) {
                Ok(0) => break,
                Ok(n) => {
                    let want = &self.req[self.got..self.got + n];
                    self.mismatched += self.buf[self.got..self.got + n]
                        .iter()
                        .zip(want)
                        .filter(|(a, b)| a != b)
                        .count() as u64;
                    self.got += n;
                }
                Err(e) => return self.fail(stack, format!("connection lost: {e}")),
            }
        }
        if self.got == self.req.len() {
            let ns = now.saturating_duration_since(self.req_at).as_nanos();
            self.hist
                .saturating_record(u64::try_from(ns).unwrap_or(u64::MAX).max(1));
            self.transactions += 1;
            if self.end_at.is_some_and(|e| now >= e) {
                self.finished = Some(now);
                self.done = true;
                let _ = stack.tcp().close(now, h);
                return Control::Exit;
            }
            self.next_request(now);
        } else if status.eof {
            return self.fail(stack, "the server closed the connection".into());
        }
        if self.sent < self.req.len() {
            match stack.tcp().send(h, &self.req[self.sent..]) {
                Ok(n) => self.sent += n,
                Err(e) => return self.fail(stack, format!("connection lost: {e}")),
            }
        }
        Control::Continue
    }

    fn poll_at(&self) -> Option<Instant> {
        if self.done {
            return None;
        }
        match self.end_at {
            Some(e) => Some(e),
            None => Some(self.began + self.cfg.connect_timeout),
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn empty_client_reports_zero() {
        let c = RrClient::new(RrConfig {
            server: std::net::SocketAddrV4::new([10, 0, 0, 1].into(), 7).into(),
            size: 64,
            time: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
        });
        assert_eq!(c.transactions, 0);
        assert_eq!(c.transactions_per_sec(), 0.0);
        assert!(!c.succeeded());
        assert_eq!(c.json()["size"], 64);
    }
}
