//! ustack's RDMA UD API ([`ustack::socket::ud::UdTransport`]) on a real RNIC through
//! ibverbs (`rdma-sys`). The same apps (`UdPinger`, `UdResponder`,
//! `UdBandwidth`) drive it through their `poll_transport`.
//!
//! Shape: one protection domain per device; per QP one extended completion
//! queue (`ibv_create_cq_ex` with `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`, so
//! completions carry the NIC's timestamp, converted to nanoseconds with the
//! HCA core clock; a plain CQ stamped with the poll's `now` where the device
//! has no timestamps) and one registered memory region holding its receive
//! slots and a send ring. Posted receive buffers are the caller's `Vec`s:
//! the NIC writes into a registered slot and the completion copies it into
//! the caller's buffer (GRH space first, as verbs places it). Peers are
//! addressed by IPv4 (RoCEv2 GID `::ffff:a.b.c.d`); address handles are
//! cached per peer.
//!
//! All `unsafe` is here, each block with a `// SAFETY:` comment.
#![deny(clippy::undocumented_unsafe_blocks)]

use std::collections::HashMap;
use std::ffi::CStr;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ptr;

use rdma_sys::*;
use ustack::Error;
use ustack::Instant;
use ustack::socket::ud::{
    Completion, GRH_LEN, QpConfig, QpHandle, SendWr, TsSource, UdAddr, UdError, UdTransport,
    WcOpcode, WcStatus,
};
use ustack::wire::exchange::{gid_ipv4, ipv4_gid};

/// Which device and port to open.
#[derive(Debug, Clone, Default)]
pub struct VerbsConfig {
    /// Device name (`mlx5_0`, `rxe0`); the first device when `None`.
    pub device: Option<String>,
    /// Port number (1 when `None`).
    pub port: Option<u8>,
    /// GID index (it must be a RoCE v2 GID); when `None`, the first RoCE
    /// v2 GID of the family `ipv6` asks for.
    pub gid_index: Option<u8>,
    /// Send from an IPv6 RoCE v2 GID (a global address before the
    /// link-local one) instead of an IPv4 one.
    pub ipv6: bool,
}

/// Bit that marks a send slot in a verbs wr_id (receive slots have it clear).
const SEND_BIT: u64 = 1 << 63;

enum Cq {
    /// Extended CQ; whether it reports completion timestamps.
    Ex(*mut ibv_cq_ex, bool),
    Plain(*mut ibv_cq),
}

struct VerbsQp {
    qp: *mut ibv_qp,
    cq: Cq,
    mr: *mut ibv_mr,
    /// The registered region: receive slots, then the send ring. Never
    /// reallocated while registered.
    mem: Vec<u8>,
    recv_slot: usize,
    /// Per receive slot: the caller's wr_id and buffer.
    recv: Vec<Option<(u64, Vec<u8>)>>,
    free_recv: Vec<usize>,
    send_at: usize,
    send_slot: usize,
    /// Per send slot: the caller's wr_id, the length sent and when it was
    /// posted (the loop's `now` at the last poll).
    send: Vec<Option<(u64, usize, Instant)>>,
    send_next: usize,
    /// The GRH traffic class of its sends ([`QpConfig::traffic_class`]).
    tclass: u8,
}

/// A UD transport on an RNIC.
pub struct VerbsUd {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    port: u8,
    gid_index: u8,
    local_ip: IpAddr,
    device: String,
    max_msg: usize,
    /// HCA core clock in kHz (0: unknown).
    clock_khz: u64,
    /// The `now` of the last `poll_cq`: the post time of sends made before
    /// the next (apps poll, then post, in one turn of the loop).
    last_now: Instant,
    qps: slotmap::SlotMap<QpHandle, VerbsQp>,
    /// Address handles by (peer, traffic class).
    ahs: HashMap<(IpAddr, u8), *mut ibv_ah>,
}

impl fmt::Debug for VerbsUd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerbsUd")
            .field("device", &self.device)
            .field("port", &self.port)
            .field("gid_index", &self.gid_index)
            .field("local_ip", &self.local_ip)
            .field("max_msg", &self.max_msg)
            .finish()
    }
}

fn dev_err(op: &'static str) -> UdError {
    UdError::Device {
        op,
        msg: std::io::Error::last_os_error().to_string(),
    }
}

fn mtu_bytes(m: ibv_mtu::Type) -> usize {
    match m {
        ibv_mtu::IBV_MTU_256 => 256,
        ibv_mtu::IBV_MTU_512 => 512,
        ibv_mtu::IBV_MTU_1024 => 1024,
        ibv_mtu::IBV_MTU_2048 => 2048,
        ibv_mtu::IBV_MTU_4096 => 4096,
        _ => 1024,
    }
}

fn wc_status(s: ibv_wc_status::Type) -> WcStatus {
    match s {
        ibv_wc_status::IBV_WC_SUCCESS => WcStatus::Success,
        ibv_wc_status::IBV_WC_LOC_LEN_ERR => WcStatus::LocalLengthError,
        ibv_wc_status::IBV_WC_WR_FLUSH_ERR => WcStatus::Flushed,
        x => WcStatus::Other(x),
    }
}

/// One GID table entry as the device lists it.
#[derive(Debug, Clone, Copy)]
struct GidEntry {
    index: u8,
    raw: [u8; 16],
    /// `IBV_GID_TYPE_*`, or `None` where the library cannot tell.
    kind: Option<ibv_gid_type>,
}

/// The sender in a received GRH: over IPv4 RoCEv2 its last 20 bytes are
/// the IPv4 header (the first 20 undefined), over IPv6 the 40 bytes are the
/// IPv6 header.
fn grh_source(grh: &[u8]) -> IpAddr {
    if grh[20] == 0x45 && grh[29] == 17 {
        Ipv4Addr::new(grh[32], grh[33], grh[34], grh[35]).into()
    } else {
        let mut a = [0u8; 16];
        a.copy_from_slice(&grh[8..24]);
        Ipv6Addr::from(a).into()
    }
}

/// The GID to send from: an entry of type RoCE v2 (UDP 4791), IPv4-mapped,
/// or with `ipv6` an IPv6 address (a global one before the link-local).
/// ConnectX lists each address twice, RoCE v1 (EtherType 0x8915, which no
/// RoCEv2 peer sees) first; the type decides, never the order. Entries of
/// unknown type count only where no entry's type is known (old libraries).
/// With `want`, that index, refused unless it is a RoCE v2 GID.
fn pick_gid(entries: &[GidEntry], want: Option<u8>, ipv6: bool) -> Result<(u8, IpAddr), UdError> {
    let typed = entries.iter().any(|e| e.kind.is_some());
    let usable = |e: &GidEntry| {
        let v2 = match e.kind {
            Some(k) => k == IBV_GID_TYPE_ROCE_V2,
            None => !typed,
        };
        let ip = gid_ipv4(&e.raw).map_or_else(|| Ipv6Addr::from(e.raw).into(), IpAddr::V4);
        v2.then_some(ip)
    };
    if let Some(w) = want {
        let e = entries
            .iter()
            .find(|e| e.index == w)
            .ok_or(UdError::Unsupported("no such GID index on this port"))?;
        return usable(e).map(|ip| (w, ip)).ok_or(UdError::Unsupported(
            "that GID index is not a RoCE v2 GID (RoCE v1)",
        ));
    }
    let of_family = |global: bool| {
        entries.iter().find_map(|e| match usable(e)? {
            IpAddr::V4(v4) if !ipv6 => Some((e.index, v4.into())),
            IpAddr::V6(v6) if ipv6 && v6.is_unicast_link_local() != global => {
                Some((e.index, v6.into()))
            }
            _ => None,
        })
    };
    if ipv6 {
        of_family(true)
            .or_else(|| of_family(false))
            .ok_or(UdError::Unsupported("no IPv6 RoCE v2 GID on this port"))
    } else {
        of_family(true).ok_or(UdError::Unsupported(
            "no IPv4 RoCE v2 GID on this port: set an IPv4 address on its netdev",
        ))
    }
}

/// NIC clock ticks to nanoseconds with the device's clock (`hca_core_clock`,
/// kHz). Ticks are not nanoseconds: a ConnectX-4 counts at 156.25 MHz, a
/// ConnectX-6 at 1 GHz, so taking ticks as time makes two NICs disagree.
/// `None` when the device does not say its clock: its stamps are unusable.
fn ticks_to_ns(ticks: u64, clock_khz: u64) -> Option<u64> {
    (clock_khz > 0).then(|| (u128::from(ticks) * 1_000_000 / u128::from(clock_khz)) as u64)
}

// Declared in rdma-core's verbs.h (since v32) behind the ibv_query_gid_ex
// macro; rdma-sys's bindings leave out names starting with an underscore.
unsafe extern "C" {
    fn _ibv_query_gid_ex(
        context: *mut ibv_context,
        port_num: u32,
        gid_index: u32,
        entry: *mut ibv_gid_entry,
        flags: u32,
        entry_size: usize,
    ) -> i32;
}

impl VerbsUd {
    /// Open a device. Fails with [`UdError::NoDevice`] when the host has no
    /// RDMA device (or none of that name).
    pub fn open(cfg: &VerbsConfig) -> Result<VerbsUd, UdError> {
        let mut n: i32 = 0;
        // SAFETY: `n` is a valid out-pointer; the list is freed below.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(UdError::NoDevice);
        }
        let mut chosen = None;
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: the list holds `n` valid device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: `dev` is a valid device; the name is a NUL-terminated
            // string owned by it.
            let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) }
                .to_string_lossy()
                .into_owned();
            if cfg.device.as_deref().is_none_or(|want| want == name) {
                chosen = Some((dev, name));
                break;
            }
        }
        let opened = chosen.map(|(dev, name)| {
            // SAFETY: `dev` comes from the list, which is still alive.
            (unsafe { ibv_open_device(dev) }, name)
        });
        // SAFETY: `list` came from ibv_get_device_list; an opened context
        // stays valid after the list is freed.
        unsafe { ibv_free_device_list(list) };
        let Some((ctx, device)) = opened else {
            return Err(UdError::NoDevice);
        };
        if ctx.is_null() {
            return Err(dev_err("ibv_open_device"));
        }
        let mut me = VerbsUd {
            ctx,
            pd: ptr::null_mut(),
            port: cfg.port.unwrap_or(1),
            gid_index: 0,
            local_ip: Ipv4Addr::UNSPECIFIED.into(),
            device,
            max_msg: 1024,
            clock_khz: 0,
            last_now: Instant::ZERO,
            qps: slotmap::SlotMap::with_key(),
            ahs: HashMap::new(),
        };
        // From here `me` owns ctx: Drop closes it on any error.
        // SAFETY: ctx is an open context.
        me.pd = unsafe { ibv_alloc_pd(ctx) };
        if me.pd.is_null() {
            return Err(dev_err("ibv_alloc_pd"));
        }
        // SAFETY: all-zero is a valid ibv_port_attr (plain integers).
        let mut pa: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: ctx is open and `pa` is a valid out-pointer.
        if unsafe { ___ibv_query_port(ctx, me.port, &mut pa) } != 0 {
            return Err(dev_err("ibv_query_port"));
        }
        me.max_msg = mtu_bytes(pa.active_mtu);
        let mut entries = Vec::new();
        for i in 0..pa.gid_tbl_len.clamp(0, 256) {
            // SAFETY: all-zero is a valid GID.
            let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
            // SAFETY: ctx is open, `gid` a valid out-pointer, i < table length.
            if unsafe { ibv_query_gid(ctx, me.port, i, &mut gid) } != 0 {
                continue;
            }
            // SAFETY: every bit pattern is a valid `raw` view of the union.
            let raw = unsafe { gid.raw };
            if raw == [0; 16] {
                continue;
            }
            // SAFETY: all-zero is a valid entry (integers and a GID).
            let mut entry: ibv_gid_entry = unsafe { std::mem::zeroed() };
            // SAFETY: ctx is open; `entry` is a valid out-pointer of the size
            // given; index and port are in range.
            let kind = (unsafe {
                _ibv_query_gid_ex(
                    ctx,
                    u32::from(me.port),
                    i as u32,
                    &mut entry,
                    0,
                    std::mem::size_of::<ibv_gid_entry>(),
                )
            } == 0)
                .then_some(entry.gid_type);
            entries.push(GidEntry {
                index: i as u8,
                raw,
                kind,
            });
        }
        let (gi, ip) = pick_gid(&entries, cfg.gid_index, cfg.ipv6)?;
        me.gid_index = gi;
        me.local_ip = ip;
        // SAFETY: all-zero is a valid input and attribute struct.
        let mut attr: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        // SAFETY: ctx is open; a null input is allowed; `attr` is valid.
        if unsafe { ibv_query_device_ex(ctx, ptr::null(), &mut attr) } == 0 {
            me.clock_khz = attr.hca_core_clock;
        }
        Ok(me)
    }

    pub fn device(&self) -> &str {
        &self.device
    }

    /// Our address (the GID in use).
    pub fn local_ip(&self) -> IpAddr {
        self.local_ip
    }

    fn ah(&mut self, ip: IpAddr, tclass: u8) -> Result<*mut ibv_ah, UdError> {
        if let Some(ah) = self.ahs.get(&(ip, tclass)) {
            return Ok(*ah);
        }
        if ip.is_ipv6() != self.local_ip.is_ipv6() {
            return Err(UdError::Unsupported(
                "the peer's address family differs from the GID in use",
            ));
        }
        let raw = match ip {
            IpAddr::V4(v4) => ipv4_gid(v4),
            IpAddr::V6(v6) => v6.octets(),
        };
        let mut attr = ibv_ah_attr {
            grh: ibv_global_route {
                dgid: ibv_gid { raw },
                flow_label: 0,
                sgid_index: self.gid_index,
                hop_limit: 64,
                traffic_class: tclass,
            },
            dlid: 0,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
            is_global: 1,
            port_num: self.port,
        };
        // SAFETY: pd is valid and `attr` fully initialised.
        let ah = unsafe { ibv_create_ah(self.pd, &mut attr) };
        if ah.is_null() {
            return Err(dev_err("ibv_create_ah"));
        }
        self.ahs.insert((ip, tclass), ah);
        Ok(ah)
    }

    fn create_cq(&mut self, depth: u32) -> Result<Cq, UdError> {
        let base = ibv_create_cq_wc_flags::IBV_WC_EX_WITH_BYTE_LEN.0
            | ibv_create_cq_wc_flags::IBV_WC_EX_WITH_IMM.0
            | ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SRC_QP.0;
        let ts = ibv_create_cq_wc_flags::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP.0;
        for (flags, with_ts) in [(base | ts, true), (base, false)] {
            let mut attr = ibv_cq_init_attr_ex {
                cqe: depth,
                cq_context: ptr::null_mut(),
                channel: ptr::null_mut(),
                comp_vector: 0,
                wc_flags: u64::from(flags),
                comp_mask: 0,
                flags: 0,
                parent_domain: ptr::null_mut(),
            };
            // SAFETY: ctx is open and `attr` fully initialised.
            if let Some(cq) = unsafe { ibv_create_cq_ex(self.ctx, &mut attr) } {
                if !cq.is_null() {
                    return Ok(Cq::Ex(cq, with_ts));
                }
            }
        }
        // SAFETY: ctx is open; no context, channel or vector.
        let cq =
            unsafe { ibv_create_cq(self.ctx, depth as i32, ptr::null_mut(), ptr::null_mut(), 0) };
        if cq.is_null() {
            return Err(dev_err("ibv_create_cq"));
        }
        Ok(Cq::Plain(cq))
    }

    fn qp_mut(&mut self, h: QpHandle) -> Result<&mut VerbsQp, UdError> {
        self.qps.get_mut(h).ok_or(UdError::InvalidQp)
    }

    /// Turn one verbs completion into ours (receive data copied to the
    /// caller's buffer).
    #[allow(clippy::too_many_arguments)]
    fn complete(
        q: &mut VerbsQp,
        wr_id: u64,
        status: WcStatus,
        byte_len: usize,
        imm: Option<u32>,
        src_qp: u32,
        timestamp: Instant,
        ts_source: TsSource,
    ) -> Option<Completion> {
        if wr_id & SEND_BIT != 0 {
            let slot = (wr_id & !SEND_BIT) as usize;
            let (id, len, posted) = q.send.get_mut(slot)?.take()?;
            // Without NIC stamps the poll that found the completion says
            // nothing about when the message left: the post time is the
            // closest the loop's clock knows.
            let timestamp = match ts_source {
                TsSource::Nic => timestamp,
                TsSource::Poll => posted,
            };
            return Some(Completion {
                wr_id: id,
                opcode: WcOpcode::Send,
                status,
                byte_len: len,
                imm,
                src: None,
                timestamp,
                ts_source,
                buf: None,
            });
        }
        let slot = wr_id as usize;
        let (id, mut buf) = q.recv.get_mut(slot)?.take()?;
        q.free_recv.push(slot);
        let at = slot * q.recv_slot;
        let n = byte_len.min(buf.len()).min(q.recv_slot);
        buf[..n].copy_from_slice(&q.mem[at..at + n]);
        let src = (n >= GRH_LEN).then(|| UdAddr {
            ip: grh_source(&buf[..GRH_LEN]),
            qpn: src_qp,
        });
        Some(Completion {
            wr_id: id,
            opcode: WcOpcode::Recv,
            status,
            byte_len,
            imm,
            src,
            timestamp,
            ts_source,
            buf: Some(buf),
        })
    }

    fn destroy(q: VerbsQp) {
        // SAFETY: each handle was created by us and is destroyed once, QP
        // before its CQ and memory region.
        unsafe {
            ibv_destroy_qp(q.qp);
            match q.cq {
                Cq::Ex(cq, _) => ibv_destroy_cq(ibv_cq_ex_to_cq(cq)),
                Cq::Plain(cq) => ibv_destroy_cq(cq),
            };
            ibv_dereg_mr(q.mr);
        }
        drop(q.mem);
    }
}

impl UdTransport for VerbsUd {
    fn create_qp(&mut self, cfg: &QpConfig) -> Result<QpHandle, Error> {
        let nsend = cfg.max_send_wr.clamp(1, 4096);
        let nrecv = cfg.max_recv_wr.clamp(1, 4096);
        let cq = self.create_cq((nsend + nrecv) as u32)?;
        let cq_ptr = match cq {
            // SAFETY: an extended CQ starts with an ibv_cq.
            Cq::Ex(c, _) => unsafe { ibv_cq_ex_to_cq(c) },
            Cq::Plain(c) => c,
        };
        let recv_slot = GRH_LEN + self.max_msg;
        let send_at = nrecv * recv_slot;
        let mut mem = vec![0u8; send_at + nsend * self.max_msg];
        // SAFETY: pd is valid; `mem` is not moved or resized while registered
        // (it lives in the VerbsQp until deregistered in destroy()).
        let mr = unsafe {
            ibv_reg_mr(
                self.pd,
                mem.as_mut_ptr().cast(),
                mem.len(),
                ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32,
            )
        };
        let mut init = ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: cq_ptr,
            recv_cq: cq_ptr,
            srq: ptr::null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: nsend as u32,
                max_recv_wr: nrecv as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ibv_qp_type::IBV_QPT_UD,
            sq_sig_all: 1,
        };
        let qp = if mr.is_null() {
            ptr::null_mut()
        } else {
            // SAFETY: pd and the CQ are valid; `init` is fully initialised.
            unsafe { ibv_create_qp(self.pd, &mut init) }
        };
        let mut q = VerbsQp {
            qp,
            cq,
            mr,
            mem,
            recv_slot,
            recv: (0..nrecv).map(|_| None).collect(),
            free_recv: (0..nrecv).rev().collect(),
            send_at,
            send_slot: self.max_msg,
            send: (0..nsend).map(|_| None).collect(),
            send_next: 0,
            tclass: cfg.traffic_class,
        };
        if mr.is_null() || qp.is_null() {
            let e = dev_err(if mr.is_null() {
                "ibv_reg_mr"
            } else {
                "ibv_create_qp"
            });
            // SAFETY: created above and not shared; destroyed once.
            unsafe {
                if !qp.is_null() {
                    ibv_destroy_qp(qp);
                }
                if !mr.is_null() {
                    ibv_dereg_mr(mr);
                }
                match q.cq {
                    Cq::Ex(c, _) => ibv_destroy_cq(ibv_cq_ex_to_cq(c)),
                    Cq::Plain(c) => ibv_destroy_cq(c),
                };
            }
            q.mem.clear();
            return Err(e.into());
        }
        // INIT -> RTR -> RTS.
        // SAFETY: all-zero is a valid ibv_qp_attr (integers, null pointers).
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = self.port;
        a.qkey = cfg.qkey;
        let steps = [
            (
                ibv_qp_state::IBV_QPS_INIT,
                ibv_qp_attr_mask::IBV_QP_STATE
                    | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
                    | ibv_qp_attr_mask::IBV_QP_PORT
                    | ibv_qp_attr_mask::IBV_QP_QKEY,
            ),
            (ibv_qp_state::IBV_QPS_RTR, ibv_qp_attr_mask::IBV_QP_STATE),
            (
                ibv_qp_state::IBV_QPS_RTS,
                ibv_qp_attr_mask::IBV_QP_STATE | ibv_qp_attr_mask::IBV_QP_SQ_PSN,
            ),
        ];
        for (state, mask) in steps {
            a.qp_state = state;
            // SAFETY: qp is valid and `a` initialised for the fields in `mask`.
            if unsafe { ibv_modify_qp(qp, &mut a, mask.0 as i32) } != 0 {
                let e = dev_err("ibv_modify_qp");
                Self::destroy(q);
                return Err(e.into());
            }
        }
        Ok(self.qps.insert(q))
    }

    fn qp_num(&self, qp: QpHandle) -> Result<u32, Error> {
        let q = self.qps.get(qp).ok_or(UdError::InvalidQp)?;
        // SAFETY: q.qp is a live QP.
        Ok(unsafe { (*q.qp).qp_num })
    }

    fn max_msg_size(&self) -> usize {
        self.max_msg
    }

    fn post_recv(&mut self, qp: QpHandle, wr_id: u64, buf: Vec<u8>) -> Result<(), Error> {
        if buf.len() < GRH_LEN {
            return Err(UdError::BufferTooSmall(buf.len()).into());
        }
        let q = self.qp_mut(qp)?;
        let slot = q.free_recv.pop().ok_or(UdError::QueueFull)?;
        let mut sge = ibv_sge {
            addr: q.mem.as_ptr() as u64 + (slot * q.recv_slot) as u64,
            length: buf.len().min(q.recv_slot) as u32,
            // SAFETY: mr is a live registration.
            lkey: unsafe { (*q.mr).lkey },
        };
        let mut wr = ibv_recv_wr {
            wr_id: slot as u64,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: qp is live; `wr` and `sge` outlive the call (verbs copies
        // them); the slot lies inside the registered region.
        if unsafe { ibv_post_recv(q.qp, &mut wr, &mut bad) } != 0 {
            q.free_recv.push(slot);
            return Err(dev_err("ibv_post_recv").into());
        }
        q.recv[slot] = Some((wr_id, buf));
        Ok(())
    }

    fn post_send(&mut self, qp: QpHandle, wr: &SendWr<'_>) -> Result<(), Error> {
        if wr.data.len() > self.max_msg {
            return Err(UdError::TooLarge(wr.data.len(), self.max_msg).into());
        }
        let tclass = self.qp_mut(qp)?.tclass;
        let ah = self.ah(wr.dest.ip, tclass)?;
        let posted = self.last_now;
        let q = self.qp_mut(qp)?;
        let slot = q.send_next;
        if q.send[slot].is_some() {
            return Err(UdError::QueueFull.into());
        }
        let at = q.send_at + slot * q.send_slot;
        q.mem[at..at + wr.data.len()].copy_from_slice(wr.data);
        let mut sge = ibv_sge {
            addr: q.mem.as_ptr() as u64 + at as u64,
            length: wr.data.len() as u32,
            // SAFETY: mr is a live registration.
            lkey: unsafe { (*q.mr).lkey },
        };
        let mut flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        if wr.solicited {
            flags |= ibv_send_flags::IBV_SEND_SOLICITED.0;
        }
        // SAFETY: all-zero is a valid ibv_send_wr (integers, null pointers,
        // unions of those); the fields used are set below.
        let mut swr: ibv_send_wr = unsafe { std::mem::zeroed() };
        swr.wr_id = SEND_BIT | slot as u64;
        swr.sg_list = &mut sge;
        swr.num_sge = 1;
        swr.opcode = if wr.imm.is_some() {
            ibv_wr_opcode::IBV_WR_SEND_WITH_IMM
        } else {
            ibv_wr_opcode::IBV_WR_SEND
        };
        swr.send_flags = flags;
        swr.imm_data_invalidated_rkey_union.imm_data = wr.imm.unwrap_or(0).to_be();
        swr.wr.ud = ud_t {
            ah,
            remote_qpn: wr.dest.qpn,
            remote_qkey: wr.remote_qkey,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: qp is live; `swr`/`sge` outlive the call; the data sits in
        // the registered send slot until its completion.
        if unsafe { ibv_post_send(q.qp, &mut swr, &mut bad) } != 0 {
            return Err(dev_err("ibv_post_send").into());
        }
        q.send[slot] = Some((wr.wr_id, wr.data.len(), posted));
        q.send_next = (slot + 1) % q.send.len();
        Ok(())
    }

    fn poll_cq(
        &mut self,
        qp: QpHandle,
        now: Instant,
        max: usize,
        out: &mut Vec<Completion>,
    ) -> Result<usize, Error> {
        let clock_khz = self.clock_khz;
        self.last_now = now;
        let q = self.qp_mut(qp)?;
        let mut n = 0;
        match q.cq {
            Cq::Ex(cq, with_ts) => {
                let mut attr = ibv_poll_cq_attr { comp_mask: 0 };
                // SAFETY: cq is a live extended CQ; start/next/end are paired.
                let mut rc = unsafe { ibv_start_poll(cq, &mut attr) };
                if rc != 0 {
                    return Ok(0);
                }
                while rc == 0 {
                    // SAFETY: between start_poll and end_poll the current
                    // entry may be read with the flags the CQ was made with.
                    let (wr_id, status, byte_len, flags, src_qp, ts) = unsafe {
                        (
                            (*cq).wr_id,
                            (*cq).status,
                            ibv_wc_read_byte_len(cq),
                            ibv_wc_read_wc_flags(cq),
                            ibv_wc_read_src_qp(cq),
                            if with_ts {
                                ibv_wc_read_completion_ts(cq)
                            } else {
                                0
                            },
                        )
                    };
                    let imm = if flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
                        // SAFETY: inside the poll; the entry has immediate data.
                        Some(u32::from_be(unsafe { ibv_wc_read_imm_data(cq) }))
                    } else {
                        None
                    };
                    let (timestamp, src) = match ticks_to_ns(ts, clock_khz) {
                        Some(ns) if with_ts => (Instant::from_nanos(ns), TsSource::Nic),
                        _ => (now, TsSource::Poll),
                    };
                    if let Some(c) = Self::complete(
                        q,
                        wr_id,
                        wc_status(status),
                        byte_len as usize,
                        imm,
                        src_qp,
                        timestamp,
                        src,
                    ) {
                        out.push(c);
                        n += 1;
                    }
                    if n >= max {
                        break;
                    }
                    // SAFETY: inside the poll started above.
                    rc = unsafe { ibv_next_poll(cq) };
                }
                // SAFETY: ends the poll started above.
                unsafe { ibv_end_poll(cq) };
            }
            Cq::Plain(cq) => {
                while n < max {
                    // SAFETY: all-zero is a valid ibv_wc.
                    let mut wc: ibv_wc = unsafe { std::mem::zeroed() };
                    // SAFETY: cq is live and `wc` has room for one entry.
                    if unsafe { ibv_poll_cq(cq, 1, &mut wc) } <= 0 {
                        break;
                    }
                    // SAFETY: every bit pattern is a valid u32; the value
                    // is used only when the flag says it is immediate data.
                    let raw_imm = unsafe { wc.imm_data_invalidated_rkey_union.imm_data };
                    let imm = (wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0)
                        .then(|| u32::from_be(raw_imm));
                    if let Some(c) = Self::complete(
                        q,
                        wc.wr_id,
                        wc_status(wc.status),
                        wc.byte_len as usize,
                        imm,
                        wc.src_qp,
                        now,
                        TsSource::Poll,
                    ) {
                        out.push(c);
                        n += 1;
                    }
                }
            }
        }
        Ok(n)
    }

    fn destroy_qp(&mut self, qp: QpHandle) -> Result<(), Error> {
        let q = self.qps.remove(qp).ok_or(UdError::InvalidQp)?;
        Self::destroy(q);
        Ok(())
    }
}

impl Drop for VerbsUd {
    fn drop(&mut self) {
        for (_, q) in self.qps.drain() {
            Self::destroy(q);
        }
        for (_, ah) in self.ahs.drain() {
            // SAFETY: created by us, destroyed once, after its QPs.
            unsafe { ibv_destroy_ah(ah) };
        }
        // SAFETY: pd (if allocated) and ctx are ours; everything in them is
        // gone; each is released once.
        unsafe {
            if !self.pd.is_null() {
                ibv_dealloc_pd(self.pd);
            }
            ibv_close_device(self.ctx);
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn ipv4_gids_are_recognised() {
        let mut raw = [0u8; 16];
        raw[10] = 0xff;
        raw[11] = 0xff;
        raw[12..].copy_from_slice(&[10, 77, 0, 2]);
        assert_eq!(gid_ipv4(&raw), Some(Ipv4Addr::new(10, 77, 0, 2)));
        raw[0] = 0xfe;
        assert_eq!(gid_ipv4(&raw), None);
        assert_eq!(mtu_bytes(ibv_mtu::IBV_MTU_4096), 4096);
    }

    fn v4(index: u8, last: u8, kind: Option<ibv_gid_type>) -> GidEntry {
        let raw = ipv4_gid(Ipv4Addr::new(10, 77, 0, last));
        GidEntry { index, raw, kind }
    }

    #[test]
    fn the_roce_v2_gid_is_picked_by_type_not_order() {
        let mut link_local = v4(0, 0, Some(IBV_GID_TYPE_ROCE_V1));
        link_local.raw = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        // ConnectX: fe80 v1, fe80 v2, then the IPv4 address as v1 and v2.
        let mut fe80_v2 = link_local;
        fe80_v2.index = 1;
        fe80_v2.kind = Some(IBV_GID_TYPE_ROCE_V2);
        let cx = [
            link_local,
            fe80_v2,
            v4(2, 2, Some(IBV_GID_TYPE_ROCE_V1)),
            v4(3, 2, Some(IBV_GID_TYPE_ROCE_V2)),
        ];
        assert_eq!(
            pick_gid(&cx, None, false),
            Ok((3, Ipv4Addr::new(10, 77, 0, 2).into()))
        );
        // Asking for the v1 entry is refused with the reason.
        assert!(matches!(
            pick_gid(&cx, Some(2), false),
            Err(UdError::Unsupported(m)) if m.contains("RoCE v1")
        ));
        assert_eq!(pick_gid(&cx, Some(3), false).unwrap().0, 3);
        assert!(pick_gid(&cx, Some(9), false).is_err());
        // rxe: fe80 (v2), then the IPv4 GID (v2).
        let rxe = [fe80_v2, v4(1, 3, Some(IBV_GID_TYPE_ROCE_V2))];
        assert_eq!(pick_gid(&rxe, None, false).unwrap().0, 1);
        // Only v1: nothing a RoCEv2 peer would see.
        assert!(pick_gid(&[v4(0, 2, Some(IBV_GID_TYPE_ROCE_V1))], None, false).is_err());
        // A library that cannot tell types: the IPv4-mapped entry.
        assert_eq!(pick_gid(&[v4(4, 2, None)], None, false).unwrap().0, 4);
        // IPv6: the global v2 entry before the link-local one, whatever
        // the order; without a global one, the link-local v2 entry.
        let mut global = fe80_v2;
        global.index = 5;
        global.raw = "fd77::2".parse::<Ipv6Addr>().unwrap().octets();
        let mut global_v1 = global;
        global_v1.index = 4;
        global_v1.kind = Some(IBV_GID_TYPE_ROCE_V1);
        let both = [
            link_local,
            fe80_v2,
            v4(3, 2, Some(IBV_GID_TYPE_ROCE_V2)),
            global_v1,
            global,
        ];
        let fd77: IpAddr = "fd77::2".parse().unwrap();
        assert_eq!(pick_gid(&both, None, true), Ok((5, fd77)));
        assert_eq!(pick_gid(&both, None, false).unwrap().0, 3);
        let fe80: IpAddr = "fe80::1".parse().unwrap();
        assert_eq!(pick_gid(&rxe, None, true), Ok((1, fe80)));
        assert!(pick_gid(&[v4(1, 3, Some(IBV_GID_TYPE_ROCE_V2))], None, true).is_err());
        // An index asked for decides the family.
        assert_eq!(pick_gid(&both, Some(5), false), Ok((5, fd77)));
    }

    #[test]
    fn the_grh_names_the_sender_in_either_family() {
        let mut grh = [0u8; 40];
        grh[20] = 0x45;
        grh[29] = 17;
        grh[32..36].copy_from_slice(&[10, 77, 0, 1]);
        assert_eq!(grh_source(&grh), IpAddr::from([10, 77, 0, 1]));
        let mut grh = [0u8; 40];
        grh[0] = 0x60;
        grh[6] = 17;
        grh[8..24].copy_from_slice(&"fd77::1".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(grh_source(&grh), "fd77::1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn nic_ticks_become_time_with_the_device_clock() {
        // One millisecond on a 156.25 MHz ConnectX-4 and a 1 GHz ConnectX-6.
        assert_eq!(ticks_to_ns(156_250, 156_250), Some(1_000_000));
        assert_eq!(ticks_to_ns(1_000_000, 1_000_000), Some(1_000_000));
        // Large counters do not overflow.
        assert_eq!(ticks_to_ns(u64::MAX / 2, 1_000_000), Some(u64::MAX / 2));
        // An unknown clock gives no time at all, not ticks taken as ns.
        assert_eq!(ticks_to_ns(123, 0), None);
    }
}
