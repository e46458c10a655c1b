//! RDMA RC queue pairs and memory regions on a spawned stack, for any
//! thread or task: the async front ([`RcQp::completions`]) and the
//! blocking one ([`RcQp::wait_completions`]) wait on the QP's readiness
//! event (new completions, or the error state); posting work wakes the
//! loop. In-loop apps use the verbs on [`ustack::Stack`] directly
//! (`rc_*`).
//!
//! ```
//! use std::net::Ipv4Addr;
//! use std::time::Duration;
//! use ustack::socket::rc::{Access, Local, RcDest, RcOp, RcQpConfig, RcSendWr};
//! use ustack_runtime::Builder;
//! use ustack_runtime::rdma::{MemoryRegion, RcQp};
//!
//! let link = ustack::sim::SimLink::new(Default::default());
//! let a = Builder::new().sim(&link).ip(Ipv4Addr::new(10, 0, 0, 1), 24).spawn()?;
//! let b = Builder::new().sim(&link).ip(Ipv4Addr::new(10, 0, 0, 2), 24).spawn()?;
//! let qa = RcQp::create(a.net(), &RcQpConfig::default())?;
//! let qb = RcQp::create(b.net(), &RcQpConfig::default())?;
//! let (sa, sb) = (qa.status()?, qb.status()?);
//! qa.connect(RcDest { ip: Ipv4Addr::new(10, 0, 0, 2).into(), qpn: sb.qpn, psn: sb.initial_psn })?;
//! qb.connect(RcDest { ip: Ipv4Addr::new(10, 0, 0, 1).into(), qpn: sa.qpn, psn: sa.initial_psn })?;
//! // B offers a region; A writes into it.
//! let mr = MemoryRegion::register(b.net(), 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
//! let info = mr.info();
//! qa.post_send(&RcSendWr {
//!     wr_id: 1,
//!     op: RcOp::Write { remote_addr: info.addr, rkey: info.rkey },
//!     local: Local::Inline(b"hello"),
//!     signaled: true,
//!     solicited: false,
//! })?;
//! let wcs = qa.wait_completions(16, Some(Duration::from_secs(5)))?;
//! assert_eq!(wcs[0].status, ustack::socket::rc::WcStatus::Success);
//! assert_eq!(&mr.read(0, 5)?, b"hello");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::future::poll_fn;
use std::io;
use std::task::{Context, Poll};
use std::time::Duration;

use ustack::events::SocketRef;
use ustack::socket::rc::{
    Access, MrHandle, MrInfo, RcDest, RcQpConfig, RcQpHandle, RcQpStatus, RcSendWr, Sge, Wc,
};

use crate::blocking::block_on;
use crate::spawned::{Interest, Net, io_error};

/// A registered memory region of a spawned stack. Dropping it deregisters
/// the region.
#[derive(Debug)]
pub struct MemoryRegion {
    net: Net,
    handle: MrHandle,
    info: MrInfo,
}

impl MemoryRegion {
    /// Register `len` zeroed bytes allowing `access`.
    pub fn register(net: &Net, len: usize, access: Access) -> io::Result<MemoryRegion> {
        let mut inner = net.lock()?;
        let handle = inner.stack.rc().reg_mr(len, access).map_err(io_error)?;
        let info = inner.stack.rc_ref().mr_info(handle).map_err(io_error)?;
        Ok(MemoryRegion {
            net: net.clone(),
            handle,
            info,
        })
    }

    /// Address range, keys and access (what to hand a peer).
    pub fn info(&self) -> MrInfo {
        self.info
    }

    /// Scatter/gather element for `len` bytes at `offset` of the region.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge {
            addr: self.info.addr + offset as u64,
            len,
            lkey: self.info.lkey,
        }
    }

    /// A copy of `len` bytes at `offset`.
    pub fn read(&self, offset: usize, len: usize) -> io::Result<Vec<u8>> {
        let inner = self.net.lock()?;
        let data = inner.stack.rc_ref().mr(self.handle).map_err(io_error)?;
        data.get(offset..offset.saturating_add(len))
            .map(<[u8]>::to_vec)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "range outside the region"))
    }

    /// Copy `bytes` to `offset`.
    pub fn write(&self, offset: usize, bytes: &[u8]) -> io::Result<()> {
        let mut inner = self.net.lock()?;
        let data = inner.stack.rc().mr_mut(self.handle).map_err(io_error)?;
        data.get_mut(offset..offset.saturating_add(bytes.len()))
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "range outside the region"))?
            .copy_from_slice(bytes);
        Ok(())
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        if let Ok(mut inner) = self.net.lock() {
            let _ = inner.stack.rc().dereg_mr(self.handle);
        }
    }
}

/// An RC queue pair of a spawned stack. Dropping it destroys the QP.
#[derive(Debug)]
pub struct RcQp {
    net: Net,
    handle: RcQpHandle,
}

impl RcQp {
    /// Create a QP in INIT ([`status`](Self::status) gives the QPN and
    /// first PSN to hand the peer).
    pub fn create(net: &Net, cfg: &RcQpConfig) -> io::Result<RcQp> {
        let mut inner = net.lock()?;
        let handle = inner.stack.rc().create_qp(cfg).map_err(io_error)?;
        Ok(RcQp {
            net: net.clone(),
            handle,
        })
    }

    /// State, PSNs, queues and counters.
    pub fn status(&self) -> io::Result<RcQpStatus> {
        let inner = self.net.lock()?;
        inner
            .stack
            .rc_ref()
            .qp_status(self.handle)
            .map_err(io_error)
    }

    /// Connect to the peer (to RTS).
    pub fn connect(&self, dest: RcDest) -> io::Result<()> {
        self.net
            .lock()?
            .stack
            .rc()
            .connect(self.handle, dest)
            .map_err(io_error)?;
        self.net.kick();
        Ok(())
    }

    /// Post a send work request (`WouldBlock` when the send queue is full).
    pub fn post_send(&self, wr: &RcSendWr<'_>) -> io::Result<()> {
        self.net
            .lock()?
            .stack
            .rc()
            .post_send(self.handle, wr)
            .map_err(io_error)?;
        self.net.kick();
        Ok(())
    }

    /// Post a receive into `sge`.
    pub fn post_recv(&self, wr_id: u64, sge: Sge) -> io::Result<()> {
        self.net
            .lock()?
            .stack
            .rc()
            .post_recv(self.handle, wr_id, sge)
            .map_err(io_error)
    }

    /// Move the QP to the error state (outstanding work is flushed).
    pub fn set_error(&self) -> io::Result<()> {
        self.net
            .lock()?
            .stack
            .rc()
            .set_error(self.handle)
            .map_err(io_error)?;
        self.net.kick();
        Ok(())
    }

    /// Poll for up to `max` completions: ready with at least one.
    pub fn poll_completions(
        &self,
        cx: &mut Context<'_>,
        max: usize,
        out: &mut Vec<Wc>,
    ) -> Poll<io::Result<usize>> {
        let mut inner = match self.net.lock() {
            Ok(i) => i,
            Err(e) => return Poll::Ready(Err(e)),
        };
        match inner.stack.rc().poll_cq(self.handle, max, out) {
            Ok(0) => {
                inner.wait(SocketRef::RcQp(self.handle), Interest::Read, cx);
                Poll::Pending
            }
            Ok(n) => Poll::Ready(Ok(n)),
            Err(e) => Poll::Ready(Err(io_error(e))),
        }
    }

    /// Wait for completions; returns between 1 and `max` of them.
    pub async fn completions(&self, max: usize) -> io::Result<Vec<Wc>> {
        let mut out = Vec::new();
        poll_fn(|cx| self.poll_completions(cx, max, &mut out)).await?;
        Ok(out)
    }

    /// Block this thread for completions (at most `timeout`; then
    /// `WouldBlock`); returns between 1 and `max` of them.
    pub fn wait_completions(&self, max: usize, timeout: Option<Duration>) -> io::Result<Vec<Wc>> {
        block_on(self.completions(max), timeout)
    }
}

impl Drop for RcQp {
    fn drop(&mut self) {
        if let Ok(mut inner) = self.net.lock() {
            let _ = inner.stack.rc().destroy_qp(self.handle);
            inner.forget(SocketRef::RcQp(self.handle));
        }
    }
}
