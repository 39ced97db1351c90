// --report_file end to end: the ddprun binary with real workers (tests/launcher/test_worker.cpp)
// writes one JSON document at the end of each job, and the tests read that document, not the
// console: a success, a failure after a restart, an error file, a stop signal, a two-node
// failure (each node's report names the other node's rank as the root cause), the environment
// variable and {host}, a path that cannot work or something there that is not a file (refused
// before any worker runs) and a disk that is full at the end (a warning; the job's exit code is
// kept).
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/support/ddprun_bin.hpp"
#include "tests/support/free_port.hpp"
#include "tests/support/report.hpp"
#include "tests/support/small_disk.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/wait_until.hpp"
#include "tests/support/job_node.hpp"

namespace ddprun::test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

std::string host_name() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

// ddprun with two workers that write their pids to dir/ready.<local rank> and sleep, reporting to `file`.
struct TwoSleepers {
  TempDir dir;
  fs::path file = dir.path / "report.json";
  Subprocess p{ddprun({"--nproc_per_node", "2", "--report_file", file.string(), TEST_WORKER_BIN, "ready-file",
                       (dir.path / "ready.${local_rank}").string(), "sleep", "60"})};

  // Once both workers are up, SIGTERM to rank 1 (not through ddprun); its pid, or 0.
  pid_t sigterm_rank_1() {
    pid_t worker = 0;
    if (!wait_until([&] { return fs::exists(dir.path / "ready.0") && fs::exists(dir.path / "ready.1"); }, 30s) ||
        !wait_until([&] { return (std::ifstream(dir.path / "ready.1") >> worker) && worker > 0; }, 10s)) {
      return 0;
    }
    ::kill(worker, SIGTERM);
    return worker;
  }
  // How ddprun ended, and its report.
  std::pair<Finished, json> end() {
    Finished f = p.wait(60s);
    return {f, read_report(file)};
  }
};

TEST(ReportFileTest, ASuccessfulJobIsReportedWithEveryRank) {
  TempDir dir;
  const fs::path file = dir.path / "report.json";
  Subprocess p(ddprun({"--nproc_per_node", "3", "--run_id", "ok-job", "--report_file", file.string(), TEST_WORKER_BIN,
                       "sleep", "0.2"}));
  const Finished f = p.wait(60s);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  const json r = read_report(file);
  ASSERT_TRUE(r.is_object()) << f.err;
  EXPECT_EQ(r["schema"], "ddprun-report/1");
  EXPECT_EQ(r["job_id"], "ok-job");
  EXPECT_EQ(r["outcome"], "succeeded");
  EXPECT_EQ(r["exit_code"], 0);
  EXPECT_EQ(r["world_size"], 3);
  EXPECT_EQ(r["restarts"], 0);
  EXPECT_EQ(r["host"], host_name());
  EXPECT_TRUE(r["root_cause"].is_null());
  EXPECT_GE(r["duration_s"].get<double>(), 0.2);
  ASSERT_EQ(r["attempts"].size(), 1u);
  const json& a = r["attempts"][0];
  EXPECT_EQ(a["outcome"], "succeeded");
  ASSERT_EQ(a["workers"].size(), 3u);
  for (int rank = 0; rank < 3; ++rank) {
    const json& w = a["workers"][rank];
    EXPECT_EQ(w["rank"], rank);
    EXPECT_EQ(w["state"], "succeeded");
    EXPECT_EQ(w["exit_code"], 0);
    EXPECT_GT(w["pid"].get<int>(), 0);
  }
  // Readable by its owner only, like the logs (it holds what the workers printed); no temporary
  // file left beside it.
  EXPECT_EQ(fs::status(file).permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 1);
}

TEST(ReportFileTest, AFailureAfterARestartNamesTheRootCauseAndEveryAttempt) {
  TempDir dir;
  const fs::path file = dir.path / "report.json";
  Subprocess p(ddprun({"--nproc_per_node", "3", "--max_restarts", "1", "--shutdown_timeout", "5", "--report_file",
                       file.string(), TEST_WORKER_BIN, "exit-if-rank", "2", "7", "sleep", "60"}));
  const Finished f = p.wait(90s);
  ASSERT_EQ(f.exit_code, 7) << f.err;
  const json r = read_report(file);
  ASSERT_TRUE(r.is_object()) << f.err;
  EXPECT_EQ(r["outcome"], "failed");
  EXPECT_EQ(r["exit_code"], 7);
  EXPECT_EQ(r["restarts"], 1);
  EXPECT_EQ(r["max_restarts"], 1);
  ASSERT_EQ(r["attempts"].size(), 2u);
  for (int k = 0; k < 2; ++k) {
    const json& a = r["attempts"][k];
    EXPECT_EQ(a["restart"], k);
    EXPECT_EQ(a["outcome"], "failed");
    ASSERT_EQ(a["workers"].size(), 3u);
    EXPECT_EQ(a["workers"][0]["state"], "stopped");
    EXPECT_EQ(a["workers"][0]["signal_name"], "SIGTERM");
    EXPECT_EQ(a["workers"][2]["state"], "failed");
    EXPECT_EQ(a["workers"][2]["exit_code"], 7);
  }
  EXPECT_NE(r["attempts"][0]["master_port"], nullptr);
  const json& rc = r["root_cause"];
  ASSERT_TRUE(rc.is_object());
  EXPECT_EQ(rc["rank"], 2);
  EXPECT_EQ(rc["exit_code"], 7);
  EXPECT_EQ(rc["pid"], r["attempts"][1]["workers"][2]["pid"]);
  ASSERT_TRUE(rc["stderr_tail"].is_array());
  EXPECT_EQ(rc["stderr_tail"].back(), "rank 2 exiting with 7");
}

// A root cause that exits 93 (--no_restart_exit_codes' default) is not restarted, with restarts
// left; the report says why. With the list emptied, 93 restarts as any failure does.
TEST(ReportFileTest, AnExitCodeThatMeansDoNotRestartEndsTheJobAfterOneAttempt) {
  TempDir dir;
  for (const bool listed : {true, false}) {
    const fs::path file = dir.path / (listed ? "listed.json" : "unlisted.json");
    std::vector<std::string> flags{"--nproc_per_node",   "2", "--max_restarts", "2",
                                   "--shutdown_timeout", "5", "--report_file",  file.string()};
    if (!listed) flags.insert(flags.end(), {"--no_restart_exit_codes", "none"});
    flags.insert(flags.end(), {TEST_WORKER_BIN, "exit-if-rank", "1", "93", "sleep", "60"});
    Subprocess p(ddprun(flags));
    const Finished f = p.wait(90s);
    ASSERT_EQ(f.exit_code, 93) << f.err;
    const json r = read_report(file);
    ASSERT_TRUE(r.is_object()) << f.err;
    EXPECT_EQ(r["outcome"], "failed");
    EXPECT_EQ(r["root_cause"]["rank"], 1) << r.dump(2);
    EXPECT_EQ(r["attempts"].size(), listed ? 1u : 3u) << r.dump(2);
    EXPECT_EQ(r["restarts"], listed ? 0 : 2);
    EXPECT_EQ(r["not_restarted"], listed ? "do_not_restart_exit_code" : "no_restarts_left") << r.dump(2);
    EXPECT_EQ(f.err.find("(--no_restart_exit_codes)") != std::string::npos, listed) << f.err;
  }
}

TEST(ReportFileTest, TheWorkersErrorFileIsInTheRootCause) {
  TempDir dir;
  const fs::path file = dir.path / "report.json";
  Subprocess p(
      ddprun({"--nproc_per_node", "1", "--report_file", file.string(), TEST_WORKER_BIN, "error-file", "loss is NaN"}));
  const Finished f = p.wait(30s);
  ASSERT_EQ(f.exit_code, 1) << f.err;
  const json r = read_report(file);
  ASSERT_TRUE(r.is_object()) << f.err;
  ASSERT_TRUE(r["root_cause"]["error"].is_string()) << r.dump(2);
  EXPECT_NE(r["root_cause"]["error"].get<std::string>().find("RuntimeError: loss is NaN"), std::string::npos);
  // A file that is still there (the run directory, temporary here, went with ddprun), or none.
  const json& error_file = r["root_cause"]["error_file"];
  EXPECT_TRUE(error_file.is_null() || fs::exists(error_file.get<std::string>())) << r.dump(2);
}

TEST(ReportFileTest, AStopSignalIsReportedWithTheStoppedWorkers) {
  TempDir dir;
  const fs::path file = dir.path / "report.json";
  const fs::path ready = dir.path / "ready";
  Subprocess p(ddprun({"--nproc_per_node", "2", "--report_file", file.string(), TEST_WORKER_BIN, "ready-file",
                       ready.string(), "sleep", "60"}));
  ASSERT_TRUE(wait_until([&] { return fs::exists(ready); }, 30s));
  p.signal(SIGTERM);
  const Finished f = p.wait(60s);
  ASSERT_EQ(f.exit_code, 128 + SIGTERM) << f.err;
  const json r = read_report(file);
  ASSERT_TRUE(r.is_object()) << f.err;
  EXPECT_EQ(r["outcome"], "signalled");
  EXPECT_EQ(r["exit_code"], 128 + SIGTERM);
  ASSERT_EQ(r["attempts"].size(), 1u);
  for (const json& w : r["attempts"][0]["workers"]) EXPECT_EQ(w["state"], "stopped") << w.dump();
}

// Slurm's scancel, systemd's stop and a kill of a whole cgroup signal every process at once, so a
// worker can die of the SIGTERM before ddprun receives its own. That is the job being stopped, not
// a rank failing: the report says "signalled" and every worker "stopped".
TEST(ReportFileTest, AStopSignalThatReachesAWorkerBeforeDdprunIsTheJobBeingStopped) {
  TwoSleepers job;
  const pid_t worker = job.sigterm_rank_1();
  ASSERT_GT(worker, 0) << "the workers did not come up";
  // ddprun has reaped it (its /proc entry is gone) before its own SIGTERM arrives.
  ASSERT_TRUE(wait_until([&] { return !fs::exists("/proc/" + std::to_string(worker)); }, 10s, 1ms));
  job.p.signal(SIGTERM);
  const auto [f, r] = job.end();
  ASSERT_EQ(f.exit_code, 128 + SIGTERM) << f.err;
  ASSERT_TRUE(r.is_object()) << f.err;
  EXPECT_EQ(r["outcome"], "signalled") << f.err;
  EXPECT_TRUE(r["root_cause"].is_null()) << r.dump(2);
  for (const json& w : r["attempts"][0]["workers"]) EXPECT_EQ(w["state"], "stopped") << w.dump();
  EXPECT_EQ(f.err.find("FAILED"), std::string::npos) << "no failure report for a stopped job:\n" << f.err;
}

// The same worker death with no signal for ddprun is a failure of that rank, as before.
TEST(ReportFileTest, AWorkerKilledBySigtermAloneIsAFailureOfThatRank) {
  TwoSleepers job;
  ASSERT_GT(job.sigterm_rank_1(), 0) << "the workers did not come up";
  const auto [f, r] = job.end();
  ASSERT_EQ(f.exit_code, 128 + SIGTERM) << f.err;
  ASSERT_TRUE(r.is_object()) << f.err;
  EXPECT_EQ(r["outcome"], "failed") << f.err;
  EXPECT_EQ(r["root_cause"]["rank"], 1) << r.dump(2);
  EXPECT_EQ(r["root_cause"]["signal"], SIGTERM) << r.dump(2);
  EXPECT_EQ(r["attempts"][0]["workers"][0]["state"], "stopped") << r.dump(2);
}

TEST(ReportFileTest, EachNodeOfATwoNodeJobReportsTheOtherNodesRootCause) {
  TempDir dir;
  const int port = free_port();
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int n = 0; n < 2; ++n) {
    nodes.push_back(JobNode(n)
                        .meet(at_master(port))
                        .conf("")
                        .flags({"--nproc_per_node", "2", "--shutdown_timeout", "5", "--report_file",
                                (dir.path / ("node" + std::to_string(n) + ".json")).string()})
                        .start({TEST_WORKER_BIN, "exit-if-rank", "3", "9", "sleep", "60"}));
  }
  const Finished f0 = nodes[0]->wait(90s), f1 = nodes[1]->wait(90s);
  ASSERT_EQ(f0.exit_code, 9) << f0.err;
  ASSERT_EQ(f1.exit_code, 9) << f1.err;
  for (int n = 0; n < 2; ++n) {
    const json r = read_report(dir.path / ("node" + std::to_string(n) + ".json"));
    ASSERT_TRUE(r.is_object()) << (n == 0 ? f0.err : f1.err);
    EXPECT_EQ(r["outcome"], "failed");
    EXPECT_EQ(r["nodes"]["count"], 2);
    EXPECT_EQ(r["nodes"]["this_node_rank"], n);
    EXPECT_EQ(r["world_size"], 4);
    const json& rc = r["root_cause"];
    EXPECT_EQ(rc["rank"], 3) << r.dump(2);
    EXPECT_EQ(rc["node_rank"], 1) << r.dump(2);
    EXPECT_EQ(rc["exit_code"], 9);
    // This node's own workers, with their global ranks.
    const json& workers = r["attempts"][0]["workers"];
    ASSERT_EQ(workers.size(), 2u);
    EXPECT_EQ(workers[0]["rank"], 2 * n);
    EXPECT_EQ(workers[1]["rank"], 2 * n + 1);
    EXPECT_EQ(workers[1]["state"], n == 1 ? "failed" : "stopped");
  }
}

TEST(ReportFileTest, TheEnvironmentVariableWorksAndHostIsExpanded) {
  TempDir dir;
  Subprocess p(ddprun({"--nproc_per_node", "1", TEST_WORKER_BIN, "exit-if-rank", "0", "4"}),
               {{"DDPRUN_REPORT_FILE", (dir.path / "sub" / "r-{host}.json").string()}});
  const Finished f = p.wait(30s);
  ASSERT_EQ(f.exit_code, 4) << f.err;
  const json r = read_report(dir.path / "sub" / ("r-" + host_name() + ".json"));
  ASSERT_TRUE(r.is_object()) << f.err;
  EXPECT_EQ(r["exit_code"], 4);
}

TEST(ReportFileTest, APathThatCannotWorkIsRefusedBeforeAnyWorkerRuns) {
  TempDir dir;
  const fs::path ready = dir.path / "ready";
  Subprocess p(
      ddprun({"--nproc_per_node", "1", "--report_file", dir.str(), TEST_WORKER_BIN, "ready-file", ready.string()}));
  const Finished f = p.wait(30s);
  EXPECT_EQ(f.exit_code, 2) << f.err;
  EXPECT_NE(f.err.find("--report_file " + dir.str() + " is a directory"), std::string::npos) << f.err;
  EXPECT_FALSE(fs::exists(ready));
}

// Something at the path that is not a file (as root, a device node such as /dev/full; here a
// socket, which any user can make): refused before any worker runs, and left as it was.
TEST(ReportFileTest, AnythingAtThePathButAFileOrAFifoIsRefusedBeforeAnyWorkerRuns) {
  TempDir dir;
  const fs::path sock = dir.path / "report.json";
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(sock.string().size(), sizeof addr.sun_path);
  std::strcpy(addr.sun_path, sock.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
  const fs::path ready = dir.path / "ready";
  Subprocess p(
      ddprun({"--nproc_per_node", "1", "--report_file", sock.string(), TEST_WORKER_BIN, "ready-file", ready.string()}));
  const Finished f = p.wait(30s);
  ::close(fd);
  EXPECT_EQ(f.exit_code, 2) << f.err;
  EXPECT_NE(f.err.find("it is a socket"), std::string::npos) << f.err;
  EXPECT_FALSE(fs::exists(ready));
  EXPECT_TRUE(fs::is_socket(fs::symlink_status(sock))) << "the socket was replaced";
}

TEST(ReportFileTest, AFullDiskAtTheEndIsAWarningAndTheExitCodeStays) {
  SmallDisk disk("64k");
  if (!disk.mounted) GTEST_SKIP() << "cannot mount a tmpfs here: " << disk.error;
  const fs::path file = disk.dir.path / "report.json";
  // The worker fills the disk the report goes to, then fails with 5.
  Subprocess p(ddprun({"--nproc_per_node", "1", "--report_file", file.string(), "/bin/sh", "-c",
                       "cat /dev/zero > " + (disk.dir.path / "filler").string() + " 2>/dev/null; exit 5"}));
  const Finished f = p.wait(30s);
  EXPECT_EQ(f.exit_code, 5) << f.err;
  EXPECT_NE(f.err.find("cannot write the report file " + file.string()), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("No space left on device"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("Root cause (first failure)"), std::string::npos) << f.err;
  EXPECT_FALSE(fs::exists(file));
  EXPECT_EQ(std::distance(fs::directory_iterator(disk.dir.path), fs::directory_iterator()), 1);  // the filler only
}

}  // namespace
}  // namespace ddprun::test
