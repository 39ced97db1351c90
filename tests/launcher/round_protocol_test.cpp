// The round protocol (launcher/rendezvous/node_rendezvous), the same assertions through both
// multi-node backends (round_protocol_test.hpp): what every multi-node job relies on: one World
// per node, one end per round (the first proposal wins, every node reads it), success only when
// every node finished, a node that vanishes, a stop during the join, the join timeout, and a job
// id run again.
#include "tests/launcher/round_protocol_test.hpp"

#include <csignal>
#include <future>
#include <memory>
#include <optional>

#include "common/errors.hpp"
#include "tests/support/latest.hpp"
#include "tests/support/wait_until.hpp"

namespace ddprun::launcher::test_round_protocol {

using workers::WorkerExit;
namespace {

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
  // The job's progress as node 1 saw it travels with the failure, for every node's restart policy.
  const ProgressMark progress{.iterations = 1200, .no_progress_restarts = 2};
  ASSERT_EQ(b->report_failure(0, failed, progress).kind, RoundEnd::Kind::Failure);
  ASSERT_TRUE(test::wait_until([&] { return seen_by_a.get().has_value(); }, 10s));
  const RoundEnd at_a = *seen_by_a.get();
  EXPECT_EQ(at_a.kind, RoundEnd::Kind::Failure);
  ASSERT_TRUE(at_a.root_cause.has_value());
  EXPECT_EQ(at_a.root_cause->rank, 3);
  EXPECT_EQ(at_a.root_cause->exit_code, 7);
  EXPECT_EQ(at_a.root_node, 1);
  EXPECT_EQ(at_a.progress, progress);
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

}  // namespace
}  // namespace ddprun::launcher::test_round_protocol
