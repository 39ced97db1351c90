#!/usr/bin/env bash
# The DDP benchmark (ddp_bench.sh: C++ SDK under ddprun vs Python DDP under torchrun, 2 processes)
# repeated RUNS times at two batch sizes, for the spread of the ratio rather than one draw:
#   batch 64 per rank: compute-bound on a 2-core machine (the all-reduce is a few % of a step);
#   batch 16 per rank: communication- and overhead-bound (the all-reduce and per-step framework
#   overhead are comparable to the compute).
# Prints, per batch: the median steps/s per rank of both, and the ratio's median, min and max.
#   benchmarks/ddp_bench_spread.sh BUILD_DIR [RUNS]   (default 3)
set -euo pipefail
build=${1:?usage: ddp_bench_spread.sh BUILD_DIR [RUNS]}
runs=${2:-3}
here=$(cd "$(dirname "$0")" && pwd)
stats() { sort -g | awk '{v[NR]=$1} END {printf "%s %s %s", v[int((NR+1)/2)], v[1], v[NR]}'; }
echo "| batch per rank | regime | C++ SDK steps/s per rank (median) | Python DDP steps/s per rank (median) | ratio median | ratio min - max | runs |"
echo "|---:|---|---:|---:|---:|---:|---:|"
for spec in "64 400 compute-bound" "16 600 communication/overhead-bound"; do
  read -r batch steps regime <<<"$spec"
  cpp=() pyt=() ratio=()
  for ((i = 0; i < runs; i++)); do
    out=$("$here/ddp_bench.sh" "$build" "$steps" "$batch")
    cpp+=("$(grep '^| C++ SDK (ddprun)' <<<"$out" | awk -F'|' '{print $4}')")
    pyt+=("$(grep '^| Python DDP' <<<"$out" | awk -F'|' '{print $4}')")
    ratio+=("$(sed -n 's/.*with 2 processes: \([0-9.]*\)x/\1/p' <<<"$out")")
  done
  read -r cm _ _ <<<"$(printf '%s\n' "${cpp[@]}" | stats)"
  read -r pm _ _ <<<"$(printf '%s\n' "${pyt[@]}" | stats)"
  read -r rm rmin rmax <<<"$(printf '%s\n' "${ratio[@]}" | stats)"
  printf '| %s | %s | %.1f | %.1f | %.2fx | %.2fx - %.2fx | %d |\n' "$batch" "$regime" "$cm" "$pm" "$rm" "$rmin" "$rmax" "$runs"
done
