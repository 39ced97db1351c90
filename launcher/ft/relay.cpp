#include "launcher/ft/relay.hpp"

#include <csignal>
#include <optional>

#include "common/errors.hpp"
#include "common/ft_wire.hpp"
#include "common/log.hpp"
#include "rendezvous/client/client.hpp"

namespace ddprun::launcher::ft {

using nlohmann::json;

std::string worker_ask_key(int64_t n, int rank) {
  return "/ddprun_ft/ask/" + std::to_string(n) + "/" + std::to_string(rank);
}

std::string worker_quorum_key(int64_t n) { return "/ddprun_ft/quorum/" + std::to_string(n); }

std::string worker_commit_key(int64_t n, int rank) {
  return "/ddprun_ft/commit/" + std::to_string(n) + "/" + std::to_string(rank);
}

namespace {

// An answer's text; bytes that are not UTF-8 (a message quoting a peer) as U+FFFD, never an error.
std::string dumped(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// A key as the workers name it, and seal it: without PyTorch's leading "/".
std::string_view name_of(const std::string& key) { return std::string_view(key).substr(1); }

rdzv::client::ClientOptions store_client(const RelayOptions& o) {
  rdzv::client::ClientOptions co;
  co.host = o.store_host;
  co.port = o.store_port;
  co.connect_timeout = std::chrono::seconds(10);
  return co;
}

}  // namespace

Relay::Relay(Coordinator& coordinator, RelayOptions options)
    : coordinator_(coordinator), options_(std::move(options)), thread_([this] { run(); }) {}

Relay::~Relay() {
  stop_.request(SIGTERM);
  if (thread_.joinable()) thread_.join();
}

bool Relay::gather(rdzv::client::Client& store, int64_t n, std::vector<std::string>& asks) {
  std::vector<std::optional<std::string>> got(static_cast<size_t>(options_.world_size));
  std::vector<bool> said(got.size(), false);
  while (!stop_.requested()) {
    std::vector<std::string> keys;
    std::vector<size_t> ranks;
    for (size_t r = 0; r < got.size(); ++r) {
      if (got[r]) continue;
      keys.push_back(worker_ask_key(n, static_cast<int>(r)));
      ranks.push_back(r);
    }
    if (keys.empty()) {
      asks.clear();
      for (auto& a : got) asks.push_back(std::move(*a));
      return true;
    }
    if (!store.wait_for(keys, std::chrono::milliseconds(200))) continue;
    const std::vector<std::string> values = store.multi_get_now(keys);
    bool forged = false;
    for (size_t i = 0; i < keys.size(); ++i) {
      got[ranks[i]] = ft_wire::unseal(options_.key, name_of(keys[i]), values[i]);
      if (got[ranks[i]]) continue;
      forged = true;
      if (said[ranks[i]]) continue;
      // Written before the worker's own ask (or over it): waited past, never relayed. The rank's
      // own ask replaces it, or its worker times out waiting for an answer.
      said[ranks[i]] = true;
      log::warn("ddprun") << "replica group " << coordinator_.group() << ": rank " << ranks[i]
                          << "'s request for quorum " << n
                          << " in the worker store is not its worker's (it does not carry the round's MAC: "
                          << "another process writes into the worker store): ignored";
    }
    // The store cannot wait for a key to change: look again shortly.
    if (forged && stop_.sleep_for(std::chrono::milliseconds(50))) return false;
  }
  return false;
}

std::string Relay::answer_of(GroupView view, int64_t n) const {
  // A healing rank's peer key reaches it masked with this group's key: the worker store is
  // readable by whoever reaches it, and the key opens the peer's state.
  const std::string name(name_of(worker_quorum_key(n)));
  for (size_t i = 0; i < view.recover_addresses.size(); ++i) {
    std::string& address = view.recover_addresses[i];
    const auto hash = address.find('#');
    if (hash == std::string::npos) continue;
    const auto key = from_hex(std::string_view(address).substr(hash + 1));
    const bool usable = key && key->size() == ft_wire::kKeyBytes;
    address = address.substr(0, hash + 1) + (usable ? to_hex(ft_wire::mask(options_.key, name, i, *key)) : "");
  }
  return dumped(json(view));
}

void Relay::run() {
  try {
    rdzv::client::Client store(store_client(options_));
    for (int64_t n = 1; !stop_.requested(); ++n) {
      std::vector<std::string> asks;
      if (!gather(store, n, asks)) return;
      Member self;
      self.world_size = options_.world_size;
      self.store = options_.store_address;
      self.addresses = options_.addresses;
      std::string answer;
      // The ranks' asks, each whatever its worker wrote: one that cannot be used is answered with
      // an error for this group's workers alone; nothing of it reaches the quorum.
      std::string unusable;
      for (int r = 0; r < options_.world_size && unusable.empty(); ++r) {
        try {
          const json a = json::parse(asks[static_cast<size_t>(r)]);
          if (!a.is_object()) throw ProtocolError("it is not a JSON object");
          const int64_t step = step_of(a);
          // The ranks of a group commit together: they agree, or the group counts as the least.
          if (r > 0 && step != self.step)
            log::warn("ddprun") << "replica group ranks disagree on the step (" << self.step << " and " << step
                                << "): asking as the lower";
          self.step = r == 0 ? step : std::min(self.step, step);
          // Where the rank serves its state, and the key it serves it with (derived from the round's
          // key, never in the store): the quorum carries both to the group that heals from it.
          const std::string recovery = a.value("recovery", std::string());
          self.recovery.push_back(recovery.empty() ? recovery
                                                   : recovery.substr(0, recovery.find('#')) + "#" +
                                                         to_hex(ft_wire::state_key(options_.key, r)));
          self.shrink_only = self.shrink_only || a.value("shrink_only", false);
          self.pg_ok = self.pg_ok && a.value("pg_ok", true);
        } catch (const json::exception& e) {
          unusable = "rank " + std::to_string(r) + "'s request for quorum " + std::to_string(n) +
                     " cannot be read: " + e.what();
        } catch (const ProtocolError& e) {
          unusable = "rank " + std::to_string(r) + "'s request for quorum " + std::to_string(n) +
                     " cannot be used: " + e.what();
        }
      }
      if (!unusable.empty()) {
        log::warn("ddprun") << "replica group " << coordinator_.group() << ": " << unusable;
        answer = dumped(json{{"error", unusable}});
      } else {
        try {
          const Quorum q = coordinator_.next(self, stop_, options_.quorum_timeout);
          const GroupView view = view_of(q, coordinator_.group());
          if (options_.allow_peers) options_.allow_peers(view.addresses);
          answer = answer_of(view, n);
          last_step_ = self.step;
          last_n_ = n;
        } catch (const StopRequested&) {
          return;
        } catch (const JobFinished& e) {
          log::warn("ddprun") << "replica group " << coordinator_.group() << ": " << e.what()
                              << "; its workers are told so (a new job needs a new --rdzv_id)";
          answer = dumped(json{{"finished", e.record()}});
        } catch (const Error& e) {
          log::warn("ddprun") << "replica group " << coordinator_.group()
                              << ": no quorum for its workers: " << e.what();
          answer = dumped(json{{"error", e.what()}});
        }
      }
      store.set(worker_quorum_key(n), ft_wire::seal(options_.key, name_of(worker_quorum_key(n)), answer));
      if (n > 2) {
        for (int r = 0; r < options_.world_size; ++r) {
          store.delete_key(worker_ask_key(n - 2, r));
          store.delete_key(worker_commit_key(n - 2, r));
        }
        store.delete_key(worker_quorum_key(n - 2));
      }
    }
  } catch (const Error& e) {
    // The worker store is gone with its round: the workers are gone too.
    if (!stop_.requested()) log::warn("ddprun") << "replica group relay stopped: " << e.what();
  }
}

void Relay::finish_job() {
  const int64_t n = last_n_;
  if (n == 0 || coordinator_.over()) return;
  rdzv::client::Client store(store_client(options_));
  std::vector<std::string> keys;
  for (int r = 0; r < options_.world_size; ++r) keys.push_back(worker_commit_key(n, r));
  bool committed = true;
  const std::vector<std::string> votes = store.multi_get_now(keys);
  // A vote its rank did not seal counts as no commit: the record then says the lower step.
  for (size_t r = 0; r < keys.size(); ++r)
    committed =
        committed && ft_wire::unseal(options_.key, name_of(keys[r]), votes[r]) == std::optional<std::string>("1");
  const Finished record = coordinator_.finish(last_step_ + (committed ? 1 : 0));
  log::info("ddprun") << "replica group " << coordinator_.group() << ": " << record.describe()
                      << (record.group == coordinator_.group() ? ": recorded for groups that come back later" : "");
}

}  // namespace ddprun::launcher::ft
