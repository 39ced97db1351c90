#pragma once
// How a round's end decides what the agent does next: finish with an exit code, restart the
// worker group, or rendezvous again. Pure: the agent passes what it knows, and the tests call it
// with every combination.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "launcher/rendezvous/rendezvous_backend.hpp"

namespace ddprun::launcher::agent {

using rendezvous::RoundEnd;

// The exit code of a job that hung (--hang_timeout), as timeout(1) has it.
inline constexpr int kHangExitCode = 124;
// The exit code of a job whose restarts made no progress (--max_no_progress_restarts).
inline constexpr int kNoProgressExitCode = 125;

struct Decision {
  enum class Kind { Finish, Restart, Rerendezvous } kind = Kind::Finish;
  int exit_code = 0;  // Finish only
  // Finish only: why the round's end leads to no restart and no next round. Ended: there is
  // nothing to go on with (success, a signal's end, a lost store, a static job's lost node);
  // otherwise what stopped the restart or the next round that would have come: --max_restarts
  // spent, a root cause whose exit code means "do not restart" (--no_restart_exit_codes), restarts
  // that made no progress (--max_no_progress_restarts), a stop signal, workers that could not be
  // stopped.
  enum class Why { Ended, NoRestartsLeft, DoNotRestart, NoProgress, Stopping, Unkillable } why = Why::Ended;
  bool operator==(const Decision&) const = default;
};

struct RestartState {
  int restarts = 0;      // restarts made so far
  int max_restarts = 0;  // --max_restarts
  bool elastic = false;  // the backend lets the survivors go on without a lost node
  int stop_signal = 0;   // the signal that asked ddprun to stop; 0: none
  int group_signal = 0;  // the signal that stopped this node's group; 0: none
  // Workers of this node that SIGKILL did not end (uninterruptible sleep) still hold what new ones
  // would need (a GPU, its memory, ports): this node starts no more workers and leaves the job.
  bool unkillable = false;
  // --no_restart_exit_codes: a failure whose root cause exited with one of these is not restarted.
  std::span<const int> no_restart_exit_codes = {};
  // --max_no_progress_restarts: a failure after this many restarts in a row that got no further
  // than the most iterations reported before them (RoundEnd::progress) is not restarted; 0: off.
  int max_no_progress_restarts = 0;
};

Decision decide(const RoundEnd& end, const RestartState& s);

// What kept a failed or hung round from a restart, as the console says it ("giving up after 3
// restart(s)"); "" when there is nothing to say (no restart was due, or a stop signal said it).
std::string not_restarted_text(const RoundEnd& end, Decision::Why why, int max_restarts);

// --iterations_file: what the text of a file the program writes its completed training iterations
// to says: a decimal count, blanks and a newline around it allowed (Megatron-LM's
// latest_checkpointed_iteration.txt is one). `problem` says why anything else is not a count, as
// the console shows it after the file's path ("is empty", "says 'release', not a whole number of
// iterations ..."), the text cut at 40 characters, control characters as spaces.
struct IterationsText {
  std::optional<uint64_t> iterations;
  std::string problem;
};
IterationsText parse_iterations_text(std::string_view text);

}  // namespace ddprun::launcher::agent
