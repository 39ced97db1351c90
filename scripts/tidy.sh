#!/usr/bin/env bash
# Runs clang-tidy with the checked-in .clang-tidy over the translation units of common/, rendezvous/
# and launcher/ in BUILD_DIR's compile_commands.json (the SDK's, LibTorch's, are left to the
# compiler's warnings: a LibTorch translation unit takes clang-tidy minutes). Pinned to clang-tidy
# 14 (Debian 12's): another version has other checks, so there it skips (exit 77).
#   tidy.sh [BUILD_DIR]    (default build/); exit 1 with the findings when there are any
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
tool=$(command -v clang-tidy-14 || command -v clang-tidy || true)
[[ -n $tool ]] || { echo "tidy: clang-tidy is not installed (scripts/install_deps.sh installs it)" >&2; exit 2; }
version=$("$tool" --version | sed -n 's/.*LLVM version \([0-9][0-9]*\)\..*/\1/p')
if [[ $version != 14 ]]; then
  echo "tidy: skipped: the checks are pinned to clang-tidy 14 (Debian 12's), this is $version"
  exit 77
fi
[[ -f $build/compile_commands.json ]] || { echo "tidy: no $build/compile_commands.json: configure first" >&2; exit 2; }
mapfile -t units < <(python3 - "$build/compile_commands.json" "$root" <<'PY'
import json, os, sys
root = os.path.realpath(sys.argv[2])
for entry in json.load(open(sys.argv[1])):
    f = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
    rel = os.path.relpath(f, root)
    if rel.split("/")[0] in ("common", "rendezvous", "launcher") and f.endswith(".cpp"):
        print(f)
PY
)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
printf '%s\n' "${units[@]}" | sort -u | xargs -P "$(nproc)" -n 4 "$tool" -p "$build" --quiet 2>/dev/null >"$out" || true
findings=$(grep -cE '^/.*: (warning|error): ' "$out" || true)
if ((findings > 0)); then
  grep -E '^/.*: (warning|error): ' "$out" | sort -u
  echo "tidy: $findings finding(s) in ${#units[@]} translation units (clang-tidy $version, .clang-tidy)"
  exit 1
fi
echo "tidy: ${#units[@]} translation units clean (clang-tidy $version, .clang-tidy)"
