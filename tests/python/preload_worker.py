"""A PyTorch worker for the --preload tests: what a forked worker must see as an exec'd one does.

usage: preload_worker.py MODE [ARGS...]
  ddp OUT_DIR          a short DDP run (gloo, seeded): rank 0 writes the parameters' SHA-256
  state OUT_DIR        writes this rank's process facts and random state to OUT_DIR/state.<rank>
  seeded OUT_DIR       the same after seeding random, numpy and torch with 1234
  fail RANK CODE       after a barrier, rank RANK exits with CODE on the first attempt
  raise                rank 1 raises RuntimeError inside @record (the error file)
  kill-self SIGNAL     rank 1 kills itself with SIGNAL after a barrier
  sleep READY_DIR      writes READY_DIR/ready.<rank> with its pid, then sleeps in sleep_here()
  spin OUT_DIR         all-reduces every 20 ms until OUT_DIR/stop exists; after its first one it
                       writes OUT_DIR/spin.<pid> (whether it was preloaded, its parent, its rank)
"""
import datetime
import hashlib
import json
import os
import random
import signal
import sys
import time

PRELOADED = "torch" in sys.modules  # imported before this file ran: forked from ddprun's zygote

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402

mode = sys.argv[1]
rank = int(os.environ["RANK"])


def init():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))


def ddp(out_dir):
    init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    ddp_model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(5):
        x = torch.randn(8, 16, generator=g)
        y = torch.randint(0, 4, (8,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp_model(x), y).backward()
        opt.step()
    if rank == 0:
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
        with open(os.path.join(out_dir, "digest"), "w") as f:
            f.write(digest)
    dist.barrier()
    dist.destroy_process_group()


def state(out_dir, seed=None):
    if seed is not None:
        random.seed(seed)
        torch.manual_seed(seed)
    facts = {
        "preloaded": PRELOADED,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "pgid": os.getpgid(0),
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "path0": sys.path[0],
        "main_file": getattr(sys.modules["__main__"], "__file__", None),
        "local_rank": os.environ["LOCAL_RANK"],
        "world_size": os.environ["WORLD_SIZE"],
        "sigint": str(signal.getsignal(signal.SIGINT)),
        "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
        "affinity": sorted(os.sched_getaffinity(0)),
        "torch_seed": torch.initial_seed(),
        "torch_draw": torch.rand(1).item(),
        "random_draw": random.random(),
    }
    with open(os.path.join(out_dir, "state.%d" % rank), "w") as f:
        json.dump(facts, f)


@record
def main():
    if mode == "ddp":
        ddp(sys.argv[2])
    elif mode in ("state", "seeded"):
        state(sys.argv[2], 1234 if mode == "seeded" else None)
    elif mode == "fail":
        init()
        dist.barrier()
        if rank == int(sys.argv[2]) and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
            sys.exit(int(sys.argv[3]))
        dist.barrier()
        print("rank %d done attempt %s preloaded %s" % (rank, os.environ["TORCHELASTIC_RESTART_COUNT"], PRELOADED),
              flush=True)
        dist.destroy_process_group()
    elif mode == "raise":
        if rank == 1:
            raise RuntimeError("boom from a forked worker")
    elif mode == "kill-self":
        init()
        dist.barrier()
        if rank == 1:
            os.kill(os.getpid(), int(sys.argv[2]))
        time.sleep(60)
    elif mode == "spin":
        out = sys.argv[2]
        init()
        first = True
        while True:
            # The ranks agree on when to stop (the flag is summed), so that none leaves while
            # another is still in a collective with it.
            t = torch.tensor([1.0 if os.path.exists(os.path.join(out, "stop")) else 0.0])
            dist.all_reduce(t)
            if t.item() > 0:
                break
            if first:
                facts = {"preloaded": PRELOADED, "pid": os.getpid(), "ppid": os.getppid(), "rank": rank,
                         "world_size": os.environ["WORLD_SIZE"]}
                with open(os.path.join(out, "spin.%d.tmp" % os.getpid()), "w") as f:
                    json.dump(facts, f)
                os.rename(os.path.join(out, "spin.%d.tmp" % os.getpid()), os.path.join(out, "spin.%d" % os.getpid()))
                first = False
            time.sleep(0.02)
        dist.destroy_process_group()
    elif mode == "sleep":
        def sleep_here():
            with open(os.path.join(sys.argv[2], "ready.%d" % rank), "w") as f:
                f.write(str(os.getpid()))
            while True:
                time.sleep(1)
        sleep_here()


if __name__ == "__main__":
    main()
