#pragma once
// A replica group's link between its workers and the job's quorum. Workers cannot prove the
// rendezvous secret (PyTorch's store client has no such step), so they never talk to the quorum's
// store: they ask through their own group's worker store, which both LibTorch and Python speak,
// and the agent that hosts it relays. The worker side of the contract (docs/fault-tolerance.md):
//
//   /ddprun_ft/ask/<n>/<rank>   rank <rank>'s request for its n-th quorum (from 1), JSON:
//                               {"step": committed steps, "recovery": "host:port" where this rank
//                               serves its state to a healing peer or "", "shrink_only": false}
//   /ddprun_ft/quorum/<n>       the answer, once every rank of the group asked (a GroupView as
//                               JSON, see quorum.hpp), or {"error": "..."} when none could be had
//
// (PyTorch's client adds the leading "/": a worker sets "ddprun_ft/ask/<n>/<rank>".)
//
// Thread: one of its own, from construction to destruction; the destructor stops and joins it.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/stop_signal.hpp"
#include "launcher/ft/coordinator.hpp"

namespace ddprun::launcher::ft {

// The worker store's keys of the contract above, as they are on the wire.
std::string worker_ask_key(int64_t n, int rank);
std::string worker_quorum_key(int64_t n);

struct RelayOptions {
  std::string store_host;  // the group's worker store, as this agent reaches it
  uint16_t store_port = 0;
  std::string store_address;           // the same as the other groups reach it: "host:port"
  int world_size = 1;                  // ranks in the group
  std::vector<std::string> addresses;  // the group's node addresses
  std::chrono::milliseconds quorum_timeout{std::chrono::minutes(10)};
  // Admits the other members' nodes to the worker store (it may lead the cross-group group).
  std::function<void(const std::vector<std::string>& addresses)> allow_peers;
};

class Relay {
 public:
  Relay(Coordinator& coordinator, RelayOptions options);
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

 private:
  void run();
  // Waits for every rank's n-th ask; false when stopped.
  bool gather(rdzv::client::Client& store, int64_t n, std::vector<std::string>& asks);

  Coordinator& coordinator_;
  RelayOptions options_;
  StopSignal stop_;
  std::thread thread_;
};

}  // namespace ddprun::launcher::ft
