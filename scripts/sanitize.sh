#!/usr/bin/env bash
# Builds ddprun's launcher, store and their tests with a sanitizer (no Torch parts: LibTorch is not
# built with one) into build-SANITIZER/ and runs the tests selected by the ctest arguments; a
# sanitizer report fails the test that caused it (-fno-sanitize-recover).
#   scripts/sanitize.sh thread|address|undefined|address,undefined [ctest arguments, e.g. -L unit]
# Targets: which binaries to build (default: all; e.g. DDPRUN_SANITIZE_TARGETS="test_rendezvous").
# Time box: DDPRUN_SANITIZE_TIME_BOX=MINUTES bounds the whole run, build included: the selected
# tests of the unit tier run first and always; the others follow in batches of
# DDPRUN_SANITIZE_BATCH (default 4), and none starts once fewer than DDPRUN_SANITIZE_BATCH_RESERVE
# minutes (default 5) of the box are left (scripts/ctest_boxed.sh). A build the box cuts short runs
# no test. The tests that did not run are named, and the run fails only on a failed test (or
# build), not on the box; the outcome's line is in box-summary.txt of the build directory.
set -euo pipefail
started=$(date +%s)
root=$(cd "$(dirname "$0")/.." && pwd)
san=${1:?usage: scripts/sanitize.sh thread|address|undefined|address,undefined [ctest arguments]}
shift
build="${DDPRUN_SANITIZE_BUILD_DIR:-$root/build-${san/,/-}}"
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
mkdir -p "$build"
rm -f "$build/box-summary.txt"
# -O1, as the sanitizers' own documentation advises: reports as precise, a third less compile time
# than -O2 here (the Boost.Asio translation units dominate a build).
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDPRUN_WITH_TORCH=OFF \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DDDPRUN_SANITIZE="$san" > "$build/configure.log" 2>&1 || { tail -20 "$build/configure.log"; exit 1; }
box_end=$((started + ${DDPRUN_SANITIZE_TIME_BOX:-0} * 60))
build_rc=0
# shellcheck disable=SC2086
build_command=(cmake --build "$build" --parallel "$(nproc)" ${DDPRUN_SANITIZE_TARGETS:+--target $DDPRUN_SANITIZE_TARGETS})
if [[ -z "${DDPRUN_SANITIZE_TIME_BOX:-}" ]]; then
  "${build_command[@]}" || build_rc=$?
elif ((box_end > $(date +%s))); then
  # timeout (without --foreground) runs the build in a process group of its own and signals the
  # whole group when the box ends: ninja and the compilers stop with cmake, none is left running
  # into what comes next. Stopping this script stops that group too.
  timeout --kill-after=30s "$((box_end - $(date +%s)))s" "${build_command[@]}" &
  build_pid=$!
  trap 'kill -TERM -- "-$build_pid" 2>/dev/null; exit 130' INT TERM
  wait "$build_pid" || build_rc=$?
  trap - INT TERM
else
  build_rc=124  # no time left to build
fi
if [[ -n "${DDPRUN_SANITIZE_TIME_BOX:-}" ]] &&
  { ((build_rc == 124)) || (((build_rc == 137 || build_rc == 0) && $(date +%s) >= box_end)); }; then
  echo "sanitize: the time box (${DDPRUN_SANITIZE_TIME_BOX} min) was spent building; no test ran"
  echo "ran no test: the time box (${DDPRUN_SANITIZE_TIME_BOX} min) was spent building" > "$build/box-summary.txt"
  exit 0
fi
((build_rc == 0)) || exit "$build_rc"
cd "$build"
# Reports name the source line; a thread report shows both stacks in full.
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1 second_deadlock_stack=1 history_size=4}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1 abort_on_error=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1 halt_on_error=1}"
run_tests() { ctest --output-on-failure --no-tests=error --timeout 900 -j "${DDPRUN_TEST_JOBS:-2}" "$@"; }
if [[ -z "${DDPRUN_SANITIZE_TIME_BOX:-}" ]]; then
  run_tests "$@"
  exit
fi
# The unit tier first, then the others in batches, within what the box has left.
DDPRUN_BOX_BATCH=${DDPRUN_SANITIZE_BATCH:-4} DDPRUN_BOX_RESERVE=${DDPRUN_SANITIZE_BATCH_RESERVE:-5} \
  exec bash "$root/scripts/ctest_boxed.sh" "$box_end" 900 "$@"
