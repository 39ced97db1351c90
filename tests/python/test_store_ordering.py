"""A set() by one real PyTorch client is visible to the next request of another, under CPU load.

SET has no reply in the TCPStore protocol, so the client's set() returns as soon as its bytes are
written. Two TCPStore clients in one process, A and B: after A.set(k) returns, B's num_keys(),
compare_set(k) and delete_key(k) must all see k, every time. Two busy processes load the CPUs
meanwhile, which is when a server that applies requests in the wrong order shows it.

usage: /usr/bin/python3 test_store_ordering.py PATH/TO/ddprun-rendezvous [ROUNDS]
"""
import datetime
import multiprocessing
import sys

import torch.distributed as dist

from daemon import Daemon
from torch_compat import store_client


def spin():
    while True:
        pass


def main():
    binary = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    hogs = [multiprocessing.Process(target=spin, daemon=True) for _ in range(2)]
    for h in hogs:
        h.start()
    stale = {"num_keys": 0, "compare_set": 0, "delete_key": 0}
    try:
        with Daemon(binary) as daemon:
            timeout = datetime.timedelta(seconds=30)
            a = store_client("127.0.0.1", daemon.port, None, timeout, wait_for_workers=False)
            b = store_client("127.0.0.1", daemon.port, None, timeout, wait_for_workers=False)
            for i in range(rounds):
                key = f"k{i}"
                a.set(key, "v")
                if b.num_keys() != 1:
                    stale["num_keys"] += 1
                if b.compare_set(key, "v", "w") != b"w":
                    stale["compare_set"] += 1
                if not b.delete_key(key):
                    stale["delete_key"] += 1
                    b.delete_key(key)  # A's set arrived late: clean up for the next round
    finally:
        for h in hogs:
            h.terminate()
    total = sum(stale.values())
    print(f"{rounds} rounds under load: stale answers {stale}")
    if total:
        print("FAIL: a request saw the store before another client's completed set()", file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
