# Network namespaces as hosts, for the netns tests (sourced, not run). Every namespace made here
# is deleted by netns_cleanup, which the sourcing script calls from its EXIT trap.
netns_made=()

# netns_add NAME...: makes each namespace with its loopback up. The first one that cannot be made
# (not root, no iproute2, no CAP_NET_ADMIN) ends the test as skipped (exit 77).
netns_add() {
  local ns
  for ns in "$@"; do
    if ! command -v ip >/dev/null || ! ip netns add "$ns" 2>/dev/null; then
      echo "SKIP: cannot create network namespaces here (needs root and iproute2)"
      exit 77
    fi
    netns_made+=("$ns")
    ip -n "$ns" link set lo up
  done
}

# netns_link NS1 DEV1 ADDR1/LEN NS2 DEV2 ADDR2/LEN: a veth pair from DEV1 in NS1 to DEV2 in NS2,
# each end addressed and up.
netns_link() {
  ip link add "$2" netns "$1" type veth peer name "$5" netns "$4"
  ip -n "$1" addr add "$3" dev "$2"
  ip -n "$4" addr add "$6" dev "$5"
  ip -n "$1" link set "$2" up
  ip -n "$4" link set "$5" up
}

# netns_need_nft NS: skips the test (exit 77) unless nftables works inside NS.
netns_need_nft() {
  if ! command -v nft >/dev/null || ! ip netns exec "$1" nft add table inet probe 2>/dev/null; then
    echo "SKIP: nftables does not work in a network namespace here (needs the nftables package)"
    exit 77
  fi
  ip netns exec "$1" nft delete table inet probe
}

# Waits (bounded) for a line in a file; 1 if it never came.
wait_for() {
  local file=$1 text=$2 seconds=$3
  for _ in $(seq 1 $((seconds * 10))); do
    grep -q "$text" "$file" 2>/dev/null && return 0
    sleep 0.1  # sleep override: polling another process's output
  done
  return 1
}
# Waits (bounded) for a child; sets `code` to its exit code, or "running" if it outlived the
# bound (not through $(...): a subshell cannot wait for this shell's children).
exit_of() {
  local pid=$1 seconds=$2
  for _ in $(seq 1 $((seconds * 10))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1  # sleep override: polling a process's end
  done
  code=running
  kill -0 "$pid" 2>/dev/null && return
  code=0
  wait "$pid" || code=$?
}

netns_cleanup() {
  local ns
  for ns in "${netns_made[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
}
