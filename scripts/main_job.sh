#!/usr/bin/env bash
# The main job on an already built tree: ddprun launches 2 workers that train LeNet on Fashion-MNIST
# with PyTorch DistributedDataParallel (gloo), rendezvousing through ddprun's store.
#   scripts/main_job.sh BUILD_DIR [extra training flags, e.g. --epochs 1]
set -euo pipefail
build=${1:?usage: main_job.sh BUILD_DIR [training flags]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
# Debian's torch lives with /usr/bin/python3 (a python3 earlier on PATH may lack it).
export PYTHON_EXEC=${PYTHON_EXEC:-/usr/bin/python3}
exec "$build/launcher/ddprun" --nproc_per_node 2 "$root/examples/python/fashion_mnist_ddp.py" --epochs 3 "$@"
