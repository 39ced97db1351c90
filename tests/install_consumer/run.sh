#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, builds tests/install_consumer against it with
# find_package(ddprun), and runs the result alone and under ddprun.
#   run.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > /dev/null
test -f "$work/prefix/include/ddprun/worker.hpp"
test -f "$work/prefix/lib/cmake/ddprun/ddprunConfig.cmake"
cmake -S "$here" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$work/build" > /dev/null
env -u RANK "$work/build/consumer" | grep -q "consumer ok: world 1"
"$build/launcher/ddprun" --nproc_per_node 2 "$work/build/consumer" 2>/dev/null | grep -q "consumer ok: world 2, 5 samples"
echo "install consumer: find_package(ddprun) + ddprun::worker built and ran (alone and under ddprun)"
