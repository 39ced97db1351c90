"""--preload: Python workers forked from a per-node zygote that imported torch once behave as
exec'd ones: the same training result to the bit, their own random state, the same exit codes,
signals, failure report, error file, restarts, hang stacks, and nothing left after ddprun is
killed. A hot spare's zygote imports while the spare waits: the worker it gets when it takes a
lost node's place is forked from it.

usage: /usr/bin/python3 test_preload.py PATH/TO/ddprun
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from ports import free_port

DDPRUN = None
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "preload_worker.py")
ENV = dict(os.environ, PYTHON_EXEC=sys.executable, OMP_NUM_THREADS="1")


def run(args, timeout=240, preload=True):
    cmd = [DDPRUN] + (["--preload", "torch"] if preload else []) + args
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def wait_for(pred, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class Preload(unittest.TestCase):
    def test_ddp_result_is_bit_identical_with_and_without_preload(self):
        digests = {}
        for preload in (False, True):
            with tempfile.TemporaryDirectory() as d:
                r = run(["--nproc_per_node", "2", WORKER, "ddp", d], preload=preload)
                self.assertEqual(r.returncode, 0, r.stderr)
                with open(os.path.join(d, "digest")) as f:
                    digests[preload] = f.read()
                self.assertEqual("imported once in" in r.stderr, preload, r.stderr)
        self.assertEqual(digests[True], digests[False])

    def test_forked_workers_get_their_own_process_argv_cwd_and_random_state(self):
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run([DDPRUN, "--preload", "torch", "--nproc_per_node", "3", WORKER, "state", d],
                               env=ENV, capture_output=True, text=True, timeout=240, cwd=d)
            self.assertEqual(r.returncode, 0, r.stderr)
            states = [read_json(os.path.join(d, "state.%d" % k)) for k in range(3)]
        ddprun_pids = set()
        for k, s in enumerate(states):
            self.assertTrue(s["preloaded"], s)
            self.assertEqual(s["pgid"], s["pid"], "each worker leads its own process group")
            ddprun_pids.add(s["ppid"])
            self.assertEqual(s["argv"], [WORKER, "state", d])
            self.assertEqual(s["main_file"], WORKER)
            self.assertEqual(s["path0"], HERE)
            self.assertEqual(os.path.realpath(s["cwd"]), os.path.realpath(d))
            self.assertEqual(s["local_rank"], str(k))
            self.assertEqual(s["world_size"], "3")
            self.assertIn("default_int_handler", s["sigint"])
            self.assertTrue(s["sigterm_default"], s)
        self.assertEqual(len(ddprun_pids), 1, "every worker's parent is ddprun")
        self.assertEqual(len({s["torch_seed"] for s in states}), 3, states)
        self.assertEqual(len({s["torch_draw"] for s in states}), 3, states)
        self.assertEqual(len({s["random_draw"] for s in states}), 3, states)

    def test_a_program_that_seeds_itself_gets_what_it_seeded(self):
        with tempfile.TemporaryDirectory() as d:
            r = run(["--nproc_per_node", "2", WORKER, "seeded", d])
            self.assertEqual(r.returncode, 0, r.stderr)
            states = [read_json(os.path.join(d, "state.%d" % k)) for k in range(2)]
        self.assertEqual(states[0]["torch_draw"], states[1]["torch_draw"])
        self.assertEqual(states[0]["random_draw"], states[1]["random_draw"])

    def test_exit_code_report_and_restart_fork_again_without_import(self):
        with tempfile.TemporaryDirectory() as d:
            report = os.path.join(d, "report.json")
            r = run(["--nproc_per_node", "2", "--report_file", report, WORKER, "fail", "1", "7"])
            self.assertEqual(r.returncode, 7, r.stderr)
            rep = read_json(report)
            self.assertEqual(rep["outcome"], "failed")
            self.assertEqual(rep["root_cause"]["rank"], 1)
            self.assertEqual(rep["root_cause"]["exit_code"], 7)
            r = run(["--nproc_per_node", "2", "--max_restarts", "1", WORKER, "fail", "1", "7"])
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("[rank1]: rank 1 done attempt 1 preloaded True", r.stdout)
            self.assertEqual(r.stderr.count("imported once in"), 1, r.stderr)

    def test_error_file_names_the_exception(self):
        with tempfile.TemporaryDirectory() as d:
            report = os.path.join(d, "report.json")
            r = run(["--nproc_per_node", "2", "--report_file", report, WORKER, "raise"])
            self.assertEqual(r.returncode, 1, r.stderr)
            rep = read_json(report)
            self.assertEqual(rep["root_cause"]["rank"], 1)
            self.assertIn("RuntimeError: boom from a forked worker", rep["root_cause"]["error"] or "")

    def test_a_worker_killed_by_a_signal_is_reported_with_it(self):
        with tempfile.TemporaryDirectory() as d:
            report = os.path.join(d, "report.json")
            r = run(["--nproc_per_node", "2", "--report_file", report, WORKER, "kill-self", str(int(signal.SIGSEGV))])
            self.assertEqual(r.returncode, 128 + signal.SIGSEGV, r.stderr)
            rep = read_json(report)
            self.assertEqual(rep["root_cause"]["rank"], 1)
            self.assertEqual(rep["root_cause"]["signal"], signal.SIGSEGV)

    def test_a_hang_gets_every_ranks_python_stack(self):
        with tempfile.TemporaryDirectory() as d:
            report = os.path.join(d, "report.json")
            # (--log_dir: a hung run's directory is kept for its stacks, here rather than under /tmp)
            r = run(["--nproc_per_node", "2", "--hang_timeout", "3", "--report_file", report, "--log_dir",
                     os.path.join(d, "logs"), WORKER, "sleep", d])
            self.assertEqual(r.returncode, 124, r.stderr)
            rep = read_json(report)
            self.assertEqual(rep["outcome"], "hung")
            self.assertIn("sleep_here", rep["hang"]["report"])

    def test_sigkill_of_ddprun_leaves_no_worker_and_no_zygote(self):
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.Popen([DDPRUN, "--preload", "torch", "--nproc_per_node", "2", WORKER, "sleep", d],
                                 env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                ready = [os.path.join(d, "ready.%d" % k) for k in range(2)]
                self.assertTrue(wait_for(lambda: all(os.path.exists(f) for f in ready), 120))
                time.sleep(0.2)
                workers = []
                for f in ready:
                    with open(f) as fh:
                        workers.append(int(fh.read()))
                zygotes = [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and
                           os.path.exists("/proc/%s/environ" % pid) and
                           _parent(int(pid)) == p.pid and int(pid) not in workers]
                p.kill()
                p.wait()
                for pid in workers + zygotes:
                    self.assertTrue(wait_for(lambda: not alive(pid), 15), "pid %d outlived ddprun" % pid)
            finally:
                if p.poll() is None:
                    p.kill()
                    p.wait()

    def test_a_preload_that_fails_says_so_and_the_job_runs_the_normal_way(self):
        with tempfile.TemporaryDirectory() as d:
            cmd = [DDPRUN, "--preload", "no_such_module_for_ddprun", "--nproc_per_node", "2", WORKER, "state", d]
            r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=240)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("importing no_such_module_for_ddprun failed", r.stderr)
            self.assertIn("workers start the normal way", r.stderr)
            self.assertFalse(read_json(os.path.join(d, "state.0"))["preloaded"])

    def test_a_spares_zygote_imports_while_it_waits_and_forks_the_worker_that_takes_a_lost_nodes_place(self):
        conf = "join_timeout=60,last_call_timeout=1,keep_alive_interval=0.2,keep_alive_max_attempt=3"
        port = free_port()
        with tempfile.TemporaryDirectory() as d:
            def node(host):
                cmd = [DDPRUN, "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:%d" % port, "--rdzv_id",
                       "preload-spare", "--nnodes", "2:2", "--nproc_per_node", "1", "--local_addr",
                       "127.0.0.%d" % host, "--rdzv_conf", conf, "--preload", "torch", "--max_restarts", "0", WORKER,
                       "spin", d]
                with open(os.path.join(d, "node%d.log" % host), "w") as log:
                    return subprocess.Popen(cmd, env=ENV, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)

            def log_of(host):
                with open(os.path.join(d, "node%d.log" % host)) as f:
                    return f.read()

            def spins():
                return [read_json(os.path.join(d, f)) for f in os.listdir(d) if f.startswith("spin.") and
                        not f.endswith(".tmp")]

            nodes = {1: node(1)}
            try:
                self.assertTrue(wait_for(lambda: port in _listening_ports(), 60), log_of(1))  # node 1 hosts the store
                nodes[2] = node(2)
                self.assertTrue(wait_for(lambda: len(spins()) == 2, 180), log_of(1) + log_of(2))
                nodes[3] = node(3)
                self.assertTrue(wait_for(lambda: "as a spare" in log_of(3), 60), log_of(3))
                # While it waits, outside the world, the spare's zygote has torch loaded.
                self.assertTrue(wait_for(lambda: _children_with_torch(nodes[3].pid), 180), log_of(3))
                holding = _children_with_torch(nodes[3].pid)
                self.assertNotIn("imported once in", log_of(3), "no worker was placed on the spare yet")
                os.killpg(nodes[2].pid, signal.SIGKILL)
                nodes[2].wait()
                on_spare = lambda: [s for s in spins() if s["ppid"] == nodes[3].pid]  # noqa: E731
                self.assertTrue(wait_for(on_spare, 120), log_of(1) + log_of(3))
                self.assertEqual(len(on_spare()), 1, spins())
                self.assertTrue(on_spare()[0]["preloaded"], on_spare())
                self.assertEqual(on_spare()[0]["world_size"], "2")
                # Forked from the zygote that held torch before the failure: its one import.
                self.assertEqual(log_of(3).count("imported once in"), 1, log_of(3))
                self.assertIn("(zygote pid %d)" % holding[0], log_of(3))
                open(os.path.join(d, "stop"), "w").close()
                for host in (1, 3):
                    self.assertEqual(nodes[host].wait(timeout=120), 0, log_of(host))
            finally:
                for p in nodes.values():
                    if p.poll() is None:
                        os.killpg(p.pid, signal.SIGKILL)
                        p.wait()


def _listening_ports():
    """The TCP ports something listens on (IPv4 and IPv6)."""
    got = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.readlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A":  # LISTEN
                got.add(int(fields[1].rsplit(":", 1)[1], 16))
    return got


def _children_with_torch(pid):
    """The children of PID that have torch's library mapped."""
    found = []
    for child in os.listdir("/proc"):
        if child.isdigit() and _parent(int(child)) == pid:
            try:
                with open("/proc/%s/maps" % child) as f:
                    if "libtorch" in f.read():
                        found.append(int(child))
            except OSError:
                pass
    return found


def _parent(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().split(")")[-1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


if __name__ == "__main__":
    DDPRUN = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
