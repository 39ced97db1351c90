#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and runs the main job.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install_deps.sh" --main-job
build="${DDPRUN_BUILD_DIR:-$root/build}"
# A fresh build directory is configured without the tests; one scripts/test.sh configured keeps
# them (switching the setting back and forth would rebuild everything each time). Either way only
# what the main job runs is built.
settings=()
[[ -f "$build/CMakeCache.txt" ]] || settings=(-DDDPRUN_BUILD_TESTS=OFF)
DDPRUN_BUILD_TARGETS="ddprun fashion_mnist_lenet" "$root/scripts/build.sh" "${settings[@]}"
exec "$root/scripts/main_job.sh" "$build"
