//! Finds the system DPDK through pkg-config, compiles `shim/shim.c` (real
//! symbols for DPDK's static inline fast path) and generates allowlisted
//! bindings with bindgen.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const INSTALL: &str = "apt-get install dpdk-dev pkg-config libclang-dev";

fn main() {
    println!("cargo:rerun-if-changed=shim/shim.c");
    println!("cargo:rerun-if-changed=shim/shim.h");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    // Compile flags first (the shim and bindgen need the same ones:
    // include paths, `-include rte_config.h`, the -march DPDK was built for).
    let cflags = Command::new("pkg-config")
        .args(["--cflags", "libdpdk"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|| {
            panic!(
                "dpdk-sys: DPDK 22.11 was not found through pkg-config (libdpdk.pc). Install it with `{INSTALL}`, or set PKG_CONFIG_PATH to the directory holding libdpdk.pc"
            )
        });
    let cflags = shlex::split(cflags.trim()).unwrap_or_else(|| {
        panic!("dpdk-sys: cannot parse `pkg-config --cflags libdpdk`: {cflags}")
    });

    // The shim, before the DPDK libraries so the linker resolves its
    // references against them.
    let mut build = cc::Build::new();
    build.file("shim/shim.c").include("shim").opt_level(3);
    for f in &cflags {
        build.flag(f);
    }
    build.flag_if_supported("-Wno-deprecated-declarations");
    build.compile("ustack_dpdk_shim");

    let lib = pkg_config::Config::new()
        .atleast_version("22.11")
        .cargo_metadata(true)
        .probe("libdpdk")
        .unwrap_or_else(|e| {
            panic!("dpdk-sys: DPDK >= 22.11 not usable through pkg-config ({e}). Install it with `{INSTALL}`")
        });
    println!("cargo:version={}", lib.version);

    let bindings = bindgen::Builder::default()
        .header("shim/shim.h")
        .clang_args(&cflags)
        .clang_arg("-Ishim")
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .allowlist_function("ustack_.*")
        .allowlist_function("rte_eal_init")
        .allowlist_function("rte_eal_cleanup")
        .allowlist_function("rte_strerror")
        .allowlist_function("rte_log_set_global_level")
        .allowlist_function("rte_socket_id")
        .allowlist_function("rte_pktmbuf_pool_create")
        .allowlist_function("rte_mempool_free")
        .allowlist_function("rte_mempool_avail_count")
        .allowlist_function("rte_mempool_in_use_count")
        .allowlist_function("rte_eth_dev_count_avail")
        .allowlist_function("rte_eth_dev_is_valid_port")
        .allowlist_function("rte_eth_dev_socket_id")
        .allowlist_function("rte_eth_dev_get_name_by_port")
        .allowlist_function("rte_eth_dev_info_get")
        .allowlist_function("rte_eth_dev_configure")
        .allowlist_function("rte_eth_dev_adjust_nb_rx_tx_desc")
        .allowlist_function("rte_eth_rx_queue_setup")
        .allowlist_function("rte_eth_tx_queue_setup")
        .allowlist_function("rte_eth_dev_start")
        .allowlist_function("rte_eth_dev_stop")
        .allowlist_function("rte_eth_dev_close")
        .allowlist_function("rte_eth_promiscuous_enable")
        .allowlist_function("rte_eth_promiscuous_get")
        .allowlist_function("rte_eth_dev_set_mtu")
        .allowlist_function("rte_eth_dev_rx_intr_enable")
        .allowlist_function("rte_eth_dev_rx_intr_disable")
        .allowlist_function("rte_eth_dev_rx_intr_ctl_q_get_fd")
        .allowlist_function("rte_eth_dev_get_mtu")
        .allowlist_function("rte_eth_stats_get")
        .allowlist_function("rte_eth_xstats_get_names")
        .allowlist_function("rte_eth_xstats_get")
        .allowlist_var("RTE_MAX_ETHPORTS")
        .allowlist_var("RTE_PKTMBUF_HEADROOM")
        .allowlist_var("RTE_MBUF_DEFAULT_DATAROOM")
        .allowlist_var("RTE_MEMPOOL_CACHE_MAX_SIZE")
        .allowlist_var("RTE_ETH_NAME_MAX_LEN")
        .allowlist_var("RTE_ETH_XSTATS_NAME_SIZE")
        .allowlist_var("RTE_LOG_.*")
        .allowlist_var("SOCKET_ID_ANY")
        // Layouts we never touch from Rust: only pointers to them cross.
        .opaque_type("rte_mbuf")
        .opaque_type("rte_mempool")
        .opaque_type("rte_device")
        .derive_default(true)
        .derive_debug(true)
        .prepend_enum_name(false)
        .generate_comments(false)
        .generate()
        .unwrap_or_else(|e| {
            panic!(
                "dpdk-sys: bindgen failed on the DPDK headers ({e}); it needs libclang: `{INSTALL}`"
            )
        });
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("write bindings.rs");
}
