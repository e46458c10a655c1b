//! [`Rc`]: the RC verbs on a stack: memory regions, queue pairs,
//! work requests and completions. `stack.rc()` lends it mutably,
//! `stack.rc_ref()` read-only.

use super::{
    Access, MAX_MSG, MrHandle, MrInfo, QpState, RcDest, RcError, RcQpConfig, RcQpHandle,
    RcQpStatus, RcSendWr, RcTable, Sge, Wc, add_stats, qp_status,
};
use crate::error::Error;
use crate::socket::ud::UdTable;
use crate::wire::roce::{MAX_QPN, PSN_MASK};

/// The RC queue pairs and memory regions of a stack, lent mutably by
/// `stack.rc()`, with its UD QPs (they share the QP number space) and
/// the link's MTU. A failed verb is [`Error::Rc`].
#[derive(Debug)]
pub struct Rc<'a> {
    table: &'a mut RcTable,
    ud: &'a UdTable,
    mtu: usize,
}

/// The same, read-only: what `rc_ref()` lends.
#[derive(Debug)]
pub struct RcRef<'a> {
    table: &'a RcTable,
}

impl<'a> Rc<'a> {
    pub(crate) fn new(table: &'a mut RcTable, ud: &'a UdTable, mtu: usize) -> Self {
        Rc { table, ud, mtu }
    }

    /// A region's bytes, writable (what a peer READs, what a SEND sends).
    pub fn mr_mut(self, mr: MrHandle) -> Result<&'a mut [u8], Error> {
        Ok(self.table.mrs.data_mut(mr).ok_or(RcError::InvalidHandle)?)
    }

    /// Register a memory region of `len` zeroed bytes the engine owns,
    /// allowing `access`. Its address and keys are in [`RcRef::mr_info`].
    pub fn reg_mr(&mut self, len: usize, access: Access) -> Result<MrHandle, Error> {
        if len > MAX_MSG {
            return Err(RcError::TooLarge(len).into());
        }
        Ok(self
            .table
            .mrs
            .register(len, access)
            .ok_or(RcError::NoMemory)?)
    }

    /// Deregister a region. Work still naming it fails with a protection
    /// error; peers' accesses are refused.
    pub fn dereg_mr(&mut self, mr: MrHandle) -> Result<(), Error> {
        if self.table.mrs.deregister(mr) {
            Ok(())
        } else {
            Err(RcError::InvalidHandle.into())
        }
    }

    /// Create an RC QP in INIT: its QPN and first PSN are chosen (see
    /// [`RcRef::qp_status`]) for the app to hand its peer.
    pub fn create_qp(&mut self, cfg: &RcQpConfig) -> Result<RcQpHandle, Error> {
        let (ud, mtu) = (self.ud, self.mtu);
        Ok(self.table.create_qp(cfg, mtu, &|q| ud.has_qpn(q))?)
    }

    /// Connect a QP in INIT to its peer (verbs: to RTR and RTS at once).
    pub fn connect(&mut self, qp: RcQpHandle, dest: RcDest) -> Result<(), Error> {
        let table = &mut *self.table;
        let q = table.qp_mut(qp)?;
        if q.state != QpState::Init {
            return Err(RcError::BadState.into());
        }
        q.connect(RcDest {
            qpn: dest.qpn & MAX_QPN,
            psn: dest.psn & PSN_MASK,
            ..dest
        });
        table.schedule(qp);
        Ok(())
    }

    /// Post a receive: a SEND (or WRITE with immediate) from the peer lands
    /// in `sge`, which must lie in a region with local write access.
    pub fn post_recv(&mut self, qp: RcQpHandle, wr_id: u64, sge: Sge) -> Result<(), Error> {
        let RcTable { qps, mrs, .. } = self.table;
        let (q, _) = qps.get_mut(qp).ok_or(RcError::InvalidHandle)?;
        Ok(q.post_recv(wr_id, sge, mrs)?)
    }

    /// Post a send work request; it leaves on the next poll (once
    /// connected), in order with the others.
    pub fn post_send(&mut self, qp: RcQpHandle, wr: &RcSendWr<'_>) -> Result<(), Error> {
        let table = &mut *self.table;
        let RcTable { qps, mrs, .. } = &mut *table;
        let (q, _) = qps.get_mut(qp).ok_or(RcError::InvalidHandle)?;
        q.post_send(wr, mrs)?;
        table.schedule(qp);
        Ok(())
    }

    /// Move up to `max` completions into `out`; returns how many. New
    /// completions raise a READABLE event for the QP
    /// ([`SocketRef::RcQp`](crate::events::SocketRef::RcQp)); moving to
    /// the error state raises ERROR.
    pub fn poll_cq(
        &mut self,
        qp: RcQpHandle,
        max: usize,
        out: &mut Vec<Wc>,
    ) -> Result<usize, Error> {
        let (q, s) = self.table.qps.get_mut(qp).ok_or(RcError::InvalidHandle)?;
        let n = q.poll_cq(max, out);
        s.cq_told = q.cq_len();
        Ok(n)
    }

    /// Move a QP to the error state: outstanding work completes flushed.
    pub fn set_error(&mut self, qp: RcQpHandle) -> Result<(), Error> {
        let table = &mut *self.table;
        table.qp_mut(qp)?.set_error();
        table.schedule(qp);
        Ok(())
    }

    /// Destroy a QP; outstanding work is discarded.
    pub fn destroy_qp(&mut self, qp: RcQpHandle) -> Result<(), Error> {
        let table = &mut *self.table;
        let (q, _) = table.qps.remove(qp).ok_or(RcError::InvalidHandle)?;
        table.by_qpn.remove(&q.qpn);
        table.ready.retain(|&h| h != qp);
        table.events.retain(|&h| h != qp);
        add_stats(&mut table.gone, &q.stats);
        Ok(())
    }
}

impl<'a> RcRef<'a> {
    pub(crate) fn new(table: &'a RcTable) -> Self {
        RcRef { table }
    }

    /// A region's address range, keys and access.
    pub fn mr_info(&self, mr: MrHandle) -> Result<MrInfo, Error> {
        Ok(self.table.mrs.info(mr).ok_or(RcError::InvalidHandle)?)
    }

    /// A QP's state, PSNs, queues and counters.
    pub fn qp_status(&self, qp: RcQpHandle) -> Result<RcQpStatus, Error> {
        Ok(qp_status(self.table.qp(qp)?))
    }

    /// The status of up to `max` RC QPs (for telemetry).
    pub fn qps(&self, max: usize) -> Vec<RcQpStatus> {
        self.table.status(max)
    }
    /// A region's bytes.
    pub fn mr(&self, mr: MrHandle) -> Result<&'a [u8], Error> {
        Ok(self.table.mrs.data(mr).ok_or(RcError::InvalidHandle)?)
    }
}
