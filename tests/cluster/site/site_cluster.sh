#!/usr/bin/env bash
# Emulated nodes built the way a site's test harness builds them, with nothing of
# hpcddp's testbed (testbed): a network namespace per node on a bridge, 1 Gbit/s
# tbf links both ways, no /etc/hosts entries; ranks reach a node through ./ssh, an
# ssh-style launcher agent that enters the node's namespace and a UTS namespace of its
# own and sets the node's hostname there. Root only.
#
#   site_cluster.sh up NAME NODES SUBNET RATE   (SUBNET: the first three octets, 10.231.0)
#   site_cluster.sh down NAME
#   site_cluster.sh reset NAME                  (every node's processes ended, links up)
#   site_cluster.sh link NAME NODE up|down
#   site_cluster.sh freeze NAME NODE            (SIGSTOP every process of the node)
#   site_cluster.sh kill NAME NODE              (SIGKILL the node's ranks, not hydra's proxy)
set -euo pipefail

pids_of() { ip netns pids "$1" 2>/dev/null || true; }

case "$1" in
  up)
    name=$2 nodes=$3 subnet=$4 rate=$5
    if ip route | grep -q "^$subnet\."; then
      echo "site_cluster: $subnet.0/24 is in use here" >&2; exit 2
    fi
    ip link add "$name-br" type bridge
    ip addr add "$subnet.1/24" dev "$name-br"
    ip link set "$name-br" up
    for i in $(seq 1 "$nodes"); do
      node="$name-n$i"
      ip netns add "$node"
      ip link add "$name-v$i" type veth peer name eth0 netns "$node"
      ip link set "$name-v$i" master "$name-br" up
      ip -n "$node" addr add "$subnet.$((i + 1))/24" dev eth0
      ip -n "$node" link set eth0 up
      ip -n "$node" link set lo up
      tc qdisc add dev "$name-v$i" root tbf rate "$rate" burst 256kb latency 100ms
      tc -n "$node" qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 100ms
    done
    ;;
  down)
    name=$2
    for ns in $(ip netns list | awk '{print $1}' | grep "^$name-n" || true); do
      for pid in $(pids_of "$ns"); do kill -CONT "$pid" 2>/dev/null || true; kill -9 "$pid" 2>/dev/null || true; done
      ip netns del "$ns" 2>/dev/null || true
    done
    for link in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^$name-" || true); do
      ip link del "$link" 2>/dev/null || true
    done
    ;;
  reset)
    name=$2
    for ns in $(ip netns list | awk '{print $1}' | grep "^$name-n" || true); do
      for pid in $(pids_of "$ns"); do kill -CONT "$pid" 2>/dev/null || true; kill -9 "$pid" 2>/dev/null || true; done
      ip link set "$name-v${ns##*-n}" up
    done
    ;;
  link)
    name=$2 node=$3 state=$4
    ip link set "$name-v${node##*-n}" "$state"
    ;;
  freeze|kill)
    signal=$([ "$1" = freeze ] && echo STOP || echo KILL)
    pids=$(pids_of "$3")
    if [ "$1" = kill ]; then  # the ranks, as the OOM killer would: the launcher's proxy stays
      pids=$(for pid in $pids; do
               [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = hydra_pmi_proxy ] || echo "$pid"; done)
    fi
    if [ -z "$pids" ]; then echo "site_cluster: no process on $3" >&2; exit 3; fi
    for pid in $pids; do kill -"$signal" "$pid" 2>/dev/null || true; done
    ;;
  *)
    echo "usage: $0 up|down|link|freeze|kill ..." >&2; exit 2
    ;;
esac
