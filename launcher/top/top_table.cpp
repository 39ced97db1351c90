#include "launcher/top/top_table.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <optional>
#include <sstream>
#include <vector>

#include "common/printable.hpp"

namespace ddprun::launcher::top {

using json = nlohmann::json;

namespace {

// The snapshot comes from a server, which may be anything that answers on the port: every field is
// read with its type checked (a wrong one reads as absent), every figure is clamped to what a
// table shows, and every text is cut and has its control characters shown (common/printable.hpp).

const json* field(const json& j, const char* name) {
  const auto it = j.find(name);  // finds nothing in a non-object
  return it == j.end() ? nullptr : &*it;
}

std::string text(const json& j, const char* name, size_t most) {
  const json* v = field(j, name);
  if (!v || !v->is_string()) return "";
  const std::string& s = v->get_ref<const std::string&>();
  return printable_line(std::string_view(s).substr(0, most)) + (s.size() > most ? "..." : "");
}

int64_t whole(const json& j, const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const json* v = field(j, name);
  if (!v) return fallback;
  if (v->is_number_unsigned()) return std::min<uint64_t>(v->get<uint64_t>(), static_cast<uint64_t>(hi));
  if (v->is_number_integer()) return std::clamp<int64_t>(v->get<int64_t>(), lo, hi);
  return fallback;
}

std::optional<double> figure(const json& j, const char* name) {
  const json* v = field(j, name);
  if (!v || !v->is_number()) return std::nullopt;
  return std::clamp(v->get<double>(), -1e12, 1e12);
}

bool flag(const json& j, const char* name) {
  const json* v = field(j, name);
  return v && v->is_boolean() && v->get<bool>();
}

constexpr int64_t kMaxInt = std::numeric_limits<int>::max();

std::string seconds(double s) {
  s = std::clamp(s, 0.0, 1e9);  // (a figure out of int's range is none a table shows)
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

std::string number(const std::optional<double>& v, const char* format, const char* unit = "") {
  if (!v) return "-";
  char buf[48];
  std::snprintf(buf, sizeof buf, format, *v);
  return buf + std::string(unit);
}

// A rank's state in words, as the page says it.
std::string state(const json& r) {
  if (!flag(r, "alive")) return "exited";
  if (flag(r, "straggler")) return "straggler: the others wait for it";
  const double idle = figure(r, "idle_s").value_or(0.0);
  if (idle >= 30) return "no progress for " + seconds(idle);
  if (flag(r, "waiting")) return "waiting on the others";
  return "computing";
}

std::string fit(std::string line, int width) {
  if (width > 0 && static_cast<int>(line.size()) > width) line.resize(static_cast<size_t>(width));
  return line;
}

}  // namespace

std::string format_table(const json& s, const std::string& where, int width, int height) {
  std::vector<std::string> lines;
  static const json kNone = json::object();
  const json* phase_field = field(s, "phase");
  const json& phase = phase_field && phase_field->is_object() ? *phase_field : kNone;
  const std::string run_id = text(s, "run_id", 128);
  const std::string phase_name = text(phase, "name", 32);
  std::ostringstream head;
  head << "ddprun " << (run_id.empty() || run_id == "none" ? "job" : "job " + run_id) << " at " << where << ": "
       << (phase_name.empty() ? "?" : phase_name) << " (" << text(phase, "detail", 200) << ", for "
       << seconds(figure(phase, "seconds").value_or(0.0)) << ")";
  lines.push_back(head.str());
  std::ostringstream facts;
  const int64_t nodes = whole(s, "nodes", 1, 0, kMaxInt);
  const int64_t world_size = whole(s, "world_size", 0, 0, kMaxInt);
  facts << "round " << whole(s, "round", -1, -1, kMaxInt) << ", " << whole(s, "restarts", 0, 0, kMaxInt)
        << " restart(s), " << whole(s, "workers_alive", 0, 0, kMaxInt) << " of "
        << whole(s, "ranks_here", 0, 0, kMaxInt) << " worker(s) alive";
  if (nodes > 1) facts << " on node " << whole(s, "node", 0, -1, kMaxInt) << " of " << nodes;
  if (world_size > 0) facts << ", world size " << world_size;
  facts << ", " << whole(s, "stragglers", 0, 0, kMaxInt) << " straggler(s)";
  lines.push_back(facts.str());
  lines.emplace_back("");
  char row[256];
  std::snprintf(row, sizeof row, "%6s %5s %10s %11s %8s %11s  %s", "RANK", "NODE", "STEP", "STEP TIME", "STEPS/S",
                "SINCE PROG", "STATE");
  lines.emplace_back(row);
  static const json kNoRanks = json::array();
  const json* ranks_field = field(s, "ranks");
  const json& ranks = ranks_field && ranks_field->is_array() ? *ranks_field : kNoRanks;
  const size_t room =
      height > 0 ? static_cast<size_t>(std::max(1, height - static_cast<int>(lines.size()) - 1)) : ranks.size();
  size_t shown = 0;
  for (const json& r : ranks) {
    if (shown == room) break;
    std::snprintf(row, sizeof row, "%6lld %5lld %10llu %11s %8s %11s  %s",
                  static_cast<long long>(whole(r, "rank", -1, -1, kMaxInt)),
                  static_cast<long long>(whole(r, "node", 0, 0, kMaxInt)),
                  static_cast<unsigned long long>(whole(r, "step", 0, 0, std::numeric_limits<int64_t>::max())),
                  number(figure(r, "step_ms"), "%.1f", " ms").c_str(), number(figure(r, "steps_per_s"), "%.2f").c_str(),
                  seconds(figure(r, "idle_s").value_or(0.0)).c_str(), state(r).c_str());
    lines.emplace_back(row);
    ++shown;
  }
  const auto more = static_cast<uint64_t>(ranks.size() - shown) +
                    static_cast<uint64_t>(whole(s, "ranks_not_listed", 0, 0, std::numeric_limits<int64_t>::max()));
  if (more > 0)
    lines.push_back("... " + std::to_string(more) + " more rank(s), those the others wait for listed first");
  std::string out;
  for (const auto& l : lines) out += fit(l, width) + "\n";
  return out;
}

}  // namespace ddprun::launcher::top
