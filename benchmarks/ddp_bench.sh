#!/usr/bin/env bash
# C++ worker SDK vs Python DDP (Debian's torch 1.13), same model, data and threads, in one run:
# 1 process and 2 processes each (C++ under ddprun, Python under torchrun), plus overlap. The C++
# SDK runs twice with 2 processes: with its default direct Gloo reducer and with
# DDP_BENCH_REDUCER=process-group (ProcessGroupGloo's all-reduce, as Python DDP uses).
#   benchmarks/ddp_bench.sh BUILD_DIR [STEPS] [BATCH_PER_RANK]
set -euo pipefail
build=${1:?usage: ddp_bench.sh BUILD_DIR [STEPS] [BATCH]}
steps=${2:-300}
batch=${3:-64}
here=$(cd "$(dirname "$0")" && pwd)
export OMP_NUM_THREADS=1
py=/usr/bin/python3
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" | tail -1; }
port() { $py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

cpp1=$(env -u RANK "$build/benchmarks/ddp_bench" "$steps" "$batch")
cpp2=$("$build/launcher/ddprun" --nproc_per_node 2 "$build/benchmarks/ddp_bench" "$steps" "$batch" 2>/dev/null)
cpp2pg=$(DDP_BENCH_REDUCER=process-group "$build/launcher/ddprun" --nproc_per_node 2 "$build/benchmarks/ddp_bench" \
         "$steps" "$batch" 2>/dev/null)
py1=$($py "$here/ddp_bench.py" "$steps" "$batch")
# torchrun through tests/python/torchrun_nolibuv.py, and its workers with ddprun's Python hook: on a
# PyTorch >= 2.4 without libuv (Debian 13's 2.6) neither starts otherwise; elsewhere both are no-ops.
py2=$(PYTHONPATH="$here/../launcher/workers/python_hook${PYTHONPATH:+:$PYTHONPATH}" \
      $py "$here/../tests/python/torchrun_nolibuv.py" --nproc_per_node 2 --master_port "$(port)" --redirects 1 --tee 1 \
      "$here/ddp_bench.py" "$steps" "$batch" 2>/dev/null)

row() {  # name, 1-proc output, 2-proc output
  local s1 s2 c2 d2
  s1=$(echo "$2" | field steps_per_s); s2=$(echo "$3" | field steps_per_s)
  c2=$(echo "$3" | field compute_ms); d2=$(echo "$3" | field ddp_step_ms)
  printf '| %s | %.1f | %.1f | %.2fx | %.2f | %.2f | %.2fx |\n' "$1" "$s1" "$s2" "$(echo "$s2*2/$s1" | bc -l)" \
    "$c2" "$d2" "$(echo "$d2/$c2" | bc -l)"
}
echo "LeNet-5, batch $batch per rank, $steps steps, gloo on CPU, 1 thread per process"
echo "| implementation | steps/s, 1 proc | steps/s per rank, 2 procs | samples/s scaling 2 vs 1 | compute-only step ms | DDP step ms | DDP/compute |"
echo "|---|---:|---:|---:|---:|---:|---:|"
row "C++ SDK (ddprun)" "$cpp1" "$cpp2"
row "C++ SDK, ProcessGroupGloo reducer" "$cpp1" "$cpp2pg"
row "Python DDP (torchrun)" "$py1" "$py2"
cpp=$(echo "$cpp2" | field steps_per_s); pyt=$(echo "$py2" | field steps_per_s)
printf 'C++ SDK / Python DDP steps/s with 2 processes: %.2fx\n' "$(echo "$cpp/$pyt" | bc -l)"
