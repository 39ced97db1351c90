#!/usr/bin/env bash
# Installs everything ddprun needs to build, test and run its examples on Debian 12.
# Idempotent: packages already present are skipped, so a second run costs a dpkg query.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libboost-dev libboost-system-dev libboost-filesystem-dev
  nlohmann-json3-dev
  libssl-dev   # libcrypto: HMAC-SHA256 for the stores' secret handshake
  googletest libgtest-dev libgmock-dev
  libtorch-dev libgloo-dev
  python3 python3-torch
  dataset-fashion-mnist zlib1g-dev
  clang libclang-rt-14-dev
  iproute2 procps util-linux
  prometheus   # promtool, which checks the daemon's /metrics in the tests
  strace       # the checkpoint test checks the order of fsync and rename
  elfutils     # eu-stack: native stacks of hung workers (--hang_timeout)
  help2man     # the man pages, made from --help
  dpkg-dev     # dpkg-shlibdeps: the Depends of the .deb packages (CPack)
  etcd-server etcd-client   # a real etcd v3 cluster for the etcd rendezvous tests (and etcdctl)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install_deps: all ${#packages[@]} packages already installed"
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install_deps: done"
