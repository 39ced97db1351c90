// Joining a round of a store rendezvous (see store_rendezvous.hpp): static node ranks claimed
// with COMPARE_SET, dynamic arrivals closed by the MAX-th node or after the last call, assignments
// written once by one node, and waits that a stop or an early end of the round cut short.
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <tuple>
#include <nlohmann/json.hpp>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "launcher/rendezvous_values.hpp"
#include "launcher/store_rendezvous.hpp"

namespace ddprun::launcher {

using json = nlohmann::json;

std::variant<World, RoundEnd> StoreRendezvous::join(int round, int nproc, const WorkerStoreHost& host_worker_store,
                                                    const StopSignal& stop) {
  if (stop.requested()) throw StopRequested(stop.signo());
  return options_.dynamic ? join_dynamic(round, nproc, host_worker_store, stop)
                          : join_static(round, nproc, host_worker_store, stop);
}

std::optional<RoundEnd> StoreRendezvous::wait_joining(int round, const std::vector<std::string>& keys,
                                                      const StopSignal& stop,
                                                      const std::function<std::string()>& progress,
                                                      const std::function<void()>& on_timeout) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + options_.join_timeout;
  auto next_report = start + options_.progress_interval;
  for (;;) {
    if (client_->wait_for(keys, std::chrono::milliseconds(250))) return std::nullopt;
    if (client_->check({key(round, "end")})) return parse_end(client_->get(key(round, "end")));
    if (stop.requested()) {
      // Leave cleanly: the others learn of it at their next check, not at the join timeout.
      report_signal(round, stop.signo());
      leave(round, std::chrono::seconds(5), stop);
      throw StopRequested(stop.signo());
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) on_timeout();
    if (now >= next_report) {
      // A steady, low rate (every 10 s by default) while nodes are missing.
      log::info("ddprun") << "rendezvous of job '" << options_.run_id << "' (round " << round << "): " << progress()
                          << ", " << std::chrono::duration_cast<std::chrono::seconds>(now - start).count() << " s of "
                          << seconds_text(options_.join_timeout);
      next_report = now + options_.progress_interval;
    }
  }
}

std::variant<World, RoundEnd> StoreRendezvous::join_static(int round, int nproc, const WorkerStoreHost& host_worker_store,
                                                           const StopSignal& stop) {
  const int n = options_.nnodes;
  const json me = {{"host", options_.host}, {"addr", options_.advertise_addr}, {"nproc", nproc},
                   {"pid", static_cast<int>(::getpid())}, {"nnodes", n}, {"agent", agent_id_}, {"joined_ms", now_ms()}};
  const std::string mine = me.dump();
  for (;;) {
    const std::string node_key = key(round, "node/" + std::to_string(options_.node_rank));
    const std::string held = client_->compare_set(node_key, "", mine);
    if (held == mine) break;
    // Someone holds this node rank in this run of the job.
    const json other = json::parse(held, nullptr, false);
    const std::string holder = other.is_object() ? string_field(other, "agent") : std::string();
    const std::string where = other.is_object() ? string_field(other, "host") + " (pid " +
                                                      std::to_string(int_field(other, "pid", 0)) + ")"
                                                : std::string("another agent");
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
    throw ConfigError("node_rank " + std::to_string(options_.node_rank) + " has already joined this job from " +
                      where + ", which is still running; give every node a different --node_rank, or each job its "
                      "own --rdzv_id");
  }
  start_heartbeat();  // from now on: a node that holds a rank is seen to be alive
  log::info("ddprun") << "joined round " << round << " of job '" << options_.run_id << "' (generation "
                      << keys_.generation() << ") as node_rank " << options_.node_rank << " of " << n;
  if (options_.node_rank == 0) {
    const uint16_t port = host_worker_store();
    client_->set(key(round, "worker_store"), json{{"addr", options_.advertise_addr}, {"port", port}}.dump());
  }
  if (client_->add(key(round, "joined"), 1) == n) assign(round);
  // Who is missing, by node rank (checked only for jobs small enough to list them).
  auto missing_ranks = [&]() {
    std::string missing;
    int joined = 0;
    for (int k = 0; k < n; ++k) {
      if (client_->check({key(round, "node/" + std::to_string(k))})) {
        ++joined;
      } else {
        missing += (missing.empty() ? "" : ", ") + std::to_string(k);
      }
    }
    return std::make_pair(joined, missing);
  };
  auto progress = [&]() -> std::string {
    const int64_t joined = client_->add(key(round, "joined"), 0);
    if (n > 64) return std::to_string(joined) + " of " + std::to_string(n) + " nodes joined";
    return std::to_string(joined) + " of " + std::to_string(n) + " nodes joined, waiting for node_rank " +
           missing_ranks().second;
  };
  auto timed_out = [&]() {
    const auto [joined, missing] = missing_ranks();
    throw TimeoutError("rendezvous (round " + std::to_string(round) + ") timed out after " +
                       seconds_text(options_.join_timeout) + ": " + std::to_string(joined) + " of " + std::to_string(n) +
                       " nodes joined; missing node_rank " + missing +
                       " (set the wait with --rdzv_conf join_timeout=SECONDS)");
  };
  if (auto ended = wait_joining(round, {key(round, "complete"), key(round, "worker_store")}, stop, progress, timed_out)) {
    return *ended;
  }
  // Two reads, whatever the job's size: this node's assignment and the worker store.
  const std::string assign_key = key(round, "assign/" + std::to_string(options_.node_rank));
  const std::string store_key = key(round, "worker_store");
  const auto values = client_->multi_get({assign_key, store_key});
  return adopt(round, read_object(assign_key, values[0]), read_object(store_key, values[1]));
}

World StoreRendezvous::adopt(int round, const json& assigned, const json& store) {
  World w;
  w.round = round;
  w.group_rank = static_cast<int>(int_field(assigned, "group_rank", -1));
  w.group_world_size = static_cast<int>(int_field(assigned, "group_world_size", 0));
  w.rank_offset = static_cast<int>(int_field(assigned, "offset", -1));
  w.world_size = static_cast<int>(int_field(assigned, "world_size", 0));
  w.peer_addresses = strings_field(assigned, "addrs");
  if (w.group_rank < 0 || w.group_world_size <= 0 || w.rank_offset < 0 || w.world_size <= 0) {
    throw ProtocolError("round " + std::to_string(round) + "'s assignment for this node (" + assigned.dump() +
                        ") lacks group_rank, group_world_size, offset or world_size");
  }
  std::tie(w.master_addr, w.master_port) = worker_store_address(round, store);
  std::lock_guard lock(members_mutex_);
  group_rank_ = w.group_rank;
  group_world_size_ = w.group_world_size;
  member_ids_ = strings_field(assigned, "agents");
  member_hosts_ = strings_field(assigned, "hosts");
  return w;
}

void StoreRendezvous::write_assignments(int round, const std::vector<std::pair<std::string, json>>& ordered,
                                       std::vector<std::pair<std::string, std::string>> extra) {
  // Rank offsets are prefix sums of nproc in group-rank order. The membership list (for the
  // heartbeat ring) rides along for jobs of up to 64 nodes.
  int world = 0;
  std::vector<std::string> agents, hosts, addresses;
  for (const auto& [id, info] : ordered) {
    world += static_cast<int>(int_field(info, "nproc", 0));
    agents.push_back(string_field(info, "agent"));
    hosts.push_back(string_field(info, "host"));
    addresses.push_back(string_field(info, "addr"));
    addresses.push_back(string_field(info, "host"));
  }
  std::vector<std::pair<std::string, std::string>> assignments;
  int offset = 0;
  for (size_t g = 0; g < ordered.size(); ++g) {
    json a = {{"group_rank", g}, {"group_world_size", ordered.size()}, {"offset", offset}, {"world_size", world}};
    if (ordered.size() <= 64) {
      a["agents"] = agents;
      a["hosts"] = hosts;
    }
    // The worker store's host admits only the job's nodes: it alone gets every address.
    if (g == 0) a["addrs"] = addresses;
    assignments.emplace_back(key(round, "assign/" + ordered[g].first), a.dump());
    offset += static_cast<int>(int_field(ordered[g].second, "nproc", 0));
  }
  for (auto& e : extra) assignments.push_back(std::move(e));
  client_->multi_set(assignments);
}

void StoreRendezvous::assign(int round) {
  // The last node to join reads every node's record once and writes one small assignment per
  // node: O(n) in total.
  std::vector<std::string> keys;
  for (int k = 0; k < options_.nnodes; ++k) keys.push_back(key(round, "node/" + std::to_string(k)));
  const auto values = client_->multi_get(keys);
  std::vector<std::pair<std::string, json>> ordered;
  for (int k = 0; k < options_.nnodes; ++k) {
    ordered.emplace_back(std::to_string(k), read_object(keys[static_cast<size_t>(k)], values[static_cast<size_t>(k)]));
  }
  write_assignments(round, ordered, {{key(round, "complete"), "1"}});
}

std::variant<World, RoundEnd> StoreRendezvous::join_dynamic(int round, int nproc, const WorkerStoreHost& host_worker_store,
                                                            const StopSignal& stop) {
  for (;;) {
    client_->set(keys_.current_round(), std::to_string(round));
    const json me = {{"host", options_.host}, {"addr", options_.advertise_addr}, {"nproc", nproc},
                     {"pid", static_cast<int>(::getpid())}, {"hint", options_.node_rank},
                     {"store_host", server_ != nullptr}, {"agent", agent_id_}, {"nnodes", options_.nnodes},
                     {"joined_ms", now_ms()}};
    const int64_t idx = client_->add(key(round, "joined"), 1);
    client_->set(key(round, "member/" + std::to_string(idx)), me.dump());
    start_heartbeat();
    log::info("ddprun") << "joined round " << round << " of job '" << options_.run_id << "' (generation "
                        << keys_.generation() << ") as arrival " << idx << " (--nnodes " << options_.min_nodes << ":"
                        << options_.nnodes << ")";
    if (idx == options_.nnodes) {
      close_dynamic(round);  // full
    } else if (idx == options_.min_nodes) {
      // Enough nodes: wait the last call for more, then close with whoever is there.
      const auto deadline = std::chrono::steady_clock::now() + options_.last_call_timeout;
      while (std::chrono::steady_clock::now() < deadline && !client_->check({key(round, "closed")})) {
        // The last-call window, in slices so that a full round or a stop is seen promptly.
        if (stop.sleep_for(std::min<std::chrono::milliseconds>(options_.last_call_timeout, std::chrono::milliseconds(100)))) {
          break;  // wait_joining leaves the round cleanly
        }
      }
      if (!stop.requested()) close_dynamic(round);
    }
    auto progress = [&]() -> std::string {
      return std::to_string(client_->add(key(round, "joined"), 0)) + " node(s) joined, " +
             std::to_string(options_.min_nodes) + " needed to start";
    };
    auto timed_out = [&]() {
      const int64_t joined = client_->add(key(round, "joined"), 0);
      throw TimeoutError("rendezvous (round " + std::to_string(round) + ") timed out after " +
                         seconds_text(options_.join_timeout) + ": " + std::to_string(joined) + " node(s) joined, " +
                         std::to_string(options_.min_nodes) + " needed (--nnodes " + std::to_string(options_.min_nodes) +
                         ":" + std::to_string(options_.nnodes) + ")");
    };
    if (auto ended = wait_joining(round, {key(round, "closed")}, stop, progress, timed_out)) return *ended;
    const int64_t members = read_number(key(round, "closed"), client_->get(key(round, "closed")));
    if (idx > members) {
      // Too late for this round: ask the running nodes to re-rendezvous, and join the next round.
      log::info("ddprun") << "job '" << options_.run_id << "' is running with " << members
                          << " node(s): asking it to re-rendezvous to admit this node";
      rdzv::jobs::Outcome membership;
      membership.kind = rdzv::jobs::Outcome::Kind::Membership;
      membership.detail = "node " + options_.host + " wants to join";
      client_->compare_set(key(round, "end"), "", rdzv::jobs::encode_outcome(membership));
      ++round;
      continue;
    }
    const std::string assign_key = key(round, "assign/" + std::to_string(idx));
    if (auto ended = wait_joining(round, {assign_key}, stop, progress, timed_out)) return *ended;
    const json assigned = read_object(assign_key, client_->get(assign_key));
    if (int_field(assigned, "group_rank", -1) == 0) {
      const uint16_t port = host_worker_store();
      client_->set(key(round, "worker_store"), json{{"addr", options_.advertise_addr}, {"port", port}}.dump());
    }
    const std::string store_key = key(round, "worker_store");
    if (auto ended = wait_joining(round, {store_key}, stop, progress, timed_out)) return *ended;
    return adopt(round, assigned, read_object(store_key, client_->get(store_key)));
  }
}

void StoreRendezvous::close_dynamic(int round) {
  const int64_t joined = std::min<int64_t>(client_->add(key(round, "joined"), 0), options_.nnodes);
  const std::string count = std::to_string(joined);
  if (client_->compare_set(key(round, "closed"), "", count) != count) return;  // someone else closed it
  std::vector<std::string> keys;
  for (int64_t i = 1; i <= joined; ++i) keys.push_back(key(round, "member/" + std::to_string(i)));
  const auto values = client_->multi_get(keys);
  struct Member {
    int64_t idx;
    json info;
  };
  std::vector<Member> members;
  for (int64_t i = 0; i < joined; ++i) {
    members.push_back({i + 1, read_object(keys[static_cast<size_t>(i)], values[static_cast<size_t>(i)])});
  }
  // Group rank order: the node hosting the rendezvous store first (global rank 0 lands on the
  // endpoint's host), then --node_rank hints, then arrival.
  auto hosts_store = [](const json& info) {
    auto it = info.find("store_host");
    return it != info.end() && it->is_boolean() && it->get<bool>();
  };
  std::stable_sort(members.begin(), members.end(), [&](const Member& a, const Member& b) {
    const bool ha = hosts_store(a.info), hb = hosts_store(b.info);
    if (ha != hb) return ha;
    const int ra = static_cast<int>(int_field(a.info, "hint", -1)), rb = static_cast<int>(int_field(b.info, "hint", -1));
    const int ka = ra < 0 ? INT32_MAX : ra, kb = rb < 0 ? INT32_MAX : rb;
    if (ka != kb) return ka < kb;
    return a.idx < b.idx;
  });
  std::vector<std::pair<std::string, json>> ordered;
  for (const auto& m : members) ordered.emplace_back(std::to_string(m.idx), m.info);
  write_assignments(round, ordered, {});
}

}  // namespace ddprun::launcher
