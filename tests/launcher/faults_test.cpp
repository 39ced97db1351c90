// ddprun under faults: a stop signal in every state, a console nobody reads, descriptors leaking
// into workers, a worker that cannot be started, malformed values in the rendezvous store.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "rendezvous/client/client.hpp"
#include "tests/support/files.hpp"
#include "tests/support/ddprun_bin.hpp"
#include "tests/support/daemon.hpp"
#include "tests/support/free_port.hpp"
#include "tests/support/health.hpp"
#include "tests/support/job_node.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/wait_until.hpp"

namespace ddprun::test {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// Node `rank` of a static job of `nnodes` whose node 0 hosts the store on `port`; its workers run
// the test worker with `worker`.
std::unique_ptr<Subprocess> node(int port, int rank, int nnodes, std::vector<std::string> worker,
                                 std::vector<std::string> extra = {},
                                 const std::map<std::string, std::string>& env = {}) {
  worker.insert(worker.begin(), TEST_WORKER_BIN);
  return JobNode(rank).nnodes(nnodes).meet(at_master(port)).flags(extra).env(env).start(worker);
}

// --- 1. A stop signal in every state ----------------------------------------------------------

TEST(FaultsTest, StopSignalDuringTheRendezvousLeavesItAndTheOtherNodesLearnAtOnce) {
  const int port = free_port(), health0 = free_port(), health1 = free_port();
  // Node 2 never comes: nodes 0 and 1 wait in the rendezvous (join timeout 60 s).
  auto n0 = node(port, 0, 3, {"print", "1"}, {}, health_env(health0));
  auto n1 = node(port, 1, 3, {"print", "1"}, {}, health_env(health1));
  ASSERT_TRUE(n1->wait_for([&] { return health_of(health1).phase == "joined"; }, 30s)) << n1->err();
  ASSERT_TRUE(n0->wait_for([&] { return health_of(health0).phase == "joined"; }, 30s)) << n0->err();
  n1->signal(SIGTERM);
  // Within the test's deadline, far below the join timeout.
  const Finished f1 = n1->wait(20s), f0 = n0->wait(20s);
  EXPECT_FALSE(f1.timed_out);
  EXPECT_EQ(f1.exit_code, 128 + SIGTERM) << f1.err;
  EXPECT_NE(f1.err.find("during the rendezvous: left it; no worker was started"), std::string::npos) << f1.err;
  EXPECT_EQ(f1.err.find("started 1 worker"), std::string::npos) << f1.err;
  EXPECT_FALSE(f0.timed_out);
  EXPECT_EQ(f0.exit_code, 128 + SIGTERM) << f0.err;
  EXPECT_NE(f0.err.find("job stopped by SIGTERM on node"), std::string::npos) << f0.err;
  EXPECT_EQ(f0.err.find("started 1 worker"), std::string::npos) << f0.err;
}

TEST(FaultsTest, StopSignalWhileConnectingToAStoreThatIsNotThereYet) {
  const int port = free_port(), health1 = free_port();
  auto n1 = node(port, 1, 2, {"print", "1"}, {}, health_env(health1));  // node 0 (the store's host) never starts
  ASSERT_TRUE(n1->wait_for([&] { return health_of(health1).phase == "connecting"; }, 30s)) << n1->err();
  n1->signal(SIGINT);
  const Finished f = n1->wait(20s);
  EXPECT_FALSE(f.timed_out);
  EXPECT_EQ(f.exit_code, 128 + SIGINT) << f.err;
}

TEST(FaultsTest, StopSignalWhileWaitingForTheOtherNodesToFinish) {
  const int port = free_port(), health0 = free_port();
  auto n0 = node(port, 0, 2, {"exit-if-rank", "0", "0"}, {}, health_env(health0));  // done at once: waits for node 1
  auto n1 = node(port, 1, 2, {"wait-signal"});
  ASSERT_TRUE(n1->wait_for_output("[rank1]: ready", 30s)) << n1->err();
  // Node 0's worker has exited 0; node 0 now waits for the others. Stopping it stops the job.
  ASSERT_TRUE(n0->wait_for([&] { return health_of(health0).phase == "finishing"; }, 30s)) << n0->err();
  n0->signal(SIGTERM);
  const Finished f0 = n0->wait(20s), f1 = n1->wait(20s);
  EXPECT_FALSE(f0.timed_out);
  EXPECT_EQ(f0.exit_code, 128 + SIGTERM) << f0.err;
  EXPECT_FALSE(f1.timed_out);
  EXPECT_EQ(f1.exit_code, 128 + SIGTERM) << f1.err;
  EXPECT_NE(f1.out.find("[rank1]: got SIGTERM"), std::string::npos) << f1.out;
}

// --- 2. A console that does not keep up --------------------------------------------------------

// ddprun with stdout a pipe that nobody reads (kept open: writes block rather than fail), stderr
// to a file. Returns when ddprun exits or the deadline passes.
struct BlockedConsoleRun {
  int exit_code = -1;
  bool timed_out = false;
  std::string err;
};

BlockedConsoleRun run_with_blocked_stdout(std::vector<std::string> argv, std::chrono::seconds deadline,
                                          const std::function<void(pid_t, const std::string&)>& while_running = {}) {
  TempDir dir;
  const std::string err_path = (dir.path / "stderr").string();
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(err, STDERR_FILENO);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(out[1]);
  if (while_running) while_running(pid, err_path);
  BlockedConsoleRun r;
  const auto until = std::chrono::steady_clock::now() + deadline;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > until) {
      r.timed_out = true;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(20ms);  // sleep override: polling another process's state
  }
  if (!r.timed_out && WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  ::close(out[0]);
  r.err = read_file(err_path);
  return r;
}

TEST(FaultsTest, AConsoleNobodyReadsNeverBlocksSupervision) {
  // Both ranks print 20 MB into a stdout pipe nobody reads, then rank 1 fails. ddprun must keep
  // draining their output (dropping what the console cannot take), see the failure, stop rank 0
  // and exit with rank 1's code.
  const auto r = run_with_blocked_stdout({ddprun_bin(), "--nproc_per_node", "2", "--shutdown_timeout", "2",
                                          TEST_WORKER_BIN, "flood", "20", "exit-if-rank", "1", "9", "sleep", "60"},
                                         60s);
  EXPECT_FALSE(r.timed_out) << "ddprun blocked on its console:\n" << r.err;
  EXPECT_EQ(r.exit_code, 9) << r.err;
  EXPECT_NE(r.err.find("the console (stdout) is not keeping up"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Root cause (first failure):\n  rank       : 1"), std::string::npos) << r.err;
}

TEST(FaultsTest, AConsoleNobodyReadsStillLetsASignalStopTheJobAndEscalateToSigkill) {
  // Workers that ignore SIGTERM and flood stdout: SIGTERM to ddprun must still end in SIGKILL
  // after --shutdown_timeout.
  const auto r = run_with_blocked_stdout(
      {ddprun_bin(), "--nproc_per_node", "2", "--shutdown_timeout", "1", TEST_WORKER_BIN, "ignore-term", "flood", "20",
       "sleep", "60"},
      60s, [](pid_t pid, const std::string& err_path) {
        // Once the console is full (ddprun says it drops), stop the job.
        wait_until([&] { return read_file(err_path).find("is not keeping up") != std::string::npos; }, 30s);
        ::kill(pid, SIGTERM);
      });
  EXPECT_FALSE(r.timed_out) << "ddprun blocked on its console:\n" << r.err;
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
  EXPECT_NE(r.err.find("sending SIGKILL"), std::string::npos) << r.err;
}

// --- 3. Nothing of ddprun's leaks into a worker -------------------------------------------------

TEST(FaultsTest, WorkersHoldNothingOfDdprunsButTheirStdio) {
  TempDir dir;
  const int port = free_port();
  // Node 0 hosts the rendezvous store and the worker store, and has rendezvous connections open.
  auto n0 = node(port, 0, 2, {"fds", dir.str()});
  auto n1 = node(port, 1, 2, {"fds", dir.str()});
  const Finished f0 = n0->wait(60s), f1 = n1->wait(60s);
  ASSERT_EQ(f0.exit_code, 0) << f0.err;
  ASSERT_EQ(f1.exit_code, 0) << f1.err;
  for (int r = 0; r < 2; ++r) {
    std::istringstream fds(read_file(dir.path / ("fds." + std::to_string(r))));
    std::string line;
    std::vector<std::string> extra;
    while (std::getline(fds, line)) {
      const int fd = std::stoi(line.substr(0, line.find(' ')));
      if (fd > 2) extra.push_back(line);
    }
    EXPECT_TRUE(extra.empty()) << "rank " << r << " inherited:\n" << testing::PrintToString(extra);
  }
}

TEST(FaultsTest, EveryDescriptorDdprunHoldsIsCloseOnExec) {
  TempDir dir;
  const int port = free_port();
  auto n0 = node(port, 0, 2, {"wait-signal"});
  auto n1 = node(port, 1, 2, {"wait-signal"});
  ASSERT_TRUE(n0->wait_for_output("[rank0]: ready", 30s)) << n0->err();
  ASSERT_TRUE(n1->wait_for_output("[rank1]: ready", 30s)) << n1->err();
  // While the job runs: every descriptor of node 0's ddprun above stdio has O_CLOEXEC.
  std::vector<std::string> leaky;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(n0->pid()) + "/fdinfo")) {
    const int fd = std::stoi(e.path().filename().string());
    if (fd <= 2) continue;
    std::istringstream info(read_file(e.path()));
    std::string key, flags;
    while (info >> key) {
      if (key == "flags:") {
        info >> flags;
        break;
      }
    }
    if (flags.empty()) continue;  // closed meanwhile
    if ((std::stoul(flags, nullptr, 8) & 02000000) == 0) {
      std::error_code ec;
      leaky.push_back(
          std::to_string(fd) + " -> " +
          fs::read_symlink("/proc/" + std::to_string(n0->pid()) + "/fd/" + std::to_string(fd), ec).string());
    }
  }
  EXPECT_TRUE(leaky.empty()) << testing::PrintToString(leaky);
  n0->signal(SIGTERM);
  n0->wait(20s);
  n1->wait(20s);
}

// --- 4. A worker that cannot be started ---------------------------------------------------------

TEST(FaultsTest, OutOfDescriptorsWhileSpawningStopsWhatWasStartedAndReportsIt) {
  TempDir dir;
  // 40 descriptors cannot hold the pipes of 30 workers: some start, then pipe2 fails.
  Subprocess p({"/usr/bin/prlimit", "--nofile=40:40", ddprun_bin(), "--nproc_per_node", "30", TEST_WORKER_BIN,
                "ready-file", dir.str() + "/pid.${local_rank}", "sleep", "60"});
  const Finished f = p.wait(60s);
  EXPECT_FALSE(f.timed_out);
  EXPECT_EQ(f.exit_code, 127) << f.err;
  EXPECT_NE(f.err.find("could not be started: cannot start"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("pipe2: Too many open files"), std::string::npos) << f.err;
  // The workers that did start are gone: stopped and reaped, none orphaned.
  std::vector<pid_t> started;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    std::ifstream in(e.path());
    pid_t pid = 0;
    if (in >> pid) started.push_back(pid);
  }
  for (pid_t pid : started) EXPECT_TRUE(process_gone(pid)) << "worker " << pid << " outlived ddprun";
}

// --- 7. Malformed values in the rendezvous store -------------------------------------------------

TEST(FaultsTest, AMalformedStoreValueIsAClearErrorNamingTheKey) {
  Daemon d(DAEMON_BIN);
  {
    rdzv::client::ClientOptions o;
    o.host = "127.0.0.1";
    o.port = d.port();
    rdzv::client::Client c(o);
    c.set("/ddprun/bad/gen", "garbage");      // this layout's generation counter
    c.set("/ddprun/bad/current", "garbage");  // what an older layout read as the current round
  }
  Subprocess p({ddprun_bin(), "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:" + std::to_string(d.port()),
                "--rdzv_id", "bad", "--nnodes", "1:2", TEST_WORKER_BIN, "print", "1"});
  const Finished f = p.wait(30s);
  EXPECT_EQ(f.exit_code, 1) << f.err;
  EXPECT_NE(f.err.find("the rendezvous key /ddprun/bad/"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("does not hold a number (7 bytes: 'garbage')"), std::string::npos) << f.err;
}

// --- Progress on long waits ---------------------------------------------------------------------

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(FaultsTest, WaitingForNodesSaysWhoIsMissingAtASteadyRate) {
  // DDPRUN_PROGRESS_INTERVAL=1 rather than 10 s: a progress line per second, not a flood.
  const int port = free_port();
  Subprocess alone(
      {ddprun_bin(), "--nnodes", "2", "--node_rank", "0", "--master_addr", "127.0.0.1", "--master_port",
       std::to_string(port), "--rdzv_id", "lonely", "--rdzv_conf", "join_timeout=4", TEST_WORKER_BIN, "print", "1"},
      {{"DDPRUN_PROGRESS_INTERVAL", "1"}});
  const Finished f = alone.wait(60s);
  ASSERT_FALSE(f.timed_out);
  EXPECT_NE(f.exit_code, 0);
  const size_t lines = count_of(f.err, "1 of 2 nodes joined, waiting for node_rank 1, ");
  EXPECT_GE(lines, 1u) << f.err;
  EXPECT_LE(lines, 6u) << f.err;
  EXPECT_NE(f.err.find(" s of 4s"), std::string::npos) << f.err;
}

TEST(FaultsTest, ANodeWaitingForTheOthersToFinishSaysHowManyHave) {
  const int port = free_port();
  auto start = [&](int rank, std::vector<std::string> worker) {
    worker.insert(worker.begin(), TEST_WORKER_BIN);
    return JobNode(rank)
        .meet(at_master(port))
        .conf("")
        .flags({"--rdzv_id", "finishers"})
        .env({{"DDPRUN_PROGRESS_INTERVAL", "1"}})
        .start(worker);
  };
  auto fast = start(0, {"print", "1"});
  auto slow = start(1, {"sleep", "4"});
  const Finished f0 = fast->wait(60s), f1 = slow->wait(60s);
  EXPECT_EQ(f0.exit_code, 0) << f0.err;
  EXPECT_EQ(f1.exit_code, 0) << f1.err;
  const size_t lines = count_of(f0.err, "waiting for the other nodes to finish: 1 of 2 finished, ");
  EXPECT_GE(lines, 1u) << f0.err;
  EXPECT_LE(lines, 8u) << f0.err;
}

TEST(FaultsTest, ASlowShutdownSaysWhoIsStillRunningUntilSigkill) {
  TempDir dir;
  Subprocess p({ddprun_bin(), "--nproc_per_node", "2", "--shutdown_timeout", "4", TEST_WORKER_BIN, "ignore-term",
                "ready-file", dir.str() + "/ready.${local_rank}", "sleep", "60"},
               {{"DDPRUN_PROGRESS_INTERVAL", "1"}});
  ASSERT_TRUE(wait_until([&] { return fs::exists(dir.path / "ready.0") && fs::exists(dir.path / "ready.1"); }, 30s));
  p.signal(SIGTERM);
  const Finished f = p.wait(60s);
  ASSERT_FALSE(f.timed_out);
  EXPECT_EQ(f.exit_code, 128 + SIGTERM) << f.err;
  // Who is still running, how long it has been, and what comes next; then the SIGKILL.
  EXPECT_NE(f.err.find("waiting for 2 of 2 worker(s) to exit after SIGTERM: rank 0 (pid "), std::string::npos) << f.err;
  EXPECT_NE(f.err.find(" s of 4s, then SIGKILL"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("sending SIGKILL"), std::string::npos) << f.err;
  EXPECT_LE(count_of(f.err, "to exit after SIGTERM"), 8u) << f.err;
}

}  // namespace
}  // namespace ddprun::test
