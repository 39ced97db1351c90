// The round protocol (launcher/rendezvous/node_rendezvous), the same assertions through both
// multi-node backends: two or three nodes of one job as backend objects in this process, joined
// from threads, against a store in this process (test_launcher_unit) and against a real etcd
// (test_launcher, built with ROUND_PROTOCOL_ON_ETCD). What every multi-node job relies on: one
// World per node, one end per round (the first proposal wins, every node reads it), success only
// when every node finished, a node that vanishes, a stop during the join, the join timeout, and a
// job id run again.
#include <gtest/gtest.h>

#include <csignal>
#include <future>
#include <memory>
#include <optional>

#include "common/errors.hpp"
#include "launcher/rendezvous/store/store_rendezvous.hpp"
#include "rendezvous/client/client.hpp"
#include "rendezvous/core/job_keys.hpp"
#include "rendezvous/server/server.hpp"
#include "tests/support/latest.hpp"
#include "tests/support/wait_until.hpp"
#ifdef ROUND_PROTOCOL_ON_ETCD
#include "launcher/rendezvous/etcd/etcd_rendezvous.hpp"
#include "tests/support/etcd_cluster.hpp"
#endif

namespace ddprun::launcher {

using rendezvous::RendezvousBackend;
using rendezvous::RoundEnd;
using rendezvous::World;
using rendezvous::store::StoreRendezvous;
using rendezvous::store::StoreRendezvousOptions;
using workers::StopSignal;
using workers::WorkerExit;
namespace {

using namespace std::chrono_literals;

// Where the nodes rendezvous, and what the tests need to see of it.
class Backend {
 public:
  virtual ~Backend() = default;
  // Node `rank` of a job of `nnodes` (all of them needed).
  virtual std::unique_ptr<RendezvousBackend> node(int rank, int nnodes, std::chrono::milliseconds join_timeout,
                                                  const StopSignal& stop) = 0;
  // How many nodes have joined round 0 of `any`'s generation so far.
  virtual int joined(RendezvousBackend& any) = 0;
  virtual int64_t generation(RendezvousBackend& r) = 0;
  // What the end says of a lost node, and the join timeout of the nodes that are missing.
  virtual std::string lost_says() const = 0;
  virtual std::string missing_says() const = 0;
};

class StoreBackend final : public Backend {
 public:
  StoreBackend() {
    rdzv::ServerOptions so;
    so.log_lifecycle = false;
    server_ = std::make_unique<rdzv::ServerThread>(so);
  }
  std::unique_ptr<RendezvousBackend> node(int rank, int nnodes, std::chrono::milliseconds join_timeout,
                                          const StopSignal& stop) override {
    StoreRendezvousOptions o;
    o.run_id = "job";
    o.nnodes = o.min_nodes = nnodes;
    o.node_rank = rank;
    o.endpoint_host = "127.0.0.1";
    o.endpoint_port = server_->port();
    o.advertise_addr = "127.0.0.1";
    o.host = std::string("host-") + static_cast<char>('a' + rank);
    o.join_timeout = join_timeout;
    o.keep_alive_interval = 100ms;
    o.keep_alive_max_attempt = 3;
    return std::make_unique<StoreRendezvous>(o, stop);
  }
  int joined(RendezvousBackend& any) override {
    rdzv::ClientOptions co;
    co.host = "127.0.0.1";
    co.port = server_->port();
    rdzv::Client c(co);
    const std::string k = rdzv::jobs::JobKeys("job", generation(any)).round(0).joined();
    return static_cast<int>(c.add(k, 0));
  }
  int64_t generation(RendezvousBackend& r) override { return dynamic_cast<StoreRendezvous&>(r).generation(); }
  std::string lost_says() const override { return "sent no heartbeat for"; }
  std::string missing_says() const override { return "1 of 2 nodes joined; missing node_rank 1"; }

 private:
  std::unique_ptr<rdzv::ServerThread> server_;
};

#ifdef ROUND_PROTOCOL_ON_ETCD
using rendezvous::etcd::EtcdRendezvous;
using rendezvous::etcd::EtcdRendezvousOptions;
namespace etcd = rendezvous::etcd;

class EtcdBackend final : public Backend {
 public:
  EtcdBackend() {
    if (!test::have_etcd()) throw std::runtime_error("etcd-server is not installed: run scripts/install_deps.sh");
    cluster_ = std::make_unique<test::EtcdCluster>(1);
  }
  std::unique_ptr<RendezvousBackend> node(int rank, int nnodes, std::chrono::milliseconds join_timeout,
                                          const StopSignal& stop) override {
    EtcdRendezvousOptions o;
    o.run_id = "job";
    o.nnodes = o.min_nodes = nnodes;
    o.node_rank_hint = rank;
    o.advertise_addr = "127.0.0.1";
    o.host = std::string("host-") + static_cast<char>('a' + rank);
    o.join_timeout = join_timeout;
    o.etcd.endpoints = {cluster_->endpoint(0)};
    o.lease_ttl = std::chrono::seconds(3);
    return std::make_unique<EtcdRendezvous>(o, stop);
  }
  int joined(RendezvousBackend& any) override {
    etcd::Options eo;
    eo.endpoints = {cluster_->endpoint(0)};
    etcd::Client c(eo);
    const std::string members =
        "/ddprun/job/g" + std::to_string(generation(any)) + "/r0/" + std::string(rdzv::jobs::round_names::kMember);
    return static_cast<int>(c.get_prefix(members, etcd::Client::after(5s), true).kvs.size());
  }
  int64_t generation(RendezvousBackend& r) override { return dynamic_cast<EtcdRendezvous&>(r).generation(); }
  std::string lost_says() const override { return "lost its etcd lease"; }
  std::string missing_says() const override { return "1 node(s) joined, 2 needed to start"; }

 private:
  std::unique_ptr<test::EtcdCluster> cluster_;
};
#endif

class RoundProtocolTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
#ifdef ROUND_PROTOCOL_ON_ETCD
    if (GetParam() == "etcd") backend_ = std::make_unique<EtcdBackend>();
#endif
    if (GetParam() == "store") backend_ = std::make_unique<StoreBackend>();
    ASSERT_TRUE(backend_) << GetParam();
  }

  std::unique_ptr<RendezvousBackend> node(int rank, int nnodes = 2, std::chrono::milliseconds join_timeout = 20s) {
    return backend_->node(rank, nnodes, join_timeout, stop_);
  }

  static std::variant<World, RoundEnd> join(RendezvousBackend& r, int nproc, const StopSignal& stop) {
    return r.join(0, nproc, [] { return uint16_t{4242}; }, stop);
  }

  // Joins round 0 with both nodes at once (2 and 3 workers); node 0 hosts the worker store.
  std::pair<World, World> join_both(RendezvousBackend& a, RendezvousBackend& b) {
    auto world = [this](RendezvousBackend& r, int nproc) {
      auto result = join(r, nproc, stop_);
      if (!std::holds_alternative<World>(result)) throw std::runtime_error(std::get<RoundEnd>(result).detail);
      return std::get<World>(result);
    };
    auto wa = std::async(std::launch::async, world, std::ref(a), 2);
    auto wb = std::async(std::launch::async, world, std::ref(b), 3);
    return {wa.get(), wb.get()};
  }

  std::unique_ptr<Backend> backend_;
  StopSignal stop_;
};

// Collects what a node's watcher reports.
using Watched = test::Latest<RoundEnd>;

TEST_P(RoundProtocolTest, BothNodesAgreeOnOneWorldWithContiguousRanks) {
  auto a = node(0), b = node(1);
  const auto [wa, wb] = join_both(*a, *b);
  EXPECT_EQ(wa.group_rank, 0);
  EXPECT_EQ(wb.group_rank, 1);
  EXPECT_EQ(wa.group_world_size, 2);
  EXPECT_EQ(wa.world_size, 5);
  EXPECT_EQ(wb.world_size, 5);
  EXPECT_EQ(wa.rank_offset, 0);
  EXPECT_EQ(wb.rank_offset, 2);
  EXPECT_EQ(wb.master_addr, "127.0.0.1");
  EXPECT_EQ(wb.master_port, 4242);
  EXPECT_EQ(a->node_rank(), 0);
  EXPECT_EQ(b->node_rank(), 1);
  // Only the worker store's host learns every node's address.
  EXPECT_FALSE(wa.peer_addresses.empty());
  EXPECT_TRUE(wb.peer_addresses.empty());
}

TEST_P(RoundProtocolTest, TheFirstEndProposedIsTheOneEveryNodeSees) {
  auto a = node(0), b = node(1);
  join_both(*a, *b);
  Watched seen_by_a;
  a->watch(0, seen_by_a.sink());
  WorkerExit failed;
  failed.rank = 3;
  failed.local_rank = 1;
  failed.host = "host-b";
  failed.exit_code = 7;
  ASSERT_EQ(b->report_failure(0, failed).kind, RoundEnd::Kind::Failure);
  ASSERT_TRUE(test::wait_until([&] { return seen_by_a.get().has_value(); }, 10s));
  const RoundEnd at_a = *seen_by_a.get();
  EXPECT_EQ(at_a.kind, RoundEnd::Kind::Failure);
  ASSERT_TRUE(at_a.root_cause.has_value());
  EXPECT_EQ(at_a.root_cause->rank, 3);
  EXPECT_EQ(at_a.root_cause->exit_code, 7);
  EXPECT_EQ(at_a.root_node, 1);
  // A later proposal (node 0 stopped by a signal) does not change what was decided.
  EXPECT_EQ(a->report_signal(0, SIGTERM).kind, RoundEnd::Kind::Failure);
  EXPECT_EQ(b->wait_end(0, stop_).kind, RoundEnd::Kind::Failure);
  a->unwatch();
}

TEST_P(RoundProtocolTest, SuccessIsDecidedOnlyWhenEveryNodeFinished) {
  auto a = node(0), b = node(1);
  join_both(*a, *b);
  auto first = std::async(std::launch::async, [&] { return a->report_success(0, stop_); });
  // Node 0 waits for node 1: no end while only one node has finished.
  EXPECT_EQ(first.wait_for(500ms), std::future_status::timeout);
  EXPECT_EQ(b->report_success(0, stop_).kind, RoundEnd::Kind::Success);
  EXPECT_EQ(first.get().kind, RoundEnd::Kind::Success);
  const int64_t generation = backend_->generation(*a);
  a->leave(0, 5s, stop_);
  b->leave(0, 5s, stop_);
  // The job's outcome is recorded as the nodes leave: the job id run again is a new generation.
  auto again = node(0);
  EXPECT_EQ(backend_->generation(*again), generation + 1);
}

TEST_P(RoundProtocolTest, ANodeThatVanishesIsLostToTheOthers) {
  auto a = node(0), b = node(1);
  join_both(*a, *b);
  Watched seen_by_a;
  a->watch(0, seen_by_a.sink());
  b.reset();  // node 1's ddprun is gone without leaving: its heartbeat or lease ends
  ASSERT_TRUE(test::wait_until([&] { return seen_by_a.get().has_value(); }, 20s));
  const RoundEnd end = *seen_by_a.get();
  EXPECT_EQ(end.kind, RoundEnd::Kind::NodeLost);
  EXPECT_EQ(end.root_node, 1);
  EXPECT_NE(end.detail.find("node 1 (host-b) " + backend_->lost_says()), std::string::npos) << end.detail;
  // Decided where every node reads it.
  EXPECT_EQ(a->wait_end(0, stop_).kind, RoundEnd::Kind::NodeLost);
  a->unwatch();
}

// The same when node 1 is gone before node 0's watcher has read the round: its absence is the
// news (etcd: its member key went with its lease before the watch began).
TEST_P(RoundProtocolTest, ANodeGoneBeforeTheWatchBeginsIsLostToo) {
  auto a = node(0), b = node(1);
  join_both(*a, *b);
  b.reset();
  Watched seen_by_a;
  a->watch(0, seen_by_a.sink());
  ASSERT_TRUE(test::wait_until([&] { return seen_by_a.get().has_value(); }, 20s));
  const RoundEnd end = *seen_by_a.get();
  EXPECT_EQ(end.kind, RoundEnd::Kind::NodeLost);
  EXPECT_EQ(end.root_node, 1);
  a->unwatch();
}

TEST_P(RoundProtocolTest, AStopDuringTheJoinEndsTheRoundForTheNodesWaitingInIt) {
  // Three nodes needed, two there: node 0 is stopped while both wait for node 2.
  auto a = node(0, 3), b = node(1, 3);
  StopSignal stop_a;
  auto joining_a = std::async(std::launch::async, [&] { return join(*a, 1, stop_a); });
  auto joining_b = std::async(std::launch::async, [&] { return join(*b, 1, stop_); });
  ASSERT_TRUE(test::wait_until([&] { return backend_->joined(*a) == 2; }, 10s));
  stop_a.request(SIGTERM);
  EXPECT_THROW(joining_a.get(), StopRequested);
  // Node 1 learns that the round ended at once, not at its join timeout (20 s).
  ASSERT_EQ(joining_b.wait_for(10s), std::future_status::ready);
  const auto result = joining_b.get();
  ASSERT_TRUE(std::holds_alternative<RoundEnd>(result));
  EXPECT_EQ(std::get<RoundEnd>(result).kind, RoundEnd::Kind::Signal);
}

TEST_P(RoundProtocolTest, TheJoinTimeoutNamesTheNodesThatAreMissing) {
  auto a = node(0, 2, 500ms);
  try {
    join(*a, 1, stop_);
    FAIL() << "the join did not time out";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("timed out after"), std::string::npos) << what;
    EXPECT_NE(what.find(backend_->missing_says()), std::string::npos) << what;
    EXPECT_NE(what.find("--rdzv_conf join_timeout"), std::string::npos) << what;
  }
}

#ifdef ROUND_PROTOCOL_ON_ETCD
INSTANTIATE_TEST_SUITE_P(Etcd, RoundProtocolTest, ::testing::Values("etcd"));
#else
INSTANTIATE_TEST_SUITE_P(Store, RoundProtocolTest, ::testing::Values("store"));
#endif

}  // namespace
}  // namespace ddprun::launcher
