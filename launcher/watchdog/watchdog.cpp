#include "launcher/watchdog/watchdog.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.hpp"
#include "common/procfs.hpp"
#include "common/unique_fd.hpp"
#include "launcher/watchdog/rank_state.hpp"

namespace ddprun::launcher::watchdog {

using rendezvous::ProgressChannel;
using rendezvous::RoundEnd;

using json = nlohmann::json;
using watchdog_detail::Clock;
using watchdog_detail::secs;
using worker::ProgressPage;

namespace {

// CPU time counts as progress from this share of one core over the window up.
constexpr double kBusyShare = 0.02;

// The rank's progress page, a file in its directory that the worker maps too. Its blocks are
// reserved before it is mapped: a page of a sparse file on a full file system would kill the first
// process that writes to it (ddprun included) with SIGBUS. nullptr, with why set, when it cannot be.
ProgressPage* map_progress_page(const std::string& file, std::string& why) {
  UniqueFd fd(::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd) {
    why = "cannot create " + file + ": " + std::strerror(errno);
    return nullptr;
  }
  // posix_fallocate returns the error rather than setting errno.
  if (const int err = ::posix_fallocate(fd.get(), 0, ProgressPage::kFileSize); err != 0) {
    fd.reset();
    ::unlink(file.c_str());
    why =
        "cannot reserve " + std::to_string(ProgressPage::kFileSize) + " bytes for " + file + ": " + std::strerror(err);
    return nullptr;
  }
  void* p = ::mmap(nullptr, ProgressPage::kFileSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  const int err = errno;
  fd.reset();  // (the mapping holds the file)
  if (p == MAP_FAILED) {
    ::unlink(file.c_str());
    why = "cannot map " + file + ": " + std::strerror(err);
    return nullptr;
  }
  auto* page = static_cast<ProgressPage*>(p);
  page->magic.store(ProgressPage::kMagic, std::memory_order_release);
  return page;
}

}  // namespace

Watchdog::Watchdog(WatchdogSettings settings, std::vector<WatchedRank> ranks) : s_(std::move(settings)) {
  stragglers_ = StragglerWatch(s_.straggler_factor, 3);
  for (auto& w : ranks) {
    auto r = std::make_unique<Rank>();
    r->w = std::move(w);
    const std::string file = r->w.dir + "/progress";
    std::string why;
    r->page = map_progress_page(file, why);
    if (r->page) {
      r->progress_file = file;
    } else {
      // A full disk, say: the rank runs without a page, and its hang detection goes on from its
      // CPU time and its store traffic.
      log::warn("ddprun") << "rank " << r->w.rank << " runs without a progress page: " << why
                          << "; its hang detection goes on from its CPU time and store traffic";
    }
    ranks_.push_back(std::move(r));
  }
  copy_membership();  // before any worker reads it
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

std::optional<uint64_t> Watchdog::iterations() const {
  uint64_t most = 0;
  for (const auto& r : ranks_) {
    if (r->page) most = std::max(most, r->page->iterations.load(std::memory_order_relaxed));
  }
  if (most == 0) return std::nullopt;
  return most;
}

void Watchdog::start(const std::vector<pid_t>& pids, rdzv::server::ServerThread* worker_store,
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
    tap_ = std::make_unique<StoreTap>(s_.world_size);
    worker_store_->with_server([this](rdzv::server::Server& s) { s.store().set_observer(tap_.get()); });
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
    worker_store_->with_server([](rdzv::server::Server& s) { s.store().set_observer(nullptr); });
    if (const uint64_t ignored = tap_->ignored.load(std::memory_order_relaxed); ignored > 1) {
      log::warn("ddprun") << "ignored " << ignored << " heartbeat keys of ranks outside this round's " << s_.world_size
                          << " in all";
    }
  }
  if (started_) {
    sample(Clock::now());
    if (s_.on_tick) s_.on_tick(Clock::now(), readings());
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
  const auto window =
      std::clamp<Clock::duration>(s_.hang_timeout / 3, std::chrono::seconds(2), std::chrono::seconds(10));
  const uint64_t ticks = procfs::tree_cpu_ticks(procfs::process_tree(r.pid));
  r.cpu.emplace_back(now, ticks);
  while (r.cpu.size() > 2 && now - r.cpu[1].first >= window) r.cpu.erase(r.cpu.begin());
  const auto& [then, before] = r.cpu.front();
  if (now - then < window / 2) return false;  // not enough history yet: the start counts as progress anyway
  const double used =
      static_cast<double>(ticks > before ? ticks - before : 0) / static_cast<double>(procfs::ticks_per_second());
  return used >= kBusyShare * secs(now - then);
}

Watchdog::PageReading Watchdog::read_page(Rank& r, Clock::time_point now) {
  PageReading p;
  // The page outlives the worker: its last counts are read even after it exited.
  if (!r.page) return p;
  const uint64_t beats = r.page->beats.load(std::memory_order_relaxed);
  const uint64_t steps = r.page->steps.load(std::memory_order_relaxed);
  p.waiting = r.page->waiting_since_ns.load(std::memory_order_relaxed) != 0;
  p.moved = beats != r.beats || steps != r.steps;
  r.waiting = p.waiting;
  r.wait_ns = r.page->wait_ns.load(std::memory_order_relaxed);
  r.reports = r.reports || beats > 0 || steps > 0;
  r.beats = beats;
  r.steps = steps;
  if (r.reports && p.moved) {
    // When the last step ended, by the worker's clock (CLOCK_MONOTONIC, steady_clock's): exact
    // rates whatever the sampling period.
    const uint64_t at_ns = r.page->last_step_ns.load(std::memory_order_relaxed);
    const auto at = at_ns ? Clock::time_point(std::chrono::nanoseconds(at_ns)) : now;
    r.last_step = at;
    const uint64_t first_ns = r.page->first_step_ns.load(std::memory_order_relaxed);
    if (!r.rates.started() && first_ns != 0) {
      // The first step is the run's origin, so even a run shorter than a tick has its rate.
      r.rates.sample(Clock::time_point(std::chrono::nanoseconds(first_ns)), 1,
                     r.page->first_step_wait_ns.load(std::memory_order_relaxed), true);
    }
    r.rates.sample(at, steps, r.wait_ns, true);
  }
  return p;
}

std::vector<RankReading> Watchdog::readings() const {
  std::vector<RankReading> out;
  out.reserve(ranks_.size() + heartbeats_seen_.size());
  for (const auto& rp : ranks_) {
    const Rank& r = *rp;
    RankReading x;
    x.rank = r.w.rank;
    x.local_rank = r.w.local_rank;
    x.pid = r.pid;
    x.alive = r.pid > 0 && !r.exited;
    x.reports = r.reports;
    x.reports_waits = r.reports;
    x.steps = r.steps;
    x.wait_ns = r.wait_ns;
    x.waiting = r.waiting && x.alive;
    x.last_step = r.last_step;
    x.last_progress = r.last_progress;
    if (const auto beats = heartbeats_seen_.find(r.w.rank); beats != heartbeats_seen_.end() && !r.reports) {
      x.reports = true;
      x.steps = static_cast<uint64_t>(std::max<int64_t>(beats->second, 0));
    }
    out.push_back(x);
  }
  return out;
}

bool Watchdog::sample_store(Clock::time_point now) {
  bool changed = false;
  const uint64_t changes = tap_->changes.load(std::memory_order_relaxed);
  if (changes != store_changes_) {
    store_changes_ = changes;
    changed = true;
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
  return changed;
}

bool Watchdog::sample(Clock::time_point now) {
  bool progressed = false;
  for (auto& rp : ranks_) {
    Rank& r = *rp;
    if (r.pid <= 0) continue;
    auto [moved, waiting] = read_page(r, now);
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
  if (tap_ && sample_store(now)) progressed = true;
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
    if (channel_down_) {
      // The outage was no idle time of the job: the hang clock goes on from where it stopped,
      // and the other nodes' progress made meanwhile shows in the counter read above.
      channel_down_ = false;
      last_job_progress_ = std::min(now, last_job_progress_ + (now - channel_down_since_));
      log::info("ddprun") << "hang watchdog: the rendezvous store answers again after "
                          << static_cast<int>(secs(now - channel_down_since_)) << " s";
    }
  } catch (const std::exception& e) {
    channel_failed(now, e);
  }
}

void Watchdog::channel_failed(Clock::time_point now, const std::exception& e) {
  if (channel_down_) return;
  channel_down_ = true;
  channel_down_since_ = now;
  log::warn("ddprun") << "hang watchdog: the rendezvous store does not answer (" << e.what()
                      << "); retrying, and no hang is decided until it answers: the other nodes' progress is "
                         "unknown meanwhile";
}

void Watchdog::copy_membership() {
  if (!s_.membership_until_ns) return;
  const uint64_t until = s_.membership_until_ns->load(std::memory_order_acquire);
  for (auto& r : ranks_) {
    if (r->page) r->page->membership_until_ns.store(until, std::memory_order_release);
  }
}

void Watchdog::run() {
  for (;;) {
    {
      std::unique_lock lock(wake_mutex_);
      if (wake_.wait_for(lock, s_.tick, [this] { return stopping_; })) return;
    }
    copy_membership();
    const auto now = Clock::now();
    const bool progressed = sample(now);
    if (progressed) last_job_progress_ = now;
    if (s_.on_tick) s_.on_tick(now, readings());
    pulse(now, progressed);
    if (now >= next_rates_) {
      publish_rates(now, false);
      next_rates_ = now + s_.rates_period;
    }
    if (s_.hang_timeout.count() > 0 && !hang_handled_ && !channel_down_ &&
        now - last_job_progress_ >= s_.hang_timeout && (!group_running_ || group_running_())) {
      handle_hang(now);
    }
  }
}

}  // namespace ddprun::launcher::watchdog
