#!/usr/bin/python3
"""Store barrier: N real PyTorch TCPStore clients against ddprun-rendezvous and against PyTorch's own
server, interleaved in one run, idle and with every core busy.

Each barrier runs in a fresh Python process; each client is a thread of it with its own connection
(as N ranks would each have one): connect, add("arrived", 1), the last one sets "go", every one
waits for "go" and gets it. The time is from the first connect to the last get. The two servers
take turns in ABBA order (ddprun first in odd pairs, PyTorch first in even ones), so a drift of the
machine's speed during the run favours neither. "Busy" runs one spinning process per core beside
it: the situation of a rank-0 node whose workers use every core while its ddprun hosts their store.

usage: /usr/bin/python3 store_barrier_bench.py DDPRUN_RENDEZVOUS [--clients 1024] [--repeat 5]
                                                [--load idle,busy] [--sched]
"""
import argparse
import datetime
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from daemon import Daemon  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

TIMEOUT = datetime.timedelta(seconds=120)
CLIENTS = []

# PyTorch's own server in a process of its own, libuv where this PyTorch has it; prints its port.
TORCH_SERVER = r"""
import datetime, sys, torch.distributed as dist
t = datetime.timedelta(seconds=600)
try:
    s = dist.TCPStore("127.0.0.1", 0, None, True, t, wait_for_workers=False)
except Exception:
    s = dist.TCPStore("127.0.0.1", 0, None, True, t, wait_for_workers=False, use_libuv=False)
print(s.port, flush=True)
sys.stdin.read()
"""


def client_kwargs():
    # A client never needs libuv; PyTorch >= 2.4 without it refuses its default of True. (Asked of the
    # docstring: a TCPStore whose construction fails can abort the interpreter when it is freed.)
    return {"use_libuv": False} if "use_libuv" in (dist.TCPStore.__init__.__doc__ or "") else {}


def barrier(port, n, kwargs):
    errors = []
    start = threading.Barrier(n + 1)

    def one():
        try:
            start.wait()
            s = dist.TCPStore("127.0.0.1", port, None, False, TIMEOUT, **kwargs)
            CLIENTS.append(s)  # kept until the process exits: see main()
            if s.add("arrived", 1) == n:
                s.set("go", "1")
            s.wait(["go"])
            assert s.get("go") == b"1"
        except Exception as e:  # reported after the run
            errors.append(repr(e))
            print(f"client failed: {e!r}", file=sys.stderr, flush=True)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    start.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} clients failed, first: {errors[0]}")
    return elapsed


def sched(pid):
    """(CPU s, run-queue wait s, voluntary switches, preemptions) summed over the threads of PID."""
    cpu = wait = switches = preempted = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                c, w, _ = f.read().split()
            cpu += int(c)
            wait += int(w)
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        switches += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        preempted += int(line.split()[1])
        except (OSError, ValueError):
            pass  # a thread that ended meanwhile
    return cpu / 1e9, wait / 1e9, switches, preempted


def barrier_in_process(port, n):
    """One barrier in a fresh process of its own (no threads, memory or GC state left from earlier
    runs); returns its time."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--barrier", str(port), str(n)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         timeout=TIMEOUT.total_seconds() + 60)
    if out.returncode != 0:
        raise RuntimeError(f"the barrier's process exited with {out.returncode}; its stdout: {out.stdout[-500:]!r}; "
                           f"the end of its stderr:\n{out.stderr[-3000:]}")
    return float(out.stdout.split()[-1])


def measured(pid, port, n):
    """The barrier's time and what the server at PID spent on it: (s, CPU s, wait s, sleeps, preemptions)."""
    before = sched(pid)
    t = barrier_in_process(port, n)
    after = sched(pid)
    return (t,) + tuple(a - b for a, b in zip(after, before))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def run_ours(daemon_bin, n):
    with Daemon(daemon_bin) as d:
        m = measured(d.proc.pid, d.port, n)
        return m, rss_kib(d.proc.pid)


def run_theirs(n):
    p = subprocess.Popen([sys.executable, "-c", TORCH_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())
        m = measured(p.pid, port, n)
        return m, rss_kib(p.pid)
    finally:
        p.stdin.close()
        p.wait(timeout=30)


def spinners(count):
    return [subprocess.Popen(["/bin/sh", "-c", "while :; do :; done"]) for _ in range(count)]


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--barrier":  # one barrier, in a process of its own
        print(barrier(int(sys.argv[2]), int(sys.argv[3]), client_kwargs()), flush=True)
        # Exit without freeing the clients: with PyTorch 2.6 on Python 3.13, freeing 1024 TCPStores
        # made by as many threads at once sometimes aborts the interpreter ("pybind11_object_dealloc():
        # Tried to deallocate unregistered instance!"), against PyTorch's own server as against
        # ddprun's (1 run in 9 to 21 here).
        sys.stderr.flush()
        os._exit(0)
    ap = argparse.ArgumentParser()
    ap.add_argument("daemon")
    ap.add_argument("--clients", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--load", default="idle,busy")
    ap.add_argument("--sched", action="store_true", help="also the servers' CPU time, run-queue wait and switches")
    args = ap.parse_args()
    print(f"Store barrier: {args.clients} PyTorch {torch.__version__} clients (one connection each, threads of one "
          f"fresh process per barrier); median of {args.repeat} runs in ABBA order; {os.cpu_count()} cores")
    print(f"{'load':<6} {'ddprun s':>9} {'range':>13} {'torch s':>9} {'range':>13} {'torch/ddprun':>12} "
          f"{'pairs':>13} {'ddprun MB':>9} {'torch MB':>9}")
    for load in args.load.split(","):
        spin = spinners(os.cpu_count() or 1) if load == "busy" else []
        try:
            ours, theirs = [], []
            for i in range(args.repeat):
                if i % 2 == 0:
                    ours.append(run_ours(args.daemon, args.clients))
                    theirs.append(run_theirs(args.clients))
                else:
                    theirs.append(run_theirs(args.clients))
                    ours.append(run_ours(args.daemon, args.clients))
        finally:
            for p in spin:
                p.kill()
                p.wait()
        o = [m[0] for m, _ in ours]
        h = [m[0] for m, _ in theirs]
        om, hm = statistics.median(o), statistics.median(h)
        pairs = [b / a for a, b in zip(o, h)]
        print(f"{load:<6} {om:9.3f} {min(o):6.3f}-{max(o):6.3f} {hm:9.3f} {min(h):6.3f}-{max(h):6.3f} "
              f"{hm / om:11.2f}x {min(pairs):5.2f}-{max(pairs):5.2f}x {max(r for _, r in ours) / 1024:9.1f} "
              f"{max(r for _, r in theirs) / 1024:9.1f}", flush=True)
        if args.sched:
            for name, runs in (("ddprun", ours), ("torch", theirs)):
                cpu = statistics.median(m[1] for m, _ in runs)
                wait = statistics.median(m[2] for m, _ in runs)
                sw = statistics.median(m[3] for m, _ in runs)
                pre = statistics.median(m[4] for m, _ in runs)
                print(f"       {name:<7} server CPU {cpu * 1e3:7.1f} ms, waiting for a CPU {wait * 1e3:7.1f} ms, "
                      f"{sw:5.0f} sleeps, {pre:5.0f} preemptions ({(sw + pre) / args.clients:.2f} switches per "
                      f"client)", flush=True)


if __name__ == "__main__":
    main()
