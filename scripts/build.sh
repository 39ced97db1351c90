#!/usr/bin/env bash
# Configures and builds ddprun into build/ (Release with debug info). Extra arguments go to cmake.
#   [DDPRUN_BUILD_TARGETS="ddprun ..."] scripts/build.sh [-DDDPRUN_BUILD_TESTS=OFF ...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${DDPRUN_BUILD_DIR:-$root/build}"
generator=()
if command -v ninja >/dev/null 2>&1 && [[ ! -f "$build/Makefile" ]]; then generator=(-G Ninja); fi
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE="${DDPRUN_BUILD_TYPE:-RelWithDebInfo}" "$@"
# Two jobs: LibTorch translation units need about 1.5 GiB each. DDPRUN_BUILD_TARGETS: only those.
targets=()
for t in ${DDPRUN_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" --parallel "${DDPRUN_JOBS:-2}" "${targets[@]}"
