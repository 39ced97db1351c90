// The restart policy (launcher/agent/restart_policy.hpp): what a round's end makes the agent do.
#include "launcher/agent/restart_policy.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <cstdint>
#include <string>
#include <vector>

#include "launcher/rendezvous/round_records.hpp"
#include "launcher/workers/worker_exit.hpp"
#include "rendezvous/jobs/job_keys.hpp"

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

// --max_no_progress_restarts: the restarts in a row that got no further, as the failure's node
// counted them (every node reads the same figure with the end).
TEST(RestartPolicyTest, RestartsThatMakeNoProgressEndTheJobWithItsOwnCode) {
  const auto stalled = [](int restarts_without_progress) {
    RoundEnd e = failure(1);
    e.progress = {.iterations = 5, .no_progress_restarts = restarts_without_progress};
    return e;
  };
  const RestartState s{.restarts = 2, .max_restarts = 8, .max_no_progress_restarts = 3};
  EXPECT_EQ(decide(stalled(0), s), kRestart);
  EXPECT_EQ(decide(stalled(2), s), kRestart);
  EXPECT_EQ(decide(stalled(3), s), finish(agent::kNoProgressExitCode, Decision::Why::NoProgress));
  EXPECT_EQ(agent::kNoProgressExitCode, 125);
  // Off with 0; spent restarts and a stop signal say what they always said.
  EXPECT_EQ(decide(stalled(9), {.restarts = 2, .max_restarts = 8}), kRestart);
  EXPECT_EQ(decide(stalled(3), {.restarts = 8, .max_restarts = 8, .max_no_progress_restarts = 3}),
            finish(1, kNoRestartsLeft));
  EXPECT_EQ(
      decide(stalled(3), {.restarts = 2, .max_restarts = 8, .stop_signal = SIGTERM, .max_no_progress_restarts = 3}),
      finish(1, kStopping));
  // The console's sentence names the restarts and the iterations.
  EXPECT_EQ(agent::not_restarted_text(stalled(3), Decision::Why::NoProgress, 8),
            "not restarting: no progress: 3 restart(s) in a row got no further than the iterations reached before "
            "them (the last reached 5; --max_no_progress_restarts); exit code 125");
}

// The mark travels in the failure's record; a record whose mark is malformed (another program's
// garbage in the store) reads as no mark: nothing is known, so nothing is stopped for it.
TEST(RestartPolicyTest, TheProgressMarkTravelsWithTheFailureAndGarbageReadsAsNone) {
  using rendezvous::failure_outcome;
  using rendezvous::parse_round_end;
  WorkerExit w;
  w.rank = 1;
  w.exit_code = 3;
  const rendezvous::ProgressMark mark{.iterations = 9000000000ULL, .no_progress_restarts = 2};
  EXPECT_EQ(parse_round_end(rdzv::jobs::encode_outcome(failure_outcome(w, 0, mark))).progress, mark);
  EXPECT_EQ(parse_round_end(rdzv::jobs::encode_outcome(failure_outcome(w, 0))).progress, rendezvous::ProgressMark{});
  for (const nlohmann::json& garbage :
       {nlohmann::json("12"), nlohmann::json({{"iterations", -4}}), nlohmann::json({{"iterations", "many"}}),
        nlohmann::json({{"iterations", 1.5}}), nlohmann::json::array({1, 2})}) {
    rdzv::jobs::Outcome o = failure_outcome(w, 0);
    o.failure["progress"] = garbage;
    const RoundEnd e = parse_round_end(rdzv::jobs::encode_outcome(o));
    EXPECT_EQ(e.kind, RoundEnd::Kind::Failure) << garbage;
    EXPECT_FALSE(e.progress.iterations) << garbage;
  }
}

// --iterations_file's text: a decimal count with blanks around it is the count; anything else is
// none, with a reason that shows what the file says (control characters as spaces, cut short).
TEST(RestartPolicyTest, AnIterationsFileSaysACountOrWhyItIsNone) {
  using agent::parse_iterations_text;
  EXPECT_EQ(parse_iterations_text("1200").iterations, 1200u);
  EXPECT_EQ(parse_iterations_text("  42\n").iterations, 42u);
  EXPECT_EQ(parse_iterations_text("0\r\n").iterations, 0u);
  EXPECT_EQ(parse_iterations_text("18446744073709551615").iterations, UINT64_MAX);
  EXPECT_TRUE(parse_iterations_text("1200").problem.empty());
  EXPECT_EQ(parse_iterations_text("").problem, "is empty");
  EXPECT_EQ(parse_iterations_text(" \n\t").problem, "is empty");
  EXPECT_EQ(parse_iterations_text("release\n").problem,
            "says 'release', not a whole number of iterations (a decimal count such as 1200)");
  EXPECT_EQ(parse_iterations_text("18446744073709551616").problem,
            "says '18446744073709551616', not a whole number of iterations (more than 2^64 - 1)");
  for (const std::string& bad :
       std::vector<std::string>{"-5", "+5", "12 13", "12abc", "0x10", "1.5", "1e3", std::string("7\0", 2)}) {
    const auto said = parse_iterations_text(bad);
    EXPECT_FALSE(said.iterations) << bad;
    EXPECT_NE(said.problem.find("not a whole number of iterations"), std::string::npos) << bad;
  }
  const auto binary = parse_iterations_text(std::string(50, '\x01') + "9");
  EXPECT_EQ(binary.problem.find("says '" + std::string(40, ' ') + "...'"), 0u) << binary.problem;
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
