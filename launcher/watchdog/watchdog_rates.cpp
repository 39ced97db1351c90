// The watchdog's step rates: this node's record, publishing it, the straggler check (node 0)
// and the table printed at the end.
#include "launcher/watchdog/watchdog.hpp"

#include "common/log.hpp"
#include "launcher/rendezvous/rendezvous_values.hpp"  // now_ms
#include "launcher/watchdog/watchdog_parts.hpp"

namespace ddprun::launcher {

using json = nlohmann::json;
using watchdog_detail::Clock;

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

}  // namespace ddprun::launcher
