#pragma once
// The quorum protocol of a fault-tolerant job, written once over a small key-value interface
// (QuorumKv) that a ddprun store (the job's rendezvous daemon or node 0's store) implements, and
// that etcd can. No process is the coordinator: every group's agent heartbeats, asks, and when the
// rules of quorum.hpp are met proposes the quorum itself; the first proposal wins (create-if-
// absent), everyone reads it back. So the quorum lives as long as the store does (a daemon with
// --state-file keeps it across its restarts) and no agent is a single point of failure.
//
// Thread-safety: next() from one thread (the group's relay); withdraw() and set_incarnation() from
// any; the heartbeat (and the "gone" of a withdrawal) runs on a thread of its own, on a connection
// of its own.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/defaults.hpp"
#include "common/errors.hpp"
#include "common/stop_signal.hpp"
#include "launcher/ft/quorum.hpp"
#include "rendezvous/jobs/job_keys.hpp"

namespace ddprun::rdzv::client {
class Client;
}

namespace ddprun::launcher::ft {

using ddprun::StopSignal;

// What the protocol needs of a store. Calls may throw ConnectionError or TimeoutError.
class QuorumKv {
 public:
  virtual ~QuorumKv() = default;
  virtual void put(const std::string& key, const std::string& value) = 0;
  // The values of `keys` now, nullopt where a key is not set.
  virtual std::vector<std::optional<std::string>> read(const std::vector<std::string>& keys) = 0;
  // Sets `key` to `value` unless it is set; returns the value it holds.
  virtual std::string create_or_get(const std::string& key, const std::string& value) = 0;
  // Whether `key` is set within `slice`.
  virtual bool wait_for(const std::string& key, std::chrono::milliseconds slice) = 0;
  virtual void erase(const std::string& key) = 0;
  // Adds `group` to the job's registry of groups; every group registered so far.
  virtual void register_group(const std::string& registry, int group) = 0;
  virtual std::vector<int> groups(const std::string& registry) = 0;
};

// QuorumKv on a ddprun store (or any TCPStore speaking the 2.x dialect).
class StoreQuorumKv : public QuorumKv {
 public:
  explicit StoreQuorumKv(std::unique_ptr<rdzv::client::Client> client);
  ~StoreQuorumKv() override;
  void put(const std::string& key, const std::string& value) override;
  std::vector<std::optional<std::string>> read(const std::vector<std::string>& keys) override;
  std::string create_or_get(const std::string& key, const std::string& value) override;
  bool wait_for(const std::string& key, std::chrono::milliseconds slice) override;
  void erase(const std::string& key) override;
  void register_group(const std::string& registry, int group) override;
  std::vector<int> groups(const std::string& registry) override;

 private:
  std::unique_ptr<rdzv::client::Client> client_;
};

// The job's end: the first group whose workers all finished records its committed step.
struct Finished {
  int64_t step = 0;
  int group = 0;
  std::string at;  // UTC, ISO 8601

  // "the job finished at step 81 (replica group 0, 2026-11-27T06:00:00Z)"
  std::string describe() const;
};
void to_json(nlohmann::json& j, const Finished& f);
void from_json(const nlohmann::json& j, Finished& f);

// next() found the job over: another group finished it, and no other group is left to train with.
class JobFinished : public Error {
 public:
  explicit JobFinished(Finished record)
      : Error(record.describe() + " and no other replica group is left: nothing to train"),
        record_(std::move(record)) {}
  const Finished& record() const { return record_; }

 private:
  Finished record_;
};

struct CoordinatorOptions {
  std::string run_id;                   // the job (every group's --rdzv_id)
  std::string root{rdzv::core::kRoot};  // where jobs' keys live: /ddprun/ on a store, the key_prefix on etcd
  int group = 0;                        // this agent's --replica_group
  Rules rules;
  // A group heartbeats this often; one whose heartbeat has not changed for `heartbeat_timeout`
  // counts as gone.
  std::chrono::milliseconds heartbeat_interval{std::chrono::milliseconds(200)};
  std::chrono::milliseconds heartbeat_timeout{std::chrono::seconds(5)};
  // How often a waiting agent looks at the asks again (the quorum key itself is waited on).
  std::chrono::milliseconds poll{std::chrono::milliseconds(50)};
  std::chrono::milliseconds progress_interval{defaults::kProgressInterval};
  // Quorums kept behind the latest (older ones are erased by whoever proposes).
  int64_t keep = 4;
};

class Coordinator {
 public:
  // `kv` serves next(); `beat_kv` (a connection of its own) the heartbeat thread, which starts at
  // once (as no incarnation until set_incarnation()).
  Coordinator(CoordinatorOptions options, std::unique_ptr<QuorumKv> kv, std::unique_ptr<QuorumKv> beat_kv);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // The group's workers started again: a new member for the quorum, heartbeating as such.
  void set_incarnation(const std::string& incarnation);
  // The group's workers are gone: the others stop counting on it at once (not after the timeout).
  // Returns at once; the heartbeat thread says it.
  void withdraw();
  // Asks for the next quorum as `self` (group and incarnation filled in here) and waits until one
  // that includes this group is decided; quorums decided without it (it asked too late, it was
  // left out) are skipped, each said in the log. Throws StopRequested on a stop, TimeoutError
  // after `timeout` with what the quorum waits for, JobFinished when the job's end is recorded and
  // every heartbeating group asks from behind it (groups back after the others finished and left;
  // a new job under a finished job's id).
  Quorum next(Member self, const StopSignal& stop, std::chrono::milliseconds timeout);
  // This group's workers all finished at `step`: records the job's end unless a group did first;
  // returns the record that holds.
  Finished finish(int64_t step);
  // The job's end, once next() found the job over (threw JobFinished).
  std::optional<Finished> over() const;
  int group() const { return options_.group; }
  // The groups whose heartbeat is fresh now.
  std::set<int> healthy() const;

 private:
  using Clock = std::chrono::steady_clock;
  void heartbeat_loop();
  void observe(const std::vector<int>& groups, const std::vector<std::optional<std::string>>& beats);
  int64_t latest_seq();
  std::optional<Quorum> read_quorum(int64_t seq);
  // Looks at the asks of `seq` and proposes the quorum when the rules are met; what it waits for.
  std::string try_decide(int64_t seq, Clock::duration waited);
  void collect_garbage(int64_t seq);
  // One line in the log when this group's quorum has other members than its last one (other groups,
  // or a group back from a restart): who left and why, who is back and whether it heals, and from
  // whom.
  void say_membership(const Quorum& q);
  // The job's end when it is recorded, this group asks, and every heartbeating group asks from
  // behind it.
  std::optional<Finished> job_over(const Candidates& c) const;

  CoordinatorOptions options_;
  rdzv::jobs::QuorumKeys keys_;
  std::unique_ptr<QuorumKv> kv_;
  std::unique_ptr<QuorumKv> beat_kv_;
  int64_t last_seq_ = 0;                          // the latest quorum this group was a member of
  std::set<int> last_groups_;                     // its groups
  std::map<int, std::string> last_incarnations_;  // its members' incarnations, by group
  std::optional<Quorum> previous_cache_;
  int64_t hinted_latest_ = 0;         // the latest quorum's seq as try_decide last read it
  std::optional<Finished> finished_;  // guarded by mutex_
  std::optional<Finished> over_;      // guarded by mutex_

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::string incarnation_;  // "" until set: no heartbeat
  bool withdrawn_ = false;
  bool gone_said_ = false;  // the heartbeat thread has written "gone" since the withdrawal
  uint64_t beats_ = 0;
  struct Seen {
    std::string value;
    Clock::time_point changed;
  };
  std::map<int, Seen> seen_;  // every group's heartbeat as this agent last saw it
  std::thread beat_thread_;
};

}  // namespace ddprun::launcher::ft
