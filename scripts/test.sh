#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs every test.
#   scripts/test.sh [ctest arguments, e.g. -L unit or -R Launcher]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install_deps.sh"
"$root/scripts/build.sh"
cd "${DDPRUN_BUILD_DIR:-$root/build}"
ctest --output-on-failure --timeout 600 -j "${DDPRUN_TEST_JOBS:-2}" "$@"
