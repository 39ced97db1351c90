"""The worker SDK's DistributedDataParallel against Python DDP, case by case (parity.py's CASES).

Each case runs once in Python DDP (Debian's torch: 1.13 on Debian 12, 2.6 on Debian 13) and in the
SDK under ddprun, from the same initial weights and data; every rank's parameters, gradients
(defined or not), buffers, DDP logging data and gradient views must be equal, bit for bit: the SDK
sums gradients in ProcessGroupGloo's order and runs LibTorch's own c10d::Reducer, so the same
inputs give the same bits at any number of ranks. Cases that must fail fail on both sides, and on
every rank of the SDK with the expected error.

usage: /usr/bin/python3 test_parity.py PATH/TO/ddprun PATH/TO/parity_worker [unittest arguments]
On a GPU machine: DDPRUN_PARITY_DEVICE=cuda (and DDPRUN_PARITY_BACKEND=nccl for one rank per GPU);
see parity.py.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import parity  # noqa: E402

DDPRUN = WORKER = None
# The SDK's two ways of summing gradients: its direct Gloo ring and ProcessGroupGloo.
BOTH_REDUCERS = {"plain_sgd_3", "plain_sgd_4", "plain_adam_3", "large_bucket_3", "unused_on_some_ranks",
                 "gradient_as_bucket_view", "eval_uneven", "static_graph_module_twice", "hook_fp16_3",
                 "hook_bf16_3", "join_effective_3", "join_zero_3"}


def torch_version():
    import torch
    return torch.__version__


def launch(world, program, env_extra, timeout=240):
    env = dict(os.environ, OMP_NUM_THREADS="1", **env_extra)
    return subprocess.run([DDPRUN, "--nproc_per_node", str(world), *program], env=env, capture_output=True,
                          text=True, timeout=timeout)


def errors(out_dir, world):
    found = {}
    for rank in range(world):
        path = os.path.join(out_dir, f"rank{rank}.json")
        if os.path.exists(path):
            with open(path) as f:
                found[rank] = json.load(f).get("error")
    return found


class ParityWithPythonDdp(unittest.TestCase):
    def run_case(self, name):
        c = parity.CASES[name]
        if int(torch_version().split(".")[0]) < c["min_torch"]:
            self.skipTest(f"Python DDP {torch_version()} cannot run it (needs PyTorch {c['min_torch']}.x)")
        if (os.environ.get("DDPRUN_PARITY_DEVICE") == "cuda" and os.environ.get("DDPRUN_PARITY_BACKEND") != "nccl"
                and c["env"].get("TORCH_DISTRIBUTED_DEBUG") == "DETAIL"):
            self.skipTest("Python DDP with TORCH_DISTRIBUTED_DEBUG=DETAIL on Gloo with CUDA tensors died with SIGSEGV "
                          "on every rank (PyTorch 2.11, H100): nothing to compare with")
        if c["needs_cuda"] and os.environ.get("DDPRUN_PARITY_DEVICE") != "cuda":
            self.skipTest("Python's SyncBatchNorm runs on CUDA tensors only: run the suite with "
                          "DDPRUN_PARITY_DEVICE=cuda on a machine with a GPU (scripts/gpu_check.sh)")
        world = c["world"]
        work = tempfile.mkdtemp(prefix=f"parity-{name}-")
        self.addCleanup(shutil.rmtree, work, ignore_errors=True)
        parity.prepare(name, work)
        py = launch(world, [sys.executable, os.path.join(HERE, "parity.py"), "worker", work,
                            os.path.join(work, "python")], c["env"])
        reducers = ["direct", "process-group"] if name in BOTH_REDUCERS else ["direct"]
        for reducer in reducers:
            with self.subTest(reducer=reducer):
                out = os.path.join(work, "sdk-" + reducer)
                sdk = launch(world, [WORKER, work, out, reducer], c["env"])
                if c["expect_error"]:
                    self.assertNotEqual(py.returncode, 0, "Python DDP did not fail")
                    self.assertNotEqual(sdk.returncode, 0, "the SDK did not fail")
                    py_errors = errors(os.path.join(work, "python"), world)
                    self.assertTrue(any(c["expect_error"] in (e or "") for e in py_errors.values()), py_errors)
                    sdk_errors = errors(out, world)
                    for rank in range(world):
                        self.assertIn(c["expect_error"], sdk_errors.get(rank) or "",
                                      f"rank {rank} of the SDK: {sdk_errors}\n{sdk.stderr[-3000:]}")
                    continue
                self.assertEqual(py.returncode, 0, "Python DDP failed:\n" + py.stderr[-4000:])
                self.assertEqual(sdk.returncode, 0, "the SDK failed:\n" + sdk.stderr[-4000:])
                problems = parity.compare(os.path.join(work, "python"), out, world)
                self.assertEqual(problems, [], "\n".join(problems[:40]))


def _add_case(name):
    def test(self):
        self.run_case(name)
    test.__doc__ = f"parity case {name}"
    setattr(ParityWithPythonDdp, "test_" + name, test)


for _name in parity.CASES:
    _add_case(_name)


if __name__ == "__main__":
    DDPRUN = os.path.abspath(sys.argv.pop(1))
    WORKER = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
