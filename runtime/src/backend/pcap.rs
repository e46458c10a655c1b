//! The libpcap backend: the stack takes its own MAC and IP on an existing
//! interface (laptops, any NIC), and [`Captured`]: any device, with every
//! frame it sends and receives written to a pcap file Wireshark opens.
//!
//! Receive is batched (up to a burst per call, non-blocking); transmit is
//! one `pcap_sendpacket` per frame. The capture sees inbound frames only,
//! through a BPF filter for our MAC, broadcast and multicast, so the stack
//! neither sees its own frames nor copies unrelated traffic.

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::time::{SystemTime, UNIX_EPOCH};

use ::pcap::{Active, Capture, Direction, Linktype, Packet, PacketHeader, Savefile};
use smoltcp::wire::EthernetAddress;

use ustack::phy::device::{Device, DeviceCaps, PortStats};
use ustack::phy::pool::{PacketBuf, Pool, PoolStats, SlabBuf, SlabPool};
use ustack::time::Instant;

use super::offload::{self, OffloadGuard, OffloadOutcome};

/// Why a pcap port could not be opened or stopped working.
#[derive(Debug, thiserror::Error)]
pub enum PcapError {
    /// No interface has this name (or it disappeared while running).
    #[error("no interface named '{0}' (see `ip link`)")]
    NoSuchInterface(String),
    /// Opening a capture on the interface needs `CAP_NET_RAW` and
    /// `CAP_NET_ADMIN` (or root).
    #[error(
        "no permission to capture on '{0}': run as root or give the binary CAP_NET_RAW and CAP_NET_ADMIN"
    )]
    Permission(String),
    /// The interface exists but is down (at open, or it went down while running).
    #[error("interface '{0}' is down")]
    Down(String),
    /// Any other libpcap or capture-file failure.
    #[error("pcap on '{iface}': {msg}")]
    Other {
        /// The interface (or capture file) concerned.
        iface: String,
        /// libpcap's message.
        msg: String,
    },
}

/// Buffers in a pcap port's pool.
const POOL_BUFS: usize = 4096;

/// A network interface driven through libpcap.
pub struct PcapPort {
    iface: String,
    cap: Capture<Active>,
    pool: SlabPool,
    stats: PortStats,
    mtu: usize,
    failed: Option<PcapError>,
    next_link_check: Instant,
    /// Frames the kernel refused for a moment (ENOBUFS, EAGAIN), sent
    /// first on the next burst.
    backlog: VecDeque<SlabBuf>,
    /// Frames the kernel dropped on the capture's ring (pcap_stats, read
    /// once a second).
    kernel_drops: u64,
    /// Complete partial checksums (`--accept-partial-checksum`) instead of
    /// leaving them to fail.
    accept_partial: bool,
    /// The interface's receive offloads, turned off for the run.
    _offloads: Option<OffloadGuard>,
    /// Whether the partial-checksum notice was given.
    told_partial: bool,
}

/// Frames held for a retry at most; beyond it they are dropped (counted).
const BACKLOG: usize = 256;

/// How a failed `pcap_sendpacket` is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SendFailure {
    /// The socket buffer is full for now: keep the frame, send it later.
    Transient,
    /// This frame cannot go (too long, refused): drop it, count it.
    Frame,
}

/// Classify a send error by libpcap's message (it carries strerror's text).
fn send_failure(msg: &str) -> SendFailure {
    let m = msg.to_lowercase();
    if m.contains("no buffer space")
        || m.contains("temporarily unavailable")
        || m.contains("interrupted system call")
        || m.contains("would block")
    {
        SendFailure::Transient
    } else {
        SendFailure::Frame
    }
}

/// How often the interface's state is looked at (libpcap does not report an
/// interface going down; it just stops delivering).
const LINK_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether `iface` exists and is up, as a [`PcapError`].
fn link_up(iface: &str) -> Result<(), PcapError> {
    super::link_up(iface).map_err(|e| match e {
        super::LinkDown::Gone => PcapError::NoSuchInterface(iface.to_string()),
        super::LinkDown::Down => PcapError::Down(iface.to_string()),
    })
}

impl core::fmt::Debug for PcapPort {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PcapPort")
            .field("iface", &self.iface)
            .field("stats", &self.stats)
            .finish()
    }
}

fn classify(iface: &str, e: ::pcap::Error) -> PcapError {
    let msg = e.to_string();
    let lower = msg.to_lowercase();
    if lower.contains("permission") || lower.contains("not permitted") {
        PcapError::Permission(iface.to_string())
    } else if lower.contains("no such device") || lower.contains("doesn't exist") {
        PcapError::NoSuchInterface(iface.to_string())
    } else if lower.contains("not up")
        || lower.contains("network is down")
        || lower.contains("went down")
    {
        PcapError::Down(iface.to_string())
    } else {
        PcapError::Other {
            iface: iface.to_string(),
            msg,
        }
    }
}

impl PcapPort {
    /// Open `iface` for the stack whose MAC is `mac`, with the kernel's
    /// receive offloads turned off for the run where the process may
    /// (see [`offload`]); partial checksums from a local sender are
    /// completed when `accept_partial`.
    pub fn open_with(
        iface: &str,
        mac: EthernetAddress,
        mtu: usize,
        accept_partial: bool,
    ) -> Result<Self, PcapError> {
        let mut port = Self::open(iface, mac, mtu)?;
        port.accept_partial = accept_partial;
        let (guard, outcome) = OffloadGuard::engage(iface);
        match outcome {
            OffloadOutcome::AlreadyOff => {}
            OffloadOutcome::TurnedOff(names) => tracing::info!(
                "pcap on {iface}: turned {} off for the run (restored at exit)",
                names.join(", ")
            ),
            OffloadOutcome::LeftOn { command, why } => crate::notice::notice(&format!(
                "pcap on {iface}: receive offloads are on and could not be turned off ({why}); \
                 frames merged by the kernel are cut back into segments, but run `{command}` \
                 (needs CAP_NET_ADMIN) for full speed"
            )),
        }
        port._offloads = guard;
        Ok(port)
    }

    /// Open `iface` for the stack whose MAC is `mac`, its offloads as they
    /// are.
    pub fn open(iface: &str, mac: EthernetAddress, mtu: usize) -> Result<Self, PcapError> {
        let known = ::pcap::Device::list().map_err(|e| classify(iface, e))?;
        if !known.iter().any(|d| d.name == iface) {
            return Err(PcapError::NoSuchInterface(iface.to_string()));
        }
        link_up(iface)?;
        let cap = Capture::from_device(iface)
            .map_err(|e| classify(iface, e))?
            .promisc(true)
            .immediate_mode(true)
            .precision(if STAMP_UNIT_NS == 1 {
                ::pcap::Precision::Nano
            } else {
                ::pcap::Precision::Micro
            })
            .snaplen(65_535)
            .buffer_size(16 << 20)
            .timeout(1)
            .open()
            .map_err(|e| classify(iface, e))?;
        cap.direction(Direction::In)
            .map_err(|e| classify(iface, e))?;
        let mut cap = cap.setnonblock().map_err(|e| classify(iface, e))?;
        cap.filter(
            &format!("ether dst {mac} or ether broadcast or ether multicast"),
            true,
        )
        .map_err(|e| classify(iface, e))?;
        Ok(PcapPort {
            iface: iface.to_string(),
            cap,
            pool: SlabPool::new(format!("pcap-{iface}"), POOL_BUFS, (mtu + 14).max(2048)),
            stats: PortStats::default(),
            mtu,
            failed: None,
            next_link_check: Instant::ZERO,
            backlog: VecDeque::new(),
            kernel_drops: 0,
            accept_partial: false,
            _offloads: None,
            told_partial: false,
        })
    }

    /// The interface's name.
    pub fn iface(&self) -> &str {
        &self.iface
    }
}

/// What one unit of `tv_usec` in libpcap's stamps is, in nanoseconds: on
/// Linux the capture is opened with nanosecond stamps (TPACKET has them);
/// elsewhere libpcap's default, microseconds, is kept (asking for
/// nanoseconds where they are not offered fails silently in the `pcap`
/// crate, and microseconds read as nanoseconds would misdate frames).
#[cfg(target_os = "linux")]
const STAMP_UNIT_NS: u32 = 1;
#[cfg(not(target_os = "linux"))]
const STAMP_UNIT_NS: u32 = 1_000;

/// When a frame libpcap stamped `hdr.ts` (the kernel's receive time, wall
/// clock, in [`STAMP_UNIT_NS`]) arrived, on the loop's clock: how long
/// before the wall clock's reading in `wall` it came, taken from the loop
/// clock's reading beside it (the pair is read once per burst). Never
/// after `now`, and `now` itself when the age is over [`MAX_STAMP_AGE`]:
/// a wall clock stepped either way cannot date a frame after its poll
/// or far before it.
fn arrival(
    now: Instant,
    wall: &mut Option<(std::time::Duration, Instant)>,
    hdr: &PacketHeader,
) -> Instant {
    // The wall clock and the loop's clock read together, so the pair
    // maps one onto the other (`now` itself was read earlier, before the
    // burst began).
    let (wall, at) = *wall.get_or_insert_with(|| {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        (wall, crate::clock::Clock::new().now())
    });
    let (Ok(secs), Ok(frac)) = (u64::try_from(hdr.ts.tv_sec), u32::try_from(hdr.ts.tv_usec)) else {
        return now;
    };
    let nanos = frac.saturating_mul(STAMP_UNIT_NS);
    if nanos >= 1_000_000_000 {
        return now;
    }
    let stamped = std::time::Duration::new(secs, nanos);
    match wall.saturating_sub(stamped) {
        age if age <= MAX_STAMP_AGE => (at - age).min(now),
        _ => now,
    }
}

/// The oldest a frame's libpcap stamp may be when read and still be
/// trusted as its arrival time (the loop reads the ring far more often).
const MAX_STAMP_AGE: std::time::Duration = std::time::Duration::from_secs(1);

impl Device for PcapPort {
    type Buf = SlabBuf;

    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            mtu: self.mtu,
            busy_poll_only: false,
            offloads: Default::default(),
            rx_timestamps: true,
        }
    }

    fn rx_burst(&mut self, now: Instant, out: &mut Vec<SlabBuf>, max: usize) -> usize {
        if now >= self.next_link_check && self.failed.is_none() {
            self.next_link_check = now + LINK_CHECK;
            if let Err(e) = link_up(&self.iface) {
                self.failed = Some(e);
            }
            // Frames the kernel dropped before libpcap read them (its ring
            // was full): they count as missed, as a NIC's imissed does.
            if let Ok(st) = self.cap.stats() {
                self.kernel_drops = u64::from(st.dropped) + u64::from(st.if_dropped);
            }
        }
        let mut n = 0;
        // The wall clock when this burst began, read at the first frame:
        // libpcap stamps frames on it (see `arrival`).
        let mut wall = None;
        while n < max && self.failed.is_none() {
            let pkt = match self.cap.next_packet() {
                Ok(p) => p,
                Err(::pcap::Error::TimeoutExpired | ::pcap::Error::NoMorePackets) => break,
                Err(e) => {
                    self.failed = Some(classify(&self.iface, e));
                    break;
                }
            };
            let at = arrival(now, &mut wall, pkt.header);
            let (pushed, partial_left) = offload::deliver(
                pkt.data,
                at,
                self.mtu,
                self.accept_partial,
                &mut self.pool,
                &mut self.stats,
                out,
            );
            n += pushed;
            if partial_left && !std::mem::replace(&mut self.told_partial, true) {
                crate::notice::notice(&offload::partial_checksum_notice("pcap", &self.iface));
            }
        }
        n
    }

    /// Sends the frames a transient refusal held back first, then `pkts`.
    /// A transient refusal (full socket buffer) keeps the frame and the
    /// ones after it for the next burst (`tx_retries`); another error drops
    /// the frame (`tx_errors`), and ends the run only when the interface is
    /// gone or down (checked here and once a second by `rx_burst`).
    fn tx_burst(&mut self, _: Instant, pkts: &mut Vec<SlabBuf>) -> usize {
        let mut sent = 0;
        let mut frames = std::mem::take(&mut self.backlog)
            .into_iter()
            .chain(pkts.drain(..));
        while let Some(buf) = frames.next() {
            match self.cap.sendpacket(buf.as_ref()) {
                Ok(()) => {
                    self.stats.tx_packets += 1;
                    self.stats.tx_bytes += buf.len() as u64;
                    sent += 1;
                }
                Err(e) => match send_failure(&e.to_string()) {
                    SendFailure::Transient => {
                        // Keep this frame and the rest, in order, for later.
                        for b in std::iter::once(buf).chain(frames.by_ref()) {
                            if self.backlog.len() < BACKLOG {
                                self.stats.tx_retries += 1;
                                self.backlog.push_back(b);
                            } else {
                                self.stats.tx_errors += 1;
                            }
                        }
                        break;
                    }
                    SendFailure::Frame => {
                        self.stats.tx_errors += 1;
                        if let Err(gone) = link_up(&self.iface) {
                            self.failed.get_or_insert(gone);
                        } else {
                            tracing::debug!("pcap on {}: frame dropped: {e}", self.iface);
                        }
                    }
                },
            }
        }
        sent
    }

    fn alloc_tx(&mut self) -> Option<SlabBuf> {
        self.pool.alloc()
    }

    fn port_stats(&self) -> PortStats {
        let mut s = self.stats.clone();
        s.rx_missed += self.kernel_drops;
        s
    }

    fn pool_stats(&self, out: &mut Vec<PoolStats>) {
        out.push(self.pool.stats());
    }

    fn failure(&self) -> Option<String> {
        self.failed.as_ref().map(ToString::to_string)
    }

    fn wait_rx(&mut self, timeout: std::time::Duration) -> bool {
        if !self.backlog.is_empty() {
            return true;
        }
        // libpcap's descriptor (the packet socket) is readable once a frame
        // is in its ring.
        super::wait_readable(self.cap.as_fd(), timeout)
    }

    fn rx_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        // Frames held back are sent on the next iteration, not waited for.
        self.backlog.is_empty().then(|| self.cap.as_fd())
    }
}

/// A device whose frames, both ways, are also written to a pcap file.
pub struct Captured<D: Device> {
    inner: D,
    file: Savefile,
}

impl<D: Device> core::fmt::Debug for Captured<D> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Captured").finish_non_exhaustive()
    }
}

impl<D: Device> Captured<D> {
    /// Write every frame of `inner` to `path` (created or truncated).
    pub fn new(inner: D, path: &std::path::Path) -> Result<Self, PcapError> {
        let what = path.display().to_string();
        let dead = Capture::dead(Linktype::ETHERNET).map_err(|e| classify(&what, e))?;
        let file = dead.savefile(path).map_err(|e| classify(&what, e))?;
        Ok(Captured { inner, file })
    }

    fn write(&mut self, frame: &[u8]) {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let header = PacketHeader {
            ts: libc::timeval {
                tv_sec: t.as_secs() as libc::time_t,
                tv_usec: t.subsec_micros() as libc::suseconds_t,
            },
            caplen: frame.len() as u32,
            len: frame.len() as u32,
        };
        self.file.write(&Packet::new(&header, frame));
    }

    /// Flush buffered records to the file.
    pub fn flush(&mut self) {
        let _ = self.file.flush();
    }
}

impl<D: Device> Device for Captured<D> {
    type Buf = D::Buf;

    fn caps(&self) -> DeviceCaps {
        self.inner.caps()
    }

    fn rx_burst(&mut self, now: Instant, out: &mut Vec<D::Buf>, max: usize) -> usize {
        let start = out.len();
        let n = self.inner.rx_burst(now, out, max);
        for buf in &out[start..] {
            self.write(buf.as_ref());
        }
        n
    }

    fn tx_burst(&mut self, now: Instant, pkts: &mut Vec<D::Buf>) -> usize {
        for p in pkts.iter() {
            self.write(p.as_ref());
        }
        self.inner.tx_burst(now, pkts)
    }

    fn alloc_tx(&mut self) -> Option<D::Buf> {
        self.inner.alloc_tx()
    }

    fn alloc_tx_len(&mut self, len: usize) -> Option<D::Buf> {
        self.inner.alloc_tx_len(len)
    }

    fn port_stats(&self) -> PortStats {
        self.inner.port_stats()
    }

    fn pool_stats(&self, out: &mut Vec<PoolStats>) {
        self.inner.pool_stats(out);
    }

    fn poll_at(&self) -> Option<Instant> {
        self.inner.poll_at()
    }

    fn failure(&self) -> Option<String> {
        self.inner.failure()
    }

    fn wait_rx(&mut self, timeout: std::time::Duration) -> bool {
        self.inner.wait_rx(timeout)
    }

    fn rx_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.inner.rx_fd()
    }
}

impl<D: Device> Drop for Captured<D> {
    fn drop(&mut self) {
        let _ = self.file.flush();
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn transient_send_errors_are_told_apart() {
        for m in [
            "send: No buffer space available",
            "send: Resource temporarily unavailable",
            "send: Interrupted system call",
        ] {
            assert_eq!(send_failure(m), SendFailure::Transient, "{m}");
        }
        for m in [
            "send: Message too long",
            "send: Network is down",
            "send: No such device",
        ] {
            assert_eq!(send_failure(m), SendFailure::Frame, "{m}");
        }
    }

    #[test]
    fn kernel_stamps_become_loop_times_never_after_the_poll() {
        use std::time::Duration;
        let hdr = |secs: i64, micros: i64| PacketHeader {
            ts: libc::timeval {
                tv_sec: secs as _,
                tv_usec: micros as _,
            },
            caplen: 60,
            len: 60,
        };
        let now = Instant::from_secs(50);
        // The clocks were read together a little after `now`.
        let mut wall = Some((
            Duration::new(1_000, 500_000_000),
            now + Duration::from_micros(3),
        ));
        let unit = i64::from(STAMP_UNIT_NS);
        // 250 µs before the wall clock read: 247 µs before `now`.
        assert_eq!(
            arrival(now, &mut wall, &hdr(1_000, 499_750_000 / unit)),
            now - Duration::from_micros(247)
        );
        // 1 µs before the read, after `now`: `now`.
        assert_eq!(
            arrival(now, &mut wall, &hdr(1_000, 499_999_000 / unit)),
            now
        );
        // Stamped after the read (a clock stepped back): `now`.
        assert_eq!(
            arrival(now, &mut wall, &hdr(1_000, 600_000_000 / unit)),
            now
        );
        // A fraction of a second past its end: not a stamp.
        assert_eq!(
            arrival(now, &mut wall, &hdr(1_000, 1_000_000_000 / unit)),
            now
        );
        // Older than a second (a clock stepped forward): not trusted.
        assert_eq!(arrival(now, &mut wall, &hdr(998, 0)), now);
        // A stamp libpcap could not have made.
        assert_eq!(arrival(now, &mut wall, &hdr(-1, 0)), now);
        // The wall clock is read once, at the first frame of a burst.
        let mut unread = None;
        let at = arrival(Instant::FAR_FUTURE, &mut unread, &hdr(0, 0));
        assert_eq!(at, Instant::FAR_FUTURE, "a 1970 stamp is too old");
        assert!(unread.is_some());
    }
}
