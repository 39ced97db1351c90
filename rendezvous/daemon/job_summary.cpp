#include "rendezvous/daemon/job_summary.hpp"

#include <algorithm>
#include <map>
#include <optional>

#include "common/numbers.hpp"
#include "rendezvous/core/job_namespace.hpp"
#include "rendezvous/jobs/job_keys.hpp"

namespace ddprun::rdzv::daemon {

using json = nlohmann::json;

namespace {

struct Generation {
  std::map<std::string, std::string> own;                        // gen-level keys
  std::map<int64_t, std::map<std::string, std::string>> rounds;  // round -> name -> value
};

struct Job {
  std::optional<std::string> counter;  // /ddprun/<id>/gen
  std::optional<std::string> refusal;  // /ddprun/<id>/store_refusal: why the store last refused it
  std::map<int64_t, Generation> generations;
};

namespace names_of = jobs::round_names;

bool starts_with(const std::string& name, std::string_view prefix) { return name.rfind(prefix, 0) == 0; }
bool is_member_key(const std::string& name) {
  return starts_with(name, names_of::kNode) || starts_with(name, names_of::kMember);
}
// The value of round key `name`, if present.
const std::string* find(const std::map<std::string, std::string>& names, std::string_view name) {
  auto it = names.find(std::string(name));
  return it == names.end() ? nullptr : &it->second;
}

using RoundNames = std::map<std::string, std::string>;  // a round's key names -> values

// The latest round that has members (a round that has just opened may hold only counters).
const std::pair<const int64_t, RoundNames>* latest_round(const Generation& g) {
  auto it = g.rounds.rbegin();
  while (it != g.rounds.rend() && std::next(it) != g.rounds.rend() &&
         std::none_of(it->second.begin(), it->second.end(), [](const auto& kv) { return is_member_key(kv.first); })) {
    ++it;
  }
  return it == g.rounds.rend() ? nullptr : &*it;
}

// A node's record in the round (a static node or an elastic member), with its node rank, arrival
// and heartbeats added; nullopt (and a line in `skipped`) for a malformed one.
std::optional<json> node_record(const std::string& name, const std::string& value, const RoundNames& names,
                                const Generation& g, int64_t now_ms, const std::string& prefix, json& skipped) {
  json info = json::parse(value, nullptr, false);
  if (!info.is_object()) {
    skipped.push_back({{"key", prefix + name}, {"reason", "the node record is not a JSON object"}});
    return std::nullopt;
  }
  const std::string id = name.substr(name.find('/') + 1);
  const auto number = to_int(id);
  if (!number) {
    skipped.push_back({{"key", prefix + name}, {"reason", "the node number is not a number"}});
    return std::nullopt;
  }
  if (starts_with(name, names_of::kMember)) {
    info["arrival"] = *number;
    if (const std::string* a = find(names, std::string(names_of::kAssign) + id)) {
      const json assigned = json::parse(*a, nullptr, false);
      if (assigned.is_object() && assigned.contains("group_rank")) info["node_rank"] = assigned["group_rank"];
    }
  } else {
    info["node_rank"] = *number;
  }
  // Heartbeats: a counter, and the wall-clock time (the node's clock) of the last one.
  const std::string agent = info.contains("agent") && info["agent"].is_string() ? info["agent"].get<std::string>() : "";
  auto hb = g.own.find(jobs::heartbeat_name(agent));
  if (!agent.empty() && hb != g.own.end()) {
    if (auto beats = to_int(hb->second)) info["heartbeats"] = *beats;
    auto t = g.own.find(jobs::heartbeat_time_name(agent));
    if (t != g.own.end()) {
      if (auto last = to_int(t->second)) {
        info["last_heartbeat_ms"] = *last;
        info["last_heartbeat_age_s"] = static_cast<double>(now_ms - *last) / 1000.0;
      }
    }
  }
  return info;
}

// Step rates, as each node last published them (every 10 s while the job runs).
json step_rates(const RoundNames& names, const std::string& prefix, json& skipped) {
  json rates = json::array();
  for (const auto& [name, value] : names) {
    if (!starts_with(name, names_of::kRates)) continue;
    const json record = json::parse(value, nullptr, false);
    if (!record.is_object() || !record.contains("ranks") || !record["ranks"].is_array()) {
      skipped.push_back({{"key", prefix + name}, {"reason", "the step rates record is not a JSON object with ranks"}});
      continue;
    }
    for (const json& r : record["ranks"]) rates.push_back(r);
  }
  return rates;
}

// The round's state ("joining", "running", or how it ended), with its end, its hang and its
// worker store added to `out`.
std::string round_state(const RoundNames& names, const std::string& prefix, json& out, json& skipped) {
  const std::string* end = find(names, names_of::kEnd);
  if (const std::string* hang = find(names, names_of::kHang); hang && !end) out["hang_diagnosed_by"] = *hang;
  if (const std::string* ws = find(names, names_of::kWorkerStore)) {
    const json store = json::parse(*ws, nullptr, false);
    // Its address alone: a replica group's record also holds the round's key.
    if (store.is_object())
      out["worker_store"] = {{"addr", store.value("addr", json())}, {"port", store.value("port", json())}};
    else skipped.push_back({{"key", prefix + std::string(names_of::kWorkerStore)}, {"reason", "not a JSON object"}});
  }
  if (!end) return find(names, names_of::kComplete) || find(names, names_of::kClosed) ? "running" : "joining";
  const jobs::Outcome o = jobs::decode_outcome(*end);
  switch (o.kind) {
    case jobs::Outcome::Kind::Success: break;
    case jobs::Outcome::Kind::Failure: out["end"] = o.failure.empty() ? json(o.detail) : o.failure; break;
    case jobs::Outcome::Kind::Hang:  // the full report stays in the store; status shows its summary
      out["end"] = {{"detail", o.detail}, {"node", o.node}};
      break;
    case jobs::Outcome::Kind::Signal:
    case jobs::Outcome::Kind::NodeLost:
    case jobs::Outcome::Kind::Membership: out["end"] = o.detail; break;
  }
  return std::string(jobs::state_name(o.kind));
}

// The hosts whose nodes left this run of the job unfit (ddprun --max_unfit_leaves: a failed health
// check, a worker's request), "unfit/<host>/<n>": {host: {"times": N, "last": why}}, the last
// being the highest n's reason (after the writer's id and a newline).
json unfit_hosts(const Generation& g) {
  json out = json::object();
  const std::string prefix(jobs::job_names::kUnfit);
  for (auto it = g.own.lower_bound(prefix); it != g.own.end() && it->first.starts_with(prefix); ++it) {
    const std::string_view rest = std::string_view(it->first).substr(prefix.size());
    const size_t slash = rest.rfind('/');
    const auto n = slash == std::string_view::npos ? std::nullopt : to_int(rest.substr(slash + 1));
    if (!n || slash == 0) continue;
    json& host = out[std::string(rest.substr(0, slash))];
    if (host.is_null()) host = json::object();
    if (*n < host.value("times", int64_t{0})) continue;
    const size_t newline = it->second.find('\n');
    host["times"] = *n;
    host["last"] = newline == std::string::npos ? "" : it->second.substr(newline + 1);
  }
  return out;
}

json summarize_generation(const std::string& run_id, int64_t gen, const Generation& g, const Job& job, int64_t now_ms,
                          json& skipped) {
  json out = {{"run_id", run_id}, {"generation", gen}};
  if (job.counter) {
    if (auto c = to_int(*job.counter)) out["current_generation"] = *c;
  }
  json nodes = json::array();
  int world = 0, nnodes = 0;
  std::string state = "joining";
  if (const auto* latest = latest_round(g)) {
    const auto& [round, names] = *latest;
    out["round"] = round;
    const std::string prefix = jobs::JobKeys(run_id, gen).round(round).prefix();
    for (const auto& [name, value] : names) {
      if (!is_member_key(name)) continue;
      auto info = node_record(name, value, names, g, now_ms, prefix, skipped);
      if (!info) continue;
      if (info->contains("nproc") && (*info)["nproc"].is_number_integer()) world += (*info)["nproc"].get<int>();
      if (info->contains("nnodes") && (*info)["nnodes"].is_number_integer()) nnodes = (*info)["nnodes"].get<int>();
      nodes.push_back(std::move(*info));
    }
    if (json rates = step_rates(names, prefix, skipped); !rates.empty()) out["step_rates"] = std::move(rates);
    state = round_state(names, prefix, out, skipped);
  }
  out["state"] = state;
  out["nnodes"] = nnodes;
  out["joined"] = nodes.size();
  out["world_size"] = world;
  out["nodes"] = std::move(nodes);
  if (g.own.count(std::string(jobs::job_names::kDone))) out["all_nodes_left"] = true;
  if (json unfit = unfit_hosts(g); !unfit.empty()) out["left_unfit"] = std::move(unfit);
  if (job.refusal) out["store_refusal"] = *job.refusal;
  return out;
}

// A fault-tolerant job's quorum (ddprun --replica_group: /ddprun/<job>/ft/...): its groups, their
// heartbeats, the latest quorum and the job's end, as the agents wrote them.
json summarize_quorum(const std::string& run_id, const std::map<std::string, std::string>& ft, json& skipped) {
  const std::string prefix = core::job_prefix(run_id) + "ft/";
  json out = {{"run_id", run_id}};
  json groups = json::array();
  if (const std::string* registry = find(ft, "groups")) {
    for (const int g : jobs::parse_group_registry(*registry)) {
      json group = {{"group", g}, {"world", jobs::replica_group_run_id(run_id, g)}};
      // A heartbeat is "<incarnation> <count>", or "gone" once the group's workers are.
      if (const std::string* beat = find(ft, "beat/" + std::to_string(g))) {
        const auto space = beat->rfind(' ');
        if (*beat == jobs::kGoneBeat || space == std::string::npos) {
          group["heartbeat"] = *beat;
        } else {
          group["incarnation"] = beat->substr(0, space);
          if (const auto n = to_int(std::string_view(*beat).substr(space + 1))) group["heartbeats"] = *n;
        }
      }
      groups.push_back(std::move(group));
    }
  }
  out["groups"] = std::move(groups);
  // The latest quorum decided: the highest kept (older ones are erased as new ones come).
  int64_t latest = 0;
  for (const auto& [name, value] : ft) {
    if (!starts_with(name, "q/")) continue;
    if (const auto seq = to_int(std::string_view(name).substr(2))) latest = std::max(latest, *seq);
  }
  if (latest > 0) {
    const std::string name = "q/" + std::to_string(latest);
    const json q = json::parse(ft.at(name), nullptr, false);
    if (!q.is_object() || !q.contains("members") || !q["members"].is_array()) {
      skipped.push_back({{"key", prefix + name}, {"reason", "the quorum is not a JSON object with members"}});
    } else {
      json members = json::array();
      int64_t max_step = 0;
      for (const json& m : q["members"]) {
        if (!m.is_object()) continue;
        json member = {{"group", m.value("group", -1)}, {"step", m.value("step", int64_t{0})}};
        max_step = std::max(max_step, member["step"].get<int64_t>());
        members.push_back(std::move(member));
      }
      out["quorum"] = {
          {"seq", latest}, {"id", q.value("id", int64_t{0})}, {"max_step", max_step}, {"members", std::move(members)}};
      if (q.contains("left_out") && q["left_out"].is_array() && !q["left_out"].empty())
        out["quorum"]["left_out"] = q["left_out"];
    }
  }
  if (const std::string* finished = find(ft, "finished")) {
    const json f = json::parse(*finished, nullptr, false);
    if (f.is_object()) out["finished"] = f;
    else skipped.push_back({{"key", prefix + "finished"}, {"reason", "the job's end record is not a JSON object"}});
  }
  // Training while a group heartbeats (as last written: a group whose agent died without a word
  // still reads as it left it), stopped when every group is gone without an end.
  bool alive = false;
  for (const json& g : out["groups"]) alive = alive || g.contains("incarnation");
  out["state"] = out.contains("finished") ? "finished" : alive ? "training" : "stopped";
  return out;
}

}  // namespace

json summarize_jobs(const std::vector<std::pair<std::string, std::string>>& entries, int64_t now_ms) {
  std::map<std::string, Job> jobs;
  std::map<std::string, std::map<std::string, std::string>> quorums;  // fault-tolerant jobs' ft/ keys
  json skipped = json::array();
  for (const auto& [key, value] : entries) {
    // No value of the protocol is empty: a key that reads empty was deleted after it was listed.
    if (value.empty()) continue;
    if (core::is_refusal_note(key)) {
      jobs[std::string(core::job_of_key(key))].refusal = value;
      continue;
    }
    if (const std::string_view job = core::job_of_key(key); !job.empty()) {
      const std::string ft = core::job_prefix(job) + "ft/";
      if (key.rfind(ft, 0) == 0) {
        quorums[std::string(job)][key.substr(ft.size())] = value;
        continue;
      }
    }
    std::string why;
    const auto parsed = jobs::parse_key(key, &why);
    if (!parsed) {
      skipped.push_back({{"key", key.substr(0, 300)}, {"reason", why}});
      continue;
    }
    Job& job = jobs[parsed->run_id];
    if (!parsed->generation) {
      job.counter = value;
      continue;
    }
    Generation& g = job.generations[*parsed->generation];
    if (parsed->round) g.rounds[*parsed->round][parsed->name] = value;
    else g.own[parsed->name] = value;
  }
  json out = {{"jobs", json::array()}, {"skipped", std::move(skipped)}, {"fault_tolerant_jobs", json::array()}};
  for (const auto& [run_id, ft] : quorums)
    out["fault_tolerant_jobs"].push_back(summarize_quorum(run_id, ft, out["skipped"]));
  for (const auto& [run_id, job] : jobs) {
    for (const auto& [gen, g] : job.generations) {
      out["jobs"].push_back(summarize_generation(run_id, gen, g, job, now_ms, out["skipped"]));
    }
    // Refused before its first round (the store full when it started, say): the reason alone.
    if (job.generations.empty() && job.refusal) {
      out["jobs"].push_back({{"run_id", run_id}, {"state", "refused"}, {"store_refusal", *job.refusal}});
    }
  }
  return out;
}
}  // namespace ddprun::rdzv::daemon
