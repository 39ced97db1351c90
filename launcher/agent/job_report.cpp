#include "launcher/agent/job_report.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/log.hpp"
#include "common/replace_file.hpp"
#include "launcher/agent/error_file.hpp"
#include "common/system.hpp"
#include "common/unique_fd.hpp"

#ifndef DDPRUN_VERSION
#define DDPRUN_VERSION "0.0.0"
#endif

namespace ddprun::launcher::agent {

using cli::LaunchOptions;
using cli::rdzv_backend_name;
using rendezvous::RoundEnd;
using rendezvous::World;
using watchdog::FinalRates;
using watchdog::RankRate;
using watchdog::to_json;
using workers::GroupResult;
using workers::WorkerExit;

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

double seconds_between(std::chrono::system_clock::time_point a, std::chrono::system_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

json time_or_null(std::chrono::system_clock::time_point t) {
  if (t.time_since_epoch().count() == 0) return nullptr;
  return utc_timestamp(t);
}

json signal_or_null(int signo) { return signo != 0 ? json(signal_name(signo)) : json(nullptr); }

// One worker's end. `state`: succeeded, failed, or stopped (by ddprun, after another's failure or
// a signal).
json worker_json(const WorkerExit& e, const std::string& state) {
  json j = {{"rank", e.rank},
            {"local_rank", e.local_rank},
            {"node_rank", e.node_rank >= 0 ? json(e.node_rank) : json(nullptr)},
            {"host", e.host},
            {"pid", e.pid > 0 ? json(e.pid) : json(nullptr)},
            {"state", state},
            {"exit_code", e.signal == 0 ? json(e.exit_code) : json(nullptr)},
            {"signal", e.signal != 0 ? json(e.signal) : json(nullptr)},
            {"signal_name", signal_or_null(e.signal)},
            {"ended_at", time_or_null(e.time)}};
  return j;
}

// The failure in full: the worker's end, its last stderr lines, its error file, the watchdog's note.
json failure_json(const WorkerExit& e) {
  json j = worker_json(e, "failed");
  j["error_file"] = e.error_file.empty() ? json(nullptr) : json(e.error_file);
  j["error"] = e.error_text ? json(*e.error_text) : json(nullptr);
  j["stderr_tail"] = e.stderr_tail;
  j["diagnosis"] = e.diagnosis.empty() ? json(nullptr) : json(e.diagnosis);
  return j;
}

json rates_json(const FinalRates& r) {
  if (r.ranks.empty()) return nullptr;
  json ranks = json::array();
  std::vector<RankRate> sorted = r.ranks;
  std::sort(sorted.begin(), sorted.end(), [](const RankRate& a, const RankRate& b) { return a.rank < b.rank; });
  for (const RankRate& rate : sorted) {
    json j = to_json(rate);
    j["straggler"] = r.stragglers.count(rate.rank) > 0;
    ranks.push_back(std::move(j));
  }
  return {{"scope", r.job_wide ? "job" : "node"}, {"ranks", std::move(ranks)}};
}

}  // namespace

std::string expand_report_path(const std::string& spec, const std::string& host) {
  std::string out;
  static const std::string kHost = "{host}";
  for (size_t i = 0; i < spec.size();) {
    if (spec.compare(i, kHost.size(), kHost) == 0) {
      out += host;
      i += kHost.size();
    } else {
      out += spec[i++];
    }
  }
  return out;
}

std::string outcome_name(RoundEnd::Kind kind) {
  switch (kind) {
    case RoundEnd::Kind::Success: return "succeeded";
    case RoundEnd::Kind::Failure: return "failed";
    case RoundEnd::Kind::Signal: return "signalled";
    case RoundEnd::Kind::StoreLost: return "store_lost";
    case RoundEnd::Kind::NodeLost: return "node_lost";
    case RoundEnd::Kind::Membership: return "membership_change";
    case RoundEnd::Kind::Hang: return "hung";
  }
  return "unknown";
}

JobReport::JobReport(const LaunchOptions& o, std::string host, std::string path, bool multi_node)
    : options_(o), host_(std::move(host)), path_(std::move(path)), multi_node_(multi_node) {}

void JobReport::rendezvous_began(int round, int restart) {
  Attempt a;
  a.round = round;
  a.restart = restart;
  a.rendezvous_began = Clock::now();
  attempts_.push_back(std::move(a));
}

void JobReport::spare(int round, const RoundEnd* end) {
  if (attempts_.empty() || (attempts_.back().spare && attempts_.back().round != round)) {
    // A spare again in a later round: an attempt of its own, begun where the last one ended.
    const int restart = attempts_.empty() ? 0 : attempts_.back().restart;
    rendezvous_began(round, restart);
  }
  Attempt& a = attempts_.back();
  a.round = round;
  a.spare = true;
  if (end) {
    a.ended = Clock::now();
    a.outcome = outcome_name(end->kind);
    a.detail = end->detail;
  }
}

void JobReport::group_started(const World& world) {
  if (attempts_.empty() || attempts_.back().spare) {
    // After waiting as a spare: the rendezvous of this round began when the spare's round ended.
    const auto after_spare = attempts_.empty() ? Clock::time_point{} : attempts_.back().ended;
    rendezvous_began(world.round, 0);
    if (after_spare.time_since_epoch().count()) attempts_.back().rendezvous_began = after_spare;
  }
  Attempt& a = attempts_.back();
  a.round = world.round;
  a.restart = std::max(a.restart, world.restarts);  // the job's count, when this node joined it late
  a.world = world;
  a.started = Clock::now();
}

void JobReport::round_ended(const RoundEnd& end, const GroupResult& result) {
  if (attempts_.empty()) rendezvous_began(0, 0);
  Attempt& a = attempts_.back();
  a.ended = Clock::now();
  a.outcome = outcome_name(end.kind);
  a.detail = end.detail;
  a.workers = result.exits;
  std::sort(a.workers.begin(), a.workers.end(),
            [](const WorkerExit& x, const WorkerExit& y) { return x.rank < y.rank; });
  a.stopped_ranks = std::set<int>(result.stopped_ranks.begin(), result.stopped_ranks.end());
  a.unkillable = result.unkillable;
  failures_ = result.failures;
  latest_end_ = end;
}

void JobReport::group_failing(const std::vector<WorkerExit>& failures) {
  if (failures.empty()) return;
  RoundEnd failing;
  failing.kind = RoundEnd::Kind::Failure;
  failing.root_cause = failures.front();
  failing.root_node = failures.front().node_rank;
  latest_end_ = std::move(failing);
  failures_ = failures;
}

void JobReport::keep_error_texts(const std::string& run_directory, const std::string& root_cause_copy) {
  if (end_ && end_->root_cause) keep_error_text_of(*end_->root_cause, run_directory, root_cause_copy);
  for (WorkerExit& f : failures_) keep_error_text_of(f, run_directory, "");
}

void JobReport::finish(const RoundEnd* end, int exit_code, const std::string& outcome, const std::string& message) {
  ended_ = Clock::now();
  exit_code_ = exit_code;
  finished_ = true;
  if (end) end_ = *end;
  outcome_ = !outcome.empty() ? outcome : end ? outcome_name(end->kind) : "error";
  message_ = !message.empty() ? message : end ? end->detail : "";
}

json JobReport::attempt_json(const Attempt& a) const {
  json workers = json::array();
  for (const WorkerExit& w : a.workers) {
    const bool failed = w.signal != 0 || w.exit_code != 0;
    const std::string state = a.stopped_ranks.count(w.rank) ? "stopped" : failed ? "failed" : "succeeded";
    workers.push_back(worker_json(w, state));
  }
  for (const auto& u : a.unkillable) {
    json j = worker_json(u.worker, "unkillable");
    j["exit_code"] = nullptr;
    j["ended_at"] = nullptr;
    j["process_state"] = std::string(1, u.state);
    j["wchan"] = u.wchan.empty() ? json(nullptr) : json(u.wchan);
    const auto at =
        std::find_if(workers.begin(), workers.end(), [&](const json& x) { return x["rank"] > u.worker.rank; });
    workers.insert(at, std::move(j));
  }
  json j = {{"round", a.round},
            {"restart", a.restart},
            {"spare", a.spare},
            {"outcome", a.outcome.empty() ? json(nullptr) : json(a.outcome)},
            {"message", a.detail},
            {"rendezvous_began_at", time_or_null(a.rendezvous_began)},
            {"started_at", time_or_null(a.started)},
            {"ended_at", time_or_null(a.ended)},
            {"rendezvous_s", a.world ? json(seconds_between(a.rendezvous_began, a.started)) : json(nullptr)},
            {"run_s",
             a.world && a.ended.time_since_epoch().count() ? json(seconds_between(a.started, a.ended)) : json(nullptr)},
            {"workers", std::move(workers)}};
  const World* w = a.world ? &*a.world : nullptr;
  j["node_rank"] = w ? json(w->group_rank) : json(nullptr);
  j["nnodes"] = w ? json(w->group_world_size) : json(nullptr);
  j["world_size"] = w ? json(w->world_size) : json(nullptr);
  j["ranks"] = w ? json{w->rank_offset, w->rank_offset + options_.nproc_per_node - 1} : json(nullptr);
  j["master_addr"] = w ? json(w->master_addr) : json(nullptr);
  j["master_port"] = w ? json(w->master_port) : json(nullptr);
  return j;
}

json JobReport::root_cause_json(json& others) const {
  others = json::array();
  // The job's end once there is one; before, the latest round's (the job runs on, or is about to end).
  const std::optional<RoundEnd>& end = finished_ ? end_ : latest_end_;
  if (!end || end->kind != RoundEnd::Kind::Failure) return nullptr;
  json root_cause = nullptr;
  if (end->root_cause) root_cause = failure_json(*end->root_cause);
  for (const WorkerExit& f : failures_) {
    if (!end->root_cause || f.rank != end->root_cause->rank) others.push_back(failure_json(f));
  }
  if (root_cause.is_object() && end->root_node >= 0 && root_cause["node_rank"].is_null()) {
    root_cause["node_rank"] = end->root_node;
  }
  return root_cause;
}

json JobReport::hang_json() const {
  if (!end_ || end_->kind != RoundEnd::Kind::Hang) return nullptr;
  return {{"diagnosed_by_node", end_->root_node >= 0 ? json(end_->root_node) : json(nullptr)},
          {"summary", end_->detail},
          {"report", end_->report.empty() ? json(nullptr) : json(end_->report)},
          {"report_file", hang_report_file_.empty() ? json(nullptr) : json(hang_report_file_)}};
}

namespace {

json not_restarted_json(Decision::Why why) {
  switch (why) {
    case Decision::Why::Ended: return nullptr;
    case Decision::Why::NoRestartsLeft: return "no_restarts_left";
    case Decision::Why::DoNotRestart: return "do_not_restart_exit_code";
    case Decision::Why::NoProgress: return "no_progress";
    case Decision::Why::Stopping: return "stopping";
    case Decision::Why::Unkillable: return "unkillable";
  }
  return nullptr;
}

}  // namespace

json JobReport::to_json() const {
  json attempts = json::array();
  for (const Attempt& a : attempts_) attempts.push_back(attempt_json(a));
  // The node's place in the job: as of the last round it ran in.
  const World* last = nullptr;
  for (auto it = attempts_.rbegin(); it != attempts_.rend() && !last; ++it) {
    if (it->world) last = &*it->world;
  }
  json failures;
  json root_cause = root_cause_json(failures);
  json hang = hang_json();
  int restarts = 0;
  for (const Attempt& a : attempts_) restarts = std::max(restarts, a.restart);
  json args = options_.program_args;
  return {{"schema", kReportSchema},
          {"ddprun_version", DDPRUN_VERSION},
          {"job_id", options_.run_id},
          {"program", options_.program},
          {"args", std::move(args)},
          {"host", host_},
          {"pid", static_cast<int>(::getpid())},
          {"outcome", finished_ ? json(outcome_) : json(nullptr)},
          {"exit_code", finished_ ? json(exit_code_) : json(nullptr)},
          {"message", message_},
          {"started_at", time_or_null(began_)},
          {"ended_at", time_or_null(ended_)},
          {"duration_s", finished_ ? json(seconds_between(began_, ended_)) : json(nullptr)},
          {"nodes",
           {{"min", options_.min_nodes},
            {"max", options_.max_nodes},
            {"count", last ? json(last->group_world_size) : json(nullptr)},
            {"this_node_rank", last ? json(last->group_rank) : json(nullptr)},
            {"spare", !attempts_.empty() && attempts_.back().spare},
            {"rdzv_backend", rdzv_backend_name(options_.rdzv_backend)},
            {"multi_node", multi_node_}}},
          {"nproc_per_node", options_.nproc_per_node},
          {"world_size", last ? json(last->world_size) : json(nullptr)},
          {"restarts", restarts},
          {"max_restarts", options_.max_restarts},
          {"not_restarted", not_restarted_json(not_restarted_)},
          {"attempts", std::move(attempts)},
          {"root_cause", std::move(root_cause)},
          {"other_failures", std::move(failures)},
          {"hang", std::move(hang)},
          {"step_rates", rates_json(rates_)},
          {"run_directory", run_directory_.empty() ? json(nullptr) : json(run_directory_)}};
}

std::optional<std::string> report_path_problem(const std::string& path) {
  struct stat st {};
  // lstat: a link is judged as a link; replacing it would not write where it points.
  if (::lstat(path.c_str(), &st) != 0) return std::nullopt;
  if (S_ISREG(st.st_mode) || S_ISFIFO(st.st_mode)) return std::nullopt;
  if (S_ISLNK(st.st_mode)) return "it is a symbolic link";
  if (S_ISDIR(st.st_mode)) return "it is a directory";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "it is a device";
  if (S_ISSOCK(st.st_mode)) return "it is a socket";
  return "it is not a regular file";
}

bool JobReport::write() const {
  if (path_.empty()) return true;
  auto warn = [&](const std::string& what) {
    log::warn("ddprun") << "cannot write the report file " << path_ << ": " << what
                        << "; the report is on the console only";
    return false;
  };
  std::string text;
  try {
    text = to_json().dump(2, ' ', false, json::error_handler_t::replace) + "\n";
  } catch (const std::exception& e) {
    log::warn("ddprun") << "cannot encode the report for " << path_ << ": " << e.what();
    return false;
  }
  // A reader sees the old document or the new one, whole. 0600: it holds what the workers printed.
  ReplaceFile how;
  how.durability = Durability::Atomic;
  how.create_directory = true;
  how.before_publish = [&]() -> std::optional<std::string> {
    if (auto problem = report_path_problem(path_)) return "not replacing " + path_ + ": " + *problem;
    return std::nullopt;
  };
  if (const auto failed = replace_file(path_, text, how)) return warn(failed->what());
  log::info("ddprun") << "report: " << path_;
  return true;
}

}  // namespace ddprun::launcher::agent
