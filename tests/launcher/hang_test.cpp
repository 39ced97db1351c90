// ddprun's hang watchdog end to end, with real PyTorch gloo workers (tests/python/hang_worker.py):
// a hang in a collective, a rank that never reaches init_process_group, a torchelastic timer
// overrun, a busy silent job that must be left alone, heartbeats through the store for ranks that
// spin, a restart after a hang, and a hang of a two-node job.
//
// Time to detection is asserted against --hang_timeout plus a margin of 15 s: the watchdog
// samples once a second and CPU time over a window of at least 2 s, so detection normally comes
// within the timeout plus 3 s; the rest of the margin is for a loaded machine.
#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>

#include "tests/support/files.hpp"
#include "tests/support/free_port.hpp"
#include "tests/support/report.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/job_node.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr double kDetectionMargin = 15.0;

bool have_torch() { return ::access(TORCH_PYTHON, X_OK) == 0; }

std::map<std::string, std::string> python_env(std::map<std::string, std::string> more = {}) {
  more.emplace("PYTHON_EXEC", TORCH_PYTHON);
  more.emplace("OMP_NUM_THREADS", "1");
  return more;
}

std::vector<std::string> command(std::vector<std::string> flags, std::vector<std::string> worker_args) {
  std::vector<std::string> argv{DDPRUN_BIN};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(HANG_WORKER_PY);
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return argv;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// Seconds from the worker's "hanging now <epoch>" to ddprun's "no rank made progress" log line.
double detection_seconds(const Finished& f) {
  std::smatch m;
  const std::string all = f.out + f.err;
  if (!std::regex_search(all, m, std::regex(R"(hanging now ([0-9.]+))"))) return -1;
  const double hung_at = std::stod(m[1]);
  if (!std::regex_search(
          f.err, m,
          std::regex(R"((\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)\.(\d{3})Z WARN  ddprun: no rank made progress)"))) {
    return -1;
  }
  std::tm tm{};
  tm.tm_year = std::stoi(m[1]) - 1900;
  tm.tm_mon = std::stoi(m[2]) - 1;
  tm.tm_mday = std::stoi(m[3]);
  tm.tm_hour = std::stoi(m[4]);
  tm.tm_min = std::stoi(m[5]);
  tm.tm_sec = std::stoi(m[6]);
  const double detected_at = static_cast<double>(::timegm(&tm)) + std::stoi(m[7]) / 1000.0;
  return detected_at - hung_at;
}

// The run directory under --log_dir (LOG_DIR/none_XXXX).
fs::path run_dir(const TempDir& logs) {
  for (const auto& e : fs::directory_iterator(logs.path)) return e.path();
  return {};
}

TEST(HangTest, AHangInACollectiveIsCaughtWithTheRankBehindAndEveryRanksFrames) {
  if (!have_torch()) GTEST_SKIP() << TORCH_PYTHON << " is not here";
  TempDir logs;
  Subprocess p(command({"--nproc_per_node", "2", "--hang_timeout", "5", "--log_dir", logs.str()}, {"collective", "1"}),
               python_env());
  const Finished f = p.wait(120s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 124) << f.err;
  EXPECT_NE(f.err.find("HUNG: no rank made progress for"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("behind     : rank 1\n"), std::string::npos) << f.err;
  // Where each rank is: rank 0 in the collective, rank 1 in its own code, with their frames.
  EXPECT_NE(f.err.find("): in torch.distributed all_reduce (hang_worker.py:"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("): in stuck_in_user_code (hang_worker.py:"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("line 33 in stuck_in_user_code"), std::string::npos) << f.err;
  EXPECT_EQ(count(f.err, "HUNG:"), 1u) << f.err;
  const double detected = detection_seconds(f);
  EXPECT_GE(detected, 5.0 - 1.0) << f.err;  // never before the timeout (to the second the log shows)
  EXPECT_LE(detected, 5.0 + kDetectionMargin) << f.err;
  // Each rank's stacks in its log directory, and the report next to them.
  const fs::path attempt = run_dir(logs) / "attempt_0";
  for (const char* r : {"0", "1"}) {
    const std::string stacks = read_file(attempt / r / "stacks.txt");
    EXPECT_NE(stacks.find("== Python (faulthandler, all threads) =="), std::string::npos) << stacks;
    EXPECT_EQ(fs::status(attempt / r / "stacks.txt").permissions() & fs::perms::all,
              fs::perms::owner_read | fs::perms::owner_write);
  }
  EXPECT_NE(read_file(attempt / "1" / "stacks.txt").find("stuck_in_user_code"), std::string::npos);
  EXPECT_NE(read_file(attempt / "hang_report.txt").find("behind     : rank 1"), std::string::npos);
}

TEST(HangTest, ARankThatNeverReachesInitProcessGroupIsNamedWithTheKeyTheOthersWaitFor) {
  if (!have_torch()) GTEST_SKIP() << TORCH_PYTHON << " is not here";
  TempDir logs;  // (a hung run's directory is kept for its stacks: here, not under /tmp)
  Subprocess p(command({"--nproc_per_node", "2", "--hang_timeout", "5", "--log_dir", logs.str()}, {"noinit", "1"}),
               python_env());
  const Finished f = p.wait(120s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 124) << f.err;
  EXPECT_NE(f.err.find("rank 0 waits in the store for key '"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("rank 1 has no connection to the worker store: never reached init_process_group"),
            std::string::npos)
      << f.err;
  EXPECT_NE(f.err.find("behind     : rank 1\n"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("): in torch.distributed init_process_group (hang_worker.py:"), std::string::npos) << f.err;
  EXPECT_LE(detection_seconds(f), 5.0 + kDetectionMargin) << f.err;
}

TEST(HangTest, ABusySilentJobIsNeverTouched) {
  if (!have_torch()) GTEST_SKIP() << TORCH_PYTHON << " is not here";
  // 15 s of computation without a word, a store request or a collective, under a 3 s timeout.
  Subprocess p(command({"--nproc_per_node", "2", "--hang_timeout", "3"}, {"busy", "15"}), python_env());
  const Finished f = p.wait(180s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 0) << f.err;
  EXPECT_EQ(f.err.find("no rank made progress"), std::string::npos) << f.err;
  EXPECT_EQ(count(f.out, "done"), 2u) << f.out;
}

TEST(HangTest, ATorchelasticTimerOverrunGetsItsStacksBeforeTheSignalAndTheScopeInTheReport) {
  if (!have_torch()) GTEST_SKIP() << TORCH_PYTHON << " is not here";
  TempDir logs;
  Subprocess p(command({"--nproc_per_node", "2", "--log_dir", logs.str()}, {"timer", "1"}),
               python_env({{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}}));
  const Finished f = p.wait(120s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 128 + 9) << f.err;  // FileTimerClient's default signal: SIGKILL
  EXPECT_NE(f.err.find("torchelastic timer 'train_step' of rank 1"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("watchdog   : torchelastic timer 'train_step' expired"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("in overrunning_step"), std::string::npos) << f.err;
  const std::string stacks = read_file(run_dir(logs) / "attempt_0" / "1" / "timer_stacks.txt");
  EXPECT_NE(stacks.find("overrunning_step"), std::string::npos) << stacks;
}

TEST(HangTest, HeartbeatsThroughTheStoreRevealAHangWhoseRanksSpin) {
  if (!have_torch()) GTEST_SKIP() << TORCH_PYTHON << " is not here";
  // Rank 0 spins (as a rank blocked in NCCL does), so CPU time alone would call it progress.
  TempDir logs;
  Subprocess p(command({"--nproc_per_node", "2", "--hang_timeout", "5", "--log_dir", logs.str()}, {"heartbeat", "1"}),
               python_env());
  const Finished f = p.wait(120s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 124) << f.err;
  EXPECT_NE(f.err.find("ranks heartbeat through the worker store"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("): in <module> (hang_worker.py:"), std::string::npos) << f.err;
  EXPECT_LE(detection_seconds(f), 5.0 + kDetectionMargin) << f.err;
}

TEST(HangTest, AHungJobRestartsWhenMaxRestartsAllows) {
  if (!have_torch()) GTEST_SKIP() << TORCH_PYTHON << " is not here";
  Reports reports;
  TempDir logs;
  Subprocess p(command(reports.flags(0, {"--nproc_per_node", "2", "--hang_timeout", "5", "--max_restarts", "1",
                                         "--log_dir", logs.str()}),
                       {"first-attempt", "1"}),
               python_env());
  const Finished f = p.wait(180s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 0) << f.err;
  EXPECT_EQ(count(f.err, "HUNG:"), 1u) << f.err;  // the first attempt's report, shown before the restart
  const auto r = reports.of(0);
  ASSERT_TRUE(r.is_object()) << f.err;
  EXPECT_EQ(r["outcome"], "succeeded");
  EXPECT_EQ(r["restarts"], 1);
  ASSERT_EQ(r["attempts"].size(), 2u) << r.dump(2);
  EXPECT_EQ(r["attempts"][0]["outcome"], "hung") << r.dump(2);
  EXPECT_EQ(r["attempts"][1]["restart"], 1);
  EXPECT_EQ(count(f.out, "done"), 2u) << f.out;
}

TEST(HangTest, ATwoNodeHangEndsBothNodesWithOneReportOfEveryRank) {
  if (!have_torch()) GTEST_SKIP() << TORCH_PYTHON << " is not here";
  const int port = free_port();
  TempDir reports;
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int n = 0; n < 2; ++n) {
    // Each node's --report_file: node 0's by the flag, node 1's by DDPRUN_REPORT_FILE.
    const std::string report = (reports.path / ("node" + std::to_string(n) + ".json")).string();
    JobNode node(n);
    node.meet(at_master(port))
        .conf("")
        .flags({"--hang_timeout", "5", "--log_dir", (reports.path / ("logs" + std::to_string(n))).string()});
    if (n == 0) node.flags({"--report_file", report});
    node.env(python_env(n == 1 ? std::map<std::string, std::string>{{"DDPRUN_REPORT_FILE", report}}
                               : std::map<std::string, std::string>{}));
    nodes.push_back(node.start({HANG_WORKER_PY, "collective", "1"}));
  }
  const Finished f0 = nodes[0]->wait(120s), f1 = nodes[1]->wait(120s);
  ASSERT_FALSE(f0.timed_out || f1.timed_out) << f0.err << f1.err;
  EXPECT_EQ(f0.exit_code, 124) << f0.err;
  EXPECT_EQ(f1.exit_code, 124) << f1.err;
  // One report, on the node that found the hang, with both nodes' ranks in it.
  EXPECT_EQ(count(f0.err + f1.err, "HUNG:"), 1u) << f0.err << f1.err;
  const std::string& report = f0.err.find("HUNG:") != std::string::npos ? f0.err : f1.err;
  const std::string& other = f0.err.find("HUNG:") != std::string::npos ? f1.err : f0.err;
  EXPECT_NE(report.find("behind     : rank 1\n"), std::string::npos) << report;
  EXPECT_NE(report.find("node 0, pid"), std::string::npos) << report;
  EXPECT_NE(report.find("node 1, pid"), std::string::npos) << report;
  EXPECT_NE(report.find("in stuck_in_user_code"), std::string::npos) << report;
  EXPECT_NE(report.find("in torch.distributed all_reduce"), std::string::npos) << report;
  EXPECT_NE(other.find("the full report is on that node's console"), std::string::npos) << other;
  // Both nodes' report files say the same: hung, diagnosed by one node, with every rank in its report.
  std::optional<int> diagnosed_by;
  for (int n = 0; n < 2; ++n) {
    const auto r = nlohmann::json::parse(read_file(reports.path / ("node" + std::to_string(n) + ".json")), nullptr,
                                         /*allow_exceptions=*/false);
    ASSERT_TRUE(r.is_object()) << "node " << n;
    EXPECT_EQ(r["outcome"], "hung");
    EXPECT_EQ(r["exit_code"], 124);
    ASSERT_TRUE(r["hang"].is_object()) << r.dump(2);
    const int by = r["hang"]["diagnosed_by_node"].get<int>();
    if (diagnosed_by) {
      EXPECT_EQ(by, *diagnosed_by);
    }
    diagnosed_by = by;
    if (by == n) {
      const std::string text = r["hang"]["report"].get<std::string>();
      EXPECT_NE(text.find("behind     : rank 1\n"), std::string::npos) << text;
      EXPECT_NE(text.find("node 1, pid"), std::string::npos) << text;
    }
    EXPECT_TRUE(r["hang"]["report_file"].is_string()) << r.dump(2);
  }
}

}  // namespace
}  // namespace ddprun::test
