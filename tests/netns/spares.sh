#!/usr/bin/env bash
# Hot spares across real hosts: network namespaces A (10.213.8.1: ddprun-rendezvous and a node of
# the world), B (10.213.8.2: the other node of the world) and C (10.213.8.3: a spare), on one
# bridge in A. A host is partitioned by an nftables table in its namespace that drops every
# packet in and out (a failed link: no reset, no error, only silence).
#   spares.sh DDPRUN DDPRUN_RENDEZVOUS TEST_WORKER
#
#  1. A --nnodes 2:2 job on A and B, and C waiting as a spare: C is cut off for good. The job
#     never notices: A and B start their workers once and end 0; C ends on its own (it gave up on
#     the store, or learnt the job's end once healed), within its bound.
#  2. The same job with C waiting as a spare: B, a node of the world, is cut off for good. C takes
#     its place in the next round: A and C end 0, B gives up.
# Exit 77 (skipped) when namespaces or nftables cannot be used here (not root, no iproute2/nft).
set -euo pipefail
ddprun=$1
daemon=$2
worker=$3
suffix=$$
a=ddprun_sa_$suffix
b=ddprun_sb_$suffix
c=ddprun_sc_$suffix
out=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  netns_cleanup
  [[ -n "${KEEP:-}" ]] || rm -rf "$out"
}
source "$(dirname "$0")/lib.sh"
trap cleanup EXIT
netns_add "$a" "$b" "$c"
ip -n "$a" link add br0 type bridge
ip -n "$a" addr add 10.213.8.1/24 dev br0
ip -n "$a" link set br0 up
for host in b c; do
  ns=${!host}
  addr=10.213.8.$([[ $host == b ]] && echo 2 || echo 3)
  ip link add "s$host$suffix" netns "$a" type veth peer name "e$host$suffix" netns "$ns"
  ip -n "$a" link set "s$host$suffix" master br0
  ip -n "$a" link set "s$host$suffix" up
  ip -n "$ns" addr add "$addr/24" dev "e$host$suffix"
  ip -n "$ns" link set "e$host$suffix" up
done
netns_need_nft "$b"

cut_off() {  # namespace $1 drops everything but loopback, both ways
  ip netns exec "$1" nft -f - <<'EOF'
table inet partition {
  chain in { type filter hook input priority 0; policy drop; iif "lo" accept; }
  chain out { type filter hook output priority 0; policy drop; oif "lo" accept; }
}
EOF
}

failed=0
fail() {
  echo "FAIL: $1"
  for host in a b c; do echo "--- host ${host^^} stderr"; cat "$out/$host.err"; done
  failed=1
}

head -c 32 /dev/urandom | base64 >"$out/token"
chmod 600 "$out/token"
ip netns exec "$a" "$daemon" --host 10.213.8.1 --port 29400 --token-file "$out/token" >"$out/daemon.log" 2>&1 &
pids+=($!)
wait_for "$out/daemon.log" "listening on" 10 || { echo "FAIL: the daemon did not start"; cat "$out/daemon.log"; exit 1; }

# Starts the job $1 on A and B, each node running one worker for $2 seconds, then C, which waits
# as a spare; pid_a, pid_b, pid_c. 1 if the job did not start or C did not become a spare.
start_job() {
  local id=$1 seconds=$2 host
  for host in a b c; do
    local ns=${!host} n
    n=$(( $(printf '%d' "'$host") - 96 ))
    ip netns exec "$ns" "$ddprun" --nnodes 2:2 --nproc_per_node 1 --rdzv_backend c10d \
      --rdzv_endpoint 10.213.8.1:29400 --rdzv_id "$id" --local_addr "10.213.8.$n" --max_restarts 0 \
      --rdzv_conf "join_timeout=60,last_call_timeout=1,keep_alive_interval=1,store_reconnect_timeout=4,read_timeout=10,token_file=$out/token" \
      "$worker" sleep "$seconds" >"$out/$host.out" 2>"$out/$host.err" &
    pids+=($!)
    printf -v "pid_$host" '%s' "$!"
    if [[ $host == b ]]; then
      wait_for "$out/a.err" "started 1 worker" 60 && wait_for "$out/b.err" "started 1 worker" 60 || return 1
    fi
  done
  wait_for "$out/c.err" "as a spare" 30
}

# 1. The spare cut off for good: the world never notices.
if start_job spare_cut 8; then
  cut_off "$c"
  exit_of "$pid_a" 60; rc_a=$code
  exit_of "$pid_b" 30; rc_b=$code
  exit_of "$pid_c" 60; rc_c=$code
  ip netns exec "$c" nft delete table inet partition
  if [[ "$rc_a" != 0 || "$rc_b" != 0 ]]; then
    fail "with the spare cut off, the world's nodes ended with $rc_a (A) and $rc_b (B), not 0 and 0"
  elif [[ $(grep -c "started 1 worker" "$out/a.err") -ne 1 || $(grep -c "started 1 worker" "$out/b.err") -ne 1 ]]; then
    fail "the world's workers were started again: the spare's partition disturbed the job"
  elif [[ "$rc_c" == running ]]; then
    fail "the spare, cut off, was still running 60 s after the job ended"
  elif grep -q "started 1 worker" "$out/c.err"; then
    fail "a worker was started on the spare"
  else
    echo "ok 1: a spare cut off for good never disturbed the job (A 0, B 0, workers started once; the spare ended with $rc_c)"
  fi
else
  fail "the first job did not start with a spare"
fi

# 2. A node of the world cut off for good: the spare takes its place in the next round.
if start_job world_cut 6; then
  cut_off "$b"
  exit_of "$pid_a" 90; rc_a=$code
  exit_of "$pid_c" 30; rc_c=$code
  exit_of "$pid_b" 60; rc_b=$code
  ip netns exec "$b" nft delete table inet partition
  if [[ "$rc_a" != 0 || "$rc_c" != 0 ]]; then
    fail "with B cut off, A and the spare ended with $rc_a (A) and $rc_c (C), not 0 and 0"
  elif [[ $(grep -c "started 1 worker" "$out/a.err") -ne 2 || $(grep -c "started 1 worker" "$out/c.err") -ne 1 ]]; then
    fail "the spare did not take B's place in one next round"
  elif [[ "$rc_b" == 0 || "$rc_b" == running ]]; then
    fail "B, cut off for good, ended with $rc_b"
  else
    echo "ok 2: the spare took the place of a node cut off for good (A 0, C 0, B $rc_b)"
  fi
else
  fail "the second job did not start with a spare"
fi

[[ $failed -eq 0 ]] || exit 1
echo "PASS: a spare's partition never disturbed the job, and a spare took a partitioned node's place"
