#pragma once
// One node's agent, as an explicit state machine:
//
//   Rendezvous --(joined)--> Running --(group ended)--> Ending --(restart, membership change)--> Rendezvous
//        |                                                 |
//        +--(stop signal: leave cleanly, start nothing)    +--(finished, failed, stopped)--> exit code
//
//   Rendezvous  joins the next round through the RendezvousBackend (one node, a store, etcd); the
//               node that becomes group rank 0 hosts the round's worker store.
//   Running     the Supervisor runs the worker group; a watcher thread (owned for the round, joined
//               before the next) stops it when another node ends the round.
//   Ending      agrees with the other nodes on how the round ended, then applies the one restart
//               policy: restart after a failure (up to --max_restarts), re-rendezvous after a
//               membership change or a lost node (elastic jobs), or finish with the report.
//
// Signals are caught by a thread of their own in every state: a stop signal wakes whatever the
// agent waits on (StopSignal) and stops the running workers (Supervisor::deliver_signal); other
// handled signals are forwarded to the workers. Console output goes through non-blocking writers
// (ConsoleWriter), so a console that does not keep up never blocks any of this.

#include "launcher/cli/options.hpp"

namespace ddprun::launcher::agent {

using cli::LaunchOptions;

// Runs the job described by `options`; returns ddprun's exit code (see README, exit codes).
int run_agent(const LaunchOptions& options);

}  // namespace ddprun::launcher::agent
