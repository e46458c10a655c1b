#!/usr/bin/env bash
# The test topology: a Linux host and a ustack host in network namespaces
# made here, joined by a veth pair, addresses in 10.77.0.0/24.
#
#   tools/netns.sh up [TAG]     create TAG-linux (10.77.0.1 on TAG-l) and
#                               TAG-stack (TAG-s, no kernel address: ustack
#                               runs there with --pcap TAG-s --ip 10.77.0.2/24)
#   tools/netns.sh down [TAG]   remove both namespaces (and the veth pair)
#
# TAG defaults to "us" (at most 8 characters). NETEM="loss 2% 25%" (any tc
# netem arguments) adds impairment on both directions. Safe to run twice:
# "up" first removes what a previous run left. Needs root.
set -euo pipefail

cmd=${1:-}
tag=${2:-us}
if [ ${#tag} -gt 8 ]; then echo "netns.sh: tag '$tag' is longer than 8 characters" >&2; exit 2; fi
lns="$tag-linux" sns="$tag-stack" lv="$tag-l" sv="$tag-s"

down() {
  # Processes a test left in its namespaces (a daemon, a keeper) go first:
  # a namespace lives on while a process is in it.
  local ns
  for ns in "$lns" "$sns"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  done
  ip netns del "$lns" 2>/dev/null || true
  ip netns del "$sns" 2>/dev/null || true
}

# Offloads would hand the peer partial checksums and 64 KB GSO frames that a
# pcap-based stack rightly rejects: turn them off on both ends.
no_offload() {
  ip netns exec "$1" ethtool -K "$2" tx off rx off tso off gso off gro off >/dev/null 2>&1 || true
}

up() {
  down
  ip netns add "$lns"
  ip netns add "$sns"
  ip link add "$lv" netns "$lns" type veth peer name "$sv" netns "$sns"
  for ns in "$lns" "$sns"; do
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1
  done
  ip netns exec "$lns" ip addr add 10.77.0.1/24 dev "$lv"
  ip netns exec "$lns" ip link set "$lv" up
  ip netns exec "$sns" ip link set "$sv" up
  no_offload "$lns" "$lv"
  no_offload "$sns" "$sv"
  if [ -n "${NETEM:-}" ]; then
    # shellcheck disable=SC2086
    ip netns exec "$lns" tc qdisc add dev "$lv" root netem $NETEM
    # shellcheck disable=SC2086
    ip netns exec "$sns" tc qdisc add dev "$sv" root netem $NETEM
  fi
}

case "$cmd" in
  up) up ;;
  down) down ;;
  *) echo "usage: tools/netns.sh up|down [TAG]   (NETEM=\"loss 2%\" for impairment)" >&2; exit 2 ;;
esac
