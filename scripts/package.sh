#!/usr/bin/env bash
# Builds ddprun (Release, without the tests) and writes its Debian packages into OUT_DIR with CPack:
#   ddprun_<version>_<arch>.deb           ddprun, ddprun-rendezvous, man pages, bash completion, the
#                                         daemon's systemd unit and config file
#   ddprun-dev_<version>_<arch>.deb       the worker SDK: headers, static libraries, CMake package
#   ddprun-examples_<version>_<arch>.deb  the example training programs
# Install with: sudo apt install ./OUT_DIR/ddprun_<version>_<arch>.deb
#   scripts/package.sh OUT_DIR            (build tree: build-release/, or $DDPRUN_PACKAGE_BUILD_DIR)
set -euo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: scripts/package.sh OUT_DIR" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1"
out=$(cd "$1" && pwd)
build="${DDPRUN_PACKAGE_BUILD_DIR:-$root/build-release}"
"$root/scripts/install_deps.sh"
DDPRUN_BUILD_DIR="$build" DDPRUN_BUILD_TYPE=Release "$root/scripts/build.sh" -DDDPRUN_BUILD_TESTS=OFF \
  -DCMAKE_INSTALL_PREFIX=/usr
staging="$build/_packages"
rm -rf "$staging"
cpack --config "$build/CPackConfig.cmake" -B "$staging"
mv "$staging"/*.deb "$out"/
rm -rf "$staging"
ls -l "$out"/*.deb
