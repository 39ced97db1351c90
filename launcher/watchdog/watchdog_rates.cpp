// The watchdog's step rates: this node's record, publishing it, the straggler check (node 0)
// and the table printed at the end.
#include "launcher/watchdog/watchdog.hpp"

#include <cmath>

#include "common/log.hpp"
#include "common/system.hpp"
#include "launcher/watchdog/rank_state.hpp"

namespace ddprun::launcher::watchdog {

using json = nlohmann::json;
using watchdog_detail::Clock;

json Watchdog::rates_record(bool whole_run) {
  json ranks = json::array();
  const auto now = Clock::now();
  for (auto& r : ranks_) {
    auto rate = whole_run ? r->rates.whole_run(r->w.rank, s_.node) : r->rates.window(r->w.rank, s_.node);
    if (!rate) continue;
    // The rank as it is now, for the daemon's job page.
    rate->step = r->steps;
    rate->waiting = r->waiting;
    if (r->last_progress != Clock::time_point{}) {
      rate->idle_seconds = std::round(std::chrono::duration<double>(now - r->last_progress).count() * 10) / 10;
    }
    ranks.push_back(to_json(*rate));
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
  if (channel_ && !channel_down_ && !window.empty()) {
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

FinalRates Watchdog::final_rates() {
  FinalRates out;
  out.stragglers = stragglers_.flagged();
  auto add_all = [&out](const json& record) {
    if (!record.contains("ranks") || !record["ranks"].is_array()) return;
    for (const json& r : record["ranks"]) {
      if (auto rate = rank_rate_from_json(r)) out.ranks.push_back(*rate);
    }
  };
  if (channel_ && channel_->node() == 0) {
    try {
      for (const auto& [node, rec] : channel_->rates()) add_all(rec);
      out.job_wide = true;
      return out;
    } catch (const std::exception& e) {
      log::warn("ddprun") << "cannot read the nodes' step rates: " << e.what() << "; this node's only";
      out.ranks.clear();
    }
  }
  add_all(rates_record(true));
  out.job_wide = !channel_;
  return out;
}

}  // namespace ddprun::launcher::watchdog
