#include "rendezvous/server/janitor.hpp"

#include <functional>
#include <vector>

#include "common/log.hpp"
#include "rendezvous/jobs/job_keys.hpp"

namespace ddprun::rdzv::server {

bool JobJanitor::quiet(const std::string& id, uint64_t fingerprint, Clock::time_point now,
                       std::map<std::string, Seen>& next) {
  auto it = seen_.find(id);
  Seen s{fingerprint, now};
  if (it != seen_.end() && it->second.fingerprint == fingerprint) s.since = it->second.since;
  next[id] = s;
  return now - s.since >= ttl_;
}

JobJanitor::Sweep JobJanitor::sweep(core::KvStore& store, Clock::time_point now) {
  struct Generation {
    std::vector<std::string> keys;
    uint64_t fingerprint = 0;
    bool done = false;
  };
  struct Job {
    std::string counter_key;
    std::string counter;
    std::map<int64_t, Generation> generations;
    Generation stray;  // keys under the job's prefix that are no part of ddprun's layout
  };
  std::map<std::string, Job> jobs;
  store.for_each(core::kRoot, [&](std::string_view key, const std::string& value) {
    const auto parsed = jobs::parse_key(key, nullptr);
    if (!parsed) {
      // Under a job's prefix all the same (a client with the job's token wrote it): the job's.
      const std::string_view rest = key.substr(core::kRoot.size());
      const std::string_view run_id = rest.substr(0, rest.find('/'));
      if (run_id.size() == rest.size() || !core::valid_run_id(run_id)) return;  // not ours to forget
      Generation& g = jobs[std::string(run_id)].stray;
      g.keys.emplace_back(key);
      g.fingerprint += std::hash<std::string_view>{}(key)*31 + std::hash<std::string>{}(value);
      return;
    }
    Job& job = jobs[parsed->run_id];
    if (!parsed->generation) {
      job.counter_key = std::string(key);
      job.counter = value;
      return;
    }
    Generation& g = job.generations[*parsed->generation];
    g.keys.emplace_back(key);
    // Order-independent: a sum of per-entry hashes.
    g.fingerprint += std::hash<std::string_view>{}(key)*31 + std::hash<std::string>{}(value);
    if (!parsed->round && parsed->name == jobs::job_names::kDone) g.done = true;
  });

  Sweep result;
  std::map<std::string, Seen> next;
  // Whoever writes to the store decides how many jobs there are: the first few are named, the
  // others counted in one line (200,000 one-key jobs once wrote 27 MB of log in a sweep).
  constexpr size_t kNamedStray = 8;
  size_t stray_jobs = 0, stray_keys = 0;
  for (auto& [run_id, job] : jobs) {
    size_t left = 0;
    for (auto& [gen, g] : job.generations) {
      const std::string id = run_id + "/g" + std::to_string(gen);
      const bool abandoned = !g.done && quiet(id, g.fingerprint, now, next);
      if (!g.done && !abandoned) {
        ++left;
        continue;
      }
      for (const std::string& k : g.keys) store.remove(k);
      result.keys_deleted += g.keys.size();
      ++result.generations_forgotten;
      next.erase(id);
      DDPRUN_LOG_DEBUG("store") << "forgot job '" << run_id << "' generation " << gen << " ("
                                << (g.done ? "every node has left" : "no change for the job TTL") << ", "
                                << g.keys.size() << " keys)";
    }
    if (!job.stray.keys.empty()) {
      const std::string id = run_id + "/stray";
      if (quiet(id, job.stray.fingerprint, now, next)) {
        for (const std::string& k : job.stray.keys) store.remove(k);
        result.keys_deleted += job.stray.keys.size();
        next.erase(id);
        if (++stray_jobs <= kNamedStray) {
          log::info("store") << "forgot " << job.stray.keys.size() << " key(s) under job '" << run_id
                             << "' that are no part of a ddprun round (unchanged for the job TTL)";
        } else {
          stray_keys += job.stray.keys.size();
        }
      } else {
        ++left;
      }
    }
    if (left == 0 && !job.counter_key.empty() && quiet(run_id, std::hash<std::string>{}(job.counter), now, next)) {
      store.remove(job.counter_key);
      ++result.keys_deleted;
      next.erase(run_id);
    }
  }
  if (stray_jobs > kNamedStray) {
    log::info("store") << "forgot " << stray_keys << " key(s) under " << stray_jobs - kNamedStray
                       << " more jobs that are no part of a ddprun round (unchanged for the job TTL)";
  }
  seen_ = std::move(next);
  return result;
}

}  // namespace ddprun::rdzv::server
