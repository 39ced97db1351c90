#pragma once
// A short command run to completion (a node check, nvidia-smi) so that nothing it starts outlives
// it. It runs under a small runner process forked from ddprun (no exec): the subreaper of every
// process the command starts, so a child that double forks or calls setsid is still its own. The
// run is done when the command's process exits, whoever still holds its output; the runner then
// SIGKILLs every process left under it, reaps them and exits. It does the same when ddprun asks (a
// timeout, a stop signal) and when ddprun goes (its control pipe closes: ddprun was SIGKILLed).
//
// Blocking: the caller's thread waits in run_contained (ddprun's main thread: the command's death
// signal is tied to the runner, the runner's lifetime to ddprun's control pipe). No threads.

#include <chrono>
#include <string>
#include <vector>

#include "common/stop_signal.hpp"

namespace ddprun::launcher::workers {

struct ContainedRun {
  enum class End { Exited, TimedOut, Stopped };
  End end = End::Exited;
  int status = 0;      // waitpid's status, when Exited
  std::string output;  // stdout and stderr, the last `keep_output` bytes
};

// Runs `argv` (looked up in PATH) with `envp`, until its process exits, `timeout` passes or `stop`
// is requested; everything it started is killed before this returns. Throws ProcessError when the
// command cannot be started (not found, not executable), naming it and the OS error.
ContainedRun run_contained(const std::vector<std::string>& argv, const std::vector<std::string>& envp,
                           std::chrono::milliseconds timeout, const StopSignal& stop, size_t keep_output = 4096);

}  // namespace ddprun::launcher::workers
