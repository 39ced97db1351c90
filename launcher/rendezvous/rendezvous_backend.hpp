#pragma once
// What the agent needs from a rendezvous, whatever serves it: join a round and get this node's
// place in it; host the round's worker store on the node that becomes group rank 0; learn of an
// end decided elsewhere (another node's failure or signal, a lost node, a membership change); agree
// on how a round ended; leave at the end. The agent depends only on this interface:
//   - LocalRendezvous: one node, nothing to agree with;
//   - StoreRendezvous: static and c10d-style rendezvous over a TCPStore (node 0's, or a
//     ddprun-rendezvous daemon's);
//   - EtcdRendezvous: etcd v3, with leases for liveness and watches.
//
// Blocking calls take the agent's StopSignal: a stop request ends any wait within a second (a
// round left during its rendezvous is marked ended, so the other nodes learn of it at once) and
// the call throws StopRequested.

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/stop_signal.hpp"
#include "launcher/workers/worker_exit.hpp"

namespace ddprun::launcher::rendezvous {

using ddprun::StopSignal;
using workers::WorkerExit;

// What a round's rendezvous agreed on.
struct World {
  int round = 0;  // the round joined (dynamic: may be later than asked, for a node arriving late)
  int group_rank = 0;
  int group_world_size = 1;
  int rank_offset = 0;  // global rank of this node's local rank 0
  int world_size = 0;
  // The same within the workers of this node's --role (ROLE_RANK of local rank 0, ROLE_WORLD_SIZE):
  // the nodes of one role in group-rank order, as torchrun numbers them.
  int role_rank_offset = 0;
  int role_world_size = 0;
  std::string master_addr;  // the worker store
  int master_port = 0;
  // The round's key for what a replica group's workers and agent write in the worker store
  // (common/ft_wire.hpp), hex; empty outside fault tolerance. Secret: never logged or shown.
  std::string worker_key;
  // On the node that hosts the worker store: every node's addresses (and host names), the only
  // peers its store accepts besides loopback. Empty elsewhere.
  std::vector<std::string> peer_addresses;
  // The job's restarts so far: the most any node of the round has made (a node that joined late,
  // or came back as a new process, counts from there, so --max_restarts holds for the job).
  int restarts = 0;
};

// What the node that reports a failure says of the job's progress, for the restart policy's
// no-progress stop (--max_no_progress_restarts): every node reads the same figures with the end.
struct ProgressMark {
  // The most training iterations any rank of that node had reported completing in the whole run
  // (worker::report_iterations) when its attempt ended; 0 when none did in this attempt while
  // earlier ones had; nullopt when the job has never reported any (nothing is known).
  std::optional<uint64_t> iterations;
  // Restarts in a row, counting the one this failure would start, that got no further than the
  // most iterations reported before them; 0 when this attempt got further (or nothing is known).
  int no_progress_restarts = 0;
  bool operator==(const ProgressMark&) const = default;
};

// How a round ended for the whole job.
struct RoundEnd {
  // StoreLost: the rendezvous itself is gone (node 0's store, every etcd endpoint).
  // Membership: a node asked to join the running job (elastic rendezvous only).
  // Hang: no rank of the job made progress for --hang_timeout (see watchdog.hpp).
  enum class Kind { Success, Failure, Signal, StoreLost, NodeLost, Membership, Hang } kind = Kind::Success;
  std::optional<WorkerExit> root_cause;  // Failure
  int root_node = -1;                    // Failure: the failed rank's node; Hang: the node that diagnosed it
  std::string detail;                    // human-readable, one line
  std::string report;                    // Hang: the full report, with every rank's stacks
  ProgressMark progress;                 // Failure: the job's progress, as its reporting node saw it
  // The job ended while this node waited as a spare (its nodes will not start another round):
  // nothing follows for this node, whatever the kind; it ends with the job.
  bool job_over = false;
};

// The job-wide side of the hang watchdog and the step rates, for one round. Used from the
// watchdog's thread, on a connection of its own.
class ProgressChannel {
 public:
  virtual ~ProgressChannel() = default;

  struct Pulse {
    int64_t job_progress = 0;            // moves whenever any node reports progress
    std::optional<int> hang_claimed_by;  // the node that is diagnosing a hang, if any
    // Some rank heartbeats through the worker store: CPU time is no sign of progress (its waits
    // may spin).
    bool heartbeat_mode = false;
  };
  // Says whether this node's ranks progressed since the last pulse (and, on the node hosting the
  // worker store, whether ranks heartbeat through it); returns the job-wide view.
  virtual Pulse pulse(bool progressed, bool heartbeat_mode) = 0;
  // This node's latest step rates (for `ddprun-rendezvous status` and the straggler check).
  virtual void publish_rates(const nlohmann::json& record) = 0;
  // Every node's latest step rates record, by node.
  virtual std::map<int, nlohmann::json> rates() = 0;
  // Claims the diagnosis of a hang for this node; false if another node claimed it first.
  virtual bool claim_hang() = 0;
  virtual void put_diagnosis(const nlohmann::json& diagnosis) = 0;
  // The nodes' diagnoses, as far as they arrive before `deadline`.
  virtual std::map<int, nlohmann::json> gather_diagnoses(std::chrono::steady_clock::time_point deadline) = 0;
  // Ends the round as hung; returns the end as decided (the first end proposed wins).
  virtual RoundEnd report_hang(const std::string& summary, const std::string& report) = 0;
  virtual int nodes() const = 0;
  virtual int node() const = 0;
};

// The round's worker store, started on this node: its port, and the round's key (World::worker_key).
struct HostedStore {
  uint16_t port = 0;
  std::string key;
};
// Starts the round's worker store on this node (called on group rank 0 only).
using WorkerStoreHost = std::function<HostedStore()>;

class RendezvousBackend {
 public:
  virtual ~RendezvousBackend() = default;

  // The round a newly started agent joins first (elastic jobs may be running already).
  virtual int first_round(const StopSignal& stop) = 0;
  // Joins `round` with `nproc` local workers: the World, or the round's end if it was decided
  // before the rendezvous completed (a node stopped or failed meanwhile). Throws TimeoutError
  // naming the missing nodes after the join timeout, ConfigError for a duplicate node rank.
  // An elastic job that runs with all its --nnodes MAX nodes keeps a node that arrives as a hot
  // spare: join() waits outside the world (told to on_spare's observer) until a round ends, joins
  // the next one in place of a node that was lost, and returns the job's end (job_over) when the
  // job ends without it.
  virtual std::variant<World, RoundEnd> join(int round, int nproc, const WorkerStoreHost& host_worker_store,
                                             const StopSignal& stop) = 0;
  // Watches `round` from a thread of its own; `on_end` runs there once, when the round's end is
  // decided (by any node). unwatch() stops and joins that thread.
  virtual void watch(int round, std::function<void(const RoundEnd&)> on_end) = 0;
  virtual void unwatch() = 0;
  // Proposes how the round ended; returns the end as decided (the first proposal wins).
  virtual RoundEnd report_failure(int round, const WorkerExit& root_cause, const ProgressMark& progress) = 0;
  virtual RoundEnd report_signal(int round, int signo) = 0;
  // This node's workers all succeeded: waits until every node's did or the round ended otherwise.
  virtual RoundEnd report_success(int round, const StopSignal& stop) = 0;
  // Waits for the round's end as another node decided it.
  virtual RoundEnd wait_end(int round, const StopSignal& stop) = 0;
  // The round's end if another node decides it within `timeout`; nullopt otherwise (and for a
  // single node, where no other node decides anything).
  virtual std::optional<RoundEnd> wait_end_for(int round, std::chrono::milliseconds timeout, const StopSignal& stop) {
    (void)round, (void)timeout, (void)stop;
    return std::nullopt;
  }
  // The job is over for this node: record the outcome and leave; the node that hosts a store the
  // others still need waits (up to `timeout`) for them to leave too.
  virtual void leave(int round, std::chrono::milliseconds timeout, const StopSignal& stop) = 0;
  // This node failed a health check before joining `round`, or a worker asked it to leave (`why`:
  // "failed its health check: ...", "was asked by a worker to leave the job: ..."), and it leaves the
  // job without a place in it: a static job cannot go on without it and ends (the others' report
  // names this node and `why`); an elastic one goes on without it. `strike`: it counts among the
  // times this host left the job's run unfit (unfit_leaves).
  virtual void leave_unready(int round, const std::string& why, bool strike) { (void)round, (void)why, (void)strike; }
  // Why nodes of this host left the job's current run unfit before (leave_unready with a strike),
  // oldest first, at most `most` of them: what keeps a flapping node from being taken back again
  // and again (--max_unfit_leaves). None on a single node.
  virtual std::vector<std::string> unfit_leaves(int most) {
    (void)most;
    return {};
  }
  // The job ends without leave() (its store is gone): background work (heartbeats) stops
  // reporting, so that nothing is printed after the job's last line.
  virtual void quiesce() {}
  // Whether a lost node leads to a new rendezvous of the survivors (elastic) rather than the end.
  virtual bool elastic() const = 0;
  // The restarts this node has made, recorded with its next join (see World::restarts).
  virtual void set_restarts(int restarts) { (void)restarts; }
  // Node rank to show in reports; -1 for a single-node job.
  virtual int node_rank() const = 0;
  // The job-wide progress channel of `round` (after join), on a connection of its own; nullptr
  // for a single-node job, whose watchdog needs none.
  virtual std::unique_ptr<ProgressChannel> progress_channel(int round) = 0;

  // Told, on the agent's thread, when this node has joined a round and waits for the others to
  // complete it (for the agent's health endpoint): the round and a line that says where this node
  // stands ("as node_rank 1 of 2").
  using JoinedObserver = std::function<void(int round, const std::string& detail)>;
  void on_joined(JoinedObserver observer) { joined_observer_ = std::move(observer); }
  // Told, on the agent's thread, when this node begins to wait as a spare of `round` (`end`
  // null; `detail` says why: "the job runs with all 2 of --nnodes 2:2"), and when that round has
  // ended (`end`: as decided; the spare moves on to the next round, or the job is over).
  using SpareObserver = std::function<void(int round, const std::string& detail, const RoundEnd* end)>;
  void on_spare(SpareObserver observer) { spare_observer_ = std::move(observer); }

 protected:
  void joined(int round, const std::string& detail) const {
    if (joined_observer_) joined_observer_(round, detail);
  }
  void spare_news(int round, const std::string& detail, const RoundEnd* end) const {
    if (spare_observer_) spare_observer_(round, detail, end);
  }

 private:
  JoinedObserver joined_observer_;
  SpareObserver spare_observer_;
};

}  // namespace ddprun::launcher::rendezvous
