//! The mesh's `icmp` probe: one ping socket, one run of sequence numbers
//! for all targets (an ICMP error names only the sequence).

use ustack::iface::icmp::{PingEvent, PingHandle};
use ustack::node::RxWait;
use ustack::{Instant, Stack};

use super::probe::{InFlight, Prober, SendCtx, Series, stamped_wait};
use super::{MeshConfig, Probe, TargetStats};

/// ICMP echo probes.
#[derive(Debug)]
pub(crate) struct Icmp {
    sock: Option<PingHandle>,
    inflight: InFlight,
    /// ICMP sequence numbers run across all targets.
    next_seq: u16,
}

impl Default for Icmp {
    fn default() -> Self {
        Icmp {
            sock: None,
            inflight: InFlight::default(),
            next_seq: 1,
        }
    }
}

impl Prober for Icmp {
    fn kind(&self) -> Probe {
        Probe::Icmp
    }

    fn open(&mut self, cfg: &MeshConfig, stack: &mut Stack) -> Result<(), String> {
        if self.sock.is_none() {
            self.sock = Some(
                stack
                    .ping()
                    .open(cfg.ident)
                    .map_err(|e| format!("cannot open a ping socket: {e}"))?,
            );
        }
        Ok(())
    }

    fn close(&mut self, _now: Instant, stack: &mut Stack, _series: &mut Series<'_>) {
        if let Some(s) = self.sock.take() {
            let _ = stack.ping().close(s);
        }
    }

    fn receive(&mut self, _now: Instant, stack: &mut Stack, series: &mut Series<'_>) {
        let Some(sock) = self.sock else { return };
        while let Ok(Some(ev)) = stack.ping().recv(sock) {
            match ev {
                PingEvent::Reply(r) => {
                    let from = r.from;
                    let ok = |id| series.is(id, |s| s.target.addr == from);
                    let id = self.inflight.take(u64::from(r.seq), ok);
                    series.settle(id, Probe::Icmp, from, || r.rtt().unwrap_or_default());
                }
                PingEvent::Unreachable { seq, code, .. } => {
                    if let Some(id) = self.inflight.take(u64::from(seq), |_| true)
                        && let Some(s) = series.by_id(id)
                    {
                        s.unreachable += 1;
                        s.lose(Some(&format!("destination unreachable (code {code})")));
                    }
                }
            }
        }
    }

    fn send(
        &mut self,
        i: usize,
        _now: Instant,
        stack: &mut Stack,
        series: &mut Series<'_>,
        ctx: &mut SendCtx<'_>,
    ) {
        let Some(sock) = self.sock else { return };
        let s = &mut series.stats[i];
        let addr = s.target.addr;
        let seq = self.next_seq;
        match stack.ping().send(sock, addr, seq, ctx.cfg.size) {
            Ok(()) => {
                self.next_seq = seq.wrapping_add(1);
                s.sent += 1;
                let id = s.id;
                if let Some(old) = self.inflight.insert(u64::from(seq), id, ctx.deadline) {
                    // Its sequence number came round again unanswered.
                    series.lose(old, "timeout");
                }
            }
            Err(e) => tracing::debug!("mesh icmp to {addr}: {e}"),
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

    fn rx_wait(&self, _stats: &[TargetStats]) -> RxWait {
        stamped_wait(&self.inflight)
    }
}
