"""The worker of benchmarks/ft_bench.py: an MLP of about MB megabytes of parameters trained for STEPS
steps, either as a replica group (MODE ft: ddprun_ft), as an ordinary DDP rank (MODE plain), or as
one that saves a checkpoint every step and resumes from it after a restart (MODE restart: what a job
without fault tolerance does to lose as little as it can). One JSON line per step on OUT_DIR/<name>.log with its wall-clock time.

usage: ft_bench_worker.py MODE STEPS OUT_DIR MB
"""
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

mode, steps, out_dir, mb = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
width = max(16, int((mb * 2 ** 20 / 4 / 2) ** 0.5))  # two width x width layers of float32
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width))
opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
name = ("g%s" % os.environ["DDPRUN_REPLICA_GROUP"] if mode == "ft" else "plain") + "r%d" % rank
log = open(os.path.join(out_dir, name + ".log"), "a", buffering=1)


def say(**event):
    log.write(json.dumps(dict(event, t=time.time(), pid=os.getpid())) + "\n")


say(event="start")
if mode == "ft":
    import ddprun_ft

    def load(state):
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])

    manager = ddprun_ft.Manager(state_dict=lambda: {"model": model.state_dict(), "optimizer": opt.state_dict()},
                                load_state_dict=load, timeout=datetime.timedelta(seconds=60))
    ddp = ddprun_ft.DistributedDataParallel(model, manager)
    group = int(os.environ["DDPRUN_REPLICA_GROUP"])
    healed = 0
    while manager.step < steps:
        # The forward runs while the groups agree on the quorum: the batch does not depend on it.
        manager.start_quorum_async()
        gen = torch.Generator().manual_seed(manager.step * 1000 + group * 10 + rank)
        ddp(torch.randn(8, width, generator=gen)).pow(2).mean().backward()
        if manager.should_commit():
            opt.step()
            say(event="step", step=manager.step, groups=manager.quorum["groups"])
        if manager.healed > healed:
            healed = manager.healed
            say(event="heal", **manager.last_heal)
        opt.zero_grad()
    manager.close()
else:
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ckpt = os.path.join(out_dir, "checkpoint.pt")
    step = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
        say(event="resumed", step=step)
    while step < steps:
        gen = torch.Generator().manual_seed(step * 1000 + rank)
        ddp(torch.randn(8, width, generator=gen)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        step += 1
        if mode == "restart" and rank == 0:  # a durable replace, as a careful job writes its checkpoint
            tmp = ckpt + ".tmp"
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, ckpt)
        if mode == "restart":
            dist.barrier()
        say(event="step", step=step)
dist.destroy_process_group()
