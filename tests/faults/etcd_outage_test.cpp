// A short etcd outage (quorum lost for less than the lease TTL) under a job with --hang_timeout:
// the job must ride it out; a store that does not answer for a while is no evidence of a hang.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/ddprun_bin.hpp"
#include "tests/support/etcd_cluster.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/job_node.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;

// Rank 0 (node 0) computes for 30 s; rank 1 (node 1) waits for it, idle, as a rank in a
// collective does.
std::unique_ptr<Subprocess> node(const EtcdCluster& cluster, int n, int lease_ttl) {
  return JobNode(n)
      .meet(at_etcd(cluster.endpoints(), "outage"))
      .conf("join_timeout=60,lease_ttl=" + std::to_string(lease_ttl))
      .flags({"--hang_timeout", "10"})
      .env({{"OMP_NUM_THREADS", "1"}})
      .start({TEST_WORKER_BIN, "busy-if-rank", "0", "30"});
}

// Two of the three members frozen for `outage`, once both nodes run their workers.
void lose_quorum(EtcdCluster& cluster, Subprocess& n0, Subprocess& n1, std::chrono::seconds outage) {
  ASSERT_TRUE(n0.wait_for_workers(1, 60s)) << n0.err();
  ASSERT_TRUE(n1.wait_for_workers(1, 60s)) << n1.err();
  std::this_thread::sleep_for(5s);  // sleep override: the job runs a while before the fault
  cluster.pause(1);
  cluster.pause(2);
  std::this_thread::sleep_for(outage);  // sleep override: the length of the outage
  cluster.resume(1);
  cluster.resume(2);
}

// Before: the first failed call dropped the job-wide progress channel for the rest of the
// attempt, and node 1 then saw only its own idle rank: exit 124 "HUNG", node 0 exit 1.
TEST(EtcdOutageTest, QuorumLostForSixSecondsIsNoHang) {
  if (!have_etcd()) GTEST_FAIL() << "etcd-server and etcd-client are not installed: run scripts/install_deps.sh";
  EtcdCluster cluster(3);
  auto n0 = node(cluster, 0, 20);  // leases of 20 s outlive the outage
  auto n1 = node(cluster, 1, 20);
  lose_quorum(cluster, *n0, *n1, 6s);
  const Finished f0 = n0->wait(120s), f1 = n1->wait(120s);
  ASSERT_FALSE(f0.timed_out || f1.timed_out);
  EXPECT_EQ(f0.exit_code, 0) << f0.err;
  EXPECT_EQ(f1.exit_code, 0) << f1.err;
  EXPECT_EQ((f0.err + f1.err).find("HUNG"), std::string::npos) << f0.err << f1.err;
}

// An outage longer than the lease TTL ends the job, saying what is known: before, each node said
// "the other nodes count it as lost" when no node could have seen anything (etcd without a quorum
// lets no lease expire).
TEST(EtcdOutageTest, QuorumLostForLongerThanTheLeaseEndsTheJobSayingWhatIsKnown) {
  if (!have_etcd()) GTEST_FAIL() << "etcd-server and etcd-client are not installed: run scripts/install_deps.sh";
  EtcdCluster cluster(3);
  auto n0 = node(cluster, 0, 3);
  auto n1 = node(cluster, 1, 3);
  lose_quorum(cluster, *n0, *n1, 10s);
  const Finished f0 = n0->wait(120s), f1 = n1->wait(120s);
  ASSERT_FALSE(f0.timed_out || f1.timed_out);
  EXPECT_EQ(f0.exit_code, 1) << f0.err;
  EXPECT_EQ(f1.exit_code, 1) << f1.err;
  EXPECT_EQ((f0.err + f1.err).find("the other nodes count it as lost"), std::string::npos) << f0.err << f1.err;
  EXPECT_NE((f0.err + f1.err).find("may have expired"), std::string::npos) << f0.err << f1.err;
}

}  // namespace
}  // namespace ddprun::test
