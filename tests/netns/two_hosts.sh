#!/usr/bin/env bash
# Two real network hosts made from network namespaces joined by a veth pair (10.213.7.1 and
# 10.213.7.2, addresses that exist only inside these namespaces). ddprun node 0 runs on host A and
# node 1 on host B; each starts 2 workers of the C++ fashion_mnist_lenet example (a short run) that
# train together with Gloo across the link.
#   two_hosts.sh DDPRUN EXAMPLE_BINARY
# Exit 77 (skipped) when namespaces cannot be created here (not root, no iproute2, no CAP_NET_ADMIN).
set -euo pipefail
ddprun=$1
example=$2
suffix=$$
a=ddprun_a_$suffix
b=ddprun_b_$suffix
source "$(dirname "$0")/lib.sh"
trap netns_cleanup EXIT
netns_add "$a" "$b"
netns_link "$a" "va$suffix" 10.213.7.1/24 "$b" "vb$suffix" 10.213.7.2/24

common=(--nnodes 2 --nproc_per_node 2 --master_addr 10.213.7.1 --master_port 29500 --rdzv_conf join_timeout=60)
train=(--epochs 1 --train-limit 4000 --test-limit 1000)
out=$(mktemp -d)
ip netns exec "$a" env GLOO_SOCKET_IFNAME="va$suffix" OMP_NUM_THREADS=1 \
  "$ddprun" "${common[@]}" --node_rank 0 --local_addr 10.213.7.1 "$example" "${train[@]}" >"$out/a.out" 2>"$out/a.err" &
pid_a=$!
ip netns exec "$b" env GLOO_SOCKET_IFNAME="vb$suffix" OMP_NUM_THREADS=1 \
  "$ddprun" "${common[@]}" --node_rank 1 --local_addr 10.213.7.2 "$example" "${train[@]}" >"$out/b.out" 2>"$out/b.err" &
pid_b=$!
rc=0
wait "$pid_a" || rc=$?
wait "$pid_b" || rc=$?
cat "$out/a.out" "$out/b.out"
if [[ $rc -ne 0 ]]; then
  echo "--- host A stderr"; cat "$out/a.err"; echo "--- host B stderr"; cat "$out/b.err"
  echo "FAIL: a node exited with $rc"
  exit 1
fi
grep -q '"world_size": 4' "$out/a.out" || { echo "FAIL: no 4-worker result line from rank 0"; exit 1; }
grep -q "ranks 2..3 of 4" "$out/b.err" || { echo "FAIL: host B did not get ranks 2..3"; cat "$out/b.err"; exit 1; }
rm -rf "$out"
echo "PASS: 2 hosts x 2 workers trained over the veth link"
