#pragma once
// What the watchdog keeps of each rank (Watchdog::Rank: its progress page, beats, steps, CPU time,
// step rates) and the worker store's heartbeats as they change (Watchdog::StoreTap), shared by the
// watchdog's three files: watchdog.cpp (sampling, the job-wide pulse, the loop), watchdog_rates.cpp
// (step rates: publishing, the straggler check, the table) and watchdog_diagnosis.cpp (a hang's
// diagnosis, the torchelastic timer's captures).

#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/log.hpp"
#include "common/numbers.hpp"
#include "common/printable.hpp"
#include "ddprun/worker/progress_page.hpp"
#include "launcher/watchdog/watchdog.hpp"
#include "rendezvous/server/server.hpp"

namespace ddprun::launcher::watchdog::watchdog_detail {

using Clock = std::chrono::steady_clock;

inline double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The rank in a heartbeat key: "<anything>ddprun/progress/<rank>".
inline std::optional<int> heartbeat_rank(std::string_view key) {
  static constexpr std::string_view kMarker = "ddprun/progress/";
  const auto at = key.rfind(kMarker);
  if (at == std::string_view::npos) return std::nullopt;
  const auto digits = key.substr(at + kMarker.size());
  const auto rank = to_int(digits);
  if (!rank || *rank < 0 || *rank > (1 << 24) || digits.empty() || digits[0] == '+') return std::nullopt;
  return static_cast<int>(*rank);
}

}  // namespace ddprun::launcher::watchdog::watchdog_detail

namespace ddprun::launcher::watchdog {

// The worker store's changes, as the watchdog needs them (called on the store's thread). Only the
// round's ranks (0..world_size-1, any when 0) have a heartbeat counter: the others are counted in
// `ignored` and the first of them is logged, so that keys made up for ranks that do not exist
// cost nothing lasting.
class Watchdog::StoreTap final : public rdzv::core::ChangeObserver {
 public:
  explicit StoreTap(int world_size) : world_size_(world_size) {}
  void on_change(std::string_view key, const int64_t* counter) override {
    changes.fetch_add(1, std::memory_order_relaxed);
    const auto rank = watchdog_detail::heartbeat_rank(key);
    if (!rank) return;
    if (world_size_ > 0 && *rank >= world_size_) {
      if (ignored.fetch_add(1, std::memory_order_relaxed) == 0) {
        log::warn("ddprun") << "ignored a heartbeat key of rank " << *rank << " ('"
                            << printable_line(key.substr(0, 200)) << "'): this round's ranks are 0.." << world_size_ - 1
                            << "; heartbeats of other ranks are not counted";
      }
      return;
    }
    std::lock_guard lock(mutex);
    int64_t& beats = heartbeats[*rank];
    beats = counter ? *counter : beats + 1;
  }
  std::atomic<uint64_t> changes{0};
  std::atomic<uint64_t> ignored{0};  // heartbeat keys of ranks outside the round
  std::mutex mutex;
  std::map<int, int64_t> heartbeats;

 private:
  const int world_size_;
};

struct Watchdog::Rank {
  WatchedRank w;
  std::string progress_file;
  worker::ProgressPage* page = nullptr;
  pid_t pid = -1;
  bool exited = false;
  uint64_t beats = 0, steps = 0, wait_ns = 0;
  bool reports = false;  // has written its page
  bool waiting = false;  // blocked on other ranks at the latest reading
  watchdog_detail::Clock::time_point last_step;
  watchdog_detail::Clock::time_point last_progress;
  std::vector<std::pair<watchdog_detail::Clock::time_point, uint64_t>> cpu;  // (time, ticks), oldest first
  RateTracker rates;

  ~Rank() {
    if (page) ::munmap(page, worker::ProgressPage::kFileSize);
  }
};

}  // namespace ddprun::launcher::watchdog
