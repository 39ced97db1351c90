// A bounded soak of hot spares (label soak): one `--nnodes 2:2` job through ddprun-rendezvous with
// two spares, its agents dealt events drawn at random while the world is whole: an agent of the
// world or a spare SIGKILLed (a new agent started at once, as a scheduler would), or paused with
// SIGSTOP for a moment or for longer than the keep-alive window (it is then counted as lost, comes
// back and waits as a spare). Checked:
//   - after every event the world is whole again (two agents running workers) within 60 s: a
//     spare took a lost node's place, and nothing a spare did ended the job;
//   - at the end, the workers let finish, every agent still alive ends 0 with the job;
//   - no process of the soak is left.
// DDPRUN_SOAK_EVENTS (default 40) sets the events, DDPRUN_SOAK_SEED replays a draw (the seed is
// printed with every failure).
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/daemon.hpp"
#include "tests/support/job_node.hpp"
#include "tests/support/processes.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/wait_until.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;

class SpareSoak {
 public:
  SpareSoak() : tag_("spare-soak-" + std::to_string(::getpid())), done_((dir_.path / "done").string()) {}

  // A new agent of the job (a host of its own, 127.0.0.N).
  void start_agent() {
    const std::vector<std::string> program{"/bin/sh", "-c",
                                           "while [ ! -e " + done_ + " ]; do sleep 0.1; done; : " + tag_};
    agents_.push_back(
        JobNode(next_host_++ % 250)
            .nnodes("2:2")
            .without_rank()
            .meet(at_store(daemon_.port(), "spare-soak", /*c10d=*/true))
            .conf("join_timeout=60,last_call_timeout=0.5,keep_alive_interval=0.5,keep_alive_max_attempt=6")
            .flags({"--nproc_per_node", "1", "--max_restarts", "0"})
            .start(program));
  }
  // Reads what the agents wrote so far (their consoles never fill a pipe).
  void pump() {
    for (auto& a : agents_) a->wait_for_output(std::string(1, '\x01'), 1ms);
  }
  // The agents running workers now (the world), and the others (spares, or agents on their way).
  std::vector<size_t> with_workers(bool in_world) const {
    std::vector<size_t> found;
    for (size_t i = 0; i < agents_.size(); ++i)
      if ((agents_[i]->worker_count() > 0) == in_world) found.push_back(i);
    return found;
  }
  bool world_whole(std::chrono::milliseconds timeout) {
    return wait_until(
        [&] {
          pump();
          return with_workers(true).size() == 2;
        },
        timeout, 50ms);
  }
  void kill_and_replace(size_t i) {
    agents_[i]->signal(SIGKILL);
    agents_[i]->wait(10s);
    agents_.erase(agents_.begin() + static_cast<std::ptrdiff_t>(i));
    start_agent();
  }
  void pause(size_t i, std::chrono::milliseconds how_long) {
    agents_[i]->signal(SIGSTOP);
    std::this_thread::sleep_for(how_long);  // sleep override: the pause is the event
    agents_[i]->signal(SIGCONT);
  }
  void let_finish() { std::ofstream(done_).close(); }
  std::vector<std::unique_ptr<Subprocess>>& agents() { return agents_; }
  const std::string& tag() const { return tag_; }

 private:
  TempDir dir_;
  Daemon daemon_{DAEMON_BIN};
  std::string tag_, done_;
  int next_host_ = 0;
  std::vector<std::unique_ptr<Subprocess>> agents_;
};

TEST(SpareSoakTest, KillsAndPausesOfSparesAndWorldNodesNeverEndTheJob) {
  const char* events_env = std::getenv("DDPRUN_SOAK_EVENTS");
  const int events = events_env ? std::atoi(events_env) : 40;
  const char* seed_env = std::getenv("DDPRUN_SOAK_SEED");
  const unsigned seed = seed_env ? static_cast<unsigned>(std::strtoul(seed_env, nullptr, 10)) : std::random_device{}();
  std::cout << "spare soak: seed " << seed << " (DDPRUN_SOAK_SEED replays it), " << events << " events\n";
  std::mt19937 rng(seed);
  auto draw = [&](int below) { return static_cast<int>(rng() % static_cast<unsigned>(below)); };

  SpareSoak soak;
  for (int i = 0; i < 4; ++i) soak.start_agent();
  ASSERT_TRUE(soak.world_whole(60s)) << "seed " << seed << ": the job did not start";
  int kills = 0, pauses = 0, long_pauses = 0;
  for (int e = 0; e < events; ++e) {
    const bool world = draw(2) == 0;
    const std::vector<size_t> pool = soak.with_workers(world);
    if (pool.empty()) continue;
    const size_t who = pool[static_cast<size_t>(draw(static_cast<int>(pool.size())))];
    const int kind = draw(10);
    std::string what;
    if (kind < 6) {
      what = std::string("SIGKILL of ") + (world ? "a world node" : "a spare");
      soak.kill_and_replace(who);
      ++kills;
    } else if (kind < 9) {
      const auto ms = std::chrono::milliseconds(100 + draw(1400));
      what = "a pause of " + std::to_string(ms.count()) + " ms of " + (world ? "a world node" : "a spare");
      soak.pause(who, ms);
      ++pauses;
    } else {
      what = std::string("a pause of 5 s (past the keep-alive window) of ") + (world ? "a world node" : "a spare");
      soak.pause(who, 5s);
      ++long_pauses;
    }
    ASSERT_TRUE(soak.world_whole(60s)) << "seed " << seed << ", event " << e << " (" << what
                                       << "): the world was not whole again within 60 s";
  }
  std::cout << "spare soak: " << kills << " kills, " << pauses << " short pauses, " << long_pauses
            << " long pauses; the world was whole after each\n";

  soak.let_finish();
  for (auto& a : soak.agents()) {
    const Finished f = a->wait(90s);
    EXPECT_EQ(f.exit_code, 0) << "seed " << seed << ": an agent alive at the end did not end 0 with the job\n" << f.err;
  }
  std::vector<std::string> left;
  EXPECT_TRUE(wait_until([&] { return (left = processes_mentioning(soak.tag())).empty(); }, 15s))
      << "seed " << seed << ": " << left.size() << " process(es) left, e.g. " << (left.empty() ? "" : left.front());
}

}  // namespace
}  // namespace ddprun::test
