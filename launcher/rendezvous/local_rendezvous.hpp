#pragma once
// The rendezvous of a single-node job: nothing to agree with. Each round's worker store is this
// node's, and a round ends as this node's workers say. Lets the agent run one code path for one
// node and for many.

#include <string>

#include "launcher/rendezvous/rendezvous_backend.hpp"

namespace ddprun::launcher::rendezvous {

using ddprun::StopSignal;
using workers::WorkerExit;

class LocalRendezvous final : public RendezvousBackend {
 public:
  // `master_addr`: what the workers get as MASTER_ADDR.
  explicit LocalRendezvous(std::string master_addr) : master_addr_(std::move(master_addr)) {}

  int first_round(const StopSignal&) override { return 0; }
  std::variant<World, RoundEnd> join(int round, int nproc, const WorkerStoreHost& host_worker_store,
                                     const StopSignal& stop) override;
  void watch(int, std::function<void(const RoundEnd&)>) override {}
  void unwatch() override {}
  RoundEnd report_failure(int round, const WorkerExit& root_cause, const ProgressMark& progress) override;
  RoundEnd report_signal(int round, int signo) override;
  RoundEnd report_success(int, const StopSignal&) override { return RoundEnd{}; }
  RoundEnd wait_end(int round, const StopSignal& stop) override;
  void leave(int, std::chrono::milliseconds, const StopSignal&) override {}
  bool elastic() const override { return false; }
  int node_rank() const override { return -1; }
  std::unique_ptr<ProgressChannel> progress_channel(int) override { return nullptr; }

 private:
  std::string master_addr_;
};

}  // namespace ddprun::launcher::rendezvous
