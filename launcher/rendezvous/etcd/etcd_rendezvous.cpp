#include "launcher/rendezvous/etcd/etcd_rendezvous.hpp"

#include <unistd.h>

#include <random>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/numbers.hpp"
#include "launcher/rendezvous/rendezvous_values.hpp"

namespace ddprun::launcher {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// How long a finished job id's generation counter outlives the job.
constexpr std::chrono::seconds kForgetJobAfter{24 * 3600};

// What an etcd refusal means for the user.
[[noreturn]] void explain(const etcd::EtcdError& e, const std::string& endpoints) {
  const std::string what = e.what();
  if (what.find("authentication failed") != std::string::npos || what.find("invalid user") != std::string::npos) {
    throw ConfigError("etcd (" + endpoints + ") refused the user and password: " + what +
                      " (check --rdzv_conf etcd_user and etcd_password_file)");
  }
  if (what.find("permission denied") != std::string::npos || what.find("user name is empty") != std::string::npos) {
    throw ConfigError("etcd (" + endpoints + ") refused access: " + what +
                      " (etcd has authentication on: give --rdzv_conf etcd_user=NAME,etcd_password_file=PATH for a "
                      "user with read-write access to the key prefix)");
  }
  throw;
}

}  // namespace

EtcdRendezvous::EtcdRendezvous(EtcdRendezvousOptions options, const StopSignal& stop)
    : NodeRendezvous(options.host), options_(std::move(options)) {
  client_ = std::make_unique<etcd::Client>(options_.etcd);
  std::mt19937 rng(std::random_device{}());
  agent_id_ = options_.host + ":" + std::to_string(::getpid()) + ":" + std::to_string(rng() % 100000);
  // The lease doubles as the connection check: retried, in slices, until the join timeout.
  const auto deadline = Clock::now() + options_.join_timeout;
  log::info("ddprun") << "connecting to etcd at " << client_->endpoints_text();
  std::string last;
  for (;;) {
    try {
      lease_ = client_->lease_grant(options_.lease_ttl, std::min(deadline, Clock::now() + std::chrono::seconds(2)));
      break;
    } catch (const etcd::EtcdError& e) {
      explain(e, client_->endpoints_text());
    } catch (const ConnectionError& e) {
      last = e.what();
    }
    if (stop.requested()) throw StopRequested(stop.signo());
    if (Clock::now() >= deadline) {
      throw ConnectionError("etcd could not be reached at " + client_->endpoints_text() + " within the join timeout (" +
                            seconds_text(options_.join_timeout) + "): " + last +
                            ". Is etcd running there, and are these its client URLs (--rdzv_endpoint)?");
    }
    if (stop.sleep_for(std::chrono::milliseconds(200))) throw StopRequested(stop.signo());
  }
  try {
    generation_ = choose_generation(stop);
  } catch (const etcd::EtcdError& e) {
    explain(e, client_->endpoints_text());
  }
  // Renewed from now on (a few requests since the grant: well within its TTL).
  keepalive_ = std::thread([this] { keep_lease_alive(); });
}

EtcdRendezvous::~EtcdRendezvous() {
  stop_watcher();
  {
    std::lock_guard lock(keepalive_mutex_);
    stop_keepalive_ = true;
  }
  keepalive_wake_.notify_all();
  if (keepalive_.joinable()) keepalive_.join();
  if (lease_ != 0 && !lease_lost_) {
    try {
      client_->lease_revoke(lease_, etcd::Client::after(std::chrono::seconds(2)));
    } catch (const std::exception&) {
      // It expires by itself.
    }
  }
}

etcd::Client::Deadline EtcdRendezvous::soon() const {
  // Long enough to ride out a leader election and a member or two that are down.
  return etcd::Client::after(std::max<std::chrono::milliseconds>(options_.lease_ttl, std::chrono::seconds(10)));
}

void EtcdRendezvous::keep_lease_alive() {
  const auto period = std::max<std::chrono::milliseconds>(options_.lease_ttl / 3, std::chrono::milliseconds(500));
  // After a failed renewal, tried again at once and often, each try short: the lease (and the
  // node's fence, see OrphanGuard) is renewed as soon as etcd answers again.
  const auto retry = std::chrono::milliseconds(500);
  const auto attempt = std::min<std::chrono::milliseconds>(period, std::chrono::seconds(2));
  auto last_renewal = Clock::now();
  bool failing = false;
  std::unique_lock lock(keepalive_mutex_);
  while (!keepalive_wake_.wait_for(lock, failing ? retry : period, [this] { return stop_keepalive_.load(); })) {
    lock.unlock();
    failing = true;
    try {
      const int64_t ttl = client_->lease_keepalive(lease_, etcd::Client::after(attempt));
      if (ttl <= 0) {
        log::error("ddprun") << "etcd says this node's lease has expired: the other nodes count it as lost";
        lease_lost_ = true;
      } else {
        last_renewal = Clock::now();
        failing = false;
      }
    } catch (const std::exception& e) {
      if (Clock::now() - last_renewal > options_.lease_ttl) {
        // Nobody may have seen anything (etcd without a quorum lets no lease expire): this node
        // leaves because it cannot tell whether it is still counted in.
        log::error("ddprun") << "no etcd member renewed this node's lease for " << options_.lease_ttl.count()
                             << " s (" << e.what() << "): etcd is unreachable or without a quorum, and this node "
                                "cannot tell whether its lease still holds";
        lease_lost_ = true;
      }
    }
    lock.lock();
    if (lease_lost_) return;
  }
}

int64_t EtcdRendezvous::choose_generation(const StopSignal& stop) {
  const std::string counter = job_key("gen");
  auto number = [&](const std::string& v) {
    const auto g = to_int(v);
    if (!g || *g < 1) throw ProtocolError("the etcd key " + counter + " holds '" + v.substr(0, 40) + "', not a generation");
    return *g;
  };
  int64_t g = number(client_->create_or_get(counter, "1", 0, soon()));
  for (;;) {
    if (stop.requested()) throw StopRequested(stop.signo());
    const std::string prefix = job_key("g" + std::to_string(g) + "/");
    const etcd::RangeResult r = client_->get_prefix(prefix, soon(), /*keys_only=*/true);
    bool ended = false, live = false;
    for (const auto& kv : r.kvs) {
      ended = ended || kv.key == prefix + "ended";
      live = live || kv.lease != 0;  // a key attached to a lease lives only while its agent does
    }
    if (!ended && (r.kvs.empty() || live)) return g;
    // That run is over (or all its agents are gone): this is a new run of the job id.
    const etcd::TxnResult t = client_->txn({etcd::Compare::value_is(counter, std::to_string(g))},
                                           {etcd::Op::put(counter, std::to_string(g + 1))}, {etcd::Op::get(counter)},
                                           soon());
    log::info("ddprun") << "job '" << options_.run_id << "': generation " << g
                        << (ended ? " has ended" : " was left by agents that are gone") << "; moving on";
    if (t.succeeded) {
      client_->erase(prefix, etcd::prefix_end(prefix), soon());  // its leftovers
      g += 1;
    } else if (!t.ranges.empty() && !t.ranges[0].kvs.empty()) {
      g = number(t.ranges[0].kvs[0].value);  // another agent moved it on first
    }
  }
}

int EtcdRendezvous::first_round(const StopSignal&) {
  const etcd::RangeResult r = client_->get(gen_prefix() + "current", soon());
  if (r.kvs.empty()) return 0;
  const auto round = to_int(r.kvs[0].value);
  return round && *round >= 0 ? static_cast<int>(*round) : 0;
}

std::optional<RoundEnd> EtcdRendezvous::read_end(int round) {
  const etcd::RangeResult r = client_->get(rk(round).end(), soon());
  if (r.kvs.empty()) return std::nullopt;
  return parse_round_end(r.kvs[0].value);
}

RoundEnd EtcdRendezvous::decide(int round, const rdzv::jobs::Outcome& proposal) {
  // The first proposal wins; everyone reads the same decision back.
  return parse_round_end(client_->create_or_get(rk(round).end(), rdzv::jobs::encode_outcome(proposal), 0, soon()));
}

void EtcdRendezvous::watch(int round, std::function<void(const RoundEnd&)> on_end) {
  start_watcher([this, round, on_end = std::move(on_end)] {
    auto lost = [](const std::string& why) {
      RoundEnd e;
      e.kind = RoundEnd::Kind::StoreLost;
      e.detail = why;
      return e;
    };
    try {
      const std::string prefix = rk(round).prefix();
      const etcd::RangeResult now = client_->get_prefix(prefix, soon(), true);
      std::vector<std::string> present;
      for (const etcd::KeyValue& kv : now.kvs) {
        if (kv.key == rk(round).end()) {
          on_end(parse_round_end(client_->get(kv.key, soon()).kvs.at(0).value));
          return;
        }
        present.push_back(kv.key);
      }
      etcd::Watch w(*client_, prefix, etcd::prefix_end(prefix), now.revision + 1, std::move(present));
      const std::string member_prefix = rk(round).members();
      for (;;) {
        if (watch_stopped()) return;
        if (lease_lost_) {
          on_end(lost("this node's etcd lease could not be renewed for " + std::to_string(options_.lease_ttl.count()) +
                      " s: it may have expired, and the other nodes then count this node as lost"));
          return;
        }
        const auto give_up = Clock::now() + std::max<std::chrono::milliseconds>(options_.lease_ttl, std::chrono::seconds(5));
        for (const etcd::WatchEvent& ev : w.next(std::chrono::milliseconds(500), give_up)) {
          if (ev.kv.key == rk(round).end() && ev.type == etcd::WatchEvent::Type::Put) {
            on_end(parse_round_end(ev.kv.value));
            return;
          }
          if (ev.type != etcd::WatchEvent::Type::Delete || ev.kv.key.rfind(member_prefix, 0) != 0) continue;
          // A member's lease expired: that node is gone.
          const std::string agent = ev.kv.key.substr(member_prefix.size());
          const Place p = place();
          int node = -1;
          std::string host;
          for (size_t i = 0; i < p.agents.size(); ++i) {
            if (p.agents[i] == agent) {
              node = static_cast<int>(i);
              host = i < p.hosts.size() ? p.hosts[i] : "?";
            }
          }
          if (node < 0 || agent == agent_id_) continue;
          rdzv::jobs::Outcome gone;
          gone.kind = rdzv::jobs::Outcome::Kind::NodeLost;
          gone.node = node;
          gone.detail = "node " + std::to_string(node) + " (" + host + ") lost its etcd lease (" +
                        std::to_string(options_.lease_ttl.count()) +
                        " s without a renewal: its ddprun was killed or its host is unreachable)";
          on_end(decide(round, gone));
          return;
        }
      }
    } catch (const std::exception& e) {
      on_end(lost(std::string("lost etcd: ") + e.what()));
    }
  });
}

RoundEnd EtcdRendezvous::report_success(int round, const StopSignal& stop) {
  client_->put(rk(round).finished_by(agent_id_), "1", 0, soon());
  const etcd::RangeResult done = client_->get_prefix(rk(round).finished_all(), soon(), true);
  const int n = place().group_world_size;
  // The put comes before the count: whichever node finishes last sees every node finished.
  if (static_cast<int>(done.kvs.size()) >= n) return decide(round, rdzv::jobs::Outcome{});
  return wait_end(round, stop);
}

RoundEnd EtcdRendezvous::wait_end(int round, const StopSignal& stop) {
  try {
    const etcd::RangeResult now = client_->get(rk(round).end(), soon());
    if (!now.kvs.empty()) return parse_round_end(now.kvs[0].value);
    etcd::Watch w(*client_, rk(round).end(), "", now.revision + 1);
    const auto start = Clock::now();
    auto next_report = start + options_.progress_interval;
    for (;;) {
      const auto give_up = Clock::now() + std::max<std::chrono::milliseconds>(options_.lease_ttl, std::chrono::seconds(5));
      for (const etcd::WatchEvent& ev : w.next(std::chrono::milliseconds(250), give_up)) {
        if (ev.type == etcd::WatchEvent::Type::Put) return parse_round_end(ev.kv.value);
      }
      // Stopped while the other nodes still run: decide the round (unless it just ended otherwise).
      if (stop.requested()) return report_signal(round, stop.signo());
      if (const auto t = Clock::now(); t >= next_report) {
        const int n = place().group_world_size;
        const size_t finished = client_->get_prefix(rk(round).finished_all(), soon(), true).kvs.size();
        log::info("ddprun") << "waiting for the other nodes to finish: " << finished << " of " << n << " finished, "
                            << std::chrono::duration_cast<std::chrono::seconds>(t - start).count() << " s";
        next_report = t + options_.progress_interval;
      }
    }
  } catch (const std::exception& e) {
    RoundEnd lost;
    lost.kind = RoundEnd::Kind::StoreLost;
    lost.detail = std::string("lost etcd: ") + e.what();
    return lost;
  }
}

void EtcdRendezvous::leave(int round, std::chrono::milliseconds, const StopSignal&) {
  stop_watcher();
  try {
    // The first node to leave records how the job ended: a later run of this job id sees it and
    // starts a new generation; the last one deletes the generation's keys.
    const etcd::RangeResult end = client_->get(rk(round).end(), soon());
    const std::string outcome = end.kvs.empty() ? std::string("signal:left") : end.kvs[0].value;
    client_->create_or_get(gen_prefix() + "ended", outcome, 0, soon());
    client_->put(gen_prefix() + "left/" + agent_id_, "1", 0, soon());
    int n = place().group_world_size;
    if (n == 0) n = static_cast<int>(client_->get_prefix(rk(round).members(), soon(), true).kvs.size());
    const int left = static_cast<int>(client_->get_prefix(gen_prefix() + "left/", soon(), true).kvs.size());
    if (left >= n) {
      // The next run of this job id is the next generation; this one's keys go. The counter itself
      // goes a day later (a lease of its own), as the daemon forgets job ids: a run after that
      // starts again at generation 1, in a namespace nothing is left in.
      const std::string counter = job_key("gen");
      const int64_t counter_lease = client_->lease_grant(kForgetJobAfter, soon());
      client_->txn({etcd::Compare::value_is(counter, std::to_string(generation_))},
                   {etcd::Op::put(counter, std::to_string(generation_ + 1), counter_lease)}, {}, soon());
      client_->erase(gen_prefix(), etcd::prefix_end(gen_prefix()), soon());
    }
  } catch (const std::exception& e) {
    log::warn("ddprun") << "leaving the etcd rendezvous: " << e.what();
  }
}

}  // namespace ddprun::launcher
