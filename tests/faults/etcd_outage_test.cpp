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
      .named_host()
      .meet(at_etcd(cluster.endpoints(), "outage"))
      .conf("join_timeout=60,lease_ttl=" + std::to_string(lease_ttl))
      .flags({"--hang_timeout", "10"})
      .env({{"OMP_NUM_THREADS", "1"}})
      .start({TEST_WORKER_BIN, "busy-if-rank", "0", "30"});
}

// A two-node job on a 3-member etcd cluster whose agents hold leases of `lease_ttl` seconds, with two
// of the three members frozen (SIGSTOP: their ports still take connections, nothing answers) or
// killed and started again (as a crash and a restart by their service manager) `outage` later,
// once both nodes run their workers; how each node ended (`frozen` false: the workers never came
// up, and nothing was done to etcd).
struct Outcome {
  Finished f0, f1;
  bool frozen = false;
};
enum class Fault { Freeze, KillAndRestart };
Outcome job_through_outage(int lease_ttl, std::chrono::seconds outage, Fault fault = Fault::Freeze) {
  EtcdCluster cluster(3);
  auto n0 = node(cluster, 0, lease_ttl);
  auto n1 = node(cluster, 1, lease_ttl);
  const bool up = n0->wait_for_workers(1, 60s) && n1->wait_for_workers(1, 60s);
  if (up) {
    std::this_thread::sleep_for(5s);  // sleep override: the job runs a while before the fault
    for (int m : {1, 2}) fault == Fault::Freeze ? cluster.pause(m) : cluster.kill(m);
    std::this_thread::sleep_for(outage);  // sleep override: the length of the outage
    for (int m : {1, 2}) fault == Fault::Freeze ? cluster.resume(m) : cluster.restart(m);
  }
  return {n0->wait(120s), n1->wait(120s), up};
}

// Before: the first failed call dropped the job-wide progress channel for the rest of the
// attempt, and node 1 then saw only its own idle rank: exit 124 "HUNG", node 0 exit 1.
TEST(EtcdOutageTest, QuorumLostForSixSecondsIsNoHang) {
  if (!have_etcd()) GTEST_FAIL() << "etcd-server and etcd-client are not installed: run scripts/install_deps.sh";
  const auto [f0, f1, frozen] = job_through_outage(20, 6s);  // leases of 20 s outlive the outage
  ASSERT_TRUE(frozen) << "the workers did not start: " << f0.err << f1.err;
  ASSERT_FALSE(f0.timed_out || f1.timed_out);
  EXPECT_EQ(f0.exit_code, 0) << f0.err;
  EXPECT_EQ(f1.exit_code, 0) << f1.err;
  EXPECT_EQ((f0.err + f1.err).find("HUNG"), std::string::npos) << f0.err << f1.err;
}

// Two of three members crash and come back 9 s later: with their restart and an election, etcd is
// without a quorum for longer than the leases' 10 s (ddprun's default). Before, both nodes stopped their workers and
// exited 1 ("no etcd member renewed this node's lease ... it may have expired"); but no lease can
// expire without a leader, and the new leader gave every lease a fresh TTL. The member that stayed
// says it has no leader, the others refuse connections: the nodes wait for etcd and go on.
TEST(EtcdOutageTest, TwoMembersCrashedAndRestartedPastTheLeaseTtlAreRiddenOut) {
  if (!have_etcd()) GTEST_FAIL() << "etcd-server and etcd-client are not installed: run scripts/install_deps.sh";
  const auto [f0, f1, frozen] = job_through_outage(10, 9s, Fault::KillAndRestart);
  ASSERT_TRUE(frozen) << "the workers did not start: " << f0.err << f1.err;
  ASSERT_FALSE(f0.timed_out || f1.timed_out);
  EXPECT_EQ(f0.exit_code, 0) << f0.err;
  EXPECT_EQ(f1.exit_code, 0) << f1.err;
  EXPECT_NE((f0.err + f1.err).find("etcd has no quorum"), std::string::npos) << f0.err << f1.err;
}

// An outage longer than the lease TTL ends the job, saying what is known: before, each node said
// "the other nodes count it as lost" when no node could have seen anything (etcd without a quorum
// lets no lease expire).
TEST(EtcdOutageTest, QuorumLostForLongerThanTheLeaseEndsTheJobSayingWhatIsKnown) {
  if (!have_etcd()) GTEST_FAIL() << "etcd-server and etcd-client are not installed: run scripts/install_deps.sh";
  const auto [f0, f1, frozen] = job_through_outage(3, 10s);
  ASSERT_TRUE(frozen) << "the workers did not start: " << f0.err << f1.err;
  ASSERT_FALSE(f0.timed_out || f1.timed_out);
  EXPECT_EQ(f0.exit_code, 1) << f0.err;
  EXPECT_EQ(f1.exit_code, 1) << f1.err;
  EXPECT_EQ((f0.err + f1.err).find("the other nodes count it as lost"), std::string::npos) << f0.err << f1.err;
  EXPECT_NE((f0.err + f1.err).find("may have expired"), std::string::npos) << f0.err << f1.err;
}

}  // namespace
}  // namespace ddprun::test
