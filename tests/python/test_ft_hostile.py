"""Fault-tolerant replica groups beside a hostile local peer (tests/python/ft_hostile.py): a process
that reaches a group's worker store, which PyTorch's clients cannot authenticate, writes what it
likes there, and connects to the ranks' state servers. Nothing it writes may make a worker heal from
it (a Python worker would unpickle its bytes: code execution; a C++ one would load its model), and
it may not read a rank's model state nor hold up a heal. Real ddprun agents, a real daemon, real
PyTorch and C++ workers, as in test_fault_tolerance.py, whose helpers these cases use.

usage: /usr/bin/python3 test_ft_hostile.py PATH/TO/ddprun PATH/TO/ddprun-rendezvous [PATH/TO/ft_worker] [TEST...]
"""
import json
import os
import re
import signal
import subprocess
import sys
import unittest

import ft_hostile
import test_fault_tolerance as ft
from launched import Launched
from test_fault_tolerance import Group, GroupsTest

HOSTILE = os.path.join(ft.HERE, "ft_hostile.py")


def worker_store_port(group):
    """The port of the group's latest worker store (a new one each round), from its ddprun's log."""
    found = re.findall(r"MASTER_PORT=(\d+)", group.output())
    return int(found[-1]) if found else None


def has_asked(group, n=1):
    """Whether rank 0 of the group's latest round wrote its n-th ask."""
    port = worker_store_port(group)
    if port is None:
        return False
    try:
        store = ft_hostile.Store(port)
    except OSError:  # that round's store is gone: the log names the next one soon
        return False
    try:
        return "/ddprun_ft/ask/%d/0" % n in store.keys()
    except (OSError, EOFError):
        return False
    finally:
        store.c.close()


def threads_of(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"Threads:\s+(\d+)", f.read())[1])


class HostilePeer(GroupsTest):

    def job(self, name):
        """A directory of its own for one job of a case (its groups' logs, the hostile peer's files)."""
        work = os.path.join(self.work, name)
        os.makedirs(work)
        return work

    def hostile(self, *args):
        """ft_hostile.py, run to its end; its output."""
        done = subprocess.run([sys.executable, HOSTILE, *map(str, args)], capture_output=True, text=True, timeout=60)
        self.assertEqual(done.returncode, 0, done.stderr)
        return done.stdout

    def stranger(self, work):
        """The hostile peer's own state server: its "host:port#key", and the file its requests go to."""
        address, log = os.path.join(work, "stranger"), os.path.join(work, "stranger.log")
        proc = subprocess.Popen([sys.executable, HOSTILE, "serve", address, log, os.path.join(work, "PWNED")])
        self.addCleanup(lambda: (proc.kill(), proc.wait()))
        holder = Launched()
        holder.proc = proc
        self.assertTrue(holder.wait_until(lambda: os.path.exists(address), timeout=30), "the stranger did not start")
        with open(address) as f:
            return f.read(), log

    def requests_to(self, log):
        if not os.path.exists(log):
            return []
        with open(log) as f:
            return f.read().splitlines()

    def assert_never_healed_from(self, work, log):
        self.assertEqual(self.requests_to(log), [], "a worker fetched its state from the stranger")
        self.assertFalse(os.path.exists(os.path.join(work, "PWNED")), "a worker loaded the stranger's pickle")

    def test_injected_quorums_do_not_make_a_group_heal_from_a_stranger(self):
        # The stranger writes the next 40 quorum answers into a training group's worker store before
        # its agent does, each telling it to heal from the stranger's server: its workers wait for
        # their agent's own answers and train on as if nothing were there.
        for lang in ("python", "c++"):
            if lang == "c++" and not ft.CPP_WORKER:
                continue
            work, steps = self.job(lang), 40
            group = Group(work, 0, self.daemon.port, steps, min_groups=1, pause=0.1, lang=lang,
                          rdzv_id="quorums_" + lang.strip("+"))
            self.groups.append(group)
            self.assertTrue(group.wait_until(lambda: len(group.commits()) >= 3), group.output()[-3000:])
            address, log = self.stranger(work)
            self.hostile("quorums", worker_store_port(group), address, 40)
            group.wait_until(lambda: self.requests_to(log), timeout=60)
            self.assert_never_healed_from(work, log)
            self.assertEqual(group.wait(), 0, group.output()[-3000:])
            commits = group.commits()
            self.assertEqual([c["step"] for c in commits], list(range(1, steps + 1)), group.output()[-3000:])
            self.assertFalse(any(c["healed"] for c in commits), [c for c in commits if c["healed"]][:1])
        self.passed = True

    def test_the_worker_store_keeps_the_votes_of_the_last_quorums_only(self):
        # The agent erases each quorum's keys two quorums later, the ranks' votes as well: the
        # worker store does not fill up over a long job (its key limit would end it).
        work, steps = self.job("votes"), 12
        group = Group(work, 0, self.daemon.port, steps, min_groups=1, hold=8, rdzv_id="votes")
        self.groups.append(group)
        self.assertTrue(group.wait_until(lambda: len(group.commits()) >= 8), group.output()[-3000:])
        store = ft_hostile.Store(worker_store_port(group))
        votes = [k for k in store.keys() if k.startswith("/ddprun_ft/commit/")]
        store.c.close()
        self.assertLessEqual(len(votes), 3, votes)
        with open(os.path.join(work, "release"), "w"):
            pass
        self.assertEqual(group.wait(), 0, group.output()[-3000:])
        self.passed = True

    def test_an_injected_ask_does_not_make_another_group_heal_from_a_stranger(self):
        # Group 0 is held at step 6 (between two quorums) while group 1 starts and asks: group 1
        # must heal from group 0. The stranger writes group 0's next asks into its worker store, at
        # group 0's step and with the stranger's server as where group 0 serves its state. Group 0's
        # agent does not take them for its worker's: group 1 heals from group 0 itself, across the
        # languages both ways.
        for serving, healing in (("c++", "python"), ("python", "c++")) if ft.CPP_WORKER else (("python", "python"),):
            work, steps, held = self.job(serving.strip("+") + "_" + healing.strip("+")), 20, 6
            first = Group(work, 0, self.daemon.port, steps, min_groups=1, hold=held, lang=serving,
                          rdzv_id="asks_" + serving.strip("+"))
            self.groups.append(first)
            self.assertTrue(first.wait_until(lambda: len(first.commits()) >= held), first.output()[-3000:])
            late = Group(work, 1, self.daemon.port, steps, min_groups=1, lang=healing,
                         rdzv_id="asks_" + serving.strip("+"))
            self.groups.append(late)
            self.assertTrue(late.wait_until(lambda: has_asked(late), timeout=60), late.output()[-3000:])
            address, log = self.stranger(work)
            self.hostile("asks", worker_store_port(first), address, 40, 0)
            self.assertTrue(first.wait_until(lambda: self.requests_to(log) or "not its worker's" in first.output()),
                            first.output()[-3000:])
            self.assert_never_healed_from(work, log)
            with open(os.path.join(work, "release"), "w"):
                pass
            for g in (first, late):
                self.assertEqual(g.wait(), 0, "group %d:\n%s" % (g.group, g.output()[-3000:]))
            self.check_commits_agree(steps, groups=[first, late])
            self.assertTrue(late.commits()[0]["healed"], late.commits()[0])
            self.assertEqual(late.commits()[0]["step"], held + 1)
            self.assert_never_healed_from(work, log)
        self.passed = True

    def test_idle_and_slow_connections_to_a_state_server_do_not_hold_up_a_heal(self):
        # A stranger holds connections to group 0's state server open (200 that send nothing, one
        # that sends a header line a second) while group 1, killed, comes back and heals from it:
        # the heal goes through, and the connections cost a Python server no threads.
        for serving in ("c++", "python"):
            if serving == "c++" and not ft.CPP_WORKER:
                continue
            work, steps, held = self.job(serving.strip("+")), 20, 10
            name = "idle_" + serving.strip("+")
            source = Group(work, 0, self.daemon.port, steps, min_groups=1, hold=held, lang=serving, rdzv_id=name)
            victim = Group(work, 1, self.daemon.port, steps, min_groups=1, hold=held, rdzv_id=name)
            self.groups += [source, victim]
            self.assertTrue(victim.wait_until(lambda: len(victim.commits()) >= 4), victim.output()[-3000:])
            ready = os.path.join(work, "ready")
            threads = threads_of(source.starts()[0]["pid"])
            holder = subprocess.Popen([sys.executable, HOSTILE, "hold", str(worker_store_port(source)), ready, "200"])
            self.addCleanup(lambda p=holder: (p.kill(), p.wait()))
            self.assertTrue(source.wait_until(lambda: os.path.exists(ready), timeout=30),
                            "the stranger did not connect")
            os.kill(victim.starts()[0]["pid"], signal.SIGKILL)
            self.assertTrue(victim.wait_until(lambda: len(victim.starts()) >= 2 and has_asked(victim), timeout=60),
                            victim.output()[-3000:])
            with open(os.path.join(work, "release"), "w"):
                pass
            again = victim.starts()[1]["pid"]
            self.assertTrue(victim.wait_until(lambda: any(c["pid"] == again for c in victim.commits()), timeout=90),
                            "the restarted group did not heal while the stranger held its peer's state server:\n"
                            + victim.output()[-3000:])
            self.assertIsNone(holder.poll(), "the stranger's connections were not held")
            self.assertLess(threads_of(source.starts()[0]["pid"]) - threads, 20,
                            "the state server spent a thread on each of the stranger's connections")
            holder.kill()
            for g in (source, victim):
                self.assertEqual(g.wait(), 0, "group %d:\n%s" % (g.group, g.output()[-3000:]))
            self.check_commits_agree(steps, groups=[source, victim])
            self.assertTrue([c for c in victim.commits() if c["pid"] == again][0]["healed"])
        self.passed = True

    def test_a_state_server_gives_nothing_to_a_request_without_the_quorums_key(self):
        # Group 0 serves its first state to group 1 (every member heals from the first before the
        # first commit): asked without a proof of the key the quorum gave group 1 (or with a made-up
        # one), the server answers neither the state nor which step it serves.
        for serving in ("python", "c++"):
            if serving == "c++" and not ft.CPP_WORKER:
                continue
            work, steps, held = self.job(serving.strip("+")), 8, 3
            name = "probe_" + serving.strip("+")
            source = Group(work, 0, self.daemon.port, steps, hold=held, lang=serving, rdzv_id=name)
            peer = Group(work, 1, self.daemon.port, steps, hold=held, rdzv_id=name)
            self.groups += [source, peer]
            self.assertTrue(peer.wait_until(lambda: len(peer.commits()) >= held), peer.output()[-3000:])
            self.assertTrue(peer.commits()[0]["healed"], peer.commits()[0])
            answers = [json.loads(line) for line in self.hostile("probe", worker_store_port(source)).splitlines()]
            for a in answers:
                self.assertEqual(a["status"], 403, a)
                self.assertLess(a["bytes"], 200, a)
                self.assertNotIn("step", a["body"], a)
            with open(os.path.join(work, "release"), "w"):
                pass
            for g in (source, peer):
                self.assertEqual(g.wait(), 0, "group %d:\n%s" % (g.group, g.output()[-3000:]))
        self.passed = True


if __name__ == "__main__":
    ft.DDPRUN, ft.DAEMON = sys.argv[1], sys.argv[2]
    if len(sys.argv) > 3 and os.path.isfile(sys.argv[3]):
        ft.CPP_WORKER = sys.argv.pop(3)
    del sys.argv[1:3]
    result = unittest.main(verbosity=2, exit=False).result
    sys.exit(0 if result.wasSuccessful() else 1)
