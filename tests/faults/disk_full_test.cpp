// A full disk under --log_dir: a small tmpfs, filled by a worker during the run or before it.
// ddprun keeps supervising, names the file it could not write, and loses no output: what could
// not go to a file goes to the console.
#include <sys/mount.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/ddprun_bin.hpp"
#include "tests/support/small_disk.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + what.size())) ++n;
  return n;
}

// The worker's output fills the log directory, then it fails; the restarts find the disk full.
// Before: the restart mapped a sparse progress file and ddprun died of SIGBUS (exit 135, no
// report), and output sent to the log file only was lost.
TEST(DiskFullTest, AWorkerThatFillsTheLogDirectoryFailsWithItsOwnExitCodeAndLosesNoOutput) {
  SmallDisk disk("1m");
  if (!disk.mounted) GTEST_SKIP() << "cannot mount a tmpfs here (" << disk.error << ")";
  Subprocess p({ddprun_bin(), "--nproc_per_node", "1", "--max_restarts", "2", "--log_dir", disk.dir.str(),
                "--redirects", "3", TEST_WORKER_BIN, "flood", "2", "print", "2", "exit-if-rank", "0", "3"});
  const Finished f = p.wait(120s);
  ASSERT_FALSE(f.timed_out);
  EXPECT_EQ(f.signal, 0);
  EXPECT_EQ(f.exit_code, 3) << f.err.substr(0, 4000);
  EXPECT_NE(f.err.find("Root cause (first failure)"), std::string::npos);
  EXPECT_NE(f.err.find("giving up after 2 restart(s)"), std::string::npos);
  // Redirected to files only, yet every attempt's last lines reach the console.
  EXPECT_EQ(count(f.out, "[rank0]: out line 1\n"), 3u);
  EXPECT_EQ(count(f.err, "[rank0]: rank 0 exiting with 3\n"), 3u);
  // The warnings name the rank and the file, not the console prefix.
  EXPECT_NE(f.err.find("cannot write rank 0's log file " + disk.dir.str()), std::string::npos);
  EXPECT_NE(f.err.find("/attempt_0/0/stdout.log: No space left on device"), std::string::npos);
  EXPECT_NE(f.err.find("rank 0 runs without a progress page: cannot reserve"), std::string::npos);
  EXPECT_NE(f.err.find("/attempt_1/0/progress: No space left on device"), std::string::npos);
}

// The disk is full before the job starts: the job runs, hang detection included, and its output
// is on the console.
TEST(DiskFullTest, ALogDirectoryFullBeforeTheRunStillRunsTheJob) {
  SmallDisk disk("256k");
  if (!disk.mounted) GTEST_SKIP() << "cannot mount a tmpfs here (" << disk.error << ")";
  disk.fill();
  Subprocess p({ddprun_bin(), "--nproc_per_node", "2", "--hang_timeout", "30", "--log_dir", disk.dir.str(), "--tee",
                "3", TEST_WORKER_BIN, "print", "2"});
  const Finished f = p.wait(120s);
  ASSERT_FALSE(f.timed_out);
  EXPECT_EQ(f.exit_code, 0) << f.err.substr(0, 4000);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string prefix = "[rank" + std::to_string(rank) + "]: ";
    EXPECT_NE(f.out.find(prefix + "out line 1\n"), std::string::npos) << f.out;
    EXPECT_NE(f.err.find(prefix + "err line 1\n"), std::string::npos);
    EXPECT_NE(f.err.find("rank " + std::to_string(rank) + " runs without a progress page"), std::string::npos);
  }
}

}  // namespace
}  // namespace ddprun::test
