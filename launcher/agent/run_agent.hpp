#pragma once
// The launcher's way into a node's agent (launcher/agent/agent.hpp: the Agent itself).

#include "launcher/cli/options.hpp"

namespace ddprun::launcher::agent {

using cli::LaunchOptions;

// Runs the job described by `options`; returns ddprun's exit code (see README, exit codes).
int run_agent(const LaunchOptions& options);

}  // namespace ddprun::launcher::agent
