// Joining a round of a store rendezvous (see store_rendezvous.hpp): static node ranks claimed
// with COMPARE_SET, dynamic arrivals closed by the MAX-th node or after the last call, assignments
// written once by one node, and waits that a stop or an early end of the round cut short.
#include <algorithm>
#include <climits>
#include <tuple>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "launcher/rendezvous/round_records.hpp"
#include "launcher/rendezvous/store/store_rendezvous.hpp"

namespace ddprun::launcher::rendezvous::store {

using ddprun::StopSignal;
using rendezvous::Joiner;
using rendezvous::Membership;
using rendezvous::order_by_group_rank;
using rendezvous::read_assignment;
using rendezvous::read_node_record;
using rendezvous::read_number;
using rendezvous::read_worker_store;
using rendezvous::RoundEnd;
using rendezvous::this_node;
using rendezvous::WorkerStoreHost;
using rendezvous::World;

std::variant<World, RoundEnd> StoreRendezvous::join(int round, int nproc, const WorkerStoreHost& host_worker_store,
                                                    const StopSignal& stop) {
  if (stop.requested()) throw StopRequested(stop.signo());
  return options_.dynamic ? join_dynamic(round, nproc, host_worker_store, stop)
                          : join_static(round, nproc, host_worker_store, stop);
}

std::variant<World, RoundEnd> StoreRendezvous::join_static(int round, int nproc,
                                                           const WorkerStoreHost& host_worker_store,
                                                           const StopSignal& stop) {
  const int n = options_.max_nodes;
  rdzv::jobs::NodeRecord me = this_node(options_, nproc);
  me.agent = agent_id_;
  me.restarts = restarts();
  const std::string mine = rdzv::jobs::encode(me);
  for (;;) {
    const std::string node_key = round_keys(round).node(options_.node_rank);
    const std::string held = client_->compare_set(node_key, "", mine);
    if (held == mine) break;
    // Someone holds this node rank in this run of the job.
    const auto other = rdzv::jobs::decode_node_record(held);
    const std::string holder = other ? other->agent : std::string();
    const std::string where =
        other ? other->host + " (pid " + std::to_string(other->pid) + ")" : std::string("another agent");
    const bool ended = client_->check({keys_.ended()});
    if (round == 0 && (ended || holder.empty() || !agent_alive(holder, stop))) {
      // That run is over (or its agents are gone): this is a new run of the job id.
      const int64_t g = next_generation(keys_.generation());
      log::info("ddprun") << "job '" << options_.run_id << "': generation " << keys_.generation()
                          << (ended ? " has ended" : " was left by agents that are gone (" + where + ")")
                          << "; this run is generation " << g;
      keys_ = rdzv::jobs::JobKeys(options_.run_id, g);
      continue;
    }
    throw ConfigError("node_rank " + std::to_string(options_.node_rank) + " has already joined this job from " + where +
                      ", which is still running; give every node a different --node_rank, or each job its "
                      "own --rdzv_id");
  }
  start_heartbeat();  // from now on: a node that holds a rank is seen to be alive
  log::info("ddprun") << "joined round " << round << " of job '" << options_.run_id << "' (generation "
                      << keys_.generation() << ") as node_rank " << options_.node_rank << " of " << n;
  joined(round, "as node_rank " + std::to_string(options_.node_rank) + " of " + std::to_string(n));
  if (options_.node_rank == 0) {
    const rendezvous::HostedStore hosted = host_worker_store();
    client_->set(round_keys(round).worker_store(),
                 rdzv::jobs::encode(rdzv::jobs::WorkerStoreRecord{options_.advertise_addr, hosted.port, hosted.key}));
  }
  if (client_->add(round_keys(round).joined(), 1) == n) assign(round);
  // Who is missing, by node rank (checked only for jobs small enough to list them).
  auto missing_ranks = [&]() {
    std::string missing;
    int joined = 0;
    for (int k = 0; k < n; ++k) {
      if (client_->check({round_keys(round).node(k)})) {
        ++joined;
      } else {
        missing += (missing.empty() ? "" : ", ") + std::to_string(k);
      }
    }
    return std::make_pair(joined, missing);
  };
  auto progress = [&]() -> std::string {
    const int64_t joined = client_->add(round_keys(round).joined(), 0);
    if (n > 64) return std::to_string(joined) + " of " + std::to_string(n) + " nodes joined";
    return std::to_string(joined) + " of " + std::to_string(n) + " nodes joined, waiting for node_rank " +
           missing_ranks().second;
  };
  auto missing = [&]() {
    const auto [joined, ranks] = missing_ranks();
    return std::to_string(joined) + " of " + std::to_string(n) + " nodes joined; missing node_rank " + ranks;
  };
  if (auto ended =
          wait_joining(round, stop, keys_set(round, {round_keys(round).complete(), round_keys(round).worker_store()}),
                       progress, missing)) {
    return *ended;
  }
  // Two reads, whatever the job's size: this node's assignment and the worker store.
  const std::string assign_key = round_keys(round).assign(std::to_string(options_.node_rank));
  const std::string store_key = round_keys(round).worker_store();
  const auto values = client_->multi_get({assign_key, store_key});
  return adopt(round, read_assignment(assign_key, values[0]), read_worker_store(store_key, values[1]));
}

World StoreRendezvous::adopt(int round, const rdzv::jobs::Assignment& assigned,
                             const rdzv::jobs::WorkerStoreRecord& store) {
  World w;
  w.round = round;
  w.group_rank = assigned.group_rank;
  w.group_world_size = assigned.group_world_size;
  w.rank_offset = assigned.offset;
  w.world_size = assigned.world_size;
  w.role_rank_offset = assigned.role_offset >= 0 ? assigned.role_offset : assigned.offset;
  w.role_world_size = assigned.role_world_size > 0 ? assigned.role_world_size : assigned.world_size;
  w.peer_addresses = assigned.addrs;
  w.master_addr = store.addr;
  w.master_port = store.port;
  w.worker_key = store.key;
  w.restarts = assigned.restarts;
  set_place(Place{w.group_rank, w.group_world_size, assigned.agents, assigned.hosts});
  return w;
}

void StoreRendezvous::write_assignments(int round, const std::vector<Joiner>& ordered,
                                        std::vector<std::pair<std::string, std::string>> extra) {
  // The membership list (for the heartbeat ring) rides along for jobs of up to 64 nodes.
  std::vector<rdzv::jobs::NodeRecord> records;
  for (const auto& j : ordered) records.push_back(j.record);
  const Membership m(std::move(records));
  std::vector<std::pair<std::string, std::string>> assignments;
  for (int g = 0; g < m.size(); ++g) {
    rdzv::jobs::Assignment a;
    a.group_rank = g;
    a.group_world_size = m.size();
    a.offset = m.rank_offset(g);
    a.world_size = m.world_size();
    a.role_offset = m.role_offset(g);
    a.role_world_size = m.role_world_size(g);
    for (const auto& node : m.nodes()) a.restarts = std::max(a.restarts, node.restarts);
    if (m.size() <= 64) {
      a.agents = m.agents();
      a.hosts = m.hosts();
    }
    // The worker store's host admits only the job's nodes: it alone gets every address.
    if (g == 0) a.addrs = m.peer_addresses();
    assignments.emplace_back(round_keys(round).assign(ordered[static_cast<size_t>(g)].id), rdzv::jobs::encode(a));
  }
  for (auto& e : extra) assignments.push_back(std::move(e));
  client_->multi_set(assignments);
}

void StoreRendezvous::assign(int round) {
  // The last node to join reads every node's record once and writes one small assignment per
  // node: O(n) in total.
  std::vector<std::string> keys;
  for (int k = 0; k < options_.max_nodes; ++k) keys.push_back(round_keys(round).node(k));
  const auto values = client_->multi_get(keys);
  std::vector<Joiner> ordered;
  for (int k = 0; k < options_.max_nodes; ++k) {
    const auto i = static_cast<size_t>(k);
    ordered.push_back({std::to_string(k), read_node_record(keys[i], values[i]), k});
  }
  write_assignments(round, ordered, {{round_keys(round).complete(), "1"}});
}

std::variant<World, RoundEnd> StoreRendezvous::join_dynamic(int round, int nproc,
                                                            const WorkerStoreHost& host_worker_store,
                                                            const StopSignal& stop) {
  for (;;) {
    rdzv::jobs::NodeRecord me = this_node(options_, nproc);
    me.agent = agent_id_;
    me.restarts = restarts();
    me.hint = options_.node_rank;
    me.store_host = server_ != nullptr;
    const int64_t idx = client_->add(round_keys(round).joined(), 1);
    // The round's first arrival says which round is current, for agents that start later
    // (first_round); one request for the round rather than one per node.
    if (idx == 1) client_->set(keys_.current_round(), std::to_string(round));
    client_->set(round_keys(round).member(std::to_string(idx)), rdzv::jobs::encode(me));
    start_heartbeat();
    log::info("ddprun") << "joined round " << round << " of job '" << options_.run_id << "' (generation "
                        << keys_.generation() << ") as arrival " << idx << " (--nnodes " << options_.min_nodes << ":"
                        << options_.max_nodes << ")";
    joined(round, "as arrival " + std::to_string(idx) + " (--nnodes " + std::to_string(options_.min_nodes) + ":" +
                      std::to_string(options_.max_nodes) + ")");
    if (idx == options_.max_nodes) {
      close_dynamic(round);  // full
    } else if (idx == options_.min_nodes) {
      // Enough nodes: wait the last call for more, then close with whoever is there.
      const auto deadline = std::chrono::steady_clock::now() + options_.timeouts.last_call_timeout;
      while (std::chrono::steady_clock::now() < deadline && !client_->check({round_keys(round).closed()})) {
        // The last-call window, in slices so that a full round or a stop is seen promptly.
        if (stop.sleep_for(std::min<std::chrono::milliseconds>(options_.timeouts.last_call_timeout,
                                                               std::chrono::milliseconds(100)))) {
          break;  // wait_joining leaves the round cleanly
        }
      }
      if (!stop.requested()) close_dynamic(round);
    }
    auto progress = [&]() -> std::string {
      return std::to_string(client_->add(round_keys(round).joined(), 0)) + " node(s) joined, " +
             std::to_string(options_.min_nodes) + " needed to start";
    };
    auto missing = [&]() {
      return std::to_string(client_->add(round_keys(round).joined(), 0)) + " node(s) joined, " +
             std::to_string(options_.min_nodes) + " needed (--nnodes " + std::to_string(options_.min_nodes) + ":" +
             std::to_string(options_.max_nodes) + ")";
    };
    if (auto ended = wait_joining(round, stop, keys_set(round, {round_keys(round).closed()}), progress, missing))
      return *ended;
    const int64_t members = read_number(round_keys(round).closed(), client_->get(round_keys(round).closed()));
    if (idx > members) {
      // Too late for this round: ask the running nodes to re-rendezvous (when there is room for
      // this node) or wait as a spare (when there is none), and join the next round.
      if (members < options_.max_nodes) {
        ask_to_admit_this_node(round, static_cast<int>(members));
      } else if (auto over = wait_as_spare(round, static_cast<int>(members), stop)) {
        return *over;
      }
      ++round;
      continue;
    }
    const std::string assign_key = round_keys(round).assign(std::to_string(idx));
    if (auto ended = wait_joining(round, stop, keys_set(round, {assign_key}), progress, missing)) return *ended;
    const rdzv::jobs::Assignment assigned = read_assignment(assign_key, client_->get(assign_key));
    if (assigned.group_rank == 0) {
      const rendezvous::HostedStore hosted = host_worker_store();
      client_->set(round_keys(round).worker_store(),
                   rdzv::jobs::encode(rdzv::jobs::WorkerStoreRecord{options_.advertise_addr, hosted.port, hosted.key}));
    }
    const std::string store_key = round_keys(round).worker_store();
    if (auto ended = wait_joining(round, stop, keys_set(round, {store_key}), progress, missing)) return *ended;
    return adopt(round, assigned, read_worker_store(store_key, client_->get(store_key)));
  }
}

void StoreRendezvous::close_dynamic(int round) {
  const int64_t joined = std::min<int64_t>(client_->add(round_keys(round).joined(), 0), options_.max_nodes);
  const std::string count = std::to_string(joined);
  if (client_->compare_set(round_keys(round).closed(), "", count) != count) return;  // someone else closed it
  std::vector<std::string> keys;
  for (int64_t i = 1; i <= joined; ++i) keys.push_back(round_keys(round).member(std::to_string(i)));
  const auto values = client_->multi_get(keys);
  std::vector<Joiner> ordered;
  for (int64_t i = 0; i < joined; ++i) {
    const auto k = static_cast<size_t>(i);
    ordered.push_back({std::to_string(i + 1), read_node_record(keys[k], values[k]), i + 1});
  }
  order_by_group_rank(ordered);
  write_assignments(round, ordered, {});
}

}  // namespace ddprun::launcher::rendezvous::store
