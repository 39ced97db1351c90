#include "launcher/top/top_table.hpp"

#include <cstdio>
#include <sstream>
#include <vector>

namespace ddprun::launcher::top {

using json = nlohmann::json;

namespace {

std::string seconds(double s) {
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%.1f s", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%d min %02d s", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%d h %02d min", static_cast<int>(s) / 3600, static_cast<int>(s) % 3600 / 60);
  }
  return buf;
}

std::string number(const json& v, const char* format) {
  if (!v.is_number()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, format, v.get<double>());
  return buf;
}

// A rank's state in words, as the page says it.
std::string state(const json& r) {
  if (!r.value("alive", false)) return "exited";
  if (r.value("straggler", false)) return "straggler: the others wait for it";
  const double idle = r.value("idle_s", 0.0);
  if (idle >= 30) return "no progress for " + seconds(idle);
  if (r.value("waiting", false)) return "waiting on the others";
  return "computing";
}

std::string fit(std::string line, int width) {
  if (width > 0 && static_cast<int>(line.size()) > width) line.resize(static_cast<size_t>(width));
  return line;
}

}  // namespace

std::string format_table(const json& s, const std::string& where, int width, int height) {
  std::vector<std::string> lines;
  const json& phase = s.contains("phase") && s["phase"].is_object() ? s["phase"] : json::object();
  const std::string run_id = s.value("run_id", "");
  std::ostringstream head;
  head << "ddprun " << (run_id.empty() || run_id == "none" ? "job" : "job " + run_id) << " at " << where << ": "
       << phase.value("name", "?") << " (" << phase.value("detail", "") << ", for "
       << seconds(phase.value("seconds", 0.0)) << ")";
  lines.push_back(head.str());
  std::ostringstream facts;
  facts << "round " << s.value("round", -1) << ", " << s.value("restarts", 0) << " restart(s), "
        << s.value("workers_alive", 0) << " of " << s.value("ranks_here", 0) << " worker(s) alive";
  if (s.value("nodes", 1) > 1) facts << " on node " << s.value("node", 0) << " of " << s.value("nodes", 1);
  if (s.value("world_size", 0) > 0) facts << ", world size " << s.value("world_size", 0);
  facts << ", " << s.value("stragglers", 0) << " straggler(s)";
  lines.push_back(facts.str());
  lines.emplace_back("");
  char row[256];
  std::snprintf(row, sizeof row, "%6s %5s %10s %11s %8s %11s  %s", "RANK", "NODE", "STEP", "STEP TIME", "STEPS/S",
                "SINCE PROG", "STATE");
  lines.emplace_back(row);
  const json& ranks = s.contains("ranks") && s["ranks"].is_array() ? s["ranks"] : json::array();
  const size_t room =
      height > 0 ? static_cast<size_t>(std::max(1, height - static_cast<int>(lines.size()) - 1)) : ranks.size();
  size_t shown = 0;
  for (const json& r : ranks) {
    if (shown == room) break;
    const int node = r.value("node", -1);
    std::snprintf(
        row, sizeof row, "%6d %5d %10llu %11s %8s %11s  %s", r.value("rank", -1), node < 0 ? 0 : node,
        static_cast<unsigned long long>(r.value("step", 0ULL)),
        (number(r.value("step_ms", json()), "%.1f") + (r.value("step_ms", json()).is_number() ? " ms" : "")).c_str(),
        number(r.value("steps_per_s", json()), "%.2f").c_str(), seconds(r.value("idle_s", 0.0)).c_str(),
        state(r).c_str());
    lines.emplace_back(row);
    ++shown;
  }
  const size_t more = ranks.size() - shown + s.value("ranks_not_listed", size_t{0});
  if (more > 0)
    lines.push_back("... " + std::to_string(more) + " more rank(s), those the others wait for listed first");
  std::string out;
  for (const auto& l : lines) out += fit(l, width) + "\n";
  return out;
}

}  // namespace ddprun::launcher::top
