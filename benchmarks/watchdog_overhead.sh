#!/usr/bin/env bash
# What progress tracking costs a training job: the C++ SDK's DDP benchmark (ddp_bench) under
# ddprun, 2 processes, with and without it, in alternating runs so that drift on a shared machine
# falls on both sides alike.
#   off: the workers get no progress page (DDPRUN_PROGRESS_FILE removed, so the SDK's progress
#        calls do nothing) and ddprun looks for no hang;
#   on:  --hang_timeout 60: every DDP step bumps the page, ddprun reads the pages, the ranks' CPU
#        time and the worker store's changes once a second.
# Prints each run's steps/s and the median on/off ratio (1.00 = no cost).
#   benchmarks/watchdog_overhead.sh BUILD_DIR [STEPS] [BATCH_PER_RANK] [PAIRS]
set -euo pipefail
build=${1:?usage: watchdog_overhead.sh BUILD_DIR [STEPS] [BATCH] [PAIRS]}
steps=${2:-400}
batch=${3:-64}
pairs=${4:-5}
export OMP_NUM_THREADS=1
ddprun="$build/launcher/ddprun"
bench="$build/benchmarks/ddp_bench"
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" | tail -1; }
run_off() { "$ddprun" --nproc_per_node 2 env -u DDPRUN_PROGRESS_FILE "$bench" "$steps" "$batch" 2>/dev/null | field steps_per_s; }
run_on() { "$ddprun" --nproc_per_node 2 --hang_timeout 60 "$bench" "$steps" "$batch" 2>/dev/null | field steps_per_s; }
off=() on=() ratios=()
for ((i = 0; i < pairs; i++)); do
  if ((i % 2 == 0)); then a=$(run_off); b=$(run_on); else b=$(run_on); a=$(run_off); fi
  off+=("$a") on+=("$b") ratios+=("$(echo "$b / $a" | bc -l)")
  printf 'pair %d: off %.1f steps/s, on %.1f steps/s, on/off %.3f\n' "$((i + 1))" "$a" "$b" "${ratios[-1]}"
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
printf 'LeNet-5, batch %s per rank, %s steps, 2 processes, %s pairs\n' "$batch" "$steps" "$pairs"
printf 'median steps/s: off %.1f, on %.1f; median on/off ratio %.3f (min %.3f, max %.3f)\n' \
  "$(median "${off[@]}")" "$(median "${on[@]}")" "$(median "${ratios[@]}")" \
  "$(printf '%s\n' "${ratios[@]}" | sort -g | head -1)" "$(printf '%s\n' "${ratios[@]}" | sort -g | tail -1)"
