#include "launcher/watchdog/watchdog.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <set>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/numbers.hpp"
#include "common/system.hpp"
#include "ddprun/worker/progress_page.hpp"
#include "common/procfs.hpp"
#include "launcher/rendezvous/rendezvous_values.hpp"
#include "launcher/watchdog/stacks.hpp"
#include "rendezvous/core/job_keys.hpp"
#include "rendezvous/server/server.hpp"

namespace ddprun::launcher {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using worker::ProgressPage;

namespace {

// CPU time counts as progress from this share of one core over the window up.
constexpr double kBusyShare = 0.02;

double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The rank in a heartbeat key: "<anything>ddprun/progress/<rank>".
std::optional<int> heartbeat_rank(std::string_view key) {
  static constexpr std::string_view kMarker = "ddprun/progress/";
  const auto at = key.rfind(kMarker);
  if (at == std::string_view::npos) return std::nullopt;
  const auto digits = key.substr(at + kMarker.size());
  const auto rank = to_int(digits);
  if (!rank || *rank < 0 || *rank > (1 << 24) || digits.empty() || digits[0] == '+') return std::nullopt;
  return static_cast<int>(*rank);
}

}  // namespace

// The worker store's changes, as the watchdog needs them (called on the store's thread).
class Watchdog::StoreTap final : public rdzv::ChangeObserver {
 public:
  void on_change(std::string_view key, const int64_t* counter) override {
    changes.fetch_add(1, std::memory_order_relaxed);
    const auto rank = heartbeat_rank(key);
    if (!rank) return;
    std::lock_guard lock(mutex);
    int64_t& beats = heartbeats[*rank];
    beats = counter ? *counter : beats + 1;
  }
  std::atomic<uint64_t> changes{0};
  std::mutex mutex;
  std::map<int, int64_t> heartbeats;
};

struct Watchdog::Rank {
  WatchedRank w;
  std::string progress_file;
  ProgressPage* page = nullptr;
  pid_t pid = -1;
  bool exited = false;
  uint64_t beats = 0, steps = 0;
  bool reports = false;  // has written its page
  Clock::time_point last_progress;
  std::vector<std::pair<Clock::time_point, uint64_t>> cpu;  // (time, ticks), oldest first
  RateTracker rates;

  ~Rank() {
    if (page) ::munmap(page, ProgressPage::kFileSize);
  }
};

Watchdog::Watchdog(WatchdogSettings settings, std::vector<WatchedRank> ranks) : s_(std::move(settings)) {
  stragglers_ = StragglerWatch(s_.straggler_factor, 3);
  for (auto& w : ranks) {
    auto r = std::make_unique<Rank>();
    r->w = std::move(w);
    r->progress_file = r->w.dir + "/progress";
    const int fd = ::open(r->progress_file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || ::ftruncate(fd, ProgressPage::kFileSize) != 0) {
      const int e = errno;
      if (fd >= 0) ::close(fd);
      throw ProcessError("cannot create the progress file " + r->progress_file + ": " + std::strerror(e));
    }
    void* p = ::mmap(nullptr, ProgressPage::kFileSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) throw ProcessError("cannot map the progress file " + r->progress_file + ": " + std::strerror(errno));
    r->page = static_cast<ProgressPage*>(p);
    r->page->magic.store(ProgressPage::kMagic, std::memory_order_release);
    ranks_.push_back(std::move(r));
  }
  if (s_.file_timer) {
    timer_ = std::make_unique<FileTimerServer>(
        s_.timer_file, [this](pid_t pid) { return owner_of(pid); },
        [this](const TimerExpiry& t, int rank) { on_timer_expired(t, rank); });
  }
}

Watchdog::~Watchdog() {
  stop();
  timer_.reset();
}

std::string Watchdog::progress_file(int local_rank) const {
  for (const auto& r : ranks_) {
    if (r->w.local_rank == local_rank) return r->progress_file;
  }
  return "";
}

void Watchdog::start(const std::vector<pid_t>& pids, rdzv::ServerThread* worker_store,
                     std::unique_ptr<ProgressChannel> channel, std::function<void(const RoundEnd&)> on_hang,
                     std::function<bool()> group_running) {
  {
    std::lock_guard lock(pids_mutex_);
    for (size_t i = 0; i < ranks_.size() && i < pids.size(); ++i) {
      ranks_[i]->pid = pids[i];
      ranks_[i]->exited = pids[i] <= 0;
    }
  }
  worker_store_ = worker_store;
  channel_ = std::move(channel);
  on_hang_ = std::move(on_hang);
  group_running_ = std::move(group_running);
  if (worker_store_) {
    tap_ = std::make_unique<StoreTap>();
    worker_store_->with_server([this](rdzv::Server& s) { s.store().set_observer(tap_.get()); });
  }
  started_at_ = last_job_progress_ = Clock::now();
  next_rates_ = started_at_ + s_.rates_period;
  for (auto& r : ranks_) {
    r->last_progress = started_at_;
    if (r->pid > 0 && s_.hang_timeout.count() > 0) r->cpu.emplace_back(started_at_, 0);  // a new process has used none
  }
  started_ = true;
  thread_ = std::thread([this] { run(); });
}

void Watchdog::stop() {
  {
    std::lock_guard lock(wake_mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (tap_ && worker_store_) {
    worker_store_->with_server([](rdzv::Server& s) { s.store().set_observer(nullptr); });
  }
  if (started_) {
    sample(Clock::now());
    publish_rates(Clock::now(), /*final=*/true);
  }
}

int Watchdog::owner_of(pid_t pid) const {
  std::lock_guard lock(pids_mutex_);
  const auto st = procfs::read_stat(pid);
  for (const auto& r : ranks_) {
    if (r->pid <= 0) continue;
    if (pid == r->pid || (st && st->pgid == r->pid)) return r->w.rank;
  }
  return -1;
}

bool Watchdog::cpu_progress(Rank& r, Clock::time_point now) {
  // The window: a third of the timeout, between 2 and 10 seconds.
  const auto window = std::clamp<Clock::duration>(s_.hang_timeout / 3, std::chrono::seconds(2), std::chrono::seconds(10));
  const uint64_t ticks = procfs::tree_cpu_ticks(procfs::process_tree(r.pid));
  r.cpu.emplace_back(now, ticks);
  while (r.cpu.size() > 2 && now - r.cpu[1].first >= window) r.cpu.erase(r.cpu.begin());
  const auto& [then, before] = r.cpu.front();
  if (now - then < window / 2) return false;  // not enough history yet: the start counts as progress anyway
  const double used = static_cast<double>(ticks > before ? ticks - before : 0) / static_cast<double>(procfs::ticks_per_second());
  return used >= kBusyShare * secs(now - then);
}

bool Watchdog::sample(Clock::time_point now) {
  bool progressed = false;
  for (auto& rp : ranks_) {
    Rank& r = *rp;
    if (r.pid <= 0) continue;
    bool moved = false;
    bool waiting = false;
    // The page outlives the worker: its last counts are read even after it exited.
    if (r.page) {
      const uint64_t beats = r.page->beats.load(std::memory_order_relaxed);
      const uint64_t steps = r.page->steps.load(std::memory_order_relaxed);
      waiting = r.page->waiting_since_ns.load(std::memory_order_relaxed) != 0;
      moved = beats != r.beats || steps != r.steps;
      r.reports = r.reports || beats > 0 || steps > 0;
      r.beats = beats;
      r.steps = steps;
      if (r.reports && moved) {
        // When the last step ended, by the worker's clock (CLOCK_MONOTONIC, steady_clock's): exact
        // rates whatever the sampling period.
        const uint64_t at_ns = r.page->last_step_ns.load(std::memory_order_relaxed);
        const auto at = at_ns ? Clock::time_point(std::chrono::nanoseconds(at_ns)) : now;
        const uint64_t first_ns = r.page->first_step_ns.load(std::memory_order_relaxed);
        if (!r.rates.started() && first_ns != 0) {
          // The first step is the run's origin, so even a run shorter than a tick has its rate.
          r.rates.sample(Clock::time_point(std::chrono::nanoseconds(first_ns)), 1,
                         r.page->first_step_wait_ns.load(std::memory_order_relaxed), true);
        }
        r.rates.sample(at, steps, r.page->wait_ns.load(std::memory_order_relaxed), true);
      }
    }
    if (!r.exited) {
      const auto st = procfs::read_stat(r.pid);
      r.exited = !st || st->state == 'Z' || st->state == 'X';
    }
    if (r.exited) continue;
    if (!moved && s_.hang_timeout.count() > 0 && !heartbeat_mode_ && !waiting) moved = cpu_progress(r, now);
    if (moved) {
      r.last_progress = now;
      progressed = true;
    }
  }
  if (tap_) {
    const uint64_t changes = tap_->changes.load(std::memory_order_relaxed);
    if (changes != store_changes_) {
      store_changes_ = changes;
      progressed = true;
    }
    std::map<int, int64_t> beats;
    {
      std::lock_guard lock(tap_->mutex);
      beats = tap_->heartbeats;
    }
    if (!beats.empty() && !heartbeat_mode_) {
      heartbeat_mode_ = true;
      log::info("ddprun") << "ranks heartbeat through the worker store (ddprun/progress/<rank>): their CPU time is no "
                             "longer taken for progress";
    }
    for (const auto& [rank, count] : beats) {
      auto& seen = heartbeats_seen_[rank];
      if (seen != count) {
        seen = count;
        for (auto& r : ranks_) {
          if (r->w.rank == rank) r->last_progress = now;
        }
      }
      heartbeat_rates_[rank].sample(now, static_cast<uint64_t>(std::max<int64_t>(count, 0)), 0, false);
    }
  }
  return progressed;
}

void Watchdog::pulse(Clock::time_point now, bool progressed) {
  if (!channel_) return;
  try {
    const ProgressChannel::Pulse p = channel_->pulse(progressed, heartbeat_mode_ && tap_ != nullptr);
    if (p.job_progress != job_counter_) {
      if (job_counter_ >= 0) last_job_progress_ = std::max(last_job_progress_, now);
      job_counter_ = p.job_progress;
    }
    if (p.heartbeat_mode && !heartbeat_mode_) heartbeat_mode_ = true;
    if (p.hang_claimed_by && *p.hang_claimed_by != channel_->node() && !contributed_) {
      // Another node diagnoses a hang: add this node's part.
      hang_handled_ = contributed_ = true;
      log::warn("ddprun") << "node " << *p.hang_claimed_by << " found the job hung: capturing this node's stacks";
      channel_->put_diagnosis(to_json(diagnose_local(now)));
    }
  } catch (const std::exception& e) {
    if (!channel_failed_logged_) {
      log::warn("ddprun") << "hang watchdog: the rendezvous store does not answer (" << e.what()
                          << "); watching this node's ranks only";
      channel_failed_logged_ = true;
    }
    channel_.reset();
  }
}

json Watchdog::rates_record(bool whole_run) {
  json ranks = json::array();
  for (auto& r : ranks_) {
    auto rate = whole_run ? r->rates.whole_run(r->w.rank, s_.node) : r->rates.window(r->w.rank, s_.node);
    if (rate) ranks.push_back(to_json(*rate));
  }
  for (auto& [rank, tracker] : heartbeat_rates_) {
    auto rate = whole_run ? tracker.whole_run(rank, -1) : tracker.window(rank, -1);
    if (rate) ranks.push_back(to_json(*rate));
  }
  return {{"node", s_.node}, {"host", s_.host}, {"time_ms", now_ms()}, {"whole_run", whole_run}, {"ranks", ranks}};
}

void Watchdog::publish_rates(Clock::time_point now, bool final) {
  json record = rates_record(final);
  std::vector<RankRate> window;
  for (const json& r : record["ranks"]) {
    if (auto rate = rank_rate_from_json(r)) window.push_back(*rate);
  }
  if (channel_ && !window.empty()) {
    try {
      channel_->publish_rates(record);
      if (!final && channel_->node() == 0) {
        // Node 0 checks the whole job: every node's latest window.
        window.clear();
        for (const auto& [node, rec] : channel_->rates()) {
          if (!rec.contains("ranks") || !rec["ranks"].is_array() || rec.value("whole_run", false)) continue;
          for (const json& r : rec["ranks"]) {
            if (auto rate = rank_rate_from_json(r)) window.push_back(*rate);
          }
        }
      }
    } catch (const std::exception& e) {
      log::warn("ddprun") << "cannot publish step rates: " << e.what();
    }
  }
  if (final || s_.straggler_factor <= 0) return;
  if (channel_ && channel_->node() != 0) return;
  for (const std::string& w : stragglers_.update(window)) log::warn("ddprun") << w;
  (void)now;
}

std::string Watchdog::rates_report() {
  std::vector<RankRate> all;
  if (channel_) {
    if (channel_->node() != 0) return "";
    try {
      for (const auto& [node, rec] : channel_->rates()) {
        if (!rec.contains("ranks") || !rec["ranks"].is_array()) continue;
        for (const json& r : rec["ranks"]) {
          if (auto rate = rank_rate_from_json(r)) all.push_back(*rate);
        }
      }
    } catch (const std::exception& e) {
      log::warn("ddprun") << "cannot read the nodes' step rates: " << e.what();
    }
  } else {
    const json record = rates_record(true);
    for (const json& r : record["ranks"]) {
      if (auto rate = rank_rate_from_json(r)) all.push_back(*rate);
    }
  }
  if (all.empty()) return "";
  return format_rates_table(all, stragglers_.flagged());
}

void Watchdog::run() {
  for (;;) {
    {
      std::unique_lock lock(wake_mutex_);
      if (wake_.wait_for(lock, s_.tick, [this] { return stopping_; })) return;
    }
    const auto now = Clock::now();
    const bool progressed = sample(now);
    if (progressed) last_job_progress_ = now;
    pulse(now, progressed);
    if (now >= next_rates_) {
      publish_rates(now, false);
      next_rates_ = now + s_.rates_period;
    }
    if (s_.hang_timeout.count() > 0 && !hang_handled_ && now - last_job_progress_ >= s_.hang_timeout &&
        (!group_running_ || group_running_())) {
      handle_hang(now);
    }
  }
}

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
  s.python_stack = std::move(stacks.python);
  s.native_stack = std::move(stacks.native);
  s.native_tool = std::move(stacks.native_tool);
  s.problems = std::move(stacks.problems);
  // Every thread, in full, next to the rank's logs.
  s.stack_file = r.w.dir + "/stacks.txt";
  std::ofstream out(s.stack_file, std::ios::trunc);
  out << "rank " << s.rank << " (local_rank " << s.local_rank << ", pid " << s.pid << "), " << s.state << "\n";
  for (const auto& p : s.problems) out << "note: " << p << "\n";
  if (!s.python_stack.empty()) out << "\n== Python (faulthandler, all threads) ==\n" << s.python_stack;
  if (!s.native_stack.empty()) out << "\n== native (" << s.native_tool << ", all threads) ==\n" << s.native_stack;
  out.close();
  if (out) {
    ::chmod(s.stack_file.c_str(), 0600);
    wrote_diagnosis_ = true;
  } else {
    s.stack_file.clear();
  }
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
    v.endpoint = rdzv::format_endpoint(worker_store_->endpoint());
    std::vector<rdzv::ClientInfo> clients;
    worker_store_->with_server([&](rdzv::Server& s) { clients = s.clients(); });
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
  hang_handled_ = true;
  HangDiagnosis d;
  d.program = s_.program;
  d.timeout = s_.hang_timeout;
  d.idle_seconds = secs(now - last_job_progress_);
  d.detector_node = s_.node;
  d.detector_host = s_.host;
  d.detected_at = std::chrono::system_clock::now();
  try {
    // Another node may have claimed it first: this node's part then goes with the next pulse.
    if (channel_ && !channel_->claim_hang()) return;
    contributed_ = true;
  } catch (const std::exception& e) {
    log::warn("ddprun") << "hang watchdog: cannot reach the rendezvous store (" << e.what() << ")";
    channel_.reset();
  }
  log::warn("ddprun") << "no rank made progress for " << static_cast<int>(d.idle_seconds)
                      << " s (--hang_timeout " << seconds_text(s_.hang_timeout) << "): capturing every rank's stacks";
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
  RankStacks stacks = capture_stacks(t.pid, main_pid, tree, s_.python_stacks ? r->w.dir : std::string(), s_.stack_limit);
  const std::string file = r->w.dir + "/timer_stacks.txt";
  {
    std::ofstream out(file, std::ios::trunc);
    out << "torchelastic timer '" << t.scope << "' of pid " << t.pid << " expired (expiration_time " << when << ")\n";
    for (const auto& p : stacks.problems) out << "note: " << p << "\n";
    if (!stacks.python.empty()) out << "\n== Python (faulthandler, all threads) ==\n" << stacks.python;
    if (!stacks.native.empty()) out << "\n== native (" << stacks.native_tool << ", all threads) ==\n" << stacks.native;
  }
  ::chmod(file.c_str(), 0600);
  wrote_diagnosis_ = true;
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

}  // namespace ddprun::launcher
