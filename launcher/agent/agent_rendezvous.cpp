// How the agent meets the other nodes (see agent.hpp): the rendezvous backend for its
// options, the fence that stops its workers before the others count it as lost, and the worker
// store it hosts for each round.
#include <netdb.h>
#include <sys/socket.h>
#include <time.h>

#include "common/defaults.hpp"
#include "common/errors.hpp"
#include "common/hex.hpp"
#include "common/log.hpp"
#include "common/system.hpp"
#include "launcher/agent/agent.hpp"
#include "launcher/ft/etcd_quorum_kv.hpp"
#include "launcher/rendezvous/etcd/etcd_rendezvous.hpp"
#include "launcher/rendezvous/local_rendezvous.hpp"
#include "launcher/rendezvous/store/store_rendezvous.hpp"
#include "rendezvous/client/client.hpp"

namespace ddprun::launcher::agent {

using cli::RdzvBackend;
using rendezvous::JoinSettings;
using rendezvous::LocalRendezvous;
using rendezvous::RendezvousBackend;
using rendezvous::etcd::EtcdRendezvous;
using rendezvous::etcd::EtcdRendezvousOptions;
using rendezvous::store::StoreRendezvous;
using rendezvous::store::StoreRendezvousOptions;

std::vector<std::string> resolve_all(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const std::string& name : names) {
    if (name.empty()) continue;
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (::getaddrinfo(name.c_str(), nullptr, &hints, &res) != 0) {
      log::warn("ddprun") << "cannot resolve node address '" << name
                          << "': its workers may be refused by the worker store";
      continue;
    }
    for (addrinfo* ai = res; ai; ai = ai->ai_next) {
      char text[NI_MAXHOST];
      if (::getnameinfo(ai->ai_addr, ai->ai_addrlen, text, sizeof text, nullptr, 0, NI_NUMERICHOST) == 0) {
        out.emplace_back(text);
      }
    }
    ::freeaddrinfo(res);
  }
  return out;
}

std::optional<rdzv::core::Token> Agent::read_token() const {
  if (options_.token_file.empty()) return std::nullopt;
  return rdzv::core::read_token_file(options_.token_file);
}

void Agent::arm_fence(std::chrono::milliseconds lost_after) {
  // The other nodes count this node as lost after `lost_after` without a heartbeat (an expired
  // lease); its workers are stopped a quarter earlier, so that they never run beside a group
  // re-formed without them. At least a second: a busy machine's scheduling hiccups are no reason.
  fence_window_ = std::max<std::chrono::milliseconds>(lost_after * 3 / 4, std::chrono::seconds(1));
  guard_.arm_fence(fence_window_);
}

void Agent::confirm_membership() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  const uint64_t now = static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(ts.tv_nsec);
  membership_until_ns_.store(now + static_cast<uint64_t>(fence_window_.count()) * 1'000'000ULL,
                             std::memory_order_release);
}

rendezvous::etcd::Options Agent::etcd_client_options() const {
  rendezvous::etcd::Options eo;
  eo.endpoints = options_.etcd.endpoints;
  eo.user = options_.etcd.user;
  if (!options_.etcd.password_file.empty())
    eo.password = rdzv::core::read_private_file(options_.etcd.password_file, "etcd password file");
  eo.ca_file = options_.etcd.ca_file;
  eo.cert_file = options_.etcd.cert_file;
  eo.key_file = options_.etcd.key_file;
  return eo;
}

std::unique_ptr<RendezvousBackend> Agent::make_backend() {
  // The address other nodes (and the workers) use for this node: --local_addr; else node 0 of a
  // static job is --master_addr, and any other node is known by its fully qualified name, as
  // torchrun's (a Kubernetes pod with a subdomain is reachable by that name only).
  const bool static_node_zero = options_.rdzv_backend == RdzvBackend::Static && options_.node_rank == 0;
  std::string fqdn = fully_qualified_host_name();
  if (fqdn.empty()) fqdn = host_;
  advertise_addr_ = !options_.local_addr.empty() ? options_.local_addr
                                                 : (!multi_node_ || static_node_zero ? options_.master_addr : fqdn);
  if (!multi_node_) return std::make_unique<LocalRendezvous>(advertise_addr_);
  // A replica group is a world of its own, beside the other groups of the job.
  JoinSettings join;
  join.run_id = options_.replica_group ? rdzv::jobs::replica_group_run_id(options_.run_id, *options_.replica_group)
                                       : options_.run_id;
  join.min_nodes = options_.min_nodes;
  join.max_nodes = options_.max_nodes;
  const bool dynamic = options_.rdzv_backend != RdzvBackend::Static;
  join.node_rank = dynamic && !options_.node_rank_given ? -1 : options_.node_rank;
  join.advertise_addr = advertise_addr_;
  join.host = host_;
  join.role = options_.role;
  join.timeouts = options_.rdzv_timeouts;
  join.progress_interval = options_.progress_interval;
  if (options_.rdzv_backend == RdzvBackend::Etcd) {
    EtcdRendezvousOptions eo;
    static_cast<JoinSettings&>(eo) = join;
    eo.etcd = etcd_client_options();
    eo.prefix = options_.etcd.prefix;
    eo.lease_ttl = options_.etcd.lease_ttl;
    return std::make_unique<EtcdRendezvous>(eo, stop_);
  }
  StoreRendezvousOptions ro;
  static_cast<JoinSettings&>(ro) = join;
  ro.dynamic = options_.rdzv_backend == RdzvBackend::C10d;
  ro.master_addr = options_.master_addr;
  ro.master_port = options_.master_port.value_or(defaults::kMasterPort);
  ro.endpoint_host = options_.rdzv_endpoint_host;
  ro.endpoint_port = options_.rdzv_endpoint_port;
  ro.is_host = options_.rdzv_is_host;
  ro.token = read_token();
  ro.token_file = options_.token_file;
  if (ro.dynamic) {
    // A c10d job re-forms without a node it counts as lost: with the survivors (MIN < MAX), with
    // a spare or a node that came back in its place (MIN == MAX, a world of one node included),
    // so the lost node's workers must stop first. (A static job ends when a node is lost: no
    // second group forms.)
    ro.alive = [this] {
      guard_.renew();
      confirm_membership();
    };
    arm_fence(options_.rdzv_timeouts.keep_alive_interval * options_.rdzv_timeouts.keep_alive_max_attempt);
  }
  return std::make_unique<StoreRendezvous>(ro, stop_);
}

rendezvous::HostedStore Agent::host_worker_store() {
  // A fresh worker store for every round: PyTorch >= 2.6 workers use no per-attempt key prefix.
  // Single node: on --master_addr:--master_port (kernel-picked by default). Several nodes: the
  // group-rank-0 node hosts it on a kernel-picked port and publishes it through the rendezvous.
  // Real PyTorch workers cannot prove a secret, so the store is bound to the address the workers
  // use (not "::") and admits only this node (loopback and that address) until the rendezvous
  // names the other nodes (Agent::rendezvous).
  worker_store_.reset();
  rdzv::server::ServerOptions so;
  so.host = advertise_addr_;
  so.port = multi_node_ ? 0 : options_.master_port.value_or(0);
  so.log_lifecycle = false;
  so.allowed_peers = resolve_all({advertise_addr_});
  try {
    worker_store_ = std::make_unique<rdzv::server::ServerThread>(so);
  } catch (const ConnectionError& e) {
    if (!multi_node_ && options_.master_port) throw;  // the user's --master_port: no other port will do
    // The workers' address is not one this host can bind (behind NAT, say): listen on every
    // address, with the allow list still in force.
    log::warn("ddprun") << "worker store: " << e.what() << "; listening on every address instead";
    so.host = "::";
    try {
      worker_store_ = std::make_unique<rdzv::server::ServerThread>(so);
    } catch (const ConnectionError&) {
      so.host = "0.0.0.0";  // no IPv6 on this host
      worker_store_ = std::make_unique<rdzv::server::ServerThread>(so);
    }
  }
  // A replica group's round key: its workers seal what they write in the store with it (any local
  // process may write there), and the group's other nodes learn it through the rendezvous.
  return {worker_store_->port(), options_.replica_group ? to_hex(rdzv::core::random_nonce()) : std::string()};
}

void Agent::make_coordinator() {
  // The quorum lives in the job's own namespace on the rendezvous store (or etcd), reached as the
  // group's rendezvous is (after the backend, which may host that store on this node), on two
  // connections of its own: one for the heartbeat, one for the requests.
  const auto client = [this](bool heartbeat) -> std::unique_ptr<ft::QuorumKv> {
    if (options_.rdzv_backend == RdzvBackend::Etcd)
      return std::make_unique<ft::EtcdQuorumKv>(etcd_client_options(), options_.rdzv_timeouts.read_timeout);
    rdzv::client::ClientOptions co;
    co.host = options_.rdzv_endpoint_host;
    co.port = options_.rdzv_endpoint_port;
    co.timeout = options_.rdzv_timeouts.read_timeout;
    co.connect_timeout = options_.rdzv_timeouts.join_timeout;
    if (const auto token = read_token())
      co.credentials = rdzv::core::credentials_for(*token, options_.run_id, options_.token_file);
    co.refusal_note_key = rdzv::core::refusal_note(options_.run_id);
    co.outage_tolerance = options_.rdzv_timeouts.store_reconnect_timeout;
    if (heartbeat) {
      // The heartbeat tries again at its next beat: it rides out no outage inside one call, and a
      // call that cannot connect within the heartbeat's timeout is of no use (nor may it hold a
      // stopping ddprun's exit for a minute).
      co.outage_tolerance = std::chrono::milliseconds(0);
      co.connect_timeout = std::min(co.connect_timeout, options_.quorum_heartbeat_timeout);
    }
    return std::make_unique<ft::StoreQuorumKv>(std::make_unique<rdzv::client::Client>(co));
  };
  ft::CoordinatorOptions co;
  co.run_id = options_.run_id;
  if (options_.rdzv_backend == RdzvBackend::Etcd) co.root = options_.etcd.prefix;
  co.group = *options_.replica_group;
  co.rules.min_groups = options_.min_replica_groups;
  co.rules.join_timeout = options_.quorum_join_timeout;
  co.heartbeat_timeout = options_.quorum_heartbeat_timeout;
  co.heartbeat_interval =
      std::max<std::chrono::milliseconds>(options_.quorum_heartbeat_timeout / 10, std::chrono::milliseconds(50));
  co.progress_interval = options_.progress_interval;
  coordinator_ = std::make_unique<ft::Coordinator>(co, client(false), client(true));
  // A worker that fails takes its group out of the quorum at once: the other groups need not wait
  // for the failure report, the worker group's shutdown or the heartbeat timeout.
  supervisor_.set_on_failure([this](const workers::WorkerExit&) { coordinator_->withdraw(); });
  // Where this node's workers serve their state to healing peers and meet the other groups.
  base_env_["DDPRUN_NODE_ADDR"] = advertise_addr_;
  // The relay answers every ask within this (with an error when no quorum could be had): a worker
  // waits that long for its quorum before it takes its agent for lost.
  base_env_["DDPRUN_FT_QUORUM_TIMEOUT"] =
      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(options_.rdzv_timeouts.join_timeout).count());
  // A worker whose agent (its worker store) gives no sign of life for this long leaves: past it
  // the other groups go on without this one, and must not wait for the worker in a collective.
  base_env_["DDPRUN_FT_AGENT_TIMEOUT"] = std::to_string(std::max<int64_t>(
      1, std::chrono::duration_cast<std::chrono::seconds>(options_.quorum_heartbeat_timeout).count()));
  log::info("ddprun") << "replica group " << co.group << " of job '" << options_.run_id << "': at least "
                      << co.rules.min_groups << " group(s) train each step";
}

void Agent::start_relay(const World& world) {
  if (!coordinator_ || !worker_store_) return;
  // A new incarnation for every round: the quorum tells a group back from a restart from the one
  // that was there before.
  coordinator_->set_incarnation(advertise_addr_ + ":" + std::to_string(::getpid()) + ":" + std::to_string(world.round));
  ft::RelayOptions ro;
  ro.store_host = advertise_addr_;
  ro.store_port = worker_store_->port();
  ro.store_address = world.master_addr + ":" + std::to_string(world.master_port);
  ro.world_size = world.world_size;
  ro.key = from_hex(world.worker_key).value_or(std::string());
  ro.addresses = world.peer_addresses;
  ro.addresses.push_back(advertise_addr_);
  ro.quorum_timeout = options_.rdzv_timeouts.join_timeout;
  std::vector<std::string> own = ro.addresses;
  ro.allow_peers = [this, own](const std::vector<std::string>& others) {
    std::vector<std::string> all = own;
    all.insert(all.end(), others.begin(), others.end());
    if (worker_store_) worker_store_->allow_peers(resolve_all(all));
  };
  relay_ = std::make_unique<ft::Relay>(*coordinator_, ro);
}

void Agent::stop_relay() {
  if (!coordinator_) return;
  relay_.reset();
  coordinator_->withdraw();
}

}  // namespace ddprun::launcher::agent
