#!/usr/bin/python3
"""--preload against starting every Python worker anew, and against torchrun, in one run.

For the shortest real PyTorch job (import torch.distributed, init_process_group("gloo"), one
barrier) with N workers, prints side by side for ddprun, ddprun --preload torch and torchrun:
  - the time from the launcher's start until every rank passed its first barrier (median of REPEAT);
  - with --max_restarts 1 and rank 1 exiting 3 after the first barrier: the time from that exit to
    the restarted group's barrier (median);
  - the workers' summed PSS after their first barrier (/proc/PID/smaps_rollup).

usage: /usr/bin/python3 preload_bench.py DDPRUN [--counts 4,8] [--repeat 3]
           [--launchers ddprun,preload,torchrun] [--measures first,restart,pss]
A launcher left out prints "-" (and no ratio that needs it).
"""
import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "preload_bench_worker.py")
TESTS_PY = os.path.join(HERE, "..", "tests", "python")
TORCHRUN = os.path.join(TESTS_PY, "torchrun_nolibuv.py")
sys.path.insert(0, TESTS_PY)
from ports import free_port  # noqa: E402

ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHON_EXEC=sys.executable)


def command(launcher, ddprun, n, extra):
    if launcher == "torchrun":
        return [sys.executable, TORCHRUN, "--nproc_per_node", str(n), "--master_port", str(free_port()),
                "--redirects", "1", "--tee", "1"] + extra
    return [ddprun, "--nproc_per_node", str(n)] + (["--preload", "torch"] if launcher == "preload" else []) + extra


def times(d, attempt):
    out = []
    for path in glob.glob(os.path.join(d, "barrier.%d.*" % attempt)):
        with open(path) as f:
            out.append(float(f.read()))
    return out


def first_barrier(launcher, ddprun, n):
    with tempfile.TemporaryDirectory() as d:
        start = time.time()
        r = subprocess.run(command(launcher, ddprun, n, [WORKER, d, "barrier"]), env=ENV, capture_output=True)
        if r.returncode != 0 or len(times(d, 0)) != n:
            raise SystemExit("%s failed (%d): %s" % (launcher, r.returncode, r.stderr.decode()[-2000:]))
        return max(times(d, 0)) - start


def restart(launcher, ddprun, n):
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run(command(launcher, ddprun, n, ["--max_restarts", "1", WORKER, d, "restart"]), env=ENV,
                           capture_output=True)
        if r.returncode != 0 or len(times(d, 1)) != n:
            raise SystemExit("%s restart failed (%d): %s" % (launcher, r.returncode, r.stderr.decode()[-2000:]))
        with open(os.path.join(d, "fail")) as f:
            failed = float(f.read())
        return max(times(d, 1)) - failed


def pss_mib(launcher, ddprun, n):
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.Popen(command(launcher, ddprun, n, [WORKER, d, "pss"]), env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while len(glob.glob(os.path.join(d, "pid.*"))) < n and time.monotonic() < deadline:
            time.sleep(0.05)  # sleep override: polling for the workers' pid files
        total = 0
        for path in glob.glob(os.path.join(d, "pid.*")):
            with open(path) as f:
                pid = int(f.read())
            with open("/proc/%d/smaps_rollup" % pid) as f:
                total += sum(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        open(os.path.join(d, "release"), "w").close()
        p.wait(timeout=120)
        return total / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ddprun")
    ap.add_argument("--counts", default="4,8")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--launchers", default="ddprun,preload,torchrun",
                    help="which to run: ddprun, preload (ddprun --preload torch), torchrun")
    ap.add_argument("--measures", default="first,restart,pss",
                    help="first: the first barrier; restart: failure to restarted barrier; pss: the workers' PSS")
    args = ap.parse_args()
    launchers = args.launchers.split(",")
    measures = {"first": ("first barrier", first_barrier, "s"), "restart": ("failure to restarted barrier", restart, "s"),
                "pss": ("workers' summed PSS", pss_mib, "MiB")}
    print("| workers | measure | ddprun | ddprun --preload torch | torchrun | --preload vs ddprun | --preload vs torchrun |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for n in (int(c) for c in args.counts.split(",")):
        for name, fn, unit in (measures[m] for m in args.measures.split(",")):
            repeat = 1 if fn is pss_mib else args.repeat
            got = {}
            for _ in range(repeat):  # interleaved, so a noisy moment hits every launcher alike
                for launcher in launchers:
                    got.setdefault(launcher, []).append(fn(launcher, args.ddprun, n))
            med = {k: statistics.median(v) for k, v in got.items()}
            runs = {k: ", ".join(("%.2f" if unit == "s" else "%.0f") % x for x in v) for k, v in got.items()}
            fmt = (lambda v: "%.2f %s" % (v, unit)) if unit == "s" else (lambda v: "%.0f %s" % (v, unit))
            cell = lambda k: fmt(med[k]) + (" (%s)" % runs[k] if repeat > 1 else "") if k in med else "-"  # noqa: E731
            ratio = lambda a, b: "%.2fx" % (med[a] / med[b]) if a in med and b in med else "-"  # noqa: E731
            print("| %d | %s | %s | %s | %s | %s | %s |" % (
                n, name, cell("ddprun"), cell("preload"), cell("torchrun"), ratio("preload", "ddprun"),
                ratio("preload", "torchrun")), flush=True)


if __name__ == "__main__":
    main()
