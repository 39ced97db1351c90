#include "rendezvous/daemon/job_states.hpp"

#include "rendezvous/core/job_namespace.hpp"
#include "rendezvous/jobs/job_keys.hpp"

namespace ddprun::rdzv::daemon {

namespace names_of = jobs::round_names;

JobStates::JobStates(core::KvStore& store) : store_(store) {
  store_.for_each(core::kRoot, [this](std::string_view key, const std::string& value) {
    if (!value.empty()) on_presence(key, true);
  });
  store_.set_presence_observer(this);
}

JobStates::~JobStates() { store_.set_presence_observer(nullptr); }

void JobStates::on_presence(std::string_view key, bool present) {
  if (!key.starts_with(core::kRoot)) return;
  const int64_t d = present ? 1 : -1;
  // The keys summarize_jobs reads a run's state from, read the same way.
  if (core::is_refusal_note(key)) {
    const std::string_view run_id = core::job_of_key(key);
    auto it = jobs_.find(run_id);
    if (it == jobs_.end() && present) it = jobs_.emplace(std::string(run_id), Job{}).first;
    if (it != jobs_.end()) {
      it->second.refused = present;
      if (!present && it->second.generations.empty()) jobs_.erase(it);
    }
    return;
  }
  if (const std::string_view job = core::job_of_key(key); !job.empty()) {
    if (key.substr(core::job_prefix(job).size()).starts_with("ft/")) return;  // a quorum's keys
  }
  const auto parsed = jobs::parse_key(key, nullptr);
  if (!parsed || !parsed->generation) return;
  auto job = jobs_.find(parsed->run_id);
  if (job == jobs_.end()) {
    if (!present) return;
    job = jobs_.emplace(parsed->run_id, Job{}).first;
  }
  Generation& g = job->second.generations[*parsed->generation];
  g.keys += d;
  if (parsed->round) {
    Round& r = g.rounds[*parsed->round];
    r.keys += d;
    const std::string& name = parsed->name;
    if (name.starts_with(names_of::kNode) || name.starts_with(names_of::kMember)) r.members += d;
    if (name == names_of::kComplete) r.complete = present;
    if (name == names_of::kClosed) r.closed = present;
    if (name == names_of::kEnd) {
      if (!present) ends_.erase(r.end_key);
      r.end_key = present ? std::string(key) : std::string();
    }
    if (r.keys <= 0) g.rounds.erase(*parsed->round);
  }
  if (g.keys <= 0) job->second.generations.erase(*parsed->generation);
  if (job->second.generations.empty() && !job->second.refused) jobs_.erase(job);
}

std::string JobStates::state_of(const Generation& g) const {
  if (g.rounds.empty()) return "joining";
  // The latest round with node records (one that has just opened may hold only counters), else
  // the first.
  auto it = g.rounds.rbegin();
  while (std::next(it) != g.rounds.rend() && it->second.members == 0) ++it;
  const Round& r = it->second;
  if (r.end_key.empty()) return r.complete || r.closed ? "running" : "joining";
  const core::SharedBytes value = store_.get_shared(r.end_key);
  if (!value) return "joining";  // (not reached: the index follows the store)
  auto& cached = ends_[r.end_key];
  if (cached.first != value) cached = {value, std::string(jobs::state_name(jobs::decode_outcome(*value).kind))};
  return cached.second;
}

std::map<std::string, int> JobStates::by_state() const {
  std::map<std::string, int> by_state;
  for (const char* s : {"joining", "running", "succeeded", "failed", "stopped", "node_lost", "re-rendezvous", "hung"}) {
    by_state[s] = 0;
  }
  for (const auto& [run_id, job] : jobs_) {
    for (const auto& [gen, g] : job.generations) ++by_state[state_of(g)];
    if (job.generations.empty() && job.refused) ++by_state["refused"];
  }
  return by_state;
}

}  // namespace ddprun::rdzv::daemon
