// The ddprun binary driving real worker processes (tests/launcher/test_worker.cpp); DDPRUN_TEST_DDPRUN_BIN
// runs them against another build.
#include <signal.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/support/ddprun_bin.hpp"
#include "tests/support/report.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/wait_until.hpp"

namespace ddprun::test {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::map<std::string, std::string> read_env_file(const fs::path& p) {
  std::map<std::string, std::string> env;
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

TEST(LauncherTest, SuccessfulJobExportsEnvAndPrefixesOutput) {
  TempDir dir;
  Subprocess p(
      ddprun({"--nproc_per_node", "3", "--run_id", "envtest", TEST_WORKER_BIN, "env", dir.str(), "print", "2"}));
  const Finished f = p.wait(60s);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  for (int r = 0; r < 3; ++r) {
    auto env = read_env_file(dir.path / ("env." + std::to_string(r)));
    EXPECT_EQ(env["RANK"], std::to_string(r));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(r));
    EXPECT_EQ(env["WORLD_SIZE"], "3");
    EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "envtest");
    EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
    EXPECT_NE(env["MASTER_PORT"], "");
    EXPECT_NE(f.out.find("[rank" + std::to_string(r) + "]: out line 1\n"), std::string::npos) << f.out;
    EXPECT_NE(f.err.find("[rank" + std::to_string(r) + "]: err line 0\n"), std::string::npos) << f.err;
  }
  EXPECT_NE(f.err.find("setting it to 1"), std::string::npos);
}

TEST(LauncherTest, FirstFailureStopsTheGroupAndSetsExitCode) {
  Subprocess p(ddprun(
      {"--nproc_per_node", "3", "--shutdown_timeout", "5", TEST_WORKER_BIN, "exit-if-rank", "2", "7", "sleep", "60"}));
  const Finished f = p.wait(60s);
  EXPECT_EQ(f.exit_code, 7) << f.err;
  EXPECT_NE(f.err.find("Root cause (first failure):\n  rank       : 2 (local_rank 2)"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("exit       : exit code 7"), std::string::npos);
  EXPECT_NE(f.err.find("| rank 2 exiting with 7"), std::string::npos);
  EXPECT_NE(f.err.find("Stopped by ddprun after the failure: ranks 0,1"), std::string::npos);
}

TEST(LauncherTest, WorkerKilledBySignalGives128PlusSignal) {
  Reports reports;
  Subprocess p(ddprun(reports.flags(0, {"--nproc_per_node", "1", "/bin/sh", "-c", "kill -9 $$"})));
  const Finished f = p.wait(30s);
  EXPECT_EQ(f.exit_code, 137) << f.err;
  const auto root = reports.of(0)["root_cause"];
  ASSERT_TRUE(root.is_object()) << f.err;
  EXPECT_EQ(root["rank"], 0);
  EXPECT_EQ(root["signal"], SIGKILL) << root.dump(2);
  EXPECT_EQ(root["signal_name"], "SIGKILL");
  EXPECT_TRUE(root["exit_code"].is_null()) << "a signal ended it, not an exit";
}

TEST(LauncherTest, ErrorFileContentsAppearInTheReport) {
  Subprocess p(ddprun({"--nproc_per_node", "1", TEST_WORKER_BIN, "error-file", "loss is NaN"}));
  const Finished f = p.wait(30s);
  EXPECT_EQ(f.exit_code, 1);
  EXPECT_NE(f.err.find("error      : RuntimeError: loss is NaN"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("Traceback: train.py line 42"), std::string::npos) << f.err;
}

TEST(LauncherTest, RestartsWithIncrementedRestartCountAndFreshStore) {
  TempDir dir;
  Reports reports;
  Subprocess p(ddprun(reports.flags(0, {"--nproc_per_node", "2", "--max_restarts", "3", TEST_WORKER_BIN,
                                        "exit-if-attempt-below", "2", "5", "store-barrier", "env", dir.str()})));
  const Finished f = p.wait(60s);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  // Two failed attempts, each restarted, then one that succeeds: restarts 2 of the 3 allowed.
  const auto r = reports.of(0);
  ASSERT_TRUE(r.is_object()) << f.err;
  EXPECT_EQ(r["outcome"], "succeeded");
  EXPECT_EQ(r["restarts"], 2);
  EXPECT_EQ(r["max_restarts"], 3);
  ASSERT_EQ(r["attempts"].size(), 3u) << r.dump(2);
  for (int a = 0; a < 3; ++a) {
    EXPECT_EQ(r["attempts"][a]["restart"], a) << r.dump(2);
    EXPECT_EQ(r["attempts"][a]["outcome"], a < 2 ? "failed" : "succeeded") << r.dump(2);
  }
  auto env = read_env_file(dir.path / "env.1");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "2");
  EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "3");
}

TEST(LauncherTest, GivesUpAfterMaxRestarts) {
  Reports reports;
  Subprocess p(ddprun(
      reports.flags(0, {"--nproc_per_node", "1", "--max_restarts", "1", TEST_WORKER_BIN, "exit-if-rank", "0", "4"})));
  const Finished f = p.wait(30s);
  EXPECT_EQ(f.exit_code, 4);
  const auto r = reports.of(0);
  ASSERT_TRUE(r.is_object()) << f.err;
  EXPECT_EQ(r["outcome"], "failed");
  EXPECT_EQ(r["exit_code"], 4);
  EXPECT_EQ(r["restarts"], 1);
  ASSERT_EQ(r["attempts"].size(), 2u) << "the first attempt and its one restart, then no more: " << r.dump(2);
  EXPECT_EQ(r["attempts"][1]["outcome"], "failed");
  EXPECT_EQ(r["root_cause"]["exit_code"], 4);
}

TEST(LauncherTest, ForwardsUsr1WithoutStoppingAndTermStops) {
  Subprocess usr(ddprun(
      {"--nproc_per_node", "2", "--signals_to_handle", "SIGTERM,SIGINT,SIGUSR1", TEST_WORKER_BIN, "wait-signal"}));
  ASSERT_TRUE(usr.wait_for_output("[rank1]: ready", 30s));
  ASSERT_TRUE(usr.wait_for_output("[rank0]: ready", 30s));
  usr.signal(SIGUSR1);
  Finished f = usr.wait(30s);
  EXPECT_EQ(f.exit_code, 0) << f.err;
  EXPECT_NE(f.out.find("[rank0]: got SIGUSR1"), std::string::npos);
  EXPECT_NE(f.out.find("[rank1]: got SIGUSR1"), std::string::npos);

  Subprocess term(ddprun({"--nproc_per_node", "2", TEST_WORKER_BIN, "wait-signal"}));
  ASSERT_TRUE(term.wait_for_output("[rank1]: ready", 30s));
  ASSERT_TRUE(term.wait_for_output("[rank0]: ready", 30s));
  term.signal(SIGTERM);
  f = term.wait(30s);
  EXPECT_EQ(f.exit_code, 128 + SIGTERM) << f.err;
  EXPECT_NE(f.out.find("[rank0]: got SIGTERM"), std::string::npos);
}

TEST(LauncherTest, SecondSigintKillsAtOnce) {
  // The workers ignore SIGINT, so only the second Ctrl-C's SIGKILL ends them before the 60s grace.
  Subprocess p(ddprun({"--nproc_per_node", "2", "--shutdown_timeout", "60", "/bin/sh", "-c",
                       "trap '' INT; echo ready; while :; do sleep 1; done"}));
  ASSERT_TRUE(p.wait_for_output("[rank1]: ready", 30s));
  ASSERT_TRUE(p.wait_for_output("[rank0]: ready", 30s));
  p.signal(SIGINT);
  ASSERT_TRUE(p.wait_for_output("Ctrl-C again", 10s));
  p.signal(SIGINT);
  const Finished f = p.wait(20s);
  EXPECT_FALSE(f.timed_out);
  EXPECT_EQ(f.exit_code, 128 + SIGINT) << f.err;
  EXPECT_NE(f.err.find("second SIGINT: killing every worker now"), std::string::npos);
}

TEST(LauncherTest, SigkillOfDdprunLeavesNoWorkerOrGrandchild) {
  TempDir dir;
  Subprocess p(ddprun({"--nproc_per_node", "2", TEST_WORKER_BIN, "grandchild", dir.str(), "sleep", "120"}));
  std::vector<pid_t> pids;
  ASSERT_TRUE(wait_until(
      [&] {
        pids.clear();
        for (int r = 0; r < 2; ++r) {
          std::ifstream in(dir.path / ("pids." + std::to_string(r)));
          pid_t a = 0, b = 0;
          if (!(in >> a >> b)) return false;
          pids.push_back(a);
          pids.push_back(b);
        }
        return true;
      },
      30s));
  for (pid_t pid : pids) EXPECT_FALSE(process_gone(pid)) << pid;
  p.signal(SIGKILL);
  p.wait(10s);
  EXPECT_TRUE(wait_until([&] { return std::all_of(pids.begin(), pids.end(), process_gone); }, 10s))
      << "workers or grandchildren outlived ddprun";
}

std::vector<fs::path> run_directories(const fs::path& parent) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(parent)) {
    if (e.path().filename().string().rfind("ddprun_", 0) == 0) out.push_back(e.path());
  }
  return out;
}

TEST(LauncherTest, TheNextDdprunRemovesTheRunDirectoryOfASigkilledOneButNotALiveOnes) {
  TempDir tmp;
  const std::map<std::string, std::string> env{{"TMPDIR", tmp.str()}};
  // Two jobs under the same TMPDIR: one is killed, the other goes on.
  Subprocess killed(ddprun({"--nproc_per_node", "1", TEST_WORKER_BIN, "sleep", "120"}), env);
  ASSERT_TRUE(wait_until([&] { return run_directories(tmp.path).size() == 1; }, 30s));
  const fs::path killed_dir = run_directories(tmp.path).front();
  Subprocess alive(ddprun({"--nproc_per_node", "1", TEST_WORKER_BIN, "sleep", "120"}), env);
  ASSERT_TRUE(wait_until([&] { return run_directories(tmp.path).size() == 2; }, 30s));
  killed.signal(SIGKILL);
  killed.wait(10s);
  ASSERT_TRUE(fs::exists(killed_dir)) << "a SIGKILLed ddprun cannot remove its own run directory";

  Subprocess next(ddprun({"--nproc_per_node", "1", TEST_WORKER_BIN, "exit-if-rank", "5", "0"}), env);
  const Finished f = next.wait(60s);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_FALSE(fs::exists(killed_dir)) << f.err;
  EXPECT_NE(f.err.find("removed 1 run directory"), std::string::npos) << f.err;
  const auto left = run_directories(tmp.path);
  ASSERT_EQ(left.size(), 1u) << "the live job's directory must stay";
  EXPECT_NE(left.front(), killed_dir);

  alive.signal(SIGTERM);
  alive.wait(30s);
  EXPECT_TRUE(wait_until([&] { return run_directories(tmp.path).empty(); }, 10s))
      << "a ddprun that ends normally removes its own";
}

TEST(LauncherTest, GrandchildrenDieWithTheirWorker) {
  TempDir dir;
  Subprocess p(ddprun({"--nproc_per_node", "1", TEST_WORKER_BIN, "grandchild", dir.str()}));
  const Finished f = p.wait(30s);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  std::ifstream in(dir.path / "pids.0");
  pid_t worker = 0, grandchild = 0;
  ASSERT_TRUE(in >> worker >> grandchild);
  EXPECT_TRUE(wait_until([&] { return process_gone(grandchild); }, 10s));
}

TEST(LauncherTest, TwoJobsStartedTogetherWithoutMasterPortNeverCollide) {
  std::vector<std::unique_ptr<Subprocess>> jobs;
  for (int j = 0; j < 4; ++j) {
    jobs.push_back(std::make_unique<Subprocess>(ddprun({"--nproc_per_node", "2", TEST_WORKER_BIN, "store-barrier"})));
  }
  std::set<std::string> ports;
  for (auto& job : jobs) {
    const Finished f = job->wait(60s);
    EXPECT_EQ(f.exit_code, 0) << f.err;
    const std::string port = logged_value(f.err, "MASTER_PORT=");
    ASSERT_FALSE(port.empty());
    ports.insert(port);
  }
  EXPECT_EQ(ports.size(), 4u);
}

TEST(LauncherTest, RedirectsAndTeeWritePerRankLogFiles) {
  TempDir dir;
  Subprocess p(ddprun({"--nproc_per_node", "2", "--log_dir", dir.str(), "--run_id", "logs", "--redirects", "3", "--tee",
                       "0:1", TEST_WORKER_BIN, "print", "3"}));
  const Finished f = p.wait(30s);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  std::vector<fs::path> runs;
  for (auto& e : fs::directory_iterator(dir.path)) runs.push_back(e.path());
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].filename().string().rfind("logs_", 0), 0u);
  for (int r = 0; r < 2; ++r) {
    const fs::path rank_dir = runs[0] / "attempt_0" / std::to_string(r);
    std::ifstream out(rank_dir / "stdout.log"), err(rank_dir / "stderr.log");
    std::stringstream o, e;
    o << out.rdbuf();
    e << err.rdbuf();
    EXPECT_EQ(o.str(), "out line 0\nout line 1\nout line 2\n");
    EXPECT_EQ(e.str(), "err line 0\nerr line 1\nerr line 2\n");
  }
  // Rank 0's stdout is tee'd; everything else is only in the files.
  EXPECT_NE(f.out.find("[rank0]: out line 2"), std::string::npos);
  EXPECT_EQ(f.out.find("[rank1]: out line"), std::string::npos);
  EXPECT_EQ(f.err.find("err line"), std::string::npos);
}

TEST(LauncherTest, LocalRanksFilterLimitsTheConsole) {
  Subprocess p(ddprun({"--nproc_per_node", "3", "--local_ranks_filter", "1", TEST_WORKER_BIN, "print", "1"}));
  const Finished f = p.wait(30s);
  ASSERT_EQ(f.exit_code, 0);
  EXPECT_NE(f.out.find("[rank1]: out line 0"), std::string::npos);
  EXPECT_EQ(f.out.find("[rank0]"), std::string::npos);
  EXPECT_EQ(f.out.find("[rank2]"), std::string::npos);
}

TEST(LauncherTest, BadFlagsFailBeforeAnythingStarts) {
  TempDir dir;
  Subprocess p(ddprun({"--nproc_per_node", "two", TEST_WORKER_BIN, "env", dir.str()}));
  const Finished f = p.wait(10s);
  EXPECT_EQ(f.exit_code, 2);
  EXPECT_EQ(f.err,
            "ddprun: --nproc_per_node: expected a positive number, 'auto', 'cpu', 'gpu', 'cuda' or 'xpu', got 'two'\n");
  EXPECT_TRUE(fs::is_empty(dir.path));
  // A program that cannot be run is its rank's failure: the report says why, the code is 127.
  Subprocess missing(ddprun({"/nonexistent/train"}));
  const Finished m = missing.wait(10s);
  EXPECT_EQ(m.exit_code, 127);
  EXPECT_NE(m.err.find("could not be started: cannot run '/nonexistent/train': No such file or directory"),
            std::string::npos)
      << m.err;
}

TEST(LauncherTest, LocalRankMacroIsSubstitutedInArguments) {
  Subprocess p(ddprun({"--nproc_per_node", "2", "/bin/echo", "dev=cuda:${local_rank}"}));
  const Finished f = p.wait(10s);
  ASSERT_EQ(f.exit_code, 0);
  EXPECT_NE(f.out.find("[rank1]: dev=cuda:1"), std::string::npos);
  EXPECT_NE(f.out.find("[rank0]: dev=cuda:0"), std::string::npos);
}

// A script written for torch.distributed.launch: it reads --local_rank from argv (required).
TEST(LauncherTest, LocalRankArgRunsATorchDistributedLaunchScriptUnchanged) {
  TempDir dir;
  const std::string script = (dir.path / "train.py").string();
  {
    std::ofstream(script) << "import argparse, os, sys\n"
                             "p = argparse.ArgumentParser()\n"
                             "p.add_argument('--local_rank', type=int, required=True)\n"
                             "p.add_argument('--epochs', type=int, default=1)\n"
                             "a = p.parse_args()\n"
                             "print(f'argv1={sys.argv[1]} local_rank={a.local_rank} env={os.environ[\"LOCAL_RANK\"]} "
                             "epochs={a.epochs}')\n";
  }
  Subprocess p(ddprun({"--nproc_per_node", "2", "--local_rank_arg", script, "--epochs", "3"}));
  const Finished f = p.wait(60s);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  for (int r = 0; r < 2; ++r) {
    const std::string lr = std::to_string(r);
    EXPECT_NE(
        f.out.find("[rank" + lr + "]: argv1=--local_rank=" + lr + " local_rank=" + lr + " env=" + lr + " epochs=3"),
        std::string::npos)
        << f.out;
  }
  // The same script without the flag: argparse refuses it (exit code 2), as it would under torchrun.
  Subprocess q(ddprun({"--nproc_per_node", "1", script, "--epochs", "3"}));
  const Finished g = q.wait(60s);
  EXPECT_EQ(g.exit_code, 2) << g.err;
  EXPECT_NE(g.err.find("--local_rank"), std::string::npos) << g.err;
}

// A script written for torch.distributed.launch 2.x: argparse knows only --local-rank (dash).
TEST(LauncherTest, LocalRankArgDashRunsATorch2LaunchScriptUnchanged) {
  TempDir dir;
  const std::string script = (dir.path / "train.py").string();
  std::ofstream(script) << "import argparse, os, sys\n"
                           "p = argparse.ArgumentParser()\n"
                           "p.add_argument('--local-rank', type=int, required=True)\n"
                           "a, rest = p.parse_known_args()\n"
                           "assert not rest, rest\n"
                           "print(f'argv1={sys.argv[1]} local_rank={a.local_rank} env={os.environ[\"LOCAL_RANK\"]}')\n";
  Subprocess p(ddprun({"--nproc_per_node", "2", "--local_rank_arg=dash", script}));
  const Finished f = p.wait(60s);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  for (int r = 0; r < 2; ++r) {
    const std::string lr = std::to_string(r);
    EXPECT_NE(f.out.find("[rank" + lr + "]: argv1=--local-rank=" + lr + " local_rank=" + lr + " env=" + lr),
              std::string::npos)
        << f.out;
  }
  // The 1.x spelling is not what this script reads: argparse refuses it (exit code 2).
  Subprocess q(ddprun({"--nproc_per_node", "1", "--local_rank_arg", script}));
  const Finished g = q.wait(60s);
  EXPECT_EQ(g.exit_code, 2) << g.err;
}

}  // namespace
}  // namespace ddprun::test
