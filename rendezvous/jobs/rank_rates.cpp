#include "rendezvous/jobs/rank_rates.hpp"

#include <algorithm>

#include "common/json_fields.hpp"

namespace ddprun::rdzv::jobs {

using json = nlohmann::json;

json to_json(const RankRate& r) {
  json j = {{"rank", r.rank},
            {"node", r.node},
            {"steps", r.steps},
            {"seconds", r.seconds},
            {"steps_per_s", r.steps_per_second},
            {"wait_fraction", r.wait_fraction}};
  if (r.compute_ms_per_step) j["compute_ms_per_step"] = *r.compute_ms_per_step;
  if (r.step) j["step"] = *r.step;
  if (r.idle_seconds) j["idle_s"] = *r.idle_seconds;
  if (r.waiting) j["waiting"] = *r.waiting;
  return j;
}

std::optional<RankRate> rank_rate_from_json(const json& j) {
  if (!j.is_object()) return std::nullopt;
  auto number = [&](const char* k) -> std::optional<double> {
    auto it = j.find(k);
    if (it == j.end() || !it->is_number()) return std::nullopt;
    return it->get<double>();
  };
  RankRate r;
  r.rank = static_cast<int>(int_field(j, "rank", -1));
  r.node = static_cast<int>(int_field(j, "node", -1));
  r.steps = static_cast<uint64_t>(std::max<int64_t>(0, int_field(j, "steps", 0)));
  r.seconds = number("seconds").value_or(0);
  auto rate = number("steps_per_s");
  if (r.rank < 0 || !rate) return std::nullopt;
  r.steps_per_second = *rate;
  r.compute_ms_per_step = number("compute_ms_per_step");
  r.wait_fraction = number("wait_fraction").value_or(0);
  if (const auto step = number("step"); step && *step >= 0) r.step = static_cast<uint64_t>(*step);
  if (const auto idle = number("idle_s"); idle && *idle >= 0) r.idle_seconds = *idle;
  if (const auto it = j.find("waiting"); it != j.end() && it->is_boolean()) r.waiting = it->get<bool>();
  return r;
}

std::vector<int> slower_than_median(const std::vector<RankRate>& rates, double factor) {
  if (rates.size() < 2 || factor <= 1.0) return {};
  const bool by_compute =
      std::all_of(rates.begin(), rates.end(), [](auto& r) { return r.compute_ms_per_step.has_value(); });
  // Slowness: higher is slower.
  auto slowness = [&](const RankRate& r) {
    return by_compute ? *r.compute_ms_per_step : (r.steps_per_second > 0 ? 1.0 / r.steps_per_second : 1e300);
  };
  std::vector<double> values;
  for (const auto& r : rates) values.push_back(slowness(r));
  std::sort(values.begin(), values.end());
  const double median = values[(values.size() - 1) / 2];  // the lower median: with two ranks, the faster
  std::vector<int> out;
  if (median <= 0) return out;
  for (const auto& r : rates) {
    if (slowness(r) > factor * median) out.push_back(r.rank);
  }
  return out;
}

std::vector<int> marked_stragglers(const std::vector<RankRate>& rates, double factor) {
  std::vector<RankRate> judged;
  for (const auto& r : rates) {
    if (r.compute_ms_per_step) judged.push_back(r);
  }
  if (factor <= 0 || judged.empty()) return {};
  std::vector<double> times;
  for (const auto& r : judged) times.push_back(*r.compute_ms_per_step);
  std::sort(times.begin(), times.end());
  const double median = times[(times.size() - 1) / 2];
  std::vector<int> out;
  for (const int slow : slower_than_median(judged, factor)) {
    const auto r = std::find_if(judged.begin(), judged.end(), [&](const RankRate& x) { return x.rank == slow; });
    const double wall_ms = r->steps_per_second > 0 ? 1e3 / r->steps_per_second : 0;
    if (*r->compute_ms_per_step - median >= 0.1 * wall_ms) out.push_back(slow);
  }
  return out;
}

}  // namespace ddprun::rdzv::jobs
