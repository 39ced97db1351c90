"""A replica group's worker that asks its ddprun for quorums with what a broken worker of the group
may write instead of a step, one ask per value, straight on the worker store and sealed with the
round's key, as ddprun_ft asks (its TCPStore client puts a "/" before each key): each answer's body
is printed as one JSON line "answer <n> <json>". Then it exits 0.

usage: ft_bad_asks.py STEP_JSON...   e.g. -1 18446744073709551615 1e19 '"7"'
"""
import os
import sys
from datetime import timedelta

import torch.distributed as dist

import ddprun_ft
from torch_compat import client_kwargs

store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                      timeout=timedelta(seconds=60), **client_kwargs())
key = bytes.fromhex(os.environ["DDPRUN_FT_KEY"])
rank = int(os.environ["RANK"])
for n, step in enumerate(sys.argv[1:], start=1):
    name = "ddprun_ft/ask/%d/%d" % (n, rank)
    store.set(name, ddprun_ft._seal(key, name, '{"step": %s, "recovery": ""}' % step))
    name = "ddprun_ft/quorum/%d" % n
    answer = ddprun_ft._unseal(key, name, store.get(name))
    print("answer %d %s" % (n, answer), flush=True)
