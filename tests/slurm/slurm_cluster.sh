#!/usr/bin/env bash
# A real Slurm cluster on this machine, and docs/multi-node.md's sbatch recipe (examples/slurm/train.sbatch)
# run on it. Three hosts made from network namespaces on one bridge, each with its own hostname and
# address (ctl 10.213.9.1: slurmctld; n1 10.213.9.11 and n2 10.213.9.12: slurmd), one munged for
# the three (they share this kernel, so one key and one socket is what separate hosts with the same
# key amount to). Settings that need no cgroups: proctrack/linuxproc, task/none, no accounting.
#
# Jobs, each submitted with sbatch from the controller's host:
#   1. the C++ example (fashion_mnist_lenet), 2 nodes x 2 workers: COMPLETED, 4 ranks trained
#      together; node ranks, master address and port, and the job id taken from Slurm's environment;
#   2. real PyTorch workers (gloo): COMPLETED, every rank's all-reduce right;
#   3. scancel of a running job: every worker on both nodes gone, both nodes' reports "signalled";
#   4. rank 3 (on n2) exits 3: the job FAILED, and both nodes' reports name rank 3 on n2 as the cause.
#
#   slurm_cluster.sh DDPRUN EXAMPLE_BINARY TORCH_PYTHON GLOO_WORKER_PY
# Exit 77 (skipped) when Slurm, munge or network namespaces are not available here: the message
# says which.
set -euo pipefail
ddprun=$1
example=$2
python=$3
gloo_worker=$4
here=$(cd "$(dirname "$0")" && pwd)
recipe=$here/../../examples/slurm/train.sbatch
readme=$here/../../docs/multi-node.md

skip() {
  echo "SKIP: $*"
  exit 77
}
for tool in slurmctld slurmd slurmstepd srun sbatch scontrol scancel sinfo munged munge nsenter unshare ip; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (scripts/install_deps.sh installs slurm-wlm, munge, iproute2, util-linux)"
done

# The recipe docs/multi-node.md shows is the one run here.
while IFS= read -r line; do
  [[ -z "$line" ]] && continue
  grep -qxF -- "$line" "$readme" || { echo "FAIL: docs/multi-node.md does not show this line of $recipe: $line"; exit 1; }
done <"$recipe"

id=$$
work=$(mktemp -d /tmp/ddprun-slurm.XXXXXX)
chmod 0711 "$work"  # munged wants its socket's directory searchable by all
sw=ddprun_slurm_sw_$id
hosts=(ctl n1 n2)
declare -A addr=([ctl]=10.213.9.1 [n1]=10.213.9.11 [n2]=10.213.9.12)
ns_of() { echo "ddprun_slurm_${1}_$id"; }
daemons=()

cleanup() {
  local status=$?
  set +e
  if [[ -n "${SLURM_CONF:-}" ]] && ((${#daemons[@]} > 0)); then
    on ctl scancel --full --signal KILL --partition debug >/dev/null 2>&1
  fi
  for p in "${daemons[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq 50); do
    alive=0
    for p in "${daemons[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    ((alive == 0)) && break
    sleep 0.1
  done
  for p in "${daemons[@]}"; do kill -KILL "$p" 2>/dev/null; done
  pkill -KILL -f "sleep 3600.$id" 2>/dev/null
  # Every daemon was one of `daemons` (start_on starts them under their own pid): any process
  # still holding this cluster's configuration escaped, which fails the test (and is killed).
  local left
  left=$(pgrep -a -f "$work/slurm.conf")
  if [[ -n "$left" ]]; then
    echo "FAIL: Slurm daemons outlived the test:"
    echo "$left"
    pkill -KILL -f "$work/slurm.conf"
    status=1
  fi
  for h in "${hosts[@]}"; do ip netns del "$(ns_of "$h")" 2>/dev/null; done
  ip netns del "$sw" 2>/dev/null
  if [[ "${keep:-0}" == 1 ]]; then echo "(logs kept in $work)"; else rm -rf "$work"; fi
  exit "$status"
}
trap cleanup EXIT

# Run a command on host H: its network namespace, its own hostname (UTS namespace), and an
# /etc/hosts that names every host (a private mount namespace). nsenter rather than
# `ip netns exec`, which remounts /sys and would hide the cgroup mounts slurmd looks at.
on() {
  local h=$1
  shift
  nsenter --net="/run/netns/$(ns_of "$h")" unshare --uts --mount -- \
    bash -c 'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"' "$h" "$work/hosts" "$@"
}

# Starts a daemon on host H in the background, output to OUT, and records its pid: nsenter, unshare
# and bash each exec the next, so $! is the daemon itself (a function run with & would leave $! the
# pid of a subshell, and killing that would leave the daemon running).
start_on() {
  local h=$1 out=$2
  shift 2
  nsenter --net="/run/netns/$(ns_of "$h")" unshare --uts --mount -- \
    bash -c 'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"' "$h" "$work/hosts" "$@" \
    >"$out" 2>&1 &
  daemons+=($!)
}

if ! ip netns add "$sw" 2>/dev/null; then
  skip "cannot create network namespaces here (needs root and iproute2)"
fi
ip -n "$sw" link add br0 type bridge
ip -n "$sw" link set br0 up
{
  echo "127.0.0.1 localhost"
  for h in "${hosts[@]}"; do echo "${addr[$h]} $h"; done
} >"$work/hosts"
i=0
for h in "${hosts[@]}"; do
  ns=$(ns_of "$h")
  ip netns add "$ns"
  ip link add "sl${i}h$id" netns "$ns" type veth peer name "sl${i}b$id" netns "$sw"
  ip -n "$ns" addr add "${addr[$h]}/24" dev "sl${i}h$id"
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "sl${i}h$id" up
  ip -n "$sw" link set "sl${i}b$id" master br0 up
  i=$((i + 1))
done

# munge: a fresh key and a private socket, so nothing of the machine's own munge is used or touched.
dd if=/dev/urandom of="$work/munge.key" bs=1024 count=1 status=none
chmod 0400 "$work/munge.key"
munged --force --foreground --socket="$work/munge.socket" --key-file="$work/munge.key" \
  --log-file="$work/munged.log" --pid-file="$work/munged.pid" --seed-file="$work/munged.seed" >"$work/munged.out" 2>&1 &
daemons+=($!)
for _ in $(seq 100); do
  munge --socket="$work/munge.socket" -n 2>/dev/null | unmunge --socket="$work/munge.socket" >/dev/null 2>&1 && break
  sleep 0.1
done
munge --socket="$work/munge.socket" -n | unmunge --socket="$work/munge.socket" >/dev/null ||
  { echo "FAIL: munged did not start"; cat "$work/munged.log"; exit 1; }

# slurmd initialises a cgroup plugin even with proctrack/linuxproc and task/none. Without a cgroup
# file system (a container without /sys/fs/cgroup) Slurm 23.11 and later run with
# CgroupPlugin=disabled (cgroup.conf beside slurm.conf); older ones cannot start slurmd there.
if ! mountpoint -q /sys/fs/cgroup; then
  version=$(slurmctld -V | awk '{print $2}')
  IFS=. read -r major minor _ <<<"$version"
  if ((major > 23 || (major == 23 && minor >= 11))); then
    echo "CgroupPlugin=disabled" >"$work/cgroup.conf"
  else
    skip "/sys/fs/cgroup is not mounted here and slurmd $version cannot start without it (Slurm 23.11 and later can)"
  fi
fi

cpus=$(nproc)
mkdir -p "$work/state" "$work/jobs"
cat >"$work/slurm.conf" <<EOF
ClusterName=ddprun$id
SlurmctldHost=ctl(${addr[ctl]})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge.socket
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool-%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd-%n.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdTimeout=300
InactiveLimit=0
KillWait=10
MinJobAge=600
NodeName=n1 NodeAddr=${addr[n1]} CPUs=$cpus State=UNKNOWN
NodeName=n2 NodeAddr=${addr[n2]} CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$work/slurm.conf

start_on ctl "$work/slurmctld.out" slurmctld -D -i -f "$SLURM_CONF"
for n in n1 n2; do
  start_on "$n" "$work/slurmd-$n.out" slurmd -D -N "$n" -f "$SLURM_CONF"
done

dump_logs() {
  for f in "$work"/slurmctld.log "$work"/slurmctld.out "$work"/slurmd-*.log "$work"/slurmd-*.out; do
    [[ -f "$f" ]] || continue
    echo "--- $f (last 40 lines)"
    tail -n 40 "$f"
  done
}
idle=""
for _ in $(seq 120); do
  idle=$(on ctl sinfo --noheader --nodes n1,n2 --format '%n %t' 2>/dev/null | sort | tr '\n' ' ' || true)
  [[ "$idle" == "n1 idle n2 idle " ]] && break
  sleep 0.5
done
if [[ "$idle" != "n1 idle n2 idle " ]]; then
  echo "FAIL: the two slurmd nodes did not come up idle within 60 s (sinfo: '$idle')"
  dump_logs
  exit 1
fi
echo "slurm $(slurmctld -V | awk '{print $2}'): controller on ctl, nodes n1 and n2 idle"

# Jobs run from a shared directory (this machine's file system plays the cluster's shared one).
cp "$recipe" "$work/jobs/train.sbatch"
cd "$work/jobs"
export PATH="$(dirname "$ddprun"):$PATH" OMP_NUM_THREADS=1 PYTHON_EXEC="$python"

submit() {
  on ctl sbatch --parsable --chdir "$work/jobs" train.sbatch "$@"
}
job_field() {  # job_field JOB FIELD: a field of `scontrol show job`
  on ctl scontrol --oneliner show job "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"
}
wait_job_end() {  # wait_job_end JOB SECONDS: prints the job's final state
  local job=$1 limit=$2 state=""
  for _ in $(seq $((limit * 2))); do
    state=$(job_field "$job" JobState)
    case "$state" in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED)
        echo "$state"
        return 0
        ;;
    esac
    sleep 0.5
  done
  echo "${state:-UNKNOWN}(still running after ${limit}s)"
}
fail() {
  echo "FAIL: $*"
  for f in "$work"/jobs/*.out; do
    echo "--- $f"
    tail -n 60 "$f"
  done
  dump_logs
  keep=1
  exit 1
}
reports_of() {  # reports_of JOB: waits (bounded) until both nodes' report files exist
  local job=$1
  for _ in $(seq 60); do
    [[ -f "ddp-$job-n1.json" && -f "ddp-$job-n2.json" ]] && return 0
    sleep 0.5
  done
  fail "job $job: the report files ddp-$job-n1.json and ddp-$job-n2.json were not both written"
}
# check_reports JOB PYTHON-EXPRESSION...: each expression must hold for the two reports r1 (n1), r2 (n2).
check_reports() {
  local job=$1
  shift
  "$python" - "ddp-$job-n1.json" "ddp-$job-n2.json" "$job" "$@" <<'PY' || fail "job $1: the reports do not say what they should (above)"
import json, sys
r1, r2 = (json.load(open(p)) for p in sys.argv[1:3])
job = int(sys.argv[3])
bad = [e for e in sys.argv[4:] if not eval(e)]
for e in bad:
    print("does not hold:", e)
if bad:
    print("n1:", json.dumps(r1, indent=1)[:3000])
    print("n2:", json.dumps(r2, indent=1)[:3000])
sys.exit(1 if bad else 0)
PY
}
wait_workers() {  # wait_workers N SECONDS: waits until N workers (sleep 3600.<id>) run; prints how many do
  local n=$1 limit=$2 count=0
  for _ in $(seq $((limit * 2))); do
    count=$(pgrep -c -f "^sleep 3600.$id\$" || true)
    ((count == n)) && break
    sleep 0.5
  done
  echo "$count"
}
layout=(
  'r1["job_id"] == f"slurm-{job}" and r2["job_id"] == f"slurm-{job}"'
  'r1["host"] == "n1" and r2["host"] == "n2"'
  'r1["nodes"]["this_node_rank"] == 0 and r2["nodes"]["this_node_rank"] == 1'
  'r1["nodes"]["count"] == 2 and r2["world_size"] == 4'
  'r1["attempts"][-1]["ranks"] == [0, 1] and r2["attempts"][-1]["ranks"] == [2, 3]'
  'r2["attempts"][-1]["master_addr"] == "n1"'
  '{w["host"] for w in r2["attempts"][-1]["workers"]} == {"n2"}'
)

# 1. The C++ example on 2 nodes x 2 workers.
job=$(submit "$example" --epochs 1 --train-limit 4000 --test-limit 1000)
state=$(wait_job_end "$job" 400)
[[ "$state" == COMPLETED ]] || fail "job $job (C++ example): $state, expected COMPLETED"
reports_of "$job"
grep -q '"world_size": 4' "ddp-$job.out" || fail "job $job: no 4-worker result line from rank 0"
# The rendezvous port is derived from the job id, the same on both nodes.
port=$((20000 + job % 12000))
grep -q "$port" "ddp-$job.out" || fail "job $job: the rendezvous port $port (from SLURM_JOB_ID) is not in the output"
check_reports "$job" "${layout[@]}" 'r1["outcome"] == r2["outcome"] == "succeeded"' \
  'r1["exit_code"] == r2["exit_code"] == 0'
echo "PASS: job $job, the C++ example, 2 nodes x 2 workers, COMPLETED"

# 2. Real PyTorch workers.
job=$(submit "$gloo_worker")
state=$(wait_job_end "$job" 300)
[[ "$state" == COMPLETED ]] || fail "job $job (PyTorch gloo workers): $state, expected COMPLETED"
reports_of "$job"
for r in 0 1 2 3; do
  grep -q "rank $r ok 10.0 attempt 0" "ddp-$job.out" || fail "job $job: rank $r did not report a right all-reduce"
done
check_reports "$job" "${layout[@]}" 'r1["outcome"] == r2["outcome"] == "succeeded"'
echo "PASS: job $job, PyTorch workers, 2 nodes x 2 workers, COMPLETED"

# 3. scancel of a running job ends every worker on both nodes, with a report on each.
job=$(submit --no_python sleep "3600.$id")
running=$(wait_workers 4 120)
((running == 4)) || fail "job $job: $running of 4 workers started within 120 s"
on ctl scancel "$job"
state=$(wait_job_end "$job" 120)
[[ "$state" == CANCELLED ]] || fail "job $job: $state after scancel, expected CANCELLED"
left=$(wait_workers 0 30)
((left == 0)) || fail "job $job: $left worker(s) still running 30 s after scancel"
reports_of "$job"
check_reports "$job" 'r1["outcome"] == r2["outcome"] == "signalled"' \
  'r1["exit_code"] > 128 and r2["exit_code"] > 128' \
  'all(w["state"] == "stopped" for r in (r1, r2) for w in r["attempts"][-1]["workers"])'
echo "PASS: job $job, scancel: every worker on both nodes stopped, both reports 'signalled'"

# 4. One rank fails on n2: both nodes end, and both reports name it.
job=$(submit --no_python /bin/sh -c "if [ \"\$RANK\" = 3 ]; then sleep 1; exit 3; fi; exec sleep 3600.$id")
state=$(wait_job_end "$job" 120)
[[ "$state" == FAILED ]] || fail "job $job (rank 3 exits 3): $state, expected FAILED"
reports_of "$job"
check_reports "$job" "${layout[@]}" 'r1["outcome"] == r2["outcome"] == "failed"' \
  'r1["exit_code"] == r2["exit_code"] == 3' \
  'r1["root_cause"]["rank"] == r2["root_cause"]["rank"] == 3' \
  'r1["root_cause"]["host"] == r2["root_cause"]["host"] == "n2"'
left=$(pgrep -c -f "^sleep 3600.$id\$" || true)
((left == 0)) || fail "job $job: $left worker(s) still running after the job failed"
echo "PASS: job $job, rank 3 on n2 exits 3: both nodes end, FAILED, both reports name rank 3 on n2"
