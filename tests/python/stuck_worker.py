"""A PyTorch worker for pytorch#185414: two ranks all-reduce once over Gloo; then rank 0 reads a file
whose read never returns (stuck_fuse.py), and rank 1 fails once rank 0 is inside that read.

usage: stuck_worker.py STUCK_FILE READ_MARKER PID_DIR
Rank 0 writes PID_DIR/stuck.<pid> before the read; rank 1 waits for READ_MARKER (the file server
saw the read), then exits 3.
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

stuck_file, marker, pid_dir = sys.argv[1:4]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {rank} all-reduced {t.item():.0f}", flush=True)
if rank == 0:
    open(os.path.join(pid_dir, f"stuck.{os.getpid()}"), "w").close()
    with open(stuck_file, "rb") as f:
        f.read(1)
    print("rank 0: the read returned", flush=True)
    sys.exit(0)
deadline = time.monotonic() + 60
while not os.path.exists(marker) and time.monotonic() < deadline:
    time.sleep(0.05)
print("rank 1 fails on purpose while rank 0 is stuck in a read", flush=True)
sys.exit(3)
