// The Agent (launcher/agent) on its own, in this process: a job of one node, real worker processes
// (/bin/sh), the options as the command line gives them. What is checked is what the agent decides
// and records (its exit code and the job's report), never the console's sentences: restarts after a
// failure until the workers succeed or the restarts run out, the root cause and the workers stopped
// for it, a stop signal in the Running state, a hang restarted, and the env contract each worker gets.
#include "launcher/agent/agent.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <thread>

#include "common/system.hpp"
#include "launcher/agent/status_server.hpp"
#include "launcher/agent/job_report.hpp"
#include "tests/support/files.hpp"
#include "tests/support/raw_socket.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/wait_until.hpp"

namespace ddprun::launcher {

using agent::Agent;
using agent::JobReport;
using cli::HostFacts;
using cli::LaunchOptions;
using cli::parse_options;
using test::read_file;
using test::TempDir;
using test::wait_until;
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

// ddprun's options for `args` (without argv[0]), with no DDPRUN_*/PET_* variables in the way.
LaunchOptions options(const std::vector<std::string>& args) {
  return parse_options(
      args, [](const std::string&) { return std::optional<std::string>{}; }, HostFacts{2, 0});
}

// Runs the agent for `args` to the end: its exit code and the job's report.
struct Ran {
  int exit_code = -1;
  json report;
};
Ran run(const std::vector<std::string>& args) {
  const LaunchOptions o = options(args);
  JobReport report(o, "host-a", "", /*multi_node=*/false);
  Ran r;
  {
    Agent agent(o, report);
    r.exit_code = agent.run();
  }
  r.report = report.to_json();
  return r;
}

std::vector<std::string> sh(std::vector<std::string> flags, const std::string& script) {
  flags.insert(flags.end(), {"/bin/sh", "-c", script});
  return flags;
}

std::vector<std::string> states(const json& attempt) {
  std::vector<std::string> out;
  for (const auto& w : attempt["workers"]) out.push_back(w["state"].get<std::string>());
  return out;
}

TEST(AgentTest, EachWorkerGetsItsPlaceInTheJobAndASucceededGroupEndsTheJob) {
  TempDir dir;
  const Ran r = run(sh({"--nproc_per_node", "2", "--run_id", "unit"},
                       "echo \"$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR "
                       "$TORCHELASTIC_RUN_ID $TORCHELASTIC_RESTART_COUNT\" > " +
                           dir.str() + "/$RANK"));
  ASSERT_EQ(r.exit_code, 0) << r.report.dump(2);
  EXPECT_EQ(r.report["outcome"], "succeeded");
  EXPECT_EQ(r.report["restarts"], 0);
  ASSERT_EQ(r.report["attempts"].size(), 1u);
  EXPECT_EQ(states(r.report["attempts"][0]), (std::vector<std::string>{"succeeded", "succeeded"}));
  const int port = r.report["attempts"][0]["master_port"];
  EXPECT_GT(port, 0) << "the worker store's port";
  for (int rank = 0; rank < 2; ++rank) {
    const std::string r_ = std::to_string(rank);
    EXPECT_EQ(read_file(dir.path / r_),
              r_ + " " + r_ + " 2 2 0 " + r.report["attempts"][0]["master_addr"].get<std::string>() + " unit 0\n");
  }
}

TEST(AgentTest, AFailedRoundIsRestartedUntilTheWorkersSucceed) {
  // Both ranks fail on restarts 0 and 1, then succeed: 2 of the 3 restarts allowed are used.
  const Ran r =
      run(sh({"--nproc_per_node", "2", "--max_restarts", "3"}, "test \"$TORCHELASTIC_RESTART_COUNT\" -ge 2 || exit 5"));
  ASSERT_EQ(r.exit_code, 0) << r.report.dump(2);
  EXPECT_EQ(r.report["outcome"], "succeeded");
  EXPECT_EQ(r.report["restarts"], 2);
  const auto& attempts = r.report["attempts"];
  ASSERT_EQ(attempts.size(), 3u) << r.report.dump(2);
  for (int a = 0; a < 3; ++a) {
    EXPECT_EQ(attempts[a]["restart"], a);
    EXPECT_EQ(attempts[a]["outcome"], a < 2 ? "failed" : "succeeded") << attempts[a].dump(2);
  }
  EXPECT_TRUE(r.report["root_cause"].is_null()) << "a job that succeeded has no root cause";
}

TEST(AgentTest, WhenTheRestartsRunOutTheJobEndsWithTheFirstFailureAndTheOthersStopped) {
  // Rank 1 fails at once on every attempt; rank 0 would run for a minute and is stopped each time.
  const Ran r = run(sh({"--nproc_per_node", "2", "--max_restarts", "1", "--shutdown_timeout", "5"},
                       "if [ \"$RANK\" = 1 ]; then exit 9; fi; exec sleep 60"));
  EXPECT_EQ(r.exit_code, 9) << r.report.dump(2);
  EXPECT_EQ(r.report["outcome"], "failed");
  EXPECT_EQ(r.report["exit_code"], 9);
  EXPECT_EQ(r.report["restarts"], 1);
  ASSERT_EQ(r.report["attempts"].size(), 2u) << r.report.dump(2);
  for (const auto& a : r.report["attempts"]) {
    EXPECT_EQ(a["outcome"], "failed");
    EXPECT_EQ(states(a), (std::vector<std::string>{"stopped", "failed"})) << a.dump(2);
  }
  const auto& root = r.report["root_cause"];
  EXPECT_EQ(root["rank"], 1) << root.dump(2);
  EXPECT_EQ(root["exit_code"], 9);
}

TEST(AgentTest, AStopSignalWhileRunningStopsEveryWorkerAndIsNotRestarted) {
  TempDir dir;
  std::thread signaller([&] {
    // Once both workers run, this process (the agent) gets SIGTERM as from `kill` or a scheduler.
    if (wait_until([&] { return fs::exists(dir.path / "0") && fs::exists(dir.path / "1"); }, 30s)) {
      ::kill(::getpid(), SIGTERM);
    }
  });
  const Ran r = run(sh({"--nproc_per_node", "2", "--max_restarts", "3", "--shutdown_timeout", "5"},
                       "touch " + dir.str() + "/$RANK; exec sleep 60"));
  signaller.join();
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.report.dump(2);
  EXPECT_EQ(r.report["outcome"], "signalled");
  EXPECT_EQ(r.report["restarts"], 0) << "a stop signal is never restarted";
  ASSERT_EQ(r.report["attempts"].size(), 1u) << r.report.dump(2);
  EXPECT_EQ(states(r.report["attempts"][0]), (std::vector<std::string>{"stopped", "stopped"}));
}

TEST(AgentTest, AHungRoundIsDiagnosedAndRestarted) {
  // Restart 0 sleeps without progress past --hang_timeout (a hang); restart 1 succeeds. The run
  // directory (kept for the hang's stacks) goes under a temporary --log_dir.
  TempDir logs;
  const Ran r = run(sh({"--nproc_per_node", "2", "--hang_timeout", "2", "--max_restarts", "1", "--shutdown_timeout",
                        "5", "--log_dir", logs.str()},
                       "test \"$TORCHELASTIC_RESTART_COUNT\" -ge 1 && exit 0; exec sleep 60"));
  EXPECT_EQ(r.exit_code, 0) << r.report.dump(2);
  EXPECT_EQ(r.report["outcome"], "succeeded");
  EXPECT_EQ(r.report["restarts"], 1);
  ASSERT_EQ(r.report["attempts"].size(), 2u) << r.report.dump(2);
  EXPECT_EQ(r.report["attempts"][0]["outcome"], "hung") << r.report.dump(2);
  EXPECT_EQ(r.report["attempts"][1]["outcome"], "succeeded");
}

TEST(AgentTest, AHangWithNoRestartLeftEndsWithTheHangExitCodeAndItsDiagnosis) {
  TempDir logs;
  const Ran r =
      run(sh({"--nproc_per_node", "1", "--hang_timeout", "2", "--shutdown_timeout", "5", "--log_dir", logs.str()},
             "exec sleep 60"));
  EXPECT_EQ(r.exit_code, agent::kHangExitCode) << r.report.dump(2);
  EXPECT_EQ(r.report["outcome"], "hung");
  ASSERT_TRUE(r.report["hang"].is_object()) << r.report.dump(2);
  EXPECT_FALSE(r.report["hang"]["summary"].get<std::string>().empty()) << r.report["hang"].dump(2);
}

// TORCHELASTIC_HEALTH_CHECK_PORT: 200 while the job joins, runs and restarts; 503 with the reason
// once it hangs or ends; HEAD and any path answer the same, other methods are refused.
std::string http(uint16_t port, const std::string& request) {
  test::RawSocket s(port);
  EXPECT_TRUE(s.send(request));
  std::string reply;
  EXPECT_TRUE(s.read_until_eof(&reply));
  return reply;
}

TEST(StatusServerTest, AnswersOkUntilAHangOrTheEndThen503WithTheReason) {
  agent::StatusServer health(0);
  const std::string get = "GET /healthz HTTP/1.1\r\nHost: probe\r\n\r\n";
  std::string r = http(health.port(), get);
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("ok: rendezvous, starting"), std::string::npos) << r;
  health.set(agent::StatusServer::Phase::Running, "8 workers, round 0 (restart 0)");
  r = http(health.port(), get);
  EXPECT_NE(r.find("ok: running, 8 workers, round 0 (restart 0), for 0 s"), std::string::npos) << r;
  // A failure's stop is no reason for a probe to restart the pod: the job restarts its workers.
  health.set(agent::StatusServer::Phase::Stopping, "rank 1 failed with exit code 3: stopping the other workers");
  r = http(health.port(), get);
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("ok: stopping, rank 1 failed with exit code 3"), std::string::npos) << r;
  health.set(agent::StatusServer::Phase::Hung, "no rank made progress for 300 s; behind: rank 3");
  health.set(agent::StatusServer::Phase::Running, "8 workers");  // a hang stands until the round ends
  health.set(agent::StatusServer::Phase::Stopping, "the job hung: stopping this node's workers");
  r = http(health.port(), get);
  EXPECT_EQ(r.rfind("HTTP/1.1 503 Service Unavailable\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("hung: no rank made progress for 300 s; behind: rank 3"), std::string::npos) << r;
  health.set(agent::StatusServer::Phase::Restarting, "round 1");
  EXPECT_EQ(http(health.port(), get).rfind("HTTP/1.1 200", 0), 0u);
  health.set(agent::StatusServer::Phase::Ending, "exit code 1");
  r = http(health.port(), "HEAD / HTTP/1.1\r\nHost: probe\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 503", 0), 0u) << r;
  EXPECT_EQ(r.find("ending:"), std::string::npos) << "HEAD has no body: " << r;
  r = http(health.port(), "POST / HTTP/1.1\r\nHost: probe\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 405", 0), 0u) << r;
}

// The body of a reply, after its header.
std::string body_of(const std::string& reply) {
  const auto at = reply.find("\r\n\r\n");
  return at == std::string::npos ? "" : reply.substr(at + 4);
}

TEST(StatusServerTest, SaysThePhaseAndRoundAsJsonForPrograms) {
  agent::StatusServer health(0);
  const std::string get = "GET /healthz?format=json HTTP/1.1\r\nHost: probe\r\n\r\n";
  std::string r = http(health.port(), get);
  EXPECT_NE(r.find("Content-Type: application/json"), std::string::npos) << r;
  json j = json::parse(body_of(r));
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["phase"], "rendezvous");
  EXPECT_EQ(j["round"], -1) << "no round before the first";
  health.set(agent::StatusServer::Phase::Connecting, "to the rendezvous");
  EXPECT_EQ(json::parse(body_of(http(health.port(), get)))["phase"], "connecting");
  health.set(agent::StatusServer::Phase::Joined, "as node_rank 1 of 2; waiting for the other nodes", 3);
  j = json::parse(body_of(http(health.port(), get)));
  EXPECT_EQ(j["phase"], "joined");
  EXPECT_EQ(j["round"], 3);
  EXPECT_EQ(j["detail"], "as node_rank 1 of 2; waiting for the other nodes");
  health.set(agent::StatusServer::Phase::Finishing, "this node's workers all finished");
  j = json::parse(body_of(http(health.port(), get)));
  EXPECT_EQ(j["phase"], "finishing");
  EXPECT_EQ(j["round"], 3) << "a phase without a round keeps the last one";
  health.set(agent::StatusServer::Phase::Hung, "no rank made progress for 300 s");
  health.set(agent::StatusServer::Phase::Finishing, "this node's workers all finished");  // the hang stands
  r = http(health.port(), get);
  EXPECT_EQ(r.rfind("HTTP/1.1 503", 0), 0u) << r;
  j = json::parse(body_of(r));
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["phase"], "hung");
  // The text form names the phase the same way.
  health.set(agent::StatusServer::Phase::Ending, "exit code 0");
  EXPECT_NE(http(health.port(), "GET / HTTP/1.1\r\nHost: probe\r\n\r\n").find("ending: exit code 0, for 0 s"),
            std::string::npos);
}

}  // namespace
}  // namespace ddprun::launcher
