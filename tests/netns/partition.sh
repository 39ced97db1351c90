#!/usr/bin/env bash
# Network partitions between real hosts: network namespaces A (10.213.7.1) and B (10.213.7.2)
# joined by a veth pair, and B cut off by an nftables table in B that drops every packet in and out
# (connections stall as they do when a switch or a link fails: no reset, no error, only silence).
#   partition.sh DDPRUN DDPRUN_RENDEZVOUS TEST_WORKER
#
#  1. Elastic job through ddprun-rendezvous on A (--nnodes 2): B is cut off for longer than the
#     keep-alive window and its requests' deadlines, so A counts it as lost and re-rendezvouses. When the link is back, B learns
#     that, joins the next round, and both nodes finish with exit 0.
#  2. Static job (node 0 on A hosts the store): a blip shorter than the keep-alive window but
#     longer than a request's deadline is ridden out without a restart.
#  3. The same elastic job, B cut off for longer than store_reconnect_timeout: B gives up saying so
#     (exit 1) instead of hanging.
# Exit 77 (skipped) when namespaces or nftables cannot be used here (not root, no iproute2/nft).
set -euo pipefail
ddprun=$1
daemon=$2
worker=$3
suffix=$$
a=ddprun_pa_$suffix
b=ddprun_pb_$suffix
out=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  netns_cleanup
  [[ -n "${KEEP:-}" ]] || rm -rf "$out"
}
source "$(dirname "$0")/lib.sh"
trap cleanup EXIT
netns_add "$a" "$b"
netns_link "$a" "pa$suffix" 10.213.7.1/24 "$b" "pb$suffix" 10.213.7.2/24
netns_need_nft "$b"

cut_off() {  # B drops everything but loopback, both ways
  ip netns exec "$b" nft -f - <<'EOF'
table inet partition {
  chain in { type filter hook input priority 0; policy drop; iif "lo" accept; }
  chain out { type filter hook output priority 0; policy drop; oif "lo" accept; }
}
EOF
}
heal() { ip netns exec "$b" nft delete table inet partition; }

failed=0
fail() {
  echo "FAIL: $1"
  echo "--- host A stderr"; cat "$out/a.err"; echo "--- host B stderr"; cat "$out/b.err"
  failed=1
}

head -c 32 /dev/urandom | base64 >"$out/token"
chmod 600 "$out/token"
ip netns exec "$a" "$daemon" --host 10.213.7.1 --port 29400 --token-file "$out/token" >"$out/daemon.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  grep -q "listening on" "$out/daemon.log" && break
  sleep 0.1  # sleep override: polling the daemon's start
done

# Starts node A and node B with the common arguments "$@" (each its own in a_args, b_args), each
# running one worker for $seconds.
start_pair() {
  ip netns exec "$a" "$ddprun" "$@" "${a_args[@]}" "$worker" sleep "$seconds" >"$out/a.out" 2>"$out/a.err" &
  pid_a=$!
  ip netns exec "$b" "$ddprun" "$@" "${b_args[@]}" "$worker" sleep "$seconds" >"$out/b.out" 2>"$out/b.err" &
  pid_b=$!
  pids+=("$pid_a" "$pid_b")
}
# Node A and node B of an elastic job through the daemon; extra --rdzv_conf keys in $1.
elastic_pair() {
  local conf="join_timeout=60,keep_alive_interval=1,token_file=$out/token${1:+,$1}" id=$2
  seconds=$3
  a_args=(--local_addr 10.213.7.1)
  b_args=(--local_addr 10.213.7.2)
  start_pair --nnodes 2 --rdzv_backend c10d --rdzv_endpoint 10.213.7.1:29400 --rdzv_id "$id" --max_restarts 0 \
    --rdzv_conf "$conf"
}
# Once both nodes run their workers, B is cut off for $1 seconds (forever: "") and the nodes'
# exit codes land in rc_a and rc_b (B's first when cut off for good); 1 if the job did not start.
cut_once_started() {
  wait_for "$out/a.err" "started 1 worker" 60 && wait_for "$out/b.err" "started 1 worker" 60 || return 1
  cut_off
  if [[ -z "$1" ]]; then
    exit_of "$pid_b" 40; rc_b=$code
    heal
    exit_of "$pid_a" 60; rc_a=$code
    return 0
  fi
  sleep "$1"  # sleep override: the partition's length
  heal
  exit_of "$pid_a" 90; rc_a=$code
  exit_of "$pid_b" 30; rc_b=$code
}

# 1. Cut off for 14 s (past the deadline of B's requests, and far past the keep-alive window of
# 3 s): B is counted as lost, comes back, rejoins.
elastic_pair "" healed 8
if cut_once_started 14; then
  if [[ "$rc_a" != 0 || "$rc_b" != 0 ]]; then
    fail "after the partition healed, the nodes ended with $rc_a (A) and $rc_b (B), not 0 and 0"
  elif ! grep -q "the other nodes counted this node as lost" "$out/b.err"; then
    fail "B did not say that it had been counted as lost and was joining again"
  elif [[ $(grep -c "started 1 worker" "$out/a.err") -ne 2 || $(grep -c "started 1 worker" "$out/b.err") -ne 2 ]]; then
    fail "the job did not go on in a second round with both nodes"
  else
    echo "ok 1: a node cut off past the keep-alive window rejoined when the link was back; both exited 0"
  fi
else
  fail "the elastic job did not start"
fi

# 2. Static job, node 0 on A hosting the store; a keep-alive window of 30 s; B cut off for 13 s,
# past the deadline of a watch request (11 s) but well within the window.
seconds=20
a_args=(--node_rank 0 --local_addr 10.213.7.1)
b_args=(--node_rank 1 --local_addr 10.213.7.2)
start_pair --nnodes 2 --master_addr 10.213.7.1 --master_port 29500 --rdzv_conf "join_timeout=60,keep_alive_interval=10"
if cut_once_started 13; then
  if [[ "$rc_a" != 0 || "$rc_b" != 0 ]]; then
    fail "across a 13 s blip the static job ended with $rc_a (A) and $rc_b (B), not 0 and 0"
  elif ! grep -q "connected to store 10.213.7.1:29500 again" "$out/b.err"; then
    fail "B did not say that it reconnected"
  elif [[ $(grep -c "started 1 worker" "$out/b.err") -ne 1 ]]; then
    fail "B's workers were restarted: the blip was not ridden out"
  else
    echo "ok 2: a static job rode out a 13 s blip without a restart"
  fi
else
  fail "the static job did not start"
fi

# 3. Cut off for good (past store_reconnect_timeout=3): B gives up within its bound and says so.
elastic_pair "store_reconnect_timeout=3,join_timeout=10" gave_up 30
if cut_once_started ""; then
  if [[ "$rc_b" != 1 ]]; then
    fail "B, cut off for good, ended with $rc_b, not 1"
  elif ! grep -q "did not come back within 3s" "$out/b.err"; then
    fail "B did not say how long it had tried to reach the store"
  elif [[ "$rc_a" != 1 ]]; then
    fail "A, whose peer gave up, ended with $rc_a, not 1 (at its join timeout)"
  else
    echo "ok 3: a node cut off for good gave up after store_reconnect_timeout and said so"
  fi
else
  fail "the third job did not start"
fi

[[ $failed -eq 0 ]] || exit 1
echo "PASS: partitions healed (elastic and static) and a partition for good ended with a clear error"
