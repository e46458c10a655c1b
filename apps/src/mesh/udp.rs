//! The mesh's `udp` probe: one UDP socket sending timestamped datagrams
//! to each target's UDP echo service.

use std::net::SocketAddr;

use ustack::node::RxWait;
use ustack::socket::udp::UdpHandle;
use ustack::{Instant, Stack};

use super::probe::{InFlight, MSG_LEN, Prober, SendCtx, Series, read_msg, write_msg};
use super::{MeshConfig, Probe, TargetStats};

/// UDP echo probes.
#[derive(Debug)]
pub(crate) struct Udp {
    sock: Option<UdpHandle>,
    inflight: InFlight,
    buf: Vec<u8>,
}

impl Default for Udp {
    fn default() -> Self {
        Udp {
            sock: None,
            inflight: InFlight::default(),
            buf: vec![0; 64 << 10],
        }
    }
}

impl Prober for Udp {
    fn kind(&self) -> Probe {
        Probe::Udp
    }

    fn open(&mut self, _cfg: &MeshConfig, stack: &mut Stack) -> Result<(), String> {
        if self.sock.is_none() {
            self.sock = Some(
                stack
                    .udp()
                    .bind(0)
                    .map_err(|e| format!("cannot open a UDP socket: {e}"))?,
            );
        }
        Ok(())
    }

    fn close(&mut self, _now: Instant, stack: &mut Stack, _series: &mut Series<'_>) {
        if let Some(s) = self.sock.take() {
            let _ = stack.udp().close(s);
        }
    }

    fn receive(&mut self, now: Instant, stack: &mut Stack, series: &mut Series<'_>) {
        let Some(sock) = self.sock else { return };
        let buf = &mut self.buf;
        while let Ok(Some((n, from))) = stack.udp().recv_from(sock, buf) {
            let Some((key, ts)) = read_msg(&buf[..n.min(buf.len())]) else {
                continue;
            };
            let ip = from.ip();
            let ok = |id| {
                series.is(id, |s| {
                    s.target.addr == ip && s.target.udp_port == from.port()
                })
            };
            let id = self.inflight.take(key, ok);
            series.settle(id, Probe::Udp, ip, || {
                now.saturating_duration_since(Instant::from_nanos(ts))
            });
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
        let Some(sock) = self.sock else { return };
        let s = &mut series.stats[i];
        let key = *ctx.next_key;
        let n = ctx.cfg.size.max(MSG_LEN);
        write_msg(&mut self.buf[..n], key, now);
        let dst = SocketAddr::new(s.target.addr, s.target.udp_port);
        match stack.udp().send_to(sock, dst, &self.buf[..n]) {
            Ok(()) => {
                *ctx.next_key += 1;
                s.sent += 1;
                self.inflight.insert(key, s.id, ctx.deadline);
            }
            Err(e) => tracing::debug!("mesh udp to {dst}: {e}"),
        }
    }

    fn in_flight(&mut self) -> &mut InFlight {
        &mut self.inflight
    }

    fn settled(&self, _stats: &[TargetStats]) -> bool {
        self.inflight.map.is_empty()
    }

    fn next_deadline(&self, _stats: &[TargetStats]) -> Option<Instant> {
        self.inflight.next_deadline()
    }

    /// Timed when read: while one is awaited, frames are read as they come.
    fn rx_wait(&self, _stats: &[TargetStats]) -> RxWait {
        if self.inflight.map.is_empty() {
            RxWait::Nothing
        } else {
            RxWait::Prompt
        }
    }
}
