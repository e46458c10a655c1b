#!/bin/bash
# packetdrill conformance in wire mode: google/packetdrill's gtests/net/tcp
# scripts against ustack (under `ustack exec`) and, to calibrate, against the
# Linux kernel in the same topology, in each address family packetdrill's own
# runner makes of a script: ipv4, ipv6 and ipv4-mapped-ipv6 (an AF_INET6
# socket talking to an IPv4 peer through ::ffff:a.b.c.d).
#
# The packetdrill source (a pinned tarball), the wire-mode patch and the
# Linux congestion-control shim come from the shared harness
# (../shared/tools/packetdrill, its README explains the wire topology and
# the patch); this script builds them with that harness's setup.sh.
#
# Run from the checkout, as root, after `cargo build --release`:
#   tools/conformance/run.sh
#   PD_FAMILIES="ipv4 ipv6 ipv4-mapped-ipv6" PD_MODES="ustack-lenient linux" tools/conformance/run.sh
#   PD_FILTER='^close/' tools/conformance/run.sh
# Environment:
#   PD_FAMILIES  any of ipv4 ipv6 ipv4-mapped-ipv6 (default: all three)
#   PD_MODES     any of ustack ustack-lenient linux (default: all three);
#                ustack-lenient: the wire server does not compare SYN and
#                SYN-ACK options, NOP/EOL padding or PSH (a sender's choices)
#   PD_FILTER    regex on the script path under tcp/
#   PD_LIST      a file naming the scripts to run, one path under tcp/ per
#                line (# comments); with it, a failed script is run once
#                more (timing noise on a loaded machine) and the exit
#                status is 1 when any still fails: the regression set,
#                tools/conformance/regression.txt, runs so in tools/test.sh
#   PD_REPORT    write the report (CONFORMANCE.md's tables) to this file
#   PD_REPORT_ONLY=1  run nothing: the summary and report from the results
#                already in PD_OUT (after editing reasons.tsv)
#   PD_TIMEOUT   seconds per script (20)
#   PD_TOL_USECS packetdrill --tolerance_usecs
#   PD_RETRY_TOL_USECS with PD_LIST, the tolerance of the second try of a
#                script whose first failed on timing (20000)
#   PD_USTACK_ARGS extra `ustack exec` flags
#   PD_SRC       the shared harness (default ../shared/tools/packetdrill)
#   PD_WORK      where build/ goes (default $TMPDIR/ustack-packetdrill)
#   PD_OUT       results (default $PD_WORK/results): <mode>-<family>.tsv,
#                one log per script, summary.txt
#   USTACK       the ustack binary (default target/release/ustack)
# Output: a line per script, a table per family and directory, and last
#   "packetdrill FAMILY: ustack P/N passed (lenient Q/N, Linux L/N)" per family.
# Exit status 0 unless the harness itself could not run (or, with PD_LIST,
#   a listed script failed twice).
set -u
cd "$(dirname "$0")/../.."
SRC=${PD_SRC:-$(cd .. && pwd)/shared/tools/packetdrill}
USTACK=${USTACK:-$PWD/target/release/ustack}
MODES=${PD_MODES:-ustack ustack-lenient linux}
FAMILIES=${PD_FAMILIES:-ipv4 ipv6 ipv4-mapped-ipv6}
FILTER=${PD_FILTER:-.}
LIST=${PD_LIST:-}
REPORT=${PD_REPORT:-}
TIMEOUT=${PD_TIMEOUT:-20}
USTACK_ARGS=${PD_USTACK_ARGS:-}
WORK=${PD_WORK:-${TMPDIR:-/tmp}/ustack-packetdrill}
OUT=${PD_OUT:-$WORK/results}
PD="$WORK/build/packetdrill/gtests/net/packetdrill/packetdrill"
TESTS="$WORK/build/tests"

# Topology (every address inside the two namespaces made here):
#   pd-a: the wire server: pd-wa (test link; the server adds the gateway
#         address itself) and pd-ca 10.254.0.1/30 (control, kernel TCP)
#   pd-b: the wire client and the stack under test: pd-wb (test link, no
#         kernel address in the ustack runs) and pd-cb 10.254.0.2/30
NA=pd-a NB=pd-b
MAC_A=02:70:64:00:00:0a MAC_B=02:70:64:00:00:0b

# Per family: packetdrill's addresses (those of its run_all.py; the IPv4
# gateway is a second address, so pd-a's kernel answers ARP for it), and the
# control link's server address: packetdrill opens its control socket in the
# script's family (AF_INET6 for ipv6 and ipv4-mapped-ipv6). The test link's
# MTU is the one packetdrill's runner gives its tun device.
family_args() {
  case $1 in
    ipv4)
      LOCAL=192.168.0.1 GW=192.168.0.2 PREFIX=16 V6=0 CTRL=10.254.0.1 MTU=1500
      PD_ARGS=(--ip_version=ipv4 --local_ip=$LOCAL --gateway_ip=$GW --netmask_ip=255.255.0.0
        --remote_ip=192.0.2.1 -D CODE=host_unreachable
        -D CMSG_LEVEL_IP=SOL_IP -D CMSG_TYPE_RECVERR=IP_RECVERR -D TFO_COOKIE=3021b9d889017eeb) ;;
    ipv4-mapped-ipv6)
      LOCAL=192.168.0.1 GW=192.168.0.2 PREFIX=16 V6=0 CTRL=fd00:254::1 MTU=1500
      PD_ARGS=(--ip_version=ipv4-mapped-ipv6 --local_ip=$LOCAL --gateway_ip=$GW --netmask_ip=255.255.0.0
        --remote_ip=192.0.2.1 -D CODE=host_unreachable
        -D CMSG_LEVEL_IP=SOL_IPV6 -D CMSG_TYPE_RECVERR=IPV6_RECVERR -D TFO_COOKIE=3021b9d889017eeb) ;;
    ipv6)
      LOCAL=fd3d:a0b:17d6::1 GW=fd3d:a0b:17d6:8888::1 PREFIX=48 V6=1 CTRL=fd00:254::1 MTU=1520
      PD_ARGS=(--ip_version=ipv6 --mtu=1520 --local_ip=$LOCAL --gateway_ip=$GW
        --remote_ip=fd3d:fa7b:d17d::1
        -D CMSG_LEVEL_IP=SOL_IPV6 -D CMSG_TYPE_RECVERR=IPV6_RECVERR -D TFO_COOKIE=c1d1e9742a47a9bc) ;;
    *) die "unknown family $1 (ipv4, ipv6, ipv4-mapped-ipv6)" ;;
  esac
  # The stack's NET flags. ustack takes one IPv4 address always; in the ipv6
  # runs it is one nothing on the link talks to.
  NET=(--ip $LOCAL/$PREFIX --gw $GW --mtu $MTU)
  [ "$V6" = 1 ] && NET=(--ip 192.168.0.1/16 "${NET[@]}")
  PD_ARGS=(--wire_client --wire_client_dev=pd-wb --wire_server_ip=$CTRL --send_omit_free "${PD_ARGS[@]}")
  [ -n "${PD_TOL_USECS:-}" ] && PD_ARGS+=(--tolerance_usecs="$PD_TOL_USECS")
}

die() { echo "conformance: harness error: $*" >&2; cleanup; exit 1; }

SERVER_PID=
topo_down() {
  for n in $NB $NA; do
    if ip netns list 2>/dev/null | grep -qw "^$n"; then
      for p in $(ip netns pids $n 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
      ip netns del $n 2>/dev/null
    fi
  done
}
cleanup() {
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
  SERVER_PID=
  topo_down
}
trap cleanup EXIT INT TERM

# IPv6 in a namespace: on for the interfaces named, off for the others (new
# ones too), and no duplicate address detection (the addresses the wire
# server and Linux add must answer at once). pd-wb has none in the ustack
# runs: the kernel would give it the link-local address ustack derives from
# the same MAC.
ns_sysctl() { # ns_sysctl NS
  ip netns exec $1 sysctl -qw net.ipv6.conf.default.disable_ipv6=1 net.ipv6.conf.all.disable_ipv6=0 \
    net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
  ip -n $1 link set lo up
}
v6_on() { ip netns exec $1 sysctl -qw net.ipv6.conf.$2.disable_ipv6=0; }
topo_up() {
  topo_down
  ip netns add $NA || die "cannot create namespace $NA"
  ns_sysctl $NA
}
# A fresh client namespace and fresh links per script, as packetdrill's own
# runner gives each script a new namespace: scripts change sysctls, qdiscs,
# routes and offloads.
client_up() { # client_up MODE
  ip netns add $NB || die "cannot create namespace $NB"
  ns_sysctl $NB
  ip link add pd-wa netns $NA address $MAC_A type veth peer name pd-wb netns $NB address $MAC_B || die "cannot create veth"
  ip link add pd-ca netns $NA type veth peer name pd-cb netns $NB || die "cannot create veth"
  ip -n $NA addr add 10.254.0.1/30 dev pd-ca
  ip -n $NB addr add 10.254.0.2/30 dev pd-cb
  v6_on $NA pd-ca; v6_on $NB pd-cb; v6_on $NA pd-wa
  [ "$1" = linux ] && [ "$V6" = 1 ] && v6_on $NB pd-wb
  ip -n $NA addr add fd00:254::1/64 dev pd-ca nodad
  ip -n $NB addr add fd00:254::2/64 dev pd-cb nodad
  ip -n $NA link set pd-wa mtu $MTU; ip -n $NB link set pd-wb mtu $MTU
  for l in "$NA pd-ca" "$NB pd-cb" "$NA pd-wa" "$NB pd-wb"; do set -- $l; ip -n $1 link set $2 up; done
  ip netns exec $NA ethtool -K pd-wa tx off rx off tso off gso off gro off >/dev/null 2>&1
  ip netns exec $NB ethtool -K pd-wb tx off rx off tso off gso off gro off >/dev/null 2>&1
}
client_down() {
  for p in $(ip netns pids $NB 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  ip -n $NA link del pd-wa 2>/dev/null
  ip -n $NA link del pd-ca 2>/dev/null
  ip netns del $NB 2>/dev/null
}

start_server() { # start_server MODE FAMILY
  local env=()
  [ "$1" = ustack-lenient ] && env=(env PACKETDRILL_LENIENT=1)
  local v=ipv4
  [ "$CTRL" = 10.254.0.1 ] || v=ipv6
  ip netns exec $NA "${env[@]}" "$PD" --wire_server --wire_server_dev=pd-wa --ip_version=$v >"$OUT/server-$1-$2.log" 2>&1 </dev/null &
  SERVER_PID=$!
  for _ in $(seq 50); do
    ip netns exec $NA ss -Hltn 'sport = :8081' 2>/dev/null | grep -q LISTEN && return 0
    sleep 0.1
  done
  die "wire server did not start (see $OUT/server-$1-$2.log)"
}

# After a script timed out: the server and every process it forked (a
# child still serving the killed client holds the listening socket, so a
# new server could not bind and the next script found nothing listening).
restart_server() { # restart_server MODE FAMILY
  kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null
  for p in $(ip netns pids $NA 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  for _ in $(seq 50); do
    ip netns exec $NA ss -Hltn 'sport = :8081' 2>/dev/null | grep -q LISTEN || break
    sleep 0.1
  done
  start_server "$@"
}

first_error() {
  grep -m1 -E '\.pkt:[0-9]+: ' "$1" \
    || grep -v -E '^sysctl: setting key' "$1" | grep -m1 -E 'error|Error|ERROR|assert|timed out|die|fail' \
    || grep -v -E '^sysctl: setting key' "$1" | grep -m1 . || echo "(no output)"
}

# The scripts to run: every .pkt under tcp/ matching PD_FILTER, or those
# PD_LIST names (a name that is not there is an error of the list).
scripts() {
  if [ -n "$LIST" ]; then
    grep -v -E '^[[:space:]]*(#|$)' "$LIST" | awk '{print $1}' | grep -E -- "$FILTER"
  else
    (cd "$TESTS/tcp" && find . -name '*.pkt' | sed 's#^\./##' | sort | grep -E -- "$FILTER")
  fi
}

run_mode() { # run_mode MODE FAMILY
  local mode=$1 fam=$2 pass=0 total=0 t0=$SECONDS run="$1-$2"
  family_args "$fam"
  topo_up
  start_server "$mode" "$fam"
  : >"$OUT/$run.tsv"
  mkdir -p "$OUT/$run"
  while read -r rel; do
    local dir base log rc err st tries=1
    dir=$(dirname "$rel"); base=$(basename "$rel")
    log="$OUT/$run/${rel//\//__}.log"
    local again=()
    [ -n "$LIST" ] && tries=2
    for try in $(seq $tries); do
      client_up "$mode"
      if [ "$mode" != linux ]; then
        (cd "$TESTS/tcp/$dir" && PD_WIRE_DEV=pd-wb PACKETDRILL_WIRE_CLIENT_NO_NETCFG=1 \
          timeout -k 3 "$TIMEOUT" ip netns exec $NB "$USTACK" exec --pcap pd-wb --mac $MAC_B --no-probe \
            "${NET[@]}" $USTACK_ARGS -- "$PD" "${PD_ARGS[@]}" "${again[@]}" "$base") >"$log" 2>&1 </dev/null
      else
        (cd "$TESTS/tcp/$dir" && PD_WIRE_DEV=pd-wb LD_PRELOAD="$WORK/build/cc_shim.so" PD_TCP_CC=cubic \
          timeout -k 3 "$TIMEOUT" ip netns exec $NB "$PD" "${PD_ARGS[@]}" "${again[@]}" "$base") >"$log" 2>&1 </dev/null
      fi
      rc=$?
      client_down
      if [ $rc -ne 0 ] && { [ $rc -eq 124 ] || [ $rc -eq 137 ] || ! kill -0 "$SERVER_PID" 2>/dev/null; }; then
        restart_server "$mode" "$fam"
      fi
      [ $rc -eq 0 ] && break
      # A second try after a timing error (a call or packet a few ms
      # late on a loaded machine; the default tolerance is packetdrill's
      # 4 ms) allows PD_RETRY_TOL_USECS: what the regression set guards is
      # the behaviour, and timing is noise on shared machines. The
      # Linux-vs-ustack report runs without it.
      if [ $try -lt $tries ]; then
        first_error "$log" | grep -q "timing error" &&
          again=(--tolerance_usecs="${PD_RETRY_TOL_USECS:-20000}")
        printf '[%s] again   %s (%s)%s\n' "$run" "$rel" "$(first_error "$log" | head -c 120)" \
          "${again:+ with ${again[*]}}"
      fi
    done
    total=$((total + 1))
    if [ $rc -eq 0 ]; then
      pass=$((pass + 1)); err=""; st=PASS
    else
      st=FAIL
      { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && st=TIMEOUT
      err=$(first_error "$log" | head -c 300 | tr '\t' ' ')
    fi
    printf '%s\t%s\t%s\t%s\n' "$rel" "$st" "$rc" "$err" >>"$OUT/$run.tsv"
    printf '[%s] %-7s %s %s\n' "$run" "$st" "$rel" "${err:0:150}"
  done < <(scripts)
  kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; SERVER_PID=
  topo_down
  echo "$pass $total $((SECONDS - t0))" >"$OUT/$run.count"
}

# ---------------------------------------------------------------- main
[ "$(id -u)" = 0 ] || die "must run as root (namespaces)"
for t in ip iptables ip6tables ethtool timeout; do command -v $t >/dev/null || die "missing $t"; done
[ -x "$SRC/setup.sh" ] || die "no packetdrill harness at $SRC (set PD_SRC)"
for f in $FAMILIES; do family_args "$f"; done
PD_WORK="$WORK" "$SRC/setup.sh" >/dev/null || die "$SRC/setup.sh failed"
[ -x "$PD" ] || die "no packetdrill binary after setup.sh"
case " $MODES " in *" ustack"*)
  [ -x "$USTACK" ] || die "no ustack binary at $USTACK (cargo build --release, or set USTACK=)"
  "$USTACK" exec --help >/dev/null 2>&1 || die "$USTACK exec --help fails";;
esac

[ -n "${PD_REPORT_ONLY:-}" ] || { rm -rf "$OUT"; mkdir -p "$OUT"; }
# The scripts' common/defaults.sh adds a qdisc to tun0 (packetdrill's local
# mode); here the test link is pd-wb, and a failing backtick command would
# fail the script. Scripts that name tun0 get pd-wb.
rm -rf "$TESTS"; cp -r "$WORK/build/packetdrill/gtests/net" "$TESTS"
sed -i 's#^tc qdisc add dev tun0 root pfifo#tc qdisc replace dev ${PD_WIRE_DEV:-tun0} root pfifo >/dev/null 2>\&1; true#' \
  "$TESTS/common/defaults.sh"
grep -rl --include='*.pkt' tun0 "$TESTS/tcp" | xargs -r sed -i 's/\btun0\b/pd-wb/g'

if [ -n "${PD_REPORT_ONLY:-}" ]; then
  # Tables from the results of an earlier run (reasons edited since).
  for f in $FAMILIES; do for m in $MODES; do
    [ -f "$OUT/$m-$f.tsv" ] || die "no results for $m $f in $OUT (run without PD_REPORT_ONLY first)"
  done; done
else
  for f in $FAMILIES; do for m in $MODES; do run_mode "$m" "$f"; done; done
fi

# ---------------------------------------------------------------- summary
count() { [ -f "$OUT/$1.count" ] && cut -d' ' -f"$2" "$OUT/$1.count" || echo 0; }
# The directories of a family's runs, and "passed/total" of one in a run.
dirs_of() { for m in $MODES; do cut -f1 "$OUT/$m-$1.tsv"; done | cut -d/ -f1 | sort -u; }
dir_count() { # dir_count DIR RUN
  awk -F'\t' -v d="$1" '{split($1,a,"/"); if (a[1]==d) { n++; if ($2=="PASS") p++ } } END{print (p+0) "/" (n+0)}' "$OUT/$2.tsv"
}
{
  for f in $FAMILIES; do
    echo "== $f"
    printf '%-22s' directory; for m in $MODES; do printf ' %14s' "$m"; done; echo
    for d in $(dirs_of "$f"); do
      printf '%-22s' "$d"
      for m in $MODES; do printf ' %14s' "$(dir_count "$d" "$m-$f")"; done
      echo
    done
    for m in $MODES; do echo "$m $f: $(count $m-$f 1)/$(count $m-$f 2) passed in $(count $m-$f 3) s"; done
    for m in ustack ustack-lenient; do
      [ -f "$OUT/$m-$f.tsv" ] && [ -f "$OUT/linux-$f.tsv" ] || continue
      echo "scripts Linux passes and $m fails ($f):"
      join -t $'\t' <(sort -t $'\t' -k1,1 "$OUT/linux-$f.tsv") <(sort -t $'\t' -k1,1 "$OUT/$m-$f.tsv") \
        | awk -F'\t' '$2=="PASS" && $5!="PASS" {printf "  %-60s %s\n", $1, substr($7,1,150)}'
    done
  done
} | tee "$OUT/summary.txt"
for f in $FAMILIES; do
  line="packetdrill $f:"
  for m in $MODES; do line+=" $m $(count $m-$f 1)/$(count $m-$f 2)"; done
  echo "$line"
done | tee -a "$OUT/summary.txt"

# ---------------------------------------------------------------- report
# Markdown tables for CONFORMANCE.md: per directory, then per script with
# the reason (tools/conformance/reasons.tsv: a regex on the script path,
# a tab, the reason; the first match wins) for each script Linux passes
# and ustack fails.
if [ -n "$REPORT" ]; then
  reasons=tools/conformance/reasons.tsv
  {
    for f in $FAMILIES; do
      echo "### $f"
      echo
      printf '| directory |'; for m in $MODES; do printf ' %s |' "$m"; done; echo
      printf '|---|'; for m in $MODES; do printf -- '---|'; done; echo
      for d in $(dirs_of "$f"); do
        printf '| %s |' "$d"
        for m in $MODES; do printf ' %s |' "$(dir_count "$d" "$m-$f")"; done
        echo
      done
      printf '| **all** |'; for m in $MODES; do printf ' **%s/%s** |' "$(count $m-$f 1)" "$(count $m-$f 2)"; done; echo
      echo
      printf '| script |'; for m in $MODES; do printf ' %s |' "$m"; done; echo ' why ustack differs |'
      printf '|---|'; for m in $MODES; do printf -- '---|'; done; echo '---|'
      for rel in $(for m in $MODES; do cut -f1 "$OUT/$m-$f.tsv"; done | sort -u); do
        printf '| `%s` |' "$rel"
        linux=; ours=PASS
        for m in $MODES; do
          st=$(awk -F'\t' -v r="$rel" '$1==r {print $2}' "$OUT/$m-$f.tsv")
          printf ' %s |' "${st:--}"
          [ "$m" = linux ] && linux=$st
          [ "$m" = ustack-lenient ] && ours=$st
        done
        why=
        if [ "$linux" = PASS ] && [ "$ours" != PASS ] && [ -f "$reasons" ]; then
          why=$(awk -F'\t' -v r="$rel" '!/^#/ && NF>=2 && r ~ $1 {print $2; exit}' "$reasons")
          [ -n "$why" ] || why="not yet explained"
        fi
        echo " $why |"
      done
      echo
    done
  } >"$REPORT"
  echo "report written to $REPORT"
fi

if [ -n "$LIST" ]; then
  failed=$(for f in $FAMILIES; do for m in $MODES; do awk -F'\t' '$2!="PASS" {print $1}' "$OUT/$m-$f.tsv"; done; done)
  if [ -n "$failed" ]; then
    echo "regression: listed scripts failed twice:"; echo "$failed" | sed 's/^/  /'
    exit 1
  fi
fi
exit 0
