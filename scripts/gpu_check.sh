#!/usr/bin/env bash
# The GPU path on a machine with NVIDIA GPUs and a pip-installed CUDA PyTorch (no Boost needed there):
# builds the worker SDK, the examples, nccl_smoke and the parity worker against that PyTorch's
# LibTorch and NCCL, then, under a ddprun built elsewhere (DDPRUN=path; the launcher needs no GPU):
#   1. nccl_smoke on every GPU (--nproc_per_node gpu): NCCL through ddprun's store;
#   2. checkpoints and quantization-aware training held to Python's on CUDA (the interop test);
#   3. the fashion_mnist_lenet, resnet18 and fashion_mnist_qat examples on CUDA (NCCL, one rank per GPU);
#   4. the parity suite on CUDA against Python DDP of the same PyTorch, bit for bit: the cases with at
#      most one rank per GPU with NCCL, then every case with Gloo on CUDA tensors (any number of
#      ranks on the GPUs there are);
#   5. fault-tolerant replica groups on CUDA: two groups of fashion_mnist_lenet --fault-tolerant
#      (NCCL inside a group, Gloo on CUDA tensors across), one SIGKILLed mid-epoch, the commits of both
#      checked bit for bit (tests/python/test_fault_tolerance.py's example test, both groups C++).
# usage: DDPRUN=/path/to/ddprun scripts/gpu_check.sh [BUILD_DIR]
# Optional: GLOO_INCLUDE_DIR (gloo's headers: the Gloo backend against a wheel, which ships none),
# NLOHMANN_INCLUDE_DIR (nlohmann/json.hpp, for the parity worker), FASHION_MNIST_DIR, OUT (logs),
# DDPRUN_RENDEZVOUS (the daemon, for step 5; default beside ddprun's build), PREFIX_PATH (more CMake
# prefixes: where Boost's, nlohmann_json's and OpenSSL's headers are, which fault tolerance needs),
# ONLY (some of smoke,interop,examples,parity,ft: build and run just those, when GPU time is short).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
out=${OUT:-$build/gpu-check}
mkdir -p "$out"
ddprun=${DDPRUN:-$root/build/launcher/ddprun}
daemon=${DDPRUN_RENDEZVOUS:-$(dirname "$ddprun")/../rendezvous/ddprun-rendezvous}
only=${ONLY:-}
want() { [[ -z $only || ",$only," == *",$1,"* ]]; }
python=${PYTHON:-python3}
[[ -x $ddprun ]] || { echo "gpu_check: no ddprun at $ddprun: build it (scripts/build.sh) or set DDPRUN" >&2; exit 2; }
torch_prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)') ||
  { echo "gpu_check: $python has no torch" >&2; exit 2; }
site=$(dirname "$(dirname "$torch_prefix")")
nccl=()
if [[ -f $site/nvidia/nccl/include/nccl.h ]]; then  # the NCCL the wheel itself loads
  nccl=(-DDDPRUN_NCCL_INCLUDE_DIR="$site/nvidia/nccl/include"
        -DDDPRUN_NCCL_LIBRARY="$(ls "$site"/nvidia/nccl/lib/libnccl.so* | head -1)")
fi
extra=()
[[ -n ${GLOO_INCLUDE_DIR:-} ]] && extra+=(-DDDPRUN_GLOO_INCLUDE_DIR="$GLOO_INCLUDE_DIR")
[[ -n ${NLOHMANN_INCLUDE_DIR:-} ]] && extra+=(-DDDPRUN_NLOHMANN_JSON_INCLUDE_DIR="$NLOHMANN_INCLUDE_DIR")
status=0
step() { echo "== $*"; }
fail() { echo "FAILED: $*"; status=1; }

step "build ($build)"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDPRUN_WORKER_ONLY=ON \
  -DCMAKE_PREFIX_PATH="$torch_prefix${PREFIX_PATH:+;$PREFIX_PATH}" "${nccl[@]}" "${extra[@]}" \
  > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
grep "ddprun:" "$out/configure.log"
targets=()
if [[ -n $only ]]; then
  want smoke && targets+=(nccl_smoke)
  want interop && targets+=(sdk_test_worker)
  want examples && targets+=(fashion_mnist_lenet resnet18 fashion_mnist_qat)
  want parity && targets+=(parity_worker)
  want ft && targets+=(fashion_mnist_lenet)
fi
ninja -C "$build" "${targets[@]}" > "$out/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$out/build.log" | head -30; exit 1; }
grep -c "warning:" "$out/build.log" | sed 's/^/compiler warnings: /'

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') || gpus=0
step "$gpus GPU(s); PyTorch $("$python" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "NCCL", ".".join(map(str, torch.cuda.nccl.version())))')"

if want smoke; then
  step "nccl_smoke under ddprun --nproc_per_node gpu"
  "$ddprun" --nproc_per_node gpu "$build/examples/nccl_smoke" > "$out/nccl_smoke.log" 2>&1 || fail "nccl_smoke"
  tail -3 "$out/nccl_smoke.log"
fi

if want interop && [[ -x $build/tests/sdk_test_worker ]]; then
  step "checkpoints and QAT against Python on CUDA (test_worker_sdk_interop.py, DDPRUN_INTEROP_DEVICE=cuda)"
  DDPRUN_INTEROP_DEVICE=cuda "$python" "$root/tests/python/test_worker_sdk_interop.py" "$ddprun" \
    "$build/tests/sdk_test_worker" > "$out/interop_cuda.log" 2>&1 || fail "interop (CUDA)"
  grep -E "^(Ran|OK|FAILED)|^(FAIL|ERROR):" "$out/interop_cuda.log" | head -20
fi

data=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
if ! want examples; then
  :
elif [[ -d $data ]]; then
  n=0
  for example in "fashion_mnist_lenet --epochs 2" "resnet18 --epochs 1 --batch-size 128" \
                 "resnet18 --epochs 1 --batch-size 128 --sync-bn --comm-hook fp16" "fashion_mnist_qat --epochs 1"; do
    name=${example%% *}
    n=$((n + 1))
    step "example: $example"
    "$ddprun" --nproc_per_node gpu "$build/examples/$name" ${example#"$name"} --data-dir "$data" \
      > "$out/example$n.log" 2>&1 || fail "$example"
    grep -o '{"example".*' "$out/example$n.log" | tail -1
  done
else
  echo "no Fashion-MNIST at $data (set FASHION_MNIST_DIR): examples skipped"
fi
if ! want parity; then
  :
elif [[ -x $build/tests/parity_worker ]]; then
  step "parity with Python DDP on CUDA, NCCL backend (cases of at most $gpus ranks)"
  cases=()
  for name in $(PARITY_DIR="$root/tests/parity" "$python" -c "import os, sys
sys.path.insert(0, os.environ['PARITY_DIR'])
import parity
print(' '.join(n for n, c in parity.CASES.items() if c['world'] <= $gpus))"); do
    cases+=(-k "*.test_$name")
  done
  if (( ${#cases[@]} )); then
    DDPRUN_PARITY_DEVICE=cuda DDPRUN_PARITY_BACKEND=nccl "$python" "$root/tests/parity/test_parity.py" "$ddprun" \
      "$build/tests/parity_worker" "${cases[@]}" > "$out/parity_nccl.log" 2>&1 || fail "parity (NCCL)"
    grep -E "^(Ran|OK|FAILED)|differ|failed" "$out/parity_nccl.log" | head -10
  fi
  jobs=${PARITY_JOBS:-4}
  step "parity with Python DDP on CUDA, Gloo backend (every case; $jobs at a time)"
  names=($("$python" "$root/tests/parity/parity.py" cases))
  pids=()
  for ((j = 0; j < jobs; j++)); do
    shard=()
    for ((i = j; i < ${#names[@]}; i += jobs)); do shard+=(-k "*.test_${names[i]}"); done
    DDPRUN_PARITY_DEVICE=cuda DDPRUN_PARITY_BACKEND=gloo "$python" "$root/tests/parity/test_parity.py" "$ddprun" \
      "$build/tests/parity_worker" "${shard[@]}" > "$out/parity_gloo_cuda.$j" 2>&1 &
    pids+=($!)
  done
  for ((j = 0; j < jobs; j++)); do wait "${pids[j]}" || fail "parity (Gloo, CUDA), shard $j"; done
  cat "$out"/parity_gloo_cuda.[0-9]* > "$out/parity_gloo_cuda.log" && rm -f "$out"/parity_gloo_cuda.[0-9]*
  grep -E "^(Ran|OK|FAILED)" "$out/parity_gloo_cuda.log"
  grep -E "^(FAIL|ERROR):|differ|failed" "$out/parity_gloo_cuda.log" | head -20
else
  echo "no parity worker (nlohmann/json.hpp not found: set NLOHMANN_INCLUDE_DIR)"
fi

if want ft; then
  step "fault-tolerant replica groups on CUDA: two fashion_mnist_lenet groups, one killed"
  if ! "$build/examples/fashion_mnist_lenet" --help 2>/dev/null | grep -q -- --fault-tolerant; then
    fail "the SDK was built without fault tolerance (Boost, nlohmann_json or OpenSSL not found: set PREFIX_PATH)"
  elif [[ ! -x $daemon ]]; then
    fail "no ddprun-rendezvous at $daemon (set DDPRUN_RENDEZVOUS)"
  else
    # The test reads Fashion-MNIST where the example does by default.
    DDPRUN_FT_EXAMPLES=c++,c++ "$python" "$root/tests/python/test_fault_tolerance.py" "$ddprun" "$daemon" \
      "$build/examples/fashion_mnist_lenet" \
      FaultTolerance.test_the_examples_heal_a_killed_group_and_train_every_sample_of_an_epoch_once \
      > "$out/ft_cuda.log" 2>&1 || fail "fault tolerance (CUDA)"
    grep -E "^(Ran|OK|FAILED)|^(FAIL|ERROR):|Error" "$out/ft_cuda.log" | head -20
  fi
fi

step "gpu_check: $([[ $status == 0 ]] && echo passed || echo FAILED)"
exit $status
