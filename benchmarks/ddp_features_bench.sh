#!/usr/bin/env bash
# The examples' DDP features side by side in one run, 2 workers under ddprun on this machine:
# LeNet-5 on Fashion-MNIST for EPOCHS epochs (batch 64 per rank) plain, with each communication
# hook (--comm-hook) and with the optimizer's state sharded (--zero); ResNet-18 for STEPS steps
# (batch 32 per rank) plain and with --sync-bn. Prints samples/s, its ratio to the plain run,
# the final training loss and the test accuracy.
#   benchmarks/ddp_features_bench.sh BUILD_DIR [EPOCHS] [STEPS]
set -euo pipefail
build=${1:?usage: ddp_features_bench.sh BUILD_DIR [EPOCHS] [STEPS]}
epochs=${2:-3}
steps=${3:-20}
export OMP_NUM_THREADS=1
ddprun="$build/launcher/ddprun"
# shellcheck source=benchmarks/example_json.sh
source "$(dirname "$0")/example_json.sh"
run() { "$ddprun" --nproc_per_node 2 "$@" 2>/dev/null | json; }
echo "| example | flags | samples/s | vs plain | final loss | test accuracy |"
echo "|---|---|---:|---:|---:|---:|"
table() {
  local example=$1 base=$2
  shift 2
  local plain=""
  for flags in "$@"; do
    # shellcheck disable=SC2086  # the flags are words
    out=$(run "$build/examples/$example" $base $flags)
    rate=$(echo "$out" | field samples_per_s)
    [[ -n "$plain" ]] || plain=$rate
    printf '| %s | %s | %.0f | %.2fx | %s | %s |\n' "$example" "${flags:-(plain)}" "$rate" \
      "$(echo "$rate / $plain" | bc -l)" "$(echo "$out" | field final_loss)" "$(echo "$out" | field test_accuracy)"
  done
}
table fashion_mnist_lenet "--epochs $epochs" "" "--comm-hook allreduce" "--comm-hook fp16" "--comm-hook bf16" \
  "--comm-hook powersgd:1" "--comm-hook powersgd:4" "--zero"
table resnet18 "--epochs 1 --batch-size 32 --max-steps $steps --test-limit 1000" "" "--sync-bn"
