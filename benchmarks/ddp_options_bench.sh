#!/usr/bin/env bash
# The worker SDK's DDP against Python DDP of the same release (Debian's torch), option by option, in
# one run: LeNet-5 at batch 16 and 64 per rank and ResNet-18 at batch 8, 2 ranks under ddprun, 1
# thread each, with each of DDP's options on (and broadcast_buffers off) in turn. Steps/s of both,
# their ratio, the SDK against its own default, and rank 0's peak RSS (gradient_as_bucket_view
# should save about the gradients' size). Each configuration runs REPEATS times, C++ and Python
# alternating so that drifts in the machine's load hit both alike; the medians are shown.
#   benchmarks/ddp_options_bench.sh BUILD_DIR [LENET_STEPS] [RESNET_STEPS] [REPEATS]
set -euo pipefail
build=${1:?usage: ddp_options_bench.sh BUILD_DIR [LENET_STEPS] [RESNET_STEPS]}
lenet_steps=${2:-300}
resnet_steps=${3:-20}
repeats=${4:-3}
here=$(cd "$(dirname "$0")" && pwd)
export OMP_NUM_THREADS=1
py=/usr/bin/python3
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" | tail -1; }
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
run() {  # MODEL OPTION STEPS BATCH PROGRAM...
  local model=$1 option=$2 steps=$3 batch=$4
  shift 4
  DDP_BENCH_MODEL=$model DDP_BENCH_OPTION=$option "$build/launcher/ddprun" --nproc_per_node 2 "$@" "$steps" "$batch" \
    2>/dev/null
}
options=(default find_unused_parameters gradient_as_bucket_view static_graph no_broadcast_buffers)
echo "DDP options: C++ SDK vs Python DDP ($($py -c 'import torch; print(torch.__version__)')), 2 ranks, gloo on CPU, 1 thread per rank"
echo "(medians of $repeats runs)"
echo "| model | batch | option | C++ steps/s | Python steps/s | C++ / Python | C++ / C++ default | C++ peak RSS MiB | Python peak RSS MiB |"
echo "|---|---:|---|---:|---:|---:|---:|---:|---:|"
for spec in "lenet 16 $lenet_steps" "lenet 64 $lenet_steps" "resnet18 8 $resnet_steps"; do
  read -r model batch steps <<<"$spec"
  base=""
  for option in "${options[@]}"; do
    cs=() ps=() crss=() prss=()
    for ((i = 0; i < repeats; i++)); do
      cpp=$(run "$model" "$option" "$steps" "$batch" "$build/benchmarks/ddp_bench")
      pyo=$(run "$model" "$option" "$steps" "$batch" "$py" "$here/ddp_bench.py")
      cs+=("$(echo "$cpp" | field steps_per_s)"); ps+=("$(echo "$pyo" | field steps_per_s)")
      crss+=("$(echo "$cpp" | field peak_rss_mb)"); prss+=("$(echo "$pyo" | field peak_rss_mb)")
    done
    c=$(printf '%s\n' "${cs[@]}" | median); p=$(printf '%s\n' "${ps[@]}" | median)
    [[ -n "$base" ]] || base=$c
    printf '| %s | %s | %s | %.1f | %.1f | %.2fx | %.3f | %.0f | %.0f |\n' "$model" "$batch" "$option" "$c" "$p" \
      "$(echo "$c/$p" | bc -l)" "$(echo "$c/$base" | bc -l)" "$(printf '%s\n' "${crss[@]}" | median)" \
      "$(printf '%s\n' "${prss[@]}" | median)"
  done
done
