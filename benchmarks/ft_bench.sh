#!/usr/bin/env bash
# Fault-tolerant replica groups against a restart of the world from a checkpoint, in one run (see
# benchmarks/ft_bench.py for what is measured and how).
#   benchmarks/ft_bench.sh BUILD_DIR [--mb 4] [--steps 1000] [--kill-at 20] [--kills 5] [--kill-every 25] [--heal-mb 100]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec /usr/bin/python3 "$here/ft_bench.py" "$@"
