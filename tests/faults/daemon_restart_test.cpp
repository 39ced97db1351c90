// ddprun-rendezvous killed with SIGKILL and started again on its --state-file: the running jobs
// carry on and a node that was waiting to join joins. Before, every job ended within milliseconds
// ("lost the rendezvous store: ... closed the connection during WAIT"), and a joining node at once.
#include <signal.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/daemon.hpp"
#include "rendezvous/client/client.hpp"
#include "tests/support/ddprun_bin.hpp"
#include "tests/support/free_port.hpp"
#include "tests/support/health.hpp"
#include "tests/support/small_disk.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/wait_until.hpp"
#include "tests/support/job_node.hpp"
#include "tests/support/store_client.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;

constexpr auto kDowntime = 2s;

std::unique_ptr<Daemon> start_daemon(const std::string& state_file, uint16_t port = 0) {
  DaemonOptions o;
  if (!state_file.empty()) o.args = {"--state-file", state_file};
  if (port != 0) {
    o.args.push_back("--port");
    o.args.push_back(std::to_string(port));
  }
  return std::make_unique<Daemon>(DAEMON_BIN, o);
}

// One node of a 2-node job through the daemon; its one worker writes its pid to `ready` and sleeps.
std::unique_ptr<Subprocess> node(uint16_t port, int rank, const std::string& run_id, const std::string& ready,
                                 const std::string& seconds, const std::map<std::string, std::string>& env = {}) {
  return JobNode(rank)
      .without_rank()
      .meet(at_store(port, run_id, /*c10d=*/true))
      .conf("join_timeout=60,keep_alive_interval=1")
      .flags({"--max_restarts", "3"})
      .env(env)
      .start({TEST_WORKER_BIN, "ready-file", ready, "sleep", seconds});
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

// Killed while both nodes' workers run, back after 2 s: both nodes finish with exit 0, and the
// workers were never restarted.
TEST(DaemonRestartTest, RunningJobsFinishAcrossAKillAndRestart) {
  TempDir dir;
  const std::string state = (dir.path / "state").string();
  auto daemon = start_daemon(state);
  const uint16_t port = daemon->port();
  const std::string ready0 = (dir.path / "ready0").string(), ready1 = (dir.path / "ready1").string();
  auto n0 = node(port, 0, "survivor", ready0, "8");
  auto n1 = node(port, 1, "survivor", ready1, "8");
  // Each worker creates its file, then writes its pid: wait for the pids, not the files.
  ASSERT_TRUE(wait_until([&] { return !read_file(ready0).empty() && !read_file(ready1).empty(); }, 60s))
      << "the workers did not start\n"
      << daemon->log();
  const std::string pid0 = read_file(ready0), pid1 = read_file(ready1);
  daemon->stop(SIGKILL);
  std::this_thread::sleep_for(kDowntime);  // sleep override: the daemon's downtime
  daemon = start_daemon(state, port);
  const Finished f0 = n0->wait(120s), f1 = n1->wait(120s);
  EXPECT_EQ(f0.exit_code, 0) << f0.err;
  EXPECT_EQ(f1.exit_code, 0) << f1.err;
  EXPECT_EQ(read_file(ready0), pid0) << "node 0's worker was restarted\n" << f0.err;
  EXPECT_EQ(read_file(ready1), pid1) << "node 1's worker was restarted\n" << f1.err;
  EXPECT_NE(f0.err.find("it restarted, and kept its state"), std::string::npos) << f0.err;
  EXPECT_NE(daemon->log().find("restored"), std::string::npos) << daemon->log();
}

// A node waiting for the others when the daemon dies, and a node that arrives after it is back,
// form the job.
TEST(DaemonRestartTest, ANodeWaitingToJoinJoinsAfterARestart) {
  TempDir dir;
  const std::string state = (dir.path / "state").string();
  auto daemon = start_daemon(state);
  const uint16_t port = daemon->port();
  const int health0 = free_port();
  auto n0 = node(port, 0, "joiner", (dir.path / "ready0").string(), "0", health_env(health0));
  // Node 0 has joined round 0 and waits for node 1.
  ASSERT_TRUE(n0->wait_for(
      [&] {
        const Health h = health_of(health0);
        return h.phase == "joined" && h.round == 0;
      },
      30s))
      << n0->err();
  daemon->stop(SIGKILL);
  std::this_thread::sleep_for(kDowntime);  // sleep override: the daemon's downtime
  daemon = start_daemon(state, port);
  auto n1 = node(port, 1, "joiner", (dir.path / "ready1").string(), "0");
  const Finished f0 = n0->wait(120s), f1 = n1->wait(120s);
  EXPECT_EQ(f0.exit_code, 0) << f0.err;
  EXPECT_EQ(f1.exit_code, 0) << f1.err;
}

// A daemon that comes back without the state (no --state-file) cannot carry the job: both nodes
// stop at once and say why, instead of waiting on keys that are gone.
TEST(DaemonRestartTest, ADaemonBackWithoutItsStateEndsTheJobAndSaysWhy) {
  TempDir dir;
  auto daemon = start_daemon((dir.path / "state").string());
  const uint16_t port = daemon->port();
  const std::string ready0 = (dir.path / "ready0").string(), ready1 = (dir.path / "ready1").string();
  auto n0 = node(port, 0, "amnesia", ready0, "30");
  auto n1 = node(port, 1, "amnesia", ready1, "30");
  ASSERT_TRUE(wait_until([&] { return std::filesystem::exists(ready0) && std::filesystem::exists(ready1); }, 60s));
  daemon->stop(SIGKILL);
  std::this_thread::sleep_for(kDowntime);  // sleep override: the daemon's downtime
  daemon = start_daemon("", port);
  const Finished f0 = n0->wait(60s), f1 = n1->wait(60s);
  EXPECT_EQ(f0.exit_code, 1) << f0.err;
  EXPECT_EQ(f1.exit_code, 1) << f1.err;
  EXPECT_NE(f0.err.find("came back without the state it kept"), std::string::npos) << f0.err;
}

// The state file's disk fills up: the daemon says so once, serves on from memory, and once there is
// room again writes everything down, so that a restart after that loses nothing.
TEST(DaemonRestartTest, AFullDiskUnderTheStateFileIsSaidOnceAndCaughtUpWithLater) {
  SmallDisk disk("2m");
  if (!disk.mounted) GTEST_SKIP() << "cannot mount a tmpfs here (" << disk.error << ")";
  const std::string state = (disk.dir.path / "state").string();
  auto daemon = start_daemon(state);
  const uint16_t port = daemon->port();
  disk.fill();
  rdzv::client::Client c(test::store_client(port));
  const std::string value(64 * 1024, 'v');
  for (int i = 0; i < 20; ++i) c.set("/ddprun/full/k" + std::to_string(i), value);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(c.get("/ddprun/full/k" + std::to_string(i)), value);  // served on
  EXPECT_EQ(daemon->log_count("cannot write the state file " + state), 1u) << daemon->log();
  std::filesystem::remove(disk.dir.path / "filler");
  EXPECT_NE(daemon->log_with("is written again", 20s).find("is written again"), std::string::npos) << daemon->log();
  daemon->stop(SIGKILL);
  daemon = start_daemon(state, port);
  rdzv::client::Client after(test::store_client(port));
  for (int i = 0; i < 20; ++i) EXPECT_EQ(after.get("/ddprun/full/k" + std::to_string(i), 2s), value);
}

}  // namespace
}  // namespace ddprun::test
