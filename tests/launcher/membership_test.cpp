// A round's membership (launcher/rendezvous/membership.hpp), the same on both backends.
#include "launcher/rendezvous/membership.hpp"

#include <gtest/gtest.h>

namespace ddprun::launcher {

using rendezvous::Joiner;
using rendezvous::Membership;
using rendezvous::order_by_group_rank;
using rendezvous::World;
using rendezvous::world_of;
namespace {

Joiner joiner(const std::string& agent, int64_t arrival, int hint = -1, bool store_host = false, int nproc = 2) {
  Joiner j;
  j.id = agent;
  j.arrival = arrival;
  j.record.agent = agent;
  j.record.host = "host-" + agent;
  j.record.addr = "10.0.0." + std::to_string(arrival);
  j.record.nproc = nproc;
  j.record.hint = hint;
  j.record.store_host = store_host;
  return j;
}

std::vector<std::string> ids(const std::vector<Joiner>& js) {
  std::vector<std::string> out;
  for (const auto& j : js) out.push_back(j.id);
  return out;
}

TEST(MembershipTest, TheStoreHostComesFirstThenHintsThenArrival) {
  std::vector<Joiner> js = {joiner("a", 1), joiner("b", 2, /*hint=*/1), joiner("c", 3), joiner("d", 4, -1, true),
                            joiner("e", 5, /*hint=*/0)};
  order_by_group_rank(js);
  EXPECT_EQ(ids(js), (std::vector<std::string>{"d", "e", "b", "a", "c"}));
}

TEST(MembershipTest, OffsetsAreThePrefixSumsOfNprocAndOnlyGroupRankZeroGetsThePeers) {
  std::vector<rdzv::jobs::NodeRecord> nodes;
  for (auto [agent, nproc] : std::vector<std::pair<std::string, int>>{{"x", 4}, {"y", 1}, {"z", 3}}) {
    nodes.push_back(joiner(agent, static_cast<int64_t>(nodes.size()) + 1, -1, false, nproc).record);
  }
  const Membership m(nodes);
  EXPECT_EQ(m.size(), 3);
  EXPECT_EQ(m.world_size(), 8);
  EXPECT_EQ(m.rank_offset(0), 0);
  EXPECT_EQ(m.rank_offset(1), 4);
  EXPECT_EQ(m.rank_offset(2), 5);
  EXPECT_EQ(m.group_rank_of("z"), 2);
  EXPECT_EQ(m.group_rank_of("nobody"), -1);
  EXPECT_EQ(m.agents(), (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_EQ(m.peer_addresses(),
            (std::vector<std::string>{"10.0.0.1", "host-x", "10.0.0.2", "host-y", "10.0.0.3", "host-z"}));
  const World w0 = world_of(7, m, 0, {"10.0.0.1", 29500});
  EXPECT_EQ(w0.round, 7);
  EXPECT_EQ(w0.world_size, 8);
  EXPECT_EQ(w0.master_port, 29500);
  EXPECT_EQ(w0.peer_addresses.size(), 6u);
  const World w2 = world_of(7, m, 2, {"10.0.0.1", 29500});
  EXPECT_EQ(w2.group_rank, 2);
  EXPECT_EQ(w2.group_world_size, 3);
  EXPECT_EQ(w2.rank_offset, 5);
  EXPECT_TRUE(w2.peer_addresses.empty());
  EXPECT_EQ(w2.restarts, 0);
}

// --max_restarts is the job's: a round's world carries the most restarts any of its nodes has made,
// so a node that joined late (or came back as a new process) counts from there.
TEST(MembershipTest, TheWorldCarriesTheMostRestartsOfAnyNode) {
  std::vector<rdzv::jobs::NodeRecord> nodes;
  for (int restarts : {2, 0, 1}) {
    auto r = joiner("n" + std::to_string(nodes.size()), static_cast<int64_t>(nodes.size()) + 1).record;
    r.restarts = restarts;
    nodes.push_back(r);
  }
  const Membership m(nodes);
  EXPECT_EQ(world_of(3, m, 1, {"10.0.0.1", 29500}).restarts, 2);
}

// torchrun's role ranks: ROLE_RANK counts the workers of the nodes of one --role in group-rank
// order, ROLE_WORLD_SIZE is theirs alone.
TEST(MembershipTest, RoleRanksCountWithinTheNodesOfEachRole) {
  std::vector<rdzv::jobs::NodeRecord> nodes;
  for (auto [role, nproc] : std::vector<std::pair<std::string, int>>{{"master", 1}, {"trainer", 2}, {"trainer", 3}}) {
    auto r =
        joiner("n" + std::to_string(nodes.size()), static_cast<int64_t>(nodes.size()) + 1, -1, false, nproc).record;
    r.role = role;
    nodes.push_back(r);
  }
  const Membership m(nodes);
  const World master = world_of(0, m, 0, {"10.0.0.1", 29500});
  EXPECT_EQ(master.rank_offset, 0);
  EXPECT_EQ(master.role_rank_offset, 0);
  EXPECT_EQ(master.role_world_size, 1);
  const World second = world_of(0, m, 2, {"10.0.0.1", 29500});
  EXPECT_EQ(second.rank_offset, 3);
  EXPECT_EQ(second.role_rank_offset, 2);
  EXPECT_EQ(second.role_world_size, 5);
  EXPECT_EQ(second.world_size, 6);
}

}  // namespace
}  // namespace ddprun::launcher
