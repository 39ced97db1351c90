#!/usr/bin/env bash
# Builds ddprun's launcher, store and their tests with a sanitizer (no Torch parts: LibTorch is not
# built with one) into build-SANITIZER/ and runs the tests selected by the ctest arguments; a
# sanitizer report fails the test that caused it (-fno-sanitize-recover).
#   scripts/sanitize.sh thread|address|undefined|address,undefined [ctest arguments, e.g. -L unit]
# Targets: which binaries to build (default: all; e.g. DDPRUN_SANITIZE_TARGETS="test_rendezvous").
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
san=${1:?usage: scripts/sanitize.sh thread|address|undefined|address,undefined [ctest arguments]}
shift
build="${DDPRUN_SANITIZE_BUILD_DIR:-$root/build-${san/,/-}}"
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
mkdir -p "$build"
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDPRUN_WITH_TORCH=OFF \
  -DDDPRUN_SANITIZE="$san" > "$build/configure.log" 2>&1 || { tail -20 "$build/configure.log"; exit 1; }
# shellcheck disable=SC2086
cmake --build "$build" --parallel "$(nproc)" ${DDPRUN_SANITIZE_TARGETS:+--target $DDPRUN_SANITIZE_TARGETS}
cd "$build"
# Reports name the source line; a thread report shows both stacks in full.
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1 second_deadlock_stack=1 history_size=4}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1 abort_on_error=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1 halt_on_error=1}"
ctest --output-on-failure --no-tests=error --timeout 900 -j "${DDPRUN_TEST_JOBS:-2}" "$@"
