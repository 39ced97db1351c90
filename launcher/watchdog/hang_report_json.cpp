// The hang diagnosis's records as JSON (hang_report.hpp), the form in which the nodes exchange
// them: written whole, read leniently (a field of the wrong type reads as its fallback).
#include <algorithm>

#include "common/numbers.hpp"
#include "launcher/watchdog/hang_report.hpp"
#include "common/json_fields.hpp"

namespace ddprun::launcher::watchdog {

using json = nlohmann::json;

namespace {

double number_field(const json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

bool bool_field(const json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

}  // namespace

json to_json(const NodeDiagnosis& d) {
  json ranks = json::array();
  for (const RankState& r : d.ranks) {
    ranks.push_back({{"rank", r.rank},
                     {"local_rank", r.local_rank},
                     {"pid", r.pid},
                     {"exited", r.exited},
                     {"state", r.state},
                     {"wchan", r.wchan},
                     {"cpu_seconds", r.cpu_seconds},
                     {"reports_progress", r.reports_progress},
                     {"steps", r.steps},
                     {"in_collective", r.in_collective},
                     {"idle_seconds", r.idle_seconds},
                     {"store_endpoints", r.store_endpoints},
                     {"python_stack", r.python_stack},
                     {"native_stack", r.native_stack},
                     {"native_tool", r.native_tool},
                     {"problems", r.problems},
                     {"stack_file", r.stack_file}});
  }
  json j = {{"node", d.node}, {"host", d.host}, {"log_dir", d.log_dir}, {"ranks", ranks}};
  if (d.store) {
    json waits = json::array();
    for (const StoreWait& w : d.store->waits)
      waits.push_back({{"peer", w.peer}, {"keys", w.keys}, {"seconds", w.seconds}});
    json beats = json::object();
    for (const auto& [rank, count] : d.store->heartbeats) beats[std::to_string(rank)] = count;
    j["store"] = {
        {"endpoint", d.store->endpoint}, {"waits", waits}, {"clients", d.store->clients}, {"heartbeats", beats}};
  }
  return j;
}

NodeDiagnosis node_diagnosis_from_json(const json& j) {
  NodeDiagnosis d;
  if (!j.is_object()) return d;
  d.node = static_cast<int>(int_field(j, "node", -1));
  d.host = string_field(j, "host");
  d.log_dir = string_field(j, "log_dir");
  if (auto it = j.find("ranks"); it != j.end() && it->is_array()) {
    for (const json& r : *it) {
      if (!r.is_object()) continue;
      RankState s;
      s.rank = static_cast<int>(int_field(r, "rank", -1));
      s.local_rank = static_cast<int>(int_field(r, "local_rank", -1));
      s.pid = static_cast<pid_t>(int_field(r, "pid", -1));
      s.exited = bool_field(r, "exited");
      s.state = string_field(r, "state");
      s.wchan = string_field(r, "wchan");
      s.cpu_seconds = number_field(r, "cpu_seconds");
      s.reports_progress = bool_field(r, "reports_progress");
      s.steps = static_cast<uint64_t>(std::max<int64_t>(0, int_field(r, "steps", 0)));
      s.in_collective = bool_field(r, "in_collective");
      s.idle_seconds = number_field(r, "idle_seconds");
      s.store_endpoints = strings_field(r, "store_endpoints");
      s.python_stack = string_field(r, "python_stack");
      s.native_stack = string_field(r, "native_stack");
      s.native_tool = string_field(r, "native_tool");
      s.problems = strings_field(r, "problems");
      s.stack_file = string_field(r, "stack_file");
      d.ranks.push_back(std::move(s));
    }
  }
  if (auto it = j.find("store"); it != j.end() && it->is_object()) {
    StoreView v;
    v.endpoint = string_field(*it, "endpoint");
    v.clients = strings_field(*it, "clients");
    if (auto w = it->find("waits"); w != it->end() && w->is_array()) {
      for (const json& x : *w) {
        if (!x.is_object()) continue;
        v.waits.push_back({string_field(x, "peer"), strings_field(x, "keys"), number_field(x, "seconds")});
      }
    }
    if (auto h = it->find("heartbeats"); h != it->end() && h->is_object()) {
      for (const auto& [rank, count] : h->items()) {
        const auto r = to_int(rank);
        if (r && count.is_number_integer()) v.heartbeats[static_cast<int>(*r)] = count.get<int64_t>();
      }
    }
    d.store = std::move(v);
  }
  return d;
}

}  // namespace ddprun::launcher::watchdog
