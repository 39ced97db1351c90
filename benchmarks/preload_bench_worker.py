"""The worker of benchmarks/preload_bench.py: the shortest real PyTorch job (import torch.distributed,
init_process_group("gloo"), one barrier), writing when it passed the barrier.

usage: preload_bench_worker.py OUT_DIR barrier|restart|pss
  barrier  exit after the barrier
  restart  on the first attempt rank 1 writes OUT_DIR/fail and exits 3 after the barrier
  pss      write OUT_DIR/pid.RANK after the barrier and wait for OUT_DIR/release
"""
import datetime
import os
import sys
import time

import torch.distributed as dist

out, mode = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
dist.barrier()
rank, attempt = dist.get_rank(), os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
with open(os.path.join(out, "barrier.%s.%d" % (attempt, rank)), "w") as f:
    f.write(repr(time.time()))
if mode == "restart" and attempt == "0" and rank == 1:
    with open(os.path.join(out, "fail"), "w") as f:
        f.write(repr(time.time()))
    os._exit(3)
if mode == "pss":
    with open(os.path.join(out, "pid.%d" % rank), "w") as f:
        f.write(str(os.getpid()))
    while not os.path.exists(os.path.join(out, "release")):
        time.sleep(0.05)
dist.destroy_process_group()
