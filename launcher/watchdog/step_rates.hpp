#pragma once
// Per-rank step rates, from the progress signals (the worker SDK's progress page, or a rank's
// heartbeat counter in the worker store), and the console's straggler warnings made of them (the
// record and the straggler rule are rendezvous/jobs/rank_rates.hpp's). Pure, apart from the clock
// readings it is given.

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "rendezvous/jobs/rank_rates.hpp"

namespace ddprun::launcher::watchdog {

// The record a node publishes (rendezvous/jobs/rank_rates.hpp).
using rdzv::jobs::rank_rate_from_json;
using rdzv::jobs::RankRate;
using rdzv::jobs::slower_than_median;
using rdzv::jobs::to_json;

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
