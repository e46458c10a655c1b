//! Backends that need system libraries, each behind its cargo feature.

pub mod offload;
#[cfg(feature = "pcap")]
pub mod pcap;
#[cfg(feature = "xdp")]
pub mod xdp;

/// Wait at most `timeout` for `fd` (a port's receive descriptor) to be
/// readable. An error state (the interface went away) is not a wake-up:
/// `false`, and the caller sleeps; the next receive reports it.
#[cfg(any(feature = "pcap", feature = "xdp"))]
pub(crate) fn wait_readable(fd: std::os::fd::BorrowedFd<'_>, timeout: std::time::Duration) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let ts = Timespec {
        tv_sec: timeout.as_secs().try_into().unwrap_or(i64::MAX),
        tv_nsec: timeout.subsec_nanos().into(),
    };
    match rustix::event::poll(&mut fds, Some(&ts)) {
        Ok(_) => !fds[0]
            .revents()
            .intersects(PollFlags::ERR | PollFlags::HUP | PollFlags::NVAL),
        Err(_) => false,
    }
}

/// Why an interface cannot carry frames (see [`link_up`]).
#[cfg(any(feature = "pcap", feature = "xdp"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinkDown {
    /// No interface has the name (any more).
    Gone,
    /// It exists and is administratively down.
    Down,
}

/// Whether `iface` exists and is administratively up (IFF_UP in sysfs):
/// libpcap and AF_XDP do not report an interface going down, they just
/// stop delivering.
#[cfg(any(feature = "pcap", feature = "xdp"))]
pub(crate) fn link_up(iface: &str) -> Result<(), LinkDown> {
    let flags = std::fs::read_to_string(format!("/sys/class/net/{iface}/flags"))
        .map_err(|_| LinkDown::Gone)?;
    let flags = u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).unwrap_or(1);
    if flags & 1 == 0 {
        return Err(LinkDown::Down);
    }
    Ok(())
}
