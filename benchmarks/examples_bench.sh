#!/usr/bin/env bash
# 1 worker vs 2 workers under ddprun for the LeNet and ResNet-18 examples, in one run.
# LeNet: EPOCHS full epochs, batch 64 per rank. ResNet-18: STEPS steps per worker at batch 256 per
# rank (lr 0.1 for 256, scaled to 0.2 for 512 on two workers), test accuracy on 2000 test images.
#   benchmarks/examples_bench.sh BUILD_DIR [EPOCHS] [STEPS]
set -euo pipefail
build=${1:?usage: examples_bench.sh BUILD_DIR [EPOCHS] [STEPS]}
epochs=${2:-1}
steps=${3:-3}
export OMP_NUM_THREADS=1
ddprun="$build/launcher/ddprun"
# shellcheck source=benchmarks/example_json.sh
source "$(dirname "$0")/example_json.sh"
row() {
  local out=$1 label=$2
  printf '| %s | %s | %.0f | %.1f | %.4f |\n' "$label" "$(echo "$out" | field world_size)" \
    "$(echo "$out" | field samples_per_s)" "$(echo "$(echo "$out" | field seconds) / $3" | bc -l)" \
    "$(echo "$out" | field test_accuracy)"
}
echo "| example | workers | samples/s | seconds per epoch (or per $steps steps) | test accuracy |"
echo "|---|---:|---:|---:|---:|"
for n in 1 2; do
  out=$("$ddprun" --nproc_per_node $n "$build/examples/fashion_mnist_lenet" --epochs "$epochs" 2>/dev/null | json)
  row "$out" "fashion_mnist_lenet, $epochs epoch(s), batch 64/rank" "$epochs"
done
for n in 1 2; do
  out=$("$ddprun" --nproc_per_node $n "$build/examples/resnet18" --epochs 1 --batch-size 256 --lr 0.1 \
        --max-steps "$steps" --test-limit 2000 2>/dev/null | json)
  row "$out" "resnet18, $steps steps, batch 256/rank, lr 0.1 x global/256" 1
done
