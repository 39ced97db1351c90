#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and runs the main job.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install_deps.sh"
"$root/scripts/build.sh" -DDDPRUN_BUILD_TESTS=OFF
build="${DDPRUN_BUILD_DIR:-$root/build}"
exec "$root/scripts/main_job.sh" "$build"
