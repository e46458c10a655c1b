//! Resource limits: a program's `RLIMIT_AS` leaves room for the stack.
//!
//! The stack's threads in a process on it (its loop, telemetry, the
//! server of a shared stack, and their copies in a forked child's
//! address space) each have a C library malloc arena, which reserves
//! 64 MiB of address space. A program that caps its address space for
//! itself (vsftpd caps each session process at 200 MiB) would find its
//! own `mmap` refused; the cap it sets is raised by [`AS_ALLOWANCE`].

use std::ffi::{c_int, c_uint};

use crate::real::real;

/// The address space the layer's own threads and pools may take in a
/// process on the stack, added to a finite `RLIMIT_AS`.
pub const AS_ALLOWANCE: u64 = 512 << 20;

/// `limit` with the layer's allowance (infinity stays infinity).
fn with_allowance(limit: libc::rlim_t) -> libc::rlim_t {
    if limit == libc::RLIM_INFINITY {
        limit
    } else {
        limit
            .saturating_add(AS_ALLOWANCE)
            .min(libc::RLIM_INFINITY - 1)
    }
}

/// `setrlimit(2)`.
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn setrlimit(resource: c_uint, rlim: *const libc::rlimit) -> c_int {
    if resource == libc::RLIMIT_AS && !rlim.is_null() && crate::lifecycle::planned() {
        // SAFETY: the caller's rlimit.
        let asked = unsafe { *rlim };
        let raised = libc::rlimit {
            rlim_cur: with_allowance(asked.rlim_cur),
            rlim_max: with_allowance(asked.rlim_max),
        };
        // SAFETY: the C library's setrlimit on our copy.
        return unsafe { (real().setrlimit)(resource, &raised) };
    }
    // SAFETY: passing the call on.
    unsafe { (real().setrlimit)(resource, rlim) }
}

/// `setrlimit64` (the same on 64-bit Linux).
///
/// # Safety
/// A C call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn setrlimit64(resource: c_uint, rlim: *const libc::rlimit) -> c_int {
    // SAFETY: the same call.
    unsafe { setrlimit(resource, rlim) }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn a_finite_address_space_cap_gets_the_allowance_and_infinity_stays() {
        assert_eq!(with_allowance(200 << 20), (200 << 20) + AS_ALLOWANCE);
        assert_eq!(with_allowance(libc::RLIM_INFINITY), libc::RLIM_INFINITY);
        assert_eq!(
            with_allowance(libc::RLIM_INFINITY - 2),
            libc::RLIM_INFINITY - 1
        );
    }
}
