// A bounded chaos soak (label soak): rounds of several two-node jobs on one ddprun-rendezvous
// (with --state-file), each job dealt a fault drawn at random (none, a failing worker, an agent
// killed, stopped for a moment, or told to stop), and now and then the daemon itself killed with
// SIGKILL and started again. Checked at the end of each round and of the soak:
//   - every node of every job ended with the exit code its fault calls for, and a failure was
//     reported once on each node;
//   - no process of the soak is left (workers of killed agents are stopped by their guards);
//   - once the jobs are over and the daemon's --job-ttl has passed, no key is left;
//   - the daemon's memory is flat over the rounds.
// DDPRUN_SOAK_SECONDS (default 180) bounds it; DDPRUN_SOAK_SEED replays a draw (the seed is printed).
#include <signal.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/client/client.hpp"
#include "tests/support/daemon.hpp"
#include "tests/support/ddprun_bin.hpp"
#include "tests/support/processes.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/wait_until.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;

enum class Fault { None, WorkerFails, AgentKilled, AgentPaused, AgentStopped };

const char* fault_name(Fault f) {
  switch (f) {
    case Fault::None: return "none";
    case Fault::WorkerFails: return "rank 1 fails (exit 3)";
    case Fault::AgentKilled: return "the second node's ddprun killed (SIGKILL)";
    case Fault::AgentPaused: return "the second node's ddprun paused 1 s (SIGSTOP)";
    case Fault::AgentStopped: return "the second node's ddprun stopped (SIGTERM)";
  }
  return "?";
}

// What each node of a job must exit with under `f` (-1: not checked, the test killed it).
std::pair<int, int> expected_exits(Fault f) {
  switch (f) {
    case Fault::None:
    case Fault::AgentPaused: return {0, 0};
    case Fault::WorkerFails: return {3, 3};
    case Fault::AgentKilled: return {1, -1};  // node 0 waits join_timeout for a replacement
    case Fault::AgentStopped: return {128 + SIGTERM, 128 + SIGTERM};
  }
  return {0, 0};
}

struct Job {
  std::string id;
  Fault fault = Fault::None;
  std::unique_ptr<Subprocess> node[2];
};

class Soak {
 public:
  Soak() : state_((dir_.path / "state").string()), runs_(dir_.path / "runs") {
    std::filesystem::create_directories(runs_);
    start_daemon(0);
  }

  void start_daemon(uint16_t port) {
    DaemonOptions o;
    o.args = {"--state-file", state_, "--job-ttl", "3"};
    if (port != 0) {
      o.args.push_back("--port");
      o.args.push_back(std::to_string(port));
    }
    daemon_ = std::make_unique<Daemon>(DAEMON_BIN, o);
  }
  void restart_daemon() {
    const uint16_t port = daemon_->port();
    daemon_->stop(SIGKILL);
    std::this_thread::sleep_for(1s);  // sleep override: the daemon's downtime
    daemon_.reset();
    start_daemon(port);
  }
  Daemon& daemon() { return *daemon_; }
  // In the command line of every job's agents and workers (not the daemon's).
  std::string tag() const { return runs_.string() + "/"; }

  std::unique_ptr<Subprocess> node(const std::string& id, int n, Fault f) {
    std::vector<std::string> argv{ddprun_bin(), "--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                                  "127.0.0.1:" + std::to_string(daemon_->port()), "--rdzv_id", id, "--rdzv_conf",
                                  "join_timeout=8,last_call_timeout=1,keep_alive_interval=2", TEST_WORKER_BIN,
                                  // tag() in every agent's and worker's command line: a
                                  // leftover process is found by it.
                                  "ready-file", tag() + id + "-" + std::to_string(n)};
    // Ranks go by arrival: whichever node holds rank 1 sees it fail.
    if (f == Fault::WorkerFails) argv.insert(argv.end(), {"exit-if-rank", "1", "3"});
    argv.insert(argv.end(), {"sleep", "4"});
    return std::make_unique<Subprocess>(argv);
  }

 private:
  TempDir dir_;
  std::string state_;
  std::filesystem::path runs_;
  std::unique_ptr<Daemon> daemon_;
};

TEST(ChaosSoakTest, JobsOnOneDaemonEndAsTheirFaultsSayAndLeaveNothingBehind) {
  const char* seconds_env = std::getenv("DDPRUN_SOAK_SECONDS");
  const auto budget = std::chrono::seconds(seconds_env ? std::atoi(seconds_env) : 180);
  const char* seed_env = std::getenv("DDPRUN_SOAK_SEED");
  const unsigned seed = seed_env ? static_cast<unsigned>(std::strtoul(seed_env, nullptr, 10)) : std::random_device{}();
  std::cout << "chaos soak: seed " << seed << " (DDPRUN_SOAK_SEED replays it), " << budget.count() << " s\n";
  std::mt19937 rng(seed);
  Soak soak;
  const std::string tag = soak.tag();
  const auto start = std::chrono::steady_clock::now();
  uint64_t rss_after_first = 0;
  int rounds = 0, jobs = 0, daemon_kills = 0;
  constexpr int kJobsPerRound = 3;
  constexpr int kMaxRounds = 40;  // a bound besides the time
  while (std::chrono::steady_clock::now() - start < budget && rounds < kMaxRounds) {
    ++rounds;
    std::vector<Job> round(kJobsPerRound);
    for (int j = 0; j < kJobsPerRound; ++j) {
      Job& job = round[static_cast<size_t>(j)];
      job.id = "soak-" + std::to_string(rounds) + "-" + std::to_string(j);
      job.fault = static_cast<Fault>(std::uniform_int_distribution<int>(0, 4)(rng));
      for (int n = 0; n < 2; ++n) job.node[n] = soak.node(job.id, n, job.fault);
    }
    const bool kill_daemon = std::uniform_int_distribution<int>(0, 2)(rng) == 0;
    for (Job& job : round) {
      for (auto& n : job.node) {
        ASSERT_TRUE(n->wait_for_output("started 1 worker", 60s))
            << "seed " << seed << ", job " << job.id << " did not start:\n"
            << n->err();
      }
    }
    for (Job& job : round) {
      Subprocess& victim = *job.node[1];
      switch (job.fault) {
        case Fault::AgentKilled: victim.signal(SIGKILL); break;
        case Fault::AgentStopped: victim.signal(SIGTERM); break;
        case Fault::AgentPaused:
          victim.signal(SIGSTOP);
          std::this_thread::sleep_for(1s);  // sleep override: how long the agent is frozen
          victim.signal(SIGCONT);
          break;
        default: break;
      }
    }
    if (kill_daemon) {
      ++daemon_kills;
      soak.restart_daemon();
    }
    for (Job& job : round) {
      ++jobs;
      const auto [want0, want1] = expected_exits(job.fault);
      const Finished f0 = job.node[0]->wait(90s), f1 = job.node[1]->wait(90s);
      const std::string what = "seed " + std::to_string(seed) + ", round " + std::to_string(rounds) + ", job " +
                               job.id + ", fault: " + fault_name(job.fault) +
                               (kill_daemon ? ", daemon killed and restarted" : "");
      EXPECT_EQ(f0.exit_code, want0) << what << "\nnode 0:\n" << f0.err;
      if (want1 >= 0) {
        EXPECT_EQ(f1.exit_code, want1) << what << "\nnode 1:\n" << f1.err;
      }
      if (job.fault == Fault::WorkerFails) {
        for (const Finished* f : {&f0, &f1}) {
          const size_t first = f->err.find("Root cause");
          EXPECT_NE(first, std::string::npos) << what << "\n" << f->err;
          if (first != std::string::npos) {
            EXPECT_EQ(f->err.find("Root cause", first + 1), std::string::npos) << what << ": two reports\n" << f->err;
          }
        }
      }
    }
    // Every process of the round is gone (a killed agent's workers are stopped by its guard).
    std::vector<std::string> left;
    EXPECT_TRUE(wait_until([&] { return (left = processes_mentioning(tag)).empty(); }, 15s))
        << "seed " << seed << ", round " << rounds << ": " << left.size() << " process(es) left, e.g. "
        << (left.empty() ? std::string() : left.front());
    if (rounds == 1) rss_after_first = soak.daemon().rss_kib();
    if (::testing::Test::HasFailure()) break;
  }
  std::cout << "chaos soak: " << rounds << " rounds, " << jobs << " jobs, the daemon killed " << daemon_kills
            << " time(s)\n";
  // Nothing of any job is left once the TTL (3 s) has passed.
  rdzv::client::ClientOptions co;
  co.port = soak.daemon().port();
  co.connect_timeout = 10s;
  co.timeout = 10s;
  rdzv::client::Client c(co);
  int64_t keys = -1;
  EXPECT_TRUE(wait_until([&] { return (keys = c.num_keys()) == 0; }, 30s))
      << "seed " << seed << ": " << keys << " key(s) left after the jobs' TTL: " << [&] {
           std::string names;
           for (const auto& k : c.list()) names += k + " ";
           return names;
         }();
  // Memory is flat: the rounds after the first (restarts reset it; what is left grows with a leak).
  const uint64_t rss_end = soak.daemon().rss_kib();
  EXPECT_LE(rss_end, rss_after_first + 16 * 1024)
      << "daemon RSS grew from " << rss_after_first << " KiB to " << rss_end << " KiB over " << rounds << " rounds";
  EXPECT_TRUE(soak.daemon().alive());
}

}  // namespace
}  // namespace ddprun::test
