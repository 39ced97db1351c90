"""Debian's python3-torch (1.13 on Debian 12, 2.6 on Debian 13) TCPStore client and gloo process
groups against ddprun-rendezvous.

usage: /usr/bin/python3 test_store_interop.py PATH/TO/ddprun-rendezvous
"""
import datetime
import os
import subprocess
import sys
import unittest

import torch.distributed as dist

from daemon import Daemon
from torch_compat import store_client

DAEMON = None


class TCPStoreClientTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon(DAEMON)
        self.store = store_client("127.0.0.1", self.daemon.port, 1)

    def tearDown(self):
        del self.store
        code, err = self.daemon.stop()
        self.assertEqual(code, 0, err)

    def test_set_get_add_compare_set_delete_num_keys(self):
        s = self.store
        s.set("k", "v")
        self.assertEqual(s.get("k"), b"v")
        self.assertEqual(s.add("c", 5), 5)
        self.assertEqual(s.add("c", -2), 3)
        self.assertEqual(s.compare_set("cs", "", "new"), b"new")
        self.assertEqual(s.compare_set("cs2", "exp", "new"), b"exp")
        self.assertEqual(s.compare_set("cs", "new", "newer"), b"newer")
        self.assertEqual(s.num_keys(), 4)  # init/ (world_size=1), k, c, cs
        self.assertTrue(s.delete_key("k"))
        self.assertFalse(s.delete_key("k"))
        s.set("bin", bytes(range(256)))
        self.assertEqual(s.get("bin"), bytes(range(256)))

    def test_wait_timeout_then_store_keeps_working(self):
        with self.assertRaises(RuntimeError):
            self.store.wait(["absent"], datetime.timedelta(milliseconds=200))
        # 1.13 sends no cancel; the server drops the stale wait when the next request arrives, so a
        # later set of the key must not put a stray STOP_WAITING byte on this connection.
        self.store.set("x", "1")
        other = store_client("127.0.0.1", self.daemon.port)
        other.set("absent", "now")
        self.assertEqual(self.store.get("x"), b"1")
        self.assertEqual(self.store.add("n", 2), 2)

    def test_prefix_store_and_wait(self):
        p = dist.PrefixStore("/worker/attempt_0", self.store)
        p.set("a", "1")
        p.wait(["a"])
        self.assertEqual(p.get("a"), b"1")
        self.assertEqual(self.store.get("/worker/attempt_0/a"), b"1")


HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "gloo_worker.py")
HOOK = os.path.join(HERE, "..", "..", "launcher", "workers", "python_hook")


class GlooInitTest(unittest.TestCase):
    def run_job(self, world, restart_count):
        with Daemon(DAEMON) as daemon:
            procs = []
            for rank in range(world):
                # As ddprun starts them: its Python hook first on PYTHONPATH (PyTorch >= 2.4 without
                # libuv cannot otherwise be a client of an agent's store).
                env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(daemon.port), RANK=str(rank),
                           WORLD_SIZE=str(world), LOCAL_RANK=str(rank), TORCHELASTIC_USE_AGENT_STORE="True",
                           TORCHELASTIC_RESTART_COUNT=str(restart_count), OMP_NUM_THREADS="1", PYTHONPATH=HOOK)
                procs.append(subprocess.Popen([sys.executable, WORKER], env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True))
            outs = [p.communicate(timeout=120) for p in procs]
            for rank, (p, (out, err)) in enumerate(zip(procs, outs)):
                self.assertEqual(p.returncode, 0, f"rank {rank} failed:\n{err}")
                self.assertIn(f"rank {rank} ok {world * (world + 1) / 2} attempt {restart_count}", out)
            code, err = daemon.stop()
            self.assertEqual(code, 0, err)

    def test_two_ranks_all_reduce_all_gather_barrier(self):
        self.run_job(2, 0)

    def test_three_ranks_on_a_restarted_attempt(self):
        self.run_job(3, 1)


if __name__ == "__main__":
    DAEMON = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
