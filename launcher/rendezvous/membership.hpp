#pragma once
// A round's membership, the same on every backend: the order that makes group ranks, and what
// each node derives from the ordered records (rank offsets, the world size, the worker store's
// allow list, the heartbeat ring). The store and etcd backends differ only in how the records
// travel.

#include <cstdint>
#include <string>
#include <vector>

#include "launcher/rendezvous/join_settings.hpp"
#include "launcher/rendezvous/rendezvous_backend.hpp"
#include "rendezvous/jobs/records.hpp"

namespace ddprun::launcher::rendezvous {

// A node that joined a round that is not closed yet.
struct Joiner {
  std::string id;  // what its member key ends with (store: its arrival; etcd: its agent id)
  rdzv::jobs::NodeRecord record;
  int64_t arrival = 0;  // order of arrival (store: the joined counter; etcd: the key's create revision)
};

// This node's record as it joins a round: its host, address, role and --nnodes MAX from `s`,
// `nproc`, this process's pid and the time now; the backend fills in the rest it uses.
rdzv::jobs::NodeRecord this_node(const JoinSettings& s, int nproc);

// Group-rank order: the node hosting the rendezvous store first (global rank 0 lands on the
// endpoint's host), then --node_rank hints, then arrival. Stable.
void order_by_group_rank(std::vector<Joiner>& joiners);

// A closed round's nodes in group-rank order.
class Membership {
 public:
  explicit Membership(std::vector<rdzv::jobs::NodeRecord> nodes);
  const std::vector<rdzv::jobs::NodeRecord>& nodes() const { return nodes_; }
  int size() const { return static_cast<int>(nodes_.size()); }
  int world_size() const { return world_size_; }
  // The global rank of group rank `g`'s local rank 0: the sum of nproc before it.
  int rank_offset(int g) const { return offsets_.at(static_cast<size_t>(g)); }
  // The same among the nodes of g's role (torchrun's ROLE_RANK), and the workers of that role.
  int role_offset(int g) const { return role_offsets_.at(static_cast<size_t>(g)); }
  int role_world_size(int g) const;
  std::vector<std::string> agents() const;
  std::vector<std::string> hosts() const;
  // Every node's address and host name: the only peers the worker store admits besides loopback.
  std::vector<std::string> peer_addresses() const;
  // The group rank of `agent`; -1 if it is not a member.
  int group_rank_of(const std::string& agent) const;

 private:
  std::vector<rdzv::jobs::NodeRecord> nodes_;
  std::vector<int> offsets_;
  std::vector<int> role_offsets_;
  int world_size_ = 0;
};

// Group rank `g`'s world in a round of `m`, whose worker store is `store`.
World world_of(int round, const Membership& m, int g, const rdzv::jobs::WorkerStoreRecord& store);

}  // namespace ddprun::launcher::rendezvous
