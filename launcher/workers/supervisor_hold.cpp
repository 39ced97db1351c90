// The Supervisor's failure hold (see supervisor.hpp): a worker's failure is held until its cause
// is settled (its own, a stop signal of ddprun's, a peer's failure) or the round's end is decided
// elsewhere; then the others are stopped.
#include <boost/asio/post.hpp>
#include <algorithm>

#include "common/log.hpp"
#include "common/system.hpp"
#include "launcher/workers/signals.hpp"
#include "launcher/workers/supervisor.hpp"
#include "launcher/workers/supervisor_worker.hpp"

namespace ddprun::launcher::workers {

namespace asio = boost::asio;

void Supervisor::request_stop(const std::string& reason) {
  asio::post(io_, [this, reason] {
    if (state_ != State::Running) return;  // a request for a group that has already ended
    // The round's end was decided elsewhere (another node's failure or signal, a lost node, a
    // hang), and it names the cause: a failure held here waits for nothing more. A rank that died
    // of a stop signal was stopped with the job; any other is this node's part of that end.
    if (!held_.empty()) {
      hold_timer_.cancel();
      for (WorkerExit& e : held_) {
        if (e.signal != 0 && is_stop_signal(e.signal)) {
          result_.stopped_ranks.push_back(e.rank);
        } else {
          result_.failures.push_back(std::move(e));
        }
      }
      held_.clear();
    }
    log::warn("ddprun") << "stopping the workers: " << reason;
    result_.stop_reason = reason;
    begin_stop(SIGTERM, GroupOutcome::StoppedByRequest);
  });
}

void Supervisor::hold_failure(WorkerExit e) {
  if (held_.empty()) {
    DDPRUN_LOG_DEBUG("ddprun") << "rank " << e.rank << " ended with " << describe_exit(e) << ": waiting "
                               << seconds_text(settings_.stop_signal_hold)
                               << " for a stop signal of ddprun's own, or the rank whose end it may be, "
                                  "before calling it the failure";
    hold_timer_.expires_after(settings_.stop_signal_hold);
    hold_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      settle_held(/*stopped=*/false);
      maybe_finish();
    });
  }
  held_.push_back(std::move(e));
  settle_if_known();
}

WorkerExit Supervisor::with_tail(const WorkerExit& e) const {
  WorkerExit out = e;
  for (const auto& w : workers_) {
    if (w->launch.rank == e.rank) out.stderr_tail.assign(w->err->tail().begin(), w->err->tail().end());
  }
  return out;
}

void Supervisor::settle_if_known() {
  const auto known = [this](const WorkerExit& e) {
    const auto w = std::find_if(workers_.begin(), workers_.end(), [&](auto& x) { return x->launch.rank == e.rank; });
    // What it wrote is all read; it did not die of a stop signal (the job being stopped, perhaps);
    // it did not lose a peer (whose own failure may come).
    return w != workers_.end() && !(*w)->err_open && !(e.signal != 0 && is_stop_signal(e.signal)) &&
           !lost_a_peer(with_tail(e));
  };
  if (state_ == State::Running && std::any_of(held_.begin(), held_.end(), known)) settle_held(/*stopped=*/false);
}

void Supervisor::settle_held(bool stopped) {
  if (held_.empty()) return;
  hold_timer_.cancel();
  std::vector<WorkerExit> held = std::move(held_);
  held_.clear();
  if (stopped) {
    // Ended by the signal that stops the job: stopped, like the ranks ddprun signals now.
    for (const WorkerExit& e : held) result_.stopped_ranks.push_back(e.rank);
  } else {
    // A rank whose collective broke because a peer went away ended first, often, while the peer
    // was still finishing its own exit (a Python interpreter tearing down, an error being
    // written): the peer's failure is the cause and comes first, the lost peers after it.
    std::stable_partition(held.begin(), held.end(), [this](const WorkerExit& e) { return !lost_a_peer(with_tail(e)); });
    const int rank = held.front().rank;
    for (WorkerExit& e : held) result_.failures.push_back(std::move(e));
    if (state_ == State::Running) {
      log::warn("ddprun") << "rank " << rank << " failed: stopping the other workers";
      begin_stop(SIGTERM, GroupOutcome::Failed);
    }
  }
}

}  // namespace ddprun::launcher::workers
