//! The mesh's `ud` probe: one RoCEv2 UD QP sending pings in
//! [`ustack_kit::ud_ping`]'s format to each target's UD responder (`ustack
//! run` has one on QPN 2).

use std::time::Duration;

use ustack::node::RxWait;
use ustack::socket::ud::{
    Completion, GRH_LEN, QpConfig, QpHandle, SendWr, UdAddr, UdTransport, WcOpcode, WcStatus,
};
use ustack::{Instant, Stack};

use super::probe::{InFlight, Prober, SendCtx, Series, be64, stamped_wait};
use super::{CATCH_UP, MeshConfig, Probe, TargetStats};

/// UD pings in the format of [`ustack_kit::ud_ping`] (its module docs):
/// `"UDPG" | kind | 3 zero | seq | a | b | c`, 40 bytes at least; a ping
/// (kind 1) carries its post time in `a`, the pong (kind 2) echoes seq and
/// `a` and carries the responder's processing delay in `c`.
const UD_LEN: usize = ustack_kit::ud_ping::PING_LEN;
const UD_RECV_DEPTH: usize = 256;

pub(crate) fn write_ud_ping(buf: &mut [u8], seq: u64, now: Instant) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = i as u8;
    }
    buf[..4].copy_from_slice(b"UDPG");
    buf[4] = 1;
    buf[5..8].fill(0);
    buf[8..16].copy_from_slice(&seq.to_be_bytes());
    buf[16..24].copy_from_slice(&now.as_nanos().to_be_bytes());
    buf[24..40].fill(0);
}

/// (seq, ping's post time, responder's delay) of a pong.
pub(crate) fn read_ud_pong(p: &[u8]) -> Option<(u64, u64, u64)> {
    (p.len() >= UD_LEN && &p[..4] == b"UDPG" && p[4] == 2)
        .then(|| (be64(p, 8), be64(p, 16), be64(p, 32)))
}

/// UD ping probes.
#[derive(Debug, Default)]
pub(crate) struct Ud {
    qp: Option<QpHandle>,
    inflight: InFlight,
    buf: Vec<u8>,
    cqes: Vec<Completion>,
}

impl Ud {
    fn on_completion(&mut self, now: Instant, c: &Completion, series: &mut Series<'_>) {
        match c.opcode {
            WcOpcode::Send => {
                if c.status != WcStatus::Success
                    && let Some(id) = self.inflight.take(c.wr_id, |_| true)
                    && let Some(s) = series.by_id(id)
                {
                    s.lose(Some(&format!("UD send failed: {:?}", c.status)));
                }
            }
            WcOpcode::Recv => {
                if c.status != WcStatus::Success {
                    return;
                }
                let Some((seq, posted, delay)) = read_ud_pong(c.payload()) else {
                    return;
                };
                let Some(from) = c.src else { return };
                let ok = |id| series.is(id, |s| s.target.addr == from.ip);
                let id = self.inflight.take(seq, ok);
                series.settle(id, Probe::Ud, from.ip, || {
                    let at = if c.ts_source == ustack::socket::ud::TsSource::Poll {
                        c.timestamp
                    } else {
                        now
                    };
                    at.saturating_duration_since(Instant::from_nanos(posted))
                        .saturating_sub(Duration::from_nanos(delay))
                });
            }
        }
    }
}

impl Prober for Ud {
    fn kind(&self) -> Probe {
        Probe::Ud
    }

    fn open(&mut self, cfg: &MeshConfig, stack: &mut Stack) -> Result<(), String> {
        if self.qp.is_some() {
            return Ok(());
        }
        let mut qc = QpConfig::new(cfg.ud_qkey);
        qc.max_recv_wr = UD_RECV_DEPTH;
        qc.max_send_wr = 2 * CATCH_UP as usize;
        qc.traffic_class = cfg.ud_tclass;
        let qp = stack
            .ud()
            .create_qp(&qc)
            .map_err(|e| format!("cannot create a UD QP: {e}"))?;
        let size = GRH_LEN + stack.ud().max_msg_size().max(cfg.size);
        for i in 0..UD_RECV_DEPTH {
            stack
                .ud()
                .post_recv(qp, i as u64, vec![0; size])
                .map_err(|e| format!("cannot post UD receives: {e}"))?;
        }
        self.qp = Some(qp);
        Ok(())
    }

    fn close(&mut self, _now: Instant, stack: &mut Stack, _series: &mut Series<'_>) {
        if let Some(q) = self.qp.take() {
            let _ = stack.ud().destroy_qp(q);
        }
    }

    fn receive(&mut self, now: Instant, stack: &mut Stack, series: &mut Series<'_>) {
        let Some(qp) = self.qp else { return };
        let mut cqes = std::mem::take(&mut self.cqes);
        while stack.ud().poll_cq(qp, now, 64, &mut cqes).unwrap_or(0) > 0 {
            for mut c in cqes.drain(..) {
                self.on_completion(now, &c, series);
                if c.opcode == WcOpcode::Recv
                    && let Some(b) = c.buf.take()
                {
                    let _ = stack.ud().post_recv(qp, c.wr_id, b);
                }
            }
        }
        self.cqes = cqes;
    }

    fn send(
        &mut self,
        i: usize,
        now: Instant,
        stack: &mut Stack,
        series: &mut Series<'_>,
        ctx: &mut SendCtx<'_>,
    ) {
        let Some(qp) = self.qp else { return };
        let s = &mut series.stats[i];
        let addr = s.target.addr;
        let key = *ctx.next_key;
        let n = ctx.cfg.size.max(UD_LEN).min(stack.ud().max_msg_size());
        if self.buf.len() < n {
            self.buf.resize(n, 0);
        }
        write_ud_ping(&mut self.buf[..n], key, now);
        let wr = SendWr {
            wr_id: key,
            dest: UdAddr {
                ip: addr,
                qpn: ctx.cfg.ud_qpn,
            },
            remote_qkey: ctx.cfg.ud_qkey,
            imm: None,
            solicited: false,
            data: &self.buf[..n],
        };
        match stack.ud().post_send(qp, &wr) {
            Ok(()) => {
                *ctx.next_key += 1;
                s.sent += 1;
                self.inflight.insert(key, s.id, ctx.deadline);
            }
            Err(e) => tracing::debug!("mesh ud to {addr}: {e}"),
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
