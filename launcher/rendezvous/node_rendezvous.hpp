#pragma once
// The round protocol of the multi-node backends (store, etcd), written once over a small
// key-value interface that each backend implements on its own store:
//   - read a key; create a key unless it exists (the first write wins, everyone reads it back);
//   - tallies: the round's finished nodes and the generation's nodes that have left;
//   - wait for a key (the store's WAIT, etcd's watch), in slices so that a stop is acted on;
//   - liveness: the watcher's view of a round reports its end or a node whose liveness lapsed
//     (the store: a heartbeat counter that stopped; etcd: a member key gone with its lease).
// On that, this class decides a round's end (report_failure, report_signal, report_success, the
// watcher's lost node), waits for it (wait_end), waits out a join, and leaves (the first node out
// records the job's outcome, the last one lets the generation go). It also keeps this node's place
// in the current round (set by a join, read from the watcher and watchdog threads).
//
// How a node joins differs with the store's abilities (static node ranks claimed by COMPARE_SET
// and dynamic arrivals counted by ADD on a TCPStore; member keys on a lease on etcd): each backend
// writes join() itself, on wait_joining().

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "launcher/rendezvous/join_settings.hpp"
#include "launcher/rendezvous/rendezvous_backend.hpp"
#include "rendezvous/jobs/job_keys.hpp"

namespace ddprun::launcher::rendezvous {

using ddprun::StopSignal;
using workers::WorkerExit;

class NodeRendezvous : public RendezvousBackend {
 public:
  ~NodeRendezvous() override;

  void watch(int round, std::function<void(const RoundEnd&)> on_end) final;
  void unwatch() final { stop_watcher(); }
  RoundEnd report_failure(int round, const WorkerExit& root_cause, const ProgressMark& progress) final;
  RoundEnd report_signal(int round, int signo) final;
  RoundEnd report_success(int round, const StopSignal& stop) final;
  RoundEnd wait_end(int round, const StopSignal& stop) final;
  std::optional<RoundEnd> wait_end_for(int round, std::chrono::milliseconds timeout, const StopSignal& stop) final;
  void leave(int round, std::chrono::milliseconds timeout, const StopSignal& stop) final;
  void leave_unready(int round, const std::string& why, bool strike) final;
  std::vector<std::string> unfit_leaves(int most) final;
  int node_rank() const final { return place().group_rank; }
  void set_restarts(int restarts) final { restarts_ = restarts; }
  std::unique_ptr<ProgressChannel> progress_channel(int round) final;

  // ---- Types of the key-value interface below --------------------------------------------------
  enum class Tally { Finished, Left };
  // A wait for one key: next() waits up to `slice` and returns the key's value once it is set.
  class KeyWait {
   public:
    virtual ~KeyWait() = default;
    virtual std::optional<std::string> next(std::chrono::milliseconds slice) = 0;
  };
  // The watcher thread's view of a round, on a connection of its own.
  class RoundWatch {
   public:
    virtual ~RoundWatch() = default;
    struct Event {
      std::optional<std::string> end;  // the round's end, as written
      int lost_node = -1;              // a node whose liveness lapsed (group rank)
      std::string lost_why;            // how: "sent no heartbeat for 15 s"
    };
    // Waits up to about a second for news; an empty Event if none.
    virtual Event next() = 0;
    // create_or_get on the watch's connection (the agent's may be blocked in a long wait).
    virtual std::string create_or_get(const std::string& key, const std::string& value) = 0;
  };
  // What a join waits on, one slice at a time: ready when the round's keys this node needs are
  // there, the round's end (as written) if it was decided first.
  struct JoinState {
    bool ready = false;
    std::optional<std::string> end;
  };
  using JoinPoll = std::function<JoinState(std::chrono::milliseconds slice)>;
  // What a spare sees of the world it waits behind: each node's liveness as the backend judges it
  // (the store: a heartbeat counter that has not moved for the keep-alive window; etcd: a member
  // key gone with its lease). Used from the agent's thread.
  class WorldLiveness {
   public:
    virtual ~WorldLiveness() = default;
    // One look (a request, no wait): the group ranks whose liveness has lapsed, in order.
    virtual std::vector<int> lapsed() = 0;
    virtual int nodes() const = 0;
    virtual std::string host(int g) const = 0;
    // How a lapse is said: "sent no heartbeat for 15s".
    virtual std::string lapse() const = 0;
  };

 protected:
  // This node's place in the current round.
  struct Place {
    int group_rank = -1;
    int group_world_size = 0;
    std::vector<std::string> agents;  // every node's agent id, in group-rank order
    std::vector<std::string> hosts;   // every node's host, in group-rank order
  };

  explicit NodeRendezvous(JoinSettings settings) : settings_(std::move(settings)) {}
  // "<host>:<pid>:<n>", a new one each call: an agent's id (its heartbeat's key, its records), never
  // the same as another agent's of this process (a benchmark runs thousands) or of an earlier
  // process that had the same pid (n counts from a number drawn at random once per process).
  static std::string new_agent_id(const std::string& host);

  // ---- The key-value interface the protocol is written over (one backend each) ----------------
  // Every call may throw ConnectionError (the store unreachable) or TimeoutError.
  virtual rdzv::jobs::RoundKeys round_keys(int round) const = 0;
  // The key of the generation's final outcome (written by the first node to leave).
  virtual std::string ended_key() const = 0;
  // The generation's keys (those of its rounds are round_keys').
  virtual rdzv::jobs::JobKeys job_keys() const = 0;
  // The value of `key`, if it is set.
  virtual std::optional<std::string> read(const std::string& key) = 0;
  // Sets `key` to `value` unless it is set; returns the value it holds (the first write wins).
  virtual std::string create_or_get(const std::string& key, const std::string& value) = 0;
  // Nodes counted in a round's finished set or the generation's leavers: counts this node in
  // first when `count_me`; returns how many there are.
  virtual int64_t tally(int round, Tally what, bool count_me) = 0;
  // A wait for `key` (the store's WAIT, an etcd watch).
  virtual std::unique_ptr<KeyWait> wait_for_key(const std::string& key) = 0;
  // The watcher's view of `round`: its end, or a node whose liveness lapsed.
  virtual std::unique_ptr<RoundWatch> watch_round(int round) = 0;
  // The liveness of `round`'s nodes, for a spare; nullptr while its membership is not known yet.
  virtual std::unique_ptr<WorldLiveness> watch_liveness(int round) = 0;
  // How many nodes joined `round` (leaving a round that never completed).
  virtual int64_t joined_nodes(int round) = 0;
  // Every node has left: the generation is over for the store (the daemon forgets it, etcd's keys go).
  virtual void forget_generation() = 0;
  // After leaving: a node that hosts the store the others still read waits (up to `timeout`) for
  // the other `nodes` - 1 to leave too.
  virtual void linger(int nodes, std::chrono::milliseconds timeout, const StopSignal& stop) {
    (void)nodes, (void)timeout, (void)stop;
  }
  // Background work that ends when the node leaves (the store backend's heartbeat).
  virtual void stop_background() {}
  // The restarts to record in this node's join record.
  int restarts() const { return restarts_; }
  // Whether this node hosts the store the others use (they cannot go on without it).
  virtual bool hosts_the_store() const { return false; }
  // Whether the job may go on with fewer nodes than it has (--nnodes MIN:MAX with MIN < MAX).
  virtual bool may_shrink() const = 0;
  // What a lost store is called in messages: "the rendezvous store", "etcd".
  virtual std::string store_name() const = 0;
  // The watchdog's channel for node `node` of `nodes` in `round`, on a connection of its own.
  virtual std::unique_ptr<ProgressChannel> open_progress_channel(int round, int node, int nodes) = 0;

  // ---- The protocol's shared steps, for the backends' joins -------------------------------------
  // Proposes `proposal` as round `round`'s end; returns the end decided (the first proposal wins).
  RoundEnd decide(int round, const rdzv::jobs::Outcome& proposal);
  // This node came too late for `round`, which runs with `running` nodes: asks them to
  // re-rendezvous (a Membership end) so that the next round admits it.
  void ask_to_admit_this_node(int round, int running);
  // This node came too late for `round`, which runs with all --nnodes MAX nodes: asking to be
  // admitted would only leave another node out. It waits as a hot spare, outside the world, for
  // the round's end, and watches the world's nodes: one whose liveness lapsed ends the round as
  // lost, since nobody else may be left to say so (a world of one node, every node killed at
  // once, a node rerun after a crash). Then, for a lost node (or a membership change) at once,
  // after a failure or a hang once the world's nodes had a moment to rejoin first, and at once
  // when every node of the world is gone, it goes on to the next round (nullopt: join round + 1).
  // Returns the job's end (job_over) when the job ended without it.
  // A stop request leaves without touching the round (a spare holds no place): StopRequested.
  std::optional<RoundEnd> wait_as_spare(int round, int running, const StopSignal& stop);
  // Waits until `poll` is ready or the join timeout: nullopt when ready, the round's end if it came
  // first. A stop request marks the round ended, leaves and throws StopRequested; the timeout
  // throws TimeoutError with `missing()` (who has not joined). `progress()` is logged every
  // progress interval.
  std::optional<RoundEnd> wait_joining(int round, const StopSignal& stop, const JoinPoll& poll,
                                       const std::function<std::string()>& progress,
                                       const std::function<std::string()>& missing);
  // A round ended by the loss of the store itself.
  RoundEnd store_lost(const std::string& why) const;

  const JoinSettings& settings() const { return settings_; }
  void set_place(Place p);
  Place place() const;  // a copy: safe on any thread
  // Group rank `g`'s host in the current round; "?" when unknown.
  std::string host_of(int g) const;
  // A backend's destructor calls stop_watcher() before its own members go.
  void stop_watcher();

 private:
  // Nodes in the current round (--nnodes MAX before one completed).
  int round_nodes() const;

  JoinSettings settings_;
  mutable std::mutex place_mutex_;
  Place place_;
  std::thread watcher_;
  std::atomic<bool> stop_watching_{false};
  // This node left an elastic job that goes on without it (report_signal): leave() records no
  // outcome for the job and lets no generation go.
  bool departed_ = false;
  // This node waits as a spare, or joins a round after waiting as one, and has held no place
  // since: its leave() records nothing either, and its joins also end when the job ends.
  std::atomic<bool> spare_{false};
  // The job's end as recorded by the first node to leave, if it has ended (job_over set).
  std::optional<RoundEnd> job_ended();
  int restarts_ = 0;
};

}  // namespace ddprun::launcher::rendezvous
