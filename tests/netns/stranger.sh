#!/usr/bin/env bash
# Three real hosts from network namespaces: A (10.213.7.1) and B (10.213.7.2) run a 2-node ddprun
# job with a rendezvous secret; C (10.213.9.2, routed to A through a second link) is a stranger.
# C must not get anything from A's rendezvous store (protected: no key operation without the secret)
# nor from the job's worker store (only the job's nodes' addresses are admitted), while B's
# connections to both are served.
#   stranger.sh DDPRUN TEST_WORKER
# Exit 77 (skipped) when namespaces cannot be created here (not root, no iproute2, no CAP_NET_ADMIN).
set -euo pipefail
ddprun=$1
worker=$2
suffix=$$
a=ddprun_sa_$suffix
b=ddprun_sb_$suffix
c=ddprun_sc_$suffix
out=$(mktemp -d)
cleanup() {
  [[ -n "${pid_a:-}" ]] && kill -9 "$pid_a" 2>/dev/null || true
  [[ -n "${pid_b:-}" ]] && kill -9 "$pid_b" 2>/dev/null || true
  netns_cleanup
  rm -rf "$out"
}
source "$(dirname "$0")/lib.sh"
trap cleanup EXIT
netns_add "$a" "$b" "$c"
netns_link "$a" "sa$suffix" 10.213.7.1/24 "$b" "sb$suffix" 10.213.7.2/24
netns_link "$a" "xa$suffix" 10.213.9.1/24 "$c" "xc$suffix" 10.213.9.2/24
ip -n "$c" route add 10.213.7.0/24 via 10.213.9.1

token="$out/token"
head -c 32 /dev/urandom | base64 >"$token"
chmod 600 "$token"
common=(--nnodes 2 --nproc_per_node 1 --master_addr 10.213.7.1 --master_port 29500
        --rdzv_conf "join_timeout=60,token_file=$token")
ip netns exec "$a" "$ddprun" "${common[@]}" --node_rank 0 --local_addr 10.213.7.1 "$worker" wait-signal \
  >"$out/a.out" 2>"$out/a.err" &
pid_a=$!
ip netns exec "$b" "$ddprun" "${common[@]}" --node_rank 1 --local_addr 10.213.7.2 "$worker" wait-signal \
  >"$out/b.out" 2>"$out/b.err" &
pid_b=$!
for _ in $(seq 1 600); do  # both workers up (readiness, 60 s at most)
  grep -q "ready" "$out/a.out" 2>/dev/null && grep -q "ready" "$out/b.out" 2>/dev/null && break
  sleep 0.1  # sleep override: polling another process's output
done
grep -q "ready" "$out/b.out" || { echo "FAIL: the job did not start"; cat "$out/a.err" "$out/b.err"; exit 1; }
worker_port=$(grep -o "MASTER_PORT=[0-9]*" "$out/a.err" | head -1 | cut -d= -f2)

# A probe: connect to HOST:PORT, send a 2.x VALIDATE + PING, then a SET; print what came back.
probe() {
  local ns=$1 host=$2 port=$3
  ip netns exec "$ns" python3 - "$host" "$port" <<'EOF'
import socket, struct, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    s = socket.create_connection((host, port), timeout=10)  # a reset may come this early
    s.settimeout(30)  # the worker store holds a stranger unread for 10 s before its reset
    s.sendall(b"\x00" + struct.pack("<I", 0x3C85F7CE) + b"\x0d" + struct.pack("<I", 42))
    ping = s.recv(4)
    key = b"/ddprun/none/g1/r0/end"
    s.sendall(b"\x01" + struct.pack("<Q", len(key)) + key + struct.pack("<Q", 7) + b"stolen!")
    s.sendall(b"\x07")  # GETNUMKEYS: answered only if the SET was accepted
    rest = s.recv(8)
    print("ping" if ping == struct.pack("<I", 42) else "no-ping", "served" if len(rest) == 8 else "closed")
except (ConnectionResetError, BrokenPipeError):
    print("no-ping closed")
EOF
}
fail=0
r=$(probe "$c" 10.213.7.1 "$worker_port")
[[ "$r" == "no-ping closed" ]] || { echo "FAIL: the stranger reached the worker store: $r"; fail=1; }
r=$(probe "$c" 10.213.7.1 29500)
[[ "$r" == "ping closed" ]] || { echo "FAIL: the stranger reached the rendezvous store's keys: $r"; fail=1; }
r=$(probe "$b" 10.213.7.1 "$worker_port")
[[ "$r" == "ping served" ]] || { echo "FAIL: node B's address was refused by the worker store: $r"; fail=1; }

kill -TERM "$pid_a"
rc_a=0; rc_b=0
wait "$pid_a" || rc_a=$?
wait "$pid_b" || rc_b=$?
pid_a=; pid_b=
if ! grep -q "refused a connection from 10.213.9.2: not one of this job's nodes" "$out/a.err"; then
  echo "FAIL: the worker store did not log the refused stranger"; fail=1
fi
if [[ $rc_a -ne 143 || $rc_b -ne 143 ]]; then
  echo "FAIL: the job ended with $rc_a / $rc_b, not 143 (SIGTERM)"; fail=1
fi
if [[ $fail -ne 0 ]]; then
  echo "--- host A stderr"; cat "$out/a.err"; echo "--- host B stderr"; cat "$out/b.err"; exit 1
fi
echo "PASS: a stranger on a third host got nothing from either store; the job's nodes were served"
