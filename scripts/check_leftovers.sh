#!/usr/bin/env bash
# After the suite: fails when a test left a process behind: one of the build's programs (ddprun,
# the daemon, test workers, examples) or a service a test started for itself (etcd, Slurm, munge:
# their command lines name the test's directory, /tmp/ddprun_test_* or /tmp/ddprun-slurm.*).
# Only processes this run started count: scripts/test.sh gives the suite a token of its own in
# DDPRUN_TEST_RUN, which every process the tests start inherits, and a process counts only when
# its environment holds that token. So another run beside this one (another checkout, a CI run
# beside a developer's, a job a person runs from the same build) is never reported or killed. Of
# those, only processes of this machine's root (not of a chroot) that started after SINCE (seconds
# since the epoch) count; stragglers get GRACE seconds to finish their exit first. Lists what it
# finds, then kills it, so one leak does not fail the next run too. Without DDPRUN_TEST_RUN it
# cannot tell this run's processes from others': it says so and checks nothing.
#   DDPRUN_TEST_RUN=TOKEN scripts/check_leftovers.sh BUILD_DIR SINCE [GRACE]
set -uo pipefail
build=$(cd "${1:?usage: check_leftovers.sh BUILD_DIR SINCE [GRACE]}" && pwd)
since=${2:?usage: check_leftovers.sh BUILD_DIR SINCE [GRACE]}
grace=${3:-10}
token=${DDPRUN_TEST_RUN:-}
if [[ -z $token ]]; then
  echo "check_leftovers: DDPRUN_TEST_RUN is not set, so this run's processes cannot be told from others': nothing checked (scripts/test.sh sets it)" >&2
  exit 0
fi
boot=$(awk '/^btime/ {print $2}' /proc/stat)
hz=$(getconf CLK_TCK)
# The root directory's device and inode: a chroot's processes (or this script's, inside one) are
# told apart from the host's whatever path their root has.
my_root=$(stat -L -c %d:%i /proc/self/root)

leftovers() {
  local dir pid exe cmd start
  for dir in /proc/[0-9]*; do
    pid=${dir#/proc/}
    [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
    [[ $(stat -L -c %d:%i "$dir/root" 2>/dev/null) == "$my_root" ]] || continue
    # Field 22 of stat: the start time in clock ticks after boot (the name, field 2, may hold spaces).
    start=$(sed 's/.*) //' "$dir/stat" 2>/dev/null | awk '{print $20}')
    [[ -n $start ]] || continue
    ((boot + start / hz >= since)) || continue
    exe=$(readlink "$dir/exe" 2>/dev/null)
    cmd=$(tr '\0' ' ' <"$dir/cmdline" 2>/dev/null)
    if [[ $exe == "$build"/* || $cmd == *"$build/"* || $cmd == */tmp/ddprun_test_* || $cmd == */tmp/ddprun-slurm.* ]]; then
      # This run's: its environment holds the token (one NUL-separated entry of it).
      tr '\0' '\n' <"$dir/environ" 2>/dev/null | grep -qxF "DDPRUN_TEST_RUN=$token" || continue
      echo "$pid $cmd"
    fi
  done
}

found=""
for _ in $(seq $((grace * 2))); do
  found=$(leftovers)
  [[ -z $found ]] && exit 0
  sleep 0.5
done
echo "FAIL: the tests left these processes running:"
echo "$found"
while read -r pid _; do kill -KILL "$pid" 2>/dev/null; done <<<"$found"
exit 1
