#!/usr/bin/env bash
# The main job on an already built tree: two PyTorch gloo workers rendezvous through the ddprun
# store daemon and all-reduce a tensor.
set -euo pipefail
build=${1:?usage: main_job.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
exec /usr/bin/python3 "$root/tests/python/test_store_interop.py" "$build/rendezvous/ddprun-rendezvous" GlooInitTest
