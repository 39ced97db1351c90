// The restart policy (launcher/agent/restart_policy.hpp): what a round's end makes the agent do.
#include "launcher/agent/restart_policy.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <vector>

#include "launcher/workers/worker_exit.hpp"

namespace ddprun::launcher {

using agent::decide;
using agent::Decision;
using agent::kHangExitCode;
using agent::RestartState;
using rendezvous::RoundEnd;
using workers::WorkerExit;
namespace {

RoundEnd end_of(RoundEnd::Kind kind) {
  RoundEnd e;
  e.kind = kind;
  return e;
}

RoundEnd failure(int exit_code, int signal = 0) {
  RoundEnd e = end_of(RoundEnd::Kind::Failure);
  WorkerExit w;
  w.rank = 3;
  w.exit_code = exit_code;
  w.signal = signal;
  e.root_cause = w;
  return e;
}

constexpr Decision kRestart{Decision::Kind::Restart, 0};
constexpr Decision kRerendezvous{Decision::Kind::Rerendezvous, 0};
constexpr Decision finish(int code, Decision::Why why = Decision::Why::Ended) {
  return {Decision::Kind::Finish, code, why};
}
constexpr auto kNoRestartsLeft = Decision::Why::NoRestartsLeft;
constexpr auto kStopping = Decision::Why::Stopping;
constexpr auto kUnkillable = Decision::Why::Unkillable;
constexpr auto kDoNotRestart = Decision::Why::DoNotRestart;

TEST(RestartPolicyTest, SuccessFinishesWithZeroWhateverTheRestartsLeft) {
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::Success), {.restarts = 0, .max_restarts = 3}), finish(0));
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::Success), {.stop_signal = SIGTERM}), finish(0));
}

TEST(RestartPolicyTest, AFailureRestartsWhileRestartsAreLeftThenExitsAsTheRootCauseDid) {
  EXPECT_EQ(decide(failure(3), {.restarts = 0, .max_restarts = 2}), kRestart);
  EXPECT_EQ(decide(failure(3), {.restarts = 1, .max_restarts = 2}), kRestart);
  EXPECT_EQ(decide(failure(3), {.restarts = 2, .max_restarts = 2}), finish(3, kNoRestartsLeft));
  EXPECT_EQ(decide(failure(0, SIGSEGV), {.max_restarts = 0}), finish(128 + SIGSEGV, kNoRestartsLeft));
  // A failure whose root cause did not travel (an older peer) still fails the job.
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::Failure), {}), finish(1, kNoRestartsLeft));
}

// --no_restart_exit_codes: the root cause's exit code, not a signal's number, and not a hang.
TEST(RestartPolicyTest, ARootCauseWhoseExitCodeMeansDoNotRestartEndsTheJobWithRestartsLeft) {
  const std::vector<int> codes{93, 17};
  EXPECT_EQ(decide(failure(93), {.max_restarts = 5, .no_restart_exit_codes = codes}), finish(93, kDoNotRestart));
  EXPECT_EQ(decide(failure(17), {.restarts = 2, .max_restarts = 5, .no_restart_exit_codes = codes}),
            finish(17, kDoNotRestart));
  EXPECT_EQ(decide(failure(3), {.max_restarts = 5, .no_restart_exit_codes = codes}), kRestart);
  EXPECT_EQ(decide(failure(0, 17), {.max_restarts = 5, .no_restart_exit_codes = codes}), kRestart);
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::Hang), {.max_restarts = 5, .no_restart_exit_codes = codes}), kRestart);
  EXPECT_EQ(decide(failure(93), {.max_restarts = 5}), kRestart) << "no codes: 93 is a failure like any other";
}

TEST(RestartPolicyTest, TheConsoleSaysWhatKeptAFailureFromARestart) {
  using agent::not_restarted_text;
  EXPECT_EQ(not_restarted_text(failure(3), kNoRestartsLeft, 2), "giving up after 2 restart(s)");
  EXPECT_EQ(not_restarted_text(failure(3), kNoRestartsLeft, 0), "") << "no restarts were asked for";
  EXPECT_EQ(not_restarted_text(failure(93), kDoNotRestart, 5),
            "not restarting: rank 3 exited with 93, which means \"do not restart\" (--no_restart_exit_codes)");
  EXPECT_EQ(not_restarted_text(failure(3), kStopping, 5), "");
  EXPECT_EQ(not_restarted_text(end_of(RoundEnd::Kind::Success), Decision::Why::Ended, 5), "");
}

TEST(RestartPolicyTest, AStopSignalNeverRestarts) {
  EXPECT_EQ(decide(failure(3), {.restarts = 0, .max_restarts = 5, .stop_signal = SIGTERM}), finish(3, kStopping));
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::Hang), {.max_restarts = 5, .stop_signal = SIGINT}),
            finish(kHangExitCode, kStopping));
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::Membership), {.elastic = true, .stop_signal = SIGINT}),
            finish(128 + SIGINT, kStopping));
  // A stopped node leaves with 128 + N, the lost node being itself or another.
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::NodeLost), {.elastic = true, .stop_signal = SIGTERM}),
            finish(128 + SIGTERM, kStopping));
  // A stop signal and workers that could not be stopped: the signal is the reason.
  EXPECT_EQ(decide(failure(3), {.max_restarts = 5, .stop_signal = SIGTERM, .unkillable = true}), finish(3, kStopping));
}

TEST(RestartPolicyTest, ASignalEndExitsWithTheSignalThatStoppedUsOrTheGroupOrSigterm) {
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::Signal), {.stop_signal = SIGINT, .group_signal = SIGTERM}),
            finish(128 + SIGINT));
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::Signal), {.group_signal = SIGHUP}), finish(128 + SIGHUP));
  // Another node's signal ended the round: this node saw none.
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::Signal), {}), finish(128 + SIGTERM));
}

TEST(RestartPolicyTest, ALostNodeIsARerendezvousOnlyForElasticJobsAndNotARestart) {
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::NodeLost), {.max_restarts = 3, .elastic = true}), kRerendezvous);
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::NodeLost), {.max_restarts = 3, .elastic = false}), finish(1));
  // Restarts used up do not stop an elastic job from going on without the lost node.
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::NodeLost), {.restarts = 3, .max_restarts = 3, .elastic = true}),
            kRerendezvous);
}

TEST(RestartPolicyTest, ANewNodeAlwaysMeansARerendezvous) {
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::Membership), {.restarts = 9, .max_restarts = 0}), kRerendezvous);
}

TEST(RestartPolicyTest, AHangRestartsLikeAFailureThenExitsWith124) {
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::Hang), {.restarts = 0, .max_restarts = 1}), kRestart);
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::Hang), {.restarts = 1, .max_restarts = 1}), finish(124, kNoRestartsLeft));
}

// pytorch#185414: workers SIGKILL could not end (uninterruptible sleep) still hold their GPU and
// ports; new workers on this node would compete with them, so the node finishes instead.
TEST(RestartPolicyTest, UnkillableWorkersEndTheNodesPartWhateverTheRestartsLeft) {
  // The decision says so (the agent's error line): it would have restarted or gone on otherwise.
  EXPECT_EQ(decide(failure(3), {.max_restarts = 5, .unkillable = true}), finish(3, kUnkillable));
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::Hang), {.max_restarts = 5, .unkillable = true}),
            finish(kHangExitCode, kUnkillable));
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::NodeLost), {.elastic = true, .unkillable = true}), finish(1, kUnkillable));
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::Membership), {.elastic = true, .unkillable = true}), finish(1, kUnkillable));
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::Success), {.unkillable = true}), finish(0));
  // Out of restarts anyway, or static: not what stopped it.
  EXPECT_EQ(decide(failure(3), {.restarts = 1, .max_restarts = 1, .unkillable = true}), finish(3, kNoRestartsLeft));
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::NodeLost), {.elastic = false, .unkillable = true}), finish(1));
}

TEST(RestartPolicyTest, LosingTheStoreEndsTheJobWithOneEvenWithRestartsLeft) {
  EXPECT_EQ(decide(end_of(RoundEnd::Kind::StoreLost), {.max_restarts = 3, .elastic = true}), finish(1));
}

// A spare whose job ended without it: no restart, no next round, whatever it has left; it ends
// with the code the job's nodes ended with, and nothing of its own kept a restart from happening.
TEST(RestartPolicyTest, ASpareEndsWithTheJobsCodeWhenTheJobIsOver) {
  const auto over = [](RoundEnd e) {
    e.job_over = true;
    return e;
  };
  const RestartState fresh{.restarts = 0, .max_restarts = 3, .elastic = true};
  EXPECT_EQ(decide(over(end_of(RoundEnd::Kind::Success)), fresh), finish(0));
  EXPECT_EQ(decide(over(failure(7)), fresh), finish(7));
  EXPECT_EQ(decide(over(failure(0, SIGKILL)), fresh), finish(128 + SIGKILL));
  EXPECT_EQ(decide(over(end_of(RoundEnd::Kind::Hang)), fresh), finish(kHangExitCode));
  EXPECT_EQ(decide(over(end_of(RoundEnd::Kind::NodeLost)), fresh), finish(1));
  EXPECT_EQ(decide(over(end_of(RoundEnd::Kind::Membership)), fresh), finish(1));
  EXPECT_EQ(decide(over(end_of(RoundEnd::Kind::StoreLost)), fresh), finish(1));
  EXPECT_EQ(decide(over(end_of(RoundEnd::Kind::Signal)), fresh), finish(128 + SIGTERM));
}

}  // namespace
}  // namespace ddprun::launcher
