#include "launcher/rendezvous/etcd/etcd_rendezvous.hpp"

#include <unistd.h>

#include <algorithm>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/numbers.hpp"
#include "launcher/rendezvous/round_records.hpp"

namespace ddprun::launcher::rendezvous::etcd {

using ddprun::StopSignal;
using rendezvous::NodeRendezvous;

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// How long one member may take to answer a status request (it answers from memory, at once).
constexpr std::chrono::milliseconds kCensusPerMember{500};

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
    : NodeRendezvous(static_cast<const JoinSettings&>(options)), options_(std::move(options)) {
  client_ = std::make_unique<etcd::Client>(options_.etcd);
  agent_id_ = new_agent_id(options_.host);
  // The lease doubles as the connection check: retried, in slices, until the join timeout.
  const auto deadline = Clock::now() + options_.timeouts.join_timeout;
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
                            seconds_text(options_.timeouts.join_timeout) + "): " + last +
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

etcd::Client::Deadline EtcdRendezvous::request_deadline() const {
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
  // The last moment from which the lease surely had a whole TTL left: its last renewal, or the
  // last time etcd was seen without a quorum (a leader elected after it gave the lease a fresh TTL).
  auto held_from = last_renewal;
  bool failing = false;
  bool waiting_for_quorum = false;  // said once per outage
  std::unique_lock lock(keepalive_mutex_);
  while (!keepalive_wake_.wait_for(lock, failing ? retry : period, [this] { return stop_keepalive_.load(); })) {
    lock.unlock();
    // A leader new in its term renews a lease only once it has applied what it committed (a few
    // seconds after etcd's restart): after a failure, each try waits for half a TTL.
    const auto this_try = failing ? std::max<std::chrono::milliseconds>(attempt, options_.lease_ttl / 2) : attempt;
    failing = true;
    try {
      const int64_t ttl = client_->lease_keepalive(lease_, etcd::Client::after(this_try));
      if (ttl <= 0) {
        log::error("ddprun") << "etcd says this node's lease has expired: the other nodes count it as lost";
        lease_lost_ = true;
      } else {
        if (waiting_for_quorum)
          log::info("ddprun") << "etcd answers again after "
                              << std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - last_renewal).count()
                              << " s: this node's lease holds (" << ttl << " s left)";
        last_renewal = held_from = Clock::now();
        failing = false;
        waiting_for_quorum = false;
      }
    } catch (const std::exception& e) {
      // A renewal failed. If etcd has no quorum (its members say they have no leader, or are not
      // running), no lease can expire: leases expire on the leader, and a new leader gives every
      // lease a fresh TTL as it takes over. So each failure asks the members, and while etcd is
      // without a quorum the node keeps its place and asks again until etcd answers; the renewal
      // then says whether the lease still lives. Otherwise (etcd out of reach, or led and still
      // not renewing a TTL after it was last seen without a leader) the lease may have expired,
      // and this node cannot tell whether it is still counted in: it leaves.
      const auto asked = Clock::now();
      const etcd::QuorumCensus census = client_->census(kCensusPerMember);
      if (census.no_quorum()) {
        if (!waiting_for_quorum)
          log::warn("ddprun") << "etcd has no quorum (" << census.text() << "): no lease expires without one, so "
                              << "this node keeps its place and waits for etcd (the renewal: " << e.what() << ")";
        waiting_for_quorum = true;
        held_from = asked;  // a leader elected from now on gives the lease a whole TTL
      } else if (Clock::now() - held_from > options_.lease_ttl) {
        log::error("ddprun") << "no etcd member renewed this node's lease for "
                             << std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - held_from).count()
                             << " s (" << e.what() << "; " << census.text()
                             << "): this node cannot tell whether its lease still holds";
        lease_lost_ = true;
      }
    }
    lock.lock();
    if (lease_lost_) return;
  }
}

int64_t EtcdRendezvous::choose_generation(const StopSignal& stop) {
  const std::string counter = rdzv::jobs::JobKeys::generation_counter(options_.run_id, options_.prefix);
  auto number = [&](const std::string& v) {
    const auto g = to_int(v);
    if (!g || *g < 1)
      throw ProtocolError("the etcd key " + counter + " holds '" + v.substr(0, 40) + "', not a generation");
    return *g;
  };
  int64_t g = number(client_->create_or_get(counter, "1", 0, request_deadline()));
  for (;;) {
    if (stop.requested()) throw StopRequested(stop.signo());
    const rdzv::jobs::JobKeys run = keys(g);
    const std::string& prefix = run.prefix();
    const etcd::RangeResult r = client_->get_prefix(prefix, request_deadline(), /*keys_only=*/true);
    bool ended = false, live = false;
    for (const auto& kv : r.kvs) {
      ended = ended || kv.key == run.ended();
      live = live || kv.lease != 0;  // a key attached to a lease lives only while its agent does
    }
    if (!ended && (r.kvs.empty() || live)) return g;
    // That run is over (or all its agents are gone): this is a new run of the job id.
    const etcd::TxnResult t =
        client_->txn({etcd::Compare::value_is(counter, std::to_string(g))},
                     {etcd::Op::put(counter, std::to_string(g + 1))}, {etcd::Op::get(counter)}, request_deadline());
    log::info("ddprun") << "job '" << options_.run_id << "': generation " << g
                        << (ended ? " has ended" : " was left by agents that are gone") << "; moving on";
    if (t.succeeded) {
      client_->erase(prefix, etcd::prefix_end(prefix), request_deadline());  // its leftovers
      g += 1;
    } else if (!t.ranges.empty() && !t.ranges[0].kvs.empty()) {
      g = number(t.ranges[0].kvs[0].value);  // another agent moved it on first
    }
  }
}

int EtcdRendezvous::first_round(const StopSignal&) {
  const etcd::RangeResult r = client_->get(keys().current_round(), request_deadline());
  if (r.kvs.empty()) return 0;
  const auto round = to_int(r.kvs[0].value);
  return round && *round >= 0 ? static_cast<int>(*round) : 0;
}

std::optional<std::string> EtcdRendezvous::read(const std::string& key) {
  const etcd::RangeResult r = client_->get(key, request_deadline());
  if (r.kvs.empty()) return std::nullopt;
  return r.kvs[0].value;
}

std::string EtcdRendezvous::create_or_get(const std::string& key, const std::string& value) {
  return client_->create_or_get(key, value, 0, request_deadline());
}

int64_t EtcdRendezvous::tally(int round, Tally what, bool count_me) {
  // A key per node under the set's prefix; the put comes before the count.
  const std::string set = what == Tally::Finished ? round_keys(round).finished_all() : keys().left_all();
  if (count_me) client_->put(set + agent_id_, "1", 0, request_deadline());
  return static_cast<int64_t>(client_->get_prefix(set, request_deadline(), /*keys_only=*/true).kvs.size());
}

int64_t EtcdRendezvous::joined_nodes(int round) {
  return static_cast<int64_t>(
      client_->get_prefix(round_keys(round).members(), request_deadline(), /*keys_only=*/true).kvs.size());
}

void EtcdRendezvous::forget_generation() {
  // The next run of this job id is the next generation; this one's keys go. The counter itself
  // goes a day later (a lease of its own), as the daemon forgets job ids: a run after that starts
  // again at generation 1, in a namespace nothing is left in.
  const std::string counter = rdzv::jobs::JobKeys::generation_counter(options_.run_id, options_.prefix);
  const int64_t counter_lease = client_->lease_grant(kForgetJobAfter, request_deadline());
  client_->txn({etcd::Compare::value_is(counter, std::to_string(generation_))},
               {etcd::Op::put(counter, std::to_string(generation_ + 1), counter_lease)}, {}, request_deadline());
  client_->erase(gen_prefix(), etcd::prefix_end(gen_prefix()), request_deadline());
}

void EtcdRendezvous::check_lease() const {
  if (lease_lost_) {
    throw ConnectionError("this node's etcd lease could not be renewed for " +
                          std::to_string(options_.lease_ttl.count()) +
                          " s: it may have expired, and the other nodes then count this node as lost");
  }
}

std::chrono::milliseconds watch_patience(std::chrono::seconds lease_ttl) {
  return std::max<std::chrono::milliseconds>(lease_ttl, std::chrono::seconds(5));
}

namespace {

class EtcdKeyWait final : public NodeRendezvous::KeyWait {
 public:
  EtcdKeyWait(etcd::Client& client, std::string key, etcd::Client::Deadline first, std::chrono::seconds lease_ttl)
      : client_(client), key_(std::move(key)), lease_ttl_(lease_ttl) {
    const etcd::RangeResult now = client_.get(key_, first);
    if (!now.kvs.empty()) {
      value_ = now.kvs[0].value;
    } else {
      watch_ = std::make_unique<etcd::Watch>(client_, key_, "", now.revision + 1);
    }
  }

  std::optional<std::string> next(std::chrono::milliseconds slice) override {
    if (value_) return value_;
    for (const etcd::WatchEvent& ev : watch_->next(slice, Clock::now() + watch_patience(lease_ttl_))) {
      if (ev.type == etcd::WatchEvent::Type::Put) value_ = ev.kv.value;
    }
    return value_;
  }

 private:
  etcd::Client& client_;
  std::string key_;
  std::chrono::seconds lease_ttl_;
  std::optional<std::string> value_;
  std::unique_ptr<etcd::Watch> watch_;
};

}  // namespace

std::unique_ptr<NodeRendezvous::KeyWait> EtcdRendezvous::wait_for_key(const std::string& key) {
  return std::make_unique<EtcdKeyWait>(*client_, key, request_deadline(), options_.lease_ttl);
}

class EtcdRendezvous::Watch final : public NodeRendezvous::RoundWatch {
 public:
  Watch(EtcdRendezvous& r, int round) : r_(r), rk_(r.round_keys(round)) {}

  Event next() override {
    Event ev;
    if (!watch_) {
      // Started on the watcher's thread: the round's keys as of one revision, then a watch from
      // the next one (a watch whose member goes away resumes on another from where it was).
      const etcd::RangeResult now = r_.client_->get_prefix(rk_.prefix(), r_.request_deadline(), true);
      std::vector<std::string> present;
      for (const etcd::KeyValue& kv : now.kvs) {
        if (kv.key == rk_.end()) {
          ev.end = r_.client_->get(kv.key, r_.request_deadline()).kvs.at(0).value;
          return ev;
        }
        present.push_back(kv.key);
      }
      // A member whose key is gone already (its lease ended between the join and this read) is
      // lost: no watch from now on would ever see it go.
      const Place p = r_.place();
      for (size_t i = 0; i < p.agents.size(); ++i) {
        const std::string key = rk_.members() + p.agents[i];
        if (p.agents[i] != r_.agent_id_ && std::find(present.begin(), present.end(), key) == present.end()) {
          ev.lost_node = static_cast<int>(i);
          ev.lost_why = lease_lost_why();
          return ev;
        }
      }
      watch_ = std::make_unique<etcd::Watch>(*r_.client_, rk_.prefix(), etcd::prefix_end(rk_.prefix()),
                                             now.revision + 1, std::move(present));
    }
    r_.check_lease();
    const std::string member_prefix = rk_.members();
    for (const etcd::WatchEvent& e :
         watch_->next(std::chrono::milliseconds(500), Clock::now() + watch_patience(r_.options_.lease_ttl))) {
      if (e.kv.key == rk_.end() && e.type == etcd::WatchEvent::Type::Put) {
        ev.end = e.kv.value;
        return ev;
      }
      if (e.type != etcd::WatchEvent::Type::Delete || e.kv.key.rfind(member_prefix, 0) != 0) continue;
      // A member's lease expired: that node is gone.
      const std::string agent = e.kv.key.substr(member_prefix.size());
      const Place p = r_.place();
      for (size_t i = 0; i < p.agents.size(); ++i) {
        if (p.agents[i] == agent && agent != r_.agent_id_) {
          ev.lost_node = static_cast<int>(i);
          ev.lost_why = lease_lost_why();
          return ev;
        }
      }
    }
    return ev;
  }

  std::string create_or_get(const std::string& key, const std::string& value) override {
    return r_.create_or_get(key, value);  // the client serves several threads
  }

 private:
  std::string lease_lost_why() const {
    return "lost its etcd lease (" + std::to_string(r_.options_.lease_ttl.count()) + " s without a renewal)";
  }

  EtcdRendezvous& r_;
  rdzv::jobs::RoundKeys rk_;
  std::unique_ptr<etcd::Watch> watch_;
};

std::unique_ptr<NodeRendezvous::RoundWatch> EtcdRendezvous::watch_round(int round) {
  return std::make_unique<Watch>(*this, round);
}

}  // namespace ddprun::launcher::rendezvous::etcd
