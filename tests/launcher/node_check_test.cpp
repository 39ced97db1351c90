// Health checks before every round (--node_check, --check_free_space, --check_interface,
// --check_gpus): a node that fails one leaves the job with the reason; a static job ends with a
// report that names the node and the check, an elastic one goes on without the node; a check that
// hangs is killed at its timeout; a full file system fails the free-space check; the GPU check asks
// nvidia-smi for each GPU the workers are to use (a host without it fails the check); every node
// failing its check ends every node with its reason; a host that left the job unfit twice (a
// flapping node) is not taken back (--max_unfit_leaves), on the store and on etcd.
#include <signal.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "launcher/agent/node_checks.hpp"
#include "tests/support/free_port.hpp"
#include "tests/support/job_node.hpp"
#include "tests/support/meeting.hpp"
#include "tests/support/report.hpp"
#include "tests/support/small_disk.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/wait_until.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
namespace agent = launcher::agent;

const std::string kBadDisk = "echo checking /scratch; echo '/scratch is read-only' >&2; exit 3";

std::string message(const nlohmann::json& report) {
  return report.is_object() && report["message"].is_string() ? report["message"].get<std::string>() : "";
}

TEST(NodeCheckTest, AFailingCheckOnOneNodeEndsAStaticJobWithAReportThatNamesTheNodeAndTheCheck) {
  const int port = free_port();
  Reports reports;
  auto n0 = JobNode(0).meet(at_master(port)).flags(reports.flags(0)).start({TEST_WORKER_BIN, "sleep", "60"});
  auto n1 = JobNode(1)
                .meet(at_master(port))
                .flags(reports.flags(1, {"--node_check", kBadDisk}))
                .start({TEST_WORKER_BIN, "sleep", "60"});
  const Finished f1 = n1->wait(60s), f0 = n0->wait(60s);
  ASSERT_FALSE(f0.timed_out) << f0.err;
  EXPECT_EQ(f1.exit_code, 1) << f1.err;
  EXPECT_EQ(f0.exit_code, 1) << f0.err;
  const auto r0 = reports.of(0), r1 = reports.of(1);
  EXPECT_EQ(r1["outcome"], "node_check_failed") << r1.dump(2);
  EXPECT_NE(message(r1).find("/scratch is read-only"), std::string::npos) << r1.dump(2);
  EXPECT_EQ(r0["outcome"], "node_lost") << r0.dump(2);
  EXPECT_NE(message(r0).find("node 1"), std::string::npos) << r0.dump(2);
  EXPECT_NE(message(r0).find("failed its health check: --node_check"), std::string::npos) << r0.dump(2);
  EXPECT_NE(message(r0).find("/scratch is read-only"), std::string::npos) << r0.dump(2);
  EXPECT_TRUE(r0["attempts"].empty() || r0["attempts"].back()["workers"].empty()) << "no worker ran: " << r0.dump(2);
}

TEST(NodeCheckTest, AnElasticJobGoesOnWithoutTheNodeThatFailsItsCheck) {
  const int port = free_port();
  Reports reports;
  auto node = [&](int n, std::vector<std::string> flags) {
    return JobNode(n)
        .nnodes("1:2")
        .without_rank()
        .meet(at_store(port, "checked", /*c10d=*/true))
        .conf("join_timeout=30,last_call_timeout=2")
        .flags(reports.flags(n, std::move(flags)))
        .start({TEST_WORKER_BIN, "sleep", "1"});
  };
  auto n0 = node(0, {});
  ASSERT_TRUE(n0->wait_for([&] { return port_taken(port); }, 10s)) << n0->err();
  auto n1 = node(1, {"--node_check", kBadDisk});
  const Finished f1 = n1->wait(60s), f0 = n0->wait(60s);
  EXPECT_EQ(f1.exit_code, 1) << f1.err;
  EXPECT_EQ(f0.exit_code, 0) << f0.err;
  const auto r0 = reports.of(0);
  ASSERT_TRUE(r0.is_object()) << f0.err;
  EXPECT_EQ(r0["outcome"], "succeeded");
  EXPECT_EQ(r0["attempts"].back()["nnodes"], 1) << r0.dump(2);
}

// A worker that finds a fault in its host asks that its node leave the job, and fails: the node
// leaves before the next round; a static job ends with the reason, an elastic one goes on.
TEST(NodeCheckTest, AWorkerCanAskForItsNodeToLeaveTheJob) {
  for (const bool elastic : {false, true}) {
    const int port = free_port();
    Reports reports;
    auto node = [&](int n, std::vector<std::string> worker) {
      worker.insert(worker.begin(), TEST_WORKER_BIN);
      JobNode j(n);
      if (elastic) {
        j.nnodes("1:2")
            .without_rank()
            .meet(at_store(port, "excluded", /*c10d=*/true))
            .conf("join_timeout=30,last_call_timeout=2");
      } else {
        j.meet(at_master(port));
      }
      return j.flags(reports.flags(n, {"--max_restarts", "1"})).start(worker);
    };
    auto n0 = node(0, {"sleep", "2"});
    if (elastic) {
      ASSERT_TRUE(n0->wait_for([&] { return port_taken(port); }, 10s)) << n0->err();
    }
    auto n1 = node(1, {"exclude-node", "ECC errors on GPU 0", "exit-if-rank", "1", "1"});
    const Finished f1 = n1->wait(60s), f0 = n0->wait(60s);
    EXPECT_EQ(f1.exit_code, 1) << f1.err;
    const auto r0 = reports.of(0), r1 = reports.of(1);
    EXPECT_EQ(r1["outcome"], "node_excluded") << r1.dump(2);
    EXPECT_EQ(message(r1), "was asked by a worker to leave the job: ECC errors on GPU 0") << r1.dump(2);
    if (elastic) {
      EXPECT_EQ(f0.exit_code, 0) << f0.err;
      EXPECT_EQ(r0["attempts"].back()["nnodes"], 1) << r0.dump(2);
    } else {
      EXPECT_EQ(f0.exit_code, 1) << f0.err;
      EXPECT_EQ(message(r0), "node 1 (" + r1["host"].get<std::string>() +
                                 ") was asked by a worker to leave the job: ECC errors on GPU 0")
          << r0.dump(2);
    }
  }
}

class NodeCheckBackendTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::Etcd && !have_etcd())
      GTEST_FAIL() << "etcd-server and etcd-client are not installed: run scripts/install_deps.sh";
  }
  // An agent of an elastic job of one or two nodes playing host 1 + (report > 0) (the flapping
  // host's agents all play the same one), writing its report as `report`.
  std::unique_ptr<Subprocess> start(const Meeting& m, const Reports& reports, int report,
                                    std::vector<std::string> flags, const std::vector<std::string>& program) {
    flags.insert(flags.end(), {"--nproc_per_node", "1", "--max_restarts", "3", "--node_check_timeout", "60"});
    return JobNode(report == 0 ? 0 : 1)
        .nnodes("1:2")
        .without_rank()
        .meet(m.flags())
        .conf(m.conf())
        .flags(reports.flags(report, std::move(flags)))
        .start(program);
  }
};

// Both nodes of a job fail their check (here a check that waits for the other node's before it
// fails, so that the two fail together): each leaves with its reason and nothing waits on.
TEST_P(NodeCheckBackendTest, EveryNodeFailingItsCheckEndsEveryNodeWithItsReason) {
  Meeting m(GetParam(), "all-unfit");
  TempDir dir;
  const std::string check = "touch " + dir.str() + "/$$; while [ $(ls " + dir.str() +
                            " | wc -l) -lt 2 ]; do sleep 0.1; done; echo 'GPU 3 fell off the bus' >&2; exit 3";
  Reports reports;
  auto n0 = start(m, reports, 0, {"--node_check", check}, {TEST_WORKER_BIN, "print", "1"});
  ASSERT_TRUE(m.first_node_up(*n0)) << n0->err();
  auto n1 = start(m, reports, 1, {"--node_check", check}, {TEST_WORKER_BIN, "print", "1"});
  const Finished f0 = n0->wait(90s), f1 = n1->wait(90s);
  ASSERT_FALSE(f0.timed_out || f1.timed_out) << f0.err << "\n" << f1.err;
  for (const auto& [f, r] : {std::pair{f0, reports.of(0)}, std::pair{f1, reports.of(1)}}) {
    EXPECT_EQ(f.exit_code, 1) << f.err;
    EXPECT_EQ(r["outcome"], "node_check_failed") << r.dump(2);
    EXPECT_NE(message(r).find("GPU 3 fell off the bus"), std::string::npos) << r.dump(2);
    EXPECT_EQ(f.out.find("line"), std::string::npos) << "a worker ran: " << f.out;
  }
}

// A flapping host: its node fails its check, comes back healthy and joins, then a worker finds a
// fault and asks that it leave. Started a third time, healthy, it is not taken back: it leaves at
// once, and the job, which ran on, is not disturbed (no round more on the running node).
TEST_P(NodeCheckBackendTest, AHostThatLeftTheJobUnfitTwiceIsNotTakenBack) {
  Meeting m(GetParam(), "flapping");
  TempDir dir;
  const std::string done = (dir.path / "done").string();
  const std::vector<std::string> until_done{"/bin/sh", "-c", "while [ ! -e " + done + " ]; do sleep 0.1; done"};
  Reports reports;
  auto n0 = start(m, reports, 0, {}, until_done);
  ASSERT_TRUE(m.first_node_up(*n0)) << n0->err();
  ASSERT_TRUE(n0->wait_for_workers(1, 60s)) << n0->err();

  const Finished f1 = start(m, reports, 1, {"--node_check", kBadDisk}, until_done)->wait(60s);
  EXPECT_EQ(f1.exit_code, 1) << f1.err;
  EXPECT_EQ(reports.of(1)["outcome"], "node_check_failed") << reports.of(1).dump(2);

  const Finished f2 =
      start(m, reports, 2, {}, {"/bin/sh", "-c", "echo flaky NIC > \"$DDPRUN_EXCLUDE_NODE_FILE\"; exit 1"})->wait(120s);
  EXPECT_EQ(f2.exit_code, 1) << f2.err;
  EXPECT_EQ(reports.of(2)["outcome"], "node_excluded") << reports.of(2).dump(2);

  const Finished f3 = start(m, reports, 3, {}, until_done)->wait(60s);
  EXPECT_EQ(f3.exit_code, 1) << f3.err;
  const auto r3 = reports.of(3);
  EXPECT_EQ(r3["outcome"], "node_not_taken_back") << r3.dump(2);
  EXPECT_NE(message(r3).find("left this run of the job unfit 2 times (--max_unfit_leaves 2; the last was asked by a "
                             "worker to leave the job: flaky NIC)"),
            std::string::npos)
      << r3.dump(2);
  EXPECT_TRUE(r3["attempts"].empty() || r3["attempts"].back()["workers"].empty()) << r3.dump(2);

  std::ofstream(done).close();
  const Finished f0 = n0->wait(60s);
  EXPECT_EQ(f0.exit_code, 0) << f0.err;
  const auto r0 = reports.of(0);
  ASSERT_TRUE(r0.is_object()) << f0.err;
  // Alone; the round the healthy return joined, which its worker's failure ended (here before
  // this node's own workers may have started); alone again: nothing after.
  ASSERT_EQ(r0["attempts"].size(), 3u) << r0.dump(2);
  EXPECT_EQ(r0["attempts"][1]["outcome"], "failed") << r0.dump(2);
  EXPECT_EQ(r0["attempts"][2]["nnodes"], 1) << r0.dump(2);
}

INSTANTIATE_TEST_SUITE_P(Backends, NodeCheckBackendTest, ::testing::Values(Backend::Store, Backend::Etcd),
                         [](const auto& p) { return p.param == Backend::Store ? "Store" : "Etcd"; });

TEST(NodeCheckTest, ACheckThatHangsIsKilledAtItsTimeoutAndLeavesNothingBehind) {
  const std::string marker = "ddprun-check-marker-" + std::to_string(::getpid());
  Reports reports;
  Subprocess p({ddprun_bin(), "--nproc_per_node", "1", "--node_check", "sleep 600 & sleep 600; : " + marker,
                "--node_check_timeout", "1", "--report_file", reports.path(0).string(), TEST_WORKER_BIN, "sleep", "0"});
  const Finished f = p.wait(60s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 1) << f.err;
  EXPECT_NE(message(reports.of(0)).find("did not finish within 1s (--node_check_timeout)"), std::string::npos)
      << reports.of(0).dump(2);
  // The check's process group (the shell and the sleep it left in the background) is gone.
  for (const auto& e : fs::directory_iterator("/proc")) {
    std::ifstream in(e.path() / "cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(cmdline.find(marker), std::string::npos) << e.path() << " still runs";
  }
}

// The processes whose command line holds `marker` (a check's shells are named by one).
std::vector<pid_t> processes_with(const std::string& marker) {
  std::vector<pid_t> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "cmdline");
    const std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmdline.find(marker) != std::string::npos) found.push_back(std::stoi(name));
  }
  return found;
}

// Kills what a check left behind (the test's own marked processes) when it fails.
struct KillMarked {
  std::string marker;
  ~KillMarked() {
    for (pid_t pid : processes_with(marker)) ::kill(pid, SIGKILL);
  }
};

// A check that passes but leaves a child holding its output is done when its process exits: the
// node joins (before: the check "did not finish" at its timeout, and the node left the job).
TEST(NodeCheckTest, ACheckThatExitsIsDoneThoughAChildStillHoldsItsOutput) {
  const KillMarked left{"ddprun-check-holder-" + std::to_string(::getpid())};
  Reports reports;
  Subprocess p({ddprun_bin(), "--nproc_per_node", "1", "--node_check",
                "echo checked; sh -c 'sleep 600; : " + left.marker + "' & exit 0", "--node_check_timeout", "20",
                "--report_file", reports.path(0).string(), TEST_WORKER_BIN, "print", "1"});
  const Finished f = p.wait(90s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 0) << f.err;
  EXPECT_EQ(reports.of(0)["outcome"], "succeeded") << reports.of(0).dump(2);
  EXPECT_NE(f.out.find("[rank0]: out line 0"), std::string::npos) << f.out;
  EXPECT_TRUE(processes_with(left.marker).empty()) << "the check's child outlived it";
}

// A check that starts a daemon in a session of its own (setsid): the daemon does not outlive the
// check, nor ddprun (before: it ran on after ddprun had exited).
TEST(NodeCheckTest, ACheckThatStartsADaemonInItsOwnSessionLeavesNothingBehind) {
  const KillMarked left{"ddprun-check-daemon-" + std::to_string(::getpid())};
  Subprocess p({ddprun_bin(), "--nproc_per_node", "1", "--node_check",
                "setsid sh -c 'sleep 600; : " + left.marker + "' >/dev/null 2>&1 </dev/null & exit 0", TEST_WORKER_BIN,
                "print", "1"});
  const Finished f = p.wait(90s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 0) << f.err;
  EXPECT_TRUE(processes_with(left.marker).empty()) << "the check's daemon outlived ddprun";
}

// ddprun SIGKILLed while its check runs: the check's processes, in its group or not, go too.
TEST(NodeCheckTest, ACheckRunningWhenDdprunIsKilledDoesNotOutliveIt) {
  const std::string pid = std::to_string(::getpid());
  const KillMarked left{"ddprun-check-orphan-" + pid};
  // The marker is put together by the check's shell: only the two daemons' command lines hold it.
  const std::string daemon = "sh -c \"sleep 600; : ${m}" + pid + "\"";
  Subprocess p({ddprun_bin(), "--nproc_per_node", "1", "--node_check",
                "m=ddprun-check-orphan-; " + daemon + " & setsid " + daemon + " >/dev/null 2>&1 & sleep 600",
                TEST_WORKER_BIN, "print", "1"});
  ASSERT_TRUE(p.wait_for([&] { return processes_with(left.marker).size() >= 2; }, 30s)) << p.err();
  p.signal(SIGKILL);
  p.wait(30s);
  EXPECT_TRUE(wait_until([&] { return processes_with(left.marker).empty(); }, 30s))
      << processes_with(left.marker).size() << " of the check's processes outlived ddprun";
}

// The same one level down: a check that fails at once, leaving a subshell that starts one daemon
// in a session of its own and one in its group, and holds the output.
TEST(NodeCheckTest, AScriptCheckKillsEveryProcessItStartedOnceItExits) {
  const KillMarked left{"ddprun-check-tree-" + std::to_string(::getpid())};
  const StopSignal stop;
  const std::string daemon = "sh -c 'sleep 600; : " + left.marker + "'";
  const auto why = agent::check_script(
      "(setsid " + daemon + " & " + daemon + " & sleep 600) & echo 'the disk is fine'; exit 4", 20s, stop);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("exited with 4: the disk is fine"), std::string::npos) << *why;
  EXPECT_TRUE(processes_with(left.marker).empty());
  EXPECT_FALSE(agent::check_script("exit 0", 20s, stop));
}

TEST(NodeCheckTest, AFullFileSystemFailsTheFreeSpaceCheck) {
  SmallDisk disk("1m");
  if (!disk.mounted) GTEST_SKIP() << "cannot mount a tmpfs here (" << disk.error << ")";
  agent::NodeCheckSettings empty_disk;
  empty_disk.free_space = {{disk.dir.str(), 512 * 1024}};
  const StopSignal stop;
  EXPECT_FALSE(agent::run_node_checks(empty_disk, stop)) << "1 MiB free, 512 KiB needed";
  disk.fill();
  const auto why = agent::run_node_checks(empty_disk, stop);
  ASSERT_TRUE(why);
  EXPECT_EQ(*why, "--check_free_space: " + disk.dir.str() + " has 0 B free, 512 KiB needed");
  // The same through ddprun: it leaves before any worker starts.
  Subprocess p({ddprun_bin(), "--nproc_per_node", "1", "--check_free_space", disk.dir.str() + ":512K", TEST_WORKER_BIN,
                "print", "1"});
  const Finished f = p.wait(60s);
  EXPECT_EQ(f.exit_code, 1) << f.err;
  EXPECT_EQ(f.out.find("line"), std::string::npos) << "a worker ran: " << f.out;
  EXPECT_NE(f.err.find("--check_free_space: " + disk.dir.str()), std::string::npos) << f.err;
}

// nvidia-smi is what --check_gpus asks. On a host with a driver, a GPU it has passes and one it has
// not fails; on a host without one (no nvidia-smi: a CPU node, a driver not installed) the check
// fails and says it could not ask. Either way the GPUs asked are the workers' ones
// (CUDA_VISIBLE_DEVICES), and a node that fails leaves before any worker starts.
TEST(NodeCheckTest, TheGpuCheckAsksNvidiaSmiForEachGpuTheWorkersAreToUse) {
  Subprocess smi({"/bin/sh", "-c", "nvidia-smi -L"});
  const bool has_driver = smi.wait(60s).exit_code == 0;
  const auto run = [](const std::string& visible) {
    Reports reports;
    Subprocess p({ddprun_bin(), "--nproc_per_node", "1", "--check_gpus", "--report_file", reports.path(0).string(),
                  TEST_WORKER_BIN, "print", "1"},
                 {{"CUDA_VISIBLE_DEVICES", visible}});
    const Finished f = p.wait(120s);
    return std::make_pair(f, reports.of(0));
  };
  const auto [absent, absent_report] = run("4095");
  EXPECT_EQ(absent.exit_code, 1) << absent.err;
  EXPECT_EQ(absent.out.find("line"), std::string::npos) << "a worker ran: " << absent.out;
  const std::string why = message(absent_report);
  EXPECT_NE(why.find("failed its health check: --check_gpus: GPU 4095"), std::string::npos) << why;
  if (has_driver) {
    EXPECT_NE(why.find("is not there or does not answer: nvidia-smi"), std::string::npos) << why;
    const auto [present, present_report] = run("0");
    EXPECT_EQ(present.exit_code, 0) << present.err;
    EXPECT_NE(present.out.find("line"), std::string::npos) << present.out;
  } else {
    EXPECT_NE(why.find("cannot run nvidia-smi to ask it"), std::string::npos) << why;
  }
}

TEST(NodeCheckTest, AnInterfaceMustBeThereAndUp) {
  TempDir net;
  const auto iface = [&](const std::string& name, const std::string& state, const std::string& flags) {
    fs::create_directories(net.path / name);
    std::ofstream(net.path / name / "operstate") << state << "\n";
    std::ofstream(net.path / name / "flags") << flags << "\n";
  };
  iface("eth0", "up", "0x1003");
  iface("lo", "unknown", "0x9");
  iface("ib0", "down", "0x1002");
  iface("tun0", "unknown", "0x1090");
  EXPECT_FALSE(agent::check_interface("eth0", net.str()));
  EXPECT_FALSE(agent::check_interface("lo", net.str()));
  EXPECT_EQ(agent::check_interface("ib0", net.str()), "--check_interface: network interface ib0 is down");
  EXPECT_EQ(agent::check_interface("tun0", net.str()), "--check_interface: network interface tun0 is unknown");
  EXPECT_EQ(agent::check_interface("eth9", net.str()), "--check_interface: this host has no network interface eth9");
  EXPECT_FALSE(agent::check_interface("lo")) << "this host's loopback is up";
}

}  // namespace
}  // namespace ddprun::test
