#!/usr/bin/env bash
# Quantization-aware training, C++ against Python, in one run: examples/fashion_mnist_qat (the SDK's
# qat modules) and examples/python/fashion_mnist_qat.py (torch.ao.quantization), the same LeNet-5
# with BatchNorm, the same flow (EPOCHS FP32 epochs, 5 QAT epochs with torchvision's observer and
# BatchNorm schedule, convert), 2 workers under ddprun. Prints each side's FP32, fake-quant and
# int8 test accuracy and training time with their ratio, then the C++ side's int8 inference time
# at batch 256 per engine against FP32 and the two models' sizes.
#   benchmarks/qat_bench.sh BUILD_DIR [EPOCHS] [TRAIN_LIMIT]
set -euo pipefail
build=${1:?usage: qat_bench.sh BUILD_DIR [EPOCHS] [TRAIN_LIMIT]}
epochs=${2:-3}
limit=${3:-60000}
export OMP_NUM_THREADS=1
ddprun="$build/launcher/ddprun"
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=benchmarks/example_json.sh
source "$here/example_json.sh"
cpp=$("$ddprun" --nproc_per_node 2 "$build/examples/fashion_mnist_qat" --epochs "$epochs" --train-limit "$limit" \
  2>/dev/null | json)
py=$("$ddprun" --nproc_per_node 2 /usr/bin/python3 "$here/../examples/python/fashion_mnist_qat.py" --epochs "$epochs" \
  --train-limit "$limit" 2>/dev/null | json)
engine=$(echo "$cpp" | sed -n 's/.*"int8_engine": "\([a-z0-9]*\)".*/\1/p')
py_int8=$(echo "$py" | python3 -c "import json,sys; print(json.load(sys.stdin)['int8_accuracy']['$engine'])")
echo "| side | FP32 accuracy | fake-quant accuracy | int8 accuracy ($engine) | training s |"
echo "|---|---:|---:|---:|---:|"
printf '| C++ (ddprun SDK) | %s | %s | %s | %s |\n' "$(echo "$cpp" | field fp32_accuracy)" \
  "$(echo "$cpp" | field fake_quant_accuracy)" "$(echo "$cpp" | field int8_accuracy)" "$(echo "$cpp" | field train_seconds)"
printf '| Python (torch.ao.quantization) | %s | %s | %s | %s |\n' "$(echo "$py" | field fp32_accuracy)" \
  "$(echo "$py" | field fake_quant_accuracy)" "$py_int8" "$(echo "$py" | field train_seconds)"
printf 'training time, Python / C++: %.2fx\n' "$(echo "$(echo "$py" | field train_seconds) / $(echo "$cpp" | field train_seconds)" | bc -l)"
echo "$cpp" | python3 -c '
import json, sys
j = json.load(sys.stdin)
fp32 = j["fp32_ms_per_batch"]
print("| model | ms per batch of 256 (rank 0) | vs FP32 | bytes | vs FP32 |")
print("|---|---:|---:|---:|---:|")
print("| FP32 | %.2f | 1.00x | %d | 100%% |" % (fp32, j["fp32_bytes"]))
for engine, ms in sorted(j["int8_ms_per_batch"].items()):
    print("| int8, %s | %.2f | %.2fx faster | %d | %.1f%% |" % (engine, ms, fp32 / ms, j["int8_bytes"],
                                                        100.0 * j["int8_bytes"] / j["fp32_bytes"]))'
