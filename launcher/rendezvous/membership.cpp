#include "launcher/rendezvous/membership.hpp"

#include <unistd.h>

#include <algorithm>
#include <climits>

#include "common/system.hpp"

namespace ddprun::launcher::rendezvous {

rdzv::jobs::NodeRecord this_node(const JoinSettings& s, int nproc) {
  rdzv::jobs::NodeRecord r;
  r.host = s.host;
  r.addr = s.advertise_addr;
  r.role = s.role;
  r.nproc = nproc;
  r.pid = static_cast<int>(::getpid());
  r.nnodes = s.max_nodes;
  r.joined_ms = now_ms();
  return r;
}

void order_by_group_rank(std::vector<Joiner>& joiners) {
  std::stable_sort(joiners.begin(), joiners.end(), [](const Joiner& a, const Joiner& b) {
    if (a.record.store_host != b.record.store_host) return a.record.store_host;
    const int ka = a.record.hint < 0 ? INT_MAX : a.record.hint, kb = b.record.hint < 0 ? INT_MAX : b.record.hint;
    if (ka != kb) return ka < kb;
    return a.arrival < b.arrival;
  });
}

Membership::Membership(std::vector<rdzv::jobs::NodeRecord> nodes) : nodes_(std::move(nodes)) {
  for (const auto& n : nodes_) {
    offsets_.push_back(world_size_);
    world_size_ += n.nproc;
    int role_offset = 0;
    for (size_t i = 0; i < role_offsets_.size(); ++i) {
      if (nodes_[i].role == n.role) role_offset += nodes_[i].nproc;
    }
    role_offsets_.push_back(role_offset);
  }
}

int Membership::role_world_size(int g) const {
  int size = 0;
  for (const auto& n : nodes_) {
    if (n.role == nodes_.at(static_cast<size_t>(g)).role) size += n.nproc;
  }
  return size;
}

std::vector<std::string> Membership::agents() const {
  std::vector<std::string> out;
  for (const auto& n : nodes_) out.push_back(n.agent);
  return out;
}

std::vector<std::string> Membership::hosts() const {
  std::vector<std::string> out;
  for (const auto& n : nodes_) out.push_back(n.host);
  return out;
}

std::vector<std::string> Membership::peer_addresses() const {
  std::vector<std::string> out;
  for (const auto& n : nodes_) {
    out.push_back(n.addr);
    out.push_back(n.host);
  }
  return out;
}

int Membership::group_rank_of(const std::string& agent) const {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].agent == agent) return static_cast<int>(i);
  }
  return -1;
}

World world_of(int round, const Membership& m, int g, const rdzv::jobs::WorkerStoreRecord& store) {
  World w;
  w.round = round;
  w.group_rank = g;
  w.group_world_size = m.size();
  w.rank_offset = m.rank_offset(g);
  w.world_size = m.world_size();
  w.role_rank_offset = m.role_offset(g);
  w.role_world_size = m.role_world_size(g);
  w.master_addr = store.addr;
  w.master_port = store.port;
  w.worker_key = store.key;
  if (g == 0) w.peer_addresses = m.peer_addresses();
  for (const auto& node : m.nodes()) w.restarts = std::max(w.restarts, node.restarts);
  return w;
}

}  // namespace ddprun::launcher::rendezvous
