#!/usr/bin/python3
"""Store barrier: N real PyTorch TCPStore clients against ddprun-rendezvous and against PyTorch's own
server, interleaved in one run, idle and with every core busy.

Each barrier runs in a fresh Python process; each client is a thread of it with its own connection
(as N ranks would each have one): connect, add("arrived", 1), the last one sets "go", every one
waits for "go" and gets it. Two arrival patterns: "spread", each thread creates its client as soon
as it starts (as real clients arrive: spread over the time Python takes to start them; the time
is from the first thread's start to the last get), and "burst", every client created after a start
barrier releases them together (the time from the release). The servers: ddprun-rendezvous, the
workers' store a ddprun job hosts (the barrier is then the job's one worker, on MASTER_ADDR:
MASTER_PORT) and the c10d rendezvous store node 0 of a job hosts, each against PyTorch's own server
(libuv where that PyTorch has it). They take turns in ABBA order (ddprun first in odd pairs,
PyTorch first in even ones), so a drift of the machine's speed during the run favours neither.
"Busy" runs one spinning process per core beside them: the situation of a rank-0 node whose
workers use every core while its ddprun hosts their store. Per barrier, the server's process: CPU
time, time waiting for a CPU, sleeps and involuntary switches (/proc/PID/task/*/schedstat, status);
and the clients' process: its CPU time over the barrier, the work no server can take off it (its
threads take turns at one interpreter lock, so a barrier is hardly shorter than that).

usage: /usr/bin/python3 store_barrier_bench.py DDPRUN_RENDEZVOUS [--ddprun DDPRUN] [--clients 1024]
           [--repeat 5] [--store daemon,worker,c10d] [--arrival spread,burst] [--load idle,busy]
"""
import argparse
import ctypes
import datetime
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
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


def barrier(port, n, kwargs, arrival, host="127.0.0.1"):
    errors = []
    start = threading.Barrier(n + 1) if arrival == "burst" else None

    def one():
        try:
            if start:
                start.wait()
            s = dist.TCPStore(host, port, None, False, TIMEOUT, **kwargs)
            CLIENTS.append(s)  # kept until the process exits: see main()
            if s.add("arrived", 1) == n:
                s.set("go", "1")
            s.wait(["go"])
            assert s.get("go") == b"1"
        except Exception as e:  # reported after the run
            errors.append(repr(e))
            print(f"client failed: {e!r}", file=sys.stderr, flush=True)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    if start:
        for t in threads:
            t.start()
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        start.wait()
    else:
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        for t in threads:
            t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} clients failed, first: {errors[0]}")
    return elapsed, time.process_time() - cpu0


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


def barrier_in_process(port, n, arrival):
    """One barrier in a fresh process of its own (no threads, memory or GC state left from earlier
    runs); returns its time and the clients' CPU time."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--barrier", str(port), str(n), arrival],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         timeout=TIMEOUT.total_seconds() + 60)
    if out.returncode != 0:
        raise RuntimeError(f"the barrier's process exited with {out.returncode}; its stdout: {out.stdout[-500:]!r}; "
                           f"the end of its stderr:\n{out.stderr[-3000:]}")
    elapsed, client_cpu = out.stdout.split()[-2:]
    return float(elapsed), float(client_cpu)


def measured(pid, port, n, arrival):
    """The barrier's time, what the server at PID spent on it and the clients' CPU time: (s, CPU s,
    wait s, sleeps, preemptions, clients' CPU s)."""
    before = sched(pid)
    t, client_cpu = barrier_in_process(port, n, arrival)
    after = sched(pid)
    return (t,) + tuple(a - b for a, b in zip(after, before)) + (client_cpu,)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def run_ours(args, n, arrival, store):
    if store == "daemon":
        with Daemon(args.daemon) as d:
            m = measured(d.proc.pid, d.port, n, arrival)
            return m, rss_kib(d.proc.pid)
    return run_in_job(args.ddprun, n, arrival, store)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_in_job(ddprun, n, arrival, store):
    """The barrier as the one worker of a ddprun job, against the store that ddprun hosts: the
    workers' store (MASTER_ADDR:MASTER_PORT) or the c10d rendezvous store of node 0. The worker
    measures ddprun's process (its parent) around the barrier."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result")
        cmd = [ddprun, "--nproc_per_node", "1", "--max_restarts", "0"]
        where = "worker"
        if store == "c10d":
            port = free_port()
            cmd += ["--nnodes", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}"]
            where = str(port)
        cmd += [sys.executable, os.path.abspath(__file__), "--barrier-in-job", str(n), arrival, where, out]
        job = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=TIMEOUT.total_seconds() + 60)
        if job.returncode != 0:
            raise RuntimeError(f"the job exited with {job.returncode}; the end of its output:\n{job.stdout[-3000:]}")
        with open(out) as f:
            got = json.load(f)
        return tuple(got["measured"]), got["rss_kib"]


def barrier_in_job(n, arrival, where, out):
    launcher = os.getppid()
    if where == "worker":
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    else:
        host, port = "127.0.0.1", int(where)
    before = sched(launcher)
    t, client_cpu = barrier(port, n, client_kwargs(), arrival, host)
    after = sched(launcher)
    measured_here = (t,) + tuple(a - b for a, b in zip(after, before)) + (client_cpu,)
    with open(out, "w") as f:
        json.dump({"measured": measured_here, "rss_kib": rss_kib(launcher)}, f)


def run_theirs(n, arrival):
    p = subprocess.Popen([sys.executable, "-c", TORCH_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())
        m = measured(p.pid, port, n, arrival)
        return m, rss_kib(p.pid)
    finally:
        p.stdin.close()
        p.wait(timeout=30)


def die_with_parent():
    """In a spinner, before exec: killed when this script ends, however it ends (a SIGKILLed or
    SIGTERMed bench must not leave processes spinning on the machine)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def spinners(count):
    return [subprocess.Popen(["/bin/sh", "-c", "while :; do :; done"], preexec_fn=die_with_parent)
            for _ in range(count)]


def main():
    if len(sys.argv) in (5, 6) and sys.argv[1] in ("--barrier", "--barrier-in-job"):
        if sys.argv[1] == "--barrier":  # one barrier, in a process of its own
            print(*barrier(int(sys.argv[2]), int(sys.argv[3]), client_kwargs(), sys.argv[4]), flush=True)
        else:  # the one worker of a ddprun job
            barrier_in_job(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
        # Exit without freeing the clients: with PyTorch 2.6 on Python 3.13, freeing 1024 TCPStores
        # made by as many threads at once sometimes aborts the interpreter ("pybind11_object_dealloc():
        # Tried to deallocate unregistered instance!"), against PyTorch's own server as against
        # ddprun's (1 run in 9 to 21 here).
        sys.stderr.flush()
        os._exit(0)
    ap = argparse.ArgumentParser()
    ap.add_argument("daemon")
    ap.add_argument("--ddprun", help="the launcher, for --store worker,c10d (default: ../launcher/ddprun next to "
                                     "the daemon's directory)")
    ap.add_argument("--store", default="daemon,worker,c10d",
                    help="daemon: ddprun-rendezvous; worker: the workers' store a ddprun job hosts "
                         "(MASTER_PORT); c10d: the rendezvous store node 0 of a c10d job hosts")
    ap.add_argument("--clients", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--load", default="idle,busy")
    ap.add_argument("--arrival", default="spread,burst",
                    help="spread: each thread creates its client as soon as it starts; burst: every client is "
                         "created after a start barrier releases them together")
    args = ap.parse_args()
    if args.ddprun is None:
        args.ddprun = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(args.daemon))), "launcher", "ddprun")
    print(f"Store barrier: {args.clients} PyTorch {torch.__version__} clients (one connection each, threads of one "
          f"fresh process per barrier); median of {args.repeat} runs in ABBA order; {os.cpu_count()} cores")
    print(f"{'store':<6} {'arrival':<7} {'load':<5} {'ddprun s':>9} {'range':>13} {'torch s':>9} {'range':>13} "
          f"{'torch/ddprun':>12} {'pairs':>13} {'ddprun MB':>9} {'torch MB':>9}")
    for store in args.store.split(","):
        for arrival in args.arrival.split(","):
            for load in args.load.split(","):
                compare(args, store, arrival, load)


def compare(args, store, arrival, load):
    spin = spinners(os.cpu_count() or 1) if load == "busy" else []
    try:
        ours, theirs = [], []
        for i in range(args.repeat):
            if i % 2 == 0:
                ours.append(run_ours(args, args.clients, arrival, store))
                theirs.append(run_theirs(args.clients, arrival))
            else:
                theirs.append(run_theirs(args.clients, arrival))
                ours.append(run_ours(args, args.clients, arrival, store))
    finally:
        for p in spin:
            p.kill()
            p.wait()
    o = [m[0] for m, _ in ours]
    h = [m[0] for m, _ in theirs]
    om, hm = statistics.median(o), statistics.median(h)
    pairs = [b / a for a, b in zip(o, h)]
    print(f"{store:<6} {arrival:<7} {load:<5} {om:9.3f} {min(o):6.3f}-{max(o):6.3f} {hm:9.3f} {min(h):6.3f}-{max(h):6.3f} "
          f"{hm / om:11.2f}x {min(pairs):5.2f}-{max(pairs):5.2f}x {max(r for _, r in ours) / 1024:9.1f} "
          f"{max(r for _, r in theirs) / 1024:9.1f}", flush=True)
    for name, runs in (("ddprun", ours), ("torch", theirs)):
        cpu = statistics.median(m[1] for m, _ in runs)
        wait = statistics.median(m[2] for m, _ in runs)
        sw = statistics.median(m[3] for m, _ in runs)
        pre = statistics.median(m[4] for m, _ in runs)
        clients = statistics.median(m[5] for m, _ in runs)
        print(f"{'':20} {name:<7} server CPU {cpu * 1e3:6.1f} ms, waiting for a CPU {wait * 1e3:7.1f} ms, "
              f"{sw:5.0f} sleeps, {pre:5.0f} involuntary switches; clients' CPU {clients * 1e3:6.1f} ms "
              f"(medians per barrier)", flush=True)


if __name__ == "__main__":
    main()
