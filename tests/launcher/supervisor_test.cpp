// The Supervisor (launcher/workers/supervisor) on its own, in this process, with real child
// processes (/bin/sh): what a group's end is, which worker is the root cause, who was stopped,
// what a stop request or a stop signal does, and what a worker that cannot start does. Outcomes
// and records are checked, never sentences.
#include "launcher/workers/supervisor.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <mutex>
#include <fstream>
#include <future>
#include <iterator>
#include <thread>

#include "common/log.hpp"
#include "launcher/workers/process.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/wait_until.hpp"

namespace ddprun::launcher {

using workers::GroupOutcome;
using workers::GroupResult;
using workers::lost_a_peer;
using workers::shell_exit_code;
using workers::Supervisor;
using workers::SupervisorSettings;
using workers::WorkerExit;
using workers::WorkerLaunch;
namespace {

using namespace std::chrono_literals;

WorkerLaunch shell(int rank, const std::string& script) {
  WorkerLaunch w;
  w.rank = w.local_rank = rank;
  w.request.argv = {"/bin/sh", "-c", script};
  w.request.envp = {"PATH=/usr/bin:/bin"};
  w.prefix = "[rank" + std::to_string(rank) + "]: ";
  w.stdout_to_console = w.stderr_to_console = false;
  return w;
}

SupervisorSettings settings() {
  SupervisorSettings s;
  s.shutdown_grace = 5s;
  s.host = "host-a";
  s.stop_signal_hold = 200ms;
  return s;
}

bool has(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

TEST(SupervisorTest, AGroupWhoseWorkersAllExitZeroSucceeds) {
  Supervisor s(settings(), nullptr);
  std::vector<pid_t> pids;
  const GroupResult r = s.run({shell(0, "exit 0"), shell(1, "exit 0")}, [&](const auto& p) { pids = p; });
  EXPECT_EQ(r.outcome, GroupOutcome::Succeeded);
  EXPECT_TRUE(r.failures.empty());
  ASSERT_EQ(r.exits.size(), 2u);
  ASSERT_EQ(pids.size(), 2u);
  EXPECT_GT(pids[0], 0);
  EXPECT_GT(pids[1], 0);
  for (const WorkerExit& e : r.exits) EXPECT_EQ(e.exit_code, 0);
}

TEST(SupervisorTest, TheFirstFailureIsTheRootCauseAndTheOthersAreStopped) {
  Supervisor s(settings(), nullptr);
  const GroupResult r =
      s.run({shell(0, "exec sleep 60"), shell(1, "echo 'bad shard 7' >&2; exit 3"), shell(2, "exec sleep 60")});
  EXPECT_EQ(r.outcome, GroupOutcome::Failed);
  ASSERT_FALSE(r.failures.empty());
  const WorkerExit& root = r.failures.front();
  EXPECT_EQ(root.rank, 1);
  EXPECT_EQ(root.exit_code, 3);
  EXPECT_EQ(root.signal, 0);
  EXPECT_EQ(root.host, "host-a");
  ASSERT_FALSE(root.stderr_tail.empty());
  EXPECT_EQ(root.stderr_tail.back(), "bad shard 7");
  EXPECT_TRUE(has(r.stopped_ranks, 0));
  EXPECT_TRUE(has(r.stopped_ranks, 2));
  EXPECT_FALSE(has(r.stopped_ranks, 1));
}

// Rank 1 fails; rank 0's collective breaks on the closed connection and rank 0 ends first, while
// rank 1 is still on its way out (an interpreter tearing down): rank 1 is the root cause.
TEST(SupervisorTest, ARankThatLostItsPeerIsNotTheRootCauseWhenThePeerFailsJustAfter) {
  Supervisor s(settings(), nullptr);
  const GroupResult r =
      s.run({shell(0,
                   "echo 'RuntimeError: [../gloo/transport/tcp/pair.cc:598] Connection closed by peer "
                   "[127.0.0.1]:14559' >&2; exit 1"),
             shell(1, "sleep 0.1; echo 'shard 3 is corrupt' >&2; exit 7"), shell(2, "exec sleep 60")});
  EXPECT_EQ(r.outcome, GroupOutcome::Failed);
  ASSERT_EQ(r.failures.size(), 2u);
  EXPECT_EQ(r.failures[0].rank, 1);
  EXPECT_EQ(r.failures[0].exit_code, 7);
  EXPECT_EQ(r.failures[1].rank, 0);
  EXPECT_TRUE(has(r.stopped_ranks, 2));
}

// A failure that is its rank's own (an exit with its own error, its stderr read to the end, no
// stop signal, no lost peer) is the verdict at once: the hold is for what may still come, and
// nothing can. Here the hold is far longer than the test waits.
GroupResult run_with_a_long_hold(const std::vector<WorkerLaunch>& group) {
  SupervisorSettings long_hold = settings();
  long_hold.stop_signal_hold = 300s;
  auto run = std::async(std::launch::async, [&] { return Supervisor(long_hold, nullptr).run(group); });
  if (run.wait_for(120s) != std::future_status::ready) {
    ADD_FAILURE() << "the group's end waited for the hold";
  }
  return run.get();
}

TEST(SupervisorTest, AFailureKnownToBeItsRanksOwnStopsTheOthersWithoutWaitingForTheHold) {
  const GroupResult r = run_with_a_long_hold({shell(0, "exec sleep 600"), shell(1, "echo 'bad shard 7' >&2; exit 3")});
  EXPECT_EQ(r.outcome, GroupOutcome::Failed);
  ASSERT_FALSE(r.failures.empty());
  EXPECT_EQ(r.failures.front().rank, 1);
  EXPECT_TRUE(has(r.stopped_ranks, 0));
}

// A rank that lost its peer is held; the peer's own failure ends the hold, and comes first.
TEST(SupervisorTest, ALostPeerIsHeldUntilThePeersOwnFailureArrives) {
  const GroupResult r =
      run_with_a_long_hold({shell(0, "echo 'RuntimeError: Connection closed by peer [127.0.0.1]:14559' >&2; exit 1"),
                            shell(1, "sleep 0.5; echo 'shard 3 is corrupt' >&2; exit 7"), shell(2, "exec sleep 600")});
  EXPECT_EQ(r.outcome, GroupOutcome::Failed);
  ASSERT_EQ(r.failures.size(), 2u);
  EXPECT_EQ(r.failures[0].rank, 1);
  EXPECT_EQ(r.failures[1].rank, 0);
  EXPECT_TRUE(has(r.stopped_ranks, 2));
}

// A failure known at once, of a worker whose pipes closed before it exited, ends its group while
// the group's reaping is still under way; nothing of that group may act on the next one the same
// Supervisor runs (a timer armed after the end once closed the next group's pipes: a restarted
// worker's output was lost).
TEST(SupervisorTest, NothingOfAGroupActsOnTheNextOne) {
  test::TempDir dir;
  Supervisor s(settings(), nullptr);
  const GroupResult first = s.run({shell(0, "exec >&- 2>&-; sleep 0.3; exit 3")});
  EXPECT_EQ(first.outcome, GroupOutcome::Failed);
  WorkerLaunch next = shell(0, "sleep 3; echo 'heard after the restart'");
  next.stdout_file = (dir.path / "out.log").string();
  const GroupResult second = s.run({next});
  EXPECT_EQ(second.outcome, GroupOutcome::Succeeded);
  std::ifstream in(dir.path / "out.log");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("heard after the restart"), std::string::npos) << text;
}

TEST(SupervisorTest, AWorkerKilledByASignalIsReportedWithThatSignal) {
  Supervisor s(settings(), nullptr);
  const GroupResult r = s.run({shell(0, "ulimit -c 0; kill -SEGV $$"), shell(1, "exec sleep 60")});
  EXPECT_EQ(r.outcome, GroupOutcome::Failed);
  ASSERT_FALSE(r.failures.empty());
  EXPECT_EQ(r.failures.front().rank, 0);
  EXPECT_EQ(r.failures.front().signal, SIGSEGV);
  EXPECT_EQ(shell_exit_code(r.failures.front()), 128 + SIGSEGV);
}

TEST(SupervisorTest, AWorkerThatCannotStartFailsTheGroupAndIsNamed) {
  Supervisor s(settings(), nullptr);
  WorkerLaunch missing = shell(1, "");
  missing.request.argv = {"/nonexistent/train_bin"};
  std::vector<pid_t> pids;
  const GroupResult r = s.run({shell(0, "exec sleep 60"), missing}, [&](const auto& p) { pids = p; });
  EXPECT_EQ(r.outcome, GroupOutcome::Failed);
  ASSERT_FALSE(r.failures.empty());
  EXPECT_EQ(r.failures.front().rank, 1);
  EXPECT_TRUE(has(r.stopped_ranks, 0));
  ASSERT_EQ(pids.size(), 2u);
  EXPECT_EQ(pids[1], -1);
}

TEST(SupervisorTest, ARequestToStopEndsTheGroupAsStoppedByRequest) {
  Supervisor s(settings(), nullptr);
  auto run = std::async(std::launch::async, [&] {
    return s.run({shell(0, "exec sleep 60"), shell(1, "exec sleep 60")});
  });
  ASSERT_TRUE(test::wait_until([&] { return s.group_running(); }, 10s));
  s.request_stop("node 1 failed");
  ASSERT_EQ(run.wait_for(10s), std::future_status::ready);
  const GroupResult r = run.get();
  EXPECT_EQ(r.outcome, GroupOutcome::StoppedByRequest);
  EXPECT_TRUE(r.failures.empty());
  EXPECT_TRUE(has(r.stopped_ranks, 0));
  EXPECT_TRUE(has(r.stopped_ranks, 1));
}

// A round's end decided elsewhere (a lost node, another node's failure) ends a hold at once: the
// rank that lost its peer there waits for nothing more. (Each lost node cost its survivors the
// hold's second before they went on to the next round.)
TEST(SupervisorTest, ARequestToStopEndsAHeldFailureAtOnce) {
  SupervisorSettings long_hold = settings();
  long_hold.stop_signal_hold = 300s;
  Supervisor s(long_hold, nullptr);
  std::mutex mutex;
  std::vector<pid_t> pids;
  auto run = std::async(std::launch::async, [&] {
    return s.run({shell(0, "echo 'RuntimeError: Connection closed by peer [127.0.0.1]:14559' >&2; exit 1"),
                  shell(1, "exec sleep 600")},
                 [&](const auto& started) {
                   std::lock_guard lock(mutex);
                   pids = started;
                 });
  });
  // Rank 0 has ended and been reaped: its failure is held (the group still runs).
  ASSERT_TRUE(test::wait_until(
      [&] {
        std::lock_guard lock(mutex);
        return !pids.empty() && ::kill(pids[0], 0) != 0;
      },
      10s));
  ASSERT_TRUE(s.group_running());
  s.request_stop("node 1 (host-b) sent no heartbeat for 600ms");
  ASSERT_EQ(run.wait_for(30s), std::future_status::ready) << "the request waited for the hold";
  const GroupResult r = run.get();
  EXPECT_EQ(r.outcome, GroupOutcome::StoppedByRequest);
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_EQ(r.failures[0].rank, 0);
  EXPECT_TRUE(has(r.stopped_ranks, 1));
}

TEST(SupervisorTest, AStopSignalStopsEveryWorkerAndIsRemembered) {
  Supervisor s(settings(), nullptr);
  auto run = std::async(std::launch::async, [&] {
    return s.run({shell(0, "exec sleep 60"), shell(1, "exec sleep 60")});
  });
  ASSERT_TRUE(test::wait_until([&] { return s.group_running(); }, 10s));
  s.deliver_signal(SIGTERM);
  ASSERT_EQ(run.wait_for(10s), std::future_status::ready);
  const GroupResult r = run.get();
  EXPECT_EQ(r.outcome, GroupOutcome::Signalled);
  EXPECT_EQ(r.signal, SIGTERM);
  EXPECT_TRUE(r.failures.empty());
  EXPECT_TRUE(s.stop_signal_received());
  // The job must not go on: a later run starts no worker.
  std::vector<pid_t> pids;
  const GroupResult again = s.run({shell(0, "exit 0")}, [&](const auto& p) { pids = p; });
  EXPECT_EQ(again.outcome, GroupOutcome::Signalled);
  for (pid_t p : pids) EXPECT_EQ(p, -1);
}

TEST(SupervisorTest, AWorkerThatIgnoresSigtermIsKilledAfterTheGrace) {
  SupervisorSettings st = settings();
  st.shutdown_grace = 300ms;
  Supervisor s(st, nullptr);
  // Rank 1 fails once rank 0 ignores SIGTERM (its sleeps inherit that).
  test::TempDir dir;
  const std::string ignoring = dir.str() + "/ignoring";
  auto run = std::async(std::launch::async, [&] {
    return s.run({shell(0, "trap '' TERM; touch " + ignoring + "; while :; do sleep 0.05; done"),
                  shell(1, "while [ ! -e " + ignoring + " ]; do sleep 0.01; done; exit 4")});
  });
  ASSERT_EQ(run.wait_for(20s), std::future_status::ready);
  const GroupResult r = run.get();
  EXPECT_EQ(r.outcome, GroupOutcome::Failed);
  EXPECT_EQ(r.failures.front().rank, 1);
  EXPECT_TRUE(has(r.stopped_ranks, 0));
  const auto rank0 = std::find_if(r.exits.begin(), r.exits.end(), [](const WorkerExit& e) { return e.rank == 0; });
  ASSERT_NE(rank0, r.exits.end());
  EXPECT_EQ(rank0->signal, SIGKILL);
}

std::vector<std::string>& logged() {
  static std::vector<std::string> lines;
  return lines;
}

// A node resumed from a freeze: its watcher read the round's end (this node counted as lost) and
// asked for a stop, and the guard had killed the worker meanwhile (its SIGKILL reaped only after
// the stop began). Before, the worker's end read as a stop of ddprun's own, and nothing said that
// the guard had fenced it (a CI run of FrozenNodeTest, resumed in that order).
TEST(SupervisorTest, AWorkerTheGuardKillsAfterAStopWasAskedIsSaidToBeStoppedByTheGuard) {
  workers::OrphanGuard guard;  // before the test's threads
  SupervisorSettings st = settings();
  st.shutdown_grace = 60s;  // the guard, not the grace's SIGKILL, ends the worker
  Supervisor s(st, &guard);
  static std::mutex log_mutex;
  logged().clear();
  log::set_sink([](std::string_view line) {
    std::lock_guard lock(log_mutex);
    logged().emplace_back(line);
  });
  auto run = std::async(std::launch::async, [&] { return s.run({shell(0, "trap '' TERM; exec sleep 60")}); });
  ASSERT_TRUE(test::wait_until([&] { return s.group_running(); }, 10s));
  s.request_stop("node 1 (host-a) sent no heartbeat for 3s");
  // The stop began (SIGTERM, which the worker ignores); then the fence lapses with no renewal.
  ASSERT_TRUE(test::wait_until([&] { return !s.group_running(); }, 10s));
  guard.arm_fence(std::chrono::milliseconds(200));
  const bool ended = run.wait_for(30s) == std::future_status::ready;
  log::set_sink(nullptr);
  ASSERT_TRUE(ended) << "the guard did not end the worker";
  const GroupResult r = run.get();
  EXPECT_EQ(r.outcome, GroupOutcome::StoppedByRequest);
  EXPECT_TRUE(r.failures.empty());
  EXPECT_TRUE(has(r.stopped_ranks, 0));
  ASSERT_EQ(r.exits.size(), 1u);
  EXPECT_EQ(r.exits[0].signal, SIGKILL);
  std::string all;
  for (const std::string& l : logged()) all += l + "\n";
  EXPECT_NE(all.find("ended with signal 9 (SIGKILL): stopped by this node's guard"), std::string::npos) << all;
  EXPECT_TRUE(guard.take_fenced().has_value());
}

// A rank whose collective broke on a lost peer says so in its stderr or its error file (Gloo,
// NCCL, a socket); the agent then waits for the keep-alives before blaming it.
TEST(WorkerExitTest, ALostPeerIsRecognisedInTheStderrTailOrTheErrorText) {
  WorkerExit e;
  EXPECT_FALSE(lost_a_peer(e));
  e.stderr_tail = {"Traceback (most recent call last):",
                   "RuntimeError: [./gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:48282"};
  EXPECT_TRUE(lost_a_peer(e));
  e.stderr_tail = {"RuntimeError: CUDA out of memory"};
  EXPECT_FALSE(lost_a_peer(e));
  e.error_text = "DistBackendError: NCCL error: remote process exited or there was a network error";
  EXPECT_TRUE(lost_a_peer(e));
  e.error_text = "ValueError: bad input";
  EXPECT_FALSE(lost_a_peer(e)) << "a rank's own error is its own";
  e.stderr_tail = {"BrokenPipeError: [Errno 32] Broken pipe"};
  EXPECT_TRUE(lost_a_peer(e));
}

}  // namespace
}  // namespace ddprun::launcher
