#include "launcher/node_rendezvous.hpp"

#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>

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

WorkerExit exit_from_json(const json& j) {
  WorkerExit e;
  e.host = j.value("host", "");
  e.node_rank = j.value("node", -1);
  e.rank = j.value("rank", 0);
  e.local_rank = j.value("local_rank", 0);
  e.pid = j.value("pid", 0);
  e.exit_code = j.value("exit_code", 0);
  e.signal = j.value("signal", 0);
  e.error_file = j.value("error_file", "");
  e.stderr_tail = j.value("stderr_tail", std::vector<std::string>{});
  e.time = std::chrono::system_clock::time_point(std::chrono::milliseconds(j.value("time_ms", int64_t{0})));
  if (j.contains("error")) e.error_text = j["error"].get<std::string>();
  return e;
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
  agent_id_ = options_.dynamic ? options_.host + ":" + std::to_string(::getpid()) + ":" + std::to_string(rng() % 100000)
                               : "node" + std::to_string(options_.node_rank);
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
}

NodeRendezvous::~NodeRendezvous() {
  stop_watching_ = true;
  stop_watcher();
  stop_heartbeat_ = true;
  if (heartbeat_.joinable()) heartbeat_.join();
}

std::string NodeRendezvous::key(int round, const std::string& name) const {
  return "/ddprun/" + options_.run_id + "/r" + std::to_string(round) + "/" + name;
}

std::string NodeRendezvous::hb_key(const std::string& agent) const {
  return "/ddprun/" + options_.run_id + "/hb/" + agent;
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
  const int64_t beats = c.add(hb_key(watched), 0);
  if (beats != seen.first) {
    seen = {beats, now};
  } else if (now - seen.second > options_.keep_alive_interval * options_.keep_alive_max_attempt) {
    return watched_rank;
  }
  return std::nullopt;
}

int NodeRendezvous::current_round() {
  if (!options_.dynamic || !client_->check({"/ddprun/" + options_.run_id + "/current"})) return 0;
  return static_cast<int>(std::stoll(client_->get("/ddprun/" + options_.run_id + "/current")));
}

World NodeRendezvous::join(int round, int nproc, const std::function<uint16_t()>& host_worker_store) {
  World w = options_.dynamic ? join_dynamic(round, nproc, host_worker_store)
                             : join_static(round, nproc,
                                           options_.node_rank == 0 ? std::optional<uint16_t>(host_worker_store())
                                                                   : std::nullopt);
  start_heartbeat();
  return w;
}

World NodeRendezvous::join_static(int round, int nproc, std::optional<uint16_t> worker_store_port) {
  const int n = options_.nnodes;
  const json me = {{"host", options_.host}, {"addr", options_.advertise_addr}, {"nproc", nproc},
                   {"pid", static_cast<int>(::getpid())}, {"nnodes", n}, {"agent", agent_id_}, {"joined_ms", now_ms()}};
  const std::string mine = me.dump();
  const std::string held = client_->compare_set(key(round, "node/" + std::to_string(options_.node_rank)), "", mine);
  if (held != mine) {
    const auto other = json::parse(held, nullptr, false);
    throw ConfigError("node_rank " + std::to_string(options_.node_rank) + " has already joined this job from " +
                      (other.is_object() ? other.value("host", "?") + " (pid " + std::to_string(other.value("pid", 0)) + ")"
                                         : "another agent") +
                      "; give every node a different --node_rank");
  }
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
  const auto values = client_->multi_get({key(round, "assign/" + std::to_string(options_.node_rank)),
                                          key(round, "worker_store")});
  return adopt(round, json::parse(values[0]), json::parse(values[1]));
}

World NodeRendezvous::adopt(int round, const json& assigned, const json& store) {
  World w;
  w.round = round;
  w.group_rank = assigned.value("group_rank", 0);
  w.group_world_size = assigned.value("group_world_size", 1);
  w.rank_offset = assigned.value("offset", 0);
  w.world_size = assigned.value("world_size", 0);
  w.master_addr = store.value("addr", "");
  w.master_port = store.value("port", 0);
  std::lock_guard lock(members_mutex_);
  group_rank_ = w.group_rank;
  member_ids_ = assigned.value("agents", std::vector<std::string>{});
  member_hosts_ = assigned.value("hosts", std::vector<std::string>{});
  return w;
}

void NodeRendezvous::write_assignments(int round, const std::vector<std::pair<std::string, json>>& ordered,
                                       std::vector<std::pair<std::string, std::string>> extra) {
  // Rank offsets are prefix sums of nproc in group-rank order. The membership list (for the
  // heartbeat ring) rides along for jobs of up to 64 nodes.
  int world = 0;
  std::vector<std::string> agents, hosts;
  for (const auto& [id, info] : ordered) {
    world += info.value("nproc", 0);
    agents.push_back(info.value("agent", ""));
    hosts.push_back(info.value("host", ""));
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
    offset += ordered[g].second.value("nproc", 0);
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
  for (int k = 0; k < options_.nnodes; ++k) ordered.emplace_back(std::to_string(k), json::parse(values[static_cast<size_t>(k)]));
  write_assignments(round, ordered, {{key(round, "complete"), "1"}});
}

World NodeRendezvous::join_dynamic(int round, int nproc, const std::function<uint16_t()>& host_worker_store) {
  const std::string current = "/ddprun/" + options_.run_id + "/current";
  client_->set(current, std::to_string(round));
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
  const int64_t members = std::stoll(client_->get(key(round, "closed")));
  if (idx > members) {
    // Too late for this round: ask the running nodes to re-rendezvous, and join the next round.
    log::info("ddprun") << "job '" << options_.run_id << "' is running with " << members
                        << " node(s): asking it to re-rendezvous to admit this node";
    client_->compare_set(key(round, "end"), "", "membership:node " + options_.host + " wants to join");
    return join_dynamic(round + 1, nproc, host_worker_store);
  }
  const auto assigned =
      json::parse(client_->get(key(round, "assign/" + std::to_string(idx)), options_.join_timeout));
  if (assigned.value("group_rank", -1) == 0) {
    const uint16_t port = host_worker_store();
    client_->set(key(round, "worker_store"), json{{"addr", options_.advertise_addr}, {"port", port}}.dump());
  }
  return adopt(round, assigned, json::parse(client_->get(key(round, "worker_store"), options_.join_timeout)));
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
  for (int64_t i = 0; i < joined; ++i) members.push_back({i + 1, json::parse(values[static_cast<size_t>(i)])});
  // Group rank order: the node hosting the rendezvous store first (global rank 0 lands on the
  // endpoint's host), then --node_rank hints, then arrival.
  std::stable_sort(members.begin(), members.end(), [](const Member& a, const Member& b) {
    const bool ha = a.info.value("store_host", false), hb = b.info.value("store_host", false);
    if (ha != hb) return ha;
    const int ra = a.info.value("hint", -1), rb = b.info.value("hint", -1);
    const int ka = ra < 0 ? INT32_MAX : ra, kb = rb < 0 ? INT32_MAX : rb;
    if (ka != kb) return ka < kb;
    return a.idx < b.idx;
  });
  std::vector<std::pair<std::string, json>> ordered;
  for (const auto& m : members) ordered.emplace_back(std::to_string(m.idx), m.info);
  write_assignments(round, ordered, {});
}

RoundEnd NodeRendezvous::parse_end(const std::string& value) const {
  RoundEnd e;
  if (value == "success") return e;
  if (value.rfind("signal:", 0) == 0) {
    e.kind = RoundEnd::Kind::Signal;
    e.detail = value.substr(7);
    return e;
  }
  if (value.rfind("membership:", 0) == 0) {
    e.kind = RoundEnd::Kind::Membership;
    e.detail = value.substr(11);
    return e;
  }
  if (value.rfind("lost:", 0) == 0) {
    e.kind = RoundEnd::Kind::NodeLost;
    const auto colon = value.find(':', 5);
    e.root_node = std::stoi(value.substr(5, colon - 5));
    e.detail = value.substr(colon + 1);
    return e;
  }
  const auto j = json::parse(value, nullptr, false);
  e.kind = RoundEnd::Kind::Failure;
  if (j.is_object()) {
    e.root_cause = exit_from_json(j);
    e.root_node = j.value("node", -1);
    e.detail = "rank " + std::to_string(e.root_cause->rank) + " on node " + std::to_string(e.root_node) + " (" +
               e.root_cause->host + ") failed with " + describe_exit(*e.root_cause);
  } else {
    e.detail = value;
  }
  return e;
}

RoundEnd NodeRendezvous::decide(int round, const std::string& proposal) {
  // The first proposal wins; everyone reads the same decision back.
  return parse_end(client_->compare_set(key(round, "end"), "", proposal));
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
          c->compare_set(key(round, "end"), "",
                         "lost:" + std::to_string(*lost) + ":node " + std::to_string(*lost) + " (" + host +
                             ") sent no heartbeat for " + seconds_text(limit) +
                             " (its ddprun was killed or its host is unreachable)");
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
  return decide(round, exit_to_json(failure, group_rank_).dump());
}

RoundEnd NodeRendezvous::report_signal(int round, int signo) {
  return decide(round, "signal:" + signal_name(signo) + " on node " + std::to_string(group_rank_) + " (" +
                           options_.host + ")");
}

RoundEnd NodeRendezvous::report_success(int round, int nnodes) {
  if (client_->add(key(round, "finished"), 1) == nnodes) return decide(round, "success");
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
  int n;
  {
    std::lock_guard lock(members_mutex_);
    n = member_ids_.empty() ? options_.nnodes : static_cast<int>(member_ids_.size());
  }
  try {
    if (client_->add(key(round, "exited"), 1) == n) client_->set(key(round, "all_exited"), "1");
    // The store host stays until everyone has read the outcome.
    if (server_) client_->wait({key(round, "all_exited")}, timeout);
  } catch (const std::exception& e) {
    log::warn("ddprun") << "end-of-job barrier: " << e.what();
  }
}

}  // namespace ddprun::launcher
