"""DDP training-step throughput of PyTorch's DistributedDataParallel (the Python half of ddp_bench.sh
and ddp_options_bench.sh).

Same models (LeNet-5, or the resnet18 example's ResNet-18), data shape, optimizer, zeroing and
thread count as ddp_bench.cpp, and the same DDP_BENCH_MODEL / DDP_BENCH_OPTION variables. Run under
torchrun, ddprun or alone. Prints from rank 0: "steps_per_s=... compute_ms=... ddp_step_ms=...
peak_rss_mb=...".
"""
import os
import resource
import sys
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "python"))
from fashion_mnist_ddp import LeNet  # noqa: E402  (the same model as the example)


class BasicBlock(torch.nn.Module):
    """examples/common/resnet18.hpp's block, registered in the same order."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        nn = torch.nn
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (self.shortcut(x) if self.shortcut is not None else x))


class ResNet18(torch.nn.Module):
    """examples/common/resnet18.hpp: 3x3 stem, stride 1, no max-pool, for 1x28x28 inputs."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.stem = nn.Conv2d(1, 64, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(64)
        self.fc = nn.Linear(512, 10)
        cin, stages = 64, []
        for stage, width in enumerate((64, 128, 256, 512)):
            blocks = []
            for b in range(2):
                blocks.append(BasicBlock(cin, width, 2 if b == 0 and stage > 0 else 1))
                cin = width
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        for layer in (self.layer1, self.layer2, self.layer3, self.layer4):
            x = layer(x)
        return self.fc(F.adaptive_avg_pool2d(x, (1, 1)).flatten(1))


OPTIONS = {
    "default": {},
    "find_unused_parameters": {"find_unused_parameters": True},
    "gradient_as_bucket_view": {"gradient_as_bucket_view": True},
    "static_graph": {"static_graph": True},
    "no_broadcast_buffers": {"broadcast_buffers": False},
}


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
    model = {"lenet": LeNet, "resnet18": ResNet18}[os.environ.get("DDP_BENCH_MODEL") or "lenet"]()
    ddp = DDP(model, **OPTIONS[os.environ.get("DDP_BENCH_OPTION") or "default"])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    torch.manual_seed(1 + rank)
    x = torch.randn(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad(set_to_none=False)
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

    timed(max(2, steps // 10), True)
    compute = timed(max(1, steps // 2), False) / max(1, steps // 2)
    synced = timed(steps, True)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if rank == 0:
        print(f"steps_per_s={steps / synced} compute_ms={compute * 1000} ddp_step_ms={synced / steps * 1000} "
              f"peak_rss_mb={peak_rss_mb} world_size={dist.get_world_size()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
