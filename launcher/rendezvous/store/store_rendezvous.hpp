#pragma once
// Multi-node rendezvous over the TCPStore protocol: static (--nnodes N --node_rank K, node 0's
// agent hosts the store at --master_addr:--master_port) or dynamic (c10d: nodes join an endpoint
// without ranks), directly on node 0's store or through a ddprun-rendezvous daemon. The keys, and
// how a round's outcome is written, are in rendezvous/jobs/job_keys.hpp:
//   - each run of a job id is a generation of its own: a node joins the current generation unless
//     that run has ended, in which case it starts the next, so a job id can be run again on a
//     shared daemon; the last node to leave marks the generation done, for the daemon to forget;
//   - in a round, static nodes claim node/<K> (COMPARE_SET: a node rank joins once; a holder whose
//     heartbeat has stopped is a dead earlier run, and the node starts a new generation), and the
//     node that brings `joined` to N writes every assign/<K> and `complete`; dynamic nodes take
//     member/<arrival>, and the round closes with N nodes, or with MIN after the last call;
//   - `end` is decided by the first COMPARE_SET: a failure with its root cause, a stop signal, a
//     lost node, a membership change, or "success" (set by the last node to finish).
// Agents heartbeat (a counter per agent, so clocks need not agree) from the moment they hold a
// place; each watches the next node in group-rank order and ends the round when its heartbeat
// stops. Each agent watches `end` from a thread, so a failure on any node stops every node at once.
// Waits are sliced (at most 250 ms each) so a stop request is acted on at once; a node stopped
// during the rendezvous marks the round ended, and the others, which check for that between
// slices, learn of it at once too.
//
// Everything read from the store is parsed with checks: a malformed value is a ProtocolError that
// names the key. Thread-safety: one agent thread; the watcher and heartbeat threads have their own
// connections.

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "launcher/rendezvous/membership.hpp"
#include "launcher/rendezvous/node_rendezvous.hpp"
#include "launcher/rendezvous/rendezvous_backend.hpp"
#include "rendezvous/core/auth.hpp"
#include "rendezvous/client/client.hpp"
#include "rendezvous/jobs/job_keys.hpp"
#include "rendezvous/server/server.hpp"

namespace ddprun::launcher::rendezvous::store {

using ddprun::StopSignal;
using rendezvous::Joiner;
using rendezvous::NodeRendezvous;
using rendezvous::ProgressChannel;
using rendezvous::RoundEnd;
using rendezvous::WorkerStoreHost;
using rendezvous::World;

// The store backend's settings: the join's (JoinSettings; node_rank as below) and the store's own.
struct StoreRendezvousOptions : JoinSettings {
  // Called after each heartbeat (lease renewal) the rendezvous took: this node is still counted in.
  std::function<void()> alive;
  // Static: min_nodes == max_nodes and node_rank is this node's rank. Dynamic (c10d): nodes join
  // without ranks; a round closes with max_nodes nodes at once, or with at least min_nodes after
  // the last-call timeout; node_rank (if >= 0) is only an ordering hint.
  bool dynamic = false;
  std::string master_addr;
  uint16_t master_port = 0;
  // A standalone store (ddprun-rendezvous) to rendezvous through instead of one hosted by node 0.
  std::string endpoint_host;
  uint16_t endpoint_port = 0;
  // Dynamic: whether this node hosts the store at the endpoint (--rdzv_conf is_host); unset: when
  // the endpoint is one of this host's addresses and its port is free.
  std::optional<bool> is_host;
  // The rendezvous secret (or this job's token) and where it came from: the store this node hosts
  // is protected with it, and every connection proves it.
  std::optional<rdzv::core::Token> token;
  std::string token_file;
};

class StoreRendezvous final : public NodeRendezvous {
 public:
  // Node 0 binds the rendezvous store here (throws ConnectionError if the port is taken); every
  // node connects (retrying until join_timeout; StopRequested if `stop` comes first).
  StoreRendezvous(StoreRendezvousOptions options, const StopSignal& stop);
  ~StoreRendezvous() override;

  int first_round(const StopSignal& stop) override;
  std::variant<World, RoundEnd> join(int round, int nproc, const WorkerStoreHost& host_worker_store,
                                     const StopSignal& stop) override;
  void quiesce() override { request_heartbeat_stop(); }
  bool elastic() const override { return options_.dynamic; }
  bool hosts_the_store() const override { return server_ != nullptr; }
  bool may_shrink() const override { return options_.dynamic && options_.min_nodes < options_.max_nodes; }

  const StoreRendezvousOptions& options() const { return options_; }
  int64_t generation() const { return keys_.generation(); }

 private:
  std::string hb_key(const std::string& agent) const { return keys_.heartbeat(agent); }
  // The generation this node works in: the current one unless that run of the job has ended.
  int64_t choose_generation();
  // Starts generation `after` + 1 (or joins whichever newer one another node started).
  int64_t next_generation(int64_t after);
  // Whether the agent that wrote heartbeat key `agent` is alive: its counter moves within the
  // liveness window (keep_alive_interval x keep_alive_max_attempt).
  bool agent_alive(const std::string& agent, const StopSignal& stop);
  void assign(int round);
  World adopt(int round, const rdzv::jobs::Assignment& assigned, const rdzv::jobs::WorkerStoreRecord& store);
  // Writes every node's assignment (assign/<id>) for `ordered`, in group-rank order, with `extra`.
  void write_assignments(int round, const std::vector<Joiner>& ordered,
                         std::vector<std::pair<std::string, std::string>> extra);
  std::variant<World, RoundEnd> join_static(int round, int nproc, const WorkerStoreHost& host_worker_store,
                                            const StopSignal& stop);
  std::variant<World, RoundEnd> join_dynamic(int round, int nproc, const WorkerStoreHost& host_worker_store,
                                             const StopSignal& stop);
  // Dynamic: closes round `round` with the members that have joined (the first close wins) and,
  // if this call closed it, writes every member's assignment.
  void close_dynamic(int round);
  // The join's poll (NodeRendezvous::wait_joining): ready when every key of `keys` is set.
  JoinPoll keys_set(int round, std::vector<std::string> keys);

  // The round protocol's key-value interface (node_rendezvous.hpp) on a TCPStore.
  rdzv::jobs::RoundKeys round_keys(int round) const override { return keys_.round(round); }
  std::string ended_key() const override { return keys_.ended(); }
  rdzv::jobs::JobKeys job_keys() const override { return keys_; }
  std::optional<std::string> read(const std::string& key) override;  // CHECK, then GET
  // COMPARE_SET with an empty expected value: the store sets it only if absent.
  std::string create_or_get(const std::string& key, const std::string& value) override;
  int64_t tally(int round, Tally what, bool count_me) override;  // a counter: ADD 1 (or ADD 0 to read)
  // WAIT in slices; a connection that is lost and cannot ride out outages is the store lost.
  std::unique_ptr<KeyWait> wait_for_key(const std::string& key) override;
  // WAIT on `end` every period and, between waits, the next node's heartbeat counter.
  std::unique_ptr<RoundWatch> watch_round(int round) override;
  // The round's agents (from an assignment: jobs of up to 64 nodes), their heartbeat counters
  // read in one request per look.
  std::unique_ptr<WorldLiveness> watch_liveness(int round) override;
  int64_t joined_nodes(int round) override;  // the arrivals counter
  void forget_generation() override;         // `done`: the daemon's janitor forgets the generation
  // The node that hosts the store waits for `done` (the others must read the outcome from it).
  void linger(int nodes, std::chrono::milliseconds timeout, const StopSignal& stop) override;
  void stop_background() override { stop_heartbeat(); }
  std::string store_name() const override { return "the rendezvous store"; }
  std::unique_ptr<ProgressChannel> open_progress_channel(int round, int node, int nodes) override;

  void start_heartbeat();
  void stop_heartbeat();
  // A second connection to the rendezvous store for the watcher or heartbeat thread; `on_refused`
  // is told of each reconnection the store's host refuses (ClientOptions::on_refused).
  std::shared_ptr<rdzv::client::Client> side_connection(std::function<void()> on_refused = {}) const;
  // The next node in group-rank order whose heartbeat has not moved for too long, if any.
  // The watched node's heartbeat counter as last read, since when, and the connection it was read on.
  struct HeartbeatSeen {
    int64_t beats = -1;
    std::chrono::steady_clock::time_point since;
    uint64_t reconnects = 0;
  };
  std::optional<int> find_lost_node(rdzv::client::Client& c, HeartbeatSeen& seen);
  class Watch;     // the watcher's view of a round: its end, or the next node's heartbeat stopping
  class Liveness;  // a spare's view of the world's heartbeats

  StoreRendezvousOptions options_;
  std::unique_ptr<rdzv::server::ServerThread> server_;  // the node that hosts the rendezvous store
  std::unique_ptr<rdzv::client::Client> client_;
  // Tells the heartbeat thread to end (wakes it from its period's wait); does not wait for it.
  void request_heartbeat_stop();
  std::thread heartbeat_;
  std::atomic<bool> stop_heartbeat_{false};
  std::atomic<bool> heartbeat_ended_{false};  // the thread has returned (start_heartbeat starts a new one)
  std::mutex heartbeat_mutex_;
  std::condition_variable heartbeat_cv_;  // the period's wait: a stop ends it at once
  rdzv::jobs::JobKeys keys_{"none", 1};
  std::string agent_id_;  // heartbeat key: unique per agent process
};

}  // namespace ddprun::launcher::rendezvous::store
