"""torchrun with TCPStore's use_libuv defaulting to False: `python3 torchrun_nolibuv.py ARGS...`.

PyTorch >= 2.4 built without libuv (Debian 13's 2.6) refuses use_libuv=True, TCPStore's default,
and torchrun 2.6 passes no use_libuv anywhere (its static and c10d rendezvous, its agent store), so
on Debian 13 it cannot start any job, USE_LIBUV=0 or not. The tests and benchmarks that compare
ddprun with torchrun run it through this wrapper there; elsewhere it is torchrun unchanged.
"""
import sys

import torch.distributed as dist

if "use_libuv" in (dist.TCPStore.__init__.__doc__ or ""):
    _Real = dist.TCPStore

    class TCPStore(_Real):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("use_libuv", False)
            super().__init__(*args, **kwargs)

    dist.TCPStore = TCPStore  # before torch.distributed.elastic is imported, so it takes this one

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = "torchrun"
    sys.exit(main())
