// The quorum's rules (launcher/ft/quorum.hpp) as pure functions: who trains the next step, and
// what each group must do.
#include "launcher/ft/quorum.hpp"

#include <gtest/gtest.h>

#include "common/errors.hpp"

namespace ddprun::launcher::ft {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

Member member(int group, int64_t step, std::string incarnation = "a") {
  Member m;
  m.group = group;
  m.incarnation = std::move(incarnation);
  m.step = step;
  m.store = "10.0.0." + std::to_string(group) + ":29500";
  m.recovery = {"10.0.0." + std::to_string(group) + ":7000", "10.0.0." + std::to_string(group) + ":7001"};
  m.addresses = {"10.0.0." + std::to_string(group)};
  return m;
}

Rules rules(int min_groups, milliseconds join = seconds(30)) {
  Rules r;
  r.min_groups = min_groups;
  r.join_timeout = join;
  return r;
}

std::vector<int> groups_of(const Quorum& q) {
  std::vector<int> out;
  for (const Member& m : q.members) out.push_back(m.group);
  return out;
}

TEST(QuorumRulesTest, FirstQuorumFormsAtOnceWhenEveryHeartbeatingGroupAsked) {
  Candidates c{{member(2, 0), member(0, 0), member(1, 0)}, {0, 1, 2}, milliseconds(0), {}};
  const Decision d = decide(std::nullopt, 1, c, rules(2));
  ASSERT_TRUE(d.quorum) << d.waiting;
  EXPECT_EQ(d.quorum->seq, 1);
  EXPECT_EQ(d.quorum->id, 1);
  EXPECT_EQ(groups_of(*d.quorum), (std::vector<int>{0, 1, 2}));  // by group, whatever order they asked in
}

TEST(QuorumRulesTest, WaitsForTheFewestGroupsThatMayTrain) {
  Candidates c{{member(0, 0)}, {0}, seconds(3600), {}};
  const Decision d = decide(std::nullopt, 1, c, rules(2));
  EXPECT_FALSE(d.quorum);
  EXPECT_NE(d.waiting.find("1 of the 2"), std::string::npos) << d.waiting;
}

// Too few groups to train: the wait names the groups of the job it waits for and what each does.
// Before, it named only the groups that had asked.
TEST(QuorumRulesTest, TooFewGroupsNameTheGroupsWaitedFor) {
  Quorum prev;
  prev.seq = 5;
  prev.id = 1;
  prev.members = {member(0, 4), member(1, 4)};
  Candidates c{{member(0, 5)}, {0}, seconds(1), {}};
  Decision d = decide(prev, 6, c, rules(2));
  EXPECT_FALSE(d.quorum);
  EXPECT_NE(d.waiting.find("(asked: 0); waiting for group 1 (no heartbeat: its workers failed, or it cannot reach the "
                           "quorum)"),
            std::string::npos)
      << d.waiting;
  c.healthy = {0, 1, 2};
  d = decide(prev, 6, c, rules(3));
  EXPECT_FALSE(d.quorum);
  EXPECT_NE(d.waiting.find("waiting for group 1 (heartbeats, has not asked yet), group 2 (heartbeats, has not asked "
                           "yet)"),
            std::string::npos)
      << d.waiting;
  d = decide(std::nullopt, 1, Candidates{{member(0, 0)}, {0}, seconds(1), {}}, rules(2));
  EXPECT_NE(d.waiting.find("no other group of the job heartbeats yet"), std::string::npos) << d.waiting;
}

TEST(QuorumRulesTest, WaitsForAHeartbeatingStragglerUntilTheJoinTimeout) {
  Candidates c{{member(0, 5), member(1, 5)}, {0, 1, 2}, seconds(1), {}};
  Decision d = decide(std::nullopt, 1, c, rules(2, seconds(10)));
  EXPECT_FALSE(d.quorum);
  EXPECT_NE(d.waiting.find("2"), std::string::npos) << d.waiting;  // names the straggler
  c.waited = seconds(10);
  d = decide(std::nullopt, 1, c, rules(2, seconds(10)));
  ASSERT_TRUE(d.quorum);
  EXPECT_EQ(groups_of(*d.quorum), (std::vector<int>{0, 1}));
}

TEST(QuorumRulesTest, FastQuorumWhenEveryPreviousMemberIsBackEvenIfOthersHeartbeat) {
  Quorum prev;
  prev.seq = 7;
  prev.id = 3;
  prev.members = {member(0, 6), member(1, 6)};
  // Group 2 heartbeats but has not asked: the previous members need not wait for it.
  Candidates c{{member(0, 7), member(1, 7)}, {0, 1, 2}, milliseconds(0), {}};
  const Decision d = decide(prev, 8, c, rules(1));
  ASSERT_TRUE(d.quorum) << d.waiting;
  EXPECT_EQ(d.quorum->id, 3);  // same members: same id, so no process group is rebuilt
  EXPECT_EQ(d.quorum->seq, 8);
}

TEST(QuorumRulesTest, IdChangesWithTheMembershipAndWithANewIncarnation) {
  Quorum prev;
  prev.seq = 4;
  prev.id = 2;
  prev.members = {member(0, 3), member(1, 3)};
  Candidates shrunk{{member(0, 4)}, {0}, milliseconds(0), {}};
  Decision d = decide(prev, 5, shrunk, rules(1));
  ASSERT_TRUE(d.quorum) << d.waiting;
  EXPECT_EQ(d.quorum->id, 3);
  // Group 1 back as a new process: a new member, though its group id is the same.
  Candidates back{{member(0, 4), member(1, 0, "b")}, {0, 1}, milliseconds(0), {}};
  d = decide(prev, 5, back, rules(1));
  ASSERT_TRUE(d.quorum) << d.waiting;
  EXPECT_EQ(d.quorum->id, 3);
}

TEST(QuorumRulesTest, AMinorityNeverTrainsAlone) {
  // Five groups heartbeat; two ask (the other three are cut off from them, say): not a majority,
  // whatever min_groups allows and however long they wait.
  Candidates c{{member(0, 0), member(1, 0)}, {0, 1, 2, 3, 4}, seconds(3600), {}};
  Decision d = decide(std::nullopt, 1, c, rules(1));
  EXPECT_FALSE(d.quorum);
  EXPECT_NE(d.waiting.find("more than half"), std::string::npos) << d.waiting;
  // The three of the other side make a majority.
  Candidates other{{member(2, 0), member(3, 0), member(4, 0)}, {0, 1, 2, 3, 4}, seconds(3600), {}};
  d = decide(std::nullopt, 1, other, rules(1));
  ASSERT_TRUE(d.quorum) << d.waiting;
  EXPECT_EQ(groups_of(*d.quorum), (std::vector<int>{2, 3, 4}));
  // An exact half is no majority either.
  Candidates half{{member(0, 0), member(1, 0)}, {0, 1, 2, 3}, seconds(3600), {}};
  EXPECT_FALSE(decide(std::nullopt, 1, half, rules(1)).quorum);
}

TEST(QuorumRulesTest, AGroupThatAskedAndThenWentQuietIsLeftOut) {
  Candidates c{{member(0, 2), member(1, 2), member(2, 2)}, {0, 1}, milliseconds(0), {}};
  const Decision d = decide(std::nullopt, 1, c, rules(2));
  ASSERT_TRUE(d.quorum) << d.waiting;
  EXPECT_EQ(groups_of(*d.quorum), (std::vector<int>{0, 1}));
}

// A member of the previous quorum that is not in the next one is named in it, with the reason as the
// deciding agent saw it: silent, or alive but not asking by the join timeout.
TEST(QuorumRulesTest, APreviousMemberLeftOutIsNamedWithTheReason) {
  Quorum prev;
  prev.seq = 4;
  prev.id = 1;
  prev.members = {member(0, 3), member(1, 3), member(2, 3), member(3, 3)};
  Candidates c{{member(0, 4), member(1, 4), member(2, 4)}, {0, 1, 2}, seconds(0), {}};
  Decision d = decide(prev, 5, c, rules(2, seconds(10)));
  ASSERT_TRUE(d.quorum) << d.waiting;
  EXPECT_EQ(d.quorum->left_out,
            (std::vector<std::string>{"group 3 sent no heartbeat within quorum_heartbeat_timeout (its workers failed, "
                                      "or it cannot reach the quorum)"}));
  // Group 3 heartbeats as the member it was (in its step): waited for, up to the join timeout.
  c.healthy.insert(3);
  c.incarnations[3] = "a";
  c.waited = seconds(1);
  d = decide(prev, 5, c, rules(2, seconds(10)));
  EXPECT_FALSE(d.quorum);
  EXPECT_NE(d.waiting.find("waiting for replica group(s) 3"), std::string::npos) << d.waiting;
  c.waited = seconds(10);
  d = decide(prev, 5, c, rules(2, seconds(10)));
  ASSERT_TRUE(d.quorum) << d.waiting;
  EXPECT_EQ(d.quorum->left_out, (std::vector<std::string>{"group 3 had not asked by the join timeout"}));
}

// A group back from a restart heartbeats (a new incarnation) before its workers ask: the others
// do not wait for its start. Before, they waited for it up to the join timeout (30 s by default)
// whenever its agent beat before the survivors asked.
TEST(QuorumRulesTest, AGroupBackFromARestartIsNotWaitedForBeforeItAsks) {
  Quorum prev;
  prev.seq = 20;
  prev.id = 4;
  prev.members = {member(0, 19), member(1, 19), member(2, 19)};
  Candidates c{{member(0, 20), member(2, 20)}, {0, 1, 2}, milliseconds(0), {}};
  c.incarnations = {{0, "a"}, {1, "b"}, {2, "a"}};
  Decision d = decide(prev, 21, c, rules(2, seconds(30)));
  ASSERT_TRUE(d.quorum) << d.waiting;
  EXPECT_EQ(groups_of(*d.quorum), (std::vector<int>{0, 2}));
  EXPECT_EQ(d.quorum->left_out, (std::vector<std::string>{"group 1 is back from a restart and had not asked yet: it "
                                                          "takes part from the quorum it asks in"}));
  // The same group heartbeating as the member it was is waited for.
  c.incarnations[1] = "a";
  d = decide(prev, 21, c, rules(2, seconds(30)));
  EXPECT_FALSE(d.quorum);
  // Once it asks as its new incarnation, it takes part (and heals).
  c.asking.push_back(member(1, 0, "b"));
  c.incarnations[1] = "b";
  d = decide(prev, 21, c, rules(2, seconds(30)));
  ASSERT_TRUE(d.quorum) << d.waiting;
  EXPECT_EQ(groups_of(*d.quorum), (std::vector<int>{0, 1, 2}));
}

// What a worker or a peer may write as a step: a whole number from 0 to 2^53 - 1, nothing else.
// Before, -1 made the relay's view of the quorum read the front of an empty list (ddprun died of
// SIGSEGV), and 2^63 - 1 made "one past the highest step" overflow for every later ask.
TEST(QuorumRulesTest, AStepIsAWholeNumberFromZeroToTwoToThe53) {
  EXPECT_EQ(step_of(nlohmann::json::parse(R"({"step": 0})")), 0);
  EXPECT_EQ(step_of(nlohmann::json::parse(R"({"step": 9007199254740991})")), kMostSteps);
  for (const char* bad : {R"({"step": -1})", R"({"step": 18446744073709551615})", R"({"step": 1e19})",
                          R"({"step": 9223372036854775807})", R"({"step": 9007199254740992})", R"({"step": "7"})",
                          R"({"step": null})", R"({"step": 1.5})", R"({"nostep": 1})"}) {
    EXPECT_THROW(step_of(nlohmann::json::parse(bad)), ProtocolError) << bad;
  }
  // A member record with such a step cannot be read as one (whoever wrote it).
  EXPECT_THROW(nlohmann::json::parse(R"({"group": 1, "incarnation": "x", "step": -1})").get<Member>(), ProtocolError);
}

TEST(QuorumRulesTest, AStepFromTheFutureIsLeftOutWithTheReason) {
  Quorum prev;
  prev.seq = 10;
  prev.id = 1;
  prev.members = {member(0, 9), member(1, 9), member(2, 9)};
  // One step past the previous quorum's highest is fine (it committed); 1000 is not. Group 2
  // asked: the quorum forms at once, without waiting for it until the join timeout.
  Candidates c{{member(0, 10), member(1, 10), member(2, 1000)}, {0, 1, 2}, seconds(0), {}};
  const Decision d = decide(prev, 11, c, rules(2, seconds(30)));
  ASSERT_TRUE(d.quorum) << d.waiting;
  EXPECT_EQ(groups_of(*d.quorum), (std::vector<int>{0, 1}));
  ASSERT_EQ(d.quorum->left_out.size(), 1u);
  EXPECT_NE(d.quorum->left_out[0].find("group 2 reports step 1000"), std::string::npos) << d.quorum->left_out[0];
  EXPECT_EQ(d.quorum->max_step(), 10);
}

// Every group that held the last quorum's step is gone (they all restarted from nothing): a quorum
// of them would train those steps a second time, under another membership. None forms; it waits
// for a group that holds the step (one frozen, say), saying so, and forms when one asks.
TEST(QuorumRulesTest, NoQuorumFormsWhenNoGroupHoldsTheLastQuorumsStep) {
  Quorum prev;
  prev.seq = 10;
  prev.id = 3;
  prev.members = {member(0, 9), member(1, 9)};
  Candidates c{{member(0, 0, "b"), member(1, 0, "b")}, {0, 1}, seconds(3600), {}};
  Decision d = decide(prev, 11, c, rules(1, seconds(1)));
  EXPECT_FALSE(d.quorum) << "groups 0 and 1 would commit steps 1 to 9 again";
  EXPECT_NE(d.waiting.find("no group that asked holds step 9, which quorum 10 had"), std::string::npos) << d.waiting;
  // Group 2, frozen at step 9, asks: still none, since quorum 10's members may have committed step
  // 10 before they were lost, and nobody here can tell.
  c.asking.push_back(member(2, 9));
  c.healthy.insert(2);
  d = decide(prev, 11, c, rules(1, seconds(1)));
  EXPECT_FALSE(d.quorum) << "step 10 may be committed twice";
  EXPECT_NE(d.waiting.find("is a member of quorum 10 back as it was, or holds step 10"), std::string::npos)
      << d.waiting;
  // A group that holds step 10 leads them; so does a member of quorum 10 back as it was.
  c.asking.back() = member(2, 10);
  d = decide(prev, 11, c, rules(1, seconds(1)));
  ASSERT_TRUE(d.quorum) << d.waiting;
  EXPECT_EQ(d.quorum->max_step(), 10);
  EXPECT_TRUE(view_of(*d.quorum, 0).heal);
  c.asking = {member(0, 9, "a"), member(1, 0, "b")};
  d = decide(prev, 11, c, rules(1, seconds(1)));
  ASSERT_TRUE(d.quorum) << d.waiting;
  EXPECT_TRUE(view_of(*d.quorum, 1).heal);
}

TEST(QuorumRulesTest, ShrinkOnlyLetsGroupsLeaveButNoneJoin) {
  Quorum prev;
  prev.seq = 3;
  prev.id = 2;
  prev.members = {member(0, 2), member(1, 2), member(2, 2)};
  Member zero = member(0, 3);
  zero.shrink_only = true;
  // Group 2 is gone, group 5 is new: only 0 and 1 go on, and nobody waits for 5.
  Candidates c{{zero, member(1, 3), member(5, 0)}, {0, 1, 5}, milliseconds(0), {}};
  const Decision d = decide(prev, 4, c, rules(1));
  ASSERT_TRUE(d.quorum) << d.waiting;
  EXPECT_EQ(groups_of(*d.quorum), (std::vector<int>{0, 1}));
  ASSERT_EQ(d.quorum->left_out.size(), 2u);
  EXPECT_NE(d.quorum->left_out[0].find("group 5 is not a member of quorum 3"), std::string::npos);
  EXPECT_NE(d.quorum->left_out[1].find("group 2 sent no heartbeat"), std::string::npos);
  // Without shrink-only, group 5 joins.
  Candidates open{{member(0, 3), member(1, 3), member(5, 0)}, {0, 1, 5}, milliseconds(0), {}};
  EXPECT_EQ(groups_of(*decide(prev, 4, open, rules(1)).quorum), (std::vector<int>{0, 1, 5}));
}

TEST(QuorumRulesTest, GroupsBehindHealFromUpToDateOnesInTurn) {
  Quorum q;
  q.seq = 9;
  q.id = 4;
  q.members = {member(0, 0), member(1, 8), member(2, 8), member(3, 5), member(4, 2)};
  const GroupView v0 = view_of(q, 0);
  EXPECT_TRUE(v0.heal);
  EXPECT_EQ(v0.recover_from, 1);
  EXPECT_EQ(v0.recover_addresses, member(1, 8).recovery);
  EXPECT_EQ(v0.max_step, 8);
  EXPECT_EQ(v0.replica_rank, 0);
  EXPECT_EQ(v0.replica_world_size, 5);
  EXPECT_EQ(v0.participants, 2);             // only the groups at max_step contribute gradients
  EXPECT_EQ(view_of(q, 3).recover_from, 2);  // the next one behind heals from the next up-to-date
  EXPECT_EQ(view_of(q, 4).recover_from, 1);
  const GroupView v1 = view_of(q, 1);
  EXPECT_FALSE(v1.heal);
  EXPECT_EQ(v1.recover_from, -1);
  EXPECT_EQ(v1.serves, (std::vector<int>{0, 4}));
  EXPECT_EQ(view_of(q, 2).serves, (std::vector<int>{3}));
  // The participants' places, which split a step's samples: the up-to-date groups in order; a
  // healing group trains on none.
  EXPECT_EQ(v1.participant_rank, 0);
  EXPECT_EQ(view_of(q, 2).participant_rank, 1);
  EXPECT_EQ(v0.participant_rank, -1);
  EXPECT_EQ(view_of(q, 3).participant_rank, -1);
  EXPECT_EQ(nlohmann::json(v1).at("participant_rank"), 0);
  // The cross-group store is an up-to-date member's, never a healing one's.
  EXPECT_EQ(v0.store, member(1, 8).store);
  EXPECT_EQ(v0.groups, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_FALSE(v0.reconfigure);
}

TEST(QuorumRulesTest, AFailedStepOfAnyMemberRebuildsTheCrossGroupProcessGroup) {
  Quorum q;
  q.seq = 2;
  q.id = 1;
  q.members = {member(0, 1), member(1, 1)};
  q.members[1].pg_ok = false;
  EXPECT_TRUE(view_of(q, 0).reconfigure);
  EXPECT_TRUE(view_of(q, 1).reconfigure);
}

TEST(QuorumRulesTest, QuorumRoundTripsThroughJson) {
  Quorum q;
  q.seq = 12;
  q.id = 5;
  q.members = {member(0, 11), member(3, 11, "x:1:2")};
  q.members[1].shrink_only = true;
  q.left_out = {"group 7: why"};
  const Quorum back = nlohmann::json(q).get<Quorum>();
  EXPECT_EQ(back.seq, 12);
  EXPECT_EQ(back.id, 5);
  ASSERT_EQ(back.members.size(), 2u);
  EXPECT_EQ(back.members[1].id(), "3/x:1:2");
  EXPECT_TRUE(back.members[1].shrink_only);
  EXPECT_EQ(back.members[1].recovery, q.members[1].recovery);
  EXPECT_EQ(back.left_out, q.left_out);
}

}  // namespace
}  // namespace ddprun::launcher::ft
