"""examples/fashion_mnist_qat.cpp in Python: LeNet-5 with BatchNorm on Fashion-MNIST, FP32 training,
then quantization-aware fine-tuning with torch.ao.quantization (fuse_modules_qat, prepare_qat,
the observer and BatchNorm schedule of torchvision's train_quantization.py) and convert to int8.
The reference the C++ example's accuracies are held to.

    ddprun --nproc_per_node 2 examples/python/fashion_mnist_qat.py --epochs 3
"""
import argparse
import copy
import json
import os
import time

import torch
import torch.ao.quantization as tq
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

try:
    import torch.ao.nn.intrinsic.qat as nniqat
except ImportError:  # PyTorch 1.13
    import torch.nn.intrinsic.qat as nniqat

from fashion_mnist_ddp import evaluate, load

QAT_EPOCHS, OBSERVER_EPOCHS, BATCH_NORM_EPOCHS = 5, 4, 3


class LeNetBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
        self.conv1, self.bn1, self.relu1 = nn.Conv2d(1, 6, 5, padding=2), nn.BatchNorm2d(6), nn.ReLU()
        self.conv2, self.bn2, self.relu2 = nn.Conv2d(6, 16, 5), nn.BatchNorm2d(16), nn.ReLU()
        self.fc1, self.relu3 = nn.Linear(16 * 5 * 5, 120), nn.ReLU()
        self.fc2, self.relu4 = nn.Linear(120, 84), nn.ReLU()
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(self.relu1(self.bn1(self.conv1(self.quant(x)))), 2)
        x = F.max_pool2d(self.relu2(self.bn2(self.conv2(x))), 2)
        x = self.relu4(self.fc2(self.relu3(self.fc1(x.flatten(1)))))
        return self.dequant(self.fc3(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3, help="FP32 epochs before the 5 QAT epochs")
    ap.add_argument("--batch-size", type=int, default=64, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--train-limit", type=int, default=60000)
    ap.add_argument("--test-limit", type=int, default=10000)
    ap.add_argument("--engine", default="qnnpack", help="the qconfig's engine")
    args = ap.parse_args()

    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    torch.manual_seed(0)
    train, test = load("train", args.train_limit), load("test", args.test_limit)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)

    def wrap(m):
        return DDP(m) if distributed else m

    def run_epoch(model, opt, epoch):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()

    def accuracy(model):
        correct = evaluate(model, test, rank, world, distributed)
        return (correct[0] / correct[1]).item()

    def say(*a):
        if rank == 0:
            print(*a, flush=True)

    start = time.time()
    fp32 = LeNetBn()
    fp32_ddp = wrap(fp32)
    fp32_opt = torch.optim.SGD(fp32_ddp.parameters(), lr=args.lr, momentum=0.9)
    for epoch in range(args.epochs):
        run_epoch(fp32_ddp, fp32_opt, epoch)
        say(f"fp32 epoch {epoch + 1}/{args.epochs}: test accuracy {accuracy(fp32):.4f}")

    qat = copy.deepcopy(fp32).train()
    tq.fuse_modules_qat(qat, [["conv1", "bn1", "relu1"], ["conv2", "bn2", "relu2"], ["fc1", "relu3"],
                              ["fc2", "relu4"]], inplace=True)
    qat.qconfig = tq.get_default_qat_qconfig(args.engine)
    tq.prepare_qat(qat, inplace=True)
    qat_ddp = wrap(qat)
    opt = torch.optim.SGD(qat_ddp.parameters(), lr=args.lr / 10, momentum=0.9)
    for g in fp32_opt.param_groups:
        g["lr"] = args.lr / 10
    for epoch in range(QAT_EPOCHS):
        if epoch == BATCH_NORM_EPOCHS:
            qat.apply(nniqat.freeze_bn_stats)
        if epoch == OBSERVER_EPOCHS:
            qat.apply(tq.disable_observer)
        run_epoch(fp32_ddp, fp32_opt, args.epochs + epoch)
        run_epoch(qat_ddp, opt, args.epochs + epoch)
        say(f"qat epoch {epoch + 1}/{QAT_EPOCHS}: fake-quant test accuracy {accuracy(qat):.4f} "
            f"(fp32 {accuracy(fp32):.4f})")
    train_seconds = time.time() - start
    qat.apply(tq.disable_observer)
    fp32_accuracy, fake_quant_accuracy = accuracy(fp32), accuracy(qat)
    int8_accuracy = {}
    for engine in ("qnnpack", "onednn"):
        if engine in torch.backends.quantized.supported_engines:
            torch.backends.quantized.engine = engine
            int8_accuracy[engine] = accuracy(tq.convert(copy.deepcopy(qat).eval()))
    say(f"test accuracy: fp32 {fp32_accuracy:.4f}, fake-quant {fake_quant_accuracy:.4f}, int8 {int8_accuracy}")
    say(json.dumps({"example": "fashion_mnist_qat.py", "world_size": world, "epochs": args.epochs + QAT_EPOCHS,
                    "fp32_accuracy": round(fp32_accuracy, 4), "fake_quant_accuracy": round(fake_quant_accuracy, 4),
                    "int8_accuracy": {k: round(v, 4) for k, v in int8_accuracy.items()},
                    "train_seconds": round(train_seconds, 1)}))
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
