//! The runtime's few start-up and first-occurrence warnings (an
//! interface's offloads, partial checksums, an address conflict, where the
//! metrics endpoint listens): things the user must act on, whatever the
//! program's log settings. The library never prints them itself: each is
//! a `tracing` warning (target `ustack::notice`), or, once a program has
//! set a sink with [`set_notice_sink`], a call to that sink (a binary
//! prints `ustack: MESSAGE` on its stderr).

use std::sync::OnceLock;

static SINK: OnceLock<fn(&str)> = OnceLock::new();

/// Send the runtime's notices to `sink` instead of `tracing` (once per
/// process; false when a sink was set already).
pub fn set_notice_sink(sink: fn(&str)) -> bool {
    SINK.set(sink).is_ok()
}

/// Say something the user must act on (see the module's doc).
pub(crate) fn notice(msg: &str) {
    match SINK.get() {
        Some(sink) => sink(msg),
        None => tracing::warn!(target: "ustack::notice", "{msg}"),
    }
}

/// Once per stack: a [`notice`] when another host turns out to use the
/// stack's address after start (RFC 5227 conflict: the two reset each
/// other's connections). Looked at when telemetry is due, not per packet.
pub(crate) fn tell_conflict(stack: &ustack::Stack, told: &mut bool) {
    if *told {
        return;
    }
    if let Some(mac) = stack.addr_ref().conflict() {
        *told = true;
        notice(&format!(
            "{} is also used by {mac} on this link (address conflict, RFC 5227): \
             connections may be reset; counted as arp_conflict",
            stack.ip()
        ));
    } else if let Some((ip, mac)) = stack.addr_ref().conflict6() {
        *told = true;
        notice(&format!(
            "{ip} is also used by {mac} on this link (address conflict, RFC 4862): \
             connections may be reset; counted as ndp_conflict"
        ));
    }
}
