#include "launcher/node_rendezvous.hpp"

#include <unistd.h>

#include <atomic>
#include <nlohmann/json.hpp>

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
  if (auto text = read_error_file(e.error_file)) j["error"] = *text;
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

}  // namespace

NodeRendezvous::NodeRendezvous(NodeRendezvousOptions options) : options_(std::move(options)) {
  const bool external = !options_.endpoint_host.empty();
  if (options_.node_rank == 0 && !external) {
    rdzv::ServerOptions so;
    so.host = "::";
    so.port = options_.master_port;
    so.log_lifecycle = false;
    try {
      server_ = std::make_unique<rdzv::ServerThread>(so);
    } catch (const ConnectionError&) {
      so.host = "0.0.0.0";  // no IPv6 on this host
      server_ = std::make_unique<rdzv::ServerThread>(so);
    }
    log::info("ddprun") << "node 0: rendezvous store for " << options_.nnodes << " nodes on port "
                        << server_->port();
  }
  rdzv::ClientOptions co;
  co.host = external ? options_.endpoint_host : options_.master_addr;
  co.port = external ? options_.endpoint_port : options_.master_port;
  co.connect_timeout = options_.join_timeout;
  co.timeout = std::chrono::seconds(60);
  try {
    client_ = std::make_unique<rdzv::Client>(co);
  } catch (const TimeoutError& e) {
    throw TimeoutError("node_rank " + std::to_string(options_.node_rank) + " could not reach the rendezvous store: " +
                       e.what() +
                       (external ? ". Is ddprun-rendezvous running at --rdzv_endpoint?"
                                 : ". Is ddprun running on node 0 with the same --master_addr/--master_port?"));
  }
}

NodeRendezvous::~NodeRendezvous() {
  stop_watching_ = true;
  stop_watcher();
  stop_heartbeat_ = true;
  if (heartbeat_.joinable()) heartbeat_.join();
}

void NodeRendezvous::start_heartbeat() {
  if (heartbeat_.joinable()) return;
  rdzv::ClientOptions co = client_->options();
  co.reconnect = false;
  heartbeat_ = std::thread([this, co] {
    try {
      rdzv::Client c(co);
      const std::string k = "/ddprun/" + options_.run_id + "/hb/" + std::to_string(options_.node_rank);
      while (!stop_heartbeat_) {
        c.add(k, 1);
        // sleep override: the heartbeat period
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

std::optional<int> NodeRendezvous::find_lost_node(
    rdzv::Client& c, std::vector<std::pair<int64_t, std::chrono::steady_clock::time_point>>& seen) {
  const auto now = std::chrono::steady_clock::now();
  const auto limit = options_.keep_alive_interval * options_.keep_alive_max_attempt;
  for (int k = 1; k < options_.nnodes; ++k) {
    const int64_t beats = c.add("/ddprun/" + options_.run_id + "/hb/" + std::to_string(k), 0);
    auto& [last, since] = seen[static_cast<size_t>(k)];
    if (beats != last) {
      last = beats;
      since = now;
    } else if (now - since > limit) {
      return k;
    }
  }
  return std::nullopt;
}

std::string NodeRendezvous::key(int round, const std::string& name) const {
  return "/ddprun/" + options_.run_id + "/r" + std::to_string(round) + "/" + name;
}

World NodeRendezvous::join(int round, int nproc, std::optional<uint16_t> worker_store_port) {
  const int n = options_.nnodes;
  const json me = {{"host", options_.host}, {"addr", options_.advertise_addr}, {"nproc", nproc},
                   {"pid", static_cast<int>(::getpid())}, {"nnodes", n},
                   {"joined_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::system_clock::now().time_since_epoch()).count()}};
  const std::string mine = me.dump();
  const std::string held = client_->compare_set(key(round, "node/" + std::to_string(options_.node_rank)), "", mine);
  if (held != mine) {
    const auto other = json::parse(held, nullptr, false);
    throw ConfigError("node_rank " + std::to_string(options_.node_rank) + " has already joined this job from " +
                      (other.is_object() ? other.value("host", "?") + " (pid " + std::to_string(other.value("pid", 0)) + ")" : "another agent") +
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
  start_heartbeat();
  // Two reads, whatever the job's size: this node's assignment and the worker store.
  const auto values = client_->multi_get({key(round, "assign/" + std::to_string(options_.node_rank)),
                                          key(round, "worker_store")});
  const auto mine_assigned = json::parse(values[0]);
  const auto store = json::parse(values[1]);
  World w;
  w.group_rank = options_.node_rank;
  w.group_world_size = n;
  w.rank_offset = mine_assigned.value("offset", 0);
  w.world_size = mine_assigned.value("world_size", 0);
  w.master_addr = store.value("addr", "");
  w.master_port = store.value("port", 0);
  return w;
}

void NodeRendezvous::assign(int round) {
  // The last node to join reads every node's record once, computes the rank offsets (prefix sums
  // of nproc in node-rank order) and writes one small assignment per node: O(n) in total.
  const int n = options_.nnodes;
  std::vector<std::string> keys;
  for (int k = 0; k < n; ++k) keys.push_back(key(round, "node/" + std::to_string(k)));
  const auto values = client_->multi_get(keys);
  std::vector<std::pair<std::string, std::string>> assignments;
  int offset = 0, world = 0;
  for (const auto& v : values) world += json::parse(v).value("nproc", 0);
  for (int k = 0; k < n; ++k) {
    assignments.emplace_back(key(round, "assign/" + std::to_string(k)),
                             json{{"offset", offset}, {"world_size", world}}.dump());
    offset += json::parse(values[static_cast<size_t>(k)]).value("nproc", 0);
  }
  assignments.emplace_back(key(round, "complete"), "1");
  client_->multi_set(assignments);
}

RoundEnd NodeRendezvous::parse_end(const std::string& value) const {
  RoundEnd e;
  if (value == "success") return e;
  if (value.rfind("signal:", 0) == 0) {
    e.kind = RoundEnd::Kind::Signal;
    e.detail = value.substr(7);
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
  rdzv::ClientOptions co = client_->options();
  co.reconnect = false;
  co.connect_timeout = std::chrono::seconds(10);
  watcher_ = std::thread([this, round, co, on_end = std::move(on_end)] {
    try {
      rdzv::Client c(co);
      // WAIT has no server timeout; the client re-arms it every interval so that a store that went
      // silent (node 0's host gone) is noticed, and node 0 checks the other nodes' heartbeats.
      const auto period = std::min<std::chrono::milliseconds>(std::chrono::seconds(1), options_.keep_alive_interval);
      std::vector<std::pair<int64_t, std::chrono::steady_clock::time_point>> seen(
          static_cast<size_t>(options_.nnodes), {-1, std::chrono::steady_clock::now()});
      for (;;) {
        try {
          c.wait({key(round, "end")}, period);
          break;
        } catch (const TimeoutError&) {
          if (stop_watching_) return;
        }
        if (options_.node_rank != 0) continue;
        if (auto lost = find_lost_node(c, seen)) {
          const auto limit = options_.keep_alive_interval * options_.keep_alive_max_attempt;
          // On this thread's own connection: the main client may be blocked in a long WAIT.
          c.compare_set(key(round, "end"), "",
                        "lost:" + std::to_string(*lost) + ":node " + std::to_string(*lost) +
                            " sent no heartbeat for " + seconds_text(limit) +
                            " (its ddprun was killed or its host is unreachable)");
        }
      }
      on_end(parse_end(c.get(key(round, "end"))));
    } catch (const std::exception& e) {
      RoundEnd lost;
      lost.kind = RoundEnd::Kind::StoreLost;
      lost.detail = std::string("lost the rendezvous store (node 0 gone?): ") + e.what();
      on_end(lost);
    }
  });
}

void NodeRendezvous::stop_watcher() {
  if (!watcher_.joinable()) return;
  watcher_.join();
}

RoundEnd NodeRendezvous::report_failure(int round, const WorkerExit& failure) {
  return decide(round, exit_to_json(failure, options_.node_rank).dump());
}

RoundEnd NodeRendezvous::report_signal(int round, int signo) {
  return decide(round, "signal:" + signal_name(signo) + " on node " + std::to_string(options_.node_rank) + " (" +
                           options_.host + ")");
}

RoundEnd NodeRendezvous::report_success(int round, int nnodes) {
  if (client_->add(key(round, "finished"), 1) == nnodes) return decide(round, "success");
  return wait_end(round);
}

RoundEnd NodeRendezvous::wait_end(int round) {
  for (;;) {
    try {
      client_->wait({key(round, "end")}, std::chrono::seconds(5));
      return parse_end(client_->get(key(round, "end")));
    } catch (const TimeoutError&) {
    }
  }
}

void NodeRendezvous::leave(int round, std::chrono::milliseconds timeout) {
  stop_watching_ = true;
  stop_watcher();
  try {
    if (client_->add(key(round, "exited"), 1) == options_.nnodes) client_->set(key(round, "all_exited"), "1");
    // The store host stays until everyone has read the outcome.
    if (options_.node_rank == 0) client_->wait({key(round, "all_exited")}, timeout);
  } catch (const std::exception& e) {
    log::warn("ddprun") << "end-of-job barrier: " << e.what();
  }
}

}  // namespace ddprun::launcher
