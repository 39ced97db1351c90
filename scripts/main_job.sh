#!/usr/bin/env bash
# The main job on an already built tree: ddprun launches 2 workers of the C++ example
# fashion_mnist_lenet, which trains LeNet-5 on Fashion-MNIST with the worker SDK's
# DistributedDataParallel (Gloo), rendezvousing through ddprun's store. Rank 0 prints per-epoch
# loss, time and samples/s, the test accuracy, and a final JSON line.
#   scripts/main_job.sh BUILD_DIR [extra training flags, e.g. --epochs 1]
set -euo pipefail
build=${1:?usage: main_job.sh BUILD_DIR [training flags]}
shift
exec "$build/launcher/ddprun" --nproc_per_node 2 "$build/examples/fashion_mnist_lenet" --epochs 3 "$@"
