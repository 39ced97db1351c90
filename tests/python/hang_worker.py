"""A PyTorch gloo worker that hangs (or not) on purpose, for ddprun's hang watchdog tests.

    hang_worker.py collective RANK   RANK stops in its own code after a few steps; the others wait
                                     in all_reduce
    hang_worker.py noinit RANK       RANK never reaches init_process_group
    hang_worker.py busy SECONDS      every rank computes for SECONDS without a word, then finishes
    hang_worker.py timer RANK        RANK overruns a torchelastic file timer (scope "train_step")
    hang_worker.py heartbeat RANK    ranks heartbeat through the store each step; then RANK sleeps
                                     and the others spin, as ranks blocked in NCCL do
    hang_worker.py first-attempt RANK  like collective, on restart 0 only

Prints "hanging now <epoch seconds>" when the hang starts.
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

mode, arg = sys.argv[1], float(sys.argv[2])
rank = int(os.environ["RANK"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def announce():
    print(f"hanging now {time.time():.3f}", flush=True)


def stuck_in_user_code():
    announce()
    time.sleep(3600)


if mode == "noinit" and rank == int(arg):
    stuck_in_user_code()
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
t = torch.ones(16)
store = None
if mode == "heartbeat":
    # The documented one-line heartbeat, on a client of the job's store.
    from torch_compat import client_kwargs
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          **client_kwargs())
for step in range(5):
    dist.all_reduce(t)
    if store is not None:
        store.add(f"ddprun/progress/{rank}", 1)
print(f"steady after 5 steps", flush=True)

if mode in ("collective", "first-attempt") and rank == int(arg) and (mode == "collective" or attempt == 0):
    stuck_in_user_code()
elif mode == "busy":
    # Silent, CPU-bound work much longer than --hang_timeout: never a hang.
    end = time.time() + arg
    x = torch.randn(128, 128)
    while time.time() < end:
        x = torch.tanh(x @ x)
elif mode == "timer":
    from torch.distributed.elastic.timer import FileTimerClient, configure, expires

    configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    with expires(after=2, scope="train_step"):
        if rank == int(arg):
            def overrunning_step():
                announce()
                time.sleep(3600)

            overrunning_step()
elif mode == "heartbeat":
    if rank == int(arg):
        stuck_in_user_code()
    announce()
    while True:  # a wait that spins, as NCCL's does
        pass
dist.all_reduce(t)
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
