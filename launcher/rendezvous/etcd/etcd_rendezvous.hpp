#pragma once
// Rendezvous on etcd v3 (--rdzv_backend etcd): a replicated, linearizable store with leases and
// watches, for clusters where one ddprun-rendezvous daemon (or node 0) is too much of a single
// point of failure. Through etcd's HTTP/JSON gateway (etcd_client.hpp).
//
// Keys, under the prefix (--rdzv_conf key_prefix, default /ddprun/) and the job id:
//   <id>/gen                      the job id's current generation: each run of a job id is one
//   <id>/g<G>/current             the round a newly started agent joins
//   <id>/g<G>/r<R>/member/<agent> an agent's record, attached to its lease: it disappears when the
//                                 agent is gone (SIGKILLed, partitioned) for the lease's TTL
//   <id>/g<G>/r<R>/closed         the round's membership in group-rank order, written once (a
//                                 transaction that creates it only if absent)
//   <id>/g<G>/r<R>/worker_store   where group rank 0 hosts the workers' TCPStore
//   <id>/g<G>/r<R>/end            how the round ended (failure with its root cause, signal, lost
//                                 node, membership change, hang, success), written once
//   <id>/g<G>/r<R>/finished/<agent>, progress/<node>, rates/<node>, hang, diagnosis/<node>
//   <id>/g<G>/ended, left/<agent> the run's outcome, and who has read it; the last agent to leave
//                                 deletes the generation
// Joining: an agent puts its member key and watches the round; the round closes when --nnodes MAX
// agents are there, or MIN after the last call; the agent whose transaction creates `closed`
// orders the members (--node_rank hints, then arrival). An agent that finds the round closed
// without it asks the running job to re-rendezvous (elastic jobs, below MAX), or is refused.
// Liveness: each agent keeps its lease alive (a renewal every TTL/3) and watches the round: a
// member key deleted by lease expiry ends the round as a lost node, so the survivors re-rendezvous
// (--nnodes MIN:MAX) or stop with a report (a fixed --nnodes). No polling: watches carry every
// change, and a watch whose member goes away resumes on another from the revision it had reached.
//
// A generation whose agents are all gone (no key attached to a live lease) or that has ended is
// never joined again: the next run of the job id starts the next generation and deletes it.

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "launcher/rendezvous/etcd/etcd_client.hpp"
#include "launcher/rendezvous/membership.hpp"
#include "launcher/rendezvous/node_rendezvous.hpp"
#include "launcher/rendezvous/rendezvous_backend.hpp"
#include "rendezvous/jobs/job_keys.hpp"

namespace ddprun::launcher::rendezvous::etcd {

using ddprun::StopSignal;
using rendezvous::Joiner;
using rendezvous::Membership;
using rendezvous::NodeRendezvous;
using rendezvous::ProgressChannel;
using rendezvous::RoundEnd;
using rendezvous::WorkerStoreHost;
using rendezvous::World;

// The etcd backend's settings: the join's (JoinSettings: node_rank is an ordering hint) and etcd's.
struct EtcdRendezvousOptions : JoinSettings {
  etcd::Options etcd;
  std::string prefix = "/ddprun/";
  std::chrono::seconds lease_ttl{10};
};

// How long a watch may go without any answer from etcd (not even its progress notices) before the
// connection counts as lost: the lease's TTL, at least 5 s.
std::chrono::milliseconds watch_patience(std::chrono::seconds lease_ttl);

class EtcdRendezvous final : public NodeRendezvous {
 public:
  // Connects (trying every endpoint until the join timeout; StopRequested if `stop` comes first),
  // takes a lease and chooses the job's generation. Throws ConnectionError naming the endpoints.
  EtcdRendezvous(EtcdRendezvousOptions options, const StopSignal& stop);
  ~EtcdRendezvous() override;

  int first_round(const StopSignal& stop) override;
  std::variant<World, RoundEnd> join(int round, int nproc, const WorkerStoreHost& host_worker_store,
                                     const StopSignal& stop) override;
  bool elastic() const override { return options_.min_nodes < options_.max_nodes; }
  bool may_shrink() const override { return elastic(); }

  int64_t generation() const { return generation_; }

 private:
  // The job's keys under the key prefix: the layout of rendezvous/jobs/job_keys.hpp.
  rdzv::jobs::JobKeys keys(int64_t generation) const { return {options_.run_id, generation, options_.prefix}; }
  rdzv::jobs::JobKeys keys() const { return keys(generation_); }
  std::string gen_prefix() const { return keys().prefix(); }
  etcd::Client::Deadline request_deadline() const;  // a deadline for one ordinary request

  int64_t choose_generation(const StopSignal& stop);
  void keep_lease_alive();
  // The round protocol's key-value interface (node_rendezvous.hpp) on etcd.
  rdzv::jobs::RoundKeys round_keys(int round) const override { return keys().round(round); }
  std::string ended_key() const override { return keys().ended(); }
  rdzv::jobs::JobKeys job_keys() const override { return keys(); }
  std::optional<std::string> read(const std::string& key) override;  // a range of one key
  // A transaction: put if the key's create revision is 0, else read it.
  std::string create_or_get(const std::string& key, const std::string& value) override;
  // A key per agent under the set's prefix (finished/<agent>, left/<agent>), counted by a
  // keys-only range read.
  int64_t tally(int round, Tally what, bool count_me) override;
  std::unique_ptr<KeyWait> wait_for_key(const std::string& key) override;  // a watch from the read's revision
  // One watch of the round's prefix: `end` put, or a member key deleted by lease expiry.
  std::unique_ptr<RoundWatch> watch_round(int round) override;
  // The round's closed membership; a node lapses when its member key is gone with its lease.
  std::unique_ptr<WorldLiveness> watch_liveness(int round) override;
  int64_t joined_nodes(int round) override;  // member keys in the round
  // The generation counter moves on (a day's lease on it) and the generation's keys are deleted.
  void forget_generation() override;
  std::string store_name() const override { return "etcd"; }
  std::unique_ptr<ProgressChannel> open_progress_channel(int round, int node, int nodes) override;
  class Watch;  // the watcher's view of a round: its end, or a member key gone with its lease
  // Throws ConnectionError once this node's lease could not be renewed for its TTL.
  void check_lease() const;
  // Closes `round` with the members there now (the first close wins).
  void close_round(int round, std::vector<Joiner> members);
  std::vector<Joiner> members_of(const std::vector<etcd::KeyValue>& kvs, const std::string& prefix) const;
  // Waits (watching the round, NodeRendezvous::wait_joining) until `ready` says the round's keys
  // are there; returns the round's end if it was decided first. `progress` says who is missing.
  std::optional<RoundEnd> wait_round(int round, const StopSignal& stop,
                                     const std::function<bool(const std::vector<etcd::KeyValue>&)>& ready,
                                     const std::function<std::string(const std::vector<etcd::KeyValue>&)>& progress);
  // Whether every node of `round` has lost its lease, or does within `patience`.
  bool world_gone_within(int round, std::chrono::milliseconds patience, const StopSignal& stop);
  // Makes `w` (this node's world in `m`) the current round's.
  World adopt(World w, const Membership& m);

  EtcdRendezvousOptions options_;
  std::unique_ptr<etcd::Client> client_;
  std::string agent_id_;
  int64_t lease_ = 0;
  int64_t generation_ = 1;
  std::thread keepalive_;
  std::atomic<bool> stop_keepalive_{false};
  std::atomic<bool> lease_lost_{false};
  std::mutex keepalive_mutex_;
  std::condition_variable keepalive_wake_;
};

}  // namespace ddprun::launcher::rendezvous::etcd
