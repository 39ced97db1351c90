#pragma once
// Forgets ddprun jobs that are over, so that a long-running daemon's key count stays flat over any
// number of jobs (the layout is in rendezvous/jobs/job_keys.hpp):
//   - a generation whose nodes have all read its outcome and left (its `done` key) is deleted at
//     once;
//   - a generation in which nothing has changed for `ttl` (no heartbeat, no join: its agents were
//     killed, or a node never came back to read the outcome) is deleted then;
//   - the job id's generation counter goes last, once it is the job's only key and has not changed
//     for `ttl` (a run starting meanwhile keeps counting from it).
//   - keys under a job's prefix that are no part of the layout (written by a client holding the
//     job's token) go once none of them has changed for `ttl`.
// Pure logic over a KvStore; the server calls sweep() from its I/O thread on a timer.

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include "rendezvous/core/kv_store.hpp"

namespace ddprun::rdzv::server {

class JobJanitor {
 public:
  using Clock = std::chrono::steady_clock;
  explicit JobJanitor(std::chrono::milliseconds ttl) : ttl_(ttl) {}

  struct Sweep {
    size_t generations_forgotten = 0;
    size_t keys_deleted = 0;
  };
  Sweep sweep(core::KvStore& store, Clock::time_point now);
  std::chrono::milliseconds ttl() const { return ttl_; }

 private:
  struct Seen {
    uint64_t fingerprint = 0;
    Clock::time_point since;  // when the fingerprint last changed
  };
  // Returns true when `fingerprint` has not changed for ttl_.
  bool quiet(const std::string& id, uint64_t fingerprint, Clock::time_point now, std::map<std::string, Seen>& next);

  std::chrono::milliseconds ttl_;
  std::map<std::string, Seen> seen_;  // "run_id/g<G>" or "run_id" -> last fingerprint
};

}  // namespace ddprun::rdzv::server
