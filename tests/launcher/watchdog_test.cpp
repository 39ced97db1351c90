// The Watchdog (launcher/watchdog/watchdog) on its own, in this process, over real processes: a
// group whose ranks make no progress for --hang_timeout is a hang, diagnosed with the ranks'
// stacks; a rank that computes, or that bumps its progress page, is never one. Outcomes are
// checked (the round's end, the files written), never sentences.
#include "launcher/watchdog/watchdog.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <optional>

#include "ddprun/worker/progress_page.hpp"
#include "launcher/workers/process.hpp"
#include "rendezvous/client/client.hpp"
#include "rendezvous/server/server.hpp"
#include "tests/support/store_client.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/latest.hpp"
#include "tests/support/wait_until.hpp"

namespace ddprun::launcher {

using rendezvous::RoundEnd;
using watchdog::Watchdog;
using watchdog::WatchdogSettings;
using watchdog::WatchedRank;
using workers::spawn_process;
using workers::SpawnedProcess;
using workers::SpawnRequest;
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// Processes started for the test, killed (with their groups) at the end.
struct Processes {
  std::vector<pid_t> pids;
  pid_t start(const std::vector<std::string>& argv) {
    SpawnRequest r;
    r.argv = argv;
    r.envp = {"PATH=/usr/bin:/bin"};
    const SpawnedProcess p = spawn_process(r);  // (its pipes close as p goes)
    pids.push_back(p.pid);
    return p.pid;
  }
  ~Processes() {
    for (pid_t p : pids) ::kill(-p, SIGKILL);
    for (pid_t p : pids) ::waitpid(p, nullptr, 0);
  }
};

struct Group {
  test::TempDir dir;
  WatchdogSettings settings;
  std::vector<WatchedRank> ranks;
  explicit Group(int n, std::chrono::milliseconds hang_timeout) {
    settings.hang_timeout = hang_timeout;
    settings.tick = 100ms;
    settings.stack_limit = 5s;
    settings.host = "host-a";
    settings.program = "sleep";
    settings.attempt_dir = dir.str();
    for (int r = 0; r < n; ++r) {
      const std::string d = dir.str() + "/" + std::to_string(r);
      fs::create_directories(d);
      ranks.push_back({r, r, d});
    }
  }
};

// What on_hang reported, if anything.
using Hang = test::Latest<RoundEnd>;

TEST(WatchdogTest, RanksWithoutProgressForTheTimeoutAreAHangDiagnosedWithTheirStacks) {
  Group g(2, 2s);
  Watchdog w(g.settings, g.ranks);
  Processes p;
  const std::vector<pid_t> pids{p.start({"sleep", "60"}), p.start({"sleep", "60"})};
  Hang hang;
  w.start(pids, nullptr, nullptr, hang.sink(), [] { return true; });
  ASSERT_TRUE(test::wait_until([&] { return hang.get().has_value(); }, 60s)) << "no hang was diagnosed";
  const RoundEnd end = *hang.get();
  EXPECT_EQ(end.kind, RoundEnd::Kind::Hang);
  EXPECT_FALSE(end.report.empty());
  EXPECT_TRUE(w.wrote_diagnosis());
  w.stop();
}

TEST(WatchdogTest, ARankThatComputesIsNeverAHang) {
  Group g(1, 1s);
  Watchdog w(g.settings, g.ranks);
  Processes p;
  const std::vector<pid_t> pids{p.start({"/bin/sh", "-c", "while :; do :; done"})};
  Hang hang;
  w.start(pids, nullptr, nullptr, hang.sink(), [] { return true; });
  // Four timeouts of CPU time and no other sign of progress.
  EXPECT_FALSE(test::wait_until([&] { return hang.get().has_value(); }, 4s, 100ms));
  w.stop();
  EXPECT_FALSE(w.wrote_diagnosis());
}

TEST(WatchdogTest, ARankThatBumpsItsProgressPageIsNeverAHang) {
  Group g(1, 1s);
  Watchdog w(g.settings, g.ranks);
  Processes p;
  const std::vector<pid_t> pids{p.start({"sleep", "60"})};  // no CPU: only the page shows progress
  const int fd = ::open(w.progress_file(0).c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << w.progress_file(0);
  void* map = ::mmap(nullptr, sizeof(worker::ProgressPage), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  ASSERT_NE(map, MAP_FAILED);
  auto* page = static_cast<worker::ProgressPage*>(map);
  EXPECT_EQ(page->magic.load(), worker::ProgressPage::kMagic);
  Hang hang;
  w.start(pids, nullptr, nullptr, hang.sink(), [] { return true; });
  const bool hung = test::wait_until(
      [&] {
        page->beats.fetch_add(1);
        return hang.get().has_value();
      },
      4s, 200ms);
  EXPECT_FALSE(hung);
  w.stop();
  ::munmap(map, sizeof(worker::ProgressPage));
}

// Before: a heartbeat key of any rank up to 2^24 was taken for one, and kept for the round: a peer of
// the worker store that wrote keys for made-up ranks grew the watchdog's maps without bound (a
// million of them: 275 MB), and a single one turned CPU time off as a sign of progress for every
// rank. Only the round's ranks count now: the computing rank here is still seen to progress.
TEST(WatchdogTest, HeartbeatsOfRanksOutsideTheRoundAreIgnored) {
  Group g(1, 1s);
  g.settings.world_size = 1;
  Watchdog w(g.settings, g.ranks);
  rdzv::server::ServerOptions so;
  so.log_lifecycle = false;
  rdzv::server::ServerThread store(so);
  Processes p;
  const std::vector<pid_t> pids{p.start({"/bin/sh", "-c", "while :; do :; done"})};
  Hang hang;
  w.start(pids, &store, nullptr, hang.sink(), [] { return true; });
  {
    rdzv::client::Client c(test::store_client(store.port()));
    for (int rank : {1, 2, 1000, 1 << 24}) c.add("/worker/attempt_0/ddprun/progress/" + std::to_string(rank), 1);
  }
  // Four timeouts after the last change to the store: CPU time still counts for the computing rank.
  EXPECT_FALSE(test::wait_until([&] { return hang.get().has_value(); }, 4s, 100ms));
  w.stop();
  EXPECT_FALSE(w.wrote_diagnosis());
}

}  // namespace
}  // namespace ddprun::launcher
