#include "launcher/agent/restart_policy.hpp"

#include <algorithm>
#include <charconv>
#include <csignal>

#include "common/printable.hpp"
#include "launcher/workers/worker_exit.hpp"

namespace ddprun::launcher::agent {

using rendezvous::RoundEnd;
using workers::shell_exit_code;

Decision decide(const RoundEnd& end, const RestartState& s) {
  using Kind = Decision::Kind;
  using Why = Decision::Why;
  const bool stopping = s.stop_signal != 0;
  // What stops a restart or a next round that would otherwise come: a stop signal first, then
  // workers that could not be stopped.
  const auto held = [&]() { return stopping ? Why::Stopping : Why::Unkillable; };
  const bool held_back = stopping || s.unkillable;
  if (end.job_over) {
    // A spare whose job ended without it: it ends with the code the job's nodes ended with (no
    // restarts were left them, or none was due), and nothing of it kept a restart from happening.
    RoundEnd as_run = end;
    as_run.job_over = false;
    RestartState spent = s;
    spent.restarts = s.max_restarts;
    spent.elastic = false;
    Decision d = decide(as_run, spent);
    if (d.kind != Kind::Finish) d = {Kind::Finish, 1};
    d.why = Why::Ended;
    return d;
  }
  switch (end.kind) {
    case RoundEnd::Kind::Success: return {Kind::Finish, 0};
    case RoundEnd::Kind::Signal: {
      const int signo = stopping ? s.stop_signal : (s.group_signal ? s.group_signal : SIGTERM);
      return {Kind::Finish, 128 + signo};
    }
    case RoundEnd::Kind::StoreLost: return {Kind::Finish, 1};
    case RoundEnd::Kind::NodeLost:
      // Elastic: the survivors go on without it if at least MIN of them rendezvous again. Static
      // membership cannot go on without that node.
      if (!s.elastic) return {Kind::Finish, stopping ? 128 + s.stop_signal : 1};
      if (!held_back) return {Kind::Rerendezvous, 0};
      // A node stopped by a signal leaves (an elastic job goes on without it) with 128 + N.
      return {Kind::Finish, stopping ? 128 + s.stop_signal : 1, held()};
    case RoundEnd::Kind::Membership:
      if (!held_back) return {Kind::Rerendezvous, 0};
      return {Kind::Finish, stopping ? 128 + s.stop_signal : 1, held()};
    case RoundEnd::Kind::Failure:
    case RoundEnd::Kind::Hang: {
      const int code = end.kind == RoundEnd::Kind::Hang ? kHangExitCode
                       : end.root_cause                 ? shell_exit_code(*end.root_cause)
                                                        : 1;
      const auto& cause = end.root_cause;
      const auto& codes = s.no_restart_exit_codes;
      if (end.kind == RoundEnd::Kind::Failure && cause && cause->signal == 0 &&
          std::find(codes.begin(), codes.end(), cause->exit_code) != codes.end()) {
        return {Kind::Finish, code, Why::DoNotRestart};
      }
      if (s.restarts >= s.max_restarts) return {Kind::Finish, code, stopping ? Why::Stopping : Why::NoRestartsLeft};
      if (held_back) return {Kind::Finish, code, held()};
      if (end.kind == RoundEnd::Kind::Failure && s.max_no_progress_restarts > 0 &&
          end.progress.no_progress_restarts >= s.max_no_progress_restarts) {
        return {Kind::Finish, kNoProgressExitCode, Why::NoProgress};
      }
      return {Kind::Restart, 0};
    }
  }
  return {Kind::Finish, 1};
}

std::string not_restarted_text(const RoundEnd& end, Decision::Why why, int max_restarts) {
  if (why == Decision::Why::NoRestartsLeft && max_restarts > 0) {
    return "giving up after " + std::to_string(max_restarts) + " restart(s)";
  }
  if (why == Decision::Why::NoProgress && end.progress.iterations) {
    return "not restarting: no progress: " + std::to_string(end.progress.no_progress_restarts) +
           " restart(s) in a row got no further than the iterations reached before them (the last reached " +
           std::to_string(*end.progress.iterations) + "; --max_no_progress_restarts); exit code " +
           std::to_string(kNoProgressExitCode);
  }
  if (why == Decision::Why::DoNotRestart && end.root_cause) {
    return "not restarting: rank " + std::to_string(end.root_cause->rank) + " exited with " +
           std::to_string(end.root_cause->exit_code) + ", which means \"do not restart\" (--no_restart_exit_codes)";
  }
  return "";
}

IterationsText parse_iterations_text(std::string_view text) {
  constexpr std::string_view kBlanks = " \t\r\n";
  const size_t first = text.find_first_not_of(kBlanks);
  if (first == std::string_view::npos) return {std::nullopt, "is empty"};
  const std::string_view count = text.substr(first, text.find_last_not_of(kBlanks) - first + 1);
  uint64_t n = 0;
  const auto [end, ec] = std::from_chars(count.data(), count.data() + count.size(), n);
  if (ec == std::errc() && end == count.data() + count.size()) return {n, ""};
  const bool too_big = ec == std::errc::result_out_of_range && end == count.data() + count.size();
  return {std::nullopt, "says " + printable_start(count, 40) + ", not a whole number of iterations" +
                            (too_big ? " (more than 2^64 - 1)" : " (a decimal count such as 1200)")};
}

}  // namespace ddprun::launcher::agent
