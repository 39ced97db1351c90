"""Real PyTorch workers under ddprun, and ddprun's env contract against Debian's torchrun (1.13 on
Debian 12, 2.6 on Debian 13).

usage: /usr/bin/python3 test_launcher_interop.py PATH/TO/ddprun PATH/TO/test_worker
"""
import os
import subprocess
import sys
import tempfile
import unittest

from ports import free_port

DDPRUN = TEST_WORKER = None
HERE = os.path.dirname(os.path.abspath(__file__))
ENV = dict(os.environ, PYTHON_EXEC=sys.executable)


def run(cmd, timeout=180):
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)


class TorchWorkersUnderDdprun(unittest.TestCase):
    def test_four_gloo_workers_all_reduce_all_gather_barrier(self):
        r = run([DDPRUN, "--nproc_per_node", "4", os.path.join(HERE, "gloo_worker.py")])
        self.assertEqual(r.returncode, 0, r.stderr)
        for rank in range(4):
            self.assertIn(f"[rank{rank}]: rank {rank} ok 10.0 attempt 0", r.stdout)

    def test_restart_gives_workers_a_fresh_store_and_attempt_prefix(self):
        r = run([DDPRUN, "--nproc_per_node", "2", "--max_restarts", "1",
                 os.path.join(HERE, "gloo_worker.py"), "fail-first-attempt"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("[rank1]: rank 1 ok 3.0 attempt 1", r.stdout)
        self.assertIn("restart 1 of 1", r.stderr)


class TorchWorkersAcrossTwoNodes(unittest.TestCase):
    def test_gloo_all_reduce_across_two_ddprun_nodes(self):
        port = str(free_port())
        procs = []
        for node in range(2):
            cmd = [DDPRUN, "--nnodes", "2", "--node_rank", str(node), "--nproc_per_node", "2",
                   "--master_addr", "127.0.0.1", "--master_port", port, "--local_addr", f"127.0.0.{node + 1}",
                   os.path.join(HERE, "gloo_worker.py")]
            procs.append(subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=180) for p in procs]
        for node, (p, (out, err)) in enumerate(zip(procs, outs)):
            self.assertEqual(p.returncode, 0, err)
            for rank in (2 * node, 2 * node + 1):
                self.assertIn(f"[rank{rank}]: rank {rank} ok 10.0 attempt 0", out)


def dump_env(cmd):
    with tempfile.TemporaryDirectory() as d:
        r = run(cmd + [TEST_WORKER, "env", d])
        assert r.returncode == 0, r.stderr
        envs = {}
        for name in sorted(os.listdir(d)):
            with open(os.path.join(d, name)) as f:
                envs[name] = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
        return envs


def torch_refuses_libuv_default():
    """True for PyTorch >= 2.4 built without libuv: a TCPStore client with use_libuv's default fails.

    Asked in a child process, and read from what it says rather than its exit status: a TCPStore
    whose construction raised can abort the interpreter when it is freed."""
    code = ("import datetime, torch.distributed as d\n"
            "t = datetime.timedelta(seconds=10)\n"
            "if 'use_libuv' in (d.TCPStore.__init__.__doc__ or ''):\n"
            "    s = d.TCPStore('127.0.0.1', 0, None, True, t, wait_for_workers=False, use_libuv=False)\n"
            "    try:\n        d.TCPStore('127.0.0.1', s.port, None, False, t)\n"
            "    except Exception as e:\n        print(e, flush=True)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return "use_libuv was requested" in r.stdout + r.stderr


class PythonHook(unittest.TestCase):
    def test_a_users_sitecustomize_still_runs(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "sitecustomize.py"), "w") as f:
                f.write("import os, sys\nprint('user sitecustomize ran in', os.environ['RANK'], flush=True)\n")
            env = dict(ENV, PYTHONPATH=d)
            r = subprocess.run([DDPRUN, "--nproc_per_node", "2", os.path.join(HERE, "gloo_worker.py")], env=env,
                               capture_output=True, text=True, timeout=180)
        self.assertEqual(r.returncode, 0, r.stderr)
        for rank in range(2):
            self.assertIn(f"[rank{rank}]: user sitecustomize ran in {rank}", r.stdout)
            self.assertIn(f"[rank{rank}]: rank {rank} ok", r.stdout)

    def test_torch_without_libuv_needs_nothing_set_and_without_the_hook_the_report_says_what_to_do(self):
        if not torch_refuses_libuv_default():
            self.skipTest("this PyTorch accepts use_libuv's default for a client (it has libuv, or is older than "
                          "2.4): there is nothing for the hook to fix")
        r = run([DDPRUN, "--nproc_per_node", "2", os.path.join(HERE, "gloo_worker.py")])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("[rank1]: rank 1 ok 3.0 attempt 0", r.stdout)
        env = dict(ENV, DDPRUN_TORCH_HOOK="0")
        r = subprocess.run([DDPRUN, "--nproc_per_node", "2", os.path.join(HERE, "gloo_worker.py")], env=env,
                           capture_output=True, text=True, timeout=180)
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("use_libuv was requested", r.stdout + r.stderr)
        self.assertIn("what to do : this PyTorch was built without libuv", r.stderr)


class EnvContractMatchesTorchrun(unittest.TestCase):
    # Values that differ by design between two runs: ports, paths and ids of the run.
    PER_RUN = {"MASTER_PORT", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_RUN_ID"}

    def test_same_variables_and_values_as_torchrun(self):
        # torchrun itself, through a wrapper that lets it start on a PyTorch without libuv (Debian 13's
        # 2.6 cannot otherwise start any job); elsewhere the wrapper changes nothing.
        # Its own free port: torchrun's default 29500 is taken whenever another job on the machine uses it.
        torchrun = dump_env([sys.executable, os.path.join(HERE, "torchrun_nolibuv.py"), "--nproc_per_node", "2",
                             "--master_port", str(free_port()), "--redirects", "1", "--tee", "1", "--no_python"])
        ours = dump_env([DDPRUN, "--nproc_per_node", "2"])
        self.assertEqual(sorted(torchrun), ["env.0", "env.1"])
        self.assertEqual(sorted(ours), ["env.0", "env.1"])
        for name in torchrun:
            theirs, mine = torchrun[name], ours[name]
            inherited = set(os.environ)
            contract = {k for k in theirs if k not in inherited or k == "OMP_NUM_THREADS"}
            missing = sorted(k for k in contract if k not in mine)
            self.assertEqual(missing, [], f"{name}: torchrun sets these, ddprun does not")
            for k in sorted(contract - self.PER_RUN):
                self.assertEqual(mine[k], theirs[k], f"{name}: {k}")
            self.assertTrue(mine["MASTER_PORT"].isdigit())
            self.assertTrue(mine["TORCHELASTIC_ERROR_FILE"].endswith(f"/attempt_0/{name[-1]}/error.json"))


if __name__ == "__main__":
    DDPRUN = os.path.abspath(sys.argv.pop(1))
    TEST_WORKER = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
