#pragma once
// The records a round keeps, each with one encoder and one decoder: what the launcher's backends
// write (store or etcd) and what they, and `ddprun-rendezvous status`, read back. A record comes
// from another process, possibly another version: decoding never throws; a field of the wrong
// type reads as its default, and what cannot be a record at all is nullopt.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::rdzv::jobs {

// A node in a round: node/<K> (static jobs) or member/<id> (elastic jobs).
struct NodeRecord {
  std::string host;         // its host name
  std::string addr;         // the address the other nodes reach it at
  std::string agent;        // its agent's id (on etcd the member key names it; "" in the record)
  int nproc = 0;            // its workers
  int pid = 0;              // its agent's process
  int nnodes = 0;           // its --nnodes (the maximum, for elastic jobs)
  int64_t joined_ms = 0;    // wall clock when it joined (for status only)
  int hint = -1;            // elastic jobs: --node_rank as an ordering hint; -1: none
  bool store_host = false;  // elastic jobs on a store: this node hosts the rendezvous store
  int restarts = 0;         // the restarts its agent has made: the job's count is the most of any node
  // Its --role: ROLE_RANK counts within the nodes of one role.
  std::string role = "default";
  bool operator==(const NodeRecord&) const = default;
};
nlohmann::json to_json(const NodeRecord& r);
std::string encode(const NodeRecord& r);
// nullopt when `j` is not a JSON object.
std::optional<NodeRecord> node_record_from_json(const nlohmann::json& j);
std::optional<NodeRecord> decode_node_record(std::string_view text);

// Where a round's worker store (MASTER_ADDR:MASTER_PORT) is.
struct WorkerStoreRecord {
  std::string addr;
  int port = 0;
  // A replica group's round key (hex; ddprun --replica_group), empty otherwise. It travels to the
  // group's other nodes here, as secret as the rendezvous store: the daemon's pages never show it.
  std::string key;
  bool operator==(const WorkerStoreRecord&) const = default;
};
std::string encode(const WorkerStoreRecord& r);
// nullopt when `text` is not a JSON object with an address and a port in 1-65535.
std::optional<WorkerStoreRecord> decode_worker_store(std::string_view text);

// A node's place in a closed round on a store (assign/<id>): written by the node that closes the
// round, one per node.
struct Assignment {
  int group_rank = -1;
  int group_world_size = 0;
  int offset = -1;  // the global rank of the node's local rank 0
  int world_size = 0;
  std::vector<std::string> agents;  // every node's agent, in group-rank order (jobs of up to 64 nodes)
  std::vector<std::string> hosts;   // every node's host, in group-rank order (jobs of up to 64 nodes)
  std::vector<std::string> addrs;   // group rank 0 only: every node's address and host name
  int restarts = 0;                 // the job's restarts: the most any node of the round has made
  // The rank of the node's local rank 0 among the workers of its --role, and their number
  // (torchrun's ROLE_RANK, ROLE_WORLD_SIZE); -1 and 0 when the record has none (an older version's,
  // of a job of one role): offset and world_size then.
  int role_offset = -1;
  int role_world_size = 0;
  bool operator==(const Assignment&) const = default;
};
std::string encode(const Assignment& a);
// nullopt when `text` is not a JSON object with group_rank, group_world_size, offset and world_size.
std::optional<Assignment> decode_assignment(std::string_view text);

// A closed round's members on etcd (closed): every node's record, its agent filled in, in
// group-rank order.
struct ClosedRound {
  std::vector<NodeRecord> members;
  bool operator==(const ClosedRound&) const = default;
};
std::string encode(const ClosedRound& c);
// nullopt when `text` is not a JSON object with a members array of objects.
std::optional<ClosedRound> decode_closed_round(std::string_view text);

}  // namespace ddprun::rdzv::jobs
