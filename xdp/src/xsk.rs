//! One AF_XDP socket on one queue of an interface, with a UMEM of its own:
//! half the frames lent to the kernel for receive (the fill ring), half
//! kept for transmit. Frames are copied out on receive and in on
//! transmit, so the UMEM never leaves this type.

use std::ffi::CString;
use std::num::NonZeroU32;
use std::os::fd::{AsFd, BorrowedFd};
use std::ptr::NonNull;

use xdpilone::xdp::XdpDesc;
use xdpilone::{DeviceQueue, IfInfo, RingRx, RingTx, Socket, SocketConfig, Umem, UmemConfig};

use crate::XdpError;

/// How an [`Xsk`] is laid out.
#[derive(Debug, Clone)]
pub struct XskConfig {
    /// The interface.
    pub iface: String,
    /// Its receive queue (and transmit queue) to bind.
    pub queue: u32,
    /// Largest frame (Ethernet header and payload) carried.
    pub max_frame: usize,
    /// Descriptors in each ring (a power of two); the UMEM has twice as
    /// many frames.
    pub ring: u32,
}

impl XskConfig {
    /// `iface`, queue `queue`, frames up to `max_frame` bytes, 2048-entry
    /// rings.
    pub fn new(iface: &str, queue: u32, max_frame: usize) -> Self {
        XskConfig {
            iface: iface.to_string(),
            queue,
            max_frame,
            ring: 2048,
        }
    }
}

/// `sendto` calls at most per transmit burst (see [`Xsk::transmit`]): 64
/// batches of 32 frames cover a full ring of 2048.
const MAX_KICKS: usize = 64;

/// The kernel's room before a received frame in its UMEM frame.
const XDP_PACKET_HEADROOM: usize = 256;

/// The socket's counters: the kernel's (`XDP_STATISTICS`) and this side's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XskStats {
    /// Frames the kernel dropped for this socket (no room in the receive
    /// ring, or no fill-ring frame).
    pub rx_dropped: u64,
    /// Received frames the kernel found no room for in the receive ring.
    pub rx_ring_full: u64,
    /// Times the kernel found the fill ring empty.
    pub rx_fill_ring_empty: u64,
    /// Transmit descriptors the kernel refused.
    pub tx_invalid: u64,
    /// Wake-ups sent to the kernel for transmit (`sendto`).
    pub tx_wakeups: u64,
}

/// What one [`Xsk::transmit`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sent {
    /// Frames queued for the kernel.
    pub frames: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Frames too long for a UMEM frame: dropped.
    pub oversize: usize,
}

/// Anonymous, page-aligned memory for the UMEM, unmapped on drop.
struct Area {
    ptr: NonNull<u8>,
    len: usize,
}

impl Area {
    fn new(iface: &str, len: usize) -> Result<Self, XdpError> {
        // SAFETY: an anonymous private mapping with no address hint: it
        // aliases nothing; the result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(XdpError::os(
                iface,
                "UMEM memory",
                std::io::Error::last_os_error(),
            ));
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| {
            XdpError::os(
                iface,
                "UMEM memory",
                std::io::Error::other("mmap gave NULL"),
            )
        })?;
        Ok(Area { ptr, len })
    }

    fn as_slice_ptr(&self) -> NonNull<[u8]> {
        NonNull::slice_from_raw_parts(self.ptr, self.len)
    }

    /// The bytes at `off..off + len`, bounds-checked.
    fn bytes(&self, off: u64, len: usize) -> Option<&[u8]> {
        let off = usize::try_from(off).ok()?;
        if off.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: in bounds (checked above) of a live mapping this type
        // owns. The kernel writes a frame only while it holds it (in the
        // fill ring); this range is one the receive ring handed back, so
        // the kernel does not write it until it is filled again, which
        // happens after this borrow ends (`&self` against `&mut self`).
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off), len) })
    }

    /// The bytes at `off..off + len` to write, bounds-checked.
    fn bytes_mut(&mut self, off: u64, len: usize) -> Option<&mut [u8]> {
        let off = usize::try_from(off).ok()?;
        if off.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: in bounds of a live mapping this type owns; the frame is
        // one of ours for transmit, not in any ring, so neither the kernel
        // nor another borrow touches it (`&mut self`).
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off), len) })
    }
}

impl Drop for Area {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; the sockets and
        // rings that pointed into it are dropped before it (field order of
        // `Xsk`).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// An AF_XDP socket bound to one queue of an interface.
pub struct Xsk {
    // Fields drop in order: the rings and sockets before the memory.
    rx: RingRx,
    tx: RingTx,
    device: DeviceQueue,
    _user: xdpilone::User,
    _sock: Socket,
    _umem: Umem,
    /// Frames free for transmit (UMEM offsets).
    free: Vec<u64>,
    /// Received frames copied out, to go back to the fill ring.
    refill: Vec<u64>,
    /// A transmit burst's descriptors (kept to spare an allocation a burst).
    descs: Vec<XdpDesc>,
    frame_size: u32,
    zero_copy: bool,
    iface: String,
    queue: u32,
    tx_wakeups: u64,
    area: Area,
}

// SAFETY: `Xsk` owns its UMEM mapping and its sockets outright; the raw
// pointers inside (the mapping, xdpilone's UMEM handle) are reached only
// through `&self`/`&mut self`, so moving the whole to another thread moves
// every access with it.
unsafe impl Send for Xsk {}

impl core::fmt::Debug for Xsk {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Xsk")
            .field("iface", &self.iface)
            .field("queue", &self.queue)
            .field("zero_copy", &self.zero_copy)
            .finish()
    }
}

fn errno(iface: &str, what: &'static str, e: xdpilone::Errno) -> XdpError {
    XdpError::os(
        iface,
        what,
        std::io::Error::from_raw_os_error(e.get_raw().abs()),
    )
}

impl Xsk {
    /// Open a socket on `cfg.iface`'s queue `cfg.queue`: zero-copy where
    /// the driver has it, copy mode elsewhere. Frames reach it once an XDP
    /// program redirects them ([`crate::Steering::register`]).
    pub fn open(cfg: &XskConfig) -> Result<Self, XdpError> {
        let iface = cfg.iface.as_str();
        crate::if_index(iface)?;
        let queues = crate::rx_queues(iface);
        if cfg.queue >= queues {
            return Err(XdpError::NoSuchQueue {
                iface: iface.to_string(),
                queue: cfg.queue,
            });
        }
        let frame_size: u32 = if cfg.max_frame + XDP_PACKET_HEADROOM <= 2048 {
            2048
        } else {
            4096
        };
        let max = frame_size as usize - XDP_PACKET_HEADROOM;
        if cfg.max_frame > max {
            return Err(XdpError::Mtu {
                mtu: cfg.max_frame - 14,
                max: max - 14,
            });
        }
        let ring = cfg.ring.next_power_of_two().max(64);
        let frames = ring * 2;
        let area = Area::new(iface, frames as usize * frame_size as usize)?;
        let ucfg = UmemConfig {
            fill_size: ring,
            complete_size: ring,
            frame_size,
            headroom: 0,
            flags: 0,
        };
        // SAFETY: `area` is a page-aligned mapping of exactly the length
        // given, owned by the `Xsk` built below, which keeps it mapped
        // until after the UMEM, its sockets and rings are dropped (field
        // order).
        let umem = unsafe { Umem::new(ucfg, area.as_slice_ptr()) }
            .map_err(|e| errno(iface, "UMEM registration", e))?;
        let name = CString::new(iface).map_err(|_| XdpError::NoSuchInterface(iface.into()))?;
        let mut info = IfInfo::invalid();
        info.from_name(&name)
            .map_err(|e| errno(iface, "interface", e))?;
        info.set_queue(cfg.queue);
        let sock = Socket::with_shared(&info, &umem).map_err(|e| errno(iface, "socket", e))?;
        let mut device = umem
            .fq_cq(&sock)
            .map_err(|e| errno(iface, "fill and completion rings", e))?;
        let user = umem
            .rx_tx(
                &sock,
                &SocketConfig {
                    rx_size: NonZeroU32::new(ring),
                    tx_size: NonZeroU32::new(ring),
                    bind_flags: SocketConfig::XDP_BIND_NEED_WAKEUP,
                },
            )
            .map_err(|e| errno(iface, "receive and transmit rings", e))?;
        let rx = user.map_rx().map_err(|e| errno(iface, "receive ring", e))?;
        let tx = user
            .map_tx()
            .map_err(|e| errno(iface, "transmit ring", e))?;
        // Half the frames to the kernel for receive before binding.
        let receive: Vec<u64> = (0..ring).map(|i| u64::from(i * frame_size)).collect();
        let free: Vec<u64> = (ring..frames).map(|i| u64::from(i * frame_size)).collect();
        {
            let mut fill = device.fill(ring);
            let n = fill.insert(receive.iter().copied());
            fill.commit();
            debug_assert_eq!(n, ring);
        }
        umem.bind(&user).map_err(|e| match e.get_raw().abs() {
            libc::EBUSY => XdpError::QueueBusy {
                iface: iface.to_string(),
                queue: cfg.queue,
            },
            _ => errno(iface, "bind", e),
        })?;
        let zero_copy = zero_copy(rx.as_raw_fd());
        Ok(Xsk {
            rx,
            tx,
            device,
            _user: user,
            _sock: sock,
            _umem: umem,
            free,
            refill: Vec::with_capacity(ring as usize),
            frame_size,
            zero_copy,
            iface: iface.to_string(),
            queue: cfg.queue,
            descs: Vec::with_capacity(ring as usize),
            tx_wakeups: 0,
            area,
        })
    }

    /// Whether the kernel runs this socket zero-copy (the driver writes
    /// into the UMEM) rather than copying frames in and out.
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// The socket's descriptor: readable when frames wait in the receive
    /// ring; the one [`crate::Steering::register`] puts in the map.
    pub fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor belongs to `self.sock` (shared with the
        // rings), open for as long as `self` lives, which bounds the borrow.
        unsafe { BorrowedFd::borrow_raw(self.rx.as_raw_fd()) }
    }

    /// Hand up to `max` received frames to `f`, then give their UMEM frames
    /// back to the kernel. Returns how many were handed.
    pub fn receive(&mut self, max: usize, mut f: impl FnMut(&[u8])) -> usize {
        let mask = !(u64::from(self.frame_size) - 1);
        let mut n = 0;
        // A look at the ring may see only part of what is there (the
        // kernel's producer index is read again only when the cached view
        // is used up): look until `max` or nothing more.
        let mut seen = 0;
        while seen < max {
            let mut rx = self.rx.receive((max - seen).min(u32::MAX as usize) as u32);
            let before = seen;
            while let Some(XdpDesc { addr, len, .. }) = rx.read() {
                seen += 1;
                if let Some(frame) = self.area.bytes(addr, len as usize) {
                    f(frame);
                    n += 1;
                }
                self.refill.push(addr & mask);
            }
            rx.release();
            if seen == before {
                break;
            }
        }
        while !self.refill.is_empty() {
            let mut fill = self.device.fill(self.refill.len() as u32);
            let put = fill.insert(self.refill.iter().copied()) as usize;
            fill.commit();
            if put == 0 {
                break;
            }
            self.refill.drain(..put);
        }
        if self.device.needs_wakeup() {
            // The kernel ran out of fill frames and waits to be told there
            // are more (zero-copy drivers).
            self.device.wake();
        }
        n
    }

    /// Take back the frames the kernel has sent (as for reservations, a
    /// look may see only part of what is there: look until nothing is).
    fn reap(&mut self) {
        loop {
            let mut done = self.device.complete(u32::MAX);
            let before = self.free.len();
            while let Some(addr) = done.read() {
                self.free.push(addr);
            }
            done.release();
            if self.free.len() == before {
                return;
            }
        }
    }

    /// Queue frames from the front of `frames` for transmit, removing those
    /// queued (and those too long for a UMEM frame, dropped), and tell the
    /// kernel. Frames left in `frames` found no free UMEM frame.
    pub fn transmit<B: AsRef<[u8]>>(&mut self, frames: &mut Vec<B>) -> Sent {
        self.reap();
        let max = self.frame_size as usize;
        let mut sent = Sent::default();
        let mut taken = 0;
        self.descs.clear();
        for frame in frames.iter() {
            let bytes = frame.as_ref();
            if bytes.len() > max {
                sent.oversize += 1;
                taken += 1;
                continue;
            }
            let Some(addr) = self.free.pop() else { break };
            let Some(dst) = self.area.bytes_mut(addr, bytes.len()) else {
                self.free.push(addr);
                break;
            };
            dst.copy_from_slice(bytes);
            self.descs.push(XdpDesc {
                addr,
                len: bytes.len() as u32,
                options: 0,
            });
            sent.bytes += bytes.len() as u64;
            taken += 1;
        }
        // The ring has a slot for every transmit frame of the UMEM, so one
        // is free for each frame taken from `free`; but a reservation may
        // see fewer (it reads the kernel's consumer index only when its
        // cached view is used up): ask again until all are in.
        while sent.frames < self.descs.len() {
            let mut tx = self.tx.transmit((self.descs.len() - sent.frames) as u32);
            let n = tx.insert(self.descs[sent.frames..].iter().copied()) as usize;
            tx.commit();
            if n == 0 {
                break;
            }
            sent.frames += n;
        }
        debug_assert_eq!(
            sent.frames,
            self.descs.len(),
            "a transmit frame without a ring slot"
        );
        frames.drain(..taken);
        self.kick();
        sent
    }

    /// Have the kernel send what waits in the transmit ring. In copy mode
    /// one `sendto` sends at most a small batch (32 frames in Linux 6.x),
    /// so it is repeated while descriptors wait, a few times at most: a
    /// frame left in the ring would wait for the next burst.
    fn kick(&mut self) {
        for _ in 0..MAX_KICKS {
            if self.tx.pending() == 0 || !self.tx.needs_wakeup() {
                return;
            }
            self.tx.wake();
            self.tx_wakeups += 1;
        }
    }

    /// The socket's counters.
    pub fn stats(&self) -> XskStats {
        let k = self.device.statistics_v2().ok();
        XskStats {
            rx_dropped: k.as_ref().map_or(0, |s| s.rx_dropped),
            rx_ring_full: k.as_ref().map_or(0, |s| s.rx_ring_full),
            rx_fill_ring_empty: k.as_ref().map_or(0, |s| s.rx_fill_ring_empty_descs),
            tx_invalid: k.as_ref().map_or(0, |s| s.tx_invalid_descs),
            tx_wakeups: self.tx_wakeups,
        }
    }
}

impl AsFd for Xsk {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd()
    }
}

/// Whether the socket `fd` runs zero-copy (`XDP_OPTIONS`).
fn zero_copy(fd: libc::c_int) -> bool {
    const SOL_XDP: libc::c_int = 283;
    const XDP_OPTIONS: libc::c_int = 8;
    const XDP_OPTIONS_ZEROCOPY: u32 = 1;
    let mut flags: u32 = 0;
    let mut len = size_of::<u32>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `flags`, which
    // lives across the call; `len` is its size.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            SOL_XDP,
            XDP_OPTIONS,
            (&raw mut flags).cast(),
            &raw mut len,
        )
    };
    rc == 0 && flags & XDP_OPTIONS_ZEROCOPY != 0
}
