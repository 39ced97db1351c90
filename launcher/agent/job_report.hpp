#pragma once
// --report_file: how the job ended, as one JSON document a scheduler, a dashboard or a test reads
// instead of the console's sentences. Written by every node at the end of every job (success,
// failure, hang, a stop signal, a lost node or store, an error of ddprun's own), atomically (a
// temporary file renamed over the path), readable by its owner only like the logs. The schema
// ("ddprun-report/1") is in docs/guide.md; fields are only ever added to it.
//
// The agent records each attempt as it goes (the rendezvous, the start, the end with this node's
// workers) and the end; JobReport turns that into the document. Each node reports its own workers;
// the root cause and a hang's diagnosis come from the rendezvous, so they are the job's.

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "launcher/agent/restart_policy.hpp"
#include "launcher/cli/options.hpp"
#include "launcher/rendezvous/rendezvous_backend.hpp"
#include "launcher/watchdog/step_rates.hpp"
#include "launcher/workers/supervisor.hpp"

namespace ddprun::launcher::agent {

using cli::LaunchOptions;
using rendezvous::RoundEnd;
using rendezvous::World;
using watchdog::FinalRates;
using watchdog::to_json;
using workers::GroupResult;
using workers::WorkerExit;

inline constexpr const char* kReportSchema = "ddprun-report/1";

// "{host}" in --report_file is this host's name: nodes that share a file system write one file each.
std::string expand_report_path(const std::string& spec, const std::string& host);

// The outcome word of the report for a round's end ("succeeded", "failed", "hung", ...).
std::string outcome_name(RoundEnd::Kind kind);

// Why the report may not replace what is at `path`: anything there that is not a regular file or a
// FIFO (a device node, a directory, a socket, a symbolic link), as "it is a device"; nullopt when
// nothing is there or it may be replaced. Checked at the start and again before the rename.
std::optional<std::string> report_path_problem(const std::string& path);

class JobReport {
 public:
  using Clock = std::chrono::system_clock;

  // `path` "" = no report (but the record is still kept, for to_json).
  JobReport(const LaunchOptions& o, std::string host, std::string path, bool multi_node);

  const std::string& path() const { return path_; }

  // An attempt: its rendezvous begins, the group starts, the round ends.
  void rendezvous_began(int round, int restart);
  void group_started(const World& world);
  void round_ended(const RoundEnd& end, const GroupResult& result);
  // This node's workers failed and are being stopped (`failures` in order, the first the root
  // cause as this node sees it): until the round's end is agreed (round_ended), the document as it
  // stands names them.
  void group_failing(const std::vector<WorkerExit>& failures);
  // This node waits as a spare of `round` (`end` null), or that round has ended (`end`).
  void spare(int round, const RoundEnd* end);
  void set_rates(FinalRates rates) { rates_ = std::move(rates); }
  void set_hang_report_file(std::string path) { hang_report_file_ = std::move(path); }
  void set_run_directory(std::string path) { run_directory_ = std::move(path); }
  // The run directory is removed at the end: the failures' error files in it are kept as text, the
  // root cause's path becomes its copy (`root_cause_copy`, "" for none), the others' none.
  void keep_error_texts(const std::string& run_directory, const std::string& root_cause_copy);
  // What kept the last failed or hung round from a restart (Decision::Why::Ended: nothing did).
  void set_not_restarted(Decision::Why why) { not_restarted_ = why; }

  // The end of the job: the last round's end (none when no round ended), ddprun's exit code and
  // a one-line message when there is no round end to tell it (a stop signal before the start, an
  // error).
  void finish(const RoundEnd* end, int exit_code, const std::string& outcome = "", const std::string& message = "");

  nlohmann::json to_json() const;
  // Writes the document to path() (nothing without a path). A failure (a full disk, a missing
  // permission) is a warning naming the file and why; it never changes the job's exit code.
  bool write() const;

 private:
  struct Attempt {
    int round = 0;
    int restart = 0;
    std::optional<World> world;  // none: the round never started on this node
    bool spare = false;          // this node waited out the round as a spare
    Clock::time_point rendezvous_began, started, ended;
    std::string outcome, detail;
    std::vector<WorkerExit> workers;  // this node's, in rank order
    std::set<int> stopped_ranks;
    std::vector<workers::UnkillableWorker> unkillable;  // left behind after SIGKILL
  };
  nlohmann::json attempt_json(const Attempt& a) const;
  // The failed job's root cause; the other failures of this node go to `others`.
  nlohmann::json root_cause_json(nlohmann::json& others) const;
  nlohmann::json hang_json() const;

  const LaunchOptions& options_;
  std::string host_;
  std::string path_;
  bool multi_node_;
  Clock::time_point began_ = Clock::now(), ended_{};
  std::vector<Attempt> attempts_;
  std::optional<RoundEnd> end_;
  // The latest round's end (or its failure while the workers are being stopped): what the document
  // names as the root cause before the job's end (a page shows it through a restart).
  std::optional<RoundEnd> latest_end_;
  std::vector<WorkerExit> failures_;  // this node's, last round
  std::string outcome_, message_;
  Decision::Why not_restarted_ = Decision::Why::Ended;
  int exit_code_ = 0;
  bool finished_ = false;
  FinalRates rates_;
  std::string hang_report_file_;
  std::string run_directory_;
};

}  // namespace ddprun::launcher::agent
