#!/usr/bin/python3
"""How fast a job gets back to training when a node of its world is SIGKILLed: with a hot spare
waiting, against a restarted node (a new ddprun on that host as soon as the old one died, as a
scheduler that restarts the pod at once would), in one run.

A c10d job of --nnodes 2:2 on 127.0.0.1 (hosting the endpoint's store) and 127.0.0.2, one real
PyTorch worker per node (gloo all-reduce every 20 ms) with --preload torch, quick keep-alives
(0.2 s x 3: a lost node is counted lost after about 0.6 s). With a spare, a third ddprun on
127.0.0.3 waits as the job's spare for 8 s (long enough for its --preload imports: a spare waits
for a failure). The node on 127.0.0.2 is SIGKILLed (ddprun and, through its orphan guard, its
worker); the time measured runs from the kill to the new round's first all-reduce on every rank.

usage: /usr/bin/python3 spare_bench.py DDPRUN [--repeat 3]
"""
import argparse
import glob
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
from ports import free_port  # noqa: E402

WORKER = r"""
import datetime, os, sys, time
import torch, torch.distributed as dist
out = sys.argv[1]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
t = torch.zeros(1)
first = True
while not os.path.exists(os.path.join(out, "stop")):
    dist.all_reduce(t)
    if first:
        with open(os.path.join(out, "first.%d" % os.getpid()), "w") as f:
            f.write(repr(time.time()))
        first = False
    time.sleep(0.02)
dist.destroy_process_group()
"""

ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHON_EXEC=sys.executable)
SPARE_WAITED = 8  # seconds
CONF = "join_timeout=60,last_call_timeout=1,keep_alive_interval=0.2,keep_alive_max_attempt=3"


def node(ddprun, port, host, out, worker):
    cmd = [ddprun, "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:%d" % port, "--rdzv_id", "spare-bench",
           "--nnodes", "2:2", "--nproc_per_node", "1", "--local_addr", "127.0.0.%d" % host, "--rdzv_conf", CONF,
           "--preload", "torch", "--max_restarts", "0", worker, out]
    log = open(os.path.join(out, "node%d.log" % host), "w")
    return subprocess.Popen(cmd, env=ENV, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def firsts(out, after=0.0):
    got = []
    for path in glob.glob(os.path.join(out, "first.*")):
        with open(path) as f:
            text = f.read()
        if text:
            got.append(float(text))
    return sorted(t for t in got if t > after)


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit("spare_bench: timed out waiting for " + what)
        time.sleep(0.01)  # sleep override: polling the workers' files


def one(ddprun, with_spare):
    with tempfile.TemporaryDirectory() as out:
        worker = os.path.join(out, "worker.py")
        with open(worker, "w") as f:
            f.write(WORKER)
        port = free_port()
        nodes = [node(ddprun, port, 1, out, worker)]
        time.sleep(0.5)  # sleep override: node 1 binds the endpoint first, so it is group rank 0
        nodes.append(node(ddprun, port, 2, out, worker))
        wait_for(lambda: len(firsts(out)) >= 2, 120, "the first round")
        if with_spare:
            nodes.append(node(ddprun, port, 3, out, worker))
            wait_for(lambda: "as a spare" in open(os.path.join(out, "node3.log")).read(), 60, "the spare")
            # A spare waits for a failure, usually for long: long enough for its --preload imports.
            time.sleep(SPARE_WAITED)  # sleep override: the spare's time on the bench before the failure
        killed_at = time.time()
        os.killpg(nodes[1].pid, signal.SIGKILL)  # the node: its ddprun and its worker
        nodes[1].wait()
        if not with_spare:
            nodes.append(node(ddprun, port, 2, out, worker))  # the node back at once
        wait_for(lambda: len(firsts(out, killed_at)) >= 2, 120, "the next round")
        back = max(firsts(out, killed_at)[:2]) - killed_at
        open(os.path.join(out, "stop"), "w").close()
        for p in nodes[:1] + nodes[2:]:
            if p.wait(timeout=120) != 0:
                raise SystemExit("spare_bench: a node ended with %d:\n%s" % (
                    p.returncode, open(os.path.join(out, "node1.log")).read()[-3000:]))
        return back


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ddprun")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    got = {True: [], False: []}
    for _ in range(args.repeat):  # interleaved, so a noisy moment hits both alike
        for with_spare in (True, False):
            got[with_spare].append(one(args.ddprun, with_spare))
    spare, restarted = statistics.median(got[True]), statistics.median(got[False])
    print("| SIGKILLed node to the next round's first all-reduce | hot spare | restarted node | ratio |")
    print("|---|---:|---:|---:|")
    print("| median of %d (runs: %s / %s) | %.2f s | %.2f s | %.2fx |" % (
        args.repeat, ", ".join("%.2f" % t for t in got[True]), ", ".join("%.2f" % t for t in got[False]),
        spare, restarted, restarted / spare))


if __name__ == "__main__":
    main()
