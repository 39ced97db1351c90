#include "launcher/agent/restart_policy.hpp"

#include <csignal>

#include "launcher/workers/worker_exit.hpp"

namespace ddprun::launcher::agent {

using rendezvous::RoundEnd;
using workers::shell_exit_code;

Decision decide(const RoundEnd& end, const RestartState& s) {
  const bool stopping = s.stop_signal != 0;
  const bool may_restart = s.restarts < s.max_restarts && !stopping && !s.unkillable;
  switch (end.kind) {
    case RoundEnd::Kind::Success: return {Decision::Kind::Finish, 0};
    case RoundEnd::Kind::Signal: {
      const int signo = stopping ? s.stop_signal : (s.group_signal ? s.group_signal : SIGTERM);
      return {Decision::Kind::Finish, 128 + signo};
    }
    case RoundEnd::Kind::StoreLost: return {Decision::Kind::Finish, 1};
    case RoundEnd::Kind::NodeLost:
      // Elastic: the survivors go on without it if at least MIN of them rendezvous again. Static
      // membership cannot go on without that node.
      if (s.elastic && !stopping && !s.unkillable) return {Decision::Kind::Rerendezvous, 0};
      // A node stopped by a signal leaves (an elastic job goes on without it) with 128 + N.
      return {Decision::Kind::Finish, stopping ? 128 + s.stop_signal : 1};
    case RoundEnd::Kind::Membership:
      if (stopping) return {Decision::Kind::Finish, 128 + s.stop_signal};
      if (s.unkillable) return {Decision::Kind::Finish, 1};
      return {Decision::Kind::Rerendezvous, 0};
    case RoundEnd::Kind::Failure:
      if (may_restart) return {Decision::Kind::Restart, 0};
      return {Decision::Kind::Finish, end.root_cause ? shell_exit_code(*end.root_cause) : 1};
    case RoundEnd::Kind::Hang:
      if (may_restart) return {Decision::Kind::Restart, 0};
      return {Decision::Kind::Finish, kHangExitCode};
  }
  return {Decision::Kind::Finish, 1};
}

}  // namespace ddprun::launcher::agent
