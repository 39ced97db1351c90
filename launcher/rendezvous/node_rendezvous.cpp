#include "launcher/rendezvous/node_rendezvous.hpp"

#include "launcher/rendezvous/rendezvous_values.hpp"

namespace ddprun::launcher {

NodeRendezvous::~NodeRendezvous() { stop_watcher(); }

RoundEnd NodeRendezvous::report_failure(int round, const WorkerExit& root_cause) {
  return decide(round, failure_outcome(root_cause, node_rank()));
}

RoundEnd NodeRendezvous::report_signal(int round, int signo) {
  return decide(round, signal_outcome(signo, node_rank(), host_));
}

std::unique_ptr<ProgressChannel> NodeRendezvous::progress_channel(int round) {
  const Place p = place();
  return open_progress_channel(round, p.group_rank, p.group_world_size);
}

void NodeRendezvous::set_place(Place p) {
  std::lock_guard lock(place_mutex_);
  place_ = std::move(p);
}

NodeRendezvous::Place NodeRendezvous::place() const {
  std::lock_guard lock(place_mutex_);
  return place_;
}

std::string NodeRendezvous::host_of(int g) const {
  std::lock_guard lock(place_mutex_);
  return g >= 0 && static_cast<size_t>(g) < place_.hosts.size() ? place_.hosts[static_cast<size_t>(g)] : "?";
}

void NodeRendezvous::start_watcher(std::function<void()> body) {
  stop_watcher();
  stop_watching_ = false;
  watcher_ = std::thread(std::move(body));
}

void NodeRendezvous::stop_watcher() {
  stop_watching_ = true;
  if (watcher_.joinable()) watcher_.join();
}

}  // namespace ddprun::launcher
