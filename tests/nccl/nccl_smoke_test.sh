#!/usr/bin/env bash
# nccl_smoke under ddprun with 2 processes. With 2 or more GPUs visible: every check must pass.
# Without a GPU: the job must fail with exit code 1 and name the problem, not hang or crash.
#   nccl_smoke_test.sh DDPRUN NCCL_SMOKE
set -uo pipefail
ddprun=$1 smoke=$2
out=$(timeout 300 "$ddprun" --nproc_per_node 2 "$smoke" 2>&1)
rc=$?
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -ge 2 ]; then
  if [ $rc -ne 0 ] || [ "$(grep -c 'all_reduce ok' <<<"$out")" -lt 2 ]; then
    echo "FAIL: expected every rank to print 'all_reduce ok' (exit $rc):"; echo "$out"; exit 1
  fi
  echo "PASS: NCCL all-reduce on $gpus GPU(s)"; exit 0
fi
if [ $rc -ne 1 ]; then echo "FAIL: without a GPU the job should exit 1, got $rc:"; echo "$out"; exit 1; fi
if ! grep -q 'no usable CUDA device' <<<"$out" || ! grep -q 'Root cause' <<<"$out"; then
  echo "FAIL: expected ddprun's failure report naming 'no usable CUDA device':"; echo "$out"; exit 1
fi
echo "PASS: no GPU here; the failure is reported clearly"
