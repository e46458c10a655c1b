#!/usr/bin/env bash
# Runs every ustack test: formatting, lints, rustdoc, the pure-Rust default
# build, the all-features build, unit, property and integration tests.
#
# On a fresh Debian machine, run as root: it installs the system packages the
# feature builds and the netns tests need when they are missing. Without root
# it skips the install and runs what the machine can.
#
# Skips: a test that cannot run here (no root, a program or the preload
# library missing) says why through the crate ustack-test-skip, which
# appends `test: reason` to $USTACK_SKIP_LOG; this script's own skips go
# there too, and the list is printed at the end. Under CI=true nothing may
# be skipped: such a test fails, naming what is missing, and so does this
# script at its own skips.
set -euo pipefail
cd "$(dirname "$0")/.."

ci() { [ "${CI:-}" = "true" ] || [ "${CI:-}" = "TRUE" ] || [ "${CI:-}" = "1" ]; }
USTACK_SKIP_LOG=$(mktemp "${TMPDIR:-/tmp}/ustack-skips.XXXXXX")
export USTACK_SKIP_LOG
list_skips() {
  local status=$?
  if [ -s "$USTACK_SKIP_LOG" ]; then
    printf '\n==> skipped (%s): what did not run here, and why\n' "$(wc -l <"$USTACK_SKIP_LOG")"
    sort "$USTACK_SKIP_LOG"
  fi
  rm -f "$USTACK_SKIP_LOG"
  return $status
}
trap list_skips EXIT
# A skip of this script's own: fatal under CI=true, else listed at the end.
skip() {
  echo "SKIP $*"
  if ci; then
    echo "CI=true: nothing may be skipped (tools/test.sh: $*)" >&2
    exit 1
  fi
  echo "tools/test.sh: $*" >>"$USTACK_SKIP_LOG"
}

PACKAGES=(dpdk-dev libpcap-dev libibverbs-dev librdmacm-dev libclang-dev pkg-config
          # the AF_XDP backend's XDP program (xdp/bpf/steer.c), compiled at build time
          clang libbpf-dev
          iperf3 tshark python3-scapy iproute2 iputils-ping arping netcat-openbsd ethtool nmap
          # stock programs run on ustack under LD_PRELOAD (apps/tests/netns_preload.rs)
          python3 sockperf redis-server redis-tools memcached libmemcached-tools nginx-light wrk curl
          # ssh: closefrom(3) at start (the stack keeps its own descriptors)
          openssh-client
          # DNS servers on ustack answering dig (IP_PKTINFO, IP_MTU_DISCOVER)
          dnsmasq-base unbound bind9-dnsutils
          # the stock-program suite (apps/tests/netns_stock.rs) and the bench's lighttpd row
          lighttpd apache2 apache2-utils haproxy socat ncat nodejs wget rsync dnsmasq
          openssh-server vsftpd postgresql
          # a Linux router advertising a prefix to ustack (apps/tests/netns_ipv6.rs)
          radvd
          # a C test program and a fake Go binary built at test time (netns_preload.rs)
          gcc binutils
          # capsh: the pcap offload test drops CAP_NET_ADMIN (apps/tests/netns_offloads.rs)
          libcap2-bin
          # the soft-RoCE guest and the stock RDMA tools (apps/tests/netns_rxe.rs,
          # tools/rxe-guest.sh; the guest's kernel comes from `apt-get download`)
          qemu-system-x86 busybox-static rdma-core ibverbs-utils ibverbs-providers perftest
          # Prometheus and promtool: metrics, alert rules, the mesh scrape test (tools/prometheus/);
          # headless Chromium draws the mesh page in the same test
          prometheus chromium
          # the package test: dpkg-shlibdeps for Depends:, a clean Debian 12 root
          # to install, upgrade and purge it in (tools/package.sh, packaging/test-install.sh)
          # and systemd-nspawn to boot the units in it
          dpkg-dev mmdebstrap systemd-container
          # packetdrill's build and wire topology (tools/conformance/run.sh, the regression set)
          bison flex patch make iptables
          # the mesh at scale impairs one link on its bridge (tools/mesh-scale.sh)
          nftables)

step() { printf '\n==> %s\n' "$*"; }

install_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && { echo "system packages present"; return; }
  if [ "$(id -u)" -ne 0 ]; then
    skip "install of ${missing[*]}: not root (feature builds and netns tests may be skipped)"
    return
  fi
  step "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
  # Wait for another apt to finish instead of failing on its lock, and
  # finish any install an earlier run was interrupted in.
  local apt_opts=(-o DPkg::Lock::Timeout=600)
  dpkg --configure -a >/dev/null 2>&1 || true
  # redis-server, memcached, nginx, lighttpd, apache2, haproxy, dnsmasq,
  # unbound, sshd, vsftpd and postgresql would start as services on the host:
  # the tests run their own, inside the namespaces they make.
  local no_start=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    no_start=1
    trap 'rm -f /usr/sbin/policy-rc.d; list_skips' EXIT
  fi
  apt-get "${apt_opts[@]}" update -qq
  apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [ -n "$no_start" ]; then
    rm -f /usr/sbin/policy-rc.d
    trap list_skips EXIT
  fi
}

step "system packages"
install_packages

# CI builds once from a clean clone: incremental state only costs disk.
export CARGO_INCREMENTAL=0
step "disk: $(df -h --output=avail . | tail -1 | tr -d ' ') free where the build goes"

step "cargo fmt --check"
cargo fmt --all -- --check

step "clippy (default features, all targets)"
cargo clippy --workspace --all-targets --locked --exclude ustack-verbs --exclude dpdk-sys --exclude ustack-dpdk --exclude ustack-xdp -- -D warnings

step "clippy (all features, all targets)"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

step "rustdoc: cargo doc -D warnings"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --locked -p ustack -p ustack-runtime --all-features

step "build: default features (pure Rust)"
cargo build --workspace --locked --exclude ustack-verbs --exclude dpdk-sys --exclude ustack-dpdk --exclude ustack-xdp

step "build: all features, release"
cargo build --workspace --all-features --release --locked

step "tests: unit, property, sim and CLI (all features)"
cargo test --workspace --all-features --locked --no-fail-fast

step "the stock-program suite once more, over AF_XDP (USTACK_TEST_BACKEND=xdp)"
USTACK_TEST_BACKEND=xdp cargo test --all-features --locked -p ustack-apps --test netns_stock

step "packetdrill regression set: the scripts ustack passes (tools/conformance/regression.txt)"
pd_src=${PD_SRC:-$(cd .. && pwd)/shared/tools/packetdrill}
if [ "$(id -u)" -ne 0 ]; then
  skip "packetdrill regression set: needs root (network namespaces)"
elif [ ! -x "$pd_src/setup.sh" ]; then
  skip "packetdrill regression set: no packetdrill harness at $pd_src (set PD_SRC)"
else
  # Each listed script runs once more if it fails (timing noise); a
  # second failure fails the step.
  if ! PD_SRC="$pd_src" PD_FAMILIES=ipv4 PD_MODES=ustack-lenient \
      PD_LIST=tools/conformance/regression.txt tools/conformance/run.sh; then
    echo "packetdrill regression set failed (logs in \${TMPDIR:-/tmp}/ustack-packetdrill/results)"
    exit 1
  fi
fi

step "mesh at scale: 32 agents, full mesh of icmp, udp, tcp and ud at 10,000 probes/s, one Prometheus (tools/mesh-scale.sh)"
if [ "$(id -u)" -ne 0 ]; then
  skip "mesh at scale: needs root (network namespaces)"
else
  # Its own checks: every agent scraped, the rate reached, the loss alert
  # for the one impaired link and for no other (tools/bench --only mesh
  # measures it longer, with its CPU).
  tools/mesh-scale.sh --agents 32 --rate 10000 --seconds 20
fi

step "README command: cargo run --release --bin ustack -- demo"
cargo run --release --locked --bin ustack -- demo --duration 2 --no-tui >/dev/null

step "package: build, install in a clean root, verify the units (tools/package.sh, packaging/test-install.sh)"
if [ "$(id -u)" -ne 0 ]; then
  skip "package: needs root (a clean Debian 12 root made by mmdebstrap)"
else
  # Built in target/, so the all-features build's dependencies are reused
  # (about 2 minutes instead of 6): this replaces target/release's ustack,
  # uping, uperf and preload library with their pcap+xdp builds (the next
  # cargo build puts its own back). A second version, to test the upgrade;
  # the test boots the root under systemd-nspawn with no network but lo.
  deb=$(tools/package.sh --target-dir target)
  deb2=$(tools/package.sh --target-dir target --no-build --version "$(dpkg-deb -f "$deb" Version)+test1")
  packaging/test-install.sh "$deb" "$deb2"
fi

step "fuzz: every target for ${FUZZ_SECONDS:-6} s (fuzz/README.md for longer runs)"
if ! cargo +nightly --version >/dev/null 2>&1; then
  skip "fuzz: no nightly toolchain (rustup toolchain install nightly)"
elif ! command -v cargo-fuzz >/dev/null 2>&1 && [ "$(id -u)" -ne 0 ]; then
  skip "fuzz: cargo-fuzz missing and not root (cargo install cargo-fuzz --locked)"
else
  command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked -q
  cargo +nightly fuzz build -O
  fuzz_new=$(mktemp -d)
  for t in $(cargo +nightly fuzz list); do
    mkdir -p "$fuzz_new/$t"
    # New inputs go to the temp dir; the seed corpus stays as committed.
    if cargo +nightly fuzz run -O "$t" "$fuzz_new/$t" "fuzz/corpus/$t" -- \
        -max_total_time="${FUZZ_SECONDS:-6}" >"$fuzz_new/$t.log" 2>&1; then
      echo "$t: $(grep -E '^Done [0-9]+ runs' "$fuzz_new/$t.log" | tail -1)"
    else
      tail -40 "$fuzz_new/$t.log"
      echo "fuzz target $t failed (reproducer in fuzz/artifacts/$t/)"
      exit 1
    fi
  done
  rm -rf "$fuzz_new"
fi

echo
if [ -s "$USTACK_SKIP_LOG" ]; then
  echo "all tests that ran passed; $(wc -l <"$USTACK_SKIP_LOG") skipped (listed below)"
else
  echo "all tests passed, none skipped"
fi
