// Files ddprun writes for a person that stop taking writes: a FIFO whose reader does not read (as a
// hung NFS mount would), a FIFO nobody opened, a link planted in a shared directory. ddprun
// supervises, reports and exits as it does without them, and writes through no link.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/unique_fd.hpp"
#include "tests/support/ddprun_bin.hpp"
#include "tests/support/files.hpp"
#include "tests/support/report.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/wait_until.hpp"

namespace ddprun::test {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// A FIFO at `path` whose reader never reads, its pipe already full: the next write to it blocks.
struct StuckFifo {
  UniqueFd reader;
  explicit StuckFifo(const fs::path& path) {
    if (::mkfifo(path.c_str(), 0600) != 0) throw std::runtime_error("mkfifo " + path.string());
    reader.reset(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    ::fcntl(reader.get(), F_SETPIPE_SZ, 4096);  // less to fill
    const UniqueFd filler(::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
    const std::string block(4096, 'x');
    while (::write(filler.get(), block.data(), block.size()) > 0) {
    }
  }
};

// The job's workers fail, the others are stopped: the report and the exit come as without a trace.
TEST(StuckOutputTest, ATraceFileThatTakesNoWritesStallsNeitherAFailureNorTheExit) {
  TempDir dir;
  const StuckFifo fifo(dir.path / "trace.json");
  const fs::path report = dir.path / "report.json";
  Subprocess p(ddprun({"--nproc_per_node", "2", "--report_file", report.string(), "--trace_file",
                       (dir.path / "trace.json").string(), TEST_WORKER_BIN, "exit-if-rank", "1", "3", "wait-signal"}));
  const Finished f = p.wait(90s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 3) << f.err;
  const auto r = read_report(report);
  ASSERT_TRUE(r.is_object()) << f.err;
  EXPECT_EQ(r["outcome"], "failed");
  EXPECT_EQ(r["root_cause"]["rank"], 1) << r.dump(2);
}

TEST(StuckOutputTest, ATraceFileThatTakesNoWritesLetsASucceedingJobEnd) {
  TempDir dir;
  const StuckFifo fifo(dir.path / "trace.json");
  Subprocess p(ddprun(
      {"--nproc_per_node", "2", "--trace_file", (dir.path / "trace.json").string(), TEST_WORKER_BIN, "print", "2"}));
  const Finished f = p.wait(90s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 0) << f.err;
  EXPECT_NE(f.out.find("[rank1]: out line 1\n"), std::string::npos) << f.out;
}

// A stop signal is acted on: the workers are stopped and ddprun ends.
TEST(StuckOutputTest, ATraceFileThatTakesNoWritesLetsAStopSignalEndTheJob) {
  TempDir dir;
  const StuckFifo fifo(dir.path / "trace.json");
  const fs::path report = dir.path / "report.json";
  Subprocess p(ddprun({"--nproc_per_node", "2", "--report_file", report.string(), "--trace_file",
                       (dir.path / "trace.json").string(), TEST_WORKER_BIN, "wait-signal"}));
  ASSERT_TRUE(p.wait_for_output("ready", 60s)) << p.err();
  ASSERT_TRUE(p.wait_for_workers(2, 30s));
  p.signal(SIGTERM);
  const Finished f = p.wait(90s);
  ASSERT_FALSE(f.timed_out) << f.err;
  const auto r = read_report(report);
  ASSERT_TRUE(r.is_object()) << f.err;
  EXPECT_EQ(r["outcome"], "signalled");
}

// Nobody has the FIFO open: ddprun says so before anything starts, rather than waiting in open().
TEST(StuckOutputTest, ATraceFifoWithoutAReaderIsAnErrorBeforeTheStart) {
  TempDir dir;
  const fs::path trace = dir.path / "trace.fifo";
  ASSERT_EQ(::mkfifo(trace.c_str(), 0600), 0);
  const fs::path report = dir.path / "report.json";
  Subprocess p(ddprun({"--nproc_per_node", "1", "--report_file", report.string(), "--trace_file", trace.string(),
                       TEST_WORKER_BIN, "ready-file", (dir.path / "ran").string()}));
  const Finished f = p.wait(60s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 2) << f.err;
  EXPECT_FALSE(fs::exists(dir.path / "ran"));
  EXPECT_EQ(read_report(report)["exit_code"], 2);
}

// A link planted in a sticky, shared directory (a /tmp) where the trace goes: its target is left alone.
TEST(StuckOutputTest, ATraceFileIsNotWrittenThroughALinkPlantedInASharedDirectory) {
  TempDir dir;
  const fs::path shared = dir.path / "shared";
  fs::create_directory(shared);
  fs::permissions(shared, fs::perms::all | fs::perms::sticky_bit);
  const fs::path victim = dir.path / "victim";
  std::ofstream(victim) << "precious\n";
  fs::create_symlink(victim, shared / "trace.json");
  Subprocess p(ddprun(
      {"--nproc_per_node", "1", "--trace_file", (shared / "trace.json").string(), TEST_WORKER_BIN, "print", "1"}));
  const Finished f = p.wait(60s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 2) << f.err;
  EXPECT_EQ(read_file(victim), "precious\n");
}

// The report is replaced whole (a new file renamed over the path): a FIFO there is replaced too.
TEST(StuckOutputTest, AReportFileOnAFifoThatTakesNoWritesIsReplacedByTheReport) {
  TempDir dir;
  const fs::path report = dir.path / "report.json";
  const StuckFifo fifo(report);
  Subprocess p(ddprun({"--nproc_per_node", "1", "--report_file", report.string(), TEST_WORKER_BIN, "print", "1"}));
  const Finished f = p.wait(60s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 0) << f.err;
  EXPECT_EQ(read_report(report)["outcome"], "succeeded");
}

// The per-rank logs and the filtered copy of a restart's attempt are FIFOs nobody reads, put there
// while the first attempt runs: the restart runs, its lines go to the console instead.
TEST(StuckOutputTest, PerRankLogsOnFifosNobodyReadsGoToTheConsoleInstead) {
  TempDir dir;
  const fs::path logs = dir.path / "logs", go = dir.path / "go";
  Subprocess p(ddprun({"--nproc_per_node", "1", "--max_restarts", "1", "--log_dir", logs.string(), "--redirects", "3",
                       "--duplicate_stdout_filters", "out line", TEST_WORKER_BIN, "wait-file", go.string(),
                       "exit-if-attempt-below", "1", "3", "print", "1"}));
  fs::path run;
  ASSERT_TRUE(p.wait_for(
      [&] {
        std::error_code ec;
        for (const auto& e : fs::directory_iterator(logs, ec)) {
          if (fs::exists(e.path() / "attempt_0" / "0")) run = e.path();
        }
        return !run.empty();
      },
      60s))
      << p.err();
  fs::create_directories(run / "attempt_1" / "0");
  for (const char* name : {"attempt_1/0/stdout.log", "attempt_1/0/stderr.log", "attempt_1/filtered_stdout.log"}) {
    ASSERT_EQ(::mkfifo((run / name).c_str(), 0600), 0) << name;
  }
  std::ofstream{go};
  const Finished f = p.wait(90s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 0) << f.err;
  EXPECT_NE(f.out.find("[rank0]: out line 0\n"), std::string::npos) << f.out;
  EXPECT_NE(f.err.find("[rank0]: err line 0\n"), std::string::npos) << f.err;
}

}  // namespace
}  // namespace ddprun::test
