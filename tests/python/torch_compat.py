"""TCPStore clients that work on every PyTorch the tests meet (1.13 to 2.x).

PyTorch >= 2.4 defaults use_libuv to True and, when built without libuv (Debian 13's 2.6), refuses
it even for a client, which never uses libuv. A program that creates its own TCPStore client passes
use_libuv=False where the option exists (ddprun's failure report says the same).
"""
import datetime

import torch.distributed as dist


def client_kwargs():
    return {"use_libuv": False} if "use_libuv" in (dist.TCPStore.__init__.__doc__ or "") else {}


def store_client(host, port, world_size=None, timeout=datetime.timedelta(seconds=10), **kwargs):
    return dist.TCPStore(host, port, world_size, False, timeout, **client_kwargs(), **kwargs)
