// The round's records (rendezvous/jobs/records.hpp): one encoder and one decoder each, and what a
// record written by another program or version reads as.
#include "rendezvous/jobs/records.hpp"

#include <gtest/gtest.h>

namespace ddprun::rdzv::jobs {
namespace {

TEST(RecordsTest, ANodeRecordSurvivesItsEncodingAndOptionalFieldsStayOut) {
  NodeRecord r;
  r.host = "node7";
  r.addr = "10.0.0.7";
  r.agent = "node7-4242-abc";
  r.nproc = 8;
  r.pid = 4242;
  r.nnodes = 4;
  r.joined_ms = 1700000000000;
  EXPECT_EQ(decode_node_record(encode(r)), r);
  // No hint, no store host, no agent: the keys are absent, as older versions wrote them.
  r.agent.clear();
  const auto j = nlohmann::json::parse(encode(r));
  EXPECT_FALSE(j.contains("hint"));
  EXPECT_FALSE(j.contains("store_host"));
  EXPECT_FALSE(j.contains("agent"));
  EXPECT_FALSE(j.contains("restarts"));
  EXPECT_FALSE(j.contains("role"));  // "default"
  r.hint = 2;
  r.store_host = true;
  r.restarts = 3;
  r.role = "trainer";
  EXPECT_EQ(decode_node_record(encode(r)), r);
}

TEST(RecordsTest, AForeignNodeRecordReadsItsWrongFieldsAsDefaultsAndGarbageAsNothing) {
  const auto r = decode_node_record(R"({"host":7,"addr":"a","nproc":"8","hint":1e3,"pid":99999999999})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->host, "");
  EXPECT_EQ(r->addr, "a");
  EXPECT_EQ(r->nproc, 0);
  EXPECT_EQ(r->hint, -1);
  EXPECT_EQ(r->pid, 0);  // out of int range
  EXPECT_FALSE(decode_node_record("{bad json"));
  EXPECT_FALSE(decode_node_record("[1,2]"));
  EXPECT_FALSE(decode_node_record(""));
}

TEST(RecordsTest, AWorkerStoreRecordNeedsAnAddressAndAPortInRange) {
  EXPECT_EQ(decode_worker_store(encode(WorkerStoreRecord{"10.0.0.1", 29500, ""})),
            (WorkerStoreRecord{"10.0.0.1", 29500, ""}));
  EXPECT_FALSE(decode_worker_store(R"({"addr":"10.0.0.1"})"));
  EXPECT_FALSE(decode_worker_store(R"({"addr":"","port":1})"));
  EXPECT_FALSE(decode_worker_store(R"({"addr":"h","port":65536})"));
  EXPECT_FALSE(decode_worker_store(R"({"addr":"h","port":0})"));
  EXPECT_FALSE(decode_worker_store("29500"));
  // A replica group's round key travels with it; a record without one reads as none.
  const WorkerStoreRecord keyed{"10.0.0.1", 29500, std::string(64, 'f')};
  EXPECT_EQ(decode_worker_store(encode(keyed)), keyed);
  EXPECT_EQ(decode_worker_store(R"({"addr":"h","port":1})")->key, "");
}

TEST(RecordsTest, AnAssignmentNeedsItsFourNumbersAndKeepsItsLists) {
  Assignment a;
  a.group_rank = 1;
  a.group_world_size = 2;
  a.offset = 4;
  a.world_size = 8;
  a.agents = {"x", "y"};
  a.hosts = {"a", "b"};
  EXPECT_EQ(decode_assignment(encode(a)), a);
  a.restarts = 2;  // the job's restarts ride along
  EXPECT_EQ(decode_assignment(encode(a)), a);
  a.role_offset = 1;  // and the node's place among the workers of its role
  a.role_world_size = 3;
  EXPECT_EQ(decode_assignment(encode(a)), a);
  EXPECT_FALSE(decode_assignment(R"({"group_rank":0,"group_world_size":2,"offset":0})"));
  EXPECT_FALSE(decode_assignment(R"({"group_rank":-1,"group_world_size":2,"offset":0,"world_size":4})"));
}

TEST(RecordsTest, AClosedRoundKeepsItsMembersInOrderAndRefusesANonRecordMember) {
  ClosedRound c;
  for (const char* agent : {"b", "a", "c"}) {
    NodeRecord r;
    r.agent = agent;
    r.nproc = 2;
    c.members.push_back(r);
  }
  EXPECT_EQ(decode_closed_round(encode(c)), c);
  EXPECT_FALSE(decode_closed_round(R"({"members":[{"agent":"a"},3]})"));
  EXPECT_FALSE(decode_closed_round(R"({"members":{}})"));
  EXPECT_FALSE(decode_closed_round("4"));
}

}  // namespace
}  // namespace ddprun::rdzv::jobs
