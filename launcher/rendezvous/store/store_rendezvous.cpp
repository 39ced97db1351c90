#include "launcher/rendezvous/store/store_rendezvous.hpp"

#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/numbers.hpp"
#include "common/system.hpp"
#include "launcher/rendezvous/round_records.hpp"

namespace ddprun::launcher::rendezvous::store {

using ddprun::StopSignal;
using rendezvous::NodeRendezvous;
using rendezvous::read_number;

using json = nlohmann::json;

namespace {

// Dynamic mode: is the rendezvous endpoint this machine? (torchrun's is_host.)
bool endpoint_is_local(const std::string& endpoint, const StoreRendezvousOptions& o) {
  return endpoint == o.host || (!o.advertise_addr.empty() && endpoint == o.advertise_addr) ||
         names_this_machine(endpoint);
}

}  // namespace

StoreRendezvous::StoreRendezvous(StoreRendezvousOptions options, const StopSignal& stop)
    : NodeRendezvous(static_cast<const JoinSettings&>(options)), options_(std::move(options)) {
  const bool external = !options_.endpoint_host.empty();
  // Unique per agent, so that a dead earlier run's heartbeat is never mistaken for ours.
  agent_id_ = (options_.dynamic ? std::string() : "node" + std::to_string(options_.node_rank) + "-") +
              new_agent_id(options_.host);
  // Who hosts the rendezvous store: node 0 in static jobs without an endpoint; in dynamic jobs the
  // first agent on the endpoint's host that can bind its port (others, or a daemon, are clients).
  const bool try_host = options_.dynamic
                            ? options_.is_host.value_or(endpoint_is_local(options_.endpoint_host, options_))
                            : (options_.node_rank == 0 && !external);
  if (try_host) {
    rdzv::server::ServerOptions so;
    so.host = "::";
    so.port = options_.dynamic ? options_.endpoint_port : options_.master_port;
    so.log_lifecycle = false;
    so.describe_self = true;  // the agents ride out a partition from it (outage_tolerance)
    if (options_.token) so.secret = rdzv::core::store_secret(*options_.token);
    try {
      try {
        server_ = std::make_unique<rdzv::server::ServerThread>(so);
      } catch (const ConnectionError&) {
        so.host = "0.0.0.0";  // no IPv6 on this host
        server_ = std::make_unique<rdzv::server::ServerThread>(so);
      }
      log::info("ddprun") << "hosting the rendezvous store of job '" << options_.run_id << "' on port "
                          << server_->port();
    } catch (const ConnectionError&) {
      if (!options_.dynamic || options_.is_host.value_or(false)) throw;  // this node must host it
      // Another agent (or a ddprun-rendezvous daemon) on this host serves it already.
    }
  }
  rdzv::client::ClientOptions co;
  co.host = external ? options_.endpoint_host : options_.master_addr;
  co.port = external ? options_.endpoint_port : options_.master_port;
  co.timeout = options_.timeouts.read_timeout;
  if (options_.token)
    co.credentials = rdzv::core::credentials_for(*options_.token, options_.run_id, options_.token_file);
  co.missing_secret_hint =
      "give this node the rendezvous secret (or this job's token) with --rdzv_conf "
      "token_file=PATH, or DDPRUN_TOKEN_FILE=PATH (a file only you can read)";
  // A daemon that refuses this job's request (its quota, a full store) says why there.
  co.refusal_note_key = rdzv::core::refusal_note(options_.run_id);
  co.outage_tolerance = options_.timeouts.store_reconnect_timeout;
  // Connect in slices of a second, so that a stop signal is acted on while the store is not up yet.
  const auto started = std::chrono::steady_clock::now();
  const auto deadline = started + options_.timeouts.join_timeout;
  const std::string where = co.host + ":" + std::to_string(co.port);
  log::info("ddprun") << "connecting to the rendezvous store at " << where;
  auto said = started;
  for (;;) {
    co.connect_timeout = std::clamp<std::chrono::milliseconds>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()),
        std::chrono::milliseconds(1), std::chrono::seconds(1));
    try {
      client_ = std::make_unique<rdzv::client::Client>(co);
      break;
    } catch (const rdzv::client::ConnectTimeout& e) {
      if (stop.requested()) throw StopRequested(stop.signo());
      // A name that does not resolve yet (a Kubernetes pod's, until the pod is ready), a store not
      // up yet: tried again until the join timeout, with a line now and then.
      const bool unresolved = e.cause().rfind("cannot resolve host", 0) == 0;
      const auto now = std::chrono::steady_clock::now();
      if (now < deadline) {
        if (now - said >= options_.progress_interval) {
          said = now;
          log::info("ddprun") << "still waiting for the rendezvous store at " << where << ", "
                              << std::chrono::duration_cast<std::chrono::seconds>(now - started).count() << "s of "
                              << seconds_text(options_.timeouts.join_timeout) << ": " << e.cause()
                              << (unresolved ? " (the name is looked up again until the join timeout)" : "");
        }
        continue;
      }
      throw TimeoutError("this node could not reach the rendezvous store at " + where + " within the join timeout (" +
                         seconds_text(options_.timeouts.join_timeout) + "): " + e.cause() +
                         (unresolved ? ". The name never resolved: check it, or give the pods more time "
                                       "(--rdzv_conf join_timeout)"
                          : external ? ". Is ddprun-rendezvous (or the endpoint's ddprun) running at --rdzv_endpoint?"
                                     : ". Is ddprun running on node 0 with the same --master_addr/--master_port?"));
    }
  }
  keys_ = rdzv::jobs::JobKeys(options_.run_id, choose_generation());
  Place first;
  first.group_rank = options_.dynamic ? -1 : options_.node_rank;  // dynamic: known once assigned
  set_place(std::move(first));
}

int64_t StoreRendezvous::choose_generation() {
  const std::string counter = rdzv::jobs::JobKeys::generation_counter(options_.run_id);
  int64_t g = read_number(counter, client_->compare_set(counter, "", "1"));
  // A run that has ended is never joined again: its job id starts over in the next generation.
  while (client_->check({rdzv::jobs::JobKeys(options_.run_id, g).ended()})) g = next_generation(g);
  return g;
}

int64_t StoreRendezvous::next_generation(int64_t after) {
  const std::string counter = rdzv::jobs::JobKeys::generation_counter(options_.run_id);
  return read_number(counter, client_->compare_set(counter, std::to_string(after), std::to_string(after + 1)));
}

bool StoreRendezvous::agent_alive(const std::string& agent, const StopSignal& stop) {
  const std::string k = hb_key(agent);
  const auto window = options_.timeouts.keep_alive_interval * options_.timeouts.keep_alive_max_attempt;
  auto deadline = std::chrono::steady_clock::now() + window;
  const auto beats = [&]() -> int64_t { return client_->check({k}) ? read_number(k, client_->get(k)) : -1; };
  const int64_t first = beats();
  uint64_t reconnects = client_->reconnects();
  while (std::chrono::steady_clock::now() < deadline) {
    // The store was gone for a while (a restart): its silence was nobody's, the window starts over.
    if (client_->reconnects() != reconnects) {
      reconnects = client_->reconnects();
      deadline = std::chrono::steady_clock::now() + window;
    }
    // Watching another agent's heartbeat counter for the liveness window.
    if (stop.sleep_for(std::min<std::chrono::milliseconds>(options_.timeouts.keep_alive_interval / 4,
                                                           std::chrono::milliseconds(250)))) {
      throw StopRequested(stop.signo());
    }
    if (beats() != first) return true;
  }
  return false;
}

StoreRendezvous::~StoreRendezvous() {
  stop_watcher();
  stop_heartbeat();
}

void StoreRendezvous::request_heartbeat_stop() {
  {
    std::lock_guard lock(heartbeat_mutex_);
    stop_heartbeat_ = true;
  }
  heartbeat_cv_.notify_all();
}

void StoreRendezvous::stop_heartbeat() {
  request_heartbeat_stop();
  if (heartbeat_.joinable()) heartbeat_.join();
}

std::shared_ptr<rdzv::client::Client> StoreRendezvous::side_connection(std::function<void()> on_refused) const {
  // Connected by the caller, not on the thread that uses it: a store that is already gone is
  // reported at once, and the thread never sits in a connect retry loop that shutdown would have
  // to wait for. It never reconnects: to a watcher, a lost store is the news.
  rdzv::client::ClientOptions co = client_->options();
  co.reconnect = false;
  co.on_refused = std::move(on_refused);
  co.connect_timeout = std::chrono::seconds(5);
  // A heartbeat that takes longer than its period is as good as missed: a request without a reply
  // by then is given up and, against a store that describes itself, sent again over a new
  // connection, which gets through as soon as the path is back (a TCP retransmission after a
  // partition may come many seconds later).
  co.timeout =
      std::clamp<std::chrono::milliseconds>(options_.timeouts.keep_alive_interval, std::chrono::seconds(2),
                                            std::max<std::chrono::milliseconds>(co.timeout, std::chrono::seconds(2)));
  return std::make_shared<rdzv::client::Client>(co);
}

void StoreRendezvous::start_heartbeat() {
  if (heartbeat_.joinable()) {
    // Running; or ended on a store error (an outage longer than it rides out), and this join, on
    // a store that answers again, starts it anew.
    if (!heartbeat_ended_ || stop_heartbeat_) return;
    heartbeat_.join();
    heartbeat_ended_ = false;
  }
  std::shared_ptr<rdzv::client::Client> c;
  try {
    // While the store itself is down (its port refuses: a daemon restarting), no node can count
    // another as lost (nobody's heartbeat gets through, and every watcher's window starts over
    // when it is back): the node's place holds as long as it is, and its fence is renewed.
    c = side_connection(options_.alive);
  } catch (const std::exception& e) {
    log::warn("ddprun") << "no heartbeat: " << e.what();
    return;
  }
  heartbeat_ = std::thread([this, c] {
    try {
      const std::string k = hb_key(agent_id_);
      while (!stop_heartbeat_) {
        c->add(k, 1);  // what liveness is judged by (a counter: clocks need not agree)
        if (options_.alive) options_.alive();
        c->set(keys_.heartbeat_time(agent_id_), std::to_string(now_ms()));  // for `ddprun-rendezvous status` only
        // The period, ended at once by a stop. (It slept in 50 ms slices before: 20 wake-ups a
        // second per agent, which thousands of agents on one host turn into a scheduler storm.)
        std::unique_lock lock(heartbeat_mutex_);
        heartbeat_cv_.wait_for(lock, options_.timeouts.keep_alive_interval, [this] { return stop_heartbeat_.load(); });
      }
    } catch (const std::exception& e) {
      // Once the job is ending the failure is no news (the store is gone, or going with it).
      if (!stop_heartbeat_) log::warn("ddprun") << "heartbeat stopped: " << e.what();
    }
    heartbeat_ended_ = true;
  });
}

std::optional<int> StoreRendezvous::find_lost_node(rdzv::client::Client& c, HeartbeatSeen& seen) {
  const Place p = place();
  const int n = static_cast<int>(p.agents.size());
  if (n < 2) return std::nullopt;
  // Each node watches the next one in group-rank order: O(1) store traffic per node.
  const int watched_rank = (p.group_rank + 1) % n;
  const std::string& watched = p.agents[static_cast<size_t>(watched_rank)];
  const auto now = std::chrono::steady_clock::now();
  const std::string k = hb_key(watched);
  const int64_t beats = c.check({k}) ? read_number(k, c.get(k)) : -1;
  // After the store was gone for a while (a restart), nobody's heartbeat got through: the window
  // starts over rather than count the outage as the watched node's silence.
  if (beats != seen.beats || c.reconnects() != seen.reconnects) {
    seen = {beats, now, c.reconnects()};
  } else if (now - seen.since > options_.timeouts.keep_alive_interval * options_.timeouts.keep_alive_max_attempt) {
    return watched_rank;
  }
  return std::nullopt;
}

int StoreRendezvous::first_round(const StopSignal&) {
  const std::string k = keys_.current_round();
  if (!options_.dynamic || !client_->check({k})) return 0;
  return static_cast<int>(read_number(k, client_->get(k)));
}

std::optional<std::string> StoreRendezvous::read(const std::string& key) {
  if (!client_->check({key})) return std::nullopt;
  return client_->get(key);
}

std::string StoreRendezvous::create_or_get(const std::string& key, const std::string& value) {
  return client_->compare_set(key, "", value);
}

int64_t StoreRendezvous::tally(int round, Tally what, bool count_me) {
  // Counters: ADD of 0 reads one.
  return client_->add(what == Tally::Finished ? round_keys(round).finished() : keys_.exited(), count_me ? 1 : 0);
}

int64_t StoreRendezvous::joined_nodes(int round) { return client_->add(round_keys(round).joined(), 0); }

void StoreRendezvous::forget_generation() { client_->set(keys_.done(), "1"); }

namespace {

class StoreKeyWait final : public NodeRendezvous::KeyWait {
 public:
  StoreKeyWait(rdzv::client::Client& client, std::string key) : client_(client), key_(std::move(key)) {}

  std::optional<std::string> next(std::chrono::milliseconds slice) override {
    if (!client_.connected() && !client_.rides_out_outages()) {
      throw ConnectionError("the connection to the rendezvous store was lost");
    }
    if (!client_.wait_for({key_}, slice)) return std::nullopt;
    return client_.get(key_);
  }

 private:
  rdzv::client::Client& client_;
  std::string key_;
};

}  // namespace

std::unique_ptr<NodeRendezvous::KeyWait> StoreRendezvous::wait_for_key(const std::string& key) {
  return std::make_unique<StoreKeyWait>(*client_, key);
}

NodeRendezvous::JoinPoll StoreRendezvous::keys_set(int round, std::vector<std::string> keys) {
  return [this, round, keys = std::move(keys)](std::chrono::milliseconds slice) {
    JoinState s;
    s.ready = client_->wait_for(keys, slice);
    if (!s.ready) s.end = read(round_keys(round).end());
    return s;
  };
}

class StoreRendezvous::Watch final : public NodeRendezvous::RoundWatch {
 public:
  Watch(StoreRendezvous& r, std::shared_ptr<rdzv::client::Client> c, int round)
      : r_(r),
        c_(std::move(c)),
        end_key_(r.round_keys(round).end()),
        seen_{-1, std::chrono::steady_clock::now(), c_->reconnects()} {}

  Event next() override {
    Event ev;
    // WAIT has no server timeout; it is re-armed every period so that a store that went silent
    // (its host gone) is noticed, and each node checks the next node's heartbeat between waits.
    const auto period =
        std::min<std::chrono::milliseconds>(std::chrono::seconds(1), r_.options_.timeouts.keep_alive_interval);
    try {
      c_->wait({end_key_}, period);
      ev.end = c_->get(end_key_);
      return ev;
    } catch (const TimeoutError&) {
    }
    if (auto lost = r_.find_lost_node(*c_, seen_)) {
      // The round may have ended while this node was not looking (stopped, its wait ran out on
      // resuming): then its end says why, not the next node's heartbeat.
      if (c_->check({end_key_})) {
        ev.end = c_->get(end_key_);
        return ev;
      }
      ev.lost_node = *lost;
      ev.lost_why = "sent no heartbeat for " + seconds_text(r_.options_.timeouts.keep_alive_interval *
                                                            r_.options_.timeouts.keep_alive_max_attempt);
    }
    return ev;
  }

  std::string create_or_get(const std::string& key, const std::string& value) override {
    return c_->compare_set(key, "", value);
  }

 private:
  StoreRendezvous& r_;
  std::shared_ptr<rdzv::client::Client> c_;
  std::string end_key_;
  HeartbeatSeen seen_;
};

std::unique_ptr<NodeRendezvous::RoundWatch> StoreRendezvous::watch_round(int round) {
  // A connection of its own, made here: a store that is already gone is reported at once.
  return std::make_unique<Watch>(*this, side_connection(), round);
}

class StoreRendezvous::Liveness final : public NodeRendezvous::WorldLiveness {
 public:
  Liveness(StoreRendezvous& r, std::vector<std::string> agents, std::vector<std::string> hosts)
      : r_(r), agents_(std::move(agents)), hosts_(std::move(hosts)), seen_(agents_.size()) {
    for (const std::string& a : agents_) keys_.push_back(r_.hb_key(a));
  }

  std::vector<int> lapsed() override {
    const auto values = r_.client_->multi_get_now(keys_);  // a key not written reads as empty
    const auto now = std::chrono::steady_clock::now();
    const uint64_t reconnects = r_.client_->reconnects();
    std::vector<int> out;
    for (size_t i = 0; i < agents_.size() && i < values.size(); ++i) {
      const int64_t beats = to_int(values[i]).value_or(-1);
      HeartbeatSeen& seen = seen_[i];
      // A counter first read now, one that moved, or a store that was away meanwhile (nobody's
      // heartbeat got through it): the window starts over.
      if (seen.since == std::chrono::steady_clock::time_point{} || beats != seen.beats ||
          reconnects != seen.reconnects) {
        seen = {beats, now, reconnects};
      } else if (now - seen.since > window()) {
        out.push_back(static_cast<int>(i));
      }
    }
    return out;
  }
  int nodes() const override { return static_cast<int>(agents_.size()); }
  std::string host(int g) const override {
    return g >= 0 && static_cast<size_t>(g) < hosts_.size() ? hosts_[static_cast<size_t>(g)] : "?";
  }
  std::string lapse() const override { return "sent no heartbeat for " + seconds_text(window()); }

 private:
  std::chrono::milliseconds window() const {
    return r_.options_.timeouts.keep_alive_interval * r_.options_.timeouts.keep_alive_max_attempt;
  }

  StoreRendezvous& r_;
  std::vector<std::string> agents_, hosts_, keys_;
  std::vector<HeartbeatSeen> seen_;
};

std::unique_ptr<NodeRendezvous::WorldLiveness> StoreRendezvous::watch_liveness(int round) {
  // Every node's assignment lists the round's agents in group-rank order; the node that closed the
  // round writes them right after `closed`.
  const std::string key = round_keys(round).assign("1");
  const auto value = read(key);
  if (!value) return nullptr;
  const rdzv::jobs::Assignment a = read_assignment(key, *value);
  if (a.agents.empty()) return nullptr;  // a job of more than 64 nodes: its ring watches itself
  return std::make_unique<Liveness>(*this, a.agents, a.hosts);
}

void StoreRendezvous::linger(int nodes, std::chrono::milliseconds timeout, const StopSignal& stop) {
  if (!server_) return;
  // The store host stays until everyone has read the outcome (or the timeout: a node that is
  // gone never leaves; after a stop signal, a few seconds are enough for the others to see it).
  const auto deadline =
      std::chrono::steady_clock::now() +
      (stop.requested() ? std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(5)) : timeout);
  while (!client_->wait_for({keys_.done()}, std::chrono::milliseconds(250))) {
    if (std::chrono::steady_clock::now() >= deadline) {
      log::warn("ddprun") << "end-of-job barrier: " << client_->add(keys_.exited(), 0) << " of " << nodes
                          << " node(s) have left; not waiting for the others any longer";
      return;
    }
  }
}

}  // namespace ddprun::launcher::rendezvous::store
