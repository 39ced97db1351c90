#include "launcher/watchdog/step_rates.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace ddprun::launcher::watchdog {

using json = nlohmann::json;

void RateTracker::sample(std::chrono::steady_clock::time_point now, uint64_t steps, uint64_t wait_ns,
                         bool reports_waits) {
  const Reading r{now, steps, wait_ns};
  if (!first_) first_ = r;
  if (!window_start_) window_start_ = r;
  last_ = r;
  reports_waits_ = reports_waits_ || reports_waits;
}

std::optional<RankRate> RateTracker::between(const Reading& a, const Reading& b, int rank, int node, bool waits) {
  const double secs = std::chrono::duration<double>(b.at - a.at).count();
  if (b.steps <= a.steps || secs <= 0) return std::nullopt;
  RankRate r;
  r.rank = rank;
  r.node = node;
  r.steps = b.steps - a.steps;
  r.seconds = secs;
  r.steps_per_second = static_cast<double>(r.steps) / secs;
  if (waits) {
    const double waited = std::min(secs, static_cast<double>(b.wait_ns - std::min(b.wait_ns, a.wait_ns)) / 1e9);
    r.wait_fraction = waited / secs;
    r.compute_ms_per_step = (secs - waited) * 1000.0 / static_cast<double>(r.steps);
  }
  return r;
}

std::optional<RankRate> RateTracker::window(int rank, int node) {
  if (!window_start_ || !last_) return std::nullopt;
  auto r = between(*window_start_, *last_, rank, node, reports_waits_);
  window_start_ = last_;
  return r;
}

std::optional<RankRate> RateTracker::whole_run(int rank, int node) const {
  if (!first_ || !last_) return std::nullopt;
  auto r = between(*first_, *last_, rank, node, reports_waits_);
  if (r) r->steps = last_->steps;  // the total, not the difference from the first reading
  return r;
}

std::vector<std::string> StragglerWatch::update(const std::vector<RankRate>& window) {
  std::vector<std::string> warnings;
  const std::vector<int> slow = slower_than_median(window, factor_);
  for (auto it = count_.begin(); it != count_.end();) {
    it = std::find(slow.begin(), slow.end(), it->first) == slow.end() ? count_.erase(it) : std::next(it);
  }
  std::vector<double> compute;
  for (const auto& r : window) {
    if (r.compute_ms_per_step) compute.push_back(*r.compute_ms_per_step);
  }
  std::sort(compute.begin(), compute.end());
  for (int rank : slow) {
    if (++count_[rank] < strikes_ || warned_.count(rank)) continue;
    warned_.insert(rank);
    const auto r = std::find_if(window.begin(), window.end(), [&](auto& x) { return x.rank == rank; });
    std::ostringstream w;
    w.precision(1);
    w << std::fixed << "rank " << rank << (r->node >= 0 ? " (node " + std::to_string(r->node) + ")" : "")
      << " is a straggler: ";
    if (r->compute_ms_per_step && !compute.empty()) {
      const double median = compute[(compute.size() - 1) / 2];
      w << *r->compute_ms_per_step << " ms of compute per step against " << median << " ms for the median rank ("
        << *r->compute_ms_per_step / median << "x), in " << strikes_
        << " windows in a row; the other ranks spend the difference waiting for it";
    } else {
      w << r->steps_per_second << " steps/s, slower than the median rank by more than " << factor_ << "x in "
        << strikes_ << " windows in a row";
    }
    warnings.push_back(w.str());
  }
  return warnings;
}

std::string format_rates_table(std::vector<RankRate> rates, const std::set<int>& flagged) {
  std::sort(rates.begin(), rates.end(), [](auto& a, auto& b) { return a.rank < b.rank; });
  std::ostringstream out;
  out << "per-rank step rates (whole run):\n";
  char line[160];
  std::snprintf(line, sizeof line, "  %6s %5s %10s %9s %16s %7s\n", "rank", "node", "steps", "steps/s",
                "compute ms/step", "in comms");
  out << line;
  for (const auto& r : rates) {
    char compute[32] = "-", wait[16] = "-";
    if (r.compute_ms_per_step) {
      std::snprintf(compute, sizeof compute, "%.1f", *r.compute_ms_per_step);
      std::snprintf(wait, sizeof wait, "%.0f%%", r.wait_fraction * 100);
    }
    std::snprintf(line, sizeof line, "  %6d %5s %10llu %9.2f %16s %7s%s\n", r.rank,
                  r.node >= 0 ? std::to_string(r.node).c_str() : "-", static_cast<unsigned long long>(r.steps),
                  r.steps_per_second, compute, wait, flagged.count(r.rank) ? "  <- straggler" : "");
    out << line;
  }
  return out.str();
}

}  // namespace ddprun::launcher::watchdog
