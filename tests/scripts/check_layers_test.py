#!/usr/bin/env python3
"""scripts/check_layers.py against a copy of the repository with one breach of each kind planted:
each is reported, by file and reason, and the clean copy passes.
  check_layers_test.py ROOT"""
import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = None


class CheckLayersFindsEachBreach(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.copy = pathlib.Path(self.tmp.name) / "repo"
        ignore = shutil.ignore_patterns(".git", ".gpu", "build", "build-*", "__pycache__")
        shutil.copytree(ROOT, self.copy, ignore=ignore)

    def tearDown(self):
        self.tmp.cleanup()

    def run_check(self):
        r = subprocess.run([sys.executable, str(self.copy / "scripts/check_layers.py"), str(self.copy)],
                           capture_output=True, text=True)
        return r.returncode, r.stdout

    def plant(self, path, line):
        f = self.copy / path
        f.write_text(line + "\n" + f.read_text())

    def test_the_repository_passes(self):
        rc, out = self.run_check()
        self.assertEqual(rc, 0, out)
        self.assertIn("0 not allowed", out)

    def test_each_breach_is_named(self):
        self.plant("rendezvous/core/kv_store.cpp", '#include "tests/support/wait_until.hpp"')
        self.plant("launcher/workers/process.cpp", '#include "launcher/agent/agent.hpp"')
        self.plant("rendezvous/server/server.cpp", '#include "rendezvous/client/client.hpp"')
        self.plant("launcher/agent/agent.cpp", '#include "rendezvous/daemon/status.hpp"')
        self.plant("launcher/agent/status_server.cpp", '#include "launcher/workers/no_such_file.hpp"')
        self.plant("worker_sdk/include/ddprun/worker/env.hpp", '#include "common/errors.hpp"')
        self.plant("worker_sdk/src/env.cpp", '#include "launcher/cli/options.hpp"')
        self.plant("examples/mlp.cpp", '#include "launcher/workers/numa.hpp"')
        self.plant("tests/launcher/agent_test.cpp", '#include "tests/launcher/round_protocol_test.cpp"')
        self.plant("rendezvous/server/janitor.cpp", "namespace ddprun::rdzv::core {\nint stray() { return 1; }\n}  // namespace ddprun::rdzv::core")
        self.plant("launcher/agent/status_server.hpp", "namespace ddprun::rdzv::server {\nclass Ahead;\n}  // namespace ddprun::rdzv::server")
        self.plant("worker_sdk/include/ddprun/worker/serialize.hpp", "namespace torch::nn {\nclass Module;\n}")
        cm = self.copy / "launcher/CMakeLists.txt"
        cm.write_text(cm.read_text().replace(
            "target_link_libraries(ddprun_launcher_workers PUBLIC ddprun::common",
            "target_link_libraries(ddprun_launcher_workers PUBLIC ddprun::common ddprun_launcher_agent ddprun::store_daemon"))
        cm.write_text(cm.read_text().replace(
            "target_link_libraries(ddprun_launcher_cli PUBLIC ddprun::store_core",
            "target_link_libraries(ddprun_launcher_cli PUBLIC ddprun::store_core ddprun_launcher_store"))
        rc, out = self.run_check()
        self.assertEqual(rc, 1, out)
        for expected in [
            "rendezvous/core/kv_store.cpp (rendezvous/core) includes tests/support/wait_until.hpp: test-support code",
            "launcher/workers/process.cpp (launcher/workers) includes launcher/agent/agent.hpp: an upper layer",
            "rendezvous/server/server.cpp (rendezvous/server) includes rendezvous/client/client.hpp: a sibling",
            "launcher/agent/agent.cpp: includes rendezvous/daemon/status.hpp (rendezvous/daemon is the daemon's alone)",
            'launcher/agent/status_server.cpp includes "launcher/workers/no_such_file.hpp", which is not in the repository',
            "worker_sdk/include/ddprun/worker/env.hpp (sdk) includes common/errors.hpp",
            "worker_sdk/src/env.cpp (sdk-src) includes launcher/cli/options.hpp",
            "examples/mlp.cpp (examples) includes launcher/workers/numa.hpp",
            "tests/launcher/agent_test.cpp includes tests/launcher/round_protocol_test.cpp: a source file",
            "ddprun_launcher_workers (launcher/workers) links ddprun_launcher_agent (launcher/agent): not a lower layer",
            "ddprun_launcher_workers (launcher/workers) links ddprun_store_daemon: the daemon's alone",
            "ddprun_launcher_cli (launcher/cli) links ddprun_launcher_store, whose headers none of its files include",
            "rendezvous/server/janitor.cpp: its code is in namespace ddprun::rdzv::core, not ddprun::rdzv::server",
            "worker_sdk/include/ddprun/worker/serialize.hpp: declares in LibTorch's namespace torch::nn",
        ]:
            self.assertIn(expected, out)
        self.assertNotIn("launcher/agent/status_server.hpp: its code", out, "a class declared ahead is no breach")


if __name__ == "__main__":
    ROOT = pathlib.Path(sys.argv.pop(1)).resolve()
    unittest.main(verbosity=2)
