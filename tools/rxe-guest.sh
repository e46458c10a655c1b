#!/usr/bin/env bash
# A Linux soft-RoCE (rdma_rxe) peer for ustack's RDMA tests: a QEMU guest under
# software emulation (TCG), booted from Debian's own kernel package with
# rdma-core's userspace (librxe, ibverbs-utils, perftest) in an initramfs this
# script assembles from the host's Debian packages.
#
#   tools/rxe-guest.sh build DIR [FILE...]
#       Kernel and initramfs into DIR. The kernel package is fetched once with
#       `apt-get download` and kept in DIR; the initramfs is made every time
#       (busybox, the modules rdma_rxe and virtio_net need, the RDMA tools,
#       every FILE given, each with the shared libraries `ldd` names). FILEs
#       land in the guest's /usr/local/bin.
#   tools/rxe-guest.sh boot DIR TAP CTL LOG IP/LEN MAC
#       Boots the guest in the foreground (run it inside the namespace that
#       holds TAP). Its eth0 is on TAP with IP/LEN and MAC, offloads off, and
#       `rxe0` on top of it. The guest's console goes to LOG; CTL is a Unix
#       socket where a shell reads one command per line, `@@cmd COMMAND`,
#       runs it with stdin from /dev/null and ends its output with a line
#       `@@rc=N`; a line without the `@@cmd ` start (damaged on the way)
#       is answered `@@garbled`, for the sender to send again.
#
# Needs root for nothing but the tap; packages: qemu-system-x86,
# busybox-static, rdma-core, ibverbs-utils, ibverbs-providers, perftest,
# iproute2 (tools/test.sh installs them).
set -euo pipefail

die() { echo "rxe-guest: $*" >&2; exit 1; }

# Kernel modules the guest loads, in this order (each after what it needs).
MODULES=(crc32_generic virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci
         failover net_failover virtio_net ip6_udp_tunnel udp_tunnel ib_core ib_uverbs rdma_rxe)
# Host programs the guest gets (with their libraries).
PROGRAMS=(/usr/bin/rdma /usr/bin/ibv_devinfo /usr/bin/ibv_devices /usr/bin/ibv_ud_pingpong
          /usr/bin/ibv_rc_pingpong /usr/bin/ib_send_lat /usr/bin/ib_send_bw /usr/bin/ib_write_bw
          /usr/bin/ib_write_lat /usr/bin/ib_read_bw /usr/bin/ib_read_lat)
LIBDIR=/usr/lib/x86_64-linux-gnu

kernel_pkg() {
  # linux-image-amd64 depends on the versioned image package.
  apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'
}

fetch_kernel() {
  local dir=$1 pkg m have=1
  for m in "${MODULES[@]}"; do [ -s "$dir/modules/$m.ko" ] || have=; done
  if [ -s "$dir/vmlinuz" ] && [ -n "$have" ]; then return; fi
  pkg=$(kernel_pkg)
  [ -n "$pkg" ] || die "apt-cache knows no linux-image-amd64 (apt-get update?)"
  mkdir -p "$dir/deb"
  if ! ls "$dir"/deb/"$pkg"_*.deb >/dev/null 2>&1; then
    (cd "$dir/deb" && apt-get download "$pkg" >/dev/null 2>&1) \
      || die "apt-get download $pkg failed"
  fi
  rm -rf "$dir/x" && mkdir -p "$dir/x"
  dpkg-deb -x "$dir"/deb/"$pkg"_*.deb "$dir/x"
  local kver
  kver=$(ls "$dir/x/lib/modules")
  mkdir -p "$dir/modules"
  for m in "${MODULES[@]}"; do
    local f
    f=$(find "$dir/x/lib/modules/$kver" -name "$m.ko*" | head -1)
    [ -n "$f" ] || die "module $m not in $pkg"
    case "$f" in
      *.xz) xz -dc "$f" >"$dir/modules/$m.ko" ;;
      *.zst) zstd -qdc "$f" >"$dir/modules/$m.ko" ;;
      *) cp "$f" "$dir/modules/$m.ko" ;;
    esac
  done
  cp "$dir/x/boot/vmlinuz-$kver" "$dir/vmlinuz"
  echo "$kver" >"$dir/kernel-version"
  rm -rf "$dir/x"
}

# Copies FILE and every library it needs into ROOT at the same paths.
copy_with_libs() {
  local root=$1 file=$2 dest=${3:-$2}
  mkdir -p "$root$(dirname "$dest")"
  cp -L "$file" "$root$dest"
  ldd "$file" 2>/dev/null | awk '/=> \// {print $3} /^[ \t]*\/lib/ {print $1}' | while read -r lib; do
    [ -e "$root$lib" ] && continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}

write_init() {
  cat >"$1/init" <<'EOF'
#!/bin/sh
export PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /tmp /run && mount -t tmpfs tmpfs /tmp
for m in $(cat /modules/order); do insmod /modules/$m.ko || echo "insmod $m failed"; done
ip=$(sed -n 's/.*ustack.ip=\([^ ]*\).*/\1/p' /proc/cmdline)
ip link set lo up
ip link set eth0 up
ip addr add "$ip" dev eth0
rdma link add rxe0 type rxe netdev eth0 || echo "rdma link add failed"
echo "guest ready: $(uname -r) eth0 $ip, $(ls /sys/class/infiniband 2>/dev/null)"
stty -F /dev/ttyS1 raw -echo
exec setsid sh -c 'exec </dev/ttyS1 >/dev/ttyS1 2>&1
echo "@@ready"
while IFS= read -r line; do
  case "$line" in
  "@@cmd "*) sh -c "${line#@@cmd }" </dev/null; echo "@@rc=$?" ;;
  *) echo "@@garbled" ;;
  esac
done'
EOF
  chmod +x "$1/init"
}

build() {
  local dir=$1; shift
  command -v busybox >/dev/null || die "busybox missing (apt-get install busybox-static)"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  fetch_kernel "$dir"
  local root="$dir/root"
  rm -rf "$root" && mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,proc,sys,dev,tmp,etc,modules}
  cp "$(command -v busybox)" "$root/bin/busybox"
  for a in $(busybox --list); do
    [ -e "$root/bin/$a" ] || ln -s busybox "$root/bin/$a"
  done
  cp "$dir"/modules/*.ko "$root/modules/"
  printf '%s\n' "${MODULES[@]}" >"$root/modules/order"
  for p in "${PROGRAMS[@]}"; do
    [ -x "$p" ] || die "$p missing (rdma-core, ibverbs-utils, perftest, iproute2)"
    copy_with_libs "$root" "$p"
  done
  # librxe is loaded by libibverbs at run time, so ldd does not name it.
  mkdir -p "$root/etc/libibverbs.d"
  cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/"
  local prov
  prov=$(ls "$LIBDIR"/libibverbs/librxe-rdmav*.so 2>/dev/null | head -1)
  [ -n "$prov" ] || die "librxe missing (apt-get install ibverbs-providers)"
  copy_with_libs "$root" "$prov"
  for f in "$@"; do
    [ -x "$f" ] || die "$f is not an executable"
    copy_with_libs "$root" "$f" "/usr/local/bin/$(basename "$f")"
    # Debug info is most of a release binary's size; the guest needs none.
    strip --strip-debug "$root/usr/local/bin/$(basename "$f")" 2>/dev/null || true
  done
  echo "root:x:0:0:root:/root:/bin/sh" >"$root/etc/passwd"
  echo "root:x:0:" >"$root/etc/group"
  echo "127.0.0.1 localhost" >"$root/etc/hosts"
  write_init "$root"
  # Uncompressed: unpacking is quicker than decompressing under emulation.
  (cd "$root" && find . | busybox cpio -o -H newc 2>/dev/null) >"$dir/initramfs.cpio"
  echo "guest: $(cat "$dir/kernel-version"), initramfs $(du -h "$dir/initramfs.cpio" | cut -f1)"
}

boot() {
  local dir=$1 tap=$2 ctl=$3 log=$4 ip=$5 mac=$6
  [ -s "$dir/initramfs.cpio" ] || die "no guest in $dir (run: $0 build $dir)"
  command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing (apt-get install qemu-system-x86)"
  # Offloads off on both ends of the guest's NIC: the guest computes its own
  # checksums and sends no segments larger than the MTU.
  exec qemu-system-x86_64 -accel tcg -cpu max -smp 1 -m 768 -no-reboot \
    -display none -monitor none -nodefaults \
    -kernel "$dir/vmlinuz" -initrd "$dir/initramfs.cpio" \
    -append "console=ttyS0 panic=-1 quiet loglevel=4 rdinit=/init ustack.ip=$ip" \
    -serial "file:$log" \
    -chardev "socket,id=ctl,path=$ctl,server=on,wait=off" -serial chardev:ctl \
    -netdev "tap,id=n0,ifname=$tap,script=no,downscript=no" \
    -device "virtio-net-pci,netdev=n0,mac=$mac,csum=off,guest_csum=off,gso=off,guest_tso4=off,guest_tso6=off,guest_ecn=off,guest_ufo=off,host_tso4=off,host_tso6=off,host_ecn=off,host_ufo=off,mrg_rxbuf=off"
}

case "${1:-}" in
  build) shift; [ $# -ge 1 ] || die "usage: $0 build DIR [FILE...]"; build "$@" ;;
  boot) shift; [ $# -eq 6 ] || die "usage: $0 boot DIR TAP CTL LOG IP/LEN MAC"; boot "$@" ;;
  *) die "usage: $0 build DIR [FILE...] | boot DIR TAP CTL LOG IP/LEN MAC" ;;
esac
