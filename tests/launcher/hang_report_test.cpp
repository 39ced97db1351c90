// The hang report (launcher/watchdog/hang_report, hang_frames): who is behind, where each rank
// is, the JSON the nodes exchange.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "launcher/watchdog/hang_frames.hpp"
#include "launcher/watchdog/hang_report.hpp"

namespace ddprun::launcher {

using watchdog::analyze_hang;
using watchdog::format_hang_report;
using watchdog::hang_summary;
using watchdog::HangDiagnosis;
using watchdog::HangFindings;
using watchdog::node_diagnosis_from_json;
using watchdog::NodeDiagnosis;
using watchdog::rank_location;
using watchdog::RankState;
using watchdog::StoreView;
using watchdog::to_json;
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
  EXPECT_NE(all.find("rank 0 waits in the store for key '/worker/attempt_0/default_pg/0/0/1'"), std::string::npos)
      << all;
  EXPECT_NE(all.find("rank 1 has no connection to the worker store: never reached init_process_group"),
            std::string::npos)
      << all;
}

// PyTorch 2.6: destroy_process_group deadlocked on the GIL (the stacks as eu-stack showed them).
TEST(HangReportTest, ARankDeadlockedDestroyingItsGlooGroupIsNamedWithWhatToDo) {
  RankState r = rank(0,
                     "Current thread 0x00007fdd52880780 (most recent call first):\n"
                     "  File \"/jobs/train.py\", line 23 in <module>\n");
  r.native_stack =
      "TID 12406:\n#4  0x00007fdd4e6e129b std::thread::join()\n"
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
      "PID 1000 - process\nTID 1001:\n#0  0x00007f01 epoll_wait\nTID 1000:\n#0  0x00007f02 "
      "__futex_abstimed_wait_common\n"
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
  const NodeDiagnosis junk =
      node_diagnosis_from_json(nlohmann::json::parse(R"({"node":"x","ranks":[1,{"rank":"y"}]})"));
  EXPECT_EQ(junk.node, -1);
  EXPECT_EQ(junk.ranks.size(), 1u);
  EXPECT_FALSE(junk.store);
}

// --- step rates -----------------------------------------------------------------------------------

}  // namespace
}  // namespace ddprun::launcher
