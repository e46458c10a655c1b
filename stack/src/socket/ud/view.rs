//! [`Ud`]: the RoCEv2 UD queue pairs of a stack, lent by
//! `stack.ud()`: the [`UdTransport`] the stack speaks itself.

use super::{Completion, QpConfig, QpHandle, SendWr, UdTable, UdTransport, max_msg};
use crate::error::Error;
use crate::socket::rc::RcTable;
use crate::time::Instant;

/// The UD queue pairs of a stack, with its RC QPs (they share the QP
/// number space) and the link's MTU.
#[derive(Debug)]
pub struct Ud<'a> {
    table: &'a mut UdTable,
    rc: &'a RcTable,
    mtu: usize,
}

impl<'a> Ud<'a> {
    pub(crate) fn new(table: &'a mut UdTable, rc: &'a RcTable, mtu: usize) -> Self {
        Ud { table, rc, mtu }
    }
}

impl UdTransport for Ud<'_> {
    fn create_qp(&mut self, cfg: &QpConfig) -> Result<QpHandle, Error> {
        let rc = self.rc;
        Ok(self.table.create_qp(cfg, &|q| rc.has_qpn(q))?)
    }

    fn qp_num(&self, qp: QpHandle) -> Result<u32, Error> {
        Ok(self.table.qp_num(qp)?)
    }

    fn max_msg_size(&self) -> usize {
        max_msg(self.mtu)
    }

    fn post_recv(&mut self, qp: QpHandle, wr_id: u64, buf: Vec<u8>) -> Result<(), Error> {
        Ok(self.table.post_recv(qp, wr_id, buf)?)
    }

    fn post_send(&mut self, qp: QpHandle, wr: &SendWr<'_>) -> Result<(), Error> {
        let max = self.max_msg_size();
        Ok(self.table.post_send(qp, wr, max)?)
    }

    fn poll_cq(
        &mut self,
        qp: QpHandle,
        _now: Instant,
        max: usize,
        out: &mut Vec<Completion>,
    ) -> Result<usize, Error> {
        Ok(self.table.poll_cq(qp, max, out)?)
    }

    fn destroy_qp(&mut self, qp: QpHandle) -> Result<(), Error> {
        Ok(self.table.destroy_qp(qp)?)
    }
}
