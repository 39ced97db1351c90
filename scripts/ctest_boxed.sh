#!/usr/bin/env bash
# Runs the tests the ctest arguments select, in the build directory it is started in, within a time
# box that ends at BOX_END (seconds since the epoch), so that a CI leg never runs past its share:
#   scripts/ctest_boxed.sh BOX_END TEST_TIMEOUT_S [ctest selection, e.g. -LE 'soak|slow']
# Order: the unit tier first, always and whole; then the tests whose labels match DDPRUN_BOX_FIRST
# (a label regex, e.g. 'python|torch'); then the others. After the unit tier they run in batches of
# DDPRUN_BOX_BATCH (default 6), two at a time (DDPRUN_TEST_JOBS), and none starts once fewer than
# DDPRUN_BOX_RESERVE minutes (default 5) of the box are left: a batch's longest test bounds the
# overrun. It names the tests it left and fails only on a failed test, never on the box.
# The outcome, one line, also goes to box-summary.txt in the build directory (CI's table reads it):
#   ran R of N tests in M min: all passed|some FAILED[; left L for the time box]
set -euo pipefail
started=$(date +%s)
box_end=${1:?usage: scripts/ctest_boxed.sh BOX_END TEST_TIMEOUT_S [ctest selection]}
test_timeout=${2:?usage: scripts/ctest_boxed.sh BOX_END TEST_TIMEOUT_S [ctest selection]}
shift 2
run_tests() { ctest --output-on-failure --no-tests=error --timeout "$test_timeout" -j "${DDPRUN_TEST_JOBS:-2}" "$@"; }
reserve=$((${DDPRUN_BOX_RESERVE:-5} * 60))
batch=${DDPRUN_BOX_BATCH:-6}

# The selected tests, by number: the unit tier's, the first labels', then the others.
numbers() { ctest -N "$@" | sed -n 's/^ *Test *#\([0-9]*\): .*/\1/p' | sort -n; }
minus() { comm -23 <(printf '%s\n' "$1" | sed '/^$/d' | sort) <(printf '%s\n' "$2" | sed '/^$/d' | sort) | sort -n; }
all=$(numbers "$@")
unit_list=$(numbers -L unit "$@")
first=""
if [[ -n "${DDPRUN_BOX_FIRST:-}" ]]; then first=$(minus "$(numbers -L "$DDPRUN_BOX_FIRST" "$@")" "$unit_list"); fi
mapfile -t unit < <(printf '%s\n' "$unit_list" | sed '/^$/d')
mapfile -t rest < <(printf '%s\n' "$first" | sed '/^$/d'; minus "$(minus "$all" "$unit_list")" "$first")
total=$((${#unit[@]} + ${#rest[@]}))
if ((total == 0)); then
  echo "ctest_boxed: no test matches '$*'" >&2
  echo "ran no test: none matches the selection" > box-summary.txt
  exit 1
fi
echo "ctest_boxed: ${#unit[@]} tests of the unit tier, then ${#rest[@]} more$([[ -n ${DDPRUN_BOX_FIRST:-} ]] && echo " (labels ${DDPRUN_BOX_FIRST} first)")," \
  "in a time box that ends in $(((box_end - started) / 60)) min"
by_number() { local IFS=,; echo "0,0,0,$*"; }
rc=0
ran=0
if ((${#unit[@]} > 0)); then
  run_tests -I "$(by_number "${unit[@]}")" || rc=1
  ran=${#unit[@]}
fi
left=()
for ((i = 0; i < ${#rest[@]}; i += batch)); do
  if (($(date +%s) + reserve > box_end)); then
    left=("${rest[@]:i}")
    echo "ctest_boxed: the time box is spent; ${#left[@]} of $total tests did not run:"
    ctest -N -I "$(by_number "${left[@]}")" | sed -n 's/^ *Test *#[0-9]*: /  /p'
    break
  fi
  chunk=("${rest[@]:i:batch}")
  run_tests -I "$(by_number "${chunk[@]}")" || rc=1
  ran=$((ran + ${#chunk[@]}))
done
summary="ran $ran of $total tests in $((($(date +%s) - started) / 60)) min: $([[ $rc == 0 ]] && echo "all passed" || echo "some FAILED")"
((${#left[@]} == 0)) || summary+="; left ${#left[@]} for the time box"
echo "ctest_boxed: $summary"
echo "$summary" > box-summary.txt
exit "$rc"
