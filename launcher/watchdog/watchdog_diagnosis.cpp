// The watchdog's diagnoses: every rank's state and stacks when the job hangs (this node's part,
// gathered into one report), and the stacks of a rank whose torchelastic timer expired.
#include "launcher/watchdog/watchdog.hpp"

#include <thread>

#include "common/log.hpp"
#include "common/procfs.hpp"
#include "common/system.hpp"
#include "launcher/watchdog/stacks.hpp"
#include "launcher/watchdog/rank_state.hpp"

namespace ddprun::launcher::watchdog {

using rendezvous::RoundEnd;

using json = nlohmann::json;
using watchdog_detail::Clock;
using watchdog_detail::secs;

RankState Watchdog::diagnose_rank(const Rank& r, Clock::time_point now) {
  RankState s;
  s.rank = r.w.rank;
  s.local_rank = r.w.local_rank;
  s.pid = r.pid;
  s.reports_progress = r.reports;
  s.steps = r.steps;
  s.idle_seconds = secs(now - r.last_progress);
  const auto st = r.pid > 0 ? procfs::read_stat(r.pid) : std::nullopt;
  if (!st || st->state == 'Z') {
    s.exited = true;
    return s;
  }
  s.state = procfs::state_name(st->state);
  s.wchan = procfs::wait_channel(r.pid);
  s.in_collective = r.page && r.page->waiting_since_ns.load(std::memory_order_relaxed) != 0;
  const auto tree = procfs::process_tree(r.pid);
  s.cpu_seconds = static_cast<double>(procfs::tree_cpu_ticks(tree)) / static_cast<double>(procfs::ticks_per_second());
  if (s_.worker_store_port != 0) {
    for (const auto& c : procfs::tcp_connections(tree)) {
      if (c.remote_port == s_.worker_store_port) s.store_endpoints.push_back(c.local);
    }
  }
  RankStacks stacks = capture_stacks(r.pid, r.pid, tree, s_.python_stacks ? r.w.dir : std::string(), s_.stack_limit);
  // Every thread, in full, next to the rank's logs.
  s.stack_file = r.w.dir + "/stacks.txt";
  const std::string heading = "rank " + std::to_string(s.rank) + " (local_rank " + std::to_string(s.local_rank) +
                              ", pid " + std::to_string(s.pid) + "), " + s.state;
  if (write_stacks_file(s.stack_file, heading, stacks)) wrote_diagnosis_ = true;
  else s.stack_file.clear();
  s.python_stack = std::move(stacks.python);
  s.native_stack = std::move(stacks.native);
  s.native_tool = std::move(stacks.native_tool);
  s.problems = std::move(stacks.problems);
  // What travels to the node that writes the report: enough to read, not every thread in full.
  s.python_stack = first_lines(s.python_stack, 120);
  s.native_stack = first_lines(s.native_stack, 400);
  return s;
}

NodeDiagnosis Watchdog::diagnose_local(Clock::time_point now) {
  NodeDiagnosis d;
  d.node = s_.node;
  d.host = s_.host;
  d.log_dir = s_.attempt_dir;
  // Every rank at once: each capture is bounded, so the whole is too.
  std::vector<RankState> states(ranks_.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    threads.emplace_back([&, i] { states[i] = diagnose_rank(*ranks_[i], now); });
  }
  for (auto& t : threads) t.join();
  d.ranks = std::move(states);
  if (worker_store_) {
    StoreView v;
    v.endpoint = rdzv::server::format_endpoint(worker_store_->endpoint());
    std::vector<rdzv::server::ClientInfo> clients;
    worker_store_->with_server([&](rdzv::server::Server& s) { clients = s.clients(); });
    for (const auto& c : clients) {
      v.clients.push_back(c.peer);
      if (!c.waiting.empty()) v.waits.push_back({c.peer, c.waiting, secs(now - c.waiting_since)});
    }
    if (tap_) {
      std::lock_guard lock(tap_->mutex);
      v.heartbeats = tap_->heartbeats;
    }
    d.store = std::move(v);
  }
  return d;
}

void Watchdog::handle_hang(Clock::time_point now) {
  try {
    // Another node may have claimed it first: this node's part then goes with the next pulse.
    if (channel_ && !channel_->claim_hang()) {
      hang_handled_ = true;
      return;
    }
  } catch (const std::exception& e) {
    // No claim without the channel: decided when it answers again, from what it says then.
    channel_failed(now, e);
    return;
  }
  hang_handled_ = contributed_ = true;
  HangDiagnosis d;
  d.program = s_.program;
  d.timeout = s_.hang_timeout;
  d.idle_seconds = secs(now - last_job_progress_);
  d.detector_node = s_.node;
  d.detector_host = s_.host;
  d.detected_at = std::chrono::system_clock::now();
  log::warn("ddprun") << "no rank made progress for " << static_cast<int>(d.idle_seconds) << " s (--hang_timeout "
                      << seconds_text(s_.hang_timeout) << "): capturing every rank's stacks";
  NodeDiagnosis local = diagnose_local(now);
  RoundEnd end;
  end.kind = RoundEnd::Kind::Hang;
  end.root_node = s_.node;
  try {
    if (channel_) {
      channel_->put_diagnosis(to_json(local));
      const auto parts = channel_->gather_diagnoses(Clock::now() + s_.gather_limit);
      for (int k = 0; k < channel_->nodes(); ++k) {
        auto it = parts.find(k);
        if (it == parts.end()) d.silent_nodes.push_back(k);
        else d.nodes.push_back(node_diagnosis_from_json(it->second));
      }
    } else {
      d.nodes.push_back(std::move(local));
    }
    end.detail = hang_summary(d);
    end.report = format_hang_report(d);
    if (channel_) end = channel_->report_hang(end.detail, end.report);
  } catch (const std::exception& e) {
    log::warn("ddprun") << "hang watchdog: " << e.what() << "; reporting this node's ranks only";
    d.nodes = {diagnose_local(now)};
    end.detail = hang_summary(d);
    end.report = format_hang_report(d);
  }
  if (end.kind != RoundEnd::Kind::Hang) return;  // the round ended otherwise meanwhile
  if (group_running_ && !group_running_()) return;
  if (on_hang_) on_hang_(end);
}

void Watchdog::on_timer_expired(const TimerExpiry& t, int rank) {
  const Rank* r = nullptr;
  for (const auto& x : ranks_) {
    if (x->w.rank == rank) r = x.get();
  }
  if (!r) return;
  const std::string when = std::to_string(static_cast<int64_t>(t.expiration_time));
  log::warn("ddprun") << "torchelastic timer '" << t.scope << "' of rank " << rank << " (pid " << t.pid
                      << ") expired: capturing its stacks"
                      << (t.signal > 0 ? ", then sending " + signal_name(t.signal) : " (signal 0: it is not stopped)");
  pid_t main_pid;
  {
    std::lock_guard lock(pids_mutex_);
    main_pid = r->pid;
  }
  const auto tree = procfs::process_tree(main_pid);
  RankStacks stacks =
      capture_stacks(t.pid, main_pid, tree, s_.python_stacks ? r->w.dir : std::string(), s_.stack_limit);
  const std::string file = r->w.dir + "/timer_stacks.txt";
  if (write_stacks_file(file,
                        "torchelastic timer '" + t.scope + "' of pid " + std::to_string(t.pid) +
                            " expired (expiration_time " + when + ")",
                        stacks)) {
    wrote_diagnosis_ = true;
  }
  std::string note = "torchelastic timer '" + t.scope + "' expired (pid " + std::to_string(t.pid) + ")" +
                     (t.signal > 0 ? "; ddprun sent " + signal_name(t.signal) : "") + "\nstacks: " + file + "\n";
  if (!stacks.python.empty()) note += first_lines(stacks.python, 30);
  std::lock_guard lock(notes_mutex_);
  timer_notes_[rank] = note;
}

std::map<int, std::string> Watchdog::timer_notes() const {
  std::lock_guard lock(notes_mutex_);
  return timer_notes_;
}

}  // namespace ddprun::launcher::watchdog
