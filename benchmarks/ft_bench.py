"""Fault-tolerant replica groups against a restart of the world, side by side in one run.

Three data-parallel workers train the same MLP (benchmarks/ft_bench_worker.py, --mb megabytes of
parameters) on this machine, 1 rank each:
  - plain: one ddprun job of 3 ranks, Python DDP (steps/s without faults: the reference);
  - restart: the same job checkpointing every step (a durable replace) and resuming after a restart
    (--max_restarts 1): what a job without fault tolerance does to lose as little as it can;
  - ft: 3 replica groups (ddprun --replica_group, ddprun_ft), the quorum on a ddprun-rendezvous;
  - torchrun: the restart job under the machine's torchrun (Debian 12: 1.13, Debian 13: 2.6), with its
    defaults (its agent checks its workers every --monitor_interval).
Steps/s without faults, plain against ft; then worker 1 SIGKILLed --kills times in one job, first at
step --kill-at, then each time once its restarted process has made --kill-every steps of its own,
and the time from each kill to the next step the job commits (restart: a restarted rank's first
step; ft: the survivors' first commit after it): the median, with the fastest and slowest kill, and
the ratio of the medians. Last, a replica group of --heal-mb megabytes of parameters is killed and
the time its restarted rank takes to fetch and load its peer's state (parameters and momentum:
twice the parameters) is reported.

Every ddprun runs the command the docs give (no --local_addr: the host is known by its name).
The killed worker's restart must find the others still training: keep --steps well above what the
kills take (the survivors train on while the victim restarts: about 100 steps a kill here).

usage: /usr/bin/python3 benchmarks/ft_bench.py BUILD_DIR [--mb 4] [--steps 1000] [--kill-at 20]
           [--kills 5] [--kill-every 25] [--heal-mb 100]
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "ft_bench_worker.py")
TESTS_PY = os.path.join(HERE, "..", "tests", "python")
# torchrun itself; on a PyTorch >= 2.4 without libuv (Debian 13's 2.6) through a wrapper that gives
# its store use_libuv=False.
TORCHRUN = os.path.join(TESTS_PY, "torchrun_nolibuv.py")
sys.path.insert(0, TESTS_PY)
from daemon import Daemon  # noqa: E402  (the tests' helper: a daemon on a kernel-picked port)
from ports import free_port  # noqa: E402

ENV = dict(os.environ, PYTHON_EXEC=sys.executable, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")


def events(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def wait_for(fact, timeout, what):
    deadline = time.monotonic() + timeout
    while not fact():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out waiting for " + what)
        time.sleep(0.02)  # sleep override: polling the workers' logs


def steps_per_second(log):
    t = [e["t"] for e in events(log) if e["event"] == "step"]
    return (len(t) - 1) / (t[-1] - t[0]) if len(t) > 1 else 0.0


class Run:
    """One job: the restart baseline (one ddprun of 3 ranks) or 3 replica groups."""

    def __init__(self, build, mode, steps, mb, work, restarts=1):
        self.mode, self.work, self.procs = mode, work, []
        self.kills = []  # (time, pids seen before it) of each kill
        ddprun = os.path.join(build, "launcher", "ddprun")
        if mode in ("plain", "restart", "torchrun"):
            argv = [ddprun, "--nproc_per_node", "3", "--max_restarts", str(restarts),
                    WORKER, mode, str(steps), work, str(mb)]
            if mode == "torchrun":  # (Debian 12's torchrun 1.13 needs --redirects 1 --tee 1 on Python 3.11)
                argv = [sys.executable, TORCHRUN, "--nproc_per_node", "3", "--max_restarts", str(restarts),
                        "--master_addr",
                        "127.0.0.1", "--master_port", str(free_port()), "--redirects", "1", "--tee", "1",
                        WORKER, "restart", str(steps), work, str(mb)]
            self.procs.append(subprocess.Popen(argv, env=ENV, stdout=subprocess.DEVNULL,
                                               stderr=open(os.path.join(work, "ddprun.err"), "w")))
            self.logs = [os.path.join(work, "plainr%d.log" % r) for r in range(3)]
        else:
            self.daemon = Daemon(os.path.join(build, "rendezvous", "ddprun-rendezvous"))
            for g in range(3):
                argv = [ddprun, "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                        "127.0.0.1:%d" % self.daemon.port, "--rdzv_id", "bench", "--replica_group", str(g),
                        "--min_replica_groups", "2", "--max_restarts", str(restarts),
                        "--rdzv_conf", "quorum_join_timeout=30,quorum_heartbeat_timeout=5",
                        WORKER, "ft", str(steps), work, str(mb)]
                self.procs.append(subprocess.Popen(argv, env=ENV, stdout=subprocess.DEVNULL,
                                                   stderr=open(os.path.join(work, "ddprun%d.err" % g), "w")))
            self.logs = [os.path.join(work, "g%dr0.log" % g) for g in range(3)]

    def steps_of(self, i):
        return [e for e in events(self.logs[i]) if e["event"] == "step"]

    def kill_at(self, step, fresh):
        """SIGKILLs worker 1 once the job is at `step` and a process of it that started after the
        last kill has made `fresh` steps of its own; returns the kill's wall-clock time."""
        old = {pid for _, seen in self.kills for pid in seen}

        def victim():
            mine = [e for e in self.steps_of(1) if e["pid"] not in old]
            return mine[-1]["pid"] if len(mine) >= fresh and mine[-1]["step"] >= step else None

        wait_for(lambda: victim() is not None, 300, "step %d" % step)
        before = {e["pid"] for i in range(len(self.logs)) for e in self.steps_of(i)}
        os.kill(victim(), signal.SIGKILL)
        killed = time.time()
        self.kills.append((killed, before))
        return killed

    def stalls(self):
        """Seconds from each kill to the next step the job committed: for the restart baseline the
        first step of a restarted rank (a step the old ranks finish after the kill is lost with the
        restart), for replica groups a survivor's first commit."""
        out = []
        for killed, before in self.kills:
            if self.mode == "ft":
                after = [e["t"] for i in (0, 2) for e in self.steps_of(i) if e["t"] > killed]
            else:
                after = [e["t"] for i in range(3) for e in self.steps_of(i) if e["pid"] not in before]
            out.append(min(after) - killed if after else float("nan"))
        return out

    def finish(self):
        try:
            for p in self.procs:
                if p.wait(timeout=600) != 0:
                    raise RuntimeError("%s job failed: see %s" % (self.mode, self.work))
        finally:
            self.cleanup()

    def cleanup(self):
        """A failed run leaves nothing behind: its ddprun processes and its daemon end here."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if self.mode == "ft" and self.daemon.proc.poll() is None:
            self.daemon.stop()


def run(build, mode, steps, mb, kill_at=(), every=1):
    """One job; with `kill_at` (steps), worker 1 is killed at each of them in turn, each time once
    its process of the time has made `every` steps."""
    work = tempfile.mkdtemp(prefix="ddprun_ft_bench_")
    r = Run(build, mode, steps, mb, work, restarts=max(1, len(kill_at)))
    try:
        out = {}
        if kill_at:
            for step in kill_at:
                r.kill_at(step, every)
            step_time = 1.0 / max(steps_per_second(r.logs[0]), 1e-9)
            r.finish()
            out["stalls"] = r.stalls()
            out["step"] = step_time
            # The restarted group's healing (a first one, before the first commit, moved the first
            # group's initial state only).
            first_pids = r.kills[0][1]
            heals = [e for e in events(r.logs[1]) if e["event"] == "heal" and e["pid"] not in first_pids]
            if heals:
                out["heal"] = heals[0]
        else:
            r.finish()
            out["steps_per_s"] = steps_per_second(r.logs[0])
    finally:
        r.cleanup()
    shutil.rmtree(work, ignore_errors=True)  # kept when the run failed, for a look
    return out


def spread(stalls):
    """'median (fastest-slowest)' of a run's stalls, in seconds."""
    return "%.2f (%.2f-%.2f)" % (statistics.median(stalls), min(stalls), max(stalls))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--mb", type=float, default=4)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--kill-at", type=int, default=20)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--kill-every", type=int, default=25)
    ap.add_argument("--heal-mb", type=float, default=100)
    a = ap.parse_args()
    kills = [a.kill_at] * a.kills
    plain = run(a.build, "plain", a.steps, a.mb)
    ft = run(a.build, "ft", a.steps, a.mb)
    print("| without faults, %g MB of parameters | Python DDP | replica groups | ratio |" % a.mb)
    print("|---|---:|---:|---:|")
    print("| steps/s | %.1f | %.1f | %.2fx |" % (plain["steps_per_s"], ft["steps_per_s"],
                                                 ft["steps_per_s"] / plain["steps_per_s"]))
    plain_k = run(a.build, "restart", a.steps, a.mb, kill_at=kills, every=a.kill_every)
    ft_k = run(a.build, "ft", a.steps, a.mb, kill_at=kills, every=a.kill_every)
    torch_k = run(a.build, "torchrun", a.steps, a.mb, kill_at=kills, every=a.kill_every)
    import torch
    print()
    print("| worker 1 SIGKILLed %d times (from step %d, then %d steps after each comeback) | torchrun %s, restart of"
          " the world | ddprun, restart of the world | ddprun, replica groups | torchrun / groups |"
          " ddprun restart / groups |" % (len(kills), a.kill_at, a.kill_every, torch.__version__.split("+")[0]))
    print("|---|---:|---:|---:|---:|---:|")
    med = {k: statistics.median(v["stalls"]) for k, v in (("t", torch_k), ("p", plain_k), ("f", ft_k))}
    print("| kill to the next committed step, s: median (fastest-slowest) | %s | %s | %s | %.1fx | %.1fx |"
          % (spread(torch_k["stalls"]), spread(plain_k["stalls"]), spread(ft_k["stalls"]), med["t"] / med["f"],
             med["p"] / med["f"]))
    print("| one step without faults, s | %.3f | %.3f | %.3f | | |" % (torch_k["step"], plain_k["step"], ft_k["step"]))
    print("| every kill, replica groups, s | %s | | | | |" % " ".join("%.2f" % x for x in ft_k["stalls"]))
    heal = run(a.build, "ft", a.steps, a.heal_mb, kill_at=[a.kill_at // 2], every=a.kill_every).get("heal")
    print()
    if heal:
        print("healing a replica group of %g MB of parameters: %.1f MB of state (parameters and momentum) "
              "fetched and loaded in %.2f s" % (a.heal_mb, heal["bytes"] / 2 ** 20, heal["seconds"]))
    else:
        print("healing: the killed group never healed (see the logs)")


if __name__ == "__main__":
    main()
