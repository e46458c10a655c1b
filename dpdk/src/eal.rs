//! The Environment Abstraction Layer: initialised once per process.

use std::ffi::{CString, c_char, c_int};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::{DpdkError, rte_errno, strerror};

/// Set by the first `Eal::init`, successful or not: DPDK allows one
/// `rte_eal_init` per process (a failed one cannot be retried either).
static INIT_CALLED: AtomicBool = AtomicBool::new(false);

/// A handle on the initialised EAL. Clones share it; `rte_eal_cleanup` runs
/// when the last clone drops (pools and ports hold one, so they go first).
#[derive(Debug, Clone)]
pub struct Eal {
    inner: Arc<EalInner>,
}

#[derive(Debug)]
struct EalInner {
    args: String,
    /// The runtime directory of a file prefix we chose, removed at cleanup.
    runtime_dir: Option<PathBuf>,
}

impl Drop for EalInner {
    fn drop(&mut self) {
        // SAFETY: the EAL was initialised by `Eal::init`, and every pool and
        // port holds an `Eal` clone, so none is alive when the last one drops.
        let rc = unsafe { dpdk_sys::rte_eal_cleanup() };
        if rc != 0 {
            tracing::warn!("rte_eal_cleanup: {}", strerror(rc));
        }
        if let Some(dir) = &self.runtime_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn has_opt(args: &[String], names: &[&str]) -> bool {
    args.iter().any(|a| {
        names
            .iter()
            .any(|n| a == n || (n.starts_with("--") && a.starts_with(&format!("{n}="))))
    })
}

/// The calling thread's CPU affinity.
fn affinity() -> Option<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain data; an all-zero value is valid.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is this thread.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    (rc == 0).then_some(set)
}

impl Eal {
    /// Initialise the EAL from a shell-like argument string (as the `--dpdk`
    /// flag gives it), e.g. `--no-huge -m 256 --no-pci --vdev=net_memif0`.
    ///
    /// Unless the arguments say otherwise, each process gets its own
    /// `--file-prefix` (so concurrent processes never clash), EAL logs at
    /// warning level, and the calling thread keeps its CPU affinity (EAL
    /// would pin it to the first lcore; pass `-l`/`--lcores` to get that).
    pub fn init(args: &str) -> Result<Eal, DpdkError> {
        let mut argv = shlex::split(args).ok_or_else(|| DpdkError::BadArgs(args.to_string()))?;
        if INIT_CALLED.swap(true, Ordering::SeqCst) {
            return Err(DpdkError::AlreadyInitialized);
        }
        let mut runtime_dir = None;
        if !has_opt(&argv, &["--file-prefix", "--in-memory"]) {
            let prefix = format!("ustack-{}", std::process::id());
            runtime_dir = Some(PathBuf::from("/var/run/dpdk").join(&prefix));
            argv.push(format!("--file-prefix={prefix}"));
        }
        if !has_opt(&argv, &["--log-level"]) {
            // SAFETY: sets a global integer in the log subsystem, which is
            // initialised by a constructor before main.
            unsafe { dpdk_sys::rte_log_set_global_level(dpdk_sys::RTE_LOG_WARNING) };
        }
        let keep_affinity = !has_opt(&argv, &["-l", "-c", "--lcores"]);
        let saved = affinity();

        let mut owned = Vec::with_capacity(argv.len() + 1);
        owned.push(CString::new("ustack").unwrap_or_default());
        for a in &argv {
            owned.push(CString::new(a.as_str()).map_err(|_| DpdkError::BadArgs(args.to_string()))?);
        }
        // EAL may keep pointers into argv (device arguments, plugin paths)
        // for the life of the process, so the strings are leaked on purpose:
        // this happens once per process.
        let owned: &'static [CString] = Box::leak(owned.into_boxed_slice());
        let mut ptrs: Vec<*mut c_char> = owned.iter().map(|s| s.as_ptr().cast_mut()).collect();
        ptrs.push(std::ptr::null_mut());
        let ptrs: &'static mut [*mut c_char] = Box::leak(ptrs.into_boxed_slice());
        let argc = (ptrs.len() - 1) as c_int;
        // SAFETY: argv is a NULL-terminated array of `argc` valid C strings
        // that live for the rest of the process (leaked above); EAL permutes
        // the array, which it may, since we own it. `INIT_CALLED` guarantees
        // this runs at most once per process.
        let rc = unsafe { dpdk_sys::rte_eal_init(argc, ptrs.as_mut_ptr()) };
        if rc < 0 {
            let err = rte_errno();
            let reason = match err {
                libc::EINVAL => "invalid arguments (see the EAL usage above)".to_string(),
                libc::EALREADY => "EAL was already initialised".to_string(),
                _ => strerror(err),
            };
            if let Some(dir) = &runtime_dir {
                let _ = std::fs::remove_dir_all(dir);
            }
            return Err(DpdkError::EalInit {
                args: args.to_string(),
                reason,
            });
        }
        if keep_affinity && let Some(set) = saved {
            // SAFETY: `set` is the valid affinity this thread had before init.
            let _ = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
        }
        tracing::debug!("EAL initialised with '{}'", argv.join(" "));
        Ok(Eal {
            inner: Arc::new(EalInner {
                args: args.to_string(),
                runtime_dir,
            }),
        })
    }

    /// The argument string the EAL was initialised with.
    pub fn args(&self) -> &str {
        &self.inner.args
    }

    /// How many ethdev ports the EAL found (probed devices and vdevs).
    pub fn port_count(&self) -> u16 {
        // SAFETY: the EAL is initialised (we hold a handle).
        unsafe { dpdk_sys::rte_eth_dev_count_avail() }
    }
}
