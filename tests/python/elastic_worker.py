"""A PyTorch worker for the elastic tests: STEPS steps of a Gloo all-reduce, 0.1 s apart, then exit 0.

usage: elastic_worker.py STEPS PID_DIR NODE
Writes PID_DIR/NODE.<pid> when it starts (so a test can tell whether it is still alive) and prints
"attempt A world W start", "rank R step S world W" and "rank R done world W attempt A". If the file
PID_DIR/fail-NODE exists at a step, the worker removes it and exits 1 (a failure on demand).
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

steps, pid_dir, node = int(sys.argv[1]), sys.argv[2], sys.argv[3]
open(os.path.join(pid_dir, f"{node}.{os.getpid()}"), "w").close()
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
print(f"attempt {attempt} world {world} start", flush=True)
kept = []  # tensors given to collectives live until destroy_process_group (see gloo_worker.py)
for step in range(steps):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world, (t.item(), world)
    kept.append(t)
    print(f"rank {rank} step {step} world {world}", flush=True)
    fail = os.path.join(pid_dir, f"fail-{node}")
    if os.path.exists(fail):
        os.remove(fail)
        print(f"rank {rank} fails on purpose", flush=True)
        sys.exit(1)
    time.sleep(0.1)
print(f"rank {rank} done world {world} attempt {attempt}", flush=True)
dist.barrier()
dist.destroy_process_group()
