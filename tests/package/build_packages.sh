#!/usr/bin/env bash
# Builds the Debian packages of a build tree with CPack (as scripts/package.sh does for a Release
# tree) into OUT_DIR, for the installed-package tests.
#   build_packages.sh BUILD_DIR OUT_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
out=$2
rm -rf "$out"
mkdir -p "$out"
cpack --config "$build/CPackConfig.cmake" -B "$out/cpack" > "$out/cpack.log" 2>&1 || { cat "$out/cpack.log"; exit 1; }
mv "$out"/cpack/*.deb "$out"/
rm -rf "$out/cpack"
ls "$out"/*.deb
