#pragma once
// A replica-group rank's watch on its ddprun (fault_tolerance.hpp): once a second it asks the
// worker store its agent hosts for a sign of life, on a connection of its own. PyTorch's store
// client waits for an answer without a bound, so a rank whose ddprun is stopped (SIGSTOP, a frozen
// host) would wait for its quorum for good while the other groups wait for it in a collective.
// When the store gives no answer for `patience` (the quorum's heartbeat timeout, after which the
// other groups go on without this one), the process ends: exit status 1, so that the collective
// it was due in fails at once for the others; its ddprun, back, restarts it and it heals. The
// store's PING: VALIDATE's magic, then PING (13) and a nonce, answered by its echo (the 2.x
// numbering of TCPStore's protocol). One thread, from construction to destruction. No Torch.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace ddprun::worker::ft::detail {

class AgentWatch {
 public:
  AgentWatch(std::string host, uint16_t port, std::chrono::milliseconds patience);
  ~AgentWatch();
  AgentWatch(const AgentWatch&) = delete;
  AgentWatch& operator=(const AgentWatch&) = delete;

 private:
  void run();

  std::string host_;
  uint16_t port_;
  std::chrono::milliseconds patience_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ddprun::worker::ft::detail
