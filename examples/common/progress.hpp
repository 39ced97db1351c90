#pragma once
// An epoch's progress, on rank 0's stdout. On a terminal, a bar that redraws itself in place (at
// most ten times a second) and is erased when the epoch ends, before its summary line. Anywhere
// else (a pipe, a file, ddprun's console, which takes whole lines and prefixes each with the rank)
// a plain line at each quarter of the epoch, and at least once a minute on a long one. Nothing
// with --no-progress or on the other ranks.
//   progress: epoch 1/3 50% (469/938 steps), 2.1 s, about 2.1 s left

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace ddprun::examples {

class EpochProgress {
 public:
  using Clock = std::chrono::steady_clock;

  // `steps`: the epoch's steps (0: unknown; nothing is shown).
  EpochProgress(bool show, int epoch, int epochs, int64_t steps)
      : show_(show && steps > 0), epoch_(epoch), epochs_(epochs), steps_(steps), terminal_(::isatty(1) == 1) {}
  ~EpochProgress() { finish(); }
  EpochProgress(const EpochProgress&) = delete;
  EpochProgress& operator=(const EpochProgress&) = delete;

  // `done` steps of the epoch are done.
  void update(int64_t done) {
    if (!show_) return;
    const auto now = Clock::now();
    if (terminal_) {
      if (done < steps_ && now - last_ < std::chrono::milliseconds(100)) return;
      last_ = now;
      std::printf("\r%s\033[K", line(done, now, /*bar=*/true).c_str());
      std::fflush(stdout);
      drawn_ = true;
      return;
    }
    const int64_t quarter = done * 4 / steps_;
    if (done >= steps_ || (quarter <= quarter_ && now - last_ < std::chrono::minutes(1))) return;
    quarter_ = std::max(quarter_, quarter);
    last_ = now;
    std::printf("%s\n", line(done, now, /*bar=*/false).c_str());
    std::fflush(stdout);
  }

  // Erases the bar (a terminal), so that the epoch's summary line starts on a clean line.
  void finish() {
    if (!drawn_) return;
    std::printf("\r\033[K");
    std::fflush(stdout);
    drawn_ = false;
  }

 private:
  std::string line(int64_t done, Clock::time_point now, bool bar) const {
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double fraction = static_cast<double>(done) / static_cast<double>(steps_);
    std::string drawn;
    if (bar) {
      constexpr int kWidth = 30;
      const int full = static_cast<int>(fraction * kWidth);
      drawn = "[" + std::string(static_cast<size_t>(full), '#') + std::string(static_cast<size_t>(kWidth - full), '.') +
              "] ";
    }
    char text[200];
    std::snprintf(text, sizeof text, "progress: epoch %d/%d %s%.0f%% (%lld/%lld steps), %.1f s", epoch_ + 1, epochs_,
                  drawn.c_str(), fraction * 100, static_cast<long long>(done), static_cast<long long>(steps_), elapsed);
    std::string out = text;
    if (done > 0 && done < steps_) {
      std::snprintf(text, sizeof text, ", about %.1f s left", elapsed / fraction - elapsed);
      out += text;
    }
    return out;
  }

  bool show_;
  int epoch_, epochs_;
  int64_t steps_;
  bool terminal_;
  bool drawn_ = false;
  int64_t quarter_ = 0;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_ = start_;
};

}  // namespace ddprun::examples
