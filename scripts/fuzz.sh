#!/usr/bin/env bash
# Builds the store's frame-decoder fuzz target with clang's libFuzzer (+ AddressSanitizer and
# UBSan) and runs it for a bounded time. Exit 0 when no crash was found.
#   scripts/fuzz.sh [--seconds N] [--build-dir DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=60
build="$root/build/fuzz"
while (($#)); do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    *) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
cxx=$(command -v clang++ || command -v clang++-14 || true)
if [[ -z "$cxx" ]]; then
  echo "fuzz.sh: clang++ not found (scripts/install_deps.sh installs it)" >&2
  exit 1
fi
mkdir -p "$build/corpus"
cp -n "$root"/tests/fuzz/corpus/* "$build/corpus/" 2>/dev/null || true
bin="$build/store_frames_fuzzer"
# The store's core (rendezvous/core: no Boost) and common/ are all the target needs.
srcs=("$root/tests/fuzz/store_frames_fuzzer.cpp" "$root"/rendezvous/core/*.cpp "$root"/common/*.cpp)
if [[ ! -x "$bin" ]] || [[ -n "$(find "${srcs[@]}" "$root/rendezvous/core" "$root/common" -newer "$bin" -name '*pp' 2>/dev/null | head -1)" ]]; then
  "$cxx" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I"$root" "${srcs[@]}" -lcrypto -o "$bin"
fi
echo "fuzz.sh: running $bin for ${seconds}s"
cd "$build"
DDPRUN_LOG_LEVEL=error "$bin" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 corpus
