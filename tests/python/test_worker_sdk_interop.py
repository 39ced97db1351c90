"""The C++ worker SDK against Debian's PyTorch: sampler indices and checkpoint files.

usage: /usr/bin/python3 test_worker_sdk_interop.py PATH/TO/ddprun PATH/TO/sdk_test_worker
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import torch
from torch.utils.data import DistributedSampler

DDPRUN = WORKER = None


class SamplerMatchesPyTorch(unittest.TestCase):
    def test_grid_of_sizes_replicas_seeds_epochs_shuffle_drop_last(self):
        out = subprocess.run([WORKER, "sampler-grid"], capture_output=True, text=True, check=True,
                             env=dict(os.environ, RANK="", WORLD_SIZE="")).stdout
        cases = [json.loads(line) for line in out.splitlines()]
        self.assertGreater(len(cases), 500)
        for c in cases:
            s = DistributedSampler(range(c["size"]), num_replicas=c["replicas"], rank=c["rank"],
                                   shuffle=bool(c["shuffle"]), seed=c["seed"], drop_last=bool(c["drop_last"]))
            s.set_epoch(c["epoch"])
            expected = list(s)
            self.assertEqual(c["indices"], expected, c)
            self.assertEqual(c["len"], len(s), c)


class CheckpointLoadsInPython(unittest.TestCase):
    def test_torch_load_reads_the_sdk_checkpoint(self):
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run([DDPRUN, "--nproc_per_node", "2", WORKER, "checkpoint", d], capture_output=True,
                               text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)
            path = os.path.join(d, "ckpt.pt")
            if hasattr(torch.serialization, "safe_globals"):
                # PyTorch >= 2.6 loads weights_only by default: LibTorch's typed dictionaries need the
                # one (harmless) helper allowed; nothing else of the file's is.
                from torch.jit._pickle import restore_type_tag
                with torch.serialization.safe_globals([restore_type_tag]):
                    ckpt = torch.load(path)
            else:
                ckpt = torch.load(path)
            self.assertEqual(ckpt["epoch"], 5)
            self.assertEqual(ckpt["world_size"], 2)
            model = ckpt["model"]
            self.assertEqual(model["conv.weight"].shape, (4, 1, 3, 3))
            self.assertEqual(model["fc2.bias"].shape, (5,))
            self.assertIn("bn.running_mean", model)
            self.assertFalse(any(k.startswith("module.") for k in model))
            self.assertEqual(ckpt["optimizer"].dtype, torch.uint8)


if __name__ == "__main__":
    DDPRUN = os.path.abspath(sys.argv.pop(1))
    WORKER = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
