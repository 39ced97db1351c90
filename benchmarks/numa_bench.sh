#!/usr/bin/env bash
# --numa_binding against none, side by side in one run: the C++ SDK's DDP benchmark (LeNet-5, gloo
# on CPU) with 2 workers under ddprun, on an idle machine and next to one busy-looping process
# (a neighbour on a shared node). Runs are interleaved and each figure is the median of RUNS.
#   benchmarks/numa_bench.sh BUILD_DIR [STEPS] [RUNS]
set -euo pipefail
build=${1:?usage: numa_bench.sh BUILD_DIR [STEPS] [RUNS]}
steps=${2:-300}
runs=${3:-3}
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" | tail -1; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
run() {  # binding ("" = none) -> steps/s per rank
  local flags=()
  [ -n "$1" ] && flags=(--numa_binding "$1")
  "$build/launcher/ddprun" --nproc_per_node 2 "${flags[@]}" "$build/benchmarks/ddp_bench" "$steps" 64 2>/dev/null |
    field steps_per_s
}
modes=(none node exclusive)
echo "machine: $(nproc) CPUs, $(ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l) NUMA node(s); $steps steps, median of $runs"
echo "| neighbour | binding | steps/s per rank | vs none |"
echo "|---|---|---:|---:|"
for neighbour in idle busy; do
  hog=
  if [ "$neighbour" = busy ]; then
    sh -c 'while :; do :; done' &
    hog=$!
  fi
  declare -A got=()
  for ((i = 0; i < runs; i++)); do
    for m in "${modes[@]}"; do got[$m]+="$(run "$([ "$m" = none ] || echo "$m")") "; done
  done
  [ -n "$hog" ] && kill "$hog"
  base=$(echo "${got[none]}" | tr ' ' '\n' | grep . | median)
  for m in "${modes[@]}"; do
    v=$(echo "${got[$m]}" | tr ' ' '\n' | grep . | median)
    printf '| %s | %s | %.1f | %.2fx |\n' "$neighbour" "$m" "$v" "$(echo "$v/$base" | bc -l)"
  done
  unset got
done
