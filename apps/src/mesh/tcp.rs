//! The mesh's `tcp` probe: a connection per target to its echo service.
//! The connect (SYN to established) is one probe, timed into
//! `ustack_mesh_tcp_connect_seconds`; then small timestamped messages
//! echoed on the open connection are the RTT probes. A refused, reset or
//! timed-out connection (or an echo whose wait ran out) counts its probes
//! lost, sets the last error and reconnects with back-off.

use std::net::SocketAddr;
use std::time::Duration;

use ustack::node::RxWait;
use ustack::socket::tcp::{State, TcpHandle};
use ustack::{Instant, Stack};

use super::probe::{InFlight, MSG_LEN, Prober, SendCtx, Series, read_msg, write_msg};
use super::{MeshConfig, Probe, TargetStats};

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// A TCP series' connection.
#[derive(Debug, Default)]
pub(crate) struct TcpConn {
    h: Option<TcpHandle>,
    established: bool,
    /// When the SYN was asked for, and when the connect probe is lost.
    connect_at: Instant,
    connect_deadline: Instant,
    /// The port connected to.
    connect_port: u16,
    /// No connect before this (back-off after a failure).
    retry_at: Instant,
    backoff: Duration,
    /// A partly received echo.
    rbuf: [u8; MSG_LEN],
    rlen: usize,
    /// Probe bytes not yet taken by the connection.
    out: Vec<u8>,
}

impl TcpConn {
    /// Connecting: the SYN is out, no answer yet.
    fn connecting(&self) -> bool {
        self.h.is_some() && !self.established
    }
}

/// TCP connect and echo probes.
#[derive(Debug, Default)]
pub(crate) struct Tcp {
    inflight: InFlight,
}

impl Tcp {
    /// End series `i`'s connection: its connect probe (if not yet
    /// established) and its echoes in flight are lost; reconnect later.
    fn fail(&mut self, i: usize, now: Instant, stack: &mut Stack, s: &mut Series<'_>, why: String) {
        let s = &mut s.stats[i];
        if let Some(h) = s.tcp.h.take() {
            let _ = stack.tcp().abort(h);
        }
        if !s.tcp.established {
            s.lose(None);
        }
        let lost = self.inflight.drop_series(s.id);
        s.lost += lost;
        s.up = Some(false);
        tracing::debug!("mesh tcp {}:{}: {why}", s.target.addr, s.target.tcp_port);
        s.last_error = Some(why);
        let t = &mut s.tcp;
        t.established = false;
        t.backoff = (t.backoff * 2).clamp(BACKOFF_MIN, BACKOFF_MAX);
        t.retry_at = now + t.backoff;
        t.rlen = 0;
        t.out.clear();
    }

    /// Connect progress, echoes received, queued bytes written, for series
    /// `i`.
    fn service(&mut self, i: usize, now: Instant, stack: &mut Stack, series: &mut Series<'_>) {
        let s = &mut series.stats[i];
        let Some(h) = s.tcp.h else { return };
        let status = match stack.tcp_ref().status(h) {
            Ok(st) => st,
            Err(e) => {
                return self.fail(i, now, stack, series, format!("connection lost: {e}"));
            }
        };
        if let Some(e) = status.error {
            return self.fail(i, now, stack, series, e.to_string());
        }
        if !s.tcp.established {
            match status.state {
                State::Established => {
                    s.tcp.established = true;
                    s.tcp.backoff = Duration::ZERO;
                    let t = now.saturating_duration_since(s.tcp.connect_at);
                    s.connect.observe(t.as_secs_f64());
                    s.received += 1;
                    s.up = Some(true);
                }
                State::SynSent | State::SynReceived if now < s.tcp.connect_deadline => return,
                State::SynSent | State::SynReceived => {
                    return self.fail(i, now, stack, series, "connect timed out".into());
                }
                st => {
                    let why = format!("connect failed ({st:?})");
                    return self.fail(i, now, stack, series, why);
                }
            }
        }
        // Write what is queued, then read whole echoes.
        while !s.tcp.out.is_empty() {
            match stack.tcp().send(h, &s.tcp.out) {
                Ok(0) => break,
                Ok(n) => {
                    s.tcp.out.drain(..n);
                }
                Err(e) => {
                    self.fail(i, now, stack, series, format!("send failed: {e}"));
                    break;
                }
            }
        }
        let s = &mut series.stats[i];
        if s.tcp.h.is_none() {
            return;
        }
        loop {
            let t = &mut s.tcp;
            match stack.tcp().recv(h, &mut t.rbuf[t.rlen..]) {
                Ok(0) => break,
                Ok(n) => {
                    t.rlen += n;
                    if t.rlen < MSG_LEN {
                        continue;
                    }
                    t.rlen = 0;
                    let Some((key, ts)) = read_msg(&t.rbuf) else {
                        continue;
                    };
                    let id = s.id;
                    if self.inflight.take(key, |x| x == id).is_some() {
                        let rtt = now.saturating_duration_since(Instant::from_nanos(ts));
                        s.answered(rtt);
                    }
                }
                Err(e) => {
                    self.fail(i, now, stack, series, format!("receive failed: {e}"));
                    return;
                }
            }
        }
        if s.tcp.h.is_some() && status.eof {
            self.fail(
                i,
                now,
                stack,
                series,
                "connection closed by the target".into(),
            );
        }
    }
}

impl Prober for Tcp {
    fn kind(&self) -> Probe {
        Probe::Tcp
    }

    fn open(&mut self, _cfg: &MeshConfig, _stack: &mut Stack) -> Result<(), String> {
        Ok(())
    }

    fn close(&mut self, now: Instant, stack: &mut Stack, series: &mut Series<'_>) {
        for s in series.stats.iter_mut() {
            if let Some(h) = s.tcp.h.take() {
                let _ = stack.tcp().close(now, h);
            }
        }
    }

    fn receive(&mut self, now: Instant, stack: &mut Stack, series: &mut Series<'_>) {
        for i in 0..series.stats.len() {
            self.service(i, now, stack, series);
        }
    }

    fn send(
        &mut self,
        i: usize,
        now: Instant,
        stack: &mut Stack,
        series: &mut Series<'_>,
        ctx: &mut SendCtx<'_>,
    ) {
        let s = &mut series.stats[i];
        let t = &mut s.tcp;
        match t.h {
            None if now >= t.retry_at => {
                let dst = SocketAddr::new(s.target.addr, s.target.tcp_port);
                s.sent += 1;
                match stack.tcp().connect(now, dst) {
                    Ok(h) => {
                        let _ = stack.tcp().set_nodelay(h, true);
                        t.h = Some(h);
                        t.established = false;
                        t.connect_at = now;
                        t.connect_deadline = ctx.deadline;
                        t.connect_port = dst.port();
                    }
                    Err(e) => {
                        t.established = true; // the probe is counted lost once, below
                        self.fail(i, now, stack, series, format!("cannot connect: {e}"));
                        series.stats[i].lose(None);
                    }
                }
            }
            Some(h) if t.established => {
                let key = *ctx.next_key;
                *ctx.next_key += 1;
                let mut m = [0u8; MSG_LEN];
                write_msg(&mut m, key, now);
                t.out.extend_from_slice(&m);
                s.sent += 1;
                self.inflight.insert(key, s.id, ctx.deadline);
                if let Ok(n) = stack.tcp().send(h, &t.out) {
                    t.out.drain(..n);
                }
            }
            // Connecting, or backing off: this slot sends nothing.
            _ => {}
        }
    }

    /// An echo whose wait ran out ends its connection too.
    fn expire(&mut self, now: Instant, stack: &mut Stack, series: &mut Series<'_>) {
        let mut stalled = Vec::new();
        self.inflight.expire(now, |id| {
            series.lose(id, "timeout");
            stalled.push(id);
        });
        for id in stalled {
            if let Some(&i) = series.index.get(&id) {
                self.fail(i, now, stack, series, "echo timed out".into());
            }
        }
    }

    /// Gone series' connections end; a target whose port changed
    /// reconnects.
    fn list_changed(&mut self, stack: &mut Stack, gone: &[TargetStats], series: &mut Series<'_>) {
        for s in gone {
            if let Some(h) = s.tcp.h {
                let _ = stack.tcp().abort(h);
            }
        }
        for s in series.stats.iter_mut() {
            if let Some(h) = s.tcp.h
                && s.tcp.connect_port != s.target.tcp_port
            {
                let _ = stack.tcp().abort(h);
                s.tcp = TcpConn::default();
            }
        }
    }

    fn in_flight(&mut self) -> &mut InFlight {
        &mut self.inflight
    }

    fn settled(&self, stats: &[TargetStats]) -> bool {
        self.inflight.map.is_empty() && !stats.iter().any(|s| s.tcp.connecting())
    }

    fn next_deadline(&self, stats: &[TargetStats]) -> Option<Instant> {
        let connect = stats
            .iter()
            .filter(|s| s.tcp.connecting())
            .map(|s| s.tcp.connect_deadline)
            .min();
        connect
            .into_iter()
            .chain(self.inflight.next_deadline())
            .min()
    }

    /// Connects and echoes are timed when read: while one is awaited,
    /// frames are read as they come.
    fn rx_wait(&self, stats: &[TargetStats]) -> RxWait {
        if !self.settled(stats) {
            RxWait::Prompt
        } else {
            RxWait::Nothing
        }
    }
}
