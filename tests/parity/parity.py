"""Python DDP against the worker SDK's DistributedDataParallel, case by case.

Both sides build the same model from the same initial weights, train on the same per-rank data
for the same steps, and every rank writes its parameters, gradients (or that a gradient is
undefined), buffers and a few facts (DDP's logging data, which gradients are bucket views). The
C++ side is tests/parity/parity_worker.cpp; the cases are the table CASES below, which the C++
worker reads from cases.json (written by `prepare`), so the two sides cannot drift apart.

usage (Debian's /usr/bin/python3, which has torch):
  parity.py prepare CASE DIR        write DIR/case.json, DIR/init.{json,bin}, DIR/data.{json,bin}
  parity.py worker DIR OUT          one rank of Python DDP (under ddprun); writes OUT/rank<R>.{json,bin}
  parity.py compare A B             compare two OUT directories; prints the differences, exit 1 if any
The tensor files: NAME.json {"tensors": [{"name", "shape", "offset"}...], ...} and NAME.bin with
the float32 values, little-endian, at those element offsets.
"""
import contextlib
import datetime
import json
import os
import struct
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

IN_FEATURES = 32
HIDDEN = 64
CLASSES = 10
BATCH = 8

# Every case: the model's shape, DDP's options, the optimizer and the training schedule.
#   world      ranks
#   model      hidden (the width), bn (a BatchNorm1d after fc1), extra ("none", "unused": never used, "rank0": used on
#              rank 0 only), tied (fc4 shares fc2's weight), twice (fc2 applied twice per forward),
#              mismatch (rank 1 builds fc1 with one more output)
#   ddp        DDP's options (find_unused_parameters, broadcast_buffers, gradient_as_bucket_view,
#              static_graph, bucket_cap_mb: None for DDP's default, first_bucket_bytes: the value of
#              torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, which 2.x reads only when
#              bucket_cap_mb is None)
#   optimizer  "sgd" (momentum 0.9, weight decay 1e-4), "adam" (weight decay 1e-2) or "zero_sgd" (the SGD in a
#              ZeroRedundancyOptimizer: each rank steps its shard, then broadcasts it)
#   schedule   train: forward, backward, step; accum: two micro-batches under no_sync, then one
#              outside; split_out: the forward outside no_sync, its backward inside;
#              split_in: the forward inside, its backward outside; eval_uneven: train, then an
#              evaluation under no_grad with rank r running r + 1 batches, a barrier, train again;
#              detail_mismatch: rank 1 all-reduces a tensor of another size (an error, not a hang);
#              join: train, rank r running steps + join.extra * r iterations inside Join([ddp] or
#              [ddp, optimizer] with ZeRO)
#   set_to_none  optimizer.zero_grad(set_to_none=...)
#   rank_buffers every rank starts with its own BatchNorm statistics (running_mean + rank)
#   expect_error what every rank of the SDK must fail with (a substring), and some rank of Python
#                (Python's shape check raises on the ranks that differ from rank 0 only), or None
#   env        extra environment of both sides' workers
#   hook       a communication hook of default_hooks.py ("allreduce", "fp16", "bf16"), of
#              powerSGD_hook.py ("powersgd") or None
#   powersgd   PowerSGDState's arguments for "powersgd" (the process group aside)
#   local_sgd  for "post_localsgd" (post_localSGD_hook.py and a PeriodicModelAverager after each
#              optimizer step): start_localSGD_iter, subgroup_size, period, warmup_steps
#   join       for "join": extra (iterations rank r runs beyond steps: extra * r), divide_by_initial_world_size,
#              throw (throw_on_early_termination)
#   min_torch  the oldest PyTorch major release whose Python DDP can run the case (1.13's Gloo has
#              no bfloat16 sum); the test skips it on older ones
#   needs_cuda the case runs on CUDA only (Python's SyncBatchNorm refuses CPU tensors); skipped unless
#              DDPRUN_PARITY_DEVICE=cuda
# The model's sync_bn makes its BatchNorm a SyncBatchNorm (Python: convert_sync_batchnorm).
#
# Where the cases run: DDPRUN_PARITY_DEVICE (cpu, the default, or cuda: rank r on GPU r modulo the
# GPUs there are, model and data moved there before DDP wraps it, device_ids=[that GPU]) and
# DDPRUN_PARITY_BACKEND (gloo, the default, or nccl), read by both sides.
SMALL_BUCKETS = {"bucket_cap_mb": 8192 / (1 << 20), "first_bucket_bytes": 4096}


def case(world=2, steps=6, optimizer="sgd", schedule="train", model=None, ddp=None, set_to_none=True,
         rank_buffers=False, expect_error=None, env=None, hook=None, min_torch=1, powersgd=None,
         local_sgd=None, join=None, needs_cuda=False):
    m = {"hidden": HIDDEN, "bn": True, "extra": "none", "tied": False, "twice": False, "mismatch": False,
         "sync_bn": False}
    m.update(model or {})
    d = {"find_unused_parameters": False, "broadcast_buffers": True, "gradient_as_bucket_view": False,
         "static_graph": False, **SMALL_BUCKETS}
    d.update(ddp or {})
    return {"world": world, "steps": steps, "optimizer": optimizer, "schedule": schedule, "model": m, "ddp": d,
            "set_to_none": set_to_none, "rank_buffers": rank_buffers, "expect_error": expect_error,
            "env": env or {}, "hook": hook, "min_torch": min_torch, "powersgd": powersgd,
            "local_sgd": local_sgd, "needs_cuda": needs_cuda,
            "join": {"extra": 1, "divide_by_initial_world_size": True, "throw": False, **(join or {})}}


CASES = {
    "plain_sgd_1": case(world=1),  # one rank: DDP still buckets and all-reduces (NCCL on one GPU)
    "plain_sgd_2": case(world=2),
    "plain_sgd_3": case(world=3),
    "plain_sgd_4": case(world=4),
    "plain_adam_2": case(world=2, optimizer="adam"),
    "plain_adam_3": case(world=3, optimizer="adam"),
    "default_buckets_2": case(world=2, ddp={"bucket_cap_mb": None, "first_bucket_bytes": 1 << 20}),
    # A 7.9 MB bucket: gloo's ring cuts it into 3 segments per rank (more than the usual 2).
    "large_bucket_3": case(world=3, steps=3, model={"hidden": 1400},
                           ddp={"bucket_cap_mb": None, "first_bucket_bytes": 1 << 20}),
    # Every bucket in 64-byte messages on the direct path (the order of the sums must not change).
    "small_messages_3": case(world=3, env={"DDPRUN_DDP_MAX_MESSAGE_BYTES": "64"}),
    # TORCH_DISTRIBUTED_DEBUG=DETAIL: DDP runs on the checked process group.
    "debug_detail_training": case(world=3, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}),
    "unused_everywhere_adam": case(optimizer="adam", model={"extra": "unused"},
                                   ddp={"find_unused_parameters": True}),
    "unused_on_some_ranks": case(world=3, model={"extra": "rank0"}, ddp={"find_unused_parameters": True}),
    "unused_without_find_unused": case(model={"extra": "unused"}, env={"TORCH_DISTRIBUTED_DEBUG": "INFO"},
                                       expect_error="extra.weight"),
    "no_sync_accumulation": case(schedule="accum", steps=4),
    "no_sync_forward_outside": case(schedule="split_out"),
    "no_sync_forward_inside": case(schedule="split_in"),
    "buffers_broadcast": case(world=3, rank_buffers=True),
    "buffers_not_broadcast": case(world=3, rank_buffers=True, ddp={"broadcast_buffers": False}),
    "eval_uneven": case(world=3, schedule="eval_uneven", steps=3),
    "tied_parameters": case(model={"tied": True}),
    "static_graph_module_twice": case(model={"twice": True}, ddp={"static_graph": True}),
    "static_graph_unused": case(model={"extra": "unused"}, ddp={"static_graph": True}),
    "gradient_as_bucket_view": case(world=3, ddp={"gradient_as_bucket_view": True}, set_to_none=False),
    "gradient_as_bucket_view_adam": case(optimizer="adam", ddp={"gradient_as_bucket_view": True},
                                         set_to_none=False),
    # Communication hooks: gradients not divided before the hook, the hook's average and, with
    # compression, sums in float16/bfloat16 (in the ring's order, the bits of Gloo's).
    "hook_allreduce_3": case(world=3, hook="allreduce"),
    "hook_fp16_2": case(hook="fp16"),
    "hook_fp16_3": case(world=3, hook="fp16"),
    "hook_bf16_3": case(world=3, hook="bf16", min_torch=2),
    "hook_fp16_bucket_view": case(hook="fp16", ddp={"gradient_as_bucket_view": True}, set_to_none=False),
    # PowerSGD: vanilla all-reduce for 2 iterations, then low-rank factors with error feedback and
    # warm start; rank 1 and 2 orthogonalise by Gram-Schmidt, rank 4 by QR (and leaves the output
    # layer uncompressed: not worth it at min_compression_rate 2).
    "powersgd_rank1": case(steps=12, hook="powersgd", powersgd={"matrix_approximation_rank": 1,
                                                                "start_powerSGD_iter": 2}),
    "powersgd_rank2_3": case(world=3, steps=12, hook="powersgd",
                             powersgd={"matrix_approximation_rank": 2, "start_powerSGD_iter": 2, "random_seed": 7}),
    "powersgd_rank4_adam": case(steps=12, optimizer="adam", hook="powersgd",
                                powersgd={"matrix_approximation_rank": 4, "start_powerSGD_iter": 3}),
    "powersgd_cold": case(steps=10, hook="powersgd", powersgd={
        "matrix_approximation_rank": 2, "start_powerSGD_iter": 2, "warm_start": False, "use_error_feedback": False}),
    # Post-local SGD: the world's average for 3 iterations, then each pair of ranks' own, the four
    # models averaged every 2 steps from step 3 on.
    "post_localsgd_4": case(world=4, steps=10, hook="post_localsgd", local_sgd={
        "start_localSGD_iter": 3, "subgroup_size": 2, "period": 2, "warmup_steps": 3}),
    "post_localsgd_adam_4": case(world=4, steps=8, optimizer="adam", hook="post_localsgd", local_sgd={
        "start_localSGD_iter": 2, "subgroup_size": 2, "period": 3, "warmup_steps": 2}),
    "powersgd_buckets": case(steps=12, ddp=SMALL_BUCKETS, hook="powersgd",
                             powersgd={"matrix_approximation_rank": 1, "start_powerSGD_iter": 2}),
    # ZeRO: every parameter as a local SGD over all of them gives (its state sharded 3 ways).
    "zero_sgd_3": case(world=3, optimizer="zero_sgd"),
    # Uneven inputs: ranks with 10 and 11 batches, gradients divided by the world size or by the
    # ranks still training; the joined ranks shadow the buffer broadcasts (from the largest rank
    # still training), the buckets, the map of used parameters, a hook's collectives and ZeRO's
    # steps; at the end every rank takes the model of the last to join.
    "join_2": case(schedule="join", steps=10),
    "join_effective_2": case(schedule="join", steps=10, join={"divide_by_initial_world_size": False}),
    "join_effective_3": case(world=3, schedule="join", steps=5, join={"extra": 2, "divide_by_initial_world_size": False}),
    "join_unused_3": case(world=3, schedule="join", steps=5, model={"extra": "rank0"},
                          ddp={"find_unused_parameters": True}),
    "join_hook_fp16_3": case(world=3, schedule="join", steps=5, hook="fp16",
                             join={"divide_by_initial_world_size": False}),
    "join_zero_3": case(world=3, schedule="join", steps=5, optimizer="zero_sgd"),
    "join_throw_3": case(world=3, schedule="join", steps=5, join={"throw": True}, expect_error="exhausted"),
    # SyncBatchNorm inside DDP, statistics over every rank's batch (CUDA kernels on both sides).
    "sync_bn_2": case(world=2, model={"sync_bn": True}, needs_cuda=True),
    "sync_bn_3": case(world=3, model={"sync_bn": True}, optimizer="adam", needs_cuda=True),
    "shape_mismatch": case(model={"mismatch": True},
                           expect_error="appears not to match sizes of the same param in process 0"),
    "detail_mismatch": case(schedule="detail_mismatch", env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
                            expect_error="mismatch"),
}

# Keys of DDP's logging data that must agree between the two sides (the rest are timings, names
# of Python classes, or environment).
LOGGING_KEYS = ["world_size", "rank", "bucket_cap_bytes", "find_unused_parameters", "gradient_as_bucket_view",
                "broadcast_buffers", "static_graph", "num_parameter_tensors", "total_parameter_size_bytes",
                "bucket_sizes", "rebuilt_bucket_sizes", "has_rebuilt_buckets", "unused_parameter_size",
                "dtypes", "backend_name", "is_multi_device_module", "iteration", "comm_hook", "join_uneven_inputs"]


def micro_batches(c):
    return 3 if c["schedule"] == "accum" else 1


def batches_needed(c):
    extra = c["world"] if c["schedule"] == "eval_uneven" else 0
    if c["schedule"] == "join":
        extra = c["join"]["extra"] * (c["world"] - 1)
    return c["steps"] * micro_batches(c) + extra + 1


# --- tensor files ---------------------------------------------------------------------------------

def write_tensors(prefix, tensors, **fields):
    """tensors: [(name, tensor or None)]; None records an undefined tensor (a gradient)."""
    entries, blobs, offset = [], [], 0
    for name, t in tensors:
        if t is None:
            entries.append({"name": name, "undefined": True})
            continue
        t = t.detach().to(torch.float32).contiguous().cpu()
        entries.append({"name": name, "shape": list(t.shape), "offset": offset})
        blobs.append(struct.pack(f"<{t.numel()}f", *t.flatten().tolist()))
        offset += t.numel()
    with open(prefix + ".bin", "wb") as f:
        f.write(b"".join(blobs))
    with open(prefix + ".json", "w") as f:
        json.dump({"tensors": entries, **fields}, f, indent=1, sort_keys=True)


def read_tensors(prefix):
    with open(prefix + ".json") as f:
        doc = json.load(f)
    with open(prefix + ".bin", "rb") as f:
        raw = f.read()
    out = {}
    for e in doc["tensors"]:
        if e.get("undefined"):
            out[e["name"]] = None
            continue
        n = 1
        for s in e["shape"]:
            n *= s
        values = struct.unpack_from(f"<{n}f", raw, 4 * e["offset"])
        out[e["name"]] = torch.tensor(values, dtype=torch.float32).reshape(e["shape"])
    return doc, out


# --- communication hooks ---------------------------------------------------------------------------

def bf16_compress_hook_gloo(process_group, bucket):
    """bf16_compress_hook under a name that DDP's CUDA-only check for it does not stop: PyTorch 2.x's
    Gloo sums bfloat16 on CPU, so Python can be the reference there."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return default_hooks.bf16_compress_hook(process_group, bucket)


class _BlockingAllReduce:
    """torch.distributed for powerSGD_hook.py, but all_reduce returns once the sum is done, with a
    completed future. Python's hook chains its three all-reduces in future callbacks that wait on
    collectives of their own; on CPU those callbacks run on ProcessGroupGloo's two worker threads,
    and the hook hangs (one bucket, 2 ranks) or pairs different collectives on different ranks
    (3 ranks: Gloo's 'op.preamble.length <= op.nbytes'). With completed futures every callback runs
    at once on the hook's thread: Python's own hook code, state and arithmetic, in the order the
    SDK's hook runs them (one after another on the thread that calls it)."""

    def __getattr__(self, name):
        return getattr(dist, name)

    @staticmethod
    def all_reduce(tensor, group=None, async_op=False):
        dist.all_reduce(tensor, group=group, async_op=True).wait()
        done = torch.futures.Future()
        done.set_result([tensor])

        class Work:
            def get_future(self):
                return done

            def wait(self):
                return True
        return Work()


def comm_hook(c):
    """(state, hook) of the case's communication hook."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, post_localSGD_hook, powerSGD_hook
    if c["hook"] == "post_localsgd":
        a = c["local_sgd"]
        # dist.new_subgroups(group_size) without its CUDA-only check (1.13 refuses on CPU).
        size, subgroup = a["subgroup_size"], None
        for first in range(0, dist.get_world_size(), size):
            ranks = list(range(first, first + size))
            group = dist.new_group(ranks=ranks)
            if dist.get_rank() in ranks:
                subgroup = group
        return (post_localSGD_hook.PostLocalSGDState(process_group=None, subgroup=subgroup,
                                                     start_localSGD_iter=a["start_localSGD_iter"]),
                post_localSGD_hook.post_localSGD_hook)
    if c["hook"] == "powersgd":
        powerSGD_hook.dist = _BlockingAllReduce()
        return powerSGD_hook.PowerSGDState(process_group=None, **c["powersgd"]), powerSGD_hook.powerSGD_hook
    return None, {"allreduce": default_hooks.allreduce_hook, "fp16": default_hooks.fp16_compress_hook,
                  "bf16": bf16_compress_hook_gloo}[c["hook"]]


# --- the model ------------------------------------------------------------------------------------

class TiedLinear(nn.Module):
    """A linear layer whose weight is another layer's (the C++ side registers the same tensor)."""

    def __init__(self, weight, out_features):
        super().__init__()
        self.weight = weight
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class Net(nn.Module):
    def __init__(self, m, rank):
        super().__init__()
        hidden = m["hidden"] + (1 if m["mismatch"] and rank == 1 else 0)
        self.fc1 = nn.Linear(IN_FEATURES, hidden)
        if m["bn"]:
            self.bn = nn.BatchNorm1d(hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        if m["tied"]:
            self.fc4 = TiedLinear(self.fc2.weight, hidden)
        self.fc3 = nn.Linear(hidden, CLASSES)
        if m["extra"] != "none":
            self.extra = nn.Linear(hidden, CLASSES)
        self.m = m
        self.use_extra = m["extra"] == "rank0" and rank == 0

    def forward(self, x):
        h = F.relu(self.fc1(x))
        if self.m["bn"]:
            h = self.bn(h)
        h = F.relu(self.fc2(h))
        if self.m["twice"]:
            h = F.relu(self.fc2(h))
        if self.m["tied"]:
            h = F.relu(self.fc4(h))
        out = self.fc3(h)
        if self.use_extra:
            out = out + self.extra(h)
        return out


def prepare(name, directory):
    c = CASES[name]
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "case.json"), "w") as f:
        json.dump({"name": name, "logging_keys": LOGGING_KEYS, **c}, f, indent=1, sort_keys=True)
    torch.manual_seed(1234)
    model = Net({**c["model"], "mismatch": False}, 0)
    if c["model"]["bn"]:  # statistics that are not the defaults, so a broadcast is visible
        with torch.no_grad():
            model.bn.running_mean.uniform_(-0.5, 0.5)
            model.bn.running_var.uniform_(0.5, 1.5)
            model.bn.num_batches_tracked.fill_(3)
    state = [(k, v) for k, v in model.state_dict(keep_vars=True).items()]
    write_tensors(os.path.join(directory, "init"), state)
    n = batches_needed(c)
    x = torch.randn(n, c["world"], BATCH, IN_FEATURES)
    y = torch.randint(0, CLASSES, (n, c["world"], BATCH)).to(torch.float32)
    write_tensors(os.path.join(directory, "data"), [("x", x), ("y", y)])


# --- one Python DDP rank --------------------------------------------------------------------------

def grads_are_views(model):
    out = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            out[name] = bool(p.grad._is_view())
    return out


def placement():
    """(device, backend) of this rank, from DDPRUN_PARITY_DEVICE and DDPRUN_PARITY_BACKEND."""
    backend = os.environ.get("DDPRUN_PARITY_BACKEND", "gloo")
    if os.environ.get("DDPRUN_PARITY_DEVICE", "cpu") == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device, backend
    return torch.device("cpu"), backend


def run_worker(directory, out_dir):
    with open(os.path.join(directory, "case.json")) as f:
        c = json.load(f)
    rank = int(os.environ["RANK"])
    os.makedirs(out_dir, exist_ok=True)
    prefix = os.path.join(out_dir, f"rank{rank}")
    torch.set_num_threads(1)
    try:
        device, backend = placement()
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
        facts = train(c, directory, rank, device)
    except Exception as e:  # every rank says what stopped it
        traceback.print_exc()
        with open(prefix + ".json", "w") as f:
            json.dump({"tensors": [], "error": f"{type(e).__name__}: {e}"}, f)
        open(prefix + ".bin", "wb").close()
        return 1
    ddp = facts.pop("ddp")  # alive until the process ends
    write_tensors(prefix, facts.pop("tensors"), **facts)
    # Leave without destroying DDP's reducer: PyTorch 1.13's ~ProcessGroupGloo, run from the
    # reducer's destructor on the main thread, joins its worker threads while holding the GIL, and
    # a worker thread freeing a communication hook's tensor waits for the GIL (a hang at exit,
    # about one run in five of hook_allreduce_3).
    assert ddp is not None
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def train(c, directory, rank, device):
    m, o = c["model"], c["ddp"]
    model = Net(m, rank)
    if not (m["mismatch"]):
        _, init = read_tensors(os.path.join(directory, "init"))
        with torch.no_grad():
            for k, v in model.state_dict(keep_vars=True).items():
                v.copy_(init[k].to(v.dtype))
    if c["rank_buffers"]:
        with torch.no_grad():
            model.bn.running_mean.add_(rank)
    if m["sync_bn"]:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model.to(device)
    dist._DEFAULT_FIRST_BUCKET_BYTES = o["first_bucket_bytes"]
    caps = {} if o["bucket_cap_mb"] is None else {"bucket_cap_mb": o["bucket_cap_mb"]}
    ddp = nn.parallel.DistributedDataParallel(
        model, broadcast_buffers=o["broadcast_buffers"], **caps,
        find_unused_parameters=o["find_unused_parameters"], gradient_as_bucket_view=o["gradient_as_bucket_view"],
        static_graph=o["static_graph"], device_ids=[device.index] if device.type == "cuda" else None)
    if c["hook"]:
        ddp.register_comm_hook(*comm_hook(c))
    if c["optimizer"] == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    elif c["optimizer"] == "zero_sgd":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.05, momentum=0.9,
                                      weight_decay=1e-4)
    else:
        # foreach=False: the per-tensor loop the SDK's side mirrors; on CUDA Python defaults to the
        # multi-tensor kernels, which round differently (an optimizer difference, not DDP's).
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-2, foreach=False)
    averager = None
    if c["hook"] == "post_localsgd":
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
        averager = PeriodicModelAverager(period=c["local_sgd"]["period"],
                                         warmup_steps=c["local_sgd"]["warmup_steps"])
    _, data = read_tensors(os.path.join(directory, "data"))
    xs, ys = data["x"].to(device), data["y"].to(torch.long).to(device)
    batch = iter(range(xs.shape[0]))

    def loss_of(i):
        return F.cross_entropy(ddp(xs[i, rank]), ys[i, rank])

    schedule = c["schedule"]
    if schedule == "detail_mismatch":
        t = torch.ones(3 + rank, device=device)
        dist.all_reduce(t)
        raise RuntimeError("the all-reduce of tensors of different sizes did not fail")
    steps, block = c["steps"], contextlib.nullcontext()
    if schedule == "join":
        from torch.distributed.algorithms.join import Join
        j = c["join"]
        steps += j["extra"] * rank
        block = Join([ddp, opt] if c["optimizer"] == "zero_sgd" else [ddp], throw_on_early_termination=j["throw"],
                     divide_by_initial_world_size=j["divide_by_initial_world_size"])
    with block:
        for step in range(steps):
            opt.zero_grad(set_to_none=c["set_to_none"])
            if schedule in ("train", "join"):
                loss_of(next(batch)).backward()
            elif schedule == "accum":
                with ddp.no_sync():
                    loss_of(next(batch)).backward()
                    loss_of(next(batch)).backward()
                loss_of(next(batch)).backward()
            elif schedule == "split_out":
                loss = loss_of(next(batch))
                with ddp.no_sync():
                    loss.backward()
            elif schedule == "split_in":
                with ddp.no_sync():
                    loss = loss_of(next(batch))
                loss.backward()
            elif schedule == "eval_uneven":
                loss_of(next(batch)).backward()
                if step == 0:
                    ddp.eval()
                    with torch.no_grad():
                        first = next(batch)
                        for _ in range(c["world"]):
                            next(batch)
                        for k in range(rank + 1):
                            ddp(xs[first + k, rank])
                    dist.barrier()
                    ddp.train()
            opt.step()
            if averager:
                averager.average_parameters(model.parameters())
    logging = ddp._get_ddp_logging_data()
    facts = {"logging": {k: logging.get(k) for k in LOGGING_KEYS}, "grad_views": grads_are_views(model)}
    tensors = []
    for name, p in model.named_parameters():
        tensors.append(("param/" + name, p))
        tensors.append(("grad/" + name, p.grad))
    for name, b in model.named_buffers():
        tensors.append(("buffer/" + name, b))
    dist.barrier()
    dist.destroy_process_group()
    return {"tensors": tensors, **facts, "ddp": ddp}


# --- comparison -----------------------------------------------------------------------------------

def compare(a_dir, b_dir, world, exact=True):
    """The differences between two runs, as sentences; empty when they agree."""
    problems = []
    for rank in range(world):
        try:
            a_doc, a = read_tensors(os.path.join(a_dir, f"rank{rank}"))
            b_doc, b = read_tensors(os.path.join(b_dir, f"rank{rank}"))
        except OSError as e:
            problems.append(f"rank {rank}: {e}")
            continue
        for side, doc in (("first", a_doc), ("second", b_doc)):
            if doc.get("error"):
                problems.append(f"rank {rank}: the {side} run failed: {doc['error']}")
        if set(a) != set(b):
            problems.append(f"rank {rank}: different tensors: only first {sorted(set(a) - set(b))}, "
                            f"only second {sorted(set(b) - set(a))}")
        for name in sorted(set(a) & set(b)):
            ta, tb = a[name], b[name]
            if (ta is None) != (tb is None):
                problems.append(f"rank {rank}: {name} is undefined in the "
                                f"{'first' if ta is None else 'second'} run only")
                continue
            if ta is None:
                continue
            if ta.shape != tb.shape:
                problems.append(f"rank {rank}: {name} shapes {list(ta.shape)} vs {list(tb.shape)}")
                continue
            if exact:
                differ = (ta != tb).sum().item()
                if differ:
                    scale = ta.abs().max().item()
                    problems.append(f"rank {rank}: {name}: {differ} of {ta.numel()} elements differ "
                                    f"(max |diff| {(ta - tb).abs().max().item():.3g}, scale {scale:.3g})")
            else:
                scale = max(ta.abs().max().item(), 1e-30)
                rel = (ta - tb).abs().max().item() / scale
                if rel > 1e-6:
                    problems.append(f"rank {rank}: {name}: max |diff| / scale = {rel:.3g} > 1e-6")
        for key in ("logging", "grad_views"):
            if a_doc.get(key) != b_doc.get(key):
                problems.append(f"rank {rank}: {key} differ: {a_doc.get(key)} vs {b_doc.get(key)}")
    return problems


def main(argv):
    if len(argv) == 3 and argv[0] == "prepare":
        prepare(argv[1], argv[2])
        return 0
    if len(argv) == 3 and argv[0] == "worker":
        return run_worker(argv[1], argv[2])
    if len(argv) == 4 and argv[0] == "compare":
        problems = compare(argv[1], argv[2], int(argv[3]))
        print("\n".join(problems) or "identical")
        return 1 if problems else 0
    if len(argv) == 1 and argv[0] == "cases":
        print("\n".join(CASES))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
