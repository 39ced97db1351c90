// Restarts that know when to stop (--max_no_progress_restarts): a job whose restarts get no further
// than the iterations its program reported before them ends with exit code 125 and "no_progress"
// in its report; one that gets further each time is restarted up to --max_restarts; one that
// reports nothing is never stopped for it. Every node of a job takes the same decision. The
// iterations may also come from a file the program writes (--iterations_file); a file that says
// anything but a count is reported and ignored.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <fstream>

#include "tests/support/free_port.hpp"
#include "tests/support/job_node.hpp"
#include "tests/support/report.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"

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

// One worker, /bin/sh -c SCRIPT, that fails with 1 each attempt under --max_restarts 6 and
// --iterations_file FILE.
Finished run_with_file(const Reports& reports, const std::string& file, const std::string& script) {
  std::vector<std::string> argv{ddprun_bin(), "--nproc_per_node", "1", "--max_restarts", "6"};
  const auto flags = reports.flags(0, {"--iterations_file", file});
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), {"/bin/sh", "-c", script});
  Subprocess p(argv);
  return p.wait(120s);
}

TEST(NoProgressTest, AnIterationsFileThatStaysAtOneCountEndsTheJobAfterThreeRestarts) {
  TempDir dir;
  const std::string file = (dir.path / "latest_checkpointed_iteration.txt").string();
  Reports reports;
  const Finished f = run_with_file(reports, file, "echo 5 > " + file + "; exit 1");
  EXPECT_EQ(f.exit_code, 125) << f.err;
  const auto r = reports.of(0);
  ASSERT_TRUE(r.is_object()) << f.err;
  EXPECT_EQ(r["not_restarted"], "no_progress") << r.dump(2);
  EXPECT_EQ(r["restarts"], 3) << r.dump(2);
  EXPECT_NE(f.err.find("(the last reached 5; --max_no_progress_restarts)"), std::string::npos) << f.err;
}

// The file and the progress pages together: the pages say 5 at every attempt, the file 0, 10,
// 20...: the most of the two grows, so the job goes on to --max_restarts.
TEST(NoProgressTest, TheIterationsFileAndTheProgressPagesCountTogether) {
  TempDir dir;
  const std::string file = (dir.path / "iterations").string();
  Reports reports;
  const Finished f = run_with_file(reports, file,
                                   "echo $((10 * TORCHELASTIC_RESTART_COUNT)) > " + file + "; exec " +
                                       std::string(TEST_WORKER_BIN) + " iterations 5 0 exit-if-rank 0 1");
  EXPECT_EQ(f.exit_code, 1) << f.err;
  EXPECT_EQ(reports.of(0)["restarts"], 6) << reports.of(0).dump(2);
  EXPECT_EQ(reports.of(0)["not_restarted"], "no_restarts_left") << reports.of(0).dump(2);
}

// A file that says anything but a count (Megatron's "release", binary bytes, a file far too big,
// a FIFO nobody writes, a directory) is reported with what it says and ignored: the job is never
// stopped for it, and the agent never waits on it.
TEST(NoProgressTest, AGarbageIterationsFileIsReportedAndIgnored) {
  struct Case {
    std::string name, expected;
    void (*make)(const std::string&);
  };
  const std::vector<Case> cases{
      {"release", "says 'release', not a whole number of iterations",
       [](const std::string& p) { std::ofstream(p) << "release\n"; }},
      {"binary", "says ' ELF    ', not a whole number of iterations",
       [](const std::string& p) {
         std::ofstream(p, std::ios::binary) << std::string(
             "\x7f"
             "ELF\x02\x01\0\0",
             8);
       }},
      {"huge", "holds 1048576 bytes, not a count of iterations",
       [](const std::string& p) { std::ofstream(p) << std::string(1 << 20, '7'); }},
      {"fifo", "is not a regular file", [](const std::string& p) { ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0); }},
      {"directory", "is not a regular file", [](const std::string& p) { std::filesystem::create_directory(p); }},
  };
  for (const Case& c : cases) {
    TempDir dir;
    const std::string file = (dir.path / c.name).string();
    c.make(file);
    Reports reports;
    const Finished f = run_with_file(reports, file, "exit 1");
    EXPECT_EQ(f.exit_code, 1) << c.name << "\n" << f.err;
    EXPECT_EQ(reports.of(0)["restarts"], 6) << c.name << "\n" << reports.of(0).dump(2);
    EXPECT_NE(f.err.find("--iterations_file " + file + " " + c.expected), std::string::npos) << c.name << "\n" << f.err;
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
