#!/usr/bin/env bash
# tools/mesh-scale.sh: a mesh at scale on this machine. N mesh agents
# (`uping --pinglist ... --responder --metrics`, default 32), each on its own
# veth into one Linux bridge, probe each other in a full mesh with icmp, udp,
# tcp and ud probes, RATE probes/s in total; one Prometheus scrapes them all
# with tools/prometheus/rules.yml loaded. One link, between agents 1 and 2,
# loses LOSS % of the frames agent 1 sends to agent 2 (an nft rule on the
# bridge), so the round trips of that pair, both ways, lose probes.
#
#   tools/mesh-scale.sh [--agents N] [--rate R] [--seconds S] [--loss PCT]
#                       [--json FILE] [--bin DIR]
#
# Checks, after S seconds (default 30) of probing:
#   - Prometheus scraped every agent;
#   - the MeshTargetLoss alert (pending or firing) is there for the
#     impaired pair (1 -> 2 and 2 -> 1) and for no other pair;
#   - no MeshTargetUnreachable alert;
#   - the agents together sent at least 90 % of RATE.
# Prints each agent's CPU (% of one core) over the measured window, and
# with --json writes the figures (tools/bench's `mesh` section reads them).
# Exit status 0 when every check holds, 1 when one fails, 2 when the set-up
# cannot run (not root, a program missing).
#
# Everything lives in two namespaces made here (umesh-br-PID: the bridge;
# umesh-ag-PID: the agents' veth ends, their metrics endpoints on its
# loopback, Prometheus), addresses 10.77.9.0/24; all removed on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
AGENTS=32
RATE=10000
SECS=30
LOSS=20
JSON=
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release
while [ $# -gt 0 ]; do
  case "$1" in
    --agents) AGENTS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --seconds) SECS=$2; shift 2 ;;
    --loss) LOSS=$2; shift 2 ;;
    --json) JSON=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "mesh-scale: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
die() { echo "mesh-scale: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
[ "$AGENTS" -ge 3 ] && [ "$AGENTS" -le 200 ] || die "--agents must be 3 to 200"
for p in ip nft prometheus curl python3; do command -v $p >/dev/null || die "$p is not installed"; done
[ -x "$BIN/uping" ] || die "$BIN/uping is missing (cargo build --release --all-features)"
"$BIN/uping" --help | grep -q -- --responder || die "$BIN/uping has no --responder"

BR=umesh-br-$$
AG=umesh-ag-$$
WORK=$(mktemp -d /tmp/umesh.XXXXXX)
PIDS=()
cleanup() {
  set +e
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.5
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  ip netns del "$AG" 2>/dev/null
  ip netns del "$BR" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
log() { echo "mesh-scale: $*" >&2; }

mac() { printf '02:77:09:00:%02x:%02x' $(($1 / 256)) $(($1 % 256)); }
ip_of() { echo "10.77.9.$1"; }
port_of() { echo $((9500 + $1)); }

# ---- topology: one bridge, a veth per agent
ip netns add "$BR"
ip netns add "$AG"
ip -n "$BR" link set lo up
ip -n "$AG" link set lo up
ip netns exec "$AG" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
ip -n "$BR" link add br0 type bridge
ip -n "$BR" link set br0 up
for i in $(seq "$AGENTS"); do
  ip -n "$AG" link add "ua$i" type veth peer name "ub$i" netns "$BR"
  ip -n "$BR" link set "ub$i" master br0 up
  ip -n "$AG" link set "ua$i" up
done
# The impaired link: frames from agent 1 to agent 2.
ip netns exec "$BR" nft -f - <<EOF
table bridge umesh {
  chain impair {
    type filter hook forward priority 0; policy accept;
    ether saddr $(mac 1) ether daddr $(mac 2) numgen random mod 100 < $LOSS counter drop
  }
}
EOF

# ---- agents: a full mesh, RATE / N probes/s each
per=$(( (RATE + AGENTS - 1) / AGENTS ))
targets=()
for i in $(seq "$AGENTS"); do
  list="$WORK/list$i"
  : > "$list"
  for j in $(seq "$AGENTS"); do
    [ "$i" = "$j" ] && continue
    echo "$(ip_of "$j") agent-$j probes=icmp,udp,tcp,ud" >> "$list"
  done
  ip netns exec "$AG" "$BIN/uping" --pcap "ua$i" --mac "$(mac "$i")" --ip "$(ip_of "$i")/24" \
    --pinglist "$list" --pinglist-refresh 0 --rate "$per" --duration 0 -W 1 -q --responder \
    --metrics "127.0.0.1:$(port_of "$i")" > "$WORK/agent$i.log" 2>&1 &
  PIDS+=($!)
  targets+=("'127.0.0.1:$(port_of "$i")'")
done
AGENT_PIDS=("${PIDS[@]}")

# ---- Prometheus
rules=$ROOT/tools/prometheus/rules.yml
cat > "$WORK/prometheus.yml" <<EOF
global:
  scrape_interval: 2s
  scrape_timeout: 2s
  evaluation_interval: 2s
rule_files:
  - '$rules'
scrape_configs:
  - job_name: ustack-mesh
    static_configs:
      - targets: [$(IFS=,; echo "${targets[*]}")]
EOF
ip netns exec "$AG" prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
  --web.listen-address=127.0.0.1:9090 --log.level=warn > "$WORK/prometheus.log" 2>&1 &
PIDS+=($!)

query() {
  ip netns exec "$AG" curl -sS --max-time 5 --get --data-urlencode "query=$1" \
    http://127.0.0.1:9090/api/v1/query 2>/dev/null || true
}
# the samples of an instant query as "label=value,... value" lines
samples() {
  query "$1" | python3 -c '
import json, sys
try:
    d = json.load(sys.stdin)
except Exception:
    sys.exit(0)
for r in d.get("data", {}).get("result", []):
    m = r["metric"]
    print(" ".join(f"{k}={m[k]}" for k in sorted(m)), r["value"][1])
'
}
alive() {
  for p in "${AGENT_PIDS[@]}"; do
    kill -0 "$p" 2>/dev/null || { log "an agent exited: $(tail -3 "$WORK"/agent*.log | tail -3)"; return 1; }
  done
}

# ---- warm up: every agent scraped, every agent probing
log "$AGENTS agents, $per probes/s each, full mesh of icmp, udp, tcp and ud; waiting for the scrapes"
deadline=$((SECONDS + 90))
while :; do
  alive || exit 1
  up=$(samples 'sum(up)' | awk '{print $NF}')
  [ "${up:-0}" = "$AGENTS" ] && break
  [ $SECONDS -gt $deadline ] && { log "only ${up:-0} of $AGENTS agents scraped"; exit 1; }
  sleep 1
done

cpu_of() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
declare -A c0
for p in "${AGENT_PIDS[@]}"; do c0[$p]=$(cpu_of "$p"); done
prom_pid=${PIDS[-1]}
p0=$(cpu_of "$prom_pid")
read -r _ u n s idle io irq sirq st _ < /proc/stat; all0=$((u + n + s + irq + sirq + st)); idle0=$((idle + io))
t0=$(date +%s.%N)
log "probing for $SECS s"
sleep "$SECS"
alive || exit 1
# Every counter read at once, then computed.
declare -A c1
for p in "${AGENT_PIDS[@]}"; do c1[$p]=$(cpu_of "$p"); done
p1=$(cpu_of "$prom_pid")
read -r _ u n s idle io irq sirq st _ < /proc/stat; all1=$((u + n + s + irq + sirq + st)); idle1=$((idle + io))
t1=$(date +%s.%N)
cpus=()
for p in "${AGENT_PIDS[@]}"; do
  cpus+=("$(awk -v a="${c0[$p]}" -v b="${c1[$p]}" -v hz="$hz" -v t="$t1" -v t0="$t0" 'BEGIN {printf "%.2f", 100*(b-a)/hz/(t-t0)}')")
done
prom_cpu=$(awk -v a="$p0" -v b="$p1" -v hz="$hz" -v t="$t1" -v t0="$t0" 'BEGIN {printf "%.1f", 100*(b-a)/hz/(t-t0)}')
busy=$(python3 -c "b=$all1-$all0; i=$idle1-$idle0; print(round(100*b/max(1,b+i), 1))")
window=$(python3 -c "print(max(10, int($SECS)))")
rate=$(samples "sum(rate(ustack_mesh_probes_sent_total[${window}s]))" | awk '{printf "%.0f", $NF}')

# ---- alerts
a1=$(ip_of 1); a2=$(ip_of 2)
loss_alerts=$(samples 'ALERTS{alertname="MeshTargetLoss"}' | grep -o 'probe=[a-z]* .*source=[0-9.]* .*target=[0-9.]*' |
  sed -E 's/probe=([a-z]+) .*source=([0-9.]+) .*target=([0-9.]+)/\2 \3 \1/' | sort -u)
unreach=$(samples 'ALERTS{alertname="MeshTargetUnreachable"}' | wc -l)
lost_pairs=$(samples 'sum by (source, target) (ustack_mesh_probes_lost_total) > 0' |
  sed -E 's/source=([0-9.]+) target=([0-9.]+) .*/\1 \2/' | sort -u)
dropped=$(ip netns exec "$BR" nft list table bridge umesh | grep -o 'packets [0-9]*' | awk '{print $2}')

status=0
fail() { log "FAIL: $*"; status=1; }
impaired=$(echo "$loss_alerts" | awk -v a="$a1" -v b="$a2" '($1==a&&$2==b)||($1==b&&$2==a)' | awk 'NF' | wc -l)
others=$(echo "$loss_alerts" | awk -v a="$a1" -v b="$a2" 'NF && !(($1==a&&$2==b)||($1==b&&$2==a))')
[ "$impaired" -gt 0 ] || fail "no MeshTargetLoss alert for the impaired link $a1 <-> $a2"
echo "$loss_alerts" | awk -v a="$a1" -v b="$a2" '$1==a&&$2==b' | grep -q . || fail "no MeshTargetLoss alert for $a1 -> $a2"
echo "$loss_alerts" | awk -v a="$a1" -v b="$a2" '$1==b&&$2==a' | grep -q . || fail "no MeshTargetLoss alert for $a2 -> $a1"
[ -z "$others" ] || fail "MeshTargetLoss alerts for links not impaired: $(echo "$others" | head -5 | tr '\n' ';')"
[ "$unreach" = 0 ] || fail "$unreach MeshTargetUnreachable alerts"
[ "${rate:-0}" -ge $((RATE * 9 / 10)) ] || fail "the agents sent ${rate:-0} probes/s, below 90 % of $RATE"

mean=$(printf '%s\n' "${cpus[@]}" | awk '{s+=$1} END {printf "%.2f", s/NR}')
max=$(printf '%s\n' "${cpus[@]}" | sort -g | tail -1)
total=$(printf '%s\n' "${cpus[@]}" | awk '{s+=$1} END {printf "%.1f", s}')
nlost=$(echo "$lost_pairs" | awk 'NF' | wc -l)
log "impaired link $a1 <-> $a2: $dropped frames dropped on the bridge; MeshTargetLoss for: $(echo "$loss_alerts" | awk 'NF {print $1 "->" $2 " " $3}' | tr '\n' ',' | sed 's/,$//')"
log "pairs with any loss: $nlost ($(echo "$lost_pairs" | awk 'NF {print $1 "->" $2}' | head -6 | tr '\n' ' '))"
log "rate $rate probes/s of $RATE; agent CPU mean $mean %, max $max %, all $total % of one core; Prometheus $prom_cpu %; machine busy $busy % ($(nproc) CPUs)"
if [ -n "$JSON" ]; then
  python3 - "$JSON" <<EOF
import json, sys
json.dump({
    "agents": $AGENTS, "rate_target": $RATE, "rate": ${rate:-0}, "seconds": $SECS,
    "agent_cpu_pct": [$(IFS=,; echo "${cpus[*]}")],
    "agent_cpu_mean_pct": $mean, "agent_cpu_max_pct": $max, "agents_cpu_total_pct": $total,
    "prometheus_cpu_pct": $prom_cpu, "machine_busy_pct": $busy,
    "loss_alerts": $(echo "$loss_alerts" | python3 -c 'import json,sys; print(json.dumps([l.split() for l in sys.stdin if l.strip()]))'),
    "unreachable_alerts": $unreach, "pairs_with_loss": $nlost, "ok": $([ $status = 0 ] && echo True || echo False),
}, open(sys.argv[1], "w"), indent=1)
EOF
fi
[ $status = 0 ] && log "ok: the alert fired for the impaired link only"
exit $status
