#!/usr/bin/env bash
# Builds the store's frame-decoder fuzz target (the CMake target store_frames_fuzzer: clang's
# libFuzzer with AddressSanitizer and UBSan) in a configured build directory and runs it for a
# bounded time over tests/fuzz/corpus and what earlier runs found. Exit 0 when no crash was found.
#   scripts/fuzz.sh [--seconds N] [--build-dir DIR]     (DIR: the CMake build, default build/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=60
build="$root/build"
while (($#)); do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    *) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  echo "fuzz.sh: $build is not a configured build directory (scripts/build.sh makes build/)" >&2
  exit 2
fi
if ! grep -q "^DDPRUN_CLANGXX:FILEPATH=/" "$build/CMakeCache.txt"; then
  echo "fuzz.sh: CMake found no clang++ for $build (scripts/install_deps.sh installs it; then reconfigure)" >&2
  exit 1
fi
cmake --build "$build" --target store_frames_fuzzer
work="$build/fuzz"
mkdir -p "$work/corpus"
cp -n "$root"/tests/fuzz/corpus/* "$work/corpus/" 2>/dev/null || true
echo "fuzz.sh: running $work/store_frames_fuzzer for ${seconds}s"
cd "$work"
DDPRUN_LOG_LEVEL=error ./store_frames_fuzzer -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=4096 \
  -print_final_stats=1 corpus
