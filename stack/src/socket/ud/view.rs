//! [`Ud`]: the RoCEv2 UD queue pairs of a [`Stack`], lent by
//! `stack.ud()`: the [`UdTransport`] the stack speaks itself.

use super::{Completion, QpConfig, QpHandle, SendWr, UdTransport, max_msg};
use crate::error::Error;
use crate::stack::Stack;
use crate::time::Instant;

/// The UD queue pairs of a stack.
#[derive(Debug)]
pub struct Ud<'a> {
    stack: &'a mut Stack,
}

impl<'a> Ud<'a> {
    pub(crate) fn new(stack: &'a mut Stack) -> Self {
        Ud { stack }
    }
}

impl UdTransport for Ud<'_> {
    fn create_qp(&mut self, cfg: &QpConfig) -> Result<QpHandle, Error> {
        let Stack { ud, rc, .. } = &mut *self.stack;
        Ok(ud.create_qp(cfg, &|q| rc.has_qpn(q))?)
    }

    fn qp_num(&self, qp: QpHandle) -> Result<u32, Error> {
        Ok(self.stack.ud.qp_num(qp)?)
    }

    fn max_msg_size(&self) -> usize {
        max_msg(self.stack.config().mtu)
    }

    fn post_recv(&mut self, qp: QpHandle, wr_id: u64, buf: Vec<u8>) -> Result<(), Error> {
        Ok(self.stack.ud.post_recv(qp, wr_id, buf)?)
    }

    fn post_send(&mut self, qp: QpHandle, wr: &SendWr<'_>) -> Result<(), Error> {
        let max = self.max_msg_size();
        Ok(self.stack.ud.post_send(qp, wr, max)?)
    }

    fn poll_cq(
        &mut self,
        qp: QpHandle,
        _now: Instant,
        max: usize,
        out: &mut Vec<Completion>,
    ) -> Result<usize, Error> {
        Ok(self.stack.ud.poll_cq(qp, max, out)?)
    }

    fn destroy_qp(&mut self, qp: QpHandle) -> Result<(), Error> {
        Ok(self.stack.ud.destroy_qp(qp)?)
    }
}
