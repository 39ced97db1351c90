#!/usr/bin/env bash
# Debian's own checker on the three packages: no error, and no warning beyond the ones docs/operations.md
# explains (its "Packages" section). A new warning fails the test until it is fixed or explained.
#   lintian_test.sh DEBS_DIR
set -euo pipefail
debs=$1
if ! command -v lintian >/dev/null; then
  echo "lintian_test: lintian is not installed (scripts/install_deps.sh installs it)" >&2
  exit 1
fi
shopt -s nullglob
packages=("$debs"/*.deb)
if ((${#packages[@]} == 0)); then
  echo "lintian_test: no .deb in $debs" >&2
  exit 1
fi
# Warnings that may stay, with why (docs/operations.md says the same): none today.
allowed='^$'
out=$(lintian --allow-root --tag-display-limit 0 "${packages[@]}" 2>&1) || true
echo "$out"
status=0
if grep -q '^E: ' <<<"$out"; then
  echo "lintian_test: lintian reports errors (above)" >&2
  status=1
fi
unexplained=$(grep '^W: ' <<<"$out" | grep -Ev "$allowed" || true)
if [[ -n "$unexplained" ]]; then
  echo "lintian_test: warnings docs/operations.md does not explain:" >&2
  echo "$unexplained" >&2
  status=1
fi
# What every package must carry.
for deb in "${packages[@]}"; do
  name=$(dpkg-deb --field "$deb" Package)
  contents=$(dpkg-deb --contents "$deb")
  for f in copyright changelog.gz; do
    if ! grep -q "usr/share/doc/$name/$f\$" <<<"$contents"; then
      echo "lintian_test: $name has no /usr/share/doc/$name/$f" >&2
      status=1
    fi
  done
done
exit $status
