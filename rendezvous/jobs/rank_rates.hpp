#pragma once
// A rank's step rates as a node publishes them (rates/<K> in a round, every --step_rates_period;
// rendezvous/jobs/job_keys.hpp) and the straggler rules made of them: what the launcher's watchdog
// writes and checks, and what the daemon's job page reads back. Pure.
//
// In synchronous data parallelism every rank completes the same number of steps per second: the
// slow rank sets the pace and the others wait for it in the gradient all-reduce. So the measure
// of a rank's own speed is its compute time per step, its wall time minus the time it spent
// blocked on the others (the SDK measures that wait); a straggler is the rank whose compute time
// per step is well above the others'. For ranks that only count steps (heartbeats), the step rate
// is compared instead.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

namespace ddprun::rdzv::jobs {

struct RankRate {
  int rank = 0;
  int node = -1;
  uint64_t steps = 0;  // in the span (the whole run's figures: in all)
  double seconds = 0;  // the span the figures cover
  double steps_per_second = 0;
  // Compute time per step (wall time not spent waiting on other ranks); nullopt when the rank
  // does not report its waits (heartbeat counters).
  std::optional<double> compute_ms_per_step;
  double wait_fraction = 0;  // of the span, blocked on other ranks
  // The rank as it was when the record was made (absent from older records: nullopt).
  std::optional<uint64_t> step;        // steps completed in all
  std::optional<double> idle_seconds;  // since its latest sign of progress
  std::optional<bool> waiting;         // blocked on other ranks
};

nlohmann::json to_json(const RankRate& r);
// nullopt when `j` is not an object with a rank and a step rate (a record of another version
// reads as far as it goes).
std::optional<RankRate> rank_rate_from_json(const nlohmann::json& j);

// Ranks slower than the lower median of all ranks by more than `factor` (compute time per step
// where every rank reports it, else the step rate). Needs at least two ranks with figures.
std::vector<int> slower_than_median(const std::vector<RankRate>& rates, double factor);

// The ranks a job page marks as stragglers, at once: slower_than_median, and slower than the
// median by at least a tenth of a step's wall time too (the ranks that wait have step times of a
// millisecond or two, and a hiccup of one of them is twice the median without anyone waiting for
// it). Ranks without a compute time per step are not judged.
std::vector<int> marked_stragglers(const std::vector<RankRate>& rates, double factor);

}  // namespace ddprun::rdzv::jobs
