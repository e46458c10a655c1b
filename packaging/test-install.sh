#!/usr/bin/env bash
# packaging/test-install.sh DEB NEWER_DEB: the package on a fresh Debian 12.
#
# mmdebstrap builds a minimal bookworm root (minbase and systemd, as a
# server has it; about 20 s from the mirror) and, in its customize
# hooks, inside that root:
#   1. installs DEB with apt (its Depends: come from the mirror) and
#      checks every file, the shared libraries, the `ustack` user, the
#      binaries (a demo on the sim link; `ustack exec` finding the preload
#      library; the example configs accepted);
#   2. verifies the units: `systemd-analyze verify` prints nothing,
#      `systemd-analyze security --offline=true` at most 4.5, the man
#      pages of Documentation= are there;
# then boots it under systemd (systemd-nspawn, its own network namespace)
# and checks that ustack@boottest (pcap on the container's lo) runs as
# ustack with CAP_NET_ADMIN, CAP_NET_RAW and CAP_IPC_LOCK only, and is
# restarted after a kill -9; then, in the same root:
#   3. upgrades to NEWER_DEB (a changed conffile is kept) and installs it
#      again;
#   4. removes (settings and user stay) and purges (no file of the
#      package, /etc/ustack or the user is left).
# Any failure fails the run. Needs root, mmdebstrap and systemd-container.
set -euo pipefail

if [ "${1:-}" = --in-root ]; then
  # ---- inside the root (chroot), one phase per hook ----
  phase=$2
  shift 2
  export DEBIAN_FRONTEND=noninteractive
  fail() { echo "FAIL (in the clean root, $phase): $*" >&2; exit 1; }
  apt_get() {
    apt-get -q -y -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
      --no-install-recommends "$@" >/tmp/apt.log 2>&1 || { cat /tmp/apt.log >&2; fail "apt-get $*"; }
  }
  files=(/usr/bin/ustack /usr/bin/uping /usr/bin/uperf /usr/bin/utop
         /usr/lib/ustack/libustack_preload.so
         /usr/share/man/man1/ustack.1.gz /usr/share/man/man1/ustack-run.1.gz
         /usr/share/man/man1/ustack-exec.1.gz /usr/share/man/man1/uping.1.gz
         /usr/share/man/man1/uperf.1.gz /usr/share/man/man1/utop.1.gz
         /usr/share/ustack/prometheus/rules.yml /usr/share/ustack/prometheus/grafana-dashboard.json
         /lib/systemd/system/ustack@.service /lib/systemd/system/ustack-mesh.service
         /etc/ustack/example.toml /etc/ustack/mesh.toml /etc/ustack/pinglist.txt
         /usr/share/doc/ustack/copyright)
  for b in ustack uping uperf utop; do
    files+=("/usr/share/bash-completion/completions/$b" "/usr/share/zsh/vendor-completions/_$b"
            "/usr/share/fish/vendor_completions.d/$b.fish")
  done
  case "$phase" in
    install)
      apt_get install "/root/$1"
      for f in "${files[@]}"; do [ -s "$f" ] || fail "$f is missing or empty"; done
      for f in /usr/bin/ustack /usr/bin/uping /usr/bin/uperf /usr/bin/utop /usr/lib/ustack/libustack_preload.so; do
        if ldd "$f" | grep -q "not found"; then fail "$f: $(ldd "$f" | grep 'not found')"; fi
      done
      getent passwd ustack | grep -q ':/usr/sbin/nologin$' || fail "no system user ustack"
      for b in ustack uping uperf utop; do "$b" --version >/dev/null || fail "$b --version"; done
      ustack demo --duration 1 --no-tui >/tmp/demo.log 2>&1 || { cat /tmp/demo.log >&2; fail "ustack demo"; }
      # `ustack exec` finds the library where the package put it.
      pre=$(ustack exec --pcap lo --ip 10.254.0.1/24 -- sh -c 'echo "$LD_PRELOAD"') \
        || fail "ustack exec"
      [ "$pre" = /usr/lib/ustack/libustack_preload.so ] || fail "ustack exec preloads '$pre'"
      # The example settings are accepted (a bad key or value would stop --help).
      ustack run --config /etc/ustack/example.toml --help >/dev/null || fail "example.toml refused"
      uping --config /etc/ustack/mesh.toml --help >/dev/null || fail "mesh.toml refused"
      echo "installed: $(dpkg-query -W -f='${Version}, Depends: ${Depends}' ustack)"
      ;;
    verify)
      units=(/lib/systemd/system/ustack@example.service /lib/systemd/system/ustack-mesh.service)
      out=$(systemd-analyze verify --man=no "${units[@]}" 2>&1) || fail "systemd-analyze verify: $out"
      [ -z "$out" ] || fail "systemd-analyze verify says: $out"
      for u in ustack@example.service ustack-mesh.service; do
        systemd-analyze security --offline=true --threshold=45 --no-pager "$u" >/tmp/sec.log 2>&1 \
          || { cat /tmp/sec.log >&2; fail "$u: exposure above 4.5"; }
        echo "$u: $(grep -o 'Overall exposure level.*' /tmp/sec.log)"
      done
      for page in $(sed -n 's/^Documentation=.*man:\([^ (]*\)(1).*/\1/p' /lib/systemd/system/ustack*.service); do
        [ -s "/usr/share/man/man1/$page.1.gz" ] || fail "Documentation= names man:$page(1), not installed"
      done
      echo "units verified"
      ;;
    boot-setup)
      # A unit that runs the boot check once the container has booted.
      cat >/etc/ustack/boottest.toml <<'TOML'
pcap = "lo"
ip = "10.254.0.2/24"
telemetry = "/run/ustack/boottest/telemetry.sock"
TOML
      cat >/etc/systemd/system/ustack-boot-check.service <<'UNIT'
[Unit]
Description=ustack package test: the unit under systemd, killed and restarted
After=multi-user.target
[Service]
Type=oneshot
ExecStart=/bin/bash /root/test-install.sh --in-root boot-check
UNIT
      # The mesh agent probes that instance, over the same lo.
      cp /etc/ustack/mesh.toml /root/mesh.toml.orig
      cat >/etc/ustack/mesh.toml <<'TOML'
pcap = "lo"
ip = "10.254.0.3/24"
pinglist = "/etc/ustack/pinglist.txt"
rate = 20
duration = 0
metrics = "127.0.0.1:9464"
TOML
      cp /etc/ustack/pinglist.txt /root/pinglist.txt.orig
      echo "10.254.0.2 boottest probes=icmp,udp,tcp" >>/etc/ustack/pinglist.txt
      mkdir -p /etc/systemd/system/default.target.wants
      ln -sf /etc/systemd/system/ustack-boot-check.service /etc/systemd/system/default.target.wants/
      rm -f /root/boot-result
      ;;
    boot-check)
      # In the booted container: write PASS or the failure, then power off.
      trap 'systemctl poweroff --no-block' EXIT
      exec >/root/boot-result 2>&1
      u=ustack@boottest.service
      active() { [ "$(systemctl show -P ActiveState "$u")" = active ]; }
      systemctl start "$u" || { echo "FAIL: systemctl start $u"; systemctl status --no-pager "$u"; exit 1; }
      for _ in $(seq 100); do [ -S /run/ustack/boottest/telemetry.sock ] && break; sleep 0.1; done
      [ -S /run/ustack/boottest/telemetry.sock ] && active \
        || { echo "FAIL: $u is not serving"; journalctl --no-pager -u "$u" | tail -20; exit 1; }
      pid=$(systemctl show -P MainPID "$u")
      uid=$(awk '/^Uid:/ {print $2}' "/proc/$pid/status")
      [ "$uid" = "$(id -u ustack)" ] || { echo "FAIL: $u runs as uid $uid, not ustack"; exit 1; }
      # CAP_NET_ADMIN (12), CAP_NET_RAW (13), CAP_IPC_LOCK (14), no more.
      caps=$(awk '/^CapEff:/ {print $2}' "/proc/$pid/status")
      [ "$caps" = 0000000000007000 ] || { echo "FAIL: $u has capabilities $caps"; exit 1; }
      kill -9 "$pid"
      for _ in $(seq 100); do
        new=$(systemctl show -P MainPID "$u")
        active && [ "$new" != 0 ] && [ "$new" != "$pid" ] && break
        sleep 0.1
      done
      active && [ "$new" != "$pid" ] || { echo "FAIL: $u was not restarted after kill -9"; journalctl --no-pager -u "$u" | tail -20; exit 1; }
      m=ustack-mesh.service
      systemctl start "$m" || { echo "FAIL: systemctl start $m"; exit 1; }
      scrape() {
        exec 3<>/dev/tcp/127.0.0.1/9464 || return 1
        printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3
        cat <&3
        exec 3<&-
      }
      for _ in $(seq 100); do
        scrape 2>/dev/null | grep -q '^ustack_mesh_probes_received_total{.*target="10.254.0.2".*} [1-9]' && break
        sleep 0.1
      done
      scrape 2>/dev/null | grep -q '^ustack_mesh_probes_received_total{.*target="10.254.0.2".*} [1-9]' \
        || { echo "FAIL: $m: no answered probe in its metrics"; scrape | grep mesh | head; journalctl --no-pager -u "$m" | tail -20; exit 1; }
      echo "PASS: $m probes ustack@boottest and serves its metrics"
      echo "PASS: $u as ustack with caps $caps, restarted after kill -9 ($pid -> $new, NRestarts=$(systemctl show -P NRestarts "$u"))"
      ;;
    upgrade)
      mv /root/mesh.toml.orig /etc/ustack/mesh.toml
      mv /root/pinglist.txt.orig /etc/ustack/pinglist.txt
      rm -f /etc/ustack/boottest.toml /etc/systemd/system/ustack-boot-check.service \
        /etc/systemd/system/default.target.wants/ustack-boot-check.service
      echo "# kept across upgrades" >>/etc/ustack/example.toml
      apt_get install "/root/$2"
      [ "$(dpkg-query -W -f='${Version}' ustack)" != "$(dpkg-deb -f "/root/$1" Version)" ] \
        || fail "the version did not change"
      grep -q "kept across upgrades" /etc/ustack/example.toml || fail "a changed conffile was replaced"
      apt_get install --reinstall "/root/$2"
      for f in "${files[@]}"; do [ -s "$f" ] || fail "$f is missing after the upgrade"; done
      getent passwd ustack >/dev/null || fail "the upgrade lost the ustack user"
      echo "upgraded to $(dpkg-query -W -f='${Version}' ustack) and installed again"
      ;;
    purge)
      dpkg -L ustack >/tmp/ustack.list
      echo 'pcap = "eth9"' >/etc/ustack/eth9.toml
      apt_get remove ustack
      [ ! -e /usr/bin/ustack ] || fail "remove left /usr/bin/ustack"
      [ -f /etc/ustack/example.toml ] || fail "remove took the conffiles"
      getent passwd ustack >/dev/null || fail "remove took the user"
      apt_get purge ustack
      if dpkg-query -W -f='${Status}' ustack 2>/dev/null | grep -q .; then
        fail "dpkg still knows ustack: $(dpkg-query -W -f='${Status}' ustack)"
      fi
      [ ! -e /etc/ustack ] || fail "purge left /etc/ustack: $(ls /etc/ustack)"
      ! getent passwd ustack >/dev/null || fail "purge left the ustack user"
      ! getent group ustack >/dev/null || fail "purge left the ustack group"
      while read -r f; do
        [ -d "$f" ] || [ ! -e "$f" ] || fail "purge left $f"
      done </tmp/ustack.list
      echo "removed and purged"
      ;;
    *) fail "unknown phase" ;;
  esac
  exit 0
fi

# ---- on the host ----
[ $# -eq 2 ] || { echo "usage: packaging/test-install.sh DEB NEWER_DEB" >&2; exit 2; }
deb1=$(realpath "$1")
deb2=$(realpath "$2")
me=$(realpath "$0")
root=$(mktemp -d "${TMPDIR:-/tmp}/ustack-root.XXXXXX")
trap 'rm -rf "$root"' EXIT
rmdir "$root"
n1=$(basename "$deb1")
n2=$(basename "$deb2")
in_root="chroot \"\$1\" bash /root/test-install.sh --in-root"
mmdebstrap --quiet --mode=root --variant=minbase --include=systemd,systemd-sysv,dbus \
  --customize-hook="copy-in $deb1 $deb2 $me /root" \
  --customize-hook="$in_root install $n1" \
  --customize-hook="$in_root verify" \
  --customize-hook="$in_root boot-setup" \
  bookworm "$root" http://deb.debian.org/debian

# Boot the root under systemd (systemd-nspawn, its own network namespace
# with only lo, where the test instance runs over pcap; CAP_IPC_LOCK is
# not in nspawn's default set): the unit starts
# as ustack with its capabilities, and comes back after a kill -9.
timeout 120 systemd-nspawn --quiet --register=no --keep-unit --private-network --capability=CAP_IPC_LOCK \
  -D "$root" --console=pipe -b </dev/null >/dev/null 2>&1 || true
if ! grep -q '^PASS' "$root/root/boot-result" 2>/dev/null || grep -q '^FAIL' "$root/root/boot-result"; then
  echo "FAIL (booted under systemd):" >&2
  cat "$root/root/boot-result" >&2 2>/dev/null || echo "the boot check did not run" >&2
  exit 1
fi
cat "$root/root/boot-result"

# Upgrade, remove and purge, in the same root.
mount --bind /proc "$root/proc"
mount --bind /dev "$root/dev"
trap 'umount "$root/proc" "$root/dev" 2>/dev/null; rm -rf "$root"' EXIT
chroot "$root" bash /root/test-install.sh --in-root upgrade "$n1" "$n2"
chroot "$root" bash /root/test-install.sh --in-root purge
echo "package test passed: install, units, upgrade, remove, purge on a fresh Debian 12"
