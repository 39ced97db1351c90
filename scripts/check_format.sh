#!/usr/bin/env bash
# Checks that every C++ file of the repository is as clang-format writes it with the checked-in
# .clang-format. The style is pinned to clang-format 14 (Debian 12's): another version formats some
# constructs otherwise, so there the check is skipped (exit 77) rather than failed.
#   check_format.sh [ROOT]          check (exit 1 naming the files that differ)
#   check_format.sh --fix [ROOT]    rewrite them
set -euo pipefail
fix=0
[[ ${1:-} == --fix ]] && { fix=1; shift; }
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"
tool=$(command -v clang-format-14 || command -v clang-format || true)
[[ -n $tool ]] || { echo "check_format: clang-format is not installed (scripts/install_deps.sh installs it)" >&2; exit 2; }
version=$("$tool" --version | sed -n 's/.*clang-format version \([0-9][0-9]*\)\..*/\1/p')
if [[ $version != 14 ]]; then
  echo "check_format: skipped: the style is pinned to clang-format 14 (Debian 12's), this is $version"
  exit 77
fi
# Tracked files and new ones not yet added (a new file is checked and fixed before its commit),
# never what .gitignore names (build trees).
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.cpp' '*.hpp' '*.h' |
  grep -v '^tests/fuzz/corpus/')
if ((fix)); then
  "$tool" -i "${files[@]}"
  echo "check_format: ${#files[@]} files formatted"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$tool" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "check_format: ${#bad[@]} of ${#files[@]} files differ from clang-format $version's output; fix them with" \
       "scripts/check_format.sh --fix (or clang-format -i FILE):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "check_format: ${#files[@]} files as clang-format $version writes them"
