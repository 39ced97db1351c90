// Several ddprun processes on this machine acting as the nodes of one job (static rendezvous),
// each with its own --local_addr on 127.0.0.x.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "rendezvous/client/client.hpp"
#include "tests/support/daemon.hpp"
#include "tests/support/free_port.hpp"
#include "tests/support/health.hpp"
#include "tests/support/report.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/wait_until.hpp"
#include "tests/support/job_node.hpp"
#include "tests/support/store_client.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;

// A port free right now, for --master_port (node 0 must listen on a port the others know).
// Node `rank` of a static job of `nnodes` whose node 0 hosts the store on `port`, with `nproc`
// workers running the test worker with `worker_args`.
std::unique_ptr<Subprocess> node(int port, int rank, int nproc, std::vector<std::string> extra,
                                 std::vector<std::string> worker_args, int nnodes = 2,
                                 const std::map<std::string, std::string>& env = {}) {
  worker_args.insert(worker_args.begin(), TEST_WORKER_BIN);
  return JobNode(rank)
      .nnodes(nnodes)
      .meet(at_master(port))
      .conf("join_timeout=30")
      .flags({"--nproc_per_node", std::to_string(nproc)})
      .flags(extra)
      .env(env)
      .start(worker_args);
}

// Heartbeats every 0.2 s, so liveness is judged in well under a second.
std::vector<std::string> fast_heartbeat() { return {"--rdzv_conf", "join_timeout=30,keep_alive_interval=0.2"}; }

std::map<std::string, std::string> env_of(const TempDir& dir, int rank) {
  std::map<std::string, std::string> env;
  std::ifstream in(dir.path / ("env." + std::to_string(rank)));
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

TEST(MultiNodeTest, NodesWithDifferentNprocGetContiguousRanksAndOneWorkerStore) {
  TempDir dir;
  const int port = free_port();
  auto n0 = node(port, 0, 1, {}, {"env", dir.str(), "store-barrier"});
  auto n1 = node(port, 1, 3, {}, {"env", dir.str(), "store-barrier"});
  const Finished f1 = n1->wait(60s), f0 = n0->wait(60s);
  ASSERT_EQ(f0.exit_code, 0) << f0.err;
  ASSERT_EQ(f1.exit_code, 0) << f1.err;
  const auto e0 = env_of(dir, 0);
  for (int r = 0; r < 4; ++r) {
    const auto e = env_of(dir, r);
    EXPECT_EQ(e.at("RANK"), std::to_string(r));
    EXPECT_EQ(e.at("WORLD_SIZE"), "4");
    EXPECT_EQ(e.at("GROUP_WORLD_SIZE"), "2");
    EXPECT_EQ(e.at("GROUP_RANK"), r == 0 ? "0" : "1");
    EXPECT_EQ(e.at("LOCAL_RANK"), std::to_string(r == 0 ? 0 : r - 1));
    EXPECT_EQ(e.at("LOCAL_WORLD_SIZE"), r == 0 ? "1" : "3");
    EXPECT_EQ(e.at("MASTER_ADDR"), "127.0.0.1");
    EXPECT_EQ(e.at("MASTER_PORT"), e0.at("MASTER_PORT"));
    EXPECT_NE(e.at("MASTER_PORT"), std::to_string(port)) << "workers get their own store";
  }
}

TEST(MultiNodeTest, FailureOnOneNodeStopsEveryNodeWithOneRootCause) {
  Reports reports;
  const int port = free_port();
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int n = 0; n < 2; ++n) {
    nodes.push_back(
        node(port, n, 2, reports.flags(n, {"--shutdown_timeout", "10"}), {"exit-if-rank", "3", "6", "sleep", "60"}));
  }
  const Finished f0 = nodes[0]->wait(60s), f1 = nodes[1]->wait(60s);
  for (int n = 0; n < 2; ++n) {
    const Finished& f = n == 0 ? f0 : f1;
    EXPECT_EQ(f.exit_code, 6) << f.err;
    EXPECT_NE(f.err.find("Root cause (first failure)"), std::string::npos) << "no failure report on node " << n;
    const auto r = reports.of(n);
    ASSERT_TRUE(r.is_object()) << "node " << n << "\n" << f.err;
    EXPECT_EQ(r["outcome"], "failed");
    EXPECT_EQ(r["exit_code"], 6);
    // One root cause, the same on both nodes: rank 3, on node 1.
    const auto& root = r["root_cause"];
    EXPECT_EQ(root["rank"], 3) << root.dump(2);
    EXPECT_EQ(root["local_rank"], 1);
    EXPECT_EQ(root["node_rank"], 1);
    EXPECT_EQ(root["exit_code"], 6);
    ASSERT_TRUE(root["stderr_tail"].is_array()) << root.dump(2);
    EXPECT_NE(root["stderr_tail"].dump().find("rank 3 exiting with 6"), std::string::npos) << root.dump(2);
  }
  // Node 0's workers did not fail: ddprun stopped them.
  const nlohmann::json workers0 = reports.of(0)["attempts"][0]["workers"];
  ASSERT_EQ(workers0.size(), 2u) << workers0.dump(2);
  for (const auto& w : workers0) EXPECT_EQ(w["state"], "stopped") << w.dump(2);
}

TEST(MultiNodeTest, AllNodesRestartTogether) {
  TempDir dir;
  Reports reports;
  const int port = free_port();
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int n = 0; n < 2; ++n) {
    nodes.push_back(node(port, n, 1, reports.flags(n, {"--max_restarts", "2"}),
                         {"exit-if-attempt-below", "1", "4", "store-barrier", "env", dir.str()}));
  }
  const Finished f0 = nodes[0]->wait(60s), f1 = nodes[1]->wait(60s);
  ASSERT_EQ(f0.exit_code, 0) << f0.err;
  ASSERT_EQ(f1.exit_code, 0) << f1.err;
  for (int n = 0; n < 2; ++n) {
    const auto r = reports.of(n);
    ASSERT_TRUE(r.is_object()) << "node " << n;
    EXPECT_EQ(r["outcome"], "succeeded");
    EXPECT_EQ(r["restarts"], 1);
    ASSERT_EQ(r["attempts"].size(), 2u) << r.dump(2);
    EXPECT_EQ(r["attempts"][0]["outcome"], "failed");
    EXPECT_EQ(r["attempts"][1]["restart"], 1);
  }
  EXPECT_EQ(env_of(dir, 0).at("TORCHELASTIC_RESTART_COUNT"), "1");
  EXPECT_EQ(env_of(dir, 1).at("TORCHELASTIC_RESTART_COUNT"), "1");
}

TEST(MultiNodeTest, NodeThatStartsBeforeNodeZeroWaitsForIt) {
  TempDir dir;
  const int port = free_port(), health1 = free_port();
  auto n1 = node(port, 1, 1, {}, {"env", dir.str()}, 2, health_env(health1));
  // Node 0 is not there yet.
  ASSERT_TRUE(n1->wait_for([&] { return health_of(health1).phase == "connecting"; }, 30s)) << n1->err();
  auto n0 = node(port, 0, 1, {}, {"env", dir.str()});
  const Finished f0 = n0->wait(60s), f1 = n1->wait(60s);
  EXPECT_EQ(f0.exit_code, 0) << f0.err;
  EXPECT_EQ(f1.exit_code, 0) << f1.err;
  EXPECT_EQ(env_of(dir, 1).at("RANK"), "1");
}

TEST(MultiNodeTest, MissingNodeTimesOutNamingIt) {
  const int port = free_port();
  auto n0 = node(port, 0, 1, {"--rdzv_conf", "join_timeout=1"}, {"env", "/tmp"}, 3);
  const Finished f = n0->wait(60s);
  EXPECT_EQ(f.exit_code, 1);
  EXPECT_NE(f.err.find("1 of 3 nodes joined; missing node_rank 1, 2"), std::string::npos) << f.err;
}

TEST(MultiNodeTest, DuplicateNodeRankIsRejected) {
  const int port = free_port();
  auto a = node(port, 0, 1, fast_heartbeat(), {"sleep", "20"});
  auto b = node(port, 1, 1, fast_heartbeat(), {"sleep", "20"});
  ASSERT_TRUE(b->wait_for_workers(1, 30s)) << b->err();
  // Node rank 1's holder is alive (its heartbeat moves): a duplicate, not a dead earlier run.
  auto dup = node(port, 1, 1, fast_heartbeat(), {"sleep", "0"});
  const Finished d = dup->wait(30s);
  EXPECT_EQ(d.exit_code, 2) << d.err;
  EXPECT_NE(d.err.find("node_rank 1 has already joined this job"), std::string::npos) << d.err;
}

TEST(MultiNodeTest, SignalOnOneNodeStopsTheJobEverywhere) {
  Reports reports;
  const int port = free_port();
  auto n0 = node(port, 0, 1, reports.flags(0), {"wait-signal"});
  auto n1 = node(port, 1, 1, {}, {"wait-signal"});
  ASSERT_TRUE(n0->wait_for_output("[rank0]: ready", 30s));
  ASSERT_TRUE(n1->wait_for_output("[rank1]: ready", 30s));
  n1->signal(SIGTERM);
  const Finished f0 = n0->wait(30s), f1 = n1->wait(30s);
  EXPECT_EQ(f1.exit_code, 128 + SIGTERM) << f1.err;
  EXPECT_NE(f0.out.find("[rank0]: got SIGTERM"), std::string::npos) << f0.err;
  const auto r = reports.of(0);
  ASSERT_TRUE(r.is_object()) << f0.err;
  EXPECT_EQ(r["outcome"], "signalled");
  EXPECT_NE(r["message"].get<std::string>().find("SIGTERM on node 1"), std::string::npos) << r["message"];
}

TEST(MultiNodeTest, LosingNodeZeroStopsTheOtherNodes) {
  const int port = free_port();
  auto n0 = node(port, 0, 1, {}, {"sleep", "60"});
  auto n1 = node(port, 1, 1, {}, {"wait-signal"});
  ASSERT_TRUE(n1->wait_for_output("[rank1]: ready", 30s));
  n0->signal(SIGKILL);
  const Finished f1 = n1->wait(30s);
  EXPECT_EQ(f1.exit_code, 1) << f1.err;
  EXPECT_NE(f1.err.find("lost the rendezvous store"), std::string::npos) << f1.err;
  EXPECT_NE(f1.out.find("[rank1]: got SIGTERM"), std::string::npos);
  // The error is the last word: no heartbeat warning comes after it.
  const size_t last = f1.err.rfind("ERROR ddprun: lost the rendezvous store");
  ASSERT_NE(last, std::string::npos) << f1.err;
  EXPECT_EQ(f1.err.find("heartbeat stopped", last), std::string::npos) << f1.err;
}

TEST(MultiNodeTest, NodeWhoseDdprunIsKilledIsDetectedByHeartbeat) {
  const int port = free_port();
  Reports reports;
  const std::vector<std::string> fast{"--rdzv_conf",
                                      "join_timeout=30,keep_alive_interval=0.2,keep_alive_max_attempt=3"};
  auto n0 = node(port, 0, 1, reports.flags(0, fast), {"wait-signal"});
  auto n1 = node(port, 1, 1, fast, {"sleep", "120"});
  ASSERT_TRUE(n0->wait_for_output("[rank0]: ready", 30s));
  ASSERT_TRUE(n1->wait_for_workers(1, 30s));
  n1->signal(SIGKILL);
  const Finished f0 = n0->wait(30s);
  EXPECT_FALSE(f0.timed_out);
  EXPECT_EQ(f0.exit_code, 1) << f0.err;
  const auto r = reports.of(0);
  ASSERT_TRUE(r.is_object()) << f0.err;
  EXPECT_EQ(r["outcome"], "node_lost");
  const std::string message = r["message"].get<std::string>();
  EXPECT_NE(message.find("node 1 ("), std::string::npos) << message;
  EXPECT_NE(message.find(") sent no heartbeat for 600ms"), std::string::npos) << message;
  EXPECT_NE(f0.out.find("[rank0]: got SIGTERM"), std::string::npos) << f0.out;
}

TEST(MultiNodeTest, TwoJobsShareOneRendezvousDaemonAndStatusShowsThem) {
  TempDir dir;
  const std::string port_file = (dir.path / "port").string();
  // --job-ttl 0: finished jobs stay, so that status can show how they ended.
  Subprocess daemon({DAEMON_BIN, "--host", "127.0.0.1", "--port", "0", "--port-file", port_file, "--job-ttl", "0"});
  int daemon_port = 0;
  ASSERT_TRUE(daemon.wait_for(
      [&] {
        std::ifstream in(port_file);  // written atomically once the daemon listens
        return static_cast<bool>(in >> daemon_port);
      },
      10s))
      << daemon.err();
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (const char* job : {"job-a", "job-b"}) {
    for (int n = 0; n < 2; ++n) {
      nodes.push_back(JobNode(n)
                          .meet(at_store(daemon_port, job))
                          .conf("")
                          .flags({"--nproc_per_node", "2"})
                          .start({TEST_WORKER_BIN, "store-barrier"}));
    }
  }
  std::set<std::string> worker_ports;
  for (auto& n : nodes) {
    const Finished f = n->wait(60s);
    EXPECT_EQ(f.exit_code, 0) << f.err;
    const std::string port = logged_value(f.err, "MASTER_PORT=");
    ASSERT_FALSE(port.empty());
    worker_ports.insert(port);
  }
  EXPECT_EQ(worker_ports.size(), 2u) << "each job has its own worker store";
  Subprocess status({DAEMON_BIN, "status", "--endpoint", "127.0.0.1:" + std::to_string(daemon_port)});
  const Finished st = status.wait(10s);
  ASSERT_EQ(st.exit_code, 0) << st.err;
  const auto j = nlohmann::json::parse(st.out);
  ASSERT_EQ(j["jobs"].size(), 2u) << st.out;
  for (const auto& job : j["jobs"]) {
    EXPECT_EQ(job["state"], "succeeded") << st.out;
    EXPECT_EQ(job["nnodes"], 2);
    EXPECT_EQ(job["world_size"], 4);
    EXPECT_EQ(job["nodes"][1]["addr"], "127.0.0.2");
    EXPECT_GE(job["nodes"][0]["heartbeats"].get<int>(), 1) << st.out;
    EXPECT_TRUE(job["nodes"][0].contains("last_heartbeat_age_s")) << st.out;
  }
  EXPECT_EQ(j["jobs"][0]["run_id"], "job-a");
  EXPECT_EQ(j["jobs"][1]["run_id"], "job-b");
}

// Two nodes of job `run_id` (none: the default id) through the daemon at `port`; returns their results.
std::vector<Finished> run_daemon_job(uint16_t port, const std::string& run_id, std::vector<std::string> worker,
                                     std::vector<std::string> extra = {}) {
  std::vector<std::unique_ptr<Subprocess>> nodes;
  worker.insert(worker.begin(), TEST_WORKER_BIN);
  for (int n = 0; n < 2; ++n)
    nodes.push_back(JobNode(n).meet(at_store(port, run_id)).conf("").flags(extra).start(worker));
  std::vector<Finished> out;
  for (auto& n : nodes) out.push_back(n->wait(60s));
  return out;
}

// The daemon's key count once its janitor has caught up (it sweeps every second).
int64_t settled_keys(uint16_t port, int64_t at_most) {
  rdzv::client::Client c(test::store_client(port));
  int64_t n = 0;
  wait_until([&] { return (n = c.num_keys()) <= at_most; }, 20s, 100ms);
  return n;
}

TEST(MultiNodeTest, TheSameJobRunsAgainOnASharedDaemonAndLeavesNoKeysBehind) {
  Daemon d(DAEMON_BIN);
  std::vector<int64_t> keys_after;
  for (int run = 0; run < 3; ++run) {
    for (const std::string id : {"", "rerun"}) {  // the default id (none), then an explicit one
      for (const Finished& f : run_daemon_job(d.port(), id, {"store-barrier"})) {
        ASSERT_EQ(f.exit_code, 0) << "run " << run << " of '" << id << "':\n" << f.err;
      }
    }
    // What is left of two finished job ids: their generation counters.
    keys_after.push_back(settled_keys(d.port(), 2));
  }
  EXPECT_EQ(keys_after, (std::vector<int64_t>{2, 2, 2})) << "the key count must stay flat:\n" << d.log();
}

TEST(MultiNodeTest, AJobWhoseAgentsWereKilledIsForgottenAndItsIdRunsAgain) {
  DaemonOptions o;
  o.args = {"--job-ttl", "2"};
  Daemon d(DAEMON_BIN, o);
  const std::string endpoint = "127.0.0.1:" + std::to_string(d.port());
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int n = 0; n < 2; ++n) {
    nodes.push_back(std::make_unique<Subprocess>(
        std::vector<std::string>{DDPRUN_BIN, "--nnodes", "2", "--node_rank", std::to_string(n), "--rdzv_endpoint",
                                 endpoint, "--rdzv_id", "crashy", "--master_addr", "127.0.0.1", "--rdzv_conf",
                                 "keep_alive_interval=0.2", TEST_WORKER_BIN, "sleep", "60"}));
  }
  for (auto& n : nodes) ASSERT_TRUE(n->wait_for_workers(1, 30s)) << n->err();
  for (auto& n : nodes) n->signal(SIGKILL);
  for (auto& n : nodes) n->wait(10s);
  // Run again at once: the dead agents' node ranks are taken over (their heartbeats do not move).
  for (const Finished& f :
       run_daemon_job(d.port(), "crashy", {"store-barrier"}, {"--rdzv_conf", "keep_alive_interval=0.2"})) {
    ASSERT_EQ(f.exit_code, 0) << f.err;
    EXPECT_NE(f.err.find("was left by agents that are gone"), std::string::npos) << f.err;
  }
  // The killed run's keys go after the TTL without a change; the finished run's at once.
  EXPECT_EQ(settled_keys(d.port(), 0), 0) << d.log();
}

TEST(MultiNodeTest, StatusSkipsKeysItCannotParseAndSaysSo) {
  Daemon d(DAEMON_BIN);
  {
    rdzv::client::Client c(test::store_client(d.port()));
    c.set("/ddprun/big/g1/r99999999999999999999/node/0", "{}");
    c.set("/ddprun/bad/g1/r0/node/0", "{not json");
    c.set("/ddprun/bad/g1/r0/worker_store", "[1,2]");
    c.set("/ddprun/good/g1/r0/node/0", R"({"host":"h","nproc":2,"nnodes":1,"agent":"a"})");
  }
  Subprocess status({DAEMON_BIN, "status", "--endpoint", "127.0.0.1:" + std::to_string(d.port())});
  const Finished st = status.wait(10s);
  ASSERT_EQ(st.exit_code, 0) << st.err;
  const auto j = nlohmann::json::parse(st.out);
  ASSERT_EQ(j["skipped"].size(), 3u) << st.out;
  EXPECT_NE(st.err.find("skipped 3 key(s)"), std::string::npos) << st.err;
  ASSERT_EQ(j["jobs"].size(), 2u) << st.out;
  EXPECT_EQ(j["jobs"][1]["run_id"], "good");
  EXPECT_EQ(j["jobs"][1]["world_size"], 2);
}

}  // namespace
}  // namespace ddprun::test
