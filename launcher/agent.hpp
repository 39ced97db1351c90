#pragma once
// One node's agent: hosts the worker store, builds each worker's environment and launch, runs the
// worker group through the Supervisor, restarts it after a failure (up to --max_restarts, each
// time with a fresh store and TORCHELASTIC_RESTART_COUNT+1), and prints the failure report.

#include "launcher/options.hpp"

namespace ddprun::launcher {

// Runs the job described by `options`; returns ddprun's exit code (see README, exit codes).
int run_agent(const LaunchOptions& options);

}  // namespace ddprun::launcher
