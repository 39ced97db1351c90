"""torchrun's open elastic bugs, as end-to-end tests of ddprun with real PyTorch workers (Gloo).

Each test is named after the PyTorch issue whose scenario it plays, on loopback addresses
(127.0.0.x for the nodes): two ddprun agents in one c10d-style rendezvous, workers that all-reduce
every 0.1 s (elastic_worker.py), one node stopped or killed in the middle of training.

usage: /usr/bin/python3 test_torchrun_issues.py PATH/TO/ddprun
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from launched import Launched
from ports import free_port, port_taken

DDPRUN = None
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "elastic_worker.py")
ENV = dict(os.environ, PYTHON_EXEC=sys.executable, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
# Keep-alives every 0.2 s, a node lost after 3 missed ones; a round starts 0.5 s after the minimum.
FAST = "join_timeout=60,last_call_timeout=0.5,keep_alive_interval=0.2,keep_alive_max_attempt=3"


class Agent(Launched):
    """One ddprun node; its output goes to files (read while it runs)."""

    def __init__(self, work, name, port, address, steps, max_restarts=0, node_rank=None):
        """Elastic (--nnodes 1:2, c10d) unless `node_rank` is given: then a fixed job of 2 nodes."""
        self.name, self.work = name, work
        self.report = os.path.join(work, f"{name}.report.json")
        self.out_path, self.err_path = os.path.join(work, f"{name}.out"), os.path.join(work, f"{name}.err")
        if node_rank is None:
            where = ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "issue",
                     "--nnodes", "1:2"]
        else:
            where = ["--nnodes", "2", "--node_rank", str(node_rank), "--master_addr", "127.0.0.1",
                     "--master_port", str(port)]
        argv = [DDPRUN, *where, "--nproc_per_node", "1", "--local_addr", address, "--rdzv_conf", FAST,
                "--max_restarts", str(max_restarts), "--report_file", self.report,
                WORKER, str(steps), work, name]
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(argv, env=ENV, stdout=out, stderr=err)

    def output(self):
        with open(self.out_path) as out, open(self.err_path) as err:
            return out.read() + err.read()

    def wait_for(self, text, timeout=60, times=1):
        """Whether `text` appears `times` times in the output before `timeout` seconds or the agent's end."""
        return self.wait_until(lambda: self.output().count(text) >= times, timeout)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def read_report(self):
        with open(self.report) as f:
            return json.load(f)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def worker_pids(work, node):
    return [int(name.split(".")[1]) for name in os.listdir(work) if name.startswith(node + ".") and
            name.split(".")[1].isdigit()]


def wait_until_gone(pids, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


class TorchrunElasticIssues(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="ddprun-issues-")
        self.agents = []
        self.port = free_port()

    def tearDown(self):
        for a in self.agents:
            a.stop()
        for node in ("a", "b", "b2", "b3"):
            for pid in worker_pids(self.work, node):
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.work, ignore_errors=True)

    def agent(self, name, address, steps, **kwargs):
        a = Agent(self.work, name, self.port, address, steps, **kwargs)
        self.agents.append(a)
        return a

    def two_nodes_training(self, steps, fixed=False, **kwargs):
        a = self.agent("a", "127.0.0.2", steps, node_rank=0 if fixed else None, **kwargs)
        self.assertTrue(a.wait_until(lambda: port_taken(self.port), 30), a.output())  # a hosts the store
        b = self.agent("b", "127.0.0.3", steps, node_rank=1 if fixed else None, **kwargs)
        self.assertTrue(a.wait_for("rank 0 step 3 world 2", 60), a.output() + b.output())
        return a, b

    def test_pytorch_182221_with_nnodes_1_2_the_survivor_of_a_stopped_node_trains_on(self):
        # torchrun 2.9: the remaining node's rendezvous dies with an AssertionError.
        a, b = self.two_nodes_training(steps=30, max_restarts=3)
        b.proc.send_signal(signal.SIGTERM)  # docker stop
        b.wait(60)
        self.assertEqual(a.wait(120), 0, a.output()[-3000:])
        self.assertIn("rank 0 done world 1 attempt 0", a.output())
        report = a.read_report()
        self.assertEqual(report["outcome"], "succeeded", report)
        self.assertEqual(report["restarts"], 0, "a node leaving uses up no restart")
        self.assertEqual([r["nnodes"] for r in report["attempts"]][-1], 1, report)
        self.assertEqual(wait_until_gone(worker_pids(self.work, "b"), 30), [], "node b's workers outlived it")

    def test_pytorch_147064_a_node_that_leaves_and_rejoins_fast_never_uses_up_max_restarts(self):
        # torchrun: a quick rejoin sometimes ends in RendezvousClosedError, sometimes bypasses
        # --max-restarts=0 altogether, depending on timing. Here it leaves and rejoins twice with
        # --max_restarts 0: membership changes are not failures, and the job ends on two nodes.
        a, b = self.two_nodes_training(steps=50, max_restarts=0)
        for times, again in enumerate(("b2", "b3"), start=1):
            b.proc.send_signal(signal.SIGTERM)
            b.wait(60)
            self.assertTrue(a.wait_for("world 1 start", 60, times), a.output()[-3000:])
            b = self.agent(again, "127.0.0.3", 50, max_restarts=0)
            self.assertTrue(b.wait_for("world 2 start", 60), b.output()[-3000:] + a.output()[-3000:])
            self.assertIsNone(a.proc.poll(), a.output()[-3000:])
        self.assertEqual(a.wait(120), 0, a.output()[-3000:])
        self.assertEqual(b.wait(120), 0, b.output()[-3000:])
        report = a.read_report()
        self.assertEqual(report["outcome"], "succeeded", report)
        self.assertEqual(report["restarts"], 0, report)
        nnodes = [r["nnodes"] for r in report["attempts"]]
        self.assertEqual(nnodes[-1], 2, report)
        self.assertGreaterEqual(nnodes.count(1), 2, f"two rounds on one node: {nnodes}")

    def test_pytorch_108158_max_restarts_is_the_jobs_even_for_a_node_that_came_back(self):
        # torchrun counts --max-restarts per agent: a node that leaves and comes back as a new
        # process starts from 0, so quick rejoins get around the limit (#147064, #108158). Here a
        # failure uses the job's one restart; node b then leaves and comes back; a second failure,
        # on the new node b, must end the job on both nodes instead of letting b go on alone.
        a, b = self.two_nodes_training(steps=300, max_restarts=1)
        open(os.path.join(self.work, "fail-b"), "w").close()
        # The workers' attempt 1 (TORCHELASTIC_RESTART_COUNT): the job's one restart is used.
        self.assertTrue(a.wait_for("attempt 1 world 2 start", 60), a.output()[-3000:])
        b.proc.send_signal(signal.SIGTERM)
        b.wait(60)
        self.assertTrue(a.wait_for("attempt 1 world 1 start", 60), a.output()[-3000:])
        b2 = self.agent("b2", "127.0.0.3", 300, max_restarts=1)
        self.assertTrue(b2.wait_for("attempt 1 world 2 start", 60), b2.output()[-3000:] + a.output()[-3000:])
        self.assertIn("the job has made 1 restart(s) of 1", b2.output())
        open(os.path.join(self.work, "fail-b2"), "w").close()
        self.assertEqual(b2.wait(120), 1, b2.output()[-3000:])
        self.assertNotEqual(a.wait(120), 0, a.output()[-3000:])
        self.assertNotIn("world 1 start", b2.output(), "node b2 went on alone past --max_restarts")
        self.assertEqual(b2.read_report()["restarts"], 1, b2.read_report())
        self.assertEqual(a.read_report()["outcome"], "failed", a.read_report())

    def test_pytorch_150916_when_one_agent_is_killed_the_other_trains_on_and_its_workers_die(self):
        # torchrun: the surviving agent crashes with RendezvousClosedError when the other is killed.
        # Also pytorch#76287: the killed node's workers must not outlive it.
        a, b = self.two_nodes_training(steps=40, max_restarts=1)
        b_workers = worker_pids(self.work, "b")
        self.assertTrue(b_workers)
        b.proc.send_signal(signal.SIGKILL)
        b.wait(30)
        self.assertEqual(wait_until_gone(b_workers, 30), [], "the killed agent's workers are still running")
        self.assertEqual(a.wait(120), 0, a.output()[-3000:])
        self.assertIn("rank 0 done world 1", a.output())
        report = a.read_report()
        self.assertEqual(report["restarts"], 0, report)
        self.assertEqual(report["attempts"][0]["outcome"], "node_lost", report)

    def test_pytorch_76287_a_crashed_node_ends_a_fixed_size_job_with_every_worker_stopped(self):
        # torchrun: after one node crashed, the other nodes' workers hung in their collectives for
        # hours, logging failed keep-alives. A job of exactly 2 nodes cannot go on with one: the
        # survivor must stop its workers, say which node was lost, and exit non-zero.
        a, b = self.two_nodes_training(steps=600, max_restarts=0, fixed=True)
        a_workers, b_workers = worker_pids(self.work, "a"), worker_pids(self.work, "b")
        b.proc.send_signal(signal.SIGKILL)
        b.wait(30)
        code = a.wait(120)
        self.assertNotEqual(code, 0, a.output()[-3000:])
        self.assertEqual(wait_until_gone(a_workers + b_workers, 30), [], "workers outlived the job")
        self.assertNotIn("rank 0 done", a.output())
        report = a.read_report()
        self.assertNotEqual(report["outcome"], "succeeded", report)
        self.assertEqual(report["outcome"], "node_lost", report)
        self.assertIn("node 1", report["message"], "the report names the lost node")
        self.assertIsNone(report["root_cause"], "rank 0 lost its peer: it is not the cause")


class UnkillableWorker(unittest.TestCase):
    """pytorch#185414: a worker asleep in the kernel (state D: a hung GPU driver, NFS, RDMA) ignores
    SIGKILL. torchrun's agent waits for it without end (an unbounded proc.join()/wait()) and never
    exits. ddprun gives it --kill_timeout after SIGKILL, reports it, does not restart, and exits."""

    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="ddprun-dstate-")
        self.mnt = os.path.join(self.work, "mnt")
        os.mkdir(self.mnt)
        self.marker = os.path.join(self.work, "read-arrived")
        self.server = subprocess.Popen([sys.executable, os.path.join(HERE, "stuck_fuse.py"), self.mnt, self.marker],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = self.server.stdout.readline()
        if first.strip() != "mounted":
            err = self.server.communicate(timeout=30)[1]
            shutil.rmtree(self.work, ignore_errors=True)
            if self.server.returncode == 77:
                self.skipTest(f"no FUSE mount here: {err.strip()}")
            self.fail(f"stuck_fuse.py did not mount: {err}")

    def tearDown(self):
        # The server's end aborts the connection: the stuck read fails and the pending SIGKILL lands.
        self.server.kill()
        self.server.wait()
        stuck = worker_pids(self.work, "stuck")
        gone = wait_until_gone(stuck, 30)
        subprocess.run(["umount", "-l", self.mnt], capture_output=True)
        shutil.rmtree(self.work, ignore_errors=True)
        self.assertEqual(gone, [], "the stuck worker did not end once its file server went away")

    def test_pytorch_185414_a_worker_that_sigkill_cannot_end_is_reported_and_ddprun_exits(self):
        report_file = os.path.join(self.work, "report.json")
        argv = [DDPRUN, "--nproc_per_node", "2", "--max_restarts", "2", "--shutdown_timeout", "1",
                "--kill_timeout", "2", "--report_file", report_file, os.path.join(HERE, "stuck_worker.py"),
                os.path.join(self.mnt, "stuck"), self.marker, self.work]
        ddprun = subprocess.Popen(argv, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            output = ddprun.communicate(timeout=180)[0]
        except subprocess.TimeoutExpired:
            ddprun.kill()
            output = ddprun.communicate()[0]
            self.fail(f"ddprun waited without end for a worker SIGKILL cannot end:\n{output[-4000:]}")
        stuck = worker_pids(self.work, "stuck")
        self.assertEqual(len(stuck), 1, output)
        # The scenario really is one SIGKILL cannot end: the worker outlives ddprun, asleep in the kernel.
        with open(f"/proc/{stuck[0]}/stat") as f:
            self.assertEqual(f.read().split(")")[-1].split()[0], "D", "the worker is not in uninterruptible sleep")
        self.assertEqual(ddprun.returncode, 3, output[-4000:])  # rank 1's failure, the root cause
        self.assertIn(f"worker rank 0 (pid {stuck[0]}) did not exit 2s after SIGKILL", output)
        self.assertIn("uninterruptible", output)
        self.assertIn("not restarting", output)
        self.assertNotIn("restarting the worker group", output)
        with open(report_file) as f:
            report = json.load(f)
        self.assertEqual(report["restarts"], 0, report)
        workers = {w["rank"]: w for w in report["attempts"][-1]["workers"]}
        self.assertEqual(workers[0]["state"], "unkillable", report)
        self.assertEqual(workers[0]["pid"], stuck[0], report)
        self.assertEqual(workers[0]["process_state"], "D", report)
        self.assertEqual(workers[1]["state"], "failed", report)
        self.assertEqual(report["root_cause"]["rank"], 1, report)


if __name__ == "__main__":
    DDPRUN = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
