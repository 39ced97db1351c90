#include "launcher/node_rendezvous.hpp"

#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "launcher/options.hpp"

namespace ddprun::launcher {

using json = nlohmann::json;

namespace {

std::string seconds_text(std::chrono::milliseconds d) {
  return d.count() % 1000 == 0 ? std::to_string(d.count() / 1000) + "s" : std::to_string(d.count()) + "ms";
}

json exit_to_json(const WorkerExit& e, int node) {
  json j = {{"node", node},        {"host", e.host},         {"rank", e.rank},
            {"local_rank", e.local_rank}, {"pid", e.pid},    {"exit_code", e.exit_code},
            {"signal", e.signal},  {"error_file", e.error_file}, {"stderr_tail", e.stderr_tail},
            {"time_ms", std::chrono::duration_cast<std::chrono::milliseconds>(e.time.time_since_epoch()).count()}};
  if (auto text = e.error_text ? e.error_text : read_error_file(e.error_file)) j["error"] = *text;
  return j;
}

// Field readers that never throw: a field of the wrong type reads as the fallback (the record
// came from another node, possibly another version).
int64_t int_field(const json& j, const char* name, int64_t fallback) {
  auto it = j.find(name);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}
std::string string_field(const json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}
std::vector<std::string> strings_field(const json& j, const char* name) {
  std::vector<std::string> out;
  auto it = j.find(name);
  if (it == j.end() || !it->is_array()) return out;
  for (const auto& v : *it) out.push_back(v.is_string() ? v.get<std::string>() : v.dump());
  return out;
}

WorkerExit exit_from_json(const json& j) {
  WorkerExit e;
  e.host = string_field(j, "host");
  e.node_rank = static_cast<int>(int_field(j, "node", -1));
  e.rank = static_cast<int>(int_field(j, "rank", 0));
  e.local_rank = static_cast<int>(int_field(j, "local_rank", 0));
  e.pid = static_cast<pid_t>(int_field(j, "pid", 0));
  e.exit_code = static_cast<int>(int_field(j, "exit_code", 0));
  e.signal = static_cast<int>(int_field(j, "signal", 0));
  e.error_file = string_field(j, "error_file");
  e.stderr_tail = strings_field(j, "stderr_tail");
  e.time = std::chrono::system_clock::time_point(std::chrono::milliseconds(int_field(j, "time_ms", 0)));
  if (j.contains("error") && j["error"].is_string()) e.error_text = j["error"].get<std::string>();
  return e;
}

// A value this node needs, read from the store: a JSON object, or a ProtocolError naming the key.
json read_object(const std::string& key, const std::string& value) {
  json j = json::parse(value, nullptr, false);
  if (!j.is_object()) {
    throw ProtocolError("the rendezvous key " + key + " does not hold a JSON object (" + std::to_string(value.size()) +
                        " bytes: '" + value.substr(0, 60) + "'); was it written by another program, or another "
                        "version of ddprun?");
  }
  return j;
}

int64_t read_number(const std::string& key, const std::string& value) {
  if (auto n = rdzv::jobs::parse_int(value)) return *n;
  throw ProtocolError("the rendezvous key " + key + " does not hold a number ('" + value.substr(0, 60) +
                      "'); was it written by another program, or another version of ddprun?");
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Dynamic mode: is the rendezvous endpoint this machine? (torchrun's is_host.)
bool endpoint_is_local(const std::string& endpoint, const NodeRendezvousOptions& o) {
  return endpoint == "localhost" || endpoint.rfind("127.", 0) == 0 || endpoint == "::1" || endpoint == o.host ||
         (!o.advertise_addr.empty() && endpoint == o.advertise_addr);
}

}  // namespace

NodeRendezvous::NodeRendezvous(NodeRendezvousOptions options) : options_(std::move(options)) {
  const bool external = !options_.endpoint_host.empty();
  std::mt19937 rng(std::random_device{}());
  // Unique per agent process, so that a dead earlier run's heartbeat is never mistaken for ours.
  agent_id_ = (options_.dynamic ? std::string() : "node" + std::to_string(options_.node_rank) + "-") + options_.host +
              ":" + std::to_string(::getpid()) + ":" + std::to_string(rng() % 100000);
  // Who hosts the rendezvous store: node 0 in static jobs without an endpoint; in dynamic jobs the
  // first agent on the endpoint's host that can bind its port (others, or a daemon, are clients).
  const bool try_host = options_.dynamic ? endpoint_is_local(options_.endpoint_host, options_)
                                         : (options_.node_rank == 0 && !external);
  if (try_host) {
    rdzv::ServerOptions so;
    so.host = "::";
    so.port = options_.dynamic ? options_.endpoint_port : options_.master_port;
    so.log_lifecycle = false;
    try {
      try {
        server_ = std::make_unique<rdzv::ServerThread>(so);
      } catch (const ConnectionError&) {
        so.host = "0.0.0.0";  // no IPv6 on this host
        server_ = std::make_unique<rdzv::ServerThread>(so);
      }
      log::info("ddprun") << "hosting the rendezvous store of job '" << options_.run_id << "' on port "
                          << server_->port();
    } catch (const ConnectionError&) {
      if (!options_.dynamic) throw;
      // Another agent (or a ddprun-rendezvous daemon) on this host serves it already.
    }
  }
  rdzv::ClientOptions co;
  co.host = external ? options_.endpoint_host : options_.master_addr;
  co.port = external ? options_.endpoint_port : options_.master_port;
  co.connect_timeout = options_.join_timeout;
  co.timeout = std::chrono::seconds(60);
  try {
    client_ = std::make_unique<rdzv::Client>(co);
  } catch (const TimeoutError& e) {
    throw TimeoutError("this node could not reach the rendezvous store: " + std::string(e.what()) +
                       (external ? ". Is ddprun-rendezvous (or the endpoint's ddprun) running at --rdzv_endpoint?"
                                 : ". Is ddprun running on node 0 with the same --master_addr/--master_port?"));
  }
  keys_ = rdzv::jobs::JobKeys(options_.run_id, choose_generation());
}

int64_t NodeRendezvous::choose_generation() {
  const std::string counter = rdzv::jobs::JobKeys::generation_counter(options_.run_id);
  int64_t g = read_number(counter, client_->compare_set(counter, "", "1"));
  // A run that has ended is never joined again: its job id starts over in the next generation.
  while (client_->check({rdzv::jobs::JobKeys(options_.run_id, g).ended()})) g = next_generation(g);
  return g;
}

int64_t NodeRendezvous::next_generation(int64_t after) {
  const std::string counter = rdzv::jobs::JobKeys::generation_counter(options_.run_id);
  return read_number(counter, client_->compare_set(counter, std::to_string(after), std::to_string(after + 1)));
}

bool NodeRendezvous::agent_alive(const std::string& agent) {
  const std::string k = hb_key(agent);
  const auto window = options_.keep_alive_interval * options_.keep_alive_max_attempt;
  const auto deadline = std::chrono::steady_clock::now() + window;
  const auto beats = [&]() -> int64_t { return client_->check({k}) ? read_number(k, client_->get(k)) : -1; };
  const int64_t first = beats();
  while (std::chrono::steady_clock::now() < deadline) {
    // sleep override: watching another agent's heartbeat counter for the liveness window
    std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(options_.keep_alive_interval / 4,
                                                                    std::chrono::milliseconds(250)));
    if (beats() != first) return true;
  }
  return false;
}

NodeRendezvous::~NodeRendezvous() {
  stop_watching_ = true;
  stop_watcher();
  stop_heartbeat();
}

void NodeRendezvous::stop_heartbeat() {
  stop_heartbeat_ = true;
  if (heartbeat_.joinable()) heartbeat_.join();
}

std::shared_ptr<rdzv::Client> NodeRendezvous::side_connection() const {
  // Connected by the caller, not on the thread that uses it: a store that is already gone is
  // reported at once, and the thread never sits in a connect retry loop that shutdown would have
  // to wait for. It never reconnects: to a watcher, a lost store is the news.
  rdzv::ClientOptions co = client_->options();
  co.reconnect = false;
  co.connect_timeout = std::chrono::seconds(5);
  return std::make_shared<rdzv::Client>(co);
}

void NodeRendezvous::start_heartbeat() {
  if (heartbeat_.joinable()) return;
  std::shared_ptr<rdzv::Client> c;
  try {
    c = side_connection();
  } catch (const std::exception& e) {
    log::warn("ddprun") << "no heartbeat: " << e.what();
    return;
  }
  heartbeat_ = std::thread([this, c] {
    try {
      const std::string k = hb_key(agent_id_);
      while (!stop_heartbeat_) {
        c->add(k, 1);  // what liveness is judged by (a counter: clocks need not agree)
        c->set(k + "/time", std::to_string(now_ms()));  // for `ddprun-rendezvous status` only
        // sleep override: the heartbeat period, in slices so that shutdown is prompt
        for (auto slept = std::chrono::milliseconds(0); slept < options_.keep_alive_interval && !stop_heartbeat_;
             slept += std::chrono::milliseconds(50)) {
          std::this_thread::sleep_for(std::min(std::chrono::milliseconds(50), options_.keep_alive_interval));
        }
      }
    } catch (const std::exception& e) {
      log::warn("ddprun") << "heartbeat stopped: " << e.what();
    }
  });
}

std::optional<int> NodeRendezvous::find_lost_node(rdzv::Client& c,
                                                  std::pair<int64_t, std::chrono::steady_clock::time_point>& seen) {
  std::string watched;
  int watched_rank;
  {
    std::lock_guard lock(members_mutex_);
    const int n = static_cast<int>(member_ids_.size());
    if (n < 2) return std::nullopt;
    // Each node watches the next one in group-rank order: O(1) store traffic per node.
    watched_rank = (group_rank_ + 1) % n;
    watched = member_ids_[static_cast<size_t>(watched_rank)];
  }
  const auto now = std::chrono::steady_clock::now();
  const std::string k = hb_key(watched);
  const int64_t beats = c.check({k}) ? read_number(k, c.get(k)) : -1;
  if (beats != seen.first) {
    seen = {beats, now};
  } else if (now - seen.second > options_.keep_alive_interval * options_.keep_alive_max_attempt) {
    return watched_rank;
  }
  return std::nullopt;
}

int NodeRendezvous::current_round() {
  const std::string k = keys_.current_round();
  if (!options_.dynamic || !client_->check({k})) return 0;
  return static_cast<int>(read_number(k, client_->get(k)));
}

World NodeRendezvous::join(int round, int nproc, const std::function<uint16_t()>& host_worker_store) {
  if (options_.dynamic) {
    World w = join_dynamic(round, nproc, host_worker_store);
    start_heartbeat();
    return w;
  }
  std::optional<uint16_t> port;
  if (options_.node_rank == 0) port = host_worker_store();
  return join_static(round, nproc, port);
}

World NodeRendezvous::join_static(int round, int nproc, std::optional<uint16_t> worker_store_port) {
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
    if (round == 0 && (ended || holder.empty() || !agent_alive(holder))) {
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
  if (worker_store_port) {
    client_->set(key(round, "worker_store"), json{{"addr", options_.advertise_addr}, {"port", *worker_store_port}}.dump());
  }
  if (client_->add(key(round, "joined"), 1) == n) assign(round);
  try {
    client_->wait({key(round, "complete"), key(round, "worker_store")}, options_.join_timeout);
  } catch (const TimeoutError&) {
    std::string missing;
    int joined = 0;
    for (int k = 0; k < n; ++k) {
      if (client_->check({key(round, "node/" + std::to_string(k))})) {
        ++joined;
      } else {
        missing += (missing.empty() ? "" : ", ") + std::to_string(k);
      }
    }
    throw TimeoutError("rendezvous (round " + std::to_string(round) + ") timed out after " +
                       seconds_text(options_.join_timeout) + ": " + std::to_string(joined) + " of " +
                       std::to_string(n) + " nodes joined; missing node_rank " + missing +
                       " (set the wait with --rdzv_conf join_timeout=SECONDS)");
  }
  // Two reads, whatever the job's size: this node's assignment and the worker store.
  const std::string assign_key = key(round, "assign/" + std::to_string(options_.node_rank));
  const std::string store_key = key(round, "worker_store");
  const auto values = client_->multi_get({assign_key, store_key});
  return adopt(round, read_object(assign_key, values[0]), read_object(store_key, values[1]));
}

World NodeRendezvous::adopt(int round, const json& assigned, const json& store) {
  World w;
  w.round = round;
  w.group_rank = static_cast<int>(int_field(assigned, "group_rank", -1));
  w.group_world_size = static_cast<int>(int_field(assigned, "group_world_size", 0));
  w.rank_offset = static_cast<int>(int_field(assigned, "offset", -1));
  w.world_size = static_cast<int>(int_field(assigned, "world_size", 0));
  w.master_addr = string_field(store, "addr");
  w.master_port = static_cast<int>(int_field(store, "port", 0));
  if (w.group_rank < 0 || w.group_world_size <= 0 || w.rank_offset < 0 || w.world_size <= 0) {
    throw ProtocolError("round " + std::to_string(round) + "'s assignment for this node (" + assigned.dump() +
                        ") lacks group_rank, group_world_size, offset or world_size");
  }
  if (w.master_addr.empty() || w.master_port <= 0 || w.master_port > 65535) {
    throw ProtocolError("round " + std::to_string(round) + "'s worker store record (" + store.dump() +
                        ") lacks addr or a valid port");
  }
  std::lock_guard lock(members_mutex_);
  group_rank_ = w.group_rank;
  member_ids_ = strings_field(assigned, "agents");
  member_hosts_ = strings_field(assigned, "hosts");
  return w;
}

void NodeRendezvous::write_assignments(int round, const std::vector<std::pair<std::string, json>>& ordered,
                                       std::vector<std::pair<std::string, std::string>> extra) {
  // Rank offsets are prefix sums of nproc in group-rank order. The membership list (for the
  // heartbeat ring) rides along for jobs of up to 64 nodes.
  int world = 0;
  std::vector<std::string> agents, hosts;
  for (const auto& [id, info] : ordered) {
    world += static_cast<int>(int_field(info, "nproc", 0));
    agents.push_back(string_field(info, "agent"));
    hosts.push_back(string_field(info, "host"));
  }
  std::vector<std::pair<std::string, std::string>> assignments;
  int offset = 0;
  for (size_t g = 0; g < ordered.size(); ++g) {
    json a = {{"group_rank", g}, {"group_world_size", ordered.size()}, {"offset", offset}, {"world_size", world}};
    if (ordered.size() <= 64) {
      a["agents"] = agents;
      a["hosts"] = hosts;
    }
    assignments.emplace_back(key(round, "assign/" + ordered[g].first), a.dump());
    offset += static_cast<int>(int_field(ordered[g].second, "nproc", 0));
  }
  for (auto& e : extra) assignments.push_back(std::move(e));
  client_->multi_set(assignments);
}

void NodeRendezvous::assign(int round) {
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

World NodeRendezvous::join_dynamic(int round, int nproc, const std::function<uint16_t()>& host_worker_store) {
  client_->set(keys_.current_round(), std::to_string(round));
  const json me = {{"host", options_.host}, {"addr", options_.advertise_addr}, {"nproc", nproc},
                   {"pid", static_cast<int>(::getpid())}, {"hint", options_.node_rank},
                   {"store_host", server_ != nullptr}, {"agent", agent_id_}, {"nnodes", options_.nnodes},
                   {"joined_ms", now_ms()}};
  const int64_t idx = client_->add(key(round, "joined"), 1);
  client_->set(key(round, "member/" + std::to_string(idx)), me.dump());
  if (idx == options_.nnodes) {
    close_dynamic(round);  // full
  } else if (idx == options_.min_nodes) {
    // Enough nodes: wait the last call for more, then close with whoever is there.
    const auto deadline = std::chrono::steady_clock::now() + options_.last_call_timeout;
    while (std::chrono::steady_clock::now() < deadline && !client_->check({key(round, "closed")})) {
      // sleep override: the last-call window, in slices so that a full round is seen promptly
      std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(options_.last_call_timeout, std::chrono::milliseconds(100)));
    }
    close_dynamic(round);
  }
  try {
    client_->wait({key(round, "closed")}, options_.join_timeout);
  } catch (const TimeoutError&) {
    const int64_t joined = client_->add(key(round, "joined"), 0);
    throw TimeoutError("rendezvous (round " + std::to_string(round) + ") timed out after " +
                       seconds_text(options_.join_timeout) + ": " + std::to_string(joined) + " node(s) joined, " +
                       std::to_string(options_.min_nodes) + " needed (--nnodes " + std::to_string(options_.min_nodes) +
                       ":" + std::to_string(options_.nnodes) + ")");
  }
  const int64_t members = read_number(key(round, "closed"), client_->get(key(round, "closed")));
  if (idx > members) {
    // Too late for this round: ask the running nodes to re-rendezvous, and join the next round.
    log::info("ddprun") << "job '" << options_.run_id << "' is running with " << members
                        << " node(s): asking it to re-rendezvous to admit this node";
    rdzv::jobs::Outcome membership;
    membership.kind = rdzv::jobs::Outcome::Kind::Membership;
    membership.detail = "node " + options_.host + " wants to join";
    client_->compare_set(key(round, "end"), "", rdzv::jobs::encode_outcome(membership));
    return join_dynamic(round + 1, nproc, host_worker_store);
  }
  const std::string assign_key = key(round, "assign/" + std::to_string(idx));
  const json assigned = read_object(assign_key, client_->get(assign_key, options_.join_timeout));
  if (int_field(assigned, "group_rank", -1) == 0) {
    const uint16_t port = host_worker_store();
    client_->set(key(round, "worker_store"), json{{"addr", options_.advertise_addr}, {"port", port}}.dump());
  }
  const std::string store_key = key(round, "worker_store");
  return adopt(round, assigned, read_object(store_key, client_->get(store_key, options_.join_timeout)));
}

void NodeRendezvous::close_dynamic(int round) {
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

RoundEnd NodeRendezvous::parse_end(const std::string& value) const {
  using Kind = rdzv::jobs::Outcome::Kind;
  const rdzv::jobs::Outcome o = rdzv::jobs::decode_outcome(value);
  RoundEnd e;
  e.detail = o.detail;
  e.root_node = o.node;
  switch (o.kind) {
    case Kind::Success: e.kind = RoundEnd::Kind::Success; break;
    case Kind::Signal: e.kind = RoundEnd::Kind::Signal; break;
    case Kind::Membership: e.kind = RoundEnd::Kind::Membership; break;
    case Kind::NodeLost: e.kind = RoundEnd::Kind::NodeLost; break;
    case Kind::Hang:
    case Kind::Failure:
      e.kind = RoundEnd::Kind::Failure;
      if (!o.failure.empty()) {
        e.root_cause = exit_from_json(o.failure);
        e.detail = "rank " + std::to_string(e.root_cause->rank) + " on node " + std::to_string(e.root_node) + " (" +
                   e.root_cause->host + ") failed with " + describe_exit(*e.root_cause);
      }
      break;
  }
  return e;
}

RoundEnd NodeRendezvous::decide(int round, const rdzv::jobs::Outcome& proposal) {
  // The first proposal wins; everyone reads the same decision back.
  return parse_end(client_->compare_set(key(round, "end"), "", rdzv::jobs::encode_outcome(proposal)));
}

void NodeRendezvous::watch(int round, std::function<void(const RoundEnd&)> on_end) {
  stop_watcher();
  stop_watching_ = false;
  auto store_lost = [](const std::exception& e) {
    RoundEnd lost;
    lost.kind = RoundEnd::Kind::StoreLost;
    lost.detail = std::string("lost the rendezvous store: ") + e.what();
    return lost;
  };
  std::shared_ptr<rdzv::Client> c;
  try {
    c = side_connection();
  } catch (const std::exception& e) {
    on_end(store_lost(e));
    return;
  }
  watcher_ = std::thread([this, round, c, store_lost, on_end = std::move(on_end)] {
    try {
      // WAIT has no server timeout; the client re-arms it every period so that a store that went
      // silent (its host gone) is noticed, and each node checks the next node's heartbeat.
      const auto period = std::min<std::chrono::milliseconds>(std::chrono::seconds(1), options_.keep_alive_interval);
      std::pair<int64_t, std::chrono::steady_clock::time_point> seen{-1, std::chrono::steady_clock::now()};
      for (;;) {
        try {
          c->wait({key(round, "end")}, period);
          break;
        } catch (const TimeoutError&) {
          if (stop_watching_) return;
        }
        if (auto lost = find_lost_node(*c, seen)) {
          std::string host;
          {
            std::lock_guard lock(members_mutex_);
            host = member_hosts_.size() > static_cast<size_t>(*lost) ? member_hosts_[static_cast<size_t>(*lost)] : "?";
          }
          const auto limit = options_.keep_alive_interval * options_.keep_alive_max_attempt;
          // On this thread's own connection: the main client may be blocked in a long WAIT.
          rdzv::jobs::Outcome gone;
          gone.kind = rdzv::jobs::Outcome::Kind::NodeLost;
          gone.node = *lost;
          gone.detail = "node " + std::to_string(*lost) + " (" + host + ") sent no heartbeat for " + seconds_text(limit) +
                        " (its ddprun was killed or its host is unreachable)";
          c->compare_set(key(round, "end"), "", rdzv::jobs::encode_outcome(gone));
        }
      }
      on_end(parse_end(c->get(key(round, "end"))));
    } catch (const std::exception& e) {
      on_end(store_lost(e));
    }
  });
}

void NodeRendezvous::stop_watcher() {
  if (!watcher_.joinable()) return;
  watcher_.join();
}

RoundEnd NodeRendezvous::report_failure(int round, const WorkerExit& failure) {
  rdzv::jobs::Outcome o;
  o.kind = rdzv::jobs::Outcome::Kind::Failure;
  o.node = group_rank_;
  o.failure = exit_to_json(failure, group_rank_);
  return decide(round, o);
}

RoundEnd NodeRendezvous::report_signal(int round, int signo) {
  rdzv::jobs::Outcome o;
  o.kind = rdzv::jobs::Outcome::Kind::Signal;
  o.detail = signal_name(signo) + " on node " + std::to_string(group_rank_) + " (" + options_.host + ")";
  return decide(round, o);
}

RoundEnd NodeRendezvous::report_success(int round, int nnodes) {
  if (client_->add(key(round, "finished"), 1) == nnodes) return decide(round, rdzv::jobs::Outcome{});
  return wait_end(round);
}

RoundEnd NodeRendezvous::wait_end(int round) {
  for (;;) {
    try {
      if (!client_->connected()) throw ConnectionError("the connection to the rendezvous store was lost");
      client_->wait({key(round, "end")}, std::chrono::seconds(5));
      return parse_end(client_->get(key(round, "end")));
    } catch (const TimeoutError&) {
      // The WAIT timed out (the round goes on); a lost connection shows up as !connected().
    } catch (const ConnectionError& e) {
      RoundEnd lost;
      lost.kind = RoundEnd::Kind::StoreLost;
      lost.detail = std::string("lost the rendezvous store: ") + e.what();
      return lost;
    }
  }
}

void NodeRendezvous::leave(int round, std::chrono::milliseconds timeout) {
  stop_watching_ = true;
  stop_watcher();
  stop_heartbeat();
  int n;
  {
    std::lock_guard lock(members_mutex_);
    n = member_ids_.empty() ? options_.nnodes : static_cast<int>(member_ids_.size());
  }
  try {
    // The first node to leave records how the job ended: a later run of this job id sees it and
    // starts a new generation instead of joining this one.
    const std::string end_key = key(round, "end");
    const std::string outcome = client_->check({end_key}) ? client_->get(end_key) : std::string("signal:left");
    client_->compare_set(keys_.ended(), "", outcome);
    if (client_->add(keys_.exited(), 1) == n) client_->set(keys_.done(), "1");
    // The store host stays until everyone has read the outcome.
    if (server_) client_->wait({keys_.done()}, timeout);
  } catch (const std::exception& e) {
    log::warn("ddprun") << "end-of-job barrier: " << e.what();
  }
}

}  // namespace ddprun::launcher
