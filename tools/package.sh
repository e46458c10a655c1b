#!/usr/bin/env bash
# Builds the Debian package of ustack with plain dpkg-deb:
#
#   tools/package.sh [--version VER] [--target-dir DIR] [--no-build] [--out DIR]
#
# The binaries (ustack, uping, uperf, utop) and libustack_preload.so are
# built with the backends a Debian user can run without extra libraries
# beyond libpcap: pcap and xdp (the XDP program is compiled by clang at
# build time; AF_XDP needs no library at run time). Man pages and bash,
# zsh and fish completions come from the clap definitions
# (packaging/docgen); the units, example settings and maintainer scripts
# from packaging/; the Prometheus rules and dashboard from
# tools/prometheus/. Depends: is what dpkg-shlibdeps finds, plus adduser
# (postinst makes the `ustack` user).
#
# --version VER     the package's version (default: the workspace's, -1)
# --target-dir DIR  cargo's target directory (default: target/package, its
#                   own, so target/release keeps its all-features build)
# --no-build        use the binaries already in DIR/release
# --out DIR         where the .deb goes (default: the target directory)
#
# Prints the path of the .deb it wrote. Needs cargo, dpkg-deb,
# dpkg-shlibdeps (dpkg-dev), clang and libbpf-dev, libpcap-dev.
set -euo pipefail
cd "$(dirname "$0")/.."

version=""
target=target/package
build=1
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --version) version=$2; shift 2 ;;
    --target-dir) target=$2; shift 2 ;;
    --no-build) build=""; shift ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: tools/package.sh [--version VER] [--target-dir DIR] [--no-build] [--out DIR]" >&2; exit 2 ;;
  esac
done
[ -n "$version" ] || version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)-1"
[ -n "$out" ] || out=$target
arch=$(dpkg --print-architecture)
features=ustack-apps/pcap,ustack-apps/xdp,ustack-preload/pcap,ustack-preload/xdp

if [ -n "$build" ]; then
  # One invocation, so the docgen sees the same features as the binaries
  # (flags of backends a build lacks are hidden from --help and the pages).
  CARGO_TARGET_DIR=$target cargo build --release --locked \
    -p ustack-apps -p utop -p ustack-preload -p ustack-docgen --features "$features" >&2
fi
rel=$target/release
for f in ustack uping uperf utop ustack-docgen libustack_preload.so; do
  [ -f "$rel/$f" ] || { echo "tools/package.sh: $rel/$f is not built" >&2; exit 1; }
done

stage=$target/deb/ustack_${version}_$arch
rm -rf "$stage"
mkdir -p "$stage/DEBIAN" "$stage/usr/bin" "$stage/usr/lib/ustack" \
  "$stage/usr/share/doc/ustack" "$stage/usr/share/ustack/prometheus" \
  "$stage/lib/systemd/system" "$stage/etc/ustack"

# Binaries and the preload library, without their debug line tables.
for b in ustack uping uperf utop; do
  install -m 755 "$rel/$b" "$stage/usr/bin/$b"
done
install -m 644 "$rel/libustack_preload.so" "$stage/usr/lib/ustack/libustack_preload.so"
strip --strip-unneeded --remove-section=.comment --remove-section=.note \
  "$stage"/usr/bin/* "$stage/usr/lib/ustack/libustack_preload.so"

# Man pages (gzip -n: reproducible) and completions.
"$rel/ustack-docgen" "$stage"
gzip -9n "$stage"/usr/share/man/man1/*.1

# Units, settings, Prometheus files, docs.
install -m 644 packaging/systemd/ustack@.service packaging/systemd/ustack-mesh.service \
  "$stage/lib/systemd/system/"
install -m 644 packaging/etc/example.toml packaging/etc/mesh.toml packaging/etc/pinglist.txt \
  "$stage/etc/ustack/"
install -m 644 tools/prometheus/rules.yml tools/prometheus/grafana-dashboard.json \
  tools/prometheus/prometheus.yml tools/prometheus/README.md "$stage/usr/share/ustack/prometheus/"
install -m 644 packaging/debian/copyright "$stage/usr/share/doc/ustack/copyright"
gzip -9n <README.md >"$stage/usr/share/doc/ustack/README.md.gz"
chmod 644 "$stage/usr/share/doc/ustack/README.md.gz"

# Maintainer scripts; every file in /etc is a conffile.
for s in postinst prerm postrm; do
  install -m 755 "packaging/debian/$s" "$stage/DEBIAN/$s"
done
(cd "$stage" && find etc -type f | sort | sed 's|^|/|') >"$stage/DEBIAN/conffiles"

# Depends: the shared libraries the ELF files need (dpkg-shlibdeps reads
# a debian/control of a source package, so it gets a scratch one).
shl=$(mktemp -d)
trap 'rm -rf "$shl"' EXIT
mkdir -p "$shl/debian"
printf 'Source: ustack\n\nPackage: ustack\nArchitecture: any\n' >"$shl/debian/control"
elfs=()
for f in "$stage"/usr/bin/* "$stage/usr/lib/ustack/libustack_preload.so"; do
  elfs+=("-e$(realpath "$f")")
done
shlibs=$(cd "$shl" && dpkg-shlibdeps -O "${elfs[@]}" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
[ -n "$shlibs" ] || { echo "tools/package.sh: dpkg-shlibdeps found no dependencies" >&2; exit 1; }
depends="$shlibs, adduser"

(cd "$stage" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z \
  | xargs -0 md5sum) >"$stage/DEBIAN/md5sums"
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@SIZE@/$size/" \
  -e "s/@DEPENDS@/$depends/" packaging/debian/control.in >"$stage/DEBIAN/control"

mkdir -p "$out"
deb=$out/ustack_${version}_$arch.deb
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
echo "$deb"
