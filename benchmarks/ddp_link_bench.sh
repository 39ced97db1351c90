#!/usr/bin/env bash
# The communication hooks on a link of limited bandwidth, in one run: two hosts (network
# namespaces joined by a veth pair whose two ends tc shapes to RATE and DELAY each way, as a
# 1 Gbit/s Ethernet link with 0.5 ms per hop), one ResNet-18 worker on each, under ddprun
# (--nnodes 2). For the plain run (DDP's own average) and each hook: the bytes host A sends per
# training step and the steps/s, each also as a ratio to the plain run.
#
# Each configuration runs twice, for STEPS1 and STEPS2 steps; the figures are the differences
# divided by STEPS2 - STEPS1, so start-up (the model's broadcast, the connections) and the first
# iterations (PowerSGD runs plain all-reduces for its first 10) drop out and what is left is the
# steady state.
#   benchmarks/ddp_link_bench.sh BUILD_DIR [STEPS1] [STEPS2] [BATCH] [RATE] [DELAY]
# Defaults: 15 35 8 1gbit 0.5ms. Needs root, iproute2 and the kernel's netem qdisc (or tbf: the rate
# without the delay).
set -euo pipefail
build=${1:?usage: ddp_link_bench.sh BUILD_DIR [STEPS1] [STEPS2] [BATCH] [RATE] [DELAY]}
steps1=${2:-15}
steps2=${3:-35}
batch=${4:-8}
rate=${5:-1gbit}
delay=${6:-0.5ms}
ddprun="$build/launcher/ddprun"
example="$build/examples/resnet18"
# shellcheck source=benchmarks/example_json.sh
source "$(dirname "$0")/example_json.sh"
suffix=$$
a=ddprun_la_$suffix
b=ddprun_lb_$suffix
out=$(mktemp -d)
cleanup() {
  ip netns del "$a" 2>/dev/null || true
  ip netns del "$b" 2>/dev/null || true
  rm -rf "$out"
}
trap cleanup EXIT
if ! command -v ip >/dev/null || ! command -v tc >/dev/null || ! ip netns add "$a" 2>/dev/null; then
  echo "ddp_link_bench: cannot create network namespaces here (needs root and iproute2)" >&2
  exit 77
fi
ip netns add "$b"
ip link add "la$suffix" netns "$a" type veth peer name "lb$suffix" netns "$b"
ip -n "$a" addr add 10.213.9.1/24 dev "la$suffix"
ip -n "$b" addr add 10.213.9.2/24 dev "lb$suffix"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "la$suffix" up
ip -n "$b" link set "lb$suffix" up
# netem gives the rate and the delay; a kernel without sch_netem gets the rate alone from tbf (a
# token bucket of 128 KiB), and the table says so.
shaping="$rate, $delay each way"
for end in "$a la$suffix" "$b lb$suffix"; do
  read -r ns dev <<<"$end"
  if ! ip netns exec "$ns" tc qdisc add dev "$dev" root netem delay "$delay" rate "$rate" limit 100000 2>/dev/null; then
    if ! ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$rate" burst 128kb latency 100ms; then
      echo "ddp_link_bench: tc cannot shape the link (neither sch_netem nor sch_tbf in this kernel)" >&2
      exit 77
    fi
    shaping="$rate (tbf; no delay: this kernel has no sch_netem)"
  fi
done

# One run of STEPS steps with FLAGS; prints "BYTES_SENT_BY_A SECONDS".
run() {
  local steps=$1 port=$2
  shift 2
  local tx="/sys/class/net/la$suffix/statistics/tx_bytes"
  local before after
  before=$(ip netns exec "$a" cat "$tx")
  local common=(--nnodes 2 --nproc_per_node 1 --master_addr 10.213.9.1 --master_port "$port"
                --rdzv_conf join_timeout=60)
  local train=(--epochs 1 --batch-size "$batch" --max-steps "$steps" --test-limit 16 "$@")
  ip netns exec "$a" env GLOO_SOCKET_IFNAME="la$suffix" OMP_NUM_THREADS=1 \
    "$ddprun" "${common[@]}" --node_rank 0 --local_addr 10.213.9.1 "$example" "${train[@]}" >"$out/a.out" 2>"$out/a.err" &
  local pid_a=$!
  ip netns exec "$b" env GLOO_SOCKET_IFNAME="lb$suffix" OMP_NUM_THREADS=1 \
    "$ddprun" "${common[@]}" --node_rank 1 --local_addr 10.213.9.2 "$example" "${train[@]}" >"$out/b.out" 2>"$out/b.err" &
  local pid_b=$! rc=0
  wait "$pid_a" || rc=$?
  wait "$pid_b" || rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "ddp_link_bench: the run with ${*:-no flags} failed:" >&2
    tail -20 "$out/a.err" "$out/b.err" >&2
    exit 1
  fi
  after=$(ip netns exec "$a" cat "$tx")
  echo "$((after - before)) $(json <"$out/a.out" | field seconds)"
}

echo "ResNet-18, 2 hosts x 1 worker, batch $batch per rank, link $shaping; steps $steps1 -> $steps2"
echo "| hook | MB sent per step (host A) | vs plain | steps/s | vs plain |"
echo "|---|---:|---:|---:|---:|"
port=29600
plain_bytes="" plain_rate=""
for hook in none fp16 bf16 powersgd:1 powersgd:2 powersgd:4; do
  flags=()
  [[ $hook == none ]] || flags=(--comm-hook "$hook")
  run "$steps1" $((port++)) "${flags[@]}" >"$out/first"
  run "$steps2" $((port++)) "${flags[@]}" >"$out/second"
  read -r bytes1 secs1 <"$out/first"
  read -r bytes2 secs2 <"$out/second"
  per_step=$(echo "($bytes2 - $bytes1) / ($steps2 - $steps1)" | bc -l)
  steps_per_s=$(echo "($steps2 - $steps1) / ($secs2 - $secs1)" | bc -l)
  [[ -n "$plain_bytes" ]] || { plain_bytes=$per_step; plain_rate=$steps_per_s; }
  printf '| %s | %.2f | %.3fx | %.2f | %.2fx |\n' "${hook/none/(plain)}" "$(echo "$per_step / 1000000" | bc -l)" \
    "$(echo "$per_step / $plain_bytes" | bc -l)" "$steps_per_s" "$(echo "$steps_per_s / $plain_rate" | bc -l)"
done
