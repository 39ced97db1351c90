// JobReport, the --report_file document, as a unit: what the agent records turns into the schema
// docs/guide.md documents; the file is replaced whole, and a file that cannot be written is a warning.
#include "launcher/agent/job_report.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/support/temp_dir.hpp"

namespace ddprun::launcher {

using agent::expand_report_path;
using agent::JobReport;
using cli::LaunchOptions;
using rendezvous::RoundEnd;
using rendezvous::World;
using workers::GroupOutcome;
using workers::GroupResult;
using workers::WorkerExit;
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// A round ended by a hang that node `root_node` diagnosed, with `report`.
RoundEnd hang_end(int root_node, const std::string& report) {
  RoundEnd hang;
  hang.kind = RoundEnd::Kind::Hang;
  hang.root_node = root_node;
  hang.detail = "no rank made progress for 5s";
  hang.report = report;
  return hang;
}

WorkerExit worker_end(int rank, int exit_code, int signal = 0) {
  WorkerExit e;
  e.rank = rank;
  e.local_rank = rank;
  e.host = "h1";
  e.node_rank = 0;
  e.pid = 1000 + rank;
  e.exit_code = exit_code;
  e.signal = signal;
  e.time = std::chrono::system_clock::now();
  return e;
}

World one_node(int round, int port) {
  World w;
  w.round = round;
  w.world_size = 2;
  w.master_addr = "127.0.0.1";
  w.master_port = port;
  return w;
}

LaunchOptions options() {
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.max_restarts = 1;
  o.run_id = "job7";
  o.program = "train.py";
  o.program_args = {"--lr", "0.1"};
  return o;
}

// The report of options() on host h1, its first round started with node 0's workers (pids from 4000).
struct StartedReport {
  explicit StartedReport(bool multi_node) : report(o, "h1", "", multi_node) {
    report.rendezvous_began(0, 0);
    report.group_started(one_node(0, 4000));
  }
  const LaunchOptions o = options();
  JobReport report;
};

TEST(JobReportTest, AHangThenASuccessIsTwoAttemptsAndTheJobSucceeded) {
  StartedReport started(false);
  JobReport& report = started.report;
  const RoundEnd hang = hang_end(0, "HUNG: ...");
  GroupResult stopped;
  stopped.outcome = GroupOutcome::StoppedByRequest;
  stopped.exits = {worker_end(1, 0, 15), worker_end(0, 0, 15)};
  stopped.stopped_ranks = {0, 1};
  report.round_ended(hang, stopped);
  report.rendezvous_began(1, 1);
  report.group_started(one_node(1, 4001));
  GroupResult ok;
  ok.exits = {worker_end(0, 0), worker_end(1, 0)};
  RoundEnd success;
  report.round_ended(success, ok);
  report.finish(&success, 0);

  const json j = report.to_json();
  EXPECT_EQ(j["schema"], "ddprun-report/1");
  EXPECT_EQ(j["job_id"], "job7");
  EXPECT_EQ(j["args"], json({"--lr", "0.1"}));
  EXPECT_EQ(j["outcome"], "succeeded");
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_EQ(j["restarts"], 1);
  EXPECT_TRUE(j["hang"].is_null());  // the job's end was no hang
  ASSERT_EQ(j["attempts"].size(), 2u);
  const json& first = j["attempts"][0];
  EXPECT_EQ(first["outcome"], "hung");
  EXPECT_EQ(first["message"], "no rank made progress for 5s");
  EXPECT_EQ(first["master_port"], 4000);
  ASSERT_EQ(first["workers"].size(), 2u);
  EXPECT_EQ(first["workers"][0]["rank"], 0);  // in rank order, whatever order they ended in
  EXPECT_EQ(first["workers"][0]["state"], "stopped");
  EXPECT_EQ(first["workers"][0]["signal_name"], "SIGTERM");
  EXPECT_TRUE(first["workers"][0]["exit_code"].is_null());
  EXPECT_EQ(j["attempts"][1]["workers"][1]["state"], "succeeded");
  EXPECT_EQ(j["attempts"][1]["ranks"], json({0, 1}));
  EXPECT_GE(j["attempts"][1]["rendezvous_s"].get<double>(), 0.0);
}

// The document as it stands, as the job page shows it: a failure is the root cause from the moment
// the workers are being stopped for it, through the restart and the next round, until the job's
// own end says otherwise.
TEST(JobReportTest, TheDocumentAsItStandsNamesTheLatestFailureBeforeTheJobEnds) {
  StartedReport started(false);
  JobReport& report = started.report;
  EXPECT_TRUE(report.to_json()["root_cause"].is_null());
  report.group_failing({worker_end(1, 3), worker_end(0, 1)});
  json j = report.to_json();
  EXPECT_TRUE(j["outcome"].is_null());
  ASSERT_TRUE(j["root_cause"].is_object()) << j.dump(2);
  EXPECT_EQ(j["root_cause"]["rank"], 1);
  EXPECT_EQ(j["root_cause"]["exit_code"], 3);
  ASSERT_EQ(j["other_failures"].size(), 1u);
  EXPECT_EQ(j["other_failures"][0]["rank"], 0);

  // The round's end, agreed: its root cause. Then the next round runs: still the latest failure.
  RoundEnd failed;
  failed.kind = RoundEnd::Kind::Failure;
  failed.root_cause = worker_end(1, 3);
  GroupResult result;
  result.outcome = GroupOutcome::Failed;
  result.failures = {worker_end(1, 3)};
  result.exits = {worker_end(0, 0, 9), worker_end(1, 3)};
  result.stopped_ranks = {0};
  report.round_ended(failed, result);
  report.rendezvous_began(1, 1);
  report.group_started(one_node(1, 4001));
  j = report.to_json();
  ASSERT_TRUE(j["root_cause"].is_object()) << j.dump(2);
  EXPECT_EQ(j["root_cause"]["rank"], 1);

  // The job's end decides: a success after the restart has no root cause.
  RoundEnd success;
  GroupResult ok;
  ok.exits = {worker_end(0, 0), worker_end(1, 0)};
  report.round_ended(success, ok);
  report.finish(&success, 0);
  j = report.to_json();
  EXPECT_EQ(j["outcome"], "succeeded");
  EXPECT_TRUE(j["root_cause"].is_null()) << j.dump(2);
}

TEST(JobReportTest, AHangThatEndsTheJobCarriesTheDiagnosis) {
  StartedReport started(true);
  JobReport& report = started.report;
  const RoundEnd hang = hang_end(1, "HUNG: behind: rank 1");
  report.round_ended(hang, GroupResult{});
  report.set_hang_report_file("/logs/attempt_0/hang_report.txt");
  report.finish(&hang, 124);
  const json j = report.to_json();
  EXPECT_EQ(j["outcome"], "hung");
  EXPECT_EQ(j["exit_code"], 124);
  EXPECT_EQ(j["hang"]["diagnosed_by_node"], 1);
  EXPECT_EQ(j["hang"]["report"], "HUNG: behind: rank 1");
  EXPECT_EQ(j["hang"]["report_file"], "/logs/attempt_0/hang_report.txt");
}

TEST(JobReportTest, ARoundThatNeverStartedHereHasNoPlaceAndTheFailureComesFromTheOtherNode) {
  const LaunchOptions o = options();
  JobReport report(o, "h1", "", true);
  report.rendezvous_began(0, 0);
  RoundEnd failed;
  failed.kind = RoundEnd::Kind::Failure;
  failed.root_node = 1;
  failed.detail = "rank 3 failed";
  WorkerExit cause = worker_end(3, 9);
  cause.node_rank = 1;
  cause.host = "h2";
  cause.error_text = "RuntimeError: boom";
  cause.stderr_tail = {"line a", "line b"};
  failed.root_cause = cause;
  report.round_ended(failed, GroupResult{});
  report.finish(&failed, 9);
  const json j = report.to_json();
  EXPECT_TRUE(j["attempts"][0]["node_rank"].is_null());
  EXPECT_TRUE(j["attempts"][0]["started_at"].is_null());
  EXPECT_TRUE(j["nodes"]["this_node_rank"].is_null());
  EXPECT_EQ(j["root_cause"]["host"], "h2");
  EXPECT_EQ(j["root_cause"]["node_rank"], 1);
  EXPECT_EQ(j["root_cause"]["error"], "RuntimeError: boom");
  EXPECT_EQ(j["root_cause"]["stderr_tail"], json({"line a", "line b"}));
}

TEST(JobReportTest, AStopBeforeAnyRoundIsSignalledWithItsMessage) {
  const LaunchOptions o = options();
  JobReport report(o, "h1", "", false);
  report.finish(nullptr, 143, "signalled", "received SIGTERM before the rendezvous");
  const json j = report.to_json();
  EXPECT_EQ(j["outcome"], "signalled");
  EXPECT_EQ(j["exit_code"], 143);
  EXPECT_EQ(j["message"], "received SIGTERM before the rendezvous");
  EXPECT_TRUE(j["attempts"].empty());
}

TEST(JobReportTest, HostInThePathIsThisHostsName) {
  EXPECT_EQ(expand_report_path("/r/{host}/job-{host}.json", "n1"), "/r/n1/job-n1.json");
  EXPECT_EQ(expand_report_path("/r/{hos}.json", "n1"), "/r/{hos}.json");
  EXPECT_EQ(expand_report_path("", "n1"), "");
}

TEST(JobReportTest, WriteReplacesTheFileWholeAndAPathThatCannotBeWrittenIsNoCrash) {
  test::TempDir dir;
  const fs::path file = dir.path / "r.json";
  std::ofstream(file) << "old";
  const LaunchOptions o = options();
  JobReport report(o, "h1", file.string(), false);
  report.finish(nullptr, 1, "error", "x");
  ASSERT_TRUE(report.write());
  std::ifstream in(file);
  std::stringstream s;
  s << in.rdbuf();
  EXPECT_EQ(json::parse(s.str())["message"], "x");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 1);

  std::ofstream(dir.path / "plain") << "a file, not a directory";
  JobReport blocked(o, "h1", (dir.path / "plain" / "r.json").string(), false);
  blocked.finish(nullptr, 1, "error", "x");
  EXPECT_FALSE(blocked.write());
}

}  // namespace
}  // namespace ddprun::launcher
