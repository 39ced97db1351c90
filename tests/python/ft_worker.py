"""A worker of a fault-tolerant replica group (ddprun --replica_group), for the tests: a small
model trained with Python DDP inside the group and ddprun_ft across the groups, on batches drawn
from the committed step, so every group that commits a step must hold the same parameters.

usage: ft_worker.py STEPS OUT_DIR [SECONDS_PER_STEP [HOLD_STEP]]
With DDPRUN_FT_TEST_ASYNC=1 in its environment it asks with start_quorum_async(): its batch then
follows the step, its group and its rank, so that the forward runs while the quorum is agreed on.
With DDPRUN_FT_TEST_LIE_AT=N, the group's first worker, once it has committed N steps, asks as if it
had committed a million more (a broken step counter).
With HOLD_STEP (0: none), a rank that has committed that many steps waits for OUT_DIR/release before it asks
for the next quorum (the test lets a restarted group catch up before the others finish).
With DDPRUN_FT_TEST_PAUSE_ASKED=N, the group's first worker, once it has committed N steps, asks for its
next quorum asynchronously, writes OUT_DIR/asked ({"port": its worker store's, "n": the quorum asked for})
and waits for OUT_DIR/go before it reads the answer (the test freezes its ddprun in between).
Writes OUT_DIR/g<group>r<rank>.log, one JSON line per event: "start" (pid, restart count), then
"commit" (step, quorum seq and id, the groups, whether this rank healed first, a hash of the
parameters) for every step it committed.
"""
import datetime
import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import ddprun_ft

steps, out_dir = int(sys.argv[1]), sys.argv[2]
pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.05
hold = int(sys.argv[4]) if len(sys.argv) > 4 else 0
asynchronous = os.environ.get("DDPRUN_FT_TEST_ASYNC") == "1"
first = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
lie_at = int(os.environ.get("DDPRUN_FT_TEST_LIE_AT", "0")) if first else 0
pause_asked = int(os.environ.get("DDPRUN_FT_TEST_PAUSE_ASKED", "0")) if first else 0
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
group = int(os.environ["DDPRUN_REPLICA_GROUP"])
log = open(os.path.join(out_dir, "g%dr%d.log" % (group, rank)), "a", buffering=1)
if log.tell() > 0:  # a line torn by the SIGKILL of the previous process (stopped at a page boundary): end it
    with open(log.name, "rb") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) != b"\n":
            log.write("\n")


def say(**event):
    log.write(json.dumps(event) + "\n")


say(event="start", pid=os.getpid(), restart=int(os.environ["TORCHELASTIC_RESTART_COUNT"]), lang="python")
torch.manual_seed(0)
# 1.1 MB of parameters in buckets of 256 KB: several buckets, whose collectives across the groups
# must start in the same order on every group.
model = torch.nn.Sequential(torch.nn.Linear(64, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def state_dict():
    return {"model": model.state_dict(), "optimizer": opt.state_dict()}


def load_state_dict(state):
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])


manager = ddprun_ft.Manager(state_dict=state_dict, load_state_dict=load_state_dict,
                            timeout=datetime.timedelta(seconds=20))
ddp = ddprun_ft.DistributedDataParallel(model, manager, bucket_cap_mb=0.25)
while manager.step < steps:
    while hold and manager.step == hold and not os.path.exists(os.path.join(out_dir, "release")):
        time.sleep(0.05)  # sleep override: waiting for the test's file
    if lie_at and manager.step == lie_at:
        manager.step += 1000000
    if pause_asked and manager.step == pause_asked:
        manager.start_quorum_async()
        with open(os.path.join(out_dir, "asked.tmp"), "w") as f:
            json.dump({"port": int(os.environ["MASTER_PORT"]), "n": manager._n}, f)
        os.rename(os.path.join(out_dir, "asked.tmp"), os.path.join(out_dir, "asked"))
        while not os.path.exists(os.path.join(out_dir, "go")):
            time.sleep(0.05)  # sleep override: waiting for the test's file
        place = manager.quorum["replica_rank"]
    elif asynchronous:
        manager.start_quorum_async()
        place = group
    else:
        place = manager.start_quorum()["replica_rank"]
    # The batch follows the committed step (and this rank's place), never the process's history.
    gen = torch.Generator().manual_seed(manager.step * 1000 + place * 10 + rank)
    x, y = torch.randn(8, 64, generator=gen), torch.randn(8, 4, generator=gen)
    loss = ((ddp(x) - y) ** 2).mean()
    loss.backward()
    if manager.should_commit():
        opt.step()
        view = manager.quorum
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
        say(event="commit", step=manager.step, seq=view["seq"], quorum_id=view["quorum_id"], groups=view["groups"],
            healed=view["heal"], hash=digest[:16], pid=os.getpid())
    opt.zero_grad()
    time.sleep(pause)  # sleep override: the step's length, so that a fault lands mid-training
manager.close()
dist.destroy_process_group()
