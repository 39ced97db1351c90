#!/usr/bin/env bash
# The ddprun-dev package, installed into a clean root (dpkg-deb -x): an outside project finds the
# worker SDK with find_package(ddprun), builds against it, and runs alone and under the installed
# ddprun.
#   installed_sdk_test.sh PACKAGE_DIR CONSUMER_SOURCE_DIR
set -euo pipefail
debs=$(cd "$1" && pwd)
consumer=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
dev=$(ls "$debs"/ddprun-dev_*_*.deb)
[[ $(dpkg-deb -f "$dev" Depends) == *libtorch-dev* ]] || fail "ddprun-dev must depend on libtorch-dev"
root="$work/root"
mkdir -p "$root"
for d in "$debs"/ddprun_*.deb "$dev"; do dpkg-deb -x "$d" "$root"; done
config=$(find "$root" -name ddprunConfig.cmake)
[[ -n $config ]] || fail "no ddprunConfig.cmake in ddprun-dev"
[[ -f "$root/usr/include/ddprun/worker.hpp" ]] || fail "no SDK headers in ddprun-dev"
# The CMake package names no path of the build machine (CUDA, NCCL): they are found where it is used.
! grep -q "/usr/local/cuda" "$(dirname "$config")"/ddprunTargets*.cmake || fail "ddprunTargets.cmake names the build machine's CUDA"
cmake -S "$consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$root/usr" -DCMAKE_BUILD_TYPE=Release > "$work/configure.log" 2>&1 \
  || { cat "$work/configure.log"; fail "find_package(ddprun) from the installed package"; }
grep -q "ddprun_DIR:PATH=$root/usr" "$work/build/CMakeCache.txt" || fail "ddprun was not found in the installed root"
cmake --build "$work/build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; fail "building against the installed SDK"; }
if [[ -n $(ls "$root"/usr/lib/*/libddprun_worker_nccl.a "$root"/usr/lib/libddprun_worker_nccl.a 2>/dev/null) ]]; then
  "$work/build/consumer_nccl" | grep -q "consumer_nccl linked: yes" || fail "ddprun::worker_nccl from the installed package"
fi
env -u RANK "$work/build/consumer" | grep -q "consumer ok: world 1" || fail "the consumer alone"
"$root/usr/bin/ddprun" --nproc_per_node 2 "$work/build/consumer" 2>/dev/null | grep -q "consumer ok: world 2, 5 samples" \
  || fail "the consumer under the installed ddprun"
echo "installed ddprun-dev: find_package(ddprun) from $(dirname "$config"), built, ran alone and under the installed ddprun"
