#include "launcher/rendezvous/local_rendezvous.hpp"

#include <csignal>

#include "common/errors.hpp"
#include "common/system.hpp"
#include "launcher/rendezvous/round_records.hpp"

namespace ddprun::launcher::rendezvous {

using ddprun::StopSignal;
using workers::WorkerExit;

std::variant<World, RoundEnd> LocalRendezvous::join(int round, int nproc, const WorkerStoreHost& host_worker_store,
                                                    const StopSignal& stop) {
  if (stop.requested()) throw StopRequested(stop.signo());
  World w;
  w.round = round;
  w.world_size = nproc;
  w.role_world_size = nproc;
  w.master_addr = master_addr_;
  const HostedStore hosted = host_worker_store();
  w.master_port = hosted.port;
  w.worker_key = hosted.key;
  return w;
}

RoundEnd LocalRendezvous::report_failure(int, const WorkerExit& root_cause, const ProgressMark& progress) {
  RoundEnd e;
  e.kind = RoundEnd::Kind::Failure;
  e.root_cause = root_cause;
  e.progress = progress;
  e.detail = failure_sentence(root_cause, -1);
  return e;
}

RoundEnd LocalRendezvous::report_signal(int, int signo) {
  RoundEnd e;
  e.kind = RoundEnd::Kind::Signal;
  e.detail = signal_name(signo);
  return e;
}

RoundEnd LocalRendezvous::wait_end(int round, const StopSignal& stop) {
  // Only another node could end a round here; with none, it ended because ddprun was stopped.
  return report_signal(round, stop.signo() ? stop.signo() : SIGTERM);
}

}  // namespace ddprun::launcher::rendezvous
