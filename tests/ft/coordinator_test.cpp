// The quorum protocol (launcher/ft/coordinator.hpp) between several groups' agents, over a real
// ddprun store on loopback and over a real etcd cluster of three members: one Coordinator per
// group, each on its own thread and connections.
#include "launcher/ft/coordinator.hpp"

#include "launcher/ft/etcd_quorum_kv.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <future>
#include <mutex>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "rendezvous/client/client.hpp"
#include "rendezvous/server/server.hpp"
#include "tests/support/etcd_cluster.hpp"
#include "tests/support/wait_until.hpp"

namespace ddprun::launcher::ft {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Every test runs on a ddprun store and on a real etcd cluster of three members.
class CoordinatorTest : public ::testing::TestWithParam<std::string> {
 protected:
  bool on_etcd() const { return GetParam() == "etcd"; }

  void SetUp() override {
    if (on_etcd()) {
      etcd_ = std::make_unique<test::EtcdCluster>(3);
      return;
    }
    rdzv::server::ServerOptions so;
    so.host = "127.0.0.1";
    so.port = 0;
    so.log_lifecycle = false;
    server_ = std::make_unique<rdzv::server::ServerThread>(so);
  }

  std::unique_ptr<QuorumKv> kv() {
    if (on_etcd()) {
      rendezvous::etcd::Options eo;
      for (int i = 0; i < 3; ++i) eo.endpoints.push_back(etcd_->endpoint(i));
      return std::make_unique<EtcdQuorumKv>(eo, seconds(30));
    }
    rdzv::client::ClientOptions co;
    co.host = "127.0.0.1";
    co.port = server_->port();
    co.timeout = seconds(30);
    return std::make_unique<StoreQuorumKv>(std::make_unique<rdzv::client::Client>(co));
  }

  std::unique_ptr<Coordinator> group(int g, const std::string& incarnation, int min_groups,
                                     milliseconds heartbeat_timeout = seconds(60),
                                     milliseconds progress_interval = seconds(10)) {
    CoordinatorOptions o;
    o.run_id = "ftjob";
    o.group = g;
    o.rules.min_groups = min_groups;
    o.rules.join_timeout = seconds(60);
    o.heartbeat_interval = milliseconds(50);
    o.heartbeat_timeout = heartbeat_timeout;
    o.poll = milliseconds(20);
    o.progress_interval = progress_interval;
    auto c = std::make_unique<Coordinator>(o, kv(), kv());
    c->set_incarnation(incarnation);
    return c;
  }

  // Waits until `c` sees exactly `groups` heartbeating (a fact, not a sleep).
  static void wait_healthy(const Coordinator& c, const std::set<int>& groups) {
    const auto deadline = std::chrono::steady_clock::now() + seconds(30);
    while (c.healthy() != groups) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "heartbeats never seen";
      std::this_thread::sleep_for(milliseconds(10));  // sleep override: polling a fact with a deadline
    }
  }

  // Waits until group `g`'s request for quorum `seq` is in the store.
  void wait_asked(int64_t seq, int g) {
    auto reader = kv();
    ASSERT_TRUE(reader->wait_for(rdzv::jobs::QuorumKeys("ftjob").ask(seq, g), seconds(30)));
  }

  static Member at(int64_t step) {
    Member m;
    m.step = step;
    m.store = "127.0.0.1:1";
    m.recovery = {"127.0.0.1:2"};
    return m;
  }

  std::unique_ptr<rdzv::server::ServerThread> server_;
  std::unique_ptr<test::EtcdCluster> etcd_;
  StopSignal stop_;
};

INSTANTIATE_TEST_SUITE_P(OnEachStore, CoordinatorTest, ::testing::Values("store", "etcd"),
                         [](const ::testing::TestParamInfo<std::string>& store) { return store.param; });

TEST_P(CoordinatorTest, ThreeGroupsAgreeOnOneQuorumPerStepWithAStableId) {
  std::vector<std::unique_ptr<Coordinator>> groups;
  for (int g = 0; g < 3; ++g) groups.push_back(group(g, "a", 2));
  for (auto& c : groups) wait_healthy(*c, {0, 1, 2});
  for (int64_t step = 0; step < 5; ++step) {
    std::vector<std::future<Quorum>> asks;
    for (auto& c : groups)
      asks.push_back(std::async(std::launch::async, [&, step] { return c->next(at(step), stop_, seconds(30)); }));
    std::vector<Quorum> got;
    for (auto& f : asks) got.push_back(f.get());
    for (const Quorum& q : got) {
      EXPECT_EQ(q.seq, got[0].seq);
      EXPECT_EQ(q.id, 1) << "the membership never changed";
      EXPECT_EQ(q.members.size(), 3u);
      EXPECT_EQ(q.max_step(), step);
    }
    EXPECT_EQ(got[0].seq, step + 1);
  }
}

TEST_P(CoordinatorTest, AGroupWhoseWorkersDiedIsCountedOutAtOnceAndComesBackAsANewMember) {
  // The heartbeat timeout is a minute: only the withdrawal can let the others go on.
  std::vector<std::unique_ptr<Coordinator>> groups;
  for (int g = 0; g < 3; ++g) groups.push_back(group(g, "a", 2));
  for (auto& c : groups) wait_healthy(*c, {0, 1, 2});
  {
    std::vector<std::future<Quorum>> asks;
    for (auto& c : groups)
      asks.push_back(std::async(std::launch::async, [&] { return c->next(at(0), stop_, seconds(30)); }));
    for (auto& f : asks) EXPECT_EQ(f.get().id, 1);
  }
  groups[2]->withdraw();
  auto a0 = std::async(std::launch::async, [&] { return groups[0]->next(at(1), stop_, seconds(30)); });
  auto a1 = std::async(std::launch::async, [&] { return groups[1]->next(at(1), stop_, seconds(30)); });
  const Quorum q0 = a0.get();
  const Quorum q1 = a1.get();
  EXPECT_EQ(q0.seq, q1.seq);
  ASSERT_EQ(q0.members.size(), 2u);
  EXPECT_EQ(q0.member(2), nullptr);
  EXPECT_EQ(q0.id, 2);
  // Group 2's workers start again, at step 0: it joins, as a new member, and heals.
  // (It asks first: a fast quorum of the previous members does not wait for a newcomer.)
  groups[2]->set_incarnation("b");
  auto back = std::async(std::launch::async, [&] { return groups[2]->next(at(0), stop_, seconds(30)); });
  wait_asked(3, 2);  // quorum 2 formed without it: it asks for the next one
  auto b0 = std::async(std::launch::async, [&] { return groups[0]->next(at(2), stop_, seconds(30)); });
  auto b1 = std::async(std::launch::async, [&] { return groups[1]->next(at(2), stop_, seconds(30)); });
  const Quorum q = back.get();
  EXPECT_EQ(b0.get().seq, q.seq);
  EXPECT_EQ(b1.get().seq, q.seq);
  ASSERT_NE(q.member(2), nullptr);
  EXPECT_EQ(q.member(2)->incarnation, "b");
  EXPECT_GT(q.id, 2);
  const GroupView v = view_of(q, 2);
  EXPECT_TRUE(v.heal);
  EXPECT_EQ(v.max_step, 2);
  EXPECT_NE(v.recover_from, 2);
}

TEST_P(CoordinatorTest, ASilentGroupIsCountedOutAfterTheHeartbeatTimeout) {
  std::vector<std::unique_ptr<Coordinator>> groups;
  for (int g = 0; g < 3; ++g) groups.push_back(group(g, "a", 2, milliseconds(1500)));
  for (auto& c : groups) wait_healthy(*c, {0, 1, 2});
  groups[2].reset();  // its agent is gone (SIGKILL, a dead host): no withdrawal, no heartbeat
  auto a0 = std::async(std::launch::async, [&] { return groups[0]->next(at(0), stop_, seconds(30)); });
  auto a1 = std::async(std::launch::async, [&] { return groups[1]->next(at(0), stop_, seconds(30)); });
  const Quorum q = a0.get();
  EXPECT_EQ(a1.get().seq, q.seq);
  ASSERT_EQ(q.members.size(), 2u);
  EXPECT_EQ(q.member(2), nullptr);
}

TEST_P(CoordinatorTest, TooFewGroupsTimeOutSayingWhatTheyWaitFor) {
  auto only = group(0, "a", 2);
  wait_healthy(*only, {0});
  try {
    only->next(at(0), stop_, milliseconds(500));
    FAIL() << "a quorum of one formed, though two are needed";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("1 of the 2 replica groups"), std::string::npos) << e.what();
  }
}

// Group 0 gives up waiting; group 1 asks afterwards. Group 0's ask must not make up the quorum:
// its workers are failing with the timeout and never come to the step. Before, the ask stayed in
// the store and group 1 got a quorum of two whose other member was gone.
TEST_P(CoordinatorTest, AnAskGivenUpOnDoesNotCountIntoALaterQuorum) {
  auto g0 = group(0, "a", 2);
  auto g1 = group(1, "a", 2);
  wait_healthy(*g0, {0, 1});
  EXPECT_THROW(g0->next(at(0), stop_, milliseconds(300)), TimeoutError);
  try {
    const Quorum q = g1->next(at(0), stop_, milliseconds(1500));
    FAIL() << "quorum " << q.seq << " of " << q.members.size() << " groups formed from an ask its group gave up on";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("1 of the 2 replica groups"), std::string::npos) << e.what();
  }
}

std::vector<std::string>& logged() {
  static std::vector<std::string> lines;
  return lines;
}
std::mutex log_mutex;

// Two groups, both needed; group 1's workers die and start again. Group 0 waits, saying for whom,
// and says so when group 1 is back: the same groups, another member. Before, it named only the
// groups that had asked, and logged nothing once the job was whole again.
TEST_P(CoordinatorTest, ASurvivorSaysWhichGroupItWaitsForAndWhenThatGroupIsBack) {
  auto g0 = group(0, "a", 2, seconds(60), milliseconds(100));  // says what it waits for every 100 ms
  auto g1 = group(1, "a", 2);
  wait_healthy(*g0, {0, 1});
  wait_healthy(*g1, {0, 1});
  {
    auto a = std::async(std::launch::async, [&] { return g0->next(at(0), stop_, seconds(30)); });
    auto b = std::async(std::launch::async, [&] { return g1->next(at(0), stop_, seconds(30)); });
    EXPECT_EQ(a.get().seq, b.get().seq);
  }
  g1->withdraw();
  wait_healthy(*g0, {0});
  logged().clear();
  log::set_sink([](std::string_view line) {
    std::lock_guard lock(log_mutex);
    logged().emplace_back(line);
  });
  const auto all_logged = [] {
    std::lock_guard lock(log_mutex);
    std::string all;
    for (const std::string& l : logged()) all += l + "\n";
    return all;
  };
  auto a = std::async(std::launch::async, [&] { return g0->next(at(1), stop_, seconds(30)); });
  const bool said = test::wait_until(
      [&] { return all_logged().find("waiting for group 1 (no heartbeat") != std::string::npos; }, seconds(30));
  g1->set_incarnation("b");
  auto b = std::async(std::launch::async, [&] { return g1->next(at(0), stop_, seconds(30)); });
  const Quorum q = a.get();
  EXPECT_EQ(b.get().seq, q.seq);
  log::set_sink(nullptr);
  const std::string all = all_logged();
  EXPECT_TRUE(said) << all;
  ASSERT_EQ(q.members.size(), 2u);
  EXPECT_NE(all.find("replica group 0: quorum " + std::to_string(q.seq) +
                     " (id 2, step 1) trains with group(s) 0, 1; group 1 is back from a restart (at step 0: heals "
                     "from group 0)"),
            std::string::npos)
      << all;
}

TEST_P(CoordinatorTest, AStopEndsTheWaitForAQuorum) {
  auto only = group(0, "a", 2);
  auto waiting = std::async(std::launch::async, [&] { return only->next(at(0), stop_, seconds(60)); });
  stop_.request(SIGTERM);
  EXPECT_THROW(waiting.get(), StopRequested);
}

TEST_P(CoordinatorTest, AGroupThatAsksLateGetsTheNextQuorum) {
  std::vector<std::unique_ptr<Coordinator>> groups;
  for (int g = 0; g < 2; ++g) groups.push_back(group(g, "a", 1));
  for (auto& c : groups) wait_healthy(*c, {0, 1});
  groups[1]->withdraw();
  // Group 0 trains alone for two steps, then group 1 comes back and asks for the quorum it knew.
  EXPECT_EQ(groups[0]->next(at(0), stop_, seconds(30)).members.size(), 1u);
  EXPECT_EQ(groups[0]->next(at(1), stop_, seconds(30)).members.size(), 1u);
  groups[1]->set_incarnation("b");
  wait_healthy(*groups[0], {0, 1});
  auto late = std::async(std::launch::async, [&] { return groups[1]->next(at(0), stop_, seconds(30)); });
  wait_asked(3, 1);
  auto a0 = std::async(std::launch::async, [&] { return groups[0]->next(at(2), stop_, seconds(30)); });
  const Quorum q = late.get();
  EXPECT_EQ(a0.get().seq, q.seq);
  EXPECT_EQ(q.seq, 3);
  EXPECT_EQ(q.members.size(), 2u);
  EXPECT_EQ(q.max_step(), 2);
}

// The job's end: the first group to finish records it; a group behind it with nobody left to
// train with is told that the job is over (not left to wait, nor to start again alone), while a
// group behind it that another group still trains beside joins that group as always.
TEST_P(CoordinatorTest, AGroupBehindTheRecordedEndIsToldTheJobIsOverUnlessAnotherGroupTrainsOn) {
  std::vector<std::unique_ptr<Coordinator>> groups;
  for (int g = 0; g < 3; ++g) groups.push_back(group(g, "a", 1, milliseconds(1500)));
  for (auto& c : groups) wait_healthy(*c, {0, 1, 2});
  // Group 2 trains on (at step 7) while group 0 finishes at step 7 and leaves.
  const Finished first = groups[0]->finish(7);
  EXPECT_EQ(first.step, 7);
  EXPECT_EQ(first.group, 0);
  EXPECT_FALSE(first.at.empty());
  EXPECT_EQ(groups[2]->finish(9).step, 7) << "a second record replaced the first";
  groups[0]->withdraw();
  groups[1]->withdraw();
  wait_healthy(*groups[2], {2});
  // Group 2 at the recorded step is not behind it: it trains on alone.
  EXPECT_EQ(groups[2]->next(at(7), stop_, seconds(30)).members.size(), 1u);
  EXPECT_FALSE(groups[2]->over());
  // Group 1 back at step 0 beside group 2: it joins group 2 (and heals), the job is not over.
  groups[1]->set_incarnation("b");
  wait_healthy(*groups[2], {1, 2});
  auto back = std::async(std::launch::async, [&] { return groups[1]->next(at(0), stop_, seconds(30)); });
  wait_asked(2, 1);
  auto a2 = std::async(std::launch::async, [&] { return groups[2]->next(at(8), stop_, seconds(30)); });
  EXPECT_EQ(back.get().members.size(), 2u);
  EXPECT_EQ(a2.get().members.size(), 2u);
  // Both leave; group 1 comes back once more, alone, behind the end: the job is over for it.
  groups[1]->withdraw();
  groups[2]->withdraw();
  groups[1]->set_incarnation("c");
  wait_healthy(*groups[1], {1});
  try {
    groups[1]->next(at(0), stop_, seconds(30));
    ADD_FAILURE() << "a group alone behind the job's end got a quorum";
  } catch (const JobFinished& e) {
    EXPECT_EQ(e.record().step, 7);
    EXPECT_EQ(e.record().group, 0);
    EXPECT_NE(std::string(e.what()).find("the job finished at step 7 (replica group 0"), std::string::npos) << e.what();
  }
  ASSERT_TRUE(groups[1]->over());
  EXPECT_EQ(groups[1]->over()->step, 7);
}

// etcd alone: a ddprun store is one process (its restart with its state file is python.fault_tolerance's).
class EtcdCoordinatorTest : public CoordinatorTest {};
INSTANTIATE_TEST_SUITE_P(OnEtcd, EtcdCoordinatorTest, ::testing::Values("etcd"));

TEST_P(EtcdCoordinatorTest, TheQuorumGoesOnThroughTheLossOfAnEtcdMember) {
  std::vector<std::unique_ptr<Coordinator>> groups;
  for (int g = 0; g < 3; ++g) groups.push_back(group(g, "a", 2));
  for (auto& c : groups) wait_healthy(*c, {0, 1, 2});
  for (int64_t step = 0; step < 6; ++step) {
    if (step == 3) etcd_->kill(0);  // the member the clients talk to first
    std::vector<std::future<Quorum>> asks;
    for (auto& c : groups)
      asks.push_back(std::async(std::launch::async, [&, step] { return c->next(at(step), stop_, seconds(60)); }));
    for (auto& f : asks) {
      const Quorum q = f.get();
      EXPECT_EQ(q.seq, step + 1);
      EXPECT_EQ(q.members.size(), 3u);
      EXPECT_EQ(q.id, 1);
    }
  }
}

}  // namespace
}  // namespace ddprun::launcher::ft
