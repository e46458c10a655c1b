//! RDMA Unreliable Datagram: one API, two transports.
//!
//! [`UdTransport`] is the verbs shape: create a UD queue pair with a Q_Key,
//! post receive buffers, post sends to (address, QPN, Q_Key) with optional
//! immediate data, poll a completion queue whose entries carry timestamps.
//!
//! - [`Stack`](crate::Stack) implements it with RoCEv2 on the wire, built by the stack
//!   itself (`Ethernet | IPv4 | UDP 4791 | BTH | DETH | [ImmDt] | payload |
//!   pad | ICRC`), so any backend (sim, pcap, DPDK) talks to real RNICs.
//!   Timestamps are the poll loop's `now` when the packet was processed
//!   (receive) or written to the device (send): [`TsSource::Poll`].
//! - The `ustack-verbs` crate implements it on a real RNIC through ibverbs,
//!   with hardware completion timestamps where the device offers them.
//!
//! Receive buffers follow the verbs convention: the first [`GRH_LEN`] (40)
//! bytes are reserved for the GRH; for RoCEv2 over IPv4 bytes 0-19 are zero
//! and bytes 20-39 hold the received IPv4 header, over IPv6 the 40 bytes
//! hold the received IPv6 header; the payload starts at byte 40, and a completion's `byte_len` counts the 40 bytes. Each QP has its
//! own completion queue (sends and receives), bounded by its work requests.

mod view;

use crate::wire::roce as wire;

use core::net::IpAddr;
use std::collections::{HashMap, VecDeque};

use smoltcp::wire::{
    IPV4_HEADER_LEN as IP_LEN, IPV6_HEADER_LEN, IpProtocol, Ipv4Packet, Ipv6Packet,
};

use slotmap::SlotMap;

use crate::error::Error;
use crate::iface::link::Link;
use crate::phy::device::Tx;
use crate::stats::DropReason;
use crate::time::Instant;
use wire::{
    BTH_LEN, DEFAULT_PKEY, DETH_LEN, ICRC_LEN, IMM_LEN, MAX_QPN, PSN_MASK, ROCE_PORT, UdSendRepr,
    WireError,
};

/// Bytes reserved at the head of every receive buffer (the GRH space).
pub const GRH_LEN: usize = 40;
/// perftest's default Q_Key.
pub const DEFAULT_QKEY: u32 = 0x1111_1111;
/// The QPN of `ustack run`'s ping responder (and uperf sink).
pub const RESPONDER_QPN: u32 = 2;
/// First QPN handed out when none is asked for (0 and 1 are the IB SMI and
/// GSI QPs; a few below 0x100 stay free for well-known services).
const FIRST_DYNAMIC_QPN: u32 = 0x100;
/// Bytes of IPv4, UDP, BTH, DETH, immediate data and ICRC around a payload.
pub const ROCE_OVERHEAD: usize = IP_LEN + 8 + BTH_LEN + DETH_LEN + IMM_LEN + ICRC_LEN;

/// A UD peer: an IP address (the GID: an IPv4 address for a GID of the
/// form `::ffff:a.b.c.d`, else the IPv6 address) and a QP number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdAddr {
    /// The peer's address.
    pub ip: IpAddr,
    /// The peer's queue pair number (24 bits).
    pub qpn: u32,
}

impl std::fmt::Display for UdAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} qpn {}", self.ip, self.qpn)
    }
}

slotmap::new_key_type! {
    /// A queue pair of one transport. Handles carry a generation: one kept
    /// after `destroy_qp` is refused (`InvalidQp`), never another QP.
    /// Transports keep their QPs in a `slotmap::SlotMap<QpHandle, _>`.
    pub struct QpHandle;
}

/// How to create a UD QP.
#[derive(Debug, Clone)]
pub struct QpConfig {
    /// The QP's Q_Key: received SENDs must carry it, and sends use it when
    /// a work request asks for the QP's own key.
    pub qkey: u32,
    /// Ask for a QP number (the stack's transport only; verbs picks its own).
    pub qpn: Option<u32>,
    /// Outstanding sends (posted, not yet completed).
    pub max_send_wr: usize,
    /// Posted receive buffers.
    pub max_recv_wr: usize,
    /// The traffic class of every packet the QP sends: the GRH's traffic
    /// class byte, on the wire the IPv4 TOS byte (DSCP in its upper six
    /// bits, ECN in the lower two) or the IPv6 traffic class, as verbs'
    /// `ah_attr.grh.traffic_class` and rxe carry it (DSCP 26 is 104).
    /// The ICRC masks it, so switches may rewrite it. 0 by default.
    pub traffic_class: u8,
}

impl QpConfig {
    /// A QP with Q_Key `qkey`, any free QP number, and room for 256
    /// outstanding sends and 256 posted receive buffers.
    pub fn new(qkey: u32) -> Self {
        QpConfig {
            qkey,
            qpn: None,
            max_send_wr: 256,
            max_recv_wr: 256,
            traffic_class: 0,
        }
    }
}

/// A send work request.
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// The caller's identifier, returned in the send's completion.
    pub wr_id: u64,
    /// The peer to send to.
    pub dest: UdAddr,
    /// The Q_Key to send with; with the high bit set the QP's own Q_Key is
    /// used instead (the verbs rule for controlled Q_Keys).
    pub remote_qkey: u32,
    /// Immediate data: sent as SEND_ONLY_WITH_IMMEDIATE and handed to the
    /// receiver in its completion.
    pub imm: Option<u32>,
    /// Set the BTH's solicited-event bit.
    pub solicited: bool,
    /// The message (copied when posted), at most
    /// [`UdTransport::max_msg_size`] bytes.
    pub data: &'a [u8],
}

/// What a completion is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    /// A posted send completed (left, or failed).
    Send,
    /// A posted receive buffer was filled (or failed).
    Recv,
}

/// A completion's status (the verbs `ibv_wc_status` values we produce).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcStatus {
    /// The work request completed.
    Success,
    /// The message did not fit the posted receive buffer.
    LocalLengthError,
    /// The send could not leave (no route to the address).
    GeneralError,
    /// The QP was destroyed with the request outstanding.
    Flushed,
    /// Any other status a device reported (its numeric code).
    Other(u32),
}

/// Where a completion's timestamp came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TsSource {
    /// The NIC's completion timestamp (converted to nanoseconds of its clock).
    Nic,
    /// The poll loop's clock: when the port received the packet (its
    /// receive stamp where it has one, as libpcap's kernel stamp, else the
    /// poll that processed it), or when it was written to the device (the
    /// stack's transport) or posted (a verbs device without completion
    /// timestamps: when it left is unknown).
    Poll,
}

/// A completion queue entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The work request's identifier as posted.
    pub wr_id: u64,
    /// Send or receive.
    pub opcode: WcOpcode,
    /// Whether it succeeded, and why not.
    pub status: WcStatus,
    /// Bytes received including the 40 GRH bytes (receives), or sent.
    pub byte_len: usize,
    /// Immediate data the SEND carried (receives), or was sent with (sends).
    pub imm: Option<u32>,
    /// The sender (receives).
    pub src: Option<UdAddr>,
    /// When the work completed (see `ts_source` for which clock).
    pub timestamp: Instant,
    /// Where `timestamp` came from.
    pub ts_source: TsSource,
    /// The posted receive buffer, handed back with the data in it.
    pub buf: Option<Vec<u8>>,
}

impl Completion {
    /// The payload of a successful receive (after the GRH space).
    pub fn payload(&self) -> &[u8] {
        match &self.buf {
            Some(b) if self.opcode == WcOpcode::Recv && self.status == WcStatus::Success => b
                .get(GRH_LEN..self.byte_len.min(b.len()))
                .unwrap_or_default(),
            _ => &[],
        }
    }
}

pub use crate::error::UdError;
pub use view::Ud;

/// The UD verbs both transports implement: the stack's own RoCEv2
/// ([`Ud`], from `stack.ud()`) and ibverbs. A failed verb is
/// [`Error::Ud`] with its [`UdError`].
pub trait UdTransport {
    /// Create a UD QP, ready to send and receive (verbs: INIT, RTR, RTS).
    fn create_qp(&mut self, cfg: &QpConfig) -> Result<QpHandle, Error>;
    /// The QP's number (what peers send to).
    fn qp_num(&self, qp: QpHandle) -> Result<u32, Error>;
    /// Largest message a single UD SEND carries on this transport.
    fn max_msg_size(&self) -> usize;
    /// Post a receive buffer; its length is what may be received (40 GRH
    /// bytes included). It comes back in the completion.
    fn post_recv(&mut self, qp: QpHandle, wr_id: u64, buf: Vec<u8>) -> Result<(), Error>;
    /// Post a send; the data is copied, completion is always signaled.
    fn post_send(&mut self, qp: QpHandle, wr: &SendWr<'_>) -> Result<(), Error>;
    /// Move up to `max` completions of the QP into `out`; returns how many.
    /// `now` stamps completions of transports without their own timestamps.
    fn poll_cq(
        &mut self,
        qp: QpHandle,
        now: Instant,
        max: usize,
        out: &mut Vec<Completion>,
    ) -> Result<usize, Error>;
    /// Destroy a QP; outstanding work is discarded.
    fn destroy_qp(&mut self, qp: QpHandle) -> Result<(), Error>;
}

#[derive(Debug)]
struct PendingSend {
    wr_id: u64,
    dest: UdAddr,
    qkey: u32,
    imm: Option<u32>,
    solicited: bool,
    data: Vec<u8>,
}

#[derive(Debug)]
pub(crate) struct Qp {
    qpn: u32,
    qkey: u32,
    psn: u32,
    /// The traffic class its packets carry ([`QpConfig::traffic_class`]).
    tclass: u8,
    max_send: usize,
    max_recv: usize,
    recv: VecDeque<(u64, Vec<u8>)>,
    send: VecDeque<PendingSend>,
    /// Sends completed but not polled, counted against `max_send` (as a
    /// verbs send queue slot stays taken until the app sees it).
    send_cqes: usize,
    cq: VecDeque<Completion>,
    queued: bool,
}

/// The stack's UD queue pairs, hashed by QPN.
#[derive(Debug, Default)]
pub(crate) struct UdTable {
    qps: SlotMap<QpHandle, Qp>,
    by_qpn: HashMap<u32, QpHandle>,
    next_qpn: u32,
    ready: VecDeque<QpHandle>,
}

/// Bytes a RoCE peer reserves for headers when it derives the InfiniBand
/// path MTU from the IP MTU (Linux rxe's `RXE_MAX_HDR_LENGTH`, and what
/// RNIC drivers use): the largest IB MTU that fits `mtu - 80`.
pub const IB_MTU_HEADROOM: usize = 80;

/// The InfiniBand path MTU of a link with IP MTU `mtu`: the largest of 256,
/// 512, 1024, 2048 and 4096 that fits `mtu - 80` (1024 on a 1500-byte
/// link, 4096 on a 9000-byte one), or `None` below 336 bytes.
pub fn ib_path_mtu(mtu: usize) -> Option<usize> {
    let room = mtu.checked_sub(IB_MTU_HEADROOM)?;
    [4096, 2048, 1024, 512, 256]
        .into_iter()
        .find(|&m| m <= room)
}

/// Largest UD message on a link of IP MTU `mtu`: the InfiniBand path MTU,
/// as every verbs peer computes it (a verbs device never delivers nor sends
/// a larger UD message, so a bigger one would only reach another ustack).
/// On links too small for the 256-byte IB MTU: what one packet holds with
/// room for immediate data, rounded down to a multiple of 4.
pub fn max_msg(mtu: usize) -> usize {
    ib_path_mtu(mtu).unwrap_or(mtu.saturating_sub(ROCE_OVERHEAD) & !3)
}

impl UdTable {
    fn get(&self, h: QpHandle) -> Result<&Qp, UdError> {
        self.qps.get(h).ok_or(UdError::InvalidQp)
    }

    fn get_mut(&mut self, h: QpHandle) -> Result<&mut Qp, UdError> {
        self.qps.get_mut(h).ok_or(UdError::InvalidQp)
    }

    pub(crate) fn count(&self) -> usize {
        self.by_qpn.len()
    }

    pub(crate) fn has_work(&self) -> bool {
        !self.ready.is_empty()
    }

    pub(crate) fn has_qpn(&self, qpn: u32) -> bool {
        self.by_qpn.contains_key(&qpn)
    }

    fn pick_qpn(&mut self, taken: &dyn Fn(u32) -> bool) -> Option<u32> {
        for _ in 0..MAX_QPN {
            let q = self.next_qpn.max(FIRST_DYNAMIC_QPN);
            self.next_qpn = if q >= MAX_QPN {
                FIRST_DYNAMIC_QPN
            } else {
                q + 1
            };
            if !self.by_qpn.contains_key(&q) && !taken(q) {
                return Some(q);
            }
        }
        None
    }
}

/// The IPv4 packet a RoCEv2 datagram came in (header through the end of
/// the UDP datagram), checked to hold a BTH and a good ICRC. Reassembled
/// datagrams have no single header to check: RoCE is never fragmented
/// (RNICs set DF).
pub(crate) fn roce_packet<'a>(
    ip: Option<&'a [u8]>,
    udp_payload: &[u8],
) -> Result<&'a [u8], DropReason> {
    let ip = ip.ok_or(DropReason::UdMalformed)?;
    let first = ip.first().copied().unwrap_or(0);
    let header = match first >> 4 {
        4 => usize::from(first & 0x0f) * 4,
        // No extension header may come between IPv6 and UDP (annex A17).
        6 if ip.get(6) == Some(&17) => IPV6_HEADER_LEN,
        _ => return Err(DropReason::UdMalformed),
    };
    let ip = ip
        .get(..header + 8 + udp_payload.len())
        .ok_or(DropReason::UdMalformed)?;
    if udp_payload.len() < BTH_LEN + ICRC_LEN {
        return Err(DropReason::UdMalformed);
    }
    if !wire::icrc_verify(ip) {
        return Err(DropReason::UdBadIcrc);
    }
    Ok(ip)
}

/// The sender of a RoCEv2 packet that [`roce_packet`] took.
pub(crate) fn roce_source(ip: &[u8]) -> IpAddr {
    if ip.first().is_some_and(|b| b >> 4 == 6) {
        Ipv6Packet::new_unchecked(ip).src_addr().into()
    } else {
        Ipv4Packet::new_unchecked(ip).src_addr().into()
    }
}

/// Where a RoCEv2 packet goes and how it is marked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Roce {
    /// The peer's address (its GID).
    pub(crate) dst: IpAddr,
    /// The traffic class (IPv4 TOS byte, IPv6 traffic class).
    pub(crate) tclass: u8,
    /// The UDP source port (the flow's entropy).
    pub(crate) sport: u16,
}

/// Put one RoCEv2 packet on the wire to `dst`: the IP header (IPv4 with DF
/// set, or IPv6 from the source address the destination picks) with the
/// traffic class, UDP from `sport` to 4791 with checksum 0 (as RNICs and
/// rxe send it over either family; the ICRC covers the packet), `roce_len`
/// bytes that `write` fills (the BTH on, the ICRC's 4 bytes last), then
/// the ICRC.
pub(crate) fn send_roce<T: Tx>(
    link: &mut Link,
    now: Instant,
    tx: &mut T,
    Roce { dst, tclass, sport }: Roce,
    roce_len: usize,
    write: impl FnOnce(&mut [u8]),
) -> Result<(), Error> {
    let udp_len = 8 + roce_len;
    let finish = |ip: &mut [u8], at: usize| {
        let udp = &mut ip[at..];
        udp[0..2].copy_from_slice(&sport.to_be_bytes());
        udp[2..4].copy_from_slice(&ROCE_PORT.to_be_bytes());
        udp[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        udp[6..8].fill(0);
        write(&mut udp[8..]);
        wire::icrc_fill(ip);
    };
    match dst {
        IpAddr::V4(dst) => link.send_ip_packet(now, tx, dst, IpProtocol::Udp, udp_len, |ip| {
            let mut p = Ipv4Packet::new_unchecked(&mut *ip);
            p.set_dont_frag(true);
            p.set_dscp(tclass >> 2);
            p.set_ecn(tclass & 3);
            p.fill_checksum();
            finish(ip, IP_LEN);
        }),
        IpAddr::V6(dst) => {
            crate::iface::ipv6::send_packet(link, now, tx, dst, IpProtocol::Udp, udp_len, |ip| {
                Ipv6Packet::new_unchecked(&mut *ip).set_traffic_class(tclass);
                finish(ip, IPV6_HEADER_LEN)
            })
        }
    }
}

/// Whether a RoCEv2 datagram's BTH opcode is an RC one (transport bits
/// 000), for the RC table rather than UD.
pub(crate) fn is_rc(udp_payload: &[u8]) -> bool {
    udp_payload.first().is_some_and(|&op| op <= 0x1f)
}

impl UdTable {
    /// Receive path for UDP datagrams to port 4791. `ip` is the IPv4 packet
    /// (header through the end of the UDP datagram, for the ICRC), `udp`
    /// the UDP payload within it.
    pub(crate) fn process_roce(
        &mut self,
        link: &mut Link,
        now: Instant,
        // The port's receive stamp, where it has one.
        rx_at: Option<Instant>,
        ip: Option<&[u8]>,
        udp_payload: &[u8],
    ) -> Result<(), DropReason> {
        let ip = roce_packet(ip, udp_payload)?;
        let repr = UdSendRepr::parse(udp_payload).map_err(|e| match e {
            WireError::BadOpcode => DropReason::UdBadOpcode,
            _ => DropReason::UdMalformed,
        })?;
        if repr.pkey & 0x7fff != DEFAULT_PKEY & 0x7fff {
            return Err(DropReason::UdBadPkey);
        }
        let h = *self
            .by_qpn
            .get(&repr.dest_qp)
            .ok_or(DropReason::UdUnknownQpn)?;
        let qp = self.qps.get_mut(h).ok_or(DropReason::UdUnknownQpn)?;
        if repr.qkey != qp.qkey {
            return Err(DropReason::UdBadQkey);
        }
        if qp.cq.len() >= qp.max_send + qp.max_recv {
            return Err(DropReason::UdCqFull);
        }
        let (wr_id, mut buf) = qp.recv.pop_front().ok_or(DropReason::UdNoRecvBuffer)?;
        let src = UdAddr {
            ip: roce_source(ip),
            qpn: repr.src_qp,
        };
        let need = GRH_LEN + repr.payload.len();
        let status = if buf.len() < need {
            WcStatus::LocalLengthError
        } else {
            // The GRH: the IPv6 header, or the IPv4 header in its last 20
            // bytes.
            let hdr = match src.ip {
                IpAddr::V4(_) => &ip[..IP_LEN],
                IpAddr::V6(_) => &ip[..IPV6_HEADER_LEN],
            };
            buf[..GRH_LEN - hdr.len()].fill(0);
            buf[GRH_LEN - hdr.len()..GRH_LEN].copy_from_slice(hdr);
            buf[GRH_LEN..need].copy_from_slice(repr.payload);
            WcStatus::Success
        };
        qp.cq.push_back(Completion {
            wr_id,
            opcode: WcOpcode::Recv,
            status,
            byte_len: need,
            imm: repr.imm,
            src: Some(src),
            // The port's receive stamp where it has one (the frame may have
            // waited in the port for the loop), else this poll.
            timestamp: rx_at.unwrap_or(now),
            ts_source: TsSource::Poll,
            buf: Some(buf),
        });
        let depth = qp.cq.len() as u64;
        let ud = &mut link.stats.ud;
        ud.cq_depth_hwm = ud.cq_depth_hwm.max(depth);
        if status != WcStatus::Success {
            return Err(DropReason::UdRecvTooSmall);
        }
        link.stats.ud.rx_packets += 1;
        link.stats.ud.rx_bytes += repr.payload.len() as u64;
        Ok(())
    }

    /// Emit queued sends (called from [`Stack::poll`]).
    pub(crate) fn emit<T: Tx>(&mut self, link: &mut Link, now: Instant, tx: &mut T) {
        let mut retry = Vec::new();
        while let Some(idx) = self.ready.pop_front() {
            let Some(qp) = self.qps.get_mut(idx) else {
                continue;
            };
            qp.queued = false;
            while let Some(wr) = qp.send.pop_front() {
                let repr = UdSendRepr {
                    solicited: wr.solicited,
                    mig_req: true,
                    pkey: DEFAULT_PKEY,
                    fecn: false,
                    becn: false,
                    dest_qp: wr.dest.qpn,
                    ack_req: false,
                    psn: qp.psn,
                    qkey: wr.qkey,
                    src_qp: qp.qpn,
                    imm: wr.imm,
                    payload: &wr.data,
                };
                let sport = wire::udp_source_port(qp.qpn, wr.dest.qpn);
                let at = Roce {
                    dst: wr.dest.ip,
                    tclass: qp.tclass,
                    sport,
                };
                let sent = send_roce(link, now, tx, at, repr.buffer_len(), |b| {
                    repr.emit(b);
                });
                let status = match sent {
                    Ok(()) => WcStatus::Success,
                    Err(Error::QueueFull) => {
                        // No device buffer now: try again on the next poll.
                        qp.send.push_front(wr);
                        retry.push(idx);
                        break;
                    }
                    Err(_) => WcStatus::GeneralError,
                };
                if status == WcStatus::Success {
                    qp.psn = (qp.psn + 1) & PSN_MASK;
                    link.stats.ud.tx_packets += 1;
                    link.stats.ud.tx_bytes += wr.data.len() as u64;
                } else {
                    link.stats.ud.tx_errors += 1;
                }
                qp.send_cqes += 1;
                qp.cq.push_back(Completion {
                    wr_id: wr.wr_id,
                    opcode: WcOpcode::Send,
                    status,
                    byte_len: wr.data.len(),
                    imm: wr.imm,
                    src: None,
                    timestamp: now,
                    ts_source: TsSource::Poll,
                    buf: None,
                });
            }
        }
        for idx in retry {
            if let Some(qp) = self.qps.get_mut(idx) {
                if !qp.queued {
                    qp.queued = true;
                    self.ready.push_back(idx);
                }
            }
        }
    }
}

/// The [`UdTransport`] operations on the table; the stack implements the
/// trait with these (see `Stack`), passing its message size limit.
impl UdTable {
    /// Create a QP; `taken` names QP numbers other transports of the
    /// stack (RC) hold.
    pub(crate) fn create_qp(
        &mut self,
        cfg: &QpConfig,
        taken: &dyn Fn(u32) -> bool,
    ) -> Result<QpHandle, UdError> {
        let qpn = match cfg.qpn {
            Some(q) if !(2..=MAX_QPN).contains(&q) => return Err(UdError::BadQpn(q)),
            Some(q) if self.by_qpn.contains_key(&q) || taken(q) => {
                return Err(UdError::QpnInUse(q));
            }
            Some(q) => q,
            None => self.pick_qpn(taken).ok_or(UdError::QueueFull)?,
        };
        let qp = Qp {
            qpn,
            qkey: cfg.qkey,
            psn: 0,
            tclass: cfg.traffic_class,
            max_send: cfg.max_send_wr.max(1),
            max_recv: cfg.max_recv_wr.max(1),
            recv: VecDeque::new(),
            send: VecDeque::new(),
            send_cqes: 0,
            cq: VecDeque::new(),
            queued: false,
        };
        let h = self.qps.insert(qp);
        self.by_qpn.insert(qpn, h);
        Ok(h)
    }

    pub(crate) fn qp_num(&self, qp: QpHandle) -> Result<u32, UdError> {
        Ok(self.get(qp)?.qpn)
    }

    pub(crate) fn post_recv(
        &mut self,
        qp: QpHandle,
        wr_id: u64,
        buf: Vec<u8>,
    ) -> Result<(), UdError> {
        if buf.len() < GRH_LEN {
            return Err(UdError::BufferTooSmall(buf.len()));
        }
        let q = self.get_mut(qp)?;
        if q.recv.len() >= q.max_recv {
            return Err(UdError::QueueFull);
        }
        q.recv.push_back((wr_id, buf));
        Ok(())
    }

    pub(crate) fn post_send(
        &mut self,
        qp: QpHandle,
        wr: &SendWr<'_>,
        max: usize,
    ) -> Result<(), UdError> {
        if wr.data.len() > max {
            return Err(UdError::TooLarge(wr.data.len(), max));
        }
        let q = self.get_mut(qp)?;
        if q.send.len() + q.send_cqes >= q.max_send {
            return Err(UdError::QueueFull);
        }
        let qkey = if wr.remote_qkey & 0x8000_0000 != 0 {
            q.qkey
        } else {
            wr.remote_qkey
        };
        q.send.push_back(PendingSend {
            wr_id: wr.wr_id,
            dest: UdAddr {
                ip: wr.dest.ip,
                qpn: wr.dest.qpn & MAX_QPN,
            },
            qkey,
            imm: wr.imm,
            solicited: wr.solicited,
            data: wr.data.to_vec(),
        });
        if !q.queued {
            q.queued = true;
            self.ready.push_back(qp);
        }
        Ok(())
    }

    pub(crate) fn poll_cq(
        &mut self,
        qp: QpHandle,
        max: usize,
        out: &mut Vec<Completion>,
    ) -> Result<usize, UdError> {
        let q = self.get_mut(qp)?;
        let n = max.min(q.cq.len());
        for c in q.cq.drain(..n) {
            if c.opcode == WcOpcode::Send {
                q.send_cqes -= 1;
            }
            out.push(c);
        }
        Ok(n)
    }

    pub(crate) fn destroy_qp(&mut self, qp: QpHandle) -> Result<(), UdError> {
        let q = self.qps.remove(qp).ok_or(UdError::InvalidQp)?;
        self.by_qpn.remove(&q.qpn);
        self.ready.retain(|&i| i != qp);
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn ud_messages_are_capped_at_the_ib_path_mtu() {
        // As rxe derives it from the netdev's MTU (mtu - 80, rounded down
        // to an IB MTU).
        assert_eq!(ib_path_mtu(1500), Some(1024));
        assert_eq!(ib_path_mtu(9000), Some(4096));
        assert_eq!(ib_path_mtu(4200), Some(4096));
        assert_eq!(ib_path_mtu(4175), Some(2048));
        assert_eq!(ib_path_mtu(2128), Some(2048));
        assert_eq!(ib_path_mtu(2127), Some(1024));
        assert_eq!(ib_path_mtu(336), Some(256));
        assert_eq!(ib_path_mtu(335), None);
        assert_eq!(max_msg(1500), 1024);
        assert_eq!(max_msg(65535), 4096);
        // Below the smallest IB MTU: one packet's worth, a multiple of 4.
        assert_eq!(max_msg(300), (300 - ROCE_OVERHEAD) & !3);
    }
}
