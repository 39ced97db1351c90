#pragma once
// Static multi-node rendezvous (--nnodes N --node_rank K --master_addr A --master_port P) over the
// TCPStore protocol. Node 0's agent hosts the rendezvous store at A:P; every agent is a client.
//
// Keys, under /ddprun/<run_id>/r<round>/:
//   node/<K>      JSON {host, addr, nproc, pid} of node K (COMPARE_SET: a node rank joins once)
//   joined        counter; the agent that brings it to N writes every `assign/<K>` and `complete`
//   assign/<K>    JSON {offset, world_size}: node K's first global rank and the job's size
//   worker_store  JSON {addr, port} of the round's fresh worker store, hosted by node 0
//   end           how the round ended, decided by the first COMPARE_SET: a failure (JSON with the
//                 root cause), a stop signal, or "success" (set by the last node to finish)
//   finished, exited  counters for the end-of-round and end-of-job barriers
// and /ddprun/<run_id>/hb/<K>: node K's heartbeat counter (ADD every keep_alive_interval; counters,
// not timestamps, so clocks need not agree). Node 0 ends the round when one stops moving.
// Each agent watches `end` from a thread, so a failure on any node stops every node at once.
//
// Blocking calls; thread-safe (one client per thread).

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

#include "launcher/report.hpp"
#include "rendezvous/client.hpp"
#include "rendezvous/server.hpp"

namespace ddprun::launcher {

// What a round's rendezvous agreed on.
struct World {
  int round = 0;  // the round joined (dynamic: may be later than asked, for a node arriving late)
  int group_rank = 0;
  int group_world_size = 1;
  int rank_offset = 0;  // global rank of this node's local rank 0
  int world_size = 0;
  std::string master_addr;  // the worker store
  int master_port = 0;
};

// How a round ended for the whole job.
struct RoundEnd {
  // Membership: a node asked to join the running job (dynamic rendezvous only).
  enum class Kind { Success, Failure, Signal, StoreLost, NodeLost, Membership } kind = Kind::Success;
  std::optional<WorkerExit> root_cause;  // Failure
  int root_node = -1;
  std::string detail;  // human-readable
};

struct NodeRendezvousOptions {
  std::string run_id = "none";
  // Static: min_nodes == nnodes and node_rank is this node's rank. Dynamic (c10d): nodes join
  // without ranks; a round closes with nnodes nodes at once, or with at least min_nodes after
  // last_call_timeout; node_rank (if >= 0) is only an ordering hint.
  bool dynamic = false;
  int min_nodes = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::chrono::milliseconds last_call_timeout{std::chrono::seconds(30)};
  std::string master_addr;
  uint16_t master_port = 0;
  // A standalone store (ddprun-rendezvous) to rendezvous through instead of one hosted by node 0.
  std::string endpoint_host;
  uint16_t endpoint_port = 0;
  std::string advertise_addr;  // how other nodes reach this one
  std::string host;
  std::chrono::milliseconds join_timeout{std::chrono::seconds(600)};
  // Agents heartbeat every keep_alive_interval; node 0 declares a node lost after
  // keep_alive_max_attempt intervals without one.
  std::chrono::milliseconds keep_alive_interval{std::chrono::seconds(5)};
  int keep_alive_max_attempt = 3;
};

class NodeRendezvous {
 public:
  // Node 0 binds the rendezvous store here (throws ConnectionError if the port is taken); every
  // node connects (retrying until join_timeout).
  explicit NodeRendezvous(NodeRendezvousOptions options);
  ~NodeRendezvous();

  // Joins round `round` with `nproc` local workers. `host_worker_store` is called on the node that
  // becomes group rank 0, which then hosts the round's worker store; it returns the store's port.
  // Throws TimeoutError naming the missing node ranks, ConfigError for a duplicate node rank.
  World join(int round, int nproc, const std::function<uint16_t()>& host_worker_store);
  // The round a newly started agent should join (dynamic: the job may be running already).
  int current_round();
  bool hosts_store() const { return server_ != nullptr; }

  // Starts watching the round's `end` key; `on_end` runs on the watcher thread once it is decided.
  void watch(int round, std::function<void(const RoundEnd&)> on_end);
  // Records a local failure; returns the round's end as decided (ours if we were first).
  RoundEnd report_failure(int round, const WorkerExit& failure);
  // Waits for the round's end, decided by another node (after our workers were stopped).
  RoundEnd wait_end(int round);
  RoundEnd report_signal(int round, int signo);
  // This node's workers all succeeded; blocks until every node did or the round ended otherwise.
  RoundEnd report_success(int round, int nproc_total_nodes);
  // End-of-job barrier: node 0 (the store host) waits for the others to leave, up to `timeout`.
  void leave(int round, std::chrono::milliseconds timeout);

  const NodeRendezvousOptions& options() const { return options_; }

 private:
  std::string key(int round, const std::string& name) const;
  std::string hb_key(const std::string& agent) const;
  void assign(int round);
  World adopt(int round, const nlohmann::json& assigned, const nlohmann::json& store);
  void write_assignments(int round, const std::vector<std::pair<std::string, nlohmann::json>>& ordered,
                         std::vector<std::pair<std::string, std::string>> extra);
  World join_static(int round, int nproc, std::optional<uint16_t> worker_store_port);
  World join_dynamic(int round, int nproc, const std::function<uint16_t()>& host_worker_store);
  // Dynamic: closes round `round` with the members that have joined (the first close wins) and,
  // if this call closed it, writes every member's assignment.
  void close_dynamic(int round);
  RoundEnd decide(int round, const std::string& proposal);
  RoundEnd parse_end(const std::string& value) const;
  void stop_watcher();
  void start_heartbeat();
  // A second connection to the rendezvous store for the watcher or heartbeat thread.
  std::shared_ptr<rdzv::Client> side_connection() const;
  // Node 0: the node whose heartbeat has not moved for too long, if any (checked once per interval).
  // The next node in group-rank order whose heartbeat has not moved for too long, if any.
  std::optional<int> find_lost_node(rdzv::Client& c, std::pair<int64_t, std::chrono::steady_clock::time_point>& seen);

  NodeRendezvousOptions options_;
  std::unique_ptr<rdzv::ServerThread> server_;  // node 0 only
  std::unique_ptr<rdzv::Client> client_;
  std::thread watcher_;
  std::atomic<bool> stop_watching_{false};
  std::thread heartbeat_;
  std::atomic<bool> stop_heartbeat_{false};
  std::string agent_id_;  // heartbeat key: "node<K>" (static) or host:pid (dynamic)
  // The current round's membership, in group-rank order (heartbeat ids and hosts).
  int group_rank_ = 0;
  std::vector<std::string> member_ids_;
  std::vector<std::string> member_hosts_;
  std::mutex members_mutex_;
};

}  // namespace ddprun::launcher
