// A node failure as a scheduler sees one: a node's ddprun SIGKILLed with its workers, then the same
// command run again (a pod restarted), on a shared ddprun-rendezvous daemon and on a real etcd. The
// command is the user's: no --local_addr (the host is known by its name). A rerun that finds the
// job's last round full of nodes that are gone must take their place, not wait as a spare of a
// world that will never end its round.
#include <signal.h>

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/support/daemon.hpp"
#include "tests/support/etcd_cluster.hpp"
#include "tests/support/files.hpp"
#include "tests/support/job_node.hpp"
#include "tests/support/report.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/wait_until.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;

enum class Backend { Daemon, Etcd };

class NodeRerunTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::Etcd) {
      if (!have_etcd()) GTEST_FAIL() << "etcd-server and etcd-client are not installed: run scripts/install_deps.sh";
      etcd_ = std::make_unique<EtcdCluster>(1);
    } else {
      daemon_ = std::make_unique<Daemon>(DAEMON_BIN);
    }
  }

  // The command of one node of job `run_id` (--nnodes `nnodes`), one worker running `worker`
  // (test_worker's arguments), its report in `reports` as node `n`'s. Quick liveness (documented
  // --rdzv_conf keys), so that a node that is gone is noticed in a few seconds.
  std::unique_ptr<Subprocess> node(const std::string& run_id, const std::string& nnodes, int n,
                                   std::vector<std::string> worker, const Reports& reports) const {
    worker.insert(worker.begin(), TEST_WORKER_BIN);
    const bool etcd = GetParam() == Backend::Etcd;
    return JobNode(n)
        .named_host()
        .nnodes(nnodes)
        .without_rank()
        .meet(etcd ? at_etcd(etcd_->endpoints(), run_id) : at_store(daemon_->port(), run_id, /*c10d=*/true))
        .conf(etcd ? "join_timeout=60,last_call_timeout=1,lease_ttl=3"
                   : "join_timeout=60,last_call_timeout=1,keep_alive_interval=0.5,keep_alive_max_attempt=6")
        .flags({"--nproc_per_node", "1"})
        .flags(reports.flags(n))
        .start(worker);
  }

  // The node's ddprun and its workers killed at once: SIGKILL to ddprun, whose guard kills the
  // workers' process groups.
  static void kill_node(Subprocess& n) {
    n.signal(SIGKILL);
    n.wait(10s);
  }

  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<EtcdCluster> etcd_;
};

std::string attempt_outcomes(const nlohmann::json& report) {
  std::string out;
  if (!report.is_object()) return "(no report)";
  for (const auto& a : report["attempts"])
    out += a.value("outcome", std::string("?")) + (a.value("spare", false) ? "(spare) " : " ");
  return out;
}

// Before: the rerun said "the job runs with all 1 of --nnodes 1:1; this node waits as a spare" and
// waited for good.
TEST_P(NodeRerunTest, TheOnlyNodeOfAJobKilledAndRunAgainRunsTheJob) {
  TempDir dir;
  Reports reports;
  const std::string ready = (dir.path / "ready").string();
  const std::vector<std::string> worker{"ready-file", ready, "sleep", "3"};
  auto first = node("rerun-one", "1:1", 0, worker, reports);
  ASSERT_TRUE(wait_until([&] { return std::filesystem::exists(ready); }, 60s)) << first->err();
  kill_node(*first);
  std::filesystem::remove(ready);
  auto again = node("rerun-one", "1:1", 0, worker, reports);
  const Finished f = again->wait(90s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 0) << f.err;
  EXPECT_TRUE(std::filesystem::exists(ready)) << "the rerun never started its worker: " << f.err;
  const auto report = reports.of(0);
  ASSERT_TRUE(report.is_object()) << f.err;
  EXPECT_EQ(report["outcome"], "succeeded") << report.dump(2);
  EXPECT_EQ(report["attempts"].back()["workers"].size(), 1u) << attempt_outcomes(report) << report.dump(2);
}

// Every node of a full job killed at once (a rack's power) and every command run again: none of
// the reruns may wait for a world that is gone.
TEST_P(NodeRerunTest, EveryNodeOfAFullJobKilledAndRunAgainRunsTheJob) {
  TempDir dir;
  Reports reports;
  // Each worker writes DIR/env.<RANK> as it starts.
  const std::vector<std::string> worker{"env", dir.path.string(), "sleep", "3"};
  const auto started = [&] {
    return std::filesystem::exists(dir.path / "env.0") && std::filesystem::exists(dir.path / "env.1");
  };
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int n = 0; n < 2; ++n) nodes.push_back(node("rerun-all", "2:2", n, worker, reports));
  ASSERT_TRUE(wait_until(started, 60s)) << nodes[0]->err() << nodes[1]->err();
  for (auto& n : nodes) kill_node(*n);
  std::filesystem::remove(dir.path / "env.0");
  std::filesystem::remove(dir.path / "env.1");
  for (int n = 0; n < 2; ++n) nodes[static_cast<size_t>(n)] = node("rerun-all", "2:2", n, worker, reports);
  for (int n = 0; n < 2; ++n) {
    const Finished f = nodes[static_cast<size_t>(n)]->wait(90s);
    ASSERT_FALSE(f.timed_out) << f.err;
    EXPECT_EQ(f.exit_code, 0) << f.err;
    EXPECT_EQ(reports.of(n)["outcome"], "succeeded") << attempt_outcomes(reports.of(n)) << f.err;
  }
  EXPECT_TRUE(started()) << "the reruns never started their workers";
}

// One node of a full job killed and its command run again, while the other lives on: the job runs
// on with both, the rerun in the place of the node it replaces.
TEST_P(NodeRerunTest, ANodeOfAFullJobKilledAndRunAgainTakesItsPlaceBack) {
  TempDir dir;
  Reports reports;
  const std::vector<std::string> worker{"env", dir.path.string(), "sleep", "4"};
  const auto started = [&] {
    return std::filesystem::exists(dir.path / "env.0") && std::filesystem::exists(dir.path / "env.1");
  };
  // On etcd a fixed --nnodes is a static job, which a lost node ends: there the job is elastic.
  const std::string nnodes = GetParam() == Backend::Etcd ? "1:2" : "2:2";
  auto a = node("rerun-half", nnodes, 0, worker, reports);
  auto b = node("rerun-half", nnodes, 1, worker, reports);
  ASSERT_TRUE(wait_until(started, 60s)) << a->err() << b->err();
  kill_node(*b);
  b = node("rerun-half", nnodes, 1, worker, reports);
  const Finished fa = a->wait(90s), fb = b->wait(90s);
  ASSERT_FALSE(fa.timed_out) << fa.err;
  ASSERT_FALSE(fb.timed_out) << fb.err;
  EXPECT_EQ(fa.exit_code, 0) << fa.err;
  EXPECT_EQ(fb.exit_code, 0) << fb.err;
  const auto rb = reports.of(1);
  ASSERT_TRUE(rb.is_object()) << fb.err;
  EXPECT_EQ(rb["outcome"], "succeeded") << rb.dump(2);
  EXPECT_EQ(rb["attempts"].back()["workers"].size(), 1u) << attempt_outcomes(rb) << rb.dump(2);
}

// A node of a full job killed and run again while a spare waits: the spare takes the place, and the
// rerun, finding the job full again, waits as a spare and ends with the job.
TEST_P(NodeRerunTest, ANodeKilledAndRunAgainBesideASpareComesBackAsASpare) {
  TempDir dir;
  Reports reports;
  const std::vector<std::string> worker{"env", dir.path.string(), "sleep", "5"};
  const std::string nnodes = GetParam() == Backend::Etcd ? "1:2" : "2:2";
  auto a = node("rerun-spare", nnodes, 0, worker, reports);
  auto b = node("rerun-spare", nnodes, 1, worker, reports);
  ASSERT_TRUE(wait_until(
      [&] { return std::filesystem::exists(dir.path / "env.0") && std::filesystem::exists(dir.path / "env.1"); }, 60s))
      << a->err() << b->err();
  auto spare = node("rerun-spare", nnodes, 2, worker, reports);
  ASSERT_TRUE(spare->wait_for_output("as a spare", 30s)) << spare->err();
  kill_node(*b);
  b = node("rerun-spare", nnodes, 1, worker, reports);
  const Finished fa = a->wait(90s), fs = spare->wait(90s), fb = b->wait(90s);
  ASSERT_FALSE(fa.timed_out || fs.timed_out || fb.timed_out) << fa.err << fs.err << fb.err;
  EXPECT_EQ(fa.exit_code, 0) << fa.err;
  EXPECT_EQ(fs.exit_code, 0) << fs.err;
  EXPECT_EQ(fb.exit_code, 0) << fb.err;
  // Whoever came first to the round after the loss ran in it; each of the two that ran last had a
  // worker, and the job's world stayed whole.
  int ran = 0;
  for (int n : {1, 2}) {
    const auto r = reports.of(n);
    ASSERT_TRUE(r.is_object()) << n;
    ran += r["attempts"].back()["workers"].size() == 1u ? 1 : 0;
  }
  EXPECT_EQ(ran, 1) << attempt_outcomes(reports.of(1)) << "/ " << attempt_outcomes(reports.of(2));
}

INSTANTIATE_TEST_SUITE_P(Backends, NodeRerunTest, ::testing::Values(Backend::Daemon, Backend::Etcd),
                         [](const auto& p) { return p.param == Backend::Daemon ? "Daemon" : "Etcd"; });

}  // namespace
}  // namespace ddprun::test
