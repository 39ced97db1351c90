"""LeNet on Fashion-MNIST with PyTorch DistributedDataParallel (gloo), launched by ddprun.

    ddprun --nproc_per_node 2 examples/python/fashion_mnist_ddp.py --epochs 2

Reads Debian's dataset-fashion-mnist (gzip'd IDX files) as they are. Each rank trains on its shard
(DistributedSampler); rank 0 alone prints progress, the test accuracy, and a final JSON line.
Runs alone too (world size 1) when started without a launcher.

--fault-tolerant: one replica group of a job that trains on through failures (docs/fault-tolerance.md);
each group is one ddprun, e.g. for group 0 of 2:

    ddprun --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint HOST:PORT --rdzv_id JOB \
        --replica_group 0 --min_replica_groups 1 examples/python/fashion_mnist_ddp.py --fault-tolerant

DDP inside the group, ddprun_ft across the groups; the batches follow the committed steps
(ddprun_ft.Sampler), so a group that dies, comes back and heals from a peer neither trains a sample
twice nor skips one. --commit-log FILE appends one JSON line per committed step.
"""
import argparse
import gzip
import hashlib
import json
import os
import struct
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    dims = magic & 0xFF
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def load(split, limit):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(DATA, f"{prefix}-images-idx3-ubyte.gz"))[:limit]
    labels = read_idx(os.path.join(DATA, f"{prefix}-labels-idx1-ubyte.gz"))[:limit]
    x = (images.float() / 255.0 - 0.2860) / 0.3530
    return TensorDataset(x.unsqueeze(1), labels.long())


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def evaluate(model, test, rank, world, distributed):
    """Each rank scores its share of the test set; the counts are summed."""
    model.eval()
    test_sampler = DistributedSampler(test, num_replicas=world, rank=rank, shuffle=False)
    correct = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for x, y in DataLoader(test, batch_size=500, sampler=test_sampler):
            correct += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)], dtype=torch.float64)
    if distributed:
        dist.all_reduce(correct)
    return correct


def open_lines(path):
    """A JSON-lines log to append to. A process SIGKILLed in the middle of a line may leave it torn
    (the kernel stops a write at a page boundary when a fatal signal is pending): that line is ended
    first, so this process's lines stay whole; readers skip the torn one."""
    log = open(path, "a", buffering=1)
    if log.tell() > 0:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                log.write("\n")
    return log


def train_fault_tolerant(args, train, rank, world):
    """This replica group's part of a job that trains on through failures: returns the model and
    what to add to the final JSON line."""
    import ddprun_ft  # on PYTHONPATH in a worker of ddprun --replica_group

    model = LeNet()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sampler = ddprun_ft.Sampler(len(train), args.batch_size, seed=0)

    def state_dict():
        return {"model": model.state_dict(), "optimizer": opt.state_dict(), "sampler": sampler.state_dict()}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sampler.load_state_dict(state["sampler"])

    manager = ddprun_ft.Manager(state_dict=state_dict, load_state_dict=load_state_dict)
    ddp = ddprun_ft.DistributedDataParallel(model, manager)
    log = open_lines(args.commit_log) if args.commit_log else None
    images, labels = train.tensors
    epoch, epoch_start, total, seen = 0, time.time(), 0.0, 0
    while True:
        view = manager.start_quorum()
        # Where this step's samples start; every group of the quorum reads the same (its state is
        # what they committed), so they all end an epoch, and the training, on the same step.
        position, samples = sampler.position(manager), sampler.step_samples(manager)
        if position[0] != epoch:
            # Only an epoch this process trained in: a group that healed into a later one trained
            # none of the epochs it skipped (their loss would read 0).
            if rank == 0 and seen:
                print(f"replica group {manager.group}: epoch {epoch + 1}/{args.epochs}: loss "
                      f"{total / max(seen, 1):.4f} (rank 0's samples), {time.time() - epoch_start:.1f}s, "
                      f"step {manager.step}", flush=True)
            epoch, epoch_start, total, seen = position[0], time.time(), 0.0, 0
        if epoch >= args.epochs:
            break
        indices = sampler.indices(manager)
        # A healing group trains on none of the step's samples: its gradients are replaced by its
        # peers' average, so any batch does for its forward and backward.
        batch = torch.tensor(indices if indices else range(args.batch_size))
        model.train()
        loss = F.cross_entropy(ddp(images[batch]), labels[batch])
        loss.backward()
        if manager.should_commit():
            opt.step()
            sampler.commit(manager)
            if indices:
                total, seen = total + loss.item() * len(indices), seen + len(indices)
            if log:
                digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
                log.write(json.dumps({"step": manager.step, "group": manager.group, "rank": rank,
                                      "pid": os.getpid(), "quorum_id": view["quorum_id"],
                                      "groups": view["groups"], "healed": view["heal"],
                                      "participant_rank": view["participant_rank"],
                                      "epoch": position[0], "first": position[1], "samples": samples,
                                      "indices": indices, "hash": digest.hexdigest()[:16]}) + "\n")
        opt.zero_grad()
    manager.close()
    return model, {"replica_group": manager.group, "committed_steps": manager.step, "healed": manager.healed}


class Iterations:
    """Tells ddprun how many training iterations the run has completed (the progress page's
    `iterations`, offset 80, native-endian), for --max_no_progress_restarts; nothing without ddprun."""

    def __init__(self):
        import mmap
        self.page = None
        path = os.environ.get("DDPRUN_PROGRESS_FILE")
        if path:
            with open(path, "r+b") as f:
                self.page = mmap.mmap(f.fileno(), 4096)

    def report(self, completed):
        if self.page is not None:
            struct.pack_into("=Q", self.page, 80, completed)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--train-limit", type=int, default=60000)
    ap.add_argument("--test-limit", type=int, default=10000)
    ap.add_argument("--fault-tolerant", action="store_true",
                    help="train as one replica group of a fault-tolerant job (ddprun --replica_group)")
    ap.add_argument("--commit-log", help="with --fault-tolerant: append a JSON line per committed step")
    ap.add_argument("--crash-at-step", type=int, default=0, metavar="N",
                    help="fault injection: rank 0 exits with status 1 once the run has completed N steps")
    args = ap.parse_args()
    if args.crash_at_step and args.fault_tolerant:
        ap.error("--crash-at-step is for a plain DDP run: a --fault-tolerant group's failure is drilled by "
                 "killing it (docs/fault-tolerance.md)")
    if args.fault_tolerant and "DDPRUN_REPLICA_GROUP" not in os.environ:
        ap.error("--fault-tolerant trains one replica group of a job: start it with ddprun --replica_group ID "
                 "--rdzv_backend c10d --rdzv_endpoint HOST:PORT --rdzv_id JOB (docs/fault-tolerance.md)")

    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    torch.manual_seed(0)

    train = load("train", args.train_limit)
    test = load("test", args.test_limit)
    if args.fault_tolerant:
        model, extra = train_fault_tolerant(args, train, rank, world)
        correct = evaluate(model, test, rank, world, distributed)
        accuracy = (correct[0] / correct[1]).item()
        if rank == 0:
            print(f"replica group {extra['replica_group']}: test accuracy: {accuracy:.4f} "
                  f"({int(correct[0])}/{int(correct[1])})", flush=True)
            print(json.dumps({"example": "fashion_mnist_ddp", "fault_tolerant": True, "world_size": world,
                              "epochs": args.epochs, "test_accuracy": round(accuracy, 4), **extra}), flush=True)
        dist.destroy_process_group()
        return
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    model = LeNet()
    if distributed:
        model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    iterations, completed = Iterations(), 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        start, total, seen = time.time(), 0.0, 0
        for x, y in loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            completed += 1
            iterations.report(completed)
            if completed == args.crash_at_step and rank == 0:
                print(f"--crash-at-step {completed}: rank 0 exits with status 1 (fault injection)", file=sys.stderr,
                      flush=True)
                os._exit(1)
            total += loss.item() * len(y)
            seen += len(y)
        stats = torch.tensor([total, seen], dtype=torch.float64)
        if distributed:
            dist.all_reduce(stats)
        elapsed = time.time() - start
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: loss {stats[0] / stats[1]:.4f}, {elapsed:.1f}s, "
                  f"{stats[1] / elapsed:.0f} samples/s", flush=True)

    correct = evaluate(model, test, rank, world, distributed)
    accuracy = (correct[0] / correct[1]).item()
    if rank == 0:
        print(f"test accuracy: {accuracy:.4f} ({int(correct[0])}/{int(correct[1])})", flush=True)
        print(json.dumps({"example": "fashion_mnist_ddp", "world_size": world, "epochs": args.epochs,
                          "test_accuracy": round(accuracy, 4)}), flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
