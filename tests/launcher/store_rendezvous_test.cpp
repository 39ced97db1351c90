// The round protocol (launcher/rendezvous/node_rendezvous) through the store backend, against an
// in-process store: two nodes of one job as two StoreRendezvous objects in this process, joined
// from two threads. What every multi-node job relies on: one World per node, one end per round
// (the first proposal wins, every node reads it), success only when every node finished, a
// neighbour's lost heartbeat, a stop during the join, the join timeout, and a job id run again.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "common/errors.hpp"
#include "launcher/rendezvous/rendezvous_values.hpp"
#include "launcher/rendezvous/store/store_rendezvous.hpp"
#include "rendezvous/client/client.hpp"
#include "rendezvous/core/job_keys.hpp"
#include "rendezvous/server/server.hpp"
#include "tests/support/wait_until.hpp"

namespace ddprun::launcher {
namespace {

using namespace std::chrono_literals;

// A standalone store (as ddprun-rendezvous serves one) that the nodes rendezvous through.
class StoreRendezvousTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rdzv::ServerOptions so;
    so.log_lifecycle = false;
    server_ = std::make_unique<rdzv::ServerThread>(so);
  }

  StoreRendezvousOptions node(int rank, const std::string& run_id = "job") const {
    StoreRendezvousOptions o;
    o.run_id = run_id;
    o.nnodes = 2;
    o.min_nodes = 2;
    o.node_rank = rank;
    o.endpoint_host = "127.0.0.1";
    o.endpoint_port = server_->port();
    o.advertise_addr = "127.0.0.1";
    o.host = rank == 0 ? "host-a" : "host-b";
    o.join_timeout = 20s;
    o.keep_alive_interval = 100ms;
    o.keep_alive_max_attempt = 3;
    o.store_reconnect_timeout = 0ms;
    return o;
  }

  // Joins round 0 with both nodes at once; node 0 hosts the worker store (port 4242 + its rank).
  std::pair<World, World> join_both(StoreRendezvous& a, StoreRendezvous& b) {
    auto join = [this](StoreRendezvous& r, int nproc) {
      auto result = r.join(0, nproc, [] { return uint16_t{4242}; }, stop_);
      if (!std::holds_alternative<World>(result)) throw std::runtime_error(std::get<RoundEnd>(result).detail);
      return std::get<World>(result);
    };
    auto wa = std::async(std::launch::async, join, std::ref(a), 2);
    auto wb = std::async(std::launch::async, join, std::ref(b), 3);
    return {wa.get(), wb.get()};
  }

  std::string stored(const std::string& key) {
    rdzv::ClientOptions co;
    co.host = "127.0.0.1";
    co.port = server_->port();
    rdzv::Client c(co);
    return c.check({key}) ? c.get(key) : std::string();
  }

  std::unique_ptr<rdzv::ServerThread> server_;
  StopSignal stop_;
};

// Collects what a node's watcher reports.
struct Watched {
  std::mutex mutex;
  std::optional<RoundEnd> end;
  std::function<void(const RoundEnd&)> sink() {
    return [this](const RoundEnd& e) {
      std::lock_guard lock(mutex);
      end = e;
    };
  }
  std::optional<RoundEnd> get() {
    std::lock_guard lock(mutex);
    return end;
  }
};

TEST_F(StoreRendezvousTest, BothNodesAgreeOnOneWorldWithContiguousRanks) {
  StoreRendezvous a(node(0), stop_), b(node(1), stop_);
  const auto [wa, wb] = join_both(a, b);
  EXPECT_EQ(wa.group_rank, 0);
  EXPECT_EQ(wb.group_rank, 1);
  EXPECT_EQ(wa.group_world_size, 2);
  EXPECT_EQ(wa.world_size, 5);
  EXPECT_EQ(wb.world_size, 5);
  EXPECT_EQ(wa.rank_offset, 0);
  EXPECT_EQ(wb.rank_offset, 2);
  EXPECT_EQ(wb.master_addr, "127.0.0.1");
  EXPECT_EQ(wb.master_port, 4242);
  EXPECT_EQ(a.node_rank(), 0);
  EXPECT_EQ(b.node_rank(), 1);
  // Only the worker store's host learns every node's address.
  EXPECT_FALSE(wa.peer_addresses.empty());
  EXPECT_TRUE(wb.peer_addresses.empty());
}

TEST_F(StoreRendezvousTest, TheFirstEndProposedIsTheOneEveryNodeSees) {
  StoreRendezvous a(node(0), stop_), b(node(1), stop_);
  join_both(a, b);
  Watched seen_by_a;
  a.watch(0, seen_by_a.sink());
  WorkerExit failed;
  failed.rank = 3;
  failed.local_rank = 1;
  failed.host = "host-b";
  failed.exit_code = 7;
  const RoundEnd decided = b.report_failure(0, failed);
  ASSERT_EQ(decided.kind, RoundEnd::Kind::Failure);
  ASSERT_TRUE(ddprun::test::wait_until([&] { return seen_by_a.get().has_value(); }, 10s));
  const RoundEnd at_a = *seen_by_a.get();
  EXPECT_EQ(at_a.kind, RoundEnd::Kind::Failure);
  ASSERT_TRUE(at_a.root_cause.has_value());
  EXPECT_EQ(at_a.root_cause->rank, 3);
  EXPECT_EQ(at_a.root_cause->exit_code, 7);
  EXPECT_EQ(at_a.root_node, 1);
  // A later proposal (node 0 stopped by a signal) does not change what was decided.
  const RoundEnd later = a.report_signal(0, SIGTERM);
  EXPECT_EQ(later.kind, RoundEnd::Kind::Failure);
  EXPECT_EQ(b.wait_end(0, stop_).kind, RoundEnd::Kind::Failure);
  a.unwatch();
}

TEST_F(StoreRendezvousTest, SuccessIsDecidedOnlyWhenEveryNodeFinished) {
  StoreRendezvous a(node(0), stop_), b(node(1), stop_);
  join_both(a, b);
  auto first = std::async(std::launch::async, [&] { return a.report_success(0, stop_); });
  // Node 0 waits for node 1: no end while only one node has finished.
  EXPECT_EQ(first.wait_for(300ms), std::future_status::timeout);
  EXPECT_EQ(stored(rdzv::jobs::JobKeys("job", a.generation()).round(0).end()), "");
  EXPECT_EQ(b.report_success(0, stop_).kind, RoundEnd::Kind::Success);
  EXPECT_EQ(first.get().kind, RoundEnd::Kind::Success);
  // Leaving: the first node out records the job's outcome, the last lets the generation go.
  const rdzv::jobs::JobKeys keys("job", a.generation());
  a.leave(0, 5s, stop_);
  EXPECT_EQ(stored(keys.done()), "");
  b.leave(0, 5s, stop_);
  EXPECT_EQ(rdzv::jobs::decode_outcome(stored(keys.ended())).kind, rdzv::jobs::Outcome::Kind::Success);
  EXPECT_EQ(stored(keys.done()), "1");
  // The job id run again is a new generation, not the ended one.
  StoreRendezvous again(node(0), stop_);
  EXPECT_EQ(again.generation(), a.generation() + 1);
}

TEST_F(StoreRendezvousTest, ANodeWhoseHeartbeatStopsIsLostToItsNeighbour) {
  StoreRendezvous a(node(0), stop_), b(node(1), stop_);
  join_both(a, b);
  Watched seen_by_a;
  a.watch(0, seen_by_a.sink());
  b.quiesce();  // node 1's heartbeat stops, as when its ddprun is frozen or cut off
  ASSERT_TRUE(ddprun::test::wait_until([&] { return seen_by_a.get().has_value(); }, 10s));
  const RoundEnd end = *seen_by_a.get();
  EXPECT_EQ(end.kind, RoundEnd::Kind::NodeLost);
  EXPECT_EQ(end.root_node, 1);
  EXPECT_NE(end.detail.find("node 1 (host-b) sent no heartbeat for"), std::string::npos) << end.detail;
  // Written where node 1 reads it too, once it is back.
  EXPECT_EQ(b.wait_end(0, stop_).kind, RoundEnd::Kind::NodeLost);
  a.unwatch();
}

TEST_F(StoreRendezvousTest, AStopDuringTheJoinEndsTheRoundForTheNodesWaitingInIt) {
  // Three nodes expected, two there: node 0 is stopped while both wait for node 2.
  StoreRendezvousOptions o0 = node(0), o1 = node(1);
  o0.nnodes = o0.min_nodes = o1.nnodes = o1.min_nodes = 3;
  StoreRendezvous a(o0, stop_), b(o1, stop_);
  StopSignal stop_a;
  auto host = [] { return uint16_t{4242}; };
  auto joining_a = std::async(std::launch::async, [&] { return a.join(0, 1, host, stop_a); });
  auto joining_b = std::async(std::launch::async, [&] { return b.join(0, 1, host, stop_); });
  const rdzv::jobs::RoundKeys round = rdzv::jobs::JobKeys("job", a.generation()).round(0);
  ASSERT_TRUE(ddprun::test::wait_until(
      [&] { return !stored(round.node(0)).empty() && !stored(round.node(1)).empty(); }, 10s));
  stop_a.request(SIGTERM);
  EXPECT_THROW(joining_a.get(), StopRequested);
  // Node 1 learns that the round ended at once, not at its join timeout (20 s).
  ASSERT_EQ(joining_b.wait_for(10s), std::future_status::ready);
  const auto result = joining_b.get();
  ASSERT_TRUE(std::holds_alternative<RoundEnd>(result));
  EXPECT_EQ(std::get<RoundEnd>(result).kind, RoundEnd::Kind::Signal);
  // And the job's outcome is recorded: a later run of the job id starts a new generation.
  EXPECT_FALSE(stored(rdzv::jobs::JobKeys("job", a.generation()).ended()).empty());
}

TEST_F(StoreRendezvousTest, TheJoinTimeoutNamesTheNodesThatAreMissing) {
  StoreRendezvousOptions o = node(0);
  o.join_timeout = 500ms;
  StoreRendezvous a(o, stop_);
  try {
    a.join(0, 1, [] { return uint16_t{4242}; }, stop_);
    FAIL() << "the join did not time out";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("1 of 2 nodes joined; missing node_rank 1"), std::string::npos) << what;
    EXPECT_NE(what.find("--rdzv_conf join_timeout"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace ddprun::launcher
