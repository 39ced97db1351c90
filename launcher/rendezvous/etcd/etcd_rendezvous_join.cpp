// Joining a round of the etcd rendezvous (see etcd_rendezvous.hpp): member keys on the agent's
// lease, a round closed once by a transaction, waits carried by a watch of the round; and the hang
// watchdog's channel over etcd.
#include <algorithm>
#include <climits>
#include <map>
#include <tuple>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/numbers.hpp"
#include "launcher/rendezvous/etcd/etcd_rendezvous.hpp"
#include "launcher/rendezvous/round_records.hpp"

namespace ddprun::launcher::rendezvous::etcd {

using ddprun::StopSignal;
using rendezvous::hang_outcome;
using rendezvous::Joiner;
using rendezvous::Membership;
using rendezvous::order_by_group_rank;
using rendezvous::parse_round_end;
using rendezvous::ProgressChannel;
using rendezvous::read_closed_round;
using rendezvous::read_worker_store;
using rendezvous::RoundEnd;
using rendezvous::this_node;
using rendezvous::WorkerStoreHost;
using rendezvous::World;
using rendezvous::world_of;

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::vector<Joiner> EtcdRendezvous::members_of(const std::vector<etcd::KeyValue>& kvs,
                                               const std::string& prefix) const {
  std::vector<Joiner> out;
  for (const auto& kv : kvs) {
    if (kv.key.rfind(prefix, 0) != 0) continue;
    auto record = rdzv::jobs::decode_node_record(kv.value);
    if (!record) {
      log::warn("ddprun") << "etcd key " << kv.key << " is not a member record: ignored";
      continue;
    }
    // The member key names the agent.
    record->agent = kv.key.substr(prefix.size());
    out.push_back({record->agent, std::move(*record), kv.create_revision});
  }
  return out;
}

void EtcdRendezvous::close_round(int round, std::vector<Joiner> joined) {
  order_by_group_rank(joined);
  if (static_cast<int>(joined.size()) > options_.max_nodes) joined.resize(static_cast<size_t>(options_.max_nodes));
  rdzv::jobs::ClosedRound closed;
  for (auto& m : joined) closed.members.push_back(std::move(m.record));
  client_->create_or_get(round_keys(round).closed(), rdzv::jobs::encode(closed), 0, request_deadline());
}

std::optional<RoundEnd> EtcdRendezvous::wait_round(
    int round, const StopSignal& stop, const std::function<bool(const std::vector<etcd::KeyValue>&)>& ready,
    const std::function<std::string(const std::vector<etcd::KeyValue>&)>& progress) {
  const std::string prefix = round_keys(round).prefix();
  const std::string end_key = round_keys(round).end();
  // The round's keys as of one revision, then kept current by a watch from the next one.
  const etcd::RangeResult snapshot = client_->get_prefix(prefix, request_deadline());
  std::map<std::string, etcd::KeyValue> state;
  std::vector<std::string> present;
  for (const auto& kv : snapshot.kvs) {
    state[kv.key] = kv;
    present.push_back(kv.key);
  }
  etcd::Watch w(*client_, prefix, etcd::prefix_end(prefix), snapshot.revision + 1, std::move(present));
  auto kvs = [&] {
    std::vector<etcd::KeyValue> out;
    for (const auto& [k, kv] : state) out.push_back(kv);
    return out;
  };
  auto poll = [&](std::chrono::milliseconds slice) {
    JoinState s;
    if (auto e = state.find(end_key); e != state.end()) {
      s.end = e->second.value;
    } else if (ready(kvs())) {
      s.ready = true;
    } else {
      if (lease_lost_) throw ConnectionError("this node's etcd lease expired during the rendezvous (etcd unreachable)");
      for (auto& ev : w.next(slice, Clock::now() + watch_patience(options_.lease_ttl))) {
        if (ev.type == etcd::WatchEvent::Type::Delete) state.erase(ev.kv.key);
        else state[ev.kv.key] = std::move(ev.kv);
      }
    }
    return s;
  };
  auto missing = [&] { return progress(kvs()); };
  return wait_joining(round, stop, poll, missing, missing);
}

std::variant<World, RoundEnd> EtcdRendezvous::join(int round, int nproc, const WorkerStoreHost& host_worker_store,
                                                   const StopSignal& stop) {
  if (stop.requested()) throw StopRequested(stop.signo());
  for (;;) {
    // No agent in the record: the member key names it.
    rdzv::jobs::NodeRecord me = this_node(options_, nproc);
    me.hint = options_.node_rank;
    me.restarts = restarts();
    const std::string member_key = round_keys(round).member(agent_id_);
    client_->put(member_key, rdzv::jobs::encode(me), lease_, request_deadline());  // gone with this agent's lease
    // Only after a key on a live lease: a generation with keys but none on a live lease is one
    // whose agents are all gone (choose_generation).
    client_->put(keys().current_round(), std::to_string(round), 0, request_deadline());
    log::info("ddprun") << "joined round " << round << " of job '" << options_.run_id << "' (generation " << generation_
                        << ") on etcd (--nnodes " << options_.min_nodes << ":" << options_.max_nodes << ")";
    joined(round,
           "on etcd (--nnodes " + std::to_string(options_.min_nodes) + ":" + std::to_string(options_.max_nodes) + ")");
    const std::string member_prefix = round_keys(round).members();
    const std::string closed_key = round_keys(round).closed();
    std::optional<Clock::time_point> enough_since;
    auto count_members = [&](const std::vector<etcd::KeyValue>& kvs) {
      return std::count_if(kvs.begin(), kvs.end(), [&](auto& kv) { return kv.key.rfind(member_prefix, 0) == 0; });
    };
    auto ready = [&](const std::vector<etcd::KeyValue>& kvs) {
      if (std::any_of(kvs.begin(), kvs.end(), [&](auto& kv) { return kv.key == closed_key; })) return true;
      const auto members = members_of(kvs, member_prefix);
      const int n = static_cast<int>(members.size());
      if (n >= options_.max_nodes) {
        close_round(round, members);  // full; the watch brings `closed`
      } else if (n >= options_.min_nodes) {
        // Enough nodes: wait the last call for more, then close with whoever is there.
        if (!enough_since) enough_since = Clock::now();
        else if (Clock::now() - *enough_since >= options_.timeouts.last_call_timeout) close_round(round, members);
      } else {
        enough_since.reset();
      }
      return false;
    };
    auto progress = [&](const std::vector<etcd::KeyValue>& kvs) {
      return std::to_string(count_members(kvs)) + " node(s) joined, " + std::to_string(options_.min_nodes) +
             " needed to start (--nnodes " + std::to_string(options_.min_nodes) + ":" +
             std::to_string(options_.max_nodes) + ")";
    };
    if (auto ended = wait_round(round, stop, ready, progress)) return *ended;
    const Membership closed(
        read_closed_round(closed_key, client_->get(closed_key, request_deadline()).kvs.at(0).value).members);
    const int mine = closed.group_rank_of(agent_id_);
    if (mine < 0) {
      client_->erase(member_key, "", request_deadline());
      if (!elastic()) {
        // A fixed --nnodes: no spares. Either the round's nodes live (another run of this job id,
        // refused below), or they are gone and their leases expire within the TTL (this node
        // crashed and is run again, with the nodes it ran with): then that run is over, and this
        // one starts the next generation.
        if (world_gone_within(round, options_.lease_ttl + std::chrono::seconds(2), stop)) {
          generation_ = choose_generation(stop);
          log::info("ddprun") << "job '" << options_.run_id << "': the nodes of round " << round
                              << " are gone (their etcd leases expired); this run is generation " << generation_;
          continue;
        }
        throw ConfigError("job '" + options_.run_id + "' is running with " + std::to_string(closed.size()) +
                          " node(s) (--nnodes " + std::to_string(options_.min_nodes) + ":" +
                          std::to_string(options_.max_nodes) +
                          "), with no room for this one; give this job its own "
                          "--rdzv_id, or start it when the other run has ended");
      }
      // Too late for this round: ask the running nodes to re-rendezvous (when there is room for
      // this node) or wait as a spare (when there is none), and join the next round.
      if (closed.size() < options_.max_nodes) {
        ask_to_admit_this_node(round, closed.size());
      } else if (auto over = wait_as_spare(round, closed.size(), stop)) {
        return *over;
      }
      ++round;
      continue;
    }
    const std::string store_key = round_keys(round).worker_store();
    if (mine == 0) {
      const rendezvous::HostedStore hosted = host_worker_store();
      client_->put(store_key,
                   rdzv::jobs::encode(rdzv::jobs::WorkerStoreRecord{options_.advertise_addr, hosted.port, hosted.key}),
                   0, request_deadline());
    }
    auto stored = [&](const std::vector<etcd::KeyValue>& kvs) {
      return std::any_of(kvs.begin(), kvs.end(), [&](auto& kv) { return kv.key == store_key; });
    };
    auto waiting_for_store = [&](const std::vector<etcd::KeyValue>&) {
      return std::string("waiting for node 0 to start the worker store");
    };
    if (auto ended = wait_round(round, stop, stored, waiting_for_store)) return *ended;
    return adopt(world_of(round, closed, mine,
                          read_worker_store(store_key, client_->get(store_key, request_deadline()).kvs.at(0).value)),
                 closed);
  }
}

namespace {

class EtcdLiveness final : public NodeRendezvous::WorldLiveness {
 public:
  using Range = std::function<etcd::RangeResult()>;
  EtcdLiveness(Range members, std::string prefix, std::vector<std::string> agents, std::vector<std::string> hosts,
               std::chrono::seconds ttl)
      : members_(std::move(members)),
        prefix_(std::move(prefix)),
        agents_(std::move(agents)),
        hosts_(std::move(hosts)),
        ttl_(ttl) {}

  std::vector<int> lapsed() override {
    const etcd::RangeResult r = members_();
    std::vector<int> out;
    for (size_t i = 0; i < agents_.size(); ++i) {
      const std::string key = prefix_ + agents_[i];
      if (std::none_of(r.kvs.begin(), r.kvs.end(), [&](const etcd::KeyValue& kv) { return kv.key == key; }))
        out.push_back(static_cast<int>(i));
    }
    return out;
  }
  int nodes() const override { return static_cast<int>(agents_.size()); }
  std::string host(int g) const override {
    return g >= 0 && static_cast<size_t>(g) < hosts_.size() ? hosts_[static_cast<size_t>(g)] : "?";
  }
  std::string lapse() const override {
    return "lost its etcd lease (" + std::to_string(ttl_.count()) + " s without a renewal)";
  }

 private:
  Range members_;
  std::string prefix_;
  std::vector<std::string> agents_, hosts_;
  std::chrono::seconds ttl_;
};

}  // namespace

std::unique_ptr<NodeRendezvous::WorldLiveness> EtcdRendezvous::watch_liveness(int round) {
  const std::string closed_key = round_keys(round).closed();
  const etcd::RangeResult closed = client_->get(closed_key, request_deadline());
  if (closed.kvs.empty()) return nullptr;
  const Membership m(read_closed_round(closed_key, closed.kvs[0].value).members);
  const std::string prefix = round_keys(round).members();
  return std::make_unique<EtcdLiveness>(
      [this, prefix] { return client_->get_prefix(prefix, request_deadline(), /*keys_only=*/true); }, prefix,
      m.agents(), m.hosts(), options_.lease_ttl);
}

bool EtcdRendezvous::world_gone_within(int round, std::chrono::milliseconds patience, const StopSignal& stop) {
  const auto liveness = watch_liveness(round);
  if (!liveness) return false;
  const auto deadline = Clock::now() + patience;
  for (;;) {
    if (static_cast<int>(liveness->lapsed().size()) == liveness->nodes()) return true;
    if (Clock::now() >= deadline) return false;
    if (stop.sleep_for(std::chrono::milliseconds(250))) throw StopRequested(stop.signo());
  }
}

World EtcdRendezvous::adopt(World w, const Membership& m) {
  set_place(Place{w.group_rank, w.group_world_size, m.agents(), m.hosts()});
  return w;
}

namespace {

// The hang watchdog's job-wide channel (rendezvous_backend.hpp) over etcd, on a client of its own.
class EtcdProgressChannel final : public ProgressChannel {
 public:
  EtcdProgressChannel(etcd::Options options, rdzv::jobs::RoundKeys keys, int node, int nodes)
      : client_(std::move(options)), rk_(std::move(keys)), node_(node), nodes_(nodes) {}

  Pulse pulse(bool progressed, bool heartbeat_mode) override {
    if (progressed) client_.put(rk_.progress_of(node_), std::to_string(++count_), 0, deadline());
    if (heartbeat_mode && !heartbeat_mode_published_) {
      client_.put(rk_.heartbeat_mode(), "1", 0, deadline());
      heartbeat_mode_published_ = true;
    }
    // One read of the round's keys: the newest progress revision, and the flags.
    const etcd::RangeResult r = client_.get_prefix(rk_.prefix(), deadline(), /*keys_only=*/true);
    Pulse p;
    bool claimed = false;
    for (const auto& kv : r.kvs) {
      if (kv.key.rfind(rk_.progress_all(), 0) == 0) p.job_progress = std::max(p.job_progress, kv.mod_revision);
      p.heartbeat_mode = p.heartbeat_mode || kv.key == rk_.heartbeat_mode();
      claimed = claimed || kv.key == rk_.hang();
    }
    if (claimed) {
      const etcd::RangeResult h = client_.get(rk_.hang(), deadline());
      if (!h.kvs.empty()) {
        const auto by = to_int(h.kvs[0].value);
        p.hang_claimed_by = by ? static_cast<int>(*by) : -1;
      }
    }
    return p;
  }

  void publish_rates(const json& record) override { client_.put(rk_.rates(node_), record.dump(), 0, deadline()); }

  std::map<int, json> rates() override { return by_node(rk_.rates_all()); }

  bool claim_hang() override {
    const std::string me = std::to_string(node_);
    return client_.create_or_get(rk_.hang(), me, 0, deadline()) == me;
  }

  void put_diagnosis(const json& diagnosis) override {
    client_.put(rk_.diagnosis(node_), diagnosis.dump(-1, ' ', false, json::error_handler_t::replace), 0, deadline());
  }

  std::map<int, json> gather_diagnoses(Clock::time_point until) override {
    std::map<int, json> out;
    for (;;) {
      out = by_node(rk_.diagnoses());
      if (static_cast<int>(out.size()) >= nodes_ || Clock::now() >= until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));  // sleep override: the parts come within seconds
    }
    client_.erase(rk_.diagnoses(), etcd::prefix_end(rk_.diagnoses()), deadline());
    return out;
  }

  RoundEnd report_hang(const std::string& summary, const std::string& report) override {
    const std::string proposal = rdzv::jobs::encode_outcome(hang_outcome(summary, report, node_));
    return parse_round_end(client_.create_or_get(rk_.end(), proposal, 0, deadline()));
  }

  int nodes() const override { return nodes_; }
  int node() const override { return node_; }

 private:
  static etcd::Client::Deadline deadline() { return etcd::Client::after(std::chrono::seconds(5)); }

  // Every node's record under `prefix` (rk_.rates_all(), rk_.diagnoses()), by node.
  std::map<int, json> by_node(const std::string& prefix) {
    std::map<int, json> out;
    for (const auto& kv : client_.get_prefix(prefix, deadline()).kvs) {
      const auto node = to_int(std::string_view(kv.key).substr(prefix.size()));
      json j = json::parse(kv.value, nullptr, false);
      if (node && j.is_object()) out[static_cast<int>(*node)] = std::move(j);
    }
    return out;
  }

  etcd::Client client_;
  rdzv::jobs::RoundKeys rk_;
  int node_;
  int nodes_;
  uint64_t count_ = 0;
  bool heartbeat_mode_published_ = false;
};

}  // namespace

std::unique_ptr<ProgressChannel> EtcdRendezvous::open_progress_channel(int round, int node, int nodes) {
  return std::make_unique<EtcdProgressChannel>(options_.etcd, round_keys(round), node, nodes);
}

}  // namespace ddprun::launcher::rendezvous::etcd
