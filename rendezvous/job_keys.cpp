#include "rendezvous/job_keys.hpp"

#include <algorithm>
#include <map>

#include "common/numbers.hpp"

namespace ddprun::rdzv::jobs {

using json = nlohmann::json;

namespace {

bool run_id_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-' || c == ':';
}

// "g12" / "r0" -> 12 / 0; nullopt when the prefix letter or the number is wrong.
std::optional<int64_t> numbered(std::string_view part, char letter) {
  if (part.size() < 2 || part[0] != letter) return std::nullopt;
  return to_int(part.substr(1));
}

constexpr std::string_view kSuccess = "success";
constexpr std::string_view kSignal = "signal:";
constexpr std::string_view kMembership = "membership:";
constexpr std::string_view kLost = "lost:";
constexpr std::string_view kHang = "hang:";

}  // namespace

bool valid_run_id(std::string_view run_id, std::string* why) {
  if (run_id.empty()) {
    if (why) *why = "it is empty";
    return false;
  }
  if (run_id.size() > 200) {
    if (why) *why = "it is longer than 200 characters";
    return false;
  }
  for (char c : run_id) {
    if (!run_id_char(c)) {
      if (why) *why = std::string("it contains '") + c + "'; use letters, digits and . _ - :";
      return false;
    }
  }
  return true;
}

JobKeys::JobKeys(std::string run_id, int64_t generation)
    : run_id_(std::move(run_id)),
      generation_(generation),
      prefix_(job_prefix(run_id_) + "g" + std::to_string(generation_) + "/") {}

std::string JobKeys::generation_counter(std::string_view run_id) { return job_prefix(run_id) + "gen"; }

std::string JobKeys::job_prefix(std::string_view run_id) {
  return std::string(kRoot) + std::string(run_id) + "/";
}

std::string JobKeys::round(int64_t round, std::string_view name) const {
  return prefix_ + "r" + std::to_string(round) + "/" + std::string(name);
}

std::string JobKeys::heartbeat(std::string_view agent) const { return prefix_ + "hb/" + std::string(agent); }

std::optional<ParsedKey> parse_key(std::string_view key, std::string* why) {
  auto fail = [&](std::string reason) -> std::optional<ParsedKey> {
    if (why) *why = std::move(reason);
    return std::nullopt;
  };
  if (key.substr(0, kRoot.size()) != kRoot) return fail("not a ddprun key");
  std::string_view rest = key.substr(kRoot.size());
  const auto slash = rest.find('/');
  if (slash == std::string_view::npos) return fail("no job part after the run id");
  ParsedKey out;
  out.run_id = std::string(rest.substr(0, slash));
  std::string reason;
  if (!valid_run_id(out.run_id, &reason)) return fail("run id not valid: " + reason);
  rest = rest.substr(slash + 1);
  if (rest == "gen") {
    out.name = "gen";
    return out;
  }
  const auto gslash = rest.find('/');
  if (gslash == std::string_view::npos) return fail("unknown job key '" + std::string(rest) + "'");
  out.generation = numbered(rest.substr(0, gslash), 'g');
  if (!out.generation || *out.generation < 0) return fail("generation '" + std::string(rest.substr(0, gslash)) + "' is not a number");
  rest = rest.substr(gslash + 1);
  if (!rest.empty() && rest[0] == 'r') {
    const auto rslash = rest.find('/');
    if (rslash == std::string_view::npos) return fail("round key without a name");
    out.round = numbered(rest.substr(0, rslash), 'r');
    if (!out.round || *out.round < 0) return fail("round '" + std::string(rest.substr(0, rslash)) + "' is not a number");
    rest = rest.substr(rslash + 1);
  }
  if (rest.empty()) return fail("empty key name");
  out.name = std::string(rest);
  return out;
}

std::string encode_outcome(const Outcome& o) {
  switch (o.kind) {
    case Outcome::Kind::Success: return std::string(kSuccess);
    case Outcome::Kind::Signal: return std::string(kSignal) + o.detail;
    case Outcome::Kind::Membership: return std::string(kMembership) + o.detail;
    case Outcome::Kind::NodeLost: return std::string(kLost) + std::to_string(o.node) + ":" + o.detail;
    case Outcome::Kind::Failure: {
      json j = o.failure.is_object() ? o.failure : json::object();
      if (!j.contains("node")) j["node"] = o.node;
      return j.dump();
    }
    case Outcome::Kind::Hang: {
      json j = o.failure.is_object() ? o.failure : json::object();
      j["node"] = o.node;
      j["detail"] = o.detail;
      return std::string(kHang) + j.dump();
    }
  }
  return std::string(kSuccess);
}

Outcome decode_outcome(std::string_view text) {
  Outcome o;
  auto starts = [&](std::string_view p) { return text.substr(0, p.size()) == p; };
  if (text == kSuccess) return o;
  if (starts(kSignal)) {
    o.kind = Outcome::Kind::Signal;
    o.detail = std::string(text.substr(kSignal.size()));
    return o;
  }
  if (starts(kMembership)) {
    o.kind = Outcome::Kind::Membership;
    o.detail = std::string(text.substr(kMembership.size()));
    return o;
  }
  if (starts(kLost)) {
    o.kind = Outcome::Kind::NodeLost;
    const std::string_view rest = text.substr(kLost.size());
    const auto colon = rest.find(':');
    const auto node = to_int(rest.substr(0, colon));
    o.node = node ? static_cast<int>(*node) : -1;
    o.detail = colon == std::string_view::npos ? std::string(rest) : std::string(rest.substr(colon + 1));
    return o;
  }
  if (starts(kHang)) {
    o.kind = Outcome::Kind::Hang;
    o.failure = json::parse(text.substr(kHang.size()), nullptr, false);
    if (!o.failure.is_object()) o.failure = json::object();
    o.node = o.failure.value("node", -1);
    o.detail = o.failure.contains("detail") && o.failure["detail"].is_string() ? o.failure["detail"].get<std::string>()
                                                                             : "the job hung";
    return o;
  }
  o.kind = Outcome::Kind::Failure;
  o.failure = json::parse(text, nullptr, false);
  if (o.failure.is_object()) {
    o.node = o.failure.contains("node") && o.failure["node"].is_number_integer() ? o.failure["node"].get<int>() : -1;
  } else {
    o.failure = json::object();
    o.detail = std::string(text.substr(0, 500));
  }
  return o;
}

std::string_view state_name(Outcome::Kind kind) {
  switch (kind) {
    case Outcome::Kind::Success: return "succeeded";
    case Outcome::Kind::Failure: return "failed";
    case Outcome::Kind::Signal: return "stopped";
    case Outcome::Kind::NodeLost: return "node_lost";
    case Outcome::Kind::Membership: return "re-rendezvous";
    case Outcome::Kind::Hang: return "hung";
  }
  return "?";
}

namespace {

struct Generation {
  std::map<std::string, std::string> own;                          // gen-level keys
  std::map<int64_t, std::map<std::string, std::string>> rounds;    // round -> name -> value
};

struct Job {
  std::optional<std::string> counter;  // /ddprun/<id>/gen
  std::map<int64_t, Generation> generations;
};

bool is_member_key(const std::string& name) { return name.rfind("node/", 0) == 0 || name.rfind("member/", 0) == 0; }

json summarize_generation(const std::string& run_id, int64_t gen, const Generation& g, const Job& job, int64_t now_ms,
                          json& skipped) {
  json out = {{"run_id", run_id}, {"generation", gen}};
  if (job.counter) {
    if (auto c = to_int(*job.counter)) out["current_generation"] = *c;
  }
  // The latest round that has members (a round that has just opened may hold only counters).
  auto it = g.rounds.rbegin();
  while (it != g.rounds.rend() && std::next(it) != g.rounds.rend() &&
         std::none_of(it->second.begin(), it->second.end(), [](const auto& kv) { return is_member_key(kv.first); })) {
    ++it;
  }
  json nodes = json::array();
  int world = 0, nnodes = 0;
  std::string state = "joining";
  if (it != g.rounds.rend()) {
    const auto& [round, names] = *it;
    out["round"] = round;
    const std::string prefix = JobKeys(run_id, gen).round(round, "");
    for (const auto& [name, value] : names) {
      if (!is_member_key(name)) continue;
      json info = json::parse(value, nullptr, false);
      if (!info.is_object()) {
        skipped.push_back({{"key", prefix + name}, {"reason", "the node record is not a JSON object"}});
        continue;
      }
      const std::string id = name.substr(name.find('/') + 1);
      const auto number = to_int(id);
      if (!number) {
        skipped.push_back({{"key", prefix + name}, {"reason", "the node number is not a number"}});
        continue;
      }
      if (name.rfind("member/", 0) == 0) {
        info["arrival"] = *number;
        auto a = names.find("assign/" + id);
        if (a != names.end()) {
          const json assigned = json::parse(a->second, nullptr, false);
          if (assigned.is_object() && assigned.contains("group_rank")) info["node_rank"] = assigned["group_rank"];
        }
      } else {
        info["node_rank"] = *number;
      }
      // Heartbeats: a counter, and the wall-clock time (the node's clock) of the last one.
      const std::string agent = info.contains("agent") && info["agent"].is_string() ? info["agent"].get<std::string>() : "";
      auto hb = g.own.find("hb/" + agent);
      if (!agent.empty() && hb != g.own.end()) {
        if (auto beats = to_int(hb->second)) info["heartbeats"] = *beats;
        auto t = g.own.find("hb/" + agent + "/time");
        if (t != g.own.end()) {
          if (auto last = to_int(t->second)) {
            info["last_heartbeat_ms"] = *last;
            info["last_heartbeat_age_s"] = static_cast<double>(now_ms - *last) / 1000.0;
          }
        }
      }
      if (info.contains("nproc") && info["nproc"].is_number_integer()) world += info["nproc"].get<int>();
      if (info.contains("nnodes") && info["nnodes"].is_number_integer()) nnodes = info["nnodes"].get<int>();
      nodes.push_back(std::move(info));
    }
    // Step rates, as each node last published them (every 10 s while the job runs).
    json rates = json::array();
    for (const auto& [name, value] : names) {
      if (name.rfind("rates/", 0) != 0) continue;
      const json record = json::parse(value, nullptr, false);
      if (!record.is_object() || !record.contains("ranks") || !record["ranks"].is_array()) {
        skipped.push_back({{"key", prefix + name}, {"reason", "the step rates record is not a JSON object with ranks"}});
        continue;
      }
      for (const json& r : record["ranks"]) rates.push_back(r);
    }
    if (!rates.empty()) out["step_rates"] = std::move(rates);
    if (auto hang = names.find("hang"); hang != names.end() && names.find("end") == names.end()) {
      out["hang_diagnosed_by"] = hang->second;
    }
    auto ws = names.find("worker_store");
    if (ws != names.end()) {
      const json store = json::parse(ws->second, nullptr, false);
      if (store.is_object()) out["worker_store"] = store;
      else skipped.push_back({{"key", prefix + "worker_store"}, {"reason", "not a JSON object"}});
    }
    auto end = names.find("end");
    if (end != names.end()) {
      const Outcome o = decode_outcome(end->second);
      state = std::string(state_name(o.kind));
      switch (o.kind) {
        case Outcome::Kind::Success: break;
        case Outcome::Kind::Failure: out["end"] = o.failure.empty() ? json(o.detail) : o.failure; break;
        case Outcome::Kind::Hang:  // the full report stays in the store; status shows its summary
          out["end"] = {{"detail", o.detail}, {"node", o.node}};
          break;
        case Outcome::Kind::Signal:
        case Outcome::Kind::NodeLost:
        case Outcome::Kind::Membership: out["end"] = o.detail; break;
      }
    } else if (names.count("complete") || names.count("closed")) {
      state = "running";
    }
  }
  out["state"] = state;
  out["nnodes"] = nnodes;
  out["joined"] = nodes.size();
  out["world_size"] = world;
  out["nodes"] = std::move(nodes);
  if (g.own.count("done")) out["all_nodes_left"] = true;
  return out;
}

}  // namespace

json summarize_jobs(const std::vector<std::pair<std::string, std::string>>& entries, int64_t now_ms) {
  std::map<std::string, Job> jobs;
  json skipped = json::array();
  for (const auto& [key, value] : entries) {
    std::string why;
    const auto parsed = parse_key(key, &why);
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
  json out = {{"jobs", json::array()}, {"skipped", std::move(skipped)}};
  for (const auto& [run_id, job] : jobs) {
    for (const auto& [gen, g] : job.generations) {
      out["jobs"].push_back(summarize_generation(run_id, gen, g, job, now_ms, out["skipped"]));
    }
  }
  return out;
}

}  // namespace ddprun::rdzv::jobs
