#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs every test.
#   scripts/test.sh [ctest arguments, e.g. -L unit or -R Launcher]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install_deps.sh"
# Explicitly on: scripts/run_main.sh configures the same build directory with the tests off.
"$root/scripts/build.sh" -DDDPRUN_BUILD_TESTS=ON
cd "${DDPRUN_BUILD_DIR:-$root/build}"
since=$(date +%s)
# This run's token: every process the tests start inherits it, and check_leftovers counts only
# those (another run beside this one is left alone).
DDPRUN_TEST_RUN="$(hostname)-$$-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')"
export DDPRUN_TEST_RUN
rc=0
ctest --output-on-failure --no-tests=error --timeout 600 -j "${DDPRUN_TEST_JOBS:-2}" "$@" || rc=$?
# Tests stop what they start, failing or not: a process of the build, or a service a test started,
# still running now fails the run (and is killed).
"$root/scripts/check_leftovers.sh" . "$since" || rc=1
exit "$rc"
