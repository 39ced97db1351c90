// A worker's error file (TORCHELASTIC_ERROR_FILE) that is not the regular file a worker writes: a
// FIFO nobody writes, a link to another file or to /dev/zero, a file far larger than any error.
// ddprun supervises, restarts and reports as it does without it, reads nothing through a link, and
// keeps a bounded part of what it reads.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/ddprun_bin.hpp"
#include "tests/support/report.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"

namespace ddprun::test {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// The workers of the first attempt put a FIFO at their error file and fail: opening it to read
// waits for a writer that never comes, unless the open does not wait.
TEST(ErrorFileTest, AnErrorFileThatIsAFifoNobodyWritesHoldsNeitherTheRestartNorTheEnd) {
  TempDir dir;
  const fs::path report = dir.path / "report.json";
  Subprocess p(ddprun({"--nproc_per_node", "2", "--max_restarts", "1", "--report_file", report.string(),
                       TEST_WORKER_BIN, "error-file-as", "fifo", "exit-if-attempt-below", "1", "3", "print", "1"}));
  const Finished f = p.wait(90s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 0) << f.err;
  const auto r = read_report(report);
  ASSERT_TRUE(r.is_object()) << f.err;
  EXPECT_EQ(r["outcome"], "succeeded") << r.dump(2);
  EXPECT_EQ(r["restarts"], 1) << r.dump(2);
}

// The same FIFO, one rank failing and the other running on: the other is stopped, and ddprun ends.
TEST(ErrorFileTest, AnErrorFileThatIsAFifoNobodyWritesLetsTheOtherRanksBeStopped) {
  TempDir dir;
  const fs::path report = dir.path / "report.json";
  Subprocess p(ddprun({"--nproc_per_node", "2", "--report_file", report.string(), TEST_WORKER_BIN, "error-file-as",
                       "fifo", "exit-if-rank", "0", "3", "wait-signal"}));
  const Finished f = p.wait(90s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 3) << f.err;
  const auto r = read_report(report);
  ASSERT_TRUE(r.is_object()) << f.err;
  EXPECT_EQ(r["root_cause"]["rank"], 0) << r.dump(2);
  EXPECT_TRUE(r["root_cause"]["error"].is_null()) << r.dump(2);
}

// A link to a file the worker did not write (another user's, a secret of the host's): ddprun does
// not read it, so its text reaches neither the report nor the console nor the other nodes.
TEST(ErrorFileTest, AnErrorFileThatIsALinkIsNotReadThroughIt) {
  TempDir dir;
  const fs::path other = dir.path / "someone_elses.json";
  std::ofstream(other) << R"({"message": "the contents of someone else's file"})";
  const fs::path report = dir.path / "report.json";
  Subprocess p(ddprun({"--nproc_per_node", "1", "--report_file", report.string(), TEST_WORKER_BIN, "error-file-as",
                       "link", other.string(), "exit-if-rank", "0", "3"}));
  const Finished f = p.wait(60s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 3) << f.err;
  const auto r = read_report(report);
  ASSERT_TRUE(r.is_object()) << f.err;
  EXPECT_EQ(r["root_cause"]["rank"], 0) << r.dump(2);
  EXPECT_TRUE(r["root_cause"]["error"].is_null()) << r.dump(2);
  EXPECT_EQ(f.err.find("someone else's"), std::string::npos) << f.err;
}

// A link to /dev/zero: endless bytes, read without a bound, would take all the memory there is.
TEST(ErrorFileTest, AnErrorFileLinkedToDevZeroIsNotRead) {
  TempDir dir;
  const fs::path report = dir.path / "report.json";
  Subprocess p(ddprun({"--nproc_per_node", "1", "--report_file", report.string(), TEST_WORKER_BIN, "error-file-as",
                       "link", "/dev/zero", "exit-if-rank", "0", "3"}));
  const Finished f = p.wait(60s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 3) << f.err;
  const auto r = read_report(report);
  ASSERT_TRUE(r.is_object()) << f.err;
  EXPECT_TRUE(r["root_cause"]["error"].is_null()) << r.dump(2);
}

// An error file of 4 MiB: what ddprun keeps of it is bounded, and it says the error was cut.
TEST(ErrorFileTest, AHugeErrorFileIsCutAndSaysSo) {
  TempDir dir;
  const fs::path report = dir.path / "report.json";
  Subprocess p(ddprun({"--nproc_per_node", "1", "--report_file", report.string(), TEST_WORKER_BIN, "error-file-as",
                       "big", "4", "exit-if-rank", "0", "3"}));
  const Finished f = p.wait(60s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 3) << f.err;
  const auto r = read_report(report);
  ASSERT_TRUE(r.is_object()) << f.err;
  const auto& error = r["root_cause"]["error"];
  ASSERT_TRUE(error.is_string()) << r.dump(2).substr(0, 4000);
  const std::string text = error.get<std::string>();
  EXPECT_LT(text.size(), size_t{1} << 20);
  EXPECT_NE(text.find("RuntimeError: xxx"), std::string::npos) << text.substr(0, 200);
  EXPECT_NE(text.find("cut"), std::string::npos) << text.substr(0, 200);
}

}  // namespace
}  // namespace ddprun::test
