#include "rendezvous/jobs/job_keys.hpp"

#include <algorithm>
#include <limits>

#include "common/numbers.hpp"

namespace ddprun::rdzv::jobs {

using json = nlohmann::json;

namespace {

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

JobKeys::JobKeys(std::string run_id, int64_t generation, std::string_view root)
    : KeysUnder(core::job_prefix(run_id, root) + "g" + std::to_string(generation) + "/"),
      run_id_(std::move(run_id)),
      generation_(generation) {}

std::string JobKeys::generation_counter(std::string_view run_id, std::string_view root) {
  return core::job_prefix(run_id, root) + std::string(job_names::kGeneration);
}

RoundKeys JobKeys::round(int64_t round) const { return RoundKeys(prefix() + "r" + std::to_string(round) + "/"); }

std::string heartbeat_name(std::string_view agent) { return std::string(job_names::kHeartbeat).append(agent); }

std::string heartbeat_time_name(std::string_view agent) {
  return heartbeat_name(agent).append(job_names::kHeartbeatTime);
}

std::string JobKeys::heartbeat(std::string_view agent) const { return prefix() + heartbeat_name(agent); }

std::string JobKeys::heartbeat_time(std::string_view agent) const { return prefix() + heartbeat_time_name(agent); }

std::optional<ParsedKey> parse_key(std::string_view key, std::string* why) {
  auto fail = [&](std::string reason) -> std::optional<ParsedKey> {
    if (why) *why = std::move(reason);
    return std::nullopt;
  };
  if (key.substr(0, core::kRoot.size()) != core::kRoot) return fail("not a ddprun key");
  std::string_view rest = key.substr(core::kRoot.size());
  const auto slash = rest.find('/');
  if (slash == std::string_view::npos) return fail("no job part after the run id");
  ParsedKey out;
  out.run_id = std::string(rest.substr(0, slash));
  std::string reason;
  if (!core::valid_run_id(out.run_id, &reason)) return fail("run id not valid: " + reason);
  rest = rest.substr(slash + 1);
  if (rest == job_names::kGeneration) {
    out.name = std::string(job_names::kGeneration);
    return out;
  }
  const auto gslash = rest.find('/');
  if (gslash == std::string_view::npos) return fail("unknown job key '" + std::string(rest) + "'");
  out.generation = numbered(rest.substr(0, gslash), 'g');
  if (!out.generation || *out.generation < 0)
    return fail("generation '" + std::string(rest.substr(0, gslash)) + "' is not a number");
  rest = rest.substr(gslash + 1);
  if (!rest.empty() && rest[0] == 'r') {
    const auto rslash = rest.find('/');
    if (rslash == std::string_view::npos) return fail("round key without a name");
    out.round = numbered(rest.substr(0, rslash), 'r');
    if (!out.round || *out.round < 0)
      return fail("round '" + std::string(rest.substr(0, rslash)) + "' is not a number");
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

std::vector<int> parse_group_registry(std::string_view value) {
  std::vector<int> out;
  while (!value.empty()) {
    const auto comma = value.find(',');
    if (const auto g = to_int(value.substr(0, comma)); g && *g >= 0 && *g <= std::numeric_limits<int>::max())
      out.push_back(static_cast<int>(*g));
    if (comma == std::string_view::npos) break;
    value = value.substr(comma + 1);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace ddprun::rdzv::jobs
