#!/usr/bin/env bash
# scripts/check_leftovers.sh counts this run's processes only: of three processes of the build
# started after SINCE, the one with this run's token (DDPRUN_TEST_RUN) is reported and killed; one
# of another run (another token) and one started outside any run (no token) are neither reported
# nor killed.
#   tests/scripts/check_leftovers_test.sh CHECK_LEFTOVERS BUILD_DIR TEST_WORKER
set -euo pipefail
check=${1:?usage: check_leftovers_test.sh CHECK_LEFTOVERS BUILD_DIR TEST_WORKER}
build=${2:?}
worker=${3:?}
since=$(($(date +%s) - 2))  # (btime is whole seconds: a process of this second may read as the last)
mine_token="leftovers-test-$$"
DDPRUN_TEST_RUN="another-run-$$" "$worker" sleep 120 &
other=$!
env -u DDPRUN_TEST_RUN "$worker" sleep 120 &
none=$!
DDPRUN_TEST_RUN="$mine_token" "$worker" sleep 120 &
mine=$!
trap 'kill -KILL $other $none $mine 2>/dev/null || true' EXIT
sleep 0.5
rc=0
out=$(DDPRUN_TEST_RUN="$mine_token" "$check" "$build" "$since" 1) || rc=$?
fail() { echo "FAIL: $*"; echo "check_leftovers said (exit $rc):"; echo "$out"; exit 1; }
((rc == 1)) || fail "expected exit 1 for this run's leftover"
grep -q "^$mine " <<<"$out" || fail "this run's process $mine was not reported"
grep -q "^$other \|^$none " <<<"$out" && fail "another run's process was reported"
sleep 0.2
kill -0 "$mine" 2>/dev/null && fail "this run's process $mine was not killed"
kill -0 "$other" 2>/dev/null || fail "another run's process $other was killed"
kill -0 "$none" 2>/dev/null || fail "a process outside any run ($none) was killed"
# Without a token it cannot tell: it checks nothing and says so.
out=$(env -u DDPRUN_TEST_RUN "$check" "$build" "$since" 1 2>&1) && rc=0 || rc=$?
((rc == 0)) || fail "without DDPRUN_TEST_RUN it must check nothing"
grep -q "nothing checked" <<<"$out" || fail "without DDPRUN_TEST_RUN it must say it checked nothing"
kill -0 "$other" 2>/dev/null || fail "without a token, another run's process was killed"
echo "check_leftovers left the other run's processes alone and caught this run's"
