#include "rendezvous/jobs/records.hpp"

#include <algorithm>

#include "common/json_fields.hpp"

namespace ddprun::rdzv::jobs {

using json = nlohmann::json;

namespace {

// An int field; out of int's range reads as the fallback.
int small_int_of(const json& j, const char* name, int otherwise) {
  const int64_t v = int_field(j, name, otherwise);
  return v < INT32_MIN || v > INT32_MAX ? otherwise : static_cast<int>(v);
}

}  // namespace

json to_json(const NodeRecord& r) {
  json j = {{"host", r.host}, {"addr", r.addr},     {"nproc", r.nproc},
            {"pid", r.pid},   {"nnodes", r.nnodes}, {"joined_ms", r.joined_ms}};
  if (!r.agent.empty()) j["agent"] = r.agent;
  if (r.hint >= 0) j["hint"] = r.hint;
  if (r.store_host) j["store_host"] = true;
  if (r.restarts > 0) j["restarts"] = r.restarts;
  if (r.role != "default") j["role"] = r.role;
  return j;
}

std::string encode(const NodeRecord& r) { return to_json(r).dump(); }

std::optional<NodeRecord> node_record_from_json(const json& j) {
  if (!j.is_object()) return std::nullopt;
  NodeRecord r;
  r.host = string_field(j, "host");
  r.addr = string_field(j, "addr");
  r.agent = string_field(j, "agent");
  r.nproc = small_int_of(j, "nproc", 0);
  r.pid = small_int_of(j, "pid", 0);
  r.nnodes = small_int_of(j, "nnodes", 0);
  r.joined_ms = int_field(j, "joined_ms", 0);
  r.hint = small_int_of(j, "hint", -1);
  r.store_host = bool_field(j, "store_host");
  r.restarts = small_int_of(j, "restarts", 0);
  if (const std::string role = string_field(j, "role"); !role.empty()) r.role = role;
  return r;
}

std::optional<NodeRecord> decode_node_record(std::string_view text) {
  return node_record_from_json(json::parse(text, nullptr, false));
}

std::string encode(const WorkerStoreRecord& r) {
  json j = {{"addr", r.addr}, {"port", r.port}};
  if (!r.key.empty()) j["key"] = r.key;
  return j.dump();
}

std::optional<WorkerStoreRecord> decode_worker_store(std::string_view text) {
  const json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return std::nullopt;
  WorkerStoreRecord r{string_field(j, "addr"), small_int_of(j, "port", 0), string_field(j, "key")};
  if (r.addr.empty() || r.port <= 0 || r.port > 65535) return std::nullopt;
  return r;
}

std::string encode(const Assignment& a) {
  json j = {{"group_rank", a.group_rank},
            {"group_world_size", a.group_world_size},
            {"offset", a.offset},
            {"world_size", a.world_size}};
  if (!a.agents.empty()) j["agents"] = a.agents;
  if (!a.hosts.empty()) j["hosts"] = a.hosts;
  if (!a.addrs.empty()) j["addrs"] = a.addrs;
  if (a.restarts > 0) j["restarts"] = a.restarts;
  if (a.role_offset >= 0) {
    j["role_offset"] = a.role_offset;
    j["role_world_size"] = a.role_world_size;
  }
  return j.dump();
}

std::optional<Assignment> decode_assignment(std::string_view text) {
  const json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return std::nullopt;
  Assignment a;
  a.group_rank = small_int_of(j, "group_rank", -1);
  a.group_world_size = small_int_of(j, "group_world_size", 0);
  a.offset = small_int_of(j, "offset", -1);
  a.world_size = small_int_of(j, "world_size", 0);
  a.restarts = small_int_of(j, "restarts", 0);
  if (a.group_rank < 0 || a.group_world_size <= 0 || a.offset < 0 || a.world_size <= 0) return std::nullopt;
  a.role_offset = std::max(small_int_of(j, "role_offset", -1), -1);
  a.role_world_size = std::max(small_int_of(j, "role_world_size", 0), 0);
  a.agents = strings_field(j, "agents");
  a.hosts = strings_field(j, "hosts");
  a.addrs = strings_field(j, "addrs");
  return a;
}

std::string encode(const ClosedRound& c) {
  json list = json::array();
  for (const auto& m : c.members) list.push_back(to_json(m));
  return json{{"members", std::move(list)}}.dump();
}

std::optional<ClosedRound> decode_closed_round(std::string_view text) {
  const json j = json::parse(text, nullptr, false);
  auto it = j.is_object() ? j.find("members") : j.end();
  if (it == j.end() || !it->is_array()) return std::nullopt;
  ClosedRound c;
  for (const auto& m : *it) {
    auto r = node_record_from_json(m);
    if (!r) return std::nullopt;
    c.members.push_back(std::move(*r));
  }
  return c;
}

}  // namespace ddprun::rdzv::jobs
