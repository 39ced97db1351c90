"""What failures cost a fault-tolerant job in accuracy: the same job of replica groups trained once
without faults and once while a random group is SIGKILLed every few steps, side by side in one run.

Each of --groups replica groups is one ddprun (--replica_group, one rank) running
examples/fashion_mnist_lenet --fault-tolerant on Fashion-MNIST (/usr/share/datasets/fashion-mnist),
the quorum on a ddprun-rendezvous. In the faulty run, whenever every group is up and --every more
steps were committed since the last kill, one group chosen at random (seeded: --seed) is SIGKILLed;
its ddprun restarts it and it heals from a peer. Printed: for each run the committed steps, the kills,
the wall-clock time and the test accuracy, and the difference in points. Checked on the way (a
failure ends the run with the reason): every committed step has one parameter hash in every group
that committed it, no group's process was restarted unless it was killed, each restarted group's
first commit healed, and every group that finished the training ends on the same parameters (a
group killed near the end may come back after the others finished: it is told that the job is over).

usage: /usr/bin/python3 benchmarks/ft_accuracy.py BUILD_DIR [--groups 3] [--nproc 1] [--epochs 3]
           [--batch-size 64] [--every 40] [--train-limit N] [--seed 1] [--check POINTS]
--nproc: ranks per group (DDP inside the group). --check: exit 1 unless the two accuracies are within
POINTS points and the faulty run killed a group at least twice (ctest's ft.accuracy_under_faults).
"""
import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
from daemon import Daemon  # noqa: E402  (the tests' helper: a daemon on a kernel-picked port)

ENV = dict(os.environ, OMP_NUM_THREADS="1")


def read_log(path):
    """Rank 0's commits in a group's commit log. A line torn by a SIGKILL (the kernel stops a write at
    a page boundary; the example ends it when it starts again) is left out."""
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            try:
                e = json.loads(line) if line.endswith("\n") and line.strip() else None
            except ValueError:
                e = None
            if e is not None and e.get("rank", 0) == 0:
                out.append(e)
    return out


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def run(build, a, faults):
    """One job; returns {"accuracy", "steps", "kills", "seconds"}."""
    work = tempfile.mkdtemp(prefix="ddprun_ft_accuracy_")
    daemon = Daemon(os.path.join(build, "rendezvous", "ddprun-rendezvous"))
    # Each group's commit log (every rank of a group appends to it; rank 0's lines are read).
    logs = [os.path.join(work, "commits%d.log" % g) for g in range(a.groups)]
    procs, outs = [], []
    try:
        for g in range(a.groups):
            argv = [os.path.join(build, "launcher", "ddprun"), "--nproc_per_node", str(a.nproc), "--rdzv_backend", "c10d",
                    "--rdzv_endpoint", "127.0.0.1:%d" % daemon.port, "--rdzv_id", "accuracy", "--replica_group",
                    str(g), "--min_replica_groups", "1", "--max_restarts", "1000", "--local_addr", "127.0.0.1",
                    os.path.join(build, "examples", "fashion_mnist_lenet"), "--fault-tolerant", "--epochs",
                    str(a.epochs), "--batch-size", str(a.batch_size), "--commit-log", logs[g]]
            if a.train_limit:
                argv += ["--train-limit", str(a.train_limit)]
            outs.append(os.path.join(work, "out%d" % g))
            with open(outs[-1], "w") as out, open(os.path.join(work, "err%d" % g), "w") as err:
                procs.append(subprocess.Popen(argv, env=ENV, stdout=out, stderr=err))
        rng = random.Random(a.seed)
        kills, last_kill, started = [], 0, time.monotonic()
        while any(p.poll() is None for p in procs):
            time.sleep(0.05)  # sleep override: polling the groups' commit logs
            if not faults:
                continue
            commits = [read_log(path) for path in logs]
            if not all(commits):
                continue
            top = max(c[-1]["step"] for c in commits)
            # Every group up: its newest process committed one of the last two steps.
            up = all(alive(c[-1]["pid"]) and c[-1]["step"] >= top - 2 for c in commits)
            if up and top - last_kill >= a.every and all(p.poll() is None for p in procs):
                victim = rng.randrange(a.groups)
                os.kill(commits[victim][-1]["pid"], signal.SIGKILL)
                kills.append((victim, commits[victim][-1]["pid"], top))
                last_kill = top
        seconds = time.monotonic() - started
        for g, p in enumerate(procs):
            if p.returncode != 0:
                raise RuntimeError("group %d exited with %d: see %s" % (g, p.returncode, work))
        check(logs, kills)
        results = []
        for path in outs:
            with open(path) as f:
                lines = [line for line in f if '"fault_tolerant"' in line]
            # (A group killed near the end may come back after the others finished: it is told the
            # job is over and prints no result.)
            if lines:
                results.append(json.loads(lines[-1][lines[-1].index("{"):]))
        if not results or len({r["test_accuracy"] for r in results}) != 1:
            raise RuntimeError("the groups ended on different models: %s" % results)
        if not os.environ.get("KEEP"):
            shutil.rmtree(work, ignore_errors=True)
        return {"accuracy": results[0]["test_accuracy"], "steps": results[0]["committed_steps"],
                "kills": len(kills), "seconds": seconds}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        daemon.stop()


def check(logs, kills):
    by_step = collections.defaultdict(set)
    for path in logs:
        commits = read_log(path)
        for c in commits:
            by_step[c["step"]].add(c["hash"])
        pids = [c["pid"] for c in commits]
        for i, c in enumerate(commits[1:], 1):
            if c["pid"] != pids[i - 1] and not c["healed"]:
                raise RuntimeError("%s: a restarted group's first commit (step %d) did not heal" % (path, c["step"]))
    for step, hashes in by_step.items():
        if len(hashes) != 1:
            raise RuntimeError("step %d was committed with %d different parameter hashes" % (step, len(hashes)))
    killed = {pid for _, pid, _ in kills}
    for path in logs:
        commits = read_log(path)
        # A process ends only by a kill: every process but a group's newest was one of the victims.
        ended = {c["pid"] for c in commits} - {commits[-1]["pid"]}
        if ended - killed:
            raise RuntimeError("%s: processes %s were restarted without being killed" % (path, sorted(ended - killed)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--groups", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--check", type=float, default=None)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--every", type=int, default=40)
    ap.add_argument("--train-limit", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    clean = run(a.build, a, faults=False)
    faulty = run(a.build, a, faults=True)
    print("| %d replica groups of %d rank(s), LeNet, %d epochs, batch %d per rank | steps committed | groups killed "
          "| s | test accuracy |" % (a.groups, a.nproc, a.epochs, a.batch_size))
    print("|---|---:|---:|---:|---:|")
    print("| without faults | %d | 0 | %.0f | %.4f |" % (clean["steps"], clean["seconds"], clean["accuracy"]))
    print("| a random group SIGKILLed every %d steps | %d | %d | %.0f | %.4f |"
          % (a.every, faulty["steps"], faulty["kills"], faulty["seconds"], faulty["accuracy"]))
    points = 100 * (faulty["accuracy"] - clean["accuracy"])
    print("\ndifference: %+.2f points of test accuracy" % points)
    if a.check is not None and (abs(points) > a.check or faulty["kills"] < 2):
        sys.exit("FAIL: %+.2f points apart (allowed: %g) with %d kills (at least 2 needed)"
                 % (points, a.check, faulty["kills"]))


if __name__ == "__main__":
    main()
