#!/usr/bin/env bash
# Installs everything ddprun needs to build, test and run its examples on Debian 12 (bookworm) or
# Debian 13 (trixie). Names that differ between releases are worked out here (the clang runtime
# that matches the clang this release ships). Idempotent: packages already present are skipped,
# so a second run costs a dpkg query. `--main-job`: only what building ddprun and the examples and
# running the main job need (scripts/run_main.sh): no test tools, services or browsers.
#   scripts/install_deps.sh [--main-job]
set -euo pipefail

main_job=(
  build-essential cmake ninja-build pkg-config ca-certificates
  libboost-dev libboost-system-dev libboost-filesystem-dev
  nlohmann-json3-dev
  libssl-dev   # libcrypto: HMAC-SHA256 for the stores' secret handshake
  libtorch-dev libgloo-dev
  dataset-fashion-mnist zlib1g-dev
)
if [[ ${1:-} == --main-job ]]; then
  packages=("${main_job[@]}")
elif [[ $# -gt 0 ]]; then
  echo "install_deps: unknown argument '$1' (usage: install_deps.sh [--main-job])" >&2
  exit 2
else
# Everything else: the tests, the checks, the benchmarks and the packages.
packages=(
  "${main_job[@]}"
  git
  googletest libgtest-dev libgmock-dev
  python3 python3-torch
  clang        # the store's fuzzer (libFuzzer); its runtime package is added below
  clang-format # the C++ style check (scripts/check_format.sh; pinned to Debian 12's clang-format 14)
  clang-tidy   # the lint of the launcher and the store (scripts/tidy.sh; pinned to clang-tidy 14)
  iproute2 procps util-linux
  nftables     # the partition tests cut a network namespace off
  dnsmasq-base # the Kubernetes pods' DNS server in the kubeflow_pods test (it answers late on purpose)
  prometheus   # promtool, which checks the daemon's /metrics in the tests
  strace       # the checkpoint test checks the order of fsync and rename
  elfutils     # eu-stack: native stacks of hung workers (--hang_timeout)
  help2man     # the man pages, made from --help
  bc           # the benchmarks' ratios (benchmarks/*.sh)
  dpkg-dev file  # dpkg-shlibdeps (which runs file): the Depends of the .deb packages (CPack)
  lintian      # Debian's checker, run on the packages by the tests
  etcd-server etcd-client   # a real etcd v3 cluster for the etcd rendezvous tests (and etcdctl)
  slurm-wlm munge           # a real Slurm (slurmctld, slurmd, srun, sbatch) for the sbatch recipe's test
  debootstrap               # scripts/debian_root.sh (a Debian 12 or 13 root) and its test
  chromium                  # a real browser (headless) loads the job pages (/ui) in the tests
  tmux                      # a real terminal for ddprun-top's test
)
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
updated=0
update_once() {
  if ((updated == 0)); then
    $sudo apt-get update -qq
    updated=1
  fi
}

if [[ ${1:-} != --main-job ]]; then
# libFuzzer's runtime is libclang-rt-N-dev for the clang N of this release (14 on Debian 12, 19 on
# Debian 13): from the installed clang, else from the archive's clang package.
clang_major() {
  if command -v clang >/dev/null 2>&1; then
    clang --version | sed -n 's/.*clang version \([0-9][0-9]*\)\..*/\1/p' | head -n 1
  else
    apt-cache depends clang 2>/dev/null | sed -n 's/^ *Depends: clang-\([0-9][0-9]*\)$/\1/p' | head -n 1
  fi
}
clang_version=$(clang_major)
if [[ -z "$clang_version" ]]; then
  update_once
  clang_version=$(clang_major)
fi
if [[ -z "$clang_version" ]]; then
  echo "install_deps: cannot tell which clang this Debian release ships ('apt-cache depends clang' names no clang-N);" \
    "is this Debian 12 or 13 with its main archive in the apt sources?" >&2
  exit 1
fi
packages+=("libclang-rt-${clang_version}-dev")
fi

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
update_once
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install_deps: done"
