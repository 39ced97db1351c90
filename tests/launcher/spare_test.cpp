// Hot spares: an agent that arrives when an elastic job runs with all its --nnodes MAX nodes waits
// outside the world, takes the place of a node that is lost in the next round, and ends with the
// job; a spare that dies or is stopped never ends the job, nor one that dies with a node of the
// world (the other spare takes the place). On the store (c10d through the node
// that hosts the endpoint) and on a real etcd.
#include <signal.h>

#include <gtest/gtest.h>

#include "tests/support/job_node.hpp"
#include "tests/support/meeting.hpp"
#include "tests/support/report.hpp"
#include "tests/support/subprocess.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;

// Node `n` (127.0.0.(n+1)) of a job of two nodes at most with one worker running `worker` (test_worker's
// arguments), writing its report where `reports` says.
std::unique_ptr<Subprocess> node(const Meeting& m, int n, std::vector<std::string> worker, const Reports& reports,
                                 const std::string& max_restarts = "0") {
  worker.insert(worker.begin(), TEST_WORKER_BIN);
  return JobNode(n)
      .nnodes(m.nnodes())
      .without_rank()
      .meet(m.flags())
      .conf(m.conf())
      .flags({"--nproc_per_node", "1", "--max_restarts", max_restarts})
      .flags(reports.flags(n))
      .start(worker);
}

// How many attempts a node's report lists, and whether its last one was waited out as a spare.
size_t attempts(const nlohmann::json& report) { return report.is_object() ? report["attempts"].size() : 0; }
bool last_was_spare(const nlohmann::json& report) {
  return attempts(report) > 0 && report["attempts"].back().value("spare", false);
}

// Nodes 0 and 1 in the world (their workers sleep 5 s), then `spares` more (nodes 2, 3, ...)
// waiting as spares; `problem` says what did not come to be.
struct WorldAndSpares {
  std::vector<std::unique_ptr<Subprocess>> nodes;
  std::string problem;
};
WorldAndSpares world_and_spares(Meeting& m, const Reports& reports, int spares) {
  WorldAndSpares w;
  w.nodes.push_back(node(m, 0, {"sleep", "5"}, reports));
  if (!m.first_node_up(*w.nodes[0])) {
    w.problem = "node 0 never came up: " + w.nodes[0]->err();
    return w;
  }
  w.nodes.push_back(node(m, 1, {"sleep", "5"}, reports));
  if (!w.nodes[1]->wait_for_workers(1, 60s)) {
    w.problem = "node 1 never started its worker: " + w.nodes[1]->err();
    return w;
  }
  for (int k = 0; k < spares; ++k) w.nodes.push_back(node(m, 2 + k, {"sleep", "5"}, reports));
  for (int k = 0; k < spares; ++k) {
    if (!w.nodes[2 + k]->wait_for_output("as a spare", 30s)) {
      w.problem = "node " + std::to_string(2 + k) + " never waited as a spare: " + w.nodes[2 + k]->err();
      return w;
    }
  }
  return w;
}

// A lost node's place taken by a spare, as the survivor's report and the spare's say: the round
// after the loss is whole again, no restart used, and the spare's worker ran it to the end.
void expect_the_spare_took_the_place(const nlohmann::json& survivor, const nlohmann::json& spare) {
  ASSERT_EQ(attempts(survivor), 2u) << survivor.dump(2);
  EXPECT_EQ(survivor["attempts"][0]["outcome"], "node_lost") << survivor.dump(2);
  EXPECT_EQ(survivor["attempts"][1]["nnodes"], 2) << "a spare filled the lost node's place: " << survivor.dump(2);
  EXPECT_EQ(survivor["restarts"], 0) << "a node taken over is no restart";
  ASSERT_GE(attempts(spare), 2u) << spare.dump(2);
  EXPECT_TRUE(spare["attempts"][0].value("spare", false)) << spare.dump(2);
  EXPECT_FALSE(last_was_spare(spare)) << spare.dump(2);
  EXPECT_EQ(spare["attempts"].back()["outcome"], "succeeded") << spare.dump(2);
  EXPECT_EQ(spare["attempts"].back()["workers"].size(), 1u) << spare.dump(2);
}

class SpareTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::Etcd && !have_etcd())
      GTEST_FAIL() << "etcd-server and etcd-client are not installed: run scripts/install_deps.sh";
  }
};

// A third agent of a full 2:2 job (a pod rescheduled while the old one still runs) made the job
// re-rendezvous to admit it, which left another node out, which asked again, without end.
TEST_P(SpareTest, AThirdAgentOfAFullJobWaitsAsASpareAndEndsWithTheJob) {
  Meeting m(GetParam(), "spare-full");
  Reports reports;
  auto a = node(m, 0, {"sleep", "4"}, reports);
  ASSERT_TRUE(m.first_node_up(*a)) << a->err();
  auto b = node(m, 1, {"sleep", "4"}, reports);
  ASSERT_TRUE(a->wait_for_workers(1, 60s)) << a->err();
  ASSERT_TRUE(b->wait_for_workers(1, 60s)) << b->err();
  auto c = node(m, 2, {"sleep", "4"}, reports);
  ASSERT_TRUE(c->wait_for_output("as a spare", 30s)) << c->err();
  const Finished fa = a->wait(60s), fb = b->wait(60s), fc = c->wait(30s);
  ASSERT_FALSE(fa.timed_out) << fa.err;
  EXPECT_EQ(fa.exit_code, 0) << fa.err;
  EXPECT_EQ(fb.exit_code, 0) << fb.err;
  EXPECT_EQ(fc.exit_code, 0) << "the spare ends with the job: " << fc.err;
  EXPECT_EQ(attempts(reports.of(0)), 1u) << "the world's nodes start their workers once: " << reports.of(0).dump(2);
  EXPECT_EQ(attempts(reports.of(1)), 1u) << reports.of(1).dump(2);
  const auto rc = reports.of(2);
  ASSERT_TRUE(last_was_spare(rc)) << rc.dump(2);
  EXPECT_EQ(rc["outcome"], "succeeded") << rc.dump(2);
  EXPECT_TRUE(rc["attempts"].back()["workers"].empty()) << "no worker ran on the spare";
  EXPECT_NE(fc.err.find("no worker was started here"), std::string::npos) << fc.err;
}

TEST_P(SpareTest, ASpareTakesThePlaceOfAKilledNodeInTheNextRound) {
  Meeting m(GetParam(), "spare-takes-over");
  Reports reports;
  WorldAndSpares w = world_and_spares(m, reports, 1);
  ASSERT_EQ(w.problem, "");
  auto &a = w.nodes[0], &b = w.nodes[1], &c = w.nodes[2];
  b->signal(SIGKILL);
  const Finished fa = a->wait(90s), fc = c->wait(90s);
  ASSERT_FALSE(fa.timed_out) << fa.err;
  EXPECT_EQ(fa.exit_code, 0) << fa.err;
  EXPECT_EQ(fc.exit_code, 0) << fc.err;
  expect_the_spare_took_the_place(reports.of(0), reports.of(2));
}

TEST_P(SpareTest, ASpareKilledOrStoppedWhileWaitingNeverEndsTheJob) {
  Meeting m(GetParam(), "spare-dies");
  Reports reports;
  WorldAndSpares w = world_and_spares(m, reports, 2);
  ASSERT_EQ(w.problem, "");
  auto &a = w.nodes[0], &b = w.nodes[1], &killed = w.nodes[2], &stopped = w.nodes[3];
  killed->signal(SIGKILL);
  stopped->signal(SIGTERM);
  const Finished fs = stopped->wait(30s);
  EXPECT_EQ(fs.exit_code, 128 + SIGTERM) << fs.err;
  const Finished fa = a->wait(60s), fb = b->wait(60s);
  EXPECT_EQ(fa.exit_code, 0) << fa.err;
  EXPECT_EQ(fb.exit_code, 0) << fb.err;
  EXPECT_EQ(attempts(reports.of(0)), 1u) << reports.of(0).dump(2);
  EXPECT_EQ(attempts(reports.of(1)), 1u) << reports.of(1).dump(2);
}

// A node of the world and a spare killed at once (a rack's power, a switch): the other spare takes
// the lost node's place, and the spare that died with it costs the job nothing.
TEST_P(SpareTest, AWorldNodeAndASpareKilledTogetherLeaveThePlaceToTheOtherSpare) {
  Meeting m(GetParam(), "spare-and-node-die");
  Reports reports;
  WorldAndSpares w = world_and_spares(m, reports, 2);
  ASSERT_EQ(w.problem, "");
  auto &a = w.nodes[0], &b = w.nodes[1], &dies = w.nodes[2], &stays = w.nodes[3];
  b->signal(SIGKILL);
  dies->signal(SIGKILL);
  const Finished fa = a->wait(90s), fs = stays->wait(90s);
  ASSERT_FALSE(fa.timed_out) << fa.err;
  EXPECT_EQ(fa.exit_code, 0) << fa.err;
  EXPECT_EQ(fs.exit_code, 0) << fs.err;
  expect_the_spare_took_the_place(reports.of(0), reports.of(3));
}

// A failure is no lost node: the world's nodes restart in their places, the spare stays a spare,
// and when the job fails for good the spare ends with the job's exit code, not at a join timeout.
TEST_P(SpareTest, ASpareStaysASpareWhileTheWorldRestartsAndEndsWithTheFailedJobsCode) {
  Meeting m(GetParam(), "spare-failed-job");
  Reports reports;
  // Attempt 0: every rank fails with 3; attempt 1: rank 1 fails with 7, and no restart is left.
  const std::vector<std::string> worker{"sleep", "2", "exit-if-attempt-below", "1", "3", "exit-if-rank", "1", "7"};
  auto a = node(m, 0, worker, reports, "1");
  ASSERT_TRUE(m.first_node_up(*a)) << a->err();
  auto b = node(m, 1, worker, reports, "1");
  ASSERT_TRUE(b->wait_for_workers(1, 60s)) << b->err();
  auto c = node(m, 2, worker, reports, "1");
  ASSERT_TRUE(c->wait_for_output("as a spare", 30s)) << c->err();
  const Finished fa = a->wait(60s), fb = b->wait(60s), fc = c->wait(60s);
  EXPECT_EQ(fa.exit_code, 7) << fa.err;
  EXPECT_EQ(fb.exit_code, 7) << fb.err;
  EXPECT_EQ(fc.exit_code, 7) << "the spare ends as the job did: " << fc.err;
  EXPECT_EQ(attempts(reports.of(0)), 2u) << reports.of(0).dump(2);
  const auto rc = reports.of(2);
  ASSERT_TRUE(last_was_spare(rc)) << rc.dump(2);
  EXPECT_EQ(rc["outcome"], "failed") << rc.dump(2);
  EXPECT_TRUE(rc["nodes"]["spare"]) << rc.dump(2);
  for (const auto& attempt : rc["attempts"]) EXPECT_TRUE(attempt["workers"].empty()) << rc.dump(2);
  EXPECT_NE(fc.err.find("while this node waited as a spare"), std::string::npos) << fc.err;
}

INSTANTIATE_TEST_SUITE_P(Backends, SpareTest, ::testing::Values(Backend::Store, Backend::Etcd),
                         [](const auto& p) { return p.param == Backend::Store ? "Store" : "Etcd"; });

}  // namespace
}  // namespace ddprun::test
