// Dynamic (c10d-style) rendezvous: nodes join an endpoint without ranks; --nnodes MIN:MAX;
// membership changes (a node lost, a node arriving) re-rendezvous without using up restarts.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <gtest/gtest.h>

#include <regex>

#include "tests/support/files.hpp"
#include "tests/support/free_port.hpp"
#include "tests/support/job_node.hpp"
#include "tests/support/report.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;

// A c10d node of job "elastic" through the daemon on `port`, without a rank, at 127.0.0.(host+1).
std::unique_ptr<Subprocess> agent(int port, const std::string& nnodes, int nproc, int host, const std::string& conf,
                                  std::vector<std::string> worker_args, std::vector<std::string> extra = {}) {
  worker_args.insert(worker_args.begin(), TEST_WORKER_BIN);
  return JobNode(host)
      .nnodes(nnodes)
      .without_rank()
      .meet(at_store(port, "elastic", /*c10d=*/true))
      .conf(conf)
      .flags({"--nproc_per_node", std::to_string(nproc)})
      .flags(extra)
      .start(worker_args);
}

// The last round node `n` took part in, from its report: round, restart, node_rank, nnodes,
// ranks [first, last], world_size, outcome.
nlohmann::json last_attempt(const Reports& reports, int n) {
  const auto r = reports.of(n);
  if (!r.is_object() || !r["attempts"].is_array() || r["attempts"].empty()) return nullptr;
  return r["attempts"].back();
}

const std::string kFast = "join_timeout=30,last_call_timeout=0.5,keep_alive_interval=0.2,keep_alive_max_attempt=3";

TEST(ElasticTest, NodesJoinWithoutRanksAndTheEndpointHostGetsRankZero) {
  const int port = free_port();
  Reports reports;
  auto a = agent(port, "2", 2, 1, kFast, {"store-barrier"}, reports.flags(0));
  ASSERT_TRUE(a->wait_for([&] { return port_taken(port); }, 10s)) << a->err();
  auto b = agent(port, "2", 2, 2, kFast, {"store-barrier"}, reports.flags(1));
  const Finished fb = b->wait(60s), fa = a->wait(60s);
  ASSERT_EQ(fa.exit_code, 0) << fa.err;
  ASSERT_EQ(fb.exit_code, 0) << fb.err;
  const auto ra = last_attempt(reports, 0), rb = last_attempt(reports, 1);
  ASSERT_TRUE(ra.is_object()) << fa.err;
  ASSERT_TRUE(rb.is_object()) << fb.err;
  EXPECT_EQ(ra["node_rank"], 0) << "the agent hosting the endpoint's store is group rank 0";
  EXPECT_EQ(ra["ranks"], nlohmann::json::array({0, 1}));
  EXPECT_EQ(rb["node_rank"], 1);
  EXPECT_EQ(rb["ranks"], nlohmann::json::array({2, 3}));
  EXPECT_EQ(rb["world_size"], 4);
  EXPECT_EQ(rb["nnodes"], 2);
}

TEST(ElasticTest, NodeRankHintOrdersTheOtherNodes) {
  const int port = free_port();
  Reports reports;
  auto host = agent(port, "3", 1, 1, kFast, {"sleep", "0"});
  ASSERT_TRUE(host->wait_for([&] { return port_taken(port); }, 10s));
  auto late_hint0 = agent(port, "3", 1, 2, kFast, {"sleep", "0"}, reports.flags(1, {"--node_rank", "1"}));
  auto hint2 = agent(port, "3", 1, 3, kFast, {"sleep", "0"}, reports.flags(2, {"--node_rank", "2"}));
  const Finished f1 = late_hint0->wait(60s), f2 = hint2->wait(60s), f0 = host->wait(60s);
  ASSERT_EQ(f0.exit_code, 0) << f0.err;
  EXPECT_EQ(last_attempt(reports, 1)["node_rank"], 1) << f1.err;
  EXPECT_EQ(last_attempt(reports, 2)["node_rank"], 2) << f2.err;
}

// The workers' progress pages carry this node's place in the job (renewed after each heartbeat), for
// the SDK's checkpoint writer; a static job has nothing to confirm.
TEST(ElasticTest, TheWorkersSeeTheirNodesConfirmedPlaceInTheJob) {
  const int port = free_port();
  // keep-alive window 0.6 s: the fence (and so the confirmation) lasts 3/4 of it, at least 1 s.
  auto a = agent(port, "1:2", 1, 1, kFast, {"sleep", "1.5", "membership"});
  const Finished fa = a->wait(60s);
  ASSERT_EQ(fa.exit_code, 0) << fa.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(fa.out, m, std::regex(R"(membership_ms=(-?\d+))"))) << fa.out;
  // Renewed by the heartbeats while the worker slept: still ahead, by at most the fence's window.
  EXPECT_GT(std::stoi(m[1]), 0) << fa.out;
  EXPECT_LE(std::stoi(m[1]), 1000) << fa.out;

  Subprocess fixed({DDPRUN_BIN, "--nproc_per_node", "1", TEST_WORKER_BIN, "membership"});
  const Finished ff = fixed.wait(60s);
  ASSERT_EQ(ff.exit_code, 0) << ff.err;
  EXPECT_NE(ff.out.find("membership_ms=none"), std::string::npos) << ff.out;
}

TEST(ElasticTest, MinNodesStartAfterTheLastCallWithoutWaitingForMax) {
  const int port = free_port();
  Reports reports;
  auto a = agent(port, "1:3", 1, 1, kFast, {"store-barrier"}, reports.flags(0));
  ASSERT_TRUE(a->wait_for([&] { return port_taken(port); }, 10s));
  auto b = agent(port, "1:3", 1, 2, kFast, {"store-barrier"});
  const Finished fa = a->wait(60s), fb = b->wait(60s);
  ASSERT_EQ(fa.exit_code, 0) << fa.err;
  ASSERT_EQ(fb.exit_code, 0) << fb.err;
  const auto r = last_attempt(reports, 0);
  ASSERT_TRUE(r.is_object()) << fa.err;
  EXPECT_TRUE(r["nnodes"] == 1 || r["nnodes"] == 2)
      << "closed with the nodes present after the last call, not 3: " << r.dump(2);
}

TEST(ElasticTest, SurvivorsReRendezvousWhenANodeIsKilled) {
  const int port = free_port();
  Reports reports;
  TempDir envs;  // each rank's environment, written as it starts (the last round's stays)
  const std::vector<std::string> worker = {"env", envs.str(), "sleep", "3"};
  auto a = agent(port, "2:3", 1, 1, kFast, worker, reports.flags(0, {"--max_restarts", "0"}));
  ASSERT_TRUE(a->wait_for([&] { return port_taken(port); }, 10s));
  auto b = agent(port, "2:3", 1, 2, kFast, worker, {"--max_restarts", "0"});
  auto c = agent(port, "2:3", 1, 3, kFast, worker, {"--max_restarts", "0"});
  ASSERT_TRUE(c->wait_for_workers(1, 30s)) << c->err();
  c->signal(SIGKILL);
  const Finished fa = a->wait(60s), fb = b->wait(60s);
  ASSERT_EQ(fa.exit_code, 0) << fa.err;
  ASSERT_EQ(fb.exit_code, 0) << fb.err;
  const auto r = reports.of(0);
  ASSERT_TRUE(r.is_object()) << fa.err;
  EXPECT_EQ(r["outcome"], "succeeded");
  EXPECT_EQ(r["restarts"], 0) << "membership changes do not use up --max_restarts";
  ASSERT_EQ(r["attempts"].size(), 2u) << r.dump(2);
  EXPECT_EQ(r["attempts"][0]["nnodes"], 3);
  EXPECT_EQ(r["attempts"][0]["outcome"], "node_lost") << r.dump(2);
  EXPECT_EQ(r["attempts"][1]["round"], 1) << "a second round";
  EXPECT_EQ(r["attempts"][1]["restart"], 0);
  EXPECT_EQ(r["attempts"][1]["nnodes"], 2) << "the two survivors";
  // The survivors' workers are told that the job re-formed (so a program resumes from its
  // checkpoint), though it made no restart. Before, they could not tell it from the first round.
  for (const char* rank : {"0", "1"}) {
    const std::string env = "\n" + read_file(envs.path / ("env." + std::string(rank)));
    EXPECT_NE(env.find("\nDDPRUN_ROUND=1\n"), std::string::npos) << "rank " << rank << ":\n" << env;
    EXPECT_NE(env.find("\nTORCHELASTIC_RESTART_COUNT=0\n"), std::string::npos) << env;
  }
}

// A rank that lost a connection in a round of one node lost it to nothing in the round (a replica
// group's peer, say): no keep-alive can name a lost node, so the failure is reported at once,
// without waiting out their window (which cost a replica group's restart 16 s).
TEST(ElasticTest, ARankThatLostAPeerInARoundOfOneNodeFailsWithoutWaitingForKeepAlives) {
  const int port = free_port();
  auto a = agent(port, "1:2", 1, 1, kFast, {"error-file", "Connection reset by peer"}, {"--max_restarts", "0"});
  const Finished fa = a->wait(60s);
  EXPECT_EQ(fa.exit_code, 1) << fa.err;
  EXPECT_EQ(fa.err.find("for the keep-alives to tell whether a node was lost"), std::string::npos) << fa.err;
  EXPECT_NE(fa.err.find("Connection reset by peer"), std::string::npos) << fa.err;
}

TEST(ElasticTest, ALateNodeIsAdmittedIntoTheRunningJob) {
  const int port = free_port();
  Reports reports;
  auto a = agent(port, "2:3", 1, 1, kFast, {"sleep", "2"}, reports.flags(0));
  ASSERT_TRUE(a->wait_for([&] { return port_taken(port); }, 10s));
  auto b = agent(port, "2:3", 1, 2, kFast, {"sleep", "2"});
  ASSERT_TRUE(a->wait_for_workers(1, 30s));
  auto late = agent(port, "2:3", 1, 3, kFast, {"sleep", "2"}, reports.flags(2));
  const Finished fl = late->wait(60s), fa = a->wait(60s), fb = b->wait(60s);
  ASSERT_EQ(fa.exit_code, 0) << fa.err;
  ASSERT_EQ(fb.exit_code, 0) << fb.err;
  ASSERT_EQ(fl.exit_code, 0) << fl.err;
  const auto ra = reports.of(0);
  ASSERT_TRUE(ra.is_object()) << fa.err;
  ASSERT_GE(ra["attempts"].size(), 2u) << ra.dump(2);
  EXPECT_EQ(ra["attempts"][0]["outcome"], "membership_change") << "the running round ended to admit it: " << ra.dump(2);
  EXPECT_EQ(ra["restarts"], 0);
  const auto rl = last_attempt(reports, 2);
  ASSERT_TRUE(rl.is_object()) << fl.err;
  EXPECT_EQ(rl["nnodes"], 3) << rl.dump(2);
  EXPECT_EQ(rl["restart"], 0);
}

TEST(ElasticTest, C10dNeedsAnEndpoint) {
  Subprocess p({DDPRUN_BIN, "--rdzv_backend", "c10d", "--nnodes", "1:2", TEST_WORKER_BIN});
  const Finished f = p.wait(10s);
  EXPECT_EQ(f.exit_code, 2);
  EXPECT_NE(f.err.find("--rdzv_backend c10d needs --rdzv_endpoint"), std::string::npos) << f.err;
}

}  // namespace
}  // namespace ddprun::test
