#include "launcher/ft/relay.hpp"

#include <csignal>

#include "common/errors.hpp"
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
  std::vector<std::string> keys;
  for (int r = 0; r < options_.world_size; ++r) keys.push_back(worker_ask_key(n, r));
  while (!stop_.requested()) {
    if (store.wait_for(keys, std::chrono::milliseconds(200))) {
      asks = store.multi_get_now(keys);
      return true;
    }
  }
  return false;
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
      bool first = true;
      std::string answer;
      try {
        for (int r = 0; r < options_.world_size; ++r) {
          const json a = json::parse(asks[static_cast<size_t>(r)]);
          const int64_t step = a.at("step").get<int64_t>();
          // The ranks of a group commit together: they agree, or the group counts as the least.
          if (!first && step != self.step)
            log::warn("ddprun") << "replica group ranks disagree on the step (" << self.step << " and " << step
                                << "): asking as the lower";
          self.step = first ? step : std::min(self.step, step);
          first = false;
          self.recovery.push_back(a.value("recovery", std::string()));
          self.shrink_only = self.shrink_only || a.value("shrink_only", false);
          self.pg_ok = self.pg_ok && a.value("pg_ok", true);
        }
        const Quorum q = coordinator_.next(self, stop_, options_.quorum_timeout);
        const GroupView view = view_of(q, coordinator_.group());
        if (options_.allow_peers) options_.allow_peers(view.addresses);
        answer = json(view).dump();
        last_step_ = self.step;
        last_n_ = n;
      } catch (const StopRequested&) {
        return;
      } catch (const JobFinished& e) {
        log::warn("ddprun") << "replica group " << coordinator_.group() << ": " << e.what()
                            << "; its workers are told so (a new job needs a new --rdzv_id)";
        answer = json{{"finished", e.record()}}.dump();
      } catch (const json::exception& e) {
        answer = json{{"error", std::string("a rank's request cannot be read: ") + e.what()}}.dump();
      } catch (const Error& e) {
        log::warn("ddprun") << "replica group " << coordinator_.group() << ": no quorum for its workers: " << e.what();
        answer = json{{"error", e.what()}}.dump();
      }
      store.set(worker_quorum_key(n), answer);
      if (n > 2) {
        for (int r = 0; r < options_.world_size; ++r) store.delete_key(worker_ask_key(n - 2, r));
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
  for (const std::string& vote : store.multi_get_now(keys)) committed = committed && vote == "1";
  const Finished record = coordinator_.finish(last_step_ + (committed ? 1 : 0));
  log::info("ddprun") << "replica group " << coordinator_.group() << ": " << record.describe()
                      << (record.group == coordinator_.group() ? ": recorded for groups that come back later" : "");
}

}  // namespace ddprun::launcher::ft
