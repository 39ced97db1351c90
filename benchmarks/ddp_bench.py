"""DDP training-step throughput of PyTorch's DistributedDataParallel (the Python half of ddp_bench.sh).

Same model (LeNet-5), data shape, optimizer and thread count as ddp_bench.cpp. Run under torchrun
or alone. Prints from rank 0: "steps_per_s=... compute_ms=... ddp_step_ms=...".
"""
import os
import sys
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "python"))
from fashion_mnist_ddp import LeNet  # noqa: E402  (the same model as the example)


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    torch.set_num_threads(1)
    launched = "RANK" in os.environ
    if not launched:
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = DDP(LeNet())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    torch.manual_seed(1 + rank)
    x = torch.randn(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()

    def timed(n, sync):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            with (nullcontext() if sync else ddp.no_sync()):
                step()
        dist.barrier()
        return time.perf_counter() - t0

    timed(10, True)
    compute = timed(steps // 2, False) / (steps // 2)
    synced = timed(steps, True)
    if rank == 0:
        print(f"steps_per_s={steps / synced} compute_ms={compute * 1000} ddp_step_ms={synced / steps * 1000} "
              f"world_size={dist.get_world_size()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
