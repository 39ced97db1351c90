// One job on a shared ddprun-rendezvous must not deny service to the others, and a job the store
// refuses must be told why.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/errors.hpp"
#include "rendezvous/client/client.hpp"
#include "tests/support/daemon.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/store_client.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;

Finished run_job(uint16_t daemon_port, const std::string& run_id) {
  // Elastic, so that even one node goes through the daemon's rendezvous.
  Subprocess p({DDPRUN_BIN, "--nnodes", "1:2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                "127.0.0.1:" + std::to_string(daemon_port), "--rdzv_id", run_id, "--rdzv_conf",
                "join_timeout=30,last_call_timeout=1", TEST_WORKER_BIN, "print", "1"});
  return p.wait(120s);
}

// Writes keys under job `run_id` until the store refuses one; returns how many it stored.
int fill(uint16_t port, const std::string& run_id, int at_most) {
  rdzv::client::Client c(test::store_client(port, 5s));
  for (int i = 0; i < at_most; ++i) {
    try {
      c.set("/ddprun/" + run_id + "/junk/" + std::to_string(i), std::string(100, 'j'));
      c.ping();  // a SET has no reply: the refusal shows at the next request
    } catch (const ConnectionError&) {
      return i;
    }
  }
  return at_most;
}

// Before: a client filled the store-wide key limit under its own job's prefix, and the next job
// failed at once with "store ... closed the connection during COMPARE_SET".
TEST(StoreQuotaTest, AJobThatFillsItsQuotaLeavesRoomForTheOthers) {
  DaemonOptions o;
  o.args = {"--max-total-keys", "400", "--job-max-keys", "300"};
  Daemon d(DAEMON_BIN, o);
  EXPECT_EQ(fill(d.port(), "greedy", 1000), 300) << d.log();
  const Finished f = run_job(d.port(), "victim");
  EXPECT_EQ(f.exit_code, 0) << f.err;
  EXPECT_NE(d.log().find("job 'greedy' over its quota"), std::string::npos) << d.log();
}

// A job the store refuses says why: a full store, or its own quota.
TEST(StoreQuotaTest, AJobRefusedByAFullStoreSaysSo) {
  DaemonOptions o;
  o.args = {"--max-total-keys", "50", "--job-max-keys", "0"};
  Daemon d(DAEMON_BIN, o);
  EXPECT_EQ(fill(d.port(), "greedy", 1000), 50);
  const Finished f = run_job(d.port(), "victim");
  EXPECT_EQ(f.exit_code, 1) << f.err;
  EXPECT_NE(f.err.find("the store refused it at "), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("store full: "), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("(--max-total-keys)"), std::string::npos) << f.err;
}

TEST(StoreQuotaTest, AJobOverItsQuotaSaysSo) {
  DaemonOptions o;
  o.args = {"--job-max-keys", "2"};
  Daemon d(DAEMON_BIN, o);
  const Finished f = run_job(d.port(), "tiny");
  EXPECT_EQ(f.exit_code, 1) << f.err;
  EXPECT_NE(f.err.find("job 'tiny' over its quota"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("(--job-max-keys)"), std::string::npos) << f.err;
}

}  // namespace
}  // namespace ddprun::test
