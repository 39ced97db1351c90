#!/usr/bin/python3
"""Launch overhead: ddprun vs Debian's torchrun (--no_python) on the same worker binary, in one run.

For N workers that (a) exit at once and (b) connect to the store and pass an add+wait barrier,
reports the median wall time over REPEAT runs and the launcher's peak RSS (VmHWM of the launcher
process itself, sampled from /proc while it runs).

usage: /usr/bin/python3 launch_bench.py DDPRUN LAUNCH_BENCH_WORKER [--counts 1,4,16,64] [--repeat 3]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time


# torchrun itself; on a PyTorch >= 2.4 without libuv (Debian 13's 2.6) through a wrapper that gives its
# TCPStores use_libuv=False, without which it cannot start any job there.
TESTS_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python")
TORCHRUN = os.path.join(TESTS_PY, "torchrun_nolibuv.py")
sys.path.insert(0, TESTS_PY)
from ports import free_port  # noqa: E402  (a port reserved for this process: no probe-then-bind race)


def peak_rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def measure(cmd):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    while p.poll() is None:
        rss = peak_rss_kib(p.pid)
        if rss:
            peak = max(peak, rss)
        time.sleep(0.002)  # sleep override: sampling /proc while the launcher runs
    wall = time.perf_counter() - start
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed with {p.returncode}: {' '.join(cmd)}")
    return wall, peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ddprun")
    ap.add_argument("worker")
    ap.add_argument("--counts", default="1,4,16,64")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    print("| workers | worker | torchrun s | ddprun s | speedup (ratio of medians) | speedup range over pairs "
          "| torchrun peak RSS MB | ddprun peak RSS MB |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for mode in ("exit", "barrier"):
        for n in counts:
            results = {"torchrun": [], "ddprun": []}
            for _ in range(args.repeat):
                torchrun = [sys.executable, TORCHRUN, "--nproc_per_node", str(n), "--master_port", str(free_port()), "--redirects", "1", "--tee", "1", "--no_python",
                            args.worker, mode]
                ours = [args.ddprun, "--nproc_per_node", str(n), args.worker, mode]
                results["torchrun"].append(measure(torchrun))
                results["ddprun"].append(measure(ours))
            t_wall = statistics.median(w for w, _ in results["torchrun"])
            d_wall = statistics.median(w for w, _ in results["ddprun"])
            t_rss = max(r for _, r in results["torchrun"]) / 1024
            d_rss = max(r for _, r in results["ddprun"]) / 1024
            # Each repeat runs torchrun then ddprun: a pair, so the range is of like-for-like ratios.
            pairs = [t / d for (t, _), (d, _) in zip(results["torchrun"], results["ddprun"])]
            print(f"| {n} | {mode} | {t_wall:.3f} | {d_wall:.3f} | {t_wall / d_wall:.1f}x "
                  f"| {min(pairs):.0f}x - {max(pairs):.0f}x | {t_rss:.1f} | {d_rss:.1f} |", flush=True)


if __name__ == "__main__":
    main()
