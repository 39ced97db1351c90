#pragma once
// A replica group's link between its workers and the job's quorum. Workers cannot prove the
// rendezvous secret (PyTorch's store client has no such step), so they never talk to the quorum's
// store: they ask through their own group's worker store, which both LibTorch and Python speak,
// and the agent that hosts it relays. Any local process may write that store, so every value of
// the contract is sealed with the round's key (common/ft_wire.hpp), which the workers get in their
// environment and nobody finds in the store; the relay takes only asks its workers sealed, and
// they only answers it sealed. The worker side of the contract (docs/fault-tolerance.md), each
// value sealed under its key's name:
//
//   /ddprun_ft/ask/<n>/<rank>   rank <rank>'s request for its n-th quorum (from 1), JSON:
//                               {"step": committed steps, "recovery": "host:port" where this rank
//                               serves its state to a healing peer or "", "shrink_only": false}
//   /ddprun_ft/quorum/<n>       the answer, once every rank of the group asked (a GroupView as
//                               JSON, see quorum.hpp, its peers' state keys masked for this
//                               group), {"finished": {"step", "group", "at"}} when the job is over
//                               (another group finished it and none is left to train with), or
//                               {"error": "..."} when none could be had
//   /ddprun_ft/commit/<n>/<rank> rank <rank>'s vote on the step of its n-th quorum ("1" or "0"):
//                               read here only to learn the step the group ended on
//
// (PyTorch's client adds the leading "/": a worker sets "ddprun_ft/ask/<n>/<rank>".) The relay
// erases the keys of quorum n-2 once it answers quorum n: every rank has read them by then.
//
// Thread: one of its own, from construction to destruction; the destructor stops and joins it.

#include <atomic>
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
std::string worker_commit_key(int64_t n, int rank);

struct RelayOptions {
  std::string store_host;  // the group's worker store, as this agent reaches it
  uint16_t store_port = 0;
  std::string store_address;           // the same as the other groups reach it: "host:port"
  int world_size = 1;                  // ranks in the group
  std::string key;                     // the round's key (32 bytes), the workers' DDPRUN_FT_KEY
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

  // The group's workers all finished: records the job's end at the step they committed (the step
  // of their last quorum, plus one when they all voted to commit it), unless they never asked for a
  // quorum or were told that the job was over. Throws Error when the store cannot be reached.
  void finish_job();

 private:
  void run();
  // Waits for every rank's n-th ask, as its worker sealed it (a value someone else wrote there is
  // said once and waited past); the asks' bodies. False when stopped.
  bool gather(rdzv::client::Client& store, int64_t n, std::vector<std::string>& asks);
  // The answer to quorum n as this group's workers read it: the peers' state keys masked.
  std::string answer_of(GroupView view, int64_t n) const;

  Coordinator& coordinator_;
  RelayOptions options_;
  // The last quorum answered (its n and the step the group asked it at); read by finish_job()
  // once the workers are gone.
  std::atomic<int64_t> last_n_{0};
  std::atomic<int64_t> last_step_{0};
  StopSignal stop_;
  std::thread thread_;
};

}  // namespace ddprun::launcher::ft
