#pragma once
// The ddprun jobs on a store by state, for /metrics, kept as the store changes: an index of the
// keys that decide a job run's state (which rounds have node records, and whether the round read
// has ended, is complete or is closed; rendezvous/jobs/job_keys.hpp), updated as keys come and
// go (KvStore's PresenceObserver). A scrape costs O(job runs), whatever the jobs store, and the
// figures are those summarize_jobs (job_summary.hpp) gives for the same keys: a test holds them
// to it.
//
// Not thread-safe: the store's thread only. Reads what the store holds at construction; follows
// it until destroyed (the store must outlive it).

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "rendezvous/core/kv_store.hpp"

namespace ddprun::rdzv::daemon {

class JobStates final : public core::PresenceObserver {
 public:
  explicit JobStates(core::KvStore& store);
  ~JobStates() override;
  JobStates(const JobStates&) = delete;
  JobStates& operator=(const JobStates&) = delete;

  void on_presence(std::string_view key, bool present) override;

  // Job runs by state ("joining", "running", an outcome's state_name, "refused"), each state of
  // ddprun's listed even at 0.
  std::map<std::string, int> by_state() const;

 private:
  struct Round {
    int64_t keys = 0;
    int64_t members = 0;  // node/ and member/ records
    bool complete = false, closed = false;
    std::string end_key;  // the round's end record, when there is one
  };
  struct Generation {
    int64_t keys = 0;
    std::map<int64_t, Round> rounds;
  };
  struct Job {
    bool refused = false;  // the store's refusal note
    std::map<int64_t, Generation> generations;
  };
  // The state of one run (summarize_jobs's rule: the latest round with node records, else the
  // first; its end, else complete or closed, else joining).
  std::string state_of(const Generation& g) const;

  core::KvStore& store_;
  std::map<std::string, Job, std::less<>> jobs_;
  // The last end record decoded per end key: its value (a share) and the state it gave.
  mutable std::map<std::string, std::pair<core::SharedBytes, std::string>, std::less<>> ends_;
};

}  // namespace ddprun::rdzv::daemon
