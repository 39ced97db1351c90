// torchelastic's file timer (launcher/watchdog/file_timer).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "launcher/watchdog/file_timer.hpp"
#include "tests/support/temp_dir.hpp"

namespace ddprun::launcher {

using watchdog::FileTimerServer;
using watchdog::TimerExpiry;
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

void send_line(const std::string& fifo, const std::string& line) {
  // As FileTimerClient does: non-blocking open for writing, one write of the line, close.
  const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
  ASSERT_GE(fd, 0) << "the server must hold the FIFO open for reading";
  const std::string data = line + "\n";
  ASSERT_EQ(::write(fd, data.data(), data.size()), static_cast<ssize_t>(data.size()));
  ::close(fd);
}

double wall_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

TEST(FileTimerTest, AnExpiredTimerIsReportedThenSignalledAndAReleasedOneIsNot) {
  test::TempDir dir;
  const pid_t worker = ::fork();
  if (worker == 0) {
    ::pause();
    ::_exit(0);
  }
  std::mutex m;
  std::vector<std::pair<std::string, int>> expired;  // (scope, rank), in the order reported
  {
    FileTimerServer server((dir.path / "timer").string(), [&](pid_t pid) { return pid == worker ? 7 : -1; },
                           [&](const TimerExpiry& t, int rank) {
                             std::lock_guard lock(m);
                             expired.emplace_back(t.scope, rank);
                           });
    const std::string fifo = (dir.path / "timer").string();
    EXPECT_TRUE(fs::is_fifo(fifo));
    // "a" is released well before it would expire, and expires before "train_step" does: had the
    // release been lost, "a" would be reported (and the worker signalled) first.
    const double now = wall_now();
    send_line(fifo, R"({"version":1,"pid":)" + std::to_string(worker) + R"(,"scope_id":"a","expiration_time":)" +
                        std::to_string(now + 1.0) + R"(,"signal":15})");
    send_line(fifo, R"({"version":1,"pid":)" + std::to_string(worker) +
                        R"(,"scope_id":"a","expiration_time":-1,"signal":0})");
    // A timer naming a process that is not a worker (this test) is refused, not signalled.
    send_line(fifo, R"({"version":1,"pid":)" + std::to_string(::getpid()) + R"(,"scope_id":"x","expiration_time":)" +
                        std::to_string(now - 1) + R"(,"signal":9})");
    send_line(fifo, R"({"version":1,"pid":)" + std::to_string(worker) +
                        R"(,"scope_id":"train_step","expiration_time":)" + std::to_string(now + 1.5) +
                        R"(,"signal":15})");
    int status = 0;
    ASSERT_EQ(::waitpid(worker, &status, 0), worker);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
    EXPECT_GE(wall_now(), now + 1.5) << "signalled at its expiry, not before";
    std::lock_guard lock(m);
    EXPECT_EQ(expired, (std::vector<std::pair<std::string, int>>{{"train_step", 7}}));
    EXPECT_EQ(server.requests(), 4u);
  }
  EXPECT_FALSE(fs::exists(dir.path / "timer")) << "the FIFO is removed with the server";
}

TEST(FileTimerTest, MalformedRequestsAreRefusedWithAReason) {
  test::TempDir dir;
  FileTimerServer server((dir.path / "t").string(), [](pid_t) { return -1; }, [](const TimerExpiry&, int) {});
  EXPECT_EQ(server.handle_line("{not json"), "not a JSON object");
  EXPECT_NE(server.handle_line(R"({"pid":"1","scope_id":"s","expiration_time":1})"), "");
  EXPECT_NE(server.handle_line(R"({"pid":-4,"scope_id":"s","expiration_time":1})"), "");
  EXPECT_NE(server.handle_line(R"({"pid":4,"scope_id":"s","expiration_time":1,"signal":99})"), "");
  EXPECT_EQ(server.handle_line(R"({"version":1,"pid":4,"scope_id":"s","expiration_time":1e18,"signal":9})"), "");
}

}  // namespace
}  // namespace ddprun::launcher
