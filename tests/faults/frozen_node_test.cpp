// A frozen node (its ddprun stopped with SIGSTOP) in an elastic job: the others re-form without it,
// and its workers must not run on beside the new group.
#include <signal.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/procfs.hpp"
#include "tests/support/ddprun_bin.hpp"
#include "tests/support/free_port.hpp"
#include "tests/support/health.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/wait_until.hpp"
#include "tests/support/job_node.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;

// The others count a node as lost after 6 heartbeats of 0.5 s without one.
std::unique_ptr<Subprocess> agent(int port, int host, const std::string& ready_file, const std::string& seconds,
                                  const std::map<std::string, std::string>& env = {}) {
  return JobNode(host)
      .nnodes("1:2")
      .without_rank()
      .meet(at_store(port, "frozen", /*c10d=*/true))
      .conf("join_timeout=30,last_call_timeout=1,keep_alive_interval=0.5,keep_alive_max_attempt=6")
      .env(env)
      .start({TEST_WORKER_BIN, "ready-file", ready_file, "sleep", seconds});
}

pid_t read_pid(const std::string& file) {
  pid_t pid = 0;
  std::ifstream(file) >> pid;
  return pid;
}

// Running (not gone, not a zombie waiting for its stopped parent).
bool running(pid_t pid) {
  const auto stat = procfs::read_stat(pid);
  return stat && stat->state != 'Z' && stat->state != 'X';
}

// The lines of `log` that say a node sent no heartbeat and name another node than `node`: what a
// node that was itself frozen must not say of the nodes that went on beating meanwhile.
std::string silence_blamed_on_others(const std::string& log, int node) {
  std::string out, line;
  std::istringstream in(log);
  while (std::getline(in, line)) {
    if (line.find("sent no heartbeat") != std::string::npos &&
        line.find("node " + std::to_string(node) + " (") == std::string::npos) {
      out += line + "\n";
    }
  }
  return out;
}

// Before: node 0 re-formed a one-node group while node 1's old worker kept running, two groups
// side by side (they could overwrite each other's checkpoints).
TEST(FrozenNodeTest, AFrozenNodesWorkersAreFencedBeforeTheOthersGoOnWithoutIt) {
  TempDir dir;
  const int port = free_port(), health_a = free_port();
  const std::string ready0 = (dir.path / "w0").string(), ready1 = (dir.path / "w1").string();
  auto a = agent(port, 1, ready0, "12", health_env(health_a));
  ASSERT_TRUE(a->wait_for([&] { return port_taken(port); }, 10s)) << a->err();
  auto b = agent(port, 2, ready1, "15");
  ASSERT_TRUE(b->wait_for_workers(1, 30s)) << b->err();
  ASSERT_TRUE(wait_until([&] { return read_pid(ready1) > 0; }, 10s));
  const pid_t frozen_worker = read_pid(ready1);
  ASSERT_TRUE(running(frozen_worker));
  const int round = health_of(health_a).round;  // the round both nodes run
  ASSERT_GE(round, 0);
  b->signal(SIGSTOP);
  // Node a re-forms the group without it: a later round.
  ASSERT_TRUE(a->wait_for([&] { return health_of(health_a).round > round; }, 30s)) << a->err();
  EXPECT_FALSE(running(frozen_worker)) << "the frozen node's worker runs beside the new group";
  // Resumed, the node learns why its worker died, and joins the job again.
  b->signal(SIGCONT);
  const Finished fa = a->wait(90s), fb = b->wait(90s);
  EXPECT_EQ(fa.exit_code, 0) << fa.err;
  EXPECT_EQ(fb.exit_code, 0) << fb.err;
  // Fenced after 3/4 of the 3 s after which the others count it as lost.
  EXPECT_NE(fb.err.find("this node's guard stopped its workers: no heartbeat reached the rendezvous for 2250ms"),
            std::string::npos)
      << fb.err;
  // Its worker was stopped by the guard, not a failure of its own.
  EXPECT_NE(fb.err.find(": stopped by this node's guard"), std::string::npos) << fb.err;
  EXPECT_EQ(fb.err.find("failed: stopping the other workers"), std::string::npos) << fb.err;
  // Before, resumed, it first said that node 0, alive all along, had sent no heartbeat.
  EXPECT_EQ(silence_blamed_on_others(fb.err, 1), "") << fb.err;
}

// A node of a full --nnodes 2:2 job (the documented set-up for hot spares) frozen beside a spare:
// the spare takes its place in the next round. Before, the frozen node's guard was armed only when
// MIN < MAX, and its rank-1 worker ran on beside the spare's for as long as the node was frozen.
// The user's command: no --local_addr, every node on this host.
TEST(FrozenNodeTest, AFrozenNodeOfAFullJobHasItsWorkersStoppedBeforeASpareTakesItsPlace) {
  TempDir dir;
  const int port = free_port();
  const auto node = [&](int n, const std::string& seconds) {
    return JobNode(n)
        .named_host()
        .nnodes("2:2")
        .without_rank()
        .meet(at_store(port, "frozen-spare", /*c10d=*/true))
        .conf("join_timeout=30,last_call_timeout=1,keep_alive_interval=0.5,keep_alive_max_attempt=6")
        .start({TEST_WORKER_BIN, "ready-file", (dir.path / ("w" + std::to_string(n))).string(), "sleep", seconds});
  };
  const auto ready = [&](int n) { return (dir.path / ("w" + std::to_string(n))).string(); };
  auto a = node(0, "10");
  ASSERT_TRUE(a->wait_for([&] { return port_taken(port); }, 10s)) << a->err();
  auto b = node(1, "10");
  ASSERT_TRUE(wait_until([&] { return read_pid(ready(0)) > 0 && read_pid(ready(1)) > 0; }, 30s)) << b->err();
  auto spare = node(2, "2");
  ASSERT_TRUE(spare->wait_for_output("as a spare", 30s)) << spare->err();
  const pid_t frozen_worker = read_pid(ready(1));
  b->signal(SIGSTOP);
  // The spare's worker starts in the frozen node's place; by then that node's worker is gone.
  const bool took_over = spare->wait_for([&] { return read_pid(ready(2)) > 0; }, 30s);
  const bool frozen_runs = running(frozen_worker);
  b->signal(SIGCONT);
  ASSERT_TRUE(took_over) << spare->err();
  EXPECT_FALSE(frozen_runs) << "the frozen node's rank ran beside the spare's";
  const Finished fa = a->wait(90s), fs = spare->wait(90s), fb = b->wait(90s);
  EXPECT_EQ(fa.exit_code, 0) << fa.err;
  EXPECT_EQ(fs.exit_code, 0) << fs.err;
  EXPECT_FALSE(fb.timed_out) << fb.err;
  EXPECT_NE(fb.err.find("this node's guard stopped its workers"), std::string::npos) << fb.err;
  // Back, it found the job full and ended with it as a spare, saying that it had run workers.
  EXPECT_NE(fb.err.find("its workers ran in an earlier round"), std::string::npos) << fb.err;
  EXPECT_EQ(silence_blamed_on_others(fb.err, 1), "") << fb.err;
}

}  // namespace
}  // namespace ddprun::test
