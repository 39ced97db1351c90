// Restarts that know when to stop (--max_no_progress_restarts): a job whose restarts get no further
// than the iterations its program reported before them ends with exit code 125 and "no_progress"
// in its report; one that gets further each time is restarted up to --max_restarts; one that
// reports nothing is never stopped for it. Every node of a job takes the same decision.
#include <gtest/gtest.h>

#include "tests/support/free_port.hpp"
#include "tests/support/job_node.hpp"
#include "tests/support/report.hpp"
#include "tests/support/subprocess.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;

// One node of 2 workers whose rank 1 fails with 1 after reporting BASE + STEP x restart
// iterations (`iterations` empty: reports none), under --max_restarts 6.
Finished run_job(const Reports& reports, const std::vector<std::string>& iterations,
                 std::vector<std::string> extra = {}) {
  std::vector<std::string> argv{ddprun_bin(), "--nproc_per_node", "2", "--max_restarts", "6"};
  const auto flags = reports.flags(0, std::move(extra));
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(TEST_WORKER_BIN);
  if (!iterations.empty()) argv.insert(argv.end(), {"iterations", iterations[0], iterations[1]});
  argv.insert(argv.end(), {"exit-if-rank", "1", "1", "sleep", "30"});
  Subprocess p(argv);
  return p.wait(120s);
}

TEST(NoProgressTest, RestartsThatGetNoFurtherEndTheJobAfterThreeWithExitCode125) {
  Reports reports;
  const Finished f = run_job(reports, {"5", "0"});
  EXPECT_EQ(f.exit_code, 125) << f.err;
  const auto r = reports.of(0);
  ASSERT_TRUE(r.is_object()) << f.err;
  EXPECT_EQ(r["not_restarted"], "no_progress") << r.dump(2);
  EXPECT_EQ(r["restarts"], 3) << "three restarts got no further than the first attempt's 5 iterations";
  EXPECT_EQ(r["attempts"].size(), 4u);
  EXPECT_EQ(r["root_cause"]["rank"], 1) << "the report still names the failure";
  EXPECT_NE(f.err.find("not restarting: no progress: 3 restart(s) in a row"), std::string::npos) << f.err;
}

TEST(NoProgressTest, RestartsThatGetFurtherEachTimeGoOnToMaxRestarts) {
  Reports reports;
  const Finished f = run_job(reports, {"5", "10"});
  EXPECT_EQ(f.exit_code, 1) << f.err;
  const auto r = reports.of(0);
  ASSERT_TRUE(r.is_object()) << f.err;
  EXPECT_EQ(r["restarts"], 6) << r.dump(2);
  EXPECT_EQ(r["not_restarted"], "no_restarts_left") << r.dump(2);
}

TEST(NoProgressTest, AProgramThatReportsNoIterationsOrAZeroSettingIsNeverStoppedForIt) {
  for (const bool reports_none : {true, false}) {
    Reports reports;
    const Finished f =
        reports_none ? run_job(reports, {}) : run_job(reports, {"5", "0"}, {"--max_no_progress_restarts", "0"});
    EXPECT_EQ(f.exit_code, 1) << f.err;
    EXPECT_EQ(reports.of(0)["restarts"], 6) << reports.of(0).dump(2);
    EXPECT_EQ(reports.of(0)["not_restarted"], "no_restarts_left");
  }
}

// The failing rank's node counts the restarts without progress and writes them with the failure:
// the other node, whose ranks reported nothing, ends the same way after the same attempts.
TEST(NoProgressTest, EveryNodeOfTheJobStopsAfterTheSameAttempt) {
  const int port = free_port();
  Reports reports;
  auto start = [&](int n, std::vector<std::string> worker) {
    worker.insert(worker.begin(), TEST_WORKER_BIN);
    return JobNode(n)
        .meet(at_master(port))
        .flags({"--nproc_per_node", "1", "--max_restarts", "6", "--max_no_progress_restarts", "2"})
        .flags(reports.flags(n))
        .start(worker);
  };
  auto n0 = start(0, {"sleep", "30"});
  auto n1 = start(1, {"iterations", "7", "0", "sleep", "0.5", "exit-if-rank", "1", "1"});
  const Finished f0 = n0->wait(120s), f1 = n1->wait(120s);
  EXPECT_EQ(f0.exit_code, 125) << f0.err;
  EXPECT_EQ(f1.exit_code, 125) << f1.err;
  EXPECT_EQ(reports.of(0)["attempts"].size(), 3u) << reports.of(0).dump(2);
  EXPECT_EQ(reports.of(1)["attempts"].size(), 3u) << reports.of(1).dump(2);
  EXPECT_EQ(reports.of(0)["not_restarted"], "no_progress");
}

}  // namespace
}  // namespace ddprun::test
