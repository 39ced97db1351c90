// The hang watchdog's parts: the diagnosis and its report, step rates and stragglers, /proc
// readings, stack capture of real processes, and torchelastic's file timer over a real FIFO.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "launcher/watchdog/file_timer.hpp"
#include "launcher/watchdog/hang_frames.hpp"
#include "launcher/watchdog/hang_report.hpp"
#include "launcher/workers/process.hpp"
#include "common/procfs.hpp"
#include "launcher/workers/python_hook.hpp"
#include "launcher/watchdog/stacks.hpp"
#include "launcher/watchdog/step_rates.hpp"
#include "launcher/workers/worker_env.hpp"
#include "rendezvous/core/job_keys.hpp"
#include "rendezvous/daemon/job_summary.hpp"
#include "tests/support/temp_dir.hpp"

namespace ddprun::launcher {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

const char* kPythonInCollective = R"(Current thread 0x00007f66bcd2e040 (most recent call first):
  File "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", line 1541 in all_reduce
  File "/jobs/train.py", line 13 in <module>
)";

// PyTorch 2.x: the collective is wrapped by c10d_logger's decorator.
const char* kPython2InCollective = R"(Current thread 0x00007f2955ee1780 (most recent call first):
  File "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", line 2811 in all_reduce
  File "/usr/lib/python3/dist-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/jobs/train.py", line 77 in <module>
)";

const char* kPythonInUserCode = R"(Thread 0x00007f1111111111 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 975 in run

Current thread 0x00007f6078465040 (most recent call first):
  File "/jobs/data.py", line 40 in next_batch
  File "/jobs/train.py", line 12 in <module>
)";

RankState rank(int r, std::string python = "", std::vector<std::string> endpoints = {}) {
  RankState s;
  s.rank = r;
  s.local_rank = r;
  s.pid = 1000 + r;
  s.state = "sleeping";
  s.python_stack = std::move(python);
  s.store_endpoints = std::move(endpoints);
  return s;
}

HangDiagnosis one_node(std::vector<RankState> ranks, std::optional<StoreView> store = std::nullopt) {
  HangDiagnosis d;
  d.program = "train.py";
  d.timeout = 30s;
  d.idle_seconds = 31;
  d.detector_host = "host-a";
  d.detected_at = std::chrono::system_clock::now();
  NodeDiagnosis n;
  n.host = "host-a";
  n.ranks = std::move(ranks);
  n.store = std::move(store);
  d.nodes.push_back(std::move(n));
  return d;
}

// --- the diagnosis ------------------------------------------------------------------------------

TEST(HangReportTest, ARankThatNeverConnectedIsBehindTheOneWaitingForItsKey) {
  StoreView store;
  store.waits.push_back({"127.0.0.1:40001", {"/worker/attempt_0/default_pg/0/0/1"}, 31.5});
  const auto d = one_node({rank(0, kPythonInCollective, {"127.0.0.1:40001"}), rank(1, kPythonInUserCode)}, store);
  const HangFindings f = analyze_hang(d);
  EXPECT_EQ(f.behind, std::vector<int>{1});
  const std::string all = [&] {
    std::string s;
    for (const auto& x : f.facts) s += x + "\n";
    return s;
  }();
  EXPECT_NE(all.find("rank 0 waits in the store for key '/worker/attempt_0/default_pg/0/0/1'"), std::string::npos) << all;
  EXPECT_NE(all.find("rank 1 has no connection to the worker store: never reached init_process_group"),
            std::string::npos)
      << all;
}

// PyTorch 2.6: destroy_process_group deadlocked on the GIL (the stacks as eu-stack showed them).
TEST(HangReportTest, ARankDeadlockedDestroyingItsGlooGroupIsNamedWithWhatToDo) {
  RankState r = rank(0, "Current thread 0x00007fdd52880780 (most recent call first):\n"
                        "  File \"/jobs/train.py\", line 23 in <module>\n");
  r.native_stack = "TID 12406:\n#4  0x00007fdd4e6e129b std::thread::join()\n"
                   "#5  0x00007fdd3efcf19c c10d::ProcessGroupGloo::~ProcessGroupGloo()\n"
                   "TID 12416:\n#8  0x00007fdd4e985f93 c10::impl::PyObjectSlot::maybe_destroy_pyobj()\n"
                   "#14 0x00007fdd3efde061 c10d::ProcessGroupGloo::runLoop(int)\n";
  RankState done = rank(1);
  done.exited = true;
  const HangFindings f = analyze_hang(one_node({r, done}));
  ASSERT_FALSE(f.facts.empty());
  EXPECT_NE(f.facts[0].find("rank 0 is stuck in destroy_process_group"), std::string::npos) << f.facts[0];
  EXPECT_NE(f.facts[0].find("keep such tensors in a variable"), std::string::npos) << f.facts[0];
  for (const auto& fact : f.facts) EXPECT_EQ(fact.find("every rank waits"), std::string::npos) << fact;
}

TEST(HangReportTest, TheRankOutsideTheCollectiveIsBehindAndItsFramesComeFirst) {
  const auto d = one_node({rank(0, kPythonInCollective), rank(1, kPythonInUserCode), rank(2, kPythonInCollective)});
  EXPECT_EQ(analyze_hang(d).behind, std::vector<int>{1});
  EXPECT_EQ(rank_location(d.nodes[0].ranks[0]), "in torch.distributed all_reduce (train.py:13)");
  EXPECT_EQ(rank_location(d.nodes[0].ranks[1]), "in next_batch (data.py:40)");
  EXPECT_EQ(rank_location(rank(3, kPython2InCollective)), "in torch.distributed all_reduce (train.py:77)");
  const std::string report = format_hang_report(d);
  EXPECT_NE(report.find("train.py HUNG: no rank made progress for 31 s"), std::string::npos) << report;
  EXPECT_NE(report.find("behind     : rank 1\n"), std::string::npos) << report;
  EXPECT_NE(report.find("|   File \"/jobs/data.py\", line 40 in next_batch"), std::string::npos) << report;
  EXPECT_LT(report.find("rank 1 (local_rank 1"), report.find("rank 0 (local_rank 0")) << report;
  EXPECT_EQ(hang_summary(d), "no rank made progress for 31 s (--hang_timeout 30s); behind: rank 1");
}

TEST(HangReportTest, StepCountsAndHeartbeatsNameTheRankThatStopped) {
  auto a = rank(0), b = rank(1), c = rank(2);
  for (auto* r : {&a, &b, &c}) r->reports_progress = true;
  a.steps = c.steps = 120;
  b.steps = 119;
  EXPECT_EQ(analyze_hang(one_node({a, b, c})).behind, std::vector<int>{1});
  StoreView store;
  store.heartbeats = {{0, 40}, {1, 40}, {2, 39}};
  EXPECT_EQ(analyze_hang(one_node({rank(0), rank(1), rank(2)}, store)).behind, std::vector<int>{2});
}

TEST(HangReportTest, WhenEveryRankWaitsTheReportSaysSoRatherThanGuessing) {
  auto d = one_node({rank(0, kPythonInCollective), rank(1, kPythonInCollective)});
  const HangFindings f = analyze_hang(d);
  EXPECT_TRUE(f.behind.empty());
  ASSERT_FALSE(f.facts.empty());
  EXPECT_NE(f.facts.back().find("every rank waits for the others"), std::string::npos);
  EXPECT_NE(format_hang_report(d).find("behind     : (not determined)"), std::string::npos);
}

TEST(HangReportTest, NativeFramesFromEuStackAndGdbNameTheCollective) {
  RankState eu = rank(0);
  eu.native_stack =
      "PID 1000 - process\nTID 1001:\n#0  0x00007f01 epoll_wait\nTID 1000:\n#0  0x00007f02 __futex_abstimed_wait_common\n"
      "#1  0x00007f03 pthread_cond_wait@@GLIBC_2.3.2\n#2  0x00007f04 c10d::Work::wait(std::chrono::duration<long>)\n";
  EXPECT_EQ(rank_location(eu), "in c10d::Work::wait");
  RankState gdb = rank(0);
  gdb.native_stack =
      "Thread 2 (Thread 0x7f (LWP 1001) \"python3\"):\n#0  0x00007f in epoll_wait () from /lib/libc.so.6\n"
      "Thread 1 (Thread 0x7f (LWP 1000) \"train\"):\n#0  0x00007f in clock_nanosleep () from /lib/libc.so.6\n"
      "#1  0x0000 in load_shard (path=...) at data.cpp:88\n#2  0x0000 in main () at train.cpp:10\n";
  EXPECT_EQ(rank_location(gdb), "in load_shard");
}

TEST(HangReportTest, NodeDiagnosesTravelAsJsonAndGarbageReadsAsEmpty) {
  StoreView store;
  store.endpoint = "10.0.0.1:29500";
  store.waits.push_back({"10.0.0.2:4000", {"k1", "k2"}, 3.5});
  store.clients = {"10.0.0.2:4000"};
  store.heartbeats = {{3, 17}};
  NodeDiagnosis n;
  n.node = 1;
  n.host = "b";
  auto r = rank(3, kPythonInCollective, {"10.0.0.2:4000"});
  r.problems = {"no native stacks"};
  r.native_stack = "TID 1003:\n#0  0x1 gloo::transport::tcp::Pair::recv\n";
  r.steps = 9;
  r.reports_progress = true;
  n.ranks.push_back(r);
  n.store = store;
  const NodeDiagnosis back = node_diagnosis_from_json(nlohmann::json::parse(to_json(n).dump()));
  EXPECT_EQ(back.node, 1);
  ASSERT_EQ(back.ranks.size(), 1u);
  EXPECT_EQ(back.ranks[0].python_stack, kPythonInCollective);
  EXPECT_EQ(back.ranks[0].store_endpoints, std::vector<std::string>{"10.0.0.2:4000"});
  EXPECT_EQ(back.ranks[0].steps, 9u);
  EXPECT_EQ(back.ranks[0].problems, std::vector<std::string>{"no native stacks"});
  ASSERT_TRUE(back.store);
  EXPECT_EQ(back.store->waits[0].keys, (std::vector<std::string>{"k1", "k2"}));
  EXPECT_EQ(back.store->heartbeats.at(3), 17);
  // From another version or a broken node: whatever is missing reads as a default.
  const NodeDiagnosis junk = node_diagnosis_from_json(nlohmann::json::parse(R"({"node":"x","ranks":[1,{"rank":"y"}]})"));
  EXPECT_EQ(junk.node, -1);
  EXPECT_EQ(junk.ranks.size(), 1u);
  EXPECT_FALSE(junk.store);
}

// --- step rates -----------------------------------------------------------------------------------

TEST(StepRatesTest, ComputeTimePerStepIsWallTimeMinusWaitsOverTheWindow) {
  RateTracker t;
  const auto t0 = std::chrono::steady_clock::time_point{} + 100s;
  t.sample(t0, 100, 0, true);
  t.sample(t0 + 10s, 200, 4'000'000'000ULL, true);  // 100 steps in 10 s, 4 s of them waiting
  const auto w = t.window(3, 1);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->steps, 100u);
  EXPECT_DOUBLE_EQ(w->steps_per_second, 10.0);
  ASSERT_TRUE(w->compute_ms_per_step);
  EXPECT_NEAR(*w->compute_ms_per_step, 60.0, 1e-9);
  EXPECT_NEAR(w->wait_fraction, 0.4, 1e-9);
  EXPECT_FALSE(t.window(3, 1)) << "no new steps since the last window";
  t.sample(t0 + 20s, 300, 4'000'000'000ULL, true);
  const auto run = t.whole_run(3, 1);
  ASSERT_TRUE(run);
  EXPECT_EQ(run->steps, 300u);
  EXPECT_DOUBLE_EQ(run->steps_per_second, 10.0);
}

TEST(StepRatesTest, AStragglerIsFlaggedAfterThreeSlowWindowsAndOnlyOnce) {
  auto window = [](double slow_ms) {
    std::vector<RankRate> w;
    for (int r = 0; r < 4; ++r) {
      RankRate x;
      x.rank = r;
      x.steps = 10;
      x.steps_per_second = 5;
      x.compute_ms_per_step = r == 2 ? slow_ms : 100.0 + r;
      w.push_back(x);
    }
    return w;
  };
  EXPECT_EQ(slower_than_median(window(300), 1.5), std::vector<int>{2});
  EXPECT_TRUE(slower_than_median(window(140), 1.5).empty());
  StragglerWatch watch(1.5, 3);
  EXPECT_TRUE(watch.update(window(300)).empty());
  EXPECT_TRUE(watch.update(window(300)).empty());
  const auto warnings = watch.update(window(300));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("rank 2 is a straggler: 300.0 ms of compute per step against 101.0 ms"), std::string::npos)
      << warnings[0];
  EXPECT_TRUE(watch.update(window(300)).empty()) << "warned once";
  // A slow window that is not persistent warns nobody.
  StragglerWatch other(1.5, 3);
  other.update(window(300));
  other.update(window(100));
  EXPECT_TRUE(other.update(window(300)).empty());
  const std::string table = format_rates_table(window(300), watch.flagged());
  EXPECT_NE(table.find("<- straggler"), std::string::npos) << table;
  EXPECT_EQ(table.find("<- straggler"), table.rfind("<- straggler")) << table;
}

TEST(StepRatesTest, TwoRanksCompareWithTheFasterAndRatesSurviveJson) {
  RankRate a, b;
  a.rank = 0;
  a.steps_per_second = 10;
  b.rank = 1;
  b.steps_per_second = 4;  // heartbeat-only ranks: rates, no compute figures
  EXPECT_EQ(slower_than_median({a, b}, 1.5), std::vector<int>{1});
  b.compute_ms_per_step = 12.5;
  b.node = 2;
  const auto back = rank_rate_from_json(to_json(b));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->node, 2);
  EXPECT_DOUBLE_EQ(*back->compute_ms_per_step, 12.5);
  EXPECT_FALSE(rank_rate_from_json(nlohmann::json::parse(R"({"rank":1})")));
}

TEST(StepRatesTest, StatusShowsEachNodesLatestRates) {
  std::vector<std::pair<std::string, std::string>> kv = {
      {"/ddprun/j/gen", "1"},
      {"/ddprun/j/g1/r0/node/0", R"({"host":"a","nproc":1,"nnodes":2,"agent":"x"})"},
      {"/ddprun/j/g1/r0/complete", "1"},
      {"/ddprun/j/g1/r0/rates/0", R"({"node":0,"ranks":[{"rank":0,"steps_per_s":4.5}]})"},
      {"/ddprun/j/g1/r0/rates/1", "not json"},
      {"/ddprun/j/g1/r0/hang", "1"},
  };
  const auto job = rdzv::jobs::summarize_jobs(kv, 0)["jobs"][0];
  ASSERT_TRUE(job.contains("step_rates")) << job.dump();
  EXPECT_EQ(job["step_rates"][0]["steps_per_s"], 4.5);
  EXPECT_EQ(job["hang_diagnosed_by"], "1");
}

// --- /proc --------------------------------------------------------------------------------------

TEST(ProcfsTest, KernelEndpointsDecodeForIpv4Ipv6AndMappedAddresses) {
  uint16_t port = 0;
  EXPECT_EQ(procfs::decode_proc_endpoint("0100007F:1F90", &port), "127.0.0.1:8080");
  EXPECT_EQ(port, 8080);
  EXPECT_EQ(procfs::decode_proc_endpoint("00000000000000000000000001000000:0050"), "[::1]:80");
  EXPECT_EQ(procfs::decode_proc_endpoint("0000000000000000FFFF00000100007F:0050"), "127.0.0.1:80");
  EXPECT_FALSE(procfs::decode_proc_endpoint("0100007G:0050"));
  EXPECT_FALSE(procfs::decode_proc_endpoint("0100007F"));
  EXPECT_FALSE(procfs::decode_proc_endpoint("0100007F:123456"));
  EXPECT_EQ(procfs::normalize_endpoint("[::ffff:10.1.2.3]:29500"), "10.1.2.3:29500");
  EXPECT_EQ(procfs::normalize_endpoint("[fe80::1]:29500"), "[fe80::1]:29500");
}

TEST(ProcfsTest, TheTreeItsCpuTimeAndItsConnectionsAreReadFromRealProcesses) {
  // A busy child with a sleeping grandchild.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::setpgid(0, 0);
    if (::fork() == 0) {
      ::pause();
      ::_exit(0);
    }
    [[maybe_unused]] auto n = ::write(ready[1], "x", 1);
    std::atomic<uint64_t> spin{0};
    for (;;) spin.fetch_add(1, std::memory_order_relaxed);
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  std::this_thread::sleep_for(50ms);  // sleep override: the grandchild's fork has returned, give /proc a moment
  const auto tree = procfs::process_tree(child);
  EXPECT_EQ(tree.size(), 2u);
  const uint64_t before = procfs::tree_cpu_ticks(tree);
  std::this_thread::sleep_for(300ms);  // sleep override: the child burns CPU meanwhile
  EXPECT_GT(procfs::tree_cpu_ticks(tree), before);
  const auto st = procfs::read_stat(child);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->pgid, child);
  ::kill(-child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);

  // This process's own loopback connection, seen from both ends.
  const int server = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(server, 1), 0);
  socklen_t len = sizeof addr;
  ::getsockname(server, reinterpret_cast<sockaddr*>(&addr), &len);
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const int accepted = ::accept(server, nullptr, nullptr);
  sockaddr_in local{};
  len = sizeof local;
  ::getsockname(client, reinterpret_cast<sockaddr*>(&local), &len);
  const std::string expected = "127.0.0.1:" + std::to_string(ntohs(local.sin_port));
  bool found = false;
  for (const auto& conn : procfs::tcp_connections({::getpid()})) {
    if (conn.local == expected && conn.remote_port == ntohs(addr.sin_port)) found = true;
  }
  EXPECT_TRUE(found) << expected;
  for (int fd : {client, accepted, server}) ::close(fd);
}

// --- stacks -------------------------------------------------------------------------------------

TEST(StacksTest, APythonWorkersTracebackAndANativeProcesssFramesAreCaptured) {
  if (::access(TORCH_PYTHON, X_OK) != 0) GTEST_SKIP() << TORCH_PYTHON << " is not here";
  test::TempDir dir;
  write_python_hook(dir.str());
  SpawnRequest req;
  req.argv = {TORCH_PYTHON, "-c",
              "import time, sys\ndef waiting_for_godot():\n    print('ready', flush=True)\n    time.sleep(60)\n"
              "waiting_for_godot()\n"};
  Environment env = current_environment();
  env["PYTHONPATH"] = dir.str();
  env["DDPRUN_STACK_DIR"] = dir.str();
  env["DDPRUN_STACK_SIGNAL"] = std::to_string(stack_signal());
  req.envp = to_envp(env);
  SpawnedProcess p = spawn_process(req);
  char buf[16];
  ASSERT_GT(::read(p.stdout_fd, buf, sizeof buf), 0);  // "ready": armed and asleep
  const RankStacks s = capture_stacks(p.pid, p.pid, procfs::process_tree(p.pid), dir.str(), 10s);
  // Asleep in it, or (signalled a moment early) still printing from it.
  EXPECT_NE(s.python.find(" in waiting_for_godot"), std::string::npos) << s.python;
  if (s.native_tool.empty()) {
    EXPECT_FALSE(s.problems.empty());
  } else {
    EXPECT_NE(s.native.find("TID " + std::to_string(p.pid)), std::string::npos) << s.native;
  }
  // The process is unharmed: the signal only wrote its tracebacks.
  EXPECT_EQ(::kill(p.pid, 0), 0);
  ::kill(p.pid, SIGKILL);
  ::waitpid(p.pid, nullptr, 0);
  ::close(p.stdout_fd);
  ::close(p.stderr_fd);
}

TEST(StacksTest, AProcessThatNeverArmedIsNotSignalled) {
  test::TempDir dir;
  SpawnRequest req;
  req.argv = {"/bin/sleep", "60"};
  req.envp = to_envp(current_environment());
  SpawnedProcess p = spawn_process(req);
  const RankStacks s = capture_stacks(p.pid, p.pid, {p.pid}, dir.str(), 5s);
  EXPECT_TRUE(s.python.empty());
  EXPECT_EQ(::kill(p.pid, 0), 0) << "a real-time signal would have killed it";
  ::kill(p.pid, SIGKILL);
  ::waitpid(p.pid, nullptr, 0);
  ::close(p.stdout_fd);
  ::close(p.stderr_fd);
}

TEST(StacksTest, FirstLinesSaysHowManyWereLeftOut) {
  EXPECT_EQ(first_lines("a\nb\nc\n", 2), "a\nb\n... (1 more lines)\n");
  EXPECT_EQ(first_lines("a\nb\n", 5), "a\nb\n");
}

// --- torchelastic's file timer ------------------------------------------------------------------

void send_line(const std::string& fifo, const std::string& line) {
  // As FileTimerClient does: non-blocking open for writing, one write of the line, close.
  const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
  ASSERT_GE(fd, 0) << "the server must hold the FIFO open for reading";
  const std::string data = line + "\n";
  ASSERT_EQ(::write(fd, data.data(), data.size()), static_cast<ssize_t>(data.size()));
  ::close(fd);
}

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TEST(FileTimerTest, AnExpiredTimerIsReportedThenSignalledAndAReleasedOneIsNot) {
  test::TempDir dir;
  const pid_t worker = ::fork();
  if (worker == 0) {
    ::pause();
    ::_exit(0);
  }
  std::mutex m;
  std::vector<std::pair<std::string, int>> expired;  // (scope, rank), in the order reported
  {
    FileTimerServer server(
        (dir.path / "timer").string(), [&](pid_t pid) { return pid == worker ? 7 : -1; },
        [&](const TimerExpiry& t, int rank) {
          std::lock_guard lock(m);
          expired.emplace_back(t.scope, rank);
        });
    const std::string fifo = (dir.path / "timer").string();
    EXPECT_TRUE(fs::is_fifo(fifo));
    // "a" is released well before it would expire, and expires before "train_step" does: had the
    // release been lost, "a" would be reported (and the worker signalled) first.
    const double now = wall_now();
    send_line(fifo, R"({"version":1,"pid":)" + std::to_string(worker) + R"(,"scope_id":"a","expiration_time":)" +
                        std::to_string(now + 1.0) + R"(,"signal":15})");
    send_line(fifo, R"({"version":1,"pid":)" + std::to_string(worker) +
                        R"(,"scope_id":"a","expiration_time":-1,"signal":0})");
    // A timer naming a process that is not a worker (this test) is refused, not signalled.
    send_line(fifo, R"({"version":1,"pid":)" + std::to_string(::getpid()) + R"(,"scope_id":"x","expiration_time":)" +
                        std::to_string(now - 1) + R"(,"signal":9})");
    send_line(fifo, R"({"version":1,"pid":)" + std::to_string(worker) + R"(,"scope_id":"train_step","expiration_time":)" +
                        std::to_string(now + 1.5) + R"(,"signal":15})");
    int status = 0;
    ASSERT_EQ(::waitpid(worker, &status, 0), worker);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
    EXPECT_GE(wall_now(), now + 1.5) << "signalled at its expiry, not before";
    std::lock_guard lock(m);
    EXPECT_EQ(expired, (std::vector<std::pair<std::string, int>>{{"train_step", 7}}));
    EXPECT_EQ(server.requests(), 4u);
  }
  EXPECT_FALSE(fs::exists(dir.path / "timer")) << "the FIFO is removed with the server";
}

TEST(FileTimerTest, MalformedRequestsAreRefusedWithAReason) {
  test::TempDir dir;
  FileTimerServer server((dir.path / "t").string(), [](pid_t) { return -1; }, [](const TimerExpiry&, int) {});
  EXPECT_EQ(server.handle_line("{not json"), "not a JSON object");
  EXPECT_NE(server.handle_line(R"({"pid":"1","scope_id":"s","expiration_time":1})"), "");
  EXPECT_NE(server.handle_line(R"({"pid":-4,"scope_id":"s","expiration_time":1})"), "");
  EXPECT_NE(server.handle_line(R"({"pid":4,"scope_id":"s","expiration_time":1,"signal":99})"), "");
  EXPECT_EQ(server.handle_line(R"({"version":1,"pid":4,"scope_id":"s","expiration_time":1e18,"signal":9})"), "");
}

}  // namespace
}  // namespace ddprun::launcher
