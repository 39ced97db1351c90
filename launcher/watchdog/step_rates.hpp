#pragma once
// Per-rank step rates, from the progress signals (the worker SDK's progress page, or a rank's
// heartbeat counter in the worker store), and the straggler check made of them.
//
// In synchronous data parallelism every rank completes the same number of steps per second: the
// slow rank sets the pace and the others wait for it in the gradient all-reduce. So the measure
// of a rank's own speed is its compute time per step, its wall time minus the time it spent
// blocked on the others (the SDK measures that wait); a straggler is the rank whose compute time
// per step is well above the others'. For ranks that only count steps (heartbeats), the step rate
// is compared instead. Pure, apart from the clock readings it is given.

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace ddprun::launcher::watchdog {

struct RankRate {
  int rank = 0;
  int node = -1;
  uint64_t steps = 0;
  double seconds = 0;  // the span the figures cover
  double steps_per_second = 0;
  // Compute time per step (wall time not spent waiting on other ranks); nullopt when the rank
  // does not report its waits (heartbeat counters).
  std::optional<double> compute_ms_per_step;
  double wait_fraction = 0;  // of the span, blocked on other ranks
};

nlohmann::json to_json(const RankRate& r);
std::optional<RankRate> rank_rate_from_json(const nlohmann::json& j);

// One rank's counters over time.
class RateTracker {
 public:
  // A reading of the rank's counters at `now`.
  void sample(std::chrono::steady_clock::time_point now, uint64_t steps, uint64_t wait_ns, bool reports_waits);
  bool started() const { return first_.has_value(); }
  // Figures since the previous window() call (the first call: since the first sample); nullopt
  // until a step was completed in the span.
  std::optional<RankRate> window(int rank, int node);
  // Figures over the whole run.
  std::optional<RankRate> whole_run(int rank, int node) const;

 private:
  struct Reading {
    std::chrono::steady_clock::time_point at;
    uint64_t steps = 0;
    uint64_t wait_ns = 0;
  };
  static std::optional<RankRate> between(const Reading& a, const Reading& b, int rank, int node, bool waits);
  std::optional<Reading> first_, window_start_, last_;
  bool reports_waits_ = false;
};

// Ranks slower than the lower median of all ranks by more than `factor` (compute time per step
// where every rank reports it, else the step rate). Needs at least two ranks with figures.
std::vector<int> slower_than_median(const std::vector<RankRate>& rates, double factor);

// Warns about a rank only when it is slow in `strikes` windows in a row, and once per run.
class StragglerWatch {
 public:
  StragglerWatch(double factor, int strikes) : factor_(factor), strikes_(strikes) {}
  // The warnings this window brings (one line each).
  std::vector<std::string> update(const std::vector<RankRate>& window);
  const std::set<int>& flagged() const { return warned_; }

 private:
  double factor_;
  int strikes_;
  std::map<int, int> count_;
  std::set<int> warned_;
};

// The step rates at the end of a round: every rank of the job (one node, or node 0 of several),
// else this node's ranks; `stragglers` are the ranks warned about.
struct FinalRates {
  std::vector<RankRate> ranks;
  std::set<int> stragglers;
  bool job_wide = false;
};

// The end-of-run table: one line per rank; the ranks in `flagged` are marked.
std::string format_rates_table(std::vector<RankRate> rates, const std::set<int>& flagged);

}  // namespace ddprun::launcher::watchdog
