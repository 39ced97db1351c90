#include "rendezvous/status.hpp"

#include <map>
#include <algorithm>
#include <chrono>
#include <regex>

namespace ddprun::rdzv {

using json = nlohmann::json;

json store_status(Client& client) {
  const std::vector<std::string> keys = client.list();
  // run_id -> round -> key names under that round
  std::map<std::string, std::map<int, std::vector<std::string>>> jobs;
  static const std::regex pattern("^/ddprun/(.+)/r([0-9]+)/(.+)$");
  for (const auto& k : keys) {
    std::smatch m;
    if (std::regex_match(k, m, pattern)) jobs[m[1]][std::stoi(m[2])].push_back(m[3]);
  }
  json out = {{"endpoint", client.endpoint()}, {"keys", keys.size()}, {"jobs", json::array()}};
  for (const auto& [run_id, rounds] : jobs) {
    // The latest round that has members (a just-opened round may hold only counters).
    auto it = rounds.rbegin();
    while (std::next(it) != rounds.rend() &&
           std::none_of(it->second.begin(), it->second.end(), [](const std::string& n) {
             return n.rfind("node/", 0) == 0 || n.rfind("member/", 0) == 0;
           })) {
      ++it;
    }
    const auto& [round, names] = *it;
    const std::string prefix = "/ddprun/" + run_id + "/r" + std::to_string(round) + "/";
    // Static jobs record node/<node_rank>; dynamic ones member/<arrival> (+ assign/<arrival>).
    std::vector<std::string> node_keys;
    for (const auto& n : names) {
      if (n.rfind("node/", 0) == 0 || n.rfind("member/", 0) == 0) node_keys.push_back(prefix + n);
    }
    json job = {{"run_id", run_id}, {"round", round}, {"nodes", json::array()}};
    int world = 0, nnodes = 0;
    if (!node_keys.empty()) {
      const auto values = client.multi_get(node_keys, std::chrono::seconds(5));
      for (size_t i = 0; i < values.size(); ++i) {
        auto info = json::parse(values[i], nullptr, false);
        if (!info.is_object()) continue;
        const std::string id = node_keys[i].substr(node_keys[i].rfind('/') + 1);
        if (node_keys[i].find("/member/") != std::string::npos) {
          info["arrival"] = std::stoi(id);
          if (client.check({prefix + "assign/" + id})) {
            const auto a = json::parse(client.get(prefix + "assign/" + id), nullptr, false);
            if (a.is_object() && a.contains("group_rank")) info["node_rank"] = a["group_rank"];
          }
        } else {
          info["node_rank"] = std::stoi(id);
        }
        // Heartbeats: a counter, and the wall-clock time (the node's clock) of the last one.
        const std::string hb = "/ddprun/" + run_id + "/hb/" + info.value("agent", "");
        if (client.check({hb})) {
          info["heartbeats"] = client.add(hb, 0);
          if (client.check({hb + "/time"})) {
            const int64_t last = std::stoll(client.get(hb + "/time"));
            info["last_heartbeat_ms"] = last;
            info["last_heartbeat_age_s"] =
                (std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::system_clock::now().time_since_epoch()).count() - last) / 1000.0;
          }
        }
        world += info.value("nproc", 0);
        nnodes = info.value("nnodes", nnodes);
        job["nodes"].push_back(info);
      }
    }
    auto has = [&](const char* name) { return std::find(names.begin(), names.end(), name) != names.end(); };
    job["nnodes"] = nnodes;
    job["joined"] = job["nodes"].size();
    job["world_size"] = world;
    if (has("worker_store")) job["worker_store"] = json::parse(client.get(prefix + "worker_store"), nullptr, false);
    if (has("end")) {
      const std::string end = client.get(prefix + "end");
      if (end == "success") {
        job["state"] = "succeeded";
      } else if (end.rfind("signal:", 0) == 0) {
        job["state"] = "stopped";
        job["end"] = end.substr(7);
      } else {
        job["state"] = "failed";
        job["end"] = json::parse(end, nullptr, false);
      }
    } else {
      job["state"] = has("complete") ? "running" : "joining";
    }
    out["jobs"].push_back(job);
  }
  return out;
}

}  // namespace ddprun::rdzv
