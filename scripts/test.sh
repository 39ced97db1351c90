#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs every test.
#   scripts/test.sh [ctest arguments, e.g. -L unit or -R Launcher]
# DDPRUN_TEST_BOX_END=EPOCH_SECONDS (CI's legs beside the README's run) bounds the build and the
# tests: the unit tier first, the labels of DDPRUN_BOX_FIRST next, the rest as time allows
# (scripts/ctest_boxed.sh). Such a run fails only on a failed build or test, never on the box.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install_deps.sh"
build="${DDPRUN_BUILD_DIR:-$root/build}"
box_end=${DDPRUN_TEST_BOX_END:-}
# Explicitly on: scripts/run_main.sh configures the same build directory with the tests off.
if [[ -z "$box_end" ]]; then
  "$root/scripts/build.sh" -DDDPRUN_BUILD_TESTS=ON
else
  mkdir -p "$build"
  rm -f "$build/box-summary.txt"
  build_rc=0
  # timeout signals the build's whole process group (cmake, ninja, the compilers) at the box's end.
  remaining=$((box_end - $(date +%s)))
  ((remaining > 0)) || remaining=1
  timeout --kill-after=30s "${remaining}s" "$root/scripts/build.sh" -DDDPRUN_BUILD_TESTS=ON || build_rc=$?
  # Out of time: timeout's own status, its SIGKILL once the box ended, or a build that ended with it.
  if ((build_rc == 124)) || (((build_rc == 137 || build_rc == 0) && $(date +%s) >= box_end)); then
    echo "test: the time box ended during the build; no test ran"
    echo "ran no test: the time box ended during the build" > "$build/box-summary.txt"
    exit 0
  fi
  ((build_rc == 0)) || exit "$build_rc"
fi
cd "$build"
since=$(date +%s)
# This run's token: every process the tests start inherits it, and check_leftovers counts only
# those (another run beside this one is left alone).
DDPRUN_TEST_RUN="$(hostname)-$$-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')"
export DDPRUN_TEST_RUN
rc=0
if [[ -z "$box_end" ]]; then
  ctest --output-on-failure --no-tests=error --timeout 600 -j "${DDPRUN_TEST_JOBS:-2}" "$@" || rc=$?
else
  bash "$root/scripts/ctest_boxed.sh" "$box_end" 600 "$@" || rc=$?
fi
# Tests stop what they start, failing or not: a process of the build, or a service a test started,
# still running now fails the run (and is killed).
"$root/scripts/check_leftovers.sh" . "$since" || rc=1
exit "$rc"
