#include "rendezvous/status.hpp"

#include <map>
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
    const auto& [round, names] = *rounds.rbegin();
    const std::string prefix = "/ddprun/" + run_id + "/r" + std::to_string(round) + "/";
    std::vector<std::string> node_keys;
    for (const auto& n : names) {
      if (n.rfind("node/", 0) == 0) node_keys.push_back(prefix + n);
    }
    json job = {{"run_id", run_id}, {"round", round}, {"nodes", json::array()}};
    int world = 0, nnodes = 0;
    if (!node_keys.empty()) {
      const auto values = client.multi_get(node_keys, std::chrono::seconds(5));
      for (size_t i = 0; i < values.size(); ++i) {
        auto info = json::parse(values[i], nullptr, false);
        if (!info.is_object()) continue;
        info["node_rank"] = std::stoi(node_keys[i].substr(node_keys[i].rfind('/') + 1));
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
