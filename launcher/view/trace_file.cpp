#include "launcher/view/trace_file.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/system.hpp"
#include "launcher/workers/output_file.hpp"

namespace ddprun::launcher::view {

using json = nlohmann::json;
using watchdog::RankReading;

namespace {

constexpr int kNodeTrack = 0;
int rank_track(int rank) { return rank + 1; }

constexpr size_t kQueueBytes = size_t{1} << 20;  // about 5,000 events behind
constexpr std::chrono::seconds kDrainBound{2};   // at the end, for the file to take what is queued

}  // namespace

TraceFile::TraceFile(const std::string& path, const std::string& host) : path_(path), host_(host) {
  const std::filesystem::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path(), ec);
  workers::QueuedWriter::Settings how;
  how.capacity = kQueueBytes;
  how.drain_bound = std::chrono::milliseconds(0);  // the destructor drains, and says so when it cannot
  how.on_first_drop = [path] {
    log::warn("ddprun") << "--trace_file " << path << " is not keeping up (its reader or file system is slow): "
                        << "events are dropped while it lags (the trace has gaps); the job goes on";
  };
  how.on_failure = [path](int err) {
    log::warn("ddprun") << "--trace_file " << path << ": cannot write: " << std::strerror(err)
                        << "; the trace stops here (the job goes on)";
  };
  // A FIFO with its reader, a terminal, /dev/null are written as they are; a link is not followed.
  workers::OpenedOutput file = workers::open_output(path);
  if (!file.fd) throw ConfigError("--trace_file " + path + ": " + file.error);
  out_ = std::make_unique<workers::QueuedWriter>(std::move(file.fd), std::move(how));
  std::lock_guard lock(mutex_);
  write(json{{"name", "ddprun"},
             {"ph", "i"},
             {"s", "g"},
             {"ts", 0},
             {"pid", pid_},
             {"tid", kNodeTrack},
             {"args", {{"started_at", utc_timestamp(std::chrono::system_clock::now())}, {"host", host_}}}});
  name_process();
}

TraceFile::~TraceFile() {
  std::lock_guard lock(mutex_);
  const int64_t now = micros(Clock::now());
  for (auto& [rank, r] : ranks_) end_state(rank, r, now);
  if (attempt_since_) {
    write(json{{"name", attempt_name_},
               {"ph", "X"},
               {"ts", *attempt_since_},
               {"dur", now - *attempt_since_},
               {"pid", pid_},
               {"tid", kNodeTrack},
               {"args", {{"end", "ddprun ended"}}}});
  }
  out_->write("\n]\n");
  if (!out_->drain(kDrainBound)) {
    log::warn("ddprun") << "--trace_file " << path_ << " did not take the end of the trace within "
                        << kDrainBound.count() << "s: ddprun ends without it";
  }
}

int64_t TraceFile::micros(Clock::time_point t) const {
  return std::chrono::duration_cast<std::chrono::microseconds>(t - origin_).count();
}

void TraceFile::write(const json& e) {
  out_->write((first_ ? "[\n" : ",\n") + e.dump(-1, ' ', false, json::error_handler_t::replace));
  first_ = false;
}

void TraceFile::name_process() {
  if (processes_named_[pid_]) return;
  processes_named_[pid_] = true;
  const std::string name = "ddprun on " + host_ + (pid_ > 0 ? " (node " + std::to_string(pid_) + ")" : "");
  write(json{{"name", "process_name"}, {"ph", "M"}, {"pid", pid_}, {"args", {{"name", name}}}});
  write(json{{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid_}, {"args", {{"sort_index", pid_}}}});
  write(json{{"name", "thread_name"}, {"ph", "M"}, {"pid", pid_}, {"tid", kNodeTrack}, {"args", {{"name", "node"}}}});
  write(json{
      {"name", "thread_sort_index"}, {"ph", "M"}, {"pid", pid_}, {"tid", kNodeTrack}, {"args", {{"sort_index", -1}}}});
  for (auto& [rank, r] : ranks_) r.named = false;
}

void TraceFile::set_node(int node) {
  std::lock_guard lock(mutex_);
  if (node < 0 || node == pid_) return;
  pid_ = node;
  name_process();
}

void TraceFile::event(const std::string& kind, const std::string& text) {
  std::lock_guard lock(mutex_);
  const int64_t now = micros(Clock::now());
  auto slice = [&](const std::string& name, int64_t since, const std::string& end) {
    write(json{{"name", name},
               {"ph", "X"},
               {"ts", since},
               {"dur", now - since},
               {"pid", pid_},
               {"tid", kNodeTrack},
               {"args", {{"end", end}}}});
  };
  if (kind == "rendezvous") {
    if (attempt_since_) {
      slice(attempt_name_, *attempt_since_, text);
      attempt_since_.reset();
    }
    rendezvous_since_ = now;
  } else if (kind == "start") {
    if (rendezvous_since_) slice("rendezvous", *rendezvous_since_, text);
    rendezvous_since_.reset();
    attempt_since_ = now;
    attempt_name_ = "attempt: " + text;
  } else if (kind == "end" || kind == "exit") {
    if (attempt_since_) slice(attempt_name_, *attempt_since_, text);
    attempt_since_.reset();
  }
  write(json{{"name", kind + ": " + text},
             {"cat", kind},
             {"ph", "i"},
             {"s", "t"},
             {"ts", now},
             {"pid", pid_},
             {"tid", kNodeTrack},
             {"args", {{"kind", kind}, {"text", text}}}});
}

void TraceFile::end_state(int rank, Rank& r, int64_t at) {
  if (r.state.empty()) return;
  write(json{{"name", r.state},
             {"ph", "X"},
             {"ts", r.state_since},
             {"dur", at - r.state_since},
             {"pid", pid_},
             {"tid", rank_track(rank)}});
  r.state.clear();
}

void TraceFile::update(Clock::time_point now, const std::vector<RankReading>& ranks) {
  std::lock_guard lock(mutex_);
  const int64_t t = micros(now);
  for (const RankReading& x : ranks) {
    Rank& r = ranks_[x.rank];
    if (r.previous && r.previous->pid != x.pid) {
      // Another process for the rank (a new round): what the last one did ends where it was seen.
      end_state(x.rank, r, micros(r.previous_at));
      r.previous.reset();
    }
    if (!r.named) {
      r.named = true;
      write(json{{"name", "thread_name"},
                 {"ph", "M"},
                 {"pid", pid_},
                 {"tid", rank_track(x.rank)},
                 {"args", {{"name", "rank " + std::to_string(x.rank)}}}});
      write(json{{"name", "thread_sort_index"},
                 {"ph", "M"},
                 {"pid", pid_},
                 {"tid", rank_track(x.rank)},
                 {"args", {{"sort_index", x.rank}}}});
    }
    if (!r.previous && attempt_since_) {
      // A process seen for the first time: its steps so far began with the attempt.
      RankReading start = x;
      start.steps = 0;
      start.wait_ns = 0;
      start.alive = true;
      r.previous = start;
      r.previous_at = origin_ + std::chrono::microseconds(*attempt_since_);
    }
    const bool same_process = r.previous && r.previous->pid == x.pid && x.steps >= r.previous->steps;
    if (same_process && x.steps > r.previous->steps) {
      // Steps ended since the last look: one slice for them, with their step time (without waits).
      end_state(x.rank, r, micros(r.previous_at));
      const uint64_t steps = x.steps - r.previous->steps;
      const uint64_t waited_ns = x.wait_ns >= r.previous->wait_ns ? x.wait_ns - r.previous->wait_ns : 0;
      const double wait_ms = static_cast<double>(waited_ns) / 1e6;
      const double step_ms = *watchdog::step_time_ms(now - r.previous_at, steps, waited_ns, x.reports_waits);
      write(json{{"name", std::to_string(steps) + (steps == 1 ? " step" : " steps")},
                 {"ph", "X"},
                 {"ts", micros(r.previous_at)},
                 {"dur", t - micros(r.previous_at)},
                 {"pid", pid_},
                 {"tid", rank_track(x.rank)},
                 {"args",
                  {{"first_step", r.previous->steps + 1},
                   {"last_step", x.steps},
                   {"step_ms", std::round(step_ms * 10) / 10},
                   {"waited_ms", std::round(wait_ms * 10) / 10}}}});
      write(json{{"name", "step time (ms), rank " + std::to_string(x.rank)},
                 {"ph", "C"},
                 {"ts", t},
                 {"pid", pid_},
                 {"args", {{"step_ms", std::round(step_ms * 10) / 10}}}});
    } else if (r.previous) {
      // No step ended: what the rank did meanwhile, merged with the slice before while it lasts.
      const std::string state = !x.alive ? "" : x.waiting ? "waiting on the others" : "no step ended";
      if (state != r.state) {
        end_state(x.rank, r, micros(r.previous_at));
        r.state = state;
        r.state_since = micros(r.previous_at);
      }
      if (!x.alive && r.previous->alive) {
        write(json{{"name", "exited"}, {"ph", "i"}, {"s", "t"}, {"ts", t}, {"pid", pid_}, {"tid", rank_track(x.rank)}});
      }
    }
    r.previous = x;
    r.previous_at = now;
  }
}

}  // namespace ddprun::launcher::view
