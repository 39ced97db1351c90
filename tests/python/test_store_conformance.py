"""The same TCPStore client operations against ddprun-rendezvous and against PyTorch's own server,
side by side: every answer (value, count, boolean, or the kind of error) must be the same.

Runs with whatever PyTorch /usr/bin/python3 has (1.13 on Debian 12, 2.6 on Debian 13); operations
a release's client lacks (append, multi_get, multi_set, check, ...) are left out for it, and said so.

usage: /usr/bin/python3 test_store_conformance.py PATH/TO/ddprun-rendezvous
"""
import datetime
import os
import sys
import threading
import time
import unittest

import torch
import torch.distributed as dist

from daemon import Daemon
from torch_compat import client_kwargs, store_client

DAEMON = None
T = datetime.timedelta(seconds=10)


def torch_server():
    """PyTorch's own server (libuv where this PyTorch has it), on a kernel-picked port."""
    kw = {}
    if "use_libuv" in (dist.TCPStore.__init__.__doc__ or ""):
        try:
            return dist.TCPStore("127.0.0.1", 0, None, True, T, wait_for_workers=False)
        except Exception:
            kw = {"use_libuv": False}
    return dist.TCPStore("127.0.0.1", 0, None, True, T, wait_for_workers=False, **kw)


def outcome(f):
    try:
        return ("ok", f())
    except Exception as e:  # the kind of error is part of the answer
        return ("error", type(e).__name__)


def script(port):
    """Runs every operation on a fresh client of the store at PORT; returns [(name, outcome)]."""
    s = store_client("127.0.0.1", port)
    other = store_client("127.0.0.1", port)
    out = []

    def step(name, f):
        out.append((name, outcome(f)))

    step("set", lambda: s.set("k", "v"))
    step("get", lambda: s.get("k"))
    step("set binary", lambda: s.set("bin", bytes(range(256))))
    step("get binary", lambda: s.get("bin"))
    step("overwrite", lambda: (s.set("k", "w"), s.get("k"))[1])
    step("add new", lambda: s.add("c", 5))
    step("add existing", lambda: s.add("c", -7))
    step("add zero", lambda: s.add("c", 0))
    step("add read as bytes", lambda: s.get("c"))
    step("compare_set absent, expected empty", lambda: s.compare_set("cs", "", "new"))
    step("compare_set absent, expected set", lambda: s.compare_set("cs2", "exp", "new"))
    step("compare_set match", lambda: s.compare_set("cs", "new", "newer"))
    step("compare_set mismatch", lambda: s.compare_set("cs", "nope", "x"))
    step("num_keys", lambda: s.num_keys())
    step("delete present", lambda: s.delete_key("k"))
    step("delete absent", lambda: s.delete_key("k"))
    step("num_keys after delete", lambda: s.num_keys())
    step("get timeout", lambda: (s.set_timeout(datetime.timedelta(milliseconds=300)), s.get("absent"))[1])
    s.set_timeout(T)
    step("wait present", lambda: s.wait(["c", "cs"]))
    step("wait timeout", lambda: s.wait(["never"], datetime.timedelta(milliseconds=300)))
    step("still usable after a wait timeout", lambda: s.add("c", 1))

    def wait_woken():
        threading.Timer(0.2, lambda: other.set("late", "1")).start()
        s.wait(["late"], datetime.timedelta(seconds=5))
        return s.get("late")

    step("wait woken by another client", wait_woken)
    if hasattr(s, "check"):
        step("check present", lambda: s.check(["c", "late"]))
        step("check absent", lambda: s.check(["c", "absent"]))
    if hasattr(s, "append"):
        step("append new", lambda: (s.append("ap", "a"), s.get("ap"))[1])
        step("append existing", lambda: (s.append("ap", "bc"), s.get("ap"))[1])
    if hasattr(s, "multi_set"):
        step("multi_set", lambda: s.multi_set(["m1", "m2"], ["x", "y"]))
    if hasattr(s, "multi_get"):
        step("multi_get", lambda: s.multi_get(["m1", "m2", "late"]))
    step("num_keys at the end", lambda: s.num_keys())
    return out


class SideBySide(unittest.TestCase):
    def test_every_operation_answers_as_pytorchs_own_server(self):
        theirs_server = torch_server()
        theirs = script(theirs_server.port)
        with Daemon(DAEMON) as daemon:
            ours = script(daemon.port)
            code, err = daemon.stop()
            self.assertEqual(code, 0, err)
        self.assertEqual([n for n, _ in ours], [n for n, _ in theirs])
        for (name, mine), (_, expected) in zip(ours, theirs):
            self.assertEqual(mine, expected, f"{name}: ddprun answered {mine}, PyTorch {torch.__version__}'s "
                                             f"server {expected}")
        # Not a vacuous comparison: the script did reach the operations it lists.
        names = [n for n, _ in ours]
        self.assertIn("wait woken by another client", names)
        self.assertEqual(dict(ours)["get"], ("ok", b"v"))
        print(f"PyTorch {torch.__version__} client ({'use_libuv=False' if client_kwargs() else 'no libuv option'}):"
              f" {len(ours)} operations, the same answers from both servers", file=sys.stderr)


if __name__ == "__main__":
    DAEMON = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
