"""Fault-tolerant replica groups end to end: real ddprun agents, one per replica group, a real
ddprun-rendezvous daemon holding the job's quorum, real PyTorch workers (Gloo) training with
ddprun_ft. A group's worker is SIGKILLed in the middle of training: the other groups keep their
processes and go on; the killed group is restarted by its own ddprun, heals from a peer and trains
on, bit-identical to the others.

C++ groups run tests/ft/ft_worker.cpp (the worker SDK's ft::Manager), the Python one's twin: the same
model, batches and log, so a job of both is checked bit for bit, healing across the languages.

The examples' fault-tolerant modes (examples/python/fashion_mnist_ddp.py and the C++
fashion_mnist_lenet) train one job together, a group of each.

usage: /usr/bin/python3 test_fault_tolerance.py PATH/TO/ddprun PATH/TO/ddprun-rendezvous
           [PATH/TO/ft_worker] [PATH/TO/fashion_mnist_lenet] [TEST...]
"""
import collections
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

from daemon import Daemon
from launched import Launched
from torch_compat import store_client
from ports import free_port

DDPRUN = DAEMON = CPP_WORKER = CPP_EXAMPLE = EXAMPLES = None
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "ft_worker.py")
BAD_ASKS = os.path.join(HERE, "ft_bad_asks.py")
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "python", "fashion_mnist_ddp.py")
ENV = dict(os.environ, PYTHON_EXEC=sys.executable, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", DDPRUN_PROGRESS_INTERVAL="1")


def read_log(path):
    """A JSON-lines log's whole lines; a line torn by a SIGKILL (ended by the next process) is left out."""
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            if line.endswith("\n") and line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    return out


class Group(Launched):
    """One replica group: a ddprun with --replica_group."""

    def __init__(self, work, group, port, steps, nproc=1, min_groups=2, pause=0.1, max_restarts=2, hold=0,
                 join_timeout=20, lang="python", etcd=None, program=None, token=None, asynchronous=False,
                 host=None, daemon_host="127.0.0.1", prefix=(), conf="", env=None, suffix="", rdzv_id="ftjob"):
        self.work, self.group, self.nproc, self.program = work, group, nproc, program
        self.name = "replica group %d" % group
        self.err_path = os.path.join(work, "ddprun%d%s.err" % (group, suffix))
        where = ["--rdzv_backend", "etcd", "--rdzv_endpoint", etcd] if etcd else \
            ["--rdzv_backend", "c10d", "--rdzv_endpoint", "%s:%d" % (daemon_host, port)]
        argv = [*prefix, DDPRUN, "--nproc_per_node", str(nproc), *where, "--rdzv_id", rdzv_id,
                "--replica_group", str(group), "--min_replica_groups", str(min_groups),
                "--max_restarts", str(max_restarts),
                # The command the docs give: the node is known by its host name. Only the
                # network-namespace tests, whose hosts share one name, give each its address.
                *(["--local_addr", host] if host else []),
                "--rdzv_conf", "join_timeout=60,quorum_join_timeout=%d,quorum_heartbeat_timeout=5%s%s"
                % (join_timeout, ",token_file=" + token if token else "", "," + conf if conf else ""),
                *(program or [WORKER if lang == "python" else CPP_WORKER, str(steps), work, str(pause), str(hold)])]
        self.out_path = os.path.join(work, "ddprun%d%s.out" % (group, suffix))
        with open(self.err_path, "w") as err, open(self.out_path, "w") as out:
            env = dict(ENV, **(env or {}))
            if asynchronous:
                env["DDPRUN_FT_TEST_ASYNC"] = "1"
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err)

    def events(self, rank=0):
        return read_log(os.path.join(self.work, "g%dr%d.log" % (self.group, rank)))

    def commits(self, rank=0):
        return [e for e in self.events(rank) if e["event"] == "commit"]

    def starts(self, rank=0):
        return [e for e in self.events(rank) if e["event"] == "start"]

    def output(self):
        with open(self.err_path) as f:
            return f.read()

    def failures(self):
        """ddprun's warnings and the workers' errors, whole: why a worker ended, wherever it is in a long log."""
        keep = (" WARN ", " ERROR ", "Error", "terminate called", "what():", "Traceback")
        return "\n".join(line for line in self.output().splitlines() if any(k in line for k in keep))

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class GroupsTest(unittest.TestCase):
    """A job's replica groups and its daemon, and what every case checks of their commits."""

    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="ddprun_ft_")
        self.daemon = Daemon(DAEMON)
        self.groups = []
        self.passed = False  # set at the end of a test: a failed one keeps its directory

    def tearDown(self):
        for g in self.groups:
            g.kill()
        if self.daemon.proc.poll() is None:
            self.daemon.stop()
        if self.passed and not os.environ.get("KEEP"):
            shutil.rmtree(self.work, ignore_errors=True)
        else:
            print("kept for a look: " + self.work, file=sys.stderr)

    def check_commits_agree(self, steps, groups=None):
        """Every step committed by several groups (`groups`, or the test's) was committed under one
        quorum and left them all with the same parameters; every rank of every group reached `steps`."""
        by_step = collections.defaultdict(list)
        for g in groups or self.groups:
            for rank in range(g.nproc):
                commits = g.commits(rank)
                self.assertTrue(commits, "group %d rank %d committed nothing" % (g.group, rank))
                self.assertEqual(commits[-1]["step"], steps, "group %d rank %d" % (g.group, rank))
                for c in commits:
                    by_step[c["step"]].append((g.group, rank, c))
        shared = 0
        for step, entries in sorted(by_step.items()):
            hashes = {c["hash"] for _, _, c in entries}
            seqs = {c["seq"] for _, _, c in entries}
            self.assertEqual(len(hashes), 1, "step %d committed with different parameters: %s" % (step, entries))
            self.assertEqual(len(seqs), 1, "step %d committed under two quorums: %s" % (step, entries))
            shared += len({g for g, _, _ in entries}) > 1
        self.assertGreater(shared, steps // 2, "the groups trained mostly apart")
        return by_step


class FaultTolerance(GroupsTest):

    def run_kill_one_group(self, nproc, langs=("python", "python", "python"), etcd=None, asynchronous=()):
        """`asynchronous`: the groups whose workers ask with start_quorum_async() (the forward
        runs while the quorum is agreed on; a victim among them heals in should_commit())."""
        # The survivors train on without the victim from step 8 or so to step 20, then wait there
        # until the restarted victim is up (a restart takes seconds here: PyTorch's import).
        steps, hold = 30, 20
        for g in range(3):
            # What a SIGKILL can leave of a process's last line (the kernel stops a write at a page
            # boundary): the worker must end it, not append its own lines to it.
            for rank in range(nproc):
                with open(os.path.join(self.work, "g%dr%d.log" % (g, rank)), "w") as f:
                    f.write('{"event": "commit", "st')
            self.groups.append(Group(self.work, g, self.daemon.port, steps, nproc=nproc, hold=hold, lang=langs[g],
                                     etcd=etcd, asynchronous=g in asynchronous))
        victim, survivors = self.groups[1], [self.groups[0], self.groups[2]]
        self.assertTrue(victim.wait_until(lambda: len(victim.commits()) >= 8, timeout=120),
                        "group 1 never committed 8 steps:\n" + victim.output()[-4000:])
        # The victim's agent is held (SIGSTOP) while its worker is killed, and let go once every
        # survivor has committed a step without it: a worker that restarts in a fraction of a
        # second (the C++ one, now that a rank's own failure is settled without a hold) could be
        # back before the survivors' next quorum, and whether they trained on alone would be left
        # to the machine's timing (on a loaded machine they once never did).
        victim.proc.send_signal(signal.SIGSTOP)
        try:
            os.kill(victim.starts()[0]["pid"], signal.SIGKILL)
            for g in survivors:
                self.assertTrue(g.wait_until(lambda g=g: any(1 not in c["groups"] for c in g.commits()), timeout=120),
                                "group %d never committed a step without group 1:\n%s" % (g.group, g.output()[-4000:]))
        finally:
            victim.proc.send_signal(signal.SIGCONT)
        # Released once the restarted group is in: it committed with the survivors already, or it
        # asked for a quorum while they hold and waits, alone, for a second group, and says so (a
        # fast quorum of the survivors does not wait for a newcomer that has not asked yet, and
        # released earlier they could finish without it).
        restarted = len(victim.output())

        def back():
            starts = victim.starts()
            if len(starts) < 2:
                return False
            return any(c["pid"] == starts[1]["pid"] for c in victim.commits()) or \
                "1 of the 2 replica groups needed have asked (asked: 1)" in victim.output()[restarted:]

        self.assertTrue(victim.wait_until(back, timeout=120),
                        "group 1 was not restarted, or never asked for a quorum:\n" + victim.output()[-4000:])
        with open(os.path.join(self.work, "release"), "w"):
            pass
        for g in self.groups:
            self.assertEqual(g.wait(), 0, "group %d:\n%s" % (g.group, g.output()[-4000:]))
        self.check_commits_agree(steps)
        for g in survivors:
            for rank in range(nproc):
                self.assertEqual(len(g.starts(rank)), 1,
                                 "group %d rank %d was restarted:\n%s" % (g.group, rank, g.failures()))
                self.assertEqual({c["pid"] for c in g.commits(rank)}, {g.starts(rank)[0]["pid"]})
            # The survivors trained on without the victim while it was away.
            self.assertTrue(any(1 not in c["groups"] for c in g.commits()),
                            "group %d never committed a step without group 1" % g.group)
        for rank in range(nproc):
            starts = victim.starts(rank)
            self.assertEqual(len(starts), 2, "group 1 rank %d: %s" % (rank, starts))
            self.assertEqual(starts[1]["restart"], 1)
            after = [c for c in victim.commits(rank) if c["pid"] == starts[1]["pid"]]
            self.assertTrue(after, "the restarted group 1 rank %d never committed" % rank)
            # Its first commit came right after healing from a peer, at the peers' step.
            self.assertTrue(after[0]["healed"], after[0])
            self.assertGreater(after[0]["step"], 8)
        self.assertIn("replica group 1", victim.output())
        self.passed = True

    def test_a_killed_group_heals_while_the_others_train_on(self):
        # The victim asks with start_quorum_async(): back, it heals in should_commit().
        self.run_kill_one_group(nproc=1, asynchronous=(1,))

    def test_a_killed_group_of_two_ranks_heals_while_the_others_train_on(self):
        # Two of the survivors ask with start_quorum_async(): they serve the healing state from
        # DDP's hook, in their backward.
        self.run_kill_one_group(nproc=2, asynchronous=(0, 2))

    def test_cpp_groups_a_killed_one_heals_while_the_others_train_on(self):
        if not CPP_WORKER:
            self.skipTest("no C++ worker given (the worker SDK was not built)")
        self.run_kill_one_group(nproc=1, langs=("c++", "c++", "c++"), asynchronous=(1, 2))

    def test_a_mixed_job_a_killed_cpp_group_heals_from_python_groups(self):
        # Groups 0 and 2 are Python, group 1 C++: one quorum, one average, one state layout.
        if not CPP_WORKER:
            self.skipTest("no C++ worker given (the worker SDK was not built)")
        self.run_kill_one_group(nproc=1, langs=("python", "c++", "python"))

    def test_on_etcd_a_killed_group_heals_while_the_others_train_on(self):
        # The quorum on etcd (a real etcd server) instead of ddprun-rendezvous.
        if not os.path.exists("/usr/bin/etcd"):
            self.skipTest("no /usr/bin/etcd (Debian's etcd-server)")
        client, peer = free_port(), free_port()
        url = "http://127.0.0.1:%d" % client
        with open(os.path.join(self.work, "etcd.log"), "w") as log:
            etcd = subprocess.Popen(["/usr/bin/etcd", "--name", "ft", "--data-dir", os.path.join(self.work, "etcd"),
                                     "--listen-client-urls", url, "--advertise-client-urls", url,
                                     "--listen-peer-urls", "http://127.0.0.1:%d" % peer,
                                     "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % peer,
                                     "--initial-cluster", "ft=http://127.0.0.1:%d" % peer],
                                    stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(url + "/health", timeout=2) as r:
                        if b"true" in r.read():
                            break
                except OSError:
                    pass
                self.assertLess(time.monotonic(), deadline, "etcd did not start")
                time.sleep(0.1)  # sleep override: etcd starting
            self.run_kill_one_group(nproc=1, etcd=url)
        finally:
            etcd.kill()
            etcd.wait()

    def test_a_group_that_reports_a_step_from_the_future_is_refused_then_heals(self):
        # Group 2's first worker, after 4 commits, asks as at step 1,000,004 (a broken counter):
        # no quorum takes it, its agent says why and answers its workers with an error; they fail,
        # ddprun restarts them, and they heal from a peer. The others never stop.
        steps, hold = 24, 16
        for g in range(3):
            self.groups.append(Group(self.work, g, self.daemon.port, steps, hold=hold,
                                     env={"DDPRUN_FT_TEST_LIE_AT": "4"} if g == 2 else None))
        liar = self.groups[2]
        self.assertTrue(liar.wait_until(lambda: len(liar.starts()) >= 2 and "refused replica group 2" in liar.output(),
                                        timeout=120), "group 2 was not refused and restarted:\n" + liar.output()[-4000:])
        self.assertTrue(liar.wait_until(lambda: "1 of the 2 replica groups needed" in liar.output() or any(
            c["healed"] for c in liar.commits()[4:]), timeout=120), liar.output()[-4000:])
        with open(os.path.join(self.work, "release"), "w"):
            pass
        for g in self.groups:
            self.assertEqual(g.wait(), 0, "group %d:\n%s" % (g.group, g.output()[-4000:]))
        self.check_commits_agree(steps)
        # Said by its agent (and in the workers' error).
        self.assertRegex(liar.output(), r"WARN  ddprun: replica group 2: no quorum for its workers: quorum \d+ refused "
                                        r"replica group 2 \(group 2 reports step 1000004, but the job can have "
                                        r"committed at most step [45]: left out\): its workers' step is not the job's")
        for g in self.groups[:2]:
            self.assertEqual(len(g.starts()), 1, "group %d was restarted:\n%s" % (g.group, g.failures()))
        first, second = [[c for c in liar.commits() if c["pid"] == s["pid"]] for s in liar.starts()]
        self.assertEqual([c["step"] for c in first], [1, 2, 3, 4])
        self.assertTrue(second and second[0]["healed"] and second[0]["step"] > 4, second[:1])
        self.passed = True

    def test_a_worker_that_asks_with_no_step_gets_an_error_and_its_ddprun_lives_on(self):
        # What a broken or hostile worker may write as its step, one ask each: every ask is answered
        # with an error for its group alone, its ddprun lives on, and nothing of it reaches the
        # quorum: a fresh group at step 0 trains the job after it.
        bad = ["-1", "18446744073709551615", "1e19", str(2 ** 63 - 1), '"7"', "null", "[]"]
        liar = Group(self.work, 0, self.daemon.port, 0, min_groups=1, join_timeout=5, program=[BAD_ASKS, *bad])
        self.groups.append(liar)
        self.assertEqual(liar.wait(timeout=120), 0, liar.output()[-4000:])
        with open(liar.out_path) as f:
            answers = [json.loads(line.split(" ", 2)[2]) for line in (line[line.index("answer "):] for line in f
                                                                      if "answer " in line)]
        self.assertEqual(len(answers), len(bad), liar.output()[-4000:])
        for value, answer in zip(bad, answers):
            self.assertIn("error", answer, "step %s: %s" % (value, answer))
            self.assertIn("not a whole number of steps", answer["error"], "step %s: %s" % (value, answer))
        self.assertIn("cannot be used: its \"step\" is '-1'", liar.output())
        fresh = Group(self.work, 1, self.daemon.port, 3, min_groups=1, pause=0.0)
        self.groups.append(fresh)
        self.assertEqual(fresh.wait(timeout=120), 0, fresh.output()[-4000:])
        self.assertEqual([c["step"] for c in fresh.commits()], [1, 2, 3])
        self.passed = True

    def test_a_group_stopped_after_its_daemon_is_gone_ends(self):
        # The daemon is SIGKILLed, then the group's ddprun gets SIGTERM (a scheduler ending the job):
        # it stops its workers and exits. Before, its quorum heartbeat tried to say "gone" to the
        # store that was no more, again and again, and ddprun's exit waited on it for good.
        g = Group(self.work, 0, self.daemon.port, 100000, min_groups=1)
        self.groups.append(g)
        self.assertTrue(g.wait_until(lambda: len(g.commits()) >= 3), g.output()[-3000:])
        self.daemon.proc.kill()
        self.daemon.proc.wait()
        g.proc.send_signal(signal.SIGTERM)
        code = g.wait(timeout=120)
        self.assertNotEqual(code, 0, g.output()[-3000:])
        self.assertIn("received SIGTERM", g.output())
        self.passed = True

    def test_the_quorum_survives_a_restart_of_its_daemon(self):
        # The daemon is SIGKILLed mid-training and started again with its state file, on its port:
        # every group rides it out, no worker restarts, and no step is committed twice or apart.
        self.daemon.stop()
        state = os.path.join(self.work, "state")
        port_file = os.path.join(self.work, "port")
        log = open(os.path.join(self.work, "daemon.log"), "a")

        def start(port):
            if os.path.exists(port_file):
                os.unlink(port_file)
            proc = subprocess.Popen([DAEMON, "--host", "127.0.0.1", "--port", str(port), "--port-file", port_file,
                                     "--state-file", state], stdout=subprocess.DEVNULL, stderr=log)
            deadline = time.monotonic() + 10
            while not os.path.exists(port_file):
                self.assertIsNone(proc.poll(), "the daemon exited")
                self.assertLess(time.monotonic(), deadline, "the daemon wrote no port file")
                time.sleep(0.01)  # sleep override: waiting for another process's file
            with open(port_file) as f:
                return proc, int(f.read())

        daemon, port = start(0)
        try:
            steps = 30
            for g in range(3):
                self.groups.append(Group(self.work, g, port, steps))
            first = self.groups[0]
            self.assertTrue(first.wait_until(lambda: len(first.commits()) >= 8), first.output()[-3000:])
            daemon.kill()
            daemon.wait()
            daemon, _ = start(port)
            for g in self.groups:
                self.assertEqual(g.wait(), 0, "group %d:\n%s" % (g.group, g.output()[-4000:]))
            self.check_commits_agree(steps)
            for g in self.groups:
                self.assertEqual(len(g.starts()), 1, "group %d was restarted:\n%s" % (g.group, g.failures()))
        finally:
            daemon.kill()
            daemon.wait()
            log.close()
        self.passed = True

    def test_a_frozen_group_is_left_behind_then_heals_and_never_commits_a_stale_step(self):
        # Group 2's worker is stopped (SIGSTOP) for longer than the quorum's join timeout while its
        # agent still heartbeats: the others go on without it; continued, it heals and trains on.
        steps = 40
        for g in range(3):
            self.groups.append(Group(self.work, g, self.daemon.port, steps, join_timeout=2))
        frozen, others = self.groups[2], self.groups[:2]
        self.assertTrue(frozen.wait_until(lambda: len(frozen.commits()) >= 5), frozen.output()[-3000:])
        pid = frozen.starts()[0]["pid"]
        os.kill(pid, signal.SIGSTOP)
        at = len(frozen.commits())
        try:
            self.assertTrue(others[0].wait_until(lambda: sum(2 not in c["groups"] for c in others[0].commits()) >= 5),
                            "the others did not go on without the frozen group:\n" + others[0].output()[-3000:])
        finally:
            os.kill(pid, signal.SIGCONT)
        for g in self.groups:
            self.assertEqual(g.wait(), 0, "group %d:\n%s" % (g.group, g.output()[-4000:]))
        self.check_commits_agree(steps)
        commits = frozen.commits()
        self.assertEqual({c["pid"] for c in commits}, {pid}, "the frozen group was restarted")
        later = commits[at:]
        self.assertTrue(later and any(c["healed"] for c in later), "the frozen group never healed: %s" % later[:3])
        self.passed = True

    def test_a_group_whose_ddprun_freezes_in_a_quorum_holds_the_others_no_longer_than_its_heartbeat(self):
        self.run_freeze_in_a_quorum("python")

    def test_cpp_a_group_whose_ddprun_freezes_in_a_quorum_holds_the_others_no_longer_than_its_heartbeat(self):
        if not CPP_WORKER:
            self.skipTest("no C++ worker given (the worker SDK was not built)")
        self.run_freeze_in_a_quorum("c++")

    def run_freeze_in_a_quorum(self, lang):
        # Group 1's ddprun is stopped (SIGSTOP) between answering its worker's ask, which put it in
        # the quorum, and the worker's reading of the answer: the other groups wait for it in the
        # step's collective. Before, they waited there until their collective's timeout (20 s here,
        # 60 s by default), saying nothing. The worker leaves once its ddprun has not answered for
        # the quorum's heartbeat timeout (5 s); the others' collective fails at once, and they train
        # on without the group, which heals when its ddprun is let go.
        steps = 60
        for g in range(3):
            self.groups.append(Group(self.work, g, self.daemon.port, steps, min_groups=2, lang=lang if g == 1 else "python",
                                     env={"DDPRUN_FT_TEST_PAUSE_ASKED": "6"} if g == 1 else None))
        frozen, others = self.groups[1], [self.groups[0], self.groups[2]]
        asked = os.path.join(self.work, "asked")
        self.assertTrue(frozen.wait_until(lambda: os.path.exists(asked), timeout=120), frozen.output()[-3000:])
        with open(asked) as f:
            ask = json.load(f)
        # The answer is in the group's worker store (its ddprun hosts it): read it as the worker would.
        store = store_client("127.0.0.1", ask["port"], timeout=datetime.timedelta(seconds=60))
        view = json.loads(json.loads(store.get("ddprun_ft/quorum/%d" % ask["n"]))["body"])  # sealed: readable
        self.assertIn(1, view.get("groups", []), view)
        frozen.proc.send_signal(signal.SIGSTOP)
        try:
            with open(os.path.join(self.work, "go"), "w"):
                pass
            for g in others:
                self.assertTrue(g.wait_until(lambda g=g: sum(1 not in c["groups"] for c in g.commits()) >= 2,
                                             timeout=18),
                                "group %d did not train on without the frozen group:\n%s" % (g.group, g.output()[-3000:]))
        finally:
            frozen.proc.send_signal(signal.SIGCONT)
        for g in self.groups:
            self.assertEqual(g.wait(), 0, "group %d:\n%s" % (g.group, g.output()[-4000:]))
        self.assertIn("this rank's ddprun has not answered for", frozen.output())
        self.assertGreaterEqual(len(frozen.starts()), 2, frozen.output()[-3000:])
        if frozen.commits() and frozen.commits()[-1]["step"] == steps:
            self.check_commits_agree(steps)
        else:
            # Its restarted rank came back after the others had finished (a loaded machine): it is
            # told that the job is over, and what it committed before agrees with the others.
            self.assertIn("the job finished at step %d" % steps, frozen.output())
            self.check_commits_agree(steps, others)
        for g in others:
            self.assertEqual(len(g.starts()), 1, "group %d was restarted:\n%s" % (g.group, g.failures()))
        self.assertTrue(any(c["healed"] for c in frozen.commits()[6:]), frozen.commits()[6:9])
        self.passed = True

    def test_the_quorum_waits_for_the_fewest_groups_that_may_train(self):
        # min 2 groups: one group alone commits nothing until a second one joins.
        steps = 6
        first = Group(self.work, 0, self.daemon.port, steps, min_groups=2, pause=0.0)
        self.groups.append(first)
        self.assertTrue(first.wait_until(lambda: "1 of the 2 replica groups needed" in first.output(), timeout=60),
                        first.output()[-3000:])
        self.assertEqual(first.commits(), [])
        self.groups.append(Group(self.work, 1, self.daemon.port, steps, min_groups=2, pause=0.0))
        for g in self.groups:
            self.assertEqual(g.wait(), 0, g.output()[-3000:])
        self.check_commits_agree(steps)
        self.passed = True

    def test_a_group_back_after_the_job_finished_learns_that_it_is_over(self):
        # Group 0 trains the whole job alone (min 1 group) and finishes: its agent records the end.
        # A group that comes later (back from a restart, or started late) has nobody to heal from:
        # it is told that the job is over instead of waiting for a quorum until its timeout, and
        # its ddprun exits 0 without restarting it. A Python worker leaves (ddprun_ft.JobFinished,
        # a SystemExit of status 0); a C++ one that does not catch ft::JobFinished dies of it, and
        # its agent says so and does not restart it either.
        steps = 8
        first = Group(self.work, 0, self.daemon.port, steps, min_groups=1, pause=0.0, join_timeout=2)
        self.groups.append(first)
        self.assertEqual(first.wait(), 0, first.output()[-3000:])
        self.assertIn("the job finished at step %d (replica group 0" % steps, first.output())
        self.assertIn("recorded for groups that come back later", first.output())
        self.assertEqual(first.commits()[-1]["step"], steps)
        for g, lang in [(1, "python"), (2, "c++")]:
            if lang == "c++" and not CPP_WORKER:
                continue
            late = Group(self.work, g, self.daemon.port, steps, min_groups=1, pause=0.0, join_timeout=2, lang=lang)
            self.groups.append(late)
            started = time.monotonic()
            self.assertEqual(late.wait(timeout=60), 0, late.output()[-3000:])
            self.assertLess(time.monotonic() - started, 50, "the late group waited for a quorum")
            out = late.output()
            self.assertIn("replica group %d: the job finished at step %d (replica group 0" % (g, steps), out)
            self.assertEqual(late.commits(), [], "a late group trained alone from scratch")
            self.assertEqual(len(late.starts()), 1, "the late group was restarted:\n" + out[-3000:])
            if lang == "c++":
                self.assertIn("not restarting them", out)
        self.passed = True

    def test_on_a_protected_daemon_the_jobs_token_serves_its_replica_groups(self):
        # A daemon with a cluster secret; the job's agents hold only the job's token (what
        # `ddprun-rendezvous token` gives a user), which covers each group's own world
        # (ftjob.rg<N>) as well as the job's quorum, and nothing else.
        secret = os.path.join(self.work, "cluster.secret")
        with open(os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write("0123456789abcdef0123456789abcdef")
        token = os.path.join(self.work, "ftjob.token")
        subprocess.run([DAEMON, "token", "--token-file", secret, "--rdzv_id", "ftjob", "--output", token], check=True)
        self.daemon.stop()
        self.daemon = Daemon(DAEMON, ["--token-file", secret])
        steps = 6
        for g in range(2):
            self.groups.append(Group(self.work, g, self.daemon.port, steps, min_groups=2, pause=0.0, token=token))
        for g in self.groups:
            self.assertEqual(g.wait(), 0, g.output()[-3000:])
        self.check_commits_agree(steps)
        # `ddprun-rendezvous status` shows the job's quorum (not its keys as odd ones) and its end.
        status = json.loads(subprocess.run([DAEMON, "status", "--endpoint", "127.0.0.1:%d" % self.daemon.port,
                                            "--token-file", secret], check=True, capture_output=True,
                                           text=True).stdout)
        self.assertNotIn("skipped", status)
        [job] = status["fault_tolerant_jobs"]
        self.assertEqual((job["run_id"], job["state"], job["finished"]["step"]), ("ftjob", "finished", steps))
        # (The groups' own worlds are jobs of their own, forgotten by the daemon once every node left.)
        self.assertEqual([g["world"] for g in job["groups"]], ["ftjob.rg0", "ftjob.rg1"])
        # Another job's token is refused, and says which job it is for.
        other = os.path.join(self.work, "other.token")
        subprocess.run([DAEMON, "token", "--token-file", secret, "--rdzv_id", "other", "--output", other], check=True)
        stranger = Group(self.work, 2, self.daemon.port, steps, min_groups=2, pause=0.0, token=other)
        self.groups.append(stranger)
        self.assertNotEqual(stranger.wait(timeout=60), 0)
        self.assertIn("is for job 'other', not 'ftjob", stranger.output())
        self.passed = True

    def test_the_examples_heal_a_killed_group_and_train_every_sample_of_an_epoch_once(self):
        # examples/python/fashion_mnist_ddp.py --fault-tolerant as group 0 and its C++ twin,
        # examples/fashion_mnist_lenet --fault-tolerant, as group 1 (both Python when the C++ one
        # is not built), one rank each, at least two training, with the command the docs give (the
        # host known by its name). Group 1's node fails: its ddprun is SIGKILLed (its guard kills
        # the worker) and the same command is run again, as a scheduler restarts a pod. The
        # survivor waits (its process kept) while the group comes back, then the group heals from
        # it (across the languages) and both finish the epochs on the same parameters, having
        # drawn the same samples.
        import torch  # the test's interpreter is the workers' (DDPRUN_TORCH_PYTHON)
        train_limit, batch, epochs = 2000, 25, 2
        logs = [os.path.join(self.work, "commits%d.log" % g) for g in range(2)]
        for path in logs:  # a line torn by a SIGKILL: the example ends it before its own
            with open(path, "w") as f:
                f.write('{"step": 12, "gro')
        for g, example in enumerate(EXAMPLES):
            program = [example, "--fault-tolerant", "--epochs", str(epochs), "--train-limit", str(train_limit),
                       "--test-limit", "1000", "--batch-size", str(batch), "--commit-log", logs[g]]
            self.groups.append(Group(self.work, g, self.daemon.port, 0, min_groups=2, program=program))
        victim = self.groups[1]
        self.assertTrue(victim.wait_until(lambda: len(read_log(logs[1])) >= 10, timeout=120),
                        "group 1 never committed 10 steps:\n" + victim.output()[-4000:])
        victim.kill()
        rerun = Group(self.work, 1, self.daemon.port, 0, min_groups=2, program=victim.program, suffix="rerun")
        self.groups[1] = rerun
        self.groups.append(victim)  # its output, for a look; torn down with the others
        for g in self.groups[:2]:
            self.assertEqual(g.wait(timeout=300), 0, "group %d:\n%s" % (g.group, g.output()[-4000:]))
        commits = [read_log(path) for path in logs]
        # The survivor committed every step, in one process.
        self.assertEqual([c["step"] for c in commits[0]], list(range(1, len(commits[0]) + 1)))
        self.assertEqual(len({c["pid"] for c in commits[0]}), 1, "the survivor was restarted")
        # The victim: two processes; the second's first commit came right after healing, at the
        # survivor's step, with its parameters; from there on both hold the same ones.
        pids = sorted({c["pid"] for c in commits[1]}, key=[c["pid"] for c in commits[1]].index)
        self.assertEqual(len(pids), 2, commits[1][-1])
        after = [c for c in commits[1] if c["pid"] == pids[1]]
        self.assertTrue(after[0]["healed"], after[0])
        self.assertGreaterEqual(after[0]["step"], 10)
        survivor_at = {c["step"]: c for c in commits[0]}
        for c in commits[1]:
            self.assertEqual(c["hash"], survivor_at[c["step"]]["hash"], "step %d" % c["step"])
            self.assertEqual((c["epoch"], c["first"]), (survivor_at[c["step"]]["epoch"],
                                                        survivor_at[c["step"]]["first"]))
        self.assertEqual(commits[0][-1]["hash"], commits[1][-1]["hash"])
        # Every sample of an epoch once: the committed steps' slices of the epoch's permutation
        # follow one another from 0 and stop only short of a step's worth at the end.
        by_epoch = collections.defaultdict(list)
        for c in commits[0]:
            by_epoch[c["epoch"]].append(c)
        self.assertEqual(sorted(by_epoch), list(range(epochs)))
        for epoch, steps in by_epoch.items():
            cursor = 0
            for c in steps:
                self.assertEqual(c["first"], cursor, "epoch %d step %d" % (epoch, c["step"]))
                cursor += c["samples"]
            self.assertLess(train_limit - cursor, 2 * batch, "epoch %d left samples untrained" % epoch)
            # And each rank trained on its own slice of the seeded permutation (a healing group on none).
            order = torch.randperm(train_limit, generator=torch.Generator().manual_seed(epoch)).tolist()
            for c in [c for log in commits for c in log if c["epoch"] == epoch]:
                if c["healed"]:
                    self.assertEqual(c["indices"], [])
                else:
                    first = c["first"] + c["participant_rank"] * batch
                    self.assertEqual(c["indices"], order[first:first + batch], "group %d step %d" % (c["group"], c["step"]))
        # Both groups end with the same model, which learned.
        results = []
        for g in self.groups[:2]:
            with open(g.out_path) as f:
                lines = [line for line in f if '"fault_tolerant"' in line]
            self.assertTrue(lines, "group %d printed no result:\n%s" % (g.group, g.output()[-3000:]))
            results.append(json.loads(lines[-1][lines[-1].index("{"):]))
        print("results: %s" % results, file=sys.stderr)
        # The same parameters; the two languages score the test set in batches of other sizes.
        self.assertAlmostEqual(results[0]["test_accuracy"], results[1]["test_accuracy"], delta=0.002)
        self.assertEqual(results[0]["committed_steps"], results[1]["committed_steps"])
        self.assertGreaterEqual(results[1]["healed"], 1, "the restarted group says it never healed")
        self.assertGreater(results[0]["test_accuracy"], 0.6, results[0])
        self.passed = True


def ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


class Partition(GroupsTest):
    """Replica groups on two hosts: network namespaces A (10.213.9.1: the daemon, groups 0 and 1)
    and B (10.213.9.2: group 2) joined by a veth pair; B is cut off by an nftables table that drops
    every packet in and out (silence, as when a link fails: no reset, no error). Needs root,
    iproute2 and nftables (skipped otherwise); ctest runs it as netns.ft_partition."""

    A, B = "10.213.9.1", "10.213.9.2"

    def setUp(self):
        if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("nft"):
            self.skipTest("needs root, iproute2 and nftables (network namespaces)")
        self.ns = ["ddprun_fa_%d" % os.getpid(), "ddprun_fb_%d" % os.getpid()]
        if ip("netns", "add", self.ns[0], check=False).returncode != 0:
            self.skipTest("cannot create network namespaces here")
        ip("netns", "add", self.ns[1])
        veth = ["fa%d" % os.getpid(), "fb%d" % os.getpid()]
        ip("link", "add", veth[0], "netns", self.ns[0], "type", "veth", "peer", "name", veth[1], "netns", self.ns[1])
        for ns, dev, addr in zip(self.ns, veth, (self.A, self.B)):
            ip("-n", ns, "addr", "add", addr + "/24", "dev", dev)
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "link", "set", dev, "up")
        self.work = tempfile.mkdtemp(prefix="ddprun_ft_partition_")
        self.groups = []
        self.passed = False
        self.token = os.path.join(self.work, "secret")  # the daemon listens on a network: it needs one
        with open(os.open(self.token, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(os.urandom(32).hex())
        self.daemon = Daemon(DAEMON, ["--token-file", self.token], host=self.A, prefix=self.on(0))

    def tearDown(self):
        super().tearDown()
        for ns in self.ns:
            ip("netns", "del", ns, check=False)

    def on(self, host):
        return ("ip", "netns", "exec", self.ns[host])

    def cut(self):
        rules = ('table inet partition {\n'
                 '  chain in { type filter hook input priority 0; policy drop; iif "lo" accept; }\n'
                 '  chain out { type filter hook output priority 0; policy drop; oif "lo" accept; }\n}\n')
        subprocess.run([*self.on(1), "nft", "-f", "-"], input=rules.encode(), check=True)

    def mend(self):
        subprocess.run([*self.on(1), "nft", "delete", "table", "inet", "partition"], check=True)

    def test_only_the_side_with_the_quorum_commits_and_the_cut_off_group_heals_after(self):
        steps, hold = 40, 30
        for g, host in enumerate((0, 0, 1)):
            # The agents' keep-alive window (60 s) outlasts the cut: a node cut off for 3/4 of it
            # has its workers stopped by its guard (fenced), as something may take its place. The
            # guard counts from the last heartbeat that got through, up to an interval (5 s) before
            # the cut: with a 40 s window (fenced at 30 s) a 25 s cut fenced group 2 one run in six,
            # just before the mend (guard at 09:51:45.100, store reached again at .319).
            self.groups.append(Group(self.work, g, self.daemon.port, steps, hold=hold, host=(self.A, self.B)[host],
                                     daemon_host=self.A, prefix=self.on(host), token=self.token,
                                     conf="store_reconnect_timeout=60,keep_alive_interval=5,keep_alive_max_attempt=12"))
        a0, cut_off = self.groups[0], self.groups[2]
        self.assertTrue(cut_off.wait_until(lambda: len(cut_off.commits()) >= 5, timeout=120),
                        "group 2 never committed 5 steps:\n" + cut_off.output()[-4000:])
        self.cut()
        cut_at = time.monotonic()
        committed_at_cut = len(cut_off.commits())
        a_at_cut = len(a0.commits())

        def a_trained_on():
            return len([c for c in a0.commits()[a_at_cut:] if 2 not in c["groups"]]) >= 5

        self.assertTrue(a0.wait_until(a_trained_on, timeout=120),
                        "the side holding the quorum did not train on without group 2:\n" + a0.output()[-4000:])
        # Cut off, group 2 commits nothing past the step it was in (the last messages of that
        # step's all-reduce may have reached it before the cut).
        during = cut_off.commits()[committed_at_cut:]
        self.assertLessEqual(len(during), 1, "group 2 committed while it was cut off: %s" % during)
        # Cut off for longer than the workers' own timeout (20 s), within the agents' reconnect
        # window (store_reconnect_timeout=60).
        time.sleep(max(0.0, cut_at + 25 - time.monotonic()))  # sleep override: the partition's length
        self.mend()
        mended = len(cut_off.output())

        def back():
            healed = [c for c in cut_off.commits()[committed_at_cut:] if c["healed"]]
            return bool(healed) or "1 of the 2 replica groups needed have asked" in cut_off.output()[mended:]

        self.assertTrue(cut_off.wait_until(back, timeout=180),
                        "group 2 did not come back after the partition:\n" + cut_off.output()[-4000:])
        with open(os.path.join(self.work, "release"), "w"):
            pass
        for g in self.groups:
            self.assertEqual(g.wait(timeout=180), 0, "group %d:\n%s" % (g.group, g.output()[-4000:]))
        self.check_commits_agree(steps)
        for g in self.groups[:2]:
            self.assertEqual(len(g.starts()), 1,
                             "group %d (on the side with the quorum) was restarted:\n%s" % (g.group, g.failures()))
        # The partition was shorter than the agents' store_reconnect_timeout (30 s): group 2's worker
        # waited for its quorum through it, as its agent did, and was not restarted.
        self.assertEqual(len(cut_off.starts()), 1, "group 2 was restarted:\n" + cut_off.failures())
        # Both sides said what happened, in one line each.
        self.assertIn("without group 2: group 2 sent no heartbeat within quorum_heartbeat_timeout", a0.output())
        self.assertRegex(cut_off.output(), r"this group was out of quorum\(s\) \d+\.\.\d+; this group is at step "
                                           r"\d+ and heals from group [01]")
        after = cut_off.commits()[committed_at_cut + len(during):]
        self.assertTrue(after and after[0]["healed"], "group 2's first commit after the partition: %s" % after[:1])
        self.passed = True


if __name__ == "__main__":
    DDPRUN, DAEMON = sys.argv[1], sys.argv[2]
    while len(sys.argv) > 3 and os.path.isfile(sys.argv[3]):  # programs, then tests' names
        program = sys.argv.pop(3)
        if os.path.basename(program) == "fashion_mnist_lenet":
            CPP_EXAMPLE = program
        else:
            CPP_WORKER = program
    # The example test's two groups: DDPRUN_FT_EXAMPLES=python,c++ (the default), c++,c++ (both
    # on a GPU when there is one: scripts/gpu_check.sh) or python,python.
    EXAMPLES = [EXAMPLE if lang == "python" or not CPP_EXAMPLE else CPP_EXAMPLE
                for lang in os.environ.get("DDPRUN_FT_EXAMPLES", "python,c++").split(",")]
    del sys.argv[1:3]
    result = unittest.main(verbosity=2, exit=False).result
    if not result.wasSuccessful():
        sys.exit(1)
    # Every case skipped (no namespaces here, say): 77, which ctest reports as skipped, not passed.
    sys.exit(77 if result.testsRun and len(result.skipped) == result.testsRun else 0)
