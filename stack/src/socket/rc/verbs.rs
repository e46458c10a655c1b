//! The RC verbs' vocabulary, a leaf the QP and the table both use: QP
//! attributes ([`RcQpConfig`]), the peer ([`RcDest`]), states, work
//! requests ([`RcSendWr`], [`Sge`]), completions ([`Wc`]), errors and
//! the status utop shows.

use core::net::IpAddr;

use serde::Serialize;

use crate::stats::RcQpStats;

/// The largest RC message (2^31 bytes, the verbs limit).
pub const MAX_MSG: usize = 1 << 31;

/// How to create an RC QP (the verbs QP attributes that matter here).
#[derive(Debug, Clone)]
pub struct RcQpConfig {
    /// Ask for a QP number (else the next free one).
    pub qpn: Option<u32>,
    /// First PSN this QP sends with (else a keyed-random one).
    pub psn: Option<u32>,
    /// The InfiniBand path MTU (256, 512, 1024, 2048 or 4096); both ends
    /// must use the same. Default: the largest the link carries.
    pub mtu: Option<usize>,
    /// Send work requests posted and not yet polled.
    pub max_send_wr: usize,
    /// Receive work requests posted and not yet polled.
    pub max_recv_wr: usize,
    /// Local ACK timeout, encoded: 4.096 µs × 2^timeout (14 is 67 ms,
    /// perftest's default).
    pub timeout: u8,
    /// Retries after an ACK timeout or a sequence NAK (0-7).
    pub retry_cnt: u8,
    /// Retries after an RNR NAK (0-7; 7 is forever).
    pub rnr_retry: u8,
    /// The RNR timer this QP asks peers to wait (encoded, IBTA table 45;
    /// 12 is 0.64 ms).
    pub min_rnr_timer: u8,
    /// READs this QP has outstanding at once.
    pub max_rd_atomic: usize,
    /// READs from the peer this QP answers at once.
    pub max_dest_rd_atomic: usize,
    /// Packets in flight (not acknowledged) at most.
    pub window: u32,
    /// The traffic class of every packet the QP sends (IPv4 TOS byte:
    /// DSCP in the upper six bits, ECN in the lower two; IPv6 traffic
    /// class), as verbs' `ah_attr.grh.traffic_class` of the QP's path.
    /// 0 by default.
    pub traffic_class: u8,
}

impl Default for RcQpConfig {
    fn default() -> Self {
        RcQpConfig {
            qpn: None,
            psn: None,
            mtu: None,
            max_send_wr: 256,
            max_recv_wr: 256,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            // rxe offers 128 outstanding READs and perftest asks for what
            // the device offers: answer as many.
            max_dest_rd_atomic: 128,
            window: 1024,
            traffic_class: 0,
        }
    }
}

/// The peer an RC QP is connected to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RcDest {
    /// The peer's address (its GID: IPv4 for `::ffff:a.b.c.d`, else IPv6).
    pub ip: IpAddr,
    /// The peer QP's number.
    pub qpn: u32,
    /// The first PSN the peer sends with (what this QP expects first).
    pub psn: u32,
}

/// A QP's state (the verbs states this transport uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum QpState {
    /// Created, not connected: nothing is sent or taken.
    Init,
    /// Connected: ready to send and receive.
    Rts,
    /// Failed (or moved there by the app): work is flushed.
    Error,
}

/// Bytes of a memory region: a scatter/gather element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address of the first byte (within the region).
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// The region's local key.
    pub lkey: u32,
}

/// What a send work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RcOp {
    /// SEND: consumes a receive at the peer.
    Send,
    /// SEND with immediate data.
    SendImm(u32),
    /// RDMA WRITE to the peer's `remote_addr` in the region `rkey` names.
    Write {
        /// Where in the peer's region.
        remote_addr: u64,
        /// The peer region's remote key.
        rkey: u32,
    },
    /// RDMA WRITE with immediate data (consumes a receive at the peer).
    WriteImm {
        /// Where in the peer's region.
        remote_addr: u64,
        /// The peer region's remote key.
        rkey: u32,
        /// The immediate data.
        imm: u32,
    },
    /// RDMA READ from the peer's `remote_addr` into the local bytes.
    Read {
        /// Where in the peer's region.
        remote_addr: u64,
        /// The peer region's remote key.
        rkey: u32,
    },
    /// Atomic compare-and-swap of the 8 bytes at the peer's `remote_addr`
    /// (8-byte aligned, host byte order): if they equal `compare` they
    /// become `swap`. The value found lands in the local 8 bytes.
    CompareSwap {
        /// Where in the peer's region.
        remote_addr: u64,
        /// The peer region's remote key.
        rkey: u32,
        /// The value expected.
        compare: u64,
        /// The value stored when it matched.
        swap: u64,
    },
    /// Atomic fetch-and-add on the 8 bytes at the peer's `remote_addr`
    /// (8-byte aligned, host byte order, wrapping). The value found lands
    /// in the local 8 bytes.
    FetchAdd {
        /// Where in the peer's region.
        remote_addr: u64,
        /// The peer region's remote key.
        rkey: u32,
        /// What is added.
        add: u64,
    },
}

/// Bytes an atomic operates on (and returns).
pub const ATOMIC_LEN: usize = 8;

impl RcOp {
    /// Whether the local bytes are written (READ and atomics), so they
    /// need a region with local write access.
    pub(super) fn fetches(self) -> bool {
        matches!(
            self,
            RcOp::Read { .. } | RcOp::CompareSwap { .. } | RcOp::FetchAdd { .. }
        )
    }

    pub(super) fn is_atomic(self) -> bool {
        matches!(self, RcOp::CompareSwap { .. } | RcOp::FetchAdd { .. })
    }
}

/// The local side of a send work request.
#[derive(Debug, Clone, Copy)]
pub enum Local<'a> {
    /// Bytes of a registered region (read when sent, and again when
    /// resent; a READ's destination).
    Sge(Sge),
    /// Bytes copied when posted (verbs' inline send; not for READ).
    Inline(&'a [u8]),
}

/// A send work request.
#[derive(Debug, Clone, Copy)]
pub struct RcSendWr<'a> {
    /// The caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// SEND, WRITE or READ.
    pub op: RcOp,
    /// The local bytes.
    pub local: Local<'a>,
    /// Whether a successful completion is reported (errors always are).
    pub signaled: bool,
    /// Set the solicited-event bit on the last packet.
    pub solicited: bool,
}

/// What a completion is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum WcOpcode {
    /// A SEND (with or without immediate) this QP posted.
    Send,
    /// An RDMA WRITE this QP posted.
    RdmaWrite,
    /// An RDMA READ this QP posted.
    RdmaRead,
    /// A compare-and-swap this QP posted.
    CompareSwap,
    /// A fetch-and-add this QP posted.
    FetchAdd,
    /// A SEND received into a posted receive.
    Recv,
    /// A WRITE with immediate received (its data is in the region; the
    /// receive carries the immediate).
    RecvRdmaWithImm,
}

/// A completion's status (the `ibv_wc_status` values RC produces).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum WcStatus {
    /// Done.
    Success,
    /// A received message was longer than the posted receive.
    LocalLengthError,
    /// A local region was missing, too small or without the access.
    LocalProtectionError,
    /// Flushed: the QP went to the error state with it outstanding.
    Flushed,
    /// The peer answered with an invalid-request NAK.
    RemoteInvalidRequest,
    /// The peer refused the key or range (remote access NAK).
    RemoteAccessError,
    /// The peer could not complete it (remote operational NAK).
    RemoteOperationalError,
    /// No ACK after the retry count was spent.
    RetryExceeded,
    /// RNR NAKs after the RNR retry count was spent.
    RnrRetryExceeded,
}

/// A completion queue entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Wc {
    /// The work request's identifier.
    pub wr_id: u64,
    /// What completed.
    pub opcode: WcOpcode,
    /// How it ended.
    pub status: WcStatus,
    /// Message bytes (received, or of the work request).
    pub byte_len: usize,
    /// Immediate data received.
    pub imm: Option<u32>,
    /// The QP it belongs to.
    pub qp_num: u32,
}

pub use crate::error::RcError;

/// What utop and telemetry show of one QP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RcQpStatus {
    /// The QP number.
    pub qpn: u32,
    /// Its state.
    pub state: QpState,
    /// The peer, once connected.
    pub dest: Option<RcDest>,
    /// Path MTU in bytes.
    pub mtu: usize,
    /// The first PSN this QP sends with (what its peer must expect).
    pub initial_psn: u32,
    /// The PSN the next posted work request starts at.
    pub next_psn: u32,
    /// The oldest PSN not acknowledged.
    pub una_psn: u32,
    /// The PSN expected from the peer.
    pub expected_psn: u32,
    /// Send work requests not completed.
    pub send_outstanding: usize,
    /// Receives posted and not used.
    pub recv_posted: usize,
    /// READs sent whose responses are not all in.
    pub reads_outstanding: usize,
    /// Completions not polled.
    pub cq_depth: usize,
    /// The counters.
    pub stats: RcQpStats,
}
