#pragma once
// What a node's rendezvous is told, whichever backend runs it (the store's or etcd's): the job,
// this node, and how long each wait may last. The agent fills one in from the command line
// (Agent::join_settings); each backend's options extend it with their own.

#include <chrono>
#include <string>

#include "common/defaults.hpp"

namespace ddprun::launcher::rendezvous {

// The rendezvous' waits, as --rdzv_conf sets them (torchrun's keys and defaults).
struct Timeouts {
  // join_timeout: how long a join waits for its round to form.
  std::chrono::milliseconds join_timeout{defaults::kJoinTimeout};
  // last_call_timeout: once min_nodes are in, how long a round waits for more.
  std::chrono::milliseconds last_call_timeout{std::chrono::seconds(30)};
  // read_timeout: one request to the store.
  std::chrono::milliseconds read_timeout{std::chrono::seconds(60)};
  // store_reconnect_timeout: how long a store that keeps its state (ddprun-rendezvous
  // --state-file) may be gone, e.g. while it restarts, before a node counts it as lost
  // (rdzv::client::ClientOptions::outage_tolerance).
  std::chrono::milliseconds store_reconnect_timeout{std::chrono::seconds(30)};
  // keep_alive_interval, keep_alive_max_attempt: the store backend's agents heartbeat every
  // interval, and a node is lost after max_attempt intervals without one (etcd's lease has a TTL).
  std::chrono::milliseconds keep_alive_interval{std::chrono::seconds(5)};
  int keep_alive_max_attempt = 3;

  bool operator==(const Timeouts&) const = default;
};

struct JoinSettings {
  std::string run_id = "none";  // the job's id (a replica group's own world: "<run_id>.rg<ID>")
  int min_nodes = 1;
  int max_nodes = 1;  // --nnodes MIN:MAX's MAX
  // A static job: this node's rank. A dynamic one (c10d, etcd): an ordering hint, -1 for none.
  int node_rank = -1;
  std::string advertise_addr;  // how the other nodes (and the workers) reach this node
  std::string host;            // this node's host name, for the reports
  // --role: the workers' ROLE_RANK counts within the nodes of one role.
  std::string role = "default";
  Timeouts timeouts;
  // A node that waits says so this often.
  std::chrono::milliseconds progress_interval{defaults::kProgressInterval};
};

}  // namespace ddprun::launcher::rendezvous
